"""A CSV dump that takes a part's cells from its template's numbers (recorder/template.py) writes what reading every
line whole writes, to the byte: on real recordings, on a generated busy machine whose processes come and go, and
on sample lines changed in their numbers, strings and structure (a differential fuzz, derandomized)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dltop.model import Snapshot
from dltop.recorder import Recorder, Recording, store
from dltop.recorder import template as tp
from dltop.recorder.reuse import PartMemo
from tests.test_dump_reuse import checked, fast_csv, lines_of, recordings, reference_csv  # noqa: F401

REPO = Path(__file__).resolve().parents[1]


def _bench() -> object:
    spec = importlib.util.spec_from_file_location("bench_record", REPO / "benchmarks" / "record.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_record"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def busy(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A busy machine as benchmarks/record.py makes it (4 GPUs, 20 processes, datasets, every number moving),
    600 samples in frames of 100; GPU processes end and start along the way (templates made again), a GPU is
    lost for a while, the memory part goes unavailable once."""
    from dltop.model import Unavailable

    tmp = tmp_path_factory.mktemp("busy")
    with pytest.MonkeyPatch.context() as mp:
        bench = _bench()
        mp.setenv("DLTOP_FAKE_NVML", str(REPO / "tests/data/gpu-scenarios/8gpu-20proc.json"))
        base = bench.base_snapshot(tmp)  # type: ignore[attr-defined]
    snaps = list(bench.moving(base, 600, 1.8e9))  # type: ignore[attr-defined]
    out = []
    for i, s in enumerate(snaps):
        gpus = s.gpus
        assert isinstance(gpus, tuple)
        if 150 <= i < 300:  # GPU 1's first process ends
            gpus = (gpus[0], dataclasses.replace(gpus[1], processes=gpus[1].processes[1:]), *gpus[2:])
        if 200 <= i < 220:
            gpus = (*gpus[:3], dataclasses.replace(gpus[3], down="lost", memory_used_bytes=None))
        if i % 97 == 5:  # a structure change on one line only
            gpus = gpus[:2]
        s = dataclasses.replace(s, gpus=gpus)
        if i == 400:
            s = dataclasses.replace(s, memory=Unavailable("no /proc/meminfo"))
        out.append(s)
    rec_dir = tmp / "rec"
    with Recorder(str(rec_dir), block_samples=100, retain_s=None, max_bytes=None) as rec:
        for s in out:
            rec.write(s, wait=True)
    return str(rec_dir)


def test_a_busy_day_dumps_the_same_to_the_byte(busy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from dltop.recorder import dump

    memo = PartMemo(templates=True)
    rec = Recording(busy)
    for _ in rec.range(memo=memo):
        pass
    assert memo.templated > 2 * 500  # the gpus and memory parts of most lines came from their templates
    reference = reference_csv(busy)
    assert fast_csv(busy) == reference
    monkeypatch.setattr(dump, "MIN_PER_WORKER", 100)
    assert fast_csv(busy, workers=2) == reference  # in pieces, each with its own templates


def test_real_recordings_dump_the_same_to_the_byte(recordings: list[str]) -> None:  # noqa: F811
    for path in recordings:
        assert fast_csv(path) == reference_csv(path)


def test_a_template_follows_what_fields_does_with_each_number(busy: str) -> None:
    # The gpus part's template: labels' numbers (a GPU's index, a pid) must stay; NVML's percent becomes a ratio,
    # milliwatts watts, MHz hertz; the per-process util numbers no CSV column shows are free.
    lines = lines_of(busy)
    sample = json.loads(next(line for line in lines if b'"type":"sample"' in line))
    text = json.dumps(sample["snap"]["gpus"], separators=(",", ":"), ensure_ascii=False)
    parsed = store.loads(text)
    part = Snapshot.from_dict({"ts": 0.0, "host": "", "schema": 1, "gpus": parsed}).gpus
    tm = tp.make("gpus", text, parsed, part)
    assert tm is not None
    specs = {(f.name, tuple(labels.items())): spec for f, labels, spec in tm.samples}
    g = parsed[0]
    labels = (("gpu", "0"), ("uuid", g["uuid"]))
    assert specs[("gpu_utilization_ratio", labels)][1] == (("mul", 0.01),)
    assert specs[("gpu_power_watts", labels)][1] == (("mul", 0.001),)
    assert specs[("gpu_sm_clock_hertz", labels)][1] == (("mul", 1e6),)
    assert specs[("gpu_memory_used_bytes", labels)][1] == ()
    got = tm.match(text, 0)
    assert got is not None and got[1] == len(text)
    # a pid changed: not this template's text (its label would differ)
    pid = g["processes"][0]["pid"]
    assert tm.match(text.replace(f'"pid":{pid},', f'"pid":{pid + 1},', 1), 0) is None
    # a process's util (no column) changed: the same template
    util = g["processes"][0]["gpu_util_percent"]
    assert tm.match(text.replace(f'"gpu_util_percent":{util},', f'"gpu_util_percent":{util + 1},', 1), 0)
    # a number of a string: not a number
    assert tm.match(text.replace(g["uuid"], g["uuid"][:-1] + "9", 1), 0) is None


TRIED = [0]
TEMPLATED = [0]
_CACHE: dict[object, object] = {}


def cached_lines(path: str) -> list[bytes]:
    """lines_of, once per recording (the fuzzes read the same one for each input)."""
    if path not in _CACHE:
        _CACHE[path] = lines_of(path)
    return _CACHE[path]  # type: ignore[return-value]


def cached_template(path: str, key: str) -> tuple[str, tp.Template]:
    """The first sample's `key` part text of a recording, and its template."""
    if (path, key) not in _CACHE:
        sample = json.loads(next(line for line in cached_lines(path) if b'"type":"sample"' in line))
        text = json.dumps(sample["snap"][key], separators=(",", ":"), ensure_ascii=False)
        parsed = store.loads(text)
        part = getattr(Snapshot.from_dict({"ts": 0.0, "host": "", "schema": 1, key: parsed}), key)
        tm = tp.make(key, text, parsed, part)
        assert tm is not None
        _CACHE[(path, key)] = (text, tm)
    return _CACHE[(path, key)]  # type: ignore[return-value]
VALUES = ["-1", "-0", "0", "1", "7", "1.5", "-2.5", "1e3", "1E3", "1e400", "1e30", "2.0", "99999999999999999999",
          "18446744073709551616", "1234567890123456", "9007199254740993", "1" + "0" * 25, '"x"', "null", "true",
          "NaN", "[]", "{}", "-0.0"]


@settings(max_examples=120, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_fuzz_template_cells_against_reading_lines_whole(busy: str, tmp_path: Path, data: st.DataObject) -> None:
    # A real sample line, then the same line changed one to three times (a number made another, of another kind,
    # negative, huge or not a number; a string changed; spacing; a key doubled or renamed; a cut), then the line
    # again: the CSV read through templates is the one read whole, byte for byte, with the same damage note.
    TRIED[0] += 1
    lines = cached_lines(busy)
    samples = [i for i, line in enumerate(lines) if b'"type":"sample"' in line]
    k = samples[data.draw(st.integers(0, 150))]
    head = [line for line in lines[:k] if b'"type":"sample"' not in line]  # the parts and meta in force
    prev = lines[k]
    body = json.loads(prev)
    ts = body["ts"]

    def again(t: float) -> str:
        b = json.loads(prev)
        b["ts"] = b["snap"]["ts"] = t
        return store.encode_line(t, "sample", {k: v for k, v in b.items() if k not in ("ts", "type")},
                                 checksum=False).decode("utf-8").rstrip("\n")

    text = again(ts + 1)
    start = text.index('"snap":')
    for _ in range(data.draw(st.integers(1, 3))):
        how = data.draw(st.sampled_from(["same", "same", "same", "number", "number", "string", "space", "key",
                                         "cut"]))
        if how == "same":  # a number made another of its kind: an int any int (2**64 and past it too)
            spans = [m.span() for m in re.finditer(r"(?<=[:,\[])-?\d[\d.eE+-]*(?=[,\]}])", text) if m.start() > start]
            a, b = spans[data.draw(st.integers(0, len(spans) - 1))]
            old = text[a:b]
            if any(c in old for c in ".eE"):
                new = repr(data.draw(st.floats(allow_nan=False, allow_infinity=False, width=64)))
            else:
                new = str(data.draw(st.one_of(st.integers(0, 10**6), st.integers(-5, 2**64 + 5),
                                              st.sampled_from([2**53 + 1, 2**64, 2**64 + 1, 10**19]))))
            text = text[:a] + new + text[b:]
        elif how == "number":
            spans = [m.span() for m in re.finditer(r"(?<=[:,\[])-?\d[\d.eE+-]*", text) if m.start() > start]
            a, b = spans[data.draw(st.integers(0, len(spans) - 1))]
            text = text[:a] + data.draw(st.sampled_from(VALUES)) + text[b:]
        elif how == "string":
            spans = [m.span(1) for m in re.finditer(r'"([^"\\]{2,})"', text) if m.start() > start]
            a, b = spans[data.draw(st.integers(0, len(spans) - 1))]
            at = data.draw(st.integers(a, b - 1))
            text = text[:at] + data.draw(st.sampled_from(["9", ":1,", "x", '\\"', "\\u00e9", "é"])) + text[at + 1:]
        elif how == "space":
            spots = [m.end() for m in re.finditer(r'":|,(?=")', text) if m.start() > start]
            at = spots[data.draw(st.integers(0, len(spots) - 1))]
            text = text[:at] + data.draw(st.sampled_from([" ", "\n", " \t "])) + text[at:]
        elif how == "key":
            keys = [m for m in re.finditer(r'"([a-z_]+)":', text) if m.start() > start]
            m = keys[data.draw(st.integers(0, len(keys) - 1))]
            name = m.group(1)
            new = data.draw(st.sampled_from([f'"{name}":null,"{name}":', f'"zz_{name}":', f'"{name}_b64":"eA==","{name}":']))
            text = text[:m.start()] + new + text[m.end():]
        else:
            at = data.draw(st.integers(start, len(text) - 1))
            text = text[:at] + text[at + data.draw(st.integers(1, 20)):]
    rec_dir = tmp_path / f"fuzz{TRIED[0]}"
    rec_dir.mkdir(mode=0o700)
    segment = b"".join(checked(line.decode("utf-8")) for line in [*head, prev]) + checked(text) + checked(again(ts + 2))
    (rec_dir / "20261201T000000Z.jsonl").write_bytes(segment)
    assert fast_csv(str(rec_dir)) == reference_csv(str(rec_dir))
    memo = PartMemo(templates=True)
    for _ in Recording(str(rec_dir)).range(memo=memo):
        pass
    TEMPLATED[0] += memo.templated > 0  # the changed line's part came from its template


def test_fuzz_count() -> None:
    print(f"\nfuzzed (inputs): {TRIED[0]} sample lines, their CSV read through templates and whole "
          f"({TEMPLATED[0]} with a changed line's part read from a template)")
    assert TRIED[0] > 0 and TEMPLATED[0] > TRIED[0] // 8


NATIVE = tp._NATIVE


@pytest.mark.skipif(NATIVE is None, reason=f"dltop.native._template: {__import__('dltop.native').native.status()}")
@settings(max_examples=300, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_the_c_match_is_its_python_twin(busy: str, data: st.DataObject) -> None:
    # The C matcher and the regex it stands for cut the same texts at the same numbers, on a real part's template
    # and its text changed (numbers of every shape JSON allows and some it does not, other characters, a cut, a
    # text not ASCII where the template is), at any place.
    key = data.draw(st.sampled_from(["gpus", "memory"]))
    text, tm = cached_template(busy, key)
    for _ in range(data.draw(st.integers(0, 4))):
        spans = [m.span() for m in re.finditer(r"-?\d[\d.eE+-]*", text)]
        a, b = spans[data.draw(st.integers(0, len(spans) - 1))]
        new = data.draw(st.one_of(st.from_regex(r"-?[0-9.eE+-]{0,12}", fullmatch=True),
                                  st.sampled_from(["1.", "1e", "-", "01", "1.5e+3", "-0", "1E-2", "—", "é", "x"])))
        text = text[:a] + new + text[b:]
    if data.draw(st.booleans()):
        at = data.draw(st.integers(0, len(text)))
        text = text[:at]
    prefix = data.draw(st.sampled_from(["", "{", '"gpus":', "é"]))
    pos = len(prefix) + data.draw(st.integers(0, 2))
    whole = prefix + text
    assert tp._scan_c(tm, whole, pos) == tp._scan_py(tm, whole, pos)
    assert tp._scan_c(tm, whole, len(prefix)) == tp._scan_py(tm, whole, len(prefix))


def test_a_number_used_with_another_or_compared_must_stay(busy: str) -> None:
    # A dataset's numbers: resident bytes are pages times the page size, its ratio the resident pages over the
    # known ones (data_pages - data_unknown_pages, then compared with 0): those must stay the text's; its scan's
    # duration only becomes a cell, so it may change.
    lines = lines_of(busy)
    body = json.loads(next(line for line in lines if b'"name":"datasets"' in line))
    text = json.dumps(body["value"], separators=(",", ":"), ensure_ascii=False)
    parsed = store.loads(text)
    part = Snapshot.from_dict({"ts": 0.0, "host": "", "schema": 1, "datasets": parsed}).datasets
    tm = tp.make("datasets", text, parsed, part)
    assert tm is not None
    def changed(key: str, value: object) -> str:
        edited = json.loads(text)
        assert key in edited["paths"][0]
        edited["paths"][0][key] = value
        return json.dumps(edited, separators=(",", ":"), ensure_ascii=False)

    d = parsed["paths"][0]
    for key in ("page_size", "data_unknown_pages", "data_pages", "data_resident_pages"):
        assert tm.match(changed(key, d[key] + 1), 0) is None, key
    assert tm.match(changed("scan_duration_s", 0.125), 0) is not None
    assert tm.match(changed("scanned_at", d["scanned_at"] + 60.5), 0) is not None



def test_a_number_the_decoder_derives_from_another_must_stay() -> None:
    # DatasetResidency.__post_init__ makes a data_* count of -1 ("not given") its whole count: data_pages is then
    # `pages`. A template made of such a text must not let `pages` change freely: with pages 0 the ordinary
    # reading has no known pages, so no ratio at all, where the template would still give the text's 0.
    from dltop.model.datasets import DatasetResidency, DatasetsPart

    ds = DatasetResidency(path="/d", files=1, size_bytes=40960, pages=10, resident_pages=0)
    text = json.dumps(json.loads(Snapshot(ts=1.0, host="h", datasets=DatasetsPart(paths=(ds,))).to_json())["datasets"],
                      separators=(",", ":"), ensure_ascii=False).replace('"data_pages":10,', '"data_pages":-1,')

    def read(t: str) -> object:
        return Snapshot.from_dict({"ts": 0.0, "host": "", "schema": 1, "datasets": store.loads(t)}).datasets

    tm = tp.make("datasets", text, store.loads(text), read(text))
    assert tm is not None
    for pages in ("0", "3", "11"):
        other = text.replace('"pages":10,', f'"pages":{pages},', 1)
        ordinary = [(f.name, labels, tp.number(v)) for f, labels, v in tp._group("datasets", read(other)) or []]
        got = tm.match(other, 0)
        if got is not None:
            assert [(f.name, labels, tp.cell(spec, got[0])) for f, labels, spec in tm.samples] == ordinary, pages


def test_an_int_and_a_float_of_the_same_value_keep_their_own_cells(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # 2**53 as an int (MemTotal) prints "9007199254740992", as a float (a GPU's free memory, float() by fields)
    # "9007199254740992.0": equal values, so a cell cache keyed by value alone gave the second the first's text.
    from dltop.model import MemoryPart
    from tests.test_recorder import sampled

    big = 2**53
    snaps = sampled(tmp_path, monkeypatch, n=3)
    rec_dir = tmp_path / "rec"
    with Recorder(str(rec_dir), block_samples=2, retain_s=None, max_bytes=None) as rec:
        for s in snaps:
            assert isinstance(s.memory, MemoryPart) and isinstance(s.gpus, tuple)
            gpus = (dataclasses.replace(s.gpus[0], memory_free_bytes=big), *s.gpus[1:])
            rec.write(dataclasses.replace(s, memory=dataclasses.replace(s.memory, total_bytes=big), gpus=gpus),
                      wait=True)
    reference = reference_csv(str(rec_dir))
    assert "9007199254740992.0" in reference[0] and ",9007199254740992," in reference[0]
    assert fast_csv(str(rec_dir)) == reference


NUMBERS_TEMPLATED = [0]
INTS = [0, 1, -1, 7, -7, 2**31, 2**53 - 1, 2**53, 2**53 + 1, -(2**53) - 1, 10**15 - 1, 10**15, 10**16 + 1,
        10**19 - 1, -(10**19) + 1, 2**63, 2**64]
FLOATS = ["0.0", "-0.0", "0.5", "-0.5", "0.1", "0.3", "1e5", "1E-5", "-1e-300", "5e-324", "1.5e+300", "100.0",
          "99.99999999999999", "1e15", "1e16", "9007199254740993.0", "1.8446744073709552e19",
          "18446744073709551617.5", "1.0000000000000000000000001", "12.50000", "1e19", "2e19", "0.07"]


@settings(max_examples=60, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_fuzz_only_numbers_changed_against_reading_lines_whole(busy: str, tmp_path: Path,
                                                               data: st.DataObject) -> None:
    # Lines that keep every piece of the text and change only numbers (so that they meet the templates), many
    # at once, to values at the edges the template checks (a sign, 2**53, 15 and 19 digits, 2**64, floats that
    # print long or round, exponents, -0.0): the CSV through the templates is the one read whole, to the byte.
    TRIED[0] += 1
    lines = cached_lines(busy)
    samples = [i for i, line in enumerate(lines) if b'"type":"sample"' in line]
    k = samples[data.draw(st.integers(0, 100))]
    head = [line for line in lines[:k] if b'"type":"sample"' not in line]
    prev = lines[k]
    ts = json.loads(prev)["ts"]
    out = [checked(line.decode("utf-8")) for line in [*head, prev]]
    for j in range(3):
        text = prev.decode("utf-8").replace(json.dumps(ts), json.dumps(ts + j + 1), 2)
        start = text.index('"snap":')
        spans = [m.span() for m in re.finditer(r"(?<=[:,\[])-?\d[\d.eE+-]*(?=[,\]}])", text) if m.start() > start]
        count = data.draw(st.integers(1, 40))
        picks = sorted(set(data.draw(st.lists(st.integers(0, len(spans) - 1), min_size=count, max_size=count))),
                       reverse=True)
        for p in picks:
            a, b = spans[p]
            if any(c in text[a:b] for c in ".eE"):
                new = data.draw(st.one_of(st.sampled_from(FLOATS),
                                          st.floats(allow_nan=False, allow_infinity=False).map(repr)))
            else:
                new = str(data.draw(st.one_of(st.sampled_from(INTS), st.integers(-(10**6), 10**6))))
            text = text[:a] + new + text[b:]
        out.append(checked(text))
    rec_dir = tmp_path / f"numbers{TRIED[0]}"
    rec_dir.mkdir(mode=0o700)
    (rec_dir / "20261201T000000Z.jsonl").write_bytes(b"".join(out))
    assert fast_csv(str(rec_dir)) == reference_csv(str(rec_dir))
    memo = PartMemo(templates=True)
    for _ in Recording(str(rec_dir)).range(memo=memo):
        pass
    NUMBERS_TEMPLATED[0] += memo.templated > 0


def test_fuzz_only_numbers_count() -> None:
    print(f"\nfuzzed (numbers only): {NUMBERS_TEMPLATED[0]} inputs with a changed line read from a template")
    assert NUMBERS_TEMPLATED[0] > 10


def test_a_branch_the_trace_misses_is_caught_by_the_check() -> None:
    # The check reads the text with its free numbers changed, and with them 0, the ordinary way. A tracer blind
    # to __post_init__ (as it was) let `pages` of a data_pages -1 change freely: pages 10 -> 17 gives the same
    # cells, pages 0 leaves the dataset no known pages, so no ratio, and the check says so.
    from dltop.model.datasets import DatasetResidency, DatasetsPart

    ds = DatasetResidency(path="/d", files=1, size_bytes=40960, pages=10, resident_pages=0)
    text = json.dumps(json.loads(Snapshot(ts=1.0, host="h", datasets=DatasetsPart(paths=(ds,))).to_json())["datasets"],
                      separators=(",", ":"), ensure_ascii=False).replace('"data_pages":10,', '"data_pages":-1,')
    part = Snapshot.from_dict({"ts": 0.0, "host": "", "schema": 1, "datasets": store.loads(text)}).datasets
    tm = tp.make("datasets", text, store.loads(text), part)
    assert tm is not None
    got = tp.cut(text)
    assert got is not None
    pieces, nums = got
    pages = next(i for i, p in enumerate(pieces) if p.endswith('"pages":'))
    assert not tm.free[pages] and tp._check(tm, "datasets", pieces, nums)
    free = list(tm.free)
    free[pages] = True  # what the blind tracer said
    blind = tp.Template("datasets", pieces, tm.kinds, free, tm.parsed, tm.part, tm.samples)
    blind._own = tuple(nums)
    blind._own_fixed = blind._fixed(blind._own)
    assert not tp._check(blind, "datasets", pieces, nums)
