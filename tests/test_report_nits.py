"""The small things a postmortem reader trips on (issue 35, item 8): a typed time's fraction truncated as a clock
shows it, a day's span printed with the end's date, each write failure's own count of lost lines."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import pytest

from dltop.model import Snapshot
from dltop.recorder import Recorder, Recording, parse_time
from dltop.recorder.report import report
from dltop.sources.memory import read_memory


def test_a_typed_fraction_of_a_second_is_truncated_not_rounded() -> None:
    now = time.time()
    whole = parse_time("14:05:59", now)
    assert parse_time("14:05:59.4999999", now) - whole == pytest.approx(0.499999, abs=1e-7)  # not 59.5
    assert parse_time("14:05:59.9999999", now) - whole == pytest.approx(0.999999, abs=1e-7)  # was an exception
    assert parse_time("14:05:59.29", now) - whole == pytest.approx(0.29, abs=1e-7)  # the digits, not a float's


def record(directory: Path, snaps: list[Snapshot]) -> None:
    with Recorder(str(directory), kmsg=None) as rec:
        for s in snaps:
            rec.write(s, wait=True)


def test_a_days_span_prints_the_ends_date(tmp_path: Path) -> None:
    mem = read_memory()
    t0 = time.mktime((2026, 12, 1, 14, 0, 0, 0, 0, -1))
    snaps = [Snapshot(ts=t0 + i * 600, host="h", memory=mem) for i in range(145)]  # 14:00 to 14:00 the next day
    record(tmp_path / "rec", snaps)
    head = report(Recording(str(tmp_path / "rec")), width=80).splitlines()[1]
    assert head.startswith("h: 2026-12-01 14:00:00 ") and " to 2026-12-02 14:00:00 " in head, head
    short = [Snapshot(ts=t0 + i * 60, host="h", memory=mem) for i in range(3)]
    record(tmp_path / "short", short)
    head = report(Recording(str(tmp_path / "short")), width=80).splitlines()[1]
    assert " to 14:02:00 " in head and "2026-12-02" not in head  # the same day: the date once


def test_each_write_failure_says_its_own_lost_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dltop.recorder.writer as writer

    mem = read_memory()
    said: list[str] = []
    failing = {"on": False}
    real = os.pwrite

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        if failing["on"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, offset)

    monkeypatch.setattr(writer.os, "pwrite", pwrite)
    rec = Recorder(str(tmp_path / "rec"), kmsg=None, warn=said.append)
    written = 0

    def write(n: int) -> None:
        nonlocal written, ts
        for _ in range(n):
            rec.write(Snapshot(ts=ts, host="h", memory=mem), wait=True)
            ts += 1
        written += n
        deadline = time.monotonic() + 10
        while rec.samples + rec.lost < written and time.monotonic() < deadline:  # each one written or lost
            time.sleep(0.01)

    try:
        ts = time.time()
        for lost in (3, 2):
            write(1)
            failing["on"] = True
            write(lost)
            failing["on"] = False
        write(1)
    finally:
        rec.close()
    again = [s for s in said if s.startswith("writing again")]
    assert len(again) == 2, said
    assert again[0].startswith("writing again (3 lines lost") and again[1].startswith("writing again (2 lines lost")


def test_an_event_inside_a_gap_is_said_to_be_in_one(tmp_path: Path) -> None:
    mem = read_memory()
    t0 = time.mktime((2026, 12, 1, 3, 0, 0, 0, 0, -1))
    snaps = [Snapshot(ts=t0 + i, host="h", memory=mem) for i in (*range(10), *range(300, 310))]
    with Recorder(str(tmp_path / "rec"), kmsg=None) as rec:
        for s in snaps:
            rec.write(s, wait=True)
        rec.event("marker", {"text": "in the hole"}, ts=t0 + 100)
        rec.event("marker", {"text": "before it"}, ts=t0 + 5)
    text = report(Recording(str(tmp_path / "rec")), width=80)
    [inside] = [ln for ln in text.splitlines() if "in the hole" in ln]
    assert inside.endswith("(in a gap: no samples 03:00:09 to 03:05:00)"), inside
    [before] = [ln for ln in text.splitlines() if "before it" in ln]
    assert "gap" not in before
