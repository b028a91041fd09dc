"""The Cluster tab's dialogs: a node's detail (Enter), and the commands to run on other nodes (w), copyable."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from dltop.tui.panes.base import safe_content


class ClusterTextScreen(ModalScreen[None]):
    """Lines of text in a scrolling dialog; `c` copies `copy` (when given) to the clipboard, Esc or q closes."""

    DEFAULT_CSS = """
    ClusterTextScreen { align: center middle; }
    #cluster-dialog { width: 100%; height: auto; max-height: 90%; border: thick $primary; background: $surface;
                      padding: 0 1; }
    """
    BINDINGS = [Binding("escape,q", "close", "Close", id="cluster.close"),
                Binding("c", "copy", "Copy", id="cluster.copy")]

    def __init__(self, title: str, lines: Sequence[str], copy: str = "") -> None:
        super().__init__()
        self._title, self._lines, self._copy = title, list(lines), copy

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="cluster-dialog"):
            yield Static(Text(self._title, style="bold"))
            # Every line holds label values from Prometheus: escaped, never read as markup.
            yield Static(safe_content("\n".join(self._lines)), id="cluster-dialog-text")
            hint = "c copies the commands, Esc closes" if self._copy else "Esc closes"
            yield Static(Text(hint, style="dim"))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "copy":
            return bool(self._copy)
        return True

    def action_copy(self) -> None:
        # The commands as they are (shell-quoted, names checked): dltop runs nothing on the other nodes.
        self.app.copy_to_clipboard(self._copy)
        self.app.notify(f"copied {len(self._copy.splitlines())} command lines to the clipboard", timeout=3)

    def action_close(self) -> None:
        self.dismiss(None)
