"""The main screen: the header, one tab per cache layer, the hint line and the footer. It owns the layout, the keys
of the app and the drawing of what the Session's `view()` says; the App around it holds the Session, the feed and
the runner (toolong's pattern: the container owns the bindings)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from typing import Any

from rich.cells import cell_len
from textual import events
from textual.app import ComposeResult, SystemCommand
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer, Static, TabbedContent, TabPane
from textual.widgets._footer import FooterKey  # not exported by textual.widgets (textual pinned to 8.2.x)

from dltop.fmt import human_duration
from dltop.hints import tab_of
from dltop.playhead import Playhead, Replay
from dltop.session import Session
from dltop.tui.lines import header_text, hint_text, hms
from dltop.tui.panes import pane_classes
from dltop.tui.panes.base import Pane, set_content
from dltop.tui.screens.ask import AskScreen
from dltop.tui.screens.events import EventsScreen
from dltop.tui.screens.help import HelpScreen, key_rows
from dltop.view import View

MIN_WIDTH, MIN_HEIGHT = 80, 24
# The footer's order of the app's keys after the tab's own (1: always there), the others after, greyed keys last
APP_RANKS = {"help": 1, "pause": 2, "live": 2, "play": 2, "app.quit": 3}
PLAY_TICK_S = 0.25  # a replay that plays moves on this often (at x10 over a 1 s recording: every 2-3 samples)
TIME_EXAMPLES = "10m ago, 14:05, 2026-12-01T14:05:00"
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


class KeyFooter(Footer):
    """Textual's Footer, cut to what fits the width: `? Help` (every key) and `^p Menu` (every action) always,
    then the tab's own keys that act now, what space does now, `q Quit`, the app's other keys, and keys greyed
    out now where room is left (APP_RANKS). Shown in the bindings' order, ^p on the right."""

    def compose(self) -> ComposeResult:
        if not self._bindings_ready:
            return
        keys, palette = self._keys()
        room = (self.size.width or self.app.size.width) - (self._width(palette[0][1]) + 1 if palette else 0)
        shown = self._fitting(keys, room)
        for _rank, binding, enabled, tooltip in [*(k for k in keys if k[1].action in shown), *palette]:
            yield FooterKey(binding.key, self.app.get_key_display(binding), binding.description, binding.action,
                            classes="-command-palette" if binding.key == self.app.COMMAND_PALETTE_BINDING else "",
                            disabled=not enabled, tooltip=tooltip).data_bind(compact=Footer.compact)

    def _fitting(self, keys: list[tuple[int, Binding, bool, str]], room: int) -> set[str]:
        """The actions whose keys fit in `room` columns: ? Help (rank 1) always, then the others rank by rank."""
        shown = {b.action for rank, b, _e, _t in keys if rank == 1}
        room -= sum(self._width(b) for rank, b, _e, _t in keys if rank == 1)
        for rank, binding, _enabled, _tip in sorted(keys, key=lambda k: k[0]):
            if rank != 1 and self._width(binding) <= room:
                shown.add(binding.action)
                room -= self._width(binding)
        return shown

    def _keys(self) -> tuple[list[tuple[int, Binding, bool, str]], list[tuple[int, Binding, bool, str]]]:
        """The keys to show, (rank, binding, enabled, tooltip) in the bindings' order (the lower the rank, the
        sooner it is given room), one per action as Textual's Footer does (space and p pause); and ^p's."""
        keys: list[tuple[int, Binding, bool, str]] = []
        palette: list[tuple[int, Binding, bool, str]] = []
        actions = set()
        for node, binding, enabled, tooltip in self.screen.active_bindings.values():
            if binding.key == self.app.COMMAND_PALETTE_BINDING:
                palette = [(0, binding, enabled, tooltip or binding.description)]
            elif binding.show and binding.action not in actions:
                actions.add(binding.action)
                own = isinstance(node, Widget) and any(isinstance(n, Pane) for n in (node, *node.ancestors))
                keys.append((5 if not enabled else 0 if own else APP_RANKS.get(binding.action, 4), binding, enabled,
                             tooltip))
        return keys, palette

    def _width(self, binding: Binding) -> int:
        """Columns a key takes in the compact footer: the key, a space, its label and the margin after."""
        return cell_len(self.app.get_key_display(binding)) + 1 + cell_len(binding.description) + 1

    def on_resize(self, event: events.Resize) -> None:
        self.call_after_refresh(self.recompose)


class MainScreen(Screen[None]):
    """The panes in their tabs between the header and the hint line; every key of the app (but Ctrl-C and the
    palette's, which act from any screen) with its footer label."""

    # The app's ids ("app.quit"): the help's rows and a keymap name them so.
    BINDINGS = [
        Binding("q", "app.quit", "Quit", id="app.quit"),
        Binding("question_mark", "help", "Help", id="app.help"),
        # Space (and p) pauses the view, goes back to live, or plays a replay: one of the three is enabled at a
        # time (dltop/playhead.py's KEYS), so the footer names what the key does now.
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
        *[Binding(str(i), f"show_tab({i})", f"Tab {i}", show=False, id=f"app.tab{i}") for i in range(1, 10)],
    ]

    def __init__(self, session: Session) -> None:
        super().__init__()
        self.session = session
        self.panes: list[Pane] = [cls() for cls in pane_classes(cluster=session.settings.prometheus is not None)]
        self._view: View | None = None
        self._mounting: dict[str, Any] = {}  # PANE_ID -> its mount under way or done (_compose_pane)
        # PANE_ID -> a palette entry's action, run once its tab's activation (and the focus it gives) is done
        self._after_activated: dict[str, Callable[[], object]] = {}
        # Set once the widgets are there: the app's first frame waits for it (the screen composes on its own task)
        self._composed = asyncio.Event()

    def compose(self) -> ComposeResult:
        yield Static(id="header")
        yield Static(id="too-small")
        # The tabs' panes are not composed here: only the one on screen is, before the first frame (open), and
        # each other one when first shown (_compose_pane). Six panes' widgets cost ~0.2 s before the first frame.
        with TabbedContent(id="tabs"):
            for i, pane in enumerate(self.panes, start=1):
                yield TabPane(f"{i} {pane.TITLE}", id=f"tab-{pane.PANE_ID}")
        yield Static(id="hints")
        yield KeyFooter(compact=True)

    def on_mount(self) -> None:
        self._composed.set()

    async def open(self) -> None:
        """The first frame, once the widgets are there: the opening tab, composed and drawn."""
        await self._composed.wait()
        self._play_timer = self.set_interval(PLAY_TICK_S, self._play_tick, pause=True)
        self.session.open()
        self.choose_tab()
        self.draw()
        pane = self.active_pane()
        if pane is not None:
            await self._compose_pane(pane)
        self.check_size()

    def pane(self, pane_id: str) -> Pane:
        """The pane of the tab `pane_id` ("gpu", "datasets", ...)."""
        return next(p for p in self.panes if pane_id == p.PANE_ID)

    def check_size(self, w: int | None = None, h: int | None = None) -> None:
        """Below 80×24 (the terminal's size, or `w`×`h`), say so in place of the panes (and take their keys away)."""
        if w is None or h is None:
            w, h = self.app.size
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
        pane = self.active_pane()
        if not small and pane is not None and pane.is_mounted:
            pane.focus_default()

    # -- drawing --------------------------------------------------------------------------------------------

    def choose_tab(self) -> None:
        """Open on the tab asked for, else on the one that has something (while the user has not picked one)."""
        if not self.session.tabs.pending or not self.widgets_up():
            return
        tab = self.session.tabs.switch([p.PANE_ID for p in self.panes], self.session.settings, self.session.history)
        if tab is not None:
            self._activate(self.pane(tab))
        pane = self.active_pane()
        if not self.session.tabs.pending and pane is not None:
            self.session.tabs.shown(pane.PANE_ID)

    def draw(self) -> None:
        """Header, hint line and visible pane for the moment on screen."""
        frame = self.session.frame()
        if frame is None or not self.widgets_up():
            return
        set_content(self.query_one("#header", Static), header_text(self.session, frame[0][-1]))
        self.update_hints()
        self.show()

    def widgets_up(self) -> bool:
        """The screen's widgets are there: not yet, or no longer once Textual tears the screen down on exit
        while a tick from the feed is still on its way (it would find no #header)."""
        try:
            self.query_one("#header")
        except NoMatches:
            return False
        return True

    def show(self) -> None:
        """Hand the visible pane the Session's view of the moment on screen (the hidden ones keep it, not drawn,
        so their keys and palette entries see the truth)."""
        view = self.session.view()
        if view is None or not self.widgets_up():
            return
        self._view = view
        active = self.active_pane()
        for pane in self.panes:
            if pane is active and pane.is_mounted:
                pane.show(view)
            else:
                pane.view = view

    def update_hints(self) -> None:
        """The hint line for the tab on screen, cut to the width."""
        widget = self.query_one("#hints", Static)
        pane = self.active_pane()
        tab = pane.PANE_ID if pane is not None else None
        hints = self.session.line_hints(tab)
        widget.display = bool(hints)
        if hints:
            own = tab is not None and tab_of(hints[0].id) == tab
            set_content(widget, hint_text(hints, own, max(20, self.app.size.width - 2), self.app.console))

    # -- tabs -----------------------------------------------------------------------------------------------

    def active_pane(self) -> Pane | None:
        """The pane of the tab on screen."""
        active = self.query_one("#tabs", TabbedContent).active
        return next((p for p in self.panes if active == f"tab-{p.PANE_ID}"), None)

    async def tab_activated(self, event: TabbedContent.TabActivated) -> None:
        """Hidden panes are not updated on ticks: bring the one that just became visible up to date now (a pane
        shown for the first time is composed first). Run on the app's loop (DltopApp hands the message on): this
        screen's own loop would wait for the mount, and the layout the new pane's tables ask for got lost."""
        pane = self.active_pane()
        if pane is None:
            return
        if not pane.is_mounted:
            # The hidden tab's focused widget would hand the focus to a sibling while this one is composed,
            # and its tab would take the screen back (TabbedContent follows the focus).
            event.tabbed_content.screen.set_focus(None)
            await self._compose_pane(pane)
        elif self._view is not None:
            pane.show(self._view)
        if pane is self.active_pane():
            pane.focus_default()
        self.session.tabs.shown(pane.PANE_ID)
        if self.widgets_up():
            self.update_hints()  # this tab's own hints first
        act = self._after_activated.pop(pane.PANE_ID, None)
        if act is not None:  # after the tab's own focus, so what the action focuses keeps it
            self.call_after_refresh(act)

    def _activate(self, pane: Pane) -> None:
        """Show `pane`'s tab. The focus leaves the tab hidden first: a focused widget that is hidden hands the
        focus to a sibling (Textual blurs it on Hide), and TabbedContent, which follows the focus, would show
        that tab again; the tab shown takes the focus when activated (on_tabbed_content_tab_activated)."""
        tabs = self.query_one("#tabs", TabbedContent)
        focused = self.focused  # this screen's, also while a dialog is open over it
        if focused is not None and pane not in focused.ancestors:
            self.set_focus(None)
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
        if self._view is not None and self.widgets_up():
            pane.show(self._view)

    async def action_show_tab(self, n: int) -> None:
        """Switch to tab n (1-based); composed first if it never was, so its keys work as soon as it shows."""
        if 1 <= n <= len(self.panes):
            self.session.tabs.pending = False  # the user's choice: the tab that has something no longer moves it
            await self._compose_pane(self.panes[n - 1])  # shown drawn, and able to take the focus
            self._activate(self.panes[n - 1])
        else:
            self.notify(f"no tab {n}: there are {len(self.panes)} tabs (1-{len(self.panes)})", timeout=2)

    # -- moving in time: live, the past is the session's own history (sampling goes on meanwhile, and so does
    # --record); in a replay it is the recording, and playing moves through it at the speed chosen.

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return self.session.allows(action, parameters)

    def _move(self, head: Playhead | None, n: int = 0) -> None:
        """Show the moment `head` is at; None: already at the end that `n` points to (said so)."""
        if head is None:
            if self.session.times():
                self.notify(self.session.end_text(n), timeout=1.5)
            return
        self.session.head = head
        self.draw()
        if head.past:
            # A pane's layout follows what it drew last (a rates line more, a note less): live, the next tick
            # draws at the settled layout; a moment moved to has no next tick, so it is drawn again once laid out.
            self.call_after_refresh(self.show)
        self.app.refresh_bindings()
        if isinstance(head, Replay):
            (self._play_timer.resume if head.playing else self._play_timer.pause)()

    def _go(self, ts: float) -> None:
        if self.session.times():
            self._move(self.session.head.go(self.session.times(), ts))

    def action_pause(self) -> None:
        """Live: hold the view on the moment shown while sampling goes on. A replay: stop playing."""
        self._move(self.session.head.pause(self.session.times()))

    def action_live(self) -> None:
        """Back to the live view."""
        self._move(self.session.head.live())

    def action_play(self) -> None:
        """Play the replay from the moment shown, at the speed chosen (from the start again at its end)."""
        if isinstance(self.session.head, Replay):
            self._move(self.session.head.play(self.session.times()))

    def action_toggle_pause(self) -> None:
        """Pause / back to live, or play / pause a replay: what space does now."""
        action = next(a for a in ("pause", "live", "play") if self.check_action(a, ()))
        getattr(self, f"action_{action}")()

    def _play_tick(self) -> None:
        head = self.session.head
        if isinstance(head, Replay) and head.playing:
            moved = head.tick(self.session.times(), PLAY_TICK_S)
            if not moved.playing:
                self.notify("end of the recording", timeout=2)
                self._move(moved)
                return
            self.session.head = moved
            if moved.at != head.at:
                self.draw()

    def action_step(self, n: int) -> None:
        """Next (1) or previous (-1) sample."""
        self._move(self.session.head.step(self.session.times(), n), n)

    def action_jump(self, n: int) -> None:
        """Forward (1) or back (-1) by the jump duration (--jump), to the sample on screen then; over a gap in
        the recording, at least one sample."""
        self._move(self.session.head.jump(self.session.times(), n * self.session.settings.jump_s), n)

    def action_speed(self, n: int) -> None:
        """Replay faster (1) or slower (-1): ×1, ×10, ×60."""
        if isinstance(self.session.head, Replay):
            self.session.head = self.session.head.faster(n)
            self.draw()

    def action_go_to(self, _labelled: bool = True) -> None:
        """Ask for a time ("10m ago", "14:05", ISO 8601) and show the sample on screen then."""
        times = self.session.times()
        if times:
            self.app.push_screen(AskScreen(f"Go to ({hms(times[0])} to {hms(times[-1])})",
                                           placeholder=TIME_EXAMPLES, check=self.session.time_refusal),
                                 lambda text: None if text is None else self._move(self.session.go_typed(text)))

    def action_events(self) -> None:
        """The recording's events; Enter shows the moment of one."""
        if not self.session.timeline.events():
            self.notify("no events in this recording" if self.session.replay else "no action seen yet", timeout=2)
            return
        self.app.push_screen(EventsScreen(self.session.timeline.events(), self.session.head.at or 0.0),
                             lambda ts: None if ts is None else self._go(ts))

    def action_mark(self) -> None:
        """Write a marker with a text of your own into the recording (--record)."""
        refused = self.session.mark_refusal()
        if refused is not None:
            self.notify(refused, severity="warning", timeout=4)
            return
        now = self.session.clock()
        self.app.push_screen(AskScreen(f"Marker at {hms(now)}", placeholder="what happened"),
                             lambda text: None if text is None else self.session.mark(text, now))

    def action_faster(self) -> None:
        """Refresh more often (down to 0.25 s)."""
        self.session.set_refresh(faster=True)
        self.draw()

    def action_slower(self) -> None:
        """Refresh less often (up to 30 s)."""
        self.session.set_refresh(faster=False)
        self.draw()

    def action_help(self) -> None:
        """Show every key of the app and of the visible pane, enabled now or not, and the current hints."""
        pane = self.active_pane()
        jump = human_duration(self.session.settings.jump_s)
        bindings = [*(pane.BINDINGS if pane is not None else []), *self.BINDINGS, *self.app.BINDINGS]
        rows = key_rows(bindings, self.app.get_key_display, jump)
        rows.append((f"1-{len(self.panes)}", "switch tab"))
        hints = self.session.help_hints(pane.PANE_ID if pane is not None else None)
        self.app.push_screen(HelpScreen(rows, pane.HELP if pane is not None else "", hints, self.session.quieted,
                                        self.hints_quieted))

    def hints_quieted(self) -> None:
        """A hint was muted, snoozed or brought back in ?: the hint line follows at once."""
        self.session.hints_quieted()
        if self.widgets_up():
            self.update_hints()

    # -- the palette's entries (the app's get_system_commands hands them on) --------------------------------

    def system_commands(self) -> Iterator[SystemCommand]:
        """The palette's entries of the app: moving in time, refresh, help, the tabs, the panes' actions."""
        yield SystemCommand("Pause / resume", "Hold the view, back to live; play or pause a replay (space)",
                            self.action_toggle_pause)
        jump = human_duration(self.session.settings.jump_s)
        for title, help_text, action, params in TIME_COMMANDS:
            if self.check_action(action, params):
                yield SystemCommand(title, help_text.format(jump=jump),
                                    lambda a=action, p=params: getattr(self, f"action_{a}")(*p))
        if self.session.recorder is not None:
            yield SystemCommand("Add a marker", "A note of yours in the recording (m)", self.action_mark)
        if not self.session.replay:
            yield SystemCommand("Refresh faster", "Sample more often (+)", self.action_faster)
            yield SystemCommand("Refresh slower", "Sample less often (-)", self.action_slower)
        yield SystemCommand("Help", "Every key and the current hints (?)", self.action_help)
        for i, pane in enumerate(self.panes, start=1):
            yield SystemCommand(f"Show {pane.TITLE}", f"Switch to tab {i}", partial(self.action_show_tab, i))
        if self.query_one("#tabs", TabbedContent).disabled:
            return  # too small: the panes are hidden, and so are their actions
        for i, pane in enumerate(self.panes, start=1):
            # A pane's actions work on its selection: the command shows that pane first, then acts.
            for cmd in pane.palette_commands():
                yield SystemCommand(cmd.title, cmd.help, self._on_tab(i, cmd.callback))

    def _on_tab(self, n: int, action: Callable[[], object]) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            pane = self.panes[n - 1]
            switching = self.active_pane() is not pane
            if switching:  # the action waits for the tab's activation, which focuses the tab's own widget
                self._after_activated[pane.PANE_ID] = action
            await self.action_show_tab(n)  # composed first where it was never shown
            if self._view is not None:
                pane.show(self._view)  # its rows (the selection acted on) are there before it acts
            if not switching:  # (this runs on the app's loop: the palette calls it so)
                self.call_after_refresh(action)

        return run
