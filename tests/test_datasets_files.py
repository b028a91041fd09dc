"""Per-file rows: a folder's files in the scan (its top few by each sort key, in bounded memory), in `dltop
residency --files` and in the Datasets pane, checked against fincore on real files."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from textual.widgets import DataTable

from dltop.config import Settings
from dltop.fmt import printable
from dltop.model import Snapshot
from dltop.model.datasets import DatasetResidency, ResidencyNode
from dltop.residency.rank import FILE_SORT_KEYS, TopFiles
from dltop.residency.scan import scan_paths, scan_residency
from dltop.residency.walk import FolderTotals, WalkOptions
from dltop.sampler import ListFeed
from dltop.sources import datasets as ds
from dltop.text.datasets import listed_files, sort_rank
from dltop.tui.app import DltopApp
from dltop.tui.screens.confirm import ConfirmScreen
from tests.test_pagecache_util import (
    PS,
    REPO,
    ddir_fixture,  # noqa: F401  (the `ddir` fixture)
    fincore_resident_pages,
    make_file,
    needs_fincore,
)


def read_pages(path: Path, pages: int) -> None:
    """Bring the first `pages` pages of a file into the page cache, no readahead past them."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        for i in range(pages):
            os.pread(fd, 1, i * PS)
    finally:
        os.close(fd)


def make_shards(root: Path) -> list[Path]:
    """A leaf folder of four shards of different sizes, each partly resident (small stand-ins for 600 MiB)."""
    shards = [make_file(root / "shards" / f"shard-{i:05d}.tar", (40 + 24 * i) * PS + 100) for i in range(4)]
    for i, f in enumerate(shards):
        read_pages(f, (3 - i) * 12)
    return shards


def source_part(*paths: Path) -> DatasetResidency:
    """The first dataset as the TUI's source scans it."""
    part = ds.source(Settings(datasets=tuple(map(str, paths)))).read()
    first = part.paths[0]
    assert isinstance(first, DatasetResidency)
    return first


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dltop", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=60)


@needs_fincore
def test_a_leaf_folder_of_shards_lists_each_file_as_fincore_does(ddir: Path) -> None:
    shards = make_shards(ddir)
    fin = fincore_resident_pages(*shards)
    assert len(set(fin.values())) > 1  # the shards differ, so a wrong file's numbers would show
    root = source_part(ddir / "shards")
    assert root.files_top > 0 and root.files_sorted_by == FILE_SORT_KEYS
    got = {f.path: f for f in root.top_files}
    assert set(got) == set(fin)
    for shard in shards:
        f = got[str(shard)]
        pages = -(-shard.stat().st_size // PS)
        assert (f.files, f.size_bytes, f.pages, f.data_pages) == (1, shard.stat().st_size, pages, pages)
        assert f.resident_pages == f.data_resident_pages == fin[str(shard)]
    # the folder's totals are its files' sums, and with every file listed there is no "more" row
    shown, rest = listed_files(root, "size", root.files_top)
    assert rest is None and sum(f.resident_pages for f in shown) == root.resident_pages

    r = run_cli("residency", "--files", "--json", str(ddir / "shards"))
    assert r.returncode == 0, r.stderr
    (node,) = json.loads(r.stdout)["paths"]
    cli = {e["path"]: e for e in node["top_files"]}
    assert {p: e["resident_pages"] for p, e in cli.items()} == fin
    assert set(cli[str(shards[0])]) >= {"path", "files", "size_bytes", "pages", "resident_pages", "dirty_pages",
                                        "unknown_pages", "data_pages", "data_resident_pages", "data_unknown_pages"}
    text = run_cli("residency", "--files", str(ddir / "shards")).stdout
    assert all(f"    {s}" in text for s in shards)


@needs_fincore
def test_rows_sort_by_size_resident_and_coldest_first(ddir: Path) -> None:
    shards = make_shards(ddir)
    fin = fincore_resident_pages(*shards)
    pages = {str(s): -(-s.stat().st_size // PS) for s in shards}
    root = source_part(ddir / "shards")
    expect = {
        "size": sorted(pages, key=lambda p: -pages[p]),
        "resident": sorted(pages, key=lambda p: -fin[p]),
        "pct": sorted(pages, key=lambda p: fin[p] / pages[p]),
    }
    for key, order in expect.items():
        assert [f.path for f in listed_files(root, key, 4)[0]] == order, key
        # the CLI's --sort picks the same top 2, and says how many are left
        r = run_cli("residency", "--files", "--top", "2", "--sort", key, str(ddir / "shards"))
        lines = [ln.split()[-1] for ln in r.stdout.splitlines()[2:4]]
        assert lines == order[:2], (key, r.stdout)
        assert "… 2 more files" in r.stdout


def test_a_huge_folder_keeps_its_top_files_only(ddir: Path) -> None:
    """2,000 files in one folder: rows for the top few by each key and one row for the rest, never 2,000."""
    flat = ddir / "flat"
    flat.mkdir()
    for i in range(2000):
        os.close(os.open(flat / f"f{i:05d}", os.O_CREAT | os.O_WRONLY, 0o644))
    big = [make_file(flat / f"big{i}", (i + 2) * PS) for i in range(6)]
    read_pages(big[0], 2)  # the smallest big file is the only resident one
    r = scan_residency(flat, WalkOptions(top_files=3, top_keys=FILE_SORT_KEYS))
    assert r.files == 2006 and r.files_top == 3
    assert len(r.top_files) <= 3 * len(FILE_SORT_KEYS)
    shown, rest = listed_files(r, "size", r.files_top)
    assert [f.path for f in shown] == [str(p) for p in big[:2:-1]]  # the three biggest, biggest first
    assert rest is not None and rest.files == 2003 and rest.data_pages == r.data_pages - sum(f.data_pages
                                                                                             for f in shown)
    assert listed_files(r, "resident", 1)[0][0].path == str(big[0])
    # Only the keys asked for are kept (one key, one file); none asked for, none kept
    assert len(scan_residency(flat, WalkOptions(top_files=1, top_keys=("size",))).top_files) == 1
    assert (plain := scan_residency(flat)).top_files == () and plain.files_top == 0


def test_many_folders_share_one_budget_of_file_rows(ddir: Path) -> None:
    """40 folders of 12 files, 10 a folder asked for, 100 rows in all: the 10 folders with the most data list
    their top 10, the others none (their files in the "more" row)."""
    for d in range(40):
        (ddir / f"d{d:02d}").mkdir()
        for i in range(12):  # dense, not synced: only their sizes matter here
            (ddir / f"d{d:02d}" / f"x{i:02d}").write_bytes(b"x" * ((d % 7 + i % 3) * PS + 1))
    r = scan_residency(ddir, WalkOptions(max_depth=1, top_files=10, top_keys=("size",), top_budget=100))
    assert r.files_top == 10 and len(r.children) == 40
    biggest = sorted(r.children, key=lambda c: (c.data_pages, c.path))[-10:]
    assert [c.path for c in r.children if c.top_files] == sorted(c.path for c in biggest)
    for child in biggest:
        d = int(child.path[-2:])
        # The 10 with most data (pages: (d % 7 + i % 3) * PS + 1 bytes); among equals the scan keeps the lowest
        # inodes, which need not be the names' order when other tests free inodes, so equals are compared as a set.
        kept = sorted((f.data_pages for f in child.top_files), reverse=True)
        assert kept == sorted((d % 7 + i % 3 + 1 for i in range(12)), reverse=True)[:10]
        shown = listed_files(child, "size", 10)[0]  # most data first, ties by path
        assert [f.path for f in shown] == [f.path for f in sorted(child.top_files, key=lambda f: (-f.data_pages,
                                                                                                    f.path))]
        assert len(child.top_files) == 10
    assert listed_files(r.children[0], "size", 10)[1] is not None  # the others: one row for all their files


def test_hostile_and_non_utf8_names_are_shown_escaped_and_kept_exact_in_json(ddir: Path) -> None:
    names = [b"caf\xe9.bin", b"red\x1b[31m.bin", "\u202eevil.bin".encode(), b"x[bold]y.bin"]
    folder = ddir / "names"
    folder.mkdir()
    for n in names:
        with open(os.path.join(os.fsencode(folder), n), "wb") as f:
            f.write(b"x" * 10)
    r = run_cli("residency", "--files", "--json", str(folder))
    assert r.returncode == 0, r.stderr
    (node,) = json.loads(r.stdout)["paths"]
    exact = {base64.b64decode(e["path_b64"]) if "path_b64" in e else e["path"].encode() for e in node["top_files"]}
    assert exact == {os.fsencode(folder) + b"/" + n for n in names}
    text = run_cli("residency", "--files", str(folder)).stdout
    assert "\x1b" not in text and "\u202e" not in text
    assert "caf\\xe9.bin" in text and "red\\x1b[31m.bin" in text and "\\u202eevil.bin" in text


async def test_the_pane_lists_files_sorts_them_and_says_how_many_more(ddir: Path) -> None:
    shards = make_shards(ddir)
    extra = [make_file(ddir / "shards" / "more" / f"m{i:03d}", PS) for i in range(52)]
    hostile = make_file(ddir / "shards" / "bad\x1b]0;x\x07.idx", PS)
    part = scan_paths((str(ddir / "shards"),), WalkOptions(max_depth=1, top_files=50, top_keys=FILE_SORT_KEYS))
    root = part.paths[0]
    assert isinstance(root, DatasetResidency)
    app = DltopApp(ListFeed([Snapshot(ts=root.scanned_at, host="t", datasets=part)]))
    async with app.run_test(size=(80, 24)) as pilot:
        tab = [p.PANE_ID for p in app.panes].index("datasets") + 1
        await pilot.press(str(tab), "enter")
        await pilot.pause()
        table = app.query_one("#ds-table", DataTable)
        labels = [str(table.get_row_at(i)[0]) for i in range(table.row_count)]
        by_size = sorted((*root.children, *root.top_files), key=sort_rank("size"))
        assert labels[:5] == [os.path.basename(n.path) + ("/" if n.children or n.files > 1 else "")
                              for n in by_size[:5]]
        assert [x for x in labels if x.startswith("shard-")] == [s.name for s in shards[::-1]]  # biggest first
        assert "more/" in labels[:5]  # the folder sorts among the files, by its data
        assert printable(hostile.name) in labels and hostile.name not in labels
        assert "by data, s sorts" in str(app.query_one("#ds-summary").render())
        for y in range(table.row_count + 1):  # the lines drawn hold no control, and fit 80 columns
            line = table.render_line(y).text
            assert "\x1b" not in line and "\x07" not in line and len(line) <= 80
        # s: by resident (the shard read most first), then coldest first (the biggest shard, never read)
        for first in (shards[0], shards[3]):
            await pilot.press("s")
            await pilot.pause()
            assert str(table.get_row_at(0)[0]) == first.name
        # drill into the folder of 52 files: 50 listed, then one row for the other 2
        await pilot.press("s")  # back to size
        await pilot.pause()
        table.move_cursor(row=[str(table.get_row_at(i)[0]) for i in range(table.row_count)].index("more/"))
        await pilot.press("enter")
        await pilot.pause()
        labels = [str(table.get_row_at(i)[0]) for i in range(table.row_count)]
        assert len(labels) == 51 and labels[-1] == "… 2 more files"
        assert str(table.get_row_at(50)[5]) == "2"
        assert set(labels[:50]) <= {p.name for p in extra}
        # w on a file row warms that file: the confirmation names it
        await pilot.press("w")
        for _ in range(200):
            await pilot.pause(0.02)
            if isinstance(app.screen, ConfirmScreen):
                break
        assert isinstance(app.screen, ConfirmScreen)
        dialog = str(app.screen.query_one("#confirm-title").render()) + str(app.screen.query_one("#confirm-body").render())
        assert labels[0] in dialog, dialog
        await pilot.press("n")


@settings(max_examples=300, derandomize=True, deadline=None)
@given(
    folders=st.lists(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40), st.integers(0, 40)), max_size=30),
                     max_size=8),
    n=st.integers(1, 12),
    budget=st.integers(0, 60),
    keys=st.lists(st.sampled_from(FILE_SORT_KEYS), min_size=1, max_size=3, unique=True),
)
def test_top_files_equal_a_brute_force_top_n_in_bounded_memory(folders, n, budget, keys) -> None:
    """Against sorting every file, folders walked one after another as the scan walks them: each folder that
    lists files lists its true top `n` by each key, those folders have more data than any that lists none,
    the rows fit the budget, and never more than twice the budget is held while the scan runs."""
    test_top_files_equal_a_brute_force_top_n_in_bounded_memory.tried += 1  # type: ignore[attr-defined]
    accs = [FolderTotals(f"/d{i}") for i in range(len(folders))]
    top = TopFiles(n, tuple(keys), budget)
    flat = []  # (ino, folder, data, dres, dunknown)
    for a, files in enumerate(folders):
        for data, dres, dunknown in files:
            dres = min(dres, data)
            dunknown = min(dunknown, data - dres)
            ino = len(flat)
            flat.append((ino, a, data, dres, dunknown))
            top.offer(accs[a], f"/d{a}", f"f{ino}", 0, ino, data * PS, data, data, dres, dres,
                      unknown=dunknown, dunknown=dunknown)
            assert top._held <= 2 * budget
        accs[a].data += sum(x[2] for x in flat if x[1] == a)  # as the scan adds a folder's sums when it leaves
    rows = top.rows()
    assert sum(len(h) for hs in top._heaps.values() for h in hs) <= budget

    def score(key: str, f: tuple[int, int, int, int, int]) -> tuple[object, ...]:
        ino, _folder, data, dres, dunknown = f
        known = data - dunknown
        s = {"size": data, "resident": dres, "pct": (-dres / known if known > 0 else -2.0, data)}[key]
        return (s, -ino)

    for a, acc in enumerate(accs):
        if acc not in rows:
            continue
        want: set[str] = set()
        for key in keys:
            ranked = sorted((x for x in flat if x[1] == a), key=lambda x, k=key: score(k, x), reverse=True)
            want |= {f"/d{a}/f{x[0]}" for x in ranked[:top.n]}
        assert {f.path for f in rows[acc]} == want
        assert all(isinstance(f, ResidencyNode) and f.files == 1 for f in rows[acc])
    listed = [(acc.data, acc.path) for acc in accs if acc in rows]
    unlisted = [(acc.data, acc.path) for acc, files in zip(accs, folders, strict=True) if files and acc not in rows]
    assert not listed or not unlisted or min(listed) > max(unlisted)
    if sum(min(len(f), n) for f in folders) * len(keys) <= budget:  # it all fits: nothing left out
        assert top.n == n and not unlisted


test_top_files_equal_a_brute_force_top_n_in_bounded_memory.tried = 0  # type: ignore[attr-defined]


def test_the_fuzz_tried_its_inputs() -> None:
    """Runs after the property (file order): the count that goes into docs/datasets.md."""
    tried = test_top_files_equal_a_brute_force_top_n_in_bounded_memory.tried  # type: ignore[attr-defined]
    print(f"TopFiles fuzz: {tried} inputs")
    assert tried >= 300
