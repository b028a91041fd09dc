"""What /proc says of each GPU process, beside NVML's numbers: parent, host RSS, CPU % and start time.

One bounded, non-blocking read of /proc/PID/stat per process per tick (procfs.read_bytes); CPU % is the CPU time
between two reads of the same process (pid and start time) over the time between them, as top computes it.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass

from dltop.sources import procfs

MAX_STAT_BYTES = 4096  # /proc/PID/stat is one line of 52 numbers and a 16-byte comm: under 1 KiB
FIRST_READ = "CPU % needs two reads of the process: known from the next tick"
MIN_INTERVAL_S = 0.5  # the shortest interval a CPU % is computed over (CPU time counts in 10 ms ticks)


class Malformed(ValueError):
    """A /proc/PID/stat (or /proc/stat) text that is not what the kernel writes; the message says what is wrong."""


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/PID/stat the GPU table shows (proc(5) numbering)."""

    ppid: int  # field 4
    cpu_ticks: int  # utime + stime (fields 14, 15), in clock ticks
    start_time_ticks: int  # field 22, clock ticks since boot
    rss_pages: int  # field 24


def parse_stat(raw: bytes) -> ProcStat:
    """/proc/PID/stat's fields; raises Malformed saying which is wrong. The command (field 2) is in parentheses
    and may hold spaces and ')': the fields are split after the last ')'."""
    close = raw.rfind(b")")
    if close < 0 or b"(" not in raw[:close]:
        raise Malformed("no (comm) field")
    fields = raw[close + 1:].split(None, 22)  # field 3 (state) to 24 (rss), the rest in one piece
    if len(fields) < 22:
        raise Malformed(f"{len(fields) + 2} fields, fewer than 24")
    values = []
    for number, i in _STAT_FIELDS:
        text = fields[i]
        # bytes.isdigit is ASCII digits only; 20 digits bound a 64-bit count (rss is a signed long in the
        # kernel's format: a negative one is a damaged file as any other)
        if not text.isdigit() or len(text) > 20 or (value := int(text)) > procfs.MAX_COUNT:
            raise Malformed(f"field {number} is {text[:24].decode('ascii', errors='replace')!r}, not a count")
        values.append(value)
    ppid, utime, stime, start, rss = values
    return ProcStat(ppid=ppid, cpu_ticks=utime + stime, start_time_ticks=start, rss_pages=rss)


_STAT_FIELDS = ((4, 1), (14, 11), (15, 12), (22, 19), (24, 21))  # (proc(5)'s number, index after the comm)
_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


def read_stat(path: str) -> bytes:
    """/proc/PID/stat in one read (the kernel writes it whole), non-blocking and checked to be a regular file as
    procfs.read_bytes does (a captured tree may hold a FIFO in its place); OSError saying why not."""
    fd = os.open(path, _FLAGS)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, f"{procfs.kind_of(mode)}, not a file", path)
        data = os.read(fd, MAX_STAT_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_STAT_BYTES:
        raise OSError(errno.EFBIG, f"larger than {MAX_STAT_BYTES} bytes, more than the kernel writes", path)
    return data


def parse_btime(text: str) -> int:
    """The boot time (epoch seconds) from /proc/stat's `btime` line; raises Malformed."""
    for line in text.splitlines():
        if line.startswith("btime "):
            value = procfs.parse_count(line[6:].strip())
            if value is None:
                raise Malformed(f"btime is {line[6:30]!r}, not a count")
            return value
    raise Malformed("no btime line")


@dataclass(frozen=True)
class HostFacts:
    """One process's /proc numbers as the model stores them, and why each missing one is missing."""

    ppid: int | None = None
    host_rss_bytes: int | None = None
    cpu_percent: float | None = None
    started_at: float | None = None
    start_time_ticks: int | None = None
    unavailable: tuple[tuple[str, str], ...] = ()


HOST_FIELDS = ("ppid", "host_rss_bytes", "cpu_percent", "started_at")


class HostReader:
    """Reads /proc/PID/stat of GPU processes, keeping each one's last CPU time for its CPU % and the boot time."""

    def __init__(self, proc: str = "/proc", clock: Callable[[], float] = time.monotonic) -> None:
        self._proc = proc
        self._clock = clock
        self._tick_hz = os.sysconf("SC_CLK_TCK")
        self._page_bytes = os.sysconf("SC_PAGE_SIZE")
        self._btime: int | str | None = None  # epoch seconds, or why /proc/stat gave none
        # (pid, start) -> (cpu ticks, when read, the CPU % computed then): the base of the next CPU %
        self._last: dict[tuple[int, int], tuple[int, float, float | None]] = {}
        self._seen: set[tuple[int, int]] = set()

    def _boot_time(self) -> int | str:
        if self._btime is None:
            path = f"{self._proc}/stat"
            try:
                self._btime = parse_btime(procfs.read_text(path))
            except OSError as e:
                self._btime = f"cannot read {path}: {e.strerror or e}"
            except Malformed as e:
                self._btime = f"{path}: {e}"
        return self._btime

    def read(self, pid: int) -> HostFacts:
        """The process's facts now; a process that cannot be read has each field None with the reason."""
        path = f"{self._proc}/{pid}/stat"
        # The reasons name no pid and no root: one note holds for every process it is true of.
        try:
            st = parse_stat(read_stat(path))
        except OSError as e:
            return _none(f"cannot read its /proc/PID/stat: {e.strerror or e}")
        except Malformed as e:
            return _none(f"its /proc/PID/stat is damaged: {e}")
        now = self._clock()
        key = (pid, st.start_time_ticks)
        self._seen.add(key)
        missing: list[tuple[str, str]] = []
        cpu: float | None = None
        last = self._last.get(key)
        if last is None:
            self._last[key] = (st.cpu_ticks, now, None)
            missing.append(("cpu_percent", FIRST_READ))
        elif st.cpu_ticks < last[0]:
            self._last[key] = (st.cpu_ticks, now, None)
            missing.append(("cpu_percent", "its CPU time went back between two reads: a damaged /proc"))
        elif now - last[1] < MIN_INTERVAL_S:
            # CPU time counts in ticks (10 ms): over a few ms one tick reads as 1000%. The last figure stands
            # until the interval is long enough to be true.
            cpu = last[2]
            if cpu is None:
                missing.append(("cpu_percent", f"less than {MIN_INTERVAL_S:g} s since its first read"))
        else:
            cpu = round(100 * (st.cpu_ticks - last[0]) / self._tick_hz / (now - last[1]), 1)
            self._last[key] = (st.cpu_ticks, now, cpu)
        boot = self._boot_time()
        started: float | None = None
        if isinstance(boot, str):
            missing.append(("started_at", boot))
        else:
            started = boot + st.start_time_ticks / self._tick_hz
        rss: int | None = st.rss_pages * self._page_bytes
        if rss is not None and rss > procfs.MAX_COUNT:
            rss = None
            missing.append(("host_rss_bytes", "stat's rss is beyond any machine's memory: a damaged file"))
        return HostFacts(ppid=st.ppid, host_rss_bytes=rss, cpu_percent=cpu, started_at=started, start_time_ticks=st.start_time_ticks, unavailable=tuple(missing))

    def end_tick(self) -> None:
        """Forget the processes not read since the last call (they exited)."""
        for key in [k for k in self._last if k not in self._seen]:
            del self._last[key]
        self._seen.clear()


def _none(reason: str) -> HostFacts:
    return HostFacts(unavailable=tuple((f, reason) for f in HOST_FIELDS))
