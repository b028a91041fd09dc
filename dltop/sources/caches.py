"""Compile and model caches: where each tool puts its cache (resolved the way the tool resolves it, from the
environment of the job that matters) and what is in it, walked under a time budget.

Resolution follows each tool's own code: torch/_inductor/runtime/cache_dir_utils.py, triton/runtime/cache.py,
torch.utils.cpp_extension, torch.hub, huggingface_hub.constants, datasets.config, vllm/envs.py, flashinfer/jit,
deep_gemm/jit, JAX's jax_compilation_cache_dir. A variable set to the empty string counts as unset.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import pwd
import re
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dltop import native, procfs
from dltop.cache_roots import homes, known_prefixes, root_refusal
from dltop.model.base import Unavailable, display_path
from dltop.model.caches import (
    FOLDERS_KEPT,
    KEEP_DEPTH,
    KEPT_PER_FOLDER,
    CacheEntry,
    CacheFolder,
    CacheInfo,
    CachesPart,
    LockFile,
)
from dltop.residency.budget import MAX_PROBLEMS, path_error
from dltop.residency.budget import Budget as _Budget

ENTRIES_KEPT = 100  # biggest entries kept right below a cache (the pane's Enter shows them, then "N more")
LOCKS_KEPT = 50
_CHECK_EVERY = 1024  # entries between looks at the budget
TEMP_CANDIDATES = ("/tmp", "/var/tmp", "/usr/tmp")  # tempfile._candidate_tempdir_list, after TMPDIR/TEMP/TMP
# torch_extensions' build folders: py{major}{minor}{abiflags}_{cpu|cuNNN}
VERSION_KEY = re.compile(r"py\d+[a-z]*_(?:cpu|cu\d+|rocm[\d.]+)")
INDUCTOR_KINDS = {"fxgraph": "FX graph cache", "aotautograd": "AOTAutograd cache", "triton": "Triton kernels",
                  "locks": "lock files", "cache": "autotune results"}
HUB_PREFIXES = {"models--": "model", "datasets--": "dataset", "spaces--": "space"}

_listdir = os.listdir  # tests replace this to make entries vanish between listing and stat


# -- whose environment --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Environment:
    """The environment a cache path is resolved in: a process's variables, its user and home."""

    env: Mapping[str, str]
    user: str  # as getpass.getuser() says it: LOGNAME, USER, LNAME, USERNAME, then the passwd name
    home: str  # as os.path.expanduser("~") says it: $HOME, then the passwd home
    uid: int
    label: str = "dltop's own environment"
    pid: int | None = None
    current_version_key: str = ""  # py311_cu121 of the running interpreter, when it is known
    cwd: str = "/"  # relative paths in the variables are the process's, resolved from its working folder


def passwd_of(uid: int) -> tuple[str, str]:
    """(user name, home) of a uid from the passwd database; (the uid, "/") when it has no entry."""
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        return str(uid), "/"
    return pw.pw_name, pw.pw_dir


def environment_of(env: Mapping[str, str], uid: int, label: str, pid: int | None = None,
                   version_key: str = "", cwd: str = "/") -> Environment:
    """An Environment from variables and a uid, user and home resolved as getpass and expanduser do."""
    name, home = passwd_of(uid)
    user = next((env[k] for k in ("LOGNAME", "USER", "LNAME", "USERNAME") if env.get(k)), name)
    return Environment(env=dict(env), user=user, home=env.get("HOME") or home, uid=uid, label=label, pid=pid,
                       current_version_key=version_key, cwd=cwd)


def own_environment() -> Environment:
    """dltop's own environment (and its interpreter's torch_extensions key, when torch is installed)."""
    return environment_of(os.environ, os.getuid(), "dltop's own environment", version_key=_own_version_key(),
                          cwd=os.getcwd())


def _own_version_key() -> str:
    # torch.version.cuda without importing torch: its version string carries it ("2.13.0+cu121", "+cpu").
    if not may_hold_distribution("torch", sys.path):
        return ""
    from importlib import metadata

    try:
        version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return ""
    local = version.partition("+")[2]
    cu = local if re.fullmatch(r"cpu|cu\d+", local) else ""
    if not cu:
        return ""  # a build without a local tag (PyPI's CUDA wheels): its CUDA version is not in the name
    return f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}_{cu}"


def may_hold_distribution(name: str, path: Iterable[str]) -> bool:
    """Whether importlib.metadata could find distribution `name` on `path`: False only where it surely finds none
    (no folder holds a `NAME-*.dist-info` or `NAME.egg-info` by its normalized name, and neither a zip, an .egg
    nor another finder could hold one). Its own search reads the names of every distribution on the path and
    imports email and zipfile: ~40 ms of `dltop caches` where torch is not installed."""
    import importlib.machinery

    if any(f is not importlib.machinery.PathFinder and hasattr(f, "find_distributions") for f in sys.meta_path):
        return True
    want = _dist_key(name)
    for entry in path:
        root = entry or "."
        if root.lower().endswith(".egg"):
            return True  # its EGG-INFO names no distribution in a folder name
        if _may_hold_in(root, want):
            return True
    return False


def _may_hold_in(root: str, want: str) -> bool:
    """Whether path entry `root` may hold distribution `want`: a zip may, a folder where a .dist-info names it."""
    try:
        children = os.listdir(root)
    except NotADirectoryError:
        return True  # a zip on the path
    except OSError:
        return False  # missing or unreadable: importlib.metadata finds nothing there either
    for child in children:
        low = child.lower()
        if low.endswith((".dist-info", ".egg-info")) and _dist_key(low.rpartition(".")[0].partition("-")[0]) == want:
            return True
    return False


def _dist_key(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def parse_environ(data: bytes) -> dict[str, str]:
    """/proc/PID/environ: NUL-separated NAME=value; entries without '=' are left out."""
    out: dict[str, str] = {}
    for item in data.split(b"\0"):
        name, eq, value = item.partition(b"=")
        if eq and name:
            out[os.fsdecode(name)] = os.fsdecode(value)
    return out


def process_environment(pid: int, root: str = "/") -> Environment:
    """The environment of process `pid` from /proc/PID/environ and its real uid (raises OSError: another
    user's process needs root)."""
    base = os.path.join(root, "proc", str(pid))
    # procfs.read_*: under a captured tree (--root) a FIFO would block the open, /dev/zero never end.
    env = parse_environ(procfs.read_bytes(os.path.join(base, "environ"), procfs.MAX_ARGS_BYTES))
    uid = os.stat(base).st_uid
    try:
        for line in procfs.read_text(os.path.join(base, "status"), 1 << 16).splitlines():
            if line.startswith("Uid:"):
                real = procfs.parse_count(line.split()[1])
                uid = real if real is not None and real < 1 << 32 else uid
    except (OSError, IndexError):
        pass
    try:
        cwd = os.readlink(os.path.join(base, "cwd"))
    except OSError:
        cwd = "/"
    return environment_of(env, uid, f"environment of PID {pid} ({base}/environ)", pid=pid, cwd=cwd)


# -- where each tool puts its cache -------------------------------------------------------------------------


@dataclass(frozen=True)
class Location:
    """A cache's path and the rule that gave it."""

    name: str
    label: str
    path: str
    source: str
    settings: dict[str, str] = field(default_factory=dict)
    clear_command: str = ""


def _get(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    return value if value else None


def _expanduser(path: str, e: Environment) -> str:
    if path == "~" or path.startswith("~/"):
        return e.home + path[1:]
    return os.path.expanduser(path) if path.startswith("~") else path


def _expandvars(path: str, env: Mapping[str, str]) -> str:
    """os.path.expandvars against `env`: $NAME and ${NAME}; unknown variables are left as they are."""
    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        return env.get(name, m.group(0))

    return re.sub(r"\$(\w+)|\$\{([^}]*)\}", sub, path) if "$" in path else path


def tempdir(e: Environment) -> tuple[str, str]:
    """tempfile.gettempdir() for this environment, and which rule gave it: TMPDIR, TEMP, TMP, then /tmp,
    /var/tmp, /usr/tmp (the first usable folder)."""
    for name in ("TMPDIR", "TEMP", "TMP"):
        value = _get(e.env, name)
        if value is not None and os.path.isdir(full := os.path.normpath(os.path.join(e.cwd, value))):
            return full, name
    for d in TEMP_CANDIDATES:
        if os.path.isdir(d):
            return d, d
    return os.getcwd(), "the current folder"


def _xdg_cache(e: Environment) -> tuple[str, str]:
    value = _get(e.env, "XDG_CACHE_HOME")
    return (value, "$XDG_CACHE_HOME") if value else (os.path.join(e.home, ".cache"), "~/.cache")


def resolve(e: Environment, extra: Iterable[str] = ()) -> list[Location]:
    """Every known cache's path in environment `e`, each with the rule that gave it, then the paths in `extra`."""
    out = [*_torch_caches(e), *_hf_caches(e), *_serving_caches(e)]
    out.extend(Location(p, "added", _expanduser(p, e), "added by you (caches = [...] or --cache)") for p in extra)
    # `~` is expanded only where the tool expands it (torch hub, huggingface_hub, datasets, vLLM: below); torch's
    # TORCHINDUCTOR_CACHE_DIR, Triton's, CUDA's and the others take it literally: a folder named ~ in the cwd.
    return [dataclasses.replace(loc, path=os.path.normpath(os.path.join(e.cwd, loc.path))) for loc in out]


def _first(env: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    """(value, name) of the first of `names` set in `env`."""
    return next(((v, n) for n in names if (v := _get(env, n)) is not None), None)


def _torch_caches(e: Environment) -> list[Location]:
    """TorchInductor (and its headers), Triton, CUDA's JIT, torch extensions, torch hub."""
    env = e.env
    out: list[Location] = []
    # TorchInductor: cache_dir_utils.cache_dir(): TORCHINDUCTOR_CACHE_DIR, else <gettempdir()>/torchinductor_<user>
    tmp, why = tempdir(e)
    user = re.sub(r'[\\/:*?"<>|]', "_", e.user)
    default_inductor = os.path.join(tmp, f"torchinductor_{user}")
    if (hit := _first(env, "TORCHINDUCTOR_CACHE_DIR")) is not None:
        out.append(Location("torchinductor", "TorchInductor", hit[0], hit[1]))
        # codecache._HEADER_DIR is default_cache_dir()/precompiled_headers whatever the variable says: the
        # C++ wrapper's precompiled headers stay in the tempdir when the cache is moved.
        out.append(Location("torchinductor_headers", "Inductor headers",
                            os.path.join(default_inductor, "precompiled_headers"),
                            "always <tempdir>/torchinductor_<user>/precompiled_headers (torch/_inductor/codecache.py "
                            f"_HEADER_DIR ignores TORCHINDUCTOR_CACHE_DIR; tempdir {why}, user {user})"))
    else:
        out.append(Location("torchinductor", "TorchInductor", default_inductor,
                            f"default: <tempdir>/torchinductor_<user> (tempdir {why}, user {user})"))
    # Triton: TRITON_CACHE_DIR, else $TRITON_HOME/.triton/cache, else ~/.triton/cache
    if (hit := _first(env, "TRITON_CACHE_DIR")) is not None:
        out.append(Location("triton", "Triton", hit[0], hit[1]))
    elif (hit := _first(env, "TRITON_HOME")) is not None:
        out.append(Location("triton", "Triton", os.path.join(hit[0], ".triton", "cache"),
                            "TRITON_HOME: $TRITON_HOME/.triton/cache"))
    else:
        out.append(Location("triton", "Triton", os.path.join(e.home, ".triton", "cache"),
                            "default: ~/.triton/cache"))
    # CUDA's JIT cache of PTX compiled for this GPU (the driver's, not a library's)
    knobs = {k: env.get(k) or "not set (the driver's default)" for k in ("CUDA_CACHE_MAXSIZE", "CUDA_CACHE_DISABLE")}
    out.append(Location("cuda", "CUDA ComputeCache", *_first(env, "CUDA_CACHE_PATH") or (
        os.path.join(e.home, ".nv", "ComputeCache"), "default: ~/.nv/ComputeCache"), knobs))
    xdg, xdg_why = _xdg_cache(e)
    # torch.utils.cpp_extension: TORCH_EXTENSIONS_DIR, else user_cache_dir("torch_extensions")/py311_cu121
    out.append(Location("torch_extensions", "torch extensions", *_first(env, "TORCH_EXTENSIONS_DIR") or (
        os.path.join(xdg, "torch_extensions"), f"default: {xdg_why}/torch_extensions")))
    # torch.hub: $TORCH_HOME/hub, TORCH_HOME defaulting to $XDG_CACHE_HOME/torch (~/.cache/torch)
    if (hit := _first(env, "TORCH_HOME")) is not None:
        out.append(Location("torch_hub", "torch hub", os.path.join(_expanduser(hit[0], e), "hub"),
                            "TORCH_HOME: $TORCH_HOME/hub"))
    else:
        out.append(Location("torch_hub", "torch hub", os.path.join(_expanduser(xdg, e), "torch", "hub"),
                            f"default: {xdg_why}/torch/hub"))
    return out


def _hf_caches(e: Environment) -> list[Location]:
    """Hugging Face's hub and datasets."""
    env = e.env
    out: list[Location] = []
    xdg, xdg_why = _xdg_cache(e)
    # huggingface_hub.constants: HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE (legacy), else $HF_HOME/hub, HF_HOME
    # defaulting to $XDG_CACHE_HOME/huggingface; expanduser and expandvars applied.
    hf_home_hit = _first(env, "HF_HOME")
    hf_home = hf_home_hit[0] if hf_home_hit else os.path.join(xdg, "huggingface")
    hf_why = "HF_HOME: $HF_HOME" if hf_home_hit else f"default: {xdg_why}/huggingface"

    def hf(p: str) -> str:
        return _expandvars(_expanduser(p, e), env)

    # huggingface_hub 2.x: `hf cache rm`, `hf cache prune`; before: `huggingface-cli delete-cache`
    hub_clear = "hf cache rm REPO (hf cache prune drops detached revisions; huggingface-cli delete-cache before hf)"
    if (hit := _first(env, "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE")) is not None:
        out.append(Location("hf_hub", "Hugging Face hub", hf(hit[0]), hit[1], clear_command=hub_clear))
    else:
        out.append(Location("hf_hub", "Hugging Face hub", os.path.join(hf(hf_home), "hub"), f"{hf_why}/hub",
                            clear_command=hub_clear))
    # datasets.config: HF_DATASETS_CACHE, else $HF_HOME/datasets
    if (hit := _first(env, "HF_DATASETS_CACHE")) is not None:
        out.append(Location("hf_datasets", "Hugging Face datasets", _expanduser(hit[0], e), hit[1]))
    else:
        out.append(Location("hf_datasets", "Hugging Face datasets", os.path.join(hf(hf_home), "datasets"),
                            f"{hf_why}/datasets"))
    return out


def _serving_caches(e: Environment) -> list[Location]:
    """vLLM, FlashInfer, DeepGEMM, JAX."""
    env = e.env
    out: list[Location] = []
    xdg, xdg_why = _xdg_cache(e)
    # vllm/envs.py: VLLM_CACHE_ROOT, else $XDG_CACHE_HOME/vllm (torch_compile_cache inside)
    if (hit := _first(env, "VLLM_CACHE_ROOT")) is not None:
        out.append(Location("vllm", "vLLM", _expanduser(hit[0], e), hit[1]))
    else:
        out.append(Location("vllm", "vLLM", os.path.join(_expanduser(xdg, e), "vllm"), f"default: {xdg_why}/vllm"))
    # flashinfer/jit/env.py: $FLASHINFER_WORKSPACE_BASE (default ~)/.cache/flashinfer
    if (hit := _first(env, "FLASHINFER_WORKSPACE_BASE")) is not None:
        out.append(Location("flashinfer", "FlashInfer", os.path.join(hit[0], ".cache", "flashinfer"),
                            "FLASHINFER_WORKSPACE_BASE: $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer"))
    else:
        out.append(Location("flashinfer", "FlashInfer", os.path.join(e.home, ".cache", "flashinfer"),
                            "default: ~/.cache/flashinfer"))
    # DeepGEMM's JIT: DG_JIT_CACHE_DIR, else ~/.deep_gemm
    out.append(Location("deep_gemm", "DeepGEMM", *_first(env, "DG_JIT_CACHE_DIR") or (
        os.path.join(e.home, ".deep_gemm"), "default: ~/.deep_gemm")))
    # JAX keeps a persistent compilation cache only when told where (jax_compilation_cache_dir)
    if (hit := _first(env, "JAX_COMPILATION_CACHE_DIR")) is not None:
        out.append(Location("jax", "JAX compilation cache", hit[0], hit[1]))
    return out


# -- what is in a cache -------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Entry:
    name: str
    path: str
    size: int = 0
    files: int = 0
    newest: float | None = None
    apparent: int = 0
    atime: float | None = None
    is_dir: bool = False


class _Dir:
    """One folder met by the walk: what is right in it, then (once the walk is done) what is below it."""

    __slots__ = ("apparent", "atime", "count", "depth", "files", "kept", "name", "newest", "oldest", "own",
                 "own_apparent", "parent", "path", "size", "subdirs")

    def __init__(self, name: str, path: str, parent: int, depth: int, own: int, own_apparent: int) -> None:
        self.name, self.path, self.parent, self.depth = name, path, parent, depth
        self.own, self.own_apparent = own, own_apparent  # the folder's own blocks (bytes) and st_size
        self.size, self.apparent, self.files = own, own_apparent, 0
        self.newest, self.oldest, self.atime = _NONE, _NEVER, _NONE
        self.count = 0  # names listed in it
        # the biggest non-folders: -blocks, name, st_size, mtime and atime (_NONE: not a regular file)
        self.kept: list[tuple[int, str, int, float, float]] = []
        self.subdirs: list[int] = []

    def add(self, size: int, apparent: int, files: int, newest: float, oldest: float, atime: float) -> None:
        """Totals of what is in the folder (bytes of blocks, st_size, regular files, file times) added to its own."""
        self.size += size
        self.apparent += apparent
        self.files += files
        self.newest, self.oldest, self.atime = max(self.newest, newest), min(self.oldest, oldest), max(self.atime, atime)


_NONE, _NEVER = float("-inf"), float("inf")  # no file seen yet (newest, oldest)


def _time(t: float) -> float | None:
    return None if t in (_NONE, _NEVER) else t


@dataclass
class CacheWalk:
    """Totals of one walk, as du -B1 and find -type f count them, with what it met on the way."""

    size_bytes: int = 0
    apparent_bytes: int = 0
    files: int = 0
    dirs: int = 0
    newest: float | None = None
    oldest: float | None = None
    newest_atime: float | None = None
    entries: list[_Entry] = field(default_factory=list)  # right below the walked folder (non-folders: the biggest)
    more_entries: int = 0  # names right below it not in `entries`, and their bytes
    more_bytes: int = 0
    more_apparent_bytes: int = 0
    # deeper folders whose biggest entries are kept: (path, entries, names left out, their bytes, apparent)
    folders: list[tuple[str, list[_Entry], int, int, int]] = field(default_factory=list)
    locks: list[tuple[str, os.stat_result]] = field(default_factory=list)
    noted: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    complete: bool = True

    def note(self, why: str, path: str | None = None, detail: str | None = None) -> None:
        """Count one thing met (unreadable, vanished, symlink, non-UTF-8 name), with a line when worth reading."""
        self.noted[why] = self.noted.get(why, 0) + 1
        if detail is not None and len(self.problems) < MAX_PROBLEMS:
            self.problems.append(f"{detail}: {display_path(path or '')}")


def _why(error: str) -> str:
    """`permission denied` of an OSError's strerror (CacheWalk.note adds the path)."""
    return error[:1].lower() + error[1:]


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def walk_cache(path: str, *, cancel: threading.Event | None = None, deadline_s: float | None = None,
               cpu_fraction: float | None = None, keep_depth: int = KEEP_DEPTH) -> CacheWalk:
    """Walk `path` without following symlinks: blocks of every entry, each inode once (du -B1), their st_size
    (du --apparent-size), regular files by name (find -type f), newest and oldest file, last access, the
    biggest entries of the folders down to `keep_depth`. Raises OSError when `path` itself cannot be read.

    Each folder is opened once (O_NOFOLLOW) and its names are lstat'ed relative to its fd, as du's fts does:
    a per-name path walk in the kernel and a DirEntry per name cost 40% more."""
    t0 = time.monotonic()
    budget = _Budget(cancel, None if deadline_s is None else t0 + deadline_s, cpu_fraction)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        return _file_walk(st)
    walker = _Walker(_Dir(os.path.basename(path), path, -1, 0, st.st_blocks * 512, st.st_size), budget, keep_depth)
    walker.run()
    return _summed(walker.w, walker.nodes, keep_depth)


def _file_walk(st: os.stat_result) -> CacheWalk:
    """The walk of a cache that is one file, not a folder."""
    w = CacheWalk(size_bytes=st.st_blocks * 512, apparent_bytes=st.st_size, files=int(stat.S_ISREG(st.st_mode)))
    if w.files:
        w.newest = w.oldest = st.st_mtime
        w.newest_atime = st.st_atime
    return w


class _Walker:
    """The folders of one walk_cache (nodes[0] the walked one), listed depth first: each by the C loop
    (dltop.native._walk, docs/caches.md), or by `_scan`, its Python twin, where the C one is not built."""

    def __init__(self, top: _Dir, budget: _Budget, keep_depth: int) -> None:
        self.w = CacheWalk()
        self.nodes, self.stack = [top], [0]
        self.seen: set[tuple[int, int]] = set()  # (dev, ino) of the hard-linked files counted
        self.budget, self.keep_depth = budget, keep_depth
        self.listed, self.next_check, self.stopped = 0, _CHECK_EVERY, False
        self.c_walk = native.load("_walk")
        self.listdir = _listdir

    def run(self) -> None:
        while self.stack and not self.stopped:
            i = self.stack.pop()
            fd = self._open(i)
            if fd is None:
                continue
            try:
                self._folder(i, fd)
            finally:
                os.close(fd)
        if self.stopped or self.stack:
            self.w.complete = False

    def _open(self, i: int) -> int | None:
        d = self.nodes[i].path
        try:
            return os.open(d, _O_DIR)
        except FileNotFoundError:
            self.w.note("vanished")
        except OSError as e:
            if i == 0:
                raise
            # ELOOP: swapped for a symlink since its lstat; never followed
            self.w.note("unreadable", d, _why(e.strerror or str(e)))
        return None

    def _folder(self, i: int, fd: int) -> None:
        node = self.nodes[i]
        keep, limit = node.depth < self.keep_depth, ENTRIES_KEPT if i == 0 else KEPT_PER_FOLDER
        try:
            listing = self._list(fd, keep, limit)
        except OSError as e:
            if i == 0:
                raise
            self.w.note("unreadable", node.path, _why(e.strerror or str(e)))
            return
        self.w.dirs += 1
        if isinstance(listing, list):
            self._scan(i, fd, listing, keep, limit)
        else:
            self.listed, self.next_check, self.stopped = _took(self.w, self.nodes, self.stack, i, listing, limit)

    def _list(self, fd: int, keep: bool, limit: int) -> list[str] | tuple[Any, ...]:
        """The folder's names for `_scan`, or all that the C loop took from it."""
        if self.c_walk is None:
            return self.listdir(fd)
        # a listing made in Python only where a test replaced _listdir
        return self.c_walk.scan(fd, None if self.listdir is os.listdir else self.listdir(fd), self.seen, keep, limit,
                                LOCKS_KEPT - len(self.w.locks), self.budget.stop, self.listed, self.next_check,
                                _CHECK_EVERY, MAX_PROBLEMS - len(self.w.problems))

    def _scan(self, i: int, fd: int, names: list[str], keep: bool, limit: int) -> None:
        """The C loop's twin: lstat each name of folder nodes[i] by its fd, and add it up."""
        w, nodes, stack, seen = self.w, self.nodes, self.stack, self.seen
        lstat, is_dir, is_reg, is_lnk = os.lstat, stat.S_ISDIR, stat.S_ISREG, stat.S_ISLNK
        node = nodes[i]
        d, depth, kept = node.path, node.depth + 1, node.kept
        node.count = len(names)
        cut = -1  # blocks at or below this cannot make the kept list (once it is full)
        blocks = apparent = files = 0
        newest, oldest, atime = _NONE, _NEVER, _NONE
        for k in range(0, len(names), _CHECK_EVERY):
            self.listed += min(_CHECK_EVERY, len(names) - k)
            if self.listed >= self.next_check:  # the budget looked at every few thousand names, in small folders too
                self.next_check += _CHECK_EVERY
                if self.budget.stop():
                    self.stopped = True
                    break
            for name in names[k:k + _CHECK_EVERY]:
                try:
                    s = lstat(name, dir_fd=fd)
                except FileNotFoundError:
                    w.note("vanished")
                    continue
                except OSError as e:
                    w.note("unreadable", f"{d}/{name}", _why(e.strerror or str(e)))
                    continue
                if not name.isascii() and not _utf8(name):
                    w.note("non_utf8_name", f"{d}/{name}", "name not UTF-8")
                mode = s.st_mode
                if is_dir(mode):
                    node.subdirs.append(len(nodes))
                    stack.append(len(nodes))
                    nodes.append(_Dir(name, f"{d}/{name}", i, depth, s.st_blocks * 512, s.st_size))
                    continue
                b, size = s.st_blocks, s.st_size
                if s.st_nlink > 1:
                    key = (s.st_dev, s.st_ino)
                    if key in seen:
                        b = size = 0  # a hard link of a file counted already: du counts it once
                    seen.add(key)
                blocks += b
                apparent += size
                if is_reg(mode):
                    files += 1
                    m, a = s.st_mtime, s.st_atime
                    if m > newest:
                        newest = m
                    if m < oldest:
                        oldest = m
                    if a > atime:
                        atime = a
                    if name[-5:] == ".lock" and len(w.locks) < LOCKS_KEPT:
                        w.locks.append((f"{d}/{name}", s))
                else:
                    m = a = _NONE
                    if is_lnk(mode):
                        w.note("symlink")  # its own blocks counted, its target never
                if keep and b > cut:  # a tie with the smallest kept: the first listed stays
                    kept.append((-b, name, size, m, a))  # sorts biggest first, then by name
                    if len(kept) >= 2 * limit:
                        kept.sort()
                        del kept[limit:]
                        cut = -kept[-1][0]
        node.add(blocks * 512, apparent, files, newest, oldest, atime)


def _summed(w: CacheWalk, nodes: list[_Dir], keep_depth: int) -> CacheWalk:
    """The walk's totals: each folder summed into its parent; the walked folder's entries and the biggest
    deeper folders' entries kept."""
    for node in reversed(nodes[1:]):  # a folder comes after its parent: children are summed into parents
        nodes[node.parent].add(node.size, node.apparent, node.files, node.newest, node.oldest, node.atime)
    root = nodes[0]
    w.size_bytes, w.apparent_bytes, w.files = root.size, root.apparent, root.files
    w.newest, w.oldest, w.newest_atime = _time(root.newest), _time(root.oldest), _time(root.atime)
    w.entries = _children(nodes, root, ENTRIES_KEPT)
    w.more_entries = max(0, root.count - len(w.entries))
    w.more_bytes = root.size - root.own - sum(e.size for e in w.entries)
    w.more_apparent_bytes = root.apparent - root.own_apparent - sum(e.apparent for e in w.entries)
    deeper = sorted((n for n in nodes[1:] if n.depth < keep_depth and n.count), key=lambda n: (-n.size, n.path))
    for n in deeper[:FOLDERS_KEPT]:
        kids = sorted(_children(nodes, n, KEPT_PER_FOLDER), key=lambda e: (-e.size, e.name))[:KEPT_PER_FOLDER]
        w.folders.append((n.path, kids, max(0, n.count - len(kids)), n.size - n.own - sum(e.size for e in kids),
                          n.apparent - n.own_apparent - sum(e.apparent for e in kids)))
    return w


def _took(w: CacheWalk, nodes: list[_Dir], stack: list[int], i: int, r: tuple[Any, ...],
          limit: int) -> tuple[int, int, bool]:
    """What the C loop (dltop.native._walk.scan) gives for folder nodes[i], taken as the Python loop of
    walk_cache takes each name; returns (listed, next_check, stopped) for the budget."""
    count, blocks, apparent, files, newest, oldest, atime, subdirs, kept, events, locks, listed, next_check, \
        stopped = r
    node = nodes[i]
    d, depth = node.path, node.depth + 1
    node.count = count
    for name, b, size in subdirs:
        node.subdirs.append(len(nodes))
        stack.append(len(nodes))
        nodes.append(_Dir(name, f"{d}/{name}", i, depth, b * 512, size))
    for code, name, n in events:
        if name is None:  # n of them in a row: vanished, symlinks, or past the problem lines left
            why = _NOTES[code]
            w.noted[why] = w.noted.get(why, 0) + n
        elif code == 1:
            w.note("unreadable", f"{d}/{name}", _why(os.strerror(n)))
        else:
            w.note("non_utf8_name", f"{d}/{name}", "name not UTF-8")
    for name, *f in locks:
        # os.stat_result's fields in its order: the 10 of the tuple, then the float and ns times, blksize,
        # blocks, rdev; the float times as posixmodule.c computes them (sec + nsec * 1e-9)
        (mode, ino, dev, nlink, uid, gid, size, a_s, a_n, m_s, m_n, c_s, c_n, blksize, nblocks, rdev) = f
        w.locks.append((f"{d}/{name}", os.stat_result((
            mode, ino, dev, nlink, uid, gid, size, a_s, m_s, c_s, a_s + a_n * 1e-9, m_s + m_n * 1e-9,
            c_s + c_n * 1e-9, a_s * 10**9 + a_n, m_s * 10**9 + m_n, c_s * 10**9 + c_n, blksize, nblocks, rdev))))
    if kept:
        node.kept.extend(kept)
        if len(node.kept) >= 2 * limit:
            node.kept.sort()
            del node.kept[limit:]
    node.add(blocks * 512, apparent, files, newest, oldest, atime)
    return listed, next_check, stopped


_NOTES = ("vanished", "unreadable", "non_utf8_name", "symlink")  # the C loop's event codes


def _children(nodes: list[_Dir], node: _Dir, limit: int) -> list[_Entry]:
    """Every folder right below `node` and its `limit` biggest other entries."""
    out = [_Entry(c.name, c.path, c.size, c.files, _time(c.newest), c.apparent, _time(c.atime), True)
           for c in (nodes[j] for j in node.subdirs)]
    node.kept.sort()
    for nb, name, size, m, a in node.kept[:limit]:  # nb, size: 0 for a hard link met before (counted once)
        out.append(_Entry(name, f"{node.path}/{name}", -nb * 512, int(m != _NONE), _time(m), size, _time(a)))
    return out


def parse_proc_locks(text: str) -> set[tuple[int, int, int]]:
    """(major, minor, inode) of every file /proc/locks says is locked now (flock, POSIX and OFD locks)."""
    out = set()
    for line in text.splitlines():
        f = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"; a blocked waiter has "->" after the number
        if len(f) > 1 and f[1] == "->":
            f = [f[0], *f[2:]]
        if len(f) < 6:
            continue
        dev = f[5].split(":")
        if len(dev) != 3:
            continue
        try:
            out.add((int(dev[0], 16), int(dev[1], 16), int(dev[2])))
        except ValueError:
            continue
    return out


def read_proc_locks(root: str = "/") -> set[tuple[int, int, int]]:
    """The locked files now; empty when /proc/locks cannot be read."""
    try:
        return parse_proc_locks(procfs.read_text(os.path.join(root, "proc", "locks"), encoding="utf-8"))
    except OSError:
        return set()


@dataclass(frozen=True)
class Mount:
    """One line of /proc/self/mountinfo: where, what type, from what."""

    point: str
    fs_type: str
    source: str


def parse_mountinfo(text: str) -> list[Mount]:
    """Every mount of /proc/self/mountinfo (mount point unescaped), in the kernel's order."""
    from dltop.sources.memory import unescape_mount

    out = []
    for line in text.splitlines():
        f = line.split(" ")
        try:
            sep = f.index("-", 6)
        except ValueError:
            continue
        if len(f) < sep + 3 or len(f) < 5:
            continue
        out.append(Mount(unescape_mount(f[4]), f[sep + 1], unescape_mount(f[sep + 2])))
    return out


def mount_of(path: str, mounts: list[Mount]) -> Mount | None:
    """The mount that holds `path` (the last, longest mount point above it: later mounts cover earlier ones)."""
    best: Mount | None = None
    for m in mounts:
        p = m.point.rstrip("/") or "/"
        if (path == p or path.startswith(p.rstrip("/") + "/") or p == "/") and (
                best is None or len(p) >= len(best.point.rstrip("/") or "/")):
            best = m
    return best


def _existing(path: str) -> str:
    p = path
    while not os.path.exists(p) and p not in ("/", ""):
        p = os.path.dirname(p)
    return p or "/"


def _entry_kind(cache: str, name: str) -> str:
    if cache == "torchinductor":
        return INDUCTOR_KINDS.get(name, "generated code" if len(name) == 2 else "")
    if cache == "torch_extensions":
        return "built for " + name if VERSION_KEY.fullmatch(name) else ""
    if cache == "vllm":
        return "torch.compile artifacts" if name == "torch_compile_cache" else ""
    if cache == "hf_hub":
        return next((kind for prefix, kind in HUB_PREFIXES.items() if name.startswith(prefix)), "")
    return ""


@dataclass(frozen=True)
class HubRepo:
    """One repo of a Hugging Face hub cache: its id, a line on its revisions, and each revision as an entry
    (path: its snapshots/REV folder; size: the blobs it links to, blocks as du counts them)."""

    repo_id: str
    detail: str
    revisions: tuple[CacheEntry, ...] = ()


def hub_repo_id(folder: str) -> str:
    """'openai/gpt2' of 'models--openai--gpt2' (as huggingface_hub names a repo from its folder)."""
    return "/".join(folder.split("--")[1:])


def hub_repos(path: str) -> dict[str, HubRepo]:
    """{repo folder name: HubRepo} of a Hugging Face hub cache: from huggingface_hub's own scan_cache_dir where
    it is installed, else from the layout (refs/ name snapshots/ revisions)."""
    try:
        from huggingface_hub import scan_cache_dir
    except ImportError:
        return _hub_repos_from_layout(path)
    try:
        info = scan_cache_dir(path)
    except Exception:  # its own errors (CacheNotFound, CorruptedCacheException): read the layout instead
        return _hub_repos_from_layout(path)
    out: dict[str, HubRepo] = {}
    for repo in info.repos:
        revs = sorted(repo.revisions, key=lambda r: (-r.last_modified, r.commit_hash))
        entries = []
        for r in revs:
            blocks, seen = 0, set()
            for f in r.files:
                with contextlib.suppress(OSError):
                    b = os.stat(f.blob_path)
                    if (b.st_dev, b.st_ino) not in seen:
                        seen.add((b.st_dev, b.st_ino))
                        blocks += b.st_blocks * 512
            atime = max((f.blob_last_accessed for f in r.files), default=None)
            entries.append(CacheEntry(name=r.commit_hash, path=str(r.snapshot_path), size_bytes=blocks,
                                      files=r.nb_files, newest_mtime=r.last_modified, kind="revision",
                                      detail=_refs_text(r.refs), apparent_bytes=r.size_on_disk, newest_atime=atime,
                                      is_dir=True))
        detached = sum(1 for r in revs if not r.refs)
        out[os.path.basename(str(repo.repo_path))] = HubRepo(repo.repo_id, _revisions_text(len(revs), detached),
                                                             tuple(entries))
    return out


def _refs_text(refs: Iterable[str]) -> str:
    names = sorted(refs)
    return ("refs: " + ", ".join(names)) if names else "detached (no ref names it)"


def _revisions_text(revisions: int, detached: int) -> str:
    text = f"{revisions} revision{'s' if revisions != 1 else ''}"
    return text + (f", {detached} detached" if detached else "")


def _hub_repos_from_layout(path: str) -> dict[str, HubRepo]:
    out: dict[str, HubRepo] = {}
    try:
        names = os.listdir(path)
    except OSError:
        return out
    for name in names:
        if not any(name.startswith(p) for p in HUB_PREFIXES):
            continue
        repo = os.path.join(path, name)
        try:
            snaps = set(os.listdir(os.path.join(repo, "snapshots")))
        except OSError:
            snaps = set()
        refs: dict[str, set[str]] = {}
        refs_dir = os.path.join(repo, "refs")
        for dirpath, _dirs, files in os.walk(refs_dir):
            for f in files:
                try:
                    with open(os.path.join(dirpath, f)) as fh:
                        refs.setdefault(fh.read(256).strip(), set()).add(
                            os.path.relpath(os.path.join(dirpath, f), refs_dir))
                except OSError:
                    continue
        revs = tuple(CacheEntry(name=r, path=os.path.join(repo, "snapshots", r), size_bytes=0, files=0,
                                kind="revision", detail=_refs_text(refs.get(r, ())), is_dir=True)
                     for r in sorted(snaps))
        out[name] = HubRepo(hub_repo_id(name), _revisions_text(len(snaps), len(snaps - set(refs))), revs)
    return out


def _entry(cache: str, en: _Entry, hub: Mapping[str, HubRepo], path: str) -> CacheEntry:
    repo = hub.get(en.name)
    return CacheEntry(name=en.name, path=path, size_bytes=en.size, files=en.files, newest_mtime=en.newest,
                      kind=_entry_kind(cache, en.name), detail=repo.detail if repo else "",
                      apparent_bytes=en.apparent, newest_atime=en.atime, is_dir=en.is_dir,
                      label=repo.repo_id if repo else "")


def _place_facts(path: str, mounts: list[Mount], temp_dirs: Iterable[str]) -> dict[str, Any]:
    """Where a cache lives: its file system (type, mount point, free and total bytes) and the tempdir it is
    under ("" for none)."""
    where = _existing(path)
    real = os.path.realpath(where)
    m = mount_of(real, mounts)
    facts: dict[str, Any] = {"fs_type": m.fs_type if m else "", "mount_point": m.point if m else ""}
    try:
        vfs = os.statvfs(where)
        facts["fs_free_bytes"] = vfs.f_bavail * vfs.f_frsize
        facts["fs_total_bytes"] = vfs.f_blocks * vfs.f_frsize
    except OSError:
        pass
    if m is None:  # rare (no mountinfo): the statfs wrapper's ctypes is not loaded for the cache walk otherwise
        from dltop import kernel

        with contextlib.suppress(OSError):
            facts["fs_type"] = kernel.fs_name(kernel.statfs_type(where))
    full_real = os.path.realpath(path)
    facts["under_tempdir"] = next((t for t in temp_dirs if full_real == t or full_real.startswith(t.rstrip("/") + "/")),
                                  "")
    return facts


def read_cache(loc: Location, *, mounts: list[Mount], locked: set[tuple[int, int, int]], temp_dirs: Iterable[str],
               version_key: str = "", cancel: threading.Event | None = None, deadline_s: float | None = None,
               cpu_fraction: float | None = None) -> CacheInfo:
    """One cache: its walk's totals and entries, and the facts of where it lives. A cache folder that is a
    symlink is followed (the tool follows it too) and said in `via_symlink`."""
    t0 = time.monotonic()
    base = CacheInfo(name=loc.name, label=loc.label, path=loc.path, source=loc.source, exists=False,
                     settings=loc.settings, clear_command=loc.clear_command, current_version_key=version_key)
    facts = _place_facts(loc.path, mounts, temp_dirs)
    full_real = os.path.realpath(loc.path)
    walked = loc.path
    try:
        st = os.lstat(loc.path)
        if stat.S_ISLNK(st.st_mode):
            facts["via_symlink"] = walked = full_real
            st = os.lstat(full_real)  # a dangling link: no such folder, below
    except OSError as e:
        why = (f"no such folder: {display_path(walked)}" if isinstance(e, FileNotFoundError) else
               path_error(e.strerror or str(e), walked))
        return dataclasses.replace(base, **facts, scanned_at=time.time(), unavailable={"size_bytes": why})
    try:
        w = walk_cache(walked, cancel=cancel, deadline_s=deadline_s, cpu_fraction=cpu_fraction)
    except OSError as e:
        why = path_error(e.strerror or str(e), walked)
        return dataclasses.replace(base, exists=True, owner_uid=st.st_uid, **facts, scanned_at=time.time(),
                                   unavailable={"size_bytes": why, "files": why})
    unavailable = {}
    if w.newest is None:
        unavailable["newest_mtime"] = unavailable["oldest_mtime"] = "no files in it"
    return dataclasses.replace(
        base, exists=True, size_bytes=w.size_bytes, files=w.files, dirs=w.dirs, newest_mtime=w.newest,
        oldest_mtime=w.oldest, **_contents(loc, walked, w, locked),
        apparent_bytes=w.apparent_bytes, newest_atime=w.newest_atime, complete=w.complete, scanned_at=time.time(),
        scan_duration_s=time.monotonic() - t0, noted=w.noted, problems=tuple(w.problems), owner_uid=st.st_uid,
        unavailable=unavailable, **facts)


def _contents(loc: Location, walked: str, w: CacheWalk, locked: set[tuple[int, int, int]]) -> dict[str, Any]:
    """A walked cache's biggest entries and folders, version keys and lock files, as CacheInfo's fields; paths
    under the cache's own name, as the tool names them (`walked` is where a symlinked cache leads)."""
    hub = hub_repos(walked) if loc.name == "hf_hub" else {}
    top = sorted(w.entries, key=lambda en: (-en.size, en.name))
    left = top[ENTRIES_KEPT:]
    return {"entries": tuple(_entry(loc.name, en, hub, _shown(en.path, walked, loc.path)) for en in top[:ENTRIES_KEPT]),
            "more_entries": w.more_entries + len(left), "more_bytes": w.more_bytes + sum(en.size for en in left),
            "more_apparent_bytes": w.more_apparent_bytes + sum(en.apparent for en in left),
            "folders": _folders(loc, walked, w, hub),
            "version_keys": tuple(sorted(en.name for en in w.entries if VERSION_KEY.fullmatch(en.name))),
            "locks": tuple(LockFile(_shown(p, walked, loc.path), s.st_mtime,
                                    (os.major(s.st_dev), os.minor(s.st_dev), s.st_ino) in locked) for p, s in w.locks)}


def _shown(p: str, walked: str, path: str) -> str:
    """Path `p` of a walk of `walked` under the cache's own `path` (they differ where the cache is a symlink)."""
    return path + p[len(walked):] if walked != path and p.startswith(walked) else p


def _folders(loc: Location, walked: str, w: CacheWalk, hub: dict[str, HubRepo]) -> tuple[CacheFolder, ...]:
    """The folders whose biggest entries the walk kept; a hub repo opens on its revisions, not on blobs/ refs/."""
    folders = [CacheFolder(os.path.join(loc.path, name), repo.revisions) for name, repo in reversed(hub.items())]
    for p, kids, more, more_b, more_a in w.folders:
        if os.path.basename(p) in hub and os.path.dirname(p) == walked:
            continue  # a repo's own folder: it is above, by its revisions
        entries = tuple(_entry(loc.name, en, hub, _shown(en.path, walked, loc.path)) for en in kids)
        folders.append(CacheFolder(_shown(p, walked, loc.path), entries, more, more_b, more_a))
    return tuple(folders)


def refused_cache(loc: Location, rule: str, reason: str, version_key: str = "") -> CacheInfo:
    """A cache whose folder is not walked: its numbers unknown with the refusing rule and why (one line)."""
    why = f"refused ({rule}): {reason}: not walked as a cache"
    try:
        st: os.stat_result | None = os.lstat(loc.path)
    except OSError:
        st = None
    return CacheInfo(name=loc.name, label=loc.label, path=loc.path, source=loc.source, exists=st is not None,
                     owner_uid=st.st_uid if st is not None else None, settings=loc.settings,
                     clear_command=loc.clear_command, current_version_key=version_key, scanned_at=time.time(),
                     unavailable={"size_bytes": why, "files": why, "newest_mtime": why, "oldest_mtime": why})


def _temp_dirs(e: Environment) -> list[str]:
    """Folders whose contents do not outlive a reboot or a job: the process's tempdir, /tmp, /var/tmp, /dev/shm."""
    found = [tempdir(e)[0], "/tmp", "/dev/shm", "/run/user"]
    return list(dict.fromkeys(os.path.realpath(p) for p in found))


def read_caches(e: Environment, extra: Iterable[str] = (), root: str = "/", *, names: frozenset[str] | None = None,
                last: Mapping[str, CacheInfo] | None = None, cancel: threading.Event | None = None,
                deadline_s: float | None = None, cpu_fraction: float | None = None) -> CachesPart:
    """Every cache resolved in `e`, walked (with `names`, only those; the others keep their `last` reading)."""
    mounts = _mounts(root)
    locked = read_proc_locks(root)
    temps = _temp_dirs(e)
    locs = resolve(e, extra)
    kept = {(c.name, c.path): c for c in (last or {}).values()}  # a reading of the folder resolved now
    out = []
    for loc, refused in zip(locs, _refusals(e, locs, set(extra)), strict=True):
        prev = kept.get((loc.name, loc.path))
        if prev is not None and names is not None and loc.name not in names:
            out.append(prev)
        elif refused is not None:
            out.append(refused)
        else:
            info = read_cache(loc, mounts=mounts, locked=locked, temp_dirs=temps, version_key=e.current_version_key,
                              cancel=cancel, deadline_s=deadline_s, cpu_fraction=cpu_fraction)
            # A walk cut short by its budget says less than the last whole one: keep that, marked by its age.
            out.append(prev if prev is not None and prev.complete and not info.complete else info)
    return CachesPart(caches=tuple(out), environment=e.label, pid=e.pid)


def _refusals(e: Environment, locs: list[Location], added: set[str]) -> list[CacheInfo | None]:
    """For each of `locs`, the cache refused (not walked), or None. A path another process's environment gave
    (--pid) is walked only where a clear could go (`TORCHINDUCTOR_CACHE_DIR=/` is refused by the clear's rule,
    not walked whole); dltop's own environment and the folders you added are yours: walked as given."""
    if e.pid is None:
        return [None] * len(locs)
    home_of, prefixes = homes([e.home]), known_prefixes(e.env)
    out: list[CacheInfo | None] = []
    for loc in locs:
        why = None if loc.name in added else root_refusal(loc.path, home_of=home_of, prefixes=prefixes)
        out.append(None if why is None else refused_cache(loc, why.rule, why.reason, e.current_version_key))
    return out


def _mounts(root: str) -> list[Mount]:
    try:
        return parse_mountinfo(procfs.read_text(os.path.join(root, "proc", "self", "mountinfo"), encoding="utf-8"))
    except OSError:
        return []


# -- the Source ---------------------------------------------------------------------------------------------

SOURCE_CPU_FRACTION = 0.5
SOURCE_DEADLINE_S = 20.0  # per cache and pass: a walk cut short keeps the last whole one's numbers


class CachesReader:
    """The caches' background walk; `read_some(names)` rewalks only those (after a clear)."""

    def __init__(self, environment: Callable[[], Environment], extra: tuple[str, ...], root: str) -> None:
        self._environment, self.extra, self.root = environment, extra, root
        self._last: dict[str, CacheInfo] = {}
        self._env: Environment | None = None  # the last environment read: kept once --pid's process is gone

    def read(self) -> CachesPart | Unavailable:
        """Every cache walked now."""
        return self.read_some(None)

    def read_some(self, names: frozenset[str] | None) -> CachesPart | Unavailable:
        """Rewalk `names` (None: all), keep the others' last walk. A --pid process that exited is said, and
        its caches stay placed by its last environment (an environment cannot change after exec)."""
        exited = ""
        try:
            env = self._environment()
        except OSError as e:
            if not isinstance(e, (FileNotFoundError, ProcessLookupError)) or self._env is None \
                    or self._env.pid is None:
                return Unavailable(environment_error(e))
            env, exited = self._env, f"process {self._env.pid} exited"
        self._env = env
        part = read_caches(env, self.extra, self.root, names=names, last=self._last,
                           deadline_s=SOURCE_DEADLINE_S, cpu_fraction=SOURCE_CPU_FRACTION)
        self._last = {c.name: c for c in part.caches}
        return dataclasses.replace(part, exited=exited) if exited else part

    def carry_from(self, old: Any) -> None:
        """Take over the walks of the reader behind `old` (the Source this one replaces)."""
        prev = getattr(old.read, "__self__", None)
        if isinstance(prev, CachesReader):
            self._last = dict(prev._last)
            self._env = prev._env


def environment_error(e: OSError) -> str:
    """Why another process's environment could not be read, with what to do."""
    why = path_error(e.strerror or str(e), e.filename or "environ")
    if isinstance(e, PermissionError):
        why += " (another user's process: run dltop as that user or as root)"
    return why


def settings_environment(settings: Any) -> Callable[[], Environment]:
    """The environment the settings say matters: --pid's (read again on each pass), else dltop's own."""
    pid = getattr(settings, "pid", None)
    root = getattr(settings, "root", "/")
    if pid is None:
        # Read at the first walk, not when the source is built: where torch is installed, its version key
        # (importlib.metadata and its imports) cost ~0.1 s before the TUI's first frame.
        return functools.cache(own_environment)
    return lambda: process_environment(pid, root)


def source(settings: Any) -> Any:
    """The caches Source: every minute (ten refreshes at least), walks at half a CPU at most and 5% of the
    wall time in all."""
    from dltop.sources.base import Source

    extra = tuple(getattr(settings, "caches", ()))
    reader = CachesReader(settings_environment(settings), extra, getattr(settings, "root", "/"))
    interval = max(60.0, float(getattr(settings, "refresh_s", 1.0)) * 10)
    return Source(name="caches", interval_s=interval, read=reader.read, timeout_s=120.0, max_duty=0.05,
                  config=(extra, getattr(settings, "pid", None)), read_some=reader.read_some,
                  carry_from=reader.carry_from)
