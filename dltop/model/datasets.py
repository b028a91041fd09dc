"""The dataset-residency part of a Snapshot: per dataset and per folder, how much sits in the page cache.

Pages are counted as fincore counts them: ceil(size / page size) per file. The headline is the data: the
`data_*` counts leave out the holes of sparse files (never read, so never "missing" from the cache), while
`pages` and `resident_pages` are fincore's own numbers, holes included. Pages whose state the kernel hides
from this user (files it may not write) are unknown, never resident. Paths of non-UTF-8 names are kept with
surrogate escapes (`os.fsdecode`), so `os.fsencode(path)` gives the bytes back. A folder may list its files
too (`top_files`, each a node of one file): its biggest, most resident and coldest, never all of a huge folder.
"""

from __future__ import annotations

from collections.abc import Iterable
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
    # The same counts over the pages that hold data: holes of sparse files left out. Resident zero pages of a
    # hole (a read of a hole caches them) are in resident_pages, as fincore counts them, but not in
    # data_resident_pages. -1: not given (a recording from before holes were counted, a hand-built node),
    # which makes them the whole pages: a file without holes.
    data_pages: int = -1
    data_resident_pages: int = -1
    data_unknown_pages: int = -1  # data pages of files whose residency the kernel hides
    # Files directly in this folder (or in folders below the depth kept), each a node with files=1: the top
    # few by each sort key a scan was asked for (see `sources.datasets.TopFiles`), not all of them; the rest
    # are `files - sum(children's files) - len(top_files)`. Empty where the scan kept no files.
    top_files: tuple[ResidencyNode, ...] = ()

    def __post_init__(self) -> None:
        for name, whole in (("data_pages", self.pages), ("data_resident_pages", self.resident_pages),
                            ("data_unknown_pages", self.unknown_pages)):
            if getattr(self, name) < 0:
                object.__setattr__(self, name, whole)

    @property
    def known_data_pages(self) -> int:
        """Pages of data whose residency the kernel showed us."""
        return self.data_pages - self.data_unknown_pages

    @property
    def direct_files(self) -> int:
        """Files counted here and not in a child folder: those `top_files` is the top of."""
        return self.files - sum(c.files for c in self.children)

    @property
    def resident_fraction(self) -> float | None:
        """Resident share of the data we can see (holes left out), or None when there is none to see."""
        known = self.known_data_pages
        return self.data_resident_pages / known if known > 0 else None


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
    # Another dataset of the same scan whose walk reached this one's files (it lies inside it, or is it, given
    # again): totals count those files there only. The dataset keeps its own numbers and its own row.
    counted_in: str | None = None
    same_tree: bool = False  # counted_in is this very folder or file, given again (an alias, a trailing slash)
    # The folders' `top_files`: each folder's top `files_top` files by each key of `files_sorted_by` ("size",
    # "resident", "pct"); 0 and () where the scan kept no files.
    files_top: int = 0
    files_sorted_by: tuple[str, ...] = ()
    # A watched dataset (the TUI, the recorder) re-measures only the files opened since its last read, plus a
    # slice of the tree in turn (docs/datasets.md, "Watching a dataset"). Counts carried over a time when the
    # kernel reclaimed page cache are an estimate: `estimated`, and at most `estimate_error_pages` of
    # resident_pages may have been evicted since they were measured. `full_scan_at`: when the oldest count
    # still used was measured (every file was measured at or after it); 0 for a one-off scan.
    # `estimate_reason`: what on this machine evicts page cache that /proc/vmstat's pgsteal_file does not count
    # (DAMON's pageout, seen or configured); while it runs, every count not measured in this read is an estimate.
    estimated: bool = False
    estimate_error_pages: int = 0
    full_scan_at: float = 0.0
    estimate_reason: str | None = None


@dataclass(frozen=True)
class DatasetUnavailable:
    """A watched dataset that could not be scanned at all (missing, deleted while watched, unreadable): the
    reason instead of numbers, so it never reads as an empty dataset. JSON `{"path", "unavailable", "scanned_at"}`."""

    path: str
    unavailable: str  # "no such file or directory: /data/imagenet"
    scanned_at: float = 0.0  # wall-clock time the scan found it so


@dataclass(frozen=True)
class FoundReader:
    """A process found reading a dataset (docs/datasets.md, "Datasets found without a flag"): who runs it in the
    kernel's word (the uid of /proc/PID), the job it belongs to, and how the folder was found."""

    pid: int
    uid: int
    user: str | None = None  # the uid's name (None: no passwd entry)
    job: str = ""  # the job as the Training tab names it: its id, else its command
    cmd: str = ""  # the process's command line, as the process wrote it (escaped where shown)
    files_open: int = 0  # regular files it (and its DataLoader workers) had open for reading below the folder
    named: bool = False  # the job names this folder: its probe's data_dir, a DataLoader dataset's root


@dataclass(frozen=True)
class FoundDataset:
    """A folder that training jobs read, found without being given: its readers and its scan (a time-budgeted one:
    `complete` False where the budget cut it short). `scan` None: not scanned yet."""

    path: str
    readers: tuple[FoundReader, ...] = ()
    found_at: float = 0.0  # wall-clock time a job was first seen reading it
    # DatasetUnavailable first, as in DatasetsPart.paths
    scan: DatasetUnavailable | DatasetResidency | None = None


@dataclass(frozen=True)
class DatasetsPart:
    """Every watched dataset, in the order given; JSON `{"paths": [...], ...}` as `dltop residency --json` prints it.
    `found`: the folders training jobs read that are not watched (discovery; empty with --no-discover)."""

    # DatasetUnavailable first: the decoder tries the union in order, and DatasetResidency (all fields but the
    # path have defaults) would take an unavailable one's JSON as an empty dataset.
    paths: tuple[DatasetUnavailable | DatasetResidency, ...] = ()
    page_size: int = 4096
    found: tuple[FoundDataset, ...] = ()
    discovery: str | None = None  # why discovery found nothing it could (off, not root: own jobs only); None: on

    @property
    def scanned(self) -> tuple[DatasetResidency, ...]:
        """The datasets that could be scanned: the ones with numbers."""
        return tuple(d for d in self.paths if isinstance(d, DatasetResidency))

    @property
    def found_scans(self) -> tuple[DatasetUnavailable | DatasetResidency, ...]:
        """The found datasets' scans (those scanned at least once), in the order found."""
        return tuple(f.scan for f in self.found if f.scan is not None)

    def holder(self, path: str) -> str | None:
        """The watched or found dataset that `path` is, or lies in: the one to measure again after an action on it."""
        for p in (*(d.path for d in self.paths), *(f.path for f in self.found)):
            if path == p or path.startswith(p.rstrip("/") + "/"):
                return p
        return None

    def with_found_listed(self) -> DatasetsPart:
        """This part with the found datasets' scans listed beside the watched ones (`dltop export --export-found`)."""
        return DatasetsPart(paths=(*self.paths, *self.found_scans), page_size=self.page_size, found=self.found,
                            discovery=self.discovery)


def counted_once(datasets: Iterable[DatasetResidency]) -> list[DatasetResidency]:
    """The datasets a total adds up: those not counted in another one of the list (nested or given twice)."""
    listed = list(datasets)
    return [ds for ds, inside in zip(listed, _inside_another(listed), strict=True) if not inside]


def counted_elsewhere(datasets: Iterable[DatasetResidency]) -> list[DatasetResidency]:
    """The datasets a total leaves out: their files are counted in another one of the list."""
    listed = list(datasets)
    return [ds for ds, inside in zip(listed, _inside_another(listed), strict=True) if inside]


def _inside_another(listed: list[DatasetResidency]) -> list[bool]:
    # Another entry, not this one: a list that holds one dataset under its own name once counts it.
    return [ds.counted_in is not None and any(o.path == ds.counted_in for j, o in enumerate(listed) if j != i)
            for i, ds in enumerate(listed)]


def total_of(datasets: Iterable[DatasetResidency], path: str = "total") -> ResidencyNode:
    """One node adding up the datasets, each file once: a dataset nested in (or the same as) another is left out."""
    ds = counted_once(datasets)
    return ResidencyNode(path=path, **{f: sum(getattr(d, f) for d in ds) for f in _SUMMED})


_SUMMED = tuple(f for f in ResidencyNode.__dataclass_fields__ if f not in ("path", "children", "top_files"))
