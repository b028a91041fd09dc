"""The GPU process listing as plain text: the rows `select_processes` picks (filter, sort, tree), as `dltop gpu`
prints them; the Time cell's text is the GPU pane's too, so it lives below both."""

from __future__ import annotations

import re
from collections.abc import Sequence

from dltop.fmt import human_bytes, printable
from dltop.model.base import Unavailable
from dltop.model.gpu import GpuDevice
from dltop.model.gpu_query import ProcessQuery, ProcessRow, select_processes

# An interpreter whose path says nothing: the script after it names the process ("python3.11", "pypy3").
_INTERPRETER = re.compile(r"(python|pypy|python\d+(\.\d+)*|pypy\d+(\.\d+)*)[a-z]?(\.exe)?")
# Python options that take the next word as their value (python -W ignore -X dev train.py)
_PY_VALUE_OPTIONS = ("-W", "-X", "-Q")


def short_command(command: str) -> str:
    """What identifies a process when the room is short: the program's name without its folder, and for an
    interpreter the script (its name) or `-m module`, then the arguments as they are (`/usr/bin/python3
    /home/a/train.py --lr 3e-4` -> `python3 train.py --lr 3e-4`). A command line is one string here (the
    arguments joined by spaces, as ps shows them), so it is split on spaces; the whole one is shown elsewhere."""
    program, *rest = command.split(" ")
    if not program or command.startswith("["):
        return command  # "[comm]": a zombie or a kernel thread, as ps shows it
    program = program.rsplit("/", 1)[-1] or program
    return " ".join(_interpreted(program, rest) if _INTERPRETER.fullmatch(program) else [program, *rest])


def _interpreted(program: str, rest: list[str]) -> list[str]:
    """An interpreter's words: its script's name (or `-m module`) first; a launcher it runs (torchrun, deepspeed,
    accelerate: no '.' in the name) is named by itself."""
    i = 0
    while i < len(rest) and rest[i].startswith("-") and rest[i] not in ("-m", "-c", "-"):
        i += 2 if rest[i] in _PY_VALUE_OPTIONS else 1  # -u, -O, -B, -W ignore: how it runs, not what
    if i >= len(rest) or rest[i].startswith("-"):
        return [program, *rest[i:]]
    script = rest[i].rsplit("/", 1)[-1] or rest[i]
    return [script, *rest[i + 1:]] if "." not in script else [program, script, *rest[i + 1:]]


def pids_text(pids: Sequence[int]) -> str:
    """"pid 7" or "pids 7, 9"."""
    return f"{'pid' if len(pids) == 1 else 'pids'} {', '.join(map(str, pids))}"


HEADER = ("GPU", "PID", "USER", "USED", "SM%", "CPU%", "RSS", "TIME", "COMMAND")


def elapsed(started_at: float | None, now: float) -> str:
    """How long a process has run, to the minute ("<1m", "42m", "3h05", "2d04h"): a cell that changes once a
    minute, not once a tick, for 160 rows."""
    if started_at is None:
        return "?"
    minutes = max(0, int(now - started_at)) // 60
    if minutes < 1:
        return "<1m"
    if minutes < 60:
        return f"{minutes}m"
    if minutes < 24 * 60:
        return f"{minutes // 60}h{minutes % 60:02d}"
    return f"{minutes // 1440}d{minutes // 60 % 24:02d}h"


def elapsed_until(started_at: float | None, now: float) -> float:
    """When `elapsed(started_at, now)` next reads otherwise (the next whole minute of its run; never for '?'), a
    millisecond early: the float subtraction in `elapsed` may turn the minute a hair before the exact sum (early
    costs one build more; late would show a stale cell)."""
    if started_at is None:
        return float("inf")
    return started_at + 60 * (max(0, int(now - started_at)) // 60 + 1) - 1e-3


def _row(r: ProcessRow, now: float) -> tuple[str, ...]:
    p = r.process
    if p is None:  # a launcher the ranks under it share (from their ppid), with its user and command
        return ("", str(r.pid), printable(r.user or "?"), "", "", "", "", "",
                f"[{r.children} ranks] {printable(r.command or '?')}")
    branch = ("└ " if r.last else "├ ") if r.depth else ""
    return (r.place, str(p.pid), printable(p.user or "?"), human_bytes(p.used_bytes, missing="?"),
            "?" if p.gpu_util_percent is None else f"{p.gpu_util_percent:.0f}",
            "?" if p.cpu_percent is None else f"{p.cpu_percent:.0f}",
            human_bytes(p.host_rss_bytes, missing="?"), elapsed(p.started_at, now),
            branch + printable(p.command or "?"))


def process_table(gpus: Sequence[GpuDevice] | Unavailable | None, query: ProcessQuery, now: float) -> str:
    """The processes the query selects, one line each under a header, columns aligned (the command last, whole);
    '?' where a number is unknown (the JSON says why)."""
    rows = [HEADER, *(_row(r, now) for r in select_processes(gpus, query))]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1]
             for row in rows]
    return "\n".join(line.rstrip() for line in lines)
