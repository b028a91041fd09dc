"""The probes part of a Snapshot: what each training or serving process with `dltop.probe` says about itself.

One `ProcessProbe` per live process that published a file (docs/probe.md); every file dltop did not read is an
`IgnoredProbe` with the reason (another user's, a symlink, too large, malformed, a dead process, a reused pid).
A number the process did not publish is None with its reason in `unavailable`, never 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

# A job is stalled when its last step is older than this, and than STALL_STEPS of its last step's time: a hung
# rank (a collective waiting on a dead peer, a stuck loader) is what users most need to see (issue 18, item 7).
STALL_MIN_S = 30.0
STALL_STEPS = 20
NO_EXIT_RECORD = "no exit record: killed (SIGKILL, the OOM killer) or crashed"
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


@dataclass(frozen=True)
class ProcessProbe:
    """One process's probe file, checked (owner, size, format, the process alive with the same start time)."""

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
    in_epoch: bool | None = None
    optimizer_steps: int | None = None  # counted in zero-code mode (DLTOP_PROBE=1), by torch's optimizer hook  # an epoch is open (False: between mark_epoch and the next item)
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
        if self.folder_refused:
            return f"how it ended is not known: its probe kept no file ({self.folder_refused})"
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
