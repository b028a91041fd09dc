"""What every hint rule module shares: the Hint, its severities and the `@rule` registry (dltop.hints gathers the
registered rules; the rule modules import this, never the package, so no import runs in a circle)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
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


# The (hint id, subject) pairs muted or snoozed one by one in the TUI (`m` in ?): a rule that picks one of several
# subjects (your jobs first) passes over these and names the next one. Set by dltop.hints.hints; empty elsewhere
# (the recorder, the report, the exporter draw every hint).
passing_over: ContextVar[frozenset[tuple[str, str]]] = ContextVar("passing_over", default=frozenset())


def wanted(hint_id: str, subject: str) -> bool:
    """The hint `hint_id` about `subject` may be drawn: not passed over (see `passing_over`)."""
    return (hint_id, subject) not in passing_over.get()


Rule = Callable[[Sequence["Snapshot"]], "Hint | None"]
registered: list[Rule] = []  # every rule of the layers' modules imported so far (dltop.hints.all_rules orders them)


def rule(fn: Rule) -> Rule:
    """Register a hint rule: a pure function of the recent Snapshots (oldest first) returning a Hint or None."""
    registered.append(fn)
    return fn
