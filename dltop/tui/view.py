"""What the app hands every pane on each tick: the latest Snapshot, recent history and the hints."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dltop.hints import Hint
from dltop.model import Snapshot


@dataclass(frozen=True)
class View:
    """Attributes down: a pane renders only this."""

    snapshot: Snapshot
    history: Sequence[Snapshot]  # oldest first, ending with `snapshot`
    hints: Sequence[Hint] = ()
    read_only: bool = False
    replay: bool = False  # a recording is being shown: actions that change the system are off

    @property
    def previous(self) -> Snapshot | None:
        """The Snapshot before this one, for rates."""
        return self.history[-2] if len(self.history) >= 2 else None
