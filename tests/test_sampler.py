"""A slow, hanging or failing source never stalls the others, and its trouble is shown where its numbers go."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time

from dltop.model import MemoryPart, Unavailable
from dltop.sampler import SLOT_S, Sampler
from dltop.sources.base import Source
from dltop.sources.memory import read_memory


def _hanging(release: threading.Event):
    def read():
        release.wait(30)
        return MemoryPart()

    return read


def test_read_once_does_not_wait_for_a_hung_source() -> None:
    release = threading.Event()
    sampler = Sampler([
        Source("memory", 1.0, lambda: read_memory("/")),
        Source("cpu", 1.0, _hanging(release), timeout_s=0.3),
    ])
    t0 = time.monotonic()
    try:
        snap = sampler.read_once()
    finally:
        release.set()
        sampler.close()
    assert time.monotonic() - t0 < 2
    assert isinstance(snap.memory, MemoryPart) and snap.memory.total_bytes
    assert isinstance(snap.cpu, Unavailable) and "no answer within 0.3 s" in snap.cpu.reason
    assert snap.sources["cpu"].error


def test_failing_source_shows_why() -> None:
    def broken():
        raise RuntimeError("NVML went away")

    sampler = Sampler([Source("cpu", 1.0, broken)])
    snap = sampler.read_once()
    sampler.close()
    assert isinstance(snap.cpu, Unavailable) and "NVML went away" in snap.cpu.reason
    assert snap.sources["cpu"].error == "RuntimeError: NVML went away"


async def test_fast_source_keeps_ticking_while_another_hangs() -> None:
    release = threading.Event()
    calls = []

    def fast():
        calls.append(time.monotonic())
        return read_memory("/")

    sampler = Sampler([Source("memory", 0.05, fast), Source("cpu", 0.05, _hanging(release), timeout_s=0.2)])
    sampler.start()
    try:
        await asyncio.sleep(0.6)
        snap = sampler.snapshot()
    finally:
        release.set()
        sampler.close()
    assert len(calls) >= 5
    assert isinstance(snap.memory, MemoryPart)
    # The hung source was started once, not piled up, and is reported as slow.
    assert isinstance(snap.cpu, Unavailable) and "no answer" in snap.cpu.reason
    assert "slow" in (snap.sources["cpu"].error or "")


async def test_pause_stops_reads_and_set_refresh_changes_cadence() -> None:
    calls = []
    src = Source("memory", 0.05, lambda: calls.append(1) or MemoryPart(), follows_refresh=True)
    sampler = Sampler([src])
    sampler.start()
    await asyncio.sleep(0.3)
    sampler.paused = True
    await asyncio.sleep(0.1)
    n = len(calls)
    await asyncio.sleep(0.3)
    assert len(calls) == n
    sampler.set_refresh(2.0)
    assert sampler.snapshot().sources["memory"].interval_s == 2.0
    sampler.close()


async def test_stream_yields_snapshots_at_the_interval() -> None:
    sampler = Sampler([Source("memory", 0.05, lambda: read_memory("/"))])
    got = []
    async for snap in sampler.stream(lambda: 0.05):
        got.append(snap)
        if len(got) == 3:
            break
    sampler.close()
    assert [s.ts for s in got] == sorted(s.ts for s in got)
    assert all(isinstance(s.memory, MemoryPart) for s in got[1:])


async def test_duty_cycle_stretches_the_interval_of_a_slow_source() -> None:
    starts: list[float] = []

    def slow():
        starts.append(time.monotonic())
        time.sleep(0.2)
        return MemoryPart()

    sampler = Sampler([Source("cpu", 0.05, slow, max_duty=0.25)])
    sampler.start()
    try:
        await asyncio.sleep(2.0)
    finally:
        sampler.close()
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    # 0.2 s of reading at a 25% duty cycle: a read starts at most every 0.8 s, not every 0.05 s.
    assert gaps and min(gaps) >= 0.75, gaps
    assert len(starts) <= 3


def test_a_hung_read_does_not_hold_up_the_exit() -> None:
    # A read stuck on a dead NFS mount: read_once gives up on it, and the process must still end (a
    # ThreadPoolExecutor's thread would be joined at exit, and the process would wait for the read for ever).
    import subprocess
    import sys

    code = ("import threading, time\n"
            "from dltop.sampler import Sampler\n"
            "from dltop.sources.base import Source\n"
            "s = Sampler([Source('cpu', 1.0, lambda: threading.Event().wait(), timeout_s=0.2)])\n"
            "snap = s.read_once()\n"
            "s.close()\n"
            "print(snap.cpu.reason)\n")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "no answer within 0.2 s" in r.stdout, r.stderr
    assert time.monotonic() - t0 < 10


async def test_each_snapshot_carries_the_fast_readings_of_its_own_tick() -> None:
    # Read, then publish: a Snapshot handed out on a tick holds the fast sources' reading made for that tick,
    # not the one of the tick before (memory's last_success_timestamp lagged by exactly one interval).
    from dltop.config import Settings
    from dltop.sources.memory import source as memory_source

    interval_s = 1.0
    real = memory_source(Settings(refresh_s=interval_s))

    def read():  # type: ignore[no-untyped-def]
        time.sleep(0.05)  # a read takes a little while, as NVML's does
        return real.read()

    sampler = Sampler([dataclasses.replace(real, read=read)])
    got = []
    try:
        async for snap in sampler.stream(lambda: interval_s):
            got.append(snap)
            if len(got) == 4:
                break
    finally:
        sampler.close()
    for snap in got:
        read_at = snap.sources["memory"].last_ok_ts
        assert read_at is not None and isinstance(snap.memory, MemoryPart)
        # read within this tick: at most half an interval before the Snapshot (one interval before, the bug)
        assert snap.ts - interval_s / 2 <= read_at <= snap.ts, (snap.ts - read_at, interval_s)


async def test_a_shorter_refresh_takes_effect_at_once() -> None:
    # From 30 s to 0.05 s (the TUI's +): the tick being waited for is timed anew, not after the old 30 s.
    interval = [30.0]
    sampler = Sampler([Source("memory", 30.0, lambda: read_memory("/"), follows_refresh=True)])
    got: list[float] = []

    async def consume() -> None:
        async for snap in sampler.stream(lambda: interval[0]):
            got.append(snap.ts)
            if len(got) == 3:
                return

    task = asyncio.ensure_future(consume())
    try:
        await asyncio.sleep(0.2)
        assert got == []  # still waiting out the 30 s
        interval[0] = 0.05
        sampler.set_refresh(0.05)
        await asyncio.wait_for(task, 20)  # a guard against hanging: the old code waited 30 s for the first one
    finally:
        task.cancel()
        sampler.close()
    assert len(got) == 3
    assert sampler.snapshot().sources["memory"].interval_s == 0.05


async def test_slow_sources_start_after_the_first_frame_or_the_hold() -> None:
    """The TUI holds the slow sources (a dataset scan, a cache walk) until its first frame is drawn: their
    threads would take the GIL from it. The fast ones read at once; a hold nobody releases ends by itself."""
    reads: list[str] = []

    def reader(name: str) -> Source:
        return Source(name, 60.0, lambda: reads.append(name) or name, follows_refresh=name == "fast")

    sampler = Sampler([reader("fast"), reader("slow")])
    try:
        sampler.start(hold_slow_s=30.0)
        await sampler.wait_first(timeout_s=5.0)
        await asyncio.sleep(0.3)
        assert reads == ["fast"]
        sampler.release_slow()
        sampler.release_slow()  # once only
        for _ in range(100):
            if "slow" in reads:
                break
            await asyncio.sleep(0.02)
        assert reads == ["fast", "slow"]
    finally:
        sampler.close()
    reads.clear()
    sampler = Sampler([reader("fast"), reader("slow")])
    try:
        sampler.start(hold_slow_s=0.2)
        for _ in range(200):
            if "slow" in reads:
                break
            await asyncio.sleep(0.02)
        assert sorted(reads) == ["fast", "slow"]
    finally:
        sampler.close()


def test_each_source_thread_has_its_name_where_top_shows_threads() -> None:
    """`top -H` and `ps -L` show a thread by the kernel's name (comm), which Python 3.11 does not set: each source's
    thread names itself dltop-<source> (15 bytes at most), read here from /proc/self/task/TID/comm by its own tid."""

    def whoami() -> MemoryPart:
        tid = threading.get_native_id()
        with open(f"/proc/self/task/{tid}/comm", encoding="ascii") as f:
            seen.append(f.read().strip())
        return MemoryPart()

    seen: list[str] = []
    sampler = Sampler([Source("memory", 1.0, whoami), Source("a-long-source-name", 1.0, whoami)])
    try:
        sampler.read_once()
    finally:
        sampler.close()
    assert sorted(seen) == ["dltop-a-long-so", "dltop-memory"]


async def test_a_tick_wakes_the_loop_once_and_a_hung_fast_source_costs_only_itself() -> None:
    """A tick's reads of the fast sources run on one worker and only the end of the batch wakes the event loop (the
    thread that paints the screen): one call from the worker's thread a tick, not one a source. A fast source that
    hangs is quarantined and left out of the ticks after it (its read is still running), and the others' readings
    in each Snapshot are still those of its own tick."""
    release = threading.Event()
    sources = [Source(name, 0.2, lambda: MemoryPart(), follows_refresh=True) for name in ("memory", "cpu", "probes")]
    sources.append(Source("gpus", 0.2, _hanging(release), timeout_s=0.3, follows_refresh=True))
    sampler = Sampler(sources)
    loop = asyncio.get_running_loop()
    calls = [0]
    counting = [False]
    threadsafe = loop.call_soon_threadsafe

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        if counting[0]:
            calls[0] += 1
        return threadsafe(*args, **kwargs)

    loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
    got = []
    try:
        async for snap in sampler.stream(lambda: 0.2):
            got.append(snap)
            counting[0] = len(got) >= 4  # from the 4th tick on: past the first reading and the quarantine
            if len(got) == 12:
                break
    finally:
        del loop.call_soon_threadsafe
        release.set()
        sampler.close()
    ticks = len(got) - 4
    assert 1 <= calls[0] <= ticks + 1, (calls[0], ticks)  # three sources woke it three times a tick
    for snap in got[4:]:
        for name in ("memory", "cpu", "probes"):
            read_at = snap.sources[name].last_ok_ts
            assert read_at is not None and snap.ts - 0.2 <= read_at <= snap.ts, (name, snap.ts - (read_at or 0))
    assert "slow" in (got[-1].sources["gpus"].error or "")


async def test_a_tick_reads_its_fast_sources_one_after_the_other_and_a_hang_holds_the_rest_a_slot_only() -> None:
    """Read at once, the fast sources' threads took the GIL from each other at every system call (each read cost a
    quarter to a half more CPU): a tick reads them one after the other on one worker, so no two of its reads
    overlap. A source that hangs in the middle of a run holds the ones after it up by a slot only (it is
    quarantined, a new worker reads the rest): on the tick it hangs, and after, the others' readings are still of
    their own tick."""
    spans: list[tuple[str, float, float]] = []
    release = threading.Event()
    gpu_reads = [0]

    def reader(name: str):  # type: ignore[no-untyped-def]
        def read() -> MemoryPart:
            t0 = time.monotonic()
            if name == "gpus":
                gpu_reads[0] += 1
                if gpu_reads[0] == 4:  # the first reading at start, then two ticks: it hangs on the third
                    release.wait(30)
            time.sleep(0.005)  # long enough for two reads started at once to overlap
            spans.append((name, t0, time.monotonic()))
            return MemoryPart()
        return read

    interval = 0.6
    sampler = Sampler([Source(n, interval, reader(n), timeout_s=0.5, follows_refresh=True)
                       for n in ("gpus", "memory", "cpu", "probes")])
    got = []
    first = [0.0]
    try:
        async for snap in sampler.stream(lambda: interval):
            got.append(snap)
            first[0] = first[0] or time.monotonic()
            if len(got) == 6:
                break
    finally:
        release.set()
        sampler.close()
    assert gpu_reads[0] == 4, gpu_reads  # hung on its third tick, then left out while its read runs
    # the ticks' reads (after the first reading at start): no two overlap, but for the hung one's
    ticked = sorted((s for s in spans if s[1] > first[0] and s[2] - s[1] < 0.1), key=lambda s: s[1])
    slot = min(SLOT_S, interval / 2 / 5)  # (a read slower than that, on a loaded machine, has the next beside it)
    overlaps = [(a, b) for a, b in zip(ticked, ticked[1:], strict=False) if b[1] < a[2] and a[2] - a[1] < slot]
    assert overlaps == [], overlaps
    assert len([s for s in ticked if s[0] != "gpus"]) >= 3 * 5
    for snap in got[1:]:
        for name in ("memory", "cpu", "probes"):
            read_at = snap.sources[name].last_ok_ts
            assert read_at is not None and snap.ts - interval / 2 <= read_at <= snap.ts, (name, snap.ts - (read_at or 0))


async def test_a_quarantined_fast_source_comes_back_to_the_ticks_once_its_read_ends() -> None:
    """A fast read that overruns its slot keeps its thread to itself (its overrun reported once past its timeout)
    while the others tick on a new worker; once it ends, the source is read on the ticks again and the thread it
    kept ends."""
    release = threading.Event()
    reads = {"gpus": 0, "memory": 0}

    def reader(name: str):  # type: ignore[no-untyped-def]
        def read() -> MemoryPart:
            reads[name] += 1
            if name == "gpus" and reads[name] == 2:
                release.wait(30)
            return MemoryPart()
        return read

    sampler = Sampler([Source(n, 0.1, reader(n), timeout_s=0.3, follows_refresh=True) for n in ("gpus", "memory")])
    got = []
    try:
        async for snap in sampler.stream(lambda: 0.1):
            got.append(snap)
            if len(got) == 8:
                stuck = reads["gpus"]
                threads = threading.active_count()
                release.set()
            if len(got) == 14:
                break
    finally:
        release.set()
        sampler.close()
    assert "slow: no answer" in (got[7].sources["gpus"].error or "")
    assert reads["memory"] >= 12 and stuck == 2 and reads["gpus"] > stuck
    assert got[-1].sources["gpus"].error is None
    assert threading.active_count() <= threads - 1  # the quarantined thread ended with its read


async def test_a_read_asked_of_a_fast_source_is_published_at_once() -> None:
    """read_now on a source that follows the refresh (the GPUs after a signal) reads it outside the ticks and hands
    out the Snapshot with its reading as soon as it is in, not at the next tick 30 s on."""
    reads = [0]

    def read() -> MemoryPart:
        reads[0] += 1
        return MemoryPart()

    sampler = Sampler([Source("gpus", 30.0, read, follows_refresh=True)])
    got = []

    async def consume() -> None:
        async for snap in sampler.stream(lambda: 30.0):
            got.append(snap)
            return

    task = asyncio.ensure_future(consume())
    try:
        await sampler.wait_first(timeout_s=5.0)
        assert reads[0] == 1 and got == []  # the first reading, then the ticks wait 30 s
        sampler.read_now("gpus")
        await asyncio.wait_for(task, 10)
    finally:
        task.cancel()
        sampler.close()
    assert reads[0] == 2 and len(got) == 1
    assert got[0].sources["gpus"].last_ok_ts is not None
