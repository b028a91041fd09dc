"""deploy/prometheus/alerts.yml and deploy/grafana/dltop.json against the real exporter: promtool's unit tests of
every alert (each fires on the series it exists for, none on an idle node), and every metric name, label and label
value the rules, their unit tests and the dashboard use found in real scrapes of the real collector, so the rules
cannot drift from the exporter again (the page-cache-squeeze rule matched labels no memory series has)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from dltop import probe
from dltop.exporter.collector import SnapshotCollector
from dltop.fields import FIELDS, PREFIX
from dltop.model import Snapshot, SourceStatus
from dltop.residency.scan import scan_paths
from dltop.sources.gpu import FakeBackend, GpuReader
from dltop.sources.memory import read_memory
from dltop.sources.servers import read_server

from .conftest import DATA, REPO
from .test_fields import DATA_DOC, METRICS, caches_part, maybe_metrics_server, probes_part  # noqa: F401 - a fixture
from .test_prometheus import binary

PROMETHEUS = REPO / "deploy" / "prometheus"
ALERTS = PROMETHEUS / "alerts.yml"
ALERTS_TEST = PROMETHEUS / "alerts_test.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "dltop.json"
SCENARIOS = DATA / "gpu-scenarios"
TARGET_LABELS = {"instance", "job"}  # what Prometheus adds to every scraped series
VOCABULARY = {"resource", "kind", "reason", "detail", "source", "engine", "use", "severity"}  # values from a set

Scrape = dict[str, list[dict[str, str]]]  # family name -> the label sets of its samples


def all_rules() -> list[dict[str, object]]:
    return [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]


def rules() -> list[dict[str, object]]:
    """The alerting rules."""
    return [r for r in all_rules() if "alert" in r]


def recorded() -> set[str]:
    """The series the recording rules make (job:dltop_exporters_serving:count)."""
    return {str(r["record"]) for r in all_rules() if "record" in r}


# -- promtool's unit tests ---------------------------------------------------------------------------------------

def test_promtool_unit_tests_of_every_alert_pass() -> None:
    r = subprocess.run([binary("promtool"), "test", "rules", ALERTS_TEST.name], capture_output=True, text=True,
                       cwd=PROMETHEUS, timeout=120)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def test_every_alert_has_a_test_that_fires_and_an_idle_node_where_none_does() -> None:
    names = {str(r["alert"]) for r in rules()}
    tests = yaml.safe_load(ALERTS_TEST.read_text())["tests"]
    fired = {t["alertname"] for case in tests for t in case.get("alert_rule_test", []) if t.get("exp_alerts")}
    assert fired == names
    [idle] = [case for case in tests if case["name"].startswith("idle")]
    quiet = {t["alertname"] for t in idle["alert_rule_test"] if t["exp_alerts"] == []}
    assert quiet == names


# -- what the real exporter gives ---------------------------------------------------------------------------------

def scrape(snapshot: Snapshot) -> Scrape:
    """The label sets of each family in the collector's real exposition of `snapshot`, as Prometheus parses it."""
    collector = SnapshotCollector()
    collector.update(snapshot)
    body, _ = collector.render("text/plain")
    out: Scrape = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append(dict(s.labels))
    return out


def gpu_part(name: str) -> object:
    return GpuReader(lambda: FakeBackend(json.loads((SCENARIOS / f"{name}.json").read_text())), "/").read()


@pytest.fixture
def real_scrapes(tmp_path: Path, maybe_metrics_server: str | None,  # noqa: F811 - the fixture
                 monkeypatch: pytest.MonkeyPatch) -> Scrape:
    """Scrapes of Snapshots of real parts: this machine's memory and PSI, a dataset the test wrote, a probe file of
    this process, the real vLLM / SGLang payloads over HTTP (where ../shared/fixtures has them), and the fake-NVML
    machines: a lost GPU, NVML refusing this user, a node without NVIDIA; a dataset not there."""
    if not os.path.exists("/proc/pressure/memory"):
        pytest.skip("this kernel has no PSI (/proc/pressure): the pressure series cannot be scraped")
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "shard").write_bytes(os.urandom(1 << 16))
    monkeypatch.setattr(probe, "state", probe._State())
    servers = () if maybe_metrics_server is None else tuple(
        read_server(f"{maybe_metrics_server}/{f.name}", 5.0) for f in sorted(METRICS.glob("*.prom")))
    ok = SourceStatus("gpus", 1.0, last_ok_ts=time.time())
    rich = Snapshot(ts=time.time(), host="h", memory=read_memory("/"), datasets=scan_paths([str(tmp_path / "ds"), str(tmp_path / "not-mounted")]),
                    gpus=gpu_part("gpu-lost"), servers=servers,  # type: ignore[arg-type]
                    probes=probes_part(tmp_path, {**probe.report(), "data": DATA_DOC, "started_at": time.time() - 5}),
                    caches=caches_part(tmp_path / "caches")[0],
                    sources={"gpus": ok, "memory": dataclasses.replace(ok, name="memory")})
    out: Scrape = {}
    for name in ("no-permission", "library-not-found", "version-mismatch"):
        for k, v in scrape(dataclasses.replace(rich, gpus=gpu_part(name))).items():  # type: ignore[arg-type]
            out.setdefault(k, []).extend(v)
    for k, v in scrape(rich).items():
        out.setdefault(k, []).extend(v)
    # Hints fire from a window of Snapshots (and a bare clone has no server payloads): those families as the
    # field table declares them, which is what the collector writes.
    for f in FIELDS:
        if f.part == "hints" or (f.part == "servers" and not servers):
                out.setdefault(PREFIX + f.name, [dict.fromkeys(f.labels, "")])
    return out


SELECTOR = re.compile(r"(?<![\w:])(dltop_\w+)\s*(\{[^}]*\})?")  # not inside a recorded name (a:dltop_b:c)
MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')
CLAUSE = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")


def check_expression(where: str, expr: str, got: Scrape) -> set[str]:
    """Problems of one PromQL expression against the scrapes; returns the labels its result may carry."""
    problems = []
    labels = set(TARGET_LABELS)
    selectors = SELECTOR.findall(expr)
    assert selectors or any(r in expr for r in recorded()), f"{where}: no dltop_ metric in {expr!r}"
    for name, matchers in selectors:
        if name not in got:
            problems.append(f"{where}: {name} is not in the exporter's scrape")
            continue
        family = {k for s in got[name] for k in s}
        labels |= family
        for label, op, value in MATCHER.findall(matchers):
            if label in TARGET_LABELS:
                continue
            if label not in family:
                problems.append(f"{where}: {name} has no label {label} (it has {sorted(family)})")
            elif op == "=" and "$" not in value and value not in {s.get(label) for s in got[name]}:
                problems.append(f"{where}: {name}{{{label}={value!r}}} is not in the exporter's scrape")
    for clause in CLAUSE.findall(expr):
        for label in filter(None, (x.strip() for x in clause.split(","))):
            if label not in labels:
                problems.append(f"{where}: {label} in {clause!r} is a label of none of its metrics")
    assert not problems, "\n".join(problems)
    return labels


def test_every_rule_uses_names_labels_and_values_the_exporter_gives(real_scrapes: Scrape) -> None:
    for rule in all_rules():
        where = f"alert {rule['alert']}" if "alert" in rule else f"record {rule['record']}"
        labels = check_expression(where, str(rule["expr"]), real_scrapes)
        for text in dict(rule.get("annotations", {})).values():  # type: ignore[call-overload]
            for label in re.findall(r"\$labels\.(\w+)", str(text)):
                assert label in labels, f"{where}: its annotations name $labels.{label}, which it never has"


def series_of(text: str) -> tuple[str, dict[str, str]]:
    m = re.fullmatch(r"(\w+)(?:\{(.*)\})?", text.strip())
    assert m, text
    return m.group(1), dict((k, v) for k, _, v in MATCHER.findall(m.group(2) or ""))


def test_the_unit_tests_series_are_the_exporters(real_scrapes: Scrape) -> None:
    # Each input series has exactly the labels the exporter gives its family (a test that adds a label the
    # exporter lacks, or leaves one out, would pass against rules that cannot fire on real data).
    seen = 0
    for case in yaml.safe_load(ALERTS_TEST.read_text())["tests"]:
        for s in case["input_series"]:
            name, labels = series_of(s["series"])
            if name == "up":  # Prometheus' own series of each target: its labels only
                assert set(labels) == TARGET_LABELS, s["series"]
                continue
            assert name in real_scrapes, f"{case['name']}: {name} is not in the exporter's scrape"
            assert set(labels) >= TARGET_LABELS, s["series"]
            own = {k: v for k, v in labels.items() if k not in TARGET_LABELS}
            assert set(own) in [set(x) for x in real_scrapes[name]], (s["series"], real_scrapes[name][0])
            for k in set(own) & VOCABULARY:
                # a dataset's reason names its path: the real one's, with this test's path in it
                values = {(x.get(k) or "").replace(x.get("dataset") or "\0", own.get("dataset", ""))
                          for x in real_scrapes[name]}
                if values == {""}:
                    continue  # a family the field table stood in for (no server payloads in a bare clone)
                assert own[k] in values, (s["series"], k)
            seen += 1
    assert seen >= 20


# -- the dashboard --------------------------------------------------------------------------------------------------

def dashboard_expressions() -> Iterable[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    for p in dash["panels"]:
        for t in p.get("targets", []):
            yield f"panel {p['title']!r}", t["expr"]
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            m = re.fullmatch(r"label_values\((.+), (\w+)\)", v["query"]["query"])
            assert m, v["query"]
            yield f"variable {v['name']}", f"{m.group(1)} by ({m.group(2)})"  # the label it lists must exist


def test_every_dashboard_expression_uses_what_the_exporter_gives(real_scrapes: Scrape) -> None:
    exprs = list(dashboard_expressions())
    assert len(exprs) > 10
    for where, expr in exprs:
        check_expression(where, expr, real_scrapes)


def test_gpu_memory_is_one_stack_per_gpu_and_the_fleet_panels_are_there() -> None:
    dash = json.loads(DASHBOARD.read_text())
    panels = {p["id"]: p for p in dash["panels"]}
    [mem] = [p for p in panels.values() if "memory by use" in p["title"]]
    assert mem["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
    # One panel per GPU of one instance: the stack holds one GPU's uses, not every GPU's in one tower.
    assert mem["repeat"] == "gpu" and "$gpu" in mem["title"]
    rows = [p for p in dash["panels"] if p["type"] == "row"]
    [gpu_row] = [r for r in rows if r["gridPos"]["y"] < mem["gridPos"]["y"]][-1:]
    assert gpu_row["repeat"] == "instance"
    for t in mem["targets"]:
        assert 'gpu=~"$gpu"' in t["expr"] and 'instance=~"$instance"' in t["expr"]
    exprs = " ".join(t["expr"] for p in panels.values() for t in p.get("targets", []))
    for needle in ("dltop_dataset_unavailable_info", 'resource="io"', "dltop_memory_file_refaults_total",
                   "dltop_gpu_down_info", "dltop_gpus{", 'server=~"$server"'):
        assert needle in exprs, needle
    assert "server" in [v["name"] for v in dash["templating"]["list"]]


def test_no_rule_or_panel_sets_page_bytes_against_apparent_size() -> None:
    # dltop_dataset_resident_bytes is whole pages, dltop_dataset_size_bytes apparent bytes: many small files hold
    # more page cache than their size, so any expression with both (size - resident, resident / size) mixes units.
    # The share is dltop_dataset_resident_ratio, everywhere.
    exprs = [(f"alert {r['alert']}", str(r["expr"])) for r in rules()] + list(dashboard_expressions())
    mixed = [where for where, e in exprs if "dltop_dataset_resident_bytes" in e and "dltop_dataset_size_bytes" in e]
    assert mixed == []
    assert any("dltop_dataset_resident_ratio" in e for w, e in exprs if w.startswith("alert"))
