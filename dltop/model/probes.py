"""The probes part of a Snapshot: what each training or serving process with `dltop.probe` says about itself.

One `ProcessProbe` per live process that published a file (docs/probe.md); every file dltop did not read is an
`IgnoredProbe` with the reason (another user's, a symlink, too large, malformed, a dead process, a reused pid).
A number the process did not publish is None with its reason in `unavailable`, never 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

# A job is stalled when its last step is older than this, and than STALL_STEPS of its last step's time: a hung
# rank (a collective waiting on a dead peer, a stuck loader) is what users most need to see (issue 18, item 7).
STALL_MIN_S = 30.0
STALL_STEPS = 20
NO_EXIT_RECORD = "exited, cause unknown (no exit record: SIGKILL, the OOM killer or a crash leave none)"
# The kernel's state of a live process (/proc/PID/stat) where it says why the loop makes no step
STATES = {"T": "stopped (state T: SIGSTOP or Ctrl-Z)",
          "t": "stopped by a debugger (state t)",
          "D": "in uninterruptible IO (state D)",
          "Z": "a zombie (state Z: it exited and its parent has not reaped it)"}
# The same on a rank's line of the Training tab, after how long it made no step (80 columns)
STATE_LINES = {"T": "state T (SIGSTOP or Ctrl-Z): kill -CONT {pid}", "t": "state t (a debugger holds it)",
               "D": "state D (uninterruptible IO)"}
# Why a job has no throughput or loss: the script did not hand them over (the Training tab says so on the line)
NO_SAMPLES = "no batch size given: track(loader, batch_size=N), or a framework's callback (docs/probe.md)"
NO_TOKENS = "no tokens per batch given: track(loader, tokens=N or a function of the batch)"
NO_LOSS = "no loss logged: probe.log(loss=loss)"
NOT_GIVEN = (NO_SAMPLES, NO_TOKENS, NO_LOSS)


@dataclass(frozen=True)
class ProbeDevice:
    """One device's bytes as the process counts them; `memory_stats` are torch.cuda.memory_stats() under
    torch's own names (CUDA devices, once the process initialised CUDA)."""

    device: str  # "cuda:0", "cpu"
    weights_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    kv_bytes: int
    memory_stats: dict[str, int] = field(default_factory=dict)
    uuid: str | None = None  # torch's device UUID (NVML's without the "GPU-" prefix); cuda:N is a logical index
    pci_bus_id: str | None = None  # "0000:18:00.0", from torch's pci_{domain,bus,device}_id
    runtime: Literal["cuda", "hip"] | None = None  # hip: ROCm torch, whose torch.cuda is HIP


@dataclass(frozen=True)
class ProbeEpoch:
    """One epoch closed by `probe.mark_epoch()`."""

    index: int
    started_at: float
    ended_at: float
    duration_s: float
    data_wait_s: float
    steps: int
    # The page cache held by the job's own data, after minus before (cachestat of its files); None: not known,
    # `data_cached_source` says why. Otherwise it says what was measured ("cachestat: 24 files under data_dir").
    data_cached_delta_bytes: int | None = None
    data_cached_source: str | None = None
    # The whole machine's Cached (/proc/meminfo) after minus before: other processes' reads and writes are in it
    machine_cached_delta_bytes: int | None = None
    gpu_util: float | None = None  # None: the probe does not measure it (see ProcessProbe.gpu_util_source)
    # What the script hands over (track(batch_size=, tokens=), probe.log(loss=)); None: not given
    samples: int | None = None
    tokens: int | None = None
    loss: float | None = None  # the mean of the losses logged in the epoch
    loss_nonfinite: str | None = None  # "nan", "inf" or "-inf": the mean is not a number (loss is None)

    @property
    def samples_per_s(self) -> float | None:
        """The epoch's samples over its time."""
        return self.samples / self.duration_s if self.samples is not None and self.duration_s > 0 else None

    @property
    def tokens_per_s(self) -> float | None:
        """The epoch's tokens over its time."""
        return self.tokens / self.duration_s if self.tokens is not None and self.duration_s > 0 else None


@dataclass(frozen=True)
class ProbeLoader:
    """A loader the process times apart from its main one (`probe.track(loader, name="val")`)."""

    name: str
    steps: int
    step_time_s: float | None = None  # mean over its recent steps; None when none ended within the window
    data_wait_fraction: float | None = None  # 0..1 over them
    last_step_age_s: float | None = None


@dataclass(frozen=True, slots=True)
class ProcessProbe:
    """One process's probe file, checked (owner, size, format, the process alive with the same start time).
    Slotted as GpuDevice is: a __dict__ of more than 30 keys shares none (~1.6 KB a probed process a tick kept)."""

    pid: int
    path: str
    uid: int
    start_time_ticks: int
    cmd: str
    published_at: float
    started_at: float | None = None
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    ppid: int | None = None
    job_id: str | None = None  # torchrun's run id or MASTER_ADDR:MASTER_PORT: what the ranks of one job share
    torch_version: str | None = None
    # Totals over all devices; None (reason in `unavailable`) when the process watched no model or cache.
    weights_bytes: int | None = None
    gradients_bytes: int | None = None
    optimizer_bytes: int | None = None
    kv_bytes: int | None = None
    devices: tuple[ProbeDevice, ...] = ()
    # live watched objects by kind ("models", "optimizers", "kv"); empty: the probe did not say (an older one)
    watched: dict[str, int] = field(default_factory=dict)
    data_wait_fraction: float | None = None  # 0..1 over the recent steps (those of the last window_s)
    step_time_s: float | None = None  # mean over the recent steps; None when none ended within the window
    last_step_s: float | None = None  # the newest step's time
    last_step_age_s: float | None = None  # seconds since the newest step ended, when dltop read the file
    window_s: float | None = None  # what "recent" covers (the probe's WINDOW_S)
    in_epoch: bool | None = None  # an epoch is open (False: between mark_epoch and the next item)
    optimizer_steps: int | None = None  # counted in zero-code mode (DLTOP_PROBE=1), by torch's optimizer hook
    steps: int | None = None
    input_shapes: int | None = None
    loader_workers: int | None = None
    pin_memory: bool | None = None
    data_dir: str | None = None  # the folder the job's data is read from, where the script or its dataset says
    # Throughput over the recent steps, where the script says what an item holds (track(batch_size=, tokens=) or
    # a framework's callback), and the totals; None: not given (`unavailable` says how to give it)
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    samples: int | None = None
    tokens: int | None = None
    # The last loss the script logged (probe.log(loss=)); loss_nonfinite "nan", "inf" or "-inf" where it is not
    # a number (a diverged run), loss then None
    loss: float | None = None
    loss_nonfinite: str | None = None
    losses_logged: int | None = None
    loss_age_s: float | None = None
    # The job's own reads, dltop's reading of /proc/PID/io for the process and its children (DataLoader workers),
    # summed: read_bytes fetched from storage (0 for a page-cache or tmpfs read), rchar every byte read() returned.
    # None: not known, `io_unavailable` says why (another user's process when dltop is not root); an older
    # recording has neither. Counters since each process started: a hint takes their deltas over Snapshots.
    io_read_bytes: int | None = None
    io_rchar_bytes: int | None = None
    io_processes: int | None = None  # how many processes the sums cover
    io_unavailable: str | None = None
    cudnn_benchmark: bool | None = None
    cudnn_deterministic: bool | None = None
    compile: dict[str, int] = field(default_factory=dict)
    allocator_env: dict[str, str] = field(default_factory=dict)
    epochs: tuple[ProbeEpoch, ...] = ()
    loaders: tuple[ProbeLoader, ...] = ()  # timed apart from the main loader (a val loop), by name
    gpu_util_source: str | None = None
    truncated: tuple[str, ...] = ()  # what the probe dropped to stay within 4 KiB
    unavailable: dict[str, str] = field(default_factory=dict)
    # An exited process (its file left behind): how it ended, from the exit record the probe wrote at exit;
    # exit_how None: no record (killed or crashed). exited_at: the record's time, else the file's last publication.
    exited: bool = False
    # Who runs it, in the kernel's word (the uid that owns the process and its file or memfd): its name, and the
    # PID namespace it runs in where that is not dltop's (a pod: many pods share a uid). None: not known.
    user: str | None = None
    pidns: int | None = None
    # Why the probe could not keep a file (its folder was refused: another user made it first) and published
    # through a memfd instead; how such a process ended is not known once it is gone (no exit record is left).
    folder_refused: str | None = None
    exit_how: str | None = None  # "exit" (atexit ran) or "exception" (an uncaught exception ended it)
    exit_error: str | None = None
    exit_code: int | None = None
    exited_at: float | None = None
    # The kernel's state of the live process when dltop read it (/proc/PID/stat: R, S, D, T, t, Z, ...)
    proc_state: str | None = None
    # A process SIGTERM ended (its probe's handler wrote the stack it hit: no exit record then): the signal and
    # where the main thread was ("train.py:42 in step"); who sent it is not known
    exit_signal: str | None = None
    exit_where: str | None = None

    @property
    def kernel_state(self) -> str | None:
        """Why, in the kernel's word, a live process makes no step: stopped, in uninterruptible IO, a zombie;
        None where its state says nothing of the kind (running, sleeping: a rank waiting in a collective
        sleeps)."""
        return None if self.exited or self.proc_state is None else STATES.get(self.proc_state)

    @property
    def halted(self) -> bool:
        """It cannot step: exited, a zombie, stopped, or stalled in uninterruptible IO (D alone is a disk
        read: only a stalled process in D is held by it). The rank the others of its job wait for."""
        return self.exited or self.proc_state in ("T", "t", "Z") or (self.proc_state == "D" and self.stalled)

    @property
    def stalled(self) -> bool:
        """No step for over STALL_MIN_S and STALL_STEPS times the last step's time, in a live process."""
        age = self.last_step_age_s
        if self.exited or age is None:
            return False
        return age > max(STALL_MIN_S, STALL_STEPS * (self.last_step_s or 0.0))

    @property
    def ended(self) -> str:
        """How an exited process ended, in words ("" for a live one)."""
        if not self.exited:
            return ""
        if self.exit_how == "exception":
            return f"exit code 1: {self.exit_error}" if self.exit_error else "an uncaught exception"
        if self.exit_how == "exit":
            return "exited (a normal exit or sys.exit)" if self.exit_code is None else f"exit code {self.exit_code}"
        if self.exit_signal:
            where = f" in {self.exit_where}" if self.exit_where else ""
            return f"killed by {self.exit_signal}{where} (who sent it is not known)"
        if self.folder_refused:
            return f"how it ended is not known: its probe kept no file ({self.folder_refused})"
        if self.proc_state == "Z":
            return "exited, cause unknown: a zombie (its parent has not reaped it; no exit record)"
        return NO_EXIT_RECORD

    @property
    def job_key(self) -> str:
        """What groups the ranks of one job: its user (and container, where pods share a uid) with its job id;
        else, for a rank, its parent and command (torchrun and mp.spawn start the ranks as children of one
        process); else the process alone. Ranks of two users never merge, whatever job id they claim."""
        owner = f"uid {self.uid}" + (f" pidns {self.pidns}" if self.pidns is not None else "")
        if self.job_id:
            return f"{owner} job {self.job_id}"
        if self.rank is not None and self.ppid is not None:
            return f"{owner} ppid {self.ppid} {self.cmd}"
        return f"pid {self.pid}"


@dataclass(frozen=True)
class IgnoredProbe:
    """A file in a probe directory that dltop did not read, or a directory it did not trust, and why."""

    path: str
    reason: str
    cut: bool = False  # left out by a limit (a user's folder read in part, the reading's time): on the hint line


@dataclass(frozen=True)
class ProbesPart:
    """Every probe directory dltop looked in, the processes found and what it ignored."""

    dirs: tuple[str, ...] = ()
    processes: tuple[ProcessProbe, ...] = ()  # live processes only
    ignored: tuple[IgnoredProbe, ...] = ()
    # processes that exited and left their file (newest first, at most MAX_EXITED): kept for the post-mortem
    exited: tuple[ProcessProbe, ...] = ()
    # Whose jobs come first (jobs_first): the user dltop runs for (its uid; under sudo, SUDO_UID's; --user's),
    # and the process named by --pid. None: not known (a recording by an older dltop).
    viewer_uid: int | None = None
    focus_pid: int | None = None


def group_jobs(probes: Sequence[ProcessProbe]) -> dict[str, list[ProcessProbe]]:
    """The probes grouped by job (`ProcessProbe.job_key`), each job's ranks in rank order (live and exited
    processes alike: one rank that died beside ranks that wait for it is one job)."""
    out: dict[str, list[ProcessProbe]] = {}
    for p in probes:
        out.setdefault(p.job_key, []).append(p)
    for members in out.values():
        members.sort(key=lambda p: (p.rank if p.rank is not None else -1, p.pid))
    return out


def _gpu_busy(gpus: object) -> dict[int, float]:
    """pid -> its share of a GPU's SM time (NVML's per-process smUtil), summed over the GPUs it is on."""
    busy: dict[int, float] = {}
    for g in gpus if isinstance(gpus, tuple) else ():
        procs = getattr(g, "processes", ())
        for q in procs if isinstance(procs, tuple) else ():
            busy[q.pid] = busy.get(q.pid, 0.0) + float(q.gpu_util_percent or 0)
    return busy


def jobs_first(part: ProbesPart, probes: Sequence[ProcessProbe] | None = None,
               gpus: object = None) -> list[tuple[str, list[ProcessProbe]]]:
    """The jobs of `probes` (default: the part's live and exited processes), the ones the user most wants
    first: the viewer's own (a root dltop's viewer is root, or the user who ran sudo), then the job of the
    process named by --pid, then jobs still running before ended ones, the busiest on the GPUs (NVML's SM time of
    their processes), then the most steps a second."""
    grouped = group_jobs([*part.processes, *part.exited] if probes is None else probes)
    # the GPUs' processes are summed only where there are jobs to order (each hint rule asks, every frame)
    busy = _gpu_busy(gpus) if len(grouped) > 1 else {}
    viewer, focus = part.viewer_uid, part.focus_pid

    def rank(item: tuple[str, list[ProcessProbe]]) -> tuple[bool, bool, bool, float, float, str]:
        key, members = item
        mine = viewer is not None and viewer != 0 and any(p.uid == viewer for p in members)
        named = focus is not None and any(focus in (p.pid, p.ppid) for p in members)
        steps = max((1 / p.step_time_s for p in members if p.step_time_s), default=0.0)
        return (not mine, not named, all(p.exited for p in members),
                -sum(busy.get(p.pid, 0.0) for p in members), -steps, key)

    return sorted(grouped.items(), key=rank)


def job_rank_by_pid(part: ProbesPart, gpus: object = None) -> dict[int, int]:
    """Each probed process's job's place in `jobs_first` (0: the job the user most wants), by pid: the hint line
    puts a hint about another user's job after those about the viewer's."""
    return {p.pid: i for i, (_, members) in enumerate(jobs_first(part, gpus=gpus)) for p in members}


def waited_for(members: Sequence[ProcessProbe]) -> list[ProcessProbe]:
    """The ranks of a job of several that cannot step (`ProcessProbe.halted`: exited, stopped, a zombie, stalled
    in uninterruptible IO): the ones its other ranks wait for."""
    return [p for p in members if p.halted] if len(members) > 1 else []


def who(p: ProcessProbe) -> str:
    """A rank by its rank, else by its pid."""
    return f"rank {p.rank}" if p.rank is not None else f"pid {p.pid}"


OOM_WITHIN_S = 5.0  # after a process's last publication: the probe publishes every second, dltop reads as often


def oom_kills_at_exit(p: ProcessProbe, history: Sequence[Any]) -> int | None:
    """How many processes the kernel's OOM killer killed (/proc/vmstat oom_kill, in dltop's history of Snapshots)
    between the last Snapshot before an exited process's last publication and OOM_WITHIN_S after it, where it
    left no exit record; None where it did, or the counter was not read around then."""
    if not p.exited or p.exit_how is not None or p.exit_signal:
        return None
    before = after = None
    for snap in history:
        kills = getattr(getattr(getattr(snap, "memory", None), "vmstat", None), "oom_kill", None)
        if not isinstance(kills, int):
            continue
        if snap.ts <= p.published_at:
            before = kills
        elif snap.ts <= p.published_at + OOM_WITHIN_S:
            after = kills
    return after - before if before is not None and after is not None and after > before else None


def exit_text(p: ProcessProbe, history: Sequence[Any] = ()) -> str:
    """How an exited process ended (`ProcessProbe.ended`), with the kernel's OOM kills as it ended where it
    left no record of its own."""
    kills = oom_kills_at_exit(p, history)
    if kills is None:
        return p.ended
    return (f"no exit record, and the kernel's OOM killer killed {kills} process{'es' if kills > 1 else ''} as it "
            "ended (/proc/vmstat oom_kill)")


HALTED_WORDS = {"T": "stopped", "t": "stopped", "D": "in uninterruptible IO", "Z": "a zombie"}


def rank_status(p: ProcessProbe, members: Sequence[ProcessProbe]) -> tuple[str, str] | None:
    """What a rank does if it is not training, as (word, why): EXITED (how it ended), STOPPED (the kernel's
    state T: now, not after a stall), STALLED (in uninterruptible IO, or no step for a long while), WAITING (for
    the rank of its job that cannot step); None while it trains."""
    age = f"no step for {p.last_step_age_s:.0f}s" if p.last_step_age_s is not None else "no step yet"
    if p.exited:
        return "EXITED", p.ended
    if p.proc_state in ("T", "t") or (p.proc_state == "D" and p.stalled):
        word = "STALLED" if p.proc_state == "D" else "STOPPED"
        return word, f"{age}, {STATE_LINES[p.proc_state].format(pid=p.pid)}"
    cause = [q for q in waited_for(members) if q is not p]
    if cause and (p.stalled or p.step_time_s is None):
        q = cause[0]
        return "WAITING", f"for {who(q)} ({'exited' if q.exited else HALTED_WORDS.get(q.proc_state or '')}), {age}"
    if p.stalled:
        return "STALLED", age + (f" (its steps took {p.last_step_s:.2f}s)" if p.last_step_s else "")
    return None
