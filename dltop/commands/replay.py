"""`dltop replay [PATH] [-t TIME]`: the TUI's panes fed from a recording. No sources, no NVML, no root."""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace

from dltop.errors import DltopError


def register(sub: argparse._SubParsersAction) -> None:
    """Add `dltop replay`."""
    from dltop.commands.common import add_jump_option, add_tab_option

    p = sub.add_parser("replay", help="show a recording in the TUI: step, jump, go to a time, play",
                       description="The TUI's panes fed from a recording (`dltop record`, `dltop --record DIR`): "
                                   "t/T next/previous sample, j/J jump, b go to a time, space play/pause, "
                                   "< > speed x1/x10/x60, v the event list. Nothing can change the system.")
    p.add_argument("path", metavar="PATH", nargs="?", default=None,
                   help="a recording directory or one segment file (default: the directory `record` uses)")
    p.add_argument("-t", "--time", metavar="TIME",
                   help="start at TIME: '10m ago', 14:05, ISO 8601, epoch seconds, start, end (default: start)")
    add_jump_option(p)
    add_tab_option(p, "(default: the tab the recording showed)")
    p.add_argument("--config", metavar="FILE", help="TOML config file (default: $XDG_CONFIG_HOME/dltop/config.toml)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Open the recording, find the start time in it, and show it in the TUI."""
    from dltop.commands.record import damage_note
    from dltop.commands.tui import need_terminal, run_replay_tui
    from dltop.config import settings_from_args
    from dltop.recorder import Recording, default_directory, parse_time
    from dltop.recorder.reader import recorded_tab
    from dltop.recorder.times import gap_note, index_typed, meta_interval

    settings = settings_from_args(args)
    path = args.path or default_directory()
    recording = Recording(path)
    times = recording.times()
    if not times:
        raise DltopError(f"{path}: the recording holds no samples")
    start, note = times[0], None
    if args.time:
        start = parse_time(args.time, time.time(), recording)
        slack = meta_interval(recording.meta)
        if not times[0] <= start <= times[-1] + slack:
            raise DltopError(f"-t {args.time}: {_when(start)} is outside the recording ({_when(times[0])} to "
                             f"{_when(times[-1])})")
        note = gap_note(times, start, meta_interval(recording.meta))  # said once the replay is on screen
        start = times[index_typed(times, start)]
    if not args.tab:  # the tab the recording had on screen then, else the config's, else the one with something
        settings = replace(settings, tab=recorded_tab(recording.events(), start) or settings.tab)
    need_terminal(f"for the recording as text use `dltop report {path}` or `dltop dump {path}`")
    name = os.path.basename(os.path.normpath(recording.path))
    try:
        return run_replay_tui(recording, name, start, settings, note)
    finally:  # once the screen is the shell's again: what the replay met that was damaged
        damage_note("replay", recording)


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(ts))
