"""The dataset watch's folder table: each folder of the watched tree with its files' last counts, and the
measuring that keeps them (a folder listed and measured again, one file measured again, a batch counted again by
the C step). Hard links are counted once, in the folder that met them first."""

from __future__ import annotations

import errno
import os
import stat
import time
from array import array
from bisect import bisect_left
from collections.abc import Callable
from itertools import accumulate
from typing import Any

from dltop import kernel
from dltop.model.datasets import ResidencyNode
from dltop.residency import measure as measuring
from dltop.residency import walk as walking
from dltop.residency.budget import Budget
from dltop.residency.events import EventDrain
from dltop.residency.measure import O_FILE, page_counts, resident_counts
from dltop.residency.walk import O_DIR, WalkOptions, WalkReport, compile_names, skip_error

# The folder a file is measured again in, opened as a path only: a real open of it is an event of its own (an
# open and a close, 16-byte records among the files' 32-byte ones) on every read.
_O_DIR_PATH = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
DRAIN_EVERY_FILES = 2048  # while measuring, the events are read after this many files: each adds an open and a close

# Per file, in this order: size in bytes, pages, data pages, resident, dirty, writeback, recently evicted,
# resident data pages, unknown pages, unknown data pages, files (1), and its inode (ties of the file rows); the
# first SUMMED are added up into the folders' totals.
VALUES = 12
SUMMED = 11
Row = tuple[int, str, tuple[int, ...]]  # a file measured: (its name's hash, its name, its VALUES)


def values_node(path: str, v: Any, b: int = 0, children: tuple[ResidencyNode, ...] = (),
                top_files: tuple[ResidencyNode, ...] = ()) -> ResidencyNode:
    """The node of the VALUES at `b` in `v`: a file's (its row), or a folder's totals."""
    return ResidencyNode(path=path, files=v[b + 10], size_bytes=v[b], pages=v[b + 1], data_pages=v[b + 2],
                         resident_pages=v[b + 3], dirty_pages=v[b + 4], writeback_pages=v[b + 5],
                         recently_evicted_pages=v[b + 6], data_resident_pages=v[b + 7], unknown_pages=v[b + 8],
                         data_unknown_pages=v[b + 9], children=children, top_files=top_files)


class Folder:
    """One folder of the watched tree: its files' last counts (by name hash, sorted) and its own totals."""

    __slots__ = ("path", "depth", "dev", "ino", "wd", "parent", "subdirs", "keys", "vals", "tot", "skipped",
                 "problems", "links", "mark", "measured_at", "mincore", "used", "gone", "names", "offs", "top")

    def __init__(self, path: str, depth: int, dev: int, ino: int, parent: Folder | None) -> None:
        self.path, self.depth, self.dev, self.ino, self.parent = path, depth, dev, ino, parent
        self.wd: int | None = None
        self.subdirs: dict[str, Folder] = {}
        self.keys = array("q")
        self.vals = array("q")
        self.tot = [0] * SUMMED
        self.names = ""  # the files' names in the order of `keys`, each ended by a NUL (a name never holds one)
        self.offs = array("I", (0,))  # where each name starts in `names`, and its end
        self.top: Any = None  # its file rows as the ranker last chose them (ranker.py); None: choose them again
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

    def walk(self) -> list[Folder]:
        """This folder and every folder below it."""
        out, stack = [], [self]
        while stack:
            f = stack.pop()
            out.append(f)
            stack.extend(f.subdirs.values())
        return out

    def plain(self, i: int) -> bool:
        """File `i` was all data, known and not empty: cachestat alone can count it again."""
        base, vals = i * VALUES, self.vals
        pages = vals[base + 1]
        return pages != 0 and vals[base + 2] == pages and not vals[base + 8]

    def set_files(self, rows: list[Row], vals: array[int], names: str) -> None:
        """Its files' counts from `rows` (sorted by name hash), their VALUES in `vals` and NUL-ended `names`."""
        self.top = None  # its file rows are chosen again at the next freeze
        self.keys = array("q", (r[0] for r in rows))
        self.offs = array("I", accumulate((len(r[1]) + 1 for r in rows), initial=0))
        self.vals, self.names = vals, names


class FolderTable:
    """The watched tree's folders by watch, its hard links by owner, and the measuring of its files. `rerank` is
    told of a file whose counts changed, `saw_silent` of a folder that found pages put out unseen."""

    def __init__(self, options: WalkOptions, events: EventDrain, rerank: Callable[[Folder, int], None],
                 saw_silent: Callable[[Folder], None]) -> None:
        self.options, self.events, self.rerank, self.saw_silent = options, events, rerank, saw_silent
        self.ignore, self.include = compile_names(options.ignore), compile_names(options.include)
        self.by_wd: dict[int, Folder] = {}
        self.links: dict[tuple[int, int], Folder] = {}
        self.root: Folder | None = None
        self.order: list[Folder] = []  # every folder, the root first
        self.next = 0  # the rolling pass's place in `order`
        self.cstat = kernel.cachestat_caller()
        self._dir: tuple[Folder, int] | None = None

    def reorder(self) -> None:
        """`order` again, after folders came or went."""
        assert self.root is not None
        self.order = self.root.walk()
        self.next %= max(1, len(self.order))

    def scan_tree(self, f: Folder, budget: Budget, steal: int, recurse_known: bool,
                   first_done: bool = False, before: set[str] | None = None) -> None:
        """Measure folder `f` and the folders below it: all of them (`recurse_known`), else only new ones
        (`first_done`: `f` itself was just measured, `before` its subfolders' names until then)."""
        stack: list[Folder] = []
        if first_done:
            stack.extend(s for name, s in f.subdirs.items() if name not in (before or set()))
        else:
            stack.append(f)
        while stack:
            d = stack.pop()
            known = set(d.subdirs)
            self.scan_folder(d, steal)
            budget.stop()
            stack.extend(s for name, s in d.subdirs.items() if recurse_known or name not in known)

    def watch(self, f: Folder) -> None:
        if f.wd is not None:
            return
        try:
            f.wd = self.events.add_watch(f.path)
        except OSError:
            f.wd = None  # no watch (max_user_watches reached): the rolling pass alone keeps it
            return
        self.by_wd[f.wd] = f

    def forget(self, f: Folder) -> None:
        """Drop a folder that is gone (and the folders below it): their watches and hard links."""
        for g in f.walk():
            g.gone = True
            if g.wd is not None:
                self.events.rm_watch(g.wd)
                if self.by_wd.get(g.wd) is g:
                    del self.by_wd[g.wd]
                g.wd = None
            for k in g.links:
                if self.links.get(k) is g:
                    del self.links[k]

    def scan_folder(self, f: Folder, steal: int) -> None:
        """List folder `f` again and measure each of its files; its subfolders are kept, added or dropped."""
        self.watch(f)  # before listing: a file opened after it is seen
        for k in f.links:
            if self.links.get(k) is f:
                del self.links[k]
        f.links, f.skipped, f.problems, f.used = [], {}, [], set()
        report = WalkReport()
        rows: list[Row] = []
        subdirs: dict[str, Folder] = {}
        try:
            dfd = os.open(f.path, O_DIR | (os.O_NOFOLLOW if f.depth else 0))
        except OSError as e:
            if f.depth == 0:
                raise
            skip_error(report, e, f.path)
            self.store(f, rows, report, subdirs, steal)
            return
        try:
            f.mincore = measuring.needs_mincore(dfd)
            self._list(f, dfd, report, rows, subdirs)
        finally:
            os.close(dfd)
        self.events.settle()
        for name, old in f.subdirs.items():
            if subdirs.get(name) is not old:
                self.forget(old)
        self.store(f, rows, report, subdirs, steal)

    def _list(self, f: Folder, dfd: int, report: WalkReport, rows: list[Row], subdirs: dict[str, Folder]) -> None:
        """Measure the files of folder `f` (open as `dfd`) as its listing gives them into `rows`, its subfolders
        into `subdirs`. With the C step (dltop.native._measure), plain files are measured in batches, each before
        the next entry that is not one (what a report lists stays in the listing's order)."""
        batch: list[str] | None = [] if measuring.native_measure() is not None else None
        try:
            with walking.list_folder(dfd) as entries:
                for n, entry in enumerate(entries, 1):
                    if n % DRAIN_EVERY_FILES == 0:
                        self.events.settle()  # our own opens must not overflow the queue
                    try:
                        if not self._listed_file(f, dfd, entry, report, rows, batch):
                            self._flush(f, dfd, batch, report, rows)
                            self._listed_other(f, entry, report, subdirs)
                    except OSError as e:
                        self._flush(f, dfd, batch, report, rows)
                        skip_error(report, e, f"{f.path}/{entry.name}")
        except OSError as e:
            self._flush(f, dfd, batch, report, rows)
            if f.depth == 0:
                raise
            skip_error(report, e, f.path)
        self._flush(f, dfd, batch, report, rows)

    def _listed_file(self, f: Folder, dfd: int, entry: os.DirEntry[str], report: WalkReport, rows: list[Row],
                     batch: list[str] | None) -> bool:
        """A listed name that is ignored, or a file: counted (measured, or added to the C step's `batch`); False
        for anything else."""
        name = entry.name
        if self.ignore is not None and self.ignore.match(name):
            report.skip("ignored")
            return True
        if not entry.is_file(follow_symlinks=False):
            return False
        if self.include is not None and not self.include.match(name):
            report.skip("ignored")
            return True
        self.events.own_event(f.wd, name)
        if batch is not None:
            batch.append(name)
            if len(batch) >= measuring.BATCH:
                self._flush(f, dfd, batch, report, rows)
            return True
        vals = self.measure(f, dfd, name, report)
        if vals is not None:
            rows.append((hash(name), name, vals))
        return True

    def _flush(self, f: Folder, dfd: int, batch: list[str] | None, report: WalkReport, rows: list[Row]) -> None:
        """Measure the names in `batch` (by the C step), and empty it."""
        if batch:
            self.measure_batch(f, dfd, batch, report, rows)
            batch.clear()

    def _listed_other(self, f: Folder, entry: os.DirEntry[str], report: WalkReport,
                      subdirs: dict[str, Folder]) -> None:
        """A listed entry that is not a file: a subfolder kept (the same one as before) or new; else skipped."""
        if entry.is_symlink():
            report.skip("symlink")
        elif entry.is_dir(follow_symlinks=False):
            est = entry.stat(follow_symlinks=False)
            if est.st_dev != f.dev and not self.options.cross_filesystems:
                report.skip("other_filesystem")
                return
            name = entry.name
            old = f.subdirs.get(name)
            if old is not None and (old.dev, old.ino) == (est.st_dev, est.st_ino):
                subdirs[name] = old
            else:
                path = f"{f.path}/{name}" if f.path != "/" else f"/{name}"
                subdirs[name] = Folder(path, f.depth + 1, est.st_dev, est.st_ino, f)
        else:
            report.skip("special")

    def store(self, f: Folder, rows: list[Row], report: WalkReport,
             subdirs: dict[str, Folder], steal: int) -> None:
        rows.sort(key=lambda r: r[0])
        vals = array("q")
        for _, _, v in rows:
            vals.extend(v)
        tot = [sum(vals[j::VALUES]) for j in range(SUMMED)]
        names = "\0".join(r[1] for r in rows) + "\0" if rows else ""
        if names == f.names and tot[6] > f.tot[6]:
            self.saw_silent(f)  # the same files, more of their pages recently evicted: reclaim put them out
        if vals != f.vals or names != f.names:
            f.set_files(rows, vals, names)
        f.tot, f.subdirs = tot, subdirs
        f.skipped, f.problems = report.skipped, report.problems
        if report.unknown:
            f.used.add("unknown")
        f.mark, f.measured_at = steal, time.time()

    def measure_one(self, f: Folder, name: str) -> tuple[int, ...] | None:
        """One file measured again in place (None: it is no longer a plain file we count)."""
        dir_fd = self._folder_fd(f)
        if dir_fd is None:
            return None
        self.events.own_event(f.wd, name)
        report = WalkReport()
        vals = self.measure(f, dir_fd, name, report, relink=True)
        return None if report.skipped else vals

    def recount(self, f: Folder, i: int, raw: bytes, key: tuple[int, bytes]) -> bool:
        """File `i` of `f` counted again in place by cachestat alone, its size and data pages kept: nothing wrote
        to it or changed its links since it was measured (else IN_CLOSE_WRITE or IN_ATTRIB). False: measure it
        whole (a sparse file, mincore, an unreadable file, or anything unexpected). `key`: its events' key."""
        if f.mincore or not f.plain(i):
            return False
        dir_fd = self._folder_fd(f)
        if dir_fd is None:
            return False
        try:
            fd = os.open(raw, O_FILE, dir_fd=dir_fd)
        except OSError:
            return False
        self.events.count_own(key)
        try:
            if os.fstat(fd).st_ino != f.vals[i * VALUES + 11]:
                return False  # replaced under the same name
            cs = self.cstat(fd)
        except OSError:
            return False
        finally:
            os.close(fd)
        self.recounted_as(f, i, cs.nr_cache, cs.nr_dirty, cs.nr_writeback, cs.nr_recently_evicted)
        return True

    def recount_batch(self, f: Folder, dirty: list[tuple[int, bytes]], first: tuple[int, bytes],
                       changed: set[tuple[int, bytes]], measure: Any,
                       ) -> tuple[dict[tuple[int, bytes], Any], set[tuple[int, bytes]]]:
        """The files of `f` that `recount` would count again, from `first` on in `dirty` (sorted: a folder's files
        follow one another), measured by the C step (see dltop/native/_measure.c) in calls of measuring.BATCH
        files, up to the first name `f` does not count (the listing decides from there): those its answer counts
        again are counted here (`recounted`, in `dirty`'s order) and given in the set; the other answers in the
        dict, for the watch's `_apply` to take."""
        if f.mincore:
            return {}, set()
        dir_fd = self._folder_fd(f)
        if dir_fd is None:
            return {}, set()
        keys, raws, slots = _recountable(f, dirty, first, changed)
        out: dict[tuple[int, bytes], Any] = {}
        done: set[tuple[int, bytes]] = set()
        count_own, step, recounted = self.events.count_own, measuring.BATCH, self.recounted
        for j in range(0, len(raws), step):
            for key, i, got in zip(keys[j:j + step], slots[j:j + step],
                                   measure(dir_fd, raws[j:j + step], O_FILE, kernel.NR_CACHESTAT),
                                   strict=True):
                if got.__class__ is tuple or got == 0:  # opened: our open and our close
                    count_own(key)
                if recounted(f, i, got):
                    done.add(key)
                else:
                    out[key] = got
            if j + step < len(raws):
                self.events.settle()  # our own opens must not overflow the queue
        return out, done

    def recounted(self, f: Folder, i: int, got: Any) -> bool:
        """`recount` from the C step's answer for file `i` of `f`: False where it must be measured whole."""
        if got.__class__ is not tuple or got[1] != f.vals[i * VALUES + 11]:
            return False  # not a plain case now, or replaced under the same name
        self.recounted_as(f, i, got[4], got[5], got[6], got[7])
        return True

    def recounted_as(self, f: Folder, i: int, cache: int, dirty: int, wb: int, rev: int) -> None:
        base, vals = i * VALUES, f.vals
        res = min(cache, vals[base + 1])
        new = (res, dirty, wb, rev)
        old = (vals[base + 3], vals[base + 4], vals[base + 5], vals[base + 6])
        if rev > old[3]:
            self.saw_silent(f)
        if new != old:
            tot = f.tot
            for j, v, was in zip((3, 4, 5, 6), new, old, strict=True):
                tot[j] += v - was
                vals[base + j] = v
            tot[7] += res - vals[base + 7]
            vals[base + 7] = res
            self.rerank(f, i)

    def _folder_fd(self, f: Folder) -> int | None:
        """An O_PATH fd of folder `f` (it raises no events of its own), kept while files of `f` follow one another;
        None when it cannot be opened."""
        if self._dir is None or self._dir[0] is not f:
            self.close_dir()
            try:
                self._dir = (f, os.open(f.path, _O_DIR_PATH | (os.O_NOFOLLOW if f.depth else 0)))
            except OSError:
                return None
        return self._dir[1]

    def close_dir(self) -> None:
        """Close the folder `measure_one` kept open for the next file of the same folder."""
        if self._dir is not None:
            os.close(self._dir[1])
            self._dir = None

    def measure(self, f: Folder, dfd: int, name: str, report: WalkReport, relink: bool = False) -> tuple[int, ...] | None:
        """File `name` of folder `f` (open as `dfd`) measured, as `scan_residency` counts a file: its VALUES, or None
        when it is not counted (`report` says why: a hard link counted under another name, unless `relink` and it is
        counted here). `f.mincore` and `f.used` say how it was counted."""
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
                if self._linked(st.st_nlink, st.st_dev, st.st_ino, f, report, relink):
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
            if self._linked(st.st_nlink, st.st_dev, st.st_ino, f, report, relink):
                return None
            pages, data, runs = page_counts(fd, st)
            res, dirty, wb, rev, dres, unknown, dunknown = resident_counts(fd, st, f, name, dfd, pages, data, runs, f.used,
                                                                           self.cstat)
            if unknown:
                report.unknown = True
            return (st.st_size, pages, data, res, dirty, wb, rev, dres, unknown, dunknown, 1, ino)
        except OSError as e:
            # It vanished or failed after it was counted: its pages are unknown, not absent.
            skip_error(report, e, path)
            return (0, pages, data, 0, 0, 0, 0, 0, pages, data, 1, ino)
        finally:
            os.close(fd)

    def measure_batch(self, f: Folder, dfd: int, names: list[str], report: WalkReport,
                       rows: list[Row]) -> None:
        """Plain files of `f` measured by the C step in one call, as `measure` counts them; what it leaves (an
        errno or 0, see dltop/native/_measure.c) `measure` measures itself."""
        measure = measuring.native_measure()
        pres = [0] * len(names) if f.mincore or measure is None else measure(dfd, names, O_FILE,
                                                                               kernel.NR_CACHESTAT)
        ps = kernel.PAGE_SIZE
        for name, pre in zip(names, pres, strict=True):
            if pre.__class__ is not tuple:
                vals = self.measure(f, dfd, name, report)
            else:
                _dev, ino, nlink, size, cache, dirty, wb, rev = pre
                if nlink > 1 and self._linked(nlink, _dev, ino, f, report, False):
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

    def _linked(self, nlink: int, dev: int, ino: int, f: Folder, report: WalkReport, relink: bool) -> bool:
        """A hard link counted under another name: skipped here (`report` says so)."""
        if nlink <= 1:
            return False
        key = (dev, ino)
        owner = self.links.get(key)
        if owner is None:
            self.links[key] = f
            f.links.append(key)
            return False
        if owner is f and relink:  # measured again under the name it is counted at
            return False
        report.skip("hardlink")
        return True


def _recountable(f: Folder, dirty: list[tuple[int, bytes]], first: tuple[int, bytes],
                 changed: set[tuple[int, bytes]]) -> tuple[list[tuple[int, bytes]], list[bytes], list[int]]:
    """(keys, raw names, slots) of the files of `f` that `recount` would count again, from `first` on in `dirty`
    up to the first name `f` does not count."""
    wd = first[0]
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
        if key in changed or not f.plain(i):
            continue  # `measure_one` measures it whole (as `recount` would refuse it)
        keys.append(key)
        raws.append(raw)
        slots.append(i)
    return keys, raws, slots
