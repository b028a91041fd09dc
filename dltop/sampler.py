"""The one way data is collected: one asyncio poller per source, each on its own cadence, reads in threads.

A slow, hanging or failing source never stalls the others: each source has its own single worker thread, a read
still running when the next is due is not started twice, and the last good value is kept with its age and the
error shown beside it. The TUI, `dltop snapshot`, the recorder and the exporter all take Snapshots from here.
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
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

from dltop.derive import join_splits
from dltop.model import Snapshot, SourceStatus, Unavailable
from dltop.sources import procfs
from dltop.sources.base import Source

FAST_WAIT_S = 1.0  # how long a tick waits at most for its fast reads (and at most half the interval)
STAGGER_S = 0.1  # a tick's fast read running longer than this has the next one started beside it
_DRIVEN_WAIT_S = 3600.0  # a poller whose source the ticks read sleeps until woken

@dataclass
class _State:
    source: Source
    executor: _Worker
    value: Any = None
    status: SourceStatus = field(init=False)
    inflight: Future[Any] | None = None
    started: float = 0.0
    next_start: float = 0.0  # monotonic time before which the poller does not start another read
    ran_once: bool = False
    asked: bool = False  # read_now(): start a read as soon as none is in flight, whatever the cadence says
    asked_keys: set[str] | None = None  # ...of only these parts of the source (None: all of it)
    wake: _Signal | None = None  # set to make the poller look again now
    task: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self.status = SourceStatus(name=self.source.name, interval_s=self.source.interval_s)


class _Worker:
    """One source's own thread, a daemon: a read hung on a dead NFS mount never holds up the exit of dltop
    (a ThreadPoolExecutor's threads are joined when the interpreter exits, so `q` or `dltop snapshot` would
    wait for the hung read for ever)."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None] = (
            queue.SimpleQueue())
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Run fn(*args) on this worker's thread, after what was submitted before."""
        fut: Future[Any] = Future()
        self.run_into(fut, fn, *args)
        return fut

    def run_into(self, fut: Future[Any], fn: Callable[..., Any], *args: Any) -> None:
        """submit() with a Future made before (one that callers may already wait on)."""
        self._jobs.put((fut, fn, args))

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
        self._changed: _Signal | None = None
        self._urgent: _Signal | None = None  # an asked-for read finished: hand out a Snapshot now
        self._retimed: _Signal | None = None  # set_refresh(): the tick being waited for is timed anew
        # While stream() runs, it times the sources that follow the refresh: each tick reads them, then publishes
        # (on their own cadence, a Snapshot held the reading of the tick before: one interval old).
        self._driven = False
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
        """Stop pollers and let worker threads go (a hung read's thread is abandoned, not joined)."""
        for st in self._states.values():
            _stop(st)

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
                st.executor.submit(st.source.close)
            st.source = source
            st.status = replace(st.status, interval_s=source.interval_s)
            self.read_now(source.name)
            return
        st = self._states[source.name] = _new_state(source)
        if self._started:
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
        if st.wake is not None:
            st.wake.set()

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

    def snapshot(self) -> Snapshot:
        """A Snapshot of every source's latest value and status, stamped now."""
        now = self._clock()
        parts: dict[str, Any] = {}
        shared: dict[str, list[tuple[Source, Any, SourceStatus]]] = {}  # part -> what its sources hold
        merges: dict[str, Callable[[Sequence[tuple[Source, Any, Any]]], Any]] = {}
        statuses = {}
        for name, st in self._states.items():
            status = st.status
            if st.inflight is not None and not st.inflight.done():
                waited = time.monotonic() - st.started
                if waited > st.source.timeout_s:
                    status = replace(status, running_since_ts=now - waited,
                                     error=f"slow: no answer for {waited:.0f} s")
            statuses[name] = status
            if st.ran_once:
                value = st.value
            elif status.error:
                value = Unavailable(f"{name} source: {status.error}")
            else:
                value = Unavailable("waiting for the first reading")
            if st.source.merge is None:
                parts[st.source.part or name] = value
            else:
                part = st.source.part or name
                shared.setdefault(part, []).append((st.source, value, status))
                merges[part] = st.source.merge
        for part, held in shared.items():
            parts[part] = merges[part](held)
        known = {k: v for k, v in parts.items() if k in Snapshot.__dataclass_fields__}
        if "gpus" in known:  # each GPU process's split: its probe file and its server joined to NVML's figure
            known["gpus"] = join_splits(known["gpus"], known.get("probes"), known.get("servers"), now)
        return Snapshot(ts=now, host=self._host, uptime_s=read_uptime(self._root), sources=statuses, **known)

    # -- continuous use (TUI, recorder, exporter) ---------------------------------------------------------

    def set_refresh(self, interval_s: float) -> None:
        """Change the cadence of the sources that follow the refresh (the TUI's +/-) at once: a tick waited for
        and a read due at the old cadence are timed anew from when they were last done (30 s to 1 s does not
        wait out the 30 s)."""
        for st in self._states.values():
            if st.source.follows_refresh:
                st.source = replace(st.source, interval_s=interval_s)
                st.status = replace(st.status, interval_s=interval_s)
                st.next_start = min(st.next_start, st.started + interval_s)
                if st.wake is not None:
                    st.wake.set()
        if self._retimed is not None:
            self._retimed.set()

    def start(self, hold_slow_s: float = 0.0) -> None:
        """Start one poller task per source on the running loop. With `hold_slow_s`, the sources that do not
        follow the refresh (a dataset scan, a cache walk, a server's scrape) start at `release_slow()` or that
        many seconds later, whichever comes first: their threads would take the GIL from the first frame."""
        self._changed = _Signal()
        self._urgent = _Signal()
        self._retimed = _Signal()
        self._started = True
        for st in self._states.values():
            if hold_slow_s > 0 and not st.source.follows_refresh:
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
        st.wake = _Signal()
        st.task = asyncio.create_task(self._poll(st), name=f"poll-{st.source.name}")

    async def _poll(self, st: _State) -> None:
        loop = asyncio.get_running_loop()
        assert st.wake is not None
        while True:
            st.wake.clear()
            busy = st.inflight is not None and not st.inflight.done()
            driven = self._driven and st.source.follows_refresh and st.inflight is not None
            due = st.asked or (not driven and not self.paused and time.monotonic() >= st.next_start)
            if due and not busy:
                urgent, st.asked = st.asked, False
                keys, st.asked_keys = (frozenset(st.asked_keys) if urgent and st.asked_keys else None), None
                self._submit(st, keys).add_done_callback(functools.partial(self._done, loop, st, urgent))
                busy = True
            if busy and (st.source.max_duty or st.asked):
                # The next start depends on how long this read takes (or a read is owed): look again soon.
                wait = min(st.source.interval_s, 0.25)
            elif driven:
                wait = _DRIVEN_WAIT_S  # the ticks read it (_read_fast); read_now() and the stream's end wake it
            elif busy or self.paused:
                wait = st.source.interval_s
            else:
                wait = max(0.01, st.next_start - time.monotonic())
            await _wait_any((st.wake,), wait)

    def _submit(self, st: _State, keys: frozenset[str] | None = None) -> Future[Any]:
        """Start a read of `st` on its own thread (the caller checked that none is in flight)."""
        st.started = time.monotonic()
        st.next_start = st.started + st.source.interval_s
        fut = st.inflight = st.executor.submit(self._timed_read, st, keys)
        return fut

    def _done(self, loop: asyncio.AbstractEventLoop, st: _State, urgent: bool, _fut: Future[Any]) -> None:
        # A hung read may finish after its loop has closed (the app quit): nobody is left to tell.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._notify, st, urgent)

    def _notify(self, st: _State, urgent: bool = False) -> None:
        if self._changed is not None:
            self._changed.set()
        if st.wake is not None:
            st.wake.set()  # a read asked for while this one ran can start now
        if urgent and self._urgent is not None:
            self._urgent.set()

    def backlog(self) -> list[Snapshot]:
        """Live sampling has no history before its first Snapshot."""
        return []

    async def stream(self, interval_s: Callable[[], float]) -> AsyncIterator[Snapshot]:
        """Yield a Snapshot every `interval_s()` seconds (read again when set_refresh() is called, so +/- apply
        at once, not after the old interval), and at once when a read asked for with read_now() is in (the
        rescan after a warm shows without waiting a tick)."""
        if not self._started:
            self.start()
        assert self._urgent is not None and self._retimed is not None
        self._driven = True
        last = time.monotonic()  # the last tick: the next is due interval_s() after it
        try:
            while True:
                self._retimed.clear()
                left = last + interval_s() - time.monotonic()
                if left > 0 and not self._urgent.is_set():
                    await _wait_any((self._urgent, self._retimed), left)
                urgent = self._urgent.is_set()
                if not urgent and self._retimed.is_set():
                    continue  # the interval changed: the tick is due at another time
                self._urgent.clear()
                if not urgent:
                    last = time.monotonic()
                if self.paused:
                    continue
                if not urgent:  # a tick: read the fast sources for it, then publish
                    await self._read_fast(min(interval_s() / 2, FAST_WAIT_S))
                yield self.snapshot()
        finally:
            self._driven = False
            for st in self._states.values():  # back on their own cadence
                if st.wake is not None:
                    st.wake.set()

    async def _read_fast(self, wait_s: float) -> None:
        """Read every source that follows the refresh and is not reading already, and wait until they are in or
        `wait_s` has passed (a slow one is published with its last value and its error).

        One after the other, each on its own thread: read at once, their threads took the GIL from each other at
        every system call, and each read cost a quarter to a half more CPU (the GPU source's 4.0 ms became
        5.6 ms, the memory source's 1.1 ms 1.8 ms). The next read is started by the thread of the one before as
        it ends; one still running after a slot (a tenth of a second, less at a short refresh) has the next
        started beside it, so a hung source holds up the others by that much only. Only the last read to finish
        wakes the event loop: one wakeup a tick, on the thread that also paints the screen."""
        loop = asyncio.get_running_loop()
        batch = [st for st in self._states.values() if st.source.follows_refresh and st.wake is not None
                 and (st.inflight is None or st.inflight.done())]
        if not batch:
            return
        done = _Signal()
        lock = threading.Lock()
        waiting = list(reversed(batch))  # not started yet; the next one last
        left = [len(batch)]
        now = time.monotonic()
        for st in batch:  # in flight from now on: no poller starts a read beside the tick's
            st.started = now
            st.next_start = now + st.source.interval_s
            st.inflight = Future()

        def start_next() -> None:  # on the loop or on the thread of the read that just ended
            with lock:
                if not waiting:
                    return
                st = waiting.pop()
            st.started = time.monotonic()
            assert st.inflight is not None
            st.executor.run_into(st.inflight, self._timed_read, st, None)

        def finished(_fut: Future[Any]) -> None:  # on the source's thread
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if not last:
                start_next()
                return
            with contextlib.suppress(RuntimeError):  # the loop has closed (the app quit)
                loop.call_soon_threadsafe(self._batch_done, batch, done)

        for st in batch:
            assert st.inflight is not None
            st.inflight.add_done_callback(finished)
        start_next()
        slot = min(STAGGER_S, wait_s / (len(batch) + 1))
        deadline = now + wait_s
        while not done.is_set():
            left_s = deadline - time.monotonic()
            if left_s <= 0:
                return
            if not await _wait_any((done,), min(left_s, slot)):
                start_next()  # the read running is slow, or hung: the next starts beside it

    def _batch_done(self, batch: list[_State], done: _Signal) -> None:
        done.set()
        if self._changed is not None:
            self._changed.set()
        for st in batch:
            if st.asked and st.wake is not None:
                st.wake.set()  # a read asked for while the tick's ran can start now

    async def wait_first(self, timeout_s: float = 1.0) -> None:
        """Wait until the sources that follow the refresh (the fast ones) have answered once, or the timeout
        passes; slow sources (a dataset scan, a hung NFS mount) fill in later and never delay the first frame."""
        deadline = time.monotonic() + timeout_s
        fast = [st for st in self._states.values() if st.source.follows_refresh] or list(self._states.values())
        while not all(st.ran_once for st in fast):
            left = deadline - time.monotonic()
            if left <= 0 or self._changed is None:
                return
            self._changed.clear()
            if not await _wait_any((self._changed,), left):
                return



class _Signal:
    """A flag coroutines wait on, with a timeout, at the cost of one future and one timer per wait.

    `asyncio.wait_for(event.wait(), t)` makes a Task per wait, and waiting on two events made three. On the
    thread that also paints the screen that cost a quarter of the Sampler's own work per tick (three sources that
    read nothing: 0.45 ms of the main thread a tick with Tasks, 0.35 ms with this)."""

    __slots__ = ("_set", "_waiters")

    def __init__(self) -> None:
        self._set = False
        self._waiters: list[asyncio.Future[None]] = []

    def set(self) -> None:
        self._set = True
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    def clear(self) -> None:
        self._set = False

    def is_set(self) -> bool:
        return self._set


def _timeout(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def _wait_any(signals: Sequence[_Signal], timeout_s: float) -> bool:
    """Wait until one of `signals` is set or `timeout_s` has passed; True if one is set."""
    if any(s.is_set() for s in signals):
        return True
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()
    for s in signals:
        s._waiters.append(fut)
    timer = loop.call_later(max(0.0, timeout_s), _timeout, fut)
    try:
        await fut
    finally:
        timer.cancel()
        for s in signals:
            with contextlib.suppress(ValueError):
                s._waiters.remove(fut)
    return any(s.is_set() for s in signals)


def _new_state(source: Source) -> _State:
    return _State(source, _Worker(f"dltop-{source.name}"))


def _stop(st: _State) -> None:
    if st.task is not None:
        st.task.cancel()
    if st.source.close is not None:
        # After the read in flight, on the same thread; a hung read's thread is abandoned with its close.
        st.executor.submit(st.source.close)
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
