"""Inference servers: real vLLM / SGLang payloads served over real HTTP on loopback, hostile servers, the Sampler.

The numbers are checked against values this test reads from the fixture text itself (a line scan of the one
sample), never typed in; every hostile server is bounded in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dltop.config import Settings, load_config
from dltop.derive import server_rates
from dltop.errors import DltopError
from dltop.model import ServerStats, Snapshot, Unavailable
from dltop.sampler import Sampler
from dltop.sources import servers
from dltop.sources.registry import build_sources
from dltop.sources.servers import MAX_PAYLOAD_BYTES, ScrapeError, parse_server, read_server

from .conftest import REPO, SHARED_FIXTURES, strict_json

METRICS = SHARED_FIXTURES / "metrics"
V0 = "vllm-0.4.x-v0-datadog-integrations-core.prom"
V1 = "vllm-0.10.0-v1-production-stack-issue617-fragment.prom"
SGLANG = "sglang-0.5.10-datadog-integrations-core.prom"
needs_fixtures = pytest.mark.skipif(not METRICS.is_dir(), reason=f"metrics fixtures not found at {METRICS}")


def sample(name: str, text: str) -> float:
    """The value of the first sample called exactly `name` (a line scan, independent of the parser)."""
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")):
            return float(line.rsplit(None, 1)[1])
    raise AssertionError(f"{name} not in the fixture")


def label(name: str, key: str, text: str) -> str:
    line = next(ln for ln in text.splitlines() if ln.startswith(name + "{"))
    m = re.search(rf'[{{,]{key}="([^"]*)"', line)
    assert m, f"{key} not on {name}"
    return m.group(1)


class Handler(BaseHTTPRequestHandler):
    """Serves /<fixture file> and the hostile paths; `bodies` holds payloads a test put in place."""

    bodies: dict[str, bytes] = {}
    release = threading.Event()

    def log_message(self, *args: object) -> None:  # keep the test output clean
        pass

    def _send(self, code: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        path = self.path
        if path in self.bodies:
            return self._send(200, self.bodies[path])
        if path == "/hang":
            self.release.wait(30)
            return None
        if path == "/trickle-headers":  # each header in time (every socket read within its timeout), for 10 s
            with contextlib.suppress(OSError):
                self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                for _ in range(50):
                    if self.release.wait(0.2):
                        break
                    self.wfile.write(b"X-Slow: 1\r\n")
                    self.wfile.flush()
            return None
        if path == "/trickle-body":
            self.send_response(200)
            self.end_headers()
            while not self.release.wait(0.1):
                self.wfile.write(b"# x\n")
                self.wfile.flush()
            return None
        if path == "/500":
            return self._send(500, b"boom")
        if path in ("/401", "/403"):
            return self._send(int(path[1:]), b"no")
        if path == "/garbage":
            return self._send(200, b"<html><body>Welcome to nginx!</body></html>\n")
        if path == "/empty":
            return self._send(200, b"")
        if path == "/node":
            return self._send(200, b"# TYPE node_load1 gauge\nnode_load1 0.5\n")
        if path == "/huge":  # no Content-Length: the cap must stop the read
            self.send_response(200)
            self.end_headers()
            line = b"x_total 1\n" * 10_000
            with __import__("contextlib").suppress(OSError):
                for _ in range(MAX_PAYLOAD_BYTES // len(line) + 3):
                    self.wfile.write(line)
            return None
        if path == "/huge-declared":
            self.send_response(200)
            self.send_header("Content-Length", str(3 << 20))
            self.end_headers()
            return None
        if path == "/away":
            return self._send(307, b"", {"Location": "http://192.0.2.1:9/metrics"})
        if path == "/same":
            return self._send(307, b"", {"Location": f"/{V0}"})
        f = METRICS / path.lstrip("/")
        if f.is_file():
            return self._send(200, f.read_bytes())
        return self._send(404, b"not found")


@pytest.fixture
def server() -> Iterator[str]:
    Handler.release = threading.Event()
    Handler.bodies = {}
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        Handler.release.set()
        httpd.shutdown()
        httpd.server_close()


# -- real payloads -----------------------------------------------------------------------------------------

@needs_fixtures
def test_vllm_v0_numbers_are_the_payloads(server: str) -> None:
    text = (METRICS / V0).read_text()
    s = read_server(f"{server}/{V0}", 2.0)
    assert s.state == "ok" and s.engine == "vllm", s.error
    (m,) = s.models
    assert m.model_name == label("vllm:gpu_cache_usage_perc", "model_name", text)
    assert s.kv_usage == m.kv_usage == sample("vllm:gpu_cache_usage_perc", text)
    blocks = int(label("vllm:cache_config_info", "num_gpu_blocks", text))
    block = int(label("vllm:cache_config_info", "block_size", text))
    assert s.kv_capacity_tokens == m.kv_capacity_tokens == blocks * block
    assert m.running_requests == sample("vllm:num_requests_running", text)
    assert m.waiting_requests == sample("vllm:num_requests_waiting", text)
    assert m.swapped_requests == sample("vllm:num_requests_swapped", text)
    assert m.preemptions_total == sample("vllm:num_preemptions_total", text)
    # This server ran with prefix caching off: no hit rate, and the reason says so.
    assert label("vllm:cache_config_info", "enable_prefix_caching", text) == "False"
    assert isinstance(s.prefix_cache_hit_rate, Unavailable) and "off" in s.prefix_cache_hit_rate.reason
    assert isinstance(s.kv_capacity_bytes, Unavailable) and "config.json" in s.kv_capacity_bytes.reason
    assert s.payload_bytes == len(text.encode())
    assert s.pid == os.getpid()  # the loopback server in this very process holds the listening socket


@needs_fixtures
def test_vllm_v1_reads_the_new_names_and_not_the_created_timestamps(server: str) -> None:
    text = (METRICS / V1).read_text()
    s = read_server(f"{server}/{V1}", 2.0)
    assert s.state == "ok" and s.engine == "vllm"
    (m,) = s.models
    assert m.model_name == label("vllm:kv_cache_usage_perc", "model_name", text)
    assert m.replica == "engine=" + label("vllm:kv_cache_usage_perc", "engine", text)
    assert m.kv_usage == sample("vllm:kv_cache_usage_perc", text)
    assert m.prefix_cache_queries_total == sample("vllm:prefix_cache_queries_total", text)
    # Only the deprecated name of the hits counter is in this fragment; its _created sibling is a timestamp.
    assert m.prefix_cache_hits_total == sample("vllm:gpu_prefix_cache_hits_total", text)
    assert m.prefix_cache_hits_total != sample("vllm:gpu_prefix_cache_hits_created", text)
    assert isinstance(m.prefix_cache_hit_rate, Unavailable) and "two readings" in m.prefix_cache_hit_rate.reason
    # The fragment has no cache_config_info: no capacity, with the reason.
    assert "vllm:cache_config_info" not in text
    assert isinstance(s.kv_capacity_tokens, Unavailable) and "cache_config_info" in s.kv_capacity_tokens.reason


@needs_fixtures
def test_sglang_numbers_and_the_disagreement_shown(server: str) -> None:
    text = (METRICS / SGLANG).read_text()
    s = read_server(f"{server}/{SGLANG}", 2.0)
    assert s.state == "ok" and s.engine == "sglang"
    (m,) = s.models
    assert s.kv_usage == sample("sglang:token_usage", text)
    assert s.kv_capacity_tokens == sample("sglang:max_total_num_tokens", text)
    assert m.kv_used_tokens == sample("sglang:num_used_tokens", text)
    assert s.prefix_cache_hit_rate == sample("sglang:cache_hit_rate", text)
    assert m.running_requests == sample("sglang:num_running_reqs", text)
    assert m.waiting_requests == sample("sglang:num_queue_reqs", text)
    # token_usage is not used / capacity in this curated capture: both numbers are shown.
    used, cap = sample("sglang:num_used_tokens", text), sample("sglang:max_total_num_tokens", text)
    assert abs(used / cap - sample("sglang:token_usage", text)) > 0.01
    assert any(f"{int(used):,} / {int(cap):,}" in n for n in s.notes)


@needs_fixtures
def test_several_models_behind_one_server_are_shown_apart(server: str) -> None:
    text = (METRICS / SGLANG).read_text()
    other = text.replace('model_name="facebook/opt-125m"', 'model_name="other/model"')
    other = other.replace("sglang:token_usage{model_name=\"other/model\",tp_rank=\"0\"} 0.25",
                          "sglang:token_usage{model_name=\"other/model\",tp_rank=\"0\"} 0.75")
    both = text + "\n" + "\n".join(ln for ln in other.splitlines() if not ln.startswith("#"))
    Handler.bodies["/two"] = both.encode()
    s = read_server(f"{server}/two", 2.0)
    assert s.state == "ok", s.error
    assert [m.model_name for m in s.models] == ["facebook/opt-125m", "other/model"]
    assert [m.kv_usage for m in s.models] == [0.25, 0.75]
    cap = sample("sglang:max_total_num_tokens", text)
    assert s.kv_capacity_tokens == 2 * cap
    assert s.kv_usage == pytest.approx(0.5)  # pool-weighted over two pools of the same size
    assert isinstance(s.prefix_cache_hit_rate, Unavailable) and "2 models" in s.prefix_cache_hit_rate.reason


@needs_fixtures
def test_v1_hit_rate_is_over_the_interval_between_two_snapshots(server: str) -> None:
    text = (METRICS / V1).read_text()
    q0, h0 = sample("vllm:prefix_cache_queries_total", text), sample("vllm:gpu_prefix_cache_hits_total", text)
    later = (text.replace(f"vllm:prefix_cache_queries_total{{engine=\"0\",model_name=\"zai-org/GLM-4.5\"}} {q0}",
                          f"vllm:prefix_cache_queries_total{{engine=\"0\",model_name=\"zai-org/GLM-4.5\"}} {q0 + 400}")
                  .replace(f"vllm:gpu_prefix_cache_hits_total{{engine=\"0\",model_name=\"zai-org/GLM-4.5\"}} {h0}",
                           f"vllm:gpu_prefix_cache_hits_total{{engine=\"0\",model_name=\"zai-org/GLM-4.5\"}} {h0 + 100}"))
    assert later != text
    Handler.bodies["/later"] = later.encode()
    a = read_server(f"{server}/{V1}", 2.0)
    b = read_server(f"{server}/later", 2.0)
    b = ServerStats(**{**b.__dict__, "url": a.url})  # the same server, read again
    first, second = Snapshot(ts=1.0, host="h", servers=(a,)), Snapshot(ts=3.0, host="h", servers=(b,))
    (r,) = server_rates(first, second)
    assert r.prefix_cache_hit_rate == pytest.approx(100 / 400)
    (back,) = server_rates(second, first)  # a restart: counters went backwards
    assert isinstance(back.prefix_cache_hit_rate, Unavailable) and "backwards" in back.prefix_cache_hit_rate.reason
    (none,) = server_rates(first, first)
    assert isinstance(none.prefix_cache_hit_rate, Unavailable) and "no prefix-cache queries" in none.prefix_cache_hit_rate.reason


def test_v0_hit_rate_gauge_of_minus_one_means_prefix_caching_is_off() -> None:
    text = ('# TYPE vllm:gpu_prefix_cache_hit_rate gauge\nvllm:gpu_prefix_cache_hit_rate{model_name="m"} -1.0\n'
            'vllm:gpu_cache_usage_perc{model_name="m"} 0.5\n')
    _, (m,), _ = parse_server(text)
    assert isinstance(m.prefix_cache_hit_rate, Unavailable) and "off" in m.prefix_cache_hit_rate.reason
    _, (m,), _ = parse_server(text.replace("-1.0", "0.375"))
    assert m.prefix_cache_hit_rate == 0.375


# -- hostile servers ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("path", "state", "words"), [
    ("/hang", "timeout", "no answer within 1 s"),
    ("/trickle-body", "timeout", "not complete within 1 s"),
    ("/trickle-headers", "timeout", "no answer within 1 s"),
    ("/500", "http_error", "HTTP 500"),
    ("/401", "auth", "HTTP 401"),
    ("/403", "auth", "HTTP 403"),
    ("/garbage", "garbage", "not Prometheus text"),
    ("/empty", "not_inference", "no vllm: or sglang:"),
    ("/node", "not_inference", "no vllm: or sglang:"),
    ("/huge", "too_large", "cap"),
    ("/huge-declared", "too_large", "not read"),
    ("/away", "redirect", "http://192.0.2.1:9/metrics"),
])
def test_a_hostile_server_is_a_state_within_the_deadline(server: str, path: str, state: str, words: str) -> None:
    t0 = time.monotonic()
    s = read_server(server + path, 1.0)
    took = time.monotonic() - t0
    assert took < 2.0, f"{path} took {took:.1f} s"
    assert s.state == state and words in (s.error or ""), s.error
    assert isinstance(s.kv_usage, Unavailable) and s.kv_usage.reason == s.error
    Snapshot.from_json(Snapshot(ts=0.0, host="h", servers=(s,)).to_json())


@needs_fixtures
def test_a_redirect_on_the_same_host_is_followed(server: str) -> None:
    s = read_server(server + "/same", 2.0)
    assert s.state == "ok" and s.engine == "vllm"


def test_a_server_that_is_down_says_connection_refused() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connect is refused
        s = read_server(f"http://127.0.0.1:{port}/metrics", 1.0)
    assert s.state == "down" and "connection refused" in (s.error or "")
    assert isinstance(s.pid, Unavailable) and f"port {port}" in s.pid.reason


def test_pid_of_a_port_under_a_captured_root(tmp_path: Path) -> None:
    header = Path("/proc/net/tcp").read_text().splitlines()[0] + "\n"
    s = read_server("http://127.0.0.1:1/metrics", 0.5, root=str(tmp_path))
    assert isinstance(s.pid, Unavailable) and "cannot read /proc/net/" in s.pid.reason
    (tmp_path / "proc/net").mkdir(parents=True)
    for name in ("tcp", "tcp6"):
        (tmp_path / "proc/net" / name).write_text(header)
    s = read_server("http://127.0.0.1:1/metrics", 0.5, root=str(tmp_path))
    assert isinstance(s.pid, Unavailable) and "no socket listens on port 1" in s.pid.reason
    # A socket that listens, held by no process the tree shows: another PID namespace.
    listen = "   0: 00000000:0001 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1\n"
    (tmp_path / "proc/net/tcp").write_text(header + listen)
    s = read_server("http://127.0.0.1:1/metrics", 0.5, root=str(tmp_path))
    assert isinstance(s.pid, Unavailable) and "--pid=host" in s.pid.reason


def _captured_net(tmp_path: Path) -> str:
    """A root whose proc/net/tcp and tcp6 are this namespace's, read now (the file reader's answer)."""
    (tmp_path / "proc/net").mkdir(parents=True)
    for name in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            (tmp_path / "proc/net" / name).write_text(Path("/proc/net", name).read_text())
    return str(tmp_path)


@pytest.mark.parametrize("family", ["AF_INET", "AF_INET6"])
def test_the_listening_socket_of_a_port_is_found_by_sock_diag(tmp_path: Path, family: str) -> None:
    import socket

    fam = getattr(socket, family)
    with socket.socket(fam) as sock, socket.socket(fam) as bound:
        try:
            sock.bind(("::1" if fam == socket.AF_INET6 else "127.0.0.1", 0))
        except OSError:
            pytest.skip(f"no {family} loopback on this machine")
        sock.listen()
        port = sock.getsockname()[1]
        bound.bind((sock.getsockname()[0], 0))  # bound, not listening: not listed
        inode = os.fstat(sock.fileno()).st_ino
        diag = servers._sock_diag_listening(port)
        if diag is None:
            pytest.skip("netlink sock_diag refused here (the files are read instead)")
        assert diag == [inode]
        assert servers._sock_diag_listening(bound.getsockname()[1]) == []
        # The same answer as the files, which a captured root (or a kernel without sock_diag) reads.
        assert servers.listening_inodes(_captured_net(tmp_path), port) == ([inode], None)
        assert servers.listening_inodes("/", port) == ([inode], None)


def test_the_live_lookup_reads_no_proc_net_file_and_falls_back_to_them(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port, inode = sock.getsockname()[1], os.fstat(sock.fileno()).st_ino
        opened: list[str] = []
        real_open = builtins.open

        def spy(file: object, *args: object, **kwargs: object) -> object:
            opened.append(str(file))
            return real_open(file, *args, **kwargs)  # type: ignore[call-overload]

        monkeypatch.setattr(builtins, "open", spy)
        if servers._sock_diag_listening(port) is not None:
            # /proc/net/tcp costs the kernel a walk of every established socket's bucket (ms a read).
            assert servers.listening_inodes("/", port) == ([inode], None)
            assert not [f for f in opened if "proc/net" in f]
        real_socket = socket.socket

        def no_netlink(family: int = socket.AF_INET, *args: object, **kwargs: object) -> socket.socket:
            if family == socket.AF_NETLINK:
                raise PermissionError(1, "Operation not permitted")
            return real_socket(family, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(socket, "socket", no_netlink)
        assert servers._sock_diag_listening(port) is None
        assert servers.listening_inodes("/", port) == ([inode], None)
        assert [f for f in opened if f.endswith("proc/net/tcp")]


# -- the Sampler: one bad server never slows the others -----------------------------------------------------

@needs_fixtures
async def test_a_hung_server_never_delays_the_other(server: str) -> None:
    settings = Settings(servers=(f"{server}/trickle-headers", f"{server}/{SGLANG}"), refresh_s=1.0)
    sampler = Sampler(build_sources(settings), builder=build_sources)
    seen: list[Snapshot] = []
    t0 = time.monotonic()

    async def collect() -> None:
        async for snap in sampler.stream(lambda: 0.25):
            seen.append(snap)
            if time.monotonic() - t0 > 5.0:
                return

    try:
        await asyncio.wait_for(collect(), 10)
    finally:
        sampler.close()
    last = seen[-1]
    assert isinstance(last.servers, tuple) and [s.url for s in last.servers] == list(settings.servers)
    hung, ok = last.servers
    # The good server was scraped at every 2 s interval while the other's reads ran to their deadline.
    scrapes = {s.servers[1].scraped_at for s in seen if isinstance(s.servers, tuple) and s.servers[1].scraped_at}
    assert len(scrapes) >= 3, scrapes
    assert ok.state == "ok" and ok.source_error is None
    assert hung.state == "timeout" and "no answer within 1.5 s" in (hung.error or ""), hung


@needs_fixtures
async def test_a_server_added_at_run_time_is_polled_and_removed(server: str) -> None:
    base = Settings(refresh_s=1.0)
    sampler = Sampler(build_sources(base), builder=build_sources)
    try:
        assert sampler.read_once().servers is None
        url = f"{server}/{V0}"
        sampler.reconfigure(Settings(refresh_s=1.0, servers=(url,)))
        snap = sampler.read_once()
        assert isinstance(snap.servers, tuple) and snap.servers[0].url == url and snap.servers[0].state == "ok"
        sampler.reconfigure(base)
        assert sampler.read_once().servers is None
    finally:
        sampler.close()


# -- the parser never crashes ----------------------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_arbitrary_text_never_crashes_the_parser(text: str) -> None:
    try:
        parse_server(text)
    except ScrapeError as e:
        assert e.state in ("garbage", "not_inference")


_value = st.one_of(st.floats(), st.integers(-5, 10**12).map(str), st.sampled_from(["NaN", "+Inf", "-1", "1e400"]))
_names = st.sampled_from(["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm:num_requests_running",
                          "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
                          "vllm:gpu_prefix_cache_hit_rate", "vllm:num_preemptions_total",
                          "sglang:token_usage", "sglang:max_total_num_tokens", "sglang:num_used_tokens"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_names, st.sampled_from(["a", "b", ""]), _value,
                          st.sampled_from(["", 'block_size="x"', 'num_gpu_blocks="7",block_size="16"'])),
                min_size=1, max_size=8))
def test_inference_payloads_with_any_values_give_valid_json(rows: list[tuple[str, str, object, str]]) -> None:
    lines = []
    for name, model, value, cfg in rows:
        lines.append(f'{name}{{model_name="{model}"}} {value}')
        if cfg:
            lines.append(f"vllm:cache_config_info{{{cfg}}} 1.0")
    try:
        engine, models, _ = parse_server("\n".join(lines) + "\n")
    except ScrapeError:
        return
    s = ServerStats(url="u", state="ok", engine=engine, models=tuple(models))
    snap = Snapshot(ts=0.0, host="h", servers=(s,))
    assert Snapshot.from_json(snap.to_json()) == snap
    def refuse(word: str) -> None:
        raise AssertionError(f"{word} in the JSON")

    json.loads(snap.to_json(), parse_constant=refuse)  # no NaN or Infinity: a non-finite value is left out


# -- a hostile payload: one bad line or value costs only itself ------------------------------------------------------

def _one_line(text: str) -> bool:
    """One line a terminal shows as written: no line break, no control character."""
    return not any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 or c in "\u2028\u2029" for c in text)


def _replace_value(text: str, name: str, value: str) -> str:
    """The text with the first sample called exactly `name` given `value` (written as is)."""
    lines = text.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith((name + "{", name + " ")))
    lines[i] = lines[i].rsplit(None, 1)[0] + " " + value
    return "\n".join(lines) + "\n"


@needs_fixtures
def test_one_bad_line_costs_only_itself(server: str) -> None:
    text = (METRICS / V0).read_text()
    lines = text.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("vllm:num_requests_running"))
    bad = ['vllm:num_requests_waiting{model_name="x" 3', "}}}{{{ not a metric \x1b[2J", "x" * (100 << 10)]
    Handler.bodies["/bad-lines"] = "\n".join([*lines[:at], *bad, *lines[at:]]).encode()
    s = read_server(f"{server}/bad-lines", 2.0)
    assert s.state == "ok", s.error
    (m,) = s.models
    assert m.running_requests == sample("vllm:num_requests_running", text)
    assert m.waiting_requests == sample("vllm:num_requests_waiting", text)  # the good line, not the broken one
    assert s.kv_capacity_tokens == int(label("vllm:cache_config_info", "num_gpu_blocks", text)) * int(
        label("vllm:cache_config_info", "block_size", text))
    left = [n for n in s.notes if n.startswith("left out:")]
    assert [n.split(":")[1].strip() for n in left] == [f"line {at + 1}", f"line {at + 2}", f"line {at + 3}"]
    assert "over the 65,536 cap" in left[2] and all(_one_line(n) and len(n) < 300 for n in s.notes)


@needs_fixtures
@pytest.mark.parametrize("name, value", [
    ("vllm:num_requests_running", "-3"), ("vllm:num_requests_running", "1e400"), ("vllm:num_requests_running", "NaN"),
    ("vllm:num_requests_running", "2.5"), ("vllm:num_requests_running", "1e300"),
    ("vllm:num_preemptions_total", "-1"), ("vllm:num_requests_waiting", "+Inf"),
])
def test_a_value_that_is_no_count_is_left_out_with_a_note(name: str, value: str) -> None:
    text = (METRICS / V0).read_text()
    _, (m,), notes = parse_server(_replace_value(text, name, value))
    field = {"vllm:num_requests_running": "running_requests", "vllm:num_preemptions_total": "preemptions_total",
             "vllm:num_requests_waiting": "waiting_requests"}[name]
    got = getattr(m, field)
    assert isinstance(got, Unavailable) and name in got.reason, got
    assert any(n.startswith(name) and "not a count" in n for n in notes), notes
    assert m.swapped_requests == sample("vllm:num_requests_swapped", text)  # the rest of the page is read
    assert m.kv_usage == sample("vllm:gpu_cache_usage_perc", text)


@needs_fixtures
@pytest.mark.parametrize("value", ["7.5", "-0.25", "NaN", "1e400"])
def test_a_usage_that_is_no_fraction_is_left_out(value: str) -> None:
    text = (METRICS / SGLANG).read_text()
    _, (m,), notes = parse_server(_replace_value(text, "sglang:token_usage", value))
    assert isinstance(m.kv_usage, Unavailable) and "sglang:token_usage" in m.kv_usage.reason
    assert m.kv_capacity_tokens == sample("sglang:max_total_num_tokens", text)
    assert any("sglang:token_usage" in n for n in notes)


@needs_fixtures
@pytest.mark.parametrize("blocks", ["-7281", pytest.param("9" * 5000, id="5000-nines"), "+7281", "7_281", "\u0663", "0", "1e3"])
def test_a_pool_of_no_whole_positive_blocks_is_unavailable(blocks: str) -> None:
    text = (METRICS / V0).read_text()
    real = label("vllm:cache_config_info", "num_gpu_blocks", text)
    _, (m,), _ = parse_server(text.replace(f'num_gpu_blocks="{real}"', f'num_gpu_blocks="{blocks}"'))
    assert isinstance(m.kv_capacity_tokens, Unavailable) and "num_gpu_blocks" in m.kv_capacity_tokens.reason
    assert len(m.kv_capacity_tokens.reason) < 200


def test_labels_with_escapes_and_controls_are_kept_raw_and_notes_stay_one_line() -> None:
    name = 'a\\"b\\\\c\\nd\x1b[31m\u202e'  # as written in the exposition: \" \\ \n escapes, then raw controls
    text = (f'sglang:token_usage{{model_name="{name}"}} 0.5\nsglang:max_total_num_tokens{{model_name="{name}"}} 100\n'
            f'sglang:num_used_tokens{{model_name="{name}"}} 10\n')
    _, (m,), notes = parse_server(text)
    assert m.model_name == 'a"b\\c\nd\x1b[31m\u202e'  # the Snapshot keeps what the server said, exactly
    assert notes and all(_one_line(n) for n in notes), notes  # the disagreement note names it, escaped


def test_an_answer_cut_short_of_its_content_length_is_refused() -> None:
    import socket

    body = b'sglang:token_usage{model_name="m"} 0.5\nsglang:max_total_num_tokens{model_name="m"} 4308'
    with socket.socket() as lsock:
        lsock.bind(("127.0.0.1", 0))
        lsock.listen()

        def answer() -> None:
            conn, _ = lsock.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (len(body) + 3) + body)

        t = threading.Thread(target=answer, daemon=True)
        t.start()
        s = read_server(f"http://127.0.0.1:{lsock.getsockname()[1]}/metrics", 2.0)
        t.join(5)
    assert s.state == "garbage" and f"after {len(body):,} of the {len(body) + 3:,} bytes" in (s.error or "")


def test_a_body_that_is_not_utf8_is_read(server: str) -> None:
    Handler.bodies["/latin1"] = ('sglang:token_usage{model_name="caf\xe9"} 0.5\n').encode("latin-1") + b"\xff\xfe\n"
    s = read_server(f"{server}/latin1", 2.0)
    assert s.state == "ok" and s.models[0].model_name == "caf\ufffd" and s.kv_usage == 0.5


# -- fuzz: real payloads mutated, and generated ones ------------------------------------------------------------------

_HOSTILE_VALUES = ["NaN", "+Inf", "-Inf", "-1", "1e400", "-1e400", "2.5", "1e300", "0x10", "", "9" * 400, "1_000"]


def _check_reading(body: bytes) -> None:
    """What every reading of any payload must be: a ServerStats or a ScrapeError state, each reason one line,
    and JSON that round-trips with no NaN or Infinity."""
    try:
        engine, models, notes = parse_server(body.decode("utf-8", errors="replace"))
    except ScrapeError as e:
        assert e.state in ("garbage", "not_inference") and _one_line(str(e)) and len(str(e)) < 400, str(e)
        return
    assert all(_one_line(n) and len(n) < 400 for n in notes), notes
    for m in models:
        for v in (m.running_requests, m.waiting_requests, m.preemptions_total, m.kv_capacity_tokens,
                  m.kv_used_tokens):
            assert isinstance(v, Unavailable) or (isinstance(v, int) and v >= 0), v
        assert isinstance(m.kv_usage, Unavailable) or 0 <= m.kv_usage <= 1
    s = ServerStats(url="u", state="ok", engine=engine, models=tuple(models), notes=tuple(notes))
    snap = Snapshot(ts=0.0, host="h", servers=(s,))
    assert Snapshot.from_json(snap.to_json()) == snap
    strict_json(snap.to_json())


def _mutate(data: bytes, how: str, at: float, extra: bytes) -> bytes:
    i = int(at * len(data))
    if how == "truncate":
        return data[:i]
    if how == "flip":
        return data[:i] + bytes([data[i] ^ (1 << int(at * 97) % 8)]) + data[i + 1:] if i < len(data) else data
    if how == "insert":
        return data[:i] + extra + data[i:]
    if how == "value":  # a sample's value swapped for a hostile one
        lines = data.split(b"\n")
        samples_at = [j for j, ln in enumerate(lines) if ln and not ln.startswith(b"#")]
        j = samples_at[i * len(samples_at) // (len(data) + 1)]
        lines[j] = lines[j].rsplit(b" ", 1)[0] + b" " + extra
        return b"\n".join(lines)
    if how == "deep":  # a label value or line far longer than any real one
        return data[:i] + b'x{a="' + extra * 2000 + b'"} 1\n' + data[i:]
    raise AssertionError(how)


@needs_fixtures
def test_fuzz_mutated_real_payloads_never_raise() -> None:
    payloads = [(METRICS / f).read_bytes() for f in (V0, V1, SGLANG)]
    tried: list[int] = []

    @settings(max_examples=300, deadline=None, derandomize=True, database=None)
    @given(st.sampled_from(range(len(payloads))), st.sampled_from(["truncate", "flip", "insert", "value", "deep"]),
           st.floats(0, 1, exclude_max=True), st.one_of(st.sampled_from(_HOSTILE_VALUES).map(str.encode),
                                                       st.binary(max_size=40)))
    def one(which: int, how: str, at: float, extra: bytes) -> None:
        tried.append(1)
        _check_reading(_mutate(payloads[which], how, at, extra))

    one()
    print(f"servers: {len(tried)} mutated real payloads read")
    assert len(tried) >= 200


def test_fuzz_generated_payloads_never_raise() -> None:
    tried: list[int] = []
    names = st.sampled_from(["vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_preemptions_total",
                             "vllm:prefix_cache_hits_total", "vllm:cache_config_info", "sglang:token_usage",
                             "sglang:max_total_num_tokens", "sglang:num_used_tokens", "sglang:cache_hit_rate"])
    labels = st.dictionaries(st.sampled_from(["model_name", "engine", "tp_rank", "num_gpu_blocks", "block_size",
                                              "dp_rank", "enable_prefix_caching"]),
                             st.text(max_size=12), max_size=4)
    values = st.one_of(st.sampled_from(_HOSTILE_VALUES), st.floats().map(repr), st.integers().map(str))

    def line(name: str, lbl: dict[str, str], value: str) -> str:
        inner = ",".join(f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
                         for k, v in lbl.items())
        return f"{name}{{{inner}}} {value}"

    @settings(max_examples=300, deadline=None, derandomize=True, database=None)
    @given(st.lists(st.one_of(st.builds(line, names, labels, values), st.text(max_size=30)), max_size=10))
    def one(lines: list[str]) -> None:
        tried.append(1)
        _check_reading("\n".join(lines).encode("utf-8", "surrogatepass"))

    one()
    print(f"servers: {len(tried)} generated payloads read")
    assert len(tried) >= 200


# -- config and the command ------------------------------------------------------------------------------------

def test_config_servers_are_normalized_and_bad_ones_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('servers = ["localhost:8000", "http://gpu1:30000/", "localhost:8000"]\n')
    assert load_config(cfg).servers == ("http://localhost:8000/metrics", "http://gpu1:30000/metrics")
    cfg.write_text('servers = ["ftp://x"]\n')
    with pytest.raises(DltopError, match="not an http"):
        load_config(cfg)
    cfg.write_text('servers = "localhost:8000"\n')
    with pytest.raises(DltopError, match="servers must be a list"):
        load_config(cfg)


def _dltop(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dltop", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=30, env={**os.environ, "XDG_CONFIG_HOME": "/nonexistent"})


@needs_fixtures
def test_snapshot_json_has_the_servers_with_the_required_names(server: str) -> None:
    r = _dltop("snapshot", "--json", "--server", f"{server}/{V0}", "--server", f"{server}/500")
    assert r.returncode == 0, r.stderr
    data = strict_json(r.stdout)
    ok, bad = data["servers"]
    for s in data["servers"]:
        assert {"url", "engine", "kv_usage", "kv_capacity_tokens", "kv_capacity_bytes",
                "prefix_cache_hit_rate"} <= set(s)
    text = (METRICS / V0).read_text()
    assert ok["engine"] == "vllm" and ok["kv_capacity_tokens"] == int(label("vllm:cache_config_info", "num_gpu_blocks", text)) * int(label("vllm:cache_config_info", "block_size", text))
    assert bad["state"] == "http_error" and bad["kv_usage"] == {"unavailable": "HTTP 500 Internal Server Error"}
    # Options shared by every command may come first, as in git.
    r2 = _dltop("--server", f"{server}/{V0}", "snapshot")
    assert r2.returncode == 0 and json.loads(r2.stdout)["servers"][0]["engine"] == "vllm"


def test_a_bad_server_url_is_one_line_on_stderr() -> None:
    r = _dltop("snapshot", "--server", "ftp://x")
    assert r.returncode != 0 and r.stdout == ""
    assert r.stderr.strip() == "dltop: --server: not an http(s) URL: 'ftp://x'"


HF_CONFIGS = SHARED_FIXTURES / "hf-configs"
LLAMA2 = HF_CONFIGS / "Llama-2-7b-hf.config.json"


def _hub(tmp: Path, repo: str, config: Path, snapshot: str = "0123abc") -> Path:
    """A Hugging Face hub cache holding one model's config.json, laid out as huggingface_hub leaves it."""
    d = tmp / "hub" / ("models--" + repo.replace("/", "--"))
    (d / "snapshots" / snapshot).mkdir(parents=True)
    (d / "snapshots" / snapshot / "config.json").write_bytes(config.read_bytes())
    (d / "refs").mkdir()
    (d / "refs" / "main").write_text(snapshot)
    return tmp / "hub"


@needs_fixtures
@pytest.mark.skipif(not LLAMA2.is_file(), reason=f"HF config fixture {LLAMA2} not found")
def test_the_kv_pool_in_bytes_comes_from_the_model_s_config_in_the_hub_cache(server: str, tmp_path: Path) -> None:
    # the real V0 payload, its model renamed to one whose real config.json the fixtures have
    Handler.bodies["/llama"] = (METRICS / V0).read_text().replace("facebook/opt-125m", "meta-llama/Llama-2-7b-hf").encode()
    cache = _hub(tmp_path, "meta-llama/Llama-2-7b-hf", LLAMA2)
    s = read_server(f"{server}/llama", 2.0, cache=str(cache))
    assert s.state == "ok", s.error
    # bytes per token as `dltop kv` computes them from the same config
    r = subprocess.run([sys.executable, "-m", "dltop", "kv", "--config", str(LLAMA2), "--seq", "1", "--json"],
                       capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 0, r.stderr
    per_token = json.loads(r.stdout)["bytes_per_token"]
    assert isinstance(s.kv_capacity_tokens, int) and s.kv_capacity_bytes == s.kv_capacity_tokens * per_token
    assert any(str(cache) in n and f"{per_token:,} bytes per token" in n for n in s.notes)
    # an fp8 cache (vLLM's cache_dtype label) halves it
    Handler.bodies["/fp8"] = Handler.bodies["/llama"].replace(b'cache_dtype="auto"', b'cache_dtype="fp8"')
    fp8 = read_server(f"{server}/fp8", 2.0, cache=str(cache))
    assert fp8.kv_capacity_bytes == s.kv_capacity_tokens * per_token // 2
    # a config key that looks like it shapes attention and that dltop does not read is named beside the pool
    (tmp_path / "odd.json").write_text(json.dumps({**json.loads(LLAMA2.read_text()), "index_head_dim": 128}))
    odd = read_server(f"{server}/llama", 2.0, cache=str(_hub(tmp_path / "odd", "meta-llama/Llama-2-7b-hf",
                                                              tmp_path / "odd.json")))
    assert odd.kv_capacity_bytes == s.kv_capacity_bytes
    assert any(n.startswith("meta-llama/Llama-2-7b-hf: not understood: index_head_dim: ") for n in odd.notes)
    assert not any("not understood" in n for n in s.notes)
    # a model whose config is not here: unavailable, naming where dltop looked
    nowhere = read_server(f"{server}/{V0}", 2.0, cache=str(cache))
    assert isinstance(nowhere.kv_capacity_bytes, Unavailable)
    assert "facebook--opt-125m" in nowhere.kv_capacity_bytes.reason and "config.json" in nowhere.kv_capacity_bytes.reason
    # exported (and dumped) as dltop_inference_kv_cache_capacity_bytes: the pool of the first, nothing for the other
    from dltop.fields import KV_CAPACITY_BYTES, samples

    got = [(lbl, v) for f, lbl, v in samples(Snapshot(ts=1.0, host="h", servers=(s, nowhere))) if f is KV_CAPACITY_BYTES]
    assert got == [({"server": s.url, "engine": "vllm"}, float(s.kv_capacity_bytes))]


def test_a_tls_connection_is_made_with_the_handlers_own_context() -> None:
    """The Prometheus client's CA file and insecure_skip_verify live in the TLS handler's context: the connection
    the handler opens is given that context, not http.client's default one."""
    import ssl
    import urllib.request

    ctx = ssl.create_default_context()
    _, _, tls = servers.watched_handlers()
    handler = tls(servers.Watchdog(5.0), ctx)
    given: dict[str, object] = {}

    def connect(host: str, **kwargs: object) -> object:
        given.update(kwargs)
        raise ConnectionRefusedError  # no network: what reached the connection is all this test needs

    handler.connect = connect
    req = urllib.request.Request("https://127.0.0.1:9/metrics")
    req.timeout = 5.0  # type: ignore[attr-defined]  # what the opener sets before a handler opens
    with pytest.raises(ConnectionRefusedError):
        handler.https_open(req)
    assert given.get("context") is ctx
