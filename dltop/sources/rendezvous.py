"""Where the probes on this machine are, in the kernel's word (docs/probe.md, "How dltop finds probes").

A folder's name or a field in a file is a claim; the uid that owns a process, a file or a file descriptor is the
kernel's answer. So dltop derives the per-user folders from the users that run processes here (`/proc/PID` is owned
by its process's uid) and checks each folder's owner, and it finds the probes whose folder was refused (another
user made `/dev/shm/dltop-UID` first) from the processes themselves: a memfd named `dltop-probe` in `/proc/PID/fd`.
A folder anyone can write (/dev/shm, a shared $DLTOP_PROBE_DIR) is only swept slowly, within a budget, for the
folders of users that run nothing here any more (their exited jobs), each owner-checked and capped per user.
Each process's file descriptors (and its owner: a process may change its uid after it starts) are looked at when it
is first seen, then again after 1, 2, 4, ... up to 64 s (a probe may start after its process), within a time
budget per reading shared fairly between users.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass

from dltop.probe.files import MEMFD_LINK, PROBE_DIR_ENV, pid_namespace, probe_dir

ProbeDir = tuple[str, int] | tuple[str, int, int]  # (directory, its owner's uid[, the PID namespace of its files])
MAX_FDS = 8192  # descriptors looked at per process: more are its owner's own doing, and said so
SCAN_BUDGET_S = 0.05  # of a reading's time spent looking at descriptors; the rest waits for the next reading
RESCAN_MAX_S = 64.0  # a process without a probe is looked at again after 2, 4, ... up to this many seconds
SWEEP_BUDGET_S = 0.01  # of a reading's time for the slow look for the folders of users that run nothing here
SWEEP_EVERY_S = 60.0
UID = "0|[1-9][0-9]{0,9}"  # a uid as a folder's name: no leading zeros (`dltop-065507` is no second name of 65507)
SWEEP_PER_USER = 16  # folders a sweep keeps of one user (a pod's each): more are that user's own doing, and said


@dataclass
class _Process:
    uid: int
    pidns: int | None
    memfd: int | None = None  # the descriptor that holds its probe's memfd
    due: float = 0.0  # time.monotonic() of the next look at its descriptors
    wait: float = 1.0
    cut: bool = False  # it holds more than MAX_FDS descriptors: not all were looked at


class _Sweep:
    """A slow walk of a folder anyone can write (/dev/shm, a shared $DLTOP_PROBE_DIR) for the probe folders of users
    that run nothing here any more (their exited jobs' files, for the post-mortem): SWEEP_BUDGET_S a reading, again
    every SWEEP_EVERY_S. A folder counts only if the kernel says its owner is the uid its name claims: 50,000
    folders another user names `dltop-N` cost a few readings' slices, and none is ever read."""

    def __init__(self, base: str, pattern: str) -> None:
        self.base = base
        self.pattern = re.compile(pattern)
        self.entries: Iterator[os.DirEntry[str]] | None = None
        self.next_at = 0.0
        self.found: dict[str, ProbeDir] = {}
        self.cut: dict[int, int] = {}  # uid -> folders of it past SWEEP_PER_USER in the last pass
        self._counting: dict[int, int] = {}

    def _kept(self, uid: int) -> int:
        return sum(1 for d in self.found.values() if d[1] == uid)

    def _take(self, entry: os.DirEntry[str], m: re.Match[str]) -> None:
        """A folder named for a uid, kept where that uid owns it (up to SWEEP_PER_USER of each user's)."""
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            return
        uid = int(m.group(1))
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
            return
        self._counting[uid] = n = self._counting.get(uid, 0) + 1
        ns = m.group(2) if m.lastindex and m.lastindex > 1 else None
        if n <= SWEEP_PER_USER and self._kept(uid) < SWEEP_PER_USER:
            self.found[entry.path] = (entry.path, uid) if ns is None else (entry.path, uid, int(ns))

    def step(self, now: float, until: float) -> None:
        if self.entries is None:
            if now < self.next_at:
                return
            try:
                self.entries = os.scandir(self.base)
            except OSError:
                self.next_at = now + SWEEP_EVERY_S
                return
            self._counting = {}
        for entry in self.entries:
            m = self.pattern.fullmatch(entry.name)
            if m:
                self._take(entry, m)
            if time.monotonic() > until:
                return
        self.entries = None
        self.next_at = now + SWEEP_EVERY_S
        self.cut = {uid: n - SWEEP_PER_USER for uid, n in self._counting.items() if n > SWEEP_PER_USER}


class Rendezvous:
    """The processes here (pid -> owner, PID namespace, probe memfd), kept between readings: one listing of
    /proc and a stat of each new pid per reading, the descriptors of the processes that are due."""

    def __init__(self, proc: str = "/proc", user: int | None = None, env: dict[str, str] | None = None) -> None:
        self.proc = proc
        self.me = os.getuid()
        self.user = user if user is not None else (None if self.me == 0 else self.me)
        environ = dict(os.environ if env is None else env)
        self.shared = environ.get(PROBE_DIR_ENV) or None
        self.own = probe_dir(self.me, {k: v for k, v in environ.items() if k != PROBE_DIR_ENV})
        self.table: dict[int, _Process] = {}
        self.notes: list[tuple[str, str]] = []  # (where, why) of what a reading left out
        self.sweeps = [] if self.me != 0 else [
            _Sweep("/dev/shm", rf"dltop-({UID})"),
            *([_Sweep(self.shared, rf"({UID})\.([1-9][0-9]{{0,19}})")] if self.shared else [])]

    def wanted(self, uid: int) -> bool:
        """Whether this dltop shows `uid`'s probes (`--user`; a user other than root sees only its own)."""
        return self.user is None or uid == self.user

    def set_owner(self, pid: int, uid: int) -> None:
        """The kernel's owner of `pid` as a reading just found it (a pid reused by another user's process)."""
        p = self.table.get(pid)
        if p is not None:
            p.uid = uid

    def refresh(self, now: float | None = None) -> None:
        """Bring the table up to date: new processes added (their owner from the kernel), gone ones dropped, and
        the descriptors of those that are due looked at, within SCAN_BUDGET_S."""
        now = time.monotonic() if now is None else now
        self.notes = []
        try:
            pids = {int(n) for n in os.listdir(self.proc) if n.isdigit()}
        except OSError as e:
            self.notes.append((self.proc, f"cannot list: {e.strerror}"))
            return
        for gone in self.table.keys() - pids:
            del self.table[gone]
        for pid in pids - self.table.keys():
            try:
                uid = os.stat(f"{self.proc}/{pid}").st_uid
            except OSError:
                continue
            pidns = pid_namespace(self.proc, pid) if self.shared else None
            self.table[pid] = _Process(uid, pidns, due=now)
        self._scan(now)
        until = time.monotonic() + SWEEP_BUDGET_S
        for sweep in self.sweeps:
            sweep.step(now, until)
            self.notes += [(sweep.base, f"uid {uid}: {n} more folders past {SWEEP_PER_USER}: not read")
                           for uid, n in sorted(sweep.cut.items()) if self.wanted(uid)]

    def _scan(self, now: float) -> None:
        due: dict[int, list[int]] = {}
        for pid, p in self.table.items():
            if p.memfd is None and p.due <= now and (self.me == 0 or p.uid == self.me):
                due.setdefault(p.uid, []).append(pid)
        # round robin over the users: one user's thousand processes do not hold up another's
        order = [pid for group in itertools.zip_longest(*due.values()) for pid in group if pid is not None]
        deadline = time.monotonic() + SCAN_BUDGET_S
        for i, pid in enumerate(order):
            if time.monotonic() > deadline:
                self.notes.append((self.proc, f"{len(order) - i} processes not yet looked at for a probe's memfd: "
                                              f"the next readings go on"))
                return
            p = self.table[pid]
            try:  # again: a process may change its uid after it starts (setpriv, su, a daemon dropping root)
                p.uid = os.stat(f"{self.proc}/{pid}").st_uid
            except OSError:
                continue
            p.memfd, p.cut = self._memfd_of(pid)
            p.due = now + p.wait
            p.wait = min(p.wait * 2, RESCAN_MAX_S)

    def _memfd_of(self, pid: int) -> tuple[int | None, bool]:
        where = f"{self.proc}/{pid}/fd"
        try:
            with os.scandir(where) as entries:
                for n, entry in enumerate(entries):
                    if n == MAX_FDS:
                        return None, True
                    with contextlib.suppress(OSError, ValueError):
                        if os.readlink(entry.path) == MEMFD_LINK:
                            return int(entry.name), False
        except OSError:
            pass
        return None, False

    def forget_memfd(self, pid: int) -> None:
        """The memfd at the remembered descriptor is gone (the probe stopped): look again at the next reading."""
        p = self.table.get(pid)
        if p is not None:
            p.memfd, p.due, p.wait = None, 0.0, 1.0

    def memfds(self) -> list[tuple[int, int, int]]:
        """(pid, descriptor, owner uid when last looked at) of every process here that holds a probe's memfd: the
        reader checks the owner again (a pid may be reused) before it keeps or leaves out what it reads."""
        return [(pid, p.memfd, p.uid) for pid, p in sorted(self.table.items()) if p.memfd is not None]

    def cut(self) -> list[tuple[int, int]]:
        """(pid, uid) of the processes with more descriptors than were looked at."""
        return [(pid, p.uid) for pid, p in sorted(self.table.items()) if p.cut and p.memfd is None]

    def uids(self) -> set[int]:
        """The users whose probes this dltop reads: as root every user that runs a process here (and each
        /run/user/UID, which only the system makes), else dltop's own."""
        if self.me != 0:
            return {self.me}
        found = {p.uid for p in self.table.values()} | {0} | ({self.user} if self.user is not None else set())
        with contextlib.suppress(OSError):
            found |= {int(n) for n in os.listdir("/run/user") if n.isdigit() and len(n) <= 10}
        return {u for u in found if self.wanted(u)}

    def _pod_dirs(self) -> dict[str, ProbeDir]:
        """The shared folder's per-(uid, PID namespace) folders of the processes in pods."""
        out: dict[str, ProbeDir] = {}
        if not self.shared:
            return out
        for p in self.table.values():
            if self.wanted(p.uid) and (self.me == 0 or p.uid == self.me) and p.pidns is not None:
                path = os.path.join(self.shared, f"{p.uid}.{p.pidns}")
                out[path] = (path, p.uid, p.pidns)
        return out

    def dirs(self) -> list[ProbeDir]:
        """The probe folders to read, each with the uid that must own it: derived from the users here, never
        from a listing of a folder anyone can write."""
        out: dict[str, ProbeDir] = {}
        for uid in sorted(self.uids()):
            for path in (f"/run/user/{uid}/dltop", f"/dev/shm/dltop-{uid}"):
                out[path] = (path, uid)
        if self.wanted(self.me):
            out[self.own] = (self.own, self.me)
        out.update(self._pod_dirs())
        for sweep in self.sweeps:
            for path, d in list(sweep.found.items()):
                if not os.path.lexists(path):
                    del sweep.found[path]
                elif self.wanted(d[1]):
                    out.setdefault(path, d)
        return [d for d in out.values() if os.path.lexists(d[0])]
