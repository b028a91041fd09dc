"""What /proc says of each GPU process, beside NVML's or amdsmi's numbers: user, command, parent, host RSS, CPU %
and start time.

One bounded, non-blocking read of /proc/PID/stat per process per tick; the user and command once per process.
CPU % is the CPU time between two reads of the same process (pid and start time) over the time between them, as
top computes it.
"""

from __future__ import annotations

import errno
import os
import pwd
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass

from dltop import procfs

MAX_STAT_BYTES = 4096  # /proc/PID/stat is one line of 52 numbers and a 16-byte comm: under 1 KiB
FIRST_READ = "CPU % needs two reads of the process: known from the next tick"
MAX_KEPT_FDS = 512  # /proc/PID/stat files kept open between ticks (one pread a tick, not open, fstat, read, close)
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


def read_stat(path: str, keep: bool = False) -> tuple[bytes, int, int | None]:
    """/proc/PID/stat in one read (the kernel writes it whole), its owner (the process's, as /proc/PID's) and,
    with `keep`, the fd left open for the next read (else None); non-blocking and checked to be a regular file as
    procfs.read_bytes does (a captured tree may hold a FIFO in its place); OSError saying why not."""
    fd = os.open(path, _FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, f"{procfs.kind_of(st.st_mode)}, not a file", path)
        data = os.read(fd, MAX_STAT_BYTES + 1)
        if len(data) > MAX_STAT_BYTES:
            raise OSError(errno.EFBIG, f"larger than {MAX_STAT_BYTES} bytes, more than the kernel writes", path)
    except BaseException:
        os.close(fd)
        raise
    if not keep:
        os.close(fd)
    return data, st.st_uid, fd if keep else None


def parse_btime(text: str) -> int:
    """The boot time (epoch seconds) from /proc/stat's `btime` line; raises Malformed."""
    for line in text.splitlines():
        if line.startswith("btime "):
            value = procfs.parse_count(line[6:].strip())
            if value is None:
                raise Malformed(f"btime is {line[6:30]!r}, not a count")
            return value
    raise Malformed("no btime line")


NOT_IN_NAMESPACE = ("pid {pid} is not in this PID namespace's /proc: dltop runs in another container or namespace "
                    "than the process (run dltop with --pid=host), or the process just exited")
IDENTITY_FIELDS = ("user", "command")
HOST_FIELDS = ("ppid", "host_rss_bytes", "cpu_percent", "started_at")


@dataclass(frozen=True)
class HostFacts:
    """One process's /proc facts as the model stores them (who, what, since when, its stat numbers), and why each
    missing one is missing."""

    ppid: int | None = None
    host_rss_bytes: int | None = None
    cpu_percent: float | None = None
    started_at: float | None = None
    start_time_ticks: int | None = None
    user: str | None = None
    command: str | None = None
    parent_user: str | None = None  # the parent's (a torchrun agent's), for the tree's launcher row
    parent_command: str | None = None
    unavailable: tuple[tuple[str, str], ...] = ()


def parse_cmdline(raw: bytes) -> str:
    """/proc/PID/cmdline (NUL-separated arguments) as one line, the way ps shows it."""
    return " ".join(os.fsdecode(a) for a in raw.rstrip(b"\0").split(b"\0"))


class HostReader:
    """The /proc facts of GPU processes (NVML's and amdsmi's share it): one read of /proc/PID/stat per process
    per tick (its owner from the same fd), the user and command read once per process (pid, start time: a
    reused pid is another process), the last CPU time of each for its CPU %, and the boot time."""

    def __init__(self, proc: str = "/proc", clock: Callable[[], float] = time.monotonic) -> None:
        self._proc = proc
        self._clock = clock
        self._tick_hz = os.sysconf("SC_CLK_TCK")
        self._page_bytes = os.sysconf("SC_PAGE_SIZE")
        self._btime: int | str | None = None  # epoch seconds, or why /proc/stat gave none
        # (pid, start) -> (cpu ticks, when read, the CPU % computed then): the base of the next CPU %
        self._last: dict[tuple[int, int], tuple[int, float, float | None]] = {}
        self._names: dict[tuple[int, int], tuple[str | None, str | None, str | None]] = {}  # user, command, why
        self._users: dict[int, str] = {}
        # (pid, start) -> (its ppid, the parent's user, command): a parent keeps its pid while its child lives
        # (an orphan is adopted: another ppid, read again)
        self._parents: dict[tuple[int, int], tuple[int, str | None, str | None]] = {}
        self._tick: dict[int, HostFacts] = {}  # pid -> this tick's (a process on two GPUs is read once)
        self._seen: set[tuple[int, int]] = set()
        # pid -> its /proc/PID/stat, open: the fd holds the process, not the number (once it is reaped a read
        # fails with ESRCH, so a reused pid is opened again, never read through the old fd)
        self._fds: dict[int, int] = {}

    def close(self) -> None:
        """Close the stat files kept open."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def _stat(self, pid: int, path: str) -> tuple[bytes, int | None]:
        """The process's stat text, through its fd kept open where there is one (the owner then is not read
        again: None), else opened and checked (read_stat) and kept open for the next tick."""
        fd = self._fds.get(pid)
        if fd is not None:
            try:
                data = os.pread(fd, MAX_STAT_BYTES + 1, 0)
            except OSError:
                data = b""  # ESRCH: it exited; a process under that pid now is another one
            if data and len(data) <= MAX_STAT_BYTES:
                return data, None
            del self._fds[pid]
            os.close(fd)
        data, uid, fd = read_stat(path, keep=len(self._fds) < MAX_KEPT_FDS)
        if fd is not None:
            self._fds[pid] = fd
        return data, uid

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
        """The process's facts this tick; a process that cannot be read has each field None with the reason."""
        facts = self._tick.get(pid)
        if facts is None:
            facts = self._tick[pid] = self._read(pid)
        return facts

    def _read(self, pid: int) -> HostFacts:
        path = f"{self._proc}/{pid}/stat"
        # The reasons name no pid and no root: one note holds for every process it is true of.
        try:
            raw, uid = self._stat(pid, path)
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ESRCH):
                why = NOT_IN_NAMESPACE.format(pid=pid)
                return HostFacts(unavailable=tuple((f, why) for f in (*IDENTITY_FIELDS, *HOST_FIELDS)))
            return self._unread(pid, f"cannot read its /proc/PID/stat: {e.strerror or e}")
        try:
            st = parse_stat(raw)
        except Malformed as e:
            return self._unread(pid, f"its /proc/PID/stat is damaged: {e}")
        return self._facts_of(pid, (pid, st.start_time_ticks), uid, st)

    def _facts_of(self, pid: int, key: tuple[int, int], uid: int | None, st: ProcStat) -> HostFacts:
        """The facts of a process from its stat fields: CPU % against the last read, the rest as read."""
        now = self._clock()
        self._seen.add(key)
        missing: list[tuple[str, str]] = []
        names = self._names.get(key)
        if names is None:
            if uid is None:  # read through a kept fd, yet not known under this start time: a new process there
                uid = os.fstat(self._fds[pid]).st_uid
            names = self._names[key] = self._identity(pid, uid)
        user, command, no_command = names
        if no_command is not None:
            missing.append(("command", no_command))
        cpu, no_cpu = self._cpu_percent(key, st.cpu_ticks, now)
        if no_cpu is not None:
            missing.append(("cpu_percent", no_cpu))
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
        parent = self._parents.get(key)
        if parent is None or parent[0] != st.ppid:
            parent = self._parents[key] = (st.ppid, *self._parent(st.ppid))
        return HostFacts(ppid=st.ppid, host_rss_bytes=rss, cpu_percent=cpu, started_at=started,
                         start_time_ticks=st.start_time_ticks, user=user, command=command, parent_user=parent[1],
                         parent_command=parent[2], unavailable=tuple(missing))

    def _cpu_percent(self, key: tuple[int, int], cpu_ticks: int, now: float) -> tuple[float | None, str | None]:
        """The process's CPU % since its last read, or why there is none yet."""
        last = self._last.get(key)
        if last is None:
            self._last[key] = (cpu_ticks, now, None)
            return None, FIRST_READ
        if cpu_ticks < last[0]:
            self._last[key] = (cpu_ticks, now, None)
            return None, "its CPU time went back between two reads: a damaged /proc"
        if now - last[1] < MIN_INTERVAL_S:
            # CPU time counts in ticks (10 ms): over a few ms one tick reads as 1000%. The last figure stands
            # until the interval is long enough to be true.
            return last[2], None if last[2] is not None else f"less than {MIN_INTERVAL_S:g} s since its first read"
        cpu = round(100 * (cpu_ticks - last[0]) / self._tick_hz / (now - last[1]), 1)
        self._last[key] = (cpu_ticks, now, cpu)
        return cpu, None

    def _parent(self, ppid: int) -> tuple[str | None, str | None]:
        """The parent's user and command (the tree's launcher row), None where it cannot be read; none for pid 1
        and the kernel's 0 (no launcher: init adopts orphans)."""
        if ppid <= 1:
            return None, None
        try:
            uid = os.stat(f"{self._proc}/{ppid}").st_uid
        except OSError:
            return None, None
        user, command, _ = self._identity(ppid, uid)
        return user, command

    def _user(self, uid: int) -> str:
        user = self._users.get(uid)
        if user is None:
            try:
                user = pwd.getpwuid(uid).pw_name
            except KeyError:
                user = str(uid)  # a uid with no name here (another container's user)
            self._users[uid] = user
        return user

    def _identity(self, pid: int, uid: int) -> tuple[str | None, str | None, str | None]:
        """(user, command, why no command) of a process: read once, at its first tick."""
        base = f"{self._proc}/{pid}"
        try:
            # procfs.read_bytes: a captured tree may hold a FIFO or a link to /dev/zero in their place.
            command = parse_cmdline(procfs.read_bytes(f"{base}/cmdline", procfs.MAX_ARGS_BYTES))
            if not command:  # a zombie or a kernel thread: ps shows [comm]
                command = f"[{os.fsdecode(procfs.read_bytes(f'{base}/comm', 4096).strip())}]"
        except OSError as e:
            return self._user(uid), None, f"cannot read {base}/cmdline: {e.strerror or e}"
        return self._user(uid), command, None

    def _unread(self, pid: int, why: str) -> HostFacts:
        """A process whose stat cannot be read (a captured tree's FIFO, a damaged file): its stat numbers say
        why; its user and command are read anyway, each tick (no start time keys them)."""
        try:
            uid = os.stat(f"{self._proc}/{pid}").st_uid
        except OSError:
            return HostFacts(unavailable=tuple((f, why) for f in (*IDENTITY_FIELDS, *HOST_FIELDS)))
        user, command, no_command = self._identity(pid, uid)
        missing = [(f, why) for f in HOST_FIELDS]
        if no_command is not None:
            missing.append(("command", no_command))
        return HostFacts(user=user, command=command, unavailable=tuple(missing))

    def end_tick(self) -> None:
        """Forget the processes not read since the last call (they exited, or their pid was reused)."""
        for kept in (self._last, self._names, self._parents):
            for key in [k for k in kept if k not in self._seen]:
                del kept[key]
        for pid in [p for p in self._fds if p not in self._tick]:
            os.close(self._fds.pop(pid))
        self._seen.clear()
        self._tick.clear()
