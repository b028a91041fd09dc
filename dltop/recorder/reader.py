"""The flight recorder's reader: a recording directory (or one segment) as Snapshots in time order.

Closed segments are reached through their index (one frame decompressed per seek); an open segment (being
written, or left by a killed recorder) is scanned whole, and so is a closed one whose index is missing or damaged
(any entry that fails its checksum or is not what dltop writes). Damage (a torn last line, a corrupt line, a line
whose checksum fails, a frame that does not decompress or is cut short, a sample holding a value dltop does not
record) is left out and counted in `damage` (each thing once, with the first reason of each kind); everything
else is read. Nothing in a recording makes the reader raise, except a newer format (refused, with a DltopError).

A recording may come from elsewhere, so every read is bounded before it is made: its files are opened relative to
the directory named (held open), never through a symlink, and only if they are regular files (a FIFO, a device or
a socket is refused before it is opened); a segment or an index bigger than dltop writes is refused by its size;
a frame is decoded only if its header declares a content size within MAX_FRAME_BYTES (and the segment's within
store.MAX_SEGMENT_BYTES), and its output is capped at that size. What is refused is counted as damage, with why.
"""

from __future__ import annotations

import array
import base64
import binascii
import bisect
import errno
import os
import sys
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any

import zstandard

from dltop import __version__
from dltop.config import TAB_NAMES
from dltop.errors import DltopError
from dltop.fmt import plural, printable
from dltop.model import SCHEMA_VERSION, DecodeError, Snapshot
from dltop.recorder import store
from dltop.recorder.reuse import PartMemo
from dltop.recorder.segment import (
    MAX_FRAME_BYTES,
    Chunk,
    RecordedEvent,
    decompress_frame,
    decompress_segment,
    frame_size,
)
from dltop.recorder.summary import check_summary

_CACHED_CHUNKS = 4

__all__ = ["Damage", "Piece", "RecordedEvent", "Recording"]

# What the counts are of, in the order a note names them (singular, plural).
_KINDS = {"segment": ("segment file", "segment files"), "line": ("damaged line", "damaged lines"),
          "sample": ("sample", "samples"),
          "frame": ("frame", "frames"), "event": ("index event", "index events")}


class Damage:
    """What a reader left out of a recording: each thing (a line, a sample, a frame) counted once, by kind, with
    the first reason of each kind; and the damaged indexes read around by scanning their segment."""

    def __init__(self) -> None:
        self._seen: dict[Hashable, tuple[str, int]] = {}  # what -> its kind, and how many things it is
        self.reasons: dict[str, str] = {}  # kind -> the first reason
        self.indexes: dict[str, str] = {}  # segment file -> why its index was not used
        self.spans: dict[Hashable, tuple[float, float, int]] = {}  # a lost frame -> its first, last ts, samples

    def add(self, what: Hashable, kind: str, reason: str, n: int = 1, times: list[float] | None = None) -> None:
        """Count `what` (`n` things of `kind`; once, however often it is read) as left out; `times`: the sample
        times it held, where the index tells them (a gap in the recording, with its size)."""
        if times and what not in self.spans:
            self.spans[what] = (min(times), max(times), len(times))
        if what not in self._seen and n > 0:
            self._seen[what] = (kind, n)
            self.reasons.setdefault(kind, reason)

    def merge(self, other: Damage) -> None:
        """Add what another reader of the same recording found (a dump's worker process)."""
        for what, (kind, n) in other._seen.items():
            self.add(what, kind, other.reasons.get(kind, ""), n)
        for path, why in other.indexes.items():
            self.indexes.setdefault(path, why)
        for what, span in other.spans.items():
            self.spans.setdefault(what, span)

    def counts(self) -> dict[str, int]:
        """How many things of each kind were left out."""
        out: dict[str, int] = {}
        for kind, n in self._seen.values():
            out[kind] = out.get(kind, 0) + n
        return out

    @property
    def total(self) -> int:
        """How many things were left out in all."""
        return sum(n for _, n in self._seen.values())

    def note(self) -> str:
        """One line saying what was left out and why ("" when nothing was), for a terminal."""
        counts = self.counts()
        parts = [plural(counts[k], *_KINDS.get(k, (k, k + "s"))) for k in sorted(counts, key=_kind_order)]
        out = []
        if parts:
            first = next(k for k in sorted(counts, key=_kind_order))
            lost = sum(n for _, _, n in self.spans.values())
            held = f", which held {plural(lost, 'sample')}" if lost else ""
            out.append(f"skipped {', '.join(parts)}{held} ({first}: {self.reasons[first]})")
        if self.indexes:
            path, why = next(iter(self.indexes.items()))
            n = len(self.indexes)
            out.append(f"{plural(n, 'damaged index', 'damaged indexes')} read around by scanning "
                       f"{'its segment' if n == 1 else 'their segments'} ({os.path.basename(path)}: {why})")
        return printable("; ".join(out))


def _kind_order(kind: str) -> int:
    return list(_KINDS).index(kind) if kind in _KINDS else len(_KINDS)


@dataclass
class _Segment:
    path: str
    meta: dict[str, Any] | None
    # per chunk: the sample times, and how to get its lines
    chunks: list[tuple[list[float], Callable[[], Chunk]]] = field(default_factory=list)
    events: list[RecordedEvent] = field(default_factory=list)
    summaries: dict[int, tuple[Any, Any]] = field(default_factory=dict)  # chunk -> (summary, its crc), unchecked


@dataclass
class Piece:
    """The samples of one frame within a range: their times, the frame's summary where the whole frame is in the
    range and its index entry has a good one, and its Snapshots (decoded when asked for)."""

    rec: Recording
    lo: int  # the samples' places in time order, lo to hi (not included)
    hi: int
    summary: dict[str, Any] | None

    @property
    def times(self) -> list[float]:
        """The samples' times."""
        return self.rec._ts[self.lo:self.hi]

    def snapshots(self) -> Iterator[tuple[int, Snapshot]]:
        """(place in the frame, Snapshot) of each sample, decoded; damaged ones skipped and counted."""
        for j in range(self.lo, self.hi):
            snap = self.rec._snapshot(j)
            if snap is not None:
                yield self.rec._place(j)[2], snap


class Recording:
    """A recording, read: every sample's time, the full Snapshot at any time, and the events."""

    def __init__(self, path: str) -> None:
        path = os.path.abspath(os.path.expanduser(path))
        self.path = path
        self.damage = Damage()
        self._cache: OrderedDict[tuple[int, int], Chunk] = OrderedDict()
        self._dir, files = self._open_files(path)
        loaded = [self._load(name) for name in files]
        self._segments = [seg for seg in loaded if seg is not None]
        metas = [s.meta for s in self._segments if s.meta]
        _refuse_newer(path, metas)
        self.meta: dict[str, Any] = metas[0] if metas else {}
        self._lay_out_samples()
        if not self._ts and not metas:
            self._refuse_if_no_events()

    def _refuse_if_no_events(self) -> None:
        """DltopError for files without samples or meta where they hold no event either: not a recording."""
        if not any(s.events for s in self._segments):
            damage = f" ({self.damage.note()})" if self.damage.total else ""
            raise DltopError(f"{printable(self.path)}: not a dltop recording, or nothing readable in it{damage}")

    def _open_files(self, path: str) -> tuple[str, list[str]]:
        """The recording's directory (opened: self._dir_fd) and its segment files' names."""
        # The directory the user named is followed (as `ls` would); the files in it are opened relative to it.
        directory, files = path, None
        try:
            self._dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC)
        except NotADirectoryError:
            directory, files = os.path.dirname(path), [os.path.basename(path)]
            self._dir_fd = self._open_dir(directory, path)
        except OSError as e:
            raise DltopError(_no_recording(path, e)) from None
        weakref.finalize(self, os.close, self._dir_fd)
        if files is None:
            files = [stem + suffix for stem, suffix in store.list_segments(self._dir_fd, path)]
        if not files:
            raise DltopError(f"no recording in {path} (no segment files)")
        return directory, files

    def _lay_out_samples(self) -> None:
        """Samples in time order: the chunks' times end to end (segments and frames are in time order already);
        a sample's place is its chunk (found by bisecting where each chunk starts) and its number in it."""
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

    def range(self, t0: float | None = None, t1: float | None = None,
              memo: PartMemo | None = None) -> Iterator[Snapshot]:
        """The Snapshots with t0 <= ts <= t1, in time order (damaged ones skipped and counted); with a `memo`,
        a part whose text repeats the sample before's is that one's (the same Snapshots, read faster)."""
        lo = 0 if t0 is None else bisect.bisect_left(self._ts, t0)
        hi = len(self._ts) if t1 is None else bisect.bisect_right(self._ts, t1)
        for j in range(lo, hi):
            snap = self._snapshot(j, memo)
            if snap is not None:
                yield snap

    def pieces(self, t0: float | None = None, t1: float | None = None) -> Iterator[Piece]:
        """The samples with t0 <= ts <= t1 frame by frame, in time order: a frame wholly inside the range comes
        with its summary where its index entry has a good one (none are used where a clock stepped back)."""
        lo = 0 if t0 is None else bisect.bisect_left(self._ts, t0)
        hi = len(self._ts) if t1 is None else bisect.bisect_right(self._ts, t1)
        j = lo
        while j < hi:
            if self._order is not None:
                yield Piece(self, j, hi, None)
                return
            c = bisect.bisect_right(self._chunk_start, j) - 1
            start = self._chunk_start[c]
            end = self._chunk_start[c + 1] if c + 1 < len(self._chunk_start) else len(self._ts)
            si, ci = self._chunk_of[c]
            summary = None
            if j == start and end <= hi:
                raw = self._segments[si].summaries.get(ci)
                summary = None if raw is None else check_summary(raw[0], raw[1], end - start)
            yield Piece(self, j, min(end, hi), summary)
            j = min(end, hi)

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

    def _snapshot(self, j: int, memo: PartMemo | None = None) -> Snapshot | None:
        si, ci, k = self._place(j)
        chunk = self._chunk(si, ci)
        if chunk is None or k >= len(chunk.samples):
            return None
        try:
            return chunk.snapshot(k) if memo is None else chunk.snapshot(k, memo)
        except (DecodeError, ValueError, KeyError, TypeError, RecursionError) as e:
            self.damage.add((self._segments[si].path, ci, "sample", k), "sample", str(e))
            return None

    def _chunk(self, si: int, ci: int) -> Chunk | None:
        key = (si, ci)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        path = self._segments[si].path
        try:
            chunk = self._segments[si].chunks[ci][1]()
        except (OSError, zstandard.ZstdError, store.Malformed) as e:
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            self.damage.add((path, ci, "frame"), "frame", f"does not decompress: {why}",
                            times=self._segments[si].chunks[ci][0])
            self._segments[si].chunks[ci] = ([], lambda: Chunk([]))
            return None
        for i, why in chunk.damaged:
            self.damage.add((path, ci, "line", i), "line", why)
        self._cache[key] = chunk
        while len(self._cache) > _CACHED_CHUNKS:
            self._cache.popitem(last=False)
        return chunk

    @staticmethod
    def _open_dir(directory: str, path: str) -> int:
        try:
            return os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            raise DltopError(_no_recording(path, e)) from None

    def _load(self, name: str) -> _Segment | None:
        """A segment file, its index used where it has a good one; None (counted as damage, with why) when the
        file is refused: not a regular file, a symlink, or bigger than any segment dltop writes."""
        path = os.path.join(self._dir, name)
        try:
            if name.endswith(store.CLOSED_SUFFIX):
                index = _read_index(self._dir_fd, name[: -len(store.CLOSED_SUFFIX)] + store.INDEX_SUFFIX)
                if isinstance(index, dict):
                    return self._indexed(path, name, index)
                if index is not None:
                    self.damage.indexes[path] = index
                raw = store.read_regular(name, self._dir_fd, store.MAX_SEGMENT_BYTES, "segment")
                data, damaged, why = decompress_segment(raw)
                self.damage.add((path, "scan"), "frame", f"does not decompress (read past it): {why}", damaged)
            else:
                data = store.read_regular(name, self._dir_fd, store.MAX_SEGMENT_BYTES, "segment")
        except store.Malformed as e:
            self.damage.add((path, "file"), "segment", f"{name}: {e}")
            return None
        except OSError as e:
            raise DltopError(f"cannot read {printable(path)}: {e.strerror}") from None
        chunk = Chunk.scan(data)
        for i, why in chunk.damaged:
            self.damage.add((path, 0, "line", i), "line", why)
        seg = _Segment(path, chunk.meta, events=chunk.events)
        seg.chunks.append(([s[0] for s in chunk.samples], lambda: chunk))
        return seg

    def _indexed(self, path: str, name: str, index: dict[str, Any]) -> _Segment:
        """The segment as its (checked) index describes it: each frame's header read before it is listed, and a
        frame declaring more than dltop writes (alone, or with the frames before it in the segment) left out."""
        fd, size = store.open_regular(name, self._dir_fd, store.MAX_SEGMENT_BYTES, "segment")
        try:
            meta = index["meta"]
            seg = _Segment(path, meta)
            self.damage.add((path, "closed"), "line", "left out when the recorder closed the segment",
                            index["skipped"])
            seg.events = [RecordedEvent(ts, kind, data) for ts, kind, data in index["events"]]
            room = store.MAX_SEGMENT_BYTES
            for bi, b in enumerate(index["blocks"]):
                offset, length = b["offset"], b["size"]
                if offset + length > size:  # cut short (a truncated copy): this frame and those after it are gone
                    self.damage.add((path, "block", bi), "frame", "cut off (the file is shorter than its index says)",
                                    times=b["times"])
                    continue
                try:
                    room -= frame_size(os.pread(fd, _HEADER_BYTES, offset), room)
                except zstandard.ZstdError as e:
                    self.damage.add((path, "block", bi), "frame", f"does not decompress: {e}", times=b["times"])
                    continue
                if "summary" in b:
                    seg.summaries[len(seg.chunks)] = (b["summary"], b.get("summary_crc"))
                seg.chunks.append((b["times"], _frame_loader(self._dir_fd, name, offset, length)))
        finally:
            os.close(fd)
        return seg


_HEADER_BYTES = 18  # the longest zstd frame header: what `frame_size` reads


def _no_recording(path: str, e: OSError) -> str:
    if e.errno in (errno.ENOENT, errno.ENOTDIR):
        return f"no such recording: {path}"
    return f"cannot read recording {path}: {e.strerror}"


def index_times(text: str) -> list[float]:
    """A frame's sample times from the index: little-endian float64s in base64 (read in microseconds, where a
    JSON list of 3,600 numbers per segment took milliseconds). ValueError when the text is not that."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("sample times: not base64") from None
    if len(raw) % 8:
        raise ValueError("sample times: not whole float64s")
    times = array.array("d")
    times.frombytes(raw)
    if sys.byteorder != "little":
        times.byteswap()
    return times.tolist()


def _frame_loader(dir_fd: int, name: str, offset: int, length: int) -> Callable[[], Chunk]:
    def load() -> Chunk:
        fd, _ = store.open_regular(name, dir_fd, store.MAX_SEGMENT_BYTES, "segment")
        try:
            data = os.pread(fd, length, offset)
        finally:
            os.close(fd)
        return Chunk.scan(decompress_frame(data))

    return load


MAX_INDEX_BYTES = 64 << 20  # a day's index is ~1 MB (its events): one bigger than this is not read


def _read_index(dir_fd: int, name: str) -> dict[str, Any] | str | None:
    """A closed segment's index, checked entry by entry; None when it is missing, or why it is not used when
    it is damaged or refused (not a regular file, a symlink, bigger than MAX_INDEX_BYTES): the segment is then
    scanned whole. What is returned is safe to use as it is: offsets and sizes are ints in order, times are real
    times, events are [ts, kind, data]; each block has its "times"."""
    try:
        raw = store.read_regular(name, dir_fd, MAX_INDEX_BYTES, "index")
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"cannot read it: {e.strerror}"
    except store.Malformed as e:
        return str(e)
    try:
        index = store.loads(raw)
        _check_index(index)
    except (store.Malformed, ValueError) as e:
        return str(e)
    return index  # type: ignore[no-any-return]


def _refuse_newer(path: str, metas: list[dict[str, Any]]) -> None:
    """DltopError where a segment's meta says a newer dltop made it (a format or schema this one does not read)."""
    for m in metas:
        for key, mine in (("format", store.FORMAT_VERSION), ("schema", SCHEMA_VERSION)):
            if isinstance(m.get(key), int) and m[key] > mine:
                by = printable(str(m.get("dltop"))[:20])
                raise DltopError(f"{printable(path)}: made by a newer dltop ({by}: {key} {m[key]}; this one, "
                                 f"{__version__}, reads up to {mine}); read it with that dltop or a newer one")


def _check_index(index: Any) -> None:
    """ValueError naming the first entry of the index that is not what the recorder writes."""
    if not isinstance(index, dict) or not isinstance(index.get("blocks"), list):
        raise ValueError("not an index")
    _check_crc(index)
    if index.get("meta") is not None and not (isinstance(index["meta"], dict) and store.shallow(index["meta"])):
        raise ValueError("meta: not an object")
    index.setdefault("meta", None)
    index["skipped"] = _checked_count(index.get("skipped") or 0, "skipped")
    index["events"] = _checked_events(index.get("events") or [])
    end = 0
    for n, b in enumerate(index["blocks"]):
        end = _check_block(n, b, end)


def _checked_count(value: Any, what: str) -> int:
    if type(value) is not int or not 0 <= value <= 1 << 32:
        raise ValueError(f"{what}: not a count")
    return value


def _check_crc(index: dict[str, Any]) -> None:
    """The index's own checksum, where it has one (a dltop before it wrote none)."""
    if "crc" in index:
        top = [index.get(k) for k in ("format", "meta", "samples", "skipped", "first_ts", "last_ts", "events")]
        if index["crc"] != store.entry_crc(top):
            raise ValueError("checksum does not match")


def _checked_events(events: Any) -> list[Any]:
    """The index's events, each [ts, kind, data] with its time a float."""
    if not isinstance(events, list):
        raise ValueError("events: not a list")
    for n, ev in enumerate(events):
        if not _is_event(ev):
            raise ValueError(f"event {n}: not [ts, kind, data]")
        ev[0] = float(ev[0])
    return events


def _is_event(ev: Any) -> bool:
    """An event as the recorder writes it: [ts, kind, data]."""
    return (isinstance(ev, list) and len(ev) == 3 and store.valid_ts(ev[0]) is not None
            and isinstance(ev[1], str) and isinstance(ev[2], dict) and store.shallow(ev[2]))


def _check_block(n: int, b: Any, end: int) -> int:
    """ValueError naming what is wrong with block `n` of an index, which must start at `end`; else where the
    block ends, its sample times read into b["times"]."""
    if not isinstance(b, dict):
        raise ValueError(f"block {n}: not an object")
    offset, size, text = b.get("offset"), b.get("size"), b.get("ts")
    if "crc" in b and b["crc"] != store.entry_crc([b.get(k) for k in ("offset", "size", "first_ts", "last_ts",
                                                                          "ts", "samples")]):
        raise ValueError(f"block {n}: checksum does not match")
    if type(offset) is not int or type(size) is not int or not isinstance(text, str):
        raise ValueError(f"block {n}: offset, size or ts of the wrong type")
    if offset != end or not 0 < size <= MAX_FRAME_BYTES:  # frames are written end to end
        raise ValueError(f"block {n}: offset {offset} or size {size} is not where the frames lie")
    b["times"] = _block_times(n, b, text)
    return offset + size


def _block_times(n: int, b: dict[str, Any], text: str) -> list[float]:
    """Block n's sample times (ValueError where one is not a time, or their count is not its samples')."""
    times = index_times(text)
    if any(store.valid_ts(t) is None for t in times):
        raise ValueError(f"block {n}: a sample time that is not a time")
    if b.get("samples", len(times)) != len(times):
        raise ValueError(f"block {n}: {len(times)} sample times for {b.get('samples')!r} samples")
    return times


def recorded_tab(events: list[RecordedEvent], ts: float) -> str | None:
    """The tab the recording's TUI showed at `ts` (its last "view" event by then, else its first one), or None
    (a recording made by `dltop record`, or one from elsewhere naming no known tab)."""
    views = [e for e in events if e.kind == "view" and isinstance(e.data, dict) and e.data.get("tab") in TAB_NAMES]
    before = [e for e in views if e.ts <= ts]
    chosen = before[-1] if before else views[0] if views else None
    return str(chosen.data["tab"]) if chosen is not None else None
