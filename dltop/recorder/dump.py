"""`dltop dump`: a recording as JSON Lines, CSV or OpenMetrics, with column and metric names from `dltop.fields`.

jsonl is one Snapshot per line (`dltop snapshot --json`'s structure). csv is one row per sample, a `ts` column
then one column per series (`gpu_memory_used_bytes{gpu="0",uuid="GPU-..."}`), gauges and counters only unless
--fields names an info field. openmetrics is what `promtool tsdb create-blocks-from openmetrics` takes: each
metric family's samples together (the format requires it), with timestamps, and `# EOF`. Hints come from the
recording's hint events (fired / cleared), so the hints a dump shows are the ones the recorder saw.
"""

from __future__ import annotations

import bisect
import csv
import fnmatch
import io
import json
import multiprocessing
import os
import tempfile
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor, wait
from typing import IO, Any, NamedTuple

from dltop import fields as fd
from dltop.errors import DltopError
from dltop.fmt import EscapingWriter
from dltop.model import Snapshot
from dltop.recorder import template
from dltop.recorder.reader import Damage, Recording
from dltop.recorder.reuse import PartMemo

Progress = Callable[[int, int], None]


def dump(rec: Recording, fmt: str, out: IO[str], t0: float | None = None, t1: float | None = None,
         names: list[str] | None = None, workers: int | None = None, progress: Progress | None = None,
         written: list[int] | None = None) -> None:
    """Write the samples of `rec` between t0 and t1 to `out` in `fmt` ("jsonl", "csv", "openmetrics"); csv and
    openmetrics read long ranges in up to `workers` processes (default: one per CPU, at most 16).
    `progress(read, total)` is called as samples are read (a few times a second); `written[0]` counts the
    lines written to `out`, each written whole (an interrupted dump stops between two)."""
    count = written if written is not None else [0]
    if fmt == "jsonl":
        _jsonl(rec, out, t0, t1, names, progress, count)
    elif fmt == "csv":
        _csv(rec, out, t0, t1, _wanted(names, csv=True), workers, progress, count)
    elif fmt == "openmetrics":
        _openmetrics(rec, out, t0, t1, _wanted(names, csv=False), workers, progress, count)
    else:
        raise DltopError(f"unknown dump format {fmt!r} (csv, jsonl, openmetrics)")


def _wanted(names: list[str] | None, csv: bool) -> set[str]:
    """The field names a dump writes: those matching --fields (globs allowed), else every gauge and counter
    (and info fields too in OpenMetrics)."""
    if not names:
        return {f.name for f in fd.FIELDS if not (csv and f.kind == "info")}
    out: set[str] = set()
    for pattern in names:
        hit = {f.name for f in fd.FIELDS if fnmatch.fnmatchcase(f.name, pattern.removeprefix(fd.PREFIX))}
        if not hit:
            raise DltopError(f"--fields: no field matches {pattern!r} (the names are in docs/recorder.md)")
        out |= hit
    return out


def parts_of(wanted: set[str]) -> frozenset[str] | None:
    """The Snapshot parts the fields `wanted` are read from (None: all of them). A source's state depends on its
    part being there (`dltop_source_up`), so a sources field needs every part; a hint's comes from the events."""
    parts = {fd.BY_NAME[name].part for name in wanted} - {"hints"}
    return None if "sources" in parts else frozenset(parts)


class _HintTimeline:
    """The hints firing at each moment, from the recording's hint events."""

    def __init__(self, rec: Recording) -> None:
        self._events = [e for e in rec.events() if e.kind == "hint" and isinstance(e.data.get("id"), str)]
        self._i = 0
        self._active: dict[str, _Hint] = {}

    def at(self, ts: float) -> list[_Hint]:
        while self._i < len(self._events) and self._events[self._i].ts <= ts:
            e = self._events[self._i]
            if e.data.get("state") == "fired":
                self._active[e.data["id"]] = _Hint(e.data["id"], str(e.data.get("severity", "info")))
            else:
                self._active.pop(e.data["id"], None)
            self._i += 1
        return list(self._active.values())


class _Hint(NamedTuple):
    id: str
    severity: str


def _jsonl(rec: Recording, out: IO[str], t0: float | None, t1: float | None, parts: list[str] | None,
           progress: Progress | None, written: list[int]) -> None:
    keep = _jsonl_keys(parts)
    total = _in_range(rec, t0, t1)
    for n, snap in enumerate(rec.range(t0, t1, PartMemo(parts=None if keep is None else frozenset(keep)))):
        if keep is None:
            out.write(snap.to_json() + "\n")
        else:
            out.write(json.dumps({k: v for k, v in snap.to_dict().items() if k in keep}) + "\n")
        written[0] += 1
        if progress is not None and n % 64 == 0:
            progress(n, total)


def _jsonl_keys(parts: list[str] | None) -> set[str] | None:
    """The keys a jsonl dump keeps of each Snapshot: --fields names its parts (None: all of them)."""
    if not parts:
        return None
    known = set(Snapshot.__dataclass_fields__)
    bad = [p for p in parts if p not in known]
    if bad:
        raise DltopError(f"--fields with jsonl names Snapshot parts: {bad[0]!r} is not one ({', '.join(sorted(known))})")
    return {"ts", "host", "schema", *parts}


def series_name(name: str, labels: dict[str, str]) -> str:
    """`name{label="value",...}`, labels in their order, values escaped as the Prometheus text format does."""
    if not labels:
        return name
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    return f"{name}{{{inner}}}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


# Long ranges are cut into pieces of consecutive samples, each read in its own process (decoding Snapshots is
# the cost: a day is 86,400 of them), then joined in time order.
MIN_PER_WORKER = 1800


def _pieces(rec: Recording, t0: float | None, t1: float | None, workers: int) -> list[tuple[float, float]]:
    """(first ts, last ts) of each piece, in time order; [] when the range holds no sample."""
    times = rec.times()
    sel = times[0 if t0 is None else bisect.bisect_left(times, t0):
                len(times) if t1 is None else bisect.bisect_right(times, t1)]
    if not sel:
        return []
    n = max(1, min(workers, len(sel) // MIN_PER_WORKER))
    cuts = [len(sel) * k // n for k in range(n + 1)]
    pieces = []
    for a, b in zip(cuts, cuts[1:], strict=False):
        while a and a < b and sel[a] == sel[a - 1]:  # a time repeated across a cut stays in one piece
            a += 1
        if a < b:
            pieces.append((sel[a], sel[b - 1]))
    return pieces


def _in_range(rec: Recording, t0: float | None, t1: float | None) -> int:
    """How many samples lie between t0 and t1."""
    times = rec.times()
    return (len(times) if t1 is None else bisect.bisect_right(times, t1)) - \
        (0 if t0 is None else bisect.bisect_left(times, t0))


# Rows read by each piece so far, in memory the piece processes share with the parent (made before they fork).
_READ: Any = None
_READ_EVERY = 64  # a piece adds its rows to _READ this often
_OPENED: Recording | None = None  # the recording being dumped, opened by the parent before its pieces fork
_Job = tuple[str, str, float, float, set[str], str, int]  # _piece's arguments


def _run_pieces(rec: Recording, kind: str, t0: float | None, t1: float | None, wanted: set[str], scratch: str,
                workers: int | None, progress: Progress | None = None) -> list[list[str]]:
    """Each piece's names in first-seen order (series for csv, fields for openmetrics); its rows or lines are
    in `scratch`/<piece>."""
    global _READ, _OPENED
    pieces = _pieces(rec, t0, t1, workers or min(16, os.cpu_count() or 1))
    jobs = [(rec.path, kind, a, b, wanted, os.path.join(scratch, str(k)), k) for k, (a, b) in enumerate(pieces)]
    context = multiprocessing.get_context("fork")
    _READ = context.RawArray("q", max(1, len(jobs)))
    total = _in_range(rec, t0, t1)
    _OPENED = rec
    try:
        results = _run_jobs(jobs, context, progress, total)
    finally:
        _OPENED = None
    for _, damage in results:  # the same damage seen by two pieces (a frame at a cut) is counted once
        rec.damage.merge(damage)
    return [names for names, _ in results]


def _run_jobs(jobs: list[_Job], context: Any, progress: Progress | None,
              total: int) -> list[tuple[list[str], Damage]]:
    """Each piece's result: read here where there is one, else each in a process of its own."""
    if len(jobs) <= 1:
        return [_piece(*job, progress=progress, total=total) for job in jobs]
    with ProcessPoolExecutor(len(jobs), mp_context=context) as pool:
        futures = [pool.submit(_piece, *job) for job in jobs]
        while not wait(futures, timeout=0.2).done.issuperset(futures):
            if progress is not None:
                progress(sum(_READ), total)
        return [f.result() for f in futures]


def _piece(path: str, kind: str, first: float, last: float, wanted: set[str], out: str, slot: int,
           progress: Progress | None = None, total: int = 0) -> tuple[list[str], Damage]:
    """Read one piece of the recording and write it under `out`: rows of column numbers (csv), or one file per
    field (openmetrics). Returns the names in first-seen order and the damage skipped. Its rows read so far go
    to _READ[slot] (and to `progress`, where it runs in the parent)."""
    # The recording the parent opened (a forked piece has its own copy): opening a day again (24 indexes) took
    # each piece half a second.
    rec = _OPENED if _OPENED is not None and _OPENED.path == path else Recording(path)
    times = rec.times()
    i = bisect.bisect_left(times, first)
    prev = rec.at(times[i - 1]) if i > 0 else None
    names: list[str] = []  # the series (csv: `name{labels}`; openmetrics: "field\tdltop_name{labels}")
    field_of: list[str] = []  # each series' field
    read = 0
    if kind == "csv":
        with open(out, "w", encoding="utf-8") as rows:
            for ts, cols, vals in _rows(rec, first, last, wanted, prev, names, field_of):
                cells: list[str] = [""] * len(names)  # a series absent at this moment is an empty cell, never a 0
                deque(map(cells.__setitem__, cols, vals), 0)
                rows.write(f"{ts},{','.join(cells)}\n")
                read = _count(read, slot, progress, total)
        return names, rec.damage
    # OpenMetrics wants each label set's points together, in time order, within its family: one file per series.
    # Rows with the same columns (a machine whose series stay) are held as a run and written column by column.
    os.mkdir(out)
    run: list[tuple[str, list[str]]] = []  # (ts, cells) of consecutive rows with the columns run_cols
    run_cols: list[int] = []
    for ts, cols, vals in _rows(rec, first, last, wanted, prev, names, field_of):
        if cols != run_cols or len(run) >= _RUN_ROWS:
            _write_run(out, run_cols, run)
            run, run_cols = [], cols
        run.append((ts, vals))
        read = _count(read, slot, progress, total)
    _write_run(out, run_cols, run)
    return [f"{f}\t{fd.PREFIX}{series}" for f, series in zip(field_of, names, strict=True)], rec.damage


_RUN_ROWS = 4096  # OpenMetrics rows a piece holds before appending them to their series' files
_OM_NUMBER = {"inf": "+Inf", "-inf": "-Inf", "nan": "NaN"}  # OpenMetrics' spelling of what repr() writes


def _write_run(out: str, cols: list[int], run: list[tuple[str, list[str]]]) -> None:
    """Append rows that have the same columns to each column's file (`out`/<column>), as lines `value ts` (the
    series' name goes before each when the parent copies them out: a day is gigabytes of it)."""
    if not run:
        return
    times = [ts for ts, _ in run]
    for c, values in zip(cols, zip(*(vals for _, vals in run), strict=True), strict=True):
        if "n" in "".join(values):  # inf, nan: no number dump writes holds an n
            values = tuple(_OM_NUMBER.get(v, v) for v in values)
        with open(os.path.join(out, str(c)), "a", encoding="ascii") as fh:
            fh.write("\n".join(map(" ".join, zip(values, times, strict=True))) + "\n")


def _count(n: int, slot: int, progress: Progress | None, total: int) -> int:
    """One more row read: every _READ_EVERY rows, said to the parent (_READ) and to `progress`."""
    if n % _READ_EVERY == 0:
        _READ[slot] = n
        if progress is not None:
            progress(n, total)
    return n + 1


def _rows(rec: Recording, first: float, last: float, wanted: set[str], prev: Snapshot | None, names: list[str],
          field_of: list[str]) -> Iterator[tuple[str, list[int], list[str]]]:
    """Each sample's time (as its cell) and its wanted samples as (columns, cells); a series met first is added
    to `names` (`name{labels}`) and its field to `field_of`, taking the next column."""
    cells = _Cells(wanted, names, field_of)
    hints = _HintTimeline(rec)
    # A part object met again (its text repeated the sample before's: reuse.PartMemo) keeps its cells.
    kept: dict[type, tuple[object, list[int], list[str]] | None] = {}
    memo = PartMemo(templates=True, parts=parts_of(wanted))
    for snap in rec.range(first, last, memo):
        cols: list[int] = []
        vals: list[str] = []
        matched = memo.matched
        for part, group in fd.sample_groups(snap, prev):
            match = _matched(matched, part) if matched else None
            if match is not None:  # a stand-in: the cells come from this line's numbers
                cells.plan(match[0]).extend(match[1], cols, vals)
                kept[type(part)] = None
            elif part is None:
                more = cells.of(group)
                cols += more[0]
                vals += more[1]
            else:
                hit = kept.get(type(part))
                if hit is None or hit[0] is not part:
                    hit = kept[type(part)] = (part, *cells.of(group))
                cols += hit[1]
                vals += hit[2]
        more = cells.of(fd.hint_samples(hints.at(snap.ts)))
        cols += more[0]
        vals += more[1]
        yield _number(snap.ts), cols, vals
        prev = snap


def _matched(matched: dict[str, tuple[template.Template, tuple[str, ...]]],
             part: object) -> tuple[template.Template, tuple[str, ...]] | None:
    """The template and numbers of a part that is a template's stand-in (PartMemo.matched), else None."""
    if part is None:
        return None
    return next((m for m in matched.values() if m[0].part is part), None)


class _Cells:
    """A piece's series and their cells: each wanted sample's column (a series met first takes the next) and its
    number as CSV text."""

    def __init__(self, wanted: set[str], names: list[str], field_of: list[str]) -> None:
        self.wanted = wanted
        self.names = names
        self.field_of = field_of
        self.by_labels: dict[tuple[tuple[str, str], ...], dict[str, int]] = {}  # label set -> field name -> column
        # Rows as CSV text already (numbers need no quoting), in this piece's column order: the formatting is
        # done here, in parallel, and the parent only copies (or reorders) them.
        # Most values repeat (sizes, totals, 1 for info): each formatted once. Ints apart from floats: 2**53 and
        # 2.0**53 are one key of a dict but two cells ("9007199254740992" and "9007199254740992.0").
        self.float_text: dict[float, str] = {}
        self.int_text: dict[float, str] = {}
        self.plans: dict[int, _Plan] = {}  # id(template) -> its plan, made when the template is first used

    def column(self, mine: dict[str, int], name: str, labels: dict[str, str]) -> int:
        """The column of field `name` among a label set's (`mine`), a new one where the series is new."""
        c = mine.get(name)
        if c is None:
            c = mine[name] = len(self.names)
            self.names.append(series_name(name, labels))
            self.field_of.append(name)
        return c

    def of(self, group: Iterable[fd.Sample]) -> tuple[list[int], list[str]]:
        """The column and the cell of each wanted sample."""
        cols: list[int] = []
        vals: list[str] = []
        wanted, by_labels, float_text, int_text = self.wanted, self.by_labels, self.float_text, self.int_text
        # Samples share their labels dict (a GPU's): each looked up once. It is kept here with its columns,
        # so that its id is not a later sample's (a generator's labels may be freed as it goes on).
        seen: dict[int, tuple[dict[str, str], dict[str, int]]] = {}
        for f, labels, value in group:
            if f.name not in wanted:
                continue
            hit = seen.get(id(labels))
            if hit is None:
                hit = seen[id(labels)] = (labels, by_labels.setdefault(tuple(labels.items()), {}))
            c = hit[1].get(f.name)
            if c is None:
                c = self.column(hit[1], f.name, labels)
            text = float_text if type(value) is float else int_text
            cell = text.get(value)
            if cell is None:
                if len(text) > 100_000:
                    text.clear()
                cell = text[value] = _number(value)
            cols.append(c)
            vals.append(cell)
        return cols, vals

    def plan(self, tm: template.Template) -> _Plan:
        plan = self.plans.get(id(tm))
        if plan is None or plan.tm is not tm:
            plan = self.plans[id(tm)] = _Plan(tm, self)
        return plan


class _Plan:
    """How a template's numbers become a piece's cells: the columns of its wanted samples given as _Cells.of
    gives them (in the order it would meet them), split into constant cells, cells that are a number's own text
    (an int's; an int's float's where it has at most 15 digits), and the rest (computed, each text once)."""

    def __init__(self, tm: template.Template, cells: _Cells) -> None:
        self.tm = tm
        self.const_columns: list[int] = []
        self.consts: list[str] = []
        self.own_columns: list[int] = []
        own: list[int] = []  # their numbers
        self.short_columns: list[int] = []
        short: list[int] = []
        self.short_specs: list[Any] = []
        self.computed: list[tuple[int, Any, dict[str, str]]] = []
        for f, labels, spec in tm.samples:
            if f.name not in cells.wanted:
                continue
            c = cells.column(cells.by_labels.setdefault(tuple(labels.items()), {}), f.name, labels)
            if spec[0] == "=":
                self.const_columns.append(c)
                self.consts.append(template.cell(spec, ()))
            elif template.own_text(spec):
                self.own_columns.append(c)
                own.append(spec[0])
            elif template.own_text_if_short(spec):
                self.short_columns.append(c)
                short.append(spec[0])
                self.short_specs.append(spec)
            else:
                self.computed.append((c, spec, {}))
        self.own = template.getter(own)
        self.short = template.getter(short)

    def extend(self, nums: tuple[str, ...], cols: list[int], vals: list[str]) -> None:
        """Add the cells of a line whose numbers are `nums` to `cols` and `vals`."""
        cell_of = template.cell
        cols += self.const_columns
        vals += self.consts
        cols += self.own_columns
        vals += self.own(nums)
        if self.short_columns:
            cols += self.short_columns
            texts = self.short(nums)
            vals += texts if max(map(len, texts)) <= 15 else [cell_of(s, nums) for s in self.short_specs]
        for c, spec, done in self.computed:
            t = nums[spec[0]]
            cell = done.get(t)
            if cell is None:
                if len(done) > 4096:
                    done.clear()
                cell = done[t] = cell_of(spec, nums)
            cols.append(c)
            vals.append(cell)


def _csv(rec: Recording, out: IO[str], t0: float | None, t1: float | None, wanted: set[str],
         workers: int | None, progress: Progress | None, written: list[int]) -> None:
    # Columns are found while reading; the header, known only at the end, is written first when the pieces'
    # rows are copied out with their column numbers made global.
    with tempfile.TemporaryDirectory(prefix="dltop-dump-") as scratch:
        local = _run_pieces(rec, "csv", t0, t1, wanted, scratch, workers, progress)
        columns: dict[str, int] = {}
        for names in local:
            for name in names:
                columns.setdefault(name, len(columns))
        header = io.StringIO()
        csv.writer(header, lineterminator="\n").writerow(["ts", *columns])
        out.write(header.getvalue())  # one write: a line is whole or not there
        written[0] += 1
        for k, names in enumerate(local):
            to_global = [columns[n] for n in names]
            with open(os.path.join(scratch, str(k)), encoding="utf-8") as rows:
                if to_global == list(range(len(names))):  # the usual case: the piece's columns come first
                    pad = "," * (len(columns) - len(names))
                    for line in rows:
                        ts, _, rest = line.rstrip("\n").partition(",")
                        out.write(f"{ts},{_pad(rest, len(names))}{pad}\n" if columns else f"{ts}\n")
                        written[0] += 1
                    continue
                for line in rows:
                    ts, *mine = line.rstrip("\n").split(",")
                    cells = [""] * len(columns)
                    for c, v in enumerate(mine):
                        cells[to_global[c]] = v
                    out.write(f"{ts},{','.join(cells)}\n")
                    written[0] += 1


def _pad(cells: str, n: int) -> str:
    """A piece's row of `n` cells: its early rows, written before later series were first seen, have fewer."""
    short = n - 1 - cells.count(",") if n else 0
    return cells + "," * short if short > 0 else cells


# One formatting for the cells read whole and those a template gives: two copies must never drift apart.
_number = template.number


def _openmetrics(rec: Recording, out: IO[str], t0: float | None, t1: float | None, wanted: set[str],
                 workers: int | None, progress: Progress | None, written: list[int]) -> None:
    # OpenMetrics wants each family's samples together, and within it each label set's: one file per series
    # and piece, joined family by family, series by series, piece by piece (time order).
    with tempfile.TemporaryDirectory(prefix="dltop-dump-") as scratch:
        local = _run_pieces(rec, "openmetrics", t0, t1, wanted, scratch, workers, progress)
        where = [{entry: k for k, entry in enumerate(names)} for names in local]
        families: dict[str, list[str]] = {}
        for names in local:
            for entry in names:
                field_name, _, _ = entry.partition("\t")
                series = families.setdefault(field_name, [])
                if entry not in series:
                    series.append(entry)
        for name, entries in families.items():
            f = fd.BY_NAME[name]
            family = fd.PREFIX + _family(f)
            out.write(f"# TYPE {family} {f.kind}\n# HELP {family} {_help(f.help)}\n")
            written[0] += 2
            for entry in entries:
                for k, index in enumerate(where):
                    if entry in index:
                        _copy_lines(os.path.join(scratch, str(k), str(index[entry])), entry.partition("\t")[2],
                                    out, written)
    out.write("# EOF\n")
    written[0] += 1


_PLAIN = bytes(range(0x20, 0x7F)) + b"\n"  # text the CLI's EscapingWriter passes as it is


def _copy_lines(path: str, series: str, out: IO[str], written: list[int]) -> None:
    """Copy a piece's file of `value ts` lines as `series value ts` lines, in large writes that each end at a
    line's end (an interrupted copy stops between two). Where `out` is (or escapes into) a stream with a binary
    buffer (stdout), and the series' name is plain printable ASCII (so the escaping would pass it unchanged), as
    bytes; else as text through `out`."""
    raw = out.raw if isinstance(out, EscapingWriter) else out
    binary = getattr(raw, "buffer", None)
    head = f"{series} "
    if binary is None or head.encode("utf-8").translate(None, _PLAIN):
        with open(path, encoding="ascii") as text:
            _copy_blocks(text, head, out.write, written)
        return
    out.flush()
    with open(path, "rb") as src:
        _copy_blocks(src, head.encode("ascii"), binary.write, written)
    binary.flush()


def _copy_blocks(src: Any, head: Any, write: Callable[[Any], Any], written: list[int]) -> None:
    nl = head[:0] + ("\n" if isinstance(head, str) else b"\n")
    rest = nl[:0]
    while block := src.read(1 << 20):
        block = rest + block
        end = block.rfind(nl) + 1
        rest = block[end:]
        if end:
            write(head + block[:end - 1].replace(nl, nl + head) + nl)
            written[0] += block.count(nl, 0, end)
    if rest:  # not written by a piece (each line ends in one): kept as it is
        write(head + rest + nl)
        written[0] += 1


def _family(f: fd.Field) -> str:
    """The metric family of a field: counters' samples end in _total, info metrics' in _info."""
    if f.kind == "counter":
        return f.name.removesuffix("_total")
    if f.kind == "info":
        return f.name.removesuffix("_info")
    return f.name


def _help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")

