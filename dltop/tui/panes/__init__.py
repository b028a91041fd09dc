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
    "dltop.tui.panes.caches:CachesPane",
)


CLUSTER_SPEC = "dltop.tui.panes.cluster:ClusterPane"  # first, when there is a Prometheus to read the cluster from


def pane_classes(cluster: bool = False) -> list[type[Pane]]:
    """The pane classes available in this build, in tab order; with `cluster`, the Cluster tab first."""
    out = []
    for spec in ((CLUSTER_SPEC,) if cluster else ()) + PANE_SPECS:
        module, _, cls = spec.partition(":")
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name == module:
                continue
            raise
        out.append(getattr(mod, cls))
    return out
