"""Warm, evict and lock datasets in the page cache: cancellable, with progress, guarded against OOM.

Each action walks the tree the way the residency scan does (same options, hard links once, special files
never opened) and reports what it did and what it could not do. The CLI and the TUI drive the same code.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from dltop import kernel
from dltop.errors import DltopError
from dltop.sources.datasets import (
    DEFAULT_WALK,
    WalkOptions,
    WalkReport,
    _Acc,
    _Budget,
    display_path,
    scan_paths,
    walk,
)

# How far WILLNEED submissions may run ahead of completed reads: enough to keep the device queue full,
# small enough that a cancel stops within a fraction of a second.
WARM_INFLIGHT_BYTES = 256 << 20
WARM_INFLIGHT_FILES = 512
PROGRESS_EVERY_S = 0.1


@dataclass(frozen=True)
class Progress:
    """Where a running action is: bytes done of total, and the file it is on."""

    action: str
    done_bytes: int
    total_bytes: int
    elapsed_s: float
    files_done: int
    path: str = ""

    @property
    def rate_bytes_per_s(self) -> float | None:
        """Average rate so far, or None before there is one."""
        return self.done_bytes / self.elapsed_s if self.elapsed_s > 0 and self.done_bytes > 0 else None

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the average rate so far."""
        rate = self.rate_bytes_per_s
        if rate is None:
            return None
        return max(0.0, (self.total_bytes - self.done_bytes) / rate)


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
    """The `Key: N kB` lines of /proc/meminfo, in bytes."""
    out: dict[str, int] = {}
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts and parts[0].isdigit():
                    n = int(parts[0])
                    out[key] = n * 1024 if len(parts) > 1 and parts[1] == "kB" else n
    except OSError:
        pass
    return out


def safety_margin_bytes(total_bytes: int | None) -> int:
    """MemAvailable a warm or lock must leave: 10% of RAM, at least 256 MiB, at most 4 GiB."""
    if not total_bytes:
        return 1 << 30
    return min(max(total_bytes // 10, 256 << 20), 4 << 30)


def memory_guard(need_bytes: int, meminfo: dict[str, int] | None = None) -> MemoryGuard:
    """The guard's verdict on bringing `need_bytes` more into memory."""
    from dltop.fmt import human_bytes

    info = read_meminfo() if meminfo is None else meminfo
    avail, total = info.get("MemAvailable"), info.get("MemTotal")
    margin = safety_margin_bytes(total)
    if avail is None:
        return MemoryGuard(need_bytes, None, total, margin, True, need_bytes, "MemAvailable unknown: not checked")
    fits = max(0, avail - margin)
    ok = need_bytes <= fits
    if ok:
        msg = f"ok: {human_bytes(need_bytes)} fits, {human_bytes(avail - need_bytes)} stays available"
    else:
        msg = (
            f"refused: {human_bytes(need_bytes)} would leave {human_bytes(max(0, avail - need_bytes))} of "
            f"{human_bytes(avail)} available, under the {human_bytes(margin)} margin; "
            f"{human_bytes(fits)} fits"
        )
    return MemoryGuard(need_bytes, avail, total, margin, ok, fits, msg)


@dataclass
class ActionResult:
    """What an action did; `to_dict()` is the CLI's `--json` summary."""

    action: str
    paths: list[str]
    dry_run: bool = False
    files: int = 0
    total_bytes: int = 0  # bytes the action set out to move (warm: not yet resident; evict: resident)
    done_bytes: int = 0
    pages: int = 0
    resident_pages_before: int = 0
    resident_pages_after: int | None = None
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
        """Plain JSON data."""
        d = {k: v for k, v in self.__dict__.items() if k != "guard"}
        d["guard"] = None if self.guard is None else dict(self.guard.__dict__)
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

    def add(self, n: int, path: str = "", force: bool = False) -> None:
        self.done += n
        if self.fn is None:
            return
        now = time.monotonic()
        if force or now - self.last >= PROGRESS_EVERY_S:
            self.last = now
            self.fn(Progress(self.action, self.done, max(self.total, self.done), now - self.t0, self.files, path))


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
            raise DltopError(f"{e.strerror or e}: {display_path(root)}") from None


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


def _data_extents(fd: int, size: int) -> list[tuple[int, int]]:
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


def plan(
    action: str, paths: list[str], options: WalkOptions = DEFAULT_WALK, cancel: threading.Event | None = None
) -> ActionResult:
    """What an action would do, from one residency scan: the bytes it would move and the memory guard's verdict."""
    part = scan_paths(tuple(paths), options, cancel=cancel)
    for ds in part.paths:
        if ds.error:
            raise DltopError(f"{ds.error}: {display_path(ds.path)}")
    ps = part.page_size
    r = ActionResult(action=action, paths=[os.fsdecode(p) for p in paths], dry_run=True)
    for ds in part.paths:
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
        r.total_bytes = (r.pages - r.resident_pages_before - r.unknown_pages) * ps
        r.guard = memory_guard(r.total_bytes)
    elif action == "lock":
        r.total_bytes = r.pages * ps
        r.guard = memory_guard((r.pages - r.resident_pages_before) * ps)
    else:
        r.total_bytes = r.resident_pages_before * ps
    return r


def _size_plan(
    action: str, paths: list[str], options: WalkOptions, cancel: threading.Event | None
) -> ActionResult:
    """An upper bound for a warm: every page of every file, from sizes alone (no file is opened)."""
    report = WalkReport()
    budget = _Budget(cancel)
    seen: set[tuple[int, int]] = set()
    ps = kernel.PAGE_SIZE
    r = ActionResult(action=action, paths=[os.fsdecode(p) for p in paths], dry_run=True)
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
                r.pages += (st.st_size + ps - 1) // ps
        except OSError as e:
            raise DltopError(f"{e.strerror or e}: {display_path(root)}") from None
    r.total_bytes = r.pages * ps
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
    if not dry_run:
        # Cheap first: if every byte fits, the exact residency scan (a second walk) is not needed.
        r = _size_plan("warm", paths, options, cancel)
        assert r.guard is not None
        if not r.guard.ok:
            r = None
    if r is None:
        r = plan("warm", paths, options, cancel)
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
    return _run_warm(r, paths, options, limit, progress, cancel)


def _run_warm(
    r: ActionResult,
    paths: list[str],
    options: WalkOptions,
    limit: int | None,
    progress: ProgressFn | None,
    cancel: threading.Event | None,
) -> ActionResult:
    report = WalkReport()
    ticker = _Ticker("warm", r.total_bytes, progress)
    res = _Residency()
    ps = kernel.PAGE_SIZE
    window_by_dev: dict[int, int] = {}
    # (fd, offset, length, last chunk of its file, path, stat): read one byte at the end of each chunk to
    # wait for the readahead WILLNEED started, so "done" means in memory, not merely requested.
    pending: deque[tuple[int, int, int, bool, str, os.stat_result]] = deque()
    inflight = 0
    budget = limit
    one = bytearray(1)
    after = before = 0
    sized = r.resident_pages_before < 0  # the total came from sizes, resident files included

    def finish_one() -> None:
        nonlocal inflight, after
        fd, off, n, last, path, st = pending.popleft()
        inflight -= n
        try:
            os.preadv(fd, [one], off + n - 1)
        except OSError as e:
            _skip(report, e, path)
        ticker.add(n, path)
        if last:
            try:
                pages = (st.st_size + ps - 1) // ps
                got = res.pages(fd, st)
                if got is not None and got[0] < pages and _is_dense(fd, st.st_size):
                    # The filesystem ignored WILLNEED (some FUSE and network filesystems): read it instead.
                    _read_all(fd, st.st_size, cancel)
                    got = res.pages(fd, st)
                after += got[0] if got is not None else 0
            except OSError as e:
                _skip(report, e, path)
            finally:
                os.close(fd)
            ticker.files += 1

    t0 = time.monotonic()
    files = _files(paths, options, report, cancel)
    try:
        for path, fd, st, _tmpfs in files:
            if budget is not None and budget <= 0:
                os.close(fd)
                r.notes.append("stopped at the memory guard's limit")
                break
            have = res.pages(fd, st)
            before += have[0] if have is not None else 0
            if have is not None and have[0] >= (st.st_size + ps - 1) // ps:
                after += have[0]  # already all in memory: nothing to read
                os.close(fd)
                ticker.files += 1
                if sized:
                    ticker.add(have[0] * ps, path)  # the total counted it: count it done
                continue
            window = window_by_dev.get(st.st_dev)
            if window is None:
                window = window_by_dev[st.st_dev] = kernel.readahead_bytes(st.st_dev)
            chunks = []
            # Only a file with fewer blocks than its size can have holes: skip SEEK_DATA for the others.
            dense = st.st_blocks * 512 >= st.st_size
            for start, end in [(0, st.st_size)] if dense else _data_extents(fd, st.st_size):
                off = start
                while off < end:
                    n = min(window, end - off)
                    if budget is not None:
                        n = min(n, max(budget, ps))
                        budget -= n
                    chunks.append((off, n))
                    off += n
                    if budget is not None and budget <= 0:
                        break
                if budget is not None and budget <= 0:
                    break
            if not chunks:
                got = res.pages(fd, st)
                after += got[0] if got is not None else 0
                os.close(fd)
                ticker.files += 1
                continue
            for i, (off, n) in enumerate(chunks):
                try:
                    os.posix_fadvise(fd, off, n, os.POSIX_FADV_WILLNEED)
                except OSError:
                    _read_range(fd, off, n)
                pending.append((fd, off, n, i == len(chunks) - 1, path, st))
                inflight += n
                while inflight > WARM_INFLIGHT_BYTES or len(pending) > WARM_INFLIGHT_FILES:
                    finish_one()
            if cancel is not None and cancel.is_set():
                break
        while pending and not (cancel is not None and cancel.is_set()):
            finish_one()
    finally:
        files.close()
        for fd in {p[0] for p in pending}:
            os.close(fd)
        pending.clear()
    r.cancelled = cancel is not None and cancel.is_set()
    if sized:
        r.resident_pages_before = before
    return _finish(r, report, ticker, t0, after)


def _finish(r: ActionResult, report: WalkReport, ticker: _Ticker, t0: float, after: int) -> ActionResult:
    ticker.add(0, force=True)
    r.done_bytes = ticker.done
    r.elapsed_s = time.monotonic() - t0
    r.resident_pages_after = after
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
    after = 0
    t0 = time.monotonic()
    files = _files(paths, options, report, cancel)
    try:
        for path, fd, st, tmpfs in files:
            try:
                before = res.pages(fd, st)
                if tmpfs:
                    left = before[0] if before is not None else 0
                else:
                    left = _evict_fd(fd, st, before, res, retries)
                if left:
                    stayed.append((path, st, left, tmpfs))
                after += left or 0
                ticker.files += 1
                ticker.add(((before[0] if before is not None else 0) - (left or 0)) * ps, path)
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
    return _finish(r, report, ticker, t0, after)


def _evict_fd(fd: int, st: os.stat_result, before: tuple[int, int] | None, res: _Residency, retries: int) -> int:
    """Evict one open file; returns the pages still resident (0 when the kernel hides them)."""
    if before is not None and before[0] == 0:
        return 0
    if before is None or before[1]:
        _fdatasync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    for _ in range(retries):
        now = res.pages(fd, st)
        if now is None or now[0] == 0:
            return 0
        # Pages still dirty or under writeback when DONTNEED ran stay; flush and drop again.
        _fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    now = res.pages(fd, st)
    return 0 if now is None else now[0]


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
            r.stayed_detail.append(f"{display_path(path)}: {pages} pages {detail}")


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
    return _finish(r, report, ticker, t0, locks.bytes // kernel.PAGE_SIZE), locks
