"""Head records: the sealed count or index of each range of a run's records.

Damage that moves or removes a record leaves no trace by itself: a journal
whose newest record is gone looks shorter, not broken, and a signal record
moved to another key looks never sent.  So every counted range carries a head
record, sealed like every record and rewritten in every transaction that
changes what it states:

* in ``snaps``, a run's *snapshot index* (key suffix :data:`INDEX`): the
  sorted numbers of its stored snapshots and ``j``, the journal length as of
  its last checkpoint;
* in ``journal`` (between checkpoints), ``events`` and ``signals``, how many
  records the run has; in ``runs``, how many runs the tenant has (key suffix
  :data:`HEAD`, under the tenant's prefix).

Where each one sorts is chosen so that it costs no extra page.  The snapshot
index sorts *before* the run's snapshot records, on the page where each
commit deletes the oldest one.  The journal head sorts after the journal
records, so the next checkpoint deletes it (the index holds the length from
then on) before appending: journal records are then always appended at the
end of their page, where a record sorting after them would make LMDB split
pages in the middle and leave them half full.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import StoreCorruptError
from ._codec import Corrupt, Sealer, SnapRow, iter_prefix, last_seq, shown, snap_rows

if TYPE_CHECKING:
    from ._scope import Scope

__all__ = [
    "HEAD",
    "INDEX",
    "add_member",
    "check_tally",
    "head_key",
    "indexed",
    "is_head_key",
    "journal_len",
    "next_seq",
    "open_head",
    "put_head",
    "put_index",
    "read_head",
    "seal_head",
    "snapshot_index",
    "snapshot_numbers",
]

# Key suffix of a run's head record in the journal, events and signals (and of
# a tenant's run count in runs): it sorts after every record under the prefix.
# A sequenced key is prefix + u64 and a prefix ends in NUL, so none ends with it.
HEAD = b"\xff" * 10
# Key suffix of a run's snapshot index: it sorts BEFORE the run's snapshot
# records (prefix + u64(n), n >= 1), on the page of the oldest one.
INDEX = b"\x00"

_NOUNS = {"journal": "journal record", "events": "event", "signals": "signal", "runs": "run"}


def head_key(db: str, pfx: bytes) -> bytes:
    """Key of the head record of the run (tenant, in ``runs``) with prefix ``pfx``."""
    return pfx + (INDEX if db == "snaps" else HEAD)


def is_head_key(db: str, key: bytes) -> bool:
    """Whether ``key`` of database ``db`` is a head record rather than a record."""
    if db != "snaps":
        return key.endswith(HEAD)
    return key.endswith(INDEX) and len(key) - key.index(b"\x00", key.index(b"\x00") + 1) == 2


def seal_head(sealer: Sealer, db: str, pfx: bytes, n: Any) -> bytes:
    """The sealed head record of the run (or, in ``runs``, tenant) with key prefix
    ``pfx`` in ``db``: in ``snaps`` ``{"n": snapshot numbers, "j": journal
    length}``, elsewhere a record count."""
    return sealer.seal(db.encode(), head_key(db, pfx), {"n": n})


def open_head(sealer: Sealer, db: str, pfx: bytes, value: bytes | memoryview) -> Any:
    """What a head record states (Corrupt if it does not verify or is malformed)."""
    hdr, _ = sealer.open(db.encode(), head_key(db, pfx), value)
    n = hdr.get("n")
    if db == "snaps":
        nums, jlen = (n.get("n"), n.get("j")) if isinstance(n, dict) else (None, None)
        if (isinstance(nums, list) and all(type(x) is int and x >= 1 for x in nums)
                and nums == sorted(set(nums)) and type(jlen) is int and jlen >= 0):
            return {"n": nums, "j": jlen}
    elif type(n) is int and n >= 0:
        return n
    raise Corrupt(f"the {db} head record is malformed")


# ------------------------------------------------- reading and writing heads
def read_head(scope: Scope, txn: Any, db: str, pfx: bytes, what: str) -> Any:
    """The verified ``n`` of the head record under ``pfx`` in ``db`` (None: no record)."""
    key = head_key(db, pfx)
    raw = txn.get(key, db=scope.dbs[db])
    if raw is None:
        return None
    seen = scope.heads_seen.get(db.encode() + key)
    if seen is not None and seen[0] == raw:
        return seen[1]
    try:
        n = open_head(scope.sealer, db, pfx, raw)
    except Corrupt as exc:
        raise StoreCorruptError(f"store {scope.path}: {what} failed verification ({exc}); "
                                "restore the store from a backup") from None
    _remember(scope, db, key, bytes(raw), n)
    return n


def _remember(scope: Scope, db: str, key: bytes, raw: bytes, n: Any) -> None:
    # bytes sealed here or verified before: safe to trust when read back unchanged
    if len(scope.heads_seen) >= 64:
        scope.heads_seen.clear()
    scope.heads_seen[db.encode() + key] = (raw, n)


def put_head(scope: Scope, txn: Any, db: str, pfx: bytes, n: Any) -> None:
    """Write the head record under ``pfx`` in ``db``, stating ``n``."""
    key = head_key(db, pfx)
    raw = seal_head(scope.sealer, db, pfx, n)
    txn.put(key, raw, db=scope.dbs[db])
    _remember(scope, db, key, raw, n)


# ------------------------------------------------------- the snapshot index
def snapshot_index(scope: Scope, txn: Any, pfx: bytes, rid: bytes) -> dict[str, Any] | None:
    """The run's verified snapshot index ``{"n": numbers, "j": journal length}``
    (None: no index record)."""
    idx: dict[str, Any] | None = read_head(
        scope, txn, "snaps", pfx, f"the snapshot index of run {shown(rid)!r}")
    return idx


def snapshot_numbers(scope: Scope, txn: Any, pfx: bytes, rid: bytes) -> list[int] | None:
    """The snapshot numbers the run's index lists (None: no index record).

    Raises StoreCorruptError if the index fails verification.
    """
    idx = snapshot_index(scope, txn, pfx, rid)
    return None if idx is None else list(idx["n"])


def put_index(scope: Scope, txn: Any, pfx: bytes, rid: bytes, numbers: list[int],
              jlen: int | None = None) -> None:
    """Write the run's index: ``numbers`` and the journal length ``jlen`` (None:
    keep the one it has).  A checkpoint passes ``jlen`` after deleting the
    journal head."""
    if jlen is None:
        idx = snapshot_index(scope, txn, pfx, rid)
        jlen = int(idx["j"]) if idx is not None else 0
    put_head(scope, txn, "snaps", pfx, {"n": sorted(numbers), "j": jlen})


def indexed(scope: Scope, txn: Any, pfx: bytes, rid: bytes) -> list[SnapRow]:
    """The run's snapshot rows, oldest first, checked against its index.

    A record the index lists but the store lacks, or records without an
    index, mean damage moved or removed a record: StoreCorruptError.  A
    record the index does not list (one moved here from elsewhere) is
    not the run's and is left out.
    """
    rows = snap_rows(txn, scope.dbs["snaps"], pfx)
    nums = snapshot_numbers(scope, txn, pfx, rid)
    if nums is None:
        if rows:
            raise scope.missing(f"the snapshot index of run {shown(rid)!r}")
        return rows
    listed = set(nums)
    rows = [r for r in rows if r[0] in listed]
    if len(rows) != len(nums):
        lost = sorted(listed - {r[0] for r in rows})
        raise scope.missing(f"snapshot {lost[0]} of run {shown(rid)!r}")
    return rows


# ------------------------------------------------------------------ counts
def journal_len(scope: Scope, txn: Any, pfx: bytes, rid: bytes) -> int | None:
    """How many journal records the run has: its journal head (written between
    checkpoints), else what its snapshot index says (None: neither exists)."""
    n = read_head(scope, txn, "journal", pfx, f"the journal record count of run {shown(rid)!r}")
    idx = snapshot_index(scope, txn, pfx, rid)
    if n is None:
        return None if idx is None else int(idx["j"])
    if idx is not None and int(n) < int(idx["j"]):  # a head is only written after it
        raise StoreCorruptError(
            f"store {scope.path}: the journal of run {shown(rid)!r} has {n} records but its "
            f"snapshot index counts {idx['j']} (damage rolled the journal back); restore the "
            "store from a backup")
    return int(n)


def next_seq(scope: Scope, txn: Any, db: str, pfx: bytes, rid: bytes) -> int:
    """The sequence number of the run's next ``db`` record (journal or events).

    The count record must agree with the records: if the newest records
    were moved away or lost, the journal refuses to go on
    (StoreCorruptError).  Events continue after the count, so the hole
    stays visible to ``events()``.
    """
    last = last_seq(txn, scope.dbs[db], pfx) + 1
    if db == "journal":
        check_tally(scope, txn, db, pfx, last, f"run {shown(rid)!r}")
        return last
    n = read_head(scope, txn, db, pfx, f"the event count of run {shown(rid)!r}")
    return last if n is None else max(int(n), last)


# Journal and event records are numbered 0, 1, ... (holes are checked where
# they are read); the signals of a run and the runs of a tenant are a set.
def _members(scope: Scope, txn: Any, db: str, pfx: bytes) -> int:
    return sum(1 for k, _ in iter_prefix(txn, scope.dbs[db], pfx) if not k.endswith(HEAD))


def check_tally(scope: Scope, txn: Any, db: str, pfx: bytes, found: int | None, whose: str) -> None:
    """The ``found`` records under ``pfx`` (None: count them) agree with their count."""
    noun = _NOUNS[db]
    if db == "journal":
        n = journal_len(scope, txn, pfx, pfx[pfx.index(b"\x00") + 1:-1])
    else:
        n = read_head(scope, txn, db, pfx, f"the {noun} count of {whose}")
    if found is None:
        found = _members(scope, txn, db, pfx)
    if n is None:
        if found:
            raise scope.missing(f"the {noun} count of {whose}")
    elif n > found and db in ("journal", "events"):  # the newest leave no hole when they go
        raise scope.missing(f"{noun} {found} of {whose}")
    elif n != found:
        raise StoreCorruptError(
            f"store {scope.path}: {whose} has {found} {noun}s but its count says {n} (damage "
            f"moved, lost or rolled back a {noun} record); restore the store from a backup")


def add_member(scope: Scope, txn: Any, db: str, pfx: bytes, delta: int, whose: str) -> None:
    """Count a signal or run record just added (``delta`` 1) or deleted (-1) under ``pfx``."""
    n = read_head(scope, txn, db, pfx, f"the {_NOUNS[db]} count of {whose}")
    if n is None:  # a first record has no count yet; otherwise damage removed the count
        if _members(scope, txn, db, pfx) != delta:
            raise scope.missing(f"the {_NOUNS[db]} count of {whose}")
        n = 0
    put_head(scope, txn, db, pfx, int(n) + delta)
