"""Messages up: what a pane asks the app for. The app hands it to the Session, which plans, confirms and runs it
through the action runner, or changes the watched sources; the pane only renders what comes back in its View."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from textual.message import Message

from dltop.model.actions import ActionEvent, SignalTarget


@dataclass
class ActionRequested(Message):
    """Base of the action requests: `action` on `path` (the app has one handler for them all)."""

    path: str
    action: ClassVar[str] = ""


class WarmRequested(ActionRequested):
    """Read a dataset or folder into the page cache (after a confirmation)."""

    action = "warm"


class EvictRequested(ActionRequested):
    """Drop a dataset or folder from the page cache (after a confirmation)."""

    action = "evict"


class LockRequested(ActionRequested):
    """mlock a dataset or folder (after a confirmation), or unlock it when it is locked."""

    action = "lock"


class ClearRequested(ActionRequested):
    """Delete a cache's contents or one entry of it (after a confirmation stating the bytes)."""

    action = "clear"


class CancelRequested(Message):
    """Stop the plan or action in flight."""


@dataclass
class SignalRequested(Message):
    """Send a signal to a GPU process (the signal dialog was its confirmation); the runner checks its start time
    again before it sends. A tuple: the tagged processes, each checked and sent to in turn."""

    target: SignalTarget | tuple[SignalTarget, ...]


@dataclass
class DatasetAddRequested(Message):
    """Watch one more dataset folder."""

    path: str


@dataclass
class DatasetRemoveRequested(Message):
    """Stop watching a dataset folder."""

    path: str


@dataclass
class ServerAddRequested(Message):
    """Scrape one more inference server (`text` as the user typed it: host:port or a URL)."""

    text: str


@dataclass
class ServerRemoveRequested(Message):
    """Stop scraping an inference server (`text` as the user typed it, or its /metrics URL)."""

    text: str


@dataclass
class RescanRequested(Message):
    """Read a source again now, not at its next turn (`key`: only that part of it, e.g. one cache)."""

    source: str
    key: str | None = None


@dataclass
class ActionEventPosted(Message):
    """An event of the action runner, carried from its worker thread to the app (post_message is thread-safe)."""

    event: ActionEvent


@dataclass
class Warned(Message):
    """Something running beside the app (the recorder of --record) has a warning for the user; posted from any
    thread."""

    text: str
