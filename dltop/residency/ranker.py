"""The dataset watch's file rows: each shown folder's top files by each sort key, chosen as `TopFiles` (rank.py)
chooses them in a scan, but kept between reads: a file whose counts change moves in each key's order in place
(`rerank`), so a read where few files changed costs no sort."""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from operator import neg

from dltop.model.datasets import ResidencyNode
from dltop.residency.folders import VALUES, Folder, values_node
from dltop.residency.rank import FILE_SORT_KEYS, file_score
from dltop.residency.walk import WalkOptions

_Ranked = tuple[object, int, ResidencyNode]  # a file row with its score and tie in one key's order
# A folder keeps this many files past its top n by each key in reserve: a file that falls out of the top n is
# replaced by the next one without ranking the folder again, until the reserve runs out.
RESERVE = 16


class RankedRows:
    """One folder's file rows: per key its best n + RESERVE files as (score, tie, index), in ascending order
    (the best last: bisect finds and places a file in C), the same by index, and the best (score, tie) left out
    of them (None: no file was left out); the rows built from them, while valid."""

    __slots__ = ("n", "cands", "entries", "floors", "nodes", "ranked", "listed")

    def __init__(self, n: int, cands: list[list[tuple[object, int, int]]],
                 floors: list[tuple[object, int] | None]) -> None:
        self.n, self.cands, self.floors = n, cands, floors
        self.entries = [{e[2]: e for e in c} for c in cands]
        self.nodes: dict[int, ResidencyNode] = {}
        self.ranked: list[list[_Ranked]] = []
        self.listed: tuple[ResidencyNode, ...] | None = None


class FileRanker:
    """The file rows of a watched tree's folders, by the sort keys of `options` (`WalkOptions.top_*`)."""

    def __init__(self, options: WalkOptions) -> None:
        self.options = options
        self.keys = tuple(k for k in options.top_keys if k in FILE_SORT_KEYS)

    def rows(self, folders: list[Folder]) -> tuple[int, dict[Folder, tuple[ResidencyNode, ...]]]:
        """Each shown folder's file rows as `TopFiles` (rank.py) chooses them in a scan (its top n files by each key,
        the biggest folders first within the dataset's budget, n halved where one folder alone is past it), and
        that n. A folder's choice is kept until one of its files' counts changes, so a read where nothing
        changed costs no sort."""
        n = self.options.top_files
        if n <= 0 or not self.keys:
            return 0, {}
        owners = self._owners(folders)
        budget = max(0, self.options.top_budget)
        order = sorted(owners, key=lambda o: (sum(g.tot[2] for g in owners[o]), o.path), reverse=True)
        while n > 0:
            out, fits = self._within(order, owners, n, budget)
            if fits or out:
                return n, out
            n //= 2  # the biggest folder alone is past the budget
        return 0, {}

    def _owners(self, folders: list[Folder]) -> dict[Folder, list[Folder]]:
        """Each shown folder, with itself and the folders deeper than max_depth in it."""
        max_depth = self.options.max_depth
        owners: dict[Folder, list[Folder]] = {}
        for f in folders:
            o = f
            while max_depth is not None and o.depth > max_depth and o.parent is not None:
                o = o.parent
            owners.setdefault(o, []).append(f)
        return owners

    def _within(self, order: list[Folder], owners: dict[Folder, list[Folder]], n: int,
                budget: int) -> tuple[dict[Folder, tuple[ResidencyNode, ...]], bool]:
        """The top `n` rows of the biggest folders first, while they fit in `budget` rows; and whether all did."""
        out: dict[Folder, tuple[ResidencyNode, ...]] = {}
        held = 0
        for o in order:
            group = owners[o]
            if len(group) == 1:
                lists, listed = self._folder_top(o, n)
            else:
                lists = [heapq.nlargest(n, (e for g in group for e in self._folder_top(g, n)[0][k]),
                                        key=lambda e: (e[0], e[1])) for k in range(len(self.keys))]
                listed = _union(lists)
            count = sum(len(x) for x in lists)
            if held + count > budget:
                return out, False  # this folder and every smaller one list none
            held += count
            if listed:
                out[o] = listed
        return out, True

    def _folder_top(self, f: Folder, n: int) -> tuple[list[list[_Ranked]], tuple[ResidencyNode, ...]]:
        """Folder `f`'s top `n` files by each key (score, tie, row), and their rows in order; kept in `f.top`."""
        t = f.top
        if t is None or t.n != n or any(len(c) < n and fl is not None for c, fl in zip(t.cands, t.floors,
                                                                                          strict=True)):
            t = f.top = self._rank(f, n)  # first, or a key's reserve ran out: rank the whole folder
        if t.listed is None:
            nodes = t.nodes
            ranked = []
            for cand in t.cands:
                row = []
                for score, tie, i in reversed(cand[-n:]):
                    node = nodes.get(i)
                    if node is None:
                        node = nodes[i] = values_node(_file_path(f, i), f.vals, i * VALUES)
                    row.append((score, tie, node))
                ranked.append(row)
            t.ranked, t.listed = ranked, _union(ranked)
        return t.ranked, t.listed

    def _rank(self, f: Folder, n: int) -> RankedRows:
        """Rank all of folder `f`'s files by each key: the best n + RESERVE of each."""
        m, vals = len(f.keys), f.vals
        data, dres, dunknown = vals[2::VALUES], vals[7::VALUES], vals[9::VALUES]
        ties = list(map(neg, vals[11::VALUES]))
        keep = n + RESERVE
        cands, floors = [], []
        for key in self.keys:
            scores: object
            if key == "size":  # the column itself: no call per file
                scores = data
            elif key == "resident":
                scores = dres
            else:
                scores = [file_score(key, d, r, u) for d, r, u in zip(data, dres, dunknown, strict=True)]
            best = heapq.nlargest(keep + 1, zip(scores, ties, range(m), strict=True))  # type: ignore[call-overload]
            floors.append(best.pop()[:2] if len(best) > keep else None)
            best.reverse()
            cands.append(best)
        return RankedRows(n, cands, floors)

    def rerank(self, f: Folder, i: int) -> None:
        """File `i` of `f` has new counts: it moves in each key's order (in, out, or up and down among the best)
        without ranking the folder again, and its row is made again if it is among them; a file that is in none
        before or after changes nothing."""
        t = f.top
        if t is None:
            return
        b, vals = i * VALUES, f.vals
        tie = -vals[b + 11]
        keep = t.n + RESERVE
        touched = False
        for k, score in enumerate(file_score(key, vals[b + 2], vals[b + 7], vals[b + 9]) for key in self.keys):
            cand, entries = t.cands[k], t.entries[k]
            new = (score, tie, i)
            old = entries.pop(i, None)
            if old is not None:
                touched = True  # its numbers are on a row kept: made again
                if old == new:
                    entries[i] = old
                    continue
                del cand[bisect_left(cand, old)]  # type: ignore[arg-type]
            floor = t.floors[k]
            if floor is not None and (score, tie) <= floor:  # type: ignore[operator]
                continue  # below every file kept: out (the reserve stands in)
            insort(cand, new)  # type: ignore[type-var]
            entries[i] = new
            touched = True
            if len(cand) > keep:
                low = cand.pop(0)
                del entries[low[2]]
                t.floors[k] = low[:2]
        if touched:
            t.nodes.pop(i, None)
            t.listed = None


def _file_path(f: Folder, i: int) -> str:
    name = f.name(i)
    return f"{f.path}/{name}" if f.path != "/" else f"/{name}"


def _union(lists: list[list[_Ranked]]) -> tuple[ResidencyNode, ...]:
    """The rows of every key's top, each once: the first key's order, then the others' additions."""
    seen: dict[int, ResidencyNode] = {}
    for row in lists:
        for _, _, node in row:
            seen.setdefault(id(node), node)
    return tuple(seen.values())

