"""The GPU tab's `e`: a real process's environment from /proc/PID/environ, its secrets masked, escaped, NUL and
non-UTF-8 safe; another user's refused by the kernel (run as a third uid); a pid reused since the row is not read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dltop.actions.environ import MASK, mask, read_environ
from dltop.errors import DltopError
from dltop.probe.files import proc_start_ticks

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run processes as other users")
ENV = {b"PATH": b"/usr/bin", b"HF_TOKEN": b"hf_abcdef", b"WANDB_API_KEY": b"k123", b"DB_PASSWORD": b"pw",
       b"aws_secret_access_key": b"s", b"PIP_INDEX_URL": b"https://alice:hunter2@pypi.example/simple",
       b"GIT_URL": b"https://ghp_tok@github.com/x", b"TERMINAL_TITLE": b"\x1b]0;pwned\x07", b"RAW": b"\xff\xfe ok",
       b"PLAIN_URL": b"http://host:8000/metrics"}


def _sleep(env: dict[bytes, bytes], *prefix: str) -> subprocess.Popen[bytes]:
    p = subprocess.Popen([*prefix, sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
                         stdout=subprocess.PIPE, env=env)  # type: ignore[arg-type]
    assert p.stdout is not None and p.stdout.readline() == b"up\n"
    return p


def test_a_real_process_s_environment_with_its_secrets_masked() -> None:
    p = _sleep(ENV)
    try:
        env = read_environ(p.pid, proc_start_ticks(p.pid) or 0)
        got = dict(env.variables)
        assert got["PATH"] == "/usr/bin" and got["PLAIN_URL"] == "http://host:8000/metrics"
        for name in ("HF_TOKEN", "WANDB_API_KEY", "DB_PASSWORD", "aws_secret_access_key"):
            assert got[name] == MASK
        assert got["PIP_INDEX_URL"] == f"https://{MASK}@pypi.example/simple"
        assert got["GIT_URL"] == f"https://{MASK}@github.com/x"
        assert env.masked == 6
        assert "hunter2" not in repr(env) and "hf_abcdef" not in repr(env) and "ghp_tok" not in repr(env)
        assert got["TERMINAL_TITLE"] == "\x1b]0;pwned\x07"  # as read: the screen escapes it (fmt.printable)
        assert got["RAW"].startswith("\udcff\udcfe")  # not UTF-8: kept, never an error
    finally:
        p.kill()
        p.wait()


def test_a_reused_pid_and_an_exited_process_are_not_read() -> None:
    p = _sleep(ENV)
    start = proc_start_ticks(p.pid) or 0
    try:
        with pytest.raises(DltopError, match="is another process now"):
            read_environ(p.pid, start + 1)
    finally:
        p.kill()
        p.wait()
    with pytest.raises(DltopError, match="has exited"):
        read_environ(p.pid, start)


def test_mask_names_and_urls() -> None:
    assert mask("OPENAI_API_KEY", "sk-1") == (MASK, True)
    assert mask("NCCL_SOCKET_IFNAME", "eth0") == ("eth0", False)
    assert mask("X", "redis://:pw@h:6379/0 and s3://k:v@b") == (f"redis://{MASK}@h:6379/0 and s3://{MASK}@b", True)


@root_only
def test_another_user_s_environment_is_refused_by_the_kernel() -> None:
    theirs = _sleep(ENV, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
    try:
        start = proc_start_ticks(theirs.pid)
        code = ("import json; from dltop.actions.environ import read_environ; from dltop.errors import DltopError\n"
                f"try:\n    read_environ({theirs.pid}, {start}); print(json.dumps('read'))\n"
                "except DltopError as e:\n    print(json.dumps(str(e)))")
        repo = str(Path(__file__).resolve().parents[1])
        out = subprocess.run(["setpriv", "--reuid=65533", "--regid=65533", "--clear-groups", sys.executable, "-c",
                              code], capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": repo},
                             cwd="/")
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == (f"pid {theirs.pid}'s environment: permission denied by the kernel: only "
                                          "its owner or root may read it")
        assert dict(read_environ(theirs.pid, start or 0).variables)["PATH"] == "/usr/bin"  # root may
    finally:
        theirs.kill()
        theirs.wait()


async def test_e_shows_the_selected_process_s_environment_escaped() -> None:
    from dltop.sampler import ListFeed
    from dltop.tui.app import DltopApp
    from dltop.tui.screens.environ import EnvironScreen
    from tests.test_gpu_table_keys import _select, _with_process

    p = _sleep(ENV)
    try:
        app = DltopApp(ListFeed(_with_process(p.pid), start=1))
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            await _select(app, pilot, p.pid)
            await pilot.press("e")
            await pilot.pause()
            assert isinstance(app.screen, EnvironScreen)
            text = str(app.screen.query_one("#environ-text").render())
            assert "HF_TOKEN=*****" in text and "\\x1b]0;pwned\\x07" in text and "\x1b" not in text
            assert "\\xff\\xfe ok" in text and "hunter2" not in text
            await pilot.press("escape")
            await pilot.pause()
            assert not isinstance(app.screen, EnvironScreen)
    finally:
        p.kill()
        p.wait()
