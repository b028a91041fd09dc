"""The dataset watch's inotify drain: a thread reads the events of every watched folder into counts per file
(opened, closed, written, its folder's listing changed), and the read takes them: which files to measure again.

Our own measuring opens files too: those events are counted apart (`own`) and taken off a file's count once
every one of them has been read (`settle`), so what is left of a file's count is a job's.
"""

from __future__ import annotations

import os
import struct
import sys
import threading
from collections import Counter
from itertools import compress
from operator import gt

from dltop import kernel
from dltop.procfs import name_this_thread

# What a folder's watch reports: its files opened and closed (a read or a write), their names coming and going,
# and the folder itself going away. IN_ACCESS/IN_MODIFY are left out: one per read() or write() call, and an
# open comes before either.
WATCH_MASK = (kernel.IN_OPEN | kernel.IN_CLOSE_WRITE | kernel.IN_CLOSE_NOWRITE | kernel.IN_ATTRIB
              | kernel.IN_CREATE | kernel.IN_DELETE | kernel.IN_MOVED_FROM | kernel.IN_MOVED_TO
              | kernel.IN_DELETE_SELF | kernel.IN_MOVE_SELF | kernel.IN_ONLYDIR | kernel.IN_DONT_FOLLOW
              | kernel.IN_EXCL_UNLINK)
_LISTING = kernel.IN_CREATE | kernel.IN_DELETE | kernel.IN_MOVED_FROM | kernel.IN_MOVED_TO
_GONE = kernel.IN_DELETE_SELF | kernel.IN_MOVE_SELF | kernel.IN_IGNORED | kernel.IN_UNMOUNT
_SLOW = kernel.IN_Q_OVERFLOW | _GONE | kernel.IN_ISDIR | _LISTING | kernel.IN_ATTRIB  # all but a file's open/close
_CHANGED = kernel.IN_CLOSE_WRITE | kernel.IN_ATTRIB  # its size, data or links may differ: stat it again
_EVENT = struct.Struct("iIII")
# What a run of records of one size may hold to be counted in bulk: a file's open and close, nothing else.
_BULK = frozenset((kernel.IN_OPEN, kernel.IN_CLOSE_NOWRITE, kernel.IN_CLOSE_WRITE))
BULK_MIN = 8  # records in a run for it to be counted in bulk (below: one by one)
_KEY_STRUCTS: dict[int, struct.Struct] = {}  # by record size: a record's (watch, padded name)
DRAIN_EVERY_S = 0.5  # the event queue (16,384 by default) is read this often, so a busy loader cannot overflow it


Key = tuple[int, bytes]  # a file's events: (its folder's watch, its name NUL-padded as the kernel sends it)


class EventDrain:
    """One inotify instance and the counts its events add up to since the last read (`collect`)."""

    def __init__(self) -> None:
        self.fd = kernel.inotify_init()
        self.lock = threading.Lock()
        # Names stay bytes, NUL-padded as the kernel sends them (a name's padding depends on its length alone, see
        # `padded`): names are decoded only for the files measured again.
        self.touched: Counter[Key] = Counter()  # events per file since the last read
        self.open: dict[Key, int] = {}  # opens less closes seen: > 0 while someone holds it open
        self.own: dict[Key, int] = {}  # events our own measuring caused (an open and a close each)
        self.changed: set[Key] = set()  # closed after a write, or its attributes changed
        self.relist: set[int] = set()  # folders whose listing changed
        self.resync = True  # measure everything (the first read, a queue overflow, a drop_caches)
        self.closed = threading.Event()
        self._thread = threading.Thread(target=self._drain_loop, name="dltop-watch", daemon=True)
        self._thread.start()

    def add_watch(self, path: str) -> int:
        """Watch folder `path`; its watch descriptor (OSError: none, e.g. max_user_watches reached)."""
        return kernel.inotify_add_watch(self.fd, path, WATCH_MASK)

    def rm_watch(self, wd: int) -> None:
        """Stop watching the folder of `wd`."""
        kernel.inotify_rm_watch(self.fd, wd)

    def _drain_loop(self) -> None:
        name_this_thread("dltop-watch")
        while not self.closed.wait(DRAIN_EVERY_S):
            with self.lock:
                self.drain()

    def drain(self) -> None:
        """Read every queued event into the counts (called with the lock held)."""
        fd = self.fd
        if fd < 0:
            return
        while True:
            try:
                buf = os.read(fd, 1 << 16)
            except OSError:  # BlockingIOError: the queue is empty
                return
            self.take(buf)

    def take(self, buf: bytes) -> None:
        """The events of one read of the inotify fd into the counts."""
        pos, end = 0, len(buf)
        while pos < end:
            # A run of records of the size of the one at `pos` (a dataset's names are mostly of one padded
            # length): counted in bulk when it holds only files' opens and closes, else one by one.
            size = 16 + _EVENT.unpack_from(buf, pos)[3]
            k = _run(buf, pos, size)
            stop = pos + k * size
            if k >= BULK_MIN:
                masks = memoryview(buf)[pos:stop].cast("I")[1::size >> 2].tolist()
                if _BULK.issuperset(masks):
                    self._bulk(buf[pos:stop], size, masks)
                    pos = stop
                    continue
            pos = self._one_by_one(buf, pos, stop)

    def _bulk(self, run: bytes, size: int, masks: list[int]) -> None:
        """Records of one `size`, each a file's open or close (`masks`), into the counts."""
        st = _KEY_STRUCTS.get(size)
        if st is None:
            st = _KEY_STRUCTS[size] = struct.Struct(f"=i12x{size - 16}s")
        keys = list(st.iter_unpack(run))
        self.touched.update(keys)  # counted in C
        opened, changed = self.open, self.changed
        get, pop, is_open, written = opened.get, opened.pop, kernel.IN_OPEN, kernel.IN_CLOSE_WRITE
        for key, mask in zip(keys, masks, strict=True):  # in order: a close seen before its open counts nothing
            if mask == is_open:
                opened[key] = get(key, 0) + 1
                continue
            left = get(key, 0) - 1
            if left > 0:
                opened[key] = left
            else:
                pop(key, None)
            if mask == written:
                changed.add(key)

    def _one_by_one(self, buf: bytes, pos: int, stop: int) -> int:
        """The records of `buf` from `pos` up to `stop` (at least one) into the counts; where the next one starts."""
        touched, opened, unpack = self.touched, self.open, _EVENT.unpack_from
        while True:
            wd, mask, _cookie, n = unpack(buf, pos)
            name = buf[pos + 16:pos + 16 + n]
            pos += 16 + n
            if mask & _SLOW:
                self._other_event(wd, mask, name)
            else:  # a file opened or closed: nearly every event
                key = (wd, name)
                touched[key] += 1
                if mask & kernel.IN_OPEN:
                    opened[key] = opened.get(key, 0) + 1
                elif (left := opened.get(key, 0) - 1) > 0:
                    opened[key] = left
                else:
                    opened.pop(key, None)
                if mask & _CHANGED:
                    self.changed.add(key)
            if pos >= stop:
                return pos

    def _other_event(self, wd: int, mask: int, name: bytes) -> None:
        """An event other than a file's open or close: an overflow, a folder gone or its listing changed, a file's
        attributes changed."""
        if mask & kernel.IN_Q_OVERFLOW:
            self.resync = True
            self.open.clear()
        elif mask & _GONE and not name:
            self.relist.add(wd)
        elif mask & kernel.IN_ISDIR:
            if mask & (_LISTING | kernel.IN_ATTRIB):
                self.relist.add(wd)
        elif mask & _LISTING:
            self.relist.add(wd)
        else:  # IN_ATTRIB
            key = (wd, name)
            self.touched[key] += 1
            self.changed.add(key)

    def settle(self) -> None:
        """Drain, then take our own events off the counts at once: every event our opens and closes caused has been
        read by now (inotify queues an event before the call that caused it returns), so what is left of a file's
        count is a job's. Our counts are not kept until the next read: a full scan's were a key per file, twice."""
        with self.lock:
            self.drain()
            touched = self.touched
            for key, n in self.own.items():
                left = touched[key] - n
                if left > 0:
                    touched[key] = left
                else:
                    touched.pop(key, None)
            self.own = {}

    def count_own(self, key: Key) -> None:
        """One open and one close of ours on the file of `key`. Only the measuring thread touches `own` (the drain
        thread counts events, `collect` compares): no lock."""
        own = self.own
        own[key] = own.get(key, 0) + 2

    def own_event(self, wd: int | None, name: str | bytes) -> None:
        """`count_own` for file `name` of the folder watched as `wd` (None: not watched, nothing to count)."""
        if wd is not None:
            self.count_own((wd, padded(name if isinstance(name, bytes) else os.fsencode(name))))

    def reset_open(self) -> None:
        """After an overflow the open counts are unknown: start them again from the events that follow."""
        with self.lock:
            self.open.clear()

    def collect(self, full: bool) -> tuple[bool, list[Key], set[int], set[Key]]:
        """What changed since the last collect, the counts started again: whether to measure everything (`full`, an
        overflow, the first read), the files with events of a job's, the folders whose listing changed, and the
        files written or changed."""
        with self.lock:
            self.drain()
            resync, self.resync = self.resync or full, False
            own, touched = self.own, self.touched
            # Files with more events than our own measuring caused (set difference and map in C: every file we
            # measured is among them, and a job's reads too).
            dirty = list(touched.keys() - own.keys())
            dirty.extend(compress(own, map(gt, map(touched.__getitem__, own), own.values())))
            dirty.extend(k for k in self.open if touched[k] <= own.get(k, 0))
            relist, self.relist = self.relist, set()
            changed, self.changed = self.changed, set()
            self.touched, self.own = Counter(), {}
        return resync, dirty, relist, changed

    def close(self) -> None:
        """Stop the drain thread and drop every watch."""
        self.closed.set()
        with self.lock:
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1


def padded(name: bytes) -> bytes:
    """`name` as an inotify record carries it: NUL-padded to the next multiple of 16 bytes past its end."""
    return name + b"\0" * (((len(name) + 16) & ~15) - len(name))


def _run(buf: bytes, pos: int, size: int) -> int:
    """How many records from `pos` on are `size` bytes long (at least 1: the one at `pos`). Each one of them is
    read at a true record's start, the first of another size too (every one before it was `size`): so their
    length fields, compared in C, say where the run ends."""
    count = (len(buf) - pos) // size
    if count <= 1 or size & 3:
        return 1
    lens = memoryview(buf)[pos:pos + count * size].cast("I")[3::size >> 2].tobytes()
    want = (size - 16).to_bytes(4, sys.byteorder) * count
    if lens == want:
        return count
    lo, hi = 1, count  # lens[:4 lo] matches, lens[:4 hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if lens[:4 * mid] == want[:4 * mid]:
            lo = mid
        else:
            hi = mid
    return lo
