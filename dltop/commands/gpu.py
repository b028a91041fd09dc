"""`dltop gpu`: the GPU processes, filtered, sorted and grouped as the GPU tab's `/`, `o`, `O` and tree keys do
(one `select_processes`, so the TUI, a replay and this command list the same rows in the same order)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from dltop.model.gpu_query import SORTS, ProcessQuery

CPU_INTERVAL_S = 1.0  # between the two reads: a CPU % over a second, as top shows it

DESCRIPTION = ("The processes on the GPUs with their user, command, GPU memory, SM %, CPU %, host RSS and running "
               "time, as the GPU tab lists them: filtered by text, sorted by a column, grouped under their "
               "launcher. Read twice, a second apart, so CPU % is known (over a second, as top does); or, with --recording, as they were "
               "at a moment of a recording (the last sample unless -t says when).")


def register(sub: argparse._SubParsersAction) -> None:
    """Add `dltop gpu`."""
    from dltop.commands.common import add_common_options

    p = sub.add_parser("gpu", help="GPU processes: filter, sort, tree (the GPU tab's process table)",
                       description=DESCRIPTION)
    p.add_argument("--filter", default="", metavar="TEXT",
                   help="only the processes whose pid, user, command or GPU holds TEXT (any case)")
    p.add_argument("--sort", choices=tuple(SORTS), default="memory",
                   help="sort column (default memory; biggest first, names and pids A-Z)")
    p.add_argument("--reverse", action="store_true", help="the other way round")
    p.add_argument("--tree", action="store_true", help="ranks under their launcher (same parent, two or more)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON (each process's every field)")
    p.add_argument("--recording", metavar="PATH",
                   help="read a recording (a directory or one segment file) instead of the live GPUs")
    p.add_argument("-t", "--time", metavar="TIME",
                   help="with --recording: the sample on screen at TIME ('10m ago', 14:05, ISO 8601, epoch, start, "
                        "end; default end)")
    add_common_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the GPU processes the options select."""
    from dltop.fmt import printable
    from dltop.model.base import Unavailable
    from dltop.text.gpu import process_table

    query = ProcessQuery(filter=args.filter, sort=args.sort, reverse=args.reverse, tree=args.tree)
    gap: str | None = None  # a typed time inside a gap of the recording, said so
    if args.recording is None:
        part, now = _live(args)
    else:
        part, now, gap = _recorded(args.recording, args.time)
    if args.json:
        _print_json(part, query, now if args.recording is not None else None, gap)
        return 0
    if args.recording is not None:
        sys.stdout.write(f"at {time.strftime('%Y-%m-%d %H:%M:%S %Z', time.localtime(now))} (recorded)\n")
    if gap is not None:
        sys.stdout.write(gap + "\n")
    if isinstance(part, Unavailable):
        sys.stdout.write(f"no GPUs: {printable(part.reason)}\n" if part.absent else f"GPUs: {printable(part.reason)}\n")
        return 0 if part.absent else 1
    sys.stdout.write(process_table(part, query, now) + "\n")
    return 0


def _live(args: argparse.Namespace) -> tuple[Any, float]:
    """The live GPU part, read twice: a CPU % is the CPU time between two reads over the time between them (over
    a second, as top's, in 1% steps: CPU time counts in 10 ms ticks), and the time of the second read."""
    from dltop.config import settings_from_args
    from dltop.errors import DltopError
    from dltop.sources.gpu import source

    if args.time is not None:
        raise DltopError("-t/--time needs --recording (the live GPUs are read now)")
    src = source(settings_from_args(args))
    try:
        src.read()
        time.sleep(CPU_INTERVAL_S)
        part = src.read()
    finally:
        if src.close is not None:
            src.close()
    return part, time.time()


def _print_json(part: Any, query: ProcessQuery, ts: float | None, gap: str | None) -> None:
    """The selected rows as JSON, each process's every field; `ts` the recorded sample's time (None live)."""
    from dltop.model.base import Unavailable, to_dict
    from dltop.model.gpu_query import select_processes

    rows = [{"key": r.key, "place": r.place, "pid": r.pid, "depth": r.depth, "children": r.children,
             **({"user": r.user, "command": r.command} if r.process is None else {}),
             "process": None if r.process is None else to_dict(r.process)} for r in select_processes(part, query)]
    out: dict[str, object] = {"query": to_dict(query), "rows": rows}
    if ts is not None:
        out["ts"] = ts
    if gap is not None:
        out["gap"] = gap
    if isinstance(part, Unavailable):
        out["unavailable"] = part.reason
    sys.stdout.write(json.dumps(out, indent=2) + "\n")


def _recorded(path: str, when: str | None) -> tuple[Any, float, str | None]:
    """The GPU part of the recording's sample `when` names (as replay's -t: the one shown then, the first taken
    within a whole second typed; the last one by default), its time, and where `when` falls inside a gap of the
    recording the words that say so; what of the recording was damaged is said on stderr, as replay and dump do."""
    from dltop.commands.record import damage_note
    from dltop.errors import DltopError
    from dltop.model.base import Unavailable
    from dltop.recorder import Recording, parse_time
    from dltop.recorder.times import gap_note, index_typed, meta_interval

    rec = Recording(path)
    try:
        times = rec.times()
        if not times:
            raise DltopError(f"{path}: the recording holds no samples")
        ts = times[-1] if when is None else parse_time(when, time.time(), rec)
        if ts < times[0]:
            raise DltopError(f"-t {when}: before the recording starts "
                             f"({time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(times[0]))})")
        snap = rec.at(times[index_typed(times, ts)])
        gap = gap_note(times, ts, meta_interval(rec.meta), snap.ts)
    finally:
        damage_note("gpu", rec)
    part = snap.gpus
    if part is None:
        part = Unavailable("the recording holds no GPU part at that moment (recorded without the GPU source)")
    return part, snap.ts, gap
