"""Clearing a compile or model cache, or one entry of it: measured first, deleted through folder fds, confined
to what the cache's tool writes, and the space freed counted per inode.

The deletion follows `shutil.rmtree`'s fd-based algorithm on Linux: every folder is opened with O_NOFOLLOW
relative to its parent's fd and checked to be the folder that was listed, names are unlinked relative to
that fd, and a symlink is removed as a link, never followed. So a folder replaced by a symlink between the
listing and the deletion cannot lead the deletion outside the cache. What is refused, and by which rule, is in
`confine.py` (a system folder, a home, a Python prefix, an ancestor of one, a folder holding what its tool never
writes) and here (a mount point, another user's path, a path no known or added cache holds, a symlink). A file
with a hard link outside what is removed, or open in a process, keeps its blocks: it is counted as not freed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from dltop import cache_roots
from dltop.actions import confine
from dltop.actions.confine import Refused
from dltop.actions.pagecache import Progress, is_cancelled
from dltop.actions.pagecache import Ticker as _Ticker
from dltop.errors import DltopError
from dltop.fmt import human_bytes, plural, printable
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
    """What a clear did, measured as it deleted: `done_bytes` are the blocks freed (each inode once, when its
    last link went and no process holds it open), `files_done` the regular files removed; `left` counts what was
    not removed and why, `not_freed` the files removed whose blocks stay allocated and why (bytes in
    `not_freed_bytes`); `fs_free_delta_bytes` is what statvfs says the filesystem gained meanwhile (other
    writers on it move that number too)."""

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
    not_freed: dict[str, int] = field(default_factory=dict)
    not_freed_bytes: int = 0
    fs_free_delta_bytes: int | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def left_behind(self) -> bool:
        """Something was not removed, or was removed but still holds its blocks: the CLI exits non-zero."""
        return bool(self.left or self.not_freed)

    def to_dict(self) -> dict[str, Any]:
        """The CLI's --json summary."""
        return asdict(self)


def _mount_points(root: str) -> set[str]:
    try:
        with open(os.path.join(root, "proc", "self", "mountinfo")) as f:
            return {m.point for m in src.parse_mountinfo(f.read())}
    except OSError:
        return set()


def check(path: str, options: ClearOptions) -> tuple[src.Location, os.stat_result]:
    """The cache `path` is (or is inside) and its lstat; raises Refused naming the rule that refuses a clear."""
    if not os.path.isabs(path):
        raise Refused("not absolute", f"{display_path(path)} is not an absolute path")
    path = os.path.normpath(path)
    loc = _cache_of(path, options)
    try:
        st = os.lstat(path)
    except OSError as e:
        raise DltopError(f"nothing to clear: {src.path_error(e.strerror or str(e), path)}") from None
    if stat.S_ISLNK(st.st_mode) and path == loc.path:
        raise Refused("symlink", f"{display_path(path)} is a symbolic link (to {display_path(os.readlink(path))}); "
                      "dltop never follows one: give the folder it points to as a cache of its own")
    if path != loc.path:
        _no_link_above(path, loc.path)
    _check_owner_and_mount(path, st, options.root)
    _check_layout(path, loc)
    return loc, st


def _check_owner_and_mount(path: str, st: os.stat_result, root: str) -> None:
    """Refused where `path` is another user's, or a mount point."""
    if st.st_uid != os.geteuid():
        owner = src.passwd_of(st.st_uid)[0]
        raise Refused("owner", f"{display_path(path)} is owned by {owner} (uid {st.st_uid}), not by this user: "
                      "clear it as its owner")
    mounts = _mount_points(root)
    if stat.S_ISDIR(st.st_mode) and (os.path.ismount(path) or path in mounts or os.path.realpath(path) in mounts):
        raise Refused("mount point", f"{display_path(path)} is a mount point; clear what is inside it by entry")


def _cache_of(path: str, options: ClearOptions) -> src.Location:
    """The known cache `path` is (or is inside); Refused where it is a refused root, none, or inside one refused."""
    try:
        env = options.environment()
    except OSError as e:
        raise DltopError(src.environment_error(e)) from None
    home_of = cache_roots.homes([env.home])
    prefixes = cache_roots.known_prefixes(env.env)
    why = cache_roots.root_refusal(path, home_of=home_of, prefixes=prefixes)
    if why is not None:
        raise Refused(why.rule, why.reason)
    known = src.resolve(env, options.caches)
    loc = next((c for c in known if path == c.path or path.startswith(c.path.rstrip("/") + "/")), None)
    if loc is None:
        raise Refused("not a cache", f"{display_path(path)} is not a cache dltop knows (known: "
                      + ", ".join(c.name for c in known) + "; add one with caches = [...] or --cache)")
    if path != loc.path:
        why = cache_roots.root_refusal(loc.path, home_of=home_of, prefixes=prefixes)
        if why is not None:
            raise Refused(why.rule, f"{display_path(path)} is inside {display_path(loc.path)}, which is refused: "
                                    f"{why.reason}")
    return loc


def _no_link_above(path: str, cache: str) -> None:
    """An entry: no symlink from the cache folder down to it (a lexical path through one leads outside)."""
    folder = cache
    for part in ["", *os.path.relpath(os.path.dirname(path), cache).split(os.sep)]:
        folder = os.path.join(folder, part) if part not in ("", ".") else folder
        if os.path.islink(folder):
            raise Refused("symlink", f"{display_path(folder)} is a symbolic link on the way to "
                          f"{display_path(path)}; dltop never follows one")


def _check_layout(path: str, loc: src.Location) -> None:
    """A cache folder holds only what its tool writes (an added one, what one of the known tools writes); an
    entry must be one of those names, in a cache folder that passes."""
    if os.path.isdir(loc.path) and not os.path.islink(loc.path):
        why = confine.layout_refusal(loc.name, loc.path)
        if why is not None:
            if path != loc.path:
                raise Refused(why.rule, f"{display_path(path)} is inside {display_path(loc.path)}, which is refused: "
                                        f"{why.reason}")
            raise Refused(why.rule, why.reason)
    if path != loc.path:
        top = os.path.relpath(path, loc.path).split(os.sep)[0]
        full = os.path.join(loc.path, top)
        why = confine.entry_refusal(loc.name, loc.path, top, os.path.isdir(full) and not os.path.islink(full))
        if why is not None:
            raise Refused(why.rule, why.reason)


def open_by(target: str, root: str = "/") -> dict[int, tuple[str, int]]:
    """{pid: (command, count)} of processes with files open under `target` (fds, working folder, mappings)."""
    prefix = target.rstrip("/") + "/"
    proc = os.path.join(root, "proc")
    out: dict[int, tuple[str, int]] = {}
    for name in _other_pids(proc):
        base = os.path.join(proc, name)
        found = _open_under(base, target, prefix)
        if found:
            try:
                with open(os.path.join(base, "comm")) as f:
                    comm = f.read().strip()
            except OSError:
                comm = "?"
            out[int(name)] = (comm, len(found))
    return out


def _open_under(base: str, target: str, prefix: str) -> set[str]:
    """The paths under `target` one process (/proc/PID at `base`) holds: its working folder, fds and mappings."""
    found: set[str] = set()
    for p in [os.path.join(base, "cwd"), *_fd_paths(base)]:
        try:
            link = os.readlink(p)
        except OSError:
            continue
        if link == target or link.startswith(prefix):
            found.add(link)
    found.update(where[5] for where in _maps(base) if len(where) == 6 and where[5].startswith(prefix))
    return found


def open_inodes(dev: int, root: str = "/") -> set[tuple[int, int]]:
    """(st_dev, st_ino) of every file on filesystem `dev` that a process holds open (an fd or a mapping): its
    blocks stay allocated after its last name is removed, until the process lets go."""
    proc = os.path.join(root, "proc")
    out: set[tuple[int, int]] = set()
    try:
        pids = _other_pids(proc)
    except OSError:
        return out
    for name in pids:
        base = os.path.join(proc, name)
        for p in _fd_paths(base):
            try:
                if not os.readlink(p).startswith("/"):
                    continue  # a pipe, socket or anon inode: no file of a cache
                st = os.stat(p)
            except OSError:
                continue
            if st.st_dev == dev:
                out.add((st.st_dev, st.st_ino))
        out.update(_mapped_on(base, dev))
    return out


def _mapped_on(base: str, dev: int) -> Iterator[tuple[int, int]]:
    """(dev, inode) of each file on filesystem `dev` one process (/proc/PID at `base`) maps."""
    for parts in _maps(base):
        if len(parts) < 5 or parts[4] == "0":
            continue
        major, _, minor = parts[3].partition(":")
        with contextlib.suppress(ValueError):
            if os.makedev(int(major, 16), int(minor, 16)) == dev:
                yield dev, int(parts[4])


def _other_pids(proc: str) -> list[str]:
    """The pids in `proc` but this process's."""
    me = os.getpid()
    return [n for n in os.listdir(proc) if n.isdigit() and int(n) != me]


def _fd_paths(base: str) -> list[str]:
    """A process's /proc/PID/fd/N links (none where they cannot be listed)."""
    try:
        return [os.path.join(base, "fd", fd) for fd in os.listdir(os.path.join(base, "fd"))]
    except OSError:
        return []


def _maps(base: str) -> Iterator[list[str]]:
    """The fields of each line of a process's /proc/PID/maps (address, perms, offset, dev, inode, path), as far
    as it can be read."""
    try:
        with open(os.path.join(base, "maps"), errors="surrogateescape") as f:
            for line in f:
                yield line.rstrip("\n").split(None, 5)
    except OSError:
        return


@dataclass
class Tally:
    """What removing `path` frees, counted per inode: a file's blocks once, and only when every link of it is
    below `path` and no process holds it open."""

    freed_bytes: int = 0
    files: int = 0  # regular files by name (find -type f)
    linked_outside: tuple[int, int] = (0, 0)  # (files, bytes) with links elsewhere: removed, not freed
    held_open: tuple[int, int] = (0, 0)  # (files, bytes) open in a process: removed, freed when it closes them
    unreadable: int = 0


def tally(path: str, keep_top: bool, held: set[tuple[int, int]], cancel: threading.Event | None = None) -> Tally:
    """Walk `path` without following symlinks and count what a clear of it frees (the folder itself left out
    when `keep_top`)."""
    t = Tally()
    links: dict[tuple[int, int], list[int]] = {}  # inode -> [blocks, st_nlink, links met]
    try:
        top = os.lstat(path)
    except OSError:
        return t
    todo: list[str] = []
    if stat.S_ISDIR(top.st_mode):
        todo.append(path)
        if not keep_top:
            t.freed_bytes += top.st_blocks * 512
    else:
        links[(top.st_dev, top.st_ino)] = [top.st_blocks * 512, top.st_nlink, 1]
        t.files += stat.S_ISREG(top.st_mode)
    while todo:
        if is_cancelled(cancel):
            break
        d = todo.pop()
        try:
            with os.scandir(d) as it:
                for e in it:
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        t.unreadable += 1
                        continue
                    if stat.S_ISDIR(st.st_mode):
                        t.freed_bytes += st.st_blocks * 512
                        todo.append(e.path)
                        continue
                    t.files += stat.S_ISREG(st.st_mode)
                    seen = links.setdefault((st.st_dev, st.st_ino), [st.st_blocks * 512, st.st_nlink, 0])
                    seen[2] += 1
        except OSError:
            t.unreadable += 1
    _count_inodes(t, links, held)
    return t


def _count_inodes(t: Tally, links: dict[tuple[int, int], list[int]], held: set[tuple[int, int]]) -> None:
    """Each inode's blocks ([blocks, st_nlink, links met]) freed, linked outside, or held open by a process."""
    outside, open_ = [0, 0], [0, 0]
    for key, (blocks, nlink, met) in links.items():
        if met < nlink:
            outside[0], outside[1] = outside[0] + 1, outside[1] + blocks
        elif key in held:
            open_[0], open_[1] = open_[0] + 1, open_[1] + blocks
        else:
            t.freed_bytes += blocks
    t.linked_outside, t.held_open = (outside[0], outside[1]), (open_[0], open_[1])


def _tally_all(paths: list[str], keep_top: bool, held: set[tuple[int, int]],
               cancel: threading.Event | None) -> tuple[int, int]:
    """The bytes freed and the files removed by clearing each of `paths` (`keep_top` as for `tally`)."""
    freed = files = 0
    for p in paths:
        t = tally(p, keep_top, held, cancel)
        freed, files = freed + t.freed_bytes, files + t.files
    return freed, files


_HUB_REVISION = re.compile(r"((?:models|datasets|spaces)--[^/]+)/snapshots/([^/]+)")


def hub_revision(path: str, loc: src.Location) -> tuple[str, str] | None:
    """(repo folder, commit hash) when `path` is one revision of a Hugging Face hub cache (REPO/snapshots/REV)."""
    if loc.name != "hf_hub" or not path.startswith(loc.path.rstrip("/") + "/"):
        return None
    m = _HUB_REVISION.fullmatch(path[len(loc.path.rstrip("/")) + 1:])
    return (os.path.join(loc.path, m.group(1)), m.group(2)) if m else None


def hub_deletions(loc: src.Location, revision: str, options: ClearOptions) -> tuple[list[str], int, bool]:
    """What huggingface_hub's own delete_revisions plans for one revision (as `hf cache rm` does): the paths in
    the order its execute() removes them (snapshot entries, a repo whose only revision it is, the snapshot, its
    refs, the blobs no other revision links), its expected freed bytes (file sizes), and whether the whole repo
    goes. Each path is checked as any clear is (inside the cache, no symlink on the way, this user's)."""
    try:
        from huggingface_hub import scan_cache_dir
    except ImportError:
        raise DltopError("deleting one revision needs huggingface_hub (pip install huggingface_hub): "
                         "without it, clear the whole repo") from None
    try:
        strategy = scan_cache_dir(loc.path).delete_revisions(revision)
    except Exception as e:  # its own errors (a corrupted cache): one line, never a traceback
        raise DltopError(f"huggingface_hub could not read {display_path(loc.path)}: {printable(str(e))}") from None
    paths = [str(p) for group in (strategy.files, strategy.repos, strategy.snapshots, strategy.refs, strategy.blobs)
             for p in sorted(group)]
    if not paths:
        raise DltopError(f"no revision {printable(revision)} in {display_path(loc.path)}")
    for p in paths:
        check(p, options)  # raises Refused: outside the cache, through a symlink, another user's
    return paths, int(strategy.expected_freed_size), bool(strategy.repos)


def _refused_plan(path: str, e: DltopError) -> ActionPlan:
    """The plan of a clear refused by a rule (Refused), or by an error."""
    return ActionPlan(action="clear", target=path, bytes=0, files=0, allowed=False, guard=str(e),
                      refused_by=e.rule if isinstance(e, Refused) else "error")


def _plan_hub(path: str, loc: src.Location, repo: str, revision: str, options: ClearOptions,
              st: os.stat_result, cancel: threading.Event | None) -> ActionPlan:
    try:
        paths, expected, whole = hub_deletions(loc, revision, options)
    except DltopError as e:
        return _refused_plan(path, e)
    freed, files = _tally_all(paths, False, open_inodes(st.st_dev, options.root), cancel)
    repo_id = src.hub_repo_id(os.path.basename(repo))
    notes = [f"huggingface_hub's delete_revisions plans this (as hf cache rm does): it expects to free "
             f"{human_bytes(expected)} (file sizes; dltop counts blocks), blobs linked by another revision stay."]
    if whole:
        notes.append(f"It is the only revision of {printable(repo_id)}: the whole repo folder goes.")
    return ActionPlan(action="clear", target=path, bytes=freed, files=files, allowed=True,
                      guard=f"ok: revision {printable(revision[:12])} of {printable(repo_id)} ({loc.label} cache)",
                      notes=tuple(notes))


def plan(path: str, options: ClearOptions, cancel: threading.Event | None = None) -> ActionPlan:
    """The facts a confirmation states: the bytes a clear frees and the files it removes, the refusal if any
    (and the rule), the warnings."""
    try:
        loc, st = check(path, options)
    except DltopError as e:
        return _refused_plan(path, e)
    path = os.path.normpath(path)
    if (rev := hub_revision(path, loc)) is not None:
        return _plan_hub(path, loc, rev[0], rev[1], options, st, cancel)
    t = tally(path, _keeps_folder(path, loc, st), open_inodes(st.st_dev, options.root), cancel)
    layout = confine.layout_of(loc.name, loc.path)
    kind = f"added cache, laid out as {layout}'s" if layout else f"{loc.label} cache"
    return ActionPlan(action="clear", target=path, bytes=t.freed_bytes, files=t.files, allowed=True,
                      guard=f"ok: {kind} ({loc.source})", notes=_plan_notes(path, loc, st, t, options.root))


def _plan_notes(path: str, loc: src.Location, st: os.stat_result, t: Tally, root: str) -> tuple[str, ...]:
    """The warnings and notes a clear's confirmation states."""
    notes = []
    users = open_by(os.path.realpath(path), root)
    if users:
        who = ", ".join(f"PID {pid} ({printable(comm)}, {plural(n, 'file')})"
                        for pid, (comm, n) in list(users.items())[:OPEN_SHOWN])
        more = f" and {len(users) - OPEN_SHOWN} more" if len(users) > OPEN_SHOWN else ""
        notes.append(f"Warning: running processes have files open there: {who}{more}. Clearing under a running "
                     "job can make it fail or compile again.")
    if t.linked_outside[0]:
        notes.append(f"Not freed: {human_bytes(t.linked_outside[1])} in {plural(t.linked_outside[0], 'file')} with "
                     "hard links outside what is cleared: the names go, the data stays on disk.")
    if t.held_open[0]:
        notes.append(f"Not freed yet: {human_bytes(t.held_open[1])} in {plural(t.held_open[0], 'file')} open in a "
                     "running process: the space comes back when it closes them.")
    if _keeps_folder(path, loc, st):
        notes.append(f"The folder itself stays; everything in it goes ({loc.label}).")
    if loc.clear_command:
        notes.append(f"{loc.label} has its own clear command: {loc.clear_command}.")
    if t.unreadable:
        notes.append(f"{plural(t.unreadable, 'entry', 'entries')} could not be read: not counted.")
    return tuple(notes)


def _keeps_folder(path: str, loc: src.Location, st: os.stat_result) -> bool:
    """A whole cache is cleared by what is in it: its folder stays (with its owner, mode and mount)."""
    return os.path.normpath(path) == loc.path and stat.S_ISDIR(st.st_mode)


class _Clearer:
    """Deletes below one folder fd, counting what it removes; never follows a symlink, never leaves the
    filesystem it started on."""

    def __init__(self, dev: int, ticker: _Ticker, cancel: threading.Event | None, result: ClearResult,
                 held: set[tuple[int, int]]) -> None:
        self.dev, self.ticker, self.cancel, self.r, self.held = dev, ticker, cancel, result, held
        self.linked: dict[tuple[int, int], int] = {}  # inode -> blocks: a link removed, others remain

    def not_freed(self, why: str, n_bytes: int) -> None:
        self.r.not_freed[why] = self.r.not_freed.get(why, 0) + 1
        self.r.not_freed_bytes += n_bytes

    def finish(self) -> None:
        """Inodes whose other links were never met: their blocks stay with those links."""
        for blocks in self.linked.values():
            self.not_freed("linked outside what was cleared", blocks)
        self.linked.clear()

    def stopped(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    def leave(self, why: str, path: str, detail: str | None = None) -> None:
        self.r.left[why] = self.r.left.get(why, 0) + 1
        if detail is not None and len(self.r.problems) < src.MAX_PROBLEMS:
            self.r.problems.append(f"{detail}: {display_path(path)}")

    def count(self, st: os.stat_result, path: str) -> None:
        """Count a name just removed; `st` was taken right before (st_nlink: the links it had then)."""
        blocks = st.st_blocks * 512
        if stat.S_ISREG(st.st_mode):
            self.ticker.files += 1
        if not stat.S_ISDIR(st.st_mode):
            key = (st.st_dev, st.st_ino)
            if st.st_nlink > 1:
                self.linked[key] = blocks  # other links keep it: freed only if the last of them goes here too
                blocks = 0
            else:
                self.linked.pop(key, None)
                if key in self.held:
                    self.not_freed("open in a process", blocks)
                    blocks = 0
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
        self._folder(dfd, name, path, st)

    def _folder(self, dfd: int, name: str, path: str, st: os.stat_result) -> None:
        """Remove folder `name`, opened without following a symlink and checked to be the one listed (`st`)."""
        try:
            fd = os.open(name, _O_DIR, dir_fd=dfd)
        except OSError as e:
            self._not_opened(dfd, name, path, e)
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

    def _not_opened(self, dfd: int, name: str, path: str, e: OSError) -> None:
        """A folder that would not open: replaced by a symlink or a file since it was listed (that name removed,
        never followed), gone (nothing to do), or unreadable (left, and said)."""
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            try:
                now = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                return
            self.unlink(dfd, name, path, now)
        elif e.errno != errno.ENOENT:
            self.leave("unreadable", path, src.path_error(e.strerror or str(e), path))

    def unlink(self, dfd: int, name: str, path: str, st: os.stat_result) -> None:
        if st.st_nlink > 1:
            # The link count now, not at the listing: an earlier unlink of another of its names lowered it.
            try:
                now = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                return
            except OSError as e:
                self.leave("unreadable", path, src.path_error(e.strerror or str(e), path))
                return
            st = now
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
    """Clear a cache (what is in its folder) or one entry of it (the entry itself), after the checks of `check`.
    A hub revision is what huggingface_hub's delete_revisions plans, removed in its order by the same deletion."""
    loc, st = check(path, options)
    path = os.path.normpath(path)
    held = open_inodes(st.st_dev, options.root)
    rev = hub_revision(path, loc)
    paths = [path] if rev is None else hub_deletions(loc, rev[1], options)[0]
    keep = _keeps_folder(path, loc, st)
    total, files = _tally_all(paths, keep, held, cancel)
    r = ClearResult(action="clear", paths=[path], cache=loc.name, dry_run=dry_run, total_bytes=total, files=files)
    if dry_run or is_cancelled(cancel):
        r.cancelled = not dry_run
        return r
    t0 = time.monotonic()
    clearer = _Clearer(st.st_dev, _Ticker("clear", total, progress), cancel, r, held)
    r.fs_free_delta_bytes = _delete(paths, loc.path, st if keep else None, clearer)
    return _cleared(r, clearer, path, t0)


def _delete(paths: list[str], cache: str, kept: os.stat_result | None, clearer: _Clearer) -> int | None:
    """Remove each of `paths` in turn (a hub revision's: snapshot entries and refs before blobs, so an interrupted
    delete leaves no link to a lost blob), or empty the one cache folder `kept` is the lstat of; the bytes its
    filesystem gained meanwhile (None: statvfs could not say)."""
    free_before = after = None
    for p in paths:
        if clearer.stopped():
            break
        pfd = open_parent(p, cache)
        try:
            if free_before is None:
                free_before = _free_bytes(pfd)
            if kept is not None:
                _empty(pfd, p, kept, clearer)
            else:
                clearer.entry(pfd, os.path.basename(p), p)
            after = _free_bytes(pfd)
        finally:
            os.close(pfd)
    clearer.finish()
    return after - free_before if free_before is not None and after is not None else None


def _empty(pfd: int, path: str, st: os.stat_result, clearer: _Clearer) -> None:
    """Remove what is in the cache folder `path` (in `pfd`), once it is checked to be the folder `st` describes."""
    fd = os.open(os.path.basename(path), _O_DIR, dir_fd=pfd)
    try:
        if not os.path.samestat(st, os.fstat(fd)):
            raise DltopError(f"refused: {display_path(path)} changed while being checked")
        clearer.contents(fd, path)
    finally:
        os.close(fd)


def _cleared(r: ClearResult, clearer: _Clearer, path: str, t0: float) -> ClearResult:
    """`r` with what the clear measured as it deleted: bytes freed, files removed, time, whether cancelled."""
    clearer.ticker.add(0, path, force=True)
    r.done_bytes, r.files_done = clearer.ticker.done, clearer.ticker.files
    r.elapsed_s = time.monotonic() - t0
    r.cancelled = clearer.stopped()
    return r


def _free_bytes(fd: int) -> int | None:
    """The filesystem's free blocks in bytes (statvfs' f_bfree, what df's Used moves by)."""
    try:
        v = os.fstatvfs(fd)
    except OSError:
        return None
    return v.f_bfree * v.f_frsize


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
    """'cleared 1.8 MiB (120 files) of /x in 0.4s (cancelled); left: 2 other filesystem; not freed: 5 MiB in
    1 file linked outside what was cleared'."""
    line = (f"cleared {human_bytes(r.done_bytes)} ({plural(r.files_done, 'file')}) of {', '.join(r.paths)} "
            f"in {r.elapsed_s:.1f}s")
    if r.cancelled:
        line += " (cancelled)"
    if r.left:
        line += "; left: " + ", ".join(f"{n} {why}" for why, n in r.left.items())
    if r.not_freed:
        line += (f"; not freed: {human_bytes(r.not_freed_bytes)} in "
                 + ", ".join(f"{plural(n, 'file')} {why}" for why, n in r.not_freed.items()))
    return line
