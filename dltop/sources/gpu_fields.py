"""One GPU's fields as a tick reads them, for the NVML and amdsmi readers: each value, or why it has none."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

SLOW_READ_S = 60.0  # the power limit, aggregate ECC counts and retired pages: read once a minute, not each tick


class Fields:
    """A GPU's values by field name and why each missing one is missing. `slow` keeps the answer of a number that
    changes only by an admin or over months in the reader's table (`kept`: (GPU index, field) -> (when read, its
    value, why not)) for SLOW_READ_S."""

    def __init__(self, index: int, kept: dict[tuple[int, str], tuple[float, Any, str | None]],
                 clock: Callable[[], float]) -> None:
        self.index = index
        self.values: dict[str, Any] = {}
        self.missing: dict[str, str] = {}
        self._kept = kept
        self._clock = clock

    def slow(self, fieldname: str, read: Callable[..., Any], *args: Any) -> None:
        """`read(*args)` (it keeps why it gave None in `missing`) at most once a SLOW_READ_S; between, its answer."""
        key, now = (self.index, fieldname), self._clock()
        kept = self._kept.get(key)
        if kept is None or now - kept[0] >= SLOW_READ_S:
            self.missing.pop(fieldname, None)
            value = read(*args)  # a GPU lost raises here: nothing kept
            kept = self._kept[key] = (now, value, self.missing.get(fieldname))
        if kept[2] is not None:
            self.missing[fieldname] = kept[2]
        elif kept[1] is not None:
            self.values[fieldname] = kept[1]
