"""dltop's cache walk against `du -sB1`, side by side, whole processes, on a 100,000-file cache it makes.

    .venv/bin/python benchmarks/caches.py [--dir /var/tmp/dltop-bench-caches] [--files 100000] [--repeat 5]
        [--code CHECKOUT [--code CHECKOUT2]] [--python-loop]

The tree is shaped like a TorchInductor cache: two-character folders of small generated files. Three whole
processes, each warm (the dentries cached by the run before), median of --repeat runs, wall and CPU
(user + system, from the child's rusage, which a busy node moves less than the wall):
`du -sB1 CACHE`; `walk`, a Python process that imports the caches source and walks the cache as the Sampler
does (`walk_cache`); `dltop caches --json` in an environment whose only cache is that one. The bytes must
agree with du's to the byte (and the apparent bytes with `du --apparent-size -sB1`). Target: walk / du <= 1.0.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def make_cache(base: Path, files: int) -> Path:
    """An inductor-like cache of `files` files in 256 folders, made once and reused when already there."""
    cache = base / "cache"
    per_dir = max(1, files // 256)
    if not (cache / "ff" / f"k{per_dir - 1}.py").exists():
        print(f"making {files} files in {cache} ...", file=sys.stderr)
        body = b"# generated kernel\n" * 40
        for d in range(256):
            sub = cache / f"{d:02x}"
            sub.mkdir(parents=True, exist_ok=True)
            for i in range(per_dir):
                (sub / f"k{i}.py").write_bytes(body)
    return cache


def run(argv: list[str], env: dict[str, str] | None = None, cwd: str | None = None) -> tuple[float, float, bytes]:
    """(wall s, CPU s of the child, its stdout)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run(argv, capture_output=True, check=True, env=env, cwd=cwd).stdout
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/var/tmp/dltop-bench-caches")
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--code", action="append", default=[],
                    help="a dltop checkout to time (default: this one); twice: before/after, in turns in each round")
    ap.add_argument("--python-loop", action="store_true", help="also time each checkout with DLTOP_NATIVE=0")
    args = ap.parse_args()
    codes = args.code or [str(REPO)]
    cache = make_cache(Path(args.dir), args.files)
    home = Path(args.dir) / "home"
    home.mkdir(exist_ok=True)
    base_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
                "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    walk = [sys.executable, "-c", "import sys; from dltop.sources.caches import walk_cache; "
            f"w = walk_cache({str(cache)!r}); print(w.size_bytes, getattr(w, 'apparent_bytes', -1), w.files)"]
    cli = [sys.executable, "-m", "dltop", "caches", "--json"]
    which = [sys.executable, "-c", "import dltop.native as n; print(n.status().get('_walk', 'no C walk'))"]
    runs: list[tuple[str, str, dict[str, str]]] = []  # (label, checkout, env)
    for code in codes:
        env = {**base_env, "PYTHONPATH": code}
        try:
            loop = subprocess.run(which, capture_output=True, text=True, env=env, cwd=code).stdout.strip()
        except OSError:
            loop = "?"
        label = Path(code).name if len(codes) > 1 else ""
        runs.append((label, code, env))
        print(f"{code}: the walk's loop: {loop or 'no dltop.native (Python)'}", file=sys.stderr)
        if args.python_loop:
            runs.append((f"{label} py".strip(), code, {**env, "DLTOP_NATIVE": "0"}))
    rows: dict[str, list[tuple[float, float]]] = {"du -sB1": []}
    for label, _code, _env in runs:
        rows[f"walk {label}".strip()] = []
        rows[f"dltop caches {label}".strip()] = []
    run(["du", "-sB1", str(cache)])  # warm the dentries
    loads = [os.getloadavg()[0]]
    same = True
    for _ in range(args.repeat):
        wall, cpu, out = run(["du", "-sB1", str(cache)])
        rows["du -sB1"].append((wall, cpu))
        du_size = int(out.split()[0])
        for label, code, env in runs:
            wall, cpu, out = run(walk, env, code)
            rows[f"walk {label}".strip()].append((wall, cpu))
            size, apparent, files = (int(x) for x in out.split())
            wall, cpu, out = run(cli, env, code)
            rows[f"dltop caches {label}".strip()].append((wall, cpu))
            cli_size = json.loads(out)["caches"][0]["size_bytes"]
            same = same and size == du_size == cli_size
        loads.append(os.getloadavg()[0])
    du_apparent = int(run(["du", "--apparent-size", "-sB1", str(cache)])[2].split()[0])
    print(f"{files:,} files, {size:,} bytes (du: {du_size:,}; dltop caches: {cli_size:,}): "
          f"{'the same' if same else 'NOT THE SAME'}; apparent {apparent:,} (du --apparent-size: {du_apparent:,})")
    print(f"load average (1 min) during the runs: {min(loads):.2f} to {max(loads):.2f}; median of {args.repeat}")
    du_wall = statistics.median(w for w, _ in rows["du -sB1"])
    du_cpu = statistics.median(c for _, c in rows["du -sB1"])
    width = max(len(n) for n in rows) + 2
    print(f"{'':{width}}{'wall s':>8}{'CPU s':>8}{'wall/du':>9}{'CPU/du':>8}")
    for name, r in rows.items():
        wall, cpu = statistics.median(w for w, _ in r), statistics.median(c for _, c in r)
        print(f"{name:{width}}{wall:>8.3f}{cpu:>8.3f}{wall / du_wall:>9.2f}{cpu / du_cpu:>8.2f}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
