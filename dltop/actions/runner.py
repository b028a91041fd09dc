"""The one place actions run: the CLI subcommands and the TUI both ask this runner.

It measures what an action would do (`plan`), runs it in a worker thread (`start`) with progress and a cancel,
holds what must stay held (mlocked pages) until `release`, and announces every start, progress step and finish
as an `ActionEvent` to whoever subscribed (the TUI renders them, its recorder logs them), and appends each
start and finish to the machine's action journal, which every running recorder tails (`dltop/journal.py`).
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dltop import journal
from dltop.errors import DltopError
from dltop.fmt import human_bytes
from dltop.model import to_dict
from dltop.model.actions import ActionEvent, ActionPlan, Outcome, Step

Listener = Callable[[ActionEvent], None]
HOLDERS_EVERY_S = 5.0  # how often locked() looks in /proc for this user's holder processes (~12 us a process)
VERBS = {"warm": "warmed", "evict": "evicted", "lock": "locked"}


@dataclass
class Run:
    """One plan, run or release: wait on `done`, then read `result` (an ActionPlan or an ActionResult) or
    `error` (what went wrong, as the exception the action raised)."""

    id: int
    step: Step
    action: str
    paths: tuple[str, ...]
    cancel: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None

    @property
    def target(self) -> str:
        """The paths as one label."""
        return ", ".join(self.paths)

    @property
    def cancelled(self) -> bool:
        """A cancel was asked for."""
        return self.cancel.is_set()


@dataclass
class _Held:
    bytes: int
    release: Callable[[], None]
    keep: Callable[[], Any] | None = None  # hands the lock to a detached holder (actions/holder.py): its Kept


class ActionRunner:
    """Runs one action at a time, announces its events, and holds locked pages until released."""

    def __init__(self, clock: Callable[[], float] = time.time, journal: bool = True) -> None:
        self._clock = clock
        self._journal = journal  # each run's start and finish go to the machine's action journal (dltop/journal.py)
        self._listeners: list[Listener] = []
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._busy: Run | None = None
        self._held: dict[str, _Held] = {}
        self._holders: tuple[float, list[Any]] | None = None  # (when read, this user's holders): locked()'s
        self.listener_errors: list[str] = []  # what listeners raised; they run on the worker thread

    # -- who listens ---------------------------------------------------------------------------------------

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call `listener` with every event (from the worker thread); returns the unsubscribe function."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def _announce(self, run: Run, phase: str, *, journalled: bool = True, **kw: Any) -> None:
        event = ActionEvent(run_id=run.id, step=run.step, phase=phase, action=run.action,  # type: ignore[arg-type]
                            target=run.target, paths=run.paths, ts=self._clock(), **kw)
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception as e:  # a listener's trouble (a full disk under the recorder) never wedges an action
                self.listener_errors.append(f"{type(e).__name__}: {e}")
        if self._journal and journalled and phase != "progress" and run.step != "plan":
            self._journal_line(event)

    def _journal_line(self, event: ActionEvent) -> None:
        """Tell every running recorder on the machine (they tail the journal): a warm from a shell is logged too."""
        line = journal.encode(to_dict(event))
        if line is None:
            return
        try:
            journal.append(line)
        except OSError as e:  # no runtime directory, a full /run: the action goes on, the reason is kept
            self.listener_errors.append(f"action journal: {e.strerror or e}")

    # -- what runs -----------------------------------------------------------------------------------------

    @property
    def busy(self) -> Run | None:
        """The plan or run in flight, if any."""
        return self._busy

    def plan(self, action: str, paths: Sequence[str], *, options: Any = None, wait: bool = False,
             others: Mapping[str, int] | None = None) -> Run:
        """Measure what `action` would do on `paths` (a residency scan) in a worker; the result is an ActionPlan.
        `others`: resident bytes of the other watched datasets, which a warm's guard names as at risk."""
        return self._spawn("plan", action, paths, lambda run: spec_of(run.action).plan(run, options, others), wait)

    def start(self, action: str, paths: Sequence[str], *, options: Any = None, force: bool = False,
              fit: bool = False, dry_run: bool = False, wait: bool = False,
              others: Mapping[str, int] | None = None) -> Run:
        """Run `action` on `paths` in a worker; the result is the action's ActionResult. A lock's pages stay
        locked, held here under the target, until `release(target)`."""
        return self._spawn("run", action, paths, lambda run: self._run(
            run, options, force=force, fit=fit, dry_run=dry_run, others=others), wait)

    def cancel(self) -> bool:
        """Ask the plan or run in flight to stop; False when nothing runs."""
        run = self._busy
        if run is None:
            return False
        run.cancel.set()
        return True

    def _spawn(self, step: Step, action: str, paths: Sequence[str], body: Callable[[Run], Any], wait: bool) -> Run:
        with self._lock:
            if self._busy is not None:
                raise DltopError(f"{self._busy.action} {self._busy.target} is still running")
            run = Run(id=next(self._ids), step=step, action=action, paths=tuple(paths))
            self._busy = run
        thread = threading.Thread(target=self._work, args=(run, body), name=f"dltop-{action}", daemon=True)
        thread.start()
        if wait:
            run.done.wait()
        return run

    def _work(self, run: Run, body: Callable[[Run], Any]) -> None:
        try:
            self._work_on(run, body)
        finally:
            with self._lock:
                self._busy = None
            run.done.set()

    def _work_on(self, run: Run, body: Callable[[Run], Any]) -> None:
        self._announce(run, "started")
        outcome: Outcome = "ok"
        message = ""
        extra: dict[str, Any] = {}
        try:
            run.result = body(run)
        except DltopError as e:
            run.error, outcome, message = e, "refused", str(e)
        except OSError as e:
            run.error, outcome, message = e, "error", f"{run.action} failed: {e.strerror or e}"
        except BaseException as e:  # a bug must reach the caller, not vanish with the thread
            run.error, outcome, message = e, "error", f"{run.action} failed: {type(e).__name__}: {e}"
        else:
            outcome, message, extra = _finished(run)
        with self._lock:
            self._busy = None  # before the finish is announced: a listener may start the next action at once
        self._announce(run, "finished", outcome=outcome, message=message, **extra)

    def _run(self, run: Run, options: Any, *, force: bool, fit: bool, dry_run: bool,
             others: Mapping[str, int] | None) -> Any:
        spec = spec_of(run.action)

        def progress(p: Any) -> None:
            # An evict's total is known only at its end: None, not a total of 0 (a bar full or empty).
            total = p.total_bytes if getattr(p, "sized", True) else None
            self._announce(run, "progress", done_bytes=p.done_bytes, total_bytes=total,
                           elapsed_s=p.elapsed_s, rate_bytes_per_s=p.rate_bytes_per_s, eta_s=p.eta_s,
                           files_done=p.files_done, message=p.path)

        return spec.run(self, run, options, Flags(force, fit, dry_run, others), progress)

    # -- what is held --------------------------------------------------------------------------------------

    def _hold(self, target: str, n_bytes: int, release: Callable[[], None],
              keep: Callable[[], Any] | None = None) -> None:
        with self._lock:
            self._held[target] = _Held(n_bytes, release, keep)

    def held(self) -> dict[str, int]:
        """Targets whose pages are locked now, with the bytes locked."""
        with self._lock:
            return {k: h.bytes for k, h in self._held.items()}

    def locked(self) -> dict[str, int | None]:
        """What is locked that this user may unlock: held() and the targets this user's holder processes keep
        (`dltop lock --detach`, q → Keep in the TUI; owner = the uid of /proc/PID, so another user's holder is
        never counted as this user's, root's included), with the bytes they hold (None: /proc does not say).
        The holders are looked for at most every HOLDERS_EVERY_S; a release or a handover here looks again."""
        out: dict[str, int | None] = {h.target: h.locked_bytes for h in self._own_holders()}
        out.update(self.held())
        return out

    def _own_holders(self) -> list[Any]:
        from dltop.actions import holder

        now = time.monotonic()
        with self._lock:
            cached = self._holders
        if cached is not None and now - cached[0] < HOLDERS_EVERY_S:
            return cached[1]
        uid = os.geteuid()
        mine = [h for h in holder.holders(uid=uid)[0] if h.uid == uid]
        with self._lock:
            self._holders = (now, mine)
        return mine

    def release(self, target: str) -> int:
        """Unlock what a lock of `target` holds, here or in this user's holder process (as `dltop unlock` does);
        returns the bytes let go (0 when nothing was held, or a holder's bytes were not known)."""
        with self._lock:
            h = self._held.pop(target, None)
        if h is None:
            return self._release_holder(target)
        run = Run(id=next(self._ids), step="release", action="lock", paths=(target,))
        self._announce(run, "started")
        h.release()
        self._announce(run, "finished", outcome="ok", done_bytes=h.bytes,
                       message=f"unlocked {human_bytes(h.bytes)} of {target}")
        run.done.set()
        return h.bytes

    def _release_holder(self, target: str) -> int:
        """SIGTERM to this user's holder of `target` (checked again: owner, start time), announced; the holder
        journals its own release, so this announcement is not journalled again."""
        from dltop.actions import holder

        with self._lock:
            self._holders = None
        held = [h for h in self._own_holders() if h.target == target]
        if not held:
            return 0
        run = Run(id=next(self._ids), step="release", action="lock", paths=(target,))
        self._announce(run, "started", journalled=False)
        done, lines, failed = 0, [], []
        for h in held:
            try:
                lines.append(holder.unlock(h))
                done += h.locked_bytes or 0
            except DltopError as e:
                failed.append(str(e))
        with self._lock:
            self._holders = None
        if failed:
            self._announce(run, "finished", journalled=False, outcome="error", message="; ".join(lines + failed))
        else:
            self._announce(run, "finished", journalled=False, outcome="ok", done_bytes=done,
                           message="; ".join(lines))
        run.done.set()
        return done

    def release_all(self) -> None:
        """Unlock everything held (on exit)."""
        for target in self.held():
            self.release(target)

    def keep(self, target: str, why: str = "") -> str:
        """Hand what a lock of `target` holds to a detached holder process (dltop/actions/holder.py), which keeps
        it locked after this process ends; this process lets its own go once the holder holds it. Returns the
        line that says so (also announced and journalled); raises DltopError when no holder took it (then it is
        still held here). `why`: the reason it was kept ("on hangup"), for the journal."""
        with self._lock:
            h = self._held.get(target)
        if h is None:
            raise DltopError(f"{target} is not locked")
        if h.keep is None:
            raise DltopError(f"{target}: this lock cannot be handed over")
        try:
            kept = h.keep()
        except OSError as e:
            raise DltopError(f"could not keep the lock of {target}: {e.strerror or e}") from None
        with self._lock:
            self._held.pop(target, None)
            self._holders = None  # locked(): the holder that holds it now
        h.release()  # the holder holds every page now: nothing is let go
        run = Run(id=next(self._ids), step="release", action="lock", paths=(target,))
        self._announce(run, "started")
        missed = f"; {kept.missed} files were replaced or gone and are not held" if kept.missed else ""
        message = (f"kept {human_bytes(kept.bytes)} of {target} locked{' ' + why if why else ''} in lock holder "
                   f"pid {kept.pid} (dltop lock --list; dltop unlock {kept.pid} releases it){missed}")
        self._announce(run, "finished", outcome="ok", done_bytes=0, message=message)
        run.done.set()
        return message

    def keep_all(self, why: str = "") -> list[str]:
        """`keep` every lock held; a lock no holder took is released with the reason said (never silently)."""
        lines = []
        for target in self.held():
            try:
                lines.append(self.keep(target, why))
            except DltopError as e:
                self.release(target)
                lines.append(f"{e}: released")
        return lines

    def close(self) -> None:
        """Stop what runs and let go of what is held."""
        self.cancel()
        self.release_all()


def _finished(run: Run) -> tuple[Outcome, str, dict[str, Any]]:
    """The outcome, message and numbers a step that returned announces (a run's summary, a plan's guard)."""
    r = run.result
    if run.step == "run":
        return ("cancelled" if r.cancelled else "ok", spec_of(run.action).summary(r),
                {"done_bytes": r.done_bytes, "total_bytes": r.total_bytes, "elapsed_s": r.elapsed_s,
                 "files_done": r.files_done})
    outcome: Outcome = "cancelled" if run.cancelled else "ok"
    if isinstance(r, ActionPlan):
        return outcome, r.guard, {"total_bytes": r.bytes}
    return outcome, "", {}


@dataclass(frozen=True)
class Flags:
    """How a run was asked for: past the guard (force), only what fits (fit), or not at all (dry_run)."""

    force: bool = False
    fit: bool = False
    dry_run: bool = False
    others: Mapping[str, int] | None = None


Progress = Callable[[Any], None]


@dataclass(frozen=True)
class ActionSpec:
    """One action the runner knows: how it is measured and run, how its finish reads, whether it needs a yes."""

    name: str
    plan: Callable[[Run, Any, Mapping[str, int] | None], ActionPlan]  # (run, options, others) -> the plan
    run: Callable[[ActionRunner, Run, Any, Flags, Progress], Any]  # -> the action's result
    summary: Callable[[Any], str]  # the finished run's one line
    risky: bool  # asks for a confirmation before it runs
    verb: str  # the confirmation's yes ("Warm", "Clear")


def _plan(run: Run, options: Any, others: Mapping[str, int] | None = None) -> ActionPlan:
    """The facts a confirmation states, from one fresh residency scan (holes of sparse files are not data)."""
    from dltop.actions import pagecache as pc

    opts = options if options is not None else pc.DEFAULT_WALK
    r = pc.plan(run.action, list(run.paths), opts, cancel=run.cancel, others=others)
    notes: list[str] = []
    if r.unknown_pages:
        notes.append("Residency of some files is hidden from this user: their data counts as not resident.")
    allowed, guard, fits = True, "", None
    if r.guard is not None:
        allowed, guard, fits = r.guard.ok, r.guard.message, r.guard.fits_bytes
    if run.action == "lock":
        limit = pc.memlock_error(r.total_bytes)
        if limit:
            allowed, guard = False, limit
    notes += _holes_notes(run.action, r)
    return ActionPlan(action=run.action, target=run.target, bytes=r.total_bytes, files=r.files, allowed=allowed,
                      guard=guard, fits_bytes=fits, notes=tuple(notes), apparent_bytes=r.size_bytes)


def _holes_notes(action: str, r: Any) -> list[str]:
    """What holes of sparse files change in a plan's numbers: a lock leaves them out; an evict also drops the
    zero pages a read of a hole put in the page cache (fincore counts them; they are not data)."""
    from dltop.actions.pagecache import kernel

    ps = kernel.PAGE_SIZE
    if action == "lock" and r.total_bytes < r.pages * ps:
        return [f"Only the data is locked: the holes of sparse files ({human_bytes(r.pages * ps - r.total_bytes)}) "
                "are never touched."]
    if action == "evict" and r.data_resident_pages_before is not None:
        zero = (r.resident_pages_before or 0) - r.data_resident_pages_before
        if zero > 0:
            return [f"Of it, {human_bytes(zero * ps)} is zero pages of holes of sparse files (a read of a hole "
                    f"caches them; fincore counts them) and {human_bytes(r.data_resident_pages_before * ps)} "
                    "is data."]
    return []


def summary(r: Any) -> str:
    """One line for a finished action: 'warmed 1.8 MiB of /data in 0.4s (cancelled); stayed: ...'."""
    from dltop.actions.pagecache import kernel

    target = ", ".join(r.paths)
    line = f"{VERBS.get(r.action, r.action)} {human_bytes(r.done_bytes)} of {target} in {r.elapsed_s:.1f}s"
    if r.cancelled:
        line += " (cancelled)"
    if r.stayed:
        line += "; stayed: " + ", ".join(f"{human_bytes(v * kernel.PAGE_SIZE)} {k}" for k, v in r.stayed.items())
        if r.stayed_detail:  # the file holding the most, and who holds it
            more = r.stayed_more + len(r.stayed_detail) - 1
            line += f"; most in {r.stayed_detail[0]}" + (f" (+{more} more files)" if more else "")
    return line


def _run_pagecache(runner: ActionRunner, run: Run, options: Any, flags: Flags, progress: Progress) -> Any:
    from dltop.actions import pagecache as pc

    if run.action == "lock" and run.target in runner.held():
        raise DltopError(f"{run.target} is locked already")
    opts = options if options is not None else pc.DEFAULT_WALK
    paths = list(run.paths)
    if run.action == "warm":
        return pc.warm(paths, opts, force=flags.force, fit=flags.fit, dry_run=flags.dry_run, progress=progress,
                       cancel=run.cancel, others=flags.others)
    if run.action == "evict":
        return pc.evict(paths, opts, dry_run=flags.dry_run, progress=progress, cancel=run.cancel)
    r, locks = pc.lock(paths, opts, force=flags.force, dry_run=flags.dry_run, progress=progress, cancel=run.cancel)
    if r.cancelled or flags.dry_run:
        locks.release()  # a cancelled lock keeps nothing half-locked
    else:
        from dltop.actions import holder

        label = ", ".join(os.path.abspath(p) for p in run.paths)  # a holder runs from "/"
        runner._hold(run.target, locks.bytes, locks.release, lambda: holder.keep(locks, label))
    return r


def _clear_options(options: Any) -> Any:
    """ClearOptions, given as such or read from Settings (the TUI hands its own: --pid, --cache, --root)."""
    from dltop.actions import caches

    if isinstance(options, caches.ClearOptions) or options is None:
        return options or caches.ClearOptions()
    return caches.ClearOptions(tuple(options.caches), options.pid, options.root)


def _clear_path(run: Run) -> str:
    if len(run.paths) != 1:
        raise DltopError("clear takes one cache or entry at a time")
    return run.paths[0]


def _plan_clear(run: Run, options: Any, others: Mapping[str, int] | None = None) -> ActionPlan:
    from dltop.actions import caches

    return caches.plan(_clear_path(run), _clear_options(options), cancel=run.cancel)


def _run_clear(runner: ActionRunner, run: Run, options: Any, flags: Flags, progress: Progress) -> Any:
    from dltop.actions import caches

    return caches.clear(_clear_path(run), _clear_options(options), dry_run=flags.dry_run, progress=progress,
                        cancel=run.cancel)


def _summary_clear(r: Any) -> str:
    from dltop.actions import caches

    return caches.summary(r)


def _plan_signal(run: Run, options: Any, others: Mapping[str, int] | None = None) -> ActionPlan:
    raise DltopError("a signal has nothing to measure: its dialog is the confirmation")


def _run_signal(runner: ActionRunner, run: Run, options: Any, flags: Flags, progress: Progress) -> Any:
    from dltop.actions import signal
    from dltop.model.actions import SignalTarget

    if flags.dry_run:
        raise DltopError("signal: there is no dry run of a signal")
    if isinstance(options, SignalTarget):
        return signal.send(options)
    if isinstance(options, tuple) and options and all(isinstance(t, SignalTarget) for t in options):
        return signal.send_all(options)  # a tagged set: each checked and sent to, one wait for all
    raise DltopError("signal: no process named (a SignalTarget: pid, start time, signal)")


def _summary_signal(r: Any) -> str:
    from dltop.actions import signal

    return signal.summary(r)


SPECS = {s.name: s for s in (
    ActionSpec("warm", _plan, _run_pagecache, summary, risky=True, verb="Warm"),
    ActionSpec("evict", _plan, _run_pagecache, summary, risky=True, verb="Evict"),
    ActionSpec("lock", _plan, _run_pagecache, summary, risky=True, verb="Lock"),
    ActionSpec("clear", _plan_clear, _run_clear, _summary_clear, risky=True, verb="Clear"),
    # A signal to a GPU process: the TUI's signal dialog is its confirmation; the start time is checked again.
    ActionSpec("signal", _plan_signal, _run_signal, _summary_signal, risky=True, verb="Send"),
)}


def spec_of(action: str) -> ActionSpec:
    """The spec of `action`; an unknown one is refused."""
    spec = SPECS.get(action)
    if spec is None:
        raise DltopError(f"unknown action: {action}")
    return spec
