"""Clearing a compile or model cache, or one entry of it: measured first, deleted through folder fds.

The deletion follows `shutil.rmtree`'s fd-based algorithm on Linux: every folder is opened with O_NOFOLLOW
relative to its parent's fd and checked to be the folder that was listed, names are unlinked relative to
that fd, and a symlink is removed as a link, never followed. So a folder replaced by a symlink between the
listing and the deletion cannot lead the deletion outside the cache. What is refused, and why: `/`, a home
folder, a mount point, a path owned by another user, a path that is not a known or added cache (or inside
one), a cache that is itself a symlink.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from dltop.actions.pagecache import Progress, _Ticker
from dltop.errors import DltopError
from dltop.fmt import human_bytes, plural
from dltop.model.actions import ActionPlan
from dltop.model.base import display_path
from dltop.sources import caches as src

_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_scandir: Callable[[int], Any] = os.scandir  # tests hook the moment between list and delete
OPEN_SHOWN = 5  # processes named in the plan's warning


@dataclass(frozen=True)
class ClearOptions:
    """Whose caches: the environment that places them (--pid) and the folders the user added."""

    caches: tuple[str, ...] = ()
    pid: int | None = None
    root: str = "/"

    def environment(self) -> src.Environment:
        """The Environment the known caches are resolved in."""
        return src.own_environment() if self.pid is None else src.process_environment(self.pid, self.root)


@dataclass
class ClearResult:
    """What a clear did, measured as it deleted: `done_bytes` are the blocks of what was removed (du -B1's
    count), `files_done` the regular files removed; `left` says what was not removed and why."""

    action: str
    paths: list[str]
    cache: str = ""
    dry_run: bool = False
    total_bytes: int = 0
    files: int = 0
    done_bytes: int = 0
    files_done: int = 0
    elapsed_s: float = 0.0
    cancelled: bool = False
    left: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The CLI's --json summary."""
        return asdict(self)


def _homes() -> set[str]:
    out = {os.path.realpath(os.path.expanduser("~"))}
    with contextlib.suppress(OSError):
        out |= {os.path.realpath(p.pw_dir) for p in pwd.getpwall() if p.pw_dir}
    return out


def _mount_points(root: str) -> set[str]:
    try:
        with open(os.path.join(root, "proc", "self", "mountinfo")) as f:
            return {m.point for m in src.parse_mountinfo(f.read())}
    except OSError:
        return set()


def check(path: str, options: ClearOptions) -> tuple[src.Location, os.stat_result]:
    """The cache `path` is (or is inside) and its lstat; raises DltopError saying why a clear is refused."""
    if not os.path.isabs(path):
        raise DltopError(f"refused: {display_path(path)} is not an absolute path")
    path = os.path.normpath(path)
    real = os.path.realpath(path)
    if path == "/" or real == "/":
        raise DltopError("refused: / is not a cache")
    if real in _homes():
        raise DltopError(f"refused: {display_path(path)} is a home folder, not a cache")
    try:
        env = options.environment()
    except OSError as e:
        raise DltopError(src.environment_error(e)) from None
    known = src.resolve(env, options.caches)
    loc = next((c for c in known if path == c.path or path.startswith(c.path.rstrip("/") + "/")), None)
    if loc is None:
        raise DltopError(f"refused: {display_path(path)} is not a cache dltop knows (known: "
                         + ", ".join(c.name for c in known) + "; add one with caches = [...] or --cache)")
    try:
        st = os.lstat(path)
    except OSError as e:
        raise DltopError(f"nothing to clear: {src.path_error(e.strerror or str(e), path)}") from None
    if stat.S_ISLNK(st.st_mode) and path == loc.path:
        raise DltopError(f"refused: {display_path(path)} is a symbolic link (to {display_path(os.readlink(path))}); "
                         "dltop never follows one: give the folder it points to as a cache of its own")
    if path != loc.path:
        # An entry: no symlink from the cache folder down to it (a lexical path through one leads outside)
        folder = loc.path
        for part in ["", *os.path.relpath(os.path.dirname(path), loc.path).split(os.sep)]:
            folder = os.path.join(folder, part) if part not in ("", ".") else folder
            if os.path.islink(folder):
                raise DltopError(f"refused: {display_path(folder)} is a symbolic link on the way to "
                                 f"{display_path(path)}; dltop never follows one")
    if st.st_uid != os.geteuid():
        owner = src.passwd_of(st.st_uid)[0]
        raise DltopError(f"refused: {display_path(path)} is owned by {owner} (uid {st.st_uid}), not by this user: "
                         "clear it as its owner")
    if stat.S_ISDIR(st.st_mode) and (os.path.ismount(path) or path in _mount_points(options.root)
                                     or real in _mount_points(options.root)):
        raise DltopError(f"refused: {display_path(path)} is a mount point; clear what is inside it by entry")
    return loc, st


def open_by(target: str, root: str = "/") -> dict[int, tuple[str, int]]:
    """{pid: (command, count)} of processes with files open under `target` (fds, working folder, mappings)."""
    prefix = target.rstrip("/") + "/"
    proc = os.path.join(root, "proc")
    out: dict[int, tuple[str, int]] = {}
    me = os.getpid()
    for name in os.listdir(proc):
        if not name.isdigit() or int(name) == me:
            continue
        base = os.path.join(proc, name)
        found: set[str] = set()
        places = [os.path.join(base, "cwd")]
        with contextlib.suppress(OSError):
            places += [os.path.join(base, "fd", fd) for fd in os.listdir(os.path.join(base, "fd"))]
        for p in places:
            try:
                link = os.readlink(p)
            except OSError:
                continue
            if link == target or link.startswith(prefix):
                found.add(link)
        try:
            with open(os.path.join(base, "maps"), errors="surrogateescape") as f:
                for line in f:
                    where = line.rstrip("\n").split(None, 5)
                    if len(where) == 6 and where[5].startswith(prefix):
                        found.add(where[5])
        except OSError:
            pass
        if found:
            try:
                with open(os.path.join(base, "comm")) as f:
                    comm = f.read().strip()
            except OSError:
                comm = "?"
            out[int(name)] = (comm, len(found))
    return out


def plan(path: str, options: ClearOptions, cancel: threading.Event | None = None) -> ActionPlan:
    """The facts a confirmation states: the bytes and files a clear removes, the refusal if any, the warnings."""
    try:
        loc, st = check(path, options)
    except DltopError as e:
        return ActionPlan(action="clear", target=path, bytes=0, files=0, allowed=False, guard=str(e))
    w = src.walk_cache(os.path.normpath(path), cancel=cancel)
    notes = []
    real = os.path.realpath(path)
    users = open_by(real, options.root)
    if users:
        who = ", ".join(f"PID {pid} ({comm}, {plural(n, 'file')})" for pid, (comm, n) in list(users.items())[:OPEN_SHOWN])
        more = f" and {len(users) - OPEN_SHOWN} more" if len(users) > OPEN_SHOWN else ""
        notes.append(f"Warning: running processes have files open there: {who}{more}. Clearing under a running "
                     "job can make it fail or compile again.")
    if _keeps_folder(path, loc, st):
        notes.append(f"The folder itself stays; everything in it goes ({loc.label}).")
    if loc.clear_command:
        notes.append(f"{loc.label} has its own clear command: {loc.clear_command}.")
    if w.noted.get("unreadable"):
        notes.append(f"{plural(w.noted['unreadable'], 'entry', 'entries')} could not be read: not counted.")
    return ActionPlan(action="clear", target=path, bytes=_removed_bytes(path, loc, st, w), files=w.files, allowed=True,
                      guard=f"ok: {loc.label} cache ({loc.source})", notes=tuple(notes))


def _keeps_folder(path: str, loc: src.Location, st: os.stat_result) -> bool:
    """A whole cache is cleared by what is in it: its folder stays (with its owner, mode and mount)."""
    return os.path.normpath(path) == loc.path and stat.S_ISDIR(st.st_mode)


def _removed_bytes(path: str, loc: src.Location, st: os.stat_result, w: src.CacheWalk) -> int:
    return w.size_bytes - (st.st_blocks * 512 if _keeps_folder(path, loc, st) else 0)


class _Clearer:
    """Deletes below one folder fd, counting what it removes; never follows a symlink, never leaves the
    filesystem it started on."""

    def __init__(self, dev: int, ticker: _Ticker, cancel: threading.Event | None, result: ClearResult) -> None:
        self.dev, self.ticker, self.cancel, self.r = dev, ticker, cancel, result
        self.seen: set[tuple[int, int]] = set()

    def stopped(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    def leave(self, why: str, path: str, detail: str | None = None) -> None:
        self.r.left[why] = self.r.left.get(why, 0) + 1
        if detail is not None and len(self.r.problems) < src.MAX_PROBLEMS:
            self.r.problems.append(f"{detail}: {display_path(path)}")

    def count(self, st: os.stat_result, path: str) -> None:
        blocks = st.st_blocks * 512
        if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
            key = (st.st_dev, st.st_ino)
            if key in self.seen:
                blocks = 0
            self.seen.add(key)
        if stat.S_ISREG(st.st_mode):
            self.ticker.files += 1
        self.ticker.add(blocks, path)

    def contents(self, fd: int, path: str) -> None:
        """Remove everything in the folder open at `fd`."""
        with _scandir(fd) as it:
            entries = list(it)
        for entry in entries:
            if self.stopped():
                return
            self.entry(fd, entry.name, f"{path}/{entry.name}", entry)

    def entry(self, dfd: int, name: str, path: str, entry: os.DirEntry[str] | None = None) -> None:
        """Remove `name` in the folder open at `dfd`: a folder with what is in it, anything else by unlink."""
        try:
            st = entry.stat(follow_symlinks=False) if entry is not None else os.stat(name, dir_fd=dfd,
                                                                                     follow_symlinks=False)
        except FileNotFoundError:
            return  # gone already: nothing to remove, nothing to count
        except OSError as e:
            self.leave("unreadable", path, src.path_error(e.strerror or str(e), path))
            return
        if not stat.S_ISDIR(st.st_mode):
            self.unlink(dfd, name, path, st)
            return
        if st.st_dev != self.dev:
            self.leave("other filesystem", path, "a filesystem mounted inside the cache: left alone")
            return
        try:
            fd = os.open(name, _O_DIR, dir_fd=dfd)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                # Replaced by a symlink or a file since it was listed: remove that name, never follow it.
                try:
                    now = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                except FileNotFoundError:
                    return
                self.unlink(dfd, name, path, now)
                return
            if e.errno != errno.ENOENT:
                self.leave("unreadable", path, src.path_error(e.strerror or str(e), path))
            return
        try:
            if not os.path.samestat(st, os.fstat(fd)):
                self.leave("changed while clearing", path, "replaced while clearing: left alone")
                return
            self.contents(fd, path)
        except OSError as e:
            self.leave("unreadable", path, src.path_error(e.strerror or str(e), path))
            return
        finally:
            os.close(fd)
        if not self.stopped():
            self.remove(os.rmdir, dfd, name, path, st)

    def unlink(self, dfd: int, name: str, path: str, st: os.stat_result) -> None:
        self.remove(os.unlink, dfd, name, path, st)  # a symlink goes as a link: its target is never touched

    def remove(self, how: Callable[..., None], dfd: int, name: str, path: str, st: os.stat_result) -> None:
        """`how(name, dir_fd=dfd)` (unlink or rmdir), counted when it went, noted when it could not."""
        try:
            how(name, dir_fd=dfd)
        except FileNotFoundError:
            return
        except OSError as e:
            self.leave("not removed", path, src.path_error(e.strerror or str(e), path))
            return
        self.count(st, path)


def clear(path: str, options: ClearOptions, *, dry_run: bool = False,
          progress: Callable[[Progress], None] | None = None, cancel: threading.Event | None = None) -> ClearResult:
    """Clear a cache (what is in its folder) or one entry of it (the entry itself), after the checks of `check`."""
    loc, st = check(path, options)
    path = os.path.normpath(path)
    w = src.walk_cache(path, cancel=cancel)
    r = ClearResult(action="clear", paths=[path], cache=loc.name, dry_run=dry_run,
                    total_bytes=_removed_bytes(path, loc, st, w), files=w.files)
    if dry_run or (cancel is not None and cancel.is_set()):
        r.cancelled = not dry_run
        return r
    t0 = time.monotonic()
    ticker = _Ticker("clear", r.total_bytes, progress)
    clearer = _Clearer(st.st_dev, ticker, cancel, r)
    name = os.path.basename(path)
    pfd = open_parent(path, loc.path)
    try:
        if _keeps_folder(path, loc, st):
            fd = os.open(name, _O_DIR, dir_fd=pfd)
            try:
                if not os.path.samestat(st, os.fstat(fd)):
                    raise DltopError(f"refused: {display_path(path)} changed while being checked")
                clearer.contents(fd, path)
            finally:
                os.close(fd)
        else:
            clearer.entry(pfd, name, path)
    finally:
        os.close(pfd)
    ticker.add(0, path, force=True)
    r.done_bytes, r.files_done = ticker.done, ticker.files
    r.elapsed_s = time.monotonic() - t0
    r.cancelled = clearer.stopped()
    return r


def open_parent(path: str, cache: str) -> int:
    """An fd of the folder holding `path`, reached from the cache's own parent one name at a time with
    O_NOFOLLOW: a symlink anywhere from the cache folder down (planted, or swapped in after the checks) fails
    the open instead of leading outside the cache. Folders above the cache are the user's layout: followed."""
    fd = os.open(os.path.dirname(cache) or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    rel = os.path.relpath(os.path.dirname(path), os.path.dirname(cache))
    try:
        for part in ([] if rel == "." else rel.split(os.sep)):
            try:
                nxt = os.open(part, _O_DIR, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise DltopError(f"refused: a symbolic link on the way to {display_path(path)}") from None
                raise
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def summary(r: ClearResult) -> str:
    """'cleared 1.8 MiB (120 files) of /x in 0.4s (cancelled); left: 2 other filesystem'."""
    line = (f"cleared {human_bytes(r.done_bytes)} ({plural(r.files_done, 'file')}) of {', '.join(r.paths)} "
            f"in {r.elapsed_s:.1f}s")
    if r.cancelled:
        line += " (cancelled)"
    if r.left:
        line += "; left: " + ", ".join(f"{n} {why}" for why, n in r.left.items())
    return line
