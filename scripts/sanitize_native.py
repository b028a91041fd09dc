"""Runs tests against dltop's C modules built with AddressSanitizer and UndefinedBehaviorSanitizer.

A scratch copy of the checkout (its git-tracked files) gets each dltop/native/_NAME.c built with
`-fsanitize=address,undefined -fno-sanitize-recover=undefined` and the house's warnings as errors; pytest then runs
there with libasan preloaded (Python itself is not built with it). Any out-of-bounds access, use after free or
undefined behaviour in a module aborts the run with ASan's or UBSan's report. Leaks are not looked for here (the
interpreter's own allocations at exit would drown them): run a script under `ASAN_OPTIONS=detect_leaks=1
PYTHONMALLOC=malloc` for that (docs/development.md, "Optional C modules").

    python scripts/sanitize_native.py tests/test_caches_walk_native.py [pytest args...]
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# build_native.py's flags (-Wall -Werror), -O1 and the sanitizers
FLAGS = ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
         "-shared", "-fPIC", "-std=c11", "-Wall", "-Werror", "-fno-strict-aliasing", "-D_GNU_SOURCE"]


def main(argv: list[str]) -> int:
    cc = os.environ.get("CC", "cc")
    libasan = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    if not os.path.isabs(libasan):
        print(f"no libasan for {cc}: {libasan!r}", file=sys.stderr)
        return 2
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    with tempfile.TemporaryDirectory(prefix="dltop-sanitize-") as tmp:
        copy = Path(tmp)
        for rel in filter(None, files.decode().split("\0")):
            src, dst = ROOT / rel, copy / rel
            if src.is_file():
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.write_bytes(src.read_bytes())
        suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
        for c in sorted((copy / "dltop" / "native").glob("_*.c")):
            subprocess.run([cc, *FLAGS, f"-I{sysconfig.get_paths()['include']}", str(c), "-o",
                            str(c.with_name(c.stem + suffix))], check=True)
            print(f"built {c.stem} with ASan and UBSan", file=sys.stderr)
        env = {**os.environ, "LD_PRELOAD": libasan, "PYTHONPATH": str(copy),
               "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
               "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}
        return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *argv], cwd=copy,
                              env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
