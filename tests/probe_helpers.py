"""Helpers for the probe tests: run a script with the probe in a subprocess, pointed at a test's directory."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def probe_env(runtime_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a process whose probe publishes into runtime_dir/dltop."""
    env = {k: v for k, v in os.environ.items() if k != "DLTOP_PROBE"}
    env.update(XDG_RUNTIME_DIR=str(runtime_dir), **extra)
    return env
