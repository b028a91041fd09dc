"""The event list of a replay (`v`): OOM kills, markers, actions, GPU processes, hints; Enter goes to one."""

from __future__ import annotations

import bisect
import time
from collections.abc import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from dltop.text.events import describe_event
from dltop.timeline import TimedEvent
from dltop.tui.panes.base import safe_content

KIND_STYLES = {"oom_kill": "bold red", "marker": "bold", "hint": "yellow"}


def event_line(ev: TimedEvent, dated: bool) -> Text:
    """'14:05:13  OOM kill: 1 in the kernel (vmstat)'."""
    when = time.strftime("%Y-%m-%d %H:%M:%S" if dated else "%H:%M:%S", time.localtime(ev.ts))
    return Text.assemble((when, "dim"), "  ", (describe_event(ev.kind, ev.data), KIND_STYLES.get(ev.kind, "")))


class EventsScreen(ModalScreen[float | None]):
    """Dismisses with the time of the event chosen (Enter), or None (Esc); opens on the event at or before `now`."""

    BINDINGS = [Binding("escape,v", "close", "Close", id="events.close")]

    def __init__(self, events: Sequence[TimedEvent], now: float) -> None:
        super().__init__()
        self._events = sorted(events, key=lambda e: e.ts)
        self._now = now

    def compose(self) -> ComposeResult:
        days = {time.localtime(e.ts)[:3] for e in self._events}
        with Vertical(id="events-dialog"):
            yield Static(Text(f"Events ({len(self._events)}) — Enter goes there, Esc closes", style="bold"))
            yield OptionList(*(Option(safe_content(event_line(e, len(days) > 1), one_line=True)) for e in self._events), id="events-list")

    def on_mount(self) -> None:
        table = self.query_one(OptionList)
        if self._events:
            table.highlighted = max(0, bisect.bisect_right([e.ts for e in self._events], self._now) - 1)
        table.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.dismiss(self._events[event.option_index].ts)

    def action_close(self) -> None:
        self.dismiss(None)
