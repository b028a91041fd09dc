"""A GPU process's environment for the GPU tab's `e`: a look, nothing changed.

/proc/PID/environ as the kernel lets this user read it (its own processes, or any as root: the kernel's answer,
EACCES otherwise, said as it is). The process is held by a descriptor of its /proc/PID folder while its start time
is checked against the row's and its environment read, so a pid reused since the row was drawn is never read
for it. Values that look like secrets are masked before they leave this module: those of names holding TOKEN,
KEY, PASSWORD, PASSWD, SECRET or CREDENTIAL, and the user and password inside any URL (`https://***@host`).
Each name and value is escaped for the terminal by the screen (fmt.printable); NUL-separated, bytes that are not
UTF-8 kept as escapes.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass

from dltop.errors import DltopError
from dltop.sources.gpu_procs import Malformed, parse_stat

MAX_ENVIRON_BYTES = 1 << 20  # execve's strings fit far below this in practice; more is cut and said
MASK = "*****"
SECRET_NAME = re.compile(r"TOKEN|KEY|PASSWORD|PASSWD|SECRET|CREDENTIAL", re.IGNORECASE)
# scheme://userinfo@host: the userinfo (a user and password, or a token as the user) is masked whole
URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/@\s]+)@")


@dataclass(frozen=True)
class Environ:
    """A process's environment, masked: (name, value) in the kernel's order; `masked` how many values were
    masked; `cut` where the environment was longer than MAX_ENVIRON_BYTES."""

    pid: int
    variables: tuple[tuple[str, str], ...]
    masked: int
    cut: bool = False


def mask(name: str, value: str) -> tuple[str, bool]:
    """The value shown for `name`: MASK for a secret's name, else with any URL's credentials masked."""
    if SECRET_NAME.search(name):
        return MASK, True
    shown, n = URL_CREDENTIALS.subn(lambda m: f"{m['scheme']}{MASK}@", value)
    return shown, bool(n)


def parse_environ(raw: bytes) -> list[tuple[str, str]]:
    """NUL-separated NAME=value entries (an entry without '=' is a name with an empty value), decoded as the
    file system's names are (a byte that is not UTF-8 kept, escaped later)."""
    out = []
    for entry in raw.split(b"\0"):
        if not entry:
            continue
        name, _, value = os.fsdecode(entry).partition("=")
        out.append((name, value))
    return out


def _read_at(dirfd: int, name: str, limit: int) -> bytes:
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dirfd)
    try:
        chunks, left = [], limit + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 16))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_environ(pid: int, start_time_ticks: int, proc: str = "/proc") -> Environ:
    """The environment of the process `pid` started at `start_time_ticks`, masked; DltopError saying why not
    (exited, another process under that pid now, not this user's to read)."""
    try:
        dirfd = os.open(f"{proc}/{pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        raise DltopError(f"pid {pid} has exited") from None
    try:
        try:
            start = parse_stat(_read_at(dirfd, "stat", 4096)).start_time_ticks
        except (OSError, Malformed):
            raise DltopError(f"pid {pid} has exited") from None
        if start != start_time_ticks:
            raise DltopError(f"pid {pid} is another process now (started at tick {start}, the row's at tick "
                             f"{start_time_ticks}): the one shown has exited")
        try:
            raw = _read_at(dirfd, "environ", MAX_ENVIRON_BYTES)
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EPERM):
                raise DltopError(f"pid {pid}'s environment: permission denied by the kernel: only its owner or "
                                 "root may read it") from None
            if e.errno == errno.ESRCH:
                raise DltopError(f"pid {pid} has exited") from None
            raise DltopError(f"pid {pid}'s environment cannot be read: {e.strerror or e}") from None
    finally:
        os.close(dirfd)
    cut = len(raw) > MAX_ENVIRON_BYTES
    if cut:
        raw = raw[:MAX_ENVIRON_BYTES].rsplit(b"\0", 1)[0]  # the last whole entry
    masked, shown = 0, []
    for name, value in parse_environ(raw):
        value, hidden = mask(name, value)
        masked += hidden
        shown.append((name, value))
    return Environ(pid=pid, variables=tuple(shown), masked=masked, cut=cut)
