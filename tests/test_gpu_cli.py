"""`dltop gpu`: the GPU processes of real processes on the fake NVML, filtered, sorted and grouped by the same
select_processes the GPU tab uses (the rows and their order agree with it), as text and as JSON."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dltop.model.gpu_query import ProcessQuery, select_processes
from dltop.sources.gpu import FakeBackend, GpuReader
from tests.test_gpu_procs import LAUNCHER, SLEEP, _on_gpu

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, Any], dict[str, int]]]:
    """A launcher's two ranks and one more process (its command line holding an escape) on the fake's GPU."""
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE)
    other = subprocess.Popen([sys.executable, "-c", SLEEP, "\x1b[2J"], stdout=subprocess.PIPE)
    ranks: list[int] = []
    try:
        assert launcher.stdout is not None and other.stdout is not None
        ranks = [int(x) for x in launcher.stdout.readline().split()]
        assert other.stdout.readline() == b"up\n"
        s = _on_gpu([*ranks, other.pid])
        path = tmp_path_factory.mktemp("gpu-cli") / "scenario.json"
        path.write_text(json.dumps(s))
        yield str(path), s, {"launcher": launcher.pid, "rank0": ranks[0], "rank1": ranks[1], "other": other.pid}
    finally:
        for p in (launcher, other):
            p.kill()
            p.wait()
        for pid in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


def _dltop(scenario: str, *args: str) -> str:
    env = {**os.environ, "DLTOP_FAKE_NVML": scenario, "PYTHONPATH": str(REPO)}
    got = subprocess.run([sys.executable, "-m", "dltop", "gpu", *args], capture_output=True, text=True, env=env,
                         timeout=60)
    assert got.returncode == 0, got.stderr
    return got.stdout


QUERIES = [((), ProcessQuery()), (("--sort", "pid", "--reverse"), ProcessQuery(sort="pid", reverse=True)),
           (("--tree",), ProcessQuery(tree=True))]


@pytest.mark.parametrize(("args", "query"), QUERIES)
def test_the_cli_lists_what_select_processes_selects_in_its_order(
        machine: tuple[str, dict[str, Any], dict[str, int]], args: tuple[str, ...], query: ProcessQuery) -> None:
    path, s, _ = machine
    want = [r.key for r in select_processes(GpuReader(lambda: FakeBackend(s)).read(), query)]
    got = json.loads(_dltop(path, "--json", *args))
    assert [r["key"] for r in got["rows"]] == want
    assert got["query"] == {"filter": query.filter, "sort": query.sort, "reverse": query.reverse, "tree": query.tree}
    text = _dltop(path, *args).splitlines()
    assert text[0].split()[:2] == ["GPU", "PID"]
    assert [line.split()[1] if line[0] != " " else line.split()[0] for line in text[1:]] == [
        str(r["pid"]) for r in got["rows"]]


def test_the_tree_puts_ranks_under_their_launcher_and_text_from_outside_is_escaped(
        machine: tuple[str, dict[str, Any], dict[str, int]]) -> None:
    path, _, pids = machine
    rows = json.loads(_dltop(path, "--json", "--tree"))["rows"]
    head = next(r for r in rows if r["process"] is None)
    assert (head["pid"], head["children"]) == (pids["launcher"], 2)
    at = rows.index(head)
    assert {r["pid"] for r in rows[at + 1:at + 3]} == {pids["rank0"], pids["rank1"]}
    assert all(r["depth"] == 1 for r in rows[at + 1:at + 3])
    text = _dltop(path, "--tree")
    assert "[2 ranks] " in text and "└ " in text and "├ " in text
    assert "\x1b" not in text and "\\x1b[2J" in text  # the escape shown, never sent to the terminal
    other = next(r for r in rows if r["pid"] == pids["other"])["process"]
    assert other["command"].endswith("\x1b[2J")  # JSON stays exact
    for name in ("user", "ppid", "host_rss_bytes", "cpu_percent", "started_at"):
        assert other[name] is not None, name


def test_the_filter_matches_as_the_tab_s_does(machine: tuple[str, dict[str, Any], dict[str, int]]) -> None:
    path, s, pids = machine
    rows = json.loads(_dltop(path, "--json", "--filter", str(pids["other"])))["rows"]
    assert [r["pid"] for r in rows] == [pids["other"]]
    want = select_processes(GpuReader(lambda: FakeBackend(s)).read(), ProcessQuery(filter="2J"))
    assert [r["pid"] for r in json.loads(_dltop(path, "--json", "--filter", "2J"))["rows"]] == [r.pid for r in want]
    assert _dltop(path, "--filter", "no such process").splitlines() == [
        "GPU  PID  USER  USED  SM%  CPU%  RSS  TIME  COMMAND"]


def _dltop_rc(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "dltop", "gpu", *args], capture_output=True, text=True, env=env,
                          timeout=60)


def test_a_recording_lists_the_processes_of_the_moment_asked(
        machine: tuple[str, dict[str, Any], dict[str, int]], tmp_path: Path) -> None:
    """--recording reads the sample at or before -t (the last by default): the rows of that moment, in the order
    select_processes gives them, with the moment said; a moment before the recording and -t alone are errors."""
    from dltop.model.snapshot import Snapshot
    from dltop.recorder import Recorder

    _, s, pids = machine
    first = GpuReader(lambda: FakeBackend(s)).read()
    gone = json.loads(json.dumps(s))
    g = gone["gpus"][0]
    g["compute_processes"] = [p for p in g["compute_processes"] if p["pid"] != pids["other"]]
    g["process_utilization"] = [p for p in g["process_utilization"] if p["pid"] != pids["other"]]
    later = GpuReader(lambda: FakeBackend(gone)).read()
    t0 = 1_790_000_000.0
    with Recorder(str(tmp_path / "rec"), retain_s=None, max_bytes=None) as recorder:
        recorder.write(Snapshot(ts=t0, host="n1", gpus=first), wait=True)
        recorder.write(Snapshot(ts=t0 + 1, host="n1", gpus=later), wait=True)
        recorder.write(Snapshot(ts=t0 + 2, host="n1"), wait=True)  # recorded without the GPU source
    rec = str(tmp_path / "rec")
    at_start = json.loads(_dltop_rc("--recording", rec, "-t", str(t0), "--json").stdout)
    assert at_start["ts"] == t0
    assert [r["key"] for r in at_start["rows"]] == [r.key for r in select_processes(first, ProcessQuery())]
    assert pids["other"] in [r["pid"] for r in at_start["rows"]]
    mid = json.loads(_dltop_rc("--recording", rec, "-t", str(t0 + 1.5), "--json").stdout)
    assert mid["ts"] == t0 + 1 and pids["other"] not in [r["pid"] for r in mid["rows"]] and mid["rows"]
    text = _dltop_rc("--recording", rec, "-t", str(t0 + 1)).stdout.splitlines()
    assert text[0].startswith("at ") and text[0].endswith("(recorded)")
    assert text[1].split()[:2] == ["GPU", "PID"] and len(text) == 2 + len(mid["rows"])
    last = _dltop_rc("--recording", rec)
    assert last.returncode == 1 and "recorded without the GPU source" in last.stdout
    before = _dltop_rc("--recording", rec, "-t", str(t0 - 60))
    assert before.returncode != 0 and "before the recording starts" in before.stderr
    assert "Traceback" not in before.stderr and len(before.stderr.strip().splitlines()) == 1
    alone = _dltop_rc("-t", "10m ago")
    assert alone.returncode != 0 and "needs --recording" in alone.stderr and "Traceback" not in alone.stderr


def test_a_time_inside_a_gap_of_the_recording_is_said_to_be(
        machine: tuple[str, dict[str, Any], dict[str, int]], tmp_path: Path) -> None:
    """-t inside a stretch without samples lists the sample before it, and says so (text and JSON)."""
    import time

    from dltop.model.snapshot import Snapshot
    from dltop.recorder import Recorder

    _, s, _ = machine
    part = GpuReader(lambda: FakeBackend(s)).read()
    t0 = 1_790_000_000.0
    with Recorder(str(tmp_path / "rec"), retain_s=None, max_bytes=None) as recorder:
        for t in (0.0, 1.0, 193.0):  # at 1 s, then nothing for 3m12s
            recorder.write(Snapshot(ts=t0 + t, host="n1", gpus=part), wait=True)
    rec = str(tmp_path / "rec")
    clock = lambda t: time.strftime("%H:%M:%S", time.localtime(t))  # noqa: E731
    said = (f"{clock(t0 + 100)} is inside a gap of 3m12s ({clock(t0 + 1)}–{clock(t0 + 193)}, nothing recorded): "
            f"showing {clock(t0 + 1)}, the last sample before it")
    text = _dltop_rc("--recording", rec, "-t", str(t0 + 100))
    assert text.returncode == 0 and text.stdout.splitlines()[1] == said, text.stdout + text.stderr
    js = json.loads(_dltop_rc("--recording", rec, "-t", str(t0 + 100), "--json").stdout)
    assert js["ts"] == t0 + 1 and js["gap"] == said and js["rows"]
    near = json.loads(_dltop_rc("--recording", rec, "-t", str(t0 + 1.5), "--json").stdout)
    assert near["ts"] == t0 + 1 and "gap" not in near  # the next sample was not yet due


def test_cpu_percent_is_over_a_second_as_top_s(machine: tuple[str, dict[str, Any], dict[str, int]],
                                               monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
                                               ) -> None:
    """The two reads are a second apart (CPU time counts in 10 ms ticks: 1% steps, not 2% over half a second),
    and the CPU % of each real process is known."""
    import time as real_time

    from dltop.cli import main

    path, _, _ = machine
    slept: list[float] = []
    wait = real_time.sleep  # the time module's own: the patch below replaces it everywhere

    def sleep(s: float) -> None:
        slept.append(s)
        wait(s)

    monkeypatch.setenv("DLTOP_FAKE_NVML", path)
    monkeypatch.setattr("dltop.commands.gpu.time.sleep", sleep)
    assert main(["gpu", "--json"]) in (0, None)
    assert slept == [1.0]
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert rows and all(r["process"]["cpu_percent"] is not None for r in rows)
