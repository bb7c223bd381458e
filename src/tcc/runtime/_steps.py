"""The journaled steps: what the driver does for each request whose outcome the journal
records -- an effect call, a ``tcc.gather``, a wait for a signal, a sleep, a spawn.

Each step allocates the next call key of the run (``RUN:k``; gathered calls are
``RUN:k.i``).  While a resumed run has journaled calls left to serve
(:class:`~._journal.Replay`), a step takes the call the journal recorded under its key
and returns its recorded outcome, or, for a call that was in flight at the crash,
issues it again (:meth:`~._attempts.Attempts.reissue`).  Otherwise it journals an
intent, runs the call, and commits its completion, with a snapshot when one is due.

Waits, sleeps and spawns are journaled as calls of the markers ``tcc:wait``,
``tcc:sleep`` and ``tcc:spawn``; a wait or a sleep that cannot end in this process
parks the run (:meth:`Driver.park`).
"""

from __future__ import annotations

import json
import time
import warnings
from typing import TYPE_CHECKING, Any, Callable

from .. import errors
from ..capture import ATOMS, dump_payload, load_payload, process_modules
from ..effects import reusing_live_resources
from ..effects import EffectRequest, Effect, GatherRequest, SleepRequest, SpawnRequest, WaitRequest, lookup
from ..store import Completion
from ._attempts import _backoff, should_retry
from ._journal import LoggedCall, ResumeWarning, call_repr, completion_record, recomputed_warning
from ._markers import SLEEP_EFFECT, SPAWN_EFFECT, WAIT_EFFECT, read_wait_args, wait_args
from ._outcome import encode_error
from ._parking import STOP, Parked
from ._state import Resumption

if TYPE_CHECKING:
    from ._driver import Driver


def journaled(d: Driver, coro: Any, request: Any) -> Resumption:
    """The outcome of ``request`` (an effect call, a gather, a wait, a sleep or a spawn)."""
    if isinstance(request, EffectRequest):
        return effect_call(d, coro, request)
    if isinstance(request, GatherRequest):
        return gather(d, coro, request)
    if isinstance(request, WaitRequest):
        return wait(d, coro, request)
    if isinstance(request, SleepRequest):
        return sleep(d, coro, request)
    return spawn(d, coro, request)


# ---------------------------------------------------------- effect calls

def _checked(d: Driver, coro: Any, key: str, logged: LoggedCall, effect: Effect,
             request: EffectRequest) -> None:
    """Check a journaled call against the one the code makes now (``Replay.check_arguments``).
    A call in flight at the crash is compared only: its arguments are not journaled again,
    and ones that cannot be captured now do not fail the run (it is settled as recorded).
    If the code now computes other arguments for it, that is recorded as an event (with
    the next write, as the other ``in_doubt_*`` events) and warned of."""
    dump: Callable[[], bytes] = (lambda: dump_payload((request.args, request.kwargs))) \
        if logged.in_flight else (lambda: _dump_args(d, effect, request))
    differs = d.replay.check_arguments(coro, logged, request.name, request.args, request.kwargs, dump)
    if differs is None:
        return
    d.store.add_event(d.run_id, "in_doubt_arguments_differ", {"key": key, **differs}, epoch=d.epoch,
                      deferred=True)
    try:
        warnings.warn(recomputed_warning(d.run_id, differs), ResumeWarning, stacklevel=2)
    except Warning:  # warnings turned into errors: the event says it; the run goes on
        pass


def effect_call(d: Driver, coro: Any, request: EffectRequest) -> Resumption:
    key = d.next_key()
    effect = _effect(request.name)
    if d.replay:
        logged = d.replay.take(key, request.name)
        _checked(d, coro, key, logged, effect, request)
        # its retries count from the attempt the last `tcc retry` of it issued, if any
        since = max((attempt for k, attempt in d.retried if k == key), default=1)
        # The journal's last call failed, and its next attempt was issued (by the effect's
        # retries, or by a `tcc retry` that a crash interrupted): that attempt may have
        # started before a crash took its intent.  (With its retries spent, the failure
        # went to the agent instead.)
        found = d.attempts.probe_unrecorded(effect, logged.args, key, logged.attempt + 1) \
            if logged.outcome is not None and d.fresh_call_in_doubt() and (
                logged.unrecorded or (not logged.retry and should_retry(effect, logged, since))) else None
        if found is not None:
            outcome, completion = found
        elif logged.retry:
            d.store.add_event(d.run_id, "retried", {"effect": effect.public_name, "key": key,
                                                    "attempt": logged.attempt + 1},
                              epoch=d.epoch)
            outcome, completion = d.attempts.run_attempts(
                effect, logged.args, key, logged.attempt + 1,
                last=logged.attempt + 1 + effect.retries)
        elif logged.outcome is not None and not should_retry(effect, logged, since):
            d.replayed += 1
            return logged.outcome
        else:  # in doubt, or a failed attempt to retry
            outcome, completion = d.attempts.reissue(effect, logged, since)
    else:
        args = _dump_args(d, effect, request)
        found = d.attempts.probe_unrecorded(effect, args, key, 1) if d.fresh_call_in_doubt() else None
        if found is not None:
            outcome, completion = found
        else:
            outcome, completion = d.attempts.run_attempts(effect, args, key, 1)
    d.past_the_journal()
    outcome = as_recorded(outcome, completion.result, completion.error)
    d.completed(coro, outcome, completion)
    return outcome


# Results that are their own copy: a copy of one is equal, and nothing can change it.
_IMMUTABLE = ATOMS | {complex}


def as_recorded(outcome: Resumption, blob: bytes | None, error: bytes | None = None) -> Resumption:
    """The outcome the agent is sent for a call that ran now: its result as the journal
    recorded it (``blob``), a copy, as a result served from the journal after a crash
    is (README, "Effect semantics": an effect that returns a module-level dict, or the
    same cached object twice, must not give the agent shared objects in an uninterrupted
    run and copies in a resumed one).  Immutable results are sent as they are, and so are
    exceptions (with their tracebacks), unless one could not be journaled whole: then the
    journaled form (``error``; see ``journalable_exception``), as after a crash."""
    if outcome[0] == "throw":
        if error is None:
            return outcome
        try:
            dump_payload(outcome[1])
            return outcome
        except errors.CaptureError:
            return ("throw", load_payload(error))
    if type(outcome[1]) in _IMMUTABLE or blob is None:
        return outcome
    try:
        with reusing_live_resources():  # a tcc.resource in it stays the live one, as in arguments
            return ("send", load_payload(blob))
    except Exception:  # noqa: BLE001 - it pickles but does not load: the object as it is (a
        return outcome  # resume would fail on the journal too, as before; not this run now)


def gather(d: Driver, coro: Any, request: GatherRequest) -> Resumption:
    base = d.next_key()
    subs = request.requests
    effects = [_effect(r.name) for r in subs]
    outcomes: list[Resumption | None] = [None] * len(subs)
    todo: list[tuple[int, Effect, tuple[Any, ...], dict[str, Any], bytes, str, int, int]] = []  # (..., attempt, its attempts that raised so far)

    def answered(i: int, found: tuple[Resumption, Completion] | None) -> bool:
        """A verify probe found call ``i``'s effect: its outcome, journaled."""
        if found is None:
            return False
        outcomes[i] = as_recorded(found[0], found[1].result)
        d.store.append_completion(d.run_id, d.epoch, found[1])
        d.effects += 1
        return True

    # A gather at the end of the journal (what is left to serve is at most its own calls)
    # is where a crash may have taken intents: its calls' next attempts, whether first
    # attempts or retries of failed ones (every intent of a round is written before any of
    # its calls runs), are in doubt, and their verify probes are asked before they run.
    doubt = d.unrecorded_doubt and len(d.replay) <= len(subs)
    issued = False  # an attempt was issued (the doubt, if any, was this gather's)
    for i, (req, eff) in enumerate(zip(subs, effects)):
        key = f"{base}.{i}"
        if d.replay:
            logged = d.replay.take(key, req.name)
            _checked(d, coro, key, logged, eff, req)
            if logged.outcome is not None and not should_retry(eff, logged):
                outcomes[i] = logged.outcome
                d.replayed += 1
                continue
            issued = True
            args, kwargs = load_payload(logged.args)
            if logged.outcome is not None:  # a retry, whose intent a crash may have taken
                if doubt and answered(i, d.attempts.probe_unrecorded(eff, logged.args, key,
                                                                     logged.attempt + 1)):
                    continue
            elif answered(i, d.attempts.probe(eff, logged, args, kwargs)):  # in flight: in doubt
                continue
            todo.append((i, eff, args, kwargs, logged.args, key, logged.attempt + 1, logged.failures()))
        else:
            blob = _dump_args(d, eff, req)
            issued = True
            if doubt and answered(i, d.attempts.probe_unrecorded(eff, blob, key, 1)):
                continue
            with reusing_live_resources():  # the recorded copy, as in Attempts.run_attempts
                args, kwargs = load_payload(blob)
            todo.append((i, eff, args, kwargs, blob, key, 1, 0))
    if issued:
        d.past_the_journal()
    round_ = todo
    loop = d.attempts.event_loop() if round_ else None  # the calls run on it, side by side
    while round_:  # each round: the calls' attempts, concurrently; then the failed ones again
        seqs = [
            d.store.append_intent(
                d.run_id, d.epoch, eff.public_name, blob, idempotency_key=key, attempt=attempt
            )
            for (_i, eff, _a, _k, blob, key, attempt, _f) in round_
        ]

        async def all_of(calls: list[Any]) -> list[Any]:
            import asyncio

            return await asyncio.gather(
                *(d.attempts.invoke(eff, a, k, key, att) for (_i, eff, a, k, _b, key, att, _f) in calls),
                return_exceptions=True,
            )

        t0 = time.perf_counter()
        assert loop is not None
        results = loop.run_until_complete(all_of(round_))
        duration = time.perf_counter() - t0
        stopped = next((r for r in results if isinstance(r, Parked)), None)
        again = []
        for (i, eff, _a, _k, blob, key, attempt, failed), seq, res in zip(round_, seqs, results):
            if isinstance(res, Parked):  # never started: its intent stays open (in doubt)
                continue
            outcome: Resumption = ("throw", res) if isinstance(res, Exception) else ("send", res)
            record = completion_record(seq, outcome, duration)
            d.store.append_completion(d.run_id, d.epoch, record)
            outcome = as_recorded(outcome, record.result, record.error)
            d.effects += 1
            if outcome[0] == "throw" and failed + 1 <= eff.retries:  # as a single call retries
                with reusing_live_resources():  # a fresh copy of the recorded arguments
                    args, kwargs = load_payload(blob)
                again.append((i, eff, args, kwargs, blob, key, attempt + 1, failed + 1))
            else:
                outcomes[i] = outcome
        if stopped is not None:
            raise stopped
        if again and STOP.wait(max(_backoff(eff.retry_delay, failed - 1)
                                   for (_i, eff, _a, _k, _b, _key, _attempt, failed) in again)):
            raise Parked("stopped", {"reason": "SIGTERM"})  # resumed, the retries run then
        round_ = again
    values = []
    for done in outcomes:
        assert done is not None
        if done[0] == "throw":
            return done
        values.append(done[1])
    resumption: Resumption = ("send", values)
    if todo and d.snapshots:
        d.snapshot(coro, resumption, None)
    return resumption


def _dump_args(d: Driver, effect: Effect, request: EffectRequest) -> bytes:
    """The call's arguments for its intent; if they cannot be captured, the run fails
    (a capture error must not escape the driver and leave the run ``running``)."""
    try:
        return dump_payload((request.args, request.kwargs))
    except errors.CaptureError as exc:
        message = f"the arguments of effect {effect.public_name!r} cannot be journaled: {exc}"
        method = getattr(effect.fn, "__name__", "")
        if request.args and any(vars(k).get(method) is effect for k in type(request.args[0]).__mro__):
            message += (
                f"; a call through an instance journals the instance (a "
                f"{type(request.args[0]).__qualname__}) as its first argument: keep live clients "
                "in it as tcc.resource(...), or make the effect a @staticmethod or a function")
        d.store.set_status(d.run_id, d.epoch, "failed",
                           error=encode_error(errors.CaptureError(message)))
        raise errors.RunFailedError(message) from exc


def _effect(name: str) -> Effect:
    """The effect registered under ``name``.  A name read from the journal is the project's
    (``agent:step``); a run on its recorded code calls the effect of its pinned module
    (``__tcc_pinned_<hex>_agent:step``), which the process's module resolver names."""
    resolve = process_modules()
    module, sep, qualname = name.partition(":")
    if resolve is not None and sep:
        pinned = resolve(module)
        if pinned is not None and pinned.__name__ != module:
            try:
                return lookup(f"{pinned.__name__}:{qualname}")
            except LookupError:
                pass
    try:
        return lookup(name)
    except LookupError as exc:
        raise errors.RunFailedError(str(exc)) from None


# ---------------------------------------------------------- waits, timers, children

def _journal_marker(d: Driver, name: str, args: Any) -> tuple[str, int | None, Resumption | None, Any]:
    """Allocate the call key of a wait/sleep/spawn and journal its intent.

    Returns (key, intent_seq, recorded outcome or None, recorded args).
    """
    key = d.next_key()
    if d.replay:
        logged = d.replay.take(key, name)
        if logged.outcome is not None:
            d.replayed += 1
            return key, logged.intent_seq, logged.outcome, load_payload(logged.args)
        d.past_the_journal()  # in flight: nothing after it can have been issued
        return key, logged.intent_seq, None, load_payload(logged.args)
    d.past_the_journal()  # a wait, sleep or spawn has nothing to verify: it is made again
    seq = d.store.append_intent(d.run_id, d.epoch, name, dump_payload(args), idempotency_key=key)
    return key, seq, None, args


def _record_marker(d: Driver, coro: Any, outcome: Resumption, intent_seq: int,
                   consume: str | None = None) -> None:
    completion = completion_record(intent_seq, outcome, 0.0)
    if d.snapshots:
        d.snapshot(coro, outcome, completion, consume_signal=consume)
    else:
        d.store.append_completion(d.run_id, d.epoch, completion, consume_signal=consume)


def wait(d: Driver, coro: Any, req: WaitRequest) -> Resumption:
    if req.key is None:
        occurrence = d.waits.get(req.name, 0) + 1
        wait_id = f"{req.name}@{occurrence}"
        deadline = time.time() + req.timeout if req.timeout is not None else None
        key, seq, outcome, recorded = _journal_marker(d, WAIT_EFFECT, wait_args(wait_id, deadline))
        recorded_id, recorded_deadline = read_wait_args(recorded)
        if recorded_id != wait_id:
            d.replay.diverged(coro, f"call {key.rpartition(':')[2]}", f"a wait for {wait_id!r}",
                              f"a wait for {recorded!r}")
        d.waits[req.name] = occurrence
        if outcome is not None:
            return outcome
        req.wait_id, req.key, req.intent_seq = wait_id, key, seq
        if req.timeout is not None:
            # the deadline the wait got when it began: a crash and a resume do not restart
            # its clock (a wait journaled by an older tcc has none: it starts again now)
            req.deadline = recorded_deadline if recorded_deadline is not None else deadline
        d.store.add_event(d.run_id, "wait", {"id": req.wait_id, "name": req.name,
                                             "kind": req.kind, "prompt": req.prompt},
                          epoch=d.epoch)
    assert req.wait_id is not None and req.intent_seq is not None
    give_up = time.monotonic() + d.wait_seconds
    while True:
        raw = d.store.peek_signal(d.run_id, req.wait_id)
        if raw is not None:
            value = json.loads(raw) if raw else None
            if req.kind == "approval":
                value = bool(isinstance(value, dict) and value.get("approved"))
            outcome = ("send", value)
            _record_marker(d, coro, outcome, req.intent_seq, consume=req.wait_id)
            d.store.add_event(d.run_id, "wait_satisfied", {"id": req.wait_id}, epoch=d.epoch)
            return outcome
        if req.deadline is not None and time.time() >= req.deadline:
            outcome = ("throw", TimeoutError(f"no signal {req.wait_id!r} within {req.timeout} s"))
            _record_marker(d, coro, outcome, req.intent_seq)
            return outcome
        if time.monotonic() >= give_up or STOP.is_set():  # SIGTERM: park, resumable
            break
        d.claim.check_owner(f"waited for {req.wait_id!r}")
        time.sleep(0.1)
    info = {"id": req.wait_id, "name": req.name, "kind": req.kind, "prompt": req.prompt,
            "deadline": req.deadline}
    d.park(coro, req, "waiting", info)
    raise AssertionError("unreachable")


def sleep(d: Driver, coro: Any, req: SleepRequest) -> Resumption:
    if req.key is None:
        key, seq, outcome, recorded = _journal_marker(d, SLEEP_EFFECT, req.until)
        if outcome is not None:
            return outcome
        req.until, req.key, req.intent_seq = float(recorded), key, seq
    assert req.intent_seq is not None
    remaining = req.until - time.time()
    if remaining > d.sleep_inline:
        d.park(coro, req, "sleeping", {"until": req.until})
    while remaining > 0:  # in slices: a cancel or SIGTERM is noticed during the sleep
        if STOP.is_set():
            d.park(coro, req, "sleeping", {"until": req.until})
        time.sleep(min(remaining, 0.5))
        d.claim.check_owner(f"slept until {req.until}")
        remaining = req.until - time.time()
    outcome = ("send", None)
    _record_marker(d, coro, outcome, req.intent_seq)
    return outcome


def spawn(d: Driver, coro: Any, req: SpawnRequest) -> Resumption:
    key, seq, outcome, recorded = _journal_marker(d, SPAWN_EFFECT, (req.func, req.args))
    if (recorded[0], list(recorded[1])) != (req.func, list(req.args)):
        d.replay.diverged(coro, f"call {key.rpartition(':')[2]}",
                          "tcc.spawn" + call_repr(req.func, req.args),
                          "tcc.spawn" + call_repr(recorded[0], recorded[1]))
    if outcome is not None:
        return outcome
    func, args = recorded
    child_id = f"{d.run_id}.{key.rpartition(':')[2]}"
    if d.spawner is None:
        outcome = ("throw", RuntimeError("tcc.spawn() is only available in a run started by tcc"))
    else:
        outcome = d.spawner(child_id, func, tuple(args))
    assert seq is not None
    d.effects += 1
    _record_marker(d, coro, outcome, seq)
    return outcome
