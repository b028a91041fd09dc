"""`dltop report`: the postmortem of a recording in a terminal — peaks, the event timeline, charts, hints.

Everything comes from the recorded Snapshots and events: the peaks from every sample of the range, the charts
(plotext) from the same samples thinned to the chart's width, the hints from the recorder's hint events. A frame
wholly inside the range is read through its summary in the index (`summary.py`) where it has one: the same
numbers, without decoding its Snapshots; the range's edges and frames without a summary are decoded.
"""

from __future__ import annotations

import bisect
import math
import os
import time
from collections.abc import Callable
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
from dltop.model import Snapshot
from dltop.recorder.reader import Piece, RecordedEvent, Recording
from dltop.recorder.summary import CHARTS, STRIDE, better, sample_values
from dltop.recorder.times import GAP_INTERVALS
from dltop.text.events import describe_event

MAX_EVENTS = 60
# What a postmortem looks for first: a long recording's timeline keeps these before the rest (hint firings are
# summarised under "Hints that fired", not listed one by one).
RANK = {"oom_kill": 0, "marker": 1, "action": 2, "gap": 3, "gpu_process": 4, "start": 5, "stop": 5}
CHART_HEIGHT = 14


@dataclass
class _Peak:
    value: float | None = None
    ts: float = 0.0

    def see(self, value: float | None, ts: float, lowest: bool = False) -> None:
        if better(value, self.value, lowest):
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


# A chart's values as the report draws them: GiB, or percent resident.
_SCALE = {"page cache": 1 / (1 << 30), "GPU memory": 1 / (1 << 30), "dataset residency": 100.0}


class _Collected:
    """One pass over the samples, or over frames' summaries: the peaks and the chart lines. `every_sample`:
    each sample is a chart point; else every STRIDE-th of a frame (what a frame's summary holds)."""

    def __init__(self, interval_s: float = 1.0, every_sample: bool = True) -> None:
        self.interval_s = interval_s
        self.every_sample = every_sample
        self.holes: list[tuple[float, float]] = []  # (last sample before, first after) where none came for > 3 intervals
        self.samples = 0
        self.first_ts: float | None = None
        self.last_ts: float | None = None
        self.host = ""  # the first sample's
        self.peaks: dict[str, _Peak] = {}
        self.totals: dict[str, float] = {}  # what a peak is out of (RAM, a GPU's memory, a cgroup's limit)
        self.charts: dict[str, dict[str, _Series]] = {name: {} for name in CHARTS}

    @property
    def span_s(self) -> float:
        return self.last_ts - self.first_ts if self.first_ts is not None and self.last_ts is not None else 0.0

    def _times(self, first: float, last: float, n: int) -> None:
        if self.last_ts is not None and first - self.last_ts > GAP_INTERVALS * self.interval_s:
            self.holes.append((self.last_ts, first))
        if self.first_ts is None:
            self.first_ts = first
        self.last_ts = last
        self.samples += n

    def see(self, s: Snapshot, k: int = 0) -> None:
        """One sample, the k-th of its frame."""
        self._times(s.ts, s.ts, 1)
        self.host = self.host or s.host
        peaks, totals, lines = sample_values(s)
        for name, v, low in peaks:
            self.peaks.setdefault(name, _Peak()).see(v, s.ts, low)
        self.totals.update(totals)
        point = self.every_sample or k % STRIDE == 0
        for chart, name, v in lines:
            series = self.charts[chart].setdefault(name, _Series())
            if point and v is not None:
                series.add(s.ts, v * _SCALE[chart])

    def see_summary(self, times: list[float], summary: dict[str, Any]) -> None:
        """A whole frame through its summary (`summary.frame_summary`): what `see` of each of its samples gives."""
        self._times(times[0], times[-1], len(times))
        gap = GAP_INTERVALS * self.interval_s
        self.holes += [(a, b) for a, b in zip(times, times[1:]) if b - a > gap]  # noqa: B905 (one shorter)
        for name, low, v, ts in summary["peaks"]:
            self.peaks.setdefault(name, _Peak()).see(v, ts, bool(low))
        self.totals.update(dict(summary["totals"]))
        for chart, name, points in summary["lines"]:
            series = self.charts[chart].setdefault(name, _Series())
            scale = _SCALE[chart]
            for i, v in enumerate(points):
                if v is not None:
                    series.add(times[i * STRIDE], v * scale)


def report(rec: Recording, t0: float | None = None, t1: float | None = None, width: int | None = None,
           color: bool = False, fast: bool = True, progress: Callable[[int, int], None] | None = None) -> str:
    """The whole postmortem as text. `fast`: frames wholly in the range are read through their summaries in
    the index (where they have one) rather than decoded: the same report. `progress(done, total)`: samples."""
    width = max(60, width or _terminal_width())
    c = _collected(rec, t0, t1, width, fast, progress)
    events = [e for e in rec.events(t0, t1) if e.kind != "view"]  # what was on screen is no event of the job
    out: list[str] = []
    gaps = _gaps(rec, c, rec.events())
    out += _header(rec, c, events, gaps)
    out += _peaks(c)
    out += _gap_lines(gaps, c)
    out += _timeline(events, c, gaps)
    out += _hints(events, t1 if t1 is not None else c.last_ts)
    # The recording came from elsewhere: its names and texts are escaped here (in colour the report is written
    # past the CLI's escaping writer, its own colours intact).
    out = [printable_lines(line) for line in out]
    for title, unit in (("page cache", "GiB"), ("GPU memory", "GiB"), ("dataset residency", "% resident")):
        out += _chart(title, unit, {printable(k): v for k, v in c.charts[title].items()}, width, color,
                      [(a, b) for a, b, _ in gaps])
    return "\n".join(out) + "\n"


def _collected(rec: Recording, t0: float | None, t1: float | None, width: int, fast: bool,
               progress: Callable[[int, int], None] | None) -> _Collected:
    """What the report takes from the samples in the range. A range with fewer samples than the charts have room
    for at every STRIDE-th charts every sample (and decodes them all: at most ~STRIDE times the chart's width)."""
    interval = rec.meta.get("interval_s")
    pieces = list(rec.pieces(t0, t1))
    every = sum(p.hi - p.lo for p in pieces) < _room(width) * STRIDE
    c = _Collected(float(interval) if isinstance(interval, int | float) and 0 < interval <= 3600 else 1.0, every)
    _collect(c, pieces, fast and not every, progress)
    if not c.host and c.first_ts is not None and not rec.meta.get("host"):
        c.host = rec.at(c.first_ts).host
    return c


def _collect(c: _Collected, pieces: list[Piece], summaries: bool, progress: Callable[[int, int], None] | None) -> None:
    """Every piece's samples seen by `c`: through a frame's summary where it has one and `summaries`, else each
    Snapshot decoded; `progress(done, total)` told before each piece and at the end."""
    total = sum(p.hi - p.lo for p in pieces)
    done = 0
    for p in pieces:
        if progress is not None:
            progress(done, total)
        if p.summary is not None and summaries:
            c.see_summary(p.times, p.summary)
        else:
            for k, s in p.snapshots():
                c.see(s, k)
        done += p.hi - p.lo
    if progress is not None:
        progress(done, total)


def _room(width: int) -> int:
    """How many points a chart of `width` columns draws of a line (two a column: braille-like markers)."""
    return max(10, width * 2)


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
    if c.first_ts is None or c.last_ts is None:
        return [*lines, "no samples in this range", ""]
    span = c.last_ts - c.first_ts
    lines.append(f"{meta.get('host') or c.host}: {_span_text(c.first_ts, c.last_ts)} "
                 f"({human_duration(span)}), {plural(c.samples, 'sample')}"
                 f" every {meta.get('interval_s', '?')} s, {plural(len(events), 'event')}; times are {_zone(c.last_ts)}")
    lines += _losses(rec, events, gaps, span)
    gpus = meta.get("gpus")
    if isinstance(gpus, list) and gpus:
        lines.append(_gpus_line(gpus))
    if rec.damage.total or rec.damage.indexes:
        lines.append(f"damaged: {rec.damage.note()}")
    return [*lines, ""]


def _losses(rec: Recording, events: list[RecordedEvent], gaps: list[tuple[float, float, str]],
            span: float) -> list[str]:
    """The header's lines on what was lost: processes the OOM killer took, runs that ended without a stop, gaps."""
    ooms = [e for e in events if e.kind == "oom_kill"]
    lines = _oom_lines(ooms, span) if ooms else []
    lines += [f"ended without a stop at {_when(ts, span)}: the recorder was killed or the machine went down"
              for ts in _unclean_ends(rec, events)]
    if gaps:
        lost = sum(b - a for a, b, _ in gaps)
        lines.append(f"gaps: {plural(len(gaps), 'gap')}, {human_duration(lost)} without samples (below)")
    return lines


def _span_text(first: float, last: float) -> str:
    """'2026-12-01 14:00:00 CET to 15:00:00 CET'; the end with its date whenever it falls on another day than the
    start (a day's span ends the next day)."""
    end_date = time.strftime("%Y-%m-%d ", time.localtime(last))
    if end_date == time.strftime("%Y-%m-%d ", time.localtime(first)):
        end_date = ""
    return (f"{time.strftime('%Y-%m-%d %H:%M:%S %Z', time.localtime(first))} to {end_date}"
            f"{time.strftime('%H:%M:%S %Z', time.localtime(last))}")


def _oom_lines(ooms: list[RecordedEvent], span: float) -> list[str]:
    """The kills (the kernel's count, vmstat, where it was read, else the memory cgroup's: one kill raises both)
    and who was killed, each victim once, with where the name came from."""
    machine = [e for e in ooms if e.data.get("source") != "cgroup"] or ooms
    kills = sum(int(e.data["kills"]) for e in machine if isinstance(e.data.get("kills"), int)) or len(machine)
    return [f"OOM KILLS: {kills} ({plural(len(ooms), 'event')}, first at {_when(ooms[0].ts, span)}, "
            f"last at {_when(ooms[-1].ts, span)})", *_victim_lines(ooms, span)]


def _victim_lines(ooms: list[RecordedEvent], span: float) -> list[str]:
    """Who was killed, each victim once (by pid and where the name came from)."""
    out = []
    seen: set[Any] = set()
    for e in ooms:
        victims = e.data.get("victims")
        for v in victims if isinstance(victims, list) else []:
            key = (v.get("pid"), e.data.get("victims_from")) if isinstance(v, dict) else None
            if key is not None and key not in seen:
                seen.add(key)
                out.append(_victim_line(e, v, span))
    return out


def _victim_line(e: RecordedEvent, v: dict[str, Any], span: float) -> str:
    where = "the kernel log" if e.data.get("victims_from") == "kmsg" else "gone since the last sample"
    cgroup = f", cgroup {v['cgroup']}" if v.get("cgroup") else ""
    at = v["ts"] if isinstance(v.get("ts"), float) else e.ts  # the kernel's time of the kill, or the sample's
    return f"  killed at {_when(at, span)}: pid {v.get('pid')} {v.get('command') or '?'}{cgroup} ({where})"


def _gpus_line(gpus: list[Any]) -> str:
    names = sorted({str(g.get("name")) for g in gpus if isinstance(g, dict)})
    return f"GPUs: {len(gpus)} x {', '.join(names)}"


def _peaks(c: _Collected) -> list[str]:
    if not c.peaks:
        return []
    span = c.span_s
    out = ["Peaks"]
    # Over a day the times carry their date (6 more columns): the names give them up, so a line fits 80 columns.
    room = 34 if span > 86400 else 40
    for name, p in c.peaks.items():
        if p.value is None:
            continue
        if name.endswith("resident (lowest)"):
            value = percent_text(p.value * 100, 1)
        else:
            total = c.totals.get(name)
            value = human_bytes(p.value) + (f" of {human_bytes(total)}" if total else "")
        out.append(f"  {shorten_middle(name, room):<{room}} {value:>24}  at {_when(p.ts, span)}")
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
                out.append(_last_sample(times, open_since, e.ts))
            open_since = e.ts
        elif e.kind == "stop":
            open_since = None
    if open_since is not None and not _still_recording(rec):
        out.append(_last_sample(times, open_since, math.inf))
    return out


def _last_sample(times: list[float], since: float, until: float) -> float:
    """The time of the last sample in [since, until) (`times` ascending), else `since`."""
    i = bisect.bisect_left(times, until)
    return times[i - 1] if i and times[i - 1] >= since else since


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
    return [(a, b, "; ".join(_gap_causes(rec, c, events, a, b)) or "no samples (the recorder was stalled or stopped)")
            for a, b in c.holes]


def _gap_causes(rec: Recording, c: _Collected, events: list[RecordedEvent], a: float, b: float) -> list[str]:
    causes = [f"{plural(e.data['samples'], 'sample')} not written ({e.data.get('cause')})" for e in events
              if e.kind == "gap" and isinstance(e.data.get("samples"), int) and a <= e.ts <= b + c.interval_s]
    causes += _damaged_frames(rec, a, b)
    inside = {e.kind for e in events if a < e.ts < b}
    if "start" in inside:
        causes.append("the recorder was not running" + ("" if "stop" in inside else " (it ended without a stop)"))
    return causes


def _damaged_frames(rec: Recording, a: float, b: float) -> list[str]:
    frames = [n for t0, t1, n in rec.damage.spans.values() if t0 < b and t1 > a]
    return [f"{plural(sum(frames), 'sample')} in {plural(len(frames), 'damaged frame')}"] if frames else []


def _gap_lines(gaps: list[tuple[float, float, str]], c: _Collected) -> list[str]:
    if not gaps:
        return []
    span = c.span_s
    out = ["Gaps"]
    for a, b, why in gaps:
        missing = max(0, round((b - a) / c.interval_s) - 1)
        out.append(f"  {_when(a, span)} to {_when(b, span)}  {human_duration(b - a)}, ~{plural(missing, 'sample')}"
                   f" missing: {why}")
    return [*out, ""]


def _timeline(events: list[RecordedEvent], c: _Collected, gaps: list[tuple[float, float, str]]) -> list[str]:
    if not events:
        return ["Events: none", ""]
    span = c.span_s
    hints = [e for e in events if e.kind == "hint"]
    listed = [e for e in events if e.kind != "hint"]

    shown = sorted(sorted(listed, key=_event_rank)[:MAX_EVENTS], key=lambda e: e.ts)
    out = ["Events"] + [f"  {_when(e.ts, span)}  {describe_event(e.kind, e.data)}{_in_gap(e, gaps, span)}"
                        for e in shown]
    out += _hint_tally(hints)
    if len(listed) > len(shown):
        out.append(_more_events(listed, shown))
    return [*out, ""]


def _hint_tally(hints: list[RecordedEvent]) -> list[str]:
    if not hints:
        return []
    fired = sum(1 for e in hints if e.data.get("state") == "fired")
    return [f"  hints: {plural(fired, 'firing')}, {plural(len(hints) - fired, 'clearing')} (under Hints that fired)"]


def _in_gap(e: RecordedEvent, gaps: list[tuple[float, float, str]], span: float) -> str:
    """' (in a gap: no samples 03:10:04 to 03:14:58)' for an event inside a stretch without samples (a marker or
    an action while the recorder could not write): the panes of that moment show the sample before it."""
    if e.kind in ("gap", "start", "stop"):
        return ""
    for a, b, _ in gaps:
        if a < e.ts < b:
            return f" (in a gap: no samples {_when(a, span)} to {_when(b, span)})"
    return ""


def _event_rank(e: RecordedEvent) -> tuple[int, float]:
    """The ones a postmortem looks for first (an OOM kill late in a week is kept over the hundredth GPU process
    start); a GPU process exiting before one starting; then time order."""
    r = RANK.get(e.kind, len(RANK))
    if e.kind == "gpu_process" and e.data.get("state") != "exited":
        r += 2
    return r, e.ts


def _more_events(listed: list[RecordedEvent], shown: list[RecordedEvent]) -> str:
    """The events not shown, counted by kind."""
    left: dict[str, int] = {}
    kept = {id(e) for e in shown}
    for e in listed:
        if id(e) not in kept:
            left[e.kind] = left.get(e.kind, 0) + 1
    what = ", ".join(f"{n} {k}" for k, n in sorted(left.items(), key=lambda kv: -kv[1]))
    return f"  ... and {len(listed) - len(shown)} more ({what}; dltop replay's event list has them all)"


def _hints(events: list[RecordedEvent], end: float | None) -> list[str]:
    fired = _fired(events)
    if not fired:
        return ["Hints that fired: none", ""]
    out = ["Hints that fired"]
    for hid, h in fired.items():
        out += _hint_lines(hid, h, end)
    return [*out, ""]


def _fired(events: list[RecordedEvent]) -> dict[str, dict[str, Any]]:
    """Each hint that fired: how often, for how long, since when it is on (None: cleared), its first and last."""
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
    return fired


def _hint_lines(hid: str, h: dict[str, Any], end: float | None) -> list[str]:
    if h["since"] is not None and end is not None:
        h["active_s"] += max(0.0, end - h["since"])
    last = h.get("last", h["first"]).data
    nums = ", ".join(f"{k}={_num(v, k)}" for k, v in (last.get("numbers") or {}).items())
    out = [f"  {hid} ({last.get('severity')}): fired {plural(h['times'], 'time')}, active "
           f"{human_duration(h['active_s'])}{' (still at the end)' if h['since'] is not None else ''}"]
    if last.get("text"):
        out.append(f"    {last['text']}")
    if nums:
        out.append(f"    {nums}")
    return out


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
           gaps: list[tuple[float, float]]) -> list[str]:
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
    _draw(fig, lines, t0, scale, _room(width), gaps)
    fig.title(f"{title} ({unit})")
    fig.label(f"{'minutes' if minutes else 'seconds'} since {time.strftime('%H:%M:%S', time.localtime(t0))}", "x")
    text = str(fig.build())
    fig.clear()
    return [text if color else plotext.uncolorize(text), ""]


def _draw(fig: Any, lines: dict[str, _Series], t0: float, scale: float, room: int,
          gaps: list[tuple[float, float]]) -> None:
    """Each line on the chart, thinned to `room` points, cut at each gap."""
    for name, s in lines.items():
        step = max(1, math.ceil(len(s.ts) / room))
        for k, (ts, values) in enumerate(_runs(s, gaps)):
            sig = fig.signal([(t - t0) / scale for t in ts[::step]], values[::step])
            if k == 0:
                sig.label(name)
            sig.lines()
            fig.draw(sig)
