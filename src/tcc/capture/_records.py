"""Reconstructors referenced *by name* from inside snapshots.

Everything in this module is part of the snapshot format: a pickle stores
``tcc.capture._records.<name>`` and looks it up again at load time, so these
names and signatures must never change or move (add new ones instead, and bump
``FORMAT_VERSION`` in ``_blob.py`` when old ones stop being produced).
"""

from __future__ import annotations

import collections
import importlib
import itertools
import os
import sys
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
        # the module a snapshot's module name stands for in this load, or None for the
        # one imported by that name (``load_payload(modules=...)``: pinned code)
        self.modules: Callable[[str], types.ModuleType | None] | None = None
        # ``tcc upgrade``: told of each generator whose function's code changed (the
        # generator made for the new code, the stored fingerprint) instead of refusing it
        self.upgrade: Callable[[Any, types.FunctionType, bytes], None] | None = None


LOAD = _LoadContext()

#: Module names of pinned code (``tcc resume --code pinned``) start with this: the
#: recorded source of a run's module, loaded under its own name next to the current one.
PINNED_PREFIX = "__tcc_pinned_"


def project_name(name: str) -> str:
    """``module:qualname`` (or a module name) as the project names it: a module loaded as a
    run's recorded code is ``__tcc_pinned_<16 hex digits>_<name>``; this gives ``<name>``."""
    module, sep, qualname = name.partition(":")
    if module.startswith(PINNED_PREFIX):
        rest = module[len(PINNED_PREFIX):]
        if len(rest) > 17 and rest[16] == "_":
            module = rest[17:]
    return module + sep + qualname


#: The resolver of loads that name none (:func:`set_process_modules`).
PROCESS_MODULES: list[Callable[[str], types.ModuleType | None]] = []


def set_process_modules(resolve: Callable[[str], types.ModuleType | None] | None) -> None:
    """Make ``resolve`` the module resolver of every load in this process that passes
    none (journal values, fork edits): a process resuming a run on its pinned code
    must read all of that run's values the same way (None: stop)."""
    PROCESS_MODULES[:] = [resolve] if resolve is not None else []


def process_modules() -> Callable[[str], types.ModuleType | None] | None:
    """The resolver :func:`set_process_modules` set (None: none), to set it back later."""
    return PROCESS_MODULES[0] if PROCESS_MODULES else None


def resolving() -> bool:
    """Whether loads now go through a module resolver."""
    return LOAD.modules is not None or bool(PROCESS_MODULES)


def import_module(name: str) -> types.ModuleType:
    """The module a snapshot names: what this load's ``modules`` resolver (or the
    process's) gives for it (pinned code), else the module imported by that name."""
    resolve = LOAD.modules or (PROCESS_MODULES[0] if PROCESS_MODULES else None)
    if resolve is not None:
        module = resolve(name)
        if module is not None:
            return module
    if name.startswith(PINNED_PREFIX):
        loaded = sys.modules.get(name)
        if loaded is not None:
            return loaded
        raise errors.IncompatibleSnapshotError(
            f"snapshot refers to module {name}, which is the recorded (pinned) code of a run: "
            "only the tcc runtime resuming that run can load it (`tcc resume RUN_ID`)")
    return importlib.import_module(name)


def module_attribute(module_name: Any, name: Any, cls: Any = None) -> Any:
    """Attribute ``name`` of module ``module_name`` as this process's import binds it: a
    sentinel a snapshot names instead of copying (``tcc.capture._singletons``).  ``cls``:
    its class when it was captured.  Where the module binds no object of that class there
    now (it bound the name to it during the run, not at import; or the code changed), a
    new object of the class stands in, as a copy of the stateless object (what pickling
    by value gave)."""
    if type(module_name) is not str or type(name) is not str or (cls is not None and not isinstance(cls, type)):
        raise errors.CorruptSnapshotError("malformed module attribute in the snapshot")
    module = _named_module(module_name, f"{module_name}.{name}")
    try:
        value = getattr(module, name)
    except AttributeError as exc:
        if cls is None:
            raise errors.IncompatibleSnapshotError(
                f"snapshot refers to {module_name}.{name}, which cannot be found here ({exc})") from None
        value = _MISSING_VALUE
    if cls is None or type(value) is cls:
        return value
    return object() if cls is object else cls.__new__(cls)


_MISSING_VALUE = object()


def module_namespace(module_name: Any) -> dict[str, Any]:
    """The namespace (``globals()``) of module ``module_name`` as this process imports it."""
    if type(module_name) is not str:
        raise errors.CorruptSnapshotError("malformed module namespace in the snapshot")
    return vars(_named_module(module_name, f"the globals() of {module_name}"))


def _named_module(module_name: str, what: str) -> types.ModuleType:
    """:func:`import_module` for ``what`` a snapshot names in module ``module_name``; a
    module that cannot be imported here is an IncompatibleSnapshotError saying so."""
    try:
        return import_module(module_name)
    except ImportError as exc:
        raise errors.IncompatibleSnapshotError(
            f"snapshot refers to {what}, and module {module_name} cannot be imported "
            f"here ({exc})") from None


def builtin_subclass(cls: Any, kind: Any, made_with: Any) -> Any:
    """An instance of a program's subclass of a built-in value type (``tcc.capture._subclasses``)."""
    from ._subclasses import rebuild

    return rebuild(cls, kind, made_with)


def fill_builtin_subclass(obj: Any, state: Any) -> None:
    """Its content and attributes (``tcc.capture._subclasses.fill``)."""
    from ._subclasses import fill

    fill(obj, state)


def process_environ(as_bytes: Any = False) -> Any:
    """``os.environ`` (``os.environb`` if ``as_bytes``) of this process (a snapshot holds
    the name, never the variables)."""
    return getattr(os, "environb", os.environ) if as_bytes is True else os.environ


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
    if expected is not None and fingerprint(code) != expected and LOAD.upgrade is not None \
            and LOAD.pending is not None:
        gen = _frames.fresh_generator(func)
        LOAD.fresh.append(gen)
        LOAD.upgrade(gen, func, expected)  # its record is mapped onto the new code later
        return gen
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


# --------------------------------------------------------------- functions

#: The steps :func:`function_behind_wrappers` may take from one object to the next.
UNWRAP_STEPS = ("__wrapped__", "__func__")


def _is_str_tuple(value: Any) -> bool:
    return isinstance(value, tuple) and all(isinstance(v, str) for v in value)


def function_behind_wrappers(
    module_name: str, qualname: str, steps: tuple[str, ...], code_qualname: str
) -> types.FunctionType:
    """The function found at ``module.qualname`` by following ``steps``.

    A decorated function is not what its module holds under its name (that
    is the wrapper), so it is stored as the path from that name to it:
    ``__wrapped__`` (set by ``functools.wraps``) and ``__func__`` (methods,
    classmethods) steps.  The caller checks the code fingerprint where an
    offset depends on it; here the path must still lead to a function whose
    code has the stored qualname, or the decorators changed.
    """
    if not (
        isinstance(module_name, str)
        and isinstance(qualname, str)
        and isinstance(code_qualname, str)
        and _is_str_tuple(steps)
        and all(step in UNWRAP_STEPS for step in steps)
    ):
        raise errors.CorruptSnapshotError("malformed reference to a decorated function")
    module = import_module(module_name)
    obj: Any = module
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise errors.IncompatibleSnapshotError(
                f"snapshot refers to {module_name}.{qualname}, which cannot be found here"
            ) from None
    for step in steps:
        try:
            obj = getattr(obj, step)
        except AttributeError:
            obj = None
            break
    code = getattr(obj, "__code__", None) if isinstance(obj, types.FunctionType) else None
    if code is None or code.co_qualname != code_qualname:
        raise errors.CodeChangedError(
            f"{module_name}.{qualname}: the decorators around {code_qualname}() have changed "
            "since the snapshot was taken, so the function it was captured in cannot be "
            "found the same way. Restore with the original source, or replay/fork the run instead."
        )
    assert isinstance(obj, types.FunctionType)
    return obj


_FUNCTION_SLOTS = frozenset(
    ("__name__", "__qualname__", "__annotations__", "__kwdefaults__", "__defaults__",
     "__module__", "__doc__")
)


def module_function(
    code: types.CodeType, module_name: str, closure: tuple[types.CellType, ...] | None
) -> types.FunctionType:
    """A function carried by value whose globals are its (imported) module's own.

    For functions of an importable module that cannot be found by name
    (nested functions, lambdas, decorated functions without ``__wrapped__``):
    the code travels in the snapshot, the globals are the live module's, never
    a stale copy of them.
    """
    if not (isinstance(code, types.CodeType) and isinstance(module_name, str)):
        raise errors.CorruptSnapshotError("malformed function record")
    if closure is not None and not (
        isinstance(closure, tuple)
        and len(closure) == len(code.co_freevars)
        and all(isinstance(c, types.CellType) for c in closure)
    ):
        raise errors.CorruptSnapshotError(f"malformed closure for {code.co_qualname}()")
    if closure is None and code.co_freevars:
        raise errors.CorruptSnapshotError(f"missing closure for {code.co_qualname}()")
    module = import_module(module_name)
    return types.FunctionType(code, module.__dict__, None, None, closure)


def fill_function(func: types.FunctionType, state: tuple[dict[str, Any], dict[str, Any]]) -> None:
    """State setter of :func:`module_function`: ``__dict__``, then name, defaults, etc."""
    try:
        own, slots = state
    except (TypeError, ValueError):
        raise errors.CorruptSnapshotError("malformed function state") from None
    if not (isinstance(own, dict) and isinstance(slots, dict) and set(slots) <= _FUNCTION_SLOTS):
        raise errors.CorruptSnapshotError("malformed function state")
    func.__dict__.update(own)
    for name, value in slots.items():
        setattr(func, name, value)


_STREAMS = ("stdout", "stderr", "stdin")


def standard_stream(name: str) -> Any:
    """The restoring process's current ``sys.stdout`` / ``sys.stderr`` / ``sys.stdin``."""
    if name not in _STREAMS:
        raise errors.CorruptSnapshotError(f"unknown standard stream {name!r}")
    return getattr(sys, name)


# -------------------------------------------------------------------- code


_CO_CODE = 6  # where co_code sits in the arguments (cloudpickle's layout on 3.11-3.13)
_BYTECODE: list[tuple[frozenset[int], tuple[int, ...]]] = []


def _bytecode_tables() -> tuple[frozenset[int], tuple[int, ...]]:
    """The opcodes a code object's ``co_code`` may hold, and each one's inline cache
    entries (built on first use: ``dis`` is not imported by a restore that needs no code)."""
    if not _BYTECODE:
        import dis

        ok = frozenset(
            op for name, op in dis.opmap.items()
            if op < 256 and name not in ("CACHE", "RESERVED", "ENTER_EXECUTOR")
            and not name.startswith("INSTRUMENTED_"))
        table = dis._inline_cache_entries  # type: ignore[attr-defined]
        caches = tuple(table[op] if isinstance(table, list) else table.get(dis.opname[op], 0)
                       for op in range(256))
        _BYTECODE.append((ok, caches))
    return _BYTECODE[0]


def check_bytecode(co_code: object) -> None:
    """CorruptSnapshotError unless ``co_code`` is made of whole instructions of this
    interpreter's base (unspecialised, uninstrumented) opcodes, each followed by all of its
    inline cache entries.

    CPython trusts the bytecode a code object is built from: building one (``_PyCode_Quicken``)
    and reading its ``co_code`` (``deopt_code``) write each instruction's inline caches, found
    by opcode, without a bounds check.  A specialised opcode, or caches that run past the end,
    make either write past the buffer (found by the snapshot fuzz campaign under
    AddressSanitizer: a nested function's last instruction turned into LOAD_ATTR_METHOD_NO_DICT
    wrote 18 bytes past ``co_code`` on 3.12).  A snapshot is MAC-checked before it is
    unpickled, so this takes a forged or mis-keyed snapshot, not damage; it is checked anyway.
    """
    if not isinstance(co_code, bytes) or not co_code or len(co_code) % 2:
        raise errors.CorruptSnapshotError("a code object's bytecode is malformed")
    ok, caches = _bytecode_tables()
    n, i = len(co_code), 0
    while i < n:
        op = co_code[i]
        if op not in ok:
            raise errors.CorruptSnapshotError(
                f"a code object's bytecode has opcode {op} at offset {i}, which this interpreter "
                "does not compile")
        i += 2 + 2 * caches[op]
        if i > n:
            raise errors.CorruptSnapshotError(
                f"a code object's bytecode ends inside the inline caches of its last instruction "
                f"(opcode {op})")


def make_code(args: tuple[Any, ...], filename: str) -> types.CodeType:
    """Build a code object from this interpreter's ``CodeType`` arguments, its bytecode
    checked first (:func:`check_bytecode`)."""
    if not isinstance(args, tuple) or len(args) <= _CO_CODE:
        raise errors.CorruptSnapshotError("malformed code object arguments")
    check_bytecode(args[_CO_CODE])
    return types.CodeType(*args).replace(co_filename=filename)


# ------------------------------------------------------------ dict views

#: How a dict view or dict iterator is made again from its dict (the ``kind`` a snapshot
#: names): the unbound method, so that a subclass's own ``keys()`` is not called.
_VIEWS: dict[str, Callable[[Any], Any]] = {
    "keys": dict.keys, "values": dict.values, "items": dict.items,
    "odict_keys": collections.OrderedDict.keys, "odict_values": collections.OrderedDict.values,
    "odict_items": collections.OrderedDict.items,
}
_ITERATORS: dict[str, tuple[Callable[[Any], Any], bool]] = {
    "keys": (dict.keys, False), "values": (dict.values, False), "items": (dict.items, False),
              "reversed_keys": (dict.keys, True), "reversed_values": (dict.values, True),
              "reversed_items": (dict.items, True)}


def dict_view(mapping: Any, kind: Any) -> Any:
    """``mapping.keys()`` (``values()``, ``items()``) of the restored dict: a view stays a
    live view of its dict, which the rest of the snapshot shares."""
    method = _VIEWS.get(kind) if type(kind) is str else None
    if method is None or not isinstance(mapping, dict) \
            or (kind.startswith("odict_") and not isinstance(mapping, collections.OrderedDict)):
        raise errors.CorruptSnapshotError("malformed dict view in the snapshot")
    return method(mapping)


def dict_iterator(mapping: Any, kind: Any, consumed: Any, size: Any, remaining: Any) -> Any:
    """An iterator over the restored dict ``mapping`` (its keys, values or items, forwards
    or reversed) that has yielded ``consumed`` of them, as the captured one had: what it
    yields next is read from the dict then, as it would have been.

    ``size`` is the dict's length at capture.  A dict that is still being loaded (the
    iterator is reachable from the dict's own items) has fewer: then the iterator is one
    over ``remaining``, what the captured iterator would have yielded at capture."""
    spec = _ITERATORS.get(kind) if type(kind) is str else None
    if spec is None or not isinstance(mapping, dict) or type(consumed) is not int \
            or type(size) is not int or type(remaining) is not list \
            or not 0 <= consumed <= size or size - consumed != len(remaining):
        raise errors.CorruptSnapshotError("malformed dict iterator in the snapshot")
    if dict.__len__(mapping) != size:  # still filling: a cycle through the dict's own items
        return iter(remaining)
    method, backwards = spec
    view = method(mapping)
    it = reversed(view) if backwards else iter(view)
    if consumed:
        next(itertools.islice(it, consumed - 1, consumed), None)
    return it


def dict_iterator_resized(kind: Any) -> Any:
    """An iterator over a dict that changed size while it was iterated, as captured: its
    next step raises ``RuntimeError: dictionary changed size during iteration``."""
    spec = _ITERATORS.get(kind) if type(kind) is str else None
    if spec is None:
        raise errors.CorruptSnapshotError("malformed dict iterator in the snapshot")
    method, backwards = spec
    gone: dict[Any, Any] = {None: None}
    view = method(gone)
    it = reversed(view) if backwards else iter(view)
    gone.clear()
    return it


def memoryview_of(exporter: Any, offset: Any, nbytes: Any, fmt: Any, shape: Any, readonly: Any) -> memoryview:
    """A memoryview of ``nbytes`` at byte ``offset`` of ``exporter``'s buffer, cast to
    ``fmt`` and ``shape`` (and read-only if ``readonly``), as captured."""
    if type(offset) is not int or type(nbytes) is not int or type(fmt) is not str \
            or type(shape) is not tuple or type(readonly) is not bool or offset < 0 or nbytes < 0:
        raise errors.CorruptSnapshotError("malformed memoryview in the snapshot")
    try:
        whole = memoryview(exporter).cast("B")
        if offset + nbytes > whole.nbytes:
            raise errors.CorruptSnapshotError("a memoryview in the snapshot reaches past its object")
        view = whole[offset:offset + nbytes]
        if fmt != "B" or len(shape) != 1:
            view = view.cast(fmt, shape)  # type: ignore[call-overload]
    except (TypeError, ValueError) as exc:
        raise errors.CorruptSnapshotError(f"malformed memoryview in the snapshot ({exc})") from None
    return view.toreadonly() if readonly and not view.readonly else view


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



SEGMENTS_PID = "tcc:segments"
BUFFER_PID = "tcc:buffer"  # ("tcc:buffer", "bytes" | "bytearray", data): a value out of band
# ("tcc:list", tail): a list written as segments with holes, referred to again in the same
# dump (from a hole, say): its tail, the list object the first reference builds
LIST_REF_PID = "tcc:list"
# ("tcc:namespace", module name): a module's namespace (``globals()`` held by the agent)
NAMESPACE_PID = "tcc:namespace"
_BUFFER_TYPES = {"bytes": bytes, "bytearray": bytearray}


def is_blob(b: Any) -> bool:
    """A pickled segment or a value's bytes: in the stream (bytes) or out of band (a
    read-only view of the payload)."""
    return type(b) is bytes or type(b) is memoryview


def join_segments(blobs: Any, tail: Any, holes: Any = ()) -> list[Any]:
    """The list :class:`tcc.capture._segments.SegmentCache` wrote as segments: ``tail``
    itself, with each segment's items put in front of what it holds.

    ``holes`` are the ``(position, item)`` pairs the segments left out (``None`` stands
    in their place): items pickled with the rest of the state, so that an item also held
    elsewhere (a dict in a local) is the same object in both places.

    ``tail`` is the list object the stream is building, and it may still be filling: an
    item of the tail that refers back to the list is loaded (and calls this) before the
    tail's items are appended, which then land after the segments' ones, in order.  The
    same holds for a hole (loaded, perhaps still filling, before this is called)."""
    import pickle

    if type(blobs) is not tuple or type(tail) is not list or not all(is_blob(b) for b in blobs) \
            or type(holes) is not tuple:
        raise errors.CorruptSnapshotError("malformed list segments in the snapshot")
    front: list[Any] = []
    for blob in blobs:
        part = pickle.loads(blob)
        if type(part) is not list:
            raise errors.CorruptSnapshotError("a list segment in the snapshot is not a list")
        front.extend(part)
    fill_holes(front, holes)
    tail[0:0] = front
    return tail


def fill_holes(front: list[Any], holes: tuple[Any, ...]) -> None:
    """Put each ``(position, item)`` of ``holes`` into ``front`` where its segment left
    ``None``; CorruptSnapshotError for anything else (positions must be ascending)."""
    last = -1
    for hole in holes:
        if type(hole) is not tuple or len(hole) != 2 or type(hole[0]) is not int \
                or not last < hole[0] < len(front) or front[hole[0]] is not None:
            raise errors.CorruptSnapshotError("malformed list segment holes in the snapshot")
        last = hole[0]
        front[last] = hole[1]


def buffer_value(kind: Any, data: Any) -> bytes | bytearray:
    """The ``bytes`` or ``bytearray`` a pickler wrote out of band as ``(BUFFER_PID, kind,
    data)``."""
    cls = _BUFFER_TYPES.get(kind) if type(kind) is str else None
    if cls is None or not is_blob(data):
        raise errors.CorruptSnapshotError("malformed out-of-band value in the snapshot")
    value: bytes | bytearray = cls(data)
    return value


class PersistentLists:
    """``persistent_load`` for what a pickler wrote by persistent id: the lists written as
    segments and the values written out of band, one object per persistent id object
    (every reference to the list or value refers to that one object)."""

    def __init__(self) -> None:
        self._built: dict[int, tuple[Any, Any]] = {}

    def __call__(self, pid: Any) -> Any:
        got = self._built.get(id(pid))
        if got is not None and got[0] is pid:
            return got[1]
        if type(pid) is tuple and len(pid) in (3, 4) and pid[0] == SEGMENTS_PID:
            obj: Any = join_segments(*pid[1:])
        elif type(pid) is tuple and len(pid) == 2 and pid[0] == LIST_REF_PID and type(pid[1]) is list:
            return pid[1]
        elif type(pid) is tuple and len(pid) == 3 and pid[0] == BUFFER_PID:
            obj = buffer_value(pid[1], pid[2])
        elif type(pid) is tuple and len(pid) == 2 and pid[0] == NAMESPACE_PID:
            obj = module_namespace(pid[1])
        else:
            raise errors.CorruptSnapshotError("unknown persistent id in the snapshot")
        self._built[id(pid)] = (pid, obj)
        return obj
