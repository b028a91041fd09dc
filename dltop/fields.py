"""Every number of a Snapshot described once (name, kind, unit, help, labels), and the samples it gives.

The exporter's metric names (`dltop_` + `Field.name`), its HELP and TYPE lines, `dltop dump`'s columns and
docs/exporter.md all come from `FIELDS`. `samples(snapshot)` walks one Snapshot and yields each number with its
labels: a part that is Unavailable (or None: not asked for) yields nothing, a value that is None yields nothing —
never a 0 standing in for "unknown". Labels name objects (a dataset, a GPU, a pid), never files, so the number
of series stays that of the objects watched; a process that ended is gone from the next Snapshot and so from
the samples.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal, Protocol

from dltop.derive import server_rates
from dltop.model import (
    CachesPart,
    CgroupMemory,
    DatasetsPart,
    GpuDevice,
    GpuProcess,
    MemoryPart,
    Pressure,
    ProbesPart,
    ServerStats,
    Snapshot,
    SourceStatus,
    Unavailable,
    VmStat,
)
from dltop.model.base import display_path
from dltop.model.datasets import DatasetResidency, DatasetUnavailable
from dltop.model.gpu import SPLIT_FIELDS

Kind = Literal["gauge", "counter", "info"]
PREFIX = "dltop_"


@dataclass(frozen=True)
class Field:
    """One number of the Snapshot: its Prometheus name without `dltop_` (base units; counters end in `_total`,
    info metrics in `_info` and have the value 1), its kind, unit, help and label names."""

    name: str
    kind: Kind
    unit: str  # "bytes", "seconds", "ratio" (0..1), "tokens", "pages", "celsius", "watts", "hertz", "" (a count)
    help: str
    labels: tuple[str, ...] = ()
    part: str = ""  # the Snapshot part it comes from ("memory", "gpus", ...); "hints" and "sources" are not parts


_ALL: list[Field] = []


def _field(part: str, name: str, kind: Kind, unit: str, help: str, labels: tuple[str, ...] = ()) -> Field:
    f = Field(name, kind, unit, help, labels, part)
    _ALL.append(f)
    return f


_Row = tuple[str, Kind, str, str, str] | tuple[str, Kind, str, str, str, float]
_Table = tuple[tuple[Field, str, float], ...]


def _table(part: str, labels: tuple[str, ...], rows: tuple[_Row, ...]) -> _Table:
    """Fields each read from one attribute of an object: rows of (name, kind, unit, help, attribute) and, where
    the attribute is not in base units, the scale that makes it so. Gives (field, attribute, scale)."""
    out = []
    for name, kind, unit, help, attr, *scale in rows:
        out.append((_field(part, name, kind, unit, help, labels), attr, scale[0] if scale else 1))
    return tuple(out)


# -- sources: which parts came in -----------------------------------------------------------------------------
SOURCE = ("source",)
SOURCE_UP = _field("sources", "source_up", "gauge", "", "1 when the source's last read succeeded and its part is "
                   "available; 0 when it failed, is overdue, or the system cannot provide the part (the reason is in "
                   "dltop_source_unavailable_info)", SOURCE)
SOURCE_UNAVAILABLE = _field("sources", "source_unavailable_info", "info", "",
                            "Why a source is down (present only while dltop_source_up is 0): reason slow (a read "
                            "overdue), error (the read failed) or unavailable (the system cannot provide the part); "
                            "detail a text that stays the same while the cause does", ("source", "reason", "detail"))
SOURCE_LAST_OK = _field("sources", "source_last_success_timestamp_seconds", "gauge", "seconds",
                        "Unix time of the source's last successful read", SOURCE)
SOURCE_DURATION = _field("sources", "source_read_duration_seconds", "gauge", "seconds",
                         "How long the source's last read took", SOURCE)
SNAPSHOT_TS = _field("sources", "snapshot_timestamp_seconds", "gauge", "seconds",
                     "Unix time of the Snapshot these numbers come from")

# -- memory: /proc/meminfo, /proc/vmstat, PSI, the memory cgroup -----------------------------------------------
_MEMINFO = _table("memory", (), (  # MemoryPart attributes
    ("memory_total_bytes", "gauge", "bytes", "MemTotal: usable RAM (/proc/meminfo)", "total_bytes"),
    ("memory_available_bytes", "gauge", "bytes", "MemAvailable: memory that can be had without swapping, clean page "
     "cache included (/proc/meminfo)", "available_bytes"),
    ("memory_cached_bytes", "gauge", "bytes", "Cached: the page cache, shmem and tmpfs included (/proc/meminfo)",
     "cached_bytes"),
    ("memory_buffers_bytes", "gauge", "bytes", "Buffers: block-device cache (/proc/meminfo)", "buffers_bytes"),
    ("memory_dirty_bytes", "gauge", "bytes", "Dirty: page cache waiting to be written back (/proc/meminfo)",
     "dirty_bytes"),
    ("memory_writeback_bytes", "gauge", "bytes", "Writeback: page cache being written back now (/proc/meminfo)",
     "writeback_bytes"),
    ("memory_shmem_bytes", "gauge", "bytes", "Shmem: shared memory and tmpfs, in Cached but not reclaimable as page "
     "cache (/proc/meminfo)", "shmem_bytes"),
    ("memory_active_file_bytes", "gauge", "bytes", "Active(file) page cache (/proc/meminfo)", "active_file_bytes"),
    ("memory_inactive_file_bytes", "gauge", "bytes", "Inactive(file) page cache: reclaimed first (/proc/meminfo)",
     "inactive_file_bytes"),
    ("memory_mlocked_bytes", "gauge", "bytes", "Mlocked: pages locked in memory (/proc/meminfo)", "mlocked_bytes"),
))
_VMSTAT = _table("memory", (), (  # VmStat attributes (and a scale to base units)
    ("memory_paged_in_bytes_total", "counter", "bytes", "pgpgin: bytes read from disk (/proc/vmstat)", "pgpgin", 1024),
    ("memory_paged_out_bytes_total", "counter", "bytes", "pgpgout: bytes written to disk (/proc/vmstat)", "pgpgout",
     1024),
    ("memory_major_faults_total", "counter", "", "pgmajfault: page faults that read from disk (/proc/vmstat)",
     "pgmajfault"),
    ("memory_file_refaults_total", "counter", "pages", "workingset_refault_file: evicted file pages read back soon "
     "after; a rising rate means the page cache is thrashing (/proc/vmstat)", "workingset_refault_file"),
    ("memory_file_activations_total", "counter", "pages", "workingset_activate_file: refaulted file pages put "
     "straight back on the active list (/proc/vmstat)", "workingset_activate_file"),
    ("memory_pages_scanned_total", "counter", "pages", "pgscan: pages scanned by reclaim (/proc/vmstat)", "pgscan"),
    ("memory_pages_reclaimed_total", "counter", "pages", "pgsteal: pages reclaimed (/proc/vmstat)", "pgsteal"),
    ("memory_oom_kills_total", "counter", "", "oom_kill: processes killed by the OOM killer (/proc/vmstat)",
     "oom_kill"),
))
PRESSURE = ("resource", "kind")
PRESSURE_TOTAL = _field("memory", "pressure_stalled_seconds_total", "counter", "seconds", "PSI: time tasks were "
                        "stalled on memory or I/O (/proc/pressure/*; kind some or full)", PRESSURE)
PRESSURE_AVG10 = _field("memory", "pressure_stalled_avg10_ratio", "gauge", "ratio", "PSI: share of the last 10 s "
                        "tasks were stalled (/proc/pressure/*; kind some or full)", PRESSURE)
CGROUP = ("cgroup",)
_CGROUP = _table("memory", CGROUP, (  # CgroupMemory attributes
    ("cgroup_memory_current_bytes", "gauge", "bytes", "Memory charged to the watched process's memory cgroup (the "
     "one whose limit binds)", "current_bytes"),
    ("cgroup_memory_max_bytes", "gauge", "bytes", "The memory cgroup's limit (+Inf: the kernel says no limit)",
     "max_bytes"),
    ("cgroup_memory_file_bytes", "gauge", "bytes", "Page cache charged to the memory cgroup", "file_bytes"),
    ("cgroup_memory_file_dirty_bytes", "gauge", "bytes", "Dirty page cache charged to the memory cgroup",
     "file_dirty_bytes"),
    ("cgroup_memory_oom_kills_total", "counter", "", "OOM kills in the memory cgroup", "oom_kill"),
))

# -- datasets: page-cache residency per watched dataset ----------------------------------------------------------
DATASET = ("dataset",)
DATASET_UP = _field("datasets", "dataset_up", "gauge", "", "1 when the dataset was scanned, 0 when it could not be "
                    "(reason in dltop_dataset_unavailable_info)", DATASET)
DATASET_UNAVAILABLE = _field("datasets", "dataset_unavailable_info", "info", "",
                             "Why a watched dataset could not be scanned (missing, unreadable)", ("dataset", "reason"))
DATASET_SIZE = _field("datasets", "dataset_size_bytes", "gauge", "bytes", "Apparent size of the dataset's regular "
                      "files, each hard link once (du --apparent-size -b)", DATASET)
DATASET_RESIDENT = _field("datasets", "dataset_resident_bytes", "gauge", "bytes", "Data of the dataset in the page "
                          "cache (fincore's RES, holes of sparse files left out)", DATASET)
DATASET_DATA = _field("datasets", "dataset_data_bytes", "gauge", "bytes",
                      "Data of the dataset whose residency the kernel shows, in whole pages (holes of sparse files "
                      "left out; unknown_bytes apart): what resident_ratio divides by, so data_bytes * "
                      "(1 - resident_ratio) is what a reader still fetches from disk", DATASET)
DATASET_RATIO = _field("datasets", "dataset_resident_ratio", "gauge", "ratio",
                       "Resident share of the dataset's data whose residency the kernel shows", DATASET)
DATASET_CACHED = _field("datasets", "dataset_cached_bytes", "gauge", "bytes",
                        "Page cache the dataset's files hold, zero pages of sparse files' holes included (fincore's RES); "
                        "above resident_bytes only where a read of a hole cached them", DATASET)
DATASET_DIRTY = _field("datasets", "dataset_dirty_bytes", "gauge", "bytes",
                       "Dirty page cache of the dataset's files", DATASET)
DATASET_UNKNOWN = _field("datasets", "dataset_unknown_bytes", "gauge", "bytes",
                         "Data whose residency the kernel hides from dltop (files it may not write)", DATASET)
DATASET_EVICTED = _field("datasets", "dataset_recently_evicted_bytes", "gauge", "bytes",
                         "Pages evicted recently enough that a re-read is a refault (cachestat scans only)", DATASET)
DATASET_FILES = _field("datasets", "dataset_files", "gauge", "", "Regular files in the dataset", DATASET)
DATASET_SCANNED = _field("datasets", "dataset_scan_timestamp_seconds", "gauge", "seconds",
                         "Unix time the dataset's last scan finished", DATASET)
DATASET_SCAN_S = _field("datasets", "dataset_scan_duration_seconds", "gauge", "seconds",
                        "How long the dataset's last scan took", DATASET)
DATASET_COMPLETE = _field("datasets", "dataset_scan_complete", "gauge", "",
                          "1 when the last scan reached every file, 0 when a time budget cut it short", DATASET)
DATASET_FOUND = _field("datasets", "dataset_found_info", "info", "",
                       "A dataset found read by training jobs rather than watched (dltop export --export-found), and "
                       "the users whose jobs read it", ("dataset", "users"))

# -- GPUs: NVML, with the split from the probe or an inference server ---------------------------------------------
GPU = ("gpu", "uuid")
GPUS = _field("gpus", "gpus", "gauge", "",
              "GPUs NVML lists on the node: 0 where there is no NVIDIA library, driver or device, a state with the "
              "source up (why in dltop_gpus_absent_info); absent while the gpus source is down")
GPUS_ABSENT = _field("gpus", "gpus_absent_info", "info", "", "Why the node has no GPU to read: reason no_library, "
                     "no_driver or no_devices (present only while dltop_gpus is 0 for it)", ("reason",))
GPU_UP = _field("gpus", "gpu_up", "gauge", "", "1 while the GPU answers NVML, 0 when it cannot be read at all "
                "(fallen off the bus, ...: the reason in dltop_gpu_down_info)", GPU)
GPU_DOWN = _field("gpus", "gpu_down_info", "info", "",
                  "Why a GPU cannot be read: reason lost (off the bus, Xid 79), no_permission, timeout, "
                  "reset_required or error (present only while dltop_gpu_up is 0)", (*GPU, "reason"))
GPU_INFO = _field("gpus", "gpu_info", "info", "", "A GPU NVML sees", (*GPU, "name", "bus_id", "driver_version"))
GPU_MEMORY = _field("gpus", "gpu_memory_bytes", "gauge", "bytes", "GPU memory by what holds it: per process use "
                    "weights, kv_cache, allocator_cache, other_torch, non_torch (where the probe or a server says; "
                    "absent where unknown), per device use free", (*GPU, "pid", "use"))
GPU_PROCESS_MEMORY = _field("gpus", "gpu_process_memory_bytes", "gauge", "bytes",
                            "GPU memory NVML charges to a process (nvidia-smi's GPU Memory Usage)", (*GPU, "pid"))
GPU_PROCESS_INFO = _field("gpus", "gpu_process_info", "info", "", "A process with a context on a GPU",
                          (*GPU, "pid", "user", "command"))
_GPU = _table("gpus", GPU, (  # GpuDevice attributes (and a scale to base units)
    ("gpu_memory_total_bytes", "gauge", "bytes", "GPU memory in all (NVML)", "memory_total_bytes"),
    ("gpu_memory_used_bytes", "gauge", "bytes", "GPU memory in use (NVML; nvidia-smi's Used)", "memory_used_bytes"),
    ("gpu_memory_reserved_bytes", "gauge", "bytes", "GPU memory the driver reserves (NVML v2; nvidia-smi's "
     "Reserved)", "memory_reserved_bytes"),
    ("gpu_utilization_ratio", "gauge", "ratio", "Share of the last sample period a kernel ran on the GPU (NVML)",
     "utilization_gpu_percent", 0.01),
    ("gpu_memory_utilization_ratio", "gauge", "ratio", "Share of the last sample period device memory was read or "
     "written (NVML)", "utilization_memory_percent", 0.01),
    ("gpu_temperature_celsius", "gauge", "celsius", "GPU temperature (NVML)", "temperature_c"),
    ("gpu_power_watts", "gauge", "watts", "GPU power draw (NVML)", "power_mw", 0.001),
    ("gpu_power_limit_watts", "gauge", "watts", "GPU power limit (NVML)", "power_limit_mw", 0.001),
    ("gpu_sm_clock_hertz", "gauge", "hertz", "SM clock (NVML)", "clock_sm_mhz", 1e6),
    ("gpu_memory_clock_hertz", "gauge", "hertz", "Memory clock (NVML)", "clock_mem_mhz", 1e6),
    ("gpu_pcie_transmitted_bytes_total", "counter", "bytes", "PCIe bytes sent by the GPU (NVML byte counters, "
     "drivers 555+)", "pcie_tx_bytes_total"),
    ("gpu_pcie_received_bytes_total", "counter", "bytes", "PCIe bytes received by the GPU (NVML byte counters, "
     "drivers 555+)", "pcie_rx_bytes_total"),
    ("gpu_ecc_uncorrected_errors_total", "counter", "", "Uncorrected ECC errors over the GPU's life (NVML "
     "aggregate)", "ecc_uncorrected_aggregate"),
    ("gpu_ecc_corrected_errors_total", "counter", "", "Corrected ECC errors over the GPU's life (NVML aggregate, "
     "read once a minute)", "ecc_corrected_aggregate"),
    ("gpu_fan_speed_ratio", "gauge", "ratio", "Fan speed as a share of its maximum (absent on passively cooled "
     "boards)", "fan_speed_percent", 0.01),
    ("gpu_performance_state", "gauge", "", "Performance state: 0 (P0, the fastest) to 15", "pstate"),
    ("gpu_clocks_event_reasons", "gauge", "", "Why the clocks are held down, NVML's nvmlClocksEventReason* bit mask "
     "(DCGM_FI_DEV_CLOCKS_EVENT_REASONS; 0 none)", "clocks_event_reasons"),
    ("gpu_encoder_utilization_ratio", "gauge", "ratio", "Share of the last sample period the video encoder was busy "
     "(NVML)", "encoder_util_percent", 0.01),
    ("gpu_decoder_utilization_ratio", "gauge", "ratio", "Share of the last sample period the video decoder was busy "
     "(NVML)", "decoder_util_percent", 0.01),
    ("gpu_nvlink_transmitted_bytes_total", "counter", "bytes", "NVLink data bytes sent over all links (NVML)",
     "nvlink_tx_bytes_total"),
    ("gpu_nvlink_received_bytes_total", "counter", "bytes", "NVLink data bytes received over all links (NVML)",
     "nvlink_rx_bytes_total"),
    ("gpu_retired_pages_sbe", "gauge", "pages", "Memory pages retired for repeated single-bit errors (NVML)",
     "retired_pages_sbe"),
    ("gpu_retired_pages_dbe", "gauge", "pages", "Memory pages retired for a double-bit error (NVML)",
     "retired_pages_dbe"),
    ("gpu_retired_pages_pending", "gauge", "", "1 when a page retirement waits for the next reboot (NVML)",
     "retired_pages_pending"),
))

# -- inference servers: vLLM and SGLang /metrics ------------------------------------------------------------------
MODEL = ("server", "engine", "model", "replica")
SERVER = ("server", "engine")
KV_CAPACITY_BYTES = _field("servers", "inference_kv_cache_capacity_bytes", "gauge", "bytes",
                           "Bytes the server's KV-cache pool takes: its tokens times the bytes per token of the "
                           "model's config.json in the cache dtype (absent where the config was not found)", SERVER)
_MODEL = _table("servers", MODEL, (  # ModelStats attributes
    ("inference_kv_cache_usage_ratio", "gauge", "ratio", "Share of the KV-cache pool in use (the engine's own "
     "gauge)", "kv_usage"),
    ("inference_kv_cache_capacity_tokens", "gauge", "tokens", "Tokens the KV-cache pool holds", "kv_capacity_tokens"),
    ("inference_kv_cache_used_tokens", "gauge", "tokens", "Tokens in the KV-cache pool (SGLang; vLLM gives none)",
     "kv_used_tokens"),
    ("inference_requests_running", "gauge", "", "Requests running", "running_requests"),
    ("inference_requests_waiting", "gauge", "", "Requests waiting for room in the KV-cache pool", "waiting_requests"),
    ("inference_requests_swapped", "gauge", "", "Requests swapped to CPU (vLLM V0)", "swapped_requests"),
    ("inference_prefix_cache_hits_tokens_total", "counter", "tokens", "Prompt tokens found in the prefix cache (vLLM "
     "V1)", "prefix_cache_hits_total"),
    ("inference_prefix_cache_queries_tokens_total", "counter", "tokens", "Prompt tokens looked up in the prefix "
     "cache (vLLM V1)", "prefix_cache_queries_total"),
    ("inference_preemptions_total", "counter", "", "Requests preempted for lack of KV-cache room (vLLM)",
     "preemptions_total"),
))
PREFIX_HIT = _field("servers", "inference_prefix_cache_hit_ratio", "gauge", "ratio",
                    "Prefix-cache hit rate: the engine's own gauge (vLLM V0, SGLang), or for vLLM V1 hits over "
                    "queries between the last two readings", MODEL)

# -- probes: training and serving processes with dltop.probe -----------------------------------------------------
# job_id: what the ranks of one distributed job share (the probe's job_id), "" where none; one value per process,
# so it adds no series. Named job_id, not job: Prometheus' own `job` label is the scrape job's. uid: the kernel's
# owner of the process, so a job is (uid, job_id): another user's process that claims the job id is not its rank.
PROCESS = ("pid", "rank", "job_id", "uid")
_JOB_ID_CHARS = 64
TRAINING_MEMORY = _field("probes", "training_memory_bytes", "gauge", "bytes", "Bytes the process's probe counts, by "
                         "use: weights, gradients, optimizer, kv_cache", (*PROCESS, "use"))
_PROBE = _table("probes", PROCESS, (  # ProcessProbe attributes
    ("training_data_wait_ratio", "gauge", "ratio", "Share of recent step time spent waiting for the data loader (the "
     "probe)", "data_wait_fraction"),
    ("training_step_seconds", "gauge", "seconds", "Mean time of the recent steps (the probe)", "step_time_s"),
    ("training_steps_total", "counter", "", "Steps the process has run (the probe)", "steps"),
    ("training_start_timestamp_seconds", "gauge", "seconds", "Unix time the process started its probe (about when "
     "training began)", "started_at"),
    ("training_samples_per_second", "gauge", "", "Samples a second over the recent steps, where the script gives the "
     "batch size (the probe)", "samples_per_s"),
    ("training_tokens_per_second", "gauge", "", "Tokens a second over the recent steps, where the script gives the "
     "tokens per batch (the probe)", "tokens_per_s"),
    ("training_samples_total", "counter", "", "Samples the process has trained on (the probe)", "samples"),
    ("training_tokens_total", "counter", "", "Tokens the process has trained on (the probe)", "tokens"),
    ("training_loss", "gauge", "", "The last loss the script logged with probe.log (absent where it is not a finite "
     "number)", "loss"),
))

# -- compile and model caches (docs/caches.md) ----------------------------------------------------------------------
CACHE = ("cache",)
_CACHE = _table("caches", CACHE, (  # CacheInfo attributes
    ("compile_cache_size_bytes", "gauge", "bytes", "Bytes of a compile or model cache, as du -B1 counts them "
     "(TorchInductor, Triton, CUDA, Hugging Face, ...)", "size_bytes"),
    ("compile_cache_files", "gauge", "", "Regular files in the cache", "files"),
    ("compile_cache_newest_timestamp_seconds", "gauge", "seconds", "Unix time of the newest file in the cache (when "
     "something last compiled into it)", "newest_mtime"),
    ("compile_cache_scan_timestamp_seconds", "gauge", "seconds", "Unix time the cache's last walk finished",
     "scanned_at"),
    ("compile_cache_filesystem_free_bytes", "gauge", "bytes", "Free bytes of the filesystem holding the cache",
     "fs_free_bytes"),
))
CACHE_COMPLETE = _field("caches", "compile_cache_scan_complete", "gauge", "",
                        "1 when the cache's last walk reached every entry, 0 when its time budget cut it short", CACHE)
CACHE_INFO = _field("caches", "compile_cache_info", "info", "", "Where a cache is and which rule put it there",
                    ("cache", "path", "source"))

# -- hints: drawn by dltop.hints from recent Snapshots (not a Snapshot part: see hint_samples) ---------------------
HINT_ACTIVE = _field("hints", "hint_active", "gauge", "",
                     "1 while dltop's hint fires (the TUI's hint line; docs/hints in the user guide)", ("id", "severity"))

FIELDS: tuple[Field, ...] = tuple(_ALL)
BY_NAME: dict[str, Field] = {f.name: f for f in FIELDS}

Sample = tuple[Field, dict[str, str], float]
_PROBE_USES = (("weights", "weights_bytes"), ("gradients", "gradients_bytes"), ("optimizer", "optimizer_bytes"),
               ("kv_cache", "kv_bytes"))
_COMMAND_CHARS = 80  # a process's command line in gpu_process_info: enough to tell jobs apart


class HintLike(Protocol):
    """What hint_samples needs of a dltop.hints.Hint."""

    @property
    def id(self) -> str: ...

    @property
    def severity(self) -> str: ...


def samples(snapshot: Snapshot, prev: Snapshot | None = None) -> Iterator[Sample]:
    """Every number of `snapshot` as (field, labels, value); `prev` (the Snapshot before) gives what needs two
    readings (vLLM V1's prefix-cache hit rate). Hints are not in a Snapshot: see `hint_samples`."""
    for _, group in sample_groups(snapshot, prev):
        yield from group


def sample_groups(snapshot: Snapshot, prev: Snapshot | None = None) -> Iterator[tuple[object, Iterator[Sample]]]:
    """`samples` in groups, in the same order: (the part object its samples come from, the samples), or (None,
    the samples) for a group that depends on more than its part (the sources, the servers). A group with a part
    is a function of that object alone, so a reader that meets the same object again may keep its samples."""
    yield None, _sources(snapshot)
    if isinstance(snapshot.memory, MemoryPart):
        yield snapshot.memory, _memory(snapshot.memory)
    if isinstance(snapshot.datasets, DatasetsPart):
        yield snapshot.datasets, _datasets(snapshot.datasets)
    if isinstance(snapshot.gpus, tuple | Unavailable):
        yield snapshot.gpus, _gpus(snapshot.gpus)
    if isinstance(snapshot.servers, tuple):
        yield None, _servers(snapshot, prev)
    if isinstance(snapshot.probes, ProbesPart):
        yield snapshot.probes, _probes(snapshot.probes)
    if isinstance(snapshot.caches, CachesPart):
        yield snapshot.caches, _caches(snapshot.caches)


def _gpus(gpus: tuple[GpuDevice, ...] | Unavailable) -> Iterator[Sample]:
    if isinstance(gpus, tuple):
        yield GPUS, {}, float(len(gpus))
        for g in gpus:
            yield from _gpu(g)
    elif gpus.absent:  # a CPU-only node: 0 GPUs, not down
        yield GPUS, {}, 0.0
        yield GPUS_ABSENT, {"reason": gpus.absent}, 1.0


def hint_samples(active: Iterable[HintLike]) -> Iterator[Sample]:
    """dltop_hint_active for each hint that fires now (dltop.hints.hints over the recent Snapshots)."""
    for h in active:
        yield HINT_ACTIVE, {"id": h.id, "severity": h.severity}, 1.0


def _sources(s: Snapshot) -> Iterator[Sample]:
    yield SNAPSHOT_TS, {}, s.ts
    for name, st in s.sources.items():
        labels = {"source": name}
        down = _down(st) or _unavailable_reason(s, name)
        yield SOURCE_UP, labels, 0.0 if down else 1.0
        if down:
            yield SOURCE_UNAVAILABLE, {"source": name, "reason": down[0], "detail": down[1]}, 1.0
        if st.last_ok_ts is not None:
            yield SOURCE_LAST_OK, labels, st.last_ok_ts
        if st.duration_s is not None:
            yield SOURCE_DURATION, labels, st.duration_s


_DETAIL_CHARS = 256  # a reason's detail in a label: the cause and its code name (NVML_ERROR_...)
SLOW_DETAIL = "no answer within the source's timeout"
_ERROR_TYPE = re.compile(r"[A-Za-z_][\w.]*")


def _down(st: SourceStatus) -> tuple[str, str] | None:
    """(reason, detail) of a source whose read is overdue or failed. Label values must not change while the
    cause does not: the sampler's "slow: no answer for N s" ticks every second and an exception's message may
    hold anything, so the detail is a fixed text, or the exception's type (the sampler writes "Type: message")."""
    if not st.error:
        return None
    if st.running_since_ts is not None:
        return "slow", SLOW_DETAIL
    kind = st.error.split(":", 1)[0]
    return "error", kind if _ERROR_TYPE.fullmatch(kind) else "read failed"


def _unavailable_reason(s: Snapshot, source: str) -> tuple[str, str] | None:
    """(reason, detail) of a source whose part is unavailable, or None when it is there (or absent from this
    machine: no GPU on a CPU-only node is a state, and its source is up)."""
    part = getattr(s, source, None) if source in Snapshot.__dataclass_fields__ else None
    if isinstance(part, Unavailable):
        return None if part.absent else ("unavailable", display_path(part.reason)[:_DETAIL_CHARS])
    if isinstance(s.servers, tuple):  # one source per server, named "server URL", filling one place each
        for srv in s.servers:
            if f"server {srv.url}" == source and srv.state != "ok":
                return "error", srv.state  # one of ServerStats' STATES; srv.error may name changing numbers
    if isinstance(s.servers, Unavailable) and source.startswith("server "):
        return "unavailable", display_path(s.servers.reason)[:_DETAIL_CHARS]
    return None


def _num(value: object, scale: float = 1) -> float | None:
    """A number to export, or None for one that is unknown (None, Unavailable)."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return value * scale
    return None


def _values(table: _Table, obj: object, labels: dict[str, str]) -> Iterator[Sample]:
    """The samples of a `_table` read from `obj`: a value that is unknown gives none."""
    for f, attr, scale in table:
        if (v := _num(getattr(obj, attr), scale)) is not None:
            yield f, labels, v


def _memory(m: MemoryPart) -> Iterator[Sample]:
    yield from _values(_MEMINFO, m, {})
    if isinstance(m.vmstat, VmStat):
        yield from _values(_VMSTAT, m.vmstat, {})
    for resource, p in (("memory", m.pressure_memory), ("io", m.pressure_io)):
        if isinstance(p, Pressure):
            yield from _pressure(resource, p)
    if isinstance(m.cgroup, CgroupMemory):
        yield from _cgroup(m.cgroup)


def _cgroup(cg: CgroupMemory) -> Iterator[Sample]:
    labels = {"cgroup": display_path(cg.limit_path or cg.path)}
    for f, attr, _ in _CGROUP:
        v = math.inf if attr == "max_bytes" and cg.no_limit else _num(getattr(cg, attr))
        if v is not None:
            yield f, labels, v


def _pressure(resource: str, p: Pressure) -> Iterator[Sample]:
    yield PRESSURE_TOTAL, {"resource": resource, "kind": "some"}, p.some_total_us / 1e6
    yield PRESSURE_AVG10, {"resource": resource, "kind": "some"}, p.some_avg10 / 100
    if p.full_total_us is not None:
        yield PRESSURE_TOTAL, {"resource": resource, "kind": "full"}, p.full_total_us / 1e6
    if p.full_avg10 is not None:
        yield PRESSURE_AVG10, {"resource": resource, "kind": "full"}, p.full_avg10 / 100


def _found(part: DatasetsPart) -> Iterator[Sample]:
    listed = {ds.path for ds in part.paths}
    for f in part.found:  # only where listed: `DatasetsPart.with_found_listed`, which --export-found asks for
        if f.path in listed:
            users = sorted({r.user or f"uid {r.uid}" for r in f.readers})
            yield DATASET_FOUND, {"dataset": display_path(f.path), "users": display_path(",".join(users))}, 1.0


def _datasets(part: DatasetsPart) -> Iterator[Sample]:
    yield from _found(part)
    for ds in part.paths:
        labels = {"dataset": display_path(ds.path)}  # valid UTF-8, as a label value must be; JSON does the same
        if isinstance(ds, DatasetUnavailable):
            yield DATASET_UP, labels, 0.0
            yield DATASET_UNAVAILABLE, {**labels, "reason": display_path(ds.unavailable)}, 1.0
            continue
        assert isinstance(ds, DatasetResidency)
        ps = ds.page_size
        yield DATASET_UP, labels, 1.0
        yield DATASET_SIZE, labels, float(ds.size_bytes)
        yield DATASET_RESIDENT, labels, float(ds.data_resident_pages * ps)
        yield DATASET_DATA, labels, float(ds.known_data_pages * ps)
        if (frac := ds.resident_fraction) is not None:
            yield DATASET_RATIO, labels, frac
        yield DATASET_CACHED, labels, float(ds.resident_pages * ps)
        yield DATASET_DIRTY, labels, float(ds.dirty_pages * ps)
        yield DATASET_UNKNOWN, labels, float(ds.data_unknown_pages * ps)
        if ds.method == "cachestat":  # mincore cannot see evicted pages: no number rather than a false 0
            yield DATASET_EVICTED, labels, float(ds.recently_evicted_pages * ps)
        yield DATASET_FILES, labels, float(ds.files)
        yield DATASET_SCANNED, labels, ds.scanned_at
        yield DATASET_SCAN_S, labels, ds.scan_duration_s
        yield DATASET_COMPLETE, labels, float(ds.complete)


def _gpu(g: GpuDevice) -> Iterator[Sample]:
    labels = {"gpu": str(g.index), "uuid": g.uuid or ""}
    yield GPU_UP, labels, 0.0 if g.down else 1.0
    if g.down:
        yield GPU_DOWN, {**labels, "reason": g.down}, 1.0
    yield GPU_INFO, {**labels, "name": g.name or "", "bus_id": g.bus_id or "",
                     "driver_version": g.driver_version or ""}, 1.0
    yield from _values(_GPU, g, labels)
    yield from _gpu_memory(g, labels)


def _gpu_memory(g: GpuDevice, labels: dict[str, str]) -> Iterator[Sample]:
    """The memory of the GPU's processes, and its free memory. A GPU in MIG mode: each instance's processes and
    free memory under the instance's UUID (the parent's free would count the instances' twice)."""
    for mig in g.mig_devices:
        mig_labels = {"gpu": str(g.index), "uuid": mig.uuid or ""}
        yield from _gpu_processes(mig_labels, mig.processes)
        if mig.memory_free_bytes is not None:
            yield GPU_MEMORY, {**mig_labels, "pid": "", "use": "free"}, float(mig.memory_free_bytes)
    yield from _gpu_processes(labels, g.processes)
    if not g.mig_devices and g.memory_free_bytes is not None:
        yield GPU_MEMORY, {**labels, "pid": "", "use": "free"}, float(g.memory_free_bytes)


def _gpu_processes(labels: dict[str, str], procs: tuple[GpuProcess, ...] | Unavailable) -> Iterator[Sample]:
    if isinstance(procs, Unavailable):
        return
    for p in procs:
        pl = {**labels, "pid": str(p.pid)}
        command = display_path(p.command or "")[:_COMMAND_CHARS]
        yield GPU_PROCESS_INFO, {**pl, "user": p.user or "", "command": command}, 1.0
        if p.used_bytes is not None:
            yield GPU_PROCESS_MEMORY, pl, float(p.used_bytes)
        for attr in SPLIT_FIELDS:
            v = getattr(p.split, attr)
            if v is not None:
                yield GPU_MEMORY, {**pl, "use": attr.removesuffix("_bytes")}, float(v)


def _servers(s: Snapshot, prev: Snapshot | None) -> Iterator[Sample]:
    assert isinstance(s.servers, tuple)
    rates = {(r.url, r.model_name, r.replica): r.prefix_cache_hit_rate for r in server_rates(prev, s)}
    for srv in s.servers:
        if srv.state != "ok":
            continue
        yield from _server(srv, rates)


def _server(srv: ServerStats, rates: dict[tuple[str, str, str | None], float | Unavailable]) -> Iterator[Sample]:
    engine = srv.engine if isinstance(srv.engine, str) else ""
    if isinstance(srv.kv_capacity_bytes, int):
        yield KV_CAPACITY_BYTES, {"server": srv.url, "engine": engine}, float(srv.kv_capacity_bytes)
    for m in srv.models:
        labels = {"server": srv.url, "engine": engine, "model": m.model_name, "replica": m.replica or ""}
        yield from _values(_MODEL, m, labels)
        hit = m.prefix_cache_hit_rate
        if m.prefix_cache_hits_total is not None:  # vLLM V1: a rate needs the reading before
            hit = rates.get((srv.url, m.model_name, m.replica), Unavailable("one reading"))
        if (v := _num(hit)) is not None:
            yield PREFIX_HIT, labels, v


def _probes(part: ProbesPart) -> Iterator[Sample]:
    for p in part.processes:
        labels = {"pid": str(p.pid), "rank": "" if p.rank is None else str(p.rank),
                  "job_id": display_path(p.job_id or "")[:_JOB_ID_CHARS], "uid": str(p.uid)}
        yield from _values(_PROBE, p, labels)
        for use, attr in _PROBE_USES:
            if (v := _num(getattr(p, attr))) is not None:
                yield TRAINING_MEMORY, {**labels, "use": use}, v


def _caches(part: CachesPart) -> Iterator[Sample]:
    for c in part.caches:
        if not c.exists:  # a cache the tool would make there but has not: no numbers, not 0 bytes
            continue
        labels = {"cache": c.name if c.name != "user" else display_path(c.path)}
        yield CACHE_INFO, {**labels, "path": display_path(c.path), "source": c.source}, 1.0
        yield from _values(_CACHE, c, labels)
        yield CACHE_COMPLETE, labels, float(c.complete)
