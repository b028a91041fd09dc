"""Arm register decoders on known values (from Arm's Technical Reference Manuals) and encode/decode round trips."""

from __future__ import annotations

import platform
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dltop import cpuregs
from dltop.errors import DltopError
from dltop.model.base import Unavailable
from dltop.sources.cpu import read_cpu, read_ctr_el0
from dltop.text.cpu import decode_text
from tests.test_cpu_dumps import DUMPS, TARBALLS, dump_root, parts  # noqa: F401  (session fixtures)


def test_ctr_el0_cortex_a53() -> None:
    """Cortex-A53 TRM: CTR_EL0 = 0x84448004 (64-byte lines everywhere, VIPT L1 I-cache, no IDC/DIC)."""
    c = cpuregs.decode_ctr(0x84448004)
    assert (c.iminline_bytes, c.dminline_bytes, c.erg_bytes, c.cwg_bytes) == (64, 64, 64, 64)
    assert c.l1ip == "VIPT"
    assert (c.idc, c.dic) == (False, False)


def test_ctr_el0_idc_pipt() -> None:
    c = cpuregs.decode_ctr(0x9444C004)
    assert c.l1ip == "PIPT" and c.idc and not c.dic


def test_ctr_el0_zero_granules_are_none() -> None:
    c = cpuregs.decode_ctr(0x80000000)
    assert c.erg_bytes is None and c.cwg_bytes is None  # 0 means "not given", not 4 bytes


def test_clidr_el1_cortex_a53() -> None:
    """Cortex-A53 with L2: CLIDR_EL1 = 0x0a200023 (L1 separate I/D, L2 unified, LoUIS 1, LoC 2, LoUU 1)."""
    d = cpuregs.decode_clidr(0x0A200023)
    assert d.ctypes == ("Data+Instruction", "Unified")
    assert (d.louis, d.loc, d.louu) == (1, 2, 1)
    assert cpuregs.encode_clidr((3, 4), loc=2, louu=1, louis=1) == 0x0A200023


def test_ccsidr_el1_cortex_a53_l1d() -> None:
    """Cortex-A53 TRM: CCSIDR_EL1 for a 32 KB L1 D-cache reads 0x700fe01a (WT/WB/RA/WA bits in [31:28])."""
    f = cpuregs.decode_ccsidr(0x700FE01A, ccidx=False)
    assert (f.line_bytes, f.ways, f.sets, f.size_bytes) == (64, 4, 128, 32 * 1024)
    assert cpuregs.encode_ccsidr(64, 4, 128, ccidx=False) == 0x000FE01A
    assert cpuregs.encode_ccsidr(64, 4, 128, ccidx=True) == 0x0000007F_0000001A


def test_ccsidr_too_big_for_32bit_layout() -> None:
    # 2^16 sets do not fit NumSets[27:13] (15 bits) but fit the FEAT_CCIDX layout's 24 bits.
    assert cpuregs.encode_ccsidr(64, 16, 1 << 16, ccidx=False) is None
    v = cpuregs.encode_ccsidr(64, 16, 1 << 16, ccidx=True)
    assert v is not None and cpuregs.decode_ccsidr(v, ccidx=True).sets == 1 << 16
    assert cpuregs.encode_ccsidr(48, 4, 4, ccidx=True) is None  # line not a power of two


@given(st.sampled_from([16, 32, 64, 128, 256]), st.integers(1, 1024), st.integers(1, 1 << 15), st.booleans())
def test_ccsidr_round_trip(line: int, ways: int, sets: int, ccidx: bool) -> None:
    v = cpuregs.encode_ccsidr(line, ways, sets, ccidx)
    assert v is not None
    f = cpuregs.decode_ccsidr(v, ccidx)
    assert (f.line_bytes, f.ways, f.sets) == (line, ways, sets)


@given(st.lists(st.integers(0, 4), max_size=7), st.integers(0, 7), st.integers(0, 7), st.integers(0, 7))
def test_clidr_round_trip(ctypes: list[int], loc: int, louu: int, louis: int) -> None:
    d = cpuregs.decode_clidr(cpuregs.encode_clidr(tuple(ctypes), loc, louu, louis))
    while ctypes and ctypes[-1] == 0:
        ctypes.pop()
    assert d.ctypes == tuple(cpuregs.CTYPE_NAMES[c] for c in ctypes)
    assert (d.loc, d.louu, d.louis) == (loc, louu, louis)


@given(st.integers(0, 0xFF), st.integers(0, 0xF), st.integers(0, 0xFFF), st.integers(0, 0xF))
def test_midr_round_trip(impl: int, variant: int, part: int, rev: int) -> None:
    m = cpuregs.decode_midr(cpuregs.encode_midr(impl, variant, part, rev))
    assert (m.implementer, m.variant, m.part, m.revision) == (impl, variant, part, rev)
    assert m.rnpm == f"r{variant}p{rev}"


def test_midr_names() -> None:
    assert cpuregs.core_name(0x41, 0xD03) == "Cortex-A53"
    assert cpuregs.core_name(0x41, 0xFFF) == "Arm part 0xfff"  # unknown parts are not guessed
    assert cpuregs.core_name(0x99, 0x001) == "implementer 0x99 part 0x001"


@pytest.mark.parametrize("arg,name,value", [
    ("CTR_EL0=0x84448004", "CTR_EL0", 0x84448004),
    ("ctr_el0 = 0x8444_8004", "CTR_EL0", 0x84448004),
    ("MIDR_EL1=410fd034", "MIDR_EL1", 0x410FD034),  # bare with hex letters: hex
    ("CCSIDR_EL1=700fe01a", "CCSIDR_EL1", 0x700FE01A),
    ("CTR_EL0=7", "CTR_EL0", 7),  # one digit reads the same in both bases
    ("CTR_EL0=0b101", "CTR_EL0", 5),  # binary is binary, not the hex 0xb101
    ("CTR_EL0=0o17", "CTR_EL0", 15),
])
def test_parse_decode_arg(arg: str, name: str, value: int) -> None:
    assert cpuregs.parse_decode_arg(arg) == (name, value)


@pytest.mark.parametrize("arg", ["CTR_EL0", "FOO=1", "CTR_EL0=0xzz", "CTR_EL0=0x1" + "0" * 16, "CTR_EL0=-1",
                                 "CTR_EL0=0b102", "CTR_EL0=84448004", "MIDR_EL1=1091555377", "CTR_EL0=10"])
def test_parse_decode_arg_errors(arg: str) -> None:
    with pytest.raises(DltopError):
        cpuregs.parse_decode_arg(arg)


def test_bare_digits_are_refused_with_both_readings() -> None:
    """CTR_EL0=84448004 was decoded as the decimal 84448004 (0x5089304) without a word, while =8444c004 was hex."""
    with pytest.raises(DltopError) as e:
        cpuregs.parse_decode_arg("CTR_EL0=84448004")
    assert "0x84448004" in str(e.value) and "0x5089304" in str(e.value) and "ambiguous" in str(e.value)
    assert cpuregs.parse_decode_arg("CTR_EL0=0x84448004") == ("CTR_EL0", 0x84448004)


def _check_layouts_of_real_caches(caches: Sequence[Any]) -> int:
    """Each real geometry, encoded in each layout, decodes plausibly in that layout; a 32-bit value read as
    CCIDX (the mistake the check is for) is flagged. Returns how many geometries were checked."""
    n = 0
    for c in caches:
        if None in (c.line_bytes, c.ways, c.sets) or c.line_bytes < 16:
            continue
        for ccidx in (False, True):
            value = cpuregs.encode_ccsidr(c.line_bytes, c.ways, c.sets, ccidx)
            if value is None:
                continue
            n += 1
            d = cpuregs.decode_register("CCSIDR_EL1", value)
            by_layout = {x["layout"]: x for x in d["layouts"]}  # type: ignore[union-attr]
            right = by_layout["CCIDX" if ccidx else "32-bit"]
            assert (right["ways"], right["sets"]) == (c.ways, c.sets)
            assert right["implausible"] == [], (c, right)
            if not ccidx:
                wrong = by_layout["CCIDX"]
                assert wrong["sets"] == 1 and any("1 set" in w for w in wrong["implausible"]), wrong
    return n


def test_ccsidr_in_the_wrong_layout_is_flagged_on_this_machine() -> None:
    """The live machine's caches (sysfs geometry) as both layouts would hold them."""
    part = read_cpu("/")
    if isinstance(part, Unavailable) or not _check_layouts_of_real_caches(part.caches):
        pytest.skip("this machine's sysfs gives no cache geometry")


@pytest.mark.skipif(not DUMPS.is_dir(), reason=f"CPU dumps not found at {DUMPS}")
def test_ccsidr_plausibility_holds_for_every_captured_machine(parts) -> None:  # noqa: F811
    checked = sum(_check_layouts_of_real_caches(parts(name).caches) for name in TARBALLS)
    assert checked > 100


def test_ccsidr_wrong_layout_text_warns() -> None:
    """0x700fe01a (a Cortex-A510 L1d, 32-bit layout) read as CCIDX is '130052 ways, 1 set': flagged, once."""
    text = decode_text(cpuregs.decode_register("CCSIDR_EL1", 0x700FE01A))
    lines = text.splitlines()
    assert "layout 32-bit: line 64 B, 4 ways, 128 sets = 32K" in lines[1]
    assert "130052 ways, 1 set =" in lines[2]
    assert lines[3].startswith("    ! implausible in this layout: 130052 ways") and len(lines) == 4


def test_decode_register_ccsidr_shows_both_layouts_when_ambiguous() -> None:
    d = cpuregs.decode_register("CCSIDR_EL1", 0x700FE01A)
    assert [x["layout"] for x in d["layouts"]] == ["32-bit", "CCIDX"]  # type: ignore[union-attr,index]
    d = cpuregs.decode_register("CCSIDR_EL1", 0x0000007F_0000001A)
    assert [x["layout"] for x in d["layouts"]] == ["CCIDX"]  # type: ignore[union-attr,index]


def test_live_ctr_el0() -> None:
    """On aarch64 the real instruction runs; elsewhere the reason says why not."""
    got = read_ctr_el0()
    if platform.machine().lower() in ("aarch64", "arm64"):
        assert not isinstance(got, Unavailable), got
        assert got.dminline_bytes in (16, 32, 64, 128, 256)
        assert got.value >> 31 & 1  # bit 31 is RES1 on Armv8
    else:
        assert isinstance(got, Unavailable)
        assert platform.machine() in got.reason


def test_stub_encodings_disassemble_to_what_the_comments_say() -> None:
    """The two code stubs, checked by LLVM's disassembler where it is installed."""
    import shutil
    import subprocess

    from dltop.sources import cpu

    mc = shutil.which("llvm-mc") or shutil.which("llvm-mc-14")
    if mc is None:
        pytest.skip("llvm-mc not installed")
    for code, want in ((cpu._MRS_CTR, ["mrs x0, CTR_EL0", "ret"]), (cpu._ZERO, ["mov x0, xzr", "ret"])):
        hexbytes = " ".join(f"0x{b:02x}" for b in code)
        r = subprocess.run([mc, "--triple=aarch64", "--disassemble"], input=hexbytes, capture_output=True,
                           text=True, check=True)
        got = [" ".join(ln.split()) for ln in r.stdout.splitlines() if ln.strip() and not ln.strip().startswith(".")]
        assert got == want


@pytest.mark.skipif(platform.machine() != "x86_64", reason="uses x86-64 machine code")
def test_stub_maps_and_runs_code_here() -> None:
    """The mmap / mprotect / call path CTR_EL0 uses, run with `mov eax, 42; ret` on this x86-64 host."""
    from dltop.sources.cpu import _Stub

    with _Stub(bytes.fromhex("b82a000000c3")) as fn:
        assert fn() == 42


def test_emulation_timing_tells_slow_reads_apart() -> None:
    from dltop.sources.cpu import _looks_emulated

    def empty() -> int:
        return 0

    def trapped() -> int:  # a few microseconds, like a kernel entry and exit
        x = 0
        for i in range(200):
            x += i
        return x

    assert _looks_emulated(trapped, empty, n=200)[0] is True
    assert _looks_emulated(empty, empty, n=200)[0] is not True


def _cpuid_dump(tmp_path):  # type: ignore[no-untyped-def]
    import tarfile

    from tests.test_cpu_dumps import DUMPS

    tb = DUMPS / "x86-cpuid" / "AMD-19h-Zen4-2xEpyc-9654.tar.bz2"
    if not tb.exists():
        pytest.skip(f"fixture not found at {tb}")
    with tarfile.open(tb) as tf:
        tf.extractall(tmp_path, filter="data")
    return sorted((tmp_path / "AMD-19h-Zen4-2xEpyc-9654").glob("pu*"))


def _leaves(path) -> dict[tuple[int, int], tuple[int, int, int, int]]:  # type: ignore[no-untyped-def]
    """hwloc-gather-cpuid lines: `mask eax ebx ecx edx => eax ebx ecx edx` (inputs left, hex)."""
    out = {}
    for ln in path.read_text().splitlines():
        if ln.startswith("#") or "=>" not in ln:
            continue
        left, right = ln.split("=>")
        _mask, eax, _ebx, ecx, _edx = (int(x, 16) for x in left.split())
        a, b, c, d = (int(x, 16) for x in right.split())
        out[(eax, ecx)] = (a, b, c, d)
    return out


def test_cpuid_8000001d_agrees_with_amd_legacy_leaves(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Zen 4 (EPYC 9654) CPUID dump: the 0x8000001D descriptors against the legacy 0x80000005/6 leaves of the
    same dump (L1d/L1i size and line; L2 size and line)."""
    pus = _cpuid_dump(tmp_path)
    assert len(pus) > 100
    leaves = _leaves(pus[0])
    caches = {}
    for sub in range(8):
        f = cpuregs.decode_cpuid_cache(*leaves[(0x8000001D, sub)])
        if f is None:
            break
        caches[(f.level, f.type)] = f
    _, _, l1d, l1i = leaves[(0x80000005, 0)]
    _, _, l2, _ = leaves[(0x80000006, 0)]
    assert caches[(1, "Data")].size_bytes == (l1d >> 24) << 10 and caches[(1, "Data")].line_bytes == l1d & 0xFF
    assert caches[(1, "Data")].ways == (l1d >> 16) & 0xFF
    assert caches[(1, "Instruction")].size_bytes == (l1i >> 24) << 10
    assert caches[(2, "Unified")].size_bytes == (l2 >> 16) << 10 and caches[(2, "Unified")].line_bytes == l2 & 0xFF
    # hand-checked against AMD's published Zen 4 CCD: 32 MiB L3, 16-way, shared by 8 cores × 2 threads
    l3 = caches[(3, "Unified")]
    assert (l3.size_bytes, l3.ways, l3.threads_sharing) == (32 << 20, 16, 16)
    # every logical CPU of the dump describes the same caches
    for pu in pus[1:]:
        lv = _leaves(pu)
        assert [cpuregs.decode_cpuid_cache(*lv[(0x8000001D, s)]) for s in range(4)] == list(caches.values())


def test_live_cpuid_agrees_with_sysfs_or_is_flagged() -> None:
    from dltop.model.cpu import CpuPart
    from dltop.sources.cpu import read_cpu, read_cpuid_caches

    got = read_cpuid_caches()
    if platform.machine() != "x86_64":
        assert isinstance(got, Unavailable)
        return
    assert not isinstance(got, Unavailable), got
    assert {c.level for c in got} >= {1}
    part = read_cpu("/")
    if not isinstance(part, CpuPart) or not part.caches or len(part.core_kinds) > 1:
        pytest.skip("no sysfs caches here to compare with")
    first = min(part.online)
    sysfs = {c.name: c.size_bytes for c in part.caches if first in c.cpus}
    mismatched = [q.name for q in got if q.name in sysfs and sysfs[q.name] not in (None, q.size_bytes)]
    assert not mismatched or any(f.code == "cpuid_disagrees" for f in part.flags)
    assert part.registers.cpuid_caches == got
    import json

    from dltop.model.base import from_dict, to_dict

    assert from_dict(CpuPart, json.loads(json.dumps(to_dict(part)))) == part
