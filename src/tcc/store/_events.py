"""Events: each run's audit trail (``events``: run prefix + seq -> sealed record).

Events are numbered 0, 1, 2, ... and never deleted, not even with their run;
the run's event count (a head record) makes a lost newest event visible.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ._api import Event
from ._codec import Corrupt, iter_prefix, seq_key
from ._heads import HEAD, check_tally, next_seq, put_head
from ._runrecord import fence, load_run

if TYPE_CHECKING:
    from ._scope import Scope

__all__ = ["Deferred", "add_event", "append_deferred", "append_event", "events"]

# an event added with ``deferred=True``: (run key, writer's epoch, kind, data, time added)
Deferred = tuple[bytes, int, str, dict[str, Any], float]


def append_event(scope: Scope, txn: Any, rid: bytes, kind: str,
                 data: Mapping[str, Any] | None, at: float | None = None) -> None:
    """Inside a write transaction: append event ``kind`` to run ``rid``'s trail (``at``:
    when it happened, default now)."""
    pfx = scope.run_prefix(rid)
    seq = next_seq(scope, txn, "events", pfx, rid)
    key = seq_key(scope.tenant_key, rid, seq)
    rec = scope.sealer.seal(b"events", key, {"k": kind, "t": time.time() if at is None else at,
                                              "d": dict(data or {})})
    txn.put(key, rec, db=scope.dbs["events"])
    put_head(scope, txn, "events", pfx, seq + 1)


def append_deferred(scope: Scope, txn: Any, events: list[Deferred]) -> None:
    """Inside a write transaction: the events added with ``deferred=True``, in order, each
    only if its run is still at its writer's epoch (else it is void, as a fenced write)."""
    epochs: dict[bytes, int | None] = {}
    for rid, epoch, kind, data, at in events:
        if rid not in epochs:
            try:
                epochs[rid] = load_run(scope, txn, rid)[0]["epoch"]
            except Exception:  # noqa: BLE001 - the run is gone or damaged: nothing to add
                epochs[rid] = None
        if epochs[rid] == epoch:
            append_event(scope, txn, rid, kind, data, at)


def add_event(scope: Scope, run_id: str, kind: str, data: Mapping[str, Any] | None, *,
              epoch: int | None, deferred: bool = False) -> None:
    """See :meth:`tcc.store.LmdbStore.add_event`."""
    rid = scope.check_run_id(run_id)
    if deferred:
        if epoch is None:
            raise ValueError("a deferred event needs its writer's epoch")
        record: Deferred = (rid, epoch, kind, json.loads(json.dumps(dict(data or {}))), time.time())
        with scope.memo_lock:
            scope.deferred.append(record)
        return

    def op(txn: Any) -> None:
        if epoch is None:
            load_run(scope, txn, rid)
        else:
            fence(scope, txn, rid, epoch)
        append_event(scope, txn, rid, kind, data)

    scope.write(op)


def events(scope: Scope, run_id: str) -> list[Event]:
    """See :meth:`tcc.store.LmdbStore.events`."""
    rid = scope.check_run_id(run_id)
    pfx = scope.run_prefix(rid)

    def op(txn: Any) -> list[Event]:
        out: list[Event] = []
        for key, raw in iter_prefix(txn, scope.dbs["events"], pfx):
            if key.endswith(HEAD):  # the count, after the events
                break
            if int.from_bytes(key[-8:], "big") != len(out) or len(key) != len(pfx) + 8:
                # events are appended 0, 1, 2, ... and never deleted
                raise scope.missing(f"event {len(out)} of run {run_id!r}")
            try:
                hdr, _ = scope.sealer.open(b"events", key, raw)
            except Corrupt as exc:
                raise scope.corrupt(f"an event of run {run_id!r}", exc) from None
            out.append(Event(run_id, int.from_bytes(key[-8:], "big"), hdr["k"], hdr["t"], hdr["d"]))
        check_tally(scope, txn, "events", pfx, len(out), f"run {run_id!r}")
        return out

    return scope.read(op)
