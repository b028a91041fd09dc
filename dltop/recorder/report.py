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

from dltop.fmt import human_bytes, human_duration, plural, printable, printable_lines, shorten_middle
from dltop.model import CgroupMemory, DatasetsPart, MemoryPart, Snapshot
from dltop.model.datasets import DatasetResidency
from dltop.model.gpu import SPLIT_FIELDS
from dltop.recorder.reader import RecordedEvent, Recording
from dltop.text.events import describe_event

MAX_EVENTS = 60
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

    def __init__(self) -> None:
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
    c = _Collected()
    for s in rec.range(t0, t1):
        c.see(s)
    events = rec.events(t0, t1)
    out: list[str] = []
    out += _header(rec, c, events)
    out += _peaks(c)
    out += _timeline(events, c)
    out += _hints(events, t1 if t1 is not None else (c.last.ts if c.last else None))
    # The recording came from elsewhere: its names and texts are escaped here (in colour the report is written
    # past the CLI's escaping writer, its own colours intact).
    out = [printable_lines(line) for line in out]
    for title, unit in (("page cache", "GiB"), ("GPU memory", "GiB"), ("dataset residency", "% resident")):
        out += _chart(title, unit, {printable(k): v for k, v in c.charts[title].items()}, width, color)
    return "\n".join(out) + "\n"


def _terminal_width() -> int:
    try:
        return os.get_terminal_size().columns
    except OSError:
        return 100


def _when(ts: float, span_s: float) -> str:
    return time.strftime("%m-%d %H:%M:%S" if span_s > 86400 else "%H:%M:%S", time.localtime(ts))


def _header(rec: Recording, c: _Collected, events: list[RecordedEvent]) -> list[str]:
    meta = rec.meta
    lines = [f"dltop report: {rec.path}"]
    if c.first is None or c.last is None:
        return [*lines, "no samples in this range", ""]
    span = c.last.ts - c.first.ts
    lines.append(f"{meta.get('host') or c.first.host}: {time.strftime('%Y-%m-%d %H:%M:%S %Z', time.localtime(c.first.ts))}"
                 f" to {_when(c.last.ts, span)} ({human_duration(span)}), {plural(c.samples, 'sample')}"
                 f" every {meta.get('interval_s', '?')} s, {plural(len(events), 'event')}")
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
            value = f"{p.value * 100:.1f}%"
        else:
            total = c.totals.get(name)
            value = human_bytes(p.value) + (f" of {human_bytes(total)}" if total else "")
        out.append(f"  {shorten_middle(name, 40):<40} {value:>24}  at {_when(p.ts, span)}")
    return [*out, ""]


def _timeline(events: list[RecordedEvent], c: _Collected) -> list[str]:
    if not events:
        return ["Events: none", ""]
    span = (c.last.ts - c.first.ts) if c.first and c.last else 0.0
    # The ones a postmortem looks for first; the rest fill what room is left, in time order.
    def key(e: RecordedEvent) -> bool:
        return e.kind in ("oom_kill", "marker", "action") or (e.kind == "hint" and e.data.get("state") == "fired")

    shown = [e for e in events if key(e)][:MAX_EVENTS]
    rest = [e for e in events if not key(e)]
    shown += rest[: max(0, MAX_EVENTS - len(shown))]
    shown.sort(key=lambda e: e.ts)
    out = ["Events"] + [f"  {_when(e.ts, span)}  {describe_event(e.kind, e.data)}" for e in shown]
    if len(events) > len(shown):
        out.append(f"  ... and {len(events) - len(shown)} more (dltop dump --format jsonl, or dltop replay)")
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


def _chart(title: str, unit: str, lines: dict[str, _Series], width: int, color: bool) -> list[str]:
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
        sig = fig.signal([(t - t0) / scale for t in s.ts[::step]], s.values[::step])
        sig.label(name)
        sig.lines()
        fig.draw(sig)
    fig.title(f"{title} ({unit})")
    fig.label(f"{'minutes' if minutes else 'seconds'} since {time.strftime('%H:%M:%S', time.localtime(t0))}", "x")
    text = str(fig.build())
    fig.clear()
    return [text if color else plotext.uncolorize(text), ""]
