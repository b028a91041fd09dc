"""The exporter's HTTP server: `/metrics` (the collector's latest rendering, gzipped when asked), `/-/healthy` and
`/-/ready` (for probes), `/` (a short page), 404 elsewhere; TLS and basic auth from a web config, re-read when
it changes. Each request runs on its own thread and only reads what the collector holds: a scrape never samples."""

from __future__ import annotations

import contextlib
import gzip
import html
import http.server
import ipaddress
import platform
import socket
import sys
import threading
import time
from typing import Any

from dltop import __version__
from dltop.errors import DltopError, UsageError
from dltop.exporter.collector import SnapshotCollector
from dltop.exporter.webconfig import WebConfig, WebConfigWatcher

# Prometheus' default-port page (github.com/prometheus/prometheus/wiki/Default-port-allocations) has had 9100-9999
# all allocated since 2023; 19400 is outside that range, next to where it would sit: dcgm-exporter's 9400.
DEFAULT_PORT = 19400
DEFAULT_LISTEN = f"127.0.0.1:{DEFAULT_PORT}"
REQUEST_TIMEOUT_S = 10.0  # a client that stops talking (or a TLS handshake that never ends) frees its thread
DEFAULT_STALE_AFTER_S = 25.0  # /-/healthy says 503 when no Snapshot came for this long (3 x 5 s + 10 s)
# What Go's net/http answers on a TLS port to a request in plain HTTP (node_exporter's answer), word for word.
PLAIN_HTTP_ON_TLS = b"HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n"
LOOKS_LIKE_HTTP = {b"GET /", b"HEAD ", b"POST ", b"PUT /", b"OPTIO"}  # Go's looksLikeHTTP, the same five bytes
TLS_HANDSHAKE = 0x16  # the first byte of a TLS record that opens a handshake
PROBE_PATHS = ("/-/healthy", "/-/ready")  # answered without basic auth: they tell nothing but up or not
SOMAXCONN = "/proc/sys/net/core/somaxconn"


def listen_backlog(path: str = SOMAXCONN) -> int:
    """The listen backlog node_exporter gets: Go's net.Listen asks for the kernel's net.core.somaxconn (read
    from /proc; 4096 since Linux 5.4, Go's fallback when it cannot be read), capped at 65535 as Go caps it.
    socketserver's default of 5 overflowed under 50 concurrent scrapers (issue 35): the kernel dropped SYNs
    and each dropped client waited a 1 s retransmit."""
    try:
        with open(path) as f:
            n = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 4096
    return max(1, min(n, 65535))


def build_info_lines(openmetrics: bool) -> bytes:
    """`dltop_build_info{version, python} 1`, in either format (a constant: written once per process)."""
    labels = f'version="{__version__}",python="{platform.python_version()}"'
    family = "dltop_build" if openmetrics else "dltop_build_info"
    kind = "info" if openmetrics else "gauge"
    return (f"# HELP {family} The dltop version and the Python that runs the exporter (value 1)\n"
            f"# TYPE {family} {kind}\ndltop_build_info{{{labels}}} 1.0\n").encode()


_BUILD_INFO = {False: build_info_lines(False), True: build_info_lines(True)}


def accepts_gzip(header: str | None) -> bool:
    """Whether an `Accept-Encoding` header takes gzip (`gzip`, `*`, with a q above 0), as Go's gziphandler reads
    it; Prometheus sends `gzip`."""
    for item in (header or "").split(","):
        name, _, params = item.strip().partition(";")
        if name.strip().lower() not in ("gzip", "*"):
            continue
        q = 1.0
        for p in params.split(";"):
            k, _, v = p.strip().partition("=")
            if k.strip().lower() == "q":
                try:
                    q = float(v)
                except ValueError:
                    q = 0.0
        if q > 0:
            return True
    return False


def parse_listen(text: str) -> tuple[str, int]:
    """`HOST:PORT` or `[IPv6]:PORT` -> (host, port); an empty host is refused: every interface is 0.0.0.0, said."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or not int(port_text) < 65536:
        raise UsageError(f"--listen {text!r}: expected ADDRESS:PORT (e.g. {DEFAULT_LISTEN})")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        raise UsageError(f"--listen {text!r}: say which address (0.0.0.0:{port_text} for every interface, "
                         f"127.0.0.1:{port_text} for this machine only)")
    return host, int(port_text)


def _page(base: str) -> bytes:
    return ("<!doctype html><html><head><title>dltop exporter</title></head><body><h1>dltop exporter</h1>"
            f"<p>The cache layers of deep-learning work, as Prometheus metrics: <a href=\"{html.escape(base)}metrics\">"
            "/metrics</a>.</p><p>Metric names, the Grafana dashboard and the alert rules: docs/exporter.md in "
            "dltop.</p></body></html>\n").encode()


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    timeout = REQUEST_TIMEOUT_S
    server_version = "dltop-exporter"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        """Quiet: a scrape every few seconds is not news (errors still go to stderr)."""

    def log_error(self, format: str, *args: Any) -> None:  # noqa: A002
        """Nothing: a client that went away mid-answer is its own business."""

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, body: bool) -> None:
        path = self.path.split("?", 1)[0]
        if path in PROBE_PATHS:
            code, why = self.server.health(path)
            self._send(code, why.encode() + b"\n", "text/plain; charset=utf-8", body)
            return
        web = self.server.web.current() if self.server.web is not None else None
        if web is not None and not web.allows(self.headers.get("Authorization")):
            self._send(401, b"Unauthorized\n", "text/plain; charset=utf-8", body,
                       {"WWW-Authenticate": 'Basic realm="dltop"'})
            return
        if path == "/metrics":
            gz = accepts_gzip(self.headers.get("Accept-Encoding"))
            data, ctype = self.server.exposition(self.headers.get("Accept", ""), gz)
            headers = {"Vary": "Accept-Encoding"}
            if gz:
                headers["Content-Encoding"] = "gzip"
            self._send(200, data, ctype, body, headers)
        elif path == "/":
            self._send(200, _page("/"), "text/html; charset=utf-8", body)
        else:
            self._send(404, b"Not found: dltop serves /metrics\n", "text/plain; charset=utf-8", body)

    def _send(self, code: int, data: bytes, ctype: str, body: bool, headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if body:
            self.wfile.write(data)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = listen_backlog()

    def __init__(self, addr: tuple[str, int], collector: SnapshotCollector, web: WebConfigWatcher | None,
                 stale_after_s: float) -> None:
        self.collector = collector
        self.web = web
        self.stale_after_s = stale_after_s
        self.started = time.monotonic()
        self._served_lock = threading.Lock()
        # (content type, gzipped) -> (the collector's rendering, the bytes served for it): the answer to every
        # scrape of one Snapshot, put together once
        self._served: dict[tuple[str, bool], tuple[bytes, bytes]] = {}
        try:
            self.address_family = socket.AF_INET6 if ipaddress.ip_address(addr[0]).version == 6 else socket.AF_INET
        except ValueError:  # a host name: IPv4, as Prometheus' own listeners resolve one
            self.address_family = socket.AF_INET
        super().__init__(addr, _Handler)

    def health(self, path: str) -> tuple[int, str]:
        """(status, why) for /-/healthy (the Sampler is handing in Snapshots) or /-/ready (one is in)."""
        updated = self.collector.updated_at
        if path == "/-/ready":
            return (200, "ready") if updated is not None else (503, "not ready: no Snapshot yet")
        age_s = time.monotonic() - (self.started if updated is None else updated)
        if age_s > self.stale_after_s:
            return 503, f"unhealthy: no Snapshot for {age_s:.0f} s (more than {self.stale_after_s:g} s)"
        return 200, "healthy"

    def exposition(self, accept: str, gz: bool) -> tuple[bytes, str]:
        """(body, content type) of /metrics: the collector's rendering of the newest Snapshot (encoded once per
        Snapshot) behind the build info, gzipped when asked; made once per rendering and format, and every
        other scrape of that Snapshot is served these same bytes."""
        data, ctype = self.collector.render(accept)
        key = (ctype, gz)
        with self._served_lock:
            got = self._served.get(key)
            if got is not None and got[0] is data:
                return got[1], ctype
        body = _BUILD_INFO[ctype.startswith("application/openmetrics-text")] + data
        if gz:
            body = gzip.compress(body, compresslevel=6, mtime=0)
        with self._served_lock:
            self._served[key] = (data, body)
        return body, ctype

    def finish_request(self, request: Any, client_address: Any) -> None:
        """On the request's own thread: TLS when the web config in force asks for it (looked up per connection,
        so a certificate rotated on disk is served to the next one), plain HTTP to a TLS port answered as Go's
        net/http answers it."""
        web = self.web.current() if self.web is not None else None
        if web is None or web.tls is None:
            super().finish_request(request, client_address)
            return
        request.settimeout(REQUEST_TIMEOUT_S)
        try:
            first = request.recv(5, socket.MSG_PEEK | socket.MSG_WAITALL)  # a TLS record's header is 5 bytes
        except OSError:
            return
        if not first:
            return
        if first[0] != TLS_HANDSHAKE:
            if first in LOOKS_LIKE_HTTP:
                with contextlib.suppress(OSError):
                    request.recv(65536)  # what was sent: unread at close, the client would get a reset, not this
                    request.sendall(PLAIN_HTTP_ON_TLS)
            return
        # The handshake runs here, on this thread, at the first read: a client that connects and says nothing
        # never holds up accept().
        conn = web.tls.wrap_socket(request, server_side=True, do_handshake_on_connect=False)
        try:
            super().finish_request(conn, client_address)
        finally:
            with contextlib.suppress(OSError):
                conn.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """No traceback on stderr for a client that failed its handshake or hung up."""


class ExporterServer:
    """The HTTP side of `dltop export`, serving `collector` on its own daemon thread."""

    def __init__(self, listen: str, collector: SnapshotCollector, web: WebConfig | None = None,
                 stale_after_s: float = DEFAULT_STALE_AFTER_S) -> None:
        host, port = parse_listen(listen)
        self.web = None if web is None else WebConfigWatcher(web, _log)
        try:
            self._httpd = _Server((host, port), collector, self.web, stale_after_s)
        except OSError as e:
            raise DltopError(f"cannot listen on {listen}: {e.strerror or e}") from None
        self.scheme = "https" if web is not None and web.tls is not None else "http"
        bound = self._httpd.server_address
        self.port = int(bound[1])
        self.url = f"{self.scheme}://{f'[{host}]' if ':' in host else host}:{self.port}/metrics"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="dltop-exporter", daemon=True)

    def start(self) -> None:
        """Serve on a daemon thread."""
        self._thread.start()

    def close(self) -> None:
        """Stop serving and free the port."""
        if self._thread.is_alive():
            self._httpd.shutdown()
        self._httpd.server_close()


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
