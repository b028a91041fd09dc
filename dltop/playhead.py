"""Where the screen is in time, as one value: `Live` (the newest sample, following the feed), `Paused` (a moment of
the live history, held while sampling goes on) or `Replay` (a moment of a recording, playing or not).

After below's `ViewMode` (Live, Pause, Replay) and `Advance` (a sample forward or back, a jump, a given time,
the latest): each move takes the timeline's times (oldest first) and returns the new value; the value itself is
never changed. A move that would go past either end returns None, so the caller can say so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

from dltop.timeline import index_at

SPEEDS = (1, 10, 60)  # replay speeds, as atop and below users know them

# Which time keys act in each mode: the App's check_action reads this table (an action and its parameters).
_BACK = {"step(-1)", "jump(-1)", "go_to(False)"}  # work from live too: they pause
_MOVES = {*_BACK, "step(1)", "jump(1)", "go_to(True)"}
KEYS: dict[str, frozenset[str]] = {
    "live": frozenset({"pause", *_BACK, "faster", "slower"}),
    "paused": frozenset({"live", *_MOVES, "faster", "slower"}),
    "replay": frozenset({"play", *_MOVES, "speed(1)", "speed(-1)"}),  # a recording keeps its cadence
    "playing": frozenset({"pause", *_MOVES, "speed(1)", "speed(-1)"}),
}
TIME_KEYS = frozenset().union(*KEYS.values())


@dataclass(frozen=True)
class Playhead:
    """Base of the three modes: `at` is the sample on screen (None live)."""

    at: float | None = None
    mode: ClassVar[str] = "live"
    replay: ClassVar[bool] = False

    @property
    def past(self) -> bool:
        """A past moment is on screen (paused, or a replay): nothing may change the system from it."""
        return self.at is not None

    def allows(self, action: str, parameters: tuple[object, ...] = ()) -> bool | None:
        """Whether the time key `action(parameters)` acts now; None for an action that is not a time key."""
        key = f"{action}({','.join(map(str, parameters))})" if parameters else action
        if key not in TIME_KEYS:
            return None
        return key in KEYS[self.mode]

    def _index(self, times: Sequence[float]) -> int:
        return len(times) - 1 if self.at is None else index_at(times, self.at)

    def go(self, times: Sequence[float], ts: float) -> Playhead:
        """The sample on screen at `ts` (live history: the newest one is live again)."""
        ts = times[index_at(times, ts)]
        return Live() if ts >= times[-1] else Paused(ts)

    def step(self, times: Sequence[float], n: int) -> Playhead | None:
        """`n` samples on (back where negative), at most to either end; None where already there."""
        if not times:
            return None
        i = self._index(times)
        j = min(max(i + n, 0), len(times) - 1)
        return None if j == i else self.go(times, times[j])

    def jump(self, times: Sequence[float], seconds: float) -> Playhead | None:
        """`seconds` on (back where negative), to the sample on screen then; over a gap in the recording, at least
        one sample; None where already at that end."""
        if not times:
            return None
        i = self._index(times)
        j = index_at(times, times[i] + seconds)
        if seconds > 0 and j <= i:
            j = i + 1
        if seconds < 0 and j >= i:
            j = i - 1
        j = min(max(j, 0), len(times) - 1)
        return None if j == i else self.go(times, times[j])

    def pause(self, times: Sequence[float]) -> Playhead:
        """Hold the newest sample (a replay: stop playing)."""
        return Paused(times[-1]) if times else self

    def live(self) -> Playhead:
        """Back to live (a replay stays a replay)."""
        return Live()

    def kept_within(self, oldest: float) -> Playhead:
        """The moment paused on, or the oldest one kept where it has left the history."""
        return self


@dataclass(frozen=True)
class Live(Playhead):
    """The newest sample, following the feed."""


@dataclass(frozen=True)
class Paused(Playhead):
    """A moment of the live history, held while sampling goes on."""

    at: float = 0.0
    mode: ClassVar[str] = "paused"

    def kept_within(self, oldest: float) -> Playhead:
        return Paused(oldest) if self.at < oldest else self


@dataclass(frozen=True)
class Replay(Playhead):
    """A moment of a recording. Playing moves `pos` on by `speed` seconds a second and shows the sample on screen
    at `pos` (it lies between samples while playing)."""

    at: float = 0.0
    playing: bool = False
    speed: int = SPEEDS[0]
    pos: float = 0.0
    replay: ClassVar[bool] = True

    @property
    def mode(self) -> str:  # type: ignore[override]
        return "playing" if self.playing else "replay"

    def go(self, times: Sequence[float], ts: float) -> Replay:
        ts = times[index_at(times, ts)]
        return replace(self, at=ts, pos=ts)

    def pause(self, times: Sequence[float]) -> Replay:
        return replace(self, playing=False)

    def live(self) -> Replay:
        return self

    def play(self, times: Sequence[float]) -> Replay:
        """Play from the moment shown (from the start again at the end)."""
        head = self.go(times, times[0]) if self.at >= times[-1] else self
        return replace(head, playing=True, pos=head.at)

    def faster(self, n: int) -> Replay:
        """One speed up (1) or down (-1) of SPEEDS."""
        i = min(max(SPEEDS.index(self.speed) + n, 0), len(SPEEDS) - 1)
        return replace(self, speed=SPEEDS[i])

    def tick(self, times: Sequence[float], dt_s: float) -> Replay:
        """`dt_s` seconds of playing later; at the last sample, playing stops there."""
        pos = self.pos + self.speed * dt_s
        if pos >= times[-1]:
            return replace(self, at=times[-1], pos=times[-1], playing=False)
        return replace(self, at=times[index_at(times, pos)], pos=pos)
