"""Segments: the lines of one hour, read back into Snapshots; a closed segment compressed into indexed frames.

A chunk is a run of lines that stands alone: every "part" a sample refers to is in it before the sample. The
open segment is one chunk; a closed segment is one zstd frame per chunk of a few hundred samples (the part
lines in force are written again at the start of each frame), and its index gives each frame's byte range and
sample times, so reaching any moment decompresses one frame.
"""

from __future__ import annotations

import array
import base64
import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import zstandard

from dltop.fmt import human_bytes
from dltop.model import DecodeError, Snapshot
from dltop.recorder import columns, reuse, store
from dltop.recorder.reuse import PartMemo
from dltop.recorder.summary import Values, frame_summary

ZSTD_LEVEL = 19  # an hour is sealed once: the frames' columns are ~1 MB, ~0.2 ms a sample more than level 15
FRAME_BYTES = 32 << 20  # a frame is cut after this much text even before its samples are all in (8 GPUs: ~90)


@dataclass(frozen=True)
class RecordedEvent:
    """One event of a recording: when, what kind ("action", "hint", "oom_kill", "marker", ...) and its data."""

    ts: float
    kind: str
    data: dict[str, Any]


@dataclass
class Chunk:
    """Lines that stand alone, scanned: each sample's time and the part lines in force at it."""

    lines: list[bytes]  # without their checksums; b"" where a line was damaged
    samples: list[tuple[float, int, dict[str, int]]] = field(default_factory=list)  # (ts, line, part -> line)
    events: list[RecordedEvent] = field(default_factory=list)
    meta: dict[str, Any] | None = None
    damaged: list[tuple[int, str]] = field(default_factory=list)  # (line number from 0, why) of lines left out
    _parts: dict[int, Any] = field(default_factory=dict)  # decoded part lines

    @property
    def skipped(self) -> int:
        """How many lines were left out as damaged."""
        return len(self.damaged)

    @classmethod
    def scan(cls, data: bytes) -> Chunk:
        """Split and scan; a torn or corrupt line, or one whose checksum fails, is counted and left out, the
        rest is read. Lines without a checksum (an older dltop's, a sealed frame's) are read as they are, unless
        others in the chunk have one: then one without is damage (its checksum was cut or changed)."""
        raw = data.split(b"\n")
        if raw[-1] == b"":
            raw.pop()
        chunk = cls([b""] * len(raw))
        state: dict[str, int] = {}
        for i, (line, why) in enumerate(_checked(raw)):
            head = store.line_prefix(line)
            if why is not None or head is None:
                chunk.damaged.append((i, why or "torn or not a recorded line"))
                continue
            ts, kind = head
            if kind == "sample":
                chunk.lines[i] = line
                chunk.samples.append((ts, i, state))
                continue
            try:
                body = store.loads(line)
            except store.Malformed as e:
                chunk.damaged.append((i, str(e)))
                continue
            why = chunk._take(ts, kind, body)
            if why is not None:
                chunk.damaged.append((i, why))
                continue
            if kind == "part":
                state = {**state, body["name"]: i}
            chunk.lines[i] = line
        return chunk

    def _take(self, ts: float, kind: str, body: dict[str, Any]) -> str | None:
        """A part, event or meta line taken in (a part: by `scan`'s state); why it is damage, else None."""
        if kind == "part":
            return None if body.get("name") in store.KEPT_PARTS and "value" in body else (
                "a part line without a part dltop keeps")
        if kind == "event":
            return self._take_event(ts, body)
        if kind == "meta" and not store.shallow(body):
            return f"meta nested deeper than {store.MAX_DEPTH}"
        if kind == "meta" and self.meta is None:
            self.meta = body
        return None

    def _take_event(self, ts: float, body: dict[str, Any]) -> str | None:
        if isinstance(body.get("kind"), str) and isinstance(body.get("data"), dict) and store.shallow(body["data"]):
            self.events.append(RecordedEvent(ts, body["kind"], body["data"]))
            return None
        return "an event without a kind and its data"

    def snapshot(self, k: int, memo: PartMemo | None = None) -> Snapshot:
        """The k-th sample as the full Snapshot that was written; DecodeError (with the reason) if its line is
        damaged or a value in it is not one dltop records (NaN, a negative size, a number beyond 2**64...).
        `memo`: the previous line's parts, reused where this line repeats their text (the same result)."""
        ts, i, state = self.samples[k]
        if memo is not None:
            try:
                return reuse.snapshot(memo, self.lines[i], ts, lambda ref: self._kept(ref, state, i))
            except Exception:  # noqa: BLE001 - anything unexpected: the ordinary way below decides
                memo.gave_up += 1
                memo.matched = {}
        try:
            body = store.loads(self.lines[i])
        except store.Malformed as e:
            raise DecodeError(f"sample at line {i + 1}: {e}") from None
        snap_dict, ref = body.get("snap"), body.get("ref", [])
        if not isinstance(snap_dict, dict) or not isinstance(ref, list):
            raise DecodeError(f"sample at line {i + 1}: not a sample")
        snap = Snapshot.from_dict(snap_dict)
        if snap.ts != ts:
            raise DecodeError(f"sample at line {i + 1}: its time differs from its line's")
        kept = self._kept(ref, state, i)
        return dataclasses.replace(snap, **kept) if kept else snap

    def _kept(self, ref: Any, state: dict[str, int], i: int) -> dict[str, Any]:
        """The parts sample line i refers to, decoded (DecodeError where it names one the chunk lacks)."""
        if not isinstance(ref, list):
            raise DecodeError(f"sample at line {i + 1}: not a sample")
        kept = {}
        for name in ref:
            if not isinstance(name, str) or name not in state or name not in store.KEPT_PARTS:
                raise DecodeError(f"sample at line {i + 1}: refers to a part {str(name)[:40]!r} this recording "
                                  f"lacks")
            kept[name] = self._part(state[name])
        return kept

    def _part(self, i: int) -> Any:
        if i not in self._parts:
            try:
                body = store.loads(self.lines[i])
            except store.Malformed as e:
                raise DecodeError(f"part at line {i + 1}: {e}") from None
            self._parts[i] = store.decode_part(body["name"], body["value"])
        return self._parts[i]


def _checked(raw: list[bytes]) -> list[tuple[bytes, str | None]]:
    """Each line without its checksum, and why its checksum makes it damage (None: it does not). A line without
    one is read as it is, unless others have one: then its checksum was cut or changed."""
    checked = [store.check_line(line) for line in raw]
    why = _CHECKSUM_DAMAGE if any(ok for _, ok in checked) else _CHECKSUM_DAMAGE_ALONE
    return [(line, why.get(ok)) for line, ok in checked]


# Why a line is damage by its checksum (store.check_line: True, False, or None where it has none), in a chunk with
# checksummed lines and in one without.
_CHECKSUM_DAMAGE: dict[bool | None, str] = {
    False: "checksum does not match", None: "torn or cut (no checksum where the other lines have one)"}
_CHECKSUM_DAMAGE_ALONE: dict[bool | None, str] = {False: "checksum does not match"}


def compress_segment(directory: str | int, stem: str, block_samples: int,
                     values: list[tuple[float, Values]] | None = None) -> None:
    """Turn `stem.jsonl` into `stem.jsonl.zst` (one frame per `block_samples` samples, or FRAME_BYTES of text)
    and `stem.idx.json`, then remove the .jsonl; `directory` is a path or an fd held on it. Each file is written
    whole under a temporary name and renamed into place, so a crash leaves either the open segment or the closed
    one (the reader prefers the closed one). `values`: what the report takes from each sample written (the
    writer's, `summary.sample_values`): a frame whose every sample has them gets a summary in its index entry.
    Malformed when the open segment is not a regular file or is bigger than a reader reads."""
    with _held(directory) as dir_fd:
        _compress(dir_fd, stem, block_samples, values)


@contextlib.contextmanager
def _held(directory: str | int) -> Iterator[int]:
    if isinstance(directory, int):
        yield directory
        return
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


def _compress(dir_fd: int, stem: str, block_samples: int, values: list[tuple[float, Values]] | None) -> None:
    src = stem + store.OPEN_SUFFIX
    data = store.read_regular(src, dir_fd, store.MAX_SEGMENT_BYTES, "segment")
    chunk = Chunk.scan(data)
    if chunk.meta is None and not chunk.samples and not chunk.events:
        os.unlink(src, dir_fd=dir_fd)  # nothing in it worth keeping (a recorder killed before its first line)
        return
    frames = _Frames(block_samples, values)
    for line in chunk.lines:  # the lines that passed the scan (a damaged one is b""), without their checksums
        head = store.line_prefix(line)
        if head is not None:
            frames.add(line, *head)
    frames.flush()
    index: dict[str, Any] = {
        "format": store.FORMAT_VERSION, "meta": chunk.meta, "samples": len(frames.all_ts),
        "skipped": chunk.skipped, "first_ts": min(frames.all_ts, default=None),
        "last_ts": max(frames.all_ts, default=None), "events": [[e.ts, e.kind, e.data] for e in chunk.events]}
    # Each block carries its own checksum, the rest of the index one: a reader takes a damaged index as absent.
    index["crc"] = store.entry_crc(list(index.values()))
    index["blocks"] = frames.blocks
    _write_whole(dir_fd, stem + store.CLOSED_SUFFIX, b"".join(frames.frames))
    _write_whole(dir_fd, stem + store.INDEX_SUFFIX, json.dumps(index, separators=(",", ":")).encode("utf-8"))
    os.unlink(src, dir_fd=dir_fd)


class _Frames:
    """A closed segment's frames, cut as its lines come, and their index entries."""

    def __init__(self, block_samples: int, values: list[tuple[float, Values]] | None) -> None:
        self.block_samples = block_samples
        self.cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=True, write_content_size=True)
        self.frames: list[bytes] = []
        self.blocks: list[dict[str, Any]] = []
        self.all_ts: list[float] = []
        self.offset = 0
        self.parts: dict[str, bytes] = {}  # the part lines in force
        self.current: list[bytes] = []  # the frame's lines so far
        self.current_bytes = 0
        self.times: list[float] = []  # the frame's samples' times
        self.by_ts: dict[float, Values | None] = {}
        for ts, v in values or ():
            self.by_ts[ts] = None if ts in self.by_ts else v  # two samples at one time: which is which is not known

    def add(self, line: bytes, ts: float, kind: str) -> None:
        """One more line; the frame is cut after `block_samples` samples or FRAME_BYTES of text."""
        if not self.current:
            self.current = list(self.parts.values())  # the parts in force, so the frame stands alone
            self.current_bytes = sum(len(p) + 1 for p in self.current)
        self.current.append(line)
        self.current_bytes += len(line) + 1
        if kind == "part":
            self.parts[store.loads(line)["name"]] = line  # the scan parsed it
        elif kind == "sample":
            self.times.append(ts)
            if len(self.times) >= self.block_samples or self.current_bytes >= FRAME_BYTES:
                self.flush()

    def flush(self) -> None:
        """The lines so far made a frame, with its index entry."""
        if not self.current:
            return
        frame = self.cctx.compress(columns.pack(self.current))
        times = self.times
        block: dict[str, Any] = {"offset": self.offset, "size": len(frame), "first_ts": times[0] if times else None,
                                 "last_ts": times[-1] if times else None, "ts": index_times_text(times),
                                 "samples": len(times)}
        block["crc"] = store.entry_crc(list(block.values()))
        # The summary has its own checksum (a dltop before summaries checks the block's entries, not it); a
        # frame with a sample the writer holds no values for (a segment a killed recorder left) has none.
        frame_values = [self.by_ts.get(t) for t in times]
        if times and all(v is not None for v in frame_values):
            summary = frame_summary(list(zip(times, frame_values, strict=True)))  # type: ignore[arg-type]
            block["summary"] = summary
            block["summary_crc"] = store.entry_crc([summary])
        self.frames.append(frame)
        self.blocks.append(block)
        self.all_ts.extend(times)
        self.offset += len(frame)
        self.current, self.current_bytes, self.times = [], 0, []


def index_times_text(times: list[float]) -> str:
    """Sample times as the index holds them: little-endian float64s in base64 (exact, and quick to read)."""
    arr = array.array("d", times)
    if sys.byteorder != "little":
        arr.byteswap()
    return base64.b64encode(arr.tobytes()).decode("ascii")


def _write_whole(dir_fd: int, name: str, data: bytes) -> None:
    tmp = name + ".tmp"
    fd = store.open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, dir_fd=dir_fd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError:
        with contextlib.suppress(OSError):  # a full disk: leave no half-written file behind
            os.unlink(tmp, dir_fd=dir_fd)
        raise


# Bounds on what one frame makes the reader do, checked from its header before a byte is decoded: the writer cuts a
# frame at FRAME_BYTES of text (one line past it at most), whose columns are a few MiB: zstd's window is no larger.
MAX_FRAME_BYTES = 128 << 20
MAX_WINDOW_BYTES = 16 << 20
_MAGIC = b"\x28\xb5\x2f\xfd"  # every zstd frame starts so
_STEP = zstandard.DECOMPRESSION_RECOMMENDED_INPUT_SIZE  # compressed bytes fed to the decoder at a time


def decompress_segment(data: bytes, max_bytes: int = store.MAX_SEGMENT_BYTES) -> tuple[bytes, int, str]:
    """Every whole frame's content, in order, how many damaged stretches were left out, and the first reason
    one was ("" when none was): after a frame that does not decompress (or is cut short, or is bigger than dltop
    writes) the next one is found by zstd's magic number, since each frame stands alone. No frame past
    `max_bytes` of content in all is decoded (each counted as damaged)."""
    out = bytearray()
    damaged = 0
    why = ""
    view = memoryview(data)
    pos = 0
    while pos < len(data):
        try:
            content, used = decode_frame(view[pos:], max_bytes - len(out))
        except zstandard.ZstdError as e:
            damaged += 1
            why = why or str(e)
            pos = data.find(_MAGIC, pos + 1)
            if pos < 0:
                break
            continue
        out += content
        pos += used
    return bytes(out), damaged, why


def frame_size(data: bytes | memoryview, room: int = MAX_FRAME_BYTES) -> int:
    """The content size a frame's header declares; ZstdError (saying why) when the header is not one, declares no
    size, or declares more than dltop writes or than `room` allows: read from the header alone, nothing decoded."""
    size = zstandard.frame_content_size(data)
    if size < 0:
        raise zstandard.ZstdError("declares no content size: not a frame dltop writes")
    if size > MAX_FRAME_BYTES:
        raise zstandard.ZstdError(f"declares {human_bytes(size)}: more than a frame dltop writes (at most "
                                  f"{human_bytes(MAX_FRAME_BYTES)}; not decompressed)")
    if size > room:
        raise zstandard.ZstdError(f"declares {human_bytes(size)}: past the {human_bytes(store.MAX_SEGMENT_BYTES)} "
                                  f"a segment holds at most (not decompressed)")
    return size


def decode_frame(data: bytes | memoryview, room: int = MAX_FRAME_BYTES) -> tuple[bytes, int]:
    """The first frame's content (its checksum checked) and its length in bytes, decoded a piece at a time with
    its output capped at the size its header declares (`frame_size`); ZstdError when it is damaged, cut, bigger
    than it declares, or asks for a window larger than MAX_WINDOW_BYTES."""
    view = memoryview(data)
    size = frame_size(view, room)
    dobj = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW_BYTES).decompressobj()
    pieces: list[bytes] = []
    got = pos = 0
    while not dobj.eof and pos < len(view):
        piece = dobj.decompress(view[pos:pos + _STEP])
        pos = min(pos + _STEP, len(view))
        got += len(piece)
        if got > size:
            raise zstandard.ZstdError(f"holds more than the {size} bytes its header declares")
        pieces.append(piece)
    if not dobj.eof:
        raise zstandard.ZstdError("frame cut short")
    if got != size:
        raise zstandard.ZstdError(f"holds {got} bytes, not the {size} its header declares")
    content = b"".join(pieces)
    if columns.is_packed(content):  # format 2: the lines' shapes and their numbers in columns
        try:
            content = columns.unpack(content, min(room, MAX_FRAME_BYTES))
        except ValueError as e:
            raise zstandard.ZstdError(str(e)) from None
    return content, pos - len(dobj.unused_data)


def decompress_frame(data: bytes) -> bytes:
    """One whole frame (its checksum checked), as `decode_frame`; zstandard.ZstdError when it is damaged, not one
    dltop writes, or followed by bytes that are not of it."""
    content, used = decode_frame(data)
    if used != len(data):
        raise zstandard.ZstdError(f"{len(data) - used} bytes after the frame")
    return content
