"""Probe files are written by any local user: a real report, damaged every way a hostile or broken writer can
(NaN, infinities, negative and absurd numbers, the wrong types, deep nesting, byte flips, truncation), is read
field by field: a number that cannot be believed is left out with a note, a file that cannot be read costs only
itself, and nothing raises."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import pytest

import dltop.probe as probe
from dltop.model import ProbesPart, Snapshot
from dltop.probe.files import open_private_dir, write_atomic
from dltop.sources.probes import MAX_BYTES, MAX_DEPTH, read_probes
from tests.probe_helpers import REPO, probe_env

ME = os.getuid()

# A real training loop with the probe (real torch on the CPU, real epochs, a data_dir): its file is the seed
# every damaged input below starts from.
TRAIN = """
import json, sys, time, torch, dltop.probe as probe
model = torch.nn.Linear(16, 16)
probe.watch_model(model)
def loader():
    for _ in range(5):
        time.sleep(0.005)
        yield torch.zeros(2, 16)
for epoch in range(3):
    for x in probe.track(loader(), data_dir=sys.argv[1], batch_size=2, tokens=lambda b: b.numel()):
        probe.log(loss=model(x).sum())
    probe.mark_epoch()
print(json.dumps(probe.report()), flush=True)
"""


@pytest.fixture(scope="module")
def real_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0, the test extra)")
    tmp = tmp_path_factory.mktemp("probe-seed")
    r = subprocess.run([sys.executable, "-c", TRAIN, str(tmp)], env=probe_env(tmp), cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["devices"] and len(doc["epochs"]) == 3 and doc["data"]["recent_steps"]
    assert doc["data"]["recent_samples"] and doc["loss"]["logged"] == 15 and doc["epochs"][0]["tokens"] == 160
    # this process's identity, so the file passes the liveness checks and every field is looked at
    mine = probe.report()
    return {**doc, "pid": mine["pid"], "start_time_ticks": mine["start_time_ticks"], "uid": ME}


@pytest.fixture
def pdir(tmp_path: Path) -> Path:
    d = tmp_path / "dltop"
    os.close(open_private_dir(str(d)))
    return d


def _write(pdir: Path, data: bytes, name: str | None = None) -> None:
    fd = os.open(pdir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        write_atomic(fd, name or f"{os.getpid()}.json", data)
    finally:
        os.close(fd)


def _read(pdir: Path) -> ProbesPart:
    return read_probes([(str(pdir), ME)])


def _numbers(obj: Any, path: str = "") -> list[tuple[str, float]]:
    """Every number in a parsed probe, with its path."""
    if is_dataclass(obj):
        return [n for f in fields(obj) for n in _numbers(getattr(obj, f.name), f"{path}.{f.name}")]
    if isinstance(obj, dict):
        return [n for k, v in obj.items() for n in _numbers(v, f"{path}.{k}")]
    if isinstance(obj, list | tuple):
        return [n for i, v in enumerate(obj) for n in _numbers(v, f"{path}[{i}]")]
    if isinstance(obj, int | float) and not isinstance(obj, bool):
        return [(path, obj)]
    return []


def _check(part: ProbesPart) -> None:
    """What a reader may hand on: one file is one probe or one reason; every number finite and within bounds;
    the part survives the Snapshot's strict JSON."""
    assert len(part.processes) + len(part.ignored) == 1, part
    for i in part.ignored:
        assert i.reason and "\n" not in i.reason and len(i.reason) < 300, i.reason
    for p in part.processes:
        for where, v in _numbers(p):
            assert math.isfinite(v), where
            if "cached_delta" not in where and not where.endswith(".loss"):  # a loss may be negative
                assert 0 <= v <= max(MAX_BYTES, 2**53), (where, v)
        assert p.data_wait_fraction is None or 0 <= p.data_wait_fraction <= 1
        for why in p.unavailable.values():
            assert "\n" not in why and len(why) < 300
    json.loads(Snapshot(ts=1.0, host="h", probes=part).to_json())  # allow_nan is off in the encoder


def test_nan_in_another_users_file_costs_only_that_number(pdir: Path, real_report: dict) -> None:
    data = json.dumps({**real_report, "data": {**real_report["data"], "recent_wait_s": 1.0}})
    _write(pdir, data.replace('"recent_wait_s": 1.0', '"recent_wait_s": NaN').encode())
    part = _read(pdir)
    (p,) = part.processes
    assert p.data_wait_fraction is None and p.step_time_s is None
    assert "data.recent_wait_s" in p.unavailable
    # the rest of the file is still believed
    assert p.weights_bytes == real_report["devices"]["cpu"]["weights_bytes"] and len(p.epochs) == 3
    _check(part)


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "-1", "1e400", "9" * 400, '"12"', "true"])
def test_an_unbelievable_epoch_number_drops_that_epoch_with_a_note(pdir: Path, real_report: dict, value: str) -> None:
    doc = json.loads(json.dumps(real_report))
    doc["epochs"][1]["duration_s"] = "@@"
    _write(pdir, json.dumps(doc).replace('"@@"', value).encode())
    part = _read(pdir)
    (p,) = part.processes
    assert [e.index for e in p.epochs] == [real_report["epochs"][0]["index"], real_report["epochs"][2]["index"]]
    assert p.unavailable["epochs[1]"].startswith("epochs[1] left out: duration_s: ")
    _check(part)


def test_an_absurd_size_on_a_device_is_not_summed(pdir: Path, real_report: dict) -> None:
    doc = json.loads(json.dumps(real_report))
    doc["devices"]["cpu"]["weights_bytes"] = 10**30
    _write(pdir, json.dumps(doc).encode())
    (p,) = _read(pdir).processes
    assert p.weights_bytes is None and "devices.cpu" in p.unavailable["weights_bytes"]


def test_a_deeply_nested_file_costs_only_itself(pdir: Path, real_report: dict) -> None:
    good = json.dumps(real_report).encode()
    _write(pdir, good)
    _write(pdir, b"[" * 4000 + b"]" * 96, name="1.json")  # 4 KiB of nesting, as in the report
    part = read_probes([(str(pdir), ME)])
    assert [p.pid for p in part.processes] == [real_report["pid"]]
    (bad,) = part.ignored
    assert bad.path.endswith("/1.json") and bad.reason == f"malformed: nested deeper than {MAX_DEPTH} levels"


def test_nesting_inside_strings_is_not_nesting(pdir: Path, real_report: dict) -> None:
    _write(pdir, json.dumps({**real_report, "job_id": "python -c '" + "[{" * 500 + "\\\"'"}).encode())
    (p,) = _read(pdir).processes
    assert p.job_id is not None and p.job_id.startswith("python -c '[{[{")


def _mutations(seed: bytes, rng: random.Random, n: int) -> list[bytes]:
    """`n` damaged copies of `seed`: truncations, byte flips, inserted bytes, numbers swapped for hostile ones,
    values swapped for other types, nesting added."""
    hostile = [b"NaN", b"Infinity", b"-Infinity", b"-1", b"-0.0", b"1e400", b"9" * 400, b"1" * 5000, b"true",
               b'"x"', b"null", b"[]", b"{}", b"[" * 50 + b"]" * 50, b'"\\u001b]0;pwned\\u0007"', b"1.5"]
    numbers = [(m.start(), m.end()) for m in __import__("re").finditer(rb"-?\d+(\.\d+)?(e-?\d+)?", seed)]
    out = []
    for i in range(n):
        kind = i % 4
        b = bytearray(seed)
        if kind == 0:
            b = b[: rng.randrange(len(b))]
        elif kind == 1:
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(len(b))] = rng.randrange(256)
        elif kind == 2:
            start, end = numbers[rng.randrange(len(numbers))]
            b[start:end] = rng.choice(hostile)
        else:
            at = rng.randrange(len(b))
            b[at:at] = rng.choice([b"\x00", b"\xff", b"\\", b'"', b"[", b"{", b",", b"]]]"])
        out.append(bytes(b))
    return out


def test_fuzz_damaged_real_probe_files(pdir: Path, real_report: dict) -> None:
    seed = json.dumps(real_report).encode()
    rng = random.Random(17)
    inputs = _mutations(seed, rng, 1500)
    read = ignored = 0
    for data in inputs:
        _write(pdir, data)
        part = _read(pdir)
        _check(part)
        read += len(part.processes)
        ignored += len(part.ignored)
    print(f"probe reader fuzz: {len(inputs)} damaged real files: {read} read (bad fields left out), "
          f"{ignored} ignored with a reason")
    assert read + ignored == len(inputs) and read > 100 and ignored > 100


def _depth_by_bytes(raw: bytes, limit: int) -> int:
    """The byte-by-byte scan nesting_depth replaced: the reference it must agree with."""
    depth = deepest = 0
    in_string = escaped = False
    for b in raw:
        if in_string:
            if escaped:
                escaped = False
            elif b == 0x5C:
                escaped = True
            elif b == 0x22:
                in_string = False
        elif b == 0x22:
            in_string = True
        elif b in (0x5B, 0x7B):
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    break
        elif b in (0x5D, 0x7D):
            depth -= 1
    return deepest


DEPTH_TRIED: list[bytes] = []


def test_nesting_depth_agrees_with_a_scan_byte_by_byte() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from dltop.sources.probes import nesting_depth

    # JSON's structural bytes, quotes and backslashes dense enough to make strings open, escape and run off the end.
    json_ish = st.lists(st.sampled_from([b"[", b"]", b"{", b"}", b'"', b"\\", b"a", b":", b",", b"\n", b"\xff"]),
                        max_size=200).map(b"".join)

    @settings(max_examples=400, derandomize=True, deadline=None, database=None)
    @given(raw=st.one_of(json_ish, st.binary(max_size=300)), limit=st.integers(0, 12))
    def agree(raw: bytes, limit: int) -> None:
        DEPTH_TRIED.append(raw)
        assert nesting_depth(raw, limit) == _depth_by_bytes(raw, limit)

    agree()
    for raw in (b'"' + b'\\"' * 2000, b'["\\', b'["a\\"]"]', b"[" * 4000, json.dumps({"a": [{"b": "[[["}]}).encode()):
        assert nesting_depth(raw, MAX_DEPTH) == _depth_by_bytes(raw, MAX_DEPTH)
    print(f"nesting_depth: {len(DEPTH_TRIED)} inputs tried")
    assert len(DEPTH_TRIED) >= 400


def test_a_file_that_has_not_changed_is_not_parsed_again(pdir: Path, real_report: dict,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import dltop.sources.probes as probes

    parsed: list[str] = []
    real_parse = probes._parse_file

    def counting(raw: bytes, path: str, uid: int) -> Any:
        parsed.append(os.path.basename(path))
        return real_parse(raw, path, uid)

    monkeypatch.setattr(probes, "_parse_file", counting)
    memo: dict[Any, Any] = {}
    good = json.dumps(real_report).encode()
    _write(pdir, good)
    _write(pdir, b"[" * 4000, name="1.json")
    first = read_probes([(str(pdir), ME)], memo=memo)
    assert sorted(parsed) == ["1.json", f"{os.getpid()}.json"]
    again = read_probes([(str(pdir), ME)], memo=memo)
    assert len(parsed) == 2  # the same bytes: neither parsed again, the bad one still reported
    assert again.ignored == first.ignored and [p.pid for p in again.processes] == [p.pid for p in first.processes]
    assert again.processes[0].weights_bytes == first.processes[0].weights_bytes
    # New bytes (the job published again) are parsed; a file gone leaves the memo.
    _write(pdir, json.dumps({**real_report, "job_id": "python train.py --again"}).encode())
    os.unlink(pdir / "1.json")
    (p,) = read_probes([(str(pdir), ME)], memo=memo).processes
    assert parsed[2:] == [f"{os.getpid()}.json"] and p.job_id == "python train.py --again"
    assert len(memo) == 1
    # Without a memo (the default: a one-shot read) every file is parsed every time.
    read_probes([(str(pdir), ME)])
    assert len(parsed) == 4
