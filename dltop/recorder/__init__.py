"""The flight recorder: Snapshots and events appended to hourly segments, read back as full Snapshots.

`Recorder` writes (`dltop record`, `dltop --record DIR`), `Recording` reads (`replay`, `report`, `dump`);
docs/recorder.md describes the format.
"""

from __future__ import annotations

from dltop.recorder.reader import Recording
from dltop.recorder.segment import RecordedEvent
from dltop.recorder.store import default_directory
from dltop.recorder.times import parse_duration, parse_size, parse_time
from dltop.recorder.writer import Recorder

__all__ = ["RecordedEvent", "Recorder", "Recording", "default_directory", "parse_duration", "parse_size",
           "parse_time"]
