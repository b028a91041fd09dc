"""The contract every pane keeps: a widget with a title and a `show(view)` that updates it in place."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import ClassVar

from rich.cells import cell_len
from rich.text import Span, Text
from textual import events
from textual.app import SystemCommand
from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content
from textual.content import Span as ContentSpan
from textual.coordinate import Coordinate
from textual.geometry import Region
from textual.strip import Strip
from textual.visual import Visual, VisualType, visualize
from textual.widgets import DataTable, Label, Static

from dltop.fmt import printable, printable_lines, shorten
from dltop.model.actions import ActionEvent
from dltop.view import View


class Pane(Vertical):
    """One cache layer's tab. Subclasses set PANE_ID and TITLE, compose their widgets once, and update them in
    `show()` (no recompose per tick). Key bindings of a pane are shown in the footer while it has focus; actions
    that change the system must check `self.view.read_only` / `self.view.replay` in `check_action` and confirm
    through `dltop.tui.screens.confirm.ConfirmScreen`."""

    PANE_ID: ClassVar[str] = ""
    TITLE: ClassVar[str] = ""
    HELP: ClassVar[str] = ""  # where this pane's numbers come from, for the help screen
    can_focus = False

    def __init__(self) -> None:
        super().__init__(id=f"pane-{self.PANE_ID}", classes="pane")
        self.view: View | None = None
        self._bindings_shown: tuple[object, ...] = ()

    def show(self, view: View) -> None:
        """Remember the view and render it; the app calls this on every tick for the visible pane, and once
        with the latest view when a pane becomes visible."""
        self.view = view
        self.render_view(view)

    def on_resize(self) -> None:
        # What a pane draws fits its size (sparklines, fitted columns): a pane shown for the first time, or a
        # terminal resized, is drawn again at its new size rather than at the old one until the next tick.
        self._rerender()

    @staticmethod
    def moment(view: View, clock: Callable[[], float]) -> float:
        """"Now" for the ages a pane shows: the clock live, the moment on screen in the past (paused or a
        replay), so a scan 2 s before that moment is 2 s old there, not however long ago it was recorded."""
        return view.snapshot.ts if view.replay else clock()

    def render_view(self, view: View) -> None:  # pragma: no cover - every pane overrides it
        """Update the widgets from `view`."""
        raise NotImplementedError

    def _rerender(self) -> None:
        """Draw the view on screen again (after a key changed what the pane shows of it)."""
        if self.view is not None:
            self.render_view(self.view)

    def _offer(self, shown: tuple[object, ...]) -> None:
        """Refresh the footer's keys when what decides them (`shown`) changed."""
        if shown != self._bindings_shown:
            self._bindings_shown = shown
            self.refresh_bindings()

    def box_shown(self, selector: str) -> bool:
        """Whether the input box `selector` is open. A pane is composed when first shown (the app's
        _compose_pane): one never shown has no box open, and its check_action (the palette's gate) asks this
        rather than its widgets."""
        return self.is_mounted and self.query_one(selector).has_class("-shown")

    def focus_default(self) -> None:
        """Give the keyboard to this pane's first focusable widget, so its keys work and show in the footer."""
        for widget in self.query("*"):
            if widget.focusable:
                widget.focus()
                return

    def palette_commands(self) -> Iterable[SystemCommand]:
        """Command-palette entries for this pane's key bindings that can run now: the same `check_action`
        gate as the keys, so `--read-only` or a replay cannot be bypassed from the palette."""
        for binding in self.BINDINGS:
            if not isinstance(binding, Binding) or not binding.description or "(" in binding.action:
                continue
            if self.check_action(binding.action, ()) is not True:
                continue
            method = getattr(self, f"action_{binding.action}", None)
            if method is not None:
                key = self.app.get_key_display(binding)
                yield SystemCommand(f"{self.TITLE}: {binding.description}", f"the {key} key", method)


def may_change(view: View | None) -> bool | None:
    """A key that changes the system is greyed out (None; pressing it says `why_frozen`) in --read-only, the past or busy."""
    return None if view is None or view.read_only or view.replay or view.busy else True


def why_frozen(view: View) -> str | None:
    """Why a key that changes the system does nothing now (None: it acts); one action runs at a time."""
    if view.frozen:
        return f"{view.frozen}; nothing here may change the system"
    if not view.busy:
        return None
    what = f"{view.action.action} {printable(view.action.target)}" if view.action is not None else "an action"
    return f"busy: {what} is running (Esc on its tab cancels it)"


def progress_text(ev: ActionEvent | None) -> Text:
    """The line under a pane's table: the action in flight, or how the last one ended."""
    from dltop.text.datasets import progress_line

    if ev is None:
        return Text()
    if ev.phase == "progress":
        return Text(progress_line(ev) + " · Esc cancels")
    if ev.phase == "started":
        return Text(f"{ev.action} {printable(ev.target)}: {'measuring…' if ev.step == 'plan' else 'starting…'} (Esc cancels)")
    if ev.outcome in ("error", "refused"):
        return Text(printable_lines(ev.message), "red")
    if ev.step == "plan":
        return Text(f"{ev.action} {printable(ev.target)}: cancelled" if ev.outcome == "cancelled" else "")
    return Text(printable_lines(ev.message), "bold")


class TablePane(Pane):
    """A pane over one DataTable of keyed rows, opened and gone back up in as a tree: the row under the cursor, and
    keys that say why they do nothing."""

    TABLE: ClassVar[str] = ""  # the table's selector

    def __init__(self) -> None:
        super().__init__()
        self._rows: list[str] = []  # the keys of the rows shown, in order

    def _selected(self) -> str | None:
        """The key of the row under the cursor."""
        if not self._rows:  # never drawn (a pane not shown yet has no table)
            return None
        table = self.query_one(self.TABLE, DataTable)
        if table.row_count == 0:
            return None
        row = min(max(table.cursor_row, 0), table.row_count - 1)
        return str(table.coordinate_to_cell_key(Coordinate(row, 0)).row_key.value)

    def _refuse(self, event: events.Key, why: str | None) -> None:
        """The key pressed does nothing now (`why` is not None): say why instead of nothing."""
        if why is not None:
            event.stop()
            self.notify(f"{event.key}: {why}", severity="warning", timeout=3)


def lay_out(table: DataTable, wanted: dict[str, tuple[str, ...]], at: str | None) -> None:
    """The table's rows laid out again as `wanted`, in its order, the cursor on the row keyed `at` if it is there."""
    table.clear()
    for key, values in wanted.items():
        table.add_row(*map(plain, values), key=key)
    if at in wanted:
        table.move_cursor(row=list(wanted).index(at))


class RowTable(DataTable):
    """A DataTable of rows where Home and End move the cursor to the first and last row, as in top and htop
    (DataTable's own Home / End only scroll sideways when the cursor is a row). Its Enter opens the row (the
    pane's RowSelected does): labelled so, as the focused table's Enter hides the pane's own label for it."""

    BINDINGS = [Binding("enter", "select_cursor", "Open", key_display="⏎")]

    def action_scroll_home(self) -> None:
        if self.cursor_type == "row":
            self.move_cursor(row=0)
        else:
            super().action_scroll_home()

    def action_scroll_end(self) -> None:
        if self.cursor_type == "row":
            self.move_cursor(row=max(0, self.row_count - 1))
        else:
            super().action_scroll_end()


# Redrawing costs far more than comparing: a monitor that repaints unchanged widgets every second burns CPU
# next to the job it watches. These helpers touch a widget only when what it shows has changed.


def _key(content: Text | Content | str) -> object:
    if isinstance(content, Text | Content):
        return (content.plain, tuple(content.spans))
    return content


class Lines(Static):
    """A Static whose lines are rendered one by one and kept: an update repaints only the lines whose text or
    style changed (a Static renders all its lines again when one changes, and Textual's cost is per line
    rendered). Shows exactly what a Static shows for text whose lines do not wrap; where a line is wider than
    the widget, or text is selected with the mouse, it is drawn as a Static draws it."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._line_keys: list[object] = []
        self._line_visuals: list[Content] = []
        self._strips: dict[int, Strip] = {}
        self._strips_width = -1
        self._only: list[int] | None = None  # set while `update` asks for a repaint of these lines only

    def update(self, content: VisualType = "", *, layout: bool = True) -> None:
        visual = visualize(self, content, markup=False)
        lines = self._fitting_lines(visual)
        if lines is None:
            self._line_keys, self._line_visuals = [], []
        else:
            keys: list[object] = [(line.plain, tuple(line.spans)) for line in lines]
            if not layout and len(keys) == len(self._line_keys) and self._strips_width == self.content_region.width:
                self._only = [y for y, (a, b) in enumerate(zip(keys, self._line_keys, strict=True)) if a != b]
            self._line_keys, self._line_visuals = keys, lines
        try:
            super().update(visual, layout=layout)  # made once: Static's visualize hands a Content back as it is
        finally:
            self._only = None

    def _fitting_lines(self, visual: Visual) -> list[Content] | None:
        """The lines of `visual`, where each fits the widget's width (None: it is drawn as a Static draws it)."""
        width = self.content_region.width
        if not isinstance(visual, Content) or not width:
            return None
        lines = visual.split("\n", allow_blank=True)
        return lines if all(line.cell_length <= width for line in lines) else None

    def refresh(self, *regions: Region, repaint: bool = True, layout: bool = False,
                recompose: bool = False) -> Lines:
        if self._only is not None and not regions and not layout and not recompose:
            width = self.content_region.width
            for y in self._only:
                self._strips.pop(y, None)
            if not self._only:
                return self
            regions = tuple(Region(0, y, width, 1) for y in self._only)
        elif not regions:
            self._strips.clear()
        super().refresh(*regions, repaint=repaint, layout=layout, recompose=recompose)
        return self

    def render_line(self, y: int) -> Strip:
        width = self.content_region.width
        if not self._line_visuals or self.text_selection is not None or self.BLANK:
            self._strips.clear()
            self._strips_width = -1
            return super().render_line(y)
        if width != self._strips_width:
            self._strips.clear()
            self._strips_width = width
        self._dirty_regions.clear()  # Static's own cache of all lines is not used here
        strip = self._strips.get(y)
        if strip is None:
            if y < len(self._line_visuals):
                # Rendered as line y of a text (y blank lines before it): its cells carry their offset (x, y),
                # which mouse selection reads, as in a Static's render.
                line = Content("\n" * y) + self._line_visuals[y]
                strips = Visual.to_strips(self, line, width, None, self.visual_style)
                strip = strips[y] if len(strips) > y else Strip.blank(width, self.visual_style.rich_style)
            else:
                strip = Strip.blank(width, self.visual_style.rich_style)
            self._strips[y] = strip
        return strip


def set_content(widget: Static | Label, content: Text | Content | str) -> None:
    """`widget.update(content)` unless it already shows exactly that. An update that cannot change the widget's
    size skips the layout pass (a reflow of the whole screen), which is most of the cost of an update."""
    key = _key(content)
    if getattr(widget, "_dltop_shown", None) != key:
        widget._dltop_shown = key  # type: ignore[union-attr]
        safe = safe_content(content)
        widget.update(safe, layout=_resizes(widget, safe.plain))


def _resizes(widget: Static | Label, text: str) -> bool:
    """Whether showing `text` can change `widget`'s size: not when its height does not depend on what it shows
    (cells, fr, % in CSS); with `height: auto`, not when the text has as many lines as the last one at the same
    width, none of them long enough to wrap. A width that follows the content (`width: auto`) always can."""
    styles = widget.styles
    if styles.width is not None and styles.width.is_auto:
        return True
    if styles.height is not None and not styles.height.is_auto:
        return False
    width = widget.content_region.width
    lines = text.split("\n")
    # None: it wraps (or is not laid out yet), and its height is Textual's to measure.
    shape = None if not width or any(cell_len(line) > width for line in lines) else (width, len(lines))
    before = getattr(widget, "_dltop_shape", None)
    widget._dltop_shape = shape  # type: ignore[union-attr]
    return shape is None or shape != before


def crumb(path: str, room: int) -> str:
    """A path from outside in a pane's breadcrumb or title line, `room` cells left for it: escaped and cut in the
    middle by the one rule (`fmt.shorten`), whole while the widget is not laid out yet (room <= 0 at first)."""
    return shorten(path, max(room, 16)) if room > 0 else printable(path)


def plain(text: str) -> Text:
    """`text` as it is, made safe for the terminal: a str handed to a Static, a DataTable cell or a dialog is read
    as Rich markup, so a path or a command line with brackets would show wrong ("[red]x" as a red x) or crash the
    TUI ("/data/a[/b]": a closing tag that matches nothing); and a control character in it (another user's argv:
    "\\e]0;pwned\\a") would reach the terminal. Line breaks stay; every other control is shown escaped."""
    return Text(printable_lines(text))


def _remap(plain_text: str, one_line: bool) -> tuple[str, list[int]] | None:
    """The escaped text and, for each offset of `plain_text`, its offset in it; None when nothing needs escaping."""
    safe = printable(plain_text) if one_line else printable_lines(plain_text)
    if safe == plain_text:
        return None
    offsets, at = [], 0
    for ch in plain_text:
        offsets.append(at)
        at += len(ch if (ch == "\n" and not one_line) else printable(ch))
    offsets.append(at)
    return safe, offsets


def safe_content(content: Text | Content | str, one_line: bool = False) -> Text | Content:
    """The one step every text a widget shows passes through (DESIGN.md, "The trust boundary"): a str becomes
    plain Text, and in Text or Content every control character, DEL, C1 control, bidi override and undecodable
    byte is shown as an escape ('\\x1b', '\\u202e'), its style kept. Line breaks stay unless `one_line`."""
    if isinstance(content, str):
        return Text(printable(content) if one_line else printable_lines(content))
    mapped = _remap(content.plain, one_line)
    if mapped is None:
        return content
    safe, m = mapped
    if isinstance(content, Text):
        spans = [Span(m[sp.start], m[sp.end], sp.style) for sp in content.spans]
        return Text(safe, style=content.style, justify=content.justify, overflow=content.overflow,
                    no_wrap=content.no_wrap, end=content.end, spans=spans)
    return Content(safe, spans=[ContentSpan(m[sp.start], m[sp.end], sp.style) for sp in content.spans])


def set_row(table: DataTable, key: str, columns: tuple[str, ...], values: tuple[str, ...]) -> None:
    """Add the row or update only the cells whose text changed (the cursor stays where the user left it)."""
    if key not in table.rows:  # a RowKey hashes and compares as its str: no set of every key a row
        table.add_row(*map(plain, values), key=key)
        return
    for col, value in zip(columns, values, strict=True):
        if str(table.get_cell(key, col)) != value:
            # update_width: a column sized for "10%" must grow when "100%" arrives, not cut it to "10".
            table.update_cell(key, col, plain(value), update_width=True)


def set_rows(table: DataTable, wanted: dict[str, tuple[str, ...]], columns: tuple[str, ...]) -> None:
    """The table's rows made `wanted`: the others removed, the rest updated in place (`set_row`) or added last."""
    for stale in [k for k in table.rows if k.value not in wanted]:
        table.remove_row(stale)
    for key, values in wanted.items():
        set_row(table, key, columns, values)


def fit_column(table: DataTable, wanted: dict[str, tuple[str, ...]], at: int, headers: tuple[str, ...],
               keys: tuple[str, ...], shorten: Callable[[str, int], str], shown: int, width: int = 0) -> int:
    """Column `at` gives way so every other column stays on screen: its cells in `wanted` longer than the room left
    are shortened with `shorten(text, width)`. DataTable columns only grow, so when the widest cell is narrower
    than `shown` (what the last call returned) the columns are rebuilt. Returns the widest cell now. `width`: the
    table's width where it is known before the layout (its first draw), else the table's own."""
    width = table.size.width or width
    if not width or not wanted:
        return shown  # not laid out yet: the next tick fits it
    for key, values in wanted.items():  # measured as shown: escaped (a cell is one line of text from outside)
        wanted[key] = tuple(map(printable, values))
    room = _room(wanted, at, headers, width)
    for key, values in wanted.items():
        if cell_len(values[at]) > room:
            wanted[key] = (*values[:at], shorten(values[at], room), *values[at + 1:])
    widest = max(cell_len(v[at]) for v in wanted.values())
    if widest < shown and table.columns:
        row = table.cursor_row
        set_columns(table, keys, headers)
        table.call_after_refresh(table.move_cursor, row=row)
        # The rows come back in the same tick, drawn at the bare headers' widths before DataTable measures them
        # (on idle), and that measuring does not drop the lines it cached: "child/" showed as "chil", "0%" as
        # "0". Drop them once the widths are in.
        table.call_after_refresh(table.notify_style_update)
    return widest


def _room(wanted: dict[str, tuple[str, ...]], at: int, headers: tuple[str, ...], width: int) -> int:
    """The cells column `at` may take in a table `width` wide: what the others' widest cells leave, less padding."""
    others = sum(2 + max(cell_len(h), *(cell_len(v[i]) for v in wanted.values()))
                 for i, h in enumerate(headers) if i != at)
    return max(8, width - others - 4)


def set_columns(table: DataTable, keys: tuple[str, ...], headers: tuple[str, ...]) -> None:
    """The table's columns made `headers` (keyed `keys`), its rows dropped."""
    table.clear(columns=True)
    for key, label in zip(keys, headers, strict=True):
        table.add_column(label, key=key)
