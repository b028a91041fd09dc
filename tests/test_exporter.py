"""`dltop export` over real HTTP: the real command as a subprocess (a fresh interpreter, no Textual), scrapes that
never sample, promtool on a real scrape, the fake-NVML GPUs, an unavailable part, TLS and basic auth from an
exporter-toolkit web config, and bad command lines as one line on stderr."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dltop.config import Settings
from dltop.exporter.collector import SnapshotCollector
from dltop.exporter.server import ExporterServer
from dltop.exporter.webconfig import AUTH_CACHE_SIZE, WebConfig, load_web_config
from dltop.sampler import Sampler
from dltop.sources.registry import build_sources

from .conftest import DATA, REPO

SCENARIOS = DATA / "gpu-scenarios"
DLTOP = [sys.executable, "-m", "dltop"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, headers: dict[str, str] | None = None, context: ssl.SSLContext | None = None,
        ) -> tuple[int, str, str]:
    """(status, content type, body) of a GET; an HTTP error status is an answer, not an exception."""
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as r:
            return r.status, r.headers["Content-Type"], r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read().decode()


class Exporter:
    """`dltop export` running as a subprocess until the test is done with it."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, python: list[str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [*(python or DLTOP), "export", "--listen", f"127.0.0.1:{self.port}", "--interval", "1", *args]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})},
                                     cwd=REPO)
        assert self.proc.stderr is not None
        self.before: list[str] = []  # what it wrote before the one line it prints once it listens
        while "dltop export: serving" not in (line := self.proc.stderr.readline()):
            self.before.append(line)
            assert line, "".join(self.before)  # it ended without listening

    def metrics(self) -> str:
        deadline = time.monotonic() + 20
        while True:  # the first Snapshot may still be on its way
            status, _, body = get(self.url + "/metrics")
            if status == 200 and "dltop_memory_cached_bytes" in body or time.monotonic() > deadline:
                return body
            time.sleep(0.2)

    def stop(self) -> tuple[int, str]:
        self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=20)
        return self.proc.returncode, err


@pytest.fixture
def exporter(request: pytest.FixtureRequest) -> Iterator[Exporter]:
    args, env = getattr(request, "param", ((), {}))
    e = Exporter(*args, env=env)
    yield e
    if e.proc.poll() is None:
        e.stop()


def series(text: str, name: str) -> dict[str, float]:
    """{label text: value} of every sample of `name` in an exposition (a line scan, not the client's parser)."""
    out = {}
    for line in text.splitlines():
        m = re.fullmatch(rf"{name}(\{{.*\}})? (\S+)", line)
        if m:
            out[m.group(1) or ""] = float(m.group(2))
    return out


# -- the command ----------------------------------------------------------------------------------------------------

def test_paths_and_a_clean_stop(exporter: Exporter) -> None:
    body = exporter.metrics()
    assert "# TYPE dltop_memory_cached_bytes gauge" in body and "# HELP dltop_memory_cached_bytes " in body
    status, ctype, page = get(exporter.url + "/")
    assert status == 200 and ctype.startswith("text/html") and 'href="/metrics"' in page
    assert get(exporter.url + "/metrics?x=1")[0] == 200
    for path in ("/nope", "/metrics/", "/favicon.ico"):
        assert get(exporter.url + path)[0] == 404
    code, err = exporter.stop()
    assert code == 0 and "Traceback" not in err


@pytest.mark.parametrize("exporter", [((), {"DLTOP_FAKE_NVML": str(SCENARIOS / "h100-2proc.json")})],
                         indirect=True)
def test_promtool_check_metrics_on_a_real_scrape(exporter: Exporter) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI"):
            pytest.fail("promtool missing in CI (scripts/install-test-deps installs the prometheus package)")
        pytest.skip("promtool not installed (Debian package prometheus; make test installs it)")
    body = exporter.metrics()
    assert series(body, "dltop_gpu_memory_total_bytes")  # the fake NVML's GPU is in it
    r = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout + r.stderr == "", r.stdout + r.stderr
    # OpenMetrics, as Prometheus asks for first, from the same Snapshot
    status, ctype, om = get(exporter.url + "/metrics", {"Accept": "application/openmetrics-text; version=1.0.0"})
    assert status == 200 and ctype.startswith("application/openmetrics-text") and om.endswith("# EOF\n")
    assert "# TYPE dltop_gpu info" in om


@pytest.mark.parametrize("exporter", [((), {"DLTOP_FAKE_NVML": str(SCENARIOS / "8gpu-20proc.json")})],
                         indirect=True)
def test_fake_nvml_gpus_are_exported(exporter: Exporter) -> None:
    import json

    scenario = json.loads((SCENARIOS / "8gpu-20proc.json").read_text())
    body = exporter.metrics()
    totals = series(body, "dltop_gpu_memory_total_bytes")
    want = {g["uuid"]: g["memory"]["total"] for g in scenario["gpus"]}
    assert {re.search(r'uuid="([^"]+)"', k).group(1): v for k, v in totals.items()} == want  # type: ignore[union-attr]
    procs = series(body, "dltop_gpu_process_memory_bytes")
    assert len(procs) == sum(len(g["compute_processes"]) + len(g["graphics_processes"]) for g in scenario["gpus"])


@pytest.mark.parametrize("exporter", [((), {"DLTOP_FAKE_NVML": str(SCENARIOS / "no-permission.json")})],
                         indirect=True)
def test_an_unavailable_part_is_absent_with_source_up_0(exporter: Exporter) -> None:
    # NVML refusing this user on a machine with GPUs: a failure, so the source is down and there is no count.
    body = exporter.metrics()
    assert not [ln for ln in body.splitlines() if ln.startswith("dltop_gpu")]
    assert series(body, "dltop_source_up")['{source="gpus"}'] == 0.0
    assert series(body, "dltop_source_up")['{source="memory"}'] == 1.0
    [labels] = [k for k in series(body, "dltop_source_unavailable_info") if 'source="gpus"' in k]
    assert 'reason="unavailable"' in labels and "NVML_ERROR_NO_PERMISSION" in labels  # the scenario's reason


@pytest.mark.parametrize("exporter", [((), {"DLTOP_FAKE_NVML": str(SCENARIOS / "library-not-found.json")})],
                         indirect=True)
def test_a_node_without_nvidia_has_0_gpus_and_every_source_up(exporter: Exporter) -> None:
    body = exporter.metrics()
    assert series(body, "dltop_gpus") == {"": 0.0}
    assert series(body, "dltop_gpus_absent_info") == {'{reason="no_library"}': 1.0}
    assert series(body, "dltop_source_up")['{source="gpus"}'] == 1.0
    # nothing for DltopSourceDown to fire on (slower sources may still be on their first reading)
    assert not [k for k in series(body, "dltop_source_unavailable_info") if 'source="gpus"' in k]
    assert not [ln for ln in body.splitlines() if ln.startswith("dltop_gpu_")]


@pytest.mark.parametrize("exporter", [((), {"DLTOP_FAKE_NVML": str(SCENARIOS / "gpu-lost.json")})],
                         indirect=True)
def test_a_lost_gpu_is_exported_as_down(exporter: Exporter) -> None:
    body = exporter.metrics()
    up = series(body, "dltop_gpu_up")
    assert sorted(up.values()) == [0.0, 1.0] and series(body, "dltop_gpus") == {"": 2.0}
    [down] = series(body, "dltop_gpu_down_info")
    assert 'gpu="1"' in down and 'reason="lost"' in down
    assert series(body, "dltop_source_up")['{source="gpus"}'] == 1.0  # the other GPU reads: the source is up


def test_headless_in_a_fresh_interpreter() -> None:
    # -X importtime lists every module the real command imports, on stderr, after its one line.
    e = Exporter(python=[sys.executable, "-X", "importtime", "-m", "dltop"])
    e.metrics()
    _, err = e.stop()
    lines = [*e.before, *err.splitlines()]
    imported = {ln.split("|")[-1].strip().split(".")[0] for ln in lines if ln.startswith("import time:")}
    assert "prometheus_client" in imported and "dltop" in imported
    assert not imported & {"textual", "rich"}


@pytest.mark.parametrize("args, words", [
    (["--listen", "nonsense"], "expected ADDRESS:PORT"),
    (["--listen", ":9100"], "0.0.0.0:9100 for every interface"),
    (["--listen", "127.0.0.1:99999"], "expected ADDRESS:PORT"),
    (["--interval", "0"], "must be between"),
    (["--web-config", "/nonexistent/web.yml"], "cannot read it"),
])
def test_bad_command_lines_are_one_line(args: list[str], words: str) -> None:
    r = subprocess.run([*DLTOP, "export", *args], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 if "--web-config" not in args else r.returncode == 1
    assert words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_port_in_use_is_one_line() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = subprocess.run([*DLTOP, "export", "--listen", f"127.0.0.1:{port}"], capture_output=True, text=True,
                           timeout=30)
    assert r.returncode == 1 and r.stderr.startswith(f"dltop: cannot listen on 127.0.0.1:{port}")
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_dataset_missing_at_start_is_served_as_down_until_it_appears(tmp_path: Path) -> None:
    late = tmp_path / "late"  # an NFS mount not there yet when the unit starts
    e = Exporter("--dataset", str(late))
    try:
        assert any("no such path (yet)" in line for line in e.before), e.before
        deadline = time.monotonic() + 30
        while not series(body := e.metrics(), "dltop_dataset_up") and time.monotonic() < deadline:
            time.sleep(0.2)
        label = f'{{dataset="{late}"}}'
        assert series(body, "dltop_dataset_up") == {label: 0.0}
        [why] = series(body, "dltop_dataset_unavailable_info")
        assert str(late) in why and "reason=" in why
        late.mkdir()
        (late / "f").write_bytes(os.urandom(1 << 16))
        while series(body, "dltop_dataset_up").get(label) != 1.0 and time.monotonic() < deadline + 30:
            time.sleep(0.5)  # the datasets source rescans every 10 s at --interval 1
            body = e.metrics()
        assert series(body, "dltop_dataset_up") == {label: 1.0}
        assert series(body, "dltop_dataset_size_bytes") == {label: float(1 << 16)}
    finally:
        code, err = e.stop()
    assert code == 0 and "Traceback" not in err


# -- a scrape reads, never samples ------------------------------------------------------------------------------------

def test_scrapes_never_read_a_source(tmp_path: Path) -> None:
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "f").write_bytes(os.urandom(1 << 20))
    settings = Settings(refresh_s=3600.0, datasets=(str(tmp_path / "ds"),))  # one read each, then none for an hour
    reads: dict[str, int] = {}

    def counted(src):  # type: ignore[no-untyped-def]
        def read():  # type: ignore[no-untyped-def]
            reads[src.name] = reads.get(src.name, 0) + 1
            return src.read()
        return dataclasses.replace(src, read=read)

    sampler = Sampler([counted(s) for s in build_sources(settings)])
    collector = SnapshotCollector()
    loop = asyncio.new_event_loop()
    fed = threading.Event()

    async def feed() -> None:
        sampler.start()
        await sampler.wait_first(5.0)
        while set(reads) != set(sampler.names()):
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # every first read has finished
        collector.update(sampler.snapshot())
        fed.set()
        await asyncio.sleep(3600)

    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    fut = asyncio.run_coroutine_threadsafe(feed(), loop)
    server = ExporterServer("127.0.0.1:0", collector)
    server.start()
    try:
        assert fed.wait(30)
        before = dict(reads)
        bodies: list[str] = []

        def scrape(n: int) -> None:
            bodies.extend(get(server.url)[2] for _ in range(n))

        scrapers = [threading.Thread(target=scrape, args=(50,)) for _ in range(2)]  # two Prometheus servers
        for s in scrapers:
            s.start()
        for s in scrapers:
            s.join()
        assert reads == before and all(v == 1 for v in reads.values()), reads
        assert len(bodies) == 100 and len(set(bodies)) == 1 and "dltop_dataset_resident_bytes" in bodies[0]
        assert collector.builds == 1  # a hundred scrapes of one Snapshot: its metrics were built once
    finally:
        server.close()
        fut.cancel()
        loop.call_soon_threadsafe(loop.stop)
        t.join(10)
        sampler.close()


def test_the_listen_backlog_is_the_kernels_somaxconn_as_node_exporters(tmp_path: Path) -> None:
    from dltop.exporter.server import SOMAXCONN, listen_backlog

    if shutil.which("ss") is None:
        pytest.skip("ss (iproute2) not installed: it reads a listening socket's backlog back from the kernel")
    somaxconn = int(Path(SOMAXCONN).read_text())
    server = ExporterServer("127.0.0.1:0", SnapshotCollector())
    try:
        out = subprocess.run(["ss", "-Hltn", f"sport = :{server.port}"], capture_output=True, text=True).stdout
        [line] = out.splitlines()
        assert int(line.split()[2]) == min(somaxconn, 65535)  # a listening socket's Send-Q is its backlog
    finally:
        server.close()
    (tmp_path / "somaxconn").write_text("garbage\n")
    assert listen_backlog(str(tmp_path / "somaxconn")) == 4096  # Go's fallback
    assert listen_backlog(str(tmp_path / "missing")) == 4096


def test_every_scrape_of_a_snapshot_is_served_the_same_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    import gzip

    import dltop.exporter.server as server_mod
    from dltop.model import Snapshot
    from dltop.sources.memory import read_memory

    packed: list[int] = []
    real = gzip.compress

    def compress(data: bytes, **kw: object) -> bytes:
        packed.append(len(data))
        return real(data, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(server_mod.gzip, "compress", compress)
    collector = SnapshotCollector()
    snap = Snapshot(ts=time.time(), host="t", memory=read_memory())
    collector.update(snap)
    server = ExporterServer("127.0.0.1:0", collector)
    server.start()
    try:
        def scrape() -> bytes:
            req = urllib.request.Request(server.url, headers={"Accept-Encoding": "gzip"})
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.read()  # type: ignore[no-any-return]

        bodies = {scrape() for _ in range(20)}
        assert len(bodies) == 1 and len(packed) == 1 and collector.builds == 1
        collector.update(dataclasses.replace(snap, ts=snap.ts + 1))
        scrape()  # a new Snapshot: rendered and packed again, once
        assert len(packed) == 2 and collector.builds == 2
        assert b"dltop_build_info" in gzip.decompress(scrape())
    finally:
        server.close()


def test_before_the_first_snapshot_a_scrape_is_empty_not_an_error() -> None:
    collector = SnapshotCollector()
    server = ExporterServer("127.0.0.1:0", collector)
    server.start()
    try:
        status, _, body = get(server.url)
        assert status == 200
        assert [ln for ln in body.splitlines() if not ln.startswith("#")] == [build_info()]
    finally:
        server.close()


def build_info() -> str:
    import platform

    from dltop import __version__
    return f'dltop_build_info{{version="{__version__}",python="{platform.python_version()}"}} 1.0'


def test_health_and_readiness_say_whether_snapshots_come(tmp_path: Path) -> None:
    from dltop.model import Snapshot

    collector = SnapshotCollector()
    fresh = ExporterServer("127.0.0.1:0", collector, stale_after_s=3600.0)
    stale = ExporterServer("127.0.0.1:0", collector, stale_after_s=0.0)  # any age is too old
    for s in (fresh, stale):
        s.start()
    try:
        base, old = fresh.url.removesuffix("metrics"), stale.url.removesuffix("metrics")
        assert get(base + "-/ready")[0::2] == (503, "not ready: no Snapshot yet\n")
        assert get(base + "-/healthy")[0] == 200  # just started: the first Snapshot is on its way
        assert get(old + "-/healthy")[0] == 503
        collector.update(Snapshot(ts=time.time(), host="h"))
        assert get(base + "-/ready")[0::2] == (200, "ready\n")
        assert get(base + "-/healthy")[0::2] == (200, "healthy\n")
        status, _, why = get(old + "-/healthy")
        assert status == 503 and why.startswith("unhealthy: no Snapshot for ")
        assert get(base + "-/nope")[0] == 404
    finally:
        for s in (fresh, stale):
            s.close()


def test_a_scrape_is_gzipped_when_asked_and_says_the_build(exporter: Exporter) -> None:
    import gzip

    plain = exporter.metrics()
    assert build_info() in plain.splitlines()
    req = urllib.request.Request(exporter.url + "/metrics", headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(req, timeout=10) as r:
        packed = r.read()
        assert r.headers["Content-Encoding"] == "gzip" and r.headers["Vary"] == "Accept-Encoding"
        assert int(r.headers["Content-Length"]) == len(packed)
    body = gzip.decompress(packed).decode()
    assert "dltop_memory_cached_bytes" in body and build_info() in body.splitlines()
    assert len(packed) < len(body) / 3
    for refused in ("gzip;q=0", "identity", "br"):
        req = urllib.request.Request(exporter.url + "/metrics", headers={"Accept-Encoding": refused})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.headers["Content-Encoding"] is None and b"dltop_memory_cached_bytes" in r.read()


# -- TLS and basic auth --------------------------------------------------------------------------------------------

def make_cert(directory: Path) -> Path:
    """A self-signed certificate for 127.0.0.1 (cert.pem, key.pem in `directory`), made by openssl."""
    if shutil.which("openssl") is None:
        if os.environ.get("CI"):
            pytest.fail("openssl missing in CI (scripts/install-test-deps installs it)")
        pytest.skip("openssl not installed")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(directory / "key.pem"),
                    "-out", str(directory / "cert.pem")], check=True, capture_output=True)
    return directory / "cert.pem"


@pytest.fixture
def cert(tmp_path: Path) -> Path:
    return make_cert(tmp_path)


def test_tls_and_basic_auth_from_a_web_config(tmp_path: Path, cert: Path) -> None:
    import bcrypt

    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n"
                   f"basic_auth_users:\n  prom: {hashed}\n")
    e = Exporter("--web-config", str(web))
    try:
        ctx = ssl.create_default_context(cafile=str(cert))
        url = f"https://127.0.0.1:{e.port}/metrics"

        def auth(user: str, password: str) -> dict[str, str]:
            return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}

        assert get(url, context=ctx)[0] == 401
        assert get(url, auth("prom", "wrong"), ctx)[0] == 401
        assert get(url, auth("other", "s3cret"), ctx)[0] == 401
        deadline = time.monotonic() + 20
        while "dltop_memory_cached_bytes" not in (ok := get(url, auth("prom", "s3cret"), ctx))[2]:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert ok[0] == 200
        # plain HTTP to the TLS port gets no metrics but Go's net/http's answer, as node_exporter gives it...
        with socket.create_connection(("127.0.0.1", e.port), timeout=10) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            answer = b"".join(iter(lambda: s.recv(4096), b""))
        assert answer == b"HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n"
        assert get(url, auth("prom", "s3cret"), ctx)[0] == 200  # ...and does not take the server down
        # the probes' endpoints are answered without a password (they tell up or not, nothing else)
        assert get(f"https://127.0.0.1:{e.port}/-/ready", context=ctx)[0::2] == (200, "ready\n")
        assert get(f"https://127.0.0.1:{e.port}/-/healthy", context=ctx)[0] == 200
    finally:
        code, err = e.stop()
    assert code == 0 and "Traceback" not in err


def test_the_web_config_is_read_again_when_it_or_its_certificate_changes(tmp_path: Path) -> None:
    import bcrypt

    def users(password: bytes) -> str:
        return f"basic_auth_users:\n  prom: {bcrypt.hashpw(password, bcrypt.gensalt(rounds=4)).decode()}\n"

    first = tmp_path / "first"
    first.mkdir()
    make_cert(first)
    tls = "tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n"
    for name in ("cert.pem", "key.pem"):
        (tmp_path / name).write_bytes((first / name).read_bytes())
    web = tmp_path / "web.yml"
    web.write_text(tls + users(b"old"))
    e = Exporter("--web-config", str(web))
    url = f"https://127.0.0.1:{e.port}/metrics"
    ctx = ssl.create_default_context(cafile=str(first / "cert.pem"))
    try:
        assert get(url, {"Authorization": basic("prom", "old")}, ctx)[0] == 200
        web.write_text(tls + users(b"new"))  # a password changed

        def until(check) -> None:  # type: ignore[no-untyped-def]
            deadline = time.monotonic() + 30
            while not check():
                assert time.monotonic() < deadline
                time.sleep(0.2)

        until(lambda: get(url, {"Authorization": basic("prom", "new")}, ctx)[0] == 200)
        assert get(url, {"Authorization": basic("prom", "old")}, ctx)[0] == 401
        # a certificate rotated on disk (a new key too): the next connection is served with it
        second = tmp_path / "second"
        second.mkdir()
        make_cert(second)
        for name in ("key.pem", "cert.pem"):
            (tmp_path / f"{name}.tmp").write_bytes((second / name).read_bytes())
            os.replace(tmp_path / f"{name}.tmp", tmp_path / name)
        new_ctx = ssl.create_default_context(cafile=str(second / "cert.pem"))

        def served_new() -> bool:
            try:
                return get(url, {"Authorization": basic("prom", "new")}, new_ctx)[0] == 200
            except urllib.error.URLError:
                return False  # the old certificate, still
        until(served_new)
        with pytest.raises(urllib.error.URLError):
            get(url, {"Authorization": basic("prom", "new")}, ctx)
        # a bad new file keeps the config in use, said in one line
        web.write_text(tls + "basic_auth_users: [not, a, mapping]\n")
        time.sleep(1.2)  # past the once-a-second look at the file
        assert get(url, {"Authorization": basic("prom", "new")}, new_ctx)[0] == 200
        assert get(url, {"Authorization": basic("prom", "x")}, new_ctx)[0] == 401
    finally:
        code, err = e.stop()
    assert code == 0 and "Traceback" not in err
    kept = [ln for ln in err.splitlines() if "serving with the config read before" in ln]
    assert len(kept) == 1 and "basic_auth_users: expected a mapping" in kept[0], err
    assert len([ln for ln in err.splitlines() if "read again (it changed)" in ln]) == 2, err


@pytest.mark.parametrize("text, words", [
    ("basic_auth_users:\n  prom: plaintext\n", "'prom': not a bcrypt hash"),
    ("http_server_config:\n  http2: true\n", "'http_server_config' is not supported"),
    ("tls_server_config:\n  cert_file: c.pem\n", "needs cert_file and key_file"),
    ("tls_server_config:\n  cert_file: c.pem\n  key_file: k.pem\n  cipher_suites: [x]\n", "'cipher_suites' is not"),
    ("tls_server_config:\n  cert_file: nope.pem\n  key_file: nope.pem\n", "cannot load cert_file/key_file"),
    ("- a list\n", "expected a mapping"),
    ("a: [unclosed\n", "not YAML"),
])
def test_a_bad_web_config_says_what_is_wrong(tmp_path: Path, text: str, words: str) -> None:
    from dltop.errors import DltopError

    (tmp_path / "web.yml").write_text(text)
    with pytest.raises(DltopError, match=re.escape(words)):
        load_web_config(str(tmp_path / "web.yml"))
    r = subprocess.run([*DLTOP, "export", "--web-config", str(tmp_path / "web.yml")], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 1 and words in r.stderr and len(r.stderr.strip().splitlines()) == 1


# -- basic auth: what each check costs (bcrypt calls counted, never timed) --------------------------------------------

class Checkpw:
    """bcrypt.checkpw wrapped: every (password, hash) it was asked, and the most calls running at once."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, hold_s: float = 0.0) -> None:
        import bcrypt

        self.calls: list[tuple[bytes, bytes]] = []
        self.running = self.most_running = 0
        self._lock = threading.Lock()
        real = bcrypt.checkpw

        def checkpw(password: bytes, hashed: bytes) -> bool:
            with self._lock:
                self.calls.append((password, hashed))
                self.running += 1
                self.most_running = max(self.most_running, self.running)
            try:
                time.sleep(hold_s)  # room for another thread to come in, if nothing keeps it out
                return bool(real(password, hashed))
            finally:
                with self._lock:
                    self.running -= 1

        monkeypatch.setattr(bcrypt, "checkpw", checkpw)


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.fixture
def web(tmp_path: Path) -> WebConfig:
    """A web config with one user, `prom` / `s3cret`, hashed at cost 5 (not bcrypt's default 12)."""
    import bcrypt

    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=5)).decode()
    (tmp_path / "web.yml").write_text(f"basic_auth_users:\n  prom: {hashed}\n")
    return load_web_config(str(tmp_path / "web.yml"))


def test_an_unknown_user_costs_one_bcrypt_at_the_users_cost(web: WebConfig,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # A 401 for a user that does not exist must take as long as one for a wrong password: the same one bcrypt.
    counted = Checkpw(monkeypatch)
    assert not web.allows(basic("nobody", "s3cret"))
    assert len(counted.calls) == 1
    [(_, hashed)] = counted.calls
    assert hashed.startswith(b"$2") and hashed.split(b"$")[2] == b"05" and hashed != web.users["prom"]
    assert not web.allows(basic("prom", "wrong"))
    assert [h.split(b"$")[2] for _, h in counted.calls] == [b"05", b"05"]


def test_a_repeated_login_pays_bcrypt_once(web: WebConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    counted = Checkpw(monkeypatch)
    assert all(web.allows(basic("prom", "s3cret")) for _ in range(20))
    assert len(counted.calls) == 1


def test_repeated_bad_credentials_pay_bcrypt_once(web: WebConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    # A scraper left with an old password knocks every 15 s for weeks: it pays one bcrypt, not one a scrape.
    counted = Checkpw(monkeypatch)
    assert not any(web.allows(basic("prom", "old-password")) for _ in range(50))
    assert not any(web.allows(basic("nobody", "x")) for _ in range(50))
    assert len(counted.calls) == 2
    assert web.allows(basic("prom", "s3cret"))  # a remembered failure does not shut the right password out
    assert len(counted.calls) == 3


def test_remembered_checks_are_bounded_and_the_right_password_survives_a_flood(
        web: WebConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    counted = Checkpw(monkeypatch)
    assert web.allows(basic("prom", "s3cret"))
    assert not any(web.allows(basic("prom", f"guess-{i}")) for i in range(300))
    assert len(counted.calls) == 301 and len(web._seen) <= AUTH_CACHE_SIZE
    assert web.allows(basic("prom", "s3cret"))  # pushed out by the guesses, checked again: still in
    assert web.allows(basic("prom", "s3cret")) and len(counted.calls) == 302


def test_bcrypt_runs_one_at_a_time(web: WebConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    # Many scrapers with distinct wrong passwords at once: bcrypt still holds at most one core.
    counted = Checkpw(monkeypatch, hold_s=0.05)
    answers: list[bool] = []
    threads = [threading.Thread(target=lambda i=i: answers.append(web.allows(basic("prom", f"bad-{i}"))))
               for i in range(8)]
    threads += [threading.Thread(target=lambda: answers.append(web.allows(basic("prom", "same-bad"))))
                for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers == [False] * 12
    assert counted.most_running == 1
    assert len(counted.calls) == 9  # the four alike waited for the first of them and read its answer


@pytest.mark.parametrize("header, bcrypts", [
    (None, 0), ("", 0), ("Bearer x", 0), ("Basic !!!", 0), ("Basic " + base64.b64encode(b"no-colon").decode(), 0),
    ("Basic " + base64.b64encode(b"\xff\xfe:\xff").decode(), 1),  # an undecodable name is a user unknown
])
def test_a_malformed_authorization_is_refused(web: WebConfig, monkeypatch: pytest.MonkeyPatch,
                                              header: str | None, bcrypts: int) -> None:
    counted = Checkpw(monkeypatch)
    assert not web.allows(header)
    assert len(counted.calls) == bcrypts


# -- beside the TUI ---------------------------------------------------------------------------------------------------

@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed")
def test_the_tui_with_export_serves_what_it_shows(tmp_path: Path) -> None:
    from tests.test_terminal import _tmux

    port = free_port()
    sock = f"dltop-export-test-{os.getpid()}"
    status = tmp_path / "status"
    _tmux(sock, "new-session", "-d", "-c", str(REPO), "-x", "80", "-y", "24",
          f"sh -c '{sys.executable} -m dltop --export 127.0.0.1:{port}; echo $? > {status}; sleep 60'")
    try:
        deadline = time.monotonic() + 20
        while "Page cache" not in _tmux(sock, "capture-pane", "-p"):
            assert time.monotonic() < deadline, "no first frame"
            time.sleep(0.1)
        while "dltop_memory_cached_bytes" not in (body := get(f"http://127.0.0.1:{port}/metrics")[2]):
            assert time.monotonic() < deadline, body
            time.sleep(0.2)
        assert series(body, "dltop_source_up")['{source="memory"}'] == 1.0
        _tmux(sock, "send-keys", "q")
        while not status.exists() or not status.read_text().strip():
            assert time.monotonic() < deadline, "still running after q"
            time.sleep(0.1)
    finally:
        subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True)
    assert status.read_text().strip() == "0"
    with socket.socket() as s:  # nobody listens on the port any more (a listener would refuse this bind)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


# -- the encoding ------------------------------------------------------------------------------------------------

def rich_groups(tmp_path: Path, name: str = "ds") -> list:
    import json

    from dltop.exporter.collector import grouped
    from dltop.model import Snapshot
    from dltop.model.gpu import SPLIT_FIELDS, MemorySplit
    from dltop.residency.scan import scan_paths
    from dltop.sources.gpu import FakeBackend, GpuReader
    from dltop.sources.memory import read_memory

    gpus = GpuReader(lambda: FakeBackend(json.loads((SCENARIOS / "8gpu-20proc.json").read_text())), "/").read()
    assert isinstance(gpus, tuple)
    split = MemorySplit(**dict.fromkeys(SPLIT_FIELDS, 12345))
    gpus = tuple(dataclasses.replace(g, processes=tuple(dataclasses.replace(p, split=split, command=f'a "q" \\ {i}')
                                                        for i, p in enumerate(g.processes))) for g in gpus)
    ds = tmp_path / name
    ds.mkdir()
    (ds / "f").write_bytes(b"x" * 10000)
    raw = tmp_path / os.fsdecode(b"not-utf8-\xfe")  # a name that is not UTF-8: shown as \xfe, as JSON shows it
    raw.mkdir()
    part = scan_paths([str(ds), str(raw), str(tmp_path / "missing\nname")])
    return grouped(Snapshot(ts=time.time(), host="h", memory=read_memory(), gpus=gpus, datasets=part))


def parsed(text: str, openmetrics: bool) -> list:
    """(name, type, help, sorted samples) of each family, as prometheus_client's own parser reads the text."""
    if openmetrics:
        from prometheus_client.openmetrics.parser import text_string_to_metric_families
    else:
        from prometheus_client.parser import text_string_to_metric_families
    return [(f.name, f.type, f.documentation, sorted((s.name, tuple(sorted(s.labels.items())), s.value)
                                                      for s in f.samples))
            for f in text_string_to_metric_families(text)]


@pytest.mark.parametrize("openmetrics", [False, True], ids=["text", "openmetrics"])
def test_the_fast_encoding_is_prometheus_clients(tmp_path: Path, openmetrics: bool) -> None:
    # dltop encodes from the field table; prometheus_client's generate_latest over the same families must parse to
    # exactly the same families, names, types, help, labels (quotes, backslashes, newlines) and values.
    from prometheus_client import generate_latest
    from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
    from prometheus_client.registry import CollectorRegistry

    from dltop.exporter.collector import encode, families

    groups = rich_groups(tmp_path, 'odd "name" \\ here')
    registry = CollectorRegistry(auto_describe=False)

    class Fixed:
        def collect(self):  # type: ignore[no-untyped-def]
            return iter(families(groups))

    registry.register(Fixed())  # type: ignore[arg-type]
    theirs = (generate_openmetrics if openmetrics else generate_latest)(registry).decode()
    ours = encode(groups, openmetrics).decode()
    assert parsed(ours, openmetrics) == parsed(theirs, openmetrics)
    assert len(parsed(ours, openmetrics)) == len(groups) > 30
    assert 'dataset="' + str(tmp_path) + '/not-utf8-\\\\xfe"' in ours  # the backslash of \xfe, escaped


@given(st.text(min_size=1, max_size=40))
@settings(max_examples=150, deadline=None)
def test_any_label_value_survives_the_encoding(value: str) -> None:
    from dltop.exporter.collector import encode
    from dltop.fields import DATASET_FILES

    value = value.encode("utf-8", "surrogatepass").decode("utf-8", "replace")  # label values are UTF-8
    for om in (False, True):
        [fam] = parsed(encode([(DATASET_FILES, [({"dataset": value}, 3.0)])], om).decode(), om)
        assert fam[3] == [("dltop_dataset_files", (("dataset", value),), 3.0)]


GZIP_TRIED: list[str] = []


@settings(max_examples=300, derandomize=True, deadline=None)
@given(header=st.text(max_size=60) | st.lists(st.sampled_from(["gzip", "*", "br", "identity", ";q=0", ";q=0.5",
                                                                  ";q=x", ",", " ", "GZIP", ";", "q=1"]),
                                               max_size=8).map("".join))
def test_any_accept_encoding_is_read_without_an_exception(header: str) -> None:
    from dltop.exporter.server import accepts_gzip

    GZIP_TRIED.append(header)
    got = accepts_gzip(header)
    assert isinstance(got, bool)
    if "gzip" not in header.lower() and "*" not in header:
        assert got is False


def test_the_accept_encoding_fuzz_ran() -> None:
    if not GZIP_TRIED:
        pytest.skip("the fuzz above did not run in this session")
    print(f"accepts_gzip: {len(GZIP_TRIED)} headers tried")
    assert len(GZIP_TRIED) >= 300
