"""The store interface the runtime talks to, and the plain records it returns.

Nothing here knows about LMDB: a second backend (PostgreSQL, say) implements
:class:`Store` and returns the same frozen dataclasses.

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
from collections.abc import Mapping
from typing import Any, Literal, Protocol, runtime_checkable

__all__ = [
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
]

RunStatus = Literal["running", "waiting", "sleeping", "completed", "unverified", "failed", "cancelled"]
RUN_STATUSES: tuple[str, ...] = (
    "running",
    "waiting",
    "sleeping",
    "completed",
    "unverified",  # finished, but its verify check did not pass
    "failed",
    "cancelled",
)
Durability = Literal["sync", "group", "none"]


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
    """What :meth:`Store.gc` or :meth:`Store.compact` did."""

    snapshots_deleted: int = 0
    chunks_deleted: int = 0
    refs_repaired: int = 0
    bytes_before: int = 0
    bytes_after: int = 0


@runtime_checkable
class Store(Protocol):
    """Durable runs, journal, snapshots, signals and events for one tenant.

    Every write that belongs to a run takes the writer's ``epoch``; if the run
    has been claimed by someone else since (a higher epoch), the write raises
    :class:`~tcc.errors.FencedError` and stores nothing.
    """

    @property
    def path(self) -> str:
        """Where the store lives."""
        ...

    @property
    def tenant(self) -> str:
        """The tenant every call is scoped to."""
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
    ) -> RunInfo:
        """Create a run owned by this process (epoch 1, status running).

        ``keep``: how many newest snapshots retention keeps for this run (default:
        the store's ``keep``)."""
        ...

    def get_run(self, run_id: str) -> RunInfo:
        """Return the run or raise RunNotFoundError."""
        ...

    def list_runs(self, status: str | None = None, *,
                  damaged: list[tuple[str, str]] | None = None) -> list[RunInfo]:
        """All runs of this tenant, optionally only those with ``status``.

        A damaged run record raises StoreCorruptError, or, if ``damaged`` is
        a list, is reported there as ``(run id, message)`` and skipped.
        """
        ...

    def claim_run(self, run_id: str, *, lease: float = 30.0, steal: bool = False) -> RunInfo:
        """Take ownership of a run, incrementing its epoch (fences the old owner)."""
        ...

    def cancel_run(self, run_id: str, *, reason: str | None = None) -> RunInfo:
        """Cancel a run that has not completed (epoch + 1: a live owner is fenced)."""
        ...

    def renew_lease(self, run_id: str, epoch: int, lease: float = 30.0) -> RunInfo:
        """Extend this owner's lease."""
        ...

    def set_status(
        self,
        run_id: str,
        epoch: int,
        status: str,
        *,
        result: bytes | None = None,
        error: bytes | None = None,
    ) -> RunInfo:
        """Change a run's status (and record its result or error)."""
        ...

    def fork_run(
        self, run_id: str, number: int | None = None, *, new_run_id: str | None = None
    ) -> RunInfo:
        """Start a new run from a snapshot of another (which is then pinned)."""
        ...

    def delete_run(self, run_id: str) -> None:
        """Delete a run with its journal, snapshots and signals."""
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
        """Journal that an effect is about to run; return its sequence number."""
        ...

    def append_completion(
        self, run_id: str, epoch: int, completion: Completion, *, consume_signal: str | None = None
    ) -> int:
        """Journal an effect's outcome without a snapshot (consuming a signal atomically)."""
        ...

    def journal(self, run_id: str, start: int = 0) -> list[JournalRecord]:
        """The run's journal from ``start`` on, in order."""
        ...

    # snapshots -------------------------------------------------------------
    def checkpoint(
        self,
        run_id: str,
        epoch: int,
        payload: bytes,
        *,
        completion: Completion | None = None,
        consume_signal: str | None = None,
    ) -> SnapshotInfo:
        """Atomically journal ``completion`` (if any), consume ``consume_signal``
        (if given; FencedError if it is no longer pending) and store a snapshot."""
        ...

    def snapshots(self, run_id: str) -> list[SnapshotInfo]:
        """Retained snapshots of the run, oldest first; records that fail
        verification are listed with ``damaged=True``, never dropped silently."""
        ...

    def load_snapshot(self, run_id: str, number: int | None = None) -> bytes:
        """The verified payload of one snapshot (default: the newest)."""
        ...

    def latest_good_snapshot(self, run_id: str) -> tuple[SnapshotInfo, bytes] | None:
        """The newest snapshot that verifies, recording an event for each bad one."""
        ...

    # signals and events ----------------------------------------------------
    def send_signal(self, run_id: str, name: str, value: bytes = b"") -> bool:
        """Deliver a named signal; False if that name was already delivered."""
        ...

    def take_signal(self, run_id: str, epoch: int, name: str) -> bytes | None:
        """Consume a pending signal exactly once (None if none is pending)."""
        ...

    def pending_signals(self, run_id: str) -> list[str]:
        """Names of signals delivered but not yet consumed."""
        ...

    def peek_signal(self, run_id: str, name: str) -> bytes | None:
        """The value of a pending signal, without consuming it."""
        ...

    def signal_state(self, run_id: str, name: str) -> str | None:
        """"pending", "consumed" or None (never delivered)."""
        ...

    def add_event(self, run_id: str, kind: str, data: Mapping[str, Any] | None = None, *,
                  epoch: int | None = None) -> None:
        """Append a lifecycle event to the run's audit trail (fenced by ``epoch`` if given)."""
        ...

    def events(self, run_id: str) -> list[Event]:
        """The run's audit trail, oldest first."""
        ...

    # housekeeping ----------------------------------------------------------
    def gc(self) -> GcStats:
        """Apply retention and delete chunks no snapshot references."""
        ...

    def compact(self) -> GcStats:
        """Rewrite the store file without free space (needs exclusive access)."""
        ...

    def close(self) -> None:
        """Release the store; later calls raise StoreError."""
        ...
