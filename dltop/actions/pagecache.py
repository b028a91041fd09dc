"""Warm, evict and lock datasets in the page cache: cancellable, with progress, guarded against OOM.

Each action walks the tree the way the residency scan does (same options, hard links once, special files
never opened) and reports what it did and what it could not do. The CLI and the TUI drive the same code.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import IO, TYPE_CHECKING, Any

from dltop import kernel
from dltop.actions.holder import LockSet
from dltop.errors import DltopError
from dltop.fmt import human_bytes, plural
from dltop.model.base import display_path, to_dict
from dltop.model.datasets import (
    NO_PERMISSION,
    DatasetResidency,
    DatasetsPart,
    DatasetUnavailable,
    counted_once,
)
from dltop.residency.budget import MAX_PROBLEMS, Budget, path_error
from dltop.residency.measure import O_FILE, O_FILE_FOLLOW, data_extents, data_pages, needs_mincore
from dltop.residency.scan import WarmNeed, scan_paths
from dltop.residency.walk import (
    DEFAULT_WALK,
    FolderTotals,
    WalkOptions,
    WalkReport,
    counted_before,
    join_path,
    skip_error,
    walk,
)

if TYPE_CHECKING:
    import subprocess

# How far WILLNEED submissions may run ahead of completed reads: enough to keep the device queue full, small
# enough that what a cancel leaves reading in the background stays small (a cancel stops submitting at once).
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
# The rescan after an action (what is resident now) gets twice the time the measurement before it took, within
# these bounds; past its budget the count is reported unknown, never guessed.
RESCAN_MIN_S = 2.0
RESCAN_MAX_S = 60.0
HELPER_STOP_S = 5.0  # how long a cancelled warm waits for a helper process to report what it measured
# Files are shared out in runs of 2**SHARD_RUN_BITS consecutive inodes: files next to each other on disk go to
# the same process, so the block layer still merges their reads (alternate files: 3x the requests, 25% slower).
SHARD_RUN_BITS = 6


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
    sized: bool = True  # False: the total is not known while it runs (an evict): no bar, no ETA

    @property
    def rate_bytes_per_s(self) -> float | None:
        """Average rate of the work done so far; None until it has run RATE_AFTER_S and moved some bytes."""
        worked = self.done_bytes - self.found_bytes
        return worked / self.elapsed_s if self.elapsed_s >= RATE_AFTER_S and worked > 0 else None

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the rate so far: 0 only when nothing is left, None while there is no rate yet."""
        left = self.total_bytes - self.done_bytes
        if not self.sized:
            return None
        if left <= 0:
            return 0.0
        rate = self.rate_bytes_per_s
        return None if rate is None else left / rate


ProgressFn = Callable[[Progress], None]


def is_cancelled(cancel: threading.Event | None) -> bool:
    """`cancel` is given and set: the action stops where it is."""
    return cancel is not None and cancel.is_set()


@dataclass(frozen=True)
class MemoryGuard:
    """The memory guard's verdict on an action that brings `need_bytes` into memory; `message` states it with the
    numbers it rests on, and the CLI and the TUI show it as is.

    lock (`memory_guard`): mlock takes pages out of MemAvailable, so `need_bytes` (every page locked) must leave it
    above the margin. warm (`warm_guard`): clean page cache counts in MemAvailable, so a warm does not lower it;
    what it risks is evicting itself: the data (`resident_bytes` already cached + `need_bytes` to read) must fit in
    `room_bytes`, the page cache it can occupy, or its last part pushes out its first.
    """

    need_bytes: int
    available_bytes: int | None  # MemAvailable (None: not read)
    total_bytes: int | None  # MemTotal
    margin_bytes: int
    ok: bool
    fits_bytes: int  # how much of need_bytes can come in within the guard
    message: str
    resident_bytes: int | None = None  # warm: of the same data, already in the page cache (None: not measured)
    room_bytes: int | None = None  # warm: page cache the data can occupy (MemAvailable less the margin, or the cgroup's)
    reclaim_bytes: int | None = None  # warm: the least page cache the kernel must drop to make room (need less free)
    at_risk: dict[str, int] = field(default_factory=dict)  # warm: other watched datasets -> resident bytes


def read_meminfo(path: str = "/proc/meminfo") -> dict[str, int]:
    """The sizes in /proc/meminfo, in bytes ({} when it cannot be read: the guard then says it did not check)."""
    from dltop.sources.memory import parse_meminfo

    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return parse_meminfo(f.read())
    except OSError:
        return {}


def memory_guard(need_bytes: int, meminfo: dict[str, int] | None = None, cgroup: Any = "auto") -> MemoryGuard:
    """The guard's verdict on locking `need_bytes`: it must leave MemAvailable above the margin and, inside a memory
    cgroup with a limit (a container, a Slurm job), fit under that limit beside the job's own memory. `cgroup`
    "auto" reads this process's cgroup when `meminfo` is read live too; None skips it; tests pass a CgroupMemory."""
    from dltop.model.memory import cgroup_room_bytes, safety_margin_bytes

    info, cgroup = _memory_read(meminfo, cgroup)
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
    msg = _lock_verdict(need_bytes, avail, room, margin, fits, ok, by_cgroup)
    return MemoryGuard(need_bytes, avail, total, margin, ok, fits, msg)


def _memory_read(meminfo: dict[str, int] | None, cgroup: Any) -> tuple[dict[str, int], Any]:
    """The meminfo (None: read live) and the memory cgroup ("auto": this process's, when meminfo is live)."""
    if isinstance(cgroup, str):
        cgroup = _own_cgroup() if meminfo is None else None
    return (read_meminfo() if meminfo is None else meminfo), cgroup


def _lock_verdict(need_bytes: int, avail: int | None, room: tuple[int, str] | None, margin: int, fits: int,
                  ok: bool, by_cgroup: bool) -> str:
    """The lock guard's verdict in words, with the numbers it rests on."""
    if ok:
        msg = f"ok: {human_bytes(need_bytes)} fits"
        if avail is not None:
            msg += f", {human_bytes(avail - need_bytes)} stays available"
        if room is not None:
            msg += f", inside cgroup {room[1]}'s limit"
        return msg
    if by_cgroup:
        assert room is not None
        return (f"refused: {human_bytes(need_bytes)} is more than the {human_bytes(room[0])} the memory cgroup "
                f"{room[1]} can hold beside its own memory (memory.max less anon and a margin); {human_bytes(fits)} fits")
    assert avail is not None
    return (f"refused: {human_bytes(need_bytes)} would leave {human_bytes(max(0, avail - need_bytes))} of "
            f"{human_bytes(avail)} available, under the {human_bytes(margin)} margin; {human_bytes(fits)} fits")


def warm_guard(
    need_bytes: int,
    resident_bytes: int | None = None,
    meminfo: dict[str, int] | None = None,
    cgroup: Any = "auto",
    others: Mapping[str, int] | None = None,
) -> MemoryGuard:
    """The guard's verdict on warming `need_bytes` of data beside `resident_bytes` of it already cached (None: not
    measured; `need_bytes` then counts all of the data).

    MemAvailable already holds the resident part (clean page cache is available memory), so the data fits when
    resident + need stays within MemAvailable less the margin and, inside a memory cgroup with a limit, within
    the page cache the cgroup can hold. What is read beyond free memory the kernel reclaims from other page
    cache: `others` (the resident bytes of other watched datasets, by path) says whose pages are at risk.
    """
    from dltop.model.memory import cgroup_room_bytes, safety_margin_bytes

    info, cgroup = _memory_read(meminfo, cgroup)
    avail, total, free = info.get("MemAvailable"), info.get("MemTotal"), info.get("MemFree")
    margin = safety_margin_bytes(total)
    cg_room = cgroup_room_bytes(cgroup)
    if avail is None and cg_room is None:
        return MemoryGuard(need_bytes, None, total, margin, True, need_bytes, "MemAvailable unknown: not checked",
                           resident_bytes=resident_bytes)
    room, where, free = _warm_room(avail, margin, cg_room, cgroup, free)
    res = resident_bytes or 0
    ok = res + need_bytes <= room
    fits = min(need_bytes, max(0, room - res))
    msg = _warm_verdict(need_bytes, resident_bytes, f"the {human_bytes(room)} of page cache it can have ({where})",
                        ok, fits)
    reclaim = None if free is None else max(0, need_bytes - free)
    at_risk = {p: b for p, b in (others or {}).items() if b > 0} if reclaim else {}
    if reclaim:
        msg += _reclaim_text(reclaim, at_risk)
    return MemoryGuard(need_bytes, avail, total, margin, ok, fits, msg, resident_bytes=resident_bytes,
                       room_bytes=room, reclaim_bytes=reclaim, at_risk=at_risk)


def _warm_verdict(need_bytes: int, resident_bytes: int | None, room_text: str, ok: bool, fits: int) -> str:
    """The warm guard's verdict in words: the data weighed against the page cache it can have."""
    if resident_bytes is None:
        what = f"its {human_bytes(need_bytes)} of data"
    else:
        what = f"{human_bytes(need_bytes)} to read" + (
            f" + {human_bytes(resident_bytes)} resident already" if resident_bytes else "")
    if ok:
        return f"ok: {what} fits in {room_text}"
    return (f"refused: {what} is more than {room_text}: the warm would evict what it just read; "
            f"{human_bytes(fits)} fits")


def _warm_room(avail: int | None, margin: int, cg_room: tuple[int, str] | None, cgroup: Any,
               free: int | None) -> tuple[int, str, int | None]:
    """The page cache a warm's data can occupy, where that limit comes from (in words), and the free memory it
    reads into: MemAvailable less the margin, or a memory cgroup's room where that is less."""
    room, where = 0, ""
    if avail is not None:
        room, where = max(0, avail - margin), f"MemAvailable {human_bytes(avail)} less the {human_bytes(margin)} margin"
    if cg_room is not None and (avail is None or cg_room[0] < room):
        room, where = cg_room[0], (f"what memory cgroup {cg_room[1]} can hold: its limit less its anonymous "
                                   "memory and a margin")
        cg_free = max(0, cgroup.max_bytes - cgroup.current_bytes)
        free = cg_free if free is None else min(free, cg_free)
    return room, where, free


def _reclaim_text(reclaim: int, at_risk: dict[str, int]) -> str:
    """What reading past free memory costs: the page cache the kernel reclaims, and whose it may be."""
    text = (f"; reading it takes {human_bytes(reclaim)} more than is free, which the kernel reclaims from other "
            "page cache")
    if at_risk:
        listed = sorted(at_risk.items(), key=lambda kv: -kv[1])
        text += ", where other watched datasets hold " + ", ".join(
            f"{display_path(p)} ({human_bytes(b)})" for p, b in listed[:3]) + (
            f" and {len(listed) - 3} more" if len(listed) > 3 else "")
    return text


def _own_cgroup() -> Any:
    from dltop.sources.memory import read_cgroup_memory

    return read_cgroup_memory("/", "self")


@dataclass
class ActionResult:
    """What an action did; `to_dict()` is the CLI's `--json` summary.

    Bytes are whole pages (pages x page size), as fincore counts them: a 17-byte file is one 4 KiB page.
    Pages whose residency the kernel hides from this user are in `unknown_pages`, never in the resident counts.
    What an action did is measured, never summed from what it asked for: `done_bytes` per file, from the page
    cache before and after its reads (or its eviction), and `resident_pages_after` by a rescan of the whole
    dataset once the action has stopped, so it equals what fincore counts then.
    """

    action: str
    paths: list[str]
    dry_run: bool = False
    files: int = 0  # regular files in the dataset (from the rescan after the action, when it completed)
    files_done: int = 0  # files the action finished: files - files_done were not reached (cancelled) or failed
    # bytes the action set out to move: warm, the pages of data (holes are never read) not resident when it began;
    # evict, the resident pages (zero pages of holes included, as fincore counts them); lock, the pages of data
    total_bytes: int = 0
    size_bytes: int = 0  # the files' apparent size (du --apparent-size), as measured before the action
    data_resident_pages_before: int | None = None  # of resident_pages_before, those of data (holes left out)
    # bytes acted on, measured: warm, pages brought into the page cache (what was resident already is not counted);
    # evict, pages dropped; lock, pages locked. Files whose residency is hidden count the pages asked for (warm:
    # their data, evict: all their pages): the work done, whose result cannot be seen
    done_bytes: int = 0
    pages: int = 0
    resident_pages_before: int | None = 0  # None: not measured (a warm cancelled before it reached every file)
    resident_pages_after: int | None = None  # of the visible pages; None: not measured in full (see notes)
    # The same for the data alone (holes of sparse files left out), the headline as `dltop residency` shows it
    data_pages: int | None = None
    data_resident_pages_after: int | None = None
    unknown_pages: int = 0
    # warm: bytes whose readahead was still reading from disk when the warm stopped; the kernel put their pages in
    # the page cache when asked, so they are counted resident already and the count does not grow after
    inflight_bytes: int = 0
    elapsed_s: float = 0.0  # the action itself, without the measurement before and the rescan after
    cancelled: bool = False
    guard: MemoryGuard | None = None
    stayed: dict[str, int] = field(default_factory=dict)  # evict: reason -> pages that stayed resident
    stayed_detail: list[str] = field(default_factory=list)  # the files holding the most pages first
    stayed_more: int = 0  # files that stayed resident beyond those in stayed_detail
    skipped: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data, by the Snapshot's codec: paths that are not UTF-8 get their `_b64` sibling."""
        d: dict[str, Any] = to_dict(self)
        d["rate_bytes_per_s"] = self.done_bytes / self.elapsed_s if self.elapsed_s > 0 else None
        return d


class Ticker:
    """Calls the progress callback at most every PROGRESS_EVERY_S, and once at the end."""

    def __init__(self, action: str, total: int | None, fn: ProgressFn | None) -> None:
        # total None: not known before the action ends (an evict measures as it goes); progress says none
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
                total = 0 if self.total is None else max(self.total, done)
                self.fn(Progress(self.action, done, total, now - self.t0, files, path, found_n,
                                 sized=self.total is not None))

    def add_file(self, n: int, dir_path: str, name: str, dfd: int | None) -> None:
        """`add` for a file named relative to its folder: its path is put together only when progress is said."""
        self.done += n
        if self.fn is None and not self.helpers:
            return
        if time.monotonic() - self.last >= PROGRESS_EVERY_S:
            self.add(0, join_path(dir_path, name, dfd))

    def merge(self, h: _Helper) -> None:
        """Take over what a helper has done, and zero its counts so nothing is counted twice."""
        self.done, self.files, self.found = self.done + h.done, self.files + h.files, self.found + h.found
        h.done = h.files = h.found = 0


def _files(
    paths: list[str], options: WalkOptions, report: WalkReport, cancel: threading.Event | None,
    walk_report: WalkReport | None = None, shard: tuple[int, int, int] | None = None, by_inode: bool = False,
) -> Generator[tuple[str, int, os.stat_result], None, None]:
    """Open each regular file under `paths` once: yields (path, fd, stat); the caller closes fd. What the walk
    skips goes to `walk_report` (default `report`); `by_inode` and `shard` as for `walk`."""
    seen: set[tuple[int, int]] = set()
    budget = Budget(cancel)
    for root in paths:
        root = os.fsdecode(root)
        try:
            for d, dfd, name, follow in walk(root, options, walk_report or report, FolderTotals(root), budget,
                                             by_inode=by_inode, shard=shard):
                full = join_path(d.path, name, dfd)
                opened = _open_file(dfd, name, follow, full, report, seen, options.follow_symlinks)
                if opened is None:
                    continue
                if cancel is not None and cancel.is_set():
                    os.close(opened[0])
                    return
                yield full, *opened
        except OSError as e:
            raise DltopError(path_error(e.strerror or str(e), root)) from None


def _open_file(dfd: int | None, name: str, follow: bool, path: str, report: WalkReport, seen: set[tuple[int, int]],
               any_alias: bool) -> tuple[int, os.stat_result] | None:
    """A walked file opened, with its stat; None (and `report` says why) where it is not a regular file counted
    for the first time, or cannot be opened. Raises OSError for a root that is a file and cannot be opened."""
    try:
        fd = os.open(name, O_FILE_FOLLOW if follow else O_FILE, dir_fd=dfd)
    except OSError as e:
        if dfd is None:
            raise  # the root is this file: an error, not a skipped file
        skip_error(report, e, path, gone="vanished")
        return None
    try:
        st = os.fstat(fd)
    except OSError as e:
        os.close(fd)
        skip_error(report, e, path, gone="vanished")
        return None
    if not stat.S_ISREG(st.st_mode):
        report.skip("special")
    elif not ((st.st_nlink > 1 or any_alias) and counted_before(st, seen, report)):
        return fd, st
    os.close(fd)
    return None





def _add_measured(r: ActionResult, once: Iterable[DatasetResidency]) -> int:
    """Adds the datasets' files, pages, skips, problems and notes to `r` (`once`: counted_once's list, a dataset
    inside another one given counted there); returns their resident pages."""
    resident = 0
    r.data_resident_pages_before = r.data_resident_pages_before or 0
    for ds in once:
        r.files += ds.files
        r.pages += ds.pages
        r.size_bytes += ds.size_bytes
        r.data_resident_pages_before += ds.data_resident_pages
        resident += ds.resident_pages
        r.unknown_pages += ds.unknown_pages
        for k, v in ds.skipped.items():
            r.skipped[k] = r.skipped.get(k, 0) + v
        r.problems.extend(ds.problems)
        if ds.unknown_reason and ds.unknown_reason not in r.notes:
            r.notes.append(ds.unknown_reason)
    return resident


def plan(
    action: str,
    paths: list[str],
    options: WalkOptions = DEFAULT_WALK,
    cancel: threading.Event | None = None,
    others: Mapping[str, int] | None = None,
) -> ActionResult:
    """What an action would do, from one residency scan: the bytes it would move and the memory guard's verdict.

    `others`: resident bytes of the other watched datasets (the TUI knows them), named by a warm's guard as what
    reading past free memory may push out.
    """
    need = WarmNeed()
    part = scan_paths(tuple(paths), options, cancel=cancel, warm_need=need if action == "warm" else None)
    _require_scanned(part)
    ps = part.page_size
    r = ActionResult(action=action, paths=[os.fsdecode(p) for p in paths], dry_run=True)
    before = r.resident_pages_before = _add_measured(r, counted_once(part.scanned))
    if not all(ds.complete for ds in part.scanned):
        r.notes.append(f"cancelled while measuring: the totals cover the {r.files} files measured")
    if action == "warm":
        r.total_bytes = need.pages * ps
        r.guard = warm_guard(r.total_bytes, before * ps, others=_other_datasets(paths, others))
    elif action == "lock":
        # Locked pages leave MemAvailable even when they were resident already: page cache counts as available
        # (the kernel can drop it), locked pages do not. A lock locks the data: holes are never touched.
        r.total_bytes = sum(ds.data_pages for ds in counted_once(part.scanned)) * ps
        r.guard = memory_guard(r.total_bytes)
    else:
        r.total_bytes = (before + r.unknown_pages) * ps  # hidden pages may be resident too
    return r


def _other_datasets(paths: list[str], others: Mapping[str, int] | None) -> dict[str, int] | None:
    """`others` less those that are one of `paths`, inside one or around one: their pages are this warm's data."""
    if not others:
        return None
    mine = [os.path.abspath(os.fsdecode(p)).rstrip("/") + "/" for p in paths]
    return {
        o: b for o, b in others.items()
        if not any(m.startswith(a) or a.startswith(m) for m in mine for a in [os.path.abspath(o).rstrip("/") + "/"])
    }


def _size_plan(
    action: str,
    paths: list[str],
    options: WalkOptions,
    cancel: threading.Event | None,
    helpers: list[_Helper],
    others: Mapping[str, int] | None = None,
) -> ActionResult:
    """An upper bound for a warm: every page of data of every file, from sizes (only sparse files are opened).

    Once the tree proves large, helper processes are started into `helpers`: they start up while this walk
    goes on, and wait for the go (or are stopped when the guard says no). The guard's verdict is exact all the
    same: it weighs the data, resident or not, against the page cache the data can occupy.
    """
    report = WalkReport()
    budget = Budget(cancel)
    seen: set[tuple[int, int]] = set()
    r = ActionResult(action=action, paths=[os.fsdecode(p) for p in paths], dry_run=True)
    data = 0
    for root in paths:
        root = os.fsdecode(root)
        try:
            for _d, dfd, name, follow in walk(root, options, report, FolderTotals(root), budget):
                pages = _sized_file(r, dfd, name, follow, options.follow_symlinks, seen, report)
                if pages is None:
                    continue
                data += pages
                if r.files == PARALLEL_MIN_FILES:
                    helpers.extend(_spawn_helpers())
        except OSError as e:
            raise DltopError(path_error(e.strerror or str(e), root)) from None
    r.total_bytes = data * kernel.PAGE_SIZE
    r.guard = warm_guard(r.total_bytes, None, others=_other_datasets(paths, others))
    r.resident_pages_before = None  # not measured yet: the warm pass measures it
    if not report.complete:
        r.notes.append(f"cancelled while measuring: the totals cover the {r.files} files measured")
    return r


def _sized_file(r: ActionResult, dfd: int | None, name: str, follow: bool, any_alias: bool,
                seen: set[tuple[int, int]], report: WalkReport) -> int | None:
    """One walked file counted into `r` (files, pages) by its stat: the pages of data a warm reads of it; None
    where it is not counted (a hard link met before, or gone: the warm pass counts and reports it)."""
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=follow)
    except OSError:
        return None
    if (st.st_nlink > 1 or any_alias) and counted_before(st, seen, report):
        return None
    pages = (st.st_size + kernel.PAGE_SIZE - 1) // kernel.PAGE_SIZE
    r.files += 1
    r.pages += pages
    if st.st_blocks * 512 >= st.st_size:
        return pages
    try:  # holes, maybe: count only the pages of data (0: it cannot be read, so it will not be warmed)
        fd = os.open(name, O_FILE_FOLLOW if follow else O_FILE, dir_fd=dfd)
    except OSError:
        return 0
    try:
        return data_pages(fd, st)
    finally:
        os.close(fd)


def warm(
    paths: list[str],
    options: WalkOptions = DEFAULT_WALK,
    *,
    force: bool = False,
    fit: bool = False,
    dry_run: bool = False,
    progress: ProgressFn | None = None,
    cancel: threading.Event | None = None,
    others: Mapping[str, int] | None = None,
) -> ActionResult:
    """Bring files into the page cache with chunked POSIX_FADV_WILLNEED, holes left alone.

    Refuses (DltopError) when the memory guard says no, unless `force`; with `fit`, warms files in walk
    order until the part that fits is in. `others` as for `plan`.
    """
    r = None
    helpers: list[_Helper] = []
    t0 = time.monotonic()
    try:
        if not dry_run:
            # Cheap first: if all the data fits, the exact residency scan (a second walk) is not needed.
            r = _size_plan("warm", paths, options, cancel, helpers, others)
            assert r.guard is not None
            if not r.guard.ok:
                r = None
                _stop_all(helpers)
        if r is None:
            r = plan("warm", paths, options, cancel, others)
        return _guarded_warm(r, paths, options, force, fit, dry_run, progress, cancel, helpers,
                             time.monotonic() - t0)
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
    plan_s: float,
) -> ActionResult:
    assert r.guard is not None
    limit: int | None = None
    if not r.guard.ok and not force:
        if not fit:
            raise DltopError(f"warm {r.guard.message} (--fit warms the part that fits, --force warms anyway)")
        limit = r.guard.fits_bytes
        r.notes.append(f"warming only the part that fits: {human_bytes(r.guard.fits_bytes)}")
        r.total_bytes = min(r.total_bytes, limit)
    if dry_run:
        return r
    r.dry_run = False
    if limit is not None:
        _stop_all(helpers)  # a warm cut at the guard's limit goes in walk order, in one process
    return _run_warm(r, paths, options, limit, progress, cancel, plan_s, helpers or None)


@dataclass
class _Tally:
    """What a warm pass measured, in pages (JSON between a helper process and its parent)."""

    before: int = 0  # resident when the pass reached the file (visible pages)
    brought: int = 0  # brought in: resident after the file's reads less resident before, per file
    hidden: int = 0  # pages of files whose residency the kernel hides (warmed all the same)
    hidden_asked: int = 0  # the data pages asked for from those files
    files: int = 0  # files finished
    inflight_bytes: int = 0  # asked for and still being read when the pass stopped

    def add(self, other: _Tally) -> None:
        for k, v in other.__dict__.items():
            setattr(self, k, getattr(self, k) + v)


def _run_warm(
    r: ActionResult,
    paths: list[str],
    options: WalkOptions,
    limit: int | None,
    progress: ProgressFn | None,
    cancel: threading.Event | None,
    plan_s: float,
    helpers: list[_Helper] | None = None,
) -> ActionResult:
    ticker = Ticker("warm", r.total_bytes, progress)
    sized = r.resident_pages_before is None  # the total came from sizes, resident files included
    t0 = time.monotonic()
    helpers = _helpers_for(r, limit, cancel, helpers)
    _go(helpers, paths, options, sized)
    ticker.helpers = list(helpers)
    shards = len(helpers) + 1
    try:
        report, tally = _warm_pass(
            paths, options, limit, ticker, cancel, r.notes, sized, (0, shards, helpers[0].shard[2]) if helpers else None
        )
        for h in helpers:
            _take_helper(h, report, tally, paths, options, ticker, cancel, r.notes, sized)
    finally:
        ticker.helpers = []
        for h in helpers:
            h.stop()
    r.cancelled = is_cancelled(cancel)
    _tally_into(r, tally, sized)
    return _finish(r, report, ticker, t0, tally.hidden, paths, options, plan_s)


def _helpers_for(r: ActionResult, limit: int | None, cancel: threading.Event | None,
                 helpers: list[_Helper] | None) -> list[_Helper]:
    """The helper processes of a warm pass: those started while measuring (None: new ones for a large tree not
    cut at the guard's limit); none after a cancel (those started are stopped)."""
    if is_cancelled(cancel):
        _stop_all(helpers or [])
        return []
    if helpers is None:
        return _spawn_helpers() if limit is None and r.files >= PARALLEL_MIN_FILES else []
    return helpers


def _take_helper(h: _Helper, report: WalkReport, tally: _Tally, paths: list[str], options: WalkOptions,
                 ticker: Ticker, cancel: threading.Event | None, notes: list[str], sized: bool) -> None:
    """What helper `h` warmed, added to this pass's `report` and `tally`; its share warmed here if it failed."""
    got = h.wait(cancel)  # after a cancel: what it measured before it stopped
    if got is None and not is_cancelled(cancel):
        notes.append(f"helper process failed ({h.error or 'no result'}): its share was warmed in this one")
        rep, t = _warm_pass(paths, options, None, ticker, cancel, notes, sized, h.shard)
    elif got is None:
        notes.append(f"a helper process stopped before it reported ({h.error or 'no result'}): what it "
                     "brought in is missing from done_bytes (resident_pages_after counts it)")
        return
    else:
        rep, t = got
        ticker.merge(h)
    tally.add(t)
    for k, v in rep.skipped.items():
        report.skipped[k] = report.skipped.get(k, 0) + v
    report.problems.extend(p for p in rep.problems if len(report.problems) < MAX_PROBLEMS)


def _tally_into(r: ActionResult, tally: _Tally, sized: bool) -> None:
    """A warm's result from what its passes measured."""
    ps = kernel.PAGE_SIZE
    r.done_bytes = (tally.brought + tally.hidden_asked) * ps
    r.files_done = tally.files
    r.inflight_bytes = tally.inflight_bytes
    if sized and not r.cancelled:
        r.resident_pages_before = tally.before
        r.total_bytes = max(0, r.total_bytes - tally.before * ps)  # the data that was not resident
    elif sized:
        r.notes.append("total_bytes counts all the data of the files not reached: their residency was not measured")
    if r.inflight_bytes:
        r.notes.append(
            f"{human_bytes(r.inflight_bytes)} was still being read from disk when the warm stopped: the kernel "
            "put those pages in the page cache when asked, so they are counted resident and the count will not grow"
        )


class _Reading:
    """A file whose reads are under way in a warm pass."""

    __slots__ = ("path", "st", "have", "whole", "brought", "asked_all")

    def __init__(self, path: str, st: os.stat_result, have: int | None, whole: bool) -> None:
        self.path, self.st, self.have, self.whole = path, st, have, whole
        self.brought = 0  # pages its confirmed chunks brought in
        self.asked_all = False  # every chunk asked for


def _warm_pass(
    paths: list[str],
    options: WalkOptions,
    limit: int | None,
    ticker: Ticker,
    cancel: threading.Event | None,
    notes: list[str],
    sized: bool,
    shard: tuple[int, int, int] | None = None,
) -> tuple[WalkReport, _Tally]:
    """Warm the files of one shard (all of them when None): what was skipped, and what was measured.

    Each chunk's range is measured before it is asked for and once it is read (or when the pass stops with it
    under way): what a file brought in is the sum, never the bytes asked for, and pages that reclaim takes
    again later (a cgroup limit below the dataset) still count as read.

    Only shard 0 (or the only pass) counts what the walk itself skips: every shard walks the whole tree.
    """
    report = WalkReport()
    walk_report = report if shard is None or shard[0] == 0 else WalkReport()
    warming = _Warming(report, ticker, cancel, limit, sized)
    try:
        # Inode order: neighbouring small files are read in disk order and their reads merge.
        for path, fd, st in _files(paths, options, report, cancel, walk_report, shard, by_inode=True):
            if not warming.start(path, fd, st, notes):
                break  # cancelled, or the guard's limit reached
        warming.drain()
    finally:
        warming.stop()
    return report, warming.tally


class _Warming:
    """A warm pass's reads under way: each file's chunks asked for with WILLNEED, then waited for (one byte read at
    the end of each chunk, so "done" means in memory, not merely requested) once more than WARM_INFLIGHT_BYTES or
    WARM_INFLIGHT_FILES are in flight."""

    def __init__(self, report: WalkReport, ticker: Ticker, cancel: threading.Event | None, limit: int | None,
                 sized: bool) -> None:
        self.report, self.ticker, self.cancel, self.sized = report, ticker, cancel, sized
        self.budget = limit  # bytes the guard lets the pass ask for still (None: no limit)
        self.cstat = kernel.cachestat_caller()
        self.mincore_devs: dict[int, bool] = {}  # dev -> cachestat cannot be trusted there (overlayfs, old kernel)
        self.window_by_dev: dict[int, int] = {}
        # (fd, offset, length, last chunk of its file, its resident pages before)
        self.pending: deque[tuple[int, int, int, bool, int]] = deque()
        self.reading: dict[int, _Reading] = {}
        self.inflight = 0
        self.last_byte = [bytearray(1)]
        self.tally = _Tally()

    def stopped(self) -> bool:
        """Cancelled."""
        return self.cancel is not None and self.cancel.is_set()

    def cached(self, fd: int, st: os.stat_result) -> int | None:
        """Resident pages of an open file, by cachestat or mincore; None where the kernel hides them from us."""
        use_mincore = self.mincore_devs.get(st.st_dev)
        if use_mincore is None:
            use_mincore = self.mincore_devs[st.st_dev] = needs_mincore(fd)
        if not use_mincore:
            try:
                return int(self.cstat(fd).nr_cache)
            except OSError as e:
                if e.errno != errno.EPERM:
                    raise
                return None
        euid = os.geteuid()
        if euid != 0 and st.st_uid != euid and not os.access(f"/proc/self/fd/{fd}", os.W_OK, effective_ids=True):
            return None
        return kernel.mincore_resident_pages(fd, st.st_size)

    def cached_range(self, fd: int, st: os.stat_result, off: int, n: int) -> int:
        """Resident pages of [off, off+n) of a file whose residency is visible."""
        if self.mincore_devs.get(st.st_dev) is False:
            cstat = self.cstat
            cstat.range.off, cstat.range.len = off, n
            try:
                return int(cstat(fd).nr_cache)
            finally:
                cstat.range.off = cstat.range.len = 0
        return kernel.mincore_vector(fd, n, off).count(1)

    def start(self, path: str, fd: int, st: os.stat_result, notes: list[str]) -> bool:
        """Begin warming one open file (the pass owns `fd` now); False: the pass stops here."""
        ps = kernel.PAGE_SIZE
        pages = (st.st_size + ps - 1) // ps
        try:
            have = self.cached(fd, st)
        except OSError as e:
            os.close(fd)
            skip_error(self.report, e, path, gone="vanished")
            return True
        if self.stopped():
            os.close(fd)
            return False
        if self.budget is not None and self.budget <= 0:
            os.close(fd)
            notes.append("stopped at the memory guard's limit")
            return False
        if have is not None:
            self.tally.before += min(have, pages)
            if have >= pages:  # already all in memory: nothing to read
                self._resident_already(path, fd, st)
                return True
        chunks, whole = self._chunks(fd, st)
        f = _Reading(path, st, have, whole)
        if not chunks:
            self._count(f, pages)
            os.close(fd)
            self._file_done()
            return True
        self.reading[fd] = f
        return self._ask(fd, f, chunks)

    def _resident_already(self, path: str, fd: int, st: os.stat_result) -> None:
        if self.sized:  # the progress total counted its data pages: count them done (found, not worked)
            try:
                self.ticker.add(data_pages(fd, st) * kernel.PAGE_SIZE, path, found=True)
            except OSError as e:
                skip_error(self.report, e, path, gone="vanished")
        os.close(fd)
        self._file_done()

    def _chunks(self, fd: int, st: os.stat_result) -> tuple[list[tuple[int, int]], bool]:
        """The file's WILLNEED calls (readahead-window pieces of its data, within the guard's budget), and whether
        they cover all of it."""
        size = st.st_size
        window = self.window_by_dev.get(st.st_dev)
        if window is None:
            window = self.window_by_dev[st.st_dev] = kernel.readahead_bytes(st.st_dev)
        # Only a file with fewer blocks than its size can have holes: skip SEEK_DATA for the others.
        dense = st.st_blocks * 512 >= size
        if dense and size <= window and self.budget is None:
            return [(0, size)], True  # the common small file: one WILLNEED, one wait
        chunks = _chunks(fd, size, dense, window, self.budget, kernel.PAGE_SIZE)
        whole = True
        if self.budget is not None:
            asked = sum(n for _off, n in chunks)
            whole = self.budget >= asked and (not chunks or chunks[-1][0] + chunks[-1][1] >= size)
            self.budget -= asked
        return chunks, whole

    def _ask(self, fd: int, f: _Reading, chunks: list[tuple[int, int]]) -> bool:
        """WILLNEED for each chunk, waiting for the oldest while too much is in flight; False: cancelled."""
        ps, have, final = kernel.PAGE_SIZE, f.have, len(chunks) - 1
        for i, (off, n) in enumerate(chunks):
            # What this range holds already: nothing of a cold file, all of `have` for a one-chunk file.
            before = 0 if not have else have if final == 0 and off == 0 else self.cached_range(fd, f.st, off, n)
            try:
                os.posix_fadvise(fd, off, n, os.POSIX_FADV_WILLNEED)
            except OSError:
                _read_range(fd, off, n)
            if have is None:
                self.tally.hidden_asked += (off + n + ps - 1) // ps - off // ps
            self.pending.append((fd, off, n, i == final, before))
            self.inflight += n
            self._throttle()
            if i < final and self.stopped():
                break
        else:
            f.asked_all = True
        return not self.stopped()

    def _throttle(self) -> None:
        """Wait for the oldest chunks while more than WARM_INFLIGHT_BYTES or WARM_INFLIGHT_FILES are in flight."""
        while self.inflight > WARM_INFLIGHT_BYTES or len(self.pending) > WARM_INFLIGHT_FILES:
            self._finish_one()

    def _count(self, f: _Reading, pages: int) -> None:
        if f.have is None:
            self.tally.hidden += pages
        else:
            self.tally.brought += min(f.brought, max(0, pages - f.have))

    def _file_done(self) -> None:
        self.tally.files += 1
        self.ticker.files += 1

    def _finish_one(self) -> None:
        """Wait for the oldest chunk in flight and count what it brought in; its file is done with its last."""
        ps = kernel.PAGE_SIZE
        fd, off, n, last, before = self.pending.popleft()
        self.inflight -= n
        f = self.reading[fd]
        try:
            os.preadv(fd, self.last_byte, off + n - 1)
            if f.have is not None:
                f.brought += max(0, self.cached_range(fd, f.st, off, n) - before)
        except OSError as e:
            skip_error(self.report, e, f.path, gone="vanished")
        self.ticker.add(((off + n + ps - 1) // ps - off // ps) * ps, f.path)  # whole pages, as the totals count
        if last:
            del self.reading[fd]
            self._finish_file(fd, f)

    def _finish_file(self, fd: int, f: _Reading) -> None:
        st = f.st
        try:
            pages = (st.st_size + kernel.PAGE_SIZE - 1) // kernel.PAGE_SIZE
            if (f.whole and f.have is not None and f.have + f.brought < pages
                    and data_extents(fd, st.st_size) == [(0, st.st_size)]):  # dense: no hole to leave alone
                # The filesystem ignored WILLNEED (some FUSE and network filesystems): read it instead.
                _read_all(fd, st.st_size, self.cancel)
                got = self.cached(fd, st)
                f.brought = max(f.brought, (got or 0) - f.have)
            self._count(f, pages)
        except OSError as e:
            skip_error(self.report, e, f.path, gone="vanished")
        finally:
            os.close(fd)
        self._file_done()

    def drain(self) -> None:
        """Wait for every chunk in flight (until cancelled)."""
        while self.pending and not self.stopped():
            self._finish_one()

    def stop(self) -> None:
        """Stopped with reads under way: each chunk not yet confirmed is measured now. The kernel added its pages
        to the page cache when WILLNEED was called, so the reads still running change no count, and a file whose
        every chunk was asked for is done (its last reads still running)."""
        self.tally.inflight_bytes = self.inflight
        for fd, off, n, _last, before in self.pending:
            f = self.reading[fd]
            if f.have is not None:
                try:
                    f.brought += max(0, self.cached_range(fd, f.st, off, n) - before)
                except OSError as e:
                    skip_error(self.report, e, f.path, gone="vanished")
        for fd, f in self.reading.items():
            self._count(f, (f.st.st_size + kernel.PAGE_SIZE - 1) // kernel.PAGE_SIZE)
            if f.asked_all:
                self._file_done()
            os.close(fd)
        self.reading.clear()
        self.pending.clear()


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
        "options": asdict(options),
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
        # Imported here: only a warm of many files starts helpers, and subprocess is ~15 ms of CPU at start-up.
        import subprocess

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
            line = json.dumps({**spec, "shard": list(self.shard)}).encode("utf-8", "surrogateescape") + b"\n"
            self.proc.stdin.write(line)  # stdin stays open: closing it tells the child to stop
            self.proc.stdin.flush()
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

    def wait(self, cancel: threading.Event | None) -> tuple[WalkReport, _Tally] | None:
        """What it skipped and measured, once done; None if it failed. Once `cancel` is set, it is asked to stop
        (its stdin closed) and still reports what it measured, within HELPER_STOP_S."""
        proc = self.proc
        if proc is None or proc.stdout is None or not self._exited(proc, proc.stdout, cancel):
            return None
        self.poll()
        res = self._result
        if proc.returncode != 0 or res is None:
            self._failed(proc)
            return None
        report = WalkReport()
        report.skipped = {str(k): int(v) for k, v in res["skipped"].items()}
        report.problems = [str(p) for p in res["problems"]]
        self.done, self.files, self.found = int(res["done"]), int(res["files"]), int(res["found"])
        return report, _Tally(**{k: int(v) for k, v in res["tally"].items()})

    def _failed(self, proc: subprocess.Popen[bytes]) -> None:
        """It ended without its report: `error` says why (its last line on stderr), and it counts nothing."""
        err = proc.stderr.read().decode(errors="replace").strip() if proc.stderr is not None else ""
        self.error = (err.splitlines() or [f"exit status {proc.returncode}"])[-1][:200]
        self.done = self.files = self.found = 0

    def _exited(self, proc: subprocess.Popen[bytes], out: IO[bytes], cancel: threading.Event | None) -> bool:
        """Read what it says until it exits; False where it has not stopped HELPER_STOP_S after `cancel`."""
        import select

        deadline = None
        while proc.poll() is None:
            if deadline is None and is_cancelled(cancel):
                self._close_stdin()  # it stops at once and reports what it measured
                deadline = time.monotonic() + HELPER_STOP_S
            if deadline is not None and time.monotonic() >= deadline:
                self.error = "did not stop in time"
                return False
            select.select([out], [], [], 0.1)
            self.poll()
        return True

    def _close_stdin(self) -> None:
        if self.proc is not None and self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(OSError):  # it is gone already
                self.proc.stdin.close()

    def stop(self) -> None:
        """End the child if it still runs and close its pipes; safe to call twice."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            import subprocess

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
    text = sys.stdin.buffer.readline().decode("utf-8", "surrogateescape")
    if not text:
        return 0  # not needed after all (the guard said no, or the warm was cancelled)
    spec = json.loads(text)
    # The parent closes stdin to say stop (a cancel, or it died): stop, and still report what was measured. A
    # pipe, not a signal: a signal that came before the handler was set would kill the child without its report.
    stop = threading.Event()

    def watch() -> None:
        while os.read(0, 4096):  # the raw fd: a daemon thread blocked in sys.stdin's reader breaks shutdown
            pass
        stop.set()

    threading.Thread(target=watch, daemon=True).start()
    WARM_INFLIGHT_BYTES, WARM_INFLIGHT_FILES = int(spec["inflight_bytes"]), int(spec["inflight_files"])
    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in spec["options"].items()}
    options = WalkOptions(**fields)  # JSON gave back the options' tuples as lists
    out = sys.stdout.buffer

    def say(p: Progress) -> None:
        out.write(f"P {p.done_bytes} {p.files_done} {p.found_bytes}\n".encode())
        out.flush()

    ticker = Ticker("warm", 0, say)
    notes: list[str] = []
    shard = (int(spec["shard"][0]), int(spec["shard"][1]), int(spec["shard"][2]))
    report, tally = _warm_pass(spec["paths"], options, None, ticker, stop, notes, bool(spec["sized"]), shard)
    result = {"done": ticker.done, "files": ticker.files, "found": ticker.found, "tally": tally.__dict__,
              "skipped": report.skipped, "problems": report.problems}
    out.write(b"R " + json.dumps(result).encode("utf-8", "surrogateescape") + b"\n")
    out.flush()
    return 0


def _chunks(fd: int, size: int, dense: bool, window: int, budget: int | None, ps: int) -> list[tuple[int, int]]:
    """The WILLNEED calls for one file: readahead-window pieces of its data, holes left out, within `budget`."""
    chunks = []
    for start, end in [(0, size)] if dense else data_extents(fd, size):
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


def _finish(
    r: ActionResult,
    report: WalkReport,
    ticker: Ticker,
    t0: float,
    unknown: int,
    paths: list[str],
    options: WalkOptions,
    plan_s: float,
) -> ActionResult:
    ticker.add(0, force=True)
    r.elapsed_s = time.monotonic() - t0
    r.unknown_pages = unknown
    for k, v in report.skipped.items():
        r.skipped.setdefault(k, v)
    for p in report.problems:
        if p not in r.problems:
            r.problems.append(p)
    _measure_after(r, paths, options, _rescan_budget_s(plan_s, r.cancelled))
    _note_hidden(r)
    return r


def _rescan_budget_s(plan_s: float, cancelled: bool) -> float:
    """Time for the rescan after an action: twice what measuring before it took (the same walk, one cachestat
    per file), at least RESCAN_MIN_S; after a cancel RESCAN_MIN_S only: the user asked to stop."""
    if cancelled:
        return RESCAN_MIN_S
    return min(RESCAN_MAX_S, max(RESCAN_MIN_S, 2 * plan_s))


def _measure_after(r: ActionResult, paths: list[str], options: WalkOptions, budget_s: float) -> None:
    """Resident pages now, by a rescan of the whole dataset once the action has stopped: what fincore would count.

    Summing while the action ran is wrong twice over: a warm's later files can evict its earlier ones (a cgroup
    limit, memory pressure), and a cancelled action never reaches some files. A rescan that runs out of its
    budget leaves the count unknown, with the part it reached in a note.
    """
    part = scan_paths(tuple(paths), options, deadline_s=budget_s)
    once = counted_once(part.scanned)  # a dataset inside another one given is counted there
    files = sum(ds.files for ds in once)
    resident = sum(ds.resident_pages for ds in once)
    if not _whole(part):
        r.resident_pages_after = None
        why = next((ds.unavailable for ds in part.paths if isinstance(ds, DatasetUnavailable)), None)
        r.notes.append(
            f"resident now: unknown: the rescan after the {r.action} " + (
                f"failed ({why})" if why else
                f"ran out of its {budget_s:.1f} s budget after {files} files "
                f"({human_bytes(resident * part.page_size)} resident among them)"
            )
        )
        return
    _resident_after(r, once)
    r.unknown_pages = sum(ds.unknown_pages for ds in once)
    r.pages = sum(ds.pages for ds in once)
    r.files = files


def _resident_after(r: ActionResult, once: list[DatasetResidency]) -> None:
    """What is resident now, of all pages and of the data, from datasets measured after the action."""
    r.resident_pages_after = sum(ds.resident_pages for ds in once)
    r.data_pages = sum(ds.known_data_pages for ds in once)
    r.data_resident_pages_after = sum(ds.data_resident_pages for ds in once)


def _require_scanned(part: DatasetsPart) -> None:
    """Refuse (DltopError) when a dataset could not be scanned at all."""
    for missing in part.paths:
        if isinstance(missing, DatasetUnavailable):
            raise DltopError(missing.unavailable)


def _whole(part: DatasetsPart) -> bool:
    """Every dataset scanned to the end."""
    return len(part.scanned) == len(part.paths) and all(ds.complete for ds in part.scanned)


def _note_hidden(r: ActionResult) -> None:
    if r.unknown_pages and NO_PERMISSION not in r.notes:
        r.notes.append(NO_PERMISSION)


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
    while off < size and not is_cancelled(cancel):
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
    One walk measures, evicts and re-measures each file while it is open, as `vmtouch -e` walks once. Its
    total is not known before the walk ends, so progress has none. A cancelled evict is rescanned after, as
    the files it did not reach were not measured.
    """
    if dry_run:
        return plan("evict", paths, options, cancel)
    t0 = time.monotonic()
    ticker = Ticker("evict", None, progress)
    ev = _Evictor(ticker, retries)
    part = scan_paths(tuple(paths), options, cancel=cancel, act=ev)
    _require_scanned(part)
    ps = part.page_size
    r = ActionResult(action="evict", paths=[os.fsdecode(p) for p in paths])
    once = counted_once(part.scanned)  # a dataset inside another one given is counted there
    _add_measured(r, once)
    r.resident_pages_before = ev.before
    r.total_bytes = (ev.before + r.unknown_pages) * ps  # hidden pages may be resident too
    r.cancelled = is_cancelled(cancel)
    ticker.add(0, force=True)
    r.elapsed_s = time.monotonic() - t0
    r.done_bytes, r.files_done = ticker.done, r.files
    _explain_stayed(r, ev.stayed, ps)
    if r.cancelled or not _whole(part):
        # What the walk did not reach was neither measured nor evicted: count it all again.
        _measure_after(r, paths, options, _rescan_budget_s(r.elapsed_s, r.cancelled))
    else:  # every file measured after its own eviction: what a rescan (and fincore) counts now
        _resident_after(r, once)
    _note_hidden(r)
    return r


class _Evictor:
    """The evict's `FileAct`: each resident file's pages dropped, and what was there before and stayed counted."""

    def __init__(self, ticker: Ticker, retries: int) -> None:
        self.ticker, self.retries = ticker, retries
        self.before = 0  # resident pages found, of the files whose residency shows
        self.stayed: list[tuple[str, os.stat_result, int, bool]] = []
        self._tmpfs_devs: dict[int, bool] = {}
        self._blind: set[tuple[int, int]] = set()  # hidden files asked already (a dataset inside another one)

    def _on_tmpfs(self, fd: int, st: os.stat_result) -> bool:
        tmpfs = self._tmpfs_devs.get(st.st_dev)
        if tmpfs is None:
            tmpfs = self._tmpfs_devs[st.st_dev] = kernel.fstatfs_type(fd) in (kernel.TMPFS_MAGIC, kernel.RAMFS_MAGIC)
        return tmpfs

    def drops_inline(self, fd: int, st: os.stat_result) -> bool:
        """The scan may drop clean pages itself on this file's filesystem: not on tmpfs, where they are the file."""
        return not self._on_tmpfs(fd, st)

    def dropped(self, files: int, pages: int, dir_path: str, name: str, dfd: int | None) -> None:
        """`files` files the scan emptied of their `pages` clean pages (the last one named)."""
        self.before += pages
        self.ticker.files += files
        self.ticker.add_file(pages * _PS, dir_path, name, dfd)

    def __call__(self, fd: int, st: os.stat_result, dir_path: str, name: str, dfd: int | None, before: int | None,
                 busy: int, cstat: Any) -> int | None:
        """Evict one open file the scan could not empty itself (dirty pages, tmpfs, pages that stayed, or hidden)."""
        tmpfs = self._on_tmpfs(fd, st)
        if before is None:
            self._evict_hidden(fd, st, tmpfs, join_path(dir_path, name, dfd))
            return None
        self.before += before
        self.ticker.files += 1
        left = before if tmpfs else _evict_fd(fd, st, before, busy, cstat, self.retries)
        if left:
            self.stayed.append((join_path(dir_path, name, dfd), st, left, tmpfs))
        self.ticker.add_file((before - left) * _PS, dir_path, name, dfd)
        return left

    def _evict_hidden(self, fd: int, st: os.stat_result, tmpfs: bool, path: str) -> None:
        """The kernel hides this file's residency: DONTNEED is asked for all of it, the result is unknown. Counted
        as done (the work was done), never as resident or evicted pages measured."""
        key = (st.st_dev, st.st_ino)
        if key in self._blind:
            return
        self._blind.add(key)
        self.ticker.files += 1
        if not tmpfs:
            _fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        self.ticker.add(0 if tmpfs else (st.st_size + _PS - 1) // _PS * _PS, path)


_PS = kernel.PAGE_SIZE


def _evict_fd(fd: int, st: os.stat_result, before: int, busy: int, cstat: Any, retries: int) -> int:
    """Evict one open file with `before` pages resident; returns the pages still resident, measured with `cstat`
    (whose struct then holds the state after) or, where it is None, mincore."""
    if busy:
        _fdatasync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    for i in range(retries + 1):
        now = int(cstat(fd).nr_cache) if cstat is not None else kernel.mincore_resident_pages(fd, st.st_size)
        if now == 0 or i == retries:
            return now
        # Pages still dirty or under writeback when DONTNEED ran stay; flush and drop again.
        _fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    return now


def _fdatasync(fd: int) -> None:
    try:
        os.fdatasync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.EROFS, errno.EBADF):
            raise


STAYED_DETAIL = 10  # files named in an evict's "stayed" list (the biggest); the rest are "N more"


def _locker(pid: int, comm: str) -> str:
    """Who holds a lock, said so that the user can let it go: dltop's own lock is unlocked with l on its row."""
    if pid == os.getpid():
        return f"this dltop's own lock (pid {pid}; l on its row unlocks it)"
    if comm == "dltop":
        return f"dltop's lock in pid {pid} (l on its row there unlocks it)"
    return f"{comm} (pid {pid})"


def _explain_stayed(r: ActionResult, stayed: list[tuple[str, os.stat_result, int, bool]], ps: int) -> None:
    if not stayed:
        return
    # The files holding the most pages first: ten tiny ones listed and the 600 MiB one left out said nothing.
    stayed = sorted(stayed, key=lambda s: (-s[2], s[0]))
    mappers = _mappers({(s.st_dev, s.st_ino) for _p, s, _n, tmpfs in stayed if not tmpfs})
    for path, st, pages, tmpfs in stayed:
        why, detail = _why_stayed(tmpfs, mappers.get((st.st_dev, st.st_ino), []))
        r.stayed[why] = r.stayed.get(why, 0) + pages
        if len(r.stayed_detail) < STAYED_DETAIL:
            r.stayed_detail.append(f"{display_path(path)}: {plural(pages, 'page')} "
                                   f"({human_bytes(pages * ps)}) {detail}")
        else:
            r.stayed_more += 1


def _why_stayed(tmpfs: bool, who: list[tuple[int, str, bool]]) -> tuple[str, str]:
    """Why a file's pages stayed resident after an evict (a `stayed` key), and in words: `who` maps it."""
    if tmpfs:
        return "tmpfs", "on tmpfs: its pages are memory, not cache (delete the file to free them)"
    if any(locked for _pid, _comm, locked in who):
        return "locked", "locked by " + ", ".join(_locker(p, c) for p, c, locked in who if locked)
    if who:
        return "mapped", "mapped by " + ", ".join(f"{c} (pid {p})" for p, c, _l in who)
    return "busy", "still in use (under writeback or being read)"


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
            found = _mapped_by(f"{proc}/{pid}", want)
            if found:
                with open(f"{proc}/{pid}/comm", encoding="utf-8", errors="replace") as f:
                    comm = f.read().strip()
                for key, locked in found.items():
                    out.setdefault(key, []).append((pid, comm, locked))
        except (OSError, ValueError):
            continue
    return out


def _mapped_by(pid_dir: str, want: dict[tuple[str, str], tuple[int, int]]) -> dict[tuple[int, int], bool]:
    """Of the files in `want` (by smaps' device and inode), those one process maps, and whether it locked them."""
    found: dict[tuple[int, int], bool] = {}
    with open(f"{pid_dir}/smaps", encoding="utf-8", errors="replace") as f:
        current: tuple[int, int] | None = None
        for line in f:
            first = line.split(None, 6)
            if len(first) >= 5 and "-" in first[0] and ":" in first[3]:
                current = want.get((first[3], first[4]))
                if current is not None:
                    found.setdefault(current, False)
            elif current is not None and line.startswith("Locked:") and int(line.split()[1]) > 0:
                found[current] = True
    return found


def _mlock_failed(path: str, e: OSError, locked_bytes: int) -> str:
    """Why mlock refused a file, with the limit that refused it and what was locked before."""
    soft, _ = kernel.memlock_limit_bytes()
    return (f"mlock failed on {display_path(path)} ({e.strerror}): RLIMIT_MEMLOCK is "
            f"{'unlimited' if soft is None else human_bytes(soft)} and {human_bytes(locked_bytes)} "
            "was locked before it (raise `ulimit -l` or run as root)")


def _lock_file(locks: LockSet, path: str, fd: int, st: os.stat_result, ticker: Ticker,
               cancel: threading.Event | None, report: WalkReport) -> bool:
    """Lock one open file and close its fd (the mapping keeps it); False where it was skipped. Raises
    DltopError, every lock released, where the limit on locked memory refused it."""

    def step(n: int) -> bool:
        ticker.add(n, path)
        return not is_cancelled(cancel)

    try:
        locks.lock_file(path, fd, st, step)
    except OSError as e:
        if e.errno in (errno.ENOMEM, errno.EAGAIN, errno.EPERM):
            before = locks.bytes
            locks.release()
            raise DltopError(_mlock_failed(path, e, before)) from None
        skip_error(report, e, path, gone="vanished")
        return False
    finally:
        os.close(fd)
    ticker.files += 1
    return True


def memlock_error(need_bytes: int) -> str | None:
    """Why locking `need_bytes` will fail because of RLIMIT_MEMLOCK, or None when it will not."""
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
    t_plan = time.monotonic()
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
    plan_s = time.monotonic() - t_plan
    report = WalkReport()
    ticker = Ticker("lock", r.total_bytes, progress)
    t0 = time.monotonic()
    files = _files(paths, options, report, cancel)
    try:
        for path, fd, st in files:
            if _lock_file(locks, path, fd, st, ticker, cancel, report) and is_cancelled(cancel):
                break
    except BaseException:
        locks.release()
        raise
    finally:
        files.close()
    r.cancelled = is_cancelled(cancel)
    r.done_bytes, r.files_done = locks.bytes, len(locks.paths)
    return _finish(r, report, ticker, t0, 0, paths, options, plan_s), locks
