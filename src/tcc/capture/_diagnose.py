"""Explain a failed capture: which frame, which variable, which path.

Runs only after pickling has failed, so it may be slow.  It walks the object
graph the way the pickler does, probing each child on its own, and descends
into the first child that cannot be captured until it reaches an object
whose own parts are all fine: that object is the culprit.  The path is reset
at every generator frame on the way, so the message starts at the innermost
frame that holds the culprit:

    cannot capture agent.main() line 42 (agent.py:42): local 'client'
    -> _transport -> _pool: cannot pickle '_thread.RLock' object

When the fix is known -- a lock, or a live client, connection, socket or
open file, on the path -- a hint naming it follows: keep the object in
``tcc.resource(factory, ...)``, which is captured as "call the factory
again".  Types are recognised by module and class name only, so no client
library is imported to check.

The walk asks objects nothing they could lie about: kinds are told by
``type(obj)``, never by ``isinstance`` (which believes an object's own
``__class__``), and a child that fails to list its parts ends the descent
instead of the diagnosis.  A graph too deep to pickle is named as such, at the
variable that holds it, without walking down its whole length.
"""

from __future__ import annotations

import collections
import functools
import io
import itertools
import pickle
import re
import reprlib
import sys
import types
from typing import Any, Callable, Iterator, NamedTuple

from . import _frames, _pickler, _records

Child = tuple[str, Any]

_MAX_DEPTH = 100
_MAX_CHILDREN = 10_000
_SHOWN_PATH = 12  # labels of a longer path are elided in the middle
_TOO_DEEP = ("object graph too deep to capture: it nests deeper than pickling can go "
             "(a long linked chain, or deeply nested containers); flatten it or keep it out "
             "of the state the agent holds across an await")

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 2, 37, 37


def _short(value: Any) -> str:
    try:
        text = _REPR.repr(value)  # bounded depth: a deeply nested key must not recurse
    except Exception:  # noqa: BLE001 - a broken __repr__ must not hide the real error
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 40 else text[:37] + "..."


def _too_deep(exc: BaseException) -> bool:
    """Whether pickling failed because the graph nests too deeply."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, RecursionError):
            return True
        if isinstance(exc, pickle.PicklingError) and "recursion" in str(exc):
            return True  # cloudpickle's wrapping of RecursionError
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
        seen += 1
    return False


_EXCEPTION: dict[str, Any] = {name: vars(BaseException)[name]
                              for name in ("args", "__cause__", "__context__")}


def _is_generator(obj: Any) -> bool:
    return type(obj) in _frames.GENERATOR_TYPES


def _children(obj: Any) -> Iterator[Child]:
    """The parts of ``obj`` pickling would save, with labels.  Kinds are told by
    ``type(obj)``: ``isinstance`` would believe a ``__class__`` the object fakes."""
    t = type(obj)
    if t in _frames.GENERATOR_TYPES:
        state, _offset, slots, exc, func = _frames.native().read_frame(obj, _records.NULL)
        if state in (_frames.CREATED, _frames.SUSPENDED):
            code = _frames.code_of(obj)
            for i, value in enumerate(slots):
                if value is _records.NULL:
                    continue
                label = _frames.describe_slot(code, i)
                if type(value) is types.CellType:
                    try:
                        value = value.cell_contents
                    except ValueError:
                        continue
                yield label, value
            if exc is not _records.NULL and exc is not None:
                yield "handled exception", exc
            yield "function", func
        return
    if t is types.CellType:
        try:
            yield "cell contents", obj.cell_contents
        except ValueError:
            pass
        return
    if t is types.FunctionType:
        for name, cell in zip(obj.__code__.co_freevars, obj.__closure__ or ()):
            try:
                yield f"closure {name!r}", cell.cell_contents
            except ValueError:
                pass
        if _pickler.home_module(obj) is None:  # else its globals are not captured
            for name in obj.__code__.co_names:
                if name in obj.__globals__:
                    yield f"global {name!r}", obj.__globals__[name]
        yield "defaults", obj.__defaults__
        yield "__dict__", obj.__dict__
        return
    if t is types.MethodType:
        yield "__self__", obj.__self__
        yield "__func__", obj.__func__
        return
    if t is dict:  # subclasses (which may override items) go the __reduce_ex__ way below
        for key, value in list(dict.items(obj)):
            yield f"[{_short(key)}]", value
            yield f"key {_short(key)}", key
        return
    if t in (list, tuple, set, frozenset):
        for i, value in enumerate(list(obj)):
            yield f"[{i}]", value
        return
    if issubclass(t, BaseException):
        yield "args", _EXCEPTION["args"].__get__(obj)  # not obj.args: a subclass may override it
        yield "__dict__", getattr(obj, "__dict__", None)
        yield "__cause__", _EXCEPTION["__cause__"].__get__(obj)
        yield "__context__", _EXCEPTION["__context__"].__get__(obj)
        return
    if issubclass(t, type):
        return
    try:
        rv = obj.__reduce_ex__(5)
    except Exception:  # noqa: BLE001 - the object itself is the culprit
        return
    if not issubclass(type(rv), tuple):
        return
    args = rv[1] if len(rv) > 1 else ()
    reduced: Any = rv[2] if len(rv) > 2 else None
    if issubclass(type(reduced), tuple) and len(reduced) == 2:
        dict_state, slot_state = reduced
    else:
        dict_state, slot_state = reduced, None
    for part in (dict_state, slot_state):
        if issubclass(type(part), dict):
            for key, value in part.items():
                yield str(key), value
        elif part is not None:
            yield "state", part
    for i, value in enumerate(args or ()):
        yield f"arg {i}", value
    if len(rv) > 3 and rv[3] is not None:
        for i, value in enumerate(rv[3]):
            yield f"[{i}]", value
    if len(rv) > 4 and rv[4] is not None:
        for key, value in rv[4]:
            yield f"[{_short(key)}]", value


def _probe(obj: Any, make_pickler: Callable[[io.BytesIO], Any]) -> BaseException | None:
    try:
        make_pickler(io.BytesIO()).dump(obj)
    except RecursionError:
        return None  # too deep to judge on its own; do not descend blindly
    except Exception as exc:  # noqa: BLE001 - we are collecting the reason
        return exc
    return None


def _listed(obj: Any) -> Iterator[Child]:
    """:func:`_children`, ending quietly where the object fails to list its parts (its
    own code raised): the diagnosis stops there instead of failing."""
    parts = itertools.islice(_children(obj), _MAX_CHILDREN)
    while True:
        try:
            part = next(parts)
        except Exception:  # noqa: BLE001 - StopIteration included: no (more) parts
            return
        yield part


def explain(root: Any, original: BaseException, make_pickler: Callable[[io.BytesIO], Any]) -> str:
    """A one-line description of where ``root`` fails to capture, and why.

    If the fix is known (see :func:`hint`), it follows after ``; hint:``.
    A graph too deep to pickle is reported at the variable that holds it.
    """
    frame: str | None = None
    path: list[str] = []
    # The objects on the path from the innermost frame, each with the label
    # that leads to it (the root has none); the hint is chosen from them.
    held: list[tuple[str | None, Any]] = []
    reason: BaseException = original
    too_deep = _too_deep(original)
    obj = root
    seen = {id(root)}
    if _is_generator(root):
        frame = _frames.where(root)
    else:
        held.append((None, root))
    for _ in range(_MAX_DEPTH):
        for label, child in _listed(obj):
            if id(child) in seen:
                continue
            failure = _probe(child, make_pickler)
            if failure is None:
                continue
            seen.add(id(child))
            reason = failure
            if _is_generator(child):
                frame, path, held = _frames.where(child), [], []
            else:
                path.append(label)
                held.append((label, child))
            obj = child
            break
        else:
            break
        if too_deep and path:
            break  # the variable that holds the deep graph: walking its length says nothing more
    where = f"cannot capture {frame}" if frame else "cannot capture object"
    if len(path) > _SHOWN_PATH:
        half = _SHOWN_PATH // 2
        path = [*path[:half], f"… ({len(path) - 2 * half} more)", *path[-half:]]
    if path:
        where += ": " + " -> ".join(path)
    detail = _TOO_DEEP if too_deep or _too_deep(reason) else (str(reason) or type(reason).__name__)
    message = f"{where}: {detail}"
    if too_deep or _too_deep(reason):
        return message
    try:
        advice = hint(held)
    except Exception:  # noqa: BLE001 - a hint must never hide the real error
        advice = None
    return f"{message}; hint: {advice}" if advice else message


# ------------------------------------------------------------------ hints


class _Known(NamedTuple):
    kind: str  # "lock", "client", "connection", "socket" or "file"
    name: str  # how the type is shown, e.g. "threading.RLock"
    factory: str  # what to pass to tcc.resource, e.g. "sqlite3.connect"
    takes_args: bool  # whether the example shows "..." for the factory's arguments


# Locks and other synchronisation primitives: (module, class) -> public name.
_LOCKS: dict[tuple[str, str], str] = {
    ("_thread", "lock"): "threading.Lock",
    ("_thread", "RLock"): "threading.RLock",
    ("threading", "_RLock"): "threading.RLock",
    **{("threading", n): f"threading.{n}"
       for n in ("Condition", "Semaphore", "BoundedSemaphore", "Event", "Barrier")},
    **{("asyncio.locks", n): f"asyncio.{n}"
       for n in ("Lock", "Condition", "Semaphore", "BoundedSemaphore", "Event", "Barrier")},
    **{("multiprocessing.synchronize", n): f"multiprocessing.{n}"
       for n in ("Lock", "RLock", "Condition", "Semaphore", "BoundedSemaphore", "Event",
                 "Barrier")},
}
# Locks made without arguments in the common case; the others show "...".
_LOCKS_WITHOUT_ARGS = {"Lock", "RLock", "Condition", "Event"}

# Packages whose client, session and connection objects hold sockets, pools
# and locks; a class of theirs counts as a live client if its name (or a base
# class's) says so.
_CLIENT_PACKAGES = frozenset({
    "httpx", "httpx2", "httpcore", "httpcore2", "requests", "urllib3", "aiohttp",
    "openai", "anthropic", "mistralai", "cohere", "groq", "google",
    "http", "ftplib", "smtplib", "imaplib", "poplib", "xmlrpc",
    "psycopg", "psycopg2", "psycopg_pool", "asyncpg", "aiosqlite", "pymysql", "MySQLdb",
    "mysql", "sqlalchemy", "duckdb", "redis", "pymongo", "motor", "elasticsearch",
    "boto3", "botocore", "aiobotocore", "grpc", "websockets", "websocket", "paramiko",
})
_CLIENT_SUFFIXES = ("Client", "Session", "Connection", "ConnectionPool")
_CLIENT_NAMES = frozenset({"OpenAI", "AsyncOpenAI", "AzureOpenAI", "AsyncAzureOpenAI",
                           "Anthropic", "AsyncAnthropic", "Redis", "Engine", "AsyncEngine"})

# Objects that only pass the path on: the object to name lies beyond them.
# (So does any built-in type: containers, iterators, views, enumerate, ...)
_PLUMBING = (collections.deque, types.CellType, types.MethodType, types.FunctionType,
             types.BuiltinMethodType, types.SimpleNamespace, functools.partial, BaseException)

_GENERIC_NAMES = {"lock": "lock", "client": "client", "connection": "conn", "socket": "sock",
                  "file": "f"}
_NOT_NAMES = frozenset({"function", "defaults", "state", "args"})
_NAMED = re.compile(r"(?:local|cell variable|free variable|closure|global) '([A-Za-z_]\w*)'|"
                    r"\['([A-Za-z_]\w*)'\]|([A-Za-z]\w*)")


def _type_id(t: type) -> tuple[str, str]:
    module = getattr(t, "__module__", None)
    qualname = getattr(t, "__qualname__", None)
    return (module if type(module) is str else "",
            qualname if type(qualname) is str else "")


def _public_name(t: type) -> str:
    """``module.Class`` by the shortest module path that exports the class.

    ``openai._client.OpenAI`` -> ``openai.OpenAI``.  Only modules already
    imported are looked at, and only their namespace (no ``__getattr__``).
    """
    module, qualname = _type_id(t)
    if module in ("", "builtins", "__main__", "__mp_main__"):
        return qualname
    if "." not in qualname:
        parts = module.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            namespace = getattr(sys.modules.get(prefix), "__dict__", {})
            if namespace.get(qualname) is t:
                return f"{prefix}.{qualname}"
    return f"{module}.{qualname}"


def _is_plumbing(obj: Any) -> bool:
    return issubclass(type(obj), _PLUMBING) or _type_id(type(obj))[0] == "builtins"


def _factory_name(t: type) -> str:
    """How the example calls a holder's class: its own classes by their bare name."""
    top = _type_id(t)[0].partition(".")[0]
    if top in sys.stdlib_module_names or top in _CLIENT_PACKAGES:
        return _public_name(t)
    qualname = _type_id(t)[1]
    return qualname if qualname and "<" not in qualname else t.__name__


def _known(t: type) -> _Known | None:
    """What ``t`` is, if it is a type whose fix is known."""
    mro = [b for b in getattr(t, "__mro__", (t,)) if b is not object]
    ids = [_type_id(b) for b in mro]
    for module, qualname in ids:
        lock = _LOCKS.get((module, qualname))
        if lock is not None:
            return _Known("lock", lock, lock, lock.rpartition(".")[2] not in _LOCKS_WITHOUT_ARGS)
        if (module, qualname) in (("socket", "socket"), ("_socket", "socket")):
            return _Known("socket", _public_name(t), "socket.create_connection", True)
        if (module, qualname) == ("sqlite3", "Connection"):
            return _Known("connection", "sqlite3.Connection", "sqlite3.connect", True)
    if any(m in ("_io", "io") and q in ("_IOBase", "IOBase") for m, q in ids) and not any(
            m in ("_io", "io") and q in ("BytesIO", "StringIO") for m, q in ids):
        return _Known("file", _public_name(t), "open", True)
    for module, qualname in ids:
        if module.partition(".")[0] in _CLIENT_PACKAGES and (
                qualname in _CLIENT_NAMES or qualname.endswith(_CLIENT_SUFFIXES)):
            name = _public_name(t)
            kind = "connection" if qualname.endswith(("Connection", "ConnectionPool")) else "client"
            return _Known(kind, name, name, True)
    return None


# The modules of hashlib's hash objects (OpenSSL's and the built-in fallbacks).
_HASH_MODULES = frozenset({"_hashlib", "_blake2", "_md5", "_sha1", "_sha2", "_sha256",
                           "_sha512", "_sha3"})


def _is_hash(obj: Any) -> bool:
    """A hashlib hash object (``hashlib.sha256()``): it does not pickle, and no factory
    call rebuilds what it has absorbed."""
    return _type_id(type(obj))[0] in _HASH_MODULES and callable(getattr(obj, "hexdigest", None)) \
        and callable(getattr(obj, "update", None))


def _variable(label: str | None, default: str) -> str:
    """The variable name ``label`` gives the object it leads to, else ``default``."""
    if label is not None:
        match = _NAMED.fullmatch(label)
        if match is not None:
            name = next(g for g in match.groups() if g is not None)
            if name not in _NOT_NAMES:
                return name
    return default


def hint(held: list[tuple[str | None, Any]]) -> str | None:
    """How to fix a capture that failed on the path ``held``, if that is known.

    ``held`` lists the objects from the innermost frame's variable (or the
    captured root) down to the culprit, each with the label leading to it.
    The object to keep in ``tcc.resource`` is the outermost live client on
    the path; failing that, the first object that is more than a container
    (the variable's value), if a lock, socket, file or connection sits in
    it.
    """
    for label, obj in held:
        if _is_hash(obj):  # no resource helps: the state inside a running hash is not saved
            name = _variable(label, "h")
            return (f"a hashlib hash object ({name}) cannot be saved mid-computation: keep the "
                    "data it hashes (or each step's hexdigest()) across effects instead, and "
                    "hash it where no effect is awaited in between")
    found = [(i, label, info) for i, (label, obj) in enumerate(held)
             if (info := _known(type(obj))) is not None]
    if not found:
        return None
    clients = [f for f in found if f[2].kind == "client"]
    index, label, info = clients[0] if clients else found[0]
    if info.kind == "lock" and info.name.rpartition(".")[2] not in ("Lock", "RLock"):
        what = info.name  # threading.Event, asyncio.Semaphore, ...
    else:
        what = {
            "lock": f"lock ({info.name})",
            "client": f"live client ({info.name})",
            "connection": f"live connection ({info.name})",
            "socket": "socket",
            "file": "open file",
        }[info.kind]
    subject = f"the {what}"
    factory, takes_args = info.factory, info.takes_args
    variable = _variable(label, _GENERIC_NAMES[info.kind])
    note = ' (a file is opened again, at its start: not with mode "w", which empties it)'
    if info.kind != "file":
        note = ""
    holder = next(((i, lab, obj) for i, (lab, obj) in enumerate(held)
                   if not _is_plumbing(obj)), None)
    if not clients and holder is not None and holder[0] < index:
        # A lock (etc.) inside the variable's own object: rebuild that object.
        holder_type = type(holder[2])
        factory, takes_args, note = _factory_name(holder_type), True, ""
        article = "an" if what[:1] in "aeiou" else "a"
        subject = f"the {holder_type.__name__} that holds {article} {what}"
        snake = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", holder_type.__name__).lower()
        variable = _variable(holder[1], snake if snake.isidentifier() else "obj")
    if variable == factory.partition(".")[0]:  # queue = tcc.resource(queue.Queue)
        variable = "obj"
    example = f"{variable} = tcc.resource({factory}{', ...' if takes_args else ''})"
    return (f"keep {subject} in tcc.resource(factory, ...), which is captured as "
            f'"call the factory again"{note}, e.g. {example}')
