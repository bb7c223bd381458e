"""What the restricted loader builds instead of live objects: views and stubs.

A snapshot read by :func:`tcc.capture.safe_loads` never becomes the objects it
describes.  tcc's frame records become views (:class:`FrameView`,
:class:`CellView`...), cloudpickle's function and class rebuilders become views
that keep names, a code object becomes a :class:`CodeView` -- never a real code
object, which CPython would build from bytecode it trusts -- and every other
global the pickle names becomes a :class:`Stub` class that, when called,
reconstructed or given state, just records what it was given.  Nothing here
calls into what a snapshot contains: every attribute a view keeps is checked
for its type, and views show themselves (``_tcc_repr``) through a
:class:`~tcc.capture._viewrepr.ViewRepr`, which never asks an unknown type for
its repr.

Line numbers of a stored code object are decoded from its stored line table by
:func:`code_line`, in Python.  :func:`frame_view` reads a live generator into
the same :class:`FrameView` (for ``--unsafe-repr``).
"""

from __future__ import annotations

import datetime
import types
from typing import TYPE_CHECKING, Any

from . import _frames, _records
from ._fingerprint import fingerprint

if TYPE_CHECKING:
    from ._viewrepr import ViewRepr


def _shown(obj: Any) -> str:
    """``repr()`` of a view, a stub or a stub class: what the current
    :class:`~tcc.capture._viewrepr.ViewRepr` shows, three levels deep."""
    from ._viewrepr import shown  # _viewrepr builds on this module

    return shown(obj)


# ---------------------------------------------------------------- the views


class View:
    """Base of everything the restricted unpickler builds instead of live objects."""

    __slots__ = ()

    def _tcc_repr(self, r: ViewRepr, level: int) -> str:  # pragma: no cover - overridden
        return f"<{type(self).__name__}>"

    def __repr__(self) -> str:
        return _shown(self)


class _Unbound(View):
    """A C NULL in a frame slot: an unbound local (or a method-call marker)."""

    __slots__ = ()

    def _tcc_repr(self, r: ViewRepr, level: int) -> str:
        return "<unbound>"

    def __reduce__(self) -> str:
        return "UNBOUND"


UNBOUND = _Unbound()


# How cloudpickle (and tcc's ``_records.make_code``) lays out a code object's
# constructor arguments on Python 3.11 and later.
_CODE_FIELDS = (
    "co_argcount", "co_posonlyargcount", "co_kwonlyargcount", "co_nlocals", "co_stacksize",
    "co_flags", "co_code", "co_consts", "co_names", "co_varnames", "co_filename", "co_name",
    "co_qualname", "co_firstlineno", "co_linetable", "co_exceptiontable", "co_freevars",
    "co_cellvars",
)
_CODE_INTS = ("co_argcount", "co_posonlyargcount", "co_kwonlyargcount", "co_nlocals",
              "co_stacksize", "co_flags", "co_firstlineno")
_CODE_BYTES = ("co_code", "co_linetable", "co_exceptiontable")
_CODE_NAMES = ("co_names", "co_varnames", "co_freevars", "co_cellvars")


class CodeView(View):
    """A code object as the snapshot stores it, never built into a real one.

    Building a code object from a snapshot's arguments is not inert: CPython
    trusts the bytecode it is given (a crafted one makes ``CodeType(...).replace()``
    write past the end of a buffer in ``deopt_code``).  The view keeps the
    arguments that inspect reads -- names, flags, the raw bytecode and the line
    table -- each checked for its type; line numbers are decoded from the line
    table by :func:`code_line`, in Python.
    """

    __slots__ = ("args", "name", "qualname", *_CODE_FIELDS)

    co_argcount: int
    co_posonlyargcount: int
    co_kwonlyargcount: int
    co_nlocals: int
    co_stacksize: int
    co_flags: int
    co_code: bytes
    co_consts: tuple[Any, ...]
    co_names: tuple[str, ...]
    co_varnames: tuple[str, ...]
    co_filename: str
    co_name: str
    co_qualname: str
    co_firstlineno: int
    co_linetable: bytes
    co_exceptiontable: bytes
    co_freevars: tuple[str, ...]
    co_cellvars: tuple[str, ...]

    def __init__(self, args: Any, filename: Any) -> None:
        self.args = args
        fields = args if isinstance(args, tuple) and len(args) == len(_CODE_FIELDS) else None
        for index, field in enumerate(_CODE_FIELDS):
            value = fields[index] if fields is not None else None
            if field in _CODE_INTS:
                value = value if type(value) is int else 0
            elif field in _CODE_BYTES:
                value = value if type(value) is bytes else b""
            elif field in _CODE_NAMES:
                ok = type(value) is tuple and all(type(v) is str for v in value)
                value = value if ok else ()
            elif field == "co_consts":
                value = value if type(value) is tuple else ()
            else:
                value = value if type(value) is str else ""
            object.__setattr__(self, field, value)
        if fields is None and isinstance(args, tuple):  # another layout: guess the names
            strings = [a for a in args if type(a) is str]
            self.co_name = strings[1] if len(strings) > 1 else "?"
            self.co_qualname = strings[2] if len(strings) > 2 else self.co_name
        self.co_name = self.co_name or "?"
        self.co_qualname = self.co_qualname or self.co_name
        self.co_filename = filename if type(filename) is str else ""
        self.name = self.co_name
        self.qualname = self.co_qualname

    def _tcc_repr(self, r: ViewRepr, level: int) -> str:
        return f"<code {self.qualname}>"


AnyCode = types.CodeType | CodeView  # a live or compiled code object, or a stored one


def _varint(table: bytes, i: int) -> tuple[int, int]:
    """(value, next index) of the 6-bit-chunk varint at ``table[i]`` (IndexError if cut short)."""
    byte = table[i]
    value, shift = byte & 63, 0
    while byte & 64:
        i += 1
        byte = table[i]
        shift += 6
        value |= (byte & 63) << shift
    return value, i + 1


def _table_position(table: bytes, first: int, offset: int) -> tuple[int | None, int | None, int | None, int | None] | None:
    """(line, end line, column, end column) of code unit ``offset`` from a 3.11+ line table.

    The format is CPython's ``Objects/locations.md``; this reads it the way
    ``co_positions()`` does, but from stored bytes and without a code object.
    None if the table does not reach ``offset`` or is malformed.
    """
    line, unit, i = first, 0, 0
    try:
        while i < len(table):
            head = table[i]
            i += 1
            if not head & 0x80:
                return None  # every entry starts with its top bit set
            kind, length = (head >> 3) & 15, (head & 7) + 1
            pos: tuple[int | None, int | None, int | None, int | None]
            if kind == 15:  # no location
                pos = (None, None, None, None)
            elif kind == 14:  # long form
                delta, i = _varint(table, i)
                line += -(delta >> 1) if delta & 1 else delta >> 1
                end, i = _varint(table, i)
                col, i = _varint(table, i)
                end_col, i = _varint(table, i)
                pos = (line, line + end, col - 1 if col else None, end_col - 1 if end_col else None)
            elif kind == 13:  # no columns
                delta, i = _varint(table, i)
                line += -(delta >> 1) if delta & 1 else delta >> 1
                pos = (line, line, None, None)
            elif kind >= 10:  # one line, columns in two bytes
                line += kind - 10
                pos = (line, line, table[i], table[i + 1])
                i += 2
            else:  # short form
                second = table[i]
                i += 1
                col = kind << 3 | (second >> 4)
                pos = (line, line, col, col + (second & 15))
            if unit <= offset < unit + length:
                return pos
            unit += length
    except IndexError:
        return None
    return None


def code_line(code: Any, offset: int) -> tuple[int | None, tuple[int, int] | None]:
    """(line, (column, end column) or None) of instruction ``offset`` (in code units) of ``code``.

    ``code`` is a real code object (a live frame's, or one compiled from the
    current source) or a :class:`CodeView`, whose stored line table is decoded
    without building a code object.  A negative offset (not started) is the
    function's first line.
    """
    if offset < 0:
        return (code.co_firstlineno or None), None
    pos: tuple[Any, ...] | None = None
    if isinstance(code, types.CodeType):
        for i, found in enumerate(code.co_positions()):
            if i == offset:
                pos = found
                break
    else:
        pos = _table_position(code.co_linetable, code.co_firstlineno, offset)
    if pos is None:
        return None, None
    line, end_line, col, end_col = pos
    cols = (col, end_col) if line == end_line and col is not None and end_col is not None else None
    return line, cols


class FunctionView(View):
    """A function captured by value (cloudpickle ``_make_function``)."""

    __slots__ = ("code", "name", "qualname", "module", "closure", "defaults")

    def __init__(self, code: Any, globals_: Any, name: Any, argdefs: Any, closure: Any) -> None:
        self.code: AnyCode | None = code if isinstance(code, (types.CodeType, CodeView)) else None
        self.name = name if isinstance(name, str) else "?"
        qualname = self.code.co_qualname if self.code is not None else None
        self.qualname = qualname or self.name
        module = globals_.get("__name__") if isinstance(globals_, dict) else None
        self.module = module if isinstance(module, str) else None
        self.closure = closure
        self.defaults = argdefs

    def _tcc_repr(self, r: ViewRepr, level: int) -> str:
        return f"<function {self.qualname}>"


class CellView(View):
    """A closure cell; ``contents`` is ``_EMPTY`` when the cell is empty (:attr:`empty`)."""

    __slots__ = ("contents",)

    def __init__(self, contents: Any = None, empty: bool = True) -> None:
        self.contents = _EMPTY if empty else contents

    @property
    def empty(self) -> bool:
        return self.contents is _EMPTY

    def _tcc_repr(self, r: ViewRepr, level: int) -> str:
        if self.empty:
            return "<empty cell>"
        return f"<cell {r.repr1(self.contents, level - 1)}>"


_EMPTY = object()


class ModuleView(View):
    """A module reference (cloudpickle ``subimport``); the module is not imported."""

    __slots__ = ("name",)

    def __init__(self, name: Any) -> None:
        self.name = str(name)

    def _tcc_repr(self, r: ViewRepr, level: int) -> str:
        return f"<module {self.name!r}>"


class StreamView(View):
    """One of the interpreter's standard streams (restored as the loader's own)."""

    __slots__ = ("name",)

    def __init__(self, name: Any) -> None:
        self.name = str(name)

    def _tcc_repr(self, r: ViewRepr, level: int) -> str:
        return f"<sys.{self.name}>"


class FrameView(View):
    """A suspended (or unstarted) generator/coroutine frame as stored.

    ``func`` is a :class:`Stub` class (captured by reference: module +
    qualname) or a :class:`FunctionView` (captured by value, with its code);
    ``record`` is ``(1, state, offset, slots, exc, name, qualname)``.
    """

    __slots__ = ("func", "fingerprint", "kind", "record", "live")

    # The values of :attr:`state`.
    CREATED, SUSPENDED, RUNNING, FINISHED = (
        _frames.CREATED, _frames.SUSPENDED, _frames.RUNNING, _frames.FINISHED)

    def __init__(self, func: Any, fingerprint_: Any, kind: Any) -> None:
        self.func = func
        self.fingerprint = fingerprint_ if isinstance(fingerprint_, bytes) else None
        self.kind = kind
        self.record: Any = None
        self.live: Any = None  # the generator, for frames read from live objects

    @property
    def by_reference(self) -> bool:
        return isinstance(self.func, StubMeta)

    @property
    def module(self) -> str | None:
        if isinstance(self.func, StubMeta):
            return self.func._tcc_module
        if isinstance(self.func, FunctionView):
            return self.func.module
        module = getattr(self.func, "__module__", None)
        return module if isinstance(module, str) else None

    @property
    def func_qualname(self) -> str:
        if isinstance(self.func, StubMeta):
            return self.func._tcc_qualname
        if isinstance(self.func, FunctionView):
            return self.func.qualname
        return str(getattr(self.func, "__qualname__", "?"))

    @property
    def captured_code(self) -> AnyCode | None:
        if isinstance(self.func, FunctionView):
            return self.func.code
        if self.live is None:  # a stub or view: never ask it for attributes
            return None
        code = getattr(self.func, "__code__", None)
        return code if isinstance(code, types.CodeType) else None

    def _field(self, index: int, default: Any) -> Any:
        rec = self.record
        if isinstance(rec, tuple) and len(rec) == 7:
            return rec[index]
        return default

    @property
    def state(self) -> int:
        value = self._field(1, -1)
        return value if isinstance(value, int) else -1

    @property
    def offset(self) -> int:
        value = self._field(2, -1)
        return value if isinstance(value, int) else -1

    @property
    def slots(self) -> tuple[Any, ...]:
        value = self._field(3, ())
        return value if isinstance(value, tuple) else ()

    @property
    def exc(self) -> Any:
        return self._field(4, UNBOUND)

    @property
    def name(self) -> str:
        value = self._field(5, None)
        return value if isinstance(value, str) else self.func_qualname.rpartition(".")[2]

    @property
    def qualname(self) -> str:
        value = self._field(6, None)
        return value if isinstance(value, str) else self.func_qualname

    def _tcc_repr(self, r: ViewRepr, level: int) -> str:
        what = "coroutine"
        code = self.captured_code
        if code is not None and not code.co_flags & 0x180:  # CO_COROUTINE | CO_ITERABLE_COROUTINE
            what = "generator"
        state = {0: " (not started)", 1: ""}.get(self.state, "")
        return f"<{what} {self.qualname}{state}>"


class FinishedView(View):
    """A generator/coroutine that had already finished when captured."""

    __slots__ = ("code", "name", "qualname")

    def __init__(self, code: Any, name: Any, qualname: Any) -> None:
        self.code = code
        self.name = str(name)
        self.qualname = str(qualname)

    def _tcc_repr(self, r: ViewRepr, level: int) -> str:
        return f"<finished {self.qualname}>"


def _live_frame(gen: Any) -> FrameView:
    """Read a live generator/coroutine into a FrameView (for --unsafe-repr)."""
    state, offset, slots, exc, func = _frames.native().read_frame(gen, _records.NULL)
    slots = tuple(UNBOUND if s is _records.NULL else s for s in slots)
    exc = UNBOUND if exc is _records.NULL else exc
    view = FrameView(func, fingerprint(_frames.code_of(gen)), 0)
    view.record = (1, state, offset, slots, exc, gen.__name__, gen.__qualname__)
    view.live = gen
    return view


def frame_view(obj: Any) -> FrameView | None:
    """``obj`` as a :class:`FrameView`: a view as it is, a live generator or coroutine
    read with the native ``read_frame`` (for ``--unsafe-repr``); None for anything else."""
    if isinstance(obj, FrameView):
        return obj
    if isinstance(obj, _frames.GENERATOR_TYPES) and _frames.available():
        return _live_frame(obj)
    return None


# ------------------------------------------------------------------- stubs


class StubMeta(type):
    """Metaclass of the stand-ins for globals the snapshot names."""

    _tcc_module: str
    _tcc_qualname: str

    def __repr__(cls) -> str:
        return _shown(cls)

    def _tcc_display(cls, r: ViewRepr) -> str:
        """``module.qualname`` as ``r`` names the module."""
        module = r.module_label(cls._tcc_module)
        return f"{module}.{cls._tcc_qualname}" if module else cls._tcc_qualname


class Stub(metaclass=StubMeta):
    """An instance of something the snapshot names but inspect never loads.

    Calling the stub class, ``NEWOBJ``, ``BUILD``/``__setstate__``,
    ``SETITEMS`` and ``APPENDS`` only record their arguments.
    """

    _tcc_module = ""
    _tcc_qualname = "Stub"
    # Set per instance by __new__ / __setstate__ (declarations only, no class values).
    _tcc_args: tuple[Any, ...]
    _tcc_kwargs: dict[str, Any]
    _tcc_state: Any
    _tcc_items: list[Any]

    def __new__(cls, *args: Any, **kwargs: Any) -> "Stub":
        self = object.__new__(cls)
        object.__setattr__(self, "_tcc_args", args)
        object.__setattr__(self, "_tcc_kwargs", kwargs)
        object.__setattr__(self, "_tcc_state", None)
        object.__setattr__(self, "_tcc_items", [])
        return self

    def __setstate__(self, state: Any) -> None:
        object.__setattr__(self, "_tcc_state", state)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._tcc_items.append((key, value))

    def append(self, value: Any) -> None:
        self._tcc_items.append(value)

    def extend(self, values: Any) -> None:
        self._tcc_items.extend(values)

    def __repr__(self) -> str:
        return _shown(self)

    # What the instance holds, for describing requests and rendering.
    def _tcc_attrs(self) -> dict[str, Any]:
        state = self._tcc_state
        out: dict[str, Any] = {}
        if isinstance(state, tuple) and len(state) == 2 and all(
            s is None or isinstance(s, dict) for s in state
        ):
            for part in state:
                out.update(part or {})
        elif isinstance(state, dict):
            out.update(state)
        inner = out.get("__dict__")
        if isinstance(inner, dict) and all(isinstance(k, str) and k.startswith("__") for k in out):
            # A __getstate__ that wraps the instance dict (pydantic models and
            # the like): show the fields, plus the extra fields if any.
            extra = out.get("__pydantic_extra__")
            out = dict(inner)
            if isinstance(extra, dict):
                out.update(extra)
        return {k: v for k, v in out.items() if isinstance(k, str)}

    def _tcc_repr(self, r: ViewRepr, level: int) -> str:
        cls = type(self)
        head = cls._tcc_display(r)
        if level <= 0:
            return f"<{head} ...>"
        shown_as = r.stub_display(self, level)  # a well-known type, shown like the real object
        if shown_as is not None:
            return shown_as
        members = getattr(cls, "_tcc_members", None)
        if isinstance(members, tuple) and len(self._tcc_args) == 1 and not self._tcc_kwargs:
            for member, value in members:  # a member of an enum captured by value
                if type(value) is type(self._tcc_args[0]) and value == self._tcc_args[0]:
                    return f"<{head}.{member}: {r.repr1(value, level - 1)}>"
        parts = [r.repr1(a, level - 1) for a in self._tcc_args[:3]]
        if len(self._tcc_args) > 3:
            parts.append("...")
        parts += [f"{k}={r.repr1(v, level - 1)}" for k, v in list(self._tcc_kwargs.items())[:2]]
        text = f"<{head}({', '.join(parts)})" if parts else f"<{head}"
        attrs = self._tcc_attrs()
        shown = [f"{k}={r.repr1(v, level - 1)}" for k, v in list(attrs.items())[:3]]
        if len(attrs) > 3:
            shown.append(f"+{len(attrs) - 3} more")
        if self._tcc_state is not None and not attrs:
            shown.append(f"state={r.repr1(self._tcc_state, level - 1)}")
        if self._tcc_items:
            shown.append(f"items={r.repr1(list(self._tcc_items[:4]), level - 1)}")
        if getattr(cls, "_tcc_unbuilt", False):
            why = getattr(cls, "_tcc_why", None)
            shown.append(f"(not rebuilt: {why})" if isinstance(why, str) else "(not rebuilt)")
        return text + (" " + " ".join(shown) if shown else "") + ">"


def stub_class(module: str, qualname: str, **extra: Any) -> StubMeta:
    name = qualname.rpartition(".")[2] or "stub"
    ns: dict[str, Any] = {"_tcc_module": module, "_tcc_qualname": qualname, "__slots__": ()}
    ns.update(extra)
    cls = StubMeta(name, (Stub,), ns)
    return cls


def stub_name(obj: Any) -> str | None:
    """'module.qualname' of a stub instance or stub class, else None."""
    cls = obj if isinstance(obj, StubMeta) else type(obj) if isinstance(type(obj), StubMeta) else None
    if cls is None:
        return None
    return f"{cls._tcc_module}.{cls._tcc_qualname}" if cls._tcc_module else cls._tcc_qualname


# ------------------------------------ values an allowlisted type refused to build


class AwareView(View):
    """A ``datetime``/``time`` whose ``tzinfo`` could not be rebuilt (a ``ZoneInfo``...)."""

    __slots__ = ("naive", "tzinfo")

    def __init__(self, naive: datetime.datetime | datetime.time, tzinfo: Any) -> None:
        self.naive = naive
        self.tzinfo = tzinfo

    def _tcc_repr(self, r: ViewRepr, level: int) -> str:
        return f"{repr(self.naive)[:-1]}, tzinfo={r.repr1(self.tzinfo, level - 1)})"


class DefaultDictView(View, dict):  # type: ignore[type-arg]
    """A ``defaultdict`` whose factory is not a real callable (a function view, ...)."""

    __slots__ = ("factory",)

    def __init__(self, factory: Any) -> None:
        super().__init__()
        self.factory = factory

    def _tcc_repr(self, r: ViewRepr, level: int) -> str:
        items = list(dict.items(self))
        return f"defaultdict({r.repr1(self.factory, level - 1)}, {r.repr_mapping(self, level, items)})"
