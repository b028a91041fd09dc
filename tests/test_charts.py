"""The panes' time charts: a fixed number of seconds per column whatever the history holds, the span on the axis,
each chart's scale (its max, or its range where it does not start at 0), on the Page cache, GPU and Training tabs
at 80x24, and the columns against a full scan (Hypothesis)."""

from __future__ import annotations

import dataclasses
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from textual.widgets import Static

from dltop.config import Settings
from dltop.fmt import human_bytes, human_range
from dltop.model import MemoryPart, Snapshot
from dltop.sampler import ListFeed
from dltop.tui import charts
from dltop.tui.app import DltopApp
from dltop.tui.panes.pagecache import SPARK_LABEL_WIDTH, SPARK_SCALE_WIDTH
from tests.conftest import load_session

BARS = "▁▂▃▄▅▆▇█"
KIB, MIB = 1 << 10, 1 << 20


def _memory_history(n: int, **fields: list[int]) -> list[Snapshot]:
    """`n` Snapshots one second apart from the recorded session's real readings, the meminfo `fields` set."""
    base = load_session()
    out = []
    for i in range(n):
        s = base[i % len(base)]
        assert isinstance(s.memory, MemoryPart)
        m = dataclasses.replace(s.memory, **{k: v[i] for k, v in fields.items()})
        out.append(dataclasses.replace(s, ts=10_000.0 + i, memory=m))
    return out


async def _pagecache_lines(history: list[Snapshot]) -> tuple[list[str], int]:
    app = DltopApp(ListFeed(history, start=len(history) - 1), Settings(tab="pagecache"))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        sparks = app.query_one("#pc-sparks", Static)
        return str(sparks.render()).splitlines(), sparks.size.width - SPARK_LABEL_WIDTH - SPARK_SCALE_WIDTH


def _line(lines: list[str], label: str) -> str:
    return next(ln for ln in lines if ln.startswith(label))


async def test_a_column_covers_the_same_seconds_as_the_history_fills() -> None:
    # 40 s of history drew 40 one-second columns, 600 s drew ~14 s columns: the same chart, another time scale.
    for n in (40, 600):
        lines, width = await _pagecache_lines(_memory_history(n, cached_bytes=[(1 + i % 7) * MIB
                                                                              for i in range(n)]))
        per = 600 / width  # 10 min at the 1 s cadence, over the columns of 80 columns
        cached = _line(lines, "Cached")[SPARK_LABEL_WIDTH:SPARK_LABEL_WIDTH + width]
        drawn = sum(ch in BARS for ch in cached)
        last = math.floor((10_000 + n - 1) / per)
        assert drawn == len({c for i in range(n) if (c := math.floor((10_000 + i) / per)) > last - width}), n
        axis = lines[-1]
        assert axis[SPARK_LABEL_WIDTH:].startswith("-10 min ─") and f"now {charts.column_text(per)}/col" in axis
    assert drawn == width  # a full history fills the chart


async def test_a_writeback_blip_says_its_scale() -> None:
    # A 4 KiB Writeback blip drew as tall as 45 MiB of Dirty; now each chart says its max.
    n = 30
    wb = [4 * KIB if i == 20 else 0 for i in range(n)]
    dirty = [45 * MIB if i == 25 else MIB for i in range(n)]
    lines, width = await _pagecache_lines(_memory_history(n, writeback_bytes=wb, dirty_bytes=dirty))
    assert _line(lines, "Writeback")[SPARK_LABEL_WIDTH + width:].strip() == "max 4.0 KiB"
    assert _line(lines, "Dirty")[SPARK_LABEL_WIDTH + width:].strip() == f"max {human_bytes(45 * MIB)}"
    assert all(len(ln) <= 80 for ln in lines)


GIB = 1 << 30


async def test_a_dip_in_available_stays_in_the_chart_and_its_range() -> None:
    # MemAvailable fell from 22.3 to 17.2 GiB for 6 s (the recorded readings otherwise): a 13 s column that kept
    # its largest reading showed none of it, and the range stayed 22.1-22.3 GiB. Each column keeps its lowest now.
    n, dip = 600, range(300, 306)
    avail = [int(17.2 * GIB) if i in dip else int(22.3 * GIB) + (i % 5) * MIB for i in range(n)]
    cached = [int(10 * GIB) if i in dip else int(12 * GIB) for i in range(n)]
    lines, width = await _pagecache_lines(_memory_history(n, available_bytes=avail, total_bytes=[int(23.5 * GIB)] * n,
                                                          cached_bytes=cached))
    line = _line(lines, "Available")
    bars = line[SPARK_LABEL_WIDTH:SPARK_LABEL_WIDTH + width]
    assert line[SPARK_LABEL_WIDTH + width:].strip() == "17.2–22.3 GiB" == human_range(min(avail), max(avail))
    low = [i for i, ch in enumerate(bars) if ch == "▁"]  # the dip's column(s), at the bottom of the range
    assert low and len(low) <= 2 and set(bars) - {"▁"} == {"█"}, bars
    per = 600 / width
    dip_col = math.floor((10_000 + dip[0]) / per) - (math.floor((10_000 + n - 1) / per) - width + 1)
    assert low[0] == dip_col
    cached_line = _line(lines, "Cached")
    assert cached_line[SPARK_LABEL_WIDTH + width:].strip() == f"max {human_bytes(12 * GIB)}"
    assert cached_line[SPARK_LABEL_WIDTH + dip_col] != "█"  # a drop of the cache shows too


async def test_the_range_covers_the_value_printed_beside_it() -> None:
    # The value beside a chart is the newest reading; a column keeps one reading of those it covers, so the
    # newest may be none of the columns' (Available 17.4 GiB beside 17.9-22.1 GiB). The range now holds it.
    n = 600
    avail = [int(20 * GIB)] * (n - 2) + [int(22 * GIB)] * 2  # a jump within the last column: its lowest is 20
    dirty = [5 * MIB] * (n - 1) + [1 * MIB]
    lines, width = await _pagecache_lines(_memory_history(n, available_bytes=avail, total_bytes=[int(23.5 * GIB)] * n,
                                                          dirty_bytes=dirty))
    line = _line(lines, "Available")
    assert line[10:SPARK_LABEL_WIDTH].strip() == "22.0 GiB"
    assert line[SPARK_LABEL_WIDTH + width:].strip() == "20.0–22.0 GiB"
    assert set(line[SPARK_LABEL_WIDTH:SPARK_LABEL_WIDTH + width]) == {"▁"}  # no column's reading is 22 GiB
    dirty_line = _line(lines, "Dirty")
    assert dirty_line[10:SPARK_LABEL_WIDTH].strip() == "1.0 MiB"
    assert dirty_line[SPARK_LABEL_WIDTH + width:].strip() == "max 5.0 MiB"  # a burst is kept; 1 MiB is inside
    for lo, hi, now in ((2.0, 3.0, 3.5), (2.0, 3.0, 1.0)):  # and a loss outside the band it moved in
        bottom, top = charts.scale_of([lo, hi], None, now=now)
        assert bottom <= now <= top


async def test_the_loss_is_scaled_from_its_lowest_value() -> None:
    # From 0, a loss between 2.30 and 2.40 drew a flat row of full bars; now its range is the scale.
    from tests.test_training_pane import _open, _shown

    session = load_session("training-session.jsonl")
    last = session[-1]
    assert last.probes is not None
    p = last.probes.processes[0]
    history = []
    for i in range(600):
        loss = 2.4 - 0.1 * i / 599
        q = dataclasses.replace(p, loss=loss, losses_logged=i + 1, loss_nonfinite=None, samples_per_s=100.0 + i,
                                samples=100 * (i + 1))
        history.append(dataclasses.replace(last, ts=10_000.0 + i,
                                           probes=dataclasses.replace(last.probes, processes=(q,))))
    app = DltopApp(ListFeed(history, start=len(history) - 1))
    async with app.run_test(size=(80, 24)) as pilot:
        await _open(pilot)
        lines = _shown(app).splitlines()
        loss = _line(lines, "Loss")
        assert loss.rstrip().endswith("2.3–2.4"), loss
        bars = [ch for ch in loss if ch in BARS]
        assert bars[0] == "█" and bars[-1] == "▁" and len(set(bars)) >= 6  # a slope, not a flat row
        assert _line(lines, "Samples/s").rstrip().endswith("max 699/s")
        assert any(ln.strip().startswith("-10 min ─") for ln in lines)
        assert max(len(ln) for ln in lines) <= app.query_one("#tr-body", Static).size.width


async def test_each_gpu_chart_line_says_its_span() -> None:
    from tests.test_gpu_pane import gpu_snaps, scenario

    snaps = gpu_snaps(scenario("h100-2proc"), n=3)  # 2 s apart: 600 samples are 20 min, a 15 min chart
    app = DltopApp(ListFeed(snaps, start=len(snaps) - 1), Settings(tab="gpu"))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        text = "\n".join(str(w.render()) for w in app.query("#gpu-devices Static"))
        line = next(ln for ln in text.splitlines() if ln.startswith("util"))
        assert line.rstrip().endswith(" 15 min") and len(line) <= 80
        assert sum(ch in BARS for ch in line.split("mem")[0]) == 1  # 4 s of a 15 min chart: one column


def test_the_span_follows_the_cadence() -> None:
    for cadence, span in ((1.0, 600), (2.0, 900), (0.25, 120), (0.5, 300), (5.0, 1800), (30.0, 10800)):
        times = [1000.0 + cadence * i for i in range(50)]
        assert charts.span_s(times) == span, cadence
    assert charts.span_s([]) == 600 and charts.span_s([5.0]) == 600  # before two readings: the default 1 s
    assert charts.span_text(600) == "10 min" and charts.span_text(60) == "60 s" and charts.span_text(3600) == "1 h"


TRIED: list[int] = []


@settings(max_examples=300, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.floats(0, 500), st.floats(-1e3, 1e3) | st.just(math.nan)), max_size=40),
       st.floats(0, 600), st.integers(1, 50), st.sampled_from([30.0, 60.0, 120.0]), st.floats(0.1, 20),
       st.sampled_from(["max", "min"]))
def _columns_match_a_full_scan(points: list[tuple[float, float]], end: float, width: int, span: float,
                               cadence: float, keep: charts.Keep) -> None:
    TRIED.append(1)
    points = sorted(points)
    cols = charts.time_columns(points, end, width, span, cadence, keep)
    assert len(cols) == width
    per = span / width
    first = math.floor(end / per) - width + 1
    for i, v in enumerate(cols):
        inside = [0.0 if math.isnan(y) else y for t, y in points if math.floor(t / per) == first + i]
        if inside:
            assert v == (min(inside) if keep == "min" else max(inside))  # no dip, no spike lost
        elif v is not None:  # a held level: the column before it, between readings close enough
            assert i > 0 and cols[i - 1] == v
    for height in (1, 3):
        rows = charts.draw(cols, height, max(charts.shown(cols), default=0.0), min(charts.shown(cols), default=0.0))
        assert len(rows) == height and all(len(r) == width for r in rows)
        assert all(rows[-1][i] == " " for i, v in enumerate(cols) if v is None)


def test_columns_against_a_full_scan() -> None:
    TRIED.clear()
    _columns_match_a_full_scan()
    print(f"time_columns: {len(TRIED)} inputs tried")
    assert len(TRIED) >= 300, len(TRIED)
