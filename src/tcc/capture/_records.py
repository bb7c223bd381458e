"""Reconstructors referenced *by name* from inside snapshots.

Everything in this module is part of the snapshot format: a pickle stores
``tcc.capture._records.<name>`` and looks it up again at load time, so these
names and signatures must never change or move (add new ones instead, and bump
``FORMAT_VERSION`` in ``_blob.py`` when old ones stop being produced).
"""

from __future__ import annotations

import threading
import types
from typing import Any, Callable

from .. import errors
from . import _frames
from ._fingerprint import fingerprint


class _NullSlot:
    """Stands for a C NULL in a frame slot (unbound local, method-call marker).

    It is deliberately *not* None: None is an ordinary value a local can hold.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return "<NULL>"

    def __reduce__(self) -> str:
        return "NULL"


NULL = _NullSlot()


# ----------------------------------------------------------------- load context


class _LoadContext(threading.local):
    """Frames created during one ``loads`` call, written once loading is done.

    Writing is deferred so that nothing is written into any frame unless the
    whole snapshot unpickled and every code check passed.
    """

    def __init__(self) -> None:
        self.pending: list[tuple[Any, tuple[Any, ...]]] | None = None
        self.fresh: list[Any] = []


LOAD = _LoadContext()


def _where(code: types.CodeType) -> str:
    return f"{code.co_qualname}() ({code.co_filename}:{code.co_firstlineno})"


# -------------------------------------------------------------- generators


def new_generator(func: Any, expected: bytes | None, kind: int) -> Any:
    """Create a fresh generator/coroutine of ``func``; fill it after loading."""
    if not isinstance(func, types.FunctionType):
        raise errors.CorruptSnapshotError(
            f"snapshot names {func!r} as a generator's function, which is not a function"
        )
    code = func.__code__
    if expected is not None and fingerprint(code) != expected:
        raise errors.CodeChangedError(
            f"the code of {_where(code)} has changed since the snapshot was taken; "
            "resuming would continue new code at an old instruction offset. "
            "Restore with the original source, or replay/fork the run instead."
        )
    if LOAD.pending is None:
        raise errors.RestoreError("snapshots must be loaded with tcc.loads()")
    gen = _frames.fresh_generator(func)
    LOAD.fresh.append(gen)
    return gen


def fill_generator(gen: Any, record: tuple[Any, ...]) -> None:
    """State setter: queue the frame record for writing after the load."""
    pending = LOAD.pending
    if pending is None:
        raise errors.RestoreError("snapshots must be loaded with tcc.loads()")
    pending.append((gen, record))


def finished_generator(code: types.CodeType, name: str, qualname: str) -> Any:
    """Rebuild a generator/coroutine that had already finished."""
    closure = tuple(types.CellType() for _ in code.co_freevars) or None
    func = types.FunctionType(code, {"__builtins__": __builtins__}, name, None, closure)
    gen = _frames.fresh_generator(func)
    gen.close()
    gen.__name__ = name
    gen.__qualname__ = qualname
    return gen


def no_traceback() -> None:
    """What a captured traceback object becomes."""
    return None


# -------------------------------------------------------------------- code


def make_code(args: tuple[Any, ...], filename: str) -> types.CodeType:
    """Build a code object from this interpreter's ``CodeType`` arguments."""
    return types.CodeType(*args).replace(co_filename=filename)


# ------------------------------------------------------------------- cells


def empty_cell() -> types.CellType:
    """A cell to be filled by :func:`fill_cell` (lets cycles through cells work)."""
    return types.CellType()


def fill_cell(cell: types.CellType, state: tuple[Any]) -> None:
    cell.cell_contents = state[0]


# -------------------------------------------------------------- exceptions


def make_exception(cls: type[BaseException], args: tuple[Any, ...]) -> BaseException:
    """An exception instance made without running its ``__init__``."""
    exc = cls.__new__(cls, *args)
    exc.args = args
    return exc


def fill_exception(exc: BaseException, state: tuple[Any, Any, Any, bool]) -> None:
    """Apply an exception's own state, then its chaining attributes."""
    own, cause, context, suppress = state
    if own is not None:
        setstate: Callable[[Any], None] | None = getattr(exc, "__setstate__", None)
        if setstate is not None:
            setstate(own)
        elif isinstance(own, dict):
            exc.__dict__.update(own)
    exc.__cause__ = cause
    exc.__context__ = context
    exc.__suppress_context__ = suppress
