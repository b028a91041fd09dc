"""One display rule for text from outside (fmt.shorten, over fmt.printable): a control character is shown as its
escape, never dropped and never a line break; a cut falls between graphemes by cell width, so a combining accent
never lands on the '…' and a wide character (CJK, emoji) is never split; the Datasets breadcrumb goes through it."""

from __future__ import annotations

import unicodedata
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from textual.widgets import DataTable

from dltop.fmt import cells, printable, shorten, shorten_end, shorten_lines, shorten_middle
from dltop.model import Snapshot
from dltop.residency.scan import scan_paths
from dltop.residency.walk import WalkOptions
from dltop.sampler import ListFeed
from dltop.tui.app import DltopApp
from dltop.tui.panes.base import crumb

NAME = "shard\nnext\x07bell-cafe\u0301-end"  # a line break, a BEL, and an e with a combining acute accent
UNSAFE = set(map(chr, [*range(0x20), *range(0x7f, 0xa0), 0x202e, 0x2028]))


def test_a_control_is_shown_as_its_escape_never_dropped_nor_a_line_break() -> None:
    path = f"/data/{NAME}"
    assert shorten_middle(path, 200) == "/data/shard\\x0anext\\x07bell-cafe\u0301-end" == printable(path)
    assert crumb(path, 0) == printable(path)  # not laid out yet: whole, escaped
    for width in range(1, 40):
        out = shorten_middle(path, width)
        assert not UNSAFE & set(out) and cells(out) <= width, (width, out)


def test_a_cut_never_leaves_a_combining_mark_on_the_ellipsis() -> None:
    text = "abcdefghijklmnop" + "e\u0301" * 20  # every cut point of the end falls next to an accent
    for width in range(2, cells(text)):
        for keep in ("middle", "end", "start"):
            out = shorten(text, width, keep)
            at = out.index("…")
            assert at + 1 == len(out) or not unicodedata.combining(out[at + 1]), (width, keep, out)
            assert cells(out) <= width and all(out[i - 1] == "e" for i, c in enumerate(out) if c == "\u0301")


def test_the_accent_at_the_cut_point_stays_on_its_letter() -> None:
    # the tail of a middle cut of width 10 takes 5 cells: "afe\u0301-x" starts at the e's letter, never at its mark
    text = "/data/folder/cafe\u0301-x"
    out = shorten_middle(text, 10)
    assert out == "/dat…afe\u0301-x" and cells(out) == 10
    assert shorten_end("cafe\u0301cafe\u0301", 5) == "cafe\u0301…"


def test_a_wide_character_is_never_split() -> None:
    cjk = "数据集/训练/分片-😀-👨\u200d👩\u200d👧-末尾"
    for width in range(1, 30):
        for keep in ("middle", "end", "start"):
            out = shorten(cjk, width, keep)
            assert cells(out) <= width
            head, _, tail = out.partition("…")
            assert cjk.startswith(head) and cjk.endswith(tail)  # whole graphemes: the family stays one
            assert "\u200d" not in out or "👨\u200d👩\u200d👧" in out
    assert shorten_end("数据集数据集", 6) == "数据…" and shorten_middle("数据集数据集", 5) == "数…集"


def test_an_escape_is_never_cut_in_two() -> None:
    text = "\x1b]52;c;x\x07" * 4
    for width in range(1, 30):
        out = shorten(text, width, "end")
        assert out == "…" or out.endswith(("\\x1b…", "\\x07…", "]…", ";…", "c…", "x…", "5…", "2…")), out
    assert shorten_lines("ab\x07cd", 4, 2) == ["ab", "…"] and shorten_lines("ab\x07cd", 5, 2) == ["ab", "\\x07…"]
    assert shorten_middle(printable("ab\x07cdefgh"), 7) == "ab…efgh"  # escaped before: still one unit


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80), st.integers(min_value=0, max_value=60), st.sampled_from(["middle", "end", "start"]))
def test_any_text_is_cut_to_its_width_escaped(text: str, width: int, keep: str) -> None:
    out = shorten(text, width, keep)
    assert cells(out) <= width and not UNSAFE & set(out)
    shown = printable(text)
    if cells(shown) <= width:
        assert out == shown
    elif width:
        head, _, tail = out.partition("…")
        assert shown.startswith(head) and shown.endswith(tail)


async def test_the_datasets_breadcrumb_at_80x24_is_one_line_with_every_escape(tmp_path: Path) -> None:
    folder = tmp_path / NAME
    folder.mkdir()
    (folder / "f.bin").write_bytes(b"x" * 8192)
    snap = Snapshot(ts=100.0, host="t", datasets=scan_paths((str(tmp_path),), WalkOptions(max_depth=4)))
    app = DltopApp(ListFeed([snap]))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press(str([p.PANE_ID for p in app.panes].index("datasets") + 1))
        await pilot.pause()
        await pilot.press("enter")  # into the dataset: its folder is a row
        await pilot.pause()
        table = app.query_one("#ds-table", DataTable)
        cell = str(table.get_row_at(0)[0])  # cut to the Path column's room: an escape whole or not at all
        assert cell.startswith("shard\\x0a") and cell.endswith("-end/") and "…" in cell, cell
        assert all(cell[i:i + 4] in ("\\x0a", "\\x07") for i, c in enumerate(cell) if c == "\\"), cell
        await pilot.press("enter")  # into the folder: its path is the breadcrumb
        await pilot.pause(0.2)
        rows = ["".join(seg.text for seg in strip) for strip in app.screen._compositor.render_strips()]
        assert not any(UNSAFE & set(r) for r in rows)
        crumb_row = next(r for r in rows if "Datasets › " in r)
        assert "shard\\x0anext\\x07bell-cafe\u0301-end" in crumb_row, crumb_row  # one line, every character shown
        assert cells(crumb_row.rstrip()) <= 80


def test_invisible_look_alike_characters_are_shown() -> None:
    """A zero-width space, a BOM, a Hangul filler or a tag character makes `data` and `da\u200bta` look alike: each
    is shown as its escape (the zero-width joiner of an emoji sequence stays), on screen and in the CLI's JSON."""
    import io
    import json

    from dltop.fmt import EscapingWriter, printable, shorten

    for ch, shown in (("\u200b", "\\u200b"), ("\ufeff", "\\ufeff"), ("\u3164", "\\u3164"), ("\u00ad", "\\xad"),
                      ("\U000e0041", "\\U000e0041")):
        assert printable(f"da{ch}ta") == f"da{shown}ta"
        assert shown in shorten(f"da{ch}ta" * 3, 12, keep="start") or len(shorten(f"da{ch}ta" * 3, 12)) <= 12
        out = io.StringIO()
        EscapingWriter(out).write(json.dumps({"name": f"da{ch}ta"}, ensure_ascii=False))
        assert ch not in out.getvalue() and json.loads(out.getvalue())["name"] == f"da{ch}ta"
    assert printable("👨\u200d👩") == "👨\u200d👩"
