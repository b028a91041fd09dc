"""dltop residency / warm / evict against vmtouch and fincore, side by side in one run, on trees it makes.

    .venv/bin/python benchmarks/residency.py [--dir /var/tmp/dltop-bench] [--repeat 3]

Every time is a whole process (start-up included), median of --repeat runs; dltop runs as
`python -m dltop`, byte-compiled first (as an installed package is: where PYTHONDONTWRITEBYTECODE is set, a
source tree would otherwise be compiled again on every run). The `engine` column is the same work timed
inside one process (`scan_paths` / `warm`), without interpreter start-up and imports: where the time goes.
Caches are dropped between runs (`echo 1 > /proc/sys/vm/drop_caches` when writable, otherwise by evicting
the tree). Targets (dltop / vmtouch): scan <= 0.8 on small files and <= 0.2 on big files, warm <= 0.3 on
both, and at most 1% of pages left after an evict.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
# name -> (files, bytes each, folders): many small files (the interesting case for a scan and an evict).
SMALL_TREES = {"small": (50_000, 16 * 1024, 100), "tiny": (100_000, 4 * 1024, 100)}
BIG_FILES, BIG_BYTES = 4, 256 << 20


def make_small(tree: Path, files: int, size: int, dirs: int) -> None:
    """`files` files of `size` bytes in `dirs` folders, made once and reused when already that shape."""
    per_dir = files // dirs
    if (tree / f"d{dirs - 1:03}" / f"f{per_dir - 1:04}.bin").exists():
        return
    print(f"making {files} x {size // 1024} KiB files in {tree} ...", file=sys.stderr)
    data = os.urandom(size)
    for d in range(dirs):
        (tree / f"d{d:03}").mkdir(parents=True, exist_ok=True)
        for i in range(per_dir):
            (tree / f"d{d:03}" / f"f{i:04}.bin").write_bytes(data)


def make_trees(base: Path) -> dict[str, Path]:
    """The trees, made once and reused when already the right shape."""
    trees = {name: base / name for name in SMALL_TREES}
    for name, shape in SMALL_TREES.items():
        make_small(trees[name], *shape)
    big = trees["big"] = base / "big"
    big.mkdir(parents=True, exist_ok=True)
    for i in range(BIG_FILES):
        f = big / f"b{i}.bin"
        if not f.exists() or f.stat().st_size != BIG_BYTES:
            print(f"making {f} ({BIG_BYTES >> 20} MiB) ...", file=sys.stderr)
            with open(f, "wb") as fh:
                for _ in range(BIG_BYTES >> 24):
                    fh.write(os.urandom(1 << 24))
    os.sync()
    return trees


def drop_caches(tree: Path) -> None:
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
    except OSError:
        subprocess.run([PY, "-m", "dltop", "evict", str(tree)], cwd=REPO, capture_output=True, check=True)


def timed(cmd: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {r.stderr.strip()}")
    return dt, r.stdout


def resident_pages(tree: Path) -> tuple[int, int]:
    return parse_resident(subprocess.run(["vmtouch", str(tree)], capture_output=True, text=True, check=True).stdout)


def parse_resident(out: str) -> tuple[int, int]:
    """(resident, total) pages from vmtouch's report."""
    for line in out.splitlines():
        if "Resident Pages:" in line:
            res, total = line.split()[2].split("/")
            return int(res), int(total)
    raise SystemExit("vmtouch printed no 'Resident Pages' line")


def time_fincore(tree: Path) -> float:
    files = [str(p) for p in sorted(tree.rglob("*")) if p.is_file()]
    chunks = [files[i:i + 10_000] for i in range(0, len(files), 10_000)]
    t0 = time.perf_counter()
    for c in chunks:
        subprocess.run(["fincore", "-b", "-n", *c], capture_output=True, check=True)
    return time.perf_counter() - t0


# The engine alone: imports done, then only the scan or the warm is timed.
ENGINE = """
import sys, time
from dltop.actions import pagecache
from dltop.sources.datasets import WalkOptions, scan_paths
op, tree = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
if op == "scan":
    scan_paths((tree,), WalkOptions(max_depth=1))
else:
    pagecache.warm([tree])
print(time.perf_counter() - t0)
"""


def engine_time(op: str, tree: Path) -> float:
    return float(timed([PY, "-c", ENGINE, op, str(tree)])[1])


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/var/tmp/dltop-bench", help="where the trees are made (a disk, not tmpfs)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    for tool in ("vmtouch", "fincore"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed (scripts/install-test-deps installs it)")
    trees = make_trees(Path(args.dir))
    subprocess.run([PY, "-m", "compileall", "-q", str(REPO / "dltop")], check=True)
    dl = [PY, "-m", "dltop"]
    rows: list[tuple[str, str, float, float, float | None, float | None, str]] = []
    for name, tree in trees.items():
        # Scan: a half-warm tree (the interesting case), same state for every tool.
        drop_caches(tree)
        subprocess.run(dl + ["warm", str(tree), "--include", "*[02468].bin"], cwd=REPO, capture_output=True,
                       check=True)
        d_scan, v_scan, f_scan, e_scan, differ = [], [], [], [], []
        for _ in range(args.repeat):
            t, out = timed(dl + ["residency", str(tree), "--json"])
            d_scan.append(t)
            d_res = json.loads(out)["paths"][0]["resident_pages"]
            t, out = timed(["vmtouch", str(tree)])  # right after: the kernel may reclaim pages in between
            v_scan.append(t)
            v_res = parse_resident(out)[0]
            if d_res != v_res:
                differ.append(f"dltop {d_res} vmtouch {v_res}")
            f_scan.append(time_fincore(tree))
            e_scan.append(engine_time("scan", tree))
        agree = "agree" if not differ else "DIFFER " + ", ".join(differ)
        rows.append((name, "scan", median(d_scan), median(v_scan), median(f_scan), median(e_scan),
                     f"resident pages {agree}"))

        # Warm from cold.
        d_warm, v_warm, d_left, v_left, e_warm = [], [], [], [], []
        for _ in range(args.repeat):
            drop_caches(tree)
            e_warm.append(engine_time("warm", tree))
            drop_caches(tree)
            d_warm.append(timed(dl + ["warm", str(tree)])[0])
            res, total = resident_pages(tree)
            d_left.append(total - res)
            drop_caches(tree)
            v_warm.append(timed(["vmtouch", "-t", "-q", str(tree)])[0])
            res, total = resident_pages(tree)
            v_left.append(total - res)
        rows.append((name, "warm", median(d_warm), median(v_warm), None, median(e_warm),
                     f"not resident after: dltop {max(d_left)} vmtouch {max(v_left)} of {total} pages"))

        # Evict a fully warm tree.
        d_ev, v_ev, d_after, v_after = [], [], [], []
        for _ in range(args.repeat):
            subprocess.run(["vmtouch", "-t", "-q", str(tree)], check=True)
            d_ev.append(timed(dl + ["evict", str(tree)])[0])
            d_after.append(resident_pages(tree)[0])
            subprocess.run(["vmtouch", "-t", "-q", str(tree)], check=True)
            v_ev.append(timed(["vmtouch", "-e", "-q", str(tree)])[0])
            v_after.append(resident_pages(tree)[0])
        pct = 100 * max(d_after) / total
        rows.append((name, "evict", median(d_ev), median(v_ev), None, None,
                     f"left after: dltop {max(d_after)} ({pct:.2f}%) vmtouch {max(v_after)} of {total} pages"))

    # The device's own speed on the big tree: every file read in parallel with O_DIRECT (no page cache), the
    # floor under any warm of it.
    big_files = sorted(trees["big"].glob("*.bin"))
    raw = []
    for _ in range(args.repeat):
        drop_caches(trees["big"])
        t0 = time.perf_counter()
        procs = [subprocess.Popen(["dd", f"if={f}", "of=/dev/null", "bs=8M", "iflag=direct"],
                                  stderr=subprocess.DEVNULL) for f in big_files]
        for p in procs:
            p.wait()
        raw.append(time.perf_counter() - t0)

    targets = {("small", "scan"): 0.8, ("big", "scan"): 0.2, ("small", "warm"): 0.3, ("big", "warm"): 0.3}
    shapes = ", ".join(f"{n} = {f} x {b // 1024} KiB" for n, (f, b, _) in SMALL_TREES.items())
    print(f"trees: {shapes}, big = {BIG_FILES} x {BIG_BYTES >> 20} MiB; "
          f"median of {args.repeat}; whole-process seconds")
    print(f"{'tree':<6} {'op':<6} {'dltop':>8} {'vmtouch':>8} {'fincore':>8} {'ratio':>6} {'target':>9} "
          f"{'engine':>8} {'e.ratio':>7}  notes")
    for tree_name, op, d, v, f, e, note in rows:
        ratio = d / v
        tgt = targets.get((tree_name, op))
        verdict = "" if tgt is None else (f"<={tgt} " + ("ok" if ratio <= tgt else "MISS"))
        fc = f"{f:8.3f}" if f is not None else f"{'-':>8}"
        ec = f"{e:8.3f} {e / v:7.2f}" if e is not None else f"{'-':>8} {'-':>7}"
        print(f"{tree_name:<6} {op:<6} {d:8.3f} {v:8.3f} {fc} {ratio:6.2f} {verdict:>9} {ec}  {note}")
    print(f"device: the big tree read with O_DIRECT, {len(big_files)} dd in parallel (no page cache): "
          f"{median(raw):.3f}s")
    bare = median([timed([PY, "-c", "pass"])[0] for _ in range(5)])
    t = median([timed(dl + ["residency", "--help"])[0] for _ in range(5)])
    print(f"start-up: python -c pass {bare:.3f}s, python -m dltop residency --help {t:.3f}s; "
          f"engine = in-process time of the same work, e.ratio = engine / vmtouch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
