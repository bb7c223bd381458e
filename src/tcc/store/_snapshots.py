"""Snapshots: checkpointing a run's payload O(delta), listing, loading, falling back.

A checkpoint journals the effect's completion and stores the snapshot taken
after it in one write transaction (see ``_chunks`` for how a payload is cut
and deduplicated, ``_chunkrefs`` for reference counts, ``_retention`` for
what is kept).  ``snaps``: run prefix + number -> sealed record ``{"j":
journal length, "s": size, "t": time, "g": group depth}`` with the manifest
(blob ``m``) or, for a small payload, the payload itself (blob ``p``), and
the pending releases (blob ``r``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..errors import StoreCorruptError, StoreError
from ._api import Completion, SnapshotInfo
from ._chunkrefs import data_key, next_chunk_id
from ._chunks import (
    INLINE_MAX,
    ChunkEncoder,
    Payload,
    SplitMemo,
    build_manifest,
    decode_chunk,
    decode_inline,
    encode_chunk,
    encode_node,
    joined,
    pack_entries,
    parse_entries,
    payload_size,
    split,
)
from . import _inflight as inflight
from ._codec import Corrupt, SnapRow, check_int, last_seq, seq_key, snap_rows
from ._events import append_event
from ._heads import HEAD, indexed, next_seq, put_index, snapshot_numbers
from ._journal import note_committed, put_completion
from ._retention import pinned, retain
from ._runrecord import fence, load_run
from ._signals import consume_or_fence

if TYPE_CHECKING:
    from ._scope import Scope

__all__ = ["RunMemo", "checkpoint", "latest_good_snapshot", "load_snapshot", "snapshots"]


class RunMemo:
    """What this process remembers of a run's last checkpoint (memory only)."""

    __slots__ = ("split", "groups", "tag", "by_addr")

    def __init__(self) -> None:
        self.split = SplitMemo()
        self.groups: dict[bytes, bytes] = {}  # group node content -> address
        self.tag: bytes | None = None  # MAC of the newest snapshot record, if known
        self.by_addr: dict[bytes, int] = {}  # its address -> chunk id map


def checkpoint(scope: Scope, run_id: str, epoch: int, payload: Payload, *,
               completion: Completion | None, consume_signal: str | None) -> SnapshotInfo:
    """See :meth:`tcc.store.LmdbStore.checkpoint`."""
    rid = scope.check_run_id(run_id)
    size = payload_size(payload)
    sealer, dbs, held = scope.sealer, scope.dbs, scope.held
    with scope.memo_lock:
        memo = scope.memos.pop(rid, None) or RunMemo()
    inline = size <= INLINE_MAX
    # small payloads are stored whole in the record; larger ones are cut by content
    ordered = [] if inline else split(sealer, payload, memo.split)
    pfx = scope.run_prefix(rid)
    now = time.time()

    if memo.tag is None and not inline:
        def previous(txn: Any) -> tuple[bytes | None, dict[bytes, int]]:
            """The newest snapshot's record MAC and its address -> chunk id map."""
            rows = snap_rows(txn, dbs["snaps"], pfx)
            if not rows:
                return None, {}
            _, key, value = rows[-1]
            return bytes(value[:16]), held.held(txn, dbs, key, value).by_addr

        memo.tag, memo.by_addr = scope.read(previous)
    # Compress what is new outside the write transaction.  The guess of what
    # is stored (this process's last commit of the run) is checked in the
    # transaction against the newest snapshot's MAC.
    prev_tag, prev_map = memo.tag, memo.by_addr
    encoded: dict[bytes, bytes] = {}
    encode, lock = ChunkEncoder().encode, sealer.lock_chunk
    for h, p in ordered:
        if h not in prev_map and h not in encoded:
            encoded[h] = lock(h, encode(p))  # (encrypted too, in an encrypted store)
    whole = encode_chunk(joined(payload)) if inline else b""
    box: list[Any] = []
    answered: list[Any] = []  # [run created, seq] of the completion journaled

    def op(txn: Any) -> SnapshotInfo:
        run_hdr, _ = fence(scope, txn, rid, epoch)
        if completion is not None and type(completion.intent_seq) is int:
            inflight.ensure(scope, txn, rid, run_hdr, completion.intent_seq)
        jlen = next_seq(scope, txn, "journal", pfx, rid)
        if consume_signal is not None:  # recorded by the completion at jlen, if any
            consume_or_fence(scope, txn, run_id, rid, consume_signal, epoch,
                             jlen if completion is not None else None)
        # the index counts the journal from here on: drop the journal head first, so
        # that the completion is appended at the end of its page (see _heads)
        txn.delete(pfx + HEAD, db=dbs["journal"])
        if completion is not None:
            put_completion(scope, txn, rid, jlen, completion, now, run_hdr["created"], count=False)
            answered[:] = [run_hdr["created"], jlen]
            jlen += 1
        rows = indexed(scope, txn, pfx, rid)
        number = rows[-1][0] + 1 if rows else 1
        key = seq_key(scope.tenant_key, rid, number)
        ids: dict[bytes, int] = {}
        if inline:
            def seal(pending: bytes) -> SnapRow:
                blobs = {"p": whole, "r": pending} if pending else {"p": whole}
                return number, key, sealer.seal(
                    b"snaps", key, {"j": jlen, "s": size, "t": now, "g": 0}, blobs)

            _, row, pending = retain(scope, txn, pfx, rows, number, set(), lambda _c: None, seal,
                                     jlen, keep=run_hdr.get("keep"))
        else:
            row, pending = _put_chunks(scope, txn, pfx, rows, number, key, run_hdr.get("keep"),
                                       prev_tag, prev_map, ordered, encoded, memo, ids,
                                       {"j": jlen, "s": size, "t": now})
        assert row is not None
        value = row[2]
        held.remember(key, value, ids, pending)
        box[:] = [bytes(value[:16]), ids]
        return SnapshotInfo(run_id, number, jlen, size, now)

    ok = False
    try:
        info = scope.write(op)
        ok = True
        if completion is not None:
            note_committed(scope, rid, answered[0], answered[1], answers=completion.intent_seq)
        return info
    finally:
        if ok:
            memo.tag, memo.by_addr = box
        else:  # unknown state: look the newest snapshot up next time
            memo.tag, memo.by_addr = None, {}
        with scope.memo_lock:
            scope.memos[rid] = memo
            while len(scope.memos) > 8:
                scope.memos.pop(next(iter(scope.memos)))


def _put_chunks(
    scope: Scope,
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
    memo: RunMemo,
    ids: dict[bytes, int],
    hdr: dict[str, Any],
) -> tuple[SnapRow | None, frozenset[int]]:
    """Store the chunks of a cut payload that are new, its manifest and its record.

    ``ids`` receives the address -> chunk id map of the new snapshot.
    Returns the record and its pending releases.
    """
    sealer, dbs, held = scope.sealer, scope.dbs, scope.held
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

    _, row, pending = retain(scope, txn, pfx, rows, number, set(ids.values()), stored_form, seal,
                             hdr["j"], first_new, keep=keep)
    return row, pending


def snapshots(scope: Scope, run_id: str) -> list[SnapshotInfo]:
    """See :meth:`tcc.store.LmdbStore.snapshots`."""
    rid = scope.check_run_id(run_id)
    pfx = scope.run_prefix(rid)

    def op(txn: Any) -> list[SnapshotInfo]:
        load_run(scope, txn, rid)
        pins = pinned(scope, txn, pfx)
        rows = {number: (key, value) for number, key, value in
                snap_rows(txn, scope.dbs["snaps"], pfx)}
        nums = snapshot_numbers(scope, txn, pfx, rid)
        if nums is None and rows:
            raise scope.missing(f"the snapshot index of run {run_id!r}")
        listed = set(nums or ())
        out = []
        for number in sorted(listed | set(rows)):
            try:
                if number not in listed or number not in rows:
                    raise Corrupt("not where the index says")
                key, value = rows[number]
                h, _ = scope.sealer.open(b"snaps", key, value)
                info = SnapshotInfo(run_id, number, int(h["j"]), int(h["s"]), float(h["t"]),
                                    number in pins)
            except (Corrupt, KeyError, TypeError, ValueError):
                info = SnapshotInfo(run_id, number, -1, -1, 0.0, number in pins, damaged=True)
            out.append(info)
        return out

    return scope.read(op)


def _load(scope: Scope, txn: Any, rid: bytes, number: int | None) -> tuple[SnapshotInfo, bytes]:
    """Snapshot ``number`` (default: the newest) of run ``rid``, verified, with its payload."""
    load_run(scope, txn, rid)
    pfx = scope.run_prefix(rid)
    nums = snapshot_numbers(scope, txn, pfx, rid)
    if nums is None:
        if last_seq(txn, scope.dbs["snaps"], pfx) >= 0:
            raise scope.missing(f"the snapshot index of run {rid.decode()!r}")
        nums = []
    if number is None:
        if not nums:
            raise StoreError(f"run {rid.decode()!r} in store {scope.path} has no snapshot yet")
        number = nums[-1]
    if number not in nums:
        raise StoreError(f"run {rid.decode()!r} in store {scope.path} has no snapshot {number}")
    key = seq_key(scope.tenant_key, rid, number)
    value = txn.get(key, db=scope.dbs["snaps"])
    if value is None:
        raise scope.missing(f"run {rid.decode()!r} snapshot {number}")
    what = f"run {rid.decode()!r} snapshot {number}"
    chunks = scope.dbs["chunks"]
    sealer = scope.sealer
    try:
        hdr, blobs = sealer.open(b"snaps", key, value)
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
                leaves.extend(parse_entries(decode_chunk(sealer, addr, stored, n)))
        out = bytearray()
        for cid, addr, n in leaves:
            stored = txn.get(data_key(cid), db=chunks)
            if stored is None:
                raise Corrupt("a chunk is missing")
            out += decode_chunk(sealer, addr, stored, n)
        if len(out) != hdr["s"]:
            raise Corrupt("payload length mismatch")
    except (Corrupt, KeyError) as exc:
        raise scope.corrupt(what, exc) from None
    info = SnapshotInfo(rid.decode(), number, hdr["j"], hdr["s"], hdr["t"])
    return info, bytes(out)


def load_snapshot(scope: Scope, run_id: str, number: int | None) -> bytes:
    """See :meth:`tcc.store.LmdbStore.load_snapshot`."""
    rid = scope.check_run_id(run_id)
    if number is not None:
        check_int("snapshot number", number, 1)
    return scope.read(lambda txn: _load(scope, txn, rid, number))[1]


def latest_good_snapshot(scope: Scope, run_id: str) -> tuple[SnapshotInfo, bytes] | None:
    """See :meth:`tcc.store.LmdbStore.latest_good_snapshot`."""
    rid = scope.check_run_id(run_id)
    pfx = scope.run_prefix(rid)

    def numbers(txn: Any) -> tuple[list[int], set[int]]:
        """The numbers the index lists, and those of them whose record is gone."""
        load_run(scope, txn, rid)
        present = {r[0] for r in snap_rows(txn, scope.dbs["snaps"], pfx)}
        nums = snapshot_numbers(scope, txn, pfx, rid)
        if nums is None:
            if present:
                raise scope.missing(f"the snapshot index of run {run_id!r}")
            return [], set()
        return nums, set(nums) - present

    listed, lost = scope.read(numbers)
    bad: list[tuple[int, str]] = []
    found: tuple[SnapshotInfo, bytes] | None = None
    for number in reversed(listed):
        try:
            found = scope.read(lambda txn: _load(scope, txn, rid, number))
            break
        except StoreCorruptError as exc:
            bad.append((number, str(exc)))
    # an older snapshot lost below the one used is no fallback, but it is damage
    tried = {number for number, _ in bad}
    older = [(n, str(scope.missing(f"run {run_id!r} snapshot {n}"))) for n in sorted(lost - tried)]
    if bad or older:
        def note(txn: Any) -> None:
            for number, why in bad + older:
                append_event(scope, txn, rid, "snapshot_corrupt", {"number": number, "error": why})
            if bad:
                append_event(scope, txn, rid, "fell_back", {
                    "from": bad[0][0], "to": found[0].number if found else None})
            if lost:  # the index stops naming what damage took, so the run can go on
                nums = snapshot_numbers(scope, txn, pfx, rid)
                present = {r[0] for r in snap_rows(txn, scope.dbs["snaps"], pfx)}
                if nums is not None:
                    put_index(scope, txn, pfx, rid, [n for n in nums if n in present])

        scope.write(note)
    return found
