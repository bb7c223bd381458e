"""Read a snapshot without resuming it and without running user code.

:func:`safe_loads` unpickles a payload made by :func:`tcc.capture.dump_payload`
with a restricted unpickler.  Its ``find_class`` never imports a module that
is not already imported and never hands out a user callable: tcc's frame
reconstructors become *views* (:class:`FrameView`, :class:`CellView`, ...),
cloudpickle's function and class rebuilders become views that keep names, and
a code object becomes a :class:`CodeView` -- never a real code object, which
CPython would build from bytecode it trusts.  A short allowlist of inert
standard types builds real values, through checks that bound the work and
memory a call may ask for (:class:`AllowedType`), and every other global
becomes a :class:`Stub` class that, when called, reconstructed or given
state, just records what it was given.  Nothing in the pickle can reach a
``__reduce__``/``__setstate__``/``__repr__`` of a user class.

An allowlisted type can refuse what it is given once parts of it became
stubs (a ``datetime`` whose ``tzinfo`` is a ``ZoneInfo``, a ``defaultdict``
whose factory is a lambda).  That is not damage: the payload is then read
again by :class:`TolerantUnpickler`, the same restrictions in pure Python,
where such a value becomes a view (:class:`AwareView`,
:class:`DefaultDictView`) or a stub marked "not rebuilt" that carries the
type's name and arguments.  Only data neither can read (truncated, malformed)
makes :func:`safe_loads` raise.  Stubs of some well-known types (``ZoneInfo``,
``pathlib`` paths, compiled patterns, numpy arrays, dtypes and scalars) are
rendered like the real object, from their recorded arguments, with stdlib code
only; numpy is never imported.

:func:`describe` turns the root of a run state (the root coroutine) into a
list of :class:`FrameInfo`, outermost first, following the await chain
through the value stacks, with lines mapped from the stored instruction
offsets (decoded from the stored line table, :func:`code_line`) and locals
rendered by :func:`safe_repr`.  Code of functions captured *by reference* is
found by compiling the current source file (compiling executes nothing) and
is compared with the stored fingerprint.  Source lines are read only from
module files found by import rules and from the files the caller says belong
to the run: a snapshot names its code's file, and must not make inspect print
another one.

Live generators (from :func:`tcc.capture.loads`, for ``--unsafe-repr``) are
accepted by :func:`describe` too; they are read with the native
``read_frame`` and rendered with real reprs.
"""

from __future__ import annotations

import builtins
import collections
import dataclasses
import datetime
import decimal
import fractions
import io
import linecache
import os
import pathlib
import pickle
import re
import reprlib
import struct
import sys
import tokenize
import types
import uuid
from typing import Any, Callable, ClassVar, Iterator

from . import _frames
from ._api import _deep_recursion
from ._fingerprint import fingerprint

# ---------------------------------------------------------------- the views


class View:
    """Base of everything the restricted unpickler builds instead of live objects."""

    __slots__ = ()

    def _tcc_repr(self, r: "_SafeRepr", level: int) -> str:  # pragma: no cover - overridden
        return f"<{type(self).__name__}>"

    def __repr__(self) -> str:
        return self._tcc_repr(_SafeRepr(), 3)


class _Unbound(View):
    """A C NULL in a frame slot: an unbound local (or a method-call marker)."""

    __slots__ = ()

    def _tcc_repr(self, r: "_SafeRepr", level: int) -> str:
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
    trusts the bytecode it is given (a crafted one made ``CodeType(...).replace()``
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

    def _tcc_repr(self, r: "_SafeRepr", level: int) -> str:
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

    def _tcc_repr(self, r: "_SafeRepr", level: int) -> str:
        return f"<function {self.qualname}>"


class CellView(View):
    """A closure cell; ``contents`` is ``EMPTY`` when the cell is empty."""

    __slots__ = ("contents",)

    def __init__(self, contents: Any = None, empty: bool = True) -> None:
        self.contents = _EMPTY if empty else contents

    def _tcc_repr(self, r: "_SafeRepr", level: int) -> str:
        if self.contents is _EMPTY:
            return "<empty cell>"
        return f"<cell {r.repr1(self.contents, level - 1)}>"


_EMPTY = object()


class ModuleView(View):
    """A module reference (cloudpickle ``subimport``); the module is not imported."""

    __slots__ = ("name",)

    def __init__(self, name: Any) -> None:
        self.name = str(name)

    def _tcc_repr(self, r: "_SafeRepr", level: int) -> str:
        return f"<module {self.name!r}>"


class StreamView(View):
    """One of the interpreter's standard streams (restored as the loader's own)."""

    __slots__ = ("name",)

    def __init__(self, name: Any) -> None:
        self.name = str(name)

    def _tcc_repr(self, r: "_SafeRepr", level: int) -> str:
        return f"<sys.{self.name}>"


class FrameView(View):
    """A suspended (or unstarted) generator/coroutine frame as stored.

    ``func`` is a :class:`Stub` class (captured by reference: module +
    qualname) or a :class:`FunctionView` (captured by value, with its code);
    ``record`` is ``(1, state, offset, slots, exc, name, qualname)``.
    """

    __slots__ = ("func", "fingerprint", "kind", "record", "live")

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

    def _tcc_repr(self, r: "_SafeRepr", level: int) -> str:
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

    def _tcc_repr(self, r: "_SafeRepr", level: int) -> str:
        return f"<finished {self.qualname}>"


# ------------------------------------------------------------------- stubs

_SCRIPT_MODULE = re.compile(r"^__tcc_script_(.+?)(?:_[0-9a-f]{8})?$")


def display_module(module: str | None) -> str:
    """``__tcc_script_agent`` (or ``..._1a2b3c4d``) -> ``agent``; others unchanged."""
    if not module:
        return ""
    m = _SCRIPT_MODULE.match(module)
    return m.group(1) if m else module


class StubMeta(type):
    """Metaclass of the stand-ins for globals the snapshot names."""

    _tcc_module: str
    _tcc_qualname: str

    def __repr__(cls) -> str:
        return f"<class {cls._tcc_display()}>"

    def _tcc_display(cls) -> str:
        module = display_module(cls._tcc_module)
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
        return _SafeRepr().repr1(self, 3)

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

    def _tcc_repr(self, r: "_SafeRepr", level: int) -> str:
        cls = type(self)
        head = cls._tcc_display()
        if level <= 0:
            return f"<{head} ...>"
        known = _STUB_DISPLAYS.get(_display_key(cls))
        if known is not None:
            shown_as = known(self, r, level)
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


_TOO_LARGE_UUID = stub_class("uuid", "UUID", _tcc_unbuilt=True, _tcc_why="too large")


def stub_name(obj: Any) -> str | None:
    """'module.qualname' of a stub instance or stub class, else None."""
    cls = obj if isinstance(obj, StubMeta) else type(obj) if isinstance(type(obj), StubMeta) else None
    if cls is None:
        return None
    return f"{cls._tcc_module}.{cls._tcc_qualname}" if cls._tcc_module else cls._tcc_qualname


# -------------------------------------------------------- stand-in builders


def _new_generator(func: Any, expected: Any = None, kind: Any = 0) -> FrameView:
    return FrameView(func, expected, kind)


def _fill_generator(gen: Any, record: Any) -> None:
    if isinstance(gen, FrameView):
        gen.record = record


def _finished_generator(code: Any, name: Any, qualname: Any) -> FinishedView:
    return FinishedView(code, name, qualname)


def _no_traceback(*_args: Any) -> None:
    return None


def _make_code(args: Any, filename: Any) -> CodeView:
    # Never types.CodeType(*args): CPython trusts the bytecode a code object is
    # built from, so a crafted one corrupts memory (see CodeView).
    return CodeView(args, filename)


def _empty_cell(*_args: Any) -> CellView:
    return CellView()


def _fill_cell(cell: Any, state: Any) -> None:
    if isinstance(cell, CellView) and isinstance(state, tuple) and state:
        cell.contents = state[0]


def _make_exception(cls: Any, args: Any = ()) -> Any:
    args = tuple(args) if isinstance(args, tuple) else (args,)
    if _is_builtin_exception(cls):
        try:
            exc = cls.__new__(cls, *args)
            exc.args = args
            return exc
        except Exception:  # noqa: BLE001 - odd arguments: fall back to a stub
            pass
    if isinstance(cls, StubMeta):
        return cls(*args)
    return stub_class("", _class_label(cls))(*args)


def _fill_exception(exc: Any, state: Any) -> None:
    try:
        own, cause, context, suppress = state
    except (TypeError, ValueError):
        return
    if isinstance(exc, BaseException):
        if isinstance(own, dict):
            exc.__dict__.update(own)
        for attr, value in (("__cause__", cause), ("__context__", context)):
            if value is None or isinstance(value, BaseException):
                setattr(exc, attr, value)
            else:
                exc.__dict__["_tcc" + attr.strip("_")] = value
        exc.__suppress_context__ = bool(suppress)
    elif isinstance(exc, Stub):
        exc.__setstate__(own)


def _function_behind_wrappers(module: Any, qualname: Any, steps: Any, code_qualname: Any) -> StubMeta:
    # A by-reference function (a decorated one): named by its code's qualname,
    # which is what the module source defines.
    name = code_qualname if isinstance(code_qualname, str) else str(qualname)
    return stub_class(str(module), name)


def _module_function(code: Any, module: Any, closure: Any = None) -> "FunctionView":
    name = code.co_name if isinstance(code, CodeView) else None
    return FunctionView(code, {"__name__": module}, name, None, closure)


def _standard_stream(name: Any) -> StreamView:
    return StreamView(name)


_RECORDS: dict[str, Any] = {
    "function_behind_wrappers": _function_behind_wrappers,
    "module_function": _module_function,
    "fill_function": lambda obj, state: _cp_function_setstate(obj, state),
    "standard_stream": _standard_stream,
    "new_generator": _new_generator,
    "fill_generator": _fill_generator,
    "finished_generator": _finished_generator,
    "no_traceback": _no_traceback,
    "make_code": _make_code,
    "empty_cell": _empty_cell,
    "fill_cell": _fill_cell,
    "fill_exception": _fill_exception,
    "make_exception": _make_exception,
    "NULL": UNBOUND,
}


def _cp_make_function(code: Any, globals_: Any, name: Any, argdefs: Any = None, closure: Any = None) -> FunctionView:
    return FunctionView(code, globals_, name, argdefs, closure)


def _cp_function_setstate(obj: Any, state: Any) -> None:
    if not isinstance(obj, FunctionView):
        return
    try:
        _state, slotstate = state
    except (TypeError, ValueError):
        return
    if isinstance(slotstate, dict):
        if isinstance(slotstate.get("__qualname__"), str):
            obj.qualname = slotstate["__qualname__"]
        if isinstance(slotstate.get("__module__"), str):
            obj.module = slotstate["__module__"]
        if isinstance(slotstate.get("__defaults__"), tuple):
            obj.defaults = slotstate["__defaults__"]


def _cp_make_empty_cell(*_args: Any) -> CellView:
    return CellView()


_NO_VALUE = object()


def _cp_make_cell(value: Any = _NO_VALUE) -> CellView:
    return CellView() if value is _NO_VALUE else CellView(value, empty=False)


def _cp_make_skeleton_class(*args: Any) -> StubMeta:
    strings = [a for a in args if isinstance(a, str)]
    kwargs = next((a for a in args if isinstance(a, dict)), {})
    name = strings[0] if strings else "?"
    qualname = qn if isinstance(qn := kwargs.get("__qualname__"), str) else name
    module = mod if isinstance(mod := kwargs.get("__module__"), str) else ""
    return stub_class(module, qualname, _tcc_by_value=True)


def _cp_make_skeleton_enum(*args: Any) -> StubMeta:
    strings = [a for a in args if isinstance(a, str)]
    name, qualname, module = (strings + ["?", "?", ""])[:3]
    members = next((a for a in args if isinstance(a, dict)), {})
    pairs = tuple((k, v) for k, v in members.items() if isinstance(k, str))
    return stub_class(module, qualname, _tcc_by_value=True, _tcc_members=pairs)


def _cp_class_setstate(obj: Any, state: Any) -> Any:
    if isinstance(obj, StubMeta):
        try:
            clsdict = state[0]
        except (TypeError, IndexError, KeyError):
            return obj
        if isinstance(clsdict, dict):
            if isinstance(clsdict.get("__module__"), str):
                type.__setattr__(obj, "_tcc_module", clsdict["__module__"])
            if isinstance(clsdict.get("__qualname__"), str):
                type.__setattr__(obj, "_tcc_qualname", clsdict["__qualname__"])
    return obj


def _cp_subimport(name: Any, *_args: Any) -> ModuleView:
    return ModuleView(name)


def _cp_builtin_type(name: Any) -> StubMeta:
    return stub_class("types", str(name))


_CLOUDPICKLE: dict[str, Any] = {
    "_make_function": _cp_make_function,
    "_function_setstate": _cp_function_setstate,
    "_make_empty_cell": _cp_make_empty_cell,
    "_make_cell": _cp_make_cell,
    "_make_skeleton_class": _cp_make_skeleton_class,
    "_make_skeleton_enum": _cp_make_skeleton_enum,
    "_class_setstate": _cp_class_setstate,
    "subimport": _cp_subimport,
    "dynamic_subimport": _cp_subimport,
    "_builtin_type": _cp_builtin_type,
}

# Types whose construction, state and repr run no user code.
_SAFE_BUILTINS = {
    name: getattr(builtins, name)
    for name in (
        "list", "dict", "set", "frozenset", "tuple", "int", "float", "complex", "str",
        "bytes", "bytearray", "bool", "slice", "range", "object",
    )
}
_SAFE_TYPES: frozenset[type] = frozenset(
    list(_SAFE_BUILTINS.values())
    + [
        type(None), collections.OrderedDict, collections.deque, collections.defaultdict,
        collections.Counter, datetime.datetime, datetime.date, datetime.time,
        datetime.timedelta, datetime.timezone, decimal.Decimal, fractions.Fraction, uuid.UUID,
    ]
)
_SAFE_GLOBALS: dict[tuple[str, str], Any] = {
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


def _is_safe_class(cls: Any) -> bool:
    return isinstance(cls, StubMeta) or _is_allowed(cls) or _is_builtin_exception(cls)


def _is_builtin_exception(cls: Any) -> bool:
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
#   them): they are handed out as they are (_CONSTANT_COST).
#
# copyreg's ``__newobj__``/``_reconstructor`` and the NEWOBJ opcodes go through
# the same checks.  Opcodes alone (no call) build only what the pickle spells
# out, so their memory is bounded by the payload's size.  (A UUID is pickled
# with NEWOBJ, which the C unpickler applies only to a real class: it gets
# :class:`_CheckedUUID`, a class whose call is checked and whose ``__new__``
# makes a plain UUID.)

_MAX_TEXT = 10_000  # characters of a number written out (int, float, complex, Decimal, Fraction)
_MAX_INT_BITS = 40_000  # ~12,000 decimal digits
_MAX_EXPONENT = 10_000  # Fraction('1e-N') and Fraction(Decimal('1e-N')) compute 10**N
_MAX_SCALAR_TEXT = 1_000  # a str or bytes argument of a constant-size type (a timezone name...)
_BUDGET_FLOOR = 64 << 20  # bytes the calls of one load may build, at least ...
_BUDGET_RATIO = 16  # ... or this many times the size of the payload
_TOO_LARGE = "too large"
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
_CONSTANT_COST: frozenset[Any] = frozenset({
    object, bool, slice, range, datetime.datetime, datetime.date, datetime.time,
    datetime.timedelta, datetime.timezone,
})


class _Refused(Exception):
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

    def __init__(self, cls: type, globals_: "_Globals") -> None:
        self.cls = cls
        self._globals = globals_

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._globals.build(self.cls, args, kwargs, new=False)

    def new(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``cls.__new__(cls, *args, **kwargs)``, checked: what NEWOBJ and ``__newobj__`` do."""
        return self._globals.build(self.cls, args, kwargs, new=True)

    def _tcc_repr(self, r: "_SafeRepr", level: int) -> str:
        return f"<class {_class_label(self.cls).removeprefix('builtins.')}>"


class _UUIDType(type):
    """Metaclass of :class:`_CheckedUUID`: calling it checks the arguments first."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        try:
            _cost(uuid.UUID, args, kwargs)  # TypeError for arguments of another kind
        except _Refused:
            return _TOO_LARGE_UUID(*args, **{str(k): v for k, v in kwargs.items()})
        return uuid.UUID(*args, **kwargs)

    def __repr__(cls) -> str:
        return "<class uuid.UUID>"


class _CheckedUUID(uuid.UUID, metaclass=_UUIDType):
    """What the loader hands out for ``uuid.UUID``: NEWOBJ (how a UUID is pickled) makes a
    plain, empty UUID that BUILD then fills; a call goes through the checks."""

    __slots__ = ()

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        return object.__new__(uuid.UUID)


def _real(cls: Any) -> Any:
    """The type an :class:`AllowedType` (or :class:`_CheckedUUID`) stands for (anything
    else as it is)."""
    if cls is _CheckedUUID:
        return uuid.UUID
    return cls.cls if isinstance(cls, AllowedType) else cls


def _is_allowed(cls: Any) -> bool:
    """Whether ``cls`` is what the loader hands out for an allowlisted type."""
    return isinstance(cls, AllowedType) or cls is _CheckedUUID or cls in _CONSTANT_COST


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
    return TypeError(f"{_class_label(cls)} is not rebuilt from a {type(value).__name__} "
                     "argument when inspecting")


def _check_int(value: Any, limit: int = _MAX_INT_BITS) -> None:
    if isinstance(value, int) and abs(value).bit_length() > limit:
        raise _Refused(_TOO_LARGE)


def _check_text(value: Any, limit: int = _MAX_TEXT) -> None:
    if isinstance(value, (str, bytes, bytearray)) and len(value) > limit:
        raise _Refused(_TOO_LARGE)


def _check_codec(cls: type, encoding: Any, errors: Any) -> None:
    if not isinstance(encoding, str) or encoding.lower() not in _CODECS:
        raise TypeError(f"{_class_label(cls)} with the codec {encoding!r} is not rebuilt when "
                        "inspecting (looking a codec up imports it)")
    if errors is not None and errors not in _CODEC_ERRORS:
        raise TypeError(f"{_class_label(cls)} with errors={errors!r} is not rebuilt when inspecting")


def _check_decimal(value: decimal.Decimal) -> None:
    _sign, digits, exponent = value.as_tuple()
    if len(digits) > _MAX_TEXT or (isinstance(exponent, int) and abs(exponent) > _MAX_EXPONENT):
        raise _Refused(_TOO_LARGE)


def _fraction_part(value: Any) -> None:
    if isinstance(value, (bool, float)) or value is None:
        return
    if isinstance(value, int):
        return _check_int(value)
    if isinstance(value, str):
        _check_text(value)
        for exponent in _EXPONENT.findall(value):
            if len(exponent) > 8 or abs(int(exponent)) > _MAX_EXPONENT:
                raise _Refused(_TOO_LARGE)
        return
    if isinstance(value, decimal.Decimal):
        return _check_decimal(value)
    if isinstance(value, fractions.Fraction):
        _check_int(value.numerator)
        return _check_int(value.denominator)
    raise _kind_error(fractions.Fraction, value)


def _cost(cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """Bytes of memory calling ``cls(*args, **kwargs)`` builds (an estimate), after checking
    that the arguments are of a kind whose cost is known.  _Refused past a per-call
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
                    raise _Refused(_TOO_LARGE)
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


class _Globals:
    """What the restricted unpicklers hand out for the globals a pickle names.

    Shared by :class:`SafeUnpickler` (the C unpickler, fast) and
    :class:`TolerantUnpickler` (the pure-Python one, which survives values
    that cannot be rebuilt).  ``budget`` bounds the bytes that calls of
    allowlisted types may build during one load (see :class:`AllowedType`).
    """

    def __init__(self, budget: int = _BUDGET_FLOOR) -> None:
        self._stubs: dict[tuple[str, str, bool, str | None], StubMeta] = {}
        self._allowed: dict[type, AllowedType] = {}
        self.budget = budget
        self.spent = 0

    def stub(self, module: str, qualname: str, *, unbuilt: bool = False, why: str | None = None) -> StubMeta:
        key = (module, qualname, unbuilt, why)
        cls = self._stubs.get(key)
        if cls is None:
            extra: dict[str, Any] = {"_tcc_unbuilt": True} if unbuilt else {}
            if why is not None:
                extra["_tcc_why"] = why
            cls = self._stubs[key] = stub_class(module, qualname, **extra)
        return cls

    def unbuilt(self, func: Any, why: str | None = None) -> StubMeta:
        """The stub standing for what calling ``func`` (a real class...) failed to build."""
        func = _real(func)
        name = stub_name(func)
        if name is None and isinstance(func, (type, types.FunctionType, types.BuiltinFunctionType)):
            module = getattr(func, "__module__", None)
            qualname = getattr(func, "__qualname__", None)
            if isinstance(module, str) and isinstance(qualname, str):
                return self.stub("" if module == "builtins" else module, qualname, unbuilt=True, why=why)
        return self.stub("", name or _class_label(func), unbuilt=True, why=why)

    def allowed(self, cls: type) -> Any:
        """What the pickle gets for the allowlisted type ``cls``: ``cls`` itself if calling it
        costs the same whatever the arguments, else its :class:`AllowedType`."""
        if cls in _CONSTANT_COST:
            return cls
        if cls is uuid.UUID:
            return _CheckedUUID
        got = self._allowed.get(cls)
        if got is None:
            got = self._allowed[cls] = AllowedType(cls, self)
        return got

    def check(self, cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        """Why ``cls(*args, **kwargs)`` is not built (None: it is, and its cost is charged).

        TypeError for arguments of a kind ``cls`` is not rebuilt from."""
        try:
            cost = _cost(cls, args, kwargs)
        except _Refused as exc:
            return str(exc)
        if self.spent + cost > self.budget:
            return _TOO_LARGE
        self.spent += cost
        return None

    def build(self, cls: type, args: tuple[Any, ...], kwargs: dict[str, Any], *, new: bool) -> Any:
        why = self.check(cls, args, kwargs)
        if why is not None:
            return self.unbuilt(cls, why)(*args, **{str(k): v for k, v in kwargs.items()})
        if new:
            return cls.__new__(cls, *args, **kwargs)
        return cls(*args, **kwargs)

    def find_class(self, module: str, name: str) -> Any:
        if module == "tcc.capture._records" and name in _RECORDS:
            return _RECORDS[name]
        if module in ("cloudpickle.cloudpickle", "cloudpickle.cloudpickle_fast", "cloudpickle"):
            if name in _CLOUDPICKLE:
                return _CLOUDPICKLE[name]
        if module in ("builtins", "__builtin__"):
            if name in _SAFE_BUILTINS:
                return self.allowed(_SAFE_BUILTINS[name])
            if name == "getattr":
                return self._getattr
            obj = getattr(builtins, name, None) if name.isidentifier() else None
            if _is_builtin_exception(obj):
                return obj
        if module == "copyreg":
            if name == "_reconstructor":
                return self._reconstructor
            if name == "__newobj__":
                return self._newobj
            if name == "__newobj_ex__":
                return self._newobj_ex
        if (module, name) in _SAFE_GLOBALS:
            return self.allowed(_SAFE_GLOBALS[(module, name)])
        return self.stub(module, name)

    # copyreg / builtins stand-ins --------------------------------------------

    def _getattr(self, obj: Any, name: Any, *default: Any) -> Any:
        name = str(name)
        if isinstance(obj, StubMeta):
            return self.stub(obj._tcc_module, f"{obj._tcc_qualname}.{name}")
        if isinstance(obj, ModuleView):
            return self.stub(obj.name, name)
        if isinstance(obj, AllowedType):
            return self.stub("", f"{_class_label(obj.cls).removeprefix('builtins.')}.{name}")
        owner = stub_name(obj) or type(obj).__name__
        return self.stub("", f"{owner}.{name}")

    def _construct(self, cls: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if isinstance(cls, AllowedType):
            return cls.new(args, kwargs)
        if _is_safe_class(cls):
            try:
                return cls.__new__(cls, *args, **kwargs)
            except Exception:  # noqa: BLE001 - odd arguments: fall back to a stub
                pass
        return self.stub("", f"{_class_label(cls)}")(*args, **kwargs)

    def _newobj(self, cls: Any, *args: Any) -> Any:
        return self._construct(cls, args, {})

    def _newobj_ex(self, cls: Any, args: Any, kwargs: Any) -> Any:
        return self._construct(cls, tuple(args or ()), dict(kwargs or {}))

    def _reconstructor(self, cls: Any, base: Any, state: Any) -> Any:
        if isinstance(cls, StubMeta):
            assert issubclass(cls, Stub)  # every StubMeta class is Stub or a stub_class()
            obj = cls.__new__(cls)
            if state is not None:
                obj.__setstate__({"<base state>": state})
            return obj
        real_cls, real_base = _real(cls), _real(base)
        if _is_allowed(cls) and _is_allowed(base):
            import copyreg

            if isinstance(base, AllowedType):  # base.__new__(cls, state), base.__init__(obj, state)
                why = self.check(real_base, (state,), {})
                if why is not None:
                    return self.unbuilt(cls, why)(state)
            return copyreg._reconstructor(real_cls, real_base, state)  # type: ignore[attr-defined]
        return self.stub("", _class_label(cls))(state)


class SafeUnpickler(pickle.Unpickler):
    """An unpickler that builds views and stubs instead of live user objects.

    It is the C unpickler: a value that an allowlisted type refuses to be
    rebuilt from (a ``datetime`` whose ``tzinfo`` became a stub...) makes
    :meth:`load` raise; :func:`safe_loads` then reads the payload again with
    :class:`TolerantUnpickler`.
    """

    def __init__(self, file: Any, budget: int = _BUDGET_FLOOR) -> None:
        super().__init__(file)
        self.globals = _Globals(budget)

    def stub(self, module: str, qualname: str) -> StubMeta:
        return self.globals.stub(module, qualname)

    def find_class(self, module: str, name: str) -> Any:
        return self.globals.find_class(module, name)


class TolerantUnpickler(pickle._Unpickler):
    """The restricted unpickler in pure Python, where a value that cannot be
    rebuilt becomes a named stub instead of an error.

    Its ``find_class`` is :class:`SafeUnpickler`'s, so it hands out exactly the
    same callables; only the opcodes that *apply* them (``REDUCE``,
    ``NEWOBJ``, ``BUILD``, ``APPENDS``, ``SETITEMS``...) are wrapped: when an
    allowlisted type refuses its arguments (a ``datetime`` given a stub
    ``tzinfo``, a ``defaultdict`` given a function view as its factory), the
    result is a view or a ``(not rebuilt)`` stub carrying the type's name and
    the arguments.  Malformed data (unknown opcodes, truncation, a stack
    underflow) still raises.
    """

    dispatch: ClassVar[dict[int, Callable[[Any], None]]] = dict(pickle._Unpickler.dispatch)
    # Set by pickle._Unpickler.load (not in its stubs).
    stack: list[Any]
    metastack: list[list[Any]]
    memo: dict[int, Any]

    def __init__(self, file: Any, budget: int = _BUDGET_FLOOR) -> None:
        super().__init__(file)
        self.globals = _Globals(budget)

    def stub(self, module: str, qualname: str) -> StubMeta:
        return self.globals.stub(module, qualname)

    def find_class(self, module: str, name: str) -> Any:
        return self.globals.find_class(module, name)

    # applying what find_class handed out ----------------------------------------

    def call(self, func: Any, args: Any, kwargs: Any) -> Any:
        """``func(*args, **kwargs)``, or what stands for it if that fails."""
        if not isinstance(args, tuple) or not isinstance(kwargs, dict):
            raise pickle.UnpicklingError(f"malformed arguments for {_class_label(func)}")
        try:
            return func(*args, **kwargs)
        except Exception:  # noqa: BLE001 - not rebuilt: keep what it was given
            return self.not_rebuilt(func, args, kwargs)

    def not_rebuilt(self, func: Any, args: tuple[Any, ...], kwargs: dict[Any, Any]) -> Any:
        real = _real(func)
        fallback = _REBUILD_FALLBACKS.get(real) if type(real) is type else None
        if fallback is not None and not kwargs:
            view = fallback(args)
            if view is not None:
                return view
        named = {str(k): v for k, v in kwargs.items()}
        return self.globals.unbuilt(func)(*args, **named)

    def replace(self, old: Any, new: Any) -> None:
        """Put ``new`` where ``old`` is: on top of the stack and in the memo."""
        self.stack[-1] = new
        for key, value in self.memo.items():
            if value is old:
                self.memo[key] = new

    def _load_reduce(self) -> None:
        stack = self.stack
        args = stack.pop()
        func = stack[-1]
        stack[-1] = self.call(func, args, {})

    def _new(self, cls: Any, args: Any, kwargs: Any) -> None:
        if not isinstance(cls, (type, AllowedType)):
            raise pickle.UnpicklingError("NEWOBJ class argument isn't a type object")
        if not isinstance(args, tuple) or not isinstance(kwargs, dict):
            raise pickle.UnpicklingError(f"malformed arguments for {_class_label(cls)}")
        try:
            if isinstance(cls, AllowedType):
                obj: Any = cls.new(args, kwargs)
            else:
                obj = cls.__new__(cls, *args, **kwargs)
        except Exception:  # noqa: BLE001 - not rebuilt: keep what it was given
            obj = self.not_rebuilt(cls, args, kwargs)
        self.stack.append(obj)

    def _load_newobj(self) -> None:
        args = self.stack.pop()
        cls = self.stack.pop()
        self._new(cls, args, {})

    def _load_newobj_ex(self) -> None:
        kwargs = self.stack.pop()
        args = self.stack.pop()
        cls = self.stack.pop()
        self._new(cls, args, kwargs)

    def _instantiate(self, klass: Any, args: Any) -> None:  # INST and OBJ (protocols 0 and 1)
        self.stack.append(self.call(klass, tuple(args), {}))

    def _apply(self, opcode: bytes, target: Any, consumed: list[Any]) -> None:
        """Run the base handler of ``opcode`` on ``target``; if the target
        refuses, it becomes a ``(not rebuilt)`` stub holding what it was given."""
        try:
            pickle._Unpickler.dispatch[opcode[0]](self)  # type: ignore[arg-type]
        except Exception:  # noqa: BLE001 - the target refused what the pickle gives it
            if not self.stack or self.stack[-1] is not target:
                raise
            stub = self.globals.unbuilt(type(target))()
            if opcode == pickle.BUILD:
                stub.__setstate__(consumed[0])
            elif opcode in (pickle.SETITEM, pickle.SETITEMS):
                for i in range(0, len(consumed) - 1, 2):
                    stub[consumed[i]] = consumed[i + 1]
            else:
                stub.extend(consumed)
            self.replace(target, stub)

    def _apply_top(self, opcode: bytes, consumes: int) -> None:
        if len(self.stack) <= consumes:
            raise pickle.UnpicklingError(f"stack underflow at {opcode!r}")
        self._apply(opcode, self.stack[-consumes - 1], self.stack[-consumes:])

    def _apply_marked(self, opcode: bytes) -> None:
        if not self.metastack or not self.metastack[-1]:
            raise pickle.UnpicklingError(f"no MARK or no target for {opcode!r}")
        self._apply(opcode, self.metastack[-1][-1], list(self.stack))

    def _load_build(self) -> None:
        self._apply_top(pickle.BUILD, 1)

    def _load_append(self) -> None:
        self._apply_top(pickle.APPEND, 1)

    def _load_setitem(self) -> None:
        self._apply_top(pickle.SETITEM, 2)

    def _load_appends(self) -> None:
        self._apply_marked(pickle.APPENDS)

    def _load_setitems(self) -> None:
        self._apply_marked(pickle.SETITEMS)

    def _load_additems(self) -> None:
        self._apply_marked(pickle.ADDITEMS)

    dispatch[pickle.REDUCE[0]] = _load_reduce
    dispatch[pickle.NEWOBJ[0]] = _load_newobj
    dispatch[pickle.NEWOBJ_EX[0]] = _load_newobj_ex
    dispatch[pickle.BUILD[0]] = _load_build
    dispatch[pickle.APPEND[0]] = _load_append
    dispatch[pickle.APPENDS[0]] = _load_appends
    dispatch[pickle.SETITEM[0]] = _load_setitem
    dispatch[pickle.SETITEMS[0]] = _load_setitems
    dispatch[pickle.ADDITEMS[0]] = _load_additems


class AwareView(View):
    """A ``datetime``/``time`` whose ``tzinfo`` could not be rebuilt (a ``ZoneInfo``...)."""

    __slots__ = ("naive", "tzinfo")

    def __init__(self, naive: datetime.datetime | datetime.time, tzinfo: Any) -> None:
        self.naive = naive
        self.tzinfo = tzinfo

    def _tcc_repr(self, r: "_SafeRepr", level: int) -> str:
        return f"{repr(self.naive)[:-1]}, tzinfo={r.repr1(self.tzinfo, level - 1)})"


class DefaultDictView(View, dict):  # type: ignore[type-arg]
    """A ``defaultdict`` whose factory is not a real callable (a function view, ...)."""

    __slots__ = ("factory",)

    def __init__(self, factory: Any) -> None:
        super().__init__()
        self.factory = factory

    def _tcc_repr(self, r: "_SafeRepr", level: int) -> str:
        items = list(dict.items(self))
        return f"defaultdict({r.repr1(self.factory, level - 1)}, {r.repr_mapping(self, level, items)})"


def _aware(cls: Any) -> Callable[[tuple[Any, ...]], Any]:
    def rebuild(args: tuple[Any, ...]) -> Any:
        if len(args) == 2 and isinstance(args[0], (bytes, str)):
            try:
                return AwareView(cls(args[0]), args[1])
            except Exception:  # noqa: BLE001 - not even the naive value: a stub
                return None
        return None

    return rebuild


def _inert_defaultdict(args: tuple[Any, ...]) -> Any:
    return DefaultDictView(args[0]) if len(args) == 1 else None


# What a value an allowlisted type refused its arguments becomes instead.
_REBUILD_FALLBACKS: dict[type, Callable[[tuple[Any, ...]], Any]] = {
    datetime.datetime: _aware(datetime.datetime),
    datetime.time: _aware(datetime.time),
    collections.defaultdict: _inert_defaultdict,
}


def _class_label(cls: Any) -> str:
    cls = _real(cls)
    name = stub_name(cls)
    if name is not None:
        return name
    if isinstance(cls, type):
        return f"{cls.__module__}.{cls.__qualname__}"
    return f"<{type(cls).__name__}>"


def safe_loads(payload: bytes) -> Any:
    """Unpickle a snapshot payload into views, running no user code.

    The fast C unpickler reads it first; if it fails (an allowlisted type
    refusing a stub or a view as an argument), the pure-Python
    :class:`TolerantUnpickler` reads it again, turning such values into
    named stubs.  Only what that one cannot read either (truncated or
    malformed data) raises.
    """
    budget = max(_BUDGET_FLOOR, _BUDGET_RATIO * len(payload))
    with _deep_recursion():
        try:
            return SafeUnpickler(io.BytesIO(payload), budget).load()
        except Exception:  # noqa: BLE001 - retried below, which raises if it is damage
            pass
        return TolerantUnpickler(io.BytesIO(payload), budget).load()


# ---------------------------------------------------------------- reprs

_REPR_LIMIT = 80
_SHOWN_INT_BITS = 14_000  # ints past this many bits are shown by size (CPython refuses ~14,300)


class _SafeRepr(reprlib.Repr):
    """reprlib with views rendered by tcc and unknown types never asked."""

    def __init__(self, *, unsafe: bool = False) -> None:
        super().__init__()
        self.unsafe = unsafe
        self.maxlevel = 3
        self.maxtuple = self.maxlist = self.maxarray = self.maxdeque = 6
        self.maxdict = 5
        self.maxset = self.maxfrozenset = 6
        self.maxstring = 60
        self.maxlong = 40
        self.maxother = 60

    def repr1(self, x: Any, level: int) -> str:
        if isinstance(x, (View, Stub)):
            return x._tcc_repr(self, level)
        if isinstance(x, (StubMeta, _UUIDType)):
            return repr(x)
        if self.unsafe:
            try:
                return super().repr1(x, level)
            except Exception as exc:  # noqa: BLE001 - a user __repr__ failed
                return f"<{type(x).__qualname__} object; repr failed: {type(exc).__name__}>"
        t = type(x)
        if t in _SAFE_TYPES or _is_builtin_exception(t) or t in (types.CodeType,):
            try:
                return self._safe_type(x, level)
            except Exception as exc:  # noqa: BLE001 - odd contents: name the type
                return f"<{_class_label(t).removeprefix('builtins.')} object; repr failed: {type(exc).__name__}>"
        if isinstance(x, types.CodeType):
            return f"<code {x.co_qualname}>"
        if t is type:  # a real class: only allowlisted ones get here
            return f"<class {_class_label(x).removeprefix('builtins.')}>"
        return f"<{t.__module__}.{t.__qualname__} object>"

    def _safe_type(self, x: Any, level: int) -> str:
        """The repr of an allowlisted type's instance (its contents may be views)."""
        t = type(x)
        if t is int and abs(x).bit_length() > _SHOWN_INT_BITS:  # int -> str is quadratic
            return f"<int of {abs(x).bit_length()} bits>"
        if t in (range, slice) and any(type(v) is int and abs(v).bit_length() > _SHOWN_INT_BITS
                                       for v in (x.start, x.stop, x.step)):
            return f"<{t.__name__} with bounds of more than {_SHOWN_INT_BITS} bits>"
        if t is fractions.Fraction and max(abs(x.numerator).bit_length(),
                                           x.denominator.bit_length()) > _SHOWN_INT_BITS:
            return (f"<Fraction of {abs(x.numerator).bit_length()}/{x.denominator.bit_length()} "
                    "bits>")
        if isinstance(x, BaseException):
            args = ", ".join(self.repr1(a, level - 1) for a in x.args[:3])
            return f"{t.__name__}({args})"
        if isinstance(x, collections.defaultdict):
            factory = self.repr1(x.default_factory, level - 1)
            return f"defaultdict({factory}, {self.repr_mapping(x, level, list(x.items()))})"
        if isinstance(x, collections.Counter):
            items = list(x.items())
            try:
                items.sort(key=lambda kv: kv[1], reverse=True)  # most common first, as Counter shows
            except TypeError:
                pass
            return f"Counter({self.repr_mapping(x, level, items)})"
        if isinstance(x, collections.OrderedDict):
            return f"OrderedDict({self.repr_mapping(x, level, list(x.items()))})"
        if isinstance(x, collections.deque) and x.maxlen is not None:
            return f"{self.repr_deque(x, level)[:-1]}, maxlen={x.maxlen})"
        return super().repr1(x, level)

    def repr_bytes(self, x: bytes, level: int) -> str:
        """Like reprlib's ``repr_str``: never the repr of the whole value (reprlib has none)."""
        text = repr(x[: self.maxstring])
        if len(text) > self.maxstring:
            i = max(0, (self.maxstring - 3) // 2)
            j = max(0, self.maxstring - 3 - i)
            text = repr(x[:i] + x[len(x) - j:])
            text = text[:i] + self.fillvalue + text[len(text) - j:]
        return text

    def repr_bytearray(self, x: bytearray, level: int) -> str:
        return f"bytearray({self.repr_bytes(bytes(x[: 2 * self.maxstring]), level)})"

    def repr_mapping(self, x: Any, level: int, items: list[tuple[Any, Any]]) -> str:
        """``{k: v, ...}`` of ``items`` in the order given (reprlib sorts keys)."""
        if not items:
            return "{}"
        if level <= 0:
            return "{" + self.fillvalue + "}"
        pieces = [f"{self.repr1(k, level - 1)}: {self.repr1(v, level - 1)}" for k, v in items[: self.maxdict]]
        if len(items) > self.maxdict:
            pieces.append(self.fillvalue)
        return "{" + ", ".join(pieces) + "}"


# --------------------------------------------------- stubs of well-known types
#
# Objects of some common types are pickled by naming a function or class that
# inspect never calls (``re._compile``, ``pathlib.PosixPath``, numpy's
# ``_frombuffer``...).  Their stubs are shown as the real object would be,
# computed from the recorded arguments with stdlib code only.


def _display_key(cls: Any) -> str:
    module = cls._tcc_module
    for package in ("numpy", "pathlib"):
        if module == package or module.startswith(package + "."):
            module = package
    return f"{module}.{cls._tcc_qualname}"


def _show_zoneinfo(obj: Stub, r: _SafeRepr, level: int) -> str | None:
    args = obj._tcc_args
    if args and isinstance(args[0], str):
        return f"zoneinfo.ZoneInfo(key={r.repr1(args[0], level - 1)})"
    return None


def _show_path(obj: Stub, r: _SafeRepr, level: int) -> str | None:
    args = obj._tcc_args
    name = type(obj)._tcc_qualname
    if obj._tcc_kwargs or not all(isinstance(a, str) for a in args):
        return None
    try:
        if "Windows" in name:
            text = pathlib.PureWindowsPath(*args).as_posix()
        else:
            text = str(pathlib.PurePosixPath(*args))
    except (TypeError, ValueError):
        return None
    return f"{name}({r.repr1(text, level - 1)})"


_RE_FLAGS = (
    (re.IGNORECASE, "re.IGNORECASE"), (re.LOCALE, "re.LOCALE"), (re.MULTILINE, "re.MULTILINE"),
    (re.DOTALL, "re.DOTALL"), (re.UNICODE, "re.UNICODE"), (re.VERBOSE, "re.VERBOSE"),
    (re.DEBUG, "re.DEBUG"), (re.ASCII, "re.ASCII"),
)


def _show_pattern(obj: Stub, r: _SafeRepr, level: int) -> str | None:
    args = obj._tcc_args
    if len(args) != 2 or not isinstance(args[0], (str, bytes)) or not isinstance(args[1], int):
        return None
    pattern, flags = args
    if isinstance(pattern, str):
        flags &= ~re.UNICODE  # implied for str patterns (re's own repr leaves it out)
    names = [name for flag, name in _RE_FLAGS if flags & flag]
    rest = flags & ~sum(flag for flag, _name in _RE_FLAGS)
    if rest:
        names.append(hex(rest))
    shown = f", {'|'.join(names)}" if names else ""
    return f"re.compile({r.repr1(pattern, level - 1)}{shown})"


# numpy: dtype kind -> (struct code by item size, name prefix)
_NP_KINDS = {
    "b": ({1: "?"}, "bool"),
    "i": ({1: "b", 2: "h", 4: "i", 8: "q"}, "int"),
    "u": ({1: "B", 2: "H", 4: "I", 8: "Q"}, "uint"),
    "f": ({2: "e", 4: "f", 8: "d"}, "float"),
    "c": ({8: "ff", 16: "dd"}, "complex"),
}
_NATIVE_ORDER = "<" if sys.byteorder == "little" else ">"
_NP_SHOWN = 6


@dataclasses.dataclass
class _NpType:
    name: str  # as numpy names it: float64, >i4, <U5, object...
    kind: str
    size: int  # bytes per item
    order: str  # "<", ">" or "|"


def _np_dtype(obj: Any) -> _NpType | None:
    """What a stub of ``numpy.dtype(spec, align, copy)`` + its state describes."""
    if stub_name(obj) is None or _display_key(type(obj)) != "numpy.dtype":
        return None
    args, state = obj._tcc_args, obj._tcc_state
    if not args or not isinstance(args[0], str) or len(args[0]) < 2:
        return None
    spec = args[0]
    kind, digits = spec[0], spec[1:]
    order = state[1] if isinstance(state, tuple) and len(state) > 5 and state[1] in "<>|=" else "|"
    order = _NATIVE_ORDER if order == "=" else order
    elsize = state[5] if isinstance(state, tuple) and len(state) > 5 and isinstance(state[5], int) else -1
    size = int(digits) if digits.isdigit() else 0
    if kind in _NP_KINDS:
        name = _NP_KINDS[kind][1] + ("" if kind == "b" else str(8 * size))
        if order not in (_NATIVE_ORDER, "|") and size > 1:
            name = f"{order}{kind}{size}"
    elif kind == "U":
        size = elsize if elsize > 0 else 4 * size
        name = f"{order if order != '|' else _NATIVE_ORDER}U{size // 4}"
    elif kind == "S":
        size = elsize if elsize > 0 else size
        name = f"|S{size}"
    elif kind == "O":
        name = "object"
    elif kind == "V":
        names = state[3] if isinstance(state, tuple) and len(state) > 3 else None
        if isinstance(names, tuple) and all(isinstance(n, str) for n in names):
            name = "[" + ", ".join(names) + "]"
        else:
            name = f"void{8 * size}"
    elif kind in ("M", "m"):
        name = "datetime64" if kind == "M" else "timedelta64"
    else:
        name = spec
    return _NpType(name, kind, size, order)


def _np_values(dtype: _NpType, raw: Any, positions: list[int], r: _SafeRepr, level: int) -> list[str] | None:
    """Reprs of the items at ``positions`` of a numpy buffer, decoded with struct (or None)."""
    if isinstance(raw, list):  # object arrays: the items themselves
        if not all(p < len(raw) for p in positions):
            return None
        return [r.repr1(raw[p], level - 1) for p in positions]
    if not isinstance(raw, (bytes, bytearray)) or dtype.size <= 0:
        return None
    if not all((p + 1) * dtype.size <= len(raw) for p in positions):
        return None
    chunks = [bytes(raw[p * dtype.size:(p + 1) * dtype.size]) for p in positions]
    order = "<" if dtype.order == "|" else dtype.order
    try:
        if dtype.kind in _NP_KINDS:
            code = _NP_KINDS[dtype.kind][0].get(dtype.size)
            if code is None:
                return None
            values = [struct.unpack(order + code, c) for c in chunks]
            if dtype.kind == "c":
                return [repr(complex(*v)) for v in values]
            return [repr(v[0]) for v in values]
        if dtype.kind == "U":
            codec = "utf-32-le" if order == "<" else "utf-32-be"
            return [r.repr1(c.decode(codec).rstrip("\x00"), level - 1) for c in chunks]
        if dtype.kind == "S":
            return [r.repr1(c.rstrip(b"\x00"), level - 1) for c in chunks]
    except (struct.error, UnicodeDecodeError):
        return None
    return None


def _np_positions(shape: tuple[int, ...], fortran: bool, count: int) -> list[int]:
    """Buffer positions of the first ``count`` items in row-major order."""
    if not fortran or len(shape) <= 1:
        return list(range(count))
    positions = []
    for flat in range(count):
        index = []
        for n in reversed(shape):  # row-major: the last axis varies fastest
            flat, i = divmod(flat, n)
            index.append(i)
        index.reverse()
        position, stride = 0, 1
        for i, n in zip(index, shape):  # column-major: the first axis is contiguous
            position += i * stride
            stride *= n
        positions.append(position)
    return positions


def _np_array(shape: Any, dtype_stub: Any, fortran: bool, raw: Any, r: _SafeRepr, level: int) -> str | None:
    if not (isinstance(shape, tuple) and all(isinstance(n, int) and n >= 0 for n in shape)):
        return None
    dtype = _np_dtype(dtype_stub)
    head = f"<numpy.ndarray shape={shape!r} dtype={dtype.name if dtype else r.repr1(dtype_stub, level - 1)}"
    total = 1
    for n in shape:
        total *= n
    values = None
    if dtype is not None and total:
        values = _np_values(dtype, raw, _np_positions(shape, fortran, min(total, _NP_SHOWN)), r, level)
    if values:
        more = ", …" if total > len(values) else ""
        return f"{head} [{', '.join(values)}{more}]>"
    return head + ">"


def _show_np_frombuffer(obj: Stub, r: _SafeRepr, level: int) -> str | None:
    args = obj._tcc_args
    if len(args) != 4:
        return None
    buf, dtype, shape, order = args
    return _np_array(shape, dtype, order == "F", buf, r, level)


def _show_np_reconstruct(obj: Stub, r: _SafeRepr, level: int) -> str | None:
    state = obj._tcc_state
    if not (obj._tcc_args and stub_name(obj._tcc_args[0]) in ("numpy.ndarray",)):
        return None
    if not (isinstance(state, tuple) and len(state) == 5):
        return None
    _version, shape, dtype, fortran, raw = state
    return _np_array(shape, dtype, bool(fortran), raw, r, level)


def _show_np_scalar(obj: Stub, r: _SafeRepr, level: int) -> str | None:
    args = obj._tcc_args
    dtype = _np_dtype(args[0]) if args else None
    if dtype is None or len(args) != 2:
        return None
    values = _np_values(dtype, args[1] if dtype.kind != "O" else [args[1]], [0], r, level)
    if not values:
        return None
    name = dtype.name.lstrip("<>|")
    return f"numpy.{'str_' if dtype.kind == 'U' else name}({values[0]})"


def _show_np_dtype(obj: Stub, r: _SafeRepr, level: int) -> str | None:
    dtype = _np_dtype(obj)
    return f"dtype({dtype.name!r})" if dtype is not None else None


_STUB_DISPLAYS: dict[str, Callable[[Stub, _SafeRepr, int], "str | None"]] = {
    "zoneinfo.ZoneInfo._unpickle": _show_zoneinfo,
    "re._compile": _show_pattern,
    "numpy._frombuffer": _show_np_frombuffer,
    "numpy._reconstruct": _show_np_reconstruct,
    "numpy.scalar": _show_np_scalar,
    "numpy.dtype": _show_np_dtype,
    **{f"pathlib.{name}": _show_path for name in (
        "Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath")},
}


def safe_repr(obj: Any, limit: int = _REPR_LIMIT, *, unsafe: bool = False) -> str:
    """A repr of at most ``limit`` characters that never calls user code
    (unless ``unsafe``)."""
    text = _SafeRepr(unsafe=unsafe).repr(obj)
    text = text.replace("\n", "\\n")
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


# ------------------------------------------------------------ finding code

Locator = Callable[[str], "str | None"]


def find_module_file(module: str, extra_paths: tuple[str, ...] = ()) -> str | None:
    """The source file of ``module`` without importing it (or anything else)."""
    mod = sys.modules.get(module)
    if mod is not None:
        path = vars(mod).get("__file__")
        if isinstance(path, str) and path.endswith(".py") and os.path.isfile(path):
            return path
    parts = module.split(".")
    if not all(p.isidentifier() for p in parts):
        return None
    for base in (*extra_paths, *sys.path):
        base = base or os.getcwd()
        for candidate in (
            os.path.join(base, *parts) + ".py",
            os.path.join(base, *parts, "__init__.py"),
        ):
            if os.path.isfile(candidate):
                return candidate
    return None


_COMPILED: dict[tuple[str, float, int], types.CodeType | str] = {}


def compile_file(path: str) -> types.CodeType | str:
    """The module code of ``path`` as import would compile it, or an error text."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror}"
    key = (path, st.st_mtime, st.st_size)
    cached = _COMPILED.get(key)
    if cached is not None:
        return cached
    try:
        with tokenize.open(path) as fh:
            source = fh.read()
        result: types.CodeType | str = compile(source, path, "exec", dont_inherit=True)
    except (OSError, SyntaxError, ValueError) as exc:
        result = f"the current {os.path.basename(path)} does not compile: {exc}"
    _COMPILED[key] = result
    return result


def _walk_code(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _walk_code(const)


def find_code(module_code: types.CodeType, qualname: str, want: bytes | None) -> types.CodeType | None:
    """The code object of ``qualname`` in a module (the fingerprint match if several).

    The wrapper made by a decorator with ``functools.wraps`` is named by the
    decorated function's qualname but runs the decorator's nested code
    (``traced.<locals>.wrapper``): when no code of that qualname matches, a
    nested code of the module with the stored fingerprint is that wrapper's.
    """
    codes = list(_walk_code(module_code))
    found = [c for c in codes if c.co_qualname == qualname]
    if want is not None:
        for c in found:
            if fingerprint(c) == want:
                return c
        for c in codes:
            if "<locals>" in c.co_qualname and fingerprint(c) == want:
                return c
    return found[-1] if found else None


# ------------------------------------------------------------- description


@dataclasses.dataclass
class Local:
    name: str
    kind: str  # "arg", "local", "cell", "free", "stack"
    value: str
    unbound: bool = False


@dataclasses.dataclass
class FrameInfo:
    """One frame of the frozen call stack, ready to render."""

    function: str
    qualname: str
    module: str | None
    file: str | None
    line: int | None
    source: str | None
    columns: tuple[int, int] | None
    status: str  # "suspended", "not started", "finished"
    by_reference: bool
    fingerprint: str | None
    code_changed: bool | None
    notes: list[str]
    locals: list[Local]
    stack: list[str]
    handling: str | None = None
    resumes_after: str | None = None  # "await", "yield from", "yield"
    awaits: str | None = None  # qualname of the frame it awaits (the next one)


@dataclasses.dataclass
class Awaiting:
    kind: str  # "effect", "wait", "approval", "sleep", "checkpoint", "gather", "object"
    text: str
    detail: dict[str, Any]


def _live_frame(gen: Any) -> FrameView:
    """Read a live generator/coroutine into a FrameView (for --unsafe-repr)."""
    from . import _records

    state, offset, slots, exc, func = _frames.native().read_frame(gen, _records.NULL)
    slots = tuple(UNBOUND if s is _records.NULL else s for s in slots)
    exc = UNBOUND if exc is _records.NULL else exc
    view = FrameView(func, fingerprint(_frames.code_of(gen)), 0)
    view.record = (1, state, offset, slots, exc, gen.__name__, gen.__qualname__)
    view.live = gen
    return view


def _as_frame(obj: Any) -> FrameView | None:
    if isinstance(obj, FrameView):
        return obj
    if isinstance(obj, _frames.GENERATOR_TYPES) and _frames.available():
        return _live_frame(obj)
    return None


def _is_internal(frame: FrameView) -> bool:
    module = frame.module or ""
    return module == "tcc" or module.startswith("tcc.")


def _request_fields(obj: Any) -> tuple[str, dict[str, Any]] | None:
    """(class name, fields) of a tcc request, stub or live."""
    name = stub_name(obj)
    if name is not None:
        if not name.startswith("tcc.effects._effect."):
            return None
        cls = name.rpartition(".")[2]
        fields = dict(obj._tcc_attrs())
        args = obj._tcc_args
        if cls == "EffectRequest" and len(args) == 3:
            fields.update(name=args[0], args=args[1], kwargs=args[2])
        elif cls == "GatherRequest" and len(args) == 1:
            fields.update(requests=args[0])
        return cls, fields
    t = type(obj)
    if t.__module__ == "tcc.effects._effect" and t.__name__.endswith("Request"):
        fields = {k: getattr(obj, k, None) for k in getattr(t, "__slots__", ())}
        return t.__name__, fields
    return None


def _effect_call(fields: dict[str, Any], r: Callable[[Any], str]) -> str:
    got = fields.get("name", "?")
    name = (got if isinstance(got, str) else r(got)).rpartition(":")[2]
    args = got_args if isinstance(got_args := fields.get("args"), tuple) else ()
    kwargs = got_kwargs if isinstance(got_kwargs := fields.get("kwargs"), dict) else {}
    parts = [r(a) for a in args] + [f"{k}={r(v)}" for k, v in kwargs.items()]
    return f"{name}({', '.join(parts)})"


def _plain(value: Any) -> bool:
    """Whether ``value`` may go into the JSON document as it is (a huge int would not print)."""
    if type(value) is int:
        return value.bit_length() <= 64
    return isinstance(value, (str, float, bool, type(None)))


def _when(value: Any) -> str | None:
    """A timestamp as local time, or None if ``value`` is not one."""
    if type(value) not in (int, float):
        return None
    try:
        return datetime.datetime.fromtimestamp(value).isoformat(sep=" ", timespec="seconds")
    except (OverflowError, OSError, ValueError):
        return None


def describe_request(obj: Any, *, unsafe: bool = False) -> Awaiting | None:
    def r(value: Any) -> str:
        return safe_repr(value, 40, unsafe=unsafe)

    info = _request_fields(obj)
    if info is None:
        if obj is None:
            return None
        return Awaiting("object", f"awaiting {safe_repr(obj, unsafe=unsafe)}", {})
    cls, f = info
    if cls == "EffectRequest":
        call = _effect_call(f, r)
        return Awaiting("effect", f"awaiting effect {call}", {"effect": f.get("name"), "call": call})
    if cls == "GatherRequest":
        reqs = got_reqs if isinstance(got_reqs := f.get("requests"), tuple) else ()
        calls = []
        for req in reqs:
            sub = _request_fields(req)
            calls.append(_effect_call(sub[1], r) if sub else r(req))
        return Awaiting("gather", f"awaiting tcc.gather of {len(calls)} effects: {', '.join(calls)}",
                        {"calls": calls})
    if cls == "CheckpointRequest":
        return Awaiting("checkpoint", "at an explicit tcc.checkpoint()", {})
    if cls == "WaitRequest":
        detail = {k: f.get(k) for k in ("name", "kind", "prompt", "wait_id", "timeout", "deadline")}
        detail = {k: v if _plain(v) else r(v) for k, v in detail.items()}
        if f.get("kind") == "approval":
            text = f"waiting for approval {r(f.get('prompt'))}"
        else:
            text = f"waiting for signal {r(f.get('name'))}"
        wait_id = f.get("wait_id")
        if wait_id:
            text += f" (id {wait_id if isinstance(wait_id, str) else r(wait_id)})"
        when = _when(f.get("deadline"))
        if when is not None:
            text += f", times out at {when}"
        return Awaiting("approval" if f.get("kind") == "approval" else "wait", text, detail)
    if cls == "SleepRequest":
        until = f.get("until")
        when = _when(until)
        if when is not None:
            return Awaiting("sleep", f"sleeping until {when}", {"until": until})
        return Awaiting("sleep", "sleeping", {})
    return Awaiting("object", f"awaiting {safe_repr(obj, unsafe=unsafe)}", {})


def _source_line(path: str | None, line: int | None) -> str | None:
    if not path or not line:
        return None
    linecache.checkcache(path)
    text = linecache.getline(path, line)
    return text.rstrip("\n") if text else None


def _slot_names(code: AnyCode) -> list[str]:
    """Names of ``localsplus``: locals, then cell-only variables, then free ones."""
    names = list(code.co_varnames)
    names += [c for c in code.co_cellvars if c not in code.co_varnames]
    names += list(code.co_freevars)
    return names


def _slot_kind(code: AnyCode, index: int, name: str, names: list[str]) -> str:
    if index >= len(names) - len(code.co_freevars):
        return "free"
    if name in code.co_cellvars:
        return "cell"
    nargs = code.co_argcount + code.co_kwonlyargcount
    nargs += bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)  # *args, **kwargs
    return "arg" if index < nargs else "local"


Readable = Callable[[str], bool]


def _describe_frame(frame: FrameView, locate: Locator, unsafe: bool,
                    readable: Readable) -> tuple[FrameInfo, AnyCode | None]:
    notes: list[str] = []
    module = frame.module
    qualname = frame.func_qualname
    stored = frame.fingerprint
    captured = frame.captured_code
    current: types.CodeType | None = None
    path: str | None = None
    compile_problem: str | None = None
    # The module's source as the import system finds it (.py files only) is
    # readable; any other file only if ``readable`` says it belongs to the run.
    located = locate(module) if module is not None else None

    def may_read(candidate: str | None) -> bool:
        return bool(candidate) and (candidate == located or readable(str(candidate)))

    if module is not None and not (frame.live is not None and captured is not None):
        path = located
        if path is None and captured is not None and may_read(captured.co_filename) \
                and os.path.isfile(captured.co_filename):
            path = captured.co_filename
        if path is not None:
            mod_code = compile_file(path)
            if isinstance(mod_code, str):
                compile_problem = mod_code
            else:
                current = find_code(mod_code, qualname, stored)
    elif captured is not None:
        path = captured.co_filename

    code_changed: bool | None = None
    if current is not None and stored is not None:
        code_changed = fingerprint(current) != stored
    elif frame.live is not None:
        code_changed = False
    elif frame.by_reference:
        code_changed = None
        if compile_problem:
            notes.append(compile_problem)
        elif path is None:
            notes.append(f"source of module {display_module(module)!r} not found")
        else:
            notes.append(f"{qualname} no longer exists in {path}")

    # The code whose offsets the record refers to (or the best stand-in).
    code: AnyCode | None
    if captured is not None and (current is None or code_changed):
        code = captured
        if current is None and captured.co_filename and path is None:
            path = captured.co_filename
        if code_changed and not frame.by_reference:
            notes.append("source changed since the snapshot; the frame was captured by value "
                         "and resumes with the captured code (line shown from that code)")
    elif current is not None:
        code = current
        if code_changed:
            notes.append("this frame cannot resume with the current code; the line and the "
                         "variable names shown come from the current source and may not match")
    else:
        code = None

    offset = frame.offset
    status = {_frames.CREATED: "not started", _frames.SUSPENDED: "suspended",
              _frames.RUNNING: "running", _frames.FINISHED: "finished"}.get(frame.state, "unknown")
    line: int | None = None
    columns: tuple[int, int] | None = None
    if code is not None:
        if code_changed and frame.by_reference:
            line = code.co_firstlineno or None
        else:
            line, columns = code_line(code, offset)
        if path is None:
            path = code.co_filename or None
    source: str | None = None
    if path and line:
        if may_read(path):
            source = _source_line(path, line)
        elif os.path.isfile(path):
            notes.append(f"source not shown: {path} is not one of this run's files")
    if code_changed and frame.by_reference:
        columns = None

    slots = frame.slots
    names = _slot_names(code) if code is not None else []
    nnames = min(len(names), len(slots))
    locals_: list[Local] = []
    for i in range(nnames):
        value = slots[i]
        name = names[i]
        kind = _slot_kind(code, i, name, names) if code is not None else "local"
        if isinstance(value, CellView):
            unbound = value.contents is _EMPTY
            shown = "<unbound>" if unbound else safe_repr(value.contents, unsafe=unsafe)
        elif isinstance(value, types.CellType):
            try:
                contents = value.cell_contents
            except ValueError:
                unbound, shown = True, "<unbound>"
            else:
                unbound, shown = False, safe_repr(contents, unsafe=unsafe)
        else:
            unbound = value is UNBOUND
            shown = "<unbound>" if unbound else safe_repr(value, unsafe=unsafe)
        locals_.append(Local(name, kind, shown, unbound))
    if code is None:
        nnames = 0
    stack = [safe_repr(v, 48, unsafe=unsafe) for v in slots[nnames:]]
    if code is None and slots:
        notes.append(f"{len(slots)} slots stored; their names are unknown without the code")

    exc = frame.exc
    handling = None if exc is UNBOUND or exc is None else safe_repr(exc, unsafe=unsafe)
    info = FrameInfo(
        function=frame.name,
        qualname=frame.qualname,
        module=module,
        file=path,
        line=line,
        source=source,
        columns=columns,
        status=status,
        by_reference=frame.by_reference or (frame.live is not None and "<locals>" not in qualname),
        fingerprint=stored.hex() if stored is not None else None,
        code_changed=code_changed,
        notes=notes,
        locals=locals_,
        stack=stack,
        handling=handling,
    )
    return info, code


def _resume_kind(code: AnyCode | None, offset: int) -> str | None:
    """'yield', 'yield from' or 'await' for the RESUME after the YIELD_VALUE at ``offset``."""
    if code is None or offset < 0:
        return None
    raw = code.co_code
    if 2 * offset + 3 >= len(raw):
        return None
    return {1: "yield", 2: "yield from", 3: "await"}.get(raw[2 * offset + 3] & 3)


def describe(root: Any, locate: Locator | None = None, *, unsafe: bool = False,
             readable: Readable | None = None) -> tuple[list[FrameInfo], Awaiting | None]:
    """Frames of the await chain under ``root`` (outermost first) and what it awaits.

    ``locate(module)`` returns the source file of a module captured by
    reference (default: :func:`find_module_file`); it must not import it.
    Source lines are read only from files ``locate`` returned and from files
    ``readable(path)`` accepts (the run's own; default: none): a snapshot's
    code names its own file, and must not make inspect print another one.
    tcc's own request frames (``EffectRequest.__await__`` ...) are folded into
    the :class:`Awaiting` description.
    """
    locate = locate or find_module_file
    readable = readable or (lambda _path: False)
    frames: list[FrameInfo] = []
    seen: set[int] = set()
    obj: Any = root
    while id(obj) not in seen:
        seen.add(id(obj))
        frame = _as_frame(obj)
        if frame is None:
            return frames, (describe_request(obj, unsafe=unsafe) if frames else None)
        if _is_internal(frame):
            request = next((s for s in frame.slots if _request_fields(s) is not None), None)
            if request is not None:
                return frames, describe_request(request, unsafe=unsafe)
        info, code = _describe_frame(frame, locate, unsafe, readable)
        frames.append(info)
        if frame.state != _frames.SUSPENDED or not frame.slots:
            break
        top = frame.slots[-1]
        kind = _resume_kind(code, frame.offset) if info.code_changed is not True else None
        info.resumes_after = kind
        if kind in ("await", "yield from") or (kind is None and _as_frame(top) is not None):
            if info.stack:
                info.stack.pop()  # the delegate: shown as the next frame
            delegate = _as_frame(top)
            info.awaits = delegate.qualname if delegate is not None else info.awaits
            obj = top
            continue
        break
    return frames, None
