"""The caches walk's C loop (dltop/native/_walk.c) against its Python twin (walk_cache with DLTOP_NATIVE=0): the
same CacheWalk, field for field, on real trees (hard links, symlinks and their loops, FIFOs, devices, non-UTF-8
names, unreadable folders, entries that vanish, a folder swapped for a symlink, budgets), on generated trees,
and the same bytes and files as du -sB1 and find count them."""

from __future__ import annotations

import contextlib
import errno
import os
import random
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dltop import native
from dltop.sources import caches as src
from tests.test_caches_util import REPO, du_bytes, find_files
from tests.test_pagecache_util import IS_ROOT, NOBODY

C_WALK = native.load("_walk")
needs_c = pytest.mark.skipif(C_WALK is None, reason=f"the C walk does not run here: {native.status().get('_walk')}")


def _walks(path: Path | str, monkeypatch: pytest.MonkeyPatch, **kw) -> tuple[src.CacheWalk, src.CacheWalk]:
    """(the C walk, the Python walk) of `path`."""
    try:
        monkeypatch.setenv("DLTOP_NATIVE", "0")
        native.reset()
        assert native.load("_walk") is None
        py = src.walk_cache(str(path), **kw)
        monkeypatch.delenv("DLTOP_NATIVE")
        native.reset()
        assert native.load("_walk") is not None
        c = src.walk_cache(str(path), **kw)
    finally:
        native.reset()
    return c, py


def _du_apparent(path: Path) -> int:
    out = subprocess.run(["du", "--apparent-size", "-sB1", os.fsencode(str(path))], capture_output=True,
                         check=True).stdout
    return int(out.split()[0])


def _odd_tree(base: Path) -> Path:
    """Everything a cache can hold that du and find count their own way."""
    cache = base / "c"
    rng = random.Random(22)
    for d in range(6):
        sub = cache / f"{d:02x}" / "deeper"
        sub.mkdir(parents=True)
        for i in range(700 if d == 0 else 60):  # 700: more than twice the kept lists, so they are trimmed
            size = rng.choice((0, 1, 100, 4096, 4097, 9000, 70000))  # ties in blocks, names break them
            (cache / f"{d:02x}" / f"k{i}.py").write_bytes(b"x" * size)
        (sub / "leaf").write_bytes(b"y" * 5000)
    for i in range(260):  # more than ENTRIES_KEPT right below the cache
        (cache / f"top{i}").write_bytes(b"z" * rng.choice((10, 5000, 20000)))
    os.link(cache / "00" / "k1.py", cache / "01" / "deeper" / "hard")  # once in bytes, twice in find -type f
    os.link(cache / "00" / "k2.py", cache / "hard-top")
    (base / "outside").write_bytes(os.urandom(50000))
    os.symlink(base / "outside", cache / "00" / "out")  # its target is never counted
    os.symlink("loop", cache / "loop")  # a symlink to itself
    os.symlink("..", cache / "02" / "deeper" / "up")  # a folder loop, never followed
    os.symlink("nowhere", cache / "dangling")
    os.mkfifo(cache / "03" / "fifo")
    for i in range(60):  # more .lock files than LOCKS_KEPT
        (cache / "04" / f"l{i}.lock").write_bytes(b"")
    (cache / "04" / "a.lock.d").mkdir()
    raw = os.fsencode(cache)
    with open(os.path.join(raw, b"n\xffme"), "wb") as f:  # not UTF-8
        f.write(b"x" * 5000)
    os.mkdir(os.path.join(raw, b"dir\xfe"))
    with open(os.path.join(raw, b"dir\xfe", b"in\xe9.lock"), "wb") as f:
        f.write(b"x" * 100)
    (cache / "05" / "naïve-ünïcode.py").write_bytes(b"u" * 3000)  # UTF-8 and not ASCII
    if IS_ROOT:
        os.mknod(cache / "03" / "null", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    return cache


@needs_c
def test_the_c_and_python_walks_agree_on_a_tree_of_everything_and_with_du_and_find(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = _odd_tree(tmp_path)
    c, py = _walks(cache, monkeypatch)
    assert c == py
    assert c.complete and c.size_bytes == du_bytes(cache) and c.files == find_files(cache)
    assert c.apparent_bytes == _du_apparent(cache)
    assert c.noted == {"symlink": 4, "non_utf8_name": 3}
    assert len(c.locks) == src.LOCKS_KEPT and all(p.endswith(".lock") for p, _ in c.locks)
    for p, s in c.locks:  # the stat_result built from the C loop's fields is os.lstat's, field by field
        again = os.lstat(p)
        assert [getattr(s, f) for f in dir(s) if f.startswith("st_")] == \
            [getattr(again, f) for f in dir(again) if f.startswith("st_")]
    assert len(c.entries) == src.ENTRIES_KEPT + 7 and c.more_entries > 0  # 7 folders, then the biggest files
    assert c.folders and any(len(kids) == src.KEPT_PER_FOLDER for _p, kids, *_ in c.folders)


@needs_c
@pytest.mark.parametrize("keep_depth", [0, 1, 4])
def test_the_kept_lists_agree_at_every_depth(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             keep_depth: int) -> None:
    cache = _odd_tree(tmp_path)
    c, py = _walks(cache, monkeypatch, keep_depth=keep_depth)
    assert c == py and c.size_bytes == du_bytes(cache)


@needs_c
def test_vanished_entries_and_a_folder_swapped_for_a_symlink(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.listdir

    def make() -> Path:
        cache = tmp_path / "c"
        if cache.exists():
            subprocess.run(["rm", "-rf", str(cache)], check=True)
        for sub in ("a", "b"):
            (cache / sub).mkdir(parents=True)
            for i in range(5):
                (cache / sub / f"f{i}").write_bytes(b"x" * 100)
                os.utime(cache / sub / f"f{i}", (1e9 + i, 1e9 - i))  # made twice: the same times each time
        for i in range(5):
            (cache / f"g{i}").write_bytes(b"x" * 100)
            os.utime(cache / f"g{i}", (2e9, 2e9 + i))
        (tmp_path / "elsewhere").mkdir(exist_ok=True)
        return cache

    swapped: list[str] = []

    def racing(fd):  # list, then delete a listed file; listing the first subfolder, swap the other for a symlink
        names = real(fd)
        here = os.readlink(f"/proc/self/fd/{fd}")
        if here.endswith("/c"):
            (tmp_path / "c" / "g3").unlink()
        elif not swapped:
            other = "a" if here.endswith("/c/b") else "b"
            os.rename(tmp_path / "c" / other, tmp_path / "moved")
            os.symlink(tmp_path / "elsewhere", tmp_path / "c" / other)
            swapped.append(other)
        return names

    monkeypatch.setattr(src, "_listdir", racing)
    walked = []
    for off in ("0", "1"):
        make()
        subprocess.run(["rm", "-rf", str(tmp_path / "moved")], check=True)
        swapped.clear()
        monkeypatch.setenv("DLTOP_NATIVE", off)
        native.reset()
        assert (native.load("_walk") is None) == (off == "0")
        walked.append(src.walk_cache(str(tmp_path / "c")))
    native.reset()
    py, c = walked
    assert c == py
    assert c.noted == {"vanished": 1, "unreadable": 1} and c.files == 4 + 5
    assert c.problems == [f"not a directory: {tmp_path}/c/{swapped[0]}"]  # the path once


@needs_c
@pytest.mark.parametrize("how", ["deadline", "cancel", "cpu"])
def test_a_walk_cut_short_is_cut_at_the_same_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 how: str) -> None:
    cache = tmp_path / "c"
    for d in range(4):
        (cache / f"d{d}").mkdir(parents=True)
        for i in range(800):
            (cache / f"d{d}" / f"f{i}").write_bytes(b"x" * (i % 7) * 1000)
    if how == "cpu":  # a CPU share slows the walk and never cuts it
        c, py = _walks(cache, monkeypatch, cpu_fraction=0.9)
        assert c == py and c.complete and c.files == 3200
        return
    gone = threading.Event()
    gone.set()
    kw = {"deadline_s": 0.0} if how == "deadline" else {"cancel": gone}
    c, py = _walks(cache, monkeypatch, **kw)
    assert c == py and not c.complete and 0 < c.files < 3200


@needs_c
@pytest.mark.skipif(not IS_ROOT, reason="needs root (setpriv to walk as nobody)")
def test_unreadable_folders_and_names_agree_as_nobody(tmp_path: Path) -> None:
    base = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="dltop-test-"))
    try:
        os.chmod(base, 0o755)
        cache = base / "c"
        (cache / "open").mkdir(parents=True)
        (cache / "open" / "f").write_bytes(b"x" * 9000)
        (cache / "shut").mkdir()  # not listable
        (cache / "shut" / "g").write_bytes(b"x" * 9000)
        os.chmod(cache / "shut", 0o700)
        (cache / "noexec").mkdir()  # listable, its names not lstat-able
        for i in range(3):
            (cache / "noexec" / f"h{i}").write_bytes(b"x" * 9000)
        os.chmod(cache / "noexec", 0o744)
        os.chmod(cache, 0o755)
        code = ("import os, sys\nfrom dltop import native\nfrom dltop.sources.caches import walk_cache\n"
                "out = []\n"
                "for off in ('0', '1'):\n"
                "    os.environ['DLTOP_NATIVE'] = off; native.reset()\n"
                "    out.append((native.load('_walk') is not None, walk_cache(sys.argv[1])))\n"
                "(p_c, p), (c_c, c) = out\n"
                "print(p_c, c_c, c == p, c.files, sorted(c.noted.items()), c.problems)\n")
        r = subprocess.run([*NOBODY, sys.executable, "-c", code, str(cache)], capture_output=True, text=True,
                           cwd=REPO, timeout=60)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("False True True 1 [('unreadable', 4)] "), r.stdout
        assert f"'permission denied: {cache}/shut'" in r.stdout  # the path once
        assert f"'permission denied: {cache}/noexec/h0'" in r.stdout
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=True)


@needs_c
def test_the_walked_folder_itself_unreadable_raises_on_both_sides(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(fd):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(src, "_listdir", failing)
    (tmp_path / "c").mkdir()
    for off in ("0", "1"):
        monkeypatch.setenv("DLTOP_NATIVE", off)
        native.reset()
        with pytest.raises(PermissionError):
            src.walk_cache(str(tmp_path / "c"))
    native.reset()


@needs_c
@pytest.mark.parametrize("limit", [1, 2, 3])
def test_ties_among_names_that_sort_apart_as_bytes_and_as_str(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               limit: int) -> None:
    # U+E000 and a lone \xc3 sort one way as bytes, the other as str against the surrogate escapes of bytes that
    # are not UTF-8 (\xff is U+DCFF): of files of one size, the kept ones are the first by str, as Python sorts
    monkeypatch.setattr(src, "ENTRIES_KEPT", limit)
    monkeypatch.setattr(src, "KEPT_PER_FOLDER", limit)
    cache = tmp_path / "c"
    (cache / "sub").mkdir(parents=True)
    for folder in (os.fsencode(cache), os.fsencode(cache / "sub")):
        for name in ("\ue000".encode(), b"\xff", b"\xc3", "é".encode(), b"\xed\xa0\x80", b"zz", b"big"):
            with open(os.path.join(folder, name), "wb") as f:
                f.write(b"x" * (20000 if name == b"big" else 3000))
    c, py = _walks(cache, monkeypatch)
    assert c == py
    names = [e.name for e in c.entries if not e.is_dir]
    assert names == sorted(names, key=lambda n: (n != "big", n)) and len(names) == limit


@needs_c
def test_sums_past_int64_stay_exact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = Path("/dev/shm") if os.path.isdir("/dev/shm") else tmp_path  # tmpfs takes files of 2**62 bytes
    cache = Path(tempfile.mkdtemp(dir=base, prefix="dltop-test-"))
    try:
        _sparse(cache, monkeypatch)
    finally:
        subprocess.run(["rm", "-rf", str(cache)], check=True)


def _sparse(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        for i in range(3):  # sparse: st_size near the largest the filesystem takes, no blocks
            with open(cache / f"s{i}", "wb") as f:
                f.truncate(2**62 if i else 2**43)
    except OSError as e:
        pytest.skip(f"this filesystem takes no file that big: {e}")
    sizes = sum(os.lstat(cache / f"s{i}").st_size for i in range(3))
    c, py = _walks(cache, monkeypatch)
    assert c == py and c.apparent_bytes == sizes + os.lstat(cache).st_size


# -- generated trees ----------------------------------------------------------------------------------------

NAME = st.sampled_from([b"a", b"b", b"k0.py", b"x.lock", b"\xff", b"n\xe9", "é".encode(), b"sub", b"z" * 40,
                        b"\x1b[2J\nx.lock", "\U0001f600".encode(), b"\xed\xa0\x80", "\ue000".encode(), b"\xc3"])
# (terminal escapes; 4-byte UTF-8; an encoded surrogate; U+E000 and a lone \xc3, which sort one way as bytes and
# the other as str against the surrogate escapes of bytes that are not UTF-8)
SIZES = st.sampled_from([0, 1, 4096, 4097, 12000])
LEAF = st.one_of(st.tuples(st.just("file"), SIZES), st.tuples(st.just("link"), st.integers(0, 5)),
                 st.tuples(st.just("hard"), st.integers(0, 50)), st.tuples(st.just("fifo")))
TREE = st.recursive(st.dictionaries(NAME, LEAF, max_size=6),
                    lambda kids: st.dictionaries(NAME, st.one_of(LEAF, kids), max_size=5), max_leaves=40)


def _build(root: bytes, tree: dict, files: list[bytes]) -> None:
    for name, what in tree.items():
        p = os.path.join(root, name)
        if isinstance(what, dict):
            os.mkdir(p)
            _build(p, what, files)
        elif what[0] == "file":
            with open(p, "wb") as f:
                f.write(b"x" * what[1])
            files.append(p)
        elif what[0] == "link":
            os.symlink(b"../" * what[1] + name, p)  # dangling, to itself, or to a folder above
        elif what[0] == "hard" and files:
            os.link(files[what[1] % len(files)], p)
        elif what[0] == "fifo":
            os.mkfifo(p)


@needs_c
@settings(max_examples=150, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(tree=TREE, keep_depth=st.integers(0, 3), kept=st.tuples(st.integers(1, 4), st.integers(1, 3)),
       lines=st.integers(0, 3))
def test_generated_trees_walk_the_same_in_c_and_python(monkeypatch: pytest.MonkeyPatch, tree: dict,
                                                       keep_depth: int, kept: tuple[int, int], lines: int) -> None:
    # kept lists this short: the C loop's choice among entries of the same size (by name) is at work; problem
    # lines this few: past them the C loop counts non-UTF-8 names without handing them over
    monkeypatch.setattr(src, "ENTRIES_KEPT", kept[0])
    monkeypatch.setattr(src, "KEPT_PER_FOLDER", kept[1])
    monkeypatch.setattr(src, "MAX_PROBLEMS", lines)
    with tempfile.TemporaryDirectory() as d:
        root = os.path.join(os.fsencode(d), b"c")
        os.mkdir(root)
        _build(root, tree, [])
        c, py = _walks(os.fsdecode(root), monkeypatch, keep_depth=keep_depth)
        assert c == py
        assert c.size_bytes == du_bytes(os.fsdecode(root)) and c.files == find_files(os.fsdecode(root))


def test_the_python_twin_runs_where_the_c_walk_is_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLTOP_NATIVE", "0")
    native.reset()
    try:
        assert native.status()["_walk"] == "off (DLTOP_NATIVE=0)"
        (tmp_path / "c").mkdir()
        (tmp_path / "c" / "f").write_bytes(b"x" * 5000)
        w = src.walk_cache(str(tmp_path / "c"))
        assert w.files == 1 and w.size_bytes == du_bytes(tmp_path / "c")
    finally:
        native.reset()


# -- the kernel's errors on listing, injected at the C library (a filesystem under memory pressure, NFS) ------

_FAILING_LISTING = r"""
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Whether fd is the folder $FAIL_DIR (by its /proc/self/fd link). */
static int failing(int fd) {
    const char *want = getenv("FAIL_DIR");
    char link[64], here[4096];
    if (!want) return 0;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, here, sizeof here - 1);
    if (n < 0) return 0;
    here[n] = '\0';
    return strcmp(here, want) == 0;
}

/* the C walk lists with syscall(SYS_getdents64, ...) */
long syscall(long nr, ...) {
    static long (*real)(long, ...);
    if (!real) real = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
    va_list ap;
    va_start(ap, nr);
    long a = va_arg(ap, long), b = va_arg(ap, long), c = va_arg(ap, long), d = va_arg(ap, long),
         e = va_arg(ap, long), f = va_arg(ap, long);
    va_end(ap);
    if (nr == SYS_getdents64 && failing((int)a)) {
        errno = atoi(getenv("FAIL_ERRNO"));
        return -1;
    }
    return real(nr, a, b, c, d, e, f);
}

/* os.listdir (the Python twin) lists with readdir, readdir64 where Python was built for large files */
struct dirent64 *readdir64(DIR *dir) {
    static struct dirent64 *(*real)(DIR *);
    if (!real) real = (struct dirent64 *(*)(DIR *))dlsym(RTLD_NEXT, "readdir64");
    if (failing(dirfd(dir))) {
        errno = atoi(getenv("FAIL_ERRNO"));
        return NULL;
    }
    return real(dir);
}

struct dirent *readdir(DIR *dir) {
    static struct dirent *(*real)(DIR *);
    if (!real) real = (struct dirent *(*)(DIR *))dlsym(RTLD_NEXT, "readdir");
    if (failing(dirfd(dir))) {
        errno = atoi(getenv("FAIL_ERRNO"));
        return NULL;
    }
    return real(dir);
}
"""


@needs_c
@pytest.mark.parametrize("err", ["ENOMEM", "EIO", "EINTR"])
def test_a_subfolder_whose_listing_fails_is_noted_alike_whatever_the_error(tmp_path: Path, err: str) -> None:
    # ENOMEM from getdents64 (ext4's htree readdir under a memory cgroup's pressure, NFS) is the kernel's error,
    # not the C loop running out of memory: the walk notes the folder unreadable and goes on, as the Python twin
    # does, instead of raising MemoryError out of the whole walk
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the failing listing's library")
    (tmp_path / "shim.c").write_text(_FAILING_LISTING)
    shim = tmp_path / "shim.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(shim), str(tmp_path / "shim.c"), "-ldl"], check=True)
    cache = tmp_path / "c"
    for sub in ("a", "b"):
        (cache / sub).mkdir(parents=True)
        (cache / sub / "f").write_bytes(b"x" * 9000)
    code = ("import os, sys\nfrom dltop import native\nfrom dltop.sources.caches import walk_cache\n"
            "for off in ('0', '1'):\n"
            "    os.environ['DLTOP_NATIVE'] = off; native.reset()\n"
            "    try:\n"
            "        w = walk_cache(sys.argv[1])\n"
            "        print(native.load('_walk') is not None, w.files, w.noted, w.problems)\n"
            "    except BaseException as e:\n"
            "        print(native.load('_walk') is not None, 'raised', repr(e))\n")
    code_no = getattr(errno, err)
    preload = " ".join(p for p in (os.environ.get("LD_PRELOAD"), str(shim)) if p)  # after ASan's, where it runs
    env = {**os.environ, "LD_PRELOAD": preload, "FAIL_DIR": str(cache / "b"), "FAIL_ERRNO": str(code_no)}
    r = subprocess.run([sys.executable, "-c", code, str(cache)], capture_output=True, text=True, cwd=REPO, env=env,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    line = f"1 {{'unreadable': 1}} ['{src._why(os.strerror(code_no))}: {cache}/b']"
    assert r.stdout.splitlines() == [f"False {line}", f"True {line}"]


@needs_c
def test_a_subfolder_removed_between_its_open_and_its_listing_lists_empty_as_os_listdir(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # getdents64 on a folder removed since it was opened fails with ENOENT (the kernel's dead directory); glibc's
    # readdir, hence os.listdir and the Python twin, takes that for the end of the listing (POSIX: the folder is
    # empty), and so does the C loop: no "unreadable" line for a folder that rm -rf emptied and removed
    cache = tmp_path / "c"
    (cache / "gone").mkdir(parents=True)
    (cache / "kept").mkdir()
    (cache / "kept" / "f").write_bytes(b"x" * 9000)
    real_open = os.open

    def open_then_remove(path, flags, *a, **kw):
        fd = real_open(path, flags, *a, **kw)
        if isinstance(path, str) and path.endswith("/c/gone"):
            os.rmdir(path)
        return fd

    def walk() -> src.CacheWalk:
        with monkeypatch.context() as m:
            m.setattr(os, "open", open_then_remove)
            w = src.walk_cache(str(cache))
        (cache / "gone").mkdir()
        return w

    walked = []
    for off in ("0", "1"):
        monkeypatch.setenv("DLTOP_NATIVE", off)
        native.reset()
        assert (native.load("_walk") is None) == (off == "0")
        walked.append(walk())
    native.reset()
    py, c = walked
    assert c == py
    assert c.complete and c.files == 1 and c.dirs == 3 and c.noted == {} and c.problems == []


@needs_c
@pytest.mark.parametrize("arg", ["limit", "listed"])
def test_scan_refuses_counts_its_arithmetic_would_overflow(tmp_path: Path, arg: str) -> None:
    # 4 * limit candidates and 2 * limit kept blocks, listed + the folder's names: a count past what those take
    # was signed overflow in C (undefined behaviour, UBSan's report; then a MemoryError or a wrapped count), now
    # a ValueError before any of it. Only walk_cache calls scan, with counts far below: a guard, not a hole.
    (tmp_path / "f").write_bytes(b"x")
    args = {"limit": 3, "check_every": 1024, "listed": 0, "next_check": 1}
    args[arg] = sys.maxsize
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(ValueError, match="out of range"):
            C_WALK.scan(fd, None, set(), True, args["limit"], 5, lambda: False, args["listed"], args["next_check"],
                        args["check_every"], 20)
        r = C_WALK.scan(fd, ["f"], set(), True, 3, 5, lambda: False, 0, 1, 1024, 20)  # the same call in range
        assert r[0] == 1 and r[3] == 1
    finally:
        os.close(fd)


@needs_c
def test_a_folder_of_hostile_names_crosses_into_python_as_counts_past_the_problem_lines(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Another user's folder of 20,000 names not UTF-8: the walk writes MAX_PROBLEMS lines and counts the rest.
    # The C loop handed Python one (code, name, 0) per name, 20,000 str and tuples held at once (a million names
    # of 255 bytes: ~0.7 GB, more than the Python twin's own listing); past the lines left it hands a count, as
    # it does for vanished names and symlinks (unreadable names, the same code, likewise)
    import tracemalloc

    cache = tmp_path / "c"
    cache.mkdir()
    fd = os.open(cache, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(20000):
            os.close(os.open(b"%05d-" % i + b"\xff" * 90, os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))
    finally:
        os.close(fd)
    c, py = _walks(cache, monkeypatch)
    assert c == py and c.files == 20000
    assert c.noted == {"non_utf8_name": 20000} and len(c.problems) == src.MAX_PROBLEMS
    assert native.load("_walk") is not None
    tracemalloc.start()
    try:
        src.walk_cache(str(cache))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        native.reset()
    assert peak < 1_000_000, f"{peak} bytes of Python objects at the walk's peak"


@needs_c
def test_names_that_cross_hold_no_second_utf8_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The C loop told UTF-8 names from others with PyUnicode_AsUTF8AndSize, which keeps a UTF-8 copy inside the
    # str for its life: every non-ASCII folder name of a walk (its _Dir, the entries) held its bytes twice. The
    # twin's name.encode("utf-8") keeps nothing; now the C loop looks for the surrogates that make it fail.
    cache = tmp_path / "c"
    for i in range(30):
        (cache / f"日本語のフォルダ-{i}").mkdir(parents=True)
        (cache / f"日本語のフォルダ-{i}" / f"ファイル-{i}").write_bytes(b"x" * (i + 1) * 1000)
        (cache / f"ファイル-{i}").write_bytes(b"x" * (i + 1) * 1000)
    c, py = _walks(cache, monkeypatch, keep_depth=2)
    assert c == py and c.noted == {}

    def sizes(w: src.CacheWalk) -> list[int]:
        kept = [e for _p, kids, *_ in w.folders for e in kids]
        return [sys.getsizeof(e.name) for e in w.entries + kept]

    assert len(sizes(c)) == 60 + 30 and sizes(c) == sizes(py)


@needs_c
def test_scan_leaks_nothing_on_any_path(tmp_path: Path) -> None:
    # every way out of scan, 200 times each: the interpreter's allocated blocks stay where they were, and the
    # arguments' reference counts too (a missed Py_DECREF on an error path shows as a steady climb)
    cache = tmp_path / "c"
    (cache / "sub").mkdir(parents=True)
    raw = os.fsencode(cache)
    for i in range(40):
        with open(os.path.join(raw, b"f%d.lock" % i if i % 2 else b"\xff%d" % i), "wb") as f:
            f.write(b"x" * 4096 * (i % 5))
    os.symlink("x", cache / "ln")
    os.link(cache / "f1.lock", cache / "hard")
    sparse = Path(tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else tmp_path, prefix="dltop-test-"))
    try:
        for i in range(3):  # tmpfs takes files of 2**62 bytes
            with open(sparse / f"s{i}", "wb") as f:
                f.truncate(2**62)
        _no_leak(cache, sparse)
    except OSError as e:
        if e.errno != errno.EFBIG:
            raise
        _no_leak(cache, None)
    finally:
        subprocess.run(["rm", "-rf", str(sparse)], check=True)


def _no_leak(cache: Path, sparse: Path | None) -> None:
    import gc

    class Boom(Exception):
        pass

    class BadBool:
        def __bool__(self) -> bool:
            raise Boom

    def boom() -> bool:
        raise Boom

    def scan(path: Path, names=None, stop=lambda: False, every=1024, lines=5):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            return C_WALK.scan(fd, names, set(), True, 3, 10, stop, 0, 0, every, lines)
        finally:
            os.close(fd)

    listed = sorted(os.listdir(cache))
    ways = {
        "listing": lambda: scan(cache),
        "no lines left": lambda: scan(cache, lines=0),
        "a listing made in Python": lambda: scan(cache, names=listed),
        "sums past 2**63": lambda: scan(sparse) if sparse else None,
        "the budget raises": lambda: scan(cache, stop=boom, every=7),
        "its answer's bool() raises": lambda: scan(cache, stop=BadBool, every=7),
        "a NUL in a name": lambda: scan(cache, names=[*listed, "a\0b"]),
        "a name not str": lambda: scan(cache, names=[*listed, 3]),
        "a name not encodable": lambda: scan(cache, names=[*listed, "\ud800"]),
    }
    def once(call) -> None:
        with contextlib.suppress(Boom, ValueError, TypeError, UnicodeEncodeError):
            call()

    for way, call in ways.items():
        for _ in range(20):
            once(call)
        gc.collect()
        before, refs = sys.getallocatedblocks(), (sys.getrefcount(listed), sys.getrefcount(boom))
        for _ in range(200):
            once(call)
        gc.collect()
        assert sys.getallocatedblocks() - before < 50, way
        assert (sys.getrefcount(listed), sys.getrefcount(boom)) == refs, way
