"""Per-frame summaries of what `dltop report` reads from samples, kept in a closed segment's index, so a report
over days reads the index instead of decoding every Snapshot (docs/recorder.md, "The index").

One function (`sample_values`) says what the report takes from a Snapshot; the report's own pass and the
writer's summaries both use it, so the two cannot drift apart.
"""

from __future__ import annotations

import math
import os
from typing import Any

from dltop.model import CgroupMemory, DatasetsPart, MemoryPart, Snapshot
from dltop.model.datasets import DatasetResidency
from dltop.model.gpu import SPLIT_FIELDS, GpuPart
from dltop.recorder import store

STRIDE = 16  # a chart point every STRIDE-th sample of a frame: a long report's charts draw no more than that
CHARTS = ("page cache", "GPU memory", "dataset residency")
SPLIT_NAMES = dict(zip(SPLIT_FIELDS, ("weights", "KV cache", "allocator cache", "other torch", "non-torch"),
                       strict=True))

# (peaks: (name, value, lowest), totals: (name, what the peak is out of), lines: (chart, name, value)); values
# as recorded (bytes, a resident fraction): the report scales them for its charts.
Values = tuple[list[tuple[str, Any, bool]], list[tuple[str, int]], list[tuple[str, str, Any]]]


def sample_values(s: Snapshot) -> Values:
    """What the report takes from one Snapshot: its peak candidates, totals and chart values, in report order."""
    values: Values = ([], [], [])
    if isinstance(s.memory, MemoryPart):
        _memory_values(s.memory, values)
    if isinstance(s.gpus, tuple):
        _gpu_values(s.gpus, values)
    if isinstance(s.datasets, DatasetsPart):
        for d in s.datasets.paths:
            if isinstance(d, DatasetResidency) and d.resident_fraction is not None:
                values[0].append((f"{d.path} resident (lowest)", d.resident_fraction, True))
                values[2].append(("dataset residency", os.path.basename(d.path.rstrip("/")) or d.path,
                                  d.resident_fraction))
    return values


def _memory_values(mem: MemoryPart, values: Values) -> None:
    peaks, totals, lines = values
    peaks += [("page cache (Cached)", mem.cached_bytes, False), ("dirty", mem.dirty_bytes, False),
              ("writeback", mem.writeback_bytes, False), ("MemAvailable (lowest)", mem.available_bytes, True)]
    if mem.total_bytes:
        totals += [("page cache (Cached)", mem.total_bytes), ("MemAvailable (lowest)", mem.total_bytes)]
    lines += [("page cache", "cached", mem.cached_bytes), ("page cache", "dirty", mem.dirty_bytes)]
    if isinstance(mem.cgroup, CgroupMemory):
        peaks.append((f"cgroup {mem.cgroup.path}", mem.cgroup.current_bytes, False))
        if mem.cgroup.max_bytes:
            totals.append((f"cgroup {mem.cgroup.path}", mem.cgroup.max_bytes))


def _gpu_values(gpus: GpuPart, values: Values) -> None:
    peaks, totals, lines = values
    split = dict.fromkeys(SPLIT_FIELDS, 0)
    known = set()
    for g in gpus:
        name = f"GPU {g.index} used"
        peaks.append((name, g.memory_used_bytes, False))
        if g.memory_total_bytes:
            totals.append((name, g.memory_total_bytes))
        lines.append(("GPU memory", name, g.memory_used_bytes))
        for p in g.processes if isinstance(g.processes, tuple) else ():
            for f in SPLIT_FIELDS:
                v = getattr(p.split, f)
                if v is not None:
                    split[f] += v
                    known.add(f)
    for f in SPLIT_FIELDS:  # the split where probes or servers told it; never guessed
        if f in known:
            lines.append(("GPU memory", SPLIT_NAMES[f], split[f]))


def better(value: Any, than: Any, lowest: bool) -> bool:
    """Whether `value` is a new peak over `than` (the first of equal ones stays the peak)."""
    return value is not None and (than is None or (value < than if lowest else value > than))


def frame_summary(values: list[tuple[float, Values]]) -> dict[str, Any]:
    """The summary of one frame's samples (time, `sample_values`), in the frame's order: for each peak its
    extreme and the time of its first reaching it, the last total of each, and each chart line's value at every
    STRIDE-th sample (null where that sample had none)."""
    peaks: dict[str, list[Any]] = {}
    totals: dict[str, int] = {}
    lines: dict[tuple[str, str], list[Any]] = {}
    points = math.ceil(len(values) / STRIDE)
    for k, (ts, (pk, tot, ln)) in enumerate(values):
        for name, v, low in pk:
            p = peaks.setdefault(name, [int(low), None, None])
            if better(v, p[1], low):
                p[1], p[2] = v, ts
        for name, total in tot:
            totals[name] = total
        for chart, name, v in ln:
            line = lines.setdefault((chart, name), [None] * points)
            if k % STRIDE == 0:
                line[k // STRIDE] = v
    return {"n": len(values), "peaks": [[name, *p] for name, p in peaks.items()], "totals": list(totals.items()),
            "lines": [[chart, name, pts] for (chart, name), pts in lines.items()]}


def _number(v: Any) -> bool:
    return type(v) in (int, float) and abs(v) <= store.MAX_NUMBER


def check_summary(summary: Any, crc: Any, samples: int) -> dict[str, Any] | None:
    """The summary of a frame of `samples` samples when it is what the writer wrote (its checksum matches, every
    entry has its shape), else None: the frame is then decoded."""
    if not isinstance(summary, dict) or summary.get("n") != samples or not store.shallow(summary, 4) \
            or crc != store.entry_crc([summary]):
        return None
    peaks, totals, lines = summary.get("peaks"), summary.get("totals"), summary.get("lines")
    if not (isinstance(peaks, list) and isinstance(totals, list) and isinstance(lines, list)):
        return None
    points = math.ceil(samples / STRIDE)
    if all(map(_is_peak, peaks)) and all(map(_is_total, totals)) and all(_is_line(ln, points) for ln in lines):
        return summary
    return None


def _is_peak(p: Any) -> bool:
    """[name, lowest (0 or 1), value or null, time]"""
    return (isinstance(p, list) and len(p) == 4 and isinstance(p[0], str) and p[1] in (0, 1)
            and (p[2] is None or (_number(p[2]) and store.valid_ts(p[3]) is not None)))


def _is_total(t: Any) -> bool:
    """[name, total]"""
    return isinstance(t, list) and len(t) == 2 and isinstance(t[0], str) and _number(t[1])


def _is_line(line: Any, points: int) -> bool:
    """[chart, name, a value or null at each of `points` points]"""
    return (isinstance(line, list) and len(line) == 3 and line[0] in CHARTS and isinstance(line[1], str)
            and isinstance(line[2], list) and len(line[2]) == points
            and all(v is None or _number(v) for v in line[2]))
