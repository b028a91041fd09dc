"""What every walk shares (the residency engine's and the caches source's): its bounds (cancel flag, deadline,
CPU share) and the one-line reason for a path it could not read. Light on purpose: the cache walk imports it
without the rest of the engine."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dltop.model.base import display_path

if TYPE_CHECKING:  # in annotations only
    import threading

MAX_PROBLEMS = 20  # problem lines kept per walk; the rest are counted


def path_error(error: str, path: str) -> str:
    """`permission denied: PATH` from an OSError's strerror and the path it is about."""
    return f"{error[:1].lower()}{error[1:]}: {display_path(path)}"


@dataclass
class Budget:
    """Cancel flag, deadline and CPU share, checked between folders and every few thousand files."""

    cancel: threading.Event | None = None
    deadline: float | None = None  # time.monotonic() value
    cpu_fraction: float | None = None  # e.g. 0.25: sleep so the scan uses at most a quarter of one CPU
    _cpu_mark: float = field(default_factory=time.thread_time)
    _wall_mark: float = field(default_factory=time.monotonic)

    def stop(self) -> bool:
        """Whether to stop now (cancelled, or past the deadline); past the CPU share, sleep first."""
        if self.cancel is not None and self.cancel.is_set():
            return True
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return True
        if self.cpu_fraction is not None and 0 < self.cpu_fraction < 1:
            self._pace(self.cpu_fraction)
        return False

    def _pace(self, fraction: float) -> None:
        """Past 50 ms of CPU since the last pause, sleep so that CPU over wall time stays at `fraction`."""
        used = time.thread_time() - self._cpu_mark
        if used < 0.05:
            return
        pause = used / fraction - (time.monotonic() - self._wall_mark)
        if pause > 0:
            if self.cancel is not None:
                self.cancel.wait(pause)
            else:
                time.sleep(pause)
        self._cpu_mark = time.thread_time()
        self._wall_mark = time.monotonic()
