"""AMD GPUs through amdsmi, the Python bindings ROCm ships (/opt/rocm/share/amd_smi; PyPI's `amdsmi` 7.0.x is the
same API): devices, VRAM, the processes holding it, activity, temperature, power, clocks and ECC counts.

The same `GpuDevice` fields as NVML's reader, and the same rule: a number amdsmi did not give is None with the
reason (its AMDSMI_STATUS_* name). One amdsmi session lives as long as the reader. Without ROCm's libamd_smi.so,
`import amdsmi` prints two lines to stdout and raises KeyError('libamd_smi.so'): the import is made once, with
stdout caught, and read as "no ROCm library".
"""

from __future__ import annotations

import contextlib
import importlib
import io
import time
from collections.abc import Callable
from typing import Any

from dltop.model.base import Unavailable
from dltop.model.gpu import DOWN_DRIVER, LOST_TEXT, GpuDevice, GpuPart, GpuProcess, unprobed_split
from dltop.sources.gpu_fields import Fields
from dltop.sources.gpu_procs import HostReader

# AMDSMI_STATUS_* (amdsmi.h's amdsmi_status_t); the bindings' own constants live in a module whose name and
# place changed between releases (amdsmi_wrapper), so the codes a user meets are named here.
STATUS_NAMES = {1: "AMDSMI_STATUS_INVAL", 2: "AMDSMI_STATUS_NOT_SUPPORTED", 3: "AMDSMI_STATUS_NOT_YET_IMPLEMENTED",
                4: "AMDSMI_STATUS_FAIL_LOAD_MODULE", 5: "AMDSMI_STATUS_FAIL_LOAD_SYMBOL", 6: "AMDSMI_STATUS_DRM_ERROR",
                7: "AMDSMI_STATUS_API_FAILED", 8: "AMDSMI_STATUS_TIMEOUT", 9: "AMDSMI_STATUS_RETRY",
                10: "AMDSMI_STATUS_NO_PERM", 11: "AMDSMI_STATUS_INTERRUPT", 12: "AMDSMI_STATUS_IO",
                14: "AMDSMI_STATUS_FILE_ERROR", 15: "AMDSMI_STATUS_OUT_OF_RESOURCES",
                16: "AMDSMI_STATUS_INTERNAL_EXCEPTION", 17: "AMDSMI_STATUS_INPUT_OUT_OF_BOUNDS",
                18: "AMDSMI_STATUS_INIT_ERROR", 30: "AMDSMI_STATUS_BUSY", 31: "AMDSMI_STATUS_NOT_FOUND",
                32: "AMDSMI_STATUS_NOT_INIT", 34: "AMDSMI_STATUS_DRIVER_NOT_LOADED", 40: "AMDSMI_STATUS_NO_DATA"}
NOT_SUPPORTED, NO_PERM, DRIVER_NOT_LOADED, NOT_FOUND = 2, 10, 34, 31
STATUS_TEXTS = {
    NOT_SUPPORTED: "not supported by this GPU or driver",
    NO_PERM: "permission denied: this user may not query the GPU (/dev/kfd, /dev/dri/renderD* permissions: the "
             "video and render groups)",
    DRIVER_NOT_LOADED: "amdgpu driver not loaded: the ROCm library is here but the kernel module is not",
    8: "amdsmi timed out", 30: "the GPU is busy", 32: "amdsmi is not initialized",
    # a handle amdsmi no longer finds: the GPU went away under it (as NVML's GPU_IS_LOST, in the same words)
    NOT_FOUND: LOST_TEXT.format(where="look for amdgpu errors in dmesg"),
}
# What is read of a GPU (all but its place, its lists and the notes): a GPU that cannot be read has each missing
DEVICE_FIELDS = tuple(f for f in GpuDevice.__dataclass_fields__
                      if f not in ("index", "mig_devices", "processes", "unavailable", "down", "backend",
                                   "memory_pool_note"))
NO_ROCM = ("no ROCm library: amdsmi is installed but libamd_smi.so is not (install ROCm or amd-smi-lib, or set "
           "ROCM_PATH)")
NO_BINDINGS = "amdsmi is not installed (ROCm's /opt/rocm/share/amd_smi, or pip install amdsmi)"
NOT_READ = "not read on AMD GPUs (dltop's amdsmi backend reads memory, activity, temperature, power, clocks, ECC)"
NO_VOLATILE_ECC = "amdsmi gives one ECC count per kind (amdsmi_get_gpu_total_ecc_count), not one since the driver loaded"
NO_RESERVED = "amdsmi gives no driver reserve: used is amdsmi_get_gpu_vram_usage's"
NO_MEM_UTIL = "amdsmi gives no per-process memory activity"
FIRST_UTIL = "a process's GPU activity needs two readings of amdsmi's engine time (engine_usage.gfx)"
NOT_ON_AMD = ("mig_mode", "pcie_source", "pcie_tx_bytes_total", "pcie_rx_bytes_total", "pcie_tx_bytes_per_s",
              "pcie_rx_bytes_per_s", "fan_speed_percent", "pstate", "clocks_event_reasons", "throttle_reasons",
              "encoder_util_percent", "decoder_util_percent", "nvlink_tx_bytes_total", "nvlink_rx_bytes_total",
              "pcie_counters_at", "nvlink_counters_at", "retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending")
MIB = 1 << 20
UNPROBED = unprobed_split()  # one shared (frozen) value, as the NVML reader's


def import_amdsmi(load: Callable[[], Any] = lambda: importlib.import_module("amdsmi")) -> Any:
    """The amdsmi module, or why it cannot be used (a string). Its import prints to stdout where the library is
    missing: that is caught here, so the terminal (a TUI, or `--json` output) stays clean. (A Python-level
    redirect: the bindings print with print(); it is made once per session, at the first read.)"""
    caught = io.StringIO()
    try:
        with contextlib.redirect_stdout(caught):
            amdsmi = load()
    except ImportError as e:
        return NO_BINDINGS if getattr(e, "name", None) == "amdsmi" else f"amdsmi cannot be imported: {e}"
    except (KeyError, OSError):  # the bindings are here, libamd_smi.so is not
        return NO_ROCM
    except Exception as e:  # the bindings run code at import; whatever it raises is a reason, not a crash
        return f"amdsmi cannot be imported: {type(e).__name__}: {e}"
    return amdsmi


def explain(e: BaseException) -> str:
    """What an amdsmi exception means, with the AMDSMI_STATUS_* name to search for."""
    code = getattr(e, "err_code", None)
    if not isinstance(code, int):
        return f"amdsmi: {type(e).__name__}: {e}"
    name = STATUS_NAMES.get(code, f"amdsmi status {code}")
    return f"{STATUS_TEXTS.get(code) or getattr(e, 'err_info', None) or 'amdsmi error'} ({name})"


def _number(value: Any) -> int | None:
    """An amdsmi number: "N/A" (its placeholder for 0xFFFF or a max uint), a bool or a negative is none."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 or value != value:
        return None
    return int(value)


class _Fields(Fields):
    """One AMD GPU's fields, at first each one amdsmi does not give missing."""

    def __init__(self, reader: AmdReader, index: int) -> None:
        super().__init__(index, reader._slow, reader._clock)
        self.missing.update(dict.fromkeys(NOT_ON_AMD, NOT_READ))

    def ask(self, fieldname: str, call: Callable[..., Any], *args: Any) -> Any:
        """The call's answer, or None with the reason kept for `fieldname`."""
        try:
            return call(*args)
        except Exception as e:
            self.missing[fieldname] = explain(e)
            return None

    def put(self, fieldname: str, value: Any, why: str) -> None:
        """The field's value; None: missing, for the reason already kept or else `why`."""
        if value is None:
            self.missing.setdefault(fieldname, why)
        else:
            self.values[fieldname] = value
            self.missing.pop(fieldname, None)


class AmdReader:
    """Holds one amdsmi session and, per process, the last engine-time reading (a process's activity is the
    difference of two). `host` reads each process's /proc facts (user, command, parent, host RSS, CPU %, start
    time) as it does for NVML's processes."""

    def __init__(self, host: HostReader, import_module: Callable[[], Any] = import_amdsmi,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._host = host
        self._import = import_module
        self._clock = clock
        self._smi: Any = None
        self._absent: Unavailable | None = None  # no bindings or no library: not looked for again this session
        self._session = False
        self._engine: dict[tuple[str, int], tuple[float, int]] = {}  # (GPU, pid) -> (when, gfx engine ns)
        self._slow: dict[tuple[int, str], tuple[float, Any, str | None]] = {}
        self._known: dict[int, dict[str, str]] = {}  # index -> its name, UUID and address, for when it is lost

    def close(self) -> None:
        """End the amdsmi session."""
        if self._session:
            with contextlib.suppress(Exception):
                self._smi.amdsmi_shut_down()
            self._session = False
        self._slow.clear()
        self._host.close()

    def read(self, first_index: int = 0) -> GpuPart | Unavailable:
        """Every AMD GPU amdsmi sees (numbered from `first_index`, after NVML's), or why none can be read."""
        if self._absent is not None:
            return self._absent
        if self._smi is None:
            got = self._import()
            if isinstance(got, str):
                self._absent = Unavailable(got, "no_library")
                return self._absent
            self._smi = got
        smi = self._smi
        if not self._session:
            try:
                smi.amdsmi_init(smi.AmdSmiInitFlags.INIT_AMD_GPUS)
            except Exception as e:
                code = getattr(e, "err_code", None)
                return Unavailable(f"amdsmi: {explain(e)}", "no_driver" if code == DRIVER_NOT_LOADED else None)
            self._session = True
        try:
            handles = list(smi.amdsmi_get_processor_handles())
        except Exception as e:
            self.close()  # a fresh session next tick
            return Unavailable(f"amdsmi: {explain(e)}")
        if not handles:
            return Unavailable("no GPUs: amdsmi sees 0 AMD GPUs", "no_devices")
        driver = None
        with contextlib.suppress(Exception):
            driver = str(smi.amdsmi_get_gpu_driver_info(handles[0])["driver_version"])
        gpus = tuple(self._device(h, first_index + i, driver) for i, h in enumerate(handles))
        self._host.end_tick()
        return gpus

    def _device(self, h: Any, index: int, driver: str | None) -> GpuDevice:
        smi = self._smi
        f = _Fields(self, index)
        try:
            bdf = str(smi.amdsmi_get_gpu_device_bdf(h))  # its PCI address: a GPU gone fails here first
        except Exception as e:
            if getattr(e, "err_code", None) == NOT_FOUND:
                return self._lost(index, explain(e))
            bdf = None
            f.missing["bus_id"] = explain(e)
        self._identity(h, f)
        f.put("bus_id", bdf, f.missing.get("bus_id", "no PCI address"))
        self._known[index] = {k: f.values[k] for k in ("name", "uuid", "bus_id") if k in f.values}
        self._vram(f.ask("memory_total_bytes", smi.amdsmi_get_gpu_vram_usage, h), f.values, f.missing)
        activity = f.ask("utilization_gpu_percent", smi.amdsmi_get_gpu_activity, h)
        why = f.missing.get("utilization_gpu_percent", "amdsmi gives N/A")
        act = activity if isinstance(activity, dict) else {}
        f.put("utilization_gpu_percent", _percent(act.get("gfx_activity")), why)
        f.put("utilization_memory_percent", _percent(act.get("umc_activity")), why)
        self._temperature(h, f.values, f.missing)
        self._power(h, f)
        for fieldname, clock in (("clock_sm_mhz", "GFX"), ("clock_mem_mhz", "MEM")):
            got = f.ask(fieldname, smi.amdsmi_get_clock_info, h, getattr(smi.AmdSmiClkType, clock))
            f.put(fieldname, _number(got.get("clk")) if isinstance(got, dict) else None, "amdsmi gives N/A")
        f.missing.update(ecc_corrected_volatile=NO_VOLATILE_ECC, ecc_uncorrected_volatile=NO_VOLATILE_ECC)
        f.slow("ecc_corrected_aggregate", self._ecc, h, f, "ecc_corrected_aggregate", "correctable_count")
        f.slow("ecc_uncorrected_aggregate", self._ecc, h, f, "ecc_uncorrected_aggregate", "uncorrectable_count")
        processes = self._processes(h, str(f.values.get("uuid") or index))
        return GpuDevice(index=index, driver_version=driver, backend="amdsmi", processes=processes,
                         unavailable=f.missing, **f.values)

    def _power(self, h: Any, f: _Fields) -> None:
        """The socket power each tick, and its limit once a minute (from the same call's answer)."""
        power = f.ask("power_mw", self._smi.amdsmi_get_power_info, h)
        f.put("power_mw", _socket_mw(power), f.missing.get("power_mw", "amdsmi gives N/A for the socket power"))
        limit = _number(power.get("power_limit")) if isinstance(power, dict) else None

        def power_limit() -> int | None:
            if limit is None:
                f.missing["power_limit_mw"] = f.missing.get("power_mw", "") if power is None else "amdsmi gives N/A"
                return None
            return limit * 1000

        f.slow("power_limit_mw", power_limit)

    def _ecc(self, h: Any, f: _Fields, fieldname: str, kind: str) -> int | None:
        """One of amdsmi's total ECC counts ("correctable_count", "uncorrectable_count")."""
        got = f.ask(fieldname, self._smi.amdsmi_get_gpu_total_ecc_count, h)
        if got is None:
            return None
        n = _number(got.get(kind)) if isinstance(got, dict) else None
        if n is None:
            f.missing[fieldname] = "amdsmi gives N/A"
        return n

    def _lost(self, index: int, reason: str) -> GpuDevice:
        """A GPU amdsmi no longer finds: down, each field missing with the reason, no driver version claimed; its
        name, UUID and address as read before this session lost it."""
        missing = dict.fromkeys(DEVICE_FIELDS, reason)
        missing["driver_version"] = f"{DOWN_DRIVER}: {reason}"
        known = self._known.get(index, {})
        for f in known:
            del missing[f]
        return GpuDevice(index=index, backend="amdsmi", processes=Unavailable(reason), unavailable=missing,
                         down="lost", name=known.get("name"), uuid=known.get("uuid"), bus_id=known.get("bus_id"))

    def _temperature(self, h: Any, values: dict[str, Any], missing: dict[str, str]) -> None:
        """The edge sensor, or the hotspot (junction) where the board has none (MI300-class: edge is Not
        Supported there)."""
        smi = self._smi
        kinds = smi.AmdSmiTemperatureType
        hotspot = getattr(kinds, "HOTSPOT", None) or kinds.JUNCTION  # JUNCTION: its name before ROCm 6.1
        tried = []
        for word, sensor in (("edge", kinds.EDGE), ("hotspot", hotspot)):
            try:
                t = smi.amdsmi_get_temp_metric(h, sensor, smi.AmdSmiTemperatureMetric.CURRENT)
            except Exception as e:
                tried.append(f"{word}: {explain(e)}")
                continue
            if (c := _number(t)) is None:
                tried.append(f"{word}: amdsmi gives N/A")
                continue
            values.update(temperature_c=c, temperature_sensor=word)
            return
        missing["temperature_c"] = missing["temperature_sensor"] = "; ".join(tried)

    def _identity(self, h: Any, f: _Fields) -> None:
        """The board's name and UUID."""
        smi = self._smi
        asic = f.ask("name", smi.amdsmi_get_gpu_asic_info, h)
        f.put("name", None if not isinstance(asic, dict) or asic.get("market_name") in (None, "N/A")
              else str(asic["market_name"]), "amdsmi gives no market name")
        uuid = f.ask("uuid", smi.amdsmi_get_gpu_device_uuid, h)
        f.put("uuid", None if uuid is None else str(uuid), "no UUID")

    @staticmethod
    def _vram(vram: Any, values: dict[str, Any], missing: dict[str, str]) -> None:
        """The memory numbers from amdsmi's VRAM usage (in MB), or why each is missing."""
        total = used = None
        if isinstance(vram, dict):
            total, used = _number(vram.get("vram_total")), _number(vram.get("vram_used"))
        why = missing.get("memory_total_bytes", "amdsmi_get_gpu_vram_usage gave no number")
        if total and used is not None and used <= total:
            values.update(memory_pool="framebuffer", memory_total_bytes=total * MIB, memory_used_bytes=used * MIB,
                          memory_free_bytes=(total - used) * MIB)
            missing.pop("memory_total_bytes", None)
            missing["memory_reserved_bytes"] = NO_RESERVED
            return
        if total and used is not None:
            why = f"amdsmi says {used} MB used of {total} MB"
        missing.update(dict.fromkeys(("memory_pool", "memory_total_bytes", "memory_used_bytes",
                                      "memory_free_bytes", "memory_reserved_bytes"), why))

    def _processes(self, h: Any, key: str) -> tuple[GpuProcess, ...] | Unavailable:
        try:
            listed = list(self._smi.amdsmi_get_gpu_process_list(h))
        except Exception as e:
            return Unavailable(f"processes: {explain(e)}")
        now = self._clock()
        out: dict[int, GpuProcess] = {}
        for entry in listed:
            info = self._process_info(h, entry)
            pid = _number(info.get("pid"))
            if pid is not None and pid not in out:
                out[pid] = self._process(info, pid, key, now)
        for stale in [k for k in self._engine if k[0] == key and k[1] not in out]:
            del self._engine[stale]
        return tuple(out[pid] for pid in sorted(out))

    def _process_info(self, h: Any, entry: Any) -> dict[str, Any]:
        """A process list entry's info: the entry itself since ROCm 6.1, before it a handle to ask about (empty
        where the process exited between the two calls)."""
        info = entry
        if not isinstance(entry, dict):
            try:
                info = self._smi.amdsmi_get_gpu_process_info(h, entry)
            except Exception:
                return {}
        return info if isinstance(info, dict) else {}

    def _gfx_util(self, info: dict[str, Any], pid: int, key: str, now: float) -> tuple[int | None, str | None]:
        """The process's share of the graphics engine since its last read (its engine time's rate), or why none."""
        engine = info.get("engine_usage")
        gfx_ns = _number(engine.get("gfx")) if isinstance(engine, dict) else None
        if gfx_ns is None:
            return None, "amdsmi gives no engine time"
        before = self._engine.get((key, pid))
        self._engine[(key, pid)] = (now, gfx_ns)
        if before is not None and now > before[0] and gfx_ns >= before[1]:
            return min(100, round((gfx_ns - before[1]) / ((now - before[0]) * 1e9) * 100)), None
        return None, FIRST_UTIL

    def _process(self, info: dict[str, Any], pid: int, key: str, now: float) -> GpuProcess:
        usage = info.get("memory_usage")
        vram = _number(usage.get("vram_mem")) if isinstance(usage, dict) else None
        missing: dict[str, str] = {"mem_util_percent": NO_MEM_UTIL}
        if vram is None:
            missing["used_bytes"] = "amdsmi gives no VRAM figure for this process"
        util, no_util = self._gfx_util(info, pid, key, now)
        if no_util is not None:
            missing["gpu_util_percent"] = no_util
        host = self._host.read(pid)  # the same /proc facts as an NVML process's, read once a tick
        missing.update(host.unavailable)
        command = host.command
        if command is None and isinstance(info.get("name"), str) and info["name"] not in ("", "N/A"):
            command = f"[{info['name']}]"  # amdsmi's process name, where /proc does not show the process
            missing.pop("command", None)
        return GpuProcess(pid=pid, used_bytes=vram, user=host.user, command=command, gpu_util_percent=util,
                          start_time_ticks=host.start_time_ticks, ppid=host.ppid, host_rss_bytes=host.host_rss_bytes,
                          cpu_percent=host.cpu_percent, started_at=host.started_at, parent_user=host.parent_user,
                          parent_command=host.parent_command, split=UNPROBED,
                          unavailable=missing)


def _socket_mw(power: Any) -> int | None:
    """The socket power in mW from amdsmi's power info: socket_power (7.x, MI300 and later),
    current_socket_power (6.x), average_socket_power (older boards)."""
    info = power if isinstance(power, dict) else {}
    watts = next((w for k in ("socket_power", "current_socket_power", "average_socket_power")
                  if (w := _number(info.get(k))) is not None), None)
    return None if watts is None else watts * 1000


def _percent(value: Any) -> int | None:
    n = _number(value)
    return n if n is not None and n <= 100 else None
