"""The help screen (`?`): every key of the app and of the current pane, and what the numbers mean."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

ABOUT = (
    "Numbers come straight from the kernel: /proc/meminfo, /proc/vmstat, /proc/pressure, /proc/diskstats and "
    "the memory cgroup of the watched process. A value the system cannot give is shown as n/a with the reason. "
    "Disk columns follow iostat -x; refaults are evicted file pages read back soon after (cache thrashing)."
)


class HelpScreen(ModalScreen[None]):
    """Lists key bindings; any of Esc, q or ? closes it."""

    BINDINGS = [Binding("escape,q,question_mark", "close", "Close", id="help.close")]

    def __init__(self, bindings: list[tuple[str, str]]) -> None:
        super().__init__()
        self._rows = bindings

    def compose(self) -> ComposeResult:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold")
        table.add_column()
        for key, description in self._rows:
            table.add_row(key, description)
        with VerticalScroll(id="help-dialog"):
            yield Static(Text("dltop — keys", style="bold"))
            yield Static(table)
            yield Static(Text(ABOUT, style="dim"), id="help-about")

    def action_close(self) -> None:
        self.dismiss(None)
