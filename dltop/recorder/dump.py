"""`dltop dump`: a recording as JSON Lines, CSV or OpenMetrics, with column and metric names from `dltop.fields`.

jsonl is one Snapshot per line (`dltop snapshot --json`'s structure). csv is one row per sample, a `ts` column
then one column per series (`gpu_memory_used_bytes{gpu="0",uuid="GPU-..."}`), gauges and counters only unless
--fields names an info field. openmetrics is what `promtool tsdb create-blocks-from openmetrics` takes: each
metric family's samples together (the format requires it), with timestamps, and `# EOF`. Hints come from the
recording's hint events (fired / cleared), so the hints a dump shows are the ones the recorder saw.
"""

from __future__ import annotations

import csv
import fnmatch
import json
import math
import os
import tempfile
from collections.abc import Iterator
from typing import IO

from dltop import fields as fd
from dltop.errors import DltopError
from dltop.model import Snapshot
from dltop.recorder.reader import Recording

SeriesKey = tuple[str, tuple[tuple[str, str], ...]]


def dump(rec: Recording, fmt: str, out: IO[str], t0: float | None = None, t1: float | None = None,
         names: list[str] | None = None) -> None:
    """Write the samples of `rec` between t0 and t1 to `out` in `fmt` ("jsonl", "csv", "openmetrics")."""
    if fmt == "jsonl":
        _jsonl(rec, out, t0, t1, names)
    elif fmt == "csv":
        _csv(rec, out, t0, t1, _wanted(names, csv=True))
    elif fmt == "openmetrics":
        _openmetrics(rec, out, t0, t1, _wanted(names, csv=False))
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


def samples(rec: Recording, t0: float | None, t1: float | None,
            wanted: set[str]) -> Iterator[tuple[Snapshot, list[fd.Sample]]]:
    """Each Snapshot of the range with its samples (fields.samples, and hint_active from the hint events)."""
    hints = _HintTimeline(rec)
    prev: Snapshot | None = None
    for snap in rec.range(t0, t1):
        active = hints.at(snap.ts)
        got = [s for s in (*fd.samples(snap, prev), *fd.hint_samples(active)) if s[0].name in wanted]
        yield snap, got
        prev = snap


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


class _Hint:
    def __init__(self, id: str, severity: str) -> None:
        self.id = id
        self.severity = severity


def _jsonl(rec: Recording, out: IO[str], t0: float | None, t1: float | None, parts: list[str] | None) -> None:
    keep = None
    if parts:
        known = set(Snapshot.__dataclass_fields__)
        bad = [p for p in parts if p not in known]
        if bad:
            raise DltopError(f"--fields with jsonl names Snapshot parts: {bad[0]!r} is not one "
                             f"({', '.join(sorted(known))})")
        keep = {"ts", "host", "schema", *parts}
    for snap in rec.range(t0, t1):
        if keep is None:
            out.write(snap.to_json() + "\n")
        else:
            out.write(json.dumps({k: v for k, v in snap.to_dict().items() if k in keep}) + "\n")


def series_name(name: str, labels: dict[str, str]) -> str:
    """`name{label="value",...}`, labels in their order, values escaped as the Prometheus text format does."""
    if not labels:
        return name
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    return f"{name}{{{inner}}}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _csv(rec: Recording, out: IO[str], t0: float | None, t1: float | None, wanted: set[str]) -> None:
    # One pass: rows go to a scratch file as {column index: value} while columns are discovered; the header,
    # known only at the end, is written first when the rows are copied out.
    columns: dict[SeriesKey, int] = {}
    names: list[str] = []
    with tempfile.TemporaryFile("w+", encoding="utf-8") as scratch:
        for snap, got in samples(rec, t0, t1, wanted):
            row: dict[int, float] = {}
            for f, labels, value in got:
                key = (f.name, tuple(labels.items()))
                i = columns.get(key)
                if i is None:
                    i = columns[key] = len(names)
                    names.append(series_name(f.name, labels))
                row[i] = value
            scratch.write(json.dumps([snap.ts, row]) + "\n")
        scratch.seek(0)
        w = csv.writer(out, lineterminator="\n")
        w.writerow(["ts", *names])
        for line in scratch:
            ts, row = json.loads(line)
            cells = [""] * len(names)  # a series absent at this moment is an empty cell, never a 0
            for i, v in row.items():
                cells[int(i)] = _number(v)
            w.writerow([_number(ts), *cells])


def _number(v: float) -> str:
    if isinstance(v, float) and v.is_integer() and abs(v) < 2**53:
        return str(int(v))
    return repr(v)


def _openmetrics(rec: Recording, out: IO[str], t0: float | None, t1: float | None, wanted: set[str]) -> None:
    # OpenMetrics wants each family's samples together: one scratch file per family, then concatenated.
    with tempfile.TemporaryDirectory(prefix="dltop-dump-") as scratch:
        files: dict[str, IO[str]] = {}
        order: list[fd.Field] = []
        try:
            for snap, got in samples(rec, t0, t1, wanted):
                ts = _number(snap.ts)
                for f, labels, value in got:
                    if not math.isfinite(value):
                        continue
                    fh = files.get(f.name)
                    if fh is None:
                        fh = files[f.name] = open(os.path.join(scratch, f.name), "w", encoding="utf-8")  # noqa: SIM115
                        order.append(f)
                    fh.write(f"{series_name(fd.PREFIX + f.name, labels)} {_number(value)} {ts}\n")
        finally:
            for fh in files.values():
                fh.close()
        for f in order:
            family = fd.PREFIX + _family(f)
            out.write(f"# TYPE {family} {f.kind}\n# HELP {family} {_help(f.help)}\n")
            with open(os.path.join(scratch, f.name), encoding="utf-8") as fh:
                for line in fh:
                    out.write(line)
    out.write("# EOF\n")


def _family(f: fd.Field) -> str:
    """The metric family of a field: counters' samples end in _total, info metrics' in _info."""
    if f.kind == "counter":
        return f.name.removesuffix("_total")
    if f.kind == "info":
        return f.name.removesuffix("_info")
    return f.name


def _help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")

