"""What every store function works with: one handle's tenant, environment and caches.

:class:`~tcc.store.LmdbStore` holds one :class:`Scope` and hands it to the
function modules (``_runs``, ``_journal``, ``_snapshots``, ``_signals``,
``_events``, ``_retention``), which read and write through ``scope.read`` and
``scope.write`` closures.  The caches here only save work: each entry is
keyed by the exact bytes it was verified from, or by what this handle itself
committed, and is checked again before it is trusted.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import StoreCorruptError, StoreError
from ._chunkrefs import HeldCache
from ._codec import check_int, check_name, prefix
from ._crypt import StoreKey, resolve_key
from ._env import EnvHandle, acquire
from ._events import Deferred, append_deferred
from ._inflight import InflightLog, sweep

if TYPE_CHECKING:
    from ._journal import OpenIntents
    from ._snapshots import RunMemo

__all__ = ["Scope"]

T = TypeVar("T")


class Scope:
    """One open store handle: its tenant, the shared environment, and its caches."""

    def __init__(
        self,
        path: str,
        *,
        tenant: str,
        durability: str,
        create: bool,
        keep: int,
        map_size: int | None,
        max_map_size: int | None,
        key: bytes | str | StoreKey | None,
        sync_intents: bool = False,
    ) -> None:
        self.tenant_key = check_name("tenant", tenant)
        check_int("keep", keep, 1)
        for what, size in (("map_size", map_size), ("max_map_size", max_map_size)):
            if size is not None:
                check_int(what, size, 64 << 10)
        self.keep = keep  # the store's snapshot retention (a run's own "keep" overrides it)
        # the store key: ``key``, else $TCC_STORE_KEY_FILE or $TCC_STORE_KEY (None: no encryption)
        self.env: EnvHandle = acquire(path, create=create, durability=durability, map_size=map_size,
                                      max_map_size=max_map_size, store_key=resolve_key(key))
        self.sealer = self.env.sealer
        self.held = HeldCache(self.sealer)  # what each snapshot record references
        # run key -> (record bytes, header, blobs) of the last run record verified
        self.runs_seen: dict[bytes, tuple[bytes, dict[str, Any], dict[str, bytes]]] = {}
        # db + head key -> (record bytes, value) of head records verified or written
        self.heads_seen: dict[bytes, tuple[bytes, Any]] = {}
        # in-flight file of a process that is gone -> ((device, inode, size, mtime), its
        # entries): read once per handle (``_inflight._entries``)
        self.inflight_seen: dict[str, tuple[tuple[int, int, int, int], tuple[tuple[bytes, int, bytes], ...]]] = {}
        self.closed = False
        self.memo_lock = threading.Lock()  # guards memos and intents
        self.memos: dict[bytes, RunMemo] = {}  # run id -> its last checkpoint here
        self.intents: dict[bytes, OpenIntents] = {}  # run id -> its intents journaled here
        # sync durability: intents go to this process's in-flight file, and into the
        # journal with the next commit (``_inflight``); None: each intent is a commit
        self.inflight = InflightLog(self.env.path) if durability == "sync" and not sync_intents else None
        if self.inflight is not None:
            sweep(self)  # the files of processes that are gone (each leaves one behind)
        # events added with ``deferred=True``, written first by this handle's next write
        # transaction
        self.deferred: list[Deferred] = []

    @property
    def path(self) -> str:
        """Absolute path of the store directory."""
        return self.env.path

    @property
    def tenant(self) -> str:
        """The tenant every call is scoped to."""
        return self.tenant_key.decode()

    @property
    def dbs(self) -> dict[str, Any]:
        """The environment's databases by name (reopened by a compaction)."""
        return self.env.dbs

    def read(self, fn: Callable[[Any], T]) -> T:
        """``fn(txn)`` in a read transaction; StoreError once the handle is closed."""
        if self.closed:
            raise StoreError(f"store {self.path} is closed")
        return self.env.read(fn)

    def write(self, fn: Callable[[Any], T]) -> T:
        """``fn(txn)`` in a write transaction, committed durably (per the durability
        mode); StoreError once the handle is closed.  ``fn`` may run more than
        once (after a map resize, or in a group batch redone without a failed
        closure), so it only reads and writes through ``txn``."""
        if self.closed:
            raise StoreError(f"store {self.path} is closed")
        log = self.inflight
        intents = log is not None and bool(log.pending)
        if not intents and not self.deferred:
            return self.env.write(fn)
        folded: list[Any] = []
        taken: list[Deferred] = []

        def op(txn: Any) -> T:
            # the intents this handle wrote in flight go first, under this commit's fsync,
            # then the events deferred to it, each still fenced by its writer's epoch.
            # Taken under the write lock (a heartbeat's commit or a group batch must not
            # write them twice); a transaction run again writes what it took again.
            if intents:
                assert log is not None
                folded[:] = log.fold(self, txn)
            with self.memo_lock:
                taken.extend(self.deferred)
                self.deferred.clear()
            if taken:
                append_deferred(self, txn, taken)
            return fn(txn)

        try:
            result = self.env.write(op)
        except BaseException:
            if taken:  # not committed: they wait for the next one
                with self.memo_lock:
                    self.deferred[:0] = taken
            raise
        if log is not None:
            log.committed(folded)
        return result

    def check_run_id(self, run_id: str, *, new: bool = False) -> bytes:
        """The key form of ``run_id``; ``new``: an id for a run being created (stricter)."""
        return check_name("run id", run_id, new=new)

    def run_prefix(self, rid: bytes) -> bytes:
        """The key prefix of everything run ``rid`` owns in a per-run database."""
        return prefix(self.tenant_key, rid)

    def corrupt(self, what: str, why: object) -> StoreCorruptError:
        """The error for ``what``, which failed verification because of ``why``."""
        return StoreCorruptError(
            f"store {self.path}: {what} failed verification ({why}); it was not returned. "
            "Fall back with latest_good_snapshot() or restore a backup")

    def missing(self, what: str) -> StoreCorruptError:
        """The error for ``what``, which its head record (or index) says should be there."""
        return StoreCorruptError(
            f"store {self.path}: {what} is missing (damage lost it or moved it to another "
            "key); restore the store from a backup")
