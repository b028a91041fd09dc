"""The watch's file rows (sources/watch.py `_file_rows`) against the scan's (`TopFiles`) on the same numbers: the
same files, in the same order, ties and the coldest-first key included; a Hypothesis property, no files."""

from __future__ import annotations

from array import array
from itertools import accumulate

from hypothesis import given, settings
from hypothesis import strategies as st

from dltop.sources import datasets as engine
from dltop.sources import watch
from dltop.sources.watch import DatasetWatch

# Per file: (data pages, resident data pages, unknown: the kernel hides it); few values, so scores tie often.
FILE = st.tuples(st.integers(0, 6), st.integers(0, 6), st.booleans())
TRIED = []


def folder(path: str, files: list[tuple[int, int, bool]], first_ino: int) -> tuple[watch._Folder, list[tuple]]:
    f = watch._Folder(path, 1, 1, first_ino, None)
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
    f.tot = [sum(vals[j::watch._N]) for j in range(watch._SUM)]
    return f, rows


@settings(max_examples=200, derandomize=True, deadline=None)
@given(st.lists(st.lists(FILE, max_size=12), min_size=1, max_size=3), st.integers(1, 5),
       st.sampled_from([("size",), ("resident",), ("pct",), engine.FILE_SORT_KEYS, ("pct", "size")]),
       st.integers(1, 40))
def test_the_watch_lists_the_files_a_scan_lists(folders: list[list[tuple[int, int, bool]]], n: int,
                                                keys: tuple[str, ...], budget: int) -> None:
    TRIED.append(1)
    if len(folders) > 1:
        budget = 10_000  # folders sharing a tight budget: the scan's choice depends on the order it met them in
    w = DatasetWatch.__new__(DatasetWatch)
    w.options = engine.WalkOptions(top_files=n, top_keys=keys, top_budget=budget)
    w._keys = keys
    top = engine.TopFiles(n, keys, budget)
    w._order, accs = [], {}
    for j, files in enumerate(folders):
        f, rows = folder(f"/d{j}", files, 1000 * (j + 1))
        w._order.append(f)
        acc = accs[f] = engine._Acc(f.path)
        acc.data = f.tot[2]
        for name, ino, v in rows:
            top.offer(acc, f.path, name, 0, ino, v[0], v[1], v[2], v[3], v[7], unknown=v[8], dunknown=v[9])
    files_top, got = w._file_rows()
    want = top.rows()
    assert files_top == top.n
    for f, acc in accs.items():
        assert [(r.path, r.data_pages, r.data_resident_pages, r.data_unknown_pages) for r in got.get(f, ())] == [
            (r.path, r.data_pages, r.data_resident_pages, r.data_unknown_pages) for r in want.get(acc, ())]


def test_the_property_ran() -> None:
    """How many inputs the property above tried (docs/datasets.md quotes it)."""
    print(f"file rows: {len(TRIED)} inputs")
    assert len(TRIED) == 0 or len(TRIED) >= 100
