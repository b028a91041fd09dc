"""What the TUI does per tick: an update that cannot change a widget's size asks for no layout pass (a reflow of
the whole screen), and one that can still does."""

from __future__ import annotations

from typing import Any

import pytest
from rich.text import Text
from textual.app import App, ComposeResult
from textual.widgets import Label, Static

from dltop.tui.panes.base import set_content


class Sized(App[None]):
    CSS = """
    #fr { height: 2fr; }
    #cells { height: 3; }
    #auto { height: auto; }
    #label { width: auto; }
    """

    def compose(self) -> ComposeResult:
        yield Static(id="fr")
        yield Static(id="cells")
        yield Static(id="auto")
        yield Label(id="label")


def _layouts(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool]]:
    """(widget id, layout asked) for every refresh from here on."""
    seen: list[tuple[str, bool]] = []
    real = Static.refresh

    def spy(self: Static, *regions: Any, repaint: bool = True, layout: bool = False,
            recompose: bool = False) -> Any:
        seen.append((self.id or "", layout))
        return real(self, *regions, repaint=repaint, layout=layout, recompose=recompose)

    monkeypatch.setattr(Static, "refresh", spy)
    return seen


async def test_an_update_of_a_widget_whose_height_is_not_its_content_asks_no_layout(
        monkeypatch: pytest.MonkeyPatch) -> None:
    app = Sized()
    async with app.run_test(size=(80, 24)) as pilot:
        for wid in ("fr", "cells"):
            set_content(app.query_one(f"#{wid}", Static), "one\ntwo")
        await pilot.pause()
        seen = _layouts(monkeypatch)
        for wid in ("fr", "cells"):
            set_content(app.query_one(f"#{wid}", Static), Text("a\nb\nc\nd\ne\nf\ng"))
        assert [layout for wid, layout in seen if wid in ("fr", "cells")] == [False, False]


async def test_an_auto_height_widget_asks_layout_only_when_its_line_count_or_wrapping_can_change(
        monkeypatch: pytest.MonkeyPatch) -> None:
    app = Sized()
    async with app.run_test(size=(80, 24)) as pilot:
        auto = app.query_one("#auto", Static)
        set_content(auto, "12 r/s\n3 w/s")
        await pilot.pause()
        seen = _layouts(monkeypatch)

        def asked(content: str | Text) -> bool:
            seen.clear()
            set_content(auto, content)
            return any(layout for wid, layout in seen if wid == "auto")

        assert not asked("13 r/s\n4 w/s")  # the same two lines: the same height
        assert asked("13 r/s\n4 w/s\nvdb")  # a third line
        await pilot.pause()
        assert asked("x" * 200)  # wraps: Textual measures it
        await pilot.pause()
        assert asked("x" * 201)  # still wraps: it may need one more line
        await pilot.pause()
        assert asked("one line")  # back from wrapping
        await pilot.pause()
        assert not asked("two line")
        # Shown as escaped ('\x1b' is four cells): measured as shown, so this wraps and asks.
        assert asked("\x1b" * 30)
        await pilot.pause()
        assert auto.size.height == 2


async def test_a_widget_as_wide_as_its_content_asks_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    app = Sized()
    async with app.run_test(size=(80, 24)) as pilot:
        label = app.query_one("#label", Label)
        set_content(label, "ab")
        await pilot.pause()
        seen = _layouts(monkeypatch)
        set_content(label, "cd")
        assert [layout for wid, layout in seen if wid == "label"] == [True]
        await pilot.pause()
        assert label.size.width == 2
