"""The Caches pane with real keys (Pilot) on real walks of caches made by the test, and pictured (SVG).

Update the pictures with `pytest tests/test_caches_pane.py --snapshot-update`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from textual.app import App, ComposeResult
from textual.widgets import DataTable, Static

from dltop.config import Settings
from dltop.fmt import human_bytes
from dltop.model import Snapshot
from dltop.sampler import ListFeed
from dltop.sources import caches as src
from dltop.tui.app import DltopApp
from dltop.tui.panes.caches import CachesPane
from dltop.tui.screens.confirm import ConfirmScreen
from dltop.view import View
from tests.dialogs import confirm_shown
from tests.test_caches_util import du_bytes, find_files
from tests.test_pagecache_util import needs_root
from tests.waiting import screen_of


def make_cache(root: Path, sizes: dict[str, int], mtime: float | None = None) -> Path:
    """A cache folder whose entries hold files of these sizes (bytes per entry, in files of 64 KiB)."""
    for name, size in sizes.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(max(1, size // (64 << 10))):
            f = root / name / f"k{i}.bin"
            f.write_bytes(b"\1" * min(size, 64 << 10))
            if mtime is not None:
                os.utime(f, (mtime, mtime))
    return root


def snap_of(home: Path, ts: float = 1000.0, **variables: str) -> Snapshot:
    variables.setdefault("TMPDIR", str(home.parent))  # Inductor's headers in the test's tempdir, not the node's /tmp
    e = src.environment_of({"HOME": str(home), **variables}, os.getuid(), "the test's environment", cwd="/")
    return Snapshot(ts=ts, host="test", caches=src.read_caches(e))


def _rows(app: App) -> list[str]:
    table = app.query_one("#cc-table", DataTable)
    return [str(table.get_row_at(i)[0]) for i in range(table.row_count)]


def _text(app: App, selector: str) -> str:
    return str(app.query_one(selector, Static).render())


async def _open_tab(app: DltopApp, pilot) -> None:
    tab = [p.PANE_ID for p in app.panes].index("caches") + 1
    await pilot.press(str(tab))
    await pilot.pause()
    assert app.query_one("#cc-table", DataTable).has_focus


@pytest.fixture
def ind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = make_cache(tmp_path / "ind", {"fxgraph": 256 << 10, "aotautograd": 128 << 10, "ab": 64 << 10})
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))  # dltop's own environment: the runner's clear
    return cache


async def test_the_tab_shows_the_caches_and_enter_opens_the_biggest_entries(ind: Path, tmp_path: Path) -> None:
    app = DltopApp(ListFeed([snap_of(tmp_path / "home", TORCHINDUCTOR_CACHE_DIR=str(ind))]))
    async with app.run_test(size=(80, 24)) as pilot:
        await _open_tab(app, pilot)
        rows = _rows(app)
        assert rows[0] == "TorchInductor" and "Triton" in rows
        table = app.query_one("#cc-table", DataTable)
        assert str(table.get_row_at(0)[1]) == human_bytes(du_bytes(ind)) and str(table.get_row_at(0)[2]) == str(find_files(ind))
        assert "TORCHINDUCTOR_CACHE_DIR" in _text(app, "#cc-detail") and "under /tmp" in _text(app, "#cc-detail")
        await pilot.press("enter")
        await pilot.pause()
        assert _rows(app) == ["fxgraph/", "aotautograd/", "ab/"]  # biggest first, folders as ncdu marks them
        kinds = [str(table.get_row_at(i)[5]) for i in range(3)]
        assert kinds == ["FX graph cache", "AOTAutograd cache", "generated code"]
        await pilot.press("backspace")
        await pilot.pause()
        assert _rows(app)[0] == "TorchInductor" and table.cursor_row == 0


async def test_c_clears_after_a_dialog_stating_the_bytes(ind: Path, tmp_path: Path) -> None:
    app = DltopApp(ListFeed([snap_of(tmp_path / "home", TORCHINDUCTOR_CACHE_DIR=str(ind))]))
    async with app.run_test(size=(80, 24)) as pilot:
        await _open_tab(app, pilot)
        want = du_bytes(ind) - os.lstat(ind).st_blocks * 512
        await pilot.press("c")
        dialog = await screen_of(pilot, ConfirmScreen)
        title, body, _yes = confirm_shown(dialog)
        assert title == f"Clear {human_bytes(want)}?" and f"under {ind}" in body
        await pilot.press("y")
        for _ in range(400):
            await pilot.pause(0.02)
            if app.session.action is not None and app.session.action.step == "run" and app.session.action.phase == "finished":
                break
        assert app.session.action.outcome == "ok" and app.session.action.done_bytes == want
        assert find_files(ind) == 0 and ind.is_dir()
        assert _text(app, "#cc-progress").startswith("cleared ")


async def test_an_entry_is_cleared_from_the_opened_cache(ind: Path, tmp_path: Path) -> None:
    app = DltopApp(ListFeed([snap_of(tmp_path / "home", TORCHINDUCTOR_CACHE_DIR=str(ind))]))
    async with app.run_test(size=(80, 24)) as pilot:
        await _open_tab(app, pilot)
        await pilot.press("enter", "down")  # aotautograd
        await pilot.press("c")
        dialog = await screen_of(pilot, ConfirmScreen)
        assert str(ind / "aotautograd") in confirm_shown(dialog)[1]
        await pilot.press("n")  # the safe answer: nothing happens
        await pilot.pause()
        assert (ind / "aotautograd").is_dir()


async def test_c_on_a_cache_holding_what_its_tool_never_writes_is_refused_naming_the_rule(
        ind: Path, tmp_path: Path) -> None:
    (ind / "bin").mkdir()
    (ind / "bin" / "python").write_bytes(b"#!")
    files = find_files(ind)
    app = DltopApp(ListFeed([snap_of(tmp_path / "home", TORCHINDUCTOR_CACHE_DIR=str(ind))]))
    async with app.run_test(size=(80, 24)) as pilot:
        await _open_tab(app, pilot)
        await pilot.press("c")
        dialog = await screen_of(pilot, ConfirmScreen)
        title, body, yes = confirm_shown(dialog)
        assert title == "Clear: refused" and not yes
        assert f"{ind} holds 'bin/' which TorchInductor never writes" in body
        assert app.session.action.step == "plan" and "never writes" in app.session.action.message  # the runner's event says it
    assert find_files(ind) == files


async def test_c_on_an_entry_of_a_cache_that_is_a_home_is_refused(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    home = make_cache(tmp_path / "home", {".pyenv": 128 << 10})
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(home))  # dltop's own environment: the runner's clear
    app = DltopApp(ListFeed([snap_of(home, TORCHINDUCTOR_CACHE_DIR=str(home))]))
    async with app.run_test(size=(80, 24)) as pilot:
        await _open_tab(app, pilot)
        await pilot.press("enter")  # the entries of the cache that is the home: .pyenv
        await pilot.press("c")
        dialog = await screen_of(pilot, ConfirmScreen)
        title, body, yes = confirm_shown(dialog)
        assert title == "Clear: refused" and not yes
        assert f"{home / '.pyenv'} is inside {home}, which is refused: {home} is a home folder" in body
    assert (home / ".pyenv").is_dir() and find_files(home) == 2


@pytest.mark.parametrize("how", ["read-only", "paused"])
async def test_clear_is_greyed_out_in_read_only_and_in_the_past(ind: Path, tmp_path: Path, how: str) -> None:
    # "paused": a past moment on screen, gated as a replay is (View.replay; tests/test_replay.py plays recordings)
    files = find_files(ind)
    feed = ListFeed([snap_of(tmp_path / "home", TORCHINDUCTOR_CACHE_DIR=str(ind))])
    app = DltopApp(feed, settings=Settings(read_only=how == "read-only"))
    async with app.run_test(size=(80, 24)) as pilot:
        await _open_tab(app, pilot)
        if how == "paused":
            await pilot.press("space")
            await pilot.pause()
            assert app.session.head.past
        pane = app.query_one(CachesPane)
        assert pane.check_action("clear", ()) is None
        assert not [c for c in pane.palette_commands() if "Clear" in c.title]
        await pilot.press("c")
        await pilot.pause(0.2)
        assert not isinstance(app.screen, ConfirmScreen) and find_files(ind) == files


@needs_root
async def test_a_refused_clear_has_no_yes(ind: Path, tmp_path: Path) -> None:
    os.chown(ind, 65534, 65534)
    files = find_files(ind)
    app = DltopApp(ListFeed([snap_of(tmp_path / "home", TORCHINDUCTOR_CACHE_DIR=str(ind))]))
    async with app.run_test(size=(80, 24)) as pilot:
        await _open_tab(app, pilot)
        await pilot.press("c")
        dialog = await screen_of(pilot, ConfirmScreen)
        title, body, yes = confirm_shown(dialog)
        assert title == "Clear: refused" and "owned by nobody" in body
        assert not yes
        await pilot.press("y")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen) and find_files(ind) == files  # y does nothing


# -- pictures: real walks of caches at fixed paths, with fixed file times and a fixed clock ----------------

SNAP_HOME = Path("/var/tmp/dltop-caches-picture/home")
SNAP_SHM = Path("/dev/shm/dltop-caches-picture")


@pytest.fixture
def picture_caches() -> Iterator[Snapshot]:
    if not os.path.isdir("/var/tmp") or not os.path.isdir("/dev/shm"):
        pytest.skip("needs /var/tmp and /dev/shm")
    for p in (SNAP_HOME.parent, SNAP_SHM):
        shutil.rmtree(p, ignore_errors=True)
    t = 900_000.0
    make_cache(SNAP_SHM / "ind", {"fxgraph": 3 << 20, "aotautograd": 1 << 20, "c7": 512 << 10}, t)
    make_cache(SNAP_HOME / ".triton/cache", {"QXJ2": 2 << 20, "ZK41": 1 << 20}, t - 3600)
    make_cache(SNAP_HOME / ".cache/huggingface/hub", {"models--org--tiny": 6 << 20}, t - 86400)
    try:
        yield snap_of(SNAP_HOME, ts=t + 60, TORCHINDUCTOR_CACHE_DIR=str(SNAP_SHM / "ind"))
    finally:
        for p in (SNAP_HOME.parent, SNAP_SHM):
            shutil.rmtree(p, ignore_errors=True)


class PaneApp(App[None]):
    CSS_PATH = DltopApp.CSS_PATH

    def __init__(self, snap: Snapshot) -> None:
        super().__init__()
        self.snap = snap

    def compose(self) -> ComposeResult:
        yield CachesPane(clock=lambda: self.snap.ts)

    def on_mount(self) -> None:
        self.query_one(CachesPane).show(View(snapshot=self.snap, history=(self.snap,)))


SIZES = [(80, 24), (120, 40)]


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_caches_pane_snapshot(snap_compare, picture_caches: Snapshot, size: tuple[int, int]) -> None:
    assert snap_compare(PaneApp(picture_caches), terminal_size=size)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_caches_pane_opened_snapshot(snap_compare, picture_caches: Snapshot, size: tuple[int, int]) -> None:
    async def open_first(pilot) -> None:
        pilot.app.query_one("#cc-table", DataTable).focus()
        await pilot.press("enter")

    assert snap_compare(PaneApp(picture_caches), terminal_size=size, run_before=open_first)


async def test_the_ui_does_not_wait_for_a_walk_in_progress(ind: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from dltop.sampler import Sampler
    from dltop.sources.registry import build_sources

    release = threading.Event()
    real = src.walk_cache

    def slow_walk(path, **kw):  # a walk of a huge cache on a slow disk: it takes as long as the test wants
        release.wait(30)
        return real(path, **kw)

    monkeypatch.setattr(src, "walk_cache", slow_walk)
    app = DltopApp(Sampler(build_sources(Settings(refresh_s=0.25)), builder=build_sources), Settings(refresh_s=0.25))
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await _open_tab(app, pilot)
            assert "waiting for the first reading" in _text(app, "#cc-summary")
            seen = len(app.session.history)
            await pilot.pause(1.0)
            assert len(app.session.history) > seen  # the other sources go on every 0.25 s while the walk waits
            await pilot.press("1")  # keys work
            await pilot.pause()
            assert app.query_one("#tabs").active == "tab-gpu"
            release.set()
            await _open_tab(app, pilot)
            for _ in range(200):
                await pilot.pause(0.05)
                if _rows(app) and _rows(app)[0] == "TorchInductor":
                    break
            assert str(app.query_one("#cc-table", DataTable).get_row_at(0)[1]) == human_bytes(du_bytes(ind))
            # No Snapshot in flight while the app is torn down: one handed over mid-teardown finds no header
            # (the app's feed worker outlives its screen by a moment; seen once at 0.25 s refresh).
            app.session.feed.paused = True
            await pilot.pause(0.5)
    finally:
        release.set()
