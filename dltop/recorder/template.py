"""A part's CSV cells read straight from its JSON text, where the text is the one before with only numbers changed.

A day's dump reads 86,400 sample lines; the `gpus` part (~30 kB for 4 GPUs and 20 processes) and the `memory` part
change every second, but only in their numbers: the keys, the strings, the nulls, the structure stay. Parsing the
text, decoding the part's dataclasses and walking `fields` for its samples cost ~1 ms a sample. A `Template` is
made once from a part that was read the ordinary way (its text, parsed value and decoded part): the text cut at
its numbers (outside strings), and for each number what `fields` does with it. A later text that is the same text
with other numbers (every piece between them equal, each number a JSON number of the same kind, in the range the
store accepts) gives its cells from the numbers alone, each computed as `fields` computes it.

What `fields` does with each number is found by running it, not by knowing it: the decoded part is copied with its
numbers replaced by tracing ints and floats (`_TInt`, `_TFloat`), whose arithmetic records the operations and
whose other uses (a comparison, str(), a hash, a truth test) mark the number as one that must stay equal. Then the
template is checked: the text with every free number changed is read the ordinary way, and its samples must be
the ones the template predicts, to the cell. Anything unexpected (a number the walk cannot place, a sample value
the trace does not explain, a failed check) leaves the part without a template: it is read the ordinary way.
"""

from __future__ import annotations

import dataclasses
import operator
import re
from collections.abc import Callable, Iterator
from typing import Any

from dltop import fields as fd
from dltop import native
from dltop.model import Snapshot
from dltop.recorder import store

# A JSON number in a value's place (after ':', ',' or '['; before ',', ']' or '}'), or a whole string (so that no
# number inside a string is taken for one): the template's cuts.
_NUMBER = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?"
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|(?<=[:,\[])(' + _NUMBER + r")(?=[,\]}])", re.S)
_FRACTION = re.compile(r"[.eE]").search  # what makes a JSON number a float
_MAX_INT_DIGITS = 19  # an int of 20 digits may pass 2**64 (store.MAX_NUMBER): such a text goes the ordinary way
MAX_TEXT = 1 << 20  # a part's text longer than this is not made a template (dltop's biggest are ~100 kB)
MAX_NUMBERS = 20_000
# The Snapshot keys whose samples are a function of their part alone (fields.sample_groups gives the part).
KEYS = frozenset({"memory", "datasets", "gpus", "probes", "caches"})

Op = tuple[str, Any]  # ("mul", factor), ("div", divisor), ("float", None)
_FLOAT: tuple[Op, ...] = (("float", None),)


class _Trace:
    """What the traced numbers of one template's run saw, and the numbers of its text met so far."""

    def __init__(self) -> None:
        self.n = 0  # numbers of the text met
        self.tagged: set[int] = set()  # those replaced by a traced number
        self.fixed: set[int] = set()  # numbers used in a way the trace does not follow: they must stay equal
        self.floated: dict[int, tuple[float, int, tuple[Op, ...]]] = {}  # id(float(x)) -> (it, number, ops)


_TRACE: _Trace | None = None


def _fix(x: Any) -> None:
    if _TRACE is not None:
        _TRACE.fixed.add(x._n)


def _wrap(value: Any, n: int, ops: tuple[Op, ...]) -> Any:
    if type(value) is int:
        return _TInt.make(value, n, ops)
    if type(value) is float:
        return _TFloat.make(value, n, ops)
    if _TRACE is not None:
        _TRACE.fixed.add(n)
    return value


def _fixing(name: str, base: type) -> Callable[..., Any]:
    impl = getattr(base, name)

    def method(self: Any, *args: Any) -> Any:
        _fix(self)
        for a in args:  # the other number of `a - b` (or `b < a`) is used too
            if isinstance(a, _Traced):
                _fix(a)
        return impl(self.real, *(a.real if isinstance(a, _Traced) else a for a in args))

    method.__name__ = name
    return method


_FIXING = ("__str__", "__repr__", "__format__", "__hash__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__",
           "__ge__", "__bool__", "__int__", "__neg__", "__pos__", "__abs__", "__add__", "__radd__", "__sub__",
           "__rsub__", "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__pow__", "__rpow__", "__round__",
           "__trunc__", "__floor__", "__ceil__", "__divmod__", "__rdivmod__", "__rtruediv__")


class _Traced:
    """A number of the part's text (number `_n`) after `_ops`: _TInt and _TFloat, the int's and the float's."""

    _n: int
    _ops: tuple[Op, ...]
    _base: type
    _float_op: tuple[Op, ...]  # what float() of it adds to its operations
    real: Any

    @classmethod
    def make(cls, value: Any, n: int, ops: tuple[Op, ...]) -> Any:
        x: Any = cls(value)  # type: ignore[call-arg]  # int's or float's: the class's base
        x._n, x._ops = n, ops
        return x

    def __mul__(self, other: Any) -> Any:
        if type(other) not in (int, float):
            return _fixing("__mul__", self._base)(self, other)
        return _wrap(self.real * other, self._n, (*self._ops, ("mul", other)))

    __rmul__ = __mul__

    def __truediv__(self, other: Any) -> Any:
        if type(other) not in (int, float):
            return _fixing("__truediv__", self._base)(self, other)
        return _wrap(self.real / other, self._n, (*self._ops, ("div", other)))

    def __float__(self) -> float:
        value = float(self.real)
        if _TRACE is not None:
            _TRACE.floated[id(value)] = (value, self._n, (*self._ops, *self._float_op))
        return value


class _TInt(_Traced, int):
    _base = int
    _float_op = _FLOAT

    def __index__(self) -> int:
        _fix(self)
        return self.real  # type: ignore[no-any-return]


class _TFloat(_Traced, float):
    _base = float
    _float_op = ()


for _name in _FIXING:
    for _cls in (_TInt, _TFloat):
        if hasattr(_cls._base, _name):
            setattr(_cls, _name, _fixing(_name, _cls._base))


def _apply(value: int | float, ops: tuple[Op, ...]) -> int | float:
    for op, arg in ops:
        if op == "mul":
            value = value * arg
        elif op == "div":
            value = value / arg
        else:
            value = float(value)
    return value


def _plainer(ops: tuple[Op, ...]) -> tuple[Op, ...]:
    """The same operations less each multiplication by the int 1 (x * 1 is x, of x's type, int or float)."""
    return tuple(op for op in ops if not (op[0] == "mul" and type(op[1]) is int and op[1] == 1))


def number(v: float) -> str:
    """A CSV cell's text for a value (dump's format: an integral float as an int)."""
    if isinstance(v, float) and v.is_integer() and abs(v) < 2**53:
        return str(int(v))
    return repr(v)


class Template:
    """One part's text cut at its numbers, and the samples `fields` makes of it: each a constant or a function
    of one number."""

    def __init__(self, key: str, pieces: list[str], kinds: list[bool], free: list[bool], parsed: Any,
                 part: Any, samples: list[tuple[fd.Field, dict[str, str], Any]]) -> None:
        self.key = key
        self.parsed = parsed  # the value parsed from the text the template was made of (for the snap dict)
        self.part = part  # ... and its decoded part: the stand-in in a Snapshot whose part matched
        self.kinds = kinds  # per number: True where it is a float in the text
        self.free = free  # per number: whether it may change (else it must be the text's own)
        self.samples = samples  # (field, labels, spec): spec ("=", value) or (number, ops, is_float)
        fixed = [i for i, f in enumerate(free) if not f]
        self._fixed = getter(fixed)
        self._floats = getter([i for i, k in enumerate(kinds) if k])
        self._ints = getter([i for i, k in enumerate(kinds) if not k])
        self._pieces = tuple(pieces)
        self._regex: re.Pattern[str] | None = None  # the Python twin of _template.match, made where it runs
        self._own: tuple[str, ...] = ()  # the numbers' texts of the text it was made of
        self._own_fixed: tuple[str, ...] = ()

    def match(self, text: str, pos: int) -> tuple[tuple[str, ...], int] | None:
        """The numbers' texts and the end, where the text at `pos` is this template's text with numbers that the
        ordinary reading would accept and decode the same way (None: read it the ordinary way)."""
        found = _scan(self, text, pos)
        if found is None or self._fixed(found[0]) != self._own_fixed:
            return None
        nums = found[0]
        if ("-" in "".join(nums) or max(map(len, nums), default=0) > _MAX_INT_DIGITS) \
                and not _acceptable(nums, self._own, self.kinds):
            return None
        return found if self._kinds_kept(nums) else None

    def _kinds_kept(self, nums: tuple[str, ...]) -> bool:
        """Whether each number is of its kind in the template's text: an int not a float, a float one in range."""
        ints = "".join(self._ints(nums))
        if "." in ints or "e" in ints or "E" in ints:
            return False
        floats = self._floats(nums)
        return not floats or (all(map(_FRACTION, floats)) and max(map(abs, map(float, floats))) <= store.MAX_NUMBER)


def _scan_c(tm: Template, text: str, pos: int) -> tuple[tuple[str, ...], int] | None:
    return _NATIVE.match(tm._pieces, text, pos)  # type: ignore[no-any-return, union-attr]


def _scan_py(tm: Template, text: str, pos: int) -> tuple[tuple[str, ...], int] | None:
    """The text at `pos` cut at the template's numbers: the pieces between them equal, each number the longest
    JSON number there (None: it is not the template's text)."""
    if tm._regex is None:
        tm._regex = re.compile(("(" + _NUMBER + ")").join(re.escape(p) for p in tm._pieces), re.S)
    m = tm._regex.match(text, pos)
    return None if m is None else (m.groups(), m.end())


_NATIVE = native.load("_template")
_scan = _scan_py if _NATIVE is None else _scan_c


def getter(indexes: list[int]) -> Callable[[tuple[str, ...]], tuple[str, ...]]:
    """A function giving the items at `indexes` of a tuple, as a tuple (C's itemgetter where it can)."""
    if not indexes:
        return lambda nums: ()
    if len(indexes) == 1:
        i = indexes[0]
        return lambda nums: (nums[i],)
    return operator.itemgetter(*indexes)


def _acceptable(nums: tuple[str, ...], own: tuple[str, ...], kinds: list[bool]) -> bool:
    """Numbers with a sign or many digits: a negative one only where the template's own was negative too (so the
    key takes one: the ordinary reading accepted it there), no int of 20 digits or more."""
    for t, o, is_float in zip(nums, own, kinds, strict=True):
        if t == "-0" or (t.startswith("-") and not o.startswith("-")):
            return False
        if not is_float and len(t.lstrip("-")) > _MAX_INT_DIGITS:
            return False
    return True


def cut(text: str) -> tuple[list[str], list[str]] | None:
    """The text between its numbers, and the numbers (None: a text a template is not made of)."""
    if len(text) > MAX_TEXT:
        return None
    pieces, nums = [], []
    last = 0
    for m in _TOKENS.finditer(text):
        if m.group(1) is not None:
            pieces.append(text[last:m.start()])
            nums.append(m.group(1))
            last = m.end()
            if len(nums) > MAX_NUMBERS:
                return None
    pieces.append(text[last:])
    return pieces, nums


def _leaves(value: Any) -> Iterator[Any]:
    """The numbers of a parsed JSON value, in the order of its text."""
    t = type(value)
    if t is int or t is float:
        yield value
    elif t is dict:
        for v in value.values():
            yield from _leaves(v)
    elif t is list:
        for v in value:
            yield from _leaves(v)


def _tag(js: Any, obj: Any, c: _Trace) -> Any:
    """`obj` (decoded from the JSON value `js`) with each number of `js` that it holds as it is replaced by a
    traced one; numbers it holds otherwise are left as they are (they must stay equal)."""
    tagger = _TAGGERS.get(type(js))
    return obj if tagger is None else tagger(js, obj, c)


def _tag_list(js: list[Any], obj: Any, c: _Trace) -> Any:
    if type(obj) is tuple and len(obj) == len(js):
        return tuple(_tag(a, b, c) for a, b in zip(js, obj, strict=True))
    _skip(js, c)
    return obj


def _tag_dict(js: dict[str, Any], obj: Any, c: _Trace) -> Any:
    if hasattr(type(obj), "__dataclass_fields__"):
        return _tag_dataclass(js, obj, c)
    if type(obj) is dict and list(obj) == list(js):
        return {k: _tag(v, obj[k], c) for k, v in js.items()}
    _skip(js, c)
    return obj


def _tag_number(js: int | float, obj: Any, c: _Trace) -> Any:
    n = c.n
    c.n += 1
    if type(obj) is int and type(js) is int and obj == js:
        c.tagged.add(n)
        return _TInt.make(obj, n, ())
    if type(obj) is float and float(js) == obj:
        c.tagged.add(n)
        return _TFloat.make(obj, n, _FLOAT if type(js) is int else ())
    return obj


def _tag_dataclass(js: dict[str, Any], obj: Any, c: _Trace) -> Any:
    names = type(obj).__dataclass_fields__
    post_init = getattr(type(obj), "__post_init__", None)
    first = c.n
    copy = object.__new__(type(obj))
    d = _values(obj)
    for k, v in js.items():
        if k not in names or k + "_b64" in js:
            _skip(v, c)
            continue
        if post_init is not None and type(v) is type(d[k]) is int and d[k] != v:
            d[k] = v  # changed by __post_init__: traced from the text's own number, run again below
        d[k] = _tag(v, d[k], c)
    for k, v in d.items():
        object.__setattr__(copy, k, v)  # frozen, maybe slotted
    if post_init is not None and not _post_init(copy, obj, post_init):
        c.tagged.difference_update(range(first, c.n))  # `obj` as it is: its numbers must stay
        return obj
    return copy


_TAGGERS: dict[type, Callable[[Any, Any, _Trace], Any]] = {
    int: _tag_number, float: _tag_number, list: _tag_list, dict: _tag_dict}


def _values(obj: Any) -> dict[str, Any]:
    """A dataclass's field values by name, slotted or not."""
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def _post_init(copy: Any, obj: Any, post_init: Callable[[Any], None]) -> bool:
    """Run its type's __post_init__ on the traced copy, as the decoder ran it on `obj` (it may compare a number,
    or set a field from another: DatasetResidency's data_* counts of -1): whether that gave `obj`'s numbers."""
    try:
        post_init(copy)
    except Exception:  # noqa: BLE001 - a check that refuses a traced number: keep the text's numbers
        return False
    got_values = _values(copy)
    for k, v in _values(obj).items():
        got = got_values[k]  # the same type: the same fields
        if (type(v) in (int, float) or isinstance(got, _Traced)) and (
                type(got) not in (int, float, _TInt, _TFloat) or type(got.real) is not type(v) or got.real != v):
            return False
    return True


def _skip(js: Any, c: _Trace) -> None:
    c.n += sum(1 for _ in _leaves(js))


def _group(key: str, part: Any) -> list[fd.Sample] | None:
    """The samples `fields` makes of `part` as the Snapshot's `key` (None: not a part whose samples are a
    function of it alone)."""
    holder = Snapshot(ts=0.0, host="", **{key: part})
    for p, group in fd.sample_groups(holder, None):
        if p is part:
            return list(group)
    return None


def make(key: str, text: str, parsed: Any, part: Any) -> Template | None:
    """A template of a part read the ordinary way: its text, the value parsed from it and the part decoded from
    that (None where none can be made or its check fails)."""
    global _TRACE
    got = cut(text)
    if got is None:
        return None
    pieces, nums = got
    kinds = _kinds(parsed, nums)
    if kinds is None:
        return None
    trace = _TRACE = _Trace()
    try:
        tagged = _tag(parsed, part, trace)
        raw = _group(key, tagged)
    finally:
        _TRACE = None
    if raw is None or trace.n != len(nums):
        return None
    free = [i in trace.tagged and i not in trace.fixed for i in range(len(nums))]
    samples = [(f, {str(k): str(v) for k, v in labels.items()}, _spec(value, kinds, free, trace))
               for f, labels, value in raw]
    tm = Template(key, pieces, kinds, free, parsed, part, samples)
    tm._own = tuple(nums)
    tm._own_fixed = tm._fixed(tm._own)
    if not _check(tm, key, pieces, nums):
        return None
    return tm


def _kinds(parsed: Any, nums: list[str]) -> list[bool] | None:
    """Whether each number of the text is a float (None: the parsed value's numbers are not the text's)."""
    leaves = list(_leaves(parsed))
    if len(leaves) != len(nums) or "-0" in nums:
        return None
    kinds = [_FRACTION(t) is not None for t in nums]
    for leaf, t, is_float in zip(leaves, nums, kinds, strict=True):
        if type(leaf) is not (float if is_float else int) or leaf != (float(t) if is_float else int(t)):
            return None
    return kinds


def _spec(value: Any, kinds: list[bool], free: list[bool], trace: _Trace) -> Any:
    """A sample's spec: ("=", value) for a constant, else (number, ops, is_float) of the free number it is."""
    if isinstance(value, _Traced):
        spec: Any = (value._n, _plainer(value._ops), kinds[value._n])
        value = value.real
    elif type(value) is float and id(value) in trace.floated and trace.floated[id(value)][0] is value:
        _, n, ops = trace.floated[id(value)]
        spec = (n, _plainer(ops), kinds[n])
    else:
        return ("=", value)
    return spec if free[spec[0]] else ("=", value)


def _changed(t: str, is_float: bool) -> str:
    """Another number of the same kind and sign, in range."""
    if is_float:
        v = float(t)
        return repr(v * 0.75 + (0.5 if v >= 0 else -0.5))
    v = int(t)
    return str(v + 7 if v >= 0 else v - 7) if abs(v) < 10**17 else str(v // 3)


def _check(tm: Template, key: str, pieces: list[str], nums: list[str]) -> bool:
    """The text with every free number changed, read the ordinary way, gives the samples the template says; and
    so does the text with every free number 0 (a branch the trace did not see, `x > 0`, most often turns there)."""
    changed = [_changed(t, k) if f else t for t, k, f in zip(nums, tm.kinds, tm.free, strict=True)]
    zero = [("0.0" if k else "0") if f else t for t, k, f in zip(nums, tm.kinds, tm.free, strict=True)]
    return all(_check_one(tm, key, "".join(p + n for p, n in zip(pieces, [*other, ""], strict=True)))
               for other in (changed, zero))


def _check_one(tm: Template, key: str, text: str) -> bool:
    got = tm.match(text, 0)
    if got is None or got[1] != len(text):
        return False
    try:
        parsed = store.loads(text)
        part = store.decode_part(key, parsed)
        actual = _group(key, part)
    except (ValueError, TypeError, KeyError, RecursionError, ArithmeticError):
        return False
    if actual is None or len(actual) != len(tm.samples):
        return False
    for (f, labels, value), (tf, tlabels, spec) in zip(actual, tm.samples, strict=True):
        if f is not tf or labels != tlabels or number(value) != cell(spec, got[0]):
            return False
    return True


def own_text(spec: Any) -> bool:
    """Whether a sample's cell is always its number's own text: an int taken as it is (JSON's ints are written
    as Python writes them; "-0" never matches)."""
    return spec[0] != "=" and not spec[2] and spec[1] == ()


def own_text_if_short(spec: Any) -> bool:
    """Whether a sample's cell is its number's own text where that has at most 15 digits: an int made a float
    (below 2**53 a float of an int is written as the int)."""
    return spec[0] != "=" and not spec[2] and spec[1] == _FLOAT


def cell(spec: Any, nums: tuple[str, ...]) -> str:
    """A sample's cell from the numbers' texts."""
    if spec[0] == "=":
        return number(spec[1])
    n, ops, is_float = spec
    t = nums[n]
    if not is_float and (not ops or ops == _FLOAT) and len(t) <= 15 and t != "-0":
        return t  # an int's own text (or its float's, below 2**53)
    return number(_apply(float(t) if is_float else int(t), ops))

