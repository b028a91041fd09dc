"""The cluster part of a Snapshot: every node's exporter, read back from Prometheus (docs/cluster.md).

One `ClusterNode` per scrape target that serves dltop's metrics; a number Prometheus has no sample of is
`Unavailable(reason)`, never 0. Label values come from Prometheus and are hostile text: shown through
fmt.printable, put in a shell command only when they pass `SAFE_WORD`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dltop.model.base import Unavailable

NO_SAMPLE = Unavailable("no sample in Prometheus")
# A name that may go into a command line as one word: a host, a pod, a namespace (DNS names and the like).
SAFE_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@%+=,-]{0,252}")


@dataclass(frozen=True)
class ClusterGpu:
    """One GPU of a node, as its exporter serves it."""

    gpu: str  # the index label
    uuid: str
    name: str | None = None
    up: bool | Unavailable = NO_SAMPLE
    down_reason: str | None = None  # dltop_gpu_down_info's reason (lost, no_permission, ...)
    memory_total_bytes: int | Unavailable = NO_SAMPLE
    memory_used_bytes: int | Unavailable = NO_SAMPLE
    utilization: float | Unavailable = NO_SAMPLE  # 0..1
    # dltop_gpu_memory_bytes summed over processes, by use (weights, kv_cache, ..., free); empty: none served
    memory_by_use: dict[str, int] | None = None


@dataclass(frozen=True)
class ClusterDataset:
    """One watched dataset's residency on one node. Its share is the exporter's own `dltop_dataset_resident_ratio`:
    resident pages over the pages of its data, as vmtouch and fincore count them (whole pages, holes left out).
    `resident_bytes` is page cache (whole pages) and `size_bytes` apparent size: the two are never divided."""

    dataset: str
    up: bool | Unavailable = NO_SAMPLE
    size_bytes: int | Unavailable = NO_SAMPLE  # apparent size (du --apparent-size)
    resident_bytes: int | Unavailable = NO_SAMPLE  # the page cache its data holds: resident pages x page size
    resident_ratio: float | Unavailable = NO_SAMPLE  # resident pages / data pages (0..1), the exporter's
    reason: str | None = None  # dltop_dataset_unavailable_info's reason while up is 0

    @property
    def share(self) -> float | None:
        """The resident share of its data; None where unknown. An empty dataset (size 0, no pages, so no ratio
        served) counts as all resident: there is nothing to read."""
        if isinstance(self.resident_ratio, float):
            return self.resident_ratio
        return 1.0 if self.size_bytes == 0 and self.up is True else None


@dataclass(frozen=True)
class ClusterRank:
    """One process with dltop.probe on one node: a rank of a training job."""

    instance: str
    pid: str
    rank: str  # "" where the probe gave none
    job_id: str  # "" where the probe gave none
    data_wait_ratio: float | Unavailable = NO_SAMPLE
    step_s: float | Unavailable = NO_SAMPLE
    steps: int | Unavailable = NO_SAMPLE
    uid: str = ""  # the kernel's owner of the process (the exporter's uid label); "" from an older exporter


@dataclass(frozen=True)
class ClusterServer:
    """One inference server a node's exporter scrapes: its KV-cache pool."""

    server: str
    kv_usage: float | Unavailable = NO_SAMPLE  # the most of its models', 0..1
    kv_capacity_bytes: int | Unavailable = NO_SAMPLE


@dataclass(frozen=True)
class ClusterHint:
    """A hint firing on a node (dltop_hint_active)."""

    id: str
    severity: str


@dataclass(frozen=True)
class ClusterNode:
    """One node: its scrape health, memory, GPUs, datasets, ranks, hints and inference servers."""

    instance: str
    job: str
    node: str | None = None  # a node-name label where the scrape config sets one (node, nodename, hostname, ...)
    pod: str | None = None  # Kubernetes service discovery's pod and namespace labels, for a kubectl exec line
    namespace: str | None = None
    up: bool = False  # the last scrape succeeded and its samples are fresh
    down_reason: str | None = None  # why not: the scrape failed, or the exporter's readings are stale
    snapshot_age_s: float | Unavailable = NO_SAMPLE  # query time minus dltop_snapshot_timestamp_seconds
    memory_total_bytes: int | Unavailable = NO_SAMPLE
    memory_available_bytes: int | Unavailable = NO_SAMPLE
    memory_cached_bytes: int | Unavailable = NO_SAMPLE
    memory_dirty_bytes: int | Unavailable = NO_SAMPLE
    pressure_memory_some: float | Unavailable = NO_SAMPLE  # PSI avg10, 0..1
    pressure_memory_full: float | Unavailable = NO_SAMPLE
    gpu_count: int | Unavailable = NO_SAMPLE  # dltop_gpus: 0 on a CPU-only node
    # Its GPUs summed by Prometheus (the table's numbers, one series a node whatever its GPU count): the GPUs
    # read (dltop_gpu_up series), memory used and total over them, their mean utilisation (0..1).
    gpus_read: int | Unavailable = NO_SAMPLE
    gpu_memory_used_bytes: int | Unavailable = NO_SAMPLE
    gpu_memory_total_bytes: int | Unavailable = NO_SAMPLE
    gpu_utilization: float | Unavailable = NO_SAMPLE
    # Per GPU: every GPU where `detailed`, else only the lost ones (with why)
    gpus: tuple[ClusterGpu, ...] = ()
    datasets: tuple[ClusterDataset, ...] = ()
    ranks: tuple[ClusterRank, ...] = ()  # where `detailed`; else none (the jobs table has their totals)
    hints: tuple[ClusterHint, ...] = ()
    servers: tuple[ClusterServer, ...] = ()
    sources_down: tuple[str, ...] = ()  # the exporter's sources with dltop_source_up 0
    # Its detail was read: every GPU (memory by use, name) and every rank. A refresh reads it for the node the
    # user opened (Enter) and, in `dltop cluster --json`, for all.
    detailed: bool = False

    @property
    def name(self) -> str:
        """The node-name label, else the instance."""
        return self.node or self.instance

    @property
    def gpus_lost(self) -> int:
        """GPUs that cannot be read (dltop_gpu_up 0)."""
        return sum(1 for g in self.gpus if g.up is False)

    def dataset(self, path: str) -> ClusterDataset | None:
        """The node's row for dataset `path`, if it watches it."""
        return next((d for d in self.datasets if d.dataset == path), None)


@dataclass(frozen=True)
class ClusterJob:
    """The ranks of one training job across nodes (one job_id label), the slowest named; job_id "": the ranks
    whose probe gave no job id, as one group."""

    job_id: str
    ranks: tuple[ClusterRank, ...] = ()  # those of the detailed nodes (every one in `dltop cluster --json`)
    slowest: ClusterRank | None = None  # the rank with the longest step time (None: no step time known)
    most_waiting: ClusterRank | None = None  # the rank with the largest data wait
    rank_count: int = 0  # its ranks on every node, counted by Prometheus
    node_count: int = 0  # the nodes they run on
    uid: str = ""  # whose job: a job is (uid, job_id); "" where the exporters are older than the uid label


@dataclass(frozen=True)
class ClusterPart:
    """The cluster as Prometheus had it at `queried_at`: its nodes, the jobs across them, what the queries cost."""

    url: str
    selector: str
    queried_at: float
    query_s: float  # the refresh's wall time, all queries together
    queries: int  # how many instant queries the refresh made
    nodes: tuple[ClusterNode, ...] = ()
    jobs: tuple[ClusterJob, ...] = ()
    notes: tuple[str, ...] = ()  # series left out (a value not finite, a count past the bounds), one line each

    @property
    def datasets(self) -> tuple[str, ...]:
        """Every dataset any node watches, sorted."""
        return tuple(sorted({d.dataset for n in self.nodes for d in n.datasets}))
