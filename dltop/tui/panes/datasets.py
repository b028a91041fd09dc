"""The Datasets pane: per dataset and per folder, how much is in the page cache; warm, evict, lock from here.

Numbers come from the Snapshot's `datasets` part (the background rescan). Actions run in a worker thread with
progress in the pane and Esc to cancel; after one, and for datasets added with `a`, the pane rescans that
dataset at once so the result shows without waiting for the next background scan.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.coordinate import Coordinate
from textual.widgets import DataTable, Input, Static

from dltop.fmt import human_bytes
from dltop.model.datasets import DatasetResidency, DatasetsPart, ResidencyNode
from dltop.text.datasets import pct_text, progress_line, row_values
from dltop.tui.panes.base import Pane, set_content, set_row
from dltop.tui.view import View

COLUMNS = ("path", "size", "resident", "pct", "dirty", "files", "age")
HEADERS = ("Path", "Size", "Resident", "%", "Dirty", "Files", "Age")
LOCAL_RESCAN_S = 10.0


class DatasetPane(Pane):
    """Datasets and their folders: size, resident bytes and %, dirty, files, scan age; w / e / l act on the row."""

    PANE_ID = "datasets"
    TITLE = "Datasets"
    can_focus = False
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
        Binding("w", "warm", "Warm", id="datasets.warm"),
        Binding("e", "evict", "Evict", id="datasets.evict"),
        Binding("l", "lock", "Lock/unlock", id="datasets.lock"),
        Binding("a", "add", "Add dataset", id="datasets.add"),
        Binding("escape", "cancel", "Cancel", id="datasets.cancel"),
    ]

    def __init__(self, clock: Any = time.time) -> None:
        super().__init__()
        self._clock = clock
        self._stack: list[str] = []  # paths of the nodes drilled into; [] is the list of datasets
        self._local: dict[str, DatasetResidency] = {}  # rescans done by this pane, newer than the Snapshot's
        self._added: list[str] = []
        self._locks: dict[str, Any] = {}  # dataset or folder path -> LockSet
        self._cancel: threading.Event | None = None
        self._busy: str | None = None
        self._rows: list[str] = []
        self._scanning = False

    def compose(self) -> ComposeResult:
        yield Static(id="ds-summary")
        yield DataTable(id="ds-table", cursor_type="row", zebra_stripes=False)
        yield Static(id="ds-progress")
        yield Static(id="ds-notes")
        yield Input(placeholder="dataset folder to watch (Enter adds, Esc cancels)", id="ds-add")

    def on_mount(self) -> None:
        table = self.query_one("#ds-table", DataTable)
        for key, label in zip(COLUMNS, HEADERS, strict=True):
            table.add_column(label, key=key)

    def on_unmount(self) -> None:
        if self._cancel is not None:
            self._cancel.set()
        for locks in self._locks.values():
            locks.release()
        self._locks.clear()

    # -- data -------------------------------------------------------------------------------------------------

    def datasets(self) -> list[DatasetResidency]:
        """The datasets to show: the Snapshot's, replaced by this pane's newer rescans, then ones added here."""
        part = self.view.snapshot.datasets if self.view is not None else None
        out: dict[str, DatasetResidency] = {}
        if isinstance(part, DatasetsPart):
            for ds in part.paths:
                out[ds.path] = ds
        for path, ds in self._local.items():
            if path not in out or ds.scanned_at > out[path].scanned_at:
                out[path] = ds
        return list(out.values())

    def _current(self) -> tuple[ResidencyNode | None, DatasetResidency | None]:
        """The node drilled into (None at the top) and the dataset it belongs to."""
        if not self._stack:
            return None, None
        for ds in self.datasets():
            if self._stack[0] == ds.path:
                node: ResidencyNode = ds
                for path in self._stack[1:]:
                    nxt = next((c for c in node.children if c.path == path), None)
                    if nxt is None:
                        return node, ds
                    node = nxt
                return node, ds
        return None, None

    def render_view(self, view: View) -> None:
        now = self._clock()
        table = self.query_one("#ds-table", DataTable)
        datasets = self.datasets()
        node, owner = self._current()
        if self._stack and node is None:
            self._stack.clear()
        wanted: dict[str, tuple[str, ...]] = {}
        if node is None:
            for ds in datasets:
                age = now - ds.scanned_at if ds.scanned_at else None
                label = ds.path + (" 🔒" if ds.path in self._locks else "")
                if ds.error:
                    # The reason goes to the notes line, where it has room; the row only says it failed.
                    wanted[ds.path] = (label, "-", "-", "-", "-", "-", "error")
                else:
                    wanted[ds.path] = row_values(ds, ds.page_size, label, age)
            title = Text.assemble(("Datasets", "bold"), f"  {len(datasets)} watched")
            # Pages against pages, as fincore counts them: a 17-byte file is one 4 KiB page, not "17 B".
            total = sum(d.pages * d.page_size for d in datasets)
            res = sum(d.resident_pages * d.page_size for d in datasets)
            if datasets:
                title.append(f"  {human_bytes(res)} of {human_bytes(total)} resident")
            else:
                title.append("  none yet: press a to add a folder, or start dltop with PATH arguments", "dim")
        else:
            assert owner is not None
            age = now - owner.scanned_at if owner.scanned_at else None
            ps = owner.page_size
            for child in node.children:
                name = os.path.basename(child.path) + "/"
                wanted[child.path] = row_values(child, ps, name + (" 🔒" if child.path in self._locks else ""), age)
            title = Text.assemble(("Datasets", "bold"), " › ", (node.path, "bold"),
                                  f"  {human_bytes(node.resident_pages * ps)} of {human_bytes(node.pages * ps)} "
                                  f"resident ({pct_text(node)}), {node.files} files")
            if not node.children:
                title.append("  (no folders below: files are counted in this total)", "dim")
        set_content(self.query_one("#ds-summary", Static), title)
        for stale in [k for k in table.rows if k.value not in wanted]:
            table.remove_row(stale)
        for key, values in wanted.items():
            set_row(table, key, COLUMNS, values)
        self._rows = list(wanted)
        notes = self._notes(owner or (datasets[0] if len(datasets) == 1 else None))
        for ds in datasets:
            if ds.error and ds is not owner:
                notes.append(f"\n{ds.path}: {ds.error}", "red")
        set_content(self.query_one("#ds-notes", Static), notes)
        self._maybe_rescan_added(now)

    def _notes(self, ds: DatasetResidency | None) -> Text:
        t = Text()
        if ds is None:
            return t
        if ds.unknown_pages:
            t.append(f"? {human_bytes(ds.unknown_pages * ds.page_size)} unknown: {ds.unknown_reason}\n", "yellow")
        bits = [f"{ds.method} on {ds.fs_type or '?'}", f"scanned in {ds.scan_duration_s:.2f}s"]
        if not ds.complete:
            why = ds.error or (ds.problems[0] if ds.problems else "cut short by its time budget or a cancel")
            bits.append(f"scan incomplete: {why}")
        if ds.skipped:
            bits.append("skipped " + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in ds.skipped.items()))
        t.append(" · ".join(bits))
        return t

    def _selected(self) -> str | None:
        table = self.query_one("#ds-table", DataTable)
        if not self._rows or table.row_count == 0:
            return None
        row = min(max(table.cursor_row, 0), table.row_count - 1)
        return str(table.coordinate_to_cell_key(Coordinate(row, 0)).row_key.value)

    def _node(self, path: str) -> tuple[ResidencyNode | None, DatasetResidency | None]:
        for ds in self.datasets():
            if path == ds.path:
                return ds, ds
            if path.startswith(ds.path.rstrip("/") + "/"):
                stack: list[ResidencyNode] = [ds]
                while stack:
                    n = stack.pop()
                    if n.path == path:
                        return n, ds
                    stack.extend(c for c in n.children if path == c.path or path.startswith(c.path + "/"))
        return None, None

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
        node, owner = self._node(path)
        if node is None or owner is None:
            return
        if not self._stack:
            self._stack = [owner.path]
        else:
            self._stack.append(path)
        self.query_one("#ds-table", DataTable).move_cursor(row=0)
        self._rerender()

    def action_back(self) -> None:
        """Back to the folder above (or the list of datasets)."""
        if self._stack:
            left = self._stack.pop()
            self._rerender()
            if left in self._rows:
                self.query_one("#ds-table", DataTable).move_cursor(row=self._rows.index(left))

    def _rerender(self) -> None:
        if self.view is not None:
            self.render_view(self.view)

    # -- actions ----------------------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("warm", "evict", "lock"):
            if self.view is None or self.view.read_only or self.view.replay:
                return None  # shown greyed out: nothing here may change the system
            return self._busy is None
        if action == "cancel":
            return self._busy is not None or self.query_one("#ds-add", Input).has_class("-shown")
        if action == "back":
            return bool(self._stack)
        if action == "add":
            return self.view is None or not self.view.replay
        return True

    def action_warm(self) -> None:
        """Warm the selected dataset or folder, after a confirmation stating the bytes it reads and the memory guard.

        The bytes come from a fresh measurement in a worker thread (Esc cancels it), not from the row: holes of
        sparse files are never read, and only a look at each file's data says how much a warm brings in.
        """
        target = self._target()
        if target is None:
            return
        node, _ds = target
        self._cancel = threading.Event()
        self._busy = f"warm {node.path}"
        set_content(self.query_one("#ds-progress", Static), Text(f"warm {node.path}: measuring… (Esc cancels)"))
        self.refresh_bindings()
        self._plan_warm(node.path, self._cancel)

    @work(thread=True, exclusive=True, group="dataset-action")
    def _plan_warm(self, path: str, cancel: threading.Event) -> None:
        from dltop.actions import pagecache as pc
        from dltop.errors import DltopError

        try:
            r = pc.plan("warm", [path], cancel=cancel)
        except DltopError as e:
            self.app.call_from_thread(self._finished, str(e), "error")
            return
        except OSError as e:
            self.app.call_from_thread(self._finished, f"warm failed: {e.strerror or e}", "error")
            return
        self.app.call_from_thread(self._confirm_warm, path, r, cancel.is_set())

    def _confirm_warm(self, path: str, r: Any, cancelled: bool) -> None:
        self._finished(f"warm {path}: cancelled" if cancelled else "", "information")
        if cancelled:
            return
        guard = r.guard
        need = r.total_bytes
        body = f"Read {human_bytes(need)} of {path} into the page cache.\nMemory guard: {guard.message}"
        if r.unknown_pages:
            body += "\nResidency of some files is hidden from this user: their data counts as not resident."
        fit = not guard.ok
        if fit:
            body += f"\nYes warms only the part that fits ({human_bytes(guard.fits_bytes)})."
        self._confirm("warm", path, f"Warm {human_bytes(need)}?", body, fit=fit)

    def action_evict(self) -> None:
        """Evict the selected dataset or folder from the page cache, after a confirmation."""
        target = self._target()
        if target is None:
            return
        node, ds = target
        size = human_bytes(node.resident_pages * ds.page_size)
        body = (f"Drop {size} of {node.path} from the page cache (dirty pages are written first).\n"
                "The next read of these files comes from disk.")
        self._confirm("evict", node.path, f"Evict {size}?", body)

    def action_lock(self) -> None:
        """Lock the selected dataset or folder in memory (mlock), or unlock it if locked."""
        from dltop.actions.pagecache import memlock_error, memory_guard

        target = self._target()
        if target is None:
            return
        node, ds = target
        if node.path in self._locks:
            locks = self._locks.pop(node.path)
            freed = locks.bytes
            locks.release()
            self.notify(f"unlocked {human_bytes(freed)} of {node.path}")
            self._rerender()
            return
        total = node.pages * ds.page_size
        guard = memory_guard(total)  # locked pages leave MemAvailable, resident ones too
        body = f"mlock {human_bytes(total)} of {node.path} until you press l again.\nMemory guard: {guard.message}"
        limit = memlock_error(total)
        if limit:
            self.notify(limit, severity="error", timeout=8)
            return
        self._confirm("lock", node.path, f"Lock {human_bytes(total)}?", body, force=not guard.ok)

    def _target(self) -> tuple[ResidencyNode, DatasetResidency] | None:
        path = self._selected()
        if path is None:
            self.notify("no dataset selected", severity="warning")
            return None
        node, ds = self._node(path)
        if node is None or ds is None:
            return None
        return node, ds

    def _confirm(self, action: str, path: str, title: str, body: str, fit: bool = False, force: bool = False) -> None:
        from dltop.tui.screens.confirm import ConfirmScreen

        def answered(yes: bool | None) -> None:
            if yes:
                self._start(action, path, fit=fit, force=force)

        self.app.push_screen(ConfirmScreen(title, body, yes_label=action.capitalize()), answered)

    def _start(self, action: str, path: str, fit: bool = False, force: bool = False) -> None:
        self._cancel = threading.Event()
        self._busy = f"{action} {path}"
        set_content(self.query_one("#ds-progress", Static), Text(f"{action} {path}: starting… (Esc cancels)"))
        self.refresh_bindings()
        self._run_action(action, path, fit, force, self._cancel)

    @work(thread=True, exclusive=True, group="dataset-action")
    def _run_action(self, action: str, path: str, fit: bool, force: bool, cancel: threading.Event) -> None:
        from dltop.actions import pagecache as pc
        from dltop.errors import DltopError

        def progress(p: pc.Progress) -> None:
            self.app.call_from_thread(self._show_progress, p)

        message, severity = "", "information"
        try:
            if action == "warm":
                r = pc.warm([path], force=force, fit=fit, progress=progress, cancel=cancel)
            elif action == "evict":
                r = pc.evict([path], progress=progress, cancel=cancel)
            else:
                r, locks = pc.lock([path], force=force, progress=progress, cancel=cancel)
                if r.cancelled:
                    locks.release()
                else:
                    self._locks[path] = locks
            verb = {"warm": "warmed", "evict": "evicted", "lock": "locked"}[action]
            message = f"{verb} {human_bytes(r.done_bytes)} of {path} in {r.elapsed_s:.1f}s"
            if r.cancelled:
                message += " (cancelled)"
            if r.stayed:
                message += "; stayed: " + ", ".join(f"{human_bytes(v * pc.kernel.PAGE_SIZE)} {k}" for k, v in r.stayed.items())
        except DltopError as e:
            message, severity = str(e), "error"
        except OSError as e:
            message, severity = f"{action} failed: {e.strerror or e}", "error"
        self._rescan(path)
        self.app.call_from_thread(self._finished, message, severity)

    def _show_progress(self, p: Any) -> None:
        set_content(self.query_one("#ds-progress", Static), Text(progress_line(p) + " · Esc cancels"))

    def _finished(self, message: str, severity: str) -> None:
        self._busy = None
        self._cancel = None
        set_content(self.query_one("#ds-progress", Static), Text(message, "bold" if severity != "error" else "red"))
        if severity == "error":  # success is on the progress line already; a toast would cover the notes
            self.notify(message, severity="error", timeout=8)
        self.refresh_bindings()
        self._rerender()

    def _rescan(self, path: str) -> None:
        """Rescan the dataset holding `path` now (in the calling worker thread) and keep the result."""
        from dltop.sources.datasets import SOURCE_MAX_DEPTH, WalkOptions, scan_paths

        _node, ds = self._node(path)
        root = ds.path if ds is not None else path
        part = scan_paths((root,), WalkOptions(max_depth=SOURCE_MAX_DEPTH))
        self._local[root] = part.paths[0]

    def action_cancel(self) -> None:
        """Stop the running action (or close the add box)."""
        box = self.query_one("#ds-add", Input)
        if box.has_class("-shown"):
            box.remove_class("-shown")
            return
        if self._cancel is not None:
            self._cancel.set()
            set_content(self.query_one("#ds-progress", Static), Text(f"{self._busy}: cancelling…"))

    # -- adding a dataset -------------------------------------------------------------------------------------

    def action_add(self) -> None:
        """Ask for a folder to watch."""
        box = self.query_one("#ds-add", Input)
        box.add_class("-shown")
        box.value = ""
        box.focus()

    @on(Input.Submitted, "#ds-add")
    def _add_submitted(self, event: Input.Submitted) -> None:
        box = event.input
        path = os.path.abspath(os.path.expanduser(event.value.strip()))
        box.remove_class("-shown")
        self.query_one("#ds-table", DataTable).focus()
        if not event.value.strip():
            return
        if not os.path.exists(path):
            self.notify(f"no such file or directory: {path}", severity="error")
            return
        if path not in self._added:
            self._added.append(path)
        set_content(self.query_one("#ds-progress", Static), Text(f"scanning {path}…"))
        self._scan_added(path)

    @work(thread=True, group="dataset-scan")
    def _scan_added(self, path: str) -> None:
        from dltop.sources.datasets import SOURCE_MAX_DEPTH, WalkOptions, scan_paths

        self._scanning = True
        try:
            part = scan_paths((path,), WalkOptions(max_depth=SOURCE_MAX_DEPTH), cpu_fraction=0.5)
            self._local[path] = part.paths[0]
        finally:
            self._scanning = False
        self.app.call_from_thread(self._scanned, path)

    def _scanned(self, path: str) -> None:
        ds = self._local.get(path)
        if ds is not None:
            set_content(self.query_one("#ds-progress", Static),
                        Text(f"added {path}: {human_bytes(ds.size_bytes)} in {ds.files} files", "dim"))
        self._rerender()

    def _maybe_rescan_added(self, now: float) -> None:
        """Datasets added here are not in the background scan: rescan them on the same cadence."""
        if self._scanning:
            return
        for path in self._added:
            ds = self._local.get(path)
            if ds is not None and now - ds.scanned_at >= LOCAL_RESCAN_S:
                self._scan_added(path)  # the old numbers stay, with their age, until it is done
                break

