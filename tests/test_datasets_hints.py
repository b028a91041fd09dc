"""Dataset hints from real scans of real trees, with this machine's memory read from /proc."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from dltop.hints import datasets as hints_datasets
from dltop.hints import hints
from dltop.hints.datasets import cold_dataset, dataset_churn, dataset_larger_than_memory
from dltop.model import Snapshot
from dltop.model.datasets import DatasetsPart
from dltop.residency.scan import scan_paths
from dltop.sources.memory import read_memory
from tests.test_pagecache_util import (
    PS,
    ddir_fixture,  # noqa: F401  (the `ddir` fixture)
    make_file,
    read_file,
)


def dataset(root: Path, n: int = 8, warm: int = 1) -> list[Path]:
    files = [make_file(root / f"f{i}.bin", 64 * PS) for i in range(n)]
    for f in files[:warm]:
        read_file(f)
    return files


def test_cold_dataset_says_how_resident_and_press_w(ddir: Path, monkeypatch) -> None:
    dataset(ddir, n=8, warm=1)
    part = scan_paths((str(ddir),))
    # A 2 MiB dataset is read in milliseconds: no hint at the default threshold...
    assert cold_dataset(part, read_memory()) is None
    # ...but the same shape at scale is the case the hint is for.
    monkeypatch.setattr(hints_datasets, "COLD_MIN_BYTES", 0)
    h = cold_dataset(part, read_memory())
    assert h is not None and h.id == "dataset-cold" and h.subject == f"dataset {ddir}"  # m in ? mutes it alone
    assert f"dataset {ddir} is 12% resident (256 KiB of 2.0 MiB)" in h.text and "w on the Datasets tab" in h.fix
    snap = Snapshot(ts=1.0, host="h", memory=read_memory(), datasets=part)
    assert "dataset-cold" in [x.id for x in hints([snap])]


def test_a_cold_dataset_muted_alone_gives_way_to_the_next_coldest(ddir: Path, monkeypatch) -> None:
    # `m` in ? on the coldest dataset's hint: the rule names the next one (the TUI passes the muted one over).
    dataset(ddir / "a", n=8, warm=1)
    dataset(ddir / "b", n=8, warm=2)
    monkeypatch.setattr(hints_datasets, "COLD_MIN_BYTES", 0)
    snap = Snapshot(ts=1.0, host="h", memory=read_memory(), datasets=scan_paths((str(ddir / "a"), str(ddir / "b"))))
    coldest = next(h for h in hints([snap]) if h.id == "dataset-cold")
    assert coldest.subject == f"dataset {ddir / 'a'}" and "12% resident" in coldest.text
    then = next(h for h in hints([snap], {("dataset-cold", coldest.subject)}) if h.id == "dataset-cold")
    assert then.subject == f"dataset {ddir / 'b'}" and "25% resident" in then.text
    assert next(h for h in hints([snap]) if h.id == "dataset-cold") == coldest  # the recorder's: every subject


def test_warm_dataset_gives_no_cold_hint(ddir: Path) -> None:
    dataset(ddir, n=4, warm=4)
    assert cold_dataset(scan_paths((str(ddir),)), read_memory()) is None


def test_dataset_larger_than_available_memory(ddir: Path) -> None:
    dataset(ddir, n=8, warm=0)
    part = scan_paths((str(ddir),))
    mem = read_memory()
    assert dataset_larger_than_memory(part, mem) is None  # 2 MiB fits this machine
    assert mem.total_bytes is not None
    # The same machine with only the safety margin plus 1 MiB available: 2 MiB no longer fits.
    from dltop.model.memory import safety_margin_bytes

    tight = dataclasses.replace(mem, available_bytes=safety_margin_bytes(mem.total_bytes) + (1 << 20))
    h = dataset_larger_than_memory(part, tight)
    assert h is not None and "evicts its own first part" in h.text and "validation set" in h.fix
    assert cold_dataset(part, tight) is None  # the cold hint does not tell you to warm what cannot fit


def test_churn_from_recently_evicted_pages_rising(ddir: Path) -> None:
    dataset(ddir, n=4, warm=4)
    first = scan_paths((str(ddir),))
    # Reclaim under memory pressure leaves shadow entries that cachestat counts as recently evicted; a unit
    # test cannot squeeze this machine's memory, so the second scan is the first with 64 pages reclaimed.
    ds = first.paths[0]
    later = dataclasses.replace(ds, scanned_at=ds.scanned_at + 10,
                                recently_evicted_pages=ds.recently_evicted_pages + 64)
    hist = [Snapshot(ts=1.0, host="h", datasets=first), Snapshot(ts=11.0, host="h", datasets=DatasetsPart((later,)))]
    h = dataset_churn(hist)
    assert h is not None and h.id == "dataset-churn" and "working set does not fit" in h.text
    assert dataset_churn(hist[:1]) is None
    assert dataset_churn([hist[0], hist[0]]) is None
    # POSIX_FADV_DONTNEED is not churn: invalidated pages leave no shadow entries.
    for f in ddir.iterdir():
        fd = os.open(f, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    assert scan_paths((str(ddir),)).paths[0].recently_evicted_pages == ds.recently_evicted_pages


def test_churn_where_damon_pages_out_says_so_and_not_that_the_working_set_is_too_big(ddir: Path) -> None:
    dataset(ddir, n=4, warm=4)
    first = scan_paths((str(ddir),))
    ds = first.paths[0]
    # A watched dataset on a machine whose DAMON puts idle pages out: its estimate says why (dltop/residency/watch.py).
    later = dataclasses.replace(ds, scanned_at=ds.scanned_at + 30, estimated=True, estimate_error_pages=64,
                                estimate_reason="DAMON pageout on (kdamond 0)",
                                recently_evicted_pages=ds.recently_evicted_pages + 64)
    hist = [Snapshot(ts=1.0, host="h", datasets=first), Snapshot(ts=31.0, host="h", datasets=DatasetsPart((later,)))]
    h = dataset_churn(hist)
    assert h is not None and h.id == "dataset-proactive-reclaim"
    assert f"256 KiB of {ddir} was evicted within 30s" in h.text and "DAMON pageout on (kdamond 0)" in h.text
    assert "working set" not in h.text and "dltop lock PATH" in h.fix
    assert "dataset-proactive-reclaim" in [x.id for x in hints(hist)]
