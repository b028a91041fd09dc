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
from dltop.residency.measure import O_FILE, O_FILE_FOLLOW, data_page_runs, resident_in_runs
from dltop.residency.rank import TopFiles
from dltop.residency.walk import (
    DEFAULT_WALK,
    FolderTotals,
    WalkOptions,
    WalkReport,
    compile_names,
    counted_before,
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
    ps = kernel.PAGE_SIZE
    shift = ps.bit_length() - 1
    report = WalkReport()
    acc = FolderTotals(root)
    budget = Budget(cancel, None if deadline_s is None else t0 + deadline_s, cpu_fraction)
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
    # The folder being counted and its running totals, kept in locals and added to its FolderTotals when the walk
    # moves on: attribute updates per file cost more than the syscalls they count.
    a: FolderTotals | None = None
    files = size_sum = pages_sum = res_sum = dirty_sum = wb_sum = rev_sum = data_sum = dres_sum = 0
    # The C step measures a folder's plain files in batches; in an evict it also drops clean pages itself where
    # the act lets the scan do so (a file it cannot empty so goes to the act, as below). Following symlinks, an
    # evict's files go one by one: an alias must reach the act once.
    measure = measuring.native_measure() if act is None or (drops_inline is not None and not any_alias) else None
    nr_cachestat = kernel.NR_CACHESTAT
    alone: Any = (None,)
    for d, dfd, item, follow in walk(root, options, report, acc, budget, seen_dirs=seen_dirs,
                                     batch=measuring.BATCH if measure is not None else 0):
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
            names, pres = item, measure(dfd, item, O_FILE, nr_cachestat)
        else:
            inline = inline_devs.get(d.dev)
            if inline is None:  # asked of the folder: its filesystem is its files' (the C step checks the device)
                try:
                    inline = inline_devs[d.dev] = bool(drops_inline(dfd, os_fstat(dfd)))  # type: ignore[arg-type]
                except OSError:
                    inline = False  # not asked again here: each file's own step asks, as it always did
            names, pres = item, measure(dfd, item, O_FILE, nr_cachestat, d.dev if inline else -1)
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
                fd = os_open(name, O_FILE_FOLLOW if follow else O_FILE, dir_fd=dfd)
            except OSError as e:
                if dfd is None:
                    raise  # the root is this file, and it cannot be read
                if e.errno in (errno.EACCES, errno.EPERM):
                    # Cannot open it, but its size is public: its pages are unknown, not absent (and so is where its
                    # data lies: all its pages count as data).
                    try:
                        st = os.stat(name, dir_fd=dfd, follow_symlinks=follow)
                    except OSError:
                        skip_error(report, e, join_path(d.path, name, dfd))
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
                    report.skip("unreadable", join_path(d.path, name, dfd), "permission denied (pages unknown)")
                    if top is not None:
                        top.offer(a, d.path, name, dfd, st.st_ino, st.st_size, pages, pages, 0, 0, unknown=pages,
                                  dunknown=pages)
                else:
                    skip_error(report, e, join_path(d.path, name, dfd))
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
                        dres = res if runs is None else resident_in_runs(runs, res, pages, fd)
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
                dres = res if runs is None else resident_in_runs(runs, res, pages, fd, vec)
                res_sum += res
                dres_sum += dres
                if warm_need is not None:
                    warm_need.pages += data - dres
                if top is not None:
                    top.offer(a, d.path, name, dfd, st.st_ino, size, pages, data, res, dres)
            except OSError as e:
                # The file vanished or failed after it was counted: its pages are unknown, not absent.
                skip_error(report, e, join_path(d.path, name, dfd))
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
        **{f: getattr(node, f) for f in NODE_FIELDS},
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
    keys: list[tuple[int, int] | None] = []
    parents: list[tuple[int, int] | None] = []  # a file root: the folder it is listed in, if a walk may count it
    ignore, include = compile_names(options.ignore), compile_names(options.include)
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
