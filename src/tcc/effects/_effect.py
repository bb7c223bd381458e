"""The ``@tcc.effect`` decorator and the requests effects yield to the driver.

Inside a run, calling an effect does not run it: it returns an
:class:`EffectRequest`, and awaiting that yields the request up the await
chain to the driver, which journals an intent, runs the real function, journals
the completion with a snapshot, and sends the result back.  Outside a run an
effect is just its function, so tools stay unit-testable.

Request classes live at stable import paths: they sit inside snapshots.
"""

from __future__ import annotations

import functools
import inspect
import contextvars
import math
import sys
import threading
import types
from typing import Any, Callable, TypeVar, cast

from .. import errors
from ..capture import project_name
from . import _context

_REGISTRY: dict[str, "Effect"] = {}
_REGISTRY_LOCK = threading.Lock()

_R = TypeVar("_R")

_PUBLIC_NAMES = {"GatherRequest": "tcc.gather", "CheckpointRequest": "tcc.checkpoint",
                 "WaitRequest": "tcc.wait_for", "SleepRequest": "tcc.sleep",
                 "SpawnRequest": "tcc.spawn"}


class _Request:
    """Base of the requests a run's agent awaits: remembers whether it was awaited.

    Inside a run, calling an effect (or ``tcc.sleep`` ...) only makes a request;
    nothing happens until the agent awaits it.  A forgotten ``await`` would
    leave the request object in the agent's hands as if it were the answer,
    so the driver fails the run when a request made in a step was not awaited
    by the end of that step (:func:`made_requests`).  ``_site`` (file:line of
    the call) and ``_awaited`` are not pickled: a request in a snapshot was
    awaited (the frame is suspended on it).
    """

    __slots__ = ("_site", "_awaited")

    def _mark(self) -> None:
        self._awaited = True

    def _track(self, depth: int = 2) -> None:
        made = _MADE.get()
        if made is None:
            return
        frame = sys._getframe(depth)
        self._site = f"{frame.f_code.co_filename}:{frame.f_lineno}"
        self._awaited = False
        made.append(self)


_MADE: contextvars.ContextVar[list[_Request] | None] = contextvars.ContextVar("tcc_made", default=None)


def track_requests(made: list[_Request] | None) -> contextvars.Token[list[_Request] | None]:
    """Collect the requests made from now on into ``made`` (the driver, around a step)."""
    return _MADE.set(made)


def untrack_requests(token: contextvars.Token[list[_Request] | None]) -> None:
    _MADE.reset(token)


def unawaited(made: list[_Request], yielded: Any = None) -> list[_Request]:
    """The requests of ``made`` that were not awaited (nor handed to ``tcc.gather``) in
    their step; ``yielded`` is the request the step ended on, the one it awaited.

    (Awaiting is not marked inside ``__await__``: its code is part of every snapshot's
    innermost frame, and changing it would strand every suspended run.)"""
    return [r for r in made if r is not yielded and not getattr(r, "_awaited", True)]


def describe_request(req: Any) -> str:
    """``search(...)`` or ``tcc.sleep(...)``: the call that made ``req``, for messages."""
    if isinstance(req, EffectRequest):
        return f"{req.name.rpartition(':')[2]}(...)"
    if isinstance(req, WaitRequest) and req.kind == "approval":
        return "tcc.approval(...)"
    return f"{_PUBLIC_NAMES.get(type(req).__name__, type(req).__name__)}(...)"


class EffectRequest(_Request):
    """One effect call, as seen by the driver (picklable)."""

    __slots__ = ("name", "args", "kwargs")

    def __init__(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.name = name
        self.args = args
        self.kwargs = kwargs

    def __await__(self) -> Any:
        return (yield self)

    def __reduce__(self) -> Any:
        return (EffectRequest, (self.name, self.args, self.kwargs))

    def __repr__(self) -> str:
        return f"<effect {self.name}>"


class GatherRequest(_Request):
    """Several effect calls to run concurrently (``tcc.gather``)."""

    __slots__ = ("requests",)

    def __init__(self, requests: tuple[EffectRequest, ...]) -> None:
        self.requests = requests

    def __await__(self) -> Any:
        return (yield self)

    def __reduce__(self) -> Any:
        return (GatherRequest, (self.requests,))


class CheckpointRequest(_Request):
    """An explicit ``await tcc.checkpoint()``."""

    __slots__ = ()

    def __await__(self) -> Any:
        return (yield self)

    def __reduce__(self) -> Any:
        return (CheckpointRequest, ())


class WaitRequest(_Request):
    """``await tcc.wait_for(name)`` / ``tcc.approval(prompt)``: park until a signal.

    The driver fills ``wait_id``, ``key``, ``intent_seq`` and ``deadline`` the
    first time it sees the request; they travel with the snapshot.
    """

    __slots__ = ("name", "kind", "prompt", "timeout", "wait_id", "key", "intent_seq", "deadline")

    def __init__(self, name: str, kind: str = "signal", prompt: str | None = None,
                 timeout: float | None = None) -> None:
        self.name = name
        self.kind = kind
        self.prompt = prompt
        self.timeout = timeout
        self.wait_id: str | None = None
        self.key: str | None = None
        self.intent_seq: int | None = None
        self.deadline: float | None = None

    def __await__(self) -> Any:
        return (yield self)

    def __getstate__(self) -> Any:
        return {k: getattr(self, k) for k in self.__slots__}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            setattr(self, k, v)

    def __repr__(self) -> str:
        return f"<wait {self.wait_id or self.name}>"


class SleepRequest(_Request):
    """``await tcc.sleep(seconds)``: a durable timer until ``until`` (epoch seconds)."""

    __slots__ = ("until", "key", "intent_seq")

    def __init__(self, until: float) -> None:
        self.until = until
        self.key: str | None = None
        self.intent_seq: int | None = None

    def __await__(self) -> Any:
        return (yield self)

    def __getstate__(self) -> Any:
        return {k: getattr(self, k) for k in self.__slots__}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            setattr(self, k, v)


class SpawnRequest(_Request):
    """``await tcc.spawn(fn, *args)``: run ``fn`` as a child run and return its result."""

    __slots__ = ("func", "args")

    def __init__(self, func: str, args: tuple[Any, ...]) -> None:
        self.func = func
        self.args = args

    def __await__(self) -> Any:
        return (yield self)

    def __reduce__(self) -> Any:
        return (SpawnRequest, (self.func, self.args))


class Effect:
    """A function whose calls are journaled and run once per call.

    The driver finds the function to run by the effect's *name* (a request
    and the journal carry only the name), so a name belongs to one effect:
    see :func:`_register`.  On a class an effect binds like a function: a
    call through an instance passes the instance as the first argument (and
    it is journaled with the other arguments); ``@staticmethod`` and
    ``@classmethod`` may be stacked on either side of ``@tcc.effect``.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        retries: int = 0,
        timeout: float | None = None,
        verify: Callable[..., Any] | None = None,
        retry_delay: float = 0.2,
    ) -> None:
        if retries < 0:
            raise ValueError("retries must be >= 0")
        if timeout is not None and not 0 < timeout < math.inf:  # also refuses NaN
            raise ValueError(f"timeout must be a finite number of seconds > 0 (or None), not {timeout!r}")
        if not 0 <= retry_delay < math.inf:  # also refuses NaN
            raise ValueError(f"retry_delay must be a finite number of seconds >= 0, not {retry_delay!r}")
        # ``@tcc.effect`` above ``@staticmethod``/``@classmethod``: wrap the
        # function and remember how a class attribute access must bind it.
        self._binds = "instance"
        if isinstance(fn, staticmethod):
            fn, self._binds = fn.__func__, "static"
        elif isinstance(fn, classmethod):
            fn, self._binds = fn.__func__, "class"
        self.fn = fn
        self.name = name or f"{fn.__module__}:{fn.__qualname__}"
        # its name as the project names it (the same on a run's recorded code, whose module
        # is named __tcc_pinned_...): what journals, events, messages and tcc.current() say
        self.public_name = project_name(self.name)
        self.retries = retries
        self.timeout = timeout
        self.verify = verify
        self.retry_delay = retry_delay
        self.is_async = inspect.iscoroutinefunction(fn)
        functools.update_wrapper(self, fn)
        # The defining module's spec now: importlib.reload replaces it (_reexecuted).
        self._spec = getattr(fn, "__globals__", {}).get("__spec__")
        _register(self)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _context.active() is None:
            return self.fn(*args, **kwargs)
        return _switch_if_sync(EffectRequest(self.name, args, kwargs))

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        """Bind like a function: ``obj.method(x)`` calls the effect with ``(obj, x)``."""
        if self._binds == "static":
            return self
        if self._binds == "class":
            return types.MethodType(self, owner if owner is not None else type(instance))
        if instance is None:
            return self
        return types.MethodType(self, instance)

    def __reduce__(self) -> Any:
        return (lookup, (self.name,))

    def __repr__(self) -> str:
        return f"<tcc.effect {self.name}>"


def _register(new: Effect) -> None:
    """Register ``new`` under its name, refusing a name that would make dispatch ambiguous.

    A name already held by another effect is taken over only when that is
    safe:

    - the other effect's module was executed again (the same module, or the
      same ``def`` of the same file under another module name, in a new
      module namespace or in the same namespace with a new ``__spec__``:
      ``importlib.reload``, a script loaded again, a script that its tests
      import too): the newer definition is the live one, as it is for
      pickling by reference;
    - or the two are interchangeable: the same code, globals, defaults,
      closure contents and options (a ``def`` that ran again with nothing
      that differs, e.g. a helper called twice).

    Anything else -- a factory that built two effects with different closure
    variables, a ``def`` repeated in one module, the same function wrapped
    twice with different options, two modules that chose the same ``name=``
    -- raises :class:`~tcc.errors.UsageError` at decoration
    time: calls are dispatched by name, so one effect would silently run the
    other's code.
    """
    with _REGISTRY_LOCK:
        old = _REGISTRY.get(new.name)
        if old is not None and old is not new and not _reexecuted(old, new) \
                and not _interchangeable(old, new):
            raise errors.UsageError(_duplicate_message(old, new))
        _REGISTRY[new.name] = new


def _reexecuted(old: Effect, new: Effect) -> bool:
    """``new`` is ``old``'s definition, executed again in a later load of its module."""
    old_globals = getattr(old.fn, "__globals__", None)
    new_globals = getattr(new.fn, "__globals__", None)
    if not isinstance(old_globals, dict) or not isinstance(new_globals, dict):
        return False
    # The same module, or the same `def` in the same file loaded under another
    # module name (a script run by tcc and imported by its tests).
    where = _definition(old.fn)
    if old_globals.get("__name__") != new_globals.get("__name__") and (
            where is None or where != _definition(new.fn)):
        return False
    # A new namespace: the module was loaded again.  The same namespace with
    # a new spec: importlib.reload, which sets __spec__ before re-executing.
    return old_globals is not new_globals or old._spec is not new._spec


def _definition(fn: Callable[..., Any]) -> tuple[str, int] | None:
    code = getattr(fn, "__code__", None)
    return None if code is None else (code.co_filename, code.co_firstlineno)


def _interchangeable(old: Effect, new: Effect) -> bool:
    """Calling either effect would do the same thing with the same options."""
    if (old.retries, old.timeout, old.retry_delay, old._binds) != (
        new.retries, new.timeout, new.retry_delay, new._binds
    ) or old.verify is not new.verify:
        return False
    a, b = old.fn, new.fn
    if a is b:
        return True
    if not (isinstance(a, types.FunctionType) and isinstance(b, types.FunctionType)):
        return False
    return (
        a.__code__ is b.__code__
        and a.__globals__ is b.__globals__
        and _same_items(a.__defaults__ or (), b.__defaults__ or ())
        and _same_items(tuple((a.__kwdefaults__ or {}).items()), tuple((b.__kwdefaults__ or {}).items()))
        and _same_items(tuple(_cell(c) for c in a.__closure__ or ()),
                        tuple(_cell(c) for c in b.__closure__ or ()))
    )


_EMPTY_CELL = object()


def _cell(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # not assigned yet
        return _EMPTY_CELL


def _same_items(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return len(a) == len(b) and all(
        x is y or (isinstance(x, tuple) and isinstance(y, tuple) and _same_items(x, y))
        for x, y in zip(a, b)
    )


def _where(fn: Callable[..., Any]) -> str:
    code = getattr(fn, "__code__", None)
    if code is None:
        return repr(fn)
    return f"{code.co_filename}:{code.co_firstlineno}"


def _duplicate_message(old: Effect, new: Effect) -> str:
    same_def = getattr(old.fn, "__code__", None) is getattr(new.fn, "__code__", object())
    why = (
        "the same `def` ran twice with different closure variables, defaults or options "
        "(a factory function?); derive the name from what differs, e.g. "
        "@tcc.effect(name=f\"tool-{label}\")"
        if same_def else "give each effect its own name with @tcc.effect(name=...)"
    )
    return (
        f"two different effects are named {new.name!r} (defined at {_where(old.fn)} and "
        f"{_where(new.fn)}): a run dispatches effect calls by name, so one would silently run "
        f"the other's code; {why}"
    )


def _switch_if_sync(request: _R) -> _R:
    """In a sync run (a greenlet), hand the request to the driver and return its answer.

    In an async run, the request comes back to be awaited, and is remembered
    (with the file:line of the caller's call) so that the driver can fail a
    run whose agent forgot the ``await``.  Typed for the async case, as the
    public helpers that call this are.
    """
    greenlet = sys.modules.get("greenlet")
    if greenlet is not None:
        current = greenlet.getcurrent()
        if type(current).__name__ == "SyncRun" and current.parent is not None:
            return cast(_R, current.parent.switch(request))
    if isinstance(request, _Request):
        request._track(3)  # _track <- here <- Effect.__call__ / tcc.sleep ... <- the caller
    return request


def lookup(name: str) -> Effect:
    """The effect registered under ``name`` (its module must be imported)."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise LookupError(
            f"no tcc effect named {name!r} is registered; is its module imported?"
        ) from None


def effect(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    retries: int = 0,
    timeout: float | None = None,
    verify: Callable[..., Any] | None = None,
    retry_delay: float = 0.2,
) -> Any:
    """Declare a side effect: ``@tcc.effect`` or ``@tcc.effect(retries=3, timeout=30)``.

    Calls are dispatched by ``name`` (default ``module:qualname``), so it must
    belong to one effect: a second, different effect of that name raises
    :class:`~tcc.errors.UsageError` (see :func:`_register`).  ``timeout``
    bounds one attempt: an async effect is cancelled, a sync one fails the
    attempt while its thread runs to the end, and the next attempt waits for
    it.  A failed attempt is retried after ``retry_delay`` seconds, doubled
    for each further retry (SIGTERM during the wait stops the run; resumed,
    the retry runs).  On a class, ``obj.method(x)`` passes (and journals) ``obj``.

    ``verify(intent)`` is called before re-issuing a call that was in flight
    at a crash; if it returns anything but None, that is taken as the call's
    result and the effect is not run again.  ``intent`` has ``name``,
    ``args``, ``kwargs``, ``idempotency_key`` and ``attempt``.
    """

    def wrap(f: Callable[..., Any]) -> Effect:
        return Effect(f, name=name, retries=retries, timeout=timeout, verify=verify,
                      retry_delay=retry_delay)

    return wrap(fn) if fn is not None else wrap


def gather(*calls: Any) -> GatherRequest:
    """Run several effect calls concurrently; each is journaled on its own."""
    bad = [c for c in calls if not isinstance(c, EffectRequest)]
    if bad:
        raise TypeError(
            "tcc.gather() takes effect calls made inside a run, e.g. "
            f"tcc.gather(search('a'), search('b')); got {bad[0]!r}"
        )
    for call in calls:
        call._mark()  # awaited through the gather
    return _switch_if_sync(GatherRequest(tuple(calls)))


def wait_for(name: str, timeout: float | None = None) -> WaitRequest:
    """``value = await tcc.wait_for("name")``: suspend durably until a signal arrives.

    Signals are sent with ``tcc signal RUN_ID NAME --value JSON``; a signal
    sent before the run waits is kept until it does.  Each wait on a name
    consumes the next signal of that name, exactly once.  With ``timeout``
    (seconds from the first time the run reaches the wait), TimeoutError is
    raised inside the agent once it has passed.
    """
    check_signal_name(name)
    return _switch_if_sync(WaitRequest(name, "signal", None, timeout))


def approval(prompt: str, *, timeout: float | None = None) -> WaitRequest:
    """``ok = await tcc.approval("Deploy?")``: True/False from ``tcc approve``/``tcc reject``."""
    return _switch_if_sync(WaitRequest("approval", "approval", prompt, timeout))


def sleep(seconds: float) -> SleepRequest:
    """``await tcc.sleep(seconds)``: a durable timer; long sleeps leave the run `sleeping`."""
    import time

    return _switch_if_sync(SleepRequest(time.time() + max(0.0, float(seconds))))


def sleep_until(when: Any) -> SleepRequest:
    """``await tcc.sleep_until(datetime)`` (an aware datetime, or epoch seconds)."""
    stamp = when.timestamp() if hasattr(when, "timestamp") else float(when)
    return _switch_if_sync(SleepRequest(stamp))


_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:+=-")


def check_signal_name(name: str) -> None:
    """ValueError unless ``name`` can name a signal (``tcc.wait_for(name)``, ``tcc signal``)."""
    if not (isinstance(name, str) and 0 < len(name) <= 100 and set(name) <= _NAME_CHARS):
        raise ValueError(
            f"invalid signal name {name!r}: use 1-100 characters from A-Z a-z 0-9 . _ : + = -"
        )


def spawn(fn: Callable[..., Any], *args: Any) -> SpawnRequest:
    """``result = await tcc.spawn(fn, *args)``: a child run with its own journal and snapshots.

    ``fn`` is an ``async def`` (or plain ``def``) at the top level of the agent's
    script; ``args`` must be JSON values.  The child's id is derived from the
    parent's, so a parent that resumes after a crash re-attaches to the child
    instead of starting it twice.
    """
    name = getattr(fn, "__name__", None)
    if not callable(fn) or not name or getattr(fn, "__qualname__", name) != name:
        raise TypeError(f"tcc.spawn() needs a top-level function of the script, not {fn!r}")
    import json

    try:
        json.dumps(args)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"tcc.spawn() arguments must be JSON values: {exc}") from None
    return _switch_if_sync(SpawnRequest(name, tuple(args)))


def checkpoint(label: str | None = None) -> CheckpointRequest:
    """``await tcc.checkpoint()`` snapshots the run at this point.

    ``label`` (a string literal) names this point, and the await sites after it up to the
    next label, for ``tcc upgrade``: a suspended frame is mapped onto the new code by
    label first, so an await site added elsewhere does not make its mapping ambiguous.
    """
    if label is not None and not isinstance(label, str):
        raise TypeError(f"tcc.checkpoint(label): the label must be a string, not {type(label).__name__}")
    return _switch_if_sync(CheckpointRequest())
