"""A yes/no dialog for risky actions; it states exactly what will happen ("evict 41.2 GiB from /data/imagenet")."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class ConfirmScreen(ModalScreen[bool]):
    """Dismisses with True only on an explicit yes (`y` or the button); Esc, `n` or the other button say no."""

    BINDINGS = [
        Binding("y", "answer(True)", "Yes", id="confirm.yes"),
        Binding("n,escape", "answer(False)", "No", id="confirm.no"),
    ]

    def __init__(self, title: str, body: str, yes_label: str = "Yes") -> None:
        super().__init__()
        self._title = title
        self._body = body
        self._yes_label = yes_label

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-dialog"):
            yield Static(self._title, id="confirm-title")
            yield Static(self._body, id="confirm-body")
            with Horizontal(id="confirm-buttons"):
                yield Button(f"{self._yes_label} (y)", variant="error", id="confirm-yes")
                yield Button("Cancel (n/Esc)", variant="primary", id="confirm-no")

    def on_mount(self) -> None:
        # The safe answer has the focus, so Enter does not confirm by accident.
        self.query_one("#confirm-no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "confirm-yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
