"""The Python cost of one NVML tick: the GPU source reading 8 GPUs x 20 processes from the fake backend.

Wall time and the thread's CPU time are both printed (on a loaded machine wall time includes waiting for a
core). The fake answers at once, so what is measured is dltop's own work per tick (the calls, the version fallbacks,
each process's /proc entry and the model), the part the issue bounds at 5 ms. Each process gets a /proc entry
(cmdline, comm) in a temporary root, so the user and command lookups run as on a real machine.
`--pane` measures the GPU pane instead: the CPU time of handing the app one Snapshot with the GPU tab visible
(the pane's render, the hints, the table's diff), and the same with Textual's painting of the screen that follows
(the CPU of the 50 ms after the tick less that of 50 ms with nothing to paint), with 600 Snapshots of history, in two runs: "steady" (utilization and
power move, memory stays, as in a training or serving job) and "moving" (every process's memory changes every
tick, the worst case); `--size` the terminal (120x40 by default; the overhead benchmark's is 80x24).
Run: .venv/bin/python benchmarks/gpu_tick.py [--ticks N] [--scenario FILE] [--pane [--size WxH]]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from dltop.derive import join_splits
from dltop.model import ProbeDevice, ProbesPart, ProcessProbe
from dltop.sources.gpu import FakeBackend, GpuReader

SCENARIO = Path(__file__).resolve().parents[1] / "tests/data/gpu-scenarios/8gpu-20proc.json"
PAINT_S = 0.05  # time given to Textual to paint after a tick (its screen updates at up to 60 a second)


def pane_ticks(scenario: dict[str, Any], ticks: int, moving: bool,
               size: tuple[int, int]) -> tuple[list[float], list[float]]:
    """CPU seconds of each `DltopApp.apply` with the GPU pane visible, after 600 Snapshots of history, and of
    each with the painting that follows it."""
    import asyncio

    from dltop.model import Snapshot
    from dltop.sampler import ListFeed
    from dltop.tui.app import DltopApp

    reader = GpuReader(lambda: FakeBackend(scenario))
    snaps = []
    for i in range(600 + ticks):
        for g in scenario["gpus"]:
            g["utilization"]["gpu"] = (i * 7) % 100
            g["power_mw"] = 200_000 + (i * 1013) % 90_000
            for p in g["compute_processes"] if moving else ():
                p["used_bytes"] += 1 << 20
        snaps.append(Snapshot(ts=1000.0 + i, host="bench", gpus=reader.read()))
    reader.close()
    cpu: list[float] = []
    painted: list[float] = []
    idle: list[float] = []

    async def run() -> None:
        app = DltopApp(ListFeed(snaps[:600], start=599))
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            for snap in snaps[600:]:
                c0 = time.thread_time()
                app.apply(snap)
                cpu.append(time.thread_time() - c0)
                # Textual paints on its own timer, as between two ticks (not pilot.pause(): it posts a callback to
                # every widget on the screen, a cost of its own)
                await asyncio.sleep(PAINT_S)
                painted.append(time.thread_time() - c0)
                c0 = time.thread_time()
                await asyncio.sleep(PAINT_S)  # the same wait with nothing to paint: the app's idle cost
                idle.append(time.thread_time() - c0)

    asyncio.run(run())
    rest = statistics.median(idle)
    return sorted(cpu), sorted(max(0.0, p - rest) for p in painted)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ticks", type=int, default=2000)
    ap.add_argument("--scenario", default=str(SCENARIO))
    ap.add_argument("--pane", action="store_true", help="measure the GPU pane's render instead of the NVML tick")
    ap.add_argument("--size", default="120x40", help="the terminal for --pane, WxH (default 120x40)")
    args = ap.parse_args()
    scenario = json.loads(Path(args.scenario).read_text())
    if args.pane:
        n = min(args.ticks, 300)
        w, h = (int(x) for x in args.size.lower().split("x"))
        procs = sum(len(g.get("compute_processes", [])) for g in scenario["gpus"])
        print(f"GPU pane at {w}x{h}: {len(scenario['gpus'])} GPUs, {procs} processes, 600 Snapshots of history, "
              f"{n} ticks")
        for moving in (False, True):
            cpu, painted = pane_ticks(json.loads(Path(args.scenario).read_text()), n, moving, (w, h))
            print(f"{'moving' if moving else 'steady'}: CPU per tick median {statistics.median(cpu) * 1e3:.2f} ms, "
                  f"p95 {cpu[int(len(cpu) * 0.95)] * 1e3:.2f} ms; with Textual's painting median "
                  f"{statistics.median(painted) * 1e3:.2f} ms, p95 {painted[int(len(painted) * 0.95)] * 1e3:.2f} ms")
        return
    with tempfile.TemporaryDirectory() as root:
        for gpu in scenario["gpus"]:
            for p in gpu.get("compute_processes", []):
                d = Path(root, "proc", str(p["pid"]))
                d.mkdir(parents=True, exist_ok=True)
                (d / "cmdline").write_bytes(b"python\0-m\0vllm.entrypoints.openai.api_server\0--port\0" +
                                            str(p["pid"]).encode() + b"\0")
                (d / "comm").write_text("python\n")
                (d / "stat").write_text(f"{p['pid']} (python) S {' '.join(['0'] * 18)} 4242\n")
        reader = GpuReader(lambda: FakeBackend(scenario), root)
        first = time.perf_counter()
        part = reader.read()
        first = time.perf_counter() - first
        assert isinstance(part, tuple), part
        procs = sum(len(g.processes) for g in part if isinstance(g.processes, tuple))
        times, cpu = [], []
        for _ in range(args.ticks):
            t0, c0 = time.perf_counter(), time.thread_time()
            reader.read()
            cpu.append(time.thread_time() - c0)
            times.append(time.perf_counter() - t0)
        reader.close()
    # The split: one probe per GPU (a DDP rank on each) joined to NVML's processes, as the Sampler does it on
    # every Snapshot it composes.
    probes = ProbesPart(processes=tuple(
        ProcessProbe(pid=g.processes[0].pid, path="", uid=0, start_time_ticks=4242, cmd="train.py",
                     published_at=time.time(), watched={"models": 1, "optimizers": 1, "kv": 0},
                     devices=(ProbeDevice("cuda:0", 1 << 30, 1 << 30, 2 << 30, 0,
                                          {"allocated_bytes.all.current": 5 << 30,
                                           "reserved_bytes.all.current": 6 << 30},
                                          (g.uuid or "").removeprefix("GPU-")),))
        for g in part if isinstance(g.processes, tuple) and g.processes))
    joins = []
    for _ in range(args.ticks):
        c0 = time.thread_time()
        joined = join_splits(part, probes, None, time.time())
        joins.append(time.thread_time() - c0)
    assert isinstance(joined, tuple)
    split = sum(p.split.probe_device is not None for g in joined if isinstance(g.processes, tuple) for p in g.processes)
    times.sort()
    cpu.sort()
    joins.sort()
    print(f"{len(part)} GPUs, {procs} processes, {args.ticks} ticks")
    print(f"first tick (session start, /proc lookups): {first * 1e3:.2f} ms")
    print(f"tick: median {statistics.median(times) * 1e3:.2f} ms, p95 {times[int(len(times) * 0.95)] * 1e3:.2f} ms,"
          f" max {times[-1] * 1e3:.2f} ms")
    print(f"tick CPU time: median {statistics.median(cpu) * 1e3:.2f} ms, p95 {cpu[int(len(cpu) * 0.95)] * 1e3:.2f} ms"
          " (target: <= 5 ms)")
    print(f"split join ({len(probes.processes)} probes, {split} processes split): CPU median "
          f"{statistics.median(joins) * 1e3:.2f} ms, p95 {joins[int(len(joins) * 0.95)] * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
