"""The flight recorder's reader: a recording directory (or one segment) as Snapshots in time order.

Closed segments are reached through their index (one frame decompressed per seek); an open segment (being
written, or left by a killed recorder) is scanned whole. Damage (a torn last line, a corrupt line, a frame cut
short) is skipped and counted in `skipped`; everything else is read.
"""

from __future__ import annotations

import array
import base64
import bisect
import json
import os
import sys
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import zstandard

from dltop.errors import DltopError
from dltop.model import DecodeError, Snapshot
from dltop.recorder import store
from dltop.recorder.segment import Chunk, RecordedEvent, decompress, decompress_frame

_CACHED_CHUNKS = 4

__all__ = ["RecordedEvent", "Recording"]


@dataclass
class _Segment:
    path: str
    meta: dict[str, Any] | None
    # per chunk: the sample times, and how to get its lines
    chunks: list[tuple[list[float], Callable[[], Chunk]]] = field(default_factory=list)
    events: list[RecordedEvent] = field(default_factory=list)


class Recording:
    """A recording, read: every sample's time, the full Snapshot at any time, and the events."""

    def __init__(self, path: str) -> None:
        path = os.path.abspath(os.path.expanduser(path))
        self.path = path
        self.skipped = 0
        self._cache: OrderedDict[tuple[int, int], Chunk] = OrderedDict()
        if os.path.isdir(path):
            files = [os.path.join(path, stem + suffix) for stem, suffix in store.list_segments(path)]
            if not files:
                raise DltopError(f"no recording in {path} (no segment files)")
        elif os.path.isfile(path):
            files = [path]
        else:
            raise DltopError(f"no such recording: {path}")
        self._segments = [self._load(p) for p in files]
        metas = [s.meta for s in self._segments if s.meta]
        for m in metas:
            if isinstance(m.get("format"), int) and m["format"] > store.FORMAT_VERSION:
                raise DltopError(f"{path}: recorded by a newer dltop (format {m['format']}; this one reads "
                                 f"up to {store.FORMAT_VERSION})")
        self.meta: dict[str, Any] = metas[0] if metas else {}
        # Samples in time order: the chunks' times end to end (segments and frames are in time order already);
        # a sample's place is its chunk (found by bisecting where each chunk starts) and its number in it.
        self._ts: list[float] = []
        self._chunk_start: list[int] = []
        self._chunk_of: list[tuple[int, int]] = []
        for si, seg in enumerate(self._segments):
            for ci, (times, _) in enumerate(seg.chunks):
                if times:
                    self._chunk_start.append(len(self._ts))
                    self._chunk_of.append((si, ci))
                    self._ts.extend(times)
        self._order: list[tuple[int, int, int]] | None = None
        if sorted(self._ts) != self._ts:  # a clock stepped back: sort
            where = sorted((ts, *self._place(j)) for j, ts in enumerate(self._ts))
            self._ts = [w[0] for w in where]
            self._order = [w[1:] for w in where]
        if not self._ts and not metas and not any(s.events for s in self._segments):
            raise DltopError(f"{path}: not a dltop recording, or nothing readable in it"
                             f"{f' ({self.skipped} damaged lines)' if self.skipped else ''}")

    # -- the API ------------------------------------------------------------------------------------------

    def times(self) -> list[float]:
        """Every sample's time, ascending."""
        return list(self._ts)

    def at(self, ts: float) -> Snapshot:
        """The full Snapshot at or before `ts` (the first one for a time before the recording starts)."""
        if not self._ts:
            raise DltopError(f"{self.path}: the recording holds no samples")
        i = max(0, bisect.bisect_right(self._ts, ts) - 1)
        for j in [*range(i, -1, -1), *range(i + 1, len(self._ts))]:  # a damaged sample: the nearest good one
            snap = self._snapshot(j)
            if snap is not None:
                return snap
        raise DltopError(f"{self.path}: no sample could be read")

    def range(self, t0: float | None = None, t1: float | None = None) -> Iterator[Snapshot]:
        """The Snapshots with t0 <= ts <= t1, in time order (damaged ones skipped and counted)."""
        lo = 0 if t0 is None else bisect.bisect_left(self._ts, t0)
        hi = len(self._ts) if t1 is None else bisect.bisect_right(self._ts, t1)
        for j in range(lo, hi):
            snap = self._snapshot(j)
            if snap is not None:
                yield snap

    def events(self, t0: float | None = None, t1: float | None = None) -> list[RecordedEvent]:
        """The events with t0 <= ts <= t1, in time order."""
        out = [e for s in self._segments for e in s.events
               if (t0 is None or e.ts >= t0) and (t1 is None or e.ts <= t1)]
        return sorted(out, key=lambda e: e.ts)

    @property
    def first_ts(self) -> float | None:
        """The first sample's time (None: no samples)."""
        return self._ts[0] if self._ts else None

    @property
    def last_ts(self) -> float | None:
        """The last sample's time (None: no samples)."""
        return self._ts[-1] if self._ts else None

    def __len__(self) -> int:
        return len(self._ts)

    # -- the reading ----------------------------------------------------------------------------------------

    def _place(self, j: int) -> tuple[int, int, int]:
        """(segment, chunk, sample in the chunk) of the j-th sample in time order."""
        if self._order is not None:
            return self._order[j]
        c = bisect.bisect_right(self._chunk_start, j) - 1
        si, ci = self._chunk_of[c]
        return si, ci, j - self._chunk_start[c]

    def _snapshot(self, j: int) -> Snapshot | None:
        si, ci, k = self._place(j)
        chunk = self._chunk(si, ci)
        if chunk is None or k >= len(chunk.samples):
            return None
        try:
            return chunk.snapshot(k)
        except (DecodeError, ValueError, KeyError, TypeError):
            self.skipped += 1
            return None

    def _chunk(self, si: int, ci: int) -> Chunk | None:
        key = (si, ci)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        try:
            chunk = self._segments[si].chunks[ci][1]()
        except (OSError, zstandard.ZstdError):
            self.skipped += 1
            self._segments[si].chunks[ci] = ([], lambda: Chunk([]))
            return None
        self._cache[key] = chunk
        while len(self._cache) > _CACHED_CHUNKS:
            self._cache.popitem(last=False)
        return chunk

    def _load(self, path: str) -> _Segment:
        if path.endswith(store.CLOSED_SUFFIX):
            index = _read_index(path[: -len(store.CLOSED_SUFFIX)] + store.INDEX_SUFFIX)
            if index is not None:
                return self._indexed(path, index)
            try:
                with open(path, "rb") as f:
                    data, damaged = decompress(f.read())
            except OSError as e:
                raise DltopError(f"cannot read {path}: {e.strerror}") from None
            self.skipped += damaged
        else:
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError as e:
                raise DltopError(f"cannot read {path}: {e.strerror}") from None
        chunk = Chunk.scan(data)
        self.skipped += chunk.skipped
        seg = _Segment(path, chunk.meta, events=chunk.events)
        seg.chunks.append(([s[0] for s in chunk.samples], lambda: chunk))
        return seg

    def _indexed(self, path: str, index: dict[str, Any]) -> _Segment:
        size = os.path.getsize(path)
        meta = index.get("meta") if isinstance(index.get("meta"), dict) else None
        seg = _Segment(path, meta)
        self.skipped += int(index.get("skipped") or 0)
        for ev in index.get("events") or []:
            if isinstance(ev, list) and len(ev) == 3 and isinstance(ev[2], dict):
                seg.events.append(RecordedEvent(float(ev[0]), str(ev[1]), ev[2]))
        for b in index.get("blocks") or []:
            offset, length = int(b["offset"]), int(b["size"])
            if offset + length > size:  # cut short (a truncated copy): this frame and those after it are gone
                self.skipped += 1
                continue
            seg.chunks.append((index_times(b["ts"]), _frame_loader(path, offset, length)))
        return seg


def index_times(text: str) -> list[float]:
    """A frame's sample times from the index: little-endian float64s in base64 (read in microseconds, where a
    JSON list of 3,600 numbers per segment took milliseconds)."""
    raw = base64.b64decode(text)
    times = array.array("d")
    times.frombytes(raw[: len(raw) // 8 * 8])
    if sys.byteorder != "little":
        times.byteswap()
    return times.tolist()


def _frame_loader(path: str, offset: int, length: int) -> Callable[[], Chunk]:
    def load() -> Chunk:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(length)
        return Chunk.scan(decompress_frame(data))

    return load


def _read_index(path: str) -> dict[str, Any] | None:
    """A closed segment's index, or None when it is missing or damaged (the segment is then read whole)."""
    try:
        with open(path, encoding="utf-8") as f:
            index = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(index, dict) or not isinstance(index.get("blocks"), list):
        return None
    for b in index["blocks"]:
        # Written whole by the recorder (renamed into place): checked for shape, not number by number.
        if not (isinstance(b, dict) and isinstance(b.get("offset"), int) and isinstance(b.get("size"), int)
                and isinstance(b.get("ts"), str)):
            return None
    return index
