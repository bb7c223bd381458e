"""Plumbing shared by the ``LmdbStore`` methods: records, fencing, retention, loading.

See ``_codec`` for the key layout and record format, ``_chunks`` for how
snapshots are stored O(delta), ``_refs`` for reference counting and
retention, and ``_env`` for environment lifetime, growth and durability.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from ..errors import FencedError, RunNotFoundError, StoreCorruptError, StoreError, UsageError
from ._api import RunInfo, SnapshotInfo
from ._chunks import decode_chunk, decode_inline, parse_entries
from ._codec import Corrupt, check_int, check_name, prefix, seq_key
from ._crypt import resolve_key
from ._env import acquire
from ._refs import (
    FLUSH_RELEASES,
    HEAD,
    head_key,
    HeldCache,
    SnapRow,
    apply_diff,
    data_key,
    iter_prefix,
    open_head,
    pack_ids,
    seal_head,
    snap_rows,
)

__all__ = ["HOST", "StoreCore", "last_seq"]

T = TypeVar("T")
_S = TypeVar("_S", bound="StoreCore")
HOST = socket.gethostname()
FINAL = ("completed", "cancelled")  # statuses no writer may change (cancel_run and claim_run check)


def last_seq(txn: Any, db: Any, pfx: bytes) -> int:
    """Sequence number of the last record under ``pfx`` (-1 if none)."""
    cur = txn.cursor(db=db)
    if cur.set_range(pfx + b"\xff" * 9):
        ok = cur.prev()
    else:
        ok = cur.last()
    if ok:
        k = cur.key()
        if k.startswith(pfx) and len(k) == len(pfx) + 8:
            return int.from_bytes(k[-8:], "big")
    return -1


class StoreCore:
    """Opening, closing and the record-level helpers every store method uses."""

    def __init__(
        self,
        path: str,
        *,
        tenant: str = "default",
        durability: str = "sync",
        create: bool = True,
        keep: int = 3,
        map_size: int | None = None,
        max_map_size: int | None = None,
        key: bytes | str | None = None,
    ) -> None:
        self._t = check_name("tenant", tenant)
        check_int("keep", keep, 1)
        for what, size in (("map_size", map_size), ("max_map_size", max_map_size)):
            if size is not None:
                check_int(what, size, 64 << 10)
        self._keep = keep
        # the store key: ``key``, else $TCC_STORE_KEY_FILE or $TCC_STORE_KEY (None: no encryption)
        self._h = acquire(path, create=create, durability=durability, map_size=map_size,
                          max_map_size=max_map_size, store_key=resolve_key(key))
        self._sealer = self._h.sealer
        self._held = HeldCache(self._sealer)
        # run key -> (record bytes, header, blobs) of the last run record verified
        self._runs_seen: dict[bytes, tuple[bytes, dict[str, Any], dict[str, bytes]]] = {}
        # db + head key -> (record bytes, value) of head records verified or written
        self._heads_seen: dict[bytes, tuple[bytes, Any]] = {}
        self._closed = False
        self._memo_lock = threading.Lock()
        self._memos: dict[bytes, Any] = {}  # run id -> _lmdb._RunMemo
        self._intents: dict[bytes, Any] = {}  # run id -> _lmdb._OpenIntents

    # ------------------------------------------------------------- properties
    @property
    def path(self) -> str:
        """Absolute path of the store directory."""
        return self._h.path

    @property
    def tenant(self) -> str:
        """The tenant every call is scoped to."""
        return self._t.decode()

    @property
    def durability(self) -> str:
        """``sync``, ``group`` or ``none``."""
        return self._h.durability

    @property
    def encrypted(self) -> bool:
        """Whether the store encrypts its records and chunks (see ``_crypt``)."""
        return self._sealer.crypt is not None

    @property
    def map_size(self) -> int:
        """Current size of the memory map in bytes."""
        return self._h.map_size

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<LmdbStore {self.path!r} tenant={self.tenant!r} durability={self.durability!r}>"

    def close(self) -> None:
        """Release the store; the environment closes when its last user does."""
        if not self._closed:
            self._closed = True
            self._h.release()

    # --------------------------------------------------------------- plumbing
    def _read(self, fn: Callable[[Any], T]) -> T:
        if self._closed:
            raise StoreError(f"store {self.path} is closed")
        return self._h.read(fn)

    def _write(self, fn: Callable[[Any], T]) -> T:
        if self._closed:
            raise StoreError(f"store {self.path} is closed")
        return self._h.write(fn)

    @property
    def _dbs(self) -> dict[str, Any]:
        return self._h.dbs

    def _rid(self, run_id: str, *, new: bool = False) -> bytes:
        """The key form of ``run_id``; ``new``: an id for a run being created (stricter)."""
        return check_name("run id", run_id, new=new)

    def _corrupt(self, what: str, why: object) -> StoreCorruptError:
        return StoreCorruptError(
            f"store {self.path}: {what} failed verification ({why}); it was not returned. "
            "Fall back with latest_good_snapshot() or restore a backup")

    def _missing(self, what: str) -> StoreCorruptError:
        return StoreCorruptError(
            f"store {self.path}: {what} is missing (damage lost it or moved it to another "
            "key); restore the store from a backup")

    def _load_run(self, txn: Any, rid: bytes) -> tuple[dict[str, Any], dict[str, bytes]]:
        key = self._t + b"\x00" + rid
        raw = txn.get(key, db=self._dbs["runs"])
        if raw is None:
            self._check_no_remains(txn, rid)
            raise RunNotFoundError(
                f"no run {rid.decode()!r} for tenant {self.tenant!r} in store {self.path}")
        seen = self._runs_seen.get(key)
        if seen is not None and seen[0] == raw:  # the very bytes whose MAC was checked before
            return dict(seen[1]), dict(seen[2])
        try:
            hdr, blobs = self._sealer.open(b"runs", key, raw)
        except Corrupt as exc:
            raise self._corrupt(f"run {rid.decode()!r} record", exc) from None
        if len(self._runs_seen) >= 64:
            self._runs_seen.clear()
        self._runs_seen[key] = (bytes(raw), hdr, blobs)
        return dict(hdr), dict(blobs)

    def _put_run(self, txn: Any, rid: bytes, hdr: dict[str, Any], blobs: dict[str, bytes]) -> None:
        key = self._t + b"\x00" + rid
        txn.put(key, self._sealer.seal(b"runs", key, hdr, blobs), db=self._dbs["runs"])

    def _fence(self, txn: Any, rid: bytes, epoch: int) -> tuple[dict[str, Any], dict[str, bytes]]:
        if type(epoch) is not int:
            raise UsageError(f"epoch must be an int (from create_run or claim_run), not {epoch!r}")
        hdr, blobs = self._load_run(txn, rid)
        if hdr["epoch"] != epoch and hdr["status"] == "cancelled":
            raise FencedError(
                f"run {rid.decode()!r} in store {self.path} was cancelled (by "
                f"{hdr['host']}:{hdr['pid']}), so this writer (epoch {epoch}) must stop; "
                "nothing was written")
        if hdr["epoch"] != epoch:
            raise FencedError(
                f"run {rid.decode()!r} in store {self.path} is at epoch {hdr['epoch']} "
                f"(owner {hdr['host']}:{hdr['pid']}) but this writer has epoch {epoch}: the run "
                "was taken over, so this writer must stop; nothing was written")
        if hdr["status"] in FINAL:
            # a completed run cannot be reopened into a second completion (contract C6)
            raise FencedError(
                f"run {rid.decode()!r} in store {self.path} is already {hdr['status']}, which is "
                "final; nothing was written")
        return hdr, blobs

    def _info(self, rid: bytes, hdr: dict[str, Any], blobs: dict[str, bytes]) -> RunInfo:
        parent = hdr.get("parent")
        return RunInfo(
            run_id=rid.decode(), tenant=self.tenant, entry=hdr["entry"], args=blobs.get("args", b""),
            strategy=hdr["strategy"], status=hdr["status"], created=hdr["created"],
            updated=hdr["updated"], epoch=hdr["epoch"], owner_host=hdr["host"],
            owner_pid=hdr["pid"], lease_expiry=hdr["lease"], result=blobs.get("result"),
            error=blobs.get("error"), parent=(parent[0], parent[1]) if parent else None,
        )

    def _event(self, txn: Any, rid: bytes, kind: str, data: Mapping[str, Any] | None) -> None:
        pfx = prefix(self._t, rid)
        seq = self._next_seq(txn, "events", pfx, rid)
        key = seq_key(self._t, rid, seq)
        rec = self._sealer.seal(b"events", key, {"k": kind, "t": time.time(), "d": dict(data or {})})
        txn.put(key, rec, db=self._dbs["events"])
        self._put_head(txn, "events", pfx, seq + 1)

    def _retain(
        self,
        txn: Any,
        pfx: bytes,
        rows: list[SnapRow],
        new_number: int | None,
        new_held: set[int],
        stored_form: Callable[[int], bytes | None],
        seal: Callable[[bytes], SnapRow] | None = None,
        jlen: int | None = None,
        fresh_from: int | None = None,
        keep: int | None = None,
    ) -> tuple[int, SnapRow | None, frozenset[int]]:
        """Add snapshot ``new_number`` (if any), drop snapshots past retention, fix refcounts.

        ``rows`` are the run's rows as :meth:`_indexed` returns them; the
        index is rewritten to match what is kept.

        ``seal(pending)`` builds the new snapshot record given its packed
        pending-release list (see ``_refs``).  Returns ``(#dropped, new row,
        its pending ids)``.
        Without a new record (housekeeping), released chunks are decremented
        at once and the newest record's pending list stays as it is.
        ``fresh_from``: see :func:`apply_diff`.  ``keep``: the run's own retention (its
        header's ``keep``), else the store's.
        """
        dbs, held = self._dbs, self._held
        pinned = self._pinned(txn, pfx)
        allnums = [r[0] for r in rows] + ([new_number] if new_number is not None else [])
        keep_set = set(allnums[-(keep or self._keep):]) | pinned
        kept = [r for r in rows if r[0] in keep_set]
        dropped = [r for r in rows if r[0] not in keep_set]
        before = held.run_held(txn, dbs, rows)
        row: SnapRow | None = None
        deferred: frozenset[int] = frozenset()
        if seal is None or new_number is None:
            after = held.union(txn, dbs, kept) | held.pending(txn, dbs, rows) | new_held
            apply_diff(txn, dbs, before, after, stored_form)
        else:
            after = held.union(txn, dbs, kept) | new_held
            released = sorted(before - after)
            packed = b""
            if 0 < len(released) < FLUSH_RELEASES:
                try:
                    packed = pack_ids(released)
                except struct.error:  # ids too far apart for the compact form
                    packed = b""
            if packed or not released:  # defer: count only the increments now
                deferred = frozenset(released)
                apply_diff(txn, dbs, before, after | deferred, stored_form, fresh_from)
            else:
                apply_diff(txn, dbs, before, after, stored_form, fresh_from)
            row = seal(packed)
        for _, key, _ in dropped:
            txn.delete(key, db=dbs["snaps"])
        if row is not None:
            txn.put(row[1], row[2], db=dbs["snaps"])
        if row is not None or dropped:
            rid = pfx[pfx.index(b"\x00") + 1:-1]
            self._put_index(txn, pfx, rid, [r[0] for r in kept] + ([row[0]] if row is not None else []),
                            jlen)
        return len(dropped), row, deferred

    # ------------------------------------------------- head records of a run
    # Under head_key(): in ``snaps`` the list of the run's snapshot numbers,
    # in ``journal`` and ``events`` how many records the run has.  Each is
    # sealed and rewritten in every transaction that changes what it states.
    def _head(self, txn: Any, db: str, pfx: bytes, what: str) -> Any:
        """The verified ``n`` of the run's head record in ``db`` (None: no record)."""
        key = head_key(db, pfx)
        raw = txn.get(key, db=self._dbs[db])
        if raw is None:
            return None
        seen = self._heads_seen.get(db.encode() + key)
        if seen is not None and seen[0] == raw:
            return seen[1]
        try:
            n = open_head(self._sealer, db, pfx, raw)
        except Corrupt as exc:
            raise StoreCorruptError(f"store {self.path}: {what} failed verification ({exc}); "
                                    "restore the store from a backup") from None
        self._remember_head(db, key, bytes(raw), n)
        return n

    def _remember_head(self, db: str, key: bytes, raw: bytes, n: Any) -> None:
        # bytes sealed here or verified before: safe to trust when read back unchanged
        if len(self._heads_seen) >= 64:
            self._heads_seen.clear()
        self._heads_seen[db.encode() + key] = (raw, n)

    def _put_head(self, txn: Any, db: str, pfx: bytes, n: Any) -> None:
        key = head_key(db, pfx)
        raw = seal_head(self._sealer, db, pfx, n)
        txn.put(key, raw, db=self._dbs[db])
        self._remember_head(db, key, raw, n)

    def _index_record(self, txn: Any, pfx: bytes, rid: bytes) -> dict[str, Any] | None:
        idx: dict[str, Any] | None = self._head(
            txn, "snaps", pfx, f"the snapshot index of run {rid.decode()!r}")
        return idx

    def _index(self, txn: Any, pfx: bytes, rid: bytes) -> list[int] | None:
        """The snapshot numbers the run's index lists (None: no index record).

        Raises StoreCorruptError if the index fails verification.
        """
        idx = self._index_record(txn, pfx, rid)
        return None if idx is None else list(idx["n"])

    def _journal_len(self, txn: Any, pfx: bytes, rid: bytes) -> int | None:
        """How many journal records the run has: its journal head (written between
        checkpoints), else what its snapshot index says (None: neither exists)."""
        n = self._head(txn, "journal", pfx, f"the journal record count of run {rid.decode()!r}")
        idx = self._index_record(txn, pfx, rid)
        if n is None:
            return None if idx is None else int(idx["j"])
        if idx is not None and int(n) < int(idx["j"]):  # a head is only written after it
            raise StoreCorruptError(
                f"store {self.path}: the journal of run {rid.decode()!r} has {n} records but its "
                f"snapshot index counts {idx['j']} (damage rolled the journal back); restore the "
                "store from a backup")
        return int(n)

    def _next_seq(self, txn: Any, db: str, pfx: bytes, rid: bytes) -> int:
        """The sequence number of the run's next ``db`` record (journal or events).

        The count record must agree with the records: if the newest records
        were moved away or lost, the journal refuses to go on
        (StoreCorruptError).  Events continue after the count, so the hole
        stays visible to :meth:`events`.
        """
        last = last_seq(txn, self._dbs[db], pfx) + 1
        if db == "journal":
            self._check_tally(txn, db, pfx, last, f"run {rid.decode()!r}")
            return last
        n = self._head(txn, db, pfx, f"the event count of run {rid.decode()!r}")
        return last if n is None else max(int(n), last)

    # Every journal, events and signals range of a run, and the runs of a
    # tenant (head under tenant + NUL), has a sealed count record.  Journal and
    # event records are numbered 0, 1, ... (holes are checked where they are
    # read); signals and runs are a set.
    _NOUNS = {"journal": "journal record", "events": "event", "signals": "signal", "runs": "run"}

    def _members(self, txn: Any, db: str, pfx: bytes) -> int:
        return sum(1 for k, _ in iter_prefix(txn, self._dbs[db], pfx) if not k.endswith(HEAD))

    def _check_tally(self, txn: Any, db: str, pfx: bytes, found: int | None, whose: str) -> None:
        """The ``found`` records under ``pfx`` (None: count them) agree with their count."""
        noun = self._NOUNS[db]
        if db == "journal":
            n = self._journal_len(txn, pfx, pfx[pfx.index(b"\x00") + 1:-1])
        else:
            n = self._head(txn, db, pfx, f"the {noun} count of {whose}")
        if found is None:
            found = self._members(txn, db, pfx)
        if n is None:
            if found:
                raise self._missing(f"the {noun} count of {whose}")
        elif n > found and db in ("journal", "events"):  # the newest leave no hole when they go
            raise self._missing(f"{noun} {found} of {whose}")
        elif n != found:
            raise StoreCorruptError(
                f"store {self.path}: {whose} has {found} {noun}s but its count says {n} (damage "
                f"moved, lost or rolled back a {noun} record); restore the store from a backup")

    def _add_member(self, txn: Any, db: str, pfx: bytes, delta: int, whose: str) -> None:
        """Count a signal or run record just added (``delta`` 1) or deleted (-1) under ``pfx``."""
        n = self._head(txn, db, pfx, f"the {self._NOUNS[db]} count of {whose}")
        if n is None:  # a first record has no count yet; otherwise damage removed the count
            if self._members(txn, db, pfx) != delta:
                raise self._missing(f"the {self._NOUNS[db]} count of {whose}")
            n = 0
        self._put_head(txn, db, pfx, int(n) + delta)

    def _check_no_remains(self, txn: Any, rid: bytes) -> None:
        """No journal, snapshot or signal of a run without a run record (else damage lost it).

        Cheap: three lookups.  Run creation calls it so that a new run cannot
        adopt the records of one whose run record damage moved away; lookups
        of an unknown run call it so that such a run is reported damaged, not
        unknown.
        """
        pfx = prefix(self._t, rid)
        for db in ("journal", "snaps", "signals"):
            if txn.get(head_key(db, pfx), db=self._dbs[db]) is not None:
                raise StoreCorruptError(
                    f"store {self.path}: the record of run {rid.decode()!r} is missing but its "
                    f"{db} is there (damage lost or moved the run record); restore the store "
                    "from a backup")

    def _indexed(self, txn: Any, pfx: bytes, rid: bytes) -> list[SnapRow]:
        """The run's snapshot rows, oldest first, checked against its index.

        A record the index lists but the store lacks, or records without an
        index, mean damage moved or removed a record: StoreCorruptError.  A
        record the index does not list (one moved here from elsewhere) is
        not the run's and is left out.
        """
        rows = snap_rows(txn, self._dbs["snaps"], pfx)
        nums = self._index(txn, pfx, rid)
        if nums is None:
            if rows:
                raise self._missing(f"the snapshot index of run {rid.decode()!r}")
            return rows
        listed = set(nums)
        rows = [r for r in rows if r[0] in listed]
        if len(rows) != len(nums):
            lost = sorted(listed - {r[0] for r in rows})
            raise self._missing(f"snapshot {lost[0]} of run {rid.decode()!r}")
        return rows

    def _put_index(self, txn: Any, pfx: bytes, rid: bytes, numbers: list[int],
                   jlen: int | None = None) -> None:
        """Write the run's index: ``numbers`` and the journal length ``jlen`` (None:
        keep the one it has).  A checkpoint passes ``jlen`` after deleting the
        journal head (see ``_refs``)."""
        if jlen is None:
            idx = self._index_record(txn, pfx, rid)
            jlen = int(idx["j"]) if idx is not None else 0
        self._put_head(txn, "snaps", pfx, {"n": sorted(numbers), "j": jlen})

    def _pinned(self, txn: Any, pfx: bytes) -> set[int]:
        return {int.from_bytes(k[len(pfx):len(pfx) + 8], "big")
                for k, _ in iter_prefix(txn, self._dbs["pins"], pfx)}

    def _load(self, txn: Any, rid: bytes, number: int | None) -> tuple[SnapshotInfo, bytes]:
        self._load_run(txn, rid)
        pfx = prefix(self._t, rid)
        nums = self._index(txn, pfx, rid)
        if nums is None:
            if last_seq(txn, self._dbs["snaps"], pfx) >= 0:
                raise self._missing(f"the snapshot index of run {rid.decode()!r}")
            nums = []
        if number is None:
            if not nums:
                raise StoreError(f"run {rid.decode()!r} in store {self.path} has no snapshot yet")
            number = nums[-1]
        if number not in nums:
            raise StoreError(f"run {rid.decode()!r} in store {self.path} has no snapshot {number}")
        key = seq_key(self._t, rid, number)
        value = txn.get(key, db=self._dbs["snaps"])
        if value is None:
            raise self._missing(f"run {rid.decode()!r} snapshot {number}")
        what = f"run {rid.decode()!r} snapshot {number}"
        chunks = self._dbs["chunks"]
        try:
            hdr, blobs = self._sealer.open(b"snaps", key, value)
            if "p" in blobs:  # a small payload stored whole in its record
                info = SnapshotInfo(rid.decode(), number, hdr["j"], hdr["s"], hdr["t"])
                return info, decode_inline(blobs["p"], hdr["s"])
            leaves = parse_entries(blobs["m"])
            for _ in range(int(hdr["g"])):
                nodes, leaves = leaves, []
                for cid, addr, n in nodes:
                    stored = txn.get(data_key(cid), db=chunks)
                    if stored is None:
                        raise Corrupt("a group node is missing")
                    leaves.extend(parse_entries(decode_chunk(self._sealer, addr, stored, n)))
            out = bytearray()
            for cid, addr, n in leaves:
                stored = txn.get(data_key(cid), db=chunks)
                if stored is None:
                    raise Corrupt("a chunk is missing")
                out += decode_chunk(self._sealer, addr, stored, n)
            if len(out) != hdr["s"]:
                raise Corrupt("payload length mismatch")
        except (Corrupt, KeyError) as exc:
            raise self._corrupt(what, exc) from None
        info = SnapshotInfo(rid.decode(), number, hdr["j"], hdr["s"], hdr["t"])
        return info, bytes(out)

