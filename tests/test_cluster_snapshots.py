"""SVG snapshots of the Cluster tab at 80x24 and 120x40, and of a node's detail, from a fixed cluster model: 12
nodes (one down, one GPU lost, one node cold for a dataset, one with an inference server), one job across 4
nodes and a process without a job id. Update with `pytest tests/test_cluster_snapshots.py --snapshot-update`."""

from __future__ import annotations

import pytest

from dltop.config import PrometheusOptions, Settings
from dltop.model import Snapshot
from dltop.model.cluster import (
    ClusterDataset,
    ClusterGpu,
    ClusterHint,
    ClusterJob,
    ClusterNode,
    ClusterPart,
    ClusterRank,
    ClusterServer,
)
from dltop.sampler import ListFeed
from dltop.tui.app import DltopApp

GIB = 1 << 30
AT = 1_790_000_000.0
DATASETS = (("/data/imagenet", 150 * GIB), ("/data/laion-shard-07", 900 * GIB))


def _rank(node: int, rank: str, job_id: str, step_s: float) -> ClusterRank:
    return ClusterRank(instance=f"gpu-{node:02d}:19400", pid=str(4100 + node), rank=rank, job_id=job_id,
                       data_wait_ratio=0.02 + (0.31 if node == 5 else 0.0), step_s=step_s, steps=5000)


def _node(n: int) -> ClusterNode:
    down = n == 9
    gpus = tuple(ClusterGpu(gpu=str(g), uuid=f"GPU-{n:02d}-{g}", name="NVIDIA H100 80GB HBM3", up=(n, g) != (3, 5),
                            down_reason="lost" if (n, g) == (3, 5) else None, memory_total_bytes=80 * GIB,
                            memory_used_bytes=(71 - g) * GIB, utilization=0.9,
                            memory_by_use={"weights": 14 * GIB, "allocator_cache": 9 * GIB,
                                           "other_torch": (48 - g) * GIB, "free": (9 + g) * GIB})
                 for g in range(8))
    detailed = n == 5
    ranks = (_rank(n, str(n), "llama-70b-run-7", 1.62),) if detailed else ()
    return ClusterNode(
        instance=f"gpu-{n:02d}:19400", job="dltop", node=f"gpu-{n:02d}", up=not down,
        down_reason="the last scrape failed (up is 0)" if down else None, snapshot_age_s=3.0,
        memory_total_bytes=2048 * GIB, memory_available_bytes=(600 + 37 * n) * GIB,
        memory_cached_bytes=(900 + 23 * n) * GIB, memory_dirty_bytes=GIB,
        pressure_memory_some=0.01 * (n % 4), pressure_memory_full=0.0, gpu_count=8, gpus_read=8,
        gpu_memory_used_bytes=sum(g.memory_used_bytes for g in gpus),  # type: ignore[misc]
        gpu_memory_total_bytes=640 * GIB, gpu_utilization=0.9,
        gpus=gpus if detailed else tuple(g for g in gpus if g.up is False),
        datasets=tuple(ClusterDataset(dataset=p, up=True, size_bytes=size, resident_bytes=size * share // 100,
                                      resident_ratio=share / 100)
                       for p, size in DATASETS
                       for share in [5 if (n, p) == (5, DATASETS[1][0]) else 100 - n]),
        ranks=ranks,
        hints=(ClusterHint("memory-cache-squeezed", "warn"),) if n % 3 == 0 else (),
        servers=(ClusterServer("http://127.0.0.1:8000/metrics", kv_usage=0.83, kv_capacity_bytes=40 * GIB),)
        if n == 11 else (),
        detailed=detailed)


def fleet() -> ClusterPart:
    """The fixed cluster of the pictures."""
    nodes = tuple(_node(n) for n in range(12))
    slowest = _rank(5, "5", "llama-70b-run-7", 1.62)
    alone = ClusterRank(instance="gpu-11:19400", pid="7781", rank="", job_id="", step_s=0.21, data_wait_ratio=0.4)
    jobs = (ClusterJob("llama-70b-run-7", ranks=nodes[5].ranks, slowest=slowest, most_waiting=slowest,
                       rank_count=32, node_count=4),
            ClusterJob("", slowest=alone, most_waiting=alone, rank_count=1, node_count=1))
    return ClusterPart(url="http://prom:9090", selector='job="dltop"', queried_at=AT, query_s=0.42, queries=14,
                       nodes=nodes, jobs=jobs)


def _app() -> DltopApp:
    snap = Snapshot(ts=AT, host="login-1", cluster=fleet())
    return DltopApp(ListFeed([snap]), Settings(prometheus=PrometheusOptions("http://prom:9090")))


SIZES = [(80, 24), (120, 40)]


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_cluster_pane(snap_compare, size: tuple[int, int]) -> None:
    async def settle(pilot) -> None:
        await pilot.pause()
        pilot.app.show()  # as the next tick would: the pane at its settled layout
        await pilot.pause()

    assert snap_compare(_app(), terminal_size=size, run_before=settle)


def test_cluster_node_detail(snap_compare) -> None:
    async def open_cold(pilot) -> None:
        await pilot.pause()
        pilot.app.show()
        await pilot.pause()
        await pilot.press("enter")  # the coldest node first: gpu-05, read in detail

    assert snap_compare(_app(), terminal_size=(80, 24), run_before=open_cold)
