"""Moving in time with real keys: pause, step, jump and go to in the live TUI's own history; `--record` on real
sources, then `dltop replay` of that recording showing the numbers the live screen showed; the event list."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from textual.widgets import DataTable, Footer, Input, OptionList, Static

from dltop.config import Settings
from dltop.model import Snapshot
from dltop.recorder import Recorder, Recording
from dltop.residency.scan import scan_paths
from dltop.sampler import ListFeed, Sampler
from dltop.sources.registry import build_sources
from dltop.text.events import describe_event
from dltop.timeline import Recorded
from dltop.tui.app import DltopApp
from dltop.tui.screens.ask import AskScreen
from dltop.tui.screens.confirm import ConfirmScreen
from dltop.tui.screens.events import EventsScreen
from tests.test_pagecache_util import make_file
from tests.waiting import until

PAGECACHE_WIDGETS = ("#pc-summary", "#pc-sparks", "#pc-activity", "#pc-cgroup", "#pc-disks", "#pc-notes")
GPU_WIDGETS = ("#gpu-devices", "#gpu-table", "#gpu-servers", "#gpu-notes")
SCENARIO = Path(__file__).parent / "data" / "gpu-scenarios" / "two-gpus.json"


def _tab(app: DltopApp, pane_id: str) -> str:
    return str([p.PANE_ID for p in app.panes].index(pane_id) + 1)


def _text(app: DltopApp, selector: str) -> str:
    return str(app.query_one(selector, Static).render())


def _screen(app: DltopApp, widgets: tuple[str, ...] = PAGECACHE_WIDGETS) -> dict[str, str]:
    """What a pane's widgets (the page-cache pane's by default) and the hint line show now; a table as its rows."""
    shown = {}
    for sel in widgets:
        widget = app.query_one(sel)
        if isinstance(widget, DataTable):
            shown[sel] = "\n".join(" | ".join(map(str, widget.get_row_at(i))) for i in range(widget.row_count))
        elif not isinstance(widget, Static):  # #gpu-devices: a Static per line
            shown[sel] = "\n".join(str(block.render()) for block in widget.query_children(Static))
        else:
            shown[sel] = _text(app, sel)
    hints = app.query_one("#hints", Static)
    shown["#hints"] = str(hints.render()) if hints.display else ""
    return shown


async def _open(pilot, pane: str = "pagecache") -> None:
    """Show a pane's tab at its settled layout (as the next tick would draw it)."""
    await pilot.press(_tab(pilot.app, pane))
    await pilot.pause()
    pilot.app.show()
    await pilot.pause()


async def _live_screen_at(session: list[Snapshot], k: int) -> dict[str, str]:
    """What a live app showed when session[k] was its latest Snapshot."""
    app = DltopApp(ListFeed(session[: k + 1], start=k))
    async with app.run_test(size=(80, 24)) as pilot:
        await _open(pilot)
        return _screen(app)


async def _go_to(pilot, text: str) -> None:
    await pilot.press("b")
    assert isinstance(pilot.app.screen, AskScreen)
    await pilot.press(*text, "enter")
    await pilot.pause()
    await pilot.pause()  # drawn again once laid out


async def test_step_back_shows_what_live_showed_then(session: list[Snapshot]) -> None:
    # T three times from the newest: the pane shows session[17] with the rates, sparklines and hints a live
    # app showed when session[17] was its latest.
    expected = await _live_screen_at(session, 17)
    app = DltopApp(ListFeed(session[:21], start=20))
    async with app.run_test(size=(80, 24)) as pilot:
        await _open(pilot)
        live = _screen(app)
        await pilot.press("T", "T", "T")
        await pilot.pause()
        assert app.session.head.at == session[17].ts
        assert _screen(app) == expected != live
        header = _text(app, "#header")
        behind = int(session[20].ts - session[17].ts)
        assert "PAUSED" in header and f"(−{behind}s)" in header
        # t steps forward; reaching the newest sample is live again.
        await pilot.press("t")
        assert app.session.head.at == session[18].ts
        await pilot.press("t", "t")
        assert app.session.head.at is None and "PAUSED" not in _text(app, "#header")
        assert _screen(app) == live


async def test_pause_holds_the_view_while_sampling_goes_on(session: list[Snapshot]) -> None:
    feed = ListFeed(session[:30], start=5)
    app = DltopApp(feed, Settings(refresh_s=0.1))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press(_tab(app, "pagecache"))
        await until(pilot, lambda: len(app.session.history) >= 8)
        await pilot.press("space")
        held_ts = app.session.head.at
        assert held_ts is not None and "PAUSED" in _text(app, "#header")
        held = _screen(app)
        await until(pilot, lambda: app.session.history[-1].ts == session[29].ts)  # the feed went on to its end
        await pilot.pause()
        assert app.session.head.at == held_ts and _screen(app) == held
        k = next(i for i, s in enumerate(session) if s.ts == held_ts)
        behind = int(session[29].ts - session[k].ts)
        assert f"(−{behind}s)" in _text(app, "#header")  # how far behind live, live having moved on
        await pilot.press("space")
        assert app.session.head.at is None and _screen(app) == await _live_screen_at(session, 29)


async def test_jump_and_go_to(session: list[Snapshot]) -> None:
    ts = [s.ts for s in session]
    now = ts[-1] + 5
    app = DltopApp(ListFeed(session, start=len(session) - 1), Settings(jump_s=10.0), clock=lambda: now)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("J")  # from live: pauses, 10 s back, on the sample on screen then
        want = max(i for i, t in enumerate(ts) if t <= ts[-1] - 10)
        assert app.session.head.at == ts[want]
        # b: the sample on screen at a typed time (tests/test_session.py moves through every kind of time)
        await _go_to(pilot, f"{int(now - ts[5])}s ago")
        assert app.session.head.at == ts[max(i for i, t in enumerate(ts) if t <= now - int(now - ts[5]))]
        # A time outside the history: the dialog says so and stays.
        await pilot.press("b", *"1h ago", "enter")
        await pilot.pause()
        assert isinstance(app.screen, AskScreen) and "outside the history" in str(
            app.screen.query_one("#ask-error", Static).render())
        await pilot.press("escape")
        await pilot.press("space")
        assert app.session.head.at is None


def _record(directory: Path, snaps: list[Snapshot]) -> None:
    # No retention: these Snapshots are days old, and a recorder removes what is older than its --retain.
    with Recorder(str(directory), retain_s=None, max_bytes=None) as recorder:
        for snap in snaps:
            recorder.write(snap, wait=True)


def _dataset_snapshots(tmp_path: Path, n: int) -> list[Snapshot]:
    (tmp_path / "ds" / "train").mkdir(parents=True)
    (tmp_path / "ds" / "train" / "a.bin").write_bytes(b"x" * 65536)
    part = scan_paths((str(tmp_path / "ds"),))
    return [Snapshot(ts=1_790_000_000.0 + i, host="h", datasets=part) for i in range(n)]


async def test_nothing_acts_from_the_past(tmp_path: Path) -> None:
    # Paused live, or in a replay: w/e/l are greyed and say why; the palette offers none of them.
    snaps = _dataset_snapshots(tmp_path, 3)
    _record(tmp_path / "rec", snaps)
    settings = Settings(datasets=(str(tmp_path / "ds"),))
    for replay in (False, True):
        recorded = Recorded(Recording(str(tmp_path / "rec")), "rec")
        app = DltopApp(settings=settings, recorded=recorded) if replay else DltopApp(ListFeed(snaps, start=2), settings)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press(_tab(app, "datasets"))
            await pilot.pause()
            if not replay:
                await pilot.press("T")
            pane = app.main.active_pane()
            assert pane is not None and pane.check_action("warm", ()) is None
            await pilot.press("w")
            await pilot.pause()
            said = [s.text for s in app.session.said]
            why = "this is a replay" if replay else "paused on a past moment"  # the real reason (View.frozen)
            assert any(m.startswith(f"w: {why}") for m in said) and not isinstance(app.screen, ConfirmScreen), said
            titles = {c.title for c in app.get_system_commands(app.screen)}
            assert not titles & {"Datasets: Warm", "Datasets: Evict", "Datasets: Lock"}
            assert ("Events" in titles) == replay and "Previous sample" in titles


def _footer_fits(app: DltopApp) -> tuple[list[str], bool]:
    keys = [k for k in app.query_one(Footer).children if k.display]
    return [str(getattr(k, "key_display", "")) for k in keys], all(k.region.right <= 80 for k in keys)


async def test_footer_names_what_space_does_and_fits_80_columns(tmp_path: Path) -> None:
    snaps = _dataset_snapshots(tmp_path, 3)
    _record(tmp_path / "rec", snaps)
    settings = Settings(datasets=(str(tmp_path / "ds"),))
    for replay in (False, True):
        recorded = Recorded(Recording(str(tmp_path / "rec")), "rec")
        app = DltopApp(settings=settings, recorded=recorded) if replay else DltopApp(ListFeed(snaps, start=2), settings)
        async with app.run_test(size=(80, 24)) as pilot:
            for tab in range(1, len(app.panes) + 1):
                await pilot.press(str(tab))
                await pilot.pause()
                modes = [("Play", "Pause")] if replay else [("Pause", "Live")]
                for first, second in modes:
                    labels = [k.description for k in app.query_one(Footer).children]
                    assert first in labels and second not in labels
                    assert ("Step" in labels) == replay  # live has nothing newer to step to
                    keys, fits = _footer_fits(app)
                    assert fits, f"tab {tab}: {keys}"
                    await pilot.press("space")
                    await pilot.pause()
                    labels = [k.description for k in app.query_one(Footer).children]
                    assert second in labels and first not in labels and "Step" in labels and "Go to" in labels
                    keys, fits = _footer_fits(app)
                    assert fits, f"tab {tab}: {keys}"
                    await pilot.press("space")
                    await pilot.pause()


def _recording(tmp_path: Path, session: list[Snapshot], name: str = "session") -> Recording:
    _record(tmp_path / name, session)
    return Recording(str(tmp_path / name))


async def test_replay_keys(tmp_path: Path, session: list[Snapshot]) -> None:
    rec = _recording(tmp_path, session)
    ts = rec.times()
    assert ts == [s.ts for s in session]
    app = DltopApp(recorded=Recorded(rec, "session"))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press(_tab(app, "pagecache"))
        assert app.session.head.at == ts[0]
        header = _text(app, "#header")
        assert "REPLAY session" in header and "×1 ⏸" in header and "every" not in header
        await pilot.press("t", "t", "T")
        assert app.session.head.at == ts[1]
        await pilot.press("greater_than_sign")
        assert app.session.head.speed == 10 and "×10" in _text(app, "#header")
        await pilot.press("greater_than_sign", "greater_than_sign")
        assert app.session.head.speed == 60
        # The keys reach the playhead (tests/test_session.py plays the recording through, tick by tick).
        await pilot.press("space")
        assert app.session.head.playing and "▶" in _text(app, "#header")
        await until(pilot, lambda: not app.session.head.playing)  # ×60 through a 40 s recording: to its end
        assert app.session.head.at == ts[-1] and "⏸" in _text(app, "#header")
        # what it said (a notice shows for 2 s: on a loaded machine gone before it is read)
        assert "end of the recording" in [s.text for s in app.session.said]
        await pilot.press("less_than_sign")
        assert app.session.head.speed == 10 and "×10" in _text(app, "#header")
        await pilot.press("plus")  # a recording keeps its cadence: + is not a key here
        assert app.session.settings.refresh_s == 1.0
        # The replay at a moment shows what live showed then.
        await pilot.press("T", "T", "T")
        assert app.session.head.at == ts[-4]
        assert _screen(app) == await _live_screen_at(session, len(session) - 4)


@pytest.mark.parametrize("pane", ["pagecache", "gpu"])
async def test_recorded_live_and_replayed_screens_are_the_same(tmp_path: Path, pane: str, monkeypatch) -> None:
    # The key promise: run the live TUI with a recorder on real sources, keep what the pane (page cache; the GPU
    # tab on the fake NVML backend playing a two-GPU scenario, this machine having no GPU to show) and the hint
    # line showed for each sample, then replay the recording, go to each of those times with b, and compare. A
    # marker made with m in the live run is in the replay's event list, and Enter goes there.
    widgets = PAGECACHE_WIDGETS if pane == "pagecache" else GPU_WIDGETS
    if pane == "gpu":
        monkeypatch.setenv("DLTOP_FAKE_NVML", str(SCENARIO))
    settings = Settings(refresh_s=0.25)
    recorder = Recorder(str(tmp_path / "rec"), interval_s=0.25)
    sampler = Sampler(build_sources(settings), builder=build_sources)
    app = DltopApp(sampler, settings, recorder=recorder)
    shown: dict[float, dict[str, str]] = {}
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await _open(pilot, pane)
            original = app.main.show

            def show_and_keep() -> None:
                original()
                if app.session.history and app.session.head.at is None:
                    shown[app.session.history[-1].ts] = _screen(app, widgets)

            app.main.show = show_and_keep  # type: ignore[method-assign]
            await until(pilot, lambda: len(shown) >= 4)
            await pilot.press("m")
            assert isinstance(app.screen, AskScreen)
            await pilot.press(*"warm started", "enter")
            await until(pilot, lambda: len(shown) >= 8)
            await pilot.press("q")
    finally:
        sampler.close()
        recorder.close()
    # Only what was drawn at its settled layout counts: the first frame may come before the layout.
    keep = sorted(shown)[2:]
    assert all(("L40S" if pane == "gpu" else "Available") in shown[t][widgets[0]] for t in keep)
    rec = Recording(str(tmp_path / "rec"))
    assert set(keep) <= set(rec.times())
    marker = next(e for e in rec.events() if e.kind == "marker")
    assert marker.data["text"] == "warm started"
    replay = DltopApp(recorded=Recorded(rec, "rec"))
    async with replay.run_test(size=(80, 24)) as pilot:
        await pilot.press(_tab(replay, pane))
        await pilot.pause()
        for t in keep:
            await _go_to(pilot, repr(t))
            assert replay.session.head.at == t
            assert _screen(replay, widgets) == shown[t], f"at {t}"
        await pilot.press("v")
        assert isinstance(replay.screen, EventsScreen)
        options = replay.screen.query_one(OptionList)
        i = next(i for i in range(options.option_count) if "warm started" in str(options.get_option_at_index(i).prompt))
        options.highlighted = i
        await pilot.press("enter")
        await pilot.pause()
        assert not isinstance(replay.screen, EventsScreen)
        assert replay.session.head.at == max(t for t in rec.times() if t <= marker.ts)


async def test_ages_in_a_replay_are_counted_from_the_moment_on_screen(tmp_path: Path) -> None:
    # A dataset scanned 2 s before a recorded moment is "<10s" old there (ages are floored to their unit,
    # fmt.human_age), whenever the replay is watched (it said how long ago the recording was made, growing while
    # paused).
    make_file(tmp_path / "ds" / "a.bin", 8 * 4096)
    part = scan_paths((str(tmp_path / "ds"),))
    scanned = part.paths[0].scanned_at
    snaps = [Snapshot(ts=scanned + dt, host="test", datasets=part) for dt in (2.0, 30.0, 95.0)]
    _record(tmp_path / "rec", snaps)
    app = DltopApp(recorded=Recorded(Recording(str(tmp_path / "rec")), "rec"))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press(_tab(app, "datasets"))
        await pilot.pause()
        table = app.query_one("#ds-table", DataTable)
        for snap, age in zip(snaps, ("<10s", "30s", "1m"), strict=True):
            await _go_to(pilot, repr(snap.ts))
            assert app.session.head.at == snap.ts
            assert str(table.get_row_at(0)[-1]) == age


async def test_marker_needs_a_recording(session: list[Snapshot]) -> None:
    app = DltopApp(ListFeed(session[:3], start=2))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("m")
        await pilot.pause()
        assert not isinstance(app.screen, AskScreen)  # said why (tests/test_session.py), no dialog
        assert app.session.said[-1].text == app.session.mark_refusal()


async def test_go_to_dialog_keeps_a_bad_time_and_says_why(tmp_path: Path, session: list[Snapshot]) -> None:
    rec = _recording(tmp_path, session)
    app = DltopApp(recorded=Recorded(rec, "session"))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("b", *"yesterday-ish", "enter")
        await pilot.pause()
        assert isinstance(app.screen, AskScreen)
        assert "not a time" in str(app.screen.query_one("#ask-error", Static).render())
        app.screen.query_one(Input).value = ""
        await pilot.press(*"[/x]", "enter")  # echoed back as typed, not read as Rich markup (MarkupError)
        await pilot.pause()
        assert "[/x]" in str(app.screen.query_one("#ask-error", Static).render())
        app.screen.query_one(Input).value = ""
        await pilot.press(*"end", "enter")
        await pilot.pause()
        assert not isinstance(app.screen, AskScreen) and app.session.head.at == rec.times()[-1]


@pytest.mark.parametrize("size", [(80, 24)], ids=["80x24"])
def test_replay_snapshot(snap_compare, tmp_path: Path, size: tuple[int, int], session: list[Snapshot]) -> None:
    # A recording made by the test from the real session of tests/data (scripts/capture_session.py), replayed
    # at the moment writeback starts, stepped to with real keys.
    rec = _recording(tmp_path, session)

    async def run_before(pilot) -> None:
        await pilot.press(_tab(pilot.app, "pagecache"))
        await pilot.pause()
        await pilot.press(*["t"] * 20)
        await pilot.pause()
        pilot.app.show()
        await pilot.pause()

    assert snap_compare(DltopApp(recorded=Recorded(rec, "session")), terminal_size=size, run_before=run_before)


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
                           max_leaves=8)


@settings(deadline=None)  # a loaded CI machine is slow, not wrong
@given(kind=st.sampled_from(["oom_kill", "gpu_process", "action", "hint", "marker", "start", "stop", "new"]),
       data=st.dictionaries(st.sampled_from(["text", "kills", "cgroup", "source", "total", "gpu", "mig", "pid",
                                             "state", "command", "used_bytes", "action", "target", "phase",
                                             "outcome", "done_bytes", "message", "severity", "id", "samples",
                                             "dropped", "interval_s"]) | st.text(), json_values, max_size=8))
def test_any_recorded_event_is_one_line(kind: str, data: dict) -> None:
    # A recording comes from disk: an older or damaged one may hold any JSON in an event's data.
    line = describe_event(kind, data)
    assert isinstance(line, str) and "\n" not in line


def test_events_of_a_real_action_in_a_line(tmp_path: Path) -> None:
    # The runner's own events for a real warm of a real file, through the recorder and back.
    from dltop.actions.runner import ActionRunner

    make_file(tmp_path / "data.bin", 1 << 20)  # written, synced and evicted: the warm reads all of it
    runner = ActionRunner()
    with Recorder(str(tmp_path / "rec")) as recorder:
        runner.subscribe(recorder.action_listener)
        run = runner.start("warm", [str(tmp_path / "data.bin")])
        assert run.done.wait(30)
        runner.close()
        recorder.write(Snapshot(ts=time.time(), host="h"))
    events = [e for e in Recording(str(tmp_path / "rec")).events() if e.kind == "action"]
    assert [e.data["phase"] for e in events] == ["started", "finished"]
    by = f"by pid {os.getpid()} uid {os.geteuid()}"
    assert describe_event("action", events[0].data) == f"warm {tmp_path / 'data.bin'}: started, {by}"
    assert describe_event("action", events[-1].data) == f"warm {tmp_path / 'data.bin'}: ok (1.0 MiB), {by}"
