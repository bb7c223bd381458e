"""The store interface the runtime talks to, and the plain records it returns.

Nothing here knows about LMDB: a second backend (PostgreSQL, say) implements
:class:`Store` and returns the same frozen dataclasses.  The value sets a
backend and its callers share -- run statuses, durability modes, the host name
written into run records -- are spelled out here, once.

Value conventions (the same for every backend):

* *Opaque payloads* -- run arguments, effect arguments, results, errors,
  signal values and snapshot payloads -- are ``bytes`` produced and consumed by
  the caller (usually ``tcc.dumps`` output).  The store never interprets them.
* *Metadata* -- names, keys, statuses, timestamps, event details -- are plain
  JSON-able values.
* Timestamps are ``time.time()`` floats (seconds since the epoch, UTC).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any, Literal, Protocol, get_args, runtime_checkable

__all__ = [
    "CREATE_STATUSES",
    "DURABILITIES",
    "FINAL_STATUSES",
    "FINISHED_STATUSES",
    "HOST",
    "LIVE_STATUSES",
    "PARKED_STATUSES",
    "RETURNED_STATUSES",
    "RUN_STATUSES",
    "Completion",
    "Durability",
    "Event",
    "GcStats",
    "JournalRecord",
    "RunInfo",
    "RunStatus",
    "SnapshotInfo",
    "Store",
    "StoreDamageWarning",
]

RunStatus = Literal["importing", "queued", "running", "waiting", "sleeping", "completed",
                    "unverified", "failed", "cancelled"]
#: Every run status, in lifecycle order.  ``importing``: ``tcc import`` is writing the run
#: (nothing resumes it; an import that was interrupted leaves it so, and importing the
#: file again replaces it).  ``queued``: submitted (``tcc submit``), not started yet: a
#: worker starts it.  ``unverified``: the run returned, but its verify check did not pass.
RUN_STATUSES: tuple[RunStatus, ...] = get_args(RunStatus)
#: The run has not ended: it waits for a worker to start it (``queued``), its owner is
#: executing it (``running``), or it is parked until a signal (``waiting``) or a time
#: (``sleeping``) and will be resumed.
LIVE_STATUSES: tuple[RunStatus, ...] = ("queued", "running", "waiting", "sleeping")
#: The live statuses of a run parked until a signal or a time (a worker resumes it).
PARKED_STATUSES: tuple[RunStatus, ...] = ("waiting", "sleeping")
#: The run has ended: nothing resumes it by itself (``tcc resume`` may retry a
#: ``failed`` one).  Together with LIVE_STATUSES, every status but ``importing``.
FINISHED_STATUSES: tuple[RunStatus, ...] = ("completed", "unverified", "failed", "cancelled")
#: The run's function returned, so its result is recorded.
RETURNED_STATUSES: tuple[RunStatus, ...] = ("completed", "unverified")
#: No writer may change the run any more: every fenced write to it, and every
#: :meth:`Store.claim_run` and :meth:`Store.cancel_run`, raises FencedError.
FINAL_STATUSES: tuple[RunStatus, ...] = ("completed", "cancelled")
#: The statuses a run may be created in (:meth:`Store.create_run`).
CREATE_STATUSES: tuple[RunStatus, ...] = ("running", "queued", "importing")

Durability = Literal["sync", "group", "none"]
#: Durability modes of a store (``open_store(durability=...)``): ``sync`` makes each
#: commit durable before it returns, ``group`` lets concurrent commits share one
#: flush with the same guarantee, ``none`` survives process crashes only.
DURABILITIES: tuple[Durability, ...] = get_args(Durability)

#: This machine's name as run records give it (:attr:`RunInfo.owner_host`): an
#: owner on this host can be checked for being alive by its pid.  ``$TCC_HOST_ID``
#: overrides it: two hosts must never share an identity (a worker would take a live run
#: from the other at once, its pid being unknown here), and tests run several "hosts"
#: on one machine with it.
HOST = os.environ.get("TCC_HOST_ID") or os.uname().nodename  # gethostname(), without socket


class StoreDamageWarning(UserWarning):
    """Housekeeping met a damaged run (or snapshot) and left it as it is."""


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """One run: what it executes, who owns it, and how it ended."""

    run_id: str
    tenant: str
    entry: str
    args: bytes
    strategy: str
    status: str
    created: float
    updated: float
    epoch: int
    owner_host: str
    owner_pid: int
    lease_expiry: float
    result: bytes | None = None
    error: bytes | None = None
    parent: tuple[str, int] | None = None


@dataclasses.dataclass(frozen=True)
class Completion:
    """The outcome of one effect, to be journaled (usually with a snapshot)."""

    intent_seq: int
    result: bytes | None = None
    error: bytes | None = None
    duration: float = 0.0


@dataclasses.dataclass(frozen=True)
class JournalRecord:
    """One journal entry: an effect *intent* or the *completion* of one."""

    seq: int
    kind: Literal["intent", "completion"]
    time: float
    name: str = ""
    args: bytes | None = None
    idempotency_key: str | None = None
    attempt: int = 1
    intent_seq: int | None = None
    result: bytes | None = None
    error: bytes | None = None
    duration: float | None = None


@dataclasses.dataclass(frozen=True)
class SnapshotInfo:
    """A stored snapshot's metadata (the payload is fetched separately).

    ``journal_len`` is the number of journal records that existed when the
    snapshot committed: the snapshot reflects exactly journal[0:journal_len].
    A ``damaged`` snapshot's record failed verification: only its number is
    known (the other fields are -1 / 0.0) and loading it raises
    StoreCorruptError.
    """

    run_id: str
    number: int
    journal_len: int
    size: int
    created: float
    pinned: bool = False
    damaged: bool = False


@dataclasses.dataclass(frozen=True)
class Event:
    """A lifecycle audit record (started, taken_over, completed, ...)."""

    run_id: str
    seq: int
    kind: str
    time: float
    data: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class GcStats:
    """What :meth:`Store.gc` or :meth:`Store.compact` did.

    ``chunks_deleted`` counts stored pieces of snapshot payloads that no
    snapshot references any more; ``refs_repaired`` the reference counts gc
    found wrong and corrected (both 0 for a backend that keeps payloads whole).
    ``bytes_before``/``bytes_after``: the store's size on disk.
    """

    snapshots_deleted: int = 0
    chunks_deleted: int = 0
    refs_repaired: int = 0
    bytes_before: int = 0
    bytes_after: int = 0


@runtime_checkable
class Store(Protocol):
    """Durable runs, journal, snapshots, signals and events for one tenant.

    The contract every backend keeps (the runtime relies on each clause):

    * **Scope.**  Every call is scoped to :attr:`tenant`; another tenant's run
      is reported as :class:`~tcc.errors.RunNotFoundError`.  Run ids, tenants
      and signal names are what :func:`tcc.store.check_name` accepts.
    * **Atomicity.**  Each method that writes commits all its writes in one
      transaction, or none of them: an error means nothing was written.  When
      the call returns, the commit is as durable as the store's durability
      mode (:data:`DURABILITIES`) promises.
    * **Fencing.**  A write that belongs to a run takes the writer's ``epoch``
      (from :meth:`create_run` or :meth:`claim_run`).  It checks the epoch in
      its own transaction and raises :class:`~tcc.errors.FencedError`, writing
      nothing, if the run was claimed or cancelled since (its epoch moved on)
      or if the run's status is final (:data:`FINAL_STATUSES`).
    * **Arguments** are checked before anything is written: payloads, results,
      errors, signal values and run arguments must be bytes-like (never
      converted), epochs, attempts and snapshot numbers ints, names must match
      their pattern; anything else raises :class:`~tcc.errors.UsageError` (a
      ``ValueError``) naming the argument.
    * **Integrity.**  Bytes that fail verification are never returned: a
      damaged or missing record raises :class:`~tcc.errors.StoreCorruptError`
      naming it (exceptions: :meth:`snapshots`, :meth:`list_runs` with
      ``damaged``, :meth:`latest_good_snapshot`).  A run whose record is gone
      while its other records remain is reported as damaged, not unknown.
    * **Threads and processes.**  A store object may be used from several
      threads at once, and several processes may open one store.  A store
      object does not cross ``os.fork()``: in the child it raises
      :class:`~tcc.errors.StoreError`; the child opens the store again.
    * Any other failure of the backend (disk full, store full) raises a
      :class:`~tcc.errors.StoreError` subclass; a failed commit changes nothing.
    """

    @property
    def path(self) -> str:
        """Where the store lives (a directory, a database URL, ...)."""
        ...

    @property
    def tenant(self) -> str:
        """The tenant every call is scoped to."""
        ...

    @property
    def intents_durable(self) -> bool:
        """Is an intent as durable as the store's other writes?

        False where an intent's commit is made durable by the run's next commit instead
        (one flush per step, not two): a crash of the machine (or database server)
        between the two can then lose the intent of the call in flight while every
        commit before it survives, and the runtime treats the first call a resumed run
        makes afresh as in doubt (asks its ``verify`` probe), since the journal cannot
        say whether that call started.  A process crash never loses an intent.  True in
        durability ``none``, where no write waits for a flush and a machine crash may
        lose the last commits of any kind (the probe rule cannot repair that).
        """
        ...

    # runs ------------------------------------------------------------------
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
        """Create a run owned by this process: epoch 1, status ``running``, lease
        ``lease`` seconds from now, and a ``created`` event, in one transaction.

        ``status`` (one of :data:`CREATE_STATUSES`): ``queued`` (``tcc submit``) or
        ``importing`` (``tcc import``) instead create it with no lease: a queued run for a
        worker to start (workers are told at once where the store can: PostgreSQL's
        NOTIFY), an importing one for nothing to resume until its creator sets its status.
        ``spawned_by``: the run whose ``tcc.spawn`` created this one; when this run
        finishes, that run is made due (its worker looks at it).  ``info``: more data for
        the ``created`` event (JSON-able; it may not replace ``entry``, ``epoch`` or
        ``status``), written in the same transaction.

        ``run_id`` (default: a new random id) must be new: StoreError if the
        tenant has a run of that id, StoreCorruptError if records of a run of
        that id remain without its run record.  A new id may not start with
        "-" (UsageError).  ``keep``: how many newest snapshots retention keeps
        for this run (default: the store's).  Not idempotent: creating the same
        id twice raises StoreError.
        """
        ...

    def get_run(self, run_id: str) -> RunInfo:
        """The run, or RunNotFoundError (also for another tenant's run)."""
        ...

    def list_runs(self, status: str | None = None, *,
                  damaged: list[tuple[str, str]] | None = None) -> list[RunInfo]:
        """All runs of this tenant ordered by run id, optionally only those with ``status``.

        A damaged run record raises StoreCorruptError, or, if ``damaged`` is
        a list, is reported there as ``(run id, message)`` and skipped.
        """
        ...

    def claim_run(self, run_id: str, *, lease: float = 30.0, steal: bool = False,
                  expect_epoch: int | None = None) -> RunInfo:
        """Make this process the run's owner: epoch + 1, so every older writer is fenced.

        In one transaction: refused with FencedError if the run's status is
        final (:data:`FINAL_STATUSES`), or while another owner's lease runs
        and that owner is alive (an owner on this :data:`HOST` whose pid is
        gone counts as dead), unless ``steal``.  Records a ``taken_over`` event
        (``reclaimed`` if this process owned it).  Each call moves the epoch
        on: use the returned epoch for the run's writes.

        ``expect_epoch``: a hand-over from the process that claimed the run at that
        epoch (a worker to the ``tcc resume`` it started): taken whoever owns it, but
        FencedError unless the run is still at that epoch.
        """
        ...

    def cancel_run(self, run_id: str, *, reason: str | None = None) -> RunInfo:
        """Set the status to ``cancelled`` and the epoch + 1 in one transaction, with a
        ``cancelled`` event naming ``reason``.

        A live owner's next fenced write raises FencedError ("was cancelled").
        FencedError if the run is already final (:data:`FINAL_STATUSES`), so a
        second cancel raises.
        """
        ...

    def renew_lease(self, run_id: str, epoch: int, lease: float = 30.0) -> RunInfo:
        """Fenced: extend this owner's lease to ``lease`` seconds from now (0: anyone may
        claim the run at once) and set ``updated`` to now.  Records no event."""
        ...

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
        """Fenced: change the status (one of :data:`RUN_STATUSES`, else ValueError),
        record ``result``/``error`` if given, and add an event named after the
        status, in one transaction.  After a final status every fenced write
        of the run raises FencedError.  ``wake``: for ``sleeping``, when the run is due
        (the PostgreSQL store hands it to a worker then)."""
        ...

    def fork_run(
        self, run_id: str, number: int | None = None, *, new_run_id: str | None = None
    ) -> RunInfo:
        """A new run (epoch 1, owned by this process) that starts from snapshot
        ``number`` (default: the newest) of ``run_id``, in one transaction.

        The new run gets a copy of the journal the snapshot reflects and the
        snapshot itself; the source snapshot is pinned (kept past retention)
        while the fork exists.  ``created`` and ``forked`` events record it.
        StoreError if the source has no such snapshot or ``new_run_id`` exists.
        Not fenced: the source run is only read.
        """
        ...

    def delete_run(self, run_id: str) -> None:
        """Delete the run with its journal, snapshots, signals and pins in one
        transaction; its events stay (with a ``deleted`` event) as an audit trail.
        Not fenced: stop the run's owner first (:meth:`cancel_run`)."""
        ...

    # journal ---------------------------------------------------------------
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
        """Fenced: journal that effect ``name`` is about to run; return its sequence
        number (a run's journal is numbered 0, 1, 2, ... without gaps).

        Not idempotent: each call appends a record.  ``idempotency_key`` is
        kept for the effect's own use; the store does not deduplicate by it.
        StoreCorruptError if the journal lost records at its end.
        """
        ...

    def append_completion(
        self, run_id: str, epoch: int, completion: Completion, *, consume_signal: str | None = None
    ) -> int:
        """Fenced: journal an effect's outcome without a snapshot; return its sequence number.

        ``completion.intent_seq`` must name an intent of this run that has no
        completion yet (else UsageError): an outcome is journaled once.
        ``consume_signal`` is consumed in the same transaction (FencedError if
        it is no longer pending).
        """
        ...

    def journal(self, run_id: str, start: int = 0) -> list[JournalRecord]:
        """The run's journal records with ``seq >= start``, in order, each verified."""
        ...

    # snapshots -------------------------------------------------------------
    def checkpoint(
        self,
        run_id: str,
        epoch: int,
        payload: bytes | tuple[bytes | memoryview, ...],
        *,
        completion: Completion | None = None,
        consume_signal: str | None = None,
    ) -> SnapshotInfo:
        """Fenced, in ONE transaction: journal ``completion`` (if any, with the rules
        of :meth:`append_completion`), consume ``consume_signal`` (if given;
        FencedError if it is no longer pending), store ``payload`` as the run's
        next snapshot and apply retention (the newest ``keep`` snapshots and
        those pinned by forks stay).

        After any crash the newest snapshot and the journal agree: the
        returned ``journal_len`` is how many journal records the snapshot
        reflects, and only intents can follow it.  Pass the payload
        uncompressed: a backend may store what did not change only once.
        The payload may be given as a tuple of bytes-like pieces whose
        concatenation it is (``tcc.capture.dump_stored`` returns one when large
        buffers went out of band); :meth:`load_snapshot` returns it whole.  A
        piece that is the very ``bytes`` object of the run's previous
        checkpoint in this process need not be read again.
        """
        ...

    def snapshots(self, run_id: str) -> list[SnapshotInfo]:
        """The run's stored snapshots, oldest first.  A snapshot that fails
        verification (or that damage lost) is listed with ``damaged=True``,
        never dropped silently."""
        ...

    def load_snapshot(self, run_id: str, number: int | None = None) -> bytes:
        """The verified payload of snapshot ``number`` (default: the newest).

        StoreError if the run has no (such) snapshot; StoreCorruptError, naming
        the run and snapshot, if any part fails verification.
        """
        ...

    def latest_good_snapshot(self, run_id: str) -> tuple[SnapshotInfo, bytes] | None:
        """The newest snapshot that verifies, with its payload (None if none does).

        Each damaged or lost snapshot passed over is recorded as a
        ``snapshot_corrupt`` event, a fallback as a ``fell_back`` event, and
        lost ones stop being counted as the run's, so that it can checkpoint
        again.
        """
        ...

    # signals and events ----------------------------------------------------
    def send_signal(self, run_id: str, name: str, value: bytes = b"") -> bool:
        """Deliver signal ``name`` with ``value``; False (and nothing written) if that
        name was ever delivered to the run before, even if it was consumed since:
        a retried sender cannot deliver twice.  Not fenced."""
        ...

    def take_signal(self, run_id: str, epoch: int, name: str) -> bytes | None:
        """Fenced: consume a pending signal and return its value (None if none is
        pending).  A value is handed out at most once, across crashes and
        takeovers."""
        ...

    def pending_signals(self, run_id: str) -> list[str]:
        """Names of signals delivered to the run and not consumed yet."""
        ...

    def peek_signal(self, run_id: str, name: str) -> bytes | None:
        """The value of a pending signal, without consuming it (None if not pending)."""
        ...

    def signal_state(self, run_id: str, name: str) -> str | None:
        """"pending", "consumed" or None (never delivered)."""
        ...

    def add_event(self, run_id: str, kind: str, data: Mapping[str, Any] | None = None, *,
                  epoch: int | None = None, deferred: bool = False) -> None:
        """Append an event (``data`` JSON-able) to the run's audit trail; fenced like
        every write of the owner if ``epoch`` is given.

        ``deferred`` (needs ``epoch``): the event may wait for the owner's next write
        (its step's commit, a park) instead of costing a durable commit of its own; it
        is then fenced by ``epoch`` when written, and lost if the process dies first.
        For events a later crash makes redundant (``resumed``, ``in_doubt_*``).  Both
        stores write it with the handle's next write (LMDB in its transaction, PostgreSQL in
        its statement), or when the handle closes; a store may also write it at once."""
        ...

    def events(self, run_id: str) -> list[Event]:
        """The run's audit trail, oldest first; kept after :meth:`delete_run`."""
        ...

    # code ------------------------------------------------------------------
    def put_code(self, sources: Mapping[str, bytes]) -> None:
        """Store module sources, ``{SHA-256 hex digest: source bytes}``, for ``tcc resume
        --code pinned``.  Content-addressed: a source already stored (by any run of this
        tenant) is not written again.  UsageError if a source does not hash to its key."""
        ...

    def get_code(self, digest: str) -> bytes:
        """The source stored under ``digest``, checked against it; StoreError if this
        store holds none."""
        ...

    # housekeeping ----------------------------------------------------------
    def gc(self) -> GcStats:
        """Apply retention to every run of this tenant and delete stored payload data
        no snapshot (of any tenant) references, in one transaction.

        A damaged run is left as it is, and while any snapshot fails
        verification nothing it might reference is deleted: each case is
        reported with a :class:`StoreDamageWarning`.
        """
        ...

    def compact(self) -> GcStats:
        """Give the space gc freed back to the file system, reporting the store's size
        before and after (equal where there is nothing to give back).

        May need the store to itself: StoreError if another process has it
        open.  Run :meth:`gc` first.
        """
        ...

    def journal_length(self, run_id: str) -> int:
        """How many journal records the run has, without reading them: ``journal(run_id,
        journal_length(run_id) - n)`` reads only the last n."""
        ...

    def close(self) -> None:
        """Release the store (idempotent); later calls raise StoreError."""
        ...

    def __enter__(self) -> Any:
        """The store itself (``with open_store(...) as store:``)."""
        ...

    def __exit__(self, *exc: object) -> None:
        """:meth:`close`."""
        ...
