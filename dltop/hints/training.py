"""Training hints, from what the in-process probe publishes (docs/probe.md): the page cache warming during the first
epoch, a stalled loop (a hung rank), data waits that are IO bound or decode bound, cudnn.benchmark autotuning every new shape, torch.compile
recompiling or falling back to eager at its recompile limit, the CUDA allocator retrying and running out of memory. Each fires only on numbers a probe gave."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from dltop.fmt import human_bytes, percent_text
from dltop.hints.base import Hint, Severity, rule, wanted
from dltop.model import MemoryPart, Snapshot
from dltop.model.datasets import DatasetsPart
from dltop.model.probes import ProbesPart, ProcessProbe, exit_text, jobs_first, waited_for

WARMING_RATIO = 1.5  # epoch 0 this many times longer than epoch 1 ...
WARMING_WAIT_SHARE = 0.5  # ... with at least this share of the difference in the data wait
DATA_WAIT_HIGH = 0.3  # share of the recent step time spent waiting for the next batch
DISK_BUSY_PCT = 60.0  # %util of the busiest disk over the window (iostat -x's): named, never the judge
IO_SHARE = 0.5  # of the job's reads (rchar) fetched from storage (read_bytes): IO bound at or above
IO_MIN_BYTES = 1 << 20  # from storage over the window (or into the cache by an epoch) before it can be IO bound
SHAPES_MANY = 8  # distinct input shapes with cudnn.benchmark on: one autotune each
RECOMPILES_RISING = 3  # new recompiles within the window
DATA_WAIT_IDS = ("training-io-bound", "training-decode-bound", "training-data-wait")  # data_wait_high's verdicts


def _probes(snap: Snapshot) -> tuple[ProcessProbe, ...]:
    return snap.probes.processes if isinstance(snap.probes, ProbesPart) else ()


def _jobs(snap: Snapshot) -> list[list[ProcessProbe]]:
    """The jobs of the Snapshot (live and exited ranks), the viewer's first (`jobs_first`): a hint about the
    user's own job is never hidden behind another user's."""
    part = snap.probes
    return [members for _, members in jobs_first(part, gpus=snap.gpus)] if isinstance(part, ProbesPart) else []


def _ordered(snap: Snapshot, hint_id: str) -> list[ProcessProbe]:
    """The live processes, the viewer's jobs first, but those of jobs whose hint `hint_id` is passed over (`m` in
    ? muted it for that job: the rule names the next one)."""
    return [p for members in _jobs(snap) for p in members if not p.exited and wanted(hint_id, _job(p))]


def _first(candidates: Sequence[ProcessProbe], snap: Snapshot, value: Callable[[ProcessProbe], float]
           ) -> ProcessProbe:
    """Of `candidates`, one of the first job in the viewer's order, the largest `value` of it."""
    order = {id(p): i for i, members in enumerate(_jobs(snap)) for p in members}
    by_job = [order.get(id(p), len(order)) for p in candidates]
    job = min(by_job)
    return max((p for p, j in zip(candidates, by_job, strict=True) if j == job), key=value)


def _who(p: ProcessProbe) -> str:
    rank = f" (rank {p.rank})" if p.rank is not None else ""
    return f"pid {p.pid}{rank}"


def _job(p: ProcessProbe) -> str:
    """The subject of a hint about `p`: its job (`m` in ? mutes the hint for this job, whichever rank it names)."""
    return f"job {p.job_key}"


def _first_seen(history: Sequence[Snapshot]) -> dict[tuple[int, int], ProcessProbe]:
    """Each process's probe as the oldest Snapshot of the window has it (the same pid and start time)."""
    first: dict[tuple[int, int], ProcessProbe] = {}
    for s in history:
        for p in _probes(s):
            first.setdefault((p.pid, p.start_time_ticks), p)
    return first


def _watched_dataset(history: Sequence[Snapshot], data_dir: str) -> str | None:
    """The watched dataset that holds `data_dir` (or that `data_dir` holds)."""
    part = history[-1].datasets
    if not isinstance(part, DatasetsPart):
        return None
    for ds in part.scanned:
        a, b = ds.path.rstrip("/") + "/", data_dir.rstrip("/") + "/"
        if a.startswith(b) or b.startswith(a):
            return ds.path
    return None


@rule
def page_cache_warming(history: Sequence[Snapshot]) -> Hint | None:
    """Epoch 1 much faster than epoch 0, the difference mostly data wait: the first epoch read the dataset from
    disk into the page cache."""
    for p in _ordered(history[-1], "training-page-cache-warming"):
        by_index = {e.index: e for e in p.epochs}
        e0, e1 = by_index.get(0), by_index.get(1)
        if e0 is None or e1 is None or e1.duration_s <= 0 or e0.duration_s < WARMING_RATIO * e1.duration_s:
            continue
        gained, waited_less = e0.duration_s - e1.duration_s, e0.data_wait_s - e1.data_wait_s
        if waited_less < WARMING_WAIT_SHARE * gained:
            continue  # not the data: compile, autotune, a warm-up schedule
        cached = e0.data_cached_delta_bytes  # the job's own data in the page cache, not the machine's Cached
        grew = f", its data in the page cache grew {human_bytes(cached)}" if cached is not None and cached > 0 else ""
        if p.data_dir is None:
            fix = "warm the dataset before training (dltop warm DIR, or w on the Datasets tab)"
        elif (watched := _watched_dataset(history, p.data_dir)) is not None:
            fix = f"warm {watched} before training: w on its row in the Datasets tab, or dltop warm {watched}"
        else:
            fix = f"warm {p.data_dir} before training: dltop warm {p.data_dir} (or a on the Datasets tab, then w)"
        return Hint(
            id="training-page-cache-warming", subject=_job(p),
            severity="info",
            text=(f"{_who(p)}: epoch 0 took {e0.duration_s:.1f}s, epoch 1 {e1.duration_s:.1f}s; epoch 0 waited "
                  f"{e0.data_wait_s:.1f}s for data, epoch 1 {e1.data_wait_s:.1f}s{grew}: the first epoch was "
                  "warming the page cache"),
            fix=fix,
            numbers={"pid": p.pid, "epoch0_s": e0.duration_s, "epoch1_s": e1.duration_s,
                     "epoch0_wait_s": e0.data_wait_s, "epoch1_wait_s": e1.data_wait_s,
                     **({} if cached is None else {"data_cached_delta_bytes": cached})},
        )
    return None


def _busiest_disk(history: Sequence[Snapshot]) -> tuple[str, float] | None:
    """The disk busiest over the window and its %util (iostat -x's: the share of the time it had I/O in flight):
    named beside a decode-bound verdict, since another job may load it."""
    disks = [(s.ts, s.memory.disks) for s in history
             if isinstance(s.memory, MemoryPart) and isinstance(s.memory.disks, tuple)]
    if len(disks) < 2 or disks[-1][0] <= disks[0][0]:
        return None
    (t0, first), (t1, last) = disks[0], disks[-1]
    before = {d.name: d for d in first}
    dt_ms = (t1 - t0) * 1000
    utils = [(d.name, min(100.0, 100 * (d.io_time_ms - p.io_time_ms) / dt_ms)) for d in last
             if (p := before.get(d.name)) is not None and d.io_time_ms >= p.io_time_ms]
    return max(utils, key=lambda nu: nu[1], default=None)


def _job_reads(history: Sequence[Snapshot], p: ProcessProbe) -> tuple[int, int, float] | str:
    """(read_bytes, rchar, seconds): what the job read over the window, from storage and in all, summed over the
    pairs of consecutive Snapshots that both have its counters; a pair where one dropped (a worker gone before
    it was reaped) is skipped. Or why that is not known."""
    key = (p.pid, p.start_time_ticks)
    storage = total = 0
    span_s = 0.0
    pairs = 0
    prev: tuple[int, int, float] | None = None
    for s in history:
        q = next((x for x in _probes(s) if (x.pid, x.start_time_ticks) == key), None)
        if q is None or q.io_read_bytes is None or q.io_rchar_bytes is None:
            continue
        if prev is not None and q.io_read_bytes >= prev[0] and q.io_rchar_bytes >= prev[1] and s.ts > prev[2]:
            storage += q.io_read_bytes - prev[0]
            total += q.io_rchar_bytes - prev[1]
            span_s += s.ts - prev[2]
            pairs += 1
        prev = (q.io_read_bytes, q.io_rchar_bytes, s.ts)
    if pairs:
        return storage, total, span_s
    if p.io_unavailable:
        return p.io_unavailable
    if p.io_read_bytes is None:
        return "its reads (/proc/PID/io) are not in these Snapshots (recorded by an older dltop)"
    return "one reading of its reads so far"


def _filled(p: ProcessProbe) -> tuple[int, int] | None:
    """(epoch, bytes) when the job's last epoch brought at least IO_MIN_BYTES of its own data into the page cache
    (its cachestat delta): that data came from storage."""
    e = p.epochs[-1] if p.epochs else None
    if e is None or e.data_cached_delta_bytes is None or e.data_cached_delta_bytes < IO_MIN_BYTES:
        return None
    return e.index, e.data_cached_delta_bytes


@rule
def probes_left_out(history: Sequence[Snapshot]) -> Hint | None:
    """A limit left probes unread (a user's folder with more files than it is read for, the reading's time, a
    process with more descriptors than are looked at): never a silent cut (docs/probe.md)."""
    part = history[-1].probes
    cuts = [i for i in part.ignored if i.cut] if isinstance(part, ProbesPart) else []
    if not cuts:
        return None
    more = f" (+{len(cuts) - 1} more)" if len(cuts) > 1 else ""
    return Hint(id="training-probes-left-out", severity="info",
                text=f"probes left out: {cuts[0].path}: {cuts[0].reason}{more}",
                fix="the Training tab's notes list each; a user whose folder holds more files than it is read for "
                    "costs only that user (docs/probe.md, How dltop finds probes)",
                numbers={"cuts": len(cuts)})


HALTED_FIX = {
    "T": "kill -CONT {pid} resumes it (Ctrl-Z, SIGSTOP or kill -STOP stopped it); the ranks that wait for it go on "
         "with it",
    "t": "a debugger holds it stopped (state t): detach or continue it",
    "D": "its IO does not return (a hung NFS mount or disk): cat /proc/{pid}/stack (as root) shows where it waits",
}
EXITED_FIX = ("the ranks left wait in a collective until it times out: TORCH_NCCL_ASYNC_ERROR_HANDLING=1 and a "
              "timeout in init_process_group end them, and torchrun restarts or ends the job")


def _owner(p: ProcessProbe, snap: Snapshot) -> str:
    """'' for the viewer's own process, else whose it is ("alice's ")."""
    part = snap.probes
    if isinstance(part, ProbesPart) and part.viewer_uid == p.uid:
        return ""
    return f"{p.user or f'uid {p.uid}'}'s "


@rule
def stalled(history: Sequence[Snapshot]) -> Hint | None:
    """A live process whose loop made no step for a long while (ProcessProbe.stalled): a rank that hangs in a
    collective, a loader that deadlocked, a step stuck in I/O. Where a rank of its job cannot step (stopped,
    in uninterruptible IO, exited: the kernel's word), that rank is named and the others wait for it. The
    viewer's jobs first (`jobs_first`)."""
    snap = history[-1]
    jobs = [(members, hung) for members in _jobs(snap)
            if (hung := [p for p in members if p.stalled and p.last_step_age_s is not None])
            and wanted("training-stalled", _job(members[0]))]
    if not jobs:
        return None
    members, hung = jobs[0]
    elsewhere = sum(len(h) for _, h in jobs[1:])
    more = f" (+{elsewhere} stalled in other jobs)" if elsewhere else ""
    cause = waited_for(members)
    if cause:
        return _waiting_for(snap, cause[0], [p for p in hung if p is not cause[0]], more)
    return _stalled_alone(snap, hung, more)


def _stalled_alone(snap: Snapshot, hung: list[ProcessProbe], more: str) -> Hint:
    """The ranks of a job that stalled with none of them to blame: the one without a step the longest."""
    p = max(hung, key=lambda q: q.last_step_age_s or 0.0)
    age = p.last_step_age_s or 0.0
    step = f" (its steps took {p.last_step_s:.2f}s)" if p.last_step_s else ""
    between = " since its last epoch closed" if p.in_epoch is False else ""
    others = f"; {len(hung) - 1} more of its ranks stalled" if len(hung) > 1 else ""
    return Hint(id="training-stalled", severity="warn", subject=_job(p),
                text=f"{_owner(p, snap)}{_who(p)}: no step for {age:.0f}s{step}{between}: stalled{others}{more}",
                fix=f"py-spy dump --pid {p.pid} shows where it waits; a rank stuck in a collective waits for a "
                    "peer that died or took another path (TORCH_NCCL_ASYNC_ERROR_HANDLING=1 and a timeout in "
                    "init_process_group end it)",
                numbers={"pid": p.pid, "last_step_age_s": age,
                         **({} if p.last_step_s is None else {"last_step_s": p.last_step_s})})


def _waiting_for(snap: Snapshot, q: ProcessProbe, waiting: list[ProcessProbe], more: str) -> Hint:
    """The rank `q` cannot step (the kernel says why) and the ranks `waiting` wait for it."""
    if not q.exited:
        state, fix = q.kernel_state, HALTED_FIX.get(q.proc_state or "", EXITED_FIX).format(pid=q.pid)
    else:
        state, fix = f"exited: {exit_text(q)}", EXITED_FIX
    them = ", ".join(_who(p) for p in waiting)
    waits = f"; {them} wait{'s' if len(waiting) == 1 else ''} for it" if waiting else ""
    age = max([p.last_step_age_s or 0.0 for p in waiting] or [q.last_step_age_s or 0.0])
    return Hint(id="training-stalled", severity="warn", subject=_job(q),
                text=f"{_owner(q, snap)}{_who(q)} {state}: no step for {age:.0f}s{waits}{more}",
                fix=fix, numbers={"pid": q.pid, "last_step_age_s": age, "waiting": len(waiting)})


@rule
def data_wait_high(history: Sequence[Snapshot]) -> Hint | None:
    """The loop waits for its batches: IO bound when the job's own reads come from storage (/proc/PID/io of it
    and its workers), decode bound (more workers) when they come from the page cache. Another job loading the
    disk does not make this one IO bound."""
    waiting = [p for p in _probes(history[-1]) if p.data_wait_fraction is not None
               and p.data_wait_fraction >= DATA_WAIT_HIGH and any(wanted(i, _job(p)) for i in DATA_WAIT_IDS)]
    if not waiting:
        return None
    p = _first(waiting, history[-1], lambda q: q.data_wait_fraction or 0.0)
    fraction = p.data_wait_fraction or 0.0
    head = f"{_who(p)} waits for data {percent_text(100 * fraction)} of each step"
    numbers: dict[str, float] = {"pid": p.pid, "data_wait_fraction": fraction}
    reads = _job_reads(history, p)
    if isinstance(reads, str):
        return _wait_without_io(p, head, reads, numbers)
    return _wait_with_io(p, head, numbers, reads, _busiest_disk(history))


def _wait_with_io(p: ProcessProbe, head: str, numbers: dict[str, float], reads: tuple[int, int, float],
                  disk: tuple[str, float] | None) -> Hint:
    """The data wait of a job whose reads are known: IO bound where most come from storage, else decode bound."""
    storage, total, span_s = reads
    share = storage / max(total, storage) if max(total, storage) > 0 else 0.0
    numbers.update(io_read_bytes=storage, io_rchar_bytes=total, io_window_s=span_s, io_storage_share=share)
    rate = f"{human_bytes(round(storage / span_s))}/s" if span_s > 0 else human_bytes(storage)
    if storage >= IO_MIN_BYTES and share >= IO_SHARE:
        return Hint(id="training-io-bound", severity="warn", subject=_job(p),
                    text=(f"{head} while {percent_text(100 * share)} of what it reads comes from storage ({rate}, over "
                          f"{span_s:.0f}s, the process and its workers): IO bound"),
                    fix=IO_FIX, numbers=numbers)
    return _decode_bound(p, head, numbers, total, span_s, share, disk)


def _decode_bound(p: ProcessProbe, head: str, numbers: dict[str, float], total: int, span_s: float, share: float,
                  disk: tuple[str, float] | None) -> Hint:
    """The data wait of a job whose reads come from the page cache: its workers decode too slowly (a busy disk
    is said, but it is not this job's)."""
    workers = p.loader_workers
    more = f"more DataLoader workers than {workers}" if workers is not None else "more DataLoader workers"
    other = ""
    if disk is not None and disk[1] >= DISK_BUSY_PCT:
        other = f"; {disk[0]} is {percent_text(disk[1])} busy, but not with this job's reads"
        numbers["disk_util_pct"] = disk[1]
    where = ("reads nothing from files" if total == 0 else
             f"reads {human_bytes(total)} in {span_s:.0f}s, {percent_text(100 * share)} of it from storage")
    return Hint(id="training-decode-bound", severity="warn", subject=_job(p),
                text=f"{head} while it {where} (the process and its workers): decode bound{other}",
                fix=f"{more} (num_workers), or a cheaper decode / augmentation",
                numbers={**numbers, **({} if workers is None else {"loader_workers": workers})})


IO_FIX = ("more page cache (warm the dataset, free memory) or faster storage; more workers only queue more reads "
          "on the same storage")


def _wait_without_io(p: ProcessProbe, head: str, reads: str, numbers: dict[str, float]) -> Hint:
    """The data wait where the job's reads cannot be read: IO bound where its last epoch filled the page cache,
    else which it is cannot be told."""
    filled = _filled(p)
    if filled is None:
        return Hint(id="training-data-wait", severity="info", subject=_job(p),
                    text=f"{head}; IO bound or decode bound cannot be told: {reads}",
                    fix="run dltop as root (or as the job's user) so it can read the job's /proc/PID/io",
                    numbers=numbers)
    epoch, filled_bytes = filled
    return Hint(id="training-io-bound", severity="warn", subject=_job(p),
                text=(f"{head}; epoch {epoch} brought {human_bytes(filled_bytes)} of its data into the page "
                      f"cache (read from storage): IO bound ({reads})"),
                fix=IO_FIX, numbers={**numbers, "data_cached_delta_bytes": filled_bytes})


@rule
def cudnn_benchmark_shapes(history: Sequence[Snapshot]) -> Hint | None:
    """cudnn.benchmark on while the input shapes keep changing: cuDNN autotunes again for every new shape."""
    for p in _ordered(history[-1], "training-cudnn-benchmark-shapes"):
        if p.cudnn_benchmark and p.input_shapes is not None and p.input_shapes >= SHAPES_MANY:
            return Hint(id="training-cudnn-benchmark-shapes", severity="warn", subject=_job(p),
                        text=(f"{_who(p)}: torch.backends.cudnn.benchmark is on and the loop has seen "
                              f"{p.input_shapes} input shapes: cuDNN autotunes again for every new one"),
                        fix="pad or bucket the inputs to a few fixed shapes, or turn cudnn.benchmark off",
                        numbers={"pid": p.pid, "input_shapes": p.input_shapes})
    return None


def _rising(history: Sequence[Snapshot], counter: str, hint_id: str) -> Iterator[tuple[ProcessProbe, int, int]]:
    """(probe, new, total) for each process whose `counter` rose within the window (but those `hint_id` passes
    over)."""
    first = _first_seen(history)
    for p in _ordered(history[-1], hint_id):
        old = first.get((p.pid, p.start_time_ticks))
        now, then = _counter(p, counter), _counter(old, counter) if old is not None else None
        if now is not None and then is not None and now > then:
            yield p, now - then, now


def _counter(p: ProcessProbe, counter: str) -> int | None:
    if counter == "recompiles":
        return p.compile.get("recompiles")
    values = [d.memory_stats[counter] for d in p.devices if counter in d.memory_stats]
    return sum(values) if values else None


@rule
def recompiling(history: Sequence[Snapshot]) -> Hint | None:
    """torch.compile recompiling again and again: a guard keeps failing (shapes, dtypes, Python values)."""
    for p, new, total in _rising(history, "recompiles", "training-recompiling"):
        if new >= RECOMPILES_RISING:
            return Hint(id="training-recompiling", severity="warn", subject=_job(p),
                        text=f"{_who(p)}: torch.compile recompiled {new} times in the last minute ({total} in all)",
                        fix='TORCH_LOGS="recompiles" says which guard fails; mark changing sizes dynamic '
                            "(torch._dynamo.mark_dynamic) or keep Python values that change out of the graph",
                        numbers={"pid": p.pid, "recompiles_new": new, "recompiles": total})
    return None


@rule
def compile_fell_back_to_eager(history: Sequence[Snapshot]) -> Hint | None:
    """torch.compile hit its recompile limit: dynamo stopped compiling those frames and runs them eager from then
    on (it logs a warning once), so the job lost what compiling them bought."""
    for p in _ordered(history[-1], "training-compile-eager-fallback"):
        fallbacks = p.compile.get("eager_fallbacks")
        if not fallbacks:
            continue
        accumulated = p.compile.get("eager_fallbacks_accumulated", 0)
        name = "accumulated_recompile_limit" if accumulated >= fallbacks else "recompile_limit"
        limit = p.compile.get("recompile_limit")
        which = f"torch._dynamo.config.{name}" + (f" ({limit})" if name == "recompile_limit" and limit is not None
                                                  else "")
        frames = "a frame" if fallbacks == 1 else f"{fallbacks} frames"
        return Hint(id="training-compile-eager-fallback", severity="warn", subject=_job(p),
                    text=f"{_who(p)}: torch.compile hit {which}: {frames} run eager (uncompiled) from now on",
                    fix='TORCH_LOGS="recompiles" says which guard keeps failing; mark changing sizes dynamic '
                        f"(torch._dynamo.mark_dynamic, or dynamic=True), or raise torch._dynamo.config.{name}",
                    numbers={"pid": p.pid, "eager_fallbacks": fallbacks,
                             **({"recompile_limit": limit} if limit is not None else {})})
    return None


@rule
def oom_retries_rising(history: Sequence[Snapshot]) -> Hint | None:
    """The CUDA allocator frees its cache and retries (or runs out of memory) more and more: near the edge."""
    cases: tuple[tuple[str, str, Severity], ...] = (("num_ooms", "ran out of memory", "critical"),
                                                    ("num_alloc_retries", "had to free its cache and retry", "warn"))
    for counter, what, severity in cases:
        for p, new, total in _rising(history, counter, f"training-{counter.replace('_', '-')}"):
            return Hint(id=f"training-{counter.replace('_', '-')}", severity=severity, subject=_job(p),
                        text=f"{_who(p)}: the CUDA allocator {what} {new} times in the last minute ({total} in all)",
                        fix="a smaller batch or sequence, activation checkpointing, or "
                            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation",
                        numbers={"pid": p.pid, f"{counter}_new": new, counter: total})
    return None
