"""dltop's optional C modules: the per-file loops of the walks, where Python's cost per call is the whole gap to
the C tools users compare with (vmtouch, du).

Every module here has a Python twin that gives the same answers; the tests run both and compare them. A module is
used only when it was built (scripts/build_native.py, at install), it reports the API this dltop expects, and
`DLTOP_NATIVE` is not `0`. `status()` says for each module which loop runs and why.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

# name -> the API version this dltop's Python side was written against (the C module's `API` constant)
EXPECTED: dict[str, int] = {
    "_walk": 2,
    "_template": 1,  # the recorder's templates: a part's text matched at its numbers (recorder/template.py)
    "_measure": 1,  # the residency scan's per-file step: open, fstat, cachestat, close (residency/)
}

# name -> what its loop does, for `dltop --version`
ROLE: dict[str, str] = {
    "_walk": "caches walk",
    "_measure": "residency scan, watch and evict",
    "_template": "dump templates",
}

_cache: dict[str, ModuleType | None] = {}
_why: dict[str, str] = {}


def load(name: str) -> ModuleType | None:
    """The C module `dltop.native.NAME`, or None where the Python loop must run (status() says why)."""
    if name in _cache:
        return _cache[name]
    mod: ModuleType | None = None
    if os.environ.get("DLTOP_NATIVE", "1") == "0":
        _why[name] = "off (DLTOP_NATIVE=0)"
    else:
        try:
            mod = importlib.import_module(f"dltop.native.{name}")
        except ImportError:
            _why[name] = "not built (no C compiler or Python headers at install; make native builds it)"
        else:
            want, got = EXPECTED.get(name), getattr(mod, "API", None)
            if want is not None and got != want:
                _why[name] = f"stale build (API {got}, this dltop wants {want}; make native rebuilds it)"
                mod = None
            else:
                _why[name] = "C"
    _cache[name] = mod
    return mod


def status() -> dict[str, str]:
    """For each known module: "C", or why its Python twin runs."""
    for name in EXPECTED:
        load(name)
    return {name: _why[name] for name in EXPECTED}


def lines() -> list[str]:
    """One line per module for `dltop --version`: `caches walk: C`, or why its Python loop runs."""
    return [f"{ROLE.get(name, name)}: {how}" for name, how in status().items()]


def reset() -> None:
    """Forget what load() found (tests that switch DLTOP_NATIVE)."""
    _cache.clear()
    _why.clear()
