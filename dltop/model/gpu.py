"""The `gpus` part of a Snapshot: every GPU NVML (or AMD's amdsmi) sees, its MIG instances and the processes
holding its memory.

Values are the library's own (bytes, percent, milliwatts, MHz); a value it did not give is None and the device's
(or process's) `unavailable` says why, keyed by field name. A GPU whose calls fail keeps its place in the list, its
numbers None with the reason. `gpus` is a list in JSON, as nvidia-smi's `--query-gpu` is one row per GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from dltop.model.base import Unavailable

NO_PROBE = "no probe in this process — add `import dltop.probe`"
SPLIT_FIELDS = ("weights_bytes", "kv_cache_bytes", "allocator_cache_bytes", "other_torch_bytes", "non_torch_bytes")
# Where a split number comes from: the process's own probe file, NVML's per-process figure less the probe's
# torch reserved, or an inference server's KV pool (docs/gpu.md, "The split").
SplitSource = Literal["probe", "nvml-probe", "server"]
Backend = Literal["nvml", "amdsmi"]


@dataclass(frozen=True)
class MemorySplit:
    """What a process holds its GPU memory for. Each number comes from the in-process probe or an inference
    server (its source in `sources`); a number neither can give is None with the reason in `unavailable`
    (non-torch is never guessed as NVML's total, and a remainder that comes out negative is not clamped)."""

    weights_bytes: int | None = None
    kv_cache_bytes: int | None = None
    allocator_cache_bytes: int | None = None  # torch reserved - allocated: cached but free
    # torch allocated - the parts above that are known: activations, gradients, optimizer state (and weights or
    # a KV cache the process does not name to the probe; `unavailable` says so for those)
    other_torch_bytes: int | None = None
    non_torch_bytes: int | None = None  # CUDA context, NCCL, cuBLAS workspaces: NVML used - torch reserved
    gradients_bytes: int | None = None  # within other torch: the watched models' .grad tensors
    optimizer_bytes: int | None = None  # within other torch: the watched optimizers' state
    torch_allocated_bytes: int | None = None  # the probe's torch.cuda.memory_stats(), as read with the split
    torch_reserved_bytes: int | None = None
    probe_device: str | None = None  # the probe's device joined to this GPU ("cuda:0"), None: no probe joined
    # how that device was matched to the GPU: "uuid", "pci" (its PCI address: on HIP, whose UUIDs are not
    # amdsmi's, or where the probe gave no UUID), or the fallback's words
    joined_by: str | None = None
    sources: dict[str, SplitSource] = field(default_factory=dict)  # field name -> where its number comes from
    unavailable: dict[str, str] = field(default_factory=dict)
    # Where the known parts add up to more than NVML's figure for the process (readings of different moments or
    # places: a server's pool, the probe's counts): their sum, and one line naming both numbers and their sources.
    # The parts stay as read; the bar scales them into NVML's figure and says so.
    parts_bytes: int | None = None
    inconsistent: str | None = None


def unprobed_split(reason: str = NO_PROBE) -> MemorySplit:
    """The split of a process that has no probe: every field unknown, and why."""
    return MemorySplit(unavailable=dict.fromkeys(SPLIT_FIELDS, reason))


@dataclass(frozen=True)
class GpuProcess:
    """One process with a context on a GPU (or MIG instance), as NVML lists it."""

    pid: int
    kind: Literal["compute", "graphics", "compute+graphics"] = "compute"
    used_bytes: int | None = None  # NVML's per-process figure (nvidia-smi's "GPU Memory Usage")
    user: str | None = None
    command: str | None = None
    # The process's share of the GPU's SM time in NVML's last sample period (nvmlDeviceGetProcessUtilization's
    # smUtil: nvidia-smi pmon's "sm", nvitop's "SM%"), and of its memory controller's.
    gpu_util_percent: int | None = None
    mem_util_percent: int | None = None
    # From /proc/PID/stat, read each tick: the parent (the tree groups ranks under their launcher by it, in a
    # replay too), resident host memory, and CPU time as a share of one core over the interval since the
    # source's last read (None with the reason on the first read of a process); started_at is the start time
    # in epoch seconds (boot time + start_time_ticks / CLK_TCK).
    ppid: int | None = None
    host_rss_bytes: int | None = None
    cpu_percent: float | None = None
    started_at: float | None = None
    # The parent's user and command line (/proc/PPID, read once per process and parent): the tree's launcher row
    # (a torchrun agent holds no GPU memory, so NVML does not list it). None for pid 1 or where not readable.
    parent_user: str | None = None
    parent_command: str | None = None
    gpu_instance_id: int | None = None  # MIG: the GPU and compute instance the process runs in
    compute_instance_id: int | None = None
    # /proc/PID/stat's starttime (clock ticks since boot): a probe file joins this process only if it names the
    # same, so a reused pid never takes another process's split. None: the pid is not in dltop's /proc.
    start_time_ticks: int | None = None
    split: MemorySplit = field(default_factory=unprobed_split)
    unavailable: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class MigDevice:
    """One MIG instance of a GPU in MIG mode, listed under its parent."""

    mig_index: int
    name: str | None = None
    uuid: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    memory_free_bytes: int | None = None
    processes: tuple[GpuProcess, ...] | Unavailable = ()
    unavailable: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One physical GPU. Memory is the v2 call's where the driver has it: `used` then excludes what the driver
    reserves, which is `memory_reserved_bytes` (nvidia-smi's "Reserved"); with the v1 call `used` includes it.

    Slotted: with more than 30 fields its __dict__ would not share keys (CPython's limit) and cost ~1.6 KB, about
    half of what a kept Snapshot of 8 GPUs adds to the history each tick."""

    index: int
    name: str | None = None
    uuid: str | None = None
    bus_id: str | None = None
    driver_version: str | None = None
    backend: Backend = "nvml"  # the library that read it: NVML (NVIDIA) or amdsmi (AMD, ROCm)
    # "framebuffer": NVML's device memory; "system": a unified-memory machine (GB10, Grace) whose GPU shares
    # system memory, shown from /proc/meminfo because NVML has no framebuffer total there.
    memory_pool: Literal["framebuffer", "system"] | None = None
    memory_pool_note: str | None = None  # why the pool is system memory ("unified memory: NVML reports ...")
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    memory_free_bytes: int | None = None
    memory_reserved_bytes: int | None = None
    utilization_gpu_percent: int | None = None  # share of the last sample period a kernel ran (SM activity)
    utilization_memory_percent: int | None = None
    temperature_c: int | None = None
    # The sensor temperature_c is from: "gpu" (NVML's die sensor); on AMD "edge", or "hotspot" (the junction) where
    # the board has no edge sensor (MI300-class)
    temperature_sensor: str | None = None
    power_mw: int | None = None
    power_limit_mw: int | None = None  # read once a minute: it changes only when an admin sets it
    fan_speed_percent: int | None = None  # of its maximum; Not Supported on passively cooled boards (SXM, OAM)
    pstate: int | None = None  # the performance state, 0 (P0, fastest) to 15
    # Why the clocks are held below their maximum (nvmlDeviceGetCurrentClocksEventReasons): the bit mask, and its
    # bits decoded in nvidia-smi -q's words ("SW Power Cap", "HW Thermal Slowdown"); () when none is set.
    clocks_event_reasons: int | None = None
    throttle_reasons: tuple[str, ...] | None = None
    clock_sm_mhz: int | None = None
    clock_mem_mhz: int | None = None
    encoder_util_percent: int | None = None
    decoder_util_percent: int | None = None
    # PCIe traffic, from one of two sources (`pcie_source`): "byte_counters", NVML's cumulative 64-bit byte
    # counters (nvmlDeviceGetFieldValues, drivers 555+; they cost no waiting), whose rate is derived from two
    # Snapshots (`dltop.derive.gpu_rates`), so the *_per_s fields are None with that reason; or "throughput",
    # nvmlDeviceGetPcieThroughput's own rate (it waits 20 ms per call), where the driver has no counters and the
    # *_total fields are None with why.
    pcie_source: Literal["byte_counters", "throughput"] | None = None
    pcie_tx_bytes_total: int | None = None
    pcie_rx_bytes_total: int | None = None
    pcie_tx_bytes_per_s: int | None = None
    pcie_rx_bytes_per_s: int | None = None
    # When NVML read the byte counters (their field values' timestamp, epoch seconds): a rate is over the interval
    # between two of these, the one the counters really span (None: not given; the Snapshots' times are used)
    pcie_counters_at: float | None = None
    # ECC error counts: volatile since the driver loaded, aggregate over the GPU's life (read once a minute)
    ecc_corrected_volatile: int | None = None
    ecc_corrected_aggregate: int | None = None
    ecc_uncorrected_volatile: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    # NVLink data bytes over all links, cumulative (NVML's NVLINK_THROUGHPUT_DATA fields, KiB x 1024): a rate
    # needs two Snapshots (`dltop.derive.gpu_rates`). Not Supported on a GPU without NVLink.
    nvlink_tx_bytes_total: int | None = None
    nvlink_rx_bytes_total: int | None = None
    nvlink_counters_at: float | None = None  # as pcie_counters_at, for the NVLink counters
    retired_pages_sbe: int | None = None  # pages retired for repeated single-bit errors
    retired_pages_dbe: int | None = None  # pages retired for a double-bit error
    retired_pages_pending: bool | None = None  # a retirement waits for the next reboot
    mig_mode: bool | None = None
    mig_devices: tuple[MigDevice, ...] = ()
    processes: tuple[GpuProcess, ...] | Unavailable = ()
    unavailable: dict[str, str] = field(default_factory=dict)
    # None while the GPU answers; when it cannot be read at all, one word of a fixed set ("lost": off the bus,
    # "no_permission", "timeout", "reset_required", "error"), with the full reason in `unavailable`
    down: str | None = None

    def why(self, name: str) -> str | None:
        """The reason a field is missing, or None when it is present."""
        return self.unavailable.get(name)


GpuPart = tuple[GpuDevice, ...]

# A GPU gone from under its library, in the same words for NVIDIA and AMD; {where}: where its errors are logged.
LOST_TEXT = "GPU is lost: it has fallen off the bus or was removed ({where}); it needs a reset or a reboot"
# A GPU that cannot be read has no driver version of its own to claim: null, with this reason before its own.
DOWN_DRIVER = "the GPU cannot be read"
