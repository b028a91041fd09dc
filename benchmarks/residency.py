"""dltop residency / warm / evict against vmtouch and fincore, side by side in one run, on trees it makes.

    .venv/bin/python benchmarks/residency.py [--dir /var/tmp/dltop-bench] [--repeat 3]
                                             [--ops scan,warm,evict] [--trees small,tiny,big] [--code CHECKOUT]

--code runs the dltop of another checkout (its `python -m dltop`, from its folder), to compare two in the same
minutes; DLTOP_NATIVE=0 in the environment times the Python loops instead of the C modules (dltop/native).

Trees: small = 50,000 x 16 KiB, tiny = 100,000 x 4 KiB (100 folders each), big = 4 x 256 MiB. Every time is a
whole process (start-up included), median of --repeat runs, in wall seconds and in CPU seconds (user +
system, from the child's rusage: on a shared machine the wall time is mostly the wait for a CPU, the CPU time
is not); dltop runs as `python -m dltop`, byte-compiled first (as an installed package is: where
PYTHONDONTWRITEBYTECODE is set, a source tree would otherwise be compiled again on every run). The `engine`
column is the same work timed inside one process (`scan_paths` / `warm`), without interpreter start-up and
imports: where the time goes. Caches are dropped between runs (`echo 1 > /proc/sys/vm/drop_caches` when
writable, otherwise by evicting the tree). A scan's resident pages are checked against vmtouch's and
fincore's. Targets (dltop / vmtouch, issue 22): scan <= 0.6 on small files and <= 0.2 on big files, warm <=
0.3, evict <= 1.0, and at most 1% of pages left after an evict.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
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


def timed(cmd: list[str]) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds (user + system) and stdout of one whole process."""
    c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {r.stderr.strip()}")
    return dt, (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime), r.stdout


def resident_pages(tree: Path) -> tuple[int, int]:
    return parse_resident(subprocess.run(["vmtouch", str(tree)], capture_output=True, text=True, check=True).stdout)


def parse_resident(out: str) -> tuple[int, int]:
    """(resident, total) pages from vmtouch's report."""
    for line in out.splitlines():
        if "Resident Pages:" in line:
            res, total = line.split()[2].split("/")
            return int(res), int(total)
    raise SystemExit("vmtouch printed no 'Resident Pages' line")


def _chunks(tree: Path) -> list[list[str]]:
    files = [str(p) for p in sorted(tree.rglob("*")) if p.is_file()]
    return [files[i:i + 10_000] for i in range(0, len(files), 10_000)]


def time_fincore(tree: Path) -> float:
    chunks = _chunks(tree)
    t0 = time.perf_counter()
    for c in chunks:
        subprocess.run(["fincore", "-b", "-n", *c], capture_output=True, check=True)
    return time.perf_counter() - t0


def fincore_pages(tree: Path) -> int:
    """Resident pages of the tree as fincore counts them (its RES column, in bytes, over the page size)."""
    total = 0
    for c in _chunks(tree):
        out = subprocess.run(["fincore", "-b", "-n", "-o", "RES", *c], capture_output=True, text=True, check=True)
        total += sum(int(x) for x in out.stdout.split())
    return total // os.sysconf("SC_PAGE_SIZE")


# The engine alone: imports done, then only the scan or the warm is timed.
ENGINE = """
import sys, time
from dltop.actions import pagecache
try:
    from dltop.residency.scan import scan_paths
    from dltop.residency.walk import WalkOptions
except ImportError:  # a checkout from before dltop/residency/
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
    return float(timed([PY, "-c", ENGINE, op, str(tree)])[2])


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def main() -> int:
    global REPO
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/var/tmp/dltop-bench", help="where the trees are made (a disk, not tmpfs)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--ops", default="scan,warm,evict", help="which of scan, warm, evict to time (default all)")
    ap.add_argument("--trees", default=",".join([*SMALL_TREES, "big"]), help="which trees (default all)")
    ap.add_argument("--code", default=str(REPO), help="the dltop checkout to time (default this one)")
    args = ap.parse_args()
    REPO = Path(args.code).resolve()
    for tool in ("vmtouch", "fincore"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed (scripts/install-test-deps installs it)")
    trees = make_trees(Path(args.dir))
    subprocess.run([PY, "-m", "compileall", "-q", str(REPO / "dltop")], check=True)
    dl = [PY, "-m", "dltop"]
    ops, chosen = set(args.ops.split(",")), args.trees.split(",")
    rows: list[Row] = []
    for name, tree in trees.items():
        if name not in chosen:
            continue
        if "scan" in ops:
            rows.append(scan_row(name, tree, args.repeat, dl))
        if "warm" in ops:
            rows.append(warm_row(name, tree, args.repeat, dl))
        if "evict" in ops:
            rows.append(evict_row(name, tree, args.repeat, dl))
    print(f"trees: {', '.join(f'{n} = {f} x {b // 1024} KiB' for n, (f, b, _) in SMALL_TREES.items())}, "
          f"big = {BIG_FILES} x {BIG_BYTES >> 20} MiB; median of {args.repeat}; whole processes, seconds")
    print(f"{'tree':<6} {'op':<6} {'dltop':>7} {'vmtouch':>7} {'fincore':>7} {'ratio':>6} {'target':>9} "
          f"{'cpu':>6} {'v.cpu':>6} {'ratio':>6} {'engine':>7} {'e.ratio':>7}  notes")
    for r in rows:
        ratio = r.wall / r.v_wall
        tgt = TARGETS.get((r.tree, r.op))
        verdict = "" if tgt is None else (f"<={tgt} " + ("ok" if ratio <= tgt else "MISS"))
        fc = f"{r.fincore:7.3f}" if r.fincore is not None else f"{'-':>7}"
        ec = f"{r.engine:7.3f} {r.engine / r.v_wall:7.2f}" if r.engine is not None else f"{'-':>7} {'-':>7}"
        cpu_ratio = f"{r.cpu / r.v_cpu:6.2f}" if r.v_cpu > 0 else f"{'-':>6}"
        print(f"{r.tree:<6} {r.op:<6} {r.wall:7.3f} {r.v_wall:7.3f} {fc} {ratio:6.2f} {verdict:>9} "
              f"{r.cpu:6.3f} {r.v_cpu:6.3f} {cpu_ratio} {ec}  {r.note}")
    if "warm" in ops and "big" in chosen:
        print(device_line(trees["big"], args.repeat))
    bare = median([timed([PY, "-c", "pass"])[1] for _ in range(5)])
    cpu = median([timed(dl + ["residency", "--help"])[1] for _ in range(5)])
    print(f"start-up CPU: python -c pass {bare:.3f}s, python -m dltop residency --help {cpu:.3f}s; "
          "cpu = user + system seconds of the whole process; engine = in-process time of the same work")
    return 0


# Targets (dltop / vmtouch, whole processes; issue 22): scans <= 0.6 on small files and <= 0.2 on big files,
# warm <= 0.3, evict <= 1.0.
TARGETS = {("small", "scan"): 0.6, ("tiny", "scan"): 0.6, ("big", "scan"): 0.2, ("small", "warm"): 0.3,
           ("tiny", "warm"): 0.3, ("big", "warm"): 0.3, ("small", "evict"): 1.0, ("tiny", "evict"): 1.0,
           ("big", "evict"): 1.0}


@dataclass
class Row:
    tree: str
    op: str
    wall: float  # dltop's median wall seconds
    v_wall: float  # vmtouch's
    fincore: float | None
    engine: float | None
    cpu: float  # dltop's median CPU seconds (user + system)
    v_cpu: float
    note: str


def scan_row(name: str, tree: Path, repeat: int, dl: list[str]) -> Row:
    """dltop residency against vmtouch and fincore on the tree half warm; the resident pages must agree."""
    drop_caches(tree)
    subprocess.run(dl + ["warm", str(tree), "--include", "*[02468].bin"], cwd=REPO, capture_output=True, check=True)
    d, v, dc, vc, f, e, differ = [], [], [], [], [], [], []
    for _ in range(repeat):
        t, c, out = timed(dl + ["residency", str(tree), "--json"])
        d.append(t)
        dc.append(c)
        d_res = json.loads(out)["paths"][0]["resident_pages"]
        t, c, out = timed(["vmtouch", str(tree)])  # right after: the kernel may reclaim pages in between
        v.append(t)
        vc.append(c)
        v_res = parse_resident(out)[0]
        f_res = fincore_pages(tree)
        if not d_res == v_res == f_res:
            differ.append(f"dltop {d_res} vmtouch {v_res} fincore {f_res}")
        f.append(time_fincore(tree))
        e.append(engine_time("scan", tree))
    agree = "agree (dltop, vmtouch, fincore)" if not differ else "DIFFER " + ", ".join(differ)
    return Row(name, "scan", median(d), median(v), median(f), median(e), median(dc), median(vc),
               f"resident pages {agree}")


def warm_row(name: str, tree: Path, repeat: int, dl: list[str]) -> Row:
    """dltop warm against vmtouch -t, from cold, and the pages each leaves not resident."""
    d, v, dc, vc, d_left, v_left, e = [], [], [], [], [], [], []
    total = 0
    for _ in range(repeat):
        drop_caches(tree)
        e.append(engine_time("warm", tree))
        drop_caches(tree)
        t, c, _out = timed(dl + ["warm", str(tree)])
        d.append(t)
        dc.append(c)
        res, total = resident_pages(tree)
        d_left.append(total - res)
        drop_caches(tree)
        t, c, _out = timed(["vmtouch", "-t", "-q", str(tree)])
        v.append(t)
        vc.append(c)
        res, total = resident_pages(tree)
        v_left.append(total - res)
    return Row(name, "warm", median(d), median(v), None, median(e), median(dc), median(vc),
               f"not resident after: dltop {max(d_left)} vmtouch {max(v_left)} of {total} pages")


def evict_row(name: str, tree: Path, repeat: int, dl: list[str]) -> Row:
    """dltop evict against vmtouch -e, of the tree fully warm, and the pages each leaves."""
    d, v, dc, vc, d_after, v_after = [], [], [], [], [], []
    total = 0
    for _ in range(repeat):
        subprocess.run(["vmtouch", "-t", "-q", str(tree)], check=True)
        t, c, _out = timed(dl + ["evict", str(tree)])
        d.append(t)
        dc.append(c)
        res, total = resident_pages(tree)
        d_after.append(res)
        subprocess.run(["vmtouch", "-t", "-q", str(tree)], check=True)
        t, c, _out = timed(["vmtouch", "-e", "-q", str(tree)])
        v.append(t)
        vc.append(c)
        v_after.append(resident_pages(tree)[0])
    pct = 100 * max(d_after) / total
    return Row(name, "evict", median(d), median(v), None, None, median(dc), median(vc),
               f"left after: dltop {max(d_after)} ({pct:.2f}%) vmtouch {max(v_after)} of {total} pages")


def device_line(big: Path, repeat: int) -> str:
    """The device's own speed on the big tree: every file read in parallel with O_DIRECT (no page cache), the
    floor under any warm of it."""
    files = sorted(big.glob("*.bin"))
    raw = []
    for _ in range(repeat):
        drop_caches(big)
        t0 = time.perf_counter()
        procs = [subprocess.Popen(["dd", f"if={f}", "of=/dev/null", "bs=8M", "iflag=direct"],
                                  stderr=subprocess.DEVNULL) for f in files]
        for p in procs:
            p.wait()
        raw.append(time.perf_counter() - t0)
    return f"device: the big tree read with O_DIRECT, {len(files)} dd in parallel (no page cache): {median(raw):.3f}s"


if __name__ == "__main__":
    sys.exit(main())
