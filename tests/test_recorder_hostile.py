"""Recordings are hostile input: a real recording from the real writer, damaged the way a disk, a copy or a person
does it (an index edited, a digit changed, a line cut, NaN, huge numbers, deep nesting), read by the real CLI and
by each reader under fuzzing: what is intact is read, what is not is counted in one line, never a traceback."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dltop.cli import main
from dltop.config import Settings
from dltop.errors import DltopError
from dltop.fmt import human_bytes
from dltop.model import MemoryPart, Snapshot
from dltop.recorder import Recorder, Recording, store
from dltop.recorder.report import report
from dltop.recorder.segment import Chunk
from dltop.sampler import Sampler
from dltop.sources.registry import build_sources
from tests.conftest import REPO

SCENARIO = REPO / "tests" / "data" / "gpu-scenarios" / "h100-2proc.json"
GIB = 1 << 30


@functools.cache
def real_snapshots(n: int = 6) -> tuple[Snapshot, ...]:
    """Snapshots of this machine from the real Sampler (GPUs from an NVML scenario), each with its own page
    cache size so that one of them is the peak."""
    old = os.environ.get("DLTOP_FAKE_NVML")
    os.environ["DLTOP_FAKE_NVML"] = str(SCENARIO)
    sampler = Sampler(build_sources(Settings()))
    try:
        snaps = [sampler.read_once() for _ in range(n)]
    finally:
        sampler.close()
        if old is None:
            del os.environ["DLTOP_FAKE_NVML"]
        else:
            os.environ["DLTOP_FAKE_NVML"] = old
    out = []
    for i, s in enumerate(snaps):
        assert isinstance(s.memory, MemoryPart)
        cached = s.memory.cached_bytes + (i * 7 % n) * GIB  # the peak is not the last sample
        out.append(dataclasses.replace(s, ts=s.ts + i, memory=dataclasses.replace(s.memory, cached_bytes=cached)))
    return tuple(out)


def record(directory: Path, snaps: tuple[Snapshot, ...], block_samples: int = 2) -> Path:
    """A closed recording of `snaps`, written by the real Recorder."""
    with Recorder(str(directory), block_samples=block_samples, retain_s=None, max_bytes=None) as rec:
        for s in snaps:
            rec.write(s, wait=True)
    return directory


def record_crashed(directory: Path, snaps: tuple[Snapshot, ...]) -> Path:
    """The open segment as a recorder killed after writing `snaps` leaves it: the real writer's lines, copied
    while it was still recording."""
    with tempfile.TemporaryDirectory() as tmp, Recorder(tmp, retain_s=None, max_bytes=None) as rec:
        for s in snaps:
            rec.write(s, wait=True)
        deadline = time.time() + 30
        while rec.samples < len(snaps) and time.time() < deadline:
            time.sleep(0.01)
        directory.mkdir(mode=0o700)
        (seg,) = [p for p in Path(tmp).iterdir() if p.name.endswith(store.OPEN_SUFFIX)]
        shutil.copy(seg, directory / seg.name)
    return directory


def only(directory: Path, suffix: str) -> Path:
    (path,) = [p for p in directory.iterdir() if p.name.endswith(suffix)]
    return path


def dltop(*args: str) -> tuple[int, str, str]:
    """The real CLI, in this process (`python -m dltop` is `main`): exit status, stdout, stderr."""
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def one_line(stderr: str, *words: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    for w in words:
        assert w in stderr, stderr
    return lines[0]


def without_checksum(line: bytes) -> bytes:
    """A line as a dltop before per-line checksums wrote it."""
    return re.sub(rb',"crc":"[0-9a-f]{8}"\}$', b"}", line.rstrip(b"\n")) + b"\n"


def dumped(stdout: str) -> list[Snapshot]:
    return [Snapshot.from_json(line) for line in stdout.splitlines()]


# -- a damaged index ------------------------------------------------------------------------------------------


def _flip_b64(index: dict[str, Any]) -> None:
    ts = index["blocks"][1]["ts"]
    index["blocks"][1]["ts"] = ("B" if ts[5] != "B" else "C").join((ts[:5], ts[6:]))  # still base64


INDEX_DAMAGE = {
    "a base64 character changed": _flip_b64,
    "base64 made invalid": lambda ix: ix["blocks"][0].update(ts="!!" + ix["blocks"][0]["ts"][2:]),
    "a negative block size": lambda ix: ix["blocks"][1].update(size=-ix["blocks"][1]["size"]),
    "a string where an offset goes": lambda ix: ix["blocks"][1].update(offset=str(ix["blocks"][1]["offset"])),
    "an offset one off": lambda ix: ix["blocks"][2].update(offset=ix["blocks"][2]["offset"] + 1),
    "a huge size": lambda ix: ix["blocks"][0].update(size=10**30),
    "skipped negative": lambda ix: ix.update(skipped=-3),
    "an event's time NaN": lambda ix: ix["events"][0].__setitem__(0, float("nan")),
    "an event's data nested deep": lambda ix: ix["events"][0].__setitem__(2, functools.reduce(
        lambda d, _: {"x": d}, range(5000), {})),
    "a sample time changed": lambda ix: ix["blocks"][0].update(last_ts=ix["blocks"][0]["last_ts"] + 1),
}


@pytest.mark.parametrize("damage", list(INDEX_DAMAGE))
def test_a_damaged_index_is_read_around(tmp_path: Path, damage: str) -> None:
    snaps = real_snapshots()
    rec_dir = record(tmp_path / "rec", snaps)
    idx = only(rec_dir, store.INDEX_SUFFIX)
    index = json.loads(idx.read_text())
    assert len(index["blocks"]) >= 3
    INDEX_DAMAGE[damage](index)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20000)  # to write the deep one
    try:
        idx.write_text(json.dumps(index))
    finally:
        sys.setrecursionlimit(limit)

    code, out, err = dltop("dump", str(rec_dir), "--format", "jsonl")
    assert code == 0
    assert dumped(out) == list(snaps)  # the frames are intact: every sample read, by scanning them
    one_line(err, "dltop dump:", "1 damaged index read around", only(rec_dir, store.CLOSED_SUFFIX).name)
    code, out, err = dltop("report", str(rec_dir))
    assert code == 0 and human_bytes(max(s.memory.cached_bytes for s in snaps)) in out  # type: ignore[union-attr]
    assert "damaged: 1 damaged index read around" in out
    one_line(err, "dltop report:", "damaged index")
    assert [e.kind for e in Recording(str(rec_dir)).events()].count("stop") == 1  # events from the frames


def test_a_damaged_index_and_frame_on_the_real_command_line(tmp_path: Path) -> None:
    # `python -m dltop` as a user runs it: an index entry that no longer fits and a frame with a byte flipped
    # inside. The frames after the damaged one are found again; the one is counted.
    snaps = real_snapshots()
    rec_dir = record(tmp_path / "rec", snaps)
    idx, zst = only(rec_dir, store.INDEX_SUFFIX), only(rec_dir, store.CLOSED_SUFFIX)
    index = json.loads(idx.read_text())
    index["blocks"][0]["ts"] = index["blocks"][0]["ts"][:-3] + "@=="
    idx.write_text(json.dumps(index))
    data = bytearray(zst.read_bytes())
    b1 = index["blocks"][1]
    data[b1["offset"] + b1["size"] // 2] ^= 0x40
    zst.write_bytes(bytes(data))
    for cmd in (["dump", "--format", "csv"], ["report"], ["replay"]):
        r = subprocess.run([sys.executable, "-m", "dltop", cmd[0], str(rec_dir), *cmd[1:]], cwd=REPO,
                           capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
        if cmd[0] == "replay":  # no terminal here: one line saying so, not a traceback from the index
            assert r.returncode == 1
            one_line(r.stderr, "terminal")
            continue
        assert r.returncode == 0, r.stderr
        one_line(r.stderr, "skipped 1 frame", "1 damaged index read around")
        if cmd[0] == "dump":
            rows = r.stdout.splitlines()[1:]
            assert [float(row.split(",")[0]) for row in rows] == [s.ts for s in snaps[:2] + snaps[4:]]


def test_a_truncated_index_is_read_around(tmp_path: Path) -> None:
    snaps = real_snapshots()
    rec_dir = record(tmp_path / "rec", snaps)
    idx = only(rec_dir, store.INDEX_SUFFIX)
    idx.write_bytes(idx.read_bytes()[:-40])
    code, out, err = dltop("dump", str(rec_dir))
    assert code == 0 and dumped(out) == list(snaps)
    one_line(err, "damaged index read around", "not JSON")


# -- the open segment's per-line checksums ---------------------------------------------------------------------


def _change_a_digit(line: bytes, key: bytes) -> bytes:
    """The line with the first digit of `"key":N` made one bigger (a 1 before a 9 when it is 9)."""
    m = re.search(rb'"' + key + rb'":(\d)', line)
    assert m is not None
    d = m.group(1)[0]
    new = b"1" + bytes([d]) if d == ord("9") else bytes([d + 1])
    return line[: m.start(1)] + new + line[m.end(1):]


def _peak_line(path: Path, snaps: tuple[Snapshot, ...]) -> tuple[list[bytes], int, int]:
    lines = path.read_bytes().splitlines(keepends=True)
    peak = max(range(len(snaps)), key=lambda i: snaps[i].memory.cached_bytes)  # type: ignore[union-attr]
    at = [i for i, ln in enumerate(lines) if b'"type":"sample"' in ln][peak]
    return lines, at, peak


def test_one_digit_changed_in_the_open_segment_is_caught_not_a_wrong_peak(tmp_path: Path) -> None:
    snaps = real_snapshots()
    rec_dir = record_crashed(tmp_path / "rec", snaps)
    seg = only(rec_dir, store.OPEN_SUFFIX)
    lines, at, peak = _peak_line(seg, snaps)
    wrong = bytearray(_change_a_digit(lines[at], b"cached_bytes"))
    lines[at] = bytes(wrong)
    seg.write_bytes(b"".join(lines))
    code, out, err = dltop("report", str(rec_dir))
    assert code == 0
    rest = [s for i, s in enumerate(snaps) if i != peak]
    assert f"{human_bytes(max(s.memory.cached_bytes for s in rest)):>24}" in out  # type: ignore[union-attr]
    one_line(err, "skipped 1 damaged line", "checksum does not match")
    code, out, err = dltop("dump", str(rec_dir))
    assert dumped(out) == rest


def test_crash_recovery_does_not_seal_a_line_whose_checksum_fails(tmp_path: Path) -> None:
    snaps = real_snapshots()
    rec_dir = record_crashed(tmp_path / "rec", snaps)
    seg = only(rec_dir, store.OPEN_SUFFIX)
    lines, at, peak = _peak_line(seg, snaps)
    lines[at] = _change_a_digit(lines[at], b"cached_bytes")
    seg.write_bytes(b"".join(lines))
    Recorder(str(rec_dir), retain_s=None, max_bytes=None).close()  # the next recorder seals what was left open
    index = json.loads(seg.with_name(seg.name.removesuffix(store.OPEN_SUFFIX) + store.INDEX_SUFFIX).read_text())
    assert index["skipped"] == 1 and index["samples"] == len(snaps) - 1
    r = Recording(str(rec_dir))
    assert list(r.range()) == [s for i, s in enumerate(snaps) if i != peak]
    assert r.damage.total == 1 and "when the recorder closed" in r.damage.note()


def test_lines_without_a_checksum_from_an_older_dltop_read_as_before(tmp_path: Path) -> None:
    snaps = real_snapshots()
    rec_dir = record_crashed(tmp_path / "rec", snaps)
    seg = only(rec_dir, store.OPEN_SUFFIX)
    new_lines = seg.read_bytes().splitlines()
    old = []
    for line in new_lines:
        body, ok = store.check_line(line)
        assert ok is True  # every line the writer writes carries its checksum
        d = json.loads(body)
        old.append(store.encode_line(d.pop("ts"), d.pop("type"), d, checksum=False))
        assert old[-1] == without_checksum(line)
    seg.write_bytes(b"".join(old))
    r = Recording(str(rec_dir))
    assert list(r.range()) == list(snaps) and r.damage.total == 0
    # In a segment whose lines have checksums, a line without one had it cut or changed: it is damage.
    cut = new_lines[:]
    cut[3] = store.check_line(cut[3])[0]
    seg.write_bytes(b"\n".join(cut) + b"\n")
    r = Recording(str(rec_dir))
    assert r.damage.total == 1 and "no checksum" in r.damage.note()


# -- values a recording must not hand a pane ---------------------------------------------------------------------

BAD_VALUES = {
    "NaN": b"NaN", "Infinity": b"-Infinity", "1e400": b"1e400", "negative": b"-4096", "10**30": b"1" + b"0" * 30,
    "10**5000": b"1" + b"0" * 5000, "2**64+1": b"18446744073709551617", "a string": b'"4096"', "an object": b'{"bytes":1}',
}


@pytest.mark.parametrize("bad", list(BAD_VALUES))
def test_a_value_dltop_does_not_record_skips_its_sample(tmp_path: Path, bad: str) -> None:
    # Lines as an older dltop wrote them (no checksum to catch the edit): the value itself is checked.
    snaps = real_snapshots()
    rec_dir = record_crashed(tmp_path / "rec", snaps)
    seg = only(rec_dir, store.OPEN_SUFFIX)
    old = [without_checksum(line) for line in seg.read_bytes().splitlines()]
    at = [i for i, ln in enumerate(old) if b'"type":"sample"' in ln][2]
    old[at] = re.sub(rb'"cached_bytes":\d+', b'"cached_bytes":' + BAD_VALUES[bad], old[at], count=1)
    seg.write_bytes(b"".join(old))
    code, out, err = dltop("dump", str(rec_dir))
    assert code == 0 and dumped(out) == [s for i, s in enumerate(snaps) if i != 2]
    one_line(err, "skipped 1 sample")
    code, out, err = dltop("report", str(rec_dir))
    peaks = out.split("\nPeaks\n")[1].split("\n\n")[0]
    assert code == 0 and "nan" not in peaks.lower() and "inf" not in peaks.lower()
    one_line(err, "skipped 1 sample")


# -- fuzzing each reader -------------------------------------------------------------------------------------------

TRIED: dict[str, int] = {}


@functools.cache
def fuzz_recording() -> tuple[bytes, bytes, bytes]:
    """A real recording of three samples: its open segment as a crash leaves it, and, closed, its .zst and
    index."""
    snaps = real_snapshots(3)
    with tempfile.TemporaryDirectory() as tmp:
        open_seg = only(record_crashed(Path(tmp) / "open", snaps), store.OPEN_SUFFIX).read_bytes()
        closed = record(Path(tmp) / "closed", snaps, block_samples=1)
        return (open_seg, only(closed, store.CLOSED_SUFFIX).read_bytes(),
                only(closed, store.INDEX_SUFFIX).read_bytes())


HOSTILE = [b"NaN", b"-Infinity", b"1e400", b"-1", b"1" + b"0" * 40, b'"x"', b"null", b"[]", b"{}", b"true",
           b"[" * 3000 + b"]" * 3000, b'{"a":' * 500 + b"1" + b"}" * 500, b"\xff\xfe", b'"\\ud800"']


def mutate(data: bytes, draw: Any) -> bytes:
    """`data` damaged as a disk, a copy or a person does it: cut short, bytes flipped, a value replaced by a
    hostile one (NaN, huge, negative, the wrong type, deep nesting), a line doubled or dropped."""
    how = draw(st.sampled_from(["truncate", "flip", "value", "lines"]))
    if how == "truncate":
        return data[: draw(st.integers(0, len(data)))]
    if how in ("flip", "value"):
        out = bytearray(data)
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(0, len(out) - 1))
            out[i] ^= 1 << draw(st.integers(0, 7))
        return bytes(out)
    numbers = [m.span() for m in re.finditer(rb"(?<=:)-?\d[\d.eE+-]*|(?<=:)\"[^\"]*\"", data)]
    if how == "value" and numbers:
        a, b = numbers[draw(st.integers(0, len(numbers) - 1))]
        return data[:a] + draw(st.sampled_from(HOSTILE)) + data[b:]
    lines = data.split(b"\n")
    i = draw(st.integers(0, len(lines) - 1))
    return b"\n".join(lines[:i] + (lines[i:] if draw(st.booleans()) else lines[i + 1:]) + [lines[i]])


def read_all(path: Path) -> Recording | None:
    """Everything a reader of the recording does: open, every sample, the events, the note, the report."""
    try:
        r = Recording(str(path))
    except DltopError as e:  # not a recording at all, or nothing readable: one line
        assert "\n" not in str(e) and ("not a dltop recording" in str(e) or "newer dltop" in str(e)), e
        return None
    snaps = list(r.range())
    assert all(isinstance(s, Snapshot) for s in snaps)
    r.events()
    if r.times():
        with contextlib.suppress(DltopError):  # every sample damaged: "no sample could be read", one line
            r.at(r.times()[-1])
    note = r.damage.note()
    assert "\n" not in note and all("\n" not in why for why in r.damage.reasons.values())
    assert bool(note) == bool(r.damage.total or r.damage.indexes)
    report(r, width=80)
    return r


def _fuzz(name: str, files: dict[str, bytes]) -> None:
    TRIED[name] = TRIED.get(name, 0) + 1
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for fname, data in files.items():
            (d / fname).write_bytes(data)
        read_all(d)


FUZZ = settings(max_examples=150, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))


@FUZZ
@given(st.data())
def test_fuzz_the_open_segment_reader(data: st.DataObject) -> None:
    open_seg, _, _ = fuzz_recording()
    _fuzz("open segment", {"20260101T000000Z.jsonl": mutate(open_seg, data.draw)})


def mutate_entry(idx: bytes, draw: Any) -> bytes:
    """The index with one field of one block entry (or the top) replaced: a hostile value, another number, a
    base64 character changed, or the field gone."""
    index = json.loads(idx)
    entry = draw(st.sampled_from([index, *index["blocks"]]))
    key = draw(st.sampled_from(sorted(entry)))
    how = draw(st.sampled_from(["hostile", "number", "b64", "drop"]))
    if how == "drop":
        del entry[key]
        return json.dumps(index).encode()
    if how == "b64" and isinstance(entry.get("ts"), str) and entry["ts"]:
        i = draw(st.integers(0, len(entry["ts"]) - 1))
        entry["ts"] = entry["ts"][:i] + draw(st.sampled_from("A/+=!z")) + entry["ts"][i + 1:]
        return json.dumps(index).encode()
    if how == "number":
        entry[key] = draw(st.integers(-(2**70), 2**70) | st.floats())
        return json.dumps(index).encode()
    entry[key] = "@HOSTILE@"
    return json.dumps(index).encode().replace(b'"@HOSTILE@"', draw(st.sampled_from(HOSTILE)))


@FUZZ
@given(st.data())
def test_fuzz_the_index_reader(data: st.DataObject) -> None:
    _, zst, idx = fuzz_recording()
    bad = mutate_entry(idx, data.draw) if data.draw(st.booleans()) else mutate(idx, data.draw)
    _fuzz("index", {"20260101T000000Z.jsonl.zst": zst, "20260101T000000Z.idx.json": bad})


@FUZZ
@given(st.data())
def test_fuzz_the_frame_reader(data: st.DataObject) -> None:
    # The .zst damaged, its index intact (one frame read per seek) or gone (the frames scanned).
    _, zst, idx = fuzz_recording()
    files = {"20260101T000000Z.jsonl.zst": mutate(zst, data.draw)}
    if data.draw(st.booleans()):
        files["20260101T000000Z.idx.json"] = idx
    _fuzz("frames", files)


@settings(max_examples=150, derandomize=True, deadline=None)
@given(st.lists(st.sampled_from(HOSTILE + [b"1", b"1.5", b'"a"']), min_size=1, max_size=3))
def test_fuzz_a_line_s_values(values: list[bytes]) -> None:
    # The scan and the sample decoder on lines whose checksum matches (a writer that wrote them so): each
    # value is checked for what it is, not trusted because the line is whole.
    open_seg, _, _ = fuzz_recording()
    TRIED["line values"] = TRIED.get("line values", 0) + 1
    lines = open_seg.split(b"\n")[:-1]
    out = []
    for i, line in enumerate(lines):
        body = store.check_line(line)[0]
        spans = [m.span() for m in re.finditer(rb"(?<=:)-?\d[\d.eE+-]*", body)]
        for k, v in enumerate(values):
            a, b = spans[(i * 7 + k * 13) % len(spans)]
            body = body[:a] + v + body[b:]
        head = body[:-1]
        out.append(head + b',"crc":"' + b"%08x" % zlib.crc32(head) + b'"}')
    chunk = Chunk.scan(b"\n".join(out) + b"\n")
    for k in range(len(chunk.samples)):
        with contextlib.suppress(ValueError):  # DecodeError: the sample is skipped and counted by the reader
            chunk.snapshot(k)
    assert all("\n" not in why for _, why in chunk.damaged)


def test_fuzz_counts() -> None:
    # How many inputs each reader was fuzzed with (docs/recorder.md quotes them); run after the fuzz tests
    # (pytest -s shows the line).
    print(f"\nfuzzed (inputs per reader): {TRIED}")
    assert all(n > 0 for n in TRIED.values())


def test_index_times_are_checked() -> None:
    from dltop.recorder.reader import index_times

    assert index_times(base64.b64encode(b"\0" * 16).decode()) == [0.0, 0.0]
    for bad in ("!!!!", "AAA", base64.b64encode(b"\0" * 7).decode()):
        with pytest.raises(ValueError):
            index_times(bad)


def test_numbers_that_may_be_negative_read_back_as_recorded(tmp_path: Path) -> None:
    # A job's page-cache change over an epoch shrinks when reclaim wins; a split whose parts exceed NVML's Used
    # is recorded with its negative remainder (shown as inconsistent). Both are data, not damage: a recording of a
    # real training job holds them (the full suite saw a whole recording refused beside a probe job).
    from dataclasses import replace

    from dltop.model import ProbesPart
    from dltop.model.probes import ProbeEpoch, ProcessProbe

    epoch = ProbeEpoch(index=0, started_at=time.time() - 5, ended_at=time.time(), duration_s=5.0, data_wait_s=1.0,
                       steps=10, machine_cached_delta_bytes=-24576)
    probe = ProcessProbe(pid=os.getpid(), path="/x/1.json", uid=0, start_time_ticks=1, cmd="train.py",
                         published_at=time.time(), epochs=(epoch,))
    snaps = tuple(replace(s, probes=ProbesPart(dirs=("/x",), processes=(probe,), ignored=())) for s in real_snapshots(3))
    rec_dir = record_crashed(tmp_path / "rec", snaps)
    code, out, err = dltop("dump", str(rec_dir))
    assert code == 0 and err == "" and dumped(out) == list(snaps)
