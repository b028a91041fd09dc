"""What the Sampler needs to know about a source: its Snapshot field, its cadence and a blocking read."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Source:
    """A blocking `read()` returning one Snapshot part (or `Unavailable`), polled every `interval_s`."""

    name: str  # unique among the sources; the Snapshot field it fills unless `part` says another
    interval_s: float
    read: Callable[[], Any]
    timeout_s: float = 5.0  # a read running longer than this is shown as slow; its last value is kept
    follows_refresh: bool = False  # True: the TUI's +/- change this source's interval with the refresh
    # At most this share of wall time spent reading: a read that took d seconds waits d / max_duty before the
    # next (a million-file rescan must not become a permanent load next to the training job).
    max_duty: float | None = None
    # What the source was built from (the dataset paths, a server URL): the Sampler replaces a source whose
    # config changed when the settings change at run time, and leaves the others alone.
    config: object = None
    # Reread only some of what the source covers (one dataset of several): the Sampler calls it for a read asked
    # for with read_now(name, key); None: such a read is a full read.
    read_some: Callable[[frozenset[str]], Any] | None = None
    # Called with the Source this one replaces at run time, to take over what it knows (the datasets' last scans)
    carry_from: Callable[[Source], None] | None = None
    # Releases what the source holds for its life (the NVML session); run on the source's own thread after its
    # last read, when the Sampler stops polling it.
    close: Callable[[], None] | None = None
    # Several sources may fill one Snapshot field (one source per inference server, each on its own thread, so
    # one that hangs never delays the others): they share `part`, and `merge` builds the field from every such
    # source's (source, latest value, status), in the order they were added. None: `name` is the field.
    part: str | None = None
    merge: Callable[[Sequence[tuple[Source, Any, Any]]], Any] | None = None
