"""Dataset residency: walk a tree like vmtouch, ask the kernel per file how much is in the page cache.

One cachestat(2) per file (mmap + mincore where cachestat is missing or wrong, as through overlayfs),
totals per folder for drill-down (memory grows with folders, not files), and every file the walk could
not count is counted and reported, never fatal. A folder's files are kept only as its top few by each sort
key asked for (`TopFiles`), in memory bounded by the number of folders, not files.
"""

from __future__ import annotations

import dataclasses
import errno
import fnmatch
import heapq
import os
import re
import stat
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from dltop import kernel
from dltop.model.base import display_path
from dltop.model.datasets import (
    NO_PERMISSION,
    DatasetResidency,
    DatasetsPart,
    DatasetUnavailable,
    ResidencyNode,
)
from dltop.sources.walkbudget import MAX_PROBLEMS, _Budget, path_error  # noqa: F401 - this module's API too

if TYPE_CHECKING:  # in annotations only
    import threading

# How often (in files) a huge flat folder checks the cancel flag, the deadline and the CPU budget.
_CHECK_EVERY_FILES = 2048
_DROPPED_EVERY = 256  # files an act's inline drops are reported in (its progress moves by that many)

_O_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_O_FILE_FOLLOW = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC

_BATCH = 256  # plain files a folder's C step measures in one call (dltop.native._measure)

_scandir = os.scandir  # tests replace this to make files vanish between listing and opening


@dataclass(frozen=True)
class WalkOptions:
    """How to walk a tree; the defaults are vmtouch's."""

    follow_symlinks: bool = False
    cross_filesystems: bool = False
    ignore: tuple[str, ...] = ()  # glob patterns on names; a matching file or folder is skipped
    include: tuple[str, ...] = ()  # glob patterns on file names; when given, only matching files count
    max_depth: int | None = None  # folders deeper than this are added to their ancestor at this depth
    # Per-file rows (a scan only; actions ignore these): each folder keeps its top `top_files` files by each
    # key of `top_keys` (FILE_SORT_KEYS), a dataset at most `top_budget` of them in all (the number per folder
    # shrinks to fit). 0: no files kept, the folders' totals only.
    top_files: int = 0
    top_keys: tuple[str, ...] = ("size",)
    top_budget: int = 4096


DEFAULT_WALK = WalkOptions()


def _compile(patterns: tuple[str, ...]) -> re.Pattern[str] | None:
    if not patterns:
        return None
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns))


class WalkReport:
    """What the walk skipped and why; shared by the scan and the actions."""

    def __init__(self) -> None:
        self.skipped: dict[str, int] = {}
        self.problems: list[str] = []
        self.unknown = False
        self.dirs = 0
        self.complete = True

    def skip(self, why: str, path: str | None = None, detail: str | None = None) -> None:
        """Count one entry not counted; keep a line about it when it is a problem worth reading."""
        self.skipped[why] = self.skipped.get(why, 0) + 1
        if detail is not None and len(self.problems) < MAX_PROBLEMS:
            self.problems.append(f"{detail}: {display_path(path or '')}")


def counted_before(st: os.stat_result, seen: set[tuple[int, int]], report: WalkReport) -> bool:
    """Whether this file was counted already under another name (a hard link, or a symlink followed to it), and
    then skipped in `report`; else it is remembered in `seen`. Callers ask only for files with more than one
    link, and for every file when following symlinks (a symlink can alias a file with one link)."""
    key = (st.st_dev, st.st_ino)
    if key in seen:
        report.skip("hardlink" if st.st_nlink > 1 else "duplicate_file")
        return True
    seen.add(key)
    return False


class _Acc:
    """A folder's running totals while scanning (files directly in it and in folders folded into it)."""

    __slots__ = ("path", "files", "size", "pages", "res", "dirty", "unknown", "wb", "rev", "data", "dres", "dunknown",
                 "children")

    def __init__(self, path: str) -> None:
        self.path = path
        self.files = self.size = self.pages = self.res = self.dirty = self.unknown = self.wb = self.rev = 0
        self.data = self.dres = self.dunknown = 0
        self.children: list[_Acc] = []

    def add(self, files: int, size: int, pages: int, res: int, dirty: int, wb: int, rev: int, data: int,
            dres: int) -> None:
        """Fold in the running totals a scan kept in locals for this folder."""
        self.files += files
        self.size += size
        self.pages += pages
        self.res += res
        self.dirty += dirty
        self.wb += wb
        self.rev += rev
        self.data += data
        self.dres += dres

    def freeze(self, files: dict[_Acc, tuple[ResidencyNode, ...]] | None = None) -> ResidencyNode:
        kids = tuple(c.freeze(files) for c in self.children)
        return ResidencyNode(
            path=self.path,
            files=self.files + sum(k.files for k in kids),
            size_bytes=self.size + sum(k.size_bytes for k in kids),
            pages=self.pages + sum(k.pages for k in kids),
            resident_pages=self.res + sum(k.resident_pages for k in kids),
            dirty_pages=self.dirty + sum(k.dirty_pages for k in kids),
            unknown_pages=self.unknown + sum(k.unknown_pages for k in kids),
            writeback_pages=self.wb + sum(k.writeback_pages for k in kids),
            recently_evicted_pages=self.rev + sum(k.recently_evicted_pages for k in kids),
            data_pages=self.data + sum(k.data_pages for k in kids),
            data_resident_pages=self.dres + sum(k.data_resident_pages for k in kids),
            data_unknown_pages=self.dunknown + sum(k.data_unknown_pages for k in kids),
            children=tuple(sorted(kids, key=lambda k: k.path)),
            top_files=files.get(self, ()) if files else (),
        )


def _size_key(acc: _Acc) -> tuple[int, str]:
    """The order folders give up their files in when the budget runs out: least data first, then by path."""
    return (acc.data, acc.path)


# The keys a folder's files can be sorted by, each meaning "shown first": most data, most resident, coldest (the
# lowest resident share; among equals the most data; files with no data to see last).
FILE_SORT_KEYS = ("size", "resident", "pct")


class TopFiles:
    """Each folder's top `n` files by each sort key, as the scan offers them one by one: a heap per folder and
    key, so a folder of a million files keeps a few entries, never a million. The dataset's whole `budget`
    bounds the entries held: past twice that, the folders with the least data (the one being scanned aside)
    drop their files until it fits again, and a folder with no more data than one dropped lists none at the end
    either, so the files listed are those of the biggest folders. Only where one folder alone is past the budget
    is `n` halved. Ties go to the lower inode, so an unchanged folder lists the same files on every scan."""

    def __init__(self, n: int, keys: tuple[str, ...], budget: int) -> None:
        self.n, self.keys, self.budget = max(0, n), tuple(k for k in keys if k in FILE_SORT_KEYS), max(0, budget)
        self._heaps: dict[_Acc, tuple[list[Any], ...]] = {}
        self._held = 0  # entries in all heaps (a file in two heaps counted twice)
        self._seq = 0  # makes heap items unique, so two entries are never compared
        self.dropped: set[_Acc] = set()  # folders whose files are not listed: the budget went to bigger ones
        self._floor: tuple[int, str] | None = None  # (data, path) of the biggest folder dropped

    def offer(self, acc: _Acc, dir_path: str, name: str, dfd: int | None, ino: int, size: int, pages: int, data: int,
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
            score: Any
            if key == "size":
                score = data
            elif key == "resident":
                score = dres
            else:
                known = data - dunknown
                score = (-dres / known if known > 0 else -2.0, data)
            full = len(heap) >= n
            if full:
                low = heap[0]
                if score < low[0] or (score == low[0] and tie <= low[1]):
                    continue
            if entry is None:
                entry = (_join(dir_path, name, dfd), size, pages, res, dirty, unknown, wb, rev, data, dres, dunknown)
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

    def _drop_smallest(self, target: int, keep: _Acc | None = None) -> None:
        """Drop the files of the folders with the least data (not `keep`) until at most `target` are held."""
        for acc in sorted((a for a in self._heaps if a is not keep), key=_size_key):
            if self._held <= target:
                return
            self._drop(acc)

    def _drop(self, acc: _Acc) -> None:
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

    def rows(self) -> dict[_Acc, tuple[ResidencyNode, ...]]:
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
        lo = self.n
        out: dict[_Acc, tuple[ResidencyNode, ...]] = {}
        for acc, heaps in self._heaps.items():
            seen: dict[int, ResidencyNode] = {}
            for heap in heaps:
                for item in heapq.nlargest(lo, heap):
                    e = item[3]
                    if id(e) not in seen:
                        seen[id(e)] = ResidencyNode(
                            path=e[0], files=1, size_bytes=e[1], pages=e[2], resident_pages=e[3], dirty_pages=e[4],
                            unknown_pages=e[5], writeback_pages=e[6], recently_evicted_pages=e[7], data_pages=e[8],
                            data_resident_pages=e[9], data_unknown_pages=e[10])
            if seen:
                out[acc] = tuple(seen.values())
        return out


@dataclass
class _Dir:
    path: str
    depth: int
    dev: int
    acc: _Acc
    mincore: bool = False  # count this folder's files with mincore (overlayfs, or no cachestat)
    ino: int = 0
    parent: _Dir | None = None

    def has_ancestor(self, dev: int, ino: int) -> bool:
        """This folder, or one above it on the path the walk took, is (dev, ino): entering it again loops."""
        d: _Dir | None = self
        while d is not None:
            if d.ino == ino and d.dev == dev:
                return True
            d = d.parent
        return False


def walk(
    root: str,
    options: WalkOptions,
    report: WalkReport,
    root_acc: _Acc,
    budget: _Budget | None = None,
    by_inode: bool = False,
    shard: tuple[int, int, int] | None = None,
    seen_dirs: set[tuple[int, int]] | None = None,
    batch: int = 0,
) -> Iterator[tuple[_Dir, int | None, Any, bool]]:
    """Yield (folder, folder fd, name, follow) for each entry that should be a regular file.

    With `batch` (and not `by_inode`), consecutive plain files of a folder (not symlinks) come as one item whose
    name is a list of up to `batch` names, in listing order, for a caller that measures them in one call (the C
    step, dltop.native._measure); anything else is yielded as before, after the names listed ahead of it.

    A root that is a file is yielded as (its parent, None, its full path, True). Folders, symlinks,
    special files, other filesystems and ignored names are handled here and counted in `report`.
    With `by_inode`, each folder's files come in inode order rather than readdir's (hash) order: on ext4
    and XFS that is close to disk order, so reads of neighbouring small files merge into larger ones.
    With `shard=(k, n, bits)` (implies `by_inode`), only files with `(inode >> bits) % n == k`: n processes
    walking the same tree share its files out between them in runs of 2**bits consecutive inodes (neighbours
    on disk stay together, so their reads still merge), and the hard links of a file all go to one of them.
    `seen_dirs`, when given, is filled with the (device, inode) of every folder the walk reaches.
    Following symlinks, a folder is entered once: one that is its own ancestor is a loop, one reached again by
    another path (a symlinked alias) a duplicate. Folders reached through a symlink are walked after the real
    tree, so a folder inside it is counted at its real path, not at an alias.
    """
    if shard is not None:
        by_inode = True
        k, n_shards, run_bits = shard
    ignore = _compile(options.ignore)
    include = _compile(options.include)
    st = os.stat(root)  # a root given as a symlink is followed, as vmtouch and du do
    if not stat.S_ISDIR(st.st_mode):
        if stat.S_ISREG(st.st_mode):
            if shard is not None and (st.st_ino >> run_bits) % n_shards != k:
                return
            yield _Dir(os.path.dirname(root) or ".", 0, st.st_dev, root_acc), None, root, True
        else:
            report.skip("special", root, "not a regular file or folder")
        return
    counted_at = {(st.st_dev, st.st_ino): root}  # folder -> the path it is counted at
    if seen_dirs is not None:
        seen_dirs.add((st.st_dev, st.st_ino))
    root_dev = st.st_dev
    mincore_devs: dict[int, bool] = {}
    stack = [_Dir(root, 0, st.st_dev, root_acc, ino=st.st_ino)]
    linked: deque[tuple[_Dir, str, os.stat_result]] = deque()  # folders reached through a symlink: last
    max_depth = options.max_depth
    follow = options.follow_symlinks

    def enter(parent: _Dir, path: str, est: os.stat_result) -> _Dir | None:
        """The folder at `path` to walk, or None when it was counted already at another path."""
        key = (est.st_dev, est.st_ino)
        first = counted_at.setdefault(key, path)
        if first != path:
            report.skip("duplicate_folder", path, f"duplicate of {display_path(first)}, counted there")
            return None
        if seen_dirs is not None:
            seen_dirs.add(key)
        depth = parent.depth + 1
        if max_depth is None or depth <= max_depth:
            acc = _Acc(path)
            parent.acc.children.append(acc)
        else:
            acc = parent.acc
        return _Dir(path, depth, est.st_dev, acc, ino=est.st_ino, parent=parent)

    while stack or linked:
        if budget is not None and budget.stop():
            report.complete = False
            return
        if stack:
            d = stack.pop()
        else:
            entered = enter(*linked.popleft())
            if entered is None:
                continue
            d = entered
        try:
            dfd = os.open(d.path, _O_DIR if (follow or d.depth == 0) else _O_DIR | os.O_NOFOLLOW)
        except OSError as e:
            if d.depth == 0:
                raise  # the root itself cannot be read: that is the caller's error, not a skipped folder
            _skip_error(report, e, d.path)
            continue
        try:
            if d.dev not in mincore_devs:
                mincore_devs[d.dev] = _needs_mincore(dfd)
            d.mincore = mincore_devs[d.dev]
            report.dirs += 1
            subdirs: list[_Dir] = []
            held: list[tuple[int, str, bool]] | None = [] if by_inode else None
            names: list[str] | None = [] if batch and held is None else None
            try:
                entries = _scandir(dfd)
            except OSError as e:
                if d.depth == 0:
                    raise
                _skip_error(report, e, d.path)
                continue
            with entries:
                n = 0
                try:
                    for entry in entries:
                        name = entry.name
                        if ignore is not None and ignore.match(name):
                            report.skip("ignored")
                            continue
                        try:
                            if entry.is_file(follow_symlinks=False):
                                if include is not None and not include.match(name):
                                    report.skip("ignored")
                                elif names is not None:
                                    names.append(name)
                                    if len(names) >= batch:
                                        yield d, dfd, names, False
                                        names = []
                                elif held is not None:
                                    held.append((entry.inode(), name, False))
                                else:
                                    yield d, dfd, name, False
                                n += 1
                                if n % _CHECK_EVERY_FILES == 0 and budget is not None and budget.stop():
                                    if names:
                                        yield d, dfd, names, False
                                    report.complete = False
                                    return
                                continue
                            if names:  # what was listed before this entry is measured before it
                                yield d, dfd, names, False
                                names = []
                            is_link = entry.is_symlink()
                            if is_link and not follow:
                                report.skip("symlink")
                                continue
                            if is_link:
                                try:
                                    est = os.stat(name, dir_fd=dfd)
                                except OSError as e:
                                    what = "symlink loop" if e.errno == errno.ELOOP else "broken symlink"
                                    report.skip(what.replace(" ", "_"), f"{d.path}/{name}", what)
                                    continue
                            elif entry.is_dir(follow_symlinks=False):
                                est = entry.stat(follow_symlinks=False)
                            else:
                                report.skip("special")  # FIFO, socket, device: never opened
                                continue
                        except OSError as e:
                            if names:
                                yield d, dfd, names, False
                                names = []
                            _skip_error(report, e, f"{d.path}/{name}")
                            continue
                        if stat.S_ISDIR(est.st_mode):
                            path = f"{d.path}/{name}" if d.path != "/" else f"/{name}"
                            if d.has_ancestor(est.st_dev, est.st_ino):
                                report.skip("symlink_loop", path, "symlink loop (a folder inside itself)")
                                continue
                            if est.st_dev != root_dev and not options.cross_filesystems:
                                report.skip("other_filesystem")
                                continue
                            if is_link:
                                linked.append((d, path, est))
                            elif (sub := enter(d, path, est)) is not None:
                                subdirs.append(sub)
                        elif stat.S_ISREG(est.st_mode):
                            if include is not None and not include.match(name):
                                report.skip("ignored")
                            elif held is not None:
                                held.append((est.st_ino, name, True))
                            else:
                                yield d, dfd, name, True
                        else:
                            report.skip("special")
                except OSError as e:
                    # The listing itself failed part way: /proc/PID/fdinfo refuses even root (EACCES), a
                    # /proc/PID that ends mid-listing gives ENOENT. What was listed is walked; the folder is
                    # counted as skipped. Only the root failing is the caller's error.
                    if names:
                        yield d, dfd, names, False
                        names = []
                    if d.depth == 0:
                        raise
                    _skip_error(report, e, d.path)
            if names:
                yield d, dfd, names, False
            if held:
                held.sort()
                for ino, name, follow_it in held:
                    if shard is None or (ino >> run_bits) % n_shards == k:
                        yield d, dfd, name, follow_it
            if by_inode:
                subdirs.sort(key=lambda s: s.ino)
            stack.extend(reversed(subdirs))
        finally:
            os.close(dfd)


def _native_measure() -> Any:
    """The C per-file step `measure(dir_fd, names, flags, nr_cachestat)` (dltop/native/_measure.c), or None where
    its Python twin runs (not built, stale, or DLTOP_NATIVE=0: dltop.native.status() says which)."""
    from dltop import native

    mod = native.load("_measure")
    return None if mod is None else mod.measure


def _needs_mincore(fd: int) -> bool:
    """cachestat cannot be trusted on this filesystem (or this kernel): count pages with mincore."""
    if not kernel.have_cachestat():
        return True
    try:
        return kernel.fstatfs_type(fd) == kernel.OVERLAYFS_SUPER_MAGIC
    except OSError:
        return False


def _skip_error(report: WalkReport, e: OSError, path: str) -> None:
    if e.errno == errno.ENOENT:
        report.skip("vanished", path, "vanished during the scan")
    elif e.errno in (errno.EACCES, errno.EPERM):
        report.skip("unreadable", path, "permission denied")
    elif e.errno == errno.ELOOP:
        report.skip("symlink", path)
    else:
        report.skip("error", path, e.strerror or str(e))


def data_extents(fd: int, size: int) -> list[tuple[int, int]]:
    """The (start, end) byte ranges of a file that hold data; holes of a sparse file are left out."""
    extents = []
    pos = 0
    try:
        while pos < size:
            start = os.lseek(fd, pos, os.SEEK_DATA)
            end = os.lseek(fd, start, os.SEEK_HOLE)
            extents.append((start, min(end, size)))
            pos = end
    except OSError as e:
        if e.errno == errno.ENXIO:  # no data after pos: the rest is a hole
            return extents
        return [(0, size)]  # filesystem without SEEK_DATA: treat it all as data
    return extents


def data_page_runs(fd: int, size: int, page_size: int = kernel.PAGE_SIZE) -> list[tuple[int, int]]:
    """The [first, last) page numbers of an open file that hold data: its data extents in whole pages, merged."""
    runs: list[tuple[int, int]] = []
    for start, end in data_extents(fd, size):
        first, last = start // page_size, (end + page_size - 1) // page_size
        if runs and first <= runs[-1][1]:
            runs[-1] = (runs[-1][0], max(last, runs[-1][1]))
        elif last > first:
            runs.append((first, last))
    return runs


def data_pages(fd: int, st: os.stat_result, page_size: int = kernel.PAGE_SIZE) -> int:
    """Pages of an open file that hold data: what reading it (holes skipped) brings into memory.

    A file with at least as many allocated blocks as bytes has no holes: all its pages, without a system call.
    Fewer blocks (a sparse file, or compression on ZFS) and SEEK_DATA/SEEK_HOLE say where the data is.
    """
    if st.st_blocks * 512 >= st.st_size:
        return (st.st_size + page_size - 1) // page_size
    return sum(last - first for first, last in data_page_runs(fd, st.st_size, page_size))


def _resident_in_runs(runs: list[tuple[int, int]], resident: int, pages: int, fd: int, vec: bytes | None = None) -> int:
    """Resident pages among a sparse file's runs of data: counted in `vec` (mincore's), else by cachestat per run."""
    if resident <= 0:
        return 0
    if resident >= pages:
        return sum(last - first for first, last in runs)
    if vec is not None:
        return sum(vec.count(1, first, last) for first, last in runs)
    ps = kernel.PAGE_SIZE
    return sum(kernel.cachestat(fd, first * ps, (last - first) * ps).cache for first, last in runs)


@dataclass
class WarmNeed:
    """Filled in by a scan given one: what warming the scanned files would bring into memory, in pages.

    Per file: its pages of data (holes are never read) less its resident pages of data; a file whose residency
    the kernel hides counts all its data pages, since the guard must not take unknown pages as resident.
    """

    pages: int = 0


class FileAct(Protocol):
    """What `scan_residency(act=)` calls for an open file: `before` its resident pages (None: hidden from this
    user), `busy` its dirty and writeback pages, `cstat` the scan's cachestat caller (None: the file is counted
    with mincore). It returns the pages resident after; when it measured with `cstat`, that caller's struct must
    hold the state after (the scan counts it).

    An act may also have `drops_inline(fd, st)`, asked once per device: True lets the scan drop a file's clean
    pages itself there (POSIX_FADV_DONTNEED, then cachestat again) and report the files it emptied so in batches,
    `dropped(files, pages, dir_path, name, dfd)` (the last one's name): the act's call and bookkeeping per file
    cost ~0.5 us of an evict's ~12. A file with dirty pages, or pages left after, is handed to the act as above."""

    def __call__(self, fd: int, st: os.stat_result, dir_path: str, name: str, dfd: int | None, before: int | None,
                 busy: int, cstat: Any) -> int | None: ...


def scan_residency(
    path: str | bytes | os.PathLike[str],
    options: WalkOptions = WalkOptions(),
    *,
    cancel: threading.Event | None = None,
    deadline_s: float | None = None,
    cpu_fraction: float | None = None,
    warm_need: WarmNeed | None = None,
    seen_dirs: set[tuple[int, int]] | None = None,
    act: FileAct | None = None,
) -> DatasetResidency:
    """Scan one file or tree once: per-folder page-cache residency, as fincore would count it, and of the data.

    `deadline_s` (seconds from now), `cancel` and `cpu_fraction` bound the scan; a scan cut short says so
    (`complete=False`) and its totals cover the part reached. Raises OSError when the root itself is missing
    or cannot be read (what cannot be read below it is counted and reported instead). With `warm_need`, also
    adds up what a warm would read (see `WarmNeed`); `seen_dirs` is filled as `walk` fills it.
    Only a file with fewer allocated blocks than bytes can have holes: only those are asked where their data
    lies (SEEK_DATA) and, when some of their pages are resident, which of those are data (one cachestat per
    run of data, or the mincore vector already taken).
    With `act` (see `FileAct`), each file with resident pages, or whose residency is hidden, is handed to it
    while open, and what is counted is the state it leaves: an evict measures, acts and re-measures in one walk.
    """
    t0 = time.monotonic()
    root = os.fsdecode(path)
    if len(root) > 1:
        root = root.rstrip("/")
    ps = kernel.PAGE_SIZE
    shift = ps.bit_length() - 1
    report = WalkReport()
    acc = _Acc(root)
    budget = _Budget(cancel, None if deadline_s is None else t0 + deadline_s, cpu_fraction)
    seen_inodes: set[tuple[int, int]] = set()
    any_alias = options.follow_symlinks
    cstat = kernel.cachestat_caller()
    cs = cstat.out  # cstat(fd) fills this one struct
    cs_call, cs_nr, cs_range, cs_out = cstat.raw()  # the same call, without a Python frame per file
    used: set[str] = set()
    by_cachestat = False
    os_open, os_close, os_fstat = os.open, os.close, os.fstat
    S_ISREG = stat.S_ISREG
    drops_inline: Any = getattr(act, "drops_inline", None)  # optional, see FileAct
    report_dropped: Any = getattr(act, "dropped", None)
    if report_dropped is None:
        drops_inline = None
    inline_devs: dict[int, bool] = {}  # device -> the act lets the scan drop clean pages there
    fadvise, DONTNEED = os.posix_fadvise, os.POSIX_FADV_DONTNEED
    dropped_files = dropped_pages = 0  # dropped inline, not yet reported to the act
    last_dir, last_name, last_dfd = root, "", None
    top = TopFiles(options.top_files, options.top_keys, options.top_budget) if options.top_files > 0 else None
    # The folder being counted and its running totals, kept in locals and added to its _Acc when the walk
    # moves on: attribute updates per file cost more than the syscalls they count.
    a: _Acc | None = None
    files = size_sum = pages_sum = res_sum = dirty_sum = wb_sum = rev_sum = data_sum = dres_sum = 0
    # The C step measures a folder's plain files in batches; in an evict it also drops clean pages itself where
    # the act lets the scan do so (a file it cannot empty so goes to the act, as below). Following symlinks, an
    # evict's files go one by one: an alias must reach the act once.
    measure = _native_measure() if act is None or (drops_inline is not None and not any_alias) else None
    nr_cachestat = kernel.NR_CACHESTAT
    alone: Any = (None,)
    for d, dfd, item, follow in walk(root, options, report, acc, budget, seen_dirs=seen_dirs,
                                     batch=_BATCH if measure is not None else 0):
        if d.acc is not a:
            if a is not None:
                a.add(files, size_sum, pages_sum, res_sum, dirty_sum, wb_sum, rev_sum, data_sum, dres_sum)
            a = d.acc
            files = size_sum = pages_sum = res_sum = dirty_sum = wb_sum = rev_sum = data_sum = dres_sum = 0
        if item.__class__ is str:
            names, pres = (item,), alone
        elif d.mincore or measure is None:
            names, pres = item, [None] * len(item)
        elif act is None:  # the C step measured the plain ones; an int (an errno): the Python step measures it
            names, pres = item, measure(dfd, item, _O_FILE, nr_cachestat)
        else:
            inline = inline_devs.get(d.dev)
            if inline is None:  # asked of the folder: its filesystem is its files' (the C step checks the device)
                try:
                    inline = inline_devs[d.dev] = bool(drops_inline(dfd, os_fstat(dfd)))  # type: ignore[arg-type]
                except OSError:
                    inline = False  # not asked again here: each file's own step asks, as it always did
            names, pres = item, measure(dfd, item, _O_FILE, nr_cachestat, d.dev if inline else -1)
        for name, pre in zip(names, pres, strict=True):
            if pre.__class__ is tuple and act is not None:
                before = pre[8]  # the pages the C step dropped the file's from; -1: it did not drop them
                if before >= 0:
                    if pre[4]:  # pages stayed: what went is said, the act flushes and drops again (below)
                        report_dropped(0, before - pre[4], d.path, name, dfd)
                        pre = 0
                    else:
                        dropped_files += 1
                        dropped_pages += before
                        last_dir, last_name, last_dfd = d.path, name, dfd
                        if dropped_files >= _DROPPED_EVERY:
                            report_dropped(dropped_files, dropped_pages, last_dir, last_name, last_dfd)
                            dropped_files = dropped_pages = 0
                elif pre[4]:
                    pre = 0  # dirty, a hard link, not to be dropped here: the Python step hands it to the act
                if pre:
                    pre = pre[:8]
            if pre.__class__ is tuple:
                dev, ino, nlink, size, res, dirty, wb, rev = pre
                if nlink > 1 or any_alias:
                    key = (dev, ino)
                    if key in seen_inodes:
                        report.skip("hardlink" if nlink > 1 else "duplicate_file")
                        continue
                    seen_inodes.add(key)
                pages = (size + ps - 1) >> shift
                files += 1
                size_sum += size
                pages_sum += pages
                data_sum += pages
                if pages == 0:
                    if top is not None:
                        top.offer(a, d.path, name, dfd, ino, size, 0, 0, 0, 0)
                    continue
                by_cachestat = True
                if res > pages:
                    res = pages
                res_sum += res
                dirty_sum += dirty
                wb_sum += wb
                rev_sum += rev
                dres_sum += res
                if warm_need is not None:
                    warm_need.pages += pages - res
                if top is not None:
                    top.offer(a, d.path, name, dfd, ino, size, pages, pages, res, res, dirty, wb, rev)
                continue
            try:
                fd = os_open(name, _O_FILE_FOLLOW if follow else _O_FILE, dir_fd=dfd)
            except OSError as e:
                if dfd is None:
                    raise  # the root is this file, and it cannot be read
                if e.errno in (errno.EACCES, errno.EPERM):
                    # Cannot open it, but its size is public: its pages are unknown, not absent (and so is where its
                    # data lies: all its pages count as data).
                    try:
                        st = os.stat(name, dir_fd=dfd, follow_symlinks=follow)
                    except OSError:
                        _skip_error(report, e, _join(d.path, name, dfd))
                        continue
                    if (st.st_nlink > 1 or any_alias) and counted_before(st, seen_inodes, report):
                        continue
                    pages = (st.st_size + ps - 1) >> shift
                    files += 1
                    size_sum += st.st_size
                    pages_sum += pages
                    data_sum += pages
                    a.unknown += pages
                    a.dunknown += pages
                    report.unknown = True
                    report.skip("unreadable", _join(d.path, name, dfd), "permission denied (pages unknown)")
                    if top is not None:
                        top.offer(a, d.path, name, dfd, st.st_ino, st.st_size, pages, pages, 0, 0, unknown=pages,
                                  dunknown=pages)
                else:
                    _skip_error(report, e, _join(d.path, name, dfd))
                continue
            pages = data = 0
            try:
                st = os_fstat(fd)
                if not S_ISREG(st.st_mode):  # replaced by something else since it was listed
                    report.skip("special")
                    continue
                if (st.st_nlink > 1 or any_alias) and counted_before(st, seen_inodes, report):
                    continue
                size = st.st_size
                pages = (size + ps - 1) >> shift
                runs = data_page_runs(fd, size, ps) if st.st_blocks << 9 < size else None
                data = pages if runs is None else sum(last - first for first, last in runs)
                files += 1
                size_sum += size
                pages_sum += pages
                data_sum += data
                if pages == 0:
                    if top is not None:
                        top.offer(a, d.path, name, dfd, st.st_ino, size, 0, 0, 0, 0)
                    continue
                if not d.mincore:
                    try:
                        if cs_call(cs_nr, fd, cs_range, cs_out, 0):
                            cstat.fail()
                    except OSError as e:
                        if e.errno == errno.EPERM:
                            if act is not None:
                                act(fd, st, d.path, name, dfd, None, 0, None)
                            a.unknown += pages
                            a.dunknown += data
                            report.unknown = True
                            if warm_need is not None:
                                warm_need.pages += data
                            if top is not None:
                                top.offer(a, d.path, name, dfd, st.st_ino, size, pages, data, 0, 0, unknown=pages,
                                          dunknown=data)
                            continue
                        if e.errno != errno.ENOSYS:
                            raise
                        d.mincore = True
                    else:
                        by_cachestat = True
                        res = cs.nr_cache
                        if act is not None and res:
                            busy = cs.nr_dirty + cs.nr_writeback
                            inline = False
                            if drops_inline is not None and not busy:
                                inline = inline_devs.get(st.st_dev)  # type: ignore[assignment]
                                if inline is None:
                                    inline = inline_devs[st.st_dev] = bool(drops_inline(fd, st))
                            if inline:
                                fadvise(fd, 0, 0, DONTNEED)
                                if cs_call(cs_nr, fd, cs_range, cs_out, 0):
                                    cstat.fail()
                                if cs.nr_cache == 0:
                                    dropped_files += 1
                                    dropped_pages += res
                                    last_dir, last_name, last_dfd = d.path, name, dfd
                                    if dropped_files >= _DROPPED_EVERY:
                                        report_dropped(dropped_files, dropped_pages, last_dir, last_name, last_dfd)
                                        dropped_files = dropped_pages = 0
                                    inline = True
                                else:
                                    inline = False  # pages stayed: the act flushes, drops again and says why
                            if not inline:
                                act(fd, st, d.path, name, dfd, res, busy, cstat)
                            res = cs.nr_cache  # what the act left
                        if res > pages:
                            res = pages
                        dres = res if runs is None else _resident_in_runs(runs, res, pages, fd)
                        res_sum += res
                        dirty_sum += cs.nr_dirty
                        wb_sum += cs.nr_writeback
                        rev_sum += cs.nr_recently_evicted
                        dres_sum += dres
                        if warm_need is not None:
                            warm_need.pages += data - dres
                        if top is not None:
                            top.offer(a, d.path, name, dfd, st.st_ino, size, pages, data, res, dres, cs.nr_dirty,
                                      cs.nr_writeback, cs.nr_recently_evicted)
                        continue
                if not kernel.residency_visible(st, name, dfd):
                    if act is not None:
                        act(fd, st, d.path, name, dfd, None, 0, None)
                    a.unknown += pages
                    a.dunknown += data
                    report.unknown = True
                    if warm_need is not None:
                        warm_need.pages += data
                    if top is not None:
                        top.offer(a, d.path, name, dfd, st.st_ino, size, pages, data, 0, 0, unknown=pages, dunknown=data)
                    continue
                used.add("mincore")
                vec = kernel.mincore_vector(fd, size)
                if act is not None and 1 in vec:
                    act(fd, st, d.path, name, dfd, vec.count(1), 0, None)
                    vec = kernel.mincore_vector(fd, size)
                res = min(vec.count(1), pages)
                dres = res if runs is None else _resident_in_runs(runs, res, pages, fd, vec)
                res_sum += res
                dres_sum += dres
                if warm_need is not None:
                    warm_need.pages += data - dres
                if top is not None:
                    top.offer(a, d.path, name, dfd, st.st_ino, size, pages, data, res, dres)
            except OSError as e:
                # The file vanished or failed after it was counted: its pages are unknown, not absent.
                _skip_error(report, e, _join(d.path, name, dfd))
                a.unknown += pages
                a.dunknown += data
            finally:
                os_close(fd)
    if a is not None:
        a.add(files, size_sum, pages_sum, res_sum, dirty_sum, wb_sum, rev_sum, data_sum, dres_sum)
    if dropped_files:
        report_dropped(dropped_files, dropped_pages, last_dir, last_name, last_dfd)
    if by_cachestat:
        used.add("cachestat")
    node = acc.freeze(top.rows() if top is not None else None)
    try:
        fs = kernel.fs_name(kernel.statfs_type(root))
    except OSError:
        fs = ""
    return DatasetResidency(
        **{f: getattr(node, f) for f in _NODE_FIELDS},
        page_size=ps,
        scanned_at=time.time(),
        scan_duration_s=time.monotonic() - t0,
        complete=report.complete,
        method="mixed" if len(used) > 1 else (used.pop() if used else "cachestat"),
        fs_type=fs,
        dirs=report.dirs,
        skipped=dict(sorted(report.skipped.items())),
        problems=tuple(report.problems),
        unknown_reason=NO_PERMISSION if report.unknown else None,
        files_top=top.n if top is not None else 0,
        files_sorted_by=top.keys if top is not None else (),
    )


_NODE_FIELDS = tuple(ResidencyNode.__dataclass_fields__)


def _join(dir_path: str, name: str, dfd: int | None) -> str:
    return name if dfd is None else (f"{dir_path}/{name}" if dir_path != "/" else f"/{name}")


def scan_paths(
    paths: tuple[str, ...] | list[str],
    options: WalkOptions = WalkOptions(),
    *,
    cancel: threading.Event | None = None,
    deadline_s: float | None = None,
    cpu_fraction: float | None = None,
    warm_need: WarmNeed | None = None,
    act: FileAct | None = None,
) -> DatasetsPart:
    """Scan several datasets; one that cannot be scanned is a DatasetUnavailable with the reason, and the rest
    are scanned still.

    A dataset whose files another one's walk reached too (a folder inside it; the same folder given again
    through a symlink alias, a trailing slash or `..`) keeps its own numbers and row, and is marked
    `counted_in` that one: totals (`total_of`) and `warm_need` count its files once. `act`: see
    `scan_residency`.
    """
    scans = [_scan_one(p, options, cancel=cancel, deadline_s=deadline_s, cpu_fraction=cpu_fraction,
                       warm_need=warm_need is not None, act=act) for p in paths]
    part = _compose(paths, scans, options)
    if warm_need is not None:
        warm_need.pages += sum(s.need.pages for ds, s in zip(part.paths, scans, strict=True)
                               if isinstance(ds, DatasetResidency) and ds.counted_in is None)
    return part


@dataclass
class _Scan:
    """One dataset's scan, with what `_compose` needs to tell which dataset holds which."""

    result: DatasetUnavailable | DatasetResidency
    reached: set[tuple[int, int]]  # (dev, inode) of every folder its walk entered
    need: WarmNeed


def _scan_one(p: str, options: WalkOptions, *, cancel: threading.Event | None = None, deadline_s: float | None = None,
              cpu_fraction: float | None = None, warm_need: bool = False, act: FileAct | None = None) -> _Scan:
    seen: set[tuple[int, int]] = set()
    need = WarmNeed()
    try:
        result: DatasetUnavailable | DatasetResidency = scan_residency(
            p, options, cancel=cancel, deadline_s=deadline_s, cpu_fraction=cpu_fraction,
            warm_need=need if warm_need else None, seen_dirs=seen, act=act)
    except OSError as e:
        path = os.fsdecode(p)
        result = DatasetUnavailable(path, path_error(e.strerror or str(e), path), scanned_at=time.time())
    return _Scan(result, seen, need)


def _compose(paths: tuple[str, ...] | list[str], scans: list[_Scan], options: WalkOptions) -> DatasetsPart:
    """The datasets part from one scan per path, each dataset inside another marked `counted_in` it."""
    out = [dataclasses.replace(s.result, counted_in=None, same_tree=False)
           if isinstance(s.result, DatasetResidency) else s.result for s in scans]
    for j, (i, same) in _overlaps(paths, out, [s.reached for s in scans], options).items():
        inner = out[j]
        if isinstance(inner, DatasetResidency):  # always: only a scanned one has a key to be found by
            out[j] = dataclasses.replace(inner, counted_in=out[i].path, same_tree=same)
    return DatasetsPart(paths=tuple(out), page_size=kernel.PAGE_SIZE)


def _overlaps(
    paths: tuple[str, ...] | list[str], scanned: list[DatasetUnavailable | DatasetResidency],
    reached: list[set[tuple[int, int]]], options: WalkOptions,
) -> dict[int, tuple[int, bool]]:
    """{j: (i, same)}: dataset j's files were reached by dataset i's walk too (same: j is i, given again).

    By device and inode, not by name, so aliases, `..` and bind mounts are seen through, and a folder the walk
    did not enter (another filesystem, an ignored name, a symlink not followed) is not taken as inside. When
    two reach each other (the same tree, or symlinks followed both ways), the one given first counts them.
    """
    keys: list[tuple[int, int] | None] = []
    parents: list[tuple[int, int] | None] = []  # a file root: the folder it is listed in, if a walk may count it
    ignore, include = _compile(options.ignore), _compile(options.include)
    for p, ds in zip(paths, scanned, strict=True):
        key = parent = None
        if isinstance(ds, DatasetResidency):
            try:
                st = os.stat(p)
                key = (st.st_dev, st.st_ino)
                if not stat.S_ISDIR(st.st_mode):
                    real = os.path.realpath(p)
                    name = os.path.basename(real)
                    if not (ignore is not None and ignore.match(name)) and (include is None or include.match(name)):
                        pst = os.stat(os.path.dirname(real))
                        parent = (pst.st_dev, pst.st_ino)
            except OSError:
                pass
        keys.append(key)
        parents.append(parent)
    found: dict[int, tuple[int, bool]] = {}
    for j, key in enumerate(keys):
        if key is None:
            continue
        for i, other in enumerate(keys):
            if i == j or other is None:
                continue
            same = other == key
            if not (same or key in reached[i] or (parents[j] is not None and parents[j] in reached[i])):
                continue
            if i > j and (same or other in reached[j]):
                continue  # they reach each other: the first given counts
            found[j] = (i, same)
            break
    return found


# The TUI and the recorder keep folder totals this deep; deeper folders add to their ancestor.
SOURCE_MAX_DEPTH = 6
SOURCE_CPU_FRACTION = 0.5
# Each folder lists its top 50 files by size, by resident and by % (coldest first), a dataset 4,096 file rows at
# most: a recording of a big tree gains at most about 1.3 MB of JSON a rescan.
SOURCE_TOP_FILES = 50
SOURCE_TOP_BUDGET = 4096


class DatasetsReader:
    """The watched datasets' background scan. A full read rescans them all; `read_some(paths)` rescans only
    those (after a warm of one dataset, the others keep their last scan), and a reader that replaces another
    (a dataset added from the TUI) takes over its scans, so its first read scans only the new datasets.

    With `watch`, every read is a `DatasetWatch` cycle (sources/watch.py): the first measures the whole tree
    (the watch's own scan: a plain scan first would be measured again by it, a 100,000-file tree twice at
    start), the later ones only the files opened since the last read and a slice of the tree in turn, so the
    cost stops growing with the dataset; `read_some` measures all of each dataset asked for again."""

    def __init__(self, paths: tuple[str, ...], options: WalkOptions, cpu_fraction: float | None,
                 watch: bool = False) -> None:
        self.paths, self.options, self.cpu_fraction = paths, options, cpu_fraction
        self.watch = watch and not options.follow_symlinks  # a followed symlink's folder is not this tree's own
        self._last: dict[str, _Scan] = {}  # each dataset's last scan
        self._watches: dict[str, Any] = {}  # path -> DatasetWatch
        self._first = True

    def carry_from(self, old: Any) -> None:
        """Take over the scans of the reader behind `old` (the Source this one's replaces)."""
        prev = getattr(old.read, "__self__", None)
        if isinstance(prev, DatasetsReader) and prev.options == self.options:
            self._last = {p: s for p, s in prev._last.items() if p in self.paths}
            # The watches move over (the old source's close then drops only those of datasets no longer watched).
            self._watches = {p: prev._watches.pop(p) for p in list(prev._watches) if p in self.paths}

    def read(self) -> DatasetsPart:
        """Every dataset scanned now (the first read after a takeover: only those not scanned before)."""
        first, self._first = self._first, False
        if self.watch:  # the first read after a takeover reads only the new datasets: the others' scans stand
            return self._read(frozenset(), cycle=not first)
        return self.read_some(frozenset() if first else frozenset(self.paths))

    def read_some(self, paths: frozenset[str]) -> DatasetsPart:
        """Rescan `paths` (and any dataset never scanned), keep the others' last scans, compose the part."""
        return self._read(paths, cycle=False)

    def _read(self, paths: frozenset[str], cycle: bool) -> DatasetsPart:
        for p in self.paths:
            if p in paths or p not in self._last or cycle:
                self._last[p] = self._read_one(p, full=p in paths)
        return _compose(self.paths, [self._last[p] for p in self.paths], self.options)

    def _read_one(self, p: str, full: bool) -> _Scan:
        if not self.watch or not os.path.isdir(p):
            return _scan_one(p, self.options, cpu_fraction=self.cpu_fraction)
        from dltop.sources.watch import DatasetWatch

        w = self._watches.get(p)
        try:
            if w is None:
                w = self._watches[p] = DatasetWatch(p, self.options, self.cpu_fraction)
            ds, reached = w.read(full=full)
        except OSError as e:
            if w is not None:  # the root is gone or unreadable: a new watch starts over when it is back
                w.close()
                self._watches.pop(p, None)
            if e.errno in (errno.EMFILE, errno.ENOSYS, errno.ENOSPC) and e.filename is None:
                return _scan_one(p, self.options, cpu_fraction=self.cpu_fraction)  # no inotify instance left
            return _Scan(DatasetUnavailable(p, path_error(e.strerror or str(e), p), scanned_at=time.time()),
                         set(), WarmNeed())
        return _Scan(ds, reached, WarmNeed())

    def close(self) -> None:
        """Drop every watch (the source stops)."""
        for w in self._watches.values():
            w.close()
        self._watches = {}


def source(settings: Any) -> Any:
    """The datasets Source: a background rescan of every configured dataset, at most half a CPU while it runs
    and 10% of the wall time in all; the app asks for one dataset's rescan after acting on it."""
    from dltop.sources.base import Source

    paths = tuple(os.path.abspath(p) for p in settings.datasets)
    options = WalkOptions(max_depth=SOURCE_MAX_DEPTH, top_files=SOURCE_TOP_FILES, top_keys=FILE_SORT_KEYS,
                          top_budget=SOURCE_TOP_BUDGET)
    reader = DatasetsReader(paths, options, SOURCE_CPU_FRACTION, watch=True)
    interval = max(10.0, float(getattr(settings, "refresh_s", 1.0)) * 10)
    # Scans run at half a CPU at most, and full scans keep the wall time spent scanning under 10%. Once a
    # dataset is watched, a read measures only what was opened since the last one, plus a rolling slice at
    # 0.25% of a core (docs/datasets.md, "Watching a dataset"): numbers at most one interval old.
    return Source(name="datasets", interval_s=interval, read=reader.read, timeout_s=120.0, max_duty=0.1,
                  config=paths, read_some=reader.read_some, carry_from=reader.carry_from, close=reader.close)
