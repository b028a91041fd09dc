"""The first screen: the tab dltop opens on (--tab, the config's tab, a recording's), and the hint line's order,
snooze and mute (issue 20, items 1 and 3)."""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

import pytest
from textual.widgets import OptionList, Static

from dltop import hints as hint_rules
from dltop.config import TAB_NAMES, Settings, load_config, settings_from_args
from dltop.errors import DltopError
from dltop.hints import Hint
from dltop.hints.base import wanted
from dltop.model import Snapshot, Unavailable
from dltop.model.gpu import GpuDevice
from dltop.recorder import Recorder, Recording
from dltop.recorder.reader import recorded_tab
from dltop.residency.scan import scan_paths
from dltop.sampler import ListFeed
from dltop.timeline import Recorded
from dltop.tui.app import DltopApp
from dltop.tui.panes import pane_classes
from dltop.tui.screens.help import HelpScreen
from tests.test_pagecache_util import ddir_fixture  # noqa: F401  (the `ddir` fixture)

HINTS_DIR = Path(__file__).resolve().parent.parent / "dltop" / "hints"


def _active(app: DltopApp) -> str:
    return str(app.query_one("#tabs").active).removeprefix("tab-")


def _snap(ts: float = 100.0, **parts: object) -> Snapshot:
    return Snapshot(ts=ts, host="h", **parts)  # type: ignore[arg-type]


def _dataset(tmp_path: Path) -> object:
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "a.bin").write_bytes(b"x" * 8192)
    return scan_paths((str(tmp_path / "ds"),))


def test_tab_names_are_the_panes() -> None:
    assert tuple(p.PANE_ID for p in pane_classes()) + ("cluster",) == TAB_NAMES
    assert pane_classes(cluster=True)[0].PANE_ID == "cluster"


@pytest.mark.parametrize("case", ["no gpu, datasets", "gpus"])
async def test_it_opens_on_the_tab_that_has_something(tmp_path: Path, case: str) -> None:
    # The wiring: the Session's choice (tests/test_session.py has each case) is the tab on screen.
    gpus: object = (GpuDevice(index=0, name="NVIDIA L40S"),) if case == "gpus" else ()
    datasets = _dataset(tmp_path) if case == "no gpu, datasets" else None
    settings = Settings(datasets=(str(tmp_path / "ds"),) if datasets else (), tab="cpu" if case == "--tab" else None)
    app = DltopApp(ListFeed([_snap(gpus=gpus, datasets=datasets)]), settings)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        want = {"no gpu": "pagecache", "no gpu, datasets": "datasets", "gpus": "gpu", "--tab": "cpu"}[case]
        assert _active(app) == want


class StillFeed(ListFeed):
    """Hands out the next Snapshot only when the test says (advance)."""

    async def stream(self, interval_s):  # type: ignore[no-untyped-def, override]
        return
        yield


async def test_the_tab_waits_for_the_gpu_source_but_not_for_a_user_who_picked_one() -> None:
    waiting = Unavailable("waiting for the first reading")
    gpu = (GpuDevice(index=0),)
    for press in ((), ("4",)):
        feed = StillFeed([_snap(100.0, gpus=waiting), _snap(101.0, gpus=gpu)])
        app = DltopApp(feed)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            assert _active(app) == "pagecache"  # nothing known yet
            if press:
                await pilot.press(*press)
            app.apply(feed.advance())  # NVML answers: GPUs are there
            await pilot.pause()
            assert _active(app) == ("cpu" if press else "gpu")


def test_tab_and_mute_in_the_config_and_on_the_command_line(tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text('tab = "Page cache"\nmute = ["cache-on-temporary-storage", "cache-on-temporary-storage"]\n')
    s = load_config(cfg)
    assert s.tab == "pagecache" and s.mute == ("cache-on-temporary-storage",)
    args = argparse.Namespace(config=str(cfg), tab="datasets")
    assert settings_from_args(args).tab == "datasets"  # the command line wins
    for bad, why in (('tab = "htop"', "is not a tab"), ("tab = 3", "is not a tab"),
                     ('mute = "x"', "mute must be a list"), ('mute = ["\\u001b[2J"]', "mute must be a list")):
        cfg.write_text(bad + "\n")
        with pytest.raises(DltopError, match=re.escape(why)) as e:
            load_config(cfg)
        assert "\n" not in str(e.value) and "\x1b" not in str(e.value)


async def test_a_replay_opens_on_the_tab_the_recording_showed(tmp_path: Path) -> None:
    # Samples stamped after the tab switches (the recorder stamps its events now): the replay starts after both.
    snaps = [_snap(time.time() + 60 + i) for i in range(2)]
    rec_dir = tmp_path / "rec"
    recorder = Recorder(str(rec_dir), retain_s=None, max_bytes=None)
    try:
        app = DltopApp(ListFeed(snaps), Settings(), recorder=recorder)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            await pilot.press("5")  # the Training tab, by the user
            await pilot.pause()
    finally:
        recorder.close()
    recording = Recording(str(rec_dir))
    views = [e.data["tab"] for e in recording.events() if e.kind == "view"]
    assert views == ["pagecache", "training"]
    start = recording.times()[-1]
    tab = recorded_tab(recording.events(), start)
    assert tab == "training"
    replay = DltopApp(settings=Settings(tab=tab), recorded=Recorded(recording, "rec", start))
    async with replay.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert _active(replay) == "training"


def test_every_hint_id_belongs_to_a_tab() -> None:
    ids = {m for f in HINTS_DIR.glob("*.py") for m in re.findall(r'id="([a-z0-9-]+)"', f.read_text())}
    assert len(ids) > 15
    assert {i: hint_rules.tab_of(i) for i in ids if hint_rules.tab_of(i) not in TAB_NAMES} == {}


CACHE_HINT = Hint("cache-on-temporary-storage", "info", "compile cache under /tmp", fix="set a cache dir")
GPU_HINT = Hint("gpu-kv-pool-full", "info", "KV cache of m is 99.8% full")


async def test_the_current_tabs_hint_comes_first_and_a_hint_can_be_snoozed_or_muted() -> None:
    app = DltopApp(ListFeed([_snap()]), Settings(tab="gpu", mute=()))
    async with app.run_test(size=(80, 24)) as pilot:
        app.session.hints = [CACHE_HINT, GPU_HINT]  # the cache hint is first by the rules' order
        app.draw()
        await pilot.pause()
        hints = app.query_one("#hints", Static)
        assert "KV cache" in str(hints.render()) and "+1 more" in str(hints.render())
        await pilot.press("6")  # the Caches tab: its own hint first
        await pilot.pause()
        assert "compile cache" in str(hints.render())
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        options = app.screen.query_one("#help-hints", OptionList)
        assert options.option_count == 2 and options.highlighted == 0
        await pilot.press("s")  # snooze the first: the cache hint
        await pilot.press("down", "m")  # mute the second
        await pilot.pause()
        assert app.session.quieted.state("cache-on-temporary-storage").startswith("snoozed")
        assert app.session.quieted.state("gpu-kv-pool-full") == "muted"
        assert "[muted]" in str(options.get_option_at_index(1).prompt)
        await pilot.press("escape")
        await pilot.pause()
        assert not hints.display  # both off the hint line
        await pilot.press("question_mark")
        await pilot.pause()
        assert app.screen.query_one("#help-hints", OptionList).option_count == 2  # still listed in ?
        await pilot.press("s")  # pressed again: back
        await pilot.press("escape")
        await pilot.pause()
        assert hints.display and "compile cache" in str(hints.render())


def stalled_jobs(history: object) -> Hint | None:
    """A rule as the real ones pick: the first of two stalled jobs the TUI does not pass over, the others counted."""
    jobs = [s for s in ("job pid 1234", "job pid 99") if wanted("training-stalled", s)]
    if not jobs:
        return None
    more = f" (+{len(jobs) - 1} stalled in other jobs)" if len(jobs) > 1 else ""
    return Hint("training-stalled", "warn", f"{jobs[0].removeprefix('job ')}: no step for 90s: stalled{more}",
                subject=jobs[0])


async def test_m_in_help_mutes_the_hint_for_its_job_and_M_for_every_job(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hint_rules, "all_rules", lambda: [stalled_jobs])
    app = DltopApp(ListFeed([_snap()]), Settings(tab="training", mute=()))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        line = app.query_one("#hints", Static)
        assert "pid 1234: no step for 90s: stalled (+1 stalled in other jobs)" in str(line.render())
        await pilot.press("question_mark")
        await pilot.pause()
        options = app.screen.query_one("#help-hints", OptionList)
        await pilot.press("m")  # this job: the rule names the next one
        await pilot.pause()
        assert [h.subject for h in app.session.line_hints("training")] == ["job pid 99"]
        assert str(options.get_option_at_index(0).prompt).startswith("[muted for this job] training-stalled")
        assert app.session.said[-1].text == "training-stalled (job pid 1234): muted for this job"
        await pilot.press("M")  # the kind: every job
        await pilot.pause()
        assert app.session.line_hints("training") == []
        assert str(options.get_option_at_index(0).prompt).startswith("[muted for every job]")
        assert app.session.said[-1].text == "training-stalled (job pid 1234): muted for every job"
        await pilot.press("M", "escape")  # back for every job but the one muted alone
        await pilot.pause()
        assert "pid 99: no step for 90s: stalled" in str(line.render())
        await pilot.press("question_mark")  # both listed: the one on the line, the muted one marked
        await pilot.pause()
        prompts = [str(o.prompt) for o in app.screen.query_one("#help-hints", OptionList).options]
        assert prompts[0].startswith("training-stalled: pid 99") and prompts[1].startswith("[muted for this job]")
        await pilot.press("down", "m")  # again: back
        await pilot.pause()
        assert app.session.line_hints("training")[0].subject == "job pid 1234"


async def test_help_at_80x24_scrolls_to_every_word() -> None:
    # `?` at 80x24 cut its text (a hint's full text to 4 lines, the sources' line to 3) and could not scroll.
    long = [Hint(f"hint-{i}", "warn", f"hint {i}: " + "a long explanation of what is wrong " * 6, fix="do this")
            for i in range(9)]
    app = DltopApp(ListFeed([_snap()]), Settings(tab="datasets", mute=()))
    async with app.run_test(size=(80, 24)) as pilot:
        app.session.hints = long
        app.draw()
        await pilot.pause()
        await pilot.press("question_mark")
        await pilot.pause()
        dialog = app.screen.query_one("#help-dialog")
        text = str(app.screen.query_one("#help-hint-text", Static).render())
        assert "…" not in text and text.count("a long explanation") == 6  # the chosen hint whole
        assert dialog.max_scroll_y > 0 and dialog.scroll_y == 0  # taller than the screen: it scrolls
        await pilot.press("end")
        await pilot.wait_for_scheduled_animations()
        assert dialog.scroll_y == dialog.max_scroll_y
        about = app.screen.query_one("#help-about", Static)
        assert about.region.bottom <= app.screen.size.height and "never as 0" in str(about.render())
        await pilot.press("down", "down")  # the arrows still choose a hint
        assert app.screen.query_one("#help-hints", OptionList).highlighted == 2


async def test_a_hint_muted_in_the_config_stays_off_the_line_and_is_listed_in_help() -> None:
    app = DltopApp(ListFeed([_snap()]), Settings(tab="caches", mute=("cache-on-temporary-storage",)))
    async with app.run_test(size=(80, 24)) as pilot:
        app.session.hints = [CACHE_HINT, GPU_HINT]
        app.draw()
        await pilot.pause()
        assert "KV cache" in str(app.query_one("#hints", Static).render())
        await pilot.press("question_mark")
        await pilot.pause()
        prompts = [str(o.prompt) for o in app.screen.query_one("#help-hints", OptionList).options]
        assert prompts[1].startswith("[muted (config)] cache-on-temporary-storage")


# -- item 8: the Datasets tab's footer and its add-folder box ----------------------------------------------------


def _footer_labels(app: DltopApp) -> list[str]:
    return [b.description for _node, b, enabled, _tip in app.screen.active_bindings.values() if b.show and enabled]


async def test_the_footer_says_unlock_on_a_locked_row(ddir: Path) -> None:
    from tests.test_datasets_pane import _rows, _wait_confirm, _wait_idle, live, make_dataset

    make_dataset(ddir)
    app = live(ddir, rescan_s=3600.0)
    async with app.run_test(size=(80, 24)) as pilot:
        await _wait_idle(app, pilot, lambda: bool(app.query_one("#ds-table").row_count))
        assert "Lock" in _footer_labels(app) and "Unlock" not in _footer_labels(app)
        for _ in range(50):  # into the dataset (the first Enter may come before the opening tab is settled)
            await pilot.press("enter")
            await pilot.pause(0.1)
            if [r.split()[0] for r in _rows(app)][:2] == ["train/", "val/"]:
                break
        assert [r.split()[0] for r in _rows(app)][:2] == ["train/", "val/"], _rows(app)  # lock its val folder
        await pilot.press("down", "l")
        await _wait_confirm(app, pilot)
        await pilot.press("y")
        await _wait_idle(app, pilot, lambda: bool(app.session.runner.held()))
        await pilot.pause()
        assert "Unlock" in _footer_labels(app) and "Lock" not in _footer_labels(app)
        await pilot.press("up")  # train: not locked
        await pilot.pause()
        assert "Lock" in _footer_labels(app) and "Unlock" not in _footer_labels(app)
        await pilot.press("down", "l")  # l on the locked row unlocks
        await pilot.pause()
        assert app.session.runner.held() == {} and "Lock" in _footer_labels(app)


def test_path_completion_completes_as_a_shell_does(tmp_path: Path) -> None:
    from dltop.tui.path_input import complete_path

    (tmp_path / "imagenet" / "train").mkdir(parents=True)
    (tmp_path / "imagenette").mkdir()
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / ".hidden").mkdir()
    base = str(tmp_path) + "/"
    assert complete_path(base + "ima") == (base + "imagenet", ["imagenet/", "imagenette/"])
    assert complete_path(base + "imagenet/t") == (base + "imagenet/train/", ["train/"])
    assert complete_path(base + "x") == (base + "x", [])
    assert complete_path(base) == (base, ["imagenet/", "imagenette/", "notes.txt"])  # dot files only when asked
    assert complete_path(base + ".h")[0] == base + ".hidden/"
    assert complete_path(base + "notes.txt/a") == (base + "notes.txt/a", [])  # not a folder: nothing, no raise


async def test_tab_in_the_add_folder_box_completes_and_keeps_the_focus(tmp_path: Path) -> None:
    (tmp_path / "imagenet" / "train").mkdir(parents=True)
    app = DltopApp(ListFeed([_snap()]), Settings(tab="datasets"))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("a")
        box = app.query_one("#ds-add")
        assert box.has_focus
        await pilot.press(*f"{tmp_path}/imag", "tab")
        for _ in range(100):
            await pilot.pause(0.02)
            if box.value.endswith("/"):
                break
        assert box.value == f"{tmp_path}/imagenet/" and box.has_focus  # Tab left the box before
        await pilot.press("t", "tab")
        for _ in range(100):
            await pilot.pause(0.02)
            if box.value.endswith("train/"):
                break
        assert box.value == f"{tmp_path}/imagenet/train/" and box.has_focus
        await pilot.press("enter")
        await pilot.pause()
        assert app.session.settings.datasets == (f"{tmp_path}/imagenet/train",)


def test_no_help_text_names_a_module(capsys: pytest.CaptureFixture[str]) -> None:
    # `dltop cpu --help` printed its module docstring, naming dltop.text.cpu to users.
    from dltop.cli import COMMANDS, main

    for command in sorted(COMMANDS):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        out = capsys.readouterr().out
        assert not re.search(r"\bdltop\.[a-z_]+", out), (command, out)


def test_psi_shows_avg10_avg60_avg300_within_80_columns() -> None:
    # avg10 alone cannot tell a burst from a lasting squeeze.
    from dltop.sources.memory import read_memory
    from dltop.tui.panes.pagecache import activity_text

    m = read_memory("/")
    if isinstance(m.pressure_memory, Unavailable):
        pytest.skip(f"no PSI here: {m.pressure_memory.reason}")
    p = m.pressure_memory
    for width in (76, 200):
        first = activity_text(m, None, width).plain.splitlines()[0]
        assert f"mem PSI some {p.some_avg10:.1f}/{p.some_avg60:.1f}/{p.some_avg300:.1f}%" in first
        assert len(first) <= width
    wide = activity_text(m, None, 200).plain.splitlines()[0]
    if p.full_avg10 is not None:
        assert f"full {p.full_avg10:.1f}/{p.full_avg60:.1f}/{p.full_avg300:.1f}%" in wide
