"""Hints about datasets in the page cache: cold at the first epoch, larger than memory, churning.

Pure functions of recent Snapshots, registered with `dltop.hints.rule`. Sizes are the data of a dataset, in
whole pages, holes of sparse files left out: what a read brings into memory.
"""

from __future__ import annotations

from collections.abc import Sequence

from dltop.fmt import human_bytes, percent_text
from dltop.hints.base import Hint, rule, wanted
from dltop.model import MemoryPart, Snapshot
from dltop.model.datasets import DatasetResidency, DatasetsPart, FoundReader
from dltop.model.memory import page_cache_room_bytes

COLD_FRACTION = 0.5  # a dataset under this share resident is read mostly from disk
COLD_MIN_BYTES = 256 << 20  # less than this left to read costs the first epoch under a second: no hint
CHURN_FRACTION = 0.01  # recently evicted pages growing by this share of the dataset between scans


def _latest(history: Sequence[Snapshot]) -> tuple[DatasetsPart | None, MemoryPart | None]:
    """The newest Snapshot's datasets (none watched now: no dataset hint, whatever older ones held) and the
    newest memory reading."""
    last = history[-1].datasets
    part = last if isinstance(last, DatasetsPart) else None
    mem = next((s.memory for s in reversed(history) if isinstance(s.memory, MemoryPart)), None)
    return part, mem


def _usable(ds: DatasetResidency) -> bool:
    return ds.known_data_pages > 0


def _reader_subject(r: FoundReader) -> str:
    """The subject of a hint about a found dataset: the job that reads it, as the Training tab's hints name a job
    (its user and job id), else its process."""
    return f"job uid {r.uid} job {r.job}" if r.job else f"job pid {r.pid}"


def _reader_text(r: FoundReader) -> str:
    who = r.user or f"uid {r.uid}"
    return (f"job {r.job} (pid {r.pid}) of {who}" if r.job else f"pid {r.pid} of {who}")


def _cold_candidates(part: DatasetsPart) -> list[tuple[DatasetResidency, str, FoundReader | None]]:
    """The datasets a cold hint may name, each with its subject: the watched ones ("dataset PATH"), and the found
    ones that a job reads now, named by the job that holds most of its files open ("job ...")."""
    out: list[tuple[DatasetResidency, str, FoundReader | None]] = [(ds, f"dataset {ds.path}", None)
                                                                  for ds in part.scanned]
    for f in part.found:
        if isinstance(f.scan, DatasetResidency) and f.readers:
            r = max(f.readers, key=lambda r: (r.files_open, -r.pid))
            out.append((f.scan, _reader_subject(r), r))
    return out


def _coldest(part: DatasetsPart) -> tuple[DatasetResidency, str, FoundReader | None] | None:
    """The coldest of the candidates under COLD_FRACTION whose hint is wanted; None where none is."""
    cold = [(ds, subject, r) for ds, subject, r in _cold_candidates(part)
            if _usable(ds) and ds.resident_fraction is not None and ds.resident_fraction < COLD_FRACTION
            and wanted("dataset-cold", subject)]
    return min(cold, key=lambda c: c[0].resident_fraction or 0, default=None)


def cold_dataset(part: DatasetsPart, mem: MemoryPart | None) -> Hint | None:
    """A dataset mostly not in the page cache that would fit: the first epoch reads it from disk. A found dataset
    (one a job reads, not watched) names that job as its subject and in its text."""
    found = _coldest(part)
    if found is None:
        return None
    coldest, subject, reader = found
    ps = coldest.page_size
    need = (coldest.known_data_pages - coldest.data_resident_pages) * ps
    if need < COLD_MIN_BYTES:
        return None
    room = page_cache_room_bytes(mem) if mem is not None else None
    if room is not None and coldest.known_data_pages * ps > room:
        return None  # dataset_larger_than_memory speaks instead
    fraction = coldest.resident_fraction or 0.0
    numbers = {"resident_fraction": fraction, "to_read_bytes": need}
    if reader is not None:
        numbers["pid"] = reader.pid  # the hint line puts the viewer's job first
    read_by = f", read by {_reader_text(reader)}," if reader is not None else ""
    return Hint(
        id="dataset-cold",
        subject=subject,
        severity="warn",
        text=(
            f"dataset {coldest.path}{read_by} is {percent_text(100 * fraction)} resident "
            f"({human_bytes(coldest.data_resident_pages * ps)} of {human_bytes(coldest.known_data_pages * ps)}): "
            f"{'it reads' if reader is not None else 'the first epoch reads'} the rest from disk and runs slow"
        ),
        fix=f"warm it: w on the Datasets tab, or dltop warm PATH ({human_bytes(need)} to read; it fits)",
        numbers=numbers,
    )


def dataset_larger_than_memory(part: DatasetsPart, mem: MemoryPart | None) -> Hint | None:
    """A dataset that cannot all stay cached: warming all of it evicts its own first part."""
    cacheable = page_cache_room_bytes(mem) if mem is not None else None
    if cacheable is None:
        return None
    for ds in part.scanned:
        if not _usable(ds) or not wanted("dataset-larger-than-memory", f"dataset {ds.path}"):
            continue
        ps = ds.page_size
        size = ds.known_data_pages * ps  # its resident part is in MemAvailable already: not added again
        if size > cacheable:
            return Hint(
                id="dataset-larger-than-memory",
                subject=f"dataset {ds.path}",
                severity="warn",
                text=(
                    f"dataset {ds.path} ({human_bytes(size)}) is larger than the memory the page cache can give it "
                    f"({human_bytes(max(0, cacheable))}): warming all of it evicts its own first part"
                ),
                fix="warm the validation set or a subset that is read every epoch; or use more RAM / a local NVMe",
                numbers={"size_bytes": size, "cacheable_bytes": max(0, cacheable)},
            )
    return None


def dataset_churn(history: Sequence[Snapshot]) -> Hint | None:
    """Recently evicted pages of a dataset rising between scans: its working set does not fit."""
    first: dict[str, DatasetResidency] = {}
    last: dict[str, DatasetResidency] = {}
    for s in history:
        if isinstance(s.datasets, DatasetsPart):
            for ds in s.datasets.scanned:
                if _usable(ds):
                    first.setdefault(ds.path, ds)
                    last[ds.path] = ds
    for path, ds in last.items():
        hint = _churn(path, first[path], ds)
        if hint is not None:
            return hint
    return None


def _churn(path: str, old: DatasetResidency, ds: DatasetResidency) -> Hint | None:
    """The churn hint of one dataset between its first and last scan in the history, if it churned."""
    proactive = ds.estimate_reason is not None
    if ds.scanned_at <= old.scanned_at or not wanted(
            "dataset-proactive-reclaim" if proactive else "dataset-churn", f"dataset {path}"):
        return None
    grew = ds.recently_evicted_pages - old.recently_evicted_pages
    if grew <= 0 or grew < CHURN_FRACTION * ds.data_pages:
        return None
    rate = grew * ds.page_size / (ds.scanned_at - old.scanned_at)
    if proactive:
        # Evicted by reclaim that pgsteal_file does not count (DAMON's pageout puts out what was idle a
        # while, with memory to spare): not a working set too big, and a warm will not last.
        return Hint(
            id="dataset-proactive-reclaim",
            subject=f"dataset {path}",
            severity="warn",
            text=(
                f"{human_bytes(grew * ds.page_size)} of {path} was evicted within "
                f"{ds.scanned_at - old.scanned_at:.0f}s by reclaim that does not wait for memory to run out "
                f"({ds.estimate_reason}): what sits idle leaves the page cache, and a warm does not last"
            ),
            fix="lock what must stay (l on the Datasets tab, or dltop lock PATH: locked pages are not put "
                "out), or warm it just before the job reads it",
            numbers={"evicted_bytes": grew * ds.page_size, "rate_bytes_per_s": rate},
        )
    return Hint(
        id="dataset-churn",
        subject=f"dataset {path}",
        severity="warn",
        text=(
            f"the page cache churns on {path}: {human_bytes(grew * ds.page_size)} of it was evicted and read "
            f"again within {ds.scanned_at - old.scanned_at:.0f}s ({human_bytes(rate)}/s): the working set does "
            "not fit"
        ),
        fix="shrink what each epoch reads (a subset, smaller shards), free memory, or lock the hot part (l)",
        numbers={"evicted_again_bytes": grew * ds.page_size, "rate_bytes_per_s": rate},
    )


@rule
def dataset_cold_rule(history: Sequence[Snapshot]) -> Hint | None:
    """cold_dataset over the latest Snapshot."""
    part, mem = _latest(history)
    return None if part is None else cold_dataset(part, mem)


@rule
def dataset_larger_than_memory_rule(history: Sequence[Snapshot]) -> Hint | None:
    """dataset_larger_than_memory over the latest Snapshot."""
    part, mem = _latest(history)
    return None if part is None else dataset_larger_than_memory(part, mem)


rule(dataset_churn)
