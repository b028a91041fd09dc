"""`dltop report`: the postmortem of a recording made of real Snapshots and the events the recorder derives."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dltop.fmt import human_bytes
from dltop.model import Snapshot
from dltop.recorder import Recorder
from tests.test_recorder import sampled


@pytest.fixture
def postmortem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[Snapshot]]:
    snaps = sampled(tmp_path, monkeypatch, n=4)
    # The third sample has two more OOM kills than the second, as the kernel counts them.
    vm = snaps[2].memory.vmstat  # type: ignore[union-attr]
    snaps[2] = dataclasses.replace(snaps[2], memory=dataclasses.replace(
        snaps[2].memory, vmstat=dataclasses.replace(vm, oom_kill=(vm.oom_kill or 0) + 2)))  # type: ignore[arg-type]
    snaps[3] = dataclasses.replace(snaps[3], memory=snaps[2].memory)
    rec_dir = tmp_path / "rec"
    with Recorder(str(rec_dir)) as rec:
        for i, s in enumerate(snaps):
            rec.write(s)
            if i == 1:
                rec.event("marker", {"text": "loss went to NaN"}, ts=s.ts)
                rec.event("hint", {"id": "memory.dirty", "state": "fired", "severity": "warn",
                                   "text": "dirty pages pile up", "numbers": {"dirty_bytes": 3 * 2**30, "files": 4}}, ts=s.ts)
        deadline = time.time() + 10
        while rec.samples < len(snaps) and time.time() < deadline:
            time.sleep(0.02)
    return rec_dir, snaps


def report(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dltop", "report", *args], capture_output=True, text=True,
                          timeout=120)


def test_report_peaks_events_hints_and_charts(postmortem: tuple[Path, list[Snapshot]]) -> None:
    rec_dir, snaps = postmortem
    r = report(str(rec_dir), "--width", "100")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "\x1b[" not in out  # not a terminal: plain text
    top = max(snaps, key=lambda s: s.memory.cached_bytes)  # type: ignore[union-attr]
    peak = next(line for line in out.splitlines() if line.strip().startswith("page cache (Cached)"))
    assert human_bytes(top.memory.cached_bytes) in peak  # type: ignore[union-attr]
    assert time.strftime("%H:%M:%S", time.localtime(top.ts)) in peak
    gpu = snaps[0].gpus[0]  # type: ignore[index]
    assert f"of {human_bytes(gpu.memory_total_bytes)}" in next(ln for ln in out.splitlines() if "GPU 0 used" in ln)
    assert "OOM kill: 2 in the kernel (vmstat)" in out
    assert "marker: loss went to NaN" in out
    assert "memory.dirty (warn): fired 1 time" in out and "dirty_bytes=3.0 GiB, files=4" in out  # bytes as bytes
    for title in ("page cache (GiB)", "GPU memory (GiB)", "dataset residency (% resident)"):
        assert title in out


def test_report_range(postmortem: tuple[Path, list[Snapshot]]) -> None:
    rec_dir, snaps = postmortem
    r = report(str(rec_dir), "--from", repr(snaps[2].ts), "--to", repr(snaps[3].ts))
    assert r.returncode == 0, r.stderr
    assert "2 samples" in r.stdout and "loss went to NaN" not in r.stdout
    bad = report(str(rec_dir), "--from", repr(snaps[3].ts), "--to", repr(snaps[0].ts))
    assert bad.returncode == 1 and "is before --from" in bad.stderr
    missing = report(str(rec_dir / "nope"))
    assert missing.returncode == 1 and missing.stderr.startswith("dltop: no such recording: ")
