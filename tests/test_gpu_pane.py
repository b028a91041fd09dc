"""The GPU pane (Pilot, and pictured as SVG) on Snapshots read through the real GPU source on the fake NVML
scenarios, and a real vLLM payload served over loopback HTTP and joined to its GPU process.

Update the pictures with `pytest tests/test_gpu_pane.py --snapshot-update`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from textual.app import App, ComposeResult
from textual.content import Content
from textual.widgets import DataTable, Input, Static

from dltop.config import Settings
from dltop.derive import join_splits
from dltop.model import GpuDevice, ProbesPart, ServerStats, Snapshot, Unavailable
from dltop.sampler import ListFeed, Sampler
from dltop.sources.base import Source
from dltop.sources.gpu import NO_PROCESS_MEMORY, FakeBackend, GpuReader, PynvmlBackend
from dltop.sources.servers import read_server
from dltop.tui.app import DltopApp
from dltop.tui.panes.gpu import SPLIT_NEEDS_PROBE, GpuPane
from dltop.view import View
from tests.conftest import DATA, SHARED_FIXTURES
from tests.probe_helpers import MIB, Workers
from tests.waiting import until

SCENARIOS = DATA / "gpu-scenarios"
METRICS = SHARED_FIXTURES / "metrics"
V0 = "vllm-0.4.x-v0-datadog-integrations-core.prom"
needs_metrics = pytest.mark.skipif(not (METRICS / V0).is_file(), reason=f"metrics fixture {V0} not found in {METRICS}")


def scenario(name: str) -> dict[str, Any]:
    return json.loads((SCENARIOS / f"{name}.json").read_text())


START_TICKS = 4242  # the start time of every process in a test's /proc


def proc_root(root: Path, commands: dict[int, str]) -> str:
    """A /proc with the scenario's pids in it, so user, command and start time are read from files (and stay the
    same)."""
    for pid, cmd in commands.items():
        (root / "proc" / str(pid)).mkdir(parents=True)
        (root / "proc" / str(pid) / "cmdline").write_bytes(cmd.replace(" ", "\0").encode() + b"\0")
        # as the kernel writes it (proc(5)): ppid 1, 1.5 s of CPU, started at START_TICKS, 64 MiB resident
        (root / "proc" / str(pid) / "stat").write_text(
            f"{pid} (python) S 1 {pid} {pid} 0 -1 4194304 100 0 0 0 100 50 0 0 20 0 4 0 {START_TICKS} "
            f"2147483648 16384 18446744073709551615 1 1 0 0 0 0 0 16781312 0 0 0 17 3 0 0 0 0 0\n")
    (root / "proc" / "stat").write_text("cpu  1 0 1 100 0 0 0 0 0 0\nbtime 0\n")  # booted at the epoch
    return str(root)


def gpu_snaps(s: dict[str, Any], n: int = 3, root: str = "/", t0: float = 1000.0) -> list[Snapshot]:
    """`n` ticks of one GPU source on the scenario, two seconds apart, GPU 0's utilization climbing."""
    now = [t0]  # the reader's clock: CPU % over the Snapshots' two seconds, whatever the node's load

    def backend() -> FakeBackend:
        fake = FakeBackend(s)
        fake.clock = lambda: 1_714_000_000 + now[0]  # the driver's: a sample every period_us of these seconds
        return fake

    reader = GpuReader(backend, root, clock=lambda: now[0])
    out = []
    for i in range(n):
        now[0] = t0 + 2 * i
        if isinstance(s.get("gpus"), list) and s["gpus"] and isinstance(s["gpus"][0].get("utilization"), dict):
            s["gpus"][0]["utilization"]["gpu"] = 40 + 20 * i % 60
        out.append(Snapshot(ts=t0 + 2 * i, host="fixture", gpus=reader.read()))
    return out


@pytest.fixture
def metrics_url() -> Iterator[str]:
    """The shared fixtures' metrics folder served over loopback HTTP (by this test process)."""
    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    handler = partial(Quiet, directory=str(METRICS))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/{V0}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def _text(app: App, selector: str) -> str:
    """What a Static shows; for #gpu-devices, what its Statics (one per line) show, one under the other."""
    widget = app.query_one(selector)
    if isinstance(widget, Static):
        return str(widget.render())
    return "\n".join(str(block.render()) for block in widget.query_children(Static))


def _rows(app: App) -> list[list[str]]:
    table = app.query_one("#gpu-table", DataTable)
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


def _headers(app: App) -> list[str]:
    return [str(c.label) for c in app.query_one("#gpu-table", DataTable).ordered_columns]


def _fits(app: App) -> None:
    """Nothing wider than the pane: the table scrolls no sideways, no device line is longer than its widget."""
    table = app.query_one("#gpu-table", DataTable)
    if table.display:
        assert table.virtual_size.width <= table.size.width, (table.virtual_size.width, table.size.width)
    if not _text(app, "#gpu-devices").startswith("GPUs: "):
        for block in app.query_one("#gpu-devices").query_children(Static):
            assert max(len(line) for line in str(block.render()).splitlines()) <= block.size.width


def _label(name: str, key: str, text: str) -> str:
    line = next(ln for ln in text.splitlines() if ln.startswith(name + "{"))
    m = re.search(rf'[{{,]{key}="([^"]*)"', line)
    assert m
    return m.group(1)


@needs_metrics
async def test_two_gpus_and_a_vllm_server_joined_to_its_gpu_process(metrics_url: str) -> None:
    s = scenario("two-gpus")
    me = os.getpid()  # this process listens for the server: the join must find it on GPU 1
    s["gpus"][1]["compute_processes"][0]["pid"] = me
    s["gpus"][1]["process_utilization"][0]["pid"] = me
    snaps = gpu_snaps(s, 2)
    server = read_server(metrics_url, 2.0)
    assert server.state == "ok", server.error
    snaps = [dataclasses.replace(x, servers=(server,)) for x in snaps]
    app = DltopApp(ListFeed(snaps, start=1))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert app.query_one("#tabs").active == "tab-gpu"  # the first tab: the headline
        devices = _text(app, "#gpu-devices")
        assert "GPU0 NVIDIA L40S" in devices and "GPU1 NVIDIA L40S" in devices
        assert sorted(r[:2] for r in _rows(app)) == sorted([["0", "9120"], ["1", str(me)], ["1", "9300"]])
        text = (METRICS / V0).read_text()
        capacity = int(_label("vllm:cache_config_info", "block_size", text)) * int(
            _label("vllm:cache_config_info", "num_gpu_blocks", text))
        servers = _text(app, "#gpu-servers")
        assert servers.startswith(f"vllm {metrics_url}")
        assert f"pid {me} → GPU1 pid {me}" in servers and f"of {capacity:,} tok" in servers
        row = next(r for r in _rows(app) if r[1] == str(me))
        assert row[2] not in ("", "?") and row[3] not in ("", "?")  # this process's user and command, from /proc
        notes = _text(app, "#gpu-notes")
        # no process has a split: its columns give way to /proc's (CPU %, host RSS, running time)
        assert notes.count(SPLIT_NEEDS_PROBE) == 1 and _headers(app) == [
            "GPU", "PID", "User", "Command", "Used", "SM%", "CPU%", "RSS", "Time"]
        assert row[7] not in ("", "?", "0M") and row[8] not in ("", "?")  # this process's RSS and running time
        _fits(app)


async def test_the_bar_shows_each_process_share_and_free(tmp_path: Path) -> None:
    s = scenario("two-gpus")
    snaps = gpu_snaps(s, 2, proc_root(tmp_path, {9120: "python train.py", 9121: "python train.py",
                                                  9300: "python eval.py"}))
    app = DltopApp(ListFeed(snaps, start=1))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        lines = _text(app, "#gpu-devices").splitlines()
        g1 = s["gpus"][1]
        bar = lines[lines.index(next(ln for ln in lines if ln.startswith("GPU1"))) + 1]
        cells = bar.split()[0]
        # GPU 1: two processes and the rest used by none, then free, in proportion to NVML's bytes
        procs = [p["used_bytes"] for p in g1["compute_processes"]]
        share = (g1["memory"]["used"]) / g1["memory"]["total"]
        assert abs(cells.count("█") + cells.count("▓") - share * len(cells)) <= 1
        assert abs(cells.count("░") - (1 - share) * len(cells)) <= 1
        legend = lines[lines.index(bar) + 1]
        assert "9121 28.8 GiB" in legend and "9300 1.2 GiB" in legend and sum(procs) <= g1["memory"]["used"]
        user, command = _rows(app)[0][2:4]
        # from the /proc entry: the owner's name, and the command line cut to the room 80 columns leave
        assert user == "root" and "python train.py".startswith(command.removesuffix("…")) and len(command) >= 8
        _fits(app)


async def test_the_cursor_stays_on_its_row_across_ticks(tmp_path: Path) -> None:
    s = scenario("8gpu-20proc")
    snaps = gpu_snaps(s, 4)
    app = DltopApp(ListFeed(snaps[:1]))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        table = app.query_one("#gpu-table", DataTable)
        table.focus()
        await pilot.press("down", "down", "down")
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key
        for i, snap in enumerate(snaps[1:]):
            # processes' memory changes each tick: the rows update in place
            moved = [dataclasses.replace(g, processes=tuple(dataclasses.replace(p, used_bytes=p.used_bytes + i)
                                                            for p in g.processes))
                     for g in snap.gpus if isinstance(g.processes, tuple)]
            app.apply(dataclasses.replace(snap, gpus=tuple(moved)))
            await pilot.pause()
            assert table.cursor_row == 3
            assert table.coordinate_to_cell_key(table.cursor_coordinate).row_key == key


def _first_gpu(snap: Snapshot) -> GpuDevice:
    assert isinstance(snap.gpus, tuple)
    return snap.gpus[0]


@pytest.mark.parametrize("name", ["library-not-found", "driver-not-loaded", "version-mismatch", "no-permission",
                                  "no-gpus"])
async def test_nvml_that_cannot_be_used_is_one_line_with_its_reason(name: str) -> None:
    snap = gpu_snaps(scenario(name), 1)[0]
    assert isinstance(snap.gpus, Unavailable)
    app = DltopApp(ListFeed([snap]), Settings(tab="gpu"))  # no GPU: it opens on Page cache, the user goes here
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        # No GPU here is a state ("0" and why); NVML failing on a machine with GPUs is the reason alone
        want = f"GPUs: 0 — {snap.gpus.reason}" if snap.gpus.absent else f"GPUs: {snap.gpus.reason}"
        assert _text(app, "#gpu-devices") == want
        assert bool(snap.gpus.absent) == (name in ("library-not-found", "driver-not-loaded", "no-gpus"))
        assert not app.query_one("#gpu-table", DataTable).display


async def test_this_machine_s_real_nvml_is_a_clear_line_not_an_empty_pane() -> None:
    part = GpuReader(PynvmlBackend).read()
    if not isinstance(part, Unavailable):
        pytest.skip("this machine has working NVML and GPUs")
    app = DltopApp(ListFeed([Snapshot(ts=1.0, host="here", gpus=part)]), Settings(tab="gpu"))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        text = _text(app, "#gpu-devices")
        assert text.startswith("GPUs: ") and part.reason in text and "\n" not in text


async def test_a_lost_gpu_keeps_its_place_with_the_reason_where_its_numbers_would_be() -> None:
    snap = gpu_snaps(scenario("gpu-lost"), 1)[0]
    assert isinstance(snap.gpus, tuple)
    lost = snap.gpus[1]
    reason = lost.why("memory_total_bytes")
    assert reason and "GPU is lost" in reason
    app = DltopApp(ListFeed([snap]))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        lines = _text(app, "#gpu-devices").splitlines()
        at = next(i for i, ln in enumerate(lines) if ln.startswith("GPU1"))
        assert lines[at + 1].strip() == reason and lines[0].startswith("GPU0 ")  # GPU 0 still reads


async def test_mig_instances_are_listed_under_their_parent() -> None:
    snap = gpu_snaps(scenario("a100-mig"), 1)[0]
    g = _first_gpu(snap)
    app = DltopApp(ListFeed([snap]))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        lines = _text(app, "#gpu-devices").splitlines()
        for mig in g.mig_devices:
            profile = (mig.name or "").rsplit(" ", 1)[-1]
            assert any(ln.startswith(f"  {profile} ") for ln in lines[2:]), profile
        keys = [r[0] for r in _rows(app)]
        # each process once, under its instance, as nvidia-smi numbers it: GPU/GI.CI
        assert sorted(keys) == sorted(f"0/{m.gpu_instance_id}.{m.compute_instance_id}" for m in g.mig_devices
                                      if m.processes)
        pids = [r[1] for r in _rows(app)]
        assert len(pids) == len(set(pids))
        # the parent's listing has no bytes (NO_PROCESS_MEMORY); the instance's row has its own figure
        assert NO_PROCESS_MEMORY.split(":")[0] not in _text(app, "#gpu-notes")
        assert all(r[4] not in ("", "?") for r in _rows(app))
        _fits(app)


async def test_unified_memory_says_the_pool_is_system_memory(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "meminfo").write_text("MemTotal: 125000000 kB\nMemAvailable: 100000000 kB\n")
    snap = gpu_snaps(scenario("gb10-unified"), 1, str(tmp_path))[0]
    g = _first_gpu(snap)
    assert g.memory_pool == "system" and g.memory_pool_note
    app = DltopApp(ListFeed([snap]))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert "pool: system memory" in _text(app, "#gpu-devices")
        assert g.memory_pool_note in _text(app, "#gpu-notes")


async def test_processes_without_memory_say_why_and_not_zero() -> None:
    snap = gpu_snaps(scenario("container"), 1)[0]
    app = DltopApp(ListFeed([snap]))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert {r[4] for r in _rows(app)} == {"?"}
        assert NO_PROCESS_MEMORY in _text(app, "#gpu-notes") and "--pid=host" in _text(app, "#gpu-notes")
        assert "not attributed to a process" in _text(app, "#gpu-devices")


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("name", ["two-gpus", "8gpu-20proc", "a100-mig", "h100-2proc"])
async def test_fits_without_sideways_scrolling(name: str, size: tuple[int, int]) -> None:
    snaps = gpu_snaps(scenario(name), 2)
    app = DltopApp(ListFeed(snaps[:1]))
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        app.apply(snaps[1])  # the next tick, with the table laid out
        await pilot.pause()
        _fits(app)


async def test_a_server_that_is_down_is_its_state_where_its_numbers_would_be() -> None:
    snap = gpu_snaps(scenario("h100-2proc"), 1)[0]
    down = read_server("http://127.0.0.1:9/metrics", 0.5)  # the discard port: nothing listens
    assert down.state == "down"
    app = DltopApp(ListFeed([dataclasses.replace(snap, servers=(down,))]))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert f"down: {down.error}" in _text(app, "#gpu-servers")


# -- pictures: a fixed scenario, fixed /proc entries and times ----------------------------------------------


class PaneApp(App[None]):
    CSS_PATH = DltopApp.CSS_PATH

    def __init__(self, snaps: list[Snapshot]) -> None:
        super().__init__()
        self.snaps = snaps

    def compose(self) -> ComposeResult:
        yield GpuPane()

    def on_mount(self) -> None:
        self.call_after_refresh(self._show)

    def _show(self) -> None:
        pane = self.query_one(GpuPane)
        pane.show(View(snapshot=self.snaps[-1], history=tuple(self.snaps)))


GIB = 1 << 30
# rank 0 of the picture's DDP job, as its probe counts it: fp32 weights, their gradients, Adam's two moments
PICTURE_SPEC = {"weights": 6 * GIB, "gradients": 6 * GIB, "optimizer": 12 * GIB, "kv": 0,
                "allocated": 26 * GIB, "reserved": 27 * GIB + 512 * MIB}


def picture_snaps(tmp: Path, server: ServerStats | None) -> list[Snapshot]:
    s = scenario("two-gpus")
    root = proc_root(tmp, {9120: "torchrun --nproc-per-node 2 train.py", 9121: "torchrun --nproc-per-node 2 train.py",
                           9300: "python -m vllm.entrypoints.openai.api_server --model facebook/opt-125m"})
    # pid 9120 runs the probe: a real probe file, from a process holding the picture's bytes, given the picture's
    # pid and start time (the worker's own change every run)
    (tmp / "run").mkdir()
    with Workers(tmp / "run") as workers:
        workers.gpu(s["gpus"][0]["uuid"].removeprefix("GPU-"), **PICTURE_SPEC)
        (probe,) = workers.probes().processes
    probe = dataclasses.replace(probe, pid=9120, start_time_ticks=START_TICKS, path="", cmd="", uid=1000)
    snaps = gpu_snaps(s, 8, root)
    # The owner of the test's /proc entries is whoever runs the tests: name one, so the picture is the same.
    snaps = [dataclasses.replace(x, gpus=tuple(
        dataclasses.replace(g, processes=tuple(dataclasses.replace(p, user="alice") for p in g.processes))
        for g in x.gpus if isinstance(g.processes, tuple))) for x in snaps if isinstance(x.gpus, tuple)]
    if server is not None:
        snaps = [dataclasses.replace(x, servers=(server,)) for x in snaps]
    # as the Sampler composes a Snapshot: the probe published just now, joined to NVML's process
    return [dataclasses.replace(x, gpus=join_splits(x.gpus, ProbesPart(processes=(
        dataclasses.replace(probe, published_at=x.ts),)), x.servers, x.ts)) for x in snaps]


SIZES = [(80, 24), (120, 40)]


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_gpu_pane_snapshot(snap_compare, tmp_path: Path, size: tuple[int, int]) -> None:
    assert snap_compare(PaneApp(picture_snaps(tmp_path, None)), terminal_size=size)


@needs_metrics
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_gpu_pane_with_server_snapshot(snap_compare, metrics_url: str, tmp_path: Path,
                                       size: tuple[int, int]) -> None:
    real = read_server(metrics_url, 2.0)
    assert real.state == "ok", real.error
    # The payload's numbers as read; the URL and the listening pid fixed (the test's port and pid change).
    server = dataclasses.replace(real, url="http://127.0.0.1:8000/metrics", pid=9300, child_pids=(),
                                 scraped_at=None, scrape_s=None)
    assert snap_compare(PaneApp(picture_snaps(tmp_path, server)), terminal_size=size)


async def test_a_probed_process_s_split_is_drawn_as_its_parts_and_fits(tmp_path: Path) -> None:
    """A real process publishing its probe file, joined to the fake NVML's process as the Sampler joins them."""
    s = scenario("two-gpus")
    with Workers(tmp_path) as workers:
        pid = workers.gpu(s["gpus"][0]["uuid"].removeprefix("GPU-"))
        s["gpus"][0]["compute_processes"][0].update(pid=pid, used_bytes=3500 * MIB)
        # a 4 GiB GPU, so the smallest part (the KV cache) has cells of its own at 80 columns
        s["gpus"][0]["memory"].update(total=4096 * MIB, used=3500 * MIB, free=596 * MIB)
        s["gpus"][0]["process_utilization"][0]["pid"] = pid
        sampler = Sampler([Source("gpus", 1.0, GpuReader(lambda: FakeBackend(s)).read),
                           Source("probes", 1.0, workers.probes)])
        snaps = [sampler.read_once(), sampler.read_once()]
        sampler.close()
    app = DltopApp(ListFeed(snaps))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        app.apply(snaps[1])  # the next tick, with the table laid out
        await pilot.pause()
        lines = _text(app, "#gpu-devices").splitlines()
        bar = lines[1].split()[0]
        # weights | KV | cached | other | non-torch | free, in proportion, in that order
        assert bar.index("W") < bar.index("K") < bar.index("c") < bar.index("o") < bar.index("n") < bar.index("░")
        assert "█" not in bar  # the split covers NVML's whole figure
        legend = lines[2]
        assert "W weights" in legend and "n non-torch" in legend and "o other (grads 512M optim 1.0G)" in legend
        row = next(r for r in _rows(app) if r[1] == str(pid))
        assert row[6:] == ["512M", "256M", "472M", "1.8G", "428M"]  # SPEC's bytes: see tests/probe_helpers.py
        notes = _text(app, "#gpu-notes")
        assert "no probe in pids 9121, 9300: add `import dltop.probe` for the split" in notes
        assert SPLIT_NEEDS_PROBE not in notes
        _fits(app)


@needs_metrics
@pytest.mark.parametrize("gpus", ["two-gpus", "library-not-found"])
async def test_add_and_remove_a_server_from_the_tui(metrics_url: str, gpus: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """a asks for a URL, the app validates it and adds the server to the Sampler's sources (a real scrape over
    loopback HTTP of a real payload); x removes it. With no GPU to list, the keys work all the same."""
    from dltop.config import Settings
    from dltop.sources.registry import build_sources

    monkeypatch.setenv("DLTOP_FAKE_NVML", str(SCENARIOS / f"{gpus}.json"))
    settings = Settings(refresh_s=0.5, tab="gpu")
    app = DltopApp(Sampler(build_sources(settings), builder=build_sources), settings)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        pane = app.query_one(GpuPane)
        assert not app.query_one("#gpu-servers-box").display
        # a key and a palette entry (the footer's room at 80 columns goes to the process table's keys); nothing to
        # remove yet
        titles = [c.title for c in pane.palette_commands()]
        assert "GPU: Add server" in titles and "GPU: Remove server" not in titles
        assert ("GPU: Details" in titles) == (gpus == "two-gpus")  # none where there is no GPU
        enabled = {ab.binding.description: ab.enabled for ab in app.active_bindings.values()}
        assert enabled["Add server"] and not enabled.get("Remove server")  # nothing to remove yet
        await pilot.press("a")
        box = app.query_one("#gpu-server-input", Input)
        assert box.has_focus
        box.value = "ftp://127.0.0.1/metrics"
        await pilot.press("enter")
        await pilot.pause()
        assert app.session.settings.servers == ()
        assert [s.text for s in app.session.said][-1] == (
            "not added: not an http(s) URL: 'ftp://127.0.0.1/metrics' (give host:port or http://host:port/metrics)")
        await pilot.press("a")
        box.value = metrics_url
        await pilot.press("enter")
        await until(pilot, lambda: _text(app, "#gpu-servers").startswith(f"vllm {metrics_url}"))
        assert app.session.settings.servers == (metrics_url,)
        assert "of 116,496 tok" in _text(app, "#gpu-servers")  # the payload's pool, read by the Sampler's source
        # the same server twice is refused, not scraped twice
        await pilot.press("a")
        box.value = metrics_url
        await pilot.press("enter")
        await pilot.pause()
        assert app.session.settings.servers == (metrics_url,) and "scraped already" in [s.text for s in app.session.said][-1]
        # x offers the first server; Enter removes it
        await pilot.press("x")
        assert box.value == metrics_url
        await pilot.press("enter")
        await until(pilot, lambda: not app.query_one("#gpu-servers-box").display)
        assert app.session.settings.servers == () and pane.check_action("remove_server", ()) is False  # none left
        assert "GPU: Remove server" not in [c.title for c in pane.palette_commands()]
    app.session.feed.close()


def test_the_sparkline_columns_follow_the_history_a_snapshot_at_a_time() -> None:
    """GpuSeries reads each new Snapshot once; its columns are the maxima of clock-aligned spans of a fixed number
    of seconds, exactly as a scan of the whole window would find them, while the history slides."""
    from collections import deque

    from dltop.tui import charts
    from dltop.tui.panes.gpu import GpuSeries

    s = scenario("two-gpus")
    reader = GpuReader(lambda: FakeBackend(s))
    snaps = []
    for i in range(90):
        s["gpus"][0]["utilization"]["gpu"] = (i * 37) % 101  # a jumpy series, spikes included
        snaps.append(Snapshot(ts=1000.0 + 0.5 * i, host="t", gpus=reader.read()))
    widths = (7, 13, 40)
    series, window = {w: GpuSeries() for w in widths}, deque(maxlen=40)  # one chart width each, as the pane has
    for snap in snaps:
        window.append(snap)
        points = [(w.ts, float(w.gpus[0].utilization_gpu_percent)) for w in window]
        for width in widths:
            series[width].update(tuple(window))
            for span in (20.0, 60.0):
                want = charts.time_columns(points, snap.ts, width, span, 0.5)
                got = series[width].columns(snap.gpus[0], "utilization_gpu_percent", width, span, snap.ts, 0.5)
                assert got == want, (snap.ts, width, span)
    # the window's 20 s over 7 columns of 20 s: a column is 2.86 s, five or six readings, the largest of them
    cols = series[7].columns(snaps[-1].gpus[0], "utilization_gpu_percent", 7, 20.0, snaps[-1].ts, 0.5)
    assert None not in cols[1:] and len(set(cols)) > 1


def _counting_paints(app: App) -> list[int]:
    """How often each line's Static in #gpu-devices is drawn by Textual from now on."""
    lines = list(app.query_one("#gpu-devices").query_children(Static))
    paints = [0] * len(lines)
    for i, line in enumerate(lines):
        def counted(draw=line._render_content, i: int = i) -> None:
            paints[i] += 1
            draw()
        line._render_content = counted  # type: ignore[method-assign]
    return paints


def _painted(app: App, gpu: int) -> str:
    """A GPU's four lines (headline, bar, legend, sparklines) as Textual paints them (their strips), not what
    their Statics were handed."""
    lines = list(app.query_one("#gpu-devices").query_children(Static))[4 * gpu: 4 * gpu + 4]
    return "\n".join(strip.text for line in lines for strip in line.render_lines(line.size.region))


def _with_util(snap: Snapshot, index: int, util: int) -> Snapshot:
    assert isinstance(snap.gpus, tuple)
    return dataclasses.replace(snap, ts=snap.ts + 1, gpus=tuple(
        dataclasses.replace(g, utilization_gpu_percent=util) if g.index == index else g for g in snap.gpus))


async def test_only_the_lines_whose_numbers_changed_are_drawn_again() -> None:
    """8 GPUs at 80x24 (four lines each): a tick where nothing moved draws nothing again; one where GPU 0's
    utilization moves draws its headline and its sparklines again, not its bar and legend (its memory did not
    move), and no other GPU's; GPU 7 (scrolled out of view) changing is not drawn, not even handed its lines,
    until it is scrolled to, and then shows its new number. (A history of the same length each tick: a growing
    one widens every chart.)"""
    first = gpu_snaps(scenario("8gpu-20proc"), 1)[0]
    app = PaneApp([dataclasses.replace(first, ts=first.ts + i) for i in range(3)])
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        pane = app.query_one(GpuPane)
        pane.compact = False  # the full view (8 GPUs at 80x24 are compact by themselves)
        await pilot.pause()
        assert pane.view is not None
        pane.render_view(pane.view)

        def tick(snap: Snapshot) -> None:
            history = (*pane.view.history[1:], snap)
            pane.show(View(snapshot=snap, history=history))

        await pilot.pause()  # the lines laid out and painted once
        paints = _counting_paints(app)
        assert len(paints) == 32
        tick(dataclasses.replace(pane.view.snapshot, ts=pane.view.snapshot.ts + 1))  # nothing moved
        await pilot.pause()
        assert paints == [0] * 32 and "util 77%" not in _painted(app, 0)
        tick(_with_util(pane.view.snapshot, 0, 77))
        await pilot.pause()
        assert paints == [1, 0, 0, 1] + [0] * 28
        assert "GPU0 NVIDIA H100 80GB HBM3  util 77%" in _painted(app, 0)
        tick(_with_util(pane.view.snapshot, 7, 3))
        await pilot.pause()
        assert paints[4:] == [0] * 28  # GPU 7 is not on screen at 80x24 (GPU 0's chart slid on: drawn again)
        gpu7 = list(app.query_one("#gpu-devices").query_children(Static))[28]
        assert "util 3%" not in str(gpu7.render())  # not even handed its line: an update off screen costs too
        app.query_one("#gpu-devices").scroll_end(animate=False, immediate=True)
        await pilot.pause()
        assert "GPU7 NVIDIA H100 80GB HBM3  util 3%" in _painted(app, 7) and paints[28] == 1


async def test_the_keys_still_work_on_eight_gpus() -> None:
    """With 8 GPUs, a Static for each of their lines: the table keeps the keyboard (down moves its cursor, End goes to the last of
    the 160 rows), and `a` opens the server box, Esc closes it."""
    snaps = gpu_snaps(scenario("8gpu-20proc"), 2)
    app = DltopApp(ListFeed(snaps))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        table = app.query_one("#gpu-table", DataTable)
        assert table.has_focus and table.row_count == 160
        await pilot.press("down", "down")
        assert table.cursor_row == 2
        await pilot.press("end")
        assert table.cursor_row == 159
        await pilot.press("a")
        box = app.query_one("#gpu-server-input", Input)
        assert box.has_focus and box.has_class("-shown")
        await pilot.press("escape")
        assert not box.has_class("-shown") and table.has_focus


async def test_a_command_line_that_looks_like_markup_is_shown_as_it_is() -> None:
    """Command lines are anyone's text: "[red]" is not a style and "[/y]" no error, in the table."""
    snap = gpu_snaps(scenario("two-gpus"), 1)[0]
    g0 = _first_gpu(snap)
    assert isinstance(snap.gpus, tuple) and isinstance(g0.processes, tuple)
    odd = "serve [red]x[/red] [/y]"  # not an interpreter: its arguments are shown as they are
    procs = (dataclasses.replace(g0.processes[0], command=odd), *g0.processes[1:])
    app = DltopApp(ListFeed([dataclasses.replace(snap, gpus=(dataclasses.replace(g0, processes=procs),
                                                             *snap.gpus[1:]))]))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert _rows(app)[0][3] == odd
        table = app.query_one("#gpu-table", DataTable)
        assert odd in "\n".join(strip.text for strip in table.render_lines(table.size.region))


LLAMA2 = SHARED_FIXTURES / "hf-configs" / "Llama-2-7b-hf.config.json"


def _hub(tmp: Path, repo: str, config: Path) -> Path:
    """A Hugging Face hub cache holding one model's config.json, laid out as huggingface_hub leaves it."""
    d = tmp / "hub" / ("models--" + repo.replace("/", "--"))
    (d / "snapshots" / "0123abc").mkdir(parents=True)
    (d / "snapshots" / "0123abc" / "config.json").write_bytes(config.read_bytes())
    (d / "refs").mkdir()
    (d / "refs" / "main").write_text("0123abc")
    return tmp / "hub"


@needs_metrics
@pytest.mark.skipif(not LLAMA2.is_file(), reason=f"HF config fixture {LLAMA2} not found")
async def test_a_kv_pool_larger_than_nvml_s_used_is_marked_inconsistent_and_never_draws_past_it(
        metrics_url: str, tmp_path: Path) -> None:
    """The issue's case: a server's KV pool (from a real /metrics and a real config.json) assigned to a process
    NVML gives less memory than the pool."""
    s = scenario("two-gpus")
    me = os.getpid()  # this process listens for the server: the join finds it on GPU 1
    first = read_server(metrics_url, 2.0)
    hub = _hub(tmp_path, first.models[0].model_name, LLAMA2)
    server = read_server(metrics_url, 2.0, cache=str(hub))
    assert server.state == "ok" and isinstance(server.kv_capacity_bytes, int), server.kv_capacity_bytes
    pool = server.kv_capacity_bytes
    used = pool * 6 // 7  # NVML's figure for the process: less than its KV pool alone
    g1 = s["gpus"][1]
    g1["compute_processes"] = [{"pid": me, "used_bytes": used}]
    g1["process_utilization"] = [{**g1["process_utilization"][0], "pid": me}]
    g1["memory"].update(total=4 * pool, used=used, free=4 * pool - used)
    snaps = [dataclasses.replace(x, servers=(server,)) for x in gpu_snaps(s, 2)]
    snaps = [dataclasses.replace(x, gpus=join_splits(x.gpus, None, x.servers, x.ts)) for x in snaps]
    assert isinstance(snaps[-1].gpus, tuple) and isinstance(snaps[-1].gpus[1].processes, tuple)
    split = snaps[-1].gpus[1].processes[0].split
    # in the Snapshot: both numbers and their sources, the parts as read (not clamped)
    assert split.kv_cache_bytes == pool and split.parts_bytes == pool and split.inconsistent is not None
    from dltop.fmt import human_bytes
    assert f"KV cache {human_bytes(pool)} from the server {metrics_url}" in split.inconsistent
    assert f"more than NVML's {human_bytes(used)}" in split.inconsistent
    back = Snapshot.from_dict(json.loads(json.dumps(snaps[-1].to_dict())))
    assert isinstance(back.gpus, tuple) and isinstance(back.gpus[1].processes, tuple)
    assert back.gpus[1].processes[0].split == split
    app = DltopApp(ListFeed(snaps, start=1))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        lines = _text(app, "#gpu-devices").splitlines()
        bar = lines[lines.index(next(ln for ln in lines if ln.startswith("GPU1"))) + 1].split()[0]
        # the process takes its NVML share of the bar (a quarter), not its pool's: free is the rest
        assert abs(bar.count("K") - len(bar) * used / (4 * pool)) <= 1, bar
        assert abs(bar.count("░") - len(bar) * (1 - used / (4 * pool))) <= 1, bar
        legend = lines[lines.index(next(ln for ln in lines if ln.startswith("GPU1"))) + 2]
        assert legend.lstrip().startswith(f"! pid {me}: parts exceed NVML's used"), legend
        row = next(r for r in _rows(app) if r[1] == str(me))
        assert row[4].endswith("!") and row[7] != "?"  # Used marked; the KV cell as the server gives it
        notes = _text(app, "#gpu-notes")
        assert "inconsistent: the parts (KV cache" in notes and f"(pid {me})" in notes
        _fits(app)


async def test_eight_gpus_at_80x24_draw_no_scroll_bar_and_say_what_is_out_of_view() -> None:
    # The devices box's scroll bar thumb (▃▃) sat at the end of GPU0's legend: a stray piece of a chart.
    app = DltopApp(ListFeed(gpu_snaps(scenario("8gpu-20proc")), start=2), Settings(tab="gpu"))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press("c")  # the full view (8 GPUs open compact at 80x24): 4 lines a GPU
        await pilot.pause()
        box = app.query_one("#gpu-devices")
        assert box.max_scroll_y > 0 and box.scrollbar_size_vertical == 0
        tag = app.query_one("#gpu-devices-tag", Static)
        assert tag.display and str(tag.render()) == (f"↓{box.max_scroll_y} lines of GPUs out of view: Tab to them "
                                                     "to scroll, or the mouse wheel")
        box.focus()
        await pilot.press("down", "down")
        await pilot.pause()
        assert str(tag.render()) == f"↑2 ↓{box.max_scroll_y - 2} lines of GPUs out of view: ↑/↓ scroll them"


@pytest.mark.parametrize("compact", [True, False])
async def test_a_gpu_s_lines_are_what_its_numbers_draw_whatever_was_kept_from_the_tick_before(compact: bool) -> None:
    """The pane keeps last tick's bar of a GPU whose memory did not move (its Memo, by memory_key): a tick that
    moves memory from one process to another (the GPU's total the same), one that gives a process a
    probe's split, one that moves only the numbers beside the bar, and one where nothing moved: each time the
    lines shown are the ones drawn from scratch from that tick's numbers."""
    from dltop.tui.panes.gpu import DeviceLines, compact_line, memory_lines

    def lines_of(pane: GpuPane) -> list[Content]:
        return pane.query_one("#gpu-devices", DeviceLines).wanted

    first = gpu_snaps(scenario("8gpu-20proc"), 1)[0]
    app = PaneApp([dataclasses.replace(first, ts=first.ts + i) for i in range(3)])
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        pane = app.query_one(GpuPane)
        pane.compact = compact
        await pilot.pause()
        assert pane.view is not None

        def tick(snap: Snapshot) -> list[Content]:
            pane.show(View(snapshot=snap, history=(*pane.view.history[1:], snap)))
            width = max(20, pane.query_one("#gpu-devices").scrollable_content_region.width)
            assert isinstance(snap.gpus, tuple)
            if compact:
                fresh = [compact_line(g, width) for g in snap.gpus]
                wrong = [(i, str(a), a.spans) for i, (a, b) in enumerate(zip(lines_of(pane), fresh, strict=True))
                         if a != b]
                assert wrong == []
            else:  # the full view: headline, memory bar and legend, sparklines per GPU
                shown = [lines_of(pane)[4 * i + 1: 4 * i + 3] for i in range(len(snap.gpus))]
                assert shown == [memory_lines(g, width) for g in snap.gpus]
            return list(lines_of(pane))

        def on_gpu0(snap: Snapshot, **changes: Any) -> Snapshot:
            assert isinstance(snap.gpus, tuple)
            g0 = snap.gpus[0]
            return dataclasses.replace(snap, ts=snap.ts + 1, gpus=(dataclasses.replace(g0, **changes), *snap.gpus[1:]))

        before = tick(dataclasses.replace(pane.view.snapshot, ts=pane.view.snapshot.ts + 1))
        g0 = pane.view.snapshot.gpus[0]
        assert isinstance(g0.processes, tuple)
        a, *rest = g0.processes  # a takes all but a MiB of each of the others' memory
        held = a.used_bytes + sum(p.used_bytes - MIB for p in rest)
        moved = (dataclasses.replace(a, used_bytes=held), *(dataclasses.replace(p, used_bytes=MIB) for p in rest))
        after = tick(on_gpu0(pane.view.snapshot, processes=moved))
        split = dataclasses.replace(a.split, weights_bytes=20 * GIB, kv_cache_bytes=8 * GIB, probe_device="cuda:0")
        probed = tick(on_gpu0(pane.view.snapshot, processes=(dataclasses.replace(moved[0], split=split), *moved[1:])))
        numbers = tick(on_gpu0(pane.view.snapshot, utilization_gpu_percent=3, power_mw=123_000))
        still = tick(dataclasses.replace(pane.view.snapshot, ts=pane.view.snapshot.ts + 1))  # nothing moved
        # each tick drew what it had to (compact mode draws the memory used in one colour: a move between
        # processes changes nothing there, the probe's parts do); the last one the same as the one before it
        assert (after != before) is not compact and probed != after and numbers != probed and still == numbers


async def test_sixteen_gpus_compact_say_what_is_out_of_view_and_stop_saying_it_in_a_taller_terminal() -> None:
    # 16 GPUs (two of the 8-GPU scenario's boards, numbered on) in compact mode: at 80x24 the box holds 10 of
    # their lines, and says so of the other 6 on every tick; grown to 80x40 (nothing else moved), all 16 fit.
    snaps = []
    for snap in gpu_snaps(scenario("8gpu-20proc")):
        assert isinstance(snap.gpus, tuple)
        more = tuple(dataclasses.replace(g, index=g.index + 8, uuid=f"{g.uuid}-b") for g in snap.gpus)
        snaps.append(dataclasses.replace(snap, gpus=snap.gpus + more))
    app = DltopApp(ListFeed(snaps, start=2), Settings(tab="gpu"))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        box = app.query_one("#gpu-devices")
        tag = app.query_one("#gpu-devices-tag", Static)
        assert box.size.height < 16 and tag.display
        assert str(tag.render()).startswith(f"↓{16 - box.size.height} lines of GPUs out of view")
        await pilot.resize_terminal(80, 40)
        await pilot.pause()
        await pilot.pause()
        assert box.size.height == 16 and not tag.display
