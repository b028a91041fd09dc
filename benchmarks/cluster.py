"""What a Cluster refresh costs on a big fleet: 256 nodes x 8 GPUs (every node with 2 datasets, 8 ranks of one
job, hints and its memory; three nodes whose last scrape failed, and one, gpu-0031, down since before any
lookback: its dltop series end 2 hours ago, and it must still be listed), generated as OpenMetrics, backfilled into a real Prometheus with `promtool tsdb
create-blocks-from openmetrics`, then read by dltop's cluster reader: the refresh's wall time, its query count,
and the Cluster pane's draw of the result in a headless app at 80x24; then a refresh with one node's detail
(Enter) and with every node's (`dltop cluster --json`); --per-query times each query alone.

usage: python benchmarks/cluster.py [--nodes 256] [--gpus 8] [--refreshes 10]
Targets (issue 21): a refresh <= 1 s and <= 20 queries, the TUI responsive.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dltop.config import PrometheusOptions, Settings  # noqa: E402
from dltop.model import Snapshot  # noqa: E402
from dltop.sources.cluster import PrometheusClient, read_cluster  # noqa: E402

GIB = 1 << 30
STEP_S, SAMPLES = 15, 8  # samples every 15 s over the last two minutes


GONE = 31  # this node's exporter has been down since before any lookback: its dltop series end 2 hours ago


def openmetrics(nodes: int, gpus: int, end: int) -> str:
    """The fleet's series, each with SAMPLES samples ending at `end` (unix seconds); node GONE's `up` is 0 and its
    dltop series end two hours before."""
    fams: dict[str, list[tuple[str, float]]] = {}
    old: dict[str, list[tuple[str, float]]] = {}  # node GONE's dltop series, from when it last served

    def add(name: str, labels: dict[str, str], value: float) -> None:
        text = ",".join(f'{k}="{v}"' for k, v in labels.items())
        into = old if labels.get("node") == f"gpu-{GONE:04d}" and name != "up" else fams
        into.setdefault(name, []).append((text, value))

    for n in range(nodes):
        node = {"job": "dltop", "instance": f"gpu-{n:04d}:19400", "node": f"gpu-{n:04d}"}
        add("up", node, 0.0 if n % 97 == 5 or n == GONE else 1.0)
        add("dltop_snapshot_timestamp_seconds", node, float(end))
        add("dltop_memory_total_bytes", node, 2048.0 * GIB)
        add("dltop_memory_available_bytes", node, (600 + n % 400) * GIB)
        add("dltop_memory_cached_bytes", node, (900 + n % 300) * GIB)
        add("dltop_memory_dirty_bytes", node, 1.0 * GIB)
        add("dltop_gpus", node, float(gpus))
        for kind in ("some", "full"):
            add("dltop_pressure_stalled_avg10_ratio", {**node, "resource": "memory", "kind": kind}, (n % 7) / 100)
        add("dltop_hint_active", {**node, "id": "memory-cache-squeezed", "severity": "warn"}, 1.0)
        for d, size in (("/data/imagenet", 150 * GIB), ("/data/laion-shard", 900 * GIB)):
            ds = {**node, "dataset": d}
            add("dltop_dataset_up", ds, 1.0)
            add("dltop_dataset_size_bytes", ds, float(size))
            resident = size * ((n * 37) % 101) // 100 // 4096 * 4096  # whole pages of a dataset of big files
            add("dltop_dataset_resident_bytes", ds, float(resident))
            add("dltop_dataset_resident_ratio", ds, resident / size)
        for g in range(gpus):
            gl = {**node, "gpu": str(g), "uuid": f"GPU-{n:04d}-{g}"}
            add("dltop_gpu_up", gl, 0.0 if (n, g) == (3, 5) else 1.0)
            add("dltop_gpu_info", {**gl, "name": "NVIDIA H100 80GB HBM3", "bus_id": f"0000:{g:02x}:00.0",
                                   "driver_version": "550.54"}, 1.0)
            add("dltop_gpu_memory_total_bytes", gl, 80.0 * GIB)
            add("dltop_gpu_memory_used_bytes", gl, 71.0 * GIB)
            add("dltop_gpu_utilization_ratio", gl, 0.9)
            pid = str(10000 + g)
            for use, b in (("weights", 14), ("kv_cache", 0), ("allocator_cache", 9), ("other_torch", 48)):
                add("dltop_gpu_memory_bytes", {**gl, "pid": pid, "use": use}, b * GIB)
            add("dltop_gpu_memory_bytes", {**gl, "pid": "", "use": "free"}, 9.0 * GIB)
            rank = {**node, "pid": pid, "rank": str(n * gpus + g), "job_id": "llama-70b-run-7"}
            add("dltop_training_data_wait_ratio", rank, 0.01 + (0.3 if n == 77 else 0))
            add("dltop_training_step_seconds", rank, 1.2 + (0.4 if n == 77 else 0))
            add("dltop_training_steps_total", rank, 5000.0)
    out = []
    for name in fams.keys() | old.keys():
        out.append(f"# TYPE {name} gauge\n")
        for series, last in ((old.get(name, []), end - 7200), (fams.get(name, []), end)):
            for i in range(SAMPLES):
                ts = last - (SAMPLES - 1 - i) * STEP_S
                out.extend(f"{name}{{{labels}}} {value} {ts}\n" for labels, value in series)
    out.append("# EOF\n")
    return "".join(out)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def draw_s(part: object) -> list[float]:
    """The Cluster pane's draw of the fleet (show() of a new Snapshot), in a headless app at 80x24."""
    from dltop.sampler import ListFeed
    from dltop.tui.app import DltopApp

    snap = Snapshot(ts=time.time(), host="bench", cluster=part)  # type: ignore[arg-type]
    app = DltopApp(ListFeed([snap]), Settings(prometheus=PrometheusOptions("http://x")))
    times = []
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        pane = app.panes[0]
        for _ in range(5):
            assert pane.view is not None
            t0 = time.perf_counter()
            pane.show(pane.view)
            await pilot.pause()
            times.append(time.perf_counter() - t0)
    return times


def per_query(client: PrometheusClient, at: float) -> None:
    """Each query of a refresh alone, one after another: its series, its answer's size, its time."""
    import json

    from dltop.sources.cluster import queries

    for name, expr in queries("").items():
        walls, size, count = [], 0, 0
        for _ in range(3):
            t = time.perf_counter()
            result = client.query(expr, at)
            walls.append(time.perf_counter() - t)
            count, size = len(result), len(json.dumps(result))
        print(f"  {name:12} {count:6,} series {size / 1e6:6.2f} MB {1000 * statistics.median(walls):6.0f} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=256)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--refreshes", type=int, default=10)
    ap.add_argument("--serve", type=float, metavar="SECONDS", help="only serve the fleet for SECONDS, its samples "
                    "ending now, to look at with dltop --prometheus URL")
    ap.add_argument("--per-query", action="store_true", help="also time each query alone (median of 3) and "
                    "count its series and bytes")
    args = ap.parse_args()
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if not prometheus or not promtool:
        print("needs Debian's prometheus package (prometheus, promtool)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="dltop-cluster-bench-") as tmp:
        end = int(time.time()) - (1 if args.serve else 30)
        t0 = time.monotonic()
        text = openmetrics(args.nodes, args.gpus, end)
        (Path(tmp) / "fleet.om").write_text(text)
        subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", f"{tmp}/fleet.om", f"{tmp}/data"],
                       check=True, capture_output=True)
        print(f"backfilled {text.count(chr(10)) - 1:,} samples in {time.monotonic() - t0:.1f} s")
        port = free_port()
        log = open(f"{tmp}/prometheus.log", "w")  # noqa: SIM115
        proc = subprocess.Popen([prometheus, f"--config.file={tmp}/p.yml", f"--storage.tsdb.path={tmp}/data",
                                 f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
        Path(f"{tmp}/p.yml").write_text("global: {scrape_interval: 15s}\n")
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                try:
                    with urllib.request.urlopen(url + "/-/ready", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    print(Path(f"{tmp}/prometheus.log").read_text()[-2000:])
                    return 1
                time.sleep(0.3)
            client = PrometheusClient(PrometheusOptions(url))
            if args.serve:
                # For a look by hand (`dltop --prometheus URL` in a terminal): its nodes stay up for as long as
                # their newest reading is fresh (STALE_AFTER_S), so the fleet ends now.
                print(f"serving the fleet at {url} for {args.serve:g} s (its samples end at {end})", flush=True)
                time.sleep(args.serve)
                return 0
            read_cluster(client, now=lambda: end + 1.0)  # warm Prometheus' caches once
            walls, parts = [], []
            for _ in range(args.refreshes):
                before = client.queries
                t = time.perf_counter()
                part = read_cluster(client, now=lambda: end + 1.0)
                walls.append(time.perf_counter() - t)
                parts.append((part, client.queries - before))
            if args.per_query:
                per_query(client, end + 1.0)
            part, count = parts[-1]
            gpus = sum(n.gpus_read for n in part.nodes if isinstance(n.gpus_read, int))
            print(f"fleet: {len(part.nodes)} nodes ({sum(not n.up for n in part.nodes)} down), {gpus} GPUs, "
                  f"{len(part.datasets)} datasets, {sum(j.rank_count for j in part.jobs)} ranks in {len(part.jobs)} job")
            print(f"refresh: median {statistics.median(walls):.3f} s, max {max(walls):.3f} s over {len(walls)}; "
                  f"{count} queries each (targets <= 1 s, <= 20)")
            # With one node open (Enter): its GPUs and ranks too. And `dltop cluster --json`: every node's.
            one = [(part.nodes[0].job, part.nodes[0].instance)]
            for label, detail in (("one node's detail", one), ("every node's detail (--json)", True)):
                ws, n = [], 0
                for _ in range(3):
                    before = client.queries
                    t = time.perf_counter()
                    read_cluster(client, now=lambda: end + 1.0, detail=detail)
                    ws.append(time.perf_counter() - t)
                    n = client.queries - before
                print(f"refresh with {label}: median {statistics.median(ws):.3f} s over 3; {n} queries")
            draws = asyncio.run(draw_s(part))
            print(f"Cluster pane draw: median {1000 * statistics.median(draws):.0f} ms, max "
                  f"{1000 * max(draws):.0f} ms")
            gone = [n for n in part.nodes if n.name == f"gpu-{GONE:04d}"]
            if args.nodes > GONE:
                print(f"gpu-{GONE:04d}: " + (f"listed, {gone[0].down_reason}" if gone else "NOT LISTED"))
            ok = statistics.median(walls) <= 1.0 and count <= 20 and len(part.nodes) == args.nodes
            return 0 if ok else 1
        finally:
            proc.terminate()
            proc.wait(20)
            log.close()


if __name__ == "__main__":
    sys.exit(main())
