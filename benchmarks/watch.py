"""What watching a big dataset costs: dltop's TUI (80x24, 1 s refresh) watching a tree while a job reads it.

    .venv/bin/python benchmarks/watch.py [--files 100000] [--bytes 4096] [--dir /var/tmp/dltop-watch]
                                         [--seconds 60] [--rate 500] [--settle 40] [--accuracy]
                                         [--profile stacks.txt [--py-spy PATH]] [--in-process] [--code CHECKOUT]

Makes the tree (1,000 files a folder; reused when already there, removed with --clean), starts dltop on it in a
tmux pane and a job that reads --rate random files a second (open, read, close, as a DataLoader does), waits
--settle seconds (the first scans), then measures dltop's CPU time (/proc/PID/stat, children included) and RSS
over --seconds. htop is not the baseline here: it watches no dataset. Targets (issue 22): <= 1.5% of a core
for 100,000 files, <= 2% for 1,000,000 (0-byte files on tmpfs do: --dir /dev/shm/x --bytes 0).

--discovery measures finding the datasets jobs read (dltop/sources/found.py), in this process, side by side with
discovery off: the datasets source (watching the tree) read at its 10 s cadence over --seconds, once with
--no-discover and once with a DataLoader-like job reading a second tree (--files / 10 files: 4 workers holding 16
shards open each, one swapped every 0.2 s) named by --pid, and a hostile process holding 16,000 descriptors; the
CPU of each, and the look at a job's descriptors alone.

--accuracy instead evicts the tree, runs the watch in this process at the source's 10 s cadence while the job
reads it back in, and compares each read with vmtouch (folder by folder, its opens not taken for the job's; the
job stopped while both count):
the largest difference in resident pages, as a share of the tree's pages, and the largest estimate bound.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from overhead import REPO, TMUX_SOCKET, cpu_seconds, dltop_command, start, status_kb, tmux  # noqa: E402

PER_DIR = 1000

JOB = """
import os, random, sys, time
root, n, rate = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
dirs = (n + 999) // 1000
t0 = time.monotonic(); done = 0
while True:
    i = random.randrange(n)
    with open(f"{root}/d{i // 1000:04}/f{i % 1000:03}.bin", "rb") as f:
        f.read()
    done += 1
    ahead = done / rate - (time.monotonic() - t0)
    if ahead > 0:
        time.sleep(ahead)
"""


def make_tree(root: Path, files: int, nbytes: int) -> None:
    last = root / f"d{(files - 1) // PER_DIR:04}" / f"f{(files - 1) % PER_DIR:03}.bin"
    if last.exists() and last.stat().st_size == nbytes:
        return
    print(f"making {files} x {nbytes} B files in {root} ...", file=sys.stderr)
    data = os.urandom(nbytes)
    for i in range(files):
        d = root / f"d{i // PER_DIR:04}"
        if i % PER_DIR == 0:
            d.mkdir(parents=True, exist_ok=True)
        with open(d / f"f{i % PER_DIR:03}.bin", "wb") as f:
            f.write(data)
    os.sync()


def drop_pagecache() -> int:
    """How many times anyone wrote to /proc/sys/vm/drop_caches since boot."""
    for line in Path("/proc/vmstat").read_text().splitlines():
        if line.startswith("drop_pagecache "):
            return int(line.split()[1])
    return 0


def vmtouch_resident(root: Path) -> int:
    out = subprocess.run(["vmtouch", str(root)], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        if "Resident Pages:" in line:
            return int(line.split()[2].split("/")[0])
    raise SystemExit("vmtouch printed no 'Resident Pages' line")


def vmtouch_unseen(w: object, root: Path) -> int:
    """vmtouch's resident pages of the tree, folder by folder, its opens (one each) drained and counted as the
    watch's own: one vmtouch of the whole tree would overflow the event queue, and the watch would measure
    everything again at its next read, which is not what is being checked."""
    total = 0
    for d in sorted(root.iterdir()):
        total += vmtouch_resident(d)
        with w.events.lock:  # type: ignore[attr-defined]
            w.events.drain()  # type: ignore[attr-defined]
        f = next((g for g in w.folders.by_wd.values() if g.path == str(d)), None)  # type: ignore[attr-defined]
        if f is not None:
            for name in os.listdir(d):
                w.events.own_event(f.wd, name)  # type: ignore[attr-defined]
    return total


def accuracy(root: Path, seconds: float, job: subprocess.Popen[bytes]) -> None:
    from dltop.residency.walk import WalkOptions
    from dltop.residency.watch import DatasetWatch
    from dltop.sources.datasets import SOURCE_MAX_DEPTH

    subprocess.run(["vmtouch", "-q", "-e", str(root)], check=True)  # cold: the job's reads bring pages in
    w = DatasetWatch(str(root), WalkOptions(max_depth=SOURCE_MAX_DEPTH), 0.5)
    ds, _ = w.read()
    worst = bound = 0.0
    outside = 0  # reads whose difference was more than their bound (and more than the 1% target)
    t_end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < t_end:
        time.sleep(10)
        job.send_signal(signal.SIGSTOP)  # the job waits while both count: the same pages for both
        try:
            c0 = time.thread_time()
            ds, _ = w.read()
            cpu = time.thread_time() - c0
            truth = vmtouch_unseen(w, root)
        finally:
            job.send_signal(signal.SIGCONT)
        diff = abs(ds.resident_pages - truth) / max(1, ds.pages)
        worst, bound = max(worst, diff), max(bound, ds.estimate_error_pages / max(1, ds.pages))
        if abs(ds.resident_pages - truth) > max(ds.estimate_error_pages, 0.01 * ds.pages):
            outside += 1
        n += 1
        print(f"read {n}: {cpu * 1000:.0f} ms CPU, watch {ds.resident_pages} vmtouch {truth} pages "
              f"({100 * diff:.3f}% of {ds.pages}), estimated {ds.estimated} bound {ds.estimate_error_pages}"
              + (f" ({ds.estimate_reason})" if ds.estimate_reason else ""))
    w.close()
    print(f"accuracy: largest difference {100 * worst:.3f}% of the tree's pages, largest bound {100 * bound:.3f}%; "
          f"reads off by more than their bound and 1%: {outside} of {n}")


def in_process(root: Path, seconds: float) -> None:
    """The watch alone, in this process at the source's cadence (every 10 s) while the job reads: its CPU (the
    drain thread's too) per second, and how much of it the reads took; no TUI around it."""
    from dltop.residency import watch
    from dltop.residency.rank import FILE_SORT_KEYS
    from dltop.residency.walk import WalkOptions
    from dltop.residency.watch import DatasetWatch
    from dltop.sources.datasets import SOURCE_MAX_DEPTH, SOURCE_TOP_BUDGET, SOURCE_TOP_FILES

    options = WalkOptions(max_depth=SOURCE_MAX_DEPTH, top_files=SOURCE_TOP_FILES, top_keys=FILE_SORT_KEYS,
                          top_budget=SOURCE_TOP_BUDGET)
    c0, start_drops = time.process_time(), drop_pagecache()
    w = DatasetWatch(str(root), options, 0.5)
    w.read()
    print(f"first read (the full scan): {time.process_time() - c0:.2f} s CPU")
    drops, reads_cpu, n = drop_pagecache(), 0.0, 0
    quiet: list[float] = []  # CPU of each read with no drop_caches since the one before (no full rescan)
    earlier, last = start_drops, drops  # a drop during the first read makes the next one measure everything
    p0, t0 = time.process_time(), time.monotonic()
    while time.monotonic() - t0 < seconds:
        time.sleep(10)
        c = time.thread_time()
        w.read()
        took = time.thread_time() - c
        reads_cpu += took
        n += 1
        now = drop_pagecache()
        if now == last == earlier:  # a drop late in the read before makes this one measure everything again
            quiet.append(took)
        earlier, last = last, now
    wall, cpu = time.monotonic() - t0, time.process_time() - p0
    w.close()
    print(f"in process: {100 * cpu / wall:.2f}% of a core over {wall:.0f} s, {n} reads "
          f"({1000 * reads_cpu / max(1, n):.0f} ms CPU each; the drain thread the rest)")
    if quiet:  # the VM's other users drop the page cache now and then: such reads measure everything again
        drain = 100 * (cpu - reads_cpu) / wall
        med = statistics.median(quiet)
        print(f"undisturbed reads: {len(quiet)} of {n}, median {1000 * med:.0f} ms CPU each: {100 * med / 10:.2f}% "
              f"of a core at the 10 s cadence, plus the drain thread's {drain:.2f}%: {100 * med / 10 + drain:.2f}%")
    roll_files, roll_cpu_s = getattr(w, "roll_files", None), getattr(w, "roll_cpu_s", None)
    if roll_files is not None and roll_cpu_s is not None:  # (main before 5406ede kept no count)
        print(f"the rolling pass: {100 * roll_cpu_s / wall:.2f}% of a core, {roll_files / max(1, n):.0f} files a read "
              f"(all reads since the first, its share {100 * watch.ROLL_CPU_SHARE:.2f}%)")
    if drop_pagecache() != drops:
        print("disturbed: drop_caches on the machine during the window")


LOADER = """
import os, random, sys, time
root, n, hostile = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def name(i):
    return f"{root}/d{i // 1000:04}/f{i % 1000:03}.bin"
if hostile:  # one process holding thousands of descriptors of one file
    import resource
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    first = os.open(name(0), os.O_RDONLY)
    kept = [os.dup(first) for _ in range(hostile)]
    print("ready", flush=True)
    time.sleep(100000)
for w in range(4):  # DataLoader workers: each holds 16 shards open and swaps one every 0.2 s
    if os.fork() == 0:
        fds = [os.open(name(random.randrange(n)), os.O_RDONLY) for _ in range(16)]
        while True:
            time.sleep(0.2)
            os.close(fds.pop(0))
            fds.append(os.open(name(random.randrange(n)), os.O_RDONLY))
print("ready", flush=True)
time.sleep(100000)
"""


def discovery_cost(root: Path, files: int, nbytes: int, seconds: float) -> None:
    """The datasets source watching `root` at its 10 s cadence, with discovery off and on (a job reading another
    tree, a process holding 16,000 descriptors): CPU a second of each."""
    from dltop.config import Settings
    from dltop.sources import datasets, found

    other = root.parent / (root.name + "-found")
    make_tree(other, max(1000, files // 10), nbytes)
    jobs = [subprocess.Popen([sys.executable, "-c", LOADER, str(other), str(max(1000, files // 10)), str(h)],
                             stdout=subprocess.PIPE, text=True, start_new_session=True) for h in (0, 16_000)]
    try:
        for j in jobs:
            assert j.stdout is not None and j.stdout.readline().strip() == "ready"
        d = found.Discovery(datasets.WalkOptions(max_depth=6), None, pid=jobs[1].pid)
        c0 = time.thread_time()
        d._refresh_jobs()
        for j in d.jobs.values():
            d._look(j, time.monotonic() + 10)
        print(f"a look at a process holding 16,000 descriptors: {1000 * (time.thread_time() - c0):.0f} ms CPU "
              f"(at most {found.MAX_FDS} of them, within {found.LOOK_BUDGET_S:g} s; once every {found.REVISIT_S:g} s)")
        for on in (False, True):
            src = datasets.source(Settings(datasets=(str(root),), discover=on, pid=jobs[0].pid))
            c0 = time.thread_time()
            part = src.read()
            first = time.thread_time() - c0
            cpu, n, t0 = 0.0, 0, time.monotonic()
            while time.monotonic() - t0 < seconds:
                time.sleep(10)
                c = time.thread_time()
                part = src.read()
                cpu += time.thread_time() - c
                n += 1
            wall = time.monotonic() - t0
            if src.close is not None:
                src.close()
            what = ", ".join(f"{f.path} ({f.scan.files if f.scan else '?'} files, "
                             f"{sum(r.files_open for r in f.readers)} open)" for f in part.found) or "-"
            print(f"discovery {'on ' if on else 'off'}: first read {first:.2f} s CPU; then {100 * cpu / wall:.3f}% "
                  f"of a core over {n} reads at the 10 s cadence; found: {what}")
    finally:
        for j in jobs:
            os.killpg(j.pid, signal.SIGKILL)  # the workers too
            j.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--bytes", type=int, default=4096)
    ap.add_argument("--dir", default="/var/tmp/dltop-watch")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--rate", type=float, default=500.0, help="files the job reads a second")
    ap.add_argument("--settle", type=float, default=40.0, help="seconds before measuring (the first scans)")
    ap.add_argument("--accuracy", action="store_true")
    ap.add_argument("--in-process", action="store_true", help="the watch alone in this process, no TUI")
    ap.add_argument("--discovery", action="store_true", help="the datasets source with discovery off and on")
    ap.add_argument("--profile", metavar="FILE", help="also sample dltop with py-spy over the window (raw stacks)")
    ap.add_argument("--py-spy", default="py-spy", help="the py-spy to run (--profile)")
    ap.add_argument("--clean", action="store_true", help="remove the tree at the end")
    ap.add_argument("--code", default=str(REPO), help="the checkout whose dltop the TUI runs (main for 'before')")
    args = ap.parse_args()
    root = Path(args.dir)
    make_tree(root, args.files, args.bytes)
    job = subprocess.Popen([sys.executable, "-c", JOB, str(root), str(args.files), str(args.rate)])
    try:
        if args.accuracy:
            accuracy(root, args.seconds, job)
            return 0
        if args.in_process:
            in_process(root, args.seconds)
            return 0
        if args.discovery:
            discovery_cost(root, args.files, args.bytes, args.seconds)
            return 0
        subprocess.run(["tmux", "-L", TMUX_SOCKET, "kill-server"], capture_output=True)
        tmux("new-session", "-d", "-s", "bench", "-x", "80", "-y", "24", "sleep 100000")
        try:
            pid, first, _ = start("dltop", f"{dltop_command(Path(args.code))} {root}", "Page cache")
            time.sleep(max(0.0, args.settle - 12))
            drops = drop_pagecache()  # one read (10 s) before the window: a drop then is measured in it
            time.sleep(min(12.0, args.settle))
            c0, t0 = cpu_seconds(pid), time.monotonic()
            start_cpu = c0
            if args.profile:  # py-spy samples dltop (all its threads) over the window: collapsed stacks
                subprocess.run([args.py_spy, "record", "--pid", str(pid), "--duration", str(int(args.seconds)),
                                "--rate", "200", "--format", "raw", "--nonblocking", "--output", args.profile],
                               capture_output=True, check=False)
            time.sleep(max(0.0, args.seconds - (time.monotonic() - t0)))
            pct = 100 * (cpu_seconds(pid) - c0) / (time.monotonic() - t0)
            drops = drop_pagecache() - drops
            rss, hwm = status_kb(pid, "VmRSS") / 1024, status_kb(pid, "VmHWM") / 1024
        finally:
            subprocess.run(["tmux", "-L", TMUX_SOCKET, "kill-server"], capture_output=True)
        target = 1.5 if args.files <= 100_000 else 2.0
        print(f"watching {args.files} x {args.bytes} B files while a job reads {args.rate:.0f} files/s, "
              f"{os.cpu_count()} CPUs, over {args.seconds:.0f} s after {args.settle:.0f} s")
        print(f"first frame {first:.3f} s, CPU {pct:.2f}% of a core (target <= {target}), RSS {rss:.1f} MB, "
              f"peak {hwm:.1f} MB; {start_cpu:.2f} s of CPU before the window (the first scan)")
        if drops:  # another process dropped the page cache: the watch measured everything again, as it must
            print(f"disturbed: {drops} drop_caches on the machine during the window or the read before it")
    finally:
        job.kill()
        job.wait()
        if args.clean:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    random.seed(0)
    sys.exit(main())
