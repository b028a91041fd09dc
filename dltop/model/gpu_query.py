"""Which GPU processes to show, in which order: a filter, a sort column, a tree of ranks under their launcher.

UI-free and pure, so the live TUI, a replay and the CLI list the same rows from the same Snapshot. Every sort has
a tie-break ending in pid and GPU, so rows never swap between ticks; a row's key is (place, pid, start time), so a
cursor found again by key after a sort stays on its process, and a reused pid is another row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from dltop.model.base import Unavailable
from dltop.model.gpu import GpuDevice, GpuProcess

# Sort columns in the order `o` cycles them; each one's natural direction (True: biggest first, as nvitop does).
SORTS: dict[str, bool] = {"memory": True, "gpu_util": True, "cpu": True, "host_rss": True, "time": True,
                          "pid": False, "user": False, "command": False, "gpu": False}
SORT_LABELS = {"memory": "GPU memory", "gpu_util": "SM %", "cpu": "CPU %", "host_rss": "host RSS",
               "time": "running time", "pid": "pid", "user": "user", "command": "command", "gpu": "GPU"}


@dataclass(frozen=True)
class ProcessQuery:
    """What the user asked of the process table: a filter text (pid, user, command, GPU), a sort column
    (`SORTS`), reversed or not, and whether ranks are grouped under their launcher."""

    filter: str = ""
    sort: str = "memory"
    reverse: bool = False
    tree: bool = False

    def next_sort(self) -> ProcessQuery:
        """The query sorted by the next column of `SORTS` (its natural direction)."""
        names = list(SORTS)
        at = names.index(self.sort) if self.sort in names else -1
        return replace(self, sort=names[(at + 1) % len(names)], reverse=False)

    def describe(self) -> str:
        """'sort: GPU memory ↓' (and the filter and tree when set), for the table's title line."""
        biggest_first = SORTS.get(self.sort, True) != self.reverse
        bits = [f"sort: {SORT_LABELS.get(self.sort, self.sort)} {'↓' if biggest_first else '↑'}"]
        if self.tree:
            bits.append("tree")
        if self.filter:
            bits.append(f"filter: {self.filter}")
        return "  ".join(bits)


@dataclass(frozen=True)
class ProcessRow:
    """One row of the table: a process where it runs ("0", or "0/1.0": GPU 0, MIG GPU instance 1, compute
    instance 0, as nvidia-smi numbers them), or (process None) the launcher a group of ranks shares."""

    key: str
    place: str
    process: GpuProcess | None
    depth: int = 0  # 0: at the top; 1: under its launcher or its parent GPU process
    last: bool = False  # the last row under its launcher (drawn └ rather than ├)
    pid: int = 0  # the process's pid, or the launcher's
    children: int = 0  # a launcher's ranks on the GPUs: its children that hold GPU memory (a rank on two GPUs once)
    user: str | None = None  # a launcher's user and command, as its ranks' /proc read them (None: not known)
    command: str | None = None


def _places(g: GpuDevice) -> list[tuple[str, int, tuple[GpuProcess, ...]]]:
    """(place, device order, processes) of a GPU: a process NVML lists under both the GPU and one of its MIG
    instances is shown once, under the instance (labelled by its GPU and compute instance ids)."""
    out: list[tuple[str, int, tuple[GpuProcess, ...]]] = []
    under_mig: set[int] = set()
    for m in g.mig_devices:
        if isinstance(m.processes, Unavailable):
            continue
        gi, ci = m.gpu_instance_id, m.compute_instance_id
        label = f"{g.index}/{gi}.{ci}" if gi is not None and ci is not None else f"{g.index}/m{m.mig_index}"
        out.append((label, g.index * 1000 + 1 + m.mig_index, m.processes))
        under_mig.update(p.pid for p in m.processes)
    if isinstance(g.processes, tuple):  # a process under an instance: its row says it, with the instance's figure
        out.insert(0, (str(g.index), g.index * 1000, tuple(p for p in g.processes if p.pid not in under_mig)))
    return out


def _matching(devices: Sequence[GpuDevice], text: str) -> list[tuple[str, int, GpuProcess]]:
    """(place, device order, process) of every process whose pid, user, command or place holds `text`."""
    needle = text.casefold()
    out = []
    for g in devices:
        for place, order, procs in _places(g):
            out += [(place, order, p) for p in procs if not needle
                    or any(needle in hay.casefold() for hay in (str(p.pid), p.user or "", p.command or "", place))]
    return out


def _value(sort: str) -> Callable[[tuple[str, int, GpuProcess]], Any]:
    """The sort column's value of a (place, device order, process); None sorts last whichever the direction."""
    def get(item: tuple[str, int, GpuProcess]) -> Any:
        place, order, p = item
        return {"memory": p.used_bytes, "gpu_util": p.gpu_util_percent, "cpu": p.cpu_percent,
                "host_rss": p.host_rss_bytes, "time": None if p.started_at is None else -p.started_at,
                "pid": p.pid, "user": p.user, "command": p.command, "gpu": order}[sort]

    return get


def _ordered(items: list[tuple[str, int, GpuProcess]], query: ProcessQuery) -> list[tuple[str, int, GpuProcess]]:
    """Sorted by the query's column, ties by pid then GPU (two stable sorts: the tie-break first)."""
    items = sorted(items, key=lambda it: (it[2].pid, it[1]))
    value = _value(query.sort if query.sort in SORTS else "memory")
    descending = SORTS.get(query.sort, True) != query.reverse
    known = [it for it in items if value(it) is not None]
    unknown = [it for it in items if value(it) is None]
    return sorted(known, key=value, reverse=descending) + unknown


def row_key(place: str, p: GpuProcess) -> str:
    """A row's key: where, which pid, and which process under that pid (its start time)."""
    return f"{place}:{p.pid}:{p.start_time_ticks if p.start_time_ticks is not None else '?'}"


def select_processes(gpus: Sequence[GpuDevice] | GpuDevice | Unavailable | None,
                     query: ProcessQuery = ProcessQuery()) -> list[ProcessRow]:
    """The rows the query asks for, in order: every process on every GPU and MIG instance that matches the
    filter, sorted; in a tree, the ranks a launcher started (same parent, two or more) under a row for it, and a
    GPU process started by another GPU process under that one."""
    if gpus is None or isinstance(gpus, Unavailable):
        return []
    items = _ordered(_matching((gpus,) if isinstance(gpus, GpuDevice) else gpus, query.filter), query)
    if not query.tree:
        return [ProcessRow(row_key(place, p), place, p, pid=p.pid) for place, _, p in items]
    return _tree(items)


def _tree(items: list[tuple[str, int, GpuProcess]]) -> list[ProcessRow]:
    """Groups in the order of their first (best-sorted) member; members in sort order under their head."""
    on_gpu = {p.pid for _, _, p in items}
    by_parent, under = _groups(items, on_gpu)
    rows: list[ProcessRow] = []
    done: set[int] = set()  # heads drawn
    for place, _, p in items:
        if p.pid in under:
            head = under[p.pid]
            if head in on_gpu or head in done:
                continue  # drawn under its head
            done.add(head)
            rows += _launched(head, by_parent[head])
            continue
        rows.append(ProcessRow(row_key(place, p), place, p, pid=p.pid))
        if p.pid in by_parent and p.pid not in done:
            done.add(p.pid)
            rows += _members([k for k in by_parent[p.pid] if under.get(k[2].pid) == p.pid])
    return rows


def _launched(head: int, kids: list[tuple[str, int, GpuProcess]]) -> list[ProcessRow]:
    """A launcher's row (its user and command as its ranks' /proc read them), then its ranks under it."""
    first = kids[0][2]
    return [ProcessRow(f"launcher:{head}", "", None, pid=head, children=len({k[2].pid for k in kids}),
                       user=first.parent_user, command=first.parent_command), *_members(kids)]


def _groups(items: list[tuple[str, int, GpuProcess]], on_gpu: set[int],
            ) -> tuple[dict[int, list[tuple[str, int, GpuProcess]]], dict[int, int]]:
    """The processes by parent, and the head each is shown under. A group is headed by a GPU process (its children
    nest under its row) or by a launcher that holds no GPU memory itself (a torchrun agent, an mp.spawn parent)
    with two or more ranks."""
    by_parent: dict[int, list[tuple[str, int, GpuProcess]]] = {}
    for it in items:
        ppid = it[2].ppid
        # pid 1 (init, or a container's first process) adopts orphans and starts services: not a launcher
        if ppid is not None and ppid > 1 and ppid != it[2].pid:
            by_parent.setdefault(ppid, []).append(it)
    under: dict[int, int] = {}  # pid -> the head it is shown under
    for ppid, kids in by_parent.items():
        if ppid in on_gpu or len({k[2].pid for k in kids}) >= 2:  # two ranks, not one rank on two GPUs
            for _, _, p in kids:
                under.setdefault(p.pid, ppid)
    return by_parent, under


def _members(kids: list[tuple[str, int, GpuProcess]]) -> list[ProcessRow]:
    return [ProcessRow(row_key(place, p), place, p, depth=1, last=i == len(kids) - 1, pid=p.pid)
            for i, (place, _, p) in enumerate(kids)]


def find_process(gpus: Sequence[GpuDevice] | Unavailable | None, gpu_index: int, pid: int,
                 start_time_ticks: int | None) -> GpuProcess | None:
    """The process (pid and start time: a reused pid is another) on GPU `gpu_index` or one of its MIG instances."""
    if gpus is None or isinstance(gpus, Unavailable):
        return None
    for g in gpus:
        if g.index != gpu_index:
            continue
        for _, _, procs in _places(g):
            for p in procs:
                if p.pid == pid and p.start_time_ticks == start_time_ticks:
                    return p
    return None


def process_history(history: Sequence[Any], gpu_index: int, pid: int,
                    start_time_ticks: int | None) -> list[tuple[float, GpuProcess]]:
    """(time, the process) in each Snapshot of `history` (oldest first) that lists it on that GPU."""
    out = []
    for snap in history:
        p = find_process(snap.gpus, gpu_index, pid, start_time_ticks)
        if p is not None:
            out.append((snap.ts, p))
    return out
