"""The signal dialog of the GPU tab: which signal to send to the selected process, or to the tagged ones (listed a
line each, in a box that scrolls); `y` sends, Esc cancels. What is asked always shows: the question, when the process
started, its command line cut to two lines; the whole one is below the choices, in a box of its own that scrolls (a
100 kB argv fills that box, never the screen)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static

from dltop.fmt import human_duration, printable, shorten_end, shorten_lines
from dltop.model.actions import SIGNALS
from dltop.text.gpu import short_command
from dltop.tui.panes.base import plain

MEANINGS = {"SIGTERM": "ask it to stop (it may clean up first)", "SIGKILL": "stop it at once (nothing saved)",
            "SIGINT": "as Ctrl-C in its terminal (torchrun passes it to the ranks)"}
COMMAND_LINES = 2  # of the command line under the question
SET_HELP = ("each is checked again before the send (a pid reused since is spared); y sends the highlighted signal to "
            "all, Esc cancels; Tab, then ↑ ↓ scroll the list")


def started_text(started_at: float | None, now: float) -> str:
    """'started 2025-05-01 12:03:04 (3h05m ago)', or that it is not known."""
    if started_at is None:
        return "started: not known"
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started_at))
    return f"started {when} ({human_duration(max(0.0, now - started_at))} ago)"


class CommandHead(Static):
    """The first lines of a command line from outside, escaped and cut to this widget's width by the one rule
    (fmt.shorten_lines): drawn at the width it has, so it stays two lines whatever the terminal's size."""

    def __init__(self, command: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.command = command
        self.cut = False  # the command did not fit in its lines: the whole one is in the box below

    def render(self) -> Text:
        width = self.content_region.width or 66
        rows = shorten_lines(self.command, width, COMMAND_LINES)
        self.cut = len(rows) == COMMAND_LINES and rows[-1].endswith("…") and printable(self.command) != "".join(rows)
        return Text("\n".join(rows), no_wrap=True, overflow="crop", end="")


Listed = tuple[int, str, float | None, str]  # a tagged process as the dialog lists it: pid, user, started, command


def listed_line(pid: int, user: str, started_at: float | None, command: str, width: int) -> str:
    """One tagged process in one line of `width` cells: pid, user, start time, command (escaped, cut with '…')."""
    when = time.strftime("%m-%d %H:%M", time.localtime(started_at)) if started_at is not None else "start ?"
    head = f"{pid:>7} {printable(user)[:12]:<8} {when} "
    return head + shorten_end(short_command(command), max(8, width - len(head)))


class ListedProcesses(Static):
    """The tagged processes, a line each, cut to this widget's width (drawn at the width it has)."""

    def __init__(self, processes: Sequence[Listed], *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.processes = processes

    def render(self) -> Text:
        width = self.content_region.width or 66
        return Text("\n".join(listed_line(*p, width) for p in self.processes), no_wrap=True, overflow="crop",
                    end="")


class SignalScreen(ModalScreen[str | None]):
    """Dismisses with the signal chosen (SIGTERM highlighted first) on `y`, or None on Esc or `n`."""

    DEFAULT_CSS = """
    SignalScreen { align: center middle; }
    #signal-dialog { width: 72; max-width: 100%; height: auto; max-height: 100%; border: thick $error;
                     background: $surface; padding: 0 2; }
    #signal-title { text-style: bold; }
    #signal-started { color: $text-muted; }
    #signal-command { height: 2; color: $text-muted; margin-bottom: 1; }
    #signal-choice { height: auto; }
    #signal-help { margin-top: 1; }
    #signal-whole { height: auto; max-height: 6; margin-top: 1; border-top: solid $foreground-muted; }
    #signal-whole:focus { border-top: solid $accent; }
    #signal-list { height: auto; max-height: 8; margin-bottom: 1; }
    #signal-list:focus { background: $boost; }
    """
    BINDINGS = [
        Binding("y", "send", "Send", id="signal.send"),
        Binding("n,escape", "cancel", "Cancel", id="signal.cancel"),
    ]

    def __init__(self, pid: int, who: str, command: str, started_at: float | None = None, now: float | None = None,
                 processes: Sequence[Listed] = ()) -> None:
        """One process (pid, who, command, started_at), or with `processes` (two or more) the tagged set."""
        super().__init__()
        self._processes = tuple(processes)
        self._pid = pid
        self._who = who
        self._command = command
        self._started = started_text(started_at, time.time() if now is None else now)

    def compose(self) -> ComposeResult:
        several = len(self._processes) > 1
        with Vertical(id="signal-dialog", classes="dialog"):
            if several:
                yield from self._compose_set()
            else:
                yield Static(Text(f"Signal pid {self._pid} ({printable(self._who)})?"), id="signal-title")
                yield Static(Text(self._started), id="signal-started")
                yield CommandHead(self._command, id="signal-command")
            yield OptionList(*(f"{name:<8} {MEANINGS[name]}" for name in SIGNALS), id="signal-choice")
            yield Static(plain(SET_HELP if several else "y sends the highlighted signal, Esc cancels"), id="signal-help")
            if not several:
                with VerticalScroll(id="signal-whole") as whole:
                    whole.border_title = "the whole command line: Tab, then ↑ ↓ scroll it"
                    whole.display = False
                    yield Static(Text(printable(self._command)), id="signal-whole-text")

    def _compose_set(self) -> ComposeResult:
        users = sorted({printable(p[1]) for p in self._processes})
        yield Static(Text(f"Signal the {len(self._processes)} tagged processes ({', '.join(users)})?"),
                     id="signal-title")
        with VerticalScroll(id="signal-list"):
            yield ListedProcesses(self._processes)

    def on_mount(self) -> None:
        choice = self.query_one(OptionList)
        choice.highlighted = 0
        choice.focus()
        self.call_after_refresh(self._show_whole)

    def on_resize(self) -> None:
        self.call_after_refresh(self._show_whole)

    def _show_whole(self) -> None:
        """The box with the whole command line shows where the two lines above had to cut it (one process)."""
        if len(self._processes) > 1:
            return
        head = self.query_one(CommandHead)
        whole = self.query_one("#signal-whole", VerticalScroll)
        if whole.display != head.cut:
            whole.display = head.cut

    def action_send(self) -> None:
        """Send the highlighted signal."""
        at = self.query_one(OptionList).highlighted
        self.dismiss(SIGNALS[at if at is not None else 0])

    def action_cancel(self) -> None:
        """Close without sending anything."""
        self.dismiss(None)
