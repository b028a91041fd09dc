"""Locked pages that outlive dltop: a small detached holder process, as `vmtouch -dl` keeps its own.

A lock is a LockSet: the data of files (SEEK_DATA/SEEK_HOLE: the holes of a sparse file are never touched)
mapped and mlocked by the process that holds it. When that process leaves with a lock the user chose to keep
(`q` in the TUI, `dltop lock --detach`) or nobody is left to ask (a hangup), `keep` starts
`python -m dltop.actions.holder --target T` in a session of its own: it opens each file again, checks that it is
the same file (device and inode), mlocks its data (resident and locked already, so this is quick), says `ready`,
and sleeps until SIGTERM; only then does the first process let its own lock go, so no page is ever let go between.

Which holders there are and whose they are is the kernel's word, not a file's: the holders are the processes whose
command line is this module's, their owner the uid of /proc/PID, what they hold /proc/PID/smaps_rollup's Locked.
`dltop lock --list` shows the caller's own holders (root: everyone's) and counts the others; `dltop unlock` sends
SIGTERM through a pidfd after the owner and the start time are checked (a reused pid is spared), and the kernel
refuses another user's holder too. A holder writes its release to the action journal (dltop/journal.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pwd
import select
import signal
import stat
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from dltop import journal, kernel
from dltop.residency.measure import data_page_runs

MODULE = "dltop.actions.holder"
LOCK_STEP_BYTES = 64 << 20  # a lock mlocks this much at a time: progress and a cancel between steps
READY_MIN_S = 60.0  # how long `keep` waits for the holder's ready: at least this, plus the time per byte below
READY_BYTES_PER_S = 200 << 20  # the pages are resident and locked already: the holder only maps them
_O_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def lock_runs(fd: int, st: os.stat_result, ps: int = kernel.PAGE_SIZE) -> list[tuple[int, int, int]]:
    """What a lock maps of an open file: (offset, length, pages) per run of data (SEEK_DATA/SEEK_HOLE, as a warm
    reads it; the holes of a sparse file are never locked: mlock would fault in a zero page for each), the last
    run cut at the file's end."""
    if st.st_size <= 0:
        return []
    runs = data_page_runs(fd, st.st_size, ps) if st.st_blocks * 512 < st.st_size else [
        (0, (st.st_size + ps - 1) // ps)]
    return [(first * ps, min(last * ps, st.st_size) - first * ps, last - first) for first, last in runs]


class LockSet:
    """Runs of files' data mapped and mlocked; their pages stay in memory until `release()`."""

    def __init__(self) -> None:
        self.mappings: list[kernel.LockedMapping] = []
        self.files: list[tuple[str, int, int]] = []  # (path, st_dev, st_ino) of each file locked, once
        self.bytes = 0  # whole pages locked

    @property
    def paths(self) -> list[str]:
        """The files locked."""
        return [f[0] for f in self.files]

    def lock_file(self, path: str, fd: int, st: os.stat_result, step: Callable[[int], bool] | None = None) -> None:
        """Lock the data of one open file, LOCK_STEP_BYTES at a time; `step(bytes)` after each, False stops (the
        part locked so far stays held). Raises OSError (what is locked stays held: the caller releases)."""
        ps = kernel.PAGE_SIZE
        self.files.append((path, st.st_dev, st.st_ino))
        for off, length, pages in lock_runs(fd, st, ps):
            m = kernel.LockedMapping(fd, length, off, lock=False, random=True)
            self.mappings.append(m)
            for start in range(0, length, LOCK_STEP_BYTES):
                n = min(LOCK_STEP_BYTES, length - start)
                # Read this step's data ahead, exactly (WILLNEED), and fault it in without read-around or
                # readahead (MADV_RANDOM): those cached the zero pages of the holes beside the data (+14 MiB
                # around 10 MiB of cold data on ext4 with neither, +2 MiB past its end with WILLNEED alone).
                with contextlib.suppress(OSError):
                    os.posix_fadvise(fd, off + start, n, os.POSIX_FADV_WILLNEED)
                m.lock_range(start, n)
                done = n if start + n < length else pages * ps - start  # whole pages
                self.bytes += done
                if step is not None and not step(done):
                    return

    def release(self) -> None:
        """Unlock everything; safe to call twice."""
        for m in self.mappings:
            m.release()
        self.mappings.clear()
        self.bytes = 0


# -- the first process's side: hand a LockSet over ------------------------------------------------------------


@dataclass(frozen=True)
class Kept:
    """A lock handed to a holder: its pid, the bytes it locked and the files it could not (gone, replaced)."""

    pid: int
    bytes: int
    files: int
    missed: int


def keep(locks: LockSet, target: str) -> Kept:
    """Start a holder for `locks` (named `target`) and wait until it holds them; the caller then releases its own.
    Raises OSError with the reason when no holder could take them (the caller still holds them)."""
    import subprocess

    env = dict(os.environ)
    top = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = top + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.Popen(
        [sys.executable, "-m", MODULE, "--target", target], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, env=env, close_fds=True, start_new_session=True, cwd="/",
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        with proc.stdin:
            for path, dev, ino in locks.files:  # from its cwd, "/": named from this process's cwd
                proc.stdin.write(b"%s %d %d\n" % (os.fsencode(os.path.abspath(path)).hex().encode(), dev, ino))
        line = _read_line(proc.stdout.fileno(), READY_MIN_S + locks.bytes / READY_BYTES_PER_S)
    except OSError:
        proc.kill()
        proc.wait()
        raise
    finally:
        proc.stdout.close()
    proc.wait()  # the first of its two forks, which leaves at once: the holder is nobody's child to reap
    words = line.split()
    if len(words) == 5 and words[0] == "ready" and all(w.isdigit() for w in words[1:]):
        return Kept(int(words[1]), int(words[2]), int(words[3]), int(words[4]))
    raise OSError(0, f"the lock holder could not take the lock: {line.strip() or 'it said nothing'}")


def _read_line(fd: int, timeout_s: float) -> str:
    """One line from the holder, within `timeout_s`."""
    buf = b""
    deadline = time.monotonic() + timeout_s
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise OSError(0, f"the lock holder did not answer within {timeout_s:.0f} s")
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        buf += chunk
    return buf.decode("utf-8", "replace").split("\n", 1)[0]


# -- the holder itself --------------------------------------------------------------------------------------


def _take(lines: list[bytes]) -> tuple[LockSet, int]:
    """Lock each file the first process named, if it is still the same file; (locks, files missed)."""
    locks, missed = LockSet(), 0
    for line in lines:
        words = line.split()
        if len(words) != 3:
            continue
        path = os.fsdecode(bytes.fromhex(words[0].decode()))
        try:
            fd = os.open(path, _O_FILE)
        except OSError:
            missed += 1
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (int(words[1]), int(words[2])):
                missed += 1  # replaced since it was locked: never lock another file in its name
                continue
            locks.lock_file(path, fd, st)
        finally:
            os.close(fd)
    return locks, missed


def _set_name(name: bytes) -> None:
    """The name `ps` and `top` show (PR_SET_NAME)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(15, ctypes.c_char_p(name), 0, 0, 0)


def _journal_release(target: str, n_bytes: int, pid: int) -> None:
    line = journal.encode({
        "run_id": 1, "step": "release", "phase": "finished", "action": "lock", "target": target, "ts": time.time(),
        "paths": [target], "done_bytes": n_bytes, "outcome": "ok",
        "message": f"the lock holder (pid {pid}) unlocked {_human(n_bytes)} of {target}",
    })
    if line is not None:
        with contextlib.suppress(OSError):
            journal.append(line)


def _human(n: int) -> str:
    from dltop.fmt import human_bytes

    return human_bytes(n)


def main(argv: list[str]) -> int:
    """The holder: fork once more (nobody's child then), lock what stdin names, say `ready PID BYTES FILES MISSED`,
    hold until SIGTERM, then unlock."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # taken by sigwait below, never lost before it
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    if len(argv) != 2 or argv[0] != "--target":
        print(f"usage: python -m {MODULE} --target LABEL < files", file=sys.stderr)
        return 2
    target = argv[1]
    if os.fork() > 0:  # the process that started it reaps this one at once; the holder goes on, nobody's child
        os._exit(0)
    _set_name(b"dltop-lockhold")
    try:
        locks, missed = _take(sys.stdin.buffer.read().splitlines())
    except OSError as e:
        os.write(1, f"error {e.strerror or e}\n".encode())
        return 1
    os.write(1, b"ready %d %d %d %d\n" % (os.getpid(), locks.bytes, len(locks.files), missed))
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    signal.sigwait({signal.SIGTERM})
    held = locks.bytes
    locks.release()
    _journal_release(target, held, os.getpid())
    return 0


# -- who holds what: the kernel's word ------------------------------------------------------------------------


@dataclass(frozen=True)
class Holder:
    """A holder process: its pid, owner (the uid of /proc/PID), start time (clock ticks after boot), the target
    its command line names (another user's text: shown escaped), and the bytes it holds locked (smaps_rollup's
    Locked; None where /proc does not show them to this user)."""

    pid: int
    uid: int
    start_ticks: int
    target: str
    locked_bytes: int | None

    @property
    def user(self) -> str:
        """The owner's name, or the uid where it has none."""
        try:
            return pwd.getpwuid(self.uid).pw_name
        except KeyError:
            return str(self.uid)


def holder_at(pid: int, proc: str = "/proc") -> Holder | None:
    """The holder process `pid`, or None where it is not one (or is gone)."""
    from dltop.procfs import read_bytes
    from dltop.sources.gpu_procs import Malformed, parse_stat

    try:
        argv = read_bytes(f"{proc}/{pid}/cmdline", 1 << 16).split(b"\0")
        if argv[1:4] != [b"-m", MODULE.encode(), b"--target"] or len(argv) < 5:
            return None
        uid = os.stat(f"{proc}/{pid}").st_uid
        ticks = parse_stat(read_bytes(f"{proc}/{pid}/stat", 4096)).start_time_ticks
    except (OSError, Malformed):
        return None
    locked = None
    with contextlib.suppress(OSError, ValueError):
        for line in read_bytes(f"{proc}/{pid}/smaps_rollup", 1 << 16).splitlines():
            if line.startswith(b"Locked:"):
                locked = int(line.split()[1]) * 1024
    return Holder(pid, uid, ticks, os.fsdecode(argv[4]), locked)


def holders(proc: str = "/proc", uid: int | None = None) -> tuple[list[Holder], int]:
    """The holders this user may see and unlock (its own; root's: everyone's), by pid, and how many others'."""
    uid = os.geteuid() if uid is None else uid
    mine, others = [], 0
    try:
        pids = sorted(int(n) for n in os.listdir(proc) if n.isdigit())
    except OSError:
        return [], 0
    for pid in pids:
        h = holder_at(pid, proc)
        if h is None:
            continue
        if uid == 0 or h.uid == uid:
            mine.append(h)
        else:
            others += 1
    return mine, others


def unlock(h: Holder, proc: str = "/proc") -> str:
    """SIGTERM to a holder, through a pidfd, once its owner and start time are checked again (dltop.actions.signal);
    raises DltopError saying why not. The holder unlocks and journals it."""
    from dltop.actions import signal as signal_action
    from dltop.errors import DltopError
    from dltop.model.actions import SignalTarget

    if holder_at(h.pid, proc) is None:  # gone, or a zombie (no command line: it holds nothing now)
        raise DltopError(f"pid {h.pid} has exited: nothing sent")
    r = signal_action.send(SignalTarget(h.pid, h.start_ticks, "SIGTERM", f"lock holder of {h.target}"), proc)
    return f"unlocked {h.target} (the lock holder, pid {h.pid}" + (")" if r.exited else ", still exiting)")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
