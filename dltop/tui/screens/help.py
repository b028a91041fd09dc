"""The help screen (`?`): every key of the app and of the current pane, and where its numbers come from."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from dltop.tui.panes.base import safe_content

ABOUT = "A value the system cannot give is shown as n/a (or ?) with the reason, never as 0."


class HelpScreen(ModalScreen[None]):
    """Lists key bindings; any of Esc, q or ? closes it."""

    BINDINGS = [Binding("escape,q,question_mark", "close", "Close", id="help.close")]

    def __init__(self, bindings: list[tuple[str, str]], about: str = "", hints: list[str] | None = None) -> None:
        super().__init__()
        self._rows = bindings
        self._about = about  # where the visible pane's numbers come from
        self._hints = hints or []

    def compose(self) -> ComposeResult:
        # Keys in two columns of pairs, so the busiest tab's keys, its hints and its sources fit 80x24.
        table = Table.grid(padding=(0, 1))
        for style in ("bold", None, "bold", None):
            table.add_column(style=style)
        half = (len(self._rows) + 1) // 2
        for left, right in zip(self._rows[:half], [*self._rows[half:], ("", "")], strict=False):
            table.add_row(left[0], left[1] + "   ", right[0], right[1])
        with VerticalScroll(id="help-dialog"):
            yield Static(Text("dltop — keys", style="bold"))
            yield Static(table)
            for hint in self._hints:
                yield Static(safe_content("hint: " + hint, one_line=True), classes="help-hint")
            yield Static(Text(f"{self._about} {ABOUT}".strip(), style="dim"), id="help-about")

    def action_close(self) -> None:
        self.dismiss(None)
