"""Stored chunks and their reference counts: what retention and gc free.

Chunks live in the ``chunks`` database under sequential ids::

    u64(id) + b"d"  -> codec byte + stored bytes
    u64(id) + b"r"  -> number of runs holding the chunk (u32 LE)

New chunks always get ids above every existing one, and the chunks a commit
frees are those of the snapshot dropped ``keep`` steps ago, which are also
recent: so a commit touches the right edge of the B-tree only, whatever the
size of the store.  Chunks are not keyed by their content hash, which would
scatter every commit over the whole tree and make bytes per step grow with run
length; the keyed hash is still the chunk's identity and MAC: manifests carry
it next to the id, and a chunk is verified against it on every read.

Invariant: the ``r`` count of a chunk is the number of *runs* that hold it,
where a run holds every chunk (and group node) reachable from any of its
stored snapshot manifests.  Counting runs rather than snapshots is what keeps
a checkpoint O(delta): consecutive snapshots share almost all chunks, so a
commit only increments the chunks that no stored snapshot of the run had
before and decrements those that none has after; a chunk whose count reaches
zero is deleted in the same transaction.

Releases are deferred.  The chunks a commit stops holding (those of the
snapshot that retention drops, unless a kept one still has them) are not
decremented at once: their ids go into the new snapshot record's *pending*
list (blob ``r``), which each commit carries forward, and a run holds its
snapshots' chunks plus the newest record's pending ones.  Once the list
reaches ``FLUSH_RELEASES`` ids, one commit decrements them all and starts an
empty list.  Deleting one old chunk copies the leaf page it lives on (LMDB is
copy-on-write), so releasing at every commit would rewrite three or four old
pages per step; a batch of consecutive ids empties whole pages, which LMDB frees
without writing.  Only the newest record's list counts: an older record's
list may name ids a later flush already decremented.

A manifest that cannot be read (it was damaged) contributes only what is
readable.  That can only leak chunks, never free one a readable snapshot
needs; :func:`sweep` recomputes every count from the manifests and repairs
such leaks once no stored snapshot fails verification (until then it deletes
nothing: what the damaged one references cannot be known).
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

from ..errors import StoreCorruptError
from ._chunks import decode_chunk, parse_entries
from ._codec import Corrupt, Sealer, SnapRow, iter_prefix, u64
from ._heads import is_head_key

__all__ = [
    "FLUSH_RELEASES",
    "Held",
    "HeldCache",
    "apply_diff",
    "data_key",
    "next_chunk_id",
    "pack_ids",
    "sweep",
]

_REF = struct.Struct("<I")
_ID = struct.Struct("<Q")
FLUSH_RELEASES = 128  # pending releases applied in one batch


def data_key(cid: int) -> bytes:
    """Key of a chunk's stored bytes."""
    return u64(cid) + b"d"


def _ref_key(cid: int) -> bytes:
    return u64(cid) + b"r"


def pack_ids(ids: list[int]) -> bytes:
    """Binary form of sorted chunk ids: the first as u64, then u32 gaps."""
    if not ids:
        return b""
    gaps = [b - a for a, b in zip(ids, ids[1:])]
    return _ID.pack(ids[0]) + struct.pack(f"<{len(gaps)}I", *gaps)


def unpack_ids(blob: bytes) -> list[int]:
    """Inverse of :func:`pack_ids`; raise Corrupt on a malformed list."""
    if not blob:
        return []
    if len(blob) < 8 or (len(blob) - 8) % 4:
        raise Corrupt("pending-release list has a bad length")
    out = [_ID.unpack_from(blob)[0]]
    for (gap,) in struct.iter_unpack("<I", blob[8:]):
        out.append(out[-1] + gap)
    return out


def _chunk_key_id(key: bytes) -> int | None:
    """The id of a well-formed chunk key (``u64 + b"d"`` or ``b"r"``), else None."""
    if len(key) == 9 and key[8:] in (b"d", b"r"):
        return int.from_bytes(key[:8], "big")
    return None


def next_chunk_id(txn: Any, db: Any) -> int:
    """One more than the highest chunk id in use.

    Keys that are not chunk keys (only damage puts them there) are stepped
    over: read as an id, a short key sorting last could hand new chunks ids
    already in use.
    """
    cur = txn.cursor(db=db)
    found = cur.last()
    while found:
        cid = _chunk_key_id(bytes(cur.key()))
        if cid is not None:
            return cid + 1
        found = cur.prev()
    return 1


def _appendable(txn: Any, db: Any, first: int) -> bool:
    """Whether every key for ids ``first`` and up sorts after every stored key."""
    cur = txn.cursor(db=db)
    if not cur.last():
        return True
    cid = _chunk_key_id(bytes(cur.key()))
    return cid is not None and cid < first


class Held:
    """What one snapshot references: chunk ids, its address -> id map for dedup,
    and the ids its record lists as pending release.  ``whole`` is False when the
    record or one of its group nodes failed verification: then the ids are only
    those that could be read."""

    __slots__ = ("ids", "by_addr", "pending", "whole")

    def __init__(self, ids: frozenset[int], by_addr: dict[bytes, int],
                 pending: frozenset[int] = frozenset(), whole: bool = True) -> None:
        self.ids = ids
        self.by_addr = by_addr
        self.pending = pending
        self.whole = whole


_UNREADABLE = Held(frozenset(), {}, whole=False)


class HeldCache:
    """Computes (and caches by record MAC) what a snapshot record references."""

    def __init__(self, sealer: Sealer, size: int = 64) -> None:
        self._sealer = sealer
        self._cache: OrderedDict[bytes, Held] = OrderedDict()
        self._size = size

    def held(self, txn: Any, dbs: dict[str, Any], key: bytes, value: bytes) -> Held:
        """Every chunk and group node the snapshot record (``key``, ``value``) references."""
        tag = bytes(value[:16]) + key
        got = self._cache.get(tag)
        if got is not None:
            self._cache.move_to_end(tag)
            return got
        by_addr: dict[bytes, int] = {}
        ok = True
        try:
            hdr, blobs = self._sealer.open(b"snaps", key, value)
            top = parse_entries(blobs.get("m", b""))
            pending = frozenset(unpack_ids(blobs.get("r", b"")))
        except (Corrupt, ValueError, KeyError):
            return _UNREADABLE
        level = top
        for _ in range(int(hdr.get("g", 0))):
            below: list[tuple[int, bytes, int]] = []
            for cid, addr, n in level:
                by_addr[addr] = cid
                stored = txn.get(data_key(cid), db=dbs["chunks"])
                try:
                    if stored is None:
                        raise Corrupt("missing group node")
                    below.extend(parse_entries(decode_chunk(self._sealer, addr, stored, n)))
                except Corrupt:
                    ok = False
            level = below
        for cid, addr, _ in level:
            by_addr[addr] = cid
        result = Held(frozenset(by_addr.values()), by_addr, pending, ok)
        if ok:
            self._cache[tag] = result
            if len(self._cache) > self._size:
                self._cache.popitem(last=False)
        return result

    def remember(self, key: bytes, value: bytes, by_addr: dict[bytes, int],
                 pending: frozenset[int] = frozenset()) -> None:
        """Record what a snapshot record this process just built references.

        Saves re-reading and re-verifying its group nodes on the next commit.
        The entry is keyed by the record's MAC and key, so it can only ever
        describe that exact record.
        """
        tag = bytes(value[:16]) + key
        self._cache[tag] = Held(frozenset(by_addr.values()), by_addr, pending)
        self._cache.move_to_end(tag)
        if len(self._cache) > self._size:
            self._cache.popitem(last=False)

    def union(self, txn: Any, dbs: dict[str, Any], rows: Iterable[SnapRow]) -> set[int]:
        """Union of the chunk ids of ``rows`` (their manifests only)."""
        out: set[int] = set()
        for _, key, value in rows:
            out |= self.held(txn, dbs, key, value).ids
        return out

    def pending(self, txn: Any, dbs: dict[str, Any], rows: list[SnapRow]) -> frozenset[int]:
        """The run's pending releases: the list in its newest record (``rows[-1]``)."""
        if not rows:
            return frozenset()
        _, key, value = rows[-1]
        return self.held(txn, dbs, key, value).pending

    def run_held(self, txn: Any, dbs: dict[str, Any], rows: list[SnapRow]) -> set[int]:
        """Every chunk id a run with snapshot records ``rows`` (oldest first) holds."""
        return self.union(txn, dbs, rows) | self.pending(txn, dbs, rows)


def apply_diff(
    txn: Any,
    dbs: dict[str, Any],
    before: set[int],
    after: set[int],
    stored_form: Callable[[int], bytes | None],
    fresh_from: int | None = None,
) -> None:
    """Increment chunks in ``after - before``, decrement (maybe delete) ``before - after``.

    ``stored_form(id)`` gives the bytes of a chunk that is not stored yet
    (None if the caller has none: then the chunk must exist already).
    ``fresh_from``: the ids from there up were allocated by this transaction
    above every stored id (:func:`next_chunk_id`), so nothing is stored under
    them yet; they are appended in one call, without a lookup each.
    """
    db = dbs["chunks"]
    added = sorted(after - before)
    fresh: list[tuple[bytes, bytes]] = []
    one = _REF.pack(1)
    if fresh_from is not None and not _appendable(txn, db, fresh_from):
        fresh_from = None  # damage left a key above them: the ordinary way, key by key
    for cid in added:
        if fresh_from is not None and cid >= fresh_from:
            data = stored_form(cid)
            if data is not None:
                fresh.append((data_key(cid), data))
                fresh.append((_ref_key(cid), one))
                continue
        raw = txn.get(_ref_key(cid), db=db)
        if raw is not None:
            txn.put(_ref_key(cid), _REF.pack(_REF.unpack(raw)[0] + 1), db=db)
            continue
        data = stored_form(cid)
        if data is None:
            if txn.get(data_key(cid), db=db) is None:
                continue  # a referenced chunk is gone (damage); sweep() accounts for it
        else:
            txn.put(data_key(cid), data, db=db)
        txn.put(_ref_key(cid), one, db=db)
    if fresh:
        # MDB_APPEND skips the search (and fills pages instead of splitting them in
        # half).  The keys are above every stored key (checked above), so it adds
        # them all; it would skip, not overwrite, a key that was not.
        _, n = txn.cursor(db=db).putmulti(fresh, append=True)
        if n != len(fresh):
            raise StoreCorruptError(  # aborts the transaction: nothing is written
                f"{len(fresh) - n} new chunk keys did not sort above the stored ones; "
                "restore the store from a backup")
    cur = txn.cursor(db=db)  # consecutive ids share pages: a positioned cursor skips the search
    for cid in sorted(before - after):
        rkey = _ref_key(cid)
        if cur.set_key(rkey):
            count = _REF.unpack(cur.value())[0]
            if count > 1:
                cur.put(rkey, _REF.pack(count - 1))
                continue
            cur.delete()
        if cur.set_key(data_key(cid)):
            cur.delete()


def sweep(txn: Any, dbs: dict[str, Any], cache: HeldCache) -> tuple[int, int, int]:
    """Recompute every reference count from all manifests (all tenants).

    Deletes chunks nothing references and repairs wrong counts.  Returns
    ``(chunks_deleted, refs_repaired, unreadable)``: ``unreadable`` counts the
    snapshot records that (or whose group nodes) failed verification.  While
    there is one, nothing is deleted and no count is lowered: the chunks it
    references cannot be known, and damage that can be undone (a restored
    record, a format header set back) must find them still there: a header
    whose version damage changed makes every group node fail verification,
    and the chunks below them are still needed.
    """
    per_run: dict[bytes, set[int]] = {}
    newest: dict[bytes, Held] = {}
    unreadable = 0
    for key, value in iter_prefix(txn, dbs["snaps"], b""):
        if is_head_key("snaps", key):
            continue
        run = bytes(key[:-8])
        held = cache.held(txn, dbs, key, value)
        unreadable += not held.whole
        per_run.setdefault(run, set()).update(held.ids)
        newest[run] = held  # keys are in order: the last one seen is the newest
    for run, held in newest.items():
        per_run[run] |= held.pending
    truth: dict[int, int] = {}
    for ids in per_run.values():
        for cid in ids:
            truth[cid] = truth.get(cid, 0) + 1
    db = dbs["chunks"]
    present: dict[int, int | None] = {}  # id -> stored count (None: data without count)
    for key, raw in iter_prefix(txn, db, b""):
        cid = int.from_bytes(key[:8], "big")
        if key[8:] == b"r":
            present[cid] = _REF.unpack(raw)[0]
        else:
            present.setdefault(cid, None)
    deleted = repaired = 0
    for cid, count in present.items():
        want = truth.get(cid)
        if want is None:
            if unreadable:
                continue
            txn.delete(_ref_key(cid), db=db)
            if txn.delete(data_key(cid), db=db):
                deleted += 1
        elif count != want and txn.get(data_key(cid), db=db) is not None:
            if unreadable and count is not None and count > want:
                continue
            txn.put(_ref_key(cid), _REF.pack(want), db=db)
            repaired += 1
    return deleted, repaired, unreadable
