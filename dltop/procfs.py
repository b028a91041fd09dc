"""One file of a /proc or /sys tree, read the way a captured tree from elsewhere needs: below the sources, the
actions and the residency engine, which all read such files (stdlib only, nothing of dltop's).

Opened non-blocking and checked to be a regular file (a FIFO would block the open, /dev/zero never ends), read
up to a bound; what is wrong raises OSError with `filename` and a `strerror` that says it in words.
"""

from __future__ import annotations

import errno
import os
import stat

MAX_FILE_BYTES = 4 << 20  # /proc/meminfo is ~1.5 KiB, a sysfs attribute at most a page; a 4 MiB one is no kernel's
MAX_ARGS_BYTES = 32 << 20  # /proc/PID/cmdline and environ: execve takes up to a quarter of the stack limit
MAX_COUNT = (1 << 64) - 1  # the kernel's counters are 64-bit: a longer number is a damaged file
_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def read_bytes(path: str | os.PathLike[str], max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """The whole file, if it is a regular file of at most `max_bytes`; raises OSError saying why not."""
    fd = os.open(path, _FLAGS)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, f"{kind_of(mode)}, not a file", os.fspath(path))
        chunks = []
        left = max_bytes + 1  # procfs files report st_size 0: read until EOF, one byte past the bound at most
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        raise OSError(errno.EFBIG, f"larger than {max_bytes >> 10} KiB, more than the kernel writes",
                      os.fspath(path))
    return data


def kind_of(mode: int) -> str:
    """What a file that is not a regular file is ("a FIFO", "a directory"), from its st_mode."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def read_text(path: str | os.PathLike[str], max_bytes: int = MAX_FILE_BYTES, encoding: str = "ascii") -> str:
    """read_bytes() decoded; an undecodable byte becomes U+FFFD (it then fails the field's own check)."""
    return read_bytes(path, max_bytes).decode(encoding, errors="replace")


def parse_count(text: str) -> int | None:
    """A kernel counter written in ASCII decimal digits that fits in 64 bits, else None (checked before int(),
    which takes '٣', '+7', '1_0' and raises past 4300 digits)."""
    if not (text.isascii() and text.isdigit()) or len(text) > 20:
        return None
    value = int(text)
    return value if value <= MAX_COUNT else None


def name_this_thread(name: str) -> None:
    """Give the calling thread `name` (its first 15 bytes) where the kernel shows threads, so `top -H`, `ps -L`
    and /proc/PID/task/TID/comm say which of dltop's threads uses the CPU (Python 3.11 names them only for
    itself). Best effort: where /proc is not mounted or not writable, the thread keeps its inherited name."""
    try:
        with open("/proc/thread-self/comm", "wb", buffering=0) as f:
            f.write(name.encode("ascii", "replace")[:15])
    except OSError:
        pass
