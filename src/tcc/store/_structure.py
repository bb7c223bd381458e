"""What the open checks before LMDB reads a tree page of ``data.mdb``.

LMDB trusts its file completely: a truncated file means SIGBUS, a misdirected
page an assertion abort, a zeroed leaf records that silently vanish.  So the
open walks the file's page structure first (``_lmdbcheck``, pure Python over
``os.pread``), unless the verdict file vouches for it as it is
(``_verified``); :class:`PageProbe` adds what only the records can tell (which
database a leaf belongs to), and :func:`check_databases` that the store holds
exactly its named databases.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from ..errors import StoreCorruptError, StoreError
from ._codec import DBS, RECORD_MIN, Sealer
from ._lmdbcheck import LmdbDamageError, check_data_file
from ._verified import Verdict

__all__ = ["FULL_CHECK_MAX", "PageProbe", "check_databases", "check_structure"]

# data files up to this size get a full structural walk at open (~5 ms per 10 MiB)
FULL_CHECK_MAX = 256 << 20
# databases whose every value is a record sealed by _codec.Sealer
_SEALED = ("runs", "journal", "snaps", "signals", "events")


class PageProbe:
    """Tells a leaf page of one sealed database from a page of another written in its place.

    Page structure cannot: a leaf of the journal put where the signals leaf was
    is a valid signals leaf whose keys LMDB then never finds, so a delivered
    signal reads as never sent.  The records can: each one's MAC names its
    database.  A leaf with at least one record that verifies as its
    database's is that database's; one where none does (two or more records,
    or one record that verifies as another database's or cannot be a sealed
    record at all) is misplaced.  A single damaged record is left to the
    record-level checks, which report it without refusing the whole store.
    The verdict waits for the end of the walk: if no page verified at all, the
    secret is wrong, which the format check reports more usefully.
    """

    __slots__ = ("sealer", "good", "bad")

    def __init__(self, sealer: Sealer) -> None:
        self.sealer = sealer
        self.good = 0
        self.bad: list[tuple[str, int, str]] = []

    def __call__(self, name: str, pgno: int, records: Iterator[tuple[bytes, bytes]]) -> None:
        if name not in _SEALED:
            return None
        db = name.encode()
        verifies = self.sealer.verifies
        failed = []
        for key, value in records:  # the first one decides, on a healthy page
            if verifies(db, key, value):
                self.good += 1
                return None
            failed.append((key, value))
        if not failed:
            return None
        key, value = failed[0]
        whose = next((o for o in _SEALED if o != name and verifies(o.encode(), key, value)), None)
        if whose is not None:
            self.bad.append((name, pgno, f"it holds records of database {whose!r}"))
        elif len(failed) > 1:
            self.bad.append((name, pgno, f"none of its {len(failed)} records is one of {name!r}"))
        elif len(value) < RECORD_MIN:
            self.bad.append((name, pgno, "its record is not a sealed record"))
        return None

    def verdict(self, path: str) -> None:
        if self.bad and self.good:
            name, pgno, why = self.bad[0]
            raise LmdbDamageError(f"{path}: page {pgno} of database {name!r} is not that "
                                  f"database's page ({why}): a page written to the wrong place")


def check_structure(env: Any, txn: Any, path: str, sealer: Sealer, verdict: Verdict) -> bool | None:
    """Verify data.mdb's page structure for read transaction ``txn``'s snapshot of
    environment ``env`` (the store at ``path``): whether the whole file was walked,
    or None if writers moved on past the snapshot (look again).

    ``TCC_STORE_CHECK``: ``auto`` (default: a full walk up to
    FULL_CHECK_MAX bytes, the cheap checks beyond; no walk if the verdict
    file vouches for the file as it is, see ``_verified``), ``full`` (walk
    at every open), ``quick`` or ``off``.  Raises StoreCorruptError (and
    closes the environment) on damage.
    """
    mode = os.environ.get("TCC_STORE_CHECK", "auto")
    if mode not in ("auto", "full", "quick", "off"):
        env.close()
        raise StoreError(f"TCC_STORE_CHECK must be auto, full, quick or off, not {mode!r}")
    verdict.reset()
    if mode == "off":
        return False
    data = os.path.join(path, "data.mdb")
    probe = PageProbe(sealer)
    try:
        vouched = mode == "auto" and verdict.matches()
        before = None if vouched else verdict.state()  # what a passing walk vouches for
        full = mode == "full" or (mode == "auto" and not vouched
                                  and os.path.getsize(data) <= FULL_CHECK_MAX)
        check_data_file(data, txnid=txn.id(), full=full, probe=probe)
        probe.verdict(data)
        if full and not vouched:
            verdict.walked(before)
    except LookupError:  # two commits replaced the meta page of this txn's snapshot
        return None
    except (LmdbDamageError, OSError) as exc:
        txn.abort()
        env.close()
        raise StoreCorruptError(
            f"store {path}: data.mdb is damaged ({exc}); nothing was read from it. "
            "Restore the store from a backup; `tcc gc --compact` on a copy may salvage "
            "what is intact") from None
    return full


def check_databases(txn: Any, path: str) -> None:
    """A formatted store has exactly its named databases: flipped bits in a name
    would otherwise make LMDB create a new, empty database in its place."""
    names = {bytes(k) for k in txn.cursor().iternext(values=False)}
    if b"meta" not in names:
        return  # a new store (or a foreign file, refused after this)
    missing = sorted(n for n in DBS if n.encode() not in names)
    unknown = sorted(names - {n.encode() for n in DBS})
    if missing or unknown:
        raise StoreCorruptError(
            f"store {path}: data.mdb is damaged: database(s) {missing} are missing"
            + (f" and {[u.decode('ascii', 'replace') for u in unknown]} are unknown" if unknown else "")
            + " (damage renamed or lost them); restore the store from a backup")
