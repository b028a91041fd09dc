"""The registry of panes, in tab order. A pane module that is missing or fails to import is left out."""

from __future__ import annotations

import importlib

from dltop.tui.panes.base import Pane

# "module:Class"; the first is shown at start. Number keys 1..9 select tabs in this order.
PANE_SPECS = (
    "dltop.tui.panes.gpu:GpuPane",  # the headline: what GPU memory is held for
    "dltop.tui.panes.pagecache:PageCachePane",
    "dltop.tui.panes.datasets:DatasetPane",
    "dltop.tui.panes.cpu:CpuPane",
    "dltop.tui.panes.training:TrainingPane",
)


def pane_classes() -> list[type[Pane]]:
    """The pane classes available in this build, in tab order."""
    out = []
    for spec in PANE_SPECS:
        module, _, cls = spec.partition(":")
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name == module:
                continue
            raise
        out.append(getattr(mod, cls))
    return out
