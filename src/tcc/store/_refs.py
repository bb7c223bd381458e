"""Chunk reference counting, snapshot retention and chunk garbage collection.

Invariant: ``refs[address]`` is the number of *runs* that hold the chunk, where
a run holds every chunk (and group node) reachable from any of its stored
snapshot manifests.  Counting runs rather than snapshots is what keeps a
checkpoint O(delta): consecutive snapshots of a run share almost all chunks,
so a commit only increments the chunks that no retained snapshot of the run
had before and decrements those that no retained snapshot has after.  A chunk
whose count reaches zero is deleted in the same transaction.

When a manifest cannot be read (it was damaged), it contributes only what is
readable.  That can only leak chunks (never free a chunk a readable snapshot
needs); :func:`sweep` recomputes every count from the manifests and repairs
such leaks.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ._chunks import decode_chunk, parse_entries
from ._codec import Corrupt, Sealer

__all__ = ["HeldCache", "SnapRow", "apply_diff", "iter_prefix", "snap_rows", "sweep"]

_REF = struct.Struct("<I")

SnapRow = tuple[int, bytes, bytes]  # (number, key, sealed value)


def iter_prefix(txn: Any, db: Any, pfx: bytes) -> Iterator[tuple[bytes, bytes]]:
    """All (key, value) pairs of ``db`` whose key starts with ``pfx``, in key order."""
    cur = txn.cursor(db=db)
    if not cur.set_range(pfx):
        return
    for key, value in cur:
        if not key.startswith(pfx):
            return
        yield key, value


def snap_rows(txn: Any, db: Any, pfx: bytes) -> list[SnapRow]:
    """The stored snapshots of one run (key prefix ``pfx``), oldest first."""
    n = len(pfx) + 8
    return [
        (int.from_bytes(k[-8:], "big"), k, v) for k, v in iter_prefix(txn, db, pfx) if len(k) == n
    ]


class HeldCache:
    """Computes (and caches by record MAC) the chunk set a snapshot record holds."""

    def __init__(self, sealer: Sealer, size: int = 256) -> None:
        self._sealer = sealer
        self._cache: OrderedDict[bytes, frozenset[bytes]] = OrderedDict()
        self._size = size

    def held(self, txn: Any, dbs: dict[str, Any], key: bytes, value: bytes) -> frozenset[bytes]:
        """Addresses of every chunk and group node the snapshot at ``key`` references."""
        tag = bytes(value[:16]) + key
        got = self._cache.get(tag)
        if got is not None:
            self._cache.move_to_end(tag)
            return got
        out: set[bytes] = set()
        ok = True
        try:
            hdr, blobs = self._sealer.open(b"snaps", key, value)
            top = parse_entries(blobs.get("m", b""))
        except (Corrupt, ValueError, KeyError):
            return frozenset()
        for addr, n in top:
            out.add(addr)
            if hdr.get("g"):
                stored = txn.get(addr, db=dbs["chunks"])
                try:
                    if stored is None:
                        raise Corrupt("missing group node")
                    out.update(h for h, _ in parse_entries(decode_chunk(self._sealer, addr, stored, n)))
                except Corrupt:
                    ok = False
        result = frozenset(out)
        if ok:
            self._cache[tag] = result
            if len(self._cache) > self._size:
                self._cache.popitem(last=False)
        return result

    def union(self, txn: Any, dbs: dict[str, Any], rows: Iterable[SnapRow]) -> set[bytes]:
        """Union of :meth:`held` over ``rows``."""
        out: set[bytes] = set()
        for _, key, value in rows:
            out |= self.held(txn, dbs, key, value)
        return out


def apply_diff(
    txn: Any,
    dbs: dict[str, Any],
    before: set[bytes],
    after: set[bytes],
    stored_form: Callable[[bytes], bytes | None],
) -> None:
    """Increment chunks in ``after - before``, decrement (and maybe delete) ``before - after``.

    ``stored_form(address)`` gives the bytes to store for a chunk that is not
    in the store yet (None if the caller cannot provide it: then the chunk
    must already exist).
    """
    refs, chunks = dbs["refs"], dbs["chunks"]
    for addr in sorted(after - before):
        raw = txn.get(addr, db=refs)
        if raw is not None:
            txn.put(addr, _REF.pack(_REF.unpack(raw)[0] + 1), db=refs)
            continue
        data = stored_form(addr)
        if data is None:
            if txn.get(addr, db=chunks) is None:
                continue  # referenced chunk is gone (damage); sweep() accounts for it
        else:
            txn.put(addr, data, db=chunks)
        txn.put(addr, _REF.pack(1), db=refs)
    for addr in sorted(before - after):
        raw = txn.get(addr, db=refs)
        count = _REF.unpack(raw)[0] if raw is not None else 0
        if count <= 1:
            txn.delete(addr, db=refs)
            txn.delete(addr, db=chunks)
        else:
            txn.put(addr, _REF.pack(count - 1), db=refs)


def sweep(txn: Any, dbs: dict[str, Any], cache: HeldCache) -> tuple[int, int]:
    """Recompute every reference count from all manifests (all tenants).

    Deletes chunks nothing references and repairs wrong counts.  Returns
    ``(chunks_deleted, refs_repaired)``.
    """
    per_run: dict[bytes, set[bytes]] = {}
    for key, value in iter_prefix(txn, dbs["snaps"], b""):
        per_run.setdefault(bytes(key[:-8]), set()).update(cache.held(txn, dbs, key, value))
    truth: dict[bytes, int] = {}
    for held in per_run.values():
        for addr in held:
            truth[addr] = truth.get(addr, 0) + 1
    deleted = repaired = 0
    doomed: list[bytes] = []
    fixes: list[tuple[bytes, int]] = []
    for addr, raw in iter_prefix(txn, dbs["refs"], b""):
        want = truth.get(bytes(addr))
        if want is None:
            doomed.append(bytes(addr))
        elif _REF.unpack(raw)[0] != want:
            fixes.append((bytes(addr), want))
    for addr, _ in iter_prefix(txn, dbs["chunks"], b""):
        a = bytes(addr)
        if a not in truth and txn.get(a, db=dbs["refs"]) is None:
            doomed.append(a)
    for addr, want in truth.items():
        if txn.get(addr, db=dbs["refs"]) is None and txn.get(addr, db=dbs["chunks"]) is not None:
            fixes.append((addr, want))
    for addr in set(doomed):
        txn.delete(addr, db=dbs["refs"])
        if txn.delete(addr, db=dbs["chunks"]):
            deleted += 1
    for addr, want in fixes:
        txn.put(addr, _REF.pack(want), db=dbs["refs"])
        repaired += 1
    return deleted, repaired
