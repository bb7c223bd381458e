"""Signals: named values delivered to a run once, consumed by its owner once.

``signals``: run prefix + name -> ``{"s": "pending" | "consumed", ...}`` and
the value.  A delivery is accepted once per name, ever; consuming one leaves a
*tombstone* (the value, and ``j``: the journal record committed with the
consumption), so a value is handed out at most once.  A tombstone whose
journal record is missing (the store lost writes) counts as pending again:
the run's surviving state has not seen the signal.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..errors import FencedError
from ._codec import Corrupt, as_bytes, check_name, iter_prefix, u64
from ._heads import HEAD, add_member, check_tally
from ._runrecord import fence, load_run

if TYPE_CHECKING:
    from ._scope import Scope

__all__ = [
    "consume_or_fence",
    "pending_signals",
    "peek_signal",
    "send_signal",
    "signal_state",
    "take_signal",
]


def _signal_key(scope: Scope, rid: bytes, name: str) -> bytes:
    return scope.run_prefix(rid) + check_name("signal name", name)


def send_signal(scope: Scope, run_id: str, name: str, value: bytes) -> bool:
    """See :meth:`tcc.store.LmdbStore.send_signal`."""
    rid = scope.check_run_id(run_id)
    key = _signal_key(scope, rid, name)
    value = as_bytes("signal value", value)

    def op(txn: Any) -> bool:
        load_run(scope, txn, rid)
        if txn.get(key, db=scope.dbs["signals"]) is not None:
            return False
        # never delivered -- unless damage lost or moved its record: "once, ever" needs both checks
        _check_absent(scope, txn, run_id, scope.run_prefix(rid))
        rec = scope.sealer.seal(b"signals", key, {"s": "pending", "t": time.time()}, {"v": value})
        txn.put(key, rec, db=scope.dbs["signals"])
        add_member(scope, txn, "signals", scope.run_prefix(rid), 1, f"run {run_id!r}")
        return True

    return scope.write(op)


def take_signal(scope: Scope, run_id: str, epoch: int, name: str) -> bytes | None:
    """See :meth:`tcc.store.LmdbStore.take_signal`."""
    rid = scope.check_run_id(run_id)
    key = _signal_key(scope, rid, name)

    def op(txn: Any) -> bytes | None:
        fence(scope, txn, rid, epoch)
        return _consume(scope, txn, run_id, key, name, epoch)

    return scope.write(op)


def consume_or_fence(scope: Scope, txn: Any, run_id: str, rid: bytes, name: str, epoch: int,
                     jseq: int | None) -> None:
    """Inside a write transaction: consume pending signal ``name``, recorded by
    journal record ``jseq``; FencedError if it is not pending (any more)."""
    skey = _signal_key(scope, rid, name)
    if _consume(scope, txn, run_id, skey, name, epoch, jseq) is None:
        raise FencedError(
            f"signal {name!r} of run {run_id!r} in store {scope.path} is no longer pending "
            "(another process consumed it)")


def _consume(scope: Scope, txn: Any, run_id: str, key: bytes, name: str, epoch: int,
             jseq: int | None = None) -> bytes | None:
    """Inside a write txn: tombstone a pending signal and return its value.

    ``jseq`` is the journal sequence number of the completion that records
    the consumption in the same transaction; the tombstone keeps it and
    the value, so a consumption whose completion record is missing (the
    store lost writes) is recognised and the signal counts as pending.
    """
    found = _open_signal(scope, txn, run_id, key, name)
    if found is None:
        return None
    hdr, blobs = found
    if hdr["s"] != "pending" and not _orphaned(scope, txn, key, hdr):
        return None
    tomb_hdr = {"s": "consumed", "t": hdr["t"], "c": time.time(), "e": epoch}
    if jseq is not None:
        tomb_hdr["j"] = jseq
    value: bytes = blobs["v"]
    tomb = scope.sealer.seal(b"signals", key, tomb_hdr, {"v": value})
    txn.put(key, tomb, db=scope.dbs["signals"])
    return value


def _orphaned(scope: Scope, txn: Any, key: bytes, hdr: dict[str, Any]) -> bool:
    """A consumed signal whose consuming completion record is not in the journal.

    Consumption and that record commit in one transaction, so this only
    happens when the store lost writes (a stale page, a restored backup):
    the run's surviving state has not seen the signal, and it is pending.
    """
    j = hdr.get("j")
    if hdr["s"] != "consumed" or type(j) is not int or j < 0:
        return False
    run_prefix = key[: key.index(b"\x00", key.index(b"\x00") + 1) + 1]
    return txn.get(run_prefix + u64(j), db=scope.dbs["journal"]) is None


def _open_signal(scope: Scope, txn: Any, run_id: str, key: bytes,
                 name: str) -> tuple[Any, Any] | None:
    """The verified (header, blobs) of a signal record, or None if never sent."""
    raw = txn.get(key, db=scope.dbs["signals"])
    if raw is None:  # never sent -- unless damage moved or lost its record
        _check_absent(scope, txn, run_id, key[:len(key) - len(name)])
        return None
    try:
        opened: tuple[Any, Any] = scope.sealer.open(b"signals", key, raw)
    except Corrupt as exc:
        raise scope.corrupt(f"signal {name!r} of run {run_id!r}", exc) from None
    return opened


def _check_absent(scope: Scope, txn: Any, run_id: str, pfx: bytes) -> None:
    """A signal looked up under prefix ``pfx`` was not found: StoreCorruptError unless the
    run's signal records are all there (their count) and all under their own names.

    The count alone misses a record that damage moved to another key of the same run (a
    name with changed bytes): still one record, but the lookup finds nothing and the signal
    would read as never sent -- and could be delivered again.  Each record's MAC covers its
    key, so opening them all finds it.  A miss is rare (a wait that has no answer yet) and
    a run has few signals, so this costs little where it runs.
    """
    check_tally(scope, txn, "signals", pfx, None, f"run {run_id!r}")
    for other, raw in iter_prefix(txn, scope.dbs["signals"], pfx):
        if other.endswith(HEAD):
            continue
        try:
            scope.sealer.open(b"signals", bytes(other), raw)
        except Corrupt as exc:
            raise scope.corrupt(
                f"a signal record of run {run_id!r} (damage may have moved it from the name "
                "looked up)", exc) from None


def _read_signal(scope: Scope, run_id: str, name: str) -> tuple[Any, Any] | None:
    """The signal's verified (header, blobs); an orphaned consumption reads as pending."""
    rid = scope.check_run_id(run_id)
    key = _signal_key(scope, rid, name)

    def op(txn: Any) -> tuple[Any, Any] | None:
        load_run(scope, txn, rid)
        found = _open_signal(scope, txn, run_id, key, name)
        if found is not None and _orphaned(scope, txn, key, found[0]):
            return {**found[0], "s": "pending"}, found[1]
        return found

    return scope.read(op)


def peek_signal(scope: Scope, run_id: str, name: str) -> bytes | None:
    """See :meth:`tcc.store.LmdbStore.peek_signal`."""
    found = _read_signal(scope, run_id, name)
    if found is None or found[0]["s"] != "pending":
        return None
    value: bytes = found[1]["v"]
    return value


def signal_state(scope: Scope, run_id: str, name: str) -> str | None:
    """See :meth:`tcc.store.LmdbStore.signal_state`."""
    found = _read_signal(scope, run_id, name)
    return None if found is None else str(found[0]["s"])


def pending_signals(scope: Scope, run_id: str) -> list[str]:
    """See :meth:`tcc.store.LmdbStore.pending_signals`."""
    rid = scope.check_run_id(run_id)
    pfx = scope.run_prefix(rid)

    def op(txn: Any) -> list[str]:
        load_run(scope, txn, rid)
        out, found = [], 0
        for key, raw in iter_prefix(txn, scope.dbs["signals"], pfx):
            if key.endswith(HEAD):  # the run's signal count
                continue
            found += 1
            try:
                hdr, _ = scope.sealer.open(b"signals", key, raw)
            except Corrupt as exc:
                raise scope.corrupt(f"a signal of run {run_id!r}", exc) from None
            if hdr["s"] == "pending" or _orphaned(scope, txn, bytes(key), hdr):
                out.append(key[len(pfx):].decode())
        check_tally(scope, txn, "signals", pfx, found, f"run {run_id!r}")
        return out

    return scope.read(op)
