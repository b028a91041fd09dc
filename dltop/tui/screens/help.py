"""The help screen (`?`): every key of the app and of the current pane, the current hints (each can be snoozed or
muted here, by id), and where the pane's numbers come from."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from dltop.fmt import printable

ABOUT = "A value the system cannot give is shown as n/a (or ?) with the reason, never as 0."
HINT_KEYS = ("hints: ↑/↓ choose, s snooze 1 h, m mute (this session; mute = [\"ID\"] in the config keeps it); "
             "again to bring it back")


class HelpScreen(ModalScreen[None]):
    """Lists key bindings and hints; any of Esc, q or ? closes it; s and m snooze and mute the hint chosen."""

    BINDINGS = [
        Binding("escape,q,question_mark", "close", "Close", id="help.close"),
        Binding("s", "hint('snoozed')", "Snooze hint", id="help.snooze"),
        Binding("m", "hint('muted')", "Mute hint", id="help.mute"),
    ]

    def __init__(self, bindings: list[tuple[str, str]], about: str = "",
                 hints: Sequence[tuple[str, str]] = (),
                 hint_state: Callable[[str], str] = lambda _id: "",
                 set_hint_state: Callable[[str, str], None] | None = None) -> None:
        super().__init__()
        self._rows = bindings
        self._about = about  # where the visible pane's numbers come from
        self._hints = list(hints)  # (id, text): every hint now, muted and snoozed ones too
        self._state = hint_state
        self._set_state = set_hint_state

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
            if self._hints:
                yield OptionList(*self._options(), id="help-hints")
                yield Static(Text(HINT_KEYS, style="dim"), id="help-hint-keys")
            yield Static(Text(f"{self._about} {ABOUT}".strip(), style="dim"), id="help-about")

    def _options(self) -> list[Option]:
        out = []
        for hint_id, text in self._hints:
            state = self._state(hint_id)
            t = Text()
            if state:
                t.append(f"[{state}] ", "bold")
            t.append(printable(hint_id), "bold dim" if state else "bold")
            t.append(": " + printable(text), "dim" if state else "")
            out.append(Option(t, id=hint_id))
        return out

    def on_mount(self) -> None:
        if self._hints:
            self.query_one("#help-hints", OptionList).focus()

    def action_close(self) -> None:
        self.dismiss(None)

    def action_hint(self, state: str) -> None:
        """Snooze or mute the hint chosen; pressed again, bring it back."""
        if not self._hints or self._set_state is None:
            return
        options = self.query_one("#help-hints", OptionList)
        i = options.highlighted if options.highlighted is not None else 0
        hint_id = self._hints[i][0]
        now = self._state(hint_id)
        self._set_state(hint_id, "" if now.startswith(state) else state)
        options.replace_option_prompt_at_index(i, self._options()[i].prompt)
        self.notify(f"{hint_id}: {self._state(hint_id) or 'shown again'}", timeout=3)
