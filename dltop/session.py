"""What the TUI shows and what may be done from it, without a widget: the history and its hints, where the screen
is in time (a Playhead), the hints muted or snoozed, the tab to open on, the gate every action passes (read-only,
a past moment, one action at a time), the edits of what is watched, and `view()`, what the panes are handed.

The App composes the widgets, routes the keys to this Session and draws what it says; every message for the user
goes through `say` (a log tests read, and the App's notifications).
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

from dltop import hints as hint_rules
from dltop import watchlist
from dltop.config import MAX_REFRESH_S, MIN_REFRESH_S, Settings
from dltop.errors import DltopError
from dltop.model import CachesPart, Snapshot, to_dict
from dltop.model.actions import ActionEvent, ActionPlan, SignalTarget
from dltop.model.datasets import DatasetsPart
from dltop.model.probes import ProbesPart, job_rank_by_pid
from dltop.playhead import Live, Playhead, Replay
from dltop.tabs import OpeningTab
from dltop.timeline import Feed, LiveEvent, LiveHistory, Recorded, Timeline
from dltop.view import View

HISTORY_LEN = 600  # ten minutes at the default refresh: what the sparklines show
REFRESH_STEPS = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
SAID_KEPT = 100

Severity = Literal["information", "warning", "error"]


@dataclass(frozen=True)
class Said:
    """One message for the user (the App shows it as a notification)."""

    text: str
    severity: Severity = "information"
    timeout: float | None = None
    title: str = ""


class RecordSink(Protocol):
    """Where `--record DIR` writes (`dltop.recorder.Recorder`): every Snapshot shown, and the user's markers."""

    def write(self, snapshot: Snapshot) -> None: ...
    def event(self, kind: str, data: dict[str, Any], ts: float | None = None) -> None: ...


def next_refresh(current: float, faster: bool) -> float:
    """The refresh interval one step faster or slower than `current`, within MIN_REFRESH_S..MAX_REFRESH_S."""
    if faster:
        smaller = [s for s in REFRESH_STEPS if s < current - 1e-9]
        return max(smaller[-1] if smaller else current, MIN_REFRESH_S)
    larger = [s for s in REFRESH_STEPS if s > current + 1e-9]
    return min(larger[0] if larger else current, MAX_REFRESH_S)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


class Session:
    """The state behind the screen. Live, `feed` streams Snapshots (`apply` each); a replay has no feed and moves
    through `recorded`'s timeline. `runner` is the action runner (dltop.actions.runner.ActionRunner)."""

    def __init__(self, feed: Feed | None, settings: Settings | None = None, *, recorded: Recorded | None = None,
                 runner: Any = None, clock: Callable[[], float] = time.time, recorder: RecordSink | None = None,
                 listeners: Sequence[Callable[[Snapshot], None]] = ()) -> None:
        self.feed = feed
        self.recorded = recorded
        self.settings = settings or Settings()
        self.runner = runner
        self.recorder = recorder
        self.clock = clock
        self.history: deque[Snapshot] = deque(maxlen=HISTORY_LEN)
        self.hints: list[hint_rules.Hint] = []
        # A past moment is the Snapshot taken at `head.at` on the timeline: the session's own history live, the
        # recording in a replay (which is always at a moment).
        self.timeline: Timeline = recorded.timeline if recorded is not None else LiveHistory(self.history)
        self.head: Playhead = Live() if recorded is None else Replay(recorded.start_ts, pos=recorded.start_ts)
        self._past: tuple[float, tuple[Snapshot, ...], tuple[hint_rules.Hint, ...]] | None = None
        self.quieted = hint_rules.Quieted(self.settings.mute, clock)  # hints muted or snoozed (still listed in ?)
        self._passed: frozenset[tuple[str, str]] = frozenset()  # the subjects the hints were drawn passing over
        self.tabs = OpeningTab(recorder, replay=recorded is not None)  # the tab to open on
        self.action: ActionEvent | None = None  # the runner's latest event
        self.plans: dict[int, Any] = {}  # plans in flight, by run id: their result is confirmed
        self.said: deque[Said] = deque(maxlen=SAID_KEPT)
        self.farewell: list[str] = []  # said on the terminal once the TUI has left it (a lock kept by a holder)
        self.on_say: Callable[[Said], None] | None = None  # the App's notification
        # Each Snapshot shown is handed on too (`dltop --export`'s collector, `--record`'s recorder).
        self._listeners = (*listeners, recorder.write) if recorder is not None else tuple(listeners)

    @property
    def replay(self) -> bool:
        """A recording is shown (nothing streams, nothing may change the system)."""
        return self.recorded is not None

    @property
    def idle(self) -> bool:
        """No action or plan in flight, and the last one's finish is in."""
        done = self.action is None or self.action.phase == "finished"
        return done and self.runner.busy is None and not self.plans

    def say(self, text: str, severity: Severity = "information", timeout: float | None = None,
            title: str = "") -> None:
        """A message for the user: kept in `said`, and shown by the App."""
        said = Said(text, severity, timeout, title)
        self.said.append(said)
        if self.on_say is not None:
            self.on_say(said)

    # -- Snapshots in -------------------------------------------------------------------------------------------

    def open(self) -> None:
        """The first moment: the feed's backlog and its current Snapshot, or the recording's start."""
        if self.feed is not None:
            self.history.extend(self.feed.backlog())
            self.apply(self.feed.snapshot())
        elif self.recorded is not None:
            self.apply(self.recorded.timeline.upto(self.recorded.start_ts, 1)[-1])
            if self.recorded.start_note:  # `replay -t` named a time inside a gap
                self.say(self.recorded.start_note, "warning", timeout=10)

    def apply(self, snap: Snapshot) -> bool:
        """A new Snapshot from the feed: into the history, to the listeners, and the hints drawn again. False
        where it is the one applied last (nothing new to draw)."""
        if self.history and snap is self.history[-1]:
            return False
        self.history.append(snap)
        for listen in self._listeners:
            listen(snap)  # the recorder of --record among them: what this screen shows, so a replay shows the same
        self.hints = self._hints(list(self.history))
        self.head = self.head.kept_within(self.history[0].ts)
        return True

    def frame(self) -> tuple[tuple[Snapshot, ...], tuple[hint_rules.Hint, ...]] | None:
        """The Snapshots up to the moment on screen (oldest first) and its hints: the latest live; in the past,
        the window that ended there and the hints drawn from it by the same rules, so the numbers are those live
        showed then."""
        at = self.head.at
        if at is None:
            return (tuple(self.history), tuple(self.hints)) if self.history else None
        if self._past is None or self._past[0] != at:
            window = tuple(self.timeline.upto(at, HISTORY_LEN))
            if not window:
                return None
            self._past = (at, window, tuple(self._hints(window)))
        return self._past[1], self._past[2]

    def view(self) -> View | None:
        """What the panes are handed: the moment on screen and the actions' state."""
        frame = self.frame()
        if frame is None:
            return None
        history, hints = frame
        runner = self.runner
        return View(snapshot=history[-1], history=history, hints=hints, read_only=self.settings.read_only,
                    replay=self.head.past, frozen=self.frozen(), past=self.past(),
                    watched=tuple(self.settings.datasets), action=self.action,
                    busy=runner is not None and runner.busy is not None,
                    held=runner.locked() if runner is not None and not self.replay else {})

    # -- time -------------------------------------------------------------------------------------------------

    def allows(self, action: str, parameters: tuple[object, ...] = ()) -> bool:
        """Whether the app's key `action(parameters)` acts now: the time keys by the playhead's mode; `v` in a
        replay, and live once an action was seen; every other key always (a pane's keys ask its own gate)."""
        allowed = self.head.allows(action, parameters)
        if allowed is not None:
            return allowed
        if action == "events":
            return self.replay or bool(self.timeline.events())
        return True

    def times(self) -> Sequence[float]:
        """The times of the timeline, oldest first."""
        return self.timeline.times()

    def end_text(self, n: int) -> str:
        """What to say when a move towards `n` (< 0: back) finds the end of the timeline."""
        if n < 0:
            return "the first sample of the recording" if self.replay else "the oldest sample kept"
        return "the last sample of the recording" if self.replay else "the newest sample"

    def parse_time(self, text: str) -> float:
        """Epoch seconds of a typed time ("10m ago", "14:05", ISO 8601); DltopError where it is not one."""
        from dltop.recorder.times import parse_time  # pure (no reader, no writer): the one way times are read

        recording = self.recorded.recording if self.recorded is not None else None
        return parse_time(text, self.clock(), recording)  # type: ignore[arg-type]

    def time_refusal(self, text: str) -> str | None:
        """Why the typed time cannot be gone to (not a time, outside the timeline), or None."""
        times = self.times()
        try:
            ts = self.parse_time(text)
        except DltopError as e:
            return str(e)
        if not times[0] <= ts <= times[-1] + max(self.settings.refresh_s, 1.0):
            return (f"{_hms(ts)} is outside {'the recording' if self.replay else 'the history kept'}: "
                    f"{_hms(times[0])} to {_hms(times[-1])}")
        return None

    def go_typed(self, text: str) -> Playhead:
        """The playhead at the sample a typed time names (checked by time_refusal first); a time inside a gap is
        said to be (the sample shown is the last before it)."""
        from dltop.recorder.times import gap_note, index_typed

        times, ts = self.times(), self.parse_time(text)
        interval = self.recorded.interval_s if self.recorded is not None else self.settings.refresh_s
        note = gap_note(times, ts, interval)
        if note is not None:
            self.say(note, "warning", timeout=10)
        return self.head.go(times, times[index_typed(times, ts)])

    def mark_refusal(self) -> str | None:
        """Why `m` cannot write a marker here (a replay, nothing recorded), or None."""
        if self.replay:
            return "m: this is a replay; a marker goes into a live recording (dltop --record DIR, or dltop mark)"
        if self.recorder is None:
            return "m: nothing is being recorded (start dltop with --record DIR)"
        return None

    def mark(self, text: str, ts: float) -> None:
        """A marker with the user's `text` at `ts` into --record's recording."""
        if self.recorder is not None:
            self.recorder.event("marker", {"text": text, "by": "dltop"}, ts=ts)
            self.say(f"marker at {_hms(ts)}: {text}", timeout=3)

    def set_refresh(self, faster: bool) -> None:
        """Refresh one step more (or less) often; sources rebuilt later follow it too."""
        value = next_refresh(self.settings.refresh_s, faster)
        self.settings = replace(self.settings, refresh_s=value)
        if self.feed is not None:
            self.feed.set_refresh(value)

    # -- hints --------------------------------------------------------------------------------------------------

    def line_hints(self, tab: str | None) -> list[hint_rules.Hint]:
        """The hints of the moment on screen the hint line may show, `tab`'s own first (each group most severe
        first)."""
        frame = self.frame()
        if frame is None:
            return []
        return line_order([h for h in frame[1] if not self.quieted.state(h.id, h.subject)], tab, frame[0][-1])

    def help_hints(self, tab: str | None) -> list[hint_rules.Hint]:
        """Every hint for ?, in the hint line's order, the muted and snoozed ones after (still listed, also those
        about a subject the rules passed over to name the next)."""
        frame = self.frame()
        if frame is None:
            return []
        line = self.line_hints(tab)
        drawn = {(h.id, h.subject) for h in frame[1]}
        passed = [h for h in hint_rules.hints(frame[0]) if (h.id, h.subject) not in drawn
                  and self.quieted.state(h.id, h.subject)] if self.quieted.passed() else []
        return [*line, *(h for h in frame[1] if h not in line), *passed]

    def hints_quieted(self) -> None:
        """A hint was muted, snoozed or brought back: where that changed the subjects passed over, the hints are
        drawn again (a rule names its next subject)."""
        if self.quieted.passed() == self._passed:
            return
        if self.history:
            self.hints = self._hints(list(self.history))
        self._past = None

    def _hints(self, history: Sequence[Snapshot]) -> list[hint_rules.Hint]:
        self._passed = self.quieted.passed()
        return hint_rules.hints(history, self._passed)

    # -- the action gate ----------------------------------------------------------------------------------------

    def frozen(self) -> str | None:
        """Why nothing may change the system from here (read-only, a replay, paused on a past moment), or None."""
        if self.settings.read_only:
            return "dltop runs --read-only"
        return self.past()

    def past(self) -> str | None:
        """Why the moment on screen is not now (a replay, paused on a past moment), or None: what a key that
        reads or edits the system now (a process's environment, the datasets watched) says there."""
        if self.replay:
            return "this is a replay"
        if self.head.past:
            return "paused on a past moment (space goes back to live)"
        return None

    def refusal(self, action: str) -> str | None:
        """Why `action` may not change the system from here, or None."""
        why = self.frozen()
        return None if why is None else f"{action}: {why}; nothing may change the system from here"

    def request(self, action: str, path: str) -> None:
        """A pane asks for `action` on `path`: through the gate, then planned (its plan comes back as an event and
        is confirmed); a lock asked for on a locked target unlocks it."""
        refused = self.refusal(action)
        if refused is not None:
            self.say(refused, "warning")
            return
        if self.runner.busy is not None:
            self.say(f"{self.runner.busy.action} {self.runner.busy.target} is still running (Esc cancels)", "warning")
            return
        if action == "lock" and path in self.runner.locked():  # here, or kept by this user's holder process
            self.runner.release(path)
            return
        run = self.runner.plan(action, [path], options=self._options(action), others=self._watched_resident())
        self.plans[run.id] = run

    def start(self, plan: ActionPlan) -> None:
        """Run a plan the user confirmed."""
        try:
            self.runner.start(plan.action, [plan.target], options=self._options(plan.action), fit=plan.can_fit,
                              others=self._watched_resident())
        except DltopError as e:  # another action started meanwhile
            self.say(str(e), "error")

    # -- quitting with a lock held: the lock dialog promised "until you press l again" -------------------------

    def held_locks(self) -> dict[str, int]:
        """The locks this session holds (target: bytes): q asks what becomes of them before it quits."""
        return self.runner.held() if self.runner is not None else {}

    def keep_locks(self, why: str = "") -> bool:
        """Hand every lock held to a detached holder that keeps it after dltop (the user said keep, or nobody is
        left to ask: `why` "on hangup"). Each handover is said and journalled; where no holder takes a lock, the
        reason is said: asked (no `why`), the lock stays held here and False says not to quit; on a hangup, it
        is released, with the reason journalled (never silently)."""
        if self.runner is None:
            return True
        if why:
            for line in self.runner.keep_all(why):
                self.say(line)
                self.farewell.append(line)
            return True
        for target in self.held_locks():
            try:
                self.farewell.append(self.runner.keep(target))
            except DltopError as e:
                self.say(f"{e}; it stays locked here (q again: release it)", "error", timeout=10)
                return False
        return True

    def release_locks(self) -> None:
        """Unlock every lock held (the user said release)."""
        for target in self.held_locks():
            self.runner.release(target)  # announced and journalled
            self.farewell.append(f"unlocked {target}")

    def send_signal(self, target: SignalTarget | tuple[SignalTarget, ...]) -> None:
        """A signal the GPU tab's dialog chose, for one process or a tagged set (the dialog was the confirmation;
        the runner checks each start time again before it sends)."""
        refused = self.refusal("signal")
        if refused is not None:
            self.say(refused, "warning")
            return
        try:
            targets = target if isinstance(target, tuple) else (target,)
            self.runner.start("signal", [f"pid {t.pid}" for t in targets], options=target)
        except DltopError as e:  # another action runs
            self.say(str(e), "error")

    def _options(self, action: str) -> Any:
        """A clear resolves the known caches as the Caches tab does: in --pid's environment, with --cache's."""
        return self.settings if action == "clear" else None

    def _watched_resident(self) -> dict[str, int]:
        return watched_resident(self.history[-1] if self.history else None)

    def _owner(self, path: str) -> str | None:
        return owner_of(path, self.settings.datasets, self.history[-1] if self.history else None)

    def on_action(self, ev: ActionEvent) -> ActionPlan | None:
        """An event of the runner: kept for the panes and the live events; a finished run's numbers read again.
        Returns a plan that is ready to be confirmed."""
        self.action = ev
        if ev.phase != "progress" and ev.step != "plan":  # as the recorder logs it: runs and releases
            self.add_events([LiveEvent(ev.ts, "action", {**to_dict(ev), "pid": os.getpid(), "uid": os.geteuid()})])
        if ev.phase != "finished":
            return None
        plan = self._confirmable(ev) if ev.step == "plan" else None
        if ev.step in ("run", "release"):
            self._read_after(ev)
        said = outcome_said(ev)
        if said is not None:
            self.say(said.text, said.severity, said.timeout)
        return plan

    def _confirmable(self, ev: ActionEvent) -> ActionPlan | None:
        """The plan a finished plan step measured, unless it failed or its dataset was unwatched meanwhile
        (nobody is looking at that row any more)."""
        run = self.plans.pop(ev.run_id, None)
        plan = run.result if run is not None and ev.outcome == "ok" else None
        if not isinstance(plan, ActionPlan):
            return None
        return plan if plan.action == "clear" or not self.settings.datasets or self._owner(plan.target) else None

    def _read_after(self, ev: ActionEvent) -> None:
        """A finished run's numbers without waiting for the next tick: the GPU processes after a signal (the
        process gone from the table), the cache after a clear, that dataset only after a warm, evict, lock or
        unlock (watched or found)."""
        if ev.action == "signal":
            self.read_now("gpus")
        elif ev.action == "clear":
            self.read_now("caches", cache_of(ev.paths[0], self.history[-1]) if ev.paths and self.history else None)
        else:
            self.read_now("datasets", next(filter(None, map(self._owner, ev.paths)), None))

    def add_events(self, found: Sequence[LiveEvent]) -> bool:
        """Events seen live (actions here and anywhere on the machine); True where they are the first ones."""
        if not isinstance(self.timeline, LiveHistory):
            return False
        first = not self.timeline.events()
        for e in found:
            self.timeline.add_event(e)
            if e.kind == "action":
                self._read_after_outside(e.data)
        return first and bool(found)

    def _read_after_outside(self, data: Mapping[str, Any]) -> None:
        """Another process's action on a dataset shown here, measured again now as after one run here (its low is
        not missed until the next scan)."""
        owner = next(filter(None, map(self._owner, outside_action_paths(data))), None)
        if owner is not None:
            self.read_now("datasets", owner)

    # -- what is watched ----------------------------------------------------------------------------------------

    def read_now(self, source: str, key: str | None = None) -> None:
        """Read a source again now, not at its next turn (a recording has no system to read again)."""
        if self.feed is not None and not self.replay:
            self.feed.read_now(source, key)

    def _edit(self, edit: watchlist.Edit) -> None:
        settings, text, severity = edit
        if settings is not None:
            self.settings = settings
            if self.feed is not None:
                self.feed.reconfigure(settings)
        if text:
            self.say(text, severity, timeout=3 if settings is not None else None)

    def add_dataset(self, typed: str) -> None:
        """Watch one more dataset folder."""
        self._edit(watchlist.add_dataset(self.settings, typed))

    def remove_dataset(self, path: str) -> None:
        """Stop watching a dataset folder (a lock under it is released: no row would be left to unlock it)."""
        if path in self.settings.datasets:
            for target in self.runner.held():
                if self._owner(target) == path:
                    self.runner.release(target)
        self._edit(watchlist.remove_dataset(self.settings, path))

    def add_server(self, text: str) -> None:
        """Scrape one more inference server (host:port or a URL, as typed)."""
        self._edit(watchlist.add_server(self.settings, text))

    def remove_server(self, text: str) -> None:
        """Stop scraping an inference server (as typed, or its /metrics URL)."""
        self._edit(watchlist.remove_server(self.settings, text))


def outcome_said(ev: ActionEvent) -> Said | None:
    """What a finished step says: a failure or refusal, a release, a signal sent (a warm, evict or clear shows in
    its pane)."""
    if ev.outcome in ("error", "refused"):
        return Said(ev.message, "error", timeout=8)
    if ev.step == "release":
        return Said(ev.message)
    if ev.step == "run" and ev.action == "signal" and ev.outcome == "ok":
        return Said(ev.message, timeout=6)
    return None


def line_order(hints: list[hint_rules.Hint], tab: str | None, snap: Snapshot) -> list[hint_rules.Hint]:
    """`hints` with `tab`'s own first, then those about the viewer's job before another user's (the Training
    tab's order); stable, so each group stays most severe first."""
    job = job_rank_by_pid(snap.probes, snap.gpus) if isinstance(snap.probes, ProbesPart) else {}

    def place(h: hint_rules.Hint) -> tuple[bool, int]:
        pid = h.numbers.get("pid")
        return hint_rules.tab_of(h.id) != tab, job.get(int(pid), 0) if isinstance(pid, int | float) else 0

    return sorted(hints, key=place)


def watched_resident(snap: Snapshot | None) -> dict[str, int]:
    """Resident bytes of every watched dataset: what a warm's guard names as at risk when reading past free memory
    pushes page cache out (the runner leaves out the warmed one)."""
    part = snap.datasets if snap is not None else None
    if not isinstance(part, DatasetsPart):
        return {}
    return {ds.path: ds.resident_pages * ds.page_size for ds in part.scanned}


def cache_of(path: str, snap: Snapshot) -> str | None:
    """The name of the cache that `path` is, or is inside."""
    part = snap.caches
    if not isinstance(part, CachesPart):
        return None
    return next((c.name for c in part.caches if _under(path, c.path)), None)


def owner_of(path: str, watched: Sequence[str], snap: Snapshot | None) -> str | None:
    """The watched dataset that `path` is, or is inside; else the found one (a folder a training job reads)."""
    got = next((p for p in watched if _under(path, p)), None)
    if got is None and snap is not None and isinstance(part := snap.datasets, DatasetsPart):
        got = next((f.path for f in part.found if _under(path, f.path)), None)
    return got


def outside_action_paths(data: Mapping[str, Any]) -> list[str]:
    """The paths of a warm, evict or lock another process ran and finished (a `dltop evict` from a shell), which
    the Session measures again; [] for anything else (this process's own actions are read after they run)."""
    if data.get("pid") == os.getpid() or data.get("phase") != "finished" or data.get("action") not in (
            "warm", "evict", "lock") or data.get("step") not in ("run", "release"):
        return []
    return [p for p in data.get("paths") or () if isinstance(p, str)]


def _hms(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts))
