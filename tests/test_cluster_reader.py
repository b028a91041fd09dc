"""The cluster reader's contract on hostile input: the --selector is parsed, never pasted; a Prometheus answer of any
shape gives a ClusterPart or one ClusterError, never another exception; bad values cost only their series."""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import re
import threading
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dltop.config import PrometheusOptions, load_config, prometheus_options
from dltop.errors import DltopError
from dltop.model.base import Unavailable
from dltop.sources.cluster import (
    ClusterError,
    PrometheusClient,
    _strings,
    _vector,
    detail_matchers,
    parse_selector,
    queries,
    read_cluster,
    selector_text,
)

GOOD = [
    ('job="dltop"', [("job", "=", "dltop")]),
    ('{job="dltop", cluster=~"a|b"}', [("job", "=", "dltop"), ("cluster", "=~", "a|b")]),
    (r'path!="a\"b\\c"', [("path", "!=", 'a"b\\c')]),
    ("", []),
    ('node!~"gpu-1.*" ,', [("node", "!~", "gpu-1.*")]),
]
BAD = ['job="a"} or vector(1', "job=dltop", 'job="a" cluster="b"', '__name__="up"', 'job="a\\q"', '1job="a"',
       'job="a', 'job=="a"', 'job="a"}) or up{x="', 'job="a\nb"']


@pytest.mark.parametrize(("text", "matchers"), GOOD)
def test_good_selectors(text: str, matchers: list[tuple[str, str, str]]) -> None:
    assert parse_selector(text) == matchers
    assert parse_selector(selector_text(matchers)) == matchers  # written back, read the same


@pytest.mark.parametrize("text", BAD)
def test_bad_selectors_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="selector"):
        parse_selector(text)


def test_every_selection_carries_the_selector_once() -> None:
    sel = selector_text(parse_selector('job="x"'))
    one = detail_matchers([("j", 'n"1')])
    for qs in (queries(sel), queries(sel, one), queries(sel, "")):
        assert len(qs) <= 20
        blocks = [b for q in qs.values() for b in re.findall(r"\{(?:[^{}\"]|\"(?:[^\"\\]|\\.)*\")*\}", q)]
        assert len(blocks) >= len(qs) and all(b.count('job="x"') == 1 for b in blocks), qs
    assert sum(q.count(one) for q in queries(sel, one).values()) == 3  # the three detail queries, only them


class FakeClient(PrometheusClient):
    """Answers every query with the same raw bytes, run through the real answer checks."""

    def __init__(self, answer: bytes) -> None:
        super().__init__(PrometheusOptions("http://127.0.0.1:1"))
        self.answer = answer

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        self.queries += 1
        return _vector(self.answer, "fake")

    def label_values(self, label: str, match: str, start: float, end: float) -> list[str]:
        """The label's values on the answer's series (its jobs: every node in it is a dltop job's)."""
        self.queries += 1
        return sorted({s["metric"][label] for s in _vector(self.answer, "fake") if isinstance(s, dict)
                       and isinstance(s.get("metric"), dict) and isinstance(s["metric"].get(label), str)})


def _answer(result: list[Any]) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


def test_bad_values_cost_only_their_series() -> None:
    node = {"job": "j", "instance": "n:1"}
    answer = _answer([
        {"metric": {**node, "__name__": "up"}, "value": [1.0, "1"]},
        {"metric": {**node, "__name__": "dltop_snapshot_timestamp_seconds"}, "value": [1.0, "99.5"]},
        {"metric": {**node, "__name__": "dltop_memory_total_bytes"}, "value": [1.0, "NaN"]},
        {"metric": {**node, "__name__": "dltop_memory_cached_bytes"}, "value": [1.0, "4096"]},
        {"metric": {**node, "__name__": "dltop_memory_available_bytes"}, "value": [1.0, "1e400"]},
        {"metric": {**node, "__name__": "dltop_dataset_resident_bytes", "dataset": "/d\x1b"}, "value": [1.0, "-1"]},
        {"metric": {"__name__": "up"}, "value": [1.0, "1"]},  # no instance
        {"metric": {**node, "x": 5}, "value": [1.0, "1"]},  # a label that is not a string
        "garbage",
    ])
    part = read_cluster(FakeClient(answer), now=lambda: 100.0)
    [n] = part.nodes
    assert n.up and n.memory_cached_bytes == 4096
    assert isinstance(n.memory_total_bytes, Unavailable) and isinstance(n.memory_available_bytes, Unavailable)
    assert isinstance(n.datasets[0].resident_bytes, Unavailable)
    assert part.notes and all("\x1b" not in note for note in part.notes)


@pytest.mark.parametrize(("raw", "why"), [
    (b"<html>", "not JSON"), (b"[" * 100000, "not JSON"), (b'{"status": "error", "error": "bad \\u001b"}', "bad"),
    (b'{"status": "success", "data": {"resultType": "matrix", "result": []}}', "no instant vector"),
    (b'{"data": 1}', "not Prometheus"),
])
def test_answers_that_are_not_vectors(raw: bytes, why: str) -> None:
    with pytest.raises(ClusterError, match=why) as e:
        read_cluster(FakeClient(raw))
    assert "\x1b" not in str(e.value)


def test_label_values_answers() -> None:
    ok = b'{"status": "success", "data": ["dltop", 5, null, "x\\u001b", "' + b"j" * 5000 + b'"]}'
    assert _strings(ok, "p") == ["dltop", "x\x1b"]  # non-strings and over-long values left out (shown escaped later)
    for raw, why in ((b'{"status": "success", "data": {"resultType": "vector", "result": []}}', "no list"),
                     (b"<html>", "not JSON"), (b'{"status": "error", "error": "bad"}', "bad")):
        with pytest.raises(ClusterError, match=why):
            _strings(raw, "p")


def test_an_unreachable_prometheus_is_one_line() -> None:
    with pytest.raises(ClusterError, match="cannot reach") as e:
        read_cluster(PrometheusClient(PrometheusOptions("http://127.0.0.1:1", timeout_s=2)))
    assert "\n" not in str(e.value)


_labels = st.dictionaries(st.sampled_from(["job", "instance", "__name__", "gpu", "uuid", "dataset", "use", "pid",
                                           "rank", "job_id", "server", "id", "kind", "source", "node"]),
                          st.one_of(st.text(max_size=8), st.integers(), st.none(),
                                    st.sampled_from(["dltop_gpu_up", "dltop_dataset_size_bytes", "up", "n:1",
                                                     "dltop_training_step_seconds", "some"])), max_size=6)
_series = st.one_of(
    st.fixed_dictionaries({"metric": _labels, "value": st.lists(st.one_of(
        st.floats(allow_nan=True), st.text(max_size=6), st.sampled_from(["1", "0", "NaN", "+Inf", "-1", "1e400"])),
        min_size=0, max_size=3)}),
    st.text(max_size=4), st.integers(), st.none())
FUZZ = {"tried": 0}


@settings(max_examples=100, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.lists(_series, max_size=8).map(_answer), st.binary(max_size=64)))
def test_fuzz_answers_never_raise_but_cluster_error(raw: bytes) -> None:
    FUZZ["tried"] += 1
    with contextlib.suppress(ClusterError):
        read_cluster(FakeClient(raw), now=lambda: 100.0, detail=True)  # every query: the detail ones too


def test_fuzz_count() -> None:
    # The fuzz above runs first (file order); its count goes into docs/cluster.md.
    print(f"cluster reader fuzz: {FUZZ['tried']} inputs")
    assert FUZZ["tried"] >= 100


# -- the [prometheus] table of the config file: the URL, the selector and the credentials' file paths ----------


def _config(tmp_path: Any, text: str) -> Any:
    p = tmp_path / "config.toml"
    p.write_text(text)
    return load_config(p)


def test_the_config_names_the_credentials_files(tmp_path: Any) -> None:
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "pw").write_text("s3cret\n")
    s = _config(tmp_path, '[prometheus]\nurl = "prom:9090"\nselector = \'job="dltop"\'\nusername = "me"\n'
                          'password_file = "secrets/pw"\ntimeout = 3\n')
    opts = prometheus_options(argparse.Namespace(), s.prometheus)
    # a relative path is the config file's folder's, as in Prometheus' own config
    assert opts == PrometheusOptions("http://prom:9090", selector='job="dltop"', username="me",
                                     password_file=str(tmp_path / "secrets" / "pw"), timeout_s=3.0)
    # and the options on the command line win over the file's
    args = argparse.Namespace(prometheus_selector='job="x"', prometheus_timeout=5.0)
    assert prometheus_options(args, s.prometheus) == replace(opts, selector='job="x"', timeout_s=5.0)
    assert _config(tmp_path, 'prometheus = "prom:9090"\n').prometheus == PrometheusOptions("http://prom:9090")


@pytest.mark.parametrize(("text", "why"), [
    ('[prometheus]\nurl = "p:9090"\npassword = "hunter2"\n', "no secrets in the config file.*password_file"),
    ('[prometheus]\nurl = "p:9090"\nbearer_token = "abc"\n', "no secrets.*bearer_token_file"),
    ('[prometheus]\nurl = "p:9090"\npasword_file = "x"\n', "unknown setting 'pasword_file'"),
    ('[prometheus]\nselector = \'job="a"\'\n', "needs url"),
    ('[prometheus]\nurl = "p:9090"\ninsecure_skip_verify = "yes"\n', "true or false"),
    ('[prometheus]\nurl = "p:9090"\ntimeout = nan\n', "between 0.1 and 300"),
    ('[prometheus]\nurl = "p:9090"\nca_file = 3\n', "must be a string"),
    ('prometheus = 5\n', "URL of a Prometheus server, or a .prometheus. table"),
    ('prometheus = "http://me:hunter2@p:9090"\n', "no user or password"),
])
def test_bad_prometheus_settings_are_one_line(tmp_path: Any, text: str, why: str) -> None:
    with pytest.raises(DltopError, match=why) as e:
        _config(tmp_path, text)
    assert "\n" not in str(e.value) and "hunter2" not in str(e.value)


def test_a_missing_credentials_file_is_one_line_at_start(tmp_path: Any) -> None:
    s = _config(tmp_path, '[prometheus]\nurl = "p:9090"\nbearer_token_file = "nope"\n')
    with pytest.raises(DltopError, match=r"--prometheus-bearer-token-file .*nope: cannot be read"):
        prometheus_options(argparse.Namespace(), s.prometheus)


def test_the_config_files_credentials_reach_prometheus(tmp_path: Any) -> None:
    # A real HTTP server on loopback answers as Prometheus does, and keeps the Authorization header it got.
    got: list[str | None] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self._send(_answer([]))

        def do_GET(self) -> None:  # noqa: N802 - the label values API
            self._send(json.dumps({"status": "success", "data": []}).encode())

        def _send(self, body: bytes) -> None:
            got.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        (tmp_path / "token").write_text("tok-123\n")
        s = _config(tmp_path, f'[prometheus]\nurl = "127.0.0.1:{server.server_address[1]}"\n'
                              'bearer_token_file = "token"\n')
        opts = prometheus_options(argparse.Namespace(), s.prometheus)
        assert opts is not None
        part = read_cluster(PrometheusClient(opts))
        assert part.nodes == () and got == ["Bearer tok-123"] * part.queries
    finally:
        server.shutdown()
        server.server_close()


def test_detail_matchers_match_hostile_instances_literally() -> None:
    [(name, op, value)] = parse_selector(detail_matchers([("j", "a.b:1"), ("j", 'x|y"\\(')]))
    assert (name, op) == ("instance", "=~")
    assert re.fullmatch(value, "a.b:1") and re.fullmatch(value, 'x|y"\\(')  # RE2 reads these escapes as Python's
    assert not re.fullmatch(value, "aXb:1") and not re.fullmatch(value, "x")
    assert parse_selector(detail_matchers([("j", 'n"1')])) == [("job", "=", "j"), ("instance", "=", 'n"1')]


def test_two_users_under_one_job_id_are_two_jobs() -> None:
    """A job is (uid, job_id): another user's ranks that claim a job id are a job of their own, and the jobs table
    names each one's uid (the exporter's uid label is the kernel's owner of the process)."""
    node = {"job": "j", "instance": "n:1"}
    rank = {**node, "job_id": "shared", "pid": "7", "rank": "0"}
    answer = _answer([
        {"metric": {**node, "__name__": "up"}, "value": [1.0, "1"]},
        {"metric": {**node, "__name__": "dltop_snapshot_timestamp_seconds"}, "value": [1.0, "99.5"]},
        {"metric": {**rank, "uid": "1001", "__name__": "dltop_training_step_seconds"}, "value": [1.0, "1"]},
        {"metric": {**rank, "uid": "1002", "pid": "8", "__name__": "dltop_training_step_seconds"},
         "value": [1.0, "1"]},
    ])
    part = read_cluster(FakeClient(answer), now=lambda: 100.0)
    # (the fake answers every query alike: the node's own series count as a group with no job id too)
    assert sorted((j.job_id, j.uid) for j in part.jobs if j.job_id) == [("shared", "1001"), ("shared", "1002")]
    from dltop.text.cluster import job_rows

    assert sorted(r[0] for r in job_rows(part) if r[0].startswith("shared")) == ["shared (uid 1001)",
                                                                                 "shared (uid 1002)"]
