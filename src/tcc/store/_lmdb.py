"""``LmdbStore``: the :class:`~tcc.store.Store` interface on one LMDB environment."""

from __future__ import annotations

import math
import os
import time
import uuid
from typing import Any

from .._proc import pid_alive
from ..errors import FencedError, StoreCorruptError, StoreError, UsageError
from ._api import RUN_STATUSES, Completion, JournalRecord, RunInfo, SnapshotInfo
from ._chunks import (
    INLINE_MAX,
    ChunkEncoder,
    SplitMemo,
    build_manifest,
    encode_chunk,
    encode_node,
    pack_entries,
    split,
)
from ._codec import Corrupt, as_bytes, check_int, check_name, prefix, seq_key
from ._core import HOST, last_seq
from ._maint import Maintenance
from ._refs import HEAD, SnapRow, iter_prefix, next_chunk_id, snap_rows

__all__ = ["LmdbStore"]


class _RunMemo:
    """What this process remembers of a run's last checkpoint (memory only)."""

    __slots__ = ("split", "groups", "tag", "by_addr")

    def __init__(self) -> None:
        self.split = SplitMemo()
        self.groups: dict[bytes, bytes] = {}  # group node content -> address
        self.tag: bytes | None = None  # MAC of the newest snapshot record, if known
        self.by_addr: dict[bytes, int] = {}  # its address -> chunk id map


class _OpenIntents:
    """What this process knows of a run's journal from what it committed itself:
    among records ``first`` to ``end - 1``, the intents with no completion there.

    It lets a completion be checked against its intent without reading the journal
    from the intent on (a ``tcc.gather`` of N calls read N records per completion).
    Only commits this process saw succeed go in; records others appended since are
    read from ``end`` on; ``created`` (the run's creation time) tells a run deleted
    and created again under the same id.  An intent it does not list is checked by
    reading the journal, which decides (memory only, never trusted to refuse).
    """

    __slots__ = ("created", "first", "end", "open")

    def __init__(self, created: float, first: int) -> None:
        self.created = created
        self.first = self.end = first
        self.open: set[int] = set()


def _check_lease(lease: object) -> None:
    # nan would make every claimer see the owner as dead, inf would never expire
    if not isinstance(lease, (int, float)) or not math.isfinite(lease) or lease < 0:
        raise UsageError(f"lease must be a finite number of seconds >= 0, not {lease!r}")


class LmdbStore(Maintenance):
    """Runs, journal, snapshots, signals and events of one tenant, in LMDB.

    Thread-safe; several processes may open the same store.  Create it with
    :func:`tcc.store.open_store`.
    """

    # ------------------------------------------------------------------- runs
    def create_run(
        self,
        entry: str,
        args: bytes = b"",
        *,
        strategy: str = "continuation",
        run_id: str | None = None,
        lease: float = 30.0,
        keep: int | None = None,
    ) -> RunInfo:
        """Create a run owned by this process: epoch 1, status ``running``.

        ``keep``: the run's own snapshot retention (default: the store's)."""
        rid = self._rid(uuid.uuid4().hex if run_id is None else run_id, new=True)
        if keep is not None:
            check_int("keep", keep, 1)
        if not isinstance(entry, str) or not entry:
            raise UsageError(f"entry must be a non-empty string (script[:function]), not {entry!r}")
        _check_lease(lease)
        now = time.time()
        hdr = {"entry": entry, "strategy": strategy, "status": "running", "created": now,
               "updated": now, "epoch": 1, "host": HOST, "pid": os.getpid(),
               "lease": now + lease, "parent": None}
        if keep is not None:
            hdr["keep"] = keep
        blobs = {"args": as_bytes("args", args)}

        def op(txn: Any) -> RunInfo:
            if txn.get(self._t + b"\x00" + rid, db=self._dbs["runs"]) is not None:
                raise StoreError(f"run {rid.decode()!r} already exists in store {self.path}")
            self._check_no_remains(txn, rid)
            self._put_run(txn, rid, hdr, blobs)
            self._add_member(txn, "runs", self._t + b"\x00", 1, f"tenant {self.tenant!r}")
            self._event(txn, rid, "created", {"entry": entry, "epoch": 1})
            return self._info(rid, hdr, blobs)

        return self._write(op)

    def get_run(self, run_id: str) -> RunInfo:
        """The run, or RunNotFoundError (also for other tenants' runs)."""
        rid = self._rid(run_id)
        return self._read(lambda txn: self._info(rid, *self._load_run(txn, rid)))

    def list_runs(self, status: str | None = None, *,
                  damaged: list[tuple[str, str]] | None = None) -> list[RunInfo]:
        """This tenant's runs (optionally with one status), ordered by run id.

        A run record that fails verification raises StoreCorruptError, unless
        ``damaged`` is a list: then ``(run id, error message)`` is appended to
        it and the listing goes on with the other runs.
        """
        pfx = self._t + b"\x00"

        def op(txn: Any) -> list[RunInfo]:
            out, found = [], 0
            bad: list[tuple[str, str]] = []
            for key, _ in iter_prefix(txn, self._dbs["runs"], pfx):
                if key.endswith(HEAD):  # the tenant's run count
                    continue
                found += 1
                rid = key[len(pfx):]
                try:
                    info = self._info(rid, *self._load_run(txn, rid))
                except StoreCorruptError as exc:
                    if damaged is None:
                        raise
                    bad.append((rid.decode("utf-8", "replace"), str(exc)))
                    continue
                if status is None or info.status == status:
                    out.append(info)
            self._check_tally(txn, "runs", pfx, found, f"tenant {self.tenant!r}")
            if damaged is not None:
                damaged.extend(bad)  # once: a read retried after a map resize runs op again
            return out

        return self._read(op)

    def claim_run(self, run_id: str, *, lease: float = 30.0, steal: bool = False) -> RunInfo:
        """Take ownership: epoch + 1, owner = this process, so older writers are fenced.

        Refused (FencedError) while another live owner's lease runs, unless
        ``steal``.  An owner on this host whose pid is gone counts as dead.
        """
        _check_lease(lease)
        rid = self._rid(run_id)

        def op(txn: Any) -> RunInfo:
            hdr, blobs = self._load_run(txn, rid)
            if hdr["status"] in ("completed", "cancelled"):
                # checked in the claiming transaction: a resumer that looked at
                # the run before another one finished it cannot reopen it
                raise FencedError(f"run {run_id!r} in store {self.path} is already {hdr['status']}")
            now = time.time()
            mine = hdr["host"] == HOST and hdr["pid"] == os.getpid()
            alive = hdr["lease"] > now and not mine and not steal
            if alive and hdr["host"] == HOST:
                alive = pid_alive(hdr["pid"])
            if alive:
                raise FencedError(
                    f"run {run_id!r} in store {self.path} is owned by {hdr['host']}:{hdr['pid']} "
                    f"for {hdr['lease'] - now:.1f} s more; wait for it to finish or its lease to "
                    "expire, or take it over anyway (`tcc resume --steal`, claim_run(steal=True))")
            prev = {"epoch": hdr["epoch"], "owner": f"{hdr['host']}:{hdr['pid']}"}
            hdr.update(epoch=hdr["epoch"] + 1, host=HOST, pid=os.getpid(), lease=now + lease,
                       updated=now)
            self._put_run(txn, rid, hdr, blobs)
            self._event(txn, rid, "reclaimed" if mine else "taken_over",
                        {**prev, "new_epoch": hdr["epoch"]})
            return self._info(rid, hdr, blobs)

        return self._write(op)

    def cancel_run(self, run_id: str, *, reason: str | None = None) -> RunInfo:
        """Cancel a run that has not completed: status ``cancelled``, epoch + 1.

        The epoch bump fences a live owner: its next commit raises
        FencedError and writes nothing, so the run stops at its next effect
        or checkpoint.  Resumers, ``tcc run`` and the worker leave a cancelled
        run alone.  Refused (FencedError) if the run is already completed or
        cancelled.
        """
        rid = self._rid(run_id)

        def op(txn: Any) -> RunInfo:
            hdr, blobs = self._load_run(txn, rid)
            if hdr["status"] in ("completed", "cancelled"):
                raise FencedError(f"run {run_id!r} in store {self.path} is already {hdr['status']}")
            prev = {"epoch": hdr["epoch"], "owner": f"{hdr['host']}:{hdr['pid']}",
                    "status": hdr["status"]}
            now = time.time()
            hdr.update(epoch=hdr["epoch"] + 1, status="cancelled", host=HOST, pid=os.getpid(),
                       lease=0.0, updated=now)
            self._put_run(txn, rid, hdr, blobs)
            self._event(txn, rid, "cancelled", {**prev, "new_epoch": hdr["epoch"], "reason": reason})
            return self._info(rid, hdr, blobs)

        return self._write(op)

    def renew_lease(self, run_id: str, epoch: int, lease: float = 30.0) -> RunInfo:
        """Extend this owner's lease to ``lease`` seconds from now.

        Also sets ``updated``: the owner's heartbeat renews the lease every
        lease/3 s, so a live run's ``updated`` stays current during long
        effects and between checkpoints (which do not rewrite the run record).
        """
        _check_lease(lease)
        rid = self._rid(run_id)

        def op(txn: Any) -> RunInfo:
            hdr, blobs = self._fence(txn, rid, epoch)
            now = time.time()
            hdr.update(lease=now + lease, updated=now)
            self._put_run(txn, rid, hdr, blobs)
            return self._info(rid, hdr, blobs)

        return self._write(op)

    def set_status(
        self,
        run_id: str,
        epoch: int,
        status: str,
        *,
        result: bytes | None = None,
        error: bytes | None = None,
    ) -> RunInfo:
        """Change the status (recording ``result``/``error``) and log an event."""
        if status not in RUN_STATUSES:
            raise ValueError(f"status must be one of {RUN_STATUSES}, not {status!r}")
        rid = self._rid(run_id)

        def op(txn: Any) -> RunInfo:
            hdr, blobs = self._fence(txn, rid, epoch)
            hdr.update(status=status, updated=time.time())
            if result is not None:
                blobs["result"] = as_bytes("result", result)
            if error is not None:
                blobs["error"] = as_bytes("error", error)
            self._put_run(txn, rid, hdr, blobs)
            self._event(txn, rid, status, {"epoch": epoch})
            return self._info(rid, hdr, blobs)

        return self._write(op)

    # ---------------------------------------------------------------- journal
    def _put_journal(self, txn: Any, rid: bytes, seq: int, hdr: dict[str, Any],
                     blobs: dict[str, bytes], count: bool = True) -> None:
        """Append record ``seq`` (from :meth:`_next_seq`) and count it in the journal
        head (``count``; a checkpoint counts it in the snapshot index instead)."""
        key = seq_key(self._t, rid, seq)
        txn.put(key, self._sealer.seal(b"journal", key, hdr, blobs), db=self._dbs["journal"])
        if count:
            self._put_head(txn, "journal", key[:-8], seq + 1)

    def _completion(self, txn: Any, rid: bytes, seq: int, c: Completion, now: float,
                    created: float, count: bool = True) -> None:
        check_int("completion intent_seq", c.intent_seq)
        blobs = {}
        if c.result is not None:
            blobs["r"] = as_bytes("completion result", c.result)
        if c.error is not None:
            blobs["e"] = as_bytes("completion error", c.error)
        self._check_open_intent(txn, rid, seq, c.intent_seq, created)
        self._put_journal(txn, rid, seq, {"k": "c", "t": now, "i": c.intent_seq,
                                          "d": c.duration}, blobs, count)

    def _journal_headers(self, txn: Any, rid: bytes, start: int, stop: int) -> Any:
        """Yield ``(seq, verified header)`` of the run's journal records from ``start``
        up to ``stop - 1`` that are stored."""
        db = self._dbs["journal"]
        first = seq_key(self._t, rid, start)
        for key, value in iter_prefix(txn, db, first[:-8], first):
            at = int.from_bytes(key[-8:], "big")
            if key.endswith(HEAD) or len(key) != len(first) or at >= stop:
                return
            try:
                h, _ = self._sealer.open(b"journal", key, value)
            except Corrupt as exc:
                raise self._corrupt(f"journal record {at} of run {rid.decode()!r}", exc) from None
            yield at, h

    def _check_open_intent(self, txn: Any, rid: bytes, seq: int, intent_seq: int,
                           created: float) -> None:
        """A completion journaled at ``seq`` must answer an intent of the run that has
        no completion yet; else UsageError (and, from the caller's transaction, nothing
        written).

        What this process committed itself answers at once (:class:`_OpenIntents`);
        otherwise the records from the intent up to ``seq`` are read.
        """
        run = rid.decode()
        if intent_seq >= seq:
            raise UsageError(
                f"a completion of run {run!r} names intent {intent_seq}, but the run's journal "
                f"has {seq} records; pass the sequence number append_intent returned")
        with self._memo_lock:
            known = self._intents.get(rid)
            if known is not None and not (known.created == created and known.first <= intent_seq
                                          < known.end <= seq):
                known = None  # (an intent past its end: reading from the intent is shorter)
            opened = set(known.open) if known is not None else set()
            end = known.end if known is not None else seq
        if known is not None:
            for at, h in self._journal_headers(txn, rid, end, seq):  # appended by others
                if h.get("k") == "i":
                    opened.add(at)
                elif h.get("k") == "c":
                    opened.discard(h.get("i"))
            if intent_seq in opened:
                return
        name = None
        for at, h in self._journal_headers(txn, rid, intent_seq, seq):
            if name is None:
                if at != intent_seq:
                    break
                if h.get("k") != "i":
                    raise UsageError(
                        f"a completion of run {run!r} names journal record {intent_seq}, which is "
                        f"a completion (of intent {h.get('i')}), not an intent")
                name = h.get("n")
            elif h.get("k") == "c" and h.get("i") == intent_seq:
                raise UsageError(
                    f"intent {intent_seq} ({name}) of run {run!r} already has its completion "
                    f"(journal record {at}); an effect's outcome is journaled once")
        if name is None:
            raise self._missing(f"journal record {intent_seq} of run {run!r}")

    def _noted(self, rid: bytes, created: float, seq: int, *, intent: bool = False,
               answers: int | None = None) -> None:
        """After a commit: journal record ``seq`` of the run is an intent (``intent``) or
        the completion of intent ``answers``; keep :class:`_OpenIntents` up to date."""
        with self._memo_lock:
            known = self._intents.pop(rid, None)
            if known is None or known.created != created or known.end != seq:
                known = _OpenIntents(created, seq)
            if intent:
                known.open.add(seq)
            elif answers is not None:
                known.open.discard(answers)
            known.end = seq + 1
            self._intents[rid] = known  # most recent last
            while len(self._intents) > 64:
                self._intents.pop(next(iter(self._intents)))

    def append_intent(
        self,
        run_id: str,
        epoch: int,
        name: str,
        args: bytes = b"",
        *,
        idempotency_key: str | None = None,
        attempt: int = 1,
    ) -> int:
        """Journal an effect about to run; returns its sequence number."""
        rid = self._rid(run_id)
        args_b = as_bytes("args", args)
        if not isinstance(name, str) or not name:
            raise UsageError(f"effect name must be a non-empty string, not {name!r}")
        check_int("attempt", attempt, 1)

        def op(txn: Any) -> tuple[int, float]:
            hdr, _ = self._fence(txn, rid, epoch)
            seq = self._next_seq(txn, "journal", prefix(self._t, rid), rid)
            self._put_journal(txn, rid, seq, {"k": "i", "t": time.time(), "n": name,
                                              "ik": idempotency_key, "a": attempt},
                              {"args": args_b})
            return seq, hdr["created"]

        seq, created = self._write(op)
        self._noted(rid, created, seq, intent=True)
        return seq

    def append_completion(self, run_id: str, epoch: int, completion: Completion, *,
                          consume_signal: str | None = None) -> int:
        """Journal an effect's outcome without a snapshot; returns its sequence number.

        ``consume_signal`` is consumed in the same transaction, as in
        :meth:`checkpoint`.
        """
        rid = self._rid(run_id)

        def op(txn: Any) -> tuple[int, float]:
            hdr, _ = self._fence(txn, rid, epoch)
            seq = self._next_seq(txn, "journal", prefix(self._t, rid), rid)
            if consume_signal is not None:
                self._consume_or_fence(txn, run_id, rid, consume_signal, epoch, seq)
            self._completion(txn, rid, seq, completion, time.time(), hdr["created"])
            return seq, hdr["created"]

        seq, created = self._write(op)
        self._noted(rid, created, seq, answers=completion.intent_seq)
        return seq

    def _consume_or_fence(self, txn: Any, run_id: str, rid: bytes, name: str, epoch: int,
                          jseq: int | None) -> None:
        skey = prefix(self._t, rid) + check_name("signal name", name)
        if self._consume_signal(txn, run_id, skey, name, epoch, jseq) is None:
            raise FencedError(
                f"signal {name!r} of run {run_id!r} in store {self.path} is no longer pending "
                "(another process consumed it)")

    def journal(self, run_id: str, start: int = 0) -> list[JournalRecord]:
        """The run's journal records with ``seq >= start``, in order (all verified)."""
        rid = self._rid(run_id)

        def op(txn: Any) -> list[JournalRecord]:
            self._load_run(txn, rid)
            out: list[JournalRecord] = []
            first = seq_key(self._t, rid, max(0, start))
            for key, value in iter_prefix(txn, self._dbs["journal"], first[:-8], first):
                if key.endswith(HEAD):  # the count, after the records
                    break
                seq = int.from_bytes(key[-8:], "big")
                if seq < start:
                    continue
                expect = max(0, start) + len(out)
                if seq != expect or len(key) != len(first):
                    # records are appended 0, 1, 2, ... and never deleted alone
                    raise self._missing(f"journal record {expect} of run {run_id!r}")
                try:
                    h, b = self._sealer.open(b"journal", key, value)
                except Corrupt as exc:
                    raise self._corrupt(f"journal record {seq} of run {run_id!r}", exc) from None
                if h["k"] == "i":
                    out.append(JournalRecord(seq, "intent", h["t"], name=h["n"], args=b.get("args"),
                                             idempotency_key=h["ik"], attempt=h["a"]))
                else:
                    out.append(JournalRecord(seq, "completion", h["t"], intent_seq=h["i"],
                                             result=b.get("r"), error=b.get("e"), duration=h["d"]))
            # the newest records leave no gap when they go: the count says how many there are
            pfx = first[:-8]
            end = max(0, start) + len(out) if out else last_seq(txn, self._dbs["journal"], pfx) + 1
            self._check_tally(txn, "journal", pfx, end, f"run {run_id!r}")
            return out

        return self._read(op)

    # -------------------------------------------------------------- snapshots
    def checkpoint(
        self,
        run_id: str,
        epoch: int,
        payload: bytes,
        *,
        completion: Completion | None = None,
        consume_signal: str | None = None,
    ) -> SnapshotInfo:
        """Journal ``completion`` (if given) and store ``payload`` as the next snapshot.

        ``consume_signal`` names a pending signal to consume in the same
        transaction (the snapshot already holds its value, read with
        :meth:`peek_signal`); if it is no longer pending, FencedError is raised
        and nothing is written.

        Both land in ONE write transaction that first checks ``epoch``
        (FencedError, nothing written, if stale).  Pass the *uncompressed*
        payload: it is chunked by content and each new chunk compressed, so a
        payload that changed a little costs a little.  Snapshots beyond the
        newest ``keep`` (and not pinned by a fork) are dropped in the same
        transaction.
        """
        rid = self._rid(run_id)
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise UsageError(f"snapshot payload must be bytes, not {type(payload).__name__}")
        sealer, dbs, held = self._sealer, self._dbs, self._held
        with self._memo_lock:
            memo = self._memos.pop(rid, None) or _RunMemo()
        size = len(memoryview(payload).cast("B"))
        inline = size <= INLINE_MAX
        # small payloads are stored whole in the record; larger ones are cut by content
        ordered = [] if inline else split(sealer, payload, memo.split)
        pfx = prefix(self._t, rid)
        now = time.time()

        if memo.tag is None and not inline:
            def previous(txn: Any) -> tuple[bytes | None, dict[bytes, int]]:
                """The newest snapshot's record MAC and its address -> chunk id map."""
                rows = snap_rows(txn, dbs["snaps"], pfx)
                if not rows:
                    return None, {}
                _, key, value = rows[-1]
                return bytes(value[:16]), held.held(txn, dbs, key, value).by_addr

            memo.tag, memo.by_addr = self._read(previous)
        # Compress what is new outside the write transaction.  The guess of what
        # is stored (this process's last commit of the run) is checked in the
        # transaction against the newest snapshot's MAC.
        prev_tag, prev_map = memo.tag, memo.by_addr
        encoded: dict[bytes, bytes] = {}
        encode, lock = ChunkEncoder().encode, sealer.lock_chunk
        for h, p in ordered:
            if h not in prev_map and h not in encoded:
                encoded[h] = lock(h, encode(p))  # (encrypted too, in an encrypted store)
        whole = encode_chunk(payload) if inline else b""
        box: list[Any] = []
        answered: list[Any] = []  # [run created, seq] of the completion journaled

        def op(txn: Any) -> SnapshotInfo:
            run_hdr, _ = self._fence(txn, rid, epoch)
            jlen = self._next_seq(txn, "journal", pfx, rid)
            if consume_signal is not None:  # recorded by the completion at jlen, if any
                self._consume_or_fence(txn, run_id, rid, consume_signal, epoch,
                                       jlen if completion is not None else None)
            # the index counts the journal from here on: drop the journal head first, so
            # that the completion is appended at the end of its page (see _refs)
            txn.delete(pfx + HEAD, db=dbs["journal"])
            if completion is not None:
                self._completion(txn, rid, jlen, completion, now, run_hdr["created"], count=False)
                answered[:] = [run_hdr["created"], jlen]
                jlen += 1
            rows = self._indexed(txn, pfx, rid)
            number = rows[-1][0] + 1 if rows else 1
            key = seq_key(self._t, rid, number)
            ids: dict[bytes, int] = {}
            if inline:
                def seal(pending: bytes) -> SnapRow:
                    blobs = {"p": whole, "r": pending} if pending else {"p": whole}
                    return number, key, sealer.seal(
                        b"snaps", key, {"j": jlen, "s": size, "t": now, "g": 0}, blobs)

                _, row, pending = self._retain(txn, pfx, rows, number, set(), lambda _c: None, seal,
                                               jlen, keep=run_hdr.get("keep"))
            else:
                row, pending = self._put_chunks(txn, pfx, rows, number, key, run_hdr.get("keep"),
                                                prev_tag, prev_map, ordered,
                                       encoded, memo, ids, {"j": jlen, "s": size, "t": now})
            assert row is not None
            value = row[2]
            held.remember(key, value, ids, pending)
            box[:] = [bytes(value[:16]), ids]
            return SnapshotInfo(run_id, number, jlen, size, now)

        ok = False
        try:
            info = self._write(op)
            ok = True
            if completion is not None:
                self._noted(rid, answered[0], answered[1], answers=completion.intent_seq)
            return info
        finally:
            if ok:
                memo.tag, memo.by_addr = box
            else:  # unknown state: look the newest snapshot up next time
                memo.tag, memo.by_addr = None, {}
            with self._memo_lock:
                self._memos[rid] = memo
                while len(self._memos) > 8:
                    self._memos.pop(next(iter(self._memos)))

    def _put_chunks(
        self,
        txn: Any,
        pfx: bytes,
        rows: list[SnapRow],
        number: int,
        key: bytes,
        keep: int | None,
        prev_tag: bytes | None,
        prev_map: dict[bytes, int],
        ordered: list[tuple[bytes, memoryview]],
        encoded: dict[bytes, bytes],
        memo: _RunMemo,
        ids: dict[bytes, int],
        hdr: dict[str, Any],
    ) -> tuple[SnapRow | None, frozenset[int]]:
        """Store the chunks of a cut payload that are new, its manifest and its record.

        ``ids`` receives the address -> chunk id map of the new snapshot.
        Returns the record and its pending releases.
        """
        sealer, dbs, held = self._sealer, self._dbs, self._held
        tag = bytes(rows[-1][2][:16]) if rows else None
        if tag == prev_tag:
            by_addr = prev_map
        else:  # another writer (or process) committed since this process last did
            by_addr = held.held(txn, dbs, rows[-1][1], rows[-1][2]).by_addr if rows else {}
        next_id = first_new = next_chunk_id(txn, dbs["chunks"])
        new: dict[int, bytes] = {}
        get = by_addr.get

        def chunk_id(addr: bytes) -> int:
            nonlocal next_id
            cid = ids.get(addr)
            if cid is None:
                cid = get(addr)
                if cid is None:
                    cid = next_id
                    next_id += 1
                    new[cid] = addr
                ids[addr] = cid
            return cid

        leaves = []
        for h, p in ordered:
            cid = get(h)
            if cid is None:
                cid = chunk_id(h)
            else:
                ids[h] = cid
            leaves.append((cid, h, len(p)))
        depth, top, nodes = build_manifest(sealer, leaves, chunk_id, memo.groups)

        def stored_form(cid: int) -> bytes | None:
            addr = new.get(cid)
            if addr is None:
                return None
            if cid in nodes:
                return sealer.lock_chunk(addr, encode_node(nodes[cid]))
            got = encoded.get(addr)
            if got is None:
                got = sealer.lock_chunk(addr, encode_chunk(dict(ordered)[addr]))
            return got

        def seal(pending: bytes) -> SnapRow:
            blobs = {"m": pack_entries(top), "r": pending} if pending else {"m": pack_entries(top)}
            return number, key, sealer.seal(b"snaps", key, {**hdr, "g": depth}, blobs)

        _, row, pending = self._retain(txn, pfx, rows, number, set(ids.values()), stored_form, seal,
                                       hdr["j"], first_new, keep=keep)
        return row, pending

    def snapshots(self, run_id: str) -> list[SnapshotInfo]:
        """Stored snapshots of the run, oldest first.

        Every record is verified; one that fails, one the run's index lists
        but the store lacks, and one stored under the run's keys that the
        index does not list are all listed with ``damaged=True`` (only the
        number is known), so damage neither hides a snapshot nor passes for
        one.  A missing or damaged index raises StoreCorruptError.
        """
        rid = self._rid(run_id)
        pfx = prefix(self._t, rid)

        def op(txn: Any) -> list[SnapshotInfo]:
            self._load_run(txn, rid)
            pinned = self._pinned(txn, pfx)
            rows = {number: (key, value) for number, key, value in
                    snap_rows(txn, self._dbs["snaps"], pfx)}
            nums = self._index(txn, pfx, rid)
            if nums is None and rows:
                raise self._missing(f"the snapshot index of run {run_id!r}")
            listed = set(nums or ())
            out = []
            for number in sorted(listed | set(rows)):
                try:
                    if number not in listed or number not in rows:
                        raise Corrupt("not where the index says")
                    key, value = rows[number]
                    h, _ = self._sealer.open(b"snaps", key, value)
                    info = SnapshotInfo(run_id, number, int(h["j"]), int(h["s"]), float(h["t"]),
                                        number in pinned)
                except (Corrupt, KeyError, TypeError, ValueError):
                    info = SnapshotInfo(run_id, number, -1, -1, 0.0, number in pinned, damaged=True)
                out.append(info)
            return out

        return self._read(op)

    def load_snapshot(self, run_id: str, number: int | None = None) -> bytes:
        """The verified payload of snapshot ``number`` (default: newest).

        Raises StoreCorruptError (naming run and snapshot) if any part fails
        verification; damaged bytes are never returned.
        """
        rid = self._rid(run_id)
        if number is not None:
            check_int("snapshot number", number, 1)
        return self._read(lambda txn: self._load(txn, rid, number))[1]

    def latest_good_snapshot(self, run_id: str) -> tuple[SnapshotInfo, bytes] | None:
        """The newest snapshot that verifies (None if none does).

        Each damaged snapshot skipped is recorded as a ``snapshot_corrupt``
        event, and a fallback as a ``fell_back`` event.  Snapshots the run's
        index lists but the store lost (damage moved or removed their records)
        are also recorded as ``snapshot_corrupt`` and dropped from the index,
        so that the run can checkpoint again.
        """
        rid = self._rid(run_id)
        pfx = prefix(self._t, rid)

        def numbers(txn: Any) -> tuple[list[int], set[int]]:
            """The numbers the index lists, and those of them whose record is gone."""
            self._load_run(txn, rid)
            present = {r[0] for r in snap_rows(txn, self._dbs["snaps"], pfx)}
            nums = self._index(txn, pfx, rid)
            if nums is None:
                if present:
                    raise self._missing(f"the snapshot index of run {run_id!r}")
                return [], set()
            return nums, set(nums) - present

        listed, lost = self._read(numbers)
        bad: list[tuple[int, str]] = []
        found: tuple[SnapshotInfo, bytes] | None = None
        for number in reversed(listed):
            try:
                found = self._read(lambda txn: self._load(txn, rid, number))
                break
            except StoreCorruptError as exc:
                bad.append((number, str(exc)))
        # an older snapshot lost below the one used is no fallback, but it is damage
        tried = {number for number, _ in bad}
        older = [(n, str(self._missing(f"run {run_id!r} snapshot {n}"))) for n in sorted(lost - tried)]
        if bad or older:
            def note(txn: Any) -> None:
                for number, why in bad + older:
                    self._event(txn, rid, "snapshot_corrupt", {"number": number, "error": why})
                if bad:
                    self._event(txn, rid, "fell_back", {
                        "from": bad[0][0], "to": found[0].number if found else None})
                if lost:  # the index stops naming what damage took, so the run can go on
                    nums = self._index(txn, pfx, rid)
                    present = {r[0] for r in snap_rows(txn, self._dbs["snaps"], pfx)}
                    if nums is not None:
                        self._put_index(txn, pfx, rid, [n for n in nums if n in present])
            self._write(note)
        return found

