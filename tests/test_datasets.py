"""The residency scan on real trees on the real kernel, checked against fincore and vmtouch."""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dltop import kernel
from dltop.config import Settings
from dltop.model import Snapshot
from dltop.model.base import display_path, from_dict, to_dict
from dltop.model.datasets import NO_PERMISSION, DatasetResidency, DatasetsPart, DatasetUnavailable
from dltop.residency import walk as walking
from dltop.residency.scan import scan_paths, scan_residency
from dltop.residency.walk import WalkOptions, WalkReport
from dltop.sources.datasets import source as datasets_source
from tests.test_pagecache_util import (
    PS,
    REPO,
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


def build_tree(root: Path) -> dict[str, int]:
    """A small dataset, partly resident; returns {relative path: resident pages} as we made it."""
    sizes = {"a/one.bin": 3 * PS + 1, "a/two.bin": PS, "a/deep/er/x.bin": 10 * PS, "b/y.bin": 7 * PS,
             "top.bin": 1, "empty.bin": 0}
    for rel, size in sizes.items():
        make_file(root / rel, size)
    read_file(root / "a/one.bin")
    read_file(root / "a/deep/er/x.bin")
    return {"a/one.bin": 4, "a/two.bin": 0, "a/deep/er/x.bin": 10, "b/y.bin": 0, "top.bin": 0, "empty.bin": 0}


@needs_fincore
@needs_vmtouch
def test_tree_totals_agree_with_fincore_and_vmtouch(ddir: Path) -> None:
    build_tree(ddir)
    r = scan_residency(ddir)
    files = list(walk_files(ddir))
    fin = fincore_resident_pages(*files)
    assert r.files == len(files) == 6
    assert r.resident_pages == sum(fin.values()) == 14
    assert r.pages == sum((f.stat().st_size + PS - 1) // PS for f in files) == 4 + 1 + 10 + 7 + 1
    assert (r.resident_pages, r.pages) == vmtouch_pages(ddir)
    assert r.size_bytes == sum(f.stat().st_size for f in files)
    assert r.unknown_pages == 0 and r.unknown_reason is None and r.method == "cachestat"
    assert r.complete and r.fs_type and r.dirs == 5  # root, a, a/deep, a/deep/er, b


def test_folders_aggregate_and_depth_folds_deeper_folders(ddir: Path) -> None:
    build_tree(ddir)
    r = scan_residency(ddir)
    by_name = {Path(c.path).name: c for c in r.children}
    assert set(by_name) == {"a", "b"}
    a = by_name["a"]
    assert (a.files, a.resident_pages, a.pages) == (3, 14, 15)
    (deep,) = a.children
    assert deep.path == f"{ddir}/a/deep" and deep.children[0].path == f"{ddir}/a/deep/er"
    assert deep.resident_pages == 10
    shallow = scan_residency(ddir, WalkOptions(max_depth=1))
    a1 = next(c for c in shallow.children if c.path.endswith("/a"))
    assert a1.children == () and (a1.files, a1.resident_pages, a1.pages) == (3, 14, 15)
    assert shallow.resident_pages == r.resident_pages and shallow.pages == r.pages
    flat = scan_residency(ddir, WalkOptions(max_depth=0))
    assert flat.children == () and flat.files == 6


def test_evicted_tree_reads_zero_and_warmed_tree_reads_all(ddir: Path) -> None:
    build_tree(ddir)
    for f in walk_files(ddir):
        read_file(f)
    r = scan_residency(ddir)
    assert r.resident_pages == r.pages
    for f in walk_files(ddir):
        fd = os.open(f, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    assert scan_residency(ddir).resident_pages == 0


def test_dirty_pages_are_counted(ddir: Path) -> None:
    f = ddir / "d.bin"
    with open(f, "wb") as fh:
        fh.write(os.urandom(5 * PS))
    r = scan_residency(ddir)
    assert r.dirty_pages + r.writeback_pages == 5 and r.resident_pages == 5
    os.sync()
    assert scan_residency(ddir).dirty_pages == 0


def test_a_single_file_root(ddir: Path) -> None:
    f = make_file(ddir / "solo.bin", 9 * PS)
    read_file(f)
    r = scan_residency(f)
    assert (r.files, r.pages, r.resident_pages, r.dirs) == (1, 9, 9, 0)


@needs_root
def test_awkward_entries_are_counted_never_opened(ddir: Path) -> None:
    make_file(ddir / "real.bin", 2 * PS)
    os.mkfifo(ddir / "fifo")  # opening this without O_NONBLOCK would hang the scan
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(ddir / "sock"))
    os.mknod(ddir / "null", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    os.symlink("loop2", ddir / "loop1")
    os.symlink("loop1", ddir / "loop2")
    os.symlink(".", ddir / "self")
    os.symlink("real.bin", ddir / "alias")
    weird = os.fsencode(str(ddir)) + b"/caf\xe9-\xff.bin"  # Latin-1, not UTF-8
    with open(weird, "wb") as fh:
        fh.write(os.urandom(3 * PS))
    os.mkdir(os.fsencode(str(ddir)) + b"/dir-\xfe")
    with open(os.fsencode(str(ddir)) + b"/dir-\xfe/in.bin", "wb") as fh:
        fh.write(b"x")
    os.link(ddir / "real.bin", ddir / "hard1")
    os.link(ddir / "real.bin", ddir / "hard2")
    done = threading.Event()
    out: list = []
    t = threading.Thread(target=lambda: (out.append(scan_residency(ddir)), done.set()), daemon=True)
    t.start()
    assert done.wait(10), "the scan hung (opened the FIFO?)"
    sock.close()
    r = out[0]
    assert r.files == 3  # real.bin once (hard links counted once), the Latin-1 file, dir-\xfe/in.bin
    assert r.pages == 2 + 3 + 1
    assert r.skipped == {"hardlink": 2, "special": 3, "symlink": 4}
    (child,) = r.children
    assert os.fsencode(child.path) == os.fsencode(str(ddir)) + b"/dir-\xfe"
    # Paths with undecodable bytes survive JSON and print escaped.
    part = DatasetsPart(paths=(r,))
    assert from_dict(DatasetsPart, json.loads(json.dumps(to_dict(part)))) == part
    assert display_path(child.path).endswith("dir-\\xfe")

    # Following symlinks: the file alias is a hard-link-like duplicate, '.' and the loops are reported.
    f = scan_residency(ddir, WalkOptions(follow_symlinks=True))
    assert f.files == 3 and f.pages == 6
    assert f.skipped["symlink_loop"] == 3  # loop1, loop2 (ELOOP) and self (folder seen twice)
    assert f.skipped["hardlink"] == 3  # hard1, hard2 and alias all reach real.bin
    assert any("symlink loop" in p for p in f.problems)


def symlinked_tree(root: Path) -> list[Path]:
    """train/ and val/ with files partly resident, a sibling alias of train/, an alias of it inside val/ and a
    real cycle (train/sub/up -> the root); returns the real files."""
    files = [make_file(root / "train" / "a.bin", 5 * PS), make_file(root / "train" / "sub" / "b.bin", 3 * PS),
             make_file(root / "val" / "c.bin", 2 * PS)]
    read_file(files[0])
    read_file(files[2])
    os.symlink("train", root / "alias")  # listed before or after train/: either way train/ is counted
    os.symlink("../train", root / "val" / "train")
    os.symlink("../..", root / "train" / "sub" / "up")
    return files


@needs_fincore
@needs_vmtouch
def test_symlinked_aliases_are_duplicates_and_only_a_cycle_is_a_loop(ddir: Path, tmp_path: Path) -> None:
    files = symlinked_tree(ddir)
    fin = fincore_resident_pages(*files)
    r = scan_residency(ddir, WalkOptions(follow_symlinks=True))
    assert r.skipped == {"duplicate_folder": 2, "symlink_loop": 1}
    assert (r.files, r.pages, r.resident_pages) == (3, 10, sum(fin.values())) == (3, 10, 7)
    # vmtouch -f walks aliased folders once as well: the same totals.
    assert (r.resident_pages, r.pages) == vmtouch_pages(ddir, "-f")
    by_name = {Path(c.path).name: c for c in r.children}
    assert set(by_name) == {"train", "val"}  # counted at the real path, not at the alias
    assert (by_name["train"].files, by_name["train"].resident_pages) == (2, fin[str(files[0])])
    assert (by_name["val"].files, by_name["val"].resident_pages) == (1, fin[str(files[2])])
    assert f"symlink loop (a folder inside itself): {ddir}/train/sub/up" in r.problems
    assert f"duplicate of {ddir}/train, counted there: {ddir}/alias" in r.problems
    assert f"duplicate of {ddir}/train, counted there: {ddir}/val/train" in r.problems
    # A root given as an alias is the folder itself, with nothing in it taken for a loop.
    os.symlink(ddir, tmp_path / "dataset-alias")
    a = scan_residency(tmp_path / "dataset-alias", WalkOptions(follow_symlinks=True))
    assert a.skipped == r.skipped and (a.files, a.pages, a.resident_pages) == (3, 10, 7)


@needs_fincore
def test_a_file_reached_through_a_symlink_is_counted_once(ddir: Path) -> None:
    real = make_file(ddir / "z-real.bin", 4 * PS)  # one link: only the symlink makes it a duplicate
    read_file(real)
    os.symlink("z-real.bin", ddir / "a-alias.bin")  # before and after the real name, in any readdir order
    os.symlink("z-real.bin", ddir / "zz-alias.bin")
    r = scan_residency(ddir, WalkOptions(follow_symlinks=True))
    assert (r.files, r.pages, r.resident_pages) == (1, 4, fincore_resident_pages(real)[str(real)]) == (1, 4, 4)
    assert r.skipped == {"duplicate_file": 2}


@needs_vmtouch
def test_cli_residency_follows_an_aliased_folder_without_a_loop(ddir: Path) -> None:
    symlinked_tree(ddir)

    def dltop(*args: str) -> str:
        out = subprocess.run([sys.executable, "-m", "dltop", "residency", "-L", *args, str(ddir)],
                             capture_output=True, text=True, cwd=REPO, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout

    (res,) = json.loads(dltop("--json"))["paths"]
    assert res["skipped"] == {"duplicate_folder": 2, "symlink_loop": 1}
    assert (res["resident_pages"], res["pages"]) == vmtouch_pages(ddir, "-f")
    assert [Path(c["path"]).name for c in res["children"]] == ["train", "val"]
    human = dltop()
    assert "skipped 2 duplicate folder, 1 symlink loop" in human
    assert f"duplicate of {ddir}/train, counted there: {ddir}/alias" in human


def test_vanished_files_and_folders_are_reported_not_fatal(ddir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_file(ddir / "stays.bin", PS)
    make_file(ddir / "goes.bin", PS)
    (ddir / "gone").mkdir()
    make_file(ddir / "gone" / "z.bin", PS)
    real = walking.list_folder

    def listing_then_delete(fd: int):  # the files vanish between readdir and open
        entries = list(real(fd))
        for e in entries:
            if e.name == "goes.bin":
                os.unlink(ddir / "goes.bin")
            if e.name == "gone":
                os.unlink(ddir / "gone" / "z.bin")
                os.rmdir(ddir / "gone")

        class Listing(list):
            def __enter__(self):
                return self

            def __exit__(self, *a: object) -> None:
                pass

        return Listing(entries)

    monkeypatch.setattr(walking, "list_folder", listing_then_delete)
    r = scan_residency(ddir)
    assert r.files == 1 and r.skipped == {"vanished": 2}
    assert sum("vanished" in p for p in r.problems) == 2


@pytest.mark.parametrize("err", [errno.EACCES, errno.EPERM, errno.EINVAL, errno.ENOENT])
def test_a_listing_that_fails_part_way_is_skipped_and_counted(
    ddir: Path, monkeypatch: pytest.MonkeyPatch, err: int
) -> None:
    """getdents failing after the folder opened (root on /proc/PID/fdinfo: EACCES; a /proc/PID that ends: ENOENT)."""
    make_file(ddir / "top.bin", PS)
    for name in ("one.bin", "two.bin"):
        make_file(ddir / "sub" / name, 2 * PS)
    real = walking.list_folder
    sub_ino = (ddir / "sub").stat().st_ino

    class Failing:  # the real listing, failing with `err` after its first entry
        def __init__(self, fd: int) -> None:
            self.it = real(fd)

        def __enter__(self) -> Failing:
            return self

        def __exit__(self, *a: object) -> None:
            self.it.close()

        def __iter__(self) -> Failing:
            self.n = 0
            return self

        def __next__(self) -> os.DirEntry[str]:
            self.n += 1
            if self.n > 1:
                raise OSError(err, os.strerror(err))
            return next(self.it)

    def listing(fd: int) -> object:
        return Failing(fd) if os.fstat(fd).st_ino == sub_ino else real(fd)

    monkeypatch.setattr(walking, "list_folder", listing)
    r = scan_residency(ddir)
    assert r.files == 2 and r.pages == 1 + 2  # top.bin and the one entry listed in sub
    assert sum(r.skipped.values()) == 1 and any(str(ddir / "sub") in p for p in r.problems)
    sub_ino = ddir.stat().st_ino  # the PATH itself failing to list is the caller's error
    with pytest.raises(OSError):
        scan_residency(ddir)


@needs_root
def test_residency_of_proc_as_root_skips_what_it_cannot_list() -> None:
    r = subprocess.run([sys.executable, "-m", "dltop", "residency", "/proc", "--json"], capture_output=True,
                       text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    node = json.loads(r.stdout)["paths"][0]
    assert "unavailable" not in node and node["files"] > 0 and node["dirs"] > 1
    text = subprocess.run([sys.executable, "-m", "dltop", "residency", "/proc"], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert text.returncode == 0 and "/proc: skipped " in text.stdout


@needs_root
def test_a_folder_nobody_may_list_is_skipped_and_counted(ddir: Path) -> None:
    make_file(ddir / "ok.bin", PS)
    make_file(ddir / "closed" / "inner" / "x.bin", PS)
    os.chmod(ddir / "closed", 0)
    try:
        code = "import sys; from dltop.cli import main; sys.exit(main(['residency', sys.argv[1]]))"
        r = run_as_nobody(code, str(ddir))
    finally:
        os.chmod(ddir / "closed", 0o755)
    assert r.returncode == 0, r.stderr
    assert "skipped 1 unreadable" in r.stdout and f"permission denied: {ddir / 'closed'}" in r.stdout


def test_ignore_and_include_patterns(ddir: Path) -> None:
    make_file(ddir / "keep.jpg", PS)
    make_file(ddir / "skip.tmp", 2 * PS)
    make_file(ddir / ".cache" / "big.jpg", 4 * PS)
    r = scan_residency(ddir, WalkOptions(ignore=("*.tmp", ".cache")))
    assert (r.files, r.pages, r.skipped) == (1, 1, {"ignored": 2})
    r = scan_residency(ddir, WalkOptions(include=("*.jpg",)))
    assert (r.files, r.pages) == (2, 5)


@needs_root
def test_one_filesystem_unless_asked(ddir: Path) -> None:
    make_file(ddir / "disk.bin", PS)
    m = ddir / "mnt"
    m.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(m)], check=True)
    try:
        (m / "ram.bin").write_bytes(os.urandom(2 * PS))
        r = scan_residency(ddir)
        assert (r.files, r.skipped) == (1, {"other_filesystem": 1})
        r = scan_residency(ddir, WalkOptions(cross_filesystems=True))
        assert (r.files, r.pages, r.resident_pages) == (2, 3, 2)  # tmpfs pages are always resident
    finally:
        subprocess.run(["umount", str(m)], check=True)


@needs_root
def test_overlayfs_tree_falls_back_to_mincore(ddir: Path) -> None:
    lower, upper, work, merged = (ddir / n for n in ("lower", "upper", "work", "merged"))
    for d in (lower, upper, work, merged):
        d.mkdir()
    make_file(lower / "x.bin", 20 * PS)
    make_file(lower / "y.bin", 5 * PS)
    r = subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                        f"lowerdir={lower},upperdir={upper},workdir={work}", str(merged)], capture_output=True)
    if r.returncode != 0:
        pytest.skip("cannot mount overlayfs")
    try:
        read_file(merged / "x.bin")
        r = scan_residency(merged)
        assert (r.method, r.fs_type, r.resident_pages, r.pages) == ("mincore", "overlayfs", 20, 25)
    finally:
        subprocess.run(["umount", str(merged)], check=True)


@needs_root
def test_unprivileged_scan_counts_hidden_pages_as_unknown(ddir: Path) -> None:
    hidden = make_file(ddir / "root-644.bin", 8 * PS, mode=0o644)  # readable, not writable by nobody
    read_file(hidden)  # fully resident: a naive mincore would also say so for the evicted ones
    make_file(ddir / "root-644-cold.bin", 4 * PS, mode=0o644)
    shared = make_file(ddir / "world-666.bin", 6 * PS, mode=0o666)
    read_file(shared)
    make_file(ddir / "secret-600.bin", 2 * PS, mode=0o600)  # nobody cannot even open it
    (ddir / "closed").mkdir(mode=0o700)
    code = ("import json, sys\nfrom dltop.residency.scan import scan_residency\nfrom dltop.model.base import to_dict\n"
            "print(json.dumps(to_dict(scan_residency(sys.argv[1]))))")
    p = run_as_nobody(code, str(ddir))
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["files"] == 4 and r["pages"] == 8 + 4 + 6 + 2
    assert r["resident_pages"] == 6  # only the file nobody may write is measured; nothing is guessed
    assert r["unknown_pages"] == 8 + 4 + 2
    assert r["unknown_reason"] == NO_PERMISSION and "owner or as root" in NO_PERMISSION
    assert r["skipped"]["unreadable"] == 2  # secret-600.bin and the closed folder
    # As root every page is known, and agrees with what nobody was shown where nobody could see.
    root_view = scan_residency(ddir)
    assert (root_view.unknown_pages, root_view.resident_pages) == (0, 14)


def test_deadline_cancel_and_cpu_budget(ddir: Path) -> None:
    for i in range(30):
        make_file(ddir / f"d{i}" / "f.bin", 10)
    assert not scan_residency(ddir, deadline_s=0).complete
    ev = threading.Event()
    ev.set()
    cut = scan_residency(ddir, cancel=ev)
    assert not cut.complete and cut.files < 30
    full = scan_residency(ddir, cpu_fraction=0.5)
    assert full.complete and full.files == 30 and full.scan_duration_s > 0 and full.scanned_at > 0


def test_scan_paths_reports_a_missing_root_and_scans_the_rest(ddir: Path) -> None:
    make_file(ddir / "f.bin", PS)
    part = scan_paths((str(ddir / "nope"), str(ddir)))
    missing, found = part.paths
    assert isinstance(missing, DatasetUnavailable) and isinstance(found, DatasetResidency)
    assert missing.unavailable == f"no such file or directory: {ddir / 'nope'}" and missing.scanned_at > 0
    assert found.files == 1 and part.page_size == PS and part.scanned == (found,)
    # In JSON a missing dataset has its reason and no numbers at all (it used to read files 0, size 0), and it
    # comes back from JSON as what it was, not as an empty dataset.
    data = to_dict(part)
    assert data["paths"][0] == {"path": str(ddir / "nope"), "unavailable": missing.unavailable,
                                "scanned_at": missing.scanned_at}
    assert from_dict(DatasetsPart, json.loads(json.dumps(data))) == part


def test_dataset_deleted_while_watched_becomes_unavailable(ddir: Path) -> None:
    from dltop.sources.datasets import source

    watched = ddir / "ds"
    make_file(watched / "a" / "f.bin", 4 * PS)
    src = source(Settings(datasets=(str(watched),)))
    first = src.read()
    assert isinstance(first, DatasetsPart) and first.scanned[0].files == 1
    shutil.rmtree(watched)
    after = src.read()
    assert isinstance(after, DatasetsPart) and after.scanned == ()
    assert after.paths == (DatasetUnavailable(str(watched), f"no such file or directory: {watched}",
                                              after.paths[0].scanned_at),)


def test_snapshot_of_a_configured_dataset_that_is_missing(tmp_path: Path) -> None:
    """A dataset named in the config file but not there: the Snapshot says so (no zeros) and still comes out;
    one asked for with --dataset is a usage problem (test_cli: one line, exit 1)."""
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'datasets = ["{tmp_path / "gone"}"]\n')
    r = subprocess.run([sys.executable, "-m", "dltop", "snapshot", "--json", "--config", str(cfg)],
                       capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 0, r.stderr
    (entry,) = json.loads(r.stdout)["datasets"]["paths"]
    assert entry["unavailable"] == f"no such file or directory: {tmp_path / 'gone'}"
    assert "files" not in entry and "resident_pages" not in entry


def test_memory_grows_with_folders_not_files(ddir: Path) -> None:
    """The accumulator tree holds one object per folder kept; files leave only their numbers."""
    for i in range(2000):
        (ddir / f"f{i}").write_bytes(b"")
    r = scan_residency(ddir)
    assert r.files == 2000 and r.children == ()


def test_snapshot_round_trip_and_source(ddir: Path) -> None:
    build_tree(ddir)
    src = datasets_source(Settings(datasets=(str(ddir),)))
    assert src.name == "datasets" and src.interval_s >= 10
    part = src.read()
    assert isinstance(part, DatasetsPart) and part.paths[0].files == 6
    snap = Snapshot(ts=1.0, host="h", datasets=part)
    assert Snapshot.from_json(snap.to_json()) == snap
    node = snap.to_dict()["datasets"]["paths"][0]
    for key in ("path", "files", "size_bytes", "pages", "resident_pages", "dirty_pages", "unknown_pages",
                "children"):
        assert key in node
    from dltop.sources.registry import build_sources

    assert "datasets" in [s.name for s in build_sources(Settings(datasets=(str(ddir),)))]
    # with no dataset given, the source runs to find the datasets training jobs read, unless --no-discover
    assert "datasets" in [s.name for s in build_sources(Settings())]
    assert "datasets" not in [s.name for s in build_sources(Settings(discover=False))]


def test_residency_visible_owner_and_writer(ddir: Path) -> None:
    f = make_file(ddir / "mine.bin", PS)
    st = f.stat()
    assert kernel.residency_visible(st, str(f))


def test_walk_in_inode_order_and_in_shards(ddir: Path) -> None:
    for i in range(40):
        make_file(ddir / ("a" if i % 3 else "b") / f"f{i:02}.bin", PS)
    os.link(ddir / "a" / "f01.bin", ddir / "b" / "alias.bin")

    def names(**kw: object) -> list[str]:
        it = walking.walk(str(ddir), WalkOptions(), WalkReport(), walking.FolderTotals(str(ddir)), **kw)  # type: ignore[arg-type]
        return [f"{d.path}/{name}" for d, _fd, name, _follow in it]

    plain = names()
    ordered = names(by_inode=True)
    assert sorted(ordered) == sorted(plain) and len(plain) == 41
    for folder in ("a", "b"):  # within a folder: inode order, whatever order readdir gives
        inos = [os.stat(p).st_ino for p in ordered if p.startswith(f"{ddir}/{folder}/")]
        assert inos == sorted(inos)
    shards = [names(shard=(k, 3, 1)) for k in range(3)]
    assert sorted(sum(shards, [])) == sorted(plain)  # every file in exactly one shard
    assert all(shards)
    owner = next(k for k, s in enumerate(shards) if f"{ddir}/a/f01.bin" in s)
    assert f"{ddir}/b/alias.bin" in shards[owner]  # hard links of a file go to the same process
