"""Dataset residency and action progress as plain text: `dltop residency`'s table, the pane's rows, the
progress line. Shown by the CLI and the TUI alike, so it lives below both."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

from dltop.fmt import human_age, human_bytes, human_duration, human_rate, percent_text, plural, printable
from dltop.model.base import display_path
from dltop.model.datasets import (
    DatasetResidency,
    DatasetsPart,
    DatasetUnavailable,
    FoundDataset,
    FoundReader,
    ResidencyNode,
    counted_elsewhere,
    total_of,
)

# One unit on every screen: whole pages of data, as fincore counts pages (a 17-byte file is one 4 KiB page), holes
# of sparse files left out. Every column then adds up over the rows below it and compares with the others.


def pct_text(node: ResidencyNode, estimated: bool = False) -> str:
    """Resident share of the visible data ('-' when there is none; '?' marks hidden pages, '~' an estimate: the
    node's own, or its dataset's where `estimated` says so, a folder of a watched dataset whose counts are)."""
    frac = node.resident_fraction
    if frac is None:
        return "?" if node.data_unknown_pages else "-"
    est = "~" if estimated or getattr(node, "estimated", False) else ""
    return est + percent_text(100 * frac) + ("?" if node.data_unknown_pages else "")


# The sort keys of a folder's rows (folders and files alike), each with how its order reads: first shown first.
SORT_TITLES = {"size": "data", "resident": "resident", "pct": "% (coldest first)"}


def sort_rank(key: str) -> Callable[[ResidencyNode], tuple[Any, ...]]:
    """A sort key for nodes, first shown first: most data, most resident, or coldest (the lowest resident share,
    the most data among equals, nothing visible last); ties by path, so rows never swap between scans."""
    if key == "resident":
        return lambda n: (-n.data_resident_pages, n.path)
    if key == "pct":
        def coldest(n: ResidencyNode) -> tuple[Any, ...]:
            frac = n.resident_fraction
            return (2.0 if frac is None else frac, -n.data_pages, n.path)

        return coldest
    return lambda n: (-n.data_pages, n.path)


_REST_FIELDS = ("size_bytes", "pages", "resident_pages", "dirty_pages", "unknown_pages", "writeback_pages",
                "recently_evicted_pages", "data_pages", "data_resident_pages", "data_unknown_pages")


def listed_files(node: ResidencyNode, key: str, n: int) -> tuple[list[ResidencyNode], ResidencyNode | None]:
    """A folder's files to show: its top `n` by `key` among those the scan kept, and the files not shown as one
    node (their count and totals: the folder's less its folders' and the files shown), None when none are left."""
    shown = sorted(node.top_files, key=sort_rank(key))[:max(0, n)]
    more = node.direct_files - len(shown)
    if more <= 0:
        return shown, None
    parts = (*node.children, *shown)
    rest = {f: max(0, getattr(node, f) - sum(getattr(c, f) for c in parts)) for f in _REST_FIELDS}
    return shown, ResidencyNode(path="", files=more, **rest)


def file_label(folder: str, path: str) -> str:
    """A file's name as its folder's row lists it: the path below the folder (`sub/x.bin` where the folders
    below the depth kept are folded in), printable."""
    prefix = folder.rstrip("/") + "/"
    return printable(path[len(prefix):] if path.startswith(prefix) else path)


def more_label(rest: ResidencyNode) -> str:
    """`… 999,960 more files`: the row that stands for a folder's files not listed."""
    return f"… {rest.files:,} more " + ("file" if rest.files == 1 else "files")


def estimate_note(ds: DatasetResidency, page_size: int, now: float) -> str | None:
    """Why a watched dataset's numbers are an estimate, and by how much they may be off."""
    if not ds.estimated:
        return None
    why = f"; {printable(ds.estimate_reason)}" if ds.estimate_reason else ""
    return (f"~ estimate: up to {human_bytes(ds.estimate_error_pages * page_size)} may have been evicted since "
            f"last measured (oldest count {human_age(max(0.0, now - ds.full_scan_at))} old{why})")


def row_values(node: ResidencyNode, page_size: int, label: str, age_s: float | None,
               estimated: bool = False, partial: bool = False) -> tuple[str, ...]:
    """The table cells of one dataset or folder: label, data, resident, %, dirty, files, age. `estimated`: the
    counts are its dataset's estimate (`~` on the %); `partial`: a scan cut short by its budget counted them, so
    data and files are at least what is shown (`≥`). A dataset row says both of itself."""
    partial = partial or not getattr(node, "complete", True)
    at_least = "≥" if partial else ""
    return (
        label,
        at_least + human_bytes(node.data_pages * page_size),
        human_bytes(node.data_resident_pages * page_size),
        pct_text(node, estimated),
        human_bytes(node.dirty_pages * page_size) if node.dirty_pages else "-",
        at_least + str(node.files),
        human_age(age_s) if age_s is not None else "",
    )


def _script(cmd: str) -> str:
    """What names a process in a line: its script (`train.py`), else its program's name."""
    words = cmd.split()
    script = next((w for w in words[1:4] if w.endswith(".py")), None)
    return printable(os.path.basename(script or (words[0] if words else "?")))


def reader_text(r: FoundReader) -> str:
    """`train.py (pid 4242) of alice`, `job 1f2e (pid 4242) of uid 1001`."""
    who = printable(r.user) if r.user else f"uid {r.uid}"
    name = f"job {printable(r.job)}" if r.job else _script(r.cmd)
    return f"{name} (pid {r.pid}) of {who}"


def found_line(found: FoundDataset) -> str:
    """`found: read by train.py (pid 4242) of alice, 6 files open · a watches it`: who reads a found dataset."""
    rs = found.readers
    files = sum(r.files_open for r in rs)
    how = [plural(files, "file") + " open"] if files else []
    if any(r.named for r in rs):
        how.append("named by its probe")
    scan = found.scan
    if isinstance(scan, DatasetResidency) and not scan.complete:
        how.append("scan cut at its budget: ≥ the counts shown")
    return f"found: read by {_readers_text(rs)}" + "".join(f", {h}" for h in how) + " · a watches it"


def _readers_text(rs: tuple[FoundReader, ...]) -> str:
    """The first two readers, and how many more; 'a job that has ended' where none reads it now."""
    if not rs:
        return "a job that has ended"
    return ", ".join(reader_text(r) for r in rs[:2]) + (f" and {len(rs) - 2} more" if len(rs) > 2 else "")


def unavailable_row_values(label: str, age_s: float | None) -> tuple[str, ...]:
    """The table cells of a dataset that could not be scanned: n/a, never zeros (the reason goes to the notes)."""
    return (label, "n/a", "n/a", "n/a", "n/a", "n/a", human_age(age_s) if age_s is not None else "")


def node_summary(node: ResidencyNode, page_size: int) -> str:
    """`29.0 MiB of 5.2 GiB resident (1%), 20008 files`: one folder's line, in the unit of its rows."""
    return (f"{human_bytes(node.data_resident_pages * page_size)} of {human_bytes(node.data_pages * page_size)} "
            f"resident ({pct_text(node)}), {plural(node.files, 'file')}")


def datasets_summary(datasets: list[DatasetResidency]) -> str:
    """`29.0 MiB of 5.2 GiB resident`: the total of the datasets' rows, each file once, with what overlaps."""
    ps = datasets[0].page_size if datasets else 4096
    total = total_of(datasets)
    text = f"{human_bytes(total.data_resident_pages * ps)} of {human_bytes(total.data_pages * ps)} resident"
    if total.data_unknown_pages:
        text += f", {human_bytes(total.data_unknown_pages * ps)} unknown"
    notes = overlap_notes(datasets)
    if len(notes) == 1:
        text += " · " + notes[0]
    elif notes:
        text += f" · {len(notes)} datasets lie in others: each counted once"
    return text


def overlap_notes(datasets: list[DatasetResidency]) -> list[str]:
    """`/data/x/val is inside /data/x: counted once`, for each dataset a total leaves out."""
    out = []
    for ds in counted_elsewhere(datasets):
        p, q = display_path(ds.path), display_path(ds.counted_in or "")
        if not ds.same_tree:
            out.append(f"{p} is inside {q}: counted once")
        elif p == q:
            out.append(f"{p} given twice: counted once")
        else:
            out.append(f"{p} is {q} (the same folder or file): counted once")
    return out


def holes_note(ds: ResidencyNode, page_size: int) -> str | None:
    """What the data leaves out of a tree with sparse files: its holes, and zero pages of them in the cache."""
    holes = ds.pages - ds.data_pages
    if holes <= 0:
        return None
    text = f"holes of sparse files: {human_bytes(holes * page_size)}, not data (never read), not counted"
    cached = ds.resident_pages - ds.data_resident_pages
    if cached > 0:
        text += f"; {human_bytes(cached * page_size)} of zero pages read from holes sit in the cache (fincore counts them)"
    return text


# Reasons an entry was skipped that are nouns ("2 symlinks"); the others are adjectives ("2 unreadable").
_SKIP_NOUNS = {"hardlink": "hard link", "symlink": "symlink", "symlink_loop": "symlink loop",
               "other_filesystem": "other filesystem", "error": "error"}


def skipped_text(skipped: dict[str, int]) -> str:
    """{'symlink': 1, 'unreadable': 2} -> '1 symlink, 2 unreadable'."""
    return ", ".join(plural(n, _SKIP_NOUNS[k]) if k in _SKIP_NOUNS else f"{n} {k.replace('_', ' ')}"
                     for k, n in skipped.items())


def format_residency(part: DatasetsPart, files_key: str | None = None, files_n: int = 0) -> str:
    """The human table of `dltop residency`: one row per dataset and folder, indented by depth; a total row.
    With `files_key`, each folder's top `files_n` files by it under the folder's row, and a row for the rest."""
    ps = part.page_size
    rows = [("RESIDENT", "%", "DIRTY", "UNKNOWN", "DATA", "FILES", "PATH")]
    notes: list[str] = []

    def add(node: ResidencyNode, depth: int, label: str, folder: bool = True) -> None:
        frac = node.resident_fraction
        rows.append((
            human_bytes(node.data_resident_pages * ps), percent_text(100 * frac, 1).rstrip("%") if frac is not None else "-",
            human_bytes(node.dirty_pages * ps),
            human_bytes(node.data_unknown_pages * ps) if node.data_unknown_pages else "-",
            human_bytes(node.data_pages * ps), str(node.files), "  " * depth + label,
        ))
        if not folder:
            return
        if files_key is not None:
            shown, rest = listed_files(node, files_key, files_n)
            for f in shown:
                add(f, depth + 1, printable(f.path), folder=False)
            if rest is not None:
                add(rest, depth + 1, more_label(rest), folder=False)
        for child in node.children:
            add(child, depth + 1, display_path(child.path))

    for ds in part.paths:
        if isinstance(ds, DatasetUnavailable):  # no row of zeros: it has no numbers
            notes.append(f"unavailable: {ds.unavailable}")
            continue
        add(ds, 0, display_path(ds.path))
        notes += _scan_notes(ds, ps)
    if len(part.scanned) > 1:
        add(total_of(part.scanned), 0, "total")
    notes.extend(overlap_notes(list(part.scanned)))
    notes.append("sizes are data in whole pages, as fincore counts pages; holes of sparse files left out")
    widths = [max(len(r[i]) for r in rows) for i in range(6)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r[:6], widths, strict=True)) + "  " + r[6] for r in rows]
    return "\n".join(lines + notes) + "\n"


def _scan_notes(ds: DatasetResidency, ps: int) -> list[str]:
    """How a dataset was scanned (what was skipped, the method, the file system, how long, whether whole), its
    holes, problems and why some of it is unknown."""
    extra = []
    if ds.skipped:
        extra.append("skipped " + skipped_text(ds.skipped))
    extra.append(f"{ds.method}, {ds.fs_type or '?'}, scanned in {ds.scan_duration_s:.2f}s")
    if not ds.complete:
        extra.append("incomplete scan")
    notes = [f"{display_path(ds.path)}: " + "; ".join(extra)]
    holes = holes_note(ds, ps)
    if holes:
        notes.append(f"  {holes}")
    notes.extend(f"  {p}" for p in ds.problems[:5])
    if ds.unknown_reason:
        notes.append(f"  unknown: {ds.unknown_reason}")
    return notes


def progress_line(p: Any, width: int = 20, marks: str = "█░", pct_digits: int = 0) -> str:
    """`warm [███░░] 40% 1.2 GiB/3.0 GiB 800 MiB/s ETA 2s` from an action's Progress."""
    if not getattr(p, "sized", True) or p.total_bytes is None:
        # The total is known only at the end (an evict: one walk measures and acts): what is done so far.
        return (f"{p.action} {human_bytes(p.done_bytes)} in {plural(p.files_done or 0, 'file')} "
                f"{human_rate(p.rate_bytes_per_s, missing='-')}")
    # No total (a measure cut short by Ctrl-C: nothing was sized) is no full bar: an empty one, no percent.
    frac = p.done_bytes / p.total_bytes if p.total_bytes else 0.0
    fill = int(width * min(1.0, frac))
    # Rounded up: "0s" only when nothing is left, "?" until there is a rate to go by.
    eta = human_duration(math.ceil(p.eta_s)) if p.eta_s is not None else "?"
    pct = percent_text(100 * frac, pct_digits) if p.total_bytes else "-"
    pct = f"{pct:>{6 if pct_digits else 0}}"
    return (f"{p.action} [{marks[0] * fill}{marks[1] * (width - fill)}] {pct} "
            f"{human_bytes(p.done_bytes)}/{human_bytes(p.total_bytes)} "
            f"{human_rate(p.rate_bytes_per_s, missing='-')} ETA {eta}")
