"""Rates and hints as pure functions of Snapshots: live, pause and replay run this code and show the same numbers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from dltop.model import MemoryPart, Snapshot, Unavailable
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


# ---- hints -------------------------------------------------------------------------------------------------

Severity = Literal["info", "warn", "critical"]


@dataclass(frozen=True)
class Hint:
    """Advice drawn from recent Snapshots: what is happening, and what to do about it."""

    id: str
    severity: Severity
    text: str
    fix: str = ""


Rule = Callable[[Sequence[Snapshot]], "Hint | None"]
RULES: list[Rule] = []


def rule(fn: Rule) -> Rule:
    """Register a hint rule: a pure function of the recent Snapshots (oldest first) returning a Hint or None."""
    RULES.append(fn)
    return fn


def hints(history: Sequence[Snapshot]) -> list[Hint]:
    """Every hint the registered rules draw from `history` (oldest first), most severe first."""
    if not history:
        return []
    _load_rule_modules()
    out = [h for r in RULES if (h := r(history)) is not None]
    order = {"critical": 0, "warn": 1, "info": 2}
    return sorted(out, key=lambda h: order[h.severity])


# Modules holding further rules, imported on first use so each layer keeps its lessons next to its data.
RULE_MODULES: tuple[str, ...] = ("dltop.hints_datasets",)
_loaded = False


def _load_rule_modules() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    import importlib

    for name in RULE_MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise


def gib(n: float) -> str:
    """Bytes as GiB with one decimal."""
    return f"{n / 2**30:.1f} GiB"


def _memory_history(history: Sequence[Snapshot]) -> list[tuple[float, MemoryPart]]:
    return [(s.ts, s.memory) for s in history if isinstance(s.memory, MemoryPart)]


SQUEEZE_AVAILABLE_FRACTION = 0.10  # MemAvailable below this share of MemTotal
SQUEEZE_CACHED_FRACTION = 0.25  # while Cached holds more than this share


@rule
def page_cache_squeeze(history: Sequence[Snapshot]) -> Hint | None:
    """MemAvailable low while Cached is large and memory pressure rises: the cache is not giving memory back."""
    mem = _memory_history(history)
    if not mem:
        return None
    _, m = mem[-1]
    if m.total_bytes is None or m.available_bytes is None or m.cached_bytes is None:
        return None
    if m.available_bytes >= SQUEEZE_AVAILABLE_FRACTION * m.total_bytes:
        return None
    if m.cached_bytes <= SQUEEZE_CACHED_FRACTION * m.total_bytes:
        return None
    psi = m.pressure_memory
    if isinstance(psi, Unavailable):
        return None
    earlier = [p.pressure_memory for _, p in mem[:-1] if not isinstance(p.pressure_memory, Unavailable)]
    rising = psi.some_avg10 > psi.some_avg60 or (bool(earlier) and psi.some_avg10 > earlier[0].some_avg10)
    if psi.some_avg10 <= 0 or not rising:
        return None
    why = []
    if m.shmem_bytes:
        why.append(f"Shmem {gib(m.shmem_bytes)} (tmpfs, /dev/shm: data-loader workers) cannot be dropped")
    if m.dirty_bytes:
        why.append(f"Dirty {gib(m.dirty_bytes)} must be written first")
    if m.mlocked_bytes:
        why.append(f"Mlocked {gib(m.mlocked_bytes)} is pinned")
    return Hint(
        id="page-cache-squeeze",
        severity="critical",
        text=(
            f"page cache is squeezing available memory: MemAvailable {gib(m.available_bytes)} "
            f"({100 * m.available_bytes / m.total_bytes:.0f}%) while Cached holds {gib(m.cached_bytes)} and "
            f"memory pressure is rising ({psi.some_avg10:.1f}% stalled): training may be OOM-killed"
        ),
        fix="; ".join(why) or "evict datasets you no longer read (e) or lower the data-loader's prefetch",
    )


CGROUP_NEAR_LIMIT = 0.90


@rule
def cgroup_near_limit(history: Sequence[Snapshot]) -> Hint | None:
    """The job's memory cgroup is close to memory.max: the container or Slurm job will be OOM-killed first."""
    mem = _memory_history(history)
    if not mem:
        return None
    cg = mem[-1][1].cgroup
    if cg is None or isinstance(cg, Unavailable) or not cg.max_bytes or cg.current_bytes is None:
        return None
    share = cg.current_bytes / cg.max_bytes
    if share < CGROUP_NEAR_LIMIT:
        return None
    file_part = f", of which page cache {gib(cg.file_bytes)}" if cg.file_bytes else ""
    return Hint(
        id="cgroup-near-limit",
        severity="critical" if share >= 0.97 else "warn",
        text=(
            f"memory cgroup {cg.path} at {100 * share:.0f}% of its limit "
            f"({gib(cg.current_bytes)} of {gib(cg.max_bytes)}{file_part}): this limit, not the machine's, "
            f"is what OOM-kills the job"
        ),
        fix="page cache inside the cgroup counts against the limit; dirty pages are reclaimed only after writeback",
    )
