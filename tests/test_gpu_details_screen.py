"""The GPU details view (d, or Enter on a process row) and the headline's throttling, at 80x24, on Snapshots read
through the real GPU source on the fake NVML's scenarios and the fake amdsmi."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
from textual.widgets import DataTable, Static

from dltop.model import Snapshot
from dltop.sampler import ListFeed
from dltop.sources.amd import AmdReader
from dltop.sources.amd_fake import fake_amdsmi
from dltop.sources.gpu import FakeBackend, GpuReader, GpusReader
from dltop.sources.gpu_procs import HostReader
from dltop.tui.app import DltopApp
from dltop.tui.panes.gpu import GpuPane
from dltop.tui.screens.gpu_details import GpuDetailsScreen
from tests.conftest import DATA


def scenario(name: str) -> dict[str, Any]:
    return json.loads((DATA / "gpu-scenarios" / f"{name}.json").read_text())


def snaps_of(s: dict[str, Any], temps: list[int]) -> list[Snapshot]:
    """A tick per temperature of GPU 0, a second apart, through one reader (so NVLink and PCIe rates have two
    readings from the second on)."""
    reader = GpuReader(lambda: FakeBackend(s))
    out = []
    for i, t in enumerate(temps):
        s["gpus"][0]["temperature_c"] = t
        if isinstance(s["gpus"][0].get("nvlink_kib"), dict):
            s["gpus"][0]["nvlink_kib"]["tx"] += 1024 * 1024 * i  # 1 GiB more each second from the second tick
        out.append(Snapshot(ts=1000.0 + i, host="fixture", gpus=reader.read()))
    return out


def body(app: DltopApp) -> str:
    screen = app.screen
    assert isinstance(screen, GpuDetailsScreen)
    return "\n".join(str(screen.query_one(f"#gpu-details-{w}", Static).render()) for w in ("title", "body"))


async def test_d_opens_the_details_that_follow_the_ticks_and_arrows_step_gpus() -> None:
    app = DltopApp(ListFeed(snaps_of(scenario("8gpu-20proc"), [50, 60, 70])))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        pane = app.query_one(GpuPane)
        assert "GPU: Details" in [c.title for c in pane.palette_commands()]
        # d opens the selected process's GPU: the table is sorted by memory, so a GPU 0 row is selected first
        table = app.query_one("#gpu-table", DataTable)
        table.move_cursor(row=next(i for i in range(table.row_count) if str(table.get_row_at(i)[0]) == "0"))
        await pilot.press("d")
        await pilot.pause()
        text = body(app)
        assert "GPU0 NVIDIA H100" in text and "P-state         P0" in text and "Throttle        none" in text
        assert "Fan             n/a: not supported" in text  # an SXM board: the reason, not a 0
        for _ in range(40):  # the feed moves on: the open details show the newest numbers
            await pilot.pause(0.1)
            if "70°C" in body(app):
                break
        assert "70°C" in body(app) and "NVLink          rx 0 B/s  tx 2.0 GiB/s" in body(app)  # 2 GiB more in its last second
        await pilot.press("right", "right", "right", "right", "right")
        text = body(app)
        assert "GPU5" in text and "HW Thermal Slowdown, SW Thermal Slowdown" in text and "87°C" in text
        await pilot.press("left")
        assert "GPU4" in body(app)
        await pilot.press("escape")
        assert not isinstance(app.screen, GpuDetailsScreen)
        assert app.query_one("#gpu-table", DataTable).has_focus


async def test_enter_on_a_process_row_opens_its_gpu() -> None:
    app = DltopApp(ListFeed(snaps_of(scenario("two-gpus"), [40])))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        table = app.query_one("#gpu-table", DataTable)
        await pilot.press("end")  # the last row: a process on GPU 1
        assert str(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value).startswith("1:")
        await pilot.press("enter")
        await pilot.pause()
        text = body(app)
        assert "GPU1 NVIDIA L40S" in text and "SW Power Cap" in text and "Fan             61%" in text
        assert "NVLink          n/a: not supported" in text
        await pilot.press("enter")  # closes, as Esc does
        assert not isinstance(app.screen, GpuDetailsScreen)


async def test_the_headline_says_throttled_and_fits_80_columns() -> None:
    app = DltopApp(ListFeed(snaps_of(scenario("two-gpus"), [40])))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        lines = [str(w.render()) for w in app.query("#gpu-devices > Static")]
        (gpu1,) = [line for line in lines if line.startswith("GPU1")]
        assert gpu1.endswith("throttled: power cap") and len(gpu1) <= 80
        (gpu0,) = [line for line in lines if line.startswith("GPU0")]
        assert "throttled" not in gpu0  # clocks-event reasons 0


async def test_an_amd_gpu_s_details_name_its_sensor_and_what_amdsmi_does_not_give(
        monkeypatch: pytest.MonkeyPatch) -> None:
    s = json.loads((DATA / "amd-scenarios" / "mi300x.json").read_text())
    monkeypatch.setitem(sys.modules, "amdsmi", fake_amdsmi(s))
    part = GpusReader(None, AmdReader(HostReader("/nonexistent/proc"))).read()
    app = DltopApp(ListFeed([Snapshot(ts=1.0, host="fixture", gpus=part)]))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press("d")
        await pilot.pause()
        text = body(app)
        assert "AMD Instinct MI300X" in text and "71°C (hotspot)" in text and "amdsmi (ROCm)" in text
        assert "Power           712 W of 750 W" in text
        assert "NVLink          n/a: not read on AMD GPUs" in text
