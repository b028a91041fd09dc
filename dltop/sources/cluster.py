"""The cluster: every node's `dltop export`, read back from the Prometheus that scrapes them (docs/cluster.md).

A refresh is a fixed list of instant queries (`/api/v1/query`, all at one evaluation time), the same count for 2
nodes or 2,000: label-based selections (`{__name__=~"..."}`) and aggregations fetch every node at once. The user's
`--selector` is parsed and put back in every query, so it can add label matchers and nothing else. The answer is
hostile input: bounded in size and series, each value checked (finite, in range), each label a string of bounded
length; a bad series costs only itself, with a note. No proxy is used and no redirect followed (credentials go
only where the user sent them).
"""

from __future__ import annotations

import base64
import contextvars
import http.client
import json
import math
import re
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Collection, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from dltop.config import PrometheusOptions, Settings
from dltop.errors import DltopError
from dltop.fmt import human_duration, printable
from dltop.model.base import Unavailable
from dltop.model.cluster import (
    ClusterDataset,
    ClusterGpu,
    ClusterHint,
    ClusterJob,
    ClusterNode,
    ClusterPart,
    ClusterRank,
    ClusterServer,
)
from dltop.sources.base import Source
from dltop.sources.servers import ScrapeError, Watchdog, read_body, watched_handlers
from dltop.trusted import read_trusted

MAX_ANSWER_BYTES = 32 << 20  # per answer, as sent and once inflated: 256 nodes x 8 GPUs answer a few MiB
MAX_REFRESH_BYTES = 64 << 20  # every answer of one refresh together (up to 4 are read at once): what it may hold
MAX_CA_BYTES = 1 << 20  # a CA bundle (the system's is ~200 KiB)
MAX_SERIES = 200_000  # per query
MAX_LABEL_CHARS = 4096
MAX_NODES = 10_000
MAX_NOTES = 10
MAX_BYTES = 2**63  # a byte count past this is no node's
STALE_AFTER_S = 120.0  # an exporter whose newest reading is older than this is down, whatever `up` says
LOOKBACK = "1h"  # a node's newest reading is looked for this far back (when it went down)
JOBS_LOOKBACK_S = 7 * 86400  # a scrape job that served dltop's metrics within this is dltop's: its every target is
# a node, listed up or down (as the DltopExporterDown alert knows the jobs, over the same week)
QUERY_THREADS = 4
INTERVAL_S = 5.0  # the Cluster tab's refresh: Prometheus scrapes every 15 s by default
NODE_LABELS = ("node", "nodename", "hostname", "kubernetes_node", "host")  # the first present names the node
POD_LABELS = ("pod", "kubernetes_pod_name", "pod_name")
NAMESPACE_LABELS = ("namespace", "kubernetes_namespace")

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_MATCHER = re.compile(rf'\s*({_NAME})\s*(=~|!~|!=|=)\s*"((?:[^"\\\n]|\\.)*)"\s*(,|$)')
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n", "t": "\t"}


class ClusterError(Exception):
    """A refresh that gave no answer to read: one line saying why (unreachable, unauthorized, not Prometheus)."""


def parse_selector(text: str) -> list[tuple[str, str, str]]:
    """The label matchers of a selector (`job="dltop",cluster=~"a|b"`, braces optional) as (name, op, value);
    raises ValueError naming what is wrong. Values are PromQL strings in double quotes."""
    s = text.strip()
    if s.startswith("{") and s.endswith("}"):
        s = s[1:-1]
    out: list[tuple[str, str, str]] = []
    pos = 0
    while pos < len(s) and s[pos:].strip():
        m = _MATCHER.match(s, pos)
        if m is None:
            raise ValueError(f"selector {printable(text)!r}: expected NAME=\"VALUE\" (or !=, =~, !~), comma-separated, "
                             f"at character {pos + 1}")
        name, op, raw = m.group(1), m.group(2), m.group(3)
        if name == "__name__":
            raise ValueError(f"selector {printable(text)!r}: a metric name matcher would hide dltop's metrics")
        out.append((name, op, _unescaped(raw, text)))
        pos = m.end()
        if m.group(4) == "" and pos < len(s):
            raise ValueError(f"selector {printable(text)!r}: a comma between matchers")
    return out


def _unescaped(raw: str, text: str) -> str:
    """A PromQL string's value: its escapes read (ValueError naming an unknown one)."""
    value, i = [], 0
    while i < len(raw):
        if raw[i] == "\\":
            nxt = raw[i + 1]
            if nxt not in _ESCAPES:
                raise ValueError(f"selector {printable(text)!r}: unknown escape \\{printable(nxt)}")
            value.append(_ESCAPES[nxt])
            i += 2
        else:
            value.append(raw[i])
            i += 1
    return "".join(value)


def selector_text(matchers: Iterable[tuple[str, str, str]]) -> str:
    """Matchers written back as PromQL (values quoted by json: the escapes PromQL reads)."""
    return ",".join(f"{n}{op}{json.dumps(v, ensure_ascii=False)}" for n, op, v in matchers)


def dltop_series(selector: str) -> str:
    """The series every dltop exporter serves once per node: which scrape jobs are dltop's, and when a node last
    served."""
    return f"dltop_snapshot_timestamp_seconds{{{selector}}}" if selector else "dltop_snapshot_timestamp_seconds"


GPU_SUMS = {"read": "count", "used": "sum", "total": "sum", "util": "avg"}  # the table's per-node GPU numbers


def queries(selector: str, detail: str | None = None) -> dict[str, str]:
    """The instant queries of one refresh, by what each fetches; `selector` is checked matchers (selector_text).
    With `detail` (matchers of the nodes to detail, "" for every node), the per-GPU and per-rank queries too."""

    def sel(name: str = "", extra: str = "") -> str:
        inner = ",".join(x for x in (extra, selector) if x)
        return f"{name}{{{inner}}}" if inner else name

    def names(pattern: str, extra: str = "") -> str:
        return sel(extra=",".join(x for x in (f'__name__=~"{pattern}"', extra) if x))

    def tagged(what: str, expr: str) -> str:
        # Aggregations drop the name: a label says which number each per-node series is.
        return f'label_replace({expr}, "dltop_sum", "{what}", "", "")'

    gpu_metric = {"read": "dltop_gpu_up", "used": "dltop_gpu_memory_used_bytes",
                  "total": "dltop_gpu_memory_total_bytes", "util": "dltop_gpu_utilization_ratio"}
    out = {
        "up": sel("up"),
        "seen": f"last_over_time({dltop_series(selector)}[{LOOKBACK}])",
        "node": names("dltop_(memory_(total|available|cached|dirty)_bytes|gpus)"),
        "pressure": sel("dltop_pressure_stalled_avg10_ratio", 'resource="memory"'),
        # Summed by Prometheus: one series a node and number, not one a GPU (2,048 GPUs answer 1,024 series).
        "gpu_sums": " or ".join(tagged(w, f"{op} by (job, instance) ({sel(gpu_metric[w])})")
                                for w, op in GPU_SUMS.items()),
        "gpu_lost": f"({sel('dltop_gpu_up')} == 0) or {sel('dltop_gpu_down_info')}",
        "dataset": names("dltop_dataset_(up|size_bytes|resident_bytes|resident_ratio|unavailable_info)"),
        # The jobs table: each job's ranks per node, and its slowest and most waiting rank, by Prometheus.
        # a job is (uid, job_id): another user's ranks that claim the job id are a job of their own
        "job_ranks": f"count by (uid, job_id, job, instance) ({sel('dltop_training_steps_total')})",
        "job_slowest": f"topk by (uid, job_id) (1, {sel('dltop_training_step_seconds')})",
        "job_waiting": f"topk by (uid, job_id) (1, {sel('dltop_training_data_wait_ratio')})",
        "hint": sel("dltop_hint_active"),
        "kv_usage": f"max by (job, instance, server) ({sel('dltop_inference_kv_cache_usage_ratio')})",
        "kv_bytes": sel("dltop_inference_kv_cache_capacity_bytes"),
        "source_down": f"{sel('dltop_source_up')} == 0",
    }
    if detail is not None:
        out["gpu"] = names("dltop_gpu_(up|memory_total_bytes|memory_used_bytes|utilization_ratio|info|down_info)",
                           detail)
        out["gpu_use"] = f"sum by (job, instance, gpu, uuid, use) ({sel('dltop_gpu_memory_bytes', detail)})"
        out["training"] = names("dltop_training_(data_wait_ratio|step_seconds|steps_total)", detail)
    return out


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
        raise ClusterError(f"HTTP {code}: Prometheus redirects to {printable(newurl)[:200]} (not followed: "
                           "give that URL)")


class Refresh:
    """The bounds of one refresh, shared by all its queries: one deadline (`timeout_s`, --prometheus-timeout) for
    all of them together, kept by a watchdog that shuts every socket at it (a socket's own timeout is per read: a
    server that sends a byte a second never trips it), and one byte budget over all their answers."""

    def __init__(self, timeout_s: float, max_bytes: int = MAX_REFRESH_BYTES) -> None:
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.watchdog = Watchdog(timeout_s)
        self.max_bytes = max_bytes
        self.kept = 0
        self._lock = threading.Lock()

    def __enter__(self) -> Refresh:
        self.watchdog.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.watchdog.__exit__(*exc)

    def late(self) -> bool:
        """The deadline has passed (or a sibling query failed and stopped the rest)."""
        return self.watchdog.fired or time.monotonic() >= self.deadline

    def take(self, n: int) -> None:
        """Count `n` more bytes kept from an answer; over the budget raises ScrapeError("too_large")."""
        with self._lock:
            self.kept += n
            if self.kept > self.max_bytes:
                raise ScrapeError("too_large", "budget")


_REFRESH: contextvars.ContextVar[Refresh | None] = contextvars.ContextVar("dltop_cluster_refresh", default=None)


@dataclass
class PrometheusClient:
    """Instant queries against one Prometheus, with the credentials of `opts`; counts what it asked."""

    opts: PrometheusOptions
    queries: int = 0
    _context: ssl.SSLContext | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if self.opts.url.startswith("https:"):
            ca = None
            if self.opts.ca_file:  # a trust anchor: whoever can write it can read the password sent over TLS
                raw = read_trusted(self.opts.ca_file, "--prometheus-ca-file", MAX_CA_BYTES)
                ca = raw.decode("ascii") if raw.isascii() else bytes(raw)  # PEM text, or DER
            ctx = ssl.create_default_context(cadata=ca) if ca is not None else ssl.create_default_context()
            if self.opts.insecure_skip_verify:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            self._context = ctx

    def _opener(self, watchdog: Watchdog) -> Any:
        _, plain, tls = watched_handlers()  # connections the refresh's watchdog can shut
        return urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirects(), plain(watchdog),
                                           tls(watchdog, self._context))

    def _headers(self) -> dict[str, str]:
        # The files are read at each refresh, as Prometheus reads its own: a rotated token is picked up.
        o = self.opts
        if o.bearer_token_file:
            return {"Authorization": "Bearer " + _secret(o.bearer_token_file, "--prometheus-bearer-token-file")}
        if o.username:
            password = _secret(o.password_file, "--prometheus-password-file") if o.password_file else ""
            token = base64.b64encode(f"{o.username}:{password}".encode()).decode("ascii")
            return {"Authorization": "Basic " + token}
        return {}

    def query(self, expr: str, at: float, refresh: Refresh | None = None) -> list[dict[str, Any]]:
        """The result of an instant query at `at`: a list of {"metric": {...}, "value": [ts, "text"]}. Within
        `refresh`'s deadline and byte budget (read_cluster's, else a query on its own gets a refresh of its own)."""
        raw = self._call("/api/v1/query", {"query": expr, "time": f"{at:.3f}"}, refresh)
        return _vector(raw, printable(self.opts.url))

    def label_values(self, label: str, match: str, start: float, end: float,
                     refresh: Refresh | None = None) -> list[str]:
        """The values of `label` on the series `match` selects between `start` and `end` (/api/v1/label/NAME/values:
        the index only, no sample is read, however long the span), within the refresh's bounds as `query`."""
        raw = self._call(f"/api/v1/label/{label}/values",
                        {"match[]": match, "start": f"{start:.3f}", "end": f"{end:.3f}"}, refresh, post=False)
        return _strings(raw, printable(self.opts.url))

    def _call(self, path: str, params: dict[str, str], refresh: Refresh | None, post: bool = True) -> bytearray:
        """The raw answer of one API call (counted in `queries`)."""
        refresh = refresh or _REFRESH.get()
        if refresh is None:
            with Refresh(self.opts.timeout_s) as own:
                return self._call(path, params, own, post)
        with self._lock:
            self.queries += 1
        where = printable(self.opts.url)
        late = ClusterError(f"{where}: timeout after {refresh.timeout_s:g} s: the refresh's queries were not all "
                            "answered in that time (--prometheus-timeout)")
        if refresh.late():
            raise late
        form = urllib.parse.urlencode(params)
        headers = {**self._headers(), "Accept": "application/json", "Accept-Encoding": "gzip"}
        if post:
            req = urllib.request.Request(self.opts.url + path, data=form.encode(), method="POST",
                                         headers={**headers, "Content-Type": "application/x-www-form-urlencoded"})
        else:  # the label values API is GET only
            req = urllib.request.Request(f"{self.opts.url}{path}?{form}", method="GET", headers=headers)
        try:
            # The socket's timeout only bounds each read; the watchdog and read_body bound the whole refresh.
            with self._opener(refresh.watchdog).open(req, timeout=max(0.01, refresh.deadline - time.monotonic())
                                                     ) as resp:
                raw = read_body(resp, refresh.deadline, MAX_ANSWER_BYTES, refresh.watchdog, refresh.take)
        except (ScrapeError, OSError, http.client.HTTPException) as e:
            raise (late if _timed_out(e, refresh) else _failure(e, refresh, where)) from None
        if refresh.late():
            raise late
        return raw


def _timed_out(e: Exception, refresh: Refresh) -> bool:
    """The deadline (or the watchdog's shutdown, read as a broken answer) is why a query failed; an HTTP error is an
    answer, whenever it came."""
    if isinstance(e, urllib.error.HTTPError):
        return False
    if isinstance(e, TimeoutError) or isinstance(e, ScrapeError) and e.state == "timeout":
        return True
    if isinstance(e, urllib.error.URLError) and isinstance(e.reason, TimeoutError):
        return True
    return refresh.late()


def _failure(e: Exception, refresh: Refresh, where: str) -> ClusterError:
    """The one line that says why a query got no answer (other than the deadline)."""
    if isinstance(e, ScrapeError):
        if e.state == "too_large" and str(e) == "budget":
            return ClusterError(f"{where}: answers over {refresh.max_bytes >> 20} MiB in one refresh: refused "
                                "(narrow it with --selector)")
        if e.state == "too_large":
            return ClusterError(f"{where}: answer over {MAX_ANSWER_BYTES >> 20} MiB: refused (narrow it with "
                                "--selector)")
        return ClusterError(f"{where}: {e}")
    if isinstance(e, urllib.error.HTTPError):
        return _http_failure(e, refresh, where)
    if isinstance(e, urllib.error.URLError):
        if isinstance(e.reason, ssl.SSLError | ssl.CertificateError):
            return ClusterError(f"{where}: TLS: {printable(str(e.reason))[:200]} (--prometheus-ca-file, or "
                                "--prometheus-insecure)")
        return ClusterError(f"{where}: cannot reach it: {printable(str(e.reason))[:200]}")
    return ClusterError(f"{where}: {printable(getattr(e, 'strerror', None) or str(e))[:200]}")


def _http_failure(e: urllib.error.HTTPError, refresh: Refresh, where: str) -> ClusterError:
    if e.code in (401, 403):
        return ClusterError(f"{where}: HTTP {e.code}: not authorized (--prometheus-user and "
                            "--prometheus-password-file, or --prometheus-bearer-token-file)")
    try:
        raw = read_body(e, refresh.deadline, 64 << 10, refresh.watchdog)
    except Exception:  # noqa: BLE001 - the error's body is only a better message
        raw = bytearray()
    return ClusterError(f"{where}: HTTP {e.code}: {_api_error(raw) or printable(str(e.reason))[:200]}")


def _secret(path: str, what: str) -> str:
    """A password or token file, trusted as ssh trusts its files (dltop.trusted.open_trusted): another user's, or
    one another user can write, is refused before anything is sent."""
    try:
        return read_trusted(path, what).decode("utf-8").strip()
    except DltopError as e:
        raise ClusterError(str(e)) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ClusterError(f"{printable(path)}: cannot be read: {getattr(e, 'strerror', None) or e}") from None


def _api_error(raw: bytes | bytearray) -> str | None:
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if isinstance(doc, dict) and isinstance(doc.get("error"), str):
        return printable(doc["error"])[:300]
    return None


def _data(raw: bytes | bytearray, where: str) -> Any:
    """The data of an answer of Prometheus' HTTP API; raises ClusterError for anything else."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        raise ClusterError(f"{where}: the answer is not JSON: not Prometheus' HTTP API?") from None
    if not isinstance(doc, dict) or doc.get("status") not in ("success", "error"):
        raise ClusterError(f"{where}: the answer is not Prometheus' HTTP API (no status)")
    if doc["status"] == "error":
        raise ClusterError(f"{where}: {_api_error(raw) or 'query failed'}")
    return doc.get("data")


def _vector(raw: bytes | bytearray, where: str) -> list[dict[str, Any]]:
    """The result list of an instant vector answer; raises ClusterError for anything else."""
    data = _data(raw, where)
    if not isinstance(data, dict) or data.get("resultType") != "vector" or not isinstance(data.get("result"), list):
        raise ClusterError(f"{where}: the answer holds no instant vector")
    result: list[Any] = data["result"]
    if len(result) > MAX_SERIES:
        raise ClusterError(f"{where}: {len(result):,} series in one answer (over {MAX_SERIES:,}): narrow it with "
                           "--selector")
    return result


def _strings(raw: bytes | bytearray, where: str) -> list[str]:
    """The list of a label values answer: its strings of bounded length (anything else in it left out)."""
    data = _data(raw, where)
    if not isinstance(data, list):
        raise ClusterError(f"{where}: the answer holds no list of label values")
    if len(data) > MAX_SERIES:
        raise ClusterError(f"{where}: {len(data):,} label values in one answer (over {MAX_SERIES:,}): narrow it "
                           "with --selector")
    return [v for v in data if isinstance(v, str) and len(v) <= MAX_LABEL_CHARS]


# -- reading the answers -----------------------------------------------------------------------------------------

Key = tuple[str, str]  # (job, instance)


class _Notes:
    """The one-line reasons of series left out, the first MAX_NOTES named, the rest counted."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.more = 0

    def add(self, text: str) -> None:
        if len(self.lines) < MAX_NOTES:
            self.lines.append(printable(text)[:300])
        else:
            self.more += 1

    def done(self) -> tuple[str, ...]:
        return (*self.lines, *([f"{self.more} more series left out"] if self.more else []))


def _series(result: list[Any], notes: _Notes, what: str) -> Iterable[tuple[dict[str, str], str]]:
    """(labels, value text) of each well-formed series; a malformed one costs only itself."""
    for item in result:
        why = _malformed(item)
        if why is not None:
            notes.add(f"{what}: {why}")
            continue
        yield item["metric"], item["value"][1]


def _malformed(item: Any) -> str | None:
    """What is wrong with one series of an answer, or None."""
    if not isinstance(item, dict):
        return "a series that is not an object"
    labels, value = item.get("metric"), item.get("value")
    if not isinstance(labels, dict) or not isinstance(value, list) or len(value) != 2 or not isinstance(value[1], str):
        return "a series without labels and a [time, value] pair"
    if not all(_short_label(k, v) for k, v in labels.items()):
        return "a series whose labels are not short strings"
    if "instance" not in labels:
        return "a series without an instance label"
    return None


def _short_label(name: Any, value: Any) -> bool:
    return isinstance(name, str) and isinstance(value, str) and len(value) <= MAX_LABEL_CHARS and len(name) <= 256


def _number(text: str, low: float = 0.0, high: float = math.inf) -> float | Unavailable:
    try:
        v = float(text)
    except (ValueError, OverflowError):
        return Unavailable(f"not a number: {printable(text)[:40]}")
    if not math.isfinite(v) or not low <= v <= high:
        return Unavailable(f"out of range: {printable(text)[:40]}")
    return v


def _bytes(text: str) -> int | Unavailable:
    v = _number(text, 0.0, MAX_BYTES)
    if isinstance(v, Unavailable):
        return v
    if v != int(v):
        return Unavailable(f"not a whole number of bytes: {printable(text)[:40]}")
    return int(v)


def _ratio(text: str) -> float | Unavailable:
    return _number(text, 0.0, 1.0)


def _count(text: str) -> int | Unavailable:
    v = _bytes(text)
    return Unavailable(v.reason.replace("bytes", "a count")) if isinstance(v, Unavailable) else v


def _checked(value: Any, notes: _Notes, where: str) -> Any:
    if isinstance(value, Unavailable):
        notes.add(f"{where}: {value.reason}")
    return value


def _first(labels: dict[str, str], names: tuple[str, ...]) -> str | None:
    return next((labels[n] for n in names if labels.get(n)), None)


def detail_matchers(nodes: Collection[Key]) -> str:
    """The label matchers that select the nodes `nodes` (job, instance) for the detail queries."""
    if len(nodes) == 1:
        [(job, instance)] = nodes
        return selector_text([("job", "=", job), ("instance", "=", instance)])
    # Label values are hostile text: every ASCII punctuation escaped, so each is matched literally by RE2.
    alts = "|".join(re.sub(r"([!-/:-@\[-`{-~])", r"\\\1", i) for i in sorted({i for _, i in nodes}))
    return selector_text([("instance", "=~", alts)])


def read_cluster(client: PrometheusClient, selector: str = "", now: Callable[[], float] = time.time,
                 detail: Collection[Key] | bool = False) -> ClusterPart:
    """One refresh: every query of `queries(selector)` at one time, read into a ClusterPart (raises ClusterError
    when Prometheus gave no usable answer). `detail`: the nodes (job, instance) whose every GPU and rank is read
    too, or True for all of them."""
    matchers = selector_text(parse_selector(selector))
    wanted: set[Key] | None = None if detail is True else set(detail or ())
    # Nodes asked for by key are matched on their labels too: a node not in this refresh costs nothing.
    detail_sel = "" if wanted is None else detail_matchers(wanted) if wanted else None
    at, t0, asked = now(), time.monotonic(), client.queries
    answers, jobs = _ask(client, queries(matchers, detail_sel), at, dltop_series(matchers))
    reading = _Reading(answers, jobs, at, wanted)
    nodes = reading.nodes()
    return ClusterPart(url=client.opts.url, selector=matchers, queried_at=at, query_s=time.monotonic() - t0,
                       queries=client.queries - asked, nodes=nodes, jobs=_jobs(reading.rows, nodes, reading.notes),
                       notes=reading.notes.done())


def _ask(client: PrometheusClient, exprs: dict[str, str], at: float,
         jobs_of: str) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """Every query's answer, by name, and the scrape jobs whose series `jobs_of` selects over the last
    JOBS_LOOKBACK_S. At once, on a few threads: Prometheus answers them in parallel, and a refresh waits for the
    slowest, not the sum. One deadline and one byte budget for all of them together (Refresh): the refresh ends by
    --prometheus-timeout."""
    with Refresh(client.opts.timeout_s) as refresh, ThreadPoolExecutor(max_workers=QUERY_THREADS) as pool:
        token = _REFRESH.set(refresh)  # each query runs in a copy of this context: it reads the refresh there
        try:
            jobs = pool.submit(contextvars.copy_context().run, client.label_values, "job", jobs_of,
                               at - JOBS_LOOKBACK_S, at)
            futures = {name: pool.submit(contextvars.copy_context().run, client.query, expr, at)
                       for name, expr in exprs.items()}
        finally:
            _REFRESH.reset(token)
        try:
            return {name: f.result() for name, f in futures.items()}, jobs.result()
        except BaseException:
            jobs.cancel()
            for f in futures.values():  # the first failure is the refresh's: the others are not waited for
                f.cancel()
            refresh.watchdog.fire()
            raise


def _seconds(text: str) -> float | Unavailable:
    return _number(text, 0.0)


_NODE_ATTR: dict[str, tuple[str, Callable[[str], Any]]] = {
    "dltop_memory_total_bytes": ("memory_total_bytes", _bytes),
    "dltop_memory_available_bytes": ("memory_available_bytes", _bytes),
    "dltop_memory_cached_bytes": ("memory_cached_bytes", _bytes),
    "dltop_memory_dirty_bytes": ("memory_dirty_bytes", _bytes),
    "dltop_gpus": ("gpu_count", _count)}
_SUM_ATTR: dict[str, tuple[str, Callable[[str], Any]]] = {
    "read": ("gpus_read", _count), "used": ("gpu_memory_used_bytes", _bytes),
    "total": ("gpu_memory_total_bytes", _bytes), "util": ("gpu_utilization", _ratio)}
_GPU_ATTR: dict[str, tuple[str, Callable[[str], Any]]] = {
    "dltop_gpu_memory_total_bytes": ("memory_total_bytes", _bytes),
    "dltop_gpu_memory_used_bytes": ("memory_used_bytes", _bytes),
    "dltop_gpu_utilization_ratio": ("utilization", _ratio)}
_GPU_LABEL = {"dltop_gpu_info": ("name", "name"), "dltop_gpu_down_info": ("down_reason", "reason")}  # attr, label
_DATASET_ATTR: dict[str, tuple[str, Callable[[str], Any]]] = {
    "dltop_dataset_size_bytes": ("size_bytes", _bytes), "dltop_dataset_resident_bytes": ("resident_bytes", _bytes),
    "dltop_dataset_resident_ratio": ("resident_ratio", _ratio)}
_RANK_ATTR: dict[str, tuple[str, Callable[[str], Any]]] = {
    "dltop_training_data_wait_ratio": ("data_wait_ratio", _ratio),
    "dltop_training_step_seconds": ("step_s", _seconds),
    "dltop_training_steps_total": ("steps", _count)}
_SERVER_ATTR: dict[str, tuple[str, Callable[[str], Any], str]] = {  # query: attr, conversion, what a note says
    "kv_usage": ("kv_usage", _ratio, "KV-cache usage"), "kv_bytes": ("kv_capacity_bytes", _bytes, "KV-cache bytes")}


class _Reading:
    """The answers of one refresh, read into each node's numbers, GPUs, datasets, ranks, hints and servers; the
    series left out are noted in the order the queries are read."""

    def __init__(self, answers: dict[str, list[dict[str, Any]]], jobs: list[str], at: float,
                 wanted: set[Key] | None) -> None:
        self.answers, self.at, self.wanted = answers, at, wanted
        self.notes = _Notes()
        self.up: dict[Key, dict[str, str]] = {}
        self.up_value: dict[Key, str] = {}
        self._targets(set(jobs))
        self.seen = self._seen()
        listed = sorted(self.up.keys() | self.seen.keys())  # and the nodes no longer scraped that served lately
        self.fields: dict[Key, dict[str, Any]] = {k: {} for k in listed[:MAX_NODES]}
        if len(listed) > MAX_NODES:
            self.notes.add(f"{len(listed) - MAX_NODES} nodes past {MAX_NODES:,} left out: narrow it with --selector")
        self.gpus: dict[Key, dict[tuple[str, str], dict[str, Any]]] = {k: {} for k in self.fields}
        self.datasets: dict[Key, dict[str, dict[str, Any]]] = {k: {} for k in self.fields}
        self.ranks: dict[Key, dict[tuple[str, str, str, str], dict[str, Any]]] = {k: {} for k in self.fields}
        self.hints: dict[Key, list[ClusterHint]] = {k: [] for k in self.fields}
        self.servers: dict[Key, dict[str, dict[str, Any]]] = {k: {} for k in self.fields}
        self.down_sources: dict[Key, list[str]] = {k: [] for k in self.fields}

    def _targets(self, jobs: set[str]) -> None:
        """The targets in `up` of the jobs that serve dltop's metrics, each with its labels and up value: a node down
        since before any lookback is one of them."""
        for labels, v in _series(self.answers["up"], self.notes, "up"):
            if labels.get("__name__", "up") == "up" and labels.get("job", "") in jobs:
                key = (labels.get("job", ""), labels["instance"])
                self.up[key], self.up_value[key] = labels, v

    def _seen(self) -> dict[Key, float]:
        """Each node that served dltop's metrics within LOOKBACK, and when it last did."""
        seen: dict[Key, float] = {}
        for labels, v in _series(self.answers["seen"], self.notes, "dltop_snapshot_timestamp_seconds"):
            ts = _number(v, 0.0)
            if not isinstance(ts, Unavailable):
                seen[(labels.get("job", ""), labels["instance"])] = ts
        return seen

    def rows(self, name: str) -> Iterable[tuple[Key, dict[str, str], str, str]]:
        """(node, labels, metric name, value text) of each well-formed series of a listed node in an answer."""
        for labels, v in _series(self.answers.get(name, []), self.notes, name):
            key = (labels.get("job", ""), labels["instance"])
            if key in self.fields:
                yield key, labels, labels.get("__name__", ""), v

    def detailed(self, key: Key) -> bool:
        return self.wanted is None or key in self.wanted

    def checked(self, conv: Callable[[str], Any], text: str, where: str) -> Any:
        return _checked(conv(text), self.notes, where)

    def nodes(self) -> tuple[ClusterNode, ...]:
        """Every answer read, in the queries' order; each listed node."""
        self._read_node()
        self._read_gpus()
        self._read_datasets()
        self._read_ranks()
        self._read_flags()
        return tuple(self._node(key, attrs) for key, attrs in self.fields.items())

    def _read_node(self) -> None:
        for key, _, metric, v in self.rows("node"):
            if metric in _NODE_ATTR:
                attr, conv = _NODE_ATTR[metric]
                self.fields[key][attr] = self.checked(conv, v, f"{key[1]}: {metric}")
        for key, labels, _, v in self.rows("pressure"):
            kind = labels.get("kind")
            if kind in ("some", "full"):
                self.fields[key][f"pressure_memory_{kind}"] = self.checked(_ratio, v, f"{key[1]}: memory PSI {kind}")
        self._read_gpu_sums()

    def _read_gpu_sums(self) -> None:
        for key, labels, _, v in self.rows("gpu_sums"):
            if labels.get("dltop_sum") in _SUM_ATTR:
                attr, conv = _SUM_ATTR[labels["dltop_sum"]]
                self.fields[key][attr] = self.checked(conv, v, f"{key[1]}: GPUs' {labels['dltop_sum']}")
        for attrs in self.fields.values():
            if attrs.get("gpu_count") == 0:
                attrs.setdefault("gpus_read", 0)  # a CPU-only node: no dltop_gpu_up series to count, and none to read

    def _read_gpus(self) -> None:
        for name in ("gpu_lost", "gpu"):  # the lost GPUs of every node; every GPU of the detailed ones
            for key, labels, metric, v in self.rows(name):
                if name == "gpu" and not self.detailed(key):
                    continue
                g = self.gpus[key].setdefault((labels.get("gpu", ""), labels.get("uuid", "")), {})
                if metric == "dltop_gpu_up":
                    g["up"] = v == "1"
                elif metric in _GPU_LABEL:
                    attr, label = _GPU_LABEL[metric]
                    g[attr] = labels.get(label) or None
                elif metric in _GPU_ATTR:
                    attr, conv = _GPU_ATTR[metric]
                    g[attr] = self.checked(conv, v, f"{key[1]}: GPU {labels.get('gpu', '?')} {metric}")
        self._read_gpu_use()

    def _read_gpu_use(self) -> None:
        for key, labels, _, v in self.rows("gpu_use"):
            if not self.detailed(key):
                continue
            g = self.gpus[key].setdefault((labels.get("gpu", ""), labels.get("uuid", "")), {})
            b = self.checked(_bytes, v, f"{key[1]}: GPU {labels.get('gpu', '?')} memory {labels.get('use', '?')}")
            if isinstance(b, int) and labels.get("use"):
                g.setdefault("memory_by_use", {})[labels["use"]] = b

    def _read_datasets(self) -> None:
        for key, labels, metric, v in self.rows("dataset"):
            if not labels.get("dataset"):
                continue
            d = self.datasets[key].setdefault(labels["dataset"], {})
            if metric == "dltop_dataset_up":
                d["up"] = v == "1"
            elif metric == "dltop_dataset_unavailable_info":
                d["reason"] = labels.get("reason") or None
            elif metric in _DATASET_ATTR:
                attr, conv = _DATASET_ATTR[metric]
                d[attr] = self.checked(conv, v, f"{key[1]}: {labels['dataset']}: {metric}")

    def _read_ranks(self) -> None:
        for key, labels, metric, v in self.rows("training"):
            if metric not in _RANK_ATTR or not self.detailed(key):
                continue
            r = self.ranks[key].setdefault((labels.get("pid", ""), labels.get("rank", ""), labels.get("job_id", ""),
                                            labels.get("uid", "")), {})
            attr, conv = _RANK_ATTR[metric]
            r[attr] = self.checked(conv, v, f"{key[1]}: pid {labels.get('pid', '?')} {metric}")

    def _read_flags(self) -> None:
        """Hints, servers and the sources that are down."""
        for key, labels, _, v in self.rows("hint"):
            if v == "1" and labels.get("id"):
                self.hints[key].append(ClusterHint(labels["id"], labels.get("severity", "")))
        for name, (attr, conv, what) in _SERVER_ATTR.items():
            for key, labels, _, v in self.rows(name):
                if labels.get("server"):
                    self.servers[key].setdefault(labels["server"], {})[attr] = self.checked(
                        conv, v, f"{key[1]}: {labels['server']}: {what}")
        for key, labels, _, _v in self.rows("source_down"):
            if labels.get("source"):
                self.down_sources[key].append(labels["source"])

    def _age(self, key: Key) -> float | Unavailable:
        """How old the node's newest reading is, within LOOKBACK."""
        if key not in self.seen:
            return Unavailable(f"no reading in the last {LOOKBACK}")
        return max(0.0, self.at - self.seen[key])

    def _down_reason(self, key: Key, age: float | Unavailable) -> str | None:
        """Why the node is down (and since when, where its newest reading says), or None while it is up."""
        since = (f"no reading in the last {LOOKBACK}" if isinstance(age, Unavailable)
                 else f"its newest reading is {human_duration(age)} old")
        if key not in self.up:
            return f"no longer a scrape target of Prometheus; {since}"
        if self.up_value[key] != "1":
            return f"the last scrape failed (up is 0); {since}"
        if isinstance(age, Unavailable):
            return f"scraped, but serves no dltop reading ({since})"
        if age > STALE_AFTER_S:
            return f"its exporter's newest reading is {age:.0f} s old"
        return None

    def _node(self, key: Key, attrs: dict[str, Any]) -> ClusterNode:
        target = self.up.get(key, {})
        age = self._age(key)
        why = self._down_reason(key, age)
        return ClusterNode(
            instance=key[1], job=key[0], node=_first(target, NODE_LABELS), pod=_first(target, POD_LABELS),
            namespace=_first(target, NAMESPACE_LABELS), up=why is None, down_reason=why, snapshot_age_s=age, **attrs,
            gpus=tuple(ClusterGpu(gpu=i, uuid=u, **g)
                       for (i, u), g in sorted(self.gpus[key].items(), key=lambda kv: (_index(kv[0][0]), kv[0][1]))),
            datasets=tuple(ClusterDataset(dataset=p, **d) for p, d in sorted(self.datasets[key].items())),
            ranks=tuple(ClusterRank(instance=key[1], pid=p, rank=r, job_id=j, uid=u, **a)
                        for (p, r, j, u), a in sorted(self.ranks[key].items(),
                                                      key=lambda kv: (_index(kv[0][1]), kv[0]))),
            hints=tuple(sorted(self.hints[key], key=lambda h: (h.severity != "critical", h.id))),
            servers=tuple(ClusterServer(server=s, **a) for s, a in sorted(self.servers[key].items())),
            sources_down=tuple(sorted(self.down_sources[key])), detailed=self.detailed(key))


def _index(text: str) -> tuple[int, str]:
    """A sort key that puts "10" after "9" (GPU indices and ranks are label text)."""
    return (int(text), "") if text.isdigit() and len(text) < 10 else (1 << 40, text)


_SUMMARY = Unavailable("not read: the job's summary reads its slowest step and its largest data wait alone")


def _jobs(rows: Callable[[str], Iterable[tuple[Key, dict[str, str], str, str]]], nodes: Iterable[ClusterNode],
          notes: _Notes) -> tuple[ClusterJob, ...]:
    """Each training job across nodes (one uid and job_id: two users' ranks never merge), from Prometheus' counts
    and its slowest and most waiting rank; the ranks with no job id are one more group, last. The detailed nodes'
    ranks are listed in it."""
    counts: dict[tuple[str, str], int] = {}
    hosts: dict[tuple[str, str], set[Key]] = {}
    for key, labels, _, v in rows("job_ranks"):
        n = _checked(_count(v), notes, f"{key[1]}: ranks of job {labels.get('job_id', '')}")
        if isinstance(n, int):
            job = (labels.get("uid", ""), labels.get("job_id", ""))
            counts[job] = counts.get(job, 0) + n
            hosts.setdefault(job, set()).add(key)
    top: dict[tuple[str, str], dict[str, ClusterRank]] = {}
    for name, attr, conv in (("job_slowest", "step_s", _seconds),
                             ("job_waiting", "data_wait_ratio", _ratio)):
        for key, labels, _, v in rows(name):
            value = _checked(conv(v), notes, f"{key[1]}: pid {labels.get('pid', '?')} {attr}")
            if isinstance(value, float):
                job = (labels.get("uid", ""), labels.get("job_id", ""))
                rank = ClusterRank(instance=key[1], pid=labels.get("pid", ""), rank=labels.get("rank", ""),
                                   job_id=job[1], uid=job[0], data_wait_ratio=_SUMMARY, step_s=_SUMMARY,
                                   steps=_SUMMARY)
                top.setdefault(job, {})[attr] = (replace(rank, step_s=value) if attr == "step_s"
                                                 else replace(rank, data_wait_ratio=value))
    by_job: dict[tuple[str, str], list[ClusterRank]] = {}
    for n in nodes:
        for r in n.ranks:
            by_job.setdefault((r.uid, r.job_id), []).append(r)
    out = []
    for job in sorted(counts.keys() | top.keys(), key=lambda j: (j[1] == "", j[1], j[0])):
        rs = sorted(by_job.get(job, ()), key=lambda r: (_index(r.rank), r.instance, r.pid))
        out.append(ClusterJob(job[1], tuple(rs), slowest=top.get(job, {}).get("step_s"),
                              most_waiting=top.get(job, {}).get("data_wait_ratio"),
                              rank_count=max(counts.get(job, 0), len(rs)),
                              node_count=len(hosts.get(job, ())), uid=job[0]))
    return tuple(out)


def read_or_reason(client: PrometheusClient, selector: str,
                   detail: Collection[Key] | bool = False) -> ClusterPart | Unavailable:
    """read_cluster, or Unavailable with the one-line reason."""
    try:
        return read_cluster(client, selector, detail=detail)
    except ClusterError as e:
        return Unavailable(str(e))


def source(settings: Settings) -> Source:
    """The cluster source: every INTERVAL_S (or the refresh, when slower), one refresh of the queries; the node
    asked for last is read in detail, at once and at every refresh after."""
    opts = settings.prometheus
    assert opts is not None
    try:
        parse_selector(opts.selector)  # user input: a bad one is one line before the screen opens
    except ValueError as e:
        raise DltopError(f"--prometheus-selector: {e}") from None
    client = PrometheusClient(opts)
    focus: list[Key] = []  # one node: its detail costs three queries of its own GPUs and ranks

    def read_some(keys: frozenset[str]) -> ClusterPart | Unavailable:
        asked = [tuple(k.split("\n", 1)) for k in sorted(keys) if "\n" in k]
        if asked:
            focus[:] = [(asked[-1][0], asked[-1][1])]
        return read_or_reason(client, opts.selector, focus)

    return Source("cluster", max(INTERVAL_S, settings.refresh_s), lambda: read_or_reason(client, opts.selector, focus),
                  timeout_s=opts.timeout_s * 2, config=opts, read_some=read_some)
