"""The dltop app: a shell over the Session (dltop/session.py) and the main screen (tui/screens/main.py). It holds
the Session, starts the feed and hands its Snapshots to the Session, routes the panes' requests and the action
runner's events to it, and watches what is outside the TUI; the main screen composes, takes the keys and draws."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from textual import events, on, work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.widgets import TabbedContent

from dltop.config import Settings
from dltop.fmt import printable, printable_lines
from dltop.model import Snapshot
from dltop.session import RecordSink, Said, Session
from dltop.timeline import Feed, LiveEvent, Recorded
from dltop.tui import messages as msgs
from dltop.tui.outside import watch_outside
from dltop.tui.panes.base import Pane
from dltop.tui.screens.confirm import ConfirmScreen, KeepLocksScreen, plan_dialog
from dltop.tui.screens.main import MainScreen

LEAVE_WITHIN_S = 3.0  # after a kill or a hangup, at most this long before the process is gone
SLOW_HOLD_S = 1.0  # the slow sources start after the first frame, or this long after the start at the latest


class DltopApp(App[None]):
    """Top-like monitor of the cache layers; every action has a key, a footer label and a palette entry."""

    CSS_PATH = Path(__file__).with_name("app.tcss")
    TITLE = "dltop"
    ENABLE_COMMAND_PALETTE = True
    # The keys that act from every screen; the others are the main screen's (MainScreen.BINDINGS).
    BINDINGS = [
        # top and htop quit on Ctrl-C too; Textual's default only explains how to quit.
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True, id="app.interrupt"),
        Binding("ctrl+p", "command_palette", "Menu", key_display="^p", id="app.palette"),
    ]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (32, "-tall")]

    def __init__(self, feed: Feed | None = None, settings: Settings | None = None,
                 clock: Callable[[], float] = time.time, runner: Any = None, own_signals: bool = False,
                 listeners: Sequence[Callable[[Snapshot], None]] = (), recorder: RecordSink | None = None,
                 recorded: Recorded | None = None) -> None:
        """Live on `feed`, or a replay of `recorded`."""
        super().__init__()
        self._own_signals = own_signals  # a real run (not a test's): SIGTERM and SIGHUP leave as q does
        if runner is None:
            from dltop.actions.runner import ActionRunner

            runner = ActionRunner()
        self.session = Session(feed, settings, recorded=recorded, runner=runner, clock=clock, recorder=recorder,
                               listeners=listeners)
        self.session.on_say = self._toast
        self._watch_done = threading.Event()  # set when the TUI leaves: the watch thread ends
        self.main = MainScreen(self.session)

    def get_default_screen(self) -> Screen[Any]:
        return self.main

    # The main screen's seams the tests and benchmarks use: the panes, a draw, a show.
    @property
    def panes(self) -> list[Pane]:
        """The panes, one per tab, in the tabs' order."""
        return self.main.panes

    def draw(self) -> None:
        """Header, hint line and visible pane for the moment on screen."""
        self.main.draw()

    def show(self) -> None:
        """The visible pane drawn again for the moment on screen (the main screen's show)."""
        self.main.show()

    def on_load(self) -> None:
        if self._own_signals:
            # Leave as q does — alternate screen, mouse tracking and cursor restored — on a kill or a hangup
            # (the default action would leave the terminal needing `reset`). Installed before the terminal is
            # put in application mode, so no moment is left uncovered.
            loop = asyncio.get_running_loop()
            for sig, code in ((signal.SIGTERM, 143), (signal.SIGHUP, 129)):
                loop.add_signal_handler(sig, self._leave, code)

    async def on_mount(self) -> None:
        feed = self.session.feed
        self.session.runner.subscribe(lambda ev: self.post_message(msgs.ActionEventPosted(ev)))
        # Back from a suspend (Ctrl-Z, fg): the terminal's screen was the shell's, so every cell is drawn again
        # (Textual redrew only what changed: the tab bar and the panes stayed blank until a tab switch)
        self.app_resume_signal.subscribe(self, lambda _app: self.screen.refresh(repaint=True, layout=True))
        journal = None
        if not self.session.replay:
            # Actions run anywhere on the machine (a warm from a shell, another TUI) reach this event list too:
            # the journals this user trusts, tailed off the UI loop.
            from dltop.journal import JournalTail

            journal = JournalTail(skip_pid=os.getpid())
        # The terminal (unconditionally: a hangup that came before this point, its exit() too early to take, is
        # caught at the first check) and the journals are watched on one thread for the TUI's life (outside.py).
        tty = not self.is_headless
        if tty or journal is not None:
            args = (self._watch_done, asyncio.get_running_loop(), tty, journal, self._leave, self._add_live_events)
            threading.Thread(target=watch_outside, args=args, name="dltop-watch", daemon=True).start()
        if feed is not None:
            # The slow sources start once the first frame is drawn (or SLOW_HOLD_S later): a dataset's first
            # scan on its thread took half the GIL from it, and the screen came up 0.2-0.4 s later.
            feed.start(hold_slow_s=SLOW_HOLD_S)
            self.call_after_refresh(feed.release_slow)
            await feed.wait_first(timeout_s=0.3)
        await self.main.open()
        if feed is not None:
            self._consume(feed)

    @work(exclusive=True, group="feed")
    async def _consume(self, feed: Feed) -> None:
        async for snap in feed.stream(lambda: self.session.settings.refresh_s):
            self.apply(snap)

    def apply(self, snap: Snapshot) -> None:
        """A Snapshot from the feed: into the Session, then drawn."""
        if self.session.apply(snap):
            self.main.choose_tab()
            self.main.draw()

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = True) -> None:
        """Every message for the user (the panes' too) goes into the Session's log (`session.said`) and shows."""
        self.session.say(message, severity, timeout, title)

    def _toast(self, said: Said) -> None:
        # Always as plain text: notifications carry paths, URLs, error messages and a marker's words, and Rich
        # markup in them ("/data/a[/b]") would show wrong or raise MarkupError and take the TUI down.
        # And escaped: they carry other users' paths and argv (fmt.printable_lines).
        super().notify(printable_lines(said.text), title=printable(said.title), severity=said.severity,
                       timeout=said.timeout, markup=False)

    def on_unmount(self) -> None:
        self._watch_done.set()
        self.session.runner.close()  # cancel what runs, unlock what is locked
        if self.session.feed is not None:
            self.session.feed.close()

    async def action_quit(self) -> None:
        """q and Ctrl-C: with a lock held, ask first whether a holder keeps it or it is released."""
        held = self.session.held_locks()
        if not held:
            self.exit()
            return

        def answer(choice: str | None) -> None:
            if choice == "release":
                self.session.release_locks()
            if choice == "release" or (choice == "keep" and self.session.keep_locks()):
                self.exit()

        if not isinstance(self.screen, KeepLocksScreen):
            self.push_screen(KeepLocksScreen(held), answer)

    def _leave(self, code: int) -> None:
        """Exit as q does, a held lock kept by a holder (nobody is left to ask); if restoring a terminal that hung
        up wedges the shutdown, end the process anyway."""
        self.exit(return_code=code)
        self.session.keep_locks("on hangup" if code == 129 else "on SIGTERM")
        self.session.runner.close()  # what no holder took is released: the watchdog's os._exit skips on_unmount
        watchdog = threading.Timer(LEAVE_WITHIN_S, os._exit, (code,))
        watchdog.daemon = True
        watchdog.start()

    def on_resize(self, event: events.Resize) -> None:
        if self.main.widgets_up():
            self.main.check_size(event.size.width, event.size.height)
            self.main.update_hints()  # re-cut to the new width

    async def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        await self.main.tab_activated(event)

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield from self.main.system_commands()

    # -- what panes ask for: actions through the Session's gate and the runner, sources that change ----------

    @on(msgs.ActionRequested)
    def _requested(self, msg: msgs.ActionRequested) -> None:
        msg.stop()
        self.session.request(msg.action, msg.path)

    def on_signal_requested(self, msg: msgs.SignalRequested) -> None:
        msg.stop()
        self.session.send_signal(msg.target)

    def on_action_event_posted(self, msg: msgs.ActionEventPosted) -> None:
        first = not self.session.timeline.events()
        plan = self.session.on_action(msg.event)
        if first and self.session.timeline.events():
            self.refresh_bindings()  # the first event puts `v` in the footer
        if plan is not None:
            from dltop.actions.runner import spec_of

            title, body, yes = plan_dialog(plan, spec_of(plan.action).verb)
            self.push_screen(ConfirmScreen(title, body, yes_label=yes),
                             lambda ok: self.session.start(plan) if ok else None)
        self.main.show()

    def warn(self, text: str) -> None:
        """Show a warning from any thread (the recorder's: the disk is full, samples dropped)."""
        self.post_message(msgs.Warned(text))

    def on_warned(self, msg: msgs.Warned) -> None:
        self.notify(msg.text, severity="warning", timeout=8)

    def on_rescan_requested(self, msg: msgs.RescanRequested) -> None:
        msg.stop()
        self.session.read_now(msg.source, msg.key)

    def on_cancel_requested(self, msg: msgs.CancelRequested) -> None:
        msg.stop()
        self.session.runner.cancel()

    def on_dataset_add_requested(self, msg: msgs.DatasetAddRequested) -> None:
        msg.stop()
        self.session.add_dataset(msg.path)
        self.main.show()

    def on_dataset_remove_requested(self, msg: msgs.DatasetRemoveRequested) -> None:
        msg.stop()
        self.session.remove_dataset(msg.path)
        self.main.show()

    def on_server_add_requested(self, msg: msgs.ServerAddRequested) -> None:
        msg.stop()
        self.session.add_server(msg.text)
        self.main.show()

    def on_server_remove_requested(self, msg: msgs.ServerRemoveRequested) -> None:
        msg.stop()
        self.session.remove_server(msg.text)
        self.main.show()

    def _add_live_events(self, found: Sequence[LiveEvent]) -> None:
        """Events for `v` live; the first one puts `v` in the footer."""
        if self.session.add_events(found):
            self.refresh_bindings()
