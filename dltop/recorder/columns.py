"""A sealed frame's lines stored by what changed: each line's shape once, its numbers in columns (docs/recorder.md).

A line's *shape* is its text with every run of digits cut out. Consecutive samples of a machine share one shape
until something other than a number changes (a GPU process starts, a source fails), so a frame keeps each
distinct shape once, then the digit runs of its lines column by column: a run that is the same in every line of
the frame goes back into the shape (an unchanged number, or a source's status that did not change, costs
nothing); a column of plain integers is written as differences from the line before where that is shorter (a
counter's steady climb becomes small numbers). zstd then compresses the columns. `unpack(pack(lines))` gives
back the very bytes of the lines: a reader gets the lines it always read.
"""

from __future__ import annotations

import re
from collections import Counter

MAGIC = b"dltop-columns 1 "
_DIGITS = re.compile(rb"([0-9]+)")  # split keeps the runs: shape pieces and runs alternate
_RAW = re.compile(rb"[0-9]+(?:,[0-9]+)*")
_DELTAS = re.compile(rb"\+-?[0-9]{1,24}(?:,-?[0-9]{1,24})*")
_HOLE = b"\0"  # never in a line dltop writes: JSON has no raw control characters


def pack(lines: list[bytes]) -> bytes:
    """The frame's content for these lines (each without its newline): a header, the shapes, which shape each
    line has, then each shape's columns."""
    if any(_HOLE in line for line in lines):
        return b"".join(line + b"\n" for line in lines)  # not a line dltop writes: kept as it is
    shapes: dict[bytes, int] = {}
    numbers: list[list[list[bytes]]] = []
    order = []
    for line in lines:
        parts = _DIGITS.split(line)
        sid = shapes.setdefault(_HOLE.join(parts[0::2]), len(shapes))
        if sid == len(numbers):
            numbers.append([])
        numbers[sid].append(parts[1::2])
        order.append(b"%d" % sid)
    kept_shapes, columns = [], []
    for shape, sid in shapes.items():
        pieces = shape.split(_HOLE)
        folded = [pieces[0]]
        for j, column in enumerate(zip(*numbers[sid], strict=True)):
            if column.count(column[0]) == len(column):  # the same in every line: back into the shape
                folded[-1] += column[0] + pieces[j + 1]
            else:
                columns.append(_column_text(column))
                folded.append(pieces[j + 1])
        kept_shapes.append(_HOLE.join(folded))
    head = MAGIC + b"%d %d" % (len(lines), len(shapes))
    return b"\n".join([head, *kept_shapes, b" ".join(order), *columns]) + b"\n"


def _column_text(column: tuple[bytes, ...]) -> bytes:
    """Digit runs joined by commas, or `+` and the differences from the run before where that is shorter (only
    for runs that are plain integers: no leading zero, which a difference would lose)."""
    raw = b",".join(column)
    if any(run[0] == 48 and len(run) > 1 for run in column):  # 48: "0"
        return raw
    values = list(map(int, column))
    deltas = b"+" + b",".join(b"%d" % (b - a) for a, b in zip([0, *values], values, strict=False))
    return deltas if len(deltas) < len(raw) else raw


def is_packed(content: bytes) -> bool:
    return content.startswith(MAGIC)


def unpack(content: bytes, limit: int) -> bytes:
    """The lines `pack` was given, each ending in a newline; ValueError (saying why) where the content is not
    what `pack` writes or would make more than `limit` bytes of lines."""
    rows = content.split(b"\n")
    head = rows[0][len(MAGIC):].split(b" ")
    if len(head) != 2 or not all(h.isdigit() and len(h) < 9 for h in head) or rows[-1] != b"":
        raise ValueError("columns: not a header dltop writes")
    n, k = int(head[0]), int(head[1])
    if len(rows) < k + 3:
        raise ValueError("columns: cut short")
    order = rows[k + 1].split(b" ") if n else []
    if len(order) != n or not all(o.isdigit() and int(o) < k for o in order):
        raise ValueError("columns: the lines' shapes are not listed")
    sids = list(map(int, order))
    counts = Counter(sids)
    at = k + 2
    size = 0
    by_shape = []  # each shape's lines, last first
    for sid, shape in enumerate(rows[1:k + 1]):
        pieces = shape.split(_HOLE)
        if at + len(pieces) - 1 >= len(rows):
            raise ValueError("columns: cut short")
        cols = [_column(rows[i], counts[sid]) for i in range(at, at + len(pieces) - 1)]
        at += len(pieces) - 1
        size += counts[sid] * (len(shape) - len(pieces) + 2) + sum(len(t) for col in cols for t in col)
        if size > limit:
            raise ValueError(f"columns: more than the {limit} bytes a frame holds")
        by_shape.append(_lines(pieces, cols, counts[sid]))
    if at != len(rows) - 1:
        raise ValueError("columns: more columns than its shapes hold")
    return b"".join(by_shape[sid].pop() + b"\n" for sid in sids)


def _lines(pieces: list[bytes], cols: list[list[bytes]], m: int) -> list[bytes]:
    """The `m` lines of one shape (its pieces with each line's runs between them), last first."""
    template: list[bytes] = [b""] * (2 * len(pieces) - 1)
    template[0::2] = pieces
    lines = []
    for numbers in zip(*cols, strict=True) if cols else [()] * m:
        template[1::2] = numbers
        lines.append(b"".join(template))
    return lines[::-1]


def _column(row: bytes, m: int) -> list[bytes]:
    if _RAW.fullmatch(row):
        runs = row.split(b",")
    elif _DELTAS.fullmatch(row):
        runs, value = [], 0
        for delta in row[1:].split(b","):
            value += int(delta)
            if value < 0:
                raise ValueError("columns: a number below 0")
            runs.append(b"%d" % value)
    else:
        raise ValueError("columns: a column that is not numbers")
    if len(runs) != m:
        raise ValueError("columns: a column of another length than its lines")
    return runs
