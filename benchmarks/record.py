"""What the flight recorder costs and how fast a recording reads, on a simulated machine of the issue's size.

  python benchmarks/record.py                  # 24 h at 1 s: bytes per day, writer CPU, seek, dump to CSV
  python benchmarks/record.py --hours 2        # a shorter recording (bytes per day extrapolated)
  python benchmarks/record.py --live 60        # also: a real `dltop record` process for 60 s, its CPU from /proc
  python benchmarks/record.py --keep DIR       # keep the recording made, in DIR
  python benchmarks/record.py --recording DIR  # only seek and dump, on a recording kept before
  python benchmarks/record.py --recording DIR --code /work/main --code .   # the dump by two checkouts, side by side
  python benchmarks/record.py --recording DIR --format csv --format openmetrics --fields 'memory_*'

The machine: 4 GPUs with 5 processes each (20), 5 datasets rescanned every minute, this machine's memory and
CPU parts. It starts from a real Snapshot (the real Sampler: /proc, sysfs, the fake NVML of the 8-GPU
scenario cut to 4 GPUs, 5 dataset folders made here and scanned) and moves every counter and gauge each second
the way a busy machine does, so the compressor sees what it would see. Reported:

  - bytes per day on disk (closed segments: zstd frames and their index) and per sample;
  - the writer's CPU per sample, as a share of one core at a 1 s interval (target <= 0.5%);
  - the time to open the 24 h recording and reach a random moment (`Recording.at`), median and worst of 50
    (target <= 0.2 s), against reading the same day from plain JSON Lines (what a recorder without an index
    would have to scan);
  - `dltop dump --format csv` of the whole day, wall time (a subprocess), and rows written.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing

from dltop.config import Settings  # noqa: E402
from dltop.model import Snapshot, SourceStatus  # noqa: E402
from dltop.recorder import Recorder, Recording  # noqa: E402
from dltop.sampler import Sampler  # noqa: E402
from dltop.sources.registry import build_sources  # noqa: E402

SCENARIO = REPO / "tests/data/gpu-scenarios/8gpu-20proc.json"
GPUS, PROCS_PER_GPU, DATASETS = 4, 5, 5


def base_snapshot(work: Path) -> Snapshot:
    """One real Snapshot of this machine with 4 GPUs, 20 processes with commands, 5 scanned datasets."""
    os.environ["DLTOP_FAKE_NVML"] = str(SCENARIO)
    paths = []
    for d in range(DATASETS):
        root = work / f"dataset{d}"
        for shard in range(8):
            (root / f"shard{shard:02d}").mkdir(parents=True, exist_ok=True)
            for k in range(4):
                (root / f"shard{shard:02d}" / f"part{k}.bin").write_bytes(os.urandom(16384))
        paths.append(str(root))
    sampler = Sampler(build_sources(Settings(datasets=tuple(paths))))
    try:
        snap = sampler.read_once()
    finally:
        sampler.close()
    assert isinstance(snap.gpus, tuple)
    gpus = []
    for g in snap.gpus[:GPUS]:
        assert isinstance(g.processes, tuple)
        procs = tuple(dataclasses.replace(p, user="alice", unavailable={},
                                          command=f"python train.py --config configs/llama-8b.yaml --rank {p.pid % 8}")
                      for p in g.processes[:PROCS_PER_GPU])
        gpus.append(dataclasses.replace(g, processes=procs))
    return dataclasses.replace(snap, gpus=tuple(gpus))


def moving(base: Snapshot, seconds: int, t0: float, seed: int = 0) -> Iterator[Snapshot]:
    """`seconds` Snapshots one second apart, every number moving as on a busy machine."""
    rng = random.Random(seed)
    mem, gpus, ds = base.memory, base.gpus, base.datasets
    assert mem is not None and not isinstance(mem, Exception) and isinstance(gpus, tuple)
    vm = mem.vmstat
    for i in range(seconds):
        ts = t0 + i + rng.uniform(0, 0.004)
        m = dataclasses.replace(
            mem, cached_bytes=(mem.cached_bytes or 0) + rng.randrange(-1 << 26, 1 << 26) // 4096 * 4096,
            dirty_bytes=rng.randrange(0, 1 << 30) // 4096 * 4096, writeback_bytes=rng.randrange(0, 1 << 24) // 4096 * 4096,
            available_bytes=(mem.available_bytes or 0) - rng.randrange(0, 1 << 28) // 4096 * 4096,
            vmstat=dataclasses.replace(vm, pgpgin=(vm.pgpgin or 0) + i * 5000 + rng.randrange(5000),  # type: ignore[union-attr]
                                       pgpgout=(vm.pgpgout or 0) + i * 3000, pgmajfault=(vm.pgmajfault or 0) + i * 3,  # type: ignore[union-attr]
                                       workingset_refault_file=(vm.workingset_refault_file or 0) + i * 40))  # type: ignore[union-attr]
        g2 = tuple(dataclasses.replace(
            g, memory_used_bytes=(g.memory_used_bytes or 0) + rng.randrange(-1 << 28, 1 << 28) // 1048576 * 1048576,
            utilization_gpu_percent=rng.randrange(80, 100), utilization_memory_percent=rng.randrange(30, 70),
            temperature_c=rng.randrange(55, 75), power_mw=rng.randrange(400_000, 700_000),
            clock_sm_mhz=rng.choice((1980, 1965, 1950)),
            pcie_tx_bytes_total=(g.pcie_tx_bytes_total or 0) + i * 10_000_000 + rng.randrange(1_000_000),
            pcie_rx_bytes_total=(g.pcie_rx_bytes_total or 0) + i * 50_000_000 + rng.randrange(1_000_000),
            processes=tuple(dataclasses.replace(p, gpu_util_percent=rng.randrange(0, 100),
                                                mem_util_percent=rng.randrange(0, 60),
                                                used_bytes=(p.used_bytes or 0) + rng.randrange(0, 8) * 2 * 1048576)
                            for p in g.processes))  # type: ignore[union-attr]
            for g in gpus)
        if i % 60 == 0 and ds is not None and not isinstance(ds, Exception):
            # A rescan a minute: new residency numbers and a new scan time.
            ds = dataclasses.replace(ds, paths=tuple(
                dataclasses.replace(d, scanned_at=ts, resident_pages=rng.randrange(0, max(1, d.pages)))
                if not isinstance(d, Exception) and hasattr(d, "resident_pages") else d
                for d in ds.paths))  # type: ignore[union-attr]
        sources = {n: dataclasses.replace(s, last_ok_ts=ts - rng.uniform(0, 0.05), duration_s=rng.uniform(0.001, 0.02))
                   for n, s in base.sources.items()} if base.sources else {"memory": SourceStatus("memory", 1.0)}
        yield dataclasses.replace(base, ts=ts, uptime_s=(base.uptime_s or 0) + i, memory=m, gpus=g2, datasets=ds,
                                  sources=sources)


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.name != "lock")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hours", type=float, default=24.0, help="length of the recording (default 24)")
    ap.add_argument("--live", type=float, default=0.0, metavar="SECONDS",
                    help="also run a real `dltop record` for this long and read its CPU time")
    ap.add_argument("--keep", metavar="DIR", help="write the recording into DIR and keep it")
    ap.add_argument("--recording", metavar="DIR", help="measure seek and dump on this recording; write none")
    ap.add_argument("--code", metavar="CHECKOUT", action="append",
                    help="dump with this checkout's dltop (default: this one); given more than once, each in turn, "
                         "the same recording, in the same minutes (before and after), each with the load beside it")
    ap.add_argument("--repeat", type=int, default=1, help="dump this many times with each checkout (default 1)")
    ap.add_argument("--format", action="append", choices=("csv", "openmetrics"),
                    help="the dump's format (default csv); given more than once, each in turn")
    ap.add_argument("--fields", help="the dump's --fields (default: every gauge and counter)")
    args = ap.parse_args()
    codes = [Path(c).resolve() for c in args.code] if args.code else [REPO]
    if args.recording:
        r = Recording(args.recording)
        print(f"recording {args.recording}: {len(r)} samples, {dir_bytes(Path(args.recording)) / 1e6:.1f} MB")
        if not args.code:
            read_back(Path(args.recording), r.first_ts or 0.0, (r.last_ts or 0.0) - (r.first_ts or 0.0))
        dumps(Path(args.recording), codes, args.repeat, args.format or ["csv"], args.fields)
        return 0
    seconds = int(args.hours * 3600)
    with tempfile.TemporaryDirectory(prefix="dltop-bench-") as tmp:
        work = Path(tmp)
        base = base_snapshot(work)
        rec_dir = Path(args.keep) if args.keep else work / "rec"
        t0 = time.time() - seconds
        print(f"machine: {GPUS} GPUs, {GPUS * PROCS_PER_GPU} GPU processes, {DATASETS} datasets; "
              f"{seconds} samples at 1 s ({args.hours:g} h)")
        print(f"one sample as Snapshot JSON: {len(base.to_json())} bytes")

        # The writer's CPU: the Snapshots are made first (hour by hour), so only the recorder's work is timed.
        gen = moving(base, seconds, t0)
        cpu = 0.0
        jsonl_bytes = 0
        with Recorder(str(rec_dir), retain_s=None, max_bytes=None, warn=lambda _t: None) as rec:
            done = 0
            while done < seconds:
                batch = [next(gen) for _ in range(min(3600, seconds - done))]
                jsonl_bytes += sum(len(s.to_json()) + 1 for s in batch[:: 60]) * 60
                c0 = time.thread_time()
                w0 = time.process_time()
                for s in batch:
                    rec.write(s, wait=True)
                while rec.samples < done + len(batch):
                    time.sleep(0.01)
                cpu += (time.process_time() - w0) - (time.thread_time() - c0)  # the writer thread, not this one
                done += len(batch)
        size = dir_bytes(rec_dir)
        per_day = size * 86400 / seconds
        per_sample_ms = cpu / seconds * 1000
        print(f"on disk: {size / 1e6:.1f} MB for {args.hours:g} h = {per_day / 1e6:.1f} MB per day "
              f"({size / seconds:.0f} B per sample; plain JSON Lines would be ~{jsonl_bytes * 86400 / seconds / 1e9:.1f} "
              f"GB per day, {jsonl_bytes / size:.0f}x more)  [target <= 25 MB per day]")
        print(f"writer CPU: {per_sample_ms:.2f} ms per sample (compression included) = "
              f"{per_sample_ms / 10:.3f}% of one core at 1 s  [target <= 0.5%]")

        read_back(rec_dir, t0, seconds)
        dumps(rec_dir, codes, args.repeat, args.format or ["csv"], args.fields)
        if args.live:
            live(work, args.live)
    return 0


def read_back(rec_dir: Path, t0: float, seconds: float) -> None:
    """Seek (open the recording and reach a random moment, as `dltop replay -t` does) and dump a day to CSV."""
    rng = random.Random(1)
    opens, seeks = [], []
    for _ in range(50):
        t = t0 + rng.uniform(0, seconds)
        a = time.perf_counter()
        r = Recording(str(rec_dir))
        b = time.perf_counter()
        snap = r.at(t)
        c = time.perf_counter()
        assert snap.ts <= t + 1
        opens.append(b - a)
        seeks.append(c - b)
    both = [o + s for o, s in zip(opens, seeks, strict=True)]
    print(f"open + seek to a random moment: median {statistics.median(both) * 1000:.0f} ms, worst "
          f"{max(both) * 1000:.0f} ms (open {statistics.median(opens) * 1000:.0f} ms, seek "
          f"{statistics.median(seeks) * 1000:.0f} ms)  [target <= 200 ms]")
    r = Recording(str(rec_dir))
    a = time.perf_counter()
    for _ in range(200):
        r.at(t0 + rng.uniform(0, seconds))
    print(f"seek in an open recording: {(time.perf_counter() - a) / 200 * 1000:.1f} ms each (200 random)")



def dumps(rec_dir: Path, codes: list[Path], repeat: int, formats: list[str], fields: str | None = None) -> None:
    """`dltop dump --format FMT` of the whole recording, as a user would, by each checkout in turn: wall time, CPU
    time (the dump's processes, its pieces' included) and the load average beside each; the outputs compared."""
    for fmt in formats:
        digests: dict[int, list[str]] = {}
        for _ in range(repeat):
            for code in codes:
                cmd = [sys.executable, "-m", "dltop", "dump", str(rec_dir), "--format", fmt]
                cmd += ["--fields", fields] if fields else []
                load = os.getloadavg()[0]
                cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                a = time.perf_counter()
                out = subprocess.run(cmd, capture_output=True, text=True, cwd=code,
                                     env={**os.environ, "PYTHONPATH": str(code)})
                took = time.perf_counter() - a
                cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
                label = f" ({code})" if len(codes) > 1 or code != REPO else ""
                what = f"dltop dump --format {fmt}{f' --fields {fields}' if fields else ''}{label}"
                if out.returncode != 0:
                    print(f"{what} failed: {out.stderr.strip()}")
                    continue
                lines = out.stdout.count("\n")
                if fmt == "csv":
                    cols = len(next(csv.reader([out.stdout.split("\n", 1)[0]])))  # names may hold commas, quoted
                    size = f"{lines - 1} rows x {cols} columns"
                else:
                    size = f"{lines} lines"
                digests.setdefault(hash(out.stdout), []).append(str(code))
                print(f"{what}: {took:.1f} s for {size} ({len(out.stdout) / 1e6:.0f} MB; {cpu:.1f} CPU-seconds over "
                      f"{os.cpu_count()} CPUs; load {load:.2f} before, {os.getloadavg()[0]:.2f} after)", flush=True)
        if len(codes) > 1:
            print(f"the {fmt} outputs: " + ("the same, byte for byte" if len(digests) == 1
                                            else f"DIFFER ({len(digests)} kinds)"))


def live(work: Path, seconds: float) -> None:
    """A real `dltop record` at 1 s (8 GPUs x 20 processes from the fake NVML, 5 datasets): its CPU from /proc."""
    env = {**os.environ, "DLTOP_FAKE_NVML": str(SCENARIO)}
    cmd = [sys.executable, "-m", "dltop", "record", "-o", str(work / "live"), "-i", "1"]
    for d in range(DATASETS):
        cmd += ["--dataset", str(work / f"dataset{d}")]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL, cwd=REPO)
    tick = os.sysconf("SC_CLK_TCK")

    def cpu_s() -> float:
        with open(f"/proc/{proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / tick

    time.sleep(5)  # past start-up (imports, the first reads)
    c0, w0 = cpu_s(), time.monotonic()
    time.sleep(seconds)
    c1, w1 = cpu_s(), time.monotonic()
    proc.terminate()
    proc.wait(60)
    print(f"dltop record (live, 8 GPUs x 20 processes, {DATASETS} datasets, sampling included): "
          f"{(c1 - c0) / (w1 - w0) * 100:.2f}% of one core over {w1 - w0:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
