"""Dataset residency: walk a tree like vmtouch, ask the kernel per file how much is in the page cache.

One cachestat(2) per file (mmap + mincore where cachestat is missing or wrong, as through overlayfs),
totals per folder for drill-down (memory grows with folders, not files), and every file the walk could
not count is counted and reported, never fatal. A folder's files are kept only as its top few by each sort
key asked for (`TopFiles`), in memory bounded by the number of folders, not files.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import stat
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from dltop import kernel
from dltop.model.datasets import (
    NO_PERMISSION,
    DatasetResidency,
    DatasetsPart,
    DatasetUnavailable,
    ResidencyNode,
)
from dltop.residency import measure as measuring
from dltop.residency.budget import Budget, path_error
from dltop.residency.measure import O_FILE, O_FILE_FOLLOW, page_counts, resident_counts
from dltop.residency.rank import TopFiles
from dltop.residency.walk import (
    DEFAULT_WALK,
    FolderTotals,
    WalkedFolder,
    WalkOptions,
    WalkReport,
    compile_names,
    counted_before,
    counted_before_ids,
    join_path,
    skip_error,
    walk,
)

if TYPE_CHECKING:  # in annotations only
    import threading

_DROPPED_EVERY = 256  # files an act's inline drops are reported in (its progress moves by that many)


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
    options: WalkOptions = DEFAULT_WALK,
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
    budget = Budget(cancel, None if deadline_s is None else t0 + deadline_s, cpu_fraction)
    scan = _TreeScan(root, options, warm_need, act)
    scan.run(budget, seen_dirs)
    return scan.result(time.monotonic() - t0)


class _TreeScan:
    """One `scan_residency`: the walk's files measured into their folders' totals, in named steps. `run` is the
    loop over the C step's answers (dltop/native/_measure.c), kept in one function with its running totals in
    locals as the C loop keeps them; a file the C step leaves (or every file, without it) goes through
    `_python_step`, its readable twin."""

    def __init__(self, root: str, options: WalkOptions, warm_need: WarmNeed | None, act: FileAct | None) -> None:
        self.root, self.options, self.warm_need, self.act = root, options, warm_need, act
        self.report = WalkReport()
        self.acc = FolderTotals(root)
        self.seen_inodes: set[tuple[int, int]] = set()
        self.any_alias = options.follow_symlinks  # following symlinks, any file can be reached twice
        self.cstat = kernel.cachestat_caller()
        self.used: set[str] = set()
        self.by_cachestat = False
        self.drops_inline: Any = getattr(act, "drops_inline", None)  # optional, see FileAct
        self.report_dropped: Any = getattr(act, "dropped", None)
        if self.report_dropped is None:
            self.drops_inline = None
        self.inline_devs: dict[int, bool] = {}  # device -> the act lets the scan drop clean pages there
        self.dropped_files = self.dropped_pages = 0  # dropped inline, not yet reported to the act
        self.last: tuple[str, str, int | None] = (root, "", None)  # the last file dropped inline
        self.top = TopFiles(options.top_files, options.top_keys, options.top_budget) if options.top_files > 0 \
            else None
        # The C step measures a folder's plain files in batches; in an evict it also drops clean pages itself where
        # the act lets the scan do so (a file it cannot empty so goes to the act, as below). Following symlinks, an
        # evict's files go one by one: an alias must reach the act once.
        self.hand_over = self._hand_over if act is not None else None  # bound once: resident_counts' `act`
        self.measure = measuring.native_measure() \
            if act is None or (self.drops_inline is not None and not self.any_alias) else None

    def run(self, budget: Budget, seen_dirs: set[tuple[int, int]] | None) -> None:
        """Walk the tree and count each file into its folder's totals. Mirrors the C step's loop: a folder's totals
        are kept in locals and added to its FolderTotals when the walk moves on (attribute updates per file cost
        more than the syscalls they count)."""
        ps = kernel.PAGE_SIZE
        shift = ps.bit_length() - 1
        report, seen_inodes, any_alias, top, warm_need = (self.report, self.seen_inodes, self.any_alias, self.top,
                                                          self.warm_need)
        evicting = self.act is not None
        a: FolderTotals | None = None
        files = size_sum = pages_sum = res_sum = dirty_sum = wb_sum = rev_sum = 0
        for d, dfd, item, follow in walk(self.root, self.options, report, self.acc, budget, seen_dirs=seen_dirs,
                                         batch=measuring.BATCH if self.measure is not None else 0):
            if d.acc is not a:
                if a is not None:  # data pages and resident data pages: the same as pages for a plain file
                    a.add(files, size_sum, pages_sum, res_sum, dirty_sum, wb_sum, rev_sum, pages_sum, res_sum)
                a = d.acc
                files = size_sum = pages_sum = res_sum = dirty_sum = wb_sum = rev_sum = 0
            names, pres = self._measured(d, dfd, item)
            for name, pre in zip(names, pres, strict=True):
                if evicting and pre.__class__ is tuple:
                    pre = self._dropped_by_c(d, dfd, name, pre)
                if pre.__class__ is not tuple:
                    self._python_step(a, d, dfd, name, follow)
                    continue
                dev, ino, nlink, size, res, dirty, wb, rev = pre
                if (nlink > 1 or any_alias) and counted_before_ids(dev, ino, nlink, seen_inodes, report):
                    continue
                pages = (size + ps - 1) >> shift
                files += 1
                size_sum += size
                pages_sum += pages
                if pages == 0:
                    if top is not None:
                        top.offer(a, d.path, name, dfd, ino, size, 0, 0, 0, 0)
                    continue
                self.by_cachestat = True
                if res > pages:
                    res = pages
                res_sum += res
                dirty_sum += dirty
                wb_sum += wb
                rev_sum += rev
                if warm_need is not None:
                    warm_need.pages += pages - res
                if top is not None:
                    top.offer(a, d.path, name, dfd, ino, size, pages, pages, res, res, dirty, wb, rev)
        if a is not None:
            a.add(files, size_sum, pages_sum, res_sum, dirty_sum, wb_sum, rev_sum, pages_sum, res_sum)

    def _measured(self, d: WalkedFolder, dfd: int | None, item: Any) -> tuple[Any, Any]:
        """The names of one item of the walk, and the C step's answer for each (None: the Python step measures it;
        an int, an errno: the same)."""
        if item.__class__ is str:
            return (item,), (None,)
        if d.mincore or self.measure is None:
            return item, [None] * len(item)
        if self.act is None:
            return item, self.measure(dfd, item, O_FILE, kernel.NR_CACHESTAT)
        inline = self.inline_devs.get(d.dev)
        if inline is None:  # asked of the folder: its filesystem is its files' (the C step checks the device)
            try:
                inline = self.inline_devs[d.dev] = bool(self.drops_inline(dfd, os.fstat(dfd)))  # type: ignore[arg-type]
            except OSError:
                inline = False  # not asked again here: each file's own step asks, as it always did
        return item, self.measure(dfd, item, O_FILE, kernel.NR_CACHESTAT, d.dev if inline else -1)

    def _dropped_by_c(self, d: WalkedFolder, dfd: int | None, name: str, pre: tuple[int, ...]) -> Any:
        """An evict's C answer: what the C step dropped is reported to the act; the counts after, or 0 where the
        Python step must hand the file to the act (pages stayed, dirty, a hard link)."""
        before = pre[8]  # the pages the C step dropped the file's from; -1: it did not drop them
        if before >= 0:
            if pre[4]:  # pages stayed: what went is said, the act flushes and drops again (the Python step)
                self.report_dropped(0, before - pre[4], d.path, name, dfd)
                return 0
            self._count_dropped(d, dfd, name, before)
        elif pre[4]:
            return 0  # dirty, a hard link, not to be dropped here: the Python step hands it to the act
        return pre[:8]

    def _count_dropped(self, d: WalkedFolder, dfd: int | None, name: str, pages: int) -> None:
        """A file emptied of its `pages` clean pages here: reported to the act in batches of _DROPPED_EVERY."""
        self.dropped_files += 1
        self.dropped_pages += pages
        self.last = (d.path, name, dfd)
        if self.dropped_files >= _DROPPED_EVERY:
            self.report_dropped(self.dropped_files, self.dropped_pages, *self.last)
            self.dropped_files = self.dropped_pages = 0

    def _python_step(self, a: FolderTotals, d: WalkedFolder, dfd: int | None, name: str, follow: bool) -> None:
        """One file opened and measured by Python (cachestat, or mincore), as the C step does it."""
        try:
            fd = os.open(name, O_FILE_FOLLOW if follow else O_FILE, dir_fd=dfd)
        except OSError as e:
            if dfd is None:
                raise  # the root is this file, and it cannot be read
            self._unopened(a, d, dfd, name, follow, e)
            return
        pages = data = 0
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):  # replaced by something else since it was listed
                self.report.skip("special")
                return
            if self._seen_before(st):
                return
            pages, data, runs = page_counts(fd, st)
            a.add(1, st.st_size, pages, 0, 0, 0, 0, data, 0)
            res, dirty, wb, rev, dres, unknown, dunknown = resident_counts(
                fd, st, d, name, dfd, pages, data, runs, self.used, self.cstat, self.hand_over)
            a.add(0, 0, 0, res, dirty, wb, rev, 0, dres)
            a.unknown += unknown
            a.dunknown += dunknown
            if unknown:
                self.report.unknown = True
            if self.warm_need is not None:
                self.warm_need.pages += data - dres
            if self.top is not None:
                self.top.offer(a, d.path, name, dfd, st.st_ino, st.st_size, pages, data, res, dres, dirty, wb, rev,
                               unknown, dunknown)
        except OSError as e:
            # The file vanished or failed after it was counted: its pages are unknown, not absent.
            skip_error(self.report, e, join_path(d.path, name, dfd))
            a.unknown += pages
            a.dunknown += data
        finally:
            os.close(fd)

    def _seen_before(self, st: os.stat_result) -> bool:
        """A file counted already under another name (a hard link; any file, following symlinks): skipped."""
        return (st.st_nlink > 1 or self.any_alias) and counted_before(st, self.seen_inodes, self.report)

    def _unopened(self, a: FolderTotals, d: WalkedFolder, dfd: int, name: str, follow: bool, e: OSError) -> None:
        """A file that could not be opened. Where permission is missing its size is public: its pages are unknown,
        not absent (and so is where its data lies: all its pages count as data)."""
        report, path = self.report, join_path(d.path, name, dfd)
        if e.errno not in (errno.EACCES, errno.EPERM):
            skip_error(report, e, path)
            return
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=follow)
        except OSError:
            skip_error(report, e, path)
            return
        if self._seen_before(st):
            return
        pages = (st.st_size + kernel.PAGE_SIZE - 1) // kernel.PAGE_SIZE
        a.add(1, st.st_size, pages, 0, 0, 0, 0, pages, 0)
        a.unknown += pages
        a.dunknown += pages
        report.unknown = True
        report.skip("unreadable", path, "permission denied (pages unknown)")
        if self.top is not None:
            self.top.offer(a, d.path, name, dfd, st.st_ino, st.st_size, pages, pages, 0, 0, unknown=pages,
                           dunknown=pages)

    def _hand_over(self, d: WalkedFolder, name: str, dfd: int | None, fd: int, st: os.stat_result,
                   resident: int | None, cs: Any) -> None:
        """An evict's file with pages (or hidden ones: `resident` None), handed to the act. Counted by cachestat
        (`cs`), its clean pages are dropped here instead where the act lets the scan do so, and handed over only
        where dirty pages, or pages that stayed, are left; `cs` then holds the counts after."""
        assert self.act is not None
        if cs is None:
            self.act(fd, st, d.path, name, dfd, resident, 0, None)
            return
        res = cs.nr_cache
        busy = cs.nr_dirty + cs.nr_writeback
        if self.drops_inline is not None and not busy:
            inline = self.inline_devs.get(st.st_dev)
            if inline is None:
                inline = self.inline_devs[st.st_dev] = bool(self.drops_inline(fd, st))
            if inline:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                self.cstat(fd)
                if cs.nr_cache == 0:
                    self._count_dropped(d, dfd, name, res)
                    return
                # pages stayed: the act flushes, drops again and says why
        self.act(fd, st, d.path, name, dfd, res, busy, self.cstat)

    def result(self, took_s: float) -> DatasetResidency:
        """The dataset's part: the folders' totals frozen, with how they were counted and what was skipped."""
        if self.dropped_files:
            self.report_dropped(self.dropped_files, self.dropped_pages, *self.last)
        used, report, top = self.used, self.report, self.top
        if self.by_cachestat:
            used.add("cachestat")
        node = self.acc.freeze(top.rows() if top is not None else None)
        fs = kernel.fs_name_at(self.root)
        return DatasetResidency(
            **{f: getattr(node, f) for f in NODE_FIELDS},
            page_size=kernel.PAGE_SIZE,
            scanned_at=time.time(),
            scan_duration_s=took_s,
            complete=report.complete,
            method=measuring.method_name(used),
            fs_type=fs,
            dirs=report.dirs,
            skipped=dict(sorted(report.skipped.items())),
            problems=tuple(report.problems),
            unknown_reason=NO_PERMISSION if report.unknown else None,
            files_top=top.n if top is not None else 0,
            files_sorted_by=top.keys if top is not None else (),
        )


NODE_FIELDS = tuple(ResidencyNode.__dataclass_fields__)


def scan_paths(
    paths: tuple[str, ...] | list[str],
    options: WalkOptions = DEFAULT_WALK,
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
    scans = [scan_one(p, options, cancel=cancel, deadline_s=deadline_s, cpu_fraction=cpu_fraction,
                       warm_need=warm_need is not None, act=act) for p in paths]
    part = compose(paths, scans, options)
    if warm_need is not None:
        warm_need.pages += sum(s.need.pages for ds, s in zip(part.paths, scans, strict=True)
                               if isinstance(ds, DatasetResidency) and ds.counted_in is None)
    return part


@dataclass
class Scan:
    """One dataset's scan, with what `compose` needs to tell which dataset holds which."""

    result: DatasetUnavailable | DatasetResidency
    reached: set[tuple[int, int]]  # (dev, inode) of every folder its walk entered
    need: WarmNeed


def scan_one(p: str, options: WalkOptions, *, cancel: threading.Event | None = None, deadline_s: float | None = None,
             cpu_fraction: float | None = None, warm_need: bool = False, act: FileAct | None = None) -> Scan:
    """`scan_residency` of one path, with the folders it reached; a root that cannot be read is unavailable."""
    seen: set[tuple[int, int]] = set()
    need = WarmNeed()
    try:
        result: DatasetUnavailable | DatasetResidency = scan_residency(
            p, options, cancel=cancel, deadline_s=deadline_s, cpu_fraction=cpu_fraction,
            warm_need=need if warm_need else None, seen_dirs=seen, act=act)
    except OSError as e:
        path = os.fsdecode(p)
        result = DatasetUnavailable(path, path_error(e.strerror or str(e), path), scanned_at=time.time())
    return Scan(result, seen, need)


def compose(paths: tuple[str, ...] | list[str], scans: list[Scan], options: WalkOptions) -> DatasetsPart:
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
    ignore, include = compile_names(options.ignore), compile_names(options.include)
    ids = [_identity(p, ds, ignore, include) for p, ds in zip(paths, scanned, strict=True)]
    keys = [key for key, _parent in ids]
    found: dict[int, tuple[int, bool]] = {}
    for j, (key, parent) in enumerate(ids):
        if key is not None and (holder := _holder(j, key, parent, keys, reached)) is not None:
            found[j] = holder
    return found


def _holder(j: int, key: tuple[int, int], parent: tuple[int, int] | None, keys: list[tuple[int, int] | None],
            reached: list[set[tuple[int, int]]]) -> tuple[int, bool] | None:
    """The first dataset whose walk reached dataset j (`key`, or its folder `parent` for a file root), and whether
    it is j given again; None: no other one counts it."""
    for i, other in enumerate(keys):
        if i == j or other is None:
            continue
        same = other == key
        if not (same or key in reached[i] or parent in reached[i]):
            continue
        if i > j and (same or other in reached[j]):
            continue  # they reach each other: the first given counts
        return i, same
    return None


def _identity(p: str, ds: DatasetUnavailable | DatasetResidency, ignore: re.Pattern[str] | None,
              include: re.Pattern[str] | None) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    """A scanned dataset's (device, inode), and for a file root the folder it is listed in if a walk may count it
    (its name not ignored); (None, None) where it was not scanned or is gone."""
    if not isinstance(ds, DatasetResidency):
        return None, None
    key = parent = None
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
    return key, parent
