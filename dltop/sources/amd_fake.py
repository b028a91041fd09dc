"""A fake `amdsmi` module played from a scenario file (`DLTOP_FAKE_AMDSMI=tests/data/amd-scenarios/mi300x.json`):
amdsmi's real function names, return keys, units (VRAM in MB, power in W, temperature in C, engine time in ns)
and AmdSmiLibraryException with the real AMDSMI_STATUS_* codes, so the reader's one error path serves both.

A value written as "AMDSMI_STATUS_<NAME>" makes its call raise that status; a key left out of a GPU is Not
Supported. `"import_error": "no_library"` plays ROCm's missing libamd_smi.so (two lines on stdout, then
KeyError('libamd_smi.so')); `"process_handles": true` plays ROCm before 6.1 (the process list holds handles, each
asked for its info).
"""

from __future__ import annotations

import types
from enum import IntEnum
from typing import Any

from dltop.sources.amd import STATUS_NAMES
from dltop.sources.scenario import ScenarioError, read_scenario

FAKE_AMD_ENV = "DLTOP_FAKE_AMDSMI"
CODES = {name: code for code, name in STATUS_NAMES.items()}


class AmdSmiException(Exception):
    """amdsmi_exception.AmdSmiException: the bindings' base exception."""


class AmdSmiLibraryException(AmdSmiException):
    """amdsmi_exception.AmdSmiLibraryException: `err_code` the (positive) AMDSMI_STATUS_* code."""

    def __init__(self, err_code: int) -> None:
        err_code = abs(err_code)
        super().__init__(err_code)
        self.err_code = err_code
        self.err_info = f"{STATUS_NAMES.get(err_code, 'AMDSMI_STATUS_UNKNOWN_ERROR')} - fake"


class AmdSmiParameterException(AmdSmiException):
    """amdsmi_exception.AmdSmiParameterException: an argument of the wrong type (an int for an enum)."""


class AmdSmiInitFlags(IntEnum):
    INIT_AMD_GPUS = 2


class AmdSmiTemperatureType(IntEnum):
    EDGE = 0
    HOTSPOT = 1
    JUNCTION = 1
    VRAM = 2


class AmdSmiTemperatureMetric(IntEnum):
    CURRENT = 0


class AmdSmiClkType(IntEnum):
    GFX = 0
    MEM = 4


class NoLibrary(KeyError):
    """What importing the real bindings raises without libamd_smi.so."""


def load(path: str) -> dict[str, Any]:
    """A scenario file's JSON, or ScenarioError naming why not."""
    data = read_scenario(path)
    if not isinstance(data, dict) or not isinstance(data.get("gpus", []), list):
        raise ScenarioError(f"{path}: expected an object with a list of gpus")
    return data


def fake_amdsmi(scenario: dict[str, Any]) -> types.ModuleType:
    """A module with amdsmi's names that answers as the scenario says (what `import amdsmi` would give)."""
    if scenario.get("import_error") == "no_library":
        print("/opt/rocm/lib/libamd_smi.so: cannot open shared object file: No such file or directory")
        print("Unable to find libamd_smi.so library try installing amd-smi-lib from your package manager")
        raise NoLibrary("libamd_smi.so")
    fake = _FakeAmdSmi(scenario)
    m = types.ModuleType("amdsmi")
    calls = {
        "amdsmi_get_gpu_asic_info": lambda h: {"market_name": fake.gpu(h, "name"), "vendor_id": "0x1002"},
        "amdsmi_get_gpu_device_uuid": lambda h: fake.gpu(h, "uuid"),
        "amdsmi_get_gpu_device_bdf": lambda h: fake.gpu(h, "bdf"),
        "amdsmi_get_gpu_driver_info": lambda h: {"driver_name": "amdgpu",
                                                 "driver_version": _value(scenario.get("driver_version", "N/A")),
                                                 "driver_date": "N/A"},
        "amdsmi_get_gpu_vram_usage": lambda h: fake.gpu(h, "vram_mb"),  # {"vram_total", "vram_used"} in MB
        "amdsmi_get_gpu_activity": lambda h: fake.gpu(h, "activity"),  # gfx_activity, umc_activity, mm_activity
        "amdsmi_get_power_info": lambda h: fake.gpu(h, "power_w"),  # socket_power, current_socket_power, ... in W
        "amdsmi_get_gpu_total_ecc_count": lambda h: fake.gpu(h, "ecc"),
        "amdsmi_init": fake.amdsmi_init,
        "amdsmi_shut_down": fake.amdsmi_shut_down,
        "amdsmi_get_processor_handles": fake.amdsmi_get_processor_handles,
        "amdsmi_get_temp_metric": fake.amdsmi_get_temp_metric,
        "amdsmi_get_clock_info": fake.amdsmi_get_clock_info,
        "amdsmi_get_gpu_process_list": fake.amdsmi_get_gpu_process_list,
    }
    if scenario.get("process_handles"):
        calls["amdsmi_get_gpu_process_info"] = fake.amdsmi_get_gpu_process_info
    for name, fn in calls.items():
        setattr(m, name, fn)
    for cls in (AmdSmiException, AmdSmiLibraryException, AmdSmiParameterException, AmdSmiInitFlags, AmdSmiTemperatureType,
                AmdSmiTemperatureMetric, AmdSmiClkType):
        setattr(m, cls.__name__, cls)
    return m


def _value(v: Any) -> Any:
    """A scenario's value as amdsmi gives it: an AMDSMI_STATUS_* name raises that status."""
    if isinstance(v, str) and v.startswith("AMDSMI_STATUS_"):
        raise AmdSmiLibraryException(CODES.get(v, 0xFFFFFFFF))
    if isinstance(v, dict):
        return {k: _value(x) for k, x in v.items()}
    return v


def _not_supported() -> AmdSmiLibraryException:
    return AmdSmiLibraryException(CODES["AMDSMI_STATUS_NOT_SUPPORTED"])


class _FakeAmdSmi:
    """amdsmi's calls over a scenario, its session state (init, shut down) included."""

    def __init__(self, scenario: dict[str, Any]) -> None:
        self.scenario = scenario
        self.gpus: list[dict[str, Any]] = scenario.get("gpus", [])
        self.init = False

    def gpu(self, h: Any, key: str) -> Any:
        """GPU `h`'s `key`, or the status the scenario says (not initialised, not supported, its error)."""
        if not self.init:
            raise AmdSmiLibraryException(CODES["AMDSMI_STATUS_NOT_INIT"])
        g = self.gpus[h]
        _value(g.get("error"))
        if key not in g:
            raise _not_supported()
        return _value(g[key])

    def amdsmi_init(self, flag: AmdSmiInitFlags = AmdSmiInitFlags.INIT_AMD_GPUS) -> None:
        _value(self.scenario.get("init_error"))
        self.init = True

    def amdsmi_shut_down(self) -> None:
        self.init = False

    def amdsmi_get_processor_handles(self) -> list[int]:
        if not self.init:
            raise AmdSmiLibraryException(CODES["AMDSMI_STATUS_NOT_INIT"])
        return list(range(len(self.gpus)))

    def amdsmi_get_temp_metric(self, h: int, sensor: AmdSmiTemperatureType, metric: AmdSmiTemperatureMetric) -> int:
        if not isinstance(sensor, AmdSmiTemperatureType) or not isinstance(metric, AmdSmiTemperatureMetric):
            raise AmdSmiParameterException("expected the amdsmi enums")  # the real bindings check their types
        temps = self.gpu(h, "temperature_c")
        word = "edge" if sensor == AmdSmiTemperatureType.EDGE else "hotspot" if sensor == 1 else "vram"
        if word not in temps:
            raise _not_supported()
        return int(_value(temps[word]))

    def amdsmi_get_clock_info(self, h: int, clock: AmdSmiClkType) -> dict[str, Any]:
        clocks = self.gpu(h, "clocks_mhz")
        word = "gfx" if clock == AmdSmiClkType.GFX else "mem" if clock == AmdSmiClkType.MEM else "other"
        if word not in clocks:
            raise _not_supported()
        return {"clk": _value(clocks[word]), "min_clk": 0, "max_clk": 0, "clk_locked": "N/A", "clk_deep_sleep": 0}

    def amdsmi_get_gpu_process_list(self, h: int) -> list[Any]:
        procs = self.gpu(h, "processes")
        if self.scenario.get("process_handles"):
            return [("proc", h, i) for i in range(len(procs))]
        return [_process(p) for p in procs]

    def amdsmi_get_gpu_process_info(self, h: int, handle: Any) -> dict[str, Any]:
        return _process(self.gpu(h, "processes")[handle[2]])


def _process(p: dict[str, Any]) -> dict[str, Any]:
    return {"name": p.get("name", "N/A"), "pid": p["pid"], "mem": p.get("vram_bytes", 0),
            "engine_usage": {"gfx": p.get("gfx_ns", 0), "enc": 0},
            "memory_usage": {"gtt_mem": 0, "cpu_mem": 0, "vram_mem": p.get("vram_bytes", "N/A")},
            "cu_occupancy": "N/A"}
