"""What an operator does to runs, for every front end: the CLI, a library user, the worker.

Each rule lives here once -- running by id resumes the same call, a hybrid run snapshots
every 10 effects unless told otherwise, an approval answers the run's newest pending one,
cancelling a run cancels the children it spawned -- and ``tcc``'s commands only parse
arguments and print what these functions return.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, Callable, Sequence

from .. import errors
from ..effects import check_signal_name
from ..store import LIVE_STATUSES, RunInfo, Store
from . import _scripts
from ..capture import load_payload
from ._driver import Outcome
from ._journal import logged_calls
from ._markers import WAIT_EFFECT, read_wait_args
from ._pinning import DEFAULT_POLICY
from ._runs import (SYNC_NOTICE, Progress, _entry, check_call, effective_strategy, is_sync, resume,
                    reusable_run, send_signal, start)
from ._worker import pending_waits

HYBRID_EVERY = 10  # a hybrid run snapshots after every this many effects unless told otherwise


def default_snapshot_every(strategy: str) -> int:
    """Effects between snapshots when the caller names none: 1, or 10 for ``hybrid``."""
    return HYBRID_EVERY if strategy == "hybrid" else 1


def run(
    store: Store,
    target: str | Callable[..., Any],
    args: Sequence[Any] = (),
    *,
    run_id: str | None = None,
    strategy: str = "continuation",
    checkpoint_every: int | None = None,
    lease: float = 30.0,
    keep: int | None = None,
    wait_seconds: float = 0.0,
    verify: str | None = None,
    progress: Progress | None = None,
    on_started: Callable[[RunInfo, bool], None] | None = None,
    on_notice: Callable[[str], None] | None = None,
    on_code_change: str = DEFAULT_POLICY,
) -> Outcome:
    """Run ``target`` durably and return how it ended (``tcc run``).

    ``target`` is a script (``path[:func]``) or a function object of an importable module.
    With ``run_id``, an unfinished run of that id is resumed -- only if it is the same call,
    the same entry with the same arguments; anything else, or a finished run, is refused
    (:func:`reusable_run`) -- and a new run gets that id otherwise.

    ``on_started(run, resumed)`` is called once the run exists (or is about to be resumed);
    ``on_notice(text)`` hears what the user should know before the run starts: a strategy
    that had to change (no native module, a plain ``def`` entry), module globals that
    cannot be captured.  ``checkpoint_every`` defaults to :func:`default_snapshot_every`.
    """
    if run_id:
        existing = reusable_run(store, run_id, target, args)
        if existing is not None:
            if on_started is not None:
                on_started(existing, True)
            return resume(store, run_id, checkpoint_every=checkpoint_every, lease=lease,
                          progress=progress, wait_seconds=wait_seconds, on_notice=on_notice)
    strategy, notice = effective_strategy(strategy)
    entry = _entry(target)
    func = _scripts.resolve(entry)
    check_call(func, args, entry)  # usage errors before the notice and before the store
    if is_sync(func):
        strategy, notice = "replay", SYNC_NOTICE
    if notice and on_notice is not None:
        on_notice(notice)
    return start(
        store, target, args, run_id=run_id, strategy=strategy,
        checkpoint_every=checkpoint_every or default_snapshot_every(strategy), lease=lease,
        keep=keep, progress=progress, wait_seconds=wait_seconds, verify=verify,
        on_created=None if on_started is None else (lambda run: on_started(run, False)),
        on_notice=on_notice, on_code_change=on_code_change,
    )


def signal(store: Store, run_id: str, name: str, value: Any = None, *,
           raw: bytes | None = None) -> str:
    """Deliver ``value`` (any JSON value; or ``raw``, JSON text as bytes) to the run's next
    ``tcc.wait_for(name)`` and return that wait's id (``NAME@k``); see :func:`send_signal`.
    The delivery is recorded as a ``signalled`` event."""
    try:
        check_signal_name(name)
    except ValueError as exc:
        raise errors.UsageError(str(exc)) from None
    if raw is None:
        raw = json.dumps(value).encode()
    else:
        try:
            json.loads(raw)
        except ValueError as exc:
            raise errors.UsageError(f"the signal's value must be JSON: {exc}") from None
    wait_id = send_signal(store, run_id, name, raw)
    store.add_event(run_id, "signalled", {"id": wait_id, "name": name})
    return wait_id


def answer(store: Store, run_id: str, approved: bool, comment: str | None = None) -> str:
    """Answer the run's pending ``tcc.approval`` (the newest, if several) and return its
    wait id; the answer is recorded as an ``approved``/``rejected`` event with the comment."""
    store.get_run(run_id)  # an unknown run is reported as such
    pending = [w for w in pending_waits(store, run_id) if w.get("kind") == "approval"]
    if not pending:
        raise errors.UsageError(f"run {run_id} has no pending approval")
    wait_id = str(pending[-1]["id"])
    deadline = _wait_deadline(store, run_id, wait_id)
    if deadline is not None and deadline <= time.time():  # it timed out, whether or not the
        import datetime  # (here: a resume imports this module, and needs no datetime)

        raise errors.UsageError(                          # run has resumed to see it yet
            f"approval {wait_id} of run {run_id} timed out at "
            f"{datetime.datetime.fromtimestamp(deadline).isoformat(sep=' ', timespec='seconds')}: "
            "the run gets TimeoutError where it waits, as it would have had it been running")
    value = json.dumps({"approved": approved, "comment": comment}).encode()
    if not store.send_signal(run_id, wait_id, value):
        raise errors.UsageError(f"approval {wait_id} of run {run_id} was already answered")
    store.add_event(run_id, "approved" if approved else "rejected", {"id": wait_id, "comment": comment})
    return wait_id


def _wait_deadline(store: Store, run_id: str, wait_id: str) -> float | None:
    """The deadline the run's wait ``wait_id`` journaled (``tcc.wait_for``/``tcc.approval``
    with a timeout), if any."""
    for call in logged_calls(store.journal(run_id)):
        if call.name == WAIT_EFFECT:
            found, deadline = read_wait_args(load_payload(call.args))
            if found == wait_id:
                return deadline
    return None


@dataclasses.dataclass(frozen=True)
class Cancellation:
    """What :func:`cancel` did: the run as it is now, as it was, and the children cancelled
    with it as ``(child id, the status it had)``."""

    run: RunInfo
    was: RunInfo
    children: list[tuple[str, str]]


def cancel(store: Store, run_id: str, reason: str | None = None) -> Cancellation:
    """Cancel a run: it is never resumed again, and a live owner stops at its next effect
    or checkpoint.  The unfinished runs it spawned (``tcc.spawn``), and theirs, are
    cancelled too: nothing would resume a child whose parent is cancelled, so a waiting
    child would otherwise wait for ever."""
    was = store.get_run(run_id)
    try:
        run = store.cancel_run(run_id, reason=reason)
    except errors.FencedError:
        status = store.get_run(run_id).status
        raise errors.UsageError(f"run {run_id} is already {status}; there is nothing to cancel") from None
    return Cancellation(run, was, _cancel_children(store, run_id, reason))


def _cancel_children(store: Store, run_id: str, reason: str | None) -> list[tuple[str, str]]:
    done: list[tuple[str, str]] = []
    todo = [run_id]
    seen = {run_id}
    while todo:
        parent = todo.pop(0)
        for event in store.events(parent):
            child = dict(event.data).get("child") if event.kind == "spawned" else None
            if not isinstance(child, str) or child in seen:
                continue
            seen.add(child)
            todo.append(child)
            try:
                status = store.get_run(child).status
                if status in LIVE_STATUSES:  # a failed run stays failed
                    store.cancel_run(child, reason=reason or f"its parent run {run_id} was cancelled")
                    done.append((child, status))
            except (errors.FencedError, errors.RunNotFoundError):  # finished or removed meanwhile
                continue
    return done
