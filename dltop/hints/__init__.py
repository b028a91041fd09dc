"""Hints: the lessons of each cache layer as pure functions of recent Snapshots.

One module per layer (`memory`, `datasets`, `gpu`, `training`, `caches`), each rule registered with
`@rule` of dltop/hints/base.py (never of this package: no circle). A rule imports the model and its own constants,
never sources or actions (a test checks the imports), so live, replay and the recorder's report draw the same hints from the same Snapshots.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from dltop.hints.base import SEVERITY_ORDER, Hint, Rule, Severity, passing_over, registered, rule

if TYPE_CHECKING:
    from dltop.model import Snapshot

__all__ = ["SEVERITY_ORDER", "WINDOW_S", "Hint", "Quieted", "Rule", "Severity", "all_rules", "hints", "rule",
           "subject_noun", "tab_of", "window"]

# How far back a rule sees, in seconds of Snapshot time (not a count: the refresh may be 0.25 s or 30 s): the
# one window live and replay share.
WINDOW_S = 60.0
SNOOZE_S = 3600.0  # how long `s` in ? keeps a hint off the hint line


def all_rules() -> list[Rule]:
    """Every layer's rules. The layers' modules register theirs when imported, here and not when this package
    is: `dltop caches` needs the caches rules alone, and the others import every layer's model."""
    from dltop.hints import caches, datasets, gpu, memory, training  # noqa: F401

    if _ordered != registered:  # in the layers' order, whichever module a caller imported first
        _ordered[:] = sorted(registered, key=_layer_index)
        registered[:] = _ordered
    return registered


_LAYERS = ("caches", "datasets", "gpu", "memory", "training")
_ordered: list[Rule] = []


def _layer_index(fn: Rule) -> int:
    layer = fn.__module__.rpartition(".")[2]
    return _LAYERS.index(layer) if layer in _LAYERS else len(_LAYERS)  # a rule of elsewhere (a test's): last


def __getattr__(name: str) -> Any:
    if name == "RULES":
        return all_rules()
    raise AttributeError(f"module 'dltop.hints' has no attribute {name!r}")


# The tab each hint belongs to, by its id's prefix (ids name their layer first): the hint line puts the current
# tab's own hints first. A test checks that every rule's id has one.
TAB_OF_PREFIX = (("page-cache-", "pagecache"), ("cgroup-", "pagecache"), ("dataset-", "datasets"),
                 ("gpu-", "gpu"), ("training-", "training"), ("cache-", "caches"))


def tab_of(hint_id: str) -> str | None:
    """The TUI tab (dltop.config.TAB_NAMES) whose layer the hint `hint_id` speaks of, or None."""
    return next((tab for prefix, tab in TAB_OF_PREFIX if hint_id.startswith(prefix)), None)


def window(history: Sequence[Snapshot]) -> Sequence[Snapshot]:
    """The Snapshots of the last WINDOW_S seconds of `history` (oldest first)."""
    if not history:
        return history
    since = history[-1].ts - WINDOW_S
    # walked from the newest back to the first one older than `since` (a walk from the oldest of the 600 the TUI
    # keeps crossed 540 of them every tick)
    if history[0].ts >= since:
        return history  # the first minute: all of it
    first = len(history) - 1
    while first > 0 and history[first - 1].ts >= since:
        first -= 1
    return history[first:]


def hints(history: Sequence[Snapshot], passed: Iterable[tuple[str, str]] = ()) -> list[Hint]:
    """Every hint the registered rules draw from the last WINDOW_S seconds of `history`, most severe first; a rule
    that picks one of several subjects passes over the (hint id, subject) pairs `passed` (`Quieted.passed`)."""
    if not history:
        return []
    recent = window(history)
    token = passing_over.set(frozenset(passed))
    try:
        out = [h for r in all_rules() if (h := r(recent)) is not None]
    finally:
        passing_over.reset(token)
    return sorted(out, key=lambda h: SEVERITY_ORDER[h.severity])



def subject_noun(subject: str) -> str:
    """What a hint's subject is ("job", "dataset", ...): its first word."""
    return subject.partition(" ")[0]


class Quieted:
    """The hints kept off the hint line for a TUI session (still listed in ?): muted for one subject (a job, a
    dataset, ...: `m` in ?) or for every subject (their kind: `M` in ?, or the config's mute = [ID]), or snoozed
    for one subject until a time of `clock`."""

    def __init__(self, config_mute: Iterable[str] = (), clock: Callable[[], float] = time.time) -> None:
        self.config_mute = frozenset(config_mute)
        self.muted: set[str] = set(self.config_mute)  # hint ids muted for every subject
        self.muted_subjects: set[tuple[str, str]] = set()  # (hint id, subject) muted
        self.snoozed: dict[tuple[str, str], float] = {}  # (hint id, subject) -> until when it is off the line
        self.clock = clock

    def state(self, hint_id: str, subject: str = "") -> str:
        """'muted ...', 'snoozed until ...' or '' for the hint `hint_id` about `subject`: what ? says of it, with
        which of its subjects it is for ("for this job", "for every job")."""
        noun = subject_noun(subject)
        if hint_id in self.muted:
            return ("muted" + (" (config)" if hint_id in self.config_mute else "")
                    + (f" for every {noun}" if noun else ""))
        if (hint_id, subject) in self.muted_subjects:
            return f"muted for this {noun}" if noun else "muted"
        until = self.snoozed.get((hint_id, subject))
        if until is not None and until > self.clock():
            return f"snoozed until {time.strftime('%H:%M', time.localtime(until))}" + (
                f" for this {noun}" if noun else "")
        return ""

    def passed(self) -> frozenset[tuple[str, str]]:
        """The (hint id, subject) pairs muted or snoozed one by one now: the rules name their next subject (a
        hint with no subject names no other)."""
        now = self.clock()
        return frozenset(self.muted_subjects | {k for k, until in self.snoozed.items() if until > now and k[1]})

    def kind_muted(self, hint_id: str) -> bool:
        """The hint `hint_id` is muted for every subject."""
        return hint_id in self.muted

    def set(self, hint_id: str, state: str, subject: str = "") -> None:
        """Mute ('muted') or snooze ('snoozed') the hint `hint_id` for `subject` (a hint with none: its kind),
        or bring it back ('': for every subject too)."""
        self.muted_subjects.discard((hint_id, subject))
        self.snoozed.pop((hint_id, subject), None)
        if state == "" or not subject:
            self.muted.discard(hint_id)
        if state == "muted" and subject:
            self.muted_subjects.add((hint_id, subject))
        elif state == "muted":
            self.muted.add(hint_id)
        elif state == "snoozed":
            self.snoozed[(hint_id, subject)] = self.clock() + SNOOZE_S

    def set_kind(self, hint_id: str, muted: bool) -> None:
        """Mute the hint `hint_id` for every subject, or bring it back for every subject but those muted one by
        one."""
        if muted:
            self.muted.add(hint_id)
        else:
            self.muted.discard(hint_id)
