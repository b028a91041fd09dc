"""`dltop report`: the postmortem of a recording in a terminal — peaks, the event timeline, charts, hints.

Everything comes from the recorded Snapshots and events: the peaks from every sample of the range, the charts
(plotext) from the same samples thinned to the chart's width, the hints from the recorder's hint events.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

import plotext

from dltop.fmt import (
    human_bytes,
    human_duration,
    percent_text,
    plural,
    printable,
    printable_lines,
    shorten_middle,
)
from dltop.model import CgroupMemory, DatasetsPart, MemoryPart, Snapshot
from dltop.model.datasets import DatasetResidency
from dltop.model.gpu import SPLIT_FIELDS
from dltop.recorder.reader import RecordedEvent, Recording
from dltop.text.events import describe_event

MAX_EVENTS = 60
GAP_INTERVALS = 3  # no sample for longer than this many intervals is a gap in the recording
# What a postmortem looks for first: a long recording's timeline keeps these before the rest (hint firings are
# summarised under "Hints that fired", not listed one by one).
RANK = {"oom_kill": 0, "marker": 1, "action": 2, "gap": 3, "gpu_process": 4, "start": 5, "stop": 5}
CHART_HEIGHT = 14
SPLIT_NAMES = dict(zip(SPLIT_FIELDS, ("weights", "KV cache", "allocator cache", "other torch", "non-torch"),
                       strict=True))


@dataclass
class _Peak:
    value: float | None = None
    ts: float = 0.0

    def see(self, value: float | None, ts: float, lowest: bool = False) -> None:
        if value is None:
            return
        if self.value is None or (value < self.value if lowest else value > self.value):
            self.value, self.ts = value, ts


@dataclass
class _Series:
    """Time and value pairs of one chart line."""

    ts: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    def add(self, ts: float, value: float | None) -> None:
        if value is not None:
            self.ts.append(ts)
            self.values.append(value)


class _Collected:
    """One pass over the samples: the peaks and the chart lines."""

    def __init__(self, interval_s: float = 1.0) -> None:
        self.interval_s = interval_s
        self.holes: list[tuple[float, float]] = []  # (last sample before, first after) where none came for > 3 intervals
        self.samples = 0
        self.first: Snapshot | None = None
        self.last: Snapshot | None = None
        self.peaks: dict[str, _Peak] = {}
        self.totals: dict[str, float] = {}  # what a peak is out of (RAM, a GPU's memory, a cgroup's limit)
        self.charts: dict[str, dict[str, _Series]] = {"page cache": {}, "GPU memory": {}, "dataset residency": {}}

    def peak(self, name: str, value: float | None, ts: float, lowest: bool = False) -> None:
        self.peaks.setdefault(name, _Peak()).see(value, ts, lowest)

    def line(self, chart: str, name: str, ts: float, value: float | None) -> None:
        self.charts[chart].setdefault(name, _Series()).add(ts, value)

    def see(self, s: Snapshot) -> None:
        if self.last is not None and s.ts - self.last.ts > GAP_INTERVALS * self.interval_s:
            self.holes.append((self.last.ts, s.ts))
        self.samples += 1
        self.first = self.first or s
        self.last = s
        mem = s.memory
        if isinstance(mem, MemoryPart):
            self.peak("page cache (Cached)", mem.cached_bytes, s.ts)
            self.peak("dirty", mem.dirty_bytes, s.ts)
            self.peak("writeback", mem.writeback_bytes, s.ts)
            self.peak("MemAvailable (lowest)", mem.available_bytes, s.ts, lowest=True)
            if mem.total_bytes:
                self.totals["page cache (Cached)"] = self.totals["MemAvailable (lowest)"] = mem.total_bytes
            self.line("page cache", "cached", s.ts, _gib(mem.cached_bytes))
            self.line("page cache", "dirty", s.ts, _gib(mem.dirty_bytes))
            if isinstance(mem.cgroup, CgroupMemory):
                self.peak(f"cgroup {mem.cgroup.path}", mem.cgroup.current_bytes, s.ts)
                if mem.cgroup.max_bytes:
                    self.totals[f"cgroup {mem.cgroup.path}"] = mem.cgroup.max_bytes
        if isinstance(s.gpus, tuple):
            split = dict.fromkeys(SPLIT_FIELDS, 0)
            known = set()
            for g in s.gpus:
                name = f"GPU {g.index} used"
                self.peak(name, g.memory_used_bytes, s.ts)
                if g.memory_total_bytes:
                    self.totals[name] = g.memory_total_bytes
                self.line("GPU memory", f"GPU {g.index} used", s.ts, _gib(g.memory_used_bytes))
                for p in g.processes if isinstance(g.processes, tuple) else ():
                    for f in SPLIT_FIELDS:
                        v = getattr(p.split, f)
                        if v is not None:
                            split[f] += v
                            known.add(f)
            for f in SPLIT_FIELDS:  # the split where probes or servers told it; never guessed
                if f in known:
                    self.line("GPU memory", SPLIT_NAMES[f], s.ts, _gib(split[f]))
        if isinstance(s.datasets, DatasetsPart):
            for d in s.datasets.paths:
                if isinstance(d, DatasetResidency) and d.resident_fraction is not None:
                    self.peak(f"{d.path} resident (lowest)", d.resident_fraction, s.ts, lowest=True)
                    self.line("dataset residency", os.path.basename(d.path.rstrip("/")) or d.path, s.ts,
                              d.resident_fraction * 100)


def _gib(n: int | None) -> float | None:
    return None if n is None else n / (1 << 30)


def report(rec: Recording, t0: float | None = None, t1: float | None = None, width: int | None = None,
           color: bool = False) -> str:
    """The whole postmortem as text."""
    width = max(60, width or _terminal_width())
    interval = rec.meta.get("interval_s")
    c = _Collected(float(interval) if isinstance(interval, int | float) and 0 < interval <= 3600 else 1.0)
    for s in rec.range(t0, t1):
        c.see(s)
    events = [e for e in rec.events(t0, t1) if e.kind != "view"]  # what was on screen is no event of the job
    out: list[str] = []
    gaps = _gaps(rec, c, rec.events())
    out += _header(rec, c, events, gaps)
    out += _peaks(c)
    out += _gap_lines(gaps, c)
    out += _timeline(events, c)
    out += _hints(events, t1 if t1 is not None else (c.last.ts if c.last else None))
    # The recording came from elsewhere: its names and texts are escaped here (in colour the report is written
    # past the CLI's escaping writer, its own colours intact).
    out = [printable_lines(line) for line in out]
    for title, unit in (("page cache", "GiB"), ("GPU memory", "GiB"), ("dataset residency", "% resident")):
        out += _chart(title, unit, {printable(k): v for k, v in c.charts[title].items()}, width, color,
                      [(a, b) for a, b, _ in gaps])
    return "\n".join(out) + "\n"


def _terminal_width() -> int:
    try:
        return os.get_terminal_size().columns
    except OSError:
        return 100


def _when(ts: float, span_s: float) -> str:
    return time.strftime("%m-%d %H:%M:%S" if span_s > 86400 else "%H:%M:%S", time.localtime(ts))


def _zone(ts: float) -> str:
    return time.strftime("%Z (UTC%z)", time.localtime(ts))


def _header(rec: Recording, c: _Collected, events: list[RecordedEvent],
            gaps: list[tuple[float, float, str]]) -> list[str]:
    meta = rec.meta
    lines = [f"dltop report: {rec.path}"]
    if c.first is None or c.last is None:
        return [*lines, "no samples in this range", ""]
    span = c.last.ts - c.first.ts
    lines.append(f"{meta.get('host') or c.first.host}: {time.strftime('%Y-%m-%d %H:%M:%S %Z', time.localtime(c.first.ts))}"
                 f" to {_when(c.last.ts, span)} {time.strftime('%Z', time.localtime(c.last.ts))} "
                 f"({human_duration(span)}), {plural(c.samples, 'sample')}"
                 f" every {meta.get('interval_s', '?')} s, {plural(len(events), 'event')}; times are {_zone(c.last.ts)}")
    ooms = [e for e in events if e.kind == "oom_kill"]
    if ooms:
        kills = sum(int(e.data["kills"]) for e in ooms if isinstance(e.data.get("kills"), int)) or len(ooms)
        lines.append(f"OOM KILLS: {kills} ({plural(len(ooms), 'event')}, first at {_when(ooms[0].ts, span)}, "
                     f"last at {_when(ooms[-1].ts, span)})")
    for ts in _unclean_ends(rec, events):
        lines.append(f"ended without a stop at {_when(ts, span)}: the recorder was killed or the machine went down")
    if gaps:
        lost = sum(b - a for a, b, _ in gaps)
        lines.append(f"gaps: {plural(len(gaps), 'gap')}, {human_duration(lost)} without samples (below)")
    gpus = meta.get("gpus")
    if isinstance(gpus, list) and gpus:
        names = sorted({str(g.get("name")) for g in gpus if isinstance(g, dict)})
        lines.append(f"GPUs: {len(gpus)} x {', '.join(names)}")
    if rec.damage.total or rec.damage.indexes:
        lines.append(f"damaged: {rec.damage.note()}")
    return [*lines, ""]


def _peaks(c: _Collected) -> list[str]:
    if not c.peaks:
        return []
    span = (c.last.ts - c.first.ts) if c.first and c.last else 0.0
    out = ["Peaks"]
    for name, p in c.peaks.items():
        if p.value is None:
            continue
        if name.endswith("resident (lowest)"):
            value = percent_text(p.value * 100, 1)
        else:
            total = c.totals.get(name)
            value = human_bytes(p.value) + (f" of {human_bytes(total)}" if total else "")
        out.append(f"  {shorten_middle(name, 40):<40} {value:>24}  at {_when(p.ts, span)}")
    return [*out, ""]


def _unclean_ends(rec: Recording, events: list[RecordedEvent]) -> list[float]:
    """Where a recorder's run ended without its stop event (killed, or the machine went down): the time of its
    last event or sample before the next start. The run still going (its directory locked) is not one."""
    out: list[float] = []
    times = rec.times()
    open_since: float | None = None
    for e in events:
        if e.kind == "start":
            if open_since is not None:
                before = [t for t in times if open_since <= t < e.ts]
                out.append(before[-1] if before else open_since)
            open_since = e.ts
        elif e.kind == "stop":
            open_since = None
    if open_since is not None and not _still_recording(rec):
        out.append(max([open_since, *(t for t in times[-1:] if t >= open_since)]))
    return out


def _still_recording(rec: Recording) -> bool:
    from dltop.recorder import store

    directory = rec.path if os.path.isdir(rec.path) else os.path.dirname(rec.path)
    try:
        return store.lock_held(directory)
    except (OSError, ValueError):
        return False


def _gaps(rec: Recording, c: _Collected, events: list[RecordedEvent]) -> list[tuple[float, float, str]]:
    """Each stretch without samples (longer than GAP_INTERVALS intervals), with its cause: samples a failed write
    or a full queue lost (the writer's "gap" events), a damaged frame (its samples, from the index), or the
    recorder not running (a stop, or a start after a run that ended without one)."""
    out = []
    for a, b in c.holes:
        causes = []
        for e in events:
            if e.kind == "gap" and isinstance(e.data.get("samples"), int) and a <= e.ts <= b + c.interval_s:
                causes.append(f"{plural(e.data['samples'], 'sample')} not written ({e.data.get('cause')})")
        frames = [(t0, t1, n) for t0, t1, n in rec.damage.spans.values() if t0 < b and t1 > a]
        if frames:
            causes.append(f"{plural(sum(n for *_, n in frames), 'sample')} in "
                          f"{plural(len(frames), 'damaged frame')}")
        inside = {e.kind for e in events if a < e.ts < b}
        if "start" in inside:
            causes.append("the recorder was not running" + ("" if "stop" in inside else " (it ended without a stop)"))
        out.append((a, b, "; ".join(causes) or "no samples (the recorder was stalled or stopped)"))
    return out


def _gap_lines(gaps: list[tuple[float, float, str]], c: _Collected) -> list[str]:
    if not gaps:
        return []
    span = (c.last.ts - c.first.ts) if c.first and c.last else 0.0
    out = ["Gaps"]
    for a, b, why in gaps:
        missing = max(0, round((b - a) / c.interval_s) - 1)
        out.append(f"  {_when(a, span)} to {_when(b, span)}  {human_duration(b - a)}, ~{plural(missing, 'sample')}"
                   f" missing: {why}")
    return [*out, ""]


def _timeline(events: list[RecordedEvent], c: _Collected) -> list[str]:
    if not events:
        return ["Events: none", ""]
    span = (c.last.ts - c.first.ts) if c.first and c.last else 0.0
    hints = [e for e in events if e.kind == "hint"]
    listed = [e for e in events if e.kind != "hint"]

    # The ones a postmortem looks for first (an OOM kill late in a week is kept over the hundredth GPU process
    # start); a GPU process exiting before one starting; then time order. Shown in time order.
    def rank(e: RecordedEvent) -> tuple[int, float]:
        r = RANK.get(e.kind, len(RANK))
        if e.kind == "gpu_process" and e.data.get("state") != "exited":
            r += 2
        return r, e.ts

    shown = sorted(sorted(listed, key=rank)[:MAX_EVENTS], key=lambda e: e.ts)
    out = ["Events"] + [f"  {_when(e.ts, span)}  {describe_event(e.kind, e.data)}" for e in shown]
    if hints:
        fired = sum(1 for e in hints if e.data.get("state") == "fired")
        out.append(f"  hints: {plural(fired, 'firing')}, {plural(len(hints) - fired, 'clearing')} (under Hints that fired)")
    if len(listed) > len(shown):
        left: dict[str, int] = {}
        kept = {id(e) for e in shown}
        for e in listed:
            if id(e) not in kept:
                left[e.kind] = left.get(e.kind, 0) + 1
        what = ", ".join(f"{n} {k}" for k, n in sorted(left.items(), key=lambda kv: -kv[1]))
        out.append(f"  ... and {len(listed) - len(shown)} more ({what}; dltop replay's event list has them all)")
    return [*out, ""]


def _hints(events: list[RecordedEvent], end: float | None) -> list[str]:
    fired: dict[str, dict[str, Any]] = {}
    for e in events:
        if e.kind != "hint" or not isinstance(e.data.get("id"), str):
            continue
        h = fired.setdefault(e.data["id"], {"times": 0, "active_s": 0.0, "since": None, "first": e})
        if e.data.get("state") == "fired":
            h["times"] += 1
            h["since"] = e.ts
            h["last"] = e
        elif h["since"] is not None:
            h["active_s"] += e.ts - h["since"]
            h["since"] = None
    if not fired:
        return ["Hints that fired: none", ""]
    out = ["Hints that fired"]
    for hid, h in fired.items():
        if h["since"] is not None and end is not None:
            h["active_s"] += max(0.0, end - h["since"])
        last = h.get("last", h["first"]).data
        nums = ", ".join(f"{k}={_num(v, k)}" for k, v in (last.get("numbers") or {}).items())
        out.append(f"  {hid} ({last.get('severity')}): fired {plural(h['times'], 'time')}, active "
                   f"{human_duration(h['active_s'])}{' (still at the end)' if h['since'] is not None else ''}")
        if last.get("text"):
            out.append(f"    {last['text']}")
        if nums:
            out.append(f"    {nums}")
    return [*out, ""]


def _num(v: Any, key: str = "") -> str:
    """A hint's number as the hint line shows it: bytes as bytes (1.0 GiB), others as they are."""
    if key.endswith("bytes") and isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
        return human_bytes(int(v))
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _runs(s: _Series, gaps: list[tuple[float, float]]) -> list[tuple[list[float], list[float]]]:
    """The series cut at each gap: a line is not drawn across a stretch without samples."""
    out: list[tuple[list[float], list[float]]] = [([], [])]
    g = 0
    for t, v in zip(s.ts, s.values, strict=True):
        while g < len(gaps) and t >= gaps[g][1]:
            g += 1
            if out[-1][0]:
                out.append(([], []))
        out[-1][0].append(t)
        out[-1][1].append(v)
    return [r for r in out if r[0]]


def _chart(title: str, unit: str, lines: dict[str, _Series], width: int, color: bool,
           gaps: list[tuple[float, float]] | None = None) -> list[str]:
    lines = {k: v for k, v in lines.items() if v.ts}
    if not lines:
        return [f"{title}: nothing recorded", ""]
    t0 = min(s.ts[0] for s in lines.values())
    t1 = max(s.ts[-1] for s in lines.values())
    minutes = (t1 - t0) / 60 > 3
    scale = 60.0 if minutes else 1.0
    fig = plotext.figure
    fig.clear()
    fig.plot_size(width, CHART_HEIGHT)
    fig.theme("simple" if color else "colorless")
    room = max(10, width * 2)
    for name, s in lines.items():
        step = max(1, math.ceil(len(s.ts) / room))
        for k, (ts, values) in enumerate(_runs(s, gaps or [])):
            sig = fig.signal([(t - t0) / scale for t in ts[::step]], values[::step])
            if k == 0:
                sig.label(name)
            sig.lines()
            fig.draw(sig)
    fig.title(f"{title} ({unit})")
    fig.label(f"{'minutes' if minutes else 'seconds'} since {time.strftime('%H:%M:%S', time.localtime(t0))}", "x")
    text = str(fig.build())
    fig.clear()
    return [text if color else plotext.uncolorize(text), ""]
