"""The run record, and the fence every write of a run's owner passes first.

A run record (``runs``: tenant NUL run id) holds the entry, strategy, status,
owner (host and pid), lease expiry and **epoch**, with the arguments, result
and error as blobs.  :func:`fence` is the check every write of a run's owner
makes first, in its own transaction: the writer's epoch must still be the
run's, and the run must not be in a final status (:data:`FINAL_STATUSES`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import FencedError, RunNotFoundError, StoreCorruptError, UsageError
from ._api import FINAL_STATUSES, RunInfo
from ._codec import Corrupt, shown
from ._heads import head_key

if TYPE_CHECKING:
    from ._scope import Scope

__all__ = ["check_no_remains", "fence", "load_run", "put_run", "run_info"]


def load_run(scope: Scope, txn: Any, rid: bytes) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The verified (header, blobs) of run ``rid``'s record (copies: the caller may
    change them).  RunNotFoundError if there is none; StoreCorruptError if it
    fails verification or the run's other records remain without it."""
    key = scope.tenant_key + b"\x00" + rid
    raw = txn.get(key, db=scope.dbs["runs"])
    if raw is None:
        check_no_remains(scope, txn, rid)
        raise RunNotFoundError(
            f"no run {shown(rid)!r} for tenant {scope.tenant!r} in store {scope.path}")
    seen = scope.runs_seen.get(key)
    if seen is not None and seen[0] == raw:  # the very bytes whose MAC was checked before
        return dict(seen[1]), dict(seen[2])
    try:
        hdr, blobs = scope.sealer.open(b"runs", key, raw)
    except Corrupt as exc:
        raise scope.corrupt(f"run {shown(rid)!r} record", exc) from None
    if len(scope.runs_seen) >= 64:
        scope.runs_seen.clear()
    scope.runs_seen[key] = (bytes(raw), hdr, blobs)
    return dict(hdr), dict(blobs)


def put_run(scope: Scope, txn: Any, rid: bytes, hdr: dict[str, Any], blobs: dict[str, bytes]) -> None:
    """Write run ``rid``'s record."""
    key = scope.tenant_key + b"\x00" + rid
    txn.put(key, scope.sealer.seal(b"runs", key, hdr, blobs), db=scope.dbs["runs"])


def fence(scope: Scope, txn: Any, rid: bytes, epoch: int) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The run's record, if a writer with ``epoch`` may still write to it; else
    FencedError (the run was claimed or cancelled since, or its status is final)."""
    if type(epoch) is not int:
        raise UsageError(f"epoch must be an int (from create_run or claim_run), not {epoch!r}")
    hdr, blobs = load_run(scope, txn, rid)
    if hdr["epoch"] != epoch and hdr["status"] == "cancelled":
        raise FencedError(
            f"run {shown(rid)!r} in store {scope.path} was cancelled (by "
            f"{hdr['host']}:{hdr['pid']}), so this writer (epoch {epoch}) must stop; "
            "nothing was written")
    if hdr["epoch"] != epoch:
        raise FencedError(
            f"run {shown(rid)!r} in store {scope.path} is at epoch {hdr['epoch']} "
            f"(owner {hdr['host']}:{hdr['pid']}) but this writer has epoch {epoch}: the run "
            "was taken over, so this writer must stop; nothing was written")
    if hdr["status"] in FINAL_STATUSES:
        # a completed run cannot be reopened into a second completion (contract C6)
        raise FencedError(
            f"run {shown(rid)!r} in store {scope.path} is already {hdr['status']}, which is "
            "final; nothing was written")
    return hdr, blobs


def run_info(scope: Scope, rid: bytes, hdr: dict[str, Any], blobs: dict[str, bytes]) -> RunInfo:
    """The :class:`RunInfo` of a run record."""
    parent = hdr.get("parent")
    return RunInfo(
        run_id=shown(rid), tenant=scope.tenant, entry=hdr["entry"], args=blobs.get("args", b""),
        strategy=hdr["strategy"], status=hdr["status"], created=hdr["created"],
        updated=hdr["updated"], epoch=hdr["epoch"], owner_host=hdr["host"],
        owner_pid=hdr["pid"], lease_expiry=hdr["lease"], result=blobs.get("result"),
        error=blobs.get("error"), parent=(parent[0], parent[1]) if parent else None,
    )


def check_no_remains(scope: Scope, txn: Any, rid: bytes) -> None:
    """No journal, snapshot or signal of a run without a run record (else damage lost it).

    Cheap: three lookups.  Run creation calls it so that a new run cannot
    adopt the records of one whose run record damage moved away; lookups
    of an unknown run call it so that such a run is reported damaged, not
    unknown.
    """
    pfx = scope.run_prefix(rid)
    for db in ("journal", "snaps", "signals"):
        if txn.get(head_key(db, pfx), db=scope.dbs[db]) is not None:
            raise StoreCorruptError(
                f"store {scope.path}: the record of run {shown(rid)!r} is missing but its "
                f"{db} is there (damage lost or moved the run record); restore the store "
                "from a backup")
