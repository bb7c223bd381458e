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
import sys
from typing import Any, Callable, TypeVar, cast

from . import _context

_REGISTRY: dict[str, "Effect"] = {}

_R = TypeVar("_R")


class EffectRequest:
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


class GatherRequest:
    """Several effect calls to run concurrently (``tcc.gather``)."""

    __slots__ = ("requests",)

    def __init__(self, requests: tuple[EffectRequest, ...]) -> None:
        self.requests = requests

    def __await__(self) -> Any:
        return (yield self)

    def __reduce__(self) -> Any:
        return (GatherRequest, (self.requests,))


class CheckpointRequest:
    """An explicit ``await tcc.checkpoint()``."""

    __slots__ = ()

    def __await__(self) -> Any:
        return (yield self)

    def __reduce__(self) -> Any:
        return (CheckpointRequest, ())


class WaitRequest:
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


class SleepRequest:
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


class SpawnRequest:
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
    """A function whose calls are journaled and run once per call."""

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
        if timeout is not None and timeout <= 0:
            raise ValueError("timeout must be > 0")
        self.fn = fn
        self.name = name or f"{fn.__module__}:{fn.__qualname__}"
        self.retries = retries
        self.timeout = timeout
        self.verify = verify
        self.retry_delay = retry_delay
        self.is_async = inspect.iscoroutinefunction(fn)
        functools.update_wrapper(self, fn)
        _REGISTRY[self.name] = self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _context.active() is None:
            return self.fn(*args, **kwargs)
        return _switch_if_sync(EffectRequest(self.name, args, kwargs))

    def __reduce__(self) -> Any:
        return (lookup, (self.name,))

    def __repr__(self) -> str:
        return f"<tcc.effect {self.name}>"


def _switch_if_sync(request: _R) -> _R:
    """In a sync run (a greenlet), hand the request to the driver and return its answer.

    Typed for the async case (the request itself comes back, to be awaited),
    as the public helpers that call this are.
    """
    greenlet = sys.modules.get("greenlet")
    if greenlet is not None:
        current = greenlet.getcurrent()
        if type(current).__name__ == "SyncRun" and current.parent is not None:
            return cast(_R, current.parent.switch(request))
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
) -> Any:
    """Declare a side effect: ``@tcc.effect`` or ``@tcc.effect(retries=3, timeout=30)``.

    ``verify(intent)`` is called before re-issuing a call that was in flight
    at a crash; if it returns anything but None, that is taken as the call's
    result and the effect is not run again.  ``intent`` has ``name``,
    ``args``, ``kwargs``, ``idempotency_key`` and ``attempt``.
    """

    def wrap(f: Callable[..., Any]) -> Effect:
        return Effect(f, name=name, retries=retries, timeout=timeout, verify=verify)

    return wrap(fn) if fn is not None else wrap


def gather(*calls: Any) -> GatherRequest:
    """Run several effect calls concurrently; each is journaled on its own."""
    bad = [c for c in calls if not isinstance(c, EffectRequest)]
    if bad:
        raise TypeError(
            "tcc.gather() takes effect calls made inside a run, e.g. "
            f"tcc.gather(search('a'), search('b')); got {bad[0]!r}"
        )
    return _switch_if_sync(GatherRequest(tuple(calls)))


def wait_for(name: str, timeout: float | None = None) -> WaitRequest:
    """``value = await tcc.wait_for("name")``: suspend durably until a signal arrives.

    Signals are sent with ``tcc signal RUN_ID NAME --value JSON``; a signal
    sent before the run waits is kept until it does.  Each wait on a name
    consumes the next signal of that name, exactly once.  With ``timeout``
    (seconds from the first time the run reaches the wait), TimeoutError is
    raised inside the agent once it has passed.
    """
    _check_name(name)
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


def _check_name(name: str) -> None:
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


def checkpoint() -> CheckpointRequest:
    """``await tcc.checkpoint()`` snapshots the run at this point."""
    return _switch_if_sync(CheckpointRequest())
