"""What the app hands every pane on each tick: the latest Snapshot, recent history, the hints, and the state of
the actions (the runner's latest event, what is held)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dltop.hints import Hint
from dltop.model import Snapshot
from dltop.model.actions import ActionEvent


@dataclass(frozen=True)
class View:
    """Attributes down: a pane renders only this."""

    snapshot: Snapshot
    history: Sequence[Snapshot]  # oldest first, ending with `snapshot`
    hints: Sequence[Hint] = ()
    read_only: bool = False
    replay: bool = False  # a past moment is shown (a recording, or paused live): actions that change the system are off
    frozen: str | None = None  # why nothing may change the system from here (read-only, a replay, paused), or None
    past: str | None = None  # why the moment shown is not now (a replay, paused), or None
    watched: tuple[str, ...] = ()  # the dataset folders being watched now (added and removed at run time)
    action: ActionEvent | None = None  # the latest event of the action in flight, or of the last one
    busy: bool = False  # an action (or its plan) is in flight
    held: Mapping[str, int | None] = field(default_factory=dict)  # locked targets (here, or by this user's lock
    # holder processes) and their bytes (None: not known)

    @property
    def previous(self) -> Snapshot | None:
        """The Snapshot before this one, for rates."""
        return self.history[-2] if len(self.history) >= 2 else None
