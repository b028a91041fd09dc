"""The CPU pane: the cache tree (package → cluster → L3 → L2 → core → L1), a row per core kind, flags, and what
the hierarchy means for deep-learning work (L2 per core, the line size to pad against false sharing)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Static

from dltop.fmt import plural
from dltop.model import CpuPart, Unavailable
from dltop.model.cpu import format_cpu_list
from dltop.tui.panes.base import Pane, set_columns, set_content, set_rows
from dltop.view import View


def summary_text(part: CpuPart) -> Text:
    """Arch, CPU counts, core kinds and the arrangement with its evidence."""
    t = Text()
    t.append(part.arch or "arch unknown", "bold")
    t.append(f"  {plural(len(part.cpus), 'CPU')} ({len(part.online)} online)")
    if part.threads_per_core and part.threads_per_core > 1:
        t.append(f", {part.threads_per_core} threads per core")
    if part.core_kinds:
        from dltop.text.cpu import kinds_summary  # the CPU tab's only: imported when it is first drawn

        t.append("  " + kinds_summary(part.core_kinds))
    t.append("\n")
    t.append(part.arrangement, "bold")
    t.append(f": {part.arrangement_reason}")
    return t


def notes_text(part: CpuPart) -> Text:
    """Flags first (shown, never silently fixed), then the DL notes and the line size the registers give."""
    t = Text()
    for f in part.flags:
        style = "bold yellow" if f.severity == "warning" else "bold"
        t.append("! " if f.severity == "warning" else "i ", style)
        t.append(f.message + "\n")
    for n in part.notes():
        t.append("• ", "bold")
        t.append(n + "\n")
    ctr = part.registers.ctr_el0
    if not isinstance(ctr, Unavailable):
        from dltop.text.cpu import register_lines

        t.append(register_lines(part)[0].strip() + "\n", "dim")
    if part.core_kinds and part.caches:
        t.append("Table: /N one cache shared by N CPUs, + shared with other kinds, ? not given by the system\n",
                 "dim")
    if part.pmus:
        t.append("PMUs: " + ", ".join(f"{p.name} ({p.kind})" for p in part.pmus) + "\n", "dim")
    t.rstrip()
    return t


class CpuPane(Pane):
    """Every cache instance and who shares it, per core kind; it changes only when CPUs come or go."""

    PANE_ID = "cpu"
    TITLE = "CPU caches"
    HELP = ("Caches from sysfs (/sys/devices/system/cpu/cpu*/cache), core kinds from /proc/cpuinfo and MIDR, "
            "CTR_EL0 read for real on aarch64, CLIDR_EL1 / CCSIDR_EL1 rebuilt from sysfs; compare with lscpu -C.")
    DEFAULT_CSS = """
    #cpu-summary { height: auto; max-height: 2; }
    #cpu-kinds { height: auto; max-height: 7; }
    #cpu-notes { height: auto; max-height: 5; color: $text-muted; }
    Screen.-tall #cpu-notes { max-height: 10; }
    #cpu-tree-scroll { height: 1fr; min-height: 4; }
    #cpu-tree { width: auto; }
    """

    def __init__(self) -> None:
        super().__init__()
        self._shown: object = None

    def compose(self) -> ComposeResult:
        yield Static(id="cpu-summary")
        yield DataTable(id="cpu-kinds", cursor_type="row", zebra_stripes=False)
        yield Static(id="cpu-notes")
        with VerticalScroll(id="cpu-tree-scroll"):
            yield Static(id="cpu-tree")

    def render_view(self, view: View) -> None:
        part = view.snapshot.cpu
        # The topology is read once a minute and almost never changes: redraw only when it does.
        if part is self._shown or (part == self._shown and part is not None):
            return
        self._shown = part
        summary = self.query_one("#cpu-summary", Static)
        table = self.query_one("#cpu-kinds", DataTable)
        if not isinstance(part, CpuPart):
            set_content(summary, Text(f"cpu: {part}" if part is not None else "cpu: not read yet", "dim"))
            table.display = False
            set_content(self.query_one("#cpu-notes", Static), "")
            set_content(self.query_one("#cpu-tree", Static), "")
            return
        table.display = bool(part.core_kinds)
        set_content(summary, summary_text(part))
        self._update_kinds(table, part)
        # An auto height measured while the table was hidden stays 0: size it from its rows instead.
        table.styles.height = min(7, table.row_count + 1)
        set_content(self.query_one("#cpu-notes", Static), notes_text(part))
        from dltop.text.cpu import tree_lines

        lines = tree_lines(part.tree)
        if not part.caches:
            lines.append("(no cache information: " + ", ".join(f.code for f in part.flags) + ")")
        set_content(self.query_one("#cpu-tree", Static), Text("\n".join(lines)))

    def _update_kinds(self, table: DataTable, part: CpuPart) -> None:
        from dltop.text.cpu import kind_table

        header, rows = kind_table(part)
        columns = tuple(h.lower() for h in header)
        if tuple(str(c.key.value) for c in table.columns.values()) != columns:
            set_columns(table, columns, tuple(h if h.startswith("L") else h.capitalize() for h in header))
        set_rows(table, {format_cpu_list(k.cpus): tuple(row) for k, row in zip(part.core_kinds, rows, strict=True)},
                 columns)

