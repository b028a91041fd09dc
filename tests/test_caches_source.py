"""The caches source: every tool's path resolved as the tool resolves it (checked against the tools' own code
where they are installed), another process's environment, and walks sized as du -B1 and find count them."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dltop.derive import cache_growth
from dltop.model import Snapshot
from dltop.model.caches import CacheInfo, CachesPart
from dltop.sources import caches as src
from tests.conftest import strict_json
from tests.test_caches_util import (
    REPO,
    clean_env,
    du_bytes,
    find_files,
    inductor_cache_fixture,  # noqa: F401  (the `inductor_cache` fixture)
)
from tests.test_pagecache_util import (
    IS_ROOT,
    NOBODY,
    ddir_fixture,  # noqa: F401  (the `ddir` fixture: a folder nobody can traverse)
)


def env_of(home: Path, **variables: str) -> src.Environment:
    return src.environment_of({"HOME": str(home), **variables}, os.getuid(), "test", cwd="/")


def paths(e: src.Environment, extra: tuple[str, ...] = ()) -> dict[str, tuple[str, str]]:
    return {loc.name: (loc.path, loc.source) for loc in src.resolve(e, extra)}


# -- resolution ---------------------------------------------------------------------------------------------

# Per tool, its rules from most to least specific: (variable set, value, the path it gives). The last rule of
# each is the default (no variable). A test sets every variable, then removes them one at a time.
ORDER: dict[str, list[tuple[str | None, str, str]]] = {
    "torchinductor": [("TORCHINDUCTOR_CACHE_DIR", "/v/ind", "/v/ind"),
                      ("TMPDIR", "{tmp}", "{tmp}/torchinductor_alice"),
                      (None, "", "/tmp/torchinductor_alice")],
    "triton": [("TRITON_CACHE_DIR", "/v/tc", "/v/tc"), ("TRITON_HOME", "/v/th", "/v/th/.triton/cache"),
               (None, "", "{home}/.triton/cache")],
    "cuda": [("CUDA_CACHE_PATH", "/v/cc", "/v/cc"), (None, "", "{home}/.nv/ComputeCache")],
    "torch_extensions": [("TORCH_EXTENSIONS_DIR", "/v/te", "/v/te"),
                         ("XDG_CACHE_HOME", "/v/xdg", "/v/xdg/torch_extensions"),
                         (None, "", "{home}/.cache/torch_extensions")],
    "torch_hub": [("TORCH_HOME", "/v/th2", "/v/th2/hub"), ("XDG_CACHE_HOME", "/v/xdg", "/v/xdg/torch/hub"),
                  (None, "", "{home}/.cache/torch/hub")],
    "hf_hub": [("HF_HUB_CACHE", "/v/hub", "/v/hub"), ("HUGGINGFACE_HUB_CACHE", "/v/legacy", "/v/legacy"),
               ("HF_HOME", "/v/hf", "/v/hf/hub"), ("XDG_CACHE_HOME", "/v/xdg", "/v/xdg/huggingface/hub"),
               (None, "", "{home}/.cache/huggingface/hub")],
    "hf_datasets": [("HF_DATASETS_CACHE", "/v/ds", "/v/ds"), ("HF_HOME", "/v/hf", "/v/hf/datasets"),
                    ("XDG_CACHE_HOME", "/v/xdg", "/v/xdg/huggingface/datasets"),
                    (None, "", "{home}/.cache/huggingface/datasets")],
    "vllm": [("VLLM_CACHE_ROOT", "/v/vllm", "/v/vllm"), ("XDG_CACHE_HOME", "/v/xdg", "/v/xdg/vllm"),
             (None, "", "{home}/.cache/vllm")],
    "flashinfer": [("FLASHINFER_WORKSPACE_BASE", "/v/fi", "/v/fi/.cache/flashinfer"),
                   (None, "", "{home}/.cache/flashinfer")],
    "deep_gemm": [("DG_JIT_CACHE_DIR", "/v/dg", "/v/dg"), (None, "", "{home}/.deep_gemm")],
    "jax": [("JAX_COMPILATION_CACHE_DIR", "/v/jax", "/v/jax"), (None, "", "")],
}


@pytest.mark.parametrize("name", sorted(ORDER))
def test_each_tools_variables_apply_in_its_order(name: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    rules = [(var, value.format(tmp=tmp), want.format(home=home, tmp=tmp)) for var, value, want in ORDER[name]]
    variables = {var: value for var, value, _ in rules if var is not None}
    for var, _, want in rules:
        e = src.environment_of({"HOME": str(home), "USER": "alice", **variables}, os.getuid(), "t")
        got = paths(e).get(name)
        if not want:
            assert got is None  # JAX keeps no cache unless told where
        else:
            assert got is not None and got[0] == want, (var, got)
            assert (var or "default") in got[1] or (var and var in got[1])
        if var is not None:
            del variables[var]


def test_the_source_says_which_rule_applied(tmp_path: Path) -> None:
    e = env_of(tmp_path, USER="bob", TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "ind"))
    got = paths(e)
    assert got["torchinductor"] == (str(tmp_path / "ind"), "TORCHINDUCTOR_CACHE_DIR")
    e = env_of(tmp_path, USER="bob/x")
    path, source = paths(e)["torchinductor"]
    # getpass.getuser() sanitized as cache_dir_utils does it: '/' becomes '_'
    assert path.endswith("/torchinductor_bob_x") and source.startswith("default: <tempdir>/torchinductor_<user>")
    assert paths(e)["cuda"][1] == "default: ~/.nv/ComputeCache"
    cuda = next(loc for loc in src.resolve(env_of(tmp_path, CUDA_CACHE_MAXSIZE="4294967296")) if loc.name == "cuda")
    assert cuda.settings == {"CUDA_CACHE_MAXSIZE": "4294967296", "CUDA_CACHE_DISABLE": "not set (the driver's default)"}


def test_user_added_caches_and_relative_paths(tmp_path: Path) -> None:
    e = dataclasses.replace(env_of(tmp_path, TRITON_CACHE_DIR="rel/triton"), cwd=str(tmp_path / "job"))
    got = paths(e, (str(tmp_path / "mine"),))
    assert got["triton"][0] == str(tmp_path / "job/rel/triton")  # the job's working folder, not dltop's
    assert got[str(tmp_path / "mine")][1].startswith("added by you")


TOOLS_SAY = """
import json, os
from torch._inductor.runtime.cache_dir_utils import cache_dir
import torch.hub, torch.utils.cpp_extension as ext
from huggingface_hub import constants
build = ext._get_build_directory("x", False)
print(json.dumps({"torchinductor": cache_dir(), "torch_hub": torch.hub.get_dir(),
                  "torch_extensions": os.path.dirname(build if os.environ.get("TORCH_EXTENSIONS_DIR")
                                                      else os.path.dirname(build)),
                  "hf_hub": constants.HF_HUB_CACHE}))
"""


@pytest.mark.parametrize("variables", [
    {},
    {"XDG_CACHE_HOME": "{t}/xdg", "HF_HOME": "{t}/hf", "TMPDIR": "{t}/tmp"},
    {"TORCHINDUCTOR_CACHE_DIR": "{t}/ind", "TORCH_HOME": "{t}/th", "TORCH_EXTENSIONS_DIR": "{t}/te",
     "HF_HUB_CACHE": "{t}/hub", "HUGGINGFACE_HUB_CACHE": "{t}/legacy"},
    {"HUGGINGFACE_HUB_CACHE": "{t}/legacy", "USER": "someone"},
], ids=["defaults", "homes", "every-variable", "legacy"])
def test_paths_match_what_the_tools_themselves_say(tmp_path: Path, variables: dict[str, str]) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("huggingface_hub")
    (tmp_path / "tmp").mkdir()
    filled = {k: v.format(t=tmp_path) for k, v in variables.items()}
    env = clean_env(tmp_path / "home", **filled)
    r = subprocess.run([sys.executable, "-c", TOOLS_SAY], env=env, capture_output=True, text=True, timeout=300,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    said = json.loads(r.stdout.strip().splitlines()[-1])
    ours = paths(src.environment_of(env, os.getuid(), "t", cwd=str(tmp_path)))
    for name, path in said.items():
        assert ours[name][0] == os.path.realpath(path) if name == "torch_extensions" else ours[name][0] == path, name


def test_another_process_environment_places_its_caches(tmp_path: Path) -> None:
    env = clean_env(tmp_path / "jobhome", TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "job-ind"),
                    HF_HOME=str(tmp_path / "hf"), USER="trainer")
    (tmp_path / "jobcwd").mkdir()
    job = subprocess.Popen([sys.executable, "-c", "import time; print(flush=True); time.sleep(60)"],
                           env={**env, "TRITON_CACHE_DIR": "t"}, cwd=tmp_path / "jobcwd", stdout=subprocess.PIPE)
    try:
        job.stdout.readline()  # it runs (before its exec, /proc/PID/environ is still the parent's)
        e = src.process_environment(job.pid)
        assert e.pid == job.pid and e.user == "trainer" and e.home == str(tmp_path / "jobhome")
        got = paths(e)
        assert got["torchinductor"] == (str(tmp_path / "job-ind"), "TORCHINDUCTOR_CACHE_DIR")
        assert got["hf_hub"][0] == str(tmp_path / "hf/hub")
        assert got["triton"][0] == str(tmp_path / "jobcwd/t")  # relative: from the job's working folder
        assert got["cuda"][0] == str(tmp_path / "jobhome/.nv/ComputeCache")
        part = src.read_caches(e)
        assert part.pid == job.pid and f"PID {job.pid}" in part.environment
    finally:
        job.kill()
        job.wait()


@pytest.mark.skipif(not IS_ROOT, reason="needs root (setpriv to run the reader as nobody)")
def test_another_users_environment_is_unavailable_with_the_reason(tmp_path: Path) -> None:
    job = subprocess.Popen([sys.executable, "-c", "import time; print(flush=True); time.sleep(60)"],
                           stdout=subprocess.PIPE)
    try:
        job.stdout.readline()
        code = (f"from dltop.sources.caches import CachesReader, process_environment; "
                f"print(CachesReader(lambda: process_environment({job.pid}), (), '/').read())")
        r = subprocess.run([*NOBODY, sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
        assert r.returncode == 0, r.stderr
        assert "unavailable (permission denied" in r.stdout and "run dltop as that user or as root" in r.stdout
    finally:
        job.kill()
        job.wait()


# -- walks --------------------------------------------------------------------------------------------------


def _read(path: Path, name: str = "torchinductor", **variables: str) -> CacheInfo:
    e = env_of(path.parent / "home", TORCHINDUCTOR_CACHE_DIR=str(path), **variables)
    info = src.read_caches(e).get(name)
    assert info is not None
    return info


def test_a_real_inductor_cache_is_sized_as_du_and_find_count_it(inductor_cache: Path) -> None:
    info = _read(inductor_cache)
    assert info.exists and info.complete and info.source == "TORCHINDUCTOR_CACHE_DIR"
    assert info.size_bytes == du_bytes(inductor_cache)
    assert info.files == find_files(inductor_cache) and info.files > 0
    kinds = {e.name: e.kind for e in info.entries}
    assert kinds["fxgraph"] == "FX graph cache" and "generated code" in kinds.values()
    assert sum(e.size_bytes for e in info.entries) == info.size_bytes - os.lstat(inductor_cache).st_blocks * 512
    assert [e.size_bytes for e in info.entries] == sorted((e.size_bytes for e in info.entries), reverse=True)
    newest = max(p.stat().st_mtime for p in inductor_cache.rglob("*") if p.is_file() and not p.is_symlink())
    assert info.newest_mtime == newest and info.oldest_mtime is not None and info.oldest_mtime <= newest


def test_hard_links_symlinks_loops_and_odd_names_are_counted_as_du_counts_them(tmp_path: Path) -> None:
    cache = tmp_path / "c"
    (cache / "a" / "b").mkdir(parents=True)
    (cache / "a" / "f").write_bytes(os.urandom(10000))
    os.link(cache / "a" / "f", cache / "a" / "b" / "hard")  # once in bytes, twice in find -type f
    (tmp_path / "outside").write_bytes(os.urandom(50000))
    os.symlink(tmp_path / "outside", cache / "a" / "out")  # its target is never counted
    os.symlink("loop", cache / "loop")  # a symlink to itself
    os.symlink("..", cache / "a" / "b" / "up")  # a folder loop, never followed
    odd = os.path.join(os.fsencode(cache), b"n\xffme")
    with open(odd, "wb") as f:
        f.write(b"x" * 5000)
    info = _read(cache)
    assert info.size_bytes == du_bytes(cache) and info.files == find_files(cache) == 3
    assert info.noted["symlink"] == 3 and info.noted["non_utf8_name"] == 1
    assert any("name not UTF-8" in p and "\\xff" in p for p in info.problems)
    snap = Snapshot(ts=1.0, host="t", caches=CachesPart((info,)))
    strict_json(snap.to_json())  # valid UTF-8 JSON, the odd name in display form
    assert Snapshot.from_json(snap.to_json()) == snap  # and back exactly (its bytes in the _b64 sibling)


def test_an_entry_that_vanishes_between_listing_and_stat_is_noted(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "c"
    cache.mkdir()
    for i in range(5):
        (cache / f"f{i}").write_bytes(b"x" * 100)
    real = os.listdir

    def racing(fd):  # list, then delete one listed file before its stat
        names = real(fd)
        (cache / "f3").unlink(missing_ok=True)
        return names

    monkeypatch.setattr(src, "_listdir", racing)
    info = _read(cache)
    assert info.files == 4 and info.noted == {"vanished": 1} and info.size_bytes == du_bytes(cache)


@pytest.mark.skipif(not IS_ROOT, reason="needs root (setpriv to walk as nobody)")
def test_an_unreadable_folder_is_counted_and_noted_never_fatal(ddir: Path) -> None:
    cache = ddir / "c"
    (cache / "open").mkdir(parents=True)
    (cache / "open" / "f").write_bytes(b"x" * 9000)
    (cache / "shut").mkdir()
    (cache / "shut" / "g").write_bytes(b"x" * 9000)
    os.chmod(cache / "shut", 0o700)  # root's, closed to nobody
    os.chmod(cache, 0o755)
    code = (f"from dltop.sources.caches import walk_cache; w = walk_cache({str(cache)!r}); "
            "print(w.files, w.noted, w.problems[0])")
    r = subprocess.run([*NOBODY, sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"1 {{'unreadable': 1}} permission denied: {cache}/shut"  # the path once


def test_a_walk_cut_short_by_its_budget_keeps_the_last_whole_one(tmp_path: Path) -> None:
    cache = tmp_path / "c"
    for d in range(4):
        (cache / f"d{d}").mkdir(parents=True)
        for i in range(800):
            (cache / f"d{d}" / f"f{i}").touch()
    cut = src.walk_cache(str(cache), deadline_s=0.0)
    assert not cut.complete and cut.files < 3200
    e = env_of(tmp_path / "home", TORCHINDUCTOR_CACHE_DIR=str(cache))
    whole = src.read_caches(e)
    again = src.read_caches(e, last={c.name: c for c in whole.caches}, deadline_s=0.0)
    assert again.get("torchinductor") == whole.get("torchinductor")  # not the partial one
    first = src.read_caches(e, deadline_s=0.0).get("torchinductor")
    assert first is not None and not first.complete and first.files is not None and first.files < 3200


def test_lock_files_say_whether_a_process_holds_them(tmp_path: Path) -> None:
    cache = tmp_path / "c"
    (cache / "locks").mkdir(parents=True)
    held, free = cache / "locks" / "a.lock", cache / "locks" / "b.lock"
    held.touch()
    free.touch()
    with open(held) as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        info = _read(cache)
    assert {(Path(lk.path).name, lk.held) for lk in info.locks} == {("a.lock", True), ("b.lock", False)}


def test_where_a_cache_lives(tmp_path: Path) -> None:
    info = _read(tmp_path / "missing")
    assert not info.exists and info.size_bytes is None and "no such folder" in info.unavailable["size_bytes"]
    assert info.mount_point and info.fs_type and info.fs_total_bytes and info.fs_free_bytes is not None
    shm = _read(Path("/dev/shm/dltop-test-missing"))
    assert shm.fs_type == "tmpfs" and shm.under_tempdir == "/dev/shm"


def test_a_hub_cache_is_sized_from_blobs_and_read_by_huggingface_hub(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    hub = tmp_path / "hub"
    repo = hub / "models--org--model"
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    for rev, blob in (("a" * 40, "b1"), ("c" * 40, "b2")):
        (repo / "blobs" / blob).write_bytes(os.urandom(200_000))
        (repo / "snapshots" / rev).mkdir(parents=True)
        os.symlink(f"../../blobs/{blob}", repo / "snapshots" / rev / "model.safetensors")
    (repo / "refs" / "main").write_text("a" * 40)  # c... is detached
    info = _read(tmp_path / "ind", "hf_hub", HF_HUB_CACHE=str(hub))
    assert info.size_bytes == du_bytes(hub) and info.files == 3  # two blobs and refs/main; the links are links
    assert info.size_bytes < 2 * 200_000 + 64 * 1024  # the blobs once, not again through snapshots/
    entry = info.entries[0]
    assert (entry.name, entry.kind, entry.detail) == ("models--org--model", "model", "2 revisions, 1 detached")
    assert "hf cache rm" in info.clear_command
    import builtins

    real_import = builtins.__import__

    def no_hub(name, *a, **kw):
        if name.startswith("huggingface_hub"):
            raise ImportError(name)
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_hub)
    repos = src.hub_repos(str(hub))  # from the layout
    assert {k: (r.repo_id, r.detail) for k, r in repos.items()} == {
        "models--org--model": ("org/model", "2 revisions, 1 detached")}
    assert [(e.name, e.detail) for e in repos["models--org--model"].revisions] == [
        ("a" * 40, "refs: main"), ("c" * 40, "detached (no ref names it)")]


def test_growth_since_the_first_snapshot(tmp_path: Path) -> None:
    cache = tmp_path / "c"
    cache.mkdir()
    e = env_of(tmp_path / "home", TORCHINDUCTOR_CACHE_DIR=str(cache))
    first = Snapshot(ts=1.0, host="t", caches=src.read_caches(e))
    (cache / "new").write_bytes(os.urandom(1 << 20))
    later = Snapshot(ts=61.0, host="t", caches=src.read_caches(e))
    grew = cache_growth(first, later)
    assert grew["torchinductor"] == du_bytes(cache) - first.caches.get("torchinductor").size_bytes  # type: ignore
    assert "triton" not in grew  # missing before and after: no number, never 0


# -- parsers of text someone else wrote ----------------------------------------------------------------------


def test_proc_locks_from_the_real_kernel(tmp_path: Path) -> None:
    f = tmp_path / "x.lock"
    f.touch()
    st = f.stat()
    with open(f) as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        assert (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino) in src.read_proc_locks()
    time.sleep(0)  # released on close
    assert (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino) not in src.read_proc_locks()


@given(st.text(max_size=2000))
def test_proc_locks_parser_never_crashes(text: str) -> None:
    assert isinstance(src.parse_proc_locks(text), set)


@given(st.text(max_size=2000))
def test_mountinfo_parser_never_crashes(text: str) -> None:
    for m in src.parse_mountinfo(text):
        assert isinstance(m.point, str)


@given(st.binary(max_size=2000))
def test_environ_parser_never_crashes(data: bytes) -> None:
    for k, v in src.parse_environ(data).items():
        assert os.fsencode(k) and "\0" not in k and "\0" not in v


def test_real_mountinfo_finds_the_mount_of_proc() -> None:
    with open("/proc/self/mountinfo") as f:
        mounts = src.parse_mountinfo(f.read())
    m = src.mount_of("/proc/self", mounts)
    assert m is not None and m.point == "/proc" and m.fs_type == "proc"
    root = src.mount_of("/", mounts)
    assert root is not None and root.point == "/"
