"""Instances of the agent's subclasses of built-in and standard-library value types,
rebuilt as they were, without calling the subclass's own ``__init__``/``__new__`` or its
overridden mutators.

Pickle rebuilds such an instance through its base's reduction, which was written for the
base: ``set``'s calls ``cls(items)``, so a ``TagSet(set)`` whose ``__init__(owner)`` takes
no items loses them; ``OrderedDict``'s calls ``cls()`` (an ``LRU(capacity)`` cannot be
made) and then the subclass's ``__setitem__``, which reads ``self.capacity`` before any
attribute is back; ``Random``'s and ``deque``'s call ``cls`` with the base's arguments;
``Decimal``'s, ``datetime``'s and ``timedelta``'s leave the instance's own attributes out.
The snapshot was written, and only the restore failed -- after a crash, for good -- or
gave the class's defaults back, quietly.

Here the instance is made by the base's ``__new__``, filled through the base's own
methods, and given its attributes (its ``__getstate__``, as pickle would) last.  A class
that defines its own pickling (``__reduce__``, ``__reduce_ex__``, ``__getnewargs__`` or
``__getnewargs_ex__``: a ``NamedTuple``, an ``IntEnum``; or a ``copyreg.pickle()``
registration) is left to it.  A plain class whose own ``__new__`` requires arguments
pickle never gives it is refused while the run is live (:func:`needs_new_arguments`),
instead of failing at every restore.
"""

from __future__ import annotations

import collections
import copyreg
import datetime
import decimal
import fractions
import random
import types
from typing import Any

from .. import errors

__all__ = ["fill", "needs_new_arguments", "rebuild", "reduce", "reducer_for"]

_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class defined by a class statement

# base -> kind, most derived first (an OrderedDict is a dict)
_BASES: tuple[tuple[type, str], ...] = (
    (collections.OrderedDict, "odict"),
    (dict, "dict"),
    (list, "list"),
    (set, "set"),
    (frozenset, "frozenset"),
    (collections.deque, "deque"),
    (random.Random, "random"),
    (decimal.Decimal, "decimal"),
    (fractions.Fraction, "fraction"),
    (datetime.datetime, "reduce"),  # (datetime before date: it is one)
    (datetime.date, "reduce"),
    (datetime.time, "reduce"),
    (datetime.timedelta, "reduce"),
    (str, "value"),
    (bytes, "value"),
    (int, "value"),
    (float, "value"),
    (complex, "value"),
    (tuple, "value"),
)
_PROTOCOL = ("__reduce__", "__reduce_ex__", "__getnewargs__", "__getnewargs_ex__")


def _base_of(t: type) -> tuple[type, str] | None:
    for base, kind in _BASES:
        if issubclass(t, base):
            return base, kind
    return None


def _new_needs_arguments(t: type) -> bool:
    """Whether ``t.__new__`` (its own, on a plain class) requires arguments besides the
    class: pickle's default, ``cls.__new__(cls)``, cannot make one then."""
    import inspect

    try:
        params = list(inspect.signature(t.__new__).parameters.values())[1:]
    except (TypeError, ValueError):
        return False
    return any(p.default is inspect.Parameter.empty
               and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
               for p in params)


def reducer_for(t: type) -> tuple[type, str] | None:
    """``(base, kind)`` if instances of ``t`` are rebuilt here: ``t`` is a class of the
    program's (not the base itself, nor a C type) whose pickling is its base's, with no
    ``copyreg.pickle()`` registration of its own."""
    if not t.__flags__ & _HEAPTYPE:
        return None
    found = _base_of(t)
    if found is None or found[0] is t:
        return None
    base = found[0]
    for name in _PROTOCOL:
        if getattr(t, name, None) is not getattr(base, name, None):
            return None
    for cls in t.__mro__[:t.__mro__.index(base)]:
        if cls in copyreg.dispatch_table:  # a copyreg.pickle() registration says how
            return None
    new: Any = getattr(t, "__new__")
    if new is not getattr(base, "__new__") and not isinstance(new, types.FunctionType):
        return None  # a C class's own __new__ (an extension's heap type): not ours to bypass
    return found


def needs_new_arguments(t: type) -> bool:
    """Whether ``t`` is a plain class of the program whose own ``__new__`` requires
    arguments and which says nothing of them to pickle (no ``__getnewargs__``, no
    ``__reduce__``): pickle's default, ``cls.__new__(cls)``, could never make one again
    (nor can tcc: such a ``__new__`` may intern, and a bypass would split identities)."""
    if not t.__flags__ & _HEAPTYPE or _base_of(t) is not None or t in copyreg.dispatch_table:
        return False
    if any(getattr(t, name, None) is not getattr(object, name, None) for name in _PROTOCOL):
        return False
    return _own(t, "__new__", object) and _new_needs_arguments(t)


_VALUE: dict[type, Any] = {str: str.__str__, bytes: bytes.__bytes__, int: int.__int__, float: float.__float__,
          complex: complex.__complex__, tuple: lambda obj: tuple(tuple.__iter__(obj))}
_MUTABLE = ("dict", "odict", "list", "set", "deque", "random")


def _made_with(base: type, kind: str, obj: Any) -> Any:
    """What the base's ``__new__`` needs: the value of an immutable one, the ``maxlen`` of
    a deque; nothing for the other mutable ones (their content follows as state)."""
    if kind == "deque":
        return obj.maxlen
    if kind in _MUTABLE:
        return None
    if kind == "frozenset":
        return list(frozenset.__iter__(obj))
    if kind == "decimal":
        return decimal.Decimal.__str__(obj)
    if kind == "fraction":
        return (obj.numerator, obj.denominator)
    if kind == "reduce":  # the base's own reduction: (cls, args), fold included (protocol 4)
        reduced: Any = getattr(base, "__reduce_ex__")(obj, 4)
        return tuple(reduced[1])
    read: Any = _VALUE[base]
    return read(obj)


def _content(kind: str, obj: Any) -> Any:
    """What a mutable base holds, read through the base's own methods; None otherwise."""
    if kind == "dict":
        return list(dict.items(obj))
    if kind == "odict":
        return list(collections.OrderedDict.items(obj))
    if kind == "list":
        return list(list.__iter__(obj))
    if kind == "set":
        return list(set.__iter__(obj))
    if kind == "deque":
        return list(collections.deque.__iter__(obj))
    if kind == "random":
        return random.Random.getstate(obj)
    return None


def _own(t: type, name: str, base: type) -> bool:
    """Whether ``t`` defines ``name`` itself (not inherited from ``base`` or ``object``)."""
    got = getattr(t, name, None)
    return got is not getattr(base, name, None) and got is not getattr(object, name, None)


def reduce(kind: str, base: type, obj: Any) -> Any:
    """The reduction of ``obj``.  The state -- the base's content, then the instance's
    attributes -- goes in after the instance is made and memoised (so it may refer back to
    it), and is put back by :func:`fill`, through the base's methods, not the subclass's."""
    from . import _records

    t = type(obj)
    getstate: Any = getattr(t, "__getstate__") if _own(t, "__getstate__", base) else object.__getstate__
    attrs = getstate(obj)
    return (_records.builtin_subclass, (t, kind, _made_with(base, kind, obj)),
            (_content(kind, obj), attrs), None, None, _records.fill_builtin_subclass)


def rebuild(cls: Any, kind: Any, made_with: Any) -> Any:
    """An instance of ``cls`` made by its base (its content and attributes follow)."""
    base = _checked(cls, kind)
    try:
        if kind == "dict":
            return dict.__new__(cls)
        if kind == "odict":
            obj = collections.OrderedDict.__new__(cls)
            collections.OrderedDict.__init__(obj)
            return obj
        if kind == "list":
            return list.__new__(cls)
        if kind == "set":
            return set.__new__(cls)
        if kind == "deque":
            obj = collections.deque.__new__(cls)
            collections.deque.__init__(obj, (), made_with)
            return obj
        if kind == "random":
            return random.Random.__new__(cls)
        if kind == "fraction":
            return fractions.Fraction.__new__(cls, *made_with)
        if kind == "reduce":
            return base.__new__(cls, *made_with)
        return base.__new__(cls, made_with)
    except (TypeError, ValueError) as exc:
        raise errors.CorruptSnapshotError(
            f"snapshot holds a {cls.__module__}.{cls.__qualname__} that cannot be rebuilt: {exc}") from None


def fill(obj: Any, state: Any) -> None:
    """Put back what :func:`reduce` saved: the base's content through the base's methods,
    then the attributes (through the class's own ``__setstate__`` if it has one)."""
    if not (isinstance(state, tuple) and len(state) == 2):
        raise errors.CorruptSnapshotError("malformed subclass state in the snapshot")
    content, attrs = state
    t = type(obj)
    found = _base_of(t)
    if found is None:
        raise errors.CorruptSnapshotError("malformed subclass state in the snapshot")
    base, kind = found
    try:
        if kind == "dict":
            dict.update(obj, content)
        elif kind == "odict":
            for key, value in content:
                collections.OrderedDict.__setitem__(obj, key, value)
        elif kind == "list":
            list.extend(obj, content)
        elif kind == "set":
            set.update(obj, content)
        elif kind == "deque":
            collections.deque.extend(obj, content)
        elif kind == "random":
            random.Random.setstate(obj, content)
    except (TypeError, ValueError) as exc:
        raise errors.CorruptSnapshotError(
            f"snapshot holds a {t.__module__}.{t.__qualname__} whose content cannot be put back: {exc}") from None
    if attrs is None:
        return
    if _own(t, "__setstate__", base):
        obj.__setstate__(attrs)
        return
    slots = None
    if isinstance(attrs, tuple) and len(attrs) == 2:
        attrs, slots = attrs
    if attrs:
        vars(obj).update(attrs)
    for name, value in (slots or {}).items():
        object.__setattr__(obj, name, value)


def _checked(cls: Any, kind: Any) -> type:
    if not isinstance(cls, type) or not isinstance(kind, str):
        raise errors.CorruptSnapshotError("malformed subclass instance in the snapshot")
    found = _base_of(cls)
    if found is None or found[1] != kind:
        raise errors.IncompatibleSnapshotError(
            f"snapshot holds a {cls.__module__}.{cls.__qualname__} as a subclass of a "
            f"{kind!r} value, which it is not here (its class changed)")
    return found[0]
