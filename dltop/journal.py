"""The machine's action journal: every warm, evict, lock, clear and signal, run from any shell or TUI, one line each.

The action runner appends each run's start and finish as one JSON line (at most PIPE_BUF bytes: one O_APPEND
write never interleaves with another) to its user's journal: root's is /run/dltop/actions.jsonl (0644, so every
user's recorder sees what root did), another user's is under $XDG_RUNTIME_DIR/dltop (0600). Running recorders
and the TUI tail the journals they trust, their own user's and root's, as `dltop mark`'s lines are tailed: a file
owned by anyone else, writable by others, or not a plain file is not read, and each line is checked field by
field (bounded size, known values, types) before it becomes an event. Who ran it is the pid the line names and
the uid that owns the file (the kernel's word, not the line's).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
from collections.abc import Sequence
from typing import Any

JOURNAL_NAME = "actions.jsonl"
ROOT_DIR = "/run/dltop"
MAX_LINE_BYTES = 4096  # PIPE_BUF: an append of at most this is one write no other writer can cut into
MAX_JOURNAL_BYTES = 8 << 20  # then the journal starts again (its last lines kept in actions.jsonl.1)
MAX_READ_BYTES = 1 << 20  # per journal and look: a flood of lines costs a bounded read each time
FORMAT = 1
ACTIONS = ("warm", "evict", "lock", "clear", "signal")
STEPS = ("run", "release")  # a plan changed nothing: it is not journalled
PHASES = ("started", "finished")  # progress is not journalled
OUTCOMES = ("ok", "cancelled", "refused", "error")
_TEXT_CHARS = 1024  # a target or a message longer than this is cut (the line must stay under PIPE_BUF)
_MAX_PATHS = 16
_COUNTS = ("run_id", "done_bytes", "total_bytes", "files_done")


def journal_dir(uid: int | None = None) -> str | None:
    """Where `uid`'s runner journals (None: no private place for it: no XDG_RUNTIME_DIR it owns)."""
    uid = os.geteuid() if uid is None else uid
    if uid == 0:
        return os.environ.get("DLTOP_ROOT_JOURNAL_DIR") or ROOT_DIR
    runtime = os.environ.get("XDG_RUNTIME_DIR") or f"/run/user/{uid}"
    try:
        st = os.stat(runtime)
    except OSError:
        return None
    if st.st_uid != uid or st.st_mode & 0o077:  # not a runtime dir of this user alone
        return None
    return os.path.join(runtime, "dltop")


def trusted_journals() -> list[str]:
    """The journals this process believes: its own user's and root's."""
    out = [os.path.join(d, JOURNAL_NAME) for d in {journal_dir(), journal_dir(0)} if d]
    return sorted(out)


def encode(event: Any, pid: int | None = None) -> bytes | None:
    """One journal line for an ActionEvent's data (`to_dict(event)`), cut to fit PIPE_BUF; None for what is not
    journalled (a plan, progress)."""
    data = dict(event)
    if data.get("step") not in STEPS or data.get("phase") not in PHASES:
        return None
    _trim(data)
    line = {"v": FORMAT, "ts": data.get("ts"), "pid": os.getpid() if pid is None else pid, "event": data}
    raw = _dumped(line)
    while len(raw) > MAX_LINE_BYTES and data.get("paths"):
        data["paths"] = data["paths"][: len(data["paths"]) // 2]
        raw = _dumped(line)
    return raw if len(raw) <= MAX_LINE_BYTES else None


def _dumped(line: dict[str, Any]) -> bytes:
    return (json.dumps(line, ensure_ascii=False, separators=(",", ":"), allow_nan=False) + "\n").encode(
        "utf-8", "surrogateescape")


def _trim(data: dict[str, Any]) -> None:
    """An event's data cut to what a journal line keeps: no rate or ETA, texts and paths bounded, no undecodable
    bytes (`*_b64`)."""
    data.pop("rate_bytes_per_s", None)
    data.pop("eta_s", None)
    for key in ("target", "message"):
        if isinstance(data.get(key), str) and len(data[key]) > _TEXT_CHARS:
            data[key] = data[key][:_TEXT_CHARS] + "…"
    if isinstance(data.get("paths"), list | tuple) and len(data["paths"]) > _MAX_PATHS:
        data["paths"] = list(data["paths"][:_MAX_PATHS])
    for key in [k for k in data if k.endswith("_b64")]:
        del data[key]


def append(line: bytes, directory: str | None = None) -> None:
    """Append one journal line to this user's journal; OSError when it cannot (the caller counts it)."""
    directory = directory or journal_dir()
    if directory is None:
        raise OSError(0, "no private runtime directory (XDG_RUNTIME_DIR) for the action journal")
    root = os.geteuid() == 0
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, 0o755 if root else 0o700)
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise OSError(0, f"{directory} is not this user's own directory")
    path = os.path.join(directory, JOURNAL_NAME)
    with contextlib.suppress(OSError):
        if os.lstat(path).st_size > MAX_JOURNAL_BYTES:
            os.replace(path, path + ".1")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644 if root else 0o600)
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            raise OSError(0, f"{path} is not this user's")
        os.write(fd, line)
    finally:
        os.close(fd)


def parse(raw: bytes, owner: int) -> dict[str, Any]:
    """The event data of one journal line, checked field by field, with `pid` and `uid` (the file's owner) of
    who ran it; ValueError with the reason for anything else."""
    pid, ev = _line(raw)
    out = _choices(ev)
    ts = ev.get("ts")
    if not isinstance(ts, int | float) or isinstance(ts, bool) or not 0 < ts < 1e11:
        raise ValueError("ts: not a time")
    out["ts"] = float(ts)
    out.update(_texts(ev))
    out.update(_counts(ev))
    elapsed = ev.get("elapsed_s", 0.0)
    if type(elapsed) not in (int, float) or not (math.isfinite(elapsed) and 0 <= elapsed < 1e9):
        raise ValueError("elapsed_s: not a duration")
    out["elapsed_s"] = float(elapsed)
    out["pid"], out["uid"] = pid, owner
    return out


def _line(raw: bytes) -> tuple[int, dict[str, Any]]:
    """The pid and the event of a journal line of this format."""
    if len(raw) > MAX_LINE_BYTES:
        raise ValueError(f"{len(raw)} bytes: longer than a journal line")
    try:
        line = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, RecursionError, json.JSONDecodeError) as e:
        raise ValueError(f"not JSON: {e}") from None
    if not isinstance(line, dict) or line.get("v") != FORMAT:
        raise ValueError("not a journal line of this format")
    pid, ev = line.get("pid"), line.get("event")
    if type(pid) is not int or not 0 < pid < 1 << 22:
        raise ValueError("pid: not a pid")
    if not isinstance(ev, dict):
        raise ValueError("event: not an object")
    return pid, ev


def _choices(ev: dict[str, Any]) -> dict[str, Any]:
    """The action, step, phase and outcome: each one of its known words."""
    out: dict[str, Any] = {}
    for key, allowed in (("action", ACTIONS), ("step", STEPS), ("phase", PHASES)):
        if ev.get(key) not in allowed:
            raise ValueError(f"{key}: not one of {', '.join(allowed)}")
        out[key] = ev[key]
    if ev.get("outcome") is not None and ev["outcome"] not in OUTCOMES:
        raise ValueError("outcome: not one of " + ", ".join(OUTCOMES))
    out["outcome"] = ev.get("outcome")
    return out


def _texts(ev: dict[str, Any]) -> dict[str, Any]:
    """The target, the message and the paths."""
    out: dict[str, Any] = {}
    for key in ("target", "message"):
        value = ev.get(key, "")
        if not isinstance(value, str) or len(value) > _TEXT_CHARS + 1:
            raise ValueError(f"{key}: not a text")
        out[key] = value
    paths = ev.get("paths", [])
    if not isinstance(paths, list) or len(paths) > _MAX_PATHS or not all(isinstance(p, str) for p in paths):
        raise ValueError("paths: not a list of paths")
    out["paths"] = paths
    return out


def _counts(ev: dict[str, Any]) -> dict[str, int | None]:
    out: dict[str, int | None] = {}
    for key in _COUNTS:
        value = ev.get(key)
        if value is not None and (type(value) is not int or not 0 <= value <= 1 << 63):
            raise ValueError(f"{key}: not a count")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number the journal holds")


class JournalTail:
    """The lines appended to the trusted journals since it was made (what was there before is old), as event
    data; a journal that is not trusted is not read, a line that does not check is counted and left out."""

    def __init__(self, paths: Sequence[str] | None = None, trusted_uids: Sequence[int] | None = None,
                 skip_pid: int | None = None) -> None:
        self.paths = list(trusted_journals() if paths is None else paths)
        self.trusted = set((os.geteuid(), 0) if trusted_uids is None else trusted_uids)
        self.skip_pid = skip_pid  # this process's own actions reach its listeners directly
        self.bad = 0  # lines left out
        self.refused: dict[str, str] = {}  # journal -> why it is not read
        self._at: dict[str, tuple[int, int]] = {}  # journal -> (inode, offset read to)
        self._rest: dict[str, bytes] = {}
        for path in self.paths:
            st = self._stat(path)
            if st is not None:
                self._at[path] = (st.st_ino, st.st_size)

    def _stat(self, path: str) -> os.stat_result | None:
        try:
            return os.lstat(path)
        except OSError:
            return None

    def poll(self) -> list[dict[str, Any]]:
        """The events appended since the last poll, in the order written (each journal's, one after the other)."""
        out: list[dict[str, Any]] = []
        for path in self.paths:
            out += self._read(path)
        return out

    def _read_from(self, path: str, offset: int) -> tuple[int, bytes] | None:
        """(owner, the bytes from `offset` on) of a trusted journal; None where it is not trusted or not read."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            self.refused[path] = f"cannot open it: {e.strerror}"
            return None
        try:
            fst = os.fstat(fd)
            why = _untrusted(fst, self.trusted)
            if why:
                self.refused[path] = why
                self._at[path] = (fst.st_ino, fst.st_size)
                return None
            self.refused.pop(path, None)
            data = os.pread(fd, min(MAX_READ_BYTES, fst.st_size - offset), offset)
        except OSError:
            return None
        finally:
            os.close(fd)
        self._at[path] = (fst.st_ino, offset + len(data))
        return fst.st_uid, data

    def _read(self, path: str) -> list[dict[str, Any]]:
        st = self._stat(path)
        if st is None:
            return []
        ino, offset = self._at.get(path, (st.st_ino, 0))
        if ino != st.st_ino or st.st_size < offset:  # started again (or replaced): read the new one whole
            offset, self._rest[path] = 0, b""
        if st.st_size == offset:
            self._at[path] = (st.st_ino, offset)
            return []
        got = self._read_from(path, offset)
        if got is None:
            return []
        owner, data = got
        *lines, rest = (self._rest.get(path, b"") + data).split(b"\n")
        if len(rest) > MAX_LINE_BYTES:  # no newline in sight: not a line of ours
            self.bad += 1
            rest = b""
        self._rest[path] = rest
        return self._events(lines, owner)

    def _events(self, lines: list[bytes], owner: int) -> list[dict[str, Any]]:
        """The events of whole lines but this process's own; a line that does not check is counted, left out."""
        out = []
        for raw in lines:
            if not raw:
                continue
            try:
                event = parse(raw, owner)
            except ValueError:
                self.bad += 1
                continue
            if event["pid"] != self.skip_pid:
                out.append(event)
        return out


def _untrusted(st: os.stat_result, trusted: set[int]) -> str:
    """Why a journal is not believed ("" when it is)."""
    if not stat.S_ISREG(st.st_mode):
        return "not a plain file"
    if st.st_uid not in trusted:
        return f"owned by uid {st.st_uid}, not this user or root"
    if st.st_mode & 0o022:
        return "others can write it"
    return ""
