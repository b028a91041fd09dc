"""`dltop caches` and `dltop caches clear` as subprocesses, `snapshot --json` with caches, and the cache hints
drawn from real readings."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dltop import hints
from dltop.hints import caches as cache_hints
from dltop.model import Snapshot
from dltop.sources import caches as src
from tests.conftest import strict_json
from tests.test_caches_util import REPO, clean_env, du_bytes, find_files
from tests.test_pagecache_util import NOBODY, ddir_fixture, needs_root  # noqa: F401  (the `ddir` fixture)


def dltop(*args: str, env: dict[str, str] | None = None, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dltop", *args], capture_output=True, text=True, env=env,
                          cwd=REPO, input=stdin, timeout=300)


def _tree(root: Path) -> Path:
    for d in range(3):
        (root / f"k{d}").mkdir(parents=True)
        for i in range(5):
            (root / f"k{d}" / f"f{i}.so").write_bytes(os.urandom(3000 * (d + 1)))
    return root


def test_caches_json_is_what_du_and_find_say(tmp_path: Path) -> None:
    cache = _tree(tmp_path / "ind")
    r = dltop("caches", "--json", env=clean_env(tmp_path / "home", TORCHINDUCTOR_CACHE_DIR=str(cache)))
    assert r.returncode == 0, r.stderr
    data = strict_json(r.stdout)
    ind = next(c for c in data["caches"] if c["name"] == "torchinductor")
    assert set(ind) >= {"name", "path", "source", "exists", "size_bytes", "files", "newest_mtime", "warnings"}
    assert (ind["path"], ind["source"], ind["exists"]) == (str(cache), "TORCHINDUCTOR_CACHE_DIR", True)
    assert ind["size_bytes"] == du_bytes(cache) and ind["files"] == find_files(cache) == 15
    assert any("under /tmp" in w for w in ind["warnings"])  # tmp_path is under /tmp
    triton = next(c for c in data["caches"] if c["name"] == "triton")
    assert triton["exists"] is False and triton["size_bytes"] == {"unavailable": f"no such folder: "
                                                                 f"{tmp_path}/home/.triton/cache"}


def test_caches_of_another_process_with_pid(tmp_path: Path) -> None:
    cache = _tree(tmp_path / "jobcache")
    env = clean_env(tmp_path / "jobhome", TORCHINDUCTOR_CACHE_DIR=str(cache))
    job = subprocess.Popen([sys.executable, "-c", "import time; print(flush=True); time.sleep(60)"], env=env,
                           stdout=subprocess.PIPE)
    try:
        job.stdout.readline()
        r = dltop("caches", "--json", "--pid", str(job.pid))  # dltop's own environment has none of it
        assert r.returncode == 0, r.stderr
        data = strict_json(r.stdout)
        assert f"PID {job.pid}" in data["environment"]
        ind = next(c for c in data["caches"] if c["name"] == "torchinductor")
        assert ind["path"] == str(cache) and ind["size_bytes"] == du_bytes(cache)
        assert next(c for c in data["caches"] if c["name"] == "cuda")["path"] == f"{tmp_path}/jobhome/.nv/ComputeCache"
    finally:
        job.kill()
        job.wait()


@needs_root
def test_another_users_process_is_unavailable_in_json() -> None:
    job = subprocess.Popen([sys.executable, "-c", "import time; print(flush=True); time.sleep(60)"],
                           stdout=subprocess.PIPE)
    try:
        job.stdout.readline()
        r = subprocess.run([*NOBODY, sys.executable, "-m", "dltop", "caches", "--json", "--pid", str(job.pid)],
                           capture_output=True, text=True, cwd=REPO, env={**os.environ, "HOME": "/"})
        assert r.returncode == 1
        assert list(json.loads(r.stdout)) == ["unavailable"] and "permission denied" in json.loads(r.stdout)[
            "unavailable"]
    finally:
        job.kill()
        job.wait()


def test_clear_by_name_with_yes_dry_run_and_without_a_terminal(tmp_path: Path) -> None:
    cache = _tree(tmp_path / "ind")
    env = clean_env(tmp_path / "home", TORCHINDUCTOR_CACHE_DIR=str(cache))
    files = find_files(cache)
    r = dltop("caches", "clear", "torchinductor", "--dry-run", env=env)
    assert r.returncode == 0 and r.stdout.startswith("would clear ") and f"in {files} files under {cache}" in r.stdout
    r = dltop("caches", "clear", "torchinductor", env=env, stdin="y\n")  # stdin is not a terminal: no asking
    assert r.returncode == 1 and "no terminal to ask on; give --yes" in r.stderr and find_files(cache) == files
    before = du_bytes(cache)
    r = dltop("caches", "clear", "torchinductor", "--yes", "--json", env=env)
    assert r.returncode == 0, r.stderr
    out = strict_json(r.stdout)
    assert out["files_done"] == files and out["done_bytes"] == before - du_bytes(cache) and find_files(cache) == 0


@pytest.mark.parametrize("args, code, pattern", [
    (["caches", "frob"], 2, r"^dltop: error: expected `clear NAME`, got 'frob' \(see dltop caches --help\)$"),
    (["caches", "clear"], 2, r"^dltop: error: expected `clear NAME`"),
    (["caches", "--yes"], 2, r"^dltop: error: --yes and --dry-run go with `clear NAME`"),
    (["caches", "clear", "nope", "--yes"], 1, r"^dltop: no cache called 'nope' \(known: torchinductor, (torchinductor_headers, )?triton, "),
    (["caches", "clear", "/", "--yes"], 1, r"^dltop: refused: / is a system folder, not a cache$"),
    (["caches", "clear", "/etc", "--yes"], 1, r"^dltop: refused: /etc is a system folder, not a cache$"),
    (["caches", "--pid", "999999999"], 1, r"^dltop: no such process: 999999999$"),
])
def test_bad_input_is_one_line(args: list[str], code: int, pattern: str) -> None:
    r = dltop(*args)
    assert r.returncode == code, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and re.search(pattern, r.stderr.strip()), r.stderr


def test_snapshot_json_has_the_caches(tmp_path: Path) -> None:
    cache = _tree(tmp_path / "ind")
    r = dltop("snapshot", "--json", "--cache", str(tmp_path / "mine"),
              env=clean_env(tmp_path / "home", TORCHINDUCTOR_CACHE_DIR=str(cache)))
    assert r.returncode == 0, r.stderr
    snap = Snapshot.from_json(r.stdout)
    part = snap.caches
    assert part is not None and not isinstance(part, src.Unavailable)
    assert part.get("torchinductor").size_bytes == du_bytes(cache)  # type: ignore[union-attr]
    mine = part.get(str(tmp_path / "mine"))
    assert mine is not None and not mine.exists and mine.source.startswith("added by you")


# -- hints from real readings --------------------------------------------------------------------------------


def _snap(ts: float, home: Path, root: str = "/", **variables: str) -> Snapshot:
    # TMPDIR: Inductor's precompiled headers are under the temp dir; the machine's own /tmp is not this test's
    (home / "tmp").mkdir(exist_ok=True)
    e = src.environment_of({"HOME": str(home), "TMPDIR": str(home / "tmp"), **variables}, os.getuid(), "t", cwd="/")
    return Snapshot(ts=ts, host="t", caches=src.read_caches(e, root=root))


def _ids(*snaps: Snapshot) -> set[str]:
    return {h.id for h in hints.hints(list(snaps))}


def test_a_cache_under_tmp_warns_and_one_on_a_disk_does_not(tmp_path: Path, ddir: Path) -> None:
    _tree(tmp_path / "ind")
    assert "cache-on-temporary-storage" in _ids(_snap(1, tmp_path, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "ind")))
    _tree(ddir / "ind")  # /var/tmp outlives a reboot
    assert "cache-on-temporary-storage" not in _ids(_snap(1, ddir, TORCHINDUCTOR_CACHE_DIR=str(ddir / "ind")))


def test_a_cache_on_tmpfs_says_so(tmp_path: Path) -> None:
    shm = Path("/dev/shm") / f"dltop-test-{os.getpid()}"
    try:
        _tree(shm)
        c = _snap(1, tmp_path, TORCHINDUCTOR_CACHE_DIR=str(shm)).caches.get("torchinductor")  # type: ignore
        assert cache_hints.on_temporary_storage(c) == "on tmpfs (/dev/shm)"
    finally:
        import shutil

        shutil.rmtree(shm, ignore_errors=True)


def test_a_cache_on_nfs_warns(tmp_path: Path) -> None:
    # /proc/self/mountinfo as the kernel writes an NFS mount at the cache's folder
    root = tmp_path / "root"
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/mountinfo").write_text(
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
        f"95 22 0:52 / {tmp_path} rw,relatime shared:60 - nfs4 fs1:/export/cache rw,vers=4.2\n")
    _tree(tmp_path / "ind")
    snap = _snap(1, tmp_path, root=str(root), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "ind"))
    found = {h.id: h for h in hints.hints([snap])}
    assert "cache-on-slow-filesystem" in found and "nfs4" in found["cache-on-slow-filesystem"].text


@needs_root
def test_a_nearly_full_filesystem_is_critical(tmp_path: Path) -> None:
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], check=True)
    try:
        (mnt / "ind").mkdir()
        with open(mnt / "ind" / "big", "wb") as f:
            f.write(os.urandom(4 * 1024 * 1024 - 64 * 1024))
        found = {h.id: h for h in hints.hints([_snap(1, tmp_path, TORCHINDUCTOR_CACHE_DIR=str(mnt / "ind"))])}
        assert found["cache-filesystem-full"].severity == "critical"
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_stale_locks_and_other_versions(tmp_path: Path) -> None:
    te = tmp_path / "te"
    for key in ("py311_cpu", "py310_cu118"):
        (te / key / "ext").mkdir(parents=True)
        (te / key / "ext" / "ext.so").write_bytes(os.urandom(10000))
    lock = te / "py310_cu118" / "ext" / "lock.lock"
    lock.touch()
    os.utime(lock, (time.time() - 7200, time.time() - 7200))
    alone = {"HOME": str(tmp_path), "TORCH_EXTENSIONS_DIR": str(te),
             "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "none"),  # not the machine's /tmp/torchinductor_<user>
             "TMPDIR": str(tmp_path)}  # nor its precompiled headers
    e = src.environment_of(alone, os.getuid(), "t", version_key="py311_cpu")
    snap = Snapshot(ts=time.time(), host="t", caches=src.read_caches(e))
    found = {h.id: h for h in hints.hints([snap])}
    assert "py310_cu118" in found["cache-for-other-versions"].text
    assert found["cache-stale-locks"].numbers["locks"] == 1
    c = snap.caches.get("torch_extensions")  # type: ignore[union-attr]
    assert cache_hints.other_version_keys(c) == ("py310_cu118",)
    # another process's versions are not visible: both keys are named, neither is called the other one
    unknown = src.environment_of(alone, os.getuid(), "t")
    c2 = src.read_caches(unknown).get("torch_extensions")
    assert cache_hints.other_version_keys(c2) == () and any("2 versions" in w for w in cache_hints.warnings_for(c2))


def test_a_cache_growing_fast_warns(ddir: Path) -> None:
    cache = ddir / "ind"
    cache.mkdir()
    first = _snap(0, ddir, TORCHINDUCTOR_CACHE_DIR=str(cache))
    with open(cache / "grown", "wb") as f:
        os.posix_fallocate(f.fileno(), 0, 300 << 20)
    later = _snap(60, ddir, TORCHINDUCTOR_CACHE_DIR=str(cache))
    found = {h.id: h for h in hints.hints([first, later])}
    assert found["cache-growing"].numbers["grew_bytes"] == du_bytes(cache) - first.caches.get(  # type: ignore
        "torchinductor").size_bytes
    assert "cache-growing" not in _ids(later, _snap(120, ddir, TORCHINDUCTOR_CACHE_DIR=str(cache)))


def test_the_config_files_caches_and_the_text_report(tmp_path: Path) -> None:
    from dltop.fmt import human_bytes

    mine = _tree(tmp_path / "mine")
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'caches = ["{mine}"]\n')
    env = clean_env(tmp_path / "home", TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "none"))
    r = dltop("caches", "--config", str(cfg), env=env)
    assert r.returncode == 0, r.stderr
    row = next(line for line in r.stdout.splitlines() if line.startswith(str(mine)))
    assert re.search(rf"\s{re.escape(human_bytes(du_bytes(mine)))}\s+{find_files(mine)}\s", row), row
    assert f"    {mine}  (added by you" in r.stdout
    data = strict_json(dltop("caches", "--json", "--config", str(cfg), env=env).stdout)
    assert next(c for c in data["caches"] if c["path"] == str(mine))["files"] == find_files(mine)
    cfg.write_text('caches = "/x"\n')
    r = dltop("caches", "--config", str(cfg), env=env)
    assert r.returncode == 1 and r.stderr.strip() == f"dltop: {cfg}: caches must be a list of paths"


def test_the_same_reading_is_judged_again_when_a_lock_comes_of_age_and_a_new_one_at_once(tmp_path: Path) -> None:
    # The rules that read the latest caches part keep their judgement while the Sampler hands the same part to
    # every tick: a lock that turns an hour old later in that reading, and a new reading, are judged anew.
    te = tmp_path / "te"
    (te / "py311_cpu" / "ext").mkdir(parents=True)
    lock = te / "py311_cpu" / "ext" / "lock.lock"
    lock.touch()
    t = time.time()
    os.utime(lock, (t - 3500, t - 3500))  # 100 s short of stale
    alone = {"HOME": str(tmp_path), "TORCH_EXTENSIONS_DIR": str(te), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "none"),
             "TMPDIR": str(tmp_path)}
    part = src.read_caches(src.environment_of(alone, os.getuid(), "t", version_key="py311_cpu"))
    at = [Snapshot(ts=t + dt, host="t", caches=part) for dt in (0, 1, 99, 101, 102)]
    seen = [_ids(*at[: i + 1]) for i in range(len(at))]
    assert ["cache-stale-locks" in ids for ids in seen] == [False, False, False, True, True]
    lock.unlink()
    fresh = src.read_caches(src.environment_of(alone, os.getuid(), "t", version_key="py311_cpu"))
    assert "cache-stale-locks" not in _ids(*at, Snapshot(ts=t + 103, host="t", caches=fresh))
    # and a reading on temporary storage after one that is not: the new part's hint, not the kept None
    ind = _tree(tmp_path / "ind")
    on_tmp = src.read_caches(src.environment_of({**alone, "TORCHINDUCTOR_CACHE_DIR": str(ind)}, os.getuid(), "t"))
    assert "cache-on-temporary-storage" not in _ids(Snapshot(ts=t, host="t", caches=fresh))
    assert "cache-on-temporary-storage" in _ids(Snapshot(ts=t, host="t", caches=fresh),
                                                Snapshot(ts=t + 1, host="t", caches=on_tmp))
