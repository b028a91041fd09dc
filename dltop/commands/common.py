"""What every subcommand's parser shares: one-line usage errors and the options that every sampling command takes.

Below `cli.py`, so a command module never imports the entry point that imports it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any, NoReturn, TypeVar

from dltop.errors import DltopError
from dltop.fmt import EscapingWriter

Number = TypeVar("Number", int, float)


def _columns() -> int:
    """The terminal's width as `shutil.get_terminal_size` says it ($COLUMNS, then stdout's terminal, else 80),
    without importing shutil (and with it zlib, bz2 and lzma: ~2.5 ms of every command's start-up)."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns > 0:
        return columns
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return 80


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter at the width it would choose; argparse makes one for every option added."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        super().__init__(prog, indent_increment, max_help_position, _columns() - 2 if width is None else width)


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr and exit status 2, naming this (sub)command's help."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        # A subcommand's prog is "dltop residency": its own --help says what the options take.
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def non_negative_int(text: str) -> int:
    """An argparse type: a whole number, 0 or more."""
    return _whole_number(text, 0)


def positive_int(text: str) -> int:
    """An argparse type: a whole number, 1 or more."""
    return _whole_number(text, 1)


def _whole_number(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be {low} or more: {text!r}")
    return value


def above_zero(value: Number, text: str, unit: str) -> Number:
    """`value`, parsed from `text`, where it is more than 0; an argparse error naming `unit` otherwise."""
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 {unit}: {text!r}")
    return value


def refresh_seconds(text: str) -> float:
    """An argparse type: a refresh interval within the range the config file allows too."""
    from dltop.config import MAX_REFRESH_S, MIN_REFRESH_S

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number of seconds: {text!r}") from None
    if not MIN_REFRESH_S <= value <= MAX_REFRESH_S:
        raise argparse.ArgumentTypeError(f"must be between {MIN_REFRESH_S} and {MAX_REFRESH_S} seconds: {text!r}")
    return value


def check_pid(pid: int | None, root: str = "/") -> None:
    """A --pid that names no process is an error before anything starts, not a TUI watching nothing.

    Another user's process passes: whether its cgroup can be read is the memory source's to say."""
    if pid is None:
        return
    from dltop.kernel import process_exists

    if os.path.realpath(root) != "/":  # a captured tree: its proc/ says which processes there were
        exists = pid > 0 and os.path.isdir(os.path.join(root, "proc", str(pid)))
    else:
        exists = process_exists(pid)
    if not exists:
        raise DltopError(f"no such process: {pid}")


def add_common_options(p: argparse.ArgumentParser) -> None:
    """Options every command that samples the system takes."""
    p.add_argument("--config", metavar="FILE", help="TOML config file (default: $XDG_CONFIG_HOME/dltop/config.toml)")
    p.add_argument("--root", metavar="DIR", default="/", help="read /proc and /sys under DIR (captured trees)")
    p.add_argument("--pid", type=int, metavar="PID",
                   help="process whose memory cgroup to watch and whose environment places the caches "
                        "(default: dltop's own)")
    p.add_argument("--user", type=user_id, metavar="USER",
                   help="show the training jobs (probes) of this user only, a name or a uid (default: every user's "
                        "as root, else your own)")
    p.add_argument("--no-discover", action="store_true",
                   help="do not look for the datasets training jobs read (their open files, the probe's data_dir)")


def user_id(text: str) -> int:
    """An argparse type: a user name or a uid, as the uid."""
    import pwd

    if text.isdigit() and len(text) <= 10:
        return int(text)
    try:
        return pwd.getpwnam(text).pw_uid
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(f"no such user: {text!r}") from None


def add_server_option(p: argparse.ArgumentParser) -> None:
    """--server URL, for the commands that show inference servers (the TUI, snapshot)."""
    p.add_argument("--server", dest="servers", action="append", metavar="URL",
                   help="scrape this vLLM or SGLang server's /metrics (host:port or a URL; repeatable; "
                        "replaces the config file's servers)")


def add_export_options(p: argparse.ArgumentParser, what: str) -> None:
    """--export ADDR:PORT and its --export-web-config FILE, for the commands that can serve metrics beside
    their own work (the TUI, record)."""
    p.add_argument("--export", metavar="ADDR:PORT",
                   help=f"also serve {what} as Prometheus metrics on ADDR:PORT (see dltop export)")
    p.add_argument("--export-web-config", metavar="FILE",
                   help="TLS and basic auth for --export, in the web config format of dltop export --web-config")


def export_args(args: argparse.Namespace) -> tuple[str, str | None] | None:
    """(listen, web config) of --export, or None without it; a web config without --export is an error."""
    listen, web = getattr(args, "export", None), getattr(args, "export_web_config", None)
    if web and not listen:
        raise DltopError("--export-web-config needs --export ADDR:PORT")
    return (listen, web) if listen else None


def add_cache_option(p: argparse.ArgumentParser) -> None:
    """--cache PATH, a cache folder to show beside the known ones (the TUI, snapshot, caches)."""
    p.add_argument("--cache", dest="caches", action="append", metavar="PATH",
                   help="also show this cache folder (repeatable; replaces the config file's caches)")


def add_jump_option(p: argparse.ArgumentParser) -> None:
    """--jump DURATION: how far j / J move in time (the live TUI's history, a replay)."""
    p.add_argument("--jump", type=_jump_seconds, metavar="DURATION",
                   help="how far j / J move in time: 90s, 10m, 1h (default 1m, or the config file's jump)")


def _tab(text: str) -> str:
    from dltop.config import tab_name

    try:
        return tab_name(text, "--tab")
    except DltopError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--tab: ")) from None


def add_tab_option(p: argparse.ArgumentParser, default: str) -> None:
    """--tab NAME: the TUI's tab to open on (the live TUI, a replay)."""
    from dltop.config import TAB_NAMES

    p.add_argument("--tab", type=_tab, metavar="NAME",
                   help=f"open on this tab: {', '.join(TAB_NAMES)} {default}")


def _jump_seconds(text: str) -> float:
    """An argparse type: a duration as the recorder reads one (90s, 10m, 1h, 7d), more than 0."""
    from dltop.recorder.times import parse_duration

    try:
        value = parse_duration(text)
    except DltopError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return above_zero(value, text, "seconds")


@contextlib.contextmanager
def escaped_output() -> Iterator[None]:
    """stdout and stderr through `EscapingWriter` while a command runs: what it prints may hold text from outside
    (paths, argv, a server's labels), and its controls are escaped on the way to the terminal. The TUI draws
    through its own driver (sys.__stderr__), each text made safe by the panes."""
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (s if isinstance(s, EscapingWriter) else EscapingWriter(s)  # type: ignore[assignment]
                              for s in streams)
    try:
        yield
    finally:
        for s in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a reader gone, a stream closed: said already
                s.flush()
        sys.stdout, sys.stderr = streams
