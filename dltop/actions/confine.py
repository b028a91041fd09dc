"""What a clear may touch: the rules a cache root must pass (dltop/cache_roots.py, which the caches source reads
too), and each tool's own layout (the names it writes right below its cache folder). A refusal names the rule
that refused, so the user knows what to change.

The layouts come from the code that writes each cache: torch/_inductor (codecache.py, cache_dir_utils.py,
autotune_cache.py, cpp_builder.py, the dynamo package cache), triton/runtime/cache.py (FileCacheManager),
torch.utils.cpp_extension (_get_build_directory), torch.hub (_get_cache_or_reload, load_state_dict_from_url),
huggingface_hub (file_download.py: .locks, models--*, CACHEDIR.TAG), datasets (builder folders, downloads),
vllm (envs.VLLM_CACHE_ROOT users), flashinfer/jit/env.py, deep_gemm/jit, JAX's LRU compilation cache.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable

from dltop.cache_roots import Refusal, prefix_marker
from dltop.errors import DltopError
from dltop.fmt import printable


class Refused(DltopError):
    """A clear refused by one rule; its text names the rule."""

    def __init__(self, rule: str, reason: str) -> None:
        super().__init__(f"refused: {reason}")
        self.rule = rule


# -- each tool's layout -------------------------------------------------------------------------------------

Rule = Callable[[str, bool], bool]  # (name, is_dir) -> the tool writes such an entry right below its folder


def _names(dirs: Iterable[str] = (), files: Iterable[str] = (), dir_re: str = "", file_re: str = "") -> Rule:
    d, f = frozenset(dirs), frozenset(files)
    dre, fre = re.compile(dir_re) if dir_re else None, re.compile(file_re) if file_re else None

    def rule(name: str, is_dir: bool) -> bool:
        if is_dir:
            return name in d or (dre is not None and dre.fullmatch(name) is not None)
        return name in f or (fre is not None and fre.fullmatch(name) is not None)

    return rule


# TorchInductor: its named folders, the two-character folders of generated code (codecache.get_path:
# basename[1:3] of a base32 hash), halide runtimes, and its few files (memoizer, cutlass configs, the
# NamedTemporaryFile wrappers of compile_fx's debug path, lock files).
_INDUCTOR = _names(
    dirs=("fxgraph", "aotautograd", "triton", "locks", "cache", "dynamo", "gcc", "precompiled_headers",
          "torch_cutlass", "unhashed_kernel_inputs", "autoheuristic", "aoti_eager", "bisect",
          "cutedsl_compile_cache", "kernel", "custom_ops"),
    files=("memoizer_cache.json", "memoizer_cache.lock"),
    dir_re=r"[a-z0-9]{2}|halide-runtime-.+",
    file_re=r"tmp\w+\.py|configs_.+\.json|.+\.lock")
# Inductor's precompiled headers (codecache._precompile_header): HASH.h and its HASH.h.gch, locks/.
_HEADERS = _names(dirs=("locks",), file_re=r"\w+\.h(?:\.gch)?|\w+\.lock|tmp\w+")
# Triton: one folder per kernel key (base32 of a sha256 since 3.2, hex sha256 or md5 before).
_TRITON = _names(dir_re=r"[A-Z2-7]{52}|[0-9a-f]{64}|[0-9a-f]{32}")
# The CUDA driver's ComputeCache: an index and hex-digit folders.
_CUDA = _names(files=("index",), dir_re=r"[0-9a-f]{1,2}")
# torch.utils.cpp_extension: py311_cu121 folders under the default root; with TORCH_EXTENSIONS_DIR the
# extensions' own build folders (named for the module: an identifier), and their lock files.
_EXTENSIONS = _names(dir_re=r"py\d+[a-z]*_(?:cpu|cu\d+|rocm[\d.]+)|[A-Za-z_]\w*", file_re=r".+\.lock|lock")
# torch.hub: checkpoints/, repo folders owner_repo_branch, the trusted_list, zips being unpacked.
_HUB = _names(dirs=("checkpoints",), files=("trusted_list",), dir_re=r".+_.+_.+", file_re=r".+\.zip")
# huggingface_hub: models--/datasets--/spaces-- repos, .locks, CACHEDIR.TAG, transformers' version.txt.
_HF_HUB = _names(dirs=(".locks",), files=("CACHEDIR.TAG", "version.txt", "version_diffusers_cache.txt"),
                 dir_re=r"(?:models|datasets|spaces)--.+")
# datasets: downloads/, builder folders (namespace___name, or a packaged builder's name), their lock files.
_DATASETS = _names(dir_re=r"[\w.\-]+", file_re=r".+\.lock|.+_lock|CACHEDIR\.TAG")
# vLLM: the folders under VLLM_CACHE_ROOT its code names.
_VLLM = _names(dirs=("torch_compile_cache", "torch_aot_compile", "deep_gemm", "mm_caches", "dummy_cache",
                     "xla_cache", "modelinfos", "flashinfer", "triton", "gdn_mtp_cuda"))
# FlashInfer: version folders (0.2.5/), arch folders of older layouts (80_89_90a/, gfx942/), cubins/.
_FLASHINFER = _names(dirs=("cubins", "cached_ops", "generated", "aiter_libs", "noarch"),
                     dir_re=r"\d+\.\d+[\w.+\-]*|\d+[a-z]?(?:_\d+[a-z]?)*|gfx\w+")
# DeepGEMM: cache/ (kernel.NAME.HASH folders) and tmp/.
_DEEP_GEMM = _names(dirs=("cache", "tmp"))
# JAX's LRU compilation cache: flat files KEY-cache and KEY-atime and its .lockfile (older: KEY files).
_JAX = _names(files=(".lockfile",), file_re=r"[\w.\-]+-(?:cache|atime)|\w+-[0-9a-f]{32,}")

# Where a name rule is loose, what a tool writes one level down: a datasets builder folder holds config folders
# and lock files; an extension's build folder (TORCH_EXTENSIONS_DIR) holds ninja's build files and objects.
_BUILDER = _names(dir_re=r".+", file_re=r".+\.lock|.+_lock|.+\.incomplete")
_BUILD = _names(dir_re=r".+", file_re=r"build\.ninja|\.ninja_(?:log|deps)|lock|.+\.(?:o|so|cpp|cc|cu|cuh|h|hpp|hip|d|"
                                      r"ptx|cubin|fatbin|json|lock)")
DEEPER: dict[str, Callable[[str], Rule | None]] = {
    "hf_datasets": lambda name: None if name == "downloads" else _BUILDER,
    "torch_extensions": lambda name: None if re.fullmatch(r"py\d+[a-z]*_(?:cpu|cu\d+|rocm[\d.]+)", name) else _BUILD,
}

LAYOUTS: dict[str, tuple[str, Rule]] = {
    "torchinductor": ("TorchInductor", _INDUCTOR), "torchinductor_headers": ("Inductor headers", _HEADERS),
    "triton": ("Triton", _TRITON), "cuda": ("CUDA", _CUDA),
    "torch_extensions": ("torch extensions", _EXTENSIONS), "torch_hub": ("torch hub", _HUB),
    "hf_hub": ("Hugging Face hub", _HF_HUB), "hf_datasets": ("Hugging Face datasets", _DATASETS),
    "vllm": ("vLLM", _VLLM), "flashinfer": ("FlashInfer", _FLASHINFER), "deep_gemm": ("DeepGEMM", _DEEP_GEMM),
    "jax": ("JAX", _JAX),
}
# What no tool writes in any cache, whatever the name rules say: a Python prefix's or a home's markers.
NEVER = frozenset({"pyvenv.cfg", "conda-meta", "site-packages", ".bashrc", ".profile", ".ssh", ".bash_history"})


def _entries(root: str) -> list[tuple[str, bool]]:
    """(name, is a folder) right below `root`, not following symlinks; [] when it cannot be listed."""
    out = []
    try:
        with os.scandir(root) as it:
            for e in it:
                try:
                    out.append((e.name, e.is_dir(follow_symlinks=False)))
                except OSError:
                    out.append((e.name, False))
    except OSError:
        return []
    return sorted(out)


def _foreign(root: str, rule: Rule, entries: list[tuple[str, bool]], deeper: Callable[[str], Rule | None]
             = lambda name: None) -> str | None:
    """The first entry below `root` that `rule` (and `deeper`, one level down) says its tool never writes
    ('bin/', 'notes.txt', 'bin/python')."""
    for name, is_dir in entries:
        shown = printable(name) + ("/" if is_dir else "")
        if name in NEVER or not rule(name, is_dir):
            return shown
        if not is_dir:
            continue
        sub = os.path.join(root, name)
        if prefix_marker(sub) is not None or os.path.lexists(os.path.join(sub, ".ssh")):
            return shown
        inner = deeper(name)
        if inner is not None:
            bad = _foreign(sub, inner, _entries(sub))
            if bad is not None:
                return f"{shown}{bad}"
    return None


def _fits(cache: str, root: str, entries: list[tuple[str, bool]]) -> str | None:
    rule = LAYOUTS[cache][1]
    return _foreign(root, rule, entries, DEEPER.get(cache, lambda name: None))


def layout_refusal(cache: str, root: str) -> Refusal | None:
    """The refusal when the folder `root` of cache `cache` holds an entry its tool never writes; an added
    folder must be laid out as one of the known tools' caches."""
    entries = _entries(root)
    shown = printable(root)
    if cache in LAYOUTS:
        label = LAYOUTS[cache][0]
        bad = _fits(cache, root, entries)
        if bad is None:
            return None
        return Refusal("foreign content", f"{shown} holds '{bad}' which {label} never writes: not its cache")
    found = {name: _fits(name, root, entries) for name in LAYOUTS}
    if any(bad is None for bad in found.values()):
        return None
    # Name the entry most tools would not write: the one that shows best why the folder is not a cache.
    worst = max(set(found.values()), key=lambda b: sum(1 for v in found.values() if v == b))
    return Refusal("foreign content", f"{shown} holds '{worst}' which none of the caches dltop knows write "
                                      f"({', '.join(label for label, _r in LAYOUTS.values())}): not a cache")


def layout_of(cache: str, root: str) -> str:
    """The tool whose layout an added folder follows ('' for a known cache or none)."""
    if cache in LAYOUTS:
        return ""
    entries = _entries(root)
    return next((label for name, (label, _r) in LAYOUTS.items() if _fits(name, root, entries) is None), "")


def entry_refusal(cache: str, root: str, name: str, is_dir: bool) -> Refusal | None:
    """The refusal of an entry right below a cache's folder that its tool never writes."""
    rules = [LAYOUTS[cache]] if cache in LAYOUTS else list(LAYOUTS.values())
    if name not in NEVER and any(rule(name, is_dir) for _label, rule in rules):
        return None
    label = rules[0][0] if len(rules) == 1 else "any cache dltop knows"
    shown = printable(name) + ("/" if is_dir else "")
    return Refusal("foreign content", f"{printable(root)} holds '{shown}' which {label} never writes: not its "
                                      "cache's own")
