"""The Training pane (Pilot, and pictured as SVG at 80×24 and 120×40) on Snapshots recorded from a real run of
examples/train_tiny.py (tests/data/training-session.jsonl, made by scripts/capture_training.py), on probes of real
processes (two ranks of one job), on real probe files dltop refused, and with no probe at all.

Update the pictures with `pytest tests/test_training_pane.py --snapshot-update`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from textual.widgets import Static

from dltop.model import Snapshot
from dltop.model.probes import ProbesPart
from dltop.probe.files import open_private_dir, write_atomic
from dltop.sampler import ListFeed
from dltop.sources.probes import read_probes
from dltop.tui import charts
from dltop.tui.app import DltopApp
from dltop.tui.panes.training import SPARK_LABEL_WIDTH, SPARK_SCALE_WIDTH, probe_notes, rate_text
from tests.conftest import load_session
from tests.probe_helpers import REPO, probe_env

SESSION = "training-session.jsonl"
SIZES = [(80, 24), (120, 40)]


def _session() -> list[Snapshot]:
    return load_session(SESSION)


def _tab(app: DltopApp) -> str:
    return str([p.PANE_ID for p in app.panes].index("training") + 1)


async def _open(pilot) -> None:
    await pilot.press(_tab(pilot.app))
    await pilot.pause()
    pilot.app.show()
    await pilot.pause()


def _text(app: DltopApp, selector: str) -> str:
    return str(app.query_one(selector, Static).render())


def _shown(app: DltopApp) -> str:
    """What the tab shows of its jobs: the body, then (one job) its epoch table's header and rows."""
    parts = [_text(app, "#tr-body")]
    if app.query_one("#pane-training").has_class("-one-job"):
        parts += [_text(app, "#tr-epochs-head"), _text(app, "#tr-epochs-body")]
    return "\n".join(parts)


def _fits(app: DltopApp) -> None:
    body = app.query_one("#tr-body", Static)
    scroll = app.query_one("#tr-scroll")
    assert max(len(line) for line in _shown(app).splitlines()) <= body.size.width
    assert scroll.virtual_size.height <= scroll.size.height, "the job does not fit 80x24 without scrolling"


async def test_the_recorded_run_shows_its_epochs_and_sparklines() -> None:
    snaps = _session()
    app = DltopApp(ListFeed(snaps, start=len(snaps) - 1))
    async with app.run_test(size=(80, 24)) as pilot:
        await _open(pilot)
        assert app.query_one("#tabs").active == "tab-training"
        body = _shown(app)
        p = snaps[-1].probes.processes[0]  # type: ignore[union-attr]
        assert body.startswith(f"uid {p.uid}  pid {p.pid}") and "train_tiny" in body
        assert f"workers {p.loader_workers}" in body and f"data {p.data_dir}" in body
        lines = body.splitlines()
        # one row per epoch the probe kept, with its numbers
        for e in p.epochs:
            row = next(ln for ln in lines if ln.split()[:1] == [str(e.index)])
            assert f"{e.duration_s:.2f}s" in row and f"{e.data_wait_s:.2f}s" in row and str(e.steps) in row
            assert f"{100 * e.data_wait_s / e.duration_s:.0f}%" in row
            assert "n/a (no NVML)" in row  # the machine it was recorded on has no GPU: said, not zero
        # the sparklines drew the history: a column for each clock-aligned span of the axis' seconds that has a
        # Snapshot with a step (no column stretched to fill the chart: a column is a fixed number of seconds)
        step = next(ln for ln in lines if ln.startswith("Step"))
        times = [s.ts for s in snaps]
        width = app.query_one("#tr-body", Static).size.width
        per = charts.span_s(times) / (width - SPARK_LABEL_WIDTH - SPARK_SCALE_WIDTH)
        with_steps = {charts.column_of(s.ts, per) for s in snaps
                      if s.probes and any(q.step_time_s for q in s.probes.processes)}
        assert sum(ch in "▁▂▃▄▅▆▇█" for ch in step) == len(with_steps) < len(snaps)
        assert f"{1000 * p.step_time_s:.1f} ms" in step
        slowest = max(q.step_time_s or 0 for s in snaps if s.probes for q in s.probes.processes)
        assert step.rstrip().endswith(f"max {1000 * slowest:.3g} ms")  # the chart's scale
        axis = next(ln for ln in lines[lines.index(step):] if "now" in ln)  # the span and a column's seconds
        assert axis.strip().startswith(f"-{charts.span_text(charts.span_s(times))} ─") and "now" in axis
        _fits(app)


async def test_no_probe_says_how_to_add_one() -> None:
    snap = dataclasses.replace(_session()[0], probes=ProbesPart(dirs=("/dev/shm/dltop-0",)))
    app = DltopApp(ListFeed([snap]))
    async with app.run_test(size=(80, 24)) as pilot:
        await _open(pilot)
        body = _shown(app)
        assert "probe.start()" in body and "DLTOP_PROBE=1 python train.py" in body
        assert not app.query_one("#tr-notes", Static).display
        _fits(app)


async def test_refused_probe_files_are_in_the_notes(tmp_path: Path) -> None:
    d = tmp_path / "dltop"
    fd = open_private_dir(str(d))
    write_atomic(fd, f"{os.getpid()}.json", b"{not json")
    os.close(fd)
    (d / "1.json").symlink_to(tmp_path / "elsewhere")
    part = read_probes([(str(d), os.getuid())])
    app = DltopApp(ListFeed([dataclasses.replace(_session()[-1], probes=part)]))
    async with app.run_test(size=(80, 24)) as pilot:
        await _open(pilot)
        notes = _text(app, "#tr-notes")
        assert "1.json: a symlink in place of the file" in notes
        assert f"{os.getpid()}.json: malformed: not JSON" in notes


RANK = """
import time, torch, dltop.probe as probe
probe.start(interval_s=0.1)
probe.watch_model(torch.nn.Linear(4, 4))
for x in probe.track([torch.zeros(2, 4)] * 5):
    time.sleep(0.01)
probe.mark_epoch()
probe.publish()
print(flush=True)
time.sleep(60)
"""


async def test_ranks_of_one_job_are_grouped(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="torch is not installed (the test extra)")
    env = dict(WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="29511")
    procs = [subprocess.Popen([sys.executable, "-c", RANK], cwd=REPO, stdout=subprocess.PIPE, text=True,
                              env=probe_env(tmp_path, RANK=str(r), LOCAL_RANK=str(r), **env)) for r in (1, 0)]
    alone = subprocess.Popen([sys.executable, "-c", RANK], cwd=REPO, stdout=subprocess.PIPE, text=True,
                             env=probe_env(tmp_path))
    try:
        for p in [*procs, alone]:
            p.stdout.readline()  # type: ignore[union-attr]
        part = read_probes([(str(tmp_path / "dltop"), os.getuid())])
    finally:
        for p in [*procs, alone]:
            p.kill()
            p.wait()
    assert len(part.processes) == 3 and part.ignored == ()
    app = DltopApp(ListFeed([dataclasses.replace(_session()[-1], probes=part)]))
    async with app.run_test(size=(80, 24)) as pilot:
        await _open(pilot)
        body = _shown(app)
        rank0, rank1 = procs[1].pid, procs[0].pid
        assert f"2 ranks 0,1 of 2  pids {rank0},{rank1}" in body
        assert f"pid {alone.pid}" in body
        assert "epochs (rank 0's)" in body
        # two jobs overflow 80x24: no scroll bar (its partial cells read as stray sparkline pieces), a line
        # says what is out of view instead
        pane = app.query_one("#pane-training")
        assert not [w.id for w in pane.walk_children() if getattr(w, "show_vertical_scrollbar", False)
                    and w.styles.scrollbar_size_vertical and w.region.height]
        scroll = app.query_one("#tr-scroll")
        assert scroll.virtual_size.height > scroll.size.height
        below = scroll.virtual_size.height - scroll.size.height
        assert _text(app, "#tr-scroll-tag") == f"↓{below} lines out of view"


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_training_pane_picture(snap_compare, size: tuple[int, int]) -> None:
    snaps = _session()
    assert snap_compare(DltopApp(ListFeed(snaps, start=len(snaps) - 1)), terminal_size=size, run_before=_open)


def test_the_recording_is_a_real_train_tiny_run() -> None:
    """What the pictures show came from the probe: the recorded file reads back through the model exactly."""
    snaps = _session()
    last = snaps[-1].probes
    assert isinstance(last, ProbesPart) and len(last.processes) == 1
    p = last.processes[0]
    assert "examples/train_tiny.py" in p.cmd and p.torch_version and p.weights_bytes
    assert [e.index for e in p.epochs] == list(range(len(p.epochs))) and p.epochs
    raw = json.loads((REPO / "tests" / "data" / SESSION).read_text().splitlines()[-1])
    assert Snapshot.from_json(json.dumps(raw)) == snaps[-1]


def _epochs_shown(app: DltopApp) -> list[int]:
    """The epoch indexes in view in the tab's epoch table (one job: it scrolls on its own)."""
    scroll = app.query_one("#tr-epochs")
    rows = _text(app, "#tr-epochs-body").splitlines()
    top = round(scroll.scroll_y)
    return [int(ln.split()[0]) for ln in rows[top:top + scroll.size.height] if ln.split()[:1] != []]


async def test_sixteen_epochs_scroll_in_their_own_table(monkeypatch: pytest.MonkeyPatch) -> None:
    # one job of 19 epochs (the probe keeps 16): at 80x24 the newest are in view under the sparklines, the header
    # says how many are above; e and Home scroll to the oldest kept, the sparklines stay; at 120x40 all fit
    torch = pytest.importorskip("torch", reason="torch is not installed (the test extra)")
    import dltop.probe as probe
    from dltop.sources.probes import parse_probe

    monkeypatch.setattr(probe, "state", probe._State())
    for _ in range(probe.MAX_EPOCHS + 3):  # more than the probe keeps
        for _ in probe.track([torch.zeros(2)] * 3):
            pass
        probe.mark_epoch()
    part = ProbesPart(processes=(parse_probe(probe.report(), "/dev/shm/dltop-0/x.json", os.getuid()),))
    indexes = [e.index for e in part.processes[0].epochs]
    assert indexes == list(range(3, probe.MAX_EPOCHS + 3))  # the oldest three dropped by the probe
    app = DltopApp(ListFeed([dataclasses.replace(_session()[-1], probes=part)]))
    async with app.run_test(size=(80, 24)) as pilot:
        await _open(pilot)
        await pilot.pause()
        shown = _epochs_shown(app)
        assert shown == indexes[-len(shown):] and 3 <= len(shown) < len(indexes)  # the newest, in order
        hidden = len(indexes) - len(shown)
        assert _text(app, "#tr-epochs-head").rstrip().endswith(f"↑{hidden}")  # focused: no "e" to press
        assert "Step" in _text(app, "#tr-body")
        await pilot.press("e", "home")
        await pilot.pause()
        assert _epochs_shown(app)[0] == indexes[0]  # the oldest kept, scrolled to with the keys
        assert f"↓{hidden}" in _text(app, "#tr-epochs-head") and "Step" in _text(app, "#tr-body")
        pilot.app.show()  # a new tick does not pull the view back to the newest
        await pilot.pause()
        assert _epochs_shown(app)[0] == indexes[0]
        await pilot.press("end")
        await pilot.pause()
        assert _epochs_shown(app)[-1] == indexes[-1]
        _fits(app)
    async with DltopApp(ListFeed([dataclasses.replace(_session()[-1], probes=part)])).run_test(
            size=(120, 40)) as pilot:
        await _open(pilot)
        await pilot.pause()
        assert _epochs_shown(pilot.app) == indexes  # room for all of them
        assert "↑" not in _text(pilot.app, "#tr-epochs-head")


async def test_many_notes_fold_to_three_lines_and_n_shows_them_all(tmp_path: Path) -> None:
    # seven probe files dltop refused (each a real refusal): three lines say the first two and "+5 more";
    # n grows the box to all seven and folds it again; nothing of the sparklines or the job is lost
    d = tmp_path / "dltop"
    fd = open_private_dir(str(d))
    for pid in range(1, 8):
        write_atomic(fd, f"{pid}.json", b"{not json")
    os.close(fd)
    part = read_probes([(str(d), os.getuid())])
    assert len(part.ignored) == 7
    app = DltopApp(ListFeed([dataclasses.replace(_session()[-1], probes=dataclasses.replace(
        _session()[-1].probes, ignored=part.ignored))]))
    async with app.run_test(size=(80, 24)) as pilot:
        await _open(pilot)
        box = app.query_one("#tr-notes-box")
        folded = _text(app, "#tr-notes").splitlines()
        total = len(probe_notes(app.query_one("#pane-training").view.snapshot.probes))
        assert total >= 7 and len(folded) == 3 and folded[-1] == f"+{total - 2} more (n shows all the notes)"
        assert all("malformed: not JSON" in ln for ln in folded[:2]) and box.size.height == 3
        await pilot.press("n")
        await pilot.pause()
        shown = _text(app, "#tr-notes")
        assert all(f"{pid}.json: malformed: not JSON" in shown for pid in range(1, 8))
        assert box.size.height > 3 and "more" not in shown
        assert "Step" in _text(app, "#tr-body")
        pane = next(p for p in app.panes if p.PANE_ID == "training")
        assert "Training: Notes" in [c.title for c in pane.palette_commands()]
        await pilot.press("n")
        await pilot.pause()
        assert _text(app, "#tr-notes").splitlines() == folded and box.size.height == 3


STALLS = """
import time, dltop.probe as probe
probe.start(interval_s=0.1)
for i in probe.track(range(100)):
    if i == 5:
        print("stuck", flush=True)
        time.sleep(120)  # a hung step: the loop makes no more
"""
KILLED = """
import time, dltop.probe as probe
probe.start(interval_s=0.1)
for _ in probe.track(range(5)):
    pass
probe.mark_epoch()
probe.publish()
print("done", flush=True)
time.sleep(120)
"""
OOM = """
import torch, dltop.probe as probe
probe.start(interval_s=0.1)
for _ in probe.track(range(5)):
    pass
probe.mark_epoch()
raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
"""


async def test_stalled_and_exited_jobs_are_marked_and_exited_ones_stay_until_dismissed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Real processes: one hung in a step (stalled), one killed with SIGKILL, one ended by torch's
    OutOfMemoryError. The exited ones stay on the tab, marked with how they ended, until x dismisses them (issue
    18, items 7 and 9)."""
    pytest.importorskip("torch", reason="torch is not installed (the test extra)")
    from dltop.model import probes as probes_model
    monkeypatch.setattr(probes_model, "STALL_MIN_S", 1.0)
    run = {name: subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True, env=probe_env(tmp_path))
           for name, code in (("stalls", STALLS), ("killed", KILLED), ("oom", OOM))}
    try:
        for name in ("stalls", "killed"):
            run[name].stdout.readline()  # type: ignore[union-attr]
        run["killed"].kill()
        run["killed"].wait()
        assert run["oom"].wait(timeout=120) == 1
        deadline = time.monotonic() + 60
        while True:  # until the hung one has gone a second without a step
            part = read_probes([(str(tmp_path / "dltop"), os.getuid())])
            if any(p.stalled for p in part.processes) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        for p in run.values():
            p.kill()
            p.wait()
    assert [p.pid for p in part.processes] == [run["stalls"].pid] and part.processes[0].stalled
    assert {p.pid for p in part.exited} == {run["killed"].pid, run["oom"].pid}
    assert Snapshot.from_json(Snapshot(ts=1.0, host="h", probes=part).to_json()).probes == part
    app = DltopApp(ListFeed([dataclasses.replace(_session()[-1], probes=part)]))
    async with app.run_test(size=(80, 24)) as pilot:
        await _open(pilot)
        body = _shown(app)
        assert "STALLED  no step for" in body
        assert "EXITED" in body and "exit code 1: OutOfMemoryError: CUDA out of memory" in body
        assert "exited, cause unknown (no exit record" in body
        pane = next(p for p in app.panes if p.PANE_ID == "training")
        assert [c.title for c in pane.palette_commands()] == ["Training: Dismiss exited"]
        await pilot.press("x")
        await pilot.pause()
        body = _shown(app)
        assert "EXITED" not in body and f"pid {run['stalls'].pid}" in body and "Step" in body
        assert "stalled" in next(ln for ln in body.splitlines() if ln.startswith("Step"))
        assert list(pane.palette_commands()) == []  # nothing left to dismiss
        _fits(app)


async def test_an_epoch_of_nan_or_a_500_percent_wait_is_left_out_with_its_note(tmp_path: Path) -> None:
    # a probe file (any local user can write one) whose epochs claim NaN seconds or a data wait five times the
    # epoch: neither number reaches the screen; the good epoch does, and each bad one's reason is in the notes
    import dltop.probe as probe

    now = time.time()

    def epoch(index: int, duration_s: float, wait_s: float) -> dict:
        return {"index": index, "started_at": now - 60 + index, "ended_at": now - 59 + index,
                "duration_s": duration_s, "data_wait_s": wait_s, "steps": 10, "data_cached_delta_bytes": 0,
                "data_cached_source": "cachestat: 1 files under data_dir", "gpu_util": None}

    doc = {**probe.report(), "epochs": [epoch(0, 4.0, 1.0), epoch(1, float("nan"), 1.0),
                                        epoch(2, 2.0, 10.0), epoch(3, 3.0, float("inf"))]}
    d = tmp_path / "dltop"
    fd = open_private_dir(str(d))
    write_atomic(fd, f"{os.getpid()}.json", json.dumps(doc).encode())  # json writes NaN and Infinity
    os.close(fd)
    part = read_probes([(str(d), os.getuid())])
    assert [e.index for e in part.processes[0].epochs] == [0]
    app = DltopApp(ListFeed([dataclasses.replace(_session()[-1], probes=part)]))
    async with app.run_test(size=(80, 24)) as pilot:
        await _open(pilot)
        assert "+3 more (n shows all the notes)" in _text(app, "#tr-notes")
        await pilot.press("n")  # every note, the box grown
        await pilot.pause()
        body, notes = _shown(app), _text(app, "#tr-notes")
        assert "nan" not in body.lower() and "inf" not in body.lower()  # the notes say why, in words
        assert "500%" not in body + notes and not any(ln.split()[:1] in (["1"], ["2"], ["3"]) for ln in body.splitlines())
        row = next(ln for ln in body.splitlines() if ln.split()[:1] == ["0"])
        assert "4.00s" in row and "25%" in row
        assert "epochs[1] left out: duration_s: nan is not a finite number" in notes
        assert "epochs[2] left out: data_wait_s: 10 is longer than the epoch" in notes
        assert "epochs[3] left out: data_wait_s: inf is not a finite number" in notes
        _fits(app)


async def test_a_val_loader_has_its_own_line(tmp_path: Path) -> None:
    # a real probe that tracked a train and a val loader, read back from its file: the val line beside the
    # train numbers, the epochs the train loader's, within 80x24
    pytest.importorskip("torch", reason="torch is not installed (the test extra)")
    import dltop.probe as probe

    code = """
import time, torch, dltop.probe as probe
probe.start(interval_s=60)
for epoch in range(2):
    for x in probe.track([torch.zeros(2, 4)] * 8):
        time.sleep(0.002)
    for x in probe.track([torch.zeros(2, 4)] * 3, name="val"):
        time.sleep(0.001)
    probe.mark_epoch()
probe.publish()
print(flush=True)
time.sleep(60)
"""
    job = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True,
                           env=probe_env(tmp_path))
    try:
        job.stdout.readline()  # type: ignore[union-attr]
        part = read_probes([(str(tmp_path / "dltop"), os.getuid())])
    finally:
        job.kill()
        job.wait()
    p = part.processes[0]
    assert [e.steps for e in p.epochs] == [8, 8] and p.steps == 16
    assert [(v.name, v.steps) for v in p.loaders] == [("val", 6)] and p.loaders[0].step_time_s is not None
    app = DltopApp(ListFeed([dataclasses.replace(_session()[-1], probes=part)]))
    async with app.run_test(size=(80, 24)) as pilot:
        await _open(pilot)
        body = _shown(app)
        val = next(ln for ln in body.splitlines() if ln.startswith("val "))
        assert f"{1000 * p.loaders[0].step_time_s:.1f} ms" in val and "6 steps in all" in val
        assert next(ln for ln in body.splitlines() if ln.startswith("Step"))
        _fits(app)
    assert probe.MAIN_LOADER == "train"


async def test_a_real_jobs_throughput_and_loss_have_their_lines_and_columns(tmp_path: Path) -> None:
    # a real probe over a DataLoader (its batch_size), tokens from the batch, the loss logged, then a loss that
    # diverged: the lines say samples/s, tokens/s and NaN, the epoch table has the columns, within 80x24
    pytest.importorskip("torch", reason="torch is not installed (the test extra)")
    code = """
import time, torch, dltop.probe as probe
from torch.utils.data import DataLoader, TensorDataset
probe.start(interval_s=60)
loader = DataLoader(TensorDataset(torch.ones(24, 16)), batch_size=4)
for epoch in range(2):
    for (x,) in probe.track(loader, tokens=lambda b: b[0].numel()):
        time.sleep(0.002)
        probe.log(loss=x.mean() * (epoch + 1))
    probe.mark_epoch()
probe.log(loss=torch.tensor(float("nan")))
probe.publish()
print(flush=True)
time.sleep(60)
"""
    job = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True,
                           env=probe_env(tmp_path))
    try:
        job.stdout.readline()  # type: ignore[union-attr]
        part = read_probes([(str(tmp_path / "dltop"), os.getuid())])
    finally:
        job.kill()
        job.wait()
    p = part.processes[0]
    assert p.samples == 48 and p.tokens == 48 * 16 and p.samples_per_s and p.loss_nonfinite == "nan"
    app = DltopApp(ListFeed([dataclasses.replace(_session()[-1], probes=part)]))
    async with app.run_test(size=(80, 24)) as pilot:
        await _open(pilot)
        lines = _shown(app).splitlines()
        samples = next(ln for ln in lines if ln.startswith("Samples/s"))
        tokens = next(ln for ln in lines if ln.startswith("Tokens/s"))
        assert rate_text(p.samples_per_s) in samples and rate_text(p.tokens_per_s) in tokens
        assert next(ln for ln in lines if ln.startswith("Loss")).split()[1] == "NaN"
        head = next(ln for ln in lines if ln.startswith("Epoch"))
        assert "Samp/s" in head and "Tok/s" in head and "Loss" in head
        for e in p.epochs:
            row = next(ln for ln in lines if ln.split()[:1] == [str(e.index)])
            assert rate_text(e.samples_per_s) in row and f"{e.loss:.4g}" in row
        assert "throughput, loss: not given" not in "\n".join(lines)
        _fits(app)


async def test_a_job_that_appears_after_the_tab_opened_gets_the_keys() -> None:
    """The tab opened before any probe published (its body takes the keys, with nothing to scroll); when the job
    appears, its epoch table scrolls on its own and takes them: arrows work without Tab pressed two or three
    times first (issue 36, item 4)."""
    snaps = _session()
    empty = dataclasses.replace(snaps[-2], probes=dataclasses.replace(snaps[-1].probes, processes=()))
    app = DltopApp(ListFeed([empty]))
    async with app.run_test(size=(80, 24)) as pilot:
        await _open(pilot)
        assert app.focused is not None and app.focused.id == "tr-scroll"
        app.session.apply(snaps[-1])
        app.show()
        await pilot.pause()
        assert app.query_one("#pane-training").has_class("-one-job")
        assert app.focused is not None and app.focused.id == "tr-epochs"
