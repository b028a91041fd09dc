"""The ranks of a job as the kernel sees them (issue 34, items 4-8): the rank that stopped is named with its
/proc state and the ranks waiting on it are shown waiting; windowed numbers expire with their window; an exit
says what is known (SIGTERM where the probe's handler saw it, a zombie, else "cause unknown"); a job's
throughput is the sum over its ranks; the viewer's jobs come first. Real processes where the kernel's word is
the point (SIGSTOP, SIGTERM, an unreaped child); pure functions on ProcessProbes for the rest."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dltop.hints.training import data_wait_high, stalled
from dltop.model import MemoryPart, Snapshot, VmStat
from dltop.model import probes as probes_model
from dltop.model.gpu import GpuDevice, GpuProcess
from dltop.model.probes import (
    ProbeEpoch,
    ProbesPart,
    ProcessProbe,
    exit_text,
    jobs_first,
    rank_status,
)
from dltop.sources.probes import read_probes, viewer_uid
from dltop.tui.panes.training import epoch_rows, status_lines
from tests.probe_helpers import REPO, probe_env

# A rank of a job of two: rank 1 writes a byte a step, rank 0 reads one a step (a collective's wait, through a
# pipe): when rank 1 stops, rank 0 blocks in read as a rank blocks in an all-reduce. A 1 s window.
RANK = """
import os, sys, time, dltop.probe as probe
probe.WINDOW_S = 1.0
rank, fd = int(os.environ["RANK"]), int(sys.argv[1])
probe.start(interval_s=0.1)
def forever():
    while True:
        yield 0
print("ready", flush=True)
for _ in probe.track(forever(), batch_size=4):
    if rank == 1:
        os.write(fd, b"x")
        time.sleep(0.02)
    else:
        os.read(fd, 1)
"""


def _probe(pid: int, uid: int = 1000, **kw: object) -> ProcessProbe:
    fields: dict[str, object] = {"published_at": 1000.0, **kw}
    return ProcessProbe(pid=pid, path=f"/run/user/{uid}/dltop/{pid}.json", uid=uid, start_time_ticks=1,
                        cmd="train.py", **fields)  # type: ignore[arg-type]


def _until(check, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def test_a_stopped_rank_is_named_and_the_other_waits_for_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGSTOP of rank 1: /proc says T; it is STOPPED at once (not after a stall), its last numbers go once its
    window has passed (it publishes no more), and rank 0, blocked in its read, is WAITING for rank 1, in the
    Training tab's words and the hint's, not 'STALLED' in the same words as the rank it waits for."""
    monkeypatch.setattr(probes_model, "STALL_MIN_S", 1.0)
    r, w = os.pipe()
    env = probe_env(tmp_path, TORCHELASTIC_RUN_ID="job-ranks", WORLD_SIZE="2")
    ranks = [subprocess.Popen([sys.executable, "-c", RANK, str(w if rank else r)], cwd=REPO, pass_fds=(r, w),
                              env={**env, "RANK": str(rank)}, stdout=subprocess.PIPE, text=True)
             for rank in (0, 1)]
    os.close(r)
    os.close(w)
    folder = [(str(tmp_path / "dltop"), os.getuid())]
    try:
        for p in ranks:
            p.stdout.readline()  # type: ignore[union-attr]
        assert _until(lambda: sum(q.steps or 0 for q in read_probes(folder).processes) > 20)
        os.kill(ranks[1].pid, signal.SIGSTOP)

        def settled() -> ProbesPart | None:
            part = read_probes(folder)
            by_rank = {q.rank: q for q in part.processes}
            ok = len(by_rank) == 2 and by_rank[1].proc_state == "T" and by_rank[1].step_time_s is None \
                and by_rank[0].step_time_s is None and by_rank[0].stalled
            return part if ok else None

        part = _until(settled)
        assert part is not None, read_probes(folder)
    finally:
        for p in ranks:
            p.kill()
            p.wait()
    r0, r1 = sorted(part.processes, key=lambda q: q.rank or 0)
    assert r0.proc_state in ("S", "R") and r1.samples_per_s is None
    assert "no step ended in the last 1 s" in r1.unavailable["step_time_s"]
    assert rank_status(r1, [r0, r1]) == ("STOPPED", f"no step for {r1.last_step_age_s:.0f}s, state T (SIGSTOP or "
                                                    f"Ctrl-Z): kill -CONT {r1.pid}")
    word, why = rank_status(r0, [r0, r1]) or ("", "")
    assert word == "WAITING" and why.startswith("for rank 1 (stopped)")
    lines = [c.plain for c in status_lines([r0, r1], time.time(), 200)]
    assert lines[0].startswith("rank 0 WAITING  for rank 1 (stopped)")
    assert lines[1].startswith("rank 1 STOPPED  no step for") and len(lines[1]) <= 80
    h = stalled([Snapshot(ts=time.time(), host="t", probes=part)])
    assert h is not None and "(rank 1) stopped (state T" in h.text and "(rank 0) waits for it" in h.text
    assert f"kill -CONT {r1.pid}" in h.fix


SIGTERMED = """
import os, time, dltop.probe as probe
probe.start(interval_s=0.1)
def step():
    print("ready", flush=True); time.sleep(60)  # one line: SIGTERM may find it in either
for _ in probe.track(range(3)):
    step()
"""


def test_sigterm_is_said_with_where_it_hit_and_the_signal_still_ends_the_process(tmp_path: Path) -> None:
    """torchrun's SIGTERM: the process dies of it as before (-15), and dltop says it was SIGTERM and where the
    main thread was (train.py:5 in step), where it said 'killed (SIGKILL, the OOM killer) or crashed'."""
    script = tmp_path / "train.py"
    script.write_text(SIGTERMED)
    p = subprocess.Popen([sys.executable, str(script)], cwd=REPO, env=probe_env(tmp_path, PYTHONPATH=str(REPO)),
                         stdout=subprocess.PIPE, text=True)
    p.stdout.readline()  # type: ignore[union-attr]
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == -signal.SIGTERM
    [q] = read_probes([(str(tmp_path / "dltop"), os.getuid())]).exited
    assert q.pid == p.pid and q.exit_signal == "SIGTERM" and q.exit_where == "train.py:5 in step"
    assert q.ended == "killed by SIGTERM in train.py:5 in step (who sent it is not known)"


def test_a_normal_end_leaves_no_signal_file_and_a_killed_zombie_is_said(tmp_path: Path) -> None:
    """A process that ends by itself removes its (empty) signal file; one killed with SIGKILL and not reaped by
    its parent is a zombie in /proc: exited, 'cause unknown', a zombie."""
    code = ("import os, sys, time, dltop.probe as probe\nprobe.start(interval_s=0.1)\n"
            "print(os.getpid(), flush=True)\nif sys.argv[1] == 'hang': time.sleep(60)\n")
    env = probe_env(tmp_path)
    done = subprocess.run([sys.executable, "-c", code, "end"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0
    hung = subprocess.Popen([sys.executable, "-c", code, "hang"], cwd=REPO, env=env, stdout=subprocess.PIPE)
    try:
        hung.stdout.readline()  # type: ignore[union-attr]
        os.kill(hung.pid, signal.SIGKILL)
        folder = [(str(tmp_path / "dltop"), os.getuid())]

        def both_gone() -> ProbesPart | None:
            got = read_probes(folder)
            return got if len(got.exited) == 2 else None

        part = _until(both_gone)
        assert part is not None
        names = set(os.listdir(tmp_path / "dltop"))
        assert f"{int(done.stdout)}.json" in names and f"{int(done.stdout)}.signal" not in names
        assert f"{hung.pid}.signal" in names  # SIGKILL: nothing ran, the empty file stays
        zombie = next(q for q in part.exited if q.pid == hung.pid)
        assert zombie.proc_state == "Z" and zombie.ended.startswith("exited, cause unknown: a zombie")
        assert next(q for q in part.exited if q.pid != hung.pid).ended == "exited (a normal exit or sys.exit)"
    finally:
        hung.wait()


def _rank(pid: int, rank: int, samples: int | None, index: int = 0, **kw: object) -> ProcessProbe:
    epoch = ProbeEpoch(index=index, started_at=1.0, ended_at=3.0, duration_s=2.0, data_wait_s=0.5, steps=10,
                       samples=samples)
    return _probe(pid, rank=rank, job_id="j", epochs=(epoch,), **kw)


def test_the_epoch_tables_samples_a_second_are_the_ranks_sum() -> None:
    """Rank 0's 100 samples in 2 s and rank 1's 120: 110/s for the job (was rank 0's 50 alone); n/a while rank 1
    has not closed the epoch."""
    r0, r1 = _rank(1, 0, 100), _rank(2, 1, 120)
    [row] = epoch_rows(r0, [], {1, 2}, [r0, r1])
    assert "110" in row and "50" not in row
    [row] = epoch_rows(r0, [], {1, 2}, [r0, dataclasses.replace(r1, epochs=())])
    assert row[6] == "n/a"


def test_the_viewers_job_comes_first_in_the_tab_and_the_hint() -> None:
    """Another user's stalled job and mine: the stall hint is about mine (it was hidden behind the other's, '; 2
    more processes stalled'); root's order: --pid's job, then the busiest on the GPU, then the most steps."""
    theirs = [_probe(10, uid=2000, rank=r, job_id="a", last_step_age_s=90.0, user="bob") for r in (0, 1)]
    mine = _probe(20, uid=1000, last_step_age_s=40.0, user="me")
    part = ProbesPart(processes=(*theirs, mine), viewer_uid=1000)
    assert [k for k, _ in jobs_first(part)][0] == mine.job_key
    h = stalled([Snapshot(ts=1.0, host="t", probes=part)])
    assert h is not None and h.text.startswith("pid 20: no step for 40s") and "(+2 stalled in other jobs)" in h.text
    fast = _probe(30, uid=3000, step_time_s=0.01)
    slow = _probe(40, uid=3000, step_time_s=1.0, data_wait_fraction=0.9)
    as_root = ProbesPart(processes=(fast, slow), viewer_uid=0)
    assert [m[0].pid for _, m in jobs_first(as_root)] == [30, 40]  # the most steps a second
    assert [m[0].pid for _, m in jobs_first(dataclasses.replace(as_root, focus_pid=40))] == [40, 30]
    # the busiest on the GPUs before the most steps a second (NVML's smUtil, summed over the GPUs); one job alone
    # needs no GPU's processes summed
    on_gpu = (GpuProcess(40, gpu_util_percent=30), GpuProcess(30, gpu_util_percent=20), GpuProcess(99, gpu_util_percent=90))
    gpus = tuple(GpuDevice(index=i, processes=on_gpu) for i in range(2))
    assert [m[0].pid for _, m in jobs_first(as_root, gpus=gpus)] == [40, 30]
    assert [m[0].pid for _, m in jobs_first(as_root, probes=[fast], gpus=gpus)] == [30]
    waiting = dataclasses.replace(fast, data_wait_fraction=0.5)
    both = ProbesPart(processes=(waiting, slow), viewer_uid=0)
    h = data_wait_high([Snapshot(ts=1.0, host="t", probes=both)])
    assert h is not None and h.numbers["pid"] == 30  # the first job's, though another waits longer
    assert viewer_uid(None, {"SUDO_UID": "1234"}) == (1234 if os.getuid() == 0 else os.getuid())
    assert viewer_uid(77, {"SUDO_UID": "1234"}) == 77


def test_an_exit_without_a_record_as_the_oom_killer_killed_says_so() -> None:
    """The kernel's oom_kill count rose as the process ended: said, with where it comes from; else 'cause
    unknown'."""
    gone = _probe(5, exited=True, published_at=100.0)

    def at(ts: float, kills: int) -> Snapshot:
        return Snapshot(ts=ts, host="t", memory=MemoryPart(vmstat=VmStat(oom_kill=kills)))

    assert exit_text(gone, [at(99.5, 3), at(101.0, 4)]).endswith(
        "the kernel's OOM killer killed 1 process as it ended (/proc/vmstat oom_kill)")
    assert exit_text(gone, [at(99.5, 3), at(101.0, 3)]).startswith("exited, cause unknown")
    assert exit_text(gone, [at(99.5, 3), at(120.0, 4)]).startswith("exited, cause unknown")  # long after


def test_a_rank_in_uninterruptible_io_or_exited_is_the_one_the_others_wait_for() -> None:
    """State D alone is a disk read: only a stalled rank in D is held by it. An exited rank beside a stalled one:
    the hint names it, how it ended, and that the others hang until a collective times out."""
    reading = _probe(1, rank=1, job_id="j", proc_state="D", last_step_age_s=5.0, step_time_s=0.1)
    assert rank_status(reading, [reading]) is None  # reading now, not stalled: training
    held = dataclasses.replace(reading, last_step_age_s=95.0, step_time_s=None)
    waiting = _probe(2, rank=0, job_id="j", proc_state="S", last_step_age_s=94.0)
    assert rank_status(held, [waiting, held]) == ("STALLED", "no step for 95s, state D (uninterruptible IO)")
    assert rank_status(waiting, [waiting, held]) == ("WAITING", "for rank 1 (in uninterruptible IO), no step for 94s")
    h = stalled([Snapshot(ts=1.0, host="t", probes=ProbesPart(processes=(waiting, held), viewer_uid=1000))])
    assert h is not None and "cat /proc/1/stack" in h.fix
    gone = _probe(3, rank=1, job_id="j", exited=True, exit_how="exception", exit_error="RuntimeError: boom")
    part = ProbesPart(processes=(waiting,), exited=(gone,), viewer_uid=1000)
    h = stalled([Snapshot(ts=1.0, host="t", probes=part)])
    assert h is not None and h.text.startswith("pid 3 (rank 1) exited: exit code 1: RuntimeError: boom")
    assert "pid 2 (rank 0) waits for it" in h.text and "times out" in h.fix


def test_a_hostile_signal_file_is_read_bounded_and_shown_printable(tmp_path: Path) -> None:
    """The `.signal` file is its user's: a symlink in its place is not followed, escape sequences in a 'file
    name' are not passed on, and a process killed by SIGKILL (nothing written) is 'cause unknown'."""
    code = "import os, time, dltop.probe as probe\nprobe.start(interval_s=0.1)\nprint(os.getpid(), flush=True)\ntime.sleep(60)\n"
    env = probe_env(tmp_path)
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    for p in procs:
        p.stdout.readline()  # type: ignore[union-attr]
        p.kill()
        p.wait()
    folder = tmp_path / "dltop"
    hostile, linked, killed = (p.pid for p in procs)
    (folder / f"{hostile}.signal").write_text('Stack:\n  File "/x/\x1b[2J\x1b]0;pwned\x07.py", line 7 in f\x1b[31m\n')
    (folder / f"{linked}.signal").unlink()
    (folder / f"{linked}.signal").symlink_to("/etc/passwd")
    part = read_probes([(str(folder), os.getuid())])
    by_pid = {q.pid: q for q in part.exited}
    assert by_pid[hostile].exit_signal == "SIGTERM" and "\x1b" not in (by_pid[hostile].exit_where or "")
    assert by_pid[hostile].exit_where == "?[2J?]0;pwned?.py:7 in f?[31m"
    assert by_pid[linked].exit_signal is None and by_pid[killed].exit_signal is None
    assert by_pid[killed].ended.startswith("exited, cause unknown")


def test_the_hint_line_puts_a_hint_about_my_job_before_one_about_anothers() -> None:
    """Another user's stalled job (a warning) and my job waiting for data (a note): on the hint line mine comes
    first, though it is the milder (it was hidden behind the other's)."""
    from dltop.sampler import ListFeed
    from dltop.session import Session

    theirs = _probe(10, uid=2000, last_step_age_s=90.0, user="bob")
    mine = _probe(20, uid=1000, step_time_s=0.1, data_wait_fraction=0.6, io_unavailable="not known here")
    part = ProbesPart(processes=(theirs, mine), viewer_uid=1000)
    session = Session(ListFeed([Snapshot(ts=1.0, host="t", probes=part)]))
    session.open()
    ids = [(h.id, h.numbers.get("pid")) for h in session.line_hints("training")]
    assert ids == [("training-data-wait", 20), ("training-stalled", 10)]
    assert [h.id for h in session.hints] == ["training-stalled", "training-data-wait"]  # severity first
