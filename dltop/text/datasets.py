"""Dataset residency and action progress as plain text: `dltop residency`'s table, the pane's rows, the
progress line. Shown by the CLI and the TUI alike, so it lives below both."""

from __future__ import annotations

from typing import Any

from dltop.fmt import display_path, human_bytes, human_duration, human_rate
from dltop.model.datasets import DatasetsPart, DatasetUnavailable, ResidencyNode


def pct_text(node: ResidencyNode) -> str:
    """Resident share of the visible pages ('-' when none are visible; '?' marks hidden pages)."""
    frac = node.resident_fraction
    if frac is None:
        return "?" if node.unknown_pages else "-"
    return f"{100 * frac:.0f}%" + ("?" if node.unknown_pages else "")


def row_values(node: ResidencyNode, page_size: int, label: str, age_s: float | None) -> tuple[str, ...]:
    """The table cells of one dataset or folder."""
    return (
        label,
        human_bytes(node.size_bytes),
        human_bytes(node.resident_pages * page_size),
        pct_text(node),
        human_bytes(node.dirty_pages * page_size) if node.dirty_pages else "-",
        str(node.files),
        human_duration(age_s) if age_s is not None else "",
    )


def unavailable_row_values(label: str, age_s: float | None) -> tuple[str, ...]:
    """The table cells of a dataset that could not be scanned: n/a, never zeros (the reason goes to the notes)."""
    return (label, "n/a", "n/a", "n/a", "n/a", "n/a", human_duration(age_s) if age_s is not None else "")


def format_residency(part: DatasetsPart) -> str:
    """The human table of `dltop residency`: one row per dataset and folder, indented by depth."""
    ps = part.page_size
    rows = [("RESIDENT", "%", "DIRTY", "UNKNOWN", "SIZE", "FILES", "PATH")]
    notes: list[str] = []

    def add(node: ResidencyNode, depth: int) -> None:
        known = node.pages - node.unknown_pages
        pct = f"{100 * node.resident_pages / known:.1f}" if known else "-"
        rows.append((
            human_bytes(node.resident_pages * ps), pct, human_bytes(node.dirty_pages * ps),
            human_bytes(node.unknown_pages * ps) if node.unknown_pages else "-",
            human_bytes(node.size_bytes), str(node.files), "  " * depth + display_path(node.path),
        ))
        for child in node.children:
            add(child, depth + 1)

    for ds in part.paths:
        if isinstance(ds, DatasetUnavailable):  # no row of zeros: it has no numbers
            notes.append(f"unavailable: {ds.unavailable}")
            continue
        add(ds, 0)
        extra = []
        if ds.skipped:
            extra.append("skipped " + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in ds.skipped.items()))
        extra.append(f"{ds.method}, {ds.fs_type or '?'}, scanned in {ds.scan_duration_s:.2f}s")
        if not ds.complete:
            extra.append("incomplete scan")
        notes.append(f"{display_path(ds.path)}: " + "; ".join(extra))
        notes.extend(f"  {p}" for p in ds.problems[:5])
        if ds.unknown_reason:
            notes.append(f"  unknown: {ds.unknown_reason}")
    widths = [max(len(r[i]) for r in rows) for i in range(6)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r[:6], widths, strict=True)) + "  " + r[6] for r in rows]
    return "\n".join(lines + notes) + "\n"


def progress_line(p: Any, width: int = 20, marks: str = "█░", pct_digits: int = 0) -> str:
    """`warm [███░░] 40% 1.2 GiB/3.0 GiB 800 MiB/s ETA 2s` from an action's Progress."""
    frac = p.done_bytes / p.total_bytes if p.total_bytes else 1.0
    fill = int(width * min(1.0, frac))
    eta = human_duration(p.eta_s) if p.eta_s is not None else "?"
    pct = f"{100 * frac:{5 if pct_digits else 0}.{pct_digits}f}%"
    return (f"{p.action} [{marks[0] * fill}{marks[1] * (width - fill)}] {pct} "
            f"{human_bytes(p.done_bytes)}/{human_bytes(p.total_bytes)} "
            f"{human_rate(p.rate_bytes_per_s, missing='-')} ETA {eta}")
