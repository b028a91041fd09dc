"""The tree walk every residency pass shares (the scan, the watch's first pass, warm, evict, lock): vmtouch's
rules (symlinks not followed, one filesystem, hard links once, special files never opened), a folder's running
totals (`FolderTotals`), and what was skipped and why (`WalkReport`)."""

from __future__ import annotations

import errno
import fnmatch
import os
import re
import stat
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from dltop.model.base import display_path
from dltop.model.datasets import ResidencyNode
from dltop.residency.budget import MAX_PROBLEMS, Budget
from dltop.residency.measure import needs_mincore

# How often (in files) a huge flat folder checks the cancel flag, the deadline and the CPU budget.
_CHECK_EVERY_FILES = 2048
O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC

list_folder = os.scandir  # tests replace this to make files vanish between listing and opening


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


def compile_names(patterns: tuple[str, ...]) -> re.Pattern[str] | None:
    """One regular expression for glob `patterns` on names (None: no patterns)."""
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
    return counted_before_ids(st.st_dev, st.st_ino, st.st_nlink, seen, report)


def counted_before_ids(dev: int, ino: int, nlink: int, seen: set[tuple[int, int]], report: WalkReport) -> bool:
    """`counted_before` from a file's device, inode and links (the C step's answer: no stat_result)."""
    key = (dev, ino)
    if key in seen:
        report.skip("hardlink" if nlink > 1 else "duplicate_file")
        return True
    seen.add(key)
    return False


class FolderTotals:
    """A folder's running totals while scanning (files directly in it and in folders folded into it)."""

    __slots__ = ("path", "files", "size", "pages", "res", "dirty", "unknown", "wb", "rev", "data", "dres", "dunknown",
                 "children")

    def __init__(self, path: str) -> None:
        self.path = path
        self.files = self.size = self.pages = self.res = self.dirty = self.unknown = self.wb = self.rev = 0
        self.data = self.dres = self.dunknown = 0
        self.children: list[FolderTotals] = []

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

    def freeze(self, files: dict[FolderTotals, tuple[ResidencyNode, ...]] | None = None) -> ResidencyNode:
        """This folder as a node: its totals plus its subfolders', its file rows taken from `files`."""
        kids = tuple(c.freeze(files) for c in self.children)
        totals = {"files": self.files, "size_bytes": self.size, "pages": self.pages, "resident_pages": self.res,
                  "dirty_pages": self.dirty, "unknown_pages": self.unknown, "writeback_pages": self.wb,
                  "recently_evicted_pages": self.rev, "data_pages": self.data, "data_resident_pages": self.dres,
                  "data_unknown_pages": self.dunknown}
        for k in kids:
            for name in totals:
                totals[name] += getattr(k, name)
        return ResidencyNode(path=self.path, **totals, children=tuple(sorted(kids, key=lambda k: k.path)),
                             top_files=files.get(self, ()) if files else ())


@dataclass
class WalkedFolder:
    """A folder the walk is in: where its files' totals go, how they are counted, and the way it came."""

    path: str
    depth: int
    dev: int
    acc: FolderTotals
    mincore: bool = False  # count this folder's files with mincore (overlayfs, or no cachestat)
    ino: int = 0
    parent: WalkedFolder | None = None

    def has_ancestor(self, dev: int, ino: int) -> bool:
        """This folder, or one above it on the path the walk took, is (dev, ino): entering it again loops."""
        d: WalkedFolder | None = self
        while d is not None:
            if d.ino == ino and d.dev == dev:
                return True
            d = d.parent
        return False


def walk(
    root: str,
    options: WalkOptions,
    report: WalkReport,
    root_acc: FolderTotals,
    budget: Budget | None = None,
    by_inode: bool = False,
    shard: tuple[int, int, int] | None = None,
    seen_dirs: set[tuple[int, int]] | None = None,
    batch: int = 0,
) -> Iterator[tuple[WalkedFolder, int | None, Any, bool]]:
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
    st = os.stat(root)  # a root given as a symlink is followed, as vmtouch and du do
    if stat.S_ISDIR(st.st_mode):
        yield from _Walk(root, st, options, report, root_acc, budget, by_inode or shard is not None, shard,
                         seen_dirs, batch).items()
    elif not stat.S_ISREG(st.st_mode):
        report.skip("special", root, "not a regular file or folder")
    elif shard is None or _in_shard(st.st_ino, shard):
        yield WalkedFolder(os.path.dirname(root) or ".", 0, st.st_dev, root_acc), None, root, True


def _flush(d: WalkedFolder, dfd: int, names: list[str] | None) -> Iterator[Item]:
    """The batch of names listed so far, as one item (a copy: the list goes on), if there is one."""
    if names:
        yield d, dfd, names[:], False
        names.clear()


def _in_shard(ino: int, shard: tuple[int, int, int]) -> bool:
    k, n_shards, run_bits = shard
    return (ino >> run_bits) % n_shards == k


Item = tuple[WalkedFolder, int | None, Any, bool]  # what `walk` yields


class _Walk:
    """One `walk` of a folder tree, in named steps: the folders in turn (`items`), each one's listing (`_list`),
    and where each entry that is not a plain file goes (`_resolve`, `_place`)."""

    def __init__(self, root: str, st: os.stat_result, options: WalkOptions, report: WalkReport,
                 root_acc: FolderTotals, budget: Budget | None, by_inode: bool, shard: tuple[int, int, int] | None,
                 seen_dirs: set[tuple[int, int]] | None, batch: int) -> None:
        self.options, self.report, self.budget, self.seen_dirs = options, report, budget, seen_dirs
        self.by_inode, self.shard = by_inode, shard
        self.batch = 0 if by_inode else batch
        self.ignore, self.include = compile_names(options.ignore), compile_names(options.include)
        self.counted_at = {(st.st_dev, st.st_ino): root}  # folder -> the path it is counted at
        if seen_dirs is not None:
            seen_dirs.add((st.st_dev, st.st_ino))
        self.root_dev = st.st_dev
        self.mincore_devs: dict[int, bool] = {}
        self.stack = [WalkedFolder(root, 0, st.st_dev, root_acc, ino=st.st_ino)]
        self.linked: deque[tuple[WalkedFolder, str, os.stat_result]] = deque()  # reached through a symlink: last
        self.stopped = False  # the budget ran out part way through a folder

    def items(self) -> Iterator[Item]:
        """Every folder in turn, the real tree first, then the folders reached through a symlink."""
        report, budget = self.report, self.budget
        while self.stack or self.linked:
            if budget is not None and budget.stop():
                report.complete = False
                return
            d = self.stack.pop() if self.stack else self.enter(*self.linked.popleft())
            if d is None:
                continue  # reached through a symlink, counted already at another path
            dfd = self._open(d)
            if dfd is None:
                continue
            try:
                yield from self._folder(d, dfd)
            finally:
                os.close(dfd)
            if self.stopped:
                report.complete = False
                return

    def _open(self, d: WalkedFolder) -> int | None:
        """Folder `d` opened (not through a symlink, unless following them); None where it cannot be (skipped)."""
        try:
            return os.open(d.path, O_DIR if (self.options.follow_symlinks or d.depth == 0) else O_DIR | os.O_NOFOLLOW)
        except OSError as e:
            if d.depth == 0:
                raise  # the root itself cannot be read: that is the caller's error, not a skipped folder
            skip_error(self.report, e, d.path)
            return None

    def enter(self, parent: WalkedFolder, path: str, est: os.stat_result) -> WalkedFolder | None:
        """The folder at `path` to walk, or None when it was counted already at another path."""
        key = (est.st_dev, est.st_ino)
        first = self.counted_at.setdefault(key, path)
        if first != path:
            self.report.skip("duplicate_folder", path, f"duplicate of {display_path(first)}, counted there")
            return None
        if self.seen_dirs is not None:
            self.seen_dirs.add(key)
        depth = parent.depth + 1
        max_depth = self.options.max_depth
        if max_depth is None or depth <= max_depth:
            acc = FolderTotals(path)
            parent.acc.children.append(acc)
        else:
            acc = parent.acc
        return WalkedFolder(path, depth, est.st_dev, acc, ino=est.st_ino, parent=parent)

    def _folder(self, d: WalkedFolder, dfd: int) -> Iterator[Item]:
        """Folder `d` (open as `dfd`): its files, in inode order when asked (`by_inode`, `shard`); its subfolders
        go on the stack."""
        if d.dev not in self.mincore_devs:
            self.mincore_devs[d.dev] = needs_mincore(dfd)
        d.mincore = self.mincore_devs[d.dev]
        self.report.dirs += 1
        subdirs: list[WalkedFolder] = []
        held: list[tuple[int, str, bool]] | None = [] if self.by_inode else None
        try:
            entries = list_folder(dfd)
        except OSError as e:
            if d.depth == 0:
                raise
            skip_error(self.report, e, d.path)
            return
        with entries:
            yield from self._list(d, dfd, entries, subdirs, held)
        if self.stopped:
            return  # out of budget: what was held is not walked
        if held:
            yield from self._in_inode_order(d, dfd, held)
        if self.by_inode:
            subdirs.sort(key=lambda s: s.ino)
        self.stack.extend(reversed(subdirs))

    def _in_inode_order(self, d: WalkedFolder, dfd: int, held: list[tuple[int, str, bool]]) -> Iterator[Item]:
        """The files held for inode order (those of this walk's shard), in that order."""
        held.sort()
        shard = self.shard
        for ino, name, follow_it in held:
            if shard is None or _in_shard(ino, shard):
                yield d, dfd, name, follow_it

    def _list(self, d: WalkedFolder, dfd: int, entries: Iterator[os.DirEntry[str]], subdirs: list[WalkedFolder],
              held: list[tuple[int, str, bool]] | None) -> Iterator[Item]:
        """Folder `d`'s listing: plain files yielded (in batches of `batch` names, or held for inode order),
        everything else resolved and placed, each after the names listed ahead of it. The walk's per-entry loop."""
        report, ignore, budget, batch = self.report, self.ignore, self.budget, self.batch
        names: list[str] | None = [] if batch and held is None else None
        n = 0
        try:
            for entry in entries:
                name = entry.name
                if ignore is not None and ignore.match(name):
                    report.skip("ignored")
                    continue
                try:
                    if entry.is_file(follow_symlinks=False):
                        if self._plain_file(entry, name, names, held):
                            yield d, dfd, name, False
                        elif names is not None and len(names) >= batch:
                            yield from _flush(d, dfd, names)
                        n += 1
                        if n % _CHECK_EVERY_FILES == 0 and budget is not None and budget.stop():
                            self.stopped = True
                            break
                        continue
                    yield from _flush(d, dfd, names)  # what was listed before this entry is measured before it
                    resolved = self._resolve(d, dfd, entry, name)
                except OSError as e:
                    yield from _flush(d, dfd, names)
                    skip_error(report, e, f"{d.path}/{name}")
                    continue
                if resolved is not None and (item := self._place(d, dfd, name, *resolved, subdirs, held)):
                    yield item
        except OSError as e:
            # The listing itself failed part way: /proc/PID/fdinfo refuses even root (EACCES), a /proc/PID that
            # ends mid-listing gives ENOENT. What was listed is walked; the folder is counted as skipped. Only the
            # root failing is the caller's error.
            yield from _flush(d, dfd, names)
            if d.depth == 0:
                raise
            skip_error(report, e, d.path)
        yield from _flush(d, dfd, names)

    def _plain_file(self, entry: os.DirEntry[str], name: str, names: list[str] | None,
                    held: list[tuple[int, str, bool]] | None) -> bool:
        """A plain file listed: skipped (not included), added to the batch or held for inode order; True where it
        goes out alone now."""
        if self.include is not None and not self.include.match(name):
            self.report.skip("ignored")
        elif names is not None:
            names.append(name)
        elif held is not None:
            held.append((entry.inode(), name, False))
        else:
            return True
        return False

    def _resolve(self, d: WalkedFolder, dfd: int, entry: os.DirEntry[str],
                 name: str) -> tuple[os.stat_result, bool] | None:
        """An entry that is not a plain file: its stat (a symlink's target's, when following them) and whether it
        is a symlink; None where it is skipped (a symlink not followed or broken, a FIFO, socket or device)."""
        is_link = entry.is_symlink()
        if is_link and not self.options.follow_symlinks:
            self.report.skip("symlink")
            return None
        if is_link:
            try:
                return os.stat(name, dir_fd=dfd), True
            except OSError as e:
                what = "symlink loop" if e.errno == errno.ELOOP else "broken symlink"
                self.report.skip(what.replace(" ", "_"), f"{d.path}/{name}", what)
                return None
        if entry.is_dir(follow_symlinks=False):
            return entry.stat(follow_symlinks=False), False
        self.report.skip("special")  # FIFO, socket, device: never opened
        return None

    def _place(self, d: WalkedFolder, dfd: int, name: str, est: os.stat_result, is_link: bool,
               subdirs: list[WalkedFolder], held: list[tuple[int, str, bool]] | None) -> Item | None:
        """A resolved entry: a folder to walk (now, or after the real tree when reached through a symlink), or a
        symlinked file (the item to yield, or held for inode order); else skipped."""
        report = self.report
        if stat.S_ISDIR(est.st_mode):
            self._place_folder(d, f"{d.path}/{name}" if d.path != "/" else f"/{name}", est, is_link, subdirs)
        elif not stat.S_ISREG(est.st_mode):
            report.skip("special")
        elif self.include is not None and not self.include.match(name):
            report.skip("ignored")
        elif held is not None:
            held.append((est.st_ino, name, True))
        else:
            return d, dfd, name, True
        return None

    def _place_folder(self, d: WalkedFolder, path: str, est: os.stat_result, is_link: bool,
                      subdirs: list[WalkedFolder]) -> None:
        """A folder of `d`: walked next, or after the real tree when reached through a symlink; else skipped."""
        if d.has_ancestor(est.st_dev, est.st_ino):
            self.report.skip("symlink_loop", path, "symlink loop (a folder inside itself)")
        elif est.st_dev != self.root_dev and not self.options.cross_filesystems:
            self.report.skip("other_filesystem")
        elif is_link:
            self.linked.append((d, path, est))
        elif (sub := self.enter(d, path, est)) is not None:
            subdirs.append(sub)


def skip_error(report: WalkReport, e: OSError, path: str, gone: str = "vanished during the scan") -> None:
    """Count a path the walk could not read, with the reason in words (`gone`: a path that no longer exists)."""
    if e.errno == errno.ENOENT:
        report.skip("vanished", path, gone)
    elif e.errno in (errno.EACCES, errno.EPERM):
        report.skip("unreadable", path, "permission denied")
    elif e.errno == errno.ELOOP:
        report.skip("symlink", path)
    else:
        report.skip("error", path, e.strerror or str(e))


def join_path(dir_path: str, name: str, dfd: int | None) -> str:
    """The path of `name` in folder `dir_path` (`dfd` None: `name` is a root given as a file, its own path)."""
    return name if dfd is None else (f"{dir_path}/{name}" if dir_path != "/" else f"/{name}")
