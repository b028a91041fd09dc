"""The GPU pane: per GPU a memory bar and utilization / memory sparklines, the processes holding GPU memory (and
what for, where the probe or a server says), and the KV pool and prefix cache of each inference server (the hit
rate of vLLM V1 over the interval: `derive.server_rates`). What is not known is drawn as unknown, with the reason
in the notes, never as zero."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from rich.cells import cell_len
from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.content import Content
from textual.coordinate import Coordinate
from textual.widgets import DataTable, Input, Static
from textual.widgets.data_table import ColumnKey

from dltop.derive import ServerRates, server_rates
from dltop.fmt import human_bytes, percent_text, printable, shorten_end, shorten_lines
from dltop.model import GpuDevice, ServerStats, Snapshot, Unavailable
from dltop.model.gpu import NO_PROBE, SPLIT_FIELDS, GpuProcess, MemorySplit, MigDevice
from dltop.model.gpu_query import ProcessQuery, ProcessRow, select_processes
from dltop.model.servers import ModelStats
from dltop.text.gpu import elapsed, elapsed_until, pids_text, short_command
from dltop.tui import charts
from dltop.tui.memo import Memo
from dltop.tui.messages import ServerAddRequested, ServerRemoveRequested
from dltop.tui.panes.base import Pane, RowTable, fit_column, set_content
from dltop.tui.panes.gpu_procs import TagKey, ask_signal, show_environment, tag_key, toggle_tags, untag_gone
from dltop.view import View

if TYPE_CHECKING:
    from dltop.tui.screens.gpu_details import GpuDetailsScreen

# The one line that says why the split is not drawn (the model's per-field reason is NO_PROBE).
SPLIT_NEEDS_PROBE = "split needs the probe: add `import dltop.probe`"
# The table's columns: always these; then /proc's (CPU %, host RSS, running time) where no process has a split,
# or where the terminal has room for both (SPLIT_AND_HOST_WIDTH); then the split's where one is known. Short
# headers so the table fits 80 columns; the help screen spells them out.
BASE_COLUMNS = (("gpu", "GPU"), ("pid", "PID"), ("user", "User"), ("command", "Command"), ("used", "Used"),
                ("sm", "SM%"))
HOST_COLUMNS = (("cpu", "CPU%"), ("rss", "RSS"), ("time", "Time"))
SPLIT_COLUMNS = tuple(zip(SPLIT_FIELDS, ("Wts", "KV", "Cache", "Other", "NonT"), strict=True))
SPLIT_AND_HOST_WIDTH = 110
HEADERS = dict((*BASE_COLUMNS, *HOST_COLUMNS, *SPLIT_COLUMNS))
# Segments of a process's split in the bar, in the order of the issue: weights | KV | cached | other | non-torch.
SPLIT_SEGMENTS = (("weights_bytes", "W", "$primary"), ("kv_cache_bytes", "K", "$accent"),
                  ("allocator_cache_bytes", "c", "$warning"), ("other_torch_bytes", "o", "$secondary"),
                  ("non_torch_bytes", "n", "$error"))
SEGMENT_LABELS = {"W": "weights", "K": "KV", "c": "cached", "o": "other", "n": "non-torch"}
# Processes without a split: one segment each, told apart by colour and their legend.
PROCESS_STYLES = ("$primary", "$accent", "$secondary", "$success", "$warning")
COMMAND_STEP = 8  # cells the Command column scrolls per ← or →
LABEL_WIDTH = 6  # the indent of a GPU's bar under its headline
MIG_LABEL_WIDTH = 11  # "  3g.20gb ", "  1g.10gb+me"


def _pct(v: float | None) -> str:
    return percent_text(v) if v is not None else "?"


def _frac(v: float | Unavailable) -> str:
    return "?" if isinstance(v, Unavailable) else percent_text(100 * v, 1)


def cells(parts: Sequence[int], width: int) -> list[int]:
    """Cells per part, proportional to its bytes, summing to `width` (largest remainder): a bar never overflows."""
    total = sum(parts)
    if total <= 0 or width <= 0:
        return [0] * len(parts)
    exact = [n * width / total for n in parts]
    out = [int(x) for x in exact]
    order = sorted(range(len(parts)), key=lambda i: exact[i] - out[i], reverse=True)
    for i in order[: width - sum(out)]:
        out[i] += 1
    return out


def _split_parts(p: GpuProcess) -> list[tuple[int, str, str]]:
    """The known parts of a process's split as bar segments (bytes, fill, style), in the bar's order; parts that
    add up to more than NVML's figure for the process (an inconsistent split) scaled into that figure."""
    parts = [(v, ch, style) for name, ch, style in SPLIT_SEGMENTS if (v := getattr(p.split, name)) is not None]
    whole = sum(v for v, _, _ in parts)
    if p.used_bytes is None or whole <= p.used_bytes:
        return parts
    scaled = [v * p.used_bytes // whole for v, _, _ in parts]  # in integers: bytes overflow a float's precision
    scaled[scaled.index(max(scaled))] += p.used_bytes - sum(scaled)  # what rounding down left: they sum to it
    return [(n, ch, style) for n, (_, ch, style) in zip(scaled, parts, strict=True)]


def bar_segments(processes: Sequence[GpuProcess], used: int, total: int) -> list[tuple[int, str, str]]:
    """(bytes, fill character, style) from left to right: each process's split parts where the probe or a server
    gives them, then the rest of its NVML figure as one segment; then memory used by no listed process; then free."""
    segs: list[tuple[int, str, str]] = []
    listed = 0
    for i, p in enumerate(processes):
        if p.used_bytes is None:
            continue
        listed += p.used_bytes
        parts = _split_parts(p)
        segs += parts
        if rest := max(0, p.used_bytes - sum(v for v, _, _ in parts)):  # what its split parts do not cover
            segs.append((rest, "█", PROCESS_STYLES[i % len(PROCESS_STYLES)]))
    if used > listed:
        segs.append((used - listed, "▓", "$text-muted"))
    segs.append((max(0, total - max(used, listed)), "░", "$text-disabled"))
    return segs


def memory_bar(label: str, processes: Sequence[GpuProcess], used: int | None, total: int | None,
               width: int, label_width: int = LABEL_WIDTH) -> Content:
    """One line: the label, the bar, and used / total."""
    pieces: list[str | tuple[str, str]] = [(f"{label:<{label_width}}", "bold")]
    tail = f" {human_bytes(used)}/{human_bytes(total)}"
    room = max(4, width - label_width - len(tail))
    if used is None or not total:
        pieces.append(("?" * room, "dim"))
    else:
        segs = bar_segments(processes, used, total)
        for (_, ch, style), n in zip(segs, cells([s[0] for s in segs], room), strict=True):
            pieces.append((ch * n, style))
    pieces.append(tail)
    return Content.assemble(*pieces)


def _within_other(processes: Sequence[GpuProcess]) -> str:
    """" (grads 1.0G optim 2.0G)": what the probe says other torch holds, where one process on the GPU has it."""
    split = [p.split for p in processes if p.split.other_torch_bytes is not None]
    if len(split) != 1:
        return ""
    bits = [f"{label} {_short(v)}" for label, v in (("grads", split[0].gradients_bytes),
                                                    ("optim", split[0].optimizer_bytes)) if v]
    return f" ({' '.join(bits)})" if bits else ""


Pieces = list[str | tuple[str, str]]  # what Content.assemble joins


def legend(processes: Sequence[GpuProcess], used: int | None, width: int) -> Content:
    """What each segment of the bar is, cut to `width` (one Content built at once: this runs per GPU per tick)."""
    groups = _process_groups(processes)
    listed = sum(p.used_bytes for p in processes if p.used_bytes is not None)
    if used is not None and used > listed:
        groups.append([("▓", "$text-muted"), f" {human_bytes(used - listed)} not attributed to a process"])
    over = [p.pid for p in processes if p.split.inconsistent]
    if over:  # the bar scaled their parts into NVML's figure: said first, it is what the bar leaves out
        groups.insert(0, [("! ", "$error"), f"{pids_text(over)}: parts exceed NVML's used, drawn scaled (see notes)"])
    pieces = _joined(groups) or [("no processes", "dim")]
    return Content.assemble(" " * LABEL_WIDTH, *pieces).truncate(width, ellipsis=True)


def _joined(groups: list[Pieces]) -> Pieces:
    """The legend's groups in one line, two cells apart."""
    return [x for i, group in enumerate(groups) for x in (["  "] if i else []) + group]


def _process_groups(processes: Sequence[GpuProcess]) -> list[Pieces]:
    """The legend of each process whose figure its split does not cover (all of it, without a split), then of the
    split's segments the bar draws."""
    groups: list[Pieces] = []
    drawn: set[str] = set()
    for i, p in enumerate(processes):
        if p.used_bytes is None:
            continue
        parts = _split_parts(p)
        drawn.update(ch for _, ch, _ in parts)
        if p.used_bytes > sum(v for v, _, _ in parts):
            groups.append([("█", PROCESS_STYLES[i % len(PROCESS_STYLES)]), f" {p.pid} {human_bytes(p.used_bytes)}"])
    if drawn:
        groups.append(_split_key(processes, drawn))
    return groups


def _split_key(processes: Sequence[GpuProcess], drawn: set[str]) -> Pieces:
    """The legend of the split's segments the bar draws."""
    key: Pieces = []
    for _, ch, style in SPLIT_SEGMENTS:
        if ch in drawn:
            label = SEGMENT_LABELS[ch] + (_within_other(processes) if ch == "o" else "")
            key += [" " if key else "", (ch, style), f" {label}"]
    return key


class GpuSeries:
    """Each GPU's utilization and memory used over the history, kept up one Snapshot at a time, as chart columns:
    clock-aligned spans of a fixed number of seconds (`dltop.tui.charts`), each the largest reading in it (no spike
    is lost, no shimmer as the window slides). A GPU is found by its UUID (its index where NVML gave none)."""

    FIELDS = ("utilization_gpu_percent", "memory_used_bytes")

    def __init__(self) -> None:
        self._snaps: deque[Snapshot] = deque()  # the history this has read, oldest first
        self._seq = 0  # the number of the next Snapshot read; the oldest kept is self._seq - len(self._snaps)
        # (GPU, field) -> the numbers of the Snapshots that have a value, their times and the values
        self._values: dict[tuple[str | int, str], tuple[deque[int], deque[float], deque[float]]] = {}
        # (GPU, field) -> (a column's seconds, the next Snapshot number not yet in a column, column -> maximum)
        self._buckets: dict[tuple[str | int, str], tuple[float, int, dict[int, float]]] = {}

    def times(self) -> list[float]:
        """The times of the Snapshots read, oldest first."""
        return [s.ts for s in self._snaps]

    def update(self, history: Sequence[Snapshot]) -> None:
        """Follow `history` (the app's, oldest first): read only the Snapshots new since the last call."""
        known = self._snaps
        while known and history and known[0] is not history[0]:
            known.popleft()  # fallen off the front of the history
        if not known or len(known) > len(history) or known[-1] is not history[len(known) - 1]:
            known.clear()  # another history (a replay jumped): read it all again
            self._values.clear()
            self._buckets.clear()
        self._forget_before(self._seq - len(known))
        for snap in history[len(known):]:
            known.append(snap)
            self._read(snap)
            self._seq += 1

    def _forget_before(self, first: int) -> None:
        """Drop the values of the Snapshots numbered before `first` (fallen off the history)."""
        for seqs, times, values in self._values.values():
            while seqs and seqs[0] < first:
                seqs.popleft()
                times.popleft()
                values.popleft()

    def _read(self, snap: Snapshot) -> None:
        """Add each GPU's values in `snap`, as Snapshot number self._seq."""
        if not isinstance(snap.gpus, tuple):
            return
        for g in snap.gpus:
            for name in self.FIELDS:
                v = getattr(g, name)
                if v is not None:
                    got = self._values.setdefault((g.uuid or g.index, name), (deque(), deque(), deque()))
                    got[0].append(self._seq)
                    got[1].append(snap.ts)
                    got[2].append(float(v))

    def columns(self, g: GpuDevice, name: str, width: int, span_s: float, end_ts: float,
                cadence_s: float) -> charts.Columns:
        """One GPU field over the last `span_s` seconds up to `end_ts`, as `width` columns, oldest first."""
        key = (g.uuid or g.index, name)
        got = self._values.get(key)
        if not got or width <= 0:
            return [None] * max(0, width)
        seqs, times, values = got
        per = span_s / width
        cached = self._buckets.get(key)
        if cached is None or cached[0] != per:
            cached = (per, 0, {})
        _, upto, buckets = cached
        for seq, ts, v in zip(reversed(seqs), reversed(times), reversed(values), strict=True):  # the new ones only
            if seq < upto:
                break
            charts.add_to(buckets, ts, v, per)
        _trim(buckets, times, values, per)
        self._buckets[key] = (per, self._seq, buckets)
        return charts.bucket_columns(buckets, end_ts, width, span_s, cadence_s)


def _trim(buckets: dict[int, float], times: deque[float], values: deque[float], per: float) -> None:
    """Drop the columns before the oldest reading kept; the oldest column lost its oldest readings with the
    history: its maximum from what is left."""
    first = charts.column_of(times[0], per)
    for b in [b for b in buckets if b < first]:
        del buckets[b]
    buckets[first] = max(v for ts, v in zip(times, values, strict=True) if charts.column_of(ts, per) == first)


def headline(g: GpuDevice, width: int) -> list[Content]:
    """A GPU's name, utilization, temperature and power; a GPU whose calls fail: the reason on a line under it."""
    from dltop.tui.screens.gpu_details import throttling  # imported with the GPUs drawn, not at start

    head = Content.assemble((f"GPU{g.index} {printable(g.name or '?')}", "bold"))
    lost = g.why("memory_total_bytes") if g.memory_total_bytes is None else None
    if lost is not None and g.memory_used_bytes is None:
        # A GPU whose calls fail keeps its place: the reason where its numbers would be.
        return [head, Content.assemble(("      " + lost, "$error"))]  # wrapped, never cut: it is the news
    if bits := _head_bits(g):
        head = head.append("  " + "  ".join(bits))
    if held := throttling(g):  # the clocks held down (power cap, thermal): what a slow step may come from
        head = head.append(Content.assemble(("  throttled: " + "+".join(held), "$warning")))
    return [head.truncate(width, ellipsis=True)]


def _head_bits(g: GpuDevice) -> list[str]:
    """The headline's numbers: utilization, temperature, power, and a memory pool that is the system's."""
    bits = []
    if g.utilization_gpu_percent is not None:
        bits.append(f"util {g.utilization_gpu_percent}%")
    if g.temperature_c is not None:
        bits.append(f"{g.temperature_c}°C")
    if g.power_mw is not None:
        limit = f"/{g.power_limit_mw / 1000:.0f}" if g.power_limit_mw else ""
        bits.append(f"{g.power_mw / 1000:.0f}{limit} W")
    if g.memory_pool == "system":
        bits.append("pool: system memory")
    return bits


COMPACT_TAIL = 19  # " 100% 61°C 605/700W": utilization, temperature and power in a fixed width


def compact_tail(g: GpuDevice) -> str:
    """A compact line's numbers: utilization, temperature, power against its limit, in COMPACT_TAIL cells."""
    temp = f"{g.temperature_c}°C" if g.temperature_c is not None else ""
    power = ""
    if g.power_mw is not None:
        power = f"{g.power_mw / 1000:.0f}" + (f"/{g.power_limit_mw / 1000:.0f}" if g.power_limit_mw else "") + "W"
    return f" {_pct(g.utilization_gpu_percent):>4} {temp:>4} {power:>8}"[:COMPACT_TAIL].ljust(COMPACT_TAIL)


def compact_bar(g: GpuDevice, width: int) -> Content:
    """A compact line's bar (each process's share, as in the full view) and used / total, in width - tail."""
    label = f"GPU{g.index}"
    if g.memory_used_bytes is None and g.memory_total_bytes is None:
        why = g.why("memory_total_bytes") or g.why("memory_used_bytes") or "?"
        return Content.assemble((label, "bold"), (f" {why}", "$error")).truncate(width, ellipsis=True)
    procs = g.processes if isinstance(g.processes, tuple) and not g.mig_devices else ()
    return memory_bar(label, procs, g.memory_used_bytes, g.memory_total_bytes, max(20, width - COMPACT_TAIL),
                      label_width=len(label) + 1)


def compact_line(g: GpuDevice, width: int, bar: Content | None = None) -> Content:
    """A GPU in one line: its bar, used / total, utilization, temperature, power; a GPU whose calls fail: its
    reason, cut to the line. `bar`: compact_bar's, where it is known."""
    bar = bar if bar is not None else compact_bar(g, width)
    if g.memory_used_bytes is None and g.memory_total_bytes is None:
        return bar
    return bar.append(compact_tail(g)).truncate(width, ellipsis=True)


def memory_lines(g: GpuDevice, width: int) -> list[Content]:
    """A GPU's memory bar and its legend (in MIG mode: a bar per instance under the parent's)."""
    procs = g.processes if isinstance(g.processes, tuple) else ()
    if g.mig_devices:
        return [memory_bar("", (), g.memory_used_bytes, g.memory_total_bytes, width),
                *(mig_line(mig, width) for mig in g.mig_devices)]
    bar = memory_bar("", procs, g.memory_used_bytes, g.memory_total_bytes, width)
    if isinstance(g.processes, Unavailable):
        return [bar, Content.assemble((f"      processes: {g.processes.reason}", "$warning"))]
    return [bar, legend(procs, g.memory_used_bytes, width)]


def memory_key(g: GpuDevice, width: int) -> tuple[object, ...]:
    """What `memory_lines` and `compact_bar` draw from, as plain values: a GPU's bar is drawn again only when this
    changes (its processes' CPU % moving does not)."""
    splits: dict[int, tuple[int | str | None, ...]] = {}  # id(split) -> its numbers: processes without one share one

    def numbers(sp: MemorySplit) -> tuple[int | str | None, ...]:
        if id(sp) not in splits:
            splits[id(sp)] = (*(getattr(sp, f) for f in SPLIT_FIELDS), sp.gradients_bytes, sp.optimizer_bytes,
                              sp.inconsistent)
        return splits[id(sp)]

    def procs(ps: tuple[GpuProcess, ...] | Unavailable) -> object:
        if isinstance(ps, Unavailable):
            return ps.reason
        return tuple((p.pid, p.used_bytes, numbers(p.split)) for p in ps)

    migs = tuple((m.mig_index, m.name, m.memory_used_bytes, m.memory_total_bytes, procs(m.processes))
                 for m in g.mig_devices)
    return (width, g.memory_used_bytes, g.memory_total_bytes, procs(g.processes), migs)


@lru_cache(maxsize=256)
def _spark(columns: tuple[float | None, ...], top: float | None) -> str:
    # a chart whose columns did not change (memory, most of the time) is not drawn again
    cols = list(columns)
    return charts.draw(cols, 1, max(charts.shown(cols), default=0.0) if top is None else top)[0]


def spark_line(g: GpuDevice, series: GpuSeries, width: int) -> Content:
    """Utilization and memory used over the last minutes, side by side, each from 0 to 100% (of the GPU's
    memory), and the span they cover ('10 min') at the end."""
    times = series.times()
    span, cadence = charts.span_s(times), charts.cadence_s(times)
    end = times[-1] if times else 0.0
    tail = f" {charts.span_text(span)}"
    half = max(1, (width - 21 - len(tail)) // 2)  # "util  97% " and "  mem  65% " around two charts
    util = _spark(tuple(series.columns(g, "utilization_gpu_percent", half, span, end, cadence)), 100.0)
    used, total = g.memory_used_bytes, g.memory_total_bytes
    mem = _spark(tuple(series.columns(g, "memory_used_bytes", half, span, end, cadence)), float(total) if total else None)
    share = 100 * used / total if used is not None and total else None
    return Content.assemble(("util ", "bold"), f"{_pct(g.utilization_gpu_percent):>4} ", (util, "$accent"),
                            ("  mem ", "bold"), f"{_pct(share):>4} ", (mem, "$primary"), (tail, "dim"))


def mig_line(mig: MigDevice, width: int) -> Content:
    """A MIG instance under its parent: its profile and its own memory bar."""
    procs = mig.processes if isinstance(mig.processes, tuple) else ()
    name = (mig.name or f"MIG {mig.mig_index}").rsplit(" ", 1)[-1]
    return memory_bar(f"  {name}", procs, mig.memory_used_bytes, mig.memory_total_bytes, width, MIG_LABEL_WIDTH)


def _short(value: int) -> str:
    return f"{value / 2**30:.1f}G" if value >= 2**30 else f"{value / 2**20:.0f}M"


def _short_cell(value: int | None) -> str:
    """A number of bytes in five cells ("14.0G", " 512M"), so the five of a split fit 80 columns beside the rest."""
    return "?" if value is None else _short(value)


@lru_cache(maxsize=4096)
def _used_cell(value: int | None) -> str:  # NVML's per-process figures repeat from tick to tick
    return human_bytes(value, missing="?")


Rows = dict[str, GpuProcess]  # row key -> its process


def _cell(text: str) -> Text:
    """A table cell that is its text: DataTable reads a str as Rich markup, so a command line with "[/x]" in it
    raised MarkupError and "[red]" vanished from one."""
    return Text(printable(text), no_wrap=True, end="")


_printable = lru_cache(maxsize=4096)(printable)  # the same users and command lines, tick after tick


def columns_for(rows: Sequence[ProcessRow], width: int) -> tuple[str, ...]:
    """The column keys to show: the split's only where some process has a split number, /proc's where there
    is no split or room for both."""
    split = any(r.process is not None and any(getattr(r.process.split, f) is not None for f in SPLIT_FIELDS)
                for r in rows)
    host = not split or width >= SPLIT_AND_HOST_WIDTH
    return tuple(k for k, _ in (*BASE_COLUMNS, *(HOST_COLUMNS if host else ()), *(SPLIT_COLUMNS if split else ())))


def command_cell(command: str | None, offset: int) -> str:
    """A Command cell: what identifies the process (`short_command`) where the table is not scrolled sideways,
    else the whole command line (escaped) from `offset` cells on, as nvitop scrolls it."""
    if command is None:
        return "?"
    if offset <= 0:
        return _printable(short_command(command))
    return _printable(command)[offset:] or " "


def row_cells(r: ProcessRow, now: float, split_cells: dict[int, tuple[str, ...]], offset: int,
              tagged: bool) -> dict[str, str]:
    """Every column's text for one row (the table shows those `columns_for` picks); `offset`: how far the
    Command column is scrolled sideways; `tagged`: the process is tagged (`*` before its pid)."""
    p = r.process
    if p is None:
        return _launcher_cells(r, offset)
    if id(p.split) not in split_cells:
        split_cells[id(p.split)] = tuple(_short_cell(getattr(p.split, f)) for f in SPLIT_FIELDS)
    branch = ("└ " if r.last else "├ ") if r.depth else ""
    return {"gpu": r.place, "pid": f"*{p.pid}" if tagged else str(p.pid), "user": _printable(p.user or "?"),
            "command": branch + command_cell(p.command, offset),
            "used": _used_cell(p.used_bytes) + ("!" if p.split.inconsistent else ""),
            "sm": _pct(p.gpu_util_percent), "cpu": "?" if p.cpu_percent is None else f"{p.cpu_percent:.0f}", "rss": _short_cell(p.host_rss_bytes),
            "time": elapsed(p.started_at, now), **dict(zip(SPLIT_FIELDS, split_cells[id(p.split)], strict=True))}


def _launcher_cells(r: ProcessRow, offset: int) -> dict[str, str]:
    """A launcher's row: the ranks under it share it (from their ppid), with its user and command."""
    return {"gpu": "", "pid": str(r.pid), "user": _printable(r.user or "?"),
            "command": (f"[{r.children} ranks] " if offset <= 0 else "") + command_cell(r.command, offset),
            **dict.fromkeys(("used", "sm", "cpu", "rss", "time", *SPLIT_FIELDS), "")}


def _model_line(m: ModelStats, rate: ServerRates | None, pool_bytes: int | None) -> str:
    hit: float | Unavailable = rate.prefix_cache_hit_rate if rate is not None else m.prefix_cache_hit_rate
    cap = m.kv_capacity_tokens
    bits = [f"KV {_frac(m.kv_usage)}" + (f" of {cap:,} tok" if isinstance(cap, int) else "")
            + (f" = {human_bytes(pool_bytes)}" if pool_bytes is not None else ""), f"hit {_frac(hit)}",
            *(f"{label} {v if isinstance(v, int) else '?'}" for label, v in (("run", m.running_requests),
                                                                           ("wait", m.waiting_requests)))]
    if rate is not None and rate.preemptions:
        bits.append(f"preempted {rate.preemptions}")
    return "  ".join(bits)


def server_lines(servers: Sequence[ServerStats], rows: Rows, rates: Sequence[ServerRates],
                 width: int) -> tuple[list[Content], list[str]]:
    """A line per server (and one per model behind it when there are several), and the reasons for the notes."""
    lines: list[Content] = []
    notes: list[str] = []
    by_model = {(r.url, r.model_name, r.replica): r for r in rates}
    for s in servers:
        head = _server_head(s, rows)
        if not isinstance(s.pid, int):
            notes.append(f"{printable(s.url)} pid: {printable(s.pid.reason)}")
        if s.state != "ok":
            lines.append(head.truncate(width, ellipsis=True))
            lines.append(Content.assemble((f"  {s.state}: {printable(s.error or '')}", "$error")))  # wrapped, never cut
            continue
        if s.source_error:
            head = head.append(Content.assemble((f"  {printable(s.source_error)}", "$warning")))
        lines.append(head.truncate(width, ellipsis=True))
        lines += _model_lines(s, by_model, width)
        notes += [note for m in s.models for note in _model_notes(m, by_model.get((s.url, m.model_name, m.replica)))]
        notes.extend(map(printable, s.notes))
    return lines, notes


def _model_lines(s: ServerStats, by_model: dict[tuple[str, str, str | None], ServerRates],
                 width: int) -> list[Content]:
    """Each model behind a server apart: one line each, the name only where there are several."""
    several = len(s.models) > 1
    pool = s.kv_capacity_bytes if isinstance(s.kv_capacity_bytes, int) and not several else None
    lines = []
    for m in s.models:
        rate = by_model.get((s.url, m.model_name, m.replica))
        name = printable(m.model_name + (f" [{m.replica}]" if m.replica else "")) + "  " if several else ""
        lines.append(Content(f"  {name}" + _model_line(m, rate, pool)).truncate(width, ellipsis=True))
    return lines


def _server_head(s: ServerStats, rows: Rows) -> Content:
    """The server's engine, URL, and its pid with the GPUs its processes are on."""
    engine = s.engine if isinstance(s.engine, str) else "server"
    head = Content.assemble((f"{printable(engine)} ", "bold"), printable(s.url))
    if not isinstance(s.pid, int):
        return head
    pids = {s.pid, *s.child_pids}  # the server's listening pid and its children: "GPU0 pid 123" for each on a GPU
    joined = [f"GPU{key.split(':')[0]} pid {p.pid}" for key, p in rows.items() if p.pid in pids]
    return head.append(f"  pid {s.pid}" + (f" → {', '.join(joined)}" if joined else " (no GPU process)"))


def _model_notes(m: ModelStats, rate: ServerRates | None) -> list[str]:
    """Why a model's KV usage or hit rate reads '?'."""
    hit = rate.prefix_cache_hit_rate if rate is not None else m.prefix_cache_hit_rate
    return [printable(f"{m.model_name} {what}: {v.reason}") for what, v in (("KV", m.kv_usage), ("hit rate", hit))
            if isinstance(v, Unavailable)]


def process_notes(rows: Rows) -> list[str]:
    """Why cells read '?', each reason once with the pids it holds for: the processes without a probe first (one
    line, the whole split), then how a probe was joined where it was not by UUID, then every other reason."""
    pids: dict[str, list[int]] = {}
    for p in rows.values():
        for why in _reasons(p):
            pids.setdefault(why, []).append(p.pid)
    return _probe_notes(rows) + [f"{why} ({pids_text(held)})" for why, held in pids.items()]


def _probe_notes(rows: Rows) -> list[str]:
    """The processes without a probe, in one line (the whole split is unknown for them)."""
    unprobed = [p.pid for p in rows.values() if NO_PROBE in p.split.unavailable.values()]
    if not unprobed:
        return []
    if len(unprobed) < len(rows) or any(p.split.probe_device is not None for p in rows.values()):
        return [f"no probe in {pids_text(unprobed)}: add `import dltop.probe` for the split"]
    return [SPLIT_NEEDS_PROBE]


def _reasons(p: GpuProcess) -> list[str]:
    """Why a process's cells read '?', each once, "the pid" for its own (one note holds for several); first how a
    probe was joined where it was not by UUID."""
    split = p.split
    joined = [f"probe joined by {split.joined_by}"] if split.joined_by not in (None, "uuid", "pci") else []
    reasons = [*p.unavailable.values(), *([printable(split.inconsistent)] if split.inconsistent else []),
               *(v for k, v in split.unavailable.items() if k in SPLIT_FIELDS and v != NO_PROBE)]
    mine = f"pid {p.pid} "
    return joined + [why.replace(mine, "the pid ") for why in dict.fromkeys(reasons)]


def _rows_and_notes(gpus: tuple[GpuDevice, ...]) -> tuple[Rows, list[str]]:
    """Every process row's process (for the notes and the servers' lines), and the notes on them and on the GPUs
    (a headline leaves out the unified-memory note)."""
    rows = {r.key: r.process for r in select_processes(gpus) if r.process is not None}
    return rows, process_notes(rows) + [f"GPU{g.index}: {g.memory_pool_note}" for g in gpus if g.memory_pool_note]


class ProcessTable(RowTable):
    """The GPU processes, updated by a keyed diff so the cursor stays on its process. ← → scroll the Command
    column sideways (the pane's `scroll_command`), as nvitop does: every number column stays in place."""

    BINDINGS = [Binding("enter", "select_cursor", "", show=False)]  # the pane's d/⏎ Details labels it

    def action_cursor_left(self) -> None:
        self.query_ancestor(GpuPane).action_scroll_command(-1)

    def action_cursor_right(self) -> None:
        self.query_ancestor(GpuPane).action_scroll_command(1)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._shown: dict[str, tuple[str, ...]] = {}  # row key -> the cells the table shows
        self._wanted: dict[str, tuple[str, ...]] = {}  # the last cells asked for, before fitting
        self._order: list[str] = []  # the row keys in the table's order
        self._columns: tuple[str, ...] = ()  # the table's columns now
        self._width = 0
        self._command_width = 0

    def show_rows(self, wanted: dict[str, tuple[str, ...]], columns: tuple[str, ...]) -> None:
        """Remove rows gone, add new ones, and update only the cells whose text changed. Where the order changed
        (a sort, a filter, a tree, or a process that moved up its sort), the rows are laid out again in the new
        order and the cursor is found again by key: DataTable.sort keeps the cursor's index, not its row."""
        order = list(wanted)
        if (wanted, order, columns, self.size.width) == (self._wanted, self._order, self._columns, self._width):
            return  # the same cells at the same width: nothing to fit, nothing to touch
        if columns != self._columns:
            self.clear(columns=True)
            for key in columns:
                self.add_column(HEADERS[key], key=key)
            self._columns, self._command_width = columns, 0
            self._shown.clear()
        self._wanted, self._width = dict(wanted), self.size.width
        # The Command column gives way so every number column stays on screen at 80 columns.
        headers = tuple(HEADERS[c] for c in columns)
        # before the first layout the table is as wide as the terminal less the tab's padding
        self._command_width = fit_column(self, wanted, columns.index("command"), headers, columns,
                                         shorten_end, self._command_width, width=self.app.size.width - 2)
        if not self.rows:
            self._shown.clear()  # fit_column rebuilt the columns, or the table is new
        if not self._in_order(order):
            self._lay_out(wanted)
            return
        for stale in [k for k in self._shown if k not in wanted]:
            self.remove_row(stale)
            del self._shown[stale]
        self._order = order
        self._update_cells(wanted, columns)

    def _in_order(self, order: list[str]) -> bool:
        """Whether the rows shown and kept, then the new ones, are `order`: no row moved."""
        kept = [k for k in self._order if k in self._wanted and k in self._shown]
        return kept + [k for k in order if k not in self._shown] == order

    def _lay_out(self, wanted: dict[str, tuple[str, ...]]) -> None:
        """Every row again, in the new order; the cursor on the row it was on."""
        at = self.cursor_key()
        self.clear()
        self._shown.clear()
        for key, values in wanted.items():
            self.add_row(*map(_cell, values), key=key)
            self._shown[key] = values
        self._order = list(wanted)
        if at in wanted:
            self.move_cursor(row=self._order.index(at), animate=False)

    def _update_cells(self, wanted: dict[str, tuple[str, ...]], columns: tuple[str, ...]) -> None:
        """New rows added, changed cells updated. A column sized for "10%" must grow when "100%" arrives, not cut
        it; but asking the table to fit a cell narrower than its column re-measures the whole column, for every
        such cell: only a wider cell asks, and a column whose cells got narrower is measured once at the end."""
        narrower: set[int] = set()
        for key, values in wanted.items():
            shown = self._shown.get(key)
            if shown is None:
                self.add_row(*map(_cell, values), key=key)
            elif shown != values:
                for i, (col, old, new) in enumerate(zip(columns, shown, values, strict=True)):
                    if old == new:
                        continue
                    width = self.columns[ColumnKey(col)].content_width
                    self.update_cell(key, col, _cell(new), update_width=cell_len(new) > width)
                    if cell_len(new) < width:
                        narrower.add(i)
            self._shown[key] = values
        for i in narrower:
            key, values = max(wanted.items(), key=lambda kv: cell_len(kv[1][i]))
            self.update_cell(key, columns[i], _cell(values[i]), update_width=True)  # one measure of the column

    def cursor_key(self) -> str | None:
        """The key of the row under the cursor."""
        if not self.row_count:
            return None
        try:
            return self.coordinate_to_cell_key(Coordinate(self.cursor_row, 0)).row_key.value
        except Exception:  # a cursor past the rows
            return None


class DeviceLines(VerticalScroll):
    """The GPUs' lines, a Static each: Textual draws a widget again only where it changed and is on screen. No
    scroll bar (its partial cells read as stray pieces of a chart at 80x24): a tag under it says what is out of
    view."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._lines: list[Static] = []  # one per line of the GPUs, or the one saying why none
        self.wanted: list[Content] = []  # what each is to show
        self._painted_as: object = None  # the width, mode and pane height the lines were last drawn at
        self.series = GpuSeries()
        self._bars: dict[int, Memo[list[Content]]] = {}  # GPU index -> its bar (and legend), by memory_key
        self.compact = False  # one line per GPU, as drawn last

    def on_mount(self) -> None:
        # scrolled: the lines that came into view are handed to their Statics
        self.watch(self, "scroll_y", lambda: self.paint(), init=False)
        self.watch(self, "has_focus", lambda: self.paint(), init=False)

    def show_gpus(self, part: tuple[GpuDevice, ...] | Unavailable | None, view: View, width: int,
                  compact: bool | None, pane_height: int) -> None:
        """The GPUs' lines, or the one line saying why there are none. `compact`: one line per GPU, the full view,
        or (None) one line per GPU where the full view does not fit in the room the box has (half the pane)."""
        if isinstance(part, tuple) and part:
            lines = self._gpu_lines(part, view, width, compact, pane_height)
            self.show(lines, width, fixed=True, painted_as=(width, self.compact, pane_height), settled=self.compact)
            return
        if str(self.styles.height) != "auto":
            self.styles.height = "auto"  # was compact: one line says why there are none
        if part is None:
            line = Content.assemble(("GPUs: not sampled", "dim"))
        elif isinstance(part, Unavailable):
            # No GPU here (a state: "0", and why, not in a warning's colour), or NVML cannot be used: one line
            # saying so (wrapped where it is long), where the GPUs would be.
            line = (Content.assemble(("GPUs: 0", "bold"), (f" — {part.reason}", "dim")) if part.absent
                    else Content.assemble(("GPUs: ", "bold"), (part.reason, "$warning")))
        else:
            line = Content.assemble(("GPUs: ", "bold"), ("NVML lists none", "$warning"))
        self.show([line], width, fixed=False, painted_as=(width, self.compact, pane_height))

    def _gpu_lines(self, gpus: tuple[GpuDevice, ...], view: View, width: int, compact: bool | None,
                   pane_height: int) -> list[Content]:
        """Headline, bar, legend and sparklines per GPU; or, compact, one line per GPU."""
        self.series.update(view.history)
        room = max(3, pane_height // 2 - 1)
        self.compact = compact if compact is not None else full_height(gpus) > room
        # compact: exactly its lines tall (an auto height kept a row for a scrollbar it never shows)
        height = f"{min(len(gpus), room + 1)}" if self.compact else "auto"
        if str(self.styles.height) != height:
            self.styles.height = height
        if self.compact:
            return [compact_line(g, width, self._bar(g, width)[0]) for g in gpus]
        lines: list[Content] = []
        for g in gpus:
            head = headline(g, width)
            lines += head
            if len(head) == 1:  # else its calls fail: the reason is its only line
                lines += self._bar(g, width)
                lines.append(spark_line(g, self.series, width))
        return lines

    def _bar(self, g: GpuDevice, width: int) -> list[Content]:
        """A GPU's bar lines (compact: one line, the numbers beside it added by compact_line), drawn again only when
        its memory changed (the numbers beside them move every tick)."""
        memo = self._bars.setdefault(g.index, Memo())
        return memo.get((memory_key(g, width), self.compact),
                        lambda: [compact_bar(g, width)] if self.compact else memory_lines(g, width))

    def show(self, lines: list[Content], width: int, fixed: bool, painted_as: object, settled: bool = False) -> None:
        """Show `lines`. `fixed`: each line's Static gets a height of its own, so its update skips the layout pass.
        `painted_as`: what, when it changes (a width, a mode, the pane's height), moves what is on screen. `settled`:
        the box is as tall as its lines (compact), so what is out of view changes only where they moved."""
        moved = len(self._lines) != len(lines)
        while len(self._lines) > len(lines):
            self._lines.pop().remove()
        if len(self._lines) < len(lines):
            # each made with its line: one set after the mount is drawn a frame later (the first frame of the
            # tab came without the GPUs' lines)
            new = [Static() for _ in range(len(lines) - len(self._lines))]
            for widget, line in zip(new, lines[len(self._lines):], strict=True):
                set_content(widget, line)
            self.mount_all(new)
            self._lines += new
        moved = self._heights(lines, width, fixed) or moved or painted_as != self._painted_as
        self._painted_as = painted_as
        self.wanted = lines
        # which are on screen is not known until Textual lays them out; the tag of what is out of view is said
        # again where the lines or the box may have moved
        self.paint(everywhere=moved, tag=moved or not fixed or not settled)

    def _heights(self, lines: list[Content], width: int, fixed: bool) -> bool:
        """Each line's Static as tall as its line wraps to (`fixed`), else auto; True where one changed."""
        moved = False
        for widget, line in zip(self._lines, lines, strict=True):
            now = widget.styles.height
            if fixed:
                height = max(1, -(-line.cell_length // width))  # wrapped, never cut: a lost GPU's reason
                if now is None or not now.is_cells or now.value != height:
                    widget.styles.height = height
                    moved = True
            elif now is not None and now.is_cells:
                widget.styles.height = "auto"
        return moved

    def paint(self, everywhere: bool = False, tag: bool = True) -> None:
        """Hand the lines on screen to their Statics; one scrolled out of view gets its line when it scrolls back
        in (an update of a widget off screen makes Textual rebuild its map of every widget on the screen)."""
        view = self.scrollable_content_region.height
        top = 0
        for widget, line in zip(self._lines, self.wanted, strict=True):
            height = widget.styles.height.value if widget.styles.height and widget.styles.height.is_cells else 0
            if everywhere or not view or not height or (top < self.scroll_y + view and top + height > self.scroll_y):
                set_content(widget, line)
            top += int(height)
        if tag:
            self.call_after_refresh(self._tag)  # the lines' heights are laid out by then

    def _tag(self) -> None:
        """Say how many lines of the GPUs are above and below the view (where the scroll bar would have)."""
        if self.parent is None:
            return
        above = round(self.scroll_y)
        below = max(0, self.virtual_size.height - above - self.size.height) if self.size.height else 0
        tag = self.parent.query_one("#gpu-devices-tag", Static)
        if above or below:
            where = f"↑{above} ↓{below}" if above and below else f"↑{above}" if above else f"↓{below}"
            keys = "↑/↓ scroll them" if self.has_focus else "Tab to them to scroll, or the mouse wheel"
            set_content(tag, Content.assemble(f"{where} lines of GPUs out of view: {keys}"))
        tag.display = bool(above or below)


def full_height(gpus: Sequence[GpuDevice]) -> int:
    """The lines of the full view: per GPU its headline, its bar (and one per MIG instance) and legend, its
    sparklines; a GPU whose calls fail, its headline and the reason."""
    return sum(2 if g.memory_used_bytes is None and g.memory_total_bytes is None else
               2 + (1 + len(g.mig_devices) if g.mig_devices else 2) for g in gpus)


def processes_key(gpus: tuple[GpuDevice, ...]) -> tuple[object, ...]:
    """What the process rows and their notes are made of: each GPU's processes and its MIG instances', its
    memory pool's note."""
    return tuple((g.index, g.memory_pool_note, g.processes, tuple((m.mig_index, m.processes) for m in g.mig_devices))
                 for g in gpus)


# What each key needs to act (GpuPane._conditions); a key not named always acts.
NEEDS = {"add_server": ("live",), "remove_server": ("live", "servers"), "cancel_input": ("input",),
         "gpu_details": ("gpus",), "signal": ("writable", "rows"), "environ": ("live", "rows"), "untag_all": ("tags",),
         "tag": ("rows",), "sort": ("rows or filter",), "reverse": ("rows or filter",), "tree": ("rows or filter",)}
# Keys that read or change the system now, where the moment shown is not now (check_action greys them out): the
# View's reason that holds them back (`frozen` or `past`), and what they say then.
REFUSED = {"k": ("frozen", "signal: {}; nothing may change the system from here"),
           "e": ("past", "environment: {}; it is read from the running process"),
           "a": ("past", "a: {}; the servers asked change live only"),
           "x": ("past", "x: {}; the servers asked change live only")}


class GpuPane(Pane):
    """Per GPU: memory bar, sparklines; the processes and their split; inference servers' KV pools."""

    PANE_ID = "gpu"
    TITLE = "GPU"
    HELP = ("GPUs from NVML (nvidia-smi's library) or amdsmi; no CUDA context. The bar: each process's memory "
            "(its split where the probe gives it: Wts weights, KV, Cache = reserved - allocated, Other torch, "
            "NonT = used - torch reserved), memory no process holds, free. CPU% is of one core.")
    DEFAULT_CSS = """
    #gpu-devices { height: auto; max-height: 50%; scrollbar-size-vertical: 0; }
    #gpu-devices > Static { height: auto; }
    #gpu-devices-tag { height: 1; display: none; color: $text-muted; }
    #gpu-query { height: 1; color: $text-muted; }
    #gpu-servers-box { height: auto; max-height: 25%; }
    #gpu-servers { height: auto; }
    #gpu-notes-box { height: auto; max-height: 20%; }
    #gpu-notes { height: auto; color: $text-muted; }
    #gpu-table { height: 1fr; min-height: 3; }
    #gpu-command { height: auto; max-height: 2; color: $text-muted; padding: 0 1; }
    #gpu-filter { height: 1; border: none; padding: 0 1; }
    #gpu-server-input, #gpu-filter { display: none; }
    #gpu-server-input.-shown, #gpu-filter.-shown { display: block; }
    """
    BINDINGS = [
        Binding("slash", "filter", "Filter", key_display="/", id="gpu.filter"),
        Binding("o", "sort", "Sort", id="gpu.sort"),
        Binding("O", "reverse", "Reverse sort", show=False, id="gpu.reverse"),
        Binding("g", "tree", "Tree", show=False, id="gpu.tree"),
        Binding("k", "signal", "Signal", id="gpu.signal"),
        Binding("s", "tag", "Tag", id="gpu.tag"),
        Binding("e", "environ", "Environment", show=False, id="gpu.environ"),
        Binding("S", "untag_all", "Untag all", show=False, id="gpu.untag_all"),
        # the focused table's ← → (ProcessTable) do it; these name them in ? and the palette
        Binding("right", "scroll_command(1)", "Scroll commands", key_display="←/→", show=False,
                id="gpu.command_right"),
        Binding("left", "scroll_command(-1)", "", show=False, id="gpu.command_left"),
        # Out of the footer (help and palette have them): at 80 columns it holds the process table's keys.
        Binding("c", "compact", "Compact", show=False, id="gpu.compact"),
        Binding("a", "add_server", "Add server", id="gpu.add_server"),
        Binding("x", "remove_server", "Remove server", show=False, id="gpu.remove_server"),
        Binding("escape", "cancel_input", "Cancel", id="gpu.cancel"),  # a box, or the filter
        # Enter on a process row opens its GPU's details too (the table's own Enter, RowSelected below: the
        # focused table's Enter hides this one's label, so d is the key the footer shows)
        Binding("d", "gpu_details", "Details", key_display="d/⏎", id="gpu.details"),
        Binding("enter", "gpu_details", "", show=False, id="gpu.details_enter"),  # no label: d's is it
    ]
    can_focus = True  # the keys work where no GPU is there to list (a table to focus)

    def __init__(self) -> None:
        super().__init__()
        self._rows: Memo[tuple[Rows, list[str]]] = Memo()  # every process row and the notes, by the processes
        # the table's columns, cells and rows, by the processes, the query and the width; until a Time cell turns
        self._cells: Memo[tuple[tuple[str, ...], dict[str, tuple[str, ...]], list[ProcessRow]]] = Memo()
        self._cells_until = 0.0
        self._adding = True  # what the input box is for: adding a server, or naming one to remove
        self._details: GpuDetailsScreen | None = None  # the details screen while it is open: handed each view
        self.query_state = ProcessQuery()  # the filter, sort and tree the user asked for
        self.compact: bool | None = None  # None: compact where the full view does not fit; else as `c` set it
        self._selected: dict[str, ProcessRow] = {}  # row key -> its row, as the table shows them
        self.command_offset = 0  # how far the Command column is scrolled sideways (← →), in cells
        self.tagged: dict[TagKey, GpuProcess] = {}  # the processes tagged (s)

    def compose(self) -> ComposeResult:
        yield DeviceLines(id="gpu-devices")
        yield Static(id="gpu-devices-tag")
        yield Static(id="gpu-query")
        yield ProcessTable(id="gpu-table", cursor_type="row", zebra_stripes=False)
        yield Static(id="gpu-command")
        yield Input(id="gpu-filter", placeholder="filter: pid, user, command or GPU (Esc clears, Enter keeps)")
        with VerticalScroll(id="gpu-servers-box"):
            yield Static(id="gpu-servers")
        yield Input(id="gpu-server-input")
        with VerticalScroll(id="gpu-notes-box"):
            yield Static(id="gpu-notes")

    def focus_default(self) -> None:
        table = self.query_one("#gpu-table", DataTable)
        (table if table.display else self).focus()

    def _typing(self) -> bool:
        return self.box_shown("#gpu-server-input") or self.box_shown("#gpu-filter")

    def _conditions(self) -> dict[str, bool]:
        """Whether each condition the keys need (NEEDS) holds now."""
        view = self.view
        live = view is None or not view.replay
        gpus = view.snapshot.gpus if view is not None else None
        # signal: greyed out where nothing may change the system; k there says why (on_key)
        return {"live": live, "writable": live and not (view is not None and view.read_only),
                "rows": bool(self._selected), "rows or filter": bool(self._selected or self.query_state.filter),
                "servers": bool(self._servers()), "tags": bool(self.tagged), "gpus": isinstance(gpus, tuple) and bool(gpus),
                "input": self._typing() or bool(self.query_state.filter)}

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        needs = NEEDS.get(action, ())
        conditions = self._conditions() if needs else {}
        return all(conditions[need] for need in needs)

    def on_key(self, event: events.Key) -> None:
        """A key held back by the moment shown (REFUSED) says why."""
        reason, said = REFUSED.get(event.key, ("", ""))
        why = getattr(self.view, reason, None) if reason else None
        if not why or (event.key in ("a", "x") and self._typing()):
            return
        event.stop()
        self.app.notify(said.format(why), severity="warning")

    # -- the process table: filter, sort, tree; the pane keeps the query, select_processes does the work --------

    def _requery(self, query: ProcessQuery) -> None:
        self.query_state = query
        self._rerender()
        self.refresh_bindings()

    def action_filter(self) -> None:
        """Filter the process rows by text (pid, user, command, GPU) as it is typed."""
        box = self.query_one("#gpu-filter", Input)
        box.value = self.query_state.filter
        box.add_class("-shown")
        # at once, not after this event (Widget.focus waits its turn): keys typed right after / go to the box,
        # not to the app (a "5" would switch to tab 5)
        self.screen.set_focus(box)

    @on(Input.Changed, "#gpu-filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        event.stop()
        if event.value != self.query_state.filter:
            self._requery(replace(self.query_state, filter=event.value))

    @on(Input.Submitted, "#gpu-filter")
    def _filter_kept(self, event: Input.Submitted) -> None:
        event.stop()
        # the filter stays (the line above the table says it; Esc clears it, / edits it), its box goes
        self.query_one("#gpu-filter", Input).remove_class("-shown")
        self.focus_default()
        self.refresh_bindings()

    def action_sort(self) -> None:
        """Sort by the next column: memory, SM %, CPU %, host RSS, running time, pid, user, command, GPU."""
        self._requery(self.query_state.next_sort())
        self.app.notify(self.query_state.describe(), timeout=2)

    def action_reverse(self) -> None:
        """Reverse the sort."""
        self._requery(replace(self.query_state, reverse=not self.query_state.reverse))

    def action_tree(self) -> None:
        """Group ranks under their launcher (torchrun agent, mp.spawn parent), or list them flat again."""
        self._requery(replace(self.query_state, tree=not self.query_state.tree))

    def action_compact(self) -> None:
        """One line per GPU, or the full view again (by default compact where the full view does not fit)."""
        self.compact = not self.query_one("#gpu-devices", DeviceLines).compact
        self._rerender()

    def action_scroll_command(self, step: int) -> None:
        """Scroll the Command column sideways (← →): the whole command lines, `COMMAND_STEP` cells a press; back
        at the start, what identifies each process again."""
        longest = max((len(_printable(r.command if r.process is None else r.process.command or ""))
                       for r in self._selected.values()), default=0)
        offset = max(0, min(self.command_offset + step * COMMAND_STEP, longest - COMMAND_STEP))
        if offset != self.command_offset:
            self.command_offset = offset
            self._rerender()

    @on(DataTable.RowHighlighted, "#gpu-table")
    def _show_selected(self) -> None:
        """The selected process's whole command line under the table (two lines at most, escaped)."""
        line = self.query_one("#gpu-command", Static)
        row = self.selected_row() if self.query_one("#gpu-table", ProcessTable).display else None
        if row is None:
            line.display = False
            return
        command = row.process.command if row.process is not None else row.command
        user = row.process.user if row.process is not None else row.user
        width = max(20, (self.query_one("#gpu-table").size.width or self.size.width or self.app.size.width - 2) - 2)
        text = f"{row.pid} {user or '?'}: {command or '?'}"
        set_content(line, Content("\n".join(shorten_lines(text, width, 2))))
        line.display = True

    def selected_row(self) -> ProcessRow | None:
        """The row under the table's cursor."""
        return self._selected.get(self.query_one("#gpu-table", ProcessTable).cursor_key() or "")

    def action_tag(self) -> None:
        """Tag the selected process, or untag it (on a launcher's row: its ranks), and go to the next row: `k`
        signals the tagged ones together."""
        row = self.selected_row()
        if row is not None:
            toggle_tags(self.tagged, row, self._selected.values())
            self._rerender()
            self.refresh_bindings()
            self.query_one("#gpu-table", ProcessTable).action_cursor_down()

    def action_untag_all(self) -> None:
        """Untag every process."""
        self.tagged.clear()
        self._rerender()
        self.refresh_bindings()

    def action_signal(self) -> None:
        """Send the selected process, or the tagged ones, a signal: a dialog offers SIGTERM (first), SIGKILL and
        SIGINT."""
        ask_signal(self, self.selected_row(), list(self.tagged.values()), self.action_untag_all)

    def action_environ(self) -> None:
        """Show the selected process's environment (its owner's or root's to read; secrets masked)."""
        row = self.selected_row()
        if row is not None:
            show_environment(self.app, row)

    # -- watching servers: the app changes the settings; the pane only asks ------------------------------------

    def _servers(self) -> list[str]:
        servers = self.view.snapshot.servers if self.view is not None else None
        return [s.url for s in servers] if isinstance(servers, tuple) else []

    def _ask(self, adding: bool, value: str, placeholder: str) -> None:
        box = self.query_one("#gpu-server-input", Input)
        self._adding = adding
        box.placeholder = placeholder
        box.value = value
        box.add_class("-shown")
        box.focus()

    def action_add_server(self) -> None:
        """Ask for a vLLM or SGLang server to scrape (host:port, or its /metrics URL)."""
        self._ask(True, "", "server to scrape: host:port or http://host:port/metrics (Enter adds, Esc cancels)")

    def action_remove_server(self) -> None:
        """Ask which server to stop scraping (the first is filled in)."""
        servers = self._servers()
        self._ask(False, servers[0] if servers else "",
                  f"server to stop scraping, one of: {', '.join(servers)} (Enter removes, Esc cancels)")

    def action_gpu_details(self, index: int | None = None) -> None:
        """Open a GPU's details: the selected process's GPU, with that process's history first; else the first."""
        if self.view is None:
            return
        gpus = self.view.snapshot.gpus
        process: tuple[int, int | None] | None = None
        row = self.selected_row() if index is None and self.query_one("#gpu-table", ProcessTable).display else None
        if row is not None and row.process is not None:
            index, process = int(row.place.split("/")[0]), (row.process.pid, row.process.start_time_ticks)
        if index is None:
            index = gpus[0].index if isinstance(gpus, tuple) and gpus else 0
        from dltop.tui.screens.gpu_details import GpuDetailsScreen

        self._details = GpuDetailsScreen(self.view, index, process)
        self.app.push_screen(self._details, lambda _: setattr(self, "_details", None))

    @on(DataTable.RowSelected, "#gpu-table")
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        if (event.row_key.value or "")[:1].isdigit():
            self.action_gpu_details()

    def action_cancel_input(self) -> None:
        """Close the server box without doing anything, or clear and close the filter."""
        self.query_one("#gpu-server-input", Input).remove_class("-shown")
        box = self.query_one("#gpu-filter", Input)
        box.remove_class("-shown")
        box.value = ""
        if self.query_state.filter:
            self._requery(replace(self.query_state, filter=""))
        self.focus_default()

    @on(Input.Submitted, "#gpu-server-input")
    def _server_submitted(self, event: Input.Submitted) -> None:
        self.action_cancel_input()
        text = event.value.strip()
        if text:
            self.post_message(ServerAddRequested(text) if self._adding else ServerRemoveRequested(text))

    def _table_cells(self, gpus: tuple[GpuDevice, ...], now: float,
                     ) -> tuple[tuple[str, ...], dict[str, tuple[str, ...]], list[ProcessRow]]:
        """The table's columns and each row's cells (the query's rows, in its order, with how long each process
        has run as of `now`), and the rows; the cells hold until the first Time cell turns."""
        table = self.query_one("#gpu-table", ProcessTable)
        selected = select_processes(gpus, self.query_state)
        columns = columns_for(selected, table.size.width or self.size.width)
        split_cells: dict[int, tuple[str, ...]] = {}
        wanted: dict[str, tuple[str, ...]] = {}
        self._cells_until = float("inf")
        for r in selected:
            cells_ = row_cells(r, now, split_cells, self.command_offset,
                               r.process is not None and tag_key(r.process) in self.tagged)
            wanted[r.key] = tuple(cells_[c] for c in columns)
            if r.process is not None:
                self._cells_until = min(self._cells_until, elapsed_until(r.process.started_at, now))
        self._selected = {r.key: r for r in selected}
        untag_gone(self.tagged, selected)
        return columns, wanted, selected

    def render_view(self, view: View) -> None:
        if self._details is not None:
            self._details.show(view)  # the open details follow the numbers
        part = view.snapshot.gpus
        gpus: tuple[GpuDevice, ...] = part if isinstance(part, tuple) else ()
        # the width inside the box's scrollbar gutter; before the first layout (no size yet), the terminal's less
        # the tab's padding, what the layout will give
        box = self.query_one("#gpu-devices", DeviceLines)
        width = max(20, box.scrollable_content_region.width or self.size.width or self.app.size.width - 2)
        box.show_gpus(part, view, width, self.compact, self.size.height)
        table = self.query_one("#gpu-table", ProcessTable)
        table.display = bool(gpus)
        # Made again only when the processes change; the table's cells also when the query or the width change,
        # or a Time cell's minute turns.
        made_of = processes_key(gpus)
        rows, notes = self._rows.get(made_of, lambda: _rows_and_notes(gpus))
        now = view.snapshot.ts
        if now >= self._cells_until:
            self._cells.clear()
        columns, wanted, selected = self._cells.get((made_of, self.query_state, table.size.width or self.size.width,
                                                     self.command_offset, frozenset(self.tagged)),
                                                    lambda: self._table_cells(gpus, now))
        table.show_rows(dict(wanted), columns)
        self._show_selected()
        self._show_query(bool(gpus), len([r for r in selected if r.process is not None]), len(rows))
        self._show_servers_and_notes(view, rows, list(notes), width)

    def _show_query(self, any_gpu: bool, shown: int, total: int) -> None:
        """The filter, sort and tree asked for, and how many processes they leave, where that says anything."""
        query_line = self.query_state.describe() + (f"  {shown} of {total} processes" if shown != total else "")
        if self.command_offset:
            query_line += f"  commands whole, from cell {self.command_offset + 1} (← →)"
        if self.tagged:
            query_line += f"  {len(self.tagged)} tagged: k signals them, S untags"
        query_widget = self.query_one("#gpu-query", Static)
        set_content(query_widget, Content(printable(query_line)))
        query_widget.display = any_gpu and (self.query_state != ProcessQuery() or shown != total
                                            or bool(self.command_offset) or bool(self.tagged))

    def _show_servers_and_notes(self, view: View, rows: Rows, notes: list[str], width: int) -> None:
        """The inference servers' KV pools, and the notes (on the processes, the GPUs and the servers)."""
        servers = view.snapshot.servers if isinstance(view.snapshot.servers, tuple) else ()
        lines: list[Content] = []
        if servers:
            lines, more = server_lines(servers, rows, server_rates(view.previous, view.snapshot), width)
            notes += more
        set_content(self.query_one("#gpu-servers", Static), Content("\n").join(lines))
        self.query_one("#gpu-servers-box").display = bool(servers)
        set_content(self.query_one("#gpu-notes", Static), Content("; ".join(notes)))
        self.query_one("#gpu-notes-box").display = bool(notes)
