"""Where probe files live and how one is written: a private per-user directory, atomic replace, no symlinks.

Shared by the probe (which writes) and dltop's probes source (which reads); standard library only.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from collections.abc import Mapping

FORMAT = 1  # the version of the file format (docs/probe.md); a reader refuses a larger one
MAX_FILE_BYTES = 4096
KEEP_EXITED_S = 86400.0  # an exited process's report is kept this long (the probe's clean-up, dltop's memory)
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


PROBE_DIR_ENV = "DLTOP_PROBE_DIR"  # a directory shared with dltop (a Kubernetes hostPath): docs/probe.md
# Where a probe whose folder is refused (another user made /dev/shm/dltop-UID first) publishes instead: a sealed
# memfd of this name that the process holds; dltop finds it in /proc/PID/fd (docs/probe.md, "Where the file lives")
MEMFD_NAME = "dltop-probe"
MEMFD_LINK = f"/memfd:{MEMFD_NAME} (deleted)"  # what readlink(/proc/PID/fd/N) says of it
SEALS = 0x1 | 0x2 | 0x4 | 0x8  # F_SEAL_SEAL | SHRINK | GROW | WRITE: once written, no one can change it


def signal_file(pid: int | str) -> str:
    """The name of the file beside `<pid>.json` into which the probe's SIGTERM handler writes the stack it hit
    (faulthandler's format): empty while the process lives; dltop reads it once the process is gone."""
    return f"{pid}.signal"


def pid_namespace(proc: str = "/proc", pid: int | str = "self") -> int | None:
    """The inode of the process's PID namespace (`readlink /proc/PID/ns/pid` says `pid:[INODE]`), or None."""
    try:
        return os.stat(f"{proc}/{pid}/ns/pid").st_ino
    except OSError:
        return None


def shared_dir_name(uid: int, pidns: int | None) -> str:
    """The name of a user's own directory under $DLTOP_PROBE_DIR: `UID.PIDNS`. One per user and PID namespace:
    two pods of the same uid both have a pid 1, and each removes only files of its own dead processes."""
    return str(uid) if pidns is None else f"{uid}.{pidns}"


def probe_dir(uid: int | None = None, env: dict[str, str] | None = None) -> str:
    """The directory this user's probes publish into: $DLTOP_PROBE_DIR/UID.PIDNS when that is set (a directory
    shared with dltop, sticky and writable by all, as /tmp is), else $XDG_RUNTIME_DIR/dltop when that is the
    user's own directory, else /dev/shm/dltop-<uid>."""
    uid = os.getuid() if uid is None else uid
    environ: Mapping[str, str] = os.environ if env is None else env
    shared = environ.get(PROBE_DIR_ENV)
    if shared:
        return os.path.join(shared, shared_dir_name(uid, pid_namespace()))
    runtime = environ.get("XDG_RUNTIME_DIR")
    if runtime:
        try:
            st = os.stat(runtime)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == uid:
                return os.path.join(runtime, "dltop")
        except OSError:
            pass
    return f"/dev/shm/dltop-{uid}"


def check_dir(fd: int, uid: int) -> str | None:
    """Why the open directory `fd` is not a private one of `uid` (None when it is)."""
    st = os.fstat(fd)
    if st.st_uid != uid:
        return f"owned by uid {st.st_uid}, not {uid}"
    if st.st_mode & 0o022:
        return f"writable by others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def open_private_dir(path: str) -> int:
    """Create `path` (mode 0700) if needed and open it without following a symlink; raises OSError, or
    PermissionError saying why the directory is not private."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    fd = os.open(path, DIR_FLAGS)
    why = check_dir(fd, os.getuid())
    if why is not None:
        os.close(fd)
        raise PermissionError(f"{path}: {why}")
    return fd


def write_atomic(dir_fd: int, name: str, data: bytes) -> None:
    """Replace `name` in the directory `dir_fd` with `data`: a 0600 temp file made with O_EXCL|O_NOFOLLOW, then
    rename (a reader sees the old file or the new one, never a torn one)."""
    tmp = f".{name}.{os.urandom(4).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def publish_memfd(held: int | None, data: bytes) -> int:
    """Publish `data` in a sealed memfd named MEMFD_NAME and return the fd the process holds it at: `held` (the
    fd of the last publication, replaced atomically with dup2: a reader sees the old file or the new one, never a
    torn one), or a new fd the first time. Raises OSError (no memfd_create: not Linux)."""
    fd = os.memfd_create(MEMFD_NAME, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
        if held is None:
            return fd
        os.dup2(fd, held, inheritable=False)
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    return held


def proc_start_ticks(pid: int | str, proc: str = "/proc") -> int | None:
    """Field 22 of /proc/PID/stat (starttime, in clock ticks since boot); None when the process is gone."""
    got = proc_stat(pid, proc)
    return None if got is None else got[0]


def proc_stat(pid: int | str, proc: str = "/proc") -> tuple[int, str, int | None] | None:
    """Fields 22, 3 and 4 of /proc/PID/stat: the start time (clock ticks since boot), the state as the kernel
    says it (R running, S sleeping, D in uninterruptible IO, T stopped, t stopped by a debugger, Z zombie, ...)
    and the parent's pid as this /proc has it; None when the process is gone."""
    try:
        # Non-blocking and bounded: under a captured tree (--root) a FIFO or /dev/zero may stand in its place.
        fd = os.open(f"{proc}/{pid}/stat", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError:
        return None
    try:
        text = os.read(fd, 4096) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    except OSError:
        return None
    finally:
        os.close(fd)
    # The command (field 2) is in parentheses and may hold spaces and ')': split after the last ')'.
    fields = text[text.rfind(b")") + 2:].split()
    ticks = fields[19] if len(fields) > 19 else b""
    # ASCII digits of a 64-bit count: int() takes b'-5' and raises past 4300 digits (4096 bytes hold fewer).
    if not (ticks.isdigit() and len(ticks) <= 20 and int(ticks) < 1 << 64):
        return None
    state = fields[0].decode("ascii", "replace")[:1] if fields[0].isalpha() else "?"
    return int(ticks), state, int(fields[1]) if fields[1].isdigit() else None
