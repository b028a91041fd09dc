"""What every hint rule module shares: the Hint, its severities and the `@rule` registry (dltop.hints gathers the
registered rules; the rule modules import this, never the package, so no import runs in a circle)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from dltop.model import Snapshot

Severity = Literal["info", "warn", "critical"]
SEVERITY_ORDER = {"critical": 0, "warn": 1, "info": 2}


@dataclass(frozen=True)
class Hint:
    """Advice drawn from recent Snapshots: what is happening, what to do, and the numbers that fired it."""

    id: str
    severity: Severity
    text: str
    fix: str = ""
    numbers: Mapping[str, float] = field(default_factory=dict)  # for the recorder, the report, the exporter
    # What it is about, where it is about one thing: "<noun> <which>" ("job uid 1000 job 7f3a", "dataset /data/x",
    # "cache /path", "server URL", "process 1234", "cgroup /path"); '' for the machine, or several named at once.
    # `m` in ? mutes a hint for its subject; `M` and the config's mute = [ID], for every subject.
    subject: str = ""


Rule = Callable[[Sequence["Snapshot"]], "Hint | None"]
registered: list[Rule] = []  # every rule of the layers' modules imported so far (dltop.hints.all_rules orders them)


def rule(fn: Rule) -> Rule:
    """Register a hint rule: a pure function of the recent Snapshots (oldest first) returning a Hint or None."""
    registered.append(fn)
    return fn
