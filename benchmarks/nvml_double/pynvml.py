"""An NVML double that dltop and nvitop both load, for benchmarks side by side on a machine without a GPU.

Put this folder first on PYTHONPATH and a stub libnvidia-ml.so.1 (benchmarks/nvml_double/stub.c, no symbols) on
LD_LIBRARY_PATH; NVML_DOUBLE_SCENARIO names one of the project's scenario files (tests/data/gpu-scenarios/).
`import pynvml` then gets this module: the real nvidia-ml-py's names (constants, structures, NVMLError and its
subclasses, found beside it on sys.path and loaded under another name), with the calls both tools make answered
from the scenario, in NVML's own types. A call the scenario does not answer goes to the real binding, which asks
the stub library for the symbol and raises NVMLError_FunctionNotFound, as an old driver would.

nvitop patches a few calls by their C function pointers; `_nvmlGetFunctionPointer` is withheld here, so it uses
these Python calls instead (its fallback for a pynvml it cannot patch). Only the scenario shapes of
8gpu-20proc.json are played (no MIG, no errors per GPU): this is a benchmark double, not the test fake
(dltop.sources.gpu.FakeBackend is that).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from types import SimpleNamespace
from typing import Any


def _load_real() -> Any:
    here = os.path.dirname(os.path.abspath(__file__))
    for folder in sys.path:
        path = os.path.join(os.path.abspath(folder or "."), "pynvml.py")
        if os.path.dirname(path) != here and os.path.isfile(path):
            spec = importlib.util.spec_from_file_location("_nvml_double_real_pynvml", path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module  # it looks itself up there (its NVMLError_* classes)
            spec.loader.exec_module(module)
            return module
    raise ImportError("nvidia-ml-py's pynvml.py is not on sys.path beside the NVML double")


_real = _load_real()
globals().update({k: v for k, v in vars(_real).items() if not k.startswith("__")})
_nvmlGetFunctionPointer = None  # withheld: nvitop calls our Python functions rather than C pointers
NVMLError = _real.NVMLError

_SCENARIO: dict[str, Any] = {}
_T0 = time.time()


def _s() -> dict[str, Any]:
    if not _SCENARIO:
        raise _real.NVMLError(_real.NVML_ERROR_UNINITIALIZED)
    return _SCENARIO


class _Handle:
    def __init__(self, index: int, gpu: dict[str, Any]) -> None:
        self.index, self.gpu = index, gpu


def _get(h: _Handle, key: str) -> Any:
    if key not in h.gpu:
        raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
    v = h.gpu[key]
    if isinstance(v, str) and v.startswith("NVML_ERROR_"):
        raise _real.NVMLError(getattr(_real, v))
    return v


def nvmlInitWithFlags(flags: int = 0) -> None:
    _real._LoadNvmlLibrary()  # the stub: what the real binding would load, so unplayed calls fail as NVML's do
    with open(os.environ["NVML_DOUBLE_SCENARIO"]) as f:
        _SCENARIO.update(json.load(f))


def nvmlInit() -> None:
    nvmlInitWithFlags(0)


def nvmlShutdown() -> None:
    pass


def nvmlSystemGetDriverVersion() -> str:
    return str(_s()["driver_version"])


def nvmlSystemGetNVMLVersion() -> str:
    return "12." + str(_s()["driver_version"])


def nvmlSystemGetCudaDriverVersion() -> int:
    return 12080


nvmlSystemGetCudaDriverVersion_v2 = nvmlSystemGetCudaDriverVersion


def nvmlDeviceGetCount() -> int:
    return len(_s()["gpus"])


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
    return _Handle(index, _s()["gpus"][index])


def nvmlDeviceGetIndex(h: _Handle) -> int:
    return h.index


def nvmlDeviceGetName(h: _Handle) -> str:
    return str(_get(h, "name"))


def nvmlDeviceGetUUID(h: _Handle) -> str:
    return str(_get(h, "uuid"))


def nvmlDeviceGetPciInfo(h: _Handle) -> Any:
    bus = str(_get(h, "bus_id"))
    return SimpleNamespace(busId=bus, busIdLegacy=bus[4:], bus=int(bus.split(":")[1], 16), device=0, domain=0,
                           pciDeviceId=0x233010DE, pciSubSystemId=0)


nvmlDeviceGetPciInfo_v3 = nvmlDeviceGetPciInfo


def nvmlDeviceGetMemoryInfo(h: _Handle, version: Any = None) -> Any:
    m = _get(h, "memory")
    if version is None:
        return SimpleNamespace(total=m["total"], used=m["used"] + m["reserved"], free=m["free"])
    return SimpleNamespace(version=version, total=m["total"], used=m["used"], free=m["free"], reserved=m["reserved"])


def nvmlDeviceGetBAR1MemoryInfo(h: _Handle) -> Any:
    return SimpleNamespace(bar1Total=256 << 30, bar1Used=1 << 30, bar1Free=255 << 30)


def nvmlDeviceGetUtilizationRates(h: _Handle) -> Any:
    u = _get(h, "utilization")
    return SimpleNamespace(gpu=u["gpu"], memory=u["memory"])


def nvmlDeviceGetTemperature(h: _Handle, sensor: int = 0) -> int:
    return int(_get(h, "temperature_c"))


def nvmlDeviceGetPowerUsage(h: _Handle) -> int:
    return int(_get(h, "power_mw"))


def nvmlDeviceGetEnforcedPowerLimit(h: _Handle) -> int:
    return int(_get(h, "power_limit_mw"))


nvmlDeviceGetPowerManagementLimit = nvmlDeviceGetEnforcedPowerLimit


def nvmlDeviceGetClockInfo(h: _Handle, clock: int) -> int:
    c = _get(h, "clocks_mhz")
    return int(c["mem"] if clock == _real.NVML_CLOCK_MEM else c["sm"])


nvmlDeviceGetMaxClockInfo = nvmlDeviceGetClockInfo


def nvmlDeviceGetFanSpeed(h: _Handle) -> int:
    return int(_get(h, "fan_speed_percent"))


def nvmlDeviceGetPerformanceState(h: _Handle) -> int:
    return int(h.gpu.get("pstate", 0))


def nvmlDeviceGetPersistenceMode(h: _Handle) -> int:
    return 1


def nvmlDeviceGetDisplayActive(h: _Handle) -> int:
    return 0


def nvmlDeviceGetComputeMode(h: _Handle) -> int:
    return 0


def nvmlDeviceGetMigMode(h: _Handle) -> list[int]:
    return [1, 1] if h.gpu.get("mig_mode") else [0, 0]


def nvmlDeviceGetTotalEccErrors(h: _Handle, error_type: int, counter: int) -> int:
    key = "ecc_uncorrected" if error_type == _real.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else "ecc_corrected"
    e = _get(h, key)
    return int(e["volatile" if counter == _real.NVML_VOLATILE_ECC else "aggregate"])


def nvmlDeviceGetCurrentClocksEventReasons(h: _Handle) -> int:
    return int(h.gpu.get("clocks_event_reasons", 0))


nvmlDeviceGetCurrentClocksThrottleReasons = nvmlDeviceGetCurrentClocksEventReasons


def nvmlDeviceGetEncoderUtilization(h: _Handle) -> list[int]:
    return [int(h.gpu.get("encoder_util_percent", 0)), 167000]


def nvmlDeviceGetDecoderUtilization(h: _Handle) -> list[int]:
    return [int(h.gpu.get("decoder_util_percent", 0)), 167000]


def nvmlDeviceGetPcieThroughput(h: _Handle, counter: int) -> int:
    p = _get(h, "pcie_kb_per_s")
    return int(p["tx" if counter == _real.NVML_PCIE_UTIL_TX_BYTES else "rx"])


def nvmlDeviceGetFieldValues(h: _Handle, ids: list[Any]) -> Any:
    """The PCIe byte counters (and NVLink's), stamped with the time of the read, as NVML gives them."""
    out = (_real.c_nvmlFieldValue_t * len(ids))()
    now = time.time()
    for f, want in zip(out, ids, strict=True):
        fid = want[0] if isinstance(want, tuple) else want
        f.fieldId, f.timestamp = fid, int(now * 1e6)
        pairs = {_real.NVML_FI_DEV_PCIE_COUNT_TX_BYTES: ("pcie_bytes", "tx"),
                 _real.NVML_FI_DEV_PCIE_COUNT_RX_BYTES: ("pcie_bytes", "rx")}
        if fid in pairs and pairs[fid][0] in h.gpu:
            c = h.gpu[pairs[fid][0]]
            d = pairs[fid][1]
            f.nvmlReturn, f.valueType = _real.NVML_SUCCESS, _real.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            f.value.ullVal = int(c[d]) + round(c.get(f"{d}_per_s", 0) * (now - _T0))
        else:
            f.nvmlReturn = _real.NVML_ERROR_NOT_SUPPORTED
    return out


def _processes(h: _Handle, kind: str) -> list[Any]:
    return [SimpleNamespace(pid=p["pid"], usedGpuMemory=p.get("used_bytes"),
                            gpuInstanceId=0xFFFFFFFF if p.get("gpu_instance_id") is None else p["gpu_instance_id"],
                            computeInstanceId=0xFFFFFFFF if p.get("compute_instance_id") is None
                            else p["compute_instance_id"])
            for p in h.gpu.get(f"{kind}_processes", [])]


def nvmlDeviceGetComputeRunningProcesses(h: _Handle) -> list[Any]:
    return _processes(h, "compute")


def nvmlDeviceGetGraphicsRunningProcesses(h: _Handle) -> list[Any]:
    return _processes(h, "graphics")


nvmlDeviceGetComputeRunningProcesses_v3 = nvmlDeviceGetComputeRunningProcesses_v2 = nvmlDeviceGetComputeRunningProcesses
nvmlDeviceGetGraphicsRunningProcesses_v3 = nvmlDeviceGetGraphicsRunningProcesses_v2 = (
    nvmlDeviceGetGraphicsRunningProcesses)


def nvmlDeviceGetMPSComputeRunningProcesses(h: _Handle) -> list[Any]:
    return []


def nvmlDeviceGetProcessUtilization(h: _Handle, since_us: int) -> list[Any]:
    """The scenario's samples, a running one (period_us) sampled again every period, newer than `since_us`."""
    now_us = int(time.time() * 1e6)
    out = []
    for s in h.gpu.get("process_utilization", []):
        ts = s["timestamp_us"]
        if s.get("period_us") and now_us > ts:
            ts += (now_us - ts) // s["period_us"] * s["period_us"]
        if ts > since_us:
            out.append(SimpleNamespace(pid=s["pid"], timeStamp=ts, smUtil=s["sm"], memUtil=s["mem"], encUtil=0,
                                       decUtil=0))
    if not out:
        raise _real.NVMLError(_real.NVML_ERROR_NOT_FOUND)
    return out


def _not_supported(*args: Any, **kwargs: Any) -> Any:
    raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)


# Linux has no driver model (a Windows thing): NVML says Not Supported there, and nvitop then stays quiet
nvmlDeviceGetDriverModel = nvmlDeviceGetDriverModel_v2 = nvmlDeviceGetCurrentDriverModel = _not_supported
