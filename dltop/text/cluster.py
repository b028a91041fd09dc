"""The cluster as plain text and JSON: `dltop cluster`'s tables, the Cluster tab's cells, a node's detail and the
commands to run on other nodes. Shown by the CLI and the TUI alike, so it lives below both."""

from __future__ import annotations

import re
import shlex
from typing import Any

from dltop.fmt import human_bytes, human_duration, plural, printable
from dltop.model.base import Unavailable, to_dict
from dltop.model.cluster import (
    SAFE_WORD,
    ClusterDataset,
    ClusterGpu,
    ClusterJob,
    ClusterNode,
    ClusterPart,
    ClusterRank,
)

COLD_BELOW = 0.99  # a node holding less of a dataset than this is cold for it: a warm there is offered
SORTS = ("coldest", "name", "down first")  # the Cluster tab's orders, `s` cycles them


def pct(v: float | int | Unavailable | None) -> str:
    """0..1 as a whole percent; n/a where unknown."""
    return f"{100 * v:.0f}%" if isinstance(v, int | float) else "n/a"


def seconds(v: float | Unavailable | None) -> str:
    """A step time: milliseconds under a second (a step is often 50 ms), else as human_duration."""
    if not isinstance(v, float):
        return "n/a"
    if v < 1:
        return f"{1000 * v:.0f} ms"
    return f"{v:.2f} s" if v < 60 else human_duration(v)  # 1.62 s, not "1s": ranks differ by tenths


def share(part: int | Unavailable, whole: int | Unavailable) -> str:
    """part / whole as a percent; n/a where either is unknown or whole is 0."""
    if isinstance(part, int) and isinstance(whole, int) and whole > 0:
        return f"{100 * part / whole:.0f}%"
    return "n/a"


def residency_cell(d: ClusterDataset | None) -> str:
    """A dataset's cell in a node's row: its resident share, '-' where the node does not watch it, 'down' where
    its exporter could not scan it."""
    if d is None:
        return "-"
    if d.up is False:
        return "down"
    return pct(d.share)


def coldest_ratio(node: ClusterNode) -> float:
    """The node's lowest resident share over its datasets (2.0 where it has none known: sorted last)."""
    known = [r for d in node.datasets if (r := d.share) is not None]
    return min(known) if known else 2.0


def sort_nodes(part: ClusterPart, order: str = "coldest", dataset: str | None = None) -> list[ClusterNode]:
    """The nodes in one of SORTS; coldest: the lowest share of `dataset` (or of any dataset) first, ties by name."""
    nodes = list(part.nodes)
    if order == "name":
        return sorted(nodes, key=lambda n: (n.name, n.instance, n.job))
    if order == "down first":
        return sorted(nodes, key=lambda n: (n.up, n.name, n.instance, n.job))

    def cold(n: ClusterNode) -> float:
        if dataset is None:
            return coldest_ratio(n)
        d = n.dataset(dataset)
        r = d.share if d is not None else None
        return 2.0 if r is None else r

    return sorted(nodes, key=lambda n: (cold(n), n.name, n.instance, n.job))


def gpu_cells(node: ClusterNode) -> tuple[str, str, str]:
    """(used/total GPU memory, lost GPUs, mean utilisation) of a node's GPUs, as Prometheus summed them."""
    if not isinstance(node.gpus_read, int) or node.gpus_read == 0:
        return ("0 GPUs" if node.gpu_count == 0 else "n/a"), "", ""
    lost = node.gpus_lost
    return used_of(node.gpu_memory_used_bytes, node.gpu_memory_total_bytes), (str(lost) if lost else ""), \
        pct(node.gpu_utilization)


_SCALE = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40, "PiB": 1 << 50}


def used_of(used: int | Unavailable, total: int | Unavailable) -> str:
    """'540/640 GiB': both in the unit of the total (a narrow column at 80x24); n/a where either is unknown."""
    if not isinstance(used, int) or not isinstance(total, int):
        return "n/a"
    unit = human_bytes(total).rsplit(" ", 1)[-1]
    scale = _SCALE.get(unit, 1)
    fmt = ".0f" if unit == "B" or total / scale >= 100 else ".1f"
    return f"{used / scale:{fmt}}/{total / scale:{fmt}} {unit}"


def kv_cell(node: ClusterNode) -> str:
    """The fullest KV-cache pool of the node's inference servers ('' where it runs none)."""
    usage = [s.kv_usage for s in node.servers if isinstance(s.kv_usage, float)]
    return pct(max(usage)) if usage else ("n/a" if node.servers else "")


NODE_HEADERS = ("node", "up", "GPU mem", "lost", "util", "cache", "avail", "PSI", "hints", "KV")
DATASETS_AT = 2  # the dataset columns come after the node and its state: the tab's headline stays in 80 columns


def node_headers(datasets: tuple[str, ...]) -> tuple[str, ...]:
    """A node row's headers: NODE_HEADERS with one [N] column per dataset after `up`."""
    return (*NODE_HEADERS[:DATASETS_AT], *(f"[{i + 1}]" for i in range(len(datasets))), *NODE_HEADERS[DATASETS_AT:])


def node_row(node: ClusterNode, datasets: tuple[str, ...]) -> tuple[str, ...]:
    """A node's cells under node_headers(datasets)."""
    cells = node_cells(node)
    shares = (residency_cell(node.dataset(p)) if node.up else "n/a" for p in datasets)  # down: gone or stale
    return (*cells[:DATASETS_AT], *shares, *cells[DATASETS_AT:])


def node_cells(node: ClusterNode) -> tuple[str, ...]:
    """A node's row under NODE_HEADERS (text from Prometheus as it is: the caller escapes it)."""
    mem, lost, util = gpu_cells(node)
    if not node.up:
        return (node.name, "DOWN", mem, lost, util, "n/a", "n/a", "n/a", "", kv_cell(node))
    return (node.name, "up", mem, lost, util, share(node.memory_cached_bytes, node.memory_total_bytes),
            share(node.memory_available_bytes, node.memory_total_bytes), pct(node.pressure_memory_some),
            str(len(node.hints)) if node.hints else "", kv_cell(node))


def summary_line(part: ClusterPart) -> str:
    """'12 nodes (1 down), 96 GPUs (2 lost), 1 job · 14 queries, 0.04 s' (the width of 80 columns)."""
    jobs = sum(1 for j in part.jobs if j.job_id)  # the ranks without a job id are no job
    out = f"{_nodes_said(part.nodes)}, {plural(jobs, 'job')}"  # the datasets: their legend is below the table
    loose = sum(j.rank_count or len(j.ranks) for j in part.jobs if not j.job_id)
    if loose:  # the jobs table lists them as one "(no job id)" row: "0 jobs" alone beside it read as nothing
        out += f" + {plural(loose, 'rank')} without a job id"
    return out + f" · {part.queries} queries, {part.query_s:.2f} s"


def _nodes_said(nodes: tuple[ClusterNode, ...]) -> str:
    """'12 nodes (1 down), 96 GPUs (2 lost)'."""
    down = sum(1 for n in nodes if not n.up)
    gpus = sum(n.gpus_read for n in nodes if isinstance(n.gpus_read, int))
    lost = sum(n.gpus_lost for n in nodes)
    return (f"{len(nodes)} nodes" + (f" ({down} down)" if down else "") + f", {gpus} GPUs"
            + (f" ({lost} lost)" if lost else ""))


NO_JOB_ID = "(no job id)"  # the jobs table's group of the ranks whose probe gave no job id


def job_rows(part: ClusterPart) -> list[tuple[str, ...]]:
    """(job, ranks, nodes, worst data wait, slowest step, the slowest rank) per job, the ranks without a job id
    last as one group."""
    rows: list[tuple[str, ...]] = []
    names = {n.instance: n.name for n in part.nodes}  # the node label where the scrape config gives one
    for j in part.jobs:
        wait = pct(j.most_waiting.data_wait_ratio) if j.most_waiting else "n/a"
        step = seconds(j.slowest.step_s) if j.slowest else "n/a"
        who = _slowest_rank(j, names)
        name = j.job_id or NO_JOB_ID
        if j.uid and any(o.uid != j.uid and o.job_id == j.job_id for o in part.jobs):
            name += f" (uid {j.uid})"  # two users' jobs under one job id: never one job, each named
        rows.append((name, str(j.rank_count), str(j.node_count), wait, step, who))
    return rows


def _slowest_rank(j: ClusterJob, names: dict[str, str]) -> str:
    if not j.slowest:
        return "n/a"
    where = names.get(j.slowest.instance, j.slowest.instance)
    if not j.job_id:
        return f"pid {j.slowest.pid or '?'} on {where}"  # no job: its rank says nothing
    return f"rank {j.slowest.rank or '?'} on {where}"


JOB_HEADERS = ("job", "ranks", "nodes", "max wait", "slowest", "slowest rank")


def _host(node: ClusterNode) -> str:
    """The name a scheduler knows the node by: its node label, else the instance without its port."""
    if node.node:
        return node.node
    host = node.instance.rsplit(":", 1)[0] if node.instance.count(":") == 1 else node.instance
    return host.strip("[]")


SSH_LINES_UP_TO = 8  # more cold hosts than this get one pdsh line, not an ssh line each
_NUMBERED = re.compile(r"(.*?)(\d+)")


def hostlist(hosts: list[str]) -> str:
    """Host names as one Slurm hostlist expression: 'gpu-0001,gpu-0002,gpu-0004' -> 'gpu-[0001-0002,0004]'
    (zero-padded numbers keep their width; names not ending in a number are listed as they are)."""
    groups: dict[tuple[str, int], set[int]] = {}
    plain: list[str] = []
    for h in dict.fromkeys(hosts):
        m = _NUMBERED.fullmatch(h)
        if m is None or len(m.group(2)) > 18:
            plain.append(h)
            continue
        digits = m.group(2)
        width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0  # 0: not zero-padded
        groups.setdefault((m.group(1), width), set()).add(int(digits))
    return ",".join([_ranged(prefix, width, numbers) for (prefix, width), numbers in sorted(groups.items())] + plain)


def _ranged(prefix: str, width: int, numbers: set[int]) -> str:
    """('gpu-', 4, {1, 2, 4}) -> 'gpu-[0001-0002,0004]'; ('gpu-', 0, {7}) -> 'gpu-7'."""
    ranges = _runs(numbers)
    if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
        return f"{prefix}{ranges[0][0]:0{width}d}"
    return prefix + "[" + ",".join(f"{a:0{width}d}" if a == b else f"{a:0{width}d}-{b:0{width}d}" for a, b in ranges) + "]"


def _runs(numbers: set[int]) -> list[list[int]]:
    """The numbers as [first, last] runs of consecutive ones, ascending."""
    ranges: list[list[int]] = []
    for n in sorted(numbers):
        if ranges and n == ranges[-1][1] + 1:
            ranges[-1][1] = n
        else:
            ranges.append([n, n])
    return ranges


def warm_commands(part: ClusterPart, dataset: str) -> tuple[list[str], list[str]]:
    """(commands, notes): the lines that warm `dataset` on each node where it is cold (srun for the hosts at once,
    kubectl exec per pod, ssh per host, or one pdsh line past SSH_LINES_UP_TO hosts), each word shell-quoted; a
    node or path whose name is not one safe word on a command line is left out with a note, never pasted in. The
    nodes that could not be judged (down, the dataset not scanned there, its share unknown) are named in a note:
    warm "on every node" is said only when every node was judged."""
    notes: list[str] = []
    if any(not ch.isprintable() for ch in dataset):
        return [], [f"{printable(dataset)}: the path holds control characters: no command offered"]
    cold, unjudged = judge(part, dataset)
    hosts, pods = _warm_targets(cold, notes)
    path = shlex.quote(dataset)
    out = _host_commands(hosts, path) if hosts else []
    out.extend(f"kubectl exec -n {ns} {pod} -- dltop warm {path}" for ns, pod in pods)
    if not cold:
        notes.append(f"{printable(dataset)} is warm on every node that watches it" if not unjudged else
                     f"{printable(dataset)} is warm on every node that could be judged")
    for why, nodes in unjudged.items():
        notes.append(f"not judged: {plural(len(nodes), 'node')} {why}: {printable(hostlist([_host(n) for n in nodes]))}")
    return out, notes


def _host_commands(hosts: list[str], path: str) -> list[str]:
    """One srun line for the hosts at once, then an ssh line per host, or one pdsh line past SSH_LINES_UP_TO."""
    # A hostlist ('gpu-[0000-0029,0031-0255]') as Slurm and pdsh read it, quoted: [ ] are globs to a shell.
    listed = shlex.quote(hostlist(hosts))
    out = [f"srun --nodelist={listed} --ntasks-per-node=1 dltop warm {path}"]
    if len(hosts) > SSH_LINES_UP_TO:
        return [*out, f"pdsh -w {listed} dltop warm {path}"]
    return out + [f"ssh {h} dltop warm {path}" for h in hosts]


UNJUDGED_DOWN = "down"
UNJUDGED_NOT_SCANNED = "could not scan it"
UNJUDGED_UNKNOWN = "serve no resident share for it"


def judge(part: ClusterPart, dataset: str) -> tuple[list[ClusterNode], dict[str, list[ClusterNode]]]:
    """(the nodes where `dataset` is cold, the nodes that could not be judged by why): a down node's numbers are
    gone or stale, so it is never judged warm; a node that does not watch the dataset is neither."""
    cold: list[ClusterNode] = []
    unjudged: dict[str, list[ClusterNode]] = {}
    for n in part.nodes:
        d = n.dataset(dataset)
        if not n.up:
            why = UNJUDGED_DOWN
        elif d is None:
            continue
        elif d.up is False:
            why = UNJUDGED_NOT_SCANNED
        elif d.share is None:
            why = UNJUDGED_UNKNOWN
        else:
            if d.share < COLD_BELOW:
                cold.append(n)
            continue
        unjudged.setdefault(why, []).append(n)
    return cold, unjudged


def _warm_targets(cold: list[ClusterNode], notes: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """The hosts and the (namespace, pod)s of the cold nodes whose names are one safe word each."""
    hosts, pods = [], []
    for n in cold:
        host = _host(n)
        if n.pod and n.namespace and SAFE_WORD.fullmatch(n.pod) and SAFE_WORD.fullmatch(n.namespace):
            pods.append((n.namespace, n.pod))
        elif SAFE_WORD.fullmatch(host) and "," not in host:  # a comma would split it in the hostlist
            hosts.append(host)
        else:
            notes.append(f"{printable(n.instance)}: its name is not a plain host name: no command offered")
    return hosts, pods


def node_detail(node: ClusterNode) -> list[str]:
    """A node's numbers, per GPU, per dataset, per rank: what its own exporter serves (Enter on a node)."""
    names = {g.name for g in node.gpus}
    shared = names.pop() if len(names) == 1 else None
    lines = _node_head(node)
    if shared:
        lines[-1] += f" ({shared})"  # said once, not on each GPU's line
    lines.extend(line for g in node.gpus for line in _gpu_lines(g, shared))
    if node.datasets:
        lines.append("datasets:")
    lines.extend(map(_dataset_line, node.datasets))
    if node.ranks:
        lines.append("training processes:")
    lines.extend(map(_rank_line, node.ranks))
    lines.extend(f"inference server {s.server}: KV cache {pct(s.kv_usage)} of {_b(s.kv_capacity_bytes)}"
                 for s in node.servers)
    lines.extend(f"hint {h.severity}: {h.id}" for h in node.hints)
    return lines


def _dataset_line(d: ClusterDataset) -> str:
    if d.up is False:
        return f"  {d.dataset}: down ({d.reason or 'not scanned'})"
    # The share is pages over pages; the page cache its data holds is whole pages: never divided by the apparent size
    return (f"  {d.dataset}: {pct(d.share)} of {_b(d.size_bytes)} resident "
            f"({_b(d.resident_bytes)} of page cache)")


def _rank_line(r: ClusterRank) -> str:
    return (f"  pid {r.pid} rank {r.rank or '?'} job {r.job_id or '?'}: data wait {pct(r.data_wait_ratio)}, "
            f"step {seconds(r.step_s)}, {r.steps if isinstance(r.steps, int) else 'n/a'} steps")


def _node_head(node: ClusterNode) -> list[str]:
    """A node's state, memory and GPU totals (node_detail's first lines)."""
    lines = [f"{node.name}  ({node.instance}, job {node.job})",
             "up" if node.up else f"DOWN: {node.down_reason}"]
    if isinstance(node.snapshot_age_s, float):
        lines.append(f"newest reading {human_duration(node.snapshot_age_s)} old")
    if node.sources_down:
        lines.append("sources down: " + ", ".join(node.sources_down))
    lines.append(f"memory: total {_b(node.memory_total_bytes)}, available {_b(node.memory_available_bytes)}, "
                 f"page cache {_b(node.memory_cached_bytes)}, dirty {_b(node.memory_dirty_bytes)}; "
                 f"PSI some {pct(node.pressure_memory_some)}, full {pct(node.pressure_memory_full)}")
    lines.append(f"GPUs: {node.gpu_count if isinstance(node.gpu_count, int) else 'n/a'}"
                 + (f", {_b(node.gpu_memory_used_bytes)} of {_b(node.gpu_memory_total_bytes)} used, util "
                    f"{pct(node.gpu_utilization)}" if isinstance(node.gpus_read, int) and node.gpus_read else ""))
    if not node.detailed:
        lines.append("  per GPU and per rank: not in this refresh (the tab reads them for the node Enter opens)")
    return lines


def _gpu_lines(g: ClusterGpu, shared: str | None) -> list[str]:
    """One GPU of node_detail: its state and memory, then its memory by use, the biggest use first."""
    state = "up" if g.up is True else f"LOST ({g.down_reason or 'down'})" if g.up is False else "n/a"
    name = f" {g.name}" if g.name and not shared else ""
    mem = used_of(g.memory_used_bytes, g.memory_total_bytes)
    lines = [f"  GPU {g.gpu}{name} {state}: {mem} used, util {pct(g.utilization)}"]
    if g.memory_by_use:
        lines.append("    " + ", ".join(f"{u} {human_bytes(b)}" for u, b in
                                        sorted(g.memory_by_use.items(), key=lambda ub: (-ub[1], ub[0]))))
    return lines


def _b(v: int | Unavailable) -> str:
    return human_bytes(v) if isinstance(v, int) else "n/a"


def cluster_json(part: ClusterPart) -> dict[str, Any]:
    """`dltop cluster --json`: every value from Prometheus, or {"unavailable": reason} (never a 0 for unknown)."""
    return {
        "prometheus": part.url, "selector": part.selector, "queried_at": part.queried_at,
        "query_s": part.query_s, "queries": part.queries,
        "nodes": [node_json(n) for n in part.nodes],
        "jobs": [{"job_id": j.job_id, "uid": j.uid, "rank_count": j.rank_count, "node_count": j.node_count,
                  "ranks": [to_dict(r) for r in j.ranks],
                  "slowest": to_dict(j.slowest), "most_waiting": to_dict(j.most_waiting)} for j in part.jobs],
        "notes": list(part.notes),
    }


def node_json(n: ClusterNode) -> dict[str, Any]:
    """One node of `cluster_json`."""
    return {
        "instance": n.instance, "job": n.job, "node": n.node, "up": n.up, "down_reason": n.down_reason,
        "snapshot_age_s": to_dict(n.snapshot_age_s),
        "memory": {"total_bytes": to_dict(n.memory_total_bytes), "available_bytes": to_dict(n.memory_available_bytes),
                   "cached_bytes": to_dict(n.memory_cached_bytes), "dirty_bytes": to_dict(n.memory_dirty_bytes),
                   "pressure_some_avg10_ratio": to_dict(n.pressure_memory_some),
                   "pressure_full_avg10_ratio": to_dict(n.pressure_memory_full)},
        "gpu_count": to_dict(n.gpu_count), "detailed": n.detailed,
        "gpu_totals": {"gpus_read": to_dict(n.gpus_read), "memory_used_bytes": to_dict(n.gpu_memory_used_bytes),
                       "memory_total_bytes": to_dict(n.gpu_memory_total_bytes),
                       "utilization": to_dict(n.gpu_utilization)},
        "gpus": [to_dict(g) for g in n.gpus],
        "datasets": [{"dataset": d.dataset, "up": to_dict(d.up), "size_bytes": to_dict(d.size_bytes),
                      "resident_bytes": to_dict(d.resident_bytes), "resident_ratio": to_dict(d.resident_ratio),
                      "reason": d.reason} for d in n.datasets],
        "jobs": [to_dict(r) for r in n.ranks],
        "hints": [to_dict(h) for h in n.hints],
        "servers": [to_dict(s) for s in n.servers],
        "sources_down": list(n.sources_down),
    }


def cluster_text(part: ClusterPart) -> list[str]:
    """`dltop cluster`'s text: the summary, a row per node with each dataset's residency, the jobs, the notes."""
    datasets = part.datasets
    rows = [node_row(n, datasets) for n in sort_nodes(part)]
    headers = node_headers(datasets)
    lines = [summary_line(part), *_table(headers, rows)]
    lines.extend(f"[{i + 1}] {p}" for i, p in enumerate(datasets))
    if part.jobs:
        lines.append("")
        lines.extend(_table(JOB_HEADERS, job_rows(part)))
    lines.extend(f"note: {n}" for n in part.notes)
    return lines


def _table(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(h), *(len(printable(r[i])) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            for row in (headers, *(tuple(map(printable, r)) for r in rows))]
