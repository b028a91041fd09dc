"""`dltop [PATH...]`: the live TUI. Textual is imported here, only when the TUI starts."""

from __future__ import annotations

import argparse
import os

from dltop.config import settings_from_args
from dltop.errors import DltopError
from dltop.sampler import Sampler
from dltop.sources.registry import build_sources


def check_dataset_paths(paths: tuple[str, ...]) -> None:
    """Every dataset path must be an existing directory or file (a typo is caught before the screen opens)."""
    for p in paths:
        if not os.path.exists(p):
            raise DltopError(f"no such dataset path or subcommand: {p} (see dltop --help)")


def run_tui(args: argparse.Namespace) -> int:
    """Start the TUI on the live Sampler."""
    settings = settings_from_args(args)
    check_dataset_paths(settings.datasets)
    if not os.path.isdir(os.path.join(settings.root, "proc")):
        raise DltopError(f"--root {settings.root}: no proc/ directory under it")
    from dltop.tui.app import DltopApp

    sampler = Sampler(build_sources(settings), root=settings.root)
    DltopApp(sampler, settings).run()
    return 0
