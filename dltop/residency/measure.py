"""Measuring one open file's residency: cachestat(2) (mincore where cachestat is missing or wrong, as through
overlayfs), where its data lies (SEEK_DATA / SEEK_HOLE), and the C step that does a folder's plain files in one
call (dltop/native/_measure.c, whose Python twin is the per-file code of scan.py and watch.py)."""

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


def method_name(used: set[str]) -> str:
    """How a dataset was counted, from the ways its files were: "cachestat", "mincore", or "mixed"."""
    return "mixed" if len(used) > 1 else next(iter(used), "cachestat")
