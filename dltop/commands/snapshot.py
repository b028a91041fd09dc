"""`dltop snapshot`: read every source once and print one Snapshot (the structure the recorder stores)."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number of seconds: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds: {text!r}")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    """Add `dltop snapshot`."""
    from dltop.commands.common import (
        add_cache_option,
        add_common_options,
        add_server_option,
        non_negative_int,
    )

    p = sub.add_parser("snapshot", help="print one Snapshot and exit", description=__doc__)
    p.add_argument("--json", action="store_true", help="print JSON (the default; kept for scripts)")
    p.add_argument("--indent", type=non_negative_int, default=None, metavar="N", help="indent the JSON by N spaces")
    p.add_argument("--timeout", type=_positive_seconds, default=None, metavar="SECONDS",
                   help="give up on a source after this long (default: each source's own)")
    p.add_argument("--dataset", dest="paths", action="append", metavar="PATH",
                   help="include the residency of this dataset directory (repeatable)")
    add_server_option(p)
    add_cache_option(p)
    add_common_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print one Snapshot as JSON."""
    from dltop.commands.common import check_pid
    from dltop.config import settings_from_args

    settings = settings_from_args(args)
    check_pid(settings.pid, settings.root)
    sys.stdout.write(read_snapshot(settings, args.timeout).to_json(indent=args.indent) + "\n")
    sys.stdout.flush()
    return 0


def read_snapshot(settings: Any, timeout_s: float | None) -> Any:
    """One Snapshot: every source the settings name, read once (each given up on after `timeout_s`)."""
    from dltop.sampler import Sampler
    from dltop.sources.registry import build_sources

    sampler = Sampler(build_sources(settings), root=settings.root)
    try:
        return sampler.read_once(timeout_s)
    finally:
        sampler.close()
