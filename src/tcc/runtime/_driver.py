"""The driver: a trampoline that owns the outermost ``send`` of a run.

The root coroutine awaits effects; each await yields a request object up the
chain to :meth:`Driver.drive`.  For every effect call the driver

1. journals an *intent* (name, pickled arguments, idempotency key, attempt),
2. runs the real function (async ones on an event loop the driver owns,
   sync ones in a worker thread),
3. commits the *completion* and a snapshot of the suspended chain in one
   store transaction, and
4. sends the result back in.

Because the driver, not asyncio, owns the outermost send, the suspended chain
never holds futures or tasks, which is what makes it capturable.

Recovery uses the same loop: the run continues from a snapshot (or from the
top, when there is none) and the journal after that snapshot is *served*
call by call -- completed calls return their recorded outcome, a call that was
in flight at the crash is re-issued with its recorded arguments and
idempotency key (after asking its ``verify`` probe, if it has one).
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import inspect
import json
import os
import reprlib
import signal
import threading
import time
from collections import deque
from typing import Any, Callable, Iterable

from .. import errors
from ..capture import dump_payload, load_payload, seal
from ..effects import Resource, _context, reusing_live_resources
from ..effects._effect import (
    CheckpointRequest,
    Effect,
    EffectRequest,
    GatherRequest,
    SleepRequest,
    SpawnRequest,
    WaitRequest,
    describe_request,
    lookup,
    track_requests,
    unawaited,
    untrack_requests,
)
from ..store import Completion, JournalRecord, Store
from ._globals import ModuleState
from ._report import encode_error as encode_error
from ._trace import Tracer

STATE_TAG = "tcc-run-state"
# 2: (tag, version, coro, pending, calls, waits); 3 adds the agent modules' globals
# (runtime/_globals.py).  A resume reads all of them.
STATE_VERSION = 3
WAIT_EFFECT = "tcc:wait"
SLEEP_EFFECT = "tcc:sleep"
SPAWN_EFFECT = "tcc:spawn"
# ("send", value), ("throw", exception), or ("request", request): a wait or
# sleep the run parked on, handled again when it resumes.
Pending = tuple[str, Any]


STOP = threading.Event()  # set by SIGTERM: stop after the current commit

# Test hook: ``TCC_TEST_KILL_AFTER=K`` SIGKILLs this process right after it has committed
# its K-th journaled step (effect call, gather, wait, sleep or spawn); 0 or unset: never.
# ``tcc.testing.check_crash_every_step`` uses it to crash a real process at every step.
_KILL_AFTER = int(os.environ.get("TCC_TEST_KILL_AFTER") or 0)


class _Parked(Exception):
    """The run is waiting for a signal or sleeping: the process may exit."""

    def __init__(self, status: str, info: dict[str, Any]) -> None:
        super().__init__(status)
        self.status = status
        self.info = info


@dataclasses.dataclass
class LoggedCall:
    """One logical effect call found in the journal (all attempts of one key)."""

    key: str
    name: str
    args: bytes
    attempt: int
    intent_seq: int
    outcome: Pending | None = None
    retry: bool = False  # `tcc retry`: issue this failed call again, as a new attempt


@dataclasses.dataclass(frozen=True)
class Intent:
    """What a ``verify`` probe receives about a call that was in flight."""

    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    idempotency_key: str
    attempt: int


@dataclasses.dataclass
class Outcome:
    """How a drive ended."""

    run_id: str
    status: str
    result: Any = None
    error: str | None = None
    effects: int = 0
    checkpoints: int = 0
    replayed: int = 0
    parked: dict[str, Any] | None = None


def logged_calls(records: Iterable[JournalRecord]) -> list[LoggedCall]:
    """Fold journal records into logical calls, in the order they were made."""
    calls: dict[str, LoggedCall] = {}
    by_intent: dict[int, LoggedCall] = {}
    for rec in records:
        if rec.kind == "intent":
            key = rec.idempotency_key or f"seq:{rec.seq}"
            call = calls.get(key)
            if call is None:
                call = calls[key] = LoggedCall(key, rec.name, rec.args or b"", rec.attempt, rec.seq)
            call.attempt, call.intent_seq, call.outcome = rec.attempt, rec.seq, None
            by_intent[rec.seq] = call
        else:
            call = by_intent.get(rec.intent_seq if rec.intent_seq is not None else -1)
            if call is not None and call.intent_seq == rec.intent_seq:
                call.outcome = recorded_outcome(rec)
    return list(calls.values())


def recorded_outcome(rec: JournalRecord) -> Pending:
    """The outcome a completion record journaled, as the driver sends it in."""
    if rec.error is not None:
        return ("throw", load_payload(rec.error))
    return ("send", load_payload(rec.result or b""))


def answered_request(pending: Pending, records: Iterable[JournalRecord]) -> Pending:
    """``pending`` of a run resumed from a snapshot, given the journal after it.

    A snapshot taken where the run parked (a wait or a sleep: ``("request", req)``)
    can be older than the end of that wait, whose completion then lies in the
    journal after it: the run was resumed from there once already, and the newer
    snapshot failed verification, or that resume used the replay strategy, which
    takes none.  The recorded outcome stands (the signal it consumed is gone, the
    sleep is over); journaling a second one was refused, so the run could not be
    resumed at all (review finding).
    """
    seq = getattr(pending[1], "intent_seq", None) if pending[0] == "request" else None
    if seq is not None:
        for rec in records:
            if rec.kind == "completion" and rec.intent_seq == seq:
                return recorded_outcome(rec)
    return pending


_TCC_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def await_site(coro: Any) -> str:
    """file:line of the innermost agent frame in ``coro``'s await chain (tcc's own frames,
    like a request's ``__await__``, are skipped); ``?`` when there is none."""
    site, obj = "?", coro
    for _ in range(10_000):
        frame = getattr(obj, "cr_frame", None) or getattr(obj, "gi_frame", None)
        if frame is None:
            break
        if not frame.f_code.co_filename.startswith(_TCC_DIR):
            site = f"{frame.f_code.co_filename}:{frame.f_lineno}"
        obj = getattr(obj, "cr_await", None) or getattr(obj, "gi_yieldfrom", None)
    return site


def call_repr(name: str, args: Any, kwargs: Any = None, limit: int = 300) -> str:
    """``search('q', k=3)`` for messages, cut to ``limit`` characters."""
    short = reprlib.Repr()
    short.maxstring = short.maxother = 80
    parts = [short.repr(a) for a in args] + [f"{k}={short.repr(v)}" for k, v in (kwargs or {}).items()]
    text = f"{name.rpartition(':')[2]}({', '.join(parts)})"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _same_arguments(recorded: bytes, now: bytes) -> bool:
    """Do two journaled argument payloads denote the same call?

    Equal bytes settle it.  Otherwise the two are loaded and compared with
    :func:`_equivalent`: the same values can pickle differently in two
    processes (a set of strings is ordered by the process's hash seed, a
    ``tcc.resource`` carries a token of its own).
    """
    if recorded == now:
        return True
    try:
        return _equivalent(load_payload(recorded), load_payload(now), set())
    except Exception:  # noqa: BLE001 - e.g. an array's ambiguous truth value: not the same
        return False


def _equivalent(a: Any, b: Any, seen: set[tuple[int, int]]) -> bool:
    """``a == b``, looking inside lists, tuples and dicts, comparing resources by their
    factory call and objects without an ``__eq__`` of their own by their attributes."""
    if a is b or (id(a), id(b)) in seen:
        return True
    if type(a) is not type(b):
        return bool(a == b)
    seen.add((id(a), id(b)))
    if isinstance(a, Resource):
        part = object.__getattribute__
        return bool(part(a, "_factory") == part(b, "_factory")) and all(
            _equivalent(part(a, name), part(b, name), seen) for name in ("_args", "_kwargs"))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equivalent(x, y, seen) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equivalent(a[k], b[k], seen) for k in a)
    state_a, state_b = getattr(a, "__dict__", None), getattr(b, "__dict__", None)
    if isinstance(state_a, dict) and isinstance(state_b, dict):
        # equal attributes are the same call even when a class's own __eq__ disagrees: a
        # dataclass holding a tcc.resource compares its fields with ==, and a resource
        # rebuilt by replay is a new object
        if getattr(type(a), "__eq__", None) is not object.__eq__ and bool(a == b):
            return True
        return _equivalent(state_a, state_b, seen)
    return bool(a == b)


def _forgotten_await(made: list[Any], during: BaseException | None = None,
                     yielded: Any = None) -> errors.UnawaitedEffectError:
    """The error that fails a run whose agent made a request (an effect call, tcc.sleep ...)
    and never awaited it: outside a run the call would have returned its value, inside one
    the request object would silently stand in for it."""
    forgotten = unawaited(made, yielded)
    call = describe_request(forgotten[0])
    kind = "the effect call" if isinstance(forgotten[0], EffectRequest) else "the call"
    also = f" (and {len(forgotten) - 1} more in the same step)" if len(forgotten) > 1 else ""
    err = errors.UnawaitedEffectError(
        f"{kind} {call} at {getattr(forgotten[0], '_site', '?')} was not awaited before the "
        f"agent's next await{also}: inside a tcc run it returns a request that runs only when "
        f"awaited, so await each call (`await {call}`) before awaiting anything else, or pass "
        "effect calls to tcc.gather(...)"
    )
    if during is not None:
        err.__context__ = during
    return err


def _explain_agent_error(exc: Exception) -> Exception:
    if isinstance(exc, RuntimeError) and "no running event loop" in str(exc):
        tb, last = exc.__traceback__, None
        while tb is not None:
            last, tb = tb.tb_frame.f_code, tb.tb_next
        if last is not None and last.co_name == "sleep" and \
                last.co_filename.replace(os.sep, "/").endswith("asyncio/tasks.py"):
            hint = RuntimeError(
                f"{exc}: asyncio APIs do not work inside a tcc run, because the tcc driver, "
                "not an asyncio loop, runs the agent; instead of asyncio.sleep(), use "
                "`await tcc.sleep(seconds)`, a durable timer that also survives a crash")
            hint.__cause__ = exc
            return hint
        hint = RuntimeError(
            f"{exc}: asyncio APIs do not work inside a tcc run, because the tcc driver, "
            "not an asyncio loop, runs the agent; put asyncio work inside a @tcc.effect"
        )
        hint.__cause__ = exc
        return hint
    return exc


def _in_thread(call: Callable[[], Any], name: str) -> asyncio.Future[Any]:
    """Run ``call`` in a new daemon thread; its outcome resolves the returned future.

    Not the loop's default executor: a timed-out sync effect's thread cannot be
    stopped, and executor threads are joined at interpreter exit, so one stuck
    call kept the process of a stopped (SIGTERM) run alive until the call
    returned.  The driver waits for such threads itself (:meth:`Driver._settled`,
    :meth:`Driver._drain_lingering`) and stops waiting on SIGTERM; a daemon
    thread is then abandoned at exit (its late outcome was discarded anyway).
    """
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not fut.done():  # e.g. cancelled
            (fut.set_result if ok else fut.set_exception)(value)

    def target() -> None:
        try:
            ok, value = True, call()
        except StopIteration as exc:  # a future cannot carry StopIteration (asyncio's rule)
            ok, value = False, RuntimeError(f"effect raised StopIteration: {exc}")
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting driver
            ok, value = False, exc
        try:
            loop.call_soon_threadsafe(settle, ok, value)
        except RuntimeError:  # the loop is closed: the drive ended, nobody waits for it
            pass

    threading.Thread(target=target, name=f"tcc-effect {name}", daemon=True).start()
    return fut


def _backoff(delay: float, retry: int) -> float:
    """The wait before retry number ``retry`` (0-based): ``delay`` doubled per retry,
    capped at a day (a long retry chain must not overflow the float or the wait)."""
    return min(delay * 2.0 ** min(retry, 64), 86_400.0)


def _lingered(running: set[asyncio.Future[Any]], work: asyncio.Future[Any]) -> None:
    """A timed-out attempt's thread ended: forget it (its late outcome is discarded)."""
    running.discard(work)
    if not work.cancelled():
        work.exception()  # retrieved: asyncio must not log it as never retrieved


def encode_result(value: Any) -> bytes:
    try:
        return json.dumps({"value": value}).encode()
    except (TypeError, ValueError):
        return json.dumps({"repr": repr(value)}).encode()


class Driver:
    """Drives one run in this process, as the owner of ``epoch``."""

    def __init__(
        self,
        store: Store,
        run_id: str,
        epoch: int,
        *,
        snapshots: bool = True,
        checkpoint_every: int = 1,
        lease: float = 30.0,
        progress: Callable[[str, "Driver"], None] | None = None,
        wait_seconds: float = 0.0,
        sleep_inline: float | None = None,
        verify: Callable[[Any], Any] | None = None,
        spawner: Callable[[str, str, tuple[Any, ...]], Pending] | None = None,
        modules: ModuleState | None = None,
    ) -> None:
        if checkpoint_every < 1:
            raise ValueError("checkpoint_every must be >= 1")
        self.store = store
        self.run_id = run_id
        self.epoch = epoch
        self.snapshots = snapshots
        self.checkpoint_every = checkpoint_every
        self.lease = lease
        self.progress = progress
        self.wait_seconds = wait_seconds
        if sleep_inline is None:
            sleep_inline = float(os.environ.get("TCC_SLEEP_INLINE", "5"))
        self.sleep_inline = sleep_inline
        self.waits: dict[str, int] = {}
        self.verify = verify
        self.spawner = spawner
        self.modules = modules
        self.tracer = Tracer(store, run_id)
        self.effects = 0
        self.checkpoints = 0
        self.replayed = 0
        self.last_effect = ""
        self._since_snapshot = 0
        self._steps = 0  # journaled steps this process handled (for _KILL_AFTER)
        self._calls = 0
        self._replay: deque[LoggedCall] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_heartbeat = threading.Event()
        # Worker threads of timed-out sync effect attempts that still run, by effect name.
        self._lingering: dict[str, set[asyncio.Future[Any]]] = {}

    # ------------------------------------------------------------------ main

    def drive(
        self,
        coro: Any,
        pending: Pending = ("send", None),
        *,
        calls: int = 0,
        replay: Iterable[LoggedCall] = (),
        waits: dict[str, int] | None = None,
    ) -> Outcome:
        """Run ``coro`` to the end (or until it parks); record and return how it ended."""
        self._calls = calls
        self.waits = dict(waits or {})
        self._replay = deque(replay)
        replaying = bool(self._replay)
        heartbeat = threading.Thread(target=self._heartbeat, name="tcc-lease", daemon=True)
        heartbeat.start()
        self._loop = asyncio.new_event_loop()
        segment = self.tracer.run({"tcc.resumed": bool(calls), "tcc.replaying": replaying})
        segment.__enter__()
        try:
            while True:
                if STOP.is_set():
                    return self._parked(_Parked("stopped", {"reason": "SIGTERM"}))
                if pending[0] == "request":  # resumed at a wait or a sleep
                    try:
                        pending = self._handle(coro, pending[1])
                    except _Parked as parked:
                        return self._parked(parked)
                    except SystemExit as exc:
                        return self._exited(exc, "an effect of the agent")
                    continue
                made: list[Any] = []
                try:
                    request = self._step(coro, pending, made)
                except StopIteration as stop:
                    if unawaited(made):
                        return self._finish("failed", exc=_forgotten_await(made))
                    return self._finish("completed", result=stop.value)
                except errors.FencedError:
                    raise
                except Exception as exc:  # the agent itself failed
                    if unawaited(made):  # most likely because it used a request as a value
                        return self._finish("failed", exc=_forgotten_await(made, exc))
                    return self._finish("failed", exc=_explain_agent_error(exc))
                except SystemExit as exc:
                    return self._exited(exc, "the agent")
                if unawaited(made, request):
                    return self._finish("failed", exc=_forgotten_await(made, yielded=request))
                try:
                    pending = self._handle(coro, request)
                except _Parked as parked:
                    return self._parked(parked)
                except SystemExit as exc:
                    return self._exited(exc, "an effect of the agent")
                if replaying and not self._replay:
                    replaying = False
                    self._caught_up(coro, pending)
        finally:
            segment.__exit__(None, None, None)
            if inspect.iscoroutine(coro) and inspect.getcoroutinestate(coro) == inspect.CORO_CREATED:
                coro.close()  # never started: closing runs no user code
            self._stop_heartbeat.set()
            self._loop.run_until_complete(self._drain_lingering())
            self._loop.run_until_complete(self._loop.shutdown_default_executor())
            self._loop.close()
            heartbeat.join(timeout=5)

    def _exited(self, exc: SystemExit, who: str) -> Outcome:
        """``who`` called sys.exit(): the run ends as a script would, completed for a code
        of 0 or None, else failed (review finding: the process exited and left the run
        `running`, and every takeover by the worker called sys.exit again)."""
        if exc.code is None or exc.code == 0:
            return self._finish("completed", result=None)
        failed = RuntimeError(f"{who} called sys.exit({exc.code!r})")
        failed.__cause__ = exc
        return self._finish("failed", exc=failed)

    def _step(self, coro: Any, pending: Pending, made: list[Any] | None = None) -> Any:
        """Send ``pending`` into ``coro``; the requests the agent makes meanwhile go to ``made``."""
        token = _context.set_current(_context.Current(self.run_id))
        tracked = track_requests(made)
        try:
            if pending[0] == "throw":
                return coro.throw(pending[1])
            return coro.send(pending[1])
        finally:
            untrack_requests(tracked)
            _context.reset_current(token)

    def _handle(self, coro: Any, request: Any) -> Pending:
        if isinstance(request, (EffectRequest, GatherRequest, WaitRequest, SleepRequest, SpawnRequest)):
            pending = self._journaled(coro, request)
            self._steps += 1
            if self._steps == _KILL_AFTER:
                # A test hook (tcc.testing's crash-every-step checker): a real SIGKILL right
                # after this process committed its K-th journaled step.
                os.kill(os.getpid(), signal.SIGKILL)
            return pending
        if isinstance(request, CheckpointRequest):
            pending = ("send", None)
            if self.snapshots and not self._replay:
                self._snapshot(coro, pending, None)
            return pending
        if request is None:  # a bare `yield` / asyncio.sleep(0): just continue
            return ("send", None)
        return (
            "throw",
            TypeError(
                f"a tcc run can only await tcc effects, tcc.gather(), tcc.checkpoint() and "
                f"plain coroutines; the agent awaited {request!r} (asyncio futures and tasks "
                "cannot be awaited inside a tcc run; wrap the work in a @tcc.effect)"
            ),
        )

    def _journaled(self, coro: Any, request: Any) -> Pending:
        """A request whose outcome the journal records: an effect call, a gather, a wait,
        a sleep or a spawn."""
        if isinstance(request, EffectRequest):
            return self._call(coro, request)
        if isinstance(request, GatherRequest):
            return self._gather(coro, request)
        if isinstance(request, WaitRequest):
            return self._wait(coro, request)
        if isinstance(request, SleepRequest):
            return self._sleep(coro, request)
        return self._spawn(coro, request)

    # ---------------------------------------------------------- effect calls

    def _next_key(self) -> str:
        self._calls += 1
        return f"{self.run_id}:{self._calls}"

    def _call(self, coro: Any, request: EffectRequest) -> Pending:
        key = self._next_key()
        effect = self._effect(request.name)
        if self._replay:
            logged = self._take_logged(key, request.name)
            self._check_arguments(coro, logged, effect, request)
            if logged.retry:
                self.store.add_event(self.run_id, "retried", {"effect": effect.name, "key": key,
                                                              "attempt": logged.attempt + 1},
                                     epoch=self.epoch)
                outcome, completion = self._run_attempts(
                    effect, logged.args, key, logged.attempt + 1,
                    last=logged.attempt + 1 + effect.retries)
            elif logged.outcome is not None and not self._should_retry(effect, logged):
                self.replayed += 1
                return logged.outcome
            else:
                outcome, completion = self._reissue(effect, logged)
        else:
            args = self._dump_args(effect, request)
            outcome, completion = self._run_attempts(effect, args, key, 1)
        self._completed(coro, outcome, completion)
        return outcome

    def _gather(self, coro: Any, request: GatherRequest) -> Pending:
        base = self._next_key()
        subs = request.requests
        effects = [self._effect(r.name) for r in subs]
        outcomes: list[Pending | None] = [None] * len(subs)
        todo: list[tuple[int, Effect, tuple[Any, ...], dict[str, Any], bytes, str, int]] = []
        for i, (req, eff) in enumerate(zip(subs, effects)):
            key = f"{base}.{i}"
            if self._replay:
                logged = self._take_logged(key, req.name)
                self._check_arguments(coro, logged, eff, req)
                if logged.outcome is not None and not self._should_retry(eff, logged):
                    outcomes[i] = logged.outcome
                    self.replayed += 1
                    continue
                args, kwargs = load_payload(logged.args)
                if logged.outcome is None:  # in flight at a crash: in doubt, as in _reissue
                    found = self._probe(eff, logged, args, kwargs)
                    if found is not None:
                        outcomes[i] = found[0]
                        self.store.append_completion(self.run_id, self.epoch, found[1])
                        self.effects += 1
                        continue
                todo.append((i, eff, args, kwargs, logged.args, key, logged.attempt + 1))
            else:
                blob = self._dump_args(eff, req)
                with reusing_live_resources():  # the recorded copy, as in _run_attempts
                    args, kwargs = load_payload(blob)
                todo.append((i, eff, args, kwargs, blob, key, 1))
        if todo:
            seqs = [
                self.store.append_intent(
                    self.run_id, self.epoch, eff.name, blob, idempotency_key=key, attempt=attempt
                )
                for (_i, eff, _a, _k, blob, key, attempt) in todo
            ]

            async def all_of() -> list[Any]:
                return await asyncio.gather(
                    *(self._invoke(eff, a, k, key, att) for (_i, eff, a, k, _b, key, att) in todo),
                    return_exceptions=True,
                )

            t0 = time.perf_counter()
            assert self._loop is not None
            results = self._loop.run_until_complete(all_of())
            duration = time.perf_counter() - t0
            stopped = next((r for r in results if isinstance(r, _Parked)), None)
            for (i, *_rest), seq, res in zip(todo, seqs, results):
                if isinstance(res, _Parked):  # never started: its intent stays open (in doubt)
                    continue
                outcome: Pending = ("throw", res) if isinstance(res, Exception) else ("send", res)
                outcomes[i] = outcome
                self.store.append_completion(self.run_id, self.epoch, self._completion(seq, outcome, duration))
                self.effects += 1
            if stopped is not None:
                raise stopped
        values = []
        for done in outcomes:
            assert done is not None
            if done[0] == "throw":
                return done
            values.append(done[1])
        pending: Pending = ("send", values)
        if todo and self.snapshots:
            self._snapshot(coro, pending, None)
        return pending

    def _dump_args(self, effect: Effect, request: EffectRequest) -> bytes:
        """The call's arguments for its intent; if they cannot be captured, the run fails.

        (They used to escape the driver and leave the run ``running``.)
        """
        try:
            return dump_payload((request.args, request.kwargs))
        except errors.CaptureError as exc:
            message = f"the arguments of effect {effect.name!r} cannot be journaled: {exc}"
            method = getattr(effect.fn, "__name__", "")
            if request.args and any(vars(k).get(method) is effect for k in type(request.args[0]).__mro__):
                message += (
                    f"; a call through an instance journals the instance (a "
                    f"{type(request.args[0]).__qualname__}) as its first argument: keep live clients "
                    "in it as tcc.resource(...), or make the effect a @staticmethod or a function")
            self.store.set_status(self.run_id, self.epoch, "failed",
                                  error=encode_error(errors.CaptureError(message)))
            raise errors.RunFailedError(message) from exc

    def _effect(self, name: str) -> Effect:
        try:
            return lookup(name)
        except LookupError as exc:
            raise errors.RunFailedError(str(exc)) from None

    def _take_logged(self, key: str, name: str) -> LoggedCall:
        logged = self._replay.popleft()
        if logged.name != name or logged.key != key:
            raise errors.ReplayDivergenceError(
                f"run {self.run_id}: the journal's next call is {logged.name} ({logged.key}) "
                f"but the code now asks for {name} ({key}); the code changed or is not "
                "deterministic between effects"
            )
        return logged

    def _check_arguments(self, coro: Any, logged: LoggedCall, effect: Effect, request: EffectRequest) -> None:
        """A call served from the journal must be the call the journal recorded, with the
        same arguments: its recorded answer belongs to them (an edited `step(i)` to
        `step(i * 10)` must not receive the answers to `step(i)`).  A call that was in
        flight at a crash is exempt: it is re-issued with the arguments it was recorded
        with, whatever the agent computes now (README, "Effect semantics")."""
        if logged.outcome is None and not logged.retry:
            return  # in flight at a crash: re-issued with its recorded arguments, by design
        now = self._dump_args(effect, request)
        if _same_arguments(logged.args, now):
            return
        try:
            then_args, then_kwargs = load_payload(logged.args)
            then = call_repr(logged.name, then_args, then_kwargs)
        except Exception as exc:  # noqa: BLE001 - the message must still be given
            then = f"{logged.name.rpartition(':')[2]}(<unreadable: {type(exc).__name__}>)"
        self._diverged(coro, f"call {logged.key.rpartition(':')[2]}",
                       call_repr(request.name, request.args, request.kwargs), then)

    def _diverged(self, coro: Any, which: str, now: str, then: str) -> None:
        raise errors.ReplayDivergenceError(
            f"run {self.run_id}: {which} at {await_site(coro)} is now {now}, but the journal "
            f"recorded {then}; a journaled answer is served only to the call that was "
            "recorded, so the run stops here (the code changed, or computes the call from "
            "something that differs between processes, such as the time or a random number)"
        )

    def _should_retry(self, effect: Effect, logged: LoggedCall) -> bool:
        return (
            logged.outcome is not None
            and logged.outcome[0] == "throw"
            and logged.attempt <= effect.retries
        )

    def _reissue(self, effect: Effect, logged: LoggedCall) -> tuple[Pending, Completion]:
        """A call that was in flight at a crash: verify, or run again as recorded."""
        args, kwargs = load_payload(logged.args)
        if logged.outcome is None:
            found = self._probe(effect, logged, args, kwargs)
            if found is not None:
                return found
        return self._run_attempts(effect, logged.args, logged.key, logged.attempt + 1)

    def _probe(
        self, effect: Effect, logged: LoggedCall, args: tuple[Any, ...], kwargs: dict[str, Any],
    ) -> tuple[Pending, Completion] | None:
        """A call in flight at a crash (its intent has no completion): ask ``effect``'s verify
        probe, if it has one.  An answer (not None) is journaled as the call's outcome under
        a new intent and returned with its completion (not yet stored); None means the call
        runs again, as the event recorded here says.  Sequential calls and the calls of one
        ``tcc.gather`` both come here (a gathered call used to run again unasked)."""
        attempt = logged.attempt + 1
        if effect.verify is not None:
            intent = Intent(logged.name, args, kwargs, logged.key, logged.attempt)
            verified = self._run_sync_or_async(effect.verify, (intent,), {}, effect, logged.key, attempt)
            if verified is not None:
                self.store.add_event(self.run_id, "in_doubt_verified",
                                     {"effect": effect.name, "key": logged.key}, epoch=self.epoch)
                seq = self.store.append_intent(
                    self.run_id, self.epoch, effect.name, logged.args,
                    idempotency_key=logged.key, attempt=attempt,
                )
                return ("send", verified), self._completion(seq, ("send", verified), 0.0)
        self.store.add_event(
            self.run_id, "in_doubt_reissued", {"effect": effect.name, "key": logged.key, "attempt": attempt},
            epoch=self.epoch,
        )
        return None

    def _run_attempts(
        self,
        effect: Effect,
        args_blob: bytes,
        key: str,
        first_attempt: int,
        last: int | None = None,
    ) -> tuple[Pending, Completion]:
        """Run ``effect`` on its recorded arguments until an attempt succeeds or its retries
        are spent.

        Each attempt receives a fresh copy of the arguments as journaled (``args_blob``),
        never the agent's own objects: an effect that mutates an argument would otherwise
        change the agent's state on a live call but not when its answer is served from the
        journal, nor when a re-issued call mutates the recorded copy.  Only the return value
        reaches the agent, on every path.  ``last``: the last attempt number allowed
        (default: the effect's first attempt plus its retries).
        """
        if last is None:
            last = effect.retries + 1
        attempt = first_attempt
        self._settle(effect)  # an earlier call of it timed out and its thread still runs
        while True:
            seq = self.store.append_intent(
                self.run_id, self.epoch, effect.name, args_blob, idempotency_key=key, attempt=attempt
            )
            self.last_effect = effect.name
            t0 = time.perf_counter()
            with self.tracer.span("tcc.effect", {"tcc.effect": effect.name, "tcc.idempotency_key": key,
                                                 "tcc.attempt": attempt}) as span:
                with reusing_live_resources():
                    args, kwargs = load_payload(args_blob)
                try:
                    outcome: Pending = ("send", self._run_sync_or_async(effect.fn, args, kwargs, effect, key, attempt))
                except _Parked:  # SIGTERM before the attempt started: not its outcome
                    raise
                except Exception as exc:  # recorded and thrown into the agent
                    outcome = ("throw", exc)
                    if span is not None:
                        span.set_attribute("tcc.error", f"{type(exc).__name__}: {exc}")
            completion = self._completion(seq, outcome, time.perf_counter() - t0)
            if outcome[0] == "send" or attempt >= last:
                return outcome, completion
            self.store.append_completion(self.run_id, self.epoch, completion)
            self._settle(effect)  # a timed-out sync attempt: its thread must end before the next
            if STOP.wait(_backoff(effect.retry_delay, attempt - first_attempt)):
                raise _Parked("stopped", {"reason": "SIGTERM"})  # resumed, the retry runs then
            attempt += 1

    def _run_sync_or_async(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
        effect: Effect, key: str, attempt: int,
    ) -> Any:
        assert self._loop is not None
        return self._loop.run_until_complete(self._invoke(effect, args, kwargs, key, attempt, fn))

    async def _invoke(
        self, effect: Effect, args: tuple[Any, ...], kwargs: dict[str, Any], key: str, attempt: int,
        fn: Callable[..., Any] | None = None,
    ) -> Any:
        """Run one attempt of ``effect`` (or its ``fn``, e.g. its verify probe), within its timeout.

        An async function is cancelled when the timeout passes.  A sync one
        runs in a (daemon) thread, which cannot be stopped: the attempt fails
        with TimeoutError at once, the thread runs on to the end, and until it
        has ended no other call of this effect starts in this run (see
        :meth:`_settle`), so a retry never overlaps the attempt it replaces.
        SIGTERM while waiting for such a thread stops the run (resumable); the
        thread is abandoned when the process exits.
        """
        fn = fn or effect.fn
        token = _context.set_current(_context.Current(self.run_id, effect.name, key, attempt))
        try:
            if asyncio.iscoroutinefunction(fn):
                if effect.timeout is None:
                    return await fn(*args, **kwargs)
                deadline = asyncio.timeout(effect.timeout)
                try:
                    async with deadline:
                        return await fn(*args, **kwargs)
                except TimeoutError:
                    if not deadline.expired():
                        raise  # the function's own TimeoutError
                    raise TimeoutError(self._timed_out(effect, "it was cancelled")) from None
            await self._settled(effect.name)  # e.g. a tcc.gather after a timed-out call
            call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
            work = _in_thread(call, effect.name)
            if effect.timeout is None:
                return await work
            done, _ = await asyncio.wait({work}, timeout=effect.timeout)  # does not cancel work
            if work in done:
                return work.result()
            running = self._lingering.setdefault(effect.name, set())
            running.add(work)
            work.add_done_callback(functools.partial(_lingered, running))
            raise TimeoutError(self._timed_out(
                effect, "its thread cannot be stopped and runs to the end; the next attempt "
                "or call of this effect starts after it"))
        finally:
            _context.reset_current(token)

    @staticmethod
    def _timed_out(effect: Effect, what: str) -> str:
        return f"effect {effect.name!r} timed out after {effect.timeout:g} s ({what})"

    async def _settled(self, name: str) -> None:
        """Until no timed-out attempt of effect ``name`` is still running in its thread.

        Raises ``_Parked("stopped")`` on SIGTERM: the wait can last as long as
        the stuck call, and stopping here loses nothing (the next attempt or
        call has not started; a gathered call's open intent is in doubt on
        resume, as after a crash).
        """
        while self._lingering.get(name):
            if STOP.is_set():
                raise _Parked("stopped", {"reason": "SIGTERM"})
            await asyncio.wait(set(self._lingering[name]), timeout=0.5)
            # a thread that never ends must not hide a cancel or a takeover
            self._check_owner(f"waited for a timed-out call of effect {name!r} to end")

    async def _drain_lingering(self, owned: bool = False) -> None:
        """Wait for timed-out calls still running in their threads (before a parked run
        releases its lease, and at the end of a drive), so a later drive of the run does not
        overlap them; on SIGTERM, abandon them: their threads are daemons and die when the
        process exits, so only a drive that starts before that exit can overlap them.

        ``owned``: the run still holds its lease (a parked run); a cancel or a takeover
        (``--steal``) ends the wait with FencedError, since the run is no longer this
        process's to guard (nor to report as parked).
        """
        while any(self._lingering.values()) and not STOP.is_set():
            await asyncio.wait(set().union(*self._lingering.values()), timeout=0.5)
            if owned:
                try:
                    self._check_owner("waited for a timed-out call to end before parking")
                except errors.FencedError:
                    self._lingering.clear()  # abandoned, like on SIGTERM: the drive's end
                    raise                    # does not wait for them either

    def _settle(self, effect: Effect) -> None:
        """Block until the threads of ``effect``'s timed-out attempts have ended.

        Called before an attempt's intent is journaled, so the journal never
        shows an attempt as started while an earlier one still runs.
        """
        if self._lingering.get(effect.name):
            assert self._loop is not None
            self._loop.run_until_complete(self._settled(effect.name))

    def _completion(self, seq: int, outcome: Pending, duration: float) -> Completion:
        try:
            blob = dump_payload(outcome[1])
        except errors.CaptureError as exc:
            if outcome[0] == "throw":
                blob = dump_payload(RuntimeError(f"{outcome[1]!r} (original exception not capturable: {exc})"))
            else:
                raise errors.RunFailedError(f"the result of an effect cannot be journaled: {exc}") from exc
        if outcome[0] == "throw":
            return Completion(seq, error=blob, duration=duration)
        return Completion(seq, result=blob, duration=duration)

    # ---------------------------------------------------------- waits, timers

    def _journaled_marker(self, name: str, args: Any) -> tuple[str, int | None, Pending | None, Any]:
        """Allocate the call key of a wait/sleep and journal its intent.

        Returns (key, intent_seq, recorded outcome or None, recorded args).
        """
        key = self._next_key()
        if self._replay:
            logged = self._take_logged(key, name)
            if logged.outcome is not None:
                self.replayed += 1
                return key, logged.intent_seq, logged.outcome, load_payload(logged.args)
            return key, logged.intent_seq, None, load_payload(logged.args)
        seq = self.store.append_intent(self.run_id, self.epoch, name, dump_payload(args), idempotency_key=key)
        return key, seq, None, args

    def _wait(self, coro: Any, req: WaitRequest) -> Pending:
        if req.key is None:
            occurrence = self.waits.get(req.name, 0) + 1
            wait_id = f"{req.name}@{occurrence}"
            key, seq, outcome, recorded = self._journaled_marker(WAIT_EFFECT, wait_id)
            if recorded != wait_id:
                self._diverged(coro, f"call {key.rpartition(':')[2]}", f"a wait for {wait_id!r}",
                               f"a wait for {recorded!r}")
            self.waits[req.name] = occurrence
            if outcome is not None:
                return outcome
            req.wait_id, req.key, req.intent_seq = recorded, key, seq
            if req.timeout is not None:
                req.deadline = time.time() + req.timeout
            self.store.add_event(self.run_id, "wait", {"id": req.wait_id, "name": req.name,
                                                        "kind": req.kind, "prompt": req.prompt},
                                 epoch=self.epoch)
        assert req.wait_id is not None and req.intent_seq is not None
        give_up = time.monotonic() + self.wait_seconds
        while True:
            raw = self.store.peek_signal(self.run_id, req.wait_id)
            if raw is not None:
                value = json.loads(raw) if raw else None
                if req.kind == "approval":
                    value = bool(isinstance(value, dict) and value.get("approved"))
                outcome = ("send", value)
                self._record_marker(coro, outcome, req.intent_seq, consume=req.wait_id)
                self.store.add_event(self.run_id, "wait_satisfied", {"id": req.wait_id}, epoch=self.epoch)
                return outcome
            if req.deadline is not None and time.time() >= req.deadline:
                outcome = ("throw", TimeoutError(f"no signal {req.wait_id!r} within {req.timeout} s"))
                self._record_marker(coro, outcome, req.intent_seq)
                return outcome
            if time.monotonic() >= give_up or STOP.is_set():  # SIGTERM: park, resumable
                break
            self._check_owner(f"waited for {req.wait_id!r}")
            time.sleep(0.1)
        info = {"id": req.wait_id, "name": req.name, "kind": req.kind, "prompt": req.prompt,
                "deadline": req.deadline}
        self._park(coro, req, "waiting", info)
        raise AssertionError("unreachable")

    def _sleep(self, coro: Any, req: SleepRequest) -> Pending:
        if req.key is None:
            key, seq, outcome, recorded = self._journaled_marker(SLEEP_EFFECT, req.until)
            if outcome is not None:
                return outcome
            req.until, req.key, req.intent_seq = float(recorded), key, seq
        assert req.intent_seq is not None
        remaining = req.until - time.time()
        if remaining > self.sleep_inline:
            self._park(coro, req, "sleeping", {"until": req.until})
        while remaining > 0:  # in slices: a cancel or SIGTERM is noticed during the sleep
            if STOP.is_set():
                self._park(coro, req, "sleeping", {"until": req.until})
            time.sleep(min(remaining, 0.5))
            self._check_owner(f"slept until {req.until}")
            remaining = req.until - time.time()
        outcome = ("send", None)
        self._record_marker(coro, outcome, req.intent_seq)
        return outcome

    def _spawn(self, coro: Any, req: SpawnRequest) -> Pending:
        key, seq, outcome, recorded = self._journaled_marker(SPAWN_EFFECT, (req.func, req.args))
        if (recorded[0], list(recorded[1])) != (req.func, list(req.args)):
            self._diverged(coro, f"call {key.rpartition(':')[2]}",
                           "tcc.spawn" + call_repr(req.func, req.args),
                           "tcc.spawn" + call_repr(recorded[0], recorded[1]))
        if outcome is not None:
            return outcome
        func, args = recorded
        child_id = f"{self.run_id}.{key.rpartition(':')[2]}"
        if self.spawner is None:
            outcome = ("throw", RuntimeError("tcc.spawn() is only available in a run started by tcc"))
        else:
            outcome = self.spawner(child_id, func, tuple(args))
        assert seq is not None
        self.effects += 1
        self._record_marker(coro, outcome, seq)
        return outcome

    def _record_marker(self, coro: Any, outcome: Pending, intent_seq: int, consume: str | None = None) -> None:
        completion = self._completion(intent_seq, outcome, 0.0)
        if self.snapshots:
            self._snapshot(coro, outcome, completion, consume_signal=consume)
        else:
            self.store.append_completion(self.run_id, self.epoch, completion, consume_signal=consume)

    def _park(self, coro: Any, req: Any, status: str, info: dict[str, Any]) -> None:
        if self.snapshots:
            self._snapshot(coro, ("request", req), None)
        self.store.add_event(self.run_id, "parked", {"status": status, **info}, epoch=self.epoch)
        self.store.set_status(self.run_id, self.epoch, status)
        raise _Parked(status, info)

    def _parked(self, parked: _Parked) -> Outcome:
        # Timed-out sync calls still running must end while this process holds the lease,
        # or a drive elsewhere could resume the run beside them (review finding); the
        # heartbeat keeps the lease meanwhile, for as long as such a call runs.  On SIGTERM
        # they are abandoned (their daemon threads die when this process exits); a cancel
        # or a takeover (--steal) ends the wait with FencedError, as anywhere else.
        assert self._loop is not None
        self._loop.run_until_complete(self._drain_lingering(owned=True))
        try:
            self.store.renew_lease(self.run_id, self.epoch, 0.0)  # anyone may resume it now
        except errors.TccError:
            pass
        return Outcome(self.run_id, parked.status, None, None, self.effects, self.checkpoints,
                       self.replayed, parked.info)

    # ------------------------------------------------------------- snapshots

    def _completed(self, coro: Any, outcome: Pending, completion: Completion) -> None:
        self.effects += 1
        self._since_snapshot += 1
        if self.snapshots and self._since_snapshot >= self.checkpoint_every:
            self._snapshot(coro, outcome, completion)
        else:
            self.store.append_completion(self.run_id, self.epoch, completion)
            self._tick("effect")

    def _caught_up(self, coro: Any, pending: Pending) -> None:
        """Replay served the whole journal tail: snapshot so it is not served again."""
        if self.replayed:
            self.store.add_event(self.run_id, "replayed", {"calls": self.replayed}, epoch=self.epoch)
            if self.snapshots:
                self._snapshot(coro, pending, None)

    def _snapshot(self, coro: Any, pending: Pending, completion: Completion | None,
                  consume_signal: str | None = None) -> None:
        module_state = self.modules.capture() if self.modules is not None else {}
        try:
            state = (STATE_TAG, STATE_VERSION, coro, pending, self._calls, self.waits, module_state)
            try:
                payload = seal(dump_payload(state), compress=False)
            except errors.CaptureError:
                released = self.modules.release_mutated(module_state) if self.modules else []
                if not released:
                    raise
                self.store.add_event(self.run_id, "module_state_released", {"globals": released},
                                     epoch=self.epoch)
                module_state = self.modules.capture() if self.modules is not None else {}
                state = state[:6] + (module_state,)
                payload = seal(dump_payload(state), compress=False)
        except errors.CaptureError as exc:
            if completion is not None:
                self.store.append_completion(self.run_id, self.epoch, completion)
            why = self.modules.culprit(module_state) if self.modules is not None else None
            message = f"checkpoint failed, the previous snapshot is kept: {why or exc}"
            self.store.set_status(self.run_id, self.epoch, "failed", error=encode_error(errors.CaptureError(message)))
            raise errors.RunFailedError(message) from exc
        with self.tracer.span("tcc.checkpoint", {"tcc.bytes": len(payload)}) as span:
            t0 = time.perf_counter()
            self.store.checkpoint(self.run_id, self.epoch, payload, completion=completion,
                                  consume_signal=consume_signal)
            if span is not None:
                span.set_attribute("tcc.duration_ms", (time.perf_counter() - t0) * 1e3)
        self.checkpoints += 1
        self._since_snapshot = 0
        self._tick("checkpoint")

    # ------------------------------------------------------------- lifecycle

    def _finish(self, status: str, *, result: Any = None, exc: BaseException | None = None) -> Outcome:
        if status == "completed":
            if self.verify is not None:
                ok, evidence = self._verify(result)
                self.store.add_event(self.run_id, "verified" if ok else "verification_failed",
                                     {"evidence": evidence}, epoch=self.epoch)
                if not ok:
                    self.store.set_status(self.run_id, self.epoch, "unverified", result=encode_result(result),
                                          error=json.dumps({"type": "verify", "message": evidence}).encode())
                    return Outcome(self.run_id, "unverified", result, f"verify: {evidence}", self.effects,
                                   self.checkpoints, self.replayed)
            # error=b"": a run that failed once (then `tcc retry`) no longer shows that error
            self.store.set_status(self.run_id, self.epoch, "completed", result=encode_result(result),
                                  error=b"")
            return Outcome(self.run_id, "completed", result, None, self.effects, self.checkpoints, self.replayed)
        assert exc is not None
        self.store.set_status(self.run_id, self.epoch, "failed", error=encode_error(exc))
        message = f"{type(exc).__name__}: {exc}"
        return Outcome(self.run_id, "failed", None, message, self.effects, self.checkpoints, self.replayed)

    def _verify(self, result: Any) -> tuple[bool, str]:
        """Run the script's ``verify(result)``: True/None passes, False or an exception fails."""
        assert self.verify is not None
        try:
            value = self.verify(result)
            if inspect.isawaitable(value):
                assert self._loop is not None
                value = self._loop.run_until_complete(value)
        except Exception as exc:  # the check itself failed: that is the evidence
            return False, f"{type(exc).__name__}: {exc}"
        if value is False:
            return False, "verify() returned False"
        return True, "verify() passed" if value in (True, None) else f"verify() returned {value!r}"

    def _check_owner(self, doing: str) -> None:
        """Raise FencedError if the run was cancelled or taken over (a read: no write)."""
        run = self.store.get_run(self.run_id)
        if run.epoch == self.epoch:
            return
        if run.status == "cancelled":
            why = "was cancelled"
        else:
            why = (f"was taken over (now epoch {run.epoch}, owner "
                   f"{run.owner_host}:{run.owner_pid})")
        raise errors.FencedError(
            f"run {self.run_id} {why} while this process (epoch {self.epoch}) {doing}, so "
            "it stops here; nothing more was written")

    def _heartbeat(self) -> None:
        while not self._stop_heartbeat.wait(self.lease / 3):
            try:
                self.store.renew_lease(self.run_id, self.epoch, self.lease)
            except errors.TccError:
                return  # fenced or closed: the next commit reports it

    def _tick(self, what: str) -> None:
        if self.progress is not None:
            self.progress(what, self)
