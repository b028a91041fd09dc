"""The memory part of a Snapshot: /proc/meminfo, /proc/vmstat, PSI, /proc/diskstats and the job's memory cgroup.

Every value is the raw kernel number (bytes, pages, counters); rates are derived later from two Snapshots.
A value the kernel did not give is None, and `unavailable` says why, keyed by field name.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dltop.model.base import Unavailable


@dataclass(frozen=True)
class Pressure:
    """One /proc/pressure/* file: share of wall time stalled (percent) and the total stall time (microseconds)."""

    some_avg10: float
    some_avg60: float
    some_avg300: float
    some_total_us: int
    full_avg10: float | None = None
    full_avg60: float | None = None
    full_avg300: float | None = None
    full_total_us: int | None = None


@dataclass(frozen=True)
class VmStat:
    """Cumulative counters from /proc/vmstat (pages or events since boot)."""

    pgpgin: int | None = None
    pgpgout: int | None = None
    pgmajfault: int | None = None
    workingset_refault_file: int | None = None
    workingset_activate_file: int | None = None
    pgscan: int | None = None
    pgsteal: int | None = None
    oom_kill: int | None = None
    unavailable: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class DiskStat:
    """Cumulative counters of one block device from /proc/diskstats (sectors are 512 bytes)."""

    name: str
    reads: int
    sectors_read: int
    read_time_ms: int
    writes: int
    sectors_written: int
    write_time_ms: int
    in_flight: int
    io_time_ms: int


@dataclass(frozen=True)
class CgroupMemory:
    """The memory controller of the watched process's cgroup: the limit that OOM-kills a container or Slurm job.

    `version` 2 reads memory.current / memory.max / memory.stat / memory.events; version 1 (older Slurm and
    Kubernetes nodes, and hybrid hosts whose memory controller sits on a v1 hierarchy) reads
    memory.usage_in_bytes, memory.limit_in_bytes (the lowest limit up the tree: memory.stat's
    hierarchical_memory_limit), memory.stat's total_cache / total_dirty and memory.oom_control's oom_kill.
    """

    path: str
    version: int = 2
    current_bytes: int | None = None
    max_bytes: int | None = None  # None: no limit when `no_limit`, else not read and `unavailable` says why
    no_limit: bool = False  # the kernel says no limit applies ("max" in v2, v1's page-counter maximum)
    file_bytes: int | None = None
    file_dirty_bytes: int | None = None
    oom_kill: int | None = None
    unavailable: dict[str, str] = field(default_factory=dict)
    # v2: the ancestor cgroup whose memory.max binds (a Slurm job above its step); the usage figures are then
    # that cgroup's, the ones its limit is held against. None: the limit (or none) is `path`'s own.
    limit_path: str | None = None


@dataclass(frozen=True)
class MemoryPart:
    """System memory and the page cache, as the kernel reports them."""

    total_bytes: int | None = None
    available_bytes: int | None = None
    cached_bytes: int | None = None
    buffers_bytes: int | None = None
    dirty_bytes: int | None = None
    writeback_bytes: int | None = None
    shmem_bytes: int | None = None
    active_file_bytes: int | None = None
    inactive_file_bytes: int | None = None
    mlocked_bytes: int | None = None
    # meminfo field -> why it is missing; "disks" -> the /proc/diskstats lines that did not parse (the devices
    # whose lines did are in `disks`)
    unavailable: dict[str, str] = field(default_factory=dict)
    vmstat: VmStat | Unavailable = field(default_factory=lambda: Unavailable("not read"))
    pressure_memory: Pressure | Unavailable = field(default_factory=lambda: Unavailable("not read"))
    pressure_io: Pressure | Unavailable = field(default_factory=lambda: Unavailable("not read"))
    disks: tuple[DiskStat, ...] | Unavailable = field(default_factory=lambda: Unavailable("not read"))
    cgroup: CgroupMemory | Unavailable | None = None

    def why(self, name: str) -> str | None:
        """The reason a meminfo field is missing, or None when it is present."""
        return self.unavailable.get(name)


def safety_margin_bytes(total_bytes: int | None) -> int:
    """MemAvailable a warm or lock must leave: 10% of RAM, at least 256 MiB, at most 4 GiB."""
    if not total_bytes:
        return 1 << 30
    return min(max(total_bytes // 10, 256 << 20), 4 << 30)


def cgroup_room_bytes(cg: CgroupMemory | Unavailable | None) -> tuple[int, str] | None:
    """Page cache the memory cgroup can hold without reclaiming its own cache: its limit less its anonymous
    memory (what is not file pages) and a margin, with the limiting cgroup's path; None when no limit is known."""
    if not isinstance(cg, CgroupMemory) or not cg.max_bytes or cg.current_bytes is None:
        return None
    anon = max(0, cg.current_bytes - (cg.file_bytes or 0))
    margin = min(max(cg.max_bytes // 10, 64 << 20), 1 << 30)
    return max(0, cg.max_bytes - anon - margin), cg.limit_path or cg.path


def page_cache_room_bytes(mem: MemoryPart) -> int | None:
    """How much page cache a dataset can occupy, its resident part included: MemAvailable less the safety margin
    (clean page cache already counts as available), or the memory cgroup's room when smaller. None: unknown.
    The warm guard holds a warm to the same rule."""
    room = None if mem.available_bytes is None else max(0, mem.available_bytes - safety_margin_bytes(mem.total_bytes))
    cg = cgroup_room_bytes(mem.cgroup)
    if cg is not None and (room is None or cg[0] < room):
        room = cg[0]
    return room
