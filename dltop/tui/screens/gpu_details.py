"""One GPU's details (Enter on the GPU tab): temperature, power, fan, clocks, P-state, throttle reasons, PCIe and
NVLink traffic, ECC errors, encoder / decoder; each unknown one with the library's reason. Opened from a process's
row, the process's history over the kept history comes first: its GPU memory, SM %, CPU % and host RSS, a chart
each with the value now and the range. Live: the pane hands each new view on; ←/→ step through the GPUs."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Static

from dltop.derive import GpuRates, gpu_rates
from dltop.fmt import human_bytes, human_rate, printable
from dltop.model import GpuDevice, Unavailable
from dltop.model.gpu_query import process_history
from dltop.text.gpu import short_command
from dltop.tui import charts
from dltop.view import View

LABEL_WIDTH = 16
# The clocks-event reasons that mean the GPU is held back (not idle, not an admin's clock setting), in few words:
# what the headline shows.
THROTTLES = {"SW Power Cap": "power cap", "HW Slowdown": "HW slowdown", "HW Thermal Slowdown": "HW thermal",
             "HW Power Brake Slowdown": "power brake", "SW Thermal Slowdown": "SW thermal"}


def throttling(g: GpuDevice) -> list[str]:
    """The throttle reasons of a GPU that hold its clocks down, in the headline's short words."""
    return [THROTTLES[r] for r in g.throttle_reasons or () if r in THROTTLES]


def _why(g: GpuDevice, *names: str) -> str:
    return next((w for n in names if (w := g.why(n))), "not given")


def _rate(v: float | Unavailable) -> str | None:
    return None if isinstance(v, Unavailable) else human_rate(v)


Row = tuple[str, str, bool]  # (label, text, known)


def _row(g: GpuDevice, label: str, name: str, text: str | None) -> Row:
    """A detail's row: its text, or 'n/a: ' and `name`'s reason (not known) where the text is None."""
    return (label, text, True) if text is not None else (label, f"n/a: {printable(_why(g, name))}", False)


def _num(g: GpuDevice, name: str, unit: str, scale: float = 1.0) -> str | None:
    v = getattr(g, name)
    return None if v is None else f"{v * scale:.0f}{unit}"


def _either(g: GpuDevice, first: str, second: str, text: str) -> str | None:
    """`text` with two numbers in it, where at least one is known; None where neither is."""
    return None if getattr(g, first) is None and getattr(g, second) is None else text


def _identity_rows(g: GpuDevice) -> list[Row]:
    library = "NVML" if g.backend == "nvml" else "amdsmi (ROCm)"
    return [_row(g, "Identity", "uuid", " ".join(printable(x) for x in (g.uuid, g.bus_id) if x) or None),
            ("Library", f"{library}, driver {printable(g.driver_version or '?')}", True)]


def _sensor_rows(g: GpuDevice) -> list[Row]:
    temp = _num(g, "temperature_c", "°C")
    if temp is not None and g.temperature_sensor not in (None, "gpu"):
        temp += f" ({g.temperature_sensor})"
    draw, limit = _num(g, "power_mw", " W", 0.001), _num(g, "power_limit_mw", " W", 0.001)
    power = None if draw is None else draw + (f" of {limit}" if limit else " (no limit read)")
    return [_row(g, "Temperature", "temperature_c", temp), _row(g, "Power", "power_mw", power),
            _row(g, "Fan", "fan_speed_percent", _num(g, "fan_speed_percent", "%"))]


def _clock_rows(g: GpuDevice) -> list[Row]:
    na = "n/a"
    sm, mem = _num(g, "clock_sm_mhz", " MHz"), _num(g, "clock_mem_mhz", " MHz")
    util, util_mem = _num(g, "utilization_gpu_percent", "%"), _num(g, "utilization_memory_percent", "%")
    enc, dec = _num(g, "encoder_util_percent", "%"), _num(g, "decoder_util_percent", "%")
    reasons = g.throttle_reasons
    return [_row(g, "Clocks", "clock_sm_mhz", None if sm is None else f"SM {sm}, memory {mem or na}"),
            _row(g, "P-state", "pstate", None if g.pstate is None else f"P{g.pstate}"),
            _row(g, "Throttle", "throttle_reasons", None if reasons is None else ", ".join(reasons) or "none"),
            _row(g, "Utilization", "utilization_gpu_percent",
                 None if util is None else f"GPU {util}, memory {util_mem or na}"),
            _row(g, "Encoder/dec.", "encoder_util_percent",
                 _either(g, "encoder_util_percent", "decoder_util_percent",
                         f"encoder {enc or na}, decoder {dec or na}"))]


def _traffic_row(g: GpuDevice, rates: GpuRates | None, label: str, prefix: str) -> Row:
    """PCIe or NVLink: the rates over the last interval, else the byte counters so far, else why neither."""
    tx = rx = None
    if rates is not None:
        tx, rx = _rate(getattr(rates, f"{prefix}_tx_bytes_per_s")), _rate(getattr(rates, f"{prefix}_rx_bytes_per_s"))
    total_tx, total_rx = getattr(g, f"{prefix}_tx_bytes_total"), getattr(g, f"{prefix}_rx_bytes_total")
    if tx is not None or rx is not None:
        return _row(g, label, f"{prefix}_tx_bytes_total", f"rx {rx or 'n/a'}  tx {tx or 'n/a'}")
    if total_tx is not None:
        return (label, f"rx {human_bytes(total_rx)}  tx {human_bytes(total_tx)} in all (a rate needs two readings)",
                True)
    reason = (f"{prefix}_tx_bytes_total" if prefix == "nvlink" or g.pcie_source != "throughput"
              else f"{prefix}_tx_bytes_per_s")
    return _row(g, label, reason, None)


def _ecc_rows(g: GpuDevice) -> list[Row]:
    rows = []
    for kind in ("corrected", "uncorrected"):
        vol, agg = getattr(g, f"ecc_{kind}_volatile"), getattr(g, f"ecc_{kind}_aggregate")
        text = _either(g, f"ecc_{kind}_volatile", f"ecc_{kind}_aggregate",
                       f"{'n/a' if vol is None else vol} since the driver loaded, {'n/a' if agg is None else agg} in all")
        rows.append(_row(g, f"ECC {kind}", f"ecc_{kind}_aggregate" if agg is None else f"ecc_{kind}_volatile", text))
    retired = None
    if g.retired_pages_sbe is not None or g.retired_pages_dbe is not None:
        retired = (f"{g.retired_pages_sbe or 0} single-bit, {g.retired_pages_dbe or 0} double-bit"
                   + ("; one waits for a reboot" if g.retired_pages_pending else ""))
    rows.append(_row(g, "Retired pages", "retired_pages_dbe", retired))
    return rows


def detail_lines(g: GpuDevice, rates: GpuRates | None, width: int) -> list[Content]:
    """The details, in nvidia-smi -q's order, as lines of `width` cells: the label, then the value (a reason in the
    muted colour)."""
    out = []
    for label, text, known in [*_identity_rows(g), *_sensor_rows(g), *_clock_rows(g),
                               _traffic_row(g, rates, "PCIe", "pcie"), _traffic_row(g, rates, "NVLink", "nvlink"),
                               *_ecc_rows(g)]:
        line = Content.assemble((f"{label:<{LABEL_WIDTH}}", "bold"), (text, "" if known else "$text-muted"))
        out.append(line.truncate(width, ellipsis=True))
    return out


# A process's series: (label, field, the value's text, the chart's top: None is the largest value shown)
PROCESS_SERIES: tuple[tuple[str, str, Callable[[float], str], float | None], ...] = (
    ("GPU memory", "used_bytes", lambda v: human_bytes(int(v)), None),
    ("SM %", "gpu_util_percent", lambda v: f"{v:.0f}%", 100.0),
    ("CPU %", "cpu_percent", lambda v: f"{v:.0f}%", None),
    ("host RSS", "host_rss_bytes", lambda v: human_bytes(int(v)), None),
)
HISTORY_LABEL = 12
HISTORY_TAIL = 30  # " 3.5 GiB  (3.1 GiB–3.5 GiB)"


def process_lines(history: Sequence[object], gpu_index: int, pid: int, start: int | None,
                  width: int) -> list[Content]:
    """The process's history on this GPU: a headline (pid, user, command), then per series a chart over the span
    every chart of dltop spans, the value now and the lowest and highest kept; 'not known' with the reason where
    no reading has it."""
    points = process_history(history, gpu_index, pid, start)
    if not points:
        return [Content.assemble((f"pid {pid}", "bold"), " is not on this GPU in the history kept")]
    end, p = points[-1]
    head = Content.assemble((f"pid {pid} {printable(p.user or '?')}  ", "bold"),
                            printable(short_command(p.command or "?"))).truncate(width, ellipsis=True)
    all_times = [getattr(s, "ts", end) for s in history]
    span, cadence = charts.span_s(all_times), charts.cadence_s(all_times)
    chart_width = max(8, width - HISTORY_LABEL - HISTORY_TAIL)
    lines = [head]
    for label, name, text, top in PROCESS_SERIES:
        values = [(ts, float(v)) for ts, q in points if (v := getattr(q, name)) is not None]
        if values:
            cols = charts.time_columns(values, end, chart_width, span, cadence)
            shown = _chart(cols, values, getattr(p, name), text, top)
        else:
            shown = [(f"? {printable(p.unavailable.get(name, 'no reading of it in the history kept'))}", "$text-muted")]
        lines.append(Content.assemble((f"{label:<{HISTORY_LABEL}}", "bold"), *shown).truncate(width, ellipsis=True))
    lines.append(Content.assemble((f"{' ' * HISTORY_LABEL}the last {charts.span_text(span)}, {len(points)} readings;"
                                   " the range is of those kept", "dim")).truncate(width, ellipsis=True))
    return lines


def _chart(cols: charts.Columns, values: list[tuple[float, float]], now: float | None, text: Callable[[float], str],
           top: float | None) -> list[str | tuple[str, str]]:
    """A series' chart (from 0 to `top`, or to its largest value), its value now, and the range of those kept."""
    kept = [v for _, v in values]
    chart = charts.draw(cols, 1, top if top is not None else max(kept) or 1.0)[0]
    return [(chart, "$accent"), f" {text(now) if now is not None else '?'}  ({text(min(kept))}–{text(max(kept))})"]


class GpuDetailsScreen(ModalScreen[None]):
    """One GPU's details, kept up to date by the pane (`show`); ←/→ step through the GPUs, Esc or Enter closes."""

    DEFAULT_CSS = """
    GpuDetailsScreen { align: center middle; }
    #gpu-details-dialog { width: 78; max-width: 100%; height: auto; max-height: 100%; border: thick $primary;
                          background: $surface; padding: 0 1; }
    #gpu-details-dialog > Static { height: auto; }
    """
    BINDINGS = [
        Binding("escape,enter,q", "close", "Close", id="gpu_details.close"),
        Binding("left", "step(-1)", "Previous GPU", id="gpu_details.previous"),
        Binding("right", "step(1)", "Next GPU", id="gpu_details.next"),
    ]

    def __init__(self, view: View, index: int, process: tuple[int, int | None] | None = None) -> None:
        """`process`: the (pid, start time) of the row it was opened from: its history comes first."""
        super().__init__()
        self._view = view
        self._index = index  # GpuDevice.index of the GPU shown
        self._process = process

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="gpu-details-dialog"):
            yield Static(id="gpu-details-title")
            yield Static(id="gpu-details-body")

    def on_mount(self) -> None:
        self._draw()

    def show(self, view: View) -> None:
        """The newest view: the same GPU, its numbers of now."""
        self._view = view
        if self.is_mounted:
            self._draw()

    def _gpus(self) -> Sequence[GpuDevice]:
        part = self._view.snapshot.gpus
        return part if isinstance(part, tuple) else ()

    def action_step(self, by: int) -> None:
        """Show the previous or next GPU."""
        indices = [g.index for g in self._gpus()]
        if indices:
            at = indices.index(self._index) if self._index in indices else 0
            self._index = indices[(at + by) % len(indices)]
            self._draw()

    def action_close(self) -> None:
        self.dismiss(None)

    def _draw(self) -> None:
        gpus = self._gpus()
        g = next((x for x in gpus if x.index == self._index), None)
        title = self.query_one("#gpu-details-title", Static)
        body = self.query_one("#gpu-details-body", Static)
        width = max(20, (self.query_one("#gpu-details-dialog").scrollable_content_region.width or 74))
        if g is None:
            title.update(Content.assemble((f"GPU{self._index}", "bold"), " is not in this Snapshot"))
            body.update(Content("Esc closes"))
            return
        title.update(_title(g, gpus).truncate(width, ellipsis=True))
        if g.down:
            body.update(Content.assemble((f"{g.down}: {printable(_why(g, 'memory_total_bytes'))}", "$error")))
            return
        rates = next((r for r in gpu_rates(self._view.previous, self._view.snapshot) if r.index == g.index), None)
        lines = detail_lines(g, rates, width)
        if self._process is not None:
            pid, start = self._process
            lines = [*process_lines(self._view.history, g.index, pid, start, width), Content(""), *lines]
        body.update(Content("\n").join(lines))


def _title(g: GpuDevice, gpus: Sequence[GpuDevice]) -> Content:
    """The GPU's name, and where there are several, which one of them it is and how to step to the others."""
    where = f"  ({gpus.index(g) + 1} of {len(gpus)}: ←/→ for the others, Esc closes)" if len(gpus) > 1 else ""
    return Content.assemble((f"GPU{g.index} {printable(g.name or '?')}", "bold"), (where, "dim"))
