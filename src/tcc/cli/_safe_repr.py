"""Reprs of snapshot values for ``tcc inspect`` and ``tcc show``, running no code of theirs.

:func:`safe_repr` renders what :func:`tcc.capture.safe_loads` returns with
:class:`tcc.capture.ViewRepr` (views and stubs show themselves; unknown types
are never asked), naming a script's module as the person knows it
(``agent``, not ``__tcc_script_agent``).  Stubs of some well-known types
(``ZoneInfo``, ``pathlib`` paths, compiled patterns, numpy arrays, dtypes and
scalars) are rendered like the real object, from their recorded arguments,
with stdlib code only; numpy is never imported.  With ``unsafe`` (``tcc
inspect --unsafe-repr``, live objects) values get their real reprs.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import reprlib
import struct
import sys
from typing import Any, Callable

from ..capture import Stub, ViewRepr, stub_name, views_shown_by
from ..runtime import script_display_name

_REPR_LIMIT = 80


class _SafeRepr(ViewRepr):
    """The display's :class:`~tcc.capture.ViewRepr`: script modules by their stem, stubs of
    well-known types like the real objects, and real reprs if ``unsafe``."""

    def __init__(self, *, unsafe: bool = False) -> None:
        super().__init__()
        self.unsafe = unsafe

    def module_label(self, module: str) -> str:
        return script_display_name(module)

    def stub_display(self, obj: Stub, level: int) -> str | None:
        known = _STUB_DISPLAYS.get(_display_key(type(obj)))
        return known(obj, self, level) if known is not None else None

    def value_repr(self, x: Any, level: int) -> str:
        if self.unsafe:
            try:
                return reprlib.Repr.repr1(self, x, level)
            except Exception as exc:  # noqa: BLE001 - a user __repr__ failed
                return f"<{type(x).__qualname__} object; repr failed: {type(exc).__name__}>"
        return super().value_repr(x, level)


def safe_repr(obj: Any, limit: int = _REPR_LIMIT, *, unsafe: bool = False) -> str:
    """A repr of at most ``limit`` characters that never calls user code
    (unless ``unsafe``)."""
    with views_shown_by(_SafeRepr):
        text = _SafeRepr(unsafe=unsafe).repr(obj)
    text = text.replace("\n", "\\n")
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


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


def _show_zoneinfo(obj: Stub, r: ViewRepr, level: int) -> str | None:
    args = obj._tcc_args
    if args and isinstance(args[0], str):
        return f"zoneinfo.ZoneInfo(key={r.repr1(args[0], level - 1)})"
    return None


def _show_path(obj: Stub, r: ViewRepr, level: int) -> str | None:
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


def _show_pattern(obj: Stub, r: ViewRepr, level: int) -> str | None:
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


def _np_values(dtype: _NpType, raw: Any, positions: list[int], r: ViewRepr, level: int) -> list[str] | None:
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


def _np_array(shape: Any, dtype_stub: Any, fortran: bool, raw: Any, r: ViewRepr, level: int) -> str | None:
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


def _show_np_frombuffer(obj: Stub, r: ViewRepr, level: int) -> str | None:
    args = obj._tcc_args
    if len(args) != 4:
        return None
    buf, dtype, shape, order = args
    return _np_array(shape, dtype, order == "F", buf, r, level)


def _show_np_reconstruct(obj: Stub, r: ViewRepr, level: int) -> str | None:
    state = obj._tcc_state
    if not (obj._tcc_args and stub_name(obj._tcc_args[0]) in ("numpy.ndarray",)):
        return None
    if not (isinstance(state, tuple) and len(state) == 5):
        return None
    _version, shape, dtype, fortran, raw = state
    return _np_array(shape, dtype, bool(fortran), raw, r, level)


def _show_np_scalar(obj: Stub, r: ViewRepr, level: int) -> str | None:
    args = obj._tcc_args
    dtype = _np_dtype(args[0]) if args else None
    if dtype is None or len(args) != 2:
        return None
    values = _np_values(dtype, args[1] if dtype.kind != "O" else [args[1]], [0], r, level)
    if not values:
        return None
    name = dtype.name.lstrip("<>|")
    return f"numpy.{'str_' if dtype.kind == 'U' else name}({values[0]})"


def _show_np_dtype(obj: Stub, r: ViewRepr, level: int) -> str | None:
    dtype = _np_dtype(obj)
    return f"dtype({dtype.name!r})" if dtype is not None else None


_STUB_DISPLAYS: dict[str, Callable[[Stub, ViewRepr, int], "str | None"]] = {
    "zoneinfo.ZoneInfo._unpickle": _show_zoneinfo,
    "re._compile": _show_pattern,
    "numpy._frombuffer": _show_np_frombuffer,
    "numpy._reconstruct": _show_np_reconstruct,
    "numpy.scalar": _show_np_scalar,
    "numpy.dtype": _show_np_dtype,
    **{f"pathlib.{name}": _show_path for name in (
        "Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath")},
}
