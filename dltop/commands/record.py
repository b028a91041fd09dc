"""`dltop record | mark | report | dump`: the flight recorder from a shell (headless: no Textual is imported)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from typing import Any

from dltop.errors import DltopError

MAX_MARK_CHARS = 1000  # a mark is one append of less than PIPE_BUF bytes: it never interleaves with another


def _dir_option(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("-o", "--output", dest="directory", metavar="DIR", default=None,
                   help=f"{what} (default: $XDG_STATE_HOME/dltop/recordings, else ~/.local/state/dltop/recordings)")


def _range_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="PATH", nargs="?", default=None,
                   help="a recording directory or one segment file (default: the directory `record` uses)")
    p.add_argument("--from", dest="t0", metavar="TIME", help="start at TIME ('10m ago', 14:05, ISO 8601, epoch)")
    p.add_argument("--to", dest="t1", metavar="TIME", help="end at TIME")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress line on stderr (there is none when stderr is not a terminal)")


def register(sub: argparse._SubParsersAction) -> None:
    """Add `dltop record`, `mark`, `report` and `dump`."""
    from dltop.commands.common import (
        add_common_options,
        add_export_options,
        add_server_option,
        refresh_seconds,
    )

    p = sub.add_parser("record", help="record every cache layer to a directory, headless, until stopped",
                       description="Record Snapshots and events (OOM kills, GPU processes, actions, hints, "
                                   "markers) into hourly segments. Safe under nohup, tmux and systemd; SIGTERM "
                                   "or Ctrl-C stops it cleanly.")
    _dir_option(p, "the recording directory")
    p.add_argument("-i", "--interval", type=refresh_seconds, default=1.0, metavar="SECONDS",
                   help="seconds between samples (default 1)")
    p.add_argument("--retain", type=_retain, default=7 * 86400.0, metavar="DURATION",
                   help="remove segments older than this, with a unit: 12h, 7d, 2w (default 7d; 0: keep all)")
    p.add_argument("--max-size", type=_size, default=2 << 30, metavar="SIZE",
                   help="remove the oldest segments above this total, with a unit: 500M, 2G (default 2G, at "
                        "least 16M; 0: no cap)")
    p.add_argument("--dataset", dest="paths", action="append", metavar="PATH",
                   help="also record the residency of this dataset (repeatable)")
    add_export_options(p, "the recorded Snapshots")
    add_server_option(p)
    add_common_options(p)
    p.set_defaults(func=run_record)

    p = sub.add_parser("mark", help="put a marker into the running recording ('lr drop', 'restarted job')",
                       description="Add a marker event to the recording that `dltop record` is writing on DIR.")
    _dir_option(p, "the directory the recorder writes")
    p.add_argument("text", nargs="+", metavar="TEXT", help="what happened")
    p.set_defaults(func=run_mark)

    p = sub.add_parser("report", help="a postmortem of a recording: peaks, events, charts, hints",
                       description="Peaks, the event timeline, charts of the page cache, GPU memory and dataset "
                                   "residency over time, and the hints that fired.")
    _range_options(p)
    p.add_argument("--width", type=int, default=None, metavar="COLUMNS", help="chart width (default: the terminal's)")
    p.set_defaults(func=run_report)

    p = sub.add_parser("dump", help="a recording as CSV, JSON Lines or OpenMetrics",
                       description="Write a recording's samples to stdout: jsonl (one Snapshot per line, as "
                                   "`dltop snapshot --json`), csv (one row per sample) or openmetrics (for "
                                   "`promtool tsdb create-blocks-from openmetrics`).")
    _range_options(p)
    p.add_argument("--format", choices=("csv", "jsonl", "openmetrics"), default="jsonl")
    p.add_argument("--fields", metavar="NAME,...", default=None,
                   help="only these fields (csv and openmetrics; names as in docs/recorder.md)")
    p.set_defaults(func=run_dump)


MIN_MAX_BYTES = 16 << 20  # a cap below a few segments' worth would remove every closed segment as it closes


def _bare_number(text: str) -> bool:
    try:
        float(text.strip())
    except ValueError:
        return False
    return True


def _retain(text: str) -> float:
    """An argparse type: --retain as a duration with its unit (`7` once meant 7 s and removed hours of history)."""
    from dltop.recorder import parse_duration

    if _bare_number(text) and float(text) != 0:
        raise argparse.ArgumentTypeError(f"{text!r} has no unit: say {text.strip()}d, {text.strip()}h or "
                                         f"{text.strip()}m (0 keeps everything)")
    try:
        return parse_duration(text)
    except DltopError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _size(text: str) -> int:
    """An argparse type: --max-size with its unit (`2` once meant 2 bytes and removed every segment)."""
    from dltop.fmt import human_bytes
    from dltop.recorder import parse_size

    if _bare_number(text) and float(text) != 0:
        raise argparse.ArgumentTypeError(f"{text!r} has no unit: say {text.strip()}G or {text.strip()}M "
                                         f"(0 switches the cap off)")
    try:
        size = parse_size(text)
    except DltopError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if 0 < size < MIN_MAX_BYTES:
        raise argparse.ArgumentTypeError(f"{text!r} is {human_bytes(size)}: at least {human_bytes(MIN_MAX_BYTES)} "
                                         f"(0 switches the cap off)")
    return size


def _directory(args: argparse.Namespace) -> str:
    from dltop.recorder import default_directory

    return os.path.abspath(os.path.expanduser(args.directory or default_directory()))


def run_record(args: argparse.Namespace) -> int:
    """Sample with the same Sampler as the TUI and record every Snapshot until SIGTERM, SIGINT or SIGHUP."""
    from dataclasses import replace

    from dltop.commands.common import check_pid, export_args
    from dltop.config import settings_from_args
    from dltop.recorder import Recorder
    from dltop.sampler import Sampler
    from dltop.sources.registry import build_sources

    settings = replace(settings_from_args(args), refresh_s=args.interval)
    check_pid(settings.pid, settings.root)
    export = export_args(args)
    directory = _directory(args)
    recorder = Recorder(directory, interval_s=args.interval, retain_s=args.retain or None,
                        max_bytes=args.max_size or None,
                        meta={"datasets": list(settings.datasets), "servers": list(settings.servers)})
    listeners: list[Any] = [recorder.write]
    server = None
    if export is not None:
        from dltop.commands.export import start_exporter

        try:  # listening before sampling: a port in use is one line, and the lock is let go
            collector, server = start_exporter(*export)
        except BaseException:
            recorder.close()
            raise
        listeners.append(collector.update)
        print(f"dltop record: serving {server.url}", file=sys.stderr, flush=True)
    sampler = Sampler(build_sources(settings), root=settings.root, builder=build_sources)
    print(f"dltop record: recording into {directory} every {args.interval:g} s (SIGTERM or Ctrl-C stops)",
          file=sys.stderr, flush=True)
    try:
        asyncio.run(_record(sampler, listeners, args.interval))
    finally:
        sampler.close()
        recorder.close()
        if server is not None:
            server.close()
    lost = f", {recorder.dropped + recorder.lost} lost" if recorder.dropped or recorder.lost else ""
    print(f"dltop record: stopped; {recorder.samples} samples written{lost}", file=sys.stderr, flush=True)
    return 0


async def _record(sampler: Any, listeners: list[Any], interval_s: float) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_signal(signum: int, frame: Any) -> None:
        # Installed with signal.signal rather than loop.add_signal_handler: the loop's handlers are removed (back
        # to the default, which kills) when it closes, and a second SIGTERM (timeout and systemd signal the whole
        # group) must not cut short the stop in progress: writing the last lines and compressing the segment.
        with contextlib.suppress(RuntimeError):  # the loop has closed: the stop is under way
            loop.call_soon_threadsafe(stop.set)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:  # nohup ignores it: leave it ignored
        signal.signal(signal.SIGHUP, on_signal)

    from dltop.journal import JournalTail

    actions = JournalTail()  # the recorder's own tail writes them down; this one measures what they acted on

    async def consume() -> None:
        async for snap in sampler.stream(lambda: interval_s):
            for listener in listeners:
                listener(snap)
            _measure_after_actions(sampler, snap, actions)

    task = asyncio.create_task(consume())
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    task.cancel()
    stopped.cancel()
    if task.done() and not task.cancelled() and task.exception() is not None:
        raise task.exception()  # type: ignore[misc]


def _measure_after_actions(sampler: Any, snap: Any, actions: Any) -> None:
    """A dataset a warm, evict or lock (from any shell or TUI) just finished on is measured again at once, not at
    its next scan: an evict that left it at 0% for a few seconds is in the recording's lowest residency."""
    from dltop.model.datasets import DatasetsPart

    part = snap.datasets
    for data in actions.poll():
        if (data.get("phase") == "finished" and data.get("action") in ("warm", "evict", "lock")
                and isinstance(part, DatasetsPart)):
            for path in data.get("paths") or ():
                if isinstance(path, str) and (holder := part.holder(path)) is not None:
                    sampler.read_now("datasets", holder)


def run_mark(args: argparse.Namespace) -> int:
    """Append a marker for the recorder running on DIR to pick up."""
    from dltop.recorder import store

    directory = _directory(args)
    text = " ".join(args.text).strip()
    if not text:
        raise DltopError("dltop mark: say what happened (the marker's text is empty)")
    if len(text) > MAX_MARK_CHARS:
        raise DltopError(f"dltop mark: the text is {len(text)} characters; at most {MAX_MARK_CHARS}")
    if not os.path.isdir(directory):
        raise DltopError(f"no recording directory {directory} (start one with: dltop record -o {directory})")
    dir_fd = store.open_directory(directory, create=False)  # as the recorder checks it, and held
    try:
        if not store.lock_held(dir_fd):
            raise DltopError(f"no dltop record is running on {directory}: nothing would read the marker "
                             f"(start one with: dltop record -o {directory})")
        now = time.time()
        line = (json.dumps({"ts": now, "text": text}, ensure_ascii=False) + "\n").encode("utf-8")
        fd = store.open_private(store.MARKS_NAME, os.O_WRONLY | os.O_APPEND | os.O_CREAT, dir_fd=dir_fd)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
    finally:
        os.close(dir_fd)
    print(f"marked {time.strftime('%H:%M:%S', time.localtime(now))}: {text}")
    return 0


def _open_range(args: argparse.Namespace) -> tuple[Any, float | None, float | None]:
    from dltop.recorder import Recording, default_directory, parse_time

    rec = Recording(args.path or default_directory())
    now = time.time()
    t0 = parse_time(args.t0, now, rec) if args.t0 else None
    t1 = parse_time(args.t1, now, rec) if args.t1 else None
    if t0 is not None and t1 is not None and t1 < t0:
        raise DltopError(f"--to ({args.t1}) is before --from ({args.t0})")
    return rec, t0, t1


def run_report(args: argparse.Namespace) -> int:
    """Print the postmortem of a recording."""
    from dltop.recorder.report import report

    rec, t0, t1 = _open_range(args)
    color = sys.stdout.isatty()
    bar = None if args.quiet or not sys.stderr.isatty() else _Progress("dltop report: reading")
    try:
        text = report(rec, t0, t1, width=args.width, color=color, progress=bar)
    finally:
        if bar is not None:
            bar.clear()
    # In colour the report's own escapes must reach the terminal: it escapes the text from outside itself.
    out = getattr(sys.stdout, "raw", sys.stdout) if color else sys.stdout
    out.write(text)
    sys.stdout.flush()
    damage_note("report", rec)
    return 0


class _Progress:
    """One line on a terminal's stderr that updates in place (at most five times a second): done of total."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.shown = False
        self._next = 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now < self._next and done < total:
            return
        self._next = now + 0.2
        pct = 100 * done // total if total else 100
        # Past the escaping writer: the line is numbers of our own, and its \r and erase must reach the terminal.
        err = getattr(sys.stderr, "raw", sys.stderr)
        err.write(f"\r{self.what} {done:,} of {total:,} {'sample' if total == 1 else 'samples'} ({pct}%)\x1b[K")
        err.flush()
        self.shown = True

    def clear(self) -> None:
        """Take the line away (the report follows on stdout)."""
        if self.shown:
            err = getattr(sys.stderr, "raw", sys.stderr)
            err.write("\r\x1b[K")
            err.flush()


def run_dump(args: argparse.Namespace) -> int:
    """Write a recording's samples to stdout in the format asked for."""
    from dltop.recorder.dump import dump

    rec, t0, t1 = _open_range(args)
    fields = [f.strip() for f in args.fields.split(",") if f.strip()] if args.fields else None
    bar = None if args.quiet or not sys.stderr.isatty() else _Progress("dltop dump: reading")
    written = [0]
    try:
        try:
            dump(rec, args.format, sys.stdout, t0, t1, fields, progress=bar, written=written)
        finally:
            if bar is not None:
                bar.clear()
        sys.stdout.flush()
    except KeyboardInterrupt:
        # Rows and lines are written whole (one write each): what reached stdout ends at a line's end.
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
        what = (f"{written[0]:,} {'line' if written[0] == 1 else 'lines'} written, the last one whole"
                if written[0] else "nothing written")
        print(f"dltop dump: interrupted ({what})", file=sys.stderr, flush=True)
        return 130
    damage_note("dump", rec)
    return 0


def damage_note(command: str, rec: Any) -> None:
    """One line on stderr saying what of the recording was damaged and left out (nothing when all was read):
    the exit status stays 0, since what was intact has been read."""
    note = rec.damage.note()
    if note:
        print(f"dltop {command}: {note}", file=sys.stderr, flush=True)

