"""The TUI driven like a user drives it: real keys through Pilot, against recorded Snapshots or the live Sampler."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import pytest
from textual.widgets import Static

from dltop.config import Settings
from dltop.derive import memory_rates
from dltop.fmt import human_bytes, human_range
from dltop.model import MemoryPart, Snapshot
from dltop.sampler import ListFeed, Sampler
from dltop.sources.base import Source
from dltop.sources.memory import read_cgroup_memory, read_memory
from dltop.tui import charts
from dltop.tui.app import DltopApp
from dltop.tui.panes.pagecache import SPARK_LABEL_WIDTH, SPARK_SCALE_WIDTH, cgroup_text
from dltop.tui.screens.confirm import ConfirmScreen
from dltop.tui.screens.help import HelpScreen
from tests.dialogs import confirm_shown, help_rows


def _tab(app: DltopApp, pane_id: str) -> str:
    """The number key of a pane's tab."""
    return str([p.PANE_ID for p in app.panes].index(pane_id) + 1)


def _text(app: DltopApp, selector: str) -> str:
    return str(app.query_one(selector, Static).render())


async def test_keys_pause_refresh_help_quit(session: list[Snapshot]) -> None:
    app = DltopApp(ListFeed(session[:3], start=2))
    async with app.run_test(size=(80, 24)) as pilot:
        assert "every 1s" in _text(app, "#header")
        await pilot.press("p")
        assert app.session.head.at == session[2].ts and "PAUSED" in _text(app, "#header")
        await pilot.press("p")
        assert app.session.head.at is None and "PAUSED" not in _text(app, "#header")
        await pilot.press("plus")
        assert app.session.settings.refresh_s == 0.5 and "every 0.5s" in _text(app, "#header")
        await pilot.press("minus", "minus", "minus")
        assert app.session.settings.refresh_s == 5.0
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        labels = [label for _key, label in help_rows(app.screen)]
        assert {"Quit", "pause / live; play a replay", "refresh faster / slower", "switch tab"} <= set(labels)
        assert len(labels) == len(set(labels))  # + and = are one entry
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("q")
    assert app.return_code == 0


async def test_page_cache_pane_shows_recorded_numbers(session: list[Snapshot]) -> None:
    cut = 22
    app = DltopApp(ListFeed(session[:cut], start=cut - 1))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press(_tab(app, "pagecache"))
        await pilot.pause()
        cur, prev = session[cut - 1], session[cut - 2]
        assert isinstance(cur.memory, MemoryPart)
        sparks = app.query_one("#pc-sparks", Static)
        dirty = [float(s.memory.dirty_bytes) for s in session[:cut]]  # type: ignore[union-attr]
        lines = str(sparks.render()).splitlines()
        at = next(i for i, ln in enumerate(lines) if ln.startswith("Dirty"))
        width = sparks.size.width - SPARK_LABEL_WIDTH - SPARK_SCALE_WIDTH
        # The label sits on the chart's bottom row; the rows above it carry the rest of the same chart.
        bars = [ln[SPARK_LABEL_WIDTH:SPARK_LABEL_WIDTH + width] for ln in lines]
        cols = _columns(session[:cut], dirty, width)

        def drawn(k: int) -> list[str]:
            return charts.draw(cols, k, max(charts.shown(cols)))

        k = next(k for k in range(1, 8) if bars[at] == drawn(k)[-1])
        assert bars[at - k + 1: at + 1] == drawn(k)
        assert k > 1  # 120x40 has room for taller charts
        dirty_line = lines[at]
        assert f"{human_bytes(dirty[-1]):>9}" in dirty_line
        table = str(app.query_one("#pc-disks", Static).render()).splitlines()
        assert table[0].split() == ["Device", "r/s", "w/s", "rMB/s", "wMB/s", "await", "%util"]
        _, disks = memory_rates(prev, cur)
        assert disks
        for d in disks:
            row = next(line.split() for line in table if line.split()[0] == d.name)
            assert row[2] == f"{d.writes_per_s:.1f}"
            assert row[4] == f"{d.write_bytes_per_s / 2**20:.1f}"
        assert "Available" in _text(app, "#pc-summary")


async def test_available_is_scaled_to_its_band_and_labelled(session: list[Snapshot]) -> None:
    # The recorded MemAvailable moves between 23.13 and 23.19 GiB of 23.5: from 0 that was a solid bar.
    cut = 21
    avail = [float(s.memory.available_bytes) for s in session[:cut]]  # type: ignore[union-attr]
    total = session[cut - 1].memory.total_bytes  # type: ignore[union-attr]
    for size in ((80, 24), (120, 40)):
        app = DltopApp(ListFeed(session[:cut], start=cut - 1))
        async with app.run_test(size=size) as pilot:
            await pilot.press(_tab(app, "pagecache"))
            await pilot.pause()
            sparks = app.query_one("#pc-sparks", Static)
            lines = str(sparks.render()).splitlines()
            at = next(i for i, ln in enumerate(lines) if ln.startswith("Available"))
            top = next(i for i in range(at, -1, -1) if i == 0 or not lines[i - 1].strip())
            width = sparks.size.width - SPARK_LABEL_WIDTH - SPARK_SCALE_WIDTH
            bars = [ln[SPARK_LABEL_WIDTH:SPARK_LABEL_WIDTH + width] for ln in lines[top: at + 1]]
            assert all(len(ln) <= sparks.size.width for ln in lines)
            # Scaled from 1% of MemTotal below the highest value shown or printed (the band is narrower than
            # that); each column shows its lowest reading.
            cols = _columns(session[:cut], avail, width, "min")
            high = max(*charts.shown(cols), avail[-1])
            low = high - 0.01 * total
            assert bars == charts.draw(cols, len(bars), high, low)
            assert "".join(bars).strip(" █") and "▁" not in bars[-1]  # a slope, not a solid bar; no cliff
            scale = [ln[SPARK_LABEL_WIDTH + width:].strip() for ln in lines[top: at + 1]]
            if len(bars) == 1:
                assert scale == ["22.9–23.2 GiB"] == [human_range(low, high)]
            else:
                assert (scale[0], scale[-1]) == (human_bytes(high), human_bytes(low))
            # Charts that start at 0 say their max, and every chart's newest reading is in the same column.
            dirty = next(ln for ln in lines if ln.startswith("Dirty"))
            dirty_max = max(s.memory.dirty_bytes for s in session[:cut])  # type: ignore[union-attr]
            assert dirty[SPARK_LABEL_WIDTH + width:].strip() in ("max " + human_bytes(dirty_max), "0 B")
            assert dirty[SPARK_LABEL_WIDTH + width - 1] != " "


def _columns(history: list[Snapshot], values: list[float], width: int, keep: charts.Keep = "max") -> charts.Columns:
    """The columns the Page cache pane draws of `values` (one per Snapshot of `history`)."""
    times = [s.ts for s in history]
    return charts.time_columns(list(zip(times, values, strict=True)), times[-1], width, charts.span_s(times),
                               charts.cadence_s(times), keep)


async def test_too_small_terminal_says_so(session: list[Snapshot]) -> None:
    app = DltopApp(ListFeed(session[:2], start=1))
    async with app.run_test(size=(60, 20)) as pilot:
        assert app.query_one("#too-small").display
        assert "60×20" in _text(app, "#too-small") and "80×24" in _text(app, "#too-small")
        assert not app.query_one("#tabs").display
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        assert not app.query_one("#too-small").display and app.query_one("#tabs").display


async def test_live_ui_stays_responsive_with_a_hung_source() -> None:
    release = threading.Event()

    def hang():
        release.wait(30)
        return None

    sampler = Sampler([Source("memory", 0.1, lambda: read_memory("/"), follows_refresh=True),
                       Source("cpu", 0.1, hang, timeout_s=0.2)])
    app = DltopApp(sampler, Settings(refresh_s=0.25))
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause(0.8)
            await pilot.press("p")  # the key is handled at once although one source never answers
            assert "PAUSED" in _text(app, "#header")
            assert "cpu" in _text(app, "#header") and "slow" in _text(app, "#header")
            assert isinstance(app.session.history[-1].memory, MemoryPart)
            assert len(app.session.history) >= 2
    finally:
        release.set()


async def test_a_tick_that_lands_while_the_screen_is_torn_down_is_dropped(session: list[Snapshot]) -> None:
    # A feed's Snapshot may reach the app after Textual has removed the screen's widgets on exit (seen on a
    # loaded CI machine: NoMatches for #header from the feed's worker). It must be dropped, not crash the exit.
    app = DltopApp(ListFeed(session[:2], start=1))
    async with app.run_test(size=(80, 24)):
        pass
    app.apply(replace(session[2], ts=session[2].ts + 1))  # no widgets left: nothing to draw on, no error
    assert app.session.history[-1].ts == session[2].ts + 1  # still kept (the recorder listens to _apply)


async def test_hint_line_shows_the_squeeze(session: list[Snapshot]) -> None:
    from dataclasses import replace

    from dltop.model import Pressure

    base = session[-1]
    assert isinstance(base.memory, MemoryPart) and base.memory.total_bytes
    total = base.memory.total_bytes
    squeezed = [
        replace(base, ts=base.ts + i, memory=replace(base.memory, available_bytes=total // 30, cached_bytes=total // 2,
                                                     shmem_bytes=total // 3,
                                                     pressure_memory=Pressure(2.0 + 3 * i, 1.0, 0.5, 10 + i)))
        for i in range(3)
    ]
    app = DltopApp(ListFeed(squeezed, start=2))
    async with app.run_test(size=(80, 24)):
        assert app.query_one("#hints").display
        assert "OOM-killed" in _text(app, "#hints")


async def test_palette_offers_the_actions(session: list[Snapshot]) -> None:
    app = DltopApp(ListFeed(session[:2], start=1))
    async with app.run_test(size=(80, 24)):
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert {"Pause / resume", "Refresh faster", "Refresh slower", "Help", "Show Page cache"} <= set(titles)


async def test_ctrl_c_quits_like_top(session: list[Snapshot]) -> None:
    app = DltopApp(ListFeed(session[:2], start=1))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("ctrl+c")
    assert app.return_code == 0 and not app.is_running


async def test_ctrl_c_quits_from_a_dialog_too(session: list[Snapshot]) -> None:
    # The main screen's keys stop at a dialog; Ctrl-C is the app's own (priority) key and does not.
    app = DltopApp(ListFeed(session[:2], start=1))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("q")  # the dialog's own q closes it: the app's q never reaches past a dialog
        assert not isinstance(app.screen, HelpScreen) and app.is_running
        await pilot.press("question_mark")
        await pilot.press("ctrl+c")
    assert app.return_code == 0 and not app.is_running


def _dataset_snapshot(tmp_path) -> Snapshot:
    from dltop.residency.scan import scan_paths

    (tmp_path / "ds" / "train").mkdir(parents=True)
    (tmp_path / "ds" / "train" / "a.bin").write_bytes(b"x" * 65536)
    return Snapshot(ts=1.0, host="h", datasets=scan_paths((str(tmp_path / "ds"),)))


async def test_palette_honours_read_only(tmp_path) -> None:
    snap = _dataset_snapshot(tmp_path)
    for read_only in (False, True):
        app = DltopApp(ListFeed([snap]), Settings(read_only=read_only, datasets=(str(tmp_path / "ds"),)))
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press(_tab(app, "datasets"))
            await pilot.pause()
            titles = [c.title for c in app.get_system_commands(app.screen)]
            offered = {"Datasets: Warm", "Datasets: Evict", "Datasets: Lock"} & set(titles)
            assert offered == (set() if read_only else {"Datasets: Warm", "Datasets: Evict", "Datasets: Lock"})


async def test_help_lists_the_panes_keys_even_when_not_in_the_footer(tmp_path) -> None:
    app = DltopApp(ListFeed([_dataset_snapshot(tmp_path)]))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press(_tab(app, "datasets"), "question_mark")
        labels = [label for _key, label in help_rows(app.screen)]
        assert {"Open", "Back", "Warm", "Evict", "Quit"} <= set(labels)


async def test_palette_offers_dataset_actions_from_any_tab(tmp_path) -> None:
    app = DltopApp(ListFeed([_dataset_snapshot(tmp_path)]), Settings(datasets=(str(tmp_path / "ds"),)))
    async with app.run_test(size=(80, 24)) as pilot:
        assert app.query_one("#tabs").active == "tab-datasets"  # no GPU, datasets given: it opens there
        await pilot.press("1")
        assert app.query_one("#tabs").active == "tab-gpu"
        assert any(c.title == "Datasets: Warm" for c in app.get_system_commands(app.screen))
        # The real palette: the entry shows the Datasets tab, then asks for the plan of its selection.
        await pilot.press("ctrl+p")
        await pilot.pause(0.2)
        await pilot.press(*"Datasets: Warm")
        await pilot.pause(0.5)
        await pilot.press("enter")
        for _ in range(100):
            if isinstance(app.screen, ConfirmScreen):
                break
            await pilot.pause(0.05)
        assert isinstance(app.screen, ConfirmScreen) and "Warm" in confirm_shown(app.screen)[0]
        assert app.query_one("#tabs").active == "tab-datasets"


async def test_no_pane_key_acts_while_the_panes_are_hidden(tmp_path) -> None:
    app = DltopApp(ListFeed([_dataset_snapshot(tmp_path)]), Settings(datasets=(str(tmp_path / "ds"),)))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press(_tab(app, "datasets"))
        await pilot.resize_terminal(60, 15)
        await pilot.pause()
        await pilot.press("e", "w", "l")
        await pilot.pause(0.3)
        assert not isinstance(app.screen, ConfirmScreen) and app.session.runner.busy is None
        assert not [c for c in app.get_system_commands(app.screen) if c.title.startswith("Datasets:")]
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        await pilot.press("e")  # visible again: the key works, and asks first
        for _ in range(100):
            if isinstance(app.screen, ConfirmScreen):
                break
            await pilot.pause(0.05)
        assert isinstance(app.screen, ConfirmScreen)


async def test_read_only_keys_say_why(tmp_path) -> None:
    app = DltopApp(ListFeed([_dataset_snapshot(tmp_path)]), Settings(read_only=True, datasets=(str(tmp_path / "ds"),)))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press(_tab(app, "datasets"), "w")
        await pilot.pause()
        said = [s.text for s in app.session.said]
        assert any("read-only" in m for m in said) and not isinstance(app.screen, ConfirmScreen)


async def test_a_tab_key_without_a_tab_says_so(session: list[Snapshot]) -> None:
    app = DltopApp(ListFeed(session[:2], start=1))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("7")
        await pilot.pause()
        assert any("no tab 7" in s.text for s in app.session.said)


async def test_help_fits_80x24_on_every_tab(tmp_path) -> None:
    from textual.widgets import OptionList

    from dltop.hints import Hint

    app = DltopApp(ListFeed([_dataset_snapshot(tmp_path)]), Settings(datasets=(str(tmp_path / "ds"),)))
    # Seven hints as long as the real ones (each took 3-5 lines of the list, and pushed the keys and the about
    # line off the screen).
    many = [Hint(f"hint-{i}", "warn", f"hint number {i}: " + "something is off here " * (4 + i),
                 fix="do this about it " * 5) for i in range(7)]
    async with app.run_test(size=(80, 24)) as pilot:
        for tab in [str(i) for i in range(1, len(app.panes) + 1)]:
            for hints in ([], many) if tab == "1" else (many,):
                app.session.hints = hints
                app.draw()
                await pilot.press(tab, "question_mark")
                await pilot.pause()
                assert isinstance(app.screen, HelpScreen)
                rows = dict(help_rows(app.screen))
                assert "+" not in rows.get("+/-", "+")  # keys by their names, not "plus,equals_sign"
                dialog = app.screen.query_one("#help-dialog")
                assert dialog.outer_size.height <= 24
                used = sum(w.outer_size.height for w in dialog.children)
                # what does not fit scrolls: every line is reachable (PgDn), none is cut
                assert used <= dialog.content_size.height + dialog.max_scroll_y, (
                    f"help on tab {tab} is cut at 80x24: {[(w.id, w.outer_size.height) for w in dialog.children]}")
                assert app.screen.query_one("#help-about").size.height >= 1
                if hints:
                    options = app.screen.query_one("#help-hints", OptionList)
                    assert options.option_count == 7 and options.virtual_size.height == 7  # a line each
                    assert options.size.height >= 2
                    assert app.screen.query_one("#help-hint-keys").size.height == 1
                    text = app.screen.query_one("#help-hint-text", Static)
                    assert str(text.render()).startswith("hint-0: hint number 0")
                    await pilot.press("down")  # the chosen hint's text follows the highlight
                    await pilot.pause()
                    assert str(text.render()).startswith("hint-1: hint number 1")
                await pilot.press("escape")


async def test_a_long_hint_is_cut_to_two_lines(session: list[Snapshot]) -> None:
    from dataclasses import replace

    from dltop.hints import Hint

    app = DltopApp(ListFeed(session[:2], start=1), Settings(tab="pagecache"))
    async with app.run_test(size=(80, 24)) as pilot:
        app.session.hints = [Hint("page-cache-x", "warn", "word " * 40, fix="do this " * 20)]
        app.draw()
        await pilot.pause()
        widget = app.query_one("#hints", Static)
        assert widget.size.height == 2 and "? shows all" in _text(app, "#hints")
        await pilot.press("1")  # another tab's hint takes one line of the GPU tab, not two
        await pilot.pause()
        assert widget.size.height == 1 and "? shows all" in _text(app, "#hints")
        await pilot.press("2")
        app.session.hints = [replace(app.session.hints[0], text="short", fix="")]
        app.draw()
        await pilot.pause()
        assert _text(app, "#hints").strip() == "! short"


async def test_cgroup_line_names_the_version_and_never_calls_an_unread_limit_none(
        session: list[Snapshot], tmp_path: Path) -> None:
    from tests.test_memory import GIB, V1_NO_LIMIT, V1_TASK, v1_stat, v1_tree

    def pane_line(limit: str, hier: int | str) -> str:
        root = v1_tree(tmp_path / str(len(list(tmp_path.iterdir()))), limit, v1_stat(GIB, 0, hier))
        m = replace(session[-1].memory, cgroup=read_cgroup_memory(str(root)))
        return cgroup_text(m).plain  # type: ignore[arg-type]

    assert pane_line(f"{8 * GIB}\n", 8 * GIB).startswith(f"cgroup v1 {V1_TASK}  used 3.0 GiB of 8.0 GiB (38%)")
    assert "used 3.0 GiB, no limit" in pane_line(V1_NO_LIMIT, 9223372036854771712)
    unread = pane_line("unlimited\n", 9223372036854771712)
    assert "used 3.0 GiB, limit not read (memory.limit_in_bytes holds 'unlimited', not a number)" in unread
    assert "no limit" not in unread
    # The same line in the running app, at 80 columns.
    root = v1_tree(tmp_path / "app", f"{8 * GIB}\n", v1_stat(GIB, 0, 8 * GIB))
    snaps = [replace(s, memory=replace(s.memory, cgroup=read_cgroup_memory(str(root)))) for s in session[:2]]
    app = DltopApp(ListFeed(snaps, start=1))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press(_tab(app, "pagecache"))
        await pilot.pause()
        assert _text(app, "#pc-cgroup").startswith(f"cgroup v1 {V1_TASK}")


async def test_disk_table_says_why_disks_are_missing(session: list[Snapshot], tmp_path: Path) -> None:
    from dltop.sources.memory import read_disks
    from tests.conftest import capture_proc

    root = capture_proc(tmp_path / "root")
    (root / "proc/diskstats").write_text("   8       0 sda 1 2 3\n")  # a read cut short
    broken = read_disks(str(root))
    snaps = [replace(s, memory=replace(s.memory, disks=broken)) for s in session[:2]]
    app = DltopApp(ListFeed(snaps, start=1))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press(_tab(app, "pagecache"))
        await pilot.pause()
        table = _text(app, "#pc-disks")
        assert "disks n/a: malformed /proc/diskstats: line 1: 6 fields" in table
        assert "no disk I/O yet" not in table
    # Read fine, no device with any I/O since boot: only then "no disk I/O yet".
    unused = [ln for ln in Path("/proc/diskstats").read_text().splitlines() if not any(map(int, ln.split()[3:14]))]
    (root / "proc/diskstats").write_text("".join(ln + "\n" for ln in unused))  # idle loop and ram devices
    assert read_disks(str(root)) == ()
    idle = [replace(s, memory=replace(s.memory, disks=read_disks(str(root)))) for s in session[:2]]
    app = DltopApp(ListFeed(idle, start=1))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press(_tab(app, "pagecache"))
        await pilot.pause()
        assert "(no disk I/O yet: no device has had any since boot)" in _text(app, "#pc-disks")


async def test_another_process_s_action_reaches_the_live_events_and_the_journal_thread_ends_with_the_tui(
        session: list[Snapshot], monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import time

    from dltop import journal
    from dltop.tui import outside
    from tests.test_recorder_ops import _journal_line

    monkeypatch.setattr(outside, "JOURNAL_POLL_S", 0.05)
    app = DltopApp(ListFeed(session[:3], start=2))
    before = set(threading.enumerate())
    async with app.run_test(size=(80, 24)) as pilot:
        (tail,) = [t for t in threading.enumerate() if t.name == "dltop-watch" and t not in before]
        assert not app.session.timeline.events()
        journal.append(_journal_line("/data/shards", pid=4242))  # a warm run by `dltop warm` in a shell
        for _ in range(100):
            await pilot.pause(0.05)
            if app.session.timeline.events():
                break
        events = list(app.session.timeline.events())
        assert [(e.data["action"], e.data["target"], e.data["pid"]) for e in events] == [
            ("warm", "/data/shards", 4242)]
        assert events[0].data["uid"] == os.geteuid()
        await pilot.press("q")
    deadline = time.monotonic() + 2
    while tail.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not tail.is_alive()


def test_the_watch_thread_asks_the_ui_loop_to_leave_once_the_terminal_is_gone(session: list[Snapshot],
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # After an SSH drop with SIGHUP ignored and no handler of dltop's in place the tty reads EOF forever: the
    # watch thread sees stdin is no terminal any more at its next check and hands the UI loop _leave(129).
    from dltop.tui import outside

    answers = iter([True, True, True, False])
    monkeypatch.setattr(outside, "TERMINAL_CHECK_S", 0.01)
    monkeypatch.setattr(outside.os, "isatty", lambda fd: next(answers))
    asked: list[tuple[object, tuple[object, ...]]] = []

    class Loop:
        def is_closed(self) -> bool:
            return False

        def call_soon_threadsafe(self, fn: object, *args: object) -> None:
            asked.append((fn, args))

    def leave(code: int) -> None:
        raise AssertionError("called on the watch thread, not handed to the UI loop")

    outside.watch_outside(threading.Event(), Loop(), True, None, leave, print)  # type: ignore[arg-type]  # returns once it has asked
    assert asked == [(leave, (129,))]
    assert next(answers, "all asked") == "all asked"
