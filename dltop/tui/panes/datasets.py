"""The Datasets pane: per dataset and per folder, how much is in the page cache; warm, evict, lock from here.

Numbers come from the Snapshot's `datasets` part (the Sampler's rescans, of datasets given at start and added
here alike). The pane only renders: w / e / l / a / x / Esc post a request to the app, which plans, confirms and
runs it through the action runner and hands back the action's progress and what is locked in the View.
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
from textual.widgets import DataTable, Input, Static

from dltop.fmt import human_bytes, printable, shorten_middle
from dltop.model.datasets import (
    DatasetResidency,
    DatasetsPart,
    DatasetUnavailable,
    FoundDataset,
    ResidencyNode,
)
from dltop.tui.messages import (
    CancelRequested,
    DatasetAddRequested,
    DatasetRemoveRequested,
    EvictRequested,
    LockRequested,
    WarmRequested,
)
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
    set_rows,
    why_frozen,
)
from dltop.view import View

# The key of a folder's "… N more files" row: NUL is in no path, so it is never taken for one.
MORE_KEY = "\0more:"
# The key of the row that heads the datasets found without a flag (read by training jobs, not watched).
FOUND_KEY = "\0found"
_NOT_LISTED = ("files not listed here (the top few by each sort are): `dltop residency --files --top N FOLDER` "
               "lists more; w / e / l act on the folder")
COLUMNS = ("path", "size", "resident", "pct", "dirty", "files", "age")
HEADERS = ("Path", "Data", "Resident", "%", "Dirty", "Files", "Age")


_FOUND_HELP = ("found: folders that training jobs read (their open files, the probe's data_dir), not watched; "
               "w / e / l act on one as on a watched one, a watches it, dltop --no-discover hides them")


def _shorten_label(label: str, width: int) -> str:
    lock = " 🔒" if label.endswith(" 🔒") else ""
    return shorten_middle(label.removesuffix(lock), width - cell_len(lock)) + lock


class DatasetPane(TablePane):
    """Datasets and their folders: size, resident bytes and %, dirty, files, scan age; w / e / l act on the row."""

    PANE_ID = "datasets"
    TITLE = "Datasets"
    TABLE = "#ds-table"
    HELP = ("Residency is counted as fincore counts it: whole pages, from one cachestat() per file (mincore on "
            "overlayfs and older kernels). Pages the kernel hides from this user are unknown (?), not resident. "
            "w / e / l measure first, then ask; Esc cancels. Found: folders training jobs read (their open "
            "files, the probe's data_dir), not watched; a on one watches it, --no-discover hides them.")
    DEFAULT_CSS = """
    #ds-summary { height: auto; max-height: 2; }
    #ds-table { height: 1fr; min-height: 4; }
    #ds-notes { height: auto; max-height: 4; color: $text-muted; }
    #ds-progress { height: auto; max-height: 2; }
    #ds-add { display: none; }
    #ds-add.-shown { display: block; }
    """
    BINDINGS = [
        Binding("enter", "drill", "Open", id="datasets.open"),
        Binding("backspace", "back", "Back", id="datasets.back"),
        Binding("s", "sort", "Sort", id="datasets.sort"),
        Binding("w", "warm", "Warm", id="datasets.warm"),
        Binding("e", "evict", "Evict", id="datasets.evict"),
        Binding("l", "lock", "Lock", id="datasets.lock"),
        Binding("l", "unlock", "Unlock", id="datasets.unlock"),  # on a locked row, instead of Lock
        Binding("a", "add", "Add", id="datasets.add"),
        Binding("x", "remove", "Unwatch", id="datasets.remove"),
        Binding("escape", "cancel", "Cancel", id="datasets.cancel"),
    ]

    def __init__(self, clock: Any = time.time) -> None:
        super().__init__()
        self._clock = clock
        self._stack: list[str] = []  # paths of the nodes drilled into; [] is the list of datasets
        self._path_width = 0  # the widest path label shown, for shrinking the column when it narrows
        self._sort = "size"  # the order of a folder's rows: a key of SORT_TITLES
        self._file_rows: set[str] = set()  # the rows shown that are files

    def compose(self) -> ComposeResult:
        # The tab's own modules are imported when it is first composed, not before the first frame of another.
        from dltop.tui.path_input import PathInput

        yield Static(id="ds-summary")
        yield RowTable(id="ds-table", cursor_type="row", zebra_stripes=False)
        yield Static(id="ds-progress")
        yield Static(id="ds-notes")
        yield PathInput(placeholder="dataset folder to watch (Tab completes, Enter adds, Esc cancels)", id="ds-add")

    def on_mount(self) -> None:
        set_columns(self.query_one("#ds-table", DataTable), COLUMNS, HEADERS)

    # -- data -------------------------------------------------------------------------------------------------

    def _lists(self) -> tuple[list[DatasetResidency | DatasetUnavailable], list[FoundDataset]]:
        """The datasets to show (the Snapshot's, less any no longer watched: its rescan may not be in yet), and the
        ones training jobs read that are not watched (found without a flag)."""
        part = self.view.snapshot.datasets if self.view is not None else None
        if self.view is None or not isinstance(part, DatasetsPart):
            return [], []
        watched = self.view.watched
        return [ds for ds in part.paths if not watched or ds.path in watched], [
            f for f in part.found if f.path not in watched]

    def _all(self) -> list[DatasetResidency | DatasetUnavailable]:
        """The watched datasets and the found ones that were scanned: what a row can open or act on."""
        datasets, found = self._lists()
        return [*datasets, *(f.scan for f in found if f.scan is not None)]

    def _found_of(self, path: str | None) -> FoundDataset | None:
        """The found dataset `path` is (or lies in)."""
        if path is None:
            return None
        _datasets, found = self._lists()
        return next((f for f in found if path == f.path or path.startswith(f.path.rstrip("/") + "/")), None)

    def _pending(self) -> list[str]:
        """Watched datasets whose first scan is not in yet."""
        if self.view is None:
            return []
        datasets, _found = self._lists()
        shown = {ds.path for ds in datasets}
        return [p for p in self.view.watched if p not in shown]

    def render_view(self, view: View) -> None:
        now = self.moment(view, self._clock)
        datasets, found = self._lists()
        node, owner = _drilled(self._all(), self._stack)
        self._follow_stack(node)
        if node is None:
            self._file_rows = set()
            wanted, title = self._top_rows(datasets, found, now, view.held)
        else:
            assert owner is not None
            wanted, title = self._drilled_rows(node, owner, now, view.held)
        set_content(self.query_one("#ds-summary", Static), title)
        self._show_rows(wanted)
        set_content(self.query_one("#ds-notes", Static), self._notes(datasets, found, owner, now))
        set_content(self.query_one("#ds-progress", Static), progress_text(view.action))
        # The footer's keys follow the runner and where the user is: refresh them when either changes.
        selected = self._selected()
        self._offer((view.busy, bool(self._stack), selected in view.watched, selected in view.held, selected))

    def _notes(self, datasets: list[DatasetResidency | DatasetUnavailable], all_found: list[FoundDataset],
               owner: DatasetResidency | None, now: float) -> Text:
        """The lines under the table: about the dataset drilled into (or the found one under the cursor, with who
        reads it, or the only one), then every dataset that could not be scanned."""
        found = self._found_of(self._stack[0] if self._stack else self._selected())
        notes = _notes(owner if owner is not None else _top_owner(datasets, found, bool(all_found)), now)
        if found is not None:
            from dltop.text.datasets import found_line

            notes.append(("\n" if notes else "") + found_line(found), "cyan")
        for ds in [*datasets, *(f.scan for f in all_found)]:
            if isinstance(ds, DatasetUnavailable):
                notes.append(f"\nunavailable: {printable(ds.unavailable)}", "red")
        return notes

    def _follow_stack(self, node: ResidencyNode | None) -> None:
        """The folders drilled into, cut to what is still there."""
        if self._stack and node is None:
            self._stack.clear()  # the dataset drilled into is gone (unwatched, deleted)
        elif node is not None and node.path != self._stack[-1]:
            # a folder drilled into is gone: stand on the deepest one still there, so Backspace goes up at once
            self._stack = self._stack[: self._stack.index(node.path) + 1]

    def _top_rows(self, datasets: list[DatasetResidency | DatasetUnavailable], found: list[FoundDataset], now: float,
                  held: Any) -> tuple[dict[str, tuple[str, ...]], Text]:
        """The top level: a row per dataset watched (scanning until its first scan is in), then the found ones under a
        row that heads them (another user's claim until the user watches one with a), and the title."""
        wanted = {ds.path: _top_row(ds, ds.path + (" 🔒" if ds.path in held else ""), now) for ds in datasets}
        pending = self._pending()
        wanted.update((path, _top_row(None, path, now)) for path in pending)
        if found:
            wanted[FOUND_KEY] = ("found: read by training jobs", "", "", "", "", "", "")
        wanted.update((f.path, _top_row(f.scan, f.path + (" 🔒" if f.path in held else ""), now)) for f in found)
        return wanted, _top_title(datasets, pending, len(found))

    def _drilled_rows(self, node: ResidencyNode, owner: DatasetResidency, now: float,
                      held: Any) -> tuple[dict[str, tuple[str, ...]], Text]:
        """A folder drilled into: its rows, and the title with the breadcrumb."""
        from dltop.text.datasets import SORT_TITLES, node_summary

        age = now - owner.scanned_at if owner.scanned_at else None
        wanted, self._file_rows = _folder_rows(node, owner, age, held, self._sort)
        # The breadcrumb is one line of the summary, the path in it cut to fit by the one rule (fmt.shorten):
        # a line break or a BEL in a folder's name is shown as its escape, never a second line or nothing.
        room = self.query_one("#ds-summary", Static).content_region.width - cell_len("Datasets › ")
        title = Text.assemble(("Datasets", "bold"), " › ", (crumb(node.path, room), "bold"),
                              "  " + node_summary(node, owner.page_size))
        if not node.children and not node.top_files:
            title.append("  (no folders below: files are counted in this total)", "dim")
        elif len(wanted) > 1:
            title.append(f"  · by {SORT_TITLES[self._sort]}, s sorts", "dim")
        return wanted, title

    def _show_rows(self, wanted: dict[str, tuple[str, ...]]) -> None:
        """The table updated in place to `wanted`, in its order."""
        table = self.query_one("#ds-table", DataTable)
        # The Path column gives way: long paths shortened in the middle, so every number column stays on an
        # 80-column screen (a 70-character path pushed Size, Resident and % off it).
        self._path_width = fit_column(table, wanted, 0, HEADERS, COLUMNS, _shorten_label, self._path_width)
        other_rows = set(wanted) != set(self._rows)
        set_rows(table, wanted, COLUMNS)
        self._rows = list(wanted)
        if other_rows:
            # New rows are drawn at the columns' old widths before DataTable measures them (on idle), and the lines
            # it drew stay cached: a file name opened into was cut without its "…" and the header stood apart from
            # its column until a new scan redrew the rows. Drop them once the widths are in.
            table.call_after_refresh(table.notify_style_update)
        keys = [r.key.value for r in table.ordered_rows]
        if keys != self._rows:
            # A new sort, or sizes that changed places (set_row updates rows in place, and a row added goes last):
            # laid out again, the cursor on the row it was on.
            row = table.cursor_row
            lay_out(table, wanted, keys[row] if 0 <= row < len(keys) else None)

    def action_sort(self) -> None:
        """Sort a folder's rows by data, by resident, or by % (coldest first)."""
        from dltop.text.datasets import SORT_TITLES

        keys = tuple(SORT_TITLES)
        self._sort = keys[(keys.index(self._sort) + 1) % len(keys)]
        self._rerender()
        self.notify(f"rows sorted by {SORT_TITLES[self._sort]}", timeout=2)

    # -- navigation -------------------------------------------------------------------------------------------

    @on(DataTable.RowSelected, "#ds-table")
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_drill()

    def action_drill(self) -> None:
        """Open the selected dataset or folder."""
        path = self._selected()
        if path is None:
            return
        if path in self._file_rows and self._stack:
            self.notify("a file: w / e / l act on it; Backspace goes up", timeout=3)
            return
        node, owner = _find(self._all(), path)
        if node is None or owner is None:
            self._say_what_row(path)
            return
        self._stack = [*self._stack, path] if self._stack else [owner.path]
        self.query_one("#ds-table", DataTable).move_cursor(row=0)
        self._rerender()

    def _say_what_row(self, path: str) -> None:
        """Enter on a row that opens nothing: what the row is."""
        about = _about_row(path)
        if about is None and (path in self._pending() or self._found_of(path) is not None):
            about = f"{printable(path)}: its first scan is not in yet; Enter opens it once it is", 4
        if about is not None:
            self.notify(about[0], timeout=about[1])

    def action_back(self) -> None:
        """Back to the folder above (or the list of datasets)."""
        if self._stack:
            left = self._stack.pop()
            self._rerender()
            if left in self._rows:
                self.query_one("#ds-table", DataTable).move_cursor(row=self._rows.index(left))

    # -- actions ----------------------------------------------------------------------------------------------

    @on(DataTable.RowHighlighted, "#ds-table")
    def _row_highlighted(self, _event: DataTable.RowHighlighted) -> None:
        if self.view is not None and self._bindings_shown[3:] != (self._selected() in self.view.held,
                                                                   self._selected()):
            self._bindings_shown = ()
            self._rerender()  # the footer's l says Lock or Unlock for the row now under the cursor

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        view = self.view
        if action in ("warm", "evict", "lock", "unlock"):
            return self._may_act(action)
        if action == "remove":  # what is watched changes live only, from the list of datasets
            return view is not None and not view.replay and not self._stack and self._selected() in view.watched
        return {"cancel": (view is not None and view.busy) or self.box_shown("#ds-add"),
                "back": bool(self._stack),
                "add": view is None or not view.replay}.get(action, True)

    def _may_act(self, action: str) -> bool | None:
        """w / e / l, greyed out where nothing may change the system; l reads Unlock on a locked row, Lock elsewhere."""
        if action in ("lock", "unlock"):
            locked = self.view is not None and self._selected() in self.view.held
            if locked != (action == "unlock"):
                return False
        return may_change(self.view)

    def action_warm(self) -> None:
        """Warm the selected dataset or folder, after a confirmation stating the bytes it reads and the memory guard.

        The app measures first (Esc cancels): holes of sparse files are never read, and only a look at each
        file's data says how much a warm brings in."""
        if (path := self._target()) is not None:
            self.post_message(WarmRequested(path))

    def action_evict(self) -> None:
        """Evict the selected dataset or folder from the page cache, after a confirmation."""
        if (path := self._target()) is not None:
            self.post_message(EvictRequested(path))

    def action_lock(self) -> None:
        """Lock the selected dataset or folder in memory (mlock), or unlock it if locked."""
        if (path := self._target()) is not None:
            self.post_message(LockRequested(path))

    def action_unlock(self) -> None:
        """Unlock the selected dataset or folder (what l does on a locked row)."""
        self.action_lock()

    def _target(self) -> str | None:
        path = self._selected()
        if path is not None and (about := _about_row(path)) is not None:
            self.notify(about[0], severity="warning", timeout=about[1])
            return None
        if path is None or _find(self._all(), path)[0] is None:
            gone = next((d for d in self._all() if d.path == path and isinstance(d, DatasetUnavailable)), None)
            self.notify(f"unavailable: {printable(gone.unavailable)}" if gone else "no dataset selected", severity="warning")
            return None
        return path

    def on_key(self, event: events.Key) -> None:
        # w / e / l are greyed out in --read-only, in the past and while an action runs; a / x act live only:
        # pressing one says why instead of nothing.
        view = self.view
        if view is None:
            return
        if event.key in ("w", "e", "l"):
            self._refuse(event, why_frozen(view))
        elif event.key in ("a", "x") and view.past and not self.box_shown("#ds-add"):
            self._refuse(event, f"{view.past}; the datasets watched change live only")

    def action_cancel(self) -> None:
        """Stop the running action (or close the add box)."""
        box = self.query_one("#ds-add", Input)
        if box.has_class("-shown"):
            box.remove_class("-shown")
            self.query_one("#ds-table", DataTable).focus()
            return
        self.post_message(CancelRequested())
        if self.view is not None and self.view.action is not None:
            set_content(self.query_one("#ds-progress", Static),
                        Text(f"{self.view.action.action} {printable(self.view.action.target)}: cancelling…"))

    # -- adding a dataset -------------------------------------------------------------------------------------

    def action_add(self) -> None:
        """Ask for a folder to watch (on a found dataset's row, its folder is typed in already)."""
        box = self.query_one("#ds-add", Input)
        box.add_class("-shown")
        found = None if self._stack else self._found_of(self._selected())
        # typed in only where it shows as it is (a name with a control character is typed by the user, escaped)
        box.value = found.path if found is not None and printable(found.path) == found.path else ""
        box.cursor_position = len(box.value)
        box.focus()

    @on(Input.Submitted, "#ds-add")
    def _add_submitted(self, event: Input.Submitted) -> None:
        event.input.remove_class("-shown")
        self.query_one("#ds-table", DataTable).focus()
        if event.value.strip():
            self.post_message(DatasetAddRequested(event.value.strip()))

    def action_remove(self) -> None:
        """Stop watching the selected dataset (its files are left alone)."""
        path = self._selected()
        if path is not None:
            self.post_message(DatasetRemoveRequested(path))


def _about_row(path: str) -> tuple[str, int] | None:
    """What a row that is no dataset (files not listed, the found ones' head) says of itself, for how many seconds."""
    if path.startswith(MORE_KEY):
        return _NOT_LISTED, 5
    if path == FOUND_KEY:
        return _FOUND_HELP, 6
    return None


def _drilled(scanned: list[DatasetResidency | DatasetUnavailable],
             stack: list[str]) -> tuple[ResidencyNode | None, DatasetResidency | None]:
    """The node `stack` leads to (the deepest one still there; None at the top) and the dataset it belongs to."""
    if not stack:
        return None, None
    ds = next((d for d in scanned if d.path == stack[0] and isinstance(d, DatasetResidency)), None)
    if ds is None:
        return None, None
    node: ResidencyNode = ds
    for path in stack[1:]:
        nxt = next((c for c in node.children if c.path == path), None)
        if nxt is None:
            break
        node = nxt
    return node, ds


def _find(scanned: list[DatasetResidency | DatasetUnavailable],
          path: str) -> tuple[ResidencyNode | None, DatasetResidency | None]:
    """The dataset, folder or listed file at `path` (a file row: w / e / l act on the file), and its dataset."""
    for ds in scanned:
        if isinstance(ds, DatasetResidency) and (path == ds.path or path.startswith(ds.path.rstrip("/") + "/")):
            node = _below(ds, path)
            if node is not None:
                return node, ds
    return None, None


def _below(ds: DatasetResidency, path: str) -> ResidencyNode | None:
    """The folder or listed file at `path` in the tree of `ds`."""
    stack: list[ResidencyNode] = [ds]
    while stack:
        n = stack.pop()
        if n.path == path:
            return n
        for f in n.top_files:
            if f.path == path:
                return f
        stack.extend(c for c in n.children if path == c.path or path.startswith(c.path + "/"))
    return None


def _top_owner(datasets: list[DatasetResidency | DatasetUnavailable], found: FoundDataset | None,
               any_found: bool) -> DatasetResidency | None:
    """At the top level, the dataset the notes are about: the found one under the cursor, else the only one
    watched (when none is found)."""
    if found is not None:
        ds = found.scan
    elif len(datasets) == 1 and not any_found:
        ds = datasets[0]
    else:
        return None
    return ds if isinstance(ds, DatasetResidency) else None


def _folder_rows(node: ResidencyNode, owner: DatasetResidency, age: float | None, held: Any,
                 sort: str) -> tuple[dict[str, tuple[str, ...]], set[str]]:
    """The rows of a folder drilled into, and which of them are files: its folders and its files together in the
    `sort`'s order (the files the scan kept: the top `files_top` by each key), then one row for the files not
    listed."""
    from dltop.text.datasets import file_label, listed_files, more_label, row_values, sort_rank

    ps, est, part = owner.page_size, owner.estimated, not owner.complete
    files, rest = listed_files(node, sort, owner.files_top)
    rows: dict[str, tuple[str, ...]] = {}
    file_ids = {id(f) for f in files}
    for entry in sorted((*node.children, *files), key=sort_rank(sort)):
        lock = " 🔒" if entry.path in held else ""
        if id(entry) in file_ids:
            values = row_values(entry, ps, file_label(node.path, entry.path) + lock, age, est)
            rows[entry.path] = (*values[:5], "", values[6])  # a file: no count of files
        else:
            # A folder's counts are its dataset's: an estimate (~) where the dataset's are, partial (≥) where
            # its scan was cut short.
            rows[entry.path] = row_values(entry, ps, os.path.basename(entry.path) + "/" + lock, age, est, part)
    if rest is not None and (owner.files_top > 0 or node.children):
        # A leaf folder of a scan that kept no files keeps its "counted in this total" instead.
        rows[MORE_KEY + node.path] = row_values(rest, ps, more_label(rest), None, est, part)
    return rows, {f.path for f in files}


def _top_row(ds: DatasetResidency | DatasetUnavailable | None, label: str, now: float) -> tuple[str, ...]:
    """A dataset's row at the top level, `label` its first cell: its numbers, n/a where it could not be scanned (the
    reason goes to the notes line, where it has room; never zeros), or "scanning" until its first scan is in."""
    from dltop.text.datasets import row_values, unavailable_row_values

    if ds is None:
        return (label, "-", "-", "-", "-", "-", "scanning")
    age = now - ds.scanned_at if ds.scanned_at else None
    if isinstance(ds, DatasetUnavailable):
        return unavailable_row_values(label, age)
    return row_values(ds, ds.page_size, label, age)


def _top_title(datasets: list[DatasetResidency | DatasetUnavailable], pending: list[str], found: int = 0) -> Text:
    """The top level's summary line: how many are watched, unavailable and found, the watched ones' totals (or why
    there are none)."""
    from dltop.text.datasets import datasets_summary

    scanned = [d for d in datasets if isinstance(d, DatasetResidency)]
    title = Text.assemble(("Datasets", "bold"), f"  {len(datasets) + len(pending)} watched")
    if len(scanned) < len(datasets):
        title.append(f", {len(datasets) - len(scanned)} unavailable", "red")
    if found:
        title.append(f", {found} found", "cyan")
    if scanned:
        title.append("  " + datasets_summary(scanned))
    elif pending:
        title.append("  first scan running…", "dim")
    elif found:
        title.append("  a on a found row watches it", "dim")
    else:
        title.append("  none yet: press a to add a folder, or start dltop with PATH arguments", "dim")
    return title


def _notes(ds: DatasetResidency | None, now: float) -> Text:
    """The lines under the table about one dataset: unknown pages, an estimate, how it was counted and skipped."""
    from dltop.text.datasets import estimate_note, holes_note, skipped_text

    t = Text()
    if ds is None:
        return t
    if ds.resident_pages > ds.data_resident_pages:  # the page cache it holds is not its data's: say both
        t.append(f"{holes_note(ds, ds.page_size)}\n", "dim")
    if ds.data_unknown_pages:
        t.append(f"? {human_bytes(ds.data_unknown_pages * ds.page_size)} unknown: {printable(ds.unknown_reason or '')}\n", "yellow")
    if (est := estimate_note(ds, ds.page_size, now)) is not None:
        t.append(est + "\n", "yellow")
    bits = [f"{ds.method} on {ds.fs_type or '?'}", f"scanned in {ds.scan_duration_s:.2f}s"]
    if not ds.complete:
        why = ds.problems[0] if ds.problems else "cut short by its time budget or a cancel"
        bits.append(f"scan incomplete: {printable(why)}")
    if ds.skipped:
        bits.append("skipped " + skipped_text(ds.skipped))
    t.append(" · ".join(bits))
    return t
