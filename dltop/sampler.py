"""The one way data is collected: the fast sources read one after the other each tick, the slow ones each on
its own cadence; every read in a thread.

A slow, hanging or failing source never stalls the others. The sources that follow the refresh (memory, CPU,
GPUs, probes) are read by one fast worker thread, one after the other, each tick; a read that overruns its slot
is quarantined, as btop's runner does: the thread is left to it and a new fast worker reads the rest, and the
source stays out of the ticks until its read ends. Every other source has its own thread and poller. A read still
running when the next is due is not started twice, and the last good value is kept with its age and the error
("slow: no answer for 12 s") shown beside it. The TUI, `dltop snapshot`, the recorder and the exporter all take
Snapshots from here.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import queue
import socket
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

from dltop import procfs
from dltop.derive import join_splits
from dltop.model import Snapshot, SourceStatus, Unavailable
from dltop.sources.base import Source

FAST_WAIT_S = 1.0  # how long a tick waits at most for its fast reads (and at most half the interval)
SLOT_S = 0.1  # a tick's fast read running longer than this is quarantined: the next ones go on without it


@dataclass
class _State:
    source: Source
    executor: _Worker  # the source's own thread: its reads (a slow source's), read_once's and its close
    value: Any = None
    status: SourceStatus = field(init=False)
    inflight: Future[Any] | None = None
    started: float = 0.0
    next_start: float = 0.0  # monotonic time before which the poller does not start another read
    ran_once: bool = False
    asked: bool = False  # read_now(): start a read as soon as none is in flight, whatever the cadence says
    asked_keys: set[str] | None = None  # ...of only these parts of the source (None: all of it)
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # set to make the poller look again now
    task: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self.status = SourceStatus(name=self.source.name, interval_s=self.source.interval_s)

    @property
    def fast(self) -> bool:
        return self.source.follows_refresh

    def reading(self) -> bool:
        return self.inflight is not None and not self.inflight.done()


class _Worker:
    """One thread and its queue of jobs, a daemon: a read hung on a dead NFS mount never holds up the exit of
    dltop (a ThreadPoolExecutor's threads are joined when the interpreter exits, so `q` or `dltop snapshot`
    would wait for the hung read for ever)."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None] = (
            queue.SimpleQueue())
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Run fn(*args) on this worker's thread, after what was submitted before."""
        fut: Future[Any] = Future()
        self._jobs.put((fut, fn, args))
        return fut

    def shutdown(self) -> None:
        """Let the thread end once the work queued before this call is done (a source's close runs last)."""
        self._jobs.put(None)

    def join(self, timeout_s: float | None = None) -> None:
        """Wait for the thread to end (after shutdown)."""
        self._thread.join(timeout_s)

    def _run(self) -> None:
        procfs.name_this_thread(self._thread.name)
        while (job := self._jobs.get()) is not None:
            fut, fn, args = job
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args))
            except BaseException as e:  # handed to whoever waits on the future
                fut.set_exception(e)


def read_uptime(root: str = "/") -> float | None:
    """Seconds since boot from /proc/uptime, or None."""
    try:
        up = float(procfs.read_text(os.path.join(root, "proc/uptime"), 4096).split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return up if 0.0 <= up < 1e12 else None  # float() takes 'nan', 'inf' and '-5'; no machine is up 30,000 years


def _status_at(st: _State, now: float) -> SourceStatus:
    """The source's status, a read running past its timeout said as slow."""
    if not st.reading():
        return st.status
    waited = time.monotonic() - st.started
    if waited <= st.source.timeout_s:
        return st.status
    return replace(st.status, running_since_ts=now - waited, error=f"slow: no answer for {waited:.0f} s")


def _latest(name: str, st: _State, status: SourceStatus) -> Any:
    """The source's latest value, or why there is none yet."""
    if st.ran_once:
        return st.value
    return Unavailable(f"{name} source: {status.error}" if status.error else "waiting for the first reading")


class Sampler:
    """Polls sources concurrently and composes Snapshots from their latest values."""

    def __init__(
        self,
        sources: Sequence[Source],
        root: str = "/",
        clock: Callable[[], float] = time.time,
        host: str | None = None,
        builder: Callable[[Any], Sequence[Source]] | None = None,
    ) -> None:
        self._states = {s.name: _new_state(s) for s in sources}
        self._root = root
        self._clock = clock
        self._host = host or socket.gethostname()
        self._builder = builder  # Settings -> sources, for reconfigure()
        self._started = False
        self._changed = asyncio.Event()  # a read is in (wait_first)
        self._due = asyncio.Event()  # a Snapshot is due: a tick's reads are in, or a read asked for
        self._wake = asyncio.Event()  # the ticker looks again now: a fast read asked for, the refresh changed
        self._interval_s: Callable[[], float] | None = None  # the stream's; else the fast sources' own
        self._ticker: asyncio.Task[None] | None = None
        # The fast worker, the state it is reading, and the lock both are swapped under when it is quarantined
        self._fast = _Worker("dltop-fast")
        self._running: _State | None = None
        self._lock = threading.Lock()
        self._held: list[_State] = []  # pollers start(hold_slow_s) has not started yet
        self.paused = False

    # -- one-shot use (dltop snapshot) --------------------------------------------------------------------

    def read_once(self, timeout_s: float | None = None) -> Snapshot:
        """Read every source once, concurrently; a source slower than its timeout is reported, not waited for."""
        started = {name: (time.monotonic(), st.executor.submit(self._timed_read, st)) for name, st in self._states.items()}
        for name, (t0, fut) in started.items():
            st = self._states[name]
            limit = timeout_s if timeout_s is not None else st.source.timeout_s
            try:
                fut.result(timeout=max(0.0, limit - (time.monotonic() - t0)))
            except TimeoutError:
                st.status = replace(st.status, error=f"no answer within {limit:g} s", running_since_ts=self._clock())
        return self.snapshot()

    def close(self) -> None:
        """Stop the ticks and pollers and let worker threads go (a hung read's thread is abandoned, not joined)."""
        if self._ticker is not None:
            self._ticker.cancel()
        for st in self._states.values():
            _stop(st)
        self._fast.shutdown()

    # -- sources that change at run time (a dataset added from the TUI; later a server URL, a cache path) -----

    def names(self) -> list[str]:
        """The sources being polled."""
        return list(self._states)

    def add(self, source: Source) -> None:
        """Poll one more source, or replace the one of the same name (its last value is kept until the new
        one answers, so a pane never blanks while a reconfigured source rereads)."""
        st = self._states.get(source.name)
        if st is not None:
            if source.carry_from is not None:
                source.carry_from(st.source)
            if st.source.close is not None and st.source.close is not source.close:
                st.executor.submit(_close_after_read, st.inflight, st.source.close)
            st.source = source
            st.status = replace(st.status, interval_s=source.interval_s)
            self.read_now(source.name)
            return
        st = self._states[source.name] = _new_state(source)
        if self._started and st.fast:
            self.read_now(source.name)  # its first reading now, not at the next tick
        elif self._started:
            self._start_poller(st)

    def remove(self, name: str) -> None:
        """Stop polling a source; its part leaves the Snapshot."""
        st = self._states.pop(name, None)
        if st is not None:
            _stop(st)

    def reconfigure(self, settings: Any) -> None:
        """Rebuild the sources from `settings` (the builder given at construction): new ones start, gone ones
        stop, changed ones (another `Source.config`) are replaced; unchanged ones go on undisturbed."""
        if self._builder is None:
            raise RuntimeError("this Sampler was built without a source builder")
        wanted = {s.name: s for s in self._builder(settings)}
        for name in [n for n in self._states if n not in wanted]:
            self.remove(name)
        for name, source in wanted.items():
            st = self._states.get(name)
            if st is None or st.source.config != source.config:
                self.add(source)

    def read_now(self, name: str, key: str | None = None) -> None:
        """Read this source as soon as it is not reading already, outside its cadence; the Snapshot with the
        result is handed out as soon as it is in. With `key`, only that part of it (after a warm, the dataset
        acted on), where the source can (`Source.read_some`). Call it on the Sampler's loop."""
        st = self._states.get(name)
        if st is None:
            return
        if key is None or st.source.read_some is None:
            st.asked_keys = None
        elif not st.asked or st.asked_keys is not None:
            st.asked_keys = (st.asked_keys or set()) | {key}
        st.asked = True
        (self._wake if st.fast else st.wake).set()

    # -- the reads ------------------------------------------------------------------------------------------

    def _timed_read(self, st: _State, keys: frozenset[str] | None = None) -> None:
        t0 = time.monotonic()
        now = self._clock()
        try:
            value = st.source.read() if keys is None or st.source.read_some is None else st.source.read_some(keys)
        except Exception as e:  # a source bug must not take the monitor down; it is shown where its numbers go
            st.value = Unavailable(f"{st.source.name} source failed: {type(e).__name__}: {e}")
            st.status = replace(st.status, error=f"{type(e).__name__}: {e}", duration_s=time.monotonic() - t0,
                                running_since_ts=None)
        else:
            st.value = value
            st.status = replace(st.status, last_ok_ts=now, error=None, duration_s=time.monotonic() - t0,
                                running_since_ts=None)
        if st.source.max_duty:
            # Keep reading under its duty cycle: a read that took d seconds is followed by d / max_duty.
            took = time.monotonic() - t0
            st.next_start = max(st.next_start, t0 + took / st.source.max_duty)
        st.ran_once = True

    def _take_keys(self, st: _State) -> frozenset[str] | None:
        """The parts a read asked for covers (None: all), the ask answered by the read about to start."""
        keys = frozenset(st.asked_keys) if st.asked and st.asked_keys else None
        st.asked, st.asked_keys = False, None
        return keys

    def snapshot(self) -> Snapshot:
        """A Snapshot of every source's latest value and status, stamped now."""
        now = self._clock()
        parts: dict[str, Any] = {}
        shared: dict[str, list[tuple[Source, Any, SourceStatus]]] = {}  # part -> what its sources hold
        statuses = {}
        for name, st in self._states.items():
            status = statuses[name] = _status_at(st, now)
            part = st.source.part or name
            if st.source.merge is None:
                parts[part] = _latest(name, st, status)
            else:
                shared.setdefault(part, []).append((st.source, _latest(name, st, status), status))
        for part, held in shared.items():
            merge = held[-1][0].merge  # the sources of a part share one
            assert merge is not None
            parts[part] = merge(held)
        known = {k: v for k, v in parts.items() if k in Snapshot.__dataclass_fields__}
        if "gpus" in known:  # each GPU process's split: its probe file and its server joined to NVML's figure
            known["gpus"] = join_splits(known["gpus"], known.get("probes"), known.get("servers"), now)
        return Snapshot(ts=now, host=self._host, uptime_s=read_uptime(self._root), sources=statuses, **known)

    # -- continuous use (TUI, recorder, exporter) ---------------------------------------------------------

    def set_refresh(self, interval_s: float) -> None:
        """Change the cadence of the sources that follow the refresh (the TUI's +/-) at once: the tick waited
        for is timed anew from the last one (30 s to 1 s does not wait out the 30 s)."""
        for st in self._states.values():
            if st.fast:
                st.source = replace(st.source, interval_s=interval_s)
                st.status = replace(st.status, interval_s=interval_s)
        self._wake.set()

    def start(self, hold_slow_s: float = 0.0) -> None:
        """Start the ticks of the fast sources (their first reading at once) and one poller per slow source, on
        the running loop. With `hold_slow_s`, the slow sources (a dataset scan, a cache walk, a server's scrape)
        start at `release_slow()` or that many seconds later, whichever comes first: their threads would take the
        GIL from the first frame."""
        self._started = True
        self._ticker = asyncio.create_task(self._tick(), name="sampler-ticks")
        for st in self._states.values():
            if st.fast:
                continue
            if hold_slow_s > 0:
                self._held.append(st)
            else:
                self._start_poller(st)
        if self._held:
            asyncio.get_running_loop().call_later(hold_slow_s, self.release_slow)

    def release_slow(self) -> None:
        """Start the pollers `start(hold_slow_s=...)` held back (once; a source removed meanwhile stays out)."""
        held, self._held = self._held, []
        for st in held:
            if self._states.get(st.source.name) is st and st.task is None:
                self._start_poller(st)

    def _start_poller(self, st: _State) -> None:
        st.task = asyncio.create_task(self._poll(st), name=f"poll-{st.source.name}")

    def _interval(self) -> float:
        if self._interval_s is not None:
            return self._interval_s()
        return min((st.source.interval_s for st in self._states.values() if st.fast), default=1.0)

    async def _tick(self) -> None:
        """The fast sources: read every interval, then a Snapshot is due; a read asked for (read_now, a source
        added) at once, its Snapshot due as soon as it is in. The first reading is made at once."""
        await self._read_fast(self._fast_idle(), FAST_WAIT_S)
        last = time.monotonic()
        while True:
            self._wake.clear()
            asked = self._fast_idle(asked=True)
            if asked:
                await self._read_fast(asked, FAST_WAIT_S)
                self._due.set()
                continue
            left = last + self._interval() - time.monotonic()
            if left > 0:
                await _wait(self._wake, left)
                continue  # woken (a read asked for, the interval changed) or due now: look again
            last = time.monotonic()
            if self.paused:
                continue
            await self._read_fast(self._fast_idle(), min(self._interval() / 2, FAST_WAIT_S))
            self._due.set()

    def _fast_idle(self, asked: bool = False) -> list[_State]:
        """The fast sources no read is running for (with `asked`, only those a read was asked for)."""
        return [st for st in self._states.values() if st.fast and not st.reading() and (st.asked or not asked)]

    async def _read_fast(self, batch: list[_State], wait_s: float) -> None:
        """Read `batch` one after the other on the fast worker's thread, and wait until they are in or `wait_s`
        has passed (a slow one is published with its last value and its error).

        One after the other: read at once, on threads of their own, they took the GIL from each other at every
        system call, and each read cost a quarter to a half more CPU (the GPU source's 4.0 ms became 5.6 ms, the
        memory source's 1.1 ms 1.8 ms). A read still running after a slot (a tenth of a second, less at a short
        refresh) is quarantined: its thread is left to it and a new fast worker reads the rest, so a hung source
        holds up the others by a slot only. Only the end of the batch wakes the event loop: one wakeup a tick,
        on the thread that also paints the screen."""
        if not batch:
            return
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        pending = deque(batch)
        now = time.monotonic()
        for st in batch:  # in flight from now on: nothing starts a read of it beside the tick's
            st.started = now
            st.inflight = Future()
        with self._lock:
            worker = self._fast
        worker.submit(self._read_pending, worker, pending, loop, done)
        slot = min(SLOT_S, wait_s / (len(batch) + 1))
        deadline = now + wait_s
        while not done.done():
            left_s = deadline - time.monotonic()
            if left_s <= 0:
                return
            await asyncio.wait((done,), timeout=min(left_s, slot))
            if not done.done():
                self._quarantine_overrun(slot, pending, loop, done)

    def _read_pending(self, worker: _Worker, pending: deque[_State], loop: asyncio.AbstractEventLoop,
                      done: asyncio.Future[None]) -> None:
        """On a fast worker's thread: read what is pending of a tick's batch, one after the other, until none is
        left or this worker was quarantined (the rest is then the new worker's); the last read wakes the loop."""
        while True:
            with self._lock:
                if worker is not self._fast:
                    return
                if not pending:
                    self._running = None
                    break
                st = self._running = pending.popleft()
            st.started = time.monotonic()
            keys = self._take_keys(st)
            try:
                self._timed_read(st, keys)
            finally:
                assert st.inflight is not None
                st.inflight.set_result(None)
        with contextlib.suppress(RuntimeError):  # the loop has closed (the app quit)
            loop.call_soon_threadsafe(self._fast_done, done)

    def _quarantine_overrun(self, slot: float, pending: deque[_State], loop: asyncio.AbstractEventLoop,
                            done: asyncio.Future[None]) -> None:
        """The fast read running past its slot keeps its thread to itself; a new fast worker reads the rest."""
        with self._lock:
            st = self._running
            if st is None or time.monotonic() - st.started < slot:
                return
            old, self._fast = self._fast, _Worker("dltop-fast")
            self._running = None
            rest = bool(pending)
        old.shutdown()  # its thread ends when the overrunning read does
        if rest:
            self._fast.submit(self._read_pending, self._fast, pending, loop, done)
        else:
            self._fast_done(done)

    def _fast_done(self, done: asyncio.Future[None]) -> None:
        if not done.done():
            done.set_result(None)
        self._changed.set()
        if any(st.asked for st in self._states.values() if st.fast):
            self._wake.set()  # a read asked for while the tick's ran can start now

    async def _poll(self, st: _State) -> None:
        """A slow source on its own cadence (and duty cycle), on its own thread."""
        loop = asyncio.get_running_loop()
        while True:
            st.wake.clear()
            busy = st.reading()
            if (st.asked or (not self.paused and time.monotonic() >= st.next_start)) and not busy:
                urgent = st.asked
                st.started = time.monotonic()
                st.next_start = st.started + st.source.interval_s
                st.inflight = st.executor.submit(self._timed_read, st, self._take_keys(st))
                st.inflight.add_done_callback(functools.partial(self._done, loop, st, urgent))
                busy = True
            await _wait(st.wake, self._poll_wait(st, busy))

    def _poll_wait(self, st: _State, busy: bool) -> float:
        """How long a slow source's poller sleeps before it looks again."""
        if busy and (st.source.max_duty or st.asked):
            return min(st.source.interval_s, 0.25)  # the next start depends on how long this read takes, or a read is owed
        if busy or self.paused:
            return st.source.interval_s
        return max(0.01, st.next_start - time.monotonic())

    def _done(self, loop: asyncio.AbstractEventLoop, st: _State, urgent: bool, _fut: Future[Any]) -> None:
        # A hung read may finish after its loop has closed (the app quit): nobody is left to tell.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._notify, st, urgent)

    def _notify(self, st: _State, urgent: bool = False) -> None:
        self._changed.set()
        st.wake.set()  # a read asked for while this one ran can start now
        if urgent:
            self._due.set()

    def backlog(self) -> list[Snapshot]:
        """Live sampling has no history before its first Snapshot."""
        return []

    async def stream(self, interval_s: Callable[[], float]) -> AsyncIterator[Snapshot]:
        """Yield a Snapshot every `interval_s()` seconds, once the fast sources' reads of that tick are in (read
        again when set_refresh() is called, so +/- apply at once, not after the old interval), and at once when
        a read asked for with read_now() is in (the rescan after a warm shows without waiting a tick)."""
        self._interval_s = interval_s
        if not self._started:
            self.start()
        self._wake.set()  # the ticks timed by this interval from now on
        self._due.clear()
        try:
            while True:
                await self._due.wait()
                self._due.clear()
                if not self.paused:
                    yield self.snapshot()
        finally:
            self._interval_s = None

    async def wait_first(self, timeout_s: float = 1.0) -> None:
        """Wait until the sources that follow the refresh (the fast ones) have answered once, or the timeout
        passes; slow sources (a dataset scan, a hung NFS mount) fill in later and never delay the first frame."""
        deadline = time.monotonic() + timeout_s
        fast = [st for st in self._states.values() if st.fast] or list(self._states.values())
        while not all(st.ran_once for st in fast):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._changed.clear()
            await _wait(self._changed, left)

async def _wait(event: asyncio.Event, timeout_s: float) -> None:
    """Wait until `event` is set or `timeout_s` has passed."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), max(0.0, timeout_s))


def _new_state(source: Source) -> _State:
    return _State(source, _Worker(f"dltop-{source.name}"))


def _close_after_read(inflight: Future[Any] | None, close: Callable[[], None] | None) -> None:
    """A source's close, after its read in flight (on whichever thread that runs: a hung read's close is
    abandoned with it)."""
    if inflight is not None:
        with contextlib.suppress(BaseException):
            inflight.result()
    if close is not None:
        close()


def _stop(st: _State) -> None:
    if st.task is not None:
        st.task.cancel()
    st.executor.submit(_close_after_read, st.inflight, st.source.close)
    st.executor.shutdown()


class ListFeed:
    """A Sampler stand-in that plays a fixed list of Snapshots (tests, replay); it keeps the last one at the end."""

    def __init__(self, snapshots: Sequence[Snapshot], start: int = 0) -> None:
        if not snapshots:
            raise ValueError("ListFeed needs at least one Snapshot")
        self._snapshots = list(snapshots)
        self._i = max(0, min(start, len(self._snapshots) - 1))
        self.paused = False

    def backlog(self) -> list[Snapshot]:
        """The Snapshots before the current one (the history a viewer starting here should already have)."""
        return self._snapshots[: self._i]

    def start(self, hold_slow_s: float = 0.0) -> None:
        """Nothing to start: the Snapshots are already here."""

    def release_slow(self) -> None:
        """Nothing is held."""

    def snapshot(self) -> Snapshot:
        """The current Snapshot."""
        return self._snapshots[self._i]

    def advance(self) -> Snapshot:
        """Move to the next Snapshot (stays on the last) and return it."""
        self._i = min(self._i + 1, len(self._snapshots) - 1)
        return self._snapshots[self._i]

    def set_refresh(self, interval_s: float) -> None:
        """Recorded Snapshots keep their cadence; only the playback speed changes."""

    def reconfigure(self, settings: object) -> None:
        """Recorded Snapshots cannot gain a source."""

    def read_now(self, name: str, key: str | None = None) -> None:
        """Recorded Snapshots are what they are."""

    async def wait_first(self, timeout_s: float = 1.0) -> None:
        """The first Snapshot is already here."""

    async def stream(self, interval_s: Callable[[], float]) -> AsyncIterator[Snapshot]:
        """Yield the remaining Snapshots, one per interval, then stop."""
        while self._i < len(self._snapshots) - 1:
            await asyncio.sleep(interval_s())
            if not self.paused:
                yield self.advance()

    def close(self) -> None:
        """Nothing to release."""
