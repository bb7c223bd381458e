"""Read a snapshot payload without running anything it contains.

:func:`safe_loads` unpickles a payload made by :func:`tcc.capture.dump_payload`
with a restricted unpickler.  Its ``find_class`` never imports a module that
is not already imported and never hands out a user callable: tcc's frame
reconstructors (:mod:`tcc.capture._records`) become *views*
(:class:`~tcc.capture._views.FrameView`, ...), cloudpickle's function and
class rebuilders become views that keep names, and a code object becomes a
:class:`~tcc.capture._views.CodeView` -- never a real code object, which
CPython would build from bytecode it trusts.  A short allowlist of inert
standard types builds real values, through checks that bound the work and
memory a call may ask for (:mod:`tcc.capture._allowlist`), and every other
global becomes a :class:`~tcc.capture._views.Stub` class that, when called,
reconstructed or given state, just records what it was given.  Nothing in the
pickle can reach a ``__reduce__``/``__setstate__``/``__repr__`` of a user
class.

An allowlisted type can refuse what it is given once parts of it became
stubs (a ``datetime`` whose ``tzinfo`` is a ``ZoneInfo``, a ``defaultdict``
whose factory is a lambda).  That is not damage: the payload is then read
again by :class:`TolerantUnpickler`, the same restrictions in pure Python,
where such a value becomes a view (:class:`~tcc.capture._views.AwareView`,
:class:`~tcc.capture._views.DefaultDictView`) or a stub marked "not rebuilt"
that carries the type's name and arguments.  Only data neither can read
(truncated, malformed) makes :func:`safe_loads` raise.
"""

from __future__ import annotations

import builtins
import collections
import datetime
import io
import pickle
import types
import uuid
from typing import Any, Callable, ClassVar

from ._allowlist import (
    BUDGET_FLOOR,
    BUDGET_RATIO,
    CONSTANT_COST,
    SAFE_BUILTINS,
    SAFE_GLOBALS,
    TOO_LARGE,
    AllowedType,
    CheckedUUID,
    Refused,
    call_cost,
    class_label,
    is_allowed,
    is_builtin_exception,
    is_safe_class,
    real_type,
)
from ._api import _deep_recursion
from .. import errors
from ._framed import is_framed, unframe
from ._records import BUFFER_PID, LIST_REF_PID, NAMESPACE_PID, SEGMENTS_PID, buffer_value, fill_holes, is_blob
from ._standins import CLOUDPICKLE, RECORDS
from ._views import (
    AwareView,
    DefaultDictView,
    ModuleView,
    Stub,
    StubMeta,
    stub_class,
    stub_name,
)


class _Globals:
    """What the restricted unpicklers hand out for the globals a pickle names.

    Shared by :class:`SafeUnpickler` (the C unpickler, fast) and
    :class:`TolerantUnpickler` (the pure-Python one, which survives values
    that cannot be rebuilt).  ``budget`` bounds the bytes that calls of
    allowlisted types may build during one load (see :class:`AllowedType`).
    """

    def __init__(self, budget: int = BUDGET_FLOOR) -> None:
        self._stubs: dict[tuple[str, str, bool, str | None], StubMeta] = {}
        self._allowed: dict[type, AllowedType] = {}
        self.budget = budget
        self.spent = 0

    def persistent_load(self, pid: Any, *, nested: bool = False) -> Any:
        """A list written as segments (``tcc.capture._segments``): the tail list the stream
        is building, with the segments' items put in front (as the real loader does); the
        same list for every reference to the id.  Each segment is read by a restricted
        unpickler that shares this load's budget, and may not hold persistent ids of its own
        (tcc never writes them there).  Anything else a persistent id names is a stub."""
        self.spent += 64  # every reference costs something, even one already read
        if self.spent > self.budget:
            return self.stub("", "list segments", unbuilt=True, why=TOO_LARGE)()
        built = self.__dict__.setdefault("_segment_lists", {})
        got = built.get(id(pid))
        if got is not None and got[0] is pid:
            return got[1]
        if not nested and type(pid) is tuple and len(pid) == 3 and pid[0] == BUFFER_PID:
            size = len(pid[2]) if is_blob(pid[2]) else 0
            self.spent += size
            if self.spent > self.budget:
                value: Any = self.stub("", "bytes", unbuilt=True, why=TOO_LARGE)()
            else:
                try:
                    value = buffer_value(pid[1], pid[2])
                except errors.CorruptSnapshotError:
                    value = self.stub("", "persistent id", unbuilt=True, why="not a value tcc wrote")()
            built[id(pid)] = (pid, value)
            return value
        if not nested and type(pid) is tuple and len(pid) == 2 and pid[0] == LIST_REF_PID \
                and type(pid[1]) is list:
            return pid[1]
        if not nested and type(pid) is tuple and len(pid) == 2 and pid[0] == NAMESPACE_PID \
                and type(pid[1]) is str:  # globals() of a module: named, never imported here
            return self.stub(pid[1], "globals()", unbuilt=True, why="a module's namespace")()
        if nested or not (type(pid) is tuple and len(pid) in (3, 4) and pid[0] == SEGMENTS_PID
                          and type(pid[1]) is tuple and type(pid[2]) is list
                          and all(is_blob(b) for b in pid[1])
                          and (len(pid) == 3 or type(pid[3]) is tuple)):
            return self.stub("", "persistent id", unbuilt=True, why="not a list tcc wrote")()
        front: list[Any] = []
        readable = True
        for blob in pid[1]:
            self.spent += len(blob)
            if self.spent > self.budget:
                front.append(self.stub("", "list segment", unbuilt=True, why=TOO_LARGE)())
                readable = False
                break
            reader = SafeUnpickler(io.BytesIO(blob), self.budget)
            reader.globals = self  # one budget for the whole load
            reader.nested = True
            try:
                part = reader.load()
            except Exception:  # noqa: BLE001 - shown as such, never retried
                part = None
            if type(part) is list:
                front.extend(part)
            else:
                front.append(self.stub("", "list segment", unbuilt=True, why="unreadable")())
                readable = False
        if len(pid) == 4 and readable:  # (a stub for a segment moves the positions after it)
            try:
                fill_holes(front, pid[3])
            except errors.CorruptSnapshotError:
                front.append(self.stub("", "list segment holes", unbuilt=True, why="unreadable")())
        tail = pid[2]
        tail[0:0] = front
        built[id(pid)] = (pid, tail)
        return tail

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
        func = real_type(func)
        name = stub_name(func)
        if name is None and isinstance(func, (type, types.FunctionType, types.BuiltinFunctionType)):
            module = getattr(func, "__module__", None)
            qualname = getattr(func, "__qualname__", None)
            if isinstance(module, str) and isinstance(qualname, str):
                return self.stub("" if module == "builtins" else module, qualname, unbuilt=True, why=why)
        return self.stub("", name or class_label(func), unbuilt=True, why=why)

    def allowed(self, cls: type) -> Any:
        """What the pickle gets for the allowlisted type ``cls``: ``cls`` itself if calling it
        costs the same whatever the arguments, else its :class:`AllowedType`."""
        if cls in CONSTANT_COST:
            return cls
        if cls is uuid.UUID:
            return CheckedUUID
        got = self._allowed.get(cls)
        if got is None:
            got = self._allowed[cls] = AllowedType(cls, self)
        return got

    def check(self, cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        """Why ``cls(*args, **kwargs)`` is not built (None: it is, and its cost is charged).

        TypeError for arguments of a kind ``cls`` is not rebuilt from."""
        try:
            cost = call_cost(cls, args, kwargs)
        except Refused as exc:
            return str(exc)
        if self.spent + cost > self.budget:
            return TOO_LARGE
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
        if module == "tcc.capture._records" and name in RECORDS:
            return RECORDS[name]
        if module in ("cloudpickle.cloudpickle", "cloudpickle.cloudpickle_fast", "cloudpickle"):
            if name in CLOUDPICKLE:
                return CLOUDPICKLE[name]
        if module in ("builtins", "__builtin__"):
            if name in SAFE_BUILTINS:
                return self.allowed(SAFE_BUILTINS[name])
            if name == "getattr":
                return self._getattr
            obj = getattr(builtins, name, None) if name.isidentifier() else None
            if is_builtin_exception(obj):
                return obj
        if module == "copyreg":
            if name == "_reconstructor":
                return self._reconstructor
            if name == "__newobj__":
                return self._newobj
            if name == "__newobj_ex__":
                return self._newobj_ex
        if (module, name) in SAFE_GLOBALS:
            return self.allowed(SAFE_GLOBALS[(module, name)])
        return self.stub(module, name)

    # copyreg / builtins stand-ins --------------------------------------------

    def _getattr(self, obj: Any, name: Any, *default: Any) -> Any:
        name = str(name)
        if isinstance(obj, StubMeta):
            return self.stub(obj._tcc_module, f"{obj._tcc_qualname}.{name}")
        if isinstance(obj, ModuleView):
            return self.stub(obj.name, name)
        if isinstance(obj, AllowedType):
            return self.stub("", f"{class_label(obj.cls).removeprefix('builtins.')}.{name}")
        owner = stub_name(obj) or type(obj).__name__
        return self.stub("", f"{owner}.{name}")

    def _construct(self, cls: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if isinstance(cls, AllowedType):
            return cls.new(args, kwargs)
        if is_safe_class(cls):
            try:
                return cls.__new__(cls, *args, **kwargs)
            except Exception:  # noqa: BLE001 - odd arguments: fall back to a stub
                pass
        return self.stub("", f"{class_label(cls)}")(*args, **kwargs)

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
        real_cls, real_base = real_type(cls), real_type(base)
        if is_allowed(cls) and is_allowed(base):
            import copyreg

            if isinstance(base, AllowedType):  # base.__new__(cls, state), base.__init__(obj, state)
                why = self.check(real_base, (state,), {})
                if why is not None:
                    return self.unbuilt(cls, why)(state)
            return copyreg._reconstructor(real_cls, real_base, state)  # type: ignore[attr-defined]
        return self.stub("", class_label(cls))(state)


class SafeUnpickler(pickle.Unpickler):
    """An unpickler that builds views and stubs instead of live user objects.

    It is the C unpickler: a value that an allowlisted type refuses to be
    rebuilt from (a ``datetime`` whose ``tzinfo`` became a stub...) makes
    :meth:`load` raise; :func:`safe_loads` then reads the payload again with
    :class:`TolerantUnpickler`.
    """

    def __init__(self, file: Any, budget: int = BUDGET_FLOOR, buffers: Any = None) -> None:
        super().__init__(file, buffers=buffers)
        self.globals = _Globals(budget)

    def stub(self, module: str, qualname: str) -> StubMeta:
        return self.globals.stub(module, qualname)

    def find_class(self, module: str, name: str) -> Any:
        return self.globals.find_class(module, name)

    nested = False  # reading a list segment: no persistent ids of its own

    def persistent_load(self, pid: Any) -> Any:
        return self.globals.persistent_load(pid, nested=self.nested)


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

    def __init__(self, file: Any, budget: int = BUDGET_FLOOR, buffers: Any = None) -> None:
        super().__init__(file, buffers=buffers)
        self.globals = _Globals(budget)

    def stub(self, module: str, qualname: str) -> StubMeta:
        return self.globals.stub(module, qualname)

    def find_class(self, module: str, name: str) -> Any:
        return self.globals.find_class(module, name)

    nested = False  # reading a list segment: no persistent ids of its own

    def persistent_load(self, pid: Any) -> Any:
        return self.globals.persistent_load(pid, nested=self.nested)

    # applying what find_class handed out ----------------------------------------

    def call(self, func: Any, args: Any, kwargs: Any) -> Any:
        """``func(*args, **kwargs)``, or what stands for it if that fails."""
        if not isinstance(args, tuple) or not isinstance(kwargs, dict):
            raise pickle.UnpicklingError(f"malformed arguments for {class_label(func)}")
        try:
            return func(*args, **kwargs)
        except Exception:  # noqa: BLE001 - not rebuilt: keep what it was given
            return self.not_rebuilt(func, args, kwargs)

    def not_rebuilt(self, func: Any, args: tuple[Any, ...], kwargs: dict[Any, Any]) -> Any:
        real = real_type(func)
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
            raise pickle.UnpicklingError(f"malformed arguments for {class_label(cls)}")
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


def safe_loads(payload: bytes) -> Any:
    """Unpickle a snapshot payload into views, running no user code.

    The fast C unpickler reads it first; if it fails (an allowlisted type
    refusing a stub or a view as an argument), the pure-Python
    :class:`TolerantUnpickler` reads it again, turning such values into
    named stubs.  Only what that one cannot read either (truncated or
    malformed data) raises.
    """
    budget = max(BUDGET_FLOOR, BUDGET_RATIO * len(payload))
    stream, buffers = unframe(payload) if is_framed(payload) else (payload, None)
    with _deep_recursion():
        try:
            return SafeUnpickler(io.BytesIO(stream), budget, buffers).load()
        except Exception:  # noqa: BLE001 - retried below, which raises if it is damage
            pass
        return TolerantUnpickler(io.BytesIO(stream), budget, buffers).load()
