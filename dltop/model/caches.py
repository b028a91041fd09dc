"""The compile- and model-cache part of a Snapshot: each cache as its tool resolves it, and what is in it.

Sizes are counted as `du -B1` counts them: the blocks of every entry (folders and symlinks too), each inode
once. `files` counts regular files by name, as `find -type f | wc -l` does. A number the walk could not get
is None with its reason in `unavailable`, never 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

KEEP_DEPTH = 4  # folders this many levels below a cache keep their biggest entries (the pane opens them)
FOLDERS_KEPT = 50  # of those, the biggest this many per cache (a Snapshot stays small)
KEPT_PER_FOLDER = 50  # biggest entries kept per folder below the cache; the rest are "N more"


@dataclass(frozen=True)
class CacheEntry:
    """One entry right below a cache (a folder or a file), or one repo of a Hugging Face hub cache."""

    name: str  # the entry's name in the cache ("fxgraph", "models--gpt2", "py311_cu121")
    path: str
    size_bytes: int
    files: int
    newest_mtime: float | None = None
    kind: str = ""  # what the tool keeps there ("FX graph cache", "generated code", "model", ...)
    detail: str = ""  # e.g. a hub repo's revisions: "2 revisions, 1 detached"
    apparent_bytes: int = 0  # st_size summed (du --apparent-size, ncdu's `a`), each inode once
    newest_atime: float | None = None  # last access of its newest-read file (relatime: within a day or so)
    is_dir: bool = False  # a folder: the pane opens it when the walk kept its contents (CacheInfo.folders)
    label: str = ""  # what a person calls it where it is not its name: a hub repo's id ("openai/gpt2")


@dataclass(frozen=True)
class CacheFolder:
    """A folder below a cache whose biggest entries the walk kept, so the pane can open it (more than one level
    down); `more` entries and their `more_bytes` (apparent: `more_apparent_bytes`) were left out."""

    path: str
    entries: tuple[CacheEntry, ...] = ()  # biggest first
    more: int = 0
    more_bytes: int = 0
    more_apparent_bytes: int = 0


@dataclass(frozen=True)
class LockFile:
    """A `*.lock` file in a cache: when it was last touched and whether a process holds a lock on it now
    (/proc/locks names its inode)."""

    path: str
    mtime: float
    held: bool


@dataclass(frozen=True)
class CacheInfo:
    """One cache: where it is, which rule put it there, how big it is, and the facts the hints judge."""

    name: str  # "torchinductor", "triton", "cuda", ..., or "user" for a path the user added
    label: str  # what a person calls it ("TorchInductor", "Hugging Face hub")
    path: str
    source: str  # which rule applied: "TORCHINDUCTOR_CACHE_DIR", "default: <tempdir>/torchinductor_<user>", ...
    exists: bool
    size_bytes: int | None = None
    files: int | None = None
    dirs: int | None = None
    newest_mtime: float | None = None
    oldest_mtime: float | None = None
    entries: tuple[CacheEntry, ...] = ()  # biggest first (ENTRIES_KEPT of them)
    more_entries: int = 0  # entries right below it not kept, and their bytes
    more_bytes: int = 0
    more_apparent_bytes: int = 0
    folders: tuple[CacheFolder, ...] = ()  # folders below it whose entries were kept too (the biggest, a few deep)
    apparent_bytes: int | None = None  # st_size summed, each inode once: du --apparent-size -B1
    newest_atime: float | None = None
    via_symlink: str = ""  # the cache's folder is a symlink: this is what it points to (walked there, said)
    complete: bool = True  # False: the walk was cut short by its time budget; totals cover what it reached
    scanned_at: float = 0.0
    scan_duration_s: float = 0.0
    # What the walk met and noted: unreadable (not counted), vanished (gone before its stat), symlink (its own
    # blocks counted, never its target), non_utf8_name (counted; shown as \xNN)
    noted: dict[str, int] = field(default_factory=dict)
    problems: tuple[str, ...] = ()  # the first few, one line each
    unavailable: dict[str, str] = field(default_factory=dict)  # field -> why it is None
    settings: dict[str, str] = field(default_factory=dict)  # the tool's other knobs: CUDA_CACHE_MAXSIZE=...
    clear_command: str = ""  # the tool's own way to clear it ("hf cache delete")
    owner_uid: int | None = None
    # Where it lives, for the hints: filesystem type and mount point of the cache (or its nearest existing
    # folder), the filesystem's free and total bytes, and whether the path is under a temporary folder.
    fs_type: str = ""
    mount_point: str = ""
    fs_free_bytes: int | None = None
    fs_total_bytes: int | None = None
    under_tempdir: str = ""  # the temporary folder it is under ("/tmp"), or ""
    # Entries named after the versions that built them (torch_extensions' py311_cu121) and the key of the
    # running interpreter when it is known ("" when not: another process's versions are not visible).
    version_keys: tuple[str, ...] = ()
    current_version_key: str = ""
    locks: tuple[LockFile, ...] = ()  # *.lock files found (the first LOCKS_KEPT)


@dataclass(frozen=True)
class CachesPart:
    """Every cache dltop knows of, in a fixed order; JSON as `dltop caches --json` prints each one."""

    caches: tuple[CacheInfo, ...] = ()
    environment: str = "dltop's own environment"  # or "environment of PID 1234 (/proc/1234/environ)"
    pid: int | None = None
    exited: str = ""  # --pid's process is gone: "process 1234 exited", the caches placed by its last environment

    def get(self, name: str) -> CacheInfo | None:
        """The cache called `name`, or the one at path `name`."""
        return next((c for c in self.caches if name in (c.name, c.path)), None)


def folder_of(c: CacheInfo, path: str) -> CacheFolder | None:
    """The kept entries of `path`: the cache's own (its folder) or one of its `folders`; None when not kept."""
    if path == c.path:
        return CacheFolder(c.path, c.entries, c.more_entries, c.more_bytes, c.more_apparent_bytes)
    return next((f for f in c.folders if f.path == path), None)
