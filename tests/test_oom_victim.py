"""The OOM killer's victim named (recorder/oom.py): the kernel's own lines as Linux 6.18 writes them (read from this
machine's /dev/kmsg after a real kill), hostile commands and cgroup names that try to look like more fields, a
real OOM kill in a memory-limited cgroup made here (as root), and the event line that says who."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dltop.recorder.oom import (
    KmsgReader,
    kmsg_status,
    last_seen,
    name_victims,
    parse_killed,
    parse_record,
    parse_summary,
    victims_of,
)
from dltop.text.events import describe_event

# Read from /dev/kmsg on Linux 6.18.44 after `python3` was killed in a v1 memory cgroup limited to 32 MiB.
SUMMARY = ("oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/process_api/"
           "2e97/oomt654,task_memcg=/process_api/2e97/oomt654,task=python3,pid=6047,uid=0")
KILLED = ("Memory cgroup out of memory: Killed process 6047 (python3) total-vm:42460kB, anon-rss:32512kB, "
          "file-rss:6752kB, shmem-rss:0kB, UID:0 pgtables:120kB oom_score_adj:0")
# A machine-wide OOM (mm/oom_kill.c: "Out of memory", and ",global_oom" where a memcg would be).
GLOBAL_SUMMARY = ("oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,"
                  "task_memcg=/user.slice/user-1000.slice/session-3.scope,task=stress,pid=812,uid=1000")
GLOBAL_KILLED = ("Out of memory: Killed process 812 (stress) total-vm:8392744kB, anon-rss:7961208kB, file-rss:4kB, "
                 "shmem-rss:0kB, UID:1000 pgtables:15644kB oom_score_adj:0")


def test_the_kernels_two_lines_name_pid_command_and_cgroup() -> None:
    assert parse_killed(KILLED) == (6047, "python3", 0, (32512 + 6752) << 10)
    assert parse_summary(SUMMARY, 6047, "python3", 0) == ("CONSTRAINT_MEMCG", "/process_api/2e97/oomt654",
                                                          "/process_api/2e97/oomt654")
    assert parse_summary(SUMMARY, 6048, "python3", 0) is None  # about another task
    [v] = victims_of([(100.0, SUMMARY), (100.0, "unrelated line"), (100.0, KILLED)])
    assert (v.pid, v.command, v.cgroup, v.oom_cgroup, v.uid, v.ts) == \
        (6047, "python3", "/process_api/2e97/oomt654", "/process_api/2e97/oomt654", 0, 100.0)
    [g] = victims_of([(5.0, GLOBAL_SUMMARY), (5.0, GLOBAL_KILLED)])
    assert (g.pid, g.command, g.cgroup, g.oom_cgroup, g.constraint) == \
        (812, "stress", "/user.slice/user-1000.slice/session-3.scope", None, "CONSTRAINT_NONE")
    [alone] = victims_of([(1.0, KILLED)])  # no summary line (the ring wrapped): the cgroup is unknown, not guessed
    assert alone.pid == 6047 and alone.cgroup is None


def test_a_kmsg_record_is_read_with_its_continuation_lines_left_out() -> None:
    assert parse_record(b"3,1234,18724602930,-;" + KILLED.encode() + b"\n SUBSYSTEM=memory\n") == \
        (1234, 18724.60293, KILLED)
    assert parse_record(b"garbage") is None and parse_record(b"3,x,y,-;text") is None


@pytest.mark.parametrize("comm", ["a) total-vm:1kB", "x,pid=1,uid=0", ",task=root", "\\x1b]52;c;", "("])
def test_a_command_that_looks_like_more_fields_is_read_whole(comm: str) -> None:
    killed = KILLED.replace("(python3)", f"({comm})")
    summary = SUMMARY.replace("task=python3", f"task={comm}")
    [v] = victims_of([(1.0, summary), (1.0, killed)])
    assert (v.pid, v.command, v.cgroup) == (6047, comm, "/process_api/2e97/oomt654")


def test_a_cgroup_named_to_look_like_another_field_is_never_taken_for_it() -> None:
    # A delegated user names a cgroup so that a naive split would read task_memcg=/evil.
    spoof = SUMMARY.replace("task_memcg=/process_api/2e97/oomt654", "task_memcg=/process_api/2e97/oomt654/a,task_memcg=/evil")
    [v] = victims_of([(1.0, spoof), (1.0, KILLED)])
    assert v.cgroup == "/process_api/2e97/oomt654/a,task_memcg=/evil"  # the only reading inside the OOM's memcg
    # Only one reading has the task's memcg inside the OOM's: it is the one the kernel wrote.
    nested = SUMMARY.replace("oom_memcg=/process_api/2e97/oomt654,task_memcg=/process_api/2e97/oomt654",
                             "oom_memcg=/j,task_memcg=/j/a,task_memcg=/j/b")
    assert victims_of([(1.0, nested), (1.0, KILLED)])[0].cgroup == "/j/a,task_memcg=/j/b"
    # Two readings fit (task /p/q,oom_memcg=/r,task_memcg=/r in /p, or task /r in /r): neither is taken.
    both = SUMMARY.replace("oom_memcg=/process_api/2e97/oomt654,task_memcg=/process_api/2e97/oomt654",
                           "oom_memcg=/p,task_memcg=/p/q,oom_memcg=/r,task_memcg=/r")
    [amb] = victims_of([(1.0, both), (1.0, KILLED)])
    assert amb.cgroup is None and amb.pid == 6047  # two readings fit: unknown, said as such


def test_the_event_line_names_the_victim_escaped() -> None:
    data = {"source": "vmstat", "kills": 1, "total": 7, "victims_from": "kmsg",
            "victims": [{"pid": 6047, "command": "evil\x1b]52;c;\x07", "cgroup": "/job\u202e", "uid": 1000,
                         "rss_bytes": 40 << 20}]}
    line = describe_event("oom_kill", data)
    assert line.startswith("OOM kill: 1 in the kernel (vmstat): killed pid 6047 evil")
    assert "cgroup /job" in line and "uid 1000" in line and "40.0 MiB resident" in line and "(kernel log)" in line
    assert not any(ord(c) < 0x20 or 0x7f <= ord(c) < 0xa0 or c == "\u202e" for c in line), line
    gone = {"source": "cgroup", "cgroup": "/job", "kills": 1, "victims_from": "last sample",
            "kmsg_status": "/dev/kmsg: kernel.dmesg_restrict is 1: reading it needs CAP_SYSLOG",
            "victims": [{"pid": 9, "command": "train.py", "user": "ann", "rss_bytes": None, "gpu_bytes": 1 << 30}]}
    line = describe_event("oom_kill", gone)
    assert "victim unknown, gone since the last sample: pid 9 train.py" in line and "CAP_SYSLOG" in line
    assert describe_event("oom_kill", {"source": "vmstat", "kills": 1}) == "OOM kill: 1 in the kernel (vmstat)"


def test_without_the_kernel_log_the_victim_is_named_from_the_last_sample(tmp_path: Path) -> None:
    from dltop.model import GpuDevice, GpuProcess, Snapshot

    def snap(*pids: int) -> Snapshot:
        procs = tuple(GpuProcess(pid=p, command=f"rank{p}", user="ann", used_bytes=1 << 30) for p in pids)
        return Snapshot(ts=0.0, host="h", gpus=(GpuDevice(index=0, name="g", processes=procs),))

    reader = KmsgReader(str(tmp_path / "no-kmsg"))
    assert reader.status is not None and "not there" in reader.status
    events = [("oom_kill", {"source": "vmstat", "kills": 1})]
    name_victims(events, reader, snap(1, 2), snap(1))
    d = events[0][1]
    assert d["victims_from"] == "last sample" and [v["pid"] for v in d["victims"]] == [2]
    assert last_seen(snap(1), snap(1, 2)) == []


def test_a_file_read_as_the_kernel_log_from_its_end(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    log.write_bytes(b"6,1,1000,-;" + KILLED.encode() + b"\n")  # before the reader: not this recording's
    reader = KmsgReader(str(log))
    assert reader.status is None and reader.poll() == []
    with open(log, "ab") as f:
        f.write(b"6,2,2000000,-;" + SUMMARY.encode() + b"\n6,3,2000001,-;" + KILLED.encode() + b"\n")
    [v] = reader.poll()
    assert v.pid == 6047 and v.cgroup == "/process_api/2e97/oomt654"
    assert abs(v.ts - (time.time() - time.monotonic() + 2.000001)) < 1
    reader.close()


# -- a real OOM kill --------------------------------------------------------------------------------------------

def own_memory_cgroup() -> Path | None:
    """This process's memory cgroup directory (v1's memory controller or v2's unified tree), or None."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, rel = line.split(":", 2)
        if "memory" in controllers.split(","):
            d = Path("/sys/fs/cgroup/memory") / rel.lstrip("/")
            return d if (d / "memory.limit_in_bytes").exists() else None
        if controllers == "" and (Path("/sys/fs/cgroup") / rel.lstrip("/") / "memory.max").exists():
            return Path("/sys/fs/cgroup") / rel.lstrip("/")
    return None


@contextlib.contextmanager
def limited_cgroup(limit: int) -> Iterator[Path]:
    parent = own_memory_cgroup()
    if os.geteuid() != 0 or parent is None:
        pytest.skip("a real OOM kill needs root and a memory cgroup to make a child in")
    cg = parent / f"dltop-oom-{os.getpid()}"
    try:
        cg.mkdir()
        v2 = (cg / "memory.max").exists()
        (cg / ("memory.max" if v2 else "memory.limit_in_bytes")).write_text(str(limit))
        if v2 and (cg / "memory.swap.max").exists():
            (cg / "memory.swap.max").write_text("0")
    except OSError as e:
        pytest.skip(f"cannot make a memory-limited cgroup under {parent}: {e}")
    try:
        yield cg
    finally:
        for _ in range(50):
            with contextlib.suppress(OSError):
                cg.rmdir()
                break
            time.sleep(0.1)


HOG = """
import ctypes, os, sys
ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0)  # PR_SET_NAME: the command the kernel logs
with open(sys.argv[2], "w") as f:
    f.write(str(os.getpid()))
os.kill(os.getpid(), 19)  # SIGSTOP: the test moves it into the cgroup, then lets it go on
x = []
while True:
    x.append(bytearray(1 << 20))
"""


def test_a_real_oom_kill_is_named_from_the_kernel_log(tmp_path: Path) -> None:
    if kmsg_status() is not None:
        pytest.skip(f"the kernel log cannot be read here: {kmsg_status()}")
    reader = KmsgReader()
    pid = real_kill(tmp_path, "oom\x1bvictim")  # a command with an ESC in it, as another user may name theirs
    victims: list = []
    deadline = time.monotonic() + 10
    while not victims and time.monotonic() < deadline:
        victims = [v for v in reader.poll() if v.pid == pid]  # another kill on the machine is not ours
        time.sleep(0.05)
    reader.close()
    [v] = victims
    assert v.command == "oom\\x1bvictim"  # the kernel's own escape
    assert v.cgroup is not None and v.cgroup.endswith(f"/dltop-oom-{os.getpid()}") and v.uid == 0
    assert v.rss_bytes > 16 << 20 and abs(v.ts - time.time()) < 30
    line = describe_event("oom_kill", {"source": "vmstat", "kills": 1, "victims_from": "kmsg",
                                       "victims": [v.to_dict()]})
    assert f"killed pid {pid} oom\\x1bvictim (cgroup {v.cgroup}" in line and "\x1b" not in line


def real_kill(tmp_path: Path, comm: str) -> int:
    """Run a process named `comm` in a 48 MiB memory cgroup until the OOM killer kills it: its pid."""
    with limited_cgroup(48 << 20) as cg:
        pidfile = tmp_path / "pid"
        proc = subprocess.Popen([sys.executable, "-c", HOG, comm, str(pidfile)])
        while not pidfile.exists() or not pidfile.read_text():
            assert proc.poll() is None, "the hog ended before it said its pid"
            time.sleep(0.02)
        pid = int(pidfile.read_text())
        (cg / "cgroup.procs").write_text(str(pid))
        os.kill(pid, signal.SIGCONT)
        assert proc.wait(60) == -signal.SIGKILL
    return pid


def test_the_report_names_a_real_victim(tmp_path: Path) -> None:
    from dltop.model import Snapshot
    from dltop.recorder import Recorder
    from dltop.sources.memory import read_memory

    if kmsg_status() is not None:
        pytest.skip(f"the kernel log cannot be read here: {kmsg_status()}")
    rec_dir = tmp_path / "rec"
    with Recorder(str(rec_dir)) as rec:
        rec.write(Snapshot(ts=time.time(), host="h", memory=read_memory()))
        pid = real_kill(tmp_path, "victim\u202e")  # the kernel writes the bidi override's bytes as \xNN
        time.sleep(0.05)
        rec.write(Snapshot(ts=time.time(), host="h", memory=read_memory()))
        deadline = time.monotonic() + 10
        while rec.samples < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
    out = subprocess.run([sys.executable, "-m", "dltop", "report", str(rec_dir)], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "COLUMNS": "100"})
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "OOM KILLS: " in text
    assert f"pid {pid} victim\\xe2\\x80\\xae, cgroup /" in text and "(the kernel log)" in text, text
    assert f"killed pid {pid} victim\\xe2\\x80\\xae (cgroup /" in text  # the event line too
    assert "\u202e" not in text


def test_a_second_user_is_told_why_the_kernel_log_is_closed_to_it() -> None:
    import shutil

    from .conftest import REPO

    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run as a second user")
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
                        "from dltop.recorder.oom import KmsgReader; r = KmsgReader(); print(r.status); r.poll()"],
                       capture_output=True, text=True, timeout=60, cwd="/", env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    restricted = Path("/proc/sys/kernel/dmesg_restrict").read_text().strip() == "1"
    if restricted:
        assert "kernel.dmesg_restrict is 1: reading it needs CAP_SYSLOG" in r.stdout
    else:
        assert r.stdout.strip() == "None"
