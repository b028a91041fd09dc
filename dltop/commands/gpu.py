"""`dltop gpu`: the GPU processes, filtered, sorted and grouped as the GPU tab's `/`, `o`, `O` and tree keys do
(one `select_processes`, so the TUI, a replay and this command list the same rows in the same order)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from dltop.model.gpu_query import SORTS, ProcessQuery

DESCRIPTION = ("The processes on the GPUs with their user, command, GPU memory, SM %, CPU %, host RSS and running "
               "time, as the GPU tab lists them: filtered by text, sorted by a column, grouped under their "
               "launcher. Read twice, half a second apart, so CPU % is known.")


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
    add_common_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the GPU processes the options select."""
    from dltop.config import settings_from_args
    from dltop.model.base import Unavailable, to_dict
    from dltop.sources.gpu import source
    from dltop.sources.gpu_procs import MIN_INTERVAL_S
    from dltop.text.gpu import process_table

    query = ProcessQuery(filter=args.filter, sort=args.sort, reverse=args.reverse, tree=args.tree)
    src = source(settings_from_args(args))
    try:
        src.read()
        time.sleep(MIN_INTERVAL_S)  # a CPU % is the CPU time between two reads over the time between them
        part = src.read()
    finally:
        if src.close is not None:
            src.close()
    if args.json:
        from dltop.model.gpu_query import select_processes

        rows = [{"key": r.key, "place": r.place, "pid": r.pid, "depth": r.depth, "children": r.children,
                 "process": None if r.process is None else to_dict(r.process)} for r in select_processes(part, query)]
        out = {"query": to_dict(query), "rows": rows}
        if isinstance(part, Unavailable):
            out["unavailable"] = part.reason
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
        return 0
    if isinstance(part, Unavailable):
        from dltop.fmt import printable

        sys.stdout.write(f"no GPUs: {printable(part.reason)}\n" if part.absent else f"GPUs: {printable(part.reason)}\n")
        return 0 if part.absent else 1
    sys.stdout.write(process_table(part, query, time.time()) + "\n")
    return 0
