"""End to end: examples/train_tiny.py (real torch, files on disk read by DataLoader workers, the probe) runs as
a subprocess, and `dltop snapshot --json` sees its probe with its epochs, its data wait and its dataset."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.probe_helpers import REPO, probe_env

pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0, the test extra)")


def _train_tiny(tmp_path: Path, data: Path, *args: str) -> subprocess.Popen[str]:
    """examples/train_tiny.py training over `data` with 2 workers, its probe publishing every 0.2 s into
    tmp_path, lingering a minute after it says "done"."""
    cmd = [sys.executable, str(REPO / "examples" / "train_tiny.py"), *args, "--workers", "2", "--data-dir",
           str(data), "--probe-interval", "0.2", "--linger", "60"]
    return subprocess.Popen(cmd, env=probe_env(tmp_path), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_snapshot_json_sees_a_real_training_run(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc = _train_tiny(tmp_path, data, "--epochs", "2", "--files", "24", "--size-kib", "64", "--decode-ms", "5")
    try:
        printed = []
        for line in proc.stdout:  # type: ignore[union-attr]
            printed.append(line.strip())
            if line.strip() == "done":
                break
        assert printed[-1:] == ["done"], (printed, proc.stderr.read() if proc.poll() is not None else "")  # type: ignore[union-attr]
        assert sorted(p.name for p in data.iterdir()) == [f"sample-{i:05d}.bin" for i in range(24)]
        r = subprocess.run([sys.executable, "-m", "dltop", "snapshot", "--json"], env=probe_env(tmp_path),
                           capture_output=True, text=True, cwd=REPO, timeout=120)
        assert r.returncode == 0, r.stderr
    finally:
        proc.kill()
        proc.wait()
    probes = json.loads(r.stdout)["probes"]
    mine = [p for p in probes["processes"] if p["pid"] == proc.pid]
    assert len(mine) == 1, probes
    p = mine[0]
    assert "train_tiny.py" in p["cmd"] and p["data_dir"] == str(data)
    assert p["loader_workers"] == 2 and p["pin_memory"] is False and p["steps"] == 2 * 3  # 24 files, batches of 8
    assert 0.0 <= p["data_wait_fraction"] <= 1.0 and p["step_time_s"] > 0
    # Adam: two moments per parameter and a float32 step count for each of the model's 6 parameters
    assert p["weights_bytes"] > 0 and p["optimizer_bytes"] == 2 * p["weights_bytes"] + 6 * 4
    assert [e["index"] for e in p["epochs"]] == [0, 1] and all(e["steps"] == 3 for e in p["epochs"])
    for e, line in zip(p["epochs"], [ln for ln in printed if ln.startswith("epoch ")], strict=True):
        # what the script printed at mark_epoch() is what dltop read from the file
        assert line.startswith(f"epoch {e['index']}: {e['duration_s']:.2f}s, waited {e['data_wait_s']:.2f}s")
        assert 0 < e["data_wait_s"] < e["duration_s"] and isinstance(e["machine_cached_delta_bytes"], int)


WRITER = """
import os, sys, time
with open(sys.argv[1], "wb") as f:
    for _ in range(int(sys.argv[2])):
        f.write(os.urandom(1 << 20))
        time.sleep(0.01)
print("written", flush=True)
"""


def _fincore_bytes(paths: list[Path]) -> int:
    """What util-linux's fincore says the files hold in the page cache."""
    r = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", *map(str, paths)],
                       capture_output=True, text=True, check=True, timeout=60)
    return sum(int(x) for x in r.stdout.split())


def test_the_cache_delta_of_an_epoch_is_the_job_s_data_not_another_process_s_write(tmp_path: Path) -> None:
    """The issue's case: a job reading warm data while another process writes a big file. Each epoch's
    data_cached_delta_bytes is its dataset's change (fincore agrees), never the machine's Cached (the write)."""
    data = tmp_path / "data"
    proc = _train_tiny(tmp_path, data, "--epochs", "3", "--files", "16", "--size-kib", "256", "--decode-ms", "60")
    writer = None
    try:
        printed = []
        for line in proc.stdout:  # type: ignore[union-attr]
            printed.append(line.strip())
            if line.startswith("probe: ") and writer is None:  # the dataset is written and evicted: train
                writer = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path / "other.bin"), "192"],
                                          stdout=subprocess.PIPE, text=True)
            if line.strip() == "done":
                break
        assert printed[-1:] == ["done"], (printed, proc.stderr.read() if proc.poll() is not None else "")  # type: ignore[union-attr]
        files = sorted(data.iterdir())
        resident = _fincore_bytes(files)
        r = subprocess.run([sys.executable, "-m", "dltop", "snapshot", "--json"], env=probe_env(tmp_path),
                           capture_output=True, text=True, cwd=REPO, timeout=120)
        assert r.returncode == 0, r.stderr
    finally:
        proc.kill()
        proc.wait()
        if writer is not None:
            writer.kill()
            writer.wait()
    (p,) = [p for p in json.loads(r.stdout)["probes"]["processes"] if p["pid"] == proc.pid]
    epochs = p["epochs"]
    assert [e["index"] for e in epochs] == [0, 1, 2]
    assert all(e["data_cached_source"] == "cachestat: 16 files under data_dir" for e in epochs), epochs
    # epoch 0 read the evicted dataset in: its delta is what fincore finds resident now (the start was ~empty);
    # the later epochs read it warm: nothing of the other process's write is in their delta
    assert resident > 0 and abs(epochs[0]["data_cached_delta_bytes"] - resident) <= 64 << 10, (epochs, resident)
    assert [e["data_cached_delta_bytes"] for e in epochs[1:]] == [0, 0], epochs
    assert all(abs(e["data_cached_delta_bytes"]) <= 4 << 20 for e in epochs)  # the dataset is 4 MiB


def test_bad_options_say_so_in_one_line(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(REPO / "examples" / "train_tiny.py"), "--epochs", "0"],
                       env=probe_env(tmp_path), capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--epochs" in r.stderr
