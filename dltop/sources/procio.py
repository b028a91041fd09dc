"""The job's own reads: /proc/PID/io of each probe's process and its children (DataLoader workers), summed, so
the training hints judge IO bound against decode bound by what the job read, not by the busiest disk.

`read_bytes` is what the kernel fetched from storage for the process (a page-cache hit or a tmpfs read adds 0),
`rchar` every byte its read() calls returned. A reaped child's counters fold into its parent's, so the sum holds
when a worker exits. Unreadable (another user's process when dltop is not root) gives a reason, never a number.
"""

from __future__ import annotations

import dataclasses
import errno
import os

from dltop.model.probes import ProbesPart, ProcessProbe
from dltop.probe.files import proc_start_ticks
from dltop.procfs import MAX_COUNT, parse_count

MAX_IO_FILE_BYTES = 4096  # /proc/PID/io is seven short lines
MAX_CHILDREN_FILE_BYTES = 1 << 16
MAX_TREE = 256  # processes summed per job: the process, its workers and theirs
MAX_DEPTH = 3  # the process, its workers, what a worker starts
NEED = (b"rchar", b"read_bytes")


class Unreadable(ValueError):
    """Why a process's reads are not known (permission, exited, a file not of /proc/PID/io's shape)."""


def parse_io(raw: bytes) -> tuple[int, int]:
    """(read_bytes, rchar) from the text of /proc/PID/io; Unreadable names what is wrong with it."""
    found: dict[bytes, int] = {}
    for line in raw.split(b"\n")[:64]:
        key, sep, value = line.partition(b":")
        key, value = key.strip(), value.strip()
        if not sep or key not in NEED:
            continue
        if key in found:
            raise Unreadable(f"{key.decode()} given twice")
        n = parse_count(value.decode("latin-1"))  # a byte past ASCII stays one: never a digit
        if n is None:
            raise Unreadable(f"{key.decode()}: not a counter")
        found[key] = n
    missing = [k.decode() for k in NEED if k not in found]
    if missing:
        raise Unreadable(f"no {' or '.join(missing)}")
    return found[b"read_bytes"], found[b"rchar"]


def _read(path: str, limit: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        return os.read(fd, limit)
    finally:
        os.close(fd)


def read_io(pid: int, proc: str = "/proc") -> tuple[int, int]:
    """(read_bytes, rchar) of one process (all its threads, and its reaped children); Unreadable says why not."""
    try:
        raw = _read(f"{proc}/{pid}/io", MAX_IO_FILE_BYTES)
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM):
            why = ("the kernel refuses it even to root here (a process outside this container, or an LSM)"
                   if os.geteuid() == 0 else "another user's process: run dltop as root")
            raise Unreadable(f"/proc/{pid}/io: permission denied ({why})") from None
        if e.errno in (errno.ENOENT, errno.ESRCH):
            raise Unreadable(f"process {pid} has exited") from None
        raise Unreadable(f"/proc/{pid}/io: {e.strerror}") from None
    try:
        return parse_io(raw)
    except Unreadable as e:
        raise Unreadable(f"/proc/{pid}/io: {e}") from None


def children(pid: int, proc: str = "/proc") -> list[int] | None:
    """The pids of `pid`'s children (/proc/PID/task/*/children: every thread's), or None where the kernel does not
    list them (no CONFIG_PROC_CHILDREN) or the process is gone."""
    try:
        tids = os.listdir(f"{proc}/{pid}/task")
    except OSError:
        return None
    out: list[int] = []
    listed = False
    for tid in sorted(t for t in tids if t.isdigit())[:MAX_TREE]:
        try:
            raw = _read(f"{proc}/{pid}/task/{tid}/children", MAX_CHILDREN_FILE_BYTES)
        except OSError:
            continue  # the thread ended, or no such file on this kernel
        listed = True
        out += [int(w) for w in raw.split() if w.isdigit() and len(w) <= 10]
    return out if listed else None


@dataclasses.dataclass(frozen=True)
class JobReads:
    """A job's reads summed over its process tree, or why they are not known."""

    read_bytes: int | None
    rchar_bytes: int | None
    processes: int
    unavailable: str | None = None


def job_reads(pid: int, start_time_ticks: int, proc: str = "/proc") -> JobReads:
    """The reads of `pid` (it must still be the process that started at `start_time_ticks`) and its children,
    summed. A child that exits meanwhile is skipped (its counts reach the parent once reaped); one that cannot
    be read for another reason makes the sum unknown, with the reason."""
    try:
        read_bytes, rchar = read_io(pid, proc)
        if proc_start_ticks(pid, proc) != start_time_ticks:
            raise Unreadable(f"process {pid} has exited")
    except Unreadable as e:
        return JobReads(None, None, 0, str(e))
    seen = {pid}
    counted = 1
    level = [pid]
    for _ in range(MAX_DEPTH - 1):
        below: list[int] = []
        for parent in level:
            kids = children(parent, proc)
            if kids is None and parent == pid:
                return JobReads(None, None, 0, f"/proc/{pid}/task/*/children not listed (a kernel without "
                                "CONFIG_PROC_CHILDREN): its DataLoader workers' reads are unknown")
            got = _children_reads(kids or [], seen, proc)
            if isinstance(got, str):
                return JobReads(None, None, 0, got)
            read_bytes, rchar, counted = read_bytes + got[0], rchar + got[1], counted + len(got[2])
            below += got[2]
        level = below
    return JobReads(min(read_bytes, MAX_COUNT), min(rchar, MAX_COUNT), counted)


def _children_reads(kids: list[int], seen: set[int], proc: str) -> tuple[int, int, list[int]] | str:
    """(read_bytes, rchar) of the children not `seen` yet (MAX_TREE processes tried in all), summed, and those
    read (one that exits meanwhile is skipped); why not, where one cannot be read."""
    read_bytes = rchar = 0
    read: list[int] = []
    for child in kids:
        if child in seen or len(seen) >= MAX_TREE:
            continue
        seen.add(child)
        try:
            r, c = read_io(child, proc)
        except Unreadable as e:
            if str(e).endswith("has exited"):
                continue
            return f"a child of the process: {e}"
        read_bytes, rchar = read_bytes + r, rchar + c
        read.append(child)
    return read_bytes, rchar, read


def with_job_reads(part: ProbesPart, root: str = "/") -> ProbesPart:
    """`part` with each process's own reads (io_read_bytes, io_rchar_bytes; io_unavailable says why not)."""
    proc = os.path.join(root, "proc")
    out: list[ProcessProbe] = []
    for p in part.processes:
        got = job_reads(p.pid, p.start_time_ticks, proc)
        out.append(dataclasses.replace(p, io_read_bytes=got.read_bytes, io_rchar_bytes=got.rchar_bytes,
                                       io_processes=got.processes if got.unavailable is None else None,
                                       io_unavailable=got.unavailable))
    return dataclasses.replace(part, processes=tuple(out))
