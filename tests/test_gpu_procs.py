"""Each GPU process's /proc facts (parent, host RSS, CPU %, start time) and SM %, read for real processes under a
fake NVML, the stat reader fuzzed; and the UI-free process query (filter, sort, tree, MIG once)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dltop.model import Snapshot, from_dict, to_dict
from dltop.model.gpu import GpuDevice, GpuProcess
from dltop.model.gpu_query import SORTS, ProcessQuery, select_processes
from dltop.sources.gpu import FakeBackend, GpuReader
from dltop.sources.gpu_procs import FIRST_READ, HostReader, Malformed, parse_stat

SCENARIOS = Path(__file__).parent / "data" / "gpu-scenarios"
SPIN = "import sys, time\nprint('up', flush=True)\nt = time.time() + 60\nwhile time.time() < t: pass\n"
SLEEP = "import time\nprint('up', flush=True)\ntime.sleep(60)\n"
# A launcher (the torchrun agent's place) that starts two ranks and holds no GPU memory itself.
LAUNCHER = ("import subprocess, sys, time\nkids = [subprocess.Popen([sys.executable, '-c', 'import time; "
            "time.sleep(60)']) for _ in range(2)]\nprint(' '.join(str(k.pid) for k in kids), flush=True)\n"
            "time.sleep(60)\n")


def scenario(name: str) -> dict[str, Any]:
    return json.loads((SCENARIOS / f"{name}.json").read_text())


def _start(code: str) -> tuple[subprocess.Popen[bytes], str]:
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert p.stdout is not None
    return p, p.stdout.readline().decode().strip()


def _on_gpu(pids: list[int], period_us: int | None = 100_000) -> dict[str, Any]:
    """h100-2proc with these pids as its processes, each sampled by NVML every `period_us` (None: once)."""
    s = scenario("h100-2proc")
    g = s["gpus"][0]
    template = g["compute_processes"][0]
    g["compute_processes"] = [{**template, "pid": pid, "used_bytes": (i + 1) << 30} for i, pid in enumerate(pids)]
    g["process_utilization"] = [{"pid": pid, "timestamp_us": 1_700_000_000_000_000, "sm": 10 * (i + 1), "mem": 1,
                                 **({"period_us": period_us} if period_us else {})} for i, pid in enumerate(pids)]
    return s


def _status_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_real_processes_carry_user_parent_rss_cpu_start_and_sm_in_the_snapshot() -> None:
    spin, _ = _start(SPIN)
    sleep, _ = _start(SLEEP)
    try:
        s = _on_gpu([spin.pid, sleep.pid])
        reader = GpuReader(lambda: FakeBackend(s))
        first = reader.read()
        assert isinstance(first, tuple)
        p0 = {p.pid: p for p in first[0].processes}  # type: ignore[union-attr]
        assert p0[spin.pid].cpu_percent is None and p0[spin.pid].unavailable["cpu_percent"] == FIRST_READ
        time.sleep(0.5)
        second = reader.read()
        assert isinstance(second, tuple)
        procs = {p.pid: p for p in second[0].processes}  # type: ignore[union-attr]
        boot = int(next(x for x in Path("/proc/stat").read_text().splitlines() if x.startswith("btime")).split()[1])
        for p in (spin, sleep):
            got = procs[p.pid]
            assert got.ppid == os.getpid()
            assert got.user == __import__("pwd").getpwuid(os.geteuid()).pw_name
            assert got.command is not None and got.command.startswith(sys.executable)
            assert got.host_rss_bytes is not None and abs(got.host_rss_bytes - _status_rss_bytes(p.pid)) < 1 << 20
            assert got.started_at is not None and abs(got.started_at - time.time()) < 60
            assert got.start_time_ticks is not None and got.started_at == boot + got.start_time_ticks / 100
            assert got.gpu_util_percent is not None  # sampled again every period: known on the second read too
        busy, idle = procs[spin.pid].cpu_percent, procs[sleep.pid].cpu_percent
        assert busy is not None and idle is not None
        assert busy > 20 and idle < 5, (busy, idle)  # a spinning process against a sleeping one, on a busy node
        # The JSON fields the issue names, and the round trip
        d = to_dict(Snapshot(ts=1.0, host="h", gpus=second))
        row = d["gpus"][0]["processes"][0]
        for name in ("host_rss_bytes", "cpu_percent", "started_at", "gpu_util_percent", "user", "command", "ppid"):
            assert row[name] is not None, name
        assert from_dict(Snapshot, json.loads(json.dumps(d))).gpus == second
    finally:
        for p in (spin, sleep):
            p.kill()
            p.wait()


def test_sm_utilization_unsupported_or_not_sampled_again_is_unavailable_with_the_reason() -> None:
    s = _on_gpu([os.getpid()], period_us=None)
    reader = GpuReader(lambda: FakeBackend(s))
    reader.read()
    (g,) = reader.read()  # type: ignore[misc]
    (p,) = g.processes  # type: ignore[misc]
    assert p.gpu_util_percent is None and "NVML_ERROR_NOT_FOUND" in p.unavailable["gpu_util_percent"]
    s["gpus"][0]["process_utilization"] = "NVML_ERROR_NOT_SUPPORTED"
    (g,) = GpuReader(lambda: FakeBackend(s)).read()  # type: ignore[misc]
    (p,) = g.processes  # type: ignore[misc]
    assert p.gpu_util_percent is None and "NVML_ERROR_NOT_SUPPORTED" in p.unavailable["gpu_util_percent"]


def test_a_pid_outside_this_namespace_has_each_fact_unavailable_with_why(tmp_path: Path) -> None:
    s = _on_gpu([4_000_000])
    (tmp_path / "proc").mkdir()
    (g,) = GpuReader(lambda: FakeBackend(s), str(tmp_path)).read()  # type: ignore[misc]
    (p,) = g.processes  # type: ignore[misc]
    for name in ("ppid", "host_rss_bytes", "cpu_percent", "started_at"):
        assert getattr(p, name) is None and "not in this PID namespace" in p.unavailable[name]


STAT = (b"4242 (py (x) y) S 1 4242 4242 0 -1 4194304 1 0 0 0 7 3 0 0 20 0 1 0 123456 1000 250 "
        b"18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n")


def test_stat_is_read_after_the_last_parenthesis() -> None:
    got = parse_stat(STAT)
    assert (got.ppid, got.cpu_ticks, got.start_time_ticks, got.rss_pages) == (1, 10, 123456, 250)
    arabic_three = " \u0663 4242".encode()
    for bad, why in ((b"", "no (comm)"), (b"1 (x) S 1 2", "fewer than 24"),
                     (STAT.replace(b" 250 ", b" -250 "), "field 24"), (STAT.replace(b" 1 4242", arabic_three), "field 4")):
        with pytest.raises(Malformed) as e:
            parse_stat(bad)
        assert why in str(e.value)


FUZZED = {"stat": 0}


@settings(max_examples=300, derandomize=True, deadline=None)
@given(st.one_of(st.binary(max_size=600),
                 st.lists(st.sampled_from([b"(", b")", b" ", b"1", b"-1", b"99999999999999999999999", b"x",
                                           b"\xff", b"\n", STAT[:40]]), max_size=60).map(b"".join)))
def test_stat_reader_never_raises_but_malformed(raw: bytes) -> None:
    FUZZED["stat"] += 1
    try:
        got = parse_stat(raw)
    except Malformed:
        return
    assert min(got.ppid, got.cpu_ticks, got.start_time_ticks, got.rss_pages) >= 0


def test_stat_fuzz_count() -> None:
    # Runs after the property above (file order): the count goes into docs/gpu.md.
    print(f"parse_stat fuzz inputs: {FUZZED['stat']}")
    assert FUZZED["stat"] in (0, 300)


def test_a_stat_file_that_is_a_fifo_or_damaged_is_a_reason(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "7").mkdir(parents=True)
    os.mkfifo(proc / "7" / "stat")
    (proc / "8").mkdir()
    (proc / "8" / "stat").write_bytes(b"8 (x) S zz")
    reader = HostReader(str(proc))
    assert "a FIFO" in dict(reader.read(7).unavailable)["cpu_percent"]
    assert "fewer than 24" in dict(reader.read(8).unavailable)["host_rss_bytes"]


def _stat_line(pid: int, start: int, utime: int = 7) -> bytes:
    return STAT.replace(b"4242 (py (x) y)", f"{pid} (x)".encode()).replace(b" 7 3 ", f" {utime} 3 ".encode()).replace(
        b"123456", str(start).encode())


def test_a_reused_pid_is_another_process_its_user_and_command_read_again(tmp_path: Path) -> None:
    """The command is kept per (pid, start time): a new process under the pid (a new start time in its stat)
    is read again, not shown with the old one's command; one whose stat has not moved has the same facts."""
    proc = tmp_path / "proc"
    (proc / "7").mkdir(parents=True)
    (proc / "stat").write_text("cpu 0 0 0 0\nbtime 1700000000\n")
    (proc / "7" / "stat").write_bytes(_stat_line(7, 500))
    (proc / "7" / "cmdline").write_bytes(b"python\0train.py\0")
    clock = [10.0]
    reader = HostReader(str(proc), clock=lambda: clock[0])
    first = reader.read(7)
    assert (first.command, first.start_time_ticks) == ("python train.py", 500)
    reader.end_tick()
    for _ in range(2):  # the second read computes a CPU %, the third finds it all as it was
        clock[0] += 1.0
        again = reader.read(7)
        reader.end_tick()
    clock[0] += 1.0
    assert reader.read(7) == again and again.cpu_percent == 0.0
    reader.end_tick()
    # the pid reused (written in place, as the kernel's file is read again through the same fd)
    (proc / "7" / "stat").write_bytes(_stat_line(7, 900))
    (proc / "7" / "cmdline").write_bytes(b"vllm\0serve\0")
    clock[0] += 1.0
    reused = reader.read(7)
    assert (reused.command, reused.start_time_ticks, reused.cpu_percent) == ("vllm serve", 900, None)
    assert dict(reused.unavailable)["cpu_percent"] == FIRST_READ
    reader.end_tick()


def test_a_process_asleep_gives_the_same_facts_and_its_cpu_percent_counts_from_its_last_full_interval(
        tmp_path: Path) -> None:
    """A process whose stat has not moved, at 0% CPU, has last tick's facts again; its next CPU % is
    over the interval since the last read at least MIN_INTERVAL_S after the one before: 50 ticks of CPU over
    1 s after a read 0.2 s ago is 50%, not 62.5% nor 25%."""
    proc = tmp_path / "proc"
    (proc / "7").mkdir(parents=True)
    (proc / "stat").write_text("cpu 0 0 0 0\nbtime 1700000000\n")
    (proc / "7" / "stat").write_bytes(_stat_line(7, 500, utime=100))
    (proc / "7" / "cmdline").write_bytes(b"python\0train.py\0")
    clock = [10.0]
    reader = HostReader(str(proc), clock=lambda: clock[0])
    seen = []
    for at in (10.0, 11.0, 12.0, 12.2):
        clock[0] = at
        seen.append(reader.read(7))
        reader.end_tick()
    assert seen[0].cpu_percent is None and [f.cpu_percent for f in seen[1:]] == [0.0, 0.0, 0.0]
    assert seen[3] == seen[2] == seen[1]  # nothing moved
    (proc / "7" / "stat").write_bytes(_stat_line(7, 500, utime=150))  # half a second of CPU (100 ticks a second)
    clock[0] = 13.0
    busy = reader.read(7)
    reader.end_tick()
    assert busy.cpu_percent == 50.0 and busy.ppid == seen[0].ppid and busy.command == "python train.py"
    # busy, then asleep again: its stat text as last tick's, its CPU % back to 0, so new facts
    clock[0] = 14.0
    asleep = reader.read(7)
    reader.end_tick()
    assert asleep.cpu_percent == 0.0 and asleep != busy
    reader.close()
    # a real process asleep, then killed: its kept fd says ESRCH and the reader says why
    sleep, _ = _start(SLEEP)  # up and asleep: its stat no longer moves (an exec still moving its RSS would)
    live = HostReader(clock=lambda: clock[0])
    try:
        facts = []
        for _ in range(4):
            clock[0] += 1.0
            facts.append(live.read(sleep.pid))
            live.end_tick()
        assert facts[3] == facts[2] and facts[2].cpu_percent == 0.0 and facts[2].ppid == os.getpid()
        sleep.kill()
        sleep.wait()
        clock[0] += 1.0
        gone = live.read(sleep.pid)
        assert gone.ppid is None and "not in this PID namespace" in dict(gone.unavailable)["ppid"]
    finally:
        sleep.kill()
        sleep.wait()
        live.close()


def test_the_stat_files_kept_open_are_closed_when_their_processes_go(tmp_path: Path) -> None:
    sleeps = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
    reader = HostReader()
    try:
        before = len(os.listdir("/proc/self/fd"))
        for p in sleeps:
            assert reader.read(p.pid).ppid == os.getpid()
        reader.end_tick()
        assert len(os.listdir("/proc/self/fd")) == before + 3
        sleeps[0].kill()
        sleeps[0].wait()
        gone = reader.read(sleeps[0].pid)  # its kept fd says ESRCH; the path is gone too
        assert gone.ppid is None and "not in this PID namespace" in dict(gone.unavailable)["ppid"]
        reader.read(sleeps[1].pid)
        reader.end_tick()  # the third not read this tick: its fd closed as the first's
        assert len(os.listdir("/proc/self/fd")) == before + 1
        reader.close()
        assert len(os.listdir("/proc/self/fd")) == before
    finally:
        for p in sleeps:
            p.kill()
            p.wait()


def test_a_process_that_did_not_move_reads_as_last_tick_s_and_one_that_moved_is_new() -> None:
    sleep, _ = _start(SLEEP)
    try:
        s = _on_gpu([sleep.pid, 4_000_000])  # and one not in this /proc
        clock = [100.0]
        # The driver's clock is the test's too: on the wall clock a 100 ms sample period could turn between two
        # ticks (a new SM sample, so a new model) on a slow machine.
        def backend() -> FakeBackend:
            b = FakeBackend(s)
            b.clock = lambda: clock[0]
            return b

        reader = GpuReader(backend, clock=lambda: clock[0])
        ticks = []
        for _ in range(3):
            clock[0] += 1.0
            ticks.append(reader.read()[0].processes)  # type: ignore[index]
        assert ticks[2][0] == ticks[1][0] and ticks[2][1] == ticks[1][1]  # asleep: CPU % 0.0 twice
        assert ticks[1][0] != ticks[0][0]  # its first CPU % came
        s["gpus"][0]["compute_processes"][0]["used_bytes"] += 1 << 20
        clock[0] += 1.0
        moved = reader.read()[0].processes  # type: ignore[index]
        assert moved[0] != ticks[2][0] and moved[0].used_bytes == ticks[2][0].used_bytes + (1 << 20)
        assert moved[1] == ticks[2][1]
        assert moved[0] == dataclasses.replace(ticks[2][0], used_bytes=moved[0].used_bytes)
    finally:
        sleep.kill()
        sleep.wait()


# -- the query ---------------------------------------------------------------------------------------------------


def _proc(pid: int, used: int | None, ppid: int = 1, **kw: Any) -> GpuProcess:
    return GpuProcess(pid=pid, used_bytes=used, ppid=ppid, start_time_ticks=pid * 10, user=kw.pop("user", "alice"),
                      command=kw.pop("command", f"python rank{pid}.py"), **kw)


def _gpus() -> tuple[GpuDevice, ...]:
    return (GpuDevice(index=0, processes=(_proc(11, 4 << 30, ppid=10), _proc(12, 4 << 30, ppid=10),
                                          _proc(30, 1 << 30, user="bob", command="vllm serve", cpu_percent=80.0))),
            GpuDevice(index=1, processes=(_proc(13, 4 << 30, ppid=10), _proc(31, None, ppid=30))))


def _keys(rows: list[Any]) -> list[tuple[str, int]]:
    return [(r.place, r.pid) for r in rows]


def test_memory_sort_biggest_first_ties_by_pid_then_gpu_unknown_last_and_reversed() -> None:
    rows = select_processes(_gpus())
    assert _keys(rows) == [("0", 11), ("0", 12), ("1", 13), ("0", 30), ("1", 31)]
    rev = select_processes(_gpus(), ProcessQuery(reverse=True))
    assert _keys(rev) == [("0", 30), ("0", 11), ("0", 12), ("1", 13), ("1", 31)]  # ties stay by pid; None last
    assert [r.key for r in rows][0] == "0:11:110"  # (place, pid, start time)


def test_every_sort_column_gives_an_order_that_does_not_change_with_the_input_order() -> None:
    gpus = _gpus()
    shuffled = tuple(replace(g, processes=tuple(reversed(g.processes))) for g in reversed(gpus))  # type: ignore[arg-type]
    q = ProcessQuery()
    for _ in SORTS:
        for rev in (False, True):
            qq = replace(q, reverse=rev)
            assert _keys(select_processes(gpus, qq)) == _keys(select_processes(shuffled, qq)), qq
        q = q.next_sort()
    assert q.sort == "memory"  # o cycles back


def test_filter_matches_pid_user_command_case_blind() -> None:
    assert _keys(select_processes(_gpus(), ProcessQuery(filter="BOB"))) == [("0", 30)]
    assert _keys(select_processes(_gpus(), ProcessQuery(filter="rank1"))) == [("0", 11), ("0", 12), ("1", 13)]
    assert _keys(select_processes(_gpus(), ProcessQuery(filter="31"))) == [("1", 31)]
    assert select_processes(_gpus(), ProcessQuery(filter="nothing like it")) == []


def test_tree_puts_ranks_under_their_launcher_and_a_child_under_its_gpu_parent() -> None:
    rows = select_processes(_gpus(), ProcessQuery(tree=True))
    shape = [(r.depth, r.pid, r.process is None, r.last) for r in rows]
    assert shape == [(0, 10, True, False), (1, 11, False, False), (1, 12, False, False), (1, 13, False, True),
                     (0, 30, False, False), (1, 31, False, True)]
    assert rows[0].children == 3


def test_mig_processes_are_listed_once_under_their_instance_with_gi_ci() -> None:
    reader = GpuReader(lambda: FakeBackend(scenario("a100-mig")))
    gpus = reader.read()
    assert isinstance(gpus, tuple)
    rows = select_processes(gpus)
    assert sorted(_keys(rows)) == [("0/1.0", 5511), ("0/5.0", 5602)]


def test_the_tree_is_read_from_a_replayed_snapshot_of_a_real_launcher() -> None:
    launcher, kids = _start(LAUNCHER)
    try:
        ranks = [int(x) for x in kids.split()]
        s = _on_gpu(ranks)
        snap = Snapshot(ts=1.0, host="h", gpus=GpuReader(lambda: FakeBackend(copy.deepcopy(s))).read())
        replayed = from_dict(Snapshot, json.loads(json.dumps(to_dict(snap))))
        rows = select_processes(replayed.gpus, ProcessQuery(tree=True))  # type: ignore[arg-type]
        assert [(r.depth, r.pid) for r in rows] == [(0, launcher.pid), (1, ranks[0]), (1, ranks[1])] or \
            [(r.depth, r.pid) for r in rows] == [(0, launcher.pid), (1, ranks[1]), (1, ranks[0])]
    finally:
        launcher.kill()
        launcher.wait()
        for pid in (int(x) for x in kids.split()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
