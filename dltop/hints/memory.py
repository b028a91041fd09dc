"""Memory hints: the page cache squeezing available memory, the job's memory cgroup near its limit."""

from __future__ import annotations

from collections.abc import Sequence

from dltop.fmt import percent_text
from dltop.hints.base import Hint, rule
from dltop.model import MemoryPart, Snapshot, Unavailable
from dltop.model.memory import CgroupMemory, Pressure


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
    if (m.available_bytes >= SQUEEZE_AVAILABLE_FRACTION * m.total_bytes
            or m.cached_bytes <= SQUEEZE_CACHED_FRACTION * m.total_bytes):
        return None
    psi = m.pressure_memory
    if isinstance(psi, Unavailable) or not _pressure_rising(psi, mem):
        return None
    return Hint(
        id="page-cache-squeeze",
        severity="critical",
        text=(
            f"page cache is squeezing available memory: training may be OOM-killed (MemAvailable "
            f"{gib(m.available_bytes)}, {percent_text(100 * m.available_bytes / m.total_bytes)}, while Cached holds "
            f"{gib(m.cached_bytes)} and memory pressure rises: {psi.some_avg10:.1f}% stalled)"
        ),
        fix=_squeeze_fix(m),
        numbers={"available_bytes": m.available_bytes, "total_bytes": m.total_bytes,
                 "cached_bytes": m.cached_bytes, "memory_some_avg10_pct": psi.some_avg10},
    )


def _squeeze_fix(m: MemoryPart) -> str:
    """What holds the page cache that reclaim cannot drop; else the way to free it."""
    why = []
    if m.shmem_bytes:
        why.append(f"Shmem {gib(m.shmem_bytes)} (tmpfs, /dev/shm: data-loader workers) cannot be dropped")
    if m.dirty_bytes:
        why.append(f"Dirty {gib(m.dirty_bytes)} must be written first")
    if m.mlocked_bytes:
        why.append(f"Mlocked {gib(m.mlocked_bytes)} is pinned")
    return "; ".join(why) or "evict datasets you no longer read (e) or lower the data-loader's prefetch"


def _pressure_rising(psi: Pressure, mem: list[tuple[float, MemoryPart]]) -> bool:
    """Some memory stall now, more than over the last minute or than at the start of the history."""
    earlier = [p.pressure_memory for _, p in mem[:-1] if not isinstance(p.pressure_memory, Unavailable)]
    rising = psi.some_avg10 > psi.some_avg60 or (bool(earlier) and psi.some_avg10 > earlier[0].some_avg10)
    return bool(psi.some_avg10 > 0 and rising)


CGROUP_NEAR_LIMIT = 0.90


@rule
def cgroup_near_limit(history: Sequence[Snapshot]) -> Hint | None:
    """The job's memory cgroup is close to memory.max: the container or Slurm job will be OOM-killed first."""
    mem = _memory_history(history)
    cg = mem[-1][1].cgroup if mem else None
    if not isinstance(cg, CgroupMemory) or not cg.max_bytes or cg.current_bytes is None:
        return None
    share = cg.current_bytes / cg.max_bytes
    if share < CGROUP_NEAR_LIMIT:
        return None
    file_part = f", of which page cache {gib(cg.file_bytes)}" if cg.file_bytes else ""
    where = cg.limit_path or cg.path
    return Hint(
        id="cgroup-near-limit",
        subject=f"cgroup {where}",
        severity="critical" if share >= 0.97 else "warn",
        text=(
            f"memory cgroup {where} at {percent_text(100 * share)} of its limit "
            f"({gib(cg.current_bytes)} of {gib(cg.max_bytes)}{file_part}): this limit, not the machine's, "
            f"is what OOM-kills the job"
        ),
        fix="page cache inside the cgroup counts against the limit; dirty pages are reclaimed only after writeback",
        numbers={"current_bytes": cg.current_bytes, "max_bytes": cg.max_bytes, "file_bytes": cg.file_bytes or 0},
    )
