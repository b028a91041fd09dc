"""A text box for a folder path: Tab completes it as a shell does (the longest common prefix, '/' after a
folder), and the rest of the one match is suggested as you type; focus stays in the box."""

from __future__ import annotations

import itertools
import os

from textual import work
from textual.binding import Binding
from textual.suggester import Suggester
from textual.widgets import Input

from dltop.fmt import printable

MAX_ENTRIES = 5000  # a folder listed for completion: further entries are not looked at
MAX_SHOWN = 8  # candidates named when Tab cannot choose


def complete_path(text: str) -> tuple[str, list[str]]:
    """`text` completed as far as the entries of its folder agree (a folder gets its '/'), and the names that
    still match; a folder that cannot be read completes nothing."""
    head, tail = os.path.split(text)
    try:
        names = sorted(_matching(os.path.expanduser(head) if head else ".", tail))
    except (OSError, ValueError):  # unreadable, gone, or a NUL typed in
        return text, []
    if not names:
        return text, []
    common = os.path.commonprefix(names)
    return os.path.join(head, common) if head else common, names


def _matching(folder: str, tail: str) -> list[str]:
    """The names in `folder` (its first MAX_ENTRIES) that start with `tail`, a folder's with '/'; hidden ones only
    when `tail` starts with '.'."""
    with os.scandir(folder) as it:
        return [entry.name + ("/" if _is_dir(entry) else "") for entry in itertools.islice(it, MAX_ENTRIES)
                if entry.name.startswith(tail) and (tail.startswith(".") or not entry.name.startswith("."))]


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


class PathSuggester(Suggester):
    """Suggests the rest of the one entry that matches what is typed so far."""

    def __init__(self) -> None:
        super().__init__(use_cache=False, case_sensitive=True)

    async def get_suggestion(self, value: str) -> str | None:
        import asyncio

        completed, names = await asyncio.to_thread(complete_path, value)  # a slow mount never stalls the screen
        return completed if len(names) == 1 and completed != value else None


class PathInput(Input):
    """An Input whose Tab completes the path instead of moving the focus out of the box."""

    BINDINGS = [Binding("tab", "complete", "Complete", show=False, id="path.complete")]

    def __init__(self, **kwargs: object) -> None:
        super().__init__(suggester=PathSuggester(), **kwargs)  # type: ignore[arg-type]

    def action_complete(self) -> None:
        """Complete the path typed so far (Tab)."""
        self._complete(self.value)

    @work(thread=True, exclusive=True, group="path-complete")
    def _complete(self, value: str) -> None:
        completed, names = complete_path(value)
        self.app.call_from_thread(self._completed, value, completed, names)

    def _completed(self, typed: str, completed: str, names: list[str]) -> None:
        if self.value != typed:
            return  # typed on meanwhile
        if completed != typed:
            self.value = completed
            self.cursor_position = len(completed)
        elif not names:
            self.app.bell()
        elif len(names) > 1:
            more = f" … {len(names) - MAX_SHOWN} more" if len(names) > MAX_SHOWN else ""
            self.notify(printable("  ".join(names[:MAX_SHOWN])) + more, timeout=4)
