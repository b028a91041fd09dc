"""The footer at 80×24 on every tab, each with rows to act on (issue 36, item 4): what it shows lies within the 80
columns, `? Help` (every key) and `^p Menu` (every action) are always there, and each key of the tab that acts
now is in the footer or listed by `?`."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from textual.binding import Binding
from textual.widgets import Footer

from dltop.config import Settings
from dltop.model import Snapshot
from dltop.model.actions import ActionEvent
from dltop.sampler import ListFeed
from dltop.tui.app import DltopApp
from dltop.tui.screens.help import key_rows
from tests.conftest import load_session
from tests.test_caches_pane import make_cache
from tests.test_caches_pane import snap_of as caches_snap
from tests.test_datasets_pane import snap_of as datasets_snap
from tests.test_gpu_pane import gpu_snaps, scenario

# The keys that were missing from the footer (the list); the palette's ^p was cut at 80 columns.
MUST_SHOW = {"datasets": {"s"}, "caches": {"a", "⏎"}, "training": {"e"}, "gpu": {"a"}}


def _snapshots(tmp: Path) -> list[Snapshot]:
    """GPU processes of a scenario, a dataset watched, a compile cache found and a probe job, in each tick."""
    (tmp / "ds" / "train").mkdir(parents=True)
    (tmp / "ds" / "train" / "a.bin").write_bytes(b"x" * 8192)
    (tmp / "ds" / "val.bin").write_bytes(b"x" * 4096)
    datasets = datasets_snap(tmp / "ds").datasets
    ind = make_cache(tmp / "ind", {"fxgraph": 128 << 10, "ab": 64 << 10})
    caches = caches_snap(tmp / "home", TORCHINDUCTOR_CACHE_DIR=str(ind)).caches
    probes = load_session("training-session.jsonl")[-1].probes
    return [dataclasses.replace(s, datasets=datasets, caches=caches, probes=probes)
            for s in gpu_snaps(scenario("8gpu-20proc"), 2)]


@pytest.mark.parametrize("paused", [False, True])
async def test_every_key_that_acts_is_in_the_footer_or_under_help_within_80_columns(tmp_path: Path,
                                                                                    paused: bool) -> None:
    app = DltopApp(ListFeed(_snapshots(tmp_path), start=1), Settings(datasets=(str(tmp_path / "ds"),)))
    async with app.run_test(size=(80, 24)) as pilot:
        for i, pane in enumerate(app.panes, start=1):
            await pilot.press(str(i))
            await pilot.pause()
            if paused and not app.session.head.past:
                await pilot.press("space")
            await pilot.pause()
            keys = list(app.query_one(Footer).children)
            shown = {str(getattr(k, "key_display", "")): k for k in keys}
            assert all(k.region.x >= 0 and k.region.right <= 80 and k.region.width for k in keys), \
                [(str(getattr(k, "key_display", "")), k.region) for k in keys]
            assert "?" in shown and "^p" in shown, list(shown)
            assert "␣" in shown  # what space does now: pause, live
            if not paused:
                assert MUST_SHOW.get(pane.PANE_ID, set()) <= set(shown), (pane.PANE_ID, list(shown))
            listed = {key for key, _ in key_rows(pane.BINDINGS, app.get_key_display, "1m")}  # what ? lists
            for b in pane.BINDINGS:
                assert isinstance(b, Binding)
                if b.description and pane.check_action(b.action, ()):
                    display = app.get_key_display(b)
                    assert display in shown or display in listed, (pane.PANE_ID, display, list(shown))


async def test_keys_that_cannot_act_now_say_the_real_reason(tmp_path: Path) -> None:
    # Paused on live data, a key that reads or edits the system now says so, not "this is a replay" or nothing;
    # while an action runs, w says which one runs, not nothing.
    app = DltopApp(ListFeed(_snapshots(tmp_path), start=1), Settings(datasets=(str(tmp_path / "ds"),)))
    paused = "paused on a past moment (space goes back to live)"
    async with app.run_test(size=(80, 24)) as pilot:
        for tab, key, said in (("gpu", "e", f"environment: {paused}"), ("gpu", "a", f"a: {paused}"),
                               ("datasets", "a", f"a: {paused}"), ("datasets", "w", f"w: {paused}"),
                               ("caches", "r", f"r: {paused}"), ("caches", "c", f"c: {paused}")):
            pane = app.main.pane(tab)
            await pilot.press(str(app.panes.index(pane) + 1))
            await pilot.pause()
            if not app.session.head.past:
                await pilot.press("space")
                await pilot.pause()
            await pilot.press(key)
            await pilot.pause()
            assert app.session.said[-1].text.startswith(said), (tab, key, app.session.said[-1].text)
            assert app.screen is app.main  # no box, no dialog
        await pilot.press("space")  # live again
        pane = app.main.pane("datasets")
        await pilot.press(str(app.panes.index(pane) + 1))
        await pilot.pause()
        assert pane.view is not None and not pane.view.past
        running = ActionEvent(run_id=1, step="run", phase="progress", action="warm", target="/data/x", ts=1.0)
        pane.view = dataclasses.replace(pane.view, busy=True, action=running)
        assert pane.check_action("warm", ()) is None  # greyed, not gone
        await pilot.press("w")
        assert app.session.said[-1].text == "w: busy: warm /data/x is running (Esc on its tab cancels it)"
