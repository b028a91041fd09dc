"""dltop in a real terminal (tmux): it draws, and it leaves when the terminal goes away."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed")


def _tmux(sock: str, *args: str) -> str:
    return subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True, check=True).stdout


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("ignore_hup", [False, True], ids=["plain", "nohup"])
def test_leaves_when_the_terminal_hangs_up(ignore_hup: bool) -> None:
    # `trap '' HUP` is what nohup and some multiplexers leave behind: the tty then reads EOF forever, and a
    # TUI that stays would spin on it next to the training job.
    sock = f"dltop-test-{os.getpid()}-{ignore_hup}"
    prefix = "trap '' HUP; " if ignore_hup else ""
    _tmux(sock, "new-session", "-d", "-c", str(REPO), "-x", "80", "-y", "24",
          f"{prefix}exec {sys.executable} -m dltop")
    try:
        pid = int(_tmux(sock, "list-panes", "-F", "#{pane_pid}").split()[0])
        deadline = time.monotonic() + 15
        while "Page cache" not in _tmux(sock, "capture-pane", "-p"):
            assert time.monotonic() < deadline, "no first frame"
            time.sleep(0.1)
    finally:
        subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True)
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = _alive(pid)
    if alive:
        os.kill(pid, 9)
    assert not alive, "dltop kept running after its terminal went away"


@pytest.mark.parametrize(("sig", "code"), [(15, 143), (1, 129)], ids=["SIGTERM", "SIGHUP"])
def test_a_kill_leaves_the_terminal_as_q_does(sig: int, code: int, tmp_path) -> None:
    # Killed without a chance to clean up, a Textual app leaves the terminal on the alternate screen with mouse
    # tracking on: the shell behind it needs `reset`. The shell here writes dltop's exit status to a file and
    # stays, so the terminal's state after dltop is what the test reads.
    sock = f"dltop-test-{os.getpid()}-sig{sig}"
    status = tmp_path / "status"
    _tmux(sock, "new-session", "-d", "-c", str(REPO), "-x", "80", "-y", "24",
          f"sh -c '{sys.executable} -m dltop; echo $? > {status}; sleep 60'")
    try:
        shell = int(_tmux(sock, "list-panes", "-F", "#{pane_pid}").split()[0])
        deadline = time.monotonic() + 15
        while "Page cache" not in _tmux(sock, "capture-pane", "-p"):
            assert time.monotonic() < deadline, "no first frame"
            time.sleep(0.1)
        assert _tmux(sock, "display", "-p", "#{alternate_on} #{mouse_any_flag}").split() == ["1", "1"]
        pid = int(subprocess.run(["pgrep", "-P", str(shell)], capture_output=True, text=True).stdout.split()[0])
        os.kill(pid, sig)
        deadline = time.monotonic() + 15
        while not status.exists() or not status.read_text().strip():
            assert time.monotonic() < deadline, "still running after the signal"
            time.sleep(0.1)
        state = _tmux(sock, "display", "-p", "#{alternate_on} #{mouse_any_flag}").split()
    finally:
        subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True)
    assert state == ["0", "0"] and status.read_text().strip() == str(code)


def test_refuses_to_draw_into_a_file(tmp_path) -> None:
    out = tmp_path / "out.txt"
    with open(out, "w") as f:
        r = subprocess.run([sys.executable, "-m", "dltop"], cwd=REPO, stdout=f, stderr=subprocess.PIPE, text=True,
                           stdin=subprocess.DEVNULL, timeout=20)
    assert r.returncode == 1 and "needs a terminal" in r.stderr and "snapshot --json" in r.stderr
    assert out.read_text() == "" and "Traceback" not in r.stderr
