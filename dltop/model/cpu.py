"""The CPU cache topology part of a Snapshot: every cache instance, who shares it, core kinds, registers, flags.

Values the system did not give are None (an attribute) or `Unavailable(reason)` (a whole piece), never 0.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from dltop.model.base import Unavailable


@dataclass(frozen=True)
class CacheInstance:
    """One physical cache: the CPUs listed in its `shared_cpu_list` and its geometry as sysfs gives it."""

    name: str  # "L1d", "L1i", "L2", "L3", ...
    level: int
    type: str  # "Data", "Instruction" or "Unified" (whatever sysfs says)
    size_bytes: int | None
    line_bytes: int | None  # coherency_line_size
    ways: int | None
    sets: int | None
    cpus: tuple[int, ...]
    id: str | None = None  # sysfs `id`, opaque (not an index)
    physical_line_partition: int | None = None
    allocation_policy: str | None = None
    write_policy: str | None = None


@dataclass(frozen=True)
class KindCache:
    """What one core kind sees at one cache level: the geometry if all its instances agree, and the sharing."""

    name: str
    size_bytes: int | None  # None when not given, or when the kind's instances disagree (then a flag says so)
    line_bytes: int | None
    ways: int | None
    sets: int | None
    instances: int
    cpus_per_instance: int | None  # None when instances are shared by different numbers of CPUs
    shared_with: tuple[str, ...] = ()  # other core kinds on the same instances (a DynamIQ L3)


@dataclass(frozen=True)
class CoreKind:
    """CPUs of one (implementer, part): e.g. Cortex-A510. On x86 the model name, or P/E cores on hybrids."""

    name: str
    vendor: str | None
    implementer: int | None
    part: int | None
    revision: str | None  # "r1p1"; several joined by "/" when CPUs of the kind differ
    cpus: tuple[int, ...]
    capacity: int | None = None  # cpu_capacity (1024 = the biggest core)
    max_freq_khz: int | None = None
    caches: tuple[KindCache, ...] = ()


@dataclass(frozen=True)
class TopologyNode:
    """A node of the package → cluster → L3 → L2 → core → L1 tree, nested by CPU-set inclusion."""

    kind: str  # "package", "cluster", "cache" or "core"
    label: str
    cpus: tuple[int, ...]
    cache: int | None = None  # index into CpuPart.caches for kind "cache"
    children: tuple[TopologyNode, ...] = ()


@dataclass(frozen=True)
class CpuFlag:
    """Something about the data the user should know, shown rather than silently fixed."""

    code: str  # "geometry_mismatch", "vm_slice", "no_cache_info", "no_cache_geometry", ...
    severity: str  # "warning" or "info"
    message: str
    cpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class Pmu:
    """An interconnect or uncore PMU under sys/bus/event_source/devices (arm_cmn, arm_dsu, CCI_400, ...)."""

    name: str
    kind: str


@dataclass(frozen=True)
class CtrEl0:
    """CTR_EL0 as read on this CPU (EL0 may read it; the kernel may trap and emulate the read)."""

    value: int
    hex: str
    iminline_bytes: int
    dminline_bytes: int
    l1ip: str
    erg_bytes: int | None
    cwg_bytes: int | None
    idc: bool
    dic: bool
    looks_emulated: bool | None  # None when the timing test could not tell
    note: str


@dataclass(frozen=True)
class ClidrEl1:
    """CLIDR_EL1 rebuilt from sysfs for the CPUs of one core kind (Ctype per level; LoC/LoU inferred)."""

    cpus: tuple[int, ...]
    value: int
    hex: str
    ctypes: tuple[str, ...]
    loc: int
    louu: int
    louis: int
    note: str


@dataclass(frozen=True)
class CcsidrEl1:
    """CCSIDR_EL1 rebuilt from one cache's geometry, in both layouts (None where it does not fit)."""

    cache: str  # "L1d", ...
    cpus: tuple[int, ...]
    csselr: int  # the CSSELR_EL1 value that selects it: (level-1)<<1 | InD
    value_32bit: int | None
    value_ccidx: int | None


@dataclass(frozen=True)
class CpuidCache:
    """One cache as x86 CPUID describes it (leaf 4 or 0x8000001D): a second opinion next to sysfs."""

    leaf: str  # "0x4" or "0x8000001d"
    name: str
    level: int
    type: str
    size_bytes: int
    line_bytes: int
    ways: int
    sets: int
    partitions: int
    threads_sharing: int


@dataclass(frozen=True)
class Registers:
    """Arm cache-identification registers: CTR_EL0 read for real, CLIDR/CCSIDR rebuilt, MIDR per CPU."""

    ctr_el0: CtrEl0 | Unavailable
    clidr_el1: tuple[ClidrEl1, ...] | Unavailable
    ccsidr_el1: tuple[CcsidrEl1, ...] | Unavailable
    midr_el1: dict[str, str] | Unavailable  # cpu number (as text) -> "0x411fd461"; Unavailable off Arm
    cpuid_caches: tuple[CpuidCache, ...] | Unavailable = Unavailable("not read")  # x86, live machine only


@dataclass(frozen=True)
class CpuPart:
    """The CPU cache hierarchy of one machine (or of a captured sysfs tree)."""

    arch: str | None  # "aarch64", "arm", "x86_64", ... as far as the data shows
    cpus: tuple[int, ...]  # every CPU directory found
    online: tuple[int, ...]
    caches: tuple[CacheInstance, ...]
    core_kinds: tuple[CoreKind, ...]
    arrangement: str  # "DynamIQ", "big.LITTLE", "homogeneous" or "unknown"
    arrangement_reason: str
    tree: tuple[TopologyNode, ...]
    registers: Registers
    pmus: tuple[Pmu, ...] = ()
    flags: tuple[CpuFlag, ...] = ()
    threads_per_core: int | None = None

    def notes(self) -> tuple[str, ...]:
        """What the hierarchy means for deep-learning work on this machine (dataloaders, CPU ops, pinning)."""
        out = [self._false_sharing_note(), *(self._l2_note(kind) for kind in self.core_kinds),
               self._llc_note()]
        if len(self.core_kinds) > 1:
            out.append("Mixed core kinds: pin latency-critical threads to the biggest cores; per-kind sizes above "
                       "differ, so one 'L2 size' for the chip is wrong.")
        return tuple(n for n in out if n)

    def _false_sharing_note(self) -> str | None:
        lines = {c.line_bytes for c in self.caches if c.line_bytes}
        ctr = self.registers.ctr_el0
        if ctr and not isinstance(ctr, Unavailable) and ctr.cwg_bytes:
            lines.add(ctr.cwg_bytes)
        if not lines:
            return None
        extra = f" (lines differ by level: {', '.join(str(n) for n in sorted(lines))} B)" if len(lines) > 1 else ""
        return f"False sharing: pad per-thread counters and queues to {max(lines)} B{extra}."

    def _l2_note(self, kind: CoreKind) -> str | None:
        l2 = next((c for c in kind.caches if c.name == "L2"), None)
        if l2 is None or l2.size_bytes is None:
            return None
        tpc = self.threads_per_core or 1
        cores = max(1, (l2.cpus_per_instance or tpc) // tpc)
        shared = f" ({cores} cores share one {_kib(l2.size_bytes)} L2)" if cores > 1 else ""
        smt = f", split between its {tpc} SMT threads" if tpc > 1 else ""
        return (f"{kind.name}: L2 {_kib(l2.size_bytes // cores)} per core{shared}{smt}: size CPU-side tiles "
                f"(tokenizer tables, augmentation buffers) to fit in it.")

    def _llc_note(self) -> str | None:
        llc = max((c.level for c in self.caches), default=None)
        if llc is None or llc < 2:
            return None
        groups = {c.cpus for c in self.caches if c.level == llc}
        if len(groups) < 2:
            return None
        return (f"{len(groups)} separate L{llc} caches: pin each dataloader worker group inside one "
                f"(taskset/numactl) so their working sets do not cross.")


def _kib(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n >> 10} KiB"


def format_cpu_list(cpus: Iterable[int]) -> str:
    """(0, 1, 2, 3, 8) -> '0-3,8': the kernel's own list syntax."""
    cs = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(cs):
        j = i
        while j + 1 < len(cs) and cs[j + 1] == cs[j] + 1:
            j += 1
        parts.append(str(cs[i]) if i == j else f"{cs[i]}-{cs[j]}")
        i = j + 1
    return ",".join(parts)
