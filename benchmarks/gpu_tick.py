"""The Python cost of one NVML tick: the GPU source reading 8 GPUs x 20 processes from the fake backend.

Wall time and the thread's CPU time are both printed (on a loaded machine wall time includes waiting for a
core). The fake answers at once, so what is measured is dltop's own work per tick (the calls, the version fallbacks,
each process's /proc entry and the model), the part the issue bounds at 5 ms. Each process gets a /proc entry
(cmdline, comm) in a temporary root, so the user and command lookups run as on a real machine.
Run: .venv/bin/python benchmarks/gpu_tick.py [--ticks N] [--scenario FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from dltop.sources.gpu import FakeBackend, GpuReader

SCENARIO = Path(__file__).resolve().parents[1] / "tests/data/gpu-scenarios/8gpu-20proc.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ticks", type=int, default=2000)
    ap.add_argument("--scenario", default=str(SCENARIO))
    args = ap.parse_args()
    scenario = json.loads(Path(args.scenario).read_text())
    with tempfile.TemporaryDirectory() as root:
        for gpu in scenario["gpus"]:
            for p in gpu.get("compute_processes", []):
                d = Path(root, "proc", str(p["pid"]))
                d.mkdir(parents=True, exist_ok=True)
                (d / "cmdline").write_bytes(b"python\0-m\0vllm.entrypoints.openai.api_server\0--port\0" +
                                            str(p["pid"]).encode() + b"\0")
                (d / "comm").write_text("python\n")
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
    times.sort()
    cpu.sort()
    print(f"{len(part)} GPUs, {procs} processes, {args.ticks} ticks")
    print(f"first tick (session start, /proc lookups): {first * 1e3:.2f} ms")
    print(f"tick: median {statistics.median(times) * 1e3:.2f} ms, p95 {times[int(len(times) * 0.95)] * 1e3:.2f} ms,"
          f" max {times[-1] * 1e3:.2f} ms")
    print(f"tick CPU time: median {statistics.median(cpu) * 1e3:.2f} ms, p95 {cpu[int(len(cpu) * 0.95)] * 1e3:.2f} ms"
          " (target: <= 5 ms)")


if __name__ == "__main__":
    main()
