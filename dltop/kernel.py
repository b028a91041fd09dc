"""ctypes wrappers for the Linux calls the standard library lacks: cachestat, mincore, mlock, statfs, inotify (and a
question the os module answers only with exceptions: does this process exist).

Every wrapper raises OSError with the kernel's errno, like the os module does. Nothing here imports
anything beyond the standard library, so `dltop residency` starts fast.
"""

from __future__ import annotations

import ctypes
import errno
import os
import resource
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def process_exists(pid: int) -> bool:
    """Whether a process `pid` runs (in this PID namespace), even one of another user or hidden from /proc
    (hidepid): kill(pid, 0) checks without signalling."""
    if pid <= 0:  # 0 and negative numbers name process groups, not a process
        return False
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True
    except (ProcessLookupError, OverflowError):
        return False
    return True

# Filesystem magics (linux/magic.h) the residency engine treats specially.
OVERLAYFS_SUPER_MAGIC = 0x794C7630  # cachestat through an overlayfs file sees the overlay's empty mapping
TMPFS_MAGIC = 0x01021994  # pages live in memory (shmem): they cannot be evicted, only swapped
RAMFS_MAGIC = 0x858458F6
FS_NAMES = {
    0xEF53: "ext4", 0x58465342: "xfs", 0x9123683E: "btrfs", OVERLAYFS_SUPER_MAGIC: "overlayfs", TMPFS_MAGIC: "tmpfs",
    RAMFS_MAGIC: "ramfs", 0x6969: "nfs", 0xFF534D42: "cifs", 0x65735546: "fuse", 0x2FC12FC1: "zfs",
    0x73717368: "squashfs", 0x9660: "iso9660", 0xE0F5E1E2: "erofs", 0x01021997: "9p", 0x6E667364: "nfsd",
    0x47504653: "gpfs", 0x0BD00BD0: "lustre", 0x00C36400: "ceph",
}

# cachestat(2) is 451 on every architecture that uses the unified syscall table (x86_64, aarch64, arm,
# riscv, ppc, s390, loongarch, mips n64 differ only by an offset); alpha adds 110.
_SYSCALL_OFFSET = {"alpha": 110, "mips64": 5000, "mips": 4000}
NR_CACHESTAT = 451 + _SYSCALL_OFFSET.get(os.uname().machine, 0)  # platform.machine(), without its import

PROT_READ = 0x1
MAP_SHARED = 0x01
MAP_FAILED = ctypes.c_void_p(-1).value


class _CachestatRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Cachestat(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in ("nr_cache", "nr_dirty", "nr_writeback", "nr_evicted",
                                                      "nr_recently_evicted")]


@dataclass(frozen=True, slots=True)
class CacheStat:
    """Page-cache state of a file range, in pages (the `struct cachestat` of cachestat(2))."""

    cache: int
    dirty: int
    writeback: int
    evicted: int
    recently_evicted: int


_PTR, _SIZE, _INT = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
_SIGNATURES = {  # name: (return type, argument types)
    "mmap": (_PTR, [_PTR, _SIZE, _INT, _INT, _INT, ctypes.c_long]), "munmap": (_INT, [_PTR, _SIZE]),
    "mprotect": (_INT, [_PTR, _SIZE, _INT]), "mincore": (_INT, [_PTR, _SIZE, ctypes.c_char_p]),
    "mlock": (_INT, [_PTR, _SIZE]), "munlock": (_INT, [_PTR, _SIZE]), "madvise": (_INT, [_PTR, _SIZE, _INT]),
    "fstatfs": (_INT, [_INT, _PTR]), "statfs": (_INT, [ctypes.c_char_p, _PTR]),
}


@cache
def libc() -> ctypes.CDLL:
    """The C library, errno kept, with the signatures of the calls made through it."""
    lib = ctypes.CDLL(None, use_errno=True)
    lib.syscall.restype = ctypes.c_long
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


def _raise_errno(what: str, filename: str | None = None) -> None:
    e = ctypes.get_errno()
    raise OSError(e, f"{what}: {os.strerror(e)}", filename)


class _CachestatCaller:
    """One preallocated argument set: cachestat is called once per file, so its Python cost matters."""

    def __init__(self) -> None:
        self.range = _CachestatRange(0, 0)
        self.out = _Cachestat()
        self._range_ref = ctypes.byref(self.range)
        self._out_ref = ctypes.byref(self.out)
        self._syscall = libc().syscall
        self._nr = ctypes.c_long(NR_CACHESTAT)

    def __call__(self, fd: int) -> _Cachestat:
        if self._syscall(self._nr, fd, self._range_ref, self._out_ref, 0) != 0:
            _raise_errno("cachestat")
        return self.out

    def raw(self) -> tuple[Callable[..., int], ctypes.c_long, object, object]:
        """(call, nr, range, out) for the tightest loops: `call(nr, fd, range, out, 0)` is this call without its
        Python frame (0.3 us a file, twice a file in an evict); a non-zero result is a failure, see `fail`."""
        return self._syscall, self._nr, self._range_ref, self._out_ref

    @staticmethod
    def fail() -> None:
        """Raise the OSError of the raw call that just failed (its errno)."""
        _raise_errno("cachestat")


def cachestat_caller() -> _CachestatCaller:
    """A fast whole-file cachestat for tight loops: `c = cachestat_caller(); st = c(fd)`; `st` is reused."""
    return _CachestatCaller()


def cachestat(fd: int, offset: int = 0, length: int = 0) -> CacheStat:
    """cachestat(2) of [offset, offset+length) of an open file (length 0: to the end); OSError on failure.

    ENOSYS: the kernel is older than 6.5. EPERM: the caller may not write the file and does not own it,
    so the kernel hides its residency.
    """
    rng = _CachestatRange(offset, length)
    out = _Cachestat()
    if libc().syscall(ctypes.c_long(NR_CACHESTAT), fd, ctypes.byref(rng), ctypes.byref(out), 0) != 0:
        _raise_errno("cachestat")
    return CacheStat(out.nr_cache, out.nr_dirty, out.nr_writeback, out.nr_evicted, out.nr_recently_evicted)


@cache
def have_cachestat() -> bool:
    """Whether this kernel has cachestat(2) (Linux >= 6.5, and not blocked by seccomp). Asked of a memfd this
    process makes: its own file, so EPERM means a filter refused the call, never that the file is another user's
    (asked of /proc/self/exe, root's interpreter, every other user got EPERM and measured by mincore)."""
    try:
        fd = os.memfd_create("dltop-cachestat", os.MFD_CLOEXEC)
    except OSError:  # memfd refused (a seccomp filter): the interpreter's binary, as before
        fd = os.open("/proc/self/exe", os.O_RDONLY | os.O_CLOEXEC)
    try:
        cachestat(fd)
    except OSError as e:
        return e.errno not in (errno.ENOSYS, errno.EPERM)
    finally:
        os.close(fd)
    return True


# inotify(7): which files of a watched folder were opened, closed, created, moved or deleted.
IN_ATTRIB, IN_CLOSE_WRITE, IN_CLOSE_NOWRITE, IN_OPEN = 0x4, 0x8, 0x10, 0x20
IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x40, 0x80, 0x100, 0x200
IN_DELETE_SELF, IN_MOVE_SELF, IN_UNMOUNT, IN_Q_OVERFLOW, IN_IGNORED = 0x400, 0x800, 0x2000, 0x4000, 0x8000
IN_ONLYDIR, IN_DONT_FOLLOW, IN_EXCL_UNLINK, IN_ISDIR = 0x01000000, 0x02000000, 0x04000000, 0x40000000
IN_NONBLOCK, IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC


def inotify_init() -> int:
    """A non-blocking, close-on-exec inotify fd; OSError (EMFILE: the per-user instance limit) on failure."""
    fd = libc().inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
    if fd < 0:
        _raise_errno("inotify_init1")
    return int(fd)


def inotify_add_watch(fd: int, path: str, mask: int) -> int:
    """Watch a folder: its watch descriptor; OSError (ENOSPC: max_user_watches reached, EACCES) on failure."""
    wd = libc().inotify_add_watch(fd, os.fsencode(path), ctypes.c_uint32(mask))
    if wd < 0:
        _raise_errno("inotify_add_watch", path)
    return int(wd)


def inotify_rm_watch(fd: int, wd: int) -> None:
    """Stop watching; a watch the kernel dropped already (its folder deleted) is no error."""
    libc().inotify_rm_watch(fd, wd)


# Windows of at most this many bytes are mapped at once, so a 1 TiB file needs 1 MiB of vector, not 256 MiB.
_MINCORE_WINDOW_BYTES = 1 << 32
_LOW_BIT = bytes(b & 1 for b in range(256))


def mincore_vector(fd: int, size: int, offset: int = 0) -> bytes:
    """One byte per page of [offset, offset+size) of an open file: 1 if the page is in the page cache.

    Uses mmap + mincore(2). Beware: for a file the caller may not write and does not own, the kernel reports
    every page resident; the caller must check `residency_visible` first.
    """
    if size <= 0:
        return b""
    lib = libc()
    parts = []
    end = offset + size
    pos = offset - offset % PAGE_SIZE
    while pos < end:
        length = min(_MINCORE_WINDOW_BYTES, end - pos)
        addr = lib.mmap(None, length, PROT_READ, MAP_SHARED, fd, pos)
        if addr is None or addr == MAP_FAILED:
            _raise_errno("mmap")
        try:
            n = (length + PAGE_SIZE - 1) // PAGE_SIZE
            vec = ctypes.create_string_buffer(n)
            if lib.mincore(ctypes.c_void_p(addr), length, vec) != 0:
                _raise_errno("mincore")
            parts.append(vec.raw[:n].translate(_LOW_BIT))
        finally:
            lib.munmap(ctypes.c_void_p(addr), length)
        pos += length
    return b"".join(parts)


def mincore_resident_pages(fd: int, size: int) -> int:
    """Pages of an open file in the page cache, counted with mmap + mincore (see `mincore_vector`)."""
    return mincore_vector(fd, size).count(1)


def residency_visible(st: os.stat_result, name: str | bytes, dir_fd: int | None = None) -> bool:
    """Whether the kernel shows this caller the page-cache state of the file (owner, root, or may write it).

    Mirrors the kernel's can_do_mincore() and cachestat's check: the file's owner, a process with
    CAP_FOWNER, or one that could open the file for writing sees real residency; everyone else is shown
    every page resident (mincore) or refused (cachestat EPERM).
    """
    euid = os.geteuid()
    if euid == 0 or st.st_uid == euid:
        return True
    return os.access(name, os.W_OK, dir_fd=dir_fd, effective_ids=True)


MADV_RANDOM = 1


class LockedMapping:
    """`size` bytes of a file from `offset` (a multiple of the page size) mapped and mlock(2)ed; its pages stay in
    memory until `release()`. `lock=False` only maps it: `lock_range` then locks it a part at a time."""

    def __init__(self, fd: int, size: int, offset: int = 0, lock: bool = True, random: bool = False) -> None:
        self.size = size
        self._addr: int | None = None
        if size <= 0:
            return
        lib = libc()
        addr = lib.mmap(None, size, PROT_READ, MAP_SHARED, fd, offset)
        if addr is None or addr == MAP_FAILED:
            _raise_errno("mmap")
        self._addr = addr
        if random:  # MADV_RANDOM: its faults read no page around (or ahead of) the one they miss
            lib.madvise(ctypes.c_void_p(addr), size, MADV_RANDOM)
        if lock:
            self.lock_range(0, size)

    def lock_range(self, start: int, n: int) -> None:
        """mlock `n` bytes from `start` (relative to the mapping); on failure the whole mapping is released."""
        if self._addr is None or n <= 0:
            return
        if libc().mlock(ctypes.c_void_p(self._addr + start), n) != 0:
            e = ctypes.get_errno()
            self.release()
            raise OSError(e, f"mlock: {os.strerror(e)}")

    def release(self) -> None:
        """munlock and unmap; safe to call twice."""
        if self._addr is not None:
            lib = libc()
            lib.munlock(ctypes.c_void_p(self._addr), self.size)
            lib.munmap(ctypes.c_void_p(self._addr), self.size)
            self._addr = None

    def __enter__(self) -> LockedMapping:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def fstatfs_type(fd: int) -> int:
    """The f_type magic of the filesystem holding an open file (see linux/magic.h)."""
    buf = ctypes.create_string_buffer(256)  # larger than struct statfs on every architecture
    if libc().fstatfs(fd, buf) != 0:
        _raise_errno("fstatfs")
    return ctypes.c_ulong.from_buffer(buf).value & 0xFFFFFFFF


def statfs_type(path: str | bytes) -> int:
    """The f_type magic of the filesystem holding `path`."""
    buf = ctypes.create_string_buffer(256)
    if libc().statfs(os.fsencode(path), buf) != 0:
        _raise_errno("statfs", os.fsdecode(path))
    return ctypes.c_ulong.from_buffer(buf).value & 0xFFFFFFFF


def fs_name(magic: int) -> str:
    """A filesystem's usual name for its statfs magic, or the magic in hex."""
    return FS_NAMES.get(magic, f"0x{magic:x}")


def fs_name_at(path: str | bytes) -> str:
    """The name of the filesystem holding `path`, or "" where statfs fails."""
    try:
        return fs_name(statfs_type(path))
    except OSError:
        return ""


def memlock_limit_bytes() -> tuple[int | None, int | None]:
    """RLIMIT_MEMLOCK (soft, hard) in bytes; None means unlimited."""
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return (None if soft == resource.RLIM_INFINITY else soft, None if hard == resource.RLIM_INFINITY else hard)


def can_lock_unlimited() -> bool:
    """Whether this process has CAP_IPC_LOCK (then RLIMIT_MEMLOCK does not apply)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) & (1 << 14))  # CAP_IPC_LOCK = 14
    except OSError:
        pass
    return os.geteuid() == 0


def readahead_bytes(st_dev: int, sys_root: str = "/sys") -> int:
    """How much one POSIX_FADV_WILLNEED call reads on the device holding st_dev: max(readahead, max IO size).

    The kernel's force_page_cache_ra() caps one call at max(bdi->ra_pages, bdi->io_pages); asking for more
    reads only the first window. Falls back to 128 KiB, the kernel default, when sysfs does not say.
    """
    major, minor = os.major(st_dev), os.minor(st_dev)
    candidates = [
        f"{sys_root}/dev/block/{major}:{minor}/queue",
        f"{sys_root}/dev/block/{major}:{minor}/../queue",  # a partition: the disk's queue
    ]
    ra_kb = io_kb = 0
    for q in candidates:
        try:
            with open(f"{q}/read_ahead_kb") as f:
                ra_kb = int(f.read().strip() or 0)
            with open(f"{q}/max_sectors_kb") as f:
                io_kb = int(f.read().strip() or 0)
            break
        except (OSError, ValueError):
            continue
    if not ra_kb:
        try:
            with open(f"{sys_root}/class/bdi/{major}:{minor}/read_ahead_kb") as f:
                ra_kb = int(f.read().strip() or 0)
        except (OSError, ValueError):
            ra_kb = 0
    window_kb = max(ra_kb, io_kb)
    return window_kb * 1024 if window_kb > 0 else 128 * 1024
