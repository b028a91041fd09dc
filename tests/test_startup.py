"""Start-up of the commands users time against vmtouch and du: what they import, and help text as argparse sets it."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dltop.commands.common import ArgumentParser

REPO = Path(__file__).resolve().parents[1]

# Run in a fresh interpreter: which modules a command loaded, of those it never needs.
PROBE = """
import json, sys
from dltop.cli import main
sys.stdout = open('/dev/null', 'w')
main(sys.argv[2:])
sys.stdout = sys.__stdout__
watched = json.loads(sys.argv[1])
print(json.dumps(sorted(m for m in watched if m in sys.modules)))
"""


def _loaded(watched: list[str], *argv: str) -> list[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(watched), *argv], capture_output=True, text=True,
                         env=env, check=True, timeout=60).stdout
    return json.loads(out.splitlines()[-1])


def test_residency_loads_no_module_it_never_needs(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x" * 5000)
    # shutil (zlib, bz2, lzma) came with argparse's help formatter; signal and threading with the actions.
    assert _loaded(["shutil", "bz2", "lzma", "signal", "threading", "dltop.model.memory"],
                   "residency", str(tmp_path), "--json") == []


def test_evict_loads_no_memory_model(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x" * 5000)
    # The memory guard's helpers are a warm's and a lock's, never an evict's.
    assert _loaded(["shutil", "dltop.model.memory"], "evict", str(tmp_path), "--json") == []


def test_cache_walk_loads_no_residency_engine(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "k.py").write_text("x = 1\n")
    code = ("import sys; from dltop.sources.caches import walk_cache; w = walk_cache(sys.argv[1]); "
            "print(w.files, sorted(m for m in ('ctypes', 'dltop.kernel', 'dltop.sources.datasets') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=60).stdout
    assert out.split(maxsplit=1) == ["1", "[]\n"]


@pytest.mark.parametrize("columns", ["57", "", "0", "wide"])
def test_help_is_as_wide_as_argparse_makes_it(columns: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", columns)

    def parser(cls: type[argparse.ArgumentParser]) -> argparse.ArgumentParser:
        p = cls(prog="dltop residency", description="Page-cache residency of files and folders, " * 4)
        p.add_argument("paths", nargs="+", metavar="PATH", help="dataset files or folders " * 6)
        p.add_argument("--depth", type=int, default=1, metavar="N", help="show folders down to depth N " * 5)
        return p

    ours, theirs = parser(ArgumentParser).format_help(), parser(argparse.ArgumentParser).format_help()
    assert ours == theirs
    if columns == "57":
        assert max(len(line) for line in ours.splitlines()) <= 55
