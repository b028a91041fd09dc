"""The pieces every Snapshot part is built from: `Unavailable` and an exact JSON codec for frozen dataclasses."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from functools import cache
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

T = TypeVar("T")


@dataclass(frozen=True)
class Unavailable:
    """A value or part the system could not provide, and why ("no /proc/pressure: kernel built without PSI")."""

    reason: str

    def __str__(self) -> str:
        return f"unavailable ({self.reason})"


class DecodeError(ValueError):
    """Raised when a dict does not describe the dataclass it should."""


def to_dict(obj: Any) -> Any:
    """Turn a (nested) frozen dataclass into plain JSON data; `Unavailable` becomes {"unavailable": reason}."""
    if isinstance(obj, Unavailable):
        return {"unavailable": obj.reason}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple | list):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): to_dict(v) for k, v in obj.items()}
    return obj


@cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def from_dict(cls: type[T], data: Any) -> T:
    """Rebuild a dataclass written by `to_dict`; raises DecodeError on data of the wrong shape."""
    return typing.cast(T, _decode(cls, data, cls.__name__))


def _decode(tp: Any, data: Any, where: str) -> Any:
    if tp is Any:
        return data
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return _decode_union(get_args(tp), data, where)
    if tp is Unavailable:
        if isinstance(data, dict) and set(data) == {"unavailable"} and isinstance(data["unavailable"], str):
            return Unavailable(data["unavailable"])
        raise DecodeError(f"{where}: expected {{'unavailable': reason}}")
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(data, dict):
            raise DecodeError(f"{where}: expected an object for {tp.__name__}")
        hints = _hints(tp)
        kwargs = {}
        for f in dataclasses.fields(tp):
            if f.name in data:
                kwargs[f.name] = _decode(hints[f.name], data[f.name], f"{where}.{f.name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise DecodeError(f"{where}: missing field {f.name!r}")
        return tp(**kwargs)
    if origin is tuple:
        args = get_args(tp)
        if not isinstance(data, list):
            raise DecodeError(f"{where}: expected a list")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], v, f"{where}[{i}]") for i, v in enumerate(data))
        if len(args) != len(data):
            raise DecodeError(f"{where}: expected {len(args)} items")
        return tuple(_decode(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, data, strict=True)))
    if origin is dict:
        key_tp, val_tp = get_args(tp)
        if not isinstance(data, dict):
            raise DecodeError(f"{where}: expected an object")
        return {_decode(key_tp, k, where): _decode(val_tp, v, f"{where}.{k}") for k, v in data.items()}
    if origin is typing.Literal:
        if data not in get_args(tp):
            raise DecodeError(f"{where}: {data!r} is not one of {get_args(tp)}")
        return data
    if tp is type(None):
        if data is not None:
            raise DecodeError(f"{where}: expected null")
        return None
    if tp is float:
        if isinstance(data, bool) or not isinstance(data, int | float):
            raise DecodeError(f"{where}: expected a number")
        return float(data)
    if tp in (int, str, bool):
        if not isinstance(data, tp) or (tp is int and isinstance(data, bool)):
            raise DecodeError(f"{where}: expected {tp.__name__}")
        return data
    raise DecodeError(f"{where}: cannot decode type {tp!r}")


def _decode_union(args: tuple[Any, ...], data: Any, where: str) -> Any:
    if data is None:
        if type(None) in args:
            return None
        raise DecodeError(f"{where}: null not allowed")
    # Unavailable first: its shape is distinctive, and a dataclass with all-default fields would also accept it.
    ordered = sorted((a for a in args if a is not type(None)), key=lambda a: a is not Unavailable)
    errors = []
    for a in ordered:
        try:
            return _decode(a, data, where)
        except DecodeError as e:
            errors.append(str(e))
    raise DecodeError(errors[-1] if errors else f"{where}: no type matched")
