"""Retention and housekeeping: which snapshots a run keeps, gc, and compaction.

Retention keeps a run's newest ``keep`` snapshots (its own ``keep``, else the
store's) plus every snapshot a fork pins (``pins``: run prefix + number NUL
holder run id).  :func:`retain` applies it inside each checkpoint's
transaction and moves reference counts by the difference (``_chunkrefs``);
:func:`gc` applies it to every run of the tenant and then recounts every
chunk store-wide.
"""

from __future__ import annotations

import struct
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import StoreCorruptError, StoreError
from ._api import GcStats, StoreDamageWarning
from ._chunkrefs import FLUSH_RELEASES, apply_diff, pack_ids, sweep
from ._codec import SnapRow, iter_prefix
from ._heads import HEAD, indexed, put_index
from ._runrecord import load_run

if TYPE_CHECKING:
    from ._scope import Scope

__all__ = ["compact", "gc", "pinned", "retain"]


def pinned(scope: Scope, txn: Any, pfx: bytes) -> set[int]:
    """The numbers of the run's snapshots that forks pin (kept past retention)."""
    return {int.from_bytes(k[len(pfx):len(pfx) + 8], "big")
            for k, _ in iter_prefix(txn, scope.dbs["pins"], pfx)}


def retain(
    scope: Scope,
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

    ``rows`` are the run's rows as :func:`~tcc.store._heads.indexed` returns
    them; the index is rewritten to match what is kept.

    ``seal(pending)`` builds the new snapshot record given its packed
    pending-release list (see ``_chunkrefs``).  Returns ``(#dropped, new
    row, its pending ids)``.  Without a new record (housekeeping), released
    chunks are decremented at once and the newest record's pending list
    stays as it is.  ``fresh_from``: see :func:`apply_diff`.  ``keep``: the
    run's own retention (its header's ``keep``), else the store's.
    """
    dbs, held = scope.dbs, scope.held
    pins = pinned(scope, txn, pfx)
    allnums = [r[0] for r in rows] + ([new_number] if new_number is not None else [])
    keep_set = set(allnums[-(keep or scope.keep):]) | pins
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
        put_index(scope, txn, pfx, rid, [r[0] for r in kept] + ([row[0]] if row is not None else []),
                  jlen)
    return len(dropped), row, deferred


def gc(scope: Scope) -> GcStats:
    """See :meth:`tcc.store.LmdbStore.gc`."""
    dbs = scope.dbs
    tp = scope.tenant_key + b"\x00"

    damaged: list[str] = []
    unreadable = [0]  # snapshots that fail verification, from the sweep

    def op(txn: Any) -> GcStats:
        dropped = 0
        damaged.clear()
        for key, _ in list(iter_prefix(txn, dbs["runs"], tp)):
            if key.endswith(HEAD):  # the tenant's run count
                continue
            rid = bytes(key[len(tp):])
            pfx = scope.run_prefix(rid)
            try:
                rows = indexed(scope, txn, pfx, rid)
                run_keep = load_run(scope, txn, rid)[0].get("keep")
            except StoreCorruptError as exc:  # keep all it has: deleting could lose more
                damaged.append(str(exc))
                continue
            dropped += retain(scope, txn, pfx, rows, None, set(), lambda _a: None, keep=run_keep)[0]
        deleted, repaired, unreadable[0] = sweep(txn, dbs, scope.held)
        return GcStats(snapshots_deleted=dropped, chunks_deleted=deleted,
                       refs_repaired=repaired)

    stats = scope.write(op)
    # (stacklevel 3: the warnings point at the caller of LmdbStore.gc)
    for why in damaged:
        warnings.warn(f"gc left a damaged run as it is: {why}", StoreDamageWarning, stacklevel=3)
    if unreadable[0]:
        warnings.warn(
            f"store {scope.path}: {unreadable[0]} snapshot(s) fail verification, so gc deleted "
            "no chunk (the chunks they reference cannot be known); restore the store from a "
            "backup, or delete the damaged runs, to let gc free space again",
            StoreDamageWarning, stacklevel=3)
    size = scope.env.file_size()
    return GcStats(stats.snapshots_deleted, stats.chunks_deleted, stats.refs_repaired,
                   size, size)


def compact(scope: Scope) -> GcStats:
    """See :meth:`tcc.store.LmdbStore.compact`."""
    if scope.closed:
        raise StoreError(f"store {scope.path} is closed")
    before, after = scope.env.compact()
    return GcStats(bytes_before=before, bytes_after=after)
