"""The watch's event reading (dltop/residency/watch.py `_take`): runs of records of one size counted in bulk give the
same counts as reading them one by one, and both the same as the rule they keep (a Hypothesis property over
kernel-shaped buffers); names of every padded length read by another process are measured once, on real files."""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dltop import kernel, native
from dltop.residency import events as drain
from dltop.residency import measure as measuring
from dltop.residency import watch
from dltop.residency.events import EventDrain
from dltop.residency.folders import FolderTable
from dltop.residency.walk import WalkOptions
from dltop.residency.watch import DatasetWatch
from tests.test_pagecache_util import (
    PS,
    ddir_fixture,  # noqa: F401  (the `ddir` fixture)
    fincore_resident_pages,
    make_file,
    needs_fincore,
)

# Names of every padded length the kernel sends around a 16-byte boundary (15 and 16 bytes pad differently).
NAMES = [b"", b"a", b"b" * 15, b"c" * 16, b"d" * 17, b"e" * 31, b"f" * 40, b"\xff\xfe"]
FILE_MASKS = [kernel.IN_OPEN, kernel.IN_CLOSE_NOWRITE, kernel.IN_CLOSE_WRITE]
OTHER_MASKS = [kernel.IN_OPEN | kernel.IN_ISDIR, kernel.IN_CLOSE_NOWRITE | kernel.IN_ISDIR, kernel.IN_CREATE,
               kernel.IN_DELETE, kernel.IN_ATTRIB, kernel.IN_MOVED_TO, kernel.IN_DELETE_SELF, kernel.IN_Q_OVERFLOW,
               kernel.IN_CREATE | kernel.IN_ISDIR]
# Mostly a file's opens and closes (long runs of one size), now and then anything else a folder's watch reports.
EVENT = st.tuples(st.sampled_from([1, 2]), st.sampled_from(NAMES[1:4] * 4 + NAMES),
                  st.sampled_from(FILE_MASKS * 6 + OTHER_MASKS))
TRIED = []


def record(wd: int, name: bytes, mask: int) -> bytes:
    """One event as inotify writes it: wd, mask, cookie, len, then the name NUL-padded to 16 bytes past it."""
    if mask == kernel.IN_Q_OVERFLOW:
        wd, name = -1, b""
    elif mask == kernel.IN_DELETE_SELF:
        name = b""  # the folder itself: no name
    padded = drain.padded(name) if name else b""
    return struct.pack("iIII", wd, mask, 0, len(padded)) + padded


def model(events: list[tuple[int, bytes, int]]) -> tuple[dict, dict, set, set, bool]:
    """The rule, one event at a time: events per file, opens less closes (never below none: a close of a file
    opened before the watch), files written or whose attributes changed, folders to list again, an overflow."""
    touched: dict = {}
    opened: dict = {}
    changed, relist, resync = set(), set(), False
    for wd, name, mask in events:
        if mask == kernel.IN_Q_OVERFLOW:
            resync = True
            opened.clear()
            continue
        if mask == kernel.IN_DELETE_SELF:
            name = b""
        key = (wd, drain.padded(name) if name else b"")
        if mask in FILE_MASKS or mask == kernel.IN_ATTRIB:
            touched[key] = touched.get(key, 0) + 1
            if mask == kernel.IN_OPEN:
                opened[key] = opened.get(key, 0) + 1
            elif mask != kernel.IN_ATTRIB:
                opened[key] = opened.get(key, 0) - 1
                if opened[key] <= 0:
                    del opened[key]
            if mask in (kernel.IN_CLOSE_WRITE, kernel.IN_ATTRIB):
                changed.add(key)
        elif mask & (kernel.IN_ISDIR | kernel.IN_DELETE_SELF) and mask & (kernel.IN_OPEN | kernel.IN_CLOSE_NOWRITE):
            pass  # the folder itself opened or closed (our own listing): nothing to do
        else:
            relist.add(wd)
    return touched, opened, changed, relist, resync


def state(w: EventDrain) -> tuple[dict, dict, set, set, bool]:
    return dict(w.touched), dict(w.open), set(w.changed), set(w.relist), w.resync


@pytest.fixture(scope="module")
def two_watches(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    ws = [EventDrain(), EventDrain()]
    for w in ws:
        w.close()  # no drain thread, no fd: only what the test hands `take`
    yield ws


@settings(max_examples=300, derandomize=True, deadline=None)
@given(st.lists(EVENT, max_size=120), st.integers(1, 7))
def test_bulk_and_one_by_one_count_the_same_as_the_rule(two_watches: list[EventDrain],
                                                        events: list[tuple[int, bytes, int]], cut: int) -> None:
    TRIED.append(1)
    bulk, single = two_watches
    buf = b"".join(record(*e) for e in events)
    ends = sorted({0, len(buf)} | {sum(len(record(*e)) for e in events[:i]) for i in range(0, len(events), cut)})
    for w, bulk_min in ((bulk, 2), (single, 10**9)):
        w.touched.clear(), w.open.clear(), w.changed.clear(), w.relist.clear()
        w.resync = False
        old = drain.BULK_MIN
        drain.BULK_MIN = bulk_min
        try:
            for a, b in zip(ends, ends[1:], strict=False):  # as the kernel hands them: whole records per read
                w.take(buf[a:b])
        finally:
            drain.BULK_MIN = old
    assert state(bulk) == state(single) == model(events)


def test_the_property_ran() -> None:
    """How many inputs the property above tried (docs/datasets.md quotes it)."""
    print(f"event buffers: {len(TRIED)} inputs")
    assert len(TRIED) == 0 or len(TRIED) >= 100


@needs_fincore
@pytest.mark.parametrize("step", ["C", "python"])
def test_names_of_every_padded_length_are_measured_once(ddir: Path, monkeypatch: pytest.MonkeyPatch,
                                                        step: str) -> None:
    """Another process reads files whose names pad to 16, 32 and 48 bytes: each is measured at the next read,
    and the watch's own opens of them (keyed by the padded name too) make the read after measure none; by the C
    step (dltop.native._measure) and by its Python twin."""
    if step == "C" and measuring.native_measure() is None:
        pytest.skip(f"dltop.native._measure: {native.status().get('_measure')}")
    if step == "python":
        monkeypatch.setattr(measuring, "native_measure", lambda: None)
    names = [n.decode() for n in NAMES[1:7]]
    files = [make_file(ddir / "d" / n, 2 * PS) for n in names]
    monkeypatch.setattr(watch, "MIN_ROLL_FILES", 0)
    monkeypatch.setattr(watch, "ROLL_CPU_SHARE", 0.0)
    w = DatasetWatch(str(ddir), WalkOptions(max_depth=6))
    try:
        first, _ = w.read()
        assert first.resident_pages == 0
        subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=True)
        counted = []
        real = FolderTable.recounted_as  # what both steps call for a file counted again by cachestat alone
        monkeypatch.setattr(FolderTable, "recounted_as", lambda self, f, i, *cs: counted.append(f.name(i).encode())
                            or real(self, f, i, *cs))
        by_python: list[bytes] = []
        py_recount = FolderTable.recount
        monkeypatch.setattr(FolderTable, "recount", lambda self, f, i, raw, key: by_python.append(raw)
                            or py_recount(self, f, i, raw, key))
        now, _ = w.read()
        assert sorted(counted) == sorted(n.encode() for n in names)
        assert sorted(by_python) == ([] if step == "C" else sorted(counted))
        counted.clear()
        w.read()
        assert counted == []
        # (after: fincore's own opens are events the watch would see)
        assert now.resident_pages == sum(fincore_resident_pages(*files).values()) == 2 * len(files)
    finally:
        w.close()
