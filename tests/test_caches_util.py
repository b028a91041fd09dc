"""Helpers for the cache tests: a real TorchInductor cache made by torch.compile, du and find as referees."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
COMPILE = """
import torch
from torch._inductor.runtime.cache_dir_utils import cache_dir
f = torch.compile(lambda x: (x.sin() * x.cos()).sum())
f(torch.randn(64))
print(cache_dir())
"""


def du_bytes(path: Path | str) -> int:
    """`du -B1 -s PATH`: what dltop's size must equal."""
    out = subprocess.run(["du", "-B1", "-s", os.fsencode(str(path))], capture_output=True, check=True).stdout
    return int(out.split()[0])


def find_files(path: Path | str) -> int:
    """`find PATH -type f | wc -l` (one mark per file, so a name with a newline counts once)."""
    out = subprocess.run(["find", os.fsencode(str(path)), "-type", "f", "-printf", "x"], capture_output=True,
                         check=True).stdout
    return len(out)


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """An environment with none of the cache variables of the machine running the tests."""
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TZ", "PYTHONPATH")}
    return {**keep, "HOME": str(home), **extra}


@pytest.fixture(scope="session", name="inductor_cache")
def inductor_cache_fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A TorchInductor cache made by a real torch.compile on CPU in a subprocess (once per session; copy it
    before changing it)."""
    pytest.importorskip("torch")
    if shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.skip("no C++ compiler: torch.compile on CPU needs g++ (scripts/install-test-deps installs it)")
    base = tmp_path_factory.mktemp("inductor")
    cache = base / "torchinductor"
    env = clean_env(base / "home", TORCHINDUCTOR_CACHE_DIR=str(cache))
    r = subprocess.run([sys.executable, "-c", COMPILE], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == str(cache)
    return cache


def copy_cache(src: Path, dest: Path) -> Path:
    """A copy of a cache to change (symlinks copied as symlinks)."""
    shutil.copytree(src, dest, symlinks=True)
    return dest
