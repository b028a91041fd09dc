"""AMD GPUs through amdsmi: a fake `amdsmi` module with the real names, keys, units and AMDSMI_STATUS_* codes,
put in sys.modules the way `import amdsmi` finds it; the missing ROCm library played by a real package that does
what the real bindings do without it (two lines on stdout, then KeyError('libamd_smi.so'))."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dltop.model import GpuDevice, Snapshot, Unavailable
from dltop.sources.amd import FIRST_UTIL, MIB, NO_BINDINGS, NO_ROCM, AmdReader, import_amdsmi
from dltop.sources.amd_fake import fake_amdsmi
from dltop.sources.gpu import FakeBackend, GpuReader, GpusReader
from dltop.sources.gpu_procs import HostReader
from tests.conftest import DATA, REPO

SCENARIOS = DATA / "amd-scenarios"


def scenario(name: str) -> dict[str, Any]:
    return json.loads((SCENARIOS / f"{name}.json").read_text())


def no_identity() -> HostReader:
    """/proc facts from a /proc that holds no process: each one's are unknown, saying so."""
    return HostReader("/nonexistent/proc")


def reader(s: dict[str, Any], monkeypatch: pytest.MonkeyPatch, clock: list[float] | None = None) -> AmdReader:
    """An AmdReader that imports the scenario's fake through sys.modules, as it would the real bindings."""
    monkeypatch.setitem(sys.modules, "amdsmi", fake_amdsmi(s))
    now = clock if clock is not None else [100.0]
    return AmdReader(no_identity(), clock=lambda: now[0])


def gpus_of(part: Any) -> tuple[GpuDevice, ...]:
    assert isinstance(part, tuple), part
    return part


@pytest.mark.parametrize("name", ["mi300x", "w7900-rocm60", "no-permission"])
def test_every_none_has_its_reason_and_the_part_roundtrips(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    s = scenario(name)
    part = gpus_of(reader(s, monkeypatch).read())
    assert [g.index for g in part] == list(range(len(s["gpus"])))
    for g, want in zip(part, s["gpus"], strict=True):
        assert (g.backend, g.name, g.uuid, g.bus_id, g.driver_version) == (
            "amdsmi", want["name"], want["uuid"], want["bdf"], s["driver_version"])
        for f in GpuDevice.__dataclass_fields__:
            if getattr(g, f) is None and f not in ("memory_pool_note", "down"):
                assert g.why(f), f
    snap = Snapshot(ts=1.0, host="h", gpus=part)
    assert Snapshot.from_json(snap.to_json()) == snap


def test_mi300x_numbers_are_amdsmi_s_in_nvml_s_units(monkeypatch: pytest.MonkeyPatch) -> None:
    s = scenario("mi300x")
    g0, g1 = gpus_of(reader(s, monkeypatch).read())
    want = s["gpus"][0]
    assert g0.memory_total_bytes == want["vram_mb"]["vram_total"] * MIB  # amdsmi counts MB
    assert g0.memory_used_bytes == want["vram_mb"]["vram_used"] * MIB
    assert g0.memory_free_bytes == g0.memory_total_bytes - g0.memory_used_bytes
    assert (g0.utilization_gpu_percent, g0.utilization_memory_percent) == (98, 41)
    assert g0.power_mw == want["power_w"]["socket_power"] * 1000 and g0.power_limit_mw == 750_000
    assert (g0.clock_sm_mhz, g0.clock_mem_mhz) == (2100, 1300)
    assert g0.ecc_corrected_aggregate == 0 and g0.ecc_corrected_volatile is None
    assert isinstance(g0.processes, tuple)
    assert {p.pid: p.used_bytes for p in g0.processes} == {p["pid"]: p["vram_bytes"] for p in want["processes"]}
    assert g1.processes == ()


def test_a_board_without_an_edge_sensor_reads_its_hotspot(monkeypatch: pytest.MonkeyPatch) -> None:
    (mi300, _) = gpus_of(reader(scenario("mi300x"), monkeypatch).read())
    assert (mi300.temperature_c, mi300.temperature_sensor) == (71, "hotspot")
    (w7900,) = gpus_of(reader(scenario("w7900-rocm60"), monkeypatch).read())
    assert (w7900.temperature_c, w7900.temperature_sensor) == (54, "edge")
    s = scenario("mi300x")
    s["gpus"][0]["temperature_c"] = {"vram": 50}
    (none, _) = gpus_of(reader(s, monkeypatch).read())
    assert none.temperature_c is None
    why = none.why("temperature_c") or ""
    assert "edge:" in why and "hotspot:" in why and "AMDSMI_STATUS_NOT_SUPPORTED" in why


def test_power_falls_back_to_the_key_older_boards_fill(monkeypatch: pytest.MonkeyPatch) -> None:
    (w7900,) = gpus_of(reader(scenario("w7900-rocm60"), monkeypatch).read())
    assert w7900.power_mw == 231_000  # current_socket_power N/A: average_socket_power's


def test_a_process_s_activity_is_its_engine_time_over_two_readings(monkeypatch: pytest.MonkeyPatch) -> None:
    s = scenario("mi300x")
    clock = [100.0]
    r = reader(s, monkeypatch, clock)
    (g, _) = gpus_of(r.read())
    assert isinstance(g.processes, tuple)
    assert all(p.gpu_util_percent is None and p.unavailable["gpu_util_percent"] == FIRST_UTIL for p in g.processes)
    s["gpus"][0]["processes"][0]["gfx_ns"] += 1_500_000_000  # 1.5 s of engine time
    clock[0] += 2.0  # over 2 s
    (g, _) = gpus_of(r.read())
    assert isinstance(g.processes, tuple)
    assert {p.pid: p.gpu_util_percent for p in g.processes} == {52311: 75, 52390: 0}


def test_rocm_before_6_1_lists_process_handles(monkeypatch: pytest.MonkeyPatch) -> None:
    s = scenario("w7900-rocm60")
    module = fake_amdsmi(s)
    module.amdsmi_init(module.AmdSmiInitFlags.INIT_AMD_GPUS)
    assert not isinstance(module.amdsmi_get_gpu_process_list(0)[0], dict)  # what the old bindings give
    (g,) = gpus_of(reader(s, monkeypatch).read())
    assert isinstance(g.processes, tuple) and [p.pid for p in g.processes] == [7101]
    assert g.processes[0].used_bytes == s["gpus"][0]["processes"][0]["vram_bytes"]


def test_refused_calls_are_reasons_with_the_status_name(monkeypatch: pytest.MonkeyPatch) -> None:
    (g,) = gpus_of(reader(scenario("no-permission"), monkeypatch).read())
    assert isinstance(g.processes, Unavailable) and "AMDSMI_STATUS_NO_PERM" in g.processes.reason
    assert "render groups" in g.processes.reason
    assert g.ecc_uncorrected_aggregate is None and "AMDSMI_STATUS_NO_PERM" in (g.why("ecc_uncorrected_aggregate") or "")
    assert g.memory_total_bytes == 65520 * MIB  # the rest is read


def test_driver_not_loaded_is_a_state(monkeypatch: pytest.MonkeyPatch) -> None:
    part = reader(scenario("driver-not-loaded"), monkeypatch).read()
    assert isinstance(part, Unavailable) and part.absent == "no_driver"
    assert "AMDSMI_STATUS_DRIVER_NOT_LOADED" in part.reason


def _broken_bindings(tmp_path: Path) -> Path:
    """A real `amdsmi` package that does what the real bindings do without libamd_smi.so, counting its imports."""
    pkg = tmp_path / "site" / "amdsmi"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "import os\n"
        f"open({str(tmp_path / 'imports')!r}, 'a').write('x')\n"
        "print('/opt/rocm/lib/libamd_smi.so: cannot open shared object file: No such file or directory')\n"
        "print('Unable to find libamd_smi.so library try installing amd-smi-lib from your package manager')\n"
        "_libraries = {}\n"
        "x = _libraries['libamd_smi.so']\n")
    return pkg.parent


def test_no_rocm_library_is_one_line_and_stdout_stays_clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.syspath_prepend(str(_broken_bindings(tmp_path)))
    monkeypatch.delitem(sys.modules, "amdsmi", raising=False)
    r = AmdReader(no_identity())
    for _ in range(3):
        part = r.read()
        assert part == Unavailable(NO_ROCM, "no_library") and "\n" not in part.reason
    out = capsys.readouterr().out
    assert out == ""
    assert (tmp_path / "imports").read_text() == "x"  # imported once, not on every tick


def test_no_bindings_at_all(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # what `import amdsmi` does where it is not installed
    assert import_amdsmi() == NO_BINDINGS


def test_nvml_and_amdsmi_together_number_amd_after_nvidia(monkeypatch: pytest.MonkeyPatch) -> None:
    nv = json.loads((DATA / "gpu-scenarios" / "two-gpus.json").read_text())
    both = GpusReader(GpuReader(lambda: FakeBackend(nv)), reader(scenario("mi300x"), monkeypatch))
    part = gpus_of(both.read())
    assert [(g.index, g.backend) for g in part] == [(0, "nvml"), (1, "nvml"), (2, "amdsmi"), (3, "amdsmi")]
    nothing = json.loads((DATA / "gpu-scenarios" / "library-not-found.json").read_text())
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    neither = GpusReader(GpuReader(lambda: FakeBackend(nothing)), AmdReader(no_identity())).read()
    assert isinstance(neither, Unavailable) and neither.absent == "no_library"
    assert "libnvidia-ml" in neither.reason and NO_BINDINGS in neither.reason
    amd_only = GpusReader(GpuReader(lambda: FakeBackend(nothing)), reader(scenario("mi300x"), monkeypatch)).read()
    assert [g.index for g in gpus_of(amd_only)] == [0, 1]


def test_snapshot_json_from_the_fake_amdsmi_and_from_no_rocm() -> None:
    env = {k: v for k, v in os.environ.items() if k != "DLTOP_FAKE_NVML"}
    for name in ("mi300x", "no-rocm"):
        env["DLTOP_FAKE_AMDSMI"] = str(SCENARIOS / f"{name}.json")
        out = subprocess.run([sys.executable, "-m", "dltop", "snapshot"], capture_output=True,
                             text=True, env=env, cwd=REPO, timeout=60)
        assert out.returncode == 0, out.stderr
        gpus = json.loads(out.stdout)["gpus"]  # stdout is the JSON and nothing else
        if name == "mi300x":
            assert [g["backend"] for g in gpus] == ["amdsmi", "amdsmi"]
            assert gpus[0]["temperature_sensor"] == "hotspot"
        else:
            assert gpus == {"unavailable": NO_ROCM, "absent": "no_library"}


leaf = st.one_of(st.none(), st.booleans(), st.integers(-5, 1 << 40), st.floats(allow_nan=True),
                 st.sampled_from(["N/A", "AMDSMI_STATUS_NOT_SUPPORTED", "AMDSMI_STATUS_NO_PERM", "AMDSMI_STATUS_X",
                                  "x"]))
json_values = st.recursive(leaf, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(
    ["gpus", "vram_mb", "vram_total", "vram_used", "activity", "gfx_activity", "umc_activity", "temperature_c",
     "edge", "hotspot", "power_w", "socket_power", "power_limit", "processes", "pid", "vram_bytes", "gfx_ns",
     "name", "uuid", "bdf", "clocks_mhz", "gfx", "ecc", "correctable_count", "error", "init_error",
     "process_handles"]), inner, max_size=5), max_leaves=25)
TRIED: list[int] = []


@settings(max_examples=250, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(json_values)
def test_any_amdsmi_answer_is_read_or_refused(data: Any) -> None:
    """Whatever the bindings answer (wrong types, N/A, errors), the reader gives a part or a reason."""
    TRIED.append(1)
    if not isinstance(data, dict) or not isinstance(data.get("gpus", []), list):
        return
    sys.modules["amdsmi"] = fake_amdsmi(data)
    try:
        part = AmdReader(no_identity()).read()
    finally:
        del sys.modules["amdsmi"]
    assert isinstance(part, tuple | Unavailable)
    snap = Snapshot(ts=0.0, host="h", gpus=part)
    assert Snapshot.from_json(snap.to_json()) == snap


def test_the_fuzz_count() -> None:
    print(f"amdsmi reader fuzz: {len(TRIED)} inputs")
    assert len(TRIED) in (0, 250)  # 0 when run alone


def test_amd_processes_carry_the_same_proc_columns_as_nvml_s(monkeypatch: pytest.MonkeyPatch) -> None:
    """User, command, parent, host RSS, CPU % and start time from /proc, read by the reader NVML's share."""
    sleep = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE)
    try:
        assert sleep.stdout is not None and sleep.stdout.readline() == b"up\n"  # its exec done, its cmdline set
        s = scenario("mi300x")
        s["gpus"][0]["processes"][0]["pid"] = sleep.pid
        s["gpus"][0]["processes"][1]["pid"] = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # none here
        clock = [100.0]
        monkeypatch.setitem(sys.modules, "amdsmi", fake_amdsmi(s))
        r = AmdReader(HostReader("/proc", clock=lambda: clock[0]), clock=lambda: clock[0])
        r.read()
        clock[0] += 1.0
        (g, _) = gpus_of(r.read())
        assert isinstance(g.processes, tuple)
        p = next(p for p in g.processes if p.pid == sleep.pid)
        assert p.user == pwd.getpwuid(os.geteuid()).pw_name and p.ppid == os.getpid()
        assert p.command is not None and p.command.startswith(sys.executable)
        assert p.host_rss_bytes is not None and p.host_rss_bytes > 0, p
        assert p.cpu_percent is not None and p.cpu_percent >= 0
        assert p.started_at is not None and abs(p.started_at - time.time()) < 60
        assert p.start_time_ticks is not None
        for f in ("user", "command", "ppid", "host_rss_bytes", "cpu_percent", "started_at"):
            assert f not in p.unavailable, f
        other = next(p for p in g.processes if p.pid != sleep.pid)  # not in this /proc: each fact says why
        assert other.command == "[pt_main_thread]"  # amdsmi's name stands in
        for f in ("ppid", "host_rss_bytes", "cpu_percent", "started_at", "user"):
            assert "not in this PID namespace" in other.unavailable[f], f
    finally:
        sleep.kill()
        sleep.wait()


def test_a_gpu_amdsmi_no_longer_finds_is_lost_in_nvidia_s_words(monkeypatch: pytest.MonkeyPatch) -> None:
    """GPU 1 of two read once, then gone (every call AMDSMI_STATUS_NOT_FOUND): it keeps its place and its name,
    is down "lost" with the same plain words as NVIDIA's lost GPU, claims no driver version, and every None
    says why; the pane's headline says it, never a bare `?` and a status name."""
    from dltop.tui.panes.gpu import headline
    from tests.test_gpu import devices as nv_devices
    from tests.test_gpu import scenario as nv_scenario

    s = scenario("mi300x")
    s["gpus"] = s["gpus"][:2]
    r = reader(s, monkeypatch)
    before = gpus_of(r.read())
    s["gpus"][1]["error"] = "AMDSMI_STATUS_NOT_FOUND"
    g0, g1 = gpus_of(r.read())
    assert g0.down is None and g0.driver_version == s["driver_version"]
    assert g1.down == "lost" and g1.driver_version is None
    assert (g1.name, g1.uuid, g1.bus_id) == (before[1].name, before[1].uuid, before[1].bus_id)
    why = g1.why("memory_total_bytes") or ""
    assert why.startswith("GPU is lost: it has fallen off the bus or was removed (look for amdgpu errors in dmesg)")
    assert why.endswith("(AMDSMI_STATUS_NOT_FOUND)")
    assert isinstance(g1.processes, Unavailable) and g1.processes.reason == why
    for f in GpuDevice.__dataclass_fields__:
        if getattr(g1, f) is None and f not in ("memory_pool_note", "down"):
            assert g1.why(f), f
    assert "the GPU cannot be read" in (g1.why("driver_version") or "")
    nv = next(g for g in nv_devices(nv_scenario("gpu-lost")) if g.down == "lost")
    nv_why = nv.why("memory_total_bytes") or ""
    assert nv_why.startswith("GPU is lost: it has fallen off the bus or was removed (look for Xid 79 in dmesg)")
    assert nv.driver_version is None and "the GPU cannot be read" in (nv.why("driver_version") or "")
    lines = [c.plain for c in headline(g1, 80)]
    assert lines[0].startswith("GPU1 ") and "GPU is lost" in lines[1]
    again = Snapshot.from_json(Snapshot(ts=1.0, host="h", gpus=(g0, g1)).to_json())
    assert again.gpus[1].down == "lost" and again.gpus[1].driver_version is None  # type: ignore[index]
