"""Reclaim that /proc/vmstat does not count (DAMON's pageout): a watched dataset's carried counts are estimates.

On Linux 6.18 a DAMON scheme with the `pageout` action (these VMs run one) evicts page cache through
reclaim_pages(), and pgsteal_file does not move: a watch that trusted it said "exact, bound 0" while 1-3% of the
tree's pages were gone. The fake sysfs trees here are DAMON's real layout (kdamonds/N/state,
contexts/N/operations, contexts/N/schemes/N/action; /sys/module/damon_reclaim/parameters/enabled).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dltop.model.base import from_dict, to_dict
from dltop.model.datasets import DatasetResidency
from dltop.residency import reclaim, watch
from dltop.residency.folders import VALUES
from dltop.residency.reclaim import silent_reclaimer
from dltop.residency.watch import DatasetWatch
from dltop.text.datasets import estimate_note
from tests.test_datasets_watch import OPTIONS, fincore_total, tree
from tests.test_pagecache_util import (
    PS,
    ddir_fixture,  # noqa: F401  (the `ddir` fixture)
    needs_fincore,
    read_file,
)


def damon(root: Path, state: str = "on", actions: tuple[str, ...] = ("pageout",), ops: str = "paddr") -> Path:
    """A kdamonds tree as DAMON's sysfs interface lays it out: one kdamond, one context, a scheme per action."""
    kd = root / "kdamonds" / "0"
    ctx = kd / "contexts" / "0"
    (ctx / "schemes").mkdir(parents=True)
    (kd / "state").write_text(state + "\n")
    (kd / "pid").write_text("79\n")
    (ctx / "operations").write_text(ops + "\n")
    for i, action in enumerate(actions):
        (ctx / "schemes" / str(i)).mkdir()
        (ctx / "schemes" / str(i) / "action").write_text(action + "\n")
    return root / "kdamonds"


def test_a_running_pageout_scheme_or_damon_reclaim_is_named(tmp_path: Path) -> None:
    nothing = str(tmp_path / "none")
    assert silent_reclaimer(nothing, nothing) is None  # no DAMON in this kernel
    on = damon(tmp_path / "on")
    assert silent_reclaimer(str(on), nothing) == "DAMON pageout on (kdamond 0)"
    assert silent_reclaimer(str(damon(tmp_path / "off", state="off")), nothing) is None
    # Actions that move pages between LRU lists or hint the kernel evict nothing themselves.
    assert silent_reclaimer(str(damon(tmp_path / "prio", actions=("lru_prio", "stat", "cold"))), nothing) is None
    assert silent_reclaimer(str(damon(tmp_path / "two", actions=("stat", "pageout"))), nothing) is not None
    # A per-process (vaddr) pageout evicts the file pages those processes map: named too.
    assert silent_reclaimer(str(damon(tmp_path / "vaddr", ops="vaddr")), nothing) is not None
    module = tmp_path / "enabled"
    module.write_text("Y\n")
    assert silent_reclaimer(nothing, str(module)) == "DAMON_RECLAIM is on"
    module.write_text("N\n")
    assert silent_reclaimer(nothing, str(module)) is None


def test_odd_sysfs_trees_say_nothing_and_raise_nothing(tmp_path: Path) -> None:
    root = tmp_path / "kdamonds"
    (root / "not-a-number").mkdir(parents=True)
    (root / "0").mkdir()
    (root / "0" / "state").mkdir()  # a folder where a file is: unreadable, not "on"
    (root / "1").mkdir()
    (root / "1" / "state").write_bytes(b"\xff\xfeon" + b"x" * 10_000)
    (root / "2").mkdir()
    (root / "2" / "state").write_text("on\n")  # no contexts
    (root / "3").mkdir()
    (root / "3" / "state").write_text("on\n")
    (root / "4").mkdir()
    os.mkfifo(root / "4" / "state")  # nobody writes it: a read would wait forever
    (root / "3" / "contexts" / "0" / "schemes" / "0").mkdir(parents=True)  # a scheme without its action file
    assert silent_reclaimer(str(root), str(tmp_path / "none")) is None


@pytest.fixture
def silent_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """DAMON's pageout configured in a fake sysfs the watch reads (the tests' default turns detection off)."""
    monkeypatch.setenv("DLTOP_SILENT_RECLAIM", "auto")
    monkeypatch.setattr(reclaim, "DAMON_ADMIN", str(damon(tmp_path / "sysfs")))
    monkeypatch.setattr(reclaim, "DAMON_RECLAIM", str(tmp_path / "none"))
    monkeypatch.setattr(reclaim, "SILENT_RECHECK_S", 0.0)
    return tmp_path / "sysfs" / "kdamonds"


@needs_fincore
def test_while_damon_pages_out_every_count_not_measured_in_the_read_is_an_estimate(
        ddir: Path, silent_on: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = tree(ddir, folders=3)
    for f in files:
        read_file(f)
    counters = {"pgsteal_file": 1000, "drop_pagecache": 0}
    monkeypatch.setattr(reclaim, "read_vmstat", lambda: dict(counters))  # pgsteal_file stands still, as under DAMON
    monkeypatch.setattr(watch, "MIN_ROLL_FILES", 6)  # a folder of 5 files (and itself) a read
    monkeypatch.setattr(watch, "ROLL_CPU_SHARE", 0.0)
    w = DatasetWatch(str(ddir), OPTIONS)
    try:
        ds, _ = w.read()  # the first read measures everything: exact
        assert (ds.resident_pages, ds.estimated, ds.estimate_error_pages, ds.estimate_reason) == (45, False, 0, None)
        bounds = []
        for _ in range(3):
            ds, _ = w.read()  # one folder measured again a read: the others' 15 pages each may be gone
            assert ds.estimated and ds.estimate_reason == "DAMON pageout on (kdamond 0)"
            bounds.append(ds.estimate_error_pages)
        assert all(30 <= b <= 45 for b in bounds) and 30 in bounds
        assert ds.resident_pages == fincore_total(ddir) == 45  # nothing was evicted in truth
        # DAMON stopped: once every folder is measured again, the counts are exact again.
        (silent_on / "0" / "state").write_text("off\n")
        for _ in range(4):
            ds, _ = w.read()
        assert (ds.estimated, ds.estimate_error_pages, ds.estimate_reason) == (False, 0, None)
    finally:
        w.close()


@needs_fincore
def test_recently_evicted_pages_growing_with_pgsteal_still_are_learnt_and_kept(
        ddir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DLTOP_SILENT_RECLAIM", "auto")
    monkeypatch.setattr(reclaim, "DAMON_ADMIN", str(tmp_path / "none"))  # nothing configured that says so
    monkeypatch.setattr(reclaim, "DAMON_RECLAIM", str(tmp_path / "none"))
    counters = {"pgsteal_file": 1000, "drop_pagecache": 0}
    monkeypatch.setattr(reclaim, "read_vmstat", lambda: dict(counters))
    monkeypatch.setattr(watch, "MIN_ROLL_FILES", 6)
    monkeypatch.setattr(watch, "ROLL_CPU_SHARE", 0.0)
    for f in tree(ddir, folders=2):
        read_file(f)
    w = DatasetWatch(str(ddir), OPTIONS)
    try:
        w.read()
        f = next(g for g in w.folders.order if g.keys)
        base = 0 * VALUES
        res, rev = f.vals[base + 3], f.vals[base + 6]
        # The kernel counted this reclaim: a file's evicted pages grow with pgsteal_file, nothing learnt.
        counters["pgsteal_file"] += 3
        w.read()
        f = next(g for g in w.folders.order if g.keys)
        w.steal = f.mark + 3
        w.folders.recounted_as(f, 0, res, 0, 0, rev + 3)
        assert w.silent_reason is None
        # pgsteal_file where it was when the folder was measured, but moved by the time of the measure that saw
        # the pages gone: kswapd's reclaim in the read's window, counted just after; nothing learnt.
        w.steal, w.steal_raw = f.mark, counters["pgsteal_file"]
        counters["pgsteal_file"] += 1
        w.folders.recounted_as(f, 0, res, 0, 0, rev + 4)
        assert w.silent_reason is None
        counters["pgsteal_file"] -= 1
        # Where it was then and still is: reclaim it did not count.
        w.folders.recounted_as(f, 0, res, 0, 0, rev + 6)
        assert w.silent_reason == "reclaim unseen by pgsteal_file"
        for _ in range(3):  # from now on each read's carried counts are estimates, with the reason said
            ds, _ = w.read()
            assert ds.estimated and ds.estimate_reason == "reclaim unseen by pgsteal_file"
            assert 15 <= ds.estimate_error_pages <= 30
        assert w.silent_reason == "reclaim unseen by pgsteal_file"  # kept: the machine showed what it does
    finally:
        w.close()


def test_off_in_the_environment_turns_both_off(ddir: Path, silent_on: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLTOP_SILENT_RECLAIM", "off")
    tree(ddir, folders=2)
    w = DatasetWatch(str(ddir), OPTIONS)
    try:
        for _ in range(3):
            ds, _ = w.read()
            assert not ds.estimated and w.silent_reason is None
        f = next(g for g in w.folders.order if g.keys)
        w.steal = f.mark
        w.folders.recounted_as(f, 0, 0, 0, 0, f.vals[6] + 1)
        assert w.silent_reason is None
    finally:
        w.close()


def test_the_reason_is_in_the_note_and_survives_a_recording() -> None:
    est = DatasetResidency(path="/x", pages=100, resident_pages=50, data_pages=100, data_resident_pages=50,
                           estimated=True, estimate_error_pages=2, full_scan_at=1000.0,
                           estimate_reason="DAMON pageout on (kdamond 0)")
    note = estimate_note(est, PS, 1090.0)
    assert note is not None and note.endswith("(oldest count 1m old; DAMON pageout on (kdamond 0))")
    assert from_dict(DatasetResidency, to_dict(est)) == est
    # A recording from another machine is hostile: its reason reaches the screen escaped.
    hostile = DatasetResidency(path="/x", estimated=True, estimate_error_pages=1, full_scan_at=1000.0,
                               estimate_reason="\x1b[2Jgone\n")
    shown = estimate_note(hostile, PS, 1090.0)
    assert shown is not None and "\x1b" not in shown and "\n" not in shown
