"""The Snapshot: one moment of every cache layer, as frozen dataclasses with an exact JSON round-trip.

Each layer's part lives in its own module here; a part the system could not provide is `Unavailable(reason)`,
a part nobody asked for (no dataset configured) is None.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dltop.model.base import DecodeError, Unavailable, from_dict, to_dict
    from dltop.model.caches import CacheEntry, CacheInfo, CachesPart, LockFile
    from dltop.model.cluster import ClusterPart
    from dltop.model.cpu import CpuPart
    from dltop.model.datasets import DatasetsPart
    from dltop.model.gpu import GpuDevice, GpuPart, GpuProcess, MemorySplit, MigDevice
    from dltop.model.memory import CgroupMemory, DiskStat, MemoryPart, Pressure, VmStat
    from dltop.model.probes import (
        IgnoredProbe,
        ProbeDevice,
        ProbeEpoch,
        ProbeLoader,
        ProbesPart,
        ProcessProbe,
    )
    from dltop.model.servers import ModelStats, ServerStats
    from dltop.model.snapshot import SCHEMA_VERSION, Snapshot, SourceStatus

# Each name's module, imported when the name is first used (PEP 562): importing a submodule runs this package
# first, and defining every layer's dataclasses here was half of `dltop residency`'s start-up (~60 of 130 ms)
# for a command that needs the datasets part alone.
_HOME = {
    "base": ("DecodeError", "Unavailable", "from_dict", "to_dict"),
    "caches": ("CacheEntry", "CacheInfo", "CachesPart", "LockFile"),
    "cluster": ("ClusterPart",),
    "cpu": ("CpuPart",),
    "datasets": ("DatasetsPart",),
    "gpu": ("GpuDevice", "GpuPart", "GpuProcess", "MemorySplit", "MigDevice"),
    "memory": ("CgroupMemory", "DiskStat", "MemoryPart", "Pressure", "VmStat"),
    "probes": ("IgnoredProbe", "ProbeDevice", "ProbeEpoch", "ProbeLoader", "ProbesPart", "ProcessProbe"),
    "servers": ("ModelStats", "ServerStats"),
    "snapshot": ("SCHEMA_VERSION", "Snapshot", "SourceStatus"),
}
_MODULE_OF = {name: module for module, names in _HOME.items() for name in names}

__all__ = [
    "SCHEMA_VERSION",
    "CacheEntry",
    "CacheInfo",
    "CachesPart",
    "CgroupMemory",
    "ClusterPart",
    "CpuPart",
    "DatasetsPart",
    "DecodeError",
    "DiskStat",
    "GpuDevice",
    "GpuPart",
    "GpuProcess",
    "IgnoredProbe",
    "LockFile",
    "MemoryPart",
    "MemorySplit",
    "MigDevice",
    "ModelStats",
    "Pressure",
    "ProbeDevice",
    "ProbeEpoch",
    "ProbeLoader",
    "ProbesPart",
    "ProcessProbe",
    "ServerStats",
    "Snapshot",
    "SourceStatus",
    "Unavailable",
    "VmStat",
    "from_dict",
    "to_dict",
]


def __getattr__(name: str) -> Any:
    """`dltop.model.Snapshot` and the rest, from their module on first use (then cached in this module)."""
    if name in _HOME:  # a submodule, as `import dltop.model` once made every one an attribute
        return importlib.import_module(f"dltop.model.{name}")
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'dltop.model' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"dltop.model.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_MODULE_OF))
