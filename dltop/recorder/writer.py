"""The flight recorder's writer: Snapshots and events appended to hourly JSON Lines segments by one thread.

`write()` and `event()` only enqueue (a bounded queue: a stalled disk drops samples, never stalls the Sampler);
the writer thread appends each line with one `write(2)`, so a killed recorder loses at most the line in flight.
A failed write (ENOSPC, EIO) is cut back to the last whole line, warned about once, and retried with the next
sample. Closed segments are compressed to zstd frames with an index; retention and the size cap remove whole
old segments. Every file is made, read and removed relative to an fd held on the directory (checked from / down,
`store.open_directory`): a folder renamed or swapped for a symlink later does not move where it writes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import queue
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from dltop import __version__, procfs
from dltop.errors import DltopError
from dltop.fmt import human_bytes, human_duration, plural
from dltop.hints import WINDOW_S, Hint, hints
from dltop.journal import JournalTail
from dltop.model import SCHEMA_VERSION, CpuPart, GpuDevice, MemoryPart, Snapshot, Unavailable, to_dict
from dltop.model.actions import ActionEvent
from dltop.model.memory import CgroupMemory, VmStat
from dltop.recorder import store
from dltop.recorder.oom import KMSG, KmsgReader, name_victims
from dltop.recorder.segment import compress_segment
from dltop.recorder.summary import Values, sample_values

BLOCK_SAMPLES = 256  # samples per zstd frame of a closed segment: a seek decompresses one frame
_CLOSE = object()


def _removed_line(why: str, gone: list[tuple[str, float | None, float | None]], sizes: dict[str, int]) -> str:
    """One line for the segments removed for one reason: which, the samples they held, their bytes."""
    spans = [(a, b) for _, a, b in gone if a is not None and b is not None]
    covered = f", {human_duration(sum(b - a for a, b in spans))} of samples" if spans else ""
    n_bytes = sum(sizes[stem] for stem, _, _ in gone)
    names = gone[0][0] if len(gone) == 1 else f"{gone[0][0]} to {gone[-1][0]}"
    return f"removed {plural(len(gone), 'segment')} ({names}{covered}, {human_bytes(n_bytes)}): {why}"


class Recorder:
    """Appends Snapshots and events to a recording directory; one per directory (it holds the directory's lock)."""

    def __init__(self, directory: str, interval_s: float = 1.0, retain_s: float | None = 7 * 86400,
                 max_bytes: int | None = 2 << 30, meta: dict[str, Any] | None = None, *,
                 segment_s: float = 3600.0, queue_size: int = 600, block_samples: int = BLOCK_SAMPLES,
                 warn: Callable[[str], None] | None = None, clock: Callable[[], float] = time.time,
                 journals: Sequence[str] | None = None, kmsg: str | None = KMSG) -> None:
        self.directory = os.path.abspath(os.path.expanduser(directory))
        self._dir_fd = store.open_directory(self.directory)
        try:
            self._lock_fd = store.take_lock(self.directory, self._dir_fd)
        except BaseException:
            os.close(self._dir_fd)
            raise
        self._dir_id = _identity(os.fstat(self._dir_fd))
        self._moved = False  # warned that the directory's name no longer leads to it
        self.interval_s = interval_s
        self.retain_s = retain_s
        self.max_bytes = max_bytes
        self._meta = dict(meta or {})
        self._segment_s = segment_s
        self._block_samples = block_samples
        self._warn = warn or (lambda text: print(f"dltop record: {text}", file=sys.stderr, flush=True))
        self._clock = clock
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        self.samples = 0  # written
        self.dropped = 0  # samples the queue had no room for (the disk could not keep up)
        self.lost = 0  # lines a failed write lost (ENOSPC, EIO)
        self.errors: list[str] = []  # what went wrong, newest last (kept short)
        self._closed = False
        # Writer-thread state
        self._fd: int | None = None
        self._stem = ""
        self._seg_start = 0.0
        self._good = 0  # bytes of the open segment that are whole lines
        self._refs: dict[str, Any] = {}  # kept part -> the object last written as a "part" line
        self._values: list[tuple[float, Values]] | None = []  # the report's values of each sample written
        self._pending: list[bytes] = []  # event lines before the first segment opens
        self._failing = False
        self._last_error = ""
        self._lost_before = 0  # self.lost when the current failure began
        self._gap_samples = 0  # samples a failed write lost since the last one written, and when
        self._gap_from = self._gap_to = self._last_written = 0.0
        self._dropped_seen = 0
        self._prev: Snapshot | None = None
        self._history: deque[Snapshot] = deque()
        self._hints: dict[str, Hint] = {}
        self._marks_offset = _size(self._dir_fd, store.MARKS_NAME)  # marks written before this recorder started are old
        self._marks_rest = b""
        # Actions run anywhere on the machine (a warm from a shell): the journals this user trusts, from now on;
        # this process's own come through action_listener.
        self._journal = JournalTail(journals, skip_pid=os.getpid())
        self._journal_bad = 0
        # The OOM killer's victims from the kernel log (recorder/oom.py), where this process may read it.
        self._kmsg = KmsgReader(kmsg) if kmsg else None
        self._thread = threading.Thread(target=self._run, name="dltop-recorder", daemon=True)
        self._thread.start()
        oom_from = "kmsg" if self._kmsg is not None and self._kmsg.status is None else \
            f"last sample ({self._kmsg.status if self._kmsg is not None else 'kernel log not read'})"
        self.event("start", {"pid": os.getpid(), "dltop": __version__, "interval_s": interval_s,
                             "oom_victims_from": oom_from})

    # -- the API (any thread) -----------------------------------------------------------------------------

    def write(self, snapshot: Snapshot, wait: bool = False) -> None:
        """Queue one Snapshot; dropped (and counted) if the writer is that far behind, unless `wait` (a list
        of Snapshots turned into a recording: every one is wanted)."""
        if wait and not self._closed:
            self._queue.put(("sample", snapshot))
        else:
            self._put(("sample", snapshot), sample=True)

    def event(self, kind: str, data: dict[str, Any], ts: float | None = None) -> None:
        """Queue one event ("action", "hint", "gpu_process", "oom_kill", "marker", "start", "stop")."""
        self._put(("event", kind, data, self._clock() if ts is None else ts))

    def action_listener(self, event: ActionEvent) -> None:
        """An ActionRunner listener: logs each run's and release's start and finish (target, bytes, outcome); not
        progress, and not a plan (the measuring a confirmation dialog opens with: nothing was done yet)."""
        if event.phase != "progress" and event.step != "plan":
            self.event("action", {**to_dict(event), "pid": os.getpid(), "uid": os.geteuid()}, ts=event.ts)

    def close(self) -> None:
        """Write the stop event, drain the queue, close and compress the segment, release the lock."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(("event", "stop", {"pid": os.getpid(), "samples": self.samples, "dropped": self.dropped,
                                           "lost": self.lost}, self._clock()))
        self._queue.put(_CLOSE)
        self._thread.join()
        if self._kmsg is not None:
            self._kmsg.close()
        os.close(self._lock_fd)
        os.close(self._dir_fd)

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _put(self, item: Any, sample: bool = False) -> None:
        if self._closed:
            return
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            if sample:
                self.dropped += 1
                if self.dropped == 1:
                    self._warn("the disk is not keeping up: dropping samples")
            else:
                self._queue.put(item)  # events are few and must not be lost: wait for room

    # -- the writer thread --------------------------------------------------------------------------------

    def _run(self) -> None:
        procfs.name_this_thread("dltop-recorder")
        self._housekeep(first=True)
        while True:
            item = self._queue.get()
            if item is _CLOSE:
                self._poll_journal()  # what finished while the last sample was taken
                break
            try:
                if item[0] == "sample":
                    self._sample(item[1])
                else:
                    self._event_line(item[1], item[2], item[3])
            except Exception as e:  # a bug in one line must not stop the recording
                self._note(f"could not record a {item[0]}: {type(e).__name__}: {e}")
        if self._fd is None and self._pending:
            self._open_segment(self._clock(), None)
        self._close_segment()

    def _sample(self, snap: Snapshot) -> None:
        events = self._derived_events(snap)
        if self._fd is None or snap.ts - self._seg_start >= self._segment_s or self._too_big():
            self._close_segment()
            self._open_segment(snap.ts, snap)
        lines, refs = self._encode_sample(snap)
        if self._append(b"".join(lines)):
            self._refs.update(refs)
            self.samples += 1
            self._summarise(snap)
            self._gap_ended(snap.ts)
        else:
            if not self._gap_samples:
                self._gap_from = snap.ts
            self._gap_samples += 1
            self._gap_to = snap.ts
        for kind, data in events:
            self._event_line(kind, data, snap.ts)
        self._poll_marks()
        self._poll_journal()

    def _summarise(self, snap: Snapshot) -> None:
        """Keep what the report takes from the sample just written, for its frame's summary in the index."""
        if self._values is None:
            return
        try:
            self._values.append((snap.ts, sample_values(snap)))
        except Exception as e:  # the segment's frames then have no summary: a report decodes them
            self._values = None
            self._note(f"cannot summarise a sample for the index: {type(e).__name__}: {e}")

    def _gap_ended(self, ts: float) -> None:
        """A "gap" event for the samples lost since the last one written (a failed write, a full queue): the
        report and the replay show the hole with its cause and size."""
        if self._gap_samples:
            self._event_line("gap", {"cause": f"write failed: {self._last_error}", "samples": self._gap_samples,
                                     "from_ts": self._gap_from, "to_ts": self._gap_to}, ts)
            self._gap_samples = 0
        dropped = self.dropped
        if dropped > self._dropped_seen:
            self._event_line("gap", {"cause": "dropped: the disk did not keep up", "samples": dropped - self._dropped_seen,
                                     "from_ts": self._last_written, "to_ts": ts}, ts)
            self._dropped_seen = dropped
        self._last_written = ts

    def _encode_sample(self, snap: Snapshot) -> tuple[list[bytes], dict[str, Any]]:
        lines: list[bytes] = []
        refs: dict[str, Any] = {}
        ref_names = []
        kept: dict[str, Any] = {}
        for name in store.KEPT_PARTS:
            value = getattr(snap, name)
            if value is None:
                continue
            kept[name] = None
            ref_names.append(name)
            last = self._refs.get(name)
            if last is value or (last is not None and last == value):
                continue
            lines.append(store.encode_line(snap.ts, "part", {"name": name, "value": to_dict(value)}))
            refs[name] = value
        body = to_dict(dataclasses.replace(snap, **kept))
        for name in kept:
            del body[name]
        lines.append(store.encode_line(snap.ts, "sample", {"ref": ref_names, "snap": body}))
        return lines, refs

    def _event_line(self, kind: str, data: dict[str, Any], ts: float) -> None:
        line = store.encode_line(ts, "event", {"kind": kind, "data": data})
        if self._fd is None:
            self._pending.append(line)
        else:
            self._append(line)

    def _append(self, data: bytes) -> bool:
        """Append whole lines with one write; on failure cut the file back to its last whole line."""
        assert self._fd is not None
        try:
            if self._failing:
                os.ftruncate(self._fd, self._good)
            view = memoryview(data)
            while view:
                n = os.pwrite(self._fd, view, self._good + len(data) - len(view))
                view = view[n:]
        except OSError as e:
            self.lost += 1
            self._last_error = e.strerror or str(e)
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._good)
            if not self._failing:
                self._failing = True
                self._lost_before = self.lost - 1  # this failure's count starts here: the note says its own
                self._note(f"cannot write {self._path(store.OPEN_SUFFIX)}: {e.strerror}; still sampling, "
                           f"writing again when it can")
            return False
        if self._failing:
            self._failing = False
            self._warn(f"writing again ({self.lost - self._lost_before} lines lost while it could not)")
        self._good += len(data)
        return True

    def _open_segment(self, ts: float, snap: Snapshot | None) -> None:
        self._check_moved()
        self._stem = store.segment_stem(ts, self._dir_fd)
        self._seg_start = ts
        self._good = 0
        self._refs = {}  # a segment stands alone: its first sample writes every kept part
        self._values = []
        try:
            self._fd = store.open_private(self._stem + store.OPEN_SUFFIX, os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                                          dir_fd=self._dir_fd)
        except OSError as e:
            raise DltopError(f"cannot create {self._path(store.OPEN_SUFFIX)}: {e.strerror}") from None
        self._append(store.encode_line(ts, "meta", self._meta_record(ts, snap)))
        pending, self._pending = self._pending, []
        for line in pending:
            self._append(line)

    def _meta_record(self, ts: float, snap: Snapshot | None) -> dict[str, Any]:
        return {**self._meta, "format": store.FORMAT_VERSION, "dltop": __version__, "schema": SCHEMA_VERSION,
                "host": snap.host if snap else socket.gethostname(), "interval_s": self.interval_s,
                "started": ts, "gpus": gpu_inventory(snap.gpus if snap else None),
                "cpu": cpu_summary(snap.cpu if snap else None)}

    def _close_segment(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            os.fsync(fd)
        os.close(fd)
        try:
            compress_segment(self._dir_fd, self._stem, self._block_samples, self._values)
        except (OSError, store.Malformed) as e:
            self._note(f"cannot compress {self._stem}{store.OPEN_SUFFIX}: {getattr(e, 'strerror', None) or e} "
                       f"(kept uncompressed)")
        self._housekeep()

    def _too_big(self) -> bool:
        """Whether the open segment is as big as one may be: an eighth of the size cap, and never more than
        store.SEGMENT_BYTES (a reader reads a segment of up to four times that, and no bigger)."""
        limit = store.SEGMENT_BYTES if self.max_bytes is None else max(1 << 20, self.max_bytes // 8)
        return self._good >= min(limit, store.SEGMENT_BYTES)

    def _check_moved(self) -> None:
        """Warn once when the directory's name no longer leads to the folder written into (renamed, or swapped
        for a symlink): the recording goes on in the folder it was checked as, held open."""
        if self._moved:
            return
        try:
            same = _identity(os.stat(self.directory)) == self._dir_id
        except OSError:
            same = False
        if not same:
            self._moved = True
            self._note(f"{self.directory} was moved or replaced while recording; still writing into the folder "
                       f"it named when the recording started (held open), not into what the name leads to now")

    def _housekeep(self, first: bool = False) -> None:
        """Compress segments a killed recorder left open (at start), then apply retention and the size cap."""
        try:
            segments = store.list_segments(self._dir_fd, self.directory)
            if first:
                for stem, suffix in segments:
                    if suffix == store.OPEN_SUFFIX:
                        try:
                            compress_segment(self._dir_fd, stem, self._block_samples)
                        except store.Malformed as e:  # not one this recorder would have left: left as it is
                            self._note(f"housekeeping: {stem}{store.OPEN_SUFFIX}: {e} (left as it is)")
                    else:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(stem + store.OPEN_SUFFIX, dir_fd=self._dir_fd)
                segments = store.list_segments(self._dir_fd, self.directory)
            self._enforce_limits([s for s, suffix in segments if suffix == store.CLOSED_SUFFIX])
        except (OSError, DltopError) as e:
            self._note(f"housekeeping: {getattr(e, 'strerror', None) or e}")

    def _enforce_limits(self, closed: list[str]) -> None:
        """Closed segments (oldest first) removed while older than --retain or above --max-size in all."""
        now = self._clock()
        sizes = {stem: sum(_size(self._dir_fd, stem + s) for s in (store.CLOSED_SUFFIX, store.INDEX_SUFFIX))
                 for stem in closed}
        total = sum(sizes.values()) + self._good
        removed: dict[str, list[tuple[str, float | None, float | None]]] = {}  # why -> (stem, first, last)
        for stem in closed:  # oldest first
            first, last = _span(self._dir_fd, stem)
            why = self._why_removed(last, now, total)
            if why is None:
                continue
            for s in (store.CLOSED_SUFFIX, store.INDEX_SUFFIX):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(stem + s, dir_fd=self._dir_fd)
            total -= sizes[stem]
            removed.setdefault(why, []).append((stem, first, last))
        for why, gone in removed.items():  # history removed is said, never silent: one line per reason
            self._warn(_removed_line(why, gone, sizes))

    def _why_removed(self, last: float | None, now: float, total: int) -> str | None:
        """Why a closed segment whose last sample is at `last` goes (None: it stays), `total` bytes recorded."""
        if self.retain_s is not None and last is not None and last < now - self.retain_s:
            return f"older than --retain {human_duration(self.retain_s)}"
        if self.max_bytes is not None and total > self.max_bytes:
            return f"above --max-size {human_bytes(self.max_bytes)}"
        return None

    def _poll_marks(self) -> None:
        """Turn the lines `dltop mark` appended since the last look into "marker" events."""
        size = _size(self._dir_fd, store.MARKS_NAME)
        if size < self._marks_offset:  # truncated or replaced: read it from the start
            self._marks_offset, self._marks_rest = 0, b""
        if size == self._marks_offset:
            return
        try:
            fd, _ = store.open_regular(store.MARKS_NAME, self._dir_fd)
            try:
                data = os.pread(fd, min(size - self._marks_offset, 1 << 20), self._marks_offset)
            finally:
                os.close(fd)
        except (OSError, store.Malformed):
            return
        self._marks_offset += len(data)
        *lines, self._marks_rest = (self._marks_rest + data).split(b"\n")
        for raw in lines:
            try:
                mark = json.loads(raw)
                ts, text = float(mark["ts"]), str(mark["text"])
            except (ValueError, KeyError, TypeError):
                continue
            self._event_line("marker", {"text": text, "by": "dltop mark"}, ts)

    def _poll_journal(self) -> None:
        """Turn the actions other processes journalled since the last look into "action" events."""
        for data in self._journal.poll():
            self._event_line("action", data, data["ts"])
        if self._journal.bad > self._journal_bad:
            if not self._journal_bad:
                self._note(f"the action journal holds lines that are not dltop's (left out): "
                           f"{', '.join(self._journal.paths)}")
            self._journal_bad = self._journal.bad

    def _derived_events(self, snap: Snapshot) -> list[tuple[str, dict[str, Any]]]:
        """OOM kills, GPU processes starting and exiting, hints firing and clearing, since the last Snapshot."""
        prev, self._prev = self._prev, snap
        self._history.append(snap)
        while self._history and self._history[0].ts < snap.ts - WINDOW_S:
            self._history.popleft()
        out: list[tuple[str, dict[str, Any]]] = []
        if prev is not None:
            out += oom_events(prev, snap) + gpu_process_events(prev, snap)
        name_victims(out, self._kmsg, prev, snap)  # after the sample: the kernel logs a kill as it counts it
        now = {h.id: h for h in hints(list(self._history))}
        out += hint_events(self._hints, now)
        self._hints = now
        return out

    def _note(self, text: str) -> None:
        self.errors = [*self.errors[-9:], text]
        self._warn(text)

    def _path(self, suffix: str) -> str:
        return os.path.join(self.directory, self._stem + suffix)


def hint_events(before: dict[str, Hint], now: dict[str, Hint]) -> list[tuple[str, dict[str, Any]]]:
    """The hints fired and cleared between two drawings (by id)."""
    fired = [("hint", {"id": hid, "state": "fired", "severity": h.severity, "text": h.text,
                       "numbers": dict(h.numbers)}) for hid, h in now.items() if hid not in before]
    cleared = [("hint", {"id": hid, "state": "cleared", "severity": h.severity, "text": h.text})
               for hid, h in before.items() if hid not in now]
    return fired + cleared


def _size(dir_fd: int, name: str) -> int:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_size
    except OSError:
        return 0


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _span(dir_fd: int, stem: str) -> tuple[float | None, float | None]:
    """The first and last sample's time in a closed segment's index; None when it has none or cannot be read
    (the segment is then removed only by the size cap)."""
    try:
        index = store.loads(store.read_regular(stem + store.INDEX_SUFFIX, dir_fd, 64 << 20, "index"))
    except (OSError, store.Malformed):
        return None, None
    if not isinstance(index, dict):
        return None, None
    return store.valid_ts(index.get("first_ts")), store.valid_ts(index.get("last_ts"))


def gpu_inventory(gpus: Any) -> Any:
    """The GPUs of the meta record: index, name, UUID, bus id, memory total and driver of each."""
    if gpus is None:
        return None
    if isinstance(gpus, Unavailable):
        return to_dict(gpus)
    return [{"index": g.index, "name": g.name, "uuid": g.uuid, "bus_id": g.bus_id,
             "memory_total_bytes": g.memory_total_bytes, "driver_version": g.driver_version}
            for g in gpus if isinstance(g, GpuDevice)]


def cpu_summary(cpu: Any) -> Any:
    """The CPU topology of the meta record: architecture, CPUs, core kinds and cache sizes (the whole part is a
    "part" line)."""
    if not isinstance(cpu, CpuPart):
        return to_dict(cpu) if isinstance(cpu, Unavailable) else None
    sizes: dict[str, int] = {}
    for c in cpu.caches:
        if c.size_bytes:
            sizes[c.name] = sizes.get(c.name, 0) + c.size_bytes
    return {"arch": cpu.arch, "cpus": len(cpu.cpus), "online": len(cpu.online), "arrangement": cpu.arrangement,
            "core_kinds": [k.name for k in cpu.core_kinds], "cache_bytes": sizes}


def oom_events(prev: Snapshot, cur: Snapshot) -> list[tuple[str, dict[str, Any]]]:
    """An "oom_kill" event for each counter that went up: /proc/vmstat's and the memory cgroup's."""
    out: list[tuple[str, dict[str, Any]]] = []
    if not (isinstance(prev.memory, MemoryPart) and isinstance(cur.memory, MemoryPart)):
        return out
    pv, cv = prev.memory.vmstat, cur.memory.vmstat
    if isinstance(pv, VmStat) and isinstance(cv, VmStat) and (n := _rise(pv.oom_kill, cv.oom_kill)):
        out.append(("oom_kill", {"source": "vmstat", "kills": n, "total": cv.oom_kill}))
    pc, cc = prev.memory.cgroup, cur.memory.cgroup
    if isinstance(pc, CgroupMemory) and isinstance(cc, CgroupMemory) and pc.path == cc.path \
            and (n := _rise(pc.oom_kill, cc.oom_kill)):
        out.append(("oom_kill", {"source": "cgroup", "cgroup": cc.path, "kills": n, "total": cc.oom_kill}))
    return out


def _rise(before: int | None, after: int | None) -> int:
    """How much a counter went up between two readings (0 where either lacks it, or it did not)."""
    return after - before if before is not None and after is not None and after > before else 0


def _processes(snap: Snapshot) -> dict[tuple[int, int | None, int], Any] | None:
    if not isinstance(snap.gpus, tuple):
        return None
    out: dict[tuple[int, int | None, int], Any] = {}
    for g in snap.gpus:
        if isinstance(g.processes, tuple):
            out.update({(g.index, None, p.pid): p for p in g.processes})
        for m in g.mig_devices:
            if isinstance(m.processes, tuple):
                out.update({(g.index, m.mig_index, p.pid): p for p in m.processes})
    return out


def gpu_process_events(prev: Snapshot, cur: Snapshot) -> list[tuple[str, dict[str, Any]]]:
    """A "gpu_process" event for each process that appeared on or left a GPU between two Snapshots."""
    before, after = _processes(prev), _processes(cur)
    if before is None or after is None:
        return []
    out: list[tuple[str, dict[str, Any]]] = []
    for state, keys, procs in (("started", after.keys() - before.keys(), after),
                               ("exited", before.keys() - after.keys(), before)):
        for key in sorted(keys, key=lambda k: (k[0], -1 if k[1] is None else k[1], k[2])):
            p = procs[key]
            out.append(("gpu_process", {"state": state, "gpu": key[0], "mig": key[1], "pid": p.pid,
                                        "command": p.command, "user": p.user, "used_bytes": p.used_bytes}))
    return out

