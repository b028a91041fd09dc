"""A clear is confined: the rules a cache root must pass and each tool's layout, checked through `dltop caches
clear` as root and as nobody on real folders; and the bytes a clear frees counted per inode, checked against
statvfs on a private tmpfs (hard links inside and outside the cache, a file held open)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dltop import cache_roots
from dltop.actions import caches as clear_mod
from dltop.actions import confine
from dltop.actions.caches import ClearOptions
from dltop.actions.runner import ActionRunner
from dltop.fmt import printable
from tests.test_caches_util import REPO, clean_env, du_bytes, find_files
from tests.test_pagecache_util import IS_ROOT, NOBODY, needs_root

USERS = ["self", "nobody"] if IS_ROOT else ["self"]
MB = 5 << 20


def _chown_tree(root: Path, uid: int) -> None:
    for dirpath, dirs, files in os.walk(root):
        for n in [*dirs, *files]:
            os.lchown(os.path.join(dirpath, n), uid, uid)
    os.lchown(root, uid, uid)


@pytest.fixture
def base() -> Iterator[Path]:
    """A folder under /tmp that nobody can reach too (pytest's own tmp_path is root's, mode 700)."""
    d = Path(tempfile.mkdtemp(prefix="dltop-confine-", dir="/tmp"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _dltop(user: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    pre = NOBODY if user == "nobody" else []
    return subprocess.run([*pre, sys.executable, "-m", "dltop", *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=120)


def _case(name: str, base: Path) -> tuple[dict[str, str], list[str], str, str]:
    """(environment variables, `caches clear` arguments, refused_by, the words of the refusal) of one case."""
    home = base / "home"
    if name in ("/usr", "/etc", "/tmp"):
        return {"TORCHINDUCTOR_CACHE_DIR": name}, ["torchinductor"], "system folder", f"{name} is a system folder"
    if name == "home":
        return {"TORCHINDUCTOR_CACHE_DIR": str(home)}, ["torchinductor"], "home", f"{home} is a home folder"
    if name == "entry of a refused root":
        return ({"TORCHINDUCTOR_CACHE_DIR": str(home)}, [str(home / ".pyenv")], "home",
                f"{home / '.pyenv'} is inside {home}, which is refused: {home} is a home folder")
    if name == "venv":
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(base / "venv")], check=True)
        return ({"TORCHINDUCTOR_CACHE_DIR": str(base / "venv")}, ["torchinductor"], "python prefix",
                f"{base / 'venv'} is a Python prefix (pyvenv.cfg)")
    if name == "ancestor of a home":
        return ({"TORCHINDUCTOR_CACHE_DIR": str(base)}, ["torchinductor"], "ancestor",
                f"{base} holds the home folder {home}")
    if name == "foreign content":
        (base / "ind" / "fxgraph").mkdir(parents=True)
        (base / "ind" / "fxgraph" / "entry").write_bytes(b"x" * 5000)
        (base / "ind" / "bin").mkdir()
        (base / "ind" / "bin" / "python").write_bytes(b"#!")
        return ({"TORCHINDUCTOR_CACHE_DIR": str(base / "ind")}, ["torchinductor"], "foreign content",
                f"{base / 'ind'} holds 'bin/' which TorchInductor never writes")
    assert name == "user path with foreign content"
    (base / "stuff" / "bin").mkdir(parents=True)
    (base / "stuff" / "bin" / "python").write_bytes(b"#!")
    (base / "stuff" / "notes.txt").write_text("mine")
    return ({}, [str(base / "stuff"), "--cache", str(base / "stuff")], "foreign content",
            f"{base / 'stuff'} holds 'bin/' which none of the caches dltop knows write")


CASES = ["/usr", "/etc", "/tmp", "home", "entry of a refused root", "venv", "ancestor of a home", "foreign content",
         "user path with foreign content"]


@pytest.mark.parametrize("user", USERS)
@pytest.mark.parametrize("case", CASES)
def test_a_refused_clear_names_its_rule_in_text_and_json(base: Path, case: str, user: str) -> None:
    home = base / "home"
    (home / ".pyenv" / "versions").mkdir(parents=True)
    (home / ".pyenv" / "versions" / "python").write_bytes(b"p" * 4000)
    (home / ".bashrc").write_text("# mine\n")
    variables, what, rule, words = _case(case, base)
    if user == "nobody":
        _chown_tree(base, 65534)
    files = find_files(base)
    env = clean_env(home, **variables)
    r = _dltop(user, "caches", "clear", *what, "--dry-run", "--json", env=env)
    assert r.returncode == 1, r.stderr
    plan = json.loads(r.stdout)
    assert plan["allowed"] is False and plan["refused_by"] == rule and words in plan["guard"], plan
    r = _dltop(user, "caches", "clear", *what, "--yes", env=env)  # for real: refused the same way
    assert r.returncode == 1 and r.stderr.startswith("dltop: refused: ") and words in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert find_files(base) == files  # nothing removed


@pytest.mark.parametrize("user", USERS)
def test_a_cache_laid_out_as_its_tool_writes_it_is_cleared(base: Path, user: str) -> None:
    ind = base / "ind"
    for d in ("fxgraph", "aotautograd", "ab", "locks"):
        (ind / d).mkdir(parents=True)
        (ind / d / "entry").write_bytes(os.urandom(6000))
    (ind / "memoizer_cache.json").write_text("{}")
    if user == "nobody":
        _chown_tree(base, 65534)
    before = du_bytes(ind) - os.lstat(ind).st_blocks * 512
    env = clean_env(base / "home", TORCHINDUCTOR_CACHE_DIR=str(ind))
    r = _dltop(user, "caches", "clear", "torchinductor", "--yes", "--json", env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["done_bytes"] == before and out["files_done"] == 5 and out["not_freed"] == {}
    assert list(ind.iterdir()) == []


# -- the rules on their own ---------------------------------------------------------------------------------


def test_root_rules(tmp_path: Path) -> None:
    home_of = {str(tmp_path / "a" / "alice"): "alice", "/root": "root"}
    prefixes = {str(tmp_path / "opt" / "venv"): "sys.prefix"}

    def rule(p: str | Path) -> str | None:
        why = cache_roots.root_refusal(str(p), home_of=home_of, prefixes=prefixes)
        return None if why is None else why.rule

    assert rule("/usr") == rule("/var") == rule("/opt") == rule("/srv") == rule("/boot") == "system folder"
    assert rule("/usr/lib/python3/dist-packages") == rule("/etc/ssl") == "system folder"
    assert rule("/root") == "home" and rule(tmp_path / "a") == "ancestor" and rule(tmp_path / "opt") == "ancestor"
    assert rule(tmp_path / "opt" / "venv") == "python prefix"
    assert rule("/tmp/torchinductor_alice") is None and rule(tmp_path / "a" / "alice" / ".cache" / "x") is None
    os.symlink("/usr", tmp_path / "link")  # a path that resolves to a system folder
    why = cache_roots.root_refusal(str(tmp_path / "link"), home_of=home_of, prefixes=prefixes)
    assert why is not None and why.reason == f"/usr is a system folder, not a cache ({tmp_path / 'link'} resolves to it)"
    (tmp_path / "conda" / "conda-meta").mkdir(parents=True)
    (tmp_path / "sys" / "lib" / "python3.12" / "site-packages").mkdir(parents=True)
    assert cache_roots.prefix_marker(str(tmp_path / "conda")) == "conda-meta"
    assert cache_roots.prefix_marker(str(tmp_path / "sys")) == "lib/python3.12/site-packages"


LAYOUTS = {  # name: (what its tool writes, one thing it never writes)
    "torchinductor": (["fxgraph/", "aotautograd/", "triton/", "locks/", "c2/", "memoizer_cache.json"], "bin/"),
    "triton": (["RFJVVKA6HZKFN5EL2RSEXWLQYQ2DHK2B2F4OJGOQ6NUYQEXE5YRA/", "0123456789abcdef0123456789abcdef/"],
               "notes/"),
    "hf_hub": (["models--gpt2/", "datasets--squad/", ".locks/", "CACHEDIR.TAG"], "my-model/"),
    "torch_hub": (["checkpoints/", "pytorch_vision_main/", "trusted_list"], "data/"),
    "torch_extensions": (["py311_cu121/", "my_ext/"], "README.md"),
    "cuda": (["index", "0/", "a/"], "bin/"),
    "vllm": (["torch_compile_cache/", "modelinfos/"], "models/"),
    "flashinfer": (["0.2.5/", "cubins/", "80_89_90a/"], "src/"),
    "deep_gemm": (["cache/", "tmp/"], "include/"),
    "jax": (["jit_f-0123456789abcdef0123456789abcdef-cache", ".lockfile"], "data/"),
    "hf_datasets": (["downloads/", "rajpurkar___squad/"], "notes.txt"),
}


def _make(root: Path, names: list[str]) -> None:
    for n in names:
        if n.endswith("/"):
            (root / n).mkdir(parents=True)
        else:
            root.mkdir(parents=True, exist_ok=True)
            (root / n).write_text("")


@pytest.mark.parametrize("cache", sorted(LAYOUTS))
def test_each_tools_layout_is_allowed_and_anything_else_refused(cache: str, tmp_path: Path) -> None:
    good, bad = LAYOUTS[cache]
    root = tmp_path / cache
    _make(root, good)
    assert confine.layout_refusal(cache, str(root)) is None
    assert confine.layout_of("added", str(root)) != ""  # an added folder laid out as this tool's passes too
    _make(root, [bad])
    why = confine.layout_refusal(cache, str(root))
    assert why is not None and why.rule == "foreign content" and f"holds '{bad}' which" in why.reason


def test_a_folder_that_looks_like_an_extension_but_holds_a_venv_bin_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "ext"
    (root / "bin").mkdir(parents=True)  # an identifier: a TORCH_EXTENSIONS_DIR build folder could be called that
    (root / "bin" / "python").write_text("")
    why = confine.layout_refusal("torch_extensions", str(root))
    assert why is not None and "holds 'bin/python' which torch extensions never writes" in why.reason


# -- bytes counted per inode, measured ----------------------------------------------------------------------


@pytest.fixture
def cache_on_tmpfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A TorchInductor cache alone on a private tmpfs (as root), so statvfs' free space moves only with it;
    as another user, a folder on /tmp (statvfs not compared there)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    mounted = False
    if IS_ROOT:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)], check=True)
        mounted = True
    cache = mnt / "ind"
    (cache / "ab").mkdir(parents=True)
    (cache / "cd").mkdir()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    try:
        yield cache
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(mnt)], check=True)


def _five_mb(path: Path) -> Path:
    path.write_bytes(os.urandom(MB))
    return path


def _check_against_statvfs(r: clear_mod.ClearResult) -> None:
    if IS_ROOT:  # the tmpfs holds nothing else: what statvfs gained is what the clear freed
        assert r.fs_free_delta_bytes == r.done_bytes, (r.fs_free_delta_bytes, r.done_bytes)


def test_three_links_in_the_cache_count_once(cache_on_tmpfs: Path) -> None:
    f = _five_mb(cache_on_tmpfs / "ab" / "blob")
    os.link(f, cache_on_tmpfs / "ab" / "again")
    os.link(f, cache_on_tmpfs / "cd" / "third")
    blocks = os.stat(f).st_blocks * 512
    plan = ActionRunner().plan("clear", [str(cache_on_tmpfs)], wait=True).result
    assert plan.allowed and plan.files == 3 and plan.bytes == du_bytes(cache_on_tmpfs) - os.lstat(
        cache_on_tmpfs).st_blocks * 512
    r = clear_mod.clear(str(cache_on_tmpfs), ClearOptions())
    assert r.files_done == 3 and r.done_bytes == plan.bytes and r.done_bytes >= blocks
    assert r.not_freed == {} and not r.left_behind
    _check_against_statvfs(r)


def test_a_link_outside_the_cache_keeps_the_data_and_says_so(cache_on_tmpfs: Path) -> None:
    f = _five_mb(cache_on_tmpfs / "ab" / "blob")
    os.link(f, cache_on_tmpfs / "ab" / "again")
    os.link(f, cache_on_tmpfs.parent / "kept")  # outside the cache, same filesystem
    blocks = os.stat(f).st_blocks * 512
    plan = ActionRunner().plan("clear", [str(cache_on_tmpfs)], wait=True).result
    assert plan.bytes == du_bytes(cache_on_tmpfs) - os.lstat(cache_on_tmpfs).st_blocks * 512 - blocks
    assert any(n.startswith("Not freed: 5.0 MiB in 1 file with hard links outside") for n in plan.notes), plan.notes
    r = clear_mod.clear(str(cache_on_tmpfs), ClearOptions())
    assert r.files_done == 2 and r.not_freed == {"linked outside what was cleared": 1}
    assert r.not_freed_bytes == blocks and r.left_behind and "not freed: 5.0 MiB in 1 file linked outside" in (
        clear_mod.summary(r))
    assert (cache_on_tmpfs.parent / "kept").stat().st_size == MB
    _check_against_statvfs(r)


def test_one_entry_with_a_link_elsewhere_in_the_cache_is_not_freed(cache_on_tmpfs: Path) -> None:
    f = _five_mb(cache_on_tmpfs / "ab" / "blob")
    os.link(f, cache_on_tmpfs / "cd" / "other")
    r = clear_mod.clear(str(cache_on_tmpfs / "ab"), ClearOptions())
    assert r.not_freed == {"linked outside what was cleared": 1} and (cache_on_tmpfs / "cd" / "other").exists()
    _check_against_statvfs(r)


def test_a_file_open_in_a_process_is_removed_but_not_freed(cache_on_tmpfs: Path) -> None:
    f = _five_mb(cache_on_tmpfs / "ab" / "blob")
    _five_mb(cache_on_tmpfs / "cd" / "free")
    blocks = os.stat(f).st_blocks * 512
    job = subprocess.Popen([sys.executable, "-c", f"f = open({str(f)!r}, 'rb'); print(flush=True); "
                            "import sys; sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        job.stdout.readline()
        plan = ActionRunner().plan("clear", [str(cache_on_tmpfs)], wait=True).result
        assert any(n.startswith("Not freed yet: 5.0 MiB in 1 file open in a running process") for n in plan.notes)
        r = clear_mod.clear(str(cache_on_tmpfs), ClearOptions())
        assert r.files_done == 2 and r.not_freed == {"open in a process": 1} and r.not_freed_bytes == blocks
        assert r.done_bytes == plan.bytes and r.left_behind
        _check_against_statvfs(r)
    finally:
        job.kill()
        job.wait()


@needs_root
def test_the_cli_exits_non_zero_when_a_clear_left_something_behind(base: Path) -> None:
    ind = base / "ind"
    (ind / "ab").mkdir(parents=True)
    _five_mb(ind / "ab" / "blob")
    os.link(ind / "ab" / "blob", base / "kept")
    _chown_tree(base, 65534)
    env = clean_env(base / "home", TORCHINDUCTOR_CACHE_DIR=str(ind))
    r = _dltop("nobody", "caches", "clear", "torchinductor", "--yes", env=env)
    assert r.returncode == 1 and "not freed: 5.0 MiB in 1 file linked outside what was cleared" in r.stdout, r
    assert list(ind.iterdir()) == [] and (base / "kept").stat().st_size == MB


# -- names from outside -------------------------------------------------------------------------------------

TRIED: list[int] = []


@pytest.mark.parametrize("cache", ["torchinductor", "hf_hub", "added"])
def test_any_entry_name_gives_a_one_line_reason_never_an_exception(cache: str, tmp_path: Path) -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    names = st.text(st.characters(blacklist_characters="/\0", blacklist_categories=("Cs",)), min_size=1,
                    max_size=40).filter(lambda n: n not in (".", ".."))
    raw = st.binary(min_size=1, max_size=20).filter(lambda b: b"/" not in b and b"\0" not in b and b not in
                                                    (b".", b".."))
    tried = []

    @settings(max_examples=150, derandomize=True, deadline=None, database=None)
    @given(name=st.one_of(names, raw.map(os.fsdecode)), is_dir=st.booleans())
    def one(name: str, is_dir: bool) -> None:
        tried.append(name)
        root = tmp_path / f"c{len(tried)}"
        root.mkdir()
        p = root / name
        p.mkdir() if is_dir else p.write_bytes(b"")
        for why in (confine.layout_refusal(cache, str(root)), confine.entry_refusal(cache, str(root), name, is_dir)):
            if why is not None:
                assert printable(why.reason) == why.reason, why.reason  # nothing left for a terminal to act on

    one()
    TRIED.append(len(tried))
    print(f"{cache}: {len(tried)} names tried")
    assert len(tried) >= 100
