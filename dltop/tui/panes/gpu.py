"""The GPU pane: per GPU a memory bar and utilization / memory sparklines, the processes holding GPU memory (and
what for, where the probe or a server says), and the KV pool and prefix cache of each inference server.

Numbers come from the Snapshot's `gpus` part (NVML) and `servers` part (vLLM / SGLang /metrics); the hit rate of
vLLM V1 is a rate over the interval (`derive.server_rates`). What is not known is drawn as unknown, with the
reason in the notes, never as zero.
"""

from __future__ import annotations

from collections.abc import Sequence

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.content import Content
from textual.widgets import DataTable, Input, Static

from dltop.derive import ServerRates, server_rates
from dltop.fmt import human_bytes, sparkline_rows
from dltop.model import GpuDevice, ServerStats, Snapshot, Unavailable
from dltop.model.gpu import NO_PROBE, SPLIT_FIELDS, GpuProcess, MigDevice
from dltop.model.servers import ModelStats
from dltop.tui.messages import ServerAddRequested, ServerRemoveRequested
from dltop.tui.panes.base import Pane, RowTable, fit_column, set_content, set_row
from dltop.tui.view import View

# The one line that says why the split is not drawn (the model's per-field reason is NO_PROBE).
SPLIT_NEEDS_PROBE = "split needs the probe: add `import dltop.probe`"
COLUMNS = ("gpu", "pid", "user", "command", "used", "sm", *SPLIT_FIELDS)
# Short split headers so the table fits 80 columns; the help screen spells them out.
HEADERS = ("GPU", "PID", "User", "Command", "Used", "SM%", "Wts", "KV", "Cache", "Other", "NonT")
# Segments of a process's split in the bar, in the order of the issue: weights | KV | cached | other | non-torch.
SPLIT_SEGMENTS = (("weights_bytes", "W", "$primary"), ("kv_cache_bytes", "K", "$accent"),
                  ("allocator_cache_bytes", "c", "$warning"), ("other_torch_bytes", "o", "$secondary"),
                  ("non_torch_bytes", "n", "$error"))
SEGMENT_LABELS = {"W": "weights", "K": "KV", "c": "cached", "o": "other", "n": "non-torch"}
# Processes without a split: one segment each, told apart by colour and their legend.
PROCESS_STYLES = ("$primary", "$accent", "$secondary", "$success", "$warning")
LABEL_WIDTH = 6  # the indent of a GPU's bar under its headline
MIG_LABEL_WIDTH = 11  # "  3g.20gb ", "  1g.10gb+me"


def _pct(v: float | None) -> str:
    return f"{v:.0f}%" if v is not None else "?"


def _frac(v: float | Unavailable) -> str:
    return "?" if isinstance(v, Unavailable) else f"{100 * v:.1f}%"


def cells(parts: Sequence[int], width: int) -> list[int]:
    """Cells per part, proportional to its bytes, summing to `width` (largest remainder): a bar never overflows."""
    total = sum(parts)
    if total <= 0 or width <= 0:
        return [0] * len(parts)
    exact = [n * width / total for n in parts]
    out = [int(x) for x in exact]
    order = sorted(range(len(parts)), key=lambda i: exact[i] - out[i], reverse=True)
    for i in order[: width - sum(out)]:
        out[i] += 1
    return out


def _split_parts(p: GpuProcess) -> list[tuple[int, str, str]]:
    """The known parts of a process's split as bar segments (bytes, fill, style), in the bar's order."""
    return [(v, ch, style) for name, ch, style in SPLIT_SEGMENTS if (v := getattr(p.split, name)) is not None]


def _unsplit(p: GpuProcess) -> int:
    """What of NVML's figure for a process its known split parts do not cover."""
    if p.used_bytes is None:
        return 0
    return max(0, p.used_bytes - sum(v for v, _, _ in _split_parts(p)))


def bar_segments(processes: Sequence[GpuProcess], used: int, total: int) -> list[tuple[int, str, str]]:
    """(bytes, fill character, style) from left to right: each process's split parts where the probe or a server
    gives them, then the rest of its NVML figure as one segment; then memory used by no listed process; then free."""
    segs: list[tuple[int, str, str]] = []
    listed = 0
    for i, p in enumerate(processes):
        if p.used_bytes is None:
            continue
        listed += p.used_bytes
        segs += _split_parts(p)
        if rest := _unsplit(p):
            segs.append((rest, "█", PROCESS_STYLES[i % len(PROCESS_STYLES)]))
    if used > listed:
        segs.append((used - listed, "▓", "$text-muted"))
    segs.append((max(0, total - max(used, listed)), "░", "$text-disabled"))
    return segs


def memory_bar(label: str, processes: Sequence[GpuProcess], used: int | None, total: int | None,
               width: int, label_width: int = LABEL_WIDTH) -> Content:
    """One line: the label, the bar, and used / total."""
    pieces: list[str | tuple[str, str]] = [(f"{label:<{label_width}}", "bold")]
    tail = f" {human_bytes(used)}/{human_bytes(total)}"
    room = max(4, width - label_width - len(tail))
    if used is None or not total:
        pieces.append(("?" * room, "dim"))
    else:
        segs = bar_segments(processes, used, total)
        for (_, ch, style), n in zip(segs, cells([s[0] for s in segs], room), strict=True):
            pieces.append((ch * n, style))
    pieces.append(tail)
    return Content.assemble(*pieces)


def _within_other(processes: Sequence[GpuProcess]) -> str:
    """" (grads 1.0G optim 2.0G)": what the probe says other torch holds, where one process on the GPU has it."""
    split = [p.split for p in processes if p.split.other_torch_bytes is not None]
    if len(split) != 1:
        return ""
    bits = [f"{label} {_short(v)}" for label, v in (("grads", split[0].gradients_bytes),
                                                    ("optim", split[0].optimizer_bytes)) if v]
    return f" ({' '.join(bits)})" if bits else ""


def legend(processes: Sequence[GpuProcess], used: int | None, width: int) -> Content:
    """What each segment of the bar is, cut to `width`."""
    parts = [Content.assemble(("█", PROCESS_STYLES[i % len(PROCESS_STYLES)]), f" {p.pid} {human_bytes(p.used_bytes)}")
             for i, p in enumerate(processes) if p.used_bytes is not None and _unsplit(p)]
    drawn = {ch for p in processes if p.used_bytes is not None for _, ch, _ in _split_parts(p)}
    if drawn:
        key: list[str | tuple[str, str]] = []
        for _, ch, style in SPLIT_SEGMENTS:
            if ch in drawn:
                label = SEGMENT_LABELS[ch] + (_within_other(processes) if ch == "o" else "")
                key += [(ch, style), f" {label} "]
        parts.append(Content.assemble(*key).rstrip())
    listed = sum(p.used_bytes for p in processes if p.used_bytes is not None)
    if used is not None and used > listed:
        parts.append(Content.assemble(("▓", "$text-muted"), f" {human_bytes(used - listed)} not attributed to a process"))
    line = Content("  ").join(parts) if parts else Content.assemble(("no processes", "dim"))
    return Content(" " * LABEL_WIDTH).append(line).truncate(width, ellipsis=True)


def series(history: Sequence[Snapshot], uuid: str | None, index: int, name: str) -> list[float]:
    """One GPU field over the history, the GPU found by UUID (its index where NVML gave none)."""
    out = []
    for s in history:
        if not isinstance(s.gpus, tuple):
            continue
        for g in s.gpus:
            if (g.uuid == uuid if uuid else g.index == index):
                v = getattr(g, name)
                if v is not None:
                    out.append(float(v))
                break
    return out


def device_lines(g: GpuDevice, history: Sequence[Snapshot], width: int) -> list[Content]:
    """A GPU: its headline, its memory bar, the legend, and utilization and memory sparklines."""
    head = Content.assemble((f"GPU{g.index} {g.name or '?'}", "bold"))
    lost = g.why("memory_total_bytes") if g.memory_total_bytes is None else None
    if lost is not None and g.memory_used_bytes is None:
        # A GPU whose calls fail keeps its place: the reason where its numbers would be.
        return [head, Content.assemble(("      " + lost, "$error"))]  # wrapped, never cut: it is the news
    bits = []
    if g.utilization_gpu_percent is not None:
        bits.append(f"util {g.utilization_gpu_percent}%")
    if g.temperature_c is not None:
        bits.append(f"{g.temperature_c}°C")
    if g.power_mw is not None:
        limit = f"/{g.power_limit_mw / 1000:.0f}" if g.power_limit_mw else ""
        bits.append(f"{g.power_mw / 1000:.0f}{limit} W")
    if g.memory_pool == "system":
        bits.append("pool: system memory")
    if bits:
        head = head.append("  " + "  ".join(bits))
    lines = [head.truncate(width, ellipsis=True)]
    procs = g.processes if isinstance(g.processes, tuple) else ()
    if g.mig_devices:
        lines.append(memory_bar("", (), g.memory_used_bytes, g.memory_total_bytes, width))
        for mig in g.mig_devices:
            lines.append(mig_line(mig, width))
    else:
        lines.append(memory_bar("", procs, g.memory_used_bytes, g.memory_total_bytes, width))
        if isinstance(g.processes, Unavailable):
            lines.append(Content.assemble((f"      processes: {g.processes.reason}", "$warning")))
        else:
            lines.append(legend(procs, g.memory_used_bytes, width))
    half = max(1, (width - 21) // 2)  # "util  97% " and "  mem  65% " around two charts
    util = sparkline_rows(series(history, g.uuid, g.index, "utilization_gpu_percent"), half, 1, top=100.0)[0]
    mem = sparkline_rows(series(history, g.uuid, g.index, "memory_used_bytes"), half, 1,
                         top=float(g.memory_total_bytes) if g.memory_total_bytes else None)[0]
    lines.append(Content.assemble(("util ", "bold"), f"{_pct(g.utilization_gpu_percent):>4} ", (util, "$accent"),
                                  ("  mem ", "bold"), f"{_pct(_share(g)):>4} ", (mem, "$primary")))
    return lines


def _share(g: GpuDevice) -> float | None:
    if g.memory_used_bytes is None or not g.memory_total_bytes:
        return None
    return 100 * g.memory_used_bytes / g.memory_total_bytes


def mig_line(mig: MigDevice, width: int) -> Content:
    """A MIG instance under its parent: its profile and its own memory bar."""
    procs = mig.processes if isinstance(mig.processes, tuple) else ()
    name = (mig.name or f"MIG {mig.mig_index}").rsplit(" ", 1)[-1]
    return memory_bar(f"  {name}", procs, mig.memory_used_bytes, mig.memory_total_bytes, width, MIG_LABEL_WIDTH)


def _short(value: int) -> str:
    return f"{value / 2**30:.1f}G" if value >= 2**30 else f"{value / 2**20:.0f}M"


def split_cell(p: GpuProcess, name: str) -> str:
    """A split number in five cells ("14.0G", " 512M"), so five of them fit 80 columns beside the rest."""
    value = getattr(p.split, name)
    return "?" if value is None else _short(value)


Rows = dict[str, tuple[GpuProcess, tuple[str, ...]]]  # row key -> (process, its cells)


def process_rows(gpus: Sequence[GpuDevice]) -> Rows:
    """Row key → (process, cells) for every process on every GPU and MIG instance."""
    rows: dict[str, tuple[GpuProcess, tuple[str, ...]]] = {}
    for g in gpus:
        places: list[tuple[str, tuple[GpuProcess, ...] | Unavailable]] = [(str(g.index), g.processes)]
        places += [(f"{g.index}/{m.mig_index}", m.processes) for m in g.mig_devices]
        for where, procs in places:
            if isinstance(procs, Unavailable):
                continue
            for p in procs:
                rows[f"{where}:{p.pid}"] = (p, (
                    where, str(p.pid), p.user or "?", p.command or "?",
                    human_bytes(p.used_bytes, missing="?"), _pct(p.sm_util_percent),
                    *(split_cell(p, f) for f in SPLIT_FIELDS)))
    return rows


def gpu_of(pids: set[int], rows: Rows) -> list[str]:
    """"GPU0 pid 123" for each GPU process among `pids` (a server's listening pid and its children)."""
    out = []
    for key, (p, _) in rows.items():
        if p.pid in pids:
            out.append(f"GPU{key.split(':')[0]} pid {p.pid}")
    return out


def _model_line(m: ModelStats, rate: ServerRates | None, pool_bytes: int | None) -> str:
    hit: float | Unavailable = rate.prefix_cache_hit_rate if rate is not None else m.prefix_cache_hit_rate
    cap = m.kv_capacity_tokens
    bits = [f"KV {_frac(m.kv_usage)}" + (f" of {cap:,} tok" if isinstance(cap, int) else "")
            + (f" = {human_bytes(pool_bytes)}" if pool_bytes is not None else "")]
    bits.append(f"hit {_frac(hit)}")
    for label, v in (("run", m.running_requests), ("wait", m.waiting_requests)):
        bits.append(f"{label} {v if isinstance(v, int) else '?'}")
    if rate is not None and rate.preemptions:
        bits.append(f"preempted {rate.preemptions}")
    return "  ".join(bits)


def server_lines(servers: Sequence[ServerStats], rows: Rows, rates: Sequence[ServerRates],
                 width: int) -> tuple[list[Content], list[str]]:
    """A line per server (and one per model behind it when there are several), and the reasons for the notes."""
    lines: list[Content] = []
    notes: list[str] = []
    by_model = {(r.url, r.model_name, r.replica): r for r in rates}
    for s in servers:
        engine = s.engine if isinstance(s.engine, str) else "server"
        head = Content.assemble((f"{engine} ", "bold"), s.url)
        if isinstance(s.pid, int):
            joined = gpu_of({s.pid, *s.child_pids}, rows)
            head = head.append(f"  pid {s.pid}" + (f" → {', '.join(joined)}" if joined else " (no GPU process)"))
        else:
            notes.append(f"{s.url} pid: {s.pid.reason}")
        if s.state != "ok":
            lines.append(head.truncate(width, ellipsis=True))
            lines.append(Content.assemble((f"  {s.state}: {s.error}", "$error")))  # wrapped, never cut
            continue
        if s.source_error:
            head = head.append(Content.assemble((f"  {s.source_error}", "$warning")))
        lines.append(head.truncate(width, ellipsis=True))
        for m in s.models:  # each model apart: one line each, the name only where there are several
            name = m.model_name + (f" [{m.replica}]" if m.replica else "") + "  " if len(s.models) > 1 else ""
            pool = s.kv_capacity_bytes if isinstance(s.kv_capacity_bytes, int) and len(s.models) == 1 else None
            lines.append(Content(f"  {name}" + _model_line(m, by_model.get((s.url, m.model_name, m.replica)), pool))
                         .truncate(width, ellipsis=True))
        for m in s.models:
            rate = by_model.get((s.url, m.model_name, m.replica))
            hit = rate.prefix_cache_hit_rate if rate is not None else m.prefix_cache_hit_rate
            for what, v in (("KV", m.kv_usage), ("hit rate", hit)):
                if isinstance(v, Unavailable):
                    notes.append(f"{m.model_name} {what}: {v.reason}")
        notes.extend(s.notes)
    return lines, notes


def process_notes(rows: Rows) -> list[str]:
    """Why cells read '?', each reason once with the pids it holds for: the processes without a probe first (one
    line, the whole split), then how a probe was joined where it was not by UUID, then every other reason."""
    unprobed: list[int] = []
    probed = False
    pids: dict[str, list[int]] = {}
    for p, _ in rows.values():
        split = p.split
        if NO_PROBE in split.unavailable.values():
            unprobed.append(p.pid)
        probed = probed or split.probe_device is not None
        if split.joined_by not in (None, "uuid"):
            pids.setdefault(f"probe joined by {split.joined_by}", []).append(p.pid)
        reasons = [*p.unavailable.values(), *(v for k, v in split.unavailable.items() if k in SPLIT_FIELDS)]
        for why in dict.fromkeys(r for r in reasons if r != NO_PROBE):
            pids.setdefault(why.replace(f"pid {p.pid} ", "the pid "), []).append(p.pid)
    notes = []
    if unprobed and (probed or len(unprobed) < len(rows)):
        notes.append(f"no probe in {'pid' if len(unprobed) == 1 else 'pids'} {', '.join(map(str, unprobed))}: "
                     "add `import dltop.probe` for the split")
    elif unprobed:
        notes.append(SPLIT_NEEDS_PROBE)
    for why, held in pids.items():
        notes.append(f"{why} ({'pid' if len(held) == 1 else 'pids'} {', '.join(map(str, held))})")
    return notes


def device_notes(gpus: Sequence[GpuDevice]) -> list[str]:
    """What a GPU headline leaves out: the unified-memory note, a lost GPU's reason is on its own line."""
    return [f"GPU{g.index}: {g.memory_pool_note}" for g in gpus if g.memory_pool_note]


class GpuPane(Pane):
    """Per GPU: memory bar, sparklines; the processes and their split; inference servers' KV pools."""

    PANE_ID = "gpu"
    TITLE = "GPU"
    HELP = ("GPU numbers come from NVML (what nvidia-smi reads): one session for the life of dltop, no CUDA "
            "context. The bar shows each process's memory (its split where the in-process probe gives it: Wts "
            "weights, KV cache, Cache = allocator reserved - allocated, Other torch, NonT = NVML used - torch "
            "reserved), then memory no listed process holds, then free. Servers: vLLM / SGLang /metrics "
            "(--server URL); vLLM V1's prefix-cache hit rate is over the last interval.")
    DEFAULT_CSS = """
    #gpu-devices-scroll { height: auto; max-height: 50%; scrollbar-gutter: stable; }
    #gpu-devices { height: auto; }
    #gpu-servers { height: auto; max-height: 6; }
    #gpu-notes { height: auto; max-height: 3; color: $text-muted; }
    #gpu-table { height: 1fr; min-height: 3; }
    #gpu-server-input { display: none; }
    #gpu-server-input.-shown { display: block; }
    """
    BINDINGS = [
        Binding("a", "add_server", "Add server", id="gpu.add_server"),
        Binding("x", "remove_server", "Remove server", id="gpu.remove_server"),
        Binding("escape", "cancel_input", "Cancel", id="gpu.cancel"),
    ]
    can_focus = True  # the keys work where no GPU is there to list (a table to focus)

    def __init__(self) -> None:
        super().__init__()
        self._command_width = 0
        self._adding = True  # what the input box is for: adding a server, or naming one to remove

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="gpu-devices-scroll"):
            yield Static(id="gpu-devices")
        yield RowTable(id="gpu-table", cursor_type="row", zebra_stripes=False)
        yield Static(id="gpu-servers")
        yield Input(id="gpu-server-input")
        yield Static(id="gpu-notes")

    def on_mount(self) -> None:
        table = self.query_one("#gpu-table", DataTable)
        for key, label in zip(COLUMNS, HEADERS, strict=True):
            table.add_column(label, key=key)

    def focus_default(self) -> None:
        table = self.query_one("#gpu-table", DataTable)
        (table if table.display else self).focus()

    # -- watching servers: the app changes the settings; the pane only asks ------------------------------------

    def _servers(self) -> list[str]:
        servers = self.view.snapshot.servers if self.view is not None else None
        return [s.url for s in servers] if isinstance(servers, tuple) else []

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        replay = self.view is not None and self.view.replay
        if action == "add_server":
            return not replay
        if action == "remove_server":
            return not replay and bool(self._servers())
        if action == "cancel_input":
            return self.query_one("#gpu-server-input", Input).has_class("-shown")
        return True

    def _ask(self, adding: bool, value: str, placeholder: str) -> None:
        box = self.query_one("#gpu-server-input", Input)
        self._adding = adding
        box.placeholder = placeholder
        box.value = value
        box.add_class("-shown")
        box.focus()

    def action_add_server(self) -> None:
        """Ask for a vLLM or SGLang server to scrape (host:port, or its /metrics URL)."""
        self._ask(True, "", "server to scrape: host:port or http://host:port/metrics (Enter adds, Esc cancels)")

    def action_remove_server(self) -> None:
        """Ask which server to stop scraping (the first is filled in)."""
        servers = self._servers()
        self._ask(False, servers[0] if servers else "",
                  f"server to stop scraping, one of: {', '.join(servers)} (Enter removes, Esc cancels)")

    def action_cancel_input(self) -> None:
        """Close the server box without doing anything."""
        self.query_one("#gpu-server-input", Input).remove_class("-shown")
        self.focus_default()

    @on(Input.Submitted, "#gpu-server-input")
    def _server_submitted(self, event: Input.Submitted) -> None:
        self.action_cancel_input()
        text = event.value.strip()
        if text:
            self.post_message(ServerAddRequested(text) if self._adding else ServerRemoveRequested(text))

    def render_view(self, view: View) -> None:
        part = view.snapshot.gpus
        table = self.query_one("#gpu-table", DataTable)
        gpus: tuple[GpuDevice, ...] = part if isinstance(part, tuple) else ()
        devices = self.query_one("#gpu-devices", Static)
        width = max(20, devices.size.width or self.size.width - 4)
        if part is None:
            set_content(devices, Content.assemble(("GPUs: not sampled", "dim")))
        elif isinstance(part, Unavailable):
            # No GPU here, or NVML cannot be used: one line saying so, where the GPUs would be.
            set_content(devices, Content.assemble(("GPUs: ", "bold"), (part.reason, "$warning")))
        elif not part:
            set_content(devices, Content.assemble(("GPUs: ", "bold"), ("NVML lists none", "$warning")))
        else:
            lines = [line for g in gpus for line in device_lines(g, view.history, width)]
            set_content(devices, Content("\n").join(lines))
        table.display = bool(gpus)
        rows = process_rows(gpus)
        wanted = {key: cells_ for key, (_, cells_) in rows.items()}
        # The Command column gives way so every number column stays on screen at 80 columns.
        self._command_width = fit_column(table, wanted, COLUMNS.index("command"), HEADERS, COLUMNS,
                                         lambda text, width: text[: width - 1] + "…", self._command_width)
        for stale in [k for k in table.rows if k.value not in wanted]:
            table.remove_row(stale)
        for key, values in wanted.items():
            set_row(table, key, COLUMNS, values)
        notes = process_notes(rows) + device_notes(gpus)
        servers = self.query_one("#gpu-servers", Static)
        if isinstance(view.snapshot.servers, tuple) and view.snapshot.servers:
            lines, more = server_lines(view.snapshot.servers, rows, server_rates(view.previous, view.snapshot),
                                       width)
            set_content(servers, Content("\n").join(lines))
            notes += more
        else:
            set_content(servers, Content())
        servers.display = bool(isinstance(view.snapshot.servers, tuple) and view.snapshot.servers)
        notes_widget = self.query_one("#gpu-notes", Static)
        set_content(notes_widget, Content("; ".join(notes)))
        notes_widget.display = bool(notes)

