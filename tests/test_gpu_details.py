"""Device details from NVML (fan, P-state, clocks-event reasons, ECC corrected and uncorrected, encoder / decoder,
NVLink): read through the fake NVML's scenarios, each unknown with NVML's reason, the slow ones once a minute."""

from __future__ import annotations

import json
from typing import Any

from dltop.derive import gpu_rates
from dltop.fields import samples
from dltop.model import GpuDevice, Snapshot, Unavailable
from dltop.sources.gpu import FakeBackend, GpuReader, throttle_names
from dltop.sources.gpu_fields import SLOW_READ_S
from tests.conftest import DATA

SCENARIOS = DATA / "gpu-scenarios"


def scenario(name: str) -> dict[str, Any]:
    return json.loads((SCENARIOS / f"{name}.json").read_text())


def devices(s: dict[str, Any]) -> tuple[GpuDevice, ...]:
    part = GpuReader(lambda: FakeBackend(s)).read()
    assert isinstance(part, tuple), part
    return part


def test_h100_details_are_nvml_s_and_its_missing_fan_says_why() -> None:
    s = scenario("h100-2proc")
    want = s["gpus"][0]
    (g,) = devices(s)
    assert (g.pstate, g.clocks_event_reasons, g.throttle_reasons) == (want["pstate"], 0, ())
    assert (g.ecc_corrected_volatile, g.ecc_corrected_aggregate) == (want["ecc_corrected"]["volatile"],
                                                                     want["ecc_corrected"]["aggregate"])
    assert (g.encoder_util_percent, g.decoder_util_percent) == (want["encoder_util_percent"],
                                                                 want["decoder_util_percent"])
    assert g.nvlink_tx_bytes_total == want["nvlink_kib"]["tx"] * 1024  # NVML counts KiB
    assert g.nvlink_rx_bytes_total == want["nvlink_kib"]["rx"] * 1024
    assert g.temperature_sensor == "gpu"
    # an SXM board has no fan of its own: NVML says Not Supported, and that is the reason, not a 0
    assert g.fan_speed_percent is None and "NVML_ERROR_NOT_SUPPORTED" in (g.why("fan_speed_percent") or "")


def test_a_gpu_without_nvlink_says_so_for_both_directions() -> None:
    for g in devices(scenario("two-gpus")):
        assert g.nvlink_tx_bytes_total is None and g.nvlink_rx_bytes_total is None
        assert g.why("nvlink_tx_bytes_total") == g.why("nvlink_rx_bytes_total")
        assert "NVML_ERROR_NOT_SUPPORTED" in (g.why("nvlink_rx_bytes_total") or "")
        assert g.fan_speed_percent is not None


def test_clocks_event_reasons_are_named_as_nvidia_smi_names_them() -> None:
    gpus = devices(scenario("8gpu-20proc"))
    hot = gpus[5]
    assert hot.clocks_event_reasons == 0x60
    assert hot.throttle_reasons == ("HW Thermal Slowdown", "SW Thermal Slowdown")
    assert throttle_names(0) == ()
    assert throttle_names(0x1) == ("Idle",)
    assert throttle_names(0x4 | 0x200) == ("SW Power Cap", "0x200")  # a bit this dltop has no name for: its value


def test_an_unknown_pstate_and_a_refused_call_are_reasons() -> None:
    s = scenario("h100-2proc")
    s["gpus"][0].update(pstate=32, clocks_event_reasons="NVML_ERROR_NO_PERMISSION",
                        ecc_corrected={"volatile": "NVML_ERROR_NOT_SUPPORTED", "aggregate": 3})
    (g,) = devices(s)
    assert g.pstate is None and "NVML_PSTATE_UNKNOWN" in (g.why("pstate") or "")
    assert g.throttle_reasons is None and g.clocks_event_reasons is None
    assert "NVML_ERROR_NO_PERMISSION" in (g.why("throttle_reasons") or "")
    assert g.ecc_corrected_volatile is None and g.ecc_corrected_aggregate == 3
    snap = Snapshot(ts=1.0, host="h", gpus=(g,))
    assert Snapshot.from_json(snap.to_json()) == snap


def test_an_old_driver_without_the_clocks_event_call_says_it_is_too_old() -> None:
    (g,) = devices(scenario("old-driver-418"))
    assert g.throttle_reasons is None and "NVML_ERROR_FUNCTION_NOT_FOUND" in (g.why("throttle_reasons") or "")


class Counting(FakeBackend):
    """The fake, counting the calls for the slow-changing numbers."""

    def __init__(self, s: dict[str, Any]) -> None:
        super().__init__(s)
        self.calls: dict[str, int] = {}

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def power_limit_mw(self, h: Any) -> int:
        self._count("power_limit")
        return super().power_limit_mw(h)

    def ecc_corrected(self, h: Any, counter: Any) -> int:
        self._count(f"ecc_corrected_{counter}")
        return super().ecc_corrected(h, counter)

    def power_mw(self, h: Any) -> int:
        self._count("power")
        return super().power_mw(h)


def test_the_slow_numbers_are_read_once_a_minute_and_kept_between() -> None:
    s = scenario("h100-2proc")
    backend = Counting(s)
    now = [1000.0]
    reader = GpuReader(lambda: backend, clock=lambda: now[0])
    limits = []
    for t in (0.0, 1.0, SLOW_READ_S - 1, SLOW_READ_S + 0.5):
        now[0] = 1000.0 + t
        part = reader.read()
        assert isinstance(part, tuple)
        limits.append((part[0].power_limit_mw, part[0].ecc_corrected_aggregate))
    assert backend.calls["power"] == 4  # the draw is read every tick
    assert backend.calls["power_limit"] == 2 and backend.calls["ecc_corrected_aggregate"] == 2
    assert backend.calls["ecc_corrected_volatile"] == 4
    want = (s["gpus"][0]["power_limit_mw"], s["gpus"][0]["ecc_corrected"]["aggregate"])
    assert limits == [want] * 4  # kept between reads, never dropped to None


def test_a_slow_number_s_reason_is_kept_too() -> None:
    s = scenario("h100-2proc")
    s["gpus"][0]["power_limit_mw"] = "NVML_ERROR_NO_PERMISSION"
    reader = GpuReader(lambda: FakeBackend(s), clock=lambda: 5.0)
    for _ in range(2):
        (g,) = reader.read()  # type: ignore[misc]
        assert g.power_limit_mw is None and "NVML_ERROR_NO_PERMISSION" in (g.why("power_limit_mw") or "")


def test_nvlink_rate_from_two_readings() -> None:
    s = scenario("h100-2proc")
    (first,) = devices(s)
    s["gpus"][0]["nvlink_kib"]["tx"] += 2 * 1024 * 1024  # 2 GiB more sent
    (second,) = devices(s)
    a, b = Snapshot(ts=10.0, host="h", gpus=(first,)), Snapshot(ts=12.0, host="h", gpus=(second,))
    (r,) = gpu_rates(a, b)
    assert r.nvlink_tx_bytes_per_s == 2 * 2**30 / 2 and r.nvlink_rx_bytes_per_s == 0.0
    (alone,) = gpu_rates(None, b)
    assert isinstance(alone.nvlink_tx_bytes_per_s, Unavailable)
    (back,) = gpu_rates(b, Snapshot(ts=14.0, host="h", gpus=(first,)))
    assert isinstance(back.nvlink_tx_bytes_per_s, Unavailable) and "backwards" in back.nvlink_tx_bytes_per_s.reason


def test_the_exporter_serves_the_details_and_leaves_out_what_nvml_did_not_give() -> None:
    s = scenario("h100-2proc")
    (g,) = devices(s)
    got = {f.name: v for f, _, v in samples(Snapshot(ts=1.0, host="h", gpus=(g,)))}
    assert got["gpu_nvlink_transmitted_bytes_total"] == s["gpus"][0]["nvlink_kib"]["tx"] * 1024
    assert got["gpu_ecc_corrected_errors_total"] == s["gpus"][0]["ecc_corrected"]["aggregate"]
    assert got["gpu_performance_state"] == 0 and got["gpu_clocks_event_reasons"] == 0
    assert "gpu_fan_speed_ratio" not in got  # Not Supported: absent, never a fake 0
