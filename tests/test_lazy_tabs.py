"""Tabs composed when first shown (issue 22, item 5): only the tab on screen has its widgets at the first frame; the
palette, the keys and ? work for a tab that was never shown, which is composed on the way to it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from textual.widgets import DataTable, Input

from dltop.config import Settings
from dltop.model import Snapshot
from dltop.residency.scan import scan_paths
from dltop.sampler import ListFeed
from dltop.tui.app import DltopApp
from dltop.tui.screens.confirm import ConfirmScreen
from dltop.tui.screens.help import HelpScreen
from tests.dialogs import confirm_shown, help_rows
from tests.test_caches_pane import make_cache, snap_of
from tests.test_gpu_pane import gpu_snaps, scenario
from tests.waiting import until


@pytest.fixture
def every_layer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Snapshot, Settings]:
    """A Snapshot with something in every tab (two GPUs and their processes, a dataset read from a real tree,
    a real walk of an Inductor cache) and the settings watching that dataset."""
    (tmp_path / "ds" / "train").mkdir(parents=True)
    (tmp_path / "ds" / "train" / "a.bin").write_bytes(b"x" * 65536)
    ind = make_cache(tmp_path / "ind", {"fxgraph": 256 << 10, "aotautograd": 128 << 10})
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(ind))
    caches = snap_of(tmp_path / "home", TORCHINDUCTOR_CACHE_DIR=str(ind)).caches
    gpus = gpu_snaps(scenario("h100-2proc"), n=1)[0].gpus
    snap = Snapshot(ts=1000.0, host="h", gpus=gpus, caches=caches, datasets=scan_paths((str(tmp_path / "ds"),)))
    return snap, Settings(datasets=(str(tmp_path / "ds"),))


def _composed(app: DltopApp) -> set[str]:
    return {p.PANE_ID for p in app.panes if p.is_mounted and p.children}


def _tab(app: DltopApp, pane_id: str) -> int:
    return [p.PANE_ID for p in app.panes].index(pane_id) + 1


async def test_only_the_tab_on_screen_is_composed_before_the_first_frame(every_layer) -> None:  # type: ignore[no-untyped-def]
    snap, settings = every_layer
    app = DltopApp(ListFeed([snap]), replace(settings, tab="datasets"))
    async with app.run_test(size=(80, 24)) as pilot:
        assert _composed(app) == {"datasets"}
        assert not app.query("#gpu-table") and not app.query("#cc-table")  # no widgets of the hidden tabs
        await pilot.press(str(_tab(app, "caches")))
        assert _composed(app) == {"datasets", "caches"}
        assert app.query_one("#cc-table", DataTable).row_count > 0  # drawn at once, not at the next tick
        await pilot.press(str(_tab(app, "datasets")))
        assert _composed(app) == {"datasets", "caches"}  # composed once


async def test_the_palette_lists_every_tabs_actions_before_it_was_shown(every_layer) -> None:  # type: ignore[no-untyped-def]
    # Textual's Lazy broke this: a hidden pane's check_action asked its widgets, which were not there yet.
    snap, settings = every_layer
    app = DltopApp(ListFeed([snap]), replace(settings, tab="pagecache"))
    async with app.run_test(size=(80, 24)) as pilot:
        never = {c.title for c in app.get_system_commands(app.screen)}
        assert _composed(app) == {"pagecache"}
        for pane in app.panes:  # every tab shown once, then back on the Page cache tab
            await pilot.press(str(_tab(app, pane.PANE_ID)))
        await pilot.press(str(_tab(app, "pagecache")))
        shown = {c.title for c in app.get_system_commands(app.screen)}
    # What acts on a row of a drawn table (a GPU process: k, s, e, o, O, g; a watched dataset's row: x) comes once
    # it was drawn, as before tabs were composed lazily; everything else a tab offers is offered before it was shown.
    assert shown - never <= {"GPU: Signal", "GPU: Tag", "GPU: Environment", "GPU: Sort", "GPU: Reverse sort",
                             "GPU: Tree", "Datasets: Unwatch"}
    assert never - shown == set()
    assert {"Datasets: Warm", "Datasets: Evict", "Datasets: Lock", "Datasets: Add", "Caches: Clear",
            "Caches: Scan", "GPU: Add server", "GPU: Filter", "GPU: Details"} <= never


async def _run_from_palette(app: DltopApp, pilot, title: str) -> None:  # type: ignore[no-untyped-def]
    """Type `title` into the real command palette and run it."""
    await pilot.press("ctrl+p")
    await pilot.pause(0.2)
    await pilot.press(*title)
    await pilot.pause(0.5)
    await pilot.press("enter")


async def test_a_palette_entry_of_a_tab_never_shown_composes_it_and_acts_on_its_selection(every_layer) -> None:  # type: ignore[no-untyped-def]
    snap, settings = every_layer
    app = DltopApp(ListFeed([snap]), replace(settings, tab="pagecache"))
    async with app.run_test(size=(80, 24)) as pilot:
        await _run_from_palette(app, pilot, "Datasets: Warm")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "no warm dialog")
        assert "Warm" in confirm_shown(app.screen)[0] and app.query_one("#tabs").active == "tab-datasets"
        await pilot.press("escape")
        await _run_from_palette(app, pilot, "GPU: Add server")
        await until(pilot, lambda: app.query("#gpu-server-input.-shown"), "no server box")
        assert app.query_one("#tabs").active == "tab-gpu" and app.focused is app.query_one("#gpu-server-input", Input)


@pytest.mark.parametrize("tab,key", [("datasets", "w"), ("caches", "c"), ("gpu", "a"), ("gpu", "slash")])
async def test_a_tabs_keys_work_on_its_first_show(every_layer, tab: str, key: str) -> None:  # type: ignore[no-untyped-def]
    snap, settings = every_layer
    app = DltopApp(ListFeed([snap]), replace(settings, tab="pagecache"))
    async with app.run_test(size=(80, 24)) as pilot:
        assert tab not in _composed(app)
        await pilot.press(str(_tab(app, tab)), key)  # the key right after the tab's: no pause between them
        if key in ("w", "c"):  # a warm, a clear: the plan, then the dialog that asks
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), f"{key}: no dialog")
        else:
            box = "#gpu-server-input" if key == "a" else "#gpu-filter"
            assert app.query_one(box, Input).has_class("-shown") and app.focused is app.query_one(box, Input)


async def test_help_on_a_tab_first_shown_lists_its_keys(every_layer) -> None:  # type: ignore[no-untyped-def]
    snap, settings = every_layer
    app = DltopApp(ListFeed([snap]), replace(settings, tab="pagecache"))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press(str(_tab(app, "caches")), "question_mark")
        assert isinstance(app.screen, HelpScreen)
        assert {"Open", "Back", "Clear", "Sort", "Scan"} <= {label for _key, label in help_rows(app.screen)}


async def test_a_tab_first_shown_by_a_key_or_a_click_stays_and_takes_the_focus(every_layer) -> None:  # type: ignore[no-untyped-def]
    # A number key: the GPU table had the focus; hidden while the new tab was being composed, it handed the
    # focus to a sibling (Textual's Screen._reset_focus), and TabbedContent, which follows the focus, showed the
    # GPU tab again. A new tab is composed before it is shown now.
    snap, settings = every_layer
    app = DltopApp(ListFeed([snap]), settings)
    async with app.run_test(size=(80, 24)) as pilot:
        assert app.query_one("#tabs").active == "tab-gpu" and app.focused is app.query_one("#gpu-table")
        await pilot.press(str(_tab(app, "datasets")))
        await pilot.pause(0.2)
        assert app.query_one("#tabs").active == "tab-datasets" and app.focused is app.query_one("#ds-table")
        await pilot.press(str(_tab(app, "gpu")))
        await pilot.click("#--content-tab-tab-caches")
        await pilot.pause(0.2)
        assert app.query_one("#tabs").active == "tab-caches" and app.focused is app.query_one("#cc-table")
