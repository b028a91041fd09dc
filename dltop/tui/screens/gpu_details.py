"""One GPU's details (Enter on the GPU tab): temperature, power, fan, clocks, P-state, throttle reasons, PCIe and
NVLink traffic, ECC errors, encoder / decoder; each unknown one with the library's reason. Live: the pane hands
each new view on; ←/→ step through the GPUs."""

from __future__ import annotations

from collections.abc import Sequence

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Static

from dltop.derive import GpuRates, gpu_rates
from dltop.fmt import human_bytes, human_rate, printable
from dltop.model import GpuDevice, Unavailable
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


def _value(g: GpuDevice, name: str, text: str | None) -> tuple[str, bool]:
    """The text of a known value, or 'n/a: why' (and False)."""
    return (text, True) if text is not None else (f"n/a: {printable(_why(g, name))}", False)


def _rate(v: float | Unavailable) -> str | None:
    return None if isinstance(v, Unavailable) else human_rate(v)


def detail_rows(g: GpuDevice, rates: GpuRates | None) -> list[tuple[str, str, bool]]:
    """(label, text, known) for each detail of a GPU, in nvidia-smi -q's order."""
    rows: list[tuple[str, str, bool]] = []

    def add(label: str, name: str, text: str | None) -> None:
        rows.append((label, *_value(g, name, text)))

    def num(name: str, unit: str, scale: float = 1.0, fmt: str = "{:.0f}") -> str | None:
        v = getattr(g, name)
        return None if v is None else fmt.format(v * scale) + unit

    add("Identity", "uuid", " ".join(printable(x) for x in (g.uuid, g.bus_id) if x) or None)
    rows.append(("Library", f"{'NVML' if g.backend == 'nvml' else 'amdsmi (ROCm)'}, driver "
                 f"{printable(g.driver_version or '?')}", True))
    temp = num("temperature_c", "°C")
    add("Temperature", "temperature_c",
        None if temp is None else temp + (f" ({g.temperature_sensor})" if g.temperature_sensor not in (None, "gpu")
                                         else ""))
    draw, limit = num("power_mw", " W", 0.001), num("power_limit_mw", " W", 0.001)
    add("Power", "power_mw", None if draw is None else draw + (f" of {limit}" if limit else " (no limit read)"))
    add("Fan", "fan_speed_percent", num("fan_speed_percent", "%"))
    sm, mem = num("clock_sm_mhz", " MHz"), num("clock_mem_mhz", " MHz")
    add("Clocks", "clock_sm_mhz", None if sm is None else f"SM {sm}, memory {mem or 'n/a'}")
    add("P-state", "pstate", None if g.pstate is None else f"P{g.pstate}")
    reasons = g.throttle_reasons
    add("Throttle", "throttle_reasons", None if reasons is None else ", ".join(reasons) or "none")
    util = num("utilization_gpu_percent", "%")
    add("Utilization", "utilization_gpu_percent",
        None if util is None else f"GPU {util}, memory {num('utilization_memory_percent', '%') or 'n/a'}")
    enc, dec = num("encoder_util_percent", "%"), num("decoder_util_percent", "%")
    add("Encoder/dec.", "encoder_util_percent", None if enc is None and dec is None else
        f"encoder {enc or 'n/a'}, decoder {dec or 'n/a'}")
    for label, prefix in (("PCIe", "pcie"), ("NVLink", "nvlink")):
        tx = rx = None
        if rates is not None:
            tx, rx = _rate(getattr(rates, f"{prefix}_tx_bytes_per_s")), _rate(getattr(rates, f"{prefix}_rx_bytes_per_s"))
        total_tx, total_rx = getattr(g, f"{prefix}_tx_bytes_total"), getattr(g, f"{prefix}_rx_bytes_total")
        if tx is not None or rx is not None:
            add(label, f"{prefix}_tx_bytes_total", f"rx {rx or 'n/a'}  tx {tx or 'n/a'}")
        elif total_tx is not None:
            rows.append((label, f"rx {human_bytes(total_rx)}  tx {human_bytes(total_tx)} in all (a rate needs "
                         "two readings)", True))
        else:
            add(label, f"{prefix}_tx_bytes_total" if prefix == "nvlink" or g.pcie_source != "throughput"
                else f"{prefix}_tx_bytes_per_s", None)
    for kind in ("corrected", "uncorrected"):
        vol, agg = getattr(g, f"ecc_{kind}_volatile"), getattr(g, f"ecc_{kind}_aggregate")
        text = None if vol is None and agg is None else (
            f"{'n/a' if vol is None else vol} since the driver loaded, {'n/a' if agg is None else agg} in all")
        add(f"ECC {kind}", f"ecc_{kind}_aggregate" if agg is None else f"ecc_{kind}_volatile", text)
    retired = None
    if g.retired_pages_sbe is not None or g.retired_pages_dbe is not None:
        retired = (f"{g.retired_pages_sbe or 0} single-bit, {g.retired_pages_dbe or 0} double-bit"
                   + ("; one waits for a reboot" if g.retired_pages_pending else ""))
    add("Retired pages", "retired_pages_dbe", retired)
    return rows


def detail_lines(g: GpuDevice, rates: GpuRates | None, width: int) -> list[Content]:
    """The details as lines of `width` cells: the label, then the value (a reason in the muted colour)."""
    out = []
    for label, text, known in detail_rows(g, rates):
        line = Content.assemble((f"{label:<{LABEL_WIDTH}}", "bold"), (text, "" if known else "$text-muted"))
        out.append(line.truncate(width, ellipsis=True))
    return out


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

    def __init__(self, view: View, index: int) -> None:
        super().__init__()
        self._view = view
        self._index = index  # GpuDevice.index of the GPU shown

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
        rates = next((r for r in gpu_rates(self._view.previous, self._view.snapshot) if r.index == g.index), None)
        where = f"  ({gpus.index(g) + 1} of {len(gpus)}: ←/→ for the others, Esc closes)" if len(gpus) > 1 else ""
        title.update(Content.assemble((f"GPU{g.index} {printable(g.name or '?')}", "bold"), (where, "dim"))
                     .truncate(width, ellipsis=True))
        if g.down:
            body.update(Content.assemble((f"{g.down}: {printable(_why(g, 'memory_total_bytes'))}", "$error")))
            return
        body.update(Content("\n").join(detail_lines(g, rates, width)))
