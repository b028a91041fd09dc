"""Formatting helpers: units people read, and the one-line sparkline."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dltop.fmt import (
    SPARK_CHARS,
    human_age,
    human_bytes,
    human_duration,
    human_range,
    percent,
    percent_text,
    plural,
    sparkline,
)

GIB = 2**30


def test_human_bytes_uses_binary_units() -> None:
    assert human_bytes(0) == "0 B"
    assert human_bytes(1536) == "1.5 KiB"
    assert human_bytes(25276502016) == "23.5 GiB"
    assert human_bytes(None) == "n/a"
    assert human_bytes(200 * 2**30) == "200 GiB"


def test_durations_and_percent() -> None:
    assert human_duration(59) == "59s"
    assert human_duration(3 * 86400 + 4 * 3600 + 5) == "3d04h"
    assert percent(5, 100) == "5.0%" and percent(50, 100) == "50%" and percent(1, 0) == "n/a"


def test_ages_are_floored_to_a_unit_that_suits_their_size() -> None:
    cases = {0: "<10s", 9.9: "<10s", 10: "10s", 59.9: "50s", 60: "1m", 179: "2m", 3599: "59m", 3600: "1h",
             86399: "23h", 86400: "1d", 10 * 86400 + 5: "10d", -3: "<10s"}
    assert {s: human_age(s) for s in cases} == cases and human_age(None) == "n/a"
    # Shown every second, an age of minutes changes once a minute: 2 hours of ticks, 6 + 59 + 2 texts.
    assert len({human_age(s) for s in range(2 * 3600 + 1)}) == 6 + 59 + 2


def test_percent_is_100_only_when_complete_and_0_only_when_nothing() -> None:
    # fincore's 99.78% of a dataset was shown as 100%: rounding must not claim what is not so.
    assert percent_text(99.78) == "99.8%" and percent_text(99.78, 1) == "99.8%"
    assert percent_text(99.96, 1) == "99.96%" and percent_text(99.9999) == ">99.99%"
    assert percent_text(100.0) == "100%" and percent_text(0.0) == "0%" and percent_text(0.04) == "0.04%"
    assert percent(997, 1000) == "99.7%" and percent(9996, 10000) == "99.96%" and percent(1, 10**6) == "<0.01%"
    assert percent_text(float("nan")) == "n/a"


@settings(max_examples=300, derandomize=True)  # 300 inputs
@given(st.floats(min_value=0, max_value=100), st.integers(min_value=0, max_value=2))
def test_percent_text_never_rounds_to_an_end_it_has_not_reached(p: float, decimals: int) -> None:
    text = percent_text(p, decimals)
    shown = text.lstrip("<>").rstrip("%")
    assert (float(shown) == 100 and not text.startswith(">")) == (p == 100), (p, text)
    assert (float(shown) == 0 and not text.startswith("<")) == (p == 0), (p, text)
    assert abs(float(shown) - p) <= 0.5 or text[0] in "<>"


def test_plural_counts_one_and_many() -> None:
    assert (plural(1, "file"), plural(0, "file"), plural(2, "file")) == ("1 file", "0 files", "2 files")
    assert plural(1, "entry", "entries") == "1 entry" and plural(3, "entry", "entries") == "3 entries"


def test_sparkline_scales_from_zero_and_merges_by_max() -> None:
    assert sparkline([0, 4, 8], 3) == "▁▅█"
    assert sparkline([1, 1], 4) == "  ██"  # right-aligned: the newest value is at the right edge
    # 6 values into 3 columns: each column shows the larger of its pair, so a spike is never averaged away
    assert sparkline([0, 8, 0, 0, 0, 4], 3) == "█▁▅"
    assert sparkline([], 2) == "  " and sparkline([0, 0], 2) == "▁▁"


@given(st.lists(st.floats(0, 1e15), max_size=700), st.integers(1, 200))
def test_sparkline_always_fills_its_width(values: list[float], width: int) -> None:
    line = sparkline(values, width)
    assert len(line) == width
    assert set(line) <= set(SPARK_CHARS) | {" "}
    if values and max(values) > 0:
        assert "█" in line


@given(st.text(alphabet=st.characters(blacklist_characters="…"), max_size=200), st.integers(min_value=0, max_value=120))
def test_shorten_middle_fits_and_keeps_both_ends(text: str, width: int) -> None:
    from dltop.fmt import cells, printable, shorten_middle

    out, shown = shorten_middle(text, width), printable(text)  # the one rule: escaped, then cut by cells
    assert cells(out) <= width
    if cells(shown) <= width:
        assert out == shown
    elif width >= 5:
        assert "…" in out and shown.startswith(out.split("…")[0]) and shown.endswith(out.split("…")[-1])


def test_a_band_is_scaled_to_what_is_shown_with_a_least_span() -> None:
    band = [23.0 * GIB, 23.1 * GIB, 23.2 * GIB]
    assert sparkline(band, 3) == "███"  # from 0, MemAvailable's 200 MiB of movement is a solid bar
    span = 0.01 * 23.5 * GIB  # 1% of MemTotal: wider than the band, so the band hangs down from its top
    low, high = 23.2 * GIB - span, 23.2 * GIB
    assert sparkline(band, 3, high, low) == "▂▅█" and human_range(low, high) == "23.0–23.2 GiB"
    noise = [23.1 * GIB + k * 4096 for k in (0, 3, 1, 2)]  # a few KiB up and down: no cliff
    assert sparkline(noise, 4, max(noise), max(noise) - span) == "████"
    assert sparkline([10, 20, 30], 3, 30, 10) == "▁▅█"
    assert human_range(900 * 2**20, 1.5 * GIB) == "0.9–1.5 GiB" and human_range(0, 512) == "0–512 B"


# -- text from outside ---------------------------------------------------------------------------------------------

import unicodedata  # noqa: E402

from dltop.fmt import printable, printable_lines  # noqa: E402

_BIDI_CONTROLS = set("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u2028\u2029")


# invisible look-alike makers: soft hyphen, Hangul fillers, Mongolian vowel separator, zero-width space and
# non-joiner, word joiner and invisible operators, BOM, tag characters (the zero-width joiner stays: emoji)
_INVISIBLE = {0xAD, 0x115F, 0x1160, 0x180E, 0x200B, 0x200C, *range(0x2060, 0x2065), 0x3164, 0xFEFF, 0xFFA0,
              *range(0xE0000, 0xE0080)}


def _unsafe(ch: str) -> bool:
    return unicodedata.category(ch) in ("Cc", "Cs") or ch in _BIDI_CONTROLS or ord(ch) in _INVISIBLE


@given(st.text(alphabet=st.characters(codec=None), max_size=80) | st.binary(max_size=40).map(
    lambda b: b.decode("utf-8", "surrogateescape")))
def test_printable_never_holds_a_control_and_keeps_the_rest(text: str) -> None:
    out = printable(text)
    assert not any(_unsafe(c) for c in out)
    assert printable(out) == out  # once is enough: an escape is plain text
    kept = iter(out)  # every other character is still there, in order (an escape only adds between them)
    assert all(c in kept for c in text if not _unsafe(c))
    lines = printable_lines(text)
    assert lines.count("\n") == text.count("\n") and not any(_unsafe(c) for c in lines.replace("\n", ""))
    if not any(_unsafe(c) for c in text):
        assert out == text and lines == text
