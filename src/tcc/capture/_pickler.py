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
* functions of importable modules that cloudpickle cannot find by name: a
  decorated function is found behind its wrappers (``__wrapped__``,
  ``__func__``) and stored by reference; any other (nested functions,
  lambdas) carries its code by value but keeps its module's live globals,
  never a copy of them;
* the interpreter's standard streams, stored by reference (restored as the
  loading process's ``sys.stdout`` etc.);
* a short list of objects that must never be captured silently (open files,
  sockets, event loops, futures, async generators), refused loudly;
* reducers registered by the user for their own types.

Pickling recurses on the C stack, once or more per level of the object graph,
and CPython bounds that recursion by a *count* that assumes a main thread's
8 MiB stack (3.12+), or by ``sys.getrecursionlimit()`` (3.11), not by the
stack the current thread really has.  In a thread with a small stack
(``threading.stack_size(1 << 20)``) a graph a few thousand levels deep
overflowed it: SIGSEGV.  So :meth:`Pickler.dump` measures the current
thread's stack, and where it is smaller than that count needs, pickles on a
helper thread with a large enough one; a graph deeper than the count allows
is then the clean RecursionError (a CaptureError, "object graph too deep")
it is on a main thread.
"""

from __future__ import annotations

import collections
import contextvars
import copyreg
import gc
import io
import itertools
import os
import sys
import threading
import types
import weakref
from typing import Any, Callable

import cloudpickle  # type: ignore[import-untyped]

from .. import errors
from . import _frames, _records, _singletons, _subclasses
from ._fingerprint import fingerprint

from ._registry import KIND_CACHE as _KIND_CACHE
from ._registry import REGISTRY as _REGISTRY
from ._registry import Reduce
from ._registry import register_reducer as register_reducer  # noqa: F401 - its old home


class _Refusal:
    __slots__ = ("why",)

    def __init__(self, why: str) -> None:
        self.why = why

    def __call__(self, pickler: "Pickler", obj: Any) -> Any:
        raise errors.CaptureError(f"{self.why} ({type(obj).__module__}.{type(obj).__qualname__})")


_FILE_REFUSAL = _Refusal(
    "open files cannot be captured; keep the path in a local and reopen it, or register a reducer"
)


def _is_file_type(t: type) -> bool:
    return issubclass(t, io.IOBase) and not issubclass(t, (io.BytesIO, io.StringIO))


def _standard_stream(obj: Any) -> str | None:
    """'stdout', 'stderr' or 'stdin' if ``obj`` is one of the interpreter's streams.

    Both the current ``sys.stdout`` (which may have been replaced, e.g. by a
    test runner) and the original ``sys.__stdout__`` count; either is
    restored as the loading process's current ``sys.stdout``.
    """
    for name in ("stdout", "stderr", "stdin"):
        if obj is getattr(sys, name, None) or obj is getattr(sys, f"__{name}__", None):
            return name
    return None


class _StreamOr:
    """Standard streams by reference; any other instance of a file type as ``fallback``."""

    __slots__ = ("fallback",)

    def __init__(self, fallback: Callable[["Pickler", Any], Any]) -> None:
        self.fallback = fallback

    def __call__(self, pickler: "Pickler", obj: Any) -> Any:
        name = _standard_stream(obj)
        if name is not None:
            return (_records.standard_stream, (name,))
        return self.fallback(pickler, obj)


def _refusal_for(t: type) -> _Refusal | None:
    if _is_file_type(t):
        return _FILE_REFUSAL
    sockets = sys.modules.get("_socket")  # no socket exists before it is imported
    if sockets is not None and issubclass(t, sockets.socket):
        return _Refusal("sockets cannot be captured; reconnect after restore")
    if issubclass(t, types.AsyncGeneratorType):
        return _Refusal("async generators cannot be captured yet; use a class-based async iterator "
                        "(__aiter__/__anext__), or for an @asynccontextmanager a class with "
                        "__aenter__/__aexit__")
    if issubclass(t, types.FrameType):
        return _Refusal("frame objects cannot be captured")
    if issubclass(t, (weakref.ProxyType, weakref.CallableProxyType)):
        return _Refusal("weak proxies (weakref.proxy) cannot be captured: a restore would give a "
                        "copy of the object that follows it no more; hold the object itself")
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


# ------------------------------------------------------------- stack depth

_MiB = 1 << 20
# The stack pickling needs for the interpreter's recursion bound to trip before
# the stack overflows: 3.12+ count C recursion up to a fixed limit sized for a
# main thread's 8 MiB (measured: 4 MiB is enough on 3.13 for every kind of
# object); 3.11 counts against sys.getrecursionlimit() (measured: under 1 KiB
# of stack per count).
_NEEDED_312 = 6 * _MiB
_PER_COUNT_311 = 1024
_HELPER_MIN, _HELPER_MAX = 16 * _MiB, 1024 * _MiB
_THREAD = threading.local()
_SPAWN = threading.Lock()  # threading.stack_size() is process-wide: set and reset it alone


def _stack_needed() -> int:
    if sys.version_info >= (3, 12):
        return _NEEDED_312
    return max(_NEEDED_312, sys.getrecursionlimit() * _PER_COUNT_311)


def _main_stack() -> int | None:
    """The main thread's stack: RLIMIT_STACK (None: unlimited or unknown)."""
    try:
        import resource
    except ImportError:
        return None
    soft, _hard = resource.getrlimit(resource.RLIMIT_STACK)
    return None if soft == resource.RLIM_INFINITY or soft <= 0 else int(soft)


def _thread_stack() -> int | None:
    """The size of the current thread's stack, from the C library (None: unknown)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
    except (ImportError, OSError):
        return None
    self_ = libc.pthread_self
    self_.restype = ctypes.c_void_p
    if hasattr(libc, "pthread_getattr_np"):  # Linux: glibc and musl
        getattr_np, getstack, destroy = (libc.pthread_getattr_np, libc.pthread_attr_getstack,
                                         libc.pthread_attr_destroy)
        getattr_np.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        getstack.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        destroy.argtypes = [ctypes.c_void_p]
        attr = ctypes.create_string_buffer(256)  # a pthread_attr_t is 36 to 64 bytes
        if getattr_np(self_(), attr) != 0:
            return None
        try:
            addr, size = ctypes.c_void_p(), ctypes.c_size_t()
            if getstack(attr, ctypes.byref(addr), ctypes.byref(size)) != 0:
                return None
            return int(size.value)
        finally:
            destroy(attr)
    if hasattr(libc, "pthread_get_stacksize_np"):  # macOS
        get = libc.pthread_get_stacksize_np
        get.restype, get.argtypes = ctypes.c_size_t, [ctypes.c_void_p]
        return int(get(self_()))
    return None


def _current_stack() -> int | None:
    """This thread's stack size (cached per thread; None: unknown)."""
    try:
        known: int | None = _THREAD.stack
        return known
    except AttributeError:
        pass
    if threading.current_thread() is threading.main_thread():
        size = _main_stack()
    else:
        size = _thread_stack()
        if size is None and threading.stack_size():  # unknown here, but small stacks are set
            size = threading.stack_size()
    _THREAD.stack = size
    return size


def _helper_stack() -> int | None:
    """The stack a helper thread must pickle on, if this thread's is too small (else None)."""
    needed = _stack_needed()
    have = _current_stack()
    if have is None or have >= needed:
        return None
    return min(max(_HELPER_MIN, 2 * needed), _HELPER_MAX)


def _on_a_stack_of(size: int, work: Callable[[], Any]) -> Any:
    """``work()`` on a new thread whose stack is ``size`` bytes (with this thread's
    context variables); its result, or its exception raised here."""
    box: dict[str, Any] = {}
    context = contextvars.copy_context()

    def target() -> None:
        try:
            box["result"] = context.run(work)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller as it is
            box["error"] = exc

    with _SPAWN:
        old = threading.stack_size()
        try:
            threading.stack_size(size)
        except (ValueError, RuntimeError):  # not settable here: pickle in place
            return work()
        try:
            helper = threading.Thread(target=target, name="tcc-capture", daemon=True)
            helper.start()
        finally:
            threading.stack_size(old)
    helper.join()
    if "error" in box:
        raise box["error"]
    return box.get("result")


_CLOUDPICKLE_TABLE: Any = getattr(cloudpickle.Pickler, "_dispatch_table", None)
_CHAINED: Any = getattr(cloudpickle.Pickler, "dispatch_table", None)
# the flat table stands for cloudpickle's only if that is exactly its own table in front of
# copyreg's (a later cloudpickle may build it otherwise: then it is used as it is)
_FLAT_TABLE = (isinstance(_CLOUDPICKLE_TABLE, dict) and isinstance(_CHAINED, collections.ChainMap)
               and len(_CHAINED.maps) == 2 and _CHAINED.maps[0] is _CLOUDPICKLE_TABLE
               and _CHAINED.maps[1] is copyreg.dispatch_table)


class Pickler(cloudpickle.Pickler):  # type: ignore[misc]
    """cloudpickle's Pickler plus frames, shared cells and exception chains; with a
    ``segments`` cache (:class:`tcc.capture._segments.SegmentCache`), long lists reuse
    the pickled segments of the previous dump that did not change, and large buffers go
    out of band, into :attr:`out_of_band` (see ``_framed``)."""

    out_of_band: list[Any] | None = None
    segment_dump: Any = None  # the segments' Dump (tcc.capture._segments), if any
    # dict views and iterators: pickled attached to their dict (else as copies of what they
    # hold, as plain pickling does: see ``_reduce_dict_view``); how many were attached
    attach_dicts = True
    attached_dicts = 0

    def __init__(self, file: Any, protocol: int | None = None, *, segments: Any = None) -> None:
        if _FLAT_TABLE and cloudpickle.Pickler.dispatch_table is _CHAINED:
            # cloudpickle's table is a ChainMap over copyreg's: the C pickler asks it for
            # every object of a type it has no saver for, and each miss runs ChainMap's
            # __getitem__ and __missing__ in Python.  The same table as one dict answers
            # in C; made per pickler (two C merges), it sees every copyreg.pickle() made
            # before the dump (one made during it, from a __reduce__, applies from the
            # next).  The C pickler reads the attribute in __init__, so it is set before.
            self.dispatch_table = {**copyreg.dispatch_table, **_CLOUDPICKLE_TABLE}
        if segments is None:
            super().__init__(file, protocol=protocol)
            from ._segments import namespace_hook

            hook = namespace_hook()  # (a module's globals() by name, as with segments)
            if hook is not None:
                self.persistent_id = hook
            return
        from ._segments import Dump

        dump = Dump(segments)
        super().__init__(file, protocol=protocol, buffer_callback=dump.buffer)
        self.persistent_id = dump.hook()
        self.out_of_band = dump.buffers
        self.segment_dump = dump

    def dump(self, obj: Any) -> Any:
        """Pickle ``obj``; on a helper thread with a large enough stack if this thread's
        is too small for the interpreter's recursion bound (see the module docstring)."""
        size = _helper_stack()
        if size is None:
            return super().dump(obj)
        return _on_a_stack_of(size, lambda: super(Pickler, self).dump(obj))

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


# cloudpickle's registry of modules pickled by value (a set it changes in place), and the
# types it writes by their builtin names; None if a later cloudpickle moved them
_BY_VALUE: Any = getattr(cloudpickle.cloudpickle, "_PICKLE_BY_VALUE_MODULES", None)
_BUILTIN_TYPES: Any = getattr(cloudpickle.cloudpickle, "_BUILTIN_TYPE_NAMES", None)


def _by_reference(obj: Any) -> bool:
    """cloudpickle's ``_should_pickle_by_reference(obj)`` for a function or class: is it
    the attribute its ``__qualname__`` names in its importable module?  The usual case --
    a top-level name, while no module is registered to be pickled by value -- is decided
    here with one lookup (cloudpickle's test costs ~10 us, and a checkpoint meets the
    agent's functions and classes every time); anything else is left to cloudpickle."""
    module_name = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if (type(module_name) is str and type(qualname) is str and module_name != "__main__"
            and "." not in qualname and _BY_VALUE is not None and not _BY_VALUE):
        module = sys.modules.get(module_name)
        if module is None:
            return False
        if type(module) is types.ModuleType:
            try:
                return getattr(module, qualname) is obj
            except AttributeError:
                return False
    return bool(cloudpickle.cloudpickle._should_pickle_by_reference(obj))


def _reduce_class(pickler: Pickler, cls: type) -> Any:
    """Classes: by reference when cloudpickle would write them so (decided faster),
    else as cloudpickle does."""
    if _BUILTIN_TYPES is not None and cls is not type(None) and cls is not type(Ellipsis) \
            and cls is not type(NotImplemented) and cls not in _BUILTIN_TYPES and _by_reference(cls):
        return NotImplemented
    return _cloudpickle_default(pickler, cls)


# ------------------------------------------------------------------ functions

_MAX_UNWRAP = 32


def _importable(module_name: Any) -> types.ModuleType | None:
    """The module named ``module_name`` if a loading process is expected to import it.

    The same assumption as cloudpickle's: a module in ``sys.modules`` is
    importable, unless it is the script run as ``__main__`` or registered with
    ``cloudpickle.register_pickle_by_value``.
    """
    if not isinstance(module_name, str) or module_name in ("__main__", "__mp_main__"):
        return None
    module = sys.modules.get(module_name)
    if not isinstance(module, types.ModuleType):
        return None
    if cloudpickle.cloudpickle._is_registered_pickle_by_value(module):
        return None
    return module


def _unwrap_step(obj: Any) -> tuple[str, Any] | None:
    if isinstance(obj, (types.MethodType, classmethod, staticmethod)):
        return "__func__", obj.__func__
    try:
        inner = getattr(obj, "__wrapped__")
    except Exception:  # noqa: BLE001 - AttributeError, or a proxy's own error: no path
        return None
    return "__wrapped__", inner


def locate_function(func: types.FunctionType) -> tuple[str, str, tuple[str, ...]] | None:
    """(module, qualname, steps) leading from a module attribute to ``func``, or None.

    Finds functions that cloudpickle cannot, because their module holds
    something else under their name: the wrapper of a decorator that used
    ``functools.wraps`` (``__wrapped__``), a classmethod (``__func__``), or
    a chain of such.
    """
    qualname = getattr(func, "__qualname__", None)
    module_name = getattr(func, "__module__", None)
    module = _importable(module_name)
    if module is None or not isinstance(qualname, str) or "<" in qualname:
        return None  # "<locals>", "<lambda>": never reachable by name
    obj: Any = module
    try:
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except Exception:  # noqa: BLE001 - not there (or a module __getattr__ failed)
        return None
    steps: list[str] = []
    seen: set[int] = set()
    for _ in range(_MAX_UNWRAP):
        if obj is func:
            assert isinstance(module_name, str)  # _importable() checked it
            return module_name, qualname, tuple(steps)
        if id(obj) in seen:
            return None
        seen.add(id(obj))
        step = _unwrap_step(obj)
        if step is None:
            return None
        steps.append(step[0])
        obj = step[1]
    return None


def home_module(func: types.FunctionType) -> str | None:
    """The name of the importable module whose namespace ``func`` runs in, or None."""
    name = func.__globals__.get("__name__")
    module = _importable(name)
    if module is None or module.__dict__ is not func.__globals__:
        return None
    assert isinstance(name, str)  # _importable() checked it
    return name


def _reduce_function(pickler: Pickler, func: types.FunctionType) -> Any:
    """Functions: by reference wherever possible, and never with copied module globals.

    * found by name (cloudpickle's test): by reference, as pickle does;
    * found behind the wrappers at its name: by that path (the generator
      reducer adds the code fingerprint check, as for any reference);
    * of an importable module but not reachable by name: code by value,
      globals by reference to the module;
    * anything else (``__main__`` scripts, modules registered to be pickled
      by value): cloudpickle by value, with the globals it uses copied.
    """
    if _by_reference(func):
        return NotImplemented
    found = locate_function(func)
    if found is not None:
        module_name, qualname, steps = found
        return (
            _records.function_behind_wrappers,
            (module_name, qualname, steps, func.__code__.co_qualname),
        )
    home = home_module(func)
    if home is None:
        return pickler._dynamic_function_reduce(func)
    slots = {
        "__name__": func.__name__,
        "__qualname__": func.__qualname__,
        "__annotations__": func.__annotations__,
        "__kwdefaults__": func.__kwdefaults__,
        "__defaults__": func.__defaults__,
        "__module__": func.__module__,
        "__doc__": func.__doc__,
    }
    # The closure is passed as it is, so that its cells keep their identity
    # (see _reduce_cell); the function dict and slots go in the state, which
    # lets them refer back to the function.
    return (
        _records.module_function,
        (func.__code__, home, func.__closure__),
        (dict(func.__dict__), slots),
        None,
        None,
        _records.fill_function,
    )


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


def _reduce_keeping_state(pickler: Pickler, obj: Any) -> Any:
    """A ``Counter`` or ``defaultdict`` (or a subclass's instance): their ``__reduce__``
    leaves out the instance's own attributes (``self.limit`` of a ``TokenBudget(Counter)``),
    so it would come back with the class's defaults; they go in as its state."""
    rv = obj.__reduce_ex__(5)
    state = obj.__getstate__()
    if not isinstance(rv, tuple) or len(rv) < 2 or (len(rv) > 2 and rv[2] is not None) or not state:
        return NotImplemented
    return (rv[0], rv[1], state, *rv[3:])


def _reduce_mappingproxy(pickler: Pickler, proxy: types.MappingProxyType[Any, Any]) -> Any:
    """A read-only proxy of a mapping stays one of the restored mapping (a registry the
    agent exposes as ``MappingProxyType(self._tools)`` sees what is added to it later), not
    of a copy.  A class's namespace (``C.__dict__``) is still copied, as before: pickled,
    its functions and descriptors would be a class's body, not data."""
    referents = gc.get_referents(proxy)
    mapping = referents[0] if len(referents) == 1 else None
    if mapping is None or (type(mapping) is dict and "__doc__" in mapping and "__module__" in mapping):
        return (types.MappingProxyType, (dict(proxy),))
    return (types.MappingProxyType, (mapping,))


def _reduce_memoryview(pickler: Pickler, view: memoryview) -> Any:
    """A memoryview is restored as a view of the restored object it views, at the same
    place, format and shape (a window into a ``bytearray`` the agent fills sees the later
    writes, as the original did).  A view tcc cannot place so is refused, never replaced
    by a copy."""
    try:
        exporter = view.obj
    except ValueError:  # released
        raise errors.CaptureError("a released memoryview cannot be captured") from None
    offset = _frames.view_offset(view, exporter) if exporter is not None else None
    fmt, shape = view.format, view.shape
    try:
        if offset is None or not view.c_contiguous:
            raise ValueError("not a contiguous window of its object's buffer")
        _records.memoryview_of(exporter, offset, view.nbytes, fmt, shape, view.readonly)  # it must load
    except (ValueError, TypeError) as exc:
        why = str(exc).replace("malformed memoryview in the snapshot", "it cannot be rebuilt") \
            if isinstance(exc, errors.CorruptSnapshotError) else str(exc)
        if offset is None and not _frames.available():
            why = "finding its place needs tcc._native, which is not available here"
        raise errors.CaptureError(
            f"a memoryview of a {type(exporter).__name__} cannot be captured ({why}); hold "
            "the object itself, or its bytes (bytes(view))") from None
    return (_records.memoryview_of, (exporter, offset, view.nbytes, fmt, shape, view.readonly))


def _reduce_maybe_sentinel(pickler: Pickler, obj: Any) -> Any:
    """An object with no state that a module binds at module level (``MISSING =
    object()``, ``dataclasses.MISSING``) is named, so that it loads as the object the
    import binds and ``is`` tests keep their answer (see ``_singletons``); any other
    object of its type is pickled as usual."""
    try:
        if not _singletons.stateless(obj):
            return NotImplemented
    except Exception:  # noqa: BLE001 - its own __getstate__ failed: pickling says how
        return NotImplemented
    found = _singletons.home(obj)
    if found is None:
        return NotImplemented
    return (_records.module_attribute, (*found, type(obj)))


def _reduce_traceback(pickler: Pickler, tb: types.TracebackType) -> Any:
    # A traceback pins live frames; it is informational only, so it is
    # captured as None (documented), like the __traceback__ of exceptions.
    return (_records.no_traceback, ())


def _reduce_code(pickler: Pickler, code: types.CodeType) -> Any:
    # cloudpickle blanks co_filename to "<dynamic-code>" for reproducible
    # bytes; tracebacks and `tcc inspect` of restored frames need the real one.
    _maker, args = cloudpickle.cloudpickle._code_reduce(code)
    return (_records.make_code, (args, code.co_filename))


def _module_namespace(mapping: dict[Any, Any]) -> bool:
    """Whether ``mapping`` is an imported module's ``__dict__`` (which the import restores)."""
    name = mapping.get("__name__")
    module = sys.modules.get(name) if type(name) is str else None
    return module is not None and getattr(module, "__dict__", None) is mapping


def _viewed_dict(obj: Any) -> dict[Any, Any] | None:
    """The dict a dict view or a dict iterator reads (None once an iterator is exhausted)."""
    return next((r for r in gc.get_referents(obj) if isinstance(r, dict)), None)


def _reduce_dict_view(kind: str) -> Callable[[Pickler, Any], Any]:
    """``d.keys()`` and the like: a view of the dict itself, which the snapshot keeps once
    (cloudpickle makes a view of a new dict, which no later change of ``d`` reaches)."""

    def reduce(pickler: Pickler, view: Any) -> Any:
        mapping = _viewed_dict(view) if pickler.attach_dicts else None
        if mapping is None or _module_namespace(mapping):
            return _cloudpickle_default(pickler, view)
        pickler.attached_dicts += 1
        return (_records.dict_view, (mapping, kind))

    return reduce


_KEYS_CHANGED = ("cannot capture an iterator over a dict whose keys changed while it was iterated "
                 "(it would raise RuntimeError before its end); finish or restart the loop "
                 "before the effect")


def _reduce_dict_iterator(kind: str) -> Callable[[Pickler, Any], Any]:
    """An iterator over a dict's keys, values or items: the dict itself and how many the
    iterator has yielded, so that the restored one reads later values from the dict as
    the captured one would (plain pickling gives an iterator over a frozen list)."""
    backwards = kind.startswith("reversed_")
    methods: dict[str, Callable[[Any], Any]] = {"keys": dict.keys, "values": dict.values, "items": dict.items}
    method = methods[kind.rsplit("_", 1)[-1]]

    def reduce(pickler: Pickler, it: Any) -> Any:
        if not pickler.attach_dicts:
            return NotImplemented  # a copy of what it has left to yield
        mapping = _viewed_dict(it)
        try:
            remaining = list(it.__reduce__()[1][0])  # a copy of the iterator, run out
        except RuntimeError as exc:
            if "changed size" in str(exc):  # the iterator's next step raises this at once
                return (_records.dict_iterator_resized, (kind,))  # (a loop left by `break` is fine)
            raise errors.CaptureError(_KEYS_CHANGED) from None
        if mapping is None:  # run out: it holds no dict any more
            return (iter, ((),))
        if _module_namespace(mapping):
            return NotImplemented
        size = dict.__len__(mapping)
        consumed = size - len(remaining)
        order = reversed(method(mapping)) if backwards else iter(method(mapping))
        ahead = list(itertools.islice(order, consumed, None)) if consumed >= 0 else None
        same = ahead is not None and len(ahead) == len(remaining) and all(
            (a[0] is b[0] and a[1] is b[1]) if kind.endswith("items") else a is b
            for a, b in zip(ahead, remaining))
        if not same:
            raise errors.CaptureError(_KEYS_CHANGED)
        pickler.attached_dicts += 1
        return (_records.dict_iterator, (mapping, kind, consumed, size, remaining))

    return reduce


def _dict_reducers() -> dict[type, Callable[[Pickler, Any], Any]]:
    probe = collections.OrderedDict(a=1)
    plain = {"a": 1}
    out: dict[type, Callable[[Pickler, Any], Any]] = {}
    for kind in ("keys", "values", "items"):
        view = getattr(plain, kind)()
        out[type(view)] = _reduce_dict_view(kind)
        out[type(getattr(probe, kind)())] = _reduce_dict_view("odict_" + kind)
        out[type(iter(view))] = _reduce_dict_iterator(kind)
        out[type(reversed(view))] = _reduce_dict_iterator("reversed_" + kind)
    return out


def _make_registered(reducer: Callable[[Any], Reduce]) -> Callable[[Pickler, Any], Any]:
    def handler(pickler: Pickler, obj: Any) -> Any:
        return reducer(obj)

    return handler


def _reduce_environ(pickler: Pickler, obj: Any) -> Any:
    """``os.environ`` held in a local is the process's environment, by name: a copy would
    put every variable (secrets included) into the snapshot and take later writes nowhere."""
    if obj is os.environ:
        return _records.process_environ, ()
    if obj is getattr(os, "environb", None):
        return _records.process_environ, (True,)
    return NotImplemented


_EXACT: dict[type, Callable[[Pickler, Any], Any]] = {
    type(os.environ): _reduce_environ,
    types.GeneratorType: _reduce_generator,
    types.CoroutineType: _reduce_generator,
    types.CellType: _reduce_cell,
    types.CodeType: _reduce_code,
    types.TracebackType: _reduce_traceback,
    types.FunctionType: _reduce_function,
    types.MappingProxyType: _reduce_mappingproxy,
    memoryview: _reduce_memoryview,
    **_dict_reducers(),
}

_PLAIN = (dict, list, tuple, set, frozenset, bytearray, type(None), int, float, complex)


def _classify(t: type) -> Callable[[Pickler, Any], Any] | None:
    """Decide once per type how its instances are reduced."""
    if t in _EXACT:
        return _EXACT[t]
    registered = _registered(t)
    if registered is not None:
        if _is_file_type(t):
            return _StreamOr(_make_registered(registered))
        return _make_registered(registered)
    if t in _PLAIN:
        return None
    if issubclass(t, type):
        return _reduce_class
    refusal = _refusal_for(t)
    if refusal is _FILE_REFUSAL:
        return _StreamOr(refusal)
    if refusal is not None:
        return refusal
    if issubclass(t, BaseException):
        return _reduce_exception
    if issubclass(t, (collections.Counter, collections.defaultdict)) \
            and t.__reduce__ in (collections.Counter.__reduce__, collections.defaultdict.__reduce__) \
            and t.__reduce_ex__ is object.__reduce_ex__:  # (a subclass's own reduce is its own say)
        return _reduce_keeping_state
    subclass = _subclasses.reducer_for(t)
    if subclass is not None:
        base, kind = subclass
        return lambda _pickler, obj: _subclasses.reduce(kind, base, obj)
    stateless = _singletons.stateless_type(t)
    if _subclasses.needs_new_arguments(t):
        refusal = _Refusal(
            f"{t.__qualname__}.__new__ requires arguments that pickling does not "
            "pass, so it could never be made again at a restore; define __getnewargs__ "
            "returning them (or __reduce__)")
        if not stateless:
            return refusal

        def sentinel_or_refused(pickler: Pickler, obj: Any) -> Any:
            got = _reduce_maybe_sentinel(pickler, obj)  # a sentinel a module binds: by name
            return refusal(pickler, obj) if got is NotImplemented else got

        return sentinel_or_refused
    if stateless:
        return _reduce_maybe_sentinel
    return None
