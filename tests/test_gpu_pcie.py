"""PCIe traffic: NVML's cumulative byte counters where the driver has them (no waiting), the throughput call where
it does not, and the rate derived from two Snapshots."""

from __future__ import annotations

import dataclasses
import json
import types
from typing import Any

import pynvml
import pytest

from dltop.derive import gpu_rates
from dltop.model import GpuDevice, Snapshot, Unavailable
from dltop.sources.gpu import PCIE_RATE_FROM_COUNTERS, FakeBackend, GpuReader, PynvmlBackend
from tests.test_gpu import SCENARIOS, devices, scenario


class Counting(FakeBackend):
    """The fake, counting the PCIe calls it is asked for."""

    def __init__(self, s: dict[str, Any]) -> None:
        super().__init__(s)
        self.counter_calls = 0
        self.throughput_calls = 0

    def pcie_bytes(self, h: Any) -> tuple[int, int, float | None]:
        self.counter_calls += 1
        return super().pcie_bytes(h)

    def pcie_kb_per_s(self, h: Any, direction: Any) -> int:
        self.throughput_calls += 1
        return super().pcie_kb_per_s(h, direction)


def test_counters_are_read_and_the_throughput_call_is_not() -> None:
    s = scenario("8gpu-20proc")
    backend = Counting(s)
    reader = GpuReader(lambda: backend)
    part = reader.read()
    assert isinstance(part, tuple)
    for g, want in zip(part, s["gpus"], strict=True):
        assert g.pcie_source == "byte_counters"
        assert (g.pcie_tx_bytes_total, g.pcie_rx_bytes_total) == (want["pcie_bytes"]["tx"], want["pcie_bytes"]["rx"])
        assert g.pcie_tx_bytes_per_s is None and g.why("pcie_tx_bytes_per_s") == PCIE_RATE_FROM_COUNTERS
    assert (backend.counter_calls, backend.throughput_calls) == (8, 0)


def test_without_counters_the_throughput_call_is_used_and_the_probe_not_repeated() -> None:
    s = scenario("h100-2proc")  # driver 550: no counter fields
    backend = Counting(s)
    reader = GpuReader(lambda: backend)
    for _ in range(3):
        (g,) = reader.read()  # type: ignore[misc]
        assert g.pcie_source == "throughput"
        assert g.pcie_rx_bytes_per_s == s["gpus"][0]["pcie_kb_per_s"]["rx"] * 1024
        assert g.pcie_tx_bytes_total is None
        why = g.why("pcie_tx_bytes_total") or ""
        assert "NVML_FI_DEV_PCIE_COUNT_TX_BYTES" in why and "NVML_ERROR_NOT_SUPPORTED" in why
    assert (backend.counter_calls, backend.throughput_calls) == (1, 6)


def test_counters_failing_for_another_reason_are_not_replaced_by_a_guess() -> None:
    s = scenario("8gpu-20proc")
    s["gpus"][0]["pcie_bytes"] = "NVML_ERROR_NO_PERMISSION"
    g = devices(s)[0]
    assert g.pcie_source == "byte_counters"
    for f in ("pcie_tx_bytes_total", "pcie_rx_bytes_total", "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s"):
        assert getattr(g, f) is None and "NVML_ERROR_NO_PERMISSION" in (g.why(f) or "")


def test_rate_from_two_snapshots_through_the_fake() -> None:
    s = scenario("8gpu-20proc")
    reader = GpuReader(lambda: FakeBackend(s))
    first = Snapshot(ts=100.0, host="h", gpus=reader.read())  # type: ignore[arg-type]
    s["gpus"][0]["pcie_bytes"]["tx"] += 3_000_000_000  # the fake's dict is live: the counters move
    s["gpus"][0]["pcie_bytes"]["rx"] += 500_000
    second = Snapshot(ts=102.0, host="h", gpus=reader.read())  # type: ignore[arg-type]
    rates = gpu_rates(first, second)
    assert [r.index for r in rates] == list(range(8))
    assert (rates[0].pcie_tx_bytes_per_s, rates[0].pcie_rx_bytes_per_s) == (1.5e9, 250_000.0)
    assert rates[1].pcie_tx_bytes_per_s == 0.0  # a counter that did not move is a true 0
    # One Snapshot alone gives no rate, and says why.
    (alone, *_) = gpu_rates(None, second)
    assert isinstance(alone.pcie_tx_bytes_per_s, Unavailable) and "two readings" in alone.pcie_tx_bytes_per_s.reason
    # The Snapshot round-trips through JSON with its counters and source.
    again = Snapshot.from_json(second.to_json())
    assert isinstance(again.gpus, tuple) and again.gpus[0].pcie_source == "byte_counters"
    assert gpu_rates(first, again)[0].pcie_tx_bytes_per_s == 1.5e9


def test_rate_edge_cases() -> None:
    def snap(ts: float, **fields: Any) -> Snapshot:
        return Snapshot(ts=ts, host="h", gpus=(GpuDevice(index=0, uuid="GPU-a", **fields),))

    counters = {"pcie_source": "byte_counters", "pcie_rx_bytes_total": 0}
    back = gpu_rates(snap(1, pcie_tx_bytes_total=10_000, **counters), snap(2, pcie_tx_bytes_total=5, **counters))[0]
    assert isinstance(back.pcie_tx_bytes_per_s, Unavailable) and "backwards" in back.pcie_tx_bytes_per_s.reason
    same_ts = gpu_rates(snap(1, pcie_tx_bytes_total=1, **counters), snap(1, pcie_tx_bytes_total=2, **counters))[0]
    assert isinstance(same_ts.pcie_tx_bytes_per_s, Unavailable)
    other_gpu = Snapshot(ts=2, host="h", gpus=(GpuDevice(index=0, uuid="GPU-b", pcie_tx_bytes_total=20, **counters),))
    swapped = gpu_rates(snap(1, pcie_tx_bytes_total=10, **counters), other_gpu)[0]
    assert isinstance(swapped.pcie_tx_bytes_per_s, Unavailable)
    # The throughput call's rate is NVML's own, with or without a previous Snapshot.
    tp = snap(5, pcie_source="throughput", pcie_tx_bytes_per_s=4096, unavailable={"pcie_rx_bytes_per_s": "why"})
    (r,) = gpu_rates(None, tp)
    assert r.pcie_tx_bytes_per_s == 4096.0 and r.pcie_rx_bytes_per_s == Unavailable("why")
    assert gpu_rates(None, Snapshot(ts=1, host="h", gpus=Unavailable("no NVML"))) == []


def _fields(*specs: tuple[int, int, int]) -> Any:
    """A real nvmlFieldValue_t array: (nvmlReturn, valueType, value) per field."""
    arr = (pynvml.c_nvmlFieldValue_t * len(specs))()
    for f, (ret, vtype, value) in zip(arr, specs, strict=True):
        f.nvmlReturn, f.valueType = ret, vtype
        f.value.ullVal = value
    return arr


@pytest.mark.parametrize(("specs", "want"), [
    (((0, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, 2**40 + 7), (0, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, 9)),
     (2**40 + 7, 9)),
    (((0, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, 1), (pynvml.NVML_ERROR_NOT_SUPPORTED, 0, 0)),
     pynvml.NVML_ERROR_NOT_SUPPORTED),
    (((0, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, 1), (0, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, 1)),
     pynvml.NVML_ERROR_NOT_SUPPORTED),  # a 32-bit byte counter wraps within a tick: refused
])
def test_pynvml_backend_reads_the_field_values(specs: Any, want: Any) -> None:
    asked: list[Any] = []

    def get_field_values(h: Any, ids: list[int]) -> Any:
        asked.append(ids)
        return _fields(*specs)

    backend = PynvmlBackend()
    backend.nv = types.SimpleNamespace(**{**vars(pynvml), "nvmlDeviceGetFieldValues": get_field_values})
    if isinstance(want, tuple):
        assert backend.pcie_bytes(None) == (*want, None)
    else:
        with pytest.raises(pynvml.NVMLError) as e:
            backend.pcie_bytes(None)
        assert e.value.value == want
    assert asked == [[pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES]]


def test_scenario_counters_must_be_numbers() -> None:
    s = json.loads((SCENARIOS / "8gpu-20proc.json").read_text())
    s["gpus"][0]["pcie_bytes"] = {"tx": "lots", "rx": 1}
    with pytest.raises(ValueError, match=r"gpus\[0\]\.pcie_bytes\.tx"):
        FakeBackend(s)


def test_a_rate_is_over_the_interval_the_counters_span_not_the_ticks() -> None:
    """The double's counters grow at a known rate by its clock; the GPUs are read 1.013 s apart while the
    Snapshots say 1.0 s (the tick's start; reading the GPUs' other fields first moves the counters' read): the
    rate is the counters' own, not 1.3% above it."""
    s = scenario("8gpu-20proc")
    for g in s["gpus"]:
        g["pcie_bytes"].update(tx_per_s=3_000_000_000, rx_per_s=25_000_000_000)
        g["nvlink_kib"] = {"tx": 1, "rx": 2, "tx_per_s": 100_000_000, "rx_per_s": 200_000_000}
    clock = [1_714_000_000.0]
    backend = FakeBackend(s)
    backend.clock = lambda: clock[0]
    reader = GpuReader(lambda: backend)
    first = Snapshot(ts=100.0, host="h", gpus=reader.read())  # type: ignore[arg-type]
    clock[0] += 1.013
    second = Snapshot(ts=101.0, host="h", gpus=reader.read())  # type: ignore[arg-type]
    for r in gpu_rates(first, second):
        assert r.pcie_tx_bytes_per_s == pytest.approx(3e9, rel=1e-6)
        assert r.pcie_rx_bytes_per_s == pytest.approx(25e9, rel=1e-6)
        assert r.nvlink_tx_bytes_per_s == pytest.approx(100e6 * 1024, rel=1e-6)
        assert r.nvlink_rx_bytes_per_s == pytest.approx(200e6 * 1024, rel=1e-6)
    # without the stamps (a recording made before them), the Snapshots' interval, as before
    def bare(snap: Snapshot) -> Snapshot:
        return Snapshot(ts=snap.ts, host="h", gpus=tuple(
            dataclasses.replace(g, pcie_counters_at=None, nvlink_counters_at=None)
            for g in snap.gpus))  # type: ignore[union-attr]

    r = gpu_rates(bare(first), bare(second))[0]
    assert r.pcie_tx_bytes_per_s == pytest.approx(3e9 * 1.013, rel=1e-6)


def test_field_time_is_nvml_s_stamp_in_seconds() -> None:
    from dltop.sources.gpu import field_time

    arr = _fields((0, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, 1), (0, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, 2))
    assert field_time(arr) is None  # no stamp given
    arr[0].timestamp, arr[1].timestamp = 1_714_000_000_250_000, 1_714_000_000_250_100
    assert field_time(arr) == pytest.approx(1_714_000_000.2501)
