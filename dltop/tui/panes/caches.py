"""The Caches pane: compile and model caches with their sizes, where their tools put them, and what is wrong.

Numbers come from the Snapshot's `caches` part (the Sampler's slow, budgeted walks). The pane only renders:
Enter opens a cache and its folders (Backspace goes up), s sorts, a toggles apparent sizes, r asks for a rewalk;
c asks the app to clear the selected cache or entry (the app plans through the action runner and shows a dialog
stating the bytes), Esc cancels a clear.
"""

from __future__ import annotations

import os
import time
from typing import Any

from rich.cells import cell_len
from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Static
from textual.widgets.data_table import ColumnKey

from dltop.derive import cache_growth
from dltop.fmt import human_bytes, printable, shorten_middle
from dltop.hints.caches import warnings_for
from dltop.model import CachesPart, Snapshot, Unavailable
from dltop.model.caches import FOLDERS_KEPT, KEEP_DEPTH, CacheFolder, CacheInfo, folder_of
from dltop.tui.messages import CancelRequested, ClearRequested, RescanRequested
from dltop.tui.panes.base import (
    RowTable,
    TablePane,
    crumb,
    fit_column,
    lay_out,
    may_change,
    progress_text,
    set_columns,
    set_content,
    set_row,
    why_frozen,
)
from dltop.view import View

COLUMNS = ("name", "size", "files", "newest", "growth", "warn")
HEADERS = ("Cache", "Size", "Files", "Newest", "Growth", "!")
ENTRY_COLUMNS = ("name", "size", "files", "newest", "atime", "kind")
ENTRY_HEADERS = ("Entry", "Size", "Files", "Modified", "Accessed", "Kind")
SORTS = ("size", "name", "age")  # s cycles them, as ncdu's s / n / M: biggest, by name, newest modified first
MORE = "\0more"  # the row key of the "N more" line (no path holds a NUL)


def _part(snap: Snapshot | None) -> CachesPart | None:
    return snap.caches if snap is not None and isinstance(snap.caches, CachesPart) else None


def _sorted(items: list[Any], sort: str, apparent: bool, ties: bool = True) -> list[Any]:
    """Caches or entries in the order chosen; ties by name (`ties`; else in the order given: the caches' own), so
    rows never swap between walks. A cache not there sorts after an empty one."""
    def size(x: Any) -> int:
        got = x.apparent_bytes if apparent else x.size_bytes
        return -1 if got is None else got

    def name(x: Any) -> str:
        return str(getattr(x, "label", "") or x.name)

    if sort == "name":
        return sorted(items, key=lambda x: (name(x).lower(), x.path))
    if sort == "age":
        return sorted(items, key=lambda x: (-(x.newest_mtime or float("-inf")), name(x).lower(), x.path))
    if not ties:
        return sorted(items, key=lambda x: -size(x))
    return sorted(items, key=lambda x: (-size(x), name(x).lower(), x.path))


class CachesPane(TablePane):
    """Every cache: size, files, newest file, growth since dltop started, warnings; Enter opens, c clears."""

    PANE_ID = "caches"
    TITLE = "Caches"
    TABLE = "#cc-table"
    HELP = ("Caches are placed as their tools place them (variable, then default; --pid: that process's). Sizes "
            "are du -B1's, a the apparent size; ≥ marks a walk cut short. ⏎ opens (the 50 biggest folders four deep "
            "are kept), a hub repo on its revisions; c clears after a dialog with the bytes (a revision as "
            "hf cache rm does: shared blobs stay).")
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
        Binding("s", "sort", "Sort", id="caches.sort"),
        Binding("a", "apparent", "Apparent", id="caches.apparent"),
        Binding("r", "rescan", "Scan", id="caches.rescan"),  # walk again now
        Binding("escape", "cancel", "Cancel", id="caches.cancel"),
    ]

    def __init__(self, clock: Any = time.time) -> None:
        super().__init__()
        self._clock = clock
        self._open: str | None = None  # the cache whose entries are shown; None: the list of caches
        self._folder: str | None = None  # the folder of it shown (its path; the cache's own at first)
        self._sort = "size"
        self._sorted_by_user = False  # the list of caches keeps the tools' order until s is pressed
        self._apparent = False
        self._order: tuple[object, ...] = ()  # what the rows were laid out for: a change rebuilds them in order
        self._mode: str | None = None  # the headers shown: "caches" or "entries"
        self._name_width = 0

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
        set_columns(table, *((COLUMNS, HEADERS) if mode == "caches" else (ENTRY_COLUMNS, ENTRY_HEADERS)))

    def _shown_folder(self, opened: CacheInfo) -> CacheFolder | None:
        """The folder of `opened` on screen: the one opened, or the cache's own when that one was not kept."""
        folder = folder_of(opened, self._folder or opened.path)
        if folder is None:
            self._folder = opened.path
            folder = folder_of(opened, opened.path)
        return folder

    def render_view(self, view: View) -> None:
        now = self.moment(view, self._clock)
        table = self.query_one("#cc-table", DataTable)
        part = view.snapshot.caches
        opened = self._cache(self._open)
        if self._open is not None and opened is None:
            self._open = self._folder = None
        if opened is None:
            self._columns(table, "caches")
            wanted, summary = self._cache_rows(view, part, now)
            keys, headers = COLUMNS, (HEADERS[0], self._size_head(), *HEADERS[2:])
        else:
            self._columns(table, "entries")
            wanted, summary = self._entry_rows(opened, now)
            keys, headers = ENTRY_COLUMNS, (ENTRY_HEADERS[0], self._size_head(), *ENTRY_HEADERS[2:])
        set_content(self.query_one("#cc-summary", Static), summary)
        self._name_width = fit_column(table, wanted, 0, headers, keys, shorten_middle, self._name_width)
        self._relabel(table, keys, headers)
        self._fill(table, wanted, keys)
        set_content(self.query_one("#cc-detail", Static), self._detail(opened, now))
        ev = view.action
        set_content(self.query_one("#cc-progress", Static), progress_text(ev if ev and ev.action == "clear" else None))
        self._offer((view.busy, self._open is not None, self._selected() is not None))

    def _size_head(self) -> str:
        return "Apparent" if self._apparent else "Size"

    def _cache_rows(self, view: View, part: Any, now: float) -> tuple[dict[str, tuple[str, ...]], Text]:
        """A row per cache, and the summary line above them."""
        from dltop.text.caches import cache_row

        growth = self._growth(view)
        caches = self._caches()
        # the tools' own order until s is pressed (it reads as the docs' table); then sorted like entries
        wanted = {c.name: cache_row(c, growth.get(c.name), len(warnings_for(c, view.snapshot.ts)), now,
                                    apparent=self._apparent)
                  for c in (_sorted(caches, self._sort, self._apparent, ties=False) if self._sorted_by_user
                            else caches)}
        return wanted, _summary(part, caches, self._apparent)

    def _entry_rows(self, opened: CacheInfo, now: float) -> tuple[dict[str, tuple[str, ...]], Text]:
        """A row per entry of the folder opened in a cache, and the breadcrumb above them."""
        from dltop.text.caches import entry_row

        folder = self._shown_folder(opened)
        entries = list(folder.entries) if folder is not None else []
        wanted = {e.path: entry_row(e, now, apparent=self._apparent)
                  for e in _sorted(entries, self._sort, self._apparent)}
        if folder is not None and folder.more:
            more_bytes = folder.more_apparent_bytes if self._apparent else folder.more_bytes
            wanted[MORE] = (f"… {folder.more:,} more", human_bytes(more_bytes), "", "", "", "not kept")
        # The breadcrumb: the cache, then the folder opened in it, cut to the summary's line by the one rule
        # (fmt.shorten), a line break or a BEL in a name shown as its escape.
        label = printable(opened.label)
        summary = Text.assemble(("Caches", "bold"), " › ", (label, "bold"))
        room = self.query_one("#cc-summary", Static).content_region.width - cell_len(f"Caches › {label}  ")
        summary.append(f"  {crumb(self._folder or opened.path, room)}")
        if not entries:
            summary.append("  (empty)", "dim")
        summary.append(f"  · by {self._sort}", "dim")
        return wanted, summary

    def _fill(self, table: DataTable, wanted: dict[str, tuple[str, ...]], keys: tuple[str, ...]) -> None:
        """The table's rows made `wanted`: updated in place while the folder, order and rows stay; else laid out
        again in order, the cursor found again by its key."""
        order = (self._open, self._folder, self._sort, self._apparent, tuple(wanted))
        if order != self._order:
            self._order = order
            lay_out(table, wanted, self._selected())
        else:
            for key, values in wanted.items():
                set_row(table, key, keys, values)
        self._rows = list(wanted)

    def _relabel(self, table: DataTable, keys: tuple[str, ...], headers: tuple[str, ...]) -> None:
        """The size column's header says which size it shows (disk usage or apparent)."""
        for key, label in zip(keys, headers, strict=True):
            column = table.columns.get(ColumnKey(key))
            if column is not None and str(column.label) != label:
                column.label = Text(label)
                table.refresh()

    def _detail(self, opened: CacheInfo | None, now: float) -> Text:
        """The selected cache's path, its warnings (the most severe first: the box has 5 lines at 80x24), the
        rule that placed it and the rest (or, opened, the same for the opened cache)."""
        c = opened or self._cache(self._selected())
        t = Text()
        if c is None:
            return t
        t.append(printable(c.path), "bold")
        if c.via_symlink:
            t.append(f" → {printable(c.via_symlink)} (a symlink, followed)")
        if c.exists and c.size_bytes is None:
            t.append(f"\nunavailable: {printable(c.unavailable.get('size_bytes', ''))}", "red")
        # judged at the Snapshot's time, as the hints are: a replay shows what live showed
        snap_ts = self.view.snapshot.ts if self.view is not None else now
        for w in warnings_for(c, snap_ts):
            t.append(f"\n! {printable(w)}", "yellow")
        t.append("\n" + _origin(c))
        return t

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
        """Open the selected cache, or the selected folder of an opened one."""
        key = self._selected()
        if self._open is None:
            c = self._cache(key)
            if c is None or not c.exists:
                return
            self._open, self._folder = c.name, c.path
        else:
            opened = self._cache(self._open)
            if opened is None or key is None or not self._opens(opened, key):
                return
            self._folder = key
        self._rerender()
        self.query_one("#cc-table", DataTable).move_cursor(row=0)

    def _opens(self, opened: CacheInfo, key: str) -> bool:
        """Whether the entry `key` of the folder shown is a folder that opens (one whose entries were not kept says so)."""
        folder = folder_of(opened, self._folder or opened.path)
        entry = next((e for e in folder.entries if e.path == key), None) if folder is not None else None
        if entry is None or not entry.is_dir:
            return False  # a file, or the "N more" row
        if folder_of(opened, key) is None:
            self.notify(f"{printable(key)}: its entries were not kept (the {FOLDERS_KEPT} biggest folders "
                        f"{KEEP_DEPTH} deep are)", timeout=3)
            return False
        return True

    def action_back(self) -> None:
        """Up one folder; from a cache's own folder, back to the list of caches."""
        if self._open is None:
            return
        opened = self._cache(self._open)
        left = self._folder
        if opened is None or left is None or left == opened.path:
            left, self._open, self._folder = self._open, None, None
        else:
            self._folder = os.path.dirname(left)
            while self._folder != opened.path and folder_of(opened, self._folder) is None:
                self._folder = os.path.dirname(self._folder)  # a hub revision's parent is its repo
                if len(self._folder) < len(opened.path):
                    self._folder = opened.path
        self._rerender()
        if left in self._rows:
            self.query_one("#cc-table", DataTable).move_cursor(row=self._rows.index(left))

    def action_sort(self) -> None:
        """Sort by size, then by name, then by age (newest modified first)."""
        if self._sorted_by_user or self._open is not None:
            self._sort = SORTS[(SORTS.index(self._sort) + 1) % len(SORTS)]
        self._sorted_by_user = True
        self.notify(f"sorted by {self._sort}", timeout=2)
        self._rerender()

    def action_apparent(self) -> None:
        """Sizes as st_size (apparent, du --apparent-size) or as blocks on disk (du), as ncdu's a."""
        self._apparent = not self._apparent
        self.notify("apparent sizes (st_size)" if self._apparent else "disk usage (blocks)", timeout=2)
        self._rerender()

    def action_rescan(self) -> None:
        """Walk the selected cache again now (in the list: every cache)."""
        name = self._open
        if name is None:
            c = self._cache(self._selected())
            name = c.name if c is not None else None
        self.post_message(RescanRequested("caches", name))
        self.notify(f"walking {name or 'every cache'} again…", timeout=2)

    # -- actions ----------------------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        view = self.view
        if action == "clear":
            return may_change(view)  # c says why it is greyed out
        return {"cancel": view is not None and view.busy,
                "back": self._open is not None,
                "rescan": None if view is None or view.replay else True,  # a recording has no system to walk
                }.get(action, True)

    def _target(self) -> str | None:
        key = self._selected()
        if key is None:
            return None
        if self._open is None:
            c = self._cache(key)
            return c.path if c is not None and c.exists else None
        return None if key == MORE else key

    def action_clear(self) -> None:
        """Clear the selected cache (what is in it) or entry, after a dialog stating the bytes."""
        path = self._target()
        if path is None:
            self.notify("no cache there to clear", severity="warning")
            return
        self.post_message(ClearRequested(path))

    def on_key(self, event: events.Key) -> None:
        view = self.view
        if view is None:
            return
        if event.key == "c":
            self._refuse(event, why_frozen(view))
        elif event.key == "r" and view.past:
            self._refuse(event, f"{view.past}; a scan walks the caches as they are now")

    def action_cancel(self) -> None:
        """Stop the clear in flight (it reports what it removed)."""
        self.post_message(CancelRequested())


def _summary(part: Any, caches: list[CacheInfo], apparent: bool) -> Text:
    """The line above the list of caches: how many are there and their bytes, and whose environment placed them."""
    summary = Text.assemble(("Caches", "bold"))
    if isinstance(part, Unavailable):
        summary.append(f"  unavailable: {printable(part.reason)}", "red")
    elif not isinstance(part, CachesPart):
        summary.append("  measuring…", "dim")
    else:
        present = [c for c in caches if c.exists]
        total = sum((c.apparent_bytes if apparent else c.size_bytes) or 0 for c in present)
        summary.append(f"  {len(present)} of {len(caches)} present, {human_bytes(total)} in all · ")
        if part.exited:
            summary.append(f"{printable(part.exited)}: its last environment", "yellow")
        else:
            summary.append(printable(part.environment))
    return summary


def _origin(c: CacheInfo) -> str:
    """The rule that placed a cache, its settings, its tool's own clear command and what its walk noted."""
    lines = [f"({printable(c.source)})", *(f"{printable(k)}={printable(v)}" for k, v in c.settings.items())]
    if c.clear_command:
        lines.append(f"its own clear command: {printable(c.clear_command)}")
    if c.noted:
        lines.append("noted: " + ", ".join(f"{n} {why.replace('_', ' ')}" for why, n in c.noted.items()))
    return "\n".join(lines)
