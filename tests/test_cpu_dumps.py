"""The CPU topology reader on every real sysfs dump in ../shared/fixtures/cpu-dumps, checked against the lscpu
and hwloc outputs kept beside each dump (parsed here, never retyped).

Where lscpu itself is wrong, a test says so and shows it from the oracle's own text.
"""

from __future__ import annotations

import json
import re
import tarfile
from collections import defaultdict
from pathlib import Path

import pytest

from dltop.model.base import Unavailable, from_dict, to_dict
from dltop.model.cpu import CacheInstance, CpuPart, TopologyNode
from dltop.sources.cpu import parse_cpuinfo, read_cpu

DUMPS = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "cpu-dumps"

# name -> tarball; the lscpu/hwloc oracles sit next to it.
TARBALLS = {
    "128arm-2pa2n8cluster4co": DUMPS / "hwloc" / "128arm-2pa2n8cluster4co.tar.bz2",
    "2arm-2c": DUMPS / "hwloc" / "2arm-2c.tar.bz2",
    "arm-A510-A710-A715-X3": DUMPS / "util-linux" / "arm-A510-A710-A715-X3.tar.gz",
    "armv7": DUMPS / "util-linux" / "armv7.tar.gz",
    "x86_64-epyc_7451": DUMPS / "util-linux" / "x86_64-epyc_7451.tar.gz",
    "ghw-graviton2": DUMPS / "ghw" / "linux-arm64-c288e0776090cd558ef793b2a4e61939.tar.gz",
}
WITH_LSCPU = ["128arm-2pa2n8cluster4co", "2arm-2c", "arm-A510-A710-A715-X3", "armv7", "x86_64-epyc_7451"]
WITH_HWLOC = ["128arm-2pa2n8cluster4co", "2arm-2c"]

pytestmark = pytest.mark.skipif(not DUMPS.is_dir(), reason=f"fixtures not found at {DUMPS}")


# Module-level so the test modules that import these fixtures share one extraction per session.
_ROOTS: dict[str, Path] = {}
_PARTS: dict[str, CpuPart] = {}


def _named(part: CpuPart, name: str) -> tuple[CacheInstance, ...]:
    """Every cache instance called `name` ("L2")."""
    return tuple(c for c in part.caches if c.name == name)


@pytest.fixture(scope="session")
def dump_root(tmp_path_factory: pytest.TempPathFactory):
    """Extract a dump once per session; return the directory holding its sys/ and proc/."""
    roots = _ROOTS

    def get(name: str) -> Path:
        if name not in roots:
            dest = tmp_path_factory.mktemp(name)
            with tarfile.open(TARBALLS[name]) as tf:
                tf.extractall(dest, filter="data")
            inner = dest / name
            roots[name] = inner if (inner / "sys").is_dir() else dest
        return roots[name]

    return get


@pytest.fixture(scope="session")
def parts(dump_root):
    cache = _PARTS

    def get(name: str) -> CpuPart:
        if name not in cache:
            part = read_cpu(dump_root(name))
            assert isinstance(part, CpuPart), part
            cache[name] = part
        return cache[name]

    return get


def oracle(name: str, suffix: str) -> Path:
    return TARBALLS[name].parent / f"{name}{suffix}"


# ------------------------------------------------------------------------------------------ oracle parsers


def parse_columns(text: str) -> list[dict[str, str]]:
    """lscpu's aligned table: each cell goes to the header column it overlaps most (cells may be empty)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return []
    spans = [(m.group(), m.start(), m.end()) for m in re.finditer(r"\S+", lines[0])]
    rows = []
    for ln in lines[1:]:
        row = {h: "" for h, _, _ in spans}
        for m in re.finditer(r"\S+", ln):
            best = max(spans, key=lambda s: min(m.end(), s[2]) - max(m.start(), s[1]))
            row[best[0]] = (row[best[0]] + " " + m.group()).strip()
        rows.append(row)
    return rows


def lscpu_bytes(text: str) -> float:
    """lscpu sizes: '64K', '1.5M', '32M' (binary units)."""
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[text[-1]]
    return float(text[:-1]) * mult


def parse_hwloc(text: str) -> list[dict[str, object]]:
    """lstopo -v output as objects with their type, attributes and the PUs (P#) below them."""
    objs: list[dict[str, object]] = []
    stack: list[tuple[int, dict[str, object]]] = []
    for ln in text.splitlines():
        m = re.match(r"^( *)(\S+)(?: L#\d+)?(?: \((.*)\))?$", ln)
        if not m:
            continue
        depth = len(m.group(1))
        attrs = dict(re.findall(r"(\w+)=(\"[^\"]*\"|\S+)", m.group(3) or ""))
        pnum = re.match(r"P#(\d+)", m.group(3) or "")
        obj: dict[str, object] = {"type": m.group(2), "attrs": attrs, "pus": set(),
                                  "p": pnum.group(1) if pnum else None}
        while stack and stack[-1][0] >= depth:
            stack.pop()
        if obj["type"] == "PU" and pnum:
            for _, o in stack:
                o["pus"].add(int(pnum.group(1)))  # type: ignore[attr-defined]
        stack.append((depth, obj))
        objs.append(obj)
    return objs


def hwloc_size(text: str) -> int:
    m = re.fullmatch(r"(\d+)(KiB|MiB|GiB)", text)
    assert m, text
    return int(m.group(1)) << {"KiB": 10, "MiB": 20, "GiB": 30}[m.group(2)]


def parse_lscpu_parse_sections(text: str) -> list[list[dict[str, str]]]:
    """The `lscpu --parse` sections at the end of util-linux's .expected files."""
    sections = []
    header: list[str] | None = None
    for ln in text.splitlines():
        if ln.startswith("# CPU,"):
            header = ln[2:].split(",")
            sections.append([])
        elif header and ln and not ln.startswith("#"):
            sections[-1].append(dict(zip(header, ln.split(","), strict=True)))
    return sections


def partition(pairs: dict[int, str]) -> set[frozenset[int]]:
    groups: dict[str, set[int]] = defaultdict(set)
    for cpu, gid in pairs.items():
        groups[gid].add(cpu)
    return {frozenset(g) for g in groups.values()}


def nodes(tree: tuple[TopologyNode, ...], kind: str) -> list[TopologyNode]:
    out = []
    stack = list(tree)
    while stack:
        n = stack.pop()
        if n.kind == kind:
            out.append(n)
        stack.extend(n.children)
    return out


# --------------------------------------------------------------------------------------------- lscpu -C


@pytest.mark.parametrize("name", WITH_LSCPU)
def test_sizes_agree_with_lscpu_C(parts, name: str) -> None:
    part = parts(name)
    rows = parse_columns(oracle(name, ".lscpu-C-all.txt").read_text())
    assert {r["NAME"] for r in rows} == {c.name for c in part.caches}
    for r in rows:
        insts = _named(part, r["NAME"])
        assert {c.level for c in insts} == {int(r["LEVEL"])}
        assert {c.type for c in insts} == {r["TYPE"]}
        # lscpu -C prints one instance's numbers: every instance here has the same, so each must match.
        for col, attr in (("WAYS", "ways"), ("SETS", "sets"), ("COHERENCY-SIZE", "line_bytes"),
                          ("PHY-LINE", "physical_line_partition")):
            expect = int(r[col]) if r[col] else None
            assert {getattr(c, attr) for c in insts} == {expect}, (r["NAME"], col)
        if r["ONE-SIZE"]:
            assert {c.size_bytes for c in insts} == {lscpu_bytes(r["ONE-SIZE"])}
            # ALL-SIZE is the sum over instances: the instance count and sharing must be right for it to agree.
            assert sum(c.size_bytes or 0 for c in insts) == pytest.approx(lscpu_bytes(r["ALL-SIZE"]), rel=0.01)
        else:
            assert {c.size_bytes for c in insts} == {None}  # not given is None, never 0
            assert r["ALL-SIZE"] == ""


@pytest.mark.parametrize("name", WITH_LSCPU)
def test_sharing_agrees_with_lscpu_e(parts, name: str) -> None:
    """lscpu -e's CACHE column gives, per CPU, an ID per cache: the groups must be our instances' CPU sets."""
    part = parts(name)
    rows = parse_columns(oracle(name, ".lscpu-e.txt").read_text())
    col = next(h for h in rows[0] if h.startswith("L1") or h == "CACHE")
    if rows[0][col] == "-":
        assert part.caches == ()
        return
    names = col.split(":")
    for i, cname in enumerate(names):
        ids = {int(r["CPU"]): r[col].split(":")[i] for r in rows}
        assert partition(ids) == {frozenset(c.cpus) for c in _named(part, cname)}, cname
    assert {int(r["CPU"]) for r in rows if r["ONLINE"] == "yes"} == set(part.online)


@pytest.mark.parametrize("name", ["arm-A510-A710-A715-X3", "x86_64-epyc_7451", "armv7"])
def test_parse_sections_and_instance_counts_agree_with_util_linux_expected(parts, name: str) -> None:
    part = parts(name)
    text = (TARBALLS[name].parent / f"lscpu-{name}.expected").read_text()
    for m in re.finditer(r"^(L\d[di]?) cache:\s+\S+ \S+ \((\d+) instances\)", text, re.M):
        assert len(_named(part, m.group(1))) == int(m.group(2))
    logical = parse_lscpu_parse_sections(text)[0]
    for cname in ("L1d", "L1i", "L2", "L3"):
        if cname in logical[0] and _named(part, cname):
            ids = {int(r["CPU"]): r[cname] for r in logical}
            assert partition(ids) == {frozenset(c.cpus) for c in _named(part, cname)}


# ----------------------------------------------------------------------------------------------- hwloc


@pytest.mark.parametrize("name", WITH_HWLOC)
def test_caches_agree_with_hwloc(parts, name: str) -> None:
    part = parts(name)
    objs = parse_hwloc(oracle(name, ".console").read_text())
    hw = sorted(
        (o["type"].removesuffix("Cache"), hwloc_size(o["attrs"]["size"]), int(o["attrs"]["linesize"]),
         tuple(sorted(o["pus"])))
        for o in objs if str(o["type"]).endswith("Cache"))
    ours = sorted((c.name, c.size_bytes, c.line_bytes, c.cpus) for c in part.caches)
    assert ours == hw


@pytest.mark.parametrize("name", WITH_HWLOC)
def test_packages_clusters_and_core_kind_agree_with_hwloc(parts, name: str) -> None:
    part = parts(name)
    objs = parse_hwloc(oracle(name, ".console").read_text())
    pkgs = {(o["p"], frozenset(o["pus"])) for o in objs if o["type"] == "Package"}
    assert {(n.label.removeprefix("Package "), frozenset(n.cpus)) for n in part.tree} == pkgs
    clusters = {(o["p"], frozenset(o["pus"])) for o in objs if o["type"] == "Group(Cluster)"}
    assert {(n.label.removeprefix("Cluster "), frozenset(n.cpus)) for n in nodes(part.tree, "cluster")} == clusters
    # hwloc copies the cpuinfo MIDR fields onto the Package (or the Machine): implementer, part, rNpM.
    ident = next(o["attrs"] for o in objs if "CPUImplementer" in o["attrs"])  # type: ignore[operator]
    (kind,) = part.core_kinds
    assert kind.implementer == int(ident["CPUImplementer"], 16)
    assert kind.part == int(ident["CPUPart"], 16)
    assert kind.revision == f"r{int(ident['CPUVariant'], 16)}p{ident['CPURevision']}"


def test_kunpeng_l3_ways_lscpu_and_hwloc_disagree_and_dltop_flags_it(parts) -> None:
    """sysfs says 15 ways (lscpu repeats it); hwloc prints 128 = size / (sets × line). Neither is checked by
    them; dltop keeps the raw 15 and flags that 2048 × 15 × 128 B is not 32 MiB."""
    part = parts("128arm-2pa2n8cluster4co")
    lscpu_l3 = next(r for r in parse_columns(oracle("128arm-2pa2n8cluster4co", ".lscpu-C.txt").read_text())
                    if r["NAME"] == "L3")
    hw_l3 = next(o for o in parse_hwloc(oracle("128arm-2pa2n8cluster4co", ".console").read_text())
                 if o["type"] == "L3Cache")
    hw_ways = int(hw_l3["attrs"]["ways"])  # type: ignore[index]
    assert hw_ways != int(lscpu_l3["WAYS"])
    (l3,) = {c.ways for c in _named(part, "L3")}
    assert l3 == int(lscpu_l3["WAYS"])
    (flag,) = [f for f in part.flags if f.code == "geometry_mismatch"]
    assert "L3" in flag.message and f"{hw_ways} ways" in flag.message
    assert set(flag.cpus) == set(part.cpus)
    # L1 and L2 are consistent, so they are not flagged.
    for c in part.caches:
        if c.level < 3:
            assert c.size_bytes == (c.sets or 0) * (c.ways or 0) * (c.line_bytes or 0)


# ----------------------------------------------------------------------------------------- core names


def test_core_kinds_agree_with_lscpu_model_names(parts) -> None:
    """util-linux's expected output gives Model name, Stepping (rNpM) and Core(s) per socket per core type."""
    for name in ("arm-A510-A710-A715-X3", "armv7", "x86_64-epyc_7451"):
        text = (TARBALLS[name].parent / f"lscpu-{name}.expected").read_text()
        blocks = []
        for chunk in text.split("\nModel name:")[1:]:
            fields = dict(re.findall(r"^([^:\n]+):[ \t]+(.*)$", "Model name:" + chunk, re.M))
            blocks.append((fields["Model name"], fields["Core(s) per socket"], fields["Socket(s)"],
                           fields["Stepping"]))
        assert blocks
        part = parts(name)
        ours = {k.name: k for k in part.core_kinds}
        assert set(ours) == {b[0] for b in blocks}
        threads = part.threads_per_core or 1
        for model, cores, sockets, stepping in blocks:
            k = ours[model]
            assert len(k.cpus) == int(cores) * int(sockets) * threads
            if stepping.startswith("r"):
                assert k.revision == stepping


def test_heterogeneous_phone_is_dynamiq_with_per_kind_rows(parts) -> None:
    part = parts("arm-A510-A710-A715-X3")
    assert part.arrangement == "DynamIQ"
    (l3,) = _named(part, "L3")
    assert {k.name for k in part.core_kinds if set(k.cpus) <= set(l3.cpus)} == {k.name for k in part.core_kinds}
    # The A510 pair sharing one L2 (a merged-core complex) is kept as shared, the big cores' L2 private.
    l2_groups = {c.cpus for c in _named(part, "L2")}
    a510 = next(k for k in part.core_kinds if k.name == "Cortex-A510")
    assert any(len(g) == 2 and set(g) <= set(a510.cpus) for g in l2_groups)
    assert a510.capacity is not None and a510.capacity < max(k.capacity or 0 for k in part.core_kinds)
    assert any(f.code == "no_cache_geometry" for f in part.flags)


def test_lscpu_mislabels_phone_clusters_as_sockets(parts) -> None:
    """lscpu --parse --physical (util-linux's expected output) reports 3 sockets on a one-chip phone: they are
    DynamIQ clusters numbered as packages. One L3 spans them, so dltop shows one package holding 3 clusters."""
    part = parts("arm-A510-A710-A715-X3")
    text = (TARBALLS["arm-A510-A710-A715-X3"].parent / "lscpu-arm-A510-A710-A715-X3.expected").read_text()
    physical = parse_lscpu_parse_sections(text)[1]
    sockets = partition({int(r["CPU"]): r["Socket"] for r in physical})
    assert len(sockets) > 1
    (pkg,) = part.tree
    assert set(pkg.cpus) == set(part.cpus)
    assert {frozenset(n.cpus) for n in nodes(part.tree, "cluster")} == sockets


def test_lscpu_e_core_ids_repeat_across_clusters(parts) -> None:
    """lscpu -e's CORE column is the raw core_id: CPUs 0, 3, 5, 7 all say core 0. They are four cores."""
    part = parts("arm-A510-A710-A715-X3")
    rows = parse_columns(oracle("arm-A510-A710-A715-X3", ".lscpu-e.txt").read_text())
    by_core = partition({int(r["CPU"]): r["CORE"] for r in rows})
    assert any(len(g) > 1 for g in by_core)
    cores = {frozenset(n.cpus) for n in nodes(part.tree, "core")}
    assert cores == {frozenset({c}) for c in part.cpus}


ARCHSPEC = sorted((DUMPS / "cpuinfo-only" / "archspec-json").glob("linux-*")) if DUMPS.is_dir() else []


@pytest.mark.parametrize("path", ARCHSPEC, ids=lambda p: p.name)
def test_core_name_from_archspec_cpuinfo(tmp_path: Path, path: Path) -> None:
    """archspec names each file after its microarchitecture (neoverse_v2, a64fx, m1, ...): our name contains it."""
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "cpuinfo").write_bytes(path.read_bytes())
    part = read_cpu(tmp_path)
    assert isinstance(part, CpuPart)
    (kind,) = part.core_kinds
    target = path.name.split("-", 2)[-1].replace("_", "")
    assert target in kind.name.lower().replace("-", "")
    assert kind.revision and re.fullmatch(r"r\d+p\d+", kind.revision)
    assert part.flags and part.flags[0].code == "no_cache_info"


# pytorch/cpuinfo's phone logs: the expected names are the chips' published core lineups (see the fixtures'
# README); hand-checked against Arm's and each vendor's MIDR part tables.
PYTORCH = {
    "galaxy-s9-us.log": {"Kryo-3XX-Gold": 4, "Kryo-3XX-Silver": 4},
    "galaxy-s9-global.log": {"Exynos-M3": 4, "Cortex-A55": 4},
    "huawei-mate-20.log": {"Cortex-A76": 4, "Cortex-A55": 4},
    "pixel-2-xl.log": {"Kryo-2XX-Gold": 4, "Kryo-2XX-Silver": 4},
    "jetson-tx1.log": {"Cortex-A57": 4},
    "scaleway.log": {"ThunderX-88XX": 6},
}


@pytest.mark.parametrize("fname", sorted(PYTORCH))
def test_core_names_from_phone_cpuinfo(tmp_path: Path, fname: str) -> None:
    src = DUMPS / "cpuinfo-only" / "pytorch-cpuinfo" / fname
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "cpuinfo").write_bytes(src.read_bytes())
    part = read_cpu(tmp_path)
    assert isinstance(part, CpuPart)
    assert {k.name: len(k.cpus) for k in part.core_kinds} == PYTORCH[fname]
    # every processor block of the file is one CPU of exactly one kind
    entries = parse_cpuinfo(src.read_text())
    assert sorted(c for k in part.core_kinds for c in k.cpus) == sorted(e.cpu for e in entries)
    if len(PYTORCH[fname]) > 1:
        assert part.arrangement == "unknown"  # two kinds, but no sysfs to say how they share caches


# ------------------------------------------------------------------------------------ quirks of the trees


def test_vm_without_possible_or_online_is_read_and_flagged(dump_root, parts) -> None:
    root = dump_root("ghw-graviton2")
    cpu_dir = root / "sys/devices/system/cpu"
    assert not (cpu_dir / "possible").exists() and not (cpu_dir / "online").exists()
    part = parts("ghw-graviton2")
    assert part.online == part.cpus == (0,)
    assert [c.name for c in part.caches] == ["L1d", "L1i", "L2", "L3"]
    assert all(c.cpus == (0,) for c in part.caches)
    (l3,) = _named(part, "L3")
    (flag,) = [f for f in part.flags if f.code == "vm_slice"]
    assert "L3" in flag.message
    # MIDR 0x413fd0c1 from the dump's cpuinfo (README: Graviton2): Neoverse-N1 r3p1
    (kind,) = part.core_kinds
    assert (kind.name, kind.revision) == ("Neoverse-N1", "r3p1")
    assert part.registers.midr_el1 == {"0": "0x413fd0c1"}


def test_files_ending_in_newline_nul_parse(dump_root, parts) -> None:
    root = dump_root("128arm-2pa2n8cluster4co")
    raw = (root / "sys/devices/system/cpu/cpu5/topology/cluster_cpus_list").read_bytes()
    assert raw.endswith(b"\n\0")
    part = parts("128arm-2pa2n8cluster4co")
    clusters = {frozenset(n.cpus) for n in nodes(part.tree, "cluster")}
    assert frozenset({4, 5, 6, 7}) in clusters


def test_masks_give_the_same_instances_as_lists(tmp_path: Path, dump_root, parts) -> None:
    import shutil

    src = dump_root("arm-A510-A710-A715-X3")
    dest = tmp_path / "copy"
    shutil.copytree(src, dest, symlinks=True)
    removed = 0
    for f in dest.glob("sys/devices/system/cpu/cpu*/cache/index*/shared_cpu_list"):
        f.unlink()
        removed += 1
    assert removed
    part = read_cpu(dest)
    assert isinstance(part, CpuPart)
    assert part.caches == parts("arm-A510-A710-A715-X3").caches


def test_no_cache_information_is_flagged_not_zero(parts) -> None:
    for name in ("2arm-2c", "armv7"):
        part = parts(name)
        assert part.caches == ()
        assert [f.code for f in part.flags] == ["no_cache_info"]
        assert isinstance(part.registers.clidr_el1, Unavailable)
        assert part.arch == "arm"


def test_epyc_x86_registers_unavailable_and_smt_cores(parts) -> None:
    part = parts("x86_64-epyc_7451")
    assert isinstance(part.registers.ctr_el0, Unavailable) and "x86_64" in part.registers.ctr_el0.reason
    assert part.threads_per_core == 2
    assert all(len(n.cpus) == 2 for n in nodes(part.tree, "core"))
    assert not part.flags


@pytest.mark.parametrize("name", sorted(TARBALLS))
def test_part_round_trips_through_json(parts, name: str) -> None:
    part = parts(name)
    assert from_dict(CpuPart, json.loads(json.dumps(to_dict(part)))) == part


@pytest.mark.parametrize("name", sorted(TARBALLS))
def test_tree_nests_by_cpu_sets(parts, name: str) -> None:
    part = parts(name)

    def check(n: TopologyNode) -> None:
        for c in n.children:
            assert set(c.cpus) <= set(n.cpus)
            check(c)

    for root in part.tree:
        assert root.kind == "package"
        check(root)
    assert sorted(c for r in part.tree for c in r.cpus) == list(part.cpus)
    assert {n.cache for n in nodes(part.tree, "cache")} == set(range(len(part.caches)))
