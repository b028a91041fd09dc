"""The one way a pane keeps what it drew: `Memo`, the last value made, made again only when its key changed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")
_NOTHING = object()


class Memo(Generic[T]):
    """The value made for the last key, given again while the key compares equal (==).

    Compared, not hashed (functools.lru_cache hashes): the models are frozen dataclasses that hold dicts, and a
    tuple of the very same objects (what a reader gives again where nothing moved) compares without a look at
    a field. One Memo per thing kept, named for it."""

    def __init__(self) -> None:
        self._key: object = _NOTHING
        self._value: T | None = None

    def get(self, key: object, make: Callable[[], T]) -> T:
        """The value for `key`: the one made last if `key` equals its key, else `make()`."""
        if self._key is _NOTHING or self._key != key:
            self._value, self._key = make(), key
        return self._value  # type: ignore[return-value]

    def clear(self) -> None:
        """Forget the value: the next get makes it."""
        self._key, self._value = _NOTHING, None
