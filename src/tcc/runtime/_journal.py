"""The journal, read back: logical calls, their recorded outcomes, and serving them.

A run journals every step as an *intent* (effect name, pickled arguments, idempotency key,
attempt) and, once it has an outcome, a *completion*.  :func:`logged_calls` folds those
records into one :class:`LoggedCall` per call key (the last attempt wins).  When a run
resumes, the calls the journal holds after its snapshot are served in order by a
:class:`Replay`: each must be the call the code makes now, with the same arguments
(:func:`_same_arguments`), or the run stops with ReplayDivergenceError.
"""

from __future__ import annotations

import dataclasses
import os
import reprlib
from collections import deque
from typing import Any, Callable, Iterable

from .. import errors
from ..capture import dump_payload, load_payload, project_name, sentinel_home, stateless_type
from ..effects import Resource
from ..store import Completion, JournalRecord
from ._state import Resumption


@dataclasses.dataclass
class LoggedCall:
    """One logical effect call found in the journal (all attempts of one key)."""

    key: str
    name: str
    args: bytes
    attempt: int
    intent_seq: int
    outcome: Resumption | None = None
    retry: bool = False  # `tcc retry`: issue this failed call again, as a new attempt
    # ... whose intent a crash of the store's server may have taken: ask the probe first
    unrecorded: bool = False
    # the attempts that raised (an attempt a crash interrupted is not one: it uses no retry)
    failed: list[int] = dataclasses.field(default_factory=list)

    def failures(self, since: int = 1) -> int:
        """How many of its attempts numbered ``since`` or later raised (``since``: the
        attempt a `tcc retry` issued, from which the call has its retries again)."""
        return sum(1 for attempt in self.failed if attempt >= since)

    @property
    def in_flight(self) -> bool:
        """Was this call in flight at the crash: its intent journaled, no outcome, and not
        a failed call that `tcc retry` asked to issue again?"""
        return self.outcome is None and not self.retry


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
                call.outcome = recorded_resumption(rec)
                if call.outcome[0] == "throw":
                    call.failed.append(call.attempt)
    return list(calls.values())


def recorded_resumption(rec: JournalRecord) -> Resumption:
    """The outcome a completion record journaled, as the driver sends it in."""
    if rec.error is not None:
        return ("throw", load_payload(rec.error))
    return ("send", load_payload(rec.result or b""))


def answered_request(resumption: Resumption, records: Iterable[JournalRecord]) -> Resumption:
    """``resumption`` of a run resumed from a snapshot, given the journal after it.

    A snapshot taken where the run parked (a wait or a sleep: ``("request", req)``)
    can be older than the end of that wait, whose completion then lies in the
    journal after it: the run was resumed from there once already, and the newer
    snapshot failed verification, or that resume used the replay strategy, which
    takes none.  The recorded outcome stands (the signal it consumed is gone, the
    sleep is over): the wait is not handled again, since a second completion of it
    would be refused and the run could not be resumed at all.
    """
    seq = getattr(resumption[1], "intent_seq", None) if resumption[0] == "request" else None
    if seq is not None:
        for rec in records:
            if rec.kind == "completion" and rec.intent_seq == seq:
                return recorded_resumption(rec)
    return resumption


def completion_record(seq: int, outcome: Resumption, duration: float) -> Completion:
    """The completion to journal for intent ``seq``, which ended with ``outcome``.

    An exception that cannot be captured is journaled as :func:`journalable_exception`
    makes it; a result that cannot be captured fails the run (RunFailedError)."""
    try:
        blob = dump_payload(outcome[1])
    except errors.CaptureError as exc:
        if outcome[0] == "throw":
            blob = dump_payload(journalable_exception(outcome[1], exc))
        else:
            raise errors.RunFailedError(f"the result of an effect cannot be journaled: {exc}") from exc
    if outcome[0] == "throw":
        return Completion(seq, error=blob, duration=duration)
    return Completion(seq, result=blob, duration=duration)


def journalable_exception(exc: BaseException, why: errors.CaptureError) -> BaseException:
    """What an effect's exception that cannot be captured is journaled as: the same class
    with its args and the attributes that can be captured, and a note naming the ones
    dropped (an HTTP error holding its live response: ``except HTTPError`` still catches
    it, with ``e.response`` gone), or, if even that cannot be captured, a RuntimeError
    naming it.  The agent gets this journaled form on every path (see ``_steps``)."""
    try:
        copy = type(exc).__new__(type(exc), *exc.args)
        copy.args = exc.args
        dropped = []
        for name, value in list(getattr(exc, "__dict__", {}).items()):
            if name == "__notes__":  # (copied below: a list add_note appends to)
                continue
            try:
                dump_payload(value)
            except Exception:  # noqa: BLE001 - not capturable: dropped, and said
                dropped.append(name)
                continue
            setattr(copy, name, value)
        for note in list(getattr(exc, "__notes__", ())):
            copy.add_note(note)
        copy.add_note(f"tcc: the effect's exception could not be journaled whole ({why}); "
                      f"dropped: {', '.join(dropped) or 'nothing it could name'}")
        dump_payload(copy)
        return copy
    except Exception:  # noqa: BLE001 - args or state that cannot be captured either
        return RuntimeError(f"{exc!r} (original exception not capturable: {why})")


# ------------------------------------------------------------------ serving

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


class Replay:
    """The journaled calls of run ``run_id`` still to serve, in the order they were made."""

    def __init__(self, run_id: str, calls: Iterable[LoggedCall] = ()) -> None:
        self.run_id = run_id
        self._calls: deque[LoggedCall] = deque(calls)

    def __bool__(self) -> bool:
        return bool(self._calls)

    def __len__(self) -> int:
        return len(self._calls)

    def take(self, key: str, name: str) -> LoggedCall:
        """The next journaled call, which must be call ``key`` of effect ``name``.  An
        effect of a module loaded as the run's recorded code (``--code pinned``) has that
        module's pinned name: it is the same effect as the one of the original name."""
        logged = self._calls.popleft()
        if logged.key != key or (logged.name != name and project_name(logged.name) != project_name(name)):
            raise errors.ReplayDivergenceError(
                f"run {self.run_id}: the journal's next call is {project_name(logged.name)} "
                f"({logged.key}) but the code now asks for {project_name(name)} ({key}); the code "
                "changed or is not deterministic between effects"
            )
        return logged

    def check_arguments(self, coro: Any, logged: LoggedCall, name: str, args: tuple[Any, ...],
                        kwargs: dict[str, Any], dump_args: Callable[[], bytes]) -> dict[str, str] | None:
        """A call served from the journal must be the call the journal recorded, with the
        same arguments: its recorded answer belongs to them (an edited `step(i)` to
        `step(i * 10)` must not receive the answers to `step(i)`).  A call that was in
        flight at a crash is exempt: it is re-issued with the arguments it was recorded
        with, whatever the agent computes now (README, "Effect semantics"); if those
        differ, the agent's values computed since its snapshot are not the ones the call
        used, and the returned ``{"call", "site", "now", "then"}`` says so (the caller
        records it and warns).  ``dump_args()``: the arguments the code passes now, journaled."""
        try:
            if _same_arguments(logged.args, dump_args()):
                return None
        except errors.CaptureError:
            if logged.in_flight:  # settled as recorded all the same
                return None
            raise
        try:
            then_args, then_kwargs = load_payload(logged.args)
            then = call_repr(logged.name, then_args, then_kwargs)
        except Exception as exc:  # noqa: BLE001 - the message must still be given
            then = f"{logged.name.rpartition(':')[2]}(<unreadable: {type(exc).__name__}>)"
        which, now = f"call {logged.key.rpartition(':')[2]}", call_repr(name, args, kwargs)
        if logged.in_flight:  # re-issued with its recorded arguments, by design: said, not hidden
            return {"call": which, "site": await_site(coro), "now": now, "then": then}
        self.diverged(coro, which, now, then)
        return None  # (not reached)

    def diverged(self, coro: Any, which: str, now: str, then: str) -> None:
        """Stop the run: ``which`` call is ``now`` in the code, but was ``then``."""
        raise errors.ReplayDivergenceError(
            f"run {self.run_id}: {which} at {await_site(coro)} is now {now}, but the journal "
            f"recorded {then}; a journaled answer is served only to the call that was "
            "recorded, so the run stops here (the code changed, or computes the call from "
            "something that differs between processes, such as the time or a random number)"
        )


class ResumeWarning(UserWarning):
    """How a run was resumed differs from what its code computes now (``tcc run`` and
    ``tcc resume`` show it as ``tcc: warning: ...``; the run's events record it too)."""


def recomputed_warning(run_id: str, differs: dict[str, str]) -> str:
    """The warning for a call re-issued with recorded arguments its code no longer computes."""
    return (f"run {run_id}: {differs['call']} at {differs['site']} was in flight at the crash as "
            f"{differs['then']}; the resumed code now makes it as {differs['now']}. The call is "
            "settled as recorded (its verify probe is asked, or it is re-issued with the "
            "recorded arguments and idempotency key), so what the agent computed since its "
            "last snapshot is not what the call used. Compute such values (a random id, the "
            "time) inside an effect, so that they are recorded (README, \"Effect semantics\")")


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
    plain_eq: bool = getattr(type(a), "__eq__", None) is object.__eq__
    if plain_eq and stateless_type(type(a)) and _stateless(a) and _stateless(b) \
            and (sentinel_home(a) is None or sentinel_home(b) is None):
        # two objects of one class with no state, one a copy: a bare object() sentinel
        # journaled as a copy (by tcc before sentinels were named) and the module's own one
        # now (two sentinels a module names, MISSING and DEFAULT, stay different calls)
        return True
    return bool(a == b)


def _stateless(obj: Any) -> bool:
    try:
        return obj.__getstate__() is None
    except Exception:  # noqa: BLE001 - no answer: not known to be stateless
        return False
