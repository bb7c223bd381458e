"""How the views and values the restricted loader builds are shown, running no code of theirs.

:class:`ViewRepr` is reprlib for what :func:`tcc.capture.safe_loads` returns:
views and stubs show themselves (``_tcc_repr``), an allowlisted type's value is
shown by reprlib with bounds (a huge int by its size: int -> str is
quadratic), and any other type by its name only -- never asked for its repr.
A display builds on it: :meth:`ViewRepr.module_label` names modules and
:meth:`ViewRepr.stub_display` shows stubs of well-known types like the real
objects (``tcc inspect`` does both).
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import fractions
import reprlib
import types
from typing import Any, Callable, Iterator

from ._allowlist import SAFE_TYPES, UUIDType, class_label, is_builtin_exception
from ._views import Stub, StubMeta, View

_SHOWN_INT_BITS = 14_000  # ints past this many bits are shown by size (CPython refuses ~14,300)


class ViewRepr(reprlib.Repr):
    """reprlib with views rendered by tcc and unknown types never asked."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 3
        self.maxtuple = self.maxlist = self.maxarray = self.maxdeque = 6
        self.maxdict = 5
        self.maxset = self.maxfrozenset = 6
        self.maxstring = 60
        self.maxlong = 40
        self.maxother = 60

    def module_label(self, module: str) -> str:
        """How a stub's module is named (as stored, here)."""
        return module

    def stub_display(self, obj: Stub, level: int) -> str | None:
        """A stub shown as the real object would be, or None (none is, here)."""
        return None

    def repr1(self, x: Any, level: int) -> str:
        if isinstance(x, (View, Stub)):
            return x._tcc_repr(self, level)
        if isinstance(x, StubMeta):
            return f"<class {x._tcc_display(self)}>"
        if isinstance(x, UUIDType):
            return repr(x)
        return self.value_repr(x, level)

    def value_repr(self, x: Any, level: int) -> str:
        """The repr of anything but a view, a stub or a stub class."""
        t = type(x)
        if t in SAFE_TYPES or is_builtin_exception(t) or t in (types.CodeType,):
            try:
                return self._safe_type(x, level)
            except Exception as exc:  # noqa: BLE001 - odd contents: name the type
                return f"<{class_label(t).removeprefix('builtins.')} object; repr failed: {type(exc).__name__}>"
        if isinstance(x, types.CodeType):
            return f"<code {x.co_qualname}>"
        if t is type:  # a real class: only allowlisted ones get here
            return f"<class {class_label(x).removeprefix('builtins.')}>"
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


# Builds the ViewRepr that ``repr()`` of a view uses (see views_shown_by).
_RENDERER: contextvars.ContextVar[Callable[[], ViewRepr]] = contextvars.ContextVar(
    "tcc_view_renderer", default=ViewRepr)


@contextlib.contextmanager
def views_shown_by(renderer: Callable[[], ViewRepr]) -> Iterator[None]:
    """Within the block, ``repr()`` of a view, a stub or a stub class shows it with a new
    ``renderer()``.

    A display renders with its own :class:`ViewRepr`; the views inside a value
    that reprlib hands to the builtin ``repr`` (a ``slice`` of stubs) then show
    the same way as the others.
    """
    token = _RENDERER.set(renderer)
    try:
        yield
    finally:
        _RENDERER.reset(token)


def shown(obj: Any) -> str:
    """``repr()`` of a view, a stub or a stub class, three levels deep."""
    return _RENDERER.get()().repr1(obj, 3)
