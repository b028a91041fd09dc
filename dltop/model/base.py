"""The pieces every Snapshot part is built from: `Unavailable` and an exact JSON codec for frozen dataclasses.

Paths are `str` with surrogate escapes where a name is not UTF-8 (`os.fsdecode`). JSON text must be UTF-8, and
a lone surrogate ("\\udcfe") is not: jq turns it into U+FFFD, strict parsers refuse it. So every string is
written in its display form (undecodable bytes as `\\xNN`, always valid UTF-8), and a dataclass field (or an
`Unavailable`'s reason) holding a string that is not UTF-8 gets a sibling `<field>_b64` with the exact bytes in
base64: for a list field one entry per item (null where the item is UTF-8), for a map field the keys whose
values are not UTF-8. Decoding takes the bytes from the sibling, so the round trip stays exact; a reader that
does not know the sibling sees the display form. (Map keys are written in display form only.)
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import os
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

T = TypeVar("T")
RAW_SUFFIX = "_b64"  # the sibling field holding the exact bytes of a string that is not UTF-8


@dataclass(frozen=True)
class Unavailable:
    """A value or part the system could not provide, and why ("no /proc/pressure: kernel built without PSI").
    `absent` (a word: "no_library", "no_driver", "no_devices") marks a thing this machine does not have, a state
    rather than a failure: no GPU on a CPU-only node is "0 GPUs", and its source is up."""

    reason: str
    absent: str | None = None

    def __str__(self) -> str:
        return f"unavailable ({self.reason})"


class DecodeError(ValueError):
    """Raised when a dict does not describe the dataclass it should."""


def to_dict(obj: Any) -> Any:
    """Turn a (nested) frozen dataclass into plain JSON data; `Unavailable` becomes {"unavailable": reason};
    strings become valid UTF-8, with `<field>_b64` beside a field that is not (see the module's docstring)."""
    t = type(obj)
    if t in _PLAIN:
        return obj
    if t is str:
        return obj if obj.isascii() else display_path(obj)
    enc = _ENCODERS.get(t)
    if enc is None:
        enc = _ENCODERS[t] = _encoder(t)
    return enc(obj)


# The recorder writes a Snapshot a second and a replay or dump reads a day of them back: each type's encoder is
# made once (its field names looked up once, not per object), and numbers, None and ASCII strings, most of
# what a Snapshot holds, are taken as they are.
_PLAIN = frozenset({int, float, bool, type(None)})
_ENCODERS: dict[type, Callable[[Any], Any]] = {}


def _encoder(t: type) -> Callable[[Any], Any]:
    if t is Unavailable:
        def unavailable(obj: Unavailable) -> Any:
            raw = _raw_form(obj.reason)
            return {"unavailable": display_path(obj.reason),
                    **({} if raw is None else {"unavailable" + RAW_SUFFIX: raw}),
                    **({} if obj.absent is None else {"absent": obj.absent})}

        return unavailable
    if dataclasses.is_dataclass(t):
        names = [(f.name, f.name + RAW_SUFFIX) for f in dataclasses.fields(t)]

        def record(obj: Any) -> Any:
            out = {}
            for name, raw_key in names:
                value = getattr(obj, name)
                tv = type(value)
                if tv in _PLAIN or (tv is str and value.isascii()):
                    out[name] = value
                    continue
                out[name] = to_dict(value)
                raw = _raw_form(value)
                if raw is not None:
                    out[raw_key] = raw
            return out

        return record
    if issubclass(t, tuple | list):
        return lambda obj: [to_dict(v) for v in obj]
    if issubclass(t, dict):
        return lambda obj: {display_path(str(k)): to_dict(v) for k, v in obj.items()}
    if issubclass(t, str):
        return display_path
    return lambda obj: obj


def display_path(path: str) -> str:
    """A path safe to print and to write as JSON: undecodable bytes (surrogate escapes) shown as \\xNN."""
    return path if _is_utf8(path) else os.fsencode(path).decode("utf-8", "backslashreplace")


def _is_utf8(s: str) -> bool:
    if s.isascii():  # the common case, and much faster than encoding
        return True
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _b64(s: str) -> str:
    return base64.b64encode(os.fsencode(s)).decode("ascii")


def _raw_form(value: Any) -> Any:
    """The `_b64` sibling of a field's value, or None when every string in it is UTF-8 already."""
    if isinstance(value, str):
        return None if _is_utf8(value) else _b64(value)
    if isinstance(value, tuple | list):
        if not any(isinstance(v, str) and not _is_utf8(v) for v in value):
            return None
        return [_b64(v) if isinstance(v, str) and not _is_utf8(v) else None for v in value]
    if isinstance(value, dict):
        raw = {display_path(str(k)): _b64(v) for k, v in value.items() if isinstance(v, str) and not _is_utf8(v)}
        return raw or None
    return None


def _from_raw(display: Any, raw: Any, where: str) -> Any:
    """The exact value of a field from its display form and its `_b64` sibling."""

    def unb64(text: Any) -> str:
        if not isinstance(text, str):
            raise DecodeError(f"{where}: expected base64 text")
        try:
            return os.fsdecode(base64.b64decode(text, validate=True))
        except (binascii.Error, ValueError):
            raise DecodeError(f"{where}: not base64: {text[:40]!r}") from None

    if isinstance(raw, list):
        if not isinstance(display, list) or len(display) != len(raw):
            raise DecodeError(f"{where}: expected one entry per item of the field")
        return [d if r is None else unb64(r) for d, r in zip(display, raw, strict=True)]
    if isinstance(raw, dict):
        if not isinstance(display, dict) or not set(raw) <= set(display):
            raise DecodeError(f"{where}: expected keys of the field")
        return {**display, **{k: unb64(v) for k, v in raw.items()}}
    return unb64(raw)


@cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def from_dict(cls: type[T], data: Any) -> T:
    """Rebuild a dataclass written by `to_dict`; raises DecodeError on data of the wrong shape."""
    return typing.cast(T, _decoder(typing.cast(Any, cls))(data, cls.__name__))


# Each type's decoder is built once from its type hints (a day of recording is 86,400 Snapshots to read back):
# a function (data, where) -> value. `where` names the field path for an error message, and is only spelled
# out when there is one: a name, or (the parent's where, a field name or a list index).
Where = Any
Decoder = Callable[[Any, Where], Any]


def _path(where: Where) -> str:
    """`where` spelled out: "Snapshot.gpus[0].processes[3].pid"."""
    keys = []
    while isinstance(where, tuple):
        where, key = where
        keys.append(f"[{key}]" if isinstance(key, int) else f".{key}")
    return str(where) + "".join(reversed(keys))


def _taken_as_is(tp: Any) -> frozenset[type]:
    """The exact types of JSON data a field of type `tp` keeps unchanged (its decoder would return the data
    itself): checked inline, so most fields of a Snapshot need no decoder call. A float field takes an int
    through its decoder (which makes it a float)."""
    if tp in (int, str, bool, float, type(None)):
        return frozenset({tp})
    if get_origin(tp) in (Union, types.UnionType):
        return frozenset().union(*(_taken_as_is(a) for a in get_args(tp)))
    return frozenset()


@cache
def _decoder(tp: Any) -> Decoder:
    if tp is Any:
        return lambda data, where: data
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return _union_decoder(get_args(tp))
    if tp is Unavailable:
        return _decode_unavailable
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _dataclass_decoder(tp)
    if origin is tuple:
        return _tuple_decoder(get_args(tp))
    if origin is dict:
        return _dict_decoder(*get_args(tp))
    if origin is typing.Literal:
        allowed = get_args(tp)

        def literal(data: Any, where: Where) -> Any:
            if data not in allowed:
                raise DecodeError(f"{_path(where)}: {data!r} is not one of {allowed}")
            return data

        return literal
    if tp is type(None):
        def null(data: Any, where: Where) -> None:
            if data is not None:
                raise DecodeError(f"{_path(where)}: expected null")

        return null
    if tp is float:
        def number(data: Any, where: Where) -> float:
            if isinstance(data, bool) or not isinstance(data, int | float):
                raise DecodeError(f"{_path(where)}: expected a number")
            return float(data)

        return number
    if tp in (int, str, bool):
        def plain(data: Any, where: Where) -> Any:
            if not isinstance(data, tp) or (tp is int and isinstance(data, bool)):
                raise DecodeError(f"{_path(where)}: expected {tp.__name__}")
            return data

        return plain

    def unknown(data: Any, where: Where) -> Any:
        raise DecodeError(f"{_path(where)}: cannot decode type {tp!r}")

    return unknown


_RAW_UNAVAILABLE = "unavailable" + RAW_SUFFIX


def _is_unavailable(data: Any) -> bool:
    # len() first: a record's dict has an `unavailable` key too, and making a set of its keys cost a microsecond
    return (isinstance(data, dict) and len(data) <= 3 and set(data) - {_RAW_UNAVAILABLE, "absent"} == {"unavailable"}
            and isinstance(data["unavailable"], str) and isinstance(data.get("absent", ""), str))


def _decode_unavailable(data: Any, where: Where) -> Unavailable:
    if not _is_unavailable(data):
        raise DecodeError(f"{_path(where)}: expected {{'unavailable': reason}}")
    absent = data.get("absent")
    if _RAW_UNAVAILABLE in data:
        return Unavailable(_from_raw(data["unavailable"], data[_RAW_UNAVAILABLE], f"{_path(where)}.{_RAW_UNAVAILABLE}"),
                           absent)
    return Unavailable(data["unavailable"], absent)


def _dataclass_decoder(tp: type) -> Decoder:
    fields = dataclasses.fields(tp)
    required = [f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    # (name, the JSON types it takes as they are, its decoder), made on first use: a type may contain itself
    # (a residency node's children)
    specs: list[tuple[str, frozenset[type], Decoder]] = []
    build = _builder(tp)

    def decode(data: Any, where: Where) -> Any:
        if not isinstance(data, dict):
            raise DecodeError(f"{_path(where)}: expected an object for {tp.__name__}")
        if not specs:
            hints = _hints(tp)
            specs.extend((f.name, _taken_as_is(hints[f.name]), _decoder(hints[f.name])) for f in fields)
        values: dict[str, Any] = {}
        for name, as_is, dec in specs:
            v = data.get(name, _MISSING)
            if v is not _MISSING:
                values[name] = v if type(v) in as_is else dec(v, (where, name))
        if len(values) != len(fields):
            for name in required:
                if name not in values:
                    raise DecodeError(f"{_path(where)}: missing field {name!r}")
        if len(values) != len(data):  # keys beside the fields: a string's exact bytes (or a newer writer's field)
            for name, as_is, dec in specs:
                raw_key = name + RAW_SUFFIX
                if raw_key in data and name in data:
                    value = _from_raw(data[name], data[raw_key], f"{_path(where)}.{raw_key}")
                    values[name] = value if type(value) in as_is else dec(value, (where, name))
        return build(values)

    return decode


def _builder(tp: type) -> Callable[[dict[str, Any]], Any]:
    """Make a `tp` from its fields' values as `tp(**values)` does, without the frozen __init__'s
    object.__setattr__ per field (a day of recording is 86,400 Snapshots to read back): the instance's
    __dict__ filled at once."""
    fields = dataclasses.fields(tp)
    if getattr(tp, "__slots__", None) is not None or any(not f.init for f in fields):
        return lambda values: tp(**values)
    defaults = {f.name: f.default for f in fields if f.default is not dataclasses.MISSING}
    factories = [(f.name, f.default_factory) for f in fields if f.default_factory is not dataclasses.MISSING]
    post_init = getattr(tp, "__post_init__", None)

    def build(values: dict[str, Any]) -> Any:
        obj: Any = object.__new__(tp)
        d = obj.__dict__
        d.update(defaults)
        for name, factory in factories:
            if name not in values:
                d[name] = factory()
        d.update(values)
        if post_init is not None:
            post_init(obj)
        return obj

    return build


_MISSING = object()


def _tuple_decoder(args: tuple[Any, ...]) -> Decoder:
    if len(args) == 2 and args[1] is Ellipsis:
        item, as_is = _decoder(args[0]), _taken_as_is(args[0])

        def variadic(data: Any, where: Where) -> tuple[Any, ...]:
            if not isinstance(data, list):
                raise DecodeError(f"{_path(where)}: expected a list")
            if as_is and all(type(v) in as_is for v in data):
                return tuple(data)
            return tuple([item(v, (where, i)) for i, v in enumerate(data)])  # a list: quicker than a generator

        return variadic
    items = [_decoder(a) for a in args]

    def fixed(data: Any, where: Where) -> tuple[Any, ...]:
        if not isinstance(data, list):
            raise DecodeError(f"{_path(where)}: expected a list")
        if len(items) != len(data):
            raise DecodeError(f"{_path(where)}: expected {len(items)} items")
        return tuple(d(v, (where, i)) for i, (d, v) in enumerate(zip(items, data, strict=True)))

    return fixed


def _dict_decoder(key_tp: Any, val_tp: Any) -> Decoder:
    key, val = _decoder(key_tp), _decoder(val_tp)
    as_is = _taken_as_is(val_tp) if key_tp is str else frozenset()  # JSON's keys are str

    def mapping(data: Any, where: Where) -> dict[Any, Any]:
        if not isinstance(data, dict):
            raise DecodeError(f"{_path(where)}: expected an object")
        if as_is:  # a loop, not all() over a generator: most of these are a record's empty `unavailable`
            for v in data.values():
                if type(v) not in as_is:
                    break
            else:
                return dict(data)
        return {key(k, where): val(v, (where, k)) for k, v in data.items()}

    return mapping


def _union_decoder(args: tuple[Any, ...]) -> Decoder:
    nullable = type(None) in args
    # Unavailable first: its shape is distinctive, and a dataclass with all-default fields would also accept it.
    # Data of its exact shape is decoded as it; any other data skips it (it would only fail).
    ordered = sorted((a for a in args if a is not type(None)), key=lambda a: a is not Unavailable)
    may_be_unavailable = bool(ordered) and ordered[0] is Unavailable
    others = [_decoder(a) for a in ordered if a is not Unavailable]
    plain = {a for a in ordered if a in (int, str, bool)}

    def union(data: Any, where: Where) -> Any:
        if data is None:
            if nullable:
                return None
            raise DecodeError(f"{_path(where)}: null not allowed")
        if type(data) in plain:  # the common case: an int, str or bool where the union allows it
            return data
        if may_be_unavailable and _is_unavailable(data):
            return _decode_unavailable(data, where)
        errors = []
        for dec in others:
            try:
                return dec(data, where)
            except DecodeError as e:
                errors.append(str(e))
        if not errors and may_be_unavailable:
            errors.append(f"{_path(where)}: expected {{'unavailable': reason}}")
        raise DecodeError(errors[-1] if errors else f"{_path(where)}: no type matched")

    return union
