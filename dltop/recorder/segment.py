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
from dltop.recorder import reuse, store
from dltop.recorder.reuse import PartMemo
from dltop.recorder.summary import Values, frame_summary

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
        if raw and raw[-1] == b"":
            raw.pop()
        checked = [store.check_line(line) for line in raw]
        checksummed = any(ok for _, ok in checked)
        chunk = cls([b""] * len(raw))
        state: dict[str, int] = {}
        for i, (line, ok) in enumerate(checked):
            head = store.line_prefix(line)
            if ok is False:
                chunk.damaged.append((i, "checksum does not match"))
                continue
            if ok is None and checksummed:
                chunk.damaged.append((i, "torn or cut (no checksum where the other lines have one)"))
                continue
            if head is None:
                chunk.damaged.append((i, "torn or not a recorded line"))
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
            why = None
            if kind == "part":
                if body.get("name") in store.KEPT_PARTS and "value" in body:
                    state = {**state, body["name"]: i}
                else:
                    why = "a part line without a part dltop keeps"
            elif kind == "event":
                if isinstance(body.get("kind"), str) and isinstance(body.get("data"), dict) \
                        and store.shallow(body["data"]):
                    chunk.events.append(RecordedEvent(ts, body["kind"], body["data"]))
                else:
                    why = "an event without a kind and its data"
            elif kind == "meta":
                if not store.shallow(body):
                    why = f"meta nested deeper than {store.MAX_DEPTH}"
                elif chunk.meta is None:
                    chunk.meta = body
            if why is not None:
                chunk.damaged.append((i, why))
                continue
            chunk.lines[i] = line
        return chunk

    def snapshot(self, k: int, memo: PartMemo | None = None) -> Snapshot:
        """The k-th sample as the full Snapshot that was written; DecodeError (with the reason) if its line is
        damaged or a value in it is not one dltop records (NaN, a negative size, a number beyond 2**64...).
        `memo`: the previous line's parts, reused where this line repeats their text (the same result)."""
        ts, i, state = self.samples[k]
        if memo is not None:
            try:
                return reuse.snapshot(memo, self.lines[i], ts, lambda ref: self._kept(ref, state))
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
        kept = {}
        for name in ref:
            if not isinstance(name, str) or name not in state or name not in store.KEPT_PARTS:
                raise DecodeError(f"sample at line {i + 1}: refers to a part {str(name)[:40]!r} this recording "
                                  f"lacks")
            kept[name] = self._part(state[name])
        return dataclasses.replace(snap, **kept) if kept else snap

    def _kept(self, ref: Any, state: dict[str, int]) -> dict[str, Any]:
        """The parts a sample refers to, decoded (ValueError where it names one the chunk lacks)."""
        if not isinstance(ref, list):
            raise ValueError("not a sample")
        kept = {}
        for name in ref:
            if not isinstance(name, str) or name not in state or name not in store.KEPT_PARTS:
                raise ValueError("refers to a part this recording lacks")
            kept[name] = self._part(state[name])
        return kept

    def _part(self, i: int) -> Any:
        if i not in self._parts:
            try:
                body = store.loads(self.lines[i])
            except store.Malformed as e:
                raise DecodeError(f"part at line {i + 1}: {e}") from None
            # Decoded as the Snapshot's own field, so the part gets exactly the field's type
            holder = Snapshot.from_dict({"ts": 0.0, "host": "", "schema": SCHEMA_VERSION, body["name"]: body["value"]})
            self._parts[i] = getattr(holder, body["name"])
        return self._parts[i]


def compress_segment(directory: str, stem: str, block_samples: int,
                     values: list[tuple[float, Values]] | None = None) -> None:
    """Turn `stem.jsonl` into `stem.jsonl.zst` (one frame per `block_samples` samples) and `stem.idx.json`,
    then remove the .jsonl. Each file is written whole under a temporary name and renamed into place, so a
    crash leaves either the open segment or the closed one (the reader prefers the closed one). `values`: what
    the report takes from each sample written (the writer's, `summary.sample_values`): a frame whose every
    sample has them gets a summary in its index entry."""
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
    by_ts: dict[float, Values | None] = {}
    for ts, v in values or ():
        by_ts[ts] = None if ts in by_ts else v  # two samples at one time: which is which is not known

    def flush() -> None:
        nonlocal offset, current, times
        if not current:
            return
        frame = cctx.compress(b"\n".join(current) + b"\n")
        frames.append(frame)
        block: dict[str, Any] = {"offset": offset, "size": len(frame), "first_ts": times[0] if times else None,
                 "last_ts": times[-1] if times else None, "ts": index_times_text(times), "samples": len(times)}
        block["crc"] = store.entry_crc(list(block.values()))
        # The summary has its own checksum (a dltop before summaries checks the block's entries, not it); a
        # frame with a sample the writer holds no values for (a segment a killed recorder left) has none.
        frame_values = [by_ts.get(t) for t in times]
        if times and all(v is not None for v in frame_values):
            summary = frame_summary(list(zip(times, frame_values, strict=True)))  # type: ignore[arg-type]
            block["summary"] = summary
            block["summary_crc"] = store.entry_crc([summary])
        blocks.append(block)
        all_ts.extend(times)
        offset += len(frame)
        current, times = [], []

    for line in chunk.lines:  # the lines that passed the scan (a damaged one is b""), without their checksums
        head = store.line_prefix(line)
        if head is None:
            continue
        ts, kind = head
        if not current:
            current = list(parts.values())  # the parts in force, so the frame stands alone
        current.append(line)
        if kind == "part":
            parts[store.loads(line)["name"]] = line  # the scan parsed it
        elif kind == "sample":
            times.append(ts)
            if len(times) >= block_samples:
                flush()
    flush()
    index: dict[str, Any] = {
        "format": store.FORMAT_VERSION, "meta": chunk.meta, "samples": len(all_ts), "skipped": chunk.skipped,
        "first_ts": min(all_ts, default=None), "last_ts": max(all_ts, default=None),
        "events": [[e.ts, e.kind, e.data] for e in chunk.events]}
    # Each block carries its own checksum, the rest of the index one: a reader takes a damaged index as absent.
    index["crc"] = store.entry_crc(list(index.values()))
    index["blocks"] = blocks
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


MAX_FRAME_BYTES = 1 << 30  # a frame holds a few hundred samples (~25 MB at most): a bigger one is a bomb
_MAGIC = b"\x28\xb5\x2f\xfd"  # every zstd frame starts so


def decompress(data: bytes) -> tuple[bytes, int]:
    """Every whole frame's content, in order, and how many damaged stretches were left out: after a frame that
    does not decompress (or is cut short) the next one is found by zstd's magic number, since each frame stands
    alone."""
    out = bytearray()
    damaged = 0
    view = memoryview(data)
    pos = 0
    while pos < len(data):
        try:
            content, used = _one_frame(view[pos:])
        except zstandard.ZstdError:
            damaged += 1
            pos = data.find(_MAGIC, pos + 1)
            if pos < 0:
                break
            continue
        out += content
        pos += used
    return bytes(out), damaged


def _one_frame(data: memoryview) -> tuple[bytes, int]:
    """The first frame's content and its length in bytes; ZstdError when it is damaged, cut, or declares no
    size or one beyond MAX_FRAME_BYTES (dltop writes the size in every frame)."""
    size = zstandard.frame_content_size(data)
    if not 0 <= size <= MAX_FRAME_BYTES:
        raise zstandard.ZstdError(f"frame content size {size}: not one dltop writes")
    dobj = zstandard.ZstdDecompressor().decompressobj()
    content = dobj.decompress(data)
    if not dobj.eof:
        raise zstandard.ZstdError("frame cut short")
    return content, len(data) - len(dobj.unused_data)


def decompress_frame(data: bytes) -> bytes:
    """One whole frame (its checksum checked); zstandard.ZstdError when it is damaged or not one dltop writes."""
    size = zstandard.frame_content_size(data)
    if not 0 <= size <= MAX_FRAME_BYTES:
        raise zstandard.ZstdError(f"frame content size {size}: not one dltop writes")
    return zstandard.ZstdDecompressor().decompress(data)  # one call, into a buffer of the size declared
