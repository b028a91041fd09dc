"""A one-line question (the time to go to, a marker's text): Enter answers, Esc cancels."""

from __future__ import annotations

from collections.abc import Callable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from dltop.tui.panes.base import plain


class AskScreen(ModalScreen[str | None]):
    """Dismisses with the text typed, or None on Esc. `check(text)` returns why an answer cannot be taken (the
    dialog stays open and says so) or None."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="ask.cancel")]

    def __init__(self, title: str, placeholder: str = "", check: Callable[[str], str | None] | None = None) -> None:
        super().__init__()
        self._title = title
        self._placeholder = placeholder
        self._check = check

    def compose(self) -> ComposeResult:
        with Vertical(id="ask-dialog"):
            yield Static(plain(self._title), id="ask-title")
            yield Input(placeholder=self._placeholder, id="ask-input")
            yield Static("", id="ask-error")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        text = event.value.strip()
        if not text:
            return
        why = self._check(text) if self._check is not None else None
        if why is not None:
            self.query_one("#ask-error", Static).update(plain(why))
            return
        self.dismiss(text)

    def action_cancel(self) -> None:
        self.dismiss(None)
