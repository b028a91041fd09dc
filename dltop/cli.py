"""Command line: `dltop [PATH...]` starts the TUI; subcommands do one thing and exit. Thin: parse, call, print."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from dltop import __version__
from dltop.commands.common import (
    ArgumentParser,
    add_cache_option,
    add_common_options,
    add_export_options,
    add_jump_option,
    add_server_option,
    add_tab_option,
    escaped_output,
    refresh_seconds,
)
from dltop.errors import DltopError

# Subcommand -> the module whose `register(subparsers)` adds it (with `set_defaults(func=run)`). Only the
# module of the command being run is imported: `dltop residency` must start as fast as vmtouch can.
COMMANDS = {
    "cpu": "dltop.commands.cpu",
    "gpu": "dltop.commands.gpu",
    "residency": "dltop.commands.pagecache",
    "warm": "dltop.commands.pagecache",
    "evict": "dltop.commands.pagecache",
    "lock": "dltop.commands.pagecache",
    "unlock": "dltop.commands.pagecache",
    "kv": "dltop.commands.kv",
    "snapshot": "dltop.commands.snapshot",
    "replay": "dltop.commands.replay",
    "export": "dltop.commands.export",
    "record": "dltop.commands.record",
    "mark": "dltop.commands.record",
    "report": "dltop.commands.record",
    "dump": "dltop.commands.record",
    "caches": "dltop.commands.caches",
    "cluster": "dltop.commands.cluster",
    "doctor": "dltop.commands.doctor",
}


def build_parser(command: str | None = None) -> tuple[ArgumentParser, ArgumentParser, argparse._SubParsersAction]:
    """The TUI parser (`dltop [PATH...]`), the subcommand parser (`dltop CMD ...`) and its subparsers; with
    `command`, only that command's module is loaded."""
    return (build_tui_parser(), *build_command_parser(command))


def build_command_parser(command: str | None = None) -> tuple[ArgumentParser, argparse._SubParsersAction]:
    """The subcommand parser (`dltop CMD ...`) and its subparsers; with `command`, only that command's module
    is loaded."""
    cmd = ArgumentParser(prog="dltop")
    sub = cmd.add_subparsers(dest="command", metavar="COMMAND", parser_class=ArgumentParser)
    modules = [COMMANDS[command]] if command in COMMANDS else list(dict.fromkeys(COMMANDS.values()))
    for name in modules:
        importlib.import_module(name).register(sub)
    return cmd, sub


class _Version(argparse.Action):
    """`dltop --version`: the version, then one line per optional C module (dltop.native): `C` or why not."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        from dltop import native

        print(f"dltop {__version__}")
        for line in native.lines():
            print(f"  {line}")
        parser.exit()


def build_tui_parser() -> ArgumentParser:
    """The TUI's parser, `dltop [PATH...]`: built only for the TUI, as its options import the config reader and
    the cluster command (~20 ms that `dltop residency` does not need)."""
    tui = ArgumentParser(
        prog="dltop",
        description="A top-like monitor for the cache layers of deep-learning work. "
        "Subcommands: " + ", ".join(sorted(COMMANDS)) + " (see dltop CMD --help).",
    )
    tui.add_argument("paths", nargs="*", metavar="PATH", help="dataset directories to watch")
    tui.add_argument("-V", "--version", action=_Version, nargs=0,
                     help="show dltop's version and which per-file loops run in C, and exit")
    tui.add_argument("-r", "--refresh", type=refresh_seconds, metavar="SECONDS",
                     help="refresh interval (default 1.0)")
    tui.add_argument("--read-only", action="store_true", help="disable every action that changes the system")
    tui.add_argument("--record", metavar="DIR",
                     help="record what the TUI shows into DIR as well (replay it with dltop replay DIR)")
    add_jump_option(tui)
    add_tab_option(tui, "(default: GPU where GPUs are, else Datasets when datasets are given, else Page cache)")
    add_export_options(tui, "what the TUI shows")
    add_server_option(tui)
    add_cache_option(tui)
    from dltop.commands.cluster import add_prometheus_options

    add_prometheus_options(tui)  # a Cluster tab, first, when given
    add_common_options(tui)
    return tui


# Options of the top-level parser that take a value: their value is never a subcommand name.
_VALUE_OPTIONS = {"--config", "--root", "--pid", "--user", "--refresh", "-r", "--server", "--export", "--export-web-config",
                  "--cache", "--record", "--jump", "--tab", "--prometheus", "--selector", "--prometheus-user",
                  "--prometheus-password-file", "--prometheus-bearer-token-file", "--prometheus-ca-file",
                  "--prometheus-timeout"}


def _command_first(args: list[str]) -> list[str]:
    """`dltop --root DIR snapshot --json` -> `dltop snapshot --json --root DIR`: options that every command
    shares may come before the subcommand, as in git."""
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            return args
        if a in COMMANDS:
            return [a, *args[i + 1:], *args[:i]]
        if not a.startswith("-"):
            return args  # a dataset path: this is the TUI's command line
        i += 2 if a in _VALUE_OPTIONS else 1
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `dltop` console script; returns the exit status."""
    args_list = _command_first(list(sys.argv[1:] if argv is None else argv))
    first = args_list[0] if args_list else None
    with escaped_output():  # every line a command prints may hold text from outside (paths, argv, labels)
        return _run(args_list, first)


def _dispatch(args_list: list[str], first: str | None) -> int:
    """Run the command named first, else the TUI."""
    if first in COMMANDS:
        cmd, sub = build_command_parser(first)
        args, extra = cmd.parse_known_args(args_list)
        if extra:
            sub.choices[args_list[0]].error(f"unrecognized arguments: {' '.join(extra)}")
        return int(args.func(args) or 0)
    args = build_tui_parser().parse_args(args_list)
    from dltop.commands.tui import run_tui

    return run_tui(args, list(COMMANDS))


def _run(args_list: list[str], first: str | None) -> int:
    """_dispatch, every error a one-line message and an exit status."""
    try:
        return _dispatch(args_list, first)
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
