"""The exporter's HTTP server: `/metrics` (the collector's latest rendering), `/` (a short page), 404 elsewhere;
TLS and basic auth from a web config. Each request runs on its own thread and only reads what the collector
holds: a scrape never samples."""

from __future__ import annotations

import html
import http.server
import ipaddress
import socket
import threading
from typing import Any

from dltop.errors import DltopError, UsageError
from dltop.exporter.collector import SnapshotCollector
from dltop.exporter.webconfig import WebConfig

# Prometheus' default-port page (github.com/prometheus/prometheus/wiki/Default-port-allocations) has had 9100-9999
# all allocated since 2023; 19400 is outside that range, next to where it would sit: dcgm-exporter's 9400.
DEFAULT_PORT = 19400
DEFAULT_LISTEN = f"127.0.0.1:{DEFAULT_PORT}"
REQUEST_TIMEOUT_S = 10.0  # a client that stops talking (or a TLS handshake that never ends) frees its thread


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
        web = self.server.web
        if web is not None and not web.allows(self.headers.get("Authorization")):
            self._send(401, b"Unauthorized\n", "text/plain; charset=utf-8", body,
                       {"WWW-Authenticate": 'Basic realm="dltop"'})
            return
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            data, ctype = self.server.collector.render(self.headers.get("Accept", ""))
            self._send(200, data, ctype, body)
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

    def __init__(self, addr: tuple[str, int], collector: SnapshotCollector, web: WebConfig | None) -> None:
        self.collector = collector
        self.web = web
        try:
            self.address_family = socket.AF_INET6 if ipaddress.ip_address(addr[0]).version == 6 else socket.AF_INET
        except ValueError:  # a host name: IPv4, as Prometheus' own listeners resolve one
            self.address_family = socket.AF_INET
        super().__init__(addr, _Handler)
        if web is not None and web.tls is not None:
            # The handshake runs on the request's own thread, at its first read: a client that connects and
            # says nothing never holds up accept().
            self.socket = web.tls.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """No traceback on stderr for a client that sent plain HTTP to TLS, failed its handshake or hung up."""


class ExporterServer:
    """The HTTP side of `dltop export`, serving `collector` on its own daemon thread."""

    def __init__(self, listen: str, collector: SnapshotCollector, web: WebConfig | None = None) -> None:
        host, port = parse_listen(listen)
        try:
            self._httpd = _Server((host, port), collector, web)
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
