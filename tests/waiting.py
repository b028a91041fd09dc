"""The one way a Pilot test waits for something the app does in its own time (a worker's answer, a dialog, a
rescan): it lets the app run in short pauses until the condition holds, and fails saying what never came."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

S = TypeVar("S")

WITHIN_S = 30.0  # generous: a loaded 2-core CI machine scans and paints slowly; a test never waits this long when green


async def until(pilot: Any, cond: Callable[[], object], what: str = "the condition", within_s: float = WITHIN_S,
                step_s: float = 0.05) -> None:
    """Pause the app (at least once) until `cond()` holds; AssertionError naming `what` after `within_s`."""
    deadline = time.monotonic() + within_s
    while True:
        await pilot.pause(step_s)
        if cond():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")


async def screen_of(pilot: Any, kind: type[S], within_s: float = WITHIN_S) -> S:
    """The screen of type `kind` once the app shows it (a dialog that opens after a worker's answer)."""
    await until(pilot, lambda: isinstance(pilot.app.screen, kind), f"a {kind.__name__}", within_s, step_s=0.02)
    return pilot.app.screen  # type: ignore[no-any-return]
