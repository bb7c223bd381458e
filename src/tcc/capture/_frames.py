"""Thin Python face of ``tcc._native``: read a frame, make and fill fresh ones.

The native module is optional at import time (tcc still installs without a
compiler); anything that needs it raises a clear error through
:func:`native`.
"""

from __future__ import annotations

import types
from typing import Any

from .. import errors

import os
import sys

_IMPORT_ERROR: str | None = None
_native_mod: Any  # tcc._native (types in _native.pyi), or None where it is unavailable
try:
    if os.environ.get("TCC_DISABLE_NATIVE", "") not in ("", "0"):
        raise ImportError("disabled by TCC_DISABLE_NATIVE")
    from .. import _native as _native_mod  # the C extension; types in _native.pyi
except ImportError as exc:  # exercised with TCC_DISABLE_NATIVE=1
    _native_mod = None
    _IMPORT_ERROR = str(exc)
else:
    # Internal frame layouts may change in a patch release: a module built
    # for another exact version is not trusted with frame memory.
    # sys.version starts with the running interpreter's PY_VERSION, which the module
    # recorded as BUILT_FOR (platform.python_version() reads the same; not imported here)
    _running = sys.version.split()[0]
    if _native_mod.BUILT_FOR != _running:
        _IMPORT_ERROR = (
            f"tcc._native was built for Python {_native_mod.BUILT_FOR}, "
            f"this is {_running}; reinstall tcc"
        )
        _native_mod = None

CREATED, SUSPENDED, RUNNING, FINISHED = 0, 1, 2, 3

GENERATOR_TYPES = (types.GeneratorType, types.CoroutineType)


def available() -> bool:
    """Whether the native frame module is importable on this interpreter."""
    return _native_mod is not None


def native() -> Any:
    if _native_mod is None:
        raise errors.CaptureError(
            "tcc._native is not available on this interpreter "
            f"({_IMPORT_ERROR}); suspended generators and coroutines cannot be "
            "captured. Reinstall tcc with a C compiler and Python headers present."
        )
    return _native_mod


def view_offset(view: memoryview, exporter: Any) -> int | None:
    """Where ``view``'s memory starts in ``exporter``'s buffer (``tcc._native``), or None
    (no such place, or no native module to find it)."""
    if _native_mod is None:
        return None
    offset: int | None = _native_mod.view_offset(view, exporter)
    return offset


def code_of(gen: Any) -> types.CodeType:
    """The code object of a generator or coroutine."""
    code: types.CodeType = gen.gi_code if isinstance(gen, types.GeneratorType) else gen.cr_code
    return code


def fresh_generator(func: types.FunctionType) -> Any:
    """Call a generator/coroutine function with placeholder arguments.

    Calling it runs only the prologue (COPY_FREE_VARS, MAKE_CELL,
    RETURN_GENERATOR), never user code, and gives an unstarted generator whose
    frame has the right size and real cells; its slots are then overwritten
    from the record.
    """
    code = func.__code__
    npos = code.co_argcount
    kwonly = code.co_varnames[npos : npos + code.co_kwonlyargcount]
    args: list[Any] = [None] * npos
    if npos == 1 and code.co_varnames[0] == ".0":
        # A generator expression loops over ``.0`` without a type check: if a
        # pickle runs this generator before its frame is filled, it must find
        # an (empty) iterator there, not None (found by fuzzing: a crash).
        args[0] = iter(())
    gen = func(*args, **dict.fromkeys(kwonly))
    if not isinstance(gen, GENERATOR_TYPES):
        raise errors.RestoreError(
            f"{code.co_qualname}() ({code.co_filename}:{code.co_firstlineno}) no "
            f"longer returns a generator or coroutine (got {type(gen).__name__})"
        )
    return gen


def slot_names(code: types.CodeType) -> list[str]:
    """Names of ``localsplus``: locals, then cell-only variables, then free ones."""
    names = list(code.co_varnames)
    names += [c for c in code.co_cellvars if c not in code.co_varnames]
    names += list(code.co_freevars)
    return names


_COMPREHENSIONS = {
    "<genexpr>": "generator expression",
    "<listcomp>": "list comprehension",
    "<setcomp>": "set comprehension",
    "<dictcomp>": "dict comprehension",
}


def describe_slot(code: types.CodeType, index: int) -> str:
    """'local x', 'cell c', 'free f' or 'stack[2]' for slot ``index``.

    The hidden argument ``.0`` of a generator expression or (not inlined)
    comprehension is the iterator it loops over, and is named so, with the
    line the expression starts on.
    """
    names = slot_names(code)
    if index < len(names):
        name = names[index]
        if name in code.co_freevars and index >= len(names) - len(code.co_freevars):
            return f"free variable {name!r}"
        if name in code.co_cellvars:
            return f"cell variable {name!r}"
        if name == ".0" and index == 0:
            kind = _COMPREHENSIONS.get(code.co_name, "comprehension")
            return f"the iterator of the {kind} at line {code.co_firstlineno}"
        return f"local {name!r}"
    return f"stack[{index - len(names)}]"


def where(gen: Any) -> str:
    """'qualname() line N (file:N)' for a generator, for error messages."""
    code = code_of(gen)
    frame = getattr(gen, "gi_frame", None) or getattr(gen, "cr_frame", None)
    line = frame.f_lineno if frame is not None else code.co_firstlineno
    return f"{code.co_qualname}() line {line} ({code.co_filename}:{line})"
