"""A real Prometheus (the Debian package's server) scrapes a real `dltop export` on loopback every second, with the
alert rules of deploy/prometheus loaded; its HTTP API must give back /proc/meminfo's Cached and fincore's count
of a dataset the test made, and every expression of the Grafana dashboard must evaluate."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import yaml

from tests.conftest import locked_dataset

from .conftest import DATA, REPO
from .test_exporter import Exporter, free_port, get

DEPLOY = REPO / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dltop.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
FILES, FILE_BYTES, WARM = 8, 1 << 20, 3  # the dataset: 8 files of 1 MiB, the first 3 read into the page cache


def binary(name: str, package: str = "prometheus") -> str:
    """The tool's path; missing, the test skips with the reason, except in CI, where it fails."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} missing in CI: scripts/install-test-deps installs the Debian package {package}")
        pytest.skip(f"{name} not installed (Debian package {package}; `make test` installs it)")
    return path


def cached_now() -> int:
    with open("/proc/meminfo") as f:
        line = next(ln for ln in f if ln.startswith("Cached:"))
    return int(line.split()[1]) * 1024


class Tap:
    """A TCP relay on loopback that keeps the head of what each side of every connection sent: what Prometheus
    asked for and what the exporter answered, bytes as they went on the wire."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.requests: list[bytes] = []
        self.answers: list[bytes] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target_port), timeout=30)
            up, down = bytearray(), bytearray()
            self.requests.append(up)  # type: ignore[arg-type]
            self.answers.append(down)  # type: ignore[arg-type]
            for a, b, keep in ((client, server, up), (server, client, down)):
                threading.Thread(target=self._pipe, args=(a, b, keep), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket, keep: bytearray) -> None:
        try:
            while data := src.recv(65536):
                if len(keep) < 4096:
                    keep += data[: 4096 - len(keep)]
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._listener.close()


@dataclass
class Stack:
    prom: str  # Prometheus' base URL
    exporter: Exporter
    dataset: Path
    meminfo: list[tuple[float, int]]  # (wall time, Cached bytes) every 20 ms while the stack runs
    tap: Tap  # between Prometheus' job dltop-tap and the plain exporter

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}
        status, _, body = get(f"{self.prom}/api/v1/query?{urllib.parse.urlencode(params)}")
        doc = json.loads(body)
        assert status == 200 and doc["status"] == "success", (expr, body)
        return doc["data"]["result"]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    prometheus = binary("prometheus")
    tmp = tmp_path_factory.mktemp("prometheus")
    locks = locked_dataset(tmp / "dataset", FILES, FILE_BYTES, WARM)
    samples: list[tuple[float, int]] = []
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.02):
            samples.append((time.time(), cached_now()))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    exporter = Exporter("--dataset", str(tmp / "dataset"),
                        env={"DLTOP_FAKE_NVML": str(DATA / "gpu-scenarios" / "h100-2proc.json")})
    # A second one behind TLS and basic auth, scraped as the commented part of scrape.yml says.
    subprocess.run([binary("openssl", "openssl"), "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout",
                    str(tmp / "key.pem"), "-out", str(tmp / "cert.pem")], check=True, capture_output=True)
    (tmp / "password").write_text("pr0m")
    (tmp / "web.yml").write_text("tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n"
                                 f"basic_auth_users:\n  prometheus: {bcrypt.hashpw(b'pr0m', bcrypt.gensalt(4)).decode()}\n")
    secured = Exporter("--web-config", str(tmp / "web.yml"))
    tap = Tap(exporter.port)
    # The example scrape config of deploy/, pointed at this exporter and scraping every second.
    config = yaml.safe_load((DEPLOY / "prometheus" / "scrape.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(ALERTS)]
    [job] = config["scrape_configs"]
    job["scrape_interval"] = "1s"
    job["static_configs"] = [{"targets": [f"127.0.0.1:{exporter.port}"]}]
    config["scrape_configs"].append({
        "job_name": "dltop-tls", "scrape_interval": "1s", "scheme": "https",
        "tls_config": {"ca_file": str(tmp / "cert.pem")},
        "basic_auth": {"username": "prometheus", "password_file": str(tmp / "password")},
        "static_configs": [{"targets": [f"127.0.0.1:{secured.port}"]}]})
    config["scrape_configs"].append({"job_name": "dltop-tap", "scrape_interval": "1s",
                                     "static_configs": [{"targets": [f"127.0.0.1:{tap.port}"]}]})
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = open(tmp / "prometheus.log", "w")  # noqa: SIM115 - open for the life of the server
    proc = subprocess.Popen([prometheus, f"--config.file={tmp / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT)
    s = Stack(f"http://127.0.0.1:{port}", exporter, tmp / "dataset", samples, tap)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp / "prometheus.log").read_text()[-3000:]
            try:
                ready = (s.query('up{job="dltop"} == 1') and s.query('up{job="dltop-tls"} == 1')
                         and s.query('up{job="dltop-tap"} == 1')
                         and s.query("dltop_dataset_resident_bytes")
                         and s.query("dltop_gpu_memory_total_bytes"))
            except (OSError, AssertionError):
                ready = False
            if ready:
                break
            assert time.monotonic() < deadline, (tmp / "prometheus.log").read_text()[-3000:]
            time.sleep(0.5)
        time.sleep(3)  # a few scrapes and rule evaluations
        yield s
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()
        tap.close()
        exporter.stop()
        secured.stop()
        done.set()
        for lock in locks:
            lock.release()


def test_cached_agrees_with_proc_meminfo(stack: Stack) -> None:
    # The value Prometheus holds was read by dltop at its memory source's last success (a sample of the same
    # scrape). Cached moves while other work runs, so the tolerance is what /proc/meminfo itself showed around
    # that moment: the range of this test's 20 ms readings within 0.5 s of it, widened by the largest step
    # between two consecutive readings (the change that could fall between them).
    at = time.time()
    [value] = stack.query('dltop_memory_cached_bytes{job="dltop"}', at)
    [read_at] = stack.query('dltop_source_last_success_timestamp_seconds{job="dltop", source="memory"}', at)
    cached, ts = float(value["value"][1]), float(read_at["value"][1])
    near = [c for t, c in stack.meminfo if abs(t - ts) <= 0.5]
    assert len(near) >= 10, "the meminfo watcher did not run around dltop's read"
    step = max(abs(b[1] - a[1]) for a, b in zip(stack.meminfo, stack.meminfo[1:], strict=False))
    assert min(near) - step <= cached <= max(near) + step, (cached, min(near), max(near), step)


def test_dataset_residency_agrees_with_fincore(stack: Stack) -> None:
    files = sorted(str(p) for p in stack.dataset.iterdir())
    r = subprocess.run([binary("fincore", "util-linux"), "--bytes", "--noheadings", "--raw", "--output", "RES", *files],
                       capture_output=True, text=True, check=True)
    fincore = sum(int(x) for x in r.stdout.split())
    assert fincore == WARM * FILE_BYTES  # what the test warmed, as fincore sees it
    [resident] = stack.query(f'dltop_dataset_resident_bytes{{job="dltop", dataset="{stack.dataset}"}}')
    [size] = stack.query(f'dltop_dataset_size_bytes{{job="dltop", dataset="{stack.dataset}"}}')
    assert float(resident["value"][1]) == fincore
    assert float(size["value"][1]) == sum(os.path.getsize(f) for f in files)


def test_alert_rules_check_and_evaluate(stack: Stack) -> None:
    r = subprocess.run([binary("promtool"), "check", "rules", str(ALERTS)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    status, _, body = get(f"{stack.prom}/api/v1/rules")
    rules = [rule for g in json.loads(body)["data"]["groups"] for rule in g["rules"]]
    names = re.findall(r"- (?:alert|record): ([\w:]+)", ALERTS.read_text())
    assert sorted(r["name"] for r in rules) == sorted(names)
    assert all(r["health"] == "ok" and r["lastEvaluation"] > "2000" for r in rules), rules


def test_prometheus_scrapes_through_tls_and_basic_auth(stack: Stack) -> None:
    # The web config's TLS and bcrypt users work with Prometheus' own client, not only with urllib.
    [up] = stack.query('up{job="dltop-tls"}')
    assert up["value"][1] == "1"
    assert stack.query('dltop_memory_cached_bytes{job="dltop-tls"}')


def test_prometheus_gets_its_scrapes_gzipped(stack: Stack) -> None:
    # Prometheus asks for gzip; the answer on the wire is gzip, and what Prometheus decoded is the metrics.
    scrapes = [(q, a) for q, a in zip(stack.tap.requests, stack.tap.answers, strict=False)
               if q.startswith(b"GET /metrics") and b"\r\n\r\n" in a]
    assert scrapes
    for request, answer in scrapes:
        assert re.search(rb"(?im)^accept-encoding:.*\bgzip\b", request), request
        head = answer.split(b"\r\n\r\n", 1)[0]
        assert re.search(rb"(?im)^content-encoding: gzip\r?$", head), head
        assert answer.split(b"\r\n\r\n", 1)[1][:2] == b"\x1f\x8b"  # gzip's magic
    assert stack.query('dltop_memory_cached_bytes{job="dltop-tap"}')
    [info] = stack.query('dltop_build_info{job="dltop-tap"}')
    assert info["metric"]["version"] and info["metric"]["python"].startswith("3.")


def test_example_scrape_config_is_valid() -> None:
    r = subprocess.run([binary("promtool"), "check", "config", "scrape.yml"], capture_output=True, text=True,
                       cwd=DEPLOY / "prometheus")
    assert r.returncode == 0, r.stdout + r.stderr


def dashboard_queries() -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and template variable, with the variables as Grafana's All sends
    them and its interval variables at the values of a one-hour view."""
    dash = json.loads(DASHBOARD.read_text())
    subst = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h", "$instance": ".*", "$gpu": ".*",
             "$dataset": ".*", "$server": ".*"}

    def fill(expr: str) -> str:
        for k, v in subst.items():
            expr = expr.replace(k, v)
        assert "$" not in expr, expr
        return expr

    out = [(f"panel {p['title']!r}", fill(t["expr"])) for p in dash["panels"] for t in p.get("targets", [])]
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            m = re.fullmatch(r"label_values\((.+), (\w+)\)", v["query"]["query"])
            assert m, v["query"]
            out.append((f"variable {v['name']}", fill(m.group(1))))
    return out


def test_every_dashboard_expression_evaluates(stack: Stack) -> None:
    results = {where: stack.query(expr) for where, expr in dashboard_queries()}
    # Those with data in this stack (memory, the dataset, the fake GPU) return it; the others return none
    # (no inference server, no probe, no hint), which is an answer, not an error.
    for where in ("panel 'Page cache and available memory'", "panel 'Dataset residency'",
                  "panel 'GPU $gpu memory by use'", "panel 'GPU utilization'", "variable instance", "variable gpu",
                  "variable dataset"):
        assert results[where], where
    assert {r["metric"]["dataset"] for r in results["variable dataset"]} == {str(stack.dataset)}
    assert f"127.0.0.1:{stack.exporter.port}" in {r["metric"]["instance"] for r in results["variable instance"]}


def test_dashboard_is_importable() -> None:
    dash = json.loads(DASHBOARD.read_text())
    names = [v["name"] for v in dash["templating"]["list"]]
    assert names[0] == "datasource" and {"instance", "gpu", "dataset"} <= set(names)
    for p in dash["panels"]:
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
            assert all(t["datasource"]["uid"] == "${datasource}" for t in p["targets"])
    ids = [p["id"] for p in dash["panels"]]
    assert len(set(ids)) == len(ids) and dash["uid"]
