"""The tab the TUI opens on: --tab / `tab = ...` / the recording's, else the one that has something (GPU where GPUs
are, else Datasets when datasets are watched, else Page cache), decided once the GPU source has answered unless
the user picked a tab first."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from dltop.config import Settings
from dltop.model import Snapshot, Unavailable
from dltop.model.datasets import DatasetsPart

TAB_DECIDED_AFTER_S = 5.0  # the GPU source has answered by then (or failed): the tab to open on is decided


class _Events(Protocol):
    def event(self, kind: str, data: dict[str, Any], ts: float | None = None) -> None: ...


def wanted_tab(settings: Settings, snap: Snapshot, replay: bool = False) -> tuple[str, bool]:
    """The tab to open on and whether that is final (not while the GPU source has not answered yet)."""
    if settings.tab:
        return settings.tab, True
    if settings.prometheus is not None:
        return "cluster", True  # asked for a cluster: its tab first
    gpus = snap.gpus
    if isinstance(gpus, tuple) and gpus:
        return "gpu", True
    datasets = snap.datasets
    watched = settings.datasets or (isinstance(datasets, DatasetsPart) and datasets.paths)
    waiting = isinstance(gpus, Unavailable) and gpus.reason == "waiting for the first reading"
    return ("datasets" if watched else "pagecache"), not waiting or replay


class OpeningTab:
    """Which tab to switch to while the user has not picked one (`pending`), and the tab shown written into
    --record's recording (`recorder`), so that a replay opens as it was."""

    def __init__(self, recorder: _Events | None = None, replay: bool = False) -> None:
        self.pending = True
        self.recorder = None if replay else recorder
        self.replay = replay
        self._auto: str | None = None
        self._recorded: str | None = None  # the last tab written into the recording

    def switch(self, tabs: Sequence[str], settings: Settings, history: Sequence[Snapshot]) -> str | None:
        """The tab to switch to now, or None to stay. Decided for good once the GPU source has answered (or
        TAB_DECIDED_AFTER_S later)."""
        if not self.pending or not history:
            return None
        tab, decided = wanted_tab(settings, history[-1], self.replay)
        switch = tab if tab != self._auto and tab in tabs else None
        if switch is not None:
            self._auto = tab
        if decided or history[-1].ts - history[0].ts >= TAB_DECIDED_AFTER_S:
            self.pending = False
        return switch

    def shown(self, tab: str) -> None:
        """`tab` is on screen: a tab the user picked ends the choosing; the recording learns it."""
        if self.pending and self._auto is not None and self._auto != tab:
            self.pending = False  # the user picked a tab (a click): nothing moves it again
        if self.recorder is None or self.pending:
            return
        if self._recorded != tab:
            self._recorded = tab
            self.recorder.event("view", {"tab": tab})
