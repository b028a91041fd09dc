"""The page-cache pane: Cached / Dirty / Writeback over the last minutes, pressure, refaults, cgroup and disks."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any, NamedTuple

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.content import Content
from textual.widgets import Static

from dltop.derive import DiskRates, VmRates, memory_rates, vm_rates
from dltop.fmt import (
    human_bytes,
    human_count_rate,
    human_range,
    human_rate,
    percent,
    percent_text,
)
from dltop.model import CgroupMemory, DiskStat, MemoryPart, Pressure, Snapshot, Unavailable, VmStat
from dltop.tui import charts
from dltop.tui.panes.base import Lines, Pane, set_content
from dltop.view import View

# Sparklines of meminfo fields, top to bottom, with the least span of their scale as a share of MemTotal, or
# None for a scale from 0, and what a column keeps of the readings it covers; refaults/s (derived) comes after
# them. Available is a level that rarely leaves a narrow band near the top (23.0-23.2 GiB of 23.5): from 0 it is
# a solid bar, so it is scaled to the band shown, at least 1% of MemTotal tall so that noise of a few MiB does
# not look like a cliff. The others are amounts whose zero means something (nothing dirty) and are scaled from 0.
# Available and Cached keep each column's lowest reading (a 6 s dip of 5 GiB is the news: a column of 13 s that
# kept its largest showed none of it); Dirty, Writeback and refaults their highest (a burst).
SPARK_FIELDS: tuple[tuple[str, str, float | None, charts.Keep], ...] = (
    ("available_bytes", "Available", 0.01, "min"),
    ("cached_bytes", "Cached", None, "min"),
    ("dirty_bytes", "Dirty", None, "max"),
    ("writeback_bytes", "Writeback", None, "max"),
)
SPARK_KEEP: tuple[charts.Keep, ...] = (*(f[3] for f in SPARK_FIELDS), "max")  # the refaults' chart last

SPARK_LABEL_WIDTH = 20  # "Writeback" padded to 10, the value right-aligned in 9, a space
SPARK_SCALE_WIDTH = 14  # " 22.9–23.2 GiB", " max 45.0 MiB": right of the bars, each chart's scale
DISK_HEADERS = ("Device", "r/s", "w/s", "rMB/s", "wMB/s", "await", "%util")  # as iostat -x names them


class Chart(NamedTuple):
    """One chart of the block: its label and current value (as printed, and as a number the scale covers), its
    number in the pane's KeptSeries, style, the least span of its scale in bytes (None: from 0), and how the
    scale's numbers are written."""

    label: str
    value: str
    number: int
    style: str
    min_span: float | None
    fmt: Callable[[float], str]
    now: float | None


def _bytes(v: float) -> str:
    return human_bytes(int(v))


def _per_s(v: float) -> str:
    return f"{human_count_rate(v)}/s"


def _mb(n: float) -> str:
    return f"{n / 2**20:.1f}"


def _pair(label: str, value: str, style: str = "") -> Text:
    return Text.assemble((label + " ", "bold"), (value, style))


def pack(pairs: list[Text], width: int) -> Text:
    """Lay "label value" pairs out in lines no wider than `width`, breaking only between pairs (a wrap inside
    "14.2 GiB of 16.0 GiB" would misread)."""
    lines: list[list[Text]] = [[]]
    used = 0
    for pair in pairs:
        need = len(pair) + (2 if lines[-1] else 0)
        if lines[-1] and used + need > width:
            lines.append([])
            used, need = 0, len(pair)
        lines[-1].append(pair)
        used += need
    return Text("\n").join(Text("  ").join(line) for line in lines)


def _psi(name: str, p: Pressure | Unavailable, full_all: bool = True) -> Text:
    """`mem PSI some 1.2/0.8/0.3% full 0.4/0.2/0.1%`: the kernel's avg10/avg60/avg300, so a burst and a
    lasting squeeze read apart; `full_all` False keeps only full's avg10 (a narrow screen)."""
    if isinstance(p, Unavailable):
        return _pair(name, "n/a", "dim")  # the reason goes to the notes line
    full = ""
    if p.full_avg10 is not None:
        rest = [p.full_avg60, p.full_avg300] if full_all else []
        full = " full " + "/".join(f"{v:.1f}" for v in [p.full_avg10, *rest] if v is not None) + "%"
    style = "bold red" if p.some_avg10 >= 10 else "yellow" if p.some_avg10 >= 1 else ""
    return _pair(name, f"some {p.some_avg10:.1f}/{p.some_avg60:.1f}/{p.some_avg300:.1f}%{full}", style)


def summary_text(m: MemoryPart, width: int = 200) -> Text:
    """MemTotal / MemAvailable / Buffers / Shmem / Mlocked / file LRU, packed into lines of `width`."""
    avail_style = ""
    if m.available_bytes is not None and m.total_bytes and m.available_bytes < 0.1 * m.total_bytes:
        avail_style = "bold red"
    return pack([
        _pair("Total", human_bytes(m.total_bytes)),
        _pair("Available", f"{human_bytes(m.available_bytes)} ({percent(m.available_bytes, m.total_bytes)})",
              avail_style),
        _pair("Buffers", human_bytes(m.buffers_bytes)),
        _pair("Shmem", human_bytes(m.shmem_bytes)),
        _pair("Mlocked", human_bytes(m.mlocked_bytes)),
        _pair("file active/inactive", f"{human_bytes(m.active_file_bytes)}/{human_bytes(m.inactive_file_bytes)}"),
    ], width)


def activity_text(m: MemoryPart, vm: VmRates | None, width: int = 200) -> Text:
    """PSI on the first line, the page-cache traffic rates on the second."""
    first = Text("  ").join([_psi("mem PSI", m.pressure_memory), _psi("io PSI", m.pressure_io)])
    if first.cell_len > width:  # 80 columns: full's avg60/avg300 give way, some keeps all three
        first = Text("  ").join([_psi("mem PSI", m.pressure_memory, False), _psi("io PSI", m.pressure_io, False)])
    if isinstance(m.vmstat, Unavailable):
        rates = [_pair("vmstat", "n/a", "dim")]
    elif vm is None:
        rates = [_pair("refaults", "(rates after the second reading)", "dim")]
    else:
        refault_style = "bold yellow" if (vm.refaults_per_s or 0) > 1000 else ""
        rates = [
            _pair("refaults", f"{human_count_rate(vm.refaults_per_s)}/s", refault_style),
            _pair("majflt", f"{human_count_rate(vm.major_faults_per_s)}/s"),
            _pair("in", human_rate(vm.page_in_bytes_per_s)),
            _pair("out", human_rate(vm.page_out_bytes_per_s)),
            _pair("scan", f"{human_count_rate(vm.scanned_per_s)}/s"),
        ]
        if m.vmstat.oom_kill is not None:
            rates.append(_pair("oom_kill", str(m.vmstat.oom_kill), "bold red" if vm.oom_kills else ""))
    return Text("\n").join([first, pack(rates, width)])


def cgroup_text(m: MemoryPart, width: int = 200) -> Text:
    """The watched process's memory cgroup (v1 or v2): usage against its limit."""
    cg = m.cgroup
    if cg is None:
        return _pair("cgroup", "not watched", "dim")
    if isinstance(cg, Unavailable):
        return Text(cg.reason, "dim")  # the reason names the version: "cgroup v1: limit not read (...)"
    pairs = [_pair(f"cgroup v{cg.version}", cg.path)]
    if cg.limit_path is not None:  # the numbers below are the limiting ancestor's
        pairs.append(_pair("limited at", cg.limit_path))
    pairs.append(_cgroup_used(cg))
    pairs.append(_pair("file", human_bytes(cg.file_bytes)))
    pairs.append(_pair("dirty", human_bytes(cg.file_dirty_bytes)))
    if cg.oom_kill is not None:
        pairs.append(_pair("oom_kill", str(cg.oom_kill), "bold red" if cg.oom_kill else ""))
    return pack(pairs, width)


def _cgroup_used(cg: CgroupMemory) -> Text:
    """A cgroup's usage against its limit."""
    used = human_bytes(cg.current_bytes)
    if cg.current_bytes is None:
        used += f" ({cg.unavailable.get('current_bytes', 'not read')})"
    if cg.max_bytes is not None and cg.current_bytes is not None:
        share = cg.current_bytes / cg.max_bytes if cg.max_bytes else 0
        return _pair("used", f"{used} of {human_bytes(cg.max_bytes)} ({percent_text(100 * share)})",
                     "bold red" if share >= 0.9 else "")
    if cg.max_bytes is not None:
        return _pair("used", f"{used} of {human_bytes(cg.max_bytes)}")
    if cg.no_limit:
        return _pair("used", f"{used}, no limit")
    # never "no limit" for a limit that could not be read
    return _pair("used", f"{used}, {cg.unavailable.get('max_bytes', 'limit not read')}", "yellow")


def unavailable_notes(m: MemoryPart) -> list[str]:
    """Why each missing value is missing, for the notes line."""
    notes = [f"{k}: {v}" for k, v in m.unavailable.items()]
    for name, part in (("mem PSI", m.pressure_memory), ("io PSI", m.pressure_io), ("vmstat", m.vmstat)):
        if isinstance(part, Unavailable):
            notes.append(f"{name}: {part.reason}")
    if isinstance(m.vmstat, VmStat):
        notes.extend(f"{k}: {v}" for k, v in m.vmstat.unavailable.items())
    return notes


def _disk_row(d: DiskRates) -> tuple[str, ...]:
    return (d.name, f"{d.reads_per_s:.1f}", f"{d.writes_per_s:.1f}", _mb(d.read_bytes_per_s), _mb(d.write_bytes_per_s),
            f"{d.await_ms:.2f}" if d.await_ms is not None else "0.00", f"{d.util_pct:.1f}")


def refault_rate(prev: Snapshot, cur: Snapshot) -> float | None:
    """Refaults per second between two Snapshots."""
    if not isinstance(prev.memory, MemoryPart) or not isinstance(cur.memory, MemoryPart):
        return None
    a, b = prev.memory.vmstat, cur.memory.vmstat
    if isinstance(a, Unavailable) or isinstance(b, Unavailable):
        return None
    return vm_rates(a, b, cur.ts - prev.ts).refaults_per_s


def scale_labels(bottom: float, top: float, rows: int, fmt: Callable[[float], str] = _bytes) -> list[str]:
    """What the bars of a chart scaled from `bottom` to `top` span, per row: on one row its max (or its range,
    where it does not start at 0), on more the top value on the top row and the bottom value on the bottom
    row."""
    if rows == 1:
        return [" " + (human_range(bottom, top) if fmt is _bytes and bottom else charts.scale_text(bottom, top, fmt))]
    return [f" {fmt(top)}", *[""] * (rows - 2), f" {fmt(bottom)}"]


def sparkline_block(chart_list: list[Chart], width: int, height: int, end_ts: float, span_s: float,
                    cadence_s: float, kept: charts.KeptSeries[Any]) -> Content:
    """Label, current value and a chart `width` wide per chart, each as tall as the space allows (with a blank
    line between charts once there is room): a big terminal gets finer charts, 80x24 one line each. Every
    column covers span_s / width seconds (the time axis under the charts says the span and a column's
    seconds); each chart's scale is on its right: its max, or its range where it does not start at 0, always
    covering the value printed beside it. The charts' columns are kept between ticks in `kept`."""
    n = len(chart_list)
    height = max(n, height - 1)  # the axis' line
    gap = 1 if height >= 2 * n - 1 else 0
    rows_each = max(1, (height - gap * (n - 1)) // n)
    lines: list[Content] = []
    for i, chart in enumerate(chart_list):
        if i and gap:
            lines.append(Content(""))
        cols = kept.columns(chart.number, end_ts, width, span_s, cadence_s)
        bottom, top = charts.scale_of(cols, 0.0 if chart.min_span is None else chart.min_span, now=chart.now)
        bars = charts.draw(cols, rows_each, top, bottom)
        scale = scale_labels(bottom, top, len(bars), chart.fmt) if charts.shown(cols) else [""] * len(bars)
        for r, bar in enumerate(bars):
            head = f"{chart.label:<10}{chart.value:>9} " if r == len(bars) - 1 else " " * SPARK_LABEL_WIDTH
            lines.append(Content.assemble((head[:10], "bold"), head[10:], (bar, chart.style),
                                          (scale[r][:SPARK_SCALE_WIDTH], "dim")))
    per = f" {charts.column_text(span_s / max(1, width))}/col"
    lines.append(Content.assemble(" " * SPARK_LABEL_WIDTH, (charts.axis(width, span_s), "dim"),
                                  (per[:SPARK_SCALE_WIDTH], "dim")))
    return Content("\n").join(lines)


def disk_table(disks: list[DiskRates], read: tuple[DiskStat, ...] | Unavailable) -> Content:
    """iostat -x style: a bold header line, then one line per device, columns right-aligned but the name. `read`
    is this reading's disks: "no disk I/O yet" only when they were read fine and none has had any."""
    rows = [DISK_HEADERS, *(_disk_row(d) for d in disks)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(DISK_HEADERS))]

    def line(r: tuple[str, ...]) -> str:
        return "  ".join(r[0].ljust(widths[0]) if i == 0 else r[i].rjust(widths[i]) for i in range(len(r)))

    header = Content.assemble((line(rows[0]), "bold reverse"))
    if isinstance(read, Unavailable):
        return Content("\n").join([header, Content.assemble((f"disks n/a: {read.reason}", "$warning"))])
    if not disks:
        why = "rates need two readings" if read else "no device has had any since boot"
        return Content("\n").join([header, Content.assemble((f"(no disk I/O yet: {why})", "dim"))])
    return Content("\n").join([header, *(Content(line(r)) for r in rows[1:])])


_SPARK_GET = operator.attrgetter(*(f[0] for f in SPARK_FIELDS))


def readings(prev: Snapshot | None, cur: Snapshot) -> tuple[charts.Point | None, ...]:
    """What one Snapshot adds to each chart: its meminfo fields (`series`) and the refaults/s since `prev`."""
    rate = refault_rate(prev, cur) if prev is not None else None
    refaults = (cur.ts, rate) if rate is not None else None
    m = cur.memory
    if not isinstance(m, MemoryPart):
        return (None,) * len(SPARK_FIELDS) + (refaults,)
    return (*((cur.ts, float(v)) if v is not None else None for v in _SPARK_GET(m)), refaults)


class PageCachePane(Pane):
    """Cached, Dirty and Writeback sparklines, MemAvailable, PSI, refault rate, the job's cgroup and disk load."""

    PANE_ID = "pagecache"
    TITLE = "Page cache"
    HELP = ("Numbers come straight from the kernel: /proc/meminfo, /proc/vmstat, /proc/pressure, /proc/diskstats "
            "and the memory cgroup of the watched process (--pid). Disk columns follow iostat -x; refaults are "
            "evicted file pages read back soon after (cache thrashing). PSI is the share of time tasks stalled, "
            "as the kernel averages it over 10 s / 60 s / 300 s.")

    def __init__(self) -> None:
        super().__init__()
        # The charts' readings and columns, kept between ticks: a tick derives and buckets only the newest
        # Snapshot (and drops the one that left), not the 600 of a full history.
        self._kept: charts.KeptSeries[Snapshot] = charts.KeptSeries(len(SPARK_FIELDS) + 1, readings, SPARK_KEEP)

    def compose(self) -> ComposeResult:
        # Lines: a tick repaints only the lines whose text changed (a sparkline whose value moved, not the axis
        # or a flat Writeback line). One widget for all sparklines: a monitor pays per widget on every repaint.
        yield Lines(id="pc-summary")
        yield Lines(id="pc-sparks")
        yield Lines(id="pc-activity")
        yield Lines(id="pc-cgroup")
        yield Static(id="pc-notes", classes="notes")
        # A plain text table, not a DataTable: disks have no per-row action, and it costs far less to redraw
        # every second. It scrolls when a machine has more disks than fit.
        with VerticalScroll(id="pc-disks-scroll"):
            yield Lines(id="pc-disks")

    def render_view(self, view: View) -> None:
        m = view.snapshot.memory
        summary = self.query_one("#pc-summary", Static)
        if not isinstance(m, MemoryPart):
            set_content(summary, Text(f"memory: {m}" if m is not None else "memory: not sampled", "dim"))
            return
        width = max(20, self.size.width)
        set_content(summary, summary_text(m, width))
        history = view.history
        vm, disks = memory_rates(view.previous, view.snapshot)
        sparks = self.query_one("#pc-sparks", Static)
        width = max(1, sparks.size.width - SPARK_LABEL_WIDTH)
        self._kept.update(history)
        times = [s.ts for s in history[-(charts.CADENCE_INTERVALS + 1):]]  # all that the cadence reads
        set_content(sparks, sparkline_block(self._charts(m, vm), max(1, width - SPARK_SCALE_WIDTH),
                                            sparks.size.height, view.snapshot.ts, charts.span_s(times),
                                            charts.cadence_s(times), self._kept))
        activity = self.query_one("#pc-activity", Static)
        text = activity_text(m, vm, width)
        lines = text.plain.count("\n") + 1
        if activity.styles.height is None or activity.styles.height.value != lines:
            activity.styles.height = lines  # a layout pass only when the rates need another line
        set_content(activity, text)
        set_content(self.query_one("#pc-cgroup", Static), cgroup_text(m, width))
        notes = unavailable_notes(m)
        notes_widget = self.query_one("#pc-notes", Static)
        set_content(notes_widget, Text("; ".join(notes), "dim"))
        notes_widget.display = bool(notes)
        set_content(self.query_one("#pc-disks", Static), disk_table(disks, m.disks))

    def _charts(self, m: MemoryPart, vm: VmRates | None) -> list[Chart]:
        """The meminfo fields' charts and the refaults', their readings kept between ticks."""
        chart_list: list[Chart] = []
        for i, (name, label, span_share, _keep) in enumerate(SPARK_FIELDS):
            min_span = None if span_share is None else span_share * (
                m.total_bytes or max((v for _, v in self._kept.points(i)), default=0.0))
            v = getattr(m, name)
            chart_list.append(Chart(label, human_bytes(v), i, "$accent", min_span, _bytes, v))
        rate = vm.refaults_per_s if vm is not None else None
        chart_list.append(Chart("Refaults", human_count_rate(rate) + "/s", len(SPARK_FIELDS), "$warning", None,
                                _per_s, rate))
        return chart_list
