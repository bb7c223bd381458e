"""Signals, events, forks, deletion and housekeeping (retention, GC, compaction)."""

from __future__ import annotations

import os
import time
import uuid
import warnings
from collections.abc import Mapping
from typing import Any

from ..errors import StoreCorruptError, StoreError
from ._api import Event, GcStats, RunInfo
from ._codec import Corrupt, as_bytes, check_name, prefix, seq_key, u64
from ._core import HOST, StoreCore
from ._env import StoreDamageWarning
from ._refs import HEAD, apply_diff, iter_prefix, snap_rows, sweep

__all__ = ["Maintenance"]


class Maintenance(StoreCore):
    """The parts of :class:`~tcc.store.LmdbStore` beyond runs, journal and snapshots."""

    # ---------------------------------------------------------------- signals
    def send_signal(self, run_id: str, name: str, value: bytes = b"") -> bool:
        """Deliver signal ``name`` to a run; False if that name was delivered before.

        A name is accepted once, ever: a second delivery (even after the first
        was consumed) is refused, so retried senders cannot double-approve.
        """
        rid = self._rid(run_id)
        key = prefix(self._t, rid) + check_name("signal name", name)
        value = as_bytes("signal value", value)

        def op(txn: Any) -> bool:
            self._load_run(txn, rid)
            if txn.get(key, db=self._dbs["signals"]) is not None:
                return False
            # never delivered -- unless damage lost its record: then "once, ever" needs the count
            self._check_tally(txn, "signals", prefix(self._t, rid), None, f"run {run_id!r}")
            rec = self._sealer.seal(b"signals", key, {"s": "pending", "t": time.time()},
                                    {"v": value})
            txn.put(key, rec, db=self._dbs["signals"])
            self._add_member(txn, "signals", prefix(self._t, rid), 1, f"run {run_id!r}")
            return True

        return self._write(op)

    def take_signal(self, run_id: str, epoch: int, name: str) -> bytes | None:
        """Consume a pending signal exactly once; None if none is pending.

        The consumption is fenced by ``epoch`` and leaves a tombstone, so the
        value is handed out at most once even across crashes and takeovers.
        """
        rid = self._rid(run_id)
        key = prefix(self._t, rid) + check_name("signal name", name)

        def op(txn: Any) -> bytes | None:
            self._fence(txn, rid, epoch)
            return self._consume_signal(txn, run_id, key, name, epoch)

        return self._write(op)

    def _consume_signal(self, txn: Any, run_id: str, key: bytes, name: str, epoch: int,
                        jseq: int | None = None) -> bytes | None:
        """Inside a write txn: tombstone a pending signal and return its value.

        ``jseq`` is the journal sequence number of the completion that records
        the consumption in the same transaction; the tombstone keeps it and
        the value, so a consumption whose completion record is missing (the
        store lost writes) is recognised and the signal counts as pending.
        """
        found = self._open_signal(txn, run_id, key, name)
        if found is None:
            return None
        hdr, blobs = found
        if hdr["s"] != "pending" and not self._orphaned(txn, key, hdr):
            return None
        tomb_hdr = {"s": "consumed", "t": hdr["t"], "c": time.time(), "e": epoch}
        if jseq is not None:
            tomb_hdr["j"] = jseq
        value: bytes = blobs["v"]
        tomb = self._sealer.seal(b"signals", key, tomb_hdr, {"v": value})
        txn.put(key, tomb, db=self._dbs["signals"])
        return value

    def _orphaned(self, txn: Any, key: bytes, hdr: dict[str, Any]) -> bool:
        """A consumed signal whose consuming completion record is not in the journal.

        Consumption and that record commit in one transaction, so this only
        happens when the store lost writes (a stale page, a restored backup):
        the run's surviving state has not seen the signal, and it is pending.
        """
        j = hdr.get("j")
        if hdr["s"] != "consumed" or type(j) is not int or j < 0:
            return False
        run_prefix = key[: key.index(b"\x00", key.index(b"\x00") + 1) + 1]
        return txn.get(run_prefix + u64(j), db=self._dbs["journal"]) is None

    def _open_signal(self, txn: Any, run_id: str, key: bytes, name: str) -> tuple[Any, Any] | None:
        """The verified (header, blobs) of a signal record, or None if never sent."""
        raw = txn.get(key, db=self._dbs["signals"])
        if raw is None:  # never sent -- unless damage moved or lost its record
            self._check_tally(txn, "signals", key[:len(key) - len(name)], None, f"run {run_id!r}")
            return None
        try:
            opened: tuple[Any, Any] = self._sealer.open(b"signals", key, raw)
        except Corrupt as exc:
            raise self._corrupt(f"signal {name!r} of run {run_id!r}", exc) from None
        return opened

    def peek_signal(self, run_id: str, name: str) -> bytes | None:
        """The value of a pending signal, without consuming it (None if not pending)."""
        found = self._signal(run_id, name)
        if found is None or found[0]["s"] != "pending":
            return None
        value: bytes = found[1]["v"]
        return value

    def signal_state(self, run_id: str, name: str) -> str | None:
        """``"pending"``, ``"consumed"`` or None (never delivered)."""
        found = self._signal(run_id, name)
        return None if found is None else str(found[0]["s"])

    def _signal(self, run_id: str, name: str) -> tuple[Any, Any] | None:
        """The signal's verified (header, blobs); an orphaned consumption reads as pending."""
        rid = self._rid(run_id)
        key = prefix(self._t, rid) + check_name("signal name", name)

        def op(txn: Any) -> tuple[Any, Any] | None:
            self._load_run(txn, rid)
            found = self._open_signal(txn, run_id, key, name)
            if found is not None and self._orphaned(txn, key, found[0]):
                return {**found[0], "s": "pending"}, found[1]
            return found

        return self._read(op)

    def pending_signals(self, run_id: str) -> list[str]:
        """Names of signals delivered to the run and not consumed yet."""
        rid = self._rid(run_id)
        pfx = prefix(self._t, rid)

        def op(txn: Any) -> list[str]:
            self._load_run(txn, rid)
            out, found = [], 0
            for key, raw in iter_prefix(txn, self._dbs["signals"], pfx):
                if key.endswith(HEAD):  # the run's signal count
                    continue
                found += 1
                try:
                    hdr, _ = self._sealer.open(b"signals", key, raw)
                except Corrupt as exc:
                    raise self._corrupt(f"a signal of run {run_id!r}", exc) from None
                if hdr["s"] == "pending" or self._orphaned(txn, bytes(key), hdr):
                    out.append(key[len(pfx):].decode())
            self._check_tally(txn, "signals", pfx, found, f"run {run_id!r}")
            return out

        return self._read(op)

    # ----------------------------------------------------------------- events
    def add_event(self, run_id: str, kind: str, data: Mapping[str, Any] | None = None, *,
                  epoch: int | None = None) -> None:
        """Append an audit event (``data`` must be JSON-able).

        With ``epoch`` (the run's owner writing), the event is fenced like every
        other write of the owner: after a takeover or a cancel it raises
        FencedError and is not written.
        """
        rid = self._rid(run_id)

        def op(txn: Any) -> None:
            if epoch is None:
                self._load_run(txn, rid)
            else:
                self._fence(txn, rid, epoch)
            self._event(txn, rid, kind, data)

        self._write(op)

    def events(self, run_id: str) -> list[Event]:
        """The run's audit trail, oldest first; kept even after the run is deleted."""
        rid = self._rid(run_id)
        pfx = prefix(self._t, rid)

        def op(txn: Any) -> list[Event]:
            out: list[Event] = []
            for key, raw in iter_prefix(txn, self._dbs["events"], pfx):
                if key.endswith(HEAD):  # the count, after the events
                    break
                if int.from_bytes(key[-8:], "big") != len(out) or len(key) != len(pfx) + 8:
                    # events are appended 0, 1, 2, ... and never deleted
                    raise self._missing(f"event {len(out)} of run {run_id!r}")
                try:
                    hdr, _ = self._sealer.open(b"events", key, raw)
                except Corrupt as exc:
                    raise self._corrupt(f"an event of run {run_id!r}", exc) from None
                out.append(Event(run_id, int.from_bytes(key[-8:], "big"), hdr["k"], hdr["t"], hdr["d"]))
            self._check_tally(txn, "events", pfx, len(out), f"run {run_id!r}")
            return out

        return self._read(op)

    def journal_length(self, run_id: str) -> int:
        """How many journal records the run has, read from its (verified) count record
        alone: ``journal(run_id, journal_length(run_id) - n)`` reads only the last n
        (`tcc show` pages a long journal so).  Read-only."""
        rid = self._rid(run_id)

        def op(txn: Any) -> int:
            self._load_run(txn, rid)  # an unknown run: RunNotFoundError, as journal() says
            n = self._journal_len(txn, prefix(self._t, rid), rid)
            return 0 if n is None else n

        return self._read(op)

    # ------------------------------------------------------------ fork/delete
    def fork_run(
        self, run_id: str, number: int | None = None, *, new_run_id: str | None = None
    ) -> RunInfo:
        """A new run starting from snapshot ``number`` (default newest) of ``run_id``.

        The new run gets a copy of the journal prefix the snapshot reflects
        and shares the snapshot's chunks; the source snapshot is pinned (kept
        past retention) while the fork exists.
        """
        src = self._rid(run_id)
        new = self._rid(new_run_id or uuid.uuid4().hex, new=True)
        sp, np_ = prefix(self._t, src), prefix(self._t, new)
        dbs, sealer = self._dbs, self._sealer

        def op(txn: Any) -> RunInfo:
            shdr, sblobs = self._load_run(txn, src)
            if txn.get(self._t + b"\x00" + new, db=dbs["runs"]) is not None:
                raise StoreError(f"run {new.decode()!r} already exists in store {self.path}")
            self._check_no_remains(txn, new)
            listed = [r[0] for r in self._indexed(txn, sp, src)]
            # (a run killed inside its first effect has no snapshot: num is -1)
            num = number if number is not None else (listed[-1] if listed else -1)
            sval = txn.get(seq_key(self._t, src, num), db=dbs["snaps"]) if num in listed else None
            skey = seq_key(self._t, src, max(num, 0))
            if sval is None:
                which = f"snapshot {number}" if number is not None else (
                    "snapshot yet (it stopped before its first checkpoint): resume it first")
                raise StoreError(f"run {run_id!r} in store {self.path} has no {which}")
            try:
                hdr, blobs = sealer.open(b"snaps", skey, sval)
            except Corrupt as exc:
                raise self._corrupt(f"run {run_id!r} snapshot {num} record", exc) from None
            for key, raw in iter_prefix(txn, dbs["journal"], sp):
                seq = int.from_bytes(key[-8:], "big")
                if seq >= hdr["j"]:
                    break
                try:
                    jh, jb = sealer.open(b"journal", key, raw)
                except Corrupt as exc:
                    raise self._corrupt(f"journal record {seq} of run {run_id!r}", exc) from None
                nk = seq_key(self._t, new, seq)
                txn.put(nk, sealer.seal(b"journal", nk, jh, jb), db=dbs["journal"])
            nkey = seq_key(self._t, new, 1)
            # the source's pending releases are its own: the fork holds only the manifest
            nval = sealer.seal(b"snaps", nkey, hdr, {k: v for k, v in blobs.items() if k != "r"})
            held = set(self._held.held(txn, dbs, skey, sval).ids)
            apply_diff(txn, dbs, set(), held, lambda _cid: None)
            txn.put(nkey, nval, db=dbs["snaps"])
            self._put_index(txn, np_, new, [1], hdr["j"])
            txn.put(sp + u64(num) + b"\x00" + new, b"", db=dbs["pins"])
            now = time.time()
            rhdr = {"entry": shdr["entry"], "strategy": shdr["strategy"], "status": "running",
                    "created": now, "updated": now, "epoch": 1, "host": HOST, "pid": os.getpid(),
                    "lease": now + 30.0, "parent": [src.decode(), num]}
            rblobs = {"args": sblobs.get("args", b"")}
            self._put_run(txn, new, rhdr, rblobs)
            self._add_member(txn, "runs", self._t + b"\x00", 1, f"tenant {self.tenant!r}")
            self._event(txn, new, "created", {"forked_from": src.decode(), "snapshot": num})
            self._event(txn, src, "forked", {"snapshot": num, "child": new.decode()})
            return self._info(new, rhdr, rblobs)

        return self._write(op)

    def delete_run(self, run_id: str) -> None:
        """Delete a run's record, journal, snapshots, signals and pins (events stay)."""
        rid = self._rid(run_id)
        pfx = prefix(self._t, rid)
        dbs = self._dbs

        def op(txn: Any) -> None:
            hdr, _ = self._load_run(txn, rid)
            rows = snap_rows(txn, dbs["snaps"], pfx)
            apply_diff(txn, dbs, self._held.run_held(txn, dbs, rows), set(), lambda _a: None)
            for name in ("snaps", "journal", "signals", "pins"):
                keys = [bytes(k) for k, _ in iter_prefix(txn, dbs[name], pfx)]
                for k in keys:
                    txn.delete(k, db=dbs[name])
            parent = hdr.get("parent")
            if parent:
                pk = prefix(self._t, parent[0].encode()) + u64(parent[1]) + b"\x00" + rid
                txn.delete(pk, db=dbs["pins"])
            txn.delete(self._t + b"\x00" + rid, db=dbs["runs"])
            self._add_member(txn, "runs", self._t + b"\x00", -1, f"tenant {self.tenant!r}")
            self._event(txn, rid, "deleted", {})

        self._write(op)

    # ----------------------------------------------------------- housekeeping
    def gc(self) -> GcStats:
        """Apply retention to this tenant's runs, then sweep chunks store-wide.

        The sweep recounts every chunk's references from all manifests (all
        tenants), deletes chunks nothing references and repairs counts that a
        damaged manifest left wrong.  Runs in one write transaction.
        """
        dbs = self._dbs
        tp = self._t + b"\x00"

        damaged: list[str] = []
        unreadable = [0]  # snapshots that fail verification, from the sweep

        def op(txn: Any) -> GcStats:
            dropped = 0
            damaged.clear()
            for key, _ in list(iter_prefix(txn, dbs["runs"], tp)):
                if key.endswith(HEAD):  # the tenant's run count
                    continue
                rid = bytes(key[len(tp):])
                pfx = prefix(self._t, rid)
                try:
                    rows = self._indexed(txn, pfx, rid)
                    run_keep = self._load_run(txn, rid)[0].get("keep")
                except StoreCorruptError as exc:  # keep all it has: deleting could lose more
                    damaged.append(str(exc))
                    continue
                dropped += self._retain(txn, pfx, rows, None, set(), lambda _a: None, keep=run_keep)[0]
            deleted, repaired, unreadable[0] = sweep(txn, dbs, self._held)
            return GcStats(snapshots_deleted=dropped, chunks_deleted=deleted,
                           refs_repaired=repaired)

        stats = self._write(op)
        for why in damaged:
            warnings.warn(f"gc left a damaged run as it is: {why}", StoreDamageWarning, stacklevel=2)
        if unreadable[0]:
            warnings.warn(
                f"store {self.path}: {unreadable[0]} snapshot(s) fail verification, so gc deleted "
                "no chunk (the chunks they reference cannot be known); restore the store from a "
                "backup, or delete the damaged runs, to let gc free space again",
                StoreDamageWarning, stacklevel=2)
        size = self._h.file_size()
        return GcStats(stats.snapshots_deleted, stats.chunks_deleted, stats.refs_repaired,
                       size, size)

    def compact(self) -> GcStats:
        """Rewrite the data file without free pages and swap it in atomically.

        LMDB files never shrink on their own.  This needs the store to be open
        in no other process (StoreError otherwise); run :meth:`gc` first.
        """
        if self._closed:
            raise StoreError(f"store {self.path} is closed")
        before, after = self._h.compact()
        return GcStats(bytes_before=before, bytes_after=after)
