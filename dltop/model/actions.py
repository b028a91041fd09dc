"""What the action runner announces: each action's plan (the facts a confirmation states) and its events.

Small frozen records, so the TUI can render them, the recorder can log them and a test can compare them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Step = Literal["plan", "run", "release"]  # measuring what it would do; doing it; letting go of what it holds
Phase = Literal["started", "progress", "finished"]
Outcome = Literal["ok", "cancelled", "refused", "error"]


@dataclass(frozen=True)
class ActionPlan:
    """What an action would do, measured just now: the bytes it would move and the guard's verdict."""

    action: str  # "warm", "evict", "lock"
    target: str
    bytes: int  # warm: data not resident yet; evict: resident (and hidden) pages; lock: the pages of data
    files: int
    allowed: bool  # the guard's verdict; False: the action is refused as planned
    guard: str = ""  # the guard's verdict in words ("" for an action without a guard)
    fits_bytes: int | None = None  # a refused warm can still bring in this much (the part that fits)
    notes: tuple[str, ...] = ()  # what the user should know before saying yes
    refused_by: str = ""  # a refused clear: the rule that refused it ("system folder", "home", ...)
    apparent_bytes: int | None = None  # warm, evict, lock: the files' apparent size (holes of sparse files in it)

    @property
    def can_fit(self) -> bool:
        """A refused warm can warm the part that fits instead."""
        return self.action == "warm" and not self.allowed and bool(self.fits_bytes)


@dataclass(frozen=True)
class ActionEvent:
    """One step of one action: started, progress, finished. The same record for the CLI, the TUI and the log."""

    run_id: int  # every plan, run and release gets its own
    step: Step
    phase: Phase
    action: str
    target: str  # the paths as one label
    ts: float
    paths: tuple[str, ...] = ()  # the paths themselves, for whoever logs them
    done_bytes: int | None = None
    total_bytes: int | None = None
    elapsed_s: float = 0.0
    rate_bytes_per_s: float | None = None
    eta_s: float | None = None
    files_done: int | None = None
    outcome: Outcome | None = None  # set when finished
    message: str = ""


SIGNALS = ("SIGTERM", "SIGKILL", "SIGINT")  # what the GPU tab's signal dialog offers, the first selected


@dataclass(frozen=True)
class SignalTarget:
    """A signal for one process, named by pid and start time (/proc/PID/stat's starttime, in clock ticks):
    the runner checks the start time again before it sends, so a pid reused since the row was drawn is spared."""

    pid: int
    start_time_ticks: int
    signal: str = "SIGTERM"
    command: str = ""  # what the user saw in the row, for the outcome's line
