"""A prometheus_client collector over the latest Snapshot: a scrape reads what the Sampler last composed and never
samples, and every scrape of one Snapshot is served from the one rendering of it.

The HTTP answer is encoded here from the field table (`encode`) rather than by prometheus_client's
`generate_latest`, which validates and escapes every label name of every sample again: on a node with 8 GPUs x 20
processes it took 4 in 5 of a scrape's time (benchmarks/export.py). Names and label names are checked once, in
FIELDS; a test holds the two encodings to the same parsed families, and promtool to the format.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence

from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from dltop import hints as hint_rules
from dltop.fields import FIELDS, PREFIX, Field, hint_samples, samples
from dltop.fmt import printable
from dltop.model import Snapshot
from dltop.model.datasets import DatasetsPart

OPENMETRICS = "application/openmetrics-text"
Grouped = list[tuple[Field, list[tuple[dict[str, str], float]]]]


def grouped(snapshot: Snapshot, prev: Snapshot | None = None, active: Sequence[hint_rules.Hint] = ()) -> Grouped:
    """The samples of each field that has any, in FIELDS order; a field without any (its part unavailable, its
    value unknown) is left out altogether."""
    by_field: dict[int, list[tuple[dict[str, str], float]]] = {}
    for f, labels, v in (*samples(snapshot, prev), *hint_samples(active)):
        by_field.setdefault(id(f), []).append((_printable_labels(labels), v))
    return [(f, by_field[id(f)]) for f in FIELDS if id(f) in by_field]


def _printable_labels(labels: dict[str, str]) -> dict[str, str]:
    """Label values from outside (a server's model name, a job id, a path) as `fmt.printable` shows them: a control
    character, a bidi override or a byte that was not UTF-8 becomes its visible escape ('\\x1b', '\\u202e'). Any
    UTF-8 is a valid label value, so without it `curl` of /metrics in a terminal would run a model name's controls."""
    if all(printable(x) is x for x in labels.values()):  # the common case: nothing to escape, the same dict
        return labels
    return {k: printable(x) for k, x in labels.items()}


def families(groups: Grouped) -> list[Metric]:
    """prometheus_client metric families of the grouped samples."""
    out: list[Metric] = []
    for f, got in groups:
        name = PREFIX + f.name
        fam: Metric
        if f.kind == "info":
            fam = InfoMetricFamily(name.removesuffix("_info"), f.help, labels=())
            for labels, _ in got:
                fam.add_metric((), labels)
        else:
            cls = CounterMetricFamily if f.kind == "counter" else GaugeMetricFamily
            fam = cls(name, f.help, labels=f.labels)
            for labels, v in got:
                fam.add_metric([labels[k] for k in f.labels], v)
        out.append(fam)
    return out


def _value(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


def _escape(s: str, quote: bool) -> str:
    if "\\" not in s and "\n" not in s and '"' not in s:
        return s
    s = s.replace("\\", "\\\\").replace("\n", "\\n")
    return s.replace('"', '\\"') if quote else s


def encode(groups: Grouped, openmetrics: bool) -> bytes:
    """The exposition of the grouped samples: Prometheus text format 0.0.4, or OpenMetrics 1.0 (info and counter
    families named without their `_info` / `_total`, and `# EOF` at the end), as prometheus_client writes them."""
    out: list[str] = []
    for f, got in groups:
        name = PREFIX + f.name
        kind: str
        family, kind = name, ("gauge" if f.kind == "info" else f.kind)  # text 0.0.4 has no info type
        if openmetrics and f.kind != "gauge":
            family, kind = name.removesuffix("_total").removesuffix("_info"), f.kind
        out.append(f"# HELP {family} {_escape(f.help, openmetrics)}\n# TYPE {family} {kind}\n")
        for labels, v in got:
            if labels:
                text = ",".join(f'{k}="{_escape(x, True)}"' for k, x in labels.items())
                out.append(f"{name}{{{text}}} {_value(v)}\n")
            else:
                out.append(f"{name} {_value(v)}\n")
    if openmetrics:
        out.append("# EOF\n")
    return "".join(out).encode()


class SnapshotCollector(Collector):
    """Holds the Snapshots of the last hints.WINDOW_S seconds; `collect()` gives the newest one's metrics (and
    the hints drawn from the window), worked out once per Snapshot however many scrapes ask."""

    def __init__(self, export_found: bool = False) -> None:
        # --export-found: the datasets training jobs read are served as watched ones are (off by default: other
        # users' paths, and series that come and go with the jobs)
        self.export_found = export_found
        self._lock = threading.Lock()
        self._history: deque[Snapshot] = deque()
        self._groups: Grouped | None = None
        self._rendered: dict[str, bytes] = {}
        self.builds = 0  # how many times the samples were worked out (one per Snapshot scraped at least once)
        self.updated_at: float | None = None  # time.monotonic() of the last update (the exporter's /-/healthy)
        self.registry = CollectorRegistry(auto_describe=False)  # private: only dltop's metrics, none of the process's
        self.registry.register(self)

    def update(self, snapshot: Snapshot) -> None:
        """The Sampler's newest Snapshot; cheap (the work waits for a scrape)."""
        with self._lock:
            self.updated_at = time.monotonic()
            if self._history and snapshot is self._history[-1]:
                return
            part = snapshot.datasets
            if self.export_found and isinstance(part, DatasetsPart) and part.found:
                snapshot = dataclasses.replace(snapshot, datasets=part.with_found_listed())
            self._history.append(snapshot)
            while self._history[0].ts < snapshot.ts - hint_rules.WINDOW_S:
                self._history.popleft()
            self._groups = None
            self._rendered = {}

    def collect(self) -> Iterator[Metric]:
        """The newest Snapshot's metric families (none before the first Snapshot)."""
        with self._lock:
            return iter(families(self._build()))

    def _build(self) -> Grouped:
        if self._groups is None:
            if not self._history:
                return []
            history = list(self._history)
            prev = history[-2] if len(history) > 1 else None
            self._groups = grouped(history[-1], prev, hint_rules.hints(history))
            self.builds += 1
        return self._groups

    def render(self, accept: str) -> tuple[bytes, str]:
        """The exposition in the format `accept` asks for (Prometheus text or OpenMetrics, as prometheus_client
        negotiates it): encoded once per Snapshot and format, so two Prometheus servers cost what one does."""
        _, content_type = choose_encoder(accept)
        with self._lock:
            body = self._rendered.get(content_type)
            if body is None:
                body = encode(self._build(), content_type.startswith(OPENMETRICS))
                self._rendered[content_type] = body
        return body, content_type
