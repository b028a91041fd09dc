"""The watch's file rows (dltop/residency/watch.py `_file_rows`) against the scan's (`TopFiles`) on the same numbers: the
same files, in the same order, ties and the coldest-first key included, and again after files' resident counts
change one by one (re-ranked in place, the reserve standing in); a Hypothesis property, no files."""

from __future__ import annotations

from array import array
from itertools import accumulate

from hypothesis import given, settings
from hypothesis import strategies as st

from dltop.residency import rank, ranker, walk
from dltop.residency.folders import SUMMED, VALUES, Folder

# Per file: (data pages, resident data pages, unknown: the kernel hides it); few values, so scores tie often.
FILE = st.tuples(st.integers(0, 6), st.integers(0, 6), st.booleans())
TRIED = []


def folder(path: str, files: list[tuple[int, int, bool]], first_ino: int) -> tuple[Folder, list[tuple]]:
    f = Folder(path, 1, 1, first_ino, None)
    rows = []
    vals = array("q")
    for k, (data, res, unknown) in enumerate(files):
        res = min(res, data)
        unk = data if unknown else 0
        res = 0 if unknown else res
        ino = first_ino + 1 + (k * 7919) % (len(files) + 1)  # not in name order
        v = (data * 4096, data, data, res, 0, 0, 0, res, unk, unk, 1, ino)
        vals.extend(v)
        rows.append((f"n{k}", ino, v))
    names = [r[0] for r in rows]
    f.keys, f.vals = array("q", (hash(n) for n in names)), vals
    f.names = "\0".join(names) + "\0" if names else ""
    f.offs = array("I", accumulate((len(n) + 1 for n in names), initial=0))
    f.tot = [sum(vals[j::VALUES]) for j in range(SUMMED)]
    return f, rows


@settings(max_examples=200, derandomize=True, deadline=None)
@given(st.lists(st.lists(FILE, max_size=12), min_size=1, max_size=3), st.integers(1, 3),
       st.sampled_from([("size",), ("resident",), ("pct",), rank.FILE_SORT_KEYS, ("pct", "size")]),
       st.integers(1, 40), st.lists(st.tuples(st.integers(0, 2), st.integers(0, 40), st.integers(0, 6)), min_size=5,
                                    max_size=60))
def test_the_watch_lists_the_files_a_scan_lists(folders: list[list[tuple[int, int, bool]]], n: int,
                                                keys: tuple[str, ...], budget: int,
                                                changes: list[tuple[int, int, int]]) -> None:
    TRIED.append(1)
    monkey_reserve = 1  # a small reserve: it runs out, and the folder is ranked again
    old_reserve, ranker.RESERVE = ranker.RESERVE, monkey_reserve
    try:
        check(folders, n, keys, budget, changes)
    finally:
        ranker.RESERVE = old_reserve


def scan_rows(order: list[Folder], n: int, keys: tuple[str, ...], budget: int) -> tuple[int, dict[str, list[tuple]]]:
    """What TopFiles lists for the numbers the watch holds now."""
    top = rank.TopFiles(n, keys, budget)
    accs = {}
    for f in order:
        acc = accs[f] = walk.FolderTotals(f.path)
        acc.data = f.tot[2]
        for i in range(len(f.keys)):
            v = f.vals[i * VALUES:(i + 1) * VALUES]
            top.offer(acc, f.path, f.name(i), 0, v[11], v[0], v[1], v[2], v[3], v[7], unknown=v[8], dunknown=v[9])
    want = top.rows()
    return top.n, {f.path: [(r.path, r.data_pages, r.data_resident_pages, r.data_unknown_pages)
                            for r in want.get(acc, ())] for f, acc in accs.items()}


def watch_rows(w: ranker.FileRanker, order: list[Folder]) -> tuple[int, dict[str, list[tuple]]]:
    n, got = w.rows(order)
    return n, {f.path: [(r.path, r.data_pages, r.data_resident_pages, r.data_unknown_pages)
                        for r in got.get(f, ())] for f in order}


def check(folders: list[list[tuple[int, int, bool]]], n: int, keys: tuple[str, ...], budget: int,
          changes: list[tuple[int, int, int]]) -> None:
    if len(folders) > 1:
        budget = 10_000  # folders sharing a tight budget: the scan's choice depends on the order it met them in
    w = ranker.FileRanker(walk.WalkOptions(top_files=n, top_keys=keys, top_budget=budget))
    w.keys = keys
    order = [folder(f"/d{j}", files, 1000 * (j + 1))[0] for j, files in enumerate(folders)]
    assert watch_rows(w, order) == scan_rows(order, n, keys, budget)
    for j, k, res in changes:  # a file read (or evicted) and counted again, as _recount does
        f = order[j % len(order)]
        if not len(f.keys):
            continue
        i, b = k % len(f.keys), (k % len(f.keys)) * VALUES
        if f.vals[b + 8]:
            continue  # hidden from us: never counted again in place
        new = min(res, f.vals[b + 2])
        f.tot[3] += new - f.vals[b + 3]
        f.tot[7] += new - f.vals[b + 7]
        f.vals[b + 3] = f.vals[b + 7] = new
        w.rerank(f, i)
        assert watch_rows(w, order) == scan_rows(order, n, keys, budget)


def test_the_property_ran() -> None:
    """How many inputs the property above tried (docs/datasets.md quotes it)."""
    print(f"file rows: {len(TRIED)} inputs")
    assert len(TRIED) == 0 or len(TRIED) >= 100
