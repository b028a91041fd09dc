"""Memory and the page cache from the kernel's own files: meminfo, vmstat, PSI, diskstats and the memory cgroup.

`root` is a parameter everywhere so tests read captured trees; a missing or malformed file becomes a reason,
never a zero and never an exception.
"""

from __future__ import annotations

import functools
import os
import re
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

from dltop import procfs
from dltop.config import Settings
from dltop.fmt import first_and_more
from dltop.kernel import process_exists
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
_MEMINFO_KEYS: dict[str, tuple[str, ...]] = {name: (key,) for name, key in MEMINFO_FIELDS.items()}

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


_path = os.path.join
# procfs's reader: a captured tree may hold a FIFO, a link to /dev/zero or a huge file where the kernel's file goes.
_read_text = procfs.read_text


def _why(e: OSError, path: str) -> str:
    if isinstance(e, FileNotFoundError):
        return f"{path} not found"
    if isinstance(e, PermissionError):
        return f"permission denied reading {path}"
    return f"cannot read {path}: {e.strerror or e}"


def _shown(text: str) -> str:
    """A field from a damaged file, cut short and quoted, for a one-line reason."""
    return repr(text[:20] + ("..." if len(text) > 20 else ""))


def parse_meminfo(text: str, bad: dict[str, str] | None = None) -> dict[str, int]:
    """`/proc/meminfo`'s sizes as {key: bytes}. Only `N kB` lines count: a line cut short ("MemAvailable: 242",
    a truncated read) or a unit-less count (HugePages_Total) is left out rather than misread as bytes. A `kB`
    line whose number is not a 64-bit count is left out too, with why in `bad[key]`."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        fields = rest.split()
        if sep and len(fields) == 2 and fields[1] == "kB":
            n = procfs.parse_count(fields[0])
            if n is not None and n * 1024 <= procfs.MAX_COUNT:
                out[key.strip()] = n * 1024
            elif bad is not None:
                bad[key.strip()] = f"{key.strip()} is {_shown(fields[0])} kB, not a 64-bit count of bytes"
    return out


def parse_vmstat(text: str, bad: dict[str, str] | None = None) -> dict[str, int]:
    """`/proc/vmstat` (and the `key N` cgroup files) as {name: counter}. Bad lines are skipped; a `name N` line
    whose N is not a 64-bit count is noted in `bad[name]`."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) != 2:
            continue
        n = procfs.parse_count(fields[1])
        if n is not None:
            out[fields[0]] = n
        elif bad is not None:
            bad[fields[0]] = f"{fields[0]} is {_shown(fields[1])}, not a 64-bit count"
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
            avgs = [float(d[k]) for k in ("avg10", "avg60", "avg300")]
            total = procfs.parse_count(d["total"])
        except (KeyError, ValueError) as e:
            raise ValueError(f"malformed '{kind}' line") from e
        # A share of wall time is 0..100 percent (float() also takes 'nan', 'inf' and '1e999').
        if not all(0.0 <= a <= 100.0 for a in avgs):
            raise ValueError(f"'{kind}' averages {', '.join(_shown(d[k]) for k in ('avg10', 'avg60', 'avg300'))} "
                             "are not percentages")
        if total is None:
            raise ValueError(f"'{kind}' total {_shown(d['total'])} is not a 64-bit count")
        return avgs[0], avgs[1], avgs[2], total

    s10, s60, s300, stotal = nums("some")
    if "full" not in lines:
        return Pressure(s10, s60, s300, stotal)
    f10, f60, f300, ftotal = nums("full")
    return Pressure(s10, s60, s300, stotal, f10, f60, f300, ftotal)


def parse_diskstats(text: str) -> tuple[list[DiskStat], list[str]]:
    """`/proc/diskstats` rows (14 or more fields), and what is wrong with each line that is not one
    ("line 3: 5 fields, a device has 14 or more: '8 0 sda 1 2'"). Blank lines are neither."""
    out = []
    bad = []
    for i, line in enumerate(text.splitlines(), 1):
        f = line.split()
        if not f:
            continue
        if len(f) < 14:
            bad.append(f"line {i}: {len(f)} fields, a device has 14 or more: {line.strip()[:60]!r}")
            continue
        counts = f[3:14]
        joined = "".join(counts)
        # all eleven ASCII digits of 64-bit counts, checked on the joined text; where not, the first that is not
        # one says why
        n = list(map(int, counts)) if joined.isascii() and joined.isdigit() and max(map(len, counts)) <= 20 else []
        if not n or max(n) > procfs.MAX_COUNT:
            bad.append(_not_counts(i, f))
            continue
        out.append(DiskStat(name=f[2], reads=n[0], sectors_read=n[2], read_time_ms=n[3], writes=n[4],
                            sectors_written=n[6], write_time_ms=n[7], in_flight=n[8], io_time_ms=n[9]))
    return out, bad


def _not_counts(i: int, f: list[str]) -> str:
    """What is wrong with line `i` of /proc/diskstats, whose fields `f` are not all counts: the first that is not."""
    wrong = next(j for j in range(3, 14) if procfs.parse_count(f[j]) is None)
    return f"line {i}: field {wrong + 1} is {f[wrong][:20]!r}, not a count"


def parse_proc_cgroup(text: str) -> tuple[int, str] | None:
    """(version, path) of the cgroup that holds the memory controller, from `/proc/PID/cgroup`: a v1 line naming
    `memory` (`4:memory:/job`) wins, since a controller is bound to one hierarchy only (a hybrid host has the
    `0::` line too); else the v2 `0::/path` line; None when there is neither."""
    v2 = None
    for line in text.splitlines():
        hier, _, rest = line.partition(":")
        controllers, sep, path = rest.partition(":")
        if not sep:
            continue
        if hier == "0" and controllers == "":
            v2 = path or "/"
        elif "memory" in controllers.split(","):
            return 1, path or "/"
    return (2, v2) if v2 is not None else None


def unescape_mount(field: str) -> str:
    """A mountinfo field as the path it names (the caches source reads the mounts too)."""
    # mountinfo writes space, tab, newline and backslash as octal escapes (\040 ...)
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_cgroup_mounts(text: str, version: int) -> list[tuple[str, str]]:
    """(root inside the hierarchy, mount point) of each cgroup2 mount (version 2), or of each cgroup v1 mount
    that carries the memory controller (version 1), from `/proc/self/mountinfo`."""
    out = []
    for line in text.splitlines():
        f = line.split(" ")
        try:
            sep = f.index("-", 6)  # optional fields end at " - ", then fstype, source, super options
        except ValueError:
            continue
        if len(f) < sep + 4:
            continue
        fstype, opts = f[sep + 1], f[sep + 3].split(",")
        if (version == 2 and fstype == "cgroup2") or (version == 1 and fstype == "cgroup" and "memory" in opts):
            out.append((unescape_mount(f[3]), unescape_mount(f[4])))
    return out


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
        bad: dict[str, str] = {}
        raw = parse_vmstat(_read_text(_path(root, "proc/vmstat")), bad)
        values: dict[str, int | None] = {}
        missing: dict[str, str] = {}
        for name, keys in VMSTAT_FIELDS.items():
            present = [raw[k] for k in keys if k in raw]
            damaged = [bad[k] for k in keys if k in bad]
            if damaged:  # a sum with one part left out would be a wrong number, not a smaller true one
                missing[name] = f"malformed /proc/vmstat: {damaged[0]}"
            elif present and sum(present) <= procfs.MAX_COUNT:
                values[name] = sum(present)
            elif present:
                missing[name] = f"malformed /proc/vmstat: {' + '.join(keys)} is past 64 bits"
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


def read_disks(root: str = "/", problems: list[str] | None = None) -> tuple[DiskStat, ...] | Unavailable:
    """Whole block devices with any I/O since boot, like `iostat -x` (partitions and unused loop/ram left out).

    A malformed line never vanishes: when no line parses the disks are unavailable with the first bad line;
    when only some do not, the good ones are kept and one line about the bad ones goes to `problems`."""
    path = _path(root, "proc/diskstats")
    try:
        rows, bad = parse_diskstats(_read_text(path))
    except OSError as e:
        return Unavailable(_why(e, path))
    if bad:
        why = f"malformed /proc/diskstats: {first_and_more(bad)}"
        if not rows:
            return Unavailable(why)
        if problems is not None:
            problems.append(why)
    have_sys = os.path.isdir(_path(root, "sys/block"))  # whole disks are listed there, partitions are not
    return tuple(d for d in rows if (d.reads or d.writes)
                 and (not have_sys or os.path.isdir(_path(root, "sys/block", d.name.replace("/", "!")))))


# v1 writes "no limit" as the page counter's maximum (LONG_MAX rounded down to a page: 9223372036854771712 with
# 4 KiB pages); no machine has 4 EiB, so anything from there up is no limit.
V1_NO_LIMIT_BYTES = 1 << 62
# Where the hierarchies sit when /proc/self/mountinfo cannot be read (a captured tree without it).
_DEFAULT_MOUNT = {1: "/sys/fs/cgroup/memory", 2: "/sys/fs/cgroup"}


def _cgroup_dir(root: str, version: int, rel: str) -> tuple[str, str]:
    """The folder of cgroup `rel` of that hierarchy and the folder the hierarchy is mounted on, found through
    /proc/self/mountinfo (dltop's own mount namespace: that is where it opens the files). Raises ValueError
    saying why it is not visible."""
    path = _path(root, "proc/self/mountinfo")
    try:
        mounts = parse_cgroup_mounts(_read_text(path), version)
    except FileNotFoundError:
        mounts = [("/", _DEFAULT_MOUNT[version])]
    except OSError as e:  # there but damaged: the default place would be a guess
        raise ValueError(_why(e, path)) from None
    if not mounts:
        what = "cgroup2" if version == 2 else "cgroup v1 with the memory controller"
        raise ValueError(f"no {what} mounted (none in /proc/self/mountinfo)")
    for mount_root, point in mounts:
        below = _below_mount(rel, mount_root)
        if below is None:
            continue
        base = _path(root, point.lstrip("/"), below.lstrip("/"))
        if os.path.isdir(base):
            return base, _path(root, point.lstrip("/"))
    raise ValueError(f"cgroup {rel} not visible under {mounts[0][1]} (another cgroup namespace?)")


def _below_mount(rel: str, mount_root: str) -> str | None:
    """Cgroup `rel` as a path under a mount of its hierarchy whose root is `mount_root`; None when it is not under
    it. A container sees its own part of the tree: the mount's root is a prefix of the path it is in."""
    if mount_root == "/":
        return rel
    if rel == mount_root or rel.startswith(mount_root + "/"):
        return rel[len(mount_root):]
    return None


def _read_count(base: str, name: str, field: str, values: dict[str, int | None], missing: dict[str, str]) -> None:
    """values[field] from a cgroup file holding one number, or the reason in missing[field]."""
    path = os.path.join(base, name)
    try:
        text = _read_text(path).strip()
    except FileNotFoundError:
        missing[field] = f"{name} missing: memory controller not enabled for this cgroup"
        return
    except OSError as e:
        missing[field] = _why(e, name)
        return
    n = procfs.parse_count(text)
    if n is not None:
        values[field] = n
    elif text.isascii() and text.isdigit():
        missing[field] = f"{name} holds {_shown(text)}, past a 64-bit count"
    else:
        missing[field] = f"{name} holds {text[:40]!r}, not a number"


def _read_keys(base: str, name: str, fields: dict[str, tuple[str, ...]], values: dict[str, int | None],
               missing: dict[str, str]) -> dict[str, int]:
    """Fill `values` from a `key N` file (memory.stat, memory.events, memory.oom_control): per field, the first
    of its keys present; the reason in `missing` where none is. Returns the whole file."""
    bad: dict[str, str] = {}
    try:
        stat = parse_vmstat(_read_text(os.path.join(base, name)), bad)
    except OSError as e:
        stat, why = {}, _why(e, name)
    else:
        why = ""
    _fill(fields, stat, bad, why, name, values, missing)
    return stat


def _fill(fields: dict[str, tuple[str, ...]], read: dict[str, int], bad: dict[str, str], why: str, where: str,
          values: dict[str, int | None], missing: dict[str, str]) -> None:
    """Per field, the first of its keys the file `where` has: its count into `values`, or why it is damaged into
    `missing`; where it has none of them, `why` (the file could not be read) or that it has none."""
    for field, keys in fields.items():
        for key in keys:
            if key in read:
                values[field] = read[key]
                break
            if key in bad:
                missing[field] = f"malformed {where}: {bad[key]}"
                break
        else:
            missing[field] = why or f"no {keys[0]} in {where}"


def _read_limit(base: str, name: str, values: dict[str, int | None], missing: dict[str, str]) -> None:
    """values["max_bytes"] from the limit file, or why not, in words that never read as "no limit"."""
    _read_count(base, name, "max_bytes", values, missing)
    if "max_bytes" in missing:
        missing["max_bytes"] = f"limit not read ({missing['max_bytes']})"


def _read_v2(base: str, rel: str) -> CgroupMemory:
    values: dict[str, int | None] = {}
    missing: dict[str, str] = {}
    _read_count(base, "memory.current", "current_bytes", values, missing)
    _read_keys(base, "memory.stat", {"file_bytes": ("file",), "file_dirty_bytes": ("file_dirty",)}, values, missing)
    _read_keys(base, "memory.events", {"oom_kill": ("oom_kill",)}, values, missing)
    path = os.path.join(base, "memory.max")
    try:
        no_limit = _read_text(path).strip() == "max"
    except FileNotFoundError:
        no_limit = rel == "/"  # the root cgroup has no memory.max: nothing limits it
    except OSError:
        no_limit = False  # _read_limit says why
    if no_limit:
        missing["max_bytes"] = "no limit (memory.max is max)"
    else:
        _read_limit(base, "memory.max", values, missing)
    return CgroupMemory(path=rel, version=2, no_limit=no_limit, unavailable=missing, **values)  # type: ignore[arg-type]


def _binding_v2(base: str, top: str, rel: str) -> CgroupMemory:
    """The v2 cgroup whose limit binds: the process's own, or the ancestor with the lowest memory.max (a Slurm
    job limits the job, not its steps; systemd may limit a slice). Its usage is what that limit is held against,
    so the numbers are the ancestor's, with `limit_path` naming it."""
    own = _read_v2(base, rel)
    best = own
    d, r = base, rel
    while os.path.normpath(d) != os.path.normpath(top) and r not in ("", "/"):
        d, r = os.path.dirname(d), os.path.dirname(r) or "/"
        if not os.path.exists(os.path.join(d, "memory.max")):
            continue  # the real root cgroup: nothing limits it
        up = _read_v2(d, r)
        if _binds_before(up, best):
            best = up
    if best is own:
        return own
    return replace(best, path=rel, limit_path=best.path)


def _binds_before(up: CgroupMemory, best: CgroupMemory) -> bool:
    """Whether an ancestor's limit binds before the lowest found so far: it is lower, or it could not be read
    where the other is no limit (a limit that cannot be read is not "no limit" either)."""
    if up.max_bytes is not None:
        return best.max_bytes is None or up.max_bytes < best.max_bytes
    return not up.no_limit and best.no_limit


def _read_v1(base: str, rel: str) -> CgroupMemory:
    values: dict[str, int | None] = {}
    missing: dict[str, str] = {}
    _read_count(base, "memory.usage_in_bytes", "current_bytes", values, missing)
    # total_*: this cgroup and those below it, as usage_in_bytes counts them; plain cache / dirty without them.
    stat = _read_keys(base, "memory.stat", {"file_bytes": ("total_cache", "cache"),
                                           "file_dirty_bytes": ("total_dirty", "dirty")}, values, missing)
    _read_keys(base, "memory.oom_control", {"oom_kill": ("oom_kill",)}, values, missing)  # Linux 4.13+
    _read_limit(base, "memory.limit_in_bytes", values, missing)
    limit = values.get("max_bytes")
    # A limit set higher up (a Slurm job's, above its step's) binds too: the kernel keeps the lowest there.
    if limit is not None and "hierarchical_memory_limit" in stat:
        limit = values["max_bytes"] = min(limit, stat["hierarchical_memory_limit"])
    no_limit = limit is not None and limit >= V1_NO_LIMIT_BYTES
    if no_limit:
        del values["max_bytes"]
        missing["max_bytes"] = f"no limit (memory.limit_in_bytes is {limit})"
    return CgroupMemory(path=rel, version=1, no_limit=no_limit, unavailable=missing, **values)  # type: ignore[arg-type]


def _no_proc_reason(root: str, pid: int | str, proc: str) -> str:
    """Why /proc/PID/cgroup is missing: the process is gone, or it runs but /proc hides it (hidepid)."""
    if pid == "self":
        return f"{proc} not found"
    if os.path.realpath(root) == "/" and process_exists(int(pid)):
        return (f"process {pid} runs, but {_path(root, 'proc')} hides it from this user (mounted with hidepid): "
                "run dltop as its owner or as root to read its cgroup")
    return f"no process {pid}"


# How long a cgroup's folder found through /proc/self/mountinfo is used without reading the mounts again (while
# the folder is there): a node with hundreds of container mounts has a mountinfo of hundreds of lines.
CGROUP_DIR_KEEP_S = 60.0


class CgroupDirs:
    """The cgroup folders found through /proc/self/mountinfo, kept by (version, cgroup path) for
    CGROUP_DIR_KEEP_S while the folder is there: a process moved to another cgroup has another path (its
    /proc/PID/cgroup is read every time), a cgroup removed fails the folder's check, and either is looked up
    in the mounts again."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._kept: dict[tuple[str, int, str], tuple[float, str, str]] = {}

    def find(self, root: str, version: int, rel: str) -> tuple[str, str]:
        key, now = (root, version, rel), self._clock()
        kept = self._kept.get(key)
        if kept is not None and now - kept[0] < CGROUP_DIR_KEEP_S and os.path.isdir(kept[1]):
            return kept[1], kept[2]
        self._kept.pop(key, None)
        base, top = _cgroup_dir(root, version, rel)  # ValueError: not visible, and nothing kept
        if len(self._kept) >= 16:  # a --pid job moved through many cgroups: keep only the newest
            self._kept.clear()
        self._kept[key] = (now, base, top)
        return base, top


def read_cgroup_memory(root: str = "/", pid: int | str = "self",
                       dirs: CgroupDirs | None = None) -> CgroupMemory | Unavailable:
    """The memory controller of `pid`'s cgroup, v2 or v1 (whichever hierarchy holds it): usage, the limit, file
    pages and OOM kills. What cannot be read says so, naming the version; a limit not read is never "no limit".
    `dirs`: where the cgroup's folder was found before (a source reading every tick), else mountinfo is read."""
    found = _memory_cgroup_of(root, pid)
    if isinstance(found, Unavailable):
        return found
    version, rel = found
    try:
        base, top = dirs.find(root, version, rel) if dirs is not None else _cgroup_dir(root, version, rel)
    except ValueError as e:
        return Unavailable(f"cgroup v{version}: limit not read ({e})")
    cg = _read_v1(base, rel) if version == 1 else _binding_v2(base, top, rel)
    if rel == "/" and cg.no_limit:
        who = "dltop runs" if pid == "self" else f"process {pid} runs"
        return Unavailable(f"cgroup v{version}: {who} in the root cgroup: no cgroup memory limit applies "
                           "(--pid PID watches a job)")
    return cg


def _memory_cgroup_of(root: str, pid: int | str) -> tuple[int, str] | Unavailable:
    """(version, path) of the cgroup holding `pid`'s memory controller, from /proc/PID/cgroup, or why none is."""
    proc = _path(root, "proc", str(pid), "cgroup")
    try:
        found = parse_proc_cgroup(_read_text(proc))
    except FileNotFoundError:
        return Unavailable(_no_proc_reason(root, pid, proc))
    except OSError as e:
        return Unavailable(_why(e, proc))
    if found is None:
        return Unavailable(f"no memory cgroup: {proc} names neither a v1 memory hierarchy nor cgroup v2")
    version, rel = found
    if ".." in rel.split("/") or "\0" in rel:
        # The kernel writes /../ for a cgroup above this cgroup namespace's root: not under any mount here.
        return Unavailable(f"cgroup v{version}: {rel[:80]!r} is outside this cgroup namespace: limit not read")
    return found


def read_memory(root: str = "/", pid: int | None = None, dirs: CgroupDirs | None = None) -> MemoryPart:
    """One reading of every memory file; parts that fail carry their reason (`dirs`: see read_cgroup_memory)."""
    path = _path(root, "proc/meminfo")
    values: dict[str, int | None] = {}
    missing: dict[str, str] = {}
    bad: dict[str, str] = {}
    try:
        raw = parse_meminfo(_read_text(path), bad)
    except OSError as e:
        raw, reason = {}, _why(e, path)
    else:
        reason = ""
    _fill(_MEMINFO_KEYS, raw, bad, reason, path, values, missing)
    disk_problems: list[str] = []
    disks = read_disks(root, disk_problems)
    if disk_problems:
        missing["disks"] = disk_problems[0]
    part = MemoryPart(unavailable=missing, **values)  # type: ignore[arg-type]
    return replace(part, vmstat=read_vmstat(root), pressure_memory=read_pressure(root, "memory"),
                   pressure_io=read_pressure(root, "io"), disks=disks,
                   cgroup=read_cgroup_memory(root, pid if pid is not None else "self", dirs))


def source(settings: Settings) -> Source:
    """The memory source at the refresh interval."""
    return Source(
        name="memory",
        interval_s=settings.refresh_s,
        read=functools.partial(read_memory, settings.root, settings.pid, CgroupDirs()),
        timeout_s=max(2.0, settings.refresh_s * 2),
        follows_refresh=True,
    )
