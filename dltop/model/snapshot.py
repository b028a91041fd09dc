"""The Snapshot itself and each source's status: the one record that holds every layer's part."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from dltop.model.base import DecodeError, Unavailable, from_dict, to_dict
from dltop.model.caches import CachesPart
from dltop.model.cluster import ClusterPart
from dltop.model.cpu import CpuPart
from dltop.model.datasets import DatasetsPart
from dltop.model.gpu import GpuPart
from dltop.model.memory import MemoryPart
from dltop.model.probes import ProbesPart
from dltop.model.servers import ServerStats

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class SourceStatus:
    """How the last read of one source went: when it last succeeded, how long it took, and its last error."""

    name: str
    interval_s: float
    last_ok_ts: float | None = None
    duration_s: float | None = None
    error: str | None = None
    running_since_ts: float | None = None  # set while a read is in flight (a slow or hung source)


@dataclass(frozen=True)
class Snapshot:
    """Everything dltop knows at one moment. Raw values only: rates and hints are derived from two of these."""

    ts: float
    host: str
    uptime_s: float | None = None
    schema: int = SCHEMA_VERSION
    memory: MemoryPart | Unavailable | None = None
    datasets: DatasetsPart | Unavailable | None = None
    cpu: CpuPart | Unavailable | None = None
    gpus: GpuPart | Unavailable | None = None
    servers: tuple[ServerStats, ...] | Unavailable | None = None  # one per --server URL, in the order given
    probes: ProbesPart | Unavailable | None = None  # processes with dltop.probe (docs/probe.md)
    caches: CachesPart | Unavailable | None = None  # compile and model caches (docs/caches.md)
    cluster: ClusterPart | Unavailable | None = None  # other nodes, read from Prometheus (docs/cluster.md)
    sources: dict[str, SourceStatus] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data; `Snapshot.from_dict(s.to_dict()) == s`."""
        return to_dict(self)  # type: ignore[no-any-return]

    @classmethod
    def from_dict(cls, data: Any) -> Snapshot:
        """Rebuild a Snapshot; raises DecodeError for data of the wrong shape or a newer schema."""
        if not isinstance(data, dict):
            raise DecodeError("snapshot: expected a JSON object")
        schema = data.get("schema")
        if not isinstance(schema, int) or schema > SCHEMA_VERSION:
            raise DecodeError(f"snapshot: schema {schema!r} is not one this dltop reads (<= {SCHEMA_VERSION})")
        return from_dict(cls, data)

    def to_json(self, indent: int | None = None) -> str:
        """JSON text of `to_dict()`."""
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)

    @classmethod
    def from_json(cls, text: str) -> Snapshot:
        """Parse JSON text written by `to_json`."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise DecodeError(f"snapshot: not JSON ({e.msg} at line {e.lineno})") from None
        return cls.from_dict(data)
