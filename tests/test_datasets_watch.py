"""Watching a dataset (dltop/residency/watch.py) on real files: what inotify shows is measured again at once, what it
cannot show is caught by the rolling pass, and estimates carry their flag and bound; fincore is the judge."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dltop.config import Settings
from dltop.model.base import from_dict, to_dict
from dltop.model.datasets import DatasetResidency, DatasetsPart, ResidencyNode
from dltop.residency import events, reclaim, watch
from dltop.residency.folders import FolderTable
from dltop.residency.rank import FILE_SORT_KEYS
from dltop.residency.scan import scan_residency
from dltop.residency.walk import WalkOptions
from dltop.residency.watch import DatasetWatch
from dltop.sources import datasets as ds_source
from dltop.sources.datasets import source
from tests.test_pagecache_util import (
    PS,
    ddir_fixture,  # noqa: F401  (the `ddir` fixture)
    evict_file,
    fincore_resident_pages,
    make_file,
    needs_fincore,
    read_file,
)

OPTIONS = WalkOptions(max_depth=6)


def tree(root: Path, folders: int = 4, files: int = 5, pages: int = 3) -> list[Path]:
    """`folders` x `files` files of `pages` pages each, evicted."""
    out = [make_file(root / f"d{d}" / f"f{i}.bin", pages * PS) for d in range(folders) for i in range(files)]
    return out


def fincore_total(root: Path) -> int:
    return sum(fincore_resident_pages(*sorted(p for p in root.rglob("*") if p.is_file())).values())


def child(ds: DatasetResidency, name: str) -> int:
    return next(c.resident_pages for c in ds.children if c.path.endswith("/" + name))


@pytest.fixture
def watched(ddir: Path):  # type: ignore[no-untyped-def]
    w = DatasetWatch(str(ddir), OPTIONS)
    yield w
    w.close()


@needs_fincore
def test_files_another_process_opens_are_measured_at_the_next_read(ddir: Path, watched: DatasetWatch) -> None:
    files = tree(ddir)
    first, _ = watched.read()
    assert (first.files, first.resident_pages, first.estimated) == (20, 0, False)
    # Another process reads two files: both opens are seen, only those two are measured again.
    subprocess.run(["cat", str(files[0]), str(files[7])], stdout=subprocess.DEVNULL, check=True)
    now, _ = watched.read()
    assert now.resident_pages == fincore_total(ddir) == 6
    assert (child(now, "d0"), child(now, "d1")) == (3, 3)
    # Evicting one (an open too) and a new file, a new folder and a removed file: the listing is read again.
    evict_file(files[0])
    make_file(ddir / "d9" / "new.bin", 2 * PS)
    read_file(ddir / "d9" / "new.bin")
    os.unlink(files[7])
    now, _ = watched.read()
    assert (now.files, now.resident_pages) == (20, fincore_total(ddir)) == (20, 2)


@needs_fincore
def test_a_read_inotify_cannot_see_is_caught_by_the_rolling_pass(ddir: Path, watched: DatasetWatch,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that opened a file before the watch began reads it later: no event. The rolling pass (one
    folder per read here) measures every folder within as many reads as there are folders."""
    files = tree(ddir, folders=6)
    target = files[-1]  # in d5
    code = ("import sys, os; fd = os.open(sys.argv[1], os.O_RDONLY); print('open', flush=True); sys.stdin.readline();"
            " os.read(fd, 1 << 20); print('read', flush=True); sys.stdin.readline()")
    holder = subprocess.Popen([sys.executable, "-c", code, str(target)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdin is not None and holder.stdout is not None
    try:
        assert holder.stdout.readline() == "open\n"  # opened before the watch began: no event
        monkeypatch.setattr(watch, "MIN_ROLL_FILES", 6)  # a folder of 5 files (and itself) a read
        monkeypatch.setattr(watch, "ROLL_CPU_SHARE", 0.0)
        first, _ = watched.read()
        assert first.resident_pages == 0
        holder.stdin.write("go\n")
        holder.stdin.flush()
        assert holder.stdout.readline() == "read\n"  # read, still open: no event either
        seen = []
        for _ in range(7):  # 7 folders (the root and d0-d5): each read measures the next one again
            ds, _ = watched.read()
            seen.append(ds.resident_pages)
        # Skipped (the estimate is stale) until the pass reached d5, then exact; every folder within 7 reads.
        assert seen[0] == 0 and seen[-1] == 3 and child(ds, "d5") == 3
        assert ds.full_scan_at > 0
        assert fincore_total(ddir) == 3  # (after: fincore's own opens are events the watch would see)
    finally:
        holder.kill()
        holder.wait()


@needs_fincore
def test_reclaim_makes_carried_counts_an_estimate_until_measured_again(ddir: Path, watched: DatasetWatch,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    files = tree(ddir, folders=3)
    for f in files:
        read_file(f)
    counters = {"pgsteal_file": 1000, "drop_pagecache": 0}
    monkeypatch.setattr(reclaim, "read_vmstat", lambda: dict(counters))
    monkeypatch.setattr(watch, "MIN_ROLL_FILES", 6)  # a folder of 5 files (and itself) a read
    monkeypatch.setattr(watch, "ROLL_CPU_SHARE", 0.0)
    ds, _ = watched.read()
    assert (ds.resident_pages, ds.estimated, ds.estimate_error_pages) == (45, False, 0)
    # The kernel reclaimed 20 file pages somewhere: up to 20 of the counted pages may be gone.
    counters["pgsteal_file"] += 20
    ds, _ = watched.read()  # this read measured one folder again: the other three may have lost 20 pages
    assert ds.estimated and ds.estimate_error_pages == 20
    assert ds.resident_pages == fincore_total(ddir) == 45  # nothing of ours was reclaimed in truth
    for _ in range(4):  # the root and d0-d2: every folder measured again since the reclaim
        ds, _ = watched.read()
    assert (ds.estimated, ds.estimate_error_pages) == (False, 0)
    # A drop_caches: every count may be gone, so everything is measured again at once.
    for f in files[:5]:
        evict_file(f)  # an open each: seen anyway; the drop is what forces the whole tree here
    counters["drop_pagecache"] += 1
    ds, _ = watched.read()
    assert (ds.resident_pages, ds.estimated) == (fincore_total(ddir), False) == (30, False)


@needs_fincore
def test_hard_links_count_once_and_a_read_through_either_name_is_seen(ddir: Path, watched: DatasetWatch) -> None:
    make_file(ddir / "a" / "x.bin", 4 * PS)
    (ddir / "b").mkdir()
    os.link(ddir / "a" / "x.bin", ddir / "b" / "y.bin")
    ds, _ = watched.read()
    assert (ds.files, ds.resident_pages, ds.skipped) == (1, 0, {"hardlink": 1})
    subprocess.run(["cat", str(ddir / "b" / "y.bin")], stdout=subprocess.DEVNULL, check=True)
    ds, _ = watched.read()
    assert (ds.files, ds.resident_pages) == (1, fincore_total(ddir) // 2) == (1, 4)


def test_own_measuring_is_not_taken_for_a_job_reading(ddir: Path, watched: DatasetWatch,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The watch opens every file it measures: those events must not make it measure them all again."""
    tree(ddir, folders=3, files=50)
    watched.read()
    measured = []
    real = FolderTable.measure_one

    def counting(self: DatasetWatch, f: object, name: str) -> object:
        measured.append(name)
        return real(self, f, name)  # type: ignore[arg-type]

    monkeypatch.setattr(FolderTable, "measure_one", counting)
    monkeypatch.setattr(watch, "MIN_ROLL_FILES", 1)
    monkeypatch.setattr(watch, "ROLL_CPU_SHARE", 0.0)
    for _ in range(3):
        watched.read()
    assert measured == []


def test_the_source_watches_from_its_first_read_and_json_keeps_the_estimate(ddir: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    tree(ddir, folders=2)
    src = source(Settings(datasets=(str(ddir),)))
    scans = []
    real = ds_source.scan_one
    monkeypatch.setattr(ds_source, "scan_one", lambda *a, **k: scans.append(a) or real(*a, **k))
    try:
        first = src.read()
        second = src.read()
        src.read()
        # No plain scan: the watch's first read is the full walk (a plain one first was measured again by it).
        assert scans == []
        assert isinstance(first, DatasetsPart) and isinstance(second, DatasetsPart)
        assert first.scanned[0].full_scan_at > 0 and second.scanned[0].full_scan_at > 0
        assert rows(second.scanned[0]) == rows(first.scanned[0]) != {}  # the file rows too (they were lost)
        one_off = scan_residency(ddir, OPTIONS)
        for f in ("files", "pages", "resident_pages", "data_pages", "size_bytes"):
            assert getattr(second.scanned[0], f) == getattr(one_off, f)
        est = DatasetsPart(paths=(DatasetResidency(path="/x", estimated=True, estimate_error_pages=7,
                                                   full_scan_at=5.0),))
        assert from_dict(DatasetsPart, to_dict(est)) == est
    finally:
        assert src.close is not None
        src.close()


def test_an_estimate_is_marked_on_its_row_and_explained_in_the_notes() -> None:
    from dltop.text.datasets import estimate_note, pct_text

    exact = DatasetResidency(path="/x", pages=100, resident_pages=50, data_pages=100, data_resident_pages=50)
    est = DatasetResidency(path="/x", pages=100, resident_pages=50, data_pages=100, data_resident_pages=50,
                           estimated=True, estimate_error_pages=2, full_scan_at=1000.0)
    assert (pct_text(exact), pct_text(est)) == ("50%", "~50%")
    assert estimate_note(exact, PS, 1090.0) is None
    note = estimate_note(est, PS, 1090.0)
    assert note is not None and "8.0 KiB may have been evicted" in note and "oldest count 1m old" in note


def rows(ds: DatasetResidency) -> dict[str, list[tuple[str, int, int, int]]]:
    """Each folder's listed files: (path, data pages, resident data pages, unknown data pages), in their order."""
    out: dict[str, list[tuple[str, int, int, int]]] = {}
    stack: list[ResidencyNode] = [ds]
    while stack:
        n = stack.pop()
        out[n.path] = [(f.path, f.data_pages, f.data_resident_pages, f.data_unknown_pages) for f in n.top_files]
        stack.extend(n.children)
    return out


@needs_fincore
@pytest.mark.parametrize("budget", [4096, 3])
def test_a_watched_datasets_file_rows_follow_what_is_read_created_and_deleted(ddir: Path, budget: int) -> None:
    """Per-file rows (top_files) of a watched dataset: a file read by another process is measured again and moves
    up (or down) its folder's ranks, a new file enters, a deleted one leaves; always the rows a one-off scan lists,
    with fincore's counts. budget=3: the folders share 3 rows, so the smaller folder lists none."""
    options = WalkOptions(max_depth=6, top_files=2, top_keys=FILE_SORT_KEYS, top_budget=budget)
    a = [make_file(ddir / "a" / f"f{i}.bin", (i + 1) * PS) for i in range(6)]
    make_file(ddir / "b" / "g.bin", PS)
    w = DatasetWatch(str(ddir), options)

    def check(ds: DatasetResidency) -> dict[str, list[tuple[str, int, int, int]]]:
        got, one_off = rows(ds), scan_residency(ddir, options)
        assert got == rows(one_off)
        assert (ds.files_top, ds.files_sorted_by) == (one_off.files_top, one_off.files_sorted_by)
        listed = [r[0] for folder in got.values() for r in folder]
        truth = fincore_resident_pages(*listed)
        assert {r[0]: r[2] for folder in got.values() for r in folder} == truth
        return got

    try:
        ds, _ = w.read()
        first = check(ds)[str(ddir / "a")]
        # A file not listed (neither among the biggest nor, all resident counts at 0, the lowest inodes) is read.
        pages, target = max((i + 1, p) for i, p in enumerate(a) if str(p) not in {r[0] for r in first})
        subprocess.run(["cat", str(target)], stdout=subprocess.DEVNULL, check=True)  # the only resident file
        ds, _ = w.read()
        now = check(ds)[str(ddir / "a")]
        assert (str(target), pages, pages, 0) in now  # the most resident now
        new = make_file(ddir / "a" / "new.bin", 10 * PS)
        os.unlink(a[5])
        ds, _ = w.read()
        now = check(ds)[str(ddir / "a")]
        assert now[0][0] == str(new) and str(a[5]) not in {r[0] for r in now}
        subprocess.run(["cat", str(new)], stdout=subprocess.DEVNULL, check=True)
        ds, _ = w.read()
        assert (str(new), 10, 10, 0) in check(ds)[str(ddir / "a")]
    finally:
        w.close()


@needs_fincore
def test_a_queue_overflow_measures_it_all_again(ddir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """More events than the kernel queues (max_queued_events) between two drains: the events after it are lost,
    so the next read measures the whole dataset again, and a read whose events were dropped is counted."""
    files = tree(ddir, folders=2)
    monkeypatch.setattr(events, "DRAIN_EVERY_S", 3600.0)  # no drain but ours
    monkeypatch.setattr(watch, "MIN_ROLL_FILES", 1)
    monkeypatch.setattr(watch, "ROLL_CPU_SHARE", 0.0)
    w = DatasetWatch(str(ddir), OPTIONS)
    try:
        first, _ = w.read()
        assert first.resident_pages == 0
        limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
        noise = files[-1]
        for _ in range(limit // 2 + 8):  # an open and a close each: the queue overflows
            os.close(os.open(noise, os.O_RDONLY))
        read_file(files[0])  # its events are dropped: the queue is full
        rescans = []
        real = DatasetWatch._rescan_all
        monkeypatch.setattr(DatasetWatch, "_rescan_all", lambda self, *a: rescans.append(1) or real(self, *a))
        now, _ = w.read()
        assert rescans == [1] and now.resident_pages == fincore_total(ddir) == 3
        now, _ = w.read()
        assert rescans == [1]  # once: the events are trusted again
    finally:
        w.close()


def test_the_rolling_pass_keeps_its_share_over_reads_not_a_folder_more_each(ddir: Path, watched: DatasetWatch,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The pass measures whole folders: a folder past a read's share is taken off the next reads' share, so over
    many reads it measures its share of files (and one folder more at most), and still reaches every folder."""
    tree(ddir, folders=6)  # 6 folders of 5 files, and the root: 7 folders, 37 files counted (a folder 1 + files)
    watched.read()
    monkeypatch.setattr(watch, "MIN_ROLL_FILES", 3)  # under one folder's 6
    monkeypatch.setattr(watch, "ROLL_CPU_SHARE", 0.0)
    measured: list[str] = []
    real = FolderTable.scan_folder

    def counting(self: DatasetWatch, f: object, steal: int) -> None:
        real(self, f, steal)  # type: ignore[arg-type]
        measured.extend([f.path] * (len(f.keys) + 1))  # type: ignore[attr-defined]

    monkeypatch.setattr(FolderTable, "scan_folder", counting)
    reads = 14
    for _ in range(reads):
        watched.read()
    assert len(measured) <= reads * 3 + 6
    assert len(set(measured)) == 7  # every folder within 14 reads: 37 files at 3 a read


def test_our_own_events_are_taken_off_at_once_not_kept_a_key_per_file(ddir: Path, watched: DatasetWatch) -> None:
    """The first read opens every file: once it has drained, nothing of ours is left in the counts (a million
    files kept two keys each until the next read), and a job's read after it is seen at the next."""
    files = tree(ddir, folders=3, files=50)
    first, _ = watched.read()
    assert (dict(watched.events.touched), watched.events.own, first.resident_pages) == ({}, {}, 0)
    subprocess.run(["cat", str(files[3])], stdout=subprocess.DEVNULL, check=True)
    now, _ = watched.read()
    assert (dict(watched.events.touched), watched.events.own) == ({}, {})
    assert now.resident_pages == 3
