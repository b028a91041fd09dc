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
from dataclasses import dataclass, field
from typing import Any

import zstandard

from dltop.model import SCHEMA_VERSION, DecodeError, Snapshot
from dltop.recorder import store

ZSTD_LEVEL = 9


@dataclass(frozen=True)
class RecordedEvent:
    """One event of a recording: when, what kind ("action", "hint", "oom_kill", "marker", ...) and its data."""

    ts: float
    kind: str
    data: dict[str, Any]


@dataclass
class Chunk:
    """Lines that stand alone, scanned: each sample's time and the part lines in force at it."""

    lines: list[bytes]
    samples: list[tuple[float, int, dict[str, int]]] = field(default_factory=list)  # (ts, line, part -> line)
    events: list[RecordedEvent] = field(default_factory=list)
    meta: dict[str, Any] | None = None
    skipped: int = 0
    _parts: dict[int, Any] = field(default_factory=dict)  # decoded part lines

    @classmethod
    def scan(cls, data: bytes) -> Chunk:
        """Split and scan; a torn or corrupt line is counted and left out, the rest is read."""
        lines = data.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        chunk = cls(lines)
        state: dict[str, int] = {}
        for i, line in enumerate(lines):
            head = store.line_prefix(line)
            if head is None:
                chunk.skipped += 1
                continue
            ts, kind = head
            if kind == "sample":
                chunk.samples.append((ts, i, state))
                continue
            try:
                body = json.loads(line)
            except ValueError:
                chunk.skipped += 1
                continue
            if kind == "part" and isinstance(body.get("name"), str):
                state = {**state, body["name"]: i}
            elif kind == "event" and isinstance(body.get("kind"), str) and isinstance(body.get("data"), dict):
                chunk.events.append(RecordedEvent(ts, body["kind"], body["data"]))
            elif kind == "meta" and chunk.meta is None:
                chunk.meta = body
        return chunk

    def snapshot(self, k: int) -> Snapshot:
        """The k-th sample as the full Snapshot that was written; DecodeError if its line is damaged."""
        _, i, state = self.samples[k]
        try:
            body = json.loads(self.lines[i])
        except ValueError:
            raise DecodeError(f"sample at line {i + 1}: not JSON") from None
        snap_dict, ref = body.get("snap"), body.get("ref", [])
        if not isinstance(snap_dict, dict) or not isinstance(ref, list):
            raise DecodeError(f"sample at line {i + 1}: not a sample")
        snap = Snapshot.from_dict(snap_dict)
        kept = {}
        for name in ref:
            if name not in state or name not in store.KEPT_PARTS:
                raise DecodeError(f"sample at line {i + 1}: refers to a part {name!r} this recording lacks")
            kept[name] = self._part(state[name])
        return dataclasses.replace(snap, **kept) if kept else snap

    def _part(self, i: int) -> Any:
        if i not in self._parts:
            body = json.loads(self.lines[i])
            # Decoded as the Snapshot's own field, so the part gets exactly the field's type
            holder = Snapshot.from_dict({"ts": 0.0, "host": "", "schema": SCHEMA_VERSION, body["name"]: body["value"]})
            self._parts[i] = getattr(holder, body["name"])
        return self._parts[i]


def compress_segment(directory: str, stem: str, block_samples: int) -> None:
    """Turn `stem.jsonl` into `stem.jsonl.zst` (one frame per `block_samples` samples) and `stem.idx.json`,
    then remove the .jsonl. Each file is written whole under a temporary name and renamed into place, so a
    crash leaves either the open segment or the closed one (the reader prefers the closed one)."""
    src = os.path.join(directory, stem + store.OPEN_SUFFIX)
    with open(src, "rb") as f:
        data = f.read()
    chunk = Chunk.scan(data)
    if chunk.meta is None and not chunk.samples and not chunk.events:
        os.unlink(src)  # nothing in it worth keeping (a recorder killed before its first line)
        return
    cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=True, write_content_size=True)
    frames: list[bytes] = []
    blocks: list[dict[str, Any]] = []
    parts: dict[str, bytes] = {}
    current: list[bytes] = []
    times: list[float] = []
    all_ts: list[float] = []
    offset = 0

    def flush() -> None:
        nonlocal offset, current, times
        if not current:
            return
        frame = cctx.compress(b"\n".join(current) + b"\n")
        frames.append(frame)
        blocks.append({"offset": offset, "size": len(frame), "first_ts": times[0] if times else None,
                       "last_ts": times[-1] if times else None, "ts": index_times_text(times), "samples": len(times)})
        all_ts.extend(times)
        offset += len(frame)
        current, times = [], []

    for line in chunk.lines:
        head = store.line_prefix(line)
        if head is None:
            continue
        ts, kind = head
        if not current:
            current = list(parts.values())  # the parts in force, so the frame stands alone
        current.append(line)
        if kind == "part":
            with contextlib.suppress(ValueError, KeyError, TypeError):
                parts[json.loads(line)["name"]] = line
        elif kind == "sample":
            times.append(ts)
            if len(times) >= block_samples:
                flush()
    flush()
    index = {"format": store.FORMAT_VERSION, "meta": chunk.meta, "samples": len(all_ts), "skipped": chunk.skipped,
             "first_ts": min(all_ts, default=None), "last_ts": max(all_ts, default=None), "blocks": blocks,
             "events": [[e.ts, e.kind, e.data] for e in chunk.events]}
    _write_whole(os.path.join(directory, stem + store.CLOSED_SUFFIX), b"".join(frames))
    _write_whole(os.path.join(directory, stem + store.INDEX_SUFFIX),
                 json.dumps(index, separators=(",", ":")).encode("utf-8"))
    os.unlink(src)


def index_times_text(times: list[float]) -> str:
    """Sample times as the index holds them: little-endian float64s in base64 (exact, and quick to read)."""
    arr = array.array("d", times)
    if sys.byteorder != "little":
        arr.byteswap()
    return base64.b64encode(arr.tobytes()).decode("ascii")


def _write_whole(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    fd = store.open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):  # a full disk: leave no half-written file behind
            os.unlink(tmp)
        raise


def decompress(data: bytes) -> tuple[bytes, bool]:
    """Every whole frame's content, in order; True as well when a frame was damaged or cut short (what follows
    it is lost: frames have no marker to find the next one by)."""
    out = bytearray()
    dctx = zstandard.ZstdDecompressor()
    while data:
        dobj = dctx.decompressobj()
        try:
            content = dobj.decompress(data)
        except zstandard.ZstdError:
            return bytes(out), True
        if not dobj.eof:
            return bytes(out), True
        out += content
        data = dobj.unused_data
    return bytes(out), False


def decompress_frame(data: bytes) -> bytes:
    """One whole frame (its checksum checked); zstandard.ZstdError when it is damaged."""
    return zstandard.ZstdDecompressor().decompress(data)
