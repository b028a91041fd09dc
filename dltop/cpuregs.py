"""Arm cache-identification registers: pure decoders and encoders (CTR_EL0, CLIDR_EL1, CCSIDR_EL1, MIDR_EL1).

Field layouts follow the Arm Architecture Reference Manual for A-profile (DDI 0487). Nothing here reads the
machine; `dltop.sources.cpu` does that and hands values in.
"""

from __future__ import annotations

from dataclasses import dataclass

from dltop.errors import DltopError

# CLIDR_EL1.Ctype<n> values.
CTYPE_NAMES = {0: "none", 1: "Instruction", 2: "Data", 3: "Data+Instruction", 4: "Unified"}  # 3: separate I and D

# CTR_EL0.L1Ip: the L1 instruction-cache indexing policy.
L1IP_NAMES = {0: "VPIPT", 1: "AIVIVT", 2: "VIPT", 3: "PIPT"}


def bits(value: int, hi: int, lo: int) -> int:
    """value[hi:lo], inclusive, as in the Arm ARM."""
    return (value >> lo) & ((1 << (hi - lo + 1)) - 1)


# ---------------------------------------------------------------------------------------------------- CTR_EL0


@dataclass(frozen=True)
class CtrFields:
    """CTR_EL0 decoded. Line sizes are in bytes; ERG and CWG are None where the register says 0 (not given)."""

    raw: int
    iminline_bytes: int  # smallest I-cache line in the system
    dminline_bytes: int  # smallest D-cache line: the stride for DC CVAU/CIVAC loops
    l1ip: str
    erg_bytes: int | None  # exclusives reservation granule
    cwg_bytes: int | None  # cache writeback granule: the line size to pad against false sharing
    idc: bool  # D-cache clean to PoU not needed for I/D coherence
    dic: bool  # I-cache invalidate to PoU not needed for I/D coherence
    dminline_is_min: bool  # always True: the field is the minimum over every core, not cpu0's


def decode_ctr(value: int) -> CtrFields:
    """Decode a CTR_EL0 value (IminLine, DminLine, L1Ip, ERG, CWG, IDC, DIC)."""
    _check_u64(value, "CTR_EL0")
    erg = bits(value, 23, 20)
    cwg = bits(value, 27, 24)
    return CtrFields(
        raw=value,
        iminline_bytes=4 << bits(value, 3, 0),
        dminline_bytes=4 << bits(value, 19, 16),
        l1ip=L1IP_NAMES[bits(value, 15, 14)],
        erg_bytes=(4 << erg) if erg else None,
        cwg_bytes=(4 << cwg) if cwg else None,
        idc=bool(bits(value, 28, 28)),
        dic=bool(bits(value, 29, 29)),
        dminline_is_min=True,
    )


# -------------------------------------------------------------------------------------------------- CLIDR_EL1


@dataclass(frozen=True)
class ClidrFields:
    """CLIDR_EL1 decoded: the cache type of each level 1..7 and the coherence/unification levels."""

    raw: int
    ctypes: tuple[str, ...]  # level 1 first, up to the last level that has a cache
    louis: int
    loc: int
    louu: int
    icb: int  # inner cache boundary (FEAT_MTE2 era); 0 = not disclosed


def decode_clidr(value: int) -> ClidrFields:
    """Decode a CLIDR_EL1 value."""
    _check_u64(value, "CLIDR_EL1")
    ctypes = [CTYPE_NAMES.get(bits(value, 3 * i + 2, 3 * i), f"reserved({bits(value, 3 * i + 2, 3 * i)})")
              for i in range(7)]
    while ctypes and ctypes[-1] == "none":
        ctypes.pop()
    return ClidrFields(
        raw=value,
        ctypes=tuple(ctypes),
        louis=bits(value, 23, 21),
        loc=bits(value, 26, 24),
        louu=bits(value, 29, 27),
        icb=bits(value, 32, 30),
    )


def encode_clidr(ctypes: tuple[int, ...], loc: int, louu: int, louis: int) -> int:
    """Build a CLIDR_EL1 value from Ctype codes (level 1 first) and LoC, LoUU, LoUIS."""
    if len(ctypes) > 7:
        raise ValueError("CLIDR_EL1 describes at most 7 levels")
    value = 0
    for i, c in enumerate(ctypes):
        if not 0 <= c <= 7:
            raise ValueError(f"Ctype{i + 1} {c} does not fit in 3 bits")
        value |= c << (3 * i)
    for name, v in (("LoC", loc), ("LoUU", louu), ("LoUIS", louis)):
        if not 0 <= v <= 7:
            raise ValueError(f"{name} {v} does not fit in 3 bits")
    return value | (louis << 21) | (loc << 24) | (louu << 27)


# ------------------------------------------------------------------------------------------------- CCSIDR_EL1


@dataclass(frozen=True)
class CcsidrFields:
    """CCSIDR_EL1 decoded in one of its two layouts."""

    raw: int
    layout: str  # "CCIDX" (FEAT_CCIDX, 64-bit) or "32-bit" (without FEAT_CCIDX)
    line_bytes: int
    ways: int
    sets: int

    @property
    def size_bytes(self) -> int:
        """line × ways × sets."""
        return self.line_bytes * self.ways * self.sets


# (associativity hi, lo), (numsets hi, lo) for each layout
_CCSIDR_LAYOUTS = {
    "32-bit": ((12, 3), (27, 13)),
    "CCIDX": ((23, 3), (55, 32)),
}


def decode_ccsidr(value: int, ccidx: bool) -> CcsidrFields:
    """Decode a CCSIDR_EL1 value in the FEAT_CCIDX layout (ccidx=True) or the original 32-bit one."""
    _check_u64(value, "CCSIDR_EL1")
    layout = "CCIDX" if ccidx else "32-bit"
    (ahi, alo), (shi, slo) = _CCSIDR_LAYOUTS[layout]
    return CcsidrFields(
        raw=value,
        layout=layout,
        line_bytes=16 << bits(value, 2, 0),
        ways=bits(value, ahi, alo) + 1,
        sets=bits(value, shi, slo) + 1,
    )


# What real CPU caches span, generously: a decoding outside these bounds is the value read in the wrong layout.
PLAUSIBLE_WAYS = 64  # the most-associative CPU caches are 20-32 way; fully associative ones are not in CCSIDR
PLAUSIBLE_LINE_BYTES = 256
PLAUSIBLE_SIZE_BYTES = (1 << 10, 512 << 20)  # a 1 KiB L1 ... the 96 MiB stacked L3s and beyond


def ccsidr_implausible(f: CcsidrFields) -> tuple[str, ...]:
    """Why this decoding cannot describe a real cache (nothing when it can), e.g. a 32-bit value read as CCIDX:
    its NumSets[55:32] is 0, so it reads as 1 set of 130052 ways."""
    why = []
    if f.ways > PLAUSIBLE_WAYS:
        why.append(f"{f.ways} ways (no CPU cache has more than {PLAUSIBLE_WAYS})")
    if f.sets == 1:
        why.append("1 set (CPU caches are not fully associative)")
    if f.line_bytes > PLAUSIBLE_LINE_BYTES:
        why.append(f"{f.line_bytes} B lines (no CPU cache has lines over {PLAUSIBLE_LINE_BYTES} B)")
    lo, hi = PLAUSIBLE_SIZE_BYTES
    if not lo <= f.size_bytes <= hi:
        why.append(f"{f.size_bytes} B in all (a CPU cache holds {lo >> 10} KiB to {hi >> 20} MiB)")
    return tuple(why)


def encode_ccsidr(line_bytes: int, ways: int, sets: int, ccidx: bool) -> int | None:
    """The CCSIDR_EL1 value for this geometry, or None if it does not fit the layout (or the line is not 2^n ≥ 16)."""
    if line_bytes < 16 or line_bytes & (line_bytes - 1) or ways < 1 or sets < 1:
        return None
    line_field = line_bytes.bit_length() - 5  # log2(line) - 4
    if line_field > 7:
        return None
    (ahi, alo), (shi, slo) = _CCSIDR_LAYOUTS["CCIDX" if ccidx else "32-bit"]
    if ways - 1 >= 1 << (ahi - alo + 1) or sets - 1 >= 1 << (shi - slo + 1):
        return None
    return line_field | ((ways - 1) << alo) | ((sets - 1) << slo)


# ---------------------------------------------------------------------------------------------------- MIDR_EL1


@dataclass(frozen=True)
class MidrFields:
    """MIDR_EL1 decoded."""

    raw: int
    implementer: int
    variant: int
    architecture: int
    part: int
    revision: int

    @property
    def rnpm(self) -> str:
        """Arm's revision notation: variant N, revision M -> 'rNpM'."""
        return f"r{self.variant}p{self.revision}"


def decode_midr(value: int) -> MidrFields:
    """Decode a MIDR_EL1 value."""
    _check_u64(value, "MIDR_EL1")
    return MidrFields(
        raw=value,
        implementer=bits(value, 31, 24),
        variant=bits(value, 23, 20),
        architecture=bits(value, 19, 16),
        part=bits(value, 15, 4),
        revision=bits(value, 3, 0),
    )


def encode_midr(implementer: int, variant: int, part: int, revision: int, architecture: int = 0xF) -> int:
    """Build a MIDR_EL1 value (architecture 0xF = 'see the ID registers', as every Armv8 core says)."""
    return (implementer << 24) | (variant << 20) | (architecture << 16) | (part << 4) | revision


# ------------------------------------------------------------------------------------ x86 CPUID cache leaves

CPUID_CACHE_TYPES = {1: "Data", 2: "Instruction", 3: "Unified"}


@dataclass(frozen=True)
class CpuidCacheFields:
    """One subleaf of CPUID leaf 4 (Intel) or 0x8000001D (AMD): the two share one layout."""

    level: int
    type: str
    line_bytes: int
    partitions: int
    ways: int
    sets: int
    threads_sharing: int  # the most logical CPUs that may share it, as the CPU declares (not what the OS sees)
    fully_associative: bool
    inclusive: bool

    @property
    def size_bytes(self) -> int:
        """ways × partitions × line × sets."""
        return self.ways * self.partitions * self.line_bytes * self.sets


def decode_cpuid_cache(eax: int, ebx: int, ecx: int, edx: int) -> CpuidCacheFields | None:
    """Decode one deterministic-cache-parameters subleaf; None for type 0 (no more caches)."""
    ctype = bits(eax, 4, 0)
    if ctype == 0:
        return None
    return CpuidCacheFields(
        level=bits(eax, 7, 5),
        type=CPUID_CACHE_TYPES.get(ctype, f"reserved({ctype})"),
        line_bytes=bits(ebx, 11, 0) + 1,
        partitions=bits(ebx, 21, 12) + 1,
        ways=bits(ebx, 31, 22) + 1,
        sets=ecx + 1,
        threads_sharing=bits(eax, 25, 14) + 1,
        fully_associative=bool(bits(eax, 9, 9)),
        inclusive=bool(bits(edx, 1, 1)),
    )


# ------------------------------------------------------------------------------------------------ core names

# MIDR_EL1.Implementer codes (Arm ARM, "MIDR_EL1"), and the part numbers each vendor has published or the Linux
# kernel (arch/arm64/include/asm/cputype.h) knows. Names are written the way lscpu and GCC's -mcpu spell them.
IMPLEMENTERS = {
    0x41: "Arm", 0x42: "Broadcom", 0x43: "Cavium", 0x44: "DEC", 0x46: "Fujitsu", 0x48: "HiSilicon",
    0x49: "Infineon", 0x4D: "Motorola/Freescale", 0x4E: "NVIDIA", 0x50: "APM", 0x51: "Qualcomm",
    0x53: "Samsung", 0x56: "Marvell", 0x61: "Apple", 0x66: "Faraday", 0x69: "Intel", 0x6D: "Microsoft",
    0x70: "Phytium", 0xC0: "Ampere",
}

PARTS: dict[int, dict[int, str]] = {
    0x41: {
        0xC05: "Cortex-A5", 0xC07: "Cortex-A7", 0xC08: "Cortex-A8", 0xC09: "Cortex-A9", 0xC0D: "Cortex-A17",
        0xC0E: "Cortex-A17", 0xC0F: "Cortex-A15", 0xD01: "Cortex-A32", 0xD02: "Cortex-A34",
        0xD03: "Cortex-A53", 0xD04: "Cortex-A35", 0xD05: "Cortex-A55", 0xD06: "Cortex-A65",
        0xD07: "Cortex-A57", 0xD08: "Cortex-A72", 0xD09: "Cortex-A73", 0xD0A: "Cortex-A75",
        0xD0B: "Cortex-A76", 0xD0C: "Neoverse-N1", 0xD0D: "Cortex-A77", 0xD0E: "Cortex-A76AE",
        0xD40: "Neoverse-V1", 0xD41: "Cortex-A78", 0xD42: "Cortex-A78AE", 0xD43: "Cortex-A65AE",
        0xD44: "Cortex-X1", 0xD46: "Cortex-A510", 0xD47: "Cortex-A710", 0xD48: "Cortex-X2",
        0xD49: "Neoverse-N2", 0xD4A: "Neoverse-E1", 0xD4B: "Cortex-A78C", 0xD4C: "Cortex-X1C",
        0xD4D: "Cortex-A715", 0xD4E: "Cortex-X3", 0xD4F: "Neoverse-V2", 0xD80: "Cortex-A520",
        0xD81: "Cortex-A720", 0xD82: "Cortex-X4", 0xD83: "Neoverse-V3AE", 0xD84: "Neoverse-V3",
        0xD85: "Cortex-X925", 0xD87: "Cortex-A725", 0xD88: "Cortex-A520AE", 0xD89: "Cortex-A720AE",
        0xD8E: "Neoverse-N3",
    },
    0x42: {0x00F: "Brahma-B15", 0x100: "Brahma-B53", 0x516: "ThunderX2"},
    0x43: {0x0A0: "ThunderX", 0x0A1: "ThunderX-88XX", 0x0A2: "ThunderX-81XX", 0x0A3: "ThunderX-83XX",
           0x0AF: "ThunderX2-99xx", 0x0B8: "ThunderX3-T110"},
    0x46: {0x001: "A64FX", 0x003: "Monaka"},
    0x48: {0xD01: "Kunpeng-920", 0xD40: "Cortex-A76"},  # HiSilicon's A76 (Kirin 980) carries its own code
    0x4E: {0x000: "Denver", 0x003: "Denver-2", 0x004: "Carmel", 0x010: "Olympus"},
    0x50: {0x000: "X-Gene"},
    0x51: {0x001: "Oryon", 0x00F: "Scorpion", 0x02D: "Scorpion", 0x04D: "Krait", 0x06F: "Krait",
           0x201: "Kryo", 0x205: "Kryo", 0x211: "Kryo", 0x800: "Kryo-2XX-Gold", 0x801: "Kryo-2XX-Silver",
           0x802: "Kryo-3XX-Gold", 0x803: "Kryo-3XX-Silver", 0x804: "Kryo-4XX-Gold",
           0x805: "Kryo-4XX-Silver", 0xC00: "Falkor", 0xC01: "Saphira"},
    0x53: {0x001: "Exynos-M1", 0x002: "Exynos-M3", 0x003: "Exynos-M4", 0x004: "Exynos-M5"},
    0x61: {0x020: "Icestorm-A14", 0x021: "Firestorm-A14", 0x022: "Icestorm-M1", 0x023: "Firestorm-M1",
           0x024: "Icestorm-M1-Pro", 0x025: "Firestorm-M1-Pro", 0x028: "Icestorm-M1-Max",
           0x029: "Firestorm-M1-Max", 0x030: "Blizzard-A15", 0x031: "Avalanche-A15", 0x032: "Blizzard-M2",
           0x033: "Avalanche-M2"},
    0x6D: {0xD49: "Azure-Cobalt-100"},
    0x70: {0x660: "FTC660", 0x661: "FTC661", 0x662: "FTC662", 0x663: "FTC663"},
    0xC0: {0xAC3: "Ampere-1", 0xAC4: "Ampere-1a", 0xAC5: "Ampere-1b"},
}


def implementer_name(implementer: int) -> str:
    """'Arm', 'Apple', ... or 'implementer 0x..' for a code nobody has published."""
    return IMPLEMENTERS.get(implementer, f"implementer 0x{implementer:02x}")


def core_name(implementer: int, part: int) -> str:
    """'Cortex-A510' for (0x41, 0xd46); an unknown part is named by its codes, never guessed."""
    name = PARTS.get(implementer, {}).get(part)
    return name if name is not None else f"{implementer_name(implementer)} part 0x{part:03x}"


# ------------------------------------------------------------------------------------------- `--decode REG=0x`

REGISTERS = ("CTR_EL0", "CLIDR_EL1", "CCSIDR_EL1", "MIDR_EL1")


def parse_decode_arg(text: str) -> tuple[str, int]:
    """'CTR_EL0=0x8444c004' -> ('CTR_EL0', 0x8444c004); raises DltopError with a one-line reason.

    0x, 0b and 0o say the base; bare digits and letters are hex; bare digits alone are refused when they read
    differently in hex and decimal."""
    name, sep, raw = text.partition("=")
    name = name.strip().upper()
    if not sep:
        raise DltopError(f"want REG=VALUE (e.g. CTR_EL0=0x8444c004), got {text!r}")
    if name not in REGISTERS:
        raise DltopError(f"unknown register {name!r}; known: {', '.join(REGISTERS)}")
    raw = raw.strip().replace("_", "")
    if len(raw) > 66:  # 0b and 64 binary digits: anything longer is past 64 bits (and int() refuses 4300 digits)
        raise DltopError(f"{raw[:20]!r}... ({len(raw)} characters) does not fit in a 64-bit register")
    try:  # a bare value with hex letters is hex, as pasted from a dump
        value = int(raw, 0) if raw.lower().startswith(("0x", "0b", "0o")) else int(raw, 16)
    except ValueError:
        raise DltopError(f"{raw!r} is not a number (write hex as 0x...)") from None
    if raw.isascii() and raw.isdigit() and int(raw, 10) != value:
        # Bare digits read either way; kernel logs, sysfs and debuggers print registers in hex, but a script
        # may hand over a decimal: say both readings rather than pick one without a word.
        raise DltopError(f"{name}={raw} is ambiguous: write 0x{raw} if it is hex (as kernel logs and sysfs print "
                         f"registers), or 0x{int(raw, 10):x} if it is the decimal {int(raw, 10)}")
    if not 0 <= value < 1 << 64:
        raise DltopError(f"{raw!r} does not fit in a 64-bit register")
    return name, value


def decode_register(name: str, value: int) -> dict[str, object]:
    """Every field of a register as plain data, for `dltop cpu --decode` (text and JSON)."""
    out: dict[str, object] = {"register": name, "value": f"0x{value:x}"}
    if name == "CTR_EL0":
        c = decode_ctr(value)
        out.update(IminLine_bytes=c.iminline_bytes, DminLine_bytes=c.dminline_bytes, L1Ip=c.l1ip,
                   ERG_bytes=c.erg_bytes, CWG_bytes=c.cwg_bytes, IDC=c.idc, DIC=c.dic)
    elif name == "CLIDR_EL1":
        d = decode_clidr(value)
        out.update({f"Ctype{i + 1}": t for i, t in enumerate(d.ctypes)})
        out.update(LoUIS=d.louis, LoC=d.loc, LoUU=d.louu, ICB=d.icb)
    elif name == "CCSIDR_EL1":
        # The register does not say which layout it uses (ID_AA64MMFR2_EL1.CCIDX does): show both that fit.
        layouts = []
        for ccidx in (False, True):
            if not ccidx and value >> 32:
                continue
            f = decode_ccsidr(value, ccidx)
            layouts.append({"layout": f.layout, "line_bytes": f.line_bytes, "ways": f.ways, "sets": f.sets,
                            "size_bytes": f.size_bytes, "implausible": list(ccsidr_implausible(f))})
        out["layouts"] = layouts
    elif name == "MIDR_EL1":
        m = decode_midr(value)
        out.update(implementer=f"0x{m.implementer:02x}", implementer_name=implementer_name(m.implementer),
                   part=f"0x{m.part:03x}", name=core_name(m.implementer, m.part), revision=m.rnpm,
                   architecture=m.architecture)
    return out


def _check_u64(value: int, name: str) -> None:
    if not 0 <= value < 1 << 64:
        raise ValueError(f"{name} value {value:#x} is not a 64-bit unsigned number")
