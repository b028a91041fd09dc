"""Watching a dataset at a cost that does not grow with it: inotify says which files were opened, only those
(and a slice of the tree in turn) are measured again, and every other file keeps its last count.

A page enters the cache only through an open file, so a file nobody opened since it was measured has at most
lost pages, and only when the kernel reclaimed page cache (`pgsteal_file` in /proc/vmstat): such counts are an
estimate with that bound, corrected by the rolling pass (docs/datasets.md, "Watching a dataset"). DAMON's
pageout reclaims without that counter moving: where it runs (configured, or seen), every count not measured in
the read is an estimate.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import stat
import time
from array import array
from typing import Any

from dltop import kernel
from dltop.model.datasets import NO_PERMISSION, DatasetResidency, ResidencyNode
from dltop.residency import measure as measuring
from dltop.residency import reclaim
from dltop.residency.budget import MAX_PROBLEMS, Budget
from dltop.residency.events import EventDrain, Key
from dltop.residency.folders import DRAIN_EVERY_FILES, SUMMED, VALUES, Folder, FolderTable, values_node
from dltop.residency.ranker import FileRanker
from dltop.residency.scan import NODE_FIELDS
from dltop.residency.walk import WalkOptions

# The rolling pass spends at most this share of one core: every file is measured again within
# files x (seconds per file) / ROLL_CPU_SHARE (100,000 files at ~20 us each: about 13 minutes).
ROLL_CPU_SHARE = 0.0025
MIN_ROLL_FILES = 256
# While reclaim that pgsteal_file does not count runs (reclaim.py), each read moves the watch's reclaim counter by
# this much more: a folder not measured in the read counts its resident pages into the bound (see _freeze), as
# after a reclaim pgsteal_file shows.
_SILENT_EPOCH = 1 << 40


class DatasetWatch:
    """One dataset root kept up to date by inotify plus a rolling rescan; `read()` gives a DatasetResidency.

    Three parts: `events` (the inotify drain: which files were opened), `folders` (the folder table: each file's
    last counts, and the measuring) and `ranker` (the file rows); this class decides, at each read, what to
    measure again and puts the part together."""

    def __init__(self, root: str, options: WalkOptions, cpu_fraction: float | None = None) -> None:
        self.root = root.rstrip("/") if len(root) > 1 else root
        self.options, self.cpu_fraction = options, cpu_fraction
        self.events = EventDrain()
        self.ranker = FileRanker(options)
        self.folders = FolderTable(options, self.events, self.ranker.rerank, self._saw_silent)
        # Files the rolling pass measured past its share (it measures whole folders): taken off the next reads'
        # share, so that it costs ROLL_CPU_SHARE and not a folder more per read.
        self._roll_debt = 0
        self.roll_files = 0  # files the rolling pass measured, and its CPU seconds (benchmarks/watch.py)
        self.roll_cpu_s = 0.0
        self._file_cost_s = 6e-6  # CPU seconds to measure one file, learnt from the scans
        self._last_read = time.monotonic()
        self._vm = reclaim.read_vmstat()
        # Reclaim pgsteal_file does not show: DAMON's configuration (read again every SILENT_RECHECK_S), or what a
        # measure saw (a file's recently evicted pages grew while pgsteal_file stood still; kept).
        # DLTOP_SILENT_RECLAIM=off: neither (the tests: a DAMON machine's reclaim would make their counts move).
        self._silent_off = os.environ.get("DLTOP_SILENT_RECLAIM", "") == "off"
        self._damon: str | None = None
        self._damon_at = -reclaim.SILENT_RECHECK_S
        self.seen_silent: str | None = None
        self._epoch = 0
        self.steal = 0  # the reclaim counter of this read (pgsteal_file, plus the epochs)
        self.steal_raw = 0  # pgsteal_file at this read's start

    def close(self) -> None:
        """Stop the drain thread and drop every watch."""
        self.events.close()

    def read(self, full: bool = False) -> tuple[DatasetResidency, set[tuple[int, int]]]:
        """The dataset now: files opened since the last read measured again, a slice of the rest in turn, all of
        it when `full` (after an action on it) or when the events cannot be trusted. Raises OSError as
        `scan_residency` does when the root cannot be read."""
        t0, c0 = time.monotonic(), time.thread_time()
        vm = reclaim.read_vmstat()
        dropped = vm.get("drop_pagecache", 0) != self._vm.get("drop_pagecache", 0)  # echo N > drop_caches
        resync, dirty, relist, changed = self.events.collect(full or dropped)
        steal = self._reclaim_mark(t0, vm)
        budget = Budget(None, None, self.cpu_fraction)
        if resync or self.folders.root is None:
            self._rescan_all(budget, steal)
        else:
            self._apply(dirty, relist, changed, budget, steal)
            self._roll_share(t0, budget, steal)
        self.events.settle()
        self._vm, self._last_read = vm, t0
        root = self.folders.root
        assert root is not None
        ds = self._freeze(root, steal, time.monotonic() - t0)
        if ds.estimated and self.silent_reason is not None:
            ds = dataclasses.replace(ds, estimate_reason=self.silent_reason)
        cpu = time.thread_time() - c0
        if resync and ds.files:
            self._file_cost_s = max(1e-7, cpu / ds.files)
        return ds, {(f.dev, f.ino) for f in self.folders.order}

    def _reclaim_mark(self, now: float, vm: dict[str, int]) -> int:
        """This read's reclaim counter: pgsteal_file, moved on by an epoch per read while reclaim it does not count
        may run (DAMON's configuration is read again every SILENT_RECHECK_S)."""
        if now - self._damon_at >= reclaim.SILENT_RECHECK_S and not self._silent_off:
            self._damon, self._damon_at = reclaim.silent_reclaimer(), now
        if self.silent_reason is not None:
            self._epoch += 1
        self.steal_raw = vm.get("pgsteal_file", 0)
        self.steal = self.steal_raw + self._epoch * _SILENT_EPOCH
        return self.steal

    def _roll_share(self, t0: float, budget: Budget, steal: int) -> None:
        """The rolling pass's share of this read: ROLL_CPU_SHARE of the time since the last read, less its debt."""
        elapsed = t0 - self._last_read
        share = max(MIN_ROLL_FILES, int(ROLL_CPU_SHARE * elapsed / self._file_cost_s)) - self._roll_debt
        if share > 0:
            self._roll_debt = max(0, self._roll(share, budget, steal) - share)
        else:
            self._roll_debt = -share  # this read's share went to a folder an earlier read measured

    @property
    def silent_reason(self) -> str | None:
        """Why reclaim may happen here that pgsteal_file does not count (None: it counts every reclaim)."""
        return self._damon or self.seen_silent

    def _saw_silent(self, f: Folder) -> None:
        """A measure of `f` found more recently evicted pages than its last: reclaim put them out. Unseen by
        pgsteal_file if it has not moved since `f` was measured, nor by now (kswapd counts a batch just after it
        puts it out: a reclaim in this read's window is counted before this second look)."""
        if self.seen_silent is None and f.mark == self.steal and not self._silent_off \
                and reclaim.read_vmstat().get("pgsteal_file", 0) == self.steal_raw:
            self.seen_silent = "reclaim unseen by pgsteal_file"

    def _rescan_all(self, budget: Budget, steal: int) -> None:
        st = os.stat(self.root)
        if not stat.S_ISDIR(st.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, "not a folder", self.root)
        self.events.reset_open()
        table = self.folders
        top = table.root
        if top is None or (top.dev, top.ino) != (st.st_dev, st.st_ino):
            if top is not None:
                table.forget(top)
            top = table.root = Folder(self.root, 0, st.st_dev, st.st_ino, None)
        table.scan_tree(top, budget, steal, recurse_known=True)
        table.order = top.walk()

    def _apply(self, dirty: list[Key], relist: set[int], changed: set[Key], budget: Budget, steal: int) -> int:
        """Measure again the folders whose listing changed and the files opened since the last read; how many
        files were measured."""
        table = self.folders
        n = 0
        for wd in relist:
            f = table.by_wd.get(wd)
            if f is not None:
                table.scan_tree(f, budget, steal, recurse_known=False)
                n += len(f.keys)
        if relist:
            table.reorder()
        redo: set[int] = set()  # folders to list again: a name there we do not count
        n += self._remeasure(dirty, relist, changed, redo)
        for wd in redo:
            f = table.by_wd.get(wd)
            if f is not None:
                table.scan_folder(f, steal)
                n += len(f.keys)
        return n

    def _remeasure(self, dirty: list[Key], relist: set[int], changed: set[Key], redo: set[int]) -> int:
        """The files of `dirty` measured again (the C step counts a folder's in batches); a folder where one is a
        name not counted goes into `redo`. How many were measured."""
        table = self.folders
        n = 0
        dirty.sort()  # by folder: its directory stays cached between its files
        measure = measuring.native_measure()
        pre: dict[Key, Any] = {}
        done: set[Key] = set()  # counted again by the C step's answers already
        batched = -1  # the folder whose files `pre` and `done` hold
        for key in dirty:
            wd, raw = key
            if key in done:
                continue
            f = table.by_wd.get(wd)
            if f is None or wd in relist or wd in redo:
                continue
            if measure is not None and wd != batched:
                batched, pre, done = wd, *table.recount_batch(f, dirty, key, changed, measure)
                if key in done:
                    continue
            raw = raw.rstrip(b"\0")
            name = raw.decode("utf-8", "surrogateescape")
            i = f.slot(name)
            if i < 0:  # a name we do not count: new, or a hard link counted elsewhere; the listing decides
                redo.add(wd)
                continue
            n += 1
            if n % DRAIN_EVERY_FILES == 0:
                self.events.settle()  # our own opens must not overflow the queue
            if not self._remeasure_file(f, i, name, raw, key, changed, pre):
                redo.add(wd)
        table.close_dir()
        return n

    def _remeasure_file(self, f: Folder, i: int, name: str, raw: bytes, key: Key, changed: set[Key],
                        pre: dict[Key, Any]) -> bool:
        """File `i` of `f` counted again: by cachestat alone where nothing wrote to it (the C step's answer in
        `pre`, or `recount`), else measured whole. False: it is no longer a plain file we count."""
        table = self.folders
        if key not in changed:
            got = pre.get(key)
            if table.recounted(f, i, got) if got is not None else table.recount(f, i, raw, key):
                return True
        new = table.measure_one(f, name)
        if new is None:
            return False
        base = i * VALUES
        tot, vals = f.tot, f.vals
        if vals[base:base + VALUES] == array("q", new):
            return True
        for j in range(SUMMED):
            tot[j] += new[j] - vals[base + j]
        vals[base:base + VALUES] = array("q", new)
        self.ranker.rerank(f, i)
        return True

    def _roll(self, files: int, budget: Budget, steal: int) -> int:
        """The rolling pass: whole folders in turn until at least `files` files were measured; how many were."""
        table = self.folders
        order = table.order
        if not order:
            return 0
        done, changed, c0 = 0, False, time.thread_time()
        for _ in range(len(order)):
            if done >= files:
                break
            f = order[table.next % len(order)]
            table.next = (table.next + 1) % len(order)
            if f.gone:
                continue
            before = f.subdirs
            table.scan_folder(f, steal)
            if f.subdirs.keys() != before.keys():
                changed = True
                table.scan_tree(f, budget, steal, recurse_known=False, first_done=True, before=set(before))
            done += len(f.keys) + 1
            budget.stop()
        took_s = time.thread_time() - c0
        self.roll_files += done
        self.roll_cpu_s += took_s
        if done >= 64:  # its share of a core is kept by what its own files cost (they were learnt at the full scan)
            self._file_cost_s = 0.5 * self._file_cost_s + 0.5 * max(1e-7, took_s / done)
        if changed:
            table.reorder()
        return done


    def _freeze(self, top: Folder, steal: int, took_s: float) -> DatasetResidency:
        max_depth = self.options.max_depth
        skipped: dict[str, int] = {}
        problems: list[str] = []
        used: set[str] = set()
        error = oldest_mark = None
        oldest_at = time.time()
        error_sum = 0
        files_top, rows = self.ranker.rows(self.folders.order)

        def node(f: Folder) -> tuple[list[int], tuple[ResidencyNode, ...]]:
            nonlocal oldest_mark, oldest_at, error_sum
            tot = list(f.tot)
            for k, v in f.skipped.items():
                skipped[k] = skipped.get(k, 0) + v
            for p in f.problems:
                if len(problems) < MAX_PROBLEMS:
                    problems.append(p)
            used.update(f.used)
            oldest_mark = f.mark if oldest_mark is None else min(oldest_mark, f.mark)
            oldest_at = min(oldest_at, f.measured_at)
            error_sum += min(f.tot[3], max(0, steal - f.mark))
            kids = []
            for s in f.subdirs.values():
                st, sk = node(s)
                tot = [a + b for a, b in zip(tot, st, strict=True)]
                if max_depth is None or s.depth <= max_depth:  # deeper folders add to their ancestor
                    kids.append(values_node(s.path, st, 0, sk, rows.get(s, ())))
            return tot, tuple(sorted(kids, key=lambda k: k.path))

        tot, kids = node(top)
        error = min(error_sum, max(0, steal - (oldest_mark or 0)), tot[3])
        root = values_node(top.path, tot, 0, kids, rows.get(top, ()))
        method = used - {"unknown"}
        fs = kernel.fs_name_at(top.path)
        return DatasetResidency(
            **{k: getattr(root, k) for k in NODE_FIELDS},
            page_size=kernel.PAGE_SIZE,
            scanned_at=time.time(),
            scan_duration_s=took_s,
            complete=True,
            method=measuring.method_name(method),
            fs_type=fs,
            dirs=len(self.folders.order),
            skipped=dict(sorted(skipped.items())),
            problems=tuple(problems),
            unknown_reason=NO_PERMISSION if "unknown" in used or tot[8] else None,
            estimated=error > 0,
            estimate_error_pages=error,
            full_scan_at=oldest_at,
            files_top=files_top,
            files_sorted_by=self.ranker.keys if self.options.top_files > 0 else (),
        )
