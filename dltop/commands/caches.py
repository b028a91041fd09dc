"""`dltop caches`: every compile and model cache, where its tool puts it (and by which rule), how big it is, and
what is wrong with it. `dltop caches clear NAME` clears one (or an entry of one) through the action runner."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from dltop.errors import DltopError, UsageError


def register(sub: argparse._SubParsersAction) -> None:
    """Add `dltop caches` and `dltop caches clear NAME`."""
    from dltop.commands.common import add_cache_option, add_common_options

    p = sub.add_parser("caches", help="compile and model caches: where, how big, warnings; clear one",
                       description=__doc__)
    p.add_argument("what", nargs="*", metavar="clear NAME",
                   help="clear cache NAME (torchinductor, triton, hf_hub, ...) or a path inside a known cache")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--yes", action="store_true", help="clear without asking")
    p.add_argument("--dry-run", action="store_true", help="say what a clear would remove, remove nothing")
    p.add_argument("--no-progress", action="store_true", help="no progress bar, even on a terminal")
    add_cache_option(p)
    add_common_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """List the caches, or clear one."""
    from dltop.commands.common import check_pid
    from dltop.config import settings_from_args

    settings = settings_from_args(args)
    check_pid(settings.pid, settings.root)
    if not args.what:
        if args.yes or args.dry_run:
            raise UsageError("error: --yes and --dry-run go with `clear NAME` (see dltop caches --help)")
        return _list(args, settings)
    if args.what[0] != "clear" or len(args.what) != 2:
        raise UsageError(f"error: expected `clear NAME`, got {' '.join(args.what)!r} "
                         "(see dltop caches --help)")
    return _clear(args, settings, args.what[1])


def _number(value: Any, c: Any, name: str) -> Any:
    return value if value is not None else {"unavailable": c.unavailable.get(name, "not measured")}


def cache_json(c: Any, now: float) -> dict[str, Any]:
    """One cache as `dltop caches --json` prints it: a missing number is {"unavailable": reason}."""
    from dltop.hints.caches import warnings_for
    from dltop.model.base import to_dict

    return {"name": c.name, "label": c.label, "path": to_dict(c.path), "source": c.source, "exists": c.exists,
            "size_bytes": _number(c.size_bytes, c, "size_bytes"), "files": _number(c.files, c, "files"),
            "newest_mtime": _number(c.newest_mtime, c, "newest_mtime"),
            "oldest_mtime": _number(c.oldest_mtime, c, "oldest_mtime"), "complete": c.complete,
            "warnings": warnings_for(c, now), "settings": c.settings, "clear_command": c.clear_command,
            "noted": c.noted, "apparent_bytes": _number(c.apparent_bytes, c, "size_bytes"),
            "newest_atime": c.newest_atime, "via_symlink": c.via_symlink, "entries": [to_dict(e) for e in c.entries],
            "more_entries": c.more_entries, "more_bytes": c.more_bytes, "folders": [to_dict(f) for f in c.folders]}


def _list(args: argparse.Namespace, settings: Any) -> int:
    from dltop.model.base import Unavailable
    from dltop.sources.caches import CachesReader, settings_environment

    part = CachesReader(settings_environment(settings), settings.caches, settings.root).read()
    if isinstance(part, Unavailable):
        if args.json:
            sys.stdout.write(json.dumps({"unavailable": part.reason}) + "\n")
            return 1
        raise DltopError(part.reason)
    now = time.time()
    if args.json:
        sys.stdout.write(json.dumps({"environment": part.environment, "exited": part.exited,
                                     "caches": [cache_json(c, now) for c in part.caches]}) + "\n")
        return 0
    from dltop.hints.caches import warnings_for
    from dltop.text.caches import format_caches

    sys.stdout.write(format_caches(part, {c.name: warnings_for(c, now) for c in part.caches}, now))
    return 0


def _target(name: str, settings: Any, options: Any) -> str:
    """The path NAME stands for: a known cache's name, or a path (inside a known cache, the clear checks)."""
    from dltop.sources.caches import environment_error, resolve

    if "/" in name:
        return os.path.abspath(name)
    try:
        known = resolve(options.environment(), settings.caches)
    except OSError as e:
        raise DltopError(environment_error(e)) from None
    loc = next((c for c in known if c.name == name), None)
    if loc is None:
        raise DltopError(f"no cache called {name!r} (known: {', '.join(c.name for c in known)})")
    return loc.path


def _confirmed(what: str) -> bool:
    """The user said yes on the terminal; DltopError where there is no terminal to ask on."""
    if not sys.stdin.isatty():
        raise DltopError(f"not clearing {what}: no terminal to ask on; give --yes to clear without asking")
    return input(f"Clear {what}? [y/N] ").strip().lower() in ("y", "yes")


def _print_plan(args: argparse.Namespace, plan: Any, what: str) -> int:
    """A refused clear (1; DltopError where the output is not JSON) or a dry run (0), as planned."""
    from dltop.fmt import printable

    if args.json:
        from dltop.model.base import to_dict

        sys.stdout.write(json.dumps(to_dict(plan)) + "\n")
    elif not plan.allowed:
        raise DltopError(plan.guard)
    else:
        print(f"would clear {what}")
        for n in plan.notes:
            print(f"note: {printable(n)}")
    return 0 if plan.allowed else 1


def _print_cleared(args: argparse.Namespace, r: Any, signals: list[int]) -> int:
    """What the clear did, measured; the exit status: 128 + the signal that cancelled it, 1 where a name was not
    removed or blocks are still held (the clear did not finish), else 0."""
    from dltop.actions.caches import summary
    from dltop.fmt import printable

    if args.json:
        sys.stdout.write(json.dumps(r.to_dict()) + "\n")
    else:
        print(printable(summary(r)))
        for p in r.problems[:5]:
            print(f"  {printable(p)}")
    if signals:
        return 128 + signals[0]
    return 1 if r.left_behind else 0


def _run_clear(runner: Any, path: str, options: Any, progress: bool) -> tuple[Any, list[int]]:
    """The clear run to its end (a progress bar on stderr with `progress`); its result and the signals that
    cancelled it."""
    from dltop.commands.pagecache import ProgressBar, cancelled_by_signals, wait_for

    bar = ProgressBar() if progress else None
    if bar is not None:
        runner.subscribe(lambda ev: bar(ev) if ev.phase == "progress" else None)
    with cancelled_by_signals(runner) as (signals, _stop):
        try:
            run = runner.start("clear", [path], options=options)
            wait_for(run)
            if bar is not None:
                bar.close()
            if run.error is not None:
                raise run.error
        finally:
            runner.close()
    return run.result, signals


def _clear(args: argparse.Namespace, settings: Any, name: str) -> int:
    from dltop.actions.caches import ClearOptions
    from dltop.actions.runner import SPECS, ActionRunner
    from dltop.fmt import human_bytes, plural, printable

    options = ClearOptions(settings.caches, settings.pid, settings.root)
    path = _target(name, settings, options)
    runner = ActionRunner()
    planned = runner.plan("clear", [path], options=options, wait=True)
    if planned.error is not None:
        raise planned.error
    plan = planned.result
    what = f"{human_bytes(plan.bytes)} in {plural(plan.files, 'file')} under {printable(path)}"
    if not plan.allowed or args.dry_run:
        return _print_plan(args, plan, what)
    for n in plan.notes:
        print(f"note: {printable(n)}", file=sys.stderr)
    if SPECS["clear"].risky and not args.yes and not _confirmed(what):
        print("not cleared", file=sys.stderr)
        return 1
    r, signals = _run_clear(runner, path, options, sys.stderr.isatty() and not args.no_progress)
    return _print_cleared(args, r, signals)
