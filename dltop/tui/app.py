"""The dltop app: a header, one tab per cache layer, the hint line and the footer. It only draws what the feed hands it."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, Protocol, cast

from rich.text import Text
from textual import events, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.widgets import Footer, Static, TabbedContent, TabPane

from dltop import hints as hint_rules
from dltop.config import MAX_REFRESH_S, MIN_REFRESH_S, Settings, server_url
from dltop.errors import DltopError
from dltop.fmt import human_duration, printable, printable_lines
from dltop.model import CachesPart, Snapshot, Unavailable, to_dict
from dltop.model.actions import ActionEvent, ActionPlan
from dltop.model.datasets import DatasetsPart
from dltop.playhead import Live, Playhead, Replay
from dltop.timeline import LiveEvent, LiveHistory, RecordingFeed, Timeline, index_at
from dltop.tui.messages import (
    ActionEventPosted,
    ActionRequested,
    CancelRequested,
    ClearRequested,
    DatasetAddRequested,
    DatasetRemoveRequested,
    EvictRequested,
    LockRequested,
    RescanRequested,
    ServerAddRequested,
    ServerRemoveRequested,
    SignalRequested,
    WarmRequested,
    Warned,
)
from dltop.tui.panes import pane_classes
from dltop.tui.panes.base import HeaderLine, Pane, set_content
from dltop.tui.screens.ask import AskScreen
from dltop.tui.screens.confirm import ConfirmScreen, plan_dialog
from dltop.tui.screens.events import EventsScreen
from dltop.tui.screens.help import HelpScreen
from dltop.tui.view import View

MIN_WIDTH, MIN_HEIGHT = 80, 24
HISTORY_LEN = 600  # ten minutes at the default refresh: what the sparklines show
REFRESH_STEPS = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
HINT_LINES = 2  # the current tab's own hint; another tab's gets one line (it must not push this tab's off)
SNOOZE_S = 3600.0  # how long `s` in ? keeps a hint off the hint line
TAB_DECIDED_AFTER_S = 5.0  # the GPU source has answered by then (or failed): the tab to open on is decided
LEAVE_WITHIN_S = 3.0  # after a kill or a hangup, at most this long before the process is gone
SLOW_HOLD_S = 1.0  # the slow sources start after the first frame, or this long after the start at the latest
JOURNAL_POLL_S = 2.0  # the machine's action journals are read this often for events of other processes
TERMINAL_CHECK_S = 1.0  # whether the terminal is still there (a hangup with SIGHUP ignored), this often
PLAY_TICK_S = 0.25  # a replay that plays moves on this often (at x10 over a 1 s recording: every 2-3 samples)
TIME_EXAMPLES = "10m ago, 14:05, 2026-12-01T14:05:00"


class Feed(Protocol):
    """Where Snapshots come from: the live Sampler, a list of recorded ones, or a recording (RecordingFeed)."""

    def start(self, hold_slow_s: float = 0.0) -> None: ...
    def release_slow(self) -> None: ...
    def snapshot(self) -> Snapshot: ...
    def backlog(self) -> list[Snapshot]: ...
    def set_refresh(self, interval_s: float) -> None: ...
    def reconfigure(self, settings: Settings) -> None: ...
    def read_now(self, name: str, key: str | None = None) -> None: ...
    async def wait_first(self, timeout_s: float = 1.0) -> None: ...
    def stream(self, interval_s: Callable[[], float]) -> AsyncIterator[Snapshot]: ...
    def close(self) -> None: ...


class RecordSink(Protocol):
    """Where `--record DIR` writes (`dltop.recorder.Recorder`): every Snapshot shown, and the user's markers."""

    def write(self, snapshot: Snapshot) -> None: ...
    def event(self, kind: str, data: dict[str, Any], ts: float | None = None) -> None: ...


def _fit_lines(t: Text, width: int, lines: int, console: Any) -> Text:
    """`t` cut to `lines` lines of `width`, ending in '… ? shows all' when cut: the hint line never grows
    into the pane (whose status lines it would push off screen)."""
    wrapped = t.wrap(console, width)
    if len(wrapped) <= lines:
        return t
    tail = " … ? shows all"
    kept = Text("\n").join(wrapped[:lines])
    kept.truncate(len(kept) - len(wrapped[lines - 1]) + max(0, width - len(tail) - 2))
    kept.rstrip()
    kept.append(tail, "dim")
    return kept


# The help screen: one row per key (its pair, its other labels left out), in words where the label is short.
HELP_SKIPS = {"app.interrupt", "app.slower", "app.live", "app.play", "app.step_back", "app.goto_live",
              "app.jump_back", "app.speed_down"}
HELP_TEXT = {
    "app.faster": "refresh faster / slower",
    "app.palette": "command palette",
    "app.pause": "pause / live; play a replay",
    "app.step": "next / previous sample",
    "app.jump": "jump {jump} on / back",
    "app.goto": "go to a time",
    "app.events": "events (replay; live: actions seen)",
    "app.speed": "replay ×1/×10/×60",
    "app.mark": "marker (--record)",
}
# The palette's entries for moving in time: (title, help, action, parameters); offered where they can run now.
TIME_COMMANDS = (
    ("Next sample", "Step to the next sample (t)", "step", (1,)),
    ("Previous sample", "Step to the previous sample (T)", "step", (-1,)),
    ("Jump forward", "{jump} later (j)", "jump", (1,)),
    ("Jump back", "{jump} earlier (J)", "jump", (-1,)),
    ("Go to a time", "10m ago, 14:05 or ISO 8601 (b)", "go_to", (False,)),
    ("Events", "OOM kills, markers, actions, GPU processes, hints (v)", "events", ()),
    ("Replay faster", "×1, ×10, ×60 (>)", "speed", (1,)),
    ("Replay slower", "×60, ×10, ×1 (<)", "speed", (-1,)),
)


def _hms(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts))


def _next_step(current: float, faster: bool) -> float:
    if faster:
        smaller = [s for s in REFRESH_STEPS if s < current - 1e-9]
        return max(smaller[-1] if smaller else current, MIN_REFRESH_S)
    larger = [s for s in REFRESH_STEPS if s > current + 1e-9]
    return min(larger[0] if larger else current, MAX_REFRESH_S)


class DltopApp(App[None]):
    """Top-like monitor of the cache layers; every action has a key, a footer label and a palette entry."""

    CSS_PATH = Path(__file__).with_name("app.tcss")
    TITLE = "dltop"
    ENABLE_COMMAND_PALETTE = True
    BINDINGS = [
        Binding("q", "quit", "Quit", id="app.quit"),
        # top and htop quit on Ctrl-C too; Textual's default only explains how to quit.
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True, id="app.interrupt"),
        Binding("question_mark", "help", "Help", id="app.help"),
        # Space (and p) pauses the view, goes back to live, or plays a replay: one of the three is enabled at a
        # time, so the footer names what the key does now.
        Binding("space,p", "pause", "Pause", key_display="␣", id="app.pause"),
        Binding("space,p", "live", "Live", key_display="␣", id="app.live"),
        Binding("space,p", "play", "Play", key_display="␣", id="app.play"),
        # Moving in time. The forward keys show in the footer only when there is a past on screen (live has
        # nothing newer); T, J and b work from live too (they pause). b is bound twice for that: labelled when
        # the past is on screen, unlabelled from live, so the live footer of the busiest tab still fits 80 columns.
        Binding("t", "step(1)", "Step", key_display="t/T", id="app.step"),
        Binding("T", "step(-1)", "Step back", show=False, id="app.step_back"),
        Binding("b", "go_to(True)", "Go to", id="app.goto"),
        Binding("b", "go_to(False)", "Go to", show=False, id="app.goto_live"),
        Binding("v", "events", "Events", id="app.events"),
        Binding("j", "jump(1)", "Jump", key_display="j/J", show=False, id="app.jump"),
        Binding("J", "jump(-1)", "Jump back", show=False, id="app.jump_back"),
        Binding("greater_than_sign", "speed(1)", "Speed", key_display="</>", show=False, id="app.speed"),
        Binding("less_than_sign", "speed(-1)", "Slower replay", show=False, id="app.speed_down"),
        Binding("m", "mark", "Mark", show=False, id="app.mark"),
        # One footer label for both refresh keys, so every key of the busiest tab fits 80 columns.
        Binding("plus,equals_sign", "faster", "Refresh", key_display="+/-", id="app.faster"),
        Binding("minus", "slower", "Slower", show=False, id="app.slower"),
        Binding("ctrl+p", "command_palette", "Menu", key_display="^p", id="app.palette"),
        *[Binding(str(i), f"show_tab({i})", f"Tab {i}", show=False, id=f"app.tab{i}") for i in range(1, 10)],
    ]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (32, "-tall")]

    def __init__(self, feed: Feed, settings: Settings | None = None, clock: Callable[[], float] = time.time,
                 runner: Any = None, own_signals: bool = False, listeners: Sequence[Callable[[Snapshot], None]] = (),
                 recorder: RecordSink | None = None) -> None:
        super().__init__()
        self._own_signals = own_signals  # a real run (not a test's): SIGTERM and SIGHUP leave as q does
        self.feed = feed
        if runner is None:
            from dltop.actions.runner import ActionRunner

            runner = ActionRunner()
        self.runner = runner  # every warm, evict and lock runs here; its events come back as messages
        self._runs: dict[int, Any] = {}  # plans in flight, by run id: their result opens the confirmation
        self._watch_done = threading.Event()  # set when the TUI leaves: the watch thread ends
        self._action: ActionEvent | None = None
        self.settings = settings or Settings()
        self.refresh_s = self.settings.refresh_s
        self._clock = clock
        self.history: deque[Snapshot] = deque(maxlen=HISTORY_LEN)
        self.hints: list[hint_rules.Hint] = []
        # Time: live follows the feed (`at` None); a past moment is the Snapshot taken at `at` on the timeline,
        # the app's own history live, the recording in a replay (which is always at a moment).
        self.replay = isinstance(feed, RecordingFeed)
        self.timeline: Timeline = feed.timeline if isinstance(feed, RecordingFeed) else LiveHistory(self.history)
        self.head: Playhead = (Replay(feed.start_ts, pos=feed.start_ts) if isinstance(feed, RecordingFeed)
                               else Live())
        self._past: tuple[float, tuple[Snapshot, ...], tuple[hint_rules.Hint, ...]] | None = None
        self.recorder = recorder
        self._view: View | None = None
        self._hint_shown: tuple[object, ...] | None = None  # what the hint line was drawn from
        self._panes: list[Pane] = [cls() for cls in pane_classes(cluster=self.settings.prometheus is not None)]
        self._mounting: dict[str, Any] = {}  # PANE_ID -> its mount under way or done (_compose_pane)
        # PANE_ID -> a palette entry's action, run once its tab's activation (and the focus it gives) is done
        self._after_activated: dict[str, Callable[[], object]] = {}
        # The tab to open on: --tab / `tab = ...` / the recording's, else the one that has something (GPU where
        # GPUs are, else Datasets when datasets are watched, else Page cache), decided once the GPU source has
        # answered unless the user picked a tab first.
        self._tab_pending = True
        self._tab_auto: str | None = None
        self._tab_recorded: str | None = None  # the last tab written into --record's recording
        self.muted: set[str] = set(self.settings.mute)  # hint ids kept off the hint line (still listed in ?)
        self.snoozed: dict[str, float] = {}  # hint id -> until when (clock time) it is kept off the hint line
        # Each Snapshot shown is handed on too (`dltop --export`'s collector, `--record`'s recorder).
        self._listeners = (*listeners, recorder.write) if recorder is not None else tuple(listeners)

    # -- layout ---------------------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield HeaderLine(id="header")
        yield Static(id="too-small")
        # The tabs' panes are not composed here: only the one on screen is, before the first frame (on_mount), and
        # each other one when first shown (_compose_pane). Six panes' widgets cost ~0.2 s before the first frame.
        with TabbedContent(id="tabs"):
            for i, pane in enumerate(self._panes, start=1):
                yield TabPane(f"{i} {pane.TITLE}", id=f"tab-{pane.PANE_ID}")
        yield Static(id="hints")
        yield Footer(compact=True, show_command_palette=False)  # ^p is an ordinary label: all fit 80 columns

    def on_load(self) -> None:
        if self._own_signals:
            # Leave as q does — alternate screen, mouse tracking and cursor restored — on a kill or a hangup
            # (the default action would leave the terminal needing `reset`). Installed before the terminal is
            # put in application mode, so no moment is left uncovered.
            loop = asyncio.get_running_loop()
            for sig, code in ((signal.SIGTERM, 143), (signal.SIGHUP, 129)):
                loop.add_signal_handler(sig, self._leave, code)

    async def on_mount(self) -> None:
        self.runner.subscribe(lambda ev: self.post_message(ActionEventPosted(ev)))
        # Back from a suspend (Ctrl-Z, fg): the terminal's screen was the shell's, so every cell is drawn again
        # (Textual redrew only what changed: the tab bar and the panes stayed blank until a tab switch)
        self.app_resume_signal.subscribe(self, lambda _app: self.screen.refresh(repaint=True, layout=True))
        journal = None
        if isinstance(self.timeline, LiveHistory):
            # Actions run anywhere on the machine (a warm from a shell, another TUI) reach this event list too:
            # the journals this user trusts, tailed off the UI loop.
            from dltop.journal import JournalTail

            journal = JournalTail(skip_pid=os.getpid())
        # The terminal (unconditionally: a hangup that came before this point, its exit() too early to take, is
        # caught at the first check) and the journals are watched on one thread for the TUI's life, which wakes
        # the UI loop only with news: a Textual timer for the terminal woke it every second, and a thread worker
        # for the journals every 2 s started a thread and posted three state messages to it.
        tty = not self.is_headless
        if tty or journal is not None:
            threading.Thread(target=self._watch_outside, args=(asyncio.get_running_loop(), tty, journal),
                             name="dltop-watch", daemon=True).start()
        self._play_timer = self.set_interval(PLAY_TICK_S, self._play_tick, pause=True)
        # The slow sources start once the first frame is drawn (or SLOW_HOLD_S later): a dataset's first scan
        # on its thread took half the GIL from it, and the screen came up 0.2-0.4 s later.
        self.feed.start(hold_slow_s=SLOW_HOLD_S)
        self.call_after_refresh(self.feed.release_slow)
        await self.feed.wait_first(timeout_s=0.3)
        for snap in self.feed.backlog():
            self.history.append(snap)
        self._apply(self.feed.snapshot())
        self._choose_tab()
        pane = self._active_pane()
        if pane is not None:
            await self._compose_pane(pane)
        self._check_size()
        self._consume()

    @work(exclusive=True, group="feed")
    async def _consume(self) -> None:
        async for snap in self.feed.stream(lambda: self.refresh_s):
            self._apply(snap)

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = True) -> None:
        # Always as plain text: notifications carry paths, URLs, error messages and a marker's words, and Rich
        # markup in them ("/data/a[/b]") would show wrong or raise MarkupError and take the TUI down.
        # And escaped: they carry other users' paths and argv (fmt.printable_lines).
        super().notify(printable_lines(message), title=printable(title), severity=severity, timeout=timeout,
                       markup=False)

    def on_unmount(self) -> None:
        self._watch_done.set()
        self.runner.close()  # cancel what runs, unlock what is locked
        self.feed.close()

    def _leave(self, code: int) -> None:
        """Exit as q does; if restoring a terminal that hung up wedges the shutdown, end the process anyway."""
        self.exit(return_code=code)
        self.runner.close()  # unlock now: the watchdog's os._exit would skip on_unmount
        watchdog = threading.Timer(LEAVE_WITHIN_S, os._exit, (code,))
        watchdog.daemon = True
        watchdog.start()

    def on_resize(self, event: events.Resize) -> None:
        if not self._widgets_up():
            return
        self._check_size(event.size.width, event.size.height)
        self._update_hints()  # re-cut to the new width

    def _check_size(self, w: int | None = None, h: int | None = None) -> None:
        if w is None or h is None:
            w, h = self.size
        small = w < MIN_WIDTH or h < MIN_HEIGHT
        msg = self.query_one("#too-small", Static)
        msg.update(f"Terminal too small: {w}×{h}. dltop needs at least {MIN_WIDTH}×{MIN_HEIGHT}; resize to continue.")
        msg.display = small
        tabs = self.query_one("#tabs", TabbedContent)
        if small == tabs.disabled:
            return
        tabs.display = not small
        # A pane nobody can see takes no keys (its warm or evict would act on a row nobody sees): disabled
        # widgets hold no focus and their bindings do not fire.
        tabs.disabled = small
        pane = self._active_pane()
        if not small and pane is not None and pane.is_mounted:
            pane.focus_default()

    # -- data -----------------------------------------------------------------------------------------------

    def _apply(self, snap: Snapshot) -> None:
        if self.history and snap is self.history[-1]:
            return
        self.history.append(snap)
        for listen in self._listeners:
            listen(snap)  # the recorder of --record among them: what this screen shows, so a replay shows the same
        self.hints = hint_rules.hints(list(self.history))
        self.head = self.head.kept_within(self.history[0].ts)
        if self._tab_pending and self._widgets_up():
            self._choose_tab()
        self._redraw()

    def _choose_tab(self) -> None:
        """Open on the tab asked for, else on the one that has something (while the user has not picked one)."""
        if not self._tab_pending or not self.history:
            return
        tab, decided = self._wanted_tab(self.history[-1])
        pane = next((p for p in self._panes if tab == p.PANE_ID), None)
        if tab != self._tab_auto and pane is not None:
            self._tab_auto = tab
            self._activate(pane)
        if decided or self.history[-1].ts - self.history[0].ts >= TAB_DECIDED_AFTER_S:
            self._tab_pending = False
            self._record_tab()

    def _wanted_tab(self, snap: Snapshot) -> tuple[str, bool]:
        """The tab to open on and whether that is final (not while the GPU source has not answered yet)."""
        if self.settings.tab:
            return self.settings.tab, True
        if self.settings.prometheus is not None:
            return "cluster", True  # asked for a cluster: its tab first
        gpus = snap.gpus
        if isinstance(gpus, tuple) and gpus:
            return "gpu", True
        datasets = snap.datasets
        watched = self.settings.datasets or (isinstance(datasets, DatasetsPart) and datasets.paths)
        waiting = isinstance(gpus, Unavailable) and gpus.reason == "waiting for the first reading"
        return ("datasets" if watched else "pagecache"), not waiting or self.replay

    def _record_tab(self) -> None:
        """--record: the tab on screen goes into the recording, so that a replay opens as it was."""
        pane = self._active_pane()
        if self.recorder is None or self.replay or self._tab_pending or pane is None:
            return
        if self._tab_recorded != pane.PANE_ID:
            self._tab_recorded = pane.PANE_ID
            self.recorder.event("view", {"tab": pane.PANE_ID})

    def _redraw(self) -> None:
        """Header, hint line and visible pane for the moment on screen."""
        frame = self._frame()
        if frame is None or not self._widgets_up():
            return
        self._update_header(frame[0][-1])
        self._update_hints()
        self._show()

    def _widgets_up(self) -> bool:
        """The screen's widgets are there: not yet, or no longer once Textual tears the screen down on exit
        while a tick from the feed is still on its way (it would find no #header). query_one: Textual finds an id
        from a cache; `query` walked every node of the screen, twice a tick (2.5 ms of it on the GPU tab)."""
        try:
            self.query_one("#header")
        except NoMatches:
            return False
        return True

    def _frame(self) -> tuple[tuple[Snapshot, ...], tuple[hint_rules.Hint, ...]] | None:
        """The Snapshots up to the moment on screen (oldest first) and its hints: the latest live; in the past,
        the window that ended at `at` and the hints drawn from it by the same rules, so the numbers are those
        live showed then."""
        at = self.head.at
        if at is None:
            return (tuple(self.history), tuple(self.hints)) if self.history else None
        if self._past is None or self._past[0] != at:
            window = tuple(self.timeline.upto(at, HISTORY_LEN))
            if not window:
                return None
            self._past = (at, window, tuple(hint_rules.hints(window)))
        return self._past[1], self._past[2]

    def _show(self) -> None:
        """Hand the visible pane a View of the moment on screen and of the actions' state."""
        frame = self._frame()
        if frame is None or not self._widgets_up():
            return
        history, hints = frame
        self._view = View(snapshot=history[-1], history=history, hints=hints,
                          read_only=self.settings.read_only, replay=self.head.past,
                          watched=tuple(self.settings.datasets), action=self._action,
                          busy=self.runner.busy is not None, held=self.runner.held())
        active = self._active_pane()
        for pane in self._panes:
            if pane is active and pane.is_mounted:
                pane.show(self._view)
            else:
                pane.view = self._view  # not drawn while hidden, but its keys and palette entries see the truth

    def _active_pane(self) -> Pane | None:
        active = self.query_one("#tabs", TabbedContent).active
        for pane in self._panes:
            if active == f"tab-{pane.PANE_ID}":
                return pane
        return None

    async def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        # Hidden panes are not updated on ticks: bring the one that just became visible up to date now (a pane
        # shown for the first time is composed first).
        pane = self._active_pane()
        if pane is not None:
            if self._tab_pending and self._tab_auto is not None and self._tab_auto != pane.PANE_ID:
                self._tab_pending = False  # the user picked a tab (a click): nothing moves it again
            if not pane.is_mounted:
                # The hidden tab's focused widget would hand the focus to a sibling while this one is composed,
                # and its tab would take the screen back (TabbedContent follows the focus).
                event.tabbed_content.screen.set_focus(None)
                await self._compose_pane(pane)
            elif self._view is not None:
                pane.show(self._view)
            if pane is self._active_pane():
                pane.focus_default()
            self._record_tab()
            if self._widgets_up():
                self._update_hints()  # this tab's own hints first
            act = self._after_activated.pop(pane.PANE_ID, None)
            if act is not None:  # after the tab's own focus, so what the action focuses keeps it
                self.call_after_refresh(act)

    def _activate(self, pane: Pane) -> None:
        """Show `pane`'s tab. The focus leaves the tab hidden first: a focused widget that is hidden hands the
        focus to a sibling (Textual blurs it on Hide), and TabbedContent, which follows the focus, would show
        that tab again; the tab shown takes the focus when activated (on_tabbed_content_tab_activated)."""
        tabs = self.query_one("#tabs", TabbedContent)
        focused = tabs.screen.focused  # the main screen's, also while a dialog is open over it
        if focused is not None and pane not in focused.ancestors:
            tabs.screen.set_focus(None)
        tabs.active = f"tab-{pane.PANE_ID}"

    async def _compose_pane(self, pane: Pane) -> None:
        """Mount `pane` into its tab, once, and draw the moment on screen in it. What asks a pane that was never
        shown works without its widgets: its palette entries and help come from its declared bindings, its
        check_action from its view (Pane.box_shown); a key, a click or a palette entry shows it first."""
        if not pane.is_mounted:
            mounting = self._mounting.get(pane.PANE_ID)
            if mounting is None:
                tab = self.query_one(f"#tab-{pane.PANE_ID}", TabPane)
                mounting = self._mounting[pane.PANE_ID] = tab.mount(pane)
            await mounting
        if self._view is not None and self._widgets_up():
            pane.show(self._view)

    def _update_header(self, snap: Snapshot) -> None:
        t = Text()
        t.append("dltop", "bold")
        t.append(f" · {printable(snap.host)}")
        if snap.uptime_s is not None:
            t.append(f" · up {human_duration(snap.uptime_s)}")
        if not self.replay:
            t.append(f" · every {self.refresh_s:g}s")
        t.append(" · ")
        t.append_text(self._when(snap))
        if self.recorder is not None:
            t.append("  ● REC", "bold red")
        troubled = [s for s in snap.sources.values() if s.error]
        for s in troubled:
            t.append(f"  ⚠ {s.name}: {printable(s.error or '')}", "bold yellow")
        if self.settings.read_only:
            t.append("  read-only", "dim")
        self.query_one("#header", HeaderLine).show(t)

    def _when(self, snap: Snapshot) -> Text:
        """The moment on screen: its time live; "PAUSED 14:05:13 (−2m10s)" behind live; "REPLAY name 14:05:13
        ×10 ▶" in a replay."""
        clock = _hms(snap.ts)
        if self.replay:
            assert isinstance(self.feed, RecordingFeed)
            head = cast(Replay, self.head)
            out = Text.assemble(("REPLAY", "bold magenta"), f" {printable(self.feed.name)} {clock} ×{head.speed} ",
                                ("▶" if head.playing else "⏸", "bold"))
            gap = self._gap_before(snap.ts)
            if gap:  # the sample before this one is far back: the screen crossed a hole in the recording
                out.append(f"  after a gap of {human_duration(gap)}", "bold yellow")
            return out
        if self.head.at is None:
            return Text(clock)
        behind = self.history[-1].ts - snap.ts if self.history else 0.0
        return Text.assemble(("PAUSED", "bold reverse"), f" {clock} (−{human_duration(behind)})")

    def _gap_before(self, ts: float) -> float:
        """Seconds without samples before the one at `ts`, where longer than 3 of the recording's intervals."""
        times = self.timeline.times()
        i = index_at(times, ts)
        interval = getattr(getattr(self.feed, "recording", None), "meta", {}).get("interval_s")
        interval = interval if isinstance(interval, int | float) and interval > 0 else 1.0
        gap = times[i] - times[i - 1] if 0 < i < len(times) else 0.0
        return gap if gap > 3 * interval else 0.0

    def hint_state(self, hint_id: str) -> str:
        """'muted', 'snoozed' (until when) or '' for a hint id: what ? says of it."""
        if hint_id in self.muted:
            return "muted" + (" (config)" if hint_id in self.settings.mute else "")
        until = self.snoozed.get(hint_id)
        if until is not None and until > self._clock():
            return f"snoozed until {time.strftime('%H:%M', time.localtime(until))}"
        return ""

    def _line_hints(self, hints: Sequence[hint_rules.Hint]) -> list[hint_rules.Hint]:
        """The hints the hint line may show, the current tab's own first (each group most severe first)."""
        pane = self._active_pane()
        tab = pane.PANE_ID if pane is not None else None
        kept = [h for h in hints if not self.hint_state(h.id)]
        return sorted(kept, key=lambda h: hint_rules.tab_of(h.id) != tab)  # stable: severity order kept

    def _update_hints(self) -> None:
        widget = self.query_one("#hints", Static)
        frame = self._frame()
        hints = self._line_hints(frame[1] if frame is not None else ())
        if not hints:
            widget.display = False
            return
        h = hints[0]
        pane = self._active_pane()
        own = pane is not None and hint_rules.tab_of(h.id) == pane.PANE_ID
        width = max(20, self.size.width - 2)
        shown = (h.severity, h.text, h.fix, len(hints), width, own)
        if shown != self._hint_shown:  # the same hint as the last tick's: not wrapped again (0.7 ms a tick)
            self._hint_shown = shown
            style = {"critical": "bold red", "warn": "bold yellow", "info": "bold"}[h.severity]
            t = Text.assemble(("! " if h.severity != "info" else "i ", style), (printable(h.text), style))
            if h.fix:
                t.append(f" — {printable(h.fix)}", "italic")
            more = f"  (+{len(hints) - 1} more, see ?)" if len(hints) > 1 else ""
            t.append(more, "dim")
            # Another tab's hint takes one line: it must not cost this tab two of its 24 rows.
            set_content(widget, _fit_lines(t, width, HINT_LINES if own else 1, self.console))
        widget.display = True

    def set_hint_state(self, hint_id: str, state: str) -> None:
        """Mute, snooze or bring back ('') a hint for this session (? does it); the hint line follows at once."""
        self.muted.discard(hint_id)
        self.snoozed.pop(hint_id, None)
        if state == "muted":
            self.muted.add(hint_id)
        elif state == "snoozed":
            self.snoozed[hint_id] = self._clock() + SNOOZE_S
        self._hint_shown = None
        if self._widgets_up():
            self._update_hints()

    # -- what panes ask for: actions through the runner, sources that change -------------------------------

    def _request(self, msg: ActionRequested) -> None:
        msg.stop()
        if self.settings.read_only or self.head.past:
            why = "dltop runs --read-only" if self.settings.read_only else self._past_reason()
            self.notify(f"{msg.action}: {why}; nothing may change the system from here", severity="warning")
            return
        if self.runner.busy is not None:
            self.notify(f"{self.runner.busy.action} {self.runner.busy.target} is still running (Esc cancels)",
                        severity="warning")
            return
        if msg.action == "lock" and msg.path in self.runner.held():
            self.runner.release(msg.path)
            return
        run = self.runner.plan(msg.action, [msg.path], options=self._options(msg.action),
                               others=self._watched_resident())
        self._runs[run.id] = run

    def _options(self, action: str) -> Any:
        """A clear resolves the known caches as the Caches tab does: in --pid's environment, with --cache's."""
        return self.settings if action == "clear" else None

    def _watched_resident(self) -> dict[str, int]:
        """Resident bytes of every watched dataset, from the latest Snapshot: what a warm's guard names as at
        risk when reading past free memory pushes page cache out (the runner leaves out the warmed one)."""
        part = self.history[-1].datasets if self.history else None
        if not isinstance(part, DatasetsPart):
            return {}
        return {ds.path: ds.resident_pages * ds.page_size for ds in part.scanned}

    def on_warm_requested(self, msg: WarmRequested) -> None:
        self._request(msg)

    def on_evict_requested(self, msg: EvictRequested) -> None:
        self._request(msg)

    def on_lock_requested(self, msg: LockRequested) -> None:
        self._request(msg)

    def on_clear_requested(self, msg: ClearRequested) -> None:
        self._request(msg)

    def on_signal_requested(self, msg: SignalRequested) -> None:
        """A signal the GPU tab's dialog chose: the dialog was the confirmation; the runner checks the start time."""
        msg.stop()
        if self.settings.read_only or self.head.past:
            why = "dltop runs --read-only" if self.settings.read_only else self._past_reason()
            self.notify(f"signal: {why}; nothing may change the system from here", severity="warning")
            return
        try:
            self.runner.start("signal", [f"pid {msg.target.pid}"], options=msg.target)
        except DltopError as e:  # another action runs
            self.notify(str(e), severity="error")

    def warn(self, text: str) -> None:
        """Show a warning from any thread (the recorder's: the disk is full, samples dropped)."""
        self.post_message(Warned(text))

    def on_warned(self, msg: Warned) -> None:
        self.notify(msg.text, severity="warning", timeout=8)

    def on_rescan_requested(self, msg: RescanRequested) -> None:
        msg.stop()
        if not self.replay:  # a recording has no system to read again
            self.feed.read_now(msg.source, msg.key)

    def on_cancel_requested(self, msg: CancelRequested) -> None:
        msg.stop()
        self.runner.cancel()

    def _watch_outside(self, loop: asyncio.AbstractEventLoop, tty: bool, journal: Any) -> None:
        """On the watch thread, until the TUI leaves: every TERMINAL_CHECK_S whether the terminal is still there
        (`tty`), every JOURNAL_POLL_S the journals' new events (`journal`, a JournalTail, or None); each handed to
        the UI loop only where there is news."""
        step = TERMINAL_CHECK_S if tty else JOURNAL_POLL_S
        next_poll = time.monotonic() + JOURNAL_POLL_S
        while not self._watch_done.wait(step) and not loop.is_closed():  # (an app torn down without unmount)
            try:
                if tty and not os.isatty(0):
                    # After an SSH drop with SIGHUP ignored (nohup, some multiplexers) the tty reads EOF forever
                    # and Textual's input thread spins on it at 100% CPU next to the training job. A monitor
                    # with no terminal has nothing to do: leave.
                    loop.call_soon_threadsafe(self._leave, 129)
                    return
                if journal is not None and time.monotonic() >= next_poll:
                    next_poll = time.monotonic() + JOURNAL_POLL_S
                    found = journal.poll()
                    if found and not self._watch_done.is_set():
                        loop.call_soon_threadsafe(self._add_live_events,
                                                  [LiveEvent(d["ts"], "action", d) for d in found])
            except RuntimeError:  # the loop has closed under it (leaving)
                return

    def _add_live_events(self, found: Sequence[LiveEvent]) -> None:
        """Events for `v` live; the first one puts `v` in the footer."""
        if isinstance(self.timeline, LiveHistory):
            first = not self.timeline.events()
            for e in found:
                self.timeline.add_event(e)
            if first:
                self.refresh_bindings()

    def on_action_event_posted(self, msg: ActionEventPosted) -> None:
        ev = msg.event
        self._action = ev
        if ev.phase != "progress" and ev.step != "plan":  # as the recorder logs it: runs and releases
            self._add_live_events([LiveEvent(ev.ts, "action", {**to_dict(ev), "pid": os.getpid(),
                                                                "uid": os.geteuid()})])
        if ev.phase == "finished":
            if ev.step == "plan":
                run = self._runs.pop(ev.run_id, None)
                if ev.outcome == "ok" and run is not None and isinstance(run.result, ActionPlan):
                    self._confirm(run.result)
            elif ev.step == "run" and ev.action == "signal":
                self.feed.read_now("gpus")  # the process gone from the table without waiting for the next tick
                if ev.outcome == "ok":
                    self.notify(ev.message, timeout=6)
            elif ev.step == "run" and ev.action == "clear":
                self.feed.read_now("caches", self._cache_of(ev.paths[0]) if ev.paths else None)
            elif ev.step == "run":
                # The numbers after the action without waiting for the next scan: a rescan of that dataset only.
                self.feed.read_now("datasets", next(filter(None, map(self._owner, ev.paths)), None))
            if ev.outcome in ("error", "refused"):
                self.notify(ev.message, severity="error", timeout=8)
            elif ev.step == "release":
                self.notify(ev.message)
        self._show()

    def _cache_of(self, path: str) -> str | None:
        """The name of the cache that `path` is, or is inside, in the latest Snapshot."""
        part = self.history[-1].caches if self.history else None
        if not isinstance(part, CachesPart):
            return None
        return next((c.name for c in part.caches if path == c.path or path.startswith(c.path.rstrip("/") + "/")),
                    None)

    def _confirm(self, plan: ActionPlan) -> None:
        if plan.action != "clear" and self.settings.datasets and self._owner(plan.target) is None:
            return  # unwatched while it was measured: nobody is looking at that row any more
        from dltop.actions.runner import spec_of

        spec = spec_of(plan.action)
        title, body, yes = plan_dialog(plan, spec.verb)

        def answered(ok: bool | None) -> None:
            if not ok:
                return
            try:
                self.runner.start(plan.action, [plan.target], options=self._options(plan.action), fit=plan.can_fit,
                                  others=self._watched_resident())
            except DltopError as e:  # another action started meanwhile
                self.notify(str(e), severity="error")

        self.push_screen(ConfirmScreen(title, body, yes_label=yes), answered)

    def on_dataset_add_requested(self, msg: DatasetAddRequested) -> None:
        msg.stop()
        path = os.path.abspath(os.path.expanduser(msg.path))
        if not os.path.exists(path):
            self.notify(f"no such file or directory: {path}", severity="error")
            return
        if path in self.settings.datasets:
            self.notify(f"{path} is watched already", severity="warning")
            return
        self._watch((*self.settings.datasets, path))
        self.notify(f"watching {path}: scanning…", timeout=3)

    def on_dataset_remove_requested(self, msg: DatasetRemoveRequested) -> None:
        msg.stop()
        if msg.path in self.settings.datasets:
            for target in self.runner.held():  # a lock under it would have no row left to unlock it from
                if self._owner(target) == msg.path:
                    self.runner.release(target)
            self._watch(tuple(p for p in self.settings.datasets if p != msg.path))
            self.notify(f"no longer watching {msg.path}", timeout=3)

    def on_server_add_requested(self, msg: ServerAddRequested) -> None:
        msg.stop()
        try:
            url = server_url(msg.text)
        except ValueError as e:
            self.notify(f"not added: {e} (give host:port or http://host:port/metrics)", severity="error")
            return
        if url in self.settings.servers:
            self.notify(f"{url} is scraped already", severity="warning")
            return
        self._set_servers((*self.settings.servers, url))
        self.notify(f"scraping {url}", timeout=3)

    def on_server_remove_requested(self, msg: ServerRemoveRequested) -> None:
        msg.stop()
        try:
            url = server_url(msg.text)
        except ValueError as e:
            self.notify(f"not removed: {e}", severity="error")
            return
        if url not in self.settings.servers:
            self.notify(f"{url} is not scraped (scraped: {', '.join(self.settings.servers) or 'none'})",
                        severity="warning")
            return
        self._set_servers(tuple(u for u in self.settings.servers if u != url))
        self.notify(f"no longer scraping {url}", timeout=3)

    def _set_servers(self, servers: tuple[str, ...]) -> None:
        self.settings = replace(self.settings, servers=servers)
        self.feed.reconfigure(self.settings)
        self._show()

    def _owner(self, path: str) -> str | None:
        """The watched dataset that `path` is, or is inside."""
        return next((p for p in self.settings.datasets if path == p or path.startswith(p.rstrip("/") + "/")), None)

    def _watch(self, datasets: tuple[str, ...]) -> None:
        self.settings = replace(self.settings, datasets=datasets)
        self.feed.reconfigure(self.settings)
        self._show()

    # -- actions --------------------------------------------------------------------------------------------

    # Moving in time. Live, the past is the app's own history (sampling goes on meanwhile, and so does
    # --record); in a replay it is the recording, and playing moves through it at the speed chosen.

    def _past_reason(self) -> str:
        if self.replay:
            return "this is a replay"
        return "paused on a past moment (space goes back to live)"

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        allowed = self.head.allows(action, parameters)  # the time keys: one table keyed on the mode
        if allowed is not None:
            return allowed
        if action == "events":
            return self.replay or bool(self.timeline.events())  # live: once an action was seen
        return True

    def _move(self, head: Playhead | None, n: int = 0) -> None:
        """Show the moment `head` is at; None: already at the end that `n` points to (said so)."""
        if head is None:
            self._say_end(n)
            return
        self.head = head
        self._redraw()
        if head.past:
            self._settle()
        self.refresh_bindings()
        if isinstance(head, Replay):
            if head.playing:
                self._play_timer.resume()
            else:
                self._play_timer.pause()

    def _settle(self) -> None:
        # A pane's layout follows what it drew last (a rates line more, a note less): live, the next tick draws
        # at the settled layout; a moment moved to has no next tick, so it is drawn again once laid out.
        self.call_after_refresh(self._show)

    def _go(self, ts: float) -> None:
        """Show the moment `ts` of the timeline (live: reaching the newest sample is live again)."""
        times = self.timeline.times()
        if times:
            self._move(self.head.go(times, ts))

    def action_pause(self) -> None:
        """Live: hold the view on the moment shown while sampling goes on. A replay: stop playing."""
        self._move(self.head.pause(self.timeline.times()))

    def action_live(self) -> None:
        """Back to the live view."""
        self._move(self.head.live())

    def action_play(self) -> None:
        """Play the replay from the moment shown, at the speed chosen (from the start again at its end)."""
        if isinstance(self.head, Replay):
            self._move(self.head.play(self.timeline.times()))

    def action_toggle_pause(self) -> None:
        """Pause / back to live, or play / pause a replay: what space does now."""
        for action in ("pause", "live", "play"):
            if self.check_action(action, ()):
                getattr(self, f"action_{action}")()
                return

    def _play_tick(self) -> None:
        head = self.head
        if not isinstance(head, Replay) or not head.playing:
            return
        moved = head.tick(self.timeline.times(), PLAY_TICK_S)
        if not moved.playing:
            self.notify("end of the recording", timeout=2)
            self._move(moved)
        elif moved.at != head.at:
            self.head = moved
            self._redraw()
        else:
            self.head = moved

    def action_step(self, n: int) -> None:
        """Next (1) or previous (-1) sample."""
        self._move(self.head.step(self.timeline.times(), n), n)

    def action_jump(self, n: int) -> None:
        """Forward (1) or back (-1) by the jump duration (--jump), to the sample on screen then; over a gap in
        the recording, at least one sample."""
        self._move(self.head.jump(self.timeline.times(), n * self.settings.jump_s), n)

    def _say_end(self, n: int) -> None:
        if not self.timeline.times():
            return
        if n < 0:
            self.notify("the first sample of the recording" if self.replay else "the oldest sample kept", timeout=1.5)
        else:
            self.notify("the last sample of the recording" if self.replay else "the newest sample", timeout=1.5)

    def action_go_to(self, _labelled: bool = True) -> None:
        """Ask for a time ("10m ago", "14:05", ISO 8601) and show the sample on screen then."""
        times = self.timeline.times()
        if not times:
            return

        def check(text: str) -> str | None:
            try:
                ts = self._parse_time(text)
            except DltopError as e:
                return str(e)
            if not times[0] <= ts <= times[-1] + max(self.refresh_s, 1.0):
                return (f"{_hms(ts)} is outside {'the recording' if self.replay else 'the history kept'}: "
                        f"{_hms(times[0])} to {_hms(times[-1])}")
            return None

        def answered(text: str | None) -> None:
            if text is not None:
                from dltop.recorder.times import index_typed

                self._go(times[index_typed(times, self._parse_time(text))])

        self.push_screen(AskScreen(f"Go to ({_hms(times[0])} to {_hms(times[-1])})",
                                   placeholder=TIME_EXAMPLES, check=check), answered)

    def _parse_time(self, text: str) -> float:
        from dltop.recorder.times import parse_time  # pure (no reader, no writer): the one way times are read

        recording = self.feed.recording if isinstance(self.feed, RecordingFeed) else None
        return parse_time(text, self._clock(), cast(Any, recording))

    def action_events(self) -> None:
        """The recording's events; Enter shows the moment of one."""
        if not self.timeline.events():
            self.notify("no events in this recording" if self.replay else "no action seen yet", timeout=2)
            return

        def chosen(ts: float | None) -> None:
            if ts is not None:
                self._go(ts)

        self.push_screen(EventsScreen(self.timeline.events(), self.head.at or 0.0), chosen)

    def action_speed(self, n: int) -> None:
        """Replay faster (1) or slower (-1): ×1, ×10, ×60."""
        if isinstance(self.head, Replay):
            self.head = self.head.faster(n)
            self._redraw()

    def action_mark(self) -> None:
        """Write a marker with a text of your own into the recording (--record)."""
        if self.replay:
            self.notify("m: this is a replay; a marker goes into a live recording (dltop --record DIR, or "
                        "dltop mark)", severity="warning", timeout=4)
            return
        recorder = self.recorder
        if recorder is None:
            self.notify("m: nothing is being recorded (start dltop with --record DIR)", severity="warning",
                        timeout=4)
            return
        now = self._clock()

        def answered(text: str | None) -> None:
            if text is not None:
                recorder.event("marker", {"text": text, "by": "dltop"}, ts=now)
                self.notify(f"marker at {_hms(now)}: {text}", timeout=3)

        self.push_screen(AskScreen(f"Marker at {_hms(now)}", placeholder="what happened"), answered)

    def _jump_text(self) -> str:
        return human_duration(self.settings.jump_s)

    def _set_refresh(self, value: float) -> None:
        self.refresh_s = value
        self.settings = replace(self.settings, refresh_s=value)  # sources rebuilt later follow it too
        self.feed.set_refresh(value)
        self._redraw()

    def action_faster(self) -> None:
        """Refresh more often (down to 0.25 s)."""
        self._set_refresh(_next_step(self.refresh_s, faster=True))

    def action_slower(self) -> None:
        """Refresh less often (up to 30 s)."""
        self._set_refresh(_next_step(self.refresh_s, faster=False))

    async def action_show_tab(self, n: int) -> None:
        """Switch to tab n (1-based); composed first if it never was, so its keys work as soon as it shows."""
        if 1 <= n <= len(self._panes):
            self._tab_pending = False  # the user's choice: the tab that has something no longer moves it
            await self._compose_pane(self._panes[n - 1])  # shown drawn, and able to take the focus
            self._activate(self._panes[n - 1])
        else:
            self.notify(f"no tab {n}: there are {len(self._panes)} tabs (1-{len(self._panes)})", timeout=2)

    def action_help(self) -> None:
        """Show every key of the app and of the visible pane, enabled now or not, and the current hints."""
        rows: list[tuple[str, str]] = []
        seen = set()
        pane = self._active_pane()
        bindings = [*(pane.BINDINGS if pane is not None else []), *self.BINDINGS]
        for binding in bindings:
            if not isinstance(binding, Binding) or not binding.description:
                continue
            if binding.id in HELP_SKIPS or (binding.id or "").startswith("app.tab"):
                continue
            if binding.description in seen:
                continue
            seen.add(binding.description)
            description = HELP_TEXT.get(binding.id or "", binding.description).format(jump=self._jump_text())
            rows.append((binding.key_display or self.get_key_display(binding), description))
        rows.append((f"1-{len(self._panes)}", "switch tab"))
        frame = self._frame()
        hints = [(h.id, h.text + (f" — {h.fix}" if h.fix else "")) for h in self._help_hints(frame[1] if frame else ())]
        self.push_screen(HelpScreen(rows, pane.HELP if pane is not None else "", hints, self.hint_state,
                                    self.set_hint_state))

    def _help_hints(self, hints: Sequence[hint_rules.Hint]) -> list[hint_rules.Hint]:
        """Every hint for ?, in the hint line's order, the muted and snoozed ones after (still listed)."""
        line = self._line_hints(hints)
        return [*line, *(h for h in hints if h not in line)]

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("Pause / resume", "Hold the view, back to live; play or pause a replay (space)",
                            self.action_toggle_pause)
        for title, help_text, action, params in TIME_COMMANDS:
            if self.check_action(action, params):
                yield SystemCommand(title, help_text.format(jump=self._jump_text()),
                                    lambda a=action, p=params: getattr(self, f"action_{a}")(*p))
        if self.recorder is not None:
            yield SystemCommand("Add a marker", "A note of yours in the recording (m)", self.action_mark)
        if not self.replay:
            yield SystemCommand("Refresh faster", "Sample more often (+)", self.action_faster)
            yield SystemCommand("Refresh slower", "Sample less often (-)", self.action_slower)
        yield SystemCommand("Help", "Every key and the current hints (?)", self.action_help)
        for i, pane in enumerate(self._panes, start=1):
            yield SystemCommand(f"Show {pane.TITLE}", f"Switch to tab {i}", partial(self.action_show_tab, i))
        if self.query_one("#tabs", TabbedContent).disabled:
            return  # too small: the panes are hidden, and so are their actions
        for i, pane in enumerate(self._panes, start=1):
            # A pane's actions work on its selection: the command shows that pane first, then acts.
            for cmd in pane.palette_commands():
                yield SystemCommand(cmd.title, cmd.help, self._on_tab(i, cmd.callback))

    def _on_tab(self, n: int, action: Callable[[], object]) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            pane = self._panes[n - 1]
            switching = self._active_pane() is not pane
            if switching:  # the action waits for the tab's activation, which focuses the tab's own widget
                self._after_activated[pane.PANE_ID] = action
            await self.action_show_tab(n)  # composed first where it was never shown
            if self._view is not None:
                pane.show(self._view)  # its rows (the selection acted on) are there before it acts
            if not switching:
                self.call_after_refresh(action)

        return run
