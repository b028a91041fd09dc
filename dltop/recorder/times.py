"""Times, durations and sizes as people type them: `10m ago`, `14:05`, ISO 8601, epoch seconds; `7d`; `2G`."""

from __future__ import annotations

import bisect
import datetime as dt
import math
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dltop.errors import DltopError
from dltop.fmt import human_duration, parse_bytes

if TYPE_CHECKING:
    from dltop.recorder.reader import Recording

GAP_INTERVALS = 3  # no sample for longer than this many intervals is a gap in the recording
_UNIT_S = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d|w)", re.IGNORECASE)
_CLOCK = re.compile(r"(\d{1,2}):(\d{2})(?::(\d{2}(?:\.\d+)?))?")


def parse_duration(text: str) -> float:
    """Seconds in `90s`, `10m`, `1h30m`, `7d`, `2w` or a plain number of seconds; DltopError otherwise."""
    s = text.strip().lower().replace(" ", "")
    try:
        value = float(s)
    except ValueError:
        pos, value = 0, 0.0
        for m in _DURATION.finditer(s):
            if m.start() != pos:
                break
            value += float(m.group(1)) * _UNIT_S[m.group(2)]
            pos = m.end()
        if pos != len(s) or not s:
            raise DltopError(f"not a duration: {text!r} (e.g. 90s, 10m, 1h30m, 7d)") from None
    if not math.isfinite(value) or value < 0:
        raise DltopError(f"not a duration: {text!r}")
    return value


def parse_size(text: str) -> int:
    """Bytes in `2G`, `500M` (a bare K, M, G, T is binary, as du and ls read it), or any size `fmt.parse_bytes`
    takes (`2GiB`, `2GB`, `4096`); DltopError otherwise."""
    t = text.strip()
    if t[-1:].upper() in ("K", "M", "G", "T"):
        t += "iB"
    try:
        return parse_bytes(t)
    except ValueError as e:
        raise DltopError(f"{e} (e.g. 500M, 2G)") from None


def parse_time(text: str, now: float, recording: Recording | None = None) -> float:
    """Epoch seconds for `10m ago`, `14:05` (the last such clock time, local, at or before the recording's end
    or now), ISO 8601 (local unless it names a zone), `start`/`end` of a recording, or epoch seconds."""
    s = text.strip()
    named = _named_time(s.lower(), now, recording)
    if named is not None:
        return named
    try:
        value = float(s)
    except ValueError:
        return _clock_or_iso_time(s, text, now if recording is None or recording.last_ts is None
                                  else min(now, recording.last_ts))
    if math.isfinite(value) and value >= 0:
        return value
    raise DltopError(f"not a time: {text!r}")


def _clock_or_iso_time(s: str, text: str, ref: float) -> float:
    """`14:05` (the last such clock time at or before `ref`) or ISO 8601 (local unless it names a zone)."""
    m = _CLOCK.fullmatch(s)
    if m is not None:
        return _clock_time(m, text, ref)
    try:
        when = dt.datetime.fromisoformat(s.replace("Z", "+00:00") if s.endswith("Z") else s)
    except ValueError:
        raise DltopError(f"not a time: {text!r} (e.g. '10m ago', 14:05, 2026-12-01T14:05, epoch seconds)") from None
    if when.tzinfo is None:
        when = when.astimezone()  # a naive time is local, as the clock on the wall
    return when.timestamp()


def _named_time(low: str, now: float, recording: Recording | None) -> float | None:
    """`start`/`end` of a recording, `now`, `10m ago`; None for anything else."""
    if recording is not None and low in ("start", "begin", "first") and recording.first_ts is not None:
        return recording.first_ts
    if recording is not None and low in ("end", "last") and recording.last_ts is not None:
        return recording.last_ts
    if low == "now":
        return now
    if low.endswith("ago"):
        return now - parse_duration(low[:-3])
    return None


def _clock_time(m: re.Match[str], text: str, ref: float) -> float:
    """The last time the clock showed HH:MM[:SS] (local) at or before `ref`."""
    h, minute, sec = int(m.group(1)), int(m.group(2)), float(m.group(3) or 0)
    if h > 23 or minute > 59 or sec >= 60:
        raise DltopError(f"not a time of day: {text!r}")
    day = dt.datetime.fromtimestamp(ref).astimezone()
    # The fraction's digits truncated to microseconds, as a clock shows them (rounded, 14:05:59.9999999 was a
    # microsecond of 1,000,000 and an exception; 59.4999999 became 59.5).
    micro = int(((m.group(3) or "").partition(".")[2] + "000000")[:6])
    at = day.replace(hour=h, minute=minute, second=int(sec), microsecond=micro)
    if at.timestamp() > ref:
        at = (at - dt.timedelta(days=1)).replace(hour=h, minute=minute)  # the last such clock time
    return at.timestamp()


def index_typed(times: Sequence[float], ts: float) -> int:
    """The index of the sample a typed time names, in `times` (ascending). A whole second (`14:05:30`, `14:05`)
    names the sample shown as that second, the first one taken within it (samples fall between whole seconds:
    the one on screen at 14:05:30.000 is 14:05:29's); other times, and a second with no sample, the one on
    screen then (the last at or before it; the first before the recording starts)."""
    if ts == math.floor(ts):
        j = bisect.bisect_left(times, ts)
        if j < len(times) and times[j] < ts + 1.0:
            return j
    return max(0, bisect.bisect_right(times, ts) - 1)


def meta_interval(meta: Mapping[str, Any]) -> float:
    """A recording's sampling interval from its header (1 s where it does not say a valid one)."""
    interval = meta.get("interval_s")
    return float(interval) if isinstance(interval, int | float) and interval > 0 else 1.0


def gap_at(times: Sequence[float], ts: float, interval_s: float) -> tuple[float, float] | None:
    """The gap of `times` (ascending) that a typed time falls inside, as (the last sample before it, the first
    after it); None where the time names a sample (index_typed), or the stretch after that sample is no gap (no
    longer than GAP_INTERVALS intervals) or the next sample was not yet due at `ts`."""
    j = index_typed(times, ts)
    if j + 1 >= len(times):
        return None
    a, b = times[j], times[j + 1]
    if b - a <= GAP_INTERVALS * interval_s or not a + interval_s <= ts < b:
        return None
    return a, b


def gap_note(times: Sequence[float], ts: float, interval_s: float, shown: float | None = None) -> str | None:
    """Where a typed time falls inside a gap: "14:05:30 is inside a gap of 3m12s (14:04:10–14:07:22, nothing
    recorded): showing 14:04:10, the last sample before it"; None elsewhere. `shown`: the sample shown, where it
    is not the one before the gap (a damaged sample's nearest good one)."""
    gap = gap_at(times, ts, interval_s)
    if gap is None:
        return None
    a, b = gap
    fmt = "%H:%M:%S" if _clock(a, "%F") == _clock(b, "%F") == _clock(ts, "%F") else "%Y-%m-%d %H:%M:%S"

    def clock(t: float) -> str:
        return _clock(t, fmt)

    at = a if shown is None else shown
    which = "the last sample before it" if at == a else "the nearest sample that could be read"
    return (f"{clock(ts)} is inside a gap of {human_duration(b - a)} ({clock(a)}–{clock(b)}, nothing "
            f"recorded): showing {clock(at)}, {which}")


def _clock(ts: float, fmt: str) -> str:
    return dt.datetime.fromtimestamp(ts).astimezone().strftime(fmt)
