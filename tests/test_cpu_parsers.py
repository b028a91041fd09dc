"""Property tests for the text parsers behind the CPU topology reader: cpu lists, masks, sizes, /proc/cpuinfo."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dltop.sources.cpu import (
    clean,
    format_cpu_list,
    parse_cpu_list,
    parse_cpu_mask,
    parse_cpuinfo,
    parse_size,
    read_cpu,
    read_pmus,
)

cpu_sets = st.sets(st.integers(min_value=0, max_value=1023), max_size=64)


def kernel_mask(cpus: set[int], words: int | None = None) -> str:
    """The kernel's %*pb: 32-bit hex words, most significant first, every word zero-padded."""
    value = sum(1 << c for c in cpus)
    n = words or max(1, (max(cpus, default=0) // 32) + 1)
    return ",".join(f"{(value >> (32 * i)) & 0xFFFFFFFF:08x}" for i in reversed(range(n)))


@given(cpu_sets)
def test_list_round_trip(cpus: set[int]) -> None:
    assert parse_cpu_list(format_cpu_list(cpus)) == tuple(sorted(cpus))


@given(cpu_sets, st.sampled_from(["", "\n", "\n\0", "\0", "  \n"]))
def test_list_tolerates_sysfs_padding(cpus: set[int], tail: str) -> None:
    assert parse_cpu_list(format_cpu_list(cpus) + tail) == tuple(sorted(cpus))


@given(cpu_sets, st.integers(min_value=0, max_value=4))
def test_mask_agrees_with_list(cpus: set[int], extra_words: int) -> None:
    words = max(1, (max(cpus, default=0) // 32) + 1) + extra_words
    assert parse_cpu_mask(kernel_mask(cpus, words) + "\n") == parse_cpu_list(format_cpu_list(cpus))


@given(st.integers(min_value=0, max_value=200), st.integers(min_value=0, max_value=200),
       st.integers(min_value=1, max_value=8), st.integers(min_value=1, max_value=8))
def test_list_stride_syntax(lo: int, span: int, used: int, group: int) -> None:
    """'a-b:used/group' (bitmap_parselist): `used` CPUs out of every `group`, starting at a."""
    if used > group:
        used, group = group, used
    hi = lo + span
    got = parse_cpu_list(f"{lo}-{hi}:{used}/{group}")
    assert got == tuple(c for c in range(lo, hi + 1) if (c - lo) % group < used)


@pytest.mark.parametrize("bad", ["x", "3-1", "1-2:0/4", "1-2:5/4", "--"])
def test_list_rejects_garbage(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_cpu_list(bad)


@pytest.mark.parametrize("bad", ["zz", "123456789", "ff,,ff"])
def test_mask_rejects_garbage(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_cpu_mask(bad)


@given(st.integers(min_value=0, max_value=1 << 20), st.sampled_from([("K", 10), ("M", 20), ("G", 30), ("", 0)]))
def test_size_units(n: int, unit: tuple[str, int]) -> None:
    if n << unit[1] > 1 << 40:  # beyond any real CPU cache: refused as corrupt
        with pytest.raises(ValueError):
            parse_size(f"{n}{unit[0]}\n")
        return
    assert parse_size(f"{n}{unit[0]}\n") == n << unit[1]


def test_empty_list_and_clean() -> None:
    assert parse_cpu_list("\n\0") == ()
    assert clean("0-3\n\0") == "0-3"


field_names = st.sampled_from(["CPU implementer", "CPU part", "CPU variant", "CPU revision", "BogoMIPS",
                               "Features", "model name"])
field_values = st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs"), blacklist_characters=":"),
                       max_size=20).map(str.strip)


@given(st.lists(st.dictionaries(field_names, field_values, max_size=5), min_size=0, max_size=8),
       st.dictionaries(st.sampled_from(["Hardware", "Revision", "Serial"]), field_values, max_size=3))
def test_cpuinfo_round_trip(cpus: list[dict[str, str]], common: dict[str, str]) -> None:
    """Each `processor` block comes back with its own fields, and the trailing global block fills in."""
    text = ""
    for i, fields in enumerate(cpus):
        text += f"processor\t: {i}\n" + "".join(f"{k}\t: {v}\n" for k, v in fields.items()) + "\n"
    text += "".join(f"{k}\t: {v}\n" for k, v in common.items())
    entries = parse_cpuinfo(text)
    assert [e.cpu for e in entries] == list(range(len(cpus)))
    for e, fields in zip(entries, cpus, strict=True):
        assert e.fields == {**common, **fields}


@given(st.text(max_size=300))
def test_cpuinfo_never_raises(text: str) -> None:
    for e in parse_cpuinfo(text):
        assert isinstance(e.cpu, int)


def test_old_arm_cpuinfo_applies_trailing_fields_to_every_cpu() -> None:
    text = ("Processor\t: ARMv7 Processor rev 1 (v7l)\nprocessor\t: 0\nBogoMIPS\t: 1595.80\n\n"
            "processor\t: 1\nBogoMIPS\t: 1595.80\n\nCPU implementer\t: 0x41\nCPU part\t: 0xc09\n")
    entries = parse_cpuinfo(text)
    assert [(e.cpu, e.fields["CPU part"]) for e in entries] == [(0, "0xc09"), (1, "0xc09")]


# --------------------------------------------------------------------------- small trees made by the tests


def write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def test_missing_attributes_are_none_not_zero(tmp_path: Path) -> None:
    idx = "sys/devices/system/cpu/cpu0/cache/index0"
    write(tmp_path, f"{idx}/level", "1\n")
    write(tmp_path, f"{idx}/type", "Data\n")
    write(tmp_path, f"{idx}/size", "")
    part = read_cpu(tmp_path)
    assert not isinstance(part, type(None))
    (c,) = part.caches  # type: ignore[union-attr]
    assert (c.size_bytes, c.ways, c.sets, c.line_bytes) == (None, None, None, None)
    assert c.cpus == (0,)
    codes = {f.code for f in part.flags}  # type: ignore[union-attr]
    assert {"no_sharing_info", "no_cache_geometry"} <= codes


def test_partial_listing_is_flagged(tmp_path: Path) -> None:
    """Two online CPUs, but the only L2 lists CPU 0: CPU 1's L2 is missing from the data."""
    write(tmp_path, "sys/devices/system/cpu/online", "0-1\n")
    for cpu in (0, 1):
        idx = f"sys/devices/system/cpu/cpu{cpu}/cache/index0"
        write(tmp_path, f"{idx}/level", "1\n")
        write(tmp_path, f"{idx}/type", "Unified\n")
        write(tmp_path, f"{idx}/shared_cpu_list", f"{cpu}\n")
    idx = "sys/devices/system/cpu/cpu0/cache/index1"
    write(tmp_path, f"{idx}/level", "2\n")
    write(tmp_path, f"{idx}/type", "Unified\n")
    write(tmp_path, f"{idx}/shared_cpu_list", "0\n")
    part = read_cpu(tmp_path)
    flags = {f.code: f for f in part.flags}  # type: ignore[union-attr]
    assert flags["partial_listing"].cpus == (1,)


def test_interconnect_pmus_are_listed(tmp_path: Path) -> None:
    for name in ("arm_cmn_0", "arm_dsu_0", "CCI_400", "armv8_pmuv3_0", "software", "hisi_sccl1_l3c0"):
        (tmp_path / "sys/bus/event_source/devices" / name).mkdir(parents=True)
    got = {p.name: p.kind for p in read_pmus(tmp_path)}
    assert set(got) == {"arm_cmn_0", "arm_dsu_0", "CCI_400", "hisi_sccl1_l3c0"}
    assert "CMN" in got["arm_cmn_0"] and "DSU" in got["arm_dsu_0"] and "CCI" in got["CCI_400"]


def test_big_little_with_cluster_l2(tmp_path: Path) -> None:
    """Classic big.LITTLE: each cluster has its own shared L2 and nothing is shared across kinds."""
    midr = {0: "0x410fd034", 1: "0x410fd034", 2: "0x410fd072", 3: "0x410fd072"}  # A53 ×2, A57 ×2
    for cpu, m in midr.items():
        base = f"sys/devices/system/cpu/cpu{cpu}"
        write(tmp_path, f"{base}/regs/identification/midr_el1", m + "\n")
        cluster = "0-1" if cpu < 2 else "2-3"
        for i, (lvl, typ, shared) in enumerate([(1, "Data", str(cpu)), (1, "Instruction", str(cpu)),
                                                 (2, "Unified", cluster)]):
            write(tmp_path, f"{base}/cache/index{i}/level", f"{lvl}\n")
            write(tmp_path, f"{base}/cache/index{i}/type", typ + "\n")
            write(tmp_path, f"{base}/cache/index{i}/shared_cpu_list", shared + "\n")
            write(tmp_path, f"{base}/cache/index{i}/size", "512K\n" if lvl == 2 else "32K\n")
    part = read_cpu(tmp_path)
    assert part.arrangement == "big.LITTLE"  # type: ignore[union-attr]
    assert [k.name for k in part.core_kinds] == ["Cortex-A53", "Cortex-A57"]  # type: ignore[union-attr]
    # the same CPUs without the cluster L2s would be DynamIQ if an L3 spanned them
    for cpu in range(4):
        base = f"sys/devices/system/cpu/cpu{cpu}/cache/index3"
        write(tmp_path, f"{base}/level", "3\n")
        write(tmp_path, f"{base}/type", "Unified\n")
        write(tmp_path, f"{base}/shared_cpu_list", "0-3\n")
    assert read_cpu(tmp_path).arrangement == "DynamIQ"  # type: ignore[union-attr]


def test_nothing_there_is_unavailable(tmp_path: Path) -> None:
    from dltop.model.base import Unavailable

    assert isinstance(read_cpu(tmp_path), Unavailable)


def test_intel_hybrid_splits_p_and_e_cores(tmp_path: Path) -> None:
    """Hybrid Intel parts list their P and E cores under two PMU devices; one model name becomes two kinds."""
    info = "".join(f"processor\t: {i}\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Core(TM) Ultra 7\n\n"
                   for i in range(6))
    write(tmp_path, "proc/cpuinfo", info)
    write(tmp_path, "sys/devices/cpu_core/cpus", "0-1\n")
    write(tmp_path, "sys/devices/cpu_atom/cpus", "2-5\n")
    for cpu in range(6):
        write(tmp_path, f"sys/devices/system/cpu/cpu{cpu}/topology/core_cpus_list", f"{cpu}\n")
    part = read_cpu(tmp_path)
    kinds = {k.name: k.cpus for k in part.core_kinds}  # type: ignore[union-attr]
    assert kinds == {"Intel(R) Core(TM) Ultra 7 P-core": (0, 1), "Intel(R) Core(TM) Ultra 7 E-core": (2, 3, 4, 5)}
    assert part.arch == "x86_64"  # type: ignore[union-attr]


def test_absurd_values_are_refused_not_expanded() -> None:
    # A corrupt list must not make dltop build a set of 127 million CPUs (QA: 9 GB RSS, hung).
    with pytest.raises(ValueError, match="beyond"):
        parse_cpu_list("0-127000000")
    with pytest.raises(ValueError, match="wider"):
        parse_cpu_mask(",".join(["ffffffff"] * 4096))
    with pytest.raises(ValueError, match="larger than any CPU cache"):
        parse_size("18446744073709551616K")
