"""Sample lines read one after another, each Snapshot part whose JSON text is the previous sample's taken as it was.

A day's dump reads 86,400 lines of ~50 kB each, and most of a line repeats the one before (the probes, the caches,
a GPU's static fields): a part whose text is the same is the same value, already parsed, checked and decoded. The
result is exactly `Chunk.snapshot`'s: anything this path does not expect (other spacing, a key the Snapshot lacks,
a value it would not accept) makes it give up, and the caller reads the line the ordinary way, which decides.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import re
from collections.abc import Callable
from typing import Any

from dltop.model import Snapshot
from dltop.recorder import store, template

# What store.loads checks, here part by part: the line picks its decoder by what its text may hold (a negative
# number, a 20-digit int), so one negative number in the probes had every object of the line checked. Here a part
# whose text may hold either (a '-' after ':', ',' or '[', spacing allowed; 20 digits in a row) is parsed with
# every check store.loads has, and any other part with its plainest decoder (floats range-checked, NaN and
# infinities refused): never less strict than the line's choice, and each check returns what the plain parser
# would, or raises.
_NEGATIVE = re.compile(r"-(?:(?<=[:,\[]-)|(?<=[:,\[][ \t\n\r]-)|(?<=[ \t\n\r][ \t\n\r]-))")
_SPACE = " \t\n\r"
_DIGITS = bytes(48 if 48 <= i <= 57 else 32 for i in range(256))
_RUN = b"0" * 20
_RUN_AT = re.compile(r"[0-9]{20}")
_SCAN_PLAIN: Callable[[str, int], tuple[Any, int]] = store.DECODER.scan_once  # type: ignore[attr-defined]
_SCAN_CHECKED: Callable[[str, int], tuple[Any, int]] = store.SIGNED_DECODER.scan_once  # type: ignore[attr-defined]
_scanstring: Callable[[str, int, bool], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]
_FIELDS = frozenset(Snapshot.__dataclass_fields__)
_SCALARS = ("ts", "host", "uptime_s", "schema")
_KEEP = frozenset(_SCALARS)


class GiveUp(Exception):
    """The line is not in the shape this path reads: read it the ordinary way."""


@dataclasses.dataclass
class _SnapParts:
    """What one line's `snap` object gave, key by key."""

    snap: dict[str, Any] = dataclasses.field(default_factory=dict)  # key -> its parsed value
    texts: dict[str, str] = dataclasses.field(default_factory=dict)  # key -> its text, where parsed here
    reused: dict[str, Any] = dataclasses.field(default_factory=dict)  # key -> its part, from the line before or a
    # template (a stand-in, whose numbers are in `matched`)
    matched: dict[str, tuple[template.Template, tuple[str, ...]]] = dataclasses.field(default_factory=dict)
    passed: set[str] = dataclasses.field(default_factory=set)  # keys not asked for, stepped over


class PartMemo:
    """The previous sample line's parts: each top-level key of its Snapshot with its text, value and decoded
    part. One per reader of consecutive lines (a dump's piece). `parts`: the Snapshot parts a reader asks for
    (None: all); the others are stepped over, never decoded, and left out of the Snapshots it makes."""

    def __init__(self, templates: bool = False, parts: frozenset[str] | None = None) -> None:
        self.parts = parts
        self._unasked = _FIELDS - _KEEP - parts if parts is not None else frozenset()
        self._parts: dict[str, tuple[str, Any, Any]] = {}  # key -> (JSON text, parsed value, decoded part)
        self._passed: dict[str, str] = {}  # key -> the text of a part not asked for, as the line before had it
        self.reused = 0  # parts taken from the line before (for the tests and the docs)
        self.parsed = 0  # parts parsed and decoded
        self.gave_up = 0  # lines read the ordinary way
        # With templates (a CSV dump's reader): a part whose text is its template's with other numbers is not
        # decoded: the Snapshot holds the template's part as a stand-in (its numbers are not this line's!) and
        # `matched` the template and this line's numbers, from which the part's cells come (template.py).
        self._templates: dict[str, template.Template] | None = {} if templates else None
        self._made: dict[str, int] = {}  # key -> templates made
        self.matched: dict[str, tuple[template.Template, tuple[str, ...]]] = {}  # the last line's
        self.templated = 0  # parts read from their template's numbers

    def body(self, raw: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
        """The line's parsed body, and the decoded Snapshot fields of its `snap` (GiveUp where the line is not a
        compact sample line that parses cleanly)."""
        if len(raw) > store.MAX_LINE_BYTES:
            raise GiveUp
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise GiveUp from None
        self.matched = {}
        risky = _Risky(text, raw)
        body: dict[str, Any] = {}
        fields: dict[str, Any] = {}
        pos = _expect(text, 0, "{")
        while True:
            key, pos = _key(text, pos)
            if key == "snap" and text.startswith("{", pos):
                body[key], fields, pos = self._snap(text, pos, risky)
            else:
                body[key], pos = _value(text, pos, risky)
            if text.startswith("}", pos):
                break
            pos = _expect(text, pos, ",")
        if pos + 1 != len(text):
            raise GiveUp
        store.check_unsigned(body)
        return body, fields

    def _snap(self, text: str, pos: int, risky: _Risky) -> tuple[dict[str, Any], dict[str, Any], int]:
        got = _SnapParts()
        pos += 1
        if text.startswith("}", pos):
            raise GiveUp
        while True:
            key, pos = _key(text, pos)
            if key not in _FIELDS or key in got.snap or key in got.passed:  # a `_b64` sibling, a newer field, twice
                raise GiveUp
            pos = self._part(key, text, pos, risky, got)
            if text.startswith("}", pos):
                break
            pos = _expect(text, pos, ",")
        store.check_unsigned(got.snap)
        fields = self._decode(got)
        self.matched = {k: m for k, m in got.matched.items() if k not in self._unasked}
        return got.snap, fields, pos + 1

    def _part(self, key: str, text: str, pos: int, risky: _Risky, got: _SnapParts) -> int:
        """Read the part at `pos` into `got`, the cheapest way its text allows; where it ends."""
        templates = self._templates
        # Parts not asked for are left out; one a template may read (the GPUs) is still read through it (a C
        # match, cheaper than stepping over its text), the others stepped over.
        if key in self._unasked and (templates is None or key not in template.KEYS):
            got.passed.add(key)
            return self._pass(key, text, pos, risky)
        old = self._parts.get(key)
        if old is not None and text.startswith(old[0], pos):
            # The same text after the same ':' parses to the same value (an object's, a list's or a literal's
            # text ends itself, and the loop checks that a comma or the brace follows): it was parsed, checked
            # and decoded before.
            got.snap[key], got.reused[key] = old[1], old[2]
            self.reused += 1
            return pos + len(old[0])
        tm = templates.get(key) if templates is not None else None
        found = tm.match(text, pos) if tm is not None else None
        if tm is not None and found is not None:
            got.snap[key], got.reused[key], got.matched[key] = tm.parsed, tm.part, (tm, found[0])
            self.templated += 1
            return found[1]
        got.snap[key], end = _value(text, pos, risky)
        got.texts[key] = text[pos:end]
        self.parsed += 1
        return end

    def _decode(self, got: _SnapParts) -> dict[str, Any]:
        """The Snapshot fields of the parts asked for: those parsed here decoded (and kept for the lines after, with
        the parts not asked for that a template may read)."""
        fields = {}
        for key in got.snap:
            if key in _SCALARS:
                continue
            if key in got.reused:
                fields[key] = got.reused[key]
                continue
            fields[key] = store.decode_part(key, got.snap[key])
            self._parts[key] = (got.texts[key], got.snap[key], fields[key])
            if self._templates is not None and key in template.KEYS:
                self._template(key, got.texts[key], got.snap[key], fields[key])
        return {k: v for k, v in fields.items() if k not in self._unasked}

    def _pass(self, key: str, text: str, pos: int, risky: _Risky) -> int:
        """Where a part not asked for ends: its text as the line before had it, else parsed (checked, so that
        a line that is not JSON is refused as reading it whole would) but not decoded."""
        old = self._passed.get(key)
        if old is not None and text.startswith(old, pos):
            return pos + len(old)
        _, end = _value(text, pos, risky)
        self._passed[key] = text[pos:end]
        return end

    def _template(self, key: str, text: str, parsed: Any, part: Any) -> None:
        """Make a template of a part read the ordinary way, within a budget: a part whose numbers' places keep
        changing (its texts never match) costs a few makings, then one per 16 matches."""
        assert self._templates is not None
        made = self._made.get(key, 0)
        if made > 4 + self.templated // 16:
            return
        self._made[key] = made + 1
        tm = template.make(key, text, parsed, part)
        if tm is not None:
            self._templates[key] = tm
        else:
            self._templates.pop(key, None)


def snapshot(memo: PartMemo, raw: bytes, ts: float, kept_parts: Callable[[Any], dict[str, Any]]) -> Snapshot:
    """The Snapshot of a sample line as `Chunk.snapshot` makes it, `kept_parts(ref)` the parts it refers to
    (decoded by the chunk). GiveUp, or whatever decoding raises, where the ordinary way must decide."""
    body, fields = memo.body(raw)
    snap_dict, ref = body.get("snap"), body.get("ref", [])
    if not isinstance(snap_dict, dict) or not isinstance(ref, list):
        raise GiveUp
    base = Snapshot.from_dict({k: snap_dict[k] for k in _SCALARS if k in snap_dict})
    if base.ts != ts:
        raise GiveUp
    kept = kept_parts(ref)
    if memo.parts is not None:
        kept = {k: v for k, v in kept.items() if k in memo.parts}
    return dataclasses.replace(base, **{**fields, **kept}) if fields or kept else base


def _risky(text: str, raw: bytes) -> list[int]:
    """Where in the line's text a negative number (a '-' after ':', ',' or '[', spacing allowed) or a run of
    20 digits may be, ascending."""
    at = []
    for m in _NEGATIVE.finditer(text):  # a search for '-' then a look behind it: 20 us a line, a regex 240
        i = m.start()
        if text[i - 1] in _SPACE and text[i - 2] in _SPACE and not _after_spacing(text, i):
            continue
        at.append(i)
    if _RUN in raw.translate(_DIGITS):  # rare: a C search first, then where
        at = sorted(at + [m.start() for m in _RUN_AT.finditer(text)])
    if len(at) > 1000:  # not what dltop writes (a line has a few): the ordinary way
        raise GiveUp
    return at


def _after_spacing(text: str, i: int) -> bool:
    """Whether a '-' after more spacing than _NEGATIVE looks behind follows ':', ',' or '[' (what comes before
    the spacing decides)."""
    j = i - 2
    while j > 0 and text[j - 1] in _SPACE:
        j -= 1
    return j > 0 and text[j - 1] in ":,["


def _expect(text: str, pos: int, char: str) -> int:
    if not text.startswith(char, pos):
        raise GiveUp
    return pos + 1


def _key(text: str, pos: int) -> tuple[str, int]:
    if not text.startswith('"', pos):
        raise GiveUp
    key, pos = _scanstring(text, pos + 1, True)
    return key, _expect(text, pos, ":")


class _Risky:
    """_risky's places, found when a value's text holds a '-' or 20 digits in a row (most parsed values are small
    and hold neither: the 38 kB line is not searched for the GPU part a template reads)."""

    def __init__(self, text: str, raw: bytes) -> None:
        self._text, self._raw = text, raw
        self._at: list[int] | None = None

    def within(self, lo: int, hi: int) -> bool:
        """Whether a risky place is in [lo, hi): the text of one value (no run of digits crosses its ends)."""
        text = self._text
        if text.find("-", lo, hi) < 0 and (hi - lo < 20 or _RUN_AT.search(text, lo, hi) is None):
            return False
        if self._at is None:
            self._at = _risky(text, self._raw)
        return _any_between(self._at, lo, hi)


def _value(text: str, pos: int, risky: _Risky) -> tuple[Any, int]:
    try:
        value, end = _SCAN_PLAIN(text, pos)
        if risky.within(pos, end):
            value, end = _SCAN_CHECKED(text, pos)
    except (StopIteration, ValueError, RecursionError):
        raise GiveUp from None
    return value, end


def _any_between(positions: list[int], lo: int, hi: int) -> bool:
    """Whether a sorted list holds a position in [lo, hi)."""
    i = bisect.bisect_left(positions, lo)
    return i < len(positions) and positions[i] < hi
