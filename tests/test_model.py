"""The Snapshot round-trips through JSON exactly, and refuses data of the wrong shape with a clear error."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dltop.model import (
    SCHEMA_VERSION,
    DecodeError,
    MemoryPart,
    Pressure,
    Snapshot,
    Unavailable,
    VmStat,
    from_dict,
    to_dict,
)
from dltop.sampler import Sampler
from dltop.sources.memory import read_memory
from tests.conftest import strict_json


def test_real_snapshot_roundtrips(proc_root: Path) -> None:
    snap = Snapshot(ts=1.5, host="h", uptime_s=3.0, memory=read_memory(str(proc_root)))
    assert Snapshot.from_json(snap.to_json()) == snap


def test_recorded_session_roundtrips(session: list[Snapshot]) -> None:
    for snap in session:
        assert Snapshot.from_json(snap.to_json()) == snap


def test_unavailable_part_keeps_its_reason() -> None:
    snap = Snapshot(ts=0.0, host="h", memory=Unavailable("permission denied reading /proc/meminfo"))
    data = json.loads(snap.to_json())
    assert data["memory"] == {"unavailable": "permission denied reading /proc/meminfo"}
    assert Snapshot.from_dict(data) == snap


def test_a_thing_this_machine_lacks_keeps_its_state_and_a_bad_state_is_refused() -> None:
    snap = Snapshot(ts=0.0, host="h", gpus=Unavailable("no NVIDIA driver here", "no_library"))
    data = json.loads(snap.to_json())
    assert data["gpus"] == {"unavailable": "no NVIDIA driver here", "absent": "no_library"}
    assert Snapshot.from_dict(data) == snap
    # a recording from before: no "absent", a failure as it was
    assert Snapshot.from_dict({**data, "gpus": {"unavailable": "x"}}).gpus == Unavailable("x")
    with pytest.raises(DecodeError):
        Snapshot.from_dict({**data, "gpus": {"unavailable": "x", "absent": 1}})


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.update(schema=SCHEMA_VERSION + 1), "schema"),
        (lambda d: d.pop("ts"), "missing field 'ts'"),
        (lambda d: d["memory"].update(total_bytes="12"), "total_bytes"),
        (lambda d: d["memory"].update(disks={"x": 1}), "disks"),
    ],
)
def test_wrong_shapes_are_refused(proc_root: Path, mutate, message: str) -> None:
    data = Snapshot(ts=1.0, host="h", memory=read_memory(str(proc_root))).to_dict()
    mutate(data)
    with pytest.raises(DecodeError, match=message):
        Snapshot.from_dict(data)


def test_not_json() -> None:
    with pytest.raises(DecodeError, match="not JSON"):
        Snapshot.from_json('{"ts": 1,')


opt_int = st.one_of(st.none(), st.integers(0, 2**63))
finite = st.floats(allow_nan=False, allow_infinity=False)


@given(
    total=opt_int, cached=opt_int, dirty=opt_int,
    psi=st.one_of(st.builds(Pressure, finite, finite, finite, st.integers(0, 2**63)), st.builds(Unavailable, st.text())),
    vm=st.builds(VmStat, pgpgin=opt_int, oom_kill=opt_int,
                 unavailable=st.dictionaries(st.text(max_size=5), st.text(max_size=20), max_size=3)),
    ts=finite,
)
def test_generated_parts_roundtrip(total, cached, dirty, psi, vm, ts) -> None:
    part = MemoryPart(total_bytes=total, cached_bytes=cached, dirty_bytes=dirty, pressure_io=psi, vmstat=vm)
    snap = Snapshot(ts=ts, host="h", memory=part)
    assert Snapshot.from_json(snap.to_json()) == snap
    assert from_dict(MemoryPart, json.loads(json.dumps(to_dict(part)))) == part


def test_sampler_snapshot_roundtrips_with_statuses() -> None:
    from dltop.config import Settings
    from dltop.sources.registry import build_sources

    sampler = Sampler(build_sources(Settings()))
    try:
        snap = sampler.read_once()
    finally:
        sampler.close()
    assert snap.sources["memory"].last_ok_ts is not None
    assert Snapshot.from_json(snap.to_json()) == snap
    assert Snapshot.from_json(replace(snap, cpu=None).to_json()).cpu is None


@given(names=st.lists(st.binary(min_size=1, max_size=12).filter(lambda b: b"/" not in b and b"\0" not in b),
                      min_size=1, max_size=4))
def test_paths_that_are_not_utf8_roundtrip_exactly_and_write_valid_utf8(names: list[bytes]) -> None:
    """Every string in the JSON is valid UTF-8 (no lone surrogates), and the exact bytes come back."""
    from dltop.model import DatasetsPart
    from dltop.model.datasets import DatasetResidency, ResidencyNode

    paths = ["/data/" + os.fsdecode(n) for n in names]
    ds = DatasetResidency(
        path=paths[0], children=tuple(ResidencyNode(path=p) for p in paths[1:]), problems=tuple(paths),
        unknown_reason=paths[-1], skipped={"symlink": 1},
    )
    snap = Snapshot(ts=1.0, host="h", datasets=DatasetsPart(paths=(ds,)),
                    memory=Unavailable(f"cannot read {paths[0]}"))
    text = snap.to_json()
    data = strict_json(text)
    assert Snapshot.from_json(text) == snap
    top = data["datasets"]["paths"][0]
    assert top["path"] == "/data/" + names[0].decode("utf-8", "backslashreplace")
    assert ("_b64" in text) == any(not _is_utf8(n) for n in names)


def _is_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_b64_sibling_of_the_wrong_shape_is_refused() -> None:
    from dltop.model import DatasetsPart
    from dltop.model.datasets import DatasetResidency

    data = Snapshot(ts=1.0, host="h", datasets=DatasetsPart(paths=(DatasetResidency(path="/d/" + os.fsdecode(b"\xfe")),))).to_dict()
    data["datasets"]["paths"][0]["path_b64"] = "not base64!"
    with pytest.raises(DecodeError, match="path_b64: not base64"):
        Snapshot.from_dict(data)


def test_omitted_fields_take_the_constructors_defaults() -> None:
    """A recording from before a field existed leaves it out: the decoded object is the one the constructor
    makes (defaults, default factories, __post_init__), not one with holes."""
    from dltop.model.datasets import ResidencyNode
    from dltop.model.gpu import GpuProcess

    proc = from_dict(GpuProcess, {"pid": 7, "used_bytes": 5})
    assert proc == GpuProcess(pid=7, used_bytes=5)
    other = from_dict(GpuProcess, {"pid": 8})
    assert other.unavailable == {} and other.unavailable is not proc.unavailable  # a fresh dict each
    node = from_dict(ResidencyNode, {"path": "/d", "pages": 10, "resident_pages": 4})
    assert node == ResidencyNode(path="/d", pages=10, resident_pages=4)
    assert (node.data_pages, node.data_resident_pages) == (10, 4)  # __post_init__ ran


def test_an_error_names_the_whole_path_to_the_field() -> None:
    from dltop.model.gpu import GpuDevice, GpuProcess

    snap = Snapshot(ts=1.0, host="h", gpus=(GpuDevice(index=0, processes=(GpuProcess(pid=1), GpuProcess(pid=2))),))
    data = snap.to_dict()
    data["gpus"][0]["processes"][1]["pid"] = "2"
    with pytest.raises(DecodeError, match=r"^Snapshot\.gpus\[0\]\.processes\[1\]\.pid: expected int$"):
        Snapshot.from_dict(data)
    data["gpus"][0]["processes"][1]["pid"] = True  # a bool is not an int here, though Python says it is one
    with pytest.raises(DecodeError, match=r"processes\[1\]\.pid: expected int"):
        Snapshot.from_dict(data)


def test_a_key_no_field_has_is_ignored_and_a_b64_sibling_still_applies() -> None:
    from dltop.model import DatasetsPart
    from dltop.model.datasets import DatasetResidency

    path = "/d/" + os.fsdecode(b"caf\xe9")
    snap = Snapshot(ts=1.0, host="h", datasets=DatasetsPart(paths=(DatasetResidency(path=path),)))
    data = snap.to_dict()
    data["datasets"]["paths"][0]["written_by_a_newer_dltop"] = 1
    assert Snapshot.from_dict(data) == snap
    assert Snapshot.from_dict(data).datasets.paths[0].path == path  # the exact bytes, from path_b64
