"""The dltop app: a header, one tab per cache layer, the hint line and the footer. It only draws what the feed hands it."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from rich.text import Text
from textual import events, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Static, TabbedContent, TabPane

from dltop import hints as hint_rules
from dltop.config import MAX_REFRESH_S, MIN_REFRESH_S, Settings, server_url
from dltop.errors import DltopError
from dltop.fmt import human_duration
from dltop.model import CachesPart, Snapshot
from dltop.model.actions import ActionEvent, ActionPlan
from dltop.model.datasets import DatasetsPart
from dltop.tui.messages import (
    ActionEventPosted,
    ActionRequested,
    CancelRequested,
    ClearRequested,
    DatasetAddRequested,
    DatasetRemoveRequested,
    EvictRequested,
    LockRequested,
    ServerAddRequested,
    ServerRemoveRequested,
    WarmRequested,
)
from dltop.tui.panes import pane_classes
from dltop.tui.panes.base import Pane, set_content
from dltop.tui.screens.confirm import ConfirmScreen, plan_dialog
from dltop.tui.screens.help import HelpScreen
from dltop.tui.view import View

MIN_WIDTH, MIN_HEIGHT = 80, 24
HISTORY_LEN = 600  # ten minutes at the default refresh: what the sparklines show
REFRESH_STEPS = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
HINT_LINES = 2
LEAVE_WITHIN_S = 3.0  # after a kill or a hangup, at most this long before the process is gone


class Feed(Protocol):
    """Where Snapshots come from: the live Sampler, or a list of recorded ones."""

    paused: bool

    def start(self) -> None: ...
    def snapshot(self) -> Snapshot: ...
    def backlog(self) -> list[Snapshot]: ...
    def set_refresh(self, interval_s: float) -> None: ...
    def reconfigure(self, settings: Settings) -> None: ...
    def read_now(self, name: str, key: str | None = None) -> None: ...
    async def wait_first(self, timeout_s: float = 1.0) -> None: ...
    def stream(self, interval_s: Callable[[], float]) -> AsyncIterator[Snapshot]: ...
    def close(self) -> None: ...


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
        Binding("p", "toggle_pause", "Pause", id="app.pause"),
        # One footer label for both refresh keys, so every key of the busiest tab fits 80 columns.
        Binding("plus,equals_sign", "faster", "Refresh", key_display="+/-", id="app.faster"),
        Binding("minus", "slower", "Slower", show=False, id="app.slower"),
        Binding("ctrl+p", "command_palette", "Menu", key_display="^p", id="app.palette"),
        *[Binding(str(i), f"show_tab({i})", f"Tab {i}", show=False, id=f"app.tab{i}") for i in range(1, 10)],
    ]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (32, "-tall")]

    def __init__(self, feed: Feed, settings: Settings | None = None, replay: bool = False,
                 clock: Callable[[], float] = time.time, runner: Any = None, own_signals: bool = False,
                 listeners: Sequence[Callable[[Snapshot], None]] = ()) -> None:
        super().__init__()
        self._own_signals = own_signals  # a real run (not a test's): SIGTERM and SIGHUP leave as q does
        self.feed = feed
        if runner is None:
            from dltop.actions.runner import ActionRunner

            runner = ActionRunner()
        self.runner = runner  # every warm, evict and lock runs here; its events come back as messages
        self._runs: dict[int, Any] = {}  # plans in flight, by run id: their result opens the confirmation
        self._action: ActionEvent | None = None
        self.settings = settings or Settings()
        self.refresh_s = self.settings.refresh_s
        self.replay = replay
        self._clock = clock
        self.history: deque[Snapshot] = deque(maxlen=HISTORY_LEN)
        self.hints: list[hint_rules.Hint] = []
        self._view: View | None = None
        self._panes: list[Pane] = [cls() for cls in pane_classes()]
        self._listeners = tuple(listeners)  # each Snapshot shown is handed on too (`dltop --export`'s collector)

    # -- layout ---------------------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Static(id="header")
        yield Static(id="too-small")
        with TabbedContent(id="tabs"):
            for i, pane in enumerate(self._panes, start=1):
                with TabPane(f"{i} {pane.TITLE}", id=f"tab-{pane.PANE_ID}"):
                    yield pane
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
        if not self.is_headless:
            # Unconditionally: a hangup that came before this point (its exit() too early to take) is caught
            # at the first tick.
            self.set_interval(1.0, self._exit_if_terminal_gone)
        self.runner.subscribe(lambda ev: self.post_message(ActionEventPosted(ev)))
        self.feed.start()
        await self.feed.wait_first(timeout_s=0.3)
        for snap in self.feed.backlog():
            self.history.append(snap)
        self._apply(self.feed.snapshot())
        self._check_size()
        self._consume()

    @work(exclusive=True, group="feed")
    async def _consume(self) -> None:
        async for snap in self.feed.stream(lambda: self.refresh_s):
            self._apply(snap)

    def on_unmount(self) -> None:
        self.runner.close()  # cancel what runs, unlock what is locked
        self.feed.close()

    def _exit_if_terminal_gone(self) -> None:
        # After an SSH drop with SIGHUP ignored (nohup, some multiplexers) the tty reads EOF forever and
        # Textual's input thread spins on it at 100% CPU next to the training job. A monitor with no
        # terminal has nothing to do: leave.
        if not os.isatty(0):
            self._leave(129)

    def _leave(self, code: int) -> None:
        """Exit as q does; if restoring a terminal that hung up wedges the shutdown, end the process anyway."""
        self.exit(return_code=code)
        self.runner.close()  # unlock now: the watchdog's os._exit would skip on_unmount
        watchdog = threading.Timer(LEAVE_WITHIN_S, os._exit, (code,))
        watchdog.daemon = True
        watchdog.start()

    def on_resize(self, event: events.Resize) -> None:
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
        if not small and pane is not None:
            pane.focus_default()

    # -- data -----------------------------------------------------------------------------------------------

    def _apply(self, snap: Snapshot) -> None:
        if self.history and snap is self.history[-1]:
            return
        self.history.append(snap)
        for listen in self._listeners:
            listen(snap)
        self.hints = hint_rules.hints(list(self.history))
        self._update_header(snap)
        self._update_hints()
        self._show()

    def _show(self) -> None:
        """Hand the visible pane a View of the latest Snapshot and of the actions' state."""
        if not self.history:
            return
        self._view = View(snapshot=self.history[-1], history=tuple(self.history), hints=tuple(self.hints),
                          read_only=self.settings.read_only, replay=self.replay,
                          watched=tuple(self.settings.datasets), action=self._action,
                          busy=self.runner.busy is not None, held=self.runner.held())
        active = self._active_pane()
        for pane in self._panes:
            if pane is active:
                pane.show(self._view)
            else:
                pane.view = self._view  # not drawn while hidden, but its keys and palette entries see the truth

    def _active_pane(self) -> Pane | None:
        active = self.query_one("#tabs", TabbedContent).active
        for pane in self._panes:
            if active == f"tab-{pane.PANE_ID}":
                return pane
        return None

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        # Hidden panes are not updated on ticks: bring the one that just became visible up to date now.
        pane = self._active_pane()
        if pane is not None:
            if self._view is not None:
                pane.show(self._view)
            pane.focus_default()

    def _update_header(self, snap: Snapshot) -> None:
        t = Text()
        t.append("dltop", "bold")
        t.append(f" · {snap.host}")
        if snap.uptime_s is not None:
            t.append(f" · up {human_duration(snap.uptime_s)}")
        t.append(f" · every {self.refresh_s:g}s")
        t.append(" · " + time.strftime("%H:%M:%S", time.localtime(snap.ts)))
        if self.replay:
            t.append("  REPLAY", "bold magenta")
        if self.feed.paused:
            t.append("  PAUSED", "bold reverse")
        troubled = [s for s in snap.sources.values() if s.error]
        for s in troubled:
            t.append(f"  ⚠ {s.name}: {s.error}", "bold yellow")
        if self.settings.read_only:
            t.append("  read-only", "dim")
        set_content(self.query_one("#header", Static), t)

    def _update_hints(self) -> None:
        widget = self.query_one("#hints", Static)
        if not self.hints:
            widget.display = False
            return
        h = self.hints[0]
        style = {"critical": "bold red", "warn": "bold yellow", "info": "bold"}[h.severity]
        t = Text.assemble(("! " if h.severity != "info" else "i ", style), (h.text, style))
        if h.fix:
            t.append(f" — {h.fix}", "italic")
        more = f"  (+{len(self.hints) - 1} more, see ?)" if len(self.hints) > 1 else ""
        t.append(more, "dim")
        set_content(widget, _fit_lines(t, max(20, self.size.width - 2), HINT_LINES, self.console))
        widget.display = True

    # -- what panes ask for: actions through the runner, sources that change -------------------------------

    def _request(self, msg: ActionRequested) -> None:
        msg.stop()
        if self.settings.read_only or self.replay:
            self.notify(f"{msg.action}: {'read-only' if self.settings.read_only else 'replay'}: nothing may change "
                        "the system", severity="warning")
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

    def on_cancel_requested(self, msg: CancelRequested) -> None:
        msg.stop()
        self.runner.cancel()

    def on_action_event_posted(self, msg: ActionEventPosted) -> None:
        ev = msg.event
        self._action = ev
        if ev.phase == "finished":
            if ev.step == "plan":
                run = self._runs.pop(ev.run_id, None)
                if ev.outcome == "ok" and run is not None and isinstance(run.result, ActionPlan):
                    self._confirm(run.result)
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

    def action_toggle_pause(self) -> None:
        """Stop or resume sampling; the screen keeps the last numbers."""
        self.feed.paused = not self.feed.paused
        if self.history:
            self._update_header(self.history[-1])
        self.notify("paused" if self.feed.paused else "resumed", timeout=1.5)

    def _set_refresh(self, value: float) -> None:
        self.refresh_s = value
        self.settings = replace(self.settings, refresh_s=value)  # sources rebuilt later follow it too
        self.feed.set_refresh(value)
        if self.history:
            self._update_header(self.history[-1])

    def action_faster(self) -> None:
        """Refresh more often (down to 0.25 s)."""
        self._set_refresh(_next_step(self.refresh_s, faster=True))

    def action_slower(self) -> None:
        """Refresh less often (up to 30 s)."""
        self._set_refresh(_next_step(self.refresh_s, faster=False))

    def action_show_tab(self, n: int) -> None:
        """Switch to tab n (1-based)."""
        if 1 <= n <= len(self._panes):
            self.query_one("#tabs", TabbedContent).active = f"tab-{self._panes[n - 1].PANE_ID}"
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
            if (binding.id or "").startswith(("app.tab", "app.interrupt", "app.slower")):
                continue
            if binding.description in seen:
                continue
            seen.add(binding.description)
            description = "refresh faster / slower" if binding.id == "app.faster" else binding.description
            description = "command palette" if binding.id == "app.palette" else description
            rows.append((binding.key_display or self.get_key_display(binding), description))
        rows.append((f"1-{len(self._panes)}", "switch tab"))
        hints = [h.text + (f" — {h.fix}" if h.fix else "") for h in self.hints]
        self.push_screen(HelpScreen(rows, pane.HELP if pane is not None else "", hints))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("Pause / resume", "Stop or resume sampling (p)", self.action_toggle_pause)
        yield SystemCommand("Refresh faster", "Sample more often (+)", self.action_faster)
        yield SystemCommand("Refresh slower", "Sample less often (-)", self.action_slower)
        yield SystemCommand("Help", "Every key and the current hints (?)", self.action_help)
        for i, pane in enumerate(self._panes, start=1):
            yield SystemCommand(f"Show {pane.TITLE}", f"Switch to tab {i}", lambda i=i: self.action_show_tab(i))
        if self.query_one("#tabs", TabbedContent).disabled:
            return  # too small: the panes are hidden, and so are their actions
        for i, pane in enumerate(self._panes, start=1):
            # A pane's actions work on its selection: the command shows that pane first, then acts.
            for cmd in pane.palette_commands():
                yield SystemCommand(cmd.title, cmd.help, self._on_tab(i, cmd.callback))

    def _on_tab(self, n: int, action: Callable[[], object]) -> Callable[[], None]:
        def run() -> None:
            self.action_show_tab(n)
            if self._view is not None:
                self._panes[n - 1].show(self._view)  # its rows (the selection acted on) are there before it acts
            self.call_after_refresh(action)

        return run
