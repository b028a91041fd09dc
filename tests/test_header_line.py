"""The header is a plain Static: a text too long for the row cut with an ellipsis instead of at a word, and what
others wrote (a host name, an error) escaped."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.app import App, ComposeResult
from textual.geometry import Region
from textual.widgets import Static

import dltop.tui.app
from dltop.tui.panes.base import set_content


class _Header(App[None]):
    CSS_PATH = Path(dltop.tui.app.__file__).with_name("app.tcss")

    def compose(self) -> ComposeResult:
        yield Static(id="header")


async def test_a_long_header_ends_in_an_ellipsis() -> None:
    app = _Header()
    async with app.run_test(size=(60, 4)) as pilot:
        header = app.query_one("#header", Static)
        short = Text.assemble(("dltop", "bold"), " · node-7 · ",
                              ("PAUSED", "bold reverse"), " 14:05:13 (−2m10s)", ("  read-only", "dim"))
        set_content(header, short)
        await pilot.pause()
        row = Region(0, 0, 60, 1)
        assert header.render_lines(row)[0].text == " " + short.plain.ljust(59)
        long = Text.assemble(("dltop", "bold"), " · node-7 · 14:05:13", ("  ⚠ gpus: slow: no answer for 12 s", "bold yellow"),
                             " and more words than the row holds")
        set_content(header, long)
        await pilot.pause()
        drawn = header.render_lines(row)[0]
        assert drawn.cell_length == 60
        assert drawn.text == " " + long.plain[:57] + "… "  # padding 0 1: 58 cells of text, the last an ellipsis


async def test_the_header_escapes_what_others_wrote() -> None:
    app = _Header()
    async with app.run_test(size=(60, 4)) as pilot:
        header = app.query_one("#header", Static)
        set_content(header, Text("dltop · \x1b]0;pwned\x1b\\\x1b[2J \u202eevil · 14:05:13"))  # (Rich drops BEL itself)
        await pilot.pause()
        drawn = header.render_lines(Region(0, 0, 60, 1))[0].text
        assert "\x1b" not in drawn and "\u202e" not in drawn
        assert "\\x1b]0;pwned\\x1b\\\\x1b[2J \\u202eevil" in drawn
