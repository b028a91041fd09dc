"""The GPU tab's process keys, pressed for real (Pilot) at 80x24: / filter, o / O sort, g tree, k signal (a real
process ended through the runner; refused in --read-only), c compact; the cursor stays on its process."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from typing import Any

from textual.widgets import DataTable, Input

from dltop.config import Settings
from dltop.model import Snapshot
from dltop.sampler import ListFeed
from dltop.tui.app import DltopApp
from dltop.tui.panes.gpu import GpuPane
from dltop.tui.screens.signal import SignalScreen
from tests.test_gpu_pane import _fits, _headers, _rows, _text, gpu_snaps, scenario


def running(name: str) -> dict[str, Any]:
    """The scenario with each process sampled by NVML every 1/6 s, as a running process is."""
    s = scenario(name)
    for g in s["gpus"]:
        for sample in g.get("process_utilization", []):
            sample["period_us"] = 166_666
    return s


def _col(app: DltopApp, name: str) -> list[str]:
    i = _headers(app).index(name)
    return [r[i] for r in _rows(app)]


def _key(table: DataTable) -> Any:
    return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value


async def test_filter_sort_reverse_and_the_cursor_found_again_by_key() -> None:
    snaps = gpu_snaps(running("8gpu-20proc"), 2)
    app = DltopApp(ListFeed(snaps, start=1))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        table = app.query_one("#gpu-table", DataTable)
        assert table.row_count == 160
        used = [int(p.used_bytes or 0) for g in snaps[1].gpus for p in g.processes]  # type: ignore[union-attr]
        assert _col(app, "Used")[0] == _rows(app)[0][4] and table.row_count == len(used)
        # memory, biggest first by default: the first row holds the most
        first_pid = int(_rows(app)[0][1])
        biggest = max(used)
        assert any(p.pid == first_pid and p.used_bytes == biggest for g in snaps[1].gpus
                   for p in g.processes)  # type: ignore[union-attr]
        await pilot.press("down", "down", "down")
        held = _key(table)
        await pilot.press("o")  # SM %
        await pilot.pause()
        sm = [int(x.rstrip("%")) for x in _col(app, "SM%")]
        assert sm == sorted(sm, reverse=True)
        assert _key(table) == held  # the cursor stayed on its process, wherever the sort put it
        assert "sort: SM % ↓" in _text(app, "#gpu-query")
        await pilot.press("O")
        await pilot.pause()
        sm = [int(x.rstrip("%")) for x in _col(app, "SM%")]
        assert sm == sorted(sm) and _key(table) == held
        # / filters as it is typed; Esc clears it
        await pilot.press("slash")
        box = app.query_one("#gpu-filter", Input)
        assert box.has_focus
        await pilot.press(*"2014")
        await pilot.pause()
        assert sorted(r[1] for r in _rows(app)) == [str(20140 + i) for i in range(10)]
        assert "10 of 160 processes" in _text(app, "#gpu-query")
        _fits(app)
        await pilot.press("escape")
        await pilot.pause()
        assert table.row_count == 160 and not box.has_class("-shown") and box.value == ""
        # a filter kept with Enter stays while the table has the keys
        await pilot.press("slash", *"20000", "enter")
        await pilot.pause()
        assert [r[1] for r in _rows(app)] == ["20000"] and table.has_focus and not box.has_class("-shown")
        assert "filter: 20000" in _text(app, "#gpu-query")
        await pilot.press("escape")  # clears the filter kept
        await pilot.pause()
        assert table.row_count == 160


async def test_tree_groups_ranks_under_their_launcher() -> None:
    snap = gpu_snaps(scenario("8gpu-20proc"), 1)[0]
    # ranks 20000 (GPU 0) and 20020 (GPU 1) started by one launcher (a torchrun agent, not on a GPU)
    gpus = tuple(dataclasses.replace(g, processes=tuple(
        dataclasses.replace(p, ppid=777 if p.pid in (20000, 20020) else 1) for p in g.processes))  # type: ignore[union-attr]
        for g in snap.gpus)  # type: ignore[union-attr]
    app = DltopApp(ListFeed([dataclasses.replace(snap, gpus=gpus)]))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        app.query_one("#gpu-table", DataTable).focus()
        await pilot.press("g")
        await pilot.pause()
        rows = _rows(app)
        at = next(i for i, r in enumerate(rows) if r[1] == "777")
        assert rows[at][3].startswith("[2 ranks] ")
        assert {rows[at + 1][1], rows[at + 2][1]} == {"20000", "20020"}
        assert rows[at + 1][3].startswith("├ ") and rows[at + 2][3].startswith("└ ")
        assert len(rows) == 161  # every process once, and the launcher
        await pilot.press("g")
        await pilot.pause()
        assert len(_rows(app)) == 160


def _with_process(pid: int) -> list[Snapshot]:
    s = scenario("h100-2proc")
    s["gpus"][0]["compute_processes"][0]["pid"] = pid
    s["gpus"][0]["process_utilization"][0]["pid"] = pid
    return gpu_snaps(s, 2)


def _sleeper() -> subprocess.Popen[bytes]:
    p = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
                         stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline() == b"up\n"
    return p


async def _select(app: DltopApp, pilot: Any, pid: int) -> None:
    table = app.query_one("#gpu-table", DataTable)
    table.focus()
    row = next(i for i, r in enumerate(_rows(app)) if r[1] == str(pid))
    table.move_cursor(row=row)
    await pilot.pause()


async def test_k_sends_sigterm_to_a_real_process_and_says_it_exited() -> None:
    p = _sleeper()
    try:
        app = DltopApp(ListFeed(_with_process(p.pid), start=1))
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            await _select(app, pilot, p.pid)
            await pilot.press("k")
            await pilot.pause()
            assert isinstance(app.screen, SignalScreen)
            await pilot.press("escape")  # cancels: nothing sent
            await pilot.pause()
            assert not isinstance(app.screen, SignalScreen) and p.poll() is None
            await pilot.press("k")
            await pilot.pause()
            await pilot.press("y")  # SIGTERM, the one highlighted first
            for _ in range(100):
                await pilot.pause(0.05)
                if any("it exited" in s.text for s in app.session.said):
                    break
            messages = [s.text for s in app.session.said]
            assert any(m.startswith(f"SIGTERM sent to pid {p.pid} (") and m.endswith("it exited")
                       for m in messages), messages
        assert p.wait(timeout=10) == -15
    finally:
        p.kill()
        p.wait()


async def test_k_is_refused_in_read_only_and_nothing_is_sent() -> None:
    p = _sleeper()
    try:
        app = DltopApp(ListFeed(_with_process(p.pid), start=1), Settings(read_only=True))
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            await _select(app, pilot, p.pid)
            assert app.query_one(GpuPane).check_action("signal", ()) is False  # greyed out, out of the palette
            await pilot.press("k")
            await pilot.pause()
            assert not isinstance(app.screen, SignalScreen)
            assert [s.text for s in app.session.said][-1].startswith("signal: dltop runs --read-only")
        time.sleep(0.2)
        assert p.poll() is None
    finally:
        p.kill()
        p.wait()


async def test_eight_gpus_are_compact_by_themselves_at_80x24_and_c_switches() -> None:
    snaps = gpu_snaps(scenario("8gpu-20proc"), 2)
    app = DltopApp(ListFeed(snaps, start=1))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        lines = _text(app, "#gpu-devices").splitlines()
        assert [ln.split()[0] for ln in lines] == [f"GPU{i}" for i in range(8)]  # one line each, all on screen
        assert all("GiB/79.6 GiB" in ln and "°C" in ln and "/700W" in ln for ln in lines), lines
        table = app.query_one("#gpu-table", DataTable)
        assert table.size.height >= 6  # the process table gets the room
        _fits(app)
        table.focus()
        await pilot.press("c")
        await pilot.pause()
        assert _text(app, "#gpu-devices").splitlines()[0].startswith("GPU0 NVIDIA H100 80GB HBM3  util")
        await pilot.press("c")
        await pilot.pause()
        assert len(_text(app, "#gpu-devices").splitlines()) == 8
    two = gpu_snaps(scenario("two-gpus"), 2)
    app = DltopApp(ListFeed(two, start=1))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert "util" in _text(app, "#gpu-devices").splitlines()[0] and len(_text(app, "#gpu-devices").splitlines()) > 2



def test_the_time_cell_turns_with_the_minute_while_the_processes_stay_as_they_were() -> None:
    """The table is not built again while nothing in it changes; a Time cell still turns at its minute."""
    from dltop.text.gpu import elapsed, elapsed_until

    for started in (0.0, 0.5, 59.9, 1000.25):
        for now in [started - 5 + i * 0.7 for i in range(400)]:
            until = elapsed_until(started, now)
            if until > now:  # else `now` is within the millisecond before the turn: built again each tick
                assert elapsed(started, until - 1e-6) == elapsed(started, now), (started, now)
            assert elapsed(started, until + 2e-3) != elapsed(started, now), (started, now)
    assert elapsed_until(None, 5.0) == float("inf")


async def test_a_replayed_minute_turns_the_time_cells_of_unchanged_processes() -> None:
    (snap,) = gpu_snaps(scenario("h100-2proc"), 1)
    g = snap.gpus[0]  # type: ignore[index]
    procs = tuple(dataclasses.replace(p, started_at=snap.ts - 50) for p in g.processes)  # type: ignore[union-attr]
    part = (dataclasses.replace(g, processes=procs),)
    snaps = [dataclasses.replace(snap, ts=snap.ts + dt, gpus=part) for dt in (0, 5, 11, 75)]
    app = DltopApp(ListFeed(snaps, start=0))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        seen = []
        for i in range(len(snaps)):
            app.apply(snaps[i])
            await pilot.pause()
            seen.append(set(_col(app, "Time")))
        assert seen == [{"<1m"}, {"<1m"}, {"1m"}, {"2m"}]


async def test_s_tags_processes_and_k_signals_the_tagged_set_after_one_dialog() -> None:
    a, b = _sleeper(), _sleeper()
    try:
        s = scenario("h100-2proc")
        for proc, pid in zip(s["gpus"][0]["compute_processes"], (a.pid, b.pid), strict=True):
            proc["pid"] = pid
        s["gpus"][0].pop("process_utilization", None)
        app = DltopApp(ListFeed(gpu_snaps(s, 2), start=1))
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            await _select(app, pilot, a.pid)
            await pilot.press("s")
            await _select(app, pilot, b.pid)
            await pilot.press("s")
            await pilot.pause()
            assert sorted(r[1] for r in _rows(app)) == sorted([f"*{a.pid}", f"*{b.pid}"])
            assert "2 tagged" in _text(app, "#gpu-query")
            await pilot.press("k")
            await pilot.pause()
            screen = app.screen
            assert isinstance(screen, SignalScreen)
            listed = str(screen.query_one("ListedProcesses").render())
            assert len(listed.splitlines()) == 2 and f"{a.pid} " in listed and f"{b.pid} " in listed
            assert "-c import time" in listed
            await pilot.press("y")
            for _ in range(100):
                await pilot.pause(0.05)
                if any("2 exited" in m.text for m in app.session.said):
                    break
            messages = [m.text for m in app.session.said]
            assert any(m.startswith("SIGTERM sent to 2 processes") and m.endswith("2 exited") for m in messages), \
                messages
            assert not app.query_one(GpuPane).tagged  # the tags are spent
        assert a.wait(timeout=10) == -15 and b.wait(timeout=10) == -15
    finally:
        for p in (a, b):
            p.kill()
            p.wait()
