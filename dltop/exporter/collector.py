"""A prometheus_client collector over the latest Snapshot: a scrape reads what the Sampler last composed and never
samples, and every scrape of one Snapshot is served from the one rendering of it."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator, Sequence

from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from dltop import hints as hint_rules
from dltop.fields import FIELDS, PREFIX, Field, Sample, hint_samples, samples
from dltop.model import Snapshot


def families(snapshot: Snapshot, prev: Snapshot | None = None,
             active: Sequence[hint_rules.Hint] = ()) -> list[Metric]:
    """One metric family per field with samples, in FIELDS order; a field without any (its part unavailable, its
    value unknown) has no family at all."""
    by_field: dict[Field, list[Sample]] = {}
    for s in (*samples(snapshot, prev), *hint_samples(active)):
        by_field.setdefault(s[0], []).append(s)
    out: list[Metric] = []
    for f in FIELDS:
        got = by_field.get(f)
        if not got:
            continue
        name = PREFIX + f.name
        fam: Metric
        if f.kind == "info":
            fam = InfoMetricFamily(name.removesuffix("_info"), f.help, labels=())
            for _, labels, _v in got:
                fam.add_metric((), labels)
            out.append(fam)
            continue
        if f.kind == "counter":
            fam = CounterMetricFamily(name, f.help, labels=f.labels)
        else:
            fam = GaugeMetricFamily(name, f.help, labels=f.labels)
        for _, labels, v in got:
            fam.add_metric([labels[k] for k in f.labels], v)
        out.append(fam)
    return out


class SnapshotCollector(Collector):
    """Holds the Snapshots of the last hints.WINDOW_S seconds; `collect()` gives the newest one's metrics (and
    the hints drawn from the window), built once per Snapshot however many scrapes ask."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # render() holds it while the encoder calls collect()
        self._history: deque[Snapshot] = deque()
        self._families: list[Metric] | None = None
        self._rendered: dict[str, bytes] = {}
        self.builds = 0  # how many times the families were built (one per Snapshot scraped at least once)
        self.registry = CollectorRegistry(auto_describe=False)  # private: only dltop's metrics, none of the process's
        self.registry.register(self)

    def update(self, snapshot: Snapshot) -> None:
        """The Sampler's newest Snapshot; cheap (the work waits for a scrape)."""
        with self._lock:
            if self._history and snapshot is self._history[-1]:
                return
            self._history.append(snapshot)
            while self._history[0].ts < snapshot.ts - hint_rules.WINDOW_S:
                self._history.popleft()
            self._families = None
            self._rendered = {}

    def collect(self) -> Iterator[Metric]:
        """The newest Snapshot's metric families (none before the first Snapshot)."""
        with self._lock:
            return iter(self._build())

    def _build(self) -> list[Metric]:
        if self._families is None:
            if not self._history:
                return []
            history = list(self._history)
            prev = history[-2] if len(history) > 1 else None
            self._families = families(history[-1], prev, hint_rules.hints(history))
            self.builds += 1
        return self._families

    def render(self, accept: str) -> tuple[bytes, str]:
        """The exposition in the format `accept` asks for (Prometheus text or OpenMetrics): encoded once per
        Snapshot and format, so two Prometheus servers scraping cost what one does."""
        encoder, content_type = choose_encoder(accept)
        with self._lock:
            body = self._rendered.get(content_type)
            if body is None:
                body = self._rendered[content_type] = encoder(self.registry)
        return body, content_type
