"""What the restricted loader hands out for the rebuilders a snapshot names.

A snapshot names tcc's own reconstructors (:mod:`tcc.capture._records`) and
cloudpickle's function and class rebuilders.  The restricted loader
(:mod:`tcc.capture._safeload`) never calls them: it hands out the stand-ins
here, which build views and stubs (:mod:`tcc.capture._views`) from the same
arguments, checking the type of everything they keep.
"""

from __future__ import annotations

from typing import Any

from ._allowlist import class_label, is_builtin_exception
from ._views import (
    UNBOUND,
    CellView,
    CodeView,
    FinishedView,
    FrameView,
    FunctionView,
    ModuleView,
    StreamView,
    Stub,
    StubMeta,
    stub_class,
)


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
    if is_builtin_exception(cls):
        try:
            exc = cls.__new__(cls, *args)
            exc.args = args
            return exc
        except Exception:  # noqa: BLE001 - odd arguments: fall back to a stub
            pass
    if isinstance(cls, StubMeta):
        return cls(*args)
    return stub_class("", class_label(cls))(*args)


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


def _dict_records(name: str) -> Any:
    """The real rebuilder of a dict view or iterator (inert: given a real dict, which is all
    the restricted loader builds, it only iterates it), or a stub call for anything else."""

    def build(*args: Any) -> Any:
        from .. import errors
        from . import _records

        try:
            return getattr(_records, name)(*args)
        except errors.CorruptSnapshotError:
            return stub_class("tcc.capture._records", name)(*args)

    return build


_SUBCLASS_CONTAINERS = {"dict": dict, "odict": dict, "list": list, "deque": list, "set": set}


def _builtin_subclass(cls: Any, kind: Any, made_with: Any) -> Any:
    """A program's subclass of a built-in type (``tcc.capture._subclasses``), shown as the
    plain value it holds: its class is not imported here."""
    container = _SUBCLASS_CONTAINERS.get(kind) if isinstance(kind, str) else None
    if container is not None:
        return container()
    if kind in ("value", "frozenset", "decimal") and isinstance(made_with, (str, bytes, int, float, complex, tuple, list)):
        return made_with
    return stub_class("tcc.capture._records", "builtin_subclass")(cls, kind, made_with)


def _fill_builtin_subclass(obj: Any, state: Any) -> None:
    content = state[0] if isinstance(state, tuple) and len(state) == 2 else None
    if not isinstance(content, list):
        return
    if isinstance(obj, dict):
        obj.update(pair for pair in content if isinstance(pair, tuple) and len(pair) == 2)
    elif isinstance(obj, list):
        obj.extend(content)
    elif isinstance(obj, set):
        try:
            obj.update(content)
        except TypeError:  # an unhashable stand-in
            pass


# What the loader hands out for ``tcc.capture._records.<name>``.
RECORDS: dict[str, Any] = {
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
    "dict_view": _dict_records("dict_view"),
    "dict_iterator": _dict_records("dict_iterator"),
    "dict_iterator_resized": _dict_records("dict_iterator_resized"),
    "builtin_subclass": _builtin_subclass,
    "fill_builtin_subclass": _fill_builtin_subclass,
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


# What the loader hands out for cloudpickle's ``<name>`` (any of its module names).
CLOUDPICKLE: dict[str, Any] = {
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
