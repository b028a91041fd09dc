"""Every answer from outside is bounded as a whole (docs/trust.md): a Prometheus that sends a byte a second ends
`dltop cluster` at --prometheus-timeout, and a 100 MB answer or a gzip bomb is refused with the memory of dltop
bounded; the same for an inference server's /metrics. Real loopback servers, real `dltop` processes, their peak
memory read from the kernel (ru_maxrss of wait4)."""

from __future__ import annotations

import gzip
import http.server
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dltop.config import PrometheusOptions
from dltop.model.base import Unavailable
from dltop.sources.cluster import PrometheusClient, read_or_reason

REPO = Path(__file__).resolve().parents[1]
BIG_BYTES = 100 << 20  # 100 MB, sent in 1 MiB chunks (no Content-Length: the cap must stop the read itself)
MAX_RSS_BYTES = 300 << 20
EMPTY = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
EMPTY_LIST = b'{"status":"success","data":[]}'  # no label values
_ZEROS = gzip.compress(bytes(BIG_BYTES), compresslevel=9)  # ~100 KB that inflate to 100 MB


class _Hostile(http.server.BaseHTTPRequestHandler):
    """Answers by the first path component: /trickle (a byte a second), /big (100 MB), /bomb (gzip of 100 MB of
    zeros, ~100 KB sent), /ok (an empty vector, or no label values). Each write ends when the client goes or at 60 s."""

    protocol_version = "HTTP/1.0"
    hits: list[str] = []  # noqa: RUF012 - the class is the server's record

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._answer()

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self._answer()

    def _answer(self) -> None:
        kind = self.path.strip("/").split("/")[0]
        self.hits.append(kind)
        end = time.monotonic() + 60
        try:
            if kind == "trickle":
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                for b in (EMPTY * 100):  # a byte a second: each read is quick, the answer never ends in time
                    if time.monotonic() > end:
                        break
                    self.wfile.write(bytes([b]))
                    self.wfile.flush()
                    time.sleep(1)
            elif kind == "big":
                self.send_response(200)
                self.end_headers()
                chunk = b"[" * (1 << 20)
                for _ in range(BIG_BYTES >> 20):
                    self.wfile.write(chunk)
            elif kind == "bomb":
                self.send_response(200)
                self.send_header("Content-Encoding", "gzip")
                self.send_header("Content-Length", str(len(_ZEROS)))
                self.end_headers()
                self.wfile.write(_ZEROS)
            else:
                body = EMPTY_LIST if "/api/v1/label/" in self.path else EMPTY
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
        except OSError:
            pass  # the client hung up: what a bounded reader does


@pytest.fixture(scope="module")
def hostile() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# Runs argv as its child and says the child's peak RSS from wait4. A child forked from the test's own process
# would count the pytest worker's memory (ru_maxrss keeps the peak from before its exec): this small launcher is a
# fresh interpreter, so the process measured starts from its few MiB.
_LAUNCH = r"""
import os, subprocess, sys
p = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
_, status, usage = os.wait4(p.pid, 0)
sys.stdout.write(f"{os.waitstatus_to_exitcode(status)} {usage.ru_maxrss}")
"""


def _run(argv: list[str], timeout_s: float = 60) -> tuple[int, str, float, int]:
    """(exit status, stderr, wall seconds, peak RSS in bytes) of a child process, its RSS from wait4."""
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", _LAUNCH, *argv], capture_output=True, cwd=REPO, timeout=timeout_s,
                         env={**os.environ, "XDG_CONFIG_HOME": "/nonexistent"})
    code, maxrss = out.stdout.decode().split()
    return int(code), out.stderr.decode("utf-8", "replace"), time.monotonic() - t0, int(maxrss) * 1024


def _cluster(url: str) -> tuple[int, str, float, int]:
    return _run([sys.executable, "-m", "dltop", "cluster", "--prometheus", url, "--prometheus-timeout", "2"])


def test_a_prometheus_that_trickles_ends_the_refresh_at_its_timeout(hostile: str) -> None:
    code, err, took, _ = _cluster(hostile + "/trickle")
    # One deadline for every query of the refresh together: 2 s, not 2 s a read (a read of one byte is quick).
    assert took < 10, f"took {took:.1f} s: {err}"
    assert code == 1 and err.count("\n") == 1 and "timeout after 2 s" in err, err


@pytest.mark.parametrize("kind", ["big", "bomb"])
def test_a_huge_prometheus_answer_is_refused_with_memory_bounded(hostile: str, kind: str) -> None:
    code, err, took, rss = _cluster(f"{hostile}/{kind}")
    assert code == 1 and err.count("\n") == 1 and "MiB" in err and "refused" in err, err
    assert rss < MAX_RSS_BYTES, f"peak RSS {rss >> 20} MiB"
    assert took < 20, f"took {took:.1f} s"


def test_a_slow_refresh_is_a_reason_and_the_next_refresh_works(hostile: str) -> None:
    # The TUI's way: the source's refresh is Unavailable with the one line, and the client is fine after it.
    t0 = time.monotonic()
    part = read_or_reason(PrometheusClient(PrometheusOptions(hostile + "/trickle", timeout_s=1.0)), "")
    assert time.monotonic() - t0 < 5
    assert isinstance(part, Unavailable) and "timeout after 1 s" in part.reason
    ok = read_or_reason(PrometheusClient(PrometheusOptions(hostile + "/ok", timeout_s=1.0)), "")
    assert not isinstance(ok, Unavailable) and ok.nodes == ()


_SCRAPE = ("import sys; from dltop.sources.servers import read_server; s = read_server(sys.argv[1], 2.0); "
           "print(s.state, s.error, file=sys.stderr)")


@pytest.mark.parametrize(("kind", "state", "words"), [
    ("trickle", "timeout", "not complete within 2 s"),
    ("big", "too_large", "cap"),
    ("bomb", "too_large", "once inflated"),
])
def test_a_hostile_metrics_page_is_a_state_with_memory_bounded(hostile: str, kind: str, state: str,
                                                              words: str) -> None:
    code, err, took, rss = _run([sys.executable, "-c", _SCRAPE, f"{hostile}/{kind}/metrics"])
    assert code == 0 and err.startswith(state + " ") and words in err and err.count("\n") == 1, err
    assert took < 10 and rss < MAX_RSS_BYTES, (took, rss >> 20)
