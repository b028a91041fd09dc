"""CPU cache topology from a sysfs/procfs tree (like lscpu's --sysroot): every cache instance, sharing, core kinds.

Reads `sys/devices/system/cpu/cpu*/{cache/index*,topology,cpu_capacity,regs/identification/midr_el1}`,
`proc/cpuinfo` and `sys/bus/event_source/devices` under a root. Every attribute is optional; a missing one is
None, never 0. Sharing comes from `shared_cpu_list` (or `shared_cpu_map`), not from package or cluster IDs,
which firmware often gets wrong. IDs are opaque labels.
"""

from __future__ import annotations

import os
import platform
import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dltop import cpuregs, procfs
from dltop.config import Settings
from dltop.fmt import first_and_more, plural
from dltop.model.base import Unavailable
from dltop.model.cpu import (
    CacheInstance,
    CcsidrEl1,
    ClidrEl1,
    CoreKind,
    CpuFlag,
    CpuidCache,
    CpuPart,
    CtrEl0,
    KindCache,
    Pmu,
    Registers,
    TopologyNode,
    format_cpu_list,
)
from dltop.sources.base import Source

CPU_DIR = "sys/devices/system/cpu"
PMU_DIR = "sys/bus/event_source/devices"

# ---------------------------------------------------------------------------------------------- text parsers


def clean(text: str) -> str:
    """A sysfs value without its trailing newline and NUL padding (some kernels write `\\n\\0`)."""
    return text.replace("\0", "").strip()


MAX_CPU_ID = (1 << 16) - 1  # Linux's NR_CPUS tops out at 8192; anything far beyond is a corrupt file
MAX_CACHE_BYTES = 1 << 40  # the largest real CPU caches are around 1 GiB; a 1 TiB "cache" is a corrupt file
MAX_CACHE_LEVEL = 15  # CLIDR and CPUID leaf 4 describe 7 levels; a level past 15 is a corrupt file
MAX_ATTR_BYTES = 64 << 10  # a sysfs attribute is at most a page (64 KiB on the largest page size)
MAX_CPUINFO_BYTES = 64 << 20  # ~1.5 KiB a CPU on x86: 8192 CPUs are ~12 MiB
CACHE_TYPES = ("Data", "Instruction", "Unified")  # all the kernel's cacheinfo writes (type_show)
# An attribute's range: a number outside is a damaged file, read as unknown (a 0 would divide by zero later).
_RANGES = {
    "level": (1, MAX_CACHE_LEVEL), "coherency_line_size": (1, 1 << 16), "ways_of_associativity": (1, 1 << 16),
    "number_of_sets": (1, 1 << 32), "physical_line_partition": (1, 1 << 16), "cpu_capacity": (0, 1 << 20),
    "cpuinfo_max_freq": (0, 1 << 32), "midr_el1": (0, (1 << 64) - 1),
}
# MIDR_EL1 fields as /proc/cpuinfo writes them (CPU implementer, CPU variant, CPU part, CPU revision).
_MIDR_FIELD_MAX = {"CPU implementer": 0xFF, "CPU variant": 0xF, "CPU part": 0xFFF, "CPU revision": 0xF}
_NUMBER_RE = re.compile(r"0[xX][0-9a-fA-F]{1,16}|[0-9]{1,20}")


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """Kernel list syntax '0-3,8,10-11' (also 'a-b:used/group', as bitmap_parselist takes) -> sorted CPUs."""
    out: set[int] = set()
    text = clean(text)
    if not text:
        return ()
    for chunk in text.split(","):
        chunk = chunk.strip()
        if chunk:
            out.update(_cpu_range(chunk))
    return tuple(sorted(out))


def _cpu_range(chunk: str) -> Iterable[int]:
    """The CPUs of one 'a', 'a-b' or 'a-b:used/group' of a kernel list."""
    rng, _, stride = chunk.partition(":")
    lo_s, dash, hi_s = rng.partition("-")
    lo = _cpu_id(lo_s)
    hi = _cpu_id(hi_s) if dash else lo
    if hi < lo:
        raise ValueError(f"bad range {chunk!r}")
    if hi > MAX_CPU_ID:
        raise ValueError(f"CPU id {hi} beyond {MAX_CPU_ID} in {chunk!r}")
    if not stride:
        return range(lo, hi + 1)
    used_s, _, group_s = stride.partition("/")
    used, group = _cpu_id(used_s), _cpu_id(group_s)
    if used < 1 or group < 1 or used > group:
        raise ValueError(f"bad stride {chunk!r}")
    return [c for c in range(lo, hi + 1) if (c - lo) % group < used]


def _cpu_id(text: str) -> int:
    """A CPU number: ASCII digits (int() takes '٣' and '+7', and raises past 4300 digits); the caller bounds it."""
    text = text.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 20:
        raise ValueError(f"CPU id {text[:20]!r} is not a number")
    return int(text)


def parse_cpu_mask(text: str) -> tuple[int, ...]:
    """Kernel mask syntax '00000000,00080000,00000008' (32-bit hex words, most significant first) -> CPUs."""
    words = clean(text).split(",")
    if len(words) * 32 > MAX_CPU_ID + 1:
        raise ValueError(f"mask of {plural(len(words), 'word')} is wider than {MAX_CPU_ID + 1} CPUs")
    value = 0
    for w in words:
        w = w.strip()
        if not w or len(w) > 8 or not all(c in "0123456789abcdefABCDEF" for c in w):
            raise ValueError(f"bad mask word {w[:20]!r}")
        value = (value << 32) | int(w, 16)
    return tuple(i for i in range(value.bit_length()) if value >> i & 1)


def parse_size(text: str) -> int:
    """sysfs cache size '64K' / '32768K' / '1M' / '512' -> bytes."""
    t = clean(text).upper().removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    digits = t[:-1] if mult != 1 else t
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 20:
        raise ValueError(f"size {text[:20]!r} is not a count")
    n = int(digits)
    if n * mult > MAX_CACHE_BYTES:
        raise ValueError(f"size {text!r} is larger than any CPU cache")
    return n * mult


@dataclass
class CpuinfoEntry:
    """The fields of one `processor` block, with the file's global fields (old 32-bit Arm) filled in."""

    cpu: int
    fields: dict[str, str] = field(default_factory=dict)


def parse_cpuinfo(text: str, bad: list[str] | None = None) -> list[CpuinfoEntry]:
    """/proc/cpuinfo -> one entry per `processor : N`, in file order (a block whose N is not a CPU number is
    left out, with why in `bad`).

    Arm kernels before 3.8ish print implementer/part once, after every processor block; those fields apply to
    every CPU that does not give its own.
    """
    entries: list[CpuinfoEntry] = []
    common: dict[str, str] = {}
    current: CpuinfoEntry | None = None
    for line in text.replace("\0", "").splitlines():
        if not line.strip():
            current = None
            continue
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if key == "processor":
            current = _processor(value, bad)
            if current is not None:
                entries.append(current)
        elif current is not None:
            current.fields[key] = value
        else:
            common.setdefault(key, value)
    for entry in entries:
        for k, v in common.items():
            entry.fields.setdefault(k, v)
    return entries


def _processor(value: str, bad: list[str] | None) -> CpuinfoEntry | None:
    """The entry that `processor : N` opens; None (why in `bad`) where N is not a CPU number."""
    try:
        cpu = _cpu_id(value)
        if cpu > MAX_CPU_ID:
            raise ValueError(f"{cpu} beyond {MAX_CPU_ID}")
    except ValueError as e:
        if bad is not None:
            bad.append(f"proc/cpuinfo: processor {e}")
        return None
    return CpuinfoEntry(cpu)


def _int_auto(text: str | None) -> int | None:
    """'0x41' or '8' (what sysfs and cpuinfo write) -> int; anything else (signs, '٣', 400 digits) -> None."""
    if text is None or not _NUMBER_RE.fullmatch(text):
        return None
    return int(text, 16) if text[:2].lower() == "0x" else int(text)


# ----------------------------------------------------------------------------------------------- raw reading


class _Tree:
    """Reads attributes under one root; remembers the root and, one line each, the attributes that are there but
    could not be used (unreadable, not a file, malformed): those are read as unknown and said in a flag."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.damaged: list[str] = []

    def bad(self, rel: str | Path, why: str) -> None:
        """Note an attribute read as unknown because it is damaged."""
        self.damaged.append(f"{rel}: {why}")

    def attr(self, rel: str | Path, max_bytes: int = MAX_ATTR_BYTES) -> str | None:
        try:
            text = procfs.read_text(self.root / rel, max_bytes, encoding="utf-8")
        except FileNotFoundError:
            return None  # an attribute this kernel or firmware does not have
        except (OSError, ValueError) as e:  # ValueError: a NUL in a path built from a directory name
            self.bad(rel, getattr(e, "strerror", None) or str(e))
            return None
        text = clean(text)
        return text or None

    def cpuinfo(self) -> list[CpuinfoEntry]:
        """The entries of proc/cpuinfo (none where it is missing or empty)."""
        text = self.attr("proc/cpuinfo", MAX_CPUINFO_BYTES)
        return parse_cpuinfo(text, self.damaged) if text else []

    def int_attr(self, rel: str | Path) -> int | None:
        v = self.attr(rel)
        if v is None:
            return None
        lo, hi = _RANGES.get(Path(rel).name, (0, procfs.MAX_COUNT))
        n = _int_auto(v)
        if n is None or not lo <= n <= hi:
            self.bad(rel, f"holds {v[:20]!r}, not a number from {lo} to {hi}")
            return None
        return n

    def cpus_attr(self, list_rel: str | Path, mask_rel: str | Path) -> tuple[int, ...] | None:
        for rel, parse in ((list_rel, parse_cpu_list), (mask_rel, parse_cpu_mask)):
            v = self.attr(rel)
            if v is not None:
                try:
                    return parse(v)
                except ValueError as e:
                    self.bad(rel, str(e))
                    continue
        return None


_CPU_RE = re.compile(r"cpu([0-9]{1,5})$")
_INDEX_RE = re.compile(r"index([0-9]+)$")


@dataclass
class _RawCache:
    cpu: int
    level: int | None
    type: str | None
    size: int | None
    line: int | None
    ways: int | None
    sets: int | None
    shared: tuple[int, ...] | None
    id: str | None
    plp: int | None
    alloc: str | None
    write: str | None


def _cpu_dirs(tree: _Tree) -> dict[int, Path]:
    base = tree.root / CPU_DIR
    out = {}
    try:
        names = os.listdir(base)
    except OSError:
        return {}
    for name in names:
        m = _CPU_RE.match(name)
        if m and int(m.group(1)) <= MAX_CPU_ID and (base / name).is_dir():
            out[int(m.group(1))] = Path(CPU_DIR) / name
    return dict(sorted(out.items()))


def _read_caches(tree: _Tree, cpu_dirs: dict[int, Path]) -> list[_RawCache]:
    """Every cache each CPU reports (CPUs that share a cache report it each)."""
    out = []
    for cpu, rel in cpu_dirs.items():
        out += _cpu_caches(tree, cpu, rel)
    return out


def _cpu_caches(tree: _Tree, cpu: int, rel: Path) -> list[_RawCache]:
    cache_dir = tree.root / rel / "cache"
    try:
        names = sorted(os.listdir(cache_dir), key=lambda n: (len(n), n))
    except OSError:
        return []
    out = []
    for name in names:
        if not _INDEX_RE.match(name):
            continue
        d = rel / "cache" / name
        size_text = tree.attr(d / "size")
        try:
            size = parse_size(size_text) if size_text is not None else None
        except ValueError as e:
            tree.bad(d / "size", str(e))
            size = None
        ctype = tree.attr(d / "type")
        if ctype is not None and ctype not in CACHE_TYPES:
            tree.bad(d / "type", f"holds {ctype[:20]!r}, not one of {', '.join(CACHE_TYPES)}")
            ctype = None
        out.append(_RawCache(
            cpu=cpu, level=tree.int_attr(d / "level"), type=ctype, size=size,
            line=tree.int_attr(d / "coherency_line_size"), ways=tree.int_attr(d / "ways_of_associativity"),
            sets=tree.int_attr(d / "number_of_sets"), shared=tree.cpus_attr(d / "shared_cpu_list", d / "shared_cpu_map"),
            id=tree.attr(d / "id"), plp=tree.int_attr(d / "physical_line_partition"),
            alloc=tree.attr(d / "allocation_policy"), write=tree.attr(d / "write_policy")))
    return out


def _cache_name(level: int, ctype: str) -> str:
    suffix = {"Data": "d", "Instruction": "i"}.get(ctype, "")
    return f"L{level}{suffix}"


# ------------------------------------------------------------------------------------------------ core kinds


_RawKind = tuple[str, str | None, int | None, int | None, list[int], list[str]]  # name, vendor, impl, part, cpus, revs
_Ids = tuple[int | None, int | None, int | None, int | None]  # MIDR's implementer, part, variant, revision


def _core_kinds(tree: _Tree, cpu_dirs: dict[int, Path], cpuinfo: list[CpuinfoEntry]) -> tuple[
        list[_RawKind], dict[str, str], str | None]:
    """(name, vendor, implementer, part, cpus, revisions) per kind; MIDR per CPU; the arch the data shows."""
    info = {e.cpu: e.fields for e in cpuinfo}
    midrs: dict[str, str] = {}
    groups: dict[tuple[object, ...], tuple[list[int], list[str]]] = {}
    names: dict[tuple[object, ...], tuple[str, str | None, int | None, int | None]] = {}
    arch: str | None = None
    for cpu in sorted(set(cpu_dirs) | set(info)):
        f = info.get(cpu, {})
        arm_arch, ids = _arm_ids(tree, cpu, cpu_dirs.get(cpu), f, midrs)
        kind = _kind_of_cpu(f, ids)
        arch = arch or arm_arch or ("x86_64" if kind is not None and kind[0][0] == "x86" else None)
        if kind is None:
            continue
        key, names[key], rev = kind
        cpus, revs = groups.setdefault(key, ([], []))
        cpus.append(cpu)
        if rev and rev not in revs:
            revs.append(rev)
    return _split_hybrids(tree, groups, names), midrs, arch


def _split_hybrids(tree: _Tree, groups: dict[tuple[object, ...], tuple[list[int], list[str]]],
                   names: dict[tuple[object, ...], tuple[str, str | None, int | None, int | None]]) -> list[_RawKind]:
    """The kinds, an x86 one split into P-cores and E-cores on Intel hybrids (the kernel lists them under two PMU
    devices)."""
    hybrid = {label: tree.attr(f"sys/devices/{dev}/cpus") for dev, label in (("cpu_core", "P-core"),
                                                                           ("cpu_atom", "E-core"))}
    kinds: list[_RawKind] = []
    for key, (cpus, revs) in groups.items():
        name, vendor, impl, part = names[key]
        if key[0] == "x86" and all(hybrid.values()):
            kinds.extend(_hybrid_kinds(tree, hybrid, name, vendor, cpus, revs))
        else:
            kinds.append((name, vendor, impl, part, cpus, revs))
    return kinds


def _arm_ids(tree: _Tree, cpu: int, sys_dir: Path | None, f: dict[str, str],
             midrs: dict[str, str]) -> tuple[str | None, _Ids]:
    """The arch an Arm CPU's identity shows, and its MIDR fields: sysfs's midr_el1, else /proc/cpuinfo's lines
    (None for each where neither says); the MIDR noted in `midrs`."""
    midr = tree.int_attr(sys_dir / "regs/identification/midr_el1") if sys_dir is not None else None
    if midr is not None:
        m = cpuregs.decode_midr(midr)
        midrs[str(cpu)] = f"0x{midr:08x}"
        return "aarch64", (m.implementer, m.part, m.variant, m.revision)
    if "CPU implementer" not in f:
        return None, (None, None, None, None)
    impl, variant, part, revision = (_midr_field(tree, cpu, f, k) for k in _MIDR_FIELD_MAX)
    if impl is not None and part is not None and variant is not None and revision is not None:
        midrs[str(cpu)] = f"0x{cpuregs.encode_midr(impl, variant, part, revision):08x}"
    arch = "aarch64" if f.get("CPU architecture", "") in ("8", "9", "AArch64") else "arm"
    return arch, (impl, part, variant, revision)


def _kind_of_cpu(f: dict[str, str], ids: _Ids) -> tuple[
        tuple[object, ...], tuple[str, str | None, int | None, int | None], str | None] | None:
    """(kind key, (name, vendor, implementer, part), revision) of one CPU: by MIDR on Arm, by model name on x86;
    None where nothing names it."""
    impl, part, variant, revision = ids
    if impl is not None and part is not None:
        rev = f"r{variant}p{revision}" if variant is not None and revision is not None else None
        return ("arm", impl, part), (cpuregs.core_name(impl, part), cpuregs.implementer_name(impl), impl, part), rev
    if "model name" not in f and "vendor_id" not in f:
        return None
    model = f.get("model name") or f.get("vendor_id") or "unknown"
    rev = f"family {f['cpu family']} model {f['model']} stepping {f['stepping']}" if {
        "cpu family", "model", "stepping"} <= f.keys() else None
    return ("x86", model), (model, f.get("vendor_id"), None, None), rev


def _hybrid_kinds(tree: _Tree, hybrid: dict[str, str | None], name: str, vendor: str | None, cpus: list[int],
                  revs: list[str]) -> list[_RawKind]:
    """An x86 kind split into its P-cores and E-cores by the kernel's cpu_core and cpu_atom PMU devices."""
    kinds: list[_RawKind] = []
    for label, text in hybrid.items():
        try:
            listed = set(parse_cpu_list(text or ""))
        except ValueError as e:
            tree.bad(f"sys/devices/cpu_{'core' if label == 'P-core' else 'atom'}/cpus", str(e))
            listed = set()
        sub = [c for c in cpus if c in listed]
        if sub:
            kinds.append((f"{name} {label}", vendor, None, None, sub, revs))
    return kinds


def _midr_field(tree: _Tree, cpu: int, fields: dict[str, str], key: str) -> int | None:
    """One MIDR field of a CPU's /proc/cpuinfo block, or None (noted) when missing or past its bits."""
    text = fields.get(key)
    n = _int_auto(text)
    if text is not None and (n is None or n > _MIDR_FIELD_MAX[key]):
        tree.bad("proc/cpuinfo", f"CPU {cpu}: {key} {text[:20]!r} is not a number up to {_MIDR_FIELD_MAX[key]:#x}")
        return None
    return n


# ----------------------------------------------------------------------------------------------- the reading


def read_cpu(root: str | os.PathLike[str] = "/") -> CpuPart | Unavailable:
    """Read the CPU cache topology under `root` (a directory holding sys/ and proc/)."""
    tree = _Tree(Path(root))
    cpu_dirs = _cpu_dirs(tree)
    cpuinfo = tree.cpuinfo()
    if not cpu_dirs and not cpuinfo:
        return Unavailable(f"no {CPU_DIR}/cpu* and no proc/cpuinfo under {root}")
    flags: list[CpuFlag] = []
    all_cpus = sorted(set(cpu_dirs) | {e.cpu for e in cpuinfo})
    online = _online(tree, cpu_dirs, flags)  # read, and flagged where damaged, even without CPU folders
    if not cpu_dirs:
        online = set(all_cpus)
    caches = _instances(_read_caches(tree, cpu_dirs), flags)
    topo = _Topology.read(tree, cpu_dirs, all_cpus)
    raw_kinds, midrs, arch = _core_kinds(tree, cpu_dirs, cpuinfo)
    if arch is None and str(root) in ("/", "") and cpu_dirs:
        arch = platform.machine() or None
    core_kinds = _kinds(raw_kinds, topo, caches, flags)

    tree_nodes = _build_tree(all_cpus, caches, topo.threads, topo.clusters, topo.cluster_ids, topo.packages)
    arrangement, reason = _classify(core_kinds, caches, topo.threads)
    _check(caches, sorted(online), flags)
    registers = _registers(root, arch, core_kinds, caches, midrs)
    _check_cpuid(registers, caches, core_kinds, flags)
    if tree.damaged:
        flags.append(_damaged_flag(tree.damaged))
    return CpuPart(arch=arch, cpus=tuple(all_cpus), online=tuple(sorted(online)), caches=caches,
                   core_kinds=core_kinds, arrangement=arrangement, arrangement_reason=reason, tree=tree_nodes,
                   registers=registers, pmus=read_pmus(tree.root), flags=tuple(flags),
                   threads_per_core=topo.threads_per_core(all_cpus))


def _kinds(raw_kinds: list[_RawKind], topo: _Topology, caches: tuple[CacheInstance, ...],
           flags: list[CpuFlag]) -> tuple[CoreKind, ...]:
    kind_of = {c: k[0] for k in raw_kinds for c in k[4]}
    return tuple(
        CoreKind(
            name=name, vendor=vendor, implementer=impl, part=part,
            revision="/".join(revs) or None, cpus=tuple(cpus),
            capacity=_uniform(topo.capacity.get(c) for c in cpus),
            max_freq_khz=_uniform(topo.max_freq.get(c) for c in cpus),
            caches=_kind_caches(name, cpus, caches, kind_of, flags),
        )
        for name, vendor, impl, part, cpus, revs in raw_kinds
    )


def _damaged_flag(damaged: list[str]) -> CpuFlag:
    return CpuFlag("damaged_files", "warning",
                   f"{plural(len(damaged), 'file')} unreadable or malformed, read as unknown: {first_and_more(damaged)}")


def _online(tree: _Tree, cpu_dirs: dict[int, Path], flags: list[CpuFlag]) -> set[int]:
    """Which CPUs are online: the `online` list if there is one, else each CPU's own `online`."""
    online_list = tree.attr(f"{CPU_DIR}/online")
    if online_list is not None:
        try:
            return set(parse_cpu_list(online_list))
        except ValueError as e:
            flags.append(CpuFlag("bad_online_list", "warning",
                                 f"{CPU_DIR}/online is unreadable ({e}); each CPU's own online file used"))
    return {c for c, rel in cpu_dirs.items() if tree.attr(rel / "online") != "0"}


@dataclass
class _Topology:
    """Cores (SMT siblings), clusters, packages, capacity and top frequency per CPU, as the files give them."""

    threads: dict[int, tuple[int, ...]] = field(default_factory=dict)
    clusters: dict[int, tuple[int, ...]] = field(default_factory=dict)
    cluster_ids: dict[int, str] = field(default_factory=dict)
    packages: dict[int, str] = field(default_factory=dict)
    capacity: dict[int, int] = field(default_factory=dict)
    max_freq: dict[int, int] = field(default_factory=dict)

    @classmethod
    def read(cls, tree: _Tree, cpu_dirs: dict[int, Path], all_cpus: list[int]) -> _Topology:
        topo = cls()
        for cpu, rel in cpu_dirs.items():
            t = rel / "topology"
            topo.threads[cpu] = (tree.cpus_attr(t / "core_cpus_list", t / "core_cpus")
                                 or tree.cpus_attr(t / "thread_siblings_list", t / "thread_siblings") or (cpu,))
            cl = tree.cpus_attr(t / "cluster_cpus_list", t / "cluster_cpus")
            if cl:
                topo.clusters[cpu] = cl
                topo.cluster_ids[cpu] = tree.attr(t / "cluster_id") or "?"
            _put(topo.packages, cpu, tree.attr(t / "physical_package_id"))
            _put(topo.capacity, cpu, tree.int_attr(rel / "cpu_capacity"))
            _put(topo.max_freq, cpu, tree.int_attr(rel / "cpufreq/cpuinfo_max_freq"))
        for cpu in all_cpus:
            topo.threads.setdefault(cpu, (cpu,))
        return topo

    def threads_per_core(self, cpus: list[int]) -> int | None:
        """The SMT threads of every core, where all cores have as many."""
        return _uniform(len(t) for t in {self.threads[c] for c in cpus})


def _put(d: dict[int, Any], cpu: int, value: object) -> None:
    if value is not None:
        d[cpu] = value


def _uniform(values: Iterable[int | None]) -> int | None:
    vals = set(values)
    return vals.pop() if len(vals) == 1 else None


def _cpus_of(caches: Iterable[CacheInstance]) -> tuple[int, ...]:
    """Every CPU that shares one of `caches`, sorted."""
    return tuple(sorted({x for c in caches for x in c.cpus}))


def _instances(raw: list[_RawCache], flags: list[CpuFlag]) -> tuple[CacheInstance, ...]:
    """One CacheInstance per (level, type, CPUs sharing it); CPUs that list the same cache merge."""
    by_key: dict[tuple[object, ...], list[_RawCache]] = {}
    no_shared: list[int] = []
    for r in raw:
        if r.level is None or r.type is None:
            continue
        if r.shared is None:
            no_shared.append(r.cpu)
        by_key.setdefault(_instance_key(r), []).append(r)
    if no_shared:
        flags.append(CpuFlag("no_sharing_info", "warning",
                             f"no shared_cpu_list/map on CPUs {format_cpu_list(no_shared)}: "
                             "caches there are taken as private unless a cache id joins them",
                             tuple(sorted(set(no_shared)))))
    out = [_instance(key, rs, flags) for key, rs in by_key.items()]
    order = {"Data": 0, "Instruction": 1, "Unified": 2}
    out.sort(key=lambda c: (c.level, order.get(c.type, 3), c.cpus))
    return tuple(out)


def _instance_key(r: _RawCache) -> tuple[object, ...]:
    """What makes CPUs' reports one cache: the CPUs sharing it, else its id, else the CPU (private)."""
    if r.shared is not None:
        return (r.level, r.type, "cpus", r.shared)
    return (r.level, r.type, "id", r.id) if r.id is not None else (r.level, r.type, "cpu", r.cpu)


def _instance(key: tuple[object, ...], rs: list[_RawCache], flags: list[CpuFlag]) -> CacheInstance:
    """One cache as the CPUs that list it report it (the first one's geometry; a flag where they differ)."""
    first = rs[0]
    level, ctype = int(first.level or 0), str(first.type)
    cpus = first.shared if key[2] == "cpus" else tuple(sorted({r.cpu for r in rs}))
    inst = CacheInstance(
        name=_cache_name(level, ctype), level=level, type=ctype,
        size_bytes=first.size, line_bytes=first.line, ways=first.ways, sets=first.sets,
        cpus=tuple(cpus or ()), id=first.id, physical_line_partition=first.plp,
        allocation_policy=first.alloc, write_policy=first.write,
    )
    disagree = [f for f in ("size", "line", "ways", "sets") if len({getattr(r, f) for r in rs}) > 1]
    if disagree:
        flags.append(CpuFlag("instance_disagrees", "warning",
                             f"{inst.name} on CPUs {format_cpu_list(inst.cpus)}: CPUs sharing it report "
                             f"different {', '.join(disagree)}; showing CPU {first.cpu}'s", inst.cpus))
    return inst


def _kind_caches(name: str, cpus: list[int], caches: tuple[CacheInstance, ...], kind_of: dict[int, str],
                 flags: list[CpuFlag]) -> tuple[KindCache, ...]:
    """Each cache level a kind's CPUs see: its geometry where all its instances agree, whom it is shared with."""
    mine = set(cpus)
    out = []
    for cname in sorted({c.name for c in caches}, key=lambda n: (int(n[1:].rstrip("di")), n)):
        insts = [c for c in caches if c.name == cname and mine & set(c.cpus)]
        if insts:
            out.append(_kind_cache(name, cname, insts, cpus, kind_of, flags))
    return tuple(out)


def _kind_cache(name: str, cname: str, insts: list[CacheInstance], cpus: list[int], kind_of: dict[int, str],
                flags: list[CpuFlag]) -> KindCache:
    geo = {f: _uniform(getattr(c, f) for c in insts) for f in ("size_bytes", "line_bytes", "ways", "sets")}
    sizes = {c.size_bytes for c in insts}
    if len(sizes) > 1:
        shown = ", ".join("unknown" if s is None else f"{s >> 10} KiB" for s in sorted(sizes, key=lambda s: s or 0))
        flags.append(CpuFlag("kind_sizes_differ", "info", f"{name} CPUs see {cname} of different sizes: {shown}",
                             tuple(cpus)))
    return KindCache(name=cname, instances=len(insts), cpus_per_instance=_uniform(len(i.cpus) for i in insts),
                     shared_with=_other_kinds(insts, kind_of, name), **geo)


def _other_kinds(insts: list[CacheInstance], kind_of: dict[int, str], name: str) -> tuple[str, ...]:
    """The core kinds other than `name` whose CPUs share these cache instances (a DynamIQ L3)."""
    return tuple(sorted({kind_of[c] for i in insts for c in i.cpus if kind_of.get(c, name) != name}))


# ------------------------------------------------------------------------------------------------------ tree

_RANK = {"package": 0, "cluster": 1, "cache": 2, "core": 3}


_Node = tuple[str, str, tuple[int, ...], int | None]  # kind, label, CPUs, index of its cache


def _build_tree(cpus: list[int], caches: tuple[CacheInstance, ...], threads: dict[int, tuple[int, ...]],
                clusters: dict[int, tuple[int, ...]], cluster_ids: dict[int, str],
                packages: dict[int, str]) -> tuple[TopologyNode, ...]:
    """Nest packages, clusters, caches and cores by CPU-set inclusion (hwloc's rule)."""
    nodes = _package_nodes(cpus, caches, threads, clusters, packages)
    seen_clusters = set()
    for c, cgroup in clusters.items():
        if cgroup in seen_clusters or cgroup == threads.get(c):
            continue
        seen_clusters.add(cgroup)
        nodes.append(("cluster", f"Cluster {cluster_ids.get(c, '?')}", cgroup, None))
    for i, inst in enumerate(caches):
        size = _short_size(inst.size_bytes)
        nodes.append(("cache", f"{inst.name} {size}" if size else inst.name, inst.cpus, i))
    for core in sorted(set(threads[c] for c in cpus)):
        label = f"Core (CPU {core[0]})" if len(core) == 1 else f"Core (CPUs {format_cpu_list(core)})"
        nodes.append(("core", label, core, None))
    return _nest(nodes, caches)


def _package_nodes(cpus: list[int], caches: tuple[CacheInstance, ...], threads: dict[int, tuple[int, ...]],
                   clusters: dict[int, tuple[int, ...]], packages: dict[int, str]) -> list[_Node]:
    """The packages. A "package" that a cache straddles is a mislabelled cluster (phones number clusters as
    packages): real packages are the connected groups of package IDs and cache sharing."""
    by_pkg: dict[str, list[int]] = defaultdict(list)
    for c, p in packages.items():
        by_pkg[p].append(c)
    nodes: list[_Node] = []
    for members in _components(cpus, (*by_pkg.values(), *(inst.cpus for inst in caches),
                                      *(threads.get(c, (c,)) for c in cpus))):
        ids = sorted({packages[c] for c in members if c in packages}, key=_id_key)
        if len(ids) > 1:
            nodes.append(("package", "Package (IDs " + ", ".join(ids) + ")", tuple(sorted(members)), None))
            nodes += _packages_as_clusters(ids, by_pkg, clusters)
        else:
            nodes.append(("package", f"Package {ids[0]}" if ids else "Package", tuple(sorted(members)), None))
    return nodes


def _packages_as_clusters(ids: list[str], by_pkg: dict[str, list[int]],
                          clusters: dict[int, tuple[int, ...]]) -> list[_Node]:
    """The mislabelled "packages" of one real package, shown as the clusters they are (where no cluster is)."""
    nodes: list[_Node] = []
    for pid in ids:
        pgroup = tuple(sorted(by_pkg[pid]))
        if not any(pgroup == clusters.get(c) for c in pgroup):
            nodes.append(("cluster", f"Cluster (package ID {pid})", pgroup, None))
    return nodes


def _components(cpus: list[int], groups: Iterable[Iterable[int]]) -> list[list[int]]:
    """The CPUs in connected groups (a union-find over `groups`), each in the order of `cpus`."""
    parent = {c: c for c in cpus}

    def find(c: int) -> int:
        while parent[c] != c:
            parent[c] = parent[parent[c]]
            c = parent[c]
        return c

    for group in groups:
        g = [c for c in group if c in parent]
        for c in g[1:]:
            parent[find(c)] = find(g[0])
    comps: dict[int, list[int]] = defaultdict(list)
    for c in cpus:
        comps[find(c)].append(c)
    return list(comps.values())


def _nest(nodes: list[_Node], caches: tuple[CacheInstance, ...]) -> tuple[TopologyNode, ...]:
    """The nodes as a tree: each under the smallest node whose CPUs include its own."""

    def sort_key(n: _Node) -> tuple[int, int, int, int]:
        kind, _, cs, idx = n
        level = caches[idx].level if idx is not None else 0
        # Bigger sets first; at equal sets: package, cluster, higher cache levels, core, then L1.
        rank = (4 if level == 1 else 2) if kind == "cache" else _RANK[kind]
        return (-len(cs), rank, -level, min(cs) if cs else 0)

    def same_level(a: _Node, b: _Node) -> bool:
        if a[3] is not None and b[3] is not None:
            return caches[a[3]].level == caches[b[3]].level
        return a[0] == b[0] and a[3] is None and b[3] is None

    nodes = sorted(nodes, key=sort_key)
    sets = [set(n[2]) for n in nodes]
    children: dict[int, list[int]] = defaultdict(list)
    roots: list[int] = []
    for i in range(len(nodes)):
        # the parent is the last node before i (smallest so far) whose CPUs include i's
        # (two caches of one level never nest: an L1i beside its L1d)
        up = next((j for j in range(i - 1, -1, -1) if sets[i] <= sets[j] and not same_level(nodes[i], nodes[j])),
                  None)
        (children[up] if up is not None else roots).append(i)

    def first_cpu(j: int) -> int:
        return min(nodes[j][2]) if nodes[j][2] else 0

    def make(i: int) -> TopologyNode:
        kind, label, cs, idx = nodes[i]
        kids = sorted(children[i], key=lambda j: (first_cpu(j), sort_key(nodes[j])))
        return TopologyNode(kind=kind, label=label, cpus=cs, cache=idx, children=tuple(make(j) for j in kids))

    return tuple(make(i) for i in sorted(roots, key=first_cpu))


def _id_key(s: str) -> tuple[int, str]:
    try:
        return (int(s), s)
    except ValueError:
        return (1 << 62, s)


def _short_size(n: int | None) -> str:
    """Exact where it can be: 65536 -> '64 KiB', 3932160 -> '3.75 MiB'."""
    if n is None:
        return ""
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:.2f}".rstrip("0").rstrip(".") + f" {unit}"
    return f"{n} B"


# -------------------------------------------------------------------------------------------- classification


def _classify(kinds: tuple[CoreKind, ...], caches: tuple[CacheInstance, ...],
              threads: dict[int, tuple[int, ...]]) -> tuple[str, str]:
    """DynamIQ, big.LITTLE, homogeneous or unknown, with the evidence in words."""
    kind_of = {c: k.name for k in kinds for c in k.cpus}
    cores = _cores_under_l2(caches, kind_of, threads)
    private_l2 = bool(cores) and all(n == 1 for n in cores)
    if len(kinds) <= 1:
        return "homogeneous", _one_kind_reason(kinds[0].name if kinds else "unknown", caches, private_l2)
    return _kinds_arrangement(len(kinds), caches, kind_of, cores, private_l2)


def _kinds_arrangement(kinds: int, caches: tuple[CacheInstance, ...], kind_of: dict[int, str], cores: list[int],
                       private_l2: bool) -> tuple[str, str]:
    """How several core kinds are arranged: DynamIQ where a cache is shared across kinds, big.LITTLE where each
    cluster has its own shared L2."""
    mixed = _shared_across_kinds(caches, kind_of)
    if mixed is not None:
        return "DynamIQ", _dynamiq_reason(mixed, kind_of, bool(cores), private_l2)
    if cores and all(n > 1 for n in cores):
        return "big.LITTLE", (f"{len(cores)} clusters, each with its own shared L2; no cache shared across core "
                              "kinds")
    if not caches:
        return "unknown", f"{kinds} core kinds, but no cache information to tell how they share"
    return "unknown", f"{kinds} core kinds; no cache shared across kinds and L2 not shared per cluster"


def _shared_across_kinds(caches: tuple[CacheInstance, ...], kind_of: dict[int, str]) -> CacheInstance | None:
    """The highest-level cache that CPUs of more than one core kind share, if one is."""
    mixed = [c for c in caches if len({kind_of.get(x) for x in c.cpus} - {None}) > 1]
    return max(mixed, key=lambda c: c.level) if mixed else None


def _cores_under_l2(caches: tuple[CacheInstance, ...], kind_of: dict[int, str],
                    threads: dict[int, tuple[int, ...]]) -> list[int]:
    """How many cores (SMT siblings are one) share each unified L2 (none: no L2 is known)."""
    core_of = {c: threads.get(c, (c,)) for c in kind_of}
    l2 = [c for c in caches if c.level == 2 and c.type == "Unified"]
    return [len({core_of.get(c, (c,)) for c in inst.cpus}) for inst in l2]


def _dynamiq_reason(m: CacheInstance, kind_of: dict[int, str], l2: bool, private_l2: bool) -> str:
    """Why a cache shared across core kinds (the highest-level one, `m`) means DynamIQ."""
    l2_note = ("private L2 per core" if private_l2
               else "L2 private or shared by a pair of cores of one kind" if l2 else "no L2 information")
    return (f"{m.name} on CPUs {format_cpu_list(m.cpus)} is shared by "
            f"{len({kind_of[x] for x in m.cpus if x in kind_of})} core kinds; {l2_note}")


def _one_kind_reason(name: str, caches: tuple[CacheInstance, ...], private_l2: bool) -> str:
    if not caches:
        return f"one core kind ({name}); no cache information"
    if private_l2:
        llc = max(caches, key=lambda c: c.level)
        return f"one core kind ({name}); private L2 per core, L{llc.level} shared by {plural(len(llc.cpus), 'CPU')}"
    return f"one core kind ({name})"


# ---------------------------------------------------------------------------------------------------- checks


def _check(caches: tuple[CacheInstance, ...], online: list[int], flags: list[CpuFlag]) -> None:
    if not caches:
        flags.append(CpuFlag("no_cache_info", "warning",
                             "no cache information at all (no cache/index* directories): firmware described no "
                             "caches, or the kernel is 32-bit or too old to export them"))
        return
    missing = sorted({c.name for c in caches if c.size_bytes is None})
    if missing:
        flags.append(CpuFlag("no_cache_geometry", "warning",
                             f"{', '.join(missing)}: firmware gave levels and sharing only; sizes, ways, sets "
                             "and line sizes are unknown (not zero)"))
    _check_geometry(caches, flags)
    _check_vm_slice(caches, online, flags)
    _check_listing(caches, online, flags)
    _check_overlap(caches, flags)


def _check_geometry(caches: tuple[CacheInstance, ...], flags: list[CpuFlag]) -> None:
    """size != sets x ways x line, reported once per distinct geometry."""
    seen: dict[tuple[str, int, int, int, int], list[CacheInstance]] = defaultdict(list)
    for c in caches:
        if c.size_bytes is None or c.sets is None or c.ways is None or c.line_bytes is None:
            continue
        product = c.sets * c.ways * c.line_bytes
        if c.size_bytes not in (product * (c.physical_line_partition or 1), product):
            seen[(c.name, c.size_bytes, c.sets, c.ways, c.line_bytes)].append(c)
    for (name, size, sets, ways, line), insts in seen.items():
        flags.append(CpuFlag("geometry_mismatch", "warning",
                             f"{name} ({plural(len(insts), 'instance')}): size "
                             f"{_short_size(size)} but {plural(sets, 'set')} × {plural(ways, 'way')} × {line} B = "
                             f"{_short_size(sets * ways * line)}{_implied_ways(size, sets, line)}", _cpus_of(insts)))


def _implied_ways(size: int, sets: int, line: int) -> str:
    """What the size would mean for the ways, where it divides evenly ("" where it does not)."""
    implied = size // (sets * line) if size % (sets * line) == 0 else 0
    return f"; size / (sets × line) would mean {plural(implied, 'way')}" if implied else ""


def _check_vm_slice(caches: tuple[CacheInstance, ...], online: list[int], flags: list[CpuFlag]) -> None:
    """The last level shared by no more CPUs than the level below: a VM showing only its own vCPUs."""
    top = max(c.level for c in caches)
    if top < 2:
        return
    llc = [c for c in caches if c.level == top]
    below = {c.cpus for c in caches if c.level == top - 1}
    if not all(c.cpus in below for c in llc):
        return
    sample = llc[0]
    flags.append(CpuFlag("vm_slice", "warning",
                         f"L{top} ({_short_size(sample.size_bytes) or 'size unknown'}) lists CPUs "
                         f"{format_cpu_list(sample.cpus)}, no more than L{top - 1}: a last-level cache is "
                         f"normally shared by a cluster or socket, so this is likely a VM slice listing "
                         f"only this guest's vCPUs ({len(set(online))} online); its per-CPU share is unknown",
                         _cpus_of(llc)))


def _check_listing(caches: tuple[CacheInstance, ...], online: list[int], flags: list[CpuFlag]) -> None:
    """A shared cache listing fewer CPUs than are online while some online CPU is in no instance of that level."""
    for level in sorted({c.level for c in caches}):
        covered = {x for c in caches if c.level == level for x in c.cpus}
        lacking = sorted(set(online) - covered)
        if covered and lacking:
            flags.append(CpuFlag("partial_listing", "warning",
                                 f"L{level} instances list CPUs {format_cpu_list(covered)} but CPUs "
                                 f"{format_cpu_list(lacking)} are online too and appear in none",
                                 tuple(lacking)))


def _check_overlap(caches: tuple[CacheInstance, ...], flags: list[CpuFlag]) -> None:
    """Instances of one cache that partly overlap: sharing data contradicts itself."""
    by_name: dict[str, list[CacheInstance]] = defaultdict(list)
    for c in caches:
        by_name[c.name].append(c)
    for name, insts in by_name.items():
        for a_i, a in enumerate(insts):
            for b in insts[a_i + 1:]:
                if set(a.cpus) & set(b.cpus):
                    flags.append(CpuFlag("sharing_inconsistent", "warning",
                                         f"{name}: CPUs {format_cpu_list(a.cpus)} and {format_cpu_list(b.cpus)} "
                                         "overlap; the CPUs disagree about who shares it",
                                         tuple(sorted(set(a.cpus) | set(b.cpus)))))


# ------------------------------------------------------------------------------------------------- registers


def _registers(root: str | os.PathLike[str], arch: str | None, kinds: tuple[CoreKind, ...],
               caches: tuple[CacheInstance, ...], midrs: dict[str, str]) -> Registers:
    live = os.path.realpath(root) == "/"
    not_live = Unavailable("read only on the live machine, not from a captured tree")
    if arch not in ("aarch64", "arm", "arm64"):
        why = f"CTR_EL0, CLIDR_EL1, CCSIDR_EL1 and MIDR_EL1 are Arm registers; this is {arch or 'not Arm'}"
        return Registers(Unavailable(why), Unavailable(why), Unavailable(why), Unavailable(why),
                         read_cpuid_caches() if live else not_live)
    midr: dict[str, str] | Unavailable = midrs or Unavailable(
        "no cpu*/regs/identification/midr_el1 in sysfs and no CPU implementer, part, variant and revision in "
        "/proc/cpuinfo")
    ctr = read_ctr_el0() if live else not_live
    if not caches:
        why = "no cache information in sysfs to rebuild it from"
        return Registers(ctr, Unavailable(why), Unavailable(why), midr, _NOT_X86)
    clidrs, ccsidrs = _rebuilt(kinds, caches)
    return Registers(ctr, clidrs, ccsidrs, midr, _NOT_X86)


def _rebuilt(kinds: tuple[CoreKind, ...], caches: tuple[CacheInstance, ...]) -> tuple[
        tuple[ClidrEl1, ...], tuple[CcsidrEl1, ...]]:
    """CLIDR_EL1 and CCSIDR_EL1 rebuilt from sysfs for the first CPU of each core kind (of all CPUs, where no kind
    is known)."""
    clidrs: list[ClidrEl1] = []
    ccsidrs: list[CcsidrEl1] = []
    groups = [k.cpus for k in kinds] or [_cpus_of(caches)]
    for cpus in groups:
        mine = [c for c in caches if cpus[0] in c.cpus]
        if mine:
            _add_clidr(clidrs, _clidr_value(mine), cpus)
            ccsidrs.extend(_ccsidr(c) for c in mine if c.level <= 7)
    return tuple(clidrs), tuple(ccsidrs)


def _add_clidr(clidrs: list[ClidrEl1], value: int, cpus: tuple[int, ...]) -> None:
    """One entry per distinct value, for every CPU that has it."""
    same = next((i for i, x in enumerate(clidrs) if x.value == value), None)
    if same is not None:
        clidrs[same] = replace(clidrs[same], cpus=tuple(sorted(clidrs[same].cpus + tuple(cpus))))
        return
    d = cpuregs.decode_clidr(value)
    clidrs.append(ClidrEl1(cpus=tuple(cpus), value=value, hex=f"0x{value:x}", ctypes=d.ctypes, loc=d.loc,
                           louu=d.louu, louis=d.louis,
                           note="Ctype from sysfs; LoC assumes every listed level is before the point "
                                "of coherence, LoUU/LoUIS the first unified level"))


def _clidr_value(mine: list[CacheInstance]) -> int:
    """CLIDR_EL1 rebuilt from the caches one CPU sees."""
    levels: dict[int, set[str]] = defaultdict(set)
    for c in mine:
        levels[c.level].add(c.type)
    codes = []
    for lvl in range(1, max(levels) + 1):
        t = levels.get(lvl, set())
        codes.append(4 if "Unified" in t else 3 if {"Data", "Instruction"} <= t else 2 if "Data" in t
                     else 1 if "Instruction" in t else 0)
    loc = len(codes)
    # LoUU/LoUIS: the first level where instruction and data meet; every level before it is split.
    first_unified = next((i + 1 for i, c in enumerate(codes) if c == 4), loc + 1)
    lou = first_unified - 1
    return cpuregs.encode_clidr(tuple(codes[:7]), min(loc, 7), min(lou, 7), min(lou, 7))


def _ccsidr(c: CacheInstance) -> CcsidrEl1:
    """CCSIDR_EL1 of one cache, in both layouts (without and with FEAT_CCIDX); None where its geometry is unknown."""
    ind = 1 if c.type == "Instruction" else 0
    v32 = vcc = None
    if c.line_bytes is not None and c.ways is not None and c.sets is not None:
        v32 = cpuregs.encode_ccsidr(c.line_bytes, c.ways, c.sets, ccidx=False)
        vcc = cpuregs.encode_ccsidr(c.line_bytes, c.ways, c.sets, ccidx=True)
    return CcsidrEl1(cache=c.name, cpus=c.cpus, csselr=((c.level - 1) << 1) | ind, value_32bit=v32, value_ccidx=vcc)


_NOT_X86 = Unavailable("CPUID is an x86 instruction")

# x86-64 System V: cpuid(leaf=edi, subleaf=esi, out=rdx) storing eax, ebx, ecx, edx at out[0..3]. Checked with
# llvm-mc: push rbx; mov eax, edi; mov ecx, esi; mov r8, rdx; cpuid; mov [r8], eax; mov [r8+4], ebx;
# mov [r8+8], ecx; mov [r8+12], edx; pop rbx; ret
_CPUID = bytes.fromhex("53" "89f8" "89f1" "4989d0" "0fa2" "418900" "41895804" "41894808" "4189500c" "5b" "c3")


def read_cpuid_caches() -> tuple[CpuidCache, ...] | Unavailable:
    """Run CPUID leaf 4 (Intel) or 0x8000001D (AMD) on this CPU: the caches as the processor describes them."""
    import ctypes

    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64"):
        return Unavailable(f"CPUID is an x86 instruction; this machine is {machine or 'unknown'}")
    argtypes = [ctypes.c_uint32, ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint32)]
    out = (ctypes.c_uint32 * 4)()
    try:
        with _Stub(_CPUID, restype=None, argtypes=argtypes) as fn:
            def cpuid(leaf: int, sub: int = 0) -> tuple[int, int, int, int]:
                fn(leaf, sub, out)
                return out[0], out[1], out[2], out[3]

            leaf = _cache_leaf(cpuid)
            if isinstance(leaf, str):
                return Unavailable(f"{leaf} CPU has neither CPUID leaf 4 nor 0x8000001D")
            found = []
            for sub in range(16):
                f = cpuregs.decode_cpuid_cache(*cpuid(leaf, sub))
                if f is None:
                    break
                found.append(CpuidCache(
                    leaf=f"0x{leaf:x}", name=_cache_name(f.level, f.type), level=f.level, type=f.type,
                    size_bytes=f.size_bytes, line_bytes=f.line_bytes, ways=f.ways, sets=f.sets,
                    partitions=f.partitions, threads_sharing=f.threads_sharing))
    except OSError as e:
        return Unavailable(f"cannot map an executable page for CPUID: {e.strerror or e}")
    return tuple(found)


def _cache_leaf(cpuid: Callable[..., tuple[int, int, int, int]]) -> int | str:
    """The CPUID leaf that lists this CPU's caches: 0x8000001D on AMD (and Hygon) with TOPOEXT, else 4; the
    vendor's name where it has neither."""
    max_leaf, b, c, d = cpuid(0)
    vendor = b"".join(x.to_bytes(4, "little") for x in (b, d, c)).decode("ascii", "replace")
    max_ext = cpuid(0x80000000)[0]
    topoext = max_ext >= 0x80000001 and bool(cpuid(0x80000001)[2] >> 22 & 1)
    if vendor in ("AuthenticAMD", "HygonGenuine") and max_ext >= 0x8000001D and topoext:
        return 0x8000001D
    return 4 if max_leaf >= 4 else vendor


def _check_cpuid(regs: Registers, caches: tuple[CacheInstance, ...], kinds: tuple[CoreKind, ...],
                 flags: list[CpuFlag]) -> None:
    """CPUID and sysfs should describe the same caches; the kernel builds sysfs from CPUID on x86."""
    if isinstance(regs.cpuid_caches, Unavailable) or len(kinds) > 1 or not caches:
        return
    cpus = _cpus_of(caches)
    if not cpus:  # no cache names a CPU (a damaged shared_cpu_map): nothing to compare
        return
    mine = {c.name: c for c in caches if cpus[0] in c.cpus}
    for q in regs.cpuid_caches:
        s = mine.get(q.name)
        if s is None:
            continue
        diffs = _differences(s, q)
        if diffs:
            flags.append(CpuFlag("cpuid_disagrees", "warning",
                                 f"{q.name}: sysfs and CPUID leaf {q.leaf} differ ({', '.join(diffs)}): a "
                                 "hypervisor may present different caches than the CPU has", s.cpus))


def _differences(s: CacheInstance, q: CpuidCache) -> list[str]:
    """What sysfs says of a cache (where it says it) that CPUID says otherwise."""
    return [f"{label} {sv} vs {qv}" for label, sv, qv in (
        ("size", s.size_bytes, q.size_bytes), ("ways", s.ways, q.ways), ("sets", s.sets, q.sets),
        ("line", s.line_bytes, q.line_bytes)) if sv is not None and sv != qv]


# Instruction words (little-endian A64): `mrs x0, ctr_el0` = 0xd53b0020, `mov x0, xzr` = 0xaa1f03e0,
# `ret` = 0xd65f03c0. MRS encoding: 0xd5300000 | o0<<19 | op1<<16 | CRn<<12 | CRm<<8 | op2<<5 | Rt with
# CTR_EL0 = (op0 3, op1 3, CRn 0, CRm 0, op2 1).
_MRS_CTR = b"".join(w.to_bytes(4, "little") for w in (0xD53B0020, 0xD65F03C0))
_ZERO = b"".join(w.to_bytes(4, "little") for w in (0xAA1F03E0, 0xD65F03C0))


def read_ctr_el0() -> CtrEl0 | Unavailable:
    """Execute `mrs x0, ctr_el0` in this process (EL0 may read it) and decode it; Unavailable off aarch64."""
    machine = platform.machine().lower()
    if machine not in ("aarch64", "arm64"):
        return Unavailable(f"CTR_EL0 is read by an aarch64 instruction; this machine is {machine or 'unknown'}")
    try:
        with _Stub(_MRS_CTR) as ctr_fn, _Stub(_ZERO) as zero_fn:
            value = int(ctr_fn())
            emulated, note = _looks_emulated(ctr_fn, zero_fn)
    except OSError as e:
        return Unavailable(f"cannot map an executable page for the read: {e.strerror or e}")
    c = cpuregs.decode_ctr(value)
    return CtrEl0(value=value, hex=f"0x{value:x}", iminline_bytes=c.iminline_bytes,
                  dminline_bytes=c.dminline_bytes, l1ip=c.l1ip, erg_bytes=c.erg_bytes, cwg_bytes=c.cwg_bytes,
                  idc=c.idc, dic=c.dic, looks_emulated=emulated, note=note)


def _looks_emulated(ctr_fn: Callable[[], int], zero_fn: Callable[[], int], n: int = 2000) -> tuple[bool | None, str]:
    """A trapped read costs a kernel entry (~1 µs); a direct one costs what a call that returns 0 costs."""
    import statistics
    import time

    def per_call(fn: Callable[[], int]) -> float:
        samples = []
        for _ in range(5):
            t0 = time.perf_counter_ns()
            for _ in range(n):
                fn()
            samples.append((time.perf_counter_ns() - t0) / n)
        return statistics.median(samples)

    base, ctr = per_call(zero_fn), per_call(ctr_fn)
    extra = ctr - base
    if extra > 300:
        return True, (f"each read costs {extra:.0f} ns more than an empty call: the kernel traps and emulates it "
                      "(erratum workaround or mismatched cores); the value is the system-wide safe one")
    if extra < 100:
        return False, f"read directly ({extra:.0f} ns over an empty call)"
    return None, f"cannot tell whether the kernel emulates it ({extra:.0f} ns over an empty call)"


class _Stub:
    """Machine code in an anonymous page, mapped RW, written, then made RX, called through ctypes.

    mprotect to PROT_EXEC makes the arm64 kernel sync the I-cache with what was written (set_pte_at ->
    __sync_icache_dcache), so no explicit cache maintenance is needed.
    """

    def __init__(self, code: bytes, restype: Any = None, argtypes: list[Any] | None = None) -> None:
        import ctypes

        self.code = code
        self.restype = ctypes.c_uint64 if restype is None and argtypes is None else restype
        self.argtypes = argtypes or []
        self.addr = 0

    def __enter__(self) -> Callable[..., int]:
        import ctypes
        import mmap

        from dltop.kernel import libc as c_library

        libc = c_library()
        self.libc, self.size = libc, mmap.PAGESIZE
        addr = libc.mmap(None, self.size, mmap.PROT_READ | mmap.PROT_WRITE,
                         mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        self.addr = addr
        ctypes.memmove(addr, self.code, len(self.code))
        if libc.mprotect(addr, self.size, mmap.PROT_READ | mmap.PROT_EXEC) != 0:
            err = ctypes.get_errno()
            self.__exit__()
            raise OSError(err, os.strerror(err))
        fn: Callable[..., int] = ctypes.CFUNCTYPE(self.restype, *self.argtypes)(addr)
        return fn

    def __exit__(self, *exc: object) -> None:
        if self.addr:
            self.libc.munmap(self.addr, self.size)
            self.addr = 0


# ------------------------------------------------------------------------------------------------------ PMUs

_PMU_KINDS = (
    ("arm_cmn", "Arm CMN mesh interconnect"),
    ("arm_ccn", "Arm CCN ring interconnect"),
    ("arm_ni", "Arm NI network-on-chip"),
    ("arm_dsu", "Arm DSU (cluster L3 and snoop filter)"),
    ("cci_", "Arm CCI cache-coherent interconnect"),
    ("arm_cspmu", "Arm CoreSight uncore PMU"),
    ("nvidia_scf", "NVIDIA Grace SCF (L3 and fabric)"),
    ("nvidia_", "NVIDIA uncore"),
    ("hisi_sccl", "HiSilicon uncore (L3C / HHA / DDRC)"),
    ("hisi_", "HiSilicon uncore"),
    ("ampere_", "Ampere uncore"),
    ("amd_l3", "AMD L3"),
    ("amd_df", "AMD data fabric"),
    ("uncore_", "Intel uncore"),
)


def read_pmus(root: str | os.PathLike[str]) -> tuple[Pmu, ...]:
    """Interconnect and uncore PMUs under sys/bus/event_source/devices (core PMUs are left out)."""
    try:
        names = sorted(os.listdir(Path(root) / PMU_DIR))
    except OSError:
        return ()
    out = []
    for name in names:
        low = name.lower()
        kind = next((k for prefix, k in _PMU_KINDS if low.startswith(prefix)), None)
        if kind:
            out.append(Pmu(name=name, kind=kind))
    return tuple(out)


# ------------------------------------------------------------------------------------------------- the source


def source(settings: Settings) -> Source:
    """The Sampler's view: read the topology under settings.root once a minute (it hardly changes)."""
    root = settings.root
    return Source(name="cpu", interval_s=60.0, read=lambda: read_cpu(root))
