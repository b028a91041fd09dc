"""The layers below the TUI never pull in Textual (a training script imports them; `snapshot` must start fast)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["dltop", "dltop.model", "dltop.sources", "dltop.sources.registry", "dltop.recorder",
                                    "dltop.commands.record",
                                    "dltop.sampler", "dltop.derive", "dltop.cli"])
def test_no_textual(module: str) -> None:
    code = (f"import sys, {module}\n"
            "from dltop.sources.registry import build_sources\n"
            "from dltop.config import Settings\n"
            "build_sources(Settings())\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'rich'))\n"
            "assert not bad, bad")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
