"""One unit per screen, sparse files counted by their data, nested datasets counted once: on real trees, real
sparse files on the real filesystem, fincore and `dltop warm --dry-run` as referees."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from textual.widgets import DataTable, Static

from dltop import kernel
from dltop.fmt import human_bytes
from dltop.hints import datasets as hints_datasets
from dltop.hints.datasets import cold_dataset, dataset_larger_than_memory
from dltop.model import Snapshot
from dltop.model.datasets import total_of
from dltop.model.memory import safety_margin_bytes
from dltop.residency import walk as walking
from dltop.residency.scan import scan_paths, scan_residency
from dltop.residency.walk import WalkOptions
from dltop.sampler import ListFeed
from dltop.sources.memory import read_memory
from dltop.text.datasets import format_residency
from dltop.tui.app import DltopApp
from tests.test_pagecache_util import (
    PS,
    REPO,
    ddir_fixture,  # noqa: F401  (the `ddir` fixture)
    evict_file,
    fincore_resident_pages,
    make_file,
    needs_fincore,
    needs_root,
    read_file,
    walk_files,
)

MIB = 1 << 20


def dltop(*args: str) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([sys.executable, "-m", "dltop", *args], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 0, r.stderr
    return r


def whole_pages(path: Path) -> int:
    return (path.stat().st_size + PS - 1) // PS


def small_files(root: Path) -> list[Path]:
    """Files of 17 bytes to 200 KiB, none a whole number of pages: bytes and pages differ in every one."""
    files = [make_file(root / "val" / f"v{i}.bin", 17) for i in range(3)]
    return files + [make_file(root / "train" / f"t{i}.bin", 5000 * i + 17) for i in range(1, 41)]


def make_sparse(path: Path, size: int = 64 * MIB, at: tuple[int, ...] = (0, 20 * MIB, 40 * MIB)) -> Path:
    """A sparse file: `size` bytes, data only in 1 MiB extents at `at`, synced and evicted."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)
        for off in at:
            f.seek(off)
            f.write(os.urandom(MIB))
        f.flush()
        os.fsync(f.fileno())
    evict_file(path)
    if path.stat().st_blocks * 512 >= size:
        pytest.skip("filesystem without sparse files")
    return path


def read_ranges(path: Path, *ranges: tuple[int, int]) -> None:
    """Read exactly these (offset, length) ranges: no readahead around them."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        for off, n in ranges:
            os.pread(fd, n, off)
    finally:
        os.close(fd)


_ROW = re.compile(r"^\s*(\S+ \S+)\s+(\S+)\s+(\S+ \S+)\s+(-|\S+ \S+)\s+(\S+ \S+)\s+(\d+)  (\s*)(.+)$")


def table(text: str) -> dict[str, dict[str, str]]:
    """`dltop residency`'s rows by path: resident, pct, dirty, unknown, data (the 5th column), files."""
    lines = text.splitlines()
    assert lines[0].split()[:5] == ["RESIDENT", "%", "DIRTY", "UNKNOWN", "DATA"], lines[0]
    out = {}
    for line in lines[1:]:
        m = _ROW.match(line)
        if m is None:
            break
        out[m.group(8)] = dict(zip(("resident", "pct", "dirty", "unknown", "data", "files"), m.groups()[:6],
                                   strict=True))
    return out


# -- 4: one unit per screen ----------------------------------------------------------------------------------


@contextlib.contextmanager
def locked(files: list[Path]) -> Iterator[None]:
    """The files read and held in memory (mlock), so that memory pressure from elsewhere cannot evict a page."""
    with contextlib.ExitStack() as stack:
        for f in files:
            fd = os.open(f, os.O_RDONLY)
            try:
                stack.enter_context(kernel.LockedMapping(fd, f.stat().st_size))
            finally:
                os.close(fd)
        yield


@needs_fincore
def test_residency_table_is_in_one_unit_whole_pages(ddir: Path) -> None:
    files = small_files(ddir)
    with locked(files):
        rows = table(dltop("residency", str(ddir)).stdout)
        fin = fincore_resident_pages(*walk_files(ddir))
    pages = sum(whole_pages(f) for f in files)
    root, val = rows[str(ddir)], rows[str(ddir / "val")]
    # All of it resident: resident and data are the same number in the same unit, as fincore counts pages.
    assert root["data"] == root["resident"] == human_bytes(sum(fin.values()) * PS) == human_bytes(pages * PS)
    assert root["pct"] == "100.0"
    assert val["data"] == val["resident"] == human_bytes(3 * PS)  # three 17-byte files are three pages
    node = json.loads(dltop("residency", "--json", str(ddir)).stdout)["paths"][0]
    assert node["data_pages"] == node["pages"] == pages
    assert node["size_bytes"] == sum(f.stat().st_size for f in files)  # the exact bytes stay in JSON
    assert sum(c["data_pages"] for c in node["children"]) == node["data_pages"]


@needs_fincore
async def test_a_dataset_not_all_resident_never_shows_100_percent(ddir: Path) -> None:
    # 998 of 1000 pages held (mlock), the last 2 evicted: fincore's 99.8%, shown as 100% before.
    f = make_file(ddir / "shard.bin", 1000 * PS)
    fd = os.open(f, os.O_RDONLY)
    try:
        with kernel.LockedMapping(fd, 998 * PS):
            os.posix_fadvise(fd, 998 * PS, 2 * PS, os.POSIX_FADV_DONTNEED)
            assert fincore_resident_pages(f)[str(f)] == 998
            rows = table(dltop("residency", str(ddir)).stdout)
            part = scan_paths((str(ddir),))
    finally:
        os.close(fd)
    assert rows[str(ddir)]["pct"] == "99.8"
    app = DltopApp(ListFeed([Snapshot(ts=100.0, host="t", datasets=part)]))
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.press(str([p.PANE_ID for p in app.panes].index("datasets") + 1))
        await pilot.pause()
        grid = app.query_one("#ds-table", DataTable)
        assert [str(c) for c in grid.get_row_at(0)][3] == "99.8%"


async def test_tui_header_total_is_the_sum_of_its_rows(ddir: Path) -> None:
    a, b = ddir / "a", ddir / "b"
    for f in small_files(a)[::3]:
        read_file(f)
    make_sparse(a / "shards" / "sparse.bin")
    small_files(b)
    part = scan_paths((str(a), str(b)), WalkOptions(max_depth=6))
    app = DltopApp(ListFeed([Snapshot(ts=100.0, host="t", datasets=part)]))
    async with app.run_test(size=(120, 30)) as pilot:
        tab = [p.PANE_ID for p in app.panes].index("datasets") + 1
        await pilot.press(str(tab))
        await pilot.pause()
        grid = app.query_one("#ds-table", DataTable)
        rows = [[str(c) for c in grid.get_row_at(i)] for i in range(grid.row_count)]
        header = str(app.query_one("#ds-summary", Static).render())
        data = sum(d.data_pages for d in part.paths) * PS
        res = sum(d.data_resident_pages for d in part.paths) * PS
        assert f"{human_bytes(res)} of {human_bytes(data)} resident" in header
        assert [r[1] for r in rows] == [human_bytes(d.data_pages * PS) for d in part.paths]
        await pilot.press("enter")  # into a: its folders' rows add up to the line above them
        await pilot.pause()
        rows = [[str(c) for c in grid.get_row_at(i)] for i in range(grid.row_count)]
        header = str(app.query_one("#ds-summary", Static).render())
        top = part.paths[0]
        assert sum(c.data_pages for c in top.children) == top.data_pages
        assert f"of {human_bytes(top.data_pages * PS)} resident" in header
        assert sorted(r[1] for r in rows) == sorted(human_bytes(c.data_pages * PS) for c in top.children)


# -- 5: sparse files: the data, not the holes ----------------------------------------------------------------


@needs_fincore
def test_sparse_file_counts_its_data_against_fincore_and_warm(ddir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sparse = make_sparse(ddir / "shards" / "sparse.bin")
    dense = small_files(ddir)
    data = 3 * MIB // PS + sum(whole_pages(f) for f in dense)
    r = scan_residency(ddir)
    assert (r.data_pages, r.pages) == (data, data - 3 * MIB // PS + 64 * MIB // PS)
    assert r.data_resident_pages == r.resident_pages == 0
    dry = json.loads(dltop("warm", "--dry-run", "--json", str(ddir)).stdout)
    assert dry["total_bytes"] == data * PS
    # The cold hint's "to read" is the warm's, holes left out.
    monkeypatch.setattr(hints_datasets, "COLD_MIN_BYTES", 0)
    h = cold_dataset(scan_paths((str(ddir),)), read_memory())
    assert h is not None and h.numbers["to_read_bytes"] == dry["total_bytes"]
    assert "to read" in h.fix and human_bytes(data * PS) in h.fix

    # Part of the data and part of a hole read: fincore counts both; the data counts only the data.
    read_ranges(sparse, (0, MIB), (10 * MIB, MIB))  # the second range is a hole: the kernel caches zero pages
    fin = fincore_resident_pages(sparse)[str(sparse)]
    assert fin == 2 * MIB // PS
    r = scan_residency(ddir)
    assert r.resident_pages == fin and r.data_resident_pages == MIB // PS

    # This VM runs DAMON's proactive reclaim (kdamond), which evicts a page now and then from any file left
    # untouched for a few seconds: scan and referee back to back, and warm again if a page went in between. A
    # headline that counts holes reads short on every try.
    for _try in range(5):
        assert "warmed" in dltop("warm", str(ddir)).stdout
        part = scan_paths((str(ddir),))
        fin = fincore_resident_pages(*walk_files(ddir))
        node = part.paths[0]
        left = json.loads(dltop("warm", "--dry-run", "--json", str(ddir)).stdout)["total_bytes"]
        if node.data_resident_pages == data and fin[str(sparse)] == 4 * MIB // PS and left == 0:
            break
    assert node.data_resident_pages == node.data_pages == data
    assert fin[str(sparse)] == 4 * MIB // PS  # 3 MiB of data, 1 MiB of zeros
    assert node.resident_pages == sum(fin.values())
    text = format_residency(part)
    assert table(text)[str(ddir)]["pct"] == "100.0"
    assert "1.0 MiB of zero pages read from holes" in text and "holes of sparse files: 61.0 MiB" in text
    assert left == 0  # nothing left to warm: the dry run and the headline agree


def test_sparse_file_by_mincore_counts_the_same(ddir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sparse = make_sparse(ddir / "sparse.bin")
    read_ranges(sparse, (20 * MIB, MIB), (30 * MIB, MIB))  # the second extent, and a hole
    by_cachestat = scan_residency(ddir)
    monkeypatch.setattr(walking, "needs_mincore", lambda fd: True)
    by_mincore = scan_residency(ddir)
    assert by_mincore.method == "mincore" and by_cachestat.method == "cachestat"
    fields = ("pages", "resident_pages", "data_pages", "data_resident_pages")
    assert [getattr(by_mincore, f) for f in fields] == [getattr(by_cachestat, f) for f in fields] == \
        [64 * MIB // PS, 2 * MIB // PS, 3 * MIB // PS, MIB // PS]


def test_larger_than_memory_hint_counts_data_not_holes(ddir: Path) -> None:
    make_sparse(ddir / "sparse.bin")  # 64 MiB long, 3 MiB of data
    part = scan_paths((str(ddir),))
    mem = read_memory()
    assert mem.total_bytes is not None
    tight = dataclasses.replace(mem, available_bytes=safety_margin_bytes(mem.total_bytes) + 8 * MIB)
    assert dataset_larger_than_memory(part, tight) is None  # 3 MiB of data fits in 8 MiB
    tighter = dataclasses.replace(mem, available_bytes=safety_margin_bytes(mem.total_bytes) + 2 * MIB)
    h = dataset_larger_than_memory(part, tighter)
    assert h is not None and h.numbers["size_bytes"] == 3 * MIB and "(3.0 MiB)" in h.text


# -- 6: a dataset inside another, or the same one given twice, counted once ---------------------------------


def nested(ddir: Path) -> Path:
    top = ddir / "DS"
    small_files(top)
    (ddir / "alias").symlink_to(top)
    return top


def test_nested_and_repeated_datasets_are_counted_once(ddir: Path) -> None:
    top = nested(ddir)
    read_file(top / "val" / "v0.bin")
    paths = [str(top), str(top / "val"), str(ddir / "alias"), f"{top}/", f"{top}/val/..", str(top / "val/v1.bin")]
    part = scan_paths(paths)
    t = str(top)
    assert [(d.counted_in, d.same_tree) for d in part.paths] == [
        (None, False), (t, False), (t, True), (t, True), (t, True), (t, False)]
    ds = part.paths[0]
    assert part.paths[1].files == 3 and part.paths[2].files == ds.files == 43  # each keeps its own numbers
    total = total_of(part.paths)
    assert (total.files, total.data_pages, total.data_resident_pages, total.pages) == \
        (ds.files, ds.data_pages, ds.data_resident_pages, ds.pages)
    # The same through the CLI: a total row equal to DS alone, and a note for each one left out.
    text = dltop("residency", str(top), str(top / "val"), str(ddir / "alias")).stdout
    rows = table(text)
    assert rows["total"] == rows[t]
    assert f"{top / 'val'} is inside {top}: counted once" in text
    assert f"{ddir / 'alias'} is {top} (the same folder or file): counted once" in text
    one = json.loads(dltop("warm", "--dry-run", "--json", str(top)).stdout)
    both = json.loads(dltop("warm", "--dry-run", "--json", str(top), str(top / "val")).stdout)
    assert (both["files"], both["total_bytes"], both["pages"]) == (one["files"], one["total_bytes"], one["pages"])


def test_a_folder_the_walk_does_not_enter_is_not_inside(ddir: Path) -> None:
    top = nested(ddir)
    other = ddir / "other"
    small_files(other)
    (top / "link").symlink_to(other)
    (other / "back").symlink_to(top)
    part = scan_paths((str(top), str(top / "val")), WalkOptions(ignore=("val",)))
    assert part.paths[1].counted_in is None  # DS's walk skipped val/: it is counted on its own
    assert total_of(part.paths).files == part.paths[0].files + part.paths[1].files
    part = scan_paths((str(top), str(top / "link")))
    assert part.paths[1].counted_in is None  # a symlink not followed
    # Followed, each reaches the other: the first given counts, once.
    part = scan_paths((str(top / "link"), str(top)), WalkOptions(follow_symlinks=True))
    assert [d.counted_in for d in part.paths] == [None, str(top / "link")]


@needs_root
def test_a_mount_inside_a_dataset_is_not_inside_unless_crossed(ddir: Path) -> None:
    top = nested(ddir)
    m = top / "mnt"
    m.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(m)], check=True)
    try:
        (m / "ram.bin").write_bytes(os.urandom(2 * PS))
        assert scan_paths((str(top), str(m))).paths[1].counted_in is None
        crossed = scan_paths((str(top), str(m)), WalkOptions(cross_filesystems=True))
        assert crossed.paths[1].counted_in == str(top)
    finally:
        subprocess.run(["umount", str(m)], check=True)


def test_snapshot_and_tui_count_a_nested_dataset_once(ddir: Path) -> None:
    top = nested(ddir)
    snap = json.loads(dltop("snapshot", "--dataset", str(top), "--dataset", str(top / "val")).stdout)
    paths = snap["datasets"]["paths"]
    assert [p["counted_in"] for p in paths] == [None, str(top)]
    part = scan_paths((str(top), str(top / "val")))
    text = format_residency(part)
    assert f"{top / 'val'} is inside {top}: counted once" in text


async def test_tui_header_counts_a_nested_dataset_once(ddir: Path) -> None:
    top = nested(ddir)
    part = scan_paths((str(top), str(top / "val")), WalkOptions(max_depth=6))
    app = DltopApp(ListFeed([Snapshot(ts=100.0, host="t", datasets=part)]))
    async with app.run_test(size=(120, 30)) as pilot:
        tab = [p.PANE_ID for p in app.panes].index("datasets") + 1
        await pilot.press(str(tab))
        await pilot.pause()
        header = str(app.query_one("#ds-summary", Static).render())
        assert app.query_one("#ds-table", DataTable).row_count == 2  # the nested one keeps its row
    assert f"of {human_bytes(part.paths[0].data_pages * PS)} resident" in header
    assert f"{top / 'val'} is inside {top}: counted once" in header
