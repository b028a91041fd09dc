"""End to end on a shared node: a second, unprivileged user (setpriv) runs a process whose argv carries terminal
escapes, a real probe job, and hand-writes hostile probe files (NaN, 4 KB of nesting) into their own probe
directory, while root's dltop runs in a real terminal (tmux). dltop survives, shows everything else, shows the
escapes as text, and the terminal keeps its title and its screen."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dltop.probe.files import proc_start_ticks
from tests.hostile import World, make_world
from tests.probe_helpers import REPO

NOBODY = (65534, 65534)
pytestmark = [
    pytest.mark.skipif(shutil.which("tmux") is None or shutil.which("setpriv") is None,
                       reason="needs tmux and setpriv (util-linux)"),
    pytest.mark.skipif(os.getuid() != 0, reason="needs root: dltop runs as root beside another user"),
]


def _tmux(sock: str, *args: str) -> str:
    return subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True, check=True).stdout


def _as_nobody(code: str, *args: str) -> None:
    subprocess.run(["setpriv", f"--reuid={NOBODY[0]}", f"--regid={NOBODY[1]}", "--clear-groups",
                    sys.executable, "-c", code, *args], check=True, timeout=60, cwd="/")


WRITE = """
import os, sys
path, data = sys.argv[1], sys.argv[2].encode()
with open(path + ".tmp", "wb") as f:
    f.write(data)
os.rename(path + ".tmp", path)
"""


@pytest.fixture
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = Path("/tmp") / f"dltop-hostile-{os.getpid()}"  # a place the second user can reach
    w = make_world(root, user=NOBODY)
    try:
        yield w
    finally:
        w.close()
        Path(w.runtime, "1.json").unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # the probe made it; another job of that user may still use it
            w.runtime.rmdir()
        shutil.rmtree(root, ignore_errors=True)


def _screen(sock: str) -> str:
    return _tmux(sock, "capture-pane", "-p")


def _wait_for(sock: str, text: str, seconds: float = 30) -> str:
    deadline = time.monotonic() + seconds
    while True:
        screen = _screen(sock)
        if text in screen:
            return screen
        assert time.monotonic() < deadline, f"{text!r} never on screen:\n{screen}"
        time.sleep(0.2)


def test_root_dltop_beside_a_hostile_user(world: World) -> None:
    sleeper, job = world.procs
    # the second user's hand-made probe files: a NaN for the sleeper (alive, theirs), 4 KB of nesting
    doc = {"format": 1, "pid": sleeper.pid, "start_time_ticks": proc_start_ticks(sleeper.pid), "cmd": "nan-job",
           "published_at": time.time(), "devices": {}, "data": {"recent_steps": 10, "recent_wait_s": 1.0,
                                                               "recent_step_s": 2.0, "steps": 10}}
    _as_nobody(WRITE, str(world.runtime / f"{sleeper.pid}.json"),
               json.dumps(doc).replace('"recent_wait_s": 1.0', '"recent_wait_s": NaN'))
    _as_nobody(WRITE, str(world.runtime / "1.json"), "[" * 4000 + "]" * 96)
    sock = f"dltop-hostile-{os.getpid()}"
    env = f"DLTOP_FAKE_NVML={world.scenario} "
    _tmux(sock, "new-session", "-d", "-c", str(REPO), "-x", "80", "-y", "24",
          f"{env} exec {sys.executable} -m dltop --refresh 0.5 '{world.dataset}'")
    try:
        title = _tmux(sock, "display", "-p", "#{pane_title}").strip()
        assert "pwned" not in title
        gpu = _wait_for(sock, "\\x1b]0;pwned")  # the GPU tab: the command column
        assert gpu.lstrip().startswith("dltop ·"), gpu  # the header was not cleared by \e[2J
        _tmux(sock, "send-keys", "5")  # Training
        training = _wait_for(sock, "x1b]0;pwned")  # the probe job's data_dir, escaped
        assert "dltop ·" in training
        _tmux(sock, "send-keys", "?")  # help: every hint whole
        time.sleep(1)
        _tmux(sock, "send-keys", "Escape")
        time.sleep(0.5)  # apart: ESC then 3 at once reads as Alt-3
        _tmux(sock, "send-keys", "3")
        datasets = _wait_for(sock, "evil\\x9b31m\\x7f")
        assert "dltop ·" in datasets
        # dltop is alive and the terminal's title is its own
        assert _tmux(sock, "display", "-p", "#{pane_dead}").strip() == "0"
        assert "pwned" not in _tmux(sock, "display", "-p", "#{pane_title}")
        # and the hostile files were each ignored, or their bad field left out, with a reason (snapshot --json)
        r = subprocess.run([sys.executable, "-m", "dltop", "snapshot", "--json"], cwd=REPO, capture_output=True,
                           timeout=120, env={**os.environ, "DLTOP_FAKE_NVML": str(world.scenario)})
        probes = json.loads(r.stdout)["probes"]
        nested = [i for i in probes["ignored"] if i["path"] == str(world.runtime / "1.json")]
        assert nested and "nested deeper" in nested[0]["reason"]
        nan = [p for p in probes["processes"] if p["pid"] == sleeper.pid]
        assert nan and nan[0]["data_wait_fraction"] is None and "data.recent_wait_s" in nan[0]["unavailable"]
        assert any(p["pid"] == job.pid for p in probes["processes"])
    finally:
        subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True)
