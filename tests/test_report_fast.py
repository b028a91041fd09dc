"""`dltop report` through the frames' summaries in the index: the same report as decoding every sample, edges
and frames without a summary decoded, and a progress line only on a terminal."""

from __future__ import annotations

import dataclasses
import json
import os
import pty
import random
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dltop.model import Snapshot
from dltop.model.gpu import MemorySplit
from dltop.recorder import Recorder, Recording, store
from dltop.recorder.reader import index_times
from dltop.recorder.report import _chart, _Collected, _peaks, report
from dltop.recorder.segment import Chunk
from dltop.recorder.summary import check_summary
from tests.test_recorder import sampled

N = 2000  # a report at 60 columns charts every 16th sample from 1920 on: the summaries are used
BLOCK = 64
WIDTH = 60


def moving(base: Snapshot, n: int, t0: float, seed: int = 0) -> Iterator[Snapshot]:
    """`n` Snapshots a second apart (a 10 s hole in the middle), every gauge the report reads moving: values
    from a few so that peaks tie (the first one stays the peak), a GPU process's split known for a while."""
    rng = random.Random(seed)
    mem, gpus, ds = base.memory, base.gpus, base.datasets
    assert mem is not None and not isinstance(mem, Exception) and isinstance(gpus, tuple) and ds is not None
    ts = t0
    for i in range(n):
        ts += 11.0 if i == n // 2 else 1.0 + rng.uniform(0, 0.004)
        m = dataclasses.replace(mem, cached_bytes=rng.choice((1, 2, 3, 5, 8)) << 30, dirty_bytes=rng.randrange(64) << 20,
                                writeback_bytes=rng.randrange(8) << 20,
                                available_bytes=(mem.available_bytes or 1 << 33) - (rng.randrange(16) << 24))
        g2 = []
        for g in gpus:
            procs = g.processes
            if isinstance(procs, tuple) and procs and 300 <= i < 900:
                split = MemorySplit(weights_bytes=rng.randrange(4) << 30, kv_cache_bytes=rng.randrange(8) << 28)
                procs = (dataclasses.replace(procs[0], split=split), *procs[1:])
            g2.append(dataclasses.replace(g, memory_used_bytes=rng.randrange(40) << 28, processes=procs))
        if i % 100 == 0 and not isinstance(ds, Exception):  # a rescan: new residency
            paths = []
            for d in ds.paths:
                if hasattr(d, "resident_pages") and not isinstance(d, Exception):
                    r = rng.randrange(0, max(2, d.pages))
                    d = dataclasses.replace(d, scanned_at=ts, resident_pages=r, data_resident_pages=r)
                paths.append(d)
            ds = dataclasses.replace(ds, paths=tuple(paths))
        yield dataclasses.replace(base, ts=ts, memory=m, gpus=tuple(g2), datasets=ds)


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Snapshot]]:
    tmp = tmp_path_factory.mktemp("fast")
    with pytest.MonkeyPatch.context() as mp:
        base = sampled(tmp, mp, n=2)[-1]
    snaps = list(moving(base, N, time.time() - N - 100))
    rec_dir = tmp / "rec"
    with Recorder(str(rec_dir), retain_s=None, max_bytes=None, segment_s=600, block_samples=BLOCK,
                  clock=lambda: snaps[-1].ts + 1) as rec:
        for s in snaps:
            rec.write(s, wait=True)
    return rec_dir, snaps


@pytest.fixture
def decoded(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many samples were decoded (one count a Snapshot)."""
    count = [0]
    real = Chunk.snapshot

    def counting(self: Chunk, k: int) -> Snapshot:
        count[0] += 1
        return real(self, k)

    monkeypatch.setattr(Chunk, "snapshot", counting)
    return count


_FULL: dict[tuple[float | None, float | None], str] = {}


def fast(rec_dir: Path, decoded: list[int], t0: float | None = None, t1: float | None = None) -> tuple[str, int]:
    """The report through the summaries, and how many samples it decoded."""
    decoded[0] = 0
    return report(Recording(str(rec_dir)), t0, t1, width=WIDTH), decoded[0]


def same_as_full(out: str, rec_dir: Path, t0: float | None = None, t1: float | None = None,
                 full_of: Path | None = None) -> None:
    """`out` is the report that decodes every sample (of `full_of`: the recording before it was changed)."""
    if (t0, t1) not in _FULL:
        _FULL[t0, t1] = report(Recording(str(full_of or rec_dir)), t0, t1, width=WIDTH, fast=False)
    assert out.replace(str(rec_dir), str(full_of or rec_dir)) == _FULL[t0, t1]


def test_the_report_through_summaries_equals_decoding_every_sample(recording: tuple[Path, list[Snapshot]],
                                                                   decoded: list[int]) -> None:
    rec_dir, snaps = recording
    out, n = fast(rec_dir, decoded)
    assert n == 0  # the whole recording: every frame through its summary
    same_as_full(out, rec_dir)
    top = max(snaps, key=lambda s: s.memory.cached_bytes)  # type: ignore[union-attr]  # the first of the ties
    peak = next(line for line in out.splitlines() if line.strip().startswith("page cache (Cached)"))
    assert peak.endswith(time.strftime("%m-%d %H:%M:%S" if N > 86400 else "%H:%M:%S", time.localtime(top.ts)))
    assert f"{N} samples" in out and "Gaps" in out  # the hole in the middle, from the index's times
    for name in ("weights", "KV cache", "cached", "dirty"):  # chart legends, the split's for a while only
        assert name in out
    # The edges of a range fall inside frames: those two are decoded, the rest read through summaries.
    t0, t1 = snaps[30].ts, snaps[N - 10].ts
    out, n = fast(rec_dir, decoded, t0, t1)
    assert 0 < n <= 2 * BLOCK
    same_as_full(out, rec_dir, t0, t1)


def _rewrite_indexes(rec_dir: Path, change: object) -> None:
    for idx in sorted(rec_dir.glob("*" + store.INDEX_SUFFIX)):
        index = json.loads(idx.read_text())
        for b in index["blocks"]:
            change(b)  # type: ignore[operator]
        idx.write_text(json.dumps(index))


def test_frames_without_a_summary_or_with_a_damaged_one_are_decoded(recording: tuple[Path, list[Snapshot]],
                                                                    decoded: list[int], tmp_path: Path) -> None:
    rec_dir, snaps = recording
    old = tmp_path / "old"
    subprocess.run(["cp", "-a", str(rec_dir), str(old)], check=True)
    # One summary with a peak changed and its checksum left: read as absent, that frame decoded.
    first = [True]

    def damage(b: dict) -> None:
        if first[0] and "summary" in b:
            b["summary"]["peaks"][0][2] += 4096
            first[0] = False

    _rewrite_indexes(old, damage)
    out, n = fast(old, decoded)
    assert n == BLOCK
    same_as_full(out, old, full_of=rec_dir)
    # An older dltop's recording: no summaries at all; every sample decoded, the same report.
    _rewrite_indexes(old, lambda b: (b.pop("summary", None), b.pop("summary_crc", None)))
    out, n = fast(old, decoded)
    assert n == N
    same_as_full(out, old, full_of=rec_dir)
    assert Recording(str(old)).damage.total == 0  # a summary missing or damaged is no damage to the samples


def _run_on_a_terminal(*args: str) -> tuple[int, str, str]:
    """`dltop report` with stderr on a pseudo-terminal (stdout a pipe): exit status, stdout, what the terminal got."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "dltop", "report", *args], stdout=subprocess.PIPE,
                            stderr=slave, stdin=subprocess.DEVNULL)
    os.close(slave)
    seen = b""
    out = b""
    assert proc.stdout is not None
    while True:
        ready, _, _ = select.select([master, proc.stdout], [], [], 60)
        if not ready:
            break
        if master in ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed it
                chunk = b""
            seen += chunk
        if proc.stdout in ready:
            data = proc.stdout.read1(65536)  # type: ignore[attr-defined]
            out += data
            if not data:
                break
    proc.wait(60)
    try:
        while select.select([master], [], [], 0.2)[0]:
            more = os.read(master, 65536)
            if not more:
                break
            seen += more
    except OSError:
        pass
    os.close(master)
    return proc.returncode, out.decode(), seen.decode()


def test_progress_only_on_a_terminal_and_not_with_quiet(recording: tuple[Path, list[Snapshot]]) -> None:
    rec_dir, _ = recording
    code, out, tty = _run_on_a_terminal(str(rec_dir), "--width", str(WIDTH))
    assert code == 0 and "Peaks" in out
    assert f"\rdltop report: reading 0 of {N:,} samples (0%)\x1b[K" in tty and tty.endswith("\r\x1b[K")
    code, out, tty = _run_on_a_terminal(str(rec_dir), "--width", str(WIDTH), "--quiet")
    assert code == 0 and "Peaks" in out and tty == ""
    r = subprocess.run([sys.executable, "-m", "dltop", "report", str(rec_dir), "--width", str(WIDTH)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stderr == "" and r.stdout == out


# -- a summary's values under a valid checksum -----------------------------------------------------------------

JSON = st.recursive(st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False)
                    | st.text(max_size=8), lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=8)
TRIED = [0, 0]  # summaries tried, of which passed the checks and were drawn


def _paths(value: object, at: tuple = ()) -> list[tuple]:
    out = [at]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*at, i))
    return out


@settings(max_examples=150, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_a_summary_changed_under_a_valid_checksum_is_refused_or_read(recording: tuple[Path, list[Snapshot]],
                                                                      data: st.DataObject) -> None:
    rec_dir, _ = recording
    idx = sorted(rec_dir.glob("*" + store.INDEX_SUFFIX))[0]
    block = json.loads(idx.read_text())["blocks"][0]
    summary = block["summary"]
    paths = _paths(summary)
    at = data.draw(st.sampled_from(paths[1:]))
    # Numbers most often (what passes the shape checks and reaches the drawing), any JSON value the rest.
    new = data.draw(st.integers(-(2**66), 2**66) | st.floats(allow_nan=False) | st.none() | JSON)
    holder = summary
    for key in at[:-1]:
        holder = holder[key]
    holder[at[-1]] = new
    try:
        read = store.loads(json.dumps(summary))  # as the reader gets it: bounded numbers, no NaN
    except store.Malformed:
        return
    times = index_times(block["ts"])
    got = check_summary(read, store.entry_crc([read]), len(times))
    TRIED[0] += 1
    if got is not None:  # what passes the checks is drawn without a traceback
        TRIED[1] += 1
        c = _Collected(every_sample=False)
        c.see_summary(times, got)
        lines = _peaks(c)
        for title in c.charts:
            lines += _chart(title, "GiB", c.charts[title], WIDTH, False, [])
        assert all(isinstance(line, str) for line in lines)


def test_the_summary_fuzz_ran() -> None:
    print(f"\nfuzzed (summaries under a valid checksum): {TRIED[0]}, {TRIED[1]} of them read and drawn")
    assert TRIED[0] > 100


def test_peaks_over_days_fit_80_columns(recording: tuple[Path, list[Snapshot]]) -> None:
    # A week's report dates each peak (MM-DD HH:MM:SS): its lines still fit an 80-column terminal.
    rec_dir, snaps = recording
    c = _Collected()
    for s in snaps[:3]:
        c.see(s)
    c.last_ts = (c.first_ts or 0.0) + 7 * 86400
    lines = _peaks(c)
    assert len(lines) > 5 and all(len(line) <= 80 for line in lines), [ln for ln in lines if len(ln) > 80]
    assert any("-" in line.split(" at ")[-1] for line in lines[1:-1])  # dated
