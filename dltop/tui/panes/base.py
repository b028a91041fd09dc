"""The contract every pane keeps: a widget with a title and a `show(view)` that updates it in place."""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

from textual.app import SystemCommand
from textual.containers import Vertical

from dltop.tui.view import View


class Pane(Vertical):
    """One cache layer's tab. Subclasses set PANE_ID and TITLE, compose their widgets once, and update them in
    `show()` (no recompose per tick). Key bindings of a pane are shown in the footer while it has focus; actions
    that change the system must check `self.view.read_only` / `self.view.replay` in `check_action` and confirm
    through `dltop.tui.screens.confirm.ConfirmScreen`."""

    PANE_ID: ClassVar[str] = ""
    TITLE: ClassVar[str] = ""
    can_focus = False

    def __init__(self) -> None:
        super().__init__(id=f"pane-{self.PANE_ID}", classes="pane")
        self.view: View | None = None

    def show(self, view: View) -> None:
        """Remember the view and render it; called on every tick while mounted (visible or not)."""
        self.view = view
        self.render_view(view)

    def render_view(self, view: View) -> None:  # pragma: no cover - every pane overrides it
        """Update the widgets from `view`."""
        raise NotImplementedError

    def palette_commands(self) -> Iterable[SystemCommand]:
        """Command-palette entries for this pane's actions (the same actions its keys run)."""
        return ()
