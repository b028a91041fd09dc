"""The Cluster pane: a row per node with each watched dataset's residency on it (coldest first), the jobs across
nodes with the slowest rank named; Enter shows a node, w the commands that warm the cold ones (dltop runs none)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Static

from dltop.fmt import printable
from dltop.model.base import Unavailable
from dltop.model.cluster import ClusterNode, ClusterPart
from dltop.text.cluster import (
    JOB_HEADERS,
    SORTS,
    job_rows,
    node_detail,
    node_headers,
    node_row,
    sort_nodes,
    summary_line,
    warm_commands,
)
from dltop.tui.messages import RescanRequested
from dltop.tui.panes.base import RowTable, TablePane, set_content, set_row
from dltop.tui.screens.cluster import ClusterTextScreen
from dltop.view import View


class NodeTable(RowTable):
    """The nodes: Enter (DataTable's select, which the pane turns into the node's detail) reads "Node" in the
    footer; DataTable's own Enter binding is hidden there, and as the focused widget's it hid the pane's."""

    BINDINGS = [Binding("enter", "select_cursor", "Node", id="cluster.node")]


def _key(n: ClusterNode) -> str:
    return f"{n.job}\n{n.instance}"


class ClusterPane(TablePane):
    """Every node Prometheus has, read through one bounded set of queries per refresh."""

    PANE_ID = "cluster"
    TITLE = "Cluster"
    TABLE = "#cluster-nodes"
    HELP = ("Every node's dltop export, read back from Prometheus (--prometheus): instant queries of /api/v1/query, "
            "the same fourteen however many nodes (and one lookup of the jobs that serve dltop's metrics: every "
            "target of theirs is a node), three more for the node Enter opens. [N] columns: the resident share of "
            "dataset N on the node (pages over pages, as vmtouch counts); down: the last scrape failed or its "
            "readings are stale.")
    BINDINGS = [
        Binding("enter", "detail", "Node", id="cluster.detail"),
        Binding("s", "sort", "Sort", id="cluster.sort"),
        Binding("w", "warm", "Warm cmds", id="cluster.warm"),
    ]
    DEFAULT_CSS = """
    #cluster-summary { height: 1; }
    #cluster-nodes { height: 1fr; min-height: 4; }
    #cluster-jobs { height: auto; max-height: 5; }
    Screen.-tall #cluster-jobs { max-height: 9; }
    #cluster-notes { height: auto; max-height: 2; color: $text-muted; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.order = SORTS[0]
        self._columns: tuple[str, ...] = ()
        self._by_key: dict[str, ClusterNode] = {}
        self._jobs_shown: list[str] = []
        self._pending: tuple[str, float] | None = None  # the node whose detail was asked for, and when

    def compose(self) -> ComposeResult:
        yield Static(id="cluster-summary")
        yield NodeTable(id="cluster-nodes", cursor_type="row", zebra_stripes=False)
        yield DataTable(id="cluster-jobs", cursor_type="none", show_cursor=False, zebra_stripes=False)
        yield Static(id="cluster-notes")

    @property
    def part(self) -> ClusterPart | None:
        """The cluster on screen, if there is one."""
        part = self.view.snapshot.cluster if self.view is not None else None
        return part if isinstance(part, ClusterPart) else None

    def render_view(self, view: View) -> None:
        part = view.snapshot.cluster
        summary = self.query_one("#cluster-summary", Static)
        if not isinstance(part, ClusterPart):
            why = part.reason if isinstance(part, Unavailable) else "waiting for the first answer from Prometheus"
            set_content(summary, Text(f"Prometheus: {printable(why)}", style="bold yellow"))
            self._fill_nodes(None)
            return
        text = Text(summary_line(part))
        text.append(f" · {self.order}", "dim")
        self._fill_nodes(part)
        set_content(summary, self._follow_pending(part) or text)
        self._fill_jobs(part)
        self._offer((bool(part.datasets), bool(part.nodes)))  # w and Enter come and go with datasets and nodes
        datasets = "  ".join(f"[{i + 1}] {p}" for i, p in enumerate(part.datasets))
        notes = "; ".join(part.notes)
        set_content(self.query_one("#cluster-notes", Static), "\n".join(x for x in (datasets, notes) if x))

    def _follow_pending(self, part: ClusterPart) -> Text | None:
        """The node asked for opened once its numbers are in (or a refresh came without them); meanwhile, a summary."""
        if self._pending is None:
            return None
        key, asked_at = self._pending
        node = self._by_key.get(key)
        if node is None:
            self._pending = None
        elif node.detailed or part.queried_at > asked_at:
            self._open_detail(node)
        else:
            return Text(f"reading {printable(node.name)}'s GPUs and ranks…", style="bold")
        return None

    def _fill_nodes(self, part: ClusterPart | None) -> None:
        table = self.query_one("#cluster-nodes", RowTable)
        datasets = part.datasets if part is not None else ()
        columns = node_headers(datasets)
        nodes = sort_nodes(part, self.order) if part is not None else []
        keys = [_key(n) for n in nodes]
        if columns != self._columns or keys != self._rows:
            self._lay_out_nodes(table, columns, nodes, keys, datasets)
        else:
            cols = tuple(str(i) for i in range(len(columns)))
            for n in nodes:
                set_row(table, _key(n), cols, node_row(n, datasets))
        self._rows = keys
        self._by_key = {_key(n): n for n in nodes}

    def _lay_out_nodes(self, table: RowTable, columns: tuple[str, ...], nodes: list[ClusterNode], keys: list[str],
                       datasets: tuple[str, ...]) -> None:
        """A new order or a new set of nodes or datasets: the rows laid out again, the cursor kept on its node."""
        selected = self._selected()
        table.clear(columns=columns != self._columns)
        if columns != self._columns:
            for i, label in enumerate(columns):
                table.add_column(label, key=str(i))
        self._columns = columns
        for n, key in zip(nodes, keys, strict=True):
            table.add_row(*map(_cell, node_row(n, datasets)), key=key)
        if selected in keys:
            table.move_cursor(row=keys.index(selected))

    def _fill_jobs(self, part: ClusterPart) -> None:
        table = self.query_one("#cluster-jobs", DataTable)
        table.display = bool(part.jobs)
        if not table.columns:
            for i, label in enumerate(JOB_HEADERS):
                table.add_column(label, key=str(i))
        rows = job_rows(part)
        # a job may be named anything; a job is (uid, job id)
        keys = [f"job:{j.uid}:{j.job_id}" if j.job_id else f"no job id:{j.uid}" for j in part.jobs]
        if keys != self._jobs_shown:
            table.clear()
            self._jobs_shown = keys
        cols = tuple(str(i) for i in range(len(JOB_HEADERS)))
        for key, r in zip(keys, rows, strict=True):
            set_row(table, key, cols, r)

    def selected(self) -> ClusterNode | None:
        """The node under the cursor."""
        key = self._selected()
        return self._by_key.get(key) if key is not None else None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "detail":
            return self.selected() is not None
        if action == "warm":
            return self.part is not None and bool(self.part.datasets)
        return True

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id == "cluster-nodes":
            event.stop()
            self.action_detail()

    def action_detail(self) -> None:
        """A node's numbers: per GPU, per dataset, per rank, as its own exporter serves them."""
        node, part = self.selected(), self.part
        if node is None or part is None:
            return
        if node.detailed or (self.view is not None and self.view.replay):
            self._open_detail(node)
            return
        # A refresh reads every GPU and rank of one node only, the one opened: asked for now, shown when in.
        self._pending = (_key(node), part.queried_at)
        self.post_message(RescanRequested("cluster", _key(node)))
        self._rerender()

    def _open_detail(self, node: ClusterNode) -> None:
        self._pending = None
        self.app.push_screen(ClusterTextScreen(f"Node {node.name}", node_detail(node)))

    def action_sort(self) -> None:
        """Coldest node first, by name, or the down ones first."""
        self.order = SORTS[(SORTS.index(self.order) + 1) % len(SORTS)]
        self._rerender()

    def action_warm(self) -> None:
        """The commands that warm each dataset on the nodes where it is cold (shown and copyable, never run)."""
        part = self.part
        if part is None:
            return
        lines: list[str] = []
        commands: list[str] = []
        for path in part.datasets:
            cmds, notes = warm_commands(part, path)
            lines.append(f"# {path}")
            lines.extend(cmds)
            lines.extend(f"# {n}" for n in notes)
            commands.extend(cmds)
        lines.append("# dltop runs none of these: run them where you may (srun, kubectl exec or ssh).")
        self.app.push_screen(ClusterTextScreen("Warm the cold nodes", lines, "\n".join(commands)))


def _cell(value: str) -> Text:
    if value == "DOWN":
        return Text(value, style="bold red")
    return Text(printable(value))
