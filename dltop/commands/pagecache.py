"""`dltop residency | warm | evict | lock`: a dataset in the page cache, measured and acted on from scripts."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from dltop.commands.common import non_negative_int
from dltop.errors import DltopError
from dltop.fmt import human_bytes, human_rate, percent_text, plural, printable

if TYPE_CHECKING:  # imported where an action needs it: `residency` never does
    import threading

FILES_TOP = 20  # `residency --files`: files listed per folder
FILES_BUDGET = 100_000  # file rows in all per PATH: past it, fewer per folder (and a note says so)


def _walk_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="*", metavar="PATH", help="dataset files or folders")
    p.add_argument("-L", "--follow-symlinks", action="store_true", help="follow symbolic links (loops are detected)")
    p.add_argument("--cross-filesystems", action="store_true", help="descend into other mounted filesystems")
    p.add_argument("--ignore", action="append", default=[], metavar="GLOB",
                   help="skip files and folders whose name matches (repeatable)")
    p.add_argument("--include", action="append", default=[], metavar="GLOB",
                   help="count only files whose name matches (repeatable)")
    p.add_argument("--json", action="store_true", help="print JSON")


def register(sub: argparse._SubParsersAction) -> None:
    """Add `dltop residency`, `warm`, `evict` and `lock`."""
    p = sub.add_parser("residency", help="how much of a dataset is in the page cache, per folder",
                       description="Page-cache residency of files and folders, counted as fincore counts it.")
    _walk_options(p)
    p.add_argument("--depth", type=non_negative_int, default=1, metavar="N",
                   help="show folders down to depth N (default 1)")
    p.add_argument("--files", action="store_true",
                   help="list each folder's files too: its top N (--top) by --sort, and a row for the rest")
    p.add_argument("--top", type=non_negative_int, default=FILES_TOP, metavar="N",
                   help=f"with --files: files listed per folder (default {FILES_TOP})")
    p.add_argument("--sort", choices=("size", "resident", "pct"), default="size",
                   help="with --files: most data, most resident, or lowest %% first (default size)")
    p.set_defaults(func=run_residency)

    helps = {
        "warm": "read a dataset into the page cache (chunked WILLNEED, holes left alone)",
        "evict": "drop a dataset from the page cache (dirty pages flushed first)",
        "lock": "mlock a dataset's data into memory until Ctrl-C (or --detach: until `dltop unlock`)",
    }
    for name, text in helps.items():
        p = sub.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        _walk_options(p)
        if name == "lock":
            p.set_defaults(lock_paths=True)
            p.add_argument("--detach", action="store_true",
                           help="once locked, hand the lock to a small holder process and return (as vmtouch -dl); "
                                "a hangup (a dropped SSH session) hands it over too")
            p.add_argument("--list", action="store_true",
                           help="list the locks held by holder processes (yours; root: everyone's) and exit")
        p.add_argument("--dry-run", action="store_true", help="say what would happen, change nothing")
        if name in ("warm", "lock"):
            # --force (all of it) and --fit (the part that fits) answer the guard's "no" in opposite ways.
            guard = p.add_mutually_exclusive_group()
            guard.add_argument("--force", action="store_true", help="go ahead even if the memory guard says no")
            if name == "warm":
                guard.add_argument("--fit", action="store_true",
                                   help="when the whole dataset does not fit, warm the part that fits")
        p.add_argument("--no-progress", action="store_true", help="no progress bar, even on a terminal")
        p.set_defaults(func=run_action, action=name)
    p = sub.add_parser("unlock", help="release locks kept by holder processes (dltop lock --detach, q in the TUI)",
                       description="Release locks kept by holder processes: yours, or anyone's as root.")
    p.add_argument("which", nargs="*", metavar="PID|PATH", help="a holder's pid or the path it locks")
    p.add_argument("--all", action="store_true", help="every lock you hold (root: every lock)")
    p.set_defaults(func=run_unlock)


def _options(args: argparse.Namespace, depth: int | None = None) -> Any:
    from dltop.residency.walk import WalkOptions

    files = getattr(args, "files", False)
    return WalkOptions(
        follow_symlinks=args.follow_symlinks,
        cross_filesystems=args.cross_filesystems,
        ignore=tuple(args.ignore),
        include=tuple(args.include),
        max_depth=depth,
        top_files=args.top if files else 0,
        top_keys=(args.sort,) if files else ("size",),
        top_budget=FILES_BUDGET,
    )


def _check_paths(paths: list[str]) -> None:
    """Each PATH must be there and reachable: the real reason (errno) when it is not."""
    import errno

    from dltop.residency.budget import path_error

    for p in paths:
        try:
            os.lstat(p)
        except OSError as e:  # a folder on the way that cannot be searched is EACCES, not "missing"
            raise DltopError(path_error(e.strerror or str(e), p)) from None
        try:
            os.stat(p)
        except OSError as e:
            if e.errno == errno.ENOENT:
                raise DltopError(f"broken symbolic link: {p}") from None
            raise DltopError(path_error(e.strerror or str(e), p)) from None


def run_residency(args: argparse.Namespace) -> int:
    """Scan and print residency per path, folders down to --depth."""
    from dltop.model.base import to_dict
    from dltop.model.datasets import DatasetUnavailable
    from dltop.residency.scan import scan_paths

    _check_paths(args.paths)
    part = scan_paths(tuple(args.paths), _options(args, args.depth))
    for ds in part.paths:
        if isinstance(ds, DatasetUnavailable):  # a PATH itself cannot be read (what is below it is counted)
            raise DltopError(ds.unavailable)
    if args.json:
        sys.stdout.write(json.dumps(to_dict(part)) + "\n")
    else:
        from dltop.text.datasets import format_residency

        sys.stdout.write(format_residency(part, args.sort if args.files else None, args.top))
        for ds in part.scanned:
            if args.files and (ds.files_top < args.top or _unlisted(ds)):
                sys.stderr.write(f"dltop: {ds.path}: at most {FILES_BUDGET:,} file rows a PATH: the biggest folders "
                                 f"list {ds.files_top} each, {_unlisted(ds)} smaller ones none (give a folder as "
                                 "PATH to list its files)\n")
    return 0


def _unlisted(node: Any) -> int:
    """Folders below `node` (and it) with files of their own that list none: the file-row budget ran out."""
    own = 1 if node.direct_files > 0 and not node.top_files else 0
    return own + sum(_unlisted(c) for c in node.children)


class ProgressBar:
    """One line on stderr, redrawn in place: bar, bytes, rate and ETA. Only on a terminal."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream or sys.stderr
        self.drawn = False

    def __call__(self, p: Any) -> None:
        from dltop.text.datasets import progress_line

        line = progress_line(p, width=24, marks="#.", pct_digits=1)
        # The carriage return is dltop's own: past the escaping writer (which shows a control as '\u000d'), the
        # text through it.
        raw = getattr(self.stream, "raw", self.stream)
        raw.write("\r")
        self.stream.write(line.ljust(77)[:99])
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        if self.drawn:
            self.stream.write("\n")
            self.stream.flush()


def run_action(args: argparse.Namespace) -> int:
    """warm / evict / lock through the action runner, whose worker a Ctrl-C or SIGTERM cancels cleanly: the
    summary is still printed. Exit status 130 after Ctrl-C (SIGINT), 143 after SIGTERM, also when they end a
    lock's hold; a second one of either ends the process at once."""
    from dltop.actions.runner import ActionRunner

    if getattr(args, "list", False):
        return run_lock_list(args)
    if not args.paths:
        raise DltopError(f"{args.action}: give at least one PATH")
    _check_paths(args.paths)
    runner = ActionRunner()
    bar = _progress_bar(args, runner)
    with cancelled_by_signals(runner) as (signals, stop):
        try:
            run = runner.start(args.action, args.paths, options=_options(args), force=getattr(args, "force", False),
                               fit=getattr(args, "fit", False), dry_run=args.dry_run)
            wait_for(run)
            if bar is not None:
                bar.close()
            if run.error is not None:
                raise run.error
            _report_and_hold(args, runner, run.result, signals, stop)
            return 128 + signals[0] if signals else 0
        finally:
            runner.close()


def _progress_bar(args: argparse.Namespace, runner: Any) -> ProgressBar | None:
    """A progress bar on stderr that the runner's progress events draw, where stderr is a terminal."""
    if not sys.stderr.isatty() or args.no_progress or args.dry_run:
        return None
    bar = ProgressBar()
    runner.subscribe(lambda ev: bar(ev) if ev.phase == "progress" else None)
    return bar


def _report_and_hold(args: argparse.Namespace, runner: Any, result: Any, signals: list[int],
                     stop: threading.Event) -> None:
    """Print what the action did; a lock not cancelled is then held here, or handed over first (--detach)."""
    held = runner.held()
    # --detach hands over before anything is printed: a closed stdout (`| head -1`) cannot undo it
    kept = runner.keep_all() if held and not signals and getattr(args, "detach", False) else []
    _print_result(args, result)
    for line in kept:
        print(line, file=sys.stderr)
    if held and not signals and not kept:
        _hold(runner, result.files, held, stop, signals)


@contextlib.contextmanager
def cancelled_by_signals(runner: Any) -> Iterator[tuple[list[int], threading.Event]]:
    """While inside, Ctrl-C and SIGTERM cancel what `runner` runs (and set the event); the signals caught are in
    the list. A second one of either ends the process at once."""
    import signal
    import threading

    signals: list[int] = []
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        # No KeyboardInterrupt: raised in the middle of a wait or a print it leaves half-done state behind
        # (Python 3.11's Thread.join even marks a running thread finished). Ask the worker to stop instead.
        if signals:
            os.write(2, b"\ndltop: interrupted again, stopping now\n")
            os._exit(128 + signum)
        signals.append(signum)
        runner.cancel()
        stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield signals, stop
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def wait_for(run: Any) -> None:
    """Wait for a runner's run without blocking signals: the handler runs between these short waits."""
    while not run.done.wait(0.1):
        pass


SIGHUP = 1


def _hold(runner: Any, files: int, held: dict[str, int], stop: threading.Event, signals: list[int]) -> None:
    """Keep the pages locked until Ctrl-C or SIGTERM (the handler sets `stop`); then unlock. A hangup (the terminal
    or the SSH session gone) hands the lock to a holder process instead: nobody is left to ask. Either way it is
    announced and journalled, and said here while the terminal is still there."""
    lines = ["unlocked"]
    try:
        print(f"locked {human_bytes(sum(held.values()))} in {plural(files, 'file')}; Ctrl-C to unlock", file=sys.stderr,
              flush=True)
        while not stop.wait(0.5):
            pass
        if signals and signals[0] == SIGHUP:
            lines = runner.keep_all("on hangup")
    finally:
        runner.release_all()
    with contextlib.suppress(OSError):
        for line in lines:
            print(line, file=sys.stderr)


def _done_line(r: Any, resident: str) -> str:
    """What an action that ran did: bytes, files, time and rate."""
    verb = {"warm": "warmed", "evict": "evicted", "lock": "locked"}[r.action]
    rate = r.done_bytes / r.elapsed_s if r.elapsed_s > 0 else None
    left = r.files - r.files_done
    files = f"{r.files_done} of {plural(r.files, 'file')}" + (
        f" ({left} not reached)" if left > 0 and r.cancelled else f" ({left} not done)" if left > 0 else "")
    state = " (cancelled)" if r.cancelled else ""
    return (f"{verb} {human_bytes(r.done_bytes)} in {files}, {r.elapsed_s:.2f}s, "
            f"{human_rate(rate, missing='-')}{state}" + (f"; {resident} was resident already" if resident else ""))


def _resident_now(r: Any) -> str | None:
    """What is resident after an action that ran (None where it touched no pages)."""
    if r.resident_pages_after is None:
        return "resident now: unknown (see the note)"
    if r.unknown_pages:  # never counted resident or not: the note below says why and what to do
        return (f"resident now: unknown for {plural(r.unknown_pages, 'page')}; "
                f"{plural(r.resident_pages_after, 'page')} resident among those whose residency the kernel shows")
    if r.data_pages:  # of the data, as `dltop residency` shows it: holes are never read
        holes = "; holes of sparse files not counted" if r.data_pages < r.pages else ""
        return (f"resident now: {r.data_resident_pages_after} of {plural(r.data_pages, 'page')} of data "
                f"({percent_text(100 * (r.data_resident_pages_after or 0) / r.data_pages, 1)}){holes}")
    if r.pages:
        return (f"resident now: {r.resident_pages_after} of {plural(r.pages, 'page')} "
                f"({percent_text(100 * r.resident_pages_after / r.pages, 1)})")
    return None


def _print_result(args: argparse.Namespace, r: Any) -> None:
    from dltop.kernel import PAGE_SIZE as ps

    if args.json:
        sys.stdout.write(json.dumps(r.to_dict()) + "\n")
        sys.stdout.flush()
        return
    # A warm counts what it reads; what was resident already is said apart.
    resident = human_bytes(r.resident_pages_before * ps) if r.action == "warm" and r.resident_pages_before else ""
    if r.dry_run:
        verb = {"warm": "would warm", "evict": "would evict", "lock": "would lock"}[r.action]
        print(f"{verb} {human_bytes(r.total_bytes)} in {plural(r.files, 'file')}" + (
            f"; {resident} is resident already" if resident else ""))
    else:
        print(_done_line(r, resident))
        if (now := _resident_now(r)) is not None:
            print(now)
    if r.action == "lock" and r.total_bytes < r.pages * ps:  # the holes of sparse files are never locked
        print(f"data only: {human_bytes(r.total_bytes)} of {human_bytes(r.size_bytes)} apparent size; the holes of "
              "sparse files are never locked")
    _print_notes(r)


def _print_notes(r: Any) -> None:
    """What the guard said, what stayed resident or was skipped, and why."""
    from dltop.text.datasets import skipped_text

    if r.guard is not None:
        print(f"memory guard: {r.guard.message}")
    for why, pages in r.stayed.items():
        print(f"stayed resident: {plural(pages, 'page')} ({why})")
    for line in r.stayed_detail:
        print(f"  {line}")
    if r.stayed_more:
        print(f"  … {r.stayed_more} more (fewer pages each)")
    if r.skipped:
        print("skipped: " + skipped_text(r.skipped))
    for p in r.problems[:5]:
        print(f"  {p}")
    for n in r.notes:
        print(f"note: {n}")


def run_lock_list(args: argparse.Namespace) -> int:
    """`dltop lock --list`: the locks held by holder processes this user may see (root: everyone's)."""
    from dltop.actions import holder

    mine, others = holder.holders()
    if args.json:
        rows = [{"pid": h.pid, "uid": h.uid, "user": h.user, "target": h.target, "locked_bytes": h.locked_bytes}
                for h in mine]
        sys.stdout.write(json.dumps({"holders": rows, "other_users_holders": others}) + "\n")
        return 0
    if not mine:
        print("no lock is held by a holder process")
    else:
        print(f"{'PID':>7}  {'USER':<10} {'LOCKED':>10}  TARGET")
        for h in mine:
            locked = human_bytes(h.locked_bytes) if h.locked_bytes is not None else "unknown"
            print(f"{h.pid:>7}  {printable(h.user)[:10]:<10} {locked:>10}  {printable(h.target)}")
    if others:
        print(f"{others} more held by other users' holders (only their owner or root sees and unlocks them)")
    return 0


def run_unlock(args: argparse.Namespace) -> int:
    """`dltop unlock PID|PATH ... | --all`: SIGTERM to the holders named, each checked (owner, start time)."""
    from dltop.actions import holder

    if not args.which and not args.all:
        raise DltopError("unlock: name a holder's PID or the PATH it locks, or --all (dltop lock --list shows them)")
    mine, _ = holder.holders()
    named = _holders_named(args.which, mine)
    chosen = mine if args.all else named
    if not chosen:
        print("no lock is held by a holder process")
        return 0
    failed = 0
    for h in chosen:
        try:
            print(printable(holder.unlock(h)))
        except DltopError as e:
            print(f"dltop: {e}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


def _holders_named(which: list[str], mine: list[Any]) -> list[Any]:
    """Your holders that each PID or PATH names, in order; DltopError for one that names none of them."""
    chosen: list[Any] = []
    for w in which:
        found = [h for h in mine if (w.isdigit() and h.pid == int(w)) or h.target in (w, os.path.abspath(w))]
        if not found:
            raise DltopError(_not_yours(w))
        chosen += [h for h in found if h not in chosen]
    return chosen


def _not_yours(w: str) -> str:
    """Why PID or PATH `w` names no holder of yours."""
    from dltop.actions import holder

    theirs = " (another user's holder: only its owner or root may unlock it)" if w.isdigit() and (
        holder.holder_at(int(w)) is not None) else ""
    return f"unlock: no lock of yours held as {printable(w)}{theirs}; dltop lock --list shows them"
