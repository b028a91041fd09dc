"""`dltop replay` and `dltop --record DIR` as a user runs them: one clear line for a bad recording or time, and in a
real terminal (tmux) a live run recorded, then replayed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dltop.model import Snapshot
from dltop.recorder import Recorder, Recording
from tests.conftest import REPO

needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed")


def _dltop(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dltop", *args], cwd=REPO, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=60)


def _one_line_error(r: subprocess.CompletedProcess[str], *words: str) -> None:
    assert r.returncode != 0 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    for w in words:
        assert w in r.stderr, r.stderr


@pytest.fixture
def recording(tmp_path: Path, session: list[Snapshot]) -> Path:
    with Recorder(str(tmp_path / "rec"), retain_s=None, max_bytes=None) as recorder:
        for snap in session:
            recorder.write(snap, wait=True)
    return tmp_path / "rec"


def test_replay_of_what_is_not_a_recording(tmp_path: Path) -> None:
    _one_line_error(_dltop("replay", str(tmp_path / "missing")), "no such recording", str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    _one_line_error(_dltop("replay", str(tmp_path / "empty")), "no recording in")
    (tmp_path / "junk.jsonl").write_text("hello\n")
    _one_line_error(_dltop("replay", str(tmp_path / "junk.jsonl")), "not a dltop recording")


def test_replay_of_a_recording_without_samples(tmp_path: Path) -> None:
    Recorder(str(tmp_path / "rec")).close()  # a start and a stop event, no sample
    _one_line_error(_dltop("replay", str(tmp_path / "rec")), "holds no samples")


def test_replay_time_outside_the_recording(recording: Path, session: list[Snapshot]) -> None:
    r = _dltop("replay", str(recording), "-t", repr(session[0].ts - 3600))
    first = time.strftime("%H:%M:%S", time.localtime(session[0].ts))
    _one_line_error(r, "is outside the recording", first)
    _one_line_error(_dltop("replay", str(recording), "-t", "10m ago"), "is outside the recording")
    _one_line_error(_dltop("replay", str(recording), "-t", "soonish"), "not a time")
    # A time inside it gets as far as the terminal, which a test's pipe is not.
    _one_line_error(_dltop("replay", str(recording), "-t", repr(session[5].ts)), "needs a terminal",
                    f"dltop report {recording}")


def test_replay_help_names_the_keys() -> None:
    r = _dltop("replay", "--help")
    assert r.returncode == 0
    for words in ("t/T", "j/J", "space", "-t TIME", "--jump"):
        assert words in r.stdout


def _tmux(sock: str, *args: str) -> str:
    return subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True, check=True).stdout


def _wait_for(sock: str, text: str, timeout_s: float = 20) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        screen = _tmux(sock, "capture-pane", "-p")
        if text in screen:
            return screen
        assert time.monotonic() < deadline, f"{text!r} never showed:\n{screen}"
        time.sleep(0.1)


@needs_tmux
def test_record_from_the_tui_then_replay_it(tmp_path: Path) -> None:
    # A real terminal: dltop --record DIR draws, m puts a marker in, q leaves (the recording is closed and
    # compressed); dltop replay DIR then shows the recording's last sample, and its event list has the marker.
    rec_dir = tmp_path / "rec"
    status = tmp_path / "status"
    sock = f"dltop-rec-{os.getpid()}"
    _tmux(sock, "new-session", "-d", "-c", str(REPO), "-x", "80", "-y", "24",
          f"sh -c '{sys.executable} -m dltop -r 0.25 --record {rec_dir}; echo $? > {status}; sleep 60'")
    try:
        assert "● REC" in _wait_for(sock, "Page cache")
        time.sleep(1.5)
        _tmux(sock, "send-keys", "m")
        _wait_for(sock, "Marker at")
        _tmux(sock, "send-keys", "-l", "before the epoch")
        _tmux(sock, "send-keys", "Enter")
        time.sleep(1.0)
        _tmux(sock, "send-keys", "q")
        deadline = time.monotonic() + 20
        while not status.exists() or not status.read_text().strip():
            assert time.monotonic() < deadline, "dltop --record did not leave on q"
            time.sleep(0.1)
        assert status.read_text().strip() == "0"
    finally:
        subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True)
    assert sorted(p.name.split(".", 1)[1] for p in rec_dir.iterdir() if p.name[0].isdigit()) == ["idx.json", "jsonl.zst"]
    assert oct(rec_dir.stat().st_mode & 0o777) == "0o700"
    rec = Recording(str(rec_dir))
    kinds = [e.kind for e in rec.events()]
    assert kinds[0] == "start" and kinds[-1] == "stop" and "marker" in kinds and len(rec.times()) >= 4
    last = time.strftime("%H:%M:%S", time.localtime(rec.times()[-1]))

    sock = f"dltop-replay-{os.getpid()}"
    _tmux(sock, "new-session", "-d", "-c", str(REPO), "-x", "80", "-y", "24",
          f"{sys.executable} -m dltop replay {rec_dir} -t end")
    try:
        # the header shows the last sample's time; the footer (drawn in the same frame or the one before): space plays
        screen = _wait_for(sock, f"REPLAY rec {last}")
        assert "␣ Play" in screen
        _tmux(sock, "send-keys", "v")
        _wait_for(sock, "Events (")
        _wait_for(sock, "before the epoch")  # its rows may come a frame after its title on a loaded machine
    finally:
        subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True)


@needs_tmux
def test_record_refuses_a_directory_another_recorder_holds(tmp_path: Path) -> None:
    out, status = tmp_path / "err", tmp_path / "status"
    sock = f"dltop-lock-{os.getpid()}"
    with Recorder(str(tmp_path / "rec")):
        _tmux(sock, "new-session", "-d", "-c", str(REPO), "-x", "80", "-y", "24",
              f"sh -c '{sys.executable} -m dltop --record {tmp_path / 'rec'} 2> {out}; echo $? > {status}; "
              f"sleep 60'")
        try:
            deadline = time.monotonic() + 20
            while not status.exists() or not status.read_text().strip():
                assert time.monotonic() < deadline, "dltop --record did not refuse"
                time.sleep(0.1)
        finally:
            subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True)
    err = out.read_text()
    assert status.read_text().strip() != "0" and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err and str(tmp_path / "rec") in err


def test_jump_is_a_duration(tmp_path: Path, recording: Path) -> None:
    r = _dltop("--jump", "0s")
    assert r.returncode == 2 and "must be more than 0 seconds" in r.stderr and "Traceback" not in r.stderr
    r = _dltop("replay", str(recording), "--jump", "soon")
    assert r.returncode == 2 and "not a duration" in r.stderr
    (tmp_path / "bad.toml").write_text("jump = -5\n")
    _one_line_error(_dltop("replay", str(recording), "--config", str(tmp_path / "bad.toml")), "jump must be")
    (tmp_path / "good.toml").write_text("jump = 300\n")
    _one_line_error(_dltop("replay", str(recording), "--config", str(tmp_path / "good.toml")), "needs a terminal")
