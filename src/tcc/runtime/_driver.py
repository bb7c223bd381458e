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

This module is the stepping loop, parking, snapshots and the end of a run.  The rest:

- ``_steps``: what each journaled request does (effect call, gather, wait, sleep, spawn;
  the journal names of the last three are in ``_markers``);
- ``_attempts``: running one effect call: threads, timeouts, retries, verify probes;
- ``_journal``: the journal folded into calls, and serving them on resume;
- ``_lease``: the owner check and the heartbeat that renews the lease;
- ``_parking``: SIGTERM's STOP event and the Parked exception;
- ``_state``: the run state a snapshot stores; ``_outcome``: a run's stored
  result and error; ``_agent_errors``: the errors that explain an agent's misuse.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import signal
import time
from typing import Any, Callable, Iterable

from .. import errors
from ..capture import SegmentCache, dump_stored, native_available
from ..effects import (CheckpointRequest, EffectRequest, GatherRequest, SleepRequest, SpawnRequest,
                       WaitRequest, step_agent, unawaited)
from ..store import Completion, Store
from . import _steps
from ._agent_errors import explain_agent_error, forgotten_await, unsupported_await
from ._attempts import Attempts, is_async
from ._globals import ModuleState
from ._journal import LoggedCall, Replay
from ._lease import Lease
from ._outcome import encode_error, encode_result, encode_verify_failure
from ._parking import STOP, Parked
from ._pinning import CodeRecorder
from ._state import Resumption, RunState, pack_state
from ._trace import Tracer


# Test hook: ``TCC_TEST_KILL_AFTER=K`` SIGKILLs this process right after its driver has
# committed its K-th journaled step (effect call, gather, wait, sleep or spawn; counted per
# driver, so again from 1 after an upgrade between two legs of one resume); 0 or unset: never.
# ``tcc.testing.check_crash_every_step`` uses it to crash a real process at every step.
_KILL_AFTER = int(os.environ.get("TCC_TEST_KILL_AFTER") or 0)

_JOURNALED = (EffectRequest, GatherRequest, WaitRequest, SleepRequest, SpawnRequest)


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
        spawner: Callable[[str, str, tuple[Any, ...]], Resumption] | None = None,
        modules: ModuleState | None = None,
        code: CodeRecorder | None = None,
    ) -> None:
        if checkpoint_every < 1:
            raise ValueError("checkpoint_every must be >= 1")
        self.store = store
        self.run_id = run_id
        self.epoch = epoch
        # long lists (a transcript) keep the pickled segments that did not change from
        # one snapshot to the next (tcc.capture._segments)
        self.segments = SegmentCache() if native_available() else None
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
        self.code = code  # records the project's module sources with each snapshot
        self.tracer = Tracer(store, run_id)
        self.effects = 0
        self.checkpoints = 0
        # stop (parked as "stopped") once this process has taken a snapshot: a run under
        # the upgrade policy moves onto the current code then (see runtime.resume)
        self.stop_after_snapshot = False
        self.replayed = 0
        self.claim = Lease(store, run_id, epoch, lease)
        self.attempts = Attempts(store, run_id, epoch, self.tracer, self.claim)
        self.replay = Replay(run_id)  # the journaled calls still to serve
        self._since_snapshot = 0
        self._steps_taken = 0  # journaled steps this process handled (for _KILL_AFTER)
        self._calls = 0
        # A resumed run on a store whose intents are not durable on their own (PostgreSQL:
        # the step's commit flushes them) cannot tell from the journal whether the first
        # call it makes afresh had started before a crash of the server took its intent:
        # that call is in doubt (its verify probe is asked).  Cleared by the first such step.
        self.unrecorded_doubt = False
        self.retried: set[tuple[str, int]] = set()

    @property
    def last_effect(self) -> str:
        """The effect whose attempt ran last (for progress lines)."""
        return self.attempts.last_effect

    # ------------------------------------------------------------------ main

    def drive(
        self,
        coro: Any,
        resumption: Resumption = ("send", None),
        *,
        calls: int = 0,
        replay: Iterable[LoggedCall] = (),
        waits: dict[str, int] | None = None,
        resumed: bool = False,
        retried: Iterable[tuple[str, int]] = (),
    ) -> Outcome:
        """Run ``coro`` to the end (or until it parks); record and return how it ended.

        ``resumed``: the run was executing in another process that went away (a crash may
        lie behind it, and with it a lost intent: see ``unrecorded_doubt``).  ``retried``:
        the attempts (call key, attempt) that ``tcc retry`` issued (``retried`` events)."""
        self._calls = calls
        self.unrecorded_doubt = resumed and not self.store.intents_durable
        self.retried = set(retried)
        self.waits = dict(waits or {})
        self.replay = Replay(self.run_id, replay)
        replaying = bool(self.replay)
        self.claim.start_heartbeat()
        segment = self.tracer.run({"tcc.resumed": bool(calls), "tcc.replaying": replaying})
        segment.__enter__()
        try:
            while True:
                if STOP.is_set():
                    return self._parked(Parked("stopped", {"reason": "SIGTERM"}))
                if self.stop_after_snapshot and self.checkpoints:  # (see runtime.resume)
                    return self._parked(Parked("stopped", {"reason": "upgrade"}), release=False)
                if resumption[0] == "request":  # resumed at a wait or a sleep
                    try:
                        resumption = self._handle(coro, resumption[1])
                    except Parked as parked:
                        return self._parked(parked)
                    except errors.RunFailedError as exc:
                        return self._stopped(exc)
                    except SystemExit as exc:
                        return self._exited(exc, "an effect of the agent")
                    continue
                made: list[Any] = []
                try:
                    request = self._step(coro, resumption, made)
                except StopIteration as stop:
                    if unawaited(made):
                        return self._finish("failed", exc=forgotten_await(made))
                    return self._finish("completed", result=stop.value)
                except errors.FencedError:
                    raise
                except Exception as exc:  # the agent itself failed
                    if unawaited(made):  # most likely because it used a request as a value
                        return self._finish("failed", exc=forgotten_await(made, exc))
                    return self._finish("failed", exc=explain_agent_error(exc))
                except SystemExit as exc:
                    return self._exited(exc, "the agent")
                if unawaited(made, request):
                    return self._finish("failed", exc=forgotten_await(made, yielded=request))
                try:
                    resumption = self._handle(coro, request)
                except Parked as parked:
                    return self._parked(parked)
                except errors.RunFailedError as exc:
                    return self._stopped(exc)
                except SystemExit as exc:
                    return self._exited(exc, "an effect of the agent")
                if replaying and not self.replay:
                    replaying = False
                    try:
                        self._caught_up(coro, resumption)
                    except errors.RunFailedError as exc:
                        return self._stopped(exc)
        finally:
            segment.__exit__(None, None, None)
            if inspect.iscoroutine(coro) and inspect.getcoroutinestate(coro) == inspect.CORO_CREATED:
                coro.close()  # never started: closing runs no user code
            self.claim.stop_heartbeat()
            self.attempts.close_loop()
            self.claim.join_heartbeat(timeout=5)

    def _stopped(self, exc: errors.RunFailedError) -> Outcome:
        """The driver failed the run (a checkpoint, or an effect's arguments or result, could
        not be captured): an outcome like any other failure's, so that ``tcc run --json``
        prints it.  Its status was set where it failed, if the store could be written."""
        if self.store.get_run(self.run_id).status != "failed":
            self.store.set_status(self.run_id, self.epoch, "failed", error=encode_error(exc))
        cause = exc.__cause__ if isinstance(exc.__cause__, errors.TccError) else exc
        return Outcome(self.run_id, "failed", None, f"{type(cause).__name__}: {exc}", self.effects,
                       self.checkpoints, self.replayed)

    def _exited(self, exc: SystemExit, who: str) -> Outcome:
        """``who`` called sys.exit(): the run ends as a script would, completed for a code
        of 0 or None, else failed (the run must not stay `running`, or every takeover by
        the worker would call sys.exit again)."""
        if exc.code is None or exc.code == 0:
            return self._finish("completed", result=None)
        failed = RuntimeError(f"{who} called sys.exit({exc.code!r})")
        failed.__cause__ = exc
        return self._finish("failed", exc=failed)

    def _step(self, coro: Any, resumption: Resumption, made: list[Any] | None = None) -> Any:
        """Send ``resumption`` into ``coro``; the requests the agent makes meanwhile go to ``made``."""
        return step_agent(coro, resumption, self.run_id, made, self.store.tenant)

    def _handle(self, coro: Any, request: Any) -> Resumption:
        if isinstance(request, _JOURNALED):
            resumption = _steps.journaled(self, coro, request)
            self._steps_taken += 1
            if self._steps_taken == _KILL_AFTER:
                # A test hook (tcc.testing's crash-every-step checker): a real SIGKILL right
                # after this process committed its K-th journaled step.
                os.kill(os.getpid(), signal.SIGKILL)
            return resumption
        if isinstance(request, CheckpointRequest):
            resumption = ("send", None)
            if self.snapshots and not self.replay:
                self.snapshot(coro, resumption, None)
            return resumption
        if request is None:  # a bare `yield` / asyncio.sleep(0): just continue
            return ("send", None)
        return ("throw", unsupported_await(request))

    def fresh_call_in_doubt(self) -> bool:
        """May the attempt about to be issued be one whose intent a crash took?

        Only an attempt past the end of the journal (nothing left to serve) can be: every
        intent before the journal's last record was made durable by a later commit.  True
        on a resumed run (see ``unrecorded_doubt``) until :meth:`past_the_journal` clears
        it, once the step that issued the first attempts past that end has them journaled.
        """
        return self.unrecorded_doubt and not self.replay

    def past_the_journal(self) -> None:
        """The current step issued attempts past the end of the journal: from now on every
        intent is this process's own (and later calls cannot have been lost)."""
        if not self.replay:
            self.unrecorded_doubt = False

    def next_key(self) -> str:
        """The idempotency key of the run's next journaled call: ``RUN:k``."""
        self._calls += 1
        return f"{self.run_id}:{self._calls}"

    # --------------------------------------------------------------- parking

    def park(self, coro: Any, req: Any, status: str, info: dict[str, Any]) -> None:
        """Park the run at ``req`` (a wait or a sleep, handled again on resume): raises Parked."""
        if self.snapshots:
            self.snapshot(coro, ("request", req), None)
        self.store.add_event(self.run_id, "parked", {"status": status, **info}, epoch=self.epoch)
        # when a worker should take it up by time: a sleep's end, a wait's deadline
        until = info.get("until" if status == "sleeping" else "deadline")
        self.store.set_status(self.run_id, self.epoch, status,
                              wake=float(until) if isinstance(until, (int, float)) else None)
        raise Parked(status, info)

    def _parked(self, parked: Parked, release: bool = True) -> Outcome:
        # Stuck threads (timed-out sync calls still running) must end while this process
        # holds the lease, or a drive elsewhere could resume the run beside them; the
        # heartbeat keeps the lease meanwhile, for as long as such a call runs.  On SIGTERM
        # they are abandoned (their daemon threads die when this process exits); a cancel
        # or a takeover (--steal) ends the wait with FencedError, as anywhere else.
        if self.attempts.loop is not None:  # stuck threads need one
            self.attempts.loop.run_until_complete(self.attempts.drain_stuck_threads(owned=True))
        # No renewal may follow the release, or the run would look owned for a whole lease
        # more: the heartbeat ends first (the drive's own stop and join come later).
        self.claim.stop_heartbeat()
        self.claim.join_heartbeat(timeout=5)
        if release:  # (not when this process continues the run itself: runtime.resume)
            self.claim.release()  # anyone may resume it now
        return Outcome(self.run_id, parked.status, None, None, self.effects, self.checkpoints,
                       self.replayed, parked.info)

    # ------------------------------------------------------------- snapshots

    def completed(self, coro: Any, outcome: Resumption, completion: Completion) -> None:
        """Commit an effect call's completion, with a snapshot if one is due."""
        self.effects += 1
        self._since_snapshot += 1
        if self.snapshots and self._since_snapshot >= self.checkpoint_every:
            self.snapshot(coro, outcome, completion)
        else:
            self.store.append_completion(self.run_id, self.epoch, completion)
            self._report_progress("effect")

    def _caught_up(self, coro: Any, resumption: Resumption) -> None:
        """Replay served the whole journal tail: snapshot so it is not served again."""
        if self.replayed:
            self.store.add_event(self.run_id, "replayed", {"calls": self.replayed}, epoch=self.epoch)
            if self.snapshots:
                self.snapshot(coro, resumption, None)

    def snapshot(self, coro: Any, resumption: Resumption, completion: Completion | None,
                 consume_signal: str | None = None) -> None:
        """Commit a snapshot of the run (with ``completion``, if any) in one transaction;
        if the run cannot be captured, commit ``completion`` alone and fail the run."""
        module_state = self.modules.capture() if self.modules is not None else {}
        try:
            state = RunState(coro, resumption, self._calls, self.waits, module_state)
            try:
                payload = dump_stored(pack_state(state), segments=self.segments)
            except errors.CaptureError:
                released = self.modules.release_mutated(module_state) if self.modules else []
                if not released:
                    raise
                self.store.add_event(self.run_id, "module_state_released", {"globals": released},
                                     epoch=self.epoch)
                module_state = self.modules.capture() if self.modules is not None else {}
                payload = dump_stored(pack_state(state._replace(module_state=module_state)),
                                      segments=self.segments)
        except errors.CaptureError as exc:
            if completion is not None:
                self.store.append_completion(self.run_id, self.epoch, completion)
            why = self.modules.culprit(module_state) if self.modules is not None else None
            message = f"checkpoint failed, the previous snapshot is kept: {why or exc}"
            self.store.set_status(self.run_id, self.epoch, "failed", error=encode_error(errors.CaptureError(message)))
            raise errors.RunFailedError(message) from exc
        if self.code is not None:
            self.code.record()  # its manifest event rides with this checkpoint
        size = len(payload) if isinstance(payload, bytes) else sum(memoryview(p).nbytes for p in payload)
        with self.tracer.span("tcc.checkpoint", {"tcc.bytes": size}) as span:
            t0 = time.perf_counter()
            self.store.checkpoint(self.run_id, self.epoch, payload, completion=completion,
                                  consume_signal=consume_signal)
            if span is not None:
                span.set_attribute("tcc.duration_ms", (time.perf_counter() - t0) * 1e3)
        self.checkpoints += 1
        self._since_snapshot = 0
        self._report_progress("checkpoint")

    # ------------------------------------------------------------- lifecycle

    def _finish(self, status: str, *, result: Any = None, exc: BaseException | None = None) -> Outcome:
        if status == "completed":
            if self.verify is not None:
                ok, evidence = self._verify(result)
                self.store.add_event(self.run_id, "verified" if ok else "verification_failed",
                                     {"evidence": evidence}, epoch=self.epoch)
                if not ok:
                    self.store.set_status(self.run_id, self.epoch, "unverified", result=encode_result(result),
                                          error=encode_verify_failure(evidence))
                    return Outcome(self.run_id, "unverified", result, f"verify: {evidence}", self.effects,
                                   self.checkpoints, self.replayed)
            # error=b"": a completed run shows no error, also after a failure and `tcc retry`
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
        if is_async(self.verify):
            self.attempts.event_loop()  # made outside the check: its failure is not the evidence
        try:
            value = self.verify(result)
            if inspect.isawaitable(value):
                value = self.attempts.event_loop().run_until_complete(value)
        except Exception as exc:  # the check itself failed: that is the evidence
            return False, f"{type(exc).__name__}: {exc}"
        if value is False:
            return False, "verify() returned False"
        return True, "verify() passed" if value in (True, None) else f"verify() returned {value!r}"

    def _report_progress(self, what: str) -> None:
        if self.progress is not None:
            self.progress(what, self)
