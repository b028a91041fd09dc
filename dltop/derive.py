"""Rates as pure functions of two Snapshots: live, pause and replay run this code and show the same numbers.

Hints are `dltop.hints`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dltop.model import CachesPart, GpuDevice, MemoryPart, ModelStats, Snapshot, Unavailable
from dltop.model.memory import DiskStat, VmStat

SECTOR_BYTES = 512
PAGE_BYTES = 4096  # /proc/vmstat pgpgin/pgpgout count KiB; workingset_* count pages of the base page size


@dataclass(frozen=True)
class DiskRates:
    """One device over one interval, in the columns of `iostat -x`."""

    name: str
    reads_per_s: float
    writes_per_s: float
    read_bytes_per_s: float
    write_bytes_per_s: float
    await_ms: float | None  # None when no I/O completed in the interval (iostat prints 0.00)
    util_pct: float


@dataclass(frozen=True)
class VmRates:
    """Page-cache traffic over one interval."""

    refaults_per_s: float | None  # evicted file pages read back soon after: the cache is thrashing
    activations_per_s: float | None
    major_faults_per_s: float | None
    page_in_bytes_per_s: float | None
    page_out_bytes_per_s: float | None
    scanned_per_s: float | None
    oom_kills: int | None  # new OOM kills in the interval


def _rate(prev: int | None, cur: int | None, dt: float) -> float | None:
    if prev is None or cur is None or dt <= 0 or cur < prev:  # counter reset (reboot, replayed mix-up)
        return None
    return (cur - prev) / dt


def disk_rates(prev: Sequence[DiskStat], cur: Sequence[DiskStat], dt: float) -> list[DiskRates]:
    """iostat -x's r/s, w/s, rMB/s, wMB/s, await and %util for devices present in both readings."""
    before = {d.name: d for d in prev}
    out: list[DiskRates] = []
    if dt <= 0:
        return out
    for d in cur:
        p = before.get(d.name)
        if p is None or d.reads < p.reads or d.writes < p.writes:
            continue
        ios = (d.reads - p.reads) + (d.writes - p.writes)
        ticks = (d.read_time_ms - p.read_time_ms) + (d.write_time_ms - p.write_time_ms)
        out.append(
            DiskRates(
                name=d.name,
                reads_per_s=(d.reads - p.reads) / dt,
                writes_per_s=(d.writes - p.writes) / dt,
                read_bytes_per_s=(d.sectors_read - p.sectors_read) * SECTOR_BYTES / dt,
                write_bytes_per_s=(d.sectors_written - p.sectors_written) * SECTOR_BYTES / dt,
                await_ms=ticks / ios if ios > 0 else None,
                util_pct=min(100.0, max(0.0, (d.io_time_ms - p.io_time_ms) / (dt * 1000) * 100)),
            )
        )
    return out


def vm_rates(prev: VmStat, cur: VmStat, dt: float) -> VmRates:
    """Refaults, major faults, paging and reclaim scanning per second, from two /proc/vmstat readings."""
    pin = _rate(prev.pgpgin, cur.pgpgin, dt)
    pout = _rate(prev.pgpgout, cur.pgpgout, dt)
    oom = None
    if prev.oom_kill is not None and cur.oom_kill is not None and cur.oom_kill >= prev.oom_kill:
        oom = cur.oom_kill - prev.oom_kill
    return VmRates(
        refaults_per_s=_rate(prev.workingset_refault_file, cur.workingset_refault_file, dt),
        activations_per_s=_rate(prev.workingset_activate_file, cur.workingset_activate_file, dt),
        major_faults_per_s=_rate(prev.pgmajfault, cur.pgmajfault, dt),
        page_in_bytes_per_s=pin * 1024 if pin is not None else None,
        page_out_bytes_per_s=pout * 1024 if pout is not None else None,
        scanned_per_s=_rate(prev.pgscan, cur.pgscan, dt),
        oom_kills=oom,
    )


def memory_rates(prev: Snapshot | None, cur: Snapshot) -> tuple[VmRates | None, list[DiskRates]]:
    """The rates between two Snapshots' memory parts, or (None, []) when either lacks them."""
    if prev is None or not isinstance(prev.memory, MemoryPart) or not isinstance(cur.memory, MemoryPart):
        return None, []
    dt = cur.ts - prev.ts
    vm = None
    if isinstance(prev.memory.vmstat, VmStat) and isinstance(cur.memory.vmstat, VmStat):
        vm = vm_rates(prev.memory.vmstat, cur.memory.vmstat, dt)
    disks: list[DiskRates] = []
    if not isinstance(prev.memory.disks, Unavailable) and not isinstance(cur.memory.disks, Unavailable):
        disks = disk_rates(prev.memory.disks, cur.memory.disks, dt)
    return vm, disks


@dataclass(frozen=True)
class ServerRates:
    """One model behind one server over one interval."""

    url: str
    model_name: str
    replica: str | None
    # vLLM V1: new hits / new queries; the engine's own gauge (V0, SGLang) where it gives one; else why not.
    prefix_cache_hit_rate: float | Unavailable
    preemptions: int | None  # new preemptions in the interval (the pool is too small for the load)


def server_rates(prev: Snapshot | None, cur: Snapshot) -> list[ServerRates]:
    """Per model of every server answering in both Snapshots: the prefix-cache hit rate over the interval and
    the new preemptions; a counter that went backwards (a restart) gives no rate."""
    if prev is None or not isinstance(prev.servers, tuple) or not isinstance(cur.servers, tuple):
        return []
    before = {(s.url, m.model_name, m.replica): m for s in prev.servers for m in s.models}
    out = []
    for s in cur.servers:
        for m in s.models:
            p = before.get((s.url, m.model_name, m.replica))
            if p is None:
                continue
            rate: float | Unavailable = m.prefix_cache_hit_rate
            if m.prefix_cache_hits_total is not None and m.prefix_cache_queries_total is not None:
                rate = _hit_rate(p, m)
            preempt = None
            if (isinstance(p.preemptions_total, int) and isinstance(m.preemptions_total, int)
                    and m.preemptions_total >= p.preemptions_total):
                preempt = m.preemptions_total - p.preemptions_total
            out.append(ServerRates(s.url, m.model_name, m.replica, rate, preempt))
    return out


def _hit_rate(p: ModelStats, m: ModelStats) -> float | Unavailable:
    if p.prefix_cache_hits_total is None or p.prefix_cache_queries_total is None:
        return Unavailable("no prefix-cache counters in the previous reading")
    assert m.prefix_cache_hits_total is not None and m.prefix_cache_queries_total is not None
    hits = m.prefix_cache_hits_total - p.prefix_cache_hits_total
    queries = m.prefix_cache_queries_total - p.prefix_cache_queries_total
    if hits < 0 or queries < 0:
        return Unavailable("prefix-cache counters went backwards (the server restarted)")
    if queries == 0:
        return Unavailable("no prefix-cache queries in the interval")
    return min(1.0, hits / queries)


@dataclass(frozen=True)
class GpuRates:
    """One GPU's PCIe traffic over one interval (or, where the driver has no byte counters, NVML's own rate)."""

    index: int
    uuid: str | None
    pcie_tx_bytes_per_s: float | Unavailable
    pcie_rx_bytes_per_s: float | Unavailable


def gpu_rates(prev: Snapshot | None, cur: Snapshot) -> list[GpuRates]:
    """PCIe bytes per second per GPU of `cur`: the byte counters' difference over the interval where the GPU has
    them (a GPU is matched by index and UUID, so a swapped GPU gives no rate), else NVML's throughput reading."""
    if not isinstance(cur.gpus, tuple):
        return []
    before: dict[tuple[int, str | None], GpuDevice] = {}
    dt = 0.0
    if prev is not None and isinstance(prev.gpus, tuple):
        before = {(g.index, g.uuid): g for g in prev.gpus}
        dt = cur.ts - prev.ts
    return [GpuRates(g.index, g.uuid, _pcie_rate(before.get((g.index, g.uuid)), g, "tx", dt),
                     _pcie_rate(before.get((g.index, g.uuid)), g, "rx", dt)) for g in cur.gpus]


def _pcie_rate(p: GpuDevice | None, g: GpuDevice, direction: str, dt: float) -> float | Unavailable:
    total, per_s = f"pcie_{direction}_bytes_total", f"pcie_{direction}_bytes_per_s"
    if g.pcie_source != "byte_counters":
        rate = getattr(g, per_s)
        return float(rate) if rate is not None else Unavailable(g.why(per_s) or "no PCIe reading")
    now = getattr(g, total)
    if now is None:
        return Unavailable(g.why(total) or "no PCIe byte counter reading")
    before = None if p is None or p.pcie_source != "byte_counters" else getattr(p, total)
    if before is None:
        return Unavailable("a rate needs two readings of the PCIe byte counters")
    if dt <= 0:
        return Unavailable("no time between the two readings")
    if now < before:
        return Unavailable("the PCIe byte counter went backwards (driver reloaded or GPU reset)")
    return (now - before) / dt


def cache_growth(first: Snapshot, cur: Snapshot) -> dict[str, int]:
    """Bytes each cache grew (negative: shrank) from `first` to `cur`, by name; a cache without a size in
    either Snapshot (missing, unreadable, another path now) is left out, never 0."""
    if not isinstance(first.caches, CachesPart) or not isinstance(cur.caches, CachesPart):
        return {}
    out = {}
    for c in cur.caches.caches:
        before = first.caches.get(c.name)
        if before is not None and before.path == c.path and before.size_bytes is not None and c.size_bytes is not None:
            out[c.name] = c.size_bytes - before.size_bytes
    return out
