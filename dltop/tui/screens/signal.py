"""The signal dialog of the GPU tab: which signal to send to the selected process; `y` sends, Esc cancels."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static

from dltop.model.actions import SIGNALS
from dltop.tui.panes.base import plain

MEANINGS = {"SIGTERM": "ask it to stop (it may clean up first)", "SIGKILL": "stop it at once (nothing saved)",
            "SIGINT": "as Ctrl-C in its terminal (torchrun passes it to the ranks)"}


class SignalScreen(ModalScreen[str | None]):
    """Dismisses with the signal chosen (SIGTERM highlighted first) on `y`, or None on Esc or `n`."""

    DEFAULT_CSS = """
    SignalScreen { align: center middle; }
    #signal-dialog { width: 72; max-width: 100%; height: auto; border: thick $error; background: $surface;
                     padding: 1 2; }
    #signal-title { text-style: bold; }
    #signal-command { color: $text-muted; margin-bottom: 1; }
    #signal-choice { height: auto; }
    #signal-help { margin-top: 1; }
    """
    BINDINGS = [
        Binding("y", "send", "Send", id="signal.send"),
        Binding("n,escape", "cancel", "Cancel", id="signal.cancel"),
    ]

    def __init__(self, pid: int, who: str, command: str, note: str = "") -> None:
        super().__init__()
        self._pid = pid
        self._who = who
        self._command = command
        self._note = note

    def compose(self) -> ComposeResult:
        with Vertical(id="signal-dialog", classes="dialog"):
            yield Static(plain(f"Signal pid {self._pid} ({self._who})?"), id="signal-title")
            yield Static(plain(self._command), id="signal-command")
            yield OptionList(*(f"{name:<8} {MEANINGS[name]}" for name in SIGNALS), id="signal-choice")
            yield Static(plain((self._note + "\n" if self._note else "") + "y sends the highlighted signal, "
                               "Esc cancels"), id="signal-help")

    def on_mount(self) -> None:
        choice = self.query_one(OptionList)
        choice.highlighted = 0
        choice.focus()

    def action_send(self) -> None:
        """Send the highlighted signal."""
        at = self.query_one(OptionList).highlighted
        self.dismiss(SIGNALS[at if at is not None else 0])

    def action_cancel(self) -> None:
        """Close without sending anything."""
        self.dismiss(None)
