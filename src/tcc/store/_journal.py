"""The journal: each run's effect intents and completions (run prefix + seq -> record).

Records are numbered 0, 1, 2, ... and never deleted alone.  An *intent*
(``{"k": "i", "n": name, "ik": idempotency key, "a": attempt}`` and the
arguments) is journaled before an effect runs; its *completion* (``{"k": "c",
"i": intent seq, "d": duration}`` and the result or error) after.  A
completion must answer an intent of its run that has no completion yet.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from ._api import Completion, JournalRecord
from . import _inflight as inflight
from ._codec import Corrupt, as_bytes, check_int, iter_prefix, last_seq, seq_key
from ._heads import HEAD, check_tally, journal_len, next_seq, put_head
from ._runrecord import fence, load_run
from ._signals import consume_or_fence

if TYPE_CHECKING:
    from ._scope import Scope

__all__ = [
    "OpenIntents",
    "append_completion",
    "append_intent",
    "journal",
    "journal_length",
    "note_committed",
    "put_completion",
]


class OpenIntents:
    """What this process knows of a run's journal from what it committed itself:
    among records ``first`` to ``end - 1``, the intents with no completion there.

    It lets a completion be checked against its intent without reading the
    journal from the intent on (which would cost a ``tcc.gather`` of N calls N
    reads per completion).  Only commits this process saw succeed go in;
    records others appended since are read from ``end`` on; ``created`` (the
    run's creation time) tells a run deleted and created again under the same
    id.  An intent it does not list is checked by reading the journal, which
    decides (memory only, never trusted to refuse).
    """

    __slots__ = ("created", "first", "end", "open")

    def __init__(self, created: float, first: int) -> None:
        self.created = created
        self.first = self.end = first
        self.open: set[int] = set()


def _put_journal(scope: Scope, txn: Any, rid: bytes, seq: int, hdr: dict[str, Any],
                 blobs: dict[str, bytes], count: bool = True) -> None:
    """Append record ``seq`` (from :func:`next_seq`) and count it in the journal
    head (``count``; a checkpoint counts it in the snapshot index instead)."""
    key = seq_key(scope.tenant_key, rid, seq)
    txn.put(key, scope.sealer.seal(b"journal", key, hdr, blobs), db=scope.dbs["journal"])
    if count:
        put_head(scope, txn, "journal", key[:-8], seq + 1)


def put_completion(scope: Scope, txn: Any, rid: bytes, seq: int, c: Completion, now: float,
                   created: float, count: bool = True) -> None:
    """Inside a write transaction: journal completion ``c`` as record ``seq``, after
    checking that it answers an open intent (UsageError otherwise)."""
    check_int("completion intent_seq", c.intent_seq)
    blobs = {}
    if c.result is not None:
        blobs["r"] = as_bytes("completion result", c.result)
    if c.error is not None:
        blobs["e"] = as_bytes("completion error", c.error)
    _check_open_intent(scope, txn, rid, seq, c.intent_seq, created)
    _put_journal(scope, txn, rid, seq, {"k": "c", "t": now, "i": c.intent_seq,
                                        "d": c.duration}, blobs, count)


def _journal_headers(scope: Scope, txn: Any, rid: bytes, start: int,
                     stop: int) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(seq, verified header)`` of the run's journal records from ``start``
    up to ``stop - 1`` that are stored."""
    db = scope.dbs["journal"]
    first = seq_key(scope.tenant_key, rid, start)
    for key, value in iter_prefix(txn, db, first[:-8], first):
        at = int.from_bytes(key[-8:], "big")
        if key.endswith(HEAD) or len(key) != len(first) or at >= stop:
            return
        try:
            h, _ = scope.sealer.open(b"journal", key, value)
        except Corrupt as exc:
            raise scope.corrupt(f"journal record {at} of run {rid.decode()!r}", exc) from None
        yield at, h


def _check_open_intent(scope: Scope, txn: Any, rid: bytes, seq: int, intent_seq: int,
                       created: float) -> None:
    """A completion journaled at ``seq`` must answer an intent of the run that has
    no completion yet; else UsageError (and, from the caller's transaction, nothing
    written).

    What this process committed itself answers at once (:class:`OpenIntents`);
    otherwise the records from the intent up to ``seq`` are read.
    """
    run = rid.decode()
    if intent_seq >= seq:
        raise UsageError(
            f"a completion of run {run!r} names intent {intent_seq}, but the run's journal "
            f"has {seq} records; pass the sequence number append_intent returned")
    with scope.memo_lock:
        known = scope.intents.get(rid)
        if known is not None and not (known.created == created and known.first <= intent_seq
                                      < known.end <= seq):
            known = None  # (an intent past its end: reading from the intent is shorter)
        opened = set(known.open) if known is not None else set()
        end = known.end if known is not None else seq
    if known is not None:
        for at, h in _journal_headers(scope, txn, rid, end, seq):  # appended by others
            if h.get("k") == "i":
                opened.add(at)
            elif h.get("k") == "c":
                opened.discard(h.get("i"))
        if intent_seq in opened:
            return
    name = None
    for at, h in _journal_headers(scope, txn, rid, intent_seq, seq):
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
        raise scope.missing(f"journal record {intent_seq} of run {run!r}")


def note_committed(scope: Scope, rid: bytes, created: float, seq: int, *, intent: bool = False,
                   answers: int | None = None) -> None:
    """After a commit: journal record ``seq`` of the run is an intent (``intent``) or
    the completion of intent ``answers``; keep :class:`OpenIntents` up to date."""
    with scope.memo_lock:
        known = scope.intents.pop(rid, None)
        if known is None or known.created != created or known.end != seq:
            known = OpenIntents(created, seq)
        if intent:
            known.open.add(seq)
        elif answers is not None:
            known.open.discard(answers)
        known.end = seq + 1
        scope.intents[rid] = known  # most recent last
        while len(scope.intents) > 64:
            scope.intents.pop(next(iter(scope.intents)))


def append_intent(scope: Scope, run_id: str, epoch: int, name: str, args: bytes, *,
                  idempotency_key: str | None, attempt: int) -> int:
    """See :meth:`tcc.store.LmdbStore.append_intent`."""
    rid = scope.check_run_id(run_id)
    args_b = as_bytes("args", args)
    if not isinstance(name, str) or not name:
        raise UsageError(f"effect name must be a non-empty string, not {name!r}")
    check_int("attempt", attempt, 1)

    hdr_i = {"k": "i", "t": time.time(), "n": name, "ik": idempotency_key, "a": attempt}
    log = scope.inflight
    if log is not None:  # in flight: one write(2), journaled by the next commit (_inflight)
        def check(txn: Any) -> tuple[int, float]:
            hdr, _ = fence(scope, txn, rid, epoch)
            return next_seq(scope, txn, "journal", scope.run_prefix(rid), rid), hdr["created"]

        stored, created = scope.read(check)
        try:
            seq = log.append(scope, rid, epoch, stored,
                             lambda key: scope.sealer.seal(b"journal", key, hdr_i, {"args": args_b}))
        except OSError:
            pass  # no in-flight file here (a full disk, a shared store): commit it instead
        else:
            note_committed(scope, rid, created, seq, intent=True)
            return seq

    def op(txn: Any) -> tuple[int, float]:
        hdr, _ = fence(scope, txn, rid, epoch)
        seq = next_seq(scope, txn, "journal", scope.run_prefix(rid), rid)
        _put_journal(scope, txn, rid, seq, hdr_i, {"args": args_b})
        return seq, hdr["created"]

    seq, created = scope.write(op)
    note_committed(scope, rid, created, seq, intent=True)
    return seq


def append_completion(scope: Scope, run_id: str, epoch: int, completion: Completion, *,
                      consume_signal: str | None) -> int:
    """See :meth:`tcc.store.LmdbStore.append_completion`."""
    rid = scope.check_run_id(run_id)

    def op(txn: Any) -> tuple[int, float]:
        hdr, _ = fence(scope, txn, rid, epoch)
        if type(completion.intent_seq) is int:
            inflight.ensure(scope, txn, rid, hdr, completion.intent_seq)
        seq = next_seq(scope, txn, "journal", scope.run_prefix(rid), rid)
        if consume_signal is not None:
            consume_or_fence(scope, txn, run_id, rid, consume_signal, epoch, seq)
        put_completion(scope, txn, rid, seq, completion, time.time(), hdr["created"])
        return seq, hdr["created"]

    seq, created = scope.write(op)
    note_committed(scope, rid, created, seq, answers=completion.intent_seq)
    return seq


def _record(seq: int, h: dict[str, Any], b: dict[str, bytes]) -> JournalRecord:
    """The :class:`JournalRecord` of a verified journal record's header and blobs."""
    if h["k"] == "i":
        return JournalRecord(seq, "intent", h["t"], name=h["n"], args=b.get("args"),
                             idempotency_key=h["ik"], attempt=h["a"])
    return JournalRecord(seq, "completion", h["t"], intent_seq=h["i"],
                         result=b.get("r"), error=b.get("e"), duration=h["d"])


def journal(scope: Scope, run_id: str, start: int) -> list[JournalRecord]:
    """See :meth:`tcc.store.LmdbStore.journal`."""
    rid = scope.check_run_id(run_id)

    def op(txn: Any) -> list[JournalRecord]:
        run_hdr, _ = load_run(scope, txn, rid)
        out: list[JournalRecord] = []
        first = seq_key(scope.tenant_key, rid, max(0, start))
        for key, value in iter_prefix(txn, scope.dbs["journal"], first[:-8], first):
            if key.endswith(HEAD):  # the count, after the records
                break
            seq = int.from_bytes(key[-8:], "big")
            if seq < start:
                continue
            expect = max(0, start) + len(out)
            if seq != expect or len(key) != len(first):
                # records are appended 0, 1, 2, ... and never deleted alone
                raise scope.missing(f"journal record {expect} of run {run_id!r}")
            try:
                h, b = scope.sealer.open(b"journal", key, value)
            except Corrupt as exc:
                raise scope.corrupt(f"journal record {seq} of run {run_id!r}", exc) from None
            out.append(_record(seq, h, b))
        # the newest records leave no gap when they go: the count says how many there are
        pfx = first[:-8]
        end = max(0, start) + len(out) if out else last_seq(txn, scope.dbs["journal"], pfx) + 1
        check_tally(scope, txn, "journal", pfx, end, f"run {run_id!r}")
        # intents in flight (``_inflight``) follow, as the next commit will journal them
        for key, value in inflight.left_behind(scope, rid, run_hdr["epoch"], end):
            seq = int.from_bytes(key[-8:], "big")
            try:
                h, b = scope.sealer.open(b"journal", key, value)
            except Corrupt:
                break
            if seq >= start and h.get("k") == "i":
                out.append(_record(seq, h, b))
        return out

    return scope.read(op)


def journal_length(scope: Scope, run_id: str) -> int:
    """See :meth:`tcc.store.LmdbStore.journal_length`."""
    rid = scope.check_run_id(run_id)

    def op(txn: Any) -> int:
        hdr, _ = load_run(scope, txn, rid)  # an unknown run: RunNotFoundError, as journal() says
        n = journal_len(scope, txn, scope.run_prefix(rid), rid) or 0
        return n + len(inflight.left_behind(scope, rid, hdr["epoch"], n))  # and intents in flight

    return scope.read(op)
