"""``PgStore``: the :class:`~tcc.store.Store` interface on a PostgreSQL database.

Chosen by URL (``postgresql://USER@HOST:PORT/DB`` or ``postgres://...``).  Many
hosts can share one database; the rules a single machine's LMDB store keeps
with its write lock are kept here by the database (see ``_pgschema``): the
epoch fence is a conditional ``UPDATE`` of the run row, "each intent is
answered once" and "a signal is consumed once" are unique constraints, and
leases are computed and compared with the server's clock.

**Keys.**  A snapshot is a pickle, and a pickle is code, so whoever can write
the database must not be able to make a worker run code.  Every row's
``record`` is sealed (``_codec.Sealer``: MAC, and AES-GCM encryption) with
keys derived from a *store key* that the database never sees: a 32-byte key
in a key file (``tcc init --store URL --key-file PATH`` makes one, mode 0600)
given to every process with ``--key-file`` or ``$TCC_STORE_KEY_FILE``.  The
database keeps only a check value, so a wrong key is refused at open, and a
record sealed with another key fails its MAC and is never unpickled.  Chunks
are addressed by a keyed hash of their content, so the snapshot record's MAC
covers them too.

**A step is two round trips and one WAL flush**: the intent
(``tcc.append_intent``, fenced, before the effect runs) and the step's commit.
:meth:`PgStore.checkpoint` cuts the payload by content (``_chunks``), sends only
the chunks the run's previous snapshot does not already reference, and calls
``tcc.commit_step`` once: fence, completion, consumed signal, chunks, snapshot
and retention commit together or not at all, and wait for their WAL flush.  The
intent does not wait for its own (``synchronous_commit`` off for that
transaction): a crashed *client* never loses it (the server has it), and the
step's commit, later in the same log, flushes it.  Only a crash of the *server*
between the two can lose it, together with the fact that the call started: a
resumed run therefore treats the first call it makes afresh as in doubt and asks
its ``verify`` probe (``intents_durable`` is False).  ``sync_intents=True``
makes an intent wait for its own flush (two flushes per step).  The caller
seals each record for the journal position and snapshot number it expects; the
function refuses (``TC002``) if the run moved, and the handle re-reads and
retries once.

**Connections.**  A ``psycopg_pool`` pool of autocommit connections.  A lost
connection is a :class:`~tcc.errors.StoreConnectionError`: reads are retried
once on a new connection; a write is not retried (it may have committed): the
error says that whether it committed is unknown, and the run resumes from what
the store has.  Opening a store that cannot be reached fails within a second
with libpq's reason.

Differences from the LMDB store: chunks no snapshot references any more are
deleted by :meth:`gc` only (LMDB frees them in the checkpoint that drops their
last snapshot); the event order is the database's insertion order; and
``compact`` is ``VACUUM FULL`` of tcc's tables.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

from .._proc import pid_alive
from ..errors import (
    FencedError,
    RunNotFoundError,
    StoreConnectionError,
    StoreCorruptError,
    StoreError,
    StoreNotFoundError,
    UsageError,
)
from ._api import (DURABILITIES, FINAL_STATUSES, FINISHED_STATUSES, HOST, RUN_STATUSES, Completion, Event,
                   GcStats, JournalRecord)
from ._api import RunInfo, SnapshotInfo, StoreDamageWarning
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
from . import _code
from ._codec import Corrupt, Sealer, as_bytes, check_int, check_name, created_event, seq_key
from ._crypt import Crypt, StoreKey, key_id
from ._pgschema import CHUNK_LOCK, MIGRATE_LOCK, MIGRATIONS, SCHEMA_VERSION, WORK_CHANNEL
from ._pgurl import is_postgres_url, redact

__all__ = ["PgStore", "WrongKeyError", "is_postgres_url", "redact"]

T = TypeVar("T")
_S = TypeVar("_S", bound="PgStore")
_CHECK_LABEL = b"tcc postgresql store"
_INSTALL = ("the PostgreSQL store needs psycopg 3 and psycopg-pool: "
            "pip install 'tcc[postgres]'")


def _psycopg() -> Any:
    try:
        import psycopg
        import psycopg_pool  # noqa: F401  (checked here: the pool is needed too)
    except ImportError:
        raise StoreError(_INSTALL) from None
    _quiet_pool_log()
    return psycopg


_pool_log_quieted = False
# The events a handle deferred (``add_event(deferred=True)``), written by its next write in
# the same statement, in order, each only if its run is still at its writer's epoch (else
# void, as a fenced write): parameters (run ids, epochs, sealed records, tenant).  The epoch
# is the statement's snapshot's: for the run the statement writes, its fence waits for a
# takeover committing at the same time and then fails the whole statement; an event of
# another run of the handle (a worker's) is not locked, so a takeover of that run committing
# at the same instant does not void it.  (A row lock cannot be taken here: the run row the
# same statement updates would be skipped as modified by it.)
_DEFERRED_EVENTS = (
    "WITH deferred_events AS (INSERT INTO tcc.events (tenant, run_id, record) "
    "SELECT r.tenant, r.run_id, d.record FROM unnest(%s::text[], %s::bigint[], %s::bytea[]) "
    "WITH ORDINALITY AS d(run_id, epoch, record, n) JOIN tcc.runs r ON r.tenant = %s "
    "AND r.run_id = d.run_id AND r.epoch = d.epoch ORDER BY d.n) ")


def _quiet_pool_log() -> None:
    """Keep the pool's warnings ("discarding closed connection", "error connecting") off
    stderr unless the application configures logging: a lost connection is reported once,
    as a StoreConnectionError (``logging.lastResort`` would print them as extra lines)."""
    global _pool_log_quieted
    if not _pool_log_quieted:
        import logging

        logging.getLogger("psycopg.pool").addHandler(logging.NullHandler())
        _pool_log_quieted = True


def sealer_for(key: StoreKey) -> Sealer:
    """The sealer of a PostgreSQL store keyed by ``key``: a MAC secret and an
    encryption key, each derived from the store key for its one purpose."""
    import hashlib

    def derive(purpose: bytes) -> bytes:
        return hashlib.blake2b(key.key, key=b"tcc postgresql store", digest_size=32,
                               person=purpose).digest()

    return Sealer(derive(b"tcc-pg-mac"), "blake3", Crypt(derive(b"tcc-pg-data")))


class WrongKeyError(StoreError):
    """The store key given is not the key the store was created with (nothing was read)."""


class _Moved(Exception):
    """Internal: the run's journal or snapshot count is not what the handle expected."""


class _Memo:
    """What this handle knows of one run it writes: counts and its last snapshot."""

    __slots__ = ("jlen", "made", "base", "known", "split", "nodes")

    def __init__(self) -> None:
        self.jlen: int | None = None  # journal length
        self.made: int | None = None  # snapshots made (the newest's number)
        self.base: int | None = None  # the snapshot whose chunks ``known`` lists
        self.known: set[bytes] = set()  # addresses it references (stored, while it exists)
        self.split = SplitMemo()
        self.nodes: dict[bytes, bytes] = {}


class PgStore:
    """Runs, journal, snapshots, signals and events of one tenant, in PostgreSQL.

    Thread-safe; any number of processes on any number of hosts may open the
    same database.  Create it with :func:`tcc.store.open_store` (a URL) after
    ``tcc init --store URL --key-file PATH``.
    """

    def __init__(
        self,
        url: str,
        *,
        tenant: str = "default",
        durability: str = "sync",
        create: bool = True,
        keep: int = 3,
        key: StoreKey | None = None,
        pool_size: int = 4,
        sync_intents: bool = False,
    ) -> None:
        if not is_postgres_url(url):
            raise UsageError(f"not a PostgreSQL URL: {url!r} (postgresql://USER@HOST:PORT/DB)")
        self.tenant_key = check_name("tenant", tenant)
        check_int("keep", keep, 1)
        if durability not in DURABILITIES:
            raise UsageError(f"durability must be {', '.join(map(repr, DURABILITIES[:-1]))} or "
                             f"{DURABILITIES[-1]!r}, not {durability!r}")
        if key is None:
            raise UsageError(
                f"the PostgreSQL store {redact(url)} needs its key: give --key-file PATH or "
                "$TCC_STORE_KEY_FILE (`tcc init --store URL --key-file PATH` creates the file)")
        self.url = url
        self.keep = keep
        # an intent's commit is flushed by the step's commit that follows it (see
        # _pgschema.append_intent); True waits for its own flush (a second per step)
        self._sync_intents = bool(sync_intents)
        self._durability = durability
        self._key = key
        self._pid = os.getpid()
        self._closed = False
        self._lock = threading.Lock()
        self._memos: dict[bytes, _Memo] = {}
        # (run id, writer's epoch, sealed record) of each deferred event, oldest first
        self._deferred: list[tuple[str, int, bytes]] = []
        self._deferred_lock = threading.Lock()
        self._run_locks: dict[bytes, threading.Lock] = {}
        psycopg = _psycopg()
        self._errors = psycopg.errors
        self._OperationalError = psycopg.OperationalError
        self._Error = psycopg.Error
        from psycopg_pool import ConnectionPool

        def configure(conn: Any) -> None:
            if durability == "none":
                conn.execute("SET synchronous_commit TO off")
            else:  # a database or role that turned it off must not make `sync` wait for nothing
                conn.execute("SELECT set_config('synchronous_commit', 'on', false) "
                             "WHERE current_setting('synchronous_commit') = 'off'")

        self._pool = ConnectionPool(
            url, min_size=1, max_size=max(1, pool_size), open=False, timeout=15.0,
            kwargs={"autocommit": True, "application_name": "tcc", "connect_timeout": 10},
            configure=configure, name="tcc")
        self._pool.open(wait=False)  # its first connection checks the schema, then serves
        try:
            self.sealer = sealer_for(key)  # (imports the cipher while the pool connects)
            self._open_schema(psycopg, create)
        except BaseException:
            self._pool.close()
            raise

    # ------------------------------------------------------------- properties
    @property
    def path(self) -> str:
        """The database URL, without its password."""
        return redact(self.url)

    @property
    def tenant(self) -> str:
        return self.tenant_key.decode()

    @property
    def durability(self) -> str:
        return self._durability

    @property
    def intents_durable(self) -> bool:
        """False unless opened with ``sync_intents=True``: an intent's commit does not wait
        for its WAL flush, and the step's commit that follows it flushes both (see the
        module docstring).  True with durability ``none``, where no commit waits."""
        return self._sync_intents or self._durability == "none"

    @property
    def encrypted(self) -> bool:
        return True

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<PgStore {self.path!r} tenant={self.tenant!r} durability={self._durability!r}>"

    def close(self) -> None:
        if not self._closed:
            try:
                if self._deferred and os.getpid() == self._pid:
                    try:  # events deferred to a write that never came: one now
                        self._tx(lambda _conn: None, "writing deferred events", transaction=False)
                    except Exception:  # noqa: BLE001 -- fenced ones are void anyway; a lost
                        pass  # server loses them, as a crash would; closing must go on
            finally:
                self._closed = True
                if os.getpid() == self._pid:
                    self._pool.close()

    # ------------------------------------------------------- deferred events
    def _take_deferred(self) -> list[tuple[str, int, bytes]]:
        with self._deferred_lock:
            taken, self._deferred = self._deferred, []
        return taken

    def _give_back(self, taken: list[tuple[str, int, bytes]], exc: BaseException,
                   conn: Any | None) -> None:
        """Events taken for a statement that failed: they wait for the next write when the
        failure certainly rolled it back (the server refused it, or the code around it
        raised before it ran); when whether it committed is unknown (a connection lost, an
        interrupt) they are dropped, as a crash drops them, rather than written twice."""
        unknown = not isinstance(exc, Exception) or (
            isinstance(exc, self._OperationalError) and (conn is None or conn.broken))
        if taken and not unknown:
            with self._deferred_lock:
                self._deferred[:0] = taken

    def _folded(self, sql: str, params: tuple[Any, ...],
                taken: list[tuple[str, int, bytes]]) -> tuple[str, tuple[Any, ...]]:
        """``sql`` (one statement, without a WITH of its own) with ``taken`` deferred
        events written by it too."""
        if not taken:
            return sql, params
        assert sql.lstrip()[:4].upper() != "WITH", sql
        runs, epochs, records = (list(column) for column in zip(*taken))
        return _DEFERRED_EVENTS + sql, (runs, epochs, records, self.tenant, *params)

    def _write(self, conn: Any, sql: str, params: tuple[Any, ...]) -> Any:
        """Execute one writing statement of this handle, the events deferred to it folded
        into it: no round trip and no commit of their own (see :meth:`_give_back` for what
        a failure does with them)."""
        taken = self._take_deferred()
        sql, params = self._folded(sql, params, taken)
        try:
            return conn.execute(sql, params)
        except BaseException as exc:
            self._give_back(taken, exc, conn)
            raise

    # ------------------------------------------------------------ connection
    def _open_schema(self, psycopg: Any, create: bool) -> None:
        """Check (or create) the schema and the key, on the pool's first connection."""
        from psycopg_pool import PoolTimeout

        for attempt in (1, 2):
            try:
                with self._pool.connection(timeout=1.0) as conn:
                    self._check_schema(psycopg, conn, create)
                    return
            except PoolTimeout:
                break
            except psycopg.OperationalError as exc:
                # a server that went away under the check (a read, or a migration in one
                # transaction) gets one more try on a new connection, as _read gives
                if attempt == 2 or not conn.broken:
                    raise self._open_failed(exc, conn.broken) from None
        # No pooled connection within a second: the pool only retries quietly, so connect
        # here, which fails at once with libpq's reason (a slow server still gets its 10 s).
        try:
            conn = psycopg.connect(self.url, autocommit=True, connect_timeout=10,
                                   application_name="tcc")
        except psycopg.Error as exc:
            # The server saying no (a wrong password, no such database or role: libpq's
            # "FATAL:" at connection start, with no SQLSTATE) is no outage, which a worker
            # would wait out; no answer, or a server starting up, shutting down or full, is.
            text = str(exc)
            refused = "FATAL:" in text and not any(
                busy in text for busy in ("the database system is", "too many clients",
                                          "too many connections", "remaining connection slots"))
            raise (StoreError if refused else StoreConnectionError)(
                f"cannot connect to the PostgreSQL store {self.path}: {_reason(exc)}") from None
        try:
            self._check_schema(psycopg, conn, create)
        except psycopg.OperationalError as exc:
            raise self._open_failed(exc, conn.broken) from None
        finally:
            conn.close()

    def _open_failed(self, exc: Exception, lost: bool) -> StoreError:
        if lost:
            return StoreConnectionError(
                f"lost the connection to the PostgreSQL store {self.path} while opening it: "
                f"{_reason(exc)}")
        return StoreError(f"PostgreSQL store {self.path}: {_reason(exc)}")

    def _check_schema(self, psycopg: Any, conn: Any, create: bool) -> None:
        try:
            meta = self._read_meta(conn)
            version = int(meta.get("schema_version", "0"))
            if version != SCHEMA_VERSION:
                if version > SCHEMA_VERSION:
                    self._too_new(version)
                if version == 0 and not create:
                    raise StoreNotFoundError(
                        f"no tcc store in {self.path}: create one with `tcc init --store URL "
                        "--key-file PATH`")
                meta = self._migrate(conn)
            self._check_key(meta)
            # the server's clock minus this one: leases are the server's, reported on this clock
            clock = meta.get("_clock")
            self._skew = float(clock) - (self._meta_asked + time.time()) / 2 if clock else 0.0
        except psycopg.OperationalError:
            raise  # the caller retries, or says the connection was lost
        except psycopg.Error as exc:
            raise StoreError(f"PostgreSQL store {self.path}: {_reason(exc)}") from None

    def _read_meta(self, conn: Any) -> dict[str, str]:
        """tcc.meta, and the server's clock as ``_clock`` (one round trip; {} without a schema)."""
        sql = ("SELECT key, value FROM tcc.meta UNION ALL "
               "SELECT '_clock', extract(epoch FROM clock_timestamp())::text")
        self._meta_asked = time.time()
        try:
            if conn.info.transaction_status == 0:  # idle (autocommit): a failure ends only this
                return {k: v for k, v in conn.execute(sql)}
            with conn.transaction():  # inside the migration's transaction: a savepoint
                return {k: v for k, v in conn.execute(sql)}
        except self._errors.UndefinedTable:
            return {}

    def _too_new(self, version: int) -> None:
        raise StoreError(
            f"the PostgreSQL store {self.path} has schema version {version}, newer than this "
            f"tcc understands ({SCHEMA_VERSION}): upgrade tcc")

    def _migrate(self, conn: Any) -> dict[str, str]:
        # The lock is taken before the transaction begins, not inside it: a transaction that
        # began before another process's migration committed can still see no tcc.meta
        # (to_regclass reads the catalog caches, refreshed when a transaction starts), and
        # would create the schema a second time ("relation meta already exists").
        conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATE_LOCK,))
        try:
            with conn.transaction():
                meta = self._read_meta(conn)  # again, under the lock: another process may have won
                version = int(meta.get("schema_version", "0"))
                if version > SCHEMA_VERSION:
                    self._too_new(version)
                for n in range(version, SCHEMA_VERSION):
                    conn.execute(MIGRATIONS[n])
                if version == 0:
                    conn.execute("INSERT INTO tcc.meta VALUES ('key_check', %s), ('key_id', %s)",
                                 (self.sealer.check_tag(_CHECK_LABEL).hex(), key_id(self._key.key)))
                conn.execute("INSERT INTO tcc.meta VALUES ('schema_version', %s) ON CONFLICT (key) "
                             "DO UPDATE SET value = excluded.value", (str(SCHEMA_VERSION),))
                return self._read_meta(conn)
        finally:
            if not conn.broken:
                conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATE_LOCK,))

    def _check_key(self, meta: dict[str, str]) -> None:
        import hmac

        check = meta.get("key_check", "")
        if not hmac.compare_digest(check, self.sealer.check_tag(_CHECK_LABEL).hex()):
            raise WrongKeyError(
                f"the store key from {self._key.source} (key id {key_id(self._key.key)}) is not "
                f"the key of the PostgreSQL store {self.path} (key id {meta.get('key_id', '?')}): "
                "give the key file `tcc init` made for this store; nothing was read")

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"store {self.path} is closed")
        if os.getpid() != self._pid:
            raise StoreError(
                f"store {self.path} was opened in process {self._pid}; a store does not cross "
                "os.fork(): open it again in this process")

    @contextmanager
    def _conn(self) -> Iterator[Any]:
        self._check_open()
        from psycopg_pool import PoolTimeout

        try:
            with self._pool.connection() as conn:
                yield conn
        except PoolTimeout:
            raise StoreConnectionError(
                f"cannot connect to the PostgreSQL store {self.path} (no connection within 15 s; "
                "is the server up?)") from None

    def _read(self, fn: Callable[[Any], T]) -> T:
        """``fn(conn)`` for reads: retried once on a new connection if the old one broke."""
        for attempt in (1, 2):
            try:
                with self._conn() as conn:
                    return fn(conn)
            except self._OperationalError as exc:
                if attempt == 2:
                    raise StoreConnectionError(
                        f"lost the connection to the PostgreSQL store {self.path}: "
                        f"{_reason(exc)}") from None
        raise AssertionError("unreachable")

    def _tx(self, fn: Callable[[Any], T], what: str, *, transaction: bool = True) -> T:
        """``fn(conn)`` in one transaction (``transaction=False``: ``fn`` writes with one
        statement, committed by itself); a lost connection is StoreConnectionError."""
        taken: list[tuple[str, int, bytes]] = []
        conn = None
        try:
            with self._conn() as conn:
                # the events deferred to this write go first (taken once a connection is
                # held): in fn's transaction, or in a statement of their own before fn's
                taken = self._take_deferred()
                if not transaction:
                    if taken:
                        conn.execute(*self._folded("SELECT 1", (), taken))
                        taken = []
                    return fn(conn)
                with conn.transaction():
                    if taken:
                        conn.execute(*self._folded("SELECT 1", (), taken))
                    return fn(conn)
        except BaseException as exc:
            self._give_back(taken, exc, conn)
            if isinstance(exc, self._OperationalError):
                raise StoreConnectionError(
                    f"lost the connection to the PostgreSQL store {self.path} during {what}: "
                    f"{_reason(exc)}; whether it committed is unknown") from None
            raise

    def _memo(self, rid: bytes) -> _Memo:
        with self._lock:
            memo = self._memos.get(rid)
            if memo is None:
                memo = self._memos[rid] = _Memo()
            return memo

    def _run_lock(self, rid: bytes) -> threading.Lock:
        with self._lock:
            lock = self._run_locks.get(rid)
            if lock is None:
                lock = self._run_locks[rid] = threading.Lock()
            return lock

    def _rid(self, run_id: str, *, new: bool = False) -> bytes:
        return check_name("run id", run_id, new=new)

    def _corrupt(self, what: str, why: object) -> StoreCorruptError:
        return StoreCorruptError(
            f"store {self.path}: {what} failed verification ({why}); it was not returned. "
            "Fall back with latest_good_snapshot() or restore a backup")

    def _not_found(self, rid: bytes) -> RunNotFoundError:
        return RunNotFoundError(
            f"no run {rid.decode()!r} for tenant {self.tenant!r} in store {self.path}")

    # ------------------------------------------------------------------- runs
    def _run_key(self, rid: bytes) -> bytes:
        return self.tenant_key + b"\x00" + rid

    _RUN_COLS = ("run_id, status, epoch, owner_host, owner_pid, "
                 "extract(epoch FROM lease_expiry - now())::float8, extract(epoch FROM created)::float8, "
                 "extract(epoch FROM updated)::float8, record, extract(epoch FROM lease_expiry)::float8")

    def _info(self, row: tuple[Any, ...]) -> RunInfo:
        rid = row[0].encode()
        try:
            hdr, blobs = self.sealer.open(b"runs", self._run_key(rid), row[8])
        except Corrupt as exc:
            raise self._corrupt(f"run {row[0]!r} record", exc) from None
        parent = hdr.get("parent")
        return RunInfo(
            run_id=row[0], tenant=self.tenant, entry=hdr["entry"], args=blobs.get("args", b""),
            strategy=hdr["strategy"], status=row[1], created=row[6], updated=row[7],
            epoch=row[2], owner_host=row[3], owner_pid=row[4],
            # the server's expiry on this clock (with the skew measured at open, so that
            # reading an unchanged run twice gives equal RunInfos, as on LMDB)
            lease_expiry=row[9] - self._skew,
            result=blobs.get("result"), error=blobs.get("error"),
            parent=(parent[0], parent[1]) if parent else None)

    def _seal_run(self, rid: bytes, hdr: dict[str, Any], blobs: dict[str, bytes]) -> bytes:
        return self.sealer.seal(b"runs", self._run_key(rid), hdr, blobs)

    def _load_run(self, conn: Any, rid: bytes, *, lock: bool = False) -> tuple[Any, ...]:
        row = conn.execute(
            f"SELECT {self._RUN_COLS}, keep, xmin::text FROM tcc.runs WHERE tenant = %s "
            "AND run_id = %s"
            + (" FOR UPDATE" if lock else ""), (self.tenant, rid.decode())).fetchone()
        if row is None:
            raise self._not_found(rid)
        return tuple(row)

    def _open_run(self, row: tuple[Any, ...]) -> tuple[dict[str, Any], dict[str, bytes]]:
        try:
            return self.sealer.open(b"runs", self._run_key(row[0].encode()), row[8])
        except Corrupt as exc:
            raise self._corrupt(f"run {row[0]!r} record", exc) from None

    def _event_record(self, rid: bytes, kind: str, data: Mapping[str, Any] | None) -> bytes:
        return self.sealer.seal(b"events", self._run_key(rid),
                                {"k": kind, "t": time.time(), "d": dict(data or {})})

    def _event(self, conn: Any, rid: bytes, kind: str, data: Mapping[str, Any] | None) -> None:
        conn.execute("INSERT INTO tcc.events (tenant, run_id, record) VALUES (%s, %s, %s)",
                     (self.tenant, rid.decode(), self._event_record(rid, kind, data)))

    def create_run(self, entry: str, args: bytes = b"", *, strategy: str = "continuation",
                   run_id: str | None = None, lease: float = 30.0,
                   keep: int | None = None, status: str = "running",
                   spawned_by: str | None = None,
                   info: Mapping[str, Any] | None = None) -> RunInfo:
        rid = self._rid(uuid.uuid4().hex if run_id is None else run_id, new=True)
        if keep is not None:
            check_int("keep", keep, 1)
        if not isinstance(entry, str) or not entry:
            raise UsageError(f"entry must be a non-empty string (script[:function]), not {entry!r}")
        _check_lease(lease)
        event = created_event(entry, status, info, spawned_by)
        hdr = {"entry": entry, "strategy": strategy, "parent": None}
        rec = self._seal_run(rid, hdr, {"args": as_bytes("args", args)})
        pe = self._errors

        def op(conn: Any) -> RunInfo:
            try:
                # only a running run has an owner's lease; a queued one is due now (its
                # wake orders the queue)
                conn.execute(
                    "INSERT INTO tcc.runs (tenant, run_id, status, epoch, owner_host, owner_pid, "
                    "lease_expiry, keep, record, wake, spawned_by) VALUES (%s, %s, %s, 1, %s, "
                    "%s, now() + make_interval(secs => %s), %s, %s, "
                    "CASE WHEN %s THEN clock_timestamp() END, %s)",
                    (self.tenant, rid.decode(), status, HOST, os.getpid(),
                     float(lease) if status == "running" else 0.0, keep, rec, status == "queued",
                     spawned_by))
            except pe.UniqueViolation:
                raise StoreError(f"run {rid.decode()!r} already exists in store {self.path}") from None
            self._event(conn, rid, "created", event)
            # a queued run is work now; a running one will be if its owner dies: idle
            # workers learn its lease (and, on its host, its pid) at once
            if status != "importing":
                self._notify(conn)
            return self._info(self._load_run(conn, rid))

        info_ = self._tx(op, f"creating run {rid.decode()!r}")
        memo = self._memo(rid)
        memo.jlen, memo.made = 0, 0
        return info_

    def _notify(self, conn: Any) -> None:
        """Wake idle workers (``LISTEN tcc_work``) when this transaction commits: only for
        writes that create work (a submission, a signal, a sleep, a finished child), never
        per checkpoint (a notifying commit takes a lock every such commit shares)."""
        conn.execute("SELECT pg_notify(%s, %s)", (WORK_CHANNEL, self.tenant))

    def get_run(self, run_id: str) -> RunInfo:
        rid = self._rid(run_id)
        return self._read(lambda conn: self._info(self._load_run(conn, rid)))

    def list_runs(self, status: str | None = None, *,
                  damaged: list[tuple[str, str]] | None = None) -> list[RunInfo]:
        sql = f"SELECT {self._RUN_COLS} FROM tcc.runs WHERE tenant = %s"
        params: list[Any] = [self.tenant]
        if status is not None:
            sql += " AND status = %s"
            params.append(status)
        rows = self._read(lambda conn: conn.execute(sql + " ORDER BY run_id", params).fetchall())
        out = []
        for row in rows:
            try:
                out.append(self._info(tuple(row)))
            except StoreCorruptError as exc:
                if damaged is None:
                    raise
                damaged.append((row[0], str(exc)))
        return out

    def claim_run(self, run_id: str, *, lease: float = 30.0, steal: bool = False,
                  expect_epoch: int | None = None) -> RunInfo:
        _check_lease(lease)
        rid = self._rid(run_id)
        if expect_epoch is not None:
            check_int("expect_epoch", expect_epoch, 1)

        def decide(row: tuple[Any, ...]) -> bytes:
            """The claim's event record, if the run in ``row`` may be claimed; else FencedError."""
            self._open_run(row)  # a damaged record is not claimed
            _, status, epoch, host, pid, left = row[:6]
            if status in FINAL_STATUSES:
                raise FencedError(f"run {run_id!r} in store {self.path} is already {status}")
            if expect_epoch is not None and epoch != expect_epoch:
                raise FencedError(
                    f"run {run_id!r} in store {self.path} moved on to epoch {epoch} (owner "
                    f"{host}:{pid}) before this process took it over from epoch {expect_epoch}")
            mine = host == HOST and pid == os.getpid()
            alive = left > 0 and not mine and not steal and expect_epoch is None
            if alive and host == HOST:
                alive = pid_alive(pid)
            if alive:
                raise FencedError(
                    f"run {run_id!r} in store {self.path} is owned by {host}:{pid} for {left:.1f} s "
                    "more; wait for it to finish or its lease to expire, or take it over anyway "
                    "(`tcc resume --steal`, claim_run(steal=True))")
            return self._event_record(rid, "reclaimed" if mine else "taken_over",
                                      {"epoch": epoch, "owner": f"{host}:{pid}",
                                       "new_epoch": epoch + 1})

        claim = (f"WITH u AS (UPDATE tcc.runs SET epoch = epoch + 1, owner_host = %s, "
                 "owner_pid = %s, lease_expiry = now() + make_interval(secs => %s), "
                 "updated = now() WHERE tenant = %s AND run_id = %s {cond} RETURNING *), "
                 "e AS (INSERT INTO tcc.events (tenant, run_id, record) SELECT tenant, run_id, %s "
                 f"FROM u) SELECT {self._RUN_COLS}, journal_len, snapshots_made FROM u")
        params = (HOST, os.getpid(), float(lease), self.tenant, rid.decode())

        def optimistic(conn: Any) -> tuple[Any, ...] | None:
            # two round trips: read, then claim the row version that was read (xmin), with
            # its event, in one statement; None if the run changed in between
            row = self._load_run(conn, rid)
            event = decide(row)
            got = conn.execute(claim.format(cond="AND xmin = %s::text::xid"),
                               (*params, row[-1], event)).fetchone()
            return None if got is None else tuple(got)

        def locked(conn: Any) -> tuple[Any, ...]:
            row = self._load_run(conn, rid, lock=True)
            event = decide(row)
            return tuple(conn.execute(claim.format(cond=""), (*params, event)).fetchone())

        memo = _Memo()  # a new owner starts from the counts its claim saw (writers before it
        try:            # are fenced now), and reads its snapshot base again
            got = self._tx(optimistic, f"claiming run {run_id!r}", transaction=False)
            if got is None:  # its owner wrote meanwhile: decide again, holding the row's lock
                got = self._tx(locked, f"claiming run {run_id!r}")
            info = self._info(got)
            memo.jlen, memo.made = got[-2], got[-1]
        finally:
            with self._lock:
                self._memos[rid] = memo
        return info

    def cancel_run(self, run_id: str, *, reason: str | None = None) -> RunInfo:
        rid = self._rid(run_id)

        def op(conn: Any) -> RunInfo:
            row = self._load_run(conn, rid, lock=True)
            _, status, epoch, host, pid = row[:5]
            if status in FINAL_STATUSES:
                raise FencedError(f"run {run_id!r} in store {self.path} is already {status}")
            conn.execute(
                "UPDATE tcc.runs SET epoch = epoch + 1, status = 'cancelled', owner_host = %s, "
                "owner_pid = %s, lease_expiry = now(), updated = now() "
                "WHERE tenant = %s AND run_id = %s",
                (HOST, os.getpid(), self.tenant, rid.decode()))
            self._event(conn, rid, "cancelled", {"epoch": epoch, "owner": f"{host}:{pid}",
                                                 "status": status, "new_epoch": epoch + 1,
                                                 "reason": reason})
            return self._info(self._load_run(conn, rid))

        return self._tx(op, f"cancelling run {run_id!r}")

    # ------------------------------------------------------------------ fleet
    def claim_due(self, limit: int, *, lease: float, check: Callable[[RunInfo], tuple[str, Any]],
                  exclude: Collection[str] = (), damaged: list[tuple[str, str]] | None = None,
                  watch: list[int] | None = None) -> list[tuple[RunInfo, str]]:
        """Claim up to ``limit`` due runs for this worker (see :mod:`tcc.store._pgfleet`)."""
        _check_lease(lease)
        from ._pgfleet import claim_due

        return claim_due(self, limit, lease=lease, check=check, exclude=exclude, damaged=damaged,
                         watch=watch)

    def next_due(self) -> float | None:
        """Seconds until the next run becomes due by time (None: none will by time)."""
        from ._pgfleet import next_due

        return next_due(self)

    def listener(self) -> Any:
        """A ``LISTEN`` connection of its own that waits for new work (``_pgfleet.Listener``)."""
        from ._pgfleet import Listener

        return Listener(self)

    def _fence_error(self, conn: Any, rid: bytes, epoch: int) -> StoreError:
        """Why a fenced write of ``rid`` at ``epoch`` was refused."""
        row = conn.execute("SELECT status, epoch, owner_host, owner_pid FROM tcc.runs "
                           "WHERE tenant = %s AND run_id = %s",
                           (self.tenant, rid.decode())).fetchone()
        if row is None:
            return self._not_found(rid)
        status, current, host, pid = row
        name = rid.decode()
        if current != epoch and status == "cancelled":
            return FencedError(
                f"run {name!r} in store {self.path} was cancelled (by {host}:{pid}), so this "
                f"writer (epoch {epoch}) must stop; nothing was written")
        if current != epoch:
            return FencedError(
                f"run {name!r} in store {self.path} is at epoch {current} (owner {host}:{pid}) "
                f"but this writer has epoch {epoch}: the run was taken over, so this writer "
                "must stop; nothing was written")
        return FencedError(f"run {name!r} in store {self.path} is already {status}, which is "
                           "final; nothing was written")

    def _fenced_update(self, conn: Any, rid: bytes, epoch: int, sets: str,
                       params: tuple[Any, ...]) -> None:
        _check_epoch(epoch)
        cur = conn.execute(
            f"UPDATE tcc.runs SET {sets} WHERE tenant = %s AND run_id = %s AND epoch = %s "
            "AND status NOT IN ('completed', 'cancelled')",
            (*params, self.tenant, rid.decode(), epoch))
        if cur.rowcount != 1:
            raise self._fence_error(conn, rid, epoch)

    def renew_lease(self, run_id: str, epoch: int, lease: float = 30.0) -> RunInfo:
        _check_lease(lease)
        rid = self._rid(run_id)

        _check_epoch(epoch)

        def op(conn: Any) -> RunInfo:
            # a release (lease 0) of a parked run that something made due meanwhile (a
            # signal, a child's end: their NOTIFY found it still held) notifies again
            row = conn.execute(
                "WITH u AS (UPDATE tcc.runs SET lease_expiry = now() + make_interval(secs => %s), "
                f"updated = now() WHERE tenant = %s AND run_id = %s AND epoch = %s AND status "
                f"NOT IN ('completed', 'cancelled') RETURNING *) SELECT {self._RUN_COLS}, "
                "CASE WHEN %s = 0 AND status IN ('queued', 'waiting', 'sleeping') AND wake <= now() "
                "THEN pg_notify(%s, tenant) END FROM u",
                (float(lease), self.tenant, rid.decode(), epoch, float(lease), WORK_CHANNEL)).fetchone()
            if row is None:
                raise self._fence_error(conn, rid, epoch)
            return self._info(tuple(row[:-1]))

        return self._tx(op, f"renewing the lease of run {run_id!r}", transaction=False)

    def set_status(self, run_id: str, epoch: int, status: str, *, result: bytes | None = None,
                   error: bytes | None = None, wake: float | None = None) -> RunInfo:
        if status not in RUN_STATUSES:
            raise ValueError(f"status must be one of {RUN_STATUSES}, not {status!r}")
        rid = self._rid(run_id)
        res = None if result is None else as_bytes("result", result)
        err = None if error is None else as_bytes("error", error)
        if wake is not None and (not isinstance(wake, (int, float)) or not math.isfinite(wake)):
            raise UsageError(f"wake must be a finite time.time() value, not {wake!r}")
        # When a worker should look at the run next (see _pgschema, version 3): a sleep at
        # its end; a running or finished run never by time (a running one by its lease); a
        # waiting one keeps what a signal or a child set meanwhile (the worker checks it).
        # (a wait's deadline, if it has one, is the latest a waiting run is due)
        sets, wake_params = {
            "sleeping": (", wake = to_timestamp(%s)", (time.time() if wake is None else wake)
                         + self._skew),
            "waiting": ("", None) if wake is None else
                       (", wake = least(wake, to_timestamp(%s))", wake + self._skew),
            "queued": (", wake = clock_timestamp()", None),
        }.get(status, (", wake = NULL", None))

        def op(conn: Any) -> RunInfo:
            _check_epoch(epoch)
            row = self._load_run(conn, rid, lock=True)
            hdr, blobs = self._open_run(row)
            if res is not None:
                blobs["result"] = res
            if err is not None:
                blobs["error"] = err
            self._fenced_update(conn, rid, epoch, "status = %s, updated = now(), record = %s" + sets,
                                (status, self._seal_run(rid, hdr, blobs),
                                 *(() if wake_params is None else (wake_params,))))
            self._event(conn, rid, status, {"epoch": epoch})
            # idle workers learn a sleep's end or a wait's deadline, and a queued run
            notify = status != "running" and status not in FINISHED_STATUSES \
                and (status != "waiting" or wake is not None)
            if status in FINISHED_STATUSES:  # the run that spawned it may be waiting for it
                notify = conn.execute(
                    "UPDATE tcc.runs p SET wake = clock_timestamp() FROM tcc.runs c "
                    "WHERE c.tenant = %s AND c.run_id = %s AND p.tenant = c.tenant "
                    "AND p.run_id = c.spawned_by AND p.status IN ('running', 'waiting')",
                    (self.tenant, rid.decode())).rowcount > 0
            if notify:
                self._notify(conn)
            return self._info(self._load_run(conn, rid))

        return self._tx(op, f"setting the status of run {run_id!r}")

    def fork_run(self, run_id: str, number: int | None = None, *,
                 new_run_id: str | None = None) -> RunInfo:
        src = self._rid(run_id)
        new = self._rid(new_run_id or uuid.uuid4().hex, new=True)
        if number is not None:
            check_int("number", number, 0)
        t = self.tenant_key
        pe = self._errors

        def op(conn: Any) -> RunInfo:
            conn.execute("SELECT pg_advisory_xact_lock_shared(%s)", (CHUNK_LOCK,))
            srow = self._load_run(conn, src)
            shdr, sblobs = self._open_run(srow)
            snap = conn.execute(
                "SELECT number, record FROM tcc.snapshots WHERE tenant = %s AND run_id = %s "
                + ("AND number = %s" if number is not None else "ORDER BY number DESC LIMIT 1"),
                (self.tenant, src.decode(), *([number] if number is not None else []))).fetchone()
            if snap is None:
                which = f"snapshot {number}" if number is not None else (
                    "snapshot yet (it stopped before its first checkpoint): resume it first")
                raise StoreError(f"run {run_id!r} in store {self.path} has no {which}")
            num = snap[0]
            try:
                hdr, blobs = self.sealer.open(b"snaps", seq_key(t, src, num), snap[1])
            except Corrupt as exc:
                raise self._corrupt(f"run {run_id!r} snapshot {num} record", exc) from None
            jlen = hdr["j"]
            rec = self._seal_run(new, {"entry": shdr["entry"], "strategy": shdr["strategy"],
                                       "parent": [src.decode(), num]},
                                 {"args": sblobs.get("args", b"")})
            try:
                conn.execute(
                    "INSERT INTO tcc.runs (tenant, run_id, status, epoch, owner_host, owner_pid, "
                    "lease_expiry, journal_len, snapshots_made, record) VALUES (%s, %s, "
                    "'running', 1, %s, %s, now() + interval '30 seconds', %s, 1, %s)",
                    (self.tenant, new.decode(), HOST, os.getpid(), jlen, rec))
            except pe.UniqueViolation:
                raise StoreError(f"run {new.decode()!r} already exists in store {self.path}") from None
            rows = conn.execute(
                "SELECT seq, kind, intent_seq, record FROM tcc.journal WHERE tenant = %s AND "
                "run_id = %s AND seq < %s ORDER BY seq", (self.tenant, src.decode(), jlen)).fetchall()
            if len(rows) != jlen:
                raise StoreCorruptError(
                    f"store {self.path}: run {run_id!r} has {len(rows)} of the {jlen} journal "
                    f"records its snapshot {num} reflects; restore the store from a backup")
            copied = []
            for seq, kind, intent, raw in rows:
                try:
                    jh, jb = self.sealer.open(b"journal", seq_key(t, src, seq), raw)
                except Corrupt as exc:
                    raise self._corrupt(f"journal record {seq} of run {run_id!r}", exc) from None
                copied.append((self.tenant, new.decode(), seq, kind, intent,
                               self.sealer.seal(b"journal", seq_key(t, new, seq), jh, jb)))
            with conn.cursor() as cur:
                cur.executemany("INSERT INTO tcc.journal VALUES (%s, %s, %s, %s, %s, %s)", copied)
            conn.execute(
                "INSERT INTO tcc.snapshots (tenant, run_id, number, journal_len, size, record) "
                "VALUES (%s, %s, 1, %s, %s, %s)",
                (self.tenant, new.decode(), jlen, hdr["s"],
                 self.sealer.seal(b"snaps", seq_key(t, new, 1), hdr, blobs)))
            conn.execute("INSERT INTO tcc.pins VALUES (%s, %s, %s, %s)",
                         (self.tenant, src.decode(), num, new.decode()))
            self._event(conn, new, "created", {"forked_from": src.decode(), "snapshot": num})
            self._event(conn, src, "forked", {"snapshot": num, "child": new.decode()})
            return self._info(self._load_run(conn, new))

        return self._tx(op, f"forking run {run_id!r}")

    def delete_run(self, run_id: str) -> None:
        rid = self._rid(run_id)

        def op(conn: Any) -> None:
            self._load_run(conn, rid, lock=True)
            key = (self.tenant, rid.decode())
            for table in ("journal", "snapshots", "signals", "signal_consumptions", "pins"):
                conn.execute(f"DELETE FROM tcc.{table} WHERE tenant = %s AND run_id = %s", key)
            conn.execute("DELETE FROM tcc.pins WHERE tenant = %s AND holder = %s", key)
            conn.execute("DELETE FROM tcc.runs WHERE tenant = %s AND run_id = %s", key)
            self._event(conn, rid, "deleted", {})

        self._tx(op, f"deleting run {run_id!r}")
        with self._lock:
            self._memos.pop(rid, None)

    # ---------------------------------------------------------------- journal
    def _counts(self, conn: Any, rid: bytes, memo: _Memo) -> None:
        row = conn.execute("SELECT journal_len, snapshots_made FROM tcc.runs WHERE tenant = %s "
                           "AND run_id = %s", (self.tenant, rid.decode())).fetchone()
        if row is None:
            raise self._not_found(rid)
        memo.jlen, memo.made = row

    def _call(self, rid: bytes, epoch: int, what: str,
              fn: Callable[[Any, _Memo], T]) -> T:
        """Run one fenced write ``fn(conn, memo)``; once more with fresh counts if the run
        moved under the handle's memo."""
        _check_epoch(epoch)
        memo = self._memo(rid)
        with self._run_lock(rid):
            believed: tuple[int, int] | None = None  # the counts before a re-read
            for attempt in (1, 2):
                try:
                    with self._conn() as conn:
                        if memo.jlen is None or memo.made is None:
                            self._counts(conn, rid, memo)
                            assert memo.jlen is not None and memo.made is not None
                            if believed is not None and (memo.jlen < believed[0] or memo.made < believed[1]):
                                # The run lost records this handle wrote and saw committed: the
                                # server crashed and came back without them (an intent does not
                                # wait for its flush).  Stop as a lost connection would.
                                memo.jlen = memo.made = None
                                raise StoreConnectionError(
                                    f"the PostgreSQL store {self.path} lost this run's latest writes "
                                    f"during {what} (its server restarted without them); the run "
                                    "resumes from what the store has: `tcc resume`")
                        try:
                            return fn(conn, memo)
                        except self._errors.UniqueViolation as exc:
                            if exc.diag.constraint_name == "journal_answered_once":
                                raise UsageError(
                                    f"run {rid.decode()!r}: that intent already has a completion "
                                    "(an outcome is journaled once)") from None
                            raise
                        except self._OperationalError:
                            raise
                        except self._Error as exc:
                            if (exc.sqlstate or "").startswith("TC"):
                                raise self._mapped(conn, exc, rid, epoch, memo) from None
                            raise
                except _Moved:
                    if memo.jlen is not None and memo.made is not None:
                        believed = (memo.jlen, memo.made)
                    memo.jlen = memo.made = None
                    memo.base, memo.known = None, set()
                    if attempt == 2:
                        raise StoreError(f"run {rid.decode()!r} in store {self.path} keeps "
                                         f"moving under this writer during {what}") from None
                except self._OperationalError as exc:
                    memo.jlen = memo.made = None
                    memo.base, memo.known = None, set()
                    raise StoreConnectionError(
                        f"lost the connection to the PostgreSQL store {self.path} during {what}: "
                        f"{_reason(exc)}; whether it committed is unknown (the run resumes from "
                        "what the store has: `tcc resume`)") from None
        raise AssertionError("unreachable")

    def _mapped(self, conn: Any, exc: Any, rid: bytes, epoch: int, memo: _Memo) -> Exception:
        code = exc.sqlstate
        if code == "TC001":
            return self._fence_error(conn, rid, epoch)
        if code in ("TC002", "TC006"):
            return _Moved()
        if code == "TC004":
            return UsageError(f"run {rid.decode()!r}: {exc.diag.message_primary}; a completion "
                              "must name an intent of this run")
        if code == "TC005":
            return FencedError(f"run {rid.decode()!r} in store {self.path}: "
                               f"{exc.diag.message_primary}; nothing was written")
        return StoreError(f"PostgreSQL store {self.path}: {exc.diag.message_primary}")

    def append_intent(self, run_id: str, epoch: int, name: str, args: bytes = b"", *,
                      idempotency_key: str | None = None, attempt: int = 1) -> int:
        rid = self._rid(run_id)
        if not isinstance(name, str) or not name:
            raise UsageError(f"effect name must be a non-empty string, not {name!r}")
        check_int("attempt", attempt, 1)
        if idempotency_key is not None and not isinstance(idempotency_key, str):
            raise UsageError(f"idempotency_key must be a string, not {idempotency_key!r}")
        body = as_bytes("args", args)
        hdr = {"k": "i", "t": time.time(), "n": name, "ik": idempotency_key, "a": attempt}

        def op(conn: Any, memo: _Memo) -> int:
            seq = memo.jlen
            assert seq is not None
            rec = self.sealer.seal(b"journal", seq_key(self.tenant_key, rid, seq), hdr, {"x": body})
            self._write(conn, "SELECT tcc.append_intent(%s, %s, %s, %s, %s, %s)",
                        (self.tenant, rid.decode(), epoch, seq, rec, self._sync_intents))
            memo.jlen = seq + 1
            return seq

        return self._call(rid, epoch, "journaling an intent", op)

    def _completion_record(self, rid: bytes, seq: int, c: Completion) -> bytes:
        blobs = {}
        if c.result is not None:
            blobs["r"] = as_bytes("completion result", c.result)
        if c.error is not None:
            blobs["e"] = as_bytes("completion error", c.error)
        return self.sealer.seal(b"journal", seq_key(self.tenant_key, rid, seq),
                                {"k": "c", "t": time.time(), "i": c.intent_seq,
                                 "d": float(c.duration)}, blobs)

    def _check_completion(self, completion: object) -> Completion:
        if not isinstance(completion, Completion):
            raise UsageError(f"completion must be a Completion, not {type(completion).__name__}")
        check_int("completion intent_seq", completion.intent_seq, 0)
        return completion

    def append_completion(self, run_id: str, epoch: int, completion: Completion, *,
                          consume_signal: str | None = None) -> int:
        rid = self._rid(run_id)
        c = self._check_completion(completion)
        if consume_signal is not None:
            check_name("signal name", consume_signal)

        def op(conn: Any, memo: _Memo) -> int:
            seq = memo.jlen
            assert seq is not None
            self._write(
                conn,
                "SELECT * FROM tcc.commit_step(%s, %s, %s, %s, %s, %s, %s, NULL, NULL, NULL, "
                "NULL, NULL, NULL, %s)",
                (self.tenant, rid.decode(), epoch, seq, c.intent_seq,
                 self._completion_record(rid, seq, c), consume_signal, self.keep))
            memo.jlen = seq + 1
            return seq

        return self._call(rid, epoch, "journaling a completion", op)

    def journal(self, run_id: str, start: int = 0) -> list[JournalRecord]:
        rid = self._rid(run_id)
        check_int("start", start, 0)

        def op(conn: Any) -> list[tuple[Any, ...]]:
            rows: list[tuple[Any, ...]] = conn.execute(
                "SELECT seq, record FROM tcc.journal WHERE tenant = %s AND run_id = %s AND "
                "seq >= %s ORDER BY seq", (self.tenant, rid.decode(), start)).fetchall()
            if not rows:
                self._load_run(conn, rid)  # none, or no such run (RunNotFoundError)
            return rows

        out: list[JournalRecord] = []
        for seq, raw in self._read(op):
            if seq != start + len(out):
                raise StoreCorruptError(
                    f"store {self.path}: journal record {start + len(out)} of run {run_id!r} "
                    "is missing; restore the store from a backup")
            try:
                h, b = self.sealer.open(b"journal", seq_key(self.tenant_key, rid, seq), raw)
            except Corrupt as exc:
                raise self._corrupt(f"journal record {seq} of run {run_id!r}", exc) from None
            if h.get("k") == "i":
                out.append(JournalRecord(seq, "intent", h["t"], name=h["n"], args=b.get("x", b""),
                                         idempotency_key=h.get("ik"), attempt=h.get("a", 1)))
            else:
                out.append(JournalRecord(seq, "completion", h["t"], intent_seq=h["i"],
                                         result=b.get("r"), error=b.get("e"), duration=h.get("d")))
        return out

    def journal_length(self, run_id: str) -> int:
        """How many journal records the run has (read from its run row)."""
        rid = self._rid(run_id)

        def op(conn: Any) -> int:
            row = conn.execute("SELECT journal_len FROM tcc.runs WHERE tenant = %s AND run_id = %s",
                               (self.tenant, rid.decode())).fetchone()
            if row is None:
                raise self._not_found(rid)
            return int(row[0])

        return self._read(op)

    # -------------------------------------------------------------- snapshots
    def checkpoint(self, run_id: str, epoch: int, payload: Payload, *,
                   completion: Completion | None = None,
                   consume_signal: str | None = None) -> SnapshotInfo:
        rid = self._rid(run_id)
        size = payload_size(payload)
        c = None if completion is None else self._check_completion(completion)
        if consume_signal is not None:
            check_name("signal name", consume_signal)
        inline = size <= INLINE_MAX
        t = self.tenant_key
        sealer = self.sealer

        def op(conn: Any, memo: _Memo) -> SnapshotInfo:
            seq, number = memo.jlen, memo.made
            assert seq is not None and number is not None
            number += 1
            jlen = seq + (1 if c is not None else 0)
            hdr: dict[str, Any] = {"j": jlen, "s": size, "t": time.time()}
            new_addr: list[bytes] = []
            new_data: list[bytes] = []
            refs: set[bytes] = set()
            known = memo.known if memo.base is not None else set()
            if inline:
                blobs = {"p": encode_chunk(joined(payload))}
                hdr["g"] = -1
            else:
                leaves = split(sealer, payload, memo.split)
                encode = ChunkEncoder().encode
                refs.update(a for a, _ in leaves)
                sent: set[bytes] = set()
                for address, piece in leaves:
                    if address not in known and address not in sent:
                        sent.add(address)
                        new_addr.append(address)
                        new_data.append(sealer.lock_chunk(address, encode(piece)))
                entries = [(0, a, len(p)) for a, p in leaves]
                node_address: dict[int, bytes] = {}

                def node_id(address: bytes) -> int:  # numbers only to find each node's address
                    node_address[len(node_address)] = address
                    return len(node_address) - 1

                depth, top, nodes = build_manifest(sealer, entries, node_id, memo.nodes)
                for nid, content in nodes.items():
                    address = node_address[nid]
                    refs.add(address)
                    if address not in known and address not in sent:
                        sent.add(address)
                        new_addr.append(address)
                        new_data.append(sealer.lock_chunk(address, encode_node(content)))
                blobs = {"m": pack_entries(top)}
                hdr["g"] = depth
            rec = sealer.seal(b"snaps", seq_key(t, rid, number), hdr, blobs)
            comp = None if c is None else self._completion_record(rid, seq, c)
            row = self._write(
                conn,
                "SELECT * FROM tcc.commit_step(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
                "%s::bytea[], %s::bytea[], %s)",
                (self.tenant, rid.decode(), epoch, seq, None if c is None else c.intent_seq, comp,
                 consume_signal, number, rec, size, memo.base if known else None,
                 new_addr, new_data, self.keep)).fetchone()
            memo.jlen, memo.made = jlen, number
            memo.base, memo.known = (number, refs) if not inline else (None, set())
            return SnapshotInfo(run_id, number, jlen, size, float(row[1]))

        try:
            return self._call(rid, epoch, "a checkpoint", op)
        except BaseException:
            memo = self._memo(rid)
            memo.split = SplitMemo()  # its cuts may describe a payload that was not stored
            memo.nodes = {}
            raise

    def _snapshot_rows(self, conn: Any, rid: bytes) -> list[tuple[Any, ...]]:
        rows = [tuple(r) for r in conn.execute(
            "SELECT number, journal_len, size, extract(epoch FROM created)::float8, record, "
            "EXISTS (SELECT 1 FROM tcc.pins p WHERE p.tenant = s.tenant AND p.run_id = s.run_id "
            "AND p.number = s.number) FROM tcc.snapshots s WHERE tenant = %s AND run_id = %s "
            "ORDER BY number", (self.tenant, rid.decode())).fetchall()]
        if not rows:
            self._load_run(conn, rid)  # none, or no such run (RunNotFoundError)
        return rows

    def _snap_record(self, rid: bytes, row: tuple[Any, ...]) -> tuple[dict[str, Any], dict[str, bytes]]:
        number = row[0]
        try:
            hdr, blobs = self.sealer.open(b"snaps", seq_key(self.tenant_key, rid, number), row[4])
        except Corrupt as exc:
            raise self._corrupt(f"run {rid.decode()!r} snapshot {number} record", exc) from None
        return hdr, blobs

    def snapshots(self, run_id: str) -> list[SnapshotInfo]:
        rid = self._rid(run_id)
        out = []
        for row in self._read(lambda conn: self._snapshot_rows(conn, rid)):
            try:
                hdr, _ = self._snap_record(rid, row)
            except StoreCorruptError:
                out.append(SnapshotInfo(run_id, row[0], -1, -1, 0.0, damaged=True))
                continue
            out.append(SnapshotInfo(run_id, row[0], hdr["j"], hdr["s"], row[3], pinned=row[5]))
        return out

    def _payload(self, conn: Any, rid: bytes, row: tuple[Any, ...]) -> bytes:
        hdr, blobs = self._snap_record(rid, row)
        number = row[0]
        what = f"run {rid.decode()!r} snapshot {number}"
        try:
            if hdr.get("g", -1) < 0:
                return decode_inline(blobs["p"], hdr["s"])
            level = parse_entries(blobs["m"])
            for depth in range(hdr["g"], -1, -1):
                found = self._fetch(conn, [a for _, a, _ in level])
                pieces = []
                for _, address, n in level:
                    stored = found.get(address)
                    if stored is None:
                        raise Corrupt(f"chunk {address.hex()[:16]} is missing")
                    pieces.append(decode_chunk(self.sealer, address, stored, n))
                if depth == 0:
                    data = b"".join(pieces)
                    if len(data) != hdr["s"]:
                        raise Corrupt(f"payload has {len(data)} bytes, expected {hdr['s']}")
                    return data
                level = [e for p in pieces for e in parse_entries(p)]
        except (Corrupt, KeyError) as exc:
            raise self._corrupt(what, exc) from None
        raise AssertionError("unreachable")

    def _fetch(self, conn: Any, addresses: list[bytes]) -> dict[bytes, bytes]:
        rows = conn.execute("SELECT address, data FROM tcc.chunks WHERE address = ANY(%s::bytea[])",
                            (list(set(addresses)),)).fetchall()
        return {bytes(a): bytes(d) for a, d in rows}

    def _pick(self, rows: list[tuple[Any, ...]], rid: bytes, number: int | None) -> tuple[Any, ...]:
        if not rows:
            raise StoreError(f"run {rid.decode()!r} in store {self.path} has no snapshot")
        if number is None:
            return rows[-1]
        for row in rows:
            if row[0] == number:
                return row
        raise StoreError(f"run {rid.decode()!r} in store {self.path} has no snapshot {number}")

    def load_snapshot(self, run_id: str, number: int | None = None) -> bytes:
        rid = self._rid(run_id)
        if number is not None:
            check_int("snapshot number", number, 1)

        def op(conn: Any) -> bytes:
            return self._payload(conn, rid, self._pick(self._snapshot_rows(conn, rid), rid, number))

        return self._read(op)

    def latest_good_snapshot(self, run_id: str) -> tuple[SnapshotInfo, bytes] | None:
        rid = self._rid(run_id)
        bad: list[tuple[int, str]] = []

        def op(conn: Any) -> tuple[SnapshotInfo, bytes] | None:
            bad.clear()
            for row in reversed(self._snapshot_rows(conn, rid)):
                try:
                    payload = self._payload(conn, rid, row)
                    hdr, _ = self._snap_record(rid, row)
                except StoreCorruptError as exc:
                    bad.append((row[0], str(exc)))
                    continue
                return SnapshotInfo(run_id, row[0], hdr["j"], hdr["s"], row[3],
                                    pinned=row[5]), payload
            return None

        found = self._read(op)
        if bad:
            def note(conn: Any) -> None:
                for number, why in bad:
                    self._event(conn, rid, "snapshot_corrupt", {"number": number, "error": why})
                self._event(conn, rid, "fell_back",
                            {"from": bad[0][0], "to": found[0].number if found else None})

            self._tx(note, f"recording damage of run {run_id!r}")
        return found

    # ---------------------------------------------------------------- signals
    def send_signal(self, run_id: str, name: str, value: bytes = b"") -> bool:
        rid = self._rid(run_id)
        check_name("signal name", name)
        rec = self.sealer.seal(b"signals", self._run_key(rid) + b"\x00" + name.encode(),
                               {"t": time.time()}, {"v": as_bytes("signal value", value)})

        def op(conn: Any) -> bool:
            self._load_run(conn, rid)
            cur = conn.execute("INSERT INTO tcc.signals VALUES (%s, %s, %s, %s) ON CONFLICT "
                               "DO NOTHING", (self.tenant, rid.decode(), name, rec))
            if cur.rowcount != 1:
                return False
            # due for a worker once it waits (a running run parks keeping this mark)
            if conn.execute("UPDATE tcc.runs SET wake = clock_timestamp() WHERE tenant = %s AND "
                            "run_id = %s AND status IN ('running', 'waiting')",
                            (self.tenant, rid.decode())).rowcount:
                self._notify(conn)
            return True

        return self._tx(op, f"sending signal {name!r}")

    def _signal(self, conn: Any, rid: bytes, name: str) -> tuple[bytes | None, bool | None]:
        """(value, consumed) of signal ``name`` (None, None: never delivered)."""
        row = conn.execute(
            "SELECT s.record, c.name IS NOT NULL FROM tcc.signals s LEFT JOIN "
            "tcc.signal_consumptions c USING (tenant, run_id, name) WHERE s.tenant = %s AND "
            "s.run_id = %s AND s.name = %s", (self.tenant, rid.decode(), name)).fetchone()
        if row is None:
            return None, None
        try:
            _, blobs = self.sealer.open(b"signals", self._run_key(rid) + b"\x00" + name.encode(),
                                        row[0])
        except Corrupt as exc:
            raise self._corrupt(f"signal {name!r} of run {rid.decode()!r}", exc) from None
        return blobs.get("v", b""), bool(row[1])

    def take_signal(self, run_id: str, epoch: int, name: str) -> bytes | None:
        rid = self._rid(run_id)
        check_name("signal name", name)
        _check_epoch(epoch)

        def op(conn: Any) -> bytes | None:
            self._fenced_update(conn, rid, epoch, "updated = updated", ())
            value, consumed = self._signal(conn, rid, name)
            if value is None or consumed:
                return None
            cur = conn.execute("INSERT INTO tcc.signal_consumptions (tenant, run_id, name) VALUES "
                               "(%s, %s, %s) ON CONFLICT DO NOTHING",
                               (self.tenant, rid.decode(), name))
            return value if cur.rowcount == 1 else None

        return self._tx(op, f"taking signal {name!r}")

    def pending_signals(self, run_id: str) -> list[str]:
        rid = self._rid(run_id)

        def op(conn: Any) -> list[str]:
            names = [r[0] for r in conn.execute(
                "SELECT s.name FROM tcc.signals s WHERE s.tenant = %s AND s.run_id = %s AND NOT "
                "EXISTS (SELECT 1 FROM tcc.signal_consumptions c WHERE c.tenant = s.tenant AND "
                "c.run_id = s.run_id AND c.name = s.name) ORDER BY s.name",
                (self.tenant, rid.decode())).fetchall()]
            if not names:
                self._load_run(conn, rid)  # none, or no such run (RunNotFoundError)
            return names

        return self._read(op)

    def peek_signal(self, run_id: str, name: str) -> bytes | None:
        rid = self._rid(run_id)
        check_name("signal name", name)

        def op(conn: Any) -> bytes | None:
            value, consumed = self._signal(conn, rid, name)
            if value is None:
                self._load_run(conn, rid)  # never delivered, or no such run
            return None if consumed else value

        return self._read(op)

    def signal_state(self, run_id: str, name: str) -> str | None:
        rid = self._rid(run_id)
        check_name("signal name", name)

        def op(conn: Any) -> str | None:
            value, consumed = self._signal(conn, rid, name)
            if value is None:
                self._load_run(conn, rid)  # never delivered, or no such run
            return None if value is None else ("consumed" if consumed else "pending")

        return self._read(op)

    # ----------------------------------------------------------------- events
    def add_event(self, run_id: str, kind: str, data: Mapping[str, Any] | None = None, *,
                  epoch: int | None = None, deferred: bool = False) -> None:
        # ``deferred``: written by this handle's next write, in its statement (see _write)
        rid = self._rid(run_id)
        if deferred and epoch is None:
            raise ValueError("a deferred event needs its writer's epoch")
        if not isinstance(kind, str) or not kind:
            raise UsageError(f"event kind must be a non-empty string, not {kind!r}")
        try:
            json.dumps(dict(data or {}))
        except (TypeError, ValueError) as exc:
            raise UsageError(f"event data must be JSON-able: {exc}") from None

        if epoch is not None:
            _check_epoch(epoch)
        record = self._event_record(rid, kind, data)
        if deferred:
            assert epoch is not None
            with self._deferred_lock:
                self._deferred.append((rid.decode(), epoch, record))
            return
        key = (self.tenant, rid.decode())

        def op(conn: Any) -> None:
            # one statement: the owner's is fenced (the row lock of its no-op update), anyone
            # else's needs the run to exist
            if epoch is None:
                cur = conn.execute(
                    "INSERT INTO tcc.events (tenant, run_id, record) SELECT tenant, run_id, %s "
                    "FROM tcc.runs WHERE tenant = %s AND run_id = %s", (record, *key))
            else:
                cur = conn.execute(
                    "WITH f AS (UPDATE tcc.runs SET updated = updated WHERE tenant = %s AND "
                    "run_id = %s AND epoch = %s AND status NOT IN ('completed', 'cancelled') "
                    "RETURNING tenant, run_id) INSERT INTO tcc.events (tenant, run_id, record) "
                    "SELECT tenant, run_id, %s FROM f", (*key, epoch, record))
            if cur.rowcount != 1:
                raise self._not_found(rid) if epoch is None else self._fence_error(conn, rid, epoch)

        self._tx(op, f"adding an event to run {run_id!r}", transaction=False)

    def events(self, run_id: str) -> list[Event]:
        rid = self._rid(run_id)
        rows = self._read(lambda conn: conn.execute(
            "SELECT record FROM tcc.events WHERE tenant = %s AND run_id = %s ORDER BY id",
            (self.tenant, rid.decode())).fetchall())
        out: list[Event] = []
        for (raw,) in rows:
            try:
                hdr, _ = self.sealer.open(b"events", self._run_key(rid), raw)
            except Corrupt as exc:
                raise self._corrupt(f"an event of run {run_id!r}", exc) from None
            out.append(Event(run_id, len(out), hdr["k"], hdr["t"], hdr["d"]))
        return out

    # ----------------------------------------------------------- housekeeping

    # ------------------------------------------------------------------- code
    def _code_key(self, digest: str) -> bytes:
        return b"code\x00" + self.tenant_key + b"\x00" + bytes.fromhex(digest)

    def put_code(self, sources: Mapping[str, bytes]) -> None:
        checked = _code.check_sources(sources)
        if not checked:
            return
        digests = [bytes.fromhex(d) for d in checked]
        records = [self.sealer.seal(b"code", self._code_key(d), {"n": len(src)}, {"src": src})
                   for d, src in checked.items()]

        def op(conn: Any) -> None:
            # one statement (no pipeline: a lost connection is then one clear error)
            conn.execute("INSERT INTO tcc.code (tenant, digest, record) SELECT %s, d, r FROM "
                         "unnest(%s::bytea[], %s::bytea[]) AS t(d, r) ON CONFLICT DO NOTHING",
                         (self.tenant, digests, records))

        self._tx(op, "storing module sources", transaction=False)

    def get_code(self, digest: str) -> bytes:
        _code.check_digest(digest)
        row = self._read(lambda conn: conn.execute(
            "SELECT record FROM tcc.code WHERE tenant = %s AND digest = %s",
            (self.tenant, bytes.fromhex(digest))).fetchone())
        if row is None:
            raise StoreError(f"store {self.path} holds no source with digest {digest[:12]}…")
        try:
            _, blobs = self.sealer.open(b"code", self._code_key(digest), row[0])
        except Corrupt as exc:
            raise self._corrupt(f"the source {digest[:12]}…", exc) from None
        return _code.verify_source(digest, blobs.get("src", b""), f"store {self.path}")
    def _size(self, conn: Any) -> int:
        return int(conn.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c JOIN "
            "pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'tcc' AND "
            "c.relkind = 'r'").fetchone()[0])

    def gc(self) -> GcStats:
        """Apply retention to this tenant's runs, then delete chunks no snapshot (of any
        tenant) references, in one transaction that checkpoints wait for."""
        def op(conn: Any) -> GcStats:
            before = self._size(conn)
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (CHUNK_LOCK,))
            cur = conn.execute(
                "DELETE FROM tcc.snapshots s USING tcc.runs r WHERE s.tenant = %s AND "
                "r.tenant = s.tenant AND r.run_id = s.run_id AND s.number <= r.snapshots_made - "
                "coalesce(r.keep, %s) AND NOT EXISTS (SELECT 1 FROM tcc.pins p WHERE "
                "p.tenant = s.tenant AND p.run_id = s.run_id AND p.number = s.number)",
                (self.tenant, self.keep))
            deleted = max(cur.rowcount, 0)
            referenced: set[bytes] = set()
            damaged = []
            for tenant, run, number, raw in conn.execute(
                    "SELECT tenant, run_id, number, record FROM tcc.snapshots"):
                try:
                    referenced |= self._references(conn, tenant.encode(), run.encode(), number, raw)
                except (Corrupt, KeyError) as exc:
                    damaged.append(f"run {run!r} (tenant {tenant!r}) snapshot {number}: {exc}")
            swept = 0
            if damaged:
                for what in damaged:
                    warnings.warn(StoreDamageWarning(
                        f"store {self.path}: {what}; no chunk was deleted while it fails "
                        "verification"), stacklevel=3)
            else:
                conn.execute("CREATE TEMP TABLE tcc_keep (address bytea PRIMARY KEY) ON COMMIT DROP")
                with conn.cursor().copy("COPY tcc_keep (address) FROM STDIN") as copy:
                    for address in referenced:
                        copy.write_row((address,))
                swept = max(conn.execute(
                    "DELETE FROM tcc.chunks c WHERE NOT EXISTS (SELECT 1 FROM tcc_keep k "
                    "WHERE k.address = c.address)").rowcount, 0)
            return GcStats(snapshots_deleted=deleted, chunks_deleted=swept, bytes_before=before,
                           bytes_after=before)

        stats = self._tx(op, "gc")
        after = self._read(self._size)
        return GcStats(stats.snapshots_deleted, stats.chunks_deleted, 0, stats.bytes_before, after)

    def _references(self, conn: Any, tenant: bytes, rid: bytes, number: int, raw: bytes) -> set[bytes]:
        """Every chunk address a snapshot record references (group nodes included)."""
        hdr, blobs = self.sealer.open(b"snaps", seq_key(tenant, rid, number), raw)
        if hdr.get("g", -1) < 0:
            return set()
        level = parse_entries(blobs["m"])
        out: set[bytes] = set()
        for depth in range(hdr["g"], -1, -1):
            out.update(a for _, a, _ in level)
            if depth == 0:
                break
            found = self._fetch(conn, [a for _, a, _ in level])
            nxt = []
            for _, address, n in level:
                stored = found.get(address)
                if stored is None:
                    raise Corrupt(f"group node {address.hex()[:16]} is missing")
                nxt.extend(parse_entries(decode_chunk(self.sealer, address, stored, n)))
            level = nxt
        return out

    def compact(self) -> GcStats:
        """``VACUUM FULL`` of tcc's tables: gives the space gc freed back to the file system.
        StoreError if another session holds a lock on them for 5 s."""
        def op(conn: Any) -> GcStats:
            before = self._size(conn)
            conn.execute("SET lock_timeout = '5s'")
            try:
                conn.execute("VACUUM FULL tcc.chunks, tcc.snapshots, tcc.journal, tcc.events, "
                             "tcc.runs, tcc.signals, tcc.signal_consumptions, tcc.pins")
            except self._errors.LockNotAvailable:
                raise StoreError(f"store {self.path} is in use: compact needs it to itself "
                                 "(stop its runs and workers first)") from None
            finally:
                conn.execute("RESET lock_timeout")
            return GcStats(bytes_before=before, bytes_after=self._size(conn))

        return self._read(op)


def _check_lease(lease: object) -> None:
    if not isinstance(lease, (int, float)) or not math.isfinite(lease) or lease < 0:
        raise UsageError(f"lease must be a finite number of seconds >= 0, not {lease!r}")


def _check_epoch(epoch: object) -> None:
    if type(epoch) is not int:
        raise UsageError(f"epoch must be an int (from create_run or claim_run), not {epoch!r}")


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
