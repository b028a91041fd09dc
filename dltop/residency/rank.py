"""Which files a folder lists (its top few by each sort key), in memory bounded by the number of folders, not
files: `TopFiles` as a scan offers files one by one."""

from __future__ import annotations

import heapq
from typing import Any

from dltop.model.datasets import ResidencyNode
from dltop.residency.walk import FolderTotals, join_path


def _size_key(acc: FolderTotals) -> tuple[int, str]:
    """The order folders give up their files in when the budget runs out: least data first, then by path."""
    return (acc.data, acc.path)


# The keys a folder's files can be sorted by, each meaning "shown first": most data, most resident, coldest (the
# lowest resident share; among equals the most data; files with no data to see last).
FILE_SORT_KEYS = ("size", "resident", "pct")


def file_score(key: str, data: int, dres: int, dunknown: int) -> Any:
    """A file's score by sort `key`, higher shown first: its data, its resident data, or, coldest first, the lowest
    resident share of what can be seen, then the most data (a file with nothing to see last)."""
    if key == "size":
        return data
    if key == "resident":
        return dres
    return (-dres / (data - dunknown) if data > dunknown else -2.0, data)


class TopFiles:
    """Each folder's top `n` files by each sort key, as the scan offers them one by one: a heap per folder and
    key, so a folder of a million files keeps a few entries, never a million. The dataset's whole `budget`
    bounds the entries held: past twice that, the folders with the least data (the one being scanned aside)
    drop their files until it fits again, and a folder with no more data than one dropped lists none at the end
    either, so the files listed are those of the biggest folders. Only where one folder alone is past the budget
    is `n` halved. Ties go to the lower inode, so an unchanged folder lists the same files on every scan."""

    def __init__(self, n: int, keys: tuple[str, ...], budget: int) -> None:
        self.n, self.keys, self.budget = max(0, n), tuple(k for k in keys if k in FILE_SORT_KEYS), max(0, budget)
        self._heaps: dict[FolderTotals, tuple[list[Any], ...]] = {}
        self._held = 0  # entries in all heaps (a file in two heaps counted twice)
        self._seq = 0  # makes heap items unique, so two entries are never compared
        self.dropped: set[FolderTotals] = set()  # folders whose files are not listed: the budget went to bigger ones
        self._floor: tuple[int, str] | None = None  # (data, path) of the biggest folder dropped

    def offer(self, acc: FolderTotals, dir_path: str, name: str, dfd: int | None, ino: int, size: int, pages: int, data: int,
              res: int, dres: int, dirty: int = 0, wb: int = 0, rev: int = 0, unknown: int = 0,
              dunknown: int = 0) -> None:
        """One counted file of folder `acc`, with its numbers; kept only while it is in a top `n`."""
        n = self.n
        if n == 0 or acc in self.dropped:
            return
        heaps = self._heaps.get(acc)
        if heaps is None:
            heaps = self._heaps[acc] = tuple([] for _ in self.keys)
        entry = None
        tie = -ino
        for key, heap in zip(self.keys, heaps, strict=True):
            score = file_score(key, data, dres, dunknown)
            full = len(heap) >= n
            if full:
                low = heap[0]
                if score < low[0] or (score == low[0] and tie <= low[1]):
                    continue
            if entry is None:
                entry = (join_path(dir_path, name, dfd), size, pages, res, dirty, unknown, wb, rev, data, dres, dunknown)
            self._seq += 1
            if full:
                heapq.heapreplace(heap, (score, tie, self._seq, entry))
            else:
                heapq.heappush(heap, (score, tie, self._seq, entry))
                self._held += 1
        if self._held > 2 * self.budget:
            self._drop_smallest(self.budget, keep=acc)
            while self._held > 2 * self.budget:
                self._shrink(self.n // 2)

    def _drop_smallest(self, target: int, keep: FolderTotals | None = None) -> None:
        """Drop the files of the folders with the least data (not `keep`) until at most `target` are held."""
        for acc in sorted((a for a in self._heaps if a is not keep), key=_size_key):
            if self._held <= target:
                return
            self._drop(acc)

    def _drop(self, acc: FolderTotals) -> None:
        self._held -= sum(len(h) for h in self._heaps.pop(acc))
        self.dropped.add(acc)
        key = _size_key(acc)
        if self._floor is None or key > self._floor:
            self._floor = key

    def _shrink(self, n: int) -> None:
        self.n = n
        held = 0
        for heaps in self._heaps.values():
            for heap in heaps:
                if len(heap) > n:
                    heap[:] = sorted(heap)[len(heap) - n:]  # ascending: still a heap
                held += len(heap)
        self._held = held

    def rows(self) -> dict[FolderTotals, tuple[ResidencyNode, ...]]:
        """Each folder's files: the top `n` by each key (the first key's order, then the others' additions), for
        the biggest folders that fit the budget."""
        floor = self._floor
        for acc in [a for a in self._heaps if floor is not None and _size_key(a) <= floor]:
            self._drop(acc)
        while self._held > self.budget:
            if len(self._heaps) > 1:
                self._drop_smallest(self.budget)
            else:
                self._shrink(self.n // 2)
        rows = {acc: _file_rows(heaps, self.n) for acc, heaps in self._heaps.items()}
        return {acc: files for acc, files in rows.items() if files}


def _file_rows(heaps: tuple[list[Any], ...], n: int) -> tuple[ResidencyNode, ...]:
    """A folder's top `n` files by each key, each file once: the first key's order, then the others' additions."""
    seen: dict[int, ResidencyNode] = {}
    for heap in heaps:
        for item in heapq.nlargest(n, heap):
            e = item[3]
            if id(e) not in seen:
                seen[id(e)] = ResidencyNode(
                    path=e[0], files=1, size_bytes=e[1], pages=e[2], resident_pages=e[3], dirty_pages=e[4],
                    unknown_pages=e[5], writeback_pages=e[6], recently_evicted_pages=e[7], data_pages=e[8],
                    data_resident_pages=e[9], data_unknown_pages=e[10])
    return tuple(seen.values())
