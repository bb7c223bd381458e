"""The standard types the restricted loader builds for real, and the bounds on building them.

A short allowlist of inert standard types (containers, numbers, text,
``datetime``, ``Decimal``, ``Fraction``, ``UUID``) and the builtin exceptions
are rebuilt as real values by :func:`tcc.capture.safe_loads`: their
construction, state and repr run no user code.  Every other global a pickle
names becomes a stub (:mod:`tcc.capture._views`).  Calls of an allowlisted
type go through :class:`AllowedType`, which bounds the work and memory they
may ask for.
"""

from __future__ import annotations

import builtins
import collections
import datetime
import decimal
import fractions
import re
import sys
import uuid
from typing import TYPE_CHECKING, Any

from ._views import StubMeta, View, stub_class, stub_name

if TYPE_CHECKING:
    from ._safeload import _Globals
    from ._viewrepr import ViewRepr

# Types whose construction, state and repr run no user code.
SAFE_BUILTINS = {
    name: getattr(builtins, name)
    for name in (
        "list", "dict", "set", "frozenset", "tuple", "int", "float", "complex", "str",
        "bytes", "bytearray", "bool", "slice", "range", "object",
    )
}
SAFE_TYPES: frozenset[type] = frozenset(
    list(SAFE_BUILTINS.values())
    + [
        type(None), collections.OrderedDict, collections.deque, collections.defaultdict,
        collections.Counter, datetime.datetime, datetime.date, datetime.time,
        datetime.timedelta, datetime.timezone, decimal.Decimal, fractions.Fraction, uuid.UUID,
    ]
)
SAFE_GLOBALS: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("collections", "deque"): collections.deque,
    ("collections", "defaultdict"): collections.defaultdict,
    ("collections", "Counter"): collections.Counter,
    ("datetime", "datetime"): datetime.datetime,
    ("datetime", "date"): datetime.date,
    ("datetime", "time"): datetime.time,
    ("datetime", "timedelta"): datetime.timedelta,
    ("datetime", "timezone"): datetime.timezone,
    ("decimal", "Decimal"): decimal.Decimal,
    ("fractions", "Fraction"): fractions.Fraction,
    ("uuid", "UUID"): uuid.UUID,
}


def is_safe_class(cls: Any) -> bool:
    """Whether ``cls.__new__`` may be called for the pickle: a stub class, an allowlisted
    type or a builtin exception."""
    return isinstance(cls, StubMeta) or is_allowed(cls) or is_builtin_exception(cls)


def is_builtin_exception(cls: Any) -> bool:
    return (
        isinstance(cls, type)
        and issubclass(cls, BaseException)
        and cls.__module__ == "builtins"
        and getattr(builtins, cls.__name__, None) is cls
    )


# ------------------------------------------------------- bounded calls
#
# Calling an allowlisted type is inert but not free: ``tuple(range(10**7))``
# is 81 bytes of pickle and 420 MB of memory, ``bytes(10**10)`` is 10 GB,
# ``Fraction('1e-10000000')`` computes 10**10000000.  So the loader never hands
# out the real types: it hands out an :class:`AllowedType` for each, which
# checks the arguments first (their kind, and the size of what they ask for)
# and charges the memory the call would build against a budget for the whole
# load.  What goes past a limit becomes a stub marked "(not rebuilt: too
# large)", carrying the arguments.  Every allowlisted type and its worst case:
#
# * list, tuple, set, frozenset, dict, OrderedDict, Counter, deque,
#   defaultdict: as large as the iterable they are given, and a ``range`` is
#   any size -- the argument must be a sized container, str, bytes or range,
#   and its length is charged (items made from a range cost their int too);
# * bytes, bytearray: ``bytes(n)`` is n bytes -- n is charged; from a str only
#   with a known text codec (a codec name could import a module);
# * str: ``str(obj)`` is a repr of any size -- only str, bytes with a known
#   codec, and numbers; an int of at most _MAX_INT_BITS (int -> str is
#   quadratic);
# * int, float, complex, Decimal: parsing text -- at most _MAX_TEXT
#   characters (CPython's own int limit can be switched off);
# * Fraction: text, ints and Decimals -- as above, and an exponent of at most
#   _MAX_EXPONENT ('1e-N' computes 10**N), ints of at most _MAX_INT_BITS
#   (their gcd is quadratic);
# * UUID: ``UUID(hex=s)`` copies s -- at most _MAX_SCALAR_TEXT characters;
# * range, slice, object, bool and datetime's types cost the same whatever
#   they are given (they check or keep their arguments, never copy or iterate
#   them): they are handed out as they are (CONSTANT_COST).
#
# copyreg's ``__newobj__``/``_reconstructor`` and the NEWOBJ opcodes go through
# the same checks.  Opcodes alone (no call) build only what the pickle spells
# out, so their memory is bounded by the payload's size.  (A UUID is pickled
# with NEWOBJ, which the C unpickler applies only to a real class: it gets
# :class:`CheckedUUID`, a class whose call is checked and whose ``__new__``
# makes a plain UUID.)

_MAX_TEXT = 10_000  # characters of a number written out (int, float, complex, Decimal, Fraction)
_MAX_INT_BITS = 40_000  # ~12,000 decimal digits
_MAX_EXPONENT = 10_000  # Fraction('1e-N') and Fraction(Decimal('1e-N')) compute 10**N
_MAX_SCALAR_TEXT = 1_000  # a str or bytes argument of a constant-size type (a timezone name...)
BUDGET_FLOOR = 64 << 20  # bytes the calls of one load may build, at least ...
BUDGET_RATIO = 16  # ... or this many times the size of the payload
TOO_LARGE = "too large"
# Text codecs ``str(b, encoding)`` and ``bytes(s, encoding)`` may name: looking a
# codec up imports its module.
_CODECS = frozenset({
    "utf-8", "utf8", "utf_8", "ascii", "us-ascii", "latin-1", "latin1", "latin_1", "iso-8859-1",
    "iso8859-1", "utf-16", "utf_16", "utf-16-le", "utf-16-be", "utf-32", "utf_32", "utf-32-le",
    "utf-32-be", "cp1252",
})
_CODEC_ERRORS = frozenset({"strict", "ignore", "replace", "surrogateescape", "backslashreplace",
                           "surrogatepass"})
_CONTAINERS = (list, tuple, set, frozenset, dict, collections.deque)
_HASHED = frozenset({set, frozenset, dict, collections.OrderedDict, collections.Counter,
                     collections.defaultdict})
_SCALARS = (int, float, complex, bool, type(None))
_EXPONENT = re.compile(r"[eE]\s*([-+]?\d+)")
CONSTANT_COST: frozenset[Any] = frozenset({
    object, bool, slice, range, datetime.datetime, datetime.date, datetime.time,
    datetime.timedelta, datetime.timezone,
})


_TOO_LARGE_UUID = stub_class("uuid", "UUID", _tcc_unbuilt=True, _tcc_why=TOO_LARGE)


class Refused(Exception):
    """An allowlisted type was asked for more than the loader builds (the reason)."""


class AllowedType(View):
    """What the restricted loader hands out for an allowlisted type.

    Calling it (``REDUCE``, copyreg's constructors, ``NEWOBJ`` in the tolerant
    loader) builds the real value only if the arguments pass the checks of
    :meth:`_Globals.check`; otherwise it returns a stub marked "(not rebuilt:
    too large)", or raises TypeError for arguments of a kind it does not take
    (which the tolerant loader turns into a "(not rebuilt)" stub).
    """

    __slots__ = ("_globals", "cls")

    def __init__(self, cls: type, globals_: _Globals) -> None:
        self.cls = cls
        self._globals = globals_

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._globals.build(self.cls, args, kwargs, new=False)

    def new(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``cls.__new__(cls, *args, **kwargs)``, checked: what NEWOBJ and ``__newobj__`` do."""
        return self._globals.build(self.cls, args, kwargs, new=True)

    def _tcc_repr(self, r: ViewRepr, level: int) -> str:
        return f"<class {class_label(self.cls).removeprefix('builtins.')}>"


class UUIDType(type):
    """Metaclass of :class:`CheckedUUID`: calling it checks the arguments first."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        try:
            call_cost(uuid.UUID, args, kwargs)  # TypeError for arguments of another kind
        except Refused:
            return _TOO_LARGE_UUID(*args, **{str(k): v for k, v in kwargs.items()})
        return uuid.UUID(*args, **kwargs)

    def __repr__(cls) -> str:
        return "<class uuid.UUID>"


class CheckedUUID(uuid.UUID, metaclass=UUIDType):
    """What the loader hands out for ``uuid.UUID``: NEWOBJ (how a UUID is pickled) makes a
    plain, empty UUID that BUILD then fills; a call goes through the checks."""

    __slots__ = ()

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        return object.__new__(uuid.UUID)


def real_type(cls: Any) -> Any:
    """The type an :class:`AllowedType` (or :class:`CheckedUUID`) stands for (anything
    else as it is)."""
    if cls is CheckedUUID:
        return uuid.UUID
    return cls.cls if isinstance(cls, AllowedType) else cls


def is_allowed(cls: Any) -> bool:
    """Whether ``cls`` is what the loader hands out for an allowlisted type."""
    return isinstance(cls, AllowedType) or cls is CheckedUUID or cls in CONSTANT_COST


def _length(value: Any) -> tuple[int, int] | None:
    """(items, bytes each of them costs when copied) of a value an allowlisted type may
    iterate over; None if it is not one whose size is known without iterating it."""
    t = type(value)
    if t is range:
        try:
            return len(value), 40  # each item a new int
        except OverflowError:  # longer than sys.maxsize
            return sys.maxsize, 40
    if t is str:
        return len(value), 80  # each item a new 1-character str
    if t in (bytes, bytearray):
        return len(value), 8
    if t in _CONTAINERS or isinstance(value, (dict, collections.deque)):
        return len(value), 8
    return None


def _kind_error(cls: type, value: Any) -> TypeError:
    return TypeError(f"{class_label(cls)} is not rebuilt from a {type(value).__name__} "
                     "argument when inspecting")


def _check_int(value: Any, limit: int = _MAX_INT_BITS) -> None:
    if isinstance(value, int) and abs(value).bit_length() > limit:
        raise Refused(TOO_LARGE)


def _check_text(value: Any, limit: int = _MAX_TEXT) -> None:
    if isinstance(value, (str, bytes, bytearray)) and len(value) > limit:
        raise Refused(TOO_LARGE)


def _check_codec(cls: type, encoding: Any, errors: Any) -> None:
    if not isinstance(encoding, str) or encoding.lower() not in _CODECS:
        raise TypeError(f"{class_label(cls)} with the codec {encoding!r} is not rebuilt when "
                        "inspecting (looking a codec up imports it)")
    if errors is not None and errors not in _CODEC_ERRORS:
        raise TypeError(f"{class_label(cls)} with errors={errors!r} is not rebuilt when inspecting")


def _check_decimal(value: decimal.Decimal) -> None:
    _sign, digits, exponent = value.as_tuple()
    if len(digits) > _MAX_TEXT or (isinstance(exponent, int) and abs(exponent) > _MAX_EXPONENT):
        raise Refused(TOO_LARGE)


def _fraction_part(value: Any) -> None:
    if isinstance(value, (bool, float)) or value is None:
        return
    if isinstance(value, int):
        return _check_int(value)
    if isinstance(value, str):
        _check_text(value)
        for exponent in _EXPONENT.findall(value):
            if len(exponent) > 8 or abs(int(exponent)) > _MAX_EXPONENT:
                raise Refused(TOO_LARGE)
        return
    if isinstance(value, decimal.Decimal):
        return _check_decimal(value)
    if isinstance(value, fractions.Fraction):
        _check_int(value.numerator)
        return _check_int(value.denominator)
    raise _kind_error(fractions.Fraction, value)


def call_cost(cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """Bytes of memory calling ``cls(*args, **kwargs)`` builds (an estimate), after checking
    that the arguments are of a kind whose cost is known.  Refused past a per-call
    limit; TypeError for arguments of another kind."""
    everything = (*args, *kwargs.values())
    if cls in (list, tuple, set, frozenset, dict, collections.OrderedDict, collections.Counter,
               collections.deque, collections.defaultdict):
        sources = list(args[1:2] if cls is collections.defaultdict else args[:1])
        if cls is collections.deque and len(args) > 1 and not isinstance(args[1], (int, type(None))):
            raise _kind_error(cls, args[1])
        total = 0
        for source in sources:
            size = _length(source)
            if size is None:
                raise _kind_error(cls, source)
            items, each = size
            total += items * (each + (40 if cls in _HASHED else 0))
        if cls in (dict, collections.OrderedDict, collections.Counter):
            total += len(kwargs) * 48
        return total
    if cls in (bytes, bytearray):
        if not args:
            return 0
        source = args[0]
        if isinstance(source, int) and not isinstance(source, bool):
            return max(source, 0)
        if isinstance(source, str):
            encoding = args[1] if len(args) > 1 else kwargs.get("encoding")
            _check_codec(cls, encoding, args[2] if len(args) > 2 else kwargs.get("errors"))
            return 4 * len(source)
        size = _length(source)
        if size is None:
            raise _kind_error(cls, source)
        return size[0]
    if cls is str:
        if not args and not kwargs:
            return 0
        source = args[0] if args else kwargs.get("object")
        if isinstance(source, str):
            return len(source)
        if isinstance(source, (bytes, bytearray)):
            if len(args) > 1 or kwargs.keys() - {"object"}:
                encoding = args[1] if len(args) > 1 else kwargs.get("encoding", "utf-8")
                _check_codec(cls, encoding, args[2] if len(args) > 2 else kwargs.get("errors"))
            return 4 * len(source)
        if isinstance(source, _SCALARS):
            _check_int(source)
            return 0
        raise _kind_error(cls, source)
    if cls in (int, float, complex, decimal.Decimal):
        for value in everything:
            if isinstance(value, (str, bytes, bytearray)):
                _check_text(value)
            elif isinstance(value, int):
                _check_int(value)
            elif isinstance(value, decimal.Decimal):
                _check_decimal(value)
            elif cls is decimal.Decimal and isinstance(value, tuple):
                if len(value) != 3 or not isinstance(value[1], tuple) or len(value[1]) > _MAX_TEXT:
                    raise Refused(TOO_LARGE)
            elif not isinstance(value, (float, complex, type(None))):
                raise _kind_error(cls, value)
        return 0
    if cls is fractions.Fraction:
        for value in everything:
            _fraction_part(value)
        return 0
    # uuid.UUID (and any other): constant work for short scalar arguments
    for value in everything:
        if isinstance(value, (str, bytes, bytearray)):
            _check_text(value, _MAX_SCALAR_TEXT)
        elif isinstance(value, int):
            _check_int(value, 256)
        elif isinstance(value, tuple) and cls is uuid.UUID:
            if len(value) > 6 or not all(isinstance(v, int) for v in value):
                raise _kind_error(cls, value)
            for v in value:
                _check_int(v, 256)
    return 0


def class_label(cls: Any) -> str:
    """'module.qualname' of a class, an allowlisted type or a stub (for messages and reprs)."""
    cls = real_type(cls)
    name = stub_name(cls)
    if name is not None:
        return name
    if isinstance(cls, type):
        return f"{cls.__module__}.{cls.__qualname__}"
    return f"<{type(cls).__name__}>"
