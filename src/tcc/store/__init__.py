"""tcc.store: the durable store (runs, journal, snapshots, signals, events).

The runtime talks to a :class:`Store`; :class:`LmdbStore` is the embedded
backend, and a ``postgresql://`` URL opens the PostgreSQL backend (many hosts
share one database; ``pip install 'tcc[postgres]'``).  Open either with
:func:`open_store`::

    from tcc.store import open_store

    with open_store() as store:                     # ./.tcc or $TCC_STORE
        run = store.create_run("agent.py:main")
        store.checkpoint(run.run_id, run.epoch, payload)

The store knows nothing about frames: it keeps opaque ``bytes`` with keyed
integrity checks.  See ``docs/store.md`` for durability modes, layout,
integrity, retention and errors.

Besides the interface, this package owns the value sets its callers share:
:data:`RUN_STATUSES` (and :data:`LIVE_STATUSES`, :data:`PARKED_STATUSES`,
:data:`FINISHED_STATUSES`, :data:`RETURNED_STATUSES`, :data:`FINAL_STATUSES`),
:data:`DURABILITIES`, :data:`HOST` (the host name run records give their
owner) and :func:`check_name` (what a run id, tenant or signal name may be).
"""

from __future__ import annotations

import os
from typing import Any as _Any

from ._api import DURABILITIES as DURABILITIES
from ._api import FINAL_STATUSES as FINAL_STATUSES
from ._api import FINISHED_STATUSES as FINISHED_STATUSES
from ._api import CREATE_STATUSES as CREATE_STATUSES
from ._api import HOST as HOST
from ._api import LIVE_STATUSES as LIVE_STATUSES
from ._api import PARKED_STATUSES as PARKED_STATUSES
from ._api import RETURNED_STATUSES as RETURNED_STATUSES
from ._api import RUN_STATUSES as RUN_STATUSES
from ._api import Completion as Completion
from ._api import Durability as Durability
from ._api import Event as Event
from ._api import GcStats as GcStats
from ._api import JournalRecord as JournalRecord
from ._api import RunInfo as RunInfo
from ._api import RunStatus as RunStatus
from ._api import SnapshotInfo as SnapshotInfo
from ._api import Store as Store
from ._api import StoreDamageWarning as StoreDamageWarning
from ._codec import check_name as check_name
from ._lmdb import LmdbStore as LmdbStore
from ._pgurl import is_postgres_url as is_postgres_url
from ._pgurl import redact as redact_url

__all__ = [
    "DURABILITIES",
    "FINAL_STATUSES",
    "FINISHED_STATUSES",
    "CREATE_STATUSES",
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
    "LmdbStore",
    "RunInfo",
    "RunStatus",
    "SnapshotInfo",
    "Store",
    "StoreDamageWarning",
    "check_name",
    "default_keep",
    "default_path",
    "init_store",
    "is_postgres_url",
    "open_store",
    "read_secret_file",
    "redact_url",
    "write_key_file",
]


def default_path() -> str:
    """``$TCC_STORE`` if set, else ``./.tcc`` (absolute; a PostgreSQL URL as it is)."""
    where = os.environ.get("TCC_STORE") or ".tcc"
    return where if is_postgres_url(where) else os.path.abspath(where)


def default_keep() -> int:
    """The store-wide snapshot retention the ``tcc`` commands use: ``$TCC_KEEP``, else 3
    (:class:`~tcc.errors.UsageError` if it is not a whole number of at least 1)."""
    from ..errors import UsageError

    raw = os.environ.get("TCC_KEEP", "").strip()
    if not raw:
        return 3
    try:
        keep = int(raw)
    except ValueError:
        keep = 0
    if keep < 1:
        raise UsageError(f"TCC_KEEP={raw!r} must be a whole number of snapshots, at least 1")
    return keep


def open_store(
    path: str | os.PathLike[str] | None = None,
    *,
    tenant: str = "default",
    durability: str = "sync",
    create: bool = True,
    keep: int = 3,
    map_size: int | None = None,
    max_map_size: int | None = None,
    key: bytes | str | None = None,
    key_file: str | os.PathLike[str] | None = None,
    sync_intents: bool | None = None,
) -> Store:
    """Open (by default creating) the store at ``path`` for one tenant.

    ``path`` is a directory (the embedded LMDB store, :class:`LmdbStore`) or a
    PostgreSQL URL, ``postgresql://USER@HOST:PORT/DB`` or ``postgres://...``
    (the server store, ``tcc.store._postgres.PgStore``; see the README's
    "PostgreSQL store").  A PostgreSQL store needs its key: ``key``,
    ``key_file`` (a file of 64 hex digits, mode 0600), ``$TCC_STORE_KEY_FILE``
    or ``$TCC_STORE_KEY``; :func:`init_store` creates the schema and the key
    file.  ``map_size`` and ``max_map_size`` apply to LMDB only.  ``sync_intents``
    (default False): whether an intent waits for its own flush (``sync`` durability).  By
    default it does not, and the step's commit that follows flushes both: one flush per
    step.  A crash of the *process* loses no intent either way; an OS crash (LMDB) or a
    *server* crash (PostgreSQL) can take the intent of the call in flight with it, so a
    resumed run asks the ``verify`` probe of the first call it makes afresh
    (:attr:`Store.intents_durable`; README, "Durability").

    ``durability`` (one of :data:`DURABILITIES`) is ``"sync"`` (fsync every commit), ``"group"``
    (concurrent commits share one fsync; same guarantee as sync) or
    ``"none"`` (no fsync: safe against process crashes only).  ``keep`` is
    how many newest snapshots per run retention keeps.  ``map_size`` (default
    1 GiB or ``$TCC_STORE_MAP_SIZE``) is the initial sparse map; it doubles
    on demand up to ``max_map_size`` (default 1 TiB or
    ``$TCC_STORE_MAX_MAP_SIZE``).  ``key`` (32 bytes or 64 hex digits; default
    ``$TCC_STORE_KEY_FILE`` or ``$TCC_STORE_KEY``) encrypts a new store and opens
    an encrypted one (docs/store.md, "Encryption at rest").

    Only a store no other user can change is opened: snapshots are pickles,
    and whoever can write a store's files can run code as whoever resumes
    from it.  The store directory, each file tcc keeps in it (``data.mdb``,
    ``lock.mdb``, ``secret``, ``verified``, ``tcc.lock``, ``initialised``)
    and each directory tcc creates on the way to it must be owned by the
    current user (or root) and writable by neither group nor others; those
    files must be regular files (never symbolic links, FIFOs or devices) with
    a single hard link, and anything else in the directory must be owned by
    the user (or root) too.  Otherwise the open raises
    :class:`~tcc.errors.StoreInsecureError` (a ``PermissionError``) naming
    the offending path and the fix (``find DIR -type d -exec chmod 700 {} +`` and the same
    with ``-type f`` and ``600``, or
    ``chown``).  Directories tcc creates are 0700 whatever the umask.  A
    store others can only *read* still opens, with a
    ``StoreSecurityWarning``.

    Shared-group deployments opt in with ``$TCC_STORE_SHARED_GROUP=GROUP``
    (a group name or number): then an entry may also be writable by its
    group if that group is GROUP and this process is a member of it, and may
    be owned by a member of GROUP (by primary group or the group's member
    list).  Every member of GROUP can then run code as every other user of
    the store, so name only a group whose members trust each other.  Writable
    by others is never allowed, and tcc itself still creates everything
    private (0700/0600): granting the group access is the deployment's job.
    """
    from ._crypt import resolve_key

    raw = os.fspath(path) if path is not None else os.environ.get("TCC_STORE") or ""
    store_key = resolve_key(key) if key_file is None or key is not None else _key_from_file(key_file)
    if is_postgres_url(raw):
        from ._postgres import PgStore

        return PgStore(raw, tenant=tenant, durability=durability, create=create, keep=keep,
                       key=store_key, sync_intents=bool(sync_intents))
    where = raw and os.path.abspath(raw) or default_path()
    return LmdbStore(where, tenant=tenant, durability=durability, create=create, keep=keep,
                     map_size=map_size, max_map_size=max_map_size, key=store_key,
                     sync_intents=bool(sync_intents))


def _key_from_file(path: str | os.PathLike[str]) -> _Any:
    from ._crypt import StoreKey, _read_key_file

    where = os.fspath(path)
    return StoreKey(_read_key_file(where, label=f"--key-file {where}"), where)


def init_store(
    path: str | os.PathLike[str] | None = None,
    *,
    key_file: str | os.PathLike[str] | None = None,
    tenant: str = "default",
) -> tuple[Store, bool]:
    """Create the store at ``path`` (a directory or a PostgreSQL URL) if it does not exist,
    and the key file ``key_file`` (64 random hex digits, mode 0600) if it is given and
    does not exist.  Returns the open store and whether a key file was created.

    A PostgreSQL store needs a key file: UsageError without one.  Creating a
    store that exists only checks that the key is its key.
    """
    from ..errors import UsageError

    raw = os.fspath(path) if path is not None else os.environ.get("TCC_STORE") or ""
    if key_file is None and is_postgres_url(raw):
        key_file = os.environ.get("TCC_STORE_KEY_FILE") or None
        if key_file is None:
            raise UsageError("a PostgreSQL store needs a key file: tcc init --store URL "
                             "--key-file PATH (the file is created if it does not exist)")
    made = False
    if key_file is not None:
        made = _make_key_file(os.fspath(key_file))
    from ._postgres import WrongKeyError

    try:
        store = open_store(raw or None, tenant=tenant, create=True, key_file=key_file)
    except WrongKeyError:
        # the store exists with another key, so this new one can never open it; any other
        # failure (a lost connection, say) leaves it: another `tcc init` may already have
        # created the store with it
        if made:
            os.unlink(os.fspath(key_file))  # type: ignore[arg-type]
        raise
    return store, made


def read_secret_file(path: str, name: str, *, unreadable: type[Exception] | None = None) -> bytes:
    """The first bytes of the key file ``path``, once it is checked to be a regular file of
    this user, closed to group and others (the rules of a store key file); ``name``: how
    messages call it; ``unreadable``: the error if it cannot be opened (StoreError)."""
    from ..errors import StoreError
    from ._crypt import read_secret_file as read

    return read(path, name, unreadable=unreadable or StoreError)


def write_key_file(path: str, name: str, *, error: type[Exception] | None = None,
                   make_folder: bool = False) -> bool:
    """Create ``path`` with a new random key (64 hex digits, mode 0600) unless it exists;
    True if created (never half-written: see ``_crypt.write_key_file``)."""
    from ..errors import StoreError
    from ._crypt import write_key_file as write

    return write(path, name, error=error or StoreError, make_folder=make_folder)


def _make_key_file(path: str) -> bool:
    """Create ``path`` with a new random key (mode 0600) unless it exists; True if created."""
    return write_key_file(path, f"the key file {path}")
