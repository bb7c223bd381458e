"""``LmdbStore``: the :class:`~tcc.store.Store` interface on one LMDB environment.

The class only composes: each method checks nothing and stores nothing
itself, but hands its :class:`~tcc.store._scope.Scope` (the tenant, the
environment and this handle's caches) to the function for its concern:

==============  ==============================================================
``_runs``       create, get, list, claim, cancel, lease, status, fork, delete
``_journal``    intents and completions
``_snapshots``  checkpoint, list, load, fall back past damage
``_signals``    deliver once, consume once
``_events``     the audit trail
``_retention``  gc and compaction (retention itself runs in each checkpoint)
==============  ==============================================================

Below them: ``_runrecord`` (run records and the epoch fence), ``_heads``
(sealed counts and snapshot indexes), ``_chunkrefs`` and ``_chunks`` (stored
chunks, reference counts, content-defined chunking), ``_codec`` (key layout
and sealed records), ``_env`` (the LMDB environment and its transactions),
``_format`` (the format header and upgrades), ``_trust`` (who may own a
store), ``_structure`` (the page checks at open), ``_crypt`` (encryption).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from ..errors import TccError
from . import _code, _events, _journal, _retention, _runs, _signals, _snapshots
from ._api import Completion, Event, GcStats, JournalRecord, RunInfo, SnapshotInfo
from ._codec import check_name
from ._chunks import Payload
from ._crypt import StoreKey
from ._scope import Scope

__all__ = ["LmdbStore"]

_S = TypeVar("_S", bound="LmdbStore")


class LmdbStore:
    """Runs, journal, snapshots, signals and events of one tenant, in LMDB.

    Thread-safe; several processes may open the same store.  Create it with
    :func:`tcc.store.open_store`.
    """

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
        key: bytes | str | StoreKey | None = None,
        sync_intents: bool = False,
    ) -> None:
        self._scope = Scope(path, tenant=tenant, durability=durability, create=create, keep=keep,
                            map_size=map_size, max_map_size=max_map_size, key=key,
                            sync_intents=sync_intents)

    # ------------------------------------------------------------- properties
    @property
    def path(self) -> str:
        """Absolute path of the store directory."""
        return self._scope.path

    @property
    def tenant(self) -> str:
        """The tenant every call is scoped to."""
        return self._scope.tenant

    @property
    def intents_durable(self) -> bool:
        """False in ``sync`` durability (unless opened with ``sync_intents=True``): an
        intent is written in flight, safe from a process crash, and made durable by the
        step's commit, so an OS crash can take the intent of the call in flight
        (``tcc.store._inflight``).  True otherwise: every commit, an intent's too, is as
        durable as the durability mode makes it."""
        return self._scope.inflight is None

    @property
    def durability(self) -> str:
        """``sync``, ``group`` or ``none`` (see :data:`~tcc.store.DURABILITIES`)."""
        return self._scope.env.durability

    @property
    def encrypted(self) -> bool:
        """Whether the store encrypts its records and chunks (see ``_crypt``)."""
        return self._scope.sealer.crypt is not None

    @property
    def map_size(self) -> int:
        """Current size of the memory map in bytes."""
        return self._scope.env.map_size

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<LmdbStore {self.path!r} tenant={self.tenant!r} durability={self.durability!r}>"

    def close(self) -> None:
        """Release the store; the environment closes when its last user does."""
        scope = self._scope
        if not scope.closed:
            if scope.deferred:  # events deferred to a commit that never came: one now
                try:
                    scope.write(lambda txn: None)
                except TccError:
                    pass  # (fenced ones are void anyway; a broken store loses them, as a crash)
            scope.closed = True
            if scope.inflight is not None:
                scope.inflight.close()
            scope.env.release()

    # ------------------------------------------------------------------- runs
    def create_run(
        self,
        entry: str,
        args: bytes = b"",
        *,
        strategy: str = "continuation",
        run_id: str | None = None,
        lease: float = 30.0,
        keep: int | None = None,
        status: str = "running",
        spawned_by: str | None = None,
        info: Mapping[str, Any] | None = None,
    ) -> RunInfo:
        """Create a run owned by this process: epoch 1, status ``running`` (or ``queued``,
        ``importing``: no lease; see :meth:`tcc.store.Store.create_run`).

        ``keep``: the run's own snapshot retention (default: the store's).  ``spawned_by``
        is checked and otherwise unused: the worker of an LMDB store reads a parent's wait
        from its events.  ``info``: more data for the ``created`` event."""
        if spawned_by is not None:
            check_name("run id", spawned_by)
        return _runs.create_run(self._scope, entry, args, strategy=strategy, run_id=run_id,
                                lease=lease, keep=keep, status=status, info=info)

    def get_run(self, run_id: str) -> RunInfo:
        """The run, or RunNotFoundError (also for other tenants' runs)."""
        return _runs.get_run(self._scope, run_id)

    def list_runs(self, status: str | None = None, *,
                  damaged: list[tuple[str, str]] | None = None) -> list[RunInfo]:
        """This tenant's runs (optionally with one status), ordered by run id.

        A run record that fails verification raises StoreCorruptError, unless
        ``damaged`` is a list: then ``(run id, error message)`` is appended to
        it and the listing goes on with the other runs.
        """
        return _runs.list_runs(self._scope, status, damaged)

    def claim_run(self, run_id: str, *, lease: float = 30.0, steal: bool = False,
                  expect_epoch: int | None = None) -> RunInfo:
        """Take ownership: epoch + 1, owner = this process, so older writers are fenced.

        Refused (FencedError) while another live owner's lease runs, unless
        ``steal``.  An owner on this host whose pid is gone counts as dead.
        ``expect_epoch``: a hand-over (see :meth:`tcc.store.Store.claim_run`).
        """
        return _runs.claim_run(self._scope, run_id, lease=lease, steal=steal,
                               expect_epoch=expect_epoch)

    def cancel_run(self, run_id: str, *, reason: str | None = None) -> RunInfo:
        """Cancel a run that has not completed: status ``cancelled``, epoch + 1.

        The epoch bump fences a live owner: its next commit raises
        FencedError and writes nothing, so the run stops at its next effect
        or checkpoint.  Resumers, ``tcc run`` and the worker leave a cancelled
        run alone.  Refused (FencedError) if the run is already completed or
        cancelled.
        """
        return _runs.cancel_run(self._scope, run_id, reason=reason)

    def renew_lease(self, run_id: str, epoch: int, lease: float = 30.0) -> RunInfo:
        """Extend this owner's lease to ``lease`` seconds from now.

        Also sets ``updated``: the owner's heartbeat renews the lease every
        lease/3 s, so a live run's ``updated`` stays current during long
        effects and between checkpoints (which do not rewrite the run record).
        """
        return _runs.renew_lease(self._scope, run_id, epoch, lease)

    def set_status(
        self,
        run_id: str,
        epoch: int,
        status: str,
        *,
        result: bytes | None = None,
        error: bytes | None = None,
        wake: float | None = None,
    ) -> RunInfo:
        """Change the status (recording ``result``/``error``) and log an event.  ``wake``
        is accepted for the interface: the LMDB worker reads a sleep's end from its
        ``parked`` event."""
        return _runs.set_status(self._scope, run_id, epoch, status, result=result, error=error)

    def fork_run(
        self, run_id: str, number: int | None = None, *, new_run_id: str | None = None
    ) -> RunInfo:
        """A new run starting from snapshot ``number`` (default newest) of ``run_id``.

        The new run gets a copy of the journal prefix the snapshot reflects
        and shares the snapshot's chunks; the source snapshot is pinned (kept
        past retention) while the fork exists.
        """
        return _runs.fork_run(self._scope, run_id, number, new_run_id=new_run_id)

    def delete_run(self, run_id: str) -> None:
        """Delete a run's record, journal, snapshots, signals and pins (events stay)."""
        _runs.delete_run(self._scope, run_id)

    # ---------------------------------------------------------------- journal
    def append_intent(
        self,
        run_id: str,
        epoch: int,
        name: str,
        args: bytes = b"",
        *,
        idempotency_key: str | None = None,
        attempt: int = 1,
    ) -> int:
        """Journal an effect about to run; returns its sequence number."""
        return _journal.append_intent(self._scope, run_id, epoch, name, args,
                                      idempotency_key=idempotency_key, attempt=attempt)

    def append_completion(self, run_id: str, epoch: int, completion: Completion, *,
                          consume_signal: str | None = None) -> int:
        """Journal an effect's outcome without a snapshot; returns its sequence number.

        ``consume_signal`` is consumed in the same transaction, as in
        :meth:`checkpoint`.
        """
        return _journal.append_completion(self._scope, run_id, epoch, completion,
                                          consume_signal=consume_signal)

    def journal(self, run_id: str, start: int = 0) -> list[JournalRecord]:
        """The run's journal records with ``seq >= start``, in order (all verified)."""
        return _journal.journal(self._scope, run_id, start)

    def journal_length(self, run_id: str) -> int:
        """How many journal records the run has, read from its (verified) count record
        alone: ``journal(run_id, journal_length(run_id) - n)`` reads only the last n
        (`tcc show` pages a long journal so).  Read-only."""
        return _journal.journal_length(self._scope, run_id)

    # -------------------------------------------------------------- snapshots
    def checkpoint(
        self,
        run_id: str,
        epoch: int,
        payload: Payload,
        *,
        completion: Completion | None = None,
        consume_signal: str | None = None,
    ) -> SnapshotInfo:
        """Journal ``completion`` (if given) and store ``payload`` as the next snapshot.

        ``consume_signal`` names a pending signal to consume in the same
        transaction (the snapshot already holds its value, read with
        :meth:`peek_signal`); if it is no longer pending, FencedError is raised
        and nothing is written.

        Both land in ONE write transaction that first checks ``epoch``
        (FencedError, nothing written, if stale).  Pass the *uncompressed*
        payload: it is chunked by content and each new chunk compressed, so a
        payload that changed a little costs a little (a payload given as pieces:
        see :meth:`tcc.store.Store.checkpoint`).  Snapshots beyond the
        newest ``keep`` (and not pinned by a fork) are dropped in the same
        transaction.
        """
        return _snapshots.checkpoint(self._scope, run_id, epoch, payload, completion=completion,
                                     consume_signal=consume_signal)

    def snapshots(self, run_id: str) -> list[SnapshotInfo]:
        """Stored snapshots of the run, oldest first.

        Every record is verified; one that fails, one the run's index lists
        but the store lacks, and one stored under the run's keys that the
        index does not list are all listed with ``damaged=True`` (only the
        number is known), so damage neither hides a snapshot nor passes for
        one.  A missing or damaged index raises StoreCorruptError.
        """
        return _snapshots.snapshots(self._scope, run_id)

    def load_snapshot(self, run_id: str, number: int | None = None) -> bytes:
        """The verified payload of snapshot ``number`` (default: newest).

        Raises StoreCorruptError (naming run and snapshot) if any part fails
        verification; damaged bytes are never returned.
        """
        return _snapshots.load_snapshot(self._scope, run_id, number)

    def latest_good_snapshot(self, run_id: str) -> tuple[SnapshotInfo, bytes] | None:
        """The newest snapshot that verifies (None if none does).

        Each damaged snapshot skipped is recorded as a ``snapshot_corrupt``
        event, and a fallback as a ``fell_back`` event.  Snapshots the run's
        index lists but the store lost (damage moved or removed their records)
        are also recorded as ``snapshot_corrupt`` and dropped from the index,
        so that the run can checkpoint again.
        """
        return _snapshots.latest_good_snapshot(self._scope, run_id)

    # ---------------------------------------------------------------- signals
    def send_signal(self, run_id: str, name: str, value: bytes = b"") -> bool:
        """Deliver signal ``name`` to a run; False if that name was delivered before.

        A name is accepted once, ever: a second delivery (even after the first
        was consumed) is refused, so retried senders cannot double-approve.
        """
        return _signals.send_signal(self._scope, run_id, name, value)

    def take_signal(self, run_id: str, epoch: int, name: str) -> bytes | None:
        """Consume a pending signal exactly once; None if none is pending.

        The consumption is fenced by ``epoch`` and leaves a tombstone, so the
        value is handed out at most once even across crashes and takeovers.
        """
        return _signals.take_signal(self._scope, run_id, epoch, name)

    def peek_signal(self, run_id: str, name: str) -> bytes | None:
        """The value of a pending signal, without consuming it (None if not pending)."""
        return _signals.peek_signal(self._scope, run_id, name)

    def signal_state(self, run_id: str, name: str) -> str | None:
        """``"pending"``, ``"consumed"`` or None (never delivered)."""
        return _signals.signal_state(self._scope, run_id, name)

    def pending_signals(self, run_id: str) -> list[str]:
        """Names of signals delivered to the run and not consumed yet."""
        return _signals.pending_signals(self._scope, run_id)

    # ----------------------------------------------------------------- events
    def add_event(self, run_id: str, kind: str, data: Mapping[str, Any] | None = None, *,
                  epoch: int | None = None, deferred: bool = False) -> None:
        """Append an audit event (``data`` must be JSON-able).

        With ``epoch`` (the run's owner writing), the event is fenced like every
        other write of the owner: after a takeover or a cancel it raises
        FencedError and is not written.  ``deferred`` (with ``epoch``): see
        :meth:`tcc.store.Store.add_event`; here the event is written first by this
        handle's next write transaction, or by :meth:`close`.
        """
        _events.add_event(self._scope, run_id, kind, data, epoch=epoch, deferred=deferred)

    def events(self, run_id: str) -> list[Event]:
        """The run's audit trail, oldest first; kept even after the run is deleted."""
        return _events.events(self._scope, run_id)

    # ------------------------------------------------------------------- code
    def put_code(self, sources: Mapping[str, bytes]) -> None:
        """Store module sources, ``{sha256 hex: source}``; one already stored is not
        written again (no transaction at all if every one is)."""
        _code.put_code(self._scope, sources)

    def get_code(self, digest: str) -> bytes:
        """The source stored under ``digest`` (checked against it); StoreError if none."""
        return _code.get_code(self._scope, digest)

    # ----------------------------------------------------------- housekeeping
    def gc(self) -> GcStats:
        """Apply retention to this tenant's runs, then sweep chunks store-wide.

        The sweep recounts every chunk's references from all manifests (all
        tenants), deletes chunks nothing references and repairs counts that a
        damaged manifest left wrong.  Runs in one write transaction.
        """
        return _retention.gc(self._scope)

    def compact(self) -> GcStats:
        """Rewrite the data file without free pages and swap it in atomically.

        LMDB files never shrink on their own.  This needs the store to be open
        in no other process (StoreError otherwise); run :meth:`gc` first.
        """
        return _retention.compact(self._scope)
