"""Measuring one open file's residency: cachestat(2) (mincore where cachestat is missing or wrong, as through
overlayfs), where its data lies (SEEK_DATA / SEEK_HOLE), and the C step that does a folder's plain files in one
call (dltop/native/_measure.c, whose Python twin is `resident_counts` and the per-file steps of scan.py and
folders.py that open a file for it)."""

from __future__ import annotations

import errno
import os
from typing import Any

from dltop import kernel

O_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
O_FILE_FOLLOW = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
BATCH = 256  # plain files a folder's C step measures in one call (dltop.native._measure)


def native_measure() -> Any:
    """The C per-file step `measure(dir_fd, names, flags, nr_cachestat)` (dltop/native/_measure.c), or None where
    its Python twin runs (not built, stale, or DLTOP_NATIVE=0: dltop.native.status() says which)."""
    from dltop import native

    mod = native.load("_measure")
    return None if mod is None else mod.measure


def needs_mincore(fd: int) -> bool:
    """cachestat cannot be trusted on this filesystem (or this kernel): count pages with mincore."""
    if not kernel.have_cachestat():
        return True
    try:
        return kernel.fstatfs_type(fd) == kernel.OVERLAYFS_SUPER_MAGIC
    except OSError:
        return False



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


def resident_in_runs(runs: list[tuple[int, int]], resident: int, pages: int, fd: int,
                     vec: bytes | None = None) -> int:
    """Resident pages among a sparse file's runs of data: counted in `vec` (mincore's), else by cachestat per run."""
    if resident <= 0:
        return 0
    if resident >= pages:
        return sum(last - first for first, last in runs)
    if vec is not None:
        return sum(vec.count(1, first, last) for first, last in runs)
    ps = kernel.PAGE_SIZE
    return sum(kernel.cachestat(fd, first * ps, (last - first) * ps).cache for first, last in runs)


def page_counts(fd: int, st: os.stat_result) -> tuple[int, int, list[tuple[int, int]] | None]:
    """(pages, data pages, the runs of data pages) of an open file; runs None where it has no holes (only a file
    with fewer allocated blocks than bytes can have any: only those are asked where their data lies)."""
    ps = kernel.PAGE_SIZE
    pages = (st.st_size + ps - 1) // ps
    runs = data_page_runs(fd, st.st_size, ps) if st.st_blocks << 9 < st.st_size else None
    return pages, pages if runs is None else sum(last - first for first, last in runs), runs


def resident_counts(fd: int, st: os.stat_result, folder: Any, name: str, dfd: int | None, pages: int, data: int,
                    runs: list[tuple[int, int]] | None, used: set[str], cstat: Any,
                    act: Any = None) -> tuple[int, int, int, int, int, int, int]:
    """(resident, dirty, writeback, recently evicted, resident data, unknown, unknown data) pages of an open
    regular file: by cachestat, else (`folder.mincore`, set here where cachestat is missing) by mincore; unknown
    where the kernel hides them from this user. `used` gathers the ways counted. With `act` (a scan's evict), the
    file is handed to `act(folder, name, dfd, fd, st, resident, cs)` first where it has pages or they are hidden
    (`resident` None; `cs` the cachestat struct, else None), and counted as the act leaves it."""
    if pages == 0:
        return 0, 0, 0, 0, 0, 0, 0
    if not folder.mincore:
        try:
            cs = cstat(fd)
        except OSError as e:
            if e.errno == errno.EPERM:
                return _hidden(fd, st, folder, name, dfd, pages, data, act)
            if e.errno != errno.ENOSYS:
                raise
            folder.mincore = True
        else:
            used.add("cachestat")
            if act is not None and cs.nr_cache:
                act(folder, name, dfd, fd, st, cs.nr_cache, cs)  # `cs` then holds the counts after
            res = min(cs.nr_cache, pages)
            dres = res if runs is None else resident_in_runs(runs, res, pages, fd)
            return res, cs.nr_dirty, cs.nr_writeback, cs.nr_recently_evicted, dres, 0, 0
    if not kernel.residency_visible(st, name, dfd):
        return _hidden(fd, st, folder, name, dfd, pages, data, act)
    used.add("mincore")
    vec = kernel.mincore_vector(fd, st.st_size)
    if act is not None and 1 in vec:
        act(folder, name, dfd, fd, st, vec.count(1), None)
        vec = kernel.mincore_vector(fd, st.st_size)
    res = min(vec.count(1), pages)
    return res, 0, 0, 0, res if runs is None else resident_in_runs(runs, res, pages, fd, vec), 0, 0


def _hidden(fd: int, st: os.stat_result, folder: Any, name: str, dfd: int | None, pages: int, data: int,
            act: Any) -> tuple[int, int, int, int, int, int, int]:
    """A file whose residency the kernel hides from this user: its pages unknown (an evict's act asked all the
    same)."""
    if act is not None:
        act(folder, name, dfd, fd, st, None, None)
    return 0, 0, 0, 0, 0, pages, data


def method_name(used: set[str]) -> str:
    """How a dataset was counted, from the ways its files were: "cachestat", "mincore", or "mixed"."""
    return "mixed" if len(used) > 1 else next(iter(used), "cachestat")
