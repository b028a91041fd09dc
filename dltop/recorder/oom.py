"""Who the OOM killer killed: the victim's pid, command and memory cgroup, from the kernel's own lines in /dev/kmsg
where this process may read it, else from the last sample (a process that was there before the counter rose and
is gone after), each event saying which.

The kernel (mm/oom_kill.c, the same words from Linux 5.0 to 6.18) writes two lines per kill:

    oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/job,task_memcg=/job/a,task=python3,pid=6047,uid=1000
    Memory cgroup out of memory: Killed process 6047 (python3) total-vm:42460kB, anon-rss:32512kB, file-rss:6752kB, shmem-rss:0kB, UID:1000 pgtables:120kB oom_score_adj:0

(`Out of memory: Killed process ...` for a machine-wide OOM, and `,global_oom,task_memcg=...` in the first line).
/dev/kmsg gives each as one record, `PRIO,SEQ,USEC,FLAGS;TEXT`, with every byte below 0x20, from 0x7f, and the
backslash written as `\\xNN`. The command is the victim's own choice (prctl(PR_SET_NAME), up to 15 bytes) and
cgroup names are chosen by whoever may make them: the lines are read from their fixed ends, a command is taken
only between the pid and the fixed `) total-vm:...` tail, and a cgroup only where the two lines agree on the task
and the task's memcg lies inside the OOM's memcg; what cannot be told apart is left unknown, never guessed.

Reading /dev/kmsg needs CAP_SYSLOG where kernel.dmesg_restrict is 1 (Debian's and Ubuntu's default); a
systemd unit with ProtectKernelLogs=yes has no /dev/kmsg at all. Without it the victim is named from the last
sample, said as such: `kmsg_status()` says why.
"""

from __future__ import annotations

import errno
import os
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

KMSG = "/dev/kmsg"
DMESG_RESTRICT = "/proc/sys/kernel/dmesg_restrict"
MAX_PENDING = 64  # "oom-kill:" lines waiting for their "Killed process" line (the kernel writes them together)

_KILLED = re.compile(r"(?:Out of memory|Memory cgroup out of memory)(?: \(oom_kill_allocating_task\))?: "
                     r"Killed process (\d+) \((.*)\) total-vm:(\d+)kB, anon-rss:(\d+)kB, file-rss:(\d+)kB, "
                     r"shmem-rss:(\d+)kB, UID:(\d+) pgtables:\d+kB oom_score_adj:-?\d+", re.S)
_SUMMARY = re.compile(r"oom-kill:constraint=(CONSTRAINT_[A-Z]+),")


@dataclass(frozen=True)
class Victim:
    """One process the OOM killer killed, as the kernel logged it."""

    ts: float  # epoch seconds of the kill
    pid: int
    command: str  # the kernel's text: non-printable bytes and '\\' already written as \xNN
    uid: int
    rss_bytes: int  # anon + file + shmem resident at the kill
    cgroup: str | None = None  # the victim's memory cgroup (task_memcg); None where the lines did not tell
    oom_cgroup: str | None = None  # the memcg whose limit was hit; None for a machine-wide OOM or unknown
    constraint: str | None = None  # CONSTRAINT_MEMCG, CONSTRAINT_NONE, ...

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "command": self.command, "cgroup": self.cgroup, "uid": self.uid,
                "rss_bytes": self.rss_bytes, "oom_cgroup": self.oom_cgroup, "constraint": self.constraint,
                "ts": self.ts}


def parse_record(raw: bytes) -> tuple[int, float, str] | None:
    """(sequence number, seconds since boot, text) of one /dev/kmsg record; None when it is not one."""
    head, sep, rest = raw.partition(b";")
    fields = head.split(b",")
    if not sep or len(fields) < 4:
        return None
    try:
        seq, usec = int(fields[1]), int(fields[2])
    except ValueError:
        return None
    text = rest.split(b"\n", 1)[0]  # continuation lines (" SUBSYSTEM=...") follow the text
    return seq, usec / 1e6, text.decode("ascii", "backslashreplace")


def parse_killed(text: str) -> tuple[int, str, int, int] | None:
    """(pid, command, uid, resident bytes) of a "Killed process" line; None for any other."""
    m = _KILLED.fullmatch(text)
    if m is None:
        return None
    pid, comm, _vm, anon, file, shmem, uid = m.groups()
    return int(pid), comm, int(uid), (int(anon) + int(file) + int(shmem)) << 10


def parse_summary(text: str, pid: int, command: str, uid: int) -> tuple[str, str | None, str | None] | None:
    """(constraint, task memcg, oom memcg) of an "oom-kill:" line about this very task; None when the line is
    about another one. A memcg is None when the line could be read two ways (a cgroup named to look like more
    fields) or the OOM was machine-wide (the oom memcg)."""
    m = _SUMMARY.match(text)
    tail = f",task={command},pid={pid},uid={uid}"
    if m is None or not text.endswith(tail):
        return None
    head = text[: -len(tail)]
    found: set[tuple[str, str | None]] = set()
    marker = ",task_memcg="
    i = head.find(marker)
    while i >= 0:
        left, task_cg = head[:i], head[i + len(marker):]
        if left.endswith(",global_oom"):
            found.add((task_cg, None))
        j = left.find(",oom_memcg=")
        while j >= 0:
            oom_cg = left[j + len(",oom_memcg="):]
            if task_cg == oom_cg or task_cg.startswith(oom_cg.rstrip("/") + "/"):
                found.add((task_cg, oom_cg))
            j = left.find(",oom_memcg=", j + 1)
        i = head.find(marker, i + 1)
    if len(found) != 1:
        return m.group(1), None, None
    [(task_memcg, oom_memcg)] = found
    return m.group(1), task_memcg, oom_memcg


def victims_of(records: Iterable[tuple[float, str]], pending: list[str] | None = None) -> list[Victim]:
    """The victims in kmsg texts (epoch seconds, text), in order; `pending` carries the "oom-kill:" lines whose
    "Killed process" line has not come yet from one call to the next."""
    pending = [] if pending is None else pending
    out: list[Victim] = []
    for ts, text in records:
        if text.startswith("oom-kill:"):
            pending.append(text)
            del pending[:-MAX_PENDING]
            continue
        killed = parse_killed(text)
        if killed is None:
            continue
        pid, comm, uid, rss = killed
        summary = None
        for k in range(len(pending) - 1, -1, -1):
            summary = parse_summary(pending[k], pid, comm, uid)
            if summary is not None:
                del pending[k]
                break
        constraint, cgroup, oom_cgroup = summary if summary is not None else (None, None, None)
        out.append(Victim(ts, pid, comm, uid, rss, cgroup, oom_cgroup, constraint))
    return out


def kmsg_status(path: str = KMSG) -> str | None:
    """None when this process can read the kernel log at `path`, else why not (one line, with the fix)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        return _why(path, e)
    os.close(fd)
    return None


def _why(path: str, e: OSError) -> str:
    if e.errno == errno.ENOENT:
        return f"{path}: not there (a container without the kernel log, or a unit with ProtectKernelLogs=yes)"
    if e.errno in (errno.EPERM, errno.EACCES):
        restrict = _read_small(DMESG_RESTRICT)
        why = "kernel.dmesg_restrict is 1: reading it needs CAP_SYSLOG" if restrict == "1" else e.strerror
        return f"{path}: {why} (run as root, or a unit with CAP_SYSLOG and DeviceAllow=/dev/kmsg r)"
    return f"{path}: {e.strerror or e}"


def _read_small(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read(64).strip()
    except OSError:
        return None


class KmsgReader:
    """The kernel log from now on, read without blocking: `poll()` gives the OOM victims logged since the last
    call. `status` is None while it reads, else why it cannot (then `poll()` gives nothing)."""

    def __init__(self, path: str = KMSG) -> None:
        self.path = path
        self._fd: int | None = None
        self._pending: list[str] = []
        self.status: str | None = None
        try:
            self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            os.lseek(self._fd, 0, os.SEEK_END)  # the kills before this recorder are not this recording's
        except OSError as e:
            self.status = _why(path, e)
            self.close()

    def poll(self, max_records: int = 4096) -> list[Victim]:
        """The victims logged since the last call (at most `max_records` records read: a flooded log costs a
        bounded read per sample; the rest waits for the next)."""
        if self._fd is None:
            return []
        records: list[tuple[float, str]] = []
        boot = time.time() - time.monotonic()  # printk's clock is the monotonic one, since boot
        for _ in range(max_records):
            try:
                raw = os.read(self._fd, 8192)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno == errno.EPIPE:  # the ring wrapped past us: the next read goes on from the oldest
                    continue
                self.status = f"{self.path}: {e.strerror or e}"
                self.close()
                break
            if not raw:
                break
            records += _records(raw, boot)
        return victims_of(records, self._pending)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _records(raw: bytes, boot: float) -> list[tuple[float, str]]:
    """(time, text) of each kernel log record one read gave: one from /dev/kmsg, many from a plain file (tests)."""
    out = []
    for line in raw.split(b"\n"):
        got = parse_record(line) if line and not line.startswith(b" ") else None
        if got is not None:
            out.append((boot + got[1], got[2]))
    return out


def last_seen(prev: Any, cur: Any) -> list[dict[str, Any]]:
    """The processes of the previous sample that the current one no longer has (GPU processes and probed
    processes: the ones a Snapshot names), each as the previous sample saw it: the candidates for a kill the
    counters saw but no kernel log named."""
    out: list[dict[str, Any]] = []
    before, after = _gpu_processes(prev), _gpu_processes(cur)
    for pid in sorted(before.keys() - after.keys()):
        p = before[pid]
        out.append({"pid": pid, "command": p.command, "user": p.user, "rss_bytes": p.host_rss_bytes,
                    "gpu_bytes": p.used_bytes, "seen": "on a GPU"})
    probes_before, probes_after = _probe_processes(prev), _probe_processes(cur)
    for pid in sorted(probes_before.keys() - probes_after.keys() - before.keys()):
        p = probes_before[pid]
        out.append({"pid": pid, "command": getattr(p, "cmd", None), "user": None, "rss_bytes": None,
                    "gpu_bytes": None, "seen": "probed"})
    return out


def _gpu_processes(snap: Any) -> dict[int, Any]:
    gpus = getattr(snap, "gpus", None)
    out: dict[int, Any] = {}
    if not isinstance(gpus, tuple):
        return out
    for g in gpus:
        for procs in (getattr(g, "processes", None), *(getattr(m, "processes", None)
                                                       for m in getattr(g, "mig_devices", ()))):
            if isinstance(procs, tuple):
                out.update({p.pid: p for p in procs})
    return out


def _probe_processes(snap: Any) -> dict[int, Any]:
    part = getattr(snap, "probes", None)
    procs = getattr(part, "processes", None)
    if not isinstance(procs, tuple):
        return {}
    return {p.pid: p for p in procs if isinstance(getattr(p, "pid", None), int)}


def name_victims(events: Sequence[tuple[str, dict[str, Any]]], kmsg: KmsgReader | None, prev: Any, cur: Any,
                 ) -> None:
    """Add to each "oom_kill" event (in place) who was killed: `victims` (pid, command, cgroup, ...) and
    `victims_from` ("kmsg": the kernel's log; "last sample": the processes the previous sample had and this one
    has not, where the kernel log cannot be read, with `kmsg_status` saying why)."""
    ooms = [d for kind, d in events if kind == "oom_kill"]
    victims = kmsg.poll() if kmsg is not None else []
    if not ooms:
        return
    status = "not read" if kmsg is None else kmsg.status  # None: the kernel log is read
    gone = [] if status is None else last_seen(prev, cur)
    for d in ooms:
        if status is None:
            d["victims"] = [v.to_dict() for v in _counted(victims, d)]
            d["victims_from"] = "kmsg"
        else:
            d.update(victims=gone, victims_from="last sample", kmsg_status=status)


def _counted(victims: list[Victim], d: dict[str, Any]) -> list[Victim]:
    """The victims an oom_kill event counts: all for the machine's counter, those of its cgroup for a cgroup's."""
    if d.get("source") != "cgroup":
        return victims
    return [v for v in victims if _counted_by(v, str(d.get("cgroup")))]


def _counted_by(v: Victim, cgroup: str) -> bool:
    """Whether the watched cgroup's counter counts this kill: the victim was inside it, or the limit that was hit
    is above it (a Slurm job's, shared by its steps)."""
    return (v.cgroup is not None and _inside(v.cgroup, cgroup)) or \
        (v.oom_cgroup is not None and _inside(cgroup, v.oom_cgroup))


def _inside(cgroup: str, parent: str) -> bool:
    return cgroup == parent or cgroup.startswith(parent.rstrip("/") + "/")
