"""What `dltop export` costs: the time of a scrape on a big node, and the CPU of the exporter left running, side by
side with node_exporter (Debian's prometheus-node-exporter) over the same window where it is installed.

Scrape: 8 GPUs x 20 processes (the fake NVML's 8gpu-20proc scenario, every process with a known split, so each
has its six series), 20 datasets (one real scan of files made here, under 20 names), 10 caches (one real walk
under 10 names) and the machine's own memory part, served by the real HTTP server; each timed scrape follows a new Snapshot, so it pays the build and the
encoding (the cost Prometheus sees), and a second scrape of the same Snapshot shows what a second Prometheus
pays.

CPU: `dltop export` (real sources, default --interval) and node_exporter, each scraped every 15 s as Prometheus
would, CPU time from /proc/PID/stat (utime + stime) over the window.

usage: python benchmarks/export.py [--seconds 60] [--scrapes 200]
Targets (issue 13): a scrape <= 20 ms; the exporter <= 0.5% of one core.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dltop.exporter.collector import SnapshotCollector  # noqa: E402
from dltop.exporter.server import ExporterServer  # noqa: E402
from dltop.model import CachesPart, Snapshot  # noqa: E402
from dltop.model.gpu import SPLIT_FIELDS, MemorySplit  # noqa: E402
from dltop.residency.scan import scan_paths  # noqa: E402
from dltop.sources.caches import environment_of, read_caches  # noqa: E402
from dltop.sources.gpu import FakeBackend, GpuReader  # noqa: E402
from dltop.sources.memory import read_memory  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
SCENARIO = REPO / "tests" / "data" / "gpu-scenarios" / "8gpu-20proc.json"


def big_snapshot(tmp: Path) -> Snapshot:
    gpus = GpuReader(lambda: FakeBackend(json.loads(SCENARIO.read_text())), "/").read()
    assert isinstance(gpus, tuple)
    split = MemorySplit(**dict.fromkeys(SPLIT_FIELDS, 1 << 30))
    gpus = tuple(dataclasses.replace(g, processes=tuple(dataclasses.replace(p, split=split) for p in g.processes))
                 for g in gpus if isinstance(g.processes, tuple))
    (tmp / "ds").mkdir()
    for i in range(50):
        (tmp / "ds" / f"f{i}").write_bytes(os.urandom(64 << 10))
    part = scan_paths([str(tmp / "ds")])
    [one] = part.paths
    datasets = dataclasses.replace(part, paths=tuple(dataclasses.replace(one, path=f"/data/set-{i:02d}")
                                                     for i in range(20)))
    env = environment_of({"TORCHINDUCTOR_CACHE_DIR": str(tmp / "ds"), "HOME": str(tmp)}, os.getuid(), "bench")
    [inductor] = [c for c in read_caches(env).caches if c.name == "torchinductor"]
    caches = CachesPart(caches=tuple(dataclasses.replace(inductor, name=f"cache-{i}") for i in range(10)))
    return Snapshot(ts=time.time(), host="bench", memory=read_memory(), gpus=gpus, datasets=datasets, caches=caches)


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read()  # type: ignore[no-any-return]


def scrape_times(n: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        snap = big_snapshot(Path(d))
    collector = SnapshotCollector()
    server = ExporterServer("127.0.0.1:0", collector)
    server.start()
    first, again = [], []
    try:
        for i in range(n):
            collector.update(dataclasses.replace(snap, ts=snap.ts + i))
            t0 = time.perf_counter()
            body = fetch(server.url)
            t1 = time.perf_counter()
            fetch(server.url)
            first.append(t1 - t0)
            again.append(time.perf_counter() - t1)
    finally:
        server.close()
    lines = body.count(b"\n")
    series = sum(1 for ln in body.splitlines() if ln and not ln.startswith(b"#"))
    print(f"scrape of 8 GPUs x 20 processes, 20 datasets, 10 caches: {series} series, {len(body)} bytes, "
          f"{lines} lines")
    for name, xs in (("new Snapshot (build + encode)", first), ("same Snapshot again (a 2nd Prometheus)", again)):
        xs.sort()
        print(f"  {name:40s} median {1000 * statistics.median(xs):6.2f} ms   p95 "
              f"{1000 * xs[int(0.95 * len(xs))]:6.2f} ms   (target <= 20 ms)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def idle_cpu(seconds: float) -> None:
    port, node_port = free_port(), free_port()
    procs = {"dltop export": subprocess.Popen([sys.executable, "-m", "dltop", "export", "--listen",
                                               f"127.0.0.1:{port}"], stderr=subprocess.DEVNULL, cwd=REPO)}
    urls = {"dltop export": f"http://127.0.0.1:{port}/metrics"}
    node = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if node:
        procs["node_exporter"] = subprocess.Popen([node, f"--web.listen-address=127.0.0.1:{node_port}"],
                                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        urls["node_exporter"] = f"http://127.0.0.1:{node_port}/metrics"
    try:
        time.sleep(3)  # started, first readings in
        start = {k: cpu_seconds(p.pid) for k, p in procs.items()}
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            for u in urls.values():
                fetch(u)
            time.sleep(min(15.0, max(0.0, seconds - (time.monotonic() - t0))))
        wall = time.monotonic() - t0
        pct = {k: 100 * (cpu_seconds(p.pid) - start[k]) / wall for k, p in procs.items()}
    finally:
        for p in procs.values():
            p.terminate()
            p.wait(10)
    print(f"CPU over {wall:.0f} s, scraped every 15 s (target: dltop export <= 0.5% of one core):")
    for k, v in pct.items():
        print(f"  {k:14s} {v:5.2f}% of one core")
    if "node_exporter" in pct and pct["node_exporter"] > 0:
        print(f"  dltop export / node_exporter: {pct['dltop export'] / pct['node_exporter']:.1f}")
    elif not node:
        print("  node_exporter not installed (Debian package prometheus-node-exporter): no ratio")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="CPU window (default 60)")
    ap.add_argument("--scrapes", type=int, default=200, help="timed scrapes (default 200)")
    args = ap.parse_args()
    scrape_times(args.scrapes)
    idle_cpu(args.seconds)


if __name__ == "__main__":
    main()
