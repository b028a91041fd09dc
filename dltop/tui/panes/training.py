"""The Training pane: per job (its ranks grouped) what the in-process probe says — step time and data-wait
sparklines, the bytes it holds, and the epoch table (time, load time, data-wait %, page-cache delta, GPU util).

Numbers come from the Snapshot's `probes` part (docs/probe.md); GPU utilisation over an epoch is NVML's, from the
GPU samples of dltop's own history over the epoch's span (the probe reads no NVML). Probe files dltop did not read
are in the notes with their reasons.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.content import Content
from textual.widgets import Static

from dltop.fmt import human_bytes, percent_text, plural, printable, shorten_middle, sparkline_rows
from dltop.model import Snapshot, Unavailable
from dltop.model.probes import ProbeEpoch, ProbesPart, ProcessProbe
from dltop.tui.panes.base import Pane, set_content
from dltop.tui.view import View

NO_PROBE = ("No process publishes a probe. Add one to the training script:\n"
            "    from dltop import probe\n"
            "    probe.start(); probe.watch_model(model)\n"
            "    for batch in probe.track(loader): ...\n"
            "    probe.mark_epoch()   # at the end of each epoch\n"
            "or start it without changing the script: DLTOP_PROBE=1 python train.py\n"
            "(docs/probe.md)")
SPARK_LABEL_WIDTH = 20  # "Data wait" padded to 10, the value right-aligned in 9, a space
EPOCH_HEADERS = ("Epoch", "Time", "Load", "Wait%", "Cache Δ", "Steps", "GPU util")


def jobs(probes: Sequence[ProcessProbe]) -> dict[str, list[ProcessProbe]]:
    """The probes grouped by job (`ProcessProbe.job_key`), each job's ranks in rank order (live and exited
    processes alike: one rank that died beside ranks that wait for it is one job)."""
    out: dict[str, list[ProcessProbe]] = {}
    for p in probes:
        out.setdefault(p.job_key, []).append(p)
    for members in out.values():
        members.sort(key=lambda p: (p.rank if p.rank is not None else -1, p.pid))
    return out


def series(history: Sequence[Snapshot], key: str, name: str) -> list[float]:
    """A job's `step_time_s` or `data_wait_fraction` over the history: the slowest rank's at each Snapshot (the
    slowest sets the pace of a synchronous job)."""
    out = []
    for s in history:
        if not isinstance(s.probes, ProbesPart):
            continue
        values = [getattr(p, name) for p in s.probes.processes if p.job_key == key and getattr(p, name) is not None]
        if values:
            out.append(float(max(values)))
    return out


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


def epoch_rows(p: ProcessProbe, history: Sequence[Snapshot], pids: set[int]) -> list[tuple[str, ...]]:
    """One row per epoch the probe kept, oldest first."""
    rows: list[tuple[str, ...]] = []
    for e in p.epochs:
        util, source = epoch_gpu_util(history, pids, e)
        delta = e.data_cached_delta_bytes  # the job's own data, never the machine's Cached (notes say why n/a)
        rows.append((
            str(e.index), _seconds(e.duration_s), _seconds(e.data_wait_s),
            percent_text(100 * e.data_wait_s / e.duration_s) if e.duration_s > 0 else "n/a",
            "n/a" if delta is None else ("-" if delta < 0 else "+") + human_bytes(abs(delta)),
            str(e.steps),
            f"{percent_text(util)} ({source})" if util is not None else f"n/a ({source})",
        ))
    return rows


def epoch_table(rows: list[tuple[str, ...]], width: int) -> list[Content]:
    """A bold header line and the rows, right-aligned but the last column, cut to `width`."""
    table = [EPOCH_HEADERS, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(EPOCH_HEADERS) - 1)]

    def line(r: tuple[str, ...]) -> str:
        return ("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1])[:width]

    return [Content.assemble((line(EPOCH_HEADERS).ljust(width)[:width], "bold reverse")),
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


def status_lines(members: list[ProcessProbe], now: float, width: int) -> list[Content]:
    """What a job's ranks are doing if not training: stalled (no step for a while: a hung rank) or exited (how it
    ended, when the probe could say)."""
    several = len(members) > 1
    lines = []
    for p in members:
        who = (f"rank {p.rank} " if p.rank is not None else f"pid {p.pid} ") if several else ""
        if p.exited:
            ago = f" {_ago(max(0.0, now - p.exited_at))} ago" if p.exited_at is not None else ""
            lines.append(Content.assemble((f"{who}EXITED{ago}", "bold $error"), f"  {printable(p.ended)}"))
        elif p.stalled and p.last_step_age_s is not None:
            step = f" (its steps took {_seconds(p.last_step_s)})" if p.last_step_s else ""
            lines.append(Content.assemble((f"{who}STALLED", "bold $error"),
                                          f"  no step for {_ago(p.last_step_age_s)}{step}"))
    return [c.truncate(width, ellipsis=True) for c in lines]


def _title(members: list[ProcessProbe], width: int) -> Content:
    first = members[0]
    if len(members) > 1 or first.rank is not None:
        ranks = [str(p.rank) for p in members if p.rank is not None]
        world = f" of {first.world_size}" if first.world_size is not None else ""
        who = f"{plural(len(members), 'rank')} {','.join(ranks)}{world}  pids {','.join(str(p.pid) for p in members)}"
    else:
        who = f"pid {first.pid}"
    return Content.assemble((who, "bold"), "  ", short_cmd(first.cmd)).truncate(width, ellipsis=True)


def _facts(p: ProcessProbe, width: int) -> Content:
    def onoff(v: bool | None) -> str:
        return "?" if v is None else "on" if v else "off"

    bits = [f"weights {human_bytes(p.weights_bytes, missing='?')}", f"grads {human_bytes(p.gradients_bytes, missing='?')}",
            f"optim {human_bytes(p.optimizer_bytes, missing='?')}", f"KV {human_bytes(p.kv_bytes, missing='?')}",
            f"workers {p.loader_workers if p.loader_workers is not None else '?'}",
            f"pin {onoff(p.pin_memory)}", f"shapes {p.input_shapes if p.input_shapes is not None else '?'}",
            f"cudnn.benchmark {onoff(p.cudnn_benchmark)}"]
    if p.optimizer_steps is not None:
        bits.append(f"optimizer steps {p.optimizer_steps}")
    if "recompiles" in p.compile:
        bits.append(f"recompiles {p.compile['recompiles']}")
    if p.compile.get("eager_fallbacks"):  # frames dynamo stopped compiling at its recompile limit
        bits.append(f"eager fallbacks {p.compile['eager_fallbacks']}")
    retries = sum(d.memory_stats.get("num_alloc_retries", 0) for d in p.devices)
    ooms = sum(d.memory_stats.get("num_ooms", 0) for d in p.devices)
    if any("num_ooms" in d.memory_stats for d in p.devices):
        bits.append(f"retries {retries} OOMs {ooms}")
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


def job_lines(key: str, members: list[ProcessProbe], history: Sequence[Snapshot], width: int,
              height: int | None = None, now: float | None = None) -> list[Content]:
    """A job: its title, whether it stalled or exited, its facts, its two sparklines and its epoch table; with a
    `height`, the newest epochs that fit in it (the job alone on the tab), else all of them (several jobs
    scroll)."""
    lead = members[0]  # rank 0 (or the only process) speaks for the job's epochs
    now = time.time() if now is None else now
    lines = [_title(members, width), *status_lines(members, now, width), _facts(lead, width)]
    spark_width = max(1, width - SPARK_LABEL_WIDTH)
    step = series(history, key, "step_time_s")
    wait = series(history, key, "data_wait_fraction")
    now_step = max((p.step_time_s for p in members if p.step_time_s is not None), default=None)
    now_wait = max((p.data_wait_fraction for p in members if p.data_wait_fraction is not None), default=None)
    # a number of the recent window only: a loop that stopped or a process that exited has none now
    idle = "exited" if all(p.exited for p in members) else "stalled" if any(p.stalled for p in members) else None
    for label, value, data, top, style in (
        ("Step", idle or ("n/a" if now_step is None else f"{1000 * now_step:.1f} ms"), step, None, "$accent"),
        ("Data wait", idle or ("n/a" if now_wait is None else percent_text(100 * now_wait)), wait, 1.0, "$warning"),
    ):
        bar = sparkline_rows(data, spark_width, 1, top)[0] if data else ""
        lines.append(Content.assemble((f"{label:<10}", "bold"), f"{value:>9} ", (bar, style)))
    for loader in lead.loaders:  # timed apart from the main loader: a val loop is not in the numbers above
        step_now = "n/a" if loader.step_time_s is None else f"{1000 * loader.step_time_s:.1f} ms"
        wait_now = "" if loader.data_wait_fraction is None else f"  data wait {percent_text(100 * loader.data_wait_fraction)}"
        lines.append(Content.assemble((f"{printable(loader.name)[:9]:<10}", "bold"), f"{step_now:>9} ",
                                      (f"a step{wait_now}  ({plural(loader.steps, 'step')} in all, apart from "
                                       "the epochs)", "dim")).truncate(width, ellipsis=True))
    if lead.epochs:
        pids = {p.pid for p in members}
        who = f" (rank {lead.rank}'s)" if len(members) > 1 else ""
        rows = epoch_rows(lead, history, pids)
        used = sum(c.plain.count("\n") + 1 for c in lines)  # the facts take up to three lines
        room = None if height is None else max(2, height - used - 1 - bool(who))
        if room is not None and len(rows) > room:
            hidden, rows = len(rows) - room + 1, rows[len(rows) - room + 1:]
            head, *body = epoch_table(rows, width)
            lines += [head, Content.assemble((f"… {plural(hidden, 'earlier epoch')} not shown (a taller "
                                              "terminal shows them)", "dim")), *body]
        else:
            lines.extend(epoch_table(rows, width))
        if who:
            lines.append(Content.assemble((f"epochs{who}", "dim")))
    else:
        lines.append(Content.assemble(("no epoch closed yet (probe.mark_epoch())", "dim")))
    return lines


def probe_notes(part: ProbesPart) -> list[str]:
    """Each ignored probe file with its reason, then what the processes could not say."""
    notes = [f"ignored {printable(i.path)}: {printable(i.reason)}" for i in part.ignored]
    for p in part.processes:  # (an exited process's ending is on its job's lines)
        if p.truncated:
            notes.append(f"pid {p.pid} dropped {', '.join(p.truncated)} to fit 4 KiB")
        for why in dict.fromkeys(p.unavailable.values()):
            notes.append(f"pid {p.pid}: {printable(why)}")
        unknown = [e for e in p.epochs if e.data_cached_delta_bytes is None]
        if unknown:  # the last one's reason: the Cache Δ column reads n/a
            notes.append(f"pid {p.pid}: Cache Δ n/a: {printable(unknown[-1].data_cached_source or 'the probe gives no figure for its data (an older probe)')}")
    return notes


class TrainingPane(Pane):
    """Per job: step time and data-wait sparklines, the bytes held, and the per-epoch regression table."""

    PANE_ID = "training"
    TITLE = "Training"
    HELP = ("Numbers come from the in-process probe (dltop.probe, docs/probe.md): step time and data wait over the "
            "steps of the last 10 s (the slowest rank of a job; none when the loop stopped: STALLED after 30 s and "
            "20 steps' time without one), and per epoch its time, the time spent waiting for data "
            "(Load), the page-cache change (Cached in /proc/meminfo at the end minus the start) and the GPU "
            "utilisation NVML gave dltop over the epoch. Ranks of one job are grouped by torchrun's run id or "
            "MASTER_ADDR:MASTER_PORT, else torchrun's agent. A job that exited "
            "stays, marked EXITED with how it ended, until x dismisses it.")
    BINDINGS = [Binding("x", "dismiss", "Dismiss exited", id="training.dismiss")]
    DEFAULT_CSS = """
    #tr-scroll { height: 1fr; }
    #tr-body { height: auto; }
    #tr-notes { height: auto; max-height: 3; color: $text-muted; }
    """

    def __init__(self) -> None:
        super().__init__()
        self._dismissed: set[tuple[int, int]] = set()  # exited processes (pid, start ticks) the user dismissed

    def _exited(self) -> list[ProcessProbe]:
        part = self.view.snapshot.probes if self.view is not None else None
        if not isinstance(part, ProbesPart):
            return []
        return [p for p in part.exited if (p.pid, p.start_time_ticks) not in self._dismissed]

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "dismiss":
            return bool(self._exited())  # view state only: the files stay (docs/probe.md)
        return True

    def action_dismiss(self) -> None:
        """Take the exited jobs off the tab (their files stay; a later exit shows again)."""
        self._dismissed |= {(p.pid, p.start_time_ticks) for p in self._exited()}
        if self.view is not None:
            self.render_view(self.view)
        self.refresh_bindings()

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="tr-scroll"):
            yield Static(id="tr-body")
        yield Static(id="tr-notes")

    def render_view(self, view: View) -> None:
        part = view.snapshot.probes
        body = self.query_one("#tr-body", Static)
        notes_widget = self.query_one("#tr-notes", Static)
        width = max(20, body.size.width or self.size.width - 2)
        notes: list[str] = []
        if isinstance(part, Unavailable):
            set_content(body, Content.assemble(("probes: ", "bold"), (part.reason, "$warning")))
        elif part is None or not (part.processes or self._exited()):
            set_content(body, Content(NO_PROBE))
        else:
            lines: list[Content] = []
            grouped = jobs([*part.processes, *self._exited()])
            now = self.moment(view, time.time)
            height = self.query_one("#tr-scroll").size.height or None if len(grouped) == 1 else None
            for key, members in grouped.items():
                if lines:
                    lines.append(Content(""))
                lines.extend(job_lines(key, members, view.history, width, height, now))
            set_content(body, Content("\n").join(lines))
        if isinstance(part, ProbesPart):
            notes = probe_notes(part)
        set_content(notes_widget, Content("; ".join(notes)))
        notes_widget.display = bool(notes)
