"""The flight recorder misses nothing (issue 19): limits that need a unit and say what they remove, actions logged
once, typed times that land on the second typed, recordings that ended without a stop, gaps and their causes."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dltop.model import Snapshot
from dltop.recorder import Recorder, Recording, store
from tests.test_recorder import sampled, with_samples

SCENARIO = Path(__file__).resolve().parent / "data" / "gpu-scenarios" / "h100-2proc.json"


def dltop(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dltop", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "DLTOP_FAKE_NVML": str(SCENARIO)})


def _old_hours(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hours: int = 5) -> tuple[Path, float]:
    """A recording of `hours` closed segments, two samples each, the last one ending an hour ago."""
    snaps = sampled(tmp_path, monkeypatch, n=2)
    now = time.time()
    rec_dir = tmp_path / "rec"
    with Recorder(str(rec_dir), retain_s=None, max_bytes=None) as rec:
        for h in range(hours):
            for k in range(2):
                rec.write(dataclasses.replace(snaps[k], ts=now - (hours - h) * 3600 + k), wait=True)
    return rec_dir, now


# -- (12) a number without a unit -------------------------------------------------------------------------------

@pytest.mark.parametrize(("option", "value"), [("--retain", "7"), ("--retain", "3.5"), ("--max-size", "2"),
                                                ("--max-size", "2K")])
def test_a_limit_without_a_unit_or_too_small_is_a_usage_error_and_removes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, option: str, value: str) -> None:
    rec_dir, _ = _old_hours(tmp_path, monkeypatch, hours=2)
    before = sorted(os.listdir(rec_dir))
    r = dltop("record", "-o", str(rec_dir), option, value, "-i", "0.2")
    assert r.returncode == 2, r.stderr
    line = r.stderr.strip()
    assert "\n" not in line and line.startswith(f"dltop record: error: argument {option}: {value!r} ")
    assert any(why in line for why in ("has no unit: say 7d, 7h or 7m (0 keeps everything)",
                                       "has no unit: say 3.5d, 3.5h or 3.5m (0 keeps everything)",
                                       "has no unit: say 2G or 2M (0 switches the cap off)",
                                       "is 2.0 KiB: at least 16.0 MiB (0 switches the cap off)"))
    assert sorted(os.listdir(rec_dir)) == before


def test_the_limits_take_units_and_zero() -> None:
    from dltop.commands.record import _retain, _size

    assert _retain("7d") == 7 * 86400 and _retain("0") == 0 and _retain("90m") == 5400
    assert _size("2G") == 2 << 30 and _size("0") == 0 and _size("500MB") == 500_000_000


def test_retention_and_the_size_cap_say_what_they_remove(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rec_dir, now = _old_hours(tmp_path, monkeypatch)
    stems = with_samples(rec_dir)
    warned: list[str] = []
    Recorder(str(rec_dir), retain_s=2.5 * 3600, max_bytes=None, warn=warned.append).close()
    assert with_samples(rec_dir) == stems[3:]
    gone = [w for w in warned if w.startswith("removed")]
    assert gone == [f"removed 3 segments ({stems[0]} to {stems[2]}, 3s of samples, "
                    f"{gone[0].split(', ')[-1].split(')')[0]}): older than --retain 2h30m"]
    warned.clear()
    last = stems[-1]
    one = sum(os.path.getsize(rec_dir / (last + s)) for s in (store.CLOSED_SUFFIX, store.INDEX_SUFFIX))
    Recorder(str(rec_dir), retain_s=None, max_bytes=one + 4096, warn=warned.append).close()
    assert with_samples(rec_dir) == [last]
    assert [w for w in warned if w.startswith("removed 1 segment (")] and all(
        w.endswith(f"above --max-size {w.rsplit('--max-size ', 1)[1]}") for w in warned if w.startswith("removed"))
    assert any(stems[3] in w for w in warned)


# -- (14) an action once, a typed time on its second ------------------------------------------------------------

def test_a_plan_is_not_logged_as_an_action(tmp_path: Path) -> None:
    # The TUI measures before its dialog opens: that plan changed nothing, and was logged as one more action.
    from dltop.actions.runner import ActionRunner

    f = tmp_path / "data.bin"
    f.write_bytes(os.urandom(1 << 20))
    runner = ActionRunner()
    with Recorder(str(tmp_path / "rec")) as rec:
        runner.subscribe(rec.action_listener)
        assert runner.plan("evict", [str(f)], wait=True).error is None
        run = runner.start("evict", [str(f)])
        assert run.done.wait(30)
    runner.close()
    acts = [e.data for e in Recording(str(tmp_path / "rec")).events() if e.kind == "action"]
    assert [(a["step"], a["phase"]) for a in acts] == [("run", "started"), ("run", "finished")]


def test_a_typed_second_names_the_sample_shown_as_that_second() -> None:
    from dltop.recorder.times import index_typed

    base = 1_790_000_000.0
    times = [base + k + 0.4 for k in range(5)]  # samples fall between whole seconds
    assert index_typed(times, base + 2) == 2  # "…:02" shows the sample of …:02.4, not …:01.4
    assert index_typed(times, base + 2.5) == 2  # a time with a fraction: the one on screen then
    assert index_typed(times, base + 10) == 4  # past the end, and in a gap: the one on screen then
    assert index_typed([base, base + 5], base + 3) == 0
    assert index_typed(times, base) == 0  # before the first: the first


def test_a_typed_time_inside_a_gap_is_said_to_be() -> None:
    from dltop.recorder.times import gap_at, gap_note

    base = 1_790_000_000.0  # samples every second, then nothing for 3m12s
    times = [base + 0.4, base + 1.4, base + 2.4, base + 194.4, base + 195.4]
    clock = lambda t: time.strftime("%H:%M:%S", time.localtime(t))  # noqa: E731
    assert gap_note(times, base + 100, 1.0) == (
        f"{clock(base + 100)} is inside a gap of 3m12s ({clock(base + 2.4)}–{clock(base + 194.4)}, nothing "
        f"recorded): showing {clock(base + 2.4)}, the last sample before it")
    assert gap_at(times, base + 3, 1.0) is None  # …:03 is the second …:02.4 is shown in: the next was not due
    assert gap_at(times, base + 3.4, 1.0) == (base + 2.4, base + 194.4)  # due and missing
    assert gap_at(times, base + 193, 1.0) == (base + 2.4, base + 194.4)  # a whole second without a sample
    assert gap_at(times, base + 194, 1.0) is None  # …:194 names the sample taken within it (index_typed)
    assert gap_at(times, base + 100, 100.0) is None  # at 100 s a sample, 192 s is no gap (not over 3 intervals)
    assert gap_at(times, base + 1.5, 1.0) is None and gap_at(times, base + 300, 1.0) is None  # a sample; past the end
    assert "the nearest sample that could be read" in (gap_note(times, base + 100, 1.0, base + 1.4) or "")
    day = 86400.0  # a gap over midnight names the days
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(base + day))
    assert f"–{stamp}, nothing recorded" in (gap_note([base, base + day], base + 10, 1.0) or "")


# -- (11) actions from any shell reach every running recorder ------------------------------------------------------

async def test_an_action_from_a_shell_reaches_the_live_tuis_event_list(tmp_path: Path) -> None:
    # The live TUI tails the same journals: `v` (in the footer once an action was seen) lists an evict run by
    # another process, with its pid. The journal is this test's own (conftest: DLTOP_ROOT_JOURNAL_DIR).
    from dltop.sampler import ListFeed
    from dltop.tui.app import DltopApp
    from dltop.tui.screens.events import EventsScreen
    from tests.conftest import load_session

    data = tmp_path / "data.bin"
    data.write_bytes(os.urandom(1 << 20))
    session = load_session()
    app = DltopApp(ListFeed(session, start=len(session) - 1))
    async with app.run_test(size=(80, 24)) as pilot:
        assert not app.main.check_action("events", ())  # nothing seen yet: no `v` in the footer
        evict = dltop("evict", "--no-progress", str(data))
        assert evict.returncode == 0, evict.stderr
        deadline = time.monotonic() + 20
        while not app.main.check_action("events", ()):
            assert time.monotonic() < deadline, "the evict never reached the TUI"
            await pilot.pause(0.2)
        await pilot.press("v")
        await pilot.pause()
        assert isinstance(app.screen, EventsScreen)
        shown = [e for e in app.session.timeline.events() if e.data.get("target") == str(data)]
        assert [(e.data["action"], e.data["phase"]) for e in shown] == [("evict", "started"), ("evict", "finished")]
        assert all(e.data["pid"] not in (os.getpid(), None) for e in shown)


def test_a_warm_and_an_evict_from_a_shell_reach_a_running_recorder(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # The real thing: `dltop record` running, `dltop warm` and `dltop evict` run from another process on root's
    # real journal (/run/dltop); the report shows both, with who ran them. Other actions on the machine may be
    # in the journal too: only this test's target is looked for.
    monkeypatch.delenv("DLTOP_ROOT_JOURNAL_DIR")
    from tests.test_record_cli import recording, samples_in, wait_for

    data = tmp_path / "data.bin"
    data.write_bytes(os.urandom(4 << 20))
    rec_dir = tmp_path / "rec"
    with recording(rec_dir, "-i", "0.2") as proc:
        wait_for(lambda: samples_in(rec_dir) >= 2)
        evict = dltop("evict", "--no-progress", str(data))
        warm = dltop("warm", "--no-progress", str(data))
        assert evict.returncode == 0 and warm.returncode == 0, evict.stderr + warm.stderr
        n = samples_in(rec_dir)
        wait_for(lambda: samples_in(rec_dir) >= n + 2)  # looked at the journal since
        proc.send_signal(__import__("signal").SIGTERM)
        assert proc.wait(60) == 0
    acts = [e for e in Recording(str(rec_dir)).events() if e.kind == "action" and e.data.get("target") == str(data)]
    assert [(a.data["action"], a.data["phase"]) for a in acts] == [("evict", "started"), ("evict", "finished"),
                                                                   ("warm", "started"), ("warm", "finished")]
    assert all(a.data["uid"] == os.geteuid() and a.data["pid"] != proc.pid for a in acts)
    assert acts[0].data["pid"] != acts[2].data["pid"]  # two processes
    assert acts[3].data["outcome"] == "ok" and acts[3].data["done_bytes"] == 4 << 20
    report = dltop("report", str(rec_dir))
    assert report.returncode == 0, report.stderr
    assert f"warm {data}: ok (4.0 MiB)" in report.stdout and f"evict {data}: ok" in report.stdout
    assert f"pid {acts[2].data['pid']}" in report.stdout


def _journal_line(target: str, pid: int = 4242, **event: object) -> bytes:
    from dltop import journal

    ev = {"run_id": 1, "step": "run", "phase": "finished", "action": "warm", "target": target, "ts": time.time(),
          "paths": [target], "done_bytes": 10, "total_bytes": 10, "elapsed_s": 0.1, "files_done": 1,
          "outcome": "ok", "message": "", **event}
    line = journal.encode(ev, pid=pid)
    assert line is not None
    return line


def test_the_journal_is_believed_only_from_this_user_or_root_and_line_by_line(tmp_path: Path) -> None:
    from dltop.journal import MAX_LINE_BYTES, JournalTail

    mine, theirs = tmp_path / "mine.jsonl", tmp_path / "theirs.jsonl"
    mine.write_bytes(_journal_line("/old"))  # there before the recorder: old
    theirs.write_bytes(b"")
    os.chown(theirs, 65534, 65534)  # another user's file at a trusted path: a forgery could be anything
    tail = JournalTail([str(mine), str(theirs)], trusted_uids=[os.geteuid()], skip_pid=os.getpid())
    hostile = [b"not json", b'{"v":1,"pid":1,"event":{"action":"rm -rf"}}', b'{"v":2}',
               _journal_line("/x", done_bytes=-5), _journal_line("/x", ts=1.5).replace(b"1.5", b"1e400"),
               _journal_line("/x", outcome="pwned"), _journal_line("/x", paths="/not/a/list"),
               b'{"v":1,"ts":1,"pid":4242,"event":' + b"[" * 5000 + b"]" * 5000 + b"}",
               b"x" * (MAX_LINE_BYTES + 10)]
    with open(mine, "ab") as f:
        f.write(b"\n".join(hostile) + b"\n" + _journal_line("/good") + _journal_line("/own", pid=os.getpid()))
    with open(theirs, "ab") as f:
        f.write(_journal_line("/forged"))
    os.chmod(theirs, 0o644)
    got = tail.poll()
    assert [e["target"] for e in got] == ["/good"]
    assert got[0]["pid"] == 4242 and got[0]["uid"] == os.geteuid()
    assert tail.bad == len(hostile)
    assert "owned by uid 65534" in tail.refused[str(theirs)]
    assert tail.poll() == []  # read once
    os.chmod(mine, 0o666)  # anyone may write it now: not believed
    with open(mine, "ab") as f:
        f.write(_journal_line("/after"))
    assert tail.poll() == [] and "others can write it" in tail.refused[str(mine)]


def test_a_torn_journal_line_is_read_when_it_is_whole(tmp_path: Path) -> None:
    from dltop.journal import JournalTail

    path = tmp_path / "j.jsonl"
    path.write_bytes(b"")
    tail = JournalTail([str(path)], trusted_uids=[os.geteuid()])
    line = _journal_line("/a")
    with open(path, "ab") as f:
        f.write(line[:20])
    assert tail.poll() == []
    with open(path, "ab") as f:
        f.write(line[20:])
    assert [e["target"] for e in tail.poll()] == ["/a"] and tail.bad == 0


# -- (14) OpenMetrics that parsers take ---------------------------------------------------------------------------

def test_the_openmetrics_dump_parses_with_each_label_set_together(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # Two GPUs: their points interleaved in time order, which the OpenMetrics parser refuses ("clashing name" /
    # out of order). prometheus_client's parser, and promtool's backfill where it is installed.
    import shutil

    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    from dltop.recorder.dump import dump

    snaps = sampled(tmp_path, monkeypatch, n=4)
    rec_dir = tmp_path / "rec"
    with Recorder(str(rec_dir), retain_s=None, max_bytes=None) as rec:
        for s in snaps:
            rec.write(s, wait=True)
    import io

    for workers in (1, 2):
        out = io.StringIO()
        dump(Recording(str(rec_dir)), "openmetrics", out, workers=workers)
        text = out.getvalue()
        families = list(text_string_to_metric_families(text))  # raises on points of a label set apart
        sets = {f.name: {tuple(sorted(s.labels.items())) for s in f.samples} for f in families}
        many = [name for name, labels in sets.items() if len(labels) >= 2]
        assert many, "no family with two label sets: nothing tested"
        cpu = next(f for f in families if f.name == many[0])
        assert len(cpu.samples) == len(sets[many[0]]) * len(snaps)
    if shutil.which("promtool"):
        om = tmp_path / "rec.om"
        om.write_text(text)
        made = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(om), str(tmp_path / "db")],
                              capture_output=True, text=True, timeout=120)
        assert made.returncode == 0, made.stderr + made.stdout


# -- (10) an OOM kill late in a long recording; (13) gaps; (14) an end without a stop ---------------------------

def _report(rec_dir: Path) -> str:
    r = dltop("report", str(rec_dir), "--width", "100")
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_a_late_oom_kill_is_kept_over_early_hints_and_said_in_the_header(tmp_path: Path) -> None:
    base = time.time() - 7200
    with Recorder(str(tmp_path / "rec"), retain_s=None, max_bytes=None) as rec:
        rec.write(Snapshot(ts=base, host="h"), wait=True)
        for k in range(150):  # a flapping hint and GPU processes coming and going, all morning
            rec.event("hint", {"id": "memory.dirty", "state": "fired" if k % 2 == 0 else "cleared",
                               "severity": "warn", "text": "dirty"}, ts=base + k)
            rec.event("gpu_process", {"state": "started", "gpu": 0, "mig": None, "pid": 1000 + k,
                                      "command": "python", "user": "u", "used_bytes": 1}, ts=base + k + 0.5)
        rec.event("oom_kill", {"source": "vmstat", "kills": 1, "total": 1}, ts=base + 3600)
        rec.write(Snapshot(ts=base + 3601, host="h"), wait=True)
    out = _report(tmp_path / "rec")
    assert "OOM kill: 1 in the kernel (vmstat)" in out
    assert "OOM KILLS: 1 (1 event, first at" in out.split("\n\n")[0]  # in the header
    assert "hints: 75 firings, 75 clearings" in out


def test_gaps_are_listed_with_their_length_and_cause(tmp_path: Path) -> None:
    base = float(int(time.time()) - 7200)
    rec_dir = tmp_path / "rec"
    now = [base]  # the recorders' clock: their start and stop events at the times of these samples
    with Recorder(str(rec_dir), retain_s=None, max_bytes=None, block_samples=50, clock=lambda: now[0]) as rec:
        for k in range(20):
            rec.write(Snapshot(ts=base + k, host="h", uptime_s=float(k)), wait=True)
        rec.event("gap", {"cause": "write failed: No space left on device", "samples": 82, "from_ts": base + 20,
                          "to_ts": base + 101}, ts=base + 102)
        for k in range(102, 110):
            rec.write(Snapshot(ts=base + k, host="h"), wait=True)
        now[0] = base + 110
    now[0] = base + 699
    with Recorder(str(rec_dir), retain_s=None, max_bytes=None, clock=lambda: now[0]) as rec:  # 10 min on
        for k in range(700, 705):
            rec.write(Snapshot(ts=base + k, host="h"), wait=True)
    out = _report(rec_dir)
    gaps = out.split("Gaps\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert len(gaps) == 2, out
    assert "1m23s, ~82 samples missing: 82 samples not written (write failed: No space left on device)" in gaps[0]
    assert "9m51s, ~590 samples missing: the recorder was not running" in gaps[1]
    assert "gaps: 2 gaps" in out.split("\n\n")[0]


def test_a_damaged_frame_is_a_gap_of_the_samples_it_held(tmp_path: Path) -> None:
    base = float(int(time.time()) - 7200)
    rec_dir = tmp_path / "rec"
    with Recorder(str(rec_dir), retain_s=None, max_bytes=None, block_samples=200) as rec:
        for k in range(600):
            rec.write(Snapshot(ts=base + k, host="h"), wait=True)
    stem = with_samples(rec_dir)[0]
    import json

    index = json.loads((rec_dir / (stem + store.INDEX_SUFFIX)).read_text())
    middle = index["blocks"][1]
    zst = rec_dir / (stem + store.CLOSED_SUFFIX)
    raw = bytearray(zst.read_bytes())
    raw[middle["offset"] + middle["size"] // 2] ^= 0xFF  # one byte of the middle frame of three
    zst.write_bytes(bytes(raw))
    r = dltop("report", str(rec_dir), "--width", "100")
    assert r.returncode == 0, r.stderr
    assert "which held 200 samples" in r.stderr
    gaps = r.stdout.split("Gaps\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert len(gaps) == 1 and "200 samples in 1 damaged frame" in gaps[0] and "~200 samples missing" in gaps[0]


def test_a_recording_that_ended_without_a_stop_is_flagged(tmp_path: Path) -> None:
    import signal

    from tests.test_record_cli import recording, samples_in, wait_for

    rec_dir = tmp_path / "rec"
    with recording(rec_dir, "-i", "0.2") as proc:
        wait_for(lambda: samples_in(rec_dir) >= 2)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    out = _report(rec_dir)
    assert "ended without a stop at" in out.split("\n\n")[0]
    with recording(rec_dir, "-i", "0.2") as proc:  # running again: the run before it still ended badly
        wait_for(lambda: samples_in(rec_dir) >= 4)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    assert _report(rec_dir).split("\n\n")[0].count("ended without a stop at") == 1


def test_charts_break_at_a_gap() -> None:
    from dltop.recorder.report import _runs, _Series

    s = _Series([1.0, 2.0, 3.0, 100.0, 101.0], [1.0, 1.0, 1.0, 2.0, 2.0])
    assert _runs(s, [(3.0, 100.0)]) == [([1.0, 2.0, 3.0], [1.0, 1.0, 1.0]), ([100.0, 101.0], [2.0, 2.0])]
    assert _runs(s, []) == [(s.ts, s.values)]


async def test_the_replay_header_says_when_a_gap_is_crossed(tmp_path: Path) -> None:
    from dltop.timeline import Recorded
    from dltop.tui.app import DltopApp

    base = float(int(time.time()) - 3600)
    with Recorder(str(tmp_path / "rec"), retain_s=None, max_bytes=None) as rec:
        for t in (0, 1, 2, 300, 301):
            rec.write(Snapshot(ts=base + t, host="h"), wait=True)
    app = DltopApp(recorded=Recorded(Recording(str(tmp_path / "rec")), "rec"))
    async with app.run_test(size=(100, 24)) as pilot:
        await pilot.press("t")
        assert "gap" not in str(app.query_one("#header").render())
        await pilot.press("t")  # the last sample before the gap
        await pilot.pause()
        assert "before a gap of 4m58s" in str(app.query_one("#header").render())
        await pilot.press("t")
        await pilot.pause()
        assert "after a gap of 4m58s" in str(app.query_one("#header").render())


_TRIED: list[int] = []


def test_fuzz_the_journal_reader(tmp_path: Path) -> None:
    # Any bytes in a trusted journal: each line is an event or is left out, never an exception.
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from dltop.journal import JournalTail

    good = _journal_line("/d")

    @settings(max_examples=150, derandomize=True)
    @given(st.binary(max_size=600) | st.tuples(st.integers(0, len(good) - 1), st.binary(min_size=1, max_size=8)).map(
        lambda cut: good[: cut[0]] + cut[1] + good[cut[0] + len(cut[1]):]))
    def one(data: bytes) -> None:
        _TRIED.append(1)
        path = tmp_path / "j.jsonl"
        path.write_bytes(b"")
        tail = JournalTail([str(path)], trusted_uids=[os.geteuid()])
        path.write_bytes(data + b"\n")
        for event in tail.poll():
            assert event["action"] in ("warm", "evict", "lock", "clear") and isinstance(event["target"], str)

    one()
    print(f"journal reader: {len(_TRIED)} inputs tried")
    assert len(_TRIED) == 150
