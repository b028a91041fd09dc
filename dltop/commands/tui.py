"""`dltop [PATH...]`: the live TUI. Textual is imported here, only when the TUI starts."""

from __future__ import annotations

import argparse
import os
import signal

from dltop.commands.common import check_pid
from dltop.config import settings_from_args
from dltop.errors import DltopError, UsageError
from dltop.sampler import Sampler
from dltop.sources.registry import build_sources


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


def run_tui(args: argparse.Namespace, commands: list[str] | None = None) -> int:
    """Start the TUI on the live Sampler."""
    check_dataset_paths(tuple(args.paths), commands)
    settings = settings_from_args(args)  # a bad option is a usage error first
    check_pid(settings.pid, settings.root)
    if not (os.isatty(0) and os.isatty(1)):
        # Drawn into a file or a pipe, a TUI writes escape sequences forever (`dltop > log`).
        raise DltopError("the TUI needs a terminal (stdin and stdout); for one reading as JSON use "
                         "`dltop snapshot --json`")
    from dltop.tui.app import DltopApp

    # A TUI without its terminal is useless: let a hangup end it even when the shell ignored SIGHUP (nohup).
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    listeners = []
    server = None
    if getattr(args, "export", None):
        from dltop.commands.export import start_exporter

        # Listening before the screen opens: a port in use is one line, not a TUI that quits.
        collector, server = start_exporter(args.export)
        listeners.append(collector.update)
    sampler = Sampler(build_sources(settings), root=settings.root, builder=build_sources)
    from dltop.actions.runner import ActionRunner

    # Built here and handed in, so whatever else runs beside the TUI (the recorder) subscribes to the same one.
    app = DltopApp(sampler, settings, own_signals=True, runner=ActionRunner(), listeners=listeners)
    try:
        app.run()
    finally:
        if server is not None:
            server.close()
    return app.return_code or 0
