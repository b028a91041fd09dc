"""Helpers for the probe tests: run a script with the probe in a subprocess, pointed at a test's directory."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def probe_env(runtime_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a process whose probe publishes into runtime_dir/dltop."""
    env = {k: v for k, v in os.environ.items() if k != "DLTOP_PROBE"}
    env.update(XDG_RUNTIME_DIR=str(runtime_dir), **extra)
    return env


def spawn(code: str, runtime_dir: Path, **extra: str) -> subprocess.Popen[str]:
    """Start `python -c code` with the probe directory in runtime_dir; its stdout is a pipe."""
    return subprocess.Popen([sys.executable, "-c", code], env=probe_env(runtime_dir, **extra), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(path: Path, timeout_s: float = 30.0) -> None:
    """Wait until `path` exists (a probe subprocess importing torch takes a few seconds)."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear in {timeout_s} s")
        time.sleep(0.05)
