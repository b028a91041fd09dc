"""Memory and the page cache from the kernel's own files: meminfo, vmstat, PSI, diskstats and the memory cgroup.

`root` is a parameter everywhere so tests read captured trees; a missing or malformed file becomes a reason,
never a zero and never an exception.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

from dltop.config import Settings
from dltop.model.base import Unavailable
from dltop.model.memory import CgroupMemory, DiskStat, MemoryPart, Pressure, VmStat
from dltop.sources.base import Source

T = TypeVar("T")

# MemoryPart field -> /proc/meminfo key
MEMINFO_FIELDS = {
    "total_bytes": "MemTotal",
    "available_bytes": "MemAvailable",
    "cached_bytes": "Cached",
    "buffers_bytes": "Buffers",
    "dirty_bytes": "Dirty",
    "writeback_bytes": "Writeback",
    "shmem_bytes": "Shmem",
    "active_file_bytes": "Active(file)",
    "inactive_file_bytes": "Inactive(file)",
    "mlocked_bytes": "Mlocked",
}

# VmStat field -> /proc/vmstat keys summed (pgscan/pgsteal are split by reclaimer since Linux 4.x)
VMSTAT_FIELDS = {
    "pgpgin": ("pgpgin",),
    "pgpgout": ("pgpgout",),
    "pgmajfault": ("pgmajfault",),
    "workingset_refault_file": ("workingset_refault_file", "workingset_refault"),
    "workingset_activate_file": ("workingset_activate_file", "workingset_activate"),
    "pgscan": ("pgscan_kswapd", "pgscan_direct", "pgscan_khugepaged"),
    "pgsteal": ("pgsteal_kswapd", "pgsteal_direct", "pgsteal_khugepaged"),
    "oom_kill": ("oom_kill",),
}


def _path(root: str, *parts: str) -> str:
    return os.path.join(root, *parts)


def _read_text(path: str) -> str:
    with open(path, encoding="ascii", errors="replace") as f:
        return f.read()


def _why(e: OSError, path: str) -> str:
    if isinstance(e, FileNotFoundError):
        return f"{path} not found"
    if isinstance(e, PermissionError):
        return f"permission denied reading {path}"
    return f"cannot read {path}: {e.strerror or e}"


def _is_count(field: str) -> bool:
    """ASCII digits only: str.isdigit() also takes '¹' and other digits int() refuses."""
    return field.isascii() and field.isdigit()


def parse_meminfo(text: str) -> dict[str, int]:
    """`/proc/meminfo`'s sizes as {key: bytes}. Only `N kB` lines count: a line cut short ("MemAvailable: 242",
    a truncated read) or a unit-less count (HugePages_Total) is left out rather than misread as bytes."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        fields = rest.split()
        if sep and len(fields) == 2 and fields[1] == "kB" and _is_count(fields[0]):
            out[key.strip()] = int(fields[0]) * 1024
    return out


def parse_vmstat(text: str) -> dict[str, int]:
    """`/proc/vmstat` as {name: counter}. Bad lines are skipped."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 2 and _is_count(fields[1]):
            out[fields[0]] = int(fields[1])
    return out


def parse_pressure(text: str) -> Pressure:
    """One `/proc/pressure/*` file; raises ValueError when the `some` line is missing or malformed."""
    lines: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        if kind in ("some", "full"):
            lines[kind] = dict(item.split("=", 1) for item in rest.split() if "=" in item)
    if "some" not in lines:
        raise ValueError("no 'some' line")

    def nums(kind: str) -> tuple[float, float, float, int]:
        d = lines[kind]
        try:
            return float(d["avg10"]), float(d["avg60"]), float(d["avg300"]), int(d["total"])
        except (KeyError, ValueError) as e:
            raise ValueError(f"malformed '{kind}' line") from e

    s10, s60, s300, stotal = nums("some")
    if "full" not in lines:
        return Pressure(s10, s60, s300, stotal)
    f10, f60, f300, ftotal = nums("full")
    return Pressure(s10, s60, s300, stotal, f10, f60, f300, ftotal)


def parse_diskstats(text: str) -> list[DiskStat]:
    """`/proc/diskstats` rows (14 or more fields); malformed rows are skipped."""
    out = []
    for line in text.splitlines():
        f = line.split()
        if len(f) < 14 or not all(_is_count(x) for x in f[3:14]):
            continue
        n = [int(x) for x in f[3:14]]
        out.append(
            DiskStat(
                name=f[2],
                reads=n[0],
                sectors_read=n[2],
                read_time_ms=n[3],
                writes=n[4],
                sectors_written=n[6],
                write_time_ms=n[7],
                in_flight=n[8],
                io_time_ms=n[9],
            )
        )
    return out


def parse_proc_cgroup(text: str) -> str | None:
    """The cgroup v2 path from `/proc/PID/cgroup` (the `0::/path` line), or None on a v1-only system."""
    for line in text.splitlines():
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hier == "0" and controllers == "":
            return path or "/"
    return None


def _try(read: Callable[[], T]) -> T | Unavailable:
    try:
        return read()
    except OSError as e:
        return Unavailable(_why(e, e.filename or "file"))
    except ValueError as e:
        return Unavailable(f"malformed: {e}")


def read_vmstat(root: str = "/") -> VmStat | Unavailable:
    """Counters from /proc/vmstat; each missing one has a reason."""

    def read() -> VmStat:
        raw = parse_vmstat(_read_text(_path(root, "proc/vmstat")))
        values: dict[str, int | None] = {}
        missing: dict[str, str] = {}
        for name, keys in VMSTAT_FIELDS.items():
            present = [raw[k] for k in keys if k in raw]
            if present:
                values[name] = sum(present)
            else:
                missing[name] = f"not in /proc/vmstat on this kernel ({keys[0]})"
        if not values:
            raise ValueError("/proc/vmstat has none of the expected counters")
        return VmStat(**values, unavailable=missing)  # type: ignore[arg-type]

    return _try(read)


def read_pressure(root: str, resource: str) -> Pressure | Unavailable:
    """`/proc/pressure/<resource>`; unavailable on kernels without PSI (or booted with psi=0)."""
    path = _path(root, "proc/pressure", resource)
    try:
        text = _read_text(path)
    except FileNotFoundError:
        return Unavailable("kernel has no PSI (/proc/pressure missing: CONFIG_PSI off or psi=0)")
    except OSError as e:
        # With psi=0 the files exist but reading them fails with EOPNOTSUPP.
        return Unavailable(_why(e, path))
    try:
        return parse_pressure(text)
    except ValueError as e:
        return Unavailable(f"malformed {path}: {e}")


def _is_whole_disk(root: str, name: str) -> bool:
    # Partitions have a `partition` file in their sysfs directory; whole disks are listed in /sys/block.
    return os.path.isdir(_path(root, "sys/block", name.replace("/", "!")))


def read_disks(root: str = "/") -> tuple[DiskStat, ...] | Unavailable:
    """Whole block devices with any I/O since boot, like `iostat -x` (partitions and unused loop/ram left out)."""

    def read() -> tuple[DiskStat, ...]:
        rows = parse_diskstats(_read_text(_path(root, "proc/diskstats")))
        have_sys = os.path.isdir(_path(root, "sys/block"))
        out = []
        for d in rows:
            if have_sys and not _is_whole_disk(root, d.name):
                continue
            if d.reads == 0 and d.writes == 0:
                continue
            out.append(d)
        return tuple(out)

    return _try(read)


def _read_int_file(path: str) -> int | str:
    """An integer file, or its text ("max") when it is not a number."""
    text = _read_text(path).strip()
    return int(text) if _is_count(text) else text


def read_cgroup_memory(root: str = "/", pid: int | str = "self") -> CgroupMemory | Unavailable:
    """The cgroup v2 memory controller of `pid`: current usage, the limit, file pages and OOM kills."""
    proc = _path(root, "proc", str(pid), "cgroup")
    try:
        rel = parse_proc_cgroup(_read_text(proc))
    except FileNotFoundError:
        return Unavailable(f"no process {pid}" if pid != "self" else f"{proc} not found")
    except OSError as e:
        return Unavailable(_why(e, proc))
    if rel is None:
        return Unavailable("cgroup v1 only: memory.current needs cgroup v2 (unified hierarchy)")
    if rel == "/":
        who = "dltop runs" if pid == "self" else f"process {pid} runs"
        return Unavailable(f"{who} in the root cgroup: no cgroup memory limit applies (--pid PID watches a job)")
    base = _path(root, "sys/fs/cgroup", rel.lstrip("/"))
    if not os.path.isdir(base):
        return Unavailable(f"cgroup {rel} not visible at {base} (another cgroup namespace?)")
    values: dict[str, int | None] = {}
    missing: dict[str, str] = {}
    for name, fname in (("current_bytes", "memory.current"), ("max_bytes", "memory.max")):
        try:
            v = _read_int_file(os.path.join(base, fname))
        except OSError as e:
            missing[name] = (
                f"{fname} missing: memory controller not enabled for {rel}"
                if isinstance(e, FileNotFoundError)
                else _why(e, fname)
            )
            continue
        if isinstance(v, int):
            values[name] = v
        else:
            missing[name] = v  # "max": no limit
    for name, fname, keys in (
        ("file_bytes", "memory.stat", ("file",)),
        ("file_dirty_bytes", "memory.stat", ("file_dirty",)),
        ("oom_kill", "memory.events", ("oom_kill",)),
    ):
        try:
            stat = parse_vmstat(_read_text(os.path.join(base, fname)))
        except OSError as e:
            missing[name] = _why(e, fname)
            continue
        if keys[0] in stat:
            values[name] = stat[keys[0]]
        else:
            missing[name] = f"no {keys[0]} in {fname}"
    return CgroupMemory(path=rel, unavailable=missing, **values)  # type: ignore[arg-type]


def read_memory(root: str = "/", pid: int | None = None) -> MemoryPart:
    """One reading of every memory file; parts that fail carry their reason."""
    path = _path(root, "proc/meminfo")
    values: dict[str, int | None] = {}
    missing: dict[str, str] = {}
    try:
        raw = parse_meminfo(_read_text(path))
    except OSError as e:
        raw = {}
        reason = _why(e, path)
    else:
        reason = ""
    for name, key in MEMINFO_FIELDS.items():
        if key in raw:
            values[name] = raw[key]
        else:
            missing[name] = reason or f"no {key} in {path}"
    part = MemoryPart(unavailable=missing, **values)  # type: ignore[arg-type]
    return replace(
        part,
        vmstat=read_vmstat(root),
        pressure_memory=read_pressure(root, "memory"),
        pressure_io=read_pressure(root, "io"),
        disks=read_disks(root),
        cgroup=read_cgroup_memory(root, pid if pid is not None else "self"),
    )


def source(settings: Settings) -> Source:
    """The memory source at the refresh interval."""
    return Source(
        name="memory",
        interval_s=settings.refresh_s,
        read=lambda: read_memory(settings.root, settings.pid),
        timeout_s=max(2.0, settings.refresh_s * 2),
        follows_refresh=True,
    )
