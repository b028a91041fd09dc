"""Sealed frames in columns (format 2, recorder/columns.py): the very lines back, real Snapshots equal, a frame that
is not what the writer makes counted as damage, a recording of format 1 (plain frames) still read, and a
recording of a newer format or schema refused with one line."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from dltop.errors import DltopError
from dltop.model import SCHEMA_VERSION
from dltop.recorder import Recorder, Recording, columns, segment, store
from tests.test_recorder import sampled


def moving(snaps: list, n: int) -> list:
    """n Snapshots whose numbers move each second (a counter climbing, a gauge jumping), from real ones."""
    out = []
    for i in range(n):
        s = snaps[i % len(snaps)]
        out.append(dataclasses.replace(s, ts=snaps[0].ts + i + 0.001 * (i % 7), uptime_s=(s.uptime_s or 0) + i))
    return out


def test_real_lines_come_back_byte_for_byte(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    snaps = moving(sampled(tmp_path, monkeypatch, n=4), 40)
    rec_dir = tmp_path / "rec"
    with Recorder(str(rec_dir), block_samples=16) as rec:
        for s in snaps:
            rec.write(s, wait=True)
    (stem, suffix), = store.list_segments(str(rec_dir))
    raw = (rec_dir / (stem + suffix)).read_bytes()
    frames = []
    pos = 0
    while pos < len(raw):
        obj = zstandard.ZstdDecompressor().decompressobj()
        frames.append(obj.decompress(raw[pos:]))
        pos = len(raw) - len(obj.unused_data)
    assert len(frames) == 3 and all(columns.is_packed(f) for f in frames)
    for f in frames:
        lines = columns.unpack(f, 1 << 30)
        assert columns.pack(lines.splitlines()) == f
        assert all(json.loads(line)["ts"] for line in lines.splitlines())
        assert len(f) < len(lines) / 3  # a number that stays, and every shape after the first, costs nothing
    r = Recording(str(rec_dir))
    assert r.damage.total == 0 and r.meta["format"] == store.FORMAT_VERSION == 2
    assert list(r.range()) == snaps


@settings(max_examples=200, derandomize=True, deadline=None)
@given(st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=12))
def test_any_lines_come_back(lines: list[bytes]) -> None:
    packed = columns.pack(lines)
    assert (columns.unpack(packed, 1 << 20) if columns.is_packed(packed) else packed) == b"".join(
        line + b"\n" for line in lines)


def test_counters_are_written_as_differences_and_kept_numbers_in_the_shape() -> None:
    lines = [b'{"ts":%d.5,"a":007,"n":%d,"same":42,"g":%d}' % (100 + i, 10**12 + 1000 * i, (i * 37) % 11)
             for i in range(5)]
    packed = columns.pack(lines)
    head, shape, order, *cols = packed.splitlines()
    assert head == b"dltop-columns 1 5 1" and order == b"0 0 0 0 0"
    assert shape == b'{"ts":\0.5,"a":007,"n":\0,"same":42,"g":\0}'
    assert cols == [b"+100,1,1,1,1", b"+1000000000000,1000,1000,1000,1000", b"0,4,8,1,5"]
    assert columns.unpack(packed, 1 << 20) == b"".join(line + b"\n" for line in lines)


@pytest.mark.parametrize(("content", "why"), [
    (b"dltop-columns 1 x 1\n", "header"),
    (b"dltop-columns 1 2 1\n{\0}\n0 0\n1\n", "another length"),
    (b"dltop-columns 1 1 1\n{\0}\n0\n", "cut short"),
    (b"dltop-columns 1 1 1\n{\0}\n1\n5\n", "shapes are not listed"),
    (b"dltop-columns 1 1 1\n{\0}\n0\n5\n6\n", "more columns"),
    (b"dltop-columns 1 1 1\n{\0}\n0\n+-5\n", "below 0"),
    (b"dltop-columns 1 1 1\n{\0}\n0\n 5\n", "not numbers"),
    (b"dltop-columns 1 1 1\n{\0}\n0\n+1_0\n", "not numbers"),
    (b"dltop-columns 1 3 1\n" + b"x" * 100 + b"\0\n0 0 0\n1,2,3\n", "more than the 200 bytes"),
])
def test_a_frame_not_as_written_says_why(content: bytes, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        columns.unpack(content, 200)


def test_a_damaged_column_is_a_damaged_frame_the_others_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    snaps = moving(sampled(tmp_path, monkeypatch, n=2), 12)
    rec_dir = tmp_path / "rec"
    with Recorder(str(rec_dir), block_samples=4) as rec:
        for s in snaps:
            rec.write(s, wait=True)
    (stem, suffix), = store.list_segments(str(rec_dir))
    index = json.loads((rec_dir / (stem + store.INDEX_SUFFIX)).read_text())
    b = index["blocks"][1]
    path = rec_dir / (stem + suffix)
    raw = path.read_bytes()
    content = segment.decode_frame(raw[b["offset"]:b["offset"] + b["size"]])[0]
    assert not columns.is_packed(content)  # the reader hands back lines
    packed = zstandard.ZstdDecompressor().decompress(raw[b["offset"]:b["offset"] + b["size"]])
    bad = zstandard.ZstdCompressor(write_checksum=True, write_content_size=True).compress(
        packed.replace(b"\n+", b"\n+-99999999999999,", 1))  # a valid zstd frame whose column goes below 0
    path.write_bytes(raw[:b["offset"]] + bad + raw[b["offset"] + b["size"]:])
    (rec_dir / (stem + store.INDEX_SUFFIX)).unlink()  # scanned: the frames after it found by their magic
    r = Recording(str(rec_dir))
    assert list(r.range()) == snaps[:4] + snaps[8:]
    assert "columns: a number below 0" in r.damage.note()


def test_a_recording_of_format_1_still_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer of format 1 differs in two places: the meta and the index say format 1, and a frame holds the
    lines themselves. Both put back, a recording is made, closed and read by this dltop."""
    snaps = moving(sampled(tmp_path, monkeypatch, n=3), 10)
    monkeypatch.setattr(store, "FORMAT_VERSION", 1)
    monkeypatch.setattr(segment.columns, "pack", lambda lines: b"\n".join(lines) + b"\n")
    rec_dir = tmp_path / "old"
    with Recorder(str(rec_dir), block_samples=4) as rec:
        for s in snaps:
            rec.write(s, wait=True)
    monkeypatch.undo()
    (stem, suffix), = store.list_segments(str(rec_dir))
    plain = zstandard.ZstdDecompressor().decompressobj().decompress((rec_dir / (stem + suffix)).read_bytes())
    assert plain.startswith(b'{"ts":') and b'"format":1,' in plain
    r = Recording(str(rec_dir))
    assert r.meta["format"] == 1 and r.damage.total == 0
    assert list(r.range()) == snaps


@pytest.mark.parametrize("key", ["format", "schema"])
def test_a_newer_format_or_schema_says_made_by_a_newer_dltop(tmp_path: Path, key: str) -> None:
    d = tmp_path / "rec"
    d.mkdir(mode=0o700)
    meta = {"format": store.FORMAT_VERSION, "schema": SCHEMA_VERSION, "dltop": "9.0\x1b[31m"}
    meta[key] += 1
    (d / "20260101T000000Z.jsonl").write_bytes(store.encode_line(1.0, "meta", meta))
    with pytest.raises(DltopError, match=f"made by a newer dltop .*{key} {meta[key]}; this one") as e:
        Recording(str(d))
    assert "\x1b" not in str(e.value)
