"""The cluster reader's contract on hostile input: the --selector is parsed, never pasted; a Prometheus answer of any
shape gives a ClusterPart or one ClusterError, never another exception; bad values cost only their series."""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dltop.config import PrometheusOptions
from dltop.model.base import Unavailable
from dltop.sources.cluster import (
    ClusterError,
    PrometheusClient,
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
        read_cluster(FakeClient(raw), now=lambda: 100.0)


def test_fuzz_count() -> None:
    # The fuzz above runs first (file order); its count goes into docs/cluster.md.
    print(f"cluster reader fuzz: {FUZZ['tried']} inputs")
    assert FUZZ["tried"] >= 100
