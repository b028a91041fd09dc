"""The Training pane: per job (its ranks grouped) what the in-process probe says — step time, data-wait,
throughput and loss sparklines, the bytes it holds, and the epoch table (time, load time, data-wait %,
page-cache delta, samples/s, tokens/s, loss, GPU util), which scrolls on its own when one job is shown.

Numbers come from the Snapshot's `probes` part (docs/probe.md); GPU utilisation over an epoch is NVML's, from the
GPU samples of dltop's own history over the epoch's span (the probe reads no NVML). Probe files dltop did not read
are in the notes with their reasons.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from operator import itemgetter

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.content import Content
from textual.widgets import Static

from dltop.fmt import human_bytes, percent_text, plural, printable, shorten_middle
from dltop.model import Snapshot, Unavailable
from dltop.model.probes import (
    NOT_GIVEN,
    ProbeEpoch,
    ProbeLoader,
    ProbesPart,
    ProcessProbe,
    exit_text,
    jobs_first,
    rank_status,
    who,
)
from dltop.tui import charts
from dltop.tui.panes.base import Pane, set_content
from dltop.view import View

NO_PROBE = ("No process publishes a probe. Add one to the training script:\n"
            "    from dltop import probe\n"
            "    probe.start(); probe.watch_model(model)\n"
            "    for batch in probe.track(loader): ...\n"
            "    probe.mark_epoch()   # at the end of each epoch\n"
            "or start it without changing the script: DLTOP_PROBE=1 python train.py\n"
            "(docs/probe.md)")
SPARK_LABEL_WIDTH = 20  # "Data wait" padded to 10, the value right-aligned in 9, a space
SPARK_SCALE_WIDTH = 13  # " max 12.3k/s", " 2.31–2.45": right of the bars, each chart's scale
EPOCH_HEADERS = ("Epoch", "Time", "Load", "Wait%", "Cache Δ", "Steps", "GPU util")
# Shown where an epoch of the job has them (the script said what a batch holds, or logged its loss)
EPOCH_EXTRA = (("Samp/s", "samples"), ("Tok/s", "tokens"), ("Loss", "loss"))
NO_COUNTS = ("throughput, loss: not given: track(loader, batch_size=N, tokens=...), probe.log(loss=loss), "
             "or a Lightning / Hugging Face callback (docs/probe.md)")
NOTES_FOLDED = 3  # lines of notes shown until n shows all of them


def series(history: Sequence[Snapshot], key: str, name: str,
           combine: Callable[[list[float]], float] = max) -> list[charts.Point]:
    """A job's `step_time_s` or `data_wait_fraction` over the history, with each Snapshot's time: the slowest
    rank's at each Snapshot (the slowest sets the pace of a synchronous job); `combine=sum` for throughput (each
    rank has its own batches), `combine=itemgetter(0)` for the lowest rank's (its loss)."""
    out = []
    for s in history:
        if not isinstance(s.probes, ProbesPart):
            continue
        procs = sorted((p for p in s.probes.processes if p.job_key == key and getattr(p, name) is not None),
                       key=lambda p: (p.rank if p.rank is not None else -1, p.pid))
        if procs:
            out.append((s.ts, float(combine([getattr(p, name) for p in procs]))))
    return out


def rate_text(n: float | None) -> str:
    """Samples or tokens a second, compact: '950', '12.3k', '4.56M'."""
    if n is None:
        return "n/a"
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            v = n / scale
            return f"{v:.3g}{unit}" if v < 1000 else f"{v:.0f}{unit}"
    return f"{n:.3g}" if n < 100 else f"{n:.0f}"


def loss_text(loss: float | None, nonfinite: str | None) -> str:
    """A loss in four significant figures, or what it was where it is not a number ('NaN', 'inf')."""
    if nonfinite is not None:
        return {"nan": "NaN", "inf": "inf", "-inf": "-inf"}.get(nonfinite, "n/a")
    return "n/a" if loss is None else f"{loss:.4g}"


def _on_gpu(snap: Snapshot, pids: set[int]) -> list[float]:
    """NVML's utilisation of each GPU where one of `pids` holds memory, in one Snapshot."""
    out = []
    for g in snap.gpus if isinstance(snap.gpus, tuple) else ():
        procs = g.processes if isinstance(g.processes, tuple) else ()
        if any(p.pid in pids for p in procs) and g.utilization_gpu_percent is not None:
            out.append(float(g.utilization_gpu_percent))
    return out


def epoch_gpu_util(history: Sequence[Snapshot], pids: set[int], e: ProbeEpoch) -> tuple[float | None, str]:
    """The mean NVML utilisation over the epoch of the GPUs the job's processes hold memory on, and where it came
    from (or why there is none)."""
    samples = [u for s in history if e.started_at <= s.ts <= e.ended_at for u in _on_gpu(s, pids)]
    if samples:
        return sum(samples) / len(samples), f"NVML, {plural(len(samples), 'sample')}"
    latest = history[-1] if history else None
    if latest is None or not isinstance(latest.gpus, tuple):
        return None, "no NVML"
    if not _on_gpu(latest, pids):
        return None, "on no GPU"
    if e.ended_at < history[0].ts:
        return None, "before dltop's history"
    return None, "no GPU sample within it"  # an epoch shorter than the refresh interval


def _seconds(s: float) -> str:
    return f"{s:.2f}s" if s < 100 else f"{s:.0f}s"


def epoch_headers(p: ProcessProbe) -> tuple[str, ...]:
    """The epoch table's columns for this probe: samples/s, tokens/s and loss only where an epoch has them."""
    extra = tuple(h for h, attr in EPOCH_EXTRA
                  if any(getattr(e, attr) is not None or (attr == "loss" and e.loss_nonfinite) for e in p.epochs))
    return (*EPOCH_HEADERS[:-1], *extra, EPOCH_HEADERS[-1])


def job_rate(members: Sequence[ProcessProbe], index: int, name: str) -> float | None:
    """The job's samples or tokens a second (`name`: "samples_per_s", "tokens_per_s") over its epoch `index`: the
    sum over its ranks (each has its own batches); None until every rank has closed that epoch with a count."""
    rates = []
    for m in members:
        e = next((e for e in m.epochs if e.index == index), None)
        rate = getattr(e, name) if e is not None else None
        if rate is None:
            return None
        rates.append(rate)
    return sum(rates)


def epoch_rows(p: ProcessProbe, history: Sequence[Snapshot], pids: set[int],
               members: Sequence[ProcessProbe] = ()) -> list[tuple[str, ...]]:
    """One row per epoch the probe kept, oldest first, in the columns of `epoch_headers(p)`; samples and
    tokens a second are the sum over `members` (the job's ranks; default: `p` alone)."""
    headers = epoch_headers(p)
    ranks = list(members) or [p]
    rows: list[tuple[str, ...]] = []
    for e in p.epochs:
        util, source = epoch_gpu_util(history, pids, e)
        delta = e.data_cached_delta_bytes  # the job's own data, never the machine's Cached (notes say why n/a)
        extra = {"Samp/s": rate_text(job_rate(ranks, e.index, "samples_per_s")),
                 "Tok/s": rate_text(job_rate(ranks, e.index, "tokens_per_s")),
                 "Loss": loss_text(e.loss, e.loss_nonfinite)}
        rows.append((
            str(e.index), _seconds(e.duration_s), _seconds(e.data_wait_s),
            percent_text(100 * e.data_wait_s / e.duration_s) if e.duration_s > 0 else "n/a",
            "n/a" if delta is None else ("-" if delta < 0 else "+") + human_bytes(abs(delta)),
            str(e.steps),
            *(extra[h] for h in headers[len(EPOCH_HEADERS) - 1:-1]),
            f"{percent_text(util)} ({source})" if util is not None else f"n/a ({source})",
        ))
    return rows


def epoch_table(rows: list[tuple[str, ...]], width: int,
                headers: tuple[str, ...] = EPOCH_HEADERS) -> list[Content]:
    """A bold header line and the rows, right-aligned but the last column, cut to `width`."""
    table = [headers, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(headers) - 1)]

    def line(r: tuple[str, ...]) -> str:
        return ("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1])[:width]

    return [Content.assemble((line(headers).ljust(width)[:width], "bold reverse")),
            *(Content(line(r)) for r in rows)]


def short_cmd(cmd: str) -> str:
    """The command with the interpreter and the script by their names only: the arguments are what tell runs
    apart in 80 columns."""
    words = printable(cmd).split(" ")
    for i in range(min(2, len(words))):
        if "/" in words[i] and (i == 0 or words[i].endswith(".py")):
            words[i] = words[i].rsplit("/", 1)[1]
    return " ".join(words)


def _ago(s: float) -> str:
    return f"{s:.0f}s" if s < 120 else f"{s / 60:.0f}m" if s < 7200 else f"{s / 3600:.0f}h"


def status_lines(members: list[ProcessProbe], now: float, width: int,
                 history: Sequence[Snapshot] = ()) -> list[Content]:
    """What a job's ranks are doing if not training (`rank_status`): exited (how it ended, when the probe or the
    kernel could say), stopped or in uninterruptible IO (the kernel's state), waiting for the rank that cannot
    step, or stalled (no step for a while)."""
    several = len(members) > 1
    lines = []
    for p in members:
        got = rank_status(p, members)
        if got is None:
            continue
        word, why = got
        label = f"{who(p)} {word}" if several else word
        if p.exited:
            label += f" {_ago(max(0.0, now - p.exited_at))} ago" if p.exited_at is not None else ""
            why = exit_text(p, history)
        style = "bold $warning" if word == "WAITING" else "bold $error"
        lines.append(Content.assemble((label, style), f"  {printable(why)}"))
    return [c.truncate(width, ellipsis=True) for c in lines]


def _title(members: list[ProcessProbe], width: int) -> Content:
    first = members[0]
    if len(members) > 1 or first.rank is not None:
        ranks = [str(p.rank) for p in members if p.rank is not None]
        world = f" of {first.world_size}" if first.world_size is not None else ""
        who = f"{plural(len(members), 'rank')} {','.join(ranks)}{world}  pids {','.join(str(p.pid) for p in members)}"
    else:
        who = f"pid {first.pid}"
    # whose job it is, in the kernel's word (the uid of its processes): two users' ranks are never one job
    user = printable(first.user) if first.user else f"uid {first.uid}"
    return Content.assemble((user, "bold $accent"), "  ", (who, "bold"), "  ",
                            short_cmd(first.cmd)).truncate(width, ellipsis=True)


def _facts(p: ProcessProbe, width: int) -> Content:
    def onoff(v: bool | None) -> str:
        return "?" if v is None else "on" if v else "off"

    bits = [f"weights {human_bytes(p.weights_bytes, missing='?')}", f"grads {human_bytes(p.gradients_bytes, missing='?')}",
            f"optim {human_bytes(p.optimizer_bytes, missing='?')}", f"KV {human_bytes(p.kv_bytes, missing='?')}",
            f"workers {p.loader_workers if p.loader_workers is not None else '?'}",
            f"pin {onoff(p.pin_memory)}", f"shapes {p.input_shapes if p.input_shapes is not None else '?'}",
            f"cudnn.benchmark {onoff(p.cudnn_benchmark)}"]
    bits += _counts_told(p)
    if p.data_dir:
        bits.append(f"data {shorten_middle(printable(p.data_dir), width - 5)}")
    lines, line = [], ""
    for b in bits:
        if line and len(line) + 2 + len(b) > width:
            lines.append(line)
            line = b
        else:
            line = f"{line}  {b}" if line else b
    lines.append(line)
    return Content("\n".join(ln[:width] for ln in lines[:3]))


def _counts_told(p: ProcessProbe) -> list[str]:
    """The counts a process's probe gives where it gives them: optimizer steps, recompiles, eager fallbacks
    (frames dynamo stopped compiling at its recompile limit), allocator retries and OOMs."""
    bits = []
    if p.optimizer_steps is not None:
        bits.append(f"optimizer steps {p.optimizer_steps}")
    if "recompiles" in p.compile:
        bits.append(f"recompiles {p.compile['recompiles']}")
    if p.compile.get("eager_fallbacks"):
        bits.append(f"eager fallbacks {p.compile['eager_fallbacks']}")
    if any("num_ooms" in d.memory_stats for d in p.devices):
        retries = sum(d.memory_stats.get("num_alloc_retries", 0) for d in p.devices)
        ooms = sum(d.memory_stats.get("num_ooms", 0) for d in p.devices)
        bits.append(f"retries {retries} OOMs {ooms}")
    return bits


def _ms(v: float) -> str:
    return f"{1000 * v:.3g} ms" if v < 1 else f"{v:.3g} s"


def _percent(v: float) -> str:
    return percent_text(100 * v)


class Axis:
    """What every chart of the pane spans and where it ends: the history's cadence, span and last time."""

    def __init__(self, history: Sequence[Snapshot]) -> None:
        times = [s.ts for s in history]
        self.cadence_s = charts.cadence_s(times)
        self.span_s = charts.span_s(times)
        self.end_ts = times[-1] if times else 0.0

    def line(self, width: int) -> Content:
        """The time axis under the charts: '-10 min ─── now' and what a column covers."""
        bars = _bars_width(width)
        per = f" {charts.column_text(self.span_s / bars)}/col"
        return Content.assemble(" " * SPARK_LABEL_WIDTH, (charts.axis(bars, self.span_s), "dim"),
                                (per[:SPARK_SCALE_WIDTH], "dim")).truncate(width)


def _bars_width(width: int) -> int:
    return max(1, width - SPARK_LABEL_WIDTH - SPARK_SCALE_WIDTH)


def _spark_line(label: str, value: str, data: list[charts.Point], width: int, style: str, axis: Axis,
                scale: Callable[[float], str], top: float | None = None, value_style: str = "",
                banded: bool = False, now: float | None = None) -> Content:
    """A labelled chart row with its scale on the right (its max, or its range where it does not start at 0:
    `banded`, a loss that moves in a band, is scaled from its lowest value shown, and `now`, the value printed,
    inside it), exactly `width` wide (a row one cell wider wraps into a stray fragment)."""
    bars_width = _bars_width(width)
    cols = charts.time_columns(data, axis.end_ts, bars_width, axis.span_s, axis.cadence_s)
    bottom, high = charts.scale_of(cols, None if banded else 0.0, top, now=now)
    bar = charts.draw(cols, 1, high, bottom)[0] if charts.shown(cols) else " " * bars_width
    if not charts.shown(cols):
        said = ""  # nothing drawn: no scale to read
    elif top is not None:
        said = f"{scale(bottom)}–{scale(top)}"  # a fixed scale (a share): its range
    else:
        said = charts.scale_text(bottom, high, scale)
    return Content.assemble((f"{label:<10}", "bold"), (f"{value:>9}", value_style), " ",
                            (bar, style), (f" {said}"[:SPARK_SCALE_WIDTH], "dim")).truncate(width)


def job_lines(key: str, members: list[ProcessProbe], history: Sequence[Snapshot], width: int,
              now: float, with_epochs: bool = True) -> list[Content]:
    """A job: its title, whether it stalled or exited, its facts, its sparklines (step time, data wait, and
    throughput and loss where the script hands them over) and, `with_epochs`, its whole epoch table (several
    jobs scroll together; one job's table scrolls on its own: `epoch_lines`)."""
    lead = members[0]  # rank 0 (or the only process) speaks for the job's epochs
    lines = [_title(members, width), *status_lines(members, now, width, history), _facts(lead, width)]
    axis = Axis(history)
    lines += _spark_lines(key, members, history, width, axis)
    lines.append(axis.line(width))
    lines += (_loader_line(loader, width) for loader in lead.loaders)
    if not lead.epochs:
        lines.append(Content.assemble(("no epoch closed yet (probe.mark_epoch())", "dim")))
    elif with_epochs:
        head, rows = epoch_lines(members, history, width)
        lines += [head, *rows]
        if len(members) > 1:
            lines.append(epochs_whose(members, width))
    return lines


def epochs_whose(members: list[ProcessProbe], width: int) -> Content:
    """The line under a job of several ranks' epoch table: whose epochs they are, and that its throughput is
    the ranks' sum."""
    cols = [h for h in ("Samp/s", "Tok/s") if h in epoch_headers(members[0])]
    sums = f"; {', '.join(cols)}: the {len(members)} ranks' sum" if cols else ""
    return Content.assemble((f"epochs (rank {members[0].rank}'s){sums}", "dim")).truncate(width, ellipsis=True)


def _spark_lines(key: str, members: list[ProcessProbe], history: Sequence[Snapshot], width: int,
                 axis: Axis) -> list[Content]:
    """A job's sparklines: step time and data wait, then samples, tokens and loss where the script hands them
    over (a line saying how, where it hands none)."""
    now_step, now_wait = _slowest(members, "step_time_s"), _slowest(members, "data_wait_fraction")
    idle = _idle(members)
    step = idle or ("n/a" if now_step is None else f"{1000 * now_step:.1f} ms")
    wait = idle or ("n/a" if now_wait is None else percent_text(100 * now_wait))
    lines = [_spark_line("Step", step, series(history, key, "step_time_s"), width, "$accent", axis, _ms,
                         now=None if idle else now_step),
             _spark_line("Data wait", wait, series(history, key, "data_wait_fraction"), width, "$warning", axis,
                         _percent, top=1.0)]
    counts = _count_lines(key, members, history, width, axis, idle)
    return lines + (counts or [Content.assemble((NO_COUNTS, "dim")).truncate(width, ellipsis=True)])


def _slowest(members: list[ProcessProbe], name: str) -> float | None:
    """The slowest rank's `name` now (the slowest sets the pace of a synchronous job)."""
    return max((v for p in members if (v := getattr(p, name)) is not None), default=None)


def _idle(members: list[ProcessProbe]) -> str | None:
    """Why a job has no number of the recent window now: its processes exited, or its loop stopped."""
    if all(p.exited for p in members):
        return "exited"
    return "stalled" if any(p.stalled for p in members) else None


def _count_lines(key: str, members: list[ProcessProbe], history: Sequence[Snapshot], width: int, axis: Axis,
                 idle: str | None) -> list[Content]:
    """Samples and tokens a second, and the loss, each where the script hands it over."""
    lines = [line for label, name in (("Samples/s", "samples_per_s"), ("Tokens/s", "tokens_per_s"))
             if (line := _rate_line(label, name, key, members, history, width, axis, idle)) is not None]
    if lines and (each := per_rank_line(members, width)) is not None:
        lines.append(each)
    lead = members[0]
    if lead.losses_logged or lead.loss is not None or lead.loss_nonfinite:
        lines.append(_spark_line("Loss", loss_text(lead.loss, lead.loss_nonfinite),
                                 series(history, key, "loss", combine=itemgetter(0)), width, "$secondary", axis,
                                 "{:.3g}".format, value_style="bold $error" if lead.loss_nonfinite else "",
                                 banded=True, now=None if lead.loss_nonfinite else lead.loss))
    return lines


def _rate_line(label: str, name: str, key: str, members: list[ProcessProbe], history: Sequence[Snapshot],
               width: int, axis: Axis, idle: str | None) -> Content | None:
    """Samples or tokens a second (`name`) summed over the job's processes; None where the script counts none."""
    counted = [p for p in members if getattr(p, name) is not None or getattr(p, name.split("_")[0]) is not None]
    data = series(history, key, name, combine=sum)
    if not counted and not data:
        return None
    rates = [getattr(p, name) for p in members if getattr(p, name) is not None]
    return _spark_line(label, idle or (rate_text(sum(rates)) if rates else "n/a"), data, width, "$success", axis,
                       lambda v: f"{rate_text(v)}/s")


def per_rank_line(members: list[ProcessProbe], width: int) -> Content | None:
    """Each rank's samples (else tokens) a second now, for a job of several (its line above is their sum)."""
    name = "samples_per_s" if any(p.samples is not None for p in members) else "tokens_per_s"
    if len(members) < 2 or all(getattr(p, name.split("_")[0]) is None for p in members):
        return None
    each = "  ".join(f"{p.rank if p.rank is not None else p.pid}: {rate_text(getattr(p, name))}" for p in members)
    return Content.assemble((f"{'per rank':<10}", "bold"), (f"{name.split('_')[0]}/s  {each}", "dim")
                            ).truncate(width, ellipsis=True)


def _loader_line(loader: ProbeLoader, width: int) -> Content:
    """A loader timed apart from the main one: a val loop is not in the job's sparklines."""
    step_now = "n/a" if loader.step_time_s is None else f"{1000 * loader.step_time_s:.1f} ms"
    wait_now = "" if loader.data_wait_fraction is None else f"  data wait {percent_text(100 * loader.data_wait_fraction)}"
    return Content.assemble((f"{printable(loader.name)[:9]:<10}", "bold"), f"{step_now:>9} ",
                            (f"a step{wait_now}  ({plural(loader.steps, 'step')} in all, apart from "
                             "the epochs)", "dim")).truncate(width, ellipsis=True)


def epoch_lines(members: list[ProcessProbe], history: Sequence[Snapshot], width: int) -> tuple[Content,
                                                                                              list[Content]]:
    """The job's epoch table: its header line and a line per epoch, oldest first (rank 0's, or the only
    process's)."""
    lead = members[0]
    rows = epoch_rows(lead, history, {p.pid for p in members}, members)
    head, *body = epoch_table(rows, width, epoch_headers(lead))
    return head, body


def probe_notes(part: ProbesPart, path_width: int | None = None) -> list[str]:
    """Each ignored probe file with its reason, then what the processes could not say; `path_width`: the
    files' paths cut in the middle to that (the folded notes: the file's name and the reason stay)."""
    def where(path: str) -> str:
        return printable(path) if path_width is None else shorten_middle(printable(path), path_width)

    notes = [f"ignored {where(i.path)}: {printable(i.reason)}" for i in part.ignored]
    for p in part.processes:  # (an exited process's ending is on its job's lines)
        notes += _process_notes(p)
    return notes


def _process_notes(p: ProcessProbe) -> list[str]:
    """What a process's probe could not say (what the script did not hand over is said once, on the job's lines)."""
    notes = [f"pid {p.pid} dropped {', '.join(p.truncated)} to fit 4 KiB"] if p.truncated else []
    notes += (f"pid {p.pid}: {printable(why)}" for why in dict.fromkeys(p.unavailable.values()) if why not in NOT_GIVEN)
    unknown = [e for e in p.epochs if e.data_cached_delta_bytes is None]
    if unknown:  # the last one's reason: the Cache Δ column reads n/a
        notes.append(f"pid {p.pid}: Cache Δ n/a: {printable(unknown[-1].data_cached_source or 'the probe gives no figure for its data (an older probe)')}")
    return notes


def folded_notes(notes: list[str], width: int) -> list[Content]:
    """The notes in NOTES_FOLDED lines, each cut to `width`: where there are more, the last line says how many
    and that n shows them all."""
    if len(notes) <= NOTES_FOLDED:
        return [Content(n).truncate(width, ellipsis=True) for n in notes]
    shown = notes[:NOTES_FOLDED - 1]
    more = f"+{len(notes) - len(shown)} more (n shows all the notes)"
    return [*(Content(n).truncate(width, ellipsis=True) for n in shown), Content.assemble((more, "bold"))]


class TaggedScroll(VerticalScroll):
    """A scrolling part of the pane without a scroll bar: a bar's partial cells are the sparklines' block
    characters, and at 80x24 they read as stray fragments of a chart. A line of text says what is out of
    view instead; the pane redraws it as the view moves or the size changes."""

    DEFAULT_CSS = "TaggedScroll { scrollbar-size-vertical: 0; }"

    def _tell(self) -> None:
        pane = next((a for a in self.ancestors if isinstance(a, TrainingPane)), None)
        if pane is not None:
            pane.scrolled(self)

    def watch_scroll_y(self, old: float, new: float) -> None:
        super().watch_scroll_y(old, new)
        self._tell()

    def on_resize(self) -> None:
        self._tell()

    def out_of_view_text(self) -> str:
        """The lines above and below the view ('↑3 ↓5', '↓5'), or '' where all are in it."""
        above = round(self.scroll_y)
        below = max(0, self.virtual_size.height - above - self.size.height) if self.size.height else 0
        return " ".join(([f"↑{above}"] if above else []) + ([f"↓{below}"] if below else []))


class EpochScroll(TaggedScroll):
    """One job's epoch table, scrolled on its own (Up / Down, PgUp / PgDn, Home / End once focused): the
    newest epoch stays in view as epochs close, unless the user scrolled back to older ones."""


class TrainingPane(Pane):
    """Per job: step time, data-wait, throughput and loss sparklines, the bytes held, and the per-epoch
    regression table."""

    PANE_ID = "training"
    TITLE = "Training"
    HELP = ("From the in-process probe (docs/probe.md): step time and data wait over the last 10 s (the slowest "
            "rank; STALLED after 30 s without a step), samples/s, tokens/s and loss where the script hands them "
            "over (track(batch_size=, tokens=), probe.log(loss=), the Lightning / HF callbacks); per epoch its time, "
            "data wait (Load) and the page-cache change of its data. EXITED jobs stay until x.")
    BINDINGS = [Binding("x", "dismiss", "Dismiss exited", id="training.dismiss"),
                Binding("e", "epochs", "Epochs", id="training.epochs"),
                Binding("n", "notes", "Notes", id="training.notes")]
    DEFAULT_CSS = """
    #tr-scroll { height: 1fr; }
    TrainingPane.-one-job #tr-scroll { height: auto; max-height: 75%; }
    #tr-body { height: auto; }
    #tr-epochs-head { height: 1; display: none; }
    #tr-epochs { height: 1fr; display: none; }
    TrainingPane.-one-job #tr-epochs-head, TrainingPane.-one-job #tr-epochs { display: block; }
    #tr-epochs-body { height: auto; }
    #tr-scroll-tag { height: 1; display: none; }
    #tr-notes-box { height: auto; max-height: 3; }
    #tr-notes-box.-open { max-height: 50%; }
    #tr-notes { height: auto; color: $text-muted; }
    """

    def __init__(self) -> None:
        super().__init__()
        self._dismissed: set[tuple[int, int]] = set()  # exited processes (pid, start ticks) the user dismissed
        self._notes: list[str] = []
        self._folded: list[str] = []  # the same, their paths cut to fit a line
        self._notes_open = False
        self._follow = True  # the epoch table follows the newest epoch until the user scrolls back
        self._epoch_head: Content = Content("")

    def _exited(self) -> list[ProcessProbe]:
        part = self.view.snapshot.probes if self.view is not None else None
        if not isinstance(part, ProbesPart):
            return []
        return [p for p in part.exited if (p.pid, p.start_time_ticks) not in self._dismissed]

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "dismiss":
            return bool(self._exited())  # view state only: the files stay (docs/probe.md)
        if action == "epochs":
            return self.has_class("-one-job")  # several jobs: their tables scroll with the tab
        if action == "notes":
            return len(self._notes) > NOTES_FOLDED or self._notes_open
        return True

    def action_dismiss(self) -> None:
        """Take the exited jobs off the tab (their files stay; a later exit shows again)."""
        self._dismissed |= {(p.pid, p.start_time_ticks) for p in self._exited()}
        self._rerender()  # its notes refresh the footer's keys

    def action_epochs(self) -> None:
        """Give the keys to the epoch table, to scroll back to older epochs."""
        self.query_one("#tr-epochs", EpochScroll).focus()

    def action_notes(self) -> None:
        """Show every note (the box grows and scrolls), or fold them back to three lines."""
        self._notes_open = not self._notes_open
        box = self.query_one("#tr-notes-box", TaggedScroll)
        box.set_class(self._notes_open, "-open")
        self._render_notes()
        if self._notes_open:
            box.focus()
        elif box.has_focus:
            self.focus_default()

    def _keys_follow(self) -> None:
        """The tab changed between one job (its epoch table scrolls) and several (the whole tab scrolls): the keys
        go to the part that scrolls now, where they were on the other (a job that appeared after the tab opened
        left them on a part that no longer scrolls: arrows did nothing until Tab was pressed two or three
        times). The notes, opened with n, keep them."""
        focused = self.screen.focused if self.is_attached else None
        if focused is not None and focused.id in ("tr-scroll", "tr-epochs") and self in focused.ancestors:
            self.focus_default()

    def focus_default(self) -> None:
        if self.has_class("-one-job"):
            self.query_one("#tr-epochs", EpochScroll).focus()
        else:
            super().focus_default()

    def compose(self) -> ComposeResult:
        with TaggedScroll(id="tr-scroll"):
            yield Static(id="tr-body")
        yield Static(id="tr-scroll-tag")
        yield Static(id="tr-epochs-head")
        with EpochScroll(id="tr-epochs"):
            yield Static(id="tr-epochs-body")
        with TaggedScroll(id="tr-notes-box"):
            yield Static(id="tr-notes")

    def scrolled(self, scroll: TaggedScroll) -> None:
        """A scrolling part moved or changed size: say what is out of its view (the epoch table in its header,
        the jobs on a line under them)."""
        if isinstance(scroll, EpochScroll):
            self._epochs_scrolled(scroll)
            return
        if scroll.id != "tr-scroll":
            return  # the notes say themselves what is folded
        where = scroll.out_of_view_text()
        tag = self.query_one("#tr-scroll-tag", Static)
        if where:
            keys = "" if scroll.has_focus else ", Tab to scroll"
            set_content(tag, Content.assemble((f"{where} lines out of view{keys}", "dim")))
        tag.display = bool(where)

    def _epochs_scrolled(self, scroll: EpochScroll) -> None:
        """The epoch table follows its newest row until the user scrolls back (then it stays there)."""
        if scroll.scroll_y < scroll.max_scroll_y and scroll.has_focus:
            self._follow = False
        elif scroll.scroll_y >= scroll.max_scroll_y:
            self._follow = True
        self._epoch_header(scroll)

    def _epoch_header(self, scroll: EpochScroll) -> None:
        tag = scroll.out_of_view_text()
        head = self._epoch_head
        width = len(head.plain)
        if tag and width > len(tag) + 6:
            tag = f" {tag} e " if not scroll.has_focus else f" {tag} "
            head = Content.assemble((head.plain[:width - len(tag)] + tag, "bold reverse"))
        set_content(self.query_one("#tr-epochs-head", Static), head)

    def render_view(self, view: View) -> None:
        part = view.snapshot.probes
        body = self.query_one("#tr-body", Static)
        width = max(20, body.size.width or self.size.width - 2)
        one_job: tuple[str, list[ProcessProbe]] | None = None
        if isinstance(part, Unavailable):
            set_content(body, Content.assemble(("probes: ", "bold"), (part.reason, "$warning")))
        elif part is None or not (part.processes or self._exited()):
            set_content(body, Content(NO_PROBE))
        else:
            one_job = self._render_jobs(body, part, view, width)
        if self.has_class("-one-job") != (one_job is not None):
            self.set_class(one_job is not None, "-one-job")
            self._keys_follow()
        if one_job is not None:
            self._render_epochs(*one_job, view.history, width)
        self._take_notes(part if isinstance(part, ProbesPart) else None, width)

    def _take_notes(self, part: ProbesPart | None, width: int) -> None:
        """The notes of `part`, folded back where they fit folded."""
        self._notes = probe_notes(part) if part is not None else []
        self._folded = probe_notes(part, max(16, width // 4)) if part is not None else []
        if self._notes_open and len(self._notes) <= NOTES_FOLDED:
            self._notes_open = False
            self.query_one("#tr-notes-box").set_class(False, "-open")
        self._render_notes()

    def _render_jobs(self, body: Static, part: ProbesPart, view: View, width: int) -> tuple[
            str, list[ProcessProbe]] | None:
        """Every job's lines; the one job (with epochs) whose epoch table scrolls on its own, if there is one."""
        lines: list[Content] = []
        # the viewer's jobs first (then --pid's, the busiest): the one the user watches is not below others'
        grouped = jobs_first(part, [*part.processes, *self._exited()], view.snapshot.gpus)
        now = self.moment(view, time.time)
        one_job = None
        if len(grouped) == 1 and grouped[0][1][0].epochs:
            one_job = grouped[0]
        for key, members in grouped:
            if lines:
                lines.append(Content(""))
            lines.extend(job_lines(key, members, view.history, width, now, with_epochs=one_job is None))
        set_content(body, Content("\n").join(lines))
        return one_job

    def _render_epochs(self, key: str, members: list[ProcessProbe], history: Sequence[Snapshot],
                       width: int) -> None:
        scroll = self.query_one("#tr-epochs", EpochScroll)
        follow = self._follow or scroll.scroll_y >= scroll.max_scroll_y
        head, rows = epoch_lines(members, history, width)
        if len(members) > 1:
            rows.append(epochs_whose(members, width))
        self._epoch_head = head
        set_content(self.query_one("#tr-epochs-body", Static), Content("\n").join(rows))
        self._epoch_header(scroll)
        if follow:
            scroll.scroll_end(animate=False)  # once the new rows are laid out

    def _render_notes(self) -> None:
        notes_widget = self.query_one("#tr-notes", Static)
        width = max(20, notes_widget.size.width or self.size.width - 2)
        if self._notes_open:
            lines = [Content(n) for n in self._notes]
            lines.append(Content.assemble(("(n folds the notes)", "dim")))
        else:
            lines = folded_notes(self._folded, width)
        set_content(notes_widget, Content("\n").join(lines))
        notes_widget.display = bool(self._notes)
        self.query_one("#tr-notes-box").display = bool(self._notes)
        # what check_action reads: the footer's keys change with it
        self._offer((bool(self._exited()), self.has_class("-one-job"), len(self._notes) > NOTES_FOLDED or self._notes_open))
