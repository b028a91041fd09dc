"""The Datasets source: the watched datasets' residency, read in the background by the residency engine
(dltop/residency/): a `DatasetWatch` per dataset folder, a plain scan for a file or where inotify is missing."""

from __future__ import annotations

import dataclasses
import errno
import os
import time
from typing import Any

from dltop.model.datasets import DatasetsPart, DatasetUnavailable
from dltop.residency.budget import path_error
from dltop.residency.rank import FILE_SORT_KEYS
from dltop.residency.scan import Scan, WarmNeed, compose, scan_one
from dltop.residency.walk import WalkOptions

# The TUI and the recorder keep folder totals this deep; deeper folders add to their ancestor.
SOURCE_MAX_DEPTH = 6
SOURCE_CPU_FRACTION = 0.5
# Each folder lists its top 50 files by size, by resident and by % (coldest first), a dataset 4,096 file rows at
# most: a recording of a big tree gains at most about 1.3 MB of JSON a rescan.
SOURCE_TOP_FILES = 50
SOURCE_TOP_BUDGET = 4096


class DatasetsReader:
    """The watched datasets' background scan. A full read rescans them all; `read_some(paths)` rescans only
    those (after a warm of one dataset, the others keep their last scan), and a reader that replaces another
    (a dataset added from the TUI) takes over its scans, so its first read scans only the new datasets.

    With `watch`, every read is a `DatasetWatch` cycle (dltop/residency/watch.py): the first measures the whole tree
    (the watch's own scan: a plain scan first would be measured again by it, a 100,000-file tree twice at
    start), the later ones only the files opened since the last read and a slice of the tree in turn, so the
    cost stops growing with the dataset; `read_some` measures all of each dataset asked for again."""

    def __init__(self, paths: tuple[str, ...], options: WalkOptions, cpu_fraction: float | None,
                 watch: bool = False, discovery: Any = None) -> None:
        self.paths, self.options, self.cpu_fraction = paths, options, cpu_fraction
        self.watch = watch and not options.follow_symlinks  # a followed symlink's folder is not this tree's own
        self._last: dict[str, Scan] = {}  # each dataset's last scan
        self._watches: dict[str, Any] = {}  # path -> DatasetWatch
        self._first = True
        self.discovery = discovery  # sources.found.Discovery: the datasets training jobs read; None: off

    def carry_from(self, old: Any) -> None:
        """Take over the scans of the reader behind `old` (the Source this one's replaces)."""
        prev = getattr(old.read, "__self__", None)
        if isinstance(prev, DatasetsReader) and prev.options == self.options:
            self._last = {p: s for p, s in prev._last.items() if p in self.paths}
            # The watches move over (the old source's close then drops only those of datasets no longer watched).
            self._watches = {p: prev._watches.pop(p) for p in list(prev._watches) if p in self.paths}
            if self.discovery is not None and prev.discovery is not None:
                self.discovery = prev.discovery  # what the jobs were seen reading, and the found datasets' scans

    def read(self) -> DatasetsPart:
        """Every dataset scanned now (the first read after a takeover: only those not scanned before)."""
        first, self._first = self._first, False
        if self.watch:  # the first read after a takeover reads only the new datasets: the others' scans stand
            return self._read(frozenset(), cycle=not first)
        return self.read_some(frozenset() if first else frozenset(self.paths))

    def read_some(self, paths: frozenset[str]) -> DatasetsPart:
        """Rescan `paths` (and any dataset never scanned), keep the others' last scans, compose the part; a found
        dataset among `paths` is scanned again at once too (after an action on it)."""
        return self._read(paths, cycle=False)

    def _read(self, paths: frozenset[str], cycle: bool) -> DatasetsPart:
        for p in self.paths:
            if p in paths or p not in self._last or cycle:
                self._last[p] = self._read_one(p, full=p in paths)
        part = compose(self.paths, [self._last[p] for p in self.paths], self.options)
        if self.discovery is None:
            return part
        found = self.discovery.read(self.paths, rescan=paths)
        return dataclasses.replace(part, found=found, discovery=self.discovery.note())

    def _read_one(self, p: str, full: bool) -> Scan:
        if not self.watch or not os.path.isdir(p):
            return scan_one(p, self.options, cpu_fraction=self.cpu_fraction)
        from dltop.residency.watch import DatasetWatch

        w = self._watches.get(p)
        try:
            if w is None:
                w = self._watches[p] = DatasetWatch(p, self.options, self.cpu_fraction)
            ds, reached = w.read(full=full)
        except OSError as e:
            if w is not None:  # the root is gone or unreadable: a new watch starts over when it is back
                w.close()
                self._watches.pop(p, None)
            if e.errno in (errno.EMFILE, errno.ENOSYS, errno.ENOSPC) and e.filename is None:
                return scan_one(p, self.options, cpu_fraction=self.cpu_fraction)  # no inotify instance left
            return Scan(DatasetUnavailable(p, path_error(e.strerror or str(e), p), scanned_at=time.time()),
                         set(), WarmNeed())
        return Scan(ds, reached, WarmNeed())

    def close(self) -> None:
        """Drop every watch (the source stops)."""
        for w in self._watches.values():
            w.close()
        self._watches = {}


def discovers(settings: Any) -> bool:
    """Whether the datasets training jobs read are found (not with --no-discover, nor on a captured --root tree:
    its processes are not this machine's)."""
    return bool(getattr(settings, "discover", True)) and os.path.realpath(getattr(settings, "root", "/")) == "/"


def source(settings: Any, probes: Any = None) -> Any:
    """The datasets Source: a background rescan of every configured dataset, at most half a CPU while it runs
    and 10% of the wall time in all; the app asks for one dataset's rescan after acting on it. With discovery on,
    each read also looks for the datasets training jobs read (dltop/sources/found.py), among the probed jobs of
    `probes` (the probes source's latest reading, `probes.LastRead`; None: discovery reads the probes itself)."""
    from dltop.sources.base import Source

    paths = tuple(os.path.abspath(p) for p in settings.datasets)
    options = WalkOptions(max_depth=SOURCE_MAX_DEPTH, top_files=SOURCE_TOP_FILES, top_keys=FILE_SORT_KEYS,
                          top_budget=SOURCE_TOP_BUDGET)
    discovery = None
    if discovers(settings):
        from dltop.sources.found import Discovery

        discovery = Discovery(options, SOURCE_CPU_FRACTION, user=getattr(settings, "user", None),
                              pid=getattr(settings, "pid", None), probes=probes)
    reader = DatasetsReader(paths, options, SOURCE_CPU_FRACTION, watch=True, discovery=discovery)
    interval = max(10.0, float(getattr(settings, "refresh_s", 1.0)) * 10)
    # Scans run at half a CPU at most, and full scans keep the wall time spent scanning under 10%. Once a
    # dataset is watched, a read measures only what was opened since the last one, plus a rolling slice at
    # 0.25% of a core (docs/datasets.md, "Watching a dataset"): numbers at most one interval old.
    return Source(name="datasets", interval_s=interval, read=reader.read, timeout_s=120.0, max_duty=0.1,
                  config=paths, read_some=reader.read_some, carry_from=reader.carry_from, close=reader.close)
