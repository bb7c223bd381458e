"""The pickler: cloudpickle, taught about frames, cells and exceptions.

What cloudpickle does well (functions and classes by value or by reference,
code objects, globals) is used as it is.  We add, through
``reducer_override``:

* generators and coroutines -> a fresh generator of the same function plus a
  frame record (see ``tcc._native``); finished ones stay finished, running
  ones are refused;
* cells, memoised *before* their contents so that a frame and the nested
  functions that close over it keep sharing one cell (cloudpickle 3.1 gives a
  function fresh cells, which silently splits the sharing);
* exceptions, with ``__cause__``, ``__context__`` and
  ``__suppress_context__`` kept (plain pickling drops them);
* tracebacks, which become None (they hold live frames of the past);
* a short list of objects that must never be captured silently (open files,
  sockets, event loops, futures, async generators), refused loudly;
* reducers registered by the user for their own types.
"""

from __future__ import annotations

import io
import socket
import sys
import types
from typing import Any, Callable

import cloudpickle  # type: ignore[import-untyped]

from .. import errors
from . import _frames, _records
from ._fingerprint import fingerprint

Reduce = tuple[Any, ...]

_REGISTRY: dict[type, Callable[[Any], Reduce]] = {}

# Per-type decision cache: type -> handler (or None for "let pickle decide").
_KIND_CACHE: dict[type, Callable[["Pickler", Any], Any] | None] = {}


def register_reducer(cls: type, reducer: Callable[[Any], Reduce]) -> None:
    """Teach tcc how to capture instances of ``cls`` (and its subclasses).

    ``reducer(obj)`` returns a ``__reduce__``-style tuple, e.g.
    ``(threading.Lock, ())`` to rebuild a lock as a new, unlocked lock.  Use it
    for objects tcc refuses by default (files, sockets, clients holding them)
    when you know how to rebuild them on restore.
    """
    if not isinstance(cls, type):
        raise TypeError(f"register_reducer() needs a class, not {cls!r}")
    _REGISTRY[cls] = reducer
    _KIND_CACHE.clear()


class _Refusal:
    __slots__ = ("why",)

    def __init__(self, why: str) -> None:
        self.why = why

    def __call__(self, pickler: "Pickler", obj: Any) -> Any:
        raise errors.CaptureError(f"{self.why} ({type(obj).__module__}.{type(obj).__qualname__})")


def _refusal_for(t: type) -> _Refusal | None:
    if issubclass(t, io.IOBase) and not issubclass(t, (io.BytesIO, io.StringIO)):
        return _Refusal(
            "open files cannot be captured; keep the path in a local and reopen it, "
            "or register a reducer"
        )
    if issubclass(t, socket.socket):
        return _Refusal("sockets cannot be captured; reconnect after restore")
    if issubclass(t, types.AsyncGeneratorType):
        return _Refusal("async generators cannot be captured yet; use a class-based async iterator")
    if issubclass(t, types.FrameType):
        return _Refusal("frame objects cannot be captured")
    asyncio = sys.modules.get("asyncio")
    if asyncio is not None:
        if issubclass(t, asyncio.Future):
            return _Refusal(
                "asyncio futures and tasks cannot be captured; await them before the checkpoint"
            )
        if issubclass(t, asyncio.AbstractEventLoop):
            return _Refusal("event loops cannot be captured")
    if t.__name__ == "coroutine_wrapper":
        return _Refusal("coroutine wrappers (coro.__await__()) cannot be captured; await the coroutine")
    return None


def _registered(t: type) -> Callable[[Any], Reduce] | None:
    for base in t.__mro__:
        reducer = _REGISTRY.get(base)
        if reducer is not None:
            return reducer
    return None


class Pickler(cloudpickle.Pickler):  # type: ignore[misc]
    """cloudpickle's Pickler plus frames, shared cells and exception chains."""

    def reducer_override(self, obj: Any) -> Any:
        t = type(obj)
        try:
            handler = _KIND_CACHE[t]
        except KeyError:
            handler = _KIND_CACHE[t] = _classify(t)
        if handler is None:
            return NotImplemented
        return handler(self, obj)

    # cloudpickle hook: keep a dynamic function's closure cells *identical*.
    def _dynamic_function_reduce(self, func: types.FunctionType) -> Any:
        rv = super()._dynamic_function_reduce(func)
        if func.__closure__ is None:
            return rv
        maker, newargs, (state, slotstate), listitems, dictitems, setter = rv
        slotstate = dict(slotstate)
        slotstate["__closure__"] = None  # cloudpickle must not refill fresh cells
        code, base_globals, name, argdefs, _fresh = newargs
        return (
            maker,
            (code, base_globals, name, argdefs, func.__closure__),
            (state, slotstate),
            listitems,
            dictitems,
            setter,
        )


def _cloudpickle_default(pickler: Pickler, obj: Any) -> Any:
    return cloudpickle.Pickler.reducer_override(pickler, obj)


def _reduce_generator(pickler: Pickler, gen: Any) -> Any:
    state, offset, slots, exc, func = _frames.native().read_frame(gen, _records.NULL)
    code = _frames.code_of(gen)
    if state == _frames.FINISHED:
        return (_records.finished_generator, (code, gen.__name__, gen.__qualname__))
    if state == _frames.RUNNING:
        raise errors.CaptureError(
            f"{code.co_qualname}() is running; a continuation can only be captured "
            "while it is suspended (capture from outside it, e.g. from the driver)"
        )
    if not isinstance(func, types.FunctionType) or func.__code__ is not code:
        raise errors.CaptureError(
            f"{code.co_qualname}(): the function that created this generator no "
            "longer runs its code (was __code__ replaced?)"
        )
    record = (1, state, offset, slots, exc, gen.__name__, gen.__qualname__)
    return (
        _records.new_generator,
        (func, fingerprint(code), 0),
        record,
        None,
        None,
        _records.fill_generator,
    )


def _reduce_cell(pickler: Pickler, cell: types.CellType) -> Any:
    try:
        contents = cell.cell_contents
    except ValueError:
        return (_records.empty_cell, ())
    return (_records.empty_cell, (), (contents,), None, None, _records.fill_cell)


def _reduce_exception(pickler: Pickler, exc: BaseException) -> Any:
    rv = exc.__reduce_ex__(5)
    if not isinstance(rv, tuple) or len(rv) < 2 or any(x is not None for x in rv[3:5]):
        return NotImplemented
    own = rv[2] if len(rv) > 2 else None
    chain = (own, exc.__cause__, exc.__context__, exc.__suppress_context__)
    if rv[0] is type(exc):
        # Rebuild without calling __init__: exception classes whose __init__
        # takes keyword-only arguments (openai's errors, for one) cannot be
        # called again with just their args.
        return (_records.make_exception, (rv[0], rv[1]), chain, None, None, _records.fill_exception)
    return (rv[0], rv[1], chain, None, None, _records.fill_exception)


def _reduce_traceback(pickler: Pickler, tb: types.TracebackType) -> Any:
    # A traceback pins live frames; it is informational only, so it is
    # captured as None (documented), like the __traceback__ of exceptions.
    return (_records.no_traceback, ())


def _reduce_code(pickler: Pickler, code: types.CodeType) -> Any:
    # cloudpickle blanks co_filename to "<dynamic-code>" for reproducible
    # bytes; tracebacks and `tcc inspect` of restored frames need the real one.
    _maker, args = cloudpickle.cloudpickle._code_reduce(code)
    return (_records.make_code, (args, code.co_filename))


def _make_registered(reducer: Callable[[Any], Reduce]) -> Callable[[Pickler, Any], Any]:
    def handler(pickler: Pickler, obj: Any) -> Any:
        return reducer(obj)

    return handler


_EXACT: dict[type, Callable[[Pickler, Any], Any]] = {
    types.GeneratorType: _reduce_generator,
    types.CoroutineType: _reduce_generator,
    types.CellType: _reduce_cell,
    types.CodeType: _reduce_code,
    types.TracebackType: _reduce_traceback,
    types.FunctionType: _cloudpickle_default,
}

_PLAIN = (dict, list, tuple, set, frozenset, bytearray, type(None), int, float, complex)


def _classify(t: type) -> Callable[[Pickler, Any], Any] | None:
    """Decide once per type how its instances are reduced."""
    if t in _EXACT:
        return _EXACT[t]
    registered = _registered(t)
    if registered is not None:
        return _make_registered(registered)
    if t in _PLAIN:
        return None
    if issubclass(t, type):
        return _cloudpickle_default
    refusal = _refusal_for(t)
    if refusal is not None:
        return refusal
    if issubclass(t, BaseException):
        return _reduce_exception
    return None
