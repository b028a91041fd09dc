"""What finding the probes costs on a busy, hostile node: 1,000 processes and 50,000 squatted `dltop-N` folders in
/dev/shm, read by this dltop's ProbeReader and, side by side in the same run, by the reader of an earlier commit
(which listed /dev/shm): the time of the first reading and of the next 100 (median, mean, max: this dltop's slow
sweep of /dev/shm for the folders of users that run nothing here takes 10 ms slices until it has passed the 50,000
over), and their ratios.

    python benchmarks/rendezvous.py [--processes 1000] [--junk 50000] [--before b360af5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
READ = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from dltop.sources import probes
reader = probes.ProbeReader() if hasattr(probes, "ProbeReader") else None
read = reader.read if reader else (lambda: probes.read_probes())
t = time.perf_counter(); read(); first = time.perf_counter() - t
times = []
for _ in range(100):
    t = time.perf_counter(); read(); times.append(time.perf_counter() - t)
mean = sum(times) / len(times)
times.sort()
print(json.dumps({"first_s": first, "median_s": times[50], "mean_s": mean, "max_s": times[-1]}))
"""


def measure(tree: str) -> dict[str, float]:
    import json

    out = subprocess.run([sys.executable, "-c", READ, tree], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=1000)
    ap.add_argument("--junk", type=int, default=50000)
    ap.add_argument("--before", default="b360af5", help="the commit whose reader listed /dev/shm")
    a = ap.parse_args()
    old = tempfile.mkdtemp(prefix="dltop-before-")
    sleepers: list[subprocess.Popen] = []
    junk = [f"/dev/shm/dltop-{400000 + n}" for n in range(a.junk)]
    try:
        subprocess.run(f"git -C {REPO} archive {a.before} dltop | tar -x -C {old}", shell=True, check=True)
        sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(a.processes)]
        for path in junk:
            os.mkdir(path, 0o700)
        print(f"{len(os.listdir('/proc'))} entries in /proc, {a.junk} squatted folders in /dev/shm")
        now, before = measure(str(REPO)), measure(old)
        for name, r in (("this dltop", now), (a.before, before)):
            print(f"{name:>12}: first reading {1000 * r['first_s']:7.1f} ms; the next 100: median "
                  f"{1000 * r['median_s']:6.2f} ms, mean {1000 * r['mean_s']:6.2f} ms, max {1000 * r['max_s']:6.1f} ms")
        print(f"ratio (before / now): first {before['first_s'] / now['first_s']:.1f}x, "
              f"median {before['median_s'] / now['median_s']:.1f}x, mean {before['mean_s'] / now['mean_s']:.1f}x")
    finally:
        for p in sleepers:
            p.kill()
            p.wait()
        for path in junk:
            if os.path.isdir(path):
                os.rmdir(path)
        shutil.rmtree(old, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
