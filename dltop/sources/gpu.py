"""GPUs from NVML (nvidia-ml-py, imported as `pynvml`): devices, MIG instances and the processes holding memory.

NVML is reached through a small backend so tests swap in a fake driven by a scenario file
(`DLTOP_FAKE_NVML=tests/data/gpu-scenarios/h100-2proc.json`); both raise pynvml's own `NVMLError` subclasses with
the real NVML_ERROR_* codes, so one error path serves both. One NVML session lives as long as the source
(nvmlInit at the first read, nvmlShutdown on close); dltop never creates a CUDA context. Every failure is a
reason where the numbers would be, never a zero.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, partial
from typing import Any, Literal, Protocol, TypeVar

from dltop import procfs
from dltop.config import Settings
from dltop.model.base import Unavailable
from dltop.model.gpu import DOWN_DRIVER, LOST_TEXT, GpuDevice, GpuPart, GpuProcess, MigDevice, unprobed_split
from dltop.sources.amd import AmdReader
from dltop.sources.base import Source
from dltop.sources.gpu_fields import Fields
from dltop.sources.gpu_procs import NOT_IN_NAMESPACE, HostReader, parse_cmdline  # noqa: F401 (theirs, said here too)
from dltop.sources.scenario import ScenarioError, read_scenario

T = TypeVar("T")
FAKE_ENV = "DLTOP_FAKE_NVML"
ProcessKind = Literal["compute", "graphics"]
NOT_INSTALLED = "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
UINT_NOT_AVAILABLE = 0xFFFFFFFF  # NVML_VALUE_NOT_AVAILABLE as a uint: "no MIG instance" in process info


@dataclass(frozen=True)
class MemoryInfo:
    """nvmlDeviceGetMemoryInfo(_v2): bytes; `reserved` only from the v2 call."""

    total: int
    used: int
    free: int
    reserved: int | None = None


@dataclass(frozen=True)
class ProcessInfo:
    """One entry of nvmlDeviceGet{Compute,Graphics}RunningProcesses: used_bytes None is NVML_VALUE_NOT_AVAILABLE."""

    pid: int
    used_bytes: int | None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass(frozen=True)
class ProcessSample:
    """One entry of nvmlDeviceGetProcessUtilization."""

    pid: int
    timestamp_us: int
    sm_percent: int
    mem_percent: int


class NvmlBackend(Protocol):
    """The NVML calls dltop makes. Each raises `pynvml.NVMLError` (a subclass per NVML_ERROR_* code)."""

    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def driver_version(self) -> str: ...
    def device_count(self) -> int: ...
    def handle(self, index: int) -> Any: ...
    def name(self, h: Any) -> str: ...
    def uuid(self, h: Any) -> str: ...
    def bus_id(self, h: Any) -> str: ...
    def memory(self, h: Any, version: int) -> MemoryInfo: ...
    def utilization(self, h: Any) -> tuple[int, int]: ...
    def temperature_c(self, h: Any) -> int: ...
    def power_mw(self, h: Any) -> int: ...
    def power_limit_mw(self, h: Any) -> int: ...
    def clock_mhz(self, h: Any, clock: Literal["sm", "mem"]) -> int: ...
    def pcie_bytes(self, h: Any) -> tuple[int, int, float | None]: ...
    def pcie_kb_per_s(self, h: Any, direction: Literal["tx", "rx"]) -> int: ...
    def ecc_uncorrected(self, h: Any, counter: Literal["volatile", "aggregate"]) -> int: ...
    def ecc_corrected(self, h: Any, counter: Literal["volatile", "aggregate"]) -> int: ...
    def fan_percent(self, h: Any) -> int: ...
    def performance_state(self, h: Any) -> int: ...
    def clocks_event_reasons(self, h: Any) -> int: ...
    def codec_utilization(self, h: Any, unit: Literal["encoder", "decoder"]) -> int: ...
    def nvlink_kib(self, h: Any) -> tuple[int, int, float | None]: ...
    def retired_pages(self, h: Any, cause: Literal["sbe", "dbe"]) -> int: ...
    def retired_pages_pending(self, h: Any) -> bool: ...
    def mig_mode(self, h: Any) -> bool: ...
    def mig_device_count(self, h: Any) -> int: ...
    def mig_handle(self, h: Any, index: int) -> Any: ...
    def mig_ids(self, h: Any) -> tuple[int, int]: ...
    def processes(self, h: Any, kind: ProcessKind, version: int) -> list[ProcessInfo]: ...
    def process_utilization(self, h: Any, since_us: int) -> list[ProcessSample]: ...


# -- the real backend -------------------------------------------------------------------------------------------


def field_time(fields: Any) -> float | None:
    """When NVML read a set of field values (nvmlFieldValue_t.timestamp: the CPU time in microseconds since the
    epoch), in epoch seconds: a rate's interval is between these, not between two ticks (the Snapshot's time is
    the tick's start, and reading 8 GPUs' other fields first moves the counters' read by a varying few ms). None
    where NVML gave none."""
    stamps = [int(getattr(f, "timestamp", 0) or 0) for f in fields]
    return max(stamps) / 1e6 if stamps and min(stamps) > 0 else None


def _nvml(function: str, kind: Callable[[Any], T]) -> Callable[[PynvmlBackend, Any], T]:
    """A backend call that answers pynvml's `function` of a handle as `kind`."""
    def call(self: PynvmlBackend, h: Any) -> T:
        return kind(getattr(self.nv, function)(h))

    return call


class PynvmlBackend:
    """NVML through nvidia-ml-py. pynvml has no binding for the v1 process call, so that one goes through ctypes."""

    def __init__(self) -> None:
        import pynvml

        self.nv = pynvml

    def init(self) -> None:
        self.nv.nvmlInit()

    def shutdown(self) -> None:
        self.nv.nvmlShutdown()

    def driver_version(self) -> str:
        return str(self.nv.nvmlSystemGetDriverVersion())

    def device_count(self) -> int:
        return int(self.nv.nvmlDeviceGetCount())

    def handle(self, index: int) -> Any:
        return self.nv.nvmlDeviceGetHandleByIndex(index)

    # A call that answers one value of a handle: (pynvml's function, the value's type)
    name = _nvml("nvmlDeviceGetName", str)
    uuid = _nvml("nvmlDeviceGetUUID", str)
    power_mw = _nvml("nvmlDeviceGetPowerUsage", int)
    power_limit_mw = _nvml("nvmlDeviceGetEnforcedPowerLimit", int)
    fan_percent = _nvml("nvmlDeviceGetFanSpeed", int)
    performance_state = _nvml("nvmlDeviceGetPerformanceState", int)
    mig_device_count = _nvml("nvmlDeviceGetMaxMigDeviceCount", int)

    def bus_id(self, h: Any) -> str:
        bus = self.nv.nvmlDeviceGetPciInfo(h).busId
        return bus.decode() if isinstance(bus, bytes) else str(bus)

    def memory(self, h: Any, version: int) -> MemoryInfo:
        if version == 2:
            m = self.nv.nvmlDeviceGetMemoryInfo(h, version=self.nv.nvmlMemory_v2)
            return MemoryInfo(int(m.total), int(m.used), int(m.free), int(m.reserved))
        m = self.nv.nvmlDeviceGetMemoryInfo(h)
        return MemoryInfo(int(m.total), int(m.used), int(m.free))

    def utilization(self, h: Any) -> tuple[int, int]:
        u = self.nv.nvmlDeviceGetUtilizationRates(h)
        return int(u.gpu), int(u.memory)

    def temperature_c(self, h: Any) -> int:
        return int(self.nv.nvmlDeviceGetTemperature(h, self.nv.NVML_TEMPERATURE_GPU))

    def clock_mhz(self, h: Any, clock: Literal["sm", "mem"]) -> int:
        kind = self.nv.NVML_CLOCK_SM if clock == "sm" else self.nv.NVML_CLOCK_MEM
        return int(self.nv.nvmlDeviceGetClockInfo(h, kind))

    def _counters(self, h: Any, ids: list[Any], wide_only: bool) -> tuple[int, int, float | None]:
        """(tx, rx, when): a pair of cumulative counters from one nvmlDeviceGetFieldValues call, and the time NVML
        stamped them (`field_time`). Each field has its own return code; with `wide_only` a counter narrower than
        64 bits is refused as Not Supported."""
        nv = self.nv
        fields = nv.nvmlDeviceGetFieldValues(h, ids)
        for f in fields:
            if f.nvmlReturn != nv.NVML_SUCCESS:
                raise nv.NVMLError(f.nvmlReturn)
            if wide_only and f.valueType != nv.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG:
                raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)
        return int(fields[0].value.ullVal), int(fields[1].value.ullVal), field_time(fields)

    def pcie_bytes(self, h: Any) -> tuple[int, int, float | None]:
        """The PCIe byte counters: 64-bit only (at PCIe speeds a 32-bit byte counter wraps several times a second,
        so no rate from it would be true)."""
        nv = self.nv
        return self._counters(h, [nv.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, nv.NVML_FI_DEV_PCIE_COUNT_RX_BYTES], True)

    def pcie_kb_per_s(self, h: Any, direction: Literal["tx", "rx"]) -> int:
        counter = self.nv.NVML_PCIE_UTIL_TX_BYTES if direction == "tx" else self.nv.NVML_PCIE_UTIL_RX_BYTES
        return int(self.nv.nvmlDeviceGetPcieThroughput(h, counter))

    def _ecc(self, h: Any, error_type: int, counter: Literal["volatile", "aggregate"]) -> int:
        kind = self.nv.NVML_VOLATILE_ECC if counter == "volatile" else self.nv.NVML_AGGREGATE_ECC
        return int(self.nv.nvmlDeviceGetTotalEccErrors(h, error_type, kind))

    def ecc_uncorrected(self, h: Any, counter: Literal["volatile", "aggregate"]) -> int:
        return self._ecc(h, self.nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, counter)

    def ecc_corrected(self, h: Any, counter: Literal["volatile", "aggregate"]) -> int:
        return self._ecc(h, self.nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, counter)

    def clocks_event_reasons(self, h: Any) -> int:
        """The R535 call, or its older name (the same mask) on a driver that lacks it."""
        try:
            return int(self.nv.nvmlDeviceGetCurrentClocksEventReasons(h))
        except self.nv.NVMLError_FunctionNotFound:
            return int(self.nv.nvmlDeviceGetCurrentClocksThrottleReasons(h))

    def codec_utilization(self, h: Any, unit: Literal["encoder", "decoder"]) -> int:
        call = self.nv.nvmlDeviceGetEncoderUtilization if unit == "encoder" else self.nv.nvmlDeviceGetDecoderUtilization
        return int(call(h)[0])  # [percent, sampling period in us]

    def nvlink_kib(self, h: Any) -> tuple[int, int, float | None]:
        """NVLink data KiB summed over all links (scope UINT_MAX)."""
        nv = self.nv
        return self._counters(h, [(nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, UINT_NOT_AVAILABLE),
                                  (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, UINT_NOT_AVAILABLE)], False)

    def retired_pages(self, h: Any, cause: Literal["sbe", "dbe"]) -> int:
        c = (self.nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS if cause == "sbe"
             else self.nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        return len(self.nv.nvmlDeviceGetRetiredPages(h, c))

    def retired_pages_pending(self, h: Any) -> bool:
        return bool(self.nv.nvmlDeviceGetRetiredPagesPendingStatus(h))

    def mig_mode(self, h: Any) -> bool:
        return bool(self.nv.nvmlDeviceGetMigMode(h)[0] == self.nv.NVML_DEVICE_MIG_ENABLE)

    def mig_handle(self, h: Any, index: int) -> Any:
        return self.nv.nvmlDeviceGetMigDeviceHandleByIndex(h, index)

    def mig_ids(self, h: Any) -> tuple[int, int]:
        return int(self.nv.nvmlDeviceGetGpuInstanceId(h)), int(self.nv.nvmlDeviceGetComputeInstanceId(h))

    def processes(self, h: Any, kind: ProcessKind, version: int) -> list[ProcessInfo]:
        if version == 1:
            return self._processes_v1(h, kind)
        name = "Compute" if kind == "compute" else "Graphics"
        procs = getattr(self.nv, f"nvmlDeviceGet{name}RunningProcesses_v{version}")(h)
        return [ProcessInfo(int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory),
                            _instance_id(p.gpuInstanceId), _instance_id(p.computeInstanceId)) for p in procs]

    def _processes_v1(self, h: Any, kind: ProcessKind) -> list[ProcessInfo]:
        import ctypes

        class V1(ctypes.Structure):  # nvmlProcessInfo_v1_t
            _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]

        nv = self.nv
        fn = nv._nvmlGetFunctionPointer(f"nvmlDeviceGet{kind.capitalize()}RunningProcesses")
        count = ctypes.c_uint(0)
        ret = fn(h, ctypes.byref(count), None)
        if ret == nv.NVML_SUCCESS:
            return []
        if ret != nv.NVML_ERROR_INSUFFICIENT_SIZE:
            raise nv.NVMLError(ret)
        count.value = count.value * 2 + 5  # room for processes that start between the two calls
        arr = (V1 * count.value)()
        nv._nvmlCheckReturn(fn(h, ctypes.byref(count), arr))
        unavailable = nv.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
        return [ProcessInfo(int(p.pid), None if p.usedGpuMemory == unavailable else int(p.usedGpuMemory))
                for p in arr[: count.value]]

    def process_utilization(self, h: Any, since_us: int) -> list[ProcessSample]:
        return [ProcessSample(int(s.pid), int(s.timeStamp), int(s.smUtil), int(s.memUtil))
                for s in self.nv.nvmlDeviceGetProcessUtilization(h, since_us)]


def _instance_id(value: int | None) -> int | None:
    return None if value is None or value == UINT_NOT_AVAILABLE else int(value)


# -- the fake backend -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _FakeHandle:
    gpu: dict[str, Any]


def _answer(key: str, function: str, kind: Callable[[Any], T]) -> Callable[[FakeBackend, Any], T]:
    """A fake's call that answers the GPU's `key` of the scenario (or its error) as `kind`, as `function` would."""
    def call(self: FakeBackend, h: Any) -> T:
        return kind(self._get(h, key, function))

    return call


def _pick(key: str, function: str) -> Callable[[FakeBackend, Any, str], int]:
    """A fake's call that answers one number of the GPU's object `key` (`which`: "sm", "tx", "volatile", ...)."""
    def call(self: FakeBackend, h: Any, which: str) -> int:
        return int(self._value(self._get(h, key, function)[which]))

    return call


class FakeBackend:
    """NVML as a scenario file describes a machine (see docs/gpu.md, "Scenario files"). A value written as
    "NVML_ERROR_<NAME>" makes its call raise that error; `missing_functions` names NVML entry points the
    driver lacks (they raise NVML_ERROR_FUNCTION_NOT_FOUND, as pynvml does for a symbol the library lacks)."""

    def __init__(self, scenario: dict[str, Any]) -> None:
        import pynvml

        self.nv = pynvml
        self.s = _check_scenario(scenario, pynvml)
        self.missing = set(self.s.get("missing_functions", ()))
        self.initialized = False
        self.clock: Callable[[], float] = time.time  # the driver's clock, for samples taken every period
        self.t0: float | None = None  # the driver's clock at the first counter read (counters grow from there)

    @classmethod
    def from_file(cls, path: str) -> FakeBackend:
        data = read_scenario(path)
        try:
            return cls(data)
        except ScenarioError as e:
            raise ScenarioError(f"{path}: {e}") from None

    def _value(self, value: Any) -> Any:
        if isinstance(value, str) and value.startswith("NVML_ERROR_"):
            raise self.nv.NVMLError(getattr(self.nv, value))
        return value

    def _need(self, function: str) -> None:
        if not self.initialized:
            raise self.nv.NVMLError(self.nv.NVML_ERROR_UNINITIALIZED)
        if function in self.missing:
            raise self.nv.NVMLError(self.nv.NVML_ERROR_FUNCTION_NOT_FOUND)

    def _get(self, h: _FakeHandle, key: str, function: str) -> Any:
        self._need(function)
        self._value(h.gpu.get("error"))  # a lost GPU fails every call
        if key not in h.gpu:
            raise self.nv.NVMLError(self.nv.NVML_ERROR_NOT_SUPPORTED)
        return self._value(h.gpu[key])

    def init(self) -> None:
        self._value(self.s.get("init_error"))
        self.initialized = True

    def shutdown(self) -> None:
        self._need("nvmlShutdown")
        self.initialized = False

    def driver_version(self) -> str:
        self._need("nvmlSystemGetDriverVersion")
        return str(self._value(self.s.get("driver_version", "NVML_ERROR_NOT_SUPPORTED")))

    def device_count(self) -> int:
        self._need("nvmlDeviceGetCount")
        return len(self.s.get("gpus", []))

    def handle(self, index: int) -> Any:
        self._need("nvmlDeviceGetHandleByIndex_v2")
        gpu = self.s["gpus"][index]
        self._value(gpu.get("error"))
        return _FakeHandle(gpu)

    def memory(self, h: Any, version: int) -> MemoryInfo:
        m = self._get(h, "memory", "nvmlDeviceGetMemoryInfo_v2" if version == 2 else "nvmlDeviceGetMemoryInfo")
        m = {k: self._value(v) for k, v in m.items()}
        if version == 2:
            return MemoryInfo(m["total"], m["used"], m["free"], m["reserved"])
        # v1's used is v2's used plus the driver's reserve
        return MemoryInfo(m["total"], m["used"] + m["reserved"], m["free"])

    def utilization(self, h: Any) -> tuple[int, int]:
        u = self._get(h, "utilization", "nvmlDeviceGetUtilizationRates")
        return self._value(u["gpu"]), self._value(u["memory"])

    # A value of the scenario's GPU (`_answer`), or a number of one of its objects (`_pick`): its key, NVML's call
    name = _answer("name", "nvmlDeviceGetName", str)
    uuid = _answer("uuid", "nvmlDeviceGetUUID", str)
    bus_id = _answer("bus_id", "nvmlDeviceGetPciInfo_v3", str)
    mig_mode = _answer("mig_mode", "nvmlDeviceGetMigMode", bool)
    temperature_c = _answer("temperature_c", "nvmlDeviceGetTemperature", int)
    power_mw = _answer("power_mw", "nvmlDeviceGetPowerUsage", int)
    power_limit_mw = _answer("power_limit_mw", "nvmlDeviceGetEnforcedPowerLimit", int)
    fan_percent = _answer("fan_speed_percent", "nvmlDeviceGetFanSpeed", int)
    performance_state = _answer("pstate", "nvmlDeviceGetPerformanceState", int)
    clocks_event_reasons = _answer("clocks_event_reasons", "nvmlDeviceGetCurrentClocksEventReasons", int)
    mig_device_count = _answer("mig_max_devices", "nvmlDeviceGetMaxMigDeviceCount", int)
    clock_mhz = _pick("clocks_mhz", "nvmlDeviceGetClockInfo")
    pcie_kb_per_s = _pick("pcie_kb_per_s", "nvmlDeviceGetPcieThroughput")
    ecc_uncorrected = _pick("ecc_uncorrected", "nvmlDeviceGetTotalEccErrors")
    ecc_corrected = _pick("ecc_corrected", "nvmlDeviceGetTotalEccErrors")
    retired_pages = _pick("retired_pages", "nvmlDeviceGetRetiredPages")

    def _counters(self, c: dict[str, Any]) -> tuple[int, int, float | None]:
        """A pair of cumulative counters as read now. Where the scenario gives them a rate (`tx_per_s`,
        `rx_per_s`), each grows at it from the fake's first read on, by the driver's clock, which stamps the
        reading as NVML does; counters without a rate are as written (a test moves them) and carry no stamp."""
        tx, rx = int(self._value(c["tx"])), int(self._value(c["rx"]))
        if "tx_per_s" not in c and "rx_per_s" not in c:
            return tx, rx, None
        now = self.clock()
        if self.t0 is None:
            self.t0 = now
        return (tx + round(c.get("tx_per_s", 0) * (now - self.t0)), rx + round(c.get("rx_per_s", 0) * (now - self.t0)),
                now)

    def pcie_bytes(self, h: Any) -> tuple[int, int, float | None]:
        return self._counters(self._get(h, "pcie_bytes", "nvmlDeviceGetFieldValues"))

    def codec_utilization(self, h: Any, unit: Literal["encoder", "decoder"]) -> int:
        name = "Encoder" if unit == "encoder" else "Decoder"
        return int(self._get(h, f"{unit}_util_percent", f"nvmlDeviceGet{name}Utilization"))

    def nvlink_kib(self, h: Any) -> tuple[int, int, float | None]:
        return self._counters(self._get(h, "nvlink_kib", "nvmlDeviceGetFieldValues"))

    def retired_pages_pending(self, h: Any) -> bool:
        return bool(self._value(self._get(h, "retired_pages", "nvmlDeviceGetRetiredPagesPendingStatus")["pending"]))

    def mig_handle(self, h: Any, index: int) -> Any:
        self._need("nvmlDeviceGetMigDeviceHandleByIndex")
        migs = h.gpu.get("mig_devices", [])
        if index >= len(migs) or migs[index] is None:
            raise self.nv.NVMLError(self.nv.NVML_ERROR_NOT_FOUND)  # an empty slot
        self._value(migs[index].get("error"))
        return _FakeHandle(migs[index])

    def mig_ids(self, h: Any) -> tuple[int, int]:
        ids = self._get(h, "instance_ids", "nvmlDeviceGetGpuInstanceId")
        return self._value(ids["gpu"]), self._value(ids["compute"])

    def processes(self, h: Any, kind: ProcessKind, version: int) -> list[ProcessInfo]:
        suffix = "" if version == 1 else f"_v{version}"
        procs = self._get(h, f"{kind}_processes", f"nvmlDeviceGet{kind.capitalize()}RunningProcesses{suffix}")
        return [ProcessInfo(p["pid"], p.get("used_bytes"),
                            None if version == 1 else p.get("gpu_instance_id"),
                            None if version == 1 else p.get("compute_instance_id")) for p in procs]

    def process_utilization(self, h: Any, since_us: int) -> list[ProcessSample]:
        """Samples newer than `since_us`, as NVML keeps them: a sample with `period_us` is a process still
        running, sampled again every period after its `timestamp_us` (its newest sample by the clock is given);
        one without was sampled once."""
        now_us = int(self.clock() * 1e6)
        samples = []
        for s in self._get(h, "process_utilization", "nvmlDeviceGetProcessUtilization"):
            ts = s["timestamp_us"]
            if s.get("period_us") and now_us > ts:
                ts += (now_us - ts) // s["period_us"] * s["period_us"]
            if ts > since_us:
                samples.append(ProcessSample(s["pid"], ts, s["sm"], s["mem"]))
        if not samples:
            raise self.nv.NVMLError(self.nv.NVML_ERROR_NOT_FOUND)  # NVML's answer when no sample is newer
        return samples


def _check_scenario(s: Any, nv: Any) -> dict[str, Any]:
    """Refuse a scenario whose shape the fake cannot play, naming the first problem."""
    if not isinstance(s, dict):
        raise ScenarioError("expected a JSON object")
    _check_error_names(s, "scenario", nv)
    gpus = s.get("gpus", [])
    if not isinstance(gpus, list):
        raise ScenarioError("gpus: expected a list")
    for i, g in enumerate(gpus):
        _check_device(g, f"gpus[{i}]")
    mf = s.get("missing_functions", [])
    if not isinstance(mf, list) or not all(isinstance(x, str) for x in mf):
        raise ScenarioError("missing_functions: expected a list of NVML function names")
    for k in ("init_error", "driver_version"):
        if k in s and not isinstance(s[k], str):
            raise ScenarioError(f"{k}: expected a string")
    return s


def _is_error(v: Any) -> bool:
    """An NVML_ERROR_* name: what a call answers instead of its value."""
    return isinstance(v, str) and v.startswith("NVML_ERROR_")


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 64


def _check_error_names(v: Any, where: str, nv: Any) -> None:
    """Every NVML_ERROR_* name anywhere in the scenario is one pynvml has."""
    if _is_error(v) and not isinstance(getattr(nv, v, None), int):
        raise ScenarioError(f"{where}: {v} is not an NVML error code")
    if isinstance(v, dict):
        for k, x in v.items():
            _check_error_names(x, f"{where}.{k}", nv)
    elif isinstance(v, list):
        for i, x in enumerate(v):
            _check_error_names(x, f"{where}[{i}]", nv)


def _check_numbers(v: Any, where: str, keys: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
    """An object of counts (`keys` required), or an error name."""
    if _is_error(v):
        return
    if not isinstance(v, dict):
        raise ScenarioError(f"{where}: expected an object or an NVML_ERROR_* name")
    for k in keys + optional:
        if k in v and not _is_count(v[k]) and not _is_error(v[k]):
            raise ScenarioError(f"{where}.{k}: expected a non-negative integer")
    for k in keys:
        if k not in v:
            raise ScenarioError(f"{where}: missing {k!r}")


def _check_list(v: Any, where: str, item: Callable[[Any, str], None]) -> None:
    """A list whose every item passes `item`, or an error name."""
    if _is_error(v):
        return
    if not isinstance(v, list):
        raise ScenarioError(f"{where}: expected a list")
    for i, x in enumerate(v):
        item(x, f"{where}[{i}]")


def _check_process(p: Any, where: str) -> None:
    if not isinstance(p, dict) or not _is_count(p.get("pid")):
        raise ScenarioError(f"{where}: expected an object with an integer pid")
    for k in ("used_bytes", "gpu_instance_id", "compute_instance_id"):
        if p.get(k) is not None and not _is_count(p[k]):
            raise ScenarioError(f"{where}.{k}: expected a non-negative integer or null")


def _check_migs(v: Any, where: str) -> None:
    if not isinstance(v, list):
        raise ScenarioError(f"{where}: expected a list")
    for i, m in enumerate(v):
        if m is not None:  # an empty slot
            _check_device(m, f"{where}[{i}]")


def _check_string(v: Any, where: str) -> None:
    if not isinstance(v, str):
        raise ScenarioError(f"{where}: expected a string")


def _check_count(v: Any, where: str) -> None:
    if not _is_count(v) and not _is_error(v):
        raise ScenarioError(f"{where}: expected a non-negative integer")


# A GPU's (or MIG instance's) keys and how each is checked; another key is not the fake's and is let be.
_DEVICE_CHECKS: dict[str, Callable[[Any, str], None]] = {
    **dict.fromkeys(("name", "uuid", "bus_id"), _check_string),
    **dict.fromkeys(("temperature_c", "power_mw", "power_limit_mw", "mig_max_devices", "fan_speed_percent", "pstate",
                     "clocks_event_reasons", "encoder_util_percent", "decoder_util_percent"), _check_count),
    **{k: partial(_check_numbers, keys=keys) for k, keys in (
        ("memory", ("total", "used", "free", "reserved")), ("utilization", ("gpu", "memory")),
        ("clocks_mhz", ("sm", "mem")), ("pcie_kb_per_s", ("tx", "rx")), ("ecc_uncorrected", ("volatile", "aggregate")),
        ("ecc_corrected", ("volatile", "aggregate")), ("retired_pages", ("sbe", "dbe")),
        ("instance_ids", ("gpu", "compute")))},
    **dict.fromkeys(("pcie_bytes", "nvlink_kib"),
                    partial(_check_numbers, keys=("tx", "rx"), optional=("tx_per_s", "rx_per_s"))),
    **dict.fromkeys(("compute_processes", "graphics_processes"), partial(_check_list, item=_check_process)),
    "process_utilization": partial(_check_list, item=partial(_check_numbers, keys=("pid", "timestamp_us", "sm", "mem"),
                                                             optional=("period_us",))),
    "mig_devices": _check_migs,
}


def _check_device(g: Any, where: str) -> None:
    """A GPU (or a MIG instance) of the scenario."""
    if not isinstance(g, dict):
        raise ScenarioError(f"{where}: expected an object")
    for k, v in g.items():
        if (check := _DEVICE_CHECKS.get(k)) is not None:
            check(v, f"{where}.{k}")


# -- reading ----------------------------------------------------------------------------------------------------

# Where NVML says a call does not exist in this driver: try the older version of the call.
def _older_call_codes(nv: Any) -> tuple[int, ...]:
    return (nv.NVML_ERROR_FUNCTION_NOT_FOUND, nv.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)


def _no_counter_codes(nv: Any) -> tuple[int, ...]:
    """What a driver without the PCIe byte-counter fields answers (an unknown field id, or no field call)."""
    return (nv.NVML_ERROR_NOT_SUPPORTED, nv.NVML_ERROR_INVALID_ARGUMENT, nv.NVML_ERROR_FUNCTION_NOT_FOUND)


def explain(e: Any, nv: Any) -> str:
    """What an NVMLError means for the user, with the NVML code name to search for."""
    code: int = getattr(e, "value", -1)
    names, texts = _error_texts(nv)
    return f"{texts.get(code) or str(e)} ({names.get(code, f'NVML error {code}')})"


NVML_LIBRARY = "libnvidia-ml.so.1"  # what pynvml's nvmlInit loads on Linux (pynvml._LoadNvmlLibrary)
NO_LIBRARY = (f"NVML library ({NVML_LIBRARY}) not found: no NVIDIA driver here, or the container does not "
              "have it (docker run --gpus all)")


_pynvml_found = False  # nvidia-ml-py was found installed (_no_nvml)


def _no_nvml(make: Callable[[], NvmlBackend]) -> Unavailable | None:
    """Why NVML cannot be read, found without importing pynvml (~20 ms of CPU with its ctypes.util, on a machine
    with no NVIDIA driver, before the first frame): it is not installed, or the library it would load cannot be
    loaded (the same dlopen nvmlInit makes, answered as nvmlInit answers it: NVML_ERROR_LIBRARY_NOT_FOUND). None
    where pynvml is to be asked (the library loads, or `make` is not the real backend)."""
    if make is not make_backend or os.environ.get(FAKE_ENV) or sys.platform == "win32":
        return None
    import ctypes

    global _pynvml_found
    if not _pynvml_found:  # asked again each read until found (an install while dltop runs is seen)
        import importlib.util

        if importlib.util.find_spec("pynvml") is None:
            return Unavailable(NOT_INSTALLED)
        _pynvml_found = True
    try:
        ctypes.CDLL(NVML_LIBRARY)
    except OSError:
        return Unavailable(f"{NO_LIBRARY} (NVML_ERROR_LIBRARY_NOT_FOUND)", "no_library")
    return None


@cache
def _error_texts(nv: Any) -> tuple[dict[int, str], dict[int, str]]:
    """NVML_ERROR_* names by code, and what the codes a user meets mean (built once: dir() is slow)."""
    names = {getattr(nv, n): n for n in dir(nv) if n.startswith("NVML_ERROR_")}
    texts = {
        nv.NVML_ERROR_LIBRARY_NOT_FOUND: NO_LIBRARY,
        nv.NVML_ERROR_DRIVER_NOT_LOADED: "NVIDIA driver not loaded: the library is here but the kernel module "
                                         "is not (nvidia-smi fails the same way)",
        nv.NVML_ERROR_LIB_RM_VERSION_MISMATCH: "driver/library version mismatch: libnvidia-ml and the loaded "
                                               "kernel module differ (driver updated without a reboot?): reboot "
                                               "or reload the nvidia module",
        nv.NVML_ERROR_NO_PERMISSION: "permission denied: this user may not query the GPU (/dev/nvidia* "
                                     "permissions, or a call that needs root)",
        nv.NVML_ERROR_GPU_IS_LOST: LOST_TEXT.format(where="look for Xid 79 in dmesg"),
        nv.NVML_ERROR_NOT_SUPPORTED: "not supported by this GPU or driver",
        nv.NVML_ERROR_FUNCTION_NOT_FOUND: "the driver is too old for this call",
        nv.NVML_ERROR_UNINITIALIZED: "NVML is not initialized",
        nv.NVML_ERROR_TIMEOUT: "NVML timed out",
    }
    return names, texts


NO_PROCESS_MEMORY = ("NVML gives no per-process memory here (NVML_VALUE_NOT_AVAILABLE): MIG without admin rights, "
                     "WSL, or a container")
MEMORY_FIELDS = ("memory_pool", "memory_total_bytes", "memory_used_bytes", "memory_free_bytes", "memory_reserved_bytes")
PCIE_FIELDS = ("pcie_tx_bytes_total", "pcie_rx_bytes_total", "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s",
               "pcie_counters_at")
MAX_KEPT_REASONS = 4096  # sets of reasons shared between Snapshots (GpuReader._shared)
NO_FIELD_TIME = "NVML gave no timestamp with the counters: a rate is over the Snapshots' interval"
PCIE_RATE_FROM_COUNTERS = ("from the PCIe byte counters (pcie_*_bytes_total): a rate needs two readings "
                           "(dltop.derive.gpu_rates)")
# nvmlClocksEventReason* bits in nvidia-smi -q's words ("Clocks Event Reasons"), in its order
THROTTLE_REASONS = ((0x1, "Idle"), (0x2, "Applications Clocks Setting"), (0x4, "SW Power Cap"),
                    (0x8, "HW Slowdown"), (0x40, "HW Thermal Slowdown"), (0x80, "HW Power Brake Slowdown"),
                    (0x10, "Sync Boost"), (0x20, "SW Thermal Slowdown"), (0x100, "Display Clock Setting"))
UNPROBED = unprobed_split()  # one shared (frozen) value: a tick builds many processes
DEVICE_FIELDS = tuple(f for f in GpuDevice.__dataclass_fields__
                      if f not in ("index", "mig_devices", "processes", "unavailable", "driver_version", "down",
                                   "backend", "memory_pool_note"))


class _Lost(Exception):
    """A call said NVML_ERROR_GPU_IS_LOST (or the GPU's handle failed): stop asking this GPU anything this tick."""

    def __init__(self, reason: str, word: str = "lost") -> None:
        self.reason = reason
        self.word = word  # GpuDevice.down


def _why(e: Any, nv: Any) -> str:
    """What a failed call means (`explain`); a lost GPU raises _Lost instead, ending this GPU's tick."""
    if e.value == nv.NVML_ERROR_GPU_IS_LOST:
        raise _Lost(explain(e, nv)) from None
    return explain(e, nv)


def _absent_word(e: Any, nv: Any) -> str | None:
    """The word for an nvmlInit failure that means this machine has no NVIDIA GPU to read (no library, no driver):
    a state, not a failure; None for one that fails a machine with GPUs (no permission, a version mismatch)."""
    return {nv.NVML_ERROR_LIBRARY_NOT_FOUND: "no_library",
            nv.NVML_ERROR_DRIVER_NOT_LOADED: "no_driver"}.get(getattr(e, "value", None))


def _down_word(e: Any, nv: Any) -> str:
    """GpuDevice.down for a GPU whose handle fails: one word of a fixed set (an exporter label)."""
    return {nv.NVML_ERROR_GPU_IS_LOST: "lost", nv.NVML_ERROR_NO_PERMISSION: "no_permission",
            nv.NVML_ERROR_TIMEOUT: "timeout", nv.NVML_ERROR_RESET_REQUIRED: "reset_required"}.get(
        getattr(e, "value", None), "error")


def throttle_names(mask: int) -> tuple[str, ...]:
    """The reasons set in a clocks-event mask, named as nvidia-smi -q names them; a bit NVML added later by its
    value ("0x200")."""
    known = 0
    names = []
    for bit, name in THROTTLE_REASONS:
        known |= bit
        if mask & bit:
            names.append(name)
    rest = mask & ~known
    names += [hex(1 << i) for i in range(rest.bit_length()) if rest >> i & 1]
    return tuple(names)


def _system_memory(path: str) -> tuple[int, int] | str:
    """(MemTotal, MemAvailable) in bytes from /proc/meminfo, or why not in one line."""
    from dltop.sources.memory import parse_meminfo

    bad: dict[str, str] = {}
    try:
        meminfo = parse_meminfo(procfs.read_text(path), bad)
    except OSError as e:
        return f"cannot read {path}: {e.strerror or e}"
    total, available = meminfo.get("MemTotal"), meminfo.get("MemAvailable")
    if total is None or available is None:
        key = "MemTotal" if total is None else "MemAvailable"
        return bad.get(key, f"no {key} in {path}")
    if available > total:  # used = total - available would come out negative
        return f"MemAvailable {available >> 10} kB is more than MemTotal {total >> 10} kB in {path}"
    return total, available


class _Fields(Fields):
    """One NVIDIA GPU's fields: `ask` NVML, and `fixed` keeps a board's identity for the session."""

    def __init__(self, reader: GpuReader, index: int) -> None:
        super().__init__(index, reader._slow, reader._clock)
        self.nv = reader._nv
        self._fixed = reader._fixed

    def ask(self, fieldname: str, call: Callable[..., Any], *args: Any) -> Any:
        """The call's answer, kept as the field's value; None with the reason where it fails."""
        try:
            value = call(*args)
        except self.nv.NVMLError as e:
            self.missing[fieldname] = _why(e, self.nv)
            return None
        self.values[fieldname] = value
        return value

    def slow_ask(self, fieldname: str, call: Callable[..., Any], *args: Any) -> None:
        """`ask` at most once a SLOW_READ_S."""
        self.slow(fieldname, self.ask, fieldname, call, *args)

    def fixed(self, fieldname: str, call: Callable[..., Any], *args: Any) -> Any:
        """`ask` until it answers, then that answer for the session: a handle's name, UUID and PCI address are the
        board's (nvitop keeps them too); an index that is lost and found again is a new session."""
        kept_by, key = self._fixed, (self.index, fieldname)
        if key in kept_by:
            self.values[fieldname] = value = kept_by[key]
            return value
        value = self.ask(fieldname, call, *args)
        if value is not None:
            kept_by[key] = value
        return value

    def pair(self, names: tuple[str, str], call: Callable[..., Any], *args: Any, scale: int = 1) -> Any:
        """Two fields from one call that answers both (its answer's first two items), or each missing with why."""
        got = self.ask(names[0], call, *args)
        if got is None:
            self.missing[names[1]] = self.missing[names[0]]
        else:
            self.values[names[0]], self.values[names[1]] = got[0] * scale, got[1] * scale
        return got


def _sensors(b: NvmlBackend, h: Any, f: _Fields) -> None:
    """Utilization, temperature, power, fan, P-state, throttle reasons, clocks, encoder and decoder."""
    f.pair(("utilization_gpu_percent", "utilization_memory_percent"), b.utilization, h)
    if f.ask("temperature_c", b.temperature_c, h) is not None:
        f.values["temperature_sensor"] = "gpu"
    else:
        f.missing["temperature_sensor"] = f.missing["temperature_c"]
    f.ask("power_mw", b.power_mw, h)
    f.slow_ask("power_limit_mw", b.power_limit_mw, h)
    f.ask("fan_speed_percent", b.fan_percent, h)
    if (pstate := f.ask("pstate", b.performance_state, h)) is not None and not 0 <= pstate <= 15:
        del f.values["pstate"]
        f.missing["pstate"] = f"NVML gives no P-state (NVML_PSTATE_UNKNOWN, {pstate})"
    if (mask := f.ask("clocks_event_reasons", b.clocks_event_reasons, h)) is not None:
        f.values["throttle_reasons"] = throttle_names(mask)
    else:
        f.missing["throttle_reasons"] = f.missing["clocks_event_reasons"]
    f.ask("clock_sm_mhz", b.clock_mhz, h, "sm")
    f.ask("clock_mem_mhz", b.clock_mhz, h, "mem")
    f.ask("encoder_util_percent", b.codec_utilization, h, "encoder")
    f.ask("decoder_util_percent", b.codec_utilization, h, "decoder")


def _links_and_errors(b: NvmlBackend, h: Any, f: _Fields) -> None:
    """NVLink's byte counters, ECC error counts and retired pages (the aggregate ones read once a minute)."""
    if (kib := f.pair(("nvlink_tx_bytes_total", "nvlink_rx_bytes_total"), b.nvlink_kib, h, scale=1024)) is None:
        f.missing["nvlink_counters_at"] = f.missing["nvlink_tx_bytes_total"]
    elif kib[2] is not None:
        f.values["nvlink_counters_at"] = kib[2]
    else:
        f.missing["nvlink_counters_at"] = NO_FIELD_TIME
    f.ask("ecc_corrected_volatile", b.ecc_corrected, h, "volatile")
    f.ask("ecc_uncorrected_volatile", b.ecc_uncorrected, h, "volatile")
    f.slow_ask("ecc_corrected_aggregate", b.ecc_corrected, h, "aggregate")
    f.slow_ask("ecc_uncorrected_aggregate", b.ecc_uncorrected, h, "aggregate")
    f.slow_ask("retired_pages_sbe", b.retired_pages, h, "sbe")
    f.slow_ask("retired_pages_dbe", b.retired_pages, h, "dbe")
    f.slow_ask("retired_pages_pending", b.retired_pages_pending, h)


def _system_pool(f: _Fields, said: str, root: str) -> None:
    """A unified-memory machine (GB10, Grace): the GPU allocates from system memory, so that is the pool."""
    note = f"unified memory: NVML reports {said}; the pool is system memory, from /proc/meminfo"
    f.values.update(memory_pool="system", memory_pool_note=note)
    f.missing["memory_reserved_bytes"] = note
    got = _system_memory(os.path.join(root, "proc/meminfo"))
    if isinstance(got, str):
        why = f"{note}, which could not be read ({got})"
        f.missing.update(memory_total_bytes=why, memory_used_bytes=why, memory_free_bytes=why)
        return
    total, available = got
    f.values.update(memory_total_bytes=total, memory_used_bytes=total - available, memory_free_bytes=available)


class GpuReader:
    """Holds one NVML session and what is worth keeping between ticks: which call versions the driver has, the
    last utilization sample seen per GPU, and each process's command line."""

    def __init__(self, make_backend: Callable[[], NvmlBackend], root: str = "/",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._make_backend = make_backend
        self._root = root
        self._proc = os.path.join(root, "proc")
        self._backend: NvmlBackend | None = None
        self._nv: Any = None
        self._memory_version = 2
        self._process_version: dict[ProcessKind, int] = {}
        self._pcie_no_counters: dict[int, str] = {}  # GPU index -> why its driver has no PCIe byte counters
        # the reasons of a tick's GPUs and processes, one dict for each set (see _shared)
        self._reasons: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
        self._fixed: dict[tuple[int, str], Any] = {}  # (GPU index, field) -> its answer this session (`fixed`)
        self._count = 0  # the device count they were read under
        self._util_seen_us: dict[str, int] = {}
        self._clock = clock
        # (GPU index, field) -> (when read, its value, why not): the slow-changing numbers (`Fields.slow`)
        self._slow: dict[tuple[int, str], tuple[float, Any, str | None]] = {}
        self._host = HostReader(self._proc, clock)  # each process's /proc: user, command, parent, RSS, CPU %

    def close(self) -> None:
        """End the NVML session."""
        if self._backend is not None:
            with contextlib.suppress(self._nv.NVMLError):
                self._backend.shutdown()
            self._backend = None
        self._fixed.clear()  # indices are only stable within one session
        self._slow.clear()
        self._host.close()

    def _start(self) -> Unavailable | None:
        """Begin the NVML session, or say why it cannot begin."""
        if (absent := _no_nvml(self._make_backend)) is not None:
            return absent
        try:
            import pynvml
        except ImportError:
            return Unavailable(NOT_INSTALLED)
        self._nv = nv = pynvml
        try:
            backend = self._make_backend()
        except ScenarioError as e:
            return Unavailable(f"fake NVML ({FAKE_ENV}): {e}")
        try:
            backend.init()
        except nv.NVMLError as e:
            return Unavailable(explain(e, nv), _absent_word(e, nv))
        self._backend = backend
        return None

    def read(self) -> GpuPart | Unavailable:
        """Every GPU NVML sees, or why none can be read."""
        if self._backend is None and (why := self._start()) is not None:
            return why
        nv, b = self._nv, self._backend
        assert b is not None
        try:
            count = b.device_count()
        except nv.NVMLError as e:
            self.close()  # a fresh session next tick (the driver may come back)
            return Unavailable(explain(e, nv))
        try:
            driver: str | None = b.driver_version()
        except nv.NVMLError:
            driver = None
        if count == 0:
            return Unavailable(f"no GPUs: NVML (driver {driver or 'version unknown'}) sees 0 devices", "no_devices")
        if count != self._count:  # NVML's count is its init's; should it change, no index is the board it was
            self._fixed.clear()
            self._count = count
        gpus = tuple(self._device(b, i, driver) for i in range(count))
        self._host.end_tick()
        return gpus

    def _device(self, b: NvmlBackend, index: int, driver: str | None) -> GpuDevice:
        nv = self._nv
        f = _Fields(self, index)
        migs: tuple[MigDevice, ...] = ()
        try:
            try:
                h = b.handle(index)
            except nv.NVMLError as e:
                raise _Lost(explain(e, nv), _down_word(e, nv)) from None
            f.fixed("name", b.name, h)
            uuid = f.fixed("uuid", b.uuid, h)
            f.fixed("bus_id", b.bus_id, h)
            self._memory(b, h, f)
            _sensors(b, h, f)
            self._pcie(b, h, f)
            _links_and_errors(b, h, f)
            if f.ask("mig_mode", b.mig_mode, h):
                migs = self._mig_devices(b, h)
            processes = self._processes(b, h, uuid or f"gpu{index}")
        except _Lost as lost:
            return self._down(f, lost, migs)
        return GpuDevice(index=index, driver_version=driver, mig_devices=migs, processes=processes,
                         unavailable=self._shared(f.missing), **f.values)

    def _down(self, f: _Fields, lost: _Lost, migs: tuple[MigDevice, ...]) -> GpuDevice:
        """A GPU that stopped answering this tick: what it gave before it stopped, each other field missing with
        the reason, and its name as this NVML session read it before, so the series that goes to 0 is the one it
        had. Its driver version is not its to claim: the GPU gives nothing."""
        for name in DEVICE_FIELDS:
            if name not in f.values:
                f.missing.setdefault(name, lost.reason)
        for name in ("name", "uuid", "bus_id"):
            if (known := self._fixed.get((f.index, name))) is not None:
                f.values.setdefault(name, known)
        f.missing["driver_version"] = f"{DOWN_DRIVER}: {f.missing.get('memory_total_bytes', lost.word)}"
        return GpuDevice(index=f.index, mig_devices=migs, processes=Unavailable(lost.reason),
                         unavailable=self._shared(f.missing), down=lost.word, **f.values)

    def _memory_info(self, b: NvmlBackend, h: Any) -> MemoryInfo:
        """The v2 memory call, or v1 where the driver has no v2 (remembered for the session)."""
        try:
            return b.memory(h, self._memory_version)
        except self._nv.NVMLError as e:
            if self._memory_version == 1 or e.value not in _older_call_codes(self._nv):
                raise
        self._memory_version = 1
        return b.memory(h, 1)

    def _memory(self, b: NvmlBackend, h: Any, f: _Fields) -> None:
        """The framebuffer's numbers, or system memory's on a unified-memory machine."""
        nv = self._nv
        try:
            mem = self._memory_info(b, h)
        except nv.NVMLError as e:
            why = _why(e, nv)
            if e.value == nv.NVML_ERROR_NOT_SUPPORTED:
                _system_pool(f, "no framebuffer total (Not Supported)", self._root)
            else:
                f.missing.update(dict.fromkeys(MEMORY_FIELDS, why))
            return
        if mem.total <= 0:
            _system_pool(f, "a framebuffer total of 0", self._root)
            return
        f.values.update(memory_pool="framebuffer", memory_total_bytes=mem.total, memory_used_bytes=mem.used,
                        memory_free_bytes=mem.free)
        if mem.reserved is not None:
            f.values["memory_reserved_bytes"] = mem.reserved
        else:
            f.missing["memory_reserved_bytes"] = ("the driver has no v2 memory call (nvmlDeviceGetMemoryInfo_v2, "
                                                  "drivers before R510): used includes the driver's reserve")

    def _pcie(self, b: NvmlBackend, h: Any, f: _Fields) -> None:
        """PCIe traffic from the byte counters, or from the throughput call on a GPU whose driver has none (found
        out once per GPU for the session)."""
        nv = self._nv
        no_counters = self._pcie_no_counters.get(f.index)
        if no_counters is None:
            try:
                tx, rx, at = b.pcie_bytes(h)
            except nv.NVMLError as e:
                why = _why(e, nv)
                if e.value not in _no_counter_codes(nv):  # the counters exist but failed this time
                    f.values["pcie_source"] = "byte_counters"
                    f.missing.update(dict.fromkeys(PCIE_FIELDS, why))
                    return
                no_counters = self._pcie_no_counters[f.index] = (
                    "no PCIe byte counters (NVML_FI_DEV_PCIE_COUNT_TX_BYTES / _RX_BYTES, drivers 555+): "
                    f"{why}; the rate is nvmlDeviceGetPcieThroughput's")
            else:
                f.values.update(pcie_source="byte_counters", pcie_tx_bytes_total=tx, pcie_rx_bytes_total=rx)
                if at is not None:
                    f.values["pcie_counters_at"] = at
                else:
                    f.missing["pcie_counters_at"] = NO_FIELD_TIME
                f.missing.update(pcie_tx_bytes_per_s=PCIE_RATE_FROM_COUNTERS,
                                 pcie_rx_bytes_per_s=PCIE_RATE_FROM_COUNTERS)
                return
        f.values["pcie_source"] = "throughput"
        f.missing.update(pcie_tx_bytes_total=no_counters, pcie_rx_bytes_total=no_counters,
                         pcie_counters_at=no_counters)
        for direction in ("tx", "rx"):
            kb = f.ask(f"pcie_{direction}_bytes_per_s", b.pcie_kb_per_s, h, direction)
            if kb is not None:
                f.values[f"pcie_{direction}_bytes_per_s"] = kb * 1024  # NVML counts KB/s

    def _mig_devices(self, b: NvmlBackend, h: Any) -> tuple[MigDevice, ...]:
        """The GPU's MIG instances, slot by slot (an empty slot answers NVML_ERROR_NOT_FOUND)."""
        nv = self._nv
        try:
            slots = b.mig_device_count(h)
        except nv.NVMLError as e:
            _why(e, nv)  # a lost GPU raises here
            return ()
        out = []
        for j in range(slots):
            try:
                mh = b.mig_handle(h, j)
            except nv.NVMLError as e:
                if e.value != nv.NVML_ERROR_NOT_FOUND:
                    why = _why(e, nv)
                    out.append(MigDevice(mig_index=j, processes=Unavailable(why), unavailable={"mig_device": why}))
                continue
            out.append(self._mig_device(b, mh, j))
        return tuple(out)

    def _mig_device(self, b: NvmlBackend, mh: Any, j: int) -> MigDevice:
        f = _Fields(self, j)  # ask and pair only: fixed and slow_ask key on the index, which GPU j has too
        f.ask("name", b.name, mh)
        uuid = f.ask("uuid", b.uuid, mh)
        f.pair(("gpu_instance_id", "compute_instance_id"), b.mig_ids, mh)
        if (m := f.ask("memory_total_bytes", b.memory, mh, self._memory_version)) is None:
            f.missing["memory_used_bytes"] = f.missing["memory_free_bytes"] = f.missing["memory_total_bytes"]
        else:
            f.values.update(memory_total_bytes=m.total, memory_used_bytes=m.used, memory_free_bytes=m.free)
        return MigDevice(mig_index=j, processes=self._processes(b, mh, uuid or f"mig{j}"), unavailable=f.missing,
                         **f.values)

    def _process_list(self, b: NvmlBackend, h: Any, kind: ProcessKind) -> list[ProcessInfo]:
        """v3, then v2, then v1 of the process call, remembering the first the driver has."""
        nv = self._nv
        version = self._process_version.get(kind, 3)
        while True:
            try:
                procs = b.processes(h, kind, version)
            except nv.NVMLError as e:
                if e.value in _older_call_codes(nv) and version > 1:
                    version -= 1
                    continue
                raise
            self._process_version[kind] = version
            return procs

    def _processes(self, b: NvmlBackend, h: Any, key: str) -> tuple[GpuProcess, ...] | Unavailable:
        found = self._process_lists(b, h)
        if isinstance(found, Unavailable):
            return found
        util, util_why = self._utilization(b, h, key)
        return tuple(self._process(pid, p, kind, util.get(pid), util_why) for pid, (p, kind) in sorted(found.items()))

    def _process_lists(self, b: NvmlBackend, h: Any) -> dict[int, tuple[ProcessInfo, str]] | Unavailable:
        """pid -> (NVML's info, its kind: compute, graphics or both) of the processes on a GPU."""
        nv = self._nv
        found: dict[int, tuple[ProcessInfo, str]] = {}
        for kind in ("compute", "graphics"):
            try:
                procs = self._process_list(b, h, kind)  # type: ignore[arg-type]
            except nv.NVMLError as e:
                why = _why(e, nv)
                if kind == "graphics" and e.value == nv.NVML_ERROR_NOT_SUPPORTED:
                    continue  # compute-only GPUs have no graphics list
                return Unavailable(f"processes: {why}")
            for p in procs:
                found[p.pid] = (found[p.pid][0], "compute+graphics") if p.pid in found else (p, kind)
        return found

    def _utilization(self, b: NvmlBackend, h: Any, key: str) -> tuple[dict[int, ProcessSample], str | None]:
        """Each process's newest SM and memory sample since the last read, and why there are none where NVML
        says why."""
        nv = self._nv
        util: dict[int, ProcessSample] = {}
        util_why = None
        try:
            for s in b.process_utilization(h, self._util_seen_us.get(key, 0)):
                if s.pid not in util or s.timestamp_us > util[s.pid].timestamp_us:
                    util[s.pid] = s
        except nv.NVMLError as e:
            util_why = _why(e, nv)
            if e.value == nv.NVML_ERROR_NOT_FOUND:
                util_why = "no utilization sample since the last read (NVML_ERROR_NOT_FOUND)"
        if util:
            self._util_seen_us[key] = max(s.timestamp_us for s in util.values())
        return util, util_why

    def _shared(self, reasons: dict[str, str]) -> dict[str, str]:
        """The dict of these reasons read before, where there is one: the history keeps every Snapshot (600),
        and the same reasons, tick after tick and process after process, were a dict and strings of their own
        each time (a fifth of what a tick of 8 GPUs x 20 processes added to memory). Nothing changes a Snapshot's
        `unavailable` once made."""
        key = tuple(reasons.items())
        kept = self._reasons.get(key)
        if kept is None:
            if len(self._reasons) >= MAX_KEPT_REASONS:
                self._reasons.clear()
            kept = self._reasons[key] = reasons
        return kept

    def _process(self, pid: int, p: ProcessInfo, kind: str, sample: ProcessSample | None,
                 util_why: str | None) -> GpuProcess:
        host = self._host.read(pid)  # once a tick: a process under a GPU and a MIG instance of it
        missing: dict[str, str] = {}
        if p.used_bytes is None:
            missing["used_bytes"] = NO_PROCESS_MEMORY
        if sample is None:
            missing["gpu_util_percent"] = missing["mem_util_percent"] = (
                util_why or "no utilization sample for this process since the last read")
        missing.update(host.unavailable)
        return GpuProcess(pid=pid, kind=kind, used_bytes=p.used_bytes, user=host.user,  # type: ignore[arg-type]
                          command=host.command,
                          gpu_util_percent=None if sample is None else sample.sm_percent,
                          mem_util_percent=None if sample is None else sample.mem_percent,
                          gpu_instance_id=p.gpu_instance_id, compute_instance_id=p.compute_instance_id,
                          start_time_ticks=host.start_time_ticks, ppid=host.ppid, host_rss_bytes=host.host_rss_bytes,
                          cpu_percent=host.cpu_percent, started_at=host.started_at, parent_user=host.parent_user,
                          parent_command=host.parent_command, split=UNPROBED,
                          unavailable=self._shared(missing))


def make_backend() -> NvmlBackend:
    """The fake named by $DLTOP_FAKE_NVML, else NVML itself."""
    path = os.environ.get(FAKE_ENV)
    if path:
        return FakeBackend.from_file(path)
    return PynvmlBackend()


class GpusReader:
    """NVIDIA's GPUs through NVML, then AMD's through amdsmi (numbered after NVML's): each library that loads
    is read, both where both do. Where neither has a GPU the part says why for each."""

    def __init__(self, nvml: GpuReader | None, amd: AmdReader | None) -> None:
        self.nvml, self.amd = nvml, amd

    def close(self) -> None:
        """End both sessions."""
        for reader in (self.nvml, self.amd):
            if reader is not None:
                reader.close()

    def read(self) -> GpuPart | Unavailable:
        """Every GPU either library sees, or why none can be read."""
        nv = self.nvml.read() if self.nvml is not None else None
        amd = self.amd.read(len(nv) if isinstance(nv, tuple) else 0) if self.amd is not None else None
        return _combined([p for p in (nv, amd) if p is not None])


def _combined(parts: list[GpuPart | Unavailable]) -> GpuPart | Unavailable:
    """The GPUs of every library that read some; where none did, the one that fails (that is the news), else why
    each has none."""
    gpus: list[GpuDevice] = []
    why: list[Unavailable] = []
    for part in parts:
        if isinstance(part, Unavailable):
            why.append(part)
        else:
            gpus += part
    if len(why) < len(parts):
        return tuple(gpus)
    down = [p for p in why if not p.absent]
    if down or len(why) == 1:
        return (down or why)[0]
    return Unavailable(f"{why[0].reason}; AMD: {why[1].reason}", why[0].absent)


def amd_reader(root: str) -> AmdReader:
    """The amdsmi reader: the fake module named by $DLTOP_FAKE_AMDSMI, else ROCm's bindings."""
    from dltop.sources import amd, amd_fake

    host = HostReader(os.path.join(root, "proc"))  # AMD processes' /proc facts, kept apart from NVML's

    path = os.environ.get(amd_fake.FAKE_AMD_ENV)
    if not path:
        return amd.AmdReader(host)

    def load() -> Any:
        try:
            return amd_fake.fake_amdsmi(amd_fake.load(path))
        except ScenarioError as e:
            raise ImportError(f"fake amdsmi ({amd_fake.FAKE_AMD_ENV}): {e}") from None

    return amd.AmdReader(host, lambda: amd.import_amdsmi(load))


def source(settings: Settings) -> Source:
    """The GPU source at the refresh interval, holding one NVML (and amdsmi) session until closed. Where a fake
    is named for one library, the other is not read: a scenario describes the whole machine."""
    nvml_fake, amd_fake = bool(os.environ.get(FAKE_ENV)), bool(os.environ.get("DLTOP_FAKE_AMDSMI"))
    nvml = GpuReader(make_backend, settings.root) if nvml_fake or not amd_fake else None
    amd = amd_reader(settings.root) if amd_fake or not nvml_fake else None
    reader = GpusReader(nvml, amd)
    return Source(name="gpus", interval_s=settings.refresh_s, read=reader.read,
                  timeout_s=max(2.0, settings.refresh_s * 2), follows_refresh=True, close=reader.close)
