"""The caches as plain text: `dltop caches` and the Caches pane show the same rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dltop.fmt import human_bytes, human_duration
from dltop.model.base import display_path
from dltop.model.caches import CacheEntry, CacheInfo, CachesPart


def age(mtime: float | None, now: float) -> str:
    """'3h05m ago' for a file time, '-' when there is none."""
    return "-" if mtime is None else human_duration(max(0.0, now - mtime)) + " ago"


def size_text(c: CacheInfo, apparent: bool = False) -> str:
    """The size (apparent: st_size summed), '≥' before a walk cut short, 'n/a' when unreadable, '-' when the
    cache is not there."""
    if not c.exists:
        return "-"
    size = c.apparent_bytes if apparent else c.size_bytes
    if size is None:
        return "n/a"
    return ("≥" if not c.complete else "") + human_bytes(size)


def files_text(c: CacheInfo) -> str:
    """The file count, as size_text marks it."""
    if not c.exists:
        return "-"
    if c.files is None:
        return "n/a"
    return ("≥" if not c.complete else "") + f"{c.files:,}"


def growth_text(grew: int | None) -> str:
    """'+12 MiB', '-3 KiB', '0', or '' when not known."""
    if grew is None:
        return ""
    if grew == 0:
        return "0"
    return ("+" if grew > 0 else "-") + human_bytes(abs(grew))


def cache_row(c: CacheInfo, grew: int | None, warnings: int, now: float, apparent: bool = False) -> tuple[str, ...]:
    """Name, size, files, newest, growth, warnings: one row of the pane and of `dltop caches`."""
    return (c.label if c.label != "added" else display_path(c.path), size_text(c, apparent), files_text(c),
            age(c.newest_mtime, now) if c.exists else "not there", growth_text(grew), f"!{warnings}" if warnings else "")


def short_age(t: float | None, now: float) -> str:
    """'3h05m' since a file time, '-' when there is none (the pane's narrow columns)."""
    return "-" if t is None else human_duration(max(0.0, now - t))


def entry_row(e: CacheEntry, now: float, apparent: bool = False) -> tuple[str, ...]:
    """Name (a hub repo's id, a revision's short hash; a folder ends in /), size, files, modified, accessed, kind:
    one row of a cache's entries."""
    kind = e.kind + (f" · {e.detail}" if e.detail else "")
    name = e.label or (e.name[:12] if e.kind == "revision" else e.name)
    name = display_path(name) + ("/" if e.is_dir and not e.label and e.kind != "revision" else "")
    return (name, human_bytes(e.apparent_bytes if apparent else e.size_bytes), f"{e.files:,}",
            short_age(e.newest_mtime, now), short_age(e.newest_atime, now), kind)


def format_caches(part: CachesPart, warnings: Mapping[str, Sequence[str]], now: float) -> str:
    """The whole `dltop caches` report: one row per cache, then its path, the rule that placed it, warnings."""
    lines = [f"caches of {part.environment}" + (f" ({part.exited}: its last environment)" if part.exited else ""),
             ""]
    head = ("CACHE", "SIZE", "FILES", "NEWEST")
    rows = [cache_row(c, None, 0, now)[:4] for c in part.caches]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    lines.append("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip())
    for c, row in zip(part.caches, rows, strict=True):
        lines.append("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
        lines += _cache_facts(c, warnings.get(c.name, ()))
    return "\n".join(lines) + "\n"


def _cache_facts(c: CacheInfo, warnings: Sequence[str]) -> list[str]:
    """The lines under a cache's row: its path and the rule that placed it, the link followed, its settings,
    why its size is unknown, its warnings, its tool's own clear command."""
    lines = [f"    {display_path(c.path)}  ({c.source})"]
    if c.via_symlink:
        lines.append(f"    a symlink to {display_path(c.via_symlink)}: followed")
    lines += (f"    {k}={v}" for k, v in c.settings.items())
    if c.exists and c.size_bytes is None:
        lines.append(f"    unavailable: {c.unavailable.get('size_bytes', '')}")
    lines += (f"    ! {w}" for w in warnings)
    if c.clear_command:
        lines.append(f"    its own clear command: {c.clear_command}")
    return lines
