"""Warm, evict and lock datasets in the page cache: cancellable, with progress, guarded against OOM.

Each action walks the tree the way the residency scan does (same options, hard links once, special files
never opened) and reports what it did and what it could not do. The CLI and the TUI drive the same code.
"""

from __future__ import annotations

import errno
import json
import os
import select
import stat
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from dltop import kernel
from dltop.errors import DltopError
from dltop.fmt import plural
from dltop.model.base import to_dict
from dltop.model.datasets import NO_PERMISSION, DatasetUnavailable, counted_once
from dltop.model.memory import safety_margin_bytes  # noqa: F401 - part of this module's API
from dltop.sources.datasets import (
    DEFAULT_WALK,
    MAX_PROBLEMS,
    WalkOptions,
    WalkReport,
    WarmNeed,
    _Acc,
    _Budget,
    data_extents,
    data_pages,
    display_path,
    path_error,
    scan_paths,
    walk,
)

# How far WILLNEED submissions may run ahead of completed reads: enough to keep the device queue full (warming
# 1 GiB of big files on the benchmark VM: 256 MiB 0.61 s, 512 MiB 0.53 s, 1 GiB 0.48 s), small enough that what
# a cancel leaves reading in the background stays small (a cancel stops submitting at once).
WARM_INFLIGHT_BYTES = 512 << 20
WARM_INFLIGHT_FILES = 512
PROGRESS_EVERY_S = 0.1
# A rate (and an ETA) from less than this much running time is start-up noise: the first files, the first
# readahead, a burst of files found resident already. Before it, both are unknown.
RATE_AFTER_S = 1.0
# Warming many small files costs more CPU per file (open, the WILLNEED submission and its completion, the
# wait, close) than device time, so with more than one CPU, helper processes each take a share of the files
# (by inode number). Below this many files, starting them costs more than it saves.
PARALLEL_MIN_FILES = 4096
PARALLEL_MAX_PROCS = 4
# Files are shared out in runs of 2**SHARD_RUN_BITS consecutive inodes: files next to each other on disk go to
# the same process, so the block layer still merges their reads (alternate files: 3x the requests, 25% slower).
SHARD_RUN_BITS = 6
_O_NOFOLLOW = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW
_O_FOLLOW = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True)
class Progress:
    """Where a running action is: bytes done of total, and the file it is on."""

    action: str
    done_bytes: int
    total_bytes: int
    elapsed_s: float
    files_done: int
    path: str = ""
    found_bytes: int = 0  # of done_bytes, those found done already (resident before a warm): no work, no rate

    @property
    def rate_bytes_per_s(self) -> float | None:
        """Average rate of the work done so far; None until it has run RATE_AFTER_S and moved some bytes."""
        worked = self.done_bytes - self.found_bytes
        return worked / self.elapsed_s if self.elapsed_s >= RATE_AFTER_S and worked > 0 else None

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the rate so far: 0 only when nothing is left, None while there is no rate yet."""
        left = self.total_bytes - self.done_bytes
        if left <= 0:
            return 0.0
        rate = self.rate_bytes_per_s
        return None if rate is None else left / rate


ProgressFn = Callable[[Progress], None]


@dataclass(frozen=True)
class MemoryGuard:
    """Whether bringing `need_bytes` into memory leaves MemAvailable above the safety margin."""

    need_bytes: int
    available_bytes: int | None
    total_bytes: int | None
    margin_bytes: int
    ok: bool
    fits_bytes: int  # how much can come in while keeping the margin
    message: str


def read_meminfo(path: str = "/proc/meminfo") -> dict[str, int]:
    """The sizes in /proc/meminfo, in bytes ({} when it cannot be read: the guard then says it did not check)."""
    from dltop.sources.memory import parse_meminfo

    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return parse_meminfo(f.read())
    except OSError:
        return {}


def cgroup_room_bytes(cg: Any) -> tuple[int, str] | None:
    """Page cache the memory cgroup can hold without reclaiming its own cache: memory.max less its anonymous
    memory (what is not file pages) and a margin, with the cgroup's path; None when no limit applies."""
    max_bytes = getattr(cg, "max_bytes", None)
    current = getattr(cg, "current_bytes", None)
    if not max_bytes or current is None:
        return None
    anon = max(0, current - (getattr(cg, "file_bytes", None) or 0))
    margin = min(max(max_bytes // 10, 64 << 20), 1 << 30)
    return max(0, max_bytes - anon - margin), str(getattr(cg, "path", "?"))


def memory_guard(need_bytes: int, meminfo: dict[str, int] | None = None, cgroup: Any = "auto") -> MemoryGuard:
    """The guard's verdict on bringing `need_bytes` more into memory: it must leave MemAvailable above the
    margin and, inside a memory cgroup with a limit (a container, a Slurm job), fit under that limit beside the
    job's own memory, or warming would only evict what it just read. `cgroup` "auto" reads this process's
    cgroup when `meminfo` is read live too; None skips it; tests pass a CgroupMemory."""
    from dltop.fmt import human_bytes

    live = meminfo is None
    info = read_meminfo() if meminfo is None else meminfo
    if isinstance(cgroup, str):
        cgroup = _own_cgroup() if live else None
    avail, total = info.get("MemAvailable"), info.get("MemTotal")
    margin = safety_margin_bytes(total)
    room = cgroup_room_bytes(cgroup)
    if avail is None and room is None:
        return MemoryGuard(need_bytes, None, total, margin, True, need_bytes, "MemAvailable unknown: not checked")
    fits = max(0, avail - margin) if avail is not None else room[0]  # type: ignore[index]
    by_cgroup = room is not None and room[0] < fits
    if room is not None:
        fits = min(fits, room[0])
    ok = need_bytes <= fits
    if ok:
        msg = f"ok: {human_bytes(need_bytes)} fits"
        if avail is not None:
            msg += f", {human_bytes(avail - need_bytes)} stays available"
        if room is not None:
            msg += f", inside cgroup {room[1]}'s limit"
    elif by_cgroup:
        assert room is not None
        msg = (
            f"refused: {human_bytes(need_bytes)} is more than the {human_bytes(room[0])} of page cache the memory "
            f"cgroup {room[1]} can hold beside its own memory (memory.max less anon and a margin): the rest "
            f"would evict what was just read; {human_bytes(fits)} fits"
        )
    else:
        assert avail is not None
        msg = (
            f"refused: {human_bytes(need_bytes)} would leave {human_bytes(max(0, avail - need_bytes))} of "
            f"{human_bytes(avail)} available, under the {human_bytes(margin)} margin; "
            f"{human_bytes(fits)} fits"
        )
    return MemoryGuard(need_bytes, avail, total, margin, ok, fits, msg)


def _own_cgroup() -> Any:
    from dltop.sources.memory import read_cgroup_memory

    return read_cgroup_memory("/", "self")


@dataclass
class ActionResult:
    """What an action did; `to_dict()` is the CLI's `--json` summary.

    Bytes are whole pages (pages x page size), as fincore counts them: a 17-byte file is one 4 KiB page.
    Pages whose residency the kernel hides from this user are in `unknown_pages`, never in the resident counts.
    """

    action: str
    paths: list[str]
    dry_run: bool = False
    files: int = 0
    # bytes the action set out to move: warm, the pages of data (holes are never read) not known to be resident;
    # evict, the resident pages; lock, every page
    total_bytes: int = 0
    # bytes acted on: warm, pages read in or found resident; evict, pages dropped, plus all the pages of files
    # whose residency is hidden (advised out, result unknown); lock, pages locked
    done_bytes: int = 0
    pages: int = 0
    resident_pages_before: int = 0
    resident_pages_after: int | None = None  # of the pages whose residency is visible
    unknown_pages: int = 0
    elapsed_s: float = 0.0
    cancelled: bool = False
    guard: MemoryGuard | None = None
    stayed: dict[str, int] = field(default_factory=dict)  # evict: reason -> pages that stayed resident
    stayed_detail: list[str] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data, by the Snapshot's codec: paths that are not UTF-8 get their `_b64` sibling."""
        d: dict[str, Any] = to_dict(self)
        d["rate_bytes_per_s"] = self.done_bytes / self.elapsed_s if self.elapsed_s > 0 else None
        return d


class _Ticker:
    """Calls the progress callback at most every PROGRESS_EVERY_S, and once at the end."""

    def __init__(self, action: str, total: int, fn: ProgressFn | None) -> None:
        self.action, self.total, self.fn = action, total, fn
        self.t0 = time.monotonic()
        self.last = 0.0
        self.done = 0
        self.files = 0
        self.found = 0  # of done: found done already (no work to do), left out of the rate
        self.helpers: list[_Helper] = []  # their progress counts too, until merged into done and files

    def add(self, n: int, path: str = "", force: bool = False, found: bool = False) -> None:
        self.done += n
        if found:
            self.found += n
        if self.fn is None and not self.helpers:
            return
        now = time.monotonic()
        if force or now - self.last >= PROGRESS_EVERY_S:
            self.last = now
            done, files, found_n = self.done, self.files, self.found
            for h in self.helpers:
                h.poll()  # also keeps its pipe drained
                done, files, found_n = done + h.done, files + h.files, found_n + h.found
            if self.fn is not None:
                self.fn(Progress(self.action, done, max(self.total, done), now - self.t0, files, path, found_n))

    def merge(self, h: _Helper) -> None:
        """Take over what a helper has done, and zero its counts so nothing is counted twice."""
        self.done, self.files, self.found = self.done + h.done, self.files + h.files, self.found + h.found
        h.done = h.files = h.found = 0


def _files(
    paths: list[str], options: WalkOptions, report: WalkReport, cancel: threading.Event | None
) -> Generator[tuple[str, int, os.stat_result, bool], None, None]:
    """Open each regular file under `paths` once: yields (path, fd, stat, on tmpfs); the caller closes fd."""
    seen: set[tuple[int, int]] = set()
    budget = _Budget(cancel)
    for root in paths:
        root = os.fsdecode(root)
        try:
            it = walk(root, options, report, _Acc(root), budget)
            tmpfs_devs: dict[int, bool] = {}
            for d, dfd, name, follow in it:
                full = name if dfd is None else (f"{d.path}/{name}" if d.path != "/" else f"/{name}")
                flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
                try:
                    fd = os.open(name, flags, dir_fd=dfd)
                except OSError as e:
                    if dfd is None:
                        raise  # the root is this file: an error, not a skipped file
                    _skip(report, e, full)
                    continue
                try:
                    st = os.fstat(fd)
                    if not stat.S_ISREG(st.st_mode):
                        report.skip("special")
                        os.close(fd)
                        continue
                    if st.st_nlink > 1:
                        key = (st.st_dev, st.st_ino)
                        if key in seen:
                            report.skip("hardlink")
                            os.close(fd)
                            continue
                        seen.add(key)
                    if st.st_dev not in tmpfs_devs:
                        magic = kernel.fstatfs_type(fd)
                        tmpfs_devs[st.st_dev] = magic in (kernel.TMPFS_MAGIC, kernel.RAMFS_MAGIC)
                except OSError as e:
                    os.close(fd)
                    _skip(report, e, full)
                    continue
                if cancel is not None and cancel.is_set():
                    os.close(fd)
                    return
                yield full, fd, st, tmpfs_devs[st.st_dev]
        except OSError as e:
            raise DltopError(path_error(e.strerror or str(e), root)) from None


def _skip(report: WalkReport, e: OSError, path: str) -> None:
    if e.errno == errno.ENOENT:
        report.skip("vanished", path, "vanished")
    elif e.errno in (errno.EACCES, errno.EPERM):
        report.skip("unreadable", path, "permission denied")
    else:
        report.skip("error", path, e.strerror or str(e))


class _Residency:
    """Resident pages of an open file, by cachestat or (overlayfs, no permission, old kernel) mincore."""

    def __init__(self) -> None:
        self.cstat = kernel.cachestat_caller()
        self.mincore_devs: dict[int, bool] = {}

    def pages(self, fd: int, st: os.stat_result) -> tuple[int, int] | None:
        """(resident, dirty+writeback) pages, or None when the kernel hides them from us."""
        use_mincore = self.mincore_devs.get(st.st_dev)
        if use_mincore is None:
            use_mincore = not kernel.have_cachestat() or kernel.fstatfs_type(fd) == kernel.OVERLAYFS_SUPER_MAGIC
            self.mincore_devs[st.st_dev] = use_mincore
        if not use_mincore:
            try:
                cs = self.cstat(fd)
                return cs.nr_cache, cs.nr_dirty + cs.nr_writeback
            except OSError as e:
                if e.errno == errno.EPERM:
                    return None
                raise
        euid = os.geteuid()
        if euid != 0 and st.st_uid != euid and not os.access(f"/proc/self/fd/{fd}", os.W_OK, effective_ids=True):
            return None
        return kernel.mincore_resident_pages(fd, st.st_size), 0


_data_extents = data_extents


def plan(
    action: str, paths: list[str], options: WalkOptions = DEFAULT_WALK, cancel: threading.Event | None = None
) -> ActionResult:
    """What an action would do, from one residency scan: the bytes it would move and the memory guard's verdict."""
    need = WarmNeed()
    part = scan_paths(tuple(paths), options, cancel=cancel, warm_need=need if action == "warm" else None)
    for missing in part.paths:
        if isinstance(missing, DatasetUnavailable):
            raise DltopError(missing.unavailable)
    ps = part.page_size
    r = ActionResult(action=action, paths=[os.fsdecode(p) for p in paths], dry_run=True)
    for ds in counted_once(part.scanned):  # a dataset inside another one given is counted there
        r.files += ds.files
        r.pages += ds.pages
        r.resident_pages_before += ds.resident_pages
        r.unknown_pages += ds.unknown_pages
        for k, v in ds.skipped.items():
            r.skipped[k] = r.skipped.get(k, 0) + v
        r.problems.extend(ds.problems)
        if ds.unknown_reason and ds.unknown_reason not in r.notes:
            r.notes.append(ds.unknown_reason)
    if action == "warm":
        r.total_bytes = need.pages * ps
        r.guard = memory_guard(r.total_bytes)
    elif action == "lock":
        # Locked pages leave MemAvailable even when they were resident already: page cache counts as available
        # (the kernel can drop it), locked pages do not.
        r.total_bytes = r.pages * ps
        r.guard = memory_guard(r.total_bytes)
    else:
        r.total_bytes = (r.resident_pages_before + r.unknown_pages) * ps  # hidden pages may be resident too
    return r


def _size_plan(
    action: str, paths: list[str], options: WalkOptions, cancel: threading.Event | None, helpers: list[_Helper]
) -> ActionResult:
    """An upper bound for a warm: every page of data of every file, from sizes (only sparse files are opened).

    Once the tree proves large, helper processes are started into `helpers`: they start up while this walk
    goes on, and wait for the go (or are stopped when the guard says no).
    """
    report = WalkReport()
    budget = _Budget(cancel)
    seen: set[tuple[int, int]] = set()
    ps = kernel.PAGE_SIZE
    r = ActionResult(action=action, paths=[os.fsdecode(p) for p in paths], dry_run=True)
    data = 0
    for root in paths:
        root = os.fsdecode(root)
        try:
            for _d, dfd, name, follow in walk(root, options, report, _Acc(root), budget):
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=follow)
                except OSError:
                    continue  # the warm pass counts and reports it
                if st.st_nlink > 1:
                    key = (st.st_dev, st.st_ino)
                    if key in seen:
                        continue
                    seen.add(key)
                r.files += 1
                pages = (st.st_size + ps - 1) // ps
                r.pages += pages
                if st.st_blocks * 512 < st.st_size:  # holes, maybe: count only the pages a warm reads
                    try:
                        fd = os.open(name, _O_FOLLOW if follow else _O_NOFOLLOW, dir_fd=dfd)
                    except OSError:
                        continue  # cannot be read, so it will not be warmed
                    try:
                        pages = data_pages(fd, st, ps)
                    finally:
                        os.close(fd)
                data += pages
                if r.files == PARALLEL_MIN_FILES:
                    helpers.extend(_spawn_helpers())
        except OSError as e:
            raise DltopError(path_error(e.strerror or str(e), root)) from None
    r.total_bytes = data * ps
    r.guard = memory_guard(r.total_bytes)
    r.resident_pages_before = -1  # not measured yet: the warm pass measures it
    return r


def warm(
    paths: list[str],
    options: WalkOptions = DEFAULT_WALK,
    *,
    force: bool = False,
    fit: bool = False,
    dry_run: bool = False,
    progress: ProgressFn | None = None,
    cancel: threading.Event | None = None,
) -> ActionResult:
    """Bring files into the page cache with chunked POSIX_FADV_WILLNEED, holes left alone.

    Refuses (DltopError) when the memory guard says no, unless `force`; with `fit`, warms files in walk
    order until the part that fits is in.
    """
    r = None
    helpers: list[_Helper] = []
    try:
        if not dry_run:
            # Cheap first: if every byte fits, the exact residency scan (a second walk) is not needed.
            r = _size_plan("warm", paths, options, cancel, helpers)
            assert r.guard is not None
            if not r.guard.ok:
                r = None
                _stop_all(helpers)
        if r is None:
            r = plan("warm", paths, options, cancel)
        return _guarded_warm(r, paths, options, force, fit, dry_run, progress, cancel, helpers)
    finally:
        _stop_all(helpers)


def _stop_all(helpers: list[_Helper]) -> None:
    for h in helpers:
        h.stop()
    helpers.clear()


def _guarded_warm(
    r: ActionResult,
    paths: list[str],
    options: WalkOptions,
    force: bool,
    fit: bool,
    dry_run: bool,
    progress: ProgressFn | None,
    cancel: threading.Event | None,
    helpers: list[_Helper],
) -> ActionResult:
    assert r.guard is not None
    limit: int | None = None
    if not r.guard.ok and not force:
        if not fit:
            raise DltopError(f"warm {r.guard.message} (--fit warms the part that fits, --force warms anyway)")
        limit = r.guard.fits_bytes
        r.notes.append(f"warming only the part that fits: {r.guard.fits_bytes} bytes")
        r.total_bytes = min(r.total_bytes, limit)
    if dry_run:
        return r
    r.dry_run = False
    if limit is not None:
        _stop_all(helpers)  # a warm cut at the guard's limit goes in walk order, in one process
    return _run_warm(r, paths, options, limit, progress, cancel, helpers or None)


def _run_warm(
    r: ActionResult,
    paths: list[str],
    options: WalkOptions,
    limit: int | None,
    progress: ProgressFn | None,
    cancel: threading.Event | None,
    helpers: list[_Helper] | None = None,
) -> ActionResult:
    ticker = _Ticker("warm", r.total_bytes, progress)
    sized = r.resident_pages_before < 0  # the total came from sizes, resident files included
    t0 = time.monotonic()
    if helpers is None:
        helpers = _spawn_helpers() if limit is None and r.files >= PARALLEL_MIN_FILES else []
    _go(helpers, paths, options, sized)
    ticker.helpers = list(helpers)
    shards = len(helpers) + 1
    try:
        report, before, after, unknown = _warm_pass(
            paths, options, limit, ticker, cancel, r.notes, sized, (0, shards, helpers[0].shard[2]) if helpers else None
        )
        for h in helpers:
            got = None if cancel is not None and cancel.is_set() else h.wait(cancel)
            if cancel is not None and cancel.is_set():
                h.poll()  # count what it reported done before the cancel
                ticker.merge(h)
                continue
            if got is None:  # the helper failed: do its share here
                r.notes.append(f"helper process failed ({h.error or 'no result'}): its share was warmed in this one")
                rep, b, a, u = _warm_pass(paths, options, None, ticker, cancel, r.notes, sized, h.shard)
            else:
                rep, b, a, u = got
                ticker.merge(h)
            before, after, unknown = before + b, after + a, unknown + u
            for k, v in rep.skipped.items():
                report.skipped[k] = report.skipped.get(k, 0) + v
            report.problems.extend(p for p in rep.problems if len(report.problems) < MAX_PROBLEMS)
    finally:
        ticker.helpers = []
        for h in helpers:
            h.stop()
    r.cancelled = cancel is not None and cancel.is_set()
    if sized:
        r.resident_pages_before = before
    return _finish(r, report, ticker, t0, after, unknown)


def _warm_pass(
    paths: list[str],
    options: WalkOptions,
    limit: int | None,
    ticker: _Ticker,
    cancel: threading.Event | None,
    notes: list[str],
    sized: bool,
    shard: tuple[int, int, int] | None = None,
) -> tuple[WalkReport, int, int, int]:
    """Warm the files of one shard (all of them when None): (what was skipped, pages before, after, unknown).

    `before` and `after` count the pages whose residency is visible; `unknown` the pages of files whose
    residency the kernel hides from this user (they are warmed all the same).

    Only shard 0 (or the only pass) counts what the walk itself skips: every shard walks the whole tree.
    """
    report = WalkReport()
    walk_report = report if shard is None or shard[0] == 0 else WalkReport()
    res = _Residency()
    cstat, cached_by_cstat = res.cstat, res.mincore_devs  # dev -> False: cachestat is right there
    ps = kernel.PAGE_SIZE
    window_by_dev: dict[int, int] = {}
    seen: set[tuple[int, int]] = set()
    # (fd, offset, length, last chunk of its file, path, stat): read one byte at the end of each chunk to
    # wait for the readahead WILLNEED started, so "done" means in memory, not merely requested.
    pending: deque[tuple[int, int, int, bool, str, os.stat_result]] = deque()
    max_bytes, max_files = WARM_INFLIGHT_BYTES, WARM_INFLIGHT_FILES
    inflight = 0
    budget = limit
    last_byte = [bytearray(1)]
    after = before = unknown = 0
    os_open, os_fstat, os_close, fadvise, preadv = os.open, os.fstat, os.close, os.posix_fadvise, os.preadv
    WILLNEED, S_ISREG = os.POSIX_FADV_WILLNEED, stat.S_ISREG

    def cached(fd: int, st: os.stat_result) -> int | None:
        """Resident pages of an open file (None: hidden from us); cachestat inline where it works."""
        if cached_by_cstat.get(st.st_dev) is False:
            try:
                return int(cstat(fd).nr_cache)
            except OSError as e:
                if e.errno != errno.EPERM:
                    raise
                return None
        got = res.pages(fd, st)
        return None if got is None else got[0]

    def finish_one() -> None:
        nonlocal inflight, after, unknown
        fd, off, n, last, path, st = pending.popleft()
        inflight -= n
        try:
            preadv(fd, last_byte, off + n - 1)
        except OSError as e:
            _skip(report, e, path)
        ticker.add(((off + n + ps - 1) // ps - off // ps) * ps, path)  # whole pages, as the totals count
        if last:
            try:
                pages = (st.st_size + ps - 1) // ps
                got = cached(fd, st)
                if got is not None and got < pages and _is_dense(fd, st.st_size):
                    # The filesystem ignored WILLNEED (some FUSE and network filesystems): read it instead.
                    _read_all(fd, st.st_size, cancel)
                    got = cached(fd, st)
                if got is None:
                    unknown += pages
                else:
                    after += got
            except OSError as e:
                _skip(report, e, path)
            finally:
                os_close(fd)
            ticker.files += 1

    walk_budget = _Budget(cancel)
    try:
        for root in paths:
            root = os.fsdecode(root)
            try:
                # Inode order: neighbouring small files are read in disk order and their reads merge.
                files = walk(root, options, walk_report, _Acc(root), walk_budget, by_inode=True, shard=shard)
                for d, dfd, name, follow in files:
                    path = name if dfd is None else (f"{d.path}/{name}" if d.path != "/" else f"/{name}")
                    try:
                        fd = os_open(name, _O_FOLLOW if follow else _O_NOFOLLOW, dir_fd=dfd)
                    except OSError as e:
                        if dfd is None:
                            raise  # the root is this file: an error, not a skipped file
                        _skip(report, e, path)
                        continue
                    try:
                        st = os_fstat(fd)
                        if not S_ISREG(st.st_mode):
                            report.skip("special")
                            os_close(fd)
                            continue
                        if st.st_nlink > 1:
                            key = (st.st_dev, st.st_ino)
                            if key in seen:
                                report.skip("hardlink")
                                os_close(fd)
                                continue
                            seen.add(key)
                        size = st.st_size
                        pages = (size + ps - 1) // ps
                        have = cached(fd, st)
                    except OSError as e:
                        os_close(fd)
                        _skip(report, e, path)
                        continue
                    if cancel is not None and cancel.is_set():
                        os_close(fd)
                        break
                    if budget is not None and budget <= 0:
                        os_close(fd)
                        notes.append("stopped at the memory guard's limit")
                        break
                    if have is not None:
                        before += have
                        if have >= pages:
                            after += have  # already all in memory: nothing to read
                            if sized:  # the total counted its data pages: count them done (found, not worked)
                                try:
                                    ticker.add(data_pages(fd, st, ps) * ps, path, found=True)
                                except OSError as e:
                                    _skip(report, e, path)
                            os_close(fd)
                            ticker.files += 1
                            continue
                    window = window_by_dev.get(st.st_dev)
                    if window is None:
                        window = window_by_dev[st.st_dev] = kernel.readahead_bytes(st.st_dev)
                    # Only a file with fewer blocks than its size can have holes: skip SEEK_DATA for the others.
                    dense = st.st_blocks * 512 >= size
                    if dense and size <= window and budget is None:
                        chunks = [(0, size)]  # the common small file: one WILLNEED, one wait
                    else:
                        chunks = _chunks(fd, size, dense, window, budget, ps)
                        if budget is not None:
                            budget -= sum(n for _off, n in chunks)
                    if not chunks:
                        try:
                            got = cached(fd, st)
                            if got is None:
                                unknown += pages
                            else:
                                after += got
                        except OSError as e:
                            _skip(report, e, path)
                        os_close(fd)
                        ticker.files += 1
                        continue
                    final = len(chunks) - 1
                    for i, (off, n) in enumerate(chunks):
                        try:
                            fadvise(fd, off, n, WILLNEED)
                        except OSError:
                            _read_range(fd, off, n)
                        pending.append((fd, off, n, i == final, path, st))
                        inflight += n
                        while inflight > max_bytes or len(pending) > max_files:
                            finish_one()
                    if cancel is not None and cancel.is_set():
                        break
                else:
                    continue
                break  # cancelled, or the guard's limit reached
            except OSError as e:
                raise DltopError(path_error(e.strerror or str(e), root)) from None
        while pending and not (cancel is not None and cancel.is_set()):
            finish_one()
    finally:
        for fd in {p[0] for p in pending}:
            os.close(fd)
        pending.clear()
    return report, before, after, unknown


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _spawn_helpers() -> list[_Helper]:
    """Helper processes for shards 1..n-1 of a large warm (this process does shard 0), not yet told what to do."""
    procs = min(_cpus(), PARALLEL_MAX_PROCS) if sys.executable else 1  # embedded: no interpreter to start
    return [_Helper((k, procs, SHARD_RUN_BITS)) for k in range(1, procs)] if procs >= 2 else []


def _go(helpers: list[_Helper], paths: list[str], options: WalkOptions, sized: bool) -> None:
    """Tell each helper what to warm: the same tree and options, its own shard."""
    spec = {
        "paths": [os.fsdecode(p) for p in paths],
        "options": {
            "follow_symlinks": options.follow_symlinks,
            "cross_filesystems": options.cross_filesystems,
            "ignore": list(options.ignore),
            "include": list(options.include),
            "max_depth": options.max_depth,
        },
        "sized": sized,
        "inflight_bytes": WARM_INFLIGHT_BYTES,
        "inflight_files": WARM_INFLIGHT_FILES,
    }
    for h in helpers:
        h.start(spec)


_HELPER_CODE = "from dltop.actions.pagecache import _helper_main; raise SystemExit(_helper_main())"


class _Helper:
    """A child process warming one shard: `P done files found` lines on its stdout while it runs, `R {json}` at
    the end.

    If it cannot start or fails, `wait()` says None with `error` set, and the caller warms that shard itself.
    """

    def __init__(self, shard: tuple[int, int, int]) -> None:
        self.shard = shard
        self.done = self.files = self.found = 0
        self.error = ""
        self._buf = b""
        self._result: dict[str, Any] | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        env = dict(os.environ)
        top = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = top + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _HELPER_CODE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, env=env, close_fds=True,
            )
            assert self.proc.stdout is not None
            os.set_blocking(self.proc.stdout.fileno(), False)
        except OSError as e:
            self.error = e.strerror or str(e)
            self.stop()

    def start(self, spec: dict[str, Any]) -> None:
        """Send the work: the spec and this helper's shard."""
        if self.proc is None or self.proc.stdin is None:
            return
        try:
            self.proc.stdin.write(json.dumps({**spec, "shard": list(self.shard)}).encode("utf-8", "surrogateescape"))
            self.proc.stdin.close()
        except OSError as e:  # it died already: wait() reports it and the caller does its share
            self.error = e.strerror or str(e)

    def poll(self) -> None:
        """Read whatever the child has said so far."""
        if self.proc is None or self.proc.stdout is None or self.proc.stdout.closed:
            return
        fd = self.proc.stdout.fileno()
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                break
            self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            if line.startswith(b"P "):
                done, files, found = line.split()[1:4]
                self.done, self.files, self.found = int(done), int(files), int(found)
            elif line.startswith(b"R "):
                self._result = json.loads(line[2:].decode("utf-8", "surrogateescape"))

    def wait(self, cancel: threading.Event | None) -> tuple[WalkReport, int, int, int] | None:
        """(what it skipped, pages before, after, unknown) once done; None if it failed or the warm was cancelled."""
        proc = self.proc
        if proc is None or proc.stdout is None:
            return None
        while proc.poll() is None:
            if cancel is not None and cancel.is_set():
                return None
            select.select([proc.stdout], [], [], 0.1)
            self.poll()
        self.poll()
        res = self._result
        if proc.returncode != 0 or res is None:
            err = proc.stderr.read().decode(errors="replace").strip() if proc.stderr is not None else ""
            self.error = (err.splitlines() or [f"exit status {proc.returncode}"])[-1][:200]
            self.done = self.files = self.found = 0
            return None
        report = WalkReport()
        report.skipped = {str(k): int(v) for k, v in res["skipped"].items()}
        report.problems = [str(p) for p in res["problems"]]
        self.done, self.files, self.found = int(res["done"]), int(res["files"]), int(res["found"])
        return report, int(res["before"]), int(res["after"]), int(res["unknown"])

    def stop(self) -> None:
        """End the child if it still runs and close its pipes; safe to call twice."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(2)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for f in (proc.stdin, proc.stdout, proc.stderr):
            if f is not None:
                f.close()


def _helper_main() -> int:
    """The child side of `_Helper`: the spec on stdin, one shard warmed, the tally on stdout."""
    global WARM_INFLIGHT_BYTES, WARM_INFLIGHT_FILES
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the parent decides
    text = sys.stdin.buffer.read().decode("utf-8", "surrogateescape")
    if not text:
        return 0  # not needed after all (the guard said no, or the warm was cancelled)
    spec = json.loads(text)
    WARM_INFLIGHT_BYTES, WARM_INFLIGHT_FILES = int(spec["inflight_bytes"]), int(spec["inflight_files"])
    o = spec["options"]
    options = WalkOptions(
        follow_symlinks=bool(o["follow_symlinks"]), cross_filesystems=bool(o["cross_filesystems"]),
        ignore=tuple(o["ignore"]), include=tuple(o["include"]), max_depth=o["max_depth"],
    )
    out = sys.stdout.buffer

    def say(p: Progress) -> None:
        out.write(f"P {p.done_bytes} {p.files_done} {p.found_bytes}\n".encode())
        out.flush()

    ticker = _Ticker("warm", 0, say)
    notes: list[str] = []
    shard = (int(spec["shard"][0]), int(spec["shard"][1]), int(spec["shard"][2]))
    report, before, after, unknown = _warm_pass(
        spec["paths"], options, None, ticker, None, notes, bool(spec["sized"]), shard
    )
    tally = {"done": ticker.done, "files": ticker.files, "found": ticker.found, "before": before, "after": after, "unknown": unknown,
             "skipped": report.skipped, "problems": report.problems}
    out.write(b"R " + json.dumps(tally).encode("utf-8", "surrogateescape") + b"\n")
    out.flush()
    return 0


def _chunks(fd: int, size: int, dense: bool, window: int, budget: int | None, ps: int) -> list[tuple[int, int]]:
    """The WILLNEED calls for one file: readahead-window pieces of its data, holes left out, within `budget`."""
    chunks = []
    for start, end in [(0, size)] if dense else _data_extents(fd, size):
        off = start
        while off < end:
            n = min(window, end - off)
            if budget is not None:
                n = min(n, max(budget, ps))
                budget -= n
            chunks.append((off, n))
            off += n
            if budget is not None and budget <= 0:
                return chunks
    return chunks


def _finish(r: ActionResult, report: WalkReport, ticker: _Ticker, t0: float, after: int, unknown: int) -> ActionResult:
    ticker.add(0, force=True)
    r.done_bytes = ticker.done
    r.elapsed_s = time.monotonic() - t0
    r.resident_pages_after = after
    r.unknown_pages = unknown
    if unknown and NO_PERMISSION not in r.notes:
        r.notes.append(NO_PERMISSION)
    for k, v in report.skipped.items():
        if k not in r.skipped:
            r.skipped[k] = v
    for p in report.problems:
        if p not in r.problems:
            r.problems.append(p)
    return r


def _is_dense(fd: int, size: int) -> bool:
    return _data_extents(fd, size) == [(0, size)]


def _read_range(fd: int, off: int, n: int) -> None:
    buf = bytearray(min(n, 1 << 20))
    view = memoryview(buf)
    end = off + n
    while off < end:
        got = os.preadv(fd, [view[: min(len(buf), end - off)]], off)
        if got <= 0:
            break
        off += got


def _read_all(fd: int, size: int, cancel: threading.Event | None) -> None:
    off = 0
    while off < size and not (cancel is not None and cancel.is_set()):
        n = min(64 << 20, size - off)
        _read_range(fd, off, n)
        off += n


def evict(
    paths: list[str],
    options: WalkOptions = DEFAULT_WALK,
    *,
    dry_run: bool = False,
    progress: ProgressFn | None = None,
    cancel: threading.Event | None = None,
    retries: int = 2,
) -> ActionResult:
    """Drop files from the page cache: fdatasync dirty pages, POSIX_FADV_DONTNEED, re-measure, retry.

    Pages that stay are reported with the reason: on tmpfs, locked or mapped by a process (named), or busy.
    """
    r = plan("evict", paths, options, cancel)
    if dry_run:
        return r
    r.dry_run = False
    report = WalkReport()
    ticker = _Ticker("evict", r.total_bytes, progress)
    res = _Residency()
    ps = kernel.PAGE_SIZE
    stayed: list[tuple[str, os.stat_result, int, bool]] = []
    after = unknown = 0
    t0 = time.monotonic()
    files = _files(paths, options, report, cancel)
    try:
        for path, fd, st, tmpfs in files:
            try:
                pages = (st.st_size + ps - 1) // ps
                before = res.pages(fd, st)
                if tmpfs:
                    left = before[0] if before is not None else None
                else:
                    left = _evict_fd(fd, st, before, res, retries)
                ticker.files += 1
                if left is None:
                    # The kernel hides this file's residency: DONTNEED was asked for all of it, the result is
                    # unknown. Counted as done (the work was done), never as resident or evicted pages measured.
                    unknown += pages
                    ticker.add(0 if tmpfs else pages * ps, path)
                else:
                    if left:
                        stayed.append((path, st, left, tmpfs))
                    after += left
                    ticker.add(((before[0] if before is not None else 0) - left) * ps, path)
            except OSError as e:
                _skip(report, e, path)
            finally:
                os.close(fd)
            if cancel is not None and cancel.is_set():
                break
    finally:
        files.close()
    r.cancelled = cancel is not None and cancel.is_set()
    _explain_stayed(r, stayed, ps)
    return _finish(r, report, ticker, t0, after, unknown)


def _evict_fd(
    fd: int, st: os.stat_result, before: tuple[int, int] | None, res: _Residency, retries: int
) -> int | None:
    """Evict one open file; returns the pages still resident (None when the kernel hides them)."""
    if before is not None and before[0] == 0:
        return 0
    if before is None or before[1]:
        _fdatasync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    if before is None:
        return None  # measuring again would be as blind: no retries
    for _ in range(retries):
        now = res.pages(fd, st)
        if now is None:
            return None
        if now[0] == 0:
            return 0
        # Pages still dirty or under writeback when DONTNEED ran stay; flush and drop again.
        _fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    now = res.pages(fd, st)
    return None if now is None else now[0]


def _fdatasync(fd: int) -> None:
    try:
        os.fdatasync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.EROFS, errno.EBADF):
            raise


def _explain_stayed(r: ActionResult, stayed: list[tuple[str, os.stat_result, int, bool]], ps: int) -> None:
    if not stayed:
        return
    mappers = _mappers({(s.st_dev, s.st_ino) for _p, s, _n, tmpfs in stayed if not tmpfs})
    for path, st, pages, tmpfs in stayed:
        who = mappers.get((st.st_dev, st.st_ino), [])
        if tmpfs:
            why, detail = "tmpfs", "on tmpfs: its pages are memory, not cache (delete the file to free them)"
        elif any(locked for _pid, _comm, locked in who):
            why = "locked"
            detail = "locked by " + ", ".join(f"{c} (pid {p})" for p, c, locked in who if locked)
        elif who:
            why = "mapped"
            detail = "mapped by " + ", ".join(f"{c} (pid {p})" for p, c, _l in who)
        else:
            why, detail = "busy", "still in use (under writeback or being read)"
        r.stayed[why] = r.stayed.get(why, 0) + pages
        if len(r.stayed_detail) < 20:
            r.stayed_detail.append(f"{display_path(path)}: {plural(pages, 'page')} {detail}")


def _mappers(keys: set[tuple[int, int]], proc: str = "/proc") -> dict[tuple[int, int], list[tuple[int, str, bool]]]:
    """Which processes map each (dev, ino), and whether their mapping is mlocked (from /proc/PID/smaps)."""
    out: dict[tuple[int, int], list[tuple[int, str, bool]]] = {}
    if not keys:
        return out
    want = {(f"{os.major(d):02x}:{os.minor(d):02x}", str(i)): (d, i) for d, i in keys}
    try:
        pids = [int(p) for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return out
    for pid in pids:
        try:
            with open(f"{proc}/{pid}/smaps", encoding="utf-8", errors="replace") as f:
                current: tuple[int, int] | None = None
                found: dict[tuple[int, int], bool] = {}
                for line in f:
                    first = line.split(None, 6)
                    if len(first) >= 5 and "-" in first[0] and ":" in first[3]:
                        current = want.get((first[3], first[4]))
                        if current is not None:
                            found.setdefault(current, False)
                    elif current is not None and line.startswith("Locked:") and int(line.split()[1]) > 0:
                        found[current] = True
            if found:
                with open(f"{proc}/{pid}/comm", encoding="utf-8", errors="replace") as f:
                    comm = f.read().strip()
                for key, locked in found.items():
                    out.setdefault(key, []).append((pid, comm, locked))
        except (OSError, ValueError):
            continue
    return out


class LockSet:
    """Files mapped and mlocked; their pages stay in memory until `release()`."""

    def __init__(self) -> None:
        self.mappings: list[kernel.LockedMapping] = []
        self.paths: list[str] = []
        self.bytes = 0

    def release(self) -> None:
        """Unlock everything; safe to call twice."""
        for m in self.mappings:
            m.release()
        self.mappings.clear()
        self.bytes = 0


def memlock_error(need_bytes: int) -> str | None:
    """Why locking `need_bytes` will fail because of RLIMIT_MEMLOCK, or None when it will not."""
    from dltop.fmt import human_bytes

    if kernel.can_lock_unlimited():
        return None
    soft, _hard = kernel.memlock_limit_bytes()
    if soft is None or need_bytes <= soft:
        return None
    return (
        f"cannot lock {human_bytes(need_bytes)}: RLIMIT_MEMLOCK is {human_bytes(soft)} "
        "(raise it with `ulimit -l`, LimitMEMLOCK= or /etc/security/limits.conf, or run as root)"
    )


def lock(
    paths: list[str],
    options: WalkOptions = DEFAULT_WALK,
    *,
    force: bool = False,
    dry_run: bool = False,
    progress: ProgressFn | None = None,
    cancel: threading.Event | None = None,
) -> tuple[ActionResult, LockSet]:
    """mlock every file (reading what is not resident); the caller holds the LockSet and releases it."""
    r = plan("lock", paths, options, cancel)
    assert r.guard is not None
    why = memlock_error(r.total_bytes)
    if why:
        raise DltopError(why)
    if not r.guard.ok and not force:
        raise DltopError(f"lock {r.guard.message} (--force locks anyway)")
    locks = LockSet()
    if dry_run:
        return r, locks
    r.dry_run = False
    report = WalkReport()
    ticker = _Ticker("lock", r.total_bytes, progress)
    t0 = time.monotonic()
    files = _files(paths, options, report, cancel)
    try:
        for path, fd, st, _tmpfs in files:
            try:
                m = kernel.LockedMapping(fd, st.st_size)
            except OSError as e:
                if e.errno in (errno.ENOMEM, errno.EAGAIN, errno.EPERM):
                    locks.release()
                    soft, _ = kernel.memlock_limit_bytes()
                    from dltop.fmt import human_bytes

                    raise DltopError(
                        f"mlock failed on {display_path(path)} ({e.strerror}): RLIMIT_MEMLOCK is "
                        f"{'unlimited' if soft is None else human_bytes(soft)} and {human_bytes(locks.bytes)} "
                        "was locked before it (raise `ulimit -l` or run as root)"
                    ) from None
                _skip(report, e, path)
                continue
            finally:
                os.close(fd)  # the mapping keeps the file
            locks.mappings.append(m)
            locks.paths.append(path)
            pages = (st.st_size + kernel.PAGE_SIZE - 1) // kernel.PAGE_SIZE
            locks.bytes += pages * kernel.PAGE_SIZE
            ticker.files += 1
            ticker.add(pages * kernel.PAGE_SIZE, path)
            if cancel is not None and cancel.is_set():
                break
    except BaseException:
        locks.release()
        raise
    finally:
        files.close()
    r.cancelled = cancel is not None and cancel.is_set()
    return _finish(r, report, ticker, t0, locks.bytes // kernel.PAGE_SIZE, 0), locks
