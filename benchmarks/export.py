"""What `dltop export` costs: the time of a scrape on a big node, and the CPU of the exporter left running, side by
side with node_exporter (Debian's prometheus-node-exporter) over the same window where it is installed.

Scrape: 8 GPUs x 20 processes (the fake NVML's 8gpu-20proc scenario, every process with a known split, so each
has its six series), 20 datasets (one real scan of files made here, under 20 names), 10 caches (one real walk
under 10 names) and the machine's own memory part, served by the real HTTP server; each timed scrape follows a new Snapshot, so it pays the build and the
encoding (the cost Prometheus sees), and a second scrape of the same Snapshot shows what a second Prometheus
pays.

CPU: `dltop export` (real sources, default --interval) and node_exporter, each scraped every 15 s as Prometheus
would, CPU time from /proc/PID/stat (utime + stime) over the window.

Concurrent scrapers: bursts of 50 scrapes opened at the same instant (curl -Z, a new connection each), as
many Prometheus servers scraping on the same tick would, against `dltop export` (this tree's, and another
tree's with --other DIR, e.g. the baseline checkout) and node_exporter: p50/p99 of a scrape and the kernel's
ListenOverflows and ListenDrops (/proc/net/netstat, TcpExt) before and after each run. The counters are the
network namespace's: another program's overflows in the same window count too.

usage: python benchmarks/export.py [--seconds 60] [--scrapes 200] [--concurrent 50] [--rounds 20] [--other DIR]
       [--only concurrent]
Targets (issue 13): a scrape <= 20 ms; the exporter <= 0.5% of one core. Issue 35: with 50 concurrent scrapers
p99 <= 50 ms on 2 cores and no listen overflow.
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


def listen_counters() -> dict[str, int]:
    """TcpExt's ListenOverflows and ListenDrops from /proc/net/netstat."""
    with open("/proc/net/netstat") as f:
        lines = f.read().splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:"):
            table = dict(zip(names.split()[1:], values.split()[1:], strict=True))
            return {k: int(table[k]) for k in ("ListenOverflows", "ListenDrops")}
    return {}


def wait_up(url: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            if fetch(url):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.3)


def burst(port: int, clients: int) -> tuple[list[float], int]:
    """`clients` scrapes of /metrics opened at the same instant, each on a new connection (HTTP/1.0, closed after
    the answer), by one curl (-Z: parallel transfers in one event loop, so the client costs little and every
    connection is opened at once): (each scrape's time in seconds, how many failed)."""
    try:
        out = subprocess.run(["curl", "-sS", "-Z", "--parallel-max", str(clients), "--parallel-immediate",
                              "--http1.0", "--max-time", "60", "-o", "/dev/null", "-w", "%{http_code} %{time_total}\\n",
                              f"http://127.0.0.1:{port}/metrics?[1-{clients}]"],
                             capture_output=True, text=True, timeout=120).stdout
    except subprocess.TimeoutExpired:
        return [], clients
    times, failed = [], 0
    for line in out.splitlines():
        code, _, t = line.partition(" ")
        if code == "200":
            times.append(float(t))
        else:
            failed += 1
    return times, failed + clients - len(out.splitlines())


def hammer(port: int, clients: int, rounds: int) -> tuple[list[float], int]:
    """`rounds` bursts of `clients` concurrent scrapes, 0.5 s apart (as many Prometheus servers scraping on the
    same tick): (every scrape's time, how many failed)."""
    times: list[float] = []
    failed = 0
    for _ in range(rounds):
        t, f = burst(port, clients)
        times += t
        failed += f
        time.sleep(0.5)
    return times, failed


def concurrent_scrapes(clients: int, rounds: int, other: Path | None) -> None:
    node = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    targets: list[tuple[str, list[str], Path | None]] = [
        ("dltop export (this tree)", [sys.executable, "-m", "dltop", "export"], REPO)]
    if other is not None:
        targets.append((f"dltop export ({other})", [sys.executable, "-m", "dltop", "export"], other))
    if node:
        targets.append(("node_exporter", [node], None))
    if shutil.which("curl") is None:
        print("concurrent scrapers: curl not installed (it opens the concurrent connections): skipped")
        return
    print(f"{rounds} bursts of {clients} concurrent scrapes, a new connection each "
          f"(target: p99 <= 50 ms, no listen overflow):")
    for name, cmd, cwd in targets:
        port = free_port()
        flag = ["--listen", f"127.0.0.1:{port}"] if cwd else [f"--web.listen-address=127.0.0.1:{port}"]
        env = {**os.environ, "PYTHONPATH": str(cwd)} if cwd else None
        p = subprocess.Popen([*cmd, *flag], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd, env=env)
        url = f"http://127.0.0.1:{port}/metrics"
        try:
            wait_up(url)
            time.sleep(1)
            before = listen_counters()
            times, failed = hammer(port, clients, rounds)
            after = listen_counters()
        finally:
            p.terminate()
            p.wait(10)
        times.sort()
        rises = ", ".join(f"{k} {before[k]} -> {after[k]} (+{after[k] - before[k]})" for k in before)
        print(f"  {name:34s} p50 {1000 * statistics.median(times):7.2f} ms   p99 "
              f"{1000 * times[int(0.99 * len(times))]:7.2f} ms   max {1000 * times[-1]:7.2f} ms   "
              f"failed {failed}   {rises}")
    if not node:
        print("  node_exporter not installed (Debian package prometheus-node-exporter): no side by side")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="CPU window (default 60)")
    ap.add_argument("--scrapes", type=int, default=200, help="timed scrapes (default 200)")
    ap.add_argument("--concurrent", type=int, default=50, help="concurrent scrapers (default 50)")
    ap.add_argument("--rounds", type=int, default=10, help="bursts of concurrent scrapes (default 10)")
    ap.add_argument("--other", type=Path, help="another dltop tree to run beside this one (e.g. the baseline)")
    ap.add_argument("--only", choices=("scrape", "concurrent", "cpu"), help="run one part only")
    args = ap.parse_args()
    if args.only in (None, "scrape"):
        scrape_times(args.scrapes)
    if args.only in (None, "concurrent"):
        concurrent_scrapes(args.concurrent, args.rounds, args.other)
    if args.only in (None, "cpu"):
        idle_cpu(args.seconds)


if __name__ == "__main__":
    main()
