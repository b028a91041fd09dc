"""The GPU source through its real code path: every scenario file on the fake NVML backend (machine shapes, old
drivers, MIG, unified memory, each failure), the real pynvml backend on this GPU-less machine, and
`dltop snapshot --json` as a subprocess on a scenario."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pynvml
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dltop.model import GpuDevice, Snapshot, Unavailable
from dltop.model.gpu import NO_PROBE, SPLIT_FIELDS
from dltop.sampler import Sampler
from dltop.sources.base import Source
from dltop.sources.gpu import (
    FAKE_ENV,
    NO_PROCESS_MEMORY,
    FakeBackend,
    GpuReader,
    PynvmlBackend,
    ScenarioError,
    parse_cmdline,
)
from dltop.sources.memory import parse_meminfo
from tests.conftest import DATA, REPO

SCENARIOS = DATA / "gpu-scenarios"


def scenario(name: str) -> dict[str, Any]:
    return json.loads((SCENARIOS / f"{name}.json").read_text())


def read(s: dict[str, Any], root: str = "/") -> tuple[GpuDevice, ...] | Unavailable:
    return GpuReader(lambda: FakeBackend(s), root).read()


def devices(s: dict[str, Any], root: str = "/") -> tuple[GpuDevice, ...]:
    part = read(s, root)
    assert isinstance(part, tuple), part
    return part


class Recording(FakeBackend):
    """The fake, noting every session and process call it is asked for."""

    def __init__(self, s: dict[str, Any]) -> None:
        super().__init__(s)
        self.calls: list[tuple[Any, ...]] = []

    def init(self) -> None:
        self.calls.append(("init",))
        super().init()

    def shutdown(self) -> None:
        self.calls.append(("shutdown",))
        super().shutdown()

    def processes(self, h: Any, kind: Any, version: int) -> Any:
        self.calls.append(("processes", kind, version))
        return super().processes(h, kind, version)


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.json")), ids=lambda p: p.stem)
def test_every_scenario_reads_and_roundtrips(path: Path) -> None:
    s = json.loads(path.read_text())
    part = read(s)
    snap = Snapshot(ts=1.0, host="h", gpus=part)
    assert Snapshot.from_json(snap.to_json()) == snap
    if "init_error" in s:
        assert isinstance(part, Unavailable) and s["init_error"] in part.reason
        return
    if not s["gpus"]:
        assert isinstance(part, Unavailable) and "no GPUs" in part.reason and s["driver_version"] in part.reason
        return
    assert isinstance(part, tuple) and [g.index for g in part] == list(range(len(s["gpus"])))
    for g, want in zip(part, s["gpus"], strict=True):
        if "error" in want:
            continue
        assert (g.name, g.uuid, g.bus_id, g.driver_version) == (want["name"], want["uuid"], want["bus_id"],
                                                                 s["driver_version"])
        if isinstance(want["memory"], dict):
            assert g.memory_total_bytes == want["memory"]["total"]
        assert isinstance(g.processes, tuple)
        assert sorted(p.pid for p in g.processes) == sorted(p["pid"] for p in want["compute_processes"])
        for p in g.processes:
            # Without the probe, every split number is unknown and says why; none is a made-up 0.
            assert all(getattr(p.split, f) is None for f in SPLIT_FIELDS)
            assert p.split.unavailable == dict.fromkeys(SPLIT_FIELDS, NO_PROBE)
        # Every None has its reason.
        for f in GpuDevice.__dataclass_fields__:
            if getattr(g, f) is None and f not in ("memory_pool_note", "down"):  # down: None is "it answers"
                assert g.why(f), f


def test_h100_numbers_are_nvml_s() -> None:
    s = scenario("h100-2proc")
    (g,) = devices(s)
    m = s["gpus"][0]["memory"]
    assert (g.memory_pool, g.memory_used_bytes, g.memory_free_bytes, g.memory_reserved_bytes) == (
        "framebuffer", m["used"], m["free"], m["reserved"])
    assert g.power_mw == s["gpus"][0]["power_mw"] and g.clock_sm_mhz == 1980
    assert g.pcie_rx_bytes_per_s == s["gpus"][0]["pcie_kb_per_s"]["rx"] * 1024  # NVML counts KB/s
    assert g.retired_pages_dbe is None and "NVML_ERROR_NOT_SUPPORTED" in (g.why("retired_pages_dbe") or "")
    used = {p.pid: p.used_bytes for p in g.processes}  # type: ignore[union-attr]
    assert used == {p["pid"]: p["used_bytes"] for p in s["gpus"][0]["compute_processes"]}
    first = {p.pid: p.gpu_util_percent for p in g.processes}  # type: ignore[union-attr]
    assert first == {p["pid"]: p["sm"] for p in s["gpus"][0]["process_utilization"]}


def test_utilization_samples_are_taken_once() -> None:
    """nvmlDeviceGetProcessUtilization is asked for samples newer than the last seen: none newer is a reason."""
    reader = GpuReader(lambda: FakeBackend(scenario("h100-2proc")))
    reader.read()
    (g,) = reader.read()  # type: ignore[misc]
    for p in g.processes:
        assert p.gpu_util_percent is None and "NVML_ERROR_NOT_FOUND" in p.unavailable["gpu_util_percent"]


@pytest.mark.parametrize(("name", "versions"), [("old-driver-470", [3, 2]), ("old-driver-418", [3, 2, 1])])
def test_old_drivers_fall_back_v3_v2_v1_once(name: str, versions: list[int]) -> None:
    s = scenario(name)
    backend = Recording(s)
    reader = GpuReader(lambda: backend)
    (g,) = reader.read()  # type: ignore[misc]
    tried = [c[2] for c in backend.calls if c[:2] == ("processes", "compute")]
    assert tried == versions
    m = s["gpus"][0]["memory"]
    # The v1 memory call: used includes the driver's reserve, which is not reported.
    assert g.memory_used_bytes == m["used"] + m["reserved"] and g.memory_reserved_bytes is None
    assert "nvmlDeviceGetMemoryInfo_v2" in (g.why("memory_reserved_bytes") or "")
    assert [p.used_bytes for p in g.processes] == [20401094656]  # type: ignore[union-attr]
    backend.calls.clear()
    reader.read()
    assert [c[2] for c in backend.calls if c[:2] == ("processes", "compute")] == versions[-1:]


def test_mig_instances_under_their_parent() -> None:
    s = scenario("a100-mig")
    (g,) = devices(s)
    assert g.mig_mode is True
    assert "NVML_ERROR_NOT_SUPPORTED" in (g.why("utilization_gpu_percent") or "")
    want = [m for m in s["gpus"][0]["mig_devices"] if m is not None]
    assert [m.uuid for m in g.mig_devices] == [m["uuid"] for m in want]  # empty slots are skipped
    assert [m.mig_index for m in g.mig_devices] == [0, 1, 2]
    m0 = g.mig_devices[0]
    assert (m0.gpu_instance_id, m0.memory_total_bytes) == (1, want[0]["memory"]["total"])
    assert isinstance(m0.processes, tuple) and [(p.pid, p.used_bytes, p.gpu_instance_id) for p in m0.processes] == [
        (5511, 15032385536, 1)]
    # The parent's own list has no per-process memory (MIG without admin rights), and says so.
    assert isinstance(g.processes, tuple)
    assert all(p.used_bytes is None and p.unavailable["used_bytes"] == NO_PROCESS_MEMORY for p in g.processes)


@pytest.mark.parametrize("memory", ["NVML_ERROR_NOT_SUPPORTED", {"total": 0, "used": 0, "free": 0, "reserved": 0}])
def test_unified_memory_shows_system_memory(proc_root: Path, memory: Any) -> None:
    s = scenario("gb10-unified")
    s["gpus"][0]["memory"] = memory
    (g,) = devices(s, str(proc_root))
    meminfo = parse_meminfo((proc_root / "proc/meminfo").read_text())
    assert g.memory_pool == "system"
    assert g.memory_total_bytes == meminfo["MemTotal"]
    assert g.memory_free_bytes == meminfo["MemAvailable"]
    assert g.memory_used_bytes == meminfo["MemTotal"] - meminfo["MemAvailable"]
    assert g.memory_pool_note and "unified memory" in g.memory_pool_note
    assert ("Not Supported" in g.memory_pool_note) == isinstance(memory, str)


def test_unified_memory_without_meminfo_says_so(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (g,) = devices(scenario("gb10-unified"), str(tmp_path))
    assert g.memory_total_bytes is None and "could not be read" in (g.why("memory_total_bytes") or "")


def test_lost_gpu_keeps_its_place() -> None:
    s = scenario("gpu-lost")
    g0, g1 = devices(s)
    assert g0.memory_total_bytes == s["gpus"][0]["memory"]["total"]
    assert g1.index == 1 and g1.name is None and g1.memory_used_bytes is None
    assert "NVML_ERROR_GPU_IS_LOST" in (g1.why("memory_used_bytes") or "") and "fallen off the bus" in (
        g1.why("name") or "")
    assert isinstance(g1.processes, Unavailable) and "GPU_IS_LOST" in g1.processes.reason
    assert (g0.down, g1.down) == (None, "lost")


def test_a_gpu_lost_during_the_session_keeps_its_name_and_says_lost() -> None:
    # The series of a GPU that falls off the bus goes to 0 under the labels it had (its UUID from the reads
    # before), so the alert names the GPU and a dashboard's line does not jump to another series.
    s = scenario("two-gpus")
    backend = FakeBackend(s)
    reader = GpuReader(lambda: backend)
    before = reader.read()
    assert isinstance(before, tuple) and all(g.down is None for g in before)
    s["gpus"][1]["error"] = "NVML_ERROR_GPU_IS_LOST"
    after = reader.read()
    assert isinstance(after, tuple)
    assert after[1].down == "lost" and after[1].memory_total_bytes is None
    assert (after[1].uuid, after[1].name, after[1].bus_id) == (before[1].uuid, before[1].name, before[1].bus_id)
    assert after[0].down is None and after[0].memory_total_bytes == before[0].memory_total_bytes


@pytest.mark.parametrize(("error", "word"), [("NVML_ERROR_NO_PERMISSION", "no_permission"),
                                             ("NVML_ERROR_UNKNOWN", "error")])
def test_a_gpu_whose_handle_fails_is_down_with_a_word_of_a_fixed_set(error: str, word: str) -> None:
    s = scenario("two-gpus")
    s["gpus"][0]["error"] = error
    g0, g1 = devices(s)
    assert (g0.down, g1.down) == (word, None) and error in (g0.why("memory_total_bytes") or "")


@pytest.mark.parametrize(("name", "absent"), [("library-not-found", "no_library"), ("driver-not-loaded", "no_driver"),
                                              ("no-gpus", "no_devices"), ("no-permission", None),
                                              ("version-mismatch", None)])
def test_no_gpu_here_is_a_state_and_an_error_on_a_gpu_machine_is_not(name: str, absent: str | None) -> None:
    part = read(scenario(name))
    assert isinstance(part, Unavailable) and part.absent == absent and part.reason


def test_lost_mid_read_keeps_what_was_read() -> None:
    s = scenario("h100-2proc")
    s["gpus"][0]["temperature_c"] = "NVML_ERROR_GPU_IS_LOST"
    (g,) = devices(s)
    assert g.name == s["gpus"][0]["name"] and g.memory_total_bytes is not None
    assert g.temperature_c is None and g.power_mw is None and "GPU_IS_LOST" in (g.why("power_mw") or "")
    assert isinstance(g.processes, Unavailable)


def test_container_processes_without_memory_or_proc_entry(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (g,) = devices(scenario("container"), str(tmp_path))
    assert isinstance(g.processes, tuple) and len(g.processes) == 2
    for p in g.processes:
        assert p.used_bytes is None and "NVML_VALUE_NOT_AVAILABLE" in p.unavailable["used_bytes"]
        assert p.user is None and "--pid=host" in p.unavailable["user"] and str(p.pid) in p.unavailable["command"]


def test_a_real_process_gets_its_user_and_command() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        deadline = time.monotonic() + 10  # until the child has exec'd: its cmdline is sleep's, not ours
        while Path(f"/proc/{child.pid}/cmdline").read_bytes() != b"sleep\x0030\x00":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        s = scenario("h100-2proc")
        s["gpus"][0]["compute_processes"][0]["pid"] = child.pid
        (g,) = devices(s)
        p = next(p for p in g.processes if p.pid == child.pid)  # type: ignore[union-attr]
        assert (p.user, p.command) == (pwd.getpwuid(os.getuid()).pw_name, "sleep 30")
        assert "user" not in p.unavailable
    finally:
        child.kill()
        child.wait()


def test_one_session_for_the_life_of_the_source() -> None:
    backend = Recording(scenario("two-gpus"))
    made = []

    def make() -> Recording:
        made.append(backend)
        return backend

    reader = GpuReader(make)
    src = Source(name="gpus", interval_s=1.0, read=reader.read, close=reader.close)
    sampler = Sampler([src])
    for _ in range(3):
        snap = sampler.read_once()
        assert isinstance(snap.gpus, tuple) and len(snap.gpus) == 2
    sampler.close()
    sampler._states["gpus"].executor.join(10)  # the close runs on the source's own thread
    assert len(made) == 1
    assert [c for c in backend.calls if c[0] != "processes"] == [("init",), ("shutdown",)]


def test_a_session_that_breaks_is_reopened() -> None:
    s = scenario("h100-2proc")
    backends: list[Recording] = []

    def make() -> Recording:
        backends.append(Recording(s))
        return backends[-1]

    reader = GpuReader(make)
    assert isinstance(reader.read(), tuple)
    backends[0].initialized = False  # the driver went away under the session: calls say UNINITIALIZED
    part = reader.read()
    assert isinstance(part, Unavailable) and "NVML_ERROR_UNINITIALIZED" in part.reason
    assert isinstance(reader.read(), tuple) and len(backends) == 2


def test_real_nvml_here_is_a_reason_not_a_crash() -> None:
    """This machine has no NVIDIA driver: the real backend must say so, as the Snapshot's `gpus`."""
    reader = GpuReader(PynvmlBackend)
    part = reader.read()
    reader.close()
    if isinstance(part, tuple):
        pytest.skip("this machine has a working NVIDIA driver")
    assert isinstance(part, Unavailable)
    assert "NVML_ERROR_LIBRARY_NOT_FOUND" in part.reason or "NVML_ERROR_DRIVER_NOT_LOADED" in part.reason


def test_error_names_are_pynvml_s() -> None:
    # The fake raises what pynvml raises: the NVMLError subclass of the real code.
    s = scenario("driver-not-loaded")
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        FakeBackend(s).init()


def _dltop(*args: str, scenario_path: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, FAKE_ENV: str(scenario_path)}
    return subprocess.run([sys.executable, "-m", "dltop", *args], capture_output=True, text=True, cwd=REPO,
                          env=env, timeout=60)


def test_snapshot_json_on_two_gpus() -> None:
    s = scenario("two-gpus")
    r = _dltop("snapshot", "--json", scenario_path=SCENARIOS / "two-gpus.json")
    assert r.returncode == 0, r.stderr
    gpus = json.loads(r.stdout)["gpus"]
    assert [g["index"] for g in gpus] == [0, 1]
    for g, want in zip(gpus, s["gpus"], strict=True):
        assert (g["name"], g["uuid"], g["memory_total_bytes"], g["memory_used_bytes"]) == (
            want["name"], want["uuid"], want["memory"]["total"], want["memory"]["used"])
        assert [(p["pid"], p["used_bytes"]) for p in g["processes"]] == [
            (p["pid"], p["used_bytes"]) for p in want["compute_processes"]]
        for p in g["processes"]:
            assert p["split"]["weights_bytes"] is None and p["split"]["unavailable"]["non_torch_bytes"] == NO_PROBE


@pytest.mark.parametrize(("name", "says"), [("library-not-found", "NVML_ERROR_LIBRARY_NOT_FOUND"),
                                            ("version-mismatch", "NVML_ERROR_LIB_RM_VERSION_MISMATCH")])
def test_snapshot_json_when_nvml_cannot_be_used(name: str, says: str) -> None:
    r = _dltop("snapshot", scenario_path=SCENARIOS / f"{name}.json")
    assert r.returncode == 0, r.stderr
    gpus = json.loads(r.stdout)["gpus"]
    # No library is "no GPU here", a state: it says so beside the reason; a version mismatch is a failure.
    want = {"library-not-found": ["unavailable", "absent"], "version-mismatch": ["unavailable"]}[name]
    assert list(gpus) == want and says in gpus["unavailable"]
    assert gpus.get("absent") == ("no_library" if name == "library-not-found" else None)


def test_snapshot_json_with_a_broken_scenario(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"gpus": [{"memory": {"total": "lots"}}]}')
    r = _dltop("snapshot", scenario_path=bad)
    assert r.returncode == 0 and "Traceback" not in r.stderr
    reason = json.loads(r.stdout)["gpus"]["unavailable"]
    assert str(bad) in reason and "gpus[0].memory.total" in reason


def test_scenario_errors_name_the_problem() -> None:
    with pytest.raises(ScenarioError, match="NVML_ERROR_NOPE is not an NVML error code"):
        FakeBackend({"init_error": "NVML_ERROR_NOPE"})
    with pytest.raises(ScenarioError, match="not JSON"):
        FakeBackend.from_file(str(REPO / "README.md"))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 1 << 40) | st.sampled_from(
        ["NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_NO_PERMISSION", "x"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(
        ["gpus", "memory", "total", "used", "free", "reserved", "pid", "used_bytes", "compute_processes",
         "mig_mode", "mig_devices", "mig_max_devices", "utilization", "gpu", "error", "name",
         "process_utilization", "timestamp_us", "sm", "mem", "instance_ids", "compute"]), inner, max_size=5),
    max_leaves=25)


@settings(max_examples=300, deadline=None)
@given(json_values)
@example({"gpus": [{"utilization": {"gpu": "NVML_ERROR_NOT_SUPPORTED", "memory": 1},
                    "memory": {"total": 1, "used": "NVML_ERROR_NO_PERMISSION", "free": 0, "reserved": 0}}]})
def test_any_scenario_is_read_or_refused(data: Any) -> None:
    """Whatever a scenario says, the source answers a part or a reason, never an exception."""
    reader = GpuReader(lambda: FakeBackend(data))
    part = reader.read()
    assert isinstance(part, tuple | Unavailable)
    snap = Snapshot(ts=0.0, host="h", gpus=part)
    assert Snapshot.from_json(snap.to_json()) == snap


@given(st.lists(st.binary(min_size=1).filter(lambda b: b"\0" not in b), min_size=1, max_size=6))
def test_parse_cmdline(args: list[bytes]) -> None:
    raw = b"\0".join(args) + b"\0"
    assert parse_cmdline(raw) == " ".join(os.fsdecode(a) for a in args)
    assert parse_cmdline(raw[:-1]) == parse_cmdline(raw)  # a cmdline rewritten without its last NUL


def test_a_gpu_s_name_uuid_and_pci_address_are_asked_until_answered_then_kept_for_the_session() -> None:
    # nvmlDeviceGetName / _GetUUID / _GetPciInfo are the board's: asked once a session (nvitop keeps them too),
    # again where a call failed, and again in a new session (an index is stable only within one).
    class Counting(FakeBackend):
        asked: list[tuple[str, int]] = []

        def name(self, h: Any) -> str:
            self.asked.append(("name", self.s["gpus"].index(h.gpu)))
            return super().name(h)

        def uuid(self, h: Any) -> str:
            self.asked.append(("uuid", self.s["gpus"].index(h.gpu)))
            return super().uuid(h)

    s = scenario("two-gpus")
    real_uuid = s["gpus"][1]["uuid"]
    s["gpus"][1]["uuid"] = "NVML_ERROR_UNKNOWN"
    reader = GpuReader(lambda: Counting(s))
    first = reader.read()
    assert isinstance(first, tuple) and first[1].uuid is None and "NVML_ERROR_UNKNOWN" in (first[1].why("uuid") or "")
    s["gpus"][1]["uuid"] = real_uuid
    s["gpus"][0]["name"] = "renamed behind NVML's back"  # not what a board does: shows the kept answer
    for _ in range(3):
        again = reader.read()
        assert isinstance(again, tuple)
        assert (again[0].name, again[1].uuid) == (first[0].name, real_uuid) and not again[1].why("uuid")
    assert sorted(Counting.asked) == [("name", 0), ("name", 1), ("uuid", 0), ("uuid", 1), ("uuid", 1)]
    reader.close()
    fresh = reader.read()  # a new session asks again
    assert isinstance(fresh, tuple) and fresh[0].name == "renamed behind NVML's back"


def test_the_same_reasons_are_one_dict_across_ticks_and_processes() -> None:
    """The history keeps every Snapshot: a GPU's or a process's reasons, the same tick after tick, are the dict
    read before (equal, and one object), not a new dict and new strings each tick."""
    from dltop.sources.gpu import FakeBackend as Fake

    s = scenario("8gpu-20proc")
    reader = GpuReader(lambda: Fake(s))
    first, second = reader.read(), reader.read()
    assert isinstance(first, tuple) and isinstance(second, tuple)
    for a, b in zip(first, second, strict=True):
        assert a.unavailable == b.unavailable and a.unavailable is b.unavailable
        pa, pb = a.processes, b.processes
        assert isinstance(pa, tuple) and isinstance(pb, tuple)
        for x, y in zip(pa, pb, strict=True):
            if x.unavailable == y.unavailable:
                assert x.unavailable is y.unavailable
    assert any(x.unavailable for g in second for x in g.processes)  # type: ignore[union-attr]
