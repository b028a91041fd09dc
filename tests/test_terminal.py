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


def _hex(seq: str) -> list[str]:
    return [f"{b:02x}" for b in seq.encode()]


def _start(sock: str, status) -> int:
    """dltop in an 80x24 tmux window behind a shell that writes its exit status; its pid once it has drawn.
    Without COLUMNS and LINES: something in the test process (not os.environ) exports 80 and 24, and with them
    set the terminal's size is fixed for Textual (shutil.get_terminal_size reads them first)."""
    _tmux(sock, "new-session", "-d", "-c", str(REPO), "-x", "80", "-y", "24",
          f"env -u COLUMNS -u LINES sh -c '{sys.executable} -m dltop; echo $? > {status}; sleep 60'")
    shell = int(_tmux(sock, "list-panes", "-F", "#{pane_pid}").split()[0])
    deadline = time.monotonic() + 15
    while "Page cache" not in _tmux(sock, "capture-pane", "-p"):
        assert time.monotonic() < deadline, "no first frame"
        time.sleep(0.1)
    return int(subprocess.run(["pgrep", "-P", str(shell)], capture_output=True, text=True).stdout.split()[0])


def _until(sock: str, pred, what: str, within_s: float = 3.0) -> str:
    deadline = time.monotonic() + within_s
    while not pred(screen := _tmux(sock, "capture-pane", "-p")):
        assert time.monotonic() < deadline, f"{what}; the screen:\n{screen}"
        time.sleep(0.05)
    return screen


@pytest.mark.parametrize("quit_key", ["q", "C-c"])
def test_esc_keys_mouse_and_resize_reach_dltop_and_it_leaves_at_once(quit_key: str, tmp_path) -> None:
    # A lone Esc must become the Esc key when the escape delay runs out (nothing more comes to end the
    # sequence), and q / Ctrl-C must end the input thread at once.
    sock = f"dltop-test-{os.getpid()}-keys-{quit_key}"
    status = tmp_path / "status"
    try:
        pid = _start(sock, status)
        _tmux(sock, "send-keys", "?")
        _until(sock, lambda s: "dltop — keys" in s, "? did not open the help")
        time.sleep(0.3)
        _tmux(sock, "send-keys", "Escape")  # alone: no key follows it
        _until(sock, lambda s: "dltop — keys" not in s, "a lone Esc did not close the help")
        _tmux(sock, "send-keys", "3")
        _until(sock, lambda s: "watched" in s, "3 did not show the Datasets tab")
        line = _tmux(sock, "capture-pane", "-p").splitlines()[1]
        x = line.index("2 Page cache") + 3  # 1-based column of the label's middle
        _tmux(sock, "send-keys", "-H", *_hex(f"\x1b[<0;{x};2M"), *_hex(f"\x1b[<0;{x};2m"))  # a click on it (SGR)
        _until(sock, lambda s: "Available" in s and "watched" not in s, "a click on the tab did not show it")
        _tmux(sock, "resize-window", "-x", "100", "-y", "30")
        _until(sock, lambda s: len(s.splitlines()) == 30 and len(s.splitlines()[2]) == 100,
               "the screen did not follow a resize")
        t0 = time.monotonic()
        _tmux(sock, "send-keys", quit_key)
        deadline = t0 + 5
        while not status.exists() or not status.read_text().strip():
            assert time.monotonic() < deadline, f"still running 5 s after {quit_key}"
            time.sleep(0.05)
        state = _tmux(sock, "display", "-p", "#{alternate_on} #{mouse_any_flag}").split()
    finally:
        subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True)
    assert not _alive(pid)
    assert status.read_text().strip() == "0" and state == ["0", "0"]


def test_a_suspended_dltop_comes_back_with_its_keys() -> None:
    # SIGTSTP suspends (Textual closes the driver) and `fg` starts application mode again: the input thread
    # must come back, keys and a lone Esc working, and q must still leave.
    sock = f"dltop-test-{os.getpid()}-suspend"
    _tmux(sock, "new-session", "-d", "-c", str(REPO), "-x", "80", "-y", "24",
          "env -u COLUMNS -u LINES PS1='$ ' bash --norc --noprofile -i")
    try:
        _tmux(sock, "send-keys", "-l", f"{sys.executable} -m dltop")
        _tmux(sock, "send-keys", "Enter")
        _until(sock, lambda s: "Page cache" in s, "no first frame", 15)
        shell = int(_tmux(sock, "list-panes", "-F", "#{pane_pid}").split()[0])
        pid = int(subprocess.run(["pgrep", "-P", str(shell)], capture_output=True, text=True).stdout.split()[0])
        os.kill(pid, 20)  # SIGTSTP
        _until(sock, lambda s: "Stopped" in s, "dltop did not stop")
        _tmux(sock, "send-keys", "-l", "fg")
        _tmux(sock, "send-keys", "Enter")
        _until(sock, lambda s: "Page cache" in s, "dltop did not come back")
        time.sleep(0.5)
        _tmux(sock, "send-keys", "?")
        _until(sock, lambda s: "dltop — keys" in s, "? did not open the help after fg")
        time.sleep(0.3)
        _tmux(sock, "send-keys", "Escape")
        _until(sock, lambda s: "dltop — keys" not in s, "a lone Esc did not close the help after fg")
        _tmux(sock, "send-keys", "q")
        deadline = time.monotonic() + 5
        while _alive(pid):
            assert time.monotonic() < deadline, "still running 5 s after q"
            time.sleep(0.05)
        state = _tmux(sock, "display", "-p", "#{alternate_on} #{mouse_any_flag}").split()
    finally:
        subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True)
    assert state == ["0", "0"]
