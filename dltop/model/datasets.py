"""The dataset-residency part of a Snapshot: per dataset and per folder, how much sits in the page cache.

Pages are counted as fincore counts them: ceil(size / page size) per file. Pages whose state the kernel
hides from this user (files it may not write) are `unknown_pages`, never resident. Paths of non-UTF-8
names are kept with surrogate escapes (`os.fsdecode`), so `os.fsencode(path)` gives the bytes back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Why pages are unknown, with the fix; shown next to every number that has unknown pages.
NO_PERMISSION = (
    "no permission: the kernel hides page-cache residency of files this user cannot write "
    "(run as the files' owner or as root)"
)


@dataclass(frozen=True)
class ResidencyNode:
    """One folder (or a whole dataset): totals over the regular files below it, each hard link once."""

    path: str
    files: int = 0
    size_bytes: int = 0
    pages: int = 0
    resident_pages: int = 0
    dirty_pages: int = 0
    unknown_pages: int = 0
    writeback_pages: int = 0
    recently_evicted_pages: int = 0  # cachestat: evicted recently enough that a re-read is a refault
    children: tuple[ResidencyNode, ...] = ()

    @property
    def known_pages(self) -> int:
        """Pages whose residency the kernel showed us."""
        return self.pages - self.unknown_pages

    @property
    def resident_fraction(self) -> float | None:
        """Resident share of the pages we can see, or None when none are visible."""
        known = self.known_pages
        return self.resident_pages / known if known > 0 else None


@dataclass(frozen=True)
class DatasetResidency(ResidencyNode):
    """A dataset root: its node totals plus how, when and how completely it was scanned."""

    page_size: int = 4096
    scanned_at: float = 0.0  # wall-clock time the scan finished; a number's age is now - scanned_at
    scan_duration_s: float = 0.0
    complete: bool = True  # False: cut short by a time budget or a cancel; totals cover what was reached
    method: str = "cachestat"  # "cachestat", "mincore" (older kernel, overlayfs) or "mixed"
    fs_type: str = ""
    dirs: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  # why entries were not counted: special, symlink, ...
    problems: tuple[str, ...] = ()  # the first few problems, one line each ("permission denied: /x/y")
    unknown_reason: str | None = None


@dataclass(frozen=True)
class DatasetUnavailable:
    """A watched dataset that could not be scanned at all (missing, deleted while watched, unreadable): the
    reason instead of numbers, so it never reads as an empty dataset. JSON `{"path", "unavailable", "scanned_at"}`."""

    path: str
    unavailable: str  # "no such file or directory: /data/imagenet"
    scanned_at: float = 0.0  # wall-clock time the scan found it so


@dataclass(frozen=True)
class DatasetsPart:
    """Every watched dataset, in the order given; JSON `{"paths": [...], ...}` as `dltop residency --json` prints it."""

    # DatasetUnavailable first: the decoder tries the union in order, and DatasetResidency (all fields but the
    # path have defaults) would take an unavailable one's JSON as an empty dataset.
    paths: tuple[DatasetUnavailable | DatasetResidency, ...] = ()
    page_size: int = 4096

    @property
    def scanned(self) -> tuple[DatasetResidency, ...]:
        """The datasets that could be scanned: the ones with numbers."""
        return tuple(d for d in self.paths if isinstance(d, DatasetResidency))
