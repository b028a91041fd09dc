"""The GPU tab's keys on processes: tagging (s, S), a signal to the tagged ones or the selected one (k), and the
selected one's environment (e). The pane binds the keys and keeps the rows and the tags; these do the work."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from textual.app import App
from textual.widget import Widget

from dltop.model.actions import SignalTarget
from dltop.model.gpu import GpuProcess
from dltop.model.gpu_query import ProcessRow
from dltop.text.gpu import pids_text
from dltop.tui.messages import SignalRequested

if TYPE_CHECKING:
    from dltop.tui.screens.signal import SignalScreen

TagKey = tuple[int, int | None]


def tag_key(p: GpuProcess) -> TagKey:
    """A tagged process: its pid and start time (a process on two GPUs is one; a reused pid another)."""
    return (p.pid, p.start_time_ticks)


def toggle_tags(tagged: dict[TagKey, GpuProcess], row: ProcessRow, rows: Iterable[ProcessRow]) -> None:
    """Tag the row's process, or untag it; on a launcher's row its ranks, all tagged (all untagged where all were)."""
    if row.process is not None:
        chosen = {tag_key(row.process): row.process}
    else:
        chosen = {tag_key(r.process): r.process for r in rows
                  if r.process is not None and r.depth and r.process.ppid == row.pid}
    if chosen.keys() <= tagged.keys():
        for key in chosen:
            del tagged[key]
    else:
        tagged.update(chosen)


def untag_gone(tagged: dict[TagKey, GpuProcess], rows: Iterable[ProcessRow]) -> None:
    """Untag the processes not among `rows` (exited, or filtered out): never signalled unseen."""
    present = {tag_key(r.process) for r in rows if r.process is not None}
    for gone in [k for k in tagged if k not in present]:
        del tagged[gone]


def _refusal(row: ProcessRow | None, tagged: Sequence[GpuProcess]) -> str | None:
    """Why `k` sends nothing: a start time not known (the pid may be reused since), or a launcher's row."""
    if tagged:
        unknown = [p.pid for p in tagged if p.start_time_ticks is None]
        return (f"{pids_text(unknown)} not in dltop's /proc: their start time cannot be checked, so no signal is "
                "sent (untag them with s)") if unknown else None
    p = row.process if row is not None else None
    if row is not None and p is None:
        return f"pid {row.pid} is the launcher of the ranks under it, not a GPU process: select a rank"
    if p is not None and p.start_time_ticks is None:
        return f"pid {p.pid} is not in dltop's /proc: its start time cannot be checked, so no signal is sent"
    return None


def ask_signal(pane: Widget, row: ProcessRow | None, tagged: Sequence[GpuProcess], untag: Callable[[], None]) -> None:
    """The signal dialog for the tagged processes, else for the selected row's. The signal chosen is posted from
    `pane` (the runner checks each start time again before its send), and the tags are spent (`untag`)."""
    why = _refusal(row, tagged)
    if why is not None:
        pane.app.notify(why, severity="warning")
        return
    if tagged:
        procs = list(tagged)
    elif row is not None and row.process is not None:
        procs = [row.process]
    else:
        return
    targets = tuple(SignalTarget(pid=p.pid, start_time_ticks=p.start_time_ticks or 0, command=p.command or "")
                    for p in procs)

    def chosen(sig: str | None) -> None:
        if sig is None:
            return
        sent = tuple(replace(t, signal=sig) for t in targets)
        pane.post_message(SignalRequested(sent if tagged else sent[0]))
        if tagged:
            untag()

    pane.app.push_screen(_dialog(procs), chosen)


def _dialog(procs: Sequence[GpuProcess]) -> SignalScreen:
    """The dialog for one process, or (two or more) for the tagged set."""
    from dltop.tui.screens.signal import SignalScreen

    first = procs[0]
    return SignalScreen(first.pid, first.user or "?", first.command or "?", started_at=first.started_at,
                        processes=[(p.pid, p.user or "?", p.started_at, p.command or "?") for p in procs])


def show_environment(app: App[object], row: ProcessRow) -> None:
    """The row's process's environment (its owner's or root's to read; secrets masked), or why it is not read."""
    p = row.process
    if p is None or p.start_time_ticks is None:
        why = ("is the launcher of the ranks under it: select a rank" if p is None else
               "is not in dltop's /proc: its start time cannot be checked")
        app.notify(f"pid {row.pid} {why}; no environment read", severity="warning")
        return
    from dltop.tui.screens.environ import show_environ

    show_environ(app, p.pid, p.start_time_ticks, p.user or "?", p.command or "?")
