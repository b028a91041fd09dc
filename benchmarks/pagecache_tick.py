"""The Page cache tab's cost per tick with a full history: the CPU of `DltopApp.apply` and of Textual's paint after it.

The overhead benchmark measures a minute after the start, when the history holds under 60 of its 600 Snapshots; a
monitor left open runs with it full, where each tick goes over 600 readings per chart. This plays real Snapshots
of this machine (read back to back from the live Sampler, 40 ms apart, relabelled 1 s apart) into the app headless
at 80x24, the history full (`--history 600`) or not, and prints the median CPU of `_apply` and of
`Screen._compositor_refresh` per tick (thread CPU clocks). `--snapshots FILE` keeps the Snapshots it read (a pickle)
and plays that file when it exists, so that two checkouts run on the same readings:

  PYTHONPATH=/work/main .venv/bin/python benchmarks/pagecache_tick.py --snapshots /tmp/snaps.pkl
  PYTHONPATH=.          .venv/bin/python benchmarks/pagecache_tick.py --snapshots /tmp/snaps.pkl
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import pickle
import statistics
import time
from pathlib import Path

from textual.screen import Screen

from dltop.config import Settings
from dltop.model import Snapshot
from dltop.sampler import ListFeed, Sampler
from dltop.sources.registry import build_sources
from dltop.tui.app import DltopApp


def capture(n: int) -> list[Snapshot]:
    sampler = Sampler(build_sources(Settings()), builder=build_sources)
    out = []
    try:
        for i in range(n):
            out.append(dataclasses.replace(sampler.read_once(), ts=1_000_000.0 + i))
            time.sleep(0.04)
    finally:
        sampler.close()
    return out


def ticks(snaps: list[Snapshot], history: int) -> tuple[list[float], list[float]]:
    painted = [0.0]
    refresh = Screen._compositor_refresh

    def timed(screen: Screen) -> None:
        c0 = time.thread_time()
        refresh(screen)
        painted[0] += time.thread_time() - c0

    Screen._compositor_refresh = timed  # type: ignore[method-assign,assignment]
    applies: list[float] = []
    paints: list[float] = []

    async def run() -> None:
        app = DltopApp(ListFeed(snaps[:history], start=history - 1), Settings(tab="pagecache"))
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            await asyncio.sleep(0.3)
            for snap in snaps[history:]:
                painted[0] = 0.0
                c0 = time.thread_time()
                app.apply(snap)
                applies.append(time.thread_time() - c0)
                await asyncio.sleep(0.05)  # Textual paints on its own timer, as between two ticks
                paints.append(painted[0])

    try:
        asyncio.run(run())
    finally:
        Screen._compositor_refresh = refresh  # type: ignore[method-assign]
    return applies, paints


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--history", type=int, default=600, help="Snapshots in the history before the ticks")
    ap.add_argument("--ticks", type=int, default=120)
    ap.add_argument("--snapshots", help="a pickle of the Snapshots: played if it exists, else written")
    args = ap.parse_args()
    path = Path(args.snapshots) if args.snapshots else None
    if path is not None and path.exists():
        snaps = pickle.loads(path.read_bytes())  # a file this benchmark wrote  # noqa: S301
    else:
        snaps = capture(args.history + args.ticks)
        if path is not None:
            path.write_bytes(pickle.dumps(snaps))
    history = min(args.history, len(snaps) - 1)
    applies, paints = ticks(snaps, history)
    m = statistics.median
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"Page cache tab, 80x24, history {history}, {len(applies)} ticks (load {load}): _apply median "
          f"{m(applies) * 1e3:.2f} ms, paint median {m(paints) * 1e3:.2f} ms, both {(m(applies) + m(paints)) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
