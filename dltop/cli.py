"""Command line: `dltop [PATH...]` starts the TUI; subcommands do one thing and exit. Thin: parse, call, print."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from dltop import __version__
from dltop.errors import DltopError

# Each module has `register(subparsers)`, adding its subcommands with `set_defaults(func=run)`.
COMMAND_MODULES = (
    "dltop.commands.cpu",
    "dltop.commands.pagecache",
    "dltop.commands.snapshot",
)


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog.split()[0]} --help)\n")


def add_common_options(p: argparse.ArgumentParser) -> None:
    """Options every command that samples the system takes."""
    p.add_argument("--config", metavar="FILE", help="TOML config file (default: $XDG_CONFIG_HOME/dltop/config.toml)")
    p.add_argument("--root", metavar="DIR", default="/", help="read /proc and /sys under DIR (captured trees)")
    p.add_argument("--pid", type=int, metavar="PID", help="process whose memory cgroup to watch (default: dltop's own)")


def build_parser() -> tuple[ArgumentParser, ArgumentParser, argparse._SubParsersAction]:
    """The TUI parser (`dltop [PATH...]`), the subcommand parser (`dltop CMD ...`) and its subparsers."""
    cmd = ArgumentParser(prog="dltop")
    sub = cmd.add_subparsers(dest="command", metavar="COMMAND", parser_class=ArgumentParser)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    tui = ArgumentParser(
        prog="dltop",
        description="A top-like monitor for the cache layers of deep-learning work. "
        "Subcommands: " + ", ".join(sorted(sub.choices)) + " (see dltop CMD --help).",
    )
    tui.add_argument("paths", nargs="*", metavar="PATH", help="dataset directories to watch")
    tui.add_argument("-V", "--version", action="version", version=f"dltop {__version__}")
    tui.add_argument("-r", "--refresh", type=float, metavar="SECONDS", help="refresh interval (default 1.0)")
    tui.add_argument("--read-only", action="store_true", help="disable every action that changes the system")
    add_common_options(tui)
    return tui, cmd, sub


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `dltop` console script; returns the exit status."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    tui, cmd, sub = build_parser()
    try:
        if args_list and args_list[0] in sub.choices:
            args, extra = cmd.parse_known_args(args_list)
            if extra:
                sub.choices[args_list[0]].error(f"unrecognized arguments: {' '.join(extra)}")
            return int(args.func(args) or 0)
        args = tui.parse_args(args_list)
        from dltop.commands.tui import run_tui

        return run_tui(args, list(sub.choices))
    except DltopError as e:
        print(f"dltop: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("dltop: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`dltop snapshot --json | head`): not an error worth a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:
        if os.environ.get("DLTOP_DEBUG"):
            raise
        print(f"dltop: {e.strerror or e}{': ' + str(e.filename) if e.filename else ''}", file=sys.stderr)
        return 1
