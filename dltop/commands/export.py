"""`dltop export`: the Sampler's numbers as Prometheus metrics, served until stopped (docs/exporter.md)."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from typing import TYPE_CHECKING

from dltop.fmt import printable

if TYPE_CHECKING:  # the modules load when the command runs: `dltop --help` and the TUI's start stay fast
    from dltop.exporter.collector import SnapshotCollector
    from dltop.exporter.server import ExporterServer
    from dltop.sampler import Sampler

DEFAULT_INTERVAL_S = 5.0


def register(sub: argparse._SubParsersAction) -> None:
    """Add `dltop export`."""
    from dltop.commands.common import add_common_options, add_server_option, refresh_seconds
    from dltop.exporter.server import DEFAULT_LISTEN

    p = sub.add_parser("export", help="serve Prometheus metrics until stopped", description=__doc__)
    p.add_argument("--listen", default=DEFAULT_LISTEN, metavar="ADDR:PORT",
                   help=f"address to serve /metrics on (default {DEFAULT_LISTEN}; 0.0.0.0:PORT for every interface)")
    p.add_argument("--interval", type=refresh_seconds, default=None, metavar="SECONDS",
                   help=f"how often the fast sources are read (default {DEFAULT_INTERVAL_S:g}; a scrape reads "
                        "the latest reading, it never samples)")
    p.add_argument("--web-config", metavar="FILE",
                   help="TLS and basic auth, in the web config format of Prometheus' exporter-toolkit")
    p.add_argument("--dataset", dest="paths", action="append", metavar="PATH",
                   help="export the residency of this dataset directory (repeatable)")
    p.add_argument("--export-found", action="store_true",
                   help="also export the datasets training jobs are found reading (their paths, other users' too "
                        "as root; off by default: series that come and go with the jobs)")
    add_server_option(p)
    add_common_options(p)
    p.set_defaults(func=run)


def start_exporter(listen: str, web_config: str | None = None, interval_s: float = DEFAULT_INTERVAL_S,
                   export_found: bool = False) -> tuple[SnapshotCollector, ExporterServer]:
    """(collector, started server) for `listen`: bad options and a port in use fail here, before any sampling.
    /-/healthy turns 503 when no Snapshot came for three intervals and 10 s."""
    from dltop.exporter.collector import SnapshotCollector
    from dltop.exporter.server import ExporterServer
    from dltop.exporter.webconfig import load_web_config

    web = load_web_config(web_config) if web_config else None
    collector = SnapshotCollector(export_found=export_found)
    server = ExporterServer(listen, collector, web, stale_after_s=3 * interval_s + 10)
    server.start()
    return collector, server


def run(args: argparse.Namespace) -> int:
    """Sample on the Sampler's cadence and serve the latest Snapshot until SIGINT or SIGTERM."""
    from dataclasses import replace

    from dltop.commands.common import check_pid
    from dltop.config import settings_from_args
    from dltop.sampler import Sampler
    from dltop.sources.registry import build_sources

    # A dataset path missing at start (NFS not mounted yet) is served as dltop_dataset_up 0, as one from the
    # config or one that vanishes later is: the other commands refuse it, an exporter must still serve.
    paths, args.paths = args.paths, None
    settings = settings_from_args(args)
    # The config's Prometheus is the Cluster tab's: an exporter reading the cluster back would serve nothing of it.
    settings = replace(settings, refresh_s=args.interval or DEFAULT_INTERVAL_S, prometheus=None)
    # Found datasets are looked for only when they are served (--export-found): nothing else reads them here.
    settings = replace(settings, discover=settings.discover and args.export_found)
    if paths:
        settings = replace(settings, datasets=tuple(dict.fromkeys(os.path.abspath(p) for p in paths)))
        for p in settings.datasets:
            if not os.path.lexists(p):
                print(f"dltop export: {printable(p)}: no such path (yet): served as dltop_dataset_up 0 until it "
                      "appears", file=sys.stderr, flush=True)
    check_pid(settings.pid, settings.root)
    collector, server = start_exporter(args.listen, args.web_config, settings.refresh_s, args.export_found)
    print(f"dltop export: serving {server.url}", file=sys.stderr, flush=True)
    sampler = Sampler(build_sources(settings), root=settings.root, builder=build_sources)
    try:
        asyncio.run(_feed(sampler, collector, settings.refresh_s))
    finally:
        sampler.close()
        server.close()
    return 0


async def _feed(sampler: Sampler, collector: SnapshotCollector, interval_s: float) -> None:
    """Hand each Snapshot to the collector until a signal says stop."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def consume() -> None:
        sampler.start()
        await sampler.wait_first(timeout_s=1.0)
        collector.update(sampler.snapshot())
        async for snap in sampler.stream(lambda: interval_s):
            collector.update(snap)

    task = asyncio.create_task(consume())
    await stop.wait()
    task.cancel()
