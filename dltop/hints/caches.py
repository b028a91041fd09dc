"""Cache hints: compile caches that a reboot wipes, caches on slow or nearly full filesystems, entries built for
other versions, stale lock files, caches that keep growing. The source collects the facts; these rules judge."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from dltop.fmt import human_bytes, human_duration, plural
from dltop.hints.base import Hint, passing_over, rule, wanted
from dltop.model.caches import CacheInfo, CachesPart

if TYPE_CHECKING:
    from dltop.model import Snapshot

# Caches whose loss means a slow first run again (a compile or a download), as opposed to a scratch folder
PERSISTENT_WORTH = frozenset({"torchinductor", "torchinductor_headers", "triton", "cuda", "torch_extensions", "vllm", "flashinfer",
                              "deep_gemm", "jax", "hf_hub", "hf_datasets", "torch_hub"})
TEMP_FS = frozenset({"tmpfs", "ramfs"})
# Network and FUSE filesystems: every open of a small cached kernel is a round trip
SLOW_FS = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "fuse.sshfs", "fuse.s3fs", "fuse.gcsfuse",
                     "fuse.rclone", "fuse.juicefs", "fuse.goofys", "fuse.mountpoint-s3", "afs", "glusterfs",
                     "fuse.glusterfs", "lustre", "beegfs", "ceph", "fuse.ceph"})
FULL_FRACTION = 0.05  # free below this share of the filesystem
FULL_MIN_BYTES = 2 << 30  # ... and below this many bytes (a 40 GB disk 5% free is not a 10 TB one)
STALE_LOCK_S = 3600.0  # a lock file nobody holds, untouched this long
GROWTH_MIN_BYTES = 256 << 20  # grew at least this much over the window
GROWTH_MIN_FRACTION = 0.05  # ... and by at least this share of the filesystem's free space, per hour


def _latest(history: Sequence[Snapshot]) -> tuple[float, CachesPart] | None:
    return _first(reversed(history))  # from the newest: the caches are read every few minutes, mostly the first


def _first(history: Iterable[Snapshot]) -> tuple[float, CachesPart] | None:
    return next(((s.ts, s.caches) for s in history if isinstance(s.caches, CachesPart)), None)


_Judge = Callable[[CachesPart], "Hint | None"]


def _of_latest(judge: _Judge) -> Callable[[Sequence[Snapshot]], Hint | None]:
    """A rule that judges the latest caches reading alone, judged once per reading: the Sampler hands every
    Snapshot between two reads the same part (the pure function of it, not judged again on every tick)."""
    # the last part judged, the subjects passed over then, and its hint (one tuple: threads)
    memo: list[tuple[CachesPart, frozenset[tuple[str, str]], Hint | None]] = []

    @functools.wraps(judge)  # its name, module (the rule's layer) and docstring
    def judged(history: Sequence[Snapshot]) -> Hint | None:
        latest = _latest(history)
        if latest is None:
            return None
        part, over = latest[1], passing_over.get()
        kept = memo[0] if memo else None
        if kept is not None and kept[0] is part and kept[1] == over:
            return kept[2]
        hint = judge(part)
        memo[:] = [(part, over, hint)]
        return hint

    return judged


def on_temporary_storage(c: CacheInfo) -> str:
    """Why a cache does not outlive a reboot ("on tmpfs", "under /tmp"), or ""."""
    if c.name not in PERSISTENT_WORTH and c.label != "added":
        return ""
    if c.fs_type in TEMP_FS:
        return f"on {c.fs_type} ({c.mount_point})"
    if c.under_tempdir:
        return f"under {c.under_tempdir}"
    return ""


def other_version_keys(c: CacheInfo) -> tuple[str, ...]:
    """Entries built for another Python / torch / CUDA than the running one: known only where the entry names
    its versions (torch_extensions' py311_cu121) and the running one's key is known."""
    if not c.current_version_key:
        return ()
    return tuple(k for k in c.version_keys if k != c.current_version_key)


def stale_locks(c: CacheInfo, now: float) -> list[str]:
    """Lock files nobody holds (not in /proc/locks) untouched for STALE_LOCK_S."""
    return [lk.path for lk in c.locks if not lk.held and now - lk.mtime >= STALE_LOCK_S]


def warnings_for(c: CacheInfo, now: float | None = None) -> list[str]:
    """Every warning about one cache from one reading, one line each, the most severe first (what `dltop caches`
    prints)."""
    now = time.time() if now is None else now
    out: list[str] = []
    if not c.exists:
        return out
    # most severe first (the pane's detail box shows the first few): full is critical, then what costs every run
    if _nearly_full(c):
        out.append(f"its filesystem is nearly full: {human_bytes(c.fs_free_bytes)} free of "
                   f"{human_bytes(c.fs_total_bytes)}")
    temp = on_temporary_storage(c)
    if temp:
        out.append(f"{temp}: gone at reboot, so the first run compiles or downloads again; "
                   "keep it on a persistent fast disk")
    if c.fs_type in SLOW_FS:
        out.append(f"on {c.fs_type} ({c.mount_point}): every cached kernel is a network round trip; "
                   "keep it on a local disk")
    others = other_version_keys(c)
    if others:
        out.append(f"{plural(len(others), 'entry', 'entries')} built for other versions ({', '.join(others)}; "
                   f"this is {c.current_version_key}): never used again by this interpreter")
    elif len(c.version_keys) > 1:
        out.append(f"entries built for {len(c.version_keys)} versions ({', '.join(c.version_keys)}): "
                   "all but one are for a Python / torch / CUDA not in use")
    locks = stale_locks(c, now)
    if locks:
        out.append(f"{plural(len(locks), 'stale lock file')} (no process holds them, untouched for "
                   f"{human_duration(STALE_LOCK_S)} or more): a crashed run left them")
    return out


def _nearly_full(c: CacheInfo) -> bool:
    if c.fs_free_bytes is None or not c.fs_total_bytes:
        return False
    return c.fs_free_bytes < FULL_FRACTION * c.fs_total_bytes and c.fs_free_bytes < FULL_MIN_BYTES


def _names(caches: list[CacheInfo]) -> str:
    return ", ".join(f"{c.label} ({c.path})" for c in caches[:3]) + (f" and {len(caches) - 3} more"
                                                                     if len(caches) > 3 else "")


PINNED_TO_TEMP = frozenset({"torchinductor_headers"})


@rule
@_of_latest
def cache_on_temporary_storage(part: CachesPart) -> Hint | None:
    """A compile or model cache on tmpfs or under a temporary folder: a reboot wipes it."""
    # Inductor's precompiled headers are always in the temp dir (torch puts them there whatever the cache dir
    # says): nothing the user can move, and they are rebuilt in seconds.
    hit = [c for c in part.caches if c.exists and c.files and on_temporary_storage(c)
           and c.name not in PINNED_TO_TEMP]
    if not hit:
        return None
    return Hint(id="cache-on-temporary-storage", severity="warn",
                text=f"compile cache gone at reboot: {_names(hit)} ({on_temporary_storage(hit[0])}); the first "
                     "run after a reboot compiles again",
                fix="point it at a persistent fast disk (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR, ...)",
                numbers={"caches": len(hit), "bytes": sum(c.size_bytes or 0 for c in hit)})


@rule
@_of_latest
def cache_on_slow_filesystem(part: CachesPart) -> Hint | None:
    """A cache on a network or FUSE filesystem."""
    hit = [c for c in part.caches if c.exists and c.fs_type in SLOW_FS]
    if not hit:
        return None
    return Hint(id="cache-on-slow-filesystem", severity="warn",
                text=f"cache on a network filesystem ({hit[0].fs_type}): {_names(hit)}",
                fix="keep compile caches on a local disk", numbers={"caches": len(hit)})


@rule
@_of_latest
def cache_filesystem_full(part: CachesPart) -> Hint | None:
    """A cache's filesystem nearly full: the next compile or download fails."""
    hit = [c for c in part.caches if c.exists and _nearly_full(c)]
    if not hit:
        return None
    c = hit[0]
    return Hint(id="cache-filesystem-full", severity="critical",
                text=f"filesystem of {_names(hit)} nearly full: {human_bytes(c.fs_free_bytes)} free of "
                     f"{human_bytes(c.fs_total_bytes)}",
                fix="clear caches you no longer need (Caches tab, c)",
                numbers={"free_bytes": c.fs_free_bytes or 0, "total_bytes": c.fs_total_bytes or 0})


@rule
@_of_latest
def cache_for_other_versions(part: CachesPart) -> Hint | None:
    """Entries built for another Python / torch / CUDA (torch_extensions' pyXY_cuZZZ folders)."""
    hit = [(c, others) for c in part.caches
           if (others := other_version_keys(c)) and wanted("cache-for-other-versions", f"cache {c.path}")]
    if not hit:
        return None
    c, others = hit[0]
    wasted = sum(e.size_bytes for e in c.entries if e.name in others)
    return Hint(id="cache-for-other-versions", severity="info", subject=f"cache {c.path}",
                text=f"{c.label} holds {human_bytes(wasted)} built for other versions ({', '.join(others)}; this "
                     f"is {c.current_version_key})",
                fix="clear those entries (Caches tab, Enter, c)", numbers={"bytes": wasted})


@rule
def cache_stale_locks(history: Sequence[Snapshot]) -> Hint | None:
    """Lock files nobody holds, untouched for an hour or more: a crashed run's, which can block the next."""
    latest = _latest(history)
    if latest is None:
        return None
    ts, part = latest
    kept = _stale_judged[0] if _stale_judged else None
    if kept is not None and kept[0] is part and kept[1] <= ts < kept[2]:
        return kept[3]  # the same reading, and no lock has come of age since it was judged
    hint = _stale_hint(part, ts)
    # the next moment a lock nobody holds turns stale (until then the hint stays as it is)
    until = min((lk.mtime + STALE_LOCK_S for c in part.caches for lk in c.locks
                 if not lk.held and lk.mtime + STALE_LOCK_S > ts), default=float("inf"))
    _stale_judged[:] = [(part, ts, until, hint)]
    return hint


_stale_judged: list[tuple[CachesPart, float, float, Hint | None]] = []  # the last reading judged, from, until, hint


def _stale_hint(part: CachesPart, ts: float) -> Hint | None:
    hit = [(c, locks) for c in part.caches if (locks := stale_locks(c, ts))]
    if not hit:
        return None
    n = sum(len(locks) for _, locks in hit)
    return Hint(id="cache-stale-locks", severity="info",
                text=f"{plural(n, 'stale lock file')} in {_names([c for c, _ in hit])}: no process holds them",
                fix=f"a crashed run left them; delete them if a compile waits on one ({hit[0][1][0]})",
                numbers={"locks": n})


_named: list[tuple[CachesPart, dict[str, CacheInfo]]] = []  # the last part looked up by name, and its caches by it


def _by_name(part: CachesPart) -> dict[str, CacheInfo]:
    """`part`'s caches by name (CachesPart.get's first match for each: the first of a name wins)."""
    kept = _named[0] if _named else None
    if kept is not None and kept[0] is part:
        return kept[1]
    names: dict[str, CacheInfo] = {}
    for c in part.caches:
        names.setdefault(c.name, c)
    _named[:] = [(part, names)]
    return names


def _grown(before: CacheInfo | None, c: CacheInfo) -> int | None:
    """Bytes cache `c` grew since `before`, its earlier walk; None where the two cannot be compared."""
    if before is None or before.path != c.path or before.size_bytes is None or c.size_bytes is None:
        return None
    return c.size_bytes - before.size_bytes


def _fastest_growth(first: CachesPart, last: CachesPart, dt: float) -> tuple[float, CacheInfo, int] | None:
    """(bytes an hour, cache, bytes grown) of the cache growing fastest against its filesystem's free space."""
    worst: tuple[float, CacheInfo, int] | None = None
    by_name = _by_name(first)
    for c in last.caches:
        grew = _grown(by_name.get(c.name), c)
        if grew is None or grew < GROWTH_MIN_BYTES or not c.fs_free_bytes:
            continue
        per_hour = grew / dt * 3600
        if not wanted("cache-growing", f"cache {c.path}"):
            continue
        if per_hour >= GROWTH_MIN_FRACTION * c.fs_free_bytes and (worst is None or per_hour > worst[0]):
            worst = (per_hour, c, grew)
    return worst


@rule
def cache_growing(history: Sequence[Snapshot]) -> Hint | None:
    """A cache that grows fast over the window: at that rate it fills its filesystem."""
    oldest, latest = _first(history), _latest(history)
    if oldest is None or latest is None:
        return None
    (t0, first), (t1, last) = oldest, latest
    dt = t1 - t0
    if dt <= 0:
        return None
    worst = _fastest_growth(first, last, dt)
    if worst is None:
        return None
    per_hour, c, grew = worst
    hours_left = (c.fs_free_bytes or 0) / per_hour
    return Hint(id="cache-growing", severity="warn", subject=f"cache {c.path}",
                text=f"{c.label} grew {human_bytes(grew)} in {human_duration(dt)} ({human_bytes(per_hour)}/h): "
                     f"at that rate its filesystem is full in {human_duration(hours_left * 3600)}",
                fix="a cache that never hits grows without bound: check that shapes or code do not change "
                    "every run, or cap it (CUDA_CACHE_MAXSIZE, clearing old entries)",
                numbers={"grew_bytes": grew, "per_hour_bytes": per_hour, "free_bytes": c.fs_free_bytes or 0})
