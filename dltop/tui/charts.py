"""Time charts for the panes: a fixed number of seconds per column (a column covered 1 s of an empty history and
~14 s of a full one), a span from the sampling cadence, each chart's scale and the time axis as text."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from dltop.fmt import SPARK_CHARS

SPAN_SAMPLES = 600  # the app's history (HISTORY_LEN): a chart spans what it keeps at the refresh it samples at
SPANS_S = (60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)  # what a span is rounded to
CADENCE_INTERVALS = 20  # the newest intervals whose median is the cadence (a slow tick or a gap does not move it)
HOLD_CADENCES = 2.5  # a level is held across empty columns between readings closer than this many cadences

Point = tuple[float, float]  # (timestamp, value)
Columns = list[float | None]  # a chart's columns, oldest first; None: no reading in that column


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


def add_to(buckets: dict[int, float], ts: float, v: float, per_s: float) -> None:
    """Put a reading in its column: a column keeps its largest reading (no spike is lost); a value that is not
    finite is drawn as 0."""
    v = v if math.isfinite(v) else 0.0
    c = column_of(ts, per_s)
    now = buckets.get(c)
    if now is None or v > now:
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


def time_columns(points: Sequence[Point], end_ts: float, width: int, span: float, cadence: float) -> Columns:
    """`points` (timestamp, value), oldest first, as `width` columns of span/width seconds each, the last one
    holding `end_ts` (`bucket_columns`)."""
    if width <= 0:
        return []
    per = span / width
    start = end_ts - span - per
    buckets: dict[int, float] = {}
    get, floor, finite = buckets.get, math.floor, math.isfinite
    for ts, v in points:  # add_to, inlined: 600 readings a chart, five charts a tick
        if ts >= start:
            if not finite(v):
                v = 0.0
            c = floor(ts / per)  # column_of
            now = get(c)
            if now is None or v > now:
                buckets[c] = v
    return bucket_columns(buckets, end_ts, width, span, cadence)


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


def scale_of(cols: Columns, min_span: float | None = 0.0, top: float | None = None) -> tuple[float, float]:
    """A chart's (bottom, top): from 0 to the largest value shown (or `top`); `min_span` None: from the lowest
    value shown to the highest (a loss that moves in a band); a number > 0: the band shown but at least that
    tall, hanging down from the highest and never below 0 (MemAvailable near MemTotal)."""
    values = shown(cols)
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
