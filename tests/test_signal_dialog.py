"""The GPU tab's signal dialog (k) says what it would signal before anything else: at 80x24 a real process with a
100 kB argv (escapes and a line break in it) shows the question with its pid and user, its start time, two lines of
its command, the choices and the keys; the whole command line scrolls in a box of its own below them."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import time

from textual.containers import VerticalScroll
from textual.widgets import OptionList

from dltop.sampler import ListFeed
from dltop.tui.app import DltopApp
from dltop.tui.screens.signal import SignalScreen, started_text
from tests.test_gpu_table_keys import _select, _with_process

ARG = "\x1b]52;c;cHduZWQ=\x07\nstep-" + "x" * 100_000  # OSC 52 (set the clipboard), a line break, then 100 kB


def _screen_text(app: DltopApp) -> list[str]:
    """Every row of the screen as Textual would write it."""
    return ["".join(seg.text for seg in strip) for strip in app.screen._compositor.render_strips()]


async def test_a_100_kb_argv_never_hides_the_question_or_the_choices() -> None:
    p = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)", ARG],
                         stdout=subprocess.PIPE)
    try:
        assert p.stdout is not None and p.stdout.readline() == b"up\n"
        user = pwd.getpwuid(os.getuid()).pw_name
        app = DltopApp(ListFeed(_with_process(p.pid), start=1))
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            await _select(app, pilot, p.pid)
            await pilot.press("k")
            await pilot.pause(0.3)
            screen = app.screen
            assert isinstance(screen, SignalScreen)
            rows = _screen_text(app)
            text = "\n".join(rows)
            assert len(rows) == 24
            assert f"Signal pid {p.pid} ({user})?" in text, text  # the question, whole, on screen
            assert "started 20" in text and " ago)" in text
            assert "SIGTERM" in text and "SIGKILL" in text and "SIGINT" in text  # every choice
            assert "y sends the highlighted signal, Esc cancels" in text
            # two lines of the command under the question, the second cut with '…', the escapes shown
            head = next(i for i, r in enumerate(rows) if "Signal pid" in r)
            assert "-c import time" in rows[head + 2] and "step-xxx" in rows[head + 3] and "xx…" in rows[head + 3]
            assert "\\x1b]52;c;cHduZWQ=\\x07\\x0astep-xxx" in text
            assert not any(c in text for c in "\x1b\x07")
            # the whole command line: in its own box below, which scrolls
            whole = screen.query_one("#signal-whole", VerticalScroll)
            assert whole.display and whole.region.height <= 6 and whole.max_scroll_y > 1000
            assert whole.region.bottom <= 24 and screen.query_one(OptionList).region.y > head
            await pilot.press("tab")
            assert whole.has_focus
            await pilot.press("end")
            await pilot.pause()
            assert whole.scroll_y == whole.max_scroll_y
            text = "\n".join(_screen_text(app))
            assert f"Signal pid {p.pid} ({user})?" in text and "SIGKILL" in text  # still there, scrolled to the end
            await pilot.press("escape")
            await pilot.pause()
            assert not isinstance(app.screen, SignalScreen) and p.poll() is None  # nothing sent
    finally:
        p.kill()
        p.wait()


async def test_a_short_command_has_no_box_and_the_start_time_is_said() -> None:
    from textual.app import App

    class One(App[None]):
        def on_mount(self) -> None:
            self.push_screen(SignalScreen(42, "alice\x07", "python train.py", started_at=1_000.0, now=1_000.0 + 3725))

    app = One()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.2)
        text = "\n".join(_screen_text(app))
        assert "Signal pid 42 (alice\\x07)?" in text
        assert started_text(1_000.0, 1_000.0 + 3725) in text and "(1h02m ago)" in text
        assert not app.screen.query_one("#signal-whole", VerticalScroll).display
    assert started_text(None, time.time()) == "started: not known"
