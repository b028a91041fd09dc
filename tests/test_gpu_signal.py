"""The GPU tab's signal, through the action runner: real processes (a sleep of ours, a second user's), the start
time checked again before the send, the outcome said, the journal written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dltop import journal
from dltop.actions.runner import ActionRunner
from dltop.model.actions import ActionEvent, SignalTarget
from dltop.probe.files import proc_start_ticks

NOBODY = (65534, 65534)
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a process as a second user")


def _sleep(*prefix: str, ignore_term: bool = False) -> subprocess.Popen[bytes]:
    code = "import signal, time\n" + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore_term else "") + \
        "print('up', flush=True)\ntime.sleep(60)\n"
    p = subprocess.Popen([*prefix, sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline() == b"up\n"  # its handler is in place
    return p


def _send(target: SignalTarget) -> tuple[ActionEvent, list[ActionEvent]]:
    runner = ActionRunner()
    events: list[ActionEvent] = []
    runner.subscribe(events.append)
    run = runner.start("signal", [f"pid {target.pid}"], options=target, wait=True)
    assert run.done.is_set()
    finished = [e for e in events if e.phase == "finished"]
    assert len(finished) == 1
    return finished[0], events


def _target(p: subprocess.Popen[bytes], sig: str = "SIGTERM", ticks: int | None = None) -> SignalTarget:
    start = proc_start_ticks(p.pid)
    assert start is not None
    return SignalTarget(pid=p.pid, start_time_ticks=start if ticks is None else ticks, signal=sig,
                        command="python -c sleep")


def test_sigterm_to_a_real_process_says_it_exited_and_is_journalled() -> None:
    p = _sleep()
    try:
        done, _ = _send(_target(p))
        assert done.outcome == "ok", done.message
        assert done.message == f"SIGTERM sent to pid {p.pid} (python -c sleep): it exited"
        assert p.wait(timeout=10) == -15
    finally:
        p.kill()
        p.wait()
    directory = journal.journal_dir()
    assert directory is not None
    lines = [json.loads(x)["event"] for x in Path(directory, journal.JOURNAL_NAME).read_text().splitlines()]
    mine = [e for e in lines if e["action"] == "signal" and e["target"] == f"pid {p.pid}"]
    assert [(e["phase"], e["outcome"]) for e in mine] == [("started", None), ("finished", "ok")]


def test_a_process_that_ignores_sigterm_is_said_to_still_run_and_sigkill_ends_it() -> None:
    p = _sleep(ignore_term=True)
    try:
        done, _ = _send(_target(p))
        assert done.outcome == "ok" and done.message.endswith("still running after 1.0 s"), done.message
        assert p.poll() is None
        done, _ = _send(_target(p, "SIGKILL"))
        assert done.message.endswith("it exited"), done.message
        assert p.wait(timeout=10) == -9
    finally:
        p.kill()
        p.wait()


def test_a_start_time_that_changed_is_another_process_and_is_spared() -> None:
    p = _sleep()
    try:
        target = _target(p)
        done, _ = _send(SignalTarget(p.pid, target.start_time_ticks + 1, "SIGKILL"))
        assert done.outcome == "refused"
        assert f"pid {p.pid} is another process now" in done.message and "nothing sent" in done.message
        assert p.poll() is None  # still running: the signal did not go
    finally:
        p.kill()
        p.wait()


def test_an_exited_process_and_an_unknown_signal_are_refused_with_the_reason() -> None:
    p = _sleep()
    target = _target(p)
    p.kill()
    p.wait()  # reaped: its pid is free
    done, _ = _send(target)
    assert done.outcome == "refused" and done.message == f"pid {p.pid} has exited: nothing sent"
    done, _ = _send(SignalTarget(os.getpid(), proc_start_ticks(os.getpid()) or 0, "SIGSTOP"))
    assert done.outcome == "refused" and "only SIGTERM, SIGKILL, SIGINT" in done.message


@root_only
def test_another_user_s_process_is_refused_unless_root() -> None:
    """A second user's sleep: an unprivileged dltop (run as a third uid) is refused with the reason and sends
    nothing; root may signal it."""
    theirs = _sleep("setpriv", f"--reuid={NOBODY[0]}", f"--regid={NOBODY[1]}", "--clear-groups")
    try:
        target = _target(theirs)
        code = ("import sys, json; from dltop.actions.runner import ActionRunner; "
                "from dltop.model.actions import SignalTarget; r = ActionRunner(journal=False); ev = []; "
                "r.subscribe(ev.append); "
                f"r.start('signal', ['pid {theirs.pid}'], options=SignalTarget({theirs.pid}, "
                f"{target.start_time_ticks}, 'SIGKILL'), wait=True); "
                "f = [e for e in ev if e.phase == 'finished'][0]; print(json.dumps([f.outcome, f.message]))")
        repo = str(Path(__file__).resolve().parents[1])
        out = subprocess.run(["setpriv", "--reuid=65533", "--regid=65533", "--clear-groups", sys.executable, "-c",
                              code], capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": repo},
                             cwd="/")
        assert out.returncode == 0, out.stderr
        outcome, message = json.loads(out.stdout)
        assert outcome == "refused"
        assert message == (f"pid {theirs.pid} is another user's process: only root may signal it "
                           "(dltop runs as uid 65533)")
        assert theirs.poll() is None
        done, _ = _send(target)  # root
        assert done.outcome == "ok" and done.message.endswith("it exited"), done.message
        assert theirs.wait(timeout=10) == -15
    finally:
        theirs.kill()
        theirs.wait()


def test_a_tagged_set_is_each_checked_sent_together_and_a_reused_pid_spared() -> None:
    """Three tagged processes, one of whose pid is another process now (its start time moved): the two are sent
    SIGTERM and exit, the third is spared and named; the outcome says each."""
    a, b, c = _sleep(), _sleep(), _sleep()
    try:
        reused = SignalTarget(c.pid, _target(c).start_time_ticks + 1, "SIGTERM")
        runner = ActionRunner(journal=False)
        events: list[ActionEvent] = []
        runner.subscribe(events.append)
        runner.start("signal", [f"pid {x.pid}" for x in (a, b, c)], options=(_target(a), _target(b), reused),
                     wait=True)
        done = next(e for e in events if e.phase == "finished")
        assert done.outcome == "ok", done.message
        assert done.message.startswith(f"SIGTERM sent to 2 processes (pids {a.pid}, {b.pid}): 2 exited; spared: "
                                       f"pid {c.pid} is another process now"), done.message
        assert a.wait(timeout=10) == -15 and b.wait(timeout=10) == -15
        assert c.poll() is None  # spared
        # none that may be sent: refused, with each reason
        runner.start("signal", [f"pid {c.pid}"], options=(reused, SignalTarget(c.pid, 0, "SIGKILL")), wait=True)
        done = [e for e in events if e.phase == "finished"][-1]
        assert done.outcome == "refused" and done.message.count("is another process now") == 2, done.message
        assert c.poll() is None
    finally:
        for p in (a, b, c):
            p.kill()
            p.wait()
