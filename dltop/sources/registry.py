"""Which sources run, built from Settings. The one list the TUI, `snapshot`, the recorder and exporter share."""

from __future__ import annotations

from dltop.config import Settings
from dltop.sources.base import Source


def build_sources(settings: Settings) -> list[Source]:
    """Every source the settings ask for, each with its own cadence."""
    from dltop.sources import caches, cpu, gpu, memory, probes

    probe_reader = probes.ProbeReader(settings.root, settings.user)
    sources = [memory.source(settings), cpu.source(settings), gpu.source(settings),
               probes.source(settings, probe_reader), caches.source(settings)]
    if settings.datasets or (settings.discover and settings.root == "/"):
        from dltop.sources import datasets  # with discovery, the datasets training jobs read are found too

        # discovery takes the probed jobs from the probes source's readings: one pass over /proc, not two
        sources.append(datasets.source(settings, probes.LastRead(probe_reader)))
    if settings.servers:
        from dltop.sources import servers

        # One source per server, each on its own thread: a hung server holds only its own.
        sources.extend(servers.source(settings, url) for url in settings.servers)
    if settings.prometheus is not None:
        from dltop.sources import cluster

        sources.append(cluster.source(settings))
    return sources
