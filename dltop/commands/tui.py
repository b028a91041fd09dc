"""`dltop [PATH...]`: the live TUI. Textual is imported here, only when the TUI starts."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from typing import TYPE_CHECKING

from dltop.commands.common import check_pid, export_args
from dltop.config import Settings, settings_from_args
from dltop.errors import DltopError, UsageError
from dltop.fmt import printable
from dltop.sampler import Sampler
from dltop.sources.registry import build_sources

if TYPE_CHECKING:
    from dltop.recorder import Recorder, Recording
    from dltop.tui.app import DltopApp


def check_dataset_paths(paths: tuple[str, ...], commands: list[str] | None = None) -> None:
    """Every dataset path must exist (a typo is caught before the screen opens). A bare word that is no path
    was most likely meant as a subcommand: that is a usage error."""
    for p in paths:
        if os.path.exists(p):
            continue
        if "/" not in p and commands:
            raise UsageError(f"error: unknown subcommand {p!r}, and no such path "
                             f"(subcommands: {', '.join(sorted(commands))}; see dltop --help)")
        raise DltopError(f"no such dataset path: {p}")


def need_terminal(instead: str = "for one reading as JSON use `dltop snapshot --json`") -> None:
    """Drawn into a file or a pipe, a TUI writes escape sequences forever (`dltop > log`): refuse, saying what to
    use instead."""
    if not (os.isatty(0) and os.isatty(1)):
        raise DltopError(f"the TUI needs a terminal (stdin and stdout); {instead}")


def run_tui(args: argparse.Namespace, commands: list[str] | None = None) -> int:
    """Start the TUI on the live Sampler; with --record DIR, everything it shows goes into a recording too."""
    check_dataset_paths(tuple(args.paths), commands)
    settings = settings_from_args(args)  # a bad option is a usage error first
    check_pid(settings.pid, settings.root)
    need_terminal()
    from dltop.actions.runner import ActionRunner
    from dltop.tui.app import DltopApp

    app: DltopApp | None = None

    def warn(text: str) -> None:
        # On the screen once it is up: a line on stderr would land in the middle of it.
        if app is not None:
            app.warn(f"recorder: {text}")
        else:
            print(f"dltop --record: {text}", file=sys.stderr, flush=True)

    # Built here and handed in, so whatever else runs beside the TUI (the recorder) subscribes to the same one.
    runner = ActionRunner()
    listeners = []
    server = None
    recorder: Recorder | None = None
    try:
        if (export := export_args(args)) is not None:
            from dltop.commands.export import start_exporter

            # Listening before the screen opens: a port in use is one line, not a TUI that quits.
            collector, server = start_exporter(*export)
            listeners.append(collector.update)
        if getattr(args, "record", None):
            from dltop.recorder import Recorder

            # Before the screen opens: a directory another recorder holds is one line, and no TUI.
            recorder = Recorder(os.path.abspath(os.path.expanduser(args.record)), interval_s=settings.refresh_s,
                                meta={"by": "dltop --record", "datasets": list(settings.datasets),
                                      "servers": list(settings.servers)}, warn=warn)
            runner.subscribe(recorder.action_listener)
        sampler = Sampler(build_sources(settings), root=settings.root, builder=build_sources)
        app = DltopApp(sampler, settings, own_signals=True, runner=runner, listeners=listeners, recorder=recorder)
        return _run(app)
    finally:
        app = None
        if recorder is not None:
            recorder.close()  # the stop event, the segment compressed, the lock released
        if server is not None:
            server.close()


def run_replay_tui(recording: Recording, name: str, start_ts: float, settings: Settings,
                   start_note: str | None = None) -> int:
    """Start the TUI on a recording (`dltop replay`): no Sampler, no sources, nothing that acts. `start_note` is
    said once it is on screen (the typed time fell inside a gap)."""
    from dltop.timeline import Recorded
    from dltop.tui.app import DltopApp

    return _run(DltopApp(settings=settings, own_signals=True, recorded=Recorded(recording, name, start_ts, start_note)))


def _run(app: DltopApp) -> int:
    # A TUI without its terminal is useless: let a hangup end it even when the shell ignored SIGHUP (nohup).
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    app.run()
    for line in app.session.farewell:  # a lock kept by a holder: where it is and how to release it
        with contextlib.suppress(OSError):  # the terminal may be gone (a hangup)
            print(f"dltop: {printable(line)}", file=sys.stderr, flush=True)
    return app.return_code or 0
