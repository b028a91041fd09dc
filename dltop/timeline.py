"""The Snapshots the app can show a past moment from: its own bounded live history, or a recording.

A past moment is shown the way live showed it: the Snapshot at that time with the window of Snapshots that ended
there (the sparklines, `View.previous` for rates, the hints' window), so live, pause and replay hand the panes the
same View for the same moment.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from dltop.model import Snapshot


class TimedEvent(Protocol):
    """One event of a recording (an OOM kill, a marker, an action, a GPU process, a hint)."""

    @property
    def ts(self) -> float: ...
    @property
    def kind(self) -> str: ...
    @property
    def data(self) -> Mapping[str, Any]: ...


class Timeline(Protocol):
    """Snapshots by time, oldest first."""

    def times(self) -> Sequence[float]: ...
    def upto(self, ts: float, count: int) -> list[Snapshot]: ...
    def events(self) -> Sequence[TimedEvent]: ...


class RecordingLike(Protocol):
    """What a replay reads of a recording (`dltop.recorder.Recording`)."""

    def times(self) -> list[float]: ...
    def range(self, t0: float | None = None, t1: float | None = None) -> Iterator[Snapshot]: ...
    def events(self, t0: float | None = None, t1: float | None = None) -> Sequence[TimedEvent]: ...
    @property
    def meta(self) -> Mapping[str, Any]: ...


def index_at(times: Sequence[float], ts: float) -> int:
    """The index of the Snapshot on screen at `ts`: the last one taken at or before it (0 before the first)."""
    return max(0, bisect.bisect_right(times, ts) - 1)


@dataclass(frozen=True)
class LiveEvent:
    """An event seen live: an action this TUI ran, or one another process journalled (dltop.journal)."""

    ts: float
    kind: str
    data: Mapping[str, Any]


MAX_LIVE_EVENTS = 1000


class LiveHistory:
    """The app's own history (the last Snapshots it showed, a bounded deque): what pause and step move through;
    and the events seen since the start (the actions run here and anywhere on the machine), the newest 1,000."""

    def __init__(self, snapshots: deque[Snapshot]) -> None:
        self.snapshots = snapshots
        self._events: deque[LiveEvent] = deque(maxlen=MAX_LIVE_EVENTS)

    def add_event(self, event: LiveEvent) -> None:
        self._events.append(event)

    def times(self) -> list[float]:
        return [s.ts for s in self.snapshots]

    def upto(self, ts: float, count: int) -> list[Snapshot]:
        """At most `count` Snapshots ending with the one on screen at `ts`."""
        if not self.snapshots:
            return []
        end = index_at(self.times(), ts) + 1
        return list(self.snapshots)[max(0, end - count):end]

    def events(self) -> Sequence[TimedEvent]:
        return sorted(self._events, key=lambda e: e.ts)


class RecordedHistory:
    """A recording as a Timeline. The window around the moment shown is kept decoded, so stepping and playing
    read only the Snapshots that came into the window, not the whole window again."""

    def __init__(self, recording: RecordingLike) -> None:
        self._recording = recording
        self._times = recording.times()
        self._events = recording.events()
        self._kept: dict[float, Snapshot] = {}

    def times(self) -> list[float]:
        return self._times

    def events(self) -> Sequence[TimedEvent]:
        return self._events

    def upto(self, ts: float, count: int) -> list[Snapshot]:
        """At most `count` Snapshots ending with the one on screen at `ts`."""
        if not self._times:
            return []
        end = index_at(self._times, ts) + 1
        wanted = self._times[max(0, end - count):end]
        missing = [t for t in wanted if t not in self._kept]
        if missing:
            for snap in self._recording.range(missing[0], missing[-1]):
                self._kept[snap.ts] = snap
        self._kept = {t: self._kept[t] for t in wanted if t in self._kept}
        return list(self._kept.values())


class Feed(Protocol):
    """Where live Snapshots come from: the Sampler, or a list of them (sampler.ListFeed). A replay has none: it
    moves through a Recorded's timeline."""

    def start(self, hold_slow_s: float = 0.0) -> None: ...
    def release_slow(self) -> None: ...
    def snapshot(self) -> Snapshot: ...
    def backlog(self) -> list[Snapshot]: ...
    def set_refresh(self, interval_s: float) -> None: ...
    def reconfigure(self, settings: Any) -> None: ...
    def read_now(self, name: str, key: str | None = None) -> None: ...
    async def wait_first(self, timeout_s: float = 1.0) -> None: ...
    def stream(self, interval_s: Callable[[], float]) -> AsyncIterator[Snapshot]: ...
    def close(self) -> None: ...


class Recorded:
    """A recording to replay: its timeline, the name the header calls it by and the moment to open on. Nothing
    streams in and nothing can be changed; the playhead moves through `timeline` (step, jump, go to, play)."""

    def __init__(self, recording: RecordingLike, name: str, start_ts: float | None = None,
                 start_note: str | None = None) -> None:
        self.recording = recording  # for times typed relative to it ("14:05": that day of the recording)
        self.timeline = RecordedHistory(recording)
        times = self.timeline.times()
        if not times:
            raise ValueError("a recording without samples")
        self.name = name
        self.start_ts = times[0] if start_ts is None else start_ts
        self.start_note = start_note  # said once the replay is on screen (the typed time fell inside a gap)

    @property
    def interval_s(self) -> float:
        """The recording's sampling interval (1 s where its header does not say a valid one)."""
        interval = self.recording.meta.get("interval_s")
        return interval if isinstance(interval, int | float) and interval > 0 else 1.0

    def gap_before(self, ts: float) -> float:
        """Seconds without samples before the one at `ts`, where longer than 3 of the recording's intervals."""
        times = self.timeline.times()
        i = index_at(times, ts)
        gap = times[i] - times[i - 1] if 0 < i < len(times) else 0.0
        return gap if gap > 3 * self.interval_s else 0.0

    def gap_after(self, ts: float) -> float:
        """Seconds without samples after the one at `ts`, where longer than 3 of the recording's intervals."""
        times = self.timeline.times()
        i = index_at(times, ts)
        gap = times[i + 1] - times[i] if i + 1 < len(times) and times[i] <= ts else 0.0
        return gap if gap > 3 * self.interval_s else 0.0
