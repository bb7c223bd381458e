"""A run's state as a snapshot stores it: the one module that knows its layout.

A snapshot's payload (before :func:`tcc.capture.seal`) is the pickled tuple

    (STATE_TAG, version, coro, resumption, calls, waits, module_state)

- ``coro``: the suspended root coroutine (a greenlet task for a plain ``def`` entry);
- ``resumption``: how the driver resumes it (:data:`Resumption`);
- ``calls``: how many call keys the run has allocated (the next call is ``RUN:calls+1``);
- ``waits``: ``{signal name: how many waits on it the run has reached}``, which numbers
  the wait ids ``NAME@k``;
- ``module_state``: the agent modules' globals (runtime/_globals.py).

Version 1 states end after ``calls`` (5 items), version 2 after ``waits`` (6), version 3
has all 7; every version is read.  A plain tuple, not :class:`RunState`, is what gets
pickled, so the bytes of a snapshot do not depend on this module's classes.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .. import errors

STATE_TAG = "tcc-run-state"
STATE_VERSION = 3

Resumption = tuple[str, Any]
"""How the driver resumes the agent's coroutine next: ``("send", value)``,
``("throw", exception)``, or ``("request", request)``: a wait or a sleep the run parked
on, handled again (and only then answered) when the run resumes."""


class RunState(NamedTuple):
    """A run state, unpacked.  ``waits`` and ``module_state`` are None in a state of a
    version that did not store them yet."""

    coro: Any
    resumption: Resumption
    calls: int
    waits: dict[str, int] | None = None
    module_state: dict[str, dict[str, Any]] | None = None
    version: int = STATE_VERSION


def pack_state(state: RunState) -> tuple[Any, ...]:
    """The tuple a snapshot stores for ``state``: :func:`unpack_state` gives ``state`` back."""
    stored = (STATE_TAG, state.version, state.coro, state.resumption, state.calls)
    if state.module_state is not None:
        return stored + (state.waits, state.module_state)
    return stored + (state.waits,) if state.waits is not None else stored


def unpack_state(stored: Any, run_id: str, number: int | None) -> RunState:
    """The run state a snapshot holds; CorruptSnapshotError if ``stored`` (snapshot
    ``number`` of run ``run_id``) is not one.  The shape is checked, not the items."""
    if not (isinstance(stored, tuple) and len(stored) in (5, 6, 7) and stored[0] == STATE_TAG):
        raise errors.CorruptSnapshotError(f"run {run_id}: snapshot {number} is not a run state")
    _tag, version, coro, resumption, calls, *rest = stored
    waits = rest[0] if rest else None
    module_state = rest[1] if len(rest) > 1 else None
    return RunState(coro, resumption, calls, waits, module_state, version)
