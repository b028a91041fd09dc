"""Ships dltop/probe/dltop_probe.pth at the top of site-packages, in wheels and editable installs alike, so that
`DLTOP_PROBE=1 python train.py` starts the probe (docs/probe.md)."""

from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class ProbeHookBuild(BuildHookInterface):  # type: ignore[misc]
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        key = "force_include_editable" if version == "editable" else "force_include"
        build_data.setdefault(key, {})["dltop/probe/dltop_probe.pth"] = "dltop_probe.pth"
