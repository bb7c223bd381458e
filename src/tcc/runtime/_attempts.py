"""Effect attempts: running one effect call, with its timeout, retries and verify probe.

Each attempt is journaled as an intent before it starts; its outcome becomes a
completion that the caller commits (with a snapshot, usually).  Async effects run on
an event loop the drive owns, made when the first one needs it
(:meth:`Attempts.event_loop`); sync ones are called directly when they have no timeout
and are not part of a ``tcc.gather``, else in a daemon thread of their own.  A run of
sync effects thus never imports asyncio (~40 ms of a `tcc resume`).

A sync attempt that times out cannot be stopped: it fails with TimeoutError at once and
its thread runs on to the end, a *stuck thread*.  Until it has ended, no other attempt
or call of that effect starts in this run (:meth:`Attempts.wait_for_stuck_threads`),
so a retry never overlaps the attempt it replaces; a drive that ends or parks waits for
its stuck threads first (:meth:`Attempts.drain_stuck_threads`), and SIGTERM stops these
waits (the threads die with the process).
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import inspect
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from .. import errors
from ..capture import load_payload
from ..effects import Current, Effect, reset_current, reusing_live_resources, set_current
from ..store import Completion, Store
from ._journal import LoggedCall, completion_record
from ._lease import Lease
from ._parking import STOP, Parked
from ._state import Resumption
from ._trace import Tracer

if TYPE_CHECKING:
    import asyncio


@dataclasses.dataclass(frozen=True)
class Intent:
    """What a ``verify`` probe receives about a call that was in flight."""

    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    idempotency_key: str
    attempt: int


def should_retry(effect: Effect, logged: LoggedCall, since: int = 1) -> bool:
    """A journaled call that failed with retries of ``effect`` left runs again on resume.
    Retries are counted by the attempts that raised: one a crash interrupted (re-issued,
    in doubt) used none.  ``since``: the attempt a `tcc retry` issued (see
    :meth:`LoggedCall.failures`)."""
    return (
        logged.outcome is not None
        and logged.outcome[0] == "throw"
        and logged.failures(since) <= effect.retries
    )


def last_attempt(effect: Effect, logged: LoggedCall, since: int = 1) -> int:
    """The number of the last attempt a resumed call may make: its retries not yet used by
    an attempt that raised, after the attempts already journaled."""
    return logged.attempt + effect.retries + 1 - logged.failures(since)


def _backoff(delay: float, retry: int) -> float:
    """The wait before retry number ``retry`` (0-based): ``delay`` doubled per retry,
    capped at a day (a long retry chain must not overflow the float or the wait)."""
    return min(delay * 2.0 ** min(retry, 64), 86_400.0)


def _timed_out(effect: Effect, what: str) -> str:
    return f"effect {effect.public_name!r} timed out after {effect.timeout:g} s ({what})"


def _stop_iteration(exc: StopIteration) -> RuntimeError:
    """What an effect's StopIteration becomes, wherever the call ran: a future cannot carry
    one (asyncio's rule), so a call in a thread could not return it, and an inline one
    does the same."""
    return RuntimeError(f"effect raised StopIteration: {exc}")


def is_async(fn: Callable[..., Any]) -> bool:
    """``asyncio.iscoroutinefunction(fn)``, without importing asyncio: the marker it also
    accepts can only be on ``fn`` if asyncio was imported."""
    if inspect.iscoroutinefunction(fn):
        return True
    aio = sys.modules.get("asyncio")
    return aio is not None and bool(aio.iscoroutinefunction(fn))


def _in_thread(call: Callable[[], Any], name: str) -> asyncio.Future[Any]:
    """Run ``call`` in a new daemon thread; its outcome resolves the returned future.

    Not the loop's default executor: a timed-out sync effect's thread cannot be
    stopped, and executor threads are joined at interpreter exit, so one stuck call
    would keep the process of a stopped (SIGTERM) run alive until the call returned.
    The driver waits for stuck threads itself (:meth:`Attempts.wait_for_stuck_threads`,
    :meth:`Attempts.drain_stuck_threads`) and stops waiting on SIGTERM; a daemon
    thread is then abandoned at exit (its late outcome was discarded anyway).
    """
    import asyncio

    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()

    def resolve(ok: bool, value: Any) -> None:
        if not fut.done():  # e.g. cancelled
            (fut.set_result if ok else fut.set_exception)(value)

    def target() -> None:
        try:
            ok, value = True, call()
        except StopIteration as exc:
            ok, value = False, _stop_iteration(exc)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting driver
            ok, value = False, exc
        try:
            loop.call_soon_threadsafe(resolve, ok, value)
        except RuntimeError:  # the loop is closed: the drive ended, nobody waits for it
            pass

    threading.Thread(target=target, name=f"tcc-effect {name}", daemon=True).start()
    return fut


def _stuck_thread_ended(stuck: set[asyncio.Future[Any]], work: asyncio.Future[Any]) -> None:
    """A timed-out attempt's thread ended: forget it (its late outcome is discarded)."""
    stuck.discard(work)
    if not work.cancelled():
        work.exception()  # retrieved: asyncio must not log it as never retrieved


class Attempts:
    """Runs the attempts of run ``run_id``'s effect calls, for its owner of ``epoch``."""

    def __init__(self, store: Store, run_id: str, epoch: int, tracer: Tracer, lease: Lease) -> None:
        self.store = store
        self.run_id = run_id
        self.epoch = epoch
        self.tracer = tracer
        self.lease = lease
        self.loop: asyncio.AbstractEventLoop | None = None  # the drive's loop, once made
        self.last_effect = ""  # the effect of the newest attempt (for progress lines)
        # The threads of timed-out sync attempts that still run, by effect name.
        self._stuck: dict[str, set[asyncio.Future[Any]]] = {}

    def event_loop(self) -> asyncio.AbstractEventLoop:
        """The drive's event loop, made on first use (an async effect, a timeout, a
        ``tcc.gather``, an async ``verify``)."""
        if self.loop is None:
            import asyncio

            self.loop = asyncio.new_event_loop()
        return self.loop

    def ready(self, fn: Callable[..., Any], effect: Effect) -> None:
        """Make the loop now if calling ``fn`` for ``effect`` will need one: before the
        attempt starts, so that asyncio's import is not timed as the attempt's, and a
        failure to make the loop is not recorded as the attempt's outcome."""
        if effect.timeout is not None or is_async(fn):
            self.event_loop()

    def close_loop(self) -> None:
        """The drive ended: wait for its stuck threads (see :meth:`drain_stuck_threads`),
        then close its loop, if it made one (stuck threads need one)."""
        loop, self.loop = self.loop, None
        if loop is not None:
            try:
                loop.run_until_complete(self.drain_stuck_threads())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                loop.close()

    def run_attempts(
        self,
        effect: Effect,
        args_blob: bytes,
        key: str,
        first_attempt: int,
        last: int | None = None,
    ) -> tuple[Resumption, Completion]:
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
        self.wait_for_stuck_threads(effect)  # an earlier call of it timed out
        self.ready(effect.fn, effect)
        while True:
            seq = self.store.append_intent(
                self.run_id, self.epoch, effect.public_name, args_blob, idempotency_key=key, attempt=attempt
            )
            self.last_effect = effect.public_name
            t0 = time.perf_counter()
            with self.tracer.span("tcc.effect", {"tcc.effect": effect.public_name, "tcc.idempotency_key": key,
                                                 "tcc.attempt": attempt}) as span:
                with reusing_live_resources():
                    args, kwargs = load_payload(args_blob)
                try:
                    outcome: Resumption = ("send", self.run_sync_or_async(effect.fn, args, kwargs, effect,
                                                                          key, attempt))
                except Parked:  # SIGTERM before the attempt started: not its outcome
                    raise
                except Exception as exc:  # recorded and thrown into the agent
                    outcome = ("throw", exc)
                    if span is not None:
                        span.set_attribute("tcc.error", f"{type(exc).__name__}: {exc}")
            completion = completion_record(seq, outcome, time.perf_counter() - t0)
            if outcome[0] == "send" or attempt >= last:
                return outcome, completion
            self.store.append_completion(self.run_id, self.epoch, completion)
            self.wait_for_stuck_threads(effect)  # a timed-out attempt must end before the next
            if STOP.wait(_backoff(effect.retry_delay, attempt - first_attempt)):
                raise Parked("stopped", {"reason": "SIGTERM"})  # resumed, the retry runs then
            attempt += 1

    def reissue(self, effect: Effect, logged: LoggedCall, since: int = 1) -> tuple[Resumption, Completion]:
        """A call that was in flight at a crash: verify, or run again as recorded.  Also a
        call whose last attempt failed with retries left: its next attempt runs."""
        if logged.outcome is None:
            args, kwargs = load_payload(logged.args)
            found = self.probe(effect, logged, args, kwargs)
            if found is not None:
                return found
        return self.run_attempts(effect, logged.args, logged.key, logged.attempt + 1,
                                 last=last_attempt(effect, logged, since))

    def probe_unrecorded(self, effect: Effect, args_blob: bytes, key: str,
                         attempt: int) -> tuple[Resumption, Completion] | None:
        """Attempt ``attempt`` of call ``key`` may have started before a crash that took its
        intent (the store's intents are not durable on their own, and this is the first
        call the resumed run makes afresh): ask ``effect``'s verify probe, if it has one.

        An answer (not None) is journaled as that attempt's outcome and returned with its
        completion (not yet stored), with an ``in_doubt_verified`` event marked
        ``unrecorded``; None means the call runs as usual.  Nothing is recorded then: most
        often the call had simply not started (the crash fell between two steps)."""
        if effect.verify is None:
            return None
        with reusing_live_resources():
            args, kwargs = load_payload(args_blob)
        intent = Intent(effect.public_name, args, kwargs, key, attempt)
        verified = self.run_sync_or_async(effect.verify, (intent,), {}, effect, key, attempt)
        if verified is None:
            return None
        self.store.add_event(self.run_id, "in_doubt_verified",
                             {"effect": effect.public_name, "key": key, "unrecorded": True}, epoch=self.epoch,
                             deferred=True)
        seq = self.store.append_intent(self.run_id, self.epoch, effect.public_name, args_blob,
                                       idempotency_key=key, attempt=attempt)
        return ("send", verified), completion_record(seq, ("send", verified), 0.0)

    def probe(
        self, effect: Effect, logged: LoggedCall, args: tuple[Any, ...], kwargs: dict[str, Any],
    ) -> tuple[Resumption, Completion] | None:
        """A call in flight at a crash (its intent has no completion): ask ``effect``'s verify
        probe, if it has one.  An answer (not None) is journaled as the call's outcome under
        a new intent and returned with its completion (not yet stored); None means the call
        runs again, as the event recorded here says.  Sequential calls and the calls of one
        ``tcc.gather`` both come here: no call in doubt runs again unasked."""
        attempt = logged.attempt + 1
        if effect.verify is not None:
            intent = Intent(logged.name, args, kwargs, logged.key, logged.attempt)
            verified = self.run_sync_or_async(effect.verify, (intent,), {}, effect, logged.key, attempt)
            if verified is not None:
                self.store.add_event(self.run_id, "in_doubt_verified",
                                     {"effect": effect.public_name, "key": logged.key}, epoch=self.epoch,
                                     deferred=True)
                seq = self.store.append_intent(
                    self.run_id, self.epoch, effect.public_name, logged.args,
                    idempotency_key=logged.key, attempt=attempt,
                )
                return ("send", verified), completion_record(seq, ("send", verified), 0.0)
        self.store.add_event(
            self.run_id, "in_doubt_reissued", {"effect": effect.public_name, "key": logged.key, "attempt": attempt},
            epoch=self.epoch, deferred=True,  # with the re-issued call's completion
        )
        return None

    def run_sync_or_async(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
        effect: Effect, key: str, attempt: int,
    ) -> Any:
        if effect.timeout is None and not is_async(fn):
            return self._run_inline(fn, args, kwargs, effect, key, attempt)
        return self.event_loop().run_until_complete(self.invoke(effect, args, kwargs, key, attempt, fn))

    def _run_inline(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
        effect: Effect, key: str, attempt: int,
    ) -> Any:
        """A sync call with no timeout, called right here, outside the event loop: what
        :meth:`invoke` does for it in a thread of its own (the same context, the same
        StopIteration rule), without starting a thread and waking the loop from it for
        every call (~0.2 ms a step).  An effect without a timeout never has stuck threads;
        the loop is not running, so the call may run one of its own (``asyncio.run``).
        The calls of a ``tcc.gather`` still run in threads, side by side."""
        token = set_current(Current(self.run_id, effect.public_name, key, attempt, self.store.tenant))
        try:
            return contextvars.copy_context().run(fn, *args, **kwargs)
        except StopIteration as exc:
            raise _stop_iteration(exc) from None
        finally:
            reset_current(token)

    async def invoke(
        self, effect: Effect, args: tuple[Any, ...], kwargs: dict[str, Any], key: str, attempt: int,
        fn: Callable[..., Any] | None = None,
    ) -> Any:
        """Run one attempt of ``effect`` (or its ``fn``, e.g. its verify probe), within its timeout.

        An async function is cancelled when the timeout passes.  A sync one runs in a
        (daemon) thread, which cannot be stopped: the attempt fails with TimeoutError at
        once, and the thread becomes a stuck thread of the effect (see the module's
        docstring).  SIGTERM while waiting for such a thread stops the run (resumable).
        """
        import asyncio

        fn = fn or effect.fn
        token = set_current(Current(self.run_id, effect.public_name, key, attempt, self.store.tenant))
        try:
            if is_async(fn):
                if effect.timeout is None:
                    return await fn(*args, **kwargs)
                deadline = asyncio.timeout(effect.timeout)
                try:
                    async with deadline:
                        return await fn(*args, **kwargs)
                except TimeoutError:
                    if not deadline.expired():
                        raise  # the function's own TimeoutError
                    raise TimeoutError(_timed_out(effect, "it was cancelled")) from None
            await self._stuck_threads_ended(effect.name)  # e.g. a tcc.gather after a timed-out call
            call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
            work = _in_thread(call, effect.name)
            if effect.timeout is None:
                return await work
            done, _ = await asyncio.wait({work}, timeout=effect.timeout)  # does not cancel work
            if work in done:
                return work.result()
            stuck = self._stuck.setdefault(effect.name, set())
            stuck.add(work)
            work.add_done_callback(functools.partial(_stuck_thread_ended, stuck))
            raise TimeoutError(_timed_out(
                effect, "its thread cannot be stopped and runs to the end; the next attempt "
                "or call of this effect starts after it"))
        finally:
            reset_current(token)

    def wait_for_stuck_threads(self, effect: Effect) -> None:
        """Block until the stuck threads of ``effect`` (its timed-out attempts) have ended.

        Called before an attempt's intent is journaled, so the journal never
        shows an attempt as started while an earlier one still runs.
        """
        if self._stuck.get(effect.name):
            self.event_loop().run_until_complete(self._stuck_threads_ended(effect.name))

    async def _stuck_threads_ended(self, name: str) -> None:
        """Until no timed-out attempt of effect ``name`` is still running in its thread.

        Raises ``Parked("stopped")`` on SIGTERM: the wait can last as long as
        the stuck call, and stopping here loses nothing (the next attempt or
        call has not started; a gathered call's open intent is in doubt on
        resume, as after a crash).
        """
        import asyncio

        while self._stuck.get(name):
            if STOP.is_set():
                raise Parked("stopped", {"reason": "SIGTERM"})
            await asyncio.wait(set(self._stuck[name]), timeout=0.5)
            # a thread that never ends must not hide a cancel or a takeover
            self.lease.check_owner(f"waited for a timed-out call of effect {name!r} to end")

    async def drain_stuck_threads(self, owned: bool = False) -> None:
        """Wait for every stuck thread (before a parked run releases its lease, and at the
        end of a drive), so a later drive of the run does not overlap them; on SIGTERM,
        abandon them: their threads are daemons and die when the process exits, so only a
        drive that starts before that exit can overlap them.

        ``owned``: the run still holds its lease (a parked run); a cancel or a takeover
        (``--steal``) ends the wait with FencedError, since the run is no longer this
        process's to guard (nor to report as parked).
        """
        import asyncio

        while any(self._stuck.values()) and not STOP.is_set():
            await asyncio.wait(set().union(*self._stuck.values()), timeout=0.5)
            if owned:
                try:
                    self.lease.check_owner("waited for a timed-out call to end before parking")
                except errors.FencedError:
                    self._stuck.clear()  # abandoned, like on SIGTERM: the drive's end
                    raise                # does not wait for them either
