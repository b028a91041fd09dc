"""dltop's cache walk against `du -sB1`, side by side, whole processes, on a 100,000-file cache it makes.

    .venv/bin/python benchmarks/caches.py [--dir /var/tmp/dltop-bench-caches] [--files 100000] [--repeat 5]

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
    ap.add_argument("--code", default=str(REPO), help="the dltop checkout to time (another one: before/after)")
    args = ap.parse_args()
    cache = make_cache(Path(args.dir), args.files)
    home = Path(args.dir) / "home"
    home.mkdir(exist_ok=True)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "PYTHONPATH": args.code,
           "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    walk = [sys.executable, "-c", "import sys; from dltop.sources.caches import walk_cache; "
            f"w = walk_cache({str(cache)!r}); print(w.size_bytes, getattr(w, 'apparent_bytes', -1), w.files)"]
    cli = [sys.executable, "-m", "dltop", "caches", "--json"]
    rows: dict[str, list[tuple[float, float]]] = {"du -sB1": [], "walk": [], "dltop caches": []}
    run(["du", "-sB1", str(cache)])  # warm the dentries
    for _ in range(args.repeat):
        wall, cpu, out = run(["du", "-sB1", str(cache)])
        rows["du -sB1"].append((wall, cpu))
        du_size = int(out.split()[0])
        wall, cpu, out = run(walk, env, args.code)
        rows["walk"].append((wall, cpu))
        size, apparent, files = (int(x) for x in out.split())
        wall, cpu, out = run(cli, env, args.code)
        rows["dltop caches"].append((wall, cpu))
        cli_size = json.loads(out)["caches"][0]["size_bytes"]
    du_apparent = int(run(["du", "--apparent-size", "-sB1", str(cache)])[2].split()[0])
    same = size == du_size == cli_size
    print(f"{files:,} files, {size:,} bytes (du: {du_size:,}; dltop caches: {cli_size:,}): "
          f"{'the same' if same else 'NOT THE SAME'}; apparent {apparent:,} (du --apparent-size: {du_apparent:,})")
    du_wall = statistics.median(w for w, _ in rows["du -sB1"])
    du_cpu = statistics.median(c for _, c in rows["du -sB1"])
    print(f"{'':14}{'wall s':>8}{'CPU s':>8}{'wall/du':>9}{'CPU/du':>8}")
    for name, r in rows.items():
        wall, cpu = statistics.median(w for w, _ in r), statistics.median(c for _, c in r)
        print(f"{name:14}{wall:>8.3f}{cpu:>8.3f}{wall / du_wall:>9.2f}{cpu / du_cpu:>8.2f}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
