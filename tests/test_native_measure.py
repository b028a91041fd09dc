"""The residency scan's C per-file step (dltop/native/_measure.c) against its Python twin: the same trees, the same
results, field by field, on real files in the real page cache (warm, cold, partly resident, sparse, dirty, FIFOs,
symlinks, hard links, non-UTF-8 names, unreadable and vanished files), a derandomized differential fuzz, and the
numbers against fincore and vmtouch. The C side skips, saying why, where the module is not built."""

from __future__ import annotations

import errno
import json
import os
import random
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from dltop import kernel, native
from dltop.model.base import to_dict
from dltop.residency import measure as measuring
from dltop.residency import walk as walking
from dltop.residency.rank import FILE_SORT_KEYS
from dltop.residency.scan import WarmNeed, scan_residency
from dltop.residency.walk import WalkOptions
from tests.test_pagecache_util import (
    PS,
    ddir_fixture,  # noqa: F401  (the `ddir` fixture)
    fincore_resident_pages,
    make_file,
    needs_fincore,
    needs_root,
    needs_vmtouch,
    read_file,
    run_as_nobody,
    vmtouch_pages,
    walk_files,
)

MOD = native.load("_measure")
needs_c = pytest.mark.skipif(MOD is None, reason=f"dltop.native._measure: {native.status().get('_measure')}")
pytestmark = needs_c

TOP = WalkOptions(top_files=3, top_keys=FILE_SORT_KEYS, top_budget=64)
_O_FILE = measuring.O_FILE


def _drop(path: Path, offset: int = 0, length: int = 0) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _touch_range(path: Path, offset: int, length: int) -> None:
    with open(path, "rb") as f:
        f.seek(offset)
        f.read(length)


def _comparable(r: Any) -> dict[str, Any]:
    d = to_dict(r)
    for k in ("scanned_at", "scan_duration_s", "full_scan_at"):  # when, not what
        d.pop(k, None)
    return d


def both(path: Path | str, options: WalkOptions, monkeypatch: pytest.MonkeyPatch,
         **kw: Any) -> tuple[dict[str, Any], dict[str, Any], list[int]]:
    """The scan with the C step, then with its Python twin (back to back: the page cache does not move between
    them), and how many names each C call was given (so a test knows the C step ran)."""
    real = measuring.native_measure()
    assert real is not None
    calls: list[int] = []

    def counting(dfd: int, names: list[str], flags: int, nr: int) -> list[Any]:
        calls.append(len(names))
        return real(dfd, names, flags, nr)

    for _ in range(3):  # the kernel may start writing dirty pages back between the two: then both again
        monkeypatch.setattr(measuring, "native_measure", lambda: counting)
        c = _comparable(scan_residency(path, options, **kw))
        monkeypatch.setattr(measuring, "native_measure", lambda: None)
        p = _comparable(scan_residency(path, options, **kw))
        if c == p:
            break
    monkeypatch.undo()
    return c, p, calls


def build_mixed(root: Path) -> None:
    """Warm, cold, partly resident, sparse, dirty, empty, FIFO, socket, symlinks, hard links, odd names."""
    make_file(root / "cold.bin", 9 * PS + 7)
    read_file(make_file(root / "warm.bin", 5 * PS))
    part = make_file(root / "a" / "part.bin", 16 * PS)
    read_file(part)
    _drop(part, 2 * PS, 5 * PS)
    _drop(part, 12 * PS, PS)
    make_file(root / "a" / "empty.bin", 0)
    sparse = root / "a" / "sparse.bin"
    with open(sparse, "wb") as f:  # data, a hole, data: 3 data pages of 40
        f.write(os.urandom(PS))
        f.seek(38 * PS)
        f.write(os.urandom(2 * PS))
    _touch_range(sparse, 38 * PS, PS)
    with open(root / "a" / "dirty.bin", "wb") as f:  # written, not synced: dirty pages
        f.write(os.urandom(6 * PS))
    os.mkfifo(root / "a" / "fifo")
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(root / "a" / "sock"))
    finally:
        s.close()
    os.symlink("warm.bin", root / "link-to-warm")
    os.symlink("nowhere", root / "broken-link")
    os.symlink(".", root / "a" / "loop")
    os.link(root / "warm.bin", root / "a" / "hard-warm.bin")
    bad = os.fsencode(str(root / "b")) + b"/caf\xe9-\xff\x1b[31m.bin"
    os.makedirs(os.path.dirname(bad), exist_ok=True)
    with open(bad, "wb") as f:
        f.write(os.urandom(3 * PS))
    read_file(Path(os.fsdecode(bad)))
    for i in range(300):  # more than one batch in a folder
        p = make_file(root / "many" / f"f{i:03}.bin", (i % 7) * PS + (i % 3))
        if i % 4 == 0:
            read_file(p)


def test_the_module_reports_plain_files_and_leaves_the_rest_to_python(ddir: Path) -> None:
    build_mixed(ddir)
    dfd = os.open(ddir / "a", os.O_RDONLY | os.O_DIRECTORY)
    try:
        names = ["part.bin", "empty.bin", "sparse.bin", "dirty.bin", "fifo", "sock", "loop", "nosuch", "hard-warm.bin"]
        out = MOD.measure(dfd, names, _O_FILE, kernel.NR_CACHESTAT)
    finally:
        os.close(dfd)
    byname = dict(zip(names, out, strict=True))
    st = os.stat(ddir / "a" / "part.bin")
    cs = kernel.cachestat(os.open(ddir / "a" / "part.bin", os.O_RDONLY))
    assert byname["part.bin"] == (st.st_dev, st.st_ino, 1, 16 * PS, cs.cache, 0, 0, cs.recently_evicted)
    assert byname["part.bin"][4] == 16 - 5 - 1
    assert byname["empty.bin"][3:] == (0, 0, 0, 0, 0)
    assert byname["dirty.bin"][4] == 6
    # Dirty pages: written again just before, and the C's answer taken between two cachestats that agree (a busy
    # node's sync, or writeback, may clean them at any moment: then the file is dirtied again and asked again).
    path = ddir / "a" / "dirty.bin"
    for _ in range(20):
        with open(path, "r+b") as f:
            f.write(os.urandom(6 * PS))
        fd, dfd = os.open(path, os.O_RDONLY), os.open(ddir / "a", os.O_RDONLY | os.O_DIRECTORY)
        try:
            before = kernel.cachestat(fd)
            (dirty,) = MOD.measure(dfd, ["dirty.bin"], _O_FILE, kernel.NR_CACHESTAT)
            after = kernel.cachestat(fd)
        finally:
            os.close(fd)
            os.close(dfd)
        if before == after and before.dirty + before.writeback > 0:
            break
    else:
        pytest.skip("the pages of a file just written were cleaned before each of 20 measures (a sync storm)")
    assert dirty[4:] == (before.cache, before.dirty, before.writeback, before.recently_evicted)
    assert byname["hard-warm.bin"][2] == 2
    # the Python step decides these: sparse, FIFO (opened non-blocking, not regular), socket (ENXIO), a symlink
    # (O_NOFOLLOW: ELOOP), a vanished name
    # (O_NOFOLLOW: ELOOP), a vanished name: the open's errno, 0 where it opened
    assert [byname[n] for n in ("sparse.bin", "fifo", "sock", "loop", "nosuch")] == [
        0, 0, errno.ENXIO, errno.ELOOP, errno.ENOENT]
    assert MOD.measure(0, [], 0, kernel.NR_CACHESTAT) == []
    # bytes names too (the watch's inotify names), and a folder fd that is not one: EBADF, never an exception
    assert MOD.measure(-1, [b"x"], _O_FILE, kernel.NR_CACHESTAT) == [errno.EBADF]
    # no cachestat (a syscall number that does not exist): 0, so the Python step falls back to mincore
    dfd = os.open(ddir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert MOD.measure(dfd, ["warm.bin", "cold.bin"], _O_FILE, 100_000) == [0, 0]
    finally:
        os.close(dfd)
    with pytest.raises(TypeError):
        MOD.measure(0, ("a",), 0, 451)  # a list only
    with pytest.raises(ValueError):
        MOD.measure(0, ["a\0b"], 0, 451)


@pytest.mark.parametrize("options", [WalkOptions(), TOP, WalkOptions(max_depth=0, top_files=2),
                                     WalkOptions(follow_symlinks=True, top_files=2),
                                     WalkOptions(ignore=("*.bin3",), include=("f0*", "*.bin"))],
                         ids=["plain", "top", "depth0", "follow", "include"])
def test_c_and_python_give_the_same_scan_on_a_mixed_tree(ddir: Path, monkeypatch: pytest.MonkeyPatch,
                                                         options: WalkOptions) -> None:
    build_mixed(ddir)
    c, p, calls = both(ddir, options, monkeypatch, warm_need=WarmNeed())
    assert calls and max(calls) == measuring.BATCH  # the 300-file folder went in more than one call
    assert c == p
    assert c["files"] > 300 and c["resident_pages"] > 0
    assert c["skipped"].get("special", 0) >= 2 and c["dirty_pages"] + c["writeback_pages"] >= 0


def test_vanished_files_between_listing_and_the_c_step(ddir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(10):
        read_file(make_file(ddir / f"f{i}.bin", PS))
    real = walking.list_folder
    gone: list[str] = []

    def listing_then_delete(fd: int) -> Any:
        entries = list(real(fd))
        for e in entries:
            if e.name in ("f3.bin", "f7.bin") and e.name not in gone:
                os.unlink(ddir / e.name)
                gone.append(e.name)

        class Listing(list):  # type: ignore[type-arg]
            def __enter__(self) -> Any:
                return self

            def __exit__(self, *a: object) -> None:
                pass

        return Listing(entries)

    monkeypatch.setattr(walking, "list_folder", listing_then_delete)
    real_measure = measuring.native_measure()
    monkeypatch.setattr(measuring, "native_measure", lambda: real_measure)
    r = scan_residency(ddir)
    assert r.files == 8 and r.skipped == {"vanished": 2} and r.resident_pages == 8
    assert sum("vanished" in p for p in r.problems) == 2


@needs_fincore
@needs_vmtouch
def test_the_c_scan_agrees_with_fincore_and_vmtouch(ddir: Path) -> None:
    build_mixed(ddir)
    os.sync()  # the dirty file's pages stay resident, written back
    r = scan_residency(ddir)
    assert native.load("_measure") is not None
    files = [f for f in walk_files(ddir) if f.is_file() and not f.is_symlink()]
    out = subprocess.run(["fincore", "-n", "-o", "PAGES", *map(os.fsencode, files)], capture_output=True,
                         check=True).stdout  # one column of numbers: names that are not UTF-8 cannot upset it
    fin = [int(x) for x in out.split()]
    assert len(fin) == len(files)
    hard = fincore_resident_pages(ddir / "warm.bin")  # counted once, as vmtouch does
    assert r.resident_pages == sum(fin) - sum(hard.values())
    assert (r.resident_pages, r.pages) == vmtouch_pages(ddir)


@needs_root
def test_c_and_python_agree_for_a_user_who_may_not_see_everything(ddir: Path) -> None:
    read_file(make_file(ddir / "root-644.bin", 8 * PS, mode=0o644))  # cachestat EPERM for nobody
    read_file(make_file(ddir / "world-666.bin", 6 * PS, mode=0o666))
    make_file(ddir / "secret-600.bin", 2 * PS, mode=0o600)  # nobody cannot open it
    (ddir / "closed").mkdir(mode=0o700)
    for i in range(20):
        read_file(make_file(ddir / "pub" / f"f{i}.bin", PS, mode=0o666))
    code = ("import json, os, sys\nos.environ['DLTOP_NATIVE'] = sys.argv[2]\n"
            "from dltop import native\nfrom dltop.residency.scan import scan_residency\n"
            "from dltop.model.base import to_dict\nd = to_dict(scan_residency(sys.argv[1]))\n"
            "d.pop('scanned_at'); d.pop('scan_duration_s')\nprint(json.dumps([native.status(), d]))")
    out = []
    for flag in ("1", "0"):
        p = run_as_nobody(code, str(ddir), flag)
        assert p.returncode == 0, p.stderr
        out.append(json.loads(p.stdout))
    (st_c, c), (st_py, py) = out
    assert st_c["_measure"] == "C" and st_py["_measure"].startswith("off")
    assert c == py
    assert c["resident_pages"] == 6 + 20 and c["unknown_pages"] == 8 + 2 and c["skipped"]["unreadable"] == 2


def _random_tree(root: Path, rng: random.Random) -> None:
    names = ["x", "data.bin", "caf\xe9", "\u65e5\u672c", "sp ace", "-dash", ".hidden", "a" * 200]
    dirs = [root]
    files: list[Path] = []
    for _ in range(rng.randint(1, 5)):
        d = rng.choice(dirs) / f"d{rng.randint(0, 99)}"
        d.mkdir(exist_ok=True)
        dirs.append(d)
    for i in range(rng.randint(5, 80)):
        d = rng.choice(dirs)
        kind = rng.random()
        if rng.random() < 0.1:  # a non-UTF-8 name
            p = Path(os.fsdecode(os.fsencode(str(d)) + b"/\xff" + bytes([rng.randint(0x80, 0xfe)]) + f"{i}".encode()))
        else:
            p = d / f"{rng.choice(names)}{i}"
        if kind < 0.65:
            size = rng.choice([0, 1, PS - 1, PS, 3 * PS + 5, rng.randint(0, 40 * PS)])
            make_file(p, size)
            files.append(p)
            r = rng.random()
            if r < 0.3:
                read_file(p)
            elif r < 0.5 and size:
                _touch_range(p, rng.randrange(0, size), rng.randint(1, 8 * PS))
            elif r < 0.6 and size:
                read_file(p)
                _drop(p, rng.randrange(0, size), rng.randint(1, 8 * PS))
        elif kind < 0.75:  # sparse
            with open(p, "wb") as f:
                f.seek(rng.randint(0, 10) * PS)
                f.write(os.urandom(rng.randint(1, 3 * PS)))
                f.truncate(f.tell() + rng.randint(0, 10) * PS)
            if rng.random() < 0.5:
                read_file(p)
            files.append(p)
        elif kind < 0.82:  # dirty
            with open(p, "wb") as f:
                f.write(os.urandom(rng.randint(1, 4 * PS)))
            files.append(p)
        elif kind < 0.88 and files:
            os.link(rng.choice(files), p)
        elif kind < 0.94:
            os.symlink(os.path.relpath(rng.choice(files + dirs), d) if rng.random() < 0.8 else "missing", p)
        else:
            os.mkfifo(p)


@pytest.mark.parametrize("seed", range(8))
def test_differential_fuzz_c_against_python(ddir: Path, monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """Random trees (fixed seeds: the same trees every run) scanned both ways with random options."""
    root = ddir
    rng = random.Random(seed)
    _random_tree(root, rng)
    opts = WalkOptions(follow_symlinks=rng.random() < 0.3, max_depth=rng.choice([None, 0, 1, 6]),
                       top_files=rng.choice([0, 1, 3, 50]), top_keys=FILE_SORT_KEYS, top_budget=rng.choice([2, 64]))
    monkeypatch.setattr(measuring, "BATCH", rng.choice([1, 2, 7, 256]))
    c, p, calls = both(root, opts, monkeypatch, warm_need=WarmNeed())
    assert calls
    assert c == p


def test_the_watch_gives_the_same_dataset_both_ways(ddir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A watch measuring with the C step and one with the Python step, side by side on the same tree: the same
    dataset at the first read, after a job read and evicted some files (the watch's re-measure), and in full."""
    from dltop.residency import watch

    build_mixed(ddir)
    os.sync()  # no writeback between the two watches' reads
    real = measuring.native_measure()
    calls: list[int] = []
    use = {"c": True}

    def counting(dfd: int, names: list[Any], flags: int, nr: int) -> list[Any]:
        calls.append(len(names))
        return real(dfd, names, flags, nr)

    monkeypatch.setattr(measuring, "native_measure", lambda: counting if use["c"] else None)
    monkeypatch.setattr(watch, "MIN_ROLL_FILES", 0)
    monkeypatch.setattr(watch, "ROLL_CPU_SHARE", 0.0)
    opts = WalkOptions(max_depth=6, top_files=3, top_keys=FILE_SORT_KEYS, top_budget=64)
    wc, wp = watch.DatasetWatch(str(ddir), opts), watch.DatasetWatch(str(ddir), opts)

    def pair(full: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
        use["c"] = True
        c = _comparable(wc.read(full)[0])
        use["c"] = False
        p = _comparable(wp.read(full)[0])
        return c, p

    try:
        c, p = pair()
        assert calls and c == p and c["files"] > 300
        calls.clear()
        subprocess.run(["cat", *(str(ddir / "many" / f"f{i:03}.bin") for i in range(1, 200, 3))],
                       stdout=subprocess.DEVNULL, check=True)
        for i in range(0, 200, 8):
            _drop(ddir / "many" / f"f{i:03}.bin")
        c, p = pair()
        assert calls and c == p  # the C step counted the files read again
        c, p = pair(full=True)
        assert c == p
    finally:
        wc.close()
        wp.close()


def _evict_both(a: Path, b: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, Any], dict[str, Any], int]:
    """Tree `a` evicted with the C step, tree `b` (made the same way) with the Python step; their results without
    what names a tree or a moment, and how many names the C step was given."""
    from dltop.actions import pagecache as pc

    real = measuring.native_measure()
    calls: list[int] = []

    def counting(dfd: int, names: list[Any], *args: int) -> list[Any]:
        calls.append(len(names))
        return real(dfd, names, *args)

    def summary(r: Any) -> dict[str, Any]:
        d = r.to_dict()
        for k in ("paths", "elapsed_s", "rate_bytes_per_s", "problems", "stayed_detail", "notes"):
            d.pop(k, None)
        return d

    monkeypatch.setattr(measuring, "native_measure", lambda: counting)
    c = summary(pc.evict([str(a)]))
    monkeypatch.setattr(measuring, "native_measure", lambda: None)
    p = summary(pc.evict([str(b)]))
    monkeypatch.undo()
    return c, p, sum(calls)


@needs_fincore
def test_an_evict_drops_the_same_pages_both_ways(ddir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two trees made alike (warm, cold, partly resident, sparse, dirty, hard links, odd names, a mapped file whose
    pages stay): the C step's evict (its own drop of clean files) and the Python step's count the same, and leave
    what fincore sees."""
    import mmap

    for t in ("c", "p"):
        build_mixed(ddir / t)
        (ddir / t / "mapped.bin").write_bytes(os.urandom(6 * PS))  # 4 of its 6 pages mapped: 2 go, 4 stay
    os.sync()
    for t in ("c", "p"):  # dirty again after the sync
        (ddir / t / "a" / "dirty.bin").write_bytes(os.urandom(6 * PS))
    with open(ddir / "c" / "mapped.bin", "rb") as fc, open(ddir / "p" / "mapped.bin", "rb") as fp, \
            mmap.mmap(fc.fileno(), 4 * PS, prot=mmap.PROT_READ) as mc, \
            mmap.mmap(fp.fileno(), 4 * PS, prot=mmap.PROT_READ) as mp:
        for i in range(0, 4 * PS, PS):
            mc[i], mp[i]  # noqa: B018 - mapped pages stay resident
        c, p, fed = _evict_both(ddir / "c", ddir / "p", monkeypatch)
        left = {t: sum(int(x) for x in subprocess.run(
            ["fincore", "-n", "-o", "PAGES", *map(os.fsencode, (f for f in walk_files(ddir / t)
                                                                if f.is_file() and not f.is_symlink()))],
            capture_output=True, check=True).stdout.split()) for t in ("c", "p")}
    assert fed > 300  # the C step saw the tree's plain files
    # What the trees held before is theirs alike but for what the kernel itself took from one of them between
    # the two evicts (a page or two on a busy node: reclaim, DAMON): each step counts its own tree's, drops all
    # of it but the mapped file's 4 pages, and says the same of everything else.
    moment = ("resident_pages_before", "total_bytes", "done_bytes")
    assert {k: v for k, v in c.items() if k not in moment} == {k: v for k, v in p.items() if k not in moment}
    for r in (c, p):
        assert r["total_bytes"] == r["resident_pages_before"] * PS and r["done_bytes"] == r["total_bytes"] - 4 * PS
    assert abs(c["resident_pages_before"] - p["resident_pages_before"]) <= 2, (c, p)
    assert c["resident_pages_before"] > 300 and c["stayed"] == {"mapped": 4}
    assert left["c"] == left["p"] == c["resident_pages_after"] == 4  # the mapped file's pages alone


def test_an_evict_whose_filesystem_cannot_be_asked_fails_the_same_both_ways(ddir: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """fstatfs failing (the evict asks it whether the scan may drop pages itself): never fatal, and the C step's
    evict says what the Python step's says."""
    for t in ("c", "p"):
        for i in range(5):
            read_file(make_file(ddir / t / f"f{i}.bin", 2 * PS))

    def failing(fd: int) -> int:
        raise OSError(errno.EIO, "fstatfs: I/O error")

    monkeypatch.setattr(kernel, "fstatfs_type", failing)
    with monkeypatch.context() as m:
        c, p, fed = _evict_both(ddir / "c", ddir / "p", m)
    assert fed == 5 and c == p and c["skipped"] == {"error": 5}
