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
import heapq
import os
import stat
import struct
import sys
import threading
import time
from array import array
from bisect import bisect_left, insort
from collections import Counter
from itertools import accumulate, compress
from operator import gt, neg
from typing import Any

from dltop import kernel
from dltop.model.datasets import NO_PERMISSION, DatasetResidency, ResidencyNode
from dltop.residency import measure as measuring
from dltop.residency import walk as walking
from dltop.residency.budget import MAX_PROBLEMS, Budget
from dltop.residency.measure import O_FILE, data_page_runs, needs_mincore, resident_in_runs
from dltop.residency.rank import FILE_SORT_KEYS
from dltop.residency.scan import NODE_FIELDS
from dltop.residency.walk import O_DIR, WalkOptions, WalkReport, compile_names, skip_error
from dltop.sources.procfs import name_this_thread, read_text

# What a folder's watch reports: its files opened and closed (a read or a write), their names coming and going,
# and the folder itself going away. IN_ACCESS/IN_MODIFY are left out: one per read() or write() call, and an
# open comes before either.
WATCH_MASK = (kernel.IN_OPEN | kernel.IN_CLOSE_WRITE | kernel.IN_CLOSE_NOWRITE | kernel.IN_ATTRIB
              | kernel.IN_CREATE | kernel.IN_DELETE | kernel.IN_MOVED_FROM | kernel.IN_MOVED_TO
              | kernel.IN_DELETE_SELF | kernel.IN_MOVE_SELF | kernel.IN_ONLYDIR | kernel.IN_DONT_FOLLOW
              | kernel.IN_EXCL_UNLINK)
_OPEN_CLOSE = kernel.IN_OPEN | kernel.IN_CLOSE_WRITE | kernel.IN_CLOSE_NOWRITE
_LISTING = kernel.IN_CREATE | kernel.IN_DELETE | kernel.IN_MOVED_FROM | kernel.IN_MOVED_TO
_GONE = kernel.IN_DELETE_SELF | kernel.IN_MOVE_SELF | kernel.IN_IGNORED | kernel.IN_UNMOUNT
_SLOW = kernel.IN_Q_OVERFLOW | _GONE | kernel.IN_ISDIR | _LISTING | kernel.IN_ATTRIB  # all but a file's open/close
_CHANGED = kernel.IN_CLOSE_WRITE | kernel.IN_ATTRIB  # its size, data or links may differ: stat it again
_EVENT = struct.Struct("iIII")
# What a run of records of one size may hold to be counted in bulk: a file's open and close, nothing else.
_BULK = frozenset((kernel.IN_OPEN, kernel.IN_CLOSE_NOWRITE, kernel.IN_CLOSE_WRITE))
_BULK_MIN = 8  # records in a run for it to be counted in bulk (below: one by one)
_KEY_STRUCTS: dict[int, struct.Struct] = {}  # by record size: a record's (watch, padded name)
# The folder a file is measured again in, opened as a path only: a real open of it is an event of its own (an
# open and a close, 16-byte records among the files' 32-byte ones) on every read.
_O_DIR_PATH = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
_Ranked = tuple[object, int, ResidencyNode]  # a file row with its score and tie in one key's order
# A folder keeps this many files past its top n by each key in reserve: a file that falls out of the top n is
# replaced by the next one without ranking the folder again, until the reserve runs out.
_RESERVE = 16


class _Top:
    """One folder's file rows: per key its best n + _RESERVE files as (score, tie, index), in ascending order
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
# The rolling pass spends at most this share of one core: every file is measured again within
# files x (seconds per file) / ROLL_CPU_SHARE (100,000 files at ~20 us each: about 13 minutes).
ROLL_CPU_SHARE = 0.0025
MIN_ROLL_FILES = 256
DRAIN_EVERY_S = 0.5  # the event queue (16,384 by default) is read this often, so a busy loader cannot overflow it
DRAIN_EVERY_FILES = 2048  # and while measuring, after this many files: each adds an open and a close
# Reclaim that /proc/vmstat's pgsteal_file does not count: DAMON's `pageout` action (a kdamond's scheme set up
# through sysfs, or the DAMON_RECLAIM module) puts pages out through reclaim_pages(), which moves no pgsteal
# counter (seen on Linux 6.18: a folder's pages read once went 1000 -> 51 resident in 105 s, pgsteal_file still).
DAMON_ADMIN = "/sys/kernel/mm/damon/admin/kdamonds"
DAMON_RECLAIM = "/sys/module/damon_reclaim/parameters/enabled"
SILENT_RECHECK_S = 60.0  # how often DAMON's configuration is read again
# While such reclaim runs, each read moves the watch's reclaim counter by this much more: a folder not measured
# in the read counts its resident pages into the bound (see _freeze), as after a reclaim pgsteal_file shows.
_SILENT_EPOCH = 1 << 40

# Per file, in this order: size in bytes, pages, data pages, resident, dirty, writeback, recently evicted,
# resident data pages, unknown pages, unknown data pages, files (1), and its inode (ties of the file rows); the
# first _SUM are added up into the folders' totals.
_N = 12
_SUM = 11


def _first_line(path: str) -> str:
    """A small sysfs file's text, stripped; "" where it cannot be read (or is not a regular file: never waits)."""
    try:
        return read_text(path, 256).strip()
    except OSError:
        return ""


def _entries(path: str) -> list[str]:
    try:
        return sorted((n for n in os.listdir(path) if n.isdigit()), key=int)[:64]
    except OSError:
        return []


def silent_reclaimer(admin: str | None = None, reclaim: str | None = None) -> str | None:
    """What on this machine puts page cache out without /proc/vmstat's pgsteal_file counting it, in words; None
    when nothing that DAMON's sysfs or its reclaim module shows does."""
    admin, reclaim = admin or DAMON_ADMIN, reclaim or DAMON_RECLAIM
    if _first_line(reclaim) in ("Y", "1"):
        return "DAMON_RECLAIM is on"
    for kd in _entries(admin):
        if _first_line(f"{admin}/{kd}/state") != "on":
            continue
        for ctx in _entries(f"{admin}/{kd}/contexts"):
            schemes = f"{admin}/{kd}/contexts/{ctx}/schemes"
            if any(_first_line(f"{schemes}/{s}/action") == "pageout" for s in _entries(schemes)):
                return f"DAMON pageout on (kdamond {kd})"
    return None


def _vmstat(keys: tuple[str, ...] = ("pgsteal_file", "drop_pagecache")) -> dict[str, int]:
    """Counters of /proc/vmstat that say whether page cache was reclaimed or dropped (missing ones: absent)."""
    out: dict[str, int] = {}
    try:
        with open("/proc/vmstat", "rb") as f:
            for line in f:
                name, _, value = line.partition(b" ")
                k = name.decode()
                if k in keys:
                    out[k] = int(value)
    except (OSError, ValueError):
        pass
    return out


class _Folder:
    """One folder of the watched tree: its files' last counts (by name hash, sorted) and its own totals."""

    __slots__ = ("path", "depth", "dev", "ino", "wd", "parent", "subdirs", "keys", "vals", "tot", "skipped",
                 "problems", "links", "mark", "measured_at", "mincore", "used", "gone", "names", "offs", "top")

    def __init__(self, path: str, depth: int, dev: int, ino: int, parent: _Folder | None) -> None:
        self.path, self.depth, self.dev, self.ino, self.parent = path, depth, dev, ino, parent
        self.wd: int | None = None
        self.subdirs: dict[str, _Folder] = {}
        self.keys = array("q")
        self.vals = array("q")
        self.tot = [0] * _SUM
        self.names = ""  # the files' names in the order of `keys`, each ended by a NUL (a name never holds one)
        self.offs = array("I", (0,))  # where each name starts in `names`, and its end
        self.top: _Top | None = None  # its file rows as last chosen; None: choose them again
        self.skipped: dict[str, int] = {}
        self.problems: list[str] = []
        self.links: list[tuple[int, int]] = []  # hard-linked inodes this folder counts
        self.mark = 0  # pgsteal_file when every file here was last measured
        self.measured_at = 0.0
        self.mincore = False
        self.used: set[str] = set()
        self.gone = False

    def slot(self, name: str) -> int:
        """Index of `name`'s counts, or -1 when it has none (a new name, a hard link counted elsewhere)."""
        h = hash(name)
        i = bisect_left(self.keys, h)
        return i if i < len(self.keys) and self.keys[i] == h else -1

    def name(self, i: int) -> str:
        """The name of the file at index `i`."""
        return self.names[self.offs[i]:self.offs[i + 1] - 1]

    def walk(self) -> list[_Folder]:
        out, stack = [], [self]
        while stack:
            f = stack.pop()
            out.append(f)
            stack.extend(f.subdirs.values())
        return out


class DatasetWatch:
    """One dataset root kept up to date by inotify plus a rolling rescan; `read()` gives a DatasetResidency."""

    def __init__(self, root: str, options: WalkOptions, cpu_fraction: float | None = None) -> None:
        self.root = root.rstrip("/") if len(root) > 1 else root
        self.options, self.cpu_fraction = options, cpu_fraction
        self._ignore, self._include = compile_names(options.ignore), compile_names(options.include)
        self._keys = tuple(k for k in options.top_keys if k in FILE_SORT_KEYS)
        self._fd = kernel.inotify_init()
        self._lock = threading.Lock()
        self._by_wd: dict[int, _Folder] = {}
        # Keyed by (wd, name as bytes, NUL-padded as the kernel sends it: a name's padding depends on its length
        # alone, see _padded): names are decoded only for the files measured again.
        self._touched: Counter[tuple[int, bytes]] = Counter()  # events per file since the last read
        self._open: dict[tuple[int, bytes], int] = {}  # opens less closes seen: > 0 while someone holds it open
        self._own: dict[tuple[int, bytes], int] = {}  # events our own measuring caused (an open and a close each)
        self._changed: set[tuple[int, bytes]] = set()  # closed after a write, or its attributes changed
        self._relist: set[int] = set()  # folders whose listing changed
        self._resync = True  # measure everything (the first read, a queue overflow, a drop_caches)
        self._links: dict[tuple[int, int], _Folder] = {}
        self._top: _Folder | None = None
        self._order: list[_Folder] = []
        self._next = 0  # the rolling pass's place in _order
        # Files the rolling pass measured past its share (it measures whole folders): taken off the next reads'
        # share, so that it costs ROLL_CPU_SHARE and not a folder more per read.
        self._roll_debt = 0
        self.roll_files = 0  # files the rolling pass measured, and its CPU seconds (benchmarks/watch.py)
        self.roll_cpu_s = 0.0
        self._file_cost_s = 6e-6  # CPU seconds to measure one file, learnt from the scans
        self._last_read = time.monotonic()
        self._vm = _vmstat()
        # Reclaim pgsteal_file does not show: DAMON's configuration (read again every SILENT_RECHECK_S), or what a
        # measure saw (a file's recently evicted pages grew while pgsteal_file stood still; kept).
        # DLTOP_SILENT_RECLAIM=off: neither (the tests: a DAMON machine's reclaim would make their counts move).
        self._silent_off = os.environ.get("DLTOP_SILENT_RECLAIM", "") == "off"
        self._damon: str | None = None
        self._damon_at = -SILENT_RECHECK_S
        self.seen_silent: str | None = None
        self._epoch = 0
        self._steal = 0  # the reclaim counter of this read (pgsteal_file, plus the epochs)
        self._steal_raw = 0  # pgsteal_file at this read's start
        self._cstat = kernel.cachestat_caller()
        self._dir: tuple[_Folder, int] | None = None
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._drain_loop, name="dltop-watch", daemon=True)
        self._thread.start()

    # --- events ---------------------------------------------------------------------------------------------

    def _drain_loop(self) -> None:
        name_this_thread("dltop-watch")
        while not self._closed.wait(DRAIN_EVERY_S):
            with self._lock:
                self._drain()

    def _drain(self) -> None:
        """Read every queued event into the counts (called with the lock held)."""
        fd = self._fd
        if fd < 0:
            return
        while True:
            try:
                buf = os.read(fd, 1 << 16)
            except BlockingIOError:
                return
            except OSError:
                return
            self._take(buf)

    def _take(self, buf: bytes) -> None:
        """The events of one read of the inotify fd into the counts."""
        pos, end = 0, len(buf)
        while pos < end:
            # A run of records of the size of the one at `pos` (a dataset's names are mostly of one padded
            # length): counted in bulk when it holds only files' opens and closes, else one by one.
            size = 16 + _EVENT.unpack_from(buf, pos)[3]
            k = _run(buf, pos, size)
            stop = pos + k * size
            if k >= _BULK_MIN:
                masks = memoryview(buf)[pos:stop].cast("I")[1::size >> 2].tolist()
                if _BULK.issuperset(masks):
                    self._bulk(buf[pos:stop], size, masks)
                    pos = stop
                    continue
            pos = self._one_by_one(buf, pos, stop)

    def _bulk(self, run: bytes, size: int, masks: list[int]) -> None:
        """Records of one `size`, each a file's open or close (`masks`), into the counts."""
        st = _KEY_STRUCTS.get(size)
        if st is None:
            st = _KEY_STRUCTS[size] = struct.Struct(f"=i12x{size - 16}s")
        keys = list(st.iter_unpack(run))
        self._touched.update(keys)  # counted in C
        opened, changed = self._open, self._changed
        get, pop, is_open, written = opened.get, opened.pop, kernel.IN_OPEN, kernel.IN_CLOSE_WRITE
        for key, mask in zip(keys, masks, strict=True):  # in order: a close seen before its open counts nothing
            if mask == is_open:
                opened[key] = get(key, 0) + 1
                continue
            left = get(key, 0) - 1
            if left > 0:
                opened[key] = left
            else:
                pop(key, None)
            if mask == written:
                changed.add(key)

    def _one_by_one(self, buf: bytes, pos: int, stop: int) -> int:
        """The records of `buf` from `pos` up to `stop` (at least one) into the counts; where the next one starts."""
        touched, opened, unpack = self._touched, self._open, _EVENT.unpack_from
        while True:
            wd, mask, _cookie, n = unpack(buf, pos)
            name = buf[pos + 16:pos + 16 + n]
            pos += 16 + n
            if not mask & _SLOW:  # a file opened or closed: nearly every event
                key = (wd, name)
                touched[key] += 1
                if mask & kernel.IN_OPEN:
                    opened[key] = opened.get(key, 0) + 1
                elif (left := opened.get(key, 0) - 1) > 0:
                    opened[key] = left
                else:
                    opened.pop(key, None)
                if mask & _CHANGED:
                    self._changed.add(key)
            elif mask & kernel.IN_Q_OVERFLOW:
                self._resync = True
                opened.clear()
            elif mask & _GONE and not n:
                self._relist.add(wd)
            elif mask & kernel.IN_ISDIR:
                if mask & (_LISTING | kernel.IN_ATTRIB):
                    self._relist.add(wd)
            elif mask & _LISTING:
                self._relist.add(wd)
            else:  # IN_ATTRIB
                key = (wd, name)
                touched[key] += 1
                self._changed.add(key)
            if pos >= stop:
                return pos

    def _drain_locked(self) -> None:
        with self._lock:
            self._drain()

    def _settle(self) -> None:
        """Drain, then take our own events off the counts at once: every event our opens and closes caused has been
        read by now (inotify queues an event before the call that caused it returns), so what is left of a file's
        count is a job's. Our counts are not kept until the next read: a full scan's were a key per file, twice."""
        with self._lock:
            self._drain()
            touched = self._touched
            for key, n in self._own.items():
                left = touched[key] - n
                if left > 0:
                    touched[key] = left
                else:
                    touched.pop(key, None)
            self._own = {}

    def close(self) -> None:
        """Stop the drain thread and drop every watch."""
        self._closed.set()
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    # --- reading --------------------------------------------------------------------------------------------

    def read(self, full: bool = False) -> tuple[DatasetResidency, set[tuple[int, int]]]:
        """The dataset now: files opened since the last read measured again, a slice of the rest in turn, all of
        it when `full` (after an action on it) or when the events cannot be trusted. Raises OSError as
        `scan_residency` does when the root cannot be read."""
        t0, c0 = time.monotonic(), time.thread_time()
        vm = _vmstat()
        with self._lock:
            self._drain()
            if vm.get("drop_pagecache", 0) != self._vm.get("drop_pagecache", 0):
                self._resync = True  # echo N > drop_caches: every count may be gone
            resync, self._resync = self._resync or full, False
            own, touched = self._own, self._touched
            # Files with more events than our own measuring caused (set difference and map in C: every file we
            # measured is among them, and a job's reads too).
            dirty = list(touched.keys() - own.keys())
            dirty.extend(compress(own, map(gt, map(touched.__getitem__, own), own.values())))
            dirty.extend(k for k in self._open if touched[k] <= own.get(k, 0))
            relist, self._relist = self._relist, set()
            changed, self._changed = self._changed, set()
            self._touched, self._own = Counter(), {}
        if t0 - self._damon_at >= SILENT_RECHECK_S and not self._silent_off:
            self._damon, self._damon_at = silent_reclaimer(), t0
        if self.silent_reason is not None:
            self._epoch += 1
        self._steal_raw = vm.get("pgsteal_file", 0)
        steal = self._steal = self._steal_raw + self._epoch * _SILENT_EPOCH
        budget = Budget(None, None, self.cpu_fraction)
        if resync or self._top is None:
            self._rescan_all(budget, steal)
        else:
            self._apply(dirty, relist, changed, budget, steal)
            elapsed = t0 - self._last_read
            share = max(MIN_ROLL_FILES, int(ROLL_CPU_SHARE * elapsed / self._file_cost_s)) - self._roll_debt
            if share > 0:
                self._roll_debt = max(0, self._roll(share, budget, steal) - share)
            else:
                self._roll_debt = -share  # this read's share went to a folder an earlier read measured
        self._settle()
        self._vm, self._last_read = vm, t0
        top = self._top
        assert top is not None
        ds = self._freeze(top, steal, time.monotonic() - t0)
        if ds.estimated and self.silent_reason is not None:
            ds = dataclasses.replace(ds, estimate_reason=self.silent_reason)
        cpu = time.thread_time() - c0
        if resync and ds.files:
            self._file_cost_s = max(1e-7, cpu / ds.files)
        return ds, {(f.dev, f.ino) for f in self._order}

    @property
    def silent_reason(self) -> str | None:
        """Why reclaim may happen here that pgsteal_file does not count (None: it counts every reclaim)."""
        return self._damon or self.seen_silent

    def _saw_silent(self, f: _Folder) -> None:
        """A measure of `f` found more recently evicted pages than its last: reclaim put them out. Unseen by
        pgsteal_file if it has not moved since `f` was measured, nor by now (kswapd counts a batch just after it
        puts it out: a reclaim in this read's window is counted before this second look)."""
        if self.seen_silent is None and f.mark == self._steal and not self._silent_off \
                and _vmstat().get("pgsteal_file", 0) == self._steal_raw:
            self.seen_silent = "reclaim unseen by pgsteal_file"

    def _rescan_all(self, budget: Budget, steal: int) -> None:
        st = os.stat(self.root)
        if not stat.S_ISDIR(st.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, "not a folder", self.root)
        with self._lock:
            self._open_reset()
        top = self._top
        if top is None or (top.dev, top.ino) != (st.st_dev, st.st_ino):
            if top is not None:
                self._forget(top)
            top = self._top = _Folder(self.root, 0, st.st_dev, st.st_ino, None)
        self._scan_tree(top, budget, steal, recurse_known=True)
        self._order = top.walk()

    def _open_reset(self) -> None:
        """After an overflow the open counts are unknown: start them again from the events that follow."""
        self._open.clear()

    def _apply(self, dirty: list[tuple[int, bytes]], relist: set[int], changed: set[tuple[int, bytes]],
               budget: Budget, steal: int) -> int:
        """Measure again the files opened since the last read and the folders whose listing changed."""
        n = 0
        for wd in relist:
            f = self._by_wd.get(wd)
            if f is not None:
                self._scan_tree(f, budget, steal, recurse_known=False)
                n += len(f.keys)
        if relist:
            assert self._top is not None
            self._order = self._top.walk()
            self._next %= max(1, len(self._order))
        redo: set[int] = set()
        dirty.sort()  # by folder: its directory stays cached between its files
        measure = measuring.native_measure()
        pre: dict[tuple[int, bytes], Any] = {}
        done: set[tuple[int, bytes]] = set()  # counted again by the C step's answers already
        batched = -1  # the folder whose files `pre` and `done` hold
        for key in dirty:
            wd, raw = key
            if key in done:
                continue
            f = self._by_wd.get(wd)
            if f is None or wd in relist or wd in redo:
                continue
            if measure is not None and wd != batched:
                batched, pre, done = wd, *self._recount_batch(f, dirty, key, changed, measure)
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
                self._settle()  # our own opens must not overflow the queue
            if key not in changed:
                got = pre.get(key)
                if self._recounted(f, i, got) if got is not None else self._recount(f, i, raw, key):
                    continue
            new = self._measure_one(f, name)
            if new is None:
                redo.add(wd)
                continue
            base = i * _N
            tot, vals = f.tot, f.vals
            if vals[base:base + _N] == array("q", new):
                continue
            for j in range(_SUM):
                tot[j] += new[j] - vals[base + j]
            vals[base:base + _N] = array("q", new)
            self._rerank(f, i)
        self._close_dir()
        for wd in redo:
            f = self._by_wd.get(wd)
            if f is not None:
                self._scan_folder(f, steal)
                n += len(f.keys)
        return n

    def _roll(self, files: int, budget: Budget, steal: int) -> int:
        """The rolling pass: whole folders in turn until at least `files` files were measured; how many were."""
        order = self._order
        if not order:
            return 0
        done, changed, c0 = 0, False, time.thread_time()
        for _ in range(len(order)):
            if done >= files:
                break
            f = order[self._next % len(order)]
            self._next = (self._next + 1) % len(order)
            if f.gone:
                continue
            before = f.subdirs
            self._scan_folder(f, steal)
            if f.subdirs.keys() != before.keys():
                changed = True
                self._scan_tree(f, budget, steal, recurse_known=False, first_done=True, before=set(before))
            done += len(f.keys) + 1
            budget.stop()
        took_s = time.thread_time() - c0
        self.roll_files += done
        self.roll_cpu_s += took_s
        if done >= 64:  # its share of a core is kept by what its own files cost (they were learnt at the full scan)
            self._file_cost_s = 0.5 * self._file_cost_s + 0.5 * max(1e-7, took_s / done)
        if changed:
            assert self._top is not None
            self._order = self._top.walk()
            self._next %= max(1, len(self._order))
        return done

    # --- measuring ------------------------------------------------------------------------------------------

    def _scan_tree(self, f: _Folder, budget: Budget, steal: int, recurse_known: bool,
                   first_done: bool = False, before: set[str] | None = None) -> None:
        """Measure folder `f` and the folders below it: all of them (`recurse_known`), else only new ones
        (`first_done`: `f` itself was just measured, `before` its subfolders' names until then)."""
        stack: list[_Folder] = []
        if first_done:
            stack.extend(s for name, s in f.subdirs.items() if name not in (before or set()))
        else:
            stack.append(f)
        while stack:
            d = stack.pop()
            known = set(d.subdirs)
            self._scan_folder(d, steal)
            budget.stop()
            stack.extend(s for name, s in d.subdirs.items() if recurse_known or name not in known)

    def _watch(self, f: _Folder) -> None:
        if f.wd is not None:
            return
        try:
            f.wd = kernel.inotify_add_watch(self._fd, f.path, WATCH_MASK)
        except OSError:
            f.wd = None  # no watch (max_user_watches reached): the rolling pass alone keeps it
            return
        self._by_wd[f.wd] = f

    def _forget(self, f: _Folder) -> None:
        """Drop a folder that is gone (and the folders below it): their watches and hard links."""
        for g in f.walk():
            g.gone = True
            if g.wd is not None:
                kernel.inotify_rm_watch(self._fd, g.wd)
                if self._by_wd.get(g.wd) is g:
                    del self._by_wd[g.wd]
                g.wd = None
            for k in g.links:
                if self._links.get(k) is g:
                    del self._links[k]

    def _own_event(self, f: _Folder, name: str | bytes) -> None:
        # Only this thread touches _own (the drain thread counts events, read() compares): no lock.
        if f.wd is not None:
            key = (f.wd, _padded(name if isinstance(name, bytes) else os.fsencode(name)))
            self._own[key] = self._own.get(key, 0) + 2  # our open and our close

    def _scan_folder(self, f: _Folder, steal: int) -> None:
        """List folder `f` again and measure each of its files; its subfolders are kept, added or dropped."""
        self._watch(f)  # before listing: a file opened after it is seen
        for k in f.links:
            if self._links.get(k) is f:
                del self._links[k]
        f.links, f.skipped, f.problems, f.used = [], {}, [], set()
        report = WalkReport()
        rows: list[tuple[int, str, tuple[int, ...]]] = []
        subdirs: dict[str, _Folder] = {}
        try:
            dfd = os.open(f.path, O_DIR | (os.O_NOFOLLOW if f.depth else 0))
        except OSError as e:
            if f.depth == 0:
                raise
            skip_error(report, e, f.path)
            self._set(f, rows, report, subdirs, steal)
            return
        try:
            try:
                f.mincore = needs_mincore(dfd)
            except OSError:
                f.mincore = False
            ignore, include = self._ignore, self._include
            # With the C step (dltop.native._measure), a folder's plain files are measured in batches, each before
            # the next entry that is not one (what a report lists stays in the listing's order).
            batch: list[str] | None = [] if measuring.native_measure() is not None else None
            try:
                with walking.list_folder(dfd) as entries:
                    for n, entry in enumerate(entries, 1):
                        if n % DRAIN_EVERY_FILES == 0:
                            self._settle()  # our own opens must not overflow the queue
                        name = entry.name
                        if ignore is not None and ignore.match(name):
                            report.skip("ignored")
                            continue
                        try:
                            if entry.is_file(follow_symlinks=False):
                                if include is not None and not include.match(name):
                                    report.skip("ignored")
                                    continue
                                self._own_event(f, name)
                                if batch is not None:
                                    batch.append(name)
                                    if len(batch) >= measuring.BATCH:
                                        self._measure_batch(f, dfd, batch, report, rows)
                                        batch = []
                                    continue
                                vals = self._measure(f, dfd, name, report)
                                if vals is not None:
                                    rows.append((hash(name), name, vals))
                                continue
                            if batch:
                                self._measure_batch(f, dfd, batch, report, rows)
                                batch = []
                            if entry.is_symlink():
                                report.skip("symlink")
                            elif entry.is_dir(follow_symlinks=False):
                                est = entry.stat(follow_symlinks=False)
                                if est.st_dev != f.dev and not self.options.cross_filesystems:
                                    report.skip("other_filesystem")
                                    continue
                                path = f"{f.path}/{name}" if f.path != "/" else f"/{name}"
                                old = f.subdirs.get(name)
                                if old is not None and (old.dev, old.ino) == (est.st_dev, est.st_ino):
                                    subdirs[name] = old
                                else:
                                    subdirs[name] = _Folder(path, f.depth + 1, est.st_dev, est.st_ino, f)
                            else:
                                report.skip("special")
                        except OSError as e:
                            if batch:
                                self._measure_batch(f, dfd, batch, report, rows)
                                batch = []
                            skip_error(report, e, f"{f.path}/{name}")
            except OSError as e:
                if batch:
                    self._measure_batch(f, dfd, batch, report, rows)
                    batch = []
                if f.depth == 0:
                    raise
                skip_error(report, e, f.path)
            if batch:
                self._measure_batch(f, dfd, batch, report, rows)
        finally:
            os.close(dfd)
        self._settle()
        for name, old in f.subdirs.items():
            if subdirs.get(name) is not old:
                self._forget(old)
        self._set(f, rows, report, subdirs, steal)

    def _set(self, f: _Folder, rows: list[tuple[int, str, tuple[int, ...]]], report: WalkReport,
             subdirs: dict[str, _Folder], steal: int) -> None:
        rows.sort(key=lambda r: r[0])
        vals = array("q")
        for _, _, v in rows:
            vals.extend(v)
        tot = [sum(vals[j::_N]) for j in range(_SUM)]
        names = "\0".join(r[1] for r in rows) + "\0" if rows else ""
        if names == f.names and tot[6] > f.tot[6]:
            self._saw_silent(f)  # the same files, more of their pages recently evicted: reclaim put them out
        if vals != f.vals or names != f.names:
            f.top = None  # its file rows are chosen again at the next freeze
            f.keys = array("q", (r[0] for r in rows))
            f.offs = array("I", accumulate((len(r[1]) + 1 for r in rows), initial=0))
            f.vals, f.names = vals, names
        f.tot, f.subdirs = tot, subdirs
        f.skipped, f.problems = report.skipped, report.problems
        if report.unknown:
            f.used.add("unknown")
        f.mark, f.measured_at = steal, time.time()

    def _measure_one(self, f: _Folder, name: str) -> tuple[int, ...] | None:
        """One file measured again in place (None: it is no longer a plain file we count)."""
        dir_fd = self._folder_fd(f)
        if dir_fd is None:
            return None
        self._own_event(f, name)
        report = WalkReport()
        vals = self._measure(f, dir_fd, name, report, relink=True)
        return None if report.skipped else vals

    def _recount(self, f: _Folder, i: int, raw: bytes, key: tuple[int, bytes]) -> bool:
        """File `i` of `f` counted again in place by cachestat alone, its size and data pages kept: nothing wrote
        to it or changed its links since it was measured (else IN_CLOSE_WRITE or IN_ATTRIB). False: measure it
        whole (a sparse file, mincore, an unreadable file, or anything unexpected). `key`: its events' key."""
        if f.mincore:
            return False
        base, vals = i * _N, f.vals
        pages, data, unknown = vals[base + 1], vals[base + 2], vals[base + 8]
        if data != pages or unknown or pages == 0:
            return False
        dir_fd = self._folder_fd(f)
        if dir_fd is None:
            return False
        try:
            fd = os.open(raw, O_FILE, dir_fd=dir_fd)
        except OSError:
            return False
        own = self._own  # our open and our close (what _own_event counts, its key at hand)
        own[key] = own.get(key, 0) + 2
        try:
            if os.fstat(fd).st_ino != vals[base + 11]:
                return False  # replaced under the same name
            cs = self._cstat(fd)
        except OSError:
            return False
        finally:
            os.close(fd)
        self._recounted_as(f, i, cs.nr_cache, cs.nr_dirty, cs.nr_writeback, cs.nr_recently_evicted)
        return True

    def _recount_batch(self, f: _Folder, dirty: list[tuple[int, bytes]], first: tuple[int, bytes],
                       changed: set[tuple[int, bytes]], measure: Any,
                       ) -> tuple[dict[tuple[int, bytes], Any], set[tuple[int, bytes]]]:
        """The files of `f` that `_recount` would count again, from `first` on in `dirty` (sorted: a folder's files
        follow one another), measured by the C step (see dltop/native/_measure.c) in calls of measuring.BATCH
        files, up to the first name `f` does not count (the listing decides from there): those its answer counts
        again are counted here (`_recounted`, in `dirty`'s order) and given in the set; the other answers in the
        dict, for `_apply` to take."""
        if f.mincore:
            return {}, set()
        dir_fd = self._folder_fd(f)
        if dir_fd is None:
            return {}, set()
        wd, vals = first[0], f.vals
        keys: list[tuple[int, bytes]] = []
        raws: list[bytes] = []
        slots: list[int] = []
        for j in range(bisect_left(dirty, first), len(dirty)):
            key = dirty[j]
            if key[0] != wd:
                break
            raw = key[1].rstrip(b"\0")
            i = f.slot(raw.decode("utf-8", "surrogateescape"))
            if i < 0:
                break
            base = i * _N
            if key in changed or vals[base + 2] != vals[base + 1] or vals[base + 8] or vals[base + 1] == 0:
                continue  # `_measure_one` measures it whole (as `_recount` would refuse it)
            keys.append(key)
            raws.append(raw)
            slots.append(i)
        out: dict[tuple[int, bytes], Any] = {}
        done: set[tuple[int, bytes]] = set()
        own, step, recounted_as = self._own, measuring.BATCH, self._recounted_as
        for j in range(0, len(raws), step):
            for key, i, got in zip(keys[j:j + step], slots[j:j + step],
                                   measure(dir_fd, raws[j:j + step], O_FILE, kernel.NR_CACHESTAT),
                                   strict=True):
                if got.__class__ is tuple:  # opened: our open and our close
                    own[key] = own.get(key, 0) + 2
                    if got[1] == vals[i * _N + 11]:  # the same inode: `_recounted`
                        recounted_as(f, i, got[4], got[5], got[6], got[7])
                        done.add(key)
                        continue
                elif got == 0:
                    own[key] = own.get(key, 0) + 2
                out[key] = got
            if j + step < len(raws):
                self._settle()  # our own opens must not overflow the queue
        return out, done

    def _recounted(self, f: _Folder, i: int, got: Any) -> bool:
        """`_recount` from the C step's answer for file `i` of `f`: False where it must be measured whole."""
        if got.__class__ is not tuple or got[1] != f.vals[i * _N + 11]:
            return False  # not a plain case now, or replaced under the same name
        self._recounted_as(f, i, got[4], got[5], got[6], got[7])
        return True

    def _recounted_as(self, f: _Folder, i: int, cache: int, dirty: int, wb: int, rev: int) -> None:
        base, vals = i * _N, f.vals
        res = min(cache, vals[base + 1])
        new = (res, dirty, wb, rev)
        old = (vals[base + 3], vals[base + 4], vals[base + 5], vals[base + 6])
        if rev > old[3]:
            self._saw_silent(f)
        if new != old:
            tot = f.tot
            for j, v, was in zip((3, 4, 5, 6), new, old, strict=True):
                tot[j] += v - was
                vals[base + j] = v
            tot[7] += res - vals[base + 7]
            vals[base + 7] = res
            self._rerank(f, i)

    def _folder_fd(self, f: _Folder) -> int | None:
        """An O_PATH fd of folder `f` (it raises no events of its own), kept while files of `f` follow one another;
        None when it cannot be opened."""
        if self._dir is None or self._dir[0] is not f:
            self._close_dir()
            try:
                self._dir = (f, os.open(f.path, _O_DIR_PATH | (os.O_NOFOLLOW if f.depth else 0)))
            except OSError:
                return None
        return self._dir[1]

    def _close_dir(self) -> None:
        """Close the folder `_measure_one` kept open for the next file of the same folder."""
        if self._dir is not None:
            os.close(self._dir[1])
            self._dir = None

    def _measure(self, f: _Folder, dfd: int, name: str, report: WalkReport,
                 relink: bool = False) -> tuple[int, ...] | None:
        """One file's counts, as `scan_residency` counts them; None when it is not counted (see `report`)."""
        ps = kernel.PAGE_SIZE
        path = f"{f.path}/{name}"
        try:
            fd = os.open(name, O_FILE, dir_fd=dfd)
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EPERM):
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                except OSError:
                    skip_error(report, e, path)
                    return None
                if self._linked(st, f, report, relink):
                    return None
                pages = (st.st_size + ps - 1) // ps
                report.unknown = True
                report.skip("unreadable", path, "permission denied (pages unknown)")
                return (st.st_size, pages, pages, 0, 0, 0, 0, 0, pages, pages, 1, st.st_ino)
            skip_error(report, e, path)
            return None
        pages = data = ino = 0
        try:
            st = os.fstat(fd)
            ino = st.st_ino
            if not stat.S_ISREG(st.st_mode):
                report.skip("special")
                return None
            if self._linked(st, f, report, relink):
                return None
            size = st.st_size
            pages = (size + ps - 1) // ps
            runs = data_page_runs(fd, size, ps) if st.st_blocks << 9 < size else None
            data = pages if runs is None else sum(last - first for first, last in runs)
            if pages == 0:
                return (size, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, ino)
            if not f.mincore:
                try:
                    cs = self._cstat(fd)
                except OSError as e:
                    if e.errno == errno.EPERM:
                        report.unknown = True
                        return (size, pages, data, 0, 0, 0, 0, 0, pages, data, 1, ino)
                    if e.errno != errno.ENOSYS:
                        raise
                    f.mincore = True
                else:
                    f.used.add("cachestat")
                    res = min(cs.nr_cache, pages)
                    dirty, wb, rev = cs.nr_dirty, cs.nr_writeback, cs.nr_recently_evicted
                    dres = res if runs is None else resident_in_runs(runs, res, pages, fd)
                    return (size, pages, data, res, dirty, wb, rev, dres, 0, 0, 1, ino)
            if not kernel.residency_visible(st, name, dfd):
                report.unknown = True
                return (size, pages, data, 0, 0, 0, 0, 0, pages, data, 1, ino)
            f.used.add("mincore")
            vec = kernel.mincore_vector(fd, size)
            res = min(vec.count(1), pages)
            dres = res if runs is None else resident_in_runs(runs, res, pages, fd, vec)
            return (size, pages, data, res, 0, 0, 0, dres, 0, 0, 1, ino)
        except OSError as e:
            # It vanished or failed after it was counted: its pages are unknown, not absent.
            skip_error(report, e, path)
            return (0, pages, data, 0, 0, 0, 0, 0, pages, data, 1, ino)
        finally:
            os.close(fd)

    def _measure_batch(self, f: _Folder, dfd: int, names: list[str], report: WalkReport,
                       rows: list[tuple[int, str, tuple[int, ...]]]) -> None:
        """Plain files of `f` measured by the C step in one call, as `_measure` counts them; what it leaves (an
        errno or 0, see dltop/native/_measure.c) `_measure` measures itself."""
        measure = measuring.native_measure()
        pres = [0] * len(names) if f.mincore or measure is None else measure(dfd, names, O_FILE,
                                                                               kernel.NR_CACHESTAT)
        ps = kernel.PAGE_SIZE
        for name, pre in zip(names, pres, strict=True):
            if pre.__class__ is not tuple:
                vals = self._measure(f, dfd, name, report)
            else:
                _dev, ino, nlink, size, cache, dirty, wb, rev = pre
                if nlink > 1 and self._linked_ids(nlink, _dev, ino, f, report, False):
                    continue
                pages = (size + ps - 1) // ps
                if pages == 0:
                    vals = (size, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, ino)
                else:
                    f.used.add("cachestat")
                    res = min(cache, pages)
                    vals = (size, pages, pages, res, dirty, wb, rev, res, 0, 0, 1, ino)
            if vals is not None:
                rows.append((hash(name), name, vals))

    def _linked(self, st: os.stat_result, f: _Folder, report: WalkReport, relink: bool) -> bool:
        """A hard link counted under another name: skipped here (`report` says so)."""
        return self._linked_ids(st.st_nlink, st.st_dev, st.st_ino, f, report, relink)

    def _linked_ids(self, nlink: int, dev: int, ino: int, f: _Folder, report: WalkReport,
                    relink: bool) -> bool:
        if nlink <= 1:
            return False
        key = (dev, ino)
        owner = self._links.get(key)
        if owner is None:
            self._links[key] = f
            f.links.append(key)
            return False
        if owner is f and relink:  # measured again under the name it is counted at
            return False
        report.skip("hardlink")
        return True

    # --- the snapshot part -----------------------------------------------------------------------------------

    def _freeze(self, top: _Folder, steal: int, took_s: float) -> DatasetResidency:
        max_depth = self.options.max_depth
        skipped: dict[str, int] = {}
        problems: list[str] = []
        used: set[str] = set()
        error = oldest_mark = None
        oldest_at = time.time()
        error_sum = 0
        files_top, rows = self._file_rows()

        def node(f: _Folder) -> tuple[list[int], tuple[ResidencyNode, ...]]:
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
                    kids.append(_node(s.path, st, sk, rows.get(s, ())))
            return tot, tuple(sorted(kids, key=lambda k: k.path))

        tot, kids = node(top)
        error = min(error_sum, max(0, steal - (oldest_mark or 0)), tot[3])
        root = _node(top.path, tot, kids, rows.get(top, ()))
        method = used - {"unknown"}
        try:
            fs = kernel.fs_name(kernel.statfs_type(top.path))
        except OSError:
            fs = ""
        return DatasetResidency(
            **{k: getattr(root, k) for k in NODE_FIELDS},
            page_size=kernel.PAGE_SIZE,
            scanned_at=time.time(),
            scan_duration_s=took_s,
            complete=True,
            method="mixed" if len(method) > 1 else (method.pop() if method else "cachestat"),
            fs_type=fs,
            dirs=len(self._order),
            skipped=dict(sorted(skipped.items())),
            problems=tuple(problems),
            unknown_reason=NO_PERMISSION if "unknown" in used or tot[8] else None,
            estimated=error > 0,
            estimate_error_pages=error,
            full_scan_at=oldest_at,
            files_top=files_top,
            files_sorted_by=self._keys if self.options.top_files > 0 else (),
        )

    # --- the file rows -----------------------------------------------------------------------------------------

    def _file_rows(self) -> tuple[int, dict[_Folder, tuple[ResidencyNode, ...]]]:
        """Each shown folder's file rows as `TopFiles` (rank.py) chooses them in a scan (its top n files by each key,
        the biggest folders first within the dataset's budget, n halved where one folder alone is past it), and
        that n. A folder's choice is kept until one of its files' counts changes, so a read where nothing
        changed costs no sort."""
        n, keys, max_depth = self.options.top_files, self._keys, self.options.max_depth
        if n <= 0 or not keys:
            return 0, {}
        owners: dict[_Folder, list[_Folder]] = {}  # a shown folder, and the folders deeper than max_depth in it
        for f in self._order:
            o = f
            while max_depth is not None and o.depth > max_depth and o.parent is not None:
                o = o.parent
            owners.setdefault(o, []).append(f)
        budget = max(0, self.options.top_budget)
        order = sorted(owners, key=lambda o: (sum(g.tot[2] for g in owners[o]), o.path), reverse=True)
        while n > 0:
            out: dict[_Folder, tuple[ResidencyNode, ...]] = {}
            held = 0
            for o in order:
                group = owners[o]
                if len(group) == 1:
                    lists, listed = self._folder_top(o, n)
                else:
                    lists = [heapq.nlargest(n, (e for g in group for e in self._folder_top(g, n)[0][k]),
                                            key=lambda e: (e[0], e[1])) for k in range(len(keys))]
                    listed = _union(lists)
                count = sum(len(x) for x in lists)
                if held + count > budget:
                    break  # this folder and every smaller one list none
                held += count
                if listed:
                    out[o] = listed
            else:
                return n, out
            if out:
                return n, out
            n //= 2  # the biggest folder alone is past the budget
        return 0, {}

    def _folder_top(self, f: _Folder, n: int) -> tuple[list[list[_Ranked]], tuple[ResidencyNode, ...]]:
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
                        node = nodes[i] = self._file_node(f, i)
                    row.append((score, tie, node))
                ranked.append(row)
            t.ranked, t.listed = ranked, _union(ranked)
        return t.ranked, t.listed

    def _scores(self, data: int, dres: int, dunknown: int) -> list[object]:
        """One file's score in each key's order (the tie, the lower inode first, comes apart)."""
        out: list[object] = []
        for key in self._keys:
            if key == "size":
                out.append(data)
            elif key == "resident":
                out.append(dres)
            else:  # coldest first: the lowest resident share, then the most data; nothing to see last
                out.append((-dres / (data - dunknown) if data > dunknown else -2.0, data))
        return out

    def _rank(self, f: _Folder, n: int) -> _Top:
        """Rank all of folder `f`'s files by each key: the best n + _RESERVE of each."""
        m, vals = len(f.keys), f.vals
        data, dres, dunknown = vals[2::_N], vals[7::_N], vals[9::_N]
        ties = list(map(neg, vals[11::_N]))
        keep = n + _RESERVE
        cands, floors = [], []
        for key in self._keys:
            scores: object
            if key == "size":
                scores = data
            elif key == "resident":
                scores = dres
            else:
                scores = [(-r / (d - u) if d > u else -2.0, d) for d, r, u in zip(data, dres, dunknown, strict=True)]
            best = heapq.nlargest(keep + 1, zip(scores, ties, range(m), strict=True))  # type: ignore[call-overload]
            floors.append(best.pop()[:2] if len(best) > keep else None)
            best.reverse()
            cands.append(best)
        return _Top(n, cands, floors)

    def _rerank(self, f: _Folder, i: int) -> None:
        """File `i` of `f` has new counts: it moves in each key's order (in, out, or up and down among the best)
        without ranking the folder again, and its row is made again if it is among them; a file that is in none
        before or after changes nothing."""
        t = f.top
        if t is None:
            return
        b, vals = i * _N, f.vals
        tie = -vals[b + 11]
        keep = t.n + _RESERVE
        touched = False
        for k, score in enumerate(self._scores(vals[b + 2], vals[b + 7], vals[b + 9])):
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

    @staticmethod
    def _file_node(f: _Folder, i: int) -> ResidencyNode:
        v, b, name = f.vals, i * _N, f.name(i)
        return ResidencyNode(path=f"{f.path}/{name}" if f.path != "/" else f"/{name}", files=1, size_bytes=v[b],
                             pages=v[b + 1], resident_pages=v[b + 3], dirty_pages=v[b + 4], unknown_pages=v[b + 8],
                             writeback_pages=v[b + 5], recently_evicted_pages=v[b + 6], data_pages=v[b + 2],
                             data_resident_pages=v[b + 7], data_unknown_pages=v[b + 9])


def _node(path: str, t: list[int], kids: tuple[ResidencyNode, ...],
          files: tuple[ResidencyNode, ...] = ()) -> ResidencyNode:
    return ResidencyNode(path=path, files=t[10], size_bytes=t[0], pages=t[1],
                         resident_pages=t[3], dirty_pages=t[4], unknown_pages=t[8], writeback_pages=t[5],
                         recently_evicted_pages=t[6], data_pages=t[2], data_resident_pages=t[7],
                         data_unknown_pages=t[9], children=kids, top_files=files)


def _union(lists: list[list[_Ranked]]) -> tuple[ResidencyNode, ...]:
    """The rows of every key's top, each once: the first key's order, then the others' additions."""
    seen: dict[int, ResidencyNode] = {}
    for row in lists:
        for _, _, node in row:
            seen.setdefault(id(node), node)
    return tuple(seen.values())



def _padded(name: bytes) -> bytes:
    """`name` as an inotify record carries it: NUL-padded to the next multiple of 16 bytes past its end."""
    return name + b"\0" * (((len(name) + 16) & ~15) - len(name))


def _run(buf: bytes, pos: int, size: int) -> int:
    """How many records from `pos` on are `size` bytes long (at least 1: the one at `pos`). Each one of them is
    read at a true record's start, the first of another size too (every one before it was `size`): so their
    length fields, compared in C, say where the run ends."""
    count = (len(buf) - pos) // size
    if count <= 1 or size & 3:
        return 1
    lens = memoryview(buf)[pos:pos + count * size].cast("I")[3::size >> 2].tobytes()
    want = (size - 16).to_bytes(4, sys.byteorder) * count
    if lens == want:
        return count
    lo, hi = 1, count  # lens[:4 lo] matches, lens[:4 hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if lens[:4 * mid] == want[:4 * mid]:
            lo = mid
        else:
            hi = mid
    return lo
