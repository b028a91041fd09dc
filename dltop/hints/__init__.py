"""Hints: the lessons of each cache layer as pure functions of recent Snapshots.

One module per layer (`memory`, `datasets`; later `gpu`, `training`, `caches`), each rule registered with
`@rule`. A rule imports the model and its own constants, never sources or actions (a test checks the imports),
so live, replay and the recorder's report draw the same hints from the same Snapshots.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from dltop.model import Snapshot

Severity = Literal["info", "warn", "critical"]
SEVERITY_ORDER = {"critical": 0, "warn": 1, "info": 2}
# How many recent Snapshots a rule sees (a minute at the default refresh): the one window live and replay share.
WINDOW = 60


@dataclass(frozen=True)
class Hint:
    """Advice drawn from recent Snapshots: what is happening, what to do, and the numbers that fired it."""

    id: str
    severity: Severity
    text: str
    fix: str = ""
    numbers: Mapping[str, float] = field(default_factory=dict)  # for the recorder, the report, the exporter


Rule = Callable[[Sequence[Snapshot]], "Hint | None"]
RULES: list[Rule] = []

# The layer modules, imported on first use so `import dltop.hints` stays cheap and each layer keeps its lessons
# next to its own constants.
RULE_MODULES: tuple[str, ...] = ("dltop.hints.memory", "dltop.hints.datasets")
_loaded = False


def rule(fn: Rule) -> Rule:
    """Register a hint rule: a pure function of the recent Snapshots (oldest first) returning a Hint or None."""
    RULES.append(fn)
    return fn


def _load_rule_modules() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for name in RULE_MODULES:
        importlib.import_module(name)


def hints(history: Sequence[Snapshot]) -> list[Hint]:
    """Every hint the registered rules draw from the last WINDOW Snapshots of `history`, most severe first."""
    if not history:
        return []
    _load_rule_modules()
    recent = history[-WINDOW:]
    out = [h for r in RULES if (h := r(recent)) is not None]
    return sorted(out, key=lambda h: SEVERITY_ORDER[h.severity])
