"""In-process runs: drive an agent as ``tcc run`` does, serving its requests without a store.

:func:`run`, :func:`arun` and :func:`run_script`; what each request does is in the
``tcc.testing`` docstring.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import sys
import threading
from typing import Any, Callable, Coroutine, Generator, Mapping, Union

from .. import errors
from ..capture import ATOMS, dump_payload, load_payload
from ..effects import (
    CheckpointRequest,
    Current,
    Effect,
    EffectRequest,
    GatherRequest,
    SleepRequest,
    SpawnRequest,
    WaitRequest,
    lookup,
    reset_current,
    reusing_live_resources,
    set_current,
    step_agent,
    unawaited,
)
from ._answers import Answers, Approvals, MissingAnswerError

# tcc.runtime (and with it the store) is imported where it is needed, not here: importing
# tcc.testing costs no more than importing tcc.

# ("send", value) or ("throw", exception): what goes into the agent next.
_Pending = tuple[str, Any]
_Fakes = Mapping[Union[Effect, str], Callable[..., Any]]


def _with_current(current: Current, fn: Callable[..., Any], args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> Any:
    """Call ``fn`` with ``current`` set; run inside a copied context (no reset needed)."""
    set_current(current)
    return fn(*args, **kwargs)


class _Call:
    """One effect call: its attempts (``retries``), each with ``tcc.current()`` set."""

    def __init__(self, effect: Effect, fn: Callable[..., Any], args: tuple[Any, ...],
                 kwargs: dict[str, Any], run_id: str, key: str) -> None:
        self.effect = effect
        self.fn = fn
        # Journaled form of the arguments: each attempt gets a fresh copy, as in a real run
        # (an effect never mutates the agent's own objects), and what a real run could not
        # journal fails here too.
        self.blob = dump_payload((args, kwargs))
        self.run_id = run_id
        self.key = key
        self.is_async = inspect.iscoroutinefunction(fn)

    @staticmethod
    def _as_journaled(value: Any) -> Any:
        """The result as a run sends it: a copy, as the journal recorded it (an effect that
        returns a module-level dict or a cached object must not hand the agent shared
        objects here and copies in a run); immutable values as they are."""
        if type(value) in ATOMS or type(value) is complex:
            return value
        blob = dump_payload(value)  # a result a run could not journal fails here too
        try:
            with reusing_live_resources():  # a tcc.resource in it stays the live one
                return load_payload(blob)
        except Exception:  # noqa: BLE001 - it pickles but does not load: as a run does
            return value  # (the object as it is; a resume would fail on the journal)

    def _current(self, attempt: int) -> Current:
        return Current(self.run_id, self.effect.public_name, self.key, attempt)

    def _fresh(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """A new copy of the arguments (a tcc.resource in them stays the live one)."""
        with reusing_live_resources():
            args, kwargs = load_payload(self.blob)
        return args, kwargs

    @staticmethod
    def _failed(exc: Exception) -> _Pending:
        if isinstance(exc, StopIteration):  # as the driver: it cannot be thrown into a coroutine
            return ("throw", RuntimeError(f"effect raised StopIteration: {exc}"))
        return ("throw", exc)

    def here(self) -> _Pending:
        """A sync function, in this thread (in a copy of the current context)."""
        outcome: _Pending = ("send", None)
        for attempt in range(1, self.effect.retries + 2):
            args, kwargs = self._fresh()
            try:
                call = functools.partial(_with_current, self._current(attempt), self.fn, args, kwargs)
                value = _bounded_sync(self.effect, functools.partial(contextvars.copy_context().run, call))
            except Exception as exc:  # noqa: BLE001 - thrown into the agent, as in a run
                outcome = self._failed(exc)
                continue
            return ("send", self._as_journaled(value))
        return outcome

    async def on_loop(self, threads: bool) -> _Pending:
        """An async function on the running loop; a sync one in a thread if ``threads``,
        else in the loop's thread."""
        outcome: _Pending = ("send", None)
        for attempt in range(1, self.effect.retries + 2):
            args, kwargs = self._fresh()
            try:
                if self.is_async:
                    value = await self._bounded(attempt, args, kwargs)
                else:
                    call = functools.partial(_with_current, self._current(attempt), self.fn, args, kwargs)
                    if threads or self.effect.timeout is not None:
                        value = await asyncio.to_thread(
                            _bounded_sync, self.effect, functools.partial(contextvars.copy_context().run, call))
                    else:
                        value = contextvars.copy_context().run(call)
            except Exception as exc:  # noqa: BLE001 - thrown into the agent, as in a run
                outcome = self._failed(exc)
                continue
            return ("send", self._as_journaled(value))
        return outcome

    async def _bounded(self, attempt: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        token = set_current(self._current(attempt))
        try:
            timeout = self.effect.timeout
            if timeout is None:
                return await self.fn(*args, **kwargs)
            deadline = asyncio.timeout(timeout)
            try:
                async with deadline:
                    return await self.fn(*args, **kwargs)
            except TimeoutError:
                if not deadline.expired():
                    raise  # the function's own TimeoutError
                raise TimeoutError(f"effect {self.effect.public_name!r} timed out after {timeout:g} s "
                                   "(it was cancelled)") from None
        finally:
            reset_current(token)


# The threads of timed-out sync calls that still run, by effect: the next call of that
# effect starts after them, as in a run (tcc.runtime._attempts).
_STUCK: dict[str, list[threading.Event]] = {}


def _bounded_sync(effect: Any, call: Callable[[], Any]) -> Any:
    """``call()`` of a sync effect, bounded by its ``timeout`` as a run bounds it: in a
    thread of its own, which cannot be stopped, so at the timeout the attempt fails with the
    run's TimeoutError and the thread runs to its end (the next call waits for it)."""
    for ended in _STUCK.pop(effect.name, []):
        ended.wait(max(effect.timeout or 0.0, 1.0) * 10)  # (bounded: a test must not hang on it)
    if effect.timeout is None:
        return call()
    box: dict[str, Any] = {}
    ended = threading.Event()

    def target() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc
        finally:
            ended.set()

    threading.Thread(target=target, name=f"tcc-testing {effect.public_name}", daemon=True).start()
    if not ended.wait(effect.timeout):
        _STUCK.setdefault(effect.name, []).append(ended)
        raise TimeoutError(f"effect {effect.public_name!r} timed out after {effect.timeout:g} s (its "
                           "thread cannot be stopped and runs to the end; the next attempt or call "
                           "of this effect starts after it)")
    if "error" in box:
        raise box["error"]
    return box["value"]


# What the trampoline asks its runner to execute: one call, or the calls of a gather.
_Work = Union[_Call, list[_Call]]


def _make_task(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], run_id: str) -> Any:
    """The coroutine (or, for a plain ``def``, the greenlet task) to drive."""
    if inspect.iscoroutine(func):
        if args or kwargs:
            raise TypeError("tcc.testing.run() got a coroutine and arguments; pass one or the other")
        return func
    if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func) or not callable(func):
        raise TypeError(f"tcc.testing.run() needs an `async def` or a plain `def` function, or a "
                        f"coroutine, not {func!r}")
    if inspect.iscoroutinefunction(func):
        return func(*args, **kwargs)
    from ..runtime import GreenletTask  # a plain `def` entry: a greenlet, as in tcc run

    return GreenletTask(functools.partial(func, **kwargs) if kwargs else func, args, run_id)


def _namespace(func: Any) -> dict[str, Any]:
    """Where ``tcc.spawn`` looks functions up by name: the entry function's module."""
    if inspect.iscoroutine(func):
        frame = func.cr_frame
        return dict(frame.f_globals) if frame is not None else {}
    target = inspect.unwrap(func)
    while isinstance(target, functools.partial):
        target = inspect.unwrap(target.func)
    found = getattr(target, "__globals__", None)
    if isinstance(found, dict):
        return found
    module = sys.modules.get(getattr(target, "__module__", "") or "")
    return vars(module) if module is not None else {}


def _forgotten(made: list[Any], during: BaseException | None = None,
               yielded: Any = None) -> errors.UnawaitedEffectError:
    """The error a real run fails with when the agent made a request it never awaited."""
    from ..runtime import forgotten_await

    return forgotten_await(made, during, yielded)


def _close(task: Any) -> None:
    """Close an agent that stops mid-way (its ``finally`` blocks run); errors are dropped,
    as the error that stopped it is already on its way out."""
    try:
        task.close()
    except Exception:  # noqa: BLE001, S110 - e.g. "coroutine ignored GeneratorExit"
        pass


class _Trampoline:
    """Steps one run like the driver does, answering each request without a store.

    :meth:`drive` is a generator: it yields the effect work to execute (a
    :class:`_Call`, or a list for a gather) and receives the outcomes, so the
    same stepping serves :func:`run` (a private loop) and :func:`arun` (the
    caller's loop).
    """

    def __init__(self, run_id: str, answers: Answers, fakes: dict[str, Callable[..., Any]],
                 namespace: dict[str, Any]) -> None:
        self.run_id = run_id
        self.answers = answers
        self.fakes = fakes
        self.namespace = namespace
        self.calls = 0
        self.waits: dict[str, int] = {}

    def _key(self) -> str:
        self.calls += 1
        return f"{self.run_id}:{self.calls}"

    def drive(self, task: Any) -> Generator[_Work, Any, Any]:
        pending: _Pending = ("send", None)
        done = False
        try:
            while True:
                made: list[Any] = []  # requests made in this step: each must be awaited
                try:
                    request = step_agent(task, pending, self.run_id, made)
                except StopIteration as stop:
                    done = True
                    if unawaited(made):
                        raise _forgotten(made) from None
                    return stop.value
                except Exception as exc:
                    done = True  # the agent raised: it is finished
                    if unawaited(made):  # most likely it used a request as a value
                        raise _forgotten(made, exc)  # noqa: B904 - its context is exc, as in a run
                    raise
                except BaseException:
                    done = True
                    raise
                if unawaited(made, request):
                    raise _forgotten(made, yielded=request)
                pending = yield from self._answer(request)
        finally:
            if not done:
                _close(task)

    def _call(self, request: EffectRequest, key: str) -> _Call:
        try:
            effect = lookup(request.name)
        except LookupError as exc:
            raise errors.RunFailedError(str(exc)) from None
        fn = self.fakes.get(effect.name, effect.fn)
        return _Call(effect, fn, tuple(request.args), dict(request.kwargs), self.run_id, key)

    def _answer(self, request: Any) -> Generator[_Work, Any, _Pending]:
        if isinstance(request, EffectRequest):
            outcome: _Pending = yield self._call(request, self._key())
            return outcome
        if isinstance(request, GatherRequest):
            base = self._key()
            calls = [self._call(r, f"{base}.{i}") for i, r in enumerate(request.requests)]
            outcomes: list[_Pending] = (yield calls) if calls else []
            for outcome in outcomes:
                if outcome[0] == "throw":
                    return outcome
            return ("send", [outcome[1] for outcome in outcomes])
        if isinstance(request, CheckpointRequest):
            return ("send", None)
        if isinstance(request, SleepRequest):
            self._key()
            return ("send", None)
        if isinstance(request, WaitRequest):
            self._key()
            return self._wait(request)
        if isinstance(request, SpawnRequest):
            key = self._key()
            return (yield from self._spawn(request, f"{self.run_id}.{key.rpartition(':')[2]}"))
        if request is None:  # a bare `yield` / asyncio.sleep(0)
            return ("send", None)
        from ..runtime import unsupported_await

        return ("throw", unsupported_await(request))

    def _wait(self, request: WaitRequest) -> _Pending:
        occurrence = self.waits.get(request.name, 0) + 1
        self.waits[request.name] = occurrence
        wait_id = f"{request.name}@{occurrence}"
        found, value = self.answers.answer(request.kind, request.name, occurrence, request.prompt)
        if found:
            return ("send", bool(value) if request.kind == "approval" else value)
        if request.timeout is not None:
            return ("throw", TimeoutError(f"no signal {wait_id!r} within {request.timeout} s"))
        raise MissingAnswerError(self.answers.missing(request.kind, request.name, wait_id,
                                                      request.prompt))

    def _spawn(self, request: SpawnRequest, child_id: str) -> Generator[_Work, Any, _Pending]:
        func = self.namespace.get(request.func)
        where = self.namespace.get("__file__") or self.namespace.get("__name__") or "the script"
        if func is None or not callable(func):
            return ("throw", TypeError(f"tcc.spawn({request.func}): {where} has no function "
                                       f"{request.func!r}"))
        try:
            inspect.signature(func).bind(*request.args)
        except TypeError as exc:
            return ("throw", TypeError(
                f"tcc.spawn({request.func}): it cannot be called with the arguments "
                f"{list(request.args)!r}: {exc}"))
        except ValueError:  # no signature to check: the call will tell
            pass
        child = _Trampoline(child_id, self.answers, self.fakes, self.namespace)
        try:
            value = yield from child.drive(_make_task(func, tuple(request.args), {}, child_id))
        except MissingAnswerError:
            raise  # the test's setup, not the child's failure
        except Exception as exc:  # noqa: BLE001 - the child run failed: the parent's error
            return ("throw", errors.RunFailedError(f"child run {child_id} failed: {exc}"))
        return ("send", value)


def _prepare(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], run_id: str,
             signals: Mapping[str, Any] | None, approvals: Approvals,
             fakes: _Fakes | None) -> tuple[_Trampoline, Any]:
    by_name: dict[str, Callable[..., Any]] = {}
    for key, fake in (fakes or {}).items():
        if isinstance(key, Effect):
            by_name[key.name] = fake
        elif isinstance(key, str):
            by_name[key] = fake
        else:
            raise TypeError(f"fakes keys are effects or effect names, not {key!r}")
    trampoline = _Trampoline(run_id, Answers(signals, approvals), by_name, _namespace(func))
    return trampoline, _make_task(func, args, kwargs, run_id)


class _Steps:
    """A run's :meth:`_Trampoline.drive` seen from the runner that executes its work
    (:func:`run` on a loop of its own, :func:`arun` on the caller's)::

        with _Steps(trampoline, task) as steps:
            for work in steps:
                steps.outcome = execute(work)  # what the agent's requests gave
        return steps.result

    An exception that leaves the ``with`` while the agent is suspended (executing its
    work raised a SystemExit, a KeyboardInterrupt, a cancellation: an effect's own
    Exception goes into the agent instead) closes the agent, so its ``finally`` blocks run.
    """

    def __init__(self, trampoline: _Trampoline, task: Any) -> None:
        self._drive = trampoline.drive(task)
        self.outcome: Any = None  # sent in when the next work is asked for
        self.result: Any = None   # the agent's return value, once the iteration ended

    def __enter__(self) -> _Steps:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._drive.close()  # a no-op once the agent has returned or raised

    def __iter__(self) -> _Steps:
        return self

    def __next__(self) -> _Work:
        try:
            return self._drive.send(self.outcome)
        except StopIteration as stop:
            self.result = stop.value
            raise StopIteration from None


def run(func: Callable[..., Any] | Coroutine[Any, Any, Any], /, *args: Any,
        signals: Mapping[str, Any] | None = None, approvals: Approvals = None,
        fakes: _Fakes | None = None, run_id: str = "test", **kwargs: Any) -> Any:
    """Run the agent ``func(*args, **kwargs)`` in this process, effects executed directly;
    return its result (its exception propagates).  See the ``tcc.testing`` docstring."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError("tcc.testing.run() cannot run inside a running event loop (an async "
                           "test?): use `await tcc.testing.arun(...)` there")
    trampoline, task = _prepare(func, args, kwargs, run_id, signals, approvals, fakes)
    loop: asyncio.AbstractEventLoop | None = None

    def on_loop(aw: Coroutine[Any, Any, Any]) -> Any:
        nonlocal loop
        if loop is None:
            loop = asyncio.new_event_loop()
        return loop.run_until_complete(aw)

    def execute(work: _Work) -> Any:
        if isinstance(work, _Call):
            return on_loop(work.on_loop(threads=False)) if work.is_async else work.here()
        outcomes: list[_Pending | None] = [None if c.is_async else c.here() for c in work]
        concurrent_calls = [c for c in work if c.is_async]
        if concurrent_calls:
            async def together() -> list[_Pending]:
                return list(await asyncio.gather(*(c.on_loop(threads=False) for c in concurrent_calls)))

            answered = iter(on_loop(together()))
            outcomes = [o if o is not None else next(answered) for o in outcomes]
        return outcomes

    try:
        with _Steps(trampoline, task) as steps:
            for work in steps:
                steps.outcome = execute(work)
        return steps.result
    finally:
        if loop is not None:
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                loop.close()


async def arun(func: Callable[..., Any] | Coroutine[Any, Any, Any], /, *args: Any,
               signals: Mapping[str, Any] | None = None, approvals: Approvals = None,
               fakes: _Fakes | None = None, run_id: str = "test", **kwargs: Any) -> Any:
    """:func:`run` on the running event loop: ``result = await tcc.testing.arun(main, ...)``.

    Async effects run on this loop, sync ones in worker threads."""
    trampoline, task = _prepare(func, args, kwargs, run_id, signals, approvals, fakes)
    with _Steps(trampoline, task) as steps:
        for work in steps:
            if isinstance(work, _Call):
                steps.outcome = await work.on_loop(threads=True)
            else:
                steps.outcome = list(await asyncio.gather(*(c.on_loop(threads=True) for c in work)))
    return steps.result


def run_script(script: str, /, *args: Any, signals: Mapping[str, Any] | None = None,
               approvals: Approvals = None, fakes: _Fakes | None = None,
               run_id: str = "test") -> Any:
    """Load ``path.py[:func]`` as ``tcc run`` does and :func:`run` its entry (``main``)."""
    from ..runtime import load_script, split_entry  # what tcc run does with the script

    path, name = split_entry(script)
    module = load_script(path)
    func = getattr(module, name, None)
    if func is None or not callable(func):
        raise errors.UsageError(f"{path} has no function {name!r}")
    return run(func, *args, signals=signals, approvals=approvals, fakes=fakes, run_id=run_id)
