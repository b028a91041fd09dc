"""The flight recorder's on-disk format, shared by the writer and the reader (docs/recorder.md).

A recording is a directory of segments, one per hour: `20261201T110000Z.jsonl` while it is written, then
`20261201T110000Z.jsonl.zst` (zstd frames of a few hundred lines each) with `20261201T110000Z.idx.json` beside
it. Every line is one JSON object that starts `{"ts":T,"type":"X",` so a reader can find times and kinds
without parsing whole lines: "meta" (the first line of a segment), "sample" (one Snapshot, `Snapshot.to_dict`),
"part" (a rarely changing part, written when it changes; samples name it in "ref") and "event".
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import stat
import time
from typing import Any

from dltop.errors import DltopError

FORMAT_VERSION = 1  # of the recording's layout (lines, segments, index); the Snapshot has its own schema
KEPT_PARTS = ("cpu", "datasets")  # written as "part" lines when they change, referred to by samples
LOCK_NAME = "lock"
MARKS_NAME = "marks"  # `dltop mark` appends a line here; the running recorder turns it into a "marker" event
OPEN_SUFFIX = ".jsonl"
CLOSED_SUFFIX = ".jsonl.zst"
INDEX_SUFFIX = ".idx.json"
_SEGMENT_NAME = re.compile(r"^(\d{8}T\d{6}Z(?:-\d+)?)(\.jsonl|\.jsonl\.zst)$")
_PREFIX = re.compile(rb'^\{"ts":(-?[0-9][0-9.eE+-]*),"type":"([a-z_]+)"')
EVENT_KINDS = ("action", "hint", "gpu_process", "oom_kill", "marker", "start", "stop")


def default_directory() -> str:
    """$XDG_STATE_HOME/dltop/recordings, or ~/.local/state/dltop/recordings: where record, mark and replay look."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "dltop", "recordings")


def encode_line(ts: float, kind: str, body: dict[str, Any]) -> bytes:
    """One line of a segment: `{"ts":T,"type":K,...}` and a newline (the prefix is what `line_prefix` reads)."""
    rest = json.dumps(body, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    head = f'{{"ts":{json.dumps(float(ts))},"type":"{kind}"'
    return (head + ("," + rest[1:] if len(rest) > 2 else "}") + "\n").encode("utf-8")


def line_prefix(line: bytes) -> tuple[float, str] | None:
    """The (ts, type) a line starts with, or None when the line is not one of ours (torn, corrupt)."""
    m = _PREFIX.match(line)
    if m is None or not line.endswith(b"}"):
        return None
    try:
        return float(m.group(1)), m.group(2).decode("ascii")
    except ValueError:
        return None


def segment_stem(ts: float, directory: str) -> str:
    """A new segment's name for a start at `ts` (UTC, to the second; -2, -3... if that name is taken)."""
    base = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(ts))
    stem, n = base, 1
    while any(os.path.exists(os.path.join(directory, stem + s)) for s in (OPEN_SUFFIX, CLOSED_SUFFIX)):
        n += 1
        stem = f"{base}-{n}"
    return stem


def list_segments(directory: str) -> list[tuple[str, str]]:
    """(stem, suffix) of every segment file in the directory, oldest first; a stem with both an open and a
    closed file (a compression cut short) is listed once, closed."""
    found: dict[str, str] = {}
    try:
        names = os.listdir(directory)
    except OSError as e:
        raise DltopError(f"cannot read recording {directory}: {e.strerror}") from None
    for name in names:
        m = _SEGMENT_NAME.match(name)
        if m is None:
            continue
        stem, suffix = m.group(1), m.group(2)
        if found.get(stem) != CLOSED_SUFFIX:
            found[stem] = suffix
    return sorted(found.items(), key=lambda kv: _stem_key(kv[0]))


def _stem_key(stem: str) -> tuple[str, int]:
    base, _, n = stem.partition("-")
    return base, int(n or 1)


def prepare_directory(path: str) -> str:
    """Create the recording directory (mode 0700) or check the one there: refused if it is not a directory,
    not this user's, or writable by group or others (they could replace what a postmortem reads)."""
    path = os.path.abspath(os.path.expanduser(path))
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.stat(path)
    except OSError as e:
        raise DltopError(f"cannot create recording directory {path}: {e.strerror}") from None
    check_directory(path, st)
    return path


def check_directory(path: str, st: os.stat_result | None = None) -> None:
    """Raise DltopError unless `path` is a directory of this user that nobody else can write."""
    try:
        st = st or os.stat(path)
    except OSError as e:
        raise DltopError(f"cannot use recording directory {path}: {e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise DltopError(f"recording directory {path} is not a directory")
    if st.st_uid != os.geteuid():
        raise DltopError(f"refusing recording directory {path}: it belongs to uid {st.st_uid}, not to this user "
                         f"(uid {os.geteuid()})")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise DltopError(f"refusing recording directory {path}: group or others can write it "
                         f"(mode {stat.S_IMODE(st.st_mode):o}; chmod 700 {path})")


def open_private(path: str, flags: int) -> int:
    """os.open with mode 0600 (whatever the umask), refusing to follow a symlink planted in the directory."""
    fd = os.open(path, flags | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
    except OSError:
        os.close(fd)
        raise
    return fd


def take_lock(directory: str) -> int:
    """Hold the directory's lock (one writer per directory); DltopError naming the holder when another has it."""
    path = os.path.join(directory, LOCK_NAME)
    try:
        fd = open_private(path, os.O_RDWR | os.O_CREAT)
    except OSError as e:
        raise DltopError(f"cannot open {path}: {e.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        os.close(fd)
        raise DltopError(f"another dltop recorder{f' (pid {holder})' if holder.isdigit() else ''} is recording "
                         f"into {directory}; stop it or record into another directory (-o DIR)") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def lock_held(directory: str) -> bool:
    """Whether a recorder holds the directory's lock now."""
    try:
        fd = os.open(os.path.join(directory, LOCK_NAME), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False
