"""The flight recorder's on-disk format, shared by the writer and the reader (docs/recorder.md).

A recording is a directory of segments, one per hour: `20261201T110000Z.jsonl` while it is written, then
`20261201T110000Z.jsonl.zst` (zstd frames of a few hundred lines each) with `20261201T110000Z.idx.json` beside
it. Every line is one JSON object that starts `{"ts":T,"type":"X",` so a reader can find times and kinds
without parsing whole lines: "meta" (the first line of a segment), "sample" (one Snapshot, `Snapshot.to_dict`),
"part" (a rarely changing part, written when it changes; samples name it in "ref") and "event". A line of the
open segment ends `,"crc":"xxxxxxxx"}`: the crc32 of the line before it (sealed frames have zstd's own checksum).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import stat
import time
import zlib
from typing import Any

from dltop.errors import DltopError
from dltop.fmt import human_bytes
from dltop.model import SCHEMA_VERSION, Snapshot

FORMAT_VERSION = 2  # of the recording's layout (lines, segments, index; 2: sealed frames in columns, columns.py);
# the Snapshot has its own schema. A reader reads every version up to its own.
KEPT_PARTS = ("cpu", "datasets")  # written as "part" lines when they change, referred to by samples
LOCK_NAME = "lock"
MARKS_NAME = "marks"  # `dltop mark` appends a line here; the running recorder turns it into a "marker" event
OPEN_SUFFIX = ".jsonl"
CLOSED_SUFFIX = ".jsonl.zst"
INDEX_SUFFIX = ".idx.json"
_SEGMENT_NAME = re.compile(r"^(\d{8}T\d{6}Z(?:-\d+)?)(\.jsonl|\.jsonl\.zst)$")
_PREFIX = re.compile(rb'^\{"ts":(-?[0-9][0-9.eE+-]*),"type":"([a-z_]+)"')
_CRC_HEAD = b',"crc":"'
_CRC_LEN = len(_CRC_HEAD) + 8 + 2  # the key, 8 hex digits, '"}'
_HEX = frozenset(b"0123456789abcdef")
MAX_TS = 1e11  # a recorded time past this (the year 5138) or before 1970 is damage: time.localtime() cannot show it
MAX_NUMBER = 2**64  # no counter or gauge dltop records is larger: a bigger number is damage, not data
MAX_LINE_BYTES = 64 << 20  # a line longer than this is not parsed (one Snapshot of 8 GPUs is ~100 KiB)
MAX_DEPTH = 64  # event data and meta nested deeper are damage (dltop writes them ~4 deep)
# A segment file bigger than this, or a closed one holding more once decompressed, is not read past it: the writer
# starts a new segment at SEGMENT_BYTES (an hour of 8 GPUs with 20 processes at 1 s is ~1.3 GB), a quarter of it.
SEGMENT_BYTES = 256 << 20
MAX_SEGMENT_BYTES = 1 << 30
SPARSE_MIN_BYTES = 64 << 20  # a file past this size ...
SPARSE_RATIO = 64  # ... with under 1/64 of it on disk is sparse: holes, which dltop never writes
# Numbers that cannot be negative: a recorded number under one of these keys, negative, is damage. Named one by
# one: a unit in the name says nothing of the sign (machine_cached_delta_bytes, a split's inconsistent non_torch_bytes
# and a derived *_s rate may all be negative, and must read back as recorded).
_UNSIGNED = frozenset({
    "ts", "pid", "files", "dirs", "samples", "size", "offset", "kills",
    "total_bytes", "available_bytes", "cached_bytes", "buffers_bytes", "dirty_bytes", "writeback_bytes",
    "shmem_bytes", "active_file_bytes", "inactive_file_bytes", "mlocked_bytes", "memory_total_bytes",
    "memory_used_bytes", "memory_free_bytes", "used_bytes", "data_bytes", "resident_bytes", "resident_pages"})


class Malformed(ValueError):
    """A line, frame or index of a recording that is not what dltop writes: the one error its readers raise."""


def default_directory() -> str:
    """$XDG_STATE_HOME/dltop/recordings, or ~/.local/state/dltop/recordings: where record, mark and replay look."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "dltop", "recordings")


def encode_line(ts: float, kind: str, body: dict[str, Any], checksum: bool = True) -> bytes:
    """One line of a segment: `{"ts":T,"type":K,...,"crc":"xxxxxxxx"}` and a newline (the prefix is what
    `line_prefix` reads; `check_line` checks the crc32 and takes it off)."""
    rest = json.dumps(body, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    head = f'{{"ts":{json.dumps(float(ts))},"type":"{kind}"'
    line = (head + ("," + rest[1:-1] if len(rest) > 2 else "")).encode("utf-8")
    if not checksum:  # as a dltop before per-line checksums wrote it
        return line + b"}\n"
    return line + _CRC_HEAD + b"%08x" % zlib.crc32(line) + b'"}\n'


def check_line(line: bytes) -> tuple[bytes, bool | None]:
    """The line without its checksum, and whether the checksum matched (None: the line has none, as an older
    dltop and a sealed frame write them)."""
    if len(line) < _CRC_LEN or not line.endswith(b'"}') or line[-_CRC_LEN:-10] != _CRC_HEAD:
        return line, None
    digits = line[-10:-2]
    body = line[:-_CRC_LEN]
    if not _HEX.issuperset(digits) or int(digits, 16) != zlib.crc32(body):
        return line, False
    return body + b"}", True


def line_prefix(line: bytes) -> tuple[float, str] | None:
    """The (ts, type) a line starts with, or None when the line is not one of ours (torn, corrupt, a time that
    is not one)."""
    m = _PREFIX.match(line)
    if m is None or not line.endswith(b"}"):
        return None
    try:
        ts = float(m.group(1))
    except ValueError:
        return None
    if not 0 <= ts <= MAX_TS:
        return None
    return ts, m.group(2).decode("ascii")


def valid_ts(value: Any) -> float | None:
    """`value` as a recorded time (a number from 1970 to MAX_TS), or None."""
    if type(value) not in (int, float) or not 0 <= value <= MAX_TS:
        return None
    return float(value)


def _constant(name: str) -> Any:
    raise Malformed(f"{name} is not a number dltop records")


def _float(text: str) -> float:
    value = float(text)
    if not abs(value) <= MAX_NUMBER:  # inf (1e400) too
        raise Malformed(f"number out of range: {text[:24]}")
    return value


def _int(text: str) -> int:
    if len(text) > 21:  # before int() does the work: a 10**4000 is input, not a bug
        raise Malformed(f"number out of range: {text[:24]}...")
    value = int(text)
    if abs(value) > MAX_NUMBER:
        raise Malformed(f"number out of range: {text}")
    return value


def check_unsigned(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` itself, or Malformed where a field that counts up from 0 holds a negative number."""
    for key, value in obj.items():
        if key in _UNSIGNED and (_negative(value) or (type(value) is list and any(map(_negative, value)))):
            raise Malformed(f"{key}: negative")
    return obj


def _negative(value: Any) -> bool:
    return type(value) in (int, float) and value < 0


# The decoders of a frame's JSON (the dump's template reuse, dltop/recorder/reuse.py, scans with them too)
DECODER = json.JSONDecoder(parse_float=_float, parse_constant=_constant)
_INT_DECODER = json.JSONDecoder(parse_float=_float, parse_int=_int, parse_constant=_constant)
SIGNED_DECODER = json.JSONDecoder(parse_float=_float, parse_int=_int, parse_constant=_constant,
                                  object_hook=check_unsigned)
# Text mapped so that one pass finds what needs the slower checks: a digit becomes "0", a character a value
# follows (: , [) "a", a minus "b". A run of 20 "0" may be an int beyond 2**64 (18446744073709551616 has 20
# digits), an "ab" a negative number.
_SHAPES = bytes(48 if 48 <= i <= 57 else 97 if i in b":,[" else 98 if i == 45 else 32 for i in range(256))
_LONG_RUN = b"0" * 20


def loads(data: bytes | str) -> Any:
    """JSON from a recording, bounded and checked: Malformed (with the reason) for text that is not JSON, is
    longer than MAX_LINE_BYTES or nested past the recursion limit, or holds NaN, an infinity, a number beyond
    MAX_NUMBER, or a negative number under a key that cannot be (`_UNSIGNED`: `cached_bytes`, `pid`...)."""
    raw = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
    if len(raw) > MAX_LINE_BYTES:
        raise Malformed(f"{len(raw)} bytes: longer than any line dltop writes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise Malformed(f"not UTF-8 at byte {e.start}") from None
    # Long ints and negative numbers are rare (none in a real recording): only text that may hold one pays for
    # checking each int, or each object (the checks cost 20% and 50% more than the parse).
    shapes = raw.translate(_SHAPES)
    decoder = SIGNED_DECODER if b"ab" in shapes else _INT_DECODER if _LONG_RUN in shapes else DECODER
    try:
        return decoder.decode(text)
    except json.JSONDecodeError as e:
        raise Malformed(f"not JSON ({e.msg} at column {e.colno})") from None
    except (ValueError, RecursionError) as e:  # Malformed from a hook, or int()'s digit limit
        raise Malformed(str(e) if isinstance(e, Malformed) else "not JSON") from None


def entry_crc(values: list[Any]) -> str:
    """The checksum of an index entry: crc32, 8 hex digits, of its values as compact JSON (as JSON reads back)."""
    return f"{zlib.crc32(json.dumps(values, separators=(',', ':')).encode('utf-8')):08x}"


def shallow(value: Any, depth: int = MAX_DEPTH) -> bool:
    """Whether JSON data nests at most `depth` deep: event data and meta are kept as they are, and whatever
    shows them (repr, json.dumps, a pane) must not hit the recursion limit."""
    todo = [(value, 0)]
    while todo:
        v, d = todo.pop()
        if d > depth:
            return False
        if type(v) is dict:
            todo.extend((x, d + 1) for x in v.values())
        elif type(v) is list:
            todo.extend((x, d + 1) for x in v)
    return True


def segment_stem(ts: float, directory: str | int) -> str:
    """A new segment's name for a start at `ts` (UTC, to the second; -2, -3... if that name is taken) in the
    directory (a path, or an fd held on it)."""
    base = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(ts))
    stem, n = base, 1
    while any(_exists(stem + s, directory) for s in (OPEN_SUFFIX, CLOSED_SUFFIX)):
        n += 1
        stem = f"{base}-{n}"
    return stem


def _exists(name: str, directory: str | int) -> bool:
    try:
        if isinstance(directory, int):
            os.stat(name, dir_fd=directory, follow_symlinks=False)
        else:
            os.lstat(os.path.join(directory, name))
    except OSError:
        return False
    return True


def list_segments(directory: str | int, name: str | None = None) -> list[tuple[str, str]]:
    """(stem, suffix) of every segment file in the directory (a path, or an fd held on it and its `name` for a
    message), oldest first; a stem with both an open and a closed file (a compression cut short) is listed once,
    closed."""
    found: dict[str, str] = {}
    try:
        names = os.listdir(directory)
    except OSError as e:
        raise DltopError(f"cannot read recording {name or directory}: {e.strerror}") from None
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


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC
_MAX_LINKS = 40  # symlinks followed on the way to a recording directory, as the kernel allows


def open_directory(path: str, create: bool = True) -> int:
    """An fd held on the recording directory (created, mode 0700, when `create`), found one folder at a time from
    / through fds: refused (DltopError) where a folder on the way belongs to another user (not root) or group or
    others can write it without the sticky bit, as sshd's StrictModes refuses a home (its owner could swap our
    directory for a symlink), or where the directory is not this user's private one (`check_directory`). What
    is written through the fd stays in the folder that was checked, whatever is renamed later."""
    path = os.path.abspath(os.path.expanduser(path))
    todo = [p for p in reversed(path.split("/")) if p]
    fd = os.open("/", _DIR_FLAGS)
    where, links = "/", 0
    try:
        while todo:
            name = todo.pop()
            if name in (".", ""):
                continue
            if name == "..":  # only from a symlink's target (abspath took the others away)
                fd = _step(fd, os.open("..", _DIR_FLAGS, dir_fd=fd))
                where = os.path.dirname(where)
                continue
            why = unsafe_parent(os.fstat(fd))
            if why is not None:
                raise DltopError(f"refusing recording directory {path}: {where} {why} (it could swap the "
                                 f"directory for a symlink; as sshd's StrictModes)")
            try:
                fd = _step(fd, os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd))
            except FileNotFoundError:
                if not create:
                    raise DltopError(f"no recording directory {path}") from None
                with contextlib.suppress(FileExistsError):  # made beside us since: checked like any other
                    os.mkdir(name, 0o700, dir_fd=fd)
                fd = _step(fd, os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd))
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                try:
                    target = os.readlink(name, dir_fd=fd)
                except OSError:
                    raise DltopError(f"recording directory {path}: {os.path.join(where, name)} is not a "
                                     f"directory") from None
                links += 1
                if links > _MAX_LINKS:
                    raise DltopError(f"recording directory {path}: too many levels of symbolic links") from None
                if target.startswith("/"):  # followed from /, each folder on its way checked as above
                    fd = _step(fd, os.open("/", _DIR_FLAGS))
                    where = "/"
                todo.extend(p for p in reversed(target.split("/")) if p)
                continue
            where = os.path.join(where, name)
        check_directory(path, os.fstat(fd))
    except OSError as e:
        os.close(fd)
        raise DltopError(f"cannot use recording directory {path}: {e.strerror}") from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _step(old: int, new: int) -> int:
    os.close(old)
    return new


def unsafe_parent(st: os.stat_result) -> str | None:
    """Why a folder that holds a recording directory lets someone else replace it (None: it does not)."""
    if st.st_uid not in (0, os.geteuid()):
        return f"belongs to uid {st.st_uid}"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        return f"can be written by group or others and has no sticky bit (mode {stat.S_IMODE(st.st_mode):o})"
    return None


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


def open_private(path: str, flags: int, dir_fd: int | None = None) -> int:
    """os.open with mode 0600 (whatever the umask), refusing to follow a symlink planted in the directory."""
    fd = os.open(path, flags | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd)
    try:
        os.fchmod(fd, 0o600)
    except OSError:
        os.close(fd)
        raise
    return fd


def take_lock(directory: str, dir_fd: int | None = None) -> int:
    """Hold the directory's lock (one writer per directory); DltopError naming the holder when another has it."""
    path = os.path.join(directory, LOCK_NAME)
    try:
        fd = open_private(LOCK_NAME if dir_fd is not None else path, os.O_RDWR | os.O_CREAT, dir_fd=dir_fd)
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


def lock_held(directory: str | int) -> bool:
    """Whether a recorder holds the directory's lock now (a path, or an fd held on the directory); a lock that
    is not a regular file (a FIFO, a symlink) is not one."""
    try:
        dir_fd = directory if isinstance(directory, int) else os.open(directory, _DIR_FLAGS)
    except OSError:
        return False
    try:
        fd, _ = open_regular(LOCK_NAME, dir_fd)
    except (OSError, Malformed):
        return False
    finally:
        if dir_fd is not directory:
            os.close(dir_fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_NOT_REGULAR = ((stat.S_ISLNK, "a symbolic link: not followed"), (stat.S_ISFIFO, "a FIFO: not a regular file"),
                (stat.S_ISCHR, "a character device: not a regular file"),
                (stat.S_ISBLK, "a block device: not a regular file"), (stat.S_ISSOCK, "a socket: not a regular file"),
                (stat.S_ISDIR, "a directory: not a regular file"))


def open_regular(name: str, dir_fd: int | None = None, max_bytes: int | None = None,
                 what: str = "file") -> tuple[int, int]:
    """A file of a recording opened to read, and its size: a regular file only, never through a symlink, and no
    bigger than `max_bytes`. Malformed says why not (a symlink, a FIFO, a device, too big), before the file is
    opened (a device's open may act, a FIFO's would wait) or a byte read; OSError where it cannot be opened."""
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    _check_regular(st, max_bytes, what)
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:  # made a symlink since
            raise Malformed(_NOT_REGULAR[0][1]) from None
        raise
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            raise Malformed("replaced while it was opened")
        _check_regular(now, max_bytes, what)
    except BaseException:
        os.close(fd)
        raise
    return fd, now.st_size


def _check_regular(st: os.stat_result, max_bytes: int | None, what: str) -> None:
    for test, why in _NOT_REGULAR:
        if test(st.st_mode):
            raise Malformed(why)
    if not stat.S_ISREG(st.st_mode):
        raise Malformed("not a regular file")
    if max_bytes is not None and st.st_size > max_bytes:
        raise Malformed(f"{human_bytes(st.st_size)}: larger than any {what} dltop writes (at most "
                        f"{human_bytes(max_bytes)}; not read)")
    on_disk = st.st_blocks * 512
    if st.st_size > SPARSE_MIN_BYTES and on_disk * SPARSE_RATIO < st.st_size:
        # dltop never writes holes: a file of 1 GiB with nothing on disk is made to be read for nothing (a
        # compressing filesystem stores JSON a few times smaller, never this much)
        raise Malformed(f"{human_bytes(st.st_size)} with {human_bytes(on_disk)} on disk: sparse, not a {what} "
                        "dltop writes (not read)")


def read_regular(name: str, dir_fd: int | None = None, max_bytes: int | None = None, what: str = "file") -> bytes:
    """The whole of a file of a recording, as `open_regular` allows it: never more than `max_bytes`, and never
    more than its size when it was opened (a file that grows meanwhile is read to that size)."""
    fd, size = open_regular(name, dir_fd, max_bytes, what)
    with open(fd, "rb", closefd=True) as f:
        return f.read(size)


def decode_part(key: str, value: Any) -> Any:
    """A Snapshot part from its parsed JSON, decoded as the Snapshot's own field (its exact type and checks)."""
    return getattr(Snapshot.from_dict({"ts": 0.0, "host": "", "schema": SCHEMA_VERSION, key: value}), key)
