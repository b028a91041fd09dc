"""Inference servers: scrape a vLLM or SGLang `/metrics` page and read its KV-cache pool, prefix cache and queues.

One source per server URL, each on its own thread, so a server that hangs holds only its own. A scrape has a
deadline shorter than the interval, reads at most MAX_PAYLOAD_BYTES, follows no redirect to another host, sends
no credentials and uses no proxy; whatever goes wrong is the server's `state`, never an exception. The text is
parsed with prometheus_client's parser. The port is joined to the listening process through /proc (under `root`).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import socket
import struct
import threading
import time
import urllib.parse
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache, partial
from typing import TYPE_CHECKING, Any

from dltop.fmt import printable
from dltop.model.base import Unavailable
from dltop.model.servers import ModelStats, ServerStats

if TYPE_CHECKING:
    import urllib.request

    from dltop.kv import KvShape

MAX_PAYLOAD_BYTES = 2 << 20  # a real vLLM scrape is tens to a few hundred KiB; more is not a /metrics page
MAX_LINE_CHARS = 64 << 10  # vLLM's longest line (cache_config_info's labels) is under 1 KiB
MAX_COUNT = 2**53  # a count a float holds exactly; above it a "count" is not one a server keeps
MAX_REJECTED_NOTES = 5  # lines left out named one by one in the notes; more are counted
_CHUNK = 64 << 10

NO_BYTES = ("the server's /metrics gives the pool in tokens, not bytes; bytes = tokens × bytes per token, "
            "which come from the model's config.json (`dltop kv --config`)")
V1_RATE = "vLLM V1 counts prefix-cache hits and queries: the hit rate is over the interval between two readings"


class ScrapeError(Exception):
    """A scrape that did not give a /metrics page: `state` (one of model.servers.STATES) and one line why."""

    def __init__(self, state: str, message: str) -> None:
        super().__init__(message)
        self.state = state


class Watchdog:
    """Shuts every socket of one scrape at its deadline. A socket's timeout is per read, so a server that sends
    a header byte now and then (or never finishes a TLS handshake) would hold the read for ever; this cuts it off
    at `timeout_s` in all."""

    def __init__(self, timeout_s: float) -> None:
        self.fired = False
        self.timeout_s = timeout_s
        self.answered = False  # the answer's head (status line and headers) came in
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(timeout_s, self.fire)
        self._timer.daemon = True

    def __enter__(self) -> Watchdog:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()

    def create_connection(self, *args: Any, **kwargs: Any) -> socket.socket:
        sock = socket.create_connection(*args, **kwargs)
        with self._lock:
            self._socks.append(sock)
            if self.fired:
                _shut(sock)
        return sock

    def late(self, size: int | None = None) -> ScrapeError:
        """The error of a scrape the deadline cut off: before the answer's head was in, or after `size` bytes."""
        if not self.answered:
            return ScrapeError("timeout", f"no answer within {self.timeout_s:g} s (its head not complete)")
        return ScrapeError("timeout", f"answer not complete within {self.timeout_s:g} s"
                                      + ("" if size is None else f" (read {size:,} bytes)"))

    def fire(self) -> None:
        """Shut every socket now: at the deadline, or when a sibling query failed (the rest of a refresh is not
        waited for)."""
        with self._lock:
            self.fired = True
            for sock in self._socks:
                _shut(sock)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)  # the blocked read returns at once; the owner closes it


@cache
def watched_handlers() -> tuple[type[Any], type[Any], type[Any]]:
    """urllib's handlers as a scrape needs them, defined at the first scrape: http.client and urllib.request
    cost ~12 ms of CPU to import, and the servers source is built before the first frame (its first scrape comes
    after it)."""
    import http.client
    import urllib.request

    class _SameHostRedirects(urllib.request.HTTPRedirectHandler):
        """Follow a redirect on the same scheme, host and port (vLLM's `/metrics` -> `/metrics/`), no other."""

        def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
            old, new = urllib.parse.urlsplit(req.full_url), urllib.parse.urlsplit(newurl)
            if (old.scheme, old.netloc) != (new.scheme, new.netloc):
                raise ScrapeError("redirect", f"HTTP {code} redirect to {printable(newurl)[:200]} (another host: not "
                                              "followed; give that URL if it is the server)")
            return super().redirect_request(req, fp, code, msg, headers, newurl)

    class _Http(urllib.request.HTTPHandler):
        def __init__(self, watchdog: Watchdog) -> None:
            super().__init__()
            self.connect = partial(_watched_connection, watchdog, http.client.HTTPConnection)

        def http_open(self, req: Any) -> Any:
            return self.do_open(self.connect, req)

    class _Https(urllib.request.HTTPSHandler):
        def __init__(self, watchdog: Watchdog, context: Any = None) -> None:
            super().__init__(context=context)
            self.connect = partial(_watched_connection, watchdog, http.client.HTTPSConnection)

        def https_open(self, req: Any) -> Any:
            return self.do_open(self.connect, req, context=self._context)  # type: ignore[attr-defined]

    return _SameHostRedirects, _Http, _Https


def _watched_connection(watchdog: Watchdog, cls: type[Any], host: str, **kwargs: Any) -> Any:
    """An http.client connection whose socket the watchdog makes, so it can shut it at the deadline."""
    conn = cls(host, **kwargs)
    conn._create_connection = watchdog.create_connection
    return conn


def _opener(watchdog: Watchdog) -> urllib.request.OpenerDirector:
    # No proxy from the environment (a scraper of the server next door must not go through http_proxy), no cookies.
    import urllib.request

    redirects, plain, tls = watched_handlers()
    return urllib.request.build_opener(urllib.request.ProxyHandler({}), redirects(), plain(watchdog), tls(watchdog))


def fetch_metrics(url: str, timeout_s: float, max_bytes: int = MAX_PAYLOAD_BYTES) -> bytes:
    """The body of GET url, within `timeout_s` in all (a server that trickles bytes, headers included, is cut off
    too) and at most `max_bytes`; raises ScrapeError with the state it came to."""
    with Watchdog(timeout_s) as watchdog:
        try:
            body = _fetch(url, timeout_s, max_bytes, watchdog)
        except ScrapeError as e:
            if watchdog.fired and e.state not in ("too_large", "timeout"):
                raise watchdog.late() from None
            raise
        if watchdog.fired:  # the deadline's shutdown reads as the end of the answer
            raise watchdog.late(len(body))
        return body


def _fetch(url: str, timeout_s: float, max_bytes: int, watchdog: Watchdog) -> bytes:
    import http.client
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout_s
    req = urllib.request.Request(url, headers={"Accept": "text/plain", "Accept-Encoding": "gzip",
                                               "User-Agent": "dltop"})
    try:
        with _opener(watchdog).open(req, timeout=timeout_s) as resp:
            watchdog.answered = not watchdog.fired  # the deadline's shutdown reads as the end of the headers
            return bytes(read_body(resp, deadline, max_bytes, watchdog))
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            raise ScrapeError("auth", f"HTTP {e.code} {printable(str(e.reason))}: the server wants credentials "
                                      "(dltop sends none)") from None
        if 300 <= e.code < 400:
            raise ScrapeError("redirect", f"HTTP {e.code} redirect not followed") from None
        raise ScrapeError("http_error", f"HTTP {e.code} {printable(str(e.reason))[:80]}") from None
    except urllib.error.URLError as e:
        raise _network_error(e.reason, url, timeout_s) from None
    except ScrapeError:
        raise
    except (OSError, http.client.HTTPException, ValueError) as e:  # ValueError: http.client on a bad status line
        raise _network_error(e, url, timeout_s) from None


GZIP = ("gzip", "x-gzip")


def read_body(resp: Any, deadline: float, max_bytes: int, watchdog: Watchdog,
              take: Callable[[int], None] = lambda n: None) -> bytearray:
    """The body of an HTTP answer, bounded as a whole: read in chunks until `deadline` (time.monotonic()), at most
    `max_bytes` as sent and at most `max_bytes` once inflated (a gzip Content-Encoding is inflated as it comes, a
    chunk at a time, never past the cap), each cap checked as the body grows. `take(n)` is told of every n bytes
    kept (a refresh's budget over its answers; it raises to stop). Raises ScrapeError: "timeout", "too_large",
    "garbage" (a body cut short, or an encoding that is not gzip)."""
    cap = f"{max_bytes:,}-byte cap"
    inflate = _inflater(resp.headers, max_bytes, cap)
    body = bytearray()
    sent = 0
    while True:
        if time.monotonic() > deadline or watchdog.fired:
            raise watchdog.late(sent)
        chunk = resp.read1(_CHUNK)
        if not chunk:
            _check_complete(resp, sent, watchdog, inflate)
            return body
        sent += len(chunk)
        if sent > max_bytes:
            raise ScrapeError("too_large", f"payload over the {cap}: read stopped there (not a /metrics page, "
                                           "or a label explosion)")
        if inflate is None:
            take(len(chunk))
            body += chunk
        else:
            _inflate(inflate, chunk, body, max_bytes, cap, take)


def _check_complete(resp: Any, sent: int, watchdog: Watchdog, inflate: Any) -> None:
    """At the end of an answer's bytes, ScrapeError where they are not the whole answer."""
    if watchdog.fired:  # the deadline's shutdown reads as the end of the answer
        raise watchdog.late(sent)
    if getattr(resp, "length", None):  # bytes announced, never sent
        raise ScrapeError("garbage", f"the answer ended after {sent:,} of the {sent + resp.length:,} "
                                     "bytes it announced (the last numbers could be cut short)")
    if inflate is not None and not inflate.eof:
        raise ScrapeError("garbage", "the gzip stream ended before its end (the answer was cut short)")


def _inflater(headers: Any, max_bytes: int, cap: str) -> Any:
    """The gzip inflater an answer's headers call for (None: sent as is); ScrapeError for another encoding, or a
    Content-Length over the cap."""
    encoding = (headers.get("Content-Encoding") or "identity").strip().lower()
    if encoding not in ("identity", *GZIP):
        raise ScrapeError("garbage", f"Content-Encoding {printable(encoding)[:40]}: not read (gzip only)")
    length = headers.get("Content-Length")
    if length and length.isdigit() and int(length) > max_bytes:
        raise ScrapeError("too_large", f"payload of {int(length):,} bytes is over the {cap}: not read (not a "
                                       "/metrics page, or a label explosion)")
    return zlib.decompressobj(16 + zlib.MAX_WBITS) if encoding in GZIP else None


def _inflate(inflate: Any, chunk: bytes, body: bytearray, max_bytes: int, cap: str,
             take: Callable[[int], None]) -> None:
    """One chunk inflated onto `body` a piece at a time: a gzip bomb never holds more than the cap and one chunk."""
    pending = chunk
    while True:
        try:
            data = inflate.decompress(pending, _CHUNK)
        except zlib.error as e:
            raise ScrapeError("garbage", f"not gzip as its Content-Encoding says: {e}") from None
        if len(body) + len(data) > max_bytes:
            raise ScrapeError("too_large", f"payload over the {cap} once inflated (gzip): read stopped there")
        take(len(data))
        body += data
        pending = inflate.unconsumed_tail
        if not pending and len(data) < _CHUNK:
            return


def _network_error(reason: object, url: str, timeout_s: float) -> ScrapeError:
    import http.client  # loaded by the scrape that failed

    netloc = urllib.parse.urlsplit(url).netloc
    if isinstance(reason, TimeoutError | socket.timeout):
        return ScrapeError("timeout", f"no answer within {timeout_s:g} s")
    if isinstance(reason, ConnectionRefusedError):
        return ScrapeError("down", f"connection refused: nothing listens on {netloc}")
    if isinstance(reason, socket.gaierror):
        return ScrapeError("down", f"cannot resolve host of {netloc}: {reason.strerror or reason}")
    if isinstance(reason, OSError):
        return ScrapeError("down", f"{reason.strerror or type(reason).__name__}: {netloc}")
    if isinstance(reason, http.client.HTTPException):
        return ScrapeError("garbage", f"not an HTTP answer: {type(reason).__name__} {printable(str(reason))[:80]}")
    return ScrapeError("down", f"{printable(str(reason))[:80]}: {netloc}")


# -- the payload ----------------------------------------------------------------------------------------------

@dataclass
class _Sample:
    labels: dict[str, str]
    value: float


def parse_samples(text: str) -> tuple[dict[str, list[_Sample]], list[str]]:
    """Every sample of Prometheus text by its sample name (`vllm:prefix_cache_hits_total`, not the family's name,
    so a counter's `_created` timestamps never pass for counts), and a one-line reason for each line left out: a
    line the parser refuses, or one over MAX_LINE_CHARS, costs only itself. ScrapeError("garbage") when no line
    is Prometheus text."""
    rejected: list[tuple[int, str]] = []
    kept: list[tuple[int, str]] = []
    for number, line in enumerate(text.split("\n"), 1):
        if len(line) > MAX_LINE_CHARS:
            rejected.append((number, f"line {number}: {len(line):,} characters, over the {MAX_LINE_CHARS:,} cap"))
        else:
            kept.append((number, line))
    try:  # the whole page at once (the common case, and the fast one), else line by line
        out = _parse("\n".join(line for _, line in kept))
    except Exception:  # noqa: BLE001 - the parser raises ValueError, and others (IndexError, TypeError)
        out = _parse_lines(kept, rejected)
    reasons = [why for _, why in sorted(rejected)]
    if reasons and not out:
        first = next((line for _, line in kept if line.strip()), "")[:60]
        raise ScrapeError("garbage", f"not Prometheus text ({reasons[0]}; first line {printable(first)})")
    return out, reasons


def _parse_lines(kept: list[tuple[int, str]], rejected: list[tuple[int, str]]) -> dict[str, list[_Sample]]:
    """The samples of a page the parser refuses whole, line by line: a line refused costs only itself."""
    out: dict[str, list[_Sample]] = {}
    for number, line in kept:
        if not line.strip() or line.lstrip().startswith("#"):
            continue  # HELP and TYPE name families; the samples' own names are what is read
        try:
            for name, rows in _parse(line).items():
                out.setdefault(name, []).extend(rows)
        except Exception as e:  # noqa: BLE001
            rejected.append((number, f"line {number}: {type(e).__name__}: {printable(str(e))[:80]} "
                                     f"({printable(line[:60])})"))
    return out


def _parse(text: str) -> dict[str, list[_Sample]]:
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list[_Sample]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append(_Sample(dict(s.labels), float(s.value)))
    return out


def _rejected_notes(rejected: list[str]) -> list[str]:
    more = len(rejected) - MAX_REJECTED_NOTES
    return [f"left out: {r}" for r in rejected[:MAX_REJECTED_NOTES]] + (
        [f"left out: {more:,} more lines the parser refused"] if more > 0 else [])


def _replica_of(labels: dict[str, str]) -> str | None:
    for key in ("engine", "dp_rank"):  # vLLM V1 data-parallel engines, SGLang dp ranks: separate pools
        if key in labels:
            return f"{key}={labels[key]}"
    return None


def _key(labels: dict[str, str]) -> tuple[str, str | None]:
    return labels.get("model_name", ""), _replica_of(labels)


def _by_model(samples: dict[str, list[_Sample]], *names: str) -> tuple[str | None, dict[tuple[str, str | None], float]]:
    """The first of `names` the payload has, and its value per (model, replica); of several tensor-parallel
    ranks, rank 0's (they share one pool)."""
    for name in names:
        rows = samples.get(name)
        if not rows:
            continue
        found: dict[tuple[str, str | None], tuple[str, float]] = {}
        for s in rows:
            k = _key(s.labels)
            rank = s.labels.get("tp_rank", "")
            if k not in found or rank < found[k][0]:
                found[k] = (rank, s.value)
        return name, {k: v for k, (_, v) in found.items()}
    return None, {}


class _Notes:
    """The checks every number from a server passes (finite, in range, of its type); each that fails is left out
    with a one-line note, and the rest of the page is still read."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def finite(self, name: str, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            self.lines.append(f"{name} is {value}: not shown")
            return None
        return value

    def total(self, name: str, value: float | None) -> float | None:
        """A counter: finite, 0 or more."""
        if value is not None and not (math.isfinite(value) and 0 <= value <= MAX_COUNT):
            self.lines.append(f"{name} is {value:g}: not a count, not shown")
            return None
        return value

    def count(self, name: str, value: float | None) -> int | Unavailable:
        """A whole number of things (requests, tokens), or Unavailable with why not."""
        if value is None:
            return Unavailable(f"no {name}")
        if not (math.isfinite(value) and 0 <= value <= MAX_COUNT and value == int(value)):
            self.lines.append(f"{name} is {value:g}: not a count, not shown")
            return Unavailable(f"{name} is {value:g}: not a count")
        return int(value)

    def fraction(self, name: str, value: float | None) -> float | None:
        """A share, 0..1."""
        if value is not None and not (math.isfinite(value) and 0 <= value <= 1):
            self.lines.append(f"{name} is {value:g}: not a fraction 0..1, not shown")
            return None
        return value


def parse_server(text: str) -> tuple[str, list[ModelStats], list[str]]:
    """(engine, one ModelStats per model, notes) from a /metrics page; ScrapeError when it is not an inference
    server's."""
    samples, rejected = parse_samples(text)
    if any(n.startswith("vllm:") for n in samples):
        models, notes = _vllm(samples)
        return "vllm", models, [*notes, *_rejected_notes(rejected)]
    if any(n.startswith("sglang:") for n in samples):
        models, notes = _sglang(samples)
        return "sglang", models, [*notes, *_rejected_notes(rejected)]
    raise ScrapeError("not_inference", f"no vllm: or sglang: metrics among {len(samples)} sample names "
                                       "(is this an inference server's /metrics?)")


def _vllm(samples: dict[str, list[_Sample]]) -> tuple[list[ModelStats], list[str]]:
    notes = _Notes()
    usage_name, usage = _by_model(samples, "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    _, running = _by_model(samples, "vllm:num_requests_running")
    _, waiting = _by_model(samples, "vllm:num_requests_waiting")
    _, swapped = _by_model(samples, "vllm:num_requests_swapped")
    _, preempt = _by_model(samples, "vllm:num_preemptions_total")
    # V1's names, then the deprecated V1 ones (0.7 to 0.10) that count the same.
    _, hits = _by_model(samples, "vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
    _, queries = _by_model(samples, "vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
    _, v0_rate = _by_model(samples, "vllm:gpu_prefix_cache_hit_rate")
    configs = samples.get("vllm:cache_config_info", [])
    keys = list(dict.fromkeys([*usage, *running, *waiting, *hits, *queries]))
    if not keys:
        keys = [("", None)]
        notes.lines.append("no per-model metric: the model's name is not known")
    models = []
    for k in keys:
        name, replica = k
        cfg = _config_for(configs, name, replica)
        hit_rate = _vllm_hit_rate(notes, v0_rate.get(k), cfg, k in hits and k in queries)
        u = notes.fraction(usage_name or "", usage.get(k))
        swapped_n = notes.count("vllm:num_requests_swapped", swapped.get(k))
        models.append(ModelStats(
            model_name=name or "(unnamed)",
            replica=replica,
            kv_usage=_fraction_or(u, k in usage, usage_name or "",
                                  "no vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_perc"),
            kv_capacity_tokens=_capacity(cfg),
            kv_cache_dtype=(cfg or {}).get("cache_dtype"),
            kv_used_tokens=Unavailable("vLLM gives the fraction in use, not tokens"),
            prefix_cache_hit_rate=hit_rate,
            prefix_cache_hits_total=notes.total("prefix cache hits", hits.get(k)),
            prefix_cache_queries_total=notes.total("prefix cache queries", queries.get(k)),
            running_requests=notes.count("vllm:num_requests_running", running.get(k)),
            waiting_requests=notes.count("vllm:num_requests_waiting", waiting.get(k)),
            swapped_requests=swapped_n if isinstance(swapped_n, int) else None,
            preemptions_total=notes.count("vllm:num_preemptions_total", preempt.get(k)),
        ))
    return models, notes.lines


def _vllm_hit_rate(notes: _Notes, v0_rate: float | None, cfg: dict[str, str] | None,
                   counted: bool) -> float | Unavailable:
    """V0's prefix-cache hit rate, or why there is none (V1 counts hits and queries: `counted`; derive rates them)."""
    if v0_rate is not None:
        v = notes.finite("vllm:gpu_prefix_cache_hit_rate", v0_rate)
        v = v if v == -1 else notes.fraction("vllm:gpu_prefix_cache_hit_rate", v)
        if v == -1:
            return Unavailable("prefix caching is off (vllm:gpu_prefix_cache_hit_rate is -1)")
        return _fraction_or(v, True, "vllm:gpu_prefix_cache_hit_rate", "")
    if cfg is not None and cfg.get("enable_prefix_caching", "").lower() == "false":
        return Unavailable("prefix caching is off (vllm:cache_config_info enable_prefix_caching=False)")
    return Unavailable(V1_RATE) if counted else Unavailable("no prefix-cache metric in the payload")


def _config_for(configs: list[_Sample], name: str, replica: str | None) -> dict[str, str] | None:
    """The cache_config_info labels that apply to this model: its own, its engine's, or the server's one."""
    for s in configs:
        own = s.labels.get("model_name")
        if (own is None or own == name) and ("engine" not in s.labels or _replica_of(s.labels) == replica):
            return s.labels
    return None


def _fraction_or(value: float | None, present: bool, name: str, missing: str) -> float | Unavailable:
    """A share as read; else why not: the payload's `name` is not a fraction 0..1, or (`missing`) it has none."""
    if value is not None:
        return value
    return Unavailable(f"{name} is not a fraction 0..1" if present else missing)


def _capacity(cfg: dict[str, str] | None) -> int | Unavailable:
    """The pool in tokens: block_size × num_gpu_blocks of vllm:cache_config_info."""
    if cfg is None:
        return Unavailable("no vllm:cache_config_info in the payload (block_size × num_gpu_blocks)")
    blocks, size = cfg.get("num_gpu_blocks", ""), cfg.get("block_size", "")
    # ASCII digits only, and not too many of them: int() would take "+7", "7_000", Arabic digits, or 5,000 nines
    if not all(re.fullmatch(r"[0-9]{1,12}", v) and int(v) > 0 for v in (blocks, size)):
        return Unavailable("vllm:cache_config_info lacks a whole positive num_gpu_blocks or block_size "
                           f"({printable(blocks[:20])!r}, {printable(size[:20])!r})")
    return int(blocks) * int(size)


def _sglang(samples: dict[str, list[_Sample]]) -> tuple[list[ModelStats], list[str]]:
    notes = _Notes()
    _, usage = _by_model(samples, "sglang:token_usage")
    _, cap = _by_model(samples, "sglang:max_total_num_tokens")
    _, used = _by_model(samples, "sglang:num_used_tokens")
    _, hit = _by_model(samples, "sglang:cache_hit_rate")
    _, running = _by_model(samples, "sglang:num_running_reqs")
    _, waiting = _by_model(samples, "sglang:num_queue_reqs")
    keys = list(dict.fromkeys([*usage, *cap, *used, *running, *waiting])) or [("", None)]
    models = []
    for k in keys:
        u = notes.fraction("sglang:token_usage", usage.get(k))
        c = notes.count("sglang:max_total_num_tokens", cap.get(k))
        n = notes.count("sglang:num_used_tokens", used.get(k))
        h = notes.fraction("sglang:cache_hit_rate", hit.get(k))
        if u is not None and isinstance(c, int) and c and isinstance(n, int) and abs(n / c - u) > 0.01:
            # token_usage is the engine's own fraction (it weighs hybrid/SWA pools); show both when they differ.
            notes.lines.append(f"{printable(k[0])}: sglang:token_usage {u:g} is not num_used_tokens / "
                               f"max_total_num_tokens = {n:,} / {c:,} = {n / c:.4g}; kv_usage is token_usage")
        models.append(ModelStats(
            model_name=k[0] or "(unnamed)",
            replica=k[1],
            kv_usage=_fraction_or(u, k in usage, "sglang:token_usage", "no sglang:token_usage"),
            kv_capacity_tokens=c,
            kv_used_tokens=n,
            prefix_cache_hit_rate=_fraction_or(h, k in hit, "sglang:cache_hit_rate", "no sglang:cache_hit_rate"),
            running_requests=notes.count("sglang:num_running_reqs", running.get(k)),
            waiting_requests=notes.count("sglang:num_queue_reqs", waiting.get(k)),
            preemptions_total=Unavailable("SGLang exports no preemption counter"),
        ))
    return models, notes.lines


def _server_totals(models: Sequence[ModelStats]) -> dict[str, Any]:
    """The server's headline numbers: its model's, or over several models the pool-weighted usage and the sum."""
    if len(models) == 1:
        m = models[0]
        return {"kv_usage": m.kv_usage, "kv_capacity_tokens": m.kv_capacity_tokens,
                "prefix_cache_hit_rate": m.prefix_cache_hit_rate}
    several = Unavailable(f"{len(models)} models behind this server: see each model")
    caps = [m.kv_capacity_tokens for m in models if isinstance(m.kv_capacity_tokens, int)]
    uses = [m.kv_usage for m in models if isinstance(m.kv_usage, float)]
    if len(caps) < len(models) or len(uses) < len(models):
        return {"kv_usage": several, "kv_capacity_tokens": several, "prefix_cache_hit_rate": several}
    total = sum(caps)
    used = sum(c * u for c, u in zip(caps, uses, strict=True))
    return {"kv_usage": used / total if total else Unavailable("pools of 0 tokens"), "kv_capacity_tokens": total,
            "prefix_cache_hit_rate": several}


# -- the pool in bytes: tokens × bytes per token of the model's config.json --------------------------------------

# vLLM's --kv-cache-dtype names, as dltop kv's
_KV_DTYPES = {"auto": "auto", "fp8": "fp8", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2", "bfloat16": "bf16",
              "float16": "fp16", "half": "fp16", "float32": "fp32"}


def hub_cache(env: Mapping[str, str] | None = None) -> str:
    """The Hugging Face hub cache a server on this machine downloads into: $HF_HUB_CACHE, $HF_HOME/hub, else
    ~/.cache/huggingface/hub (as huggingface_hub resolves it)."""
    env = os.environ if env is None else env
    if env.get("HF_HUB_CACHE"):
        return env["HF_HUB_CACHE"]
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                                              "huggingface")
    return os.path.join(home, "hub")


def model_config_path(model_name: str, cache: str) -> str | Unavailable:
    """The config.json of the model a server names: its own folder when the name is a local path (`vllm serve
    /models/llama`), else the hub cache's snapshot of that repository (the one refs/main names, else the newest)."""
    local = os.path.join(os.path.expanduser(model_name), "config.json")
    if os.path.isabs(os.path.expanduser(model_name)) and os.path.isfile(local):
        return local
    repo = os.path.join(cache, "models--" + model_name.replace("/", "--"))
    snapshots = os.path.join(repo, "snapshots")
    try:
        with open(os.path.join(repo, "refs", "main"), encoding="ascii") as f:
            main = os.path.join(snapshots, f.read().strip(), "config.json")
        if os.path.isfile(main):
            return main
    except OSError:
        pass
    try:
        found = [os.path.join(snapshots, d, "config.json") for d in os.listdir(snapshots)]
    except OSError:
        found = []
    found = [f for f in found if os.path.isfile(f)]
    if found:
        return max(found, key=os.path.getmtime)
    return Unavailable(f"{NO_BYTES}: no config.json of {model_name} here (looked in {repo}; a local model "
                       "folder is read where the server names one)")


def pool_bytes(models: Sequence[ModelStats], engine: str, cache: str) -> tuple[int | Unavailable, list[str]]:
    """The KV pool in bytes over the server's models (tokens × bytes per token of each model's config.json), and
    how it was found; Unavailable with the reason where a model's pool or config is not known."""
    total, notes = 0, []
    for m in models:
        if not isinstance(m.kv_capacity_tokens, int):
            return Unavailable(f"{m.model_name}: pool in tokens not known ({m.kv_capacity_tokens.reason})"), []
        path = model_config_path(m.model_name, cache)
        if isinstance(path, Unavailable):
            return path, []
        shape = _kv_shape(m, path)
        if isinstance(shape, Unavailable):
            return shape, []
        total += m.kv_capacity_tokens * shape.bytes_per_token
        notes += [f"{m.model_name}: {n}" for n in shape.notes if n.startswith("not understood")]
        assumed = "" if m.kv_cache_dtype else f" ({engine} publishes no KV dtype: the model's assumed)"
        notes.append(f"{m.model_name} KV pool: {m.kv_capacity_tokens:,} tokens × {shape.bytes_per_token:,} bytes "
                     f"per token ({shape.dtype}{assumed}) from {path}")
    return total, notes


def _kv_shape(m: ModelStats, path: str) -> KvShape | Unavailable:
    """The KV cache's shape of a model served with the dtype it names, from its config.json at
    `path`; Unavailable where dltop cannot size its pool."""
    from dltop import kv

    given = m.kv_cache_dtype or "auto"
    dtype = _KV_DTYPES.get(given)
    if dtype is None:
        return Unavailable(f"{m.model_name}: KV cache dtype {given!r} is not one dltop sizes")
    try:
        cfg = kv.load_config(path)
        if dtype == "auto" and kv.model_dtype(kv.text_config(cfg))[0] in ("float32", "float"):
            dtype = "fp16"  # vLLM's --dtype auto serves a float32 model in float16
        shape = kv.shape_from_config(cfg, dtype, m.model_name)
    except kv.ConfigError as e:
        return Unavailable(f"{m.model_name}: {e}")
    if shape.sliding_layers:
        return Unavailable(f"{m.model_name} has {shape.sliding_layers} sliding-window layers: how the engine "
                           "pages them into its pool is not published")
    return shape


# -- port -> process --------------------------------------------------------------------------------------------

_LISTEN = "0A"
# sock_diag (netlink): the kernel lists only the listening TCP sockets. Reading /proc/net/tcp walks every
# bucket of the established hash as well: 4-7 ms of CPU a read on a 24 GB VM, against ~0.05 ms here.
_NETLINK_SOCK_DIAG, _SOCK_DIAG_BY_FAMILY = 4, 20
_NLM_F_REQUEST_DUMP = 0x1 | 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_TCP_LISTEN = 10
_DIAG_MSG = struct.Struct("=BBBB2s2s16s16sIQIIIII")  # inet_diag_msg: family, state, ..., sport, ..., inode
_NL_HEADER = struct.Struct("=IHHII")
_MAX_REPLIES = 64  # recv()s per family: a dump of listening sockets is a few; a kernel that never says done stops


def _sock_diag_listening(port: int) -> list[int] | None:
    """Inodes of the TCP sockets (IPv4 and IPv6) listening on `port` in this network namespace, from sock_diag;
    None where netlink cannot answer (no such socket family, a seccomp filter, a reply it cannot read)."""
    inodes: list[int] = []
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG) as s:
            s.settimeout(1.0)
            for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), start=1):
                # inet_diag_req_v2: family, protocol, ext, pad, the states wanted, then an all-zero sockid.
                req = struct.pack("=BBBxI", family, socket.IPPROTO_TCP, 0, 1 << _TCP_LISTEN) + bytes(48)
                s.send(_NL_HEADER.pack(_NL_HEADER.size + len(req), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST_DUMP, seq, 0)
                       + req)
                if not _read_dump(s, seq, port, inodes):
                    return None
    except (OSError, struct.error):
        return None
    return inodes


def _read_dump(s: socket.socket, seq: int, port: int, inodes: list[int]) -> bool:
    """Read one sock_diag dump's replies into `inodes`; False on an error reply or one that does not end."""
    for _ in range(_MAX_REPLIES):
        data = s.recv(65536)
        if not data:
            return False
        if (ended := _read_reply(data, seq, port, inodes)) is not None:
            return ended
    return False


def _read_reply(data: bytes, seq: int, port: int, inodes: list[int]) -> bool | None:
    """One reply's netlink messages into `inodes`: True at the dump's end, False at an error (or a length that
    cannot be), None where more replies follow."""
    off = 0
    while off + _NL_HEADER.size <= len(data):
        length, kind, _flags, got_seq, _pid = _NL_HEADER.unpack_from(data, off)
        if length < _NL_HEADER.size:
            return False
        if got_seq == seq:
            if kind in (_NLMSG_DONE, _NLMSG_ERROR):
                return kind == _NLMSG_DONE
            if kind == _SOCK_DIAG_BY_FAMILY and length >= _NL_HEADER.size + _DIAG_MSG.size and (
                    inode := _listener(data, off + _NL_HEADER.size, port)):
                inodes.append(inode)
        off += (length + 3) & ~3
    return None


def _listener(data: bytes, off: int, port: int) -> int:
    """The inode of the inet_diag_msg at `off` where it is a socket listening on `port`, else 0."""
    msg = _DIAG_MSG.unpack_from(data, off)
    return int(msg[-1]) if msg[1] == _TCP_LISTEN and int.from_bytes(msg[4], "big") == port else 0


def listening_inodes(root: str, port: int) -> tuple[list[int], str | None]:
    """Inodes of the sockets listening on TCP `port` in this network namespace (sock_diag; /proc/net/tcp and tcp6
    under a captured root or where netlink cannot answer), and why there are none when neither file can be read."""
    if os.path.realpath(root) == "/" and (found := _sock_diag_listening(port)) is not None:
        return found, None
    inodes: list[int] = []
    problems = []
    for name in ("tcp", "tcp6"):
        try:
            with open(os.path.join(root, "proc/net", name), encoding="ascii", errors="replace") as f:
                inodes += _proc_net_listening(f.read(), port)
        except OSError as e:
            problems.append(f"cannot read /proc/net/{name}: {e.strerror}")
    return inodes, "; ".join(problems) if len(problems) == 2 else None  # one of the two is enough to say


def _proc_net_listening(text: str, port: int) -> list[int]:
    """Inodes of the sockets listening on `port` in a /proc/net/tcp (or tcp6) text."""
    inodes = []
    for line in text.splitlines()[1:]:
        cols = line.split()
        if len(cols) < 10 or cols[3] != _LISTEN:
            continue
        _, _, hexport = cols[1].rpartition(":")
        with contextlib.suppress(ValueError):
            if int(hexport, 16) == port and cols[9].isdigit() and cols[9] != "0":
                inodes.append(int(cols[9]))
    return inodes


def pid_of_inodes(root: str, inodes: Sequence[int]) -> tuple[int | None, int]:
    """The process holding one of these socket inodes (the lowest pid), and how many processes' fds could not
    be read."""
    wanted = {f"socket:[{i}]" for i in inodes}
    denied = 0
    proc = os.path.join(root, "proc")
    try:
        pids = sorted(int(p) for p in os.listdir(proc) if p.isdigit())
    except OSError:
        return None, 0
    for pid in pids:
        fd_dir = os.path.join(proc, str(pid), "fd")
        try:
            fds = os.listdir(fd_dir)
        except PermissionError:
            denied += 1
            continue
        except OSError:
            continue  # gone
        for fd in fds:
            with contextlib.suppress(OSError):
                if os.readlink(os.path.join(fd_dir, fd)) in wanted:
                    return pid, denied
    return None, denied


def child_pids(root: str, pid: int) -> tuple[int, ...]:
    """Descendants of `pid` from /proc/PID/task/*/children (empty where the kernel has no such file)."""
    out: list[int] = []
    todo = [pid]
    while todo and len(out) < 256:
        p = todo.pop()
        task_dir = os.path.join(root, "proc", str(p), "task")
        try:
            tids = os.listdir(task_dir)
        except OSError:
            continue
        for tid in tids:
            try:
                with open(os.path.join(task_dir, tid, "children"), encoding="ascii") as f:
                    kids = [int(c) for c in f.read().split() if c.isdigit()]
            except OSError:
                continue
            out.extend(kids)
            todo.extend(kids)
    return tuple(sorted(set(out)))


class _PidJoin:
    """port -> pid, remembered while the same socket listens (a walk of every /proc/PID/fd is not per second)."""

    def __init__(self, root: str, url: str) -> None:
        self.root = root
        u = urllib.parse.urlsplit(url)
        self.host = u.hostname or ""
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.known: tuple[tuple[int, ...], int] | None = None  # (inodes, pid)

    def find(self) -> int | Unavailable:
        if not _is_local(self.host):
            return Unavailable(f"{self.host} is not this machine: its process cannot be looked up")
        inodes, problem = listening_inodes(self.root, self.port)
        if not inodes:
            return Unavailable(problem or f"no socket listens on port {self.port} in this network namespace "
                                          "(the server runs in another one, e.g. a container)")
        key = tuple(sorted(inodes))
        if self.known is not None and self.known[0] == key and os.path.isdir(
                os.path.join(self.root, "proc", str(self.known[1]))):
            return self.known[1]
        pid, denied = pid_of_inodes(self.root, inodes)
        if pid is None:
            self.known = None
            if denied:
                return Unavailable(f"port {self.port} listens, but its process is not visible: /proc/PID/fd of "
                                   f"{denied} processes not permitted (run as root or as the server's user)")
            return Unavailable(f"port {self.port} listens, but no process here holds the socket "
                               "(another PID namespace: run with --pid=host)")
        self.known = (key, pid)
        return pid


def _is_local(host: str) -> bool:
    if host in ("localhost", "0.0.0.0", "::", "::1") or host.startswith("127."):
        return True
    with contextlib.suppress(OSError):
        return host in (socket.gethostname(), socket.getfqdn()) or host in _local_addresses()
    return False


def _local_addresses() -> set[str]:
    out = set()
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface's address
        out.add(s.getsockname()[0])
    return out


# -- one read, and the source ---------------------------------------------------------------------------------

def read_server(url: str, timeout_s: float, root: str = "/", join: _PidJoin | None = None,
                cache: str | None = None) -> ServerStats:
    """Scrape one server once; whatever goes wrong is its `state` and `error`, never an exception. `cache` is the
    Hugging Face hub cache the models' config.json are looked up in (default: `hub_cache()`)."""
    join = join or _PidJoin(root, url)
    t0 = time.monotonic()
    try:
        body = fetch_metrics(url, timeout_s)
        engine, models, notes = parse_server(body.decode("utf-8", errors="replace"))
    except ScrapeError as e:
        why = Unavailable(str(e))
        return ServerStats(url=url, state=e.state, error=str(e), engine=why, kv_usage=why, kv_capacity_tokens=why,
                           kv_capacity_bytes=why, prefix_cache_hit_rate=why, pid=join.find(),
                           scraped_at=time.time(), scrape_s=time.monotonic() - t0)
    pid = join.find()
    pool, how = pool_bytes(models, engine, hub_cache() if cache is None else cache)
    return ServerStats(
        url=url, state="ok", engine=engine, kv_capacity_bytes=pool, models=tuple(models),
        pid=pid, child_pids=child_pids(root, pid) if isinstance(pid, int) else (),
        scraped_at=time.time(), scrape_s=time.monotonic() - t0, payload_bytes=len(body), notes=(*notes, *how),
        **_server_totals(models),
    )


def merge_servers(held: Sequence[tuple[Any, Any, Any]]) -> tuple[ServerStats, ...]:
    """The Snapshot's `servers`: each server source's latest reading in order, with the Sampler's word on a read
    that has run past its time; a server not read yet (or whose read failed) keeps its place with the reason."""
    out = []
    for source, value, status in held:
        url = str(source.config)
        if isinstance(value, ServerStats):
            out.append(replace(value, source_error=status.error) if status.error else value)
        else:
            why = value if isinstance(value, Unavailable) else Unavailable("no reading")
            state = "waiting" if status.duration_s is None else "error"  # no read has finished yet, or it raised
            out.append(ServerStats(url=url, state=state, error=why.reason, engine=why, kv_usage=why,
                                   kv_capacity_tokens=why, kv_capacity_bytes=why, prefix_cache_hit_rate=why,
                                   pid=why, source_error=status.error))
    return tuple(out)


def scrape_timing(refresh_s: float) -> tuple[float, float]:
    """(interval, HTTP deadline) for a refresh: every refresh but at most every 2 s (a /metrics render costs the
    server's event loop), the deadline three quarters of the interval, so a hung server is known before the next."""
    interval = max(2.0, refresh_s)
    return interval, interval * 0.75


def source(settings: Any, url: str) -> Any:
    """One server's Source: its own thread, filling its place in the Snapshot's `servers`."""
    from dltop.sources.base import Source

    interval, deadline = scrape_timing(float(getattr(settings, "refresh_s", 1.0)))
    join = _PidJoin(settings.root, url)
    return Source(name=f"server {url}", interval_s=interval, timeout_s=deadline + 0.5, part="servers",
                  merge=merge_servers, config=url,
                  read=lambda: read_server(url, deadline, settings.root, join))
