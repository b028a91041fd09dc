"""Textual's Linux driver with an input thread that sleeps until there is something to read.

Textual 8.2's `LinuxDriver.run_input_thread` waits in `select(0.1)`: ten wake-ups a second with nothing to
read, 0.12-0.15% of a core on a quiet dltop. The timeout is there for two things only, and this driver keeps
both without it:

- the parser's escape timeout (`ESCDELAY`, 100 ms): a lone Esc is an Esc key only once nothing followed it in
  that time. The parser says when such a timeout is due (`Parser._timeout_time`); the thread waits until then,
  and with no partial sequence held it waits for input alone.
- leaving: `disable_input` sets `exit_event` and joins the thread. Here setting that event also writes a byte
  to a pipe the thread waits on, so it wakes at once (Textual's loop noticed within 0.1 s). A suspend (SIGTSTP,
  `App.suspend`) stops application mode and closes the driver, then starts it again: the pipe is made at each
  start and closed with the driver.

Everything else (the reads, the UTF-8 decoding, the parser, `process_message`, the final drain) is Textual's,
unchanged. Where the parser has no `_timeout_time` (another Textual), the thread polls every 0.1 s as
Textual's does.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import threading
from codecs import getincrementaldecoder
from typing import TYPE_CHECKING, Any

from textual._parser import ParseError
from textual._time import get_time
from textual._xterm_parser import XTermParser
from textual.drivers.linux_driver import LinuxDriver

if TYPE_CHECKING:
    from textual.app import App

POLL_S = 0.1  # Textual's own wait, used only where the parser cannot say when its timeout is due


class _WakingEvent(threading.Event):
    """An Event whose `set` also wakes the input thread out of its `select` (a byte into a pipe)."""

    def __init__(self, wake_fd: int) -> None:
        super().__init__()
        self.wake_fd = wake_fd  # -1 once the driver closed the pipe (a number reused since must not be written)

    def set(self) -> None:
        super().set()
        if self.wake_fd < 0:
            return
        with contextlib.suppress(OSError):  # the pipe is full: the thread is waking anyway
            os.write(self.wake_fd, b"x")


def wait_s(parser: Any, now: float) -> float | None:
    """How long the input thread may sleep with nothing to read: until the parser's escape timeout is due,
    or for ever when it holds no partial sequence (None). Polls as Textual does where it cannot tell."""
    if not hasattr(parser, "_timeout_time"):
        return POLL_S
    due = parser._timeout_time
    if due is None:
        return None
    return max(0.0, due - now)


class QuietLinuxDriver(LinuxDriver):
    """LinuxDriver whose input thread wakes on input, on the escape timeout and on exit; never to poll."""

    def __init__(self, app: App[Any], *, debug: bool = False, mouse: bool = True,
                 size: tuple[int, int] | None = None) -> None:
        super().__init__(app, debug=debug, mouse=mouse, size=size)
        # The pipe is made for each start of application mode: a suspend (SIGTSTP, App.suspend) closes the
        # driver and starts it again.
        self._wake_r = self._wake_w = -1
        self.exit_event: _WakingEvent = _WakingEvent(-1)

    def start_application_mode(self) -> None:
        if self._wake_r < 0:
            self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            self.exit_event.wake_fd = self._wake_w
        super().start_application_mode()

    def close(self) -> None:
        super().close()
        self.exit_event.wake_fd = -1
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._wake_r = self._wake_w = -1

    def _drain_wake(self) -> None:
        with contextlib.suppress(OSError):  # empty (EAGAIN)
            while os.read(self._wake_r, 512):
                pass

    def run_input_thread(self) -> None:
        """Textual's loop (linux_driver.py), waiting in select for input, the wake pipe or the parser's
        escape timeout instead of for 0.1 s."""
        selector = selectors.SelectSelector()
        fileno = self.fileno
        wake = self._wake_r
        selector.register(fileno, selectors.EVENT_READ)
        selector.register(wake, selectors.EVENT_READ)
        EVENT_READ = selectors.EVENT_READ

        parser = XTermParser(self._debug)
        feed = parser.feed
        tick = parser.tick
        decode = getincrementaldecoder("utf-8")().decode
        read = os.read

        def process_selector_events(selector_events: list[tuple[selectors.SelectorKey, int]],
                                    final: bool = False) -> None:
            tty_events = []
            for key, mask in selector_events:
                if key.fd == wake:
                    self._drain_wake()
                elif mask & EVENT_READ:
                    tty_events.append(key)
            for i, _key in enumerate(tty_events):
                last = i == len(tty_events) - 1
                unicode_data = decode(read(fileno, 1024 * 4), final=final and last)
                if not unicode_data:
                    # This can occur if the stdin is piped
                    break
                for event in feed(unicode_data):
                    self.process_message(event)
            for event in tick():
                self.process_message(event)

        try:
            while not self.exit_event.is_set():
                events = selector.select(wait_s(parser, get_time()))
                process_selector_events(events)
            # As Textual ends it: nothing registered, a 0.1 s wait, and the parser's timeouts ticked once more.
            selector.unregister(fileno)
            selector.unregister(wake)
            process_selector_events(selector.select(POLL_S), final=True)
        finally:
            selector.close()
            try:
                for _event in feed(""):
                    pass
            except (EOFError, ParseError):
                pass
