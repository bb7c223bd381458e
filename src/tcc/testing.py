"""Testing agents: run one in-process without the runtime, and crash it at every step.

**In-process runs.**  Outside a run an effect is just its function, so a plain
``asyncio.run(main())`` breaks as soon as the agent awaits a *sync* effect (its
value is not awaitable) or calls ``tcc.gather``.  :func:`run` drives the agent
the way ``tcc run`` does, in this process, with no store, no journal and no
snapshots::

    import tcc.testing
    from my_agent import main, llm

    def test_agent():
        result = tcc.testing.run(main, "topic", signals={"note": "hi"}, approvals=True,
                                 fakes={llm: lambda prompt: "fake answer"})
        assert result["summary"] == "fake answer"

``run(func, *args, **kwargs)`` calls ``func`` (an ``async def``, a plain ``def``
entry as ``tcc run`` allows, or an already made coroutine) and returns its
result; an exception of the agent propagates.  ``run_script("agent.py[:func]",
*args)`` loads the script as ``tcc run`` does (under its stable module name;
its ``if __name__ == "__main__":`` block does not run) and runs its entry
function (``main`` by default).  ``await arun(...)`` is :func:`run` for code
that already runs in an event loop (an async test); ``run`` refuses to start
inside a running loop.  Keyword arguments other than the options below are
passed to ``func`` (so the agent cannot take parameters of those names this
way: make a coroutine with ``func(...)`` and pass that instead).

What each request does:

- an effect call runs the effect's function at once: an ``async def`` one on an
  event loop this call owns (with ``arun``: on the caller's loop), a sync one in
  this thread (with ``arun``: in a worker thread, as in a real run) in a copy
  of the current context.  ``tcc.current()`` inside it gives ``run_id`` and the
  same idempotency keys a fresh ``tcc run`` would use (``"test:1"``, ``"test:2"``,
  ...; ``"test:3.0"`` for the first call of a gather).  ``retries`` is honoured
  (each failed attempt is retried at once: ``retry_delay`` is not waited), and
  ``timeout`` bounds an async effect's attempt (cancelled, ``TimeoutError``); a
  sync effect runs without a timeout.  ``verify`` probes are never called
  (nothing is ever in doubt without a crash).  ``fakes={effect: fn}`` (keys:
  the effect, or its name) runs ``fn`` with the same arguments instead of the
  effect's function, with the effect's options.
- ``tcc.gather(...)``: the async calls run concurrently on the loop; the sync
  ones, with ``run``, one after the other in this thread first.  The result (or
  the first error, in call order) is what a real run gives.
- ``tcc.checkpoint()`` returns at once (there is nothing to snapshot).
- ``tcc.sleep`` / ``tcc.sleep_until`` return at once: no time passes.
- ``tcc.wait_for(name)`` returns ``signals[name]``; ``tcc.approval(prompt)``
  returns ``approvals`` (``True``/``False``, a list of them, one per approval in
  order, or a function ``prompt -> bool``).  ``sequence(v1, v2, ...)`` as a
  signal's value gives the first wait on that name ``v1``, the second ``v2``,
  and so on.  A wait with no answer raises :class:`MissingAnswerError` out of
  ``run`` (a ``tcc.errors.UsageError``) -- unless it has a ``timeout``: then
  ``TimeoutError`` is raised inside the agent, as when no signal comes in time.
- ``tcc.spawn(fn, *args)`` runs the child in-process, to the end, as a nested run
  with its own keys (run id ``"test.K"``), resolving ``fn`` by name in the module
  of the entry function like ``tcc run`` does in the script; a failed child raises
  ``RunFailedError("child run ... failed: ...")`` in the parent.  The options
  (signals, approvals, fakes) apply to children too.
- anything else the agent awaits (an asyncio future, ``asyncio.sleep(1)``) gets
  the ``TypeError`` a real run throws into the agent; a bare ``yield`` /
  ``asyncio.sleep(0)`` just continues.
- an effect call (or ``tcc.sleep`` ...) the agent makes and does not await
  before its next await raises ``tcc.errors.UnawaitedEffectError`` out of
  ``run``, the error a real run fails with.

Each attempt of an effect receives a fresh copy of its arguments, as in a real
run (so an effect that mutates an argument does not change the agent's object),
and arguments that a run could not journal raise ``CaptureError``.  The
script's ``verify(result)`` is not called, ``sys.exit()`` in the agent or an
effect propagates as ``SystemExit``, and no snapshot is taken: a local that
could not be captured, or state that does not survive a crash (a process id, a
file written outside an effect), is found by the crash checker below, not here.
With ``arun`` the agent is stepped inside the caller's running loop, so asyncio
APIs that fail inside a real run may seem to work there.

**Crash-every-step checker.**  :func:`check_crash_every_step` runs a script the
real way, ``python -m tcc run --json`` in subprocesses, each against a fresh
store in a temporary directory:

1. once uninterrupted, recording its outcome (status and result, or error) and
   its number N of journaled steps (effect calls, gathers, waits, sleeps and
   spawns: the highest call number among the idempotency keys of completed
   calls in the journals of the run and its children); a second uninterrupted run is a control: if the
   two differ, the outcome depends on something else than the effects (time,
   randomness, the process) and the report says so first;
2. then, for each k in 1..N, with ``TCC_TEST_KILL_AFTER=k``: the process SIGKILLs
   itself right after committing its k-th journaled step (a spawned child run
   counts its own steps, in the same process); the checker checks that it died
   by SIGKILL, resumes it with ``python -m tcc resume --json`` until it ends (a
   bounded number of times), and compares the outcome with the uninterrupted
   one.  It also reads every journal of the store (``tcc.store.open_store``,
   ``store.journal``): an idempotency key with more than one successful
   completion is an effect call that completed twice.

A run that parks waiting gets its answers from ``signals``/``approvals``
(delivered straight into the store at the wait's id, ``tcc resume`` follows);
a run that parks sleeping is resumed once its wake time has come, if that is
within ``timeout``.  Either way its later process segments are crash-tested as
well (the kill then hits the k-th step that *process* handled, which may be
past its end: such a k is reported as not reached, not as a failure).  A run
that still waits with no answer ends ``waiting``, and that is its outcome.

The kill lands between steps, after a commit, so this checks that resuming
from any committed state gives the same outcome with no call run twice; a crash
*inside* an effect (a call in flight, re-issued at least once) is the business
of its idempotency key and ``verify`` probe, and is not simulated here.

Results are compared as JSON after replacing the run's id with ``<run>``, so an
agent may put its run id or idempotency keys in the result.  Each crash point
gets its own run id (so an external service that deduplicates by idempotency
key sees distinct keys).  ``--strategy`` and ``--checkpoint-every`` are passed
through (``checkpoint_every=None``: tcc's default, 1, or 10 for hybrid).  Runs
use ``--durability none`` by default: a SIGKILL is a process crash, which loses
nothing acknowledged in any mode.  ``jobs`` crash points run at once.

From pytest::

    from tcc.testing import assert_crash_safe, check_crash_every_step

    def test_agent_survives_a_crash_at_every_step():
        assert_crash_safe("agent.py", "topic", strategy="continuation")

    def test_report():
        report = check_crash_every_step("agent.py:main", "topic", strategy="replay")
        print(report)               # one line per crash point
        report.raise_for_mismatch() # AssertionError naming each failing step

or from a shell: ``python -m tcc.testing [--strategy S] [--checkpoint-every K]
agent.py ARGS...`` (exit 1 on a mismatch).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextvars
import dataclasses
import functools
import inspect
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from typing import (
    Any,
    Callable,
    Collection,
    Coroutine,
    Generator,
    Mapping,
    Sequence,
    Union,
)

from . import errors
from .capture import dump_payload, load_payload
from .effects import _context, reusing_live_resources
from .effects._effect import (
    CheckpointRequest,
    Effect,
    EffectRequest,
    GatherRequest,
    SleepRequest,
    SpawnRequest,
    WaitRequest,
    lookup,
    track_requests,
    unawaited,
    untrack_requests,
)

__all__ = [
    "MissingAnswerError",
    "Report",
    "RunOutcome",
    "StepResult",
    "arun",
    "assert_crash_safe",
    "check_crash_every_step",
    "main",
    "run",
    "run_script",
    "sequence",
]

# ("send", value) or ("throw", exception): what goes into the agent next.
_Pending = tuple[str, Any]
_Fakes = Mapping[Union[Effect, str], Callable[..., Any]]
_Approvals = Union[bool, Sequence[bool], Callable[[str], Any], None]


class MissingAnswerError(errors.UsageError):
    """The agent waits for a signal or an approval that the test did not provide."""


class sequence:  # noqa: N801 - used like a function: signals={"note": sequence("a", "b")}
    """Answers for successive waits on one signal name: the k-th wait gets the k-th value."""

    __slots__ = ("values",)

    def __init__(self, *values: Any) -> None:
        self.values = values

    def __repr__(self) -> str:
        return f"sequence{self.values!r}"


class _Answers:
    """The answers a test gives to waits and approvals (shared by run and the checker)."""

    def __init__(self, signals: Mapping[str, Any] | None, approvals: _Approvals) -> None:
        self.signals = dict(signals or {})
        self.approvals = approvals

    def answer(self, kind: str, name: str, occurrence: int, prompt: str | None) -> tuple[bool, Any]:
        """(found, value) for the ``occurrence``-th (1-based) wait on ``name``."""
        if kind == "approval":
            given = self.approvals
            if given is None:
                return False, None
            if isinstance(given, bool):
                return True, given
            if callable(given):
                return True, bool(given(prompt or ""))
            if isinstance(given, sequence):
                given = list(given.values)
            if occurrence <= len(given):
                return True, bool(given[occurrence - 1])
            return False, None
        if name not in self.signals:
            return False, None
        value = self.signals[name]
        if isinstance(value, sequence):
            if occurrence <= len(value.values):
                return True, value.values[occurrence - 1]
            return False, None
        return True, value

    def missing(self, kind: str, name: str, wait_id: str, prompt: str | None) -> str:
        if kind == "approval":
            return (f"the agent awaits tcc.approval({prompt!r}) (wait {wait_id}) but no answer was "
                    "given: pass approvals=True/False, a list of them, or a function of the prompt")
        have = self.signals.get(name)
        more = (f" (its sequence{have.values!r} has fewer values)" if isinstance(have, sequence)
                else "")
        return (f"the agent awaits tcc.wait_for({name!r}) (wait {wait_id}) but no answer was "
                f"given{more}: pass signals={{{name!r}: VALUE}}, or sequence(...) for several waits")


# ------------------------------------------------------------------ in-process runs


def _with_current(current: _context.Current, fn: Callable[..., Any], args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> Any:
    """Call ``fn`` with ``current`` set; run inside a copied context (no reset needed)."""
    _context.set_current(current)
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

    def _current(self, attempt: int) -> _context.Current:
        return _context.Current(self.run_id, self.effect.name, self.key, attempt)

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
                return ("send", contextvars.copy_context().run(call))
            except Exception as exc:  # noqa: BLE001 - thrown into the agent, as in a run
                outcome = self._failed(exc)
        return outcome

    async def on_loop(self, threads: bool) -> _Pending:
        """An async function on the running loop; a sync one in a thread if ``threads``,
        else in the loop's thread."""
        outcome: _Pending = ("send", None)
        for attempt in range(1, self.effect.retries + 2):
            args, kwargs = self._fresh()
            try:
                if self.is_async:
                    return ("send", await self._bounded(attempt, args, kwargs))
                if threads:
                    return ("send", await asyncio.to_thread(
                        _with_current, self._current(attempt), self.fn, args, kwargs))
                call = functools.partial(_with_current, self._current(attempt), self.fn, args, kwargs)
                return ("send", contextvars.copy_context().run(call))
            except Exception as exc:  # noqa: BLE001 - thrown into the agent, as in a run
                outcome = self._failed(exc)
        return outcome

    async def _bounded(self, attempt: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        token = _context.set_current(self._current(attempt))
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
                raise TimeoutError(f"effect {self.effect.name!r} timed out after {timeout:g} s "
                                   "(it was cancelled)") from None
        finally:
            _context.reset_current(token)


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
    from .runtime._sync import GreenletTask  # a plain `def` entry: a greenlet, as in tcc run

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
    from .runtime._driver import _forgotten_await

    return _forgotten_await(made, during, yielded)


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

    def __init__(self, run_id: str, answers: _Answers, fakes: dict[str, Callable[..., Any]],
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
                token = _context.set_current(_context.Current(self.run_id))
                tracked = track_requests(made)
                try:
                    if pending[0] == "throw":
                        request = task.throw(pending[1])
                    else:
                        request = task.send(pending[1])
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
                finally:
                    untrack_requests(tracked)
                    _context.reset_current(token)
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
        return ("throw", TypeError(
            f"a tcc run can only await tcc effects, tcc.gather(), tcc.checkpoint() and plain "
            f"coroutines; the agent awaited {request!r} (asyncio futures and tasks cannot be "
            "awaited inside a tcc run; wrap the work in a @tcc.effect)"))

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
             signals: Mapping[str, Any] | None, approvals: _Approvals,
             fakes: _Fakes | None) -> tuple[_Trampoline, Any]:
    by_name: dict[str, Callable[..., Any]] = {}
    for key, fake in (fakes or {}).items():
        if isinstance(key, Effect):
            by_name[key.name] = fake
        elif isinstance(key, str):
            by_name[key] = fake
        else:
            raise TypeError(f"fakes keys are effects or effect names, not {key!r}")
    trampoline = _Trampoline(run_id, _Answers(signals, approvals), by_name, _namespace(func))
    return trampoline, _make_task(func, args, kwargs, run_id)


def run(func: Callable[..., Any] | Coroutine[Any, Any, Any], /, *args: Any,
        signals: Mapping[str, Any] | None = None, approvals: _Approvals = None,
        fakes: _Fakes | None = None, run_id: str = "test", **kwargs: Any) -> Any:
    """Run the agent ``func(*args, **kwargs)`` in this process, effects executed directly;
    return its result (its exception propagates).  See the module docstring."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError("tcc.testing.run() cannot run inside a running event loop (an async "
                           "test?): use `await tcc.testing.arun(...)` there")
    trampoline, task = _prepare(func, args, kwargs, run_id, signals, approvals, fakes)
    steps = trampoline.drive(task)
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
        value: Any = None
        while True:
            try:
                work = steps.send(value)
            except StopIteration as stop:
                return stop.value
            try:
                value = execute(work)
            except BaseException:
                steps.close()
                raise
    finally:
        if loop is not None:
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                loop.close()


async def arun(func: Callable[..., Any] | Coroutine[Any, Any, Any], /, *args: Any,
               signals: Mapping[str, Any] | None = None, approvals: _Approvals = None,
               fakes: _Fakes | None = None, run_id: str = "test", **kwargs: Any) -> Any:
    """:func:`run` on the running event loop: ``result = await tcc.testing.arun(main, ...)``.

    Async effects run on this loop, sync ones in worker threads."""
    trampoline, task = _prepare(func, args, kwargs, run_id, signals, approvals, fakes)
    steps = trampoline.drive(task)
    value: Any = None
    while True:
        try:
            work = steps.send(value)
        except StopIteration as stop:
            return stop.value
        try:
            if isinstance(work, _Call):
                value = await work.on_loop(threads=True)
            else:
                value = list(await asyncio.gather(*(c.on_loop(threads=True) for c in work)))
        except BaseException:
            steps.close()
            raise


def _split_entry(script: str) -> tuple[str, str]:
    """``path.py:func`` -> (absolute path, func); func defaults to ``main`` (as tcc run)."""
    path, sep, func = script.rpartition(":")
    if not sep or not path or not func.isidentifier():
        path, func = script, "main"
    return os.path.abspath(path), func


def run_script(script: str, /, *args: Any, signals: Mapping[str, Any] | None = None,
               approvals: _Approvals = None, fakes: _Fakes | None = None,
               run_id: str = "test") -> Any:
    """Load ``path.py[:func]`` as ``tcc run`` does and :func:`run` its entry (``main``)."""
    from .runtime import load_script

    path, name = _split_entry(script)
    module = load_script(path)
    func = getattr(module, name, None)
    if func is None or not callable(func):
        raise errors.UsageError(f"{path} has no function {name!r}")
    return run(func, *args, signals=signals, approvals=approvals, fakes=fakes, run_id=run_id)


# -------------------------------------------------------------- crash-every-step checker

KILL_ENV = "TCC_TEST_KILL_AFTER"  # the driver's test hook (runtime._driver._KILL_AFTER)
_TERMINAL = ("completed", "failed", "unverified", "cancelled", "error")


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    """How a run ended, as compared by the checker.

    ``status`` is the run's (``completed``, ``failed``, ``unverified``,
    ``waiting``, ``sleeping``, ``cancelled``), or ``error`` when tcc itself
    refused or failed (then ``error`` is its message) or ``timeout``.  Run ids
    in ``result``, ``error`` and ``waiting_for`` are replaced by ``<run>``.
    """

    status: str
    result: Any = None
    error: str | None = None
    waiting_for: tuple[str, ...] = ()

    def __str__(self) -> str:
        if self.status in ("completed", "unverified") and self.error is None:
            return f"{self.status} {json.dumps(self.result, sort_keys=True)}"
        if self.status == "waiting":
            return f"waiting for {', '.join(self.waiting_for) or '?'}"
        text = self.status if self.error is None else f"{self.status}: {self.error}"
        if self.result is not None:
            text += f" (result {json.dumps(self.result, sort_keys=True)})"
        return text


@dataclasses.dataclass
class StepResult:
    """One crash point: the ``step``-th journaled step of process ``segment`` (0: ``tcc run``,
    1: the first resume of a run that parked, ...)."""

    step: int
    segment: int
    run_id: str
    killed: bool = False            # the process died by SIGKILL at that step
    reached: bool = True            # False: that process ended before its step-th step
    outcome: RunOutcome | None = None
    processes: int = 0              # tcc processes the timeline took, the killed one included
    duplicates: list[str] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def where(self) -> str:
        seg = f" of process {self.segment + 1}" if self.segment else ""
        return f"crash after step {self.step}{seg}"

    def __str__(self) -> str:
        if not self.ok:
            return f"{self.where}: FAILED: " + "; ".join(self.problems)
        if not self.reached:
            return f"{self.where}: not reached (that process had fewer steps) -> {self.outcome}"
        return f"{self.where}: ok (resumed to the same outcome; {self.processes} processes)"


@dataclasses.dataclass
class Report:
    """What :func:`check_crash_every_step` found."""

    script: str
    args: tuple[str, ...]
    strategy: str
    checkpoint_every: int | None
    expected: RunOutcome
    control: RunOutcome | None
    steps: int                      # N: journaled steps of the uninterrupted run
    segments: int                   # processes the uninterrupted run took (parks: > 1)
    results: list[StepResult]
    seconds: float

    @property
    def deterministic(self) -> bool:
        return self.control is None or self.control == self.expected

    @property
    def failures(self) -> list[StepResult]:
        return [r for r in self.results if not r.ok]

    @property
    def ok(self) -> bool:
        return self.deterministic and not self.failures

    def _title(self) -> str:
        every = f", checkpoint every {self.checkpoint_every}" if self.checkpoint_every else ""
        args = " ".join(self.args)
        return f"{self.script}{' ' + args if args else ''} (strategy {self.strategy}{every})"

    def __str__(self) -> str:
        lines = [f"crash-every-step check of {self._title()}: "
                 f"{'ok' if self.ok else 'MISMATCH'} in {self.seconds:.1f} s",
                 f"  uninterrupted: {self.expected} after {self.steps} steps"
                 + (f" in {self.segments} processes" if self.segments > 1 else "")]
        if not self.deterministic:
            lines.append(f"  NOT DETERMINISTIC: a second uninterrupted run gave {self.control}")
        lines += [f"  {r}" for r in self.results]
        return "\n".join(lines)

    def raise_for_mismatch(self) -> None:
        """Raise AssertionError naming each failing crash point and both outcomes."""
        if self.ok:
            return
        lines = [f"crash-every-step check of {self._title()} failed:"]
        if not self.deterministic:
            lines.append(
                f"  two uninterrupted runs differ: {self.expected} vs {self.control} -- the outcome "
                "depends on something other than the effects' results (time, randomness, the "
                "process), so crash points cannot be compared reliably")
        for r in self.failures:
            lines.append(f"  {r.where} (run {r.run_id}): " + "; ".join(r.problems))
        raise AssertionError("\n".join(lines))


def _jsonish(value: Any, run_id: str) -> Any:
    """``value`` with ``run_id`` replaced by ``<run>`` in every string (keys too)."""
    if isinstance(value, str):
        return value.replace(run_id, "<run>")
    if isinstance(value, list):
        return [_jsonish(v, run_id) for v in value]
    if isinstance(value, dict):
        return {_jsonish(k, run_id): _jsonish(v, run_id) for k, v in value.items()}
    return value


def _parse(stdout: str) -> dict[str, Any] | None:
    """The ``--json`` document of ``tcc run``/``resume`` (the agent may print before it)."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict) and "status" in doc and "id" in doc:
                return doc
    return None


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


@dataclasses.dataclass
class _Timeline:
    outcome: RunOutcome
    processes: int = 0
    killed: bool | None = None      # None: no process was asked to die
    problems: list[str] = dataclasses.field(default_factory=list)
    duplicates: list[str] = dataclasses.field(default_factory=list)
    steps: int = 0                  # the highest call number in the store's journals


class _Checker:
    """Runs timelines of one script: ``tcc run``, then ``tcc resume`` until it ends."""

    def __init__(self, script: str, args: Sequence[str], strategy: str,
                 checkpoint_every: int | None, timeout: float, env: Mapping[str, str] | None,
                 answers: _Answers, python: str, durability: str) -> None:
        self.script = script
        self.args = [str(a) for a in args]
        self.strategy = strategy
        self.checkpoint_every = checkpoint_every
        self.timeout = timeout
        self.answers = answers
        self.python = python
        self.durability = durability
        base = dict(os.environ)
        base.update(env or {})
        base.pop(KILL_ENV, None)
        base.pop("TCC_STORE", None)
        # the subprocesses import this very tcc, whether or not it is installed
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        base["PYTHONPATH"] = os.pathsep.join(p for p in (here, base.get("PYTHONPATH")) if p)
        self.env = base
        # a bound on the processes of one timeline; after the uninterrupted run: its count,
        # plus the killed one, plus slack
        self.max_processes = 100

    def _tcc(self, store: str, argv: list[str], kill_after: int | None) -> subprocess.CompletedProcess[str]:
        env = self.env if kill_after is None else {**self.env, KILL_ENV: str(kill_after)}
        cmd = [self.python, "-m", "tcc", argv[0], "--json", "--store", store,
               "--durability", self.durability, *argv[1:]]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=self.timeout,
                              stdin=subprocess.DEVNULL)

    def timeline(self, store: str, run_id: str, kill: tuple[int, int] | None) -> _Timeline:
        """Run ``run_id`` to its end in a fresh ``store``; ``kill=(segment, k)``: the
        segment-th process (0: ``tcc run``) gets ``TCC_TEST_KILL_AFTER=k``."""
        argv = ["run", "--run-id", run_id, "--strategy", self.strategy]
        if self.checkpoint_every is not None:
            argv += ["--checkpoint-every", str(self.checkpoint_every)]
        argv += [self.script, *self.args]
        resume = ["resume", run_id]
        line = _Timeline(RunOutcome("error", error="no process ran"))
        segment = 0  # processes that ran the agent without being killed by the hook
        while line.processes < self.max_processes:
            target = kill is not None and kill[0] == segment and line.killed is None
            try:
                proc = self._tcc(store, argv, kill[1] if target and kill is not None else None)
            except subprocess.TimeoutExpired:
                line.processes += 1
                line.outcome = RunOutcome("timeout", error=f"a tcc process ran over {self.timeout:g} s")
                line.problems.append(f"`tcc {argv[0]}` did not finish within {self.timeout:g} s")
                break
            line.processes += 1
            argv = resume
            if target:
                line.killed = proc.returncode == -signal.SIGKILL
                if line.killed:
                    continue
            if proc.returncode < 0:
                line.problems.append(
                    f"process {line.processes} died by signal {-proc.returncode} "
                    f"({_last_line(proc.stderr) or 'no message'})")
                continue
            segment += 1
            doc = _parse(proc.stdout)
            if doc is None:
                line.outcome = RunOutcome(
                    "error", error=_jsonish(_last_line(proc.stderr) or f"exit {proc.returncode}", run_id))
                break
            status = str(doc.get("status"))
            line.outcome = RunOutcome(status, _jsonish(doc.get("result"), run_id),
                                      _jsonish(doc.get("error"), run_id))
            if status in _TERMINAL:
                break
            if status == "stopped":
                continue
            blocked = self._unblock(store, run_id)
            if blocked is None:
                continue
            line.outcome = dataclasses.replace(line.outcome, waiting_for=blocked)
            break
        else:
            line.problems.append(f"the run had not ended after {self.max_processes} tcc processes "
                                 f"(last: {line.outcome})")
        self._read_journals(store, run_id, line)
        return line

    def _unblock(self, store_path: str, run_id: str) -> tuple[str, ...] | None:
        """Answer the waits of a parked run (and its children) and let due sleeps pass.

        None: something changed, resume; else the waits (or sleeps) that stay blocked.
        """
        from .runtime import pending_waits
        from .store import open_store

        blocked: list[str] = []
        progressed = False
        wake = 0.0
        with open_store(store_path, create=False, durability=self.durability) as store:
            for run in store.list_runs():
                if run.status == "waiting":
                    for wait in pending_waits(store, run.run_id):
                        wait_id = str(wait.get("id"))
                        if wait.get("signal") != "not sent":
                            continue
                        name, _, nth = wait_id.rpartition("@")
                        kind = str(wait.get("kind") or "signal")
                        found, value = self.answers.answer(kind, name, int(nth or 1), wait.get("prompt"))
                        if not found:
                            blocked.append(_jsonish(f"{run.run_id} {wait_id}", run_id))
                            continue
                        if kind == "approval":
                            raw = json.dumps({"approved": bool(value), "comment": None})
                        else:
                            raw = json.dumps(value)
                        store.send_signal(run.run_id, wait_id, raw.encode())
                        progressed = True
                elif run.status == "sleeping":
                    until = 0.0
                    for event in store.events(run.run_id):
                        data = dict(event.data)
                        if event.kind == "parked" and data.get("status") == "sleeping":
                            until = float(data.get("until") or 0.0)
                    if until - time.time() > self.timeout:
                        blocked.append(_jsonish(f"{run.run_id} sleep", run_id))
                    else:
                        wake = max(wake, until)
                        progressed = True
        if not progressed:  # nothing to answer or to wait for: it stays as it is
            return tuple(sorted(blocked)) or ("nothing this checker can answer",)
        if wake:
            time.sleep(max(0.0, wake - time.time()) + 0.05)
        return None

    def _read_journals(self, store_path: str, run_id: str, line: _Timeline) -> None:
        line.steps, duplicates = _scan_journals(store_path, self.durability)
        line.duplicates += [_jsonish(d, run_id) for d in duplicates]


def _scan_journals(store_path: str, durability: str = "none") -> tuple[int, list[str]]:
    """(steps, duplicates) of every run in the store: the highest call number of a completed
    step, and each effect call (idempotency key) with more than one successful completion."""
    from .store import open_store

    steps = 0
    duplicates: list[str] = []
    try:
        with open_store(store_path, create=False, durability=durability) as store:
            for run in store.list_runs():
                records = store.journal(run.run_id)
                keys = {r.seq: (r.idempotency_key or f"seq:{r.seq}", r.name)
                        for r in records if r.kind == "intent"}
                done: dict[tuple[str, str], int] = {}
                for rec in records:
                    if rec.kind != "completion" or rec.intent_seq not in keys:
                        continue
                    key, name = keys[rec.intent_seq]
                    # A step counts once it completed: a wait or sleep that parked the run
                    # has an open intent, and the kill hook does not count it.
                    number = key.rpartition(":")[2].split(".")[0]
                    if number.isdigit():
                        steps = max(steps, int(number))
                    if rec.error is None:
                        done[key, name] = done.get((key, name), 0) + 1
                duplicates += [f"{name} ({key}) completed {count} times"
                               for (key, name), count in done.items() if count > 1]
    except errors.StoreNotFoundError:
        pass  # nothing was ever stored (e.g. tcc refused the script)
    return steps, duplicates


def check_crash_every_step(
    script: str,
    *args: Any,
    strategy: str = "continuation",
    checkpoint_every: int | None = None,
    timeout: float = 60.0,
    env: Mapping[str, str] | None = None,
    signals: Mapping[str, Any] | None = None,
    approvals: _Approvals = None,
    steps: Collection[int] | None = None,
    jobs: int | None = None,
    durability: str = "none",
    python: str | None = None,
) -> Report:
    """Crash ``script`` (``path.py[:func]``) after each of its journaled steps and compare.

    ``timeout`` bounds each tcc process (seconds); ``env`` adds environment
    variables for every process; ``signals``/``approvals`` answer waits as in
    :func:`run` (values must be JSON); ``steps`` limits the crash points to
    these k; ``jobs`` crash points run at once (default: up to 4, the CPU
    count); ``python`` is the interpreter (default: this one).  Raises if the
    uninterrupted run does not produce an outcome (tcc refused the script, or
    the process died); a mismatch is in the report (``report.ok``,
    :meth:`Report.raise_for_mismatch`).  See the module docstring.
    """
    if strategy not in ("continuation", "hybrid", "replay"):
        raise errors.UsageError(f"unknown strategy {strategy!r}; choose continuation, hybrid or replay")
    if checkpoint_every is not None and checkpoint_every < 1:
        raise errors.UsageError("checkpoint_every must be >= 1")
    started = time.monotonic()
    checker = _Checker(script, [str(a) for a in args], strategy, checkpoint_every, timeout, env,
                       _Answers(signals, approvals), python or sys.executable, durability)
    prefix = f"check-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="tcc-check-") as work:
        ref = checker.timeline(os.path.join(work, "ref"), f"{prefix}-ref", None)
        if ref.outcome.status in ("error", "timeout") or ref.problems:
            raise errors.UsageError(
                f"the uninterrupted run of {script} gave no outcome to compare with: "
                f"{'; '.join(ref.problems) or ref.outcome}")
        segments = max(1, ref.processes)
        checker.max_processes = ref.processes + 6
        total = ref.steps
        wanted = sorted(set(steps)) if steps is not None else list(range(1, total + 1))
        plan = [(seg, k) for seg in range(segments) for k in wanted]

        def crash(point: tuple[int, int]) -> StepResult:
            seg, k = point
            run_id = f"{prefix}-k{k}" if seg == 0 else f"{prefix}-s{seg}-k{k}"
            line = checker.timeline(os.path.join(work, f"s{seg}k{k}"), run_id, point)
            result = StepResult(k, seg, run_id, killed=bool(line.killed), outcome=line.outcome,
                                processes=line.processes, duplicates=line.duplicates,
                                problems=list(line.problems))
            if not line.killed:
                result.reached = False
                if segments == 1 and k <= total:
                    result.problems.append(
                        f"the run ended without a crash at step {k} (the uninterrupted run had "
                        f"{total} steps; got {line.outcome}): the steps differ between runs")
                return result
            if line.outcome != ref.outcome:
                result.problems.append(f"resumed outcome {line.outcome} != uninterrupted {ref.outcome}")
            result.problems += [f"duplicate: {d}" for d in line.duplicates]
            return result

        def control(_: Any) -> _Timeline:
            return checker.timeline(os.path.join(work, "control"), f"{prefix}-control", None)

        workers = max(1, jobs if jobs is not None else min(4, os.cpu_count() or 1))
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            controlled = pool.submit(control, None)
            results = list(pool.map(crash, plan))
            second = controlled.result()
    return Report(script, tuple(str(a) for a in args), strategy, checkpoint_every, ref.outcome,
                  second.outcome, total, segments, results, time.monotonic() - started)


def assert_crash_safe(script: str, *args: Any, **options: Any) -> Report:
    """:func:`check_crash_every_step`, then raise AssertionError on any mismatch; returns
    the report.  For pytest: ``tcc.testing.assert_crash_safe("agent.py", "topic")``."""
    report = check_crash_every_step(script, *args, **options)
    report.raise_for_mismatch()
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tcc.testing [options] SCRIPT[:FUNC] ARGS...``: print the report; exit 1
    on a mismatch, 2 on a usage error."""
    parser = argparse.ArgumentParser(
        prog="python -m tcc.testing",
        description="Crash a tcc agent after each of its journaled steps, resume it, and "
                    "compare with an uninterrupted run.")
    parser.add_argument("--strategy", default="continuation", choices=("continuation", "hybrid", "replay"))
    parser.add_argument("--checkpoint-every", type=int, default=None, metavar="K")
    parser.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                        help="bound for each tcc process (default 60)")
    parser.add_argument("--jobs", type=int, default=None, metavar="N", help="crash points at once")
    parser.add_argument("--signal", action="append", default=[], metavar="NAME=JSON",
                        help="answer tcc.wait_for(NAME) with this value (repeat for more names)")
    parser.add_argument("--approve", choices=("yes", "no"), default=None,
                        help="answer every tcc.approval")
    parser.add_argument("script", metavar="SCRIPT[:FUNC]")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    signals: dict[str, Any] = {}
    for item in ns.signal:
        name, sep, raw = item.partition("=")
        try:
            signals[name] = json.loads(raw) if sep else None
        except ValueError as exc:
            parser.error(f"--signal {name}: the value must be JSON ({exc})")
    approvals = None if ns.approve is None else ns.approve == "yes"
    try:
        report = check_crash_every_step(
            ns.script, *ns.args, strategy=ns.strategy, checkpoint_every=ns.checkpoint_every,
            timeout=ns.timeout, jobs=ns.jobs, signals=signals, approvals=approvals)
    except errors.UsageError as exc:
        print(f"tcc.testing: error: {exc}", file=sys.stderr)
        return 2
    print(report)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
