"""The GPU table's Command column and the tree's launcher row: what identifies a process when the room is short
(the script and its first arguments, not the interpreter's path), the whole command under the table and ← →
scrolling it, and a torchrun-like launcher of real ranks counted by its ranks (not its threads, not its rows)
with its user and command, read from a real process tree."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from textual.widgets import DataTable

from dltop.model.gpu_query import ProcessQuery, select_processes
from dltop.sampler import ListFeed
from dltop.text.gpu import process_table, short_command
from dltop.tui.app import DltopApp
from tests.test_gpu_pane import _fits, _rows, _text, gpu_snaps, scenario


@pytest.mark.parametrize(("command", "short"), [
    ("/usr/bin/python3 /home/a/train.py --lr 3e-4", "python3 train.py --lr 3e-4"),
    ("/usr/bin/python3.11 -u -W ignore /x/finetune.py --epochs 3", "python3.11 finetune.py --epochs 3"),
    ("/usr/bin/python3 /usr/local/bin/torchrun --nproc-per-node 4 train.py", "torchrun --nproc-per-node 4 train.py"),
    ("/opt/conda/bin/python -m vllm.entrypoints.openai.api_server --model m", "python -m vllm.entrypoints."
                                                                               "openai.api_server --model m"),
    ("/opt/llama.cpp/llama-server -m /models/q4.gguf", "llama-server -m /models/q4.gguf"),
    ("[python3]", "[python3]"),  # a zombie, as ps shows it
    ("python", "python"),
    ("", ""),
])
def test_short_command_names_the_script_not_the_interpreter_s_path(command: str, short: str) -> None:
    assert short_command(command) == short


LAUNCHER = textwrap.dedent("""
    import subprocess, sys, threading, time
    kids = [subprocess.Popen([sys.executable, "-c", "import threading, time\\n"
                              "[threading.Thread(target=time.sleep, args=(60,), daemon=True).start() for _ in range(3)]\\n"
                              "print('up', flush=True); time.sleep(60)", "--local-rank", str(i)],
                             stdout=subprocess.PIPE) for i in range(4)]
    for k in kids:
        k.stdout.readline()
    for _ in range(2):
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    print(" ".join(str(k.pid) for k in kids), flush=True)
    time.sleep(60)
""")


@pytest.fixture
def torchrun_like() -> tuple[subprocess.Popen[bytes], list[int]]:
    """A launcher (its own threads) with four ranks (three threads each), all real processes."""
    p = subprocess.Popen([sys.executable, "-c", LAUNCHER, "--nproc-per-node", "4", "train.py"],
                         stdout=subprocess.PIPE, start_new_session=True)
    assert p.stdout is not None
    ranks = [int(x) for x in p.stdout.readline().split()]
    assert len(ranks) == 4
    yield p, ranks
    os.killpg(p.pid, 9)
    p.wait()


def _scenario_with(ranks: list[int]) -> dict:
    """Two GPUs: ranks 0 and 1 on GPU 0, ranks 2 and 3 on GPU 1, and rank 0 on GPU 1 too (NCCL's context)."""
    s = scenario("two-gpus")
    for g, pids in zip(s["gpus"], ([ranks[0], ranks[1]], [ranks[2], ranks[3], ranks[0]]), strict=True):
        proto = g["compute_processes"][0]
        g["compute_processes"] = [dict(proto, pid=pid, used_bytes=(i + 1) << 30) for i, pid in enumerate(pids)]
        g.pop("process_utilization", None)
    return s


def test_the_launcher_row_counts_its_ranks_and_has_its_user_and_command(torchrun_like) -> None:
    launcher, ranks = torchrun_like
    snap = gpu_snaps(_scenario_with(ranks), 1)[0]
    rows = select_processes(snap.gpus, ProcessQuery(tree=True))
    head = next(r for r in rows if r.process is None)
    assert head.pid == launcher.pid
    assert head.children == 4  # four ranks: not their threads (16), not their rows (5)
    assert head.user == pwd.getpwuid(os.getuid()).pw_name
    assert head.command is not None and "--nproc-per-node 4 train.py" in head.command
    under = [r for r in rows if r.depth == 1]
    assert sorted({r.pid for r in under}) == sorted(ranks) and len(under) == 5
    text = process_table(snap.gpus, ProcessQuery(tree=True), time.time())
    assert f"[4 ranks] {sys.executable} -c" in text


async def test_the_command_column_the_selected_line_and_sideways_scroll(torchrun_like) -> None:
    _, ranks = torchrun_like
    app = DltopApp(ListFeed(gpu_snaps(_scenario_with(ranks), 2), start=1))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        table = app.query_one("#gpu-table", DataTable)
        table.focus()
        await pilot.press("g")
        await pilot.pause()
        rows = _rows(app)
        interpreter = Path(sys.executable).name
        launcher = next(r for r in rows if r[3].startswith("[4 ranks] "))
        assert launcher[2] == pwd.getpwuid(os.getuid()).pw_name
        ranks_cells = [r[3] for r in rows if r[3][:2] in ("├ ", "└ ")]
        assert ranks_cells and all(c[2:].startswith(f"{interpreter} -c import") for c in ranks_cells)
        assert not any(sys.executable in r[3] for r in rows)  # the interpreter's name, not its path
        table.move_cursor(row=rows.index(launcher))
        await pilot.pause()
        whole = _text(app, "#gpu-command")
        assert whole.startswith(f"{launcher[1]} {launcher[2]}: {sys.executable} -c") and "\n" in whole
        _fits(app)
        await pilot.press("right", "right")
        await pilot.pause()
        assert all(not r[3].startswith("[4 ranks]") for r in _rows(app))  # whole lines, from cell 17
        assert "from cell 17" in _text(app, "#gpu-query")
        _fits(app)
        await pilot.press("left", "left")
        await pilot.pause()
        assert _rows(app) == rows
        # s on the launcher's row tags its four ranks (rank 0's two rows both marked); again untags them
        from dltop.tui.panes.gpu import GpuPane

        table.move_cursor(row=rows.index(launcher))
        await pilot.press("s")
        await pilot.pause()
        assert sorted(pid for pid, _ in app.query_one(GpuPane).tagged) == sorted(ranks)
        assert sum(r[1].startswith("*") for r in _rows(app)) == 5
        table.move_cursor(row=rows.index(launcher))
        await pilot.press("s")
        await pilot.pause()
        assert not app.query_one(GpuPane).tagged


def test_a_process_s_history_is_its_own_readings_over_the_kept_history(torchrun_like) -> None:
    """The details opened from a rank's row: its GPU memory, SM %, CPU % and RSS over the Snapshots kept, each
    with the value now and its range; a reused pid (another start time) is another process, with no history."""
    import dataclasses

    from dltop.model.gpu_query import process_history
    from dltop.tui.screens.gpu_details import process_lines

    _, ranks = torchrun_like
    snaps = gpu_snaps(_scenario_with(ranks), 4)
    # the rank's memory grows by 1 GiB a tick in the history (as a job's does)
    grown = []
    for i, snap in enumerate(snaps):
        g0 = snap.gpus[0]  # type: ignore[index]
        procs = tuple(dataclasses.replace(p, used_bytes=(i + 1) << 30) if p.pid == ranks[0] else p
                      for p in g0.processes)  # type: ignore[union-attr]
        grown.append(dataclasses.replace(snap, gpus=(dataclasses.replace(g0, processes=procs),
                                                     *snap.gpus[1:])))  # type: ignore[index]
    start = next(p for p in grown[-1].gpus[0].processes if p.pid == ranks[0]).start_time_ticks  # type: ignore
    points = process_history(grown, 0, ranks[0], start)
    assert [p.used_bytes for _, p in points] == [1 << 30, 2 << 30, 3 << 30, 4 << 30]
    assert process_history(grown, 0, ranks[0], (start or 0) + 1) == []  # a reused pid: another process
    text = "\n".join(line.plain for line in process_lines(grown, 0, ranks[0], start, 74))
    assert f"pid {ranks[0]} " in text
    assert "4.0 GiB  (1.0 GiB–4.0 GiB)" in text
    assert "host RSS" in text and "CPU %" in text and "4 readings" in text
