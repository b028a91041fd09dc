"""Numbers for people: bytes, rates, durations and ages, as top-like tools print them (binary units)."""

from __future__ import annotations

import io
import math
import re
import unicodedata
from typing import TextIO

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def _unit(n: float) -> tuple[float, str]:
    """The unit human_bytes prints `n` in, as (bytes in one of it, its name)."""
    scale = 1.0
    for unit in _UNITS:
        if abs(n) < 1024 * scale or unit == _UNITS[-1]:
            return scale, unit
        scale *= 1024
    raise AssertionError("unreachable")


def _number(value: float, unit: str) -> str:
    return f"{value:.0f}" if unit == "B" or abs(value) >= 100 else f"{value:.1f}"


def human_bytes(n: float | None, missing: str = "n/a") -> str:
    """1536 -> '1.5 KiB'; None -> `missing`."""
    if n is None:
        return missing
    scale, unit = _unit(float(n))
    return f"{_number(n / scale, unit)} {unit}"


def human_range(low: float, high: float) -> str:
    """Two byte counts in the unit of the larger, as a chart's scale: '22.9–23.2 GiB'."""
    scale, unit = _unit(high)
    return f"{_number(low / scale, unit)}–{_number(high / scale, unit)} {unit}"


def human_rate(n: float | None, missing: str = "n/a") -> str:
    """Bytes per second as '12.3 MiB/s'."""
    return missing if n is None else human_bytes(n) + "/s"


def human_count_rate(n: float | None, missing: str = "n/a") -> str:
    """Events per second, compact: '0', '12', '3.4k'."""
    if n is None:
        return missing
    if n >= 10_000:
        return f"{n / 1000:.0f}k"
    if n >= 1000:
        return f"{n / 1000:.1f}k"
    return f"{n:.0f}" if n >= 10 or n == 0 else f"{n:.1f}"


# (seconds in the unit, its name, seconds in the next smaller unit, its name), largest first
_TIME_UNITS = ((86400, "d", 3600, "h"), (3600, "h", 60, "m"), (60, "m", 1, "s"))


def human_duration(seconds: float | None, missing: str = "n/a") -> str:
    """Seconds as '45s', '12m05s', '3h05m', '4d02h'."""
    if seconds is None:
        return missing
    s = int(seconds)
    for size, name, sub, sub_name in _TIME_UNITS:
        if s >= size:
            return f"{s // size}{name}{s % size // sub:02d}{sub_name}"
    return f"{s}s"


def human_age(seconds: float | None, missing: str = "n/a") -> str:
    """An age at a resolution that suits its size, floored: '<10s', '40s', '3m', '2h', '4d'. Shown every tick,
    it changes once a unit (a 3-minute-old row once a minute), not every second as human_duration's would."""
    if seconds is None:
        return missing
    s = int(seconds)
    for size, name, _, _ in _TIME_UNITS:
        if s >= size:
            return f"{s // size}{name}"
    return "<10s" if s < 10 else f"{s // 10 * 10}s"


def percent_text(p: float, decimals: int = 0) -> str:
    """A percentage as text with `decimals` decimals, or more where rounding would claim what is not so: 100%
    only when complete (99.78 is '99.8%', not '100%') and 0% only when nothing (0.04 is '0.04%'); past two
    decimals, '>99.99%' and '<0.01%'."""
    if not math.isfinite(p):
        return "n/a"
    for d in range(decimals, 3):
        text = f"{p:.{d}f}"
        shown = float(text)
        if (shown < 100 or p >= 100) and (shown > 0 or p <= 0):
            return text + "%"
    return ">99.99%" if p > 50 else "<0.01%"


def percent(part: float | None, whole: float | None, missing: str = "n/a") -> str:
    """part/whole as '12%' (one decimal under 10%; never 100% or 0% unless it is so: `percent_text`)."""
    if part is None or not whole:
        return missing
    p = 100 * part / whole
    return percent_text(p, 1 if p < 10 else 0)


SPARK_CHARS = "▁▂▃▄▅▆▇█"


def _columns(values: list[float], width: int) -> list[float]:
    """At most `width` values: older readings merged into columns by their maximum, so no spike is lost.
    A value that is not finite (a reading from outside that slipped past its reader) is drawn as 0, never
    allowed to take the chart down."""
    if not all(map(math.isfinite, values)):
        values = [v if math.isfinite(v) else 0.0 for v in values]
    if len(values) <= width:
        return values
    step = len(values) / width
    return [max(values[int(i * step): max(int((i + 1) * step), int(i * step) + 1)]) for i in range(width)]


def sparkline(values: list[float], width: int, top: float | None = None, bottom: float = 0.0) -> str:
    """The last values as a one-line bar chart `width` columns wide, right-aligned, scaled from `bottom` to
    `top` (default: 0 to the largest value shown); older values are merged into columns by their maximum."""
    if width <= 0:
        return ""
    values = _columns(values, width)
    span = (top if top is not None else max(values, default=0.0)) - bottom
    last = len(SPARK_CHARS) - 1
    if span > 0:
        bars = "".join(SPARK_CHARS[min(last, max(0, round((v - bottom) / span * last)))] for v in values)
    else:
        bars = SPARK_CHARS[0] * len(values)
    return " " * (width - len(bars)) + bars


def plural(n: int, word: str, many: str | None = None) -> str:
    """(1, 'file') -> '1 file', (2, 'file') -> '2 files'; `many` for a plural that is not word + 's'."""
    return f"{n} {word if n == 1 else many or word + 's'}"


def first_and_more(items: list[str]) -> str:
    """The first of some problems, and how many more: 'line 3: ... (and 2 more)'."""
    return items[0] + (f" (and {len(items) - 1} more)" if len(items) > 1 else "")


def shorten(text: str, width: int, keep: str = "middle") -> str:
    """The one rule for text from outside in a room `width` cells wide: made `printable` first (a control is shown
    as its escape, never dropped), then, if it does not fit, cut between graphemes by cell width with '…' where
    the cut is. A combining mark stays on its letter (never on the '…'), a wide character (CJK, emoji) is kept
    whole or left out, never split. `keep` says which part to keep: "middle" cuts the middle out (both ends of a
    path say most, its own name more: 3/5 of the room), "end" keeps the start ('long comm…'), "start" keeps the
    end ('…/train')."""
    return _cut(printable(text), width, keep)


def _cut(shown: str, width: int, keep: str) -> str:
    """`shorten` of a text made printable already."""
    if width <= 0:
        return ""
    cut, cells = _graphemes(shown)
    if cells <= width:
        return shown
    room = width - 1  # the '…' takes one cell
    ends, used = _from_end(cut, len(cut), 0, 0, room * _END_FIFTHS.get(keep, 3) // 5)
    starts = 0
    while keep != "start" and starts < ends and used + cut[starts][2] <= room:  # then from the start, in the rest
        used += cut[starts][2]
        starts += 1
    if keep == "middle":  # a wide one left a gap
        ends, used = _from_end(cut, ends, starts, used, room)
    head = shown[:cut[starts - 1][1]] if starts else ""
    return head + "…" + (shown[cut[ends][0]:] if ends < len(cut) else "")


_END_FIFTHS = {"end": 0, "middle": 3, "start": 5}  # fifths of the room `shorten` gives the text's end


def _from_end(cut: list[tuple[int, int, int]], ends: int, stop: int, used: int, limit: int) -> tuple[int, int]:
    """Whole graphemes taken from before `ends` (down to `stop`) while `used` cells stay within `limit`:
    (where the kept end now starts, cells used)."""
    while ends > stop and used + cut[ends - 1][2] <= limit:
        ends -= 1
        used += cut[ends][2]
    return ends, used


def shorten_lines(text: str, width: int, lines: int) -> list[str]:
    """`text` from outside in at most `lines` rows of `width` cells by the rule of `shorten` (escaped, cut between
    graphemes, never in an escape): the rows filled in turn, the last ending in '…' where there is more."""
    shown = printable(text)
    if width <= 0 or lines <= 0:
        return []
    cut, _ = _graphemes(shown)
    rows: list[str] = []
    at = 0
    while at < len(cut) and len(rows) < lines - 1:
        start, used = at, 0
        while at < len(cut) and (used + cut[at][2] <= width or at == start):  # a grapheme wider than the row alone
            used += cut[at][2]
            at += 1
        rows.append(shown[cut[start][0]:cut[at - 1][1]])
    if at < len(cut):
        rows.append(_cut(shown[cut[at][0]:], width, "end"))
    return rows


def _graphemes(shown: str) -> tuple[list[tuple[int, int, int]], int]:
    """The graphemes of `shown` (a `printable` text) as (start, end, cells), and its cells in all; each escape
    (`\\x07`, `\\u202e`) is one unit: a cut never leaves a '\\' or a '\\x0' that reads as something else."""
    cut: list[tuple[int, int, int]]
    if shown.isascii():  # printable: one cell a character, one character a grapheme
        cut = [(i, i + 1, 1) for i in range(len(shown))]
    else:  # as Rich (what Textual measures and draws by) splits them: marks and joined emoji on their base
        cut = []
        join = False
        for i, ch in enumerate(shown):
            w = _char_cells(ch)
            if cut and (w == 0 or join):
                start, _, cells = cut[-1]
                cut[-1] = (start, i + 1, cells)  # a joined emoji takes its first one's cells
            else:
                cut.append((i, i + 1, w))
            join = ch == "\u200d"
    if "\\" in shown:  # escaped here or before (a column's cells are escaped before they are measured)
        cut = _whole_escapes(shown, cut)
    return cut, sum(w for _, _, w in cut)


_SHOWN_CF = {*range(0x600, 0x606), 0x6DD, 0x70F, 0x890, 0x891, 0x8E2, 0x110BD, 0x110CD}  # signs drawn over digits


def _char_cells(ch: str) -> int:
    """The cells one character takes on a terminal, as wcwidth and Rich count them: 0 for a combining mark, a
    format character (a joiner, a variation selector), a Hangul medial or final jamo and an emoji skin tone; 2 for
    East Asian wide and full-width characters; 1 for the rest."""
    o = ord(ch)
    if o < 0x300:
        return 1
    if ((unicodedata.category(ch) in ("Mn", "Me", "Mc") or unicodedata.category(ch) == "Cf" and o not in _SHOWN_CF)
            or 0x1160 <= o <= 0x11FF or 0x1F3FB <= o <= 0x1F3FF or 0xD7B0 <= o <= 0xD7FF):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def cells(text: str) -> int:
    """The cells `text` (one line, printable) takes on a terminal, by the rule `shorten` cuts by."""
    return len(text) if text.isascii() else _graphemes(text)[1]


_AN_ESCAPE = re.compile(r"\\(?:x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8})")


def _whole_escapes(shown: str, cut: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """The graphemes `cut` of `shown` with the characters of each escape `printable` wrote made one."""
    at = {m.start(): m.end() for m in _AN_ESCAPE.finditer(shown)}
    out: list[tuple[int, int, int]] = []
    until = -1
    for start, end, w in cut:
        if start < until:  # inside the escape begun in out[-1]: a mark on its last character stays too
            s0, e0, w0 = out[-1]
            out[-1] = (s0, max(e0, end), w0 + w)
        else:
            out.append((start, end, w))
            until = at.get(start, -1)
    return out


def shorten_middle(text: str, width: int) -> str:
    """'/data/some/long/path/train' -> '/data/so…h/train' in `width` cells: `shorten`, both ends kept."""
    return shorten(text, width, "middle")


def shorten_end(text: str, width: int) -> str:
    """'python train.py --lr …' in `width` cells: `shorten`, the start kept (a command line's program first)."""
    return shorten(text, width, "end")


_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
               "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40}


def parse_bytes(text: str) -> int:
    """'80GiB' -> 85899345920, '80GB' -> 80000000000, '1.5 MiB', '4096': a size as a person writes it.
    A bare 'G' is refused (GiB or GB?); a ValueError says what is wrong."""
    t = text.strip().replace("_", "").replace(",", "")
    i = len(t)
    while i and t[i - 1].isalpha():
        i -= 1
    number, unit = t[:i].strip(), t[i:].upper()
    if unit in ("K", "M", "G", "T"):
        raise ValueError(f"ambiguous size {text!r}: say {number}{unit}iB (binary) or {number}{unit}B (decimal)")
    if unit not in _SIZE_UNITS:
        raise ValueError(f"unknown unit in size {text!r} (B, KiB, MiB, GiB, TiB, or KB, MB, GB, TB)")
    # Imported here: decimal is ~5 ms of every command's start-up, and only a size given as text needs it.
    from decimal import Decimal, InvalidOperation, localcontext

    try:
        value = Decimal(number)
    except InvalidOperation:
        raise ValueError(f"not a size: {text!r}") from None
    if not value.is_finite() or value < 0:
        raise ValueError(f"not a size: {text!r}")
    if value.adjusted() > 24:  # more than a yottabyte: a typo, and int() of 1e999999999 would never finish
        raise ValueError(f"size {text!r} is too large")
    with localcontext(prec=60):  # exact for every size up to the cap (the default 28 digits round 1e16 TiB)
        return int(value * _SIZE_UNITS[unit])  # a fraction of a byte ('79.6GiB') rounds down


# Text from outside dltop (argv, paths, probe files, /metrics labels) reaches a terminal only through these, as
# procps' escape.c does for ps and top: a control character, DEL, a C1 control, a bidi override or isolate, a line
# or paragraph separator, or a byte that was not UTF-8 is shown as an escape a person can read, never sent.
# The characters escaped: C0 (line break and tab included), DEL, C1, the bidi controls, the line and paragraph
# separators, and surrogates (undecodable bytes, and lone ones). One class, searched at C speed: a pane's text
# (box drawing, sparklines, '·') is rarely ASCII, and a check per character in Python would run on every update.
# Invisible characters that make one name look like another (a soft hyphen, a zero-width space or non-joiner, a word
# joiner, a BOM, Hangul fillers, tag characters) are escaped too; the zero-width joiner stays: emoji need it.
_INVISIBLE = "\u00ad\u115f\u1160\u180e\u200b\u200c\u2060-\u2064\u3164\ufeff\uffa0\U000e0000-\U000e007f"
_UNSAFE_CLASS = ("\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029\ud800-\udfff"
                 + _INVISIBLE)
_UNSAFE = re.compile(f"[{_UNSAFE_CLASS}]")
_UNSAFE_IN_LINES = re.compile(
    "[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029\ud800-\udfff"
    + _INVISIBLE + "]")


def _escape(m: re.Match[str]) -> str:
    o = ord(m.group())
    if 0xDC80 <= o <= 0xDCFF:  # a byte that was not UTF-8, kept by surrogateescape: show the byte
        return f"\\x{o - 0xDC00:02x}"
    if o < 0x100:
        return f"\\x{o:02x}"
    return f"\\u{o:04x}" if o <= 0xFFFF else f"\\U{o:08x}"


def printable(text: str) -> str:
    """`text` safe to show on a terminal: C0 and C1 controls, DEL, bidi controls, line separators and
    undecodable bytes as visible escapes ('\\x1b', '\\u202e', '\\xff'); everything else as it is.
    '\\n' is escaped too: one string from outside is one line on screen."""
    return _UNSAFE.sub(_escape, text) if _UNSAFE.search(text) else text


def printable_lines(text: str) -> str:
    """Like `printable`, but line breaks stay: for text dltop composed (a report, a dialog) that holds strings
    from outside, each already one line."""
    return _UNSAFE_IN_LINES.sub(_escape, text) if _UNSAFE_IN_LINES.search(text) else text


# The CLI's writers escape as \uXXXX: valid inside a JSON string (json.loads gives back the very character, an
# undecodable byte's surrogate too), and as readable as \x1b in text.
_UNSAFE_OUT = _UNSAFE_IN_LINES  # what printable_lines escapes, written the JSON way


def _json_escape(m: re.Match[str]) -> str:
    o = ord(m.group())
    if o <= 0xFFFF:
        return f"\\u{o:04x}"
    o -= 0x10000  # JSON's \\u names 16 bits: a character past them is its surrogate pair
    return f"\\u{0xD800 + (o >> 10):04x}\\u{0xDC00 + (o & 0x3FF):04x}"


class EscapingWriter(io.TextIOBase):
    """A text stream for the CLI's stdout and stderr: what is written goes on with every control character but the
    line break (and DEL, C1, bidi controls, undecodable bytes) as '\\u001b', so text from outside in a command's
    output never reaches the terminal as an escape sequence. JSON output stays valid and decodes to the same
    strings. `raw` is the stream underneath, for output whose escapes dltop wrote itself (a report's colours)."""

    def __init__(self, raw: TextIO) -> None:
        super().__init__()
        self.raw = raw

    def write(self, s: str) -> int:
        self.raw.write(_UNSAFE_OUT.sub(_json_escape, s) if _UNSAFE_OUT.search(s) else s)
        return len(s)

    def flush(self) -> None:
        self.raw.flush()

    def isatty(self) -> bool:
        return self.raw.isatty()

    def fileno(self) -> int:
        return self.raw.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.raw.encoding

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return self.raw.errors

    def writable(self) -> bool:
        return True
