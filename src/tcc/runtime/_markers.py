"""Names of the journal's marker records: a wait, a sleep and a spawn are journaled like
effect calls (so a resumed run finds them in order), under these names; and what the run's events say about who ran it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..store import Event

WAIT_EFFECT = "tcc:wait"  # tcc.wait_for / tcc.approval: args are the wait id, or (id, deadline)
SLEEP_EFFECT = "tcc:sleep"  # tcc.sleep / sleep_until: args are the wake time
SPAWN_EFFECT = "tcc:spawn"  # tcc.spawn: args are (function name, *args)
MARKERS = (WAIT_EFFECT, SLEEP_EFFECT)  # markers that are not effects (`tcc show` counts effects)
UPGRADE_EVENT = "upgraded"  # `tcc upgrade` rewrote the run's snapshot (data: the epoch it held)
CLAIM_EVENTS = ("taken_over", "reclaimed")  # a claim (data: new_epoch)


def executed(events: Iterable[Event], before: int | None = None) -> bool:
    """Whether a process has executed the run, from its events: it was started
    (``started``), a resume wrote its first step (``resumed``), or a claim took the run
    (before the claim of epoch ``before``, if given).  A claim of ``tcc upgrade`` (its
    ``upgraded`` event names the epoch) does not count: it rewrote the snapshot and ran
    nothing, so a fork that was only upgraded is still a fork nobody started."""
    upgrades: set[int] = set()
    claims: list[int] = []
    for event in events:
        if event.kind in ("started", "resumed"):
            return True
        data = event.data
        epoch = data.get("epoch") if event.kind == UPGRADE_EVENT else data.get("new_epoch") \
            if event.kind in CLAIM_EVENTS else None
        if not isinstance(epoch, int):
            if event.kind in CLAIM_EVENTS:
                return True  # (a claim event that names no epoch: take it as run)
            continue
        if event.kind == UPGRADE_EVENT:
            upgrades.add(epoch)
        elif before is None or epoch < before:
            claims.append(epoch)
    return any(epoch not in upgrades for epoch in claims)


def wait_args(wait_id: str, deadline: float | None) -> object:
    """What a wait's marker journals: its id, and the deadline of a wait with a timeout (a
    resumed run keeps the first deadline; a signal sent after it goes to the next wait)."""
    return wait_id if deadline is None else (wait_id, deadline)


def read_wait_args(value: object) -> tuple[str | None, float | None]:
    """``(wait id, deadline)`` from a wait marker's journaled arguments (a bare id, as all
    runs journaled before deadlines were, has none); ``(None, None)`` if malformed."""
    if isinstance(value, str):
        return value, None
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str) \
            and isinstance(value[1], (int, float)) and not isinstance(value[1], bool):
        return value[0], float(value[1])
    return None, None
