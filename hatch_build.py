"""Ships dltop/probe/dltop_probe.pth at the top of site-packages, in wheels and editable installs alike, so that
`DLTOP_PROBE=1 python train.py` starts the probe (docs/probe.md), and builds the optional C modules in
dltop/native where a compiler and Python's headers are found (scripts/build_native.py)."""

import importlib.util
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


def _builder() -> Any:
    path = Path(__file__).resolve().parent / "scripts" / "build_native.py"
    spec = importlib.util.spec_from_file_location("dltop_build_native", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class ProbeHookBuild(BuildHookInterface):  # type: ignore[misc]
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        key = "force_include_editable" if version == "editable" else "force_include"
        build_data.setdefault(key, {})["dltop/probe/dltop_probe.pth"] = "dltop_probe.pth"
        built = _builder().build(log=self.app.display_warning)
        if built and version != "editable":
            # the .so files are ignored by git, hence by hatch's file selection: include them by name
            root = Path(self.root)
            for so in built:
                build_data["force_include"][str(so)] = str(so.relative_to(root))
            build_data["pure_python"] = False
            build_data["infer_tag"] = True
