"""Builds dltop's optional C modules (dltop/native/*.c) in place, next to their sources.

Each module is an ordinary CPython extension with a pure-Python twin in dltop: where no C compiler or no Python
headers are found, nothing is built, this says why in one line, and dltop runs its Python loops instead
(dltop.native.load). The install (hatch_build.py, `pip install -e .`) runs it, and so does `make native`.

    python scripts/build_native.py [--quiet]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ROOT / "dltop" / "native"
FLAGS = ["-O2", "-shared", "-fPIC", "-std=c11", "-Wall", "-Werror", "-fno-strict-aliasing", "-D_GNU_SOURCE"]


def compiler() -> str | None:
    """The C compiler to use: $CC, Python's own, or cc/gcc/clang on the PATH."""
    for cand in (os.environ.get("CC"), (sysconfig.get_config_var("CC") or "").split(" ")[0], "cc", "gcc", "clang"):
        if cand and shutil.which(cand):
            return cand
    return None


def headers() -> str | None:
    inc = sysconfig.get_paths()["include"]
    return inc if (Path(inc) / "Python.h").is_file() else None


def target(src: Path) -> Path:
    return src.with_name(src.stem + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))


def build(sources: Path = SOURCES, log=print) -> list[Path]:
    """Builds every sources/*.c into sources/NAME<EXT_SUFFIX>; returns what was built (or already up to date)."""
    srcs = sorted(sources.glob("_*.c"))
    if not srcs:
        return []
    cc, inc = compiler(), headers()
    if cc is None or inc is None:
        why = "no C compiler (cc)" if cc is None else f"no Python headers ({sysconfig.get_paths()['include']}/Python.h)"
        log(f"dltop native modules not built: {why}; dltop uses its Python loops (docs/development.md)")
        return []
    built = []
    for src in srcs:
        out = target(src)
        if out.exists() and out.stat().st_mtime >= src.stat().st_mtime:
            built.append(out)
            continue
        tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
        cmd = [cc, *FLAGS, f"-I{inc}", str(src), "-o", str(tmp)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            tmp.unlink(missing_ok=True)
            first = (res.stderr.strip().splitlines() or ["(no message)"])[0]
            log(f"dltop native module {src.stem} not built: {first}")
            continue
        os.replace(tmp, out)  # atomic: a running dltop keeps the old mapping
        built.append(out)
        log(f"built {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return built


def main(argv: list[str]) -> int:
    quiet = "--quiet" in argv
    build(log=(lambda _m: None) if quiet else (lambda m: print(m, file=sys.stderr)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
