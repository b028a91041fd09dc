"""What every subcommand's parser shares: one-line usage errors and the options that every sampling command takes.

Below `cli.py`, so a command module never imports the entry point that imports it.
"""

from __future__ import annotations

import argparse
from typing import NoReturn


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog.split()[0]} --help)\n")


def add_common_options(p: argparse.ArgumentParser) -> None:
    """Options every command that samples the system takes."""
    p.add_argument("--config", metavar="FILE", help="TOML config file (default: $XDG_CONFIG_HOME/dltop/config.toml)")
    p.add_argument("--root", metavar="DIR", default="/", help="read /proc and /sys under DIR (captured trees)")
    p.add_argument("--pid", type=int, metavar="PID", help="process whose memory cgroup to watch (default: dltop's own)")
