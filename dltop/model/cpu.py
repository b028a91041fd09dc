"""The CPU cache topology part of a Snapshot (issue 4 fills this in)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CpuPart:
    """Placeholder until the CPU topology reader lands."""

    arrangement: str = "unknown"
