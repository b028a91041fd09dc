"""The ctypes wrappers against the real kernel: real files, real page cache, fincore as the referee."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from dltop import kernel
from tests.test_pagecache_util import (
    IS_ROOT,
    PS,
    ddir_fixture,  # noqa: F401  (the `ddir` fixture)
    evict_file,
    fincore_resident_pages,
    make_file,
    needs_fincore,
    needs_root,
    read_file,
    resident,
    run_as_nobody,
)

pytestmark = pytest.mark.skipif(not kernel.have_cachestat(), reason="kernel without cachestat (< 6.5)")


def test_evicted_file_has_no_pages_and_read_file_has_all(ddir: Path) -> None:
    f = make_file(ddir / "a.bin", 64 * PS + 100)
    fd = os.open(f, os.O_RDONLY)
    try:
        assert kernel.cachestat(fd).cache == 0
        assert kernel.mincore_vector(fd, f.stat().st_size) == bytes(65)
        read_file(f)
        st = kernel.cachestat(fd)
        assert st.cache == 65 and st.dirty == 0
        assert kernel.mincore_resident_pages(fd, f.stat().st_size) == 65
    finally:
        os.close(fd)


@needs_fincore
def test_known_page_pattern_read_with_readahead_off(ddir: Path) -> None:
    f = make_file(ddir / "pattern.bin", 64 * PS)
    wanted = [0, 3, 4, 17, 40, 63]
    fd = os.open(f, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no readahead: each pread brings exactly its page
        for p in wanted:
            os.pread(fd, 1, p * PS + 7)
        vec = kernel.mincore_vector(fd, 64 * PS)
        assert [i for i, b in enumerate(vec) if b] == wanted
        assert kernel.cachestat(fd).cache == len(wanted)
        # A range: pages 3..4 only.
        assert kernel.cachestat(fd, 3 * PS, 2 * PS).cache == 2
        assert kernel.cachestat(fd, 5 * PS, 12 * PS).cache == 0
    finally:
        os.close(fd)
    assert fincore_resident_pages(f) == {str(f): len(wanted)}


def test_dirty_pages_are_counted_until_synced(ddir: Path) -> None:
    f = ddir / "dirty.bin"
    fd = os.open(f, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.write(fd, os.urandom(10 * PS))
        st = kernel.cachestat(fd)
        assert st.cache == 10 and st.dirty + st.writeback == 10
        os.fsync(fd)
        assert kernel.cachestat(fd).dirty == 0
    finally:
        os.close(fd)


@needs_root
def test_kernel_hides_residency_from_users_who_cannot_write(ddir: Path) -> None:
    """The behaviour the residency engine is built around, checked on this kernel as user nobody."""
    f = make_file(ddir / "rootowned.bin", 16 * PS, mode=0o644)
    code = (
        "import os, sys, errno\n"
        "from dltop import kernel\n"
        "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
        "try:\n"
        "    kernel.cachestat(fd); print('cachestat ok')\n"
        "except OSError as e:\n"
        "    print('cachestat', errno.errorcode[e.errno])\n"
        "print('mincore', sum(kernel.mincore_vector(fd, os.fstat(fd).st_size)))\n"
        "print('visible', kernel.residency_visible(os.fstat(fd), sys.argv[1]))\n"
    )
    r = run_as_nobody(code, str(f))
    assert r.returncode == 0, r.stderr
    # The file is fully evicted, yet mincore says all 16 pages are resident and cachestat refuses.
    assert r.stdout.split("\n")[:3] == ["cachestat EPERM", "mincore 16", "visible False"]
    os.chmod(f, 0o666)  # now nobody may write it: the kernel tells the truth
    r = run_as_nobody(code, str(f))
    assert r.stdout.split("\n")[:3] == ["cachestat ok", "mincore 0", "visible True"]


@needs_root
def test_overlayfs_cachestat_reports_zero_but_mincore_sees_pages(ddir: Path) -> None:
    lower, upper, work, merged = (ddir / n for n in ("lower", "upper", "work", "merged"))
    for d in (lower, upper, work, merged):
        d.mkdir()
    make_file(lower / "x.bin", 32 * PS)
    r = subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                        f"lowerdir={lower},upperdir={upper},workdir={work}", str(merged)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount overlayfs: {r.stderr.decode().strip()}")
    try:
        read_file(merged / "x.bin")
        fd = os.open(merged / "x.bin", os.O_RDONLY)
        try:
            assert kernel.fstatfs_type(fd) == kernel.OVERLAYFS_SUPER_MAGIC
            assert kernel.statfs_type(str(merged)) == kernel.OVERLAYFS_SUPER_MAGIC
            assert kernel.cachestat(fd).cache == 0  # the kernel's answer through overlayfs: wrong
            assert kernel.mincore_resident_pages(fd, 32 * PS) == 32
        finally:
            os.close(fd)
        assert resident(lower / "x.bin") == 32
    finally:
        subprocess.run(["umount", str(merged)], check=True)


@needs_root
def test_tmpfs_is_recognised(ddir: Path) -> None:
    m = ddir / "t"
    m.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(m)], check=True)
    try:
        assert kernel.statfs_type(str(m)) == kernel.TMPFS_MAGIC
        assert kernel.fs_name(kernel.statfs_type(str(m))) == "tmpfs"
    finally:
        subprocess.run(["umount", str(m)], check=True)


def test_locked_mapping_shows_in_vmlck(ddir: Path) -> None:
    f = make_file(ddir / "lock.bin", 256 * PS)

    def vmlck_kb() -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmLck:"):
                return int(line.split()[1])
        raise AssertionError("no VmLck")

    before = vmlck_kb()
    fd = os.open(f, os.O_RDONLY)
    try:
        with kernel.LockedMapping(fd, 256 * PS):
            assert vmlck_kb() - before == 256 * PS // 1024
            assert resident(f) == 256  # mlock faults every page in
        assert vmlck_kb() == before
    finally:
        os.close(fd)
    evict_file(f)


def test_memlock_limit_matches_resource() -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    got = kernel.memlock_limit_bytes()
    assert got[0] == (None if soft == resource.RLIM_INFINITY else soft)
    assert got[1] == (None if hard == resource.RLIM_INFINITY else hard)
    assert kernel.can_lock_unlimited() == IS_ROOT


def test_readahead_window_comes_from_sysfs(ddir: Path) -> None:
    st = os.stat(ddir)
    window = kernel.readahead_bytes(st.st_dev)
    q = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
    q = q / "queue" if (q / "queue").exists() else q / ".." / "queue"
    if (q / "read_ahead_kb").exists():
        want = max(int((q / "read_ahead_kb").read_text()), int((q / "max_sectors_kb").read_text())) * 1024
        assert window == want
    assert window >= 4096
    assert kernel.readahead_bytes(os.makedev(0, 0), sys_root=str(ddir)) == 128 * 1024  # nothing known: default


def test_have_cachestat_and_errno_of_bad_fd() -> None:
    assert kernel.have_cachestat()
    with pytest.raises(OSError) as e:
        kernel.cachestat(987654)
    assert e.value.errno == errno.EBADF


def test_a_second_user_has_cachestat_where_root_has_it() -> None:
    import shutil
    import sys

    from .conftest import REPO

    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run as a second user")
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
                        "from dltop import kernel; print(kernel.have_cachestat())"], capture_output=True, text=True,
                       timeout=60, cwd="/", env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "True"  # the interpreter is root's: asked of it, cachestat said EPERM
