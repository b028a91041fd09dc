"""dltop's cache walk against `du -sB1`, side by side in one run, on a 100,000-file cache it makes.

    .venv/bin/python benchmarks/caches.py [--dir /var/tmp/dltop-bench-caches] [--files 100000] [--repeat 3]

The tree is shaped like a TorchInductor cache: two-character folders of small generated files. `dltop` is the
walk the caches source does (`walk_cache`, in this process: the Sampler runs it on its own thread, so start-up
is not part of it); `du` is a whole process. Both run warm (a second pass over the same dentries), median of
--repeat runs; the sizes must agree to the byte. Target: dltop / du <= 3.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dltop.sources.caches import walk_cache  # noqa: E402


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


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/var/tmp/dltop-bench-caches")
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    cache = make_cache(Path(args.dir), args.files)
    du_times, ours = [], []
    for _ in range(args.repeat):
        t, out = timed(lambda: subprocess.run(["du", "-sB1", str(cache)], capture_output=True, check=True).stdout)
        du_times.append(t)
        du_size = int(out.split()[0])  # type: ignore[union-attr]
        t, w = timed(lambda: walk_cache(str(cache)))
        ours.append(t)
    files = w.files  # type: ignore[attr-defined]
    size = w.size_bytes  # type: ignore[attr-defined]
    same = "yes" if size == du_size else f"NO ({size} vs {du_size})"
    d, u = statistics.median(ours), statistics.median(du_times)
    print(f"{files:,} files, {size:,} bytes; sizes agree with du: {same}")
    print(f"{'':12}{'dltop':>10}{'du -sB1':>10}{'dltop/du':>10}")
    print(f"{'walk (s)':12}{d:>10.3f}{u:>10.3f}{d / u:>10.2f}")
    return 0 if size == du_size else 1


if __name__ == "__main__":
    raise SystemExit(main())
