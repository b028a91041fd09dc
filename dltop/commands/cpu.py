"""`dltop cpu`: the CPU cache hierarchy, per core kind, with registers decoded and problems flagged.

The text itself (tree, per-kind table, registers) is `dltop.text.cpu`, which the TUI's CPU pane shows too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from dltop import cpuregs
from dltop.errors import DltopError
from dltop.model.base import Unavailable, to_dict
from dltop.sources.cpu import read_cpu
from dltop.text.cpu import decode_text, render_text

# For users: what it shows (the module docstring above names modules, which --help must not).
DESCRIPTION = ("The CPU cache hierarchy, per core kind, with registers decoded and problems flagged: every cache, "
               "which CPUs share it, its size, ways, sets and line size. The TUI's CPU caches tab shows the same "
               "tree, core kinds and flags; the ways, sets and line of each cache are in this command's table.")


def register(sub: argparse._SubParsersAction) -> None:
    """Add `dltop cpu`."""
    p = sub.add_parser("cpu", help="CPU cache topology: every cache, who shares it, core kinds, registers",
                       description=DESCRIPTION)
    p.add_argument("--sysroot", "--root", dest="sysroot", metavar="DIR", default="/",
                   help="read sys/ and proc/ under DIR (a captured tree, like lscpu --sysroot)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--decode", action="append", metavar="REG=VALUE", type=_decode_arg,
                   help="decode a register value (" + ", ".join(cpuregs.REGISTERS) + "; 0x for hex, bare "
                        "digits are refused as ambiguous); repeatable; reads nothing from the system")
    p.add_argument("--full-tree", action="store_true", help="print every node of the tree (no folding)")
    p.set_defaults(func=run)


def _decode_arg(text: str) -> tuple[str, int]:
    """--decode's type: a bad value is a usage error (exit 2), checked before anything runs."""
    try:
        return cpuregs.parse_decode_arg(text)
    except DltopError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def run(args: argparse.Namespace) -> int:
    """Print the topology (or the decoded registers) as text or JSON."""
    if args.decode:
        decoded = [cpuregs.decode_register(name, value) for name, value in args.decode]
        if args.json:
            _write(json.dumps(decoded if len(decoded) > 1 else decoded[0], indent=2))
        else:
            _write("\n\n".join(decode_text(d) for d in decoded))
        return 0
    root = args.sysroot
    if not os.path.isdir(root):
        raise DltopError(f"sysroot is not a directory: {root}")
    part = read_cpu(root)
    if isinstance(part, Unavailable):
        raise DltopError(f"no CPU information under {root}: {part.reason}")
    if args.json:
        data = to_dict(part)
        data["notes"] = list(part.notes())
        _write(json.dumps(data, indent=2))
    else:
        _write(render_text(part, root, fold=not args.full_tree))
    return 0


def _write(text: str) -> None:
    sys.stdout.write(text.rstrip("\n") + "\n")
    sys.stdout.flush()
