"""The help screen (`?`): every key of the app and of the current pane, the current hints (each can be snoozed or
muted here: for what it is about, a job or a dataset, or for every one of its kind), and where the pane's numbers
come from."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from dltop.fmt import printable
from dltop.hints import Hint, Quieted, subject_noun

ABOUT = "A value the system cannot give is shown as n/a (or ?) with the reason, never as 0."
HINT_KEYS = "hints ↑/↓: s snooze 1 h, m mute this one, M all its kind; again undoes"  # one line at 80x24
# One row per key of the app (its pair, its other labels left out), in words where the label is short.
HELP_SKIPS = {"app.interrupt", "app.slower", "app.live", "app.play", "app.step_back", "app.goto_live",
              "app.jump_back", "app.speed_down"}
HELP_TEXT = {
    "app.faster": "refresh faster / slower",
    "app.palette": "command palette",
    "app.pause": "pause / live; play a replay",
    "app.step": "next / previous sample",
    "app.jump": "jump {jump} on / back",
    "app.goto": "go to a time",
    "app.events": "events (replay; live: actions seen)",
    "app.speed": "replay ×1/×10/×60",
    "app.mark": "marker (--record)",
}
TEXT_WIDTH = 72  # the dialog's 76 columns less its border and padding
HINT_LIST_MOST = 6  # hint lines before the list scrolls (one line per hint; the chosen one in full below)


def key_rows(bindings: Iterable[BindingType], key_display: Callable[[Binding], str], jump: str) -> list[tuple[str, str]]:
    """(key, what it does) for each labelled binding, enabled now or not, once per description."""
    rows: list[tuple[str, str]] = []
    seen = set()
    for binding in bindings:
        if not isinstance(binding, Binding) or not binding.description:
            continue
        if binding.id in HELP_SKIPS or (binding.id or "").startswith("app.tab") or binding.description in seen:
            continue
        seen.add(binding.description)
        description = HELP_TEXT.get(binding.id or "", binding.description).format(jump=jump)
        rows.append((binding.key_display or key_display(binding), description))
    return rows


class HelpScreen(ModalScreen[None]):
    """Lists key bindings and hints, whole: the dialog scrolls (PgUp/PgDn, Home/End, the mouse) where the screen is
    short; any of Esc, q or ? closes it; s and m snooze and mute the hint chosen for what it is about (this job),
    M mutes its kind (every job)."""

    BINDINGS = [
        Binding("escape,q,question_mark", "close", "Close", id="help.close"),
        Binding("s", "hint('snoozed')", "Snooze hint", id="help.snooze"),
        Binding("m", "hint('muted')", "Mute hint", id="help.mute"),
        Binding("M", "mute_kind", "Mute its kind", id="help.mute_kind"),
        Binding("pageup", "scroll('page_up')", "Page up", show=False, priority=True),
        Binding("pagedown", "scroll('page_down')", "Page down", show=False, priority=True),
        Binding("home", "scroll('scroll_home')", "Top", show=False, priority=True),
        Binding("end", "scroll('scroll_end')", "Bottom", show=False, priority=True),
    ]

    def __init__(self, bindings: list[tuple[str, str]], about: str = "", hints: Sequence[Hint] = (),
                 quieted: Quieted | None = None, changed: Callable[[], None] = lambda: None) -> None:
        super().__init__()
        self._rows = bindings
        self._about = f"{about} {ABOUT}".strip()  # where the visible pane's numbers come from
        self._hints = list(hints)  # every hint now, muted and snoozed ones too
        self._quieted = quieted  # what s, m and M change (None: nothing to change)
        self._changed = changed  # called after each change (the hint line follows)

    def compose(self) -> ComposeResult:
        table = self._table()
        with VerticalScroll(id="help-dialog"):
            yield Static(Text.assemble(("dltop — keys", "bold"), ("   PgUp/PgDn scroll, Esc closes", "dim")))
            yield Static(table, id="help-keys")
            if self._hints:
                yield Static(Text(HINT_KEYS, style="dim"), id="help-hint-keys")
                # One line per hint: a hint's 3-5 wrapped lines each pushed the keys and the about line off 80x24.
                yield OptionList(*self._options(), id="help-hints")
                yield Static(id="help-hint-text")
            yield Static(id="help-about")

    def _table(self) -> Table:
        # Keys in two columns of pairs, so the busiest tab's keys, its hints and its sources fit 80x24.
        table = Table.grid(padding=(0, 1))
        for style in ("bold", None, "bold", None):
            table.add_column(style=style)
        half = (len(self._rows) + 1) // 2
        for left, right in zip(self._rows[:half], [*self._rows[half:], ("", "")], strict=False):
            table.add_row(left[0], left[1] + "   ", right[0], right[1])
        return table

    def _state(self, hint: Hint) -> str:
        return self._quieted.state(hint.id, hint.subject) if self._quieted is not None else ""

    @staticmethod
    def _text(hint: Hint) -> str:
        return hint.text + (f" — {hint.fix}" if hint.fix else "")

    def _options(self) -> list[Option]:
        out = []
        for hint in self._hints:
            state = self._state(hint)
            t = Text(no_wrap=True, overflow="ellipsis")
            if state:
                t.append(f"[{state}] ", "bold")
            t.append(printable(hint.id), "bold dim" if state else "bold")
            t.append(": " + printable(self._text(hint)), "dim" if state else "")
            t.truncate(TEXT_WIDTH - 4, overflow="ellipsis")  # the list's padding and scroll bar
            out.append(Option(t))
        return out

    def on_mount(self) -> None:
        if self._hints:
            hints = self.query_one("#help-hints", OptionList)
            hints.styles.height = min(len(self._hints), HINT_LIST_MOST)
            hints.focus()
            self._show_hint(0)
        else:
            self.query_one("#help-dialog", VerticalScroll).focus()  # the arrows scroll it
        self.query_one("#help-about", Static).update(Text(self._about, style="dim"))

    def action_scroll(self, how: str) -> None:
        """Scroll the dialog (the hint list keeps the arrows)."""
        getattr(self.query_one("#help-dialog", VerticalScroll), f"action_{how}")()

    def _chosen(self) -> int:
        if not self._hints:
            return 0
        options = self.query_one("#help-hints", OptionList)
        return options.highlighted if options.highlighted is not None else 0

    def _hint_text(self, i: int) -> str:
        hint = self._hints[i]
        state = self._state(hint)
        about = f" ({printable(hint.subject)})" if hint.subject else ""
        return f"{'[' + state + '] ' if state else ''}{printable(hint.id)}{about}: {printable(self._text(hint))}"

    def _show_hint(self, i: int) -> None:
        self.query_one("#help-hint-text", Static).update(Text(self._hint_text(i)))

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        self._show_hint(event.option_index)

    def action_close(self) -> None:
        self.dismiss(None)

    def action_hint(self, state: str) -> None:
        """Snooze or mute the hint chosen for what it is about (a hint muted or snoozed: bring it back)."""
        if self._hints and self._quieted is not None:
            hint = self._hints[self._chosen()]
            now = self._state(hint)
            self._quieted.set(hint.id, "" if now.startswith(state) else state, hint.subject)
            self._after_change(hint)

    def action_mute_kind(self) -> None:
        """Mute the hint chosen for every subject (every job, every dataset); pressed again, bring it back."""
        if self._hints and self._quieted is not None:
            hint = self._hints[self._chosen()]
            self._quieted.set_kind(hint.id, not self._quieted.kind_muted(hint.id))
            self._after_change(hint)

    def _after_change(self, hint: Hint) -> None:
        self._changed()
        options = self.query_one("#help-hints", OptionList)
        for i, prompt in enumerate(o.prompt for o in self._options()):  # a kind's mute marks each of its hints
            options.replace_option_prompt_at_index(i, prompt)
        self._show_hint(self._chosen())
        state = self._state(hint) or (f"shown again for this {subject_noun(hint.subject)}" if hint.subject
                                      else "shown again")
        about = f" ({printable(hint.subject)})" if hint.subject else ""
        self.notify(f"{printable(hint.id)}{about}: {state}", timeout=3)
