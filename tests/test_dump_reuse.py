"""A dump that takes a sample's unchanged parts from the sample before (recorder/reuse.py) writes what reading
every line whole writes: the same Snapshots, the same damage, the same CSV to the byte; and `dltop dump`'s
progress line and its Ctrl-C."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dltop import fields
from dltop.model import Snapshot, Unavailable
from dltop.recorder import Recorder, Recording, dump, store, template  # dump: the module
from dltop.recorder.reuse import PartMemo
from dltop.recorder.segment import Chunk, decompress_segment
from tests.test_recorder import sampled

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = REPO / "tests" / "data" / "gpu-scenarios"


def reference_csv(path: str) -> tuple[str, str]:
    """The CSV as dump wrote it before parts were reused: every line read whole, every sample's fields
    extracted, columns in first-seen order, an absent series an empty cell; and the damage note."""
    rec = Recording(path)
    wanted = {f.name for f in fields.FIELDS if f.kind != "info"}
    hints = dump._HintTimeline(rec)
    names: list[str] = []
    columns: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}
    rows = []
    prev = None
    for snap in rec.range():
        got = [s for s in (*fields.samples(snap, prev), *fields.hint_samples(hints.at(snap.ts)))
               if s[0].name in wanted]
        cells: dict[int, str] = {}
        for f, labels, value in got:
            c = columns.setdefault((f.name, tuple(labels.items())), len(names))
            if c == len(names):
                names.append(dump.series_name(f.name, labels))
            cells[c] = template.number(value)
        rows.append([template.number(snap.ts), cells])
        prev = snap
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerow(["ts", *names])
    for ts, cells in rows:
        out.write(",".join([ts, *(cells.get(c, "") for c in range(len(names)))]) + "\n")
    return out.getvalue(), rec.damage.note()


def fast_csv(path: str, workers: int = 1) -> tuple[str, str]:
    """The CSV dump writes now, and its damage note."""
    rec = Recording(path)
    out = io.StringIO()
    dump.dump(rec, "csv", out, workers=workers)
    return out.getvalue(), rec.damage.note()


def varied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Snapshot]:
    """Real Snapshots with parts that repeat, change, go unavailable, come back and go missing; GPU processes
    that start and end (another scenario's GPUs)."""
    snaps = sampled(tmp_path, monkeypatch, n=10)
    (tmp_path / "b").mkdir()
    other = sampled(tmp_path / "b", monkeypatch, n=2, scenario="8gpu-20proc")
    out = []
    for i, s in enumerate(snaps):
        if i in (2, 3):  # the same part text twice in a row, then a change
            s = dataclasses.replace(s, memory=snaps[1].memory, gpus=snaps[1].gpus)
        if i == 4:
            s = dataclasses.replace(s, gpus=Unavailable("NVML_ERROR_GPU_IS_LOST"), probes=None)
        if i == 5:
            s = dataclasses.replace(s, gpus=other[0].gpus, memory=Unavailable("no /proc/meminfo"))
        if i == 6:
            s = dataclasses.replace(s, gpus=other[1].gpus, caches=None)
        out.append(s)
    return out


def checked(text: str) -> bytes:
    """A recorded line with its checksum, as the writer ends it."""
    body = text.encode("utf-8")[:-1]
    return body + b',"crc":"%08x"}\n' % zlib.crc32(body)


def hostile(rec_dir: Path, out_dir: Path) -> None:
    """An open segment: the recording's lines, then sample lines written by no dltop that still pass their
    checksum, each made from a real one: what reading part by part must judge as reading the line whole does."""
    raw = b""
    for stem, suffix in store.list_segments(str(rec_dir)):
        data = (rec_dir / (stem + suffix)).read_bytes()
        raw += decompress_segment(data)[0] if suffix == store.CLOSED_SUFFIX else data
    lines = [store.check_line(line)[0] for line in raw.splitlines()]
    sample = json.loads(next(line for line in reversed(lines) if b'"type":"sample"' in line))
    ts = sample["ts"]

    def line(edit: object = None, text: object = None) -> bytes:
        nonlocal ts
        ts += 1
        body = json.loads(json.dumps(sample))
        body["ts"] = body["snap"]["ts"] = ts
        if callable(edit):
            edit(body["snap"])
        t = store.encode_line(ts, "sample", {k: v for k, v in body.items() if k not in ("ts", "type")},
                              checksum=False).decode("utf-8").rstrip("\n")
        return checked(text(t) if callable(text) else t)

    def gpu0(snap: dict, key: str, value: object) -> None:
        snap["gpus"][0][key] = value

    made = [
        line(),  # as it was (its parts reused from the line before)
        line(),
        # a negative size: refused, with a legitimately negative number elsewhere in the line, or none
        line(lambda s: (s["memory"].update(cached_bytes=-4096), gpu0(s, "zz_delta", -1))),
        line(lambda s: s["memory"].update(cached_bytes=-4096)),
        # ... with spacing before it, and a negative number in another part (the line is checked whole)
        line(lambda s: gpu0(s, "zz_delta", -1), lambda t: t.replace('"cached_bytes":', '"cached_bytes": -1 , "x":', 1)),
        line(),
        # a 20-digit int beyond 2**64 (refused where the line holds a 21-digit run or a negative number)
        line(lambda s: (s["memory"].update(total_bytes=99999999999999999999),
                        gpu0(s, "name", "GPU 123456789012345678901"))),
        line(lambda s: s["memory"].update(total_bytes=99999999999999999999)),
        line(lambda s: s["memory"].update(total_bytes="lots")),  # the wrong type
        line(text=lambda t: t.replace('"cached_bytes":', '"cached_bytes":1e400,"y":', 1)),  # beyond any number
        line(text=lambda t: t.replace('"cached_bytes":', '"cached_bytes":1e30,"y":', 1)),
        line(text=lambda t: t.replace('"cached_bytes":', '"cached_bytes":NaN,"y":', 1)),
        line(lambda s: s.update(ts=1.0)),  # its time is not its line's
        line(lambda s: s.update(host_b64="dm3/")),  # a host name that is not UTF-8
        line(lambda s: s.update(zz_newer_part={"a": 1})),  # a newer writer's part
        line(text=lambda t: t.replace(',"gpus":', ',"memory":null,"gpus":', 1)),  # a key twice: the last counts
        line(text=lambda t: t.replace('"memory":', '"memory" : ', 1)),  # spacing
        line(),
        line(lambda s: s.update(memory={"unavailable": "gone"})),
        line(lambda s: s.pop("memory")),
        line(),
    ]
    out_dir.mkdir(mode=0o700)
    (out_dir / "20261201T000000Z.jsonl").write_bytes(b"".join(checked(line.decode("utf-8")) for line in lines)
                                                      + b"".join(made))


@pytest.fixture(scope="module")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """A real recording (closed segments of 3-sample frames, a hint event) and its hostile copy."""
    tmp_path = tmp_path_factory.mktemp("reuse")
    rec_dir = tmp_path / "rec"
    with pytest.MonkeyPatch.context() as monkeypatch, Recorder(str(rec_dir), block_samples=3) as rec:
        for i, s in enumerate(varied(tmp_path, monkeypatch)):
            rec.write(s)
            if i == 3:
                rec.event("hint", {"id": "memory.dirty", "state": "fired", "severity": "warn", "numbers": {}},
                          ts=s.ts)
    hostile(rec_dir, tmp_path / "hostile")
    return [str(rec_dir), str(tmp_path / "hostile")]


def test_reusing_parts_reads_the_same_snapshots_and_damage(recordings: list[str]) -> None:
    for path in recordings:
        whole, by_parts = Recording(path), Recording(path)
        memo = PartMemo()
        expected = list(whole.range())
        assert list(by_parts.range(memo=memo)) == expected
        assert by_parts.damage.note() == whole.damage.note()
        assert memo.reused > 0 and memo.parsed > 0
    assert memo.gave_up >= 6  # the hostile lines went the ordinary way
    assert "sample" in whole.damage.counts()


@pytest.mark.parametrize("workers", [1, 2])
def test_the_csv_is_the_same_to_the_byte(recordings: list[str], workers: int,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dump, "MIN_PER_WORKER", 4)  # pieces even for a short recording
    for path in recordings:
        text, note = fast_csv(path, workers)
        assert (text, note) == reference_csv(path)
    rows = list(csv.reader(io.StringIO(text)))
    assert len(rows) > 20 and "" in rows[5]  # missing parts are empty cells


TRIED = [0]
VALUES = ["-1", " -1", "[-1]", "1e400", "1e30", "99999999999999999999", "1" + "0" * 25, '"x"', "null", "true", "NaN",
          "[]", "{}", "1.5", "-0.0", "0"]


def lines_of(path: str) -> list[bytes]:
    """Every line of a recording's segments, without checksums."""
    raw = b""
    for stem, suffix in store.list_segments(path):
        data = (Path(path) / (stem + suffix)).read_bytes()
        raw += decompress_segment(data)[0] if suffix == store.CLOSED_SUFFIX else data
    return [store.check_line(line)[0] for line in raw.splitlines()]


def outcome(read: object) -> tuple[str, str]:
    try:
        return "ok", read().to_json()  # type: ignore[operator]
    except Exception as e:  # noqa: BLE001 - what the reader raised is what is compared
        return type(e).__name__, str(e)


@settings(max_examples=150, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_fuzz_reusing_parts_against_reading_lines_whole(recordings: list[str], data: st.DataObject) -> None:
    # A real sample line after the one before it, changed one to three times (a number made hostile, a size made
    # negative, spacing, a key doubled, renamed, inserted or given a `_b64` sibling, a cut), under a valid
    # checksum: reading it with the parts of the line before gives what reading it whole gives, the same
    # Snapshot or the same error.
    TRIED[0] += 1
    lines = lines_of(recordings[0])
    samples = [i for i, line in enumerate(lines) if b'"type":"sample"' in line]
    k = data.draw(st.integers(1, len(samples) - 1))
    head, prev, text = lines[:samples[k - 1]], lines[samples[k - 1]], lines[samples[k]].decode("utf-8")
    head = [line for line in head if b'"type":"sample"' not in line]  # the parts and meta in force
    for _ in range(data.draw(st.integers(1, 3))):
        how = data.draw(st.sampled_from(["number", "unsigned", "space", "key", "insert", "cut"]))
        if how == "unsigned":  # a negative number where none may be, written in one of the ways JSON allows
            spans = [m.span(2) for m in re.finditer(r'"([a-z_]+)":(-?\d[\d.eE+-]*)', text) if m.group(1) in store._UNSIGNED]
            a, b = spans[data.draw(st.integers(0, len(spans) - 1))]
            text = text[:a] + data.draw(st.sampled_from(["-1", " -1", "  -1", "\n\t-1", "-1e400"])) + text[b:]
        elif how == "insert":  # a Snapshot key before another key: twice in one object, either one first
            spots = [m.start() for m in re.finditer(r'(?<=[{,])"[a-z_]+":', text)]
            at = spots[data.draw(st.integers(0, len(spots) - 1))]
            name = data.draw(st.sampled_from(sorted(Snapshot.__dataclass_fields__)))
            text = text[:at] + f'"{name}":' + data.draw(st.sampled_from(VALUES)) + "," + text[at:]
        elif how == "number":
            spans = [m.span() for m in re.finditer(r"(?<=[:,\[])-?\d[\d.eE+-]*", text)]
            a, b = spans[data.draw(st.integers(0, len(spans) - 1))]
            text = text[:a] + data.draw(st.sampled_from(VALUES)) + text[b:]
        elif how == "space":
            spots = [m.end() for m in re.finditer(r'":|,(?=")', text)]
            at = spots[data.draw(st.integers(0, len(spots) - 1))]
            text = text[:at] + data.draw(st.sampled_from([" ", "  ", "\n", " \t "])) + text[at:]
        elif how == "key":
            keys = list(re.finditer(r'"([a-z_]+)":', text))
            m = keys[data.draw(st.integers(0, len(keys) - 1))]
            name = m.group(1)
            new = data.draw(st.sampled_from([f'"{name}":null,"{name}":', f'"zz_{name}":', f'"{name}_b64":"eA==","{name}":']))
            text = text[:m.start()] + new + text[m.end():]
        else:
            at = data.draw(st.integers(0, len(text) - 1))
            text = text[:at] + text[at + data.draw(st.integers(1, 20)):]
    chunk = Chunk.scan(b"".join(checked(line.decode("utf-8")) for line in [*head, prev]) + checked(text))
    memo = PartMemo()
    for n in range(len(chunk.samples)):
        assert outcome(lambda: chunk.snapshot(n, memo)) == outcome(lambda: chunk.snapshot(n))  # noqa: B023
    assert memo.reused or len(chunk.samples) < 2 or memo.gave_up


def test_fuzz_count() -> None:
    print(f"\nfuzzed (inputs): {TRIED[0]} sample lines, each read with the parts of the line before and whole")
    assert TRIED[0] > 0


def test_the_progress_line_and_an_interrupted_dump(recordings: list[str], tmp_path: Path) -> None:
    path = recordings[0]
    # A terminal on stderr gets the progress line; -q none.
    script = ("import pty, os, sys\n"
              "pid, fd = pty.fork()\n"
              "if pid == 0:\n"
              "    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)\n"
              "    os.execv(sys.executable, [sys.executable, '-m', 'dltop', 'dump', sys.argv[1], '--format', 'csv',"
              " *sys.argv[2:]])\n"
              "out = b''\n"
              "while True:\n"
              "    try:\n"
              "        chunk = os.read(fd, 4096)\n"
              "    except OSError:\n"
              "        break\n"
              "    if not chunk:\n"
              "        break\n"
              "    out += chunk\n"
              "os.waitpid(pid, 0)\n"
              "sys.stdout.write(out.decode('utf-8', 'replace'))\n")
    shown = subprocess.run([sys.executable, "-c", script, path], capture_output=True, text=True, timeout=120,
                           cwd=REPO)
    assert "dltop dump: reading 0 of 10 samples (0%)" in shown.stdout, shown
    quiet = subprocess.run([sys.executable, "-c", script, path, "-q"], capture_output=True, text=True, timeout=120,
                           cwd=REPO)
    assert "reading" not in quiet.stdout
    # Ctrl-C (SIGINT to the process group, as a terminal sends it) while reading, and while writing: one line
    # that says what reached stdout, no traceback, and no line cut.
    slow = tmp_path / "slow.py"
    slow.write_text("import sys, time, pathlib\n"
                    "from dltop.recorder import dump, reader\n"
                    "flag = pathlib.Path(sys.argv[2])\n"
                    "def slowly(f):\n"
                    "    def inner(*a, **k):\n"
                    "        flag.touch()\n"
                    "        time.sleep(0.3)\n"
                    "        return f(*a, **k)\n"
                    "    return inner\n"
                    "if sys.argv[3] == 'reading':\n"
                    "    reader.Recording._snapshot = slowly(reader.Recording._snapshot)\n"
                    "else:\n"
                    "    dump._pad = slowly(dump._pad)\n"
                    "from dltop.cli import main\n"
                    "sys.exit(main(['dump', sys.argv[1], '--format', 'csv']))\n")
    for phase in ("reading", "writing"):
        flag = tmp_path / f"{phase}.started"
        with open(tmp_path / "out.csv", "w") as out:
            p = subprocess.Popen([sys.executable, str(slow), path, str(flag), phase], stdout=out,
                                 stderr=subprocess.PIPE, text=True, start_new_session=True, cwd=REPO,
                                 env={**os.environ, "PYTHONPATH": str(REPO)})
            for _ in range(1200):  # the dump has started that phase (a busy node may take seconds to get there)
                if flag.exists() or p.poll() is not None:
                    break
                time.sleep(0.05)
            time.sleep(0.5)
            os.killpg(p.pid, signal.SIGINT)
            _, err = p.communicate(timeout=60)
        written = (tmp_path / "out.csv").read_text()
        assert p.returncode == 130, err
        if phase == "reading":
            assert err == "dltop dump: interrupted (nothing written)\n"
            assert written == ""
        else:
            n = written.count("\n")
            assert err == f"dltop dump: interrupted ({n:,} {'line' if n == 1 else 'lines'} written, the last one whole)\n"
            assert 1 <= n < 11 and written.endswith("\n")
            rows = list(csv.reader(io.StringIO(written)))
            assert all(len(row) == len(rows[0]) for row in rows)
