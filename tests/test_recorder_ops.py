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
    from dltop.tui.timeline import index_typed

    base = 1_790_000_000.0
    times = [base + k + 0.4 for k in range(5)]  # samples fall between whole seconds
    assert index_typed(times, base + 2) == 2  # "…:02" shows the sample of …:02.4, not …:01.4
    assert index_typed(times, base + 2.5) == 2  # a time with a fraction: the one on screen then
    assert index_typed(times, base + 10) == 4  # past the end, and in a gap: the one on screen then
    assert index_typed([base, base + 5], base + 3) == 0
    assert index_typed(times, base) == 0  # before the first: the first


async def test_b_with_a_clock_time_shows_that_second(tmp_path: Path) -> None:
    from dltop.tui.app import DltopApp
    from dltop.tui.screens.ask import AskScreen
    from dltop.tui.timeline import RecordingFeed

    base = float(int(time.time()) - 3600)
    snaps = [Snapshot(ts=base + k + 0.4, host="h") for k in range(6)]
    with Recorder(str(tmp_path / "rec"), retain_s=None, max_bytes=None) as rec:
        for s in snaps:
            rec.write(s, wait=True)
    app = DltopApp(RecordingFeed(Recording(str(tmp_path / "rec")), "rec"))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("b")
        assert isinstance(app.screen, AskScreen)
        await pilot.press(*time.strftime("%H:%M:%S", time.localtime(base + 3)), "enter")
        await pilot.pause()
        assert app.at == snaps[3].ts
