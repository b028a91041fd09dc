"""Datasets found without a flag: the folders that training jobs read (docs/datasets.md, "Datasets found without
a flag").

The jobs are the live processes with a probe (docs/probe.md: `probe.track`, zero-code `DLTOP_PROBE=1`) and --pid's
process, each with its children (DataLoader workers) a few levels down. A job is looked at when first seen and
again every REVISIT_S (workers open their shards after start), within LOOK_BUDGET_S a read: the regular files its
processes hold open for reading (/proc/PID/fd: readlink, then stat through the fd, never an open of the file), and
the folder its probe names (`data_dir`, a DataLoader dataset's `root`). Their folders are grouped to a dataset's
root (`group_folders`), each root scanned within SCAN_BUDGET_S, never walked whole.

What another user's process holds open is that user's claim: the process's owner is the kernel's (the uid of
/proc/PID/status), a path is taken only where it names, from here, the very file the fd holds (same device and
inode), and `/`, system folders, homes, Python prefixes and what holds them are never a dataset
(`cache_roots.root_refusal`, with the trees in NEVER_BELOW). A non-root dltop looks at its own user's jobs only.
"""

from __future__ import annotations

import functools
import itertools
import os
import stat
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dltop.cache_roots import homes, known_prefixes, root_refusal
from dltop.model.datasets import DatasetResidency, DatasetUnavailable, FoundDataset, FoundReader
from dltop.probe.files import proc_start_ticks
from dltop.residency.scan import scan_one
from dltop.residency.walk import WalkOptions
from dltop.sources.procio import children

REVISIT_S = 30.0  # a job's open files are looked at again this often
LOOK_BUDGET_S = 0.1  # /proc time a read spends on the jobs' descriptors; the jobs not reached wait for the next
SCAN_BUDGET_S = 2.0  # one found dataset's scan: what it did not reach is said (complete False)
READ_SCANS_S = 4.0  # scans a read starts, at most (the rest are scanned at the next read)
RESCAN_S = 60.0  # a found dataset is measured again this often at most (at once after an action on it)
SCAN_SHARE = 0.005  # the found datasets' scans together: at most this share of a core (after d s of CPU, d / 0.5%)
MAX_FDS = 4096  # descriptors looked at per process
MAX_PROCESSES = 64  # processes per job: the process, its DataLoader workers and theirs
MAX_DEPTH = 3
MAX_FOLDERS = 256  # folders remembered per job
MAX_FOUND = 32  # found datasets kept, the most read first
MAX_PATH = 4096
CLIMB = 2  # a root lies at most this many levels above the folder of a file it groups
# Trees no dataset is taken from (beside cache_roots' system folders, homes and prefixes): the kernel's, the
# system's run-time state and logs. /dev/shm's own folders are allowed (a dataset copied to shared memory).
NEVER_BELOW = ("/proc", "/sys", "/dev", "/run", "/var/run", "/var/log", "/var/cache", "/var/lib", "/var/spool",
               "/boot", "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/snap")
ALLOWED_BELOW = ("/dev/shm",)


def _under(path: str, folder: str) -> bool:
    return folder == "/" or path == folder or path.startswith(folder.rstrip("/") + "/")


@dataclass
class Job:
    """One probed process (with its workers) as discovery knows it between reads."""

    pid: int
    start_ticks: int
    uid: int
    user: str | None
    job: str
    cmd: str
    named: str | None = None  # the folder the job names (its probe's data_dir), when it passes the rules
    folders: dict[str, int] = field(default_factory=dict)  # folder of a file read -> its device
    open_now: dict[str, int] = field(default_factory=dict)  # folder -> files open in it at the last look
    next_look: float = 0.0


class Rules:
    """Which folders may be a dataset's root: never `/`, a system folder (or below NEVER_BELOW), a home, a Python
    prefix, or what holds one; each answer kept (a folder is asked about once)."""

    def __init__(self, extra_homes: Iterable[str] = ()) -> None:
        self.home_of = homes(extra_homes)
        self.prefixes = known_prefixes(os.environ)
        self.allowed = functools.lru_cache(maxsize=4096)(self._allowed)

    def _allowed(self, path: str) -> bool:
        if not path.startswith("/") or len(path) > MAX_PATH or "\0" in path:
            return False
        if _never_below(path):
            return False
        if any(p != "/" and _under(path, p) for p in self.prefixes):
            return False
        return root_refusal(path, home_of=self.home_of, prefixes=self.prefixes) is None


def _never_below(path: str) -> bool:
    """`path` lies in one of NEVER_BELOW, and not inside one of ALLOWED_BELOW."""
    if any(_under(path, a) and path != a for a in ALLOWED_BELOW):
        return False
    return any(_under(path, t) for t in NEVER_BELOW)


def group_folders(folders: Mapping[str, int], named: str | None, allowed: Callable[[str], bool],
                  device_of: Callable[[str], int | None]) -> dict[str, set[str]]:
    """{root: the folders it groups} of one job. A folder below the one the job names has that root; the others
    are merged, in path order, into their deepest common folder where it lies at most CLIMB levels above each of
    them, on their filesystem (never above its top) and passes `allowed`; a folder that is not allowed itself (a
    file directly in /tmp or in a home) is no dataset."""
    out: dict[str, set[str]] = {}
    if named is not None:
        out[named] = {f for f in folders if _under(f, named)} or {named}
    rest = sorted(f for f in folders if (named is None or not _under(f, named)) and allowed(f))
    for root, _dev, members in _merged(rest, folders, allowed, device_of):
        out.setdefault(root, set()).update(members)
    return out


def _merged(rest: list[str], folders: Mapping[str, int], allowed: Callable[[str], bool],
            device_of: Callable[[str], int | None]) -> list[tuple[str, int, set[str]]]:
    """(root, device, folders) of the folders `rest`, in path order, each merged into the group before it where
    they have a common root."""
    groups: list[tuple[str, int, set[str]]] = []
    for f in rest:
        dev = folders[f]
        common = _common_root(groups[-1], f, dev, allowed, device_of) if groups else None
        if common is None:
            groups.append((f, dev, {f}))
        else:
            groups[-1] = (common, dev, groups[-1][2] | {f})
    return groups


def _common_root(group: tuple[str, int, set[str]], f: str, dev: int, allowed: Callable[[str], bool],
                 device_of: Callable[[str], int | None]) -> str | None:
    """The root the group and folder `f` on device `dev` merge into, None where they do not: their deepest common
    folder, at most CLIMB levels above each, on their filesystem, and allowed."""
    root, gdev, members = group
    if gdev != dev:
        return None
    common = os.path.commonpath([root, f])
    depth = common.count("/") if common != "/" else 0
    if any(m.count("/") - depth > CLIMB for m in (*members, f)):
        return None
    return common if allowed(common) and device_of(common) == dev else None


def merge_roots(roots: Iterable[str]) -> dict[str, str]:
    """{root: the outermost root it lies in (itself where none)}: a root found inside another is shown in it."""
    ordered = sorted(set(roots))
    out: dict[str, str] = {}
    outer: list[str] = []
    for r in ordered:
        holder = next((o for o in outer if _under(r, o)), None)
        if holder is None:
            outer.append(r)
            holder = r
        out[r] = holder
    return out


def _read_small(path: str, limit: int = 4096) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        return os.read(fd, limit)
    finally:
        os.close(fd)


def process_uid(proc: str, pid: int) -> int | None:
    """The real uid of the process (the first number of /proc/PID/status's Uid line), or None."""
    try:
        raw = _read_small(f"{proc}/{pid}/status", 1 << 14)
    except OSError:
        return None
    for line in raw.split(b"\n"):
        if line.startswith(b"Uid:"):
            first = line[4:].split()[:1]
            if first and first[0].isdigit() and len(first[0]) <= 10:
                return int(first[0])
    return None


def _read_only(proc: str, pid: int, fd: str) -> bool:
    """Whether the descriptor was opened for reading only (fdinfo's flags: O_WRONLY and O_RDWR are outputs)."""
    try:
        raw = _read_small(f"{proc}/{pid}/fdinfo/{fd}", 4096)
    except OSError:
        return False
    for line in raw.split(b"\n"):
        if line.startswith(b"flags:"):
            value = line[6:].strip()
            return value.isdigit() and len(value) <= 12 and int(value, 8) & 3 == os.O_RDONLY
    return False


def open_files(proc: str, pid: int, deadline: float) -> dict[str, tuple[int, int]] | None:
    """{path: (device, inode)} of the regular files `pid` holds open for reading, each checked: a path from
    readlink is kept only where it names, from here, the file the fd holds (not deleted, not another mount
    namespace's path, not renamed since). At most MAX_FDS descriptors; None where the folder cannot be listed."""
    out: dict[str, tuple[int, int]] = {}
    done: set[str] = set()  # paths checked already: a descriptor of one of them costs one readlink
    base = f"{proc}/{pid}/fd"
    try:
        it = os.scandir(base)
    except OSError:
        return None
    with it:
        for n, entry in enumerate(it):
            if n >= MAX_FDS or time.monotonic() > deadline:
                break
            if entry.name.isdigit() and (got := _open_file(proc, pid, entry.name, done)) is not None:
                out[got[0]] = got[1]
    return out


def _open_file(proc: str, pid: int, fd: str, done: set[str]) -> tuple[str, tuple[int, int]] | None:
    """(path, (device, inode)) of descriptor `fd` where it is a regular file open for reading only that its path
    names from here; None for anything else (a pipe, a socket, a FIFO, a device, a deleted file, one gone)."""
    link = f"{proc}/{pid}/fd/{fd}"
    try:
        target = os.readlink(link)
    except OSError:
        return None  # closed meanwhile, or a path too long to name
    if target in done or not _file_path(target):
        return None  # seen in this look already; pipe:[...], socket:[...], anon_inode:..., a deleted file
    done.add(target)
    try:
        st = os.stat(link)  # the fd's own file, without opening it (a FIFO does not block)
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_nlink == 0 or not _read_only(proc, pid, fd) or not _names(target, st):
        return None
    return target, (st.st_dev, st.st_ino)


def _file_path(target: str) -> bool:
    """A descriptor's link names a file: absolute, not deleted, not too long, not in /proc, /sys or /dev (but
    /dev/shm)."""
    if not target.startswith("/") or target.endswith(" (deleted)") or len(target) > MAX_PATH:
        return False
    return not target.startswith(("/proc/", "/sys/", "/dev/")) or target.startswith("/dev/shm/")


def _names(path: str, st: os.stat_result) -> bool:
    """`path` names, from here, the regular file `st` is of (not another mount namespace's path, not renamed)."""
    try:
        here = os.lstat(path)
    except (OSError, ValueError):
        return False
    return (here.st_dev, here.st_ino) == (st.st_dev, st.st_ino) and stat.S_ISREG(here.st_mode)


def process_tree(proc: str, pid: int, uid: int) -> list[int]:
    """`pid` and its children (DataLoader workers) to MAX_DEPTH, MAX_PROCESSES at most, those of the same uid."""
    seen, level = [pid], [pid]
    for _ in range(MAX_DEPTH - 1):
        below: list[int] = []
        for parent in level:
            for child in children(parent, proc) or []:
                if child in seen or len(seen) >= MAX_PROCESSES or process_uid(proc, child) != uid:
                    continue
                seen.append(child)
                below.append(child)
        level = below
    return seen


def _device(path: str) -> int | None:
    try:
        return os.stat(path).st_dev
    except (OSError, ValueError):
        return None


def _named_folder(data_dir: str | None, rules: Rules) -> str | None:
    """The folder a probe names, resolved, when it is one and passes the rules."""
    if not data_dir or not data_dir.startswith("/") or len(data_dir) > MAX_PATH or "\0" in data_dir:
        return None
    try:
        real = os.path.realpath(data_dir)
        if not stat.S_ISDIR(os.stat(real).st_mode):
            return None
    except (OSError, ValueError):
        return None
    return real if rules.allowed(real) else None


def _as_reader(j: Job, root: str, members: set[str], top: str, old: FoundReader | None) -> FoundReader:
    """The job as a reader of `top` through its group `root` of `members`, merged with `old`, its reader through
    another group in the same `top`."""
    n = sum(c for f, c in j.open_now.items() if f in members or _under(f, top))
    named = root == j.named
    if old is not None:
        n, named = max(n, old.files_open), named or old.named
    return FoundReader(j.pid, j.uid, j.user, j.job, j.cmd, n, named)


def _most_read(readers: dict[str, dict[int, FoundReader]]) -> dict[str, list[FoundReader]]:
    """The MAX_FOUND roots with the most files open, each with its readers in pid order."""
    ranked = sorted(readers.items(), key=lambda kv: (-sum(r.files_open for r in kv[1].values()), kv[0]))
    return {root: sorted(rs.values(), key=lambda r: r.pid) for root, rs in ranked[:MAX_FOUND]}


@dataclass
class _Found:
    path: str
    found_at: float
    scan: DatasetUnavailable | DatasetResidency | None = None
    next_scan: float = 0.0  # clock() time its next scan is due


class Discovery:
    """The state of discovery between reads: the jobs and what they were seen reading, the found datasets' scans."""

    def __init__(self, options: WalkOptions, cpu_fraction: float | None, root: str = "/", user: int | None = None,
                 pid: int | None = None, clock: Callable[[], float] = time.monotonic, probes: Any = None) -> None:
        from dltop.sources.probes import ProbeReader

        self.options, self.cpu_fraction, self.clock = options, cpu_fraction, clock
        self.proc = os.path.join(root, "proc")
        self.me = os.geteuid()
        # Root sees every user's jobs (or --user's); anyone else its own only.
        self.user = user if self.me == 0 else self.me
        self.pid = pid
        # the probed jobs: the probes source's latest reading (`probes.LastRead`), or a reader of its own
        self.probes = probes if probes is not None else ProbeReader(root, self.user)
        self.rules = Rules()
        self.jobs: dict[tuple[int, int], Job] = {}
        self.found: dict[str, _Found] = {}
        self.looks = 0  # processes looked at (for the benchmarks)
        self.scans = 0  # found datasets scanned
        self.scans_free_at = 0.0  # clock() time the next scan not asked for may start (SCAN_SHARE)

    def note(self) -> str | None:
        """What discovery covers, where it is not every user's jobs."""
        if self.me != 0:
            return "your own jobs only (not root)"
        if self.user is not None:
            return f"the jobs of uid {self.user} only (--user)"
        return None

    # -- the jobs ---------------------------------------------------------------------------------------------

    def _live(self) -> dict[tuple[int, int], tuple[int, str, str, str | None]]:
        """{(pid, start ticks): (uid, job id, command, data_dir)} of the live probed processes (and --pid's)."""
        from dltop.sources.probes import proc_cmdline

        live = {(p.pid, p.start_time_ticks): (p.uid, p.job_id or "", p.cmd, p.data_dir) for p in self._probed()}
        if self.pid is None or (ticks := proc_start_ticks(self.pid, self.proc)) is None:
            return live
        uid = process_uid(self.proc, self.pid)
        if uid is not None and self._looked_at(uid):
            live.setdefault((self.pid, ticks), (uid, "", proc_cmdline(self.proc, self.pid) or "", None))
        return live

    def _probed(self) -> list[Any]:
        """The probes source's live processes of the users looked at."""
        try:
            part = self.probes.read()
        except Exception:  # noqa: BLE001 — the probes source says what is wrong with them; discovery goes on
            return []
        return [] if part is None else [p for p in part.processes if not p.exited and self._looked_at(p.uid)]

    def _looked_at(self, uid: int) -> bool:
        return self.user is None or uid == self.user

    def _refresh_jobs(self) -> None:
        from dltop.sources.probes import user_name

        live = self._live()
        for key in [k for k in self.jobs if k not in live]:
            del self.jobs[key]
        for key, (uid, job_id, cmd, data_dir) in live.items():
            j = self.jobs.get(key)
            if j is None:
                j = self.jobs[key] = Job(key[0], key[1], uid, user_name(uid), job_id, cmd)
            j.named = _named_folder(data_dir, self.rules)

    def _look(self, j: Job, deadline: float) -> None:
        """The files the job's processes hold open for reading now, into its folders."""
        if proc_start_ticks(j.pid, self.proc) != j.start_ticks or process_uid(self.proc, j.pid) != j.uid:
            return  # gone, or its pid reused: dropped at the next read
        open_now: dict[str, int] = {}
        for pid in process_tree(self.proc, j.pid, j.uid):
            self.looks += 1
            files = open_files(self.proc, pid, deadline)
            for path, (dev, _ino) in (files or {}).items():
                folder = os.path.dirname(path)
                open_now[folder] = open_now.get(folder, 0) + 1
                if folder in j.folders or len(j.folders) < MAX_FOLDERS:
                    j.folders[folder] = dev
            if time.monotonic() > deadline:
                break
        j.open_now = open_now

    def look(self) -> None:
        """The jobs listed again, those due looked at within LOOK_BUDGET_S (the rest at the next read), the users
        in turn: one user's hundreds of jobs delay another's by one job each, not by all of theirs."""
        self._refresh_jobs()
        now = self.clock()
        deadline = time.monotonic() + LOOK_BUDGET_S
        by_user: dict[int, list[Job]] = {}
        for j in sorted(self.jobs.values(), key=lambda j: j.next_look):
            if j.next_look <= now:
                by_user.setdefault(j.uid, []).append(j)
        for turn in itertools.zip_longest(*by_user.values()):
            for j in turn:
                if j is None:
                    continue
                if time.monotonic() > deadline:
                    return
                self._look(j, deadline)
                j.next_look = now + REVISIT_S

    # -- the roots --------------------------------------------------------------------------------------------

    def roots(self, watched: Iterable[str] = ()) -> dict[str, list[FoundReader]]:
        """{root: its readers}: each job's folders grouped, roots inside others merged, those watched left out."""
        per_job = [(j, group_folders(j.folders, j.named, self.rules.allowed, _device)) for j in self.jobs.values()]
        outer = merge_roots(r for _, g in per_job for r in g)
        watched = [os.path.realpath(w) for w in watched] + list(watched)
        readers: dict[str, dict[int, FoundReader]] = {}
        for j, groups in per_job:
            for root, members in groups.items():
                top = outer[root]
                if not any(_under(top, w) for w in watched):
                    got = readers.setdefault(top, {})
                    got[j.pid] = _as_reader(j, root, members, top, got.get(j.pid))
        return _most_read(readers)

    def read(self, watched: Iterable[str] = (), rescan: Iterable[str] = ()) -> tuple[FoundDataset, ...]:
        """Look at the jobs due, group what they read, scan the found datasets due (those in `rescan` at once)."""
        self.look()
        roots = self.roots(watched)
        wall = time.time()
        self.found = {r: self.found.get(r) or _Found(r, wall) for r in roots}
        asked = set(rescan)
        spent = 0.0
        for f in sorted(self.found.values(), key=lambda f: (f.path not in asked, f.next_scan)):
            now = self.clock()
            # a new one is scanned at once; the others in turn, when due and within SCAN_SHARE of a core
            if f.path not in asked and f.scan is not None and (f.next_scan > now or self.scans_free_at > now
                                                               or spent > READ_SCANS_S):
                continue
            t0, c0 = time.monotonic(), time.thread_time()
            f.scan = scan_one(f.path, self.options, deadline_s=SCAN_BUDGET_S, cpu_fraction=self.cpu_fraction).result
            self.scans += 1
            now = self.clock()
            f.next_scan = now + RESCAN_S
            self.scans_free_at = max(self.scans_free_at, now) + (time.thread_time() - c0) / SCAN_SHARE
            spent += time.monotonic() - t0
        return tuple(FoundDataset(f.path, tuple(roots[f.path]), f.found_at, f.scan) for f in self.found.values())
