"""The run lifecycle: create, list, claim, cancel, lease, status, fork, delete.

Run records themselves, and the fence every owner's write passes, are in
``_runrecord``.
"""

from __future__ import annotations

import math
import os
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._proc import pid_alive
from ..errors import FencedError, StoreCorruptError, StoreError, UsageError
from . import _inflight as inflight
from ._api import FINAL_STATUSES, HOST, RUN_STATUSES, RunInfo
from ._chunkrefs import apply_diff
from ._codec import Corrupt, as_bytes, check_int, created_event, iter_prefix, seq_key, shown, snap_rows, u64
from ._events import append_event
from ._heads import HEAD, add_member, check_tally, indexed, put_index
from ._runrecord import check_no_remains, fence, load_run, put_run, run_info

if TYPE_CHECKING:
    from ._scope import Scope

__all__ = [
    "cancel_run",
    "claim_run",
    "create_run",
    "delete_run",
    "fork_run",
    "get_run",
    "list_runs",
    "renew_lease",
    "set_status",
]


def _check_lease(lease: object) -> None:
    # nan would make every claimer see the owner as dead, inf would never expire
    if not isinstance(lease, (int, float)) or not math.isfinite(lease) or lease < 0:
        raise UsageError(f"lease must be a finite number of seconds >= 0, not {lease!r}")


def _count_run(scope: Scope, txn: Any, delta: int) -> None:
    add_member(scope, txn, "runs", scope.tenant_key + b"\x00", delta, f"tenant {scope.tenant!r}")


# ---------------------------------------------------------------- lifecycle
def create_run(scope: Scope, entry: str, args: bytes, *, strategy: str, run_id: str | None,
               lease: float, keep: int | None, status: str = "running",
               info: Mapping[str, Any] | None = None) -> RunInfo:
    """See :meth:`tcc.store.LmdbStore.create_run`."""
    rid = scope.check_run_id(uuid.uuid4().hex if run_id is None else run_id, new=True)
    if keep is not None:
        check_int("keep", keep, 1)
    if not isinstance(entry, str) or not entry:
        raise UsageError(f"entry must be a non-empty string (script[:function]), not {entry!r}")
    _check_lease(lease)
    event = created_event(entry, status, info, None)
    now = time.time()
    hdr = {"entry": entry, "strategy": strategy, "status": status,
           "created": now, "updated": now, "epoch": 1, "host": HOST, "pid": os.getpid(),
           "lease": now + lease if status == "running" else 0.0, "parent": None}
    if keep is not None:
        hdr["keep"] = keep
    blobs = {"args": as_bytes("args", args)}

    def op(txn: Any) -> RunInfo:
        if txn.get(scope.tenant_key + b"\x00" + rid, db=scope.dbs["runs"]) is not None:
            raise StoreError(f"run {rid.decode()!r} already exists in store {scope.path}")
        check_no_remains(scope, txn, rid)
        put_run(scope, txn, rid, hdr, blobs)
        _count_run(scope, txn, 1)
        append_event(scope, txn, rid, "created", event)
        return run_info(scope, rid, hdr, blobs)

    return scope.write(op)


def get_run(scope: Scope, run_id: str) -> RunInfo:
    """See :meth:`tcc.store.LmdbStore.get_run`."""
    rid = scope.check_run_id(run_id)
    return scope.read(lambda txn: run_info(scope, rid, *load_run(scope, txn, rid)))


def list_runs(scope: Scope, status: str | None,
              damaged: list[tuple[str, str]] | None) -> list[RunInfo]:
    """See :meth:`tcc.store.LmdbStore.list_runs`."""
    pfx = scope.tenant_key + b"\x00"

    def op(txn: Any) -> list[RunInfo]:
        out, found = [], 0
        bad: list[tuple[str, str]] = []
        for key, _ in iter_prefix(txn, scope.dbs["runs"], pfx):
            if key.endswith(HEAD):  # the tenant's run count
                continue
            found += 1
            rid = key[len(pfx):]
            try:
                info = run_info(scope, rid, *load_run(scope, txn, rid))
            except StoreCorruptError as exc:
                if damaged is None:
                    raise
                bad.append((shown(rid), str(exc)))
                continue
            if status is None or info.status == status:
                out.append(info)
        check_tally(scope, txn, "runs", pfx, found, f"tenant {scope.tenant!r}")
        if damaged is not None:
            damaged.extend(bad)  # once: a read retried after a map resize runs op again
        return out

    return scope.read(op)


def claim_run(scope: Scope, run_id: str, *, lease: float, steal: bool,
              expect_epoch: int | None = None) -> RunInfo:
    """See :meth:`tcc.store.LmdbStore.claim_run`."""
    _check_lease(lease)
    rid = scope.check_run_id(run_id)

    def op(txn: Any) -> RunInfo:
        hdr, blobs = load_run(scope, txn, rid)
        if hdr["status"] in FINAL_STATUSES:
            # checked in the claiming transaction: a resumer that looked at
            # the run before another one finished it cannot reopen it
            raise FencedError(f"run {run_id!r} in store {scope.path} is already {hdr['status']}")
        now = time.time()
        if expect_epoch is not None and hdr["epoch"] != expect_epoch:
            raise FencedError(
                f"run {run_id!r} in store {scope.path} moved on to epoch {hdr['epoch']} (owner "
                f"{hdr['host']}:{hdr['pid']}) before this process took it over from epoch "
                f"{expect_epoch}")
        mine = hdr["host"] == HOST and hdr["pid"] == os.getpid()
        alive = hdr["lease"] > now and not mine and not steal and expect_epoch is None
        if alive and hdr["host"] == HOST:
            alive = pid_alive(hdr["pid"])
        if alive:
            raise FencedError(
                f"run {run_id!r} in store {scope.path} is owned by {hdr['host']}:{hdr['pid']} "
                f"for {hdr['lease'] - now:.1f} s more; wait for it to finish or its lease to "
                "expire, or take it over anyway (`tcc resume --steal`, claim_run(steal=True))")
        prev = {"epoch": hdr["epoch"], "owner": f"{hdr['host']}:{hdr['pid']}"}
        # the intents the previous owner left in flight enter the journal under its epoch,
        # before the new one: the resumed run finds them, in doubt (``_inflight``)
        adopted = inflight.adopt(scope, txn, rid, hdr)
        hdr.update(epoch=hdr["epoch"] + 1, host=HOST, pid=os.getpid(), lease=now + lease,
                   updated=now)
        put_run(scope, txn, rid, hdr, blobs)
        append_event(scope, txn, rid, "reclaimed" if mine else "taken_over",
                     {**prev, "new_epoch": hdr["epoch"], **({"in_flight": adopted} if adopted else {})})
        return run_info(scope, rid, hdr, blobs)

    info = scope.write(op)
    inflight.sweep(scope)  # files of processes that are gone, once they hold nothing more
    return info


def cancel_run(scope: Scope, run_id: str, *, reason: str | None) -> RunInfo:
    """See :meth:`tcc.store.LmdbStore.cancel_run`."""
    rid = scope.check_run_id(run_id)

    def op(txn: Any) -> RunInfo:
        hdr, blobs = load_run(scope, txn, rid)
        if hdr["status"] in FINAL_STATUSES:
            raise FencedError(f"run {run_id!r} in store {scope.path} is already {hdr['status']}")
        prev = {"epoch": hdr["epoch"], "owner": f"{hdr['host']}:{hdr['pid']}",
                "status": hdr["status"]}
        now = time.time()
        hdr.update(epoch=hdr["epoch"] + 1, status="cancelled", host=HOST, pid=os.getpid(),
                   lease=0.0, updated=now)
        put_run(scope, txn, rid, hdr, blobs)
        append_event(scope, txn, rid, "cancelled", {**prev, "new_epoch": hdr["epoch"], "reason": reason})
        return run_info(scope, rid, hdr, blobs)

    return scope.write(op)


def renew_lease(scope: Scope, run_id: str, epoch: int, lease: float) -> RunInfo:
    """See :meth:`tcc.store.LmdbStore.renew_lease`."""
    _check_lease(lease)
    rid = scope.check_run_id(run_id)

    def op(txn: Any) -> RunInfo:
        hdr, blobs = fence(scope, txn, rid, epoch)
        now = time.time()
        hdr.update(lease=now + lease, updated=now)
        put_run(scope, txn, rid, hdr, blobs)
        return run_info(scope, rid, hdr, blobs)

    return scope.write(op)


def set_status(scope: Scope, run_id: str, epoch: int, status: str, *, result: bytes | None,
               error: bytes | None) -> RunInfo:
    """See :meth:`tcc.store.LmdbStore.set_status`."""
    if status not in RUN_STATUSES:
        raise ValueError(f"status must be one of {RUN_STATUSES}, not {status!r}")
    rid = scope.check_run_id(run_id)

    def op(txn: Any) -> RunInfo:
        hdr, blobs = fence(scope, txn, rid, epoch)
        hdr.update(status=status, updated=time.time())
        if result is not None:
            blobs["result"] = as_bytes("result", result)
        if error is not None:
            blobs["error"] = as_bytes("error", error)
        put_run(scope, txn, rid, hdr, blobs)
        append_event(scope, txn, rid, status, {"epoch": epoch})
        return run_info(scope, rid, hdr, blobs)

    return scope.write(op)


# ------------------------------------------------------------ fork and delete
def fork_run(scope: Scope, run_id: str, number: int | None, *, new_run_id: str | None) -> RunInfo:
    """See :meth:`tcc.store.LmdbStore.fork_run`."""
    src = scope.check_run_id(run_id)
    new = scope.check_run_id(new_run_id or uuid.uuid4().hex, new=True)
    sp, np_ = scope.run_prefix(src), scope.run_prefix(new)
    t, dbs, sealer = scope.tenant_key, scope.dbs, scope.sealer

    def op(txn: Any) -> RunInfo:
        shdr, sblobs = load_run(scope, txn, src)
        if txn.get(t + b"\x00" + new, db=dbs["runs"]) is not None:
            raise StoreError(f"run {new.decode()!r} already exists in store {scope.path}")
        check_no_remains(scope, txn, new)
        listed = [r[0] for r in indexed(scope, txn, sp, src)]
        # (a run killed inside its first effect has no snapshot: num is -1)
        num = number if number is not None else (listed[-1] if listed else -1)
        sval = txn.get(seq_key(t, src, num), db=dbs["snaps"]) if num in listed else None
        skey = seq_key(t, src, max(num, 0))
        if sval is None:
            which = f"snapshot {number}" if number is not None else (
                "snapshot yet (it stopped before its first checkpoint): resume it first")
            raise StoreError(f"run {run_id!r} in store {scope.path} has no {which}")
        try:
            hdr, blobs = sealer.open(b"snaps", skey, sval)
        except Corrupt as exc:
            raise scope.corrupt(f"run {run_id!r} snapshot {num} record", exc) from None
        for key, raw in iter_prefix(txn, dbs["journal"], sp):
            seq = int.from_bytes(key[-8:], "big")
            if seq >= hdr["j"]:
                break
            try:
                jh, jb = sealer.open(b"journal", key, raw)
            except Corrupt as exc:
                raise scope.corrupt(f"journal record {seq} of run {run_id!r}", exc) from None
            nk = seq_key(t, new, seq)
            txn.put(nk, sealer.seal(b"journal", nk, jh, jb), db=dbs["journal"])
        nkey = seq_key(t, new, 1)
        # the source's pending releases are its own: the fork holds only the manifest
        nval = sealer.seal(b"snaps", nkey, hdr, {k: v for k, v in blobs.items() if k != "r"})
        held = set(scope.held.held(txn, dbs, skey, sval).ids)
        apply_diff(txn, dbs, set(), held, lambda _cid: None)
        txn.put(nkey, nval, db=dbs["snaps"])
        put_index(scope, txn, np_, new, [1], hdr["j"])
        txn.put(sp + u64(num) + b"\x00" + new, b"", db=dbs["pins"])
        now = time.time()
        rhdr = {"entry": shdr["entry"], "strategy": shdr["strategy"], "status": "running",
                "created": now, "updated": now, "epoch": 1, "host": HOST, "pid": os.getpid(),
                "lease": now + 30.0, "parent": [src.decode(), num]}
        rblobs = {"args": sblobs.get("args", b"")}
        put_run(scope, txn, new, rhdr, rblobs)
        _count_run(scope, txn, 1)
        append_event(scope, txn, new, "created", {"forked_from": src.decode(), "snapshot": num})
        append_event(scope, txn, src, "forked", {"snapshot": num, "child": new.decode()})
        return run_info(scope, new, rhdr, rblobs)

    return scope.write(op)


def delete_run(scope: Scope, run_id: str) -> None:
    """See :meth:`tcc.store.LmdbStore.delete_run`."""
    rid = scope.check_run_id(run_id)
    pfx = scope.run_prefix(rid)
    dbs = scope.dbs

    def op(txn: Any) -> None:
        hdr, _ = load_run(scope, txn, rid)
        rows = snap_rows(txn, dbs["snaps"], pfx)
        apply_diff(txn, dbs, scope.held.run_held(txn, dbs, rows), set(), lambda _a: None)
        for name in ("snaps", "journal", "signals", "pins"):
            keys = [bytes(k) for k, _ in iter_prefix(txn, dbs[name], pfx)]
            for k in keys:
                txn.delete(k, db=dbs[name])
        parent = hdr.get("parent")
        if parent:
            pk = scope.run_prefix(parent[0].encode()) + u64(parent[1]) + b"\x00" + rid
            txn.delete(pk, db=dbs["pins"])
        txn.delete(scope.tenant_key + b"\x00" + rid, db=dbs["runs"])
        _count_run(scope, txn, -1)
        append_event(scope, txn, rid, "deleted", {})

    scope.write(op)
