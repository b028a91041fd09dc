"""Time charts for the panes: a fixed number of seconds per column (a column covered 1 s of an empty history and
~14 s of a full one), a span from the sampling cadence, each chart's scale and the time axis as text."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Generic, Literal, TypeVar

from dltop.fmt import SPARK_CHARS

SPAN_SAMPLES = 600  # the app's history (HISTORY_LEN): a chart spans what it keeps at the refresh it samples at
SPANS_S = (60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)  # what a span is rounded to
CADENCE_INTERVALS = 20  # the newest intervals whose median is the cadence (a slow tick or a gap does not move it)
HOLD_CADENCES = 2.5  # a level is held across empty columns between readings closer than this many cadences

Point = tuple[float, float]  # (timestamp, value)
Columns = list[float | None]  # a chart's columns, oldest first; None: no reading in that column
# What a column keeps of its readings: its largest (a spike of Dirty, Writeback, a rate is never lost) or, for a
# level whose drop is the news (MemAvailable, Cached), its smallest (a 6 s dip stays in a 13 s column).
Keep = Literal["max", "min"]
T = TypeVar("T")


def cadence_s(times: Sequence[float]) -> float:
    """The sampling interval of `times` (oldest first): the median of its newest intervals; 1 s before two."""
    tail = times[-(CADENCE_INTERVALS + 1):]
    gaps = sorted(b - a for a, b in zip(tail, tail[1:], strict=False) if b > a)
    return gaps[len(gaps) // 2] if gaps else 1.0


def span_s(times: Sequence[float], samples: int = SPAN_SAMPLES) -> float:
    """What every chart spans: the history kept (`samples` at the cadence of `times`), rounded down to a round
    span (10 min at 1 s, 15 min at 2 s, 2 min at 0.25 s), so a full history fills the chart; at least a minute.
    The same for every chart of every tab, live and in a replay."""
    kept = samples * cadence_s(times) * 1.001
    return float(max((s for s in SPANS_S if s <= kept), default=SPANS_S[0]))


def span_text(seconds: float) -> str:
    """'60 s', '10 min', '1 h', '1.5 h': a span as the axis says it."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200 and seconds % 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.3g} h"


def column_text(seconds: float) -> str:
    """What one column covers: '13 s', '0.5 s', '2.1 min'."""
    if seconds < 10:
        return f"{seconds:.2g} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.2g} min"


def column_of(ts: float, per_s: float) -> int:
    """The clock-aligned column a reading at `ts` falls in, for columns `per_s` seconds wide."""
    return math.floor(ts / per_s)


def add_to(buckets: dict[int, float], ts: float, v: float, per_s: float, keep: Keep = "max") -> None:
    """Put a reading in its column: a column keeps its largest reading (no spike is lost), or its smallest with
    `keep="min"` (no dip is lost); a value that is not finite is drawn as 0."""
    v = v if math.isfinite(v) else 0.0
    c = column_of(ts, per_s)
    now = buckets.get(c)
    if now is None or (v < now if keep == "min" else v > now):
        buckets[c] = v


def bucket_columns(buckets: dict[int, float], end_ts: float, width: int, span: float, cadence: float) -> Columns:
    """The `width` columns ending with the one that holds `end_ts`, from clock-aligned columns of span/width
    seconds (a reading stays in its column as the chart moves on). A column without a reading holds the level
    before it where the readings around it are no further apart than HOLD_CADENCES cadences (a column narrower
    than the refresh); otherwise it is empty (no reading then, or before the first)."""
    if width <= 0:
        return []
    per = span / width
    first = column_of(end_ts, per) - width + 1
    cols: Columns = [buckets.get(first + i) for i in range(width)]
    filled = [i for i, v in enumerate(cols) if v is not None]
    for c0, c1 in zip(filled, filled[1:], strict=False):
        if c1 - c0 > 1 and (c1 - c0 - 1) * per <= HOLD_CADENCES * cadence:
            for c in range(c0 + 1, c1):
                cols[c] = cols[c0]
    return cols


def time_columns(points: Sequence[Point], end_ts: float, width: int, span: float, cadence: float,
                 keep: Keep = "max") -> Columns:
    """`points` (timestamp, value), oldest first, as `width` columns of span/width seconds each, the last one
    holding `end_ts` (`bucket_columns`); each column keeps its largest reading, or its smallest (`keep`)."""
    if width <= 0:
        return []
    per = span / width
    start = end_ts - span - per
    buckets: dict[int, float] = {}
    get, floor, finite = buckets.get, math.floor, math.isfinite
    low = keep == "min"
    for ts, v in points:  # add_to, inlined: 600 readings a chart, five charts a tick
        if ts >= start:
            if not finite(v):
                v = 0.0
            c = floor(ts / per)  # column_of
            now = get(c)
            if now is None or (v < now if low else v > now):
                buckets[c] = v
    return bucket_columns(buckets, end_ts, width, span, cadence)


class KeptColumns:
    """`time_columns` kept between ticks: each clock-aligned column's readings, in the order they came, and its
    largest (or smallest, `keep="min"`). A tick adds the newest reading and drops the ones that left the history,
    where `time_columns` buckets every reading again (600 a chart once the history is full). The columns are those of
    `time_columns` exactly: a column that a full scan would leave out of the chart (older than the span) is
    kept here but never read; a reading that leaves takes its column's largest with it, which the rest of the
    column's readings then give again."""

    def __init__(self, keep: Keep = "max") -> None:
        self.keep = keep
        self.per: float | None = None  # seconds a column: the chart's span / width; None: not built
        self._values: dict[int, list[float]] = {}
        self._top: dict[int, float] = {}

    def rebuild(self, points: Iterable[Point], per: float) -> None:
        """Columns `per` seconds wide, of `points` (oldest first)."""
        self.per, self._values, self._top = per, {}, {}
        self.add(points)

    def add(self, points: Iterable[Point]) -> None:
        """The newest readings, oldest first (after every reading already in)."""
        if self.per is None:
            return
        per, values, top, floor, finite = self.per, self._values, self._top, math.floor, math.isfinite
        low = self.keep == "min"
        for ts, v in points:
            if not finite(v):
                v = 0.0
            c = floor(ts / per)  # column_of
            kept = values.get(c)
            if kept is None:
                values[c] = [v]
                top[c] = v
            else:
                kept.append(v)
                if v < top[c] if low else v > top[c]:  # the first of equal values stays, as in time_columns
                    top[c] = v

    def drop(self, points: Iterable[Point]) -> None:
        """The oldest readings, oldest first: each is the first of its column's readings still in."""
        if self.per is None:
            return
        per, values, top, floor, finite = self.per, self._values, self._top, math.floor, math.isfinite
        for ts, v in points:
            if not finite(v):
                v = 0.0
            c = floor(ts / per)
            kept = values.get(c)
            if not kept or kept[0] != v:  # not the reading that came first: build again, not guess
                self.per = None
                return
            del kept[0]
            if not kept:
                del values[c], top[c]
            elif v == top[c]:
                top[c] = min(kept) if self.keep == "min" else max(kept)  # as a full scan finds it

    def columns(self, end_ts: float, width: int, span: float, cadence: float) -> Columns:
        """What `time_columns` gives for the readings in, columns span/width seconds wide (built by then)."""
        return bucket_columns(self._top, end_ts, width, span, cadence)


class KeptSeries(Generic[T]):
    """Charts of readings drawn from a history (oldest first), kept between ticks. `of(prev, item)` gives one
    item's readings, one per chart (None: none), `prev` the item before it in the history (None for the
    first). `update` works out what left the history's front and what came at its end (a live tick, a step or
    a play in a replay, a frame drawn again), by identity, and derives and buckets only those; anything else
    (a jump, a step back, another recording) is derived afresh. Columns of another width or span are
    bucketed again from the readings kept. `keep`: what each chart's columns keep ("max" for all by default)."""

    def __init__(self, charts: int, of: Callable[[T | None, T], Sequence[Point | None]],
                 keep: Sequence[Keep] = ()) -> None:
        self._of = of
        self._items: list[T] = []
        self._points: list[list[Point | None]] = [[] for _ in range(charts)]  # one per item, per chart
        self._columns = [KeptColumns(keep[i] if i < len(keep) else "max") for i in range(charts)]
        self.rebuilt = 0  # how many updates derived everything again (tests and benchmarks read it)

    def update(self, items: Sequence[T]) -> None:
        """The history now (oldest first)."""
        old = self._items
        start = self._kept_from(items)
        if start is None:
            self._rebuild(items)
            return
        new = items[len(old) - start:]
        if start:
            self._drop_front(start)
        prev = old[-1] if old else None
        for item in new:
            for points, cols, p in zip(self._points, self._columns, self._of(prev, item), strict=True):
                points.append(p)
                if p is not None:
                    cols.add((p,))
            old.append(item)
            prev = item

    def _drop_front(self, start: int) -> None:
        """The first `start` items left: their readings leave the columns; the new first has no item before it now."""
        for points, cols in zip(self._points, self._columns, strict=True):
            gone = [p for p in points[:start] if p is not None]
            del points[:start]
            cols.drop(gone)
        del self._items[:start]
        if not self._items:
            return
        for points, cols, p in zip(self._points, self._columns, self._of(None, self._items[0]), strict=True):
            if points[0] != p:
                if p is None and points[0] is not None:
                    cols.drop([points[0]])
                else:
                    cols.per = None  # a reading at the front: build again
                points[0] = p

    def _kept_from(self, items: Sequence[T]) -> int | None:
        """How many of the kept items left the front, where `items` is the rest of them and then new ones."""
        old = self._items
        if not old or not items:
            return None
        first = items[0]
        start = next((i for i, x in enumerate(old) if x is first), None)
        if start is None:
            return None
        rest = len(old) - start
        if len(items) < rest or not all(map(operator.is_, old[start:], items[:rest])):
            return None
        return start

    def _rebuild(self, items: Sequence[T]) -> None:
        self.rebuilt += 1
        self._items = list(items)
        self._points = [[] for _ in self._points]
        prev = None
        for item in self._items:
            for points, p in zip(self._points, self._of(prev, item), strict=True):
                points.append(p)
            prev = item
        for cols in self._columns:
            cols.per = None

    def points(self, chart: int) -> list[Point]:
        """A chart's readings, oldest first (what `time_columns` is given)."""
        return [p for p in self._points[chart] if p is not None]

    def columns(self, chart: int, end_ts: float, width: int, span: float, cadence: float) -> Columns:
        """`time_columns(self.points(chart), end_ts, width, span, cadence, keep)`, from the columns kept."""
        if width <= 0:
            return []
        cols = self._columns[chart]
        per = span / width
        if cols.per != per:
            cols.rebuild(self.points(chart), per)
        return cols.columns(end_ts, width, span, cadence)


def shown(cols: Columns) -> list[float]:
    """The columns that have a value."""
    return [v for v in cols if v is not None]


def draw(cols: Columns, height: int, top: float, bottom: float = 0.0) -> list[str]:
    """Columns as `height` rows of bars (top row first), scaled from `bottom` to `top`; an empty column is
    blank, a column with a value shows at least the lowest bar (a level at the bottom is still a reading)."""
    span = top - bottom
    levels = 8 * max(1, height)

    def level(v: float) -> int:
        return max(1, min(levels, round((v - bottom) / span * levels))) if span > 0 else 1

    filled = [0 if v is None else level(v) for v in cols]
    rows = []
    for r in range(max(1, height)):
        base = (max(1, height) - 1 - r) * 8  # eighths below this row
        chars = []
        for f in filled:
            part = f - base
            chars.append(" " if part <= 0 else "█" if part >= 8 else SPARK_CHARS[part - 1])
        rows.append("".join(chars))
    return rows


def scale_of(cols: Columns, min_span: float | None = 0.0, top: float | None = None,
             now: float | None = None) -> tuple[float, float]:
    """A chart's (bottom, top): from 0 to the largest value shown (or `top`); `min_span` None: from the lowest
    value shown to the highest (a loss that moves in a band); a number > 0: the band shown but at least that
    tall, hanging down from the highest and never below 0 (MemAvailable near MemTotal). `now`, the value printed
    beside the chart, is always inside the range (a column keeps one reading of several: the latest may be
    another)."""
    values = shown(cols)
    if now is not None and math.isfinite(now) and values:
        values.append(now)
    high = max(values, default=0.0) if top is None else top
    if min_span is None:
        return min(values, default=0.0), high
    if min_span > 0 and values:
        return max(0.0, min(min(values), high - min_span)), high
    return min(0.0, min(values, default=0.0)), high


def scale_text(bottom: float, top: float, fmt: Callable[[float], str]) -> str:
    """'max 45.0 MiB' for a chart from 0, '2.31–2.45' for one that starts elsewhere."""
    if bottom == 0:
        return f"max {fmt(top)}"
    return f"{fmt(bottom)}–{fmt(top)}"


def axis(width: int, span: float) -> str:
    """The time axis under charts `width` columns wide: '-10 min ──── now' (shorter where it must be)."""
    left, right = f"-{span_text(span)} ", " now"
    if width < len(left) + len(right) + 1:
        return f"-{span_text(span)}"[:width].rjust(width)
    return left + "─" * (width - len(left) - len(right)) + right
