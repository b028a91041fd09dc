"""The CPU topology as plain text: the tree, the per-kind table, the register lines and the whole report.

Shown by `dltop cpu` and by the TUI's CPU pane alike, so it lives below both.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from dltop.fmt import plural
from dltop.model.base import Unavailable
from dltop.model.cpu import (
    CacheInstance,
    CcsidrEl1,
    CoreKind,
    CpuPart,
    CtrEl0,
    KindCache,
    TopologyNode,
    format_cpu_list,
)


def size_text(n: int | None) -> str:
    """65536 -> '64K', 3932160 -> '3.75M', None -> '?' (not given)."""
    if n is None:
        return "?"
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div:
            return f"{n / div:.2f}".rstrip("0").rstrip(".") + unit
    return f"{n}B"


def kind_table(part: CpuPart) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the per-core-kind table: each kind's own L1d/L1i/L2/L3, with sharing."""
    names = sorted({c.name for k in part.core_kinds for c in k.caches},
                   key=lambda n: (int(n[1:].rstrip("di")), n))
    header = ["kind", "rev", "cpus", "cap", *names]
    rows = []
    for k in part.core_kinds:
        row = [k.name, k.revision or "?", format_cpu_list(k.cpus), "" if k.capacity is None else str(k.capacity)]
        by = {c.name: c for c in k.caches}
        row += [_kind_cell(by[n], part) if n in by else "-" for n in names]
        rows.append(row)
    return header, rows


def _kind_cell(c: KindCache, part: CpuPart) -> str:
    """A kind's cache: its size, /N where N CPUs share each instance (/mixed where they differ), + where other
    kinds share it."""
    cell = size_text(c.size_bytes)
    # a private cache of a 2-thread core is not shown as shared
    if c.cpus_per_instance and c.cpus_per_instance > 1 and c.cpus_per_instance != (part.threads_per_core or 1):
        cell += f" /{c.cpus_per_instance}"
    elif c.cpus_per_instance is None:
        cell += " /mixed"
    return cell + "+" if c.shared_with else cell


def cache_groups(part: CpuPart) -> list[tuple[str, CacheInstance, int, str]]:
    """One row per (name, geometry, sharing width): (name, example instance, instance count, CPU lists)."""
    groups: dict[tuple[object, ...], list[CacheInstance]] = {}
    for c in part.caches:
        key = (c.name, c.type, c.size_bytes, c.ways, c.sets, c.line_bytes, len(c.cpus))
        groups.setdefault(key, []).append(c)
    out = []
    for insts in groups.values():
        lists = [format_cpu_list(i.cpus) for i in insts]
        shown = " ".join(lists[:4]) + (f" … (+{len(lists) - 4})" if len(lists) > 4 else "")
        out.append((insts[0].name, insts[0], len(insts), shown))
    return out


def _shape(node: TopologyNode) -> str:
    """The node's structure without CPU numbers or IDs: siblings with equal shapes fold into one line."""
    label = re.sub(r"\d+", "#", node.label) if node.kind in ("core", "cluster") else node.label
    return label + "(" + ",".join(_shape(c) for c in node.children) + ")"


def tree_lines(nodes: Sequence[TopologyNode], fold: bool = True, max_depth: int | None = None) -> list[str]:
    """The tree as indented lines with box-drawing connectors; runs of identical siblings fold to one."""
    out: list[str] = []

    def label(n: TopologyNode, each: bool) -> str:
        if n.kind == "core":
            return "Core" if each else n.label
        if each:
            return _fold_label(n)
        return f"{n.label}  [CPUs {format_cpu_list(n.cpus)}]"

    def walk(children: Sequence[TopologyNode], prefix: str, depth: int, each: bool) -> None:
        # `each`: inside a folded run the subtree stands for every member, so it names no CPUs
        items: list[list[TopologyNode]] = []
        for c in children:
            if fold and items and _shape(items[-1][0]) == _shape(c):
                items[-1].append(c)
            else:
                items.append([c])
        for i, run in enumerate(items):
            node = run[0]
            last = i == len(items) - 1
            conn = "└─ " if last else "├─ "
            if len(run) > 1:
                cpus = sorted(x for r in run for x in r.cpus)
                # Say how many CPUs each one serves: "[CPUs 0-1]" after a folded run read as if every
                # instance spanned all of them.
                per = len(node.cpus)
                where = "" if each else f"  [{plural(per, 'CPU')} each, CPUs {format_cpu_list(cpus)} in all]"
                out.append(f"{prefix}{conn}{len(run)} × {_fold_label(node)}{where}"
                           + (", each with:" if node.children else ""))
            else:
                out.append(prefix + conn + label(node, each))
            if max_depth is None or depth < max_depth:
                walk(node.children, prefix + ("   " if last else "│  "), depth + 1, each or len(run) > 1)

    for root in nodes:
        out.append(label(root, False))
        walk(root.children, "", 1, False)
    return out


_FOLDED_LABELS = {"core": "Core", "cluster": "Cluster"}


def _fold_label(node: TopologyNode) -> str:
    return _FOLDED_LABELS.get(node.kind, node.label)


def register_lines(part: CpuPart) -> list[str]:
    """CTR_EL0 as read, CLIDR_EL1/CCSIDR_EL1 as rebuilt, one line each."""
    r = part.registers
    out = [_ctr_line(r.ctr_el0)]
    if isinstance(r.clidr_el1, Unavailable):
        out.append(f"CLIDR_EL1   {r.clidr_el1}")
    else:
        for cl in r.clidr_el1:
            kinds = _kinds_on(part, cl.cpus)
            types = " ".join(f"L{i + 1}={t}" for i, t in enumerate(cl.ctypes))
            out.append(f"CLIDR_EL1   {cl.hex}  {types}  LoC {cl.loc}  LoUU {cl.louu}  LoUIS {cl.louis}  "
                       f"(rebuilt for {kinds})")
    if isinstance(r.ccsidr_el1, Unavailable):
        out.append(f"CCSIDR_EL1  {r.ccsidr_el1}")
    else:
        out += _ccsidr_lines(r.ccsidr_el1)
    if isinstance(r.cpuid_caches, Unavailable):
        if part.arch not in ("aarch64", "arm"):
            out.append(f"CPUID       {r.cpuid_caches}")
    else:
        for q in r.cpuid_caches:
            out.append(f"CPUID {q.leaf}  {q.name:<4} {size_text(q.size_bytes)}  {plural(q.ways, 'way')}  "
                       f"{plural(q.sets, 'set')}  line {q.line_bytes}  shared by up to "
                       f"{plural(q.threads_sharing, 'thread')}")
    return out


def _ctr_line(c: CtrEl0 | Unavailable) -> str:
    if isinstance(c, Unavailable):
        return f"CTR_EL0     {c}"
    emu = {True: "looks kernel-emulated", False: "read directly", None: "emulation unknown"}[c.looks_emulated]
    return (f"CTR_EL0     {c.hex}  IminLine {c.iminline_bytes} B  DminLine {c.dminline_bytes} B  "
            f"L1Ip {c.l1ip}  ERG {c.erg_bytes or '-'}  CWG {c.cwg_bytes or '-'}  IDC {int(c.idc)}  "
            f"DIC {int(c.dic)}  ({emu})")


def _ccsidr_lines(regs: tuple[CcsidrEl1, ...]) -> list[str]:
    """One line per distinct CCSIDR_EL1 value of a cache."""
    out, seen = [], set()
    for cc in regs:
        key = (cc.cache, cc.value_32bit, cc.value_ccidx)
        if key in seen:
            continue
        seen.add(key)
        v32 = "?" if cc.value_32bit is None else f"0x{cc.value_32bit:08x}"
        vcc = "?" if cc.value_ccidx is None else f"0x{cc.value_ccidx:016x}"
        out.append(f"CCSIDR_EL1  {cc.cache:<4} CSSELR {cc.csselr}  32-bit {v32}  CCIDX {vcc}")
    return out


def _kinds_on(part: CpuPart, cpus: Sequence[int]) -> str:
    names = [k.name for k in part.core_kinds if set(k.cpus) & set(cpus)]
    return ", ".join(names) if names else f"CPUs {format_cpu_list(cpus)}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*[h.upper() for h in header]).rstrip(), *(fmt.format(*r).rstrip() for r in rows)]


def render_text(part: CpuPart, root: str = "/", fold: bool = True) -> str:
    """The human report `dltop cpu` prints."""
    where = "" if os.path.realpath(root) == "/" else f"sysroot {root}; "
    lines = [f"CPU cache topology ({where}{part.arch or 'arch unknown'}; {plural(len(part.cpus), 'CPU')}, "
             f"{len(part.online)} online)", f"Arrangement: {part.arrangement}: {part.arrangement_reason}", ""]
    if part.core_kinds:
        lines += ["Per core kind (/N: one instance shared by N CPUs; +: shared with other kinds; ?: not given)",
                  *_table(*kind_table(part)), ""]
    if part.caches:
        lines += [f"Caches ({plural(len(part.caches), 'instance')})", *_caches_table(part), ""]
    lines += ["Tree", *tree_lines(part.tree, fold=fold), "", "Registers", *("  " + x for x in register_lines(part))]
    return "\n".join(lines + _notes_sections(part))


def _caches_table(part: CpuPart) -> list[str]:
    rows = [[name, c.type, size_text(c.size_bytes), _num(c.ways), _num(c.sets), _num(c.line_bytes),
             str(n), str(len(c.cpus)), cpus] for name, c, n, cpus in cache_groups(part)]
    return _table(["name", "type", "size", "ways", "sets", "line", "count", "cpus/inst", "cpus"], rows)


def _notes_sections(part: CpuPart) -> list[str]:
    """The PMUs, the flags and the notes for DL work, each a section where there is any."""
    lines: list[str] = []
    for title, body in (("Interconnect / uncore PMUs", [f"  {p.name}: {p.kind}" for p in part.pmus]),
                        ("Flags", [f"  ! {f.code}: {f.message}" for f in part.flags]),
                        ("For DL work", [f"  - {n}" for n in part.notes()])):
        if body:
            lines += ["", title, *body]
    return lines


def _num(n: int | None) -> str:
    return "?" if n is None else str(n)


def decode_text(d: dict[str, object]) -> str:
    """A decoded register as 'field  value' lines."""
    lines = [f"{d['register']} = {d['value']}"]
    for k, v in d.items():
        if k in ("register", "value"):
            continue
        if k == "layouts" and isinstance(v, list):
            for lay in v:
                lines.append(f"  layout {lay['layout']}: line {lay['line_bytes']} B, {plural(lay['ways'], 'way')}, "
                             f"{plural(lay['sets'], 'set')} = {size_text(lay['size_bytes'])}")
                if lay["implausible"]:
                    lines.append(f"    ! implausible in this layout: {'; '.join(lay['implausible'])}")
            continue
        lines.append(f"  {k:<16} {'-' if v is None else v}")
    return "\n".join(lines)


def kinds_summary(kinds: Sequence[CoreKind]) -> str:
    """'3× Cortex-A510, 2× Cortex-A715, ...'."""
    return ", ".join(f"{len(k.cpus)}× {k.name}" for k in kinds)
