"""`Lines` (tui/panes/base.py): a Static that repaints only its changed lines draws exactly what a Static draws."""

from __future__ import annotations

from rich.segment import Segment
from textual.app import App, ComposeResult
from textual.content import Content
from textual.geometry import Region
from textual.widgets import Static

from dltop.config import Settings
from dltop.model import Snapshot
from dltop.sampler import ListFeed
from dltop.tui.app import DltopApp
from dltop.tui.panes.base import Lines, set_content


class Pair(App[None]):
    CSS = "Static { width: 30; height: 6; }"

    def compose(self) -> ComposeResult:
        yield Static(id="plain")
        yield Lines(id="lines")


def _drawn(widget: Static) -> list[list[Segment]]:
    return [list(strip) for strip in widget.render_lines(Region(0, 0, widget.size.width, widget.size.height))]


def _bar(n: int) -> Content:
    return Content.assemble(("Dirty", "bold"), f" {n:>4} ", ("▁▂▃▅▇"[: 1 + n % 5], "red"))


# One line changes, then none, its style only, the count of lines, a line too wide (it wraps), back to fitting.
STEPS = [
    [Content("Total 23.5 GiB"), _bar(1), Content("axis"), Content("")],
    [Content("Total 23.5 GiB"), _bar(2), Content("axis"), Content("")],
    [Content("Total 23.5 GiB"), _bar(2), Content("axis"), Content("")],
    [Content("Total 23.5 GiB"), _bar(2), Content.styled("axis", "italic"), Content("")],
    [Content("Total 23.5 GiB"), _bar(3), Content("axis")],
    [Content("x" * 45), _bar(4), Content("axis")],
    [Content("Total 23.4 GiB"), _bar(4), Content("axis")],
    [Content("Total 23.4 GiB"), _bar(5), Content("axis")],
]


async def test_lines_draw_what_a_static_draws_and_keep_unchanged_lines() -> None:
    app = Pair()
    async with app.run_test(size=(40, 14)) as pilot:
        plain, lines = app.query_one("#plain", Static), app.query_one("#lines", Lines)
        before: dict[int, object] = {}
        for i, step in enumerate(STEPS):
            content = Content("\n").join(step)
            set_content(plain, content)
            set_content(lines, content)
            await pilot.pause()
            assert _drawn(lines) == _drawn(plain), f"step {i}"
            assert str(lines.render()) == str(plain.render())
            kept = dict(lines._strips)
            if i in (1, 7):  # only the bar's line changed: the other lines' strips are the very same objects
                assert set(kept) == set(before)
                changed = [y for y in kept if kept[y] is not before[y]]
                assert changed == [1]
            before = kept


async def test_the_page_cache_pane_after_ticks_is_the_pane_drawn_afresh(session: list[Snapshot]) -> None:
    # Each tick repaints only the changed lines; after 15 ticks the screen is what a full repaint of every
    # widget draws (no line left over from an earlier tick).
    app = DltopApp(ListFeed(session[:5], start=4), Settings(tab="pagecache"))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        for snap in session[5:20]:
            app.apply(snap)
            await pilot.pause()
        ticked = app.export_screenshot()
        for widget in app.query(Lines):
            widget.refresh()
        await pilot.pause()
        assert app.export_screenshot() == ticked
        assert any(widget._strips for widget in app.query(Lines))
