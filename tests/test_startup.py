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
            "print(w.files, sorted(m for m in ('ctypes', 'dltop.kernel', 'dltop.residency.scan') if m in sys.modules))")
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


def _layout(root: Path, names: list[str]) -> Path:
    root.mkdir()
    for n in names:
        (root / n).mkdir()
        if n.lower().endswith(".dist-info"):
            (root / n / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {n.partition('-')[0]}\n"
                                               f"Version: {n.partition('-')[2].rpartition('.')[0]}\n\n")
        else:
            (root / n / "PKG-INFO").write_text(f"Metadata-Version: 1.0\nName: {n.partition('.')[0]}\nVersion: 1.0\n")
    return root


@pytest.mark.parametrize("names, found", [
    ([], False),
    (["numpy-2.1.0.dist-info", "torchvision-0.20.0.dist-info", "torch_tb-1.0.dist-info"], False),
    (["torch-2.13.0+cu121.dist-info"], True),
    (["Torch-2.4.0.dist-info"], True),
    (["torch.egg-info"], True),
    (["numpy-2.1.0.dist-info", "TORCH-2.3.0+cpu.DIST-INFO"], True),
])
def test_the_version_key_skips_the_search_only_where_it_finds_nothing(names: list[str], found: bool,
                                                                       tmp_path: Path) -> None:
    from importlib import metadata

    from dltop.sources.caches import may_hold_distribution

    path = [str(_layout(tmp_path / "site", names)), str(tmp_path / "missing")]
    there = [d.version for d in metadata.distributions(name="torch", path=path)]
    assert bool(there) == found
    assert may_hold_distribution("torch", path) == found  # never False where importlib.metadata finds one


def test_a_zip_or_an_egg_on_the_path_is_searched(tmp_path: Path) -> None:
    from dltop.sources.caches import may_hold_distribution

    (tmp_path / "lib.zip").write_bytes(b"PK\x05\x06" + b"\0" * 18)  # an empty zip
    (tmp_path / "x.egg").mkdir()
    assert may_hold_distribution("torch", [str(tmp_path / "lib.zip")])
    assert may_hold_distribution("torch", [str(tmp_path / "x.egg")])
    assert not may_hold_distribution("torch", [str(tmp_path)])


def test_own_version_key_is_what_importlib_metadata_says() -> None:
    from importlib import metadata

    from dltop.sources import caches

    try:
        local = metadata.version("torch").partition("+")[2]
    except metadata.PackageNotFoundError:
        local = ""
    cu = local if local == "cpu" or (local[:2] == "cu" and local[2:].isdigit()) else ""
    want = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}_{cu}" if cu else ""
    assert caches._own_version_key() == want


def test_the_tuis_caches_source_reads_its_version_key_at_the_first_walk_not_before_the_first_frame() -> None:
    # Where torch is installed (its dist-info on the path), the key took importlib.metadata and its imports:
    # ~0.1 s of CPU in build_sources, before the TUI's first frame. The walk (a slow source, started after
    # the first frame) reads it, and gets the same key.
    code = ("import sys; from dltop.config import Settings; from dltop.sources.registry import build_sources; "
            "from dltop.sources import caches; "
            "src = [s for s in build_sources(Settings()) if s.name == 'caches'][0]; "
            "before = 'importlib.metadata' in sys.modules; "
            "env = caches.settings_environment(Settings())(); "
            "print(before, env.current_version_key == caches._own_version_key())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=60).stdout.split()
    assert out == ["False", "True"]


# The GPU source's first read on a machine with no NVIDIA library: the answer pynvml would give, without pynvml.
GPU_READ = """
import json, sys
if sys.argv[1] == "hidden":
    sys.modules["pynvml"] = None  # as if nvidia-ml-py were not installed: `import pynvml` raises ImportError
from dltop.sources.gpu import GpuReader, make_backend
first = GpuReader(make_backend).read()
loaded = sorted(m for m in ("pynvml", "ctypes.util") if sys.modules.get(m) is not None)
if sys.argv[1] == "hidden":
    sys.modules.pop("pynvml")
    import pynvml  # what the read would have said had it asked pynvml (main's way)
    theirs = ["nvidia-ml-py is not installed (pip install nvidia-ml-py)", None]
else:
    import pynvml
    from dltop.sources.gpu import PynvmlBackend, _absent_word, explain
    try:
        PynvmlBackend().init()
        theirs = None
    except pynvml.NVMLError as e:
        theirs = [explain(e, pynvml), _absent_word(e, pynvml)]
print(json.dumps([[first.reason, first.absent] if hasattr(first, "reason") else None, theirs, loaded]))
"""


def _nvml_library_loads() -> bool:
    import ctypes

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


@pytest.mark.parametrize("pynvml_seen", ["installed", "hidden"])
def test_gpu_first_read_without_nvidia_library_imports_no_pynvml(pynvml_seen: str) -> None:
    if _nvml_library_loads():
        pytest.skip("libnvidia-ml.so.1 loads here: pynvml is asked, as it should be")
    env = {k: v for k, v in os.environ.items() if k not in ("DLTOP_FAKE_NVML", "DLTOP_FAKE_AMDSMI")}
    out = subprocess.run([sys.executable, "-c", GPU_READ, pynvml_seen], capture_output=True, text=True, check=True,
                         env=dict(env, PYTHONPATH=str(REPO)), timeout=60).stdout
    ours, theirs, loaded = json.loads(out.splitlines()[-1])
    assert theirs is not None and ours == theirs  # word for word what pynvml's nvmlInit (or its import) says
    assert loaded == []  # ~20 ms of CPU before the first frame on a machine without NVIDIA's driver


def test_gpu_first_read_asks_the_fake_backend_as_before() -> None:
    # DLTOP_FAKE_NVML: the shortcut is the real backend's only; the scenario's GPUs are read.
    env = dict(os.environ, PYTHONPATH=str(REPO), DLTOP_FAKE_NVML=str(REPO / "tests/data/gpu-scenarios/h100-2proc.json"))
    code = ("from dltop.sources.gpu import GpuReader, make_backend; r = GpuReader(make_backend).read(); "
            "print(len(r), r[0].name)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env,
                         timeout=60).stdout
    assert out.split()[0] == "1" and "H100" in out


def test_server_source_imports_no_http_client_until_its_first_scrape() -> None:
    # The servers source is built before the first frame; its first scrape comes after (a slow source).
    code = """
import socket, sys
from dltop.config import Settings
from dltop.sources.registry import build_sources
with socket.socket() as s:  # a port nothing listens on: a real connection, refused
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
url = f"http://127.0.0.1:{port}/metrics"
src = [s for s in build_sources(Settings(servers=(url,))) if s.name.startswith("server ")][0]
built = sorted(m for m in ("http.client", "urllib.request", "urllib.error") if m in sys.modules)
part = src.read()
print(built, part.state, part.error)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=60).stdout
    assert out.startswith("[] down ") and "connection refused" in out


# The TUI on the Page cache tab, headless: which of the other tabs' own modules its first frame loaded, and which
# each tab loaded when shown (drawn from a real snapshot: the fake NVML's GPUs, this machine's memory and CPUs).
TABS = """
import asyncio, json, sys
from dltop.config import Settings
from dltop.model import Snapshot
from dltop.sampler import ListFeed
from dltop.sources import cpu, memory
from dltop.sources.gpu import FakeBackend, GpuReader
from dltop.tui.app import DltopApp
watched = json.loads(sys.argv[1])
gpus = GpuReader(lambda: FakeBackend.from_file(sys.argv[2])).read()
settings = Settings(tab="pagecache")
snap = Snapshot(ts=1000.0, host="h", gpus=gpus, memory=memory.source(settings).read(), cpu=cpu.source(settings).read())
async def main():
    app = DltopApp(ListFeed([snap]), settings)
    seen = {}
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        seen["pagecache"] = [m for m in watched if m in sys.modules]
        for i, pane in enumerate(app.panes, start=1):
            if pane.PANE_ID != "pagecache":
                await pilot.press(str(i))
                await pilot.pause()
                seen[pane.PANE_ID] = [m for m in watched if m in sys.modules and m not in sum(seen.values(), [])]
    print(json.dumps(seen))
asyncio.run(main())
"""


def test_first_frame_loads_no_module_of_the_tabs_not_shown() -> None:
    own = {"cpu": ["dltop.text.cpu"], "datasets": ["dltop.text.datasets", "dltop.tui.path_input"],
           "caches": ["dltop.text.caches"], "gpu": ["dltop.tui.screens.gpu_details"]}
    watched = [m for ms in own.values() for m in ms] + ["dltop.tui.screens.signal", "http.client"]
    scenario = REPO / "tests/data/gpu-scenarios/h100-2proc.json"
    out = subprocess.run([sys.executable, "-c", TABS, json.dumps(watched), str(scenario)], capture_output=True,
                         text=True, check=True, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120).stdout
    seen = json.loads(out.splitlines()[-1])
    assert seen["pagecache"] == []
    for pane, modules in own.items():  # each tab's own modules came with it (it was drawn from them)
        assert set(modules) <= set(seen[pane]), (pane, seen)
    assert "dltop.tui.screens.signal" not in sum(seen.values(), [])  # only when a signal is to be sent
