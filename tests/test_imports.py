"""The layers below the TUI never pull in Textual (a training script imports them; `snapshot` must start fast)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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


# What a page-cache command must not load: the other layers' models, the config reader, the TUI's options. Each
# costs start-up that `vmtouch` does not pay (the model package alone was 60 of 130 ms of `dltop residency`).
NOT_FOR_PAGECACHE = ("dltop.model.gpu", "dltop.model.cpu", "dltop.model.memory", "dltop.model.probes",
                     "dltop.model.cluster", "dltop.model.caches", "dltop.model.servers", "dltop.model.snapshot",
                     "dltop.config", "tomllib", "dltop.commands.cluster")


@pytest.mark.parametrize("argv", [["residency", "--json"], ["residency"], ["evict", "--dry-run"]])
def test_pagecache_commands_import_only_what_they_use(argv: list[str], tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x" * 5000)
    # An action's memory guard reads the memory model's cgroup rules.
    unused = [m for m in NOT_FOR_PAGECACHE if not (argv[0] != "residency" and m == "dltop.model.memory")]
    code = ("import sys\nfrom dltop.cli import main\n"
            f"rc = main({[*argv, str(tmp_path)]!r})\n"
            f"bad = sorted(m for m in {unused!r} if m in sys.modules)\n"
            "print(rc, bad, file=sys.stderr)\nassert rc == 0 and not bad, bad")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_the_model_package_loads_each_name_on_first_use() -> None:
    code = ("import sys, dltop.model as m\nassert 'dltop.model.gpu' not in sys.modules\n"
            "s = m.Snapshot(ts=1.0, host='h', gpus=(), datasets=m.Unavailable('x'))\n"
            "assert m.Snapshot.from_json(s.to_json()) == s and m.gpu.GpuPart is m.GpuPart\n"
            "assert sorted(m.__all__) == sorted(m._MODULE_OF) and set(m.__all__) <= set(dir(m))\n"
            "try:\n    m.Nothing\nexcept AttributeError as e:\n    print(e)\nelse:\n    raise SystemExit(1)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "module 'dltop.model' has no attribute 'Nothing'"


def test_the_caches_command_imports_no_other_layer(tmp_path: Path) -> None:
    # The caches walk is ~2x du: Python's start-up and imports are the floor of it (hints of every layer, their
    # models and the Snapshot were ~40 ms of it).
    code = ("import sys\nfrom dltop.cli import main\nrc = main(['caches', '--json'])\n"
            "bad = sorted(m for m in sys.modules if m in ('dltop.model.snapshot', 'dltop.model.gpu', 'dltop.model.cpu',"
            " 'dltop.model.probes', 'dltop.hints.gpu', 'dltop.hints.training', 'dltop.hints.memory'))\n"
            "assert rc == 0 and not bad, bad")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "c")})
    assert r.returncode == 0, r.stderr
