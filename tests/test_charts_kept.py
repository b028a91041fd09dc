"""The charts' columns kept between ticks (`charts.KeptSeries`): after any run of ticks, trims, jumps, gaps, steps
back and width or span changes they are what `time_columns` gives for the whole history again, and the Page cache
pane that keeps them draws what a pane drawn afresh draws."""

from __future__ import annotations

import dataclasses
import math
from collections import deque

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from textual.widgets import Static

from dltop import session as session_module
from dltop.config import Settings
from dltop.model import MemoryPart, Snapshot
from dltop.sampler import ListFeed
from dltop.tui import charts
from dltop.tui.app import DltopApp
from dltop.tui.panes.pagecache import (
    SPARK_FIELDS,
    SPARK_KEEP,
    PageCachePane,
    readings,
    refault_rate,
)


@dataclasses.dataclass(eq=False)  # compared by identity, as the history's Snapshots are
class Item:
    ts: float
    a: float | None  # a level (None: not read)
    b: float  # a counter: the second chart is its rate since the item before


def _of(prev: Item | None, cur: Item) -> tuple[charts.Point | None, charts.Point | None]:
    level = (cur.ts, cur.a) if cur.a is not None else None
    rate = (cur.ts, (cur.b - prev.b) / (cur.ts - prev.ts)) if prev is not None and cur.ts != prev.ts else None
    return level, rate


def _full(items: list[Item]) -> list[list[charts.Point]]:
    """Each chart's readings, derived from the whole history (what the pane did every tick before)."""
    levels = [(i.ts, i.a) for i in items if i.a is not None]
    rates = [(c.ts, (c.b - p.b) / (c.ts - p.ts)) for p, c in zip(items, items[1:], strict=False) if c.ts != p.ts]
    return [levels, rates]


VALUES = st.sampled_from([0.0, -0.0, 1.0, 2.0, 2.0, 5.0, -3.0, 1e9, math.nan, math.inf, None])
STEPS = st.sampled_from([1.0, 1.0, 1.0, 0.5, 0.25, 2.0, 3.0, 40.0, 0.0, -1.0])  # a gap, a repeat, a clock back
OPS = st.lists(st.one_of(
    st.tuples(st.just("tick"), st.integers(1, 3)),
    st.tuples(st.just("again"), st.just(0)),  # the same frame drawn again (paused)
    st.tuples(st.just("back"), st.integers(1, 3)),  # the window ends earlier (step back)
    st.tuples(st.just("jump"), st.integers(0, 10_000)),  # another window of the recording
    st.tuples(st.just("fork"), st.integers(1, 3)),  # the newest readings replaced by others (same times)
    st.tuples(st.just("width"), st.integers(1, 60)),
    st.tuples(st.just("span"), st.sampled_from([30.0, 60.0, 120.0])),
), min_size=1, max_size=60)
TRIED: list[int] = []
KEEP: tuple[charts.Keep, charts.Keep] = ("min", "max")


@settings(max_examples=200, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(STEPS, VALUES, st.integers(0, 5)), min_size=80, max_size=80), OPS,
       st.integers(3, 40), st.integers(1, 60))
def _kept_equals_a_full_computation(raw: list[tuple[float, float | None, int]], ops: list[tuple[str, float]],
                                    keep: int, width: int) -> None:
    TRIED.append(1)
    universe, ts, counter = [], 1000.0, 0.0
    for step, value, inc in raw:
        ts += step
        counter += inc
        universe.append(Item(ts, value, counter))
    kept: charts.KeptSeries[Item] = charts.KeptSeries(2, _of, KEEP)  # a level's dips, a rate's bursts
    history: deque[Item] = deque(universe[:5], maxlen=keep)
    end, span, cadence = 5, 60.0, 1.0
    for op, arg in ops:
        if op == "tick":  # live: the newest readings come, the history drops its oldest once full
            for item in universe[end:end + int(arg)]:
                history.append(item)
            end = min(len(universe), end + int(arg))
            window = list(history)
        elif op == "again":
            window = list(history)
        elif op == "back":
            window = list(history)[:max(1, len(history) - int(arg))]
        elif op == "jump":
            stop = 1 + int(arg) % len(universe)
            window = universe[max(0, stop - keep):stop]
            history = deque(window, maxlen=keep)
            end = stop
        elif op == "fork":
            window = list(history)
            n = min(int(arg), len(window) - 1)
            window[len(window) - n:] = [Item(i.ts, None if i.a is None else i.a + 1, i.b + 1)
                                        for i in window[len(window) - n:]]
            history = deque(window, maxlen=keep)
        elif op == "width":
            width = int(arg)
            window = list(history)
        else:
            span = float(arg)
            window = list(history)
        kept.update(window)
        cadence = charts.cadence_s([i.ts for i in window])
        full = _full(window)
        for chart in (0, 1):
            assert kept.points(chart) == full[chart], (op, chart)
            want = charts.time_columns(full[chart], window[-1].ts, width, span, cadence, KEEP[chart])
            got = kept.columns(chart, window[-1].ts, width, span, cadence)
            assert got == want, (op, chart, width, span)


def test_kept_columns_equal_a_full_computation() -> None:
    TRIED.clear()
    _kept_equals_a_full_computation()
    assert len(TRIED) >= 200, len(TRIED)


def test_a_tick_derives_only_what_came() -> None:
    # A live tick with the history full derives one item (and the first item again), not the history.
    calls: list[int] = []

    def of(prev: Item | None, cur: Item) -> tuple[charts.Point | None, charts.Point | None]:
        calls.append(1)
        return _of(prev, cur)

    universe = [Item(1000.0 + i, float(i % 7), float(i)) for i in range(700)]
    kept: charts.KeptSeries[Item] = charts.KeptSeries(2, of)
    history: deque[Item] = deque(universe[:600], maxlen=600)
    kept.update(list(history))
    assert kept.rebuilt == 1 and len(calls) == 600
    for item in universe[600:]:
        history.append(item)
        calls.clear()
        kept.update(tuple(history))
        assert len(calls) == 2  # the new item, and the new first one (no item before it now)
        kept.columns(0, item.ts, 45, 600.0, 1.0)
    assert kept.rebuilt == 1
    assert kept.columns(1, universe[-1].ts, 45, 600.0, 1.0) == charts.time_columns(
        _full(list(history))[1], universe[-1].ts, 45, 600.0, 1.0)


def series_of(history: list[Snapshot], names: list[str]) -> list[list[charts.Point]]:
    """Each meminfo field of `names` over the whole history, with each reading's time (missing readings left out)."""
    return [[(s.ts, float(v)) for s in history if isinstance(s.memory, MemoryPart)
             and (v := getattr(s.memory, name)) is not None] for name in names]


def test_the_pane_readings_are_the_series_of_the_history(session: list[Snapshot]) -> None:
    # `readings`, one Snapshot at a time, gives each chart what the whole-history functions give.
    kept: charts.KeptSeries[Snapshot] = charts.KeptSeries(len(SPARK_FIELDS) + 1, readings, SPARK_KEEP)
    kept.update(session)
    for i, data in enumerate(series_of(session, [f[0] for f in SPARK_FIELDS])):
        assert kept.points(i) == data
    refaults = [(c.ts, r) for p, c in zip(session, session[1:], strict=False) if (r := refault_rate(p, c)) is not None]
    assert refaults and kept.points(len(SPARK_FIELDS)) == refaults


def _sparks(app: DltopApp) -> str:
    return str(app.query_one("#pc-sparks", Static).render())


async def test_the_pane_after_ticks_trims_gaps_and_steps_is_the_pane_drawn_afresh(
        session: list[Snapshot], monkeypatch: pytest.MonkeyPatch) -> None:
    # A short history (it trims its oldest every tick), ticks with a gap and a reading without meminfo, a step
    # back and forth while paused, a narrower then wider terminal: after each, the charts equal those of a pane
    # whose kept columns are thrown away (drawn from the whole history).
    monkeypatch.setattr(session_module, "HISTORY_LEN", 12)
    snaps = [dataclasses.replace(s, ts=50_000.0 + i) for i, s in enumerate(session)]
    snaps[20] = dataclasses.replace(snaps[20], ts=snaps[19].ts + 0.5)
    for i in range(21, len(snaps)):  # a gap of 30 s after the 21st reading
        snaps[i] = dataclasses.replace(snaps[i], ts=snaps[i].ts + 30)
    snaps[24] = dataclasses.replace(snaps[24], memory=None)
    assert isinstance(snaps[26].memory, MemoryPart) and len(snaps) >= 33
    app = DltopApp(ListFeed(snaps[:5], start=4), Settings(tab="pagecache"))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        pane = app.query_one(PageCachePane)

        async def check(what: str, settle: bool = False) -> None:
            await pilot.pause()
            if settle:  # a resize: the pane drew at its own resize, the sparks' height may have moved after
                app.show()
                await pilot.pause()
            ticked = _sparks(app)
            pane._kept = charts.KeptSeries(len(SPARK_FIELDS) + 1, readings, SPARK_KEEP)
            app.show()
            await pilot.pause()
            assert _sparks(app) == ticked, what

        for snap in snaps[5:28]:
            app.apply(snap)
            await check(f"tick {snap.ts}")
        await pilot.press("space")  # pause: the window stays while the history goes on
        app.apply(snaps[28])
        await check("paused")
        for key in ("T", "T", "t"):
            await pilot.press(key)
            await check(f"step {key}")
        await pilot.press("space")
        await check("live")
        sizes = [(100, 24), (120, 30), (80, 24)]
        for size in sizes:
            await pilot.resize_terminal(*size)
            await check(f"size {size}", settle=True)
            app.apply(snaps[29 + sizes.index(size)])
            await check(f"tick at {size}")
        rebuilt = pane._kept.rebuilt
        app.apply(snaps[32])
        await pilot.pause()
        assert pane._kept.rebuilt == rebuilt  # a live tick is not derived afresh
