"""The action runner on real files: its plan, its events from start to finish, a cancel, what it holds; and the
Sampler's sources that change at run time."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from dltop.actions import pagecache as pc
from dltop.actions.runner import ActionRunner
from dltop.config import Settings
from dltop.errors import DltopError
from dltop.model.actions import ActionEvent, ActionPlan
from dltop.model.datasets import DatasetsPart
from dltop.model.memory import safety_margin_bytes
from dltop.sampler import Sampler
from dltop.sources.base import Source
from dltop.sources.registry import build_sources
from tests.test_pagecache_util import (
    PS,
    SHADOW_SLACK,
    ddir_fixture,  # noqa: F401  (the `ddir` fixture)
    evict_file,
    make_file,
    read_file,
    reclaimed_pages,
    resident,
)


def _record(runner: ActionRunner) -> list[ActionEvent]:
    events: list[ActionEvent] = []
    runner.subscribe(events.append)
    return events


def test_plan_states_the_bytes_and_the_guard(ddir: Path) -> None:
    files = [make_file(ddir / f"f{i}.bin", 64 * PS) for i in range(3)]
    for f in files:
        evict_file(f)
    read_file(files[0])
    runner = ActionRunner()
    events = _record(runner)
    run = runner.plan("warm", [str(ddir)], wait=True)
    plan = run.result
    assert isinstance(plan, ActionPlan) and plan.allowed and plan.files == 3
    assert plan.bytes == 2 * 64 * PS  # the two files not resident: what a warm reads
    assert plan.guard.startswith("ok")
    assert [(e.step, e.phase) for e in events] == [("plan", "started"), ("plan", "finished")]
    assert events[-1].outcome == "ok" and events[-1].total_bytes == plan.bytes
    assert sum(resident(f) for f in files) == 64  # a plan changes nothing


def test_a_run_announces_start_progress_and_a_finish_that_matches_the_kernel(ddir: Path) -> None:
    files = [make_file(ddir / f"f{i}.bin", 256 * PS) for i in range(8)]
    for f in files:
        evict_file(f)
    runner = ActionRunner()
    events = _record(runner)
    run = runner.start("warm", [str(ddir)], wait=True)
    assert run.error is None and not run.result.cancelled
    phases = [e.phase for e in events]
    assert phases[0] == "started" and phases[-1] == "finished" and "progress" in phases
    assert {e.run_id for e in events} == {run.id} and all(e.step == "run" for e in events)
    last = events[-1]
    assert last.outcome == "ok" and last.message.startswith("warmed 8.0 MiB of ")
    # What the event says is what the kernel has, less what reclaim took since (DAMON's proactive pageout on
    # these VMs leaves shadow entries; the evict above left none, and the warm read every page again).
    taken = reclaimed_pages(files)
    assert 8 * 256 - taken - SHADOW_SLACK <= sum(resident(f) for f in files) <= 8 * 256
    assert last.done_bytes == 8 * 256 * PS and runner.busy is None


def test_one_action_at_a_time_and_a_cancel_stops_it(ddir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = [make_file(ddir / f"f{i}.bin", 256 * PS) for i in range(40)]
    for f in files:
        evict_file(f)
    monkeypatch.setattr(pc, "WARM_INFLIGHT_BYTES", 256 * PS)
    going = threading.Event()
    real = pc.Ticker.add

    def slow_add(self, n: int, path: str = "", force: bool = False) -> None:
        real(self, n, path, force)
        going.set()
        time.sleep(0.02)

    monkeypatch.setattr(pc.Ticker, "add", slow_add)
    runner = ActionRunner()
    events = _record(runner)
    run = runner.start("warm", [str(ddir)])
    assert going.wait(10)
    with pytest.raises(DltopError, match="still running"):
        runner.start("evict", [str(ddir)])
    assert runner.cancel()
    assert run.done.wait(10)
    assert run.result.cancelled and events[-1].outcome == "cancelled"
    assert sum(resident(f) for f in files) < 40 * 256
    assert not runner.cancel()  # nothing runs any more


def test_lock_is_held_until_released_and_released_on_close(ddir: Path) -> None:
    f = make_file(ddir / "l.bin", 32 * PS)
    evict_file(f)
    runner = ActionRunner()
    events = _record(runner)
    runner.start("lock", [str(f)], wait=True)
    assert runner.held() == {str(f): 32 * PS} and resident(f) == 32
    again = runner.start("lock", [str(f)], wait=True)
    assert isinstance(again.error, DltopError) and "locked already" in str(again.error)
    assert runner.release(str(f)) == 32 * PS and runner.held() == {}
    assert events[-1].step == "release" and events[-1].message.startswith("unlocked 128 KiB")
    evict_file(f)
    assert resident(f) == 0  # unlocked pages can go
    runner.start("lock", [str(f)], wait=True)
    runner.close()
    assert runner.held() == {}


def test_a_refused_action_finishes_as_refused(ddir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = make_file(ddir / "big.bin", 64 * PS)
    evict_file(f)
    margin = safety_margin_bytes(64 << 30)
    monkeypatch.setattr(pc, "read_meminfo", lambda *a: {"MemTotal": 64 << 30, "MemAvailable": margin + PS})
    runner = ActionRunner()
    events = _record(runner)
    plan = runner.plan("lock", [str(f)], wait=True).result
    assert not plan.allowed and plan.guard.startswith("refused")
    run = runner.start("lock", [str(f)], wait=True)
    assert isinstance(run.error, DltopError) and events[-1].outcome == "refused"
    assert runner.held() == {} and resident(f) == 0


# -- the Sampler's sources at run time ---------------------------------------------------------------------


async def test_sources_added_removed_and_reconfigured_while_running(ddir: Path) -> None:
    one, two = ddir / "one", ddir / "two"
    make_file(one / "a.bin", 8 * PS)
    make_file(two / "b.bin", 16 * PS)
    settings = Settings(datasets=(str(one),), discover=False)  # without discovery: no dataset, no source
    sampler = Sampler(build_sources(settings), builder=build_sources)
    sampler.start()
    try:
        await _until(lambda: _paths(sampler) == [str(one)])
        memory_before = sampler.snapshot().sources["memory"]
        sampler.reconfigure(Settings(datasets=(str(one), str(two)), discover=False))
        # The old value stays until the new scan is in: the part never blanks.
        assert _paths(sampler) == [str(one)]
        await _until(lambda: _paths(sampler) == [str(one), str(two)])
        assert sampler.snapshot().sources["memory"].interval_s == memory_before.interval_s
        sampler.reconfigure(Settings(discover=False))
        await _until(lambda: sampler.snapshot().datasets is None)
        assert "datasets" not in sampler.names() and "memory" in sampler.names()
        sampler.add(Source("extra", 60.0, lambda: None))
        assert "extra" in sampler.names()
        sampler.remove("extra")
        assert "extra" not in sampler.names()
    finally:
        sampler.close()


async def test_read_now_rereads_at_once_and_hands_out_the_result(ddir: Path) -> None:
    reads: list[float] = []

    def read() -> None:
        reads.append(time.monotonic())

    sampler = Sampler([Source("cpu", 3600.0, read)])  # a cadence that would not come round in this test
    got: list[float] = []

    async def consume() -> None:
        async for _snap in sampler.stream(lambda: 3600.0):
            got.append(time.monotonic())

    task = asyncio.create_task(consume())
    try:
        await _until(lambda: len(reads) == 1)
        t0 = time.monotonic()
        sampler.read_now("cpu")
        await _until(lambda: len(reads) == 2 and bool(got))
        assert got[-1] - t0 < 1.0  # handed out as soon as it was in, not at the next tick an hour away
    finally:
        task.cancel()
        sampler.close()


def _paths(sampler: Sampler) -> list[str]:
    part = sampler.snapshot().datasets
    return [d.path for d in part.paths] if isinstance(part, DatasetsPart) else []


async def _until(cond, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


def test_a_warm_plan_names_the_other_watched_datasets_it_would_push_out(ddir: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    f = make_file(ddir / "ds" / "a.bin", 256 * PS)
    evict_file(f)
    # Plenty available, little of it free: reading 1 MiB makes the kernel reclaim other page cache.
    monkeypatch.setattr(pc, "read_meminfo", lambda *a: {"MemTotal": 64 << 30, "MemAvailable": 32 << 30,
                                                        "MemFree": 64 * PS})
    runner = ActionRunner()
    others = {str(ddir / "ds"): 0, "/data/coco": 3 << 30}
    plan = runner.plan("warm", [str(ddir / "ds")], wait=True, others=others).result
    assert plan.allowed and "/data/coco (3.0 GiB)" in plan.guard
    assert str(ddir / "ds") + " (" not in plan.guard  # the warmed dataset is not its own victim


def test_a_listener_that_raises_never_wedges_the_runner(ddir: Path) -> None:
    f = make_file(ddir / "a.bin", 8 * PS)
    runner = ActionRunner()

    def broken(ev: ActionEvent) -> None:
        raise OSError(28, "No space left on device")  # the recorder on a full disk

    runner.subscribe(broken)
    run = runner.start("evict", [str(f)])
    assert run.done.wait(10) and run.error is None and runner.busy is None
    assert runner.listener_errors and "No space left" in runner.listener_errors[0]
    assert runner.plan("warm", [str(f)], wait=True).result.allowed  # the next action is not refused


async def test_read_now_with_a_key_rereads_only_that_part() -> None:
    full: list[int] = []
    some: list[frozenset[str]] = []
    sampler = Sampler([Source("cpu", 3600.0, lambda: full.append(1), read_some=some.append)])
    sampler.start()
    try:
        await _until(lambda: len(full) == 1)
        sampler.read_now("cpu", "a")
        sampler.read_now("cpu", "b")
        await _until(lambda: len(some) == 1)
        assert some == [frozenset({"a", "b"})] and len(full) == 1
        sampler.read_now("cpu", "a")
        sampler.read_now("cpu")  # a full read asked for as well: it wins
        await _until(lambda: len(full) == 2)
        assert len(some) == 1
    finally:
        sampler.close()


def test_the_datasets_reader_rescans_only_what_it_is_asked_and_carries_over(ddir: Path) -> None:
    from dltop.sources import datasets as dsrc

    one, two, three = ddir / "one", ddir / "two", ddir / "three"
    for d in (one, two, three):
        make_file(d / "f.bin", 8 * PS)
    first = dsrc.source(Settings(datasets=(str(one), str(two))))
    part = first.read()
    stamps = {d.path: d.scanned_at for d in part.paths}
    again = first.read_some(frozenset({str(one)}))
    assert [d.path for d in again.paths] == [str(one), str(two)]
    assert again.paths[0].scanned_at > stamps[str(one)] and again.paths[1].scanned_at == stamps[str(two)]
    # A dataset added at run time: the new reader takes over the others' watches (their next reads measure only
    # what was opened) and walks only the new one whole.
    old = dict(first.read.__self__._watches)  # type: ignore[attr-defined]
    second = dsrc.source(Settings(datasets=(str(one), str(two), str(three))))
    second.carry_from(first)
    part = second.read()
    assert [d.path for d in part.paths] == [str(one), str(two), str(three)]
    watches = second.read.__self__._watches  # type: ignore[attr-defined]
    assert set(old) == {str(one), str(two)} and all(watches[p] is w for p, w in old.items())
    assert part.paths[1].scanned_at == stamps[str(two)] and part.paths[2].full_scan_at > stamps[str(two)]
    assert second.read().paths[1].scanned_at > stamps[str(two)]  # and the next read is a watch cycle of each
    assert first.close is not None and second.close is not None
    first.close()
    assert all(not w.events.closed.is_set() for w in watches.values())  # the old source's close left them running
    second.close()


def test_relative_dataset_paths_are_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from dltop.config import settings_from_args

    (tmp_path / "data").mkdir()
    monkeypatch.chdir(tmp_path)
    s = settings_from_args(argparse.Namespace(paths=["data"], config=None))
    assert s.datasets == (str(tmp_path / "data"),)  # as the scans name them: the TUI's rows match by path
