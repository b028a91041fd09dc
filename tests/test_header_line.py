"""The header's row is drawn straight from its text (HeaderLine): cell for cell what a Static draws, a text too long
for the row cut with an ellipsis instead of at a word, and what others wrote (a host name, an error) escaped."""

from __future__ import annotations

from rich.text import Text
from textual.app import App, ComposeResult
from textual.geometry import Region
from textual.strip import Strip
from textual.widgets import Static

from dltop.tui.panes.base import HeaderLine

CSS = "Static { height: 1; padding: 0 1; background: $primary-background; color: $text; }"


class _Both(App[None]):
    CSS = CSS

    def compose(self) -> ComposeResult:
        yield Static(id="static")
        yield HeaderLine(id="header")


def _cells(strip: Strip) -> list[tuple[str, object]]:
    return [(ch, seg.style) for seg in strip for ch in seg.text]


async def test_the_header_row_is_what_a_static_draws_and_a_long_one_ends_in_an_ellipsis() -> None:
    app = _Both()
    async with app.run_test(size=(60, 4)) as pilot:
        static, header = app.query_one("#static", Static), app.query_one("#header", HeaderLine)
        short = Text.assemble(("dltop", "bold"), " · node-7 · ",
                              ("PAUSED", "bold reverse"), " 14:05:13 (−2m10s)", ("  read-only", "dim"))
        static.update(short)
        header.show(short)
        await pilot.pause()
        row = Region(0, 0, 60, 1)
        assert _cells(header.render_lines(row)[0]) == _cells(static.render_lines(row)[0])
        assert str(header.render()) == short.plain  # what tests and a mouse selection read
        app.theme = "textual-light"  # another theme, the same text: drawn again in the new colours
        await pilot.pause()
        assert _cells(header.render_lines(row)[0]) == _cells(static.render_lines(row)[0])
        long = Text.assemble(("dltop", "bold"), " · node-7 · 14:05:13", ("  ⚠ gpus: slow: no answer for 12 s", "bold yellow"),
                             " and more words than the row holds")
        header.show(long)
        await pilot.pause()
        drawn = header.render_lines(row)[0]
        assert drawn.cell_length == 60
        assert drawn.text == " " + long.plain[:57] + "… "  # padding 0 1: 58 cells of text, the last an ellipsis


async def test_the_header_escapes_what_others_wrote() -> None:
    app = _Both()
    async with app.run_test(size=(60, 4)) as pilot:
        header = app.query_one("#header", HeaderLine)
        header.show(Text("dltop · \x1b]0;pwned\x1b\\\x1b[2J \u202eevil · 14:05:13"))  # (Rich drops BEL itself)
        await pilot.pause()
        drawn = header.render_lines(Region(0, 0, 60, 1))[0].text
        assert "\x1b" not in drawn and "\u202e" not in drawn
        assert "\\x1b]0;pwned\\x1b\\\\x1b[2J \\u202eevil" in drawn
