"""The Datasets pane with real keys (Pilot) on real scans of real trees, and pictured (SVG snapshots).

Update the pictures with `pytest tests/test_datasets_pane.py --snapshot-update`.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import pytest
from textual.app import App, ComposeResult
from textual.widgets import DataTable, Input, Static

from dltop.config import Settings
from dltop.fmt import human_age
from dltop.model import Snapshot
from dltop.model.datasets import DatasetResidency, DatasetsPart, ResidencyNode
from dltop.residency.scan import scan_paths
from dltop.residency.walk import WalkOptions
from dltop.sampler import ListFeed, Sampler
from dltop.sources.registry import build_sources
from dltop.tui.app import DltopApp
from dltop.tui.panes.datasets import DatasetPane
from dltop.tui.screens.confirm import ConfirmScreen
from dltop.view import View
from tests.test_pagecache_util import (
    PS,
    SHADOW_SLACK,
    ddir_fixture,  # noqa: F401  (the `ddir` fixture)
    evict_file,
    make_file,
    read_file,
    reclaimed_pages,
    resident,
)
from tests.waiting import screen_of
from tests.waiting import until as until_


def make_dataset(root: Path) -> list[Path]:
    files = [make_file(root / "train" / f"t{i}.bin", 64 * PS) for i in range(6)]
    files += [make_file(root / "val" / f"v{i}.bin", 32 * PS) for i in range(2)]
    read_file(files[-1])
    return files


def snap_of(*paths: Path, ts: float = 100.0) -> Snapshot:
    return Snapshot(ts=ts, host="test", datasets=scan_paths(tuple(map(str, paths)), WalkOptions(max_depth=6)))


def _text(app: App, selector: str) -> str:
    return str(app.query_one(selector, Static).render())


def _rows(app: App) -> list[str]:
    table = app.query_one("#ds-table", DataTable)
    return [str(table.get_row_at(i)[0]) for i in range(table.row_count)]


async def _open_tab(app: DltopApp, pilot) -> None:
    tab = [p.PANE_ID for p in app.panes].index("datasets") + 1
    await pilot.press(str(tab))
    await pilot.pause()
    # The tab's number key alone hands the keyboard to the table: w/e/l work and show in the footer.
    assert app.query_one("#ds-table", DataTable).has_focus


async def _wait_confirm(app: App, pilot) -> ConfirmScreen:
    """The warm dialog comes once a fresh measurement (in a worker thread) says how much a warm reads."""
    return await screen_of(pilot, ConfirmScreen)


def live(*paths: Path, rescan_s: float | None = None, **kw) -> DltopApp:
    """The app on the real Sampler watching `paths`, as `dltop PATH...` starts it; `rescan_s` stretches the
    background rescan (so a fresh number can only come from the rescan asked for after an action)."""
    # Discovery off unless asked: other users' training jobs on a shared node would add found rows.
    settings = Settings(datasets=tuple(map(str, paths)), **{"discover": False, **kw})
    sources = [dataclasses.replace(s, interval_s=rescan_s) if rescan_s and s.name == "datasets" else s
               for s in build_sources(settings)]
    return DltopApp(Sampler(sources, builder=build_sources), settings)


async def _wait_idle(app: DltopApp, pilot, until=lambda: True) -> None:
    """Until the action and its plan are done and `until()` holds (the rescan after it is in)."""
    await until_(pilot, lambda: app.session.idle and until(), "the action's end")


def _cell(app: App, row: int, col: int) -> str:
    return str(app.query_one("#ds-table", DataTable).get_row_at(row)[col])


async def test_drill_down_and_back(ddir: Path) -> None:
    make_dataset(ddir)
    app = DltopApp(ListFeed([snap_of(ddir)]))
    async with app.run_test(size=(100, 30)) as pilot:
        await _open_tab(app, pilot)
        assert _rows(app) == [str(ddir)]
        summary = _text(app, "#ds-summary")
        assert "1 watched" in summary and "128 KiB of 1.8 MiB resident" in summary
        await pilot.press("enter")
        await pilot.pause()
        assert _rows(app) == ["train/", "val/"]
        table = app.query_one("#ds-table", DataTable)
        assert _cell(app, 1, 3) == "50%" and _cell(app, 0, 3) == "0%"
        # and drawn whole: the columns narrowed to the folders' names are rebuilt, and the lines DataTable drew
        # before measuring the new rows are not kept ("val/" as "val", "50%" as "50")
        await pilot.pause()
        assert table.render_line(2).text.split()[:6] == ["val/", *_cell(app, 1, 1).split(), *_cell(app, 1, 2).split(),
                                                         "50%"]
        await pilot.press("down", "enter")
        await pilot.pause()
        assert "val" in _text(app, "#ds-summary") and "no folders below" in _text(app, "#ds-summary")
        await pilot.press("backspace")
        await pilot.pause()
        assert _rows(app) == ["train/", "val/"] and table.cursor_row == 1  # back on the folder we left
        await pilot.press("backspace")
        await pilot.pause()
        assert _rows(app) == [str(ddir)]


async def test_warm_confirms_with_guard_then_warms_and_shows_result(ddir: Path) -> None:
    files = make_dataset(ddir)
    app = live(ddir, rescan_s=3600.0)  # no background rescan during the test: every new number is asked for
    async with app.run_test(size=(100, 30)) as pilot:
        await _open_tab(app, pilot)
        await _wait_idle(app, pilot, lambda: _cell(app, 0, 3) == "7%")  # the first scan is in
        await pilot.press("w")
        screen = await _wait_confirm(app, pilot)
        body = str(screen.query_one("#confirm-body", Static).render())
        assert "1.6 MiB" in body and "Memory guard: ok" in body
        await pilot.press("n")  # no: nothing happens
        await pilot.pause()
        assert sum(resident(f) for f in files) == 32
        await pilot.press("w")
        await _wait_confirm(app, pilot)
        await pilot.press("y")
        # rescanned at once after the warm, without waiting for the next background scan (an hour away)
        await _wait_idle(app, pilot, lambda: _cell(app, 0, 3) == "100%")
        assert all(resident(f) == f.stat().st_size // PS for f in files)
        assert "warmed 1.6 MiB" in _text(app, "#ds-progress")  # what it read, as the dialog said (128 KiB was in)
        # evict, also confirmed
        await pilot.press("e")
        screen = await _wait_confirm(app, pilot)
        assert "Drop 1.8 MiB" in str(screen.query_one("#confirm-body", Static).render())
        await pilot.press("y")
        await _wait_idle(app, pilot, lambda: _cell(app, 0, 3) == "0%")
        assert sum(resident(f) for f in files) == 0
        # lock, then unlock with the same key
        await pilot.press("enter")  # into the dataset: act on the val folder only
        await pilot.pause()
        await pilot.press("down", "l")
        await _wait_confirm(app, pilot)
        await pilot.press("y")
        await _wait_idle(app, pilot, lambda: bool(app.session.runner.held()))
        assert [resident(f) for f in files[-2:]] == [32, 32] and resident(files[0]) == 0
        assert [k for k in app.session.runner.held() if k.endswith("/val")]
        assert "🔒" in _cell(app, 1, 0)
        assert "locked" in _text(app, "#ds-progress")
        await pilot.press("l")
        await pilot.pause()
        assert app.session.runner.held() == {} and "🔒" not in _cell(app, 1, 0)
        assert _text(app, "#ds-progress").startswith("unlocked 256 KiB")  # not "locked" any more


async def test_names_with_brackets_are_shown_as_they_are_and_crash_nothing(ddir: Path) -> None:
    # Rich markup in a path: "a[/b]" (a folder "a[" holding "b]") is a closing tag that matches nothing, which a
    # DataTable cell, a dialog or a notification given the str raised MarkupError on, taking the TUI down; "[red]x"
    # showed as a red "x". Every one of them now shows the name as it is.
    root = ddir / "a[" / "b]"
    make_file(root / "[red]x" / "f.bin", 8 * PS)
    app = live(root, rescan_s=3600.0)
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await _open_tab(app, pilot)
        await _wait_idle(app, pilot, lambda: _rows(app) == [str(root)] and _cell(app, 0, 6) != "scanning")
        assert _cell(app, 0, 0) == str(root)
        assert str(root) in app.export_screenshot().replace("&#160;", " ")  # drawn as it is, brackets and all
        await pilot.press("enter")
        await _wait_idle(app, pilot, lambda: _rows(app) == ["[red]x/"])
        await pilot.pause()
        assert "[red]x/" in app.export_screenshot().replace("&#160;", " ")
        await pilot.press("backspace", "w")
        screen = await _wait_confirm(app, pilot)
        assert str(root) in str(screen.query_one("#confirm-body", Static).render())
        await pilot.press("n")
        await pilot.pause()
        await pilot.press("x")  # unwatch: the notification names the path
        await pilot.pause()
        assert any(s.text == f"no longer watching {root}" for s in app.session.said)
        await pilot.pause()
        assert app.is_running


async def test_warm_dialog_states_the_data_of_a_sparse_file_not_its_size(ddir: Path) -> None:
    f = ddir / "sparse.bin"
    with open(f, "wb") as fh:
        fh.truncate(10 << 30)
        fh.write(os.urandom(26 << 20))
        fh.flush()
        os.fsync(fh.fileno())
    evict_file(f)
    if f.stat().st_blocks * 512 >= 10 << 30:
        pytest.skip("filesystem without sparse files")
    app = DltopApp(ListFeed([snap_of(ddir)]))
    async with app.run_test(size=(100, 30)) as pilot:
        await _open_tab(app, pilot)
        await pilot.press("w")
        screen = await _wait_confirm(app, pilot)
        assert str(screen.query_one("#confirm-title", Static).render()) == "Warm 26.0 MiB?"
        assert "Read 26.0 MiB" in str(screen.query_one("#confirm-body", Static).render())
        assert screen.focused is screen.query_one("#confirm-no")  # the safe answer: Enter by accident says no
        await pilot.press("enter")
        await pilot.pause()
        assert app.screen is not screen
    assert resident(f) == 0


async def test_lock_dialog_guards_every_byte_it_locks(ddir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dltop.actions import pagecache as pc
    from dltop.model.memory import safety_margin_bytes

    files = [make_file(ddir / f"l{i}.bin", 64 * PS) for i in range(2)]
    for f in files:
        read_file(f)  # all resident: locking still takes 512 KiB out of MemAvailable
    margin = safety_margin_bytes(64 << 30)
    monkeypatch.setattr(pc, "read_meminfo", lambda *a: {"MemTotal": 64 << 30, "MemAvailable": margin + 256 * 1024})
    app = DltopApp(ListFeed([snap_of(ddir)]))
    async with app.run_test(size=(100, 30)) as pilot:
        await _open_tab(app, pilot)
        await pilot.press("l")
        screen = await _wait_confirm(app, pilot)
        body = str(screen.query_one("#confirm-body", Static).render())
        assert "Memory guard: refused: 512 KiB" in body
        # A refusal is not one key away: there is no yes, neither button nor y.
        assert not screen.query("#confirm-yes")
        await pilot.press("y")
        await pilot.pause()
        assert app.session.runner.busy is None and app.session.runner.held() == {}
        assert isinstance(app.screen, ConfirmScreen)  # y did not lock; the dialog stays until n / Esc
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen)


async def test_esc_cancels_a_running_warm(ddir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dltop.actions import pagecache as pc

    files = [make_file(ddir / f"f{i}.bin", 256 * PS) for i in range(40)]
    monkeypatch.setattr(pc, "WARM_INFLIGHT_BYTES", 256 * PS)
    started = []
    real = pc.Ticker.add

    def slow_add(self, n: int, path: str = "", force: bool = False) -> None:
        real(self, n, path, force)
        if not started:
            started.append(1)
        import time

        time.sleep(0.1)  # 4 s in all: the cancel lands long before the end, even on a loaded machine

    monkeypatch.setattr(pc.Ticker, "add", slow_add)
    app = DltopApp(ListFeed([snap_of(ddir)]))
    async with app.run_test(size=(100, 30)) as pilot:
        await _open_tab(app, pilot)
        await pilot.press("w")
        await _wait_confirm(app, pilot)
        await pilot.press("y")
        for _ in range(100):
            await pilot.pause(0.02)
            if started:
                break
        await pilot.press("escape")
        await _wait_idle(app, pilot)
        assert "(cancelled)" in _text(app, "#ds-progress")
    assert sum(resident(f) for f in files) < 40 * 256


async def test_read_only_disables_the_actions(ddir: Path) -> None:
    files = make_dataset(ddir)
    app = DltopApp(ListFeed([snap_of(ddir)]), settings=Settings(read_only=True))
    async with app.run_test(size=(100, 30)) as pilot:
        await _open_tab(app, pilot)
        pane = app.query_one(DatasetPane)
        for action in ("warm", "evict", "lock"):
            assert pane.check_action(action, ()) is None
        before, shadows = sum(resident(f) for f in files), reclaimed_pages(files)
        await pilot.press("w", "e", "l")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen)
        # Nothing warmed, nothing evicted: what left the page cache meanwhile is what reclaim took (DAMON's
        # proactive pageout on these VMs), which leaves shadow entries; an evict (DONTNEED) leaves none.
        after = sum(resident(f) for f in files)
        assert 0 < before <= 32  # the one file read (less what reclaim took already)
        assert before - (reclaimed_pages(files) - shadows) - SHADOW_SLACK <= after <= before


async def test_add_a_dataset_from_the_tui(ddir: Path) -> None:
    make_dataset(ddir / "one")
    make_file(ddir / "two" / "x.bin", 8 * PS)
    app = live(ddir / "one")
    async with app.run_test(size=(100, 30)) as pilot:
        await _open_tab(app, pilot)
        await pilot.press("a")
        await pilot.pause()
        box = app.query_one("#ds-add", Input)
        assert box.has_focus
        box.value = str(ddir / "two")
        await pilot.press("enter")
        # The Sampler scans it like any other watched dataset: in the Snapshot, not in the pane's own state.
        await _wait_idle(app, pilot, lambda: len(_rows(app)) == 2 and _cell(app, 1, 1) == "32.0 KiB")
        assert _rows(app) == [str(ddir / "one"), str(ddir / "two")]
        snap = app.session.feed.snapshot()
        assert isinstance(snap.datasets, DatasetsPart)
        assert [d.path for d in snap.datasets.paths] == [str(ddir / "one"), str(ddir / "two")]
        await pilot.press("a")
        app.query_one("#ds-add", Input).value = str(ddir / "missing")
        await pilot.press("enter")
        await pilot.pause()
        assert len(_rows(app)) == 2
        # x stops watching the selected dataset; its files are left alone.
        app.query_one("#ds-table", DataTable).move_cursor(row=1)
        await pilot.press("x")
        await _wait_idle(app, pilot, lambda: _rows(app) == [str(ddir / "one")])
        assert (ddir / "two" / "x.bin").exists() and app.session.settings.datasets == (str(ddir / "one"),)


async def test_dataset_deleted_while_watched_is_an_unavailable_row_not_zeros(ddir: Path) -> None:
    make_dataset(ddir / "one")
    make_dataset(ddir / "two")
    before = snap_of(ddir / "one", ddir / "two", ts=100.0)
    shutil.rmtree(ddir / "two")
    after = snap_of(ddir / "one", ddir / "two", ts=110.0)
    app = DltopApp(ListFeed([before, after], start=1))
    async with app.run_test(size=(100, 30)) as pilot:
        await _open_tab(app, pilot)
        table = app.query_one("#ds-table", DataTable)
        assert _rows(app) == [str(ddir / "one"), str(ddir / "two")]
        assert [str(c) for c in table.get_row_at(1)[1:6]] == ["n/a"] * 5
        summary = _text(app, "#ds-summary")
        # The total is the dataset that is there: 1.8 MiB, not 1.8 MiB plus a "0 B" dataset, nor 3.6 MiB.
        assert "2 watched, 1 unavailable" in summary and "128 KiB of 1.8 MiB resident" in summary
        assert f"unavailable: no such file or directory: {ddir / 'two'}" in _text(app, "#ds-notes")
        await pilot.press("down", "w")  # nothing to warm: says why, opens no dialog
        await pilot.pause(0.2)
        assert not isinstance(app.screen, ConfirmScreen)
        assert any("unavailable: no such file or directory" in s.text for s in app.session.said)


async def test_unknown_pages_are_marked_and_explained(ddir: Path) -> None:
    make_dataset(ddir)
    part = scan_paths((str(ddir),))
    ds = part.paths[0]
    from dltop.model.datasets import NO_PERMISSION

    hidden = dataclasses.replace(ds, unknown_pages=64, resident_pages=0, data_unknown_pages=64, data_resident_pages=0,
                                 unknown_reason=NO_PERMISSION)
    app = DltopApp(ListFeed([Snapshot(ts=1.0, host="t", datasets=DatasetsPart((hidden,)))]))
    async with app.run_test(size=(100, 30)) as pilot:
        await _open_tab(app, pilot)
        assert _cell(app, 0, 3) == "0%?"
        assert "unknown: no permission" in _text(app, "#ds-notes") and "owner or as root" in _text(app, "#ds-notes")


# -- pictures: a fixed, made-up-free model built from a real scan's shape, with fixed times -------------------


def fixed_part() -> DatasetsPart:
    """Numbers of a real 9-file dataset scanned as above (its one file at the top listed), with fixed paths and
    times so the picture is stable."""
    ps = 4096
    train = ResidencyNode(path="/data/imagenet/train", files=6, size_bytes=6 * 64 * ps, pages=6 * 64,
                          resident_pages=96, dirty_pages=0)
    val = ResidencyNode(path="/data/imagenet/val", files=2, size_bytes=2 * 32 * ps, pages=64, resident_pages=64)
    labels = ResidencyNode(path="/data/imagenet/labels.csv", files=1, size_bytes=5000, pages=2, resident_pages=2)
    ds = DatasetResidency(path="/data/imagenet", files=9, size_bytes=train.size_bytes + val.size_bytes + 5000,
                          pages=450, resident_pages=162, children=(train, val), scanned_at=95.0,
                          scan_duration_s=0.01, method="cachestat", fs_type="ext4", dirs=3, top_files=(labels,),
                          files_top=50, files_sorted_by=("size", "resident", "pct"))
    coco = DatasetResidency(path="/data/coco", files=3, size_bytes=3 << 20, pages=768, resident_pages=0,
                            unknown_pages=256, unknown_reason="no permission: run as the owner",
                            scanned_at=90.0, scan_duration_s=0.02, fs_type="overlayfs", method="mincore")
    return DatasetsPart(paths=(ds, coco))


class PaneApp(App[None]):
    CSS_PATH = DltopApp.CSS_PATH

    def compose(self) -> ComposeResult:
        yield DatasetPane(clock=lambda: 100.0)

    def on_mount(self) -> None:
        snap = Snapshot(ts=100.0, host="fixture", datasets=fixed_part())
        self.query_one(DatasetPane).show(View(snapshot=snap, history=(snap,)))


SIZES = [(80, 24), (120, 40)]


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_datasets_pane_snapshot(snap_compare, size: tuple[int, int]) -> None:
    assert snap_compare(PaneApp(), terminal_size=size)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_datasets_pane_drilled_snapshot(snap_compare, size: tuple[int, int]) -> None:
    async def drill(pilot) -> None:
        pilot.app.query_one("#ds-table", DataTable).focus()
        await pilot.press("enter")

    assert snap_compare(PaneApp(), terminal_size=size, run_before=drill)


async def test_end_and_home_reach_the_last_and_first_row(ddir: Path) -> None:
    for name in ("a", "b", "c", "d"):
        make_file(ddir / name / "f.bin", PS)
    app = DltopApp(ListFeed([snap_of(ddir)]))
    async with app.run_test(size=(80, 24)) as pilot:
        await _open_tab(app, pilot)
        await pilot.press("enter", "end")
        table = app.query_one("#ds-table", DataTable)
        assert _rows(app) == ["a/", "b/", "c/", "d/"] and table.cursor_row == 3
        await pilot.press("home")
        assert table.cursor_row == 0


async def test_a_dataset_whose_first_scan_is_not_in_is_counted_and_enter_says_so(ddir: Path) -> None:
    # Watched, but the Sampler's first scan of it has not come in: it is one of the watched (not "none yet"),
    # its row says scanning, and Enter says why it does not open yet rather than doing nothing.
    make_dataset(ddir)
    app = DltopApp(ListFeed([Snapshot(ts=100.0, host="test", datasets=DatasetsPart(paths=()))]),
                   Settings(datasets=(str(ddir),)))
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await _open_tab(app, pilot)
        summary = _text(app, "#ds-summary")
        assert "1 watched" in summary and "first scan running" in summary and "none yet" not in summary
        assert _rows(app) == [str(ddir)] and _cell(app, 0, 6) == "scanning"
        await pilot.press("enter")
        await pilot.pause()
        assert _rows(app) == [str(ddir)]
        assert [s.text for s in app.session.said] == [
            f"{ddir}: its first scan is not in yet; Enter opens it once it is"]


async def test_a_folder_deleted_while_drilled_into_does_not_strand_backspace(ddir: Path) -> None:
    import shutil

    make_dataset(ddir)
    app = live(ddir)
    async with app.run_test(size=(100, 30)) as pilot:
        await _open_tab(app, pilot)
        # The first scan in (not the "scanning" row of a dataset still pending, which Enter cannot open yet)
        await _wait_idle(app, pilot, lambda: _rows(app) == [str(ddir)] and _cell(app, 0, 6) != "scanning")
        await pilot.press("enter")
        await _wait_idle(app, pilot, lambda: "val/" in _rows(app))  # a loaded machine: wait, don't race the keys
        table = app.query_one("#ds-table", DataTable)
        table.focus()
        table.move_cursor(row=_rows(app).index("val/"))
        await pilot.press("enter")  # into val/
        await _wait_idle(app, pilot, lambda: "val" in _text(app, "#ds-summary"))
        shutil.rmtree(ddir / "val")
        app.session.feed.read_now("datasets")
        await _wait_idle(app, pilot, lambda: _rows(app) == ["train/"])  # standing on the dataset again
        await pilot.press("backspace")  # one Backspace: back to the list, not a no-op on a ghost folder
        await pilot.pause()
        assert _rows(app) == [str(ddir)]


async def test_a_long_path_gives_way_so_every_column_fits_80_columns(ddir: Path) -> None:
    deep = ddir / "some" / "rather" / "long" / "path" / "to" / "a" / "dataset" / "folder" / "imagenet-subset"
    make_file(deep / "x.bin", 8 * PS)
    app = DltopApp(ListFeed([snap_of(deep)]))
    async with app.run_test(size=(80, 24)) as pilot:
        await _open_tab(app, pilot)
        await pilot.pause(0.2)
        app.apply(snap_of(deep, ts=101.0))  # the next tick, with the table laid out
        await pilot.pause()
        table = app.query_one("#ds-table", DataTable)
        label = _cell(app, 0, 0)
        assert "…" in label and label.endswith("imagenet-subset")
        assert table.virtual_size.width <= table.size.width  # Age, the last column, is on screen
        await pilot.resize_terminal(140, 30)
        app.apply(snap_of(deep, ts=102.0))
        await pilot.pause()
        assert _cell(app, 0, 0) == str(deep)  # room for all of it: the whole path
        await pilot.resize_terminal(80, 24)
        app.apply(snap_of(deep, ts=103.0))
        await pilot.pause()
        assert table.virtual_size.width <= table.size.width  # and the column shrinks back


class TickApp(App[None]):
    """The pane on a clock the test moves, fed the same Snapshot tick after tick."""

    CSS_PATH = DltopApp.CSS_PATH

    def __init__(self) -> None:
        super().__init__()
        self.now = 100.0

    def compose(self) -> ComposeResult:
        yield DatasetPane(clock=lambda: self.now)

    def tick(self, now: float) -> None:
        self.now = now
        snap = Snapshot(ts=now, host="fixture", datasets=fixed_part())
        self.query_one(DatasetPane).show(View(snapshot=snap, history=(snap,)))


async def test_a_tick_that_changes_no_text_touches_no_row_and_the_ages_stay_true() -> None:
    # The Age column in whole seconds changed every tick, and one changed cell re-renders every row of the table
    # (DataTable keys its render caches by a count of updates): a watched dataset's rows were drawn every second.
    app = TickApp()
    async with app.run_test(size=(80, 24)) as pilot:
        app.tick(100.0)
        await pilot.pause()
        table = app.query_one("#ds-table", DataTable)
        calls: list[tuple[object, ...]] = []
        update_cell = table.update_cell
        table.update_cell = lambda *a, **kw: (calls.append(a), update_cell(*a, **kw))[1]  # type: ignore[method-assign]
        ages = {"/data/imagenet": 95.0, "/data/coco": 90.0}  # the scans' scanned_at in fixed_part()
        for now in (101.0, 102.0, 103.0):  # the same Snapshot, a second later each time
            before = table._update_count  # DataTable's count of changes: every add, remove, clear or update_cell
            app.tick(now)
            await pilot.pause()
            assert (calls, table._update_count) == ([], before)
        for now in (104.0, 105.5, 150.0, 200.0, 4000.0):  # what is shown stays what the model says
            app.tick(now)
            await pilot.pause()
            shown = {str(table.get_row_at(i)[0]): str(table.get_row_at(i)[6]) for i in range(table.row_count)}
            assert shown == {p: human_age(now - at) for p, at in ages.items()}


async def test_found_datasets_and_estimates_are_shown_as_such() -> None:
    from dltop.model.datasets import FoundDataset, FoundReader

    base = fixed_part()
    imagenet = dataclasses.replace(base.paths[0], estimated=True, estimate_error_pages=16, full_scan_at=50.0)
    c4 = dataclasses.replace(base.paths[0], path="/scratch/c4", children=(), top_files=(), complete=False)
    reader = FoundReader(4242, 1001, "alice", "", "/usr/bin/python3 train.py --lr 1e-3", 64, True)
    part = DatasetsPart(paths=(imagenet,), found=(FoundDataset("/scratch/c4", (reader,), 90.0, c4),))

    class Found(App[None]):
        CSS_PATH = DltopApp.CSS_PATH

        def compose(self) -> ComposeResult:
            yield DatasetPane(clock=lambda: 100.0)

        def on_mount(self) -> None:
            snap = Snapshot(ts=100.0, host="fixture", datasets=part)
            self.query_one(DatasetPane).show(View(snapshot=snap, history=(snap,), watched=("/data/imagenet",)))

    app = Found()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert _rows(app) == ["/data/imagenet", "found: read by training jobs", "/scratch/c4"]
        assert "1 watched, 1 found" in _text(app, "#ds-summary")
        assert _cell(app, 2, 1).startswith("≥") and _cell(app, 2, 5) == "≥9"  # a scan cut at its budget
        app.query_one("#ds-table", DataTable).move_cursor(row=2)
        await pilot.pause()
        assert "found: read by train.py (pid 4242) of alice, 64 files open, named by its probe" in _text(
            app, "#ds-notes")
        await pilot.press("a")  # watch it: its folder typed in already
        assert app.query_one("#ds-add", Input).value == "/scratch/c4"
        await pilot.press("escape")
        app.query_one("#ds-table", DataTable).move_cursor(row=0)
        await pilot.press("enter")  # a watched dataset whose counts are an estimate: its folders' too
        await pilot.pause()
        assert [_cell(app, i, 3)[:1] for i in range(2)] == ["~", "~"]
