"""The CPU pane, driven with real keys (Pilot) and pictured (SVG snapshots), on the real sysfs dumps.

The snapshots mount the pane alone in a small app with dltop's stylesheet, so they change only when this pane
does (not when another pane adds a tab). Update with `pytest tests/test_cpu_pane.py --snapshot-update`.
"""

from __future__ import annotations

import pytest
from textual.app import App, ComposeResult
from textual.widgets import DataTable, Static

from dltop.model import Snapshot, Unavailable
from dltop.model.cpu import CpuPart
from dltop.sampler import ListFeed
from dltop.tui.app import DltopApp
from dltop.tui.panes.cpu import CpuPane
from dltop.view import View
from tests.test_cpu_dumps import DUMPS, dump_root, parts  # noqa: F401  (session fixtures)

pytestmark = pytest.mark.skipif(not DUMPS.is_dir(), reason=f"fixtures not found at {DUMPS}")


def _text(app: App, selector: str) -> str:
    return str(app.query_one(selector, Static).render())


async def test_cpu_tab_shows_kinds_tree_and_flags(parts) -> None:  # noqa: F811
    part = parts("arm-A510-A710-A715-X3")
    snaps = [Snapshot(ts=float(i), host="phone", cpu=c)
             for i, c in enumerate([part, part, Unavailable("permission denied")])]
    feed = ListFeed(snaps, start=0)
    feed.paused = True  # the test advances it itself: the stream's own 1 s ticks raced it on a loaded machine
    app = DltopApp(feed)
    async with app.run_test(size=(80, 24)) as pilot:
        tab = [p.PANE_ID for p in app.panes].index("cpu") + 1
        await pilot.press(str(tab))
        await pilot.pause()
        table = app.query_one("#cpu-kinds", DataTable)
        names = [str(table.get_row_at(i)[0]) for i in range(table.row_count)]
        assert names == [k.name for k in part.core_kinds]
        assert "DynamIQ" in _text(app, "#cpu-summary")
        tree = _text(app, "#cpu-tree")
        assert "Cluster" in tree and "L3" in tree and "Core (CPU 7)" in tree
        assert "sizes, ways, sets" in _text(app, "#cpu-notes")  # the no_cache_geometry flag, shown
        # the same topology again: rows stay, the cursor stays where the user put it
        await pilot.press("down", "down")
        row_before = table.cursor_row
        app.apply(feed.advance())
        await pilot.pause()
        assert table.cursor_row == row_before and table.row_count == len(part.core_kinds)
        # a failed read says why
        app.apply(feed.advance())
        await pilot.pause()
        assert "permission denied" in _text(app, "#cpu-summary")
        assert not table.display


async def test_cpu_pane_folds_a_128_core_server(parts) -> None:  # noqa: F811
    part = parts("128arm-2pa2n8cluster4co")
    app = PaneApp(part)
    async with app.run_test(size=(120, 40)):
        tree = _text(app, "#cpu-tree")
        assert "8 × Cluster" in tree and "4 × L2 512 KiB" in tree
        assert len(tree.splitlines()) < 30
        notes = _text(app, "#cpu-notes")
        assert "128 B" in notes  # the L3's 128-byte line: what to pad to against false sharing
        assert "128 ways" in notes  # the geometry flag


class PaneApp(App[None]):
    """The CPU pane alone, with dltop's stylesheet, showing one Snapshot."""

    CSS_PATH = DltopApp.CSS_PATH

    def __init__(self, part: CpuPart) -> None:
        super().__init__()
        self.snap = Snapshot(ts=0.0, host="fixture", cpu=part)

    def compose(self) -> ComposeResult:
        yield CpuPane()

    def on_mount(self) -> None:
        self.query_one(CpuPane).show(View(snapshot=self.snap, history=(self.snap,)))


SIZES = [(80, 24), (120, 40)]


@pytest.mark.parametrize("name", ["arm-A510-A710-A715-X3", "128arm-2pa2n8cluster4co"])
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_cpu_pane_snapshot(snap_compare, parts, name: str, size: tuple[int, int]) -> None:  # noqa: F811
    assert snap_compare(PaneApp(parts(name)), terminal_size=size)
