"""The Caches pane: compile and model caches with their sizes, where their tools put them, and what is wrong.

Numbers come from the Snapshot's `caches` part (the Sampler's slow, budgeted walks). The pane only renders:
Enter opens a cache's biggest entries, c asks the app to clear the selected cache or entry (the app plans through
the action runner and shows a dialog stating the bytes), Esc cancels a clear.
"""

from __future__ import annotations

import time
from typing import Any

from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.coordinate import Coordinate
from textual.widgets import DataTable, Static

from dltop.derive import cache_growth
from dltop.fmt import human_bytes, shorten_middle
from dltop.hints.caches import warnings_for
from dltop.model import CachesPart, Snapshot, Unavailable
from dltop.model.base import display_path
from dltop.model.caches import CacheInfo
from dltop.text.caches import cache_row, entry_row
from dltop.text.datasets import progress_line
from dltop.tui.messages import CancelRequested, ClearRequested
from dltop.tui.panes.base import Pane, RowTable, fit_column, set_content, set_row
from dltop.tui.view import View

COLUMNS = ("name", "size", "files", "newest", "growth", "warn")
HEADERS = ("Cache", "Size", "Files", "Newest", "Growth", "!")
ENTRY_COLUMNS = ("name", "size", "files", "newest", "kind")
ENTRY_HEADERS = ("Entry", "Size", "Files", "Newest", "Kind")


def _part(snap: Snapshot | None) -> CachesPart | None:
    return snap.caches if snap is not None and isinstance(snap.caches, CachesPart) else None


class CachesPane(Pane):
    """Every cache: size, files, newest file, growth since dltop started, warnings; Enter opens, c clears."""

    PANE_ID = "caches"
    TITLE = "Caches"
    HELP = ("Each cache is placed the way its tool places it (environment variable first, then its default), in "
            "dltop's environment or, with --pid, in that process's. Sizes are du -B1's (every block once, "
            "symlinks never followed); ≥ marks a walk cut short by its time budget. Growth is since dltop started. "
            "c clears the selected cache or entry after a dialog stating the bytes; Esc cancels.")
    can_focus = False
    DEFAULT_CSS = """
    #cc-summary { height: auto; max-height: 2; }
    #cc-table { height: 1fr; min-height: 4; }
    #cc-detail { height: auto; max-height: 5; color: $text-muted; }
    #cc-progress { height: auto; max-height: 2; }
    """
    BINDINGS = [
        Binding("enter", "open", "Open", id="caches.open"),
        Binding("backspace", "back", "Back", id="caches.back"),
        Binding("c", "clear", "Clear", id="caches.clear"),
        Binding("escape", "cancel", "Cancel", id="caches.cancel"),
    ]

    def __init__(self, clock: Any = time.time) -> None:
        super().__init__()
        self._clock = clock
        self._open: str | None = None  # the cache whose entries are shown; None: the list of caches
        self._rows: list[str] = []
        self._mode: str | None = None  # the headers shown: "caches" or "entries"
        self._name_width = 0
        self._bindings_shown: tuple[bool, ...] = ()

    def compose(self) -> ComposeResult:
        yield Static(id="cc-summary")
        yield RowTable(id="cc-table", cursor_type="row", zebra_stripes=False)
        yield Static(id="cc-progress")
        yield Static(id="cc-detail")

    # -- data -------------------------------------------------------------------------------------------------

    def _caches(self) -> list[CacheInfo]:
        part = _part(self.view.snapshot if self.view is not None else None)
        return list(part.caches) if part is not None else []

    def _cache(self, name: str | None) -> CacheInfo | None:
        return next((c for c in self._caches() if c.name == name), None)

    def _growth(self, view: View) -> dict[str, int]:
        first = next((s for s in view.history if _part(s) is not None), None)
        return cache_growth(first, view.snapshot) if first is not None else {}

    def _columns(self, table: DataTable, mode: str) -> None:
        if self._mode == mode:
            return
        self._mode = mode
        self._name_width = 0
        table.clear(columns=True)
        keys, headers = (COLUMNS, HEADERS) if mode == "caches" else (ENTRY_COLUMNS, ENTRY_HEADERS)
        for key, label in zip(keys, headers, strict=True):
            table.add_column(label, key=key)

    def render_view(self, view: View) -> None:
        now = self.moment(view, self._clock)
        table = self.query_one("#cc-table", DataTable)
        part = view.snapshot.caches
        opened = self._cache(self._open)
        if self._open is not None and opened is None:
            self._open = None
        wanted: dict[str, tuple[str, ...]] = {}
        keys: tuple[str, ...]
        headers: tuple[str, ...]
        if opened is None:
            self._columns(table, "caches")
            growth = self._growth(view)
            caches = self._caches()
            for c in caches:
                wanted[c.name] = cache_row(c, growth.get(c.name), len(warnings_for(c, view.snapshot.ts)), now)
            summary = Text.assemble(("Caches", "bold"))
            if isinstance(part, Unavailable):
                summary.append(f"  unavailable: {part.reason}", "red")
            elif isinstance(part, CachesPart):
                present = [c for c in caches if c.exists]
                total = sum(c.size_bytes or 0 for c in present)
                summary.append(f"  {len(present)} of {len(caches)} present, {human_bytes(total)} in all · "
                               f"{part.environment}")
            else:
                summary.append("  measuring…", "dim")
            keys, headers = COLUMNS, HEADERS
        else:
            self._columns(table, "entries")
            for e in opened.entries:
                wanted[e.path] = entry_row(e, now)
            summary = Text.assemble(("Caches", "bold"), " › ", (opened.label, "bold"),
                                    f"  {display_path(opened.path)}")
            if not opened.entries:
                summary.append("  (empty)", "dim")
            keys, headers = ENTRY_COLUMNS, ENTRY_HEADERS
        set_content(self.query_one("#cc-summary", Static), summary)
        self._name_width = fit_column(table, wanted, 0, headers, keys, shorten_middle, self._name_width)
        for stale in [k for k in table.rows if k.value not in wanted]:
            table.remove_row(stale)
        for key, values in wanted.items():
            set_row(table, key, keys, values)
        self._rows = list(wanted)
        set_content(self.query_one("#cc-detail", Static), self._detail(opened, now))
        set_content(self.query_one("#cc-progress", Static), self._progress(view))
        shown = (view.busy, self._open is not None, self._selected() is not None)
        if shown != self._bindings_shown:
            self._bindings_shown = shown
            self.refresh_bindings()

    def _detail(self, opened: CacheInfo | None, now: float) -> Text:
        """The selected cache's path, rule and warnings (or, opened, its totals)."""
        c = opened or self._cache(self._selected())
        t = Text()
        if c is None:
            return t
        t.append(display_path(c.path), "bold")
        t.append(f"  ({c.source})")
        for k, v in c.settings.items():
            t.append(f"\n{k}={v}")
        if c.exists and c.size_bytes is None:
            t.append(f"\nunavailable: {c.unavailable.get('size_bytes', '')}", "red")
        # judged at the Snapshot's time, as the hints are: a replay shows what live showed
        snap_ts = self.view.snapshot.ts if self.view is not None else now
        for w in warnings_for(c, snap_ts):
            t.append(f"\n! {w}", "yellow")
        if c.clear_command:
            t.append(f"\nits own clear command: {c.clear_command}")
        if c.noted:
            t.append("\nnoted: " + ", ".join(f"{n} {why.replace('_', ' ')}" for why, n in c.noted.items()))
        return t

    def _progress(self, view: View) -> Text:
        ev = view.action
        if ev is None or ev.action != "clear":
            return Text()
        if ev.phase == "progress":
            return Text(progress_line(ev) + " · Esc cancels")
        if ev.phase == "started":
            return Text(f"clear {ev.target}: {'measuring…' if ev.step == 'plan' else 'starting…'} (Esc cancels)")
        if ev.outcome in ("error", "refused"):
            return Text(ev.message, "red")
        if ev.step == "plan":
            return Text(f"clear {ev.target}: cancelled" if ev.outcome == "cancelled" else "")
        return Text(ev.message, "bold")

    def _selected(self) -> str | None:
        table = self.query_one("#cc-table", DataTable)
        if not self._rows or table.row_count == 0:
            return None
        row = min(max(table.cursor_row, 0), table.row_count - 1)
        return str(table.coordinate_to_cell_key(Coordinate(row, 0)).row_key.value)

    def _rerender(self) -> None:
        if self.view is not None:
            self.render_view(self.view)

    # -- navigation -------------------------------------------------------------------------------------------

    @on(DataTable.RowSelected, "#cc-table")
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_open()

    @on(DataTable.RowHighlighted, "#cc-table")
    def _row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if self.view is not None and self._open is None:
            set_content(self.query_one("#cc-detail", Static), self._detail(None, self.moment(self.view, self._clock)))

    def action_open(self) -> None:
        """Show the biggest entries of the selected cache."""
        if self._open is not None:
            return
        c = self._cache(self._selected())
        if c is None or not c.exists:
            return
        self._open = c.name
        self._rerender()
        self.query_one("#cc-table", DataTable).move_cursor(row=0)

    def action_back(self) -> None:
        """Back to the list of caches."""
        if self._open is not None:
            left, self._open = self._open, None
            self._rerender()
            if left in self._rows:
                self.query_one("#cc-table", DataTable).move_cursor(row=self._rows.index(left))

    # -- actions ----------------------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        view = self.view
        if action == "clear":
            if view is None or view.read_only or view.replay:
                return None  # greyed out: nothing here may change the system
            return not view.busy
        if action == "cancel":
            return view is not None and view.busy
        if action == "back":
            return self._open is not None
        return True

    def _target(self) -> str | None:
        key = self._selected()
        if key is None:
            return None
        if self._open is None:
            c = self._cache(key)
            return c.path if c is not None and c.exists else None
        return key

    def action_clear(self) -> None:
        """Clear the selected cache (what is in it) or entry, after a dialog stating the bytes."""
        path = self._target()
        if path is None:
            self.notify("no cache there to clear", severity="warning")
            return
        self.post_message(ClearRequested(path))

    def on_key(self, event: events.Key) -> None:
        view = self.view
        if event.key == "c" and view is not None and (view.read_only or view.replay):
            event.stop()
            why = "dltop runs --read-only" if view.read_only else "this is a replay"
            self.notify(f"c: {why}; nothing here may change the system", severity="warning", timeout=3)

    def action_cancel(self) -> None:
        """Stop the clear in flight (it reports what it removed)."""
        self.post_message(CancelRequested())
