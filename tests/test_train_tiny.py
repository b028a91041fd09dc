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


def test_snapshot_json_sees_a_real_training_run(tmp_path: Path) -> None:
    data = tmp_path / "data"
    cmd = [sys.executable, str(REPO / "examples" / "train_tiny.py"), "--epochs", "2", "--files", "24",
           "--size-kib", "64", "--workers", "2", "--decode-ms", "5", "--data-dir", str(data),
           "--probe-interval", "0.2", "--linger", "60"]
    proc = subprocess.Popen(cmd, env=probe_env(tmp_path), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
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
        assert 0 < e["data_wait_s"] < e["duration_s"] and isinstance(e["page_cache_delta_bytes"], int)


def test_bad_options_say_so_in_one_line(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(REPO / "examples" / "train_tiny.py"), "--epochs", "0"],
                       env=probe_env(tmp_path), capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--epochs" in r.stderr
