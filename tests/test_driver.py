"""tui/driver.py's input thread: how long it may sleep, from the real Textual parser's state."""

from __future__ import annotations

import time

from textual import constants
from textual._time import get_time
from textual._xterm_parser import XTermParser

from dltop.tui.driver import POLL_S, wait_s


def test_no_partial_sequence_means_wait_for_input_alone() -> None:
    parser = XTermParser()
    assert wait_s(parser, get_time()) is None
    assert [e.key for e in parser.feed("a")] == ["a"]  # type: ignore[attr-defined]
    assert wait_s(parser, get_time()) is None


def test_a_lone_escape_waits_only_until_its_delay_runs_out() -> None:
    parser = XTermParser()
    assert list(parser.feed("\x1b")) == []  # held: the start of a sequence, or the Esc key
    now = get_time()
    wait = wait_s(parser, now)
    assert wait is not None and 0 < wait <= constants.ESCAPE_DELAY
    assert wait_s(parser, now + constants.ESCAPE_DELAY + 1) == 0.0  # due: no negative timeout
    time.sleep(constants.ESCAPE_DELAY + 0.01)
    assert [e.key for e in parser.tick()] == ["escape"]  # type: ignore[attr-defined]
    assert wait_s(parser, get_time()) is None  # and then for input alone again


def test_a_sequence_completed_leaves_nothing_to_time_out() -> None:
    parser = XTermParser()
    assert list(parser.feed("\x1b[")) == []
    assert wait_s(parser, get_time()) is not None
    assert [e.key for e in parser.feed("A")] == ["up"]  # type: ignore[attr-defined]
    assert wait_s(parser, get_time()) is None


def test_a_parser_that_cannot_say_polls_as_textual_does() -> None:
    assert wait_s(object(), get_time()) == POLL_S
