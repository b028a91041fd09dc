"""The GPU process listing as plain text: the rows `select_processes` picks (filter, sort, tree), as `dltop gpu`
prints them; the Time cell's text is the GPU pane's too, so it lives below both."""

from __future__ import annotations

from collections.abc import Sequence

from dltop.fmt import human_bytes, printable
from dltop.model.base import Unavailable
from dltop.model.gpu import GpuDevice
from dltop.model.gpu_query import ProcessQuery, ProcessRow, select_processes

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
    if p is None:  # a launcher the ranks under it share: only its pid is known (from their ppid)
        return ("", str(r.pid), "", "", "", "", "", "", f"[launcher of {r.children}]")
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
