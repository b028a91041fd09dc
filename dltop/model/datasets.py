"""The dataset-residency part of a Snapshot (issue 3 fills this in)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DatasetsPart:
    """Placeholder until the residency engine lands."""

    roots: tuple[str, ...] = ()
