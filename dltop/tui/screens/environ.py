"""A GPU process's environment (the GPU tab's `e`): NAME=value a line, secrets masked (dltop.actions.environ),
everything escaped, in a box that scrolls; Esc closes."""

from __future__ import annotations

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from dltop.actions.environ import Environ, read_environ
from dltop.errors import DltopError
from dltop.fmt import printable, shorten_end


class EnvironScreen(ModalScreen[None]):
    """The environment of one process, as read when it opened."""

    DEFAULT_CSS = """
    EnvironScreen { align: center middle; }
    #environ-dialog { width: 100; max-width: 100%; height: auto; max-height: 100%; border: thick $primary;
                      background: $surface; padding: 0 1; }
    #environ-title { text-style: bold; }
    #environ-note { color: $text-muted; }
    #environ-box { height: auto; max-height: 100%; }
    """
    BINDINGS = [Binding("escape,q,e", "close", "Close", id="environ.close")]

    def __init__(self, env: Environ, user: str, command: str) -> None:
        super().__init__()
        self._env = env
        self._user = user
        self._command = command

    def compose(self) -> ComposeResult:
        env = self._env
        with Vertical(id="environ-dialog"):
            yield Static(Text(shorten_end(f"Environment of pid {env.pid} ({self._user}): {self._command}", 200)),
                         id="environ-title")
            bits = [f"{len(env.variables)} variables"]
            if env.masked:
                bits.append(f"{env.masked} masked (names with TOKEN, KEY, PASSWORD, SECRET, CREDENTIAL; the "
                            "credentials in URLs)")
            if env.cut:
                bits.append("cut at 1 MiB")
            yield Static(Text("; ".join(bits) + ". ↑ ↓ PgUp PgDn scroll, Esc closes"), id="environ-note")
            with VerticalScroll(id="environ-box"):
                lines = Text(no_wrap=False, end="")
                for i, (name, value) in enumerate(env.variables):
                    lines.append(("\n" if i else "") + printable(name), style="bold")
                    lines.append("=" + printable(value))
                yield Static(lines or Text("(empty: a zombie, a kernel thread or a process that cleared it)"),
                             id="environ-text")

    def on_mount(self) -> None:
        self.query_one("#environ-box").focus()

    def action_close(self) -> None:
        """Close."""
        self.dismiss(None)


def show_environ(app: App[object], pid: int, start_time_ticks: int, user: str, command: str) -> None:
    """Read the process's environment now and show it, or say in one line why it cannot be."""
    try:
        env = read_environ(pid, start_time_ticks)
    except DltopError as e:
        app.notify(str(e), severity="warning")
        return
    app.push_screen(EnvironScreen(env, printable(user), command))
