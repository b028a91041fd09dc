"""What the TUI watches outside itself, on one thread for its life: whether the terminal is still there, and the
machine's action journals (actions run anywhere: a warm from a shell, another TUI). The thread wakes the UI loop
only with news: a Textual timer for the terminal woke it every second, and a thread worker for the journals every
2 s started a thread and posted three state messages to it."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from dltop.timeline import LiveEvent

JOURNAL_POLL_S = 2.0  # the machine's action journals are read this often for events of other processes
TERMINAL_CHECK_S = 1.0  # whether the terminal is still there (a hangup with SIGHUP ignored), this often


def watch_outside(done: threading.Event, loop: asyncio.AbstractEventLoop, tty: bool, journal: Any,
                  leave: Callable[[int], None], seen: Callable[[list[LiveEvent]], None]) -> None:
    """Until `done`: every TERMINAL_CHECK_S whether the terminal is still there (`tty`; gone: `leave(129)` on the
    UI loop), every JOURNAL_POLL_S the journals' new events (`journal`, a JournalTail, or None; handed to `seen`
    on the UI loop where there are some)."""
    step = TERMINAL_CHECK_S if tty else JOURNAL_POLL_S
    next_poll = time.monotonic() + JOURNAL_POLL_S
    while not done.wait(step) and not loop.is_closed():  # (an app torn down without unmount)
        try:
            if tty and not os.isatty(0):
                # After an SSH drop with SIGHUP ignored (nohup, some multiplexers) the tty reads EOF forever and
                # Textual's input thread spins on it at 100% CPU next to the training job. A monitor with no
                # terminal has nothing to do: leave.
                loop.call_soon_threadsafe(leave, 129)
                return
            if journal is not None and time.monotonic() >= next_poll:
                next_poll = time.monotonic() + JOURNAL_POLL_S
                _hand_on(journal, done, loop, seen)
        except RuntimeError:  # the loop has closed under it (leaving)
            return


def _hand_on(journal: Any, done: threading.Event, loop: asyncio.AbstractEventLoop,
             seen: Callable[[list[LiveEvent]], None]) -> None:
    """The journals' new events, handed to `seen` on the UI loop where there are some."""
    found = [LiveEvent(d["ts"], "action", d) for d in journal.poll()]
    if found and not done.is_set():
        loop.call_soon_threadsafe(seen, found)
