"""The one place that opens LMDB: environment lifetime, growth, durability, errors.

* One :class:`EnvHandle` per store directory per process (a registry shares
  it between ``LmdbStore`` objects, e.g. of different tenants), because LMDB
  must never open the same environment twice in one process.
* A handle refuses to be used in a process other than the one that opened it
  (LMDB environments must not cross ``fork()``).
* Writes run as ``fn(txn)`` closures so that on ``MapFullError`` the
  transaction can be aborted, the map grown while no transaction of this
  process is open, and the closure simply re-run.  Closures therefore only
  read and write through ``txn``.
* ``group`` durability batches the closures of concurrent committers into one
  write transaction (each in a nested child transaction, so one failing
  closure rolls back alone): N commits share one fsync, with exactly the
  guarantees of ``sync``.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import lmdb

from ..errors import (StoreCorruptError, StoreError, StoreFullError, StoreNotFoundError, TccError,
                      UsageError)
from ._codec import RECORD_MIN, SECRET_NAME, Corrupt, Sealer, load_or_create_secret
from ._lmdbcheck import LmdbDamageError, check_data_file
from ._refs import head_key, is_head_key, seal_head
from ._verified import VERIFIED_NAME, Verdict

__all__ = ["DBS", "EnvHandle", "acquire", "parse_size"]

T = TypeVar("T")
DBS = ("meta", "runs", "journal", "snaps", "chunks", "signals", "events", "pins")
# Version 2 added inline payloads and pending-release lists to snapshot
# records (see _chunks and _refs); version 3 per-run head records: the list
# of snapshot numbers and the journal and event counts (_refs.head_key);
# version 4 hashes chunk addresses with keyed BLAKE3 instead of BLAKE2b
# (_codec.Sealer).  Version 1 and 2 stores are upgraded to version 3 on open;
# a version 3 store stays one (its chunk addresses are BLAKE2b).
FORMAT: dict[str, Any] = {"magic": "tcc-store", "version": 4}
_UPGRADABLE = (1, 2)
_CHUNK_HASH = {3: "blake2b", 4: "blake3"}  # format version -> chunk address hash


def _check_label(store_id: str, version: int) -> bytes:
    """What the header's ``check`` MAC covers: the store id and, from format 4 on, the
    version (which selects the chunk hash), so a version changed by damage is refused at
    open instead of failing every chunk (and letting gc count none of them)."""
    if version <= 3:
        return store_id.encode()
    return f"{store_id} format {version} chunk hash {_CHUNK_HASH[version]}".encode()
LOCK_NAME = "tcc.lock"
# Created once the store's format header is committed: from then on a missing
# or empty data.mdb means lost records, not a store still being created.
INIT_MARK = "initialised"
# data files up to this size get a full structural walk at open (~5 ms per 10 MiB)
FULL_CHECK_MAX = 256 << 20
# databases whose every value is a record sealed by _codec.Sealer
_SEALED = ("runs", "journal", "snaps", "signals", "events")
_OWN_FILES = {"data.mdb", "lock.mdb", SECRET_NAME, LOCK_NAME, INIT_MARK, VERIFIED_NAME}
DEFAULT_MAP_SIZE = 1 << 30
DEFAULT_MAX_MAP_SIZE = 1 << 40

_registry: dict[tuple[int, str], EnvHandle] = {}
_registry_lock = threading.Lock()
_kept_after_fork: set[str] = set()  # stores this forked child could not let go of


def _after_fork_in_child() -> None:
    # another thread of the parent may have held the lock at fork(): that thread does not
    # exist here, so the child starts with a free lock (it has only this thread)
    global _registry_lock
    _registry_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def parse_size(text: str | int) -> int:
    """``"64M"`` -> 67108864; plain integers are bytes."""
    if isinstance(text, int):
        return text
    s = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(s[-1:], 1)
    return int(float(s[:-1] if mult > 1 else s) * mult)


def acquire(
    path: str, *, create: bool, durability: str, map_size: int | None, max_map_size: int | None
) -> EnvHandle:
    """The process-wide handle for ``path``, opened on first use."""
    if durability not in ("sync", "group", "none"):  # before "already open with ..."
        raise UsageError(f"durability must be 'sync', 'group' or 'none', not {durability!r}")
    real = os.path.realpath(path)
    key = (os.getpid(), real)
    with _registry_lock:
        for inherited in [k for k in _registry if k[0] != os.getpid()]:
            if not _registry.pop(inherited).drop_after_fork():
                _kept_after_fork.add(inherited[1])
        if real in _kept_after_fork:
            raise StoreError(
                f"store {real} cannot be opened in this process: it was forked while another "
                "thread of the parent was inside a store call, and LMDB cannot release that copy "
                "safely here; fork() while no store call runs, or before opening the store")
        h = _registry.get(key)
        if h is not None and not h.closed:
            if h.durability != durability:
                raise StoreError(
                    f"store {real} is already open in this process with durability "
                    f"{h.durability!r}; open it with the same durability"
                )
            h.users += 1
            return h
        h = EnvHandle(real, create=create, durability=durability, map_size=map_size,
                      max_map_size=max_map_size)
        _registry[key] = h
        return h


def _stale_secret_tmp(path: str, name: str) -> bool:
    """A ``secret.<pid>.tmp`` left by a creator (killed, or still writing): ours, not foreign.

    One whose process is gone is removed.
    """
    parts = name.split(".")
    if len(parts) != 3 or parts[0] != SECRET_NAME or parts[2] != "tmp" or not parts[1].isdigit():
        return False
    try:
        os.kill(int(parts[1]), 0)
    except ProcessLookupError:
        try:
            os.unlink(os.path.join(path, name))
        except FileNotFoundError:
            pass
    except PermissionError:
        pass
    return True


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _warn_if_exposed(path: str) -> None:
    """Warn once per open when the store or its files are readable by others."""
    import stat
    import warnings

    exposed = []
    for name in ("", SECRET_NAME, "data.mdb"):
        full = os.path.join(path, name) if name else path
        try:
            mode = stat.S_IMODE(os.stat(full).st_mode)
        except FileNotFoundError:
            continue
        if mode & 0o077:
            exposed.append(f"{full} (mode {mode:o})")
    if exposed:
        warnings.warn(
            f"warning: tcc store files are accessible to other users: {', '.join(exposed)}; "
            "snapshots are pickles and the secret authenticates them -- chmod 700 the store "
            "directory and 600 its files",
            StoreSecurityWarning,
            stacklevel=4,
        )


class StoreSecurityWarning(UserWarning):
    """A store's files have permissions that expose snapshots or the secret."""


class StoreDamageWarning(UserWarning):
    """Housekeeping met a damaged run and left it as it is."""


class _Retry(Exception):
    """Internal: redo a group batch without the closure that failed."""


def _mark_initialised(path: str) -> None:
    """Create the INIT_MARK file (once): the format header is committed."""
    mark = os.path.join(path, INIT_MARK)
    if os.path.exists(mark):
        return
    try:
        os.close(os.open(mark, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        return
    except OSError:  # a read-only store directory: the check simply stays off
        return
    _fsync_dir(path)


class _Pending:
    __slots__ = ("fn", "result", "exc", "done")

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn
        self.result: Any = None
        self.exc: BaseException | None = None
        self.done = False


class _PageProbe:
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


class EnvHandle:
    """An open LMDB environment plus everything needed to use it safely."""

    def __init__(
        self, path: str, *, create: bool, durability: str, map_size: int | None,
        max_map_size: int | None,
    ) -> None:
        if durability not in ("sync", "group", "none"):
            raise UsageError(  # a ValueError too
                f"durability must be 'sync', 'group' or 'none', not {durability!r}")
        self.path = path
        self.durability = durability
        self.pid = os.getpid()
        self.users = 1
        self.closed = False
        self.map_size = map_size or parse_size(os.environ.get("TCC_STORE_MAP_SIZE", DEFAULT_MAP_SIZE))
        self.max_map_size = max_map_size or parse_size(
            os.environ.get("TCC_STORE_MAX_MAP_SIZE", DEFAULT_MAX_MAP_SIZE))
        self._wlock = threading.Lock()  # one writer per process (taken before the gate)
        self._gate = threading.Condition()  # readers/writers in txns vs. a resize
        self._active = 0
        self._resizing = False
        self._gcond = threading.Condition()  # group commit
        self._queue: list[_Pending] = []
        self._leader = False
        self._writes = 0
        self._last_reader_check = time.monotonic()
        self.walked = False  # whether the last open walked data.mdb (tests and benchmarks ask)
        has_data = self._prepare_dir(create)
        try:
            self.sealer = Sealer(load_or_create_secret(path, create and not has_data))
        except Corrupt as exc:
            raise StoreCorruptError(f"store {path}: {exc}; restore the secret from a backup") from None
        except FileNotFoundError:
            raise StoreCorruptError(
                f"{path} has a data file but no '{SECRET_NAME}' file: it is not a tcc store, or "
                "its secret was lost and nothing in it can be verified; restore the secret file "
                "from a backup or choose another path"
            ) from None
        self.verdict = Verdict(path, self.sealer)
        try:
            self._lockfd = os.open(os.path.join(path, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:  # a read-only file system or directory
            raise StoreError(
                f"store {path}: cannot open its lock file {LOCK_NAME!r} for writing "
                f"({exc.strerror}); tcc needs write access to the store directory, even to "
                "read it (copy the store somewhere writable to inspect it)") from None
        fcntl.flock(self._lockfd, fcntl.LOCK_SH)
        self._downgrade_lock = False  # set while a format upgrade holds the lock exclusively
        try:
            self._open_env()
        except BaseException:  # a refused store: release it, so that a retry here can open it
            env = getattr(self, "env", None)
            if env is not None:
                env.close()
            self.verdict.close()
            os.close(self._lockfd)
            raise
        if not has_data:
            _fsync_dir(path)  # the secret's and data.mdb's directory entries are durable too
        _warn_if_exposed(path)

    # ------------------------------------------------------------------ opening
    def _prepare_dir(self, create: bool) -> bool:
        path = self.path
        if os.path.exists(path) and not os.path.isdir(path):
            raise StoreCorruptError(f"store path {path} is a file, not a store directory; "
                                    "choose another path (TCC_STORE)")
        data = os.path.join(path, "data.mdb")
        has_data = os.path.exists(data)
        if os.path.exists(os.path.join(path, INIT_MARK)):
            size = os.path.getsize(data) if has_data else None
            if size is None or size < 2 * mmap.PAGESIZE:  # not even LMDB's two meta pages
                what = "is missing" if size is None else f"is empty ({size} bytes)"
                raise StoreCorruptError(
                    f"the data file {data} {what}, but store {path} was initialised: its runs "
                    "and snapshots are gone. Restore data.mdb from a backup, or delete the store "
                    "directory to start over")
        if not has_data and not create:
            raise StoreNotFoundError(
                f"no tcc store at {path}: nothing was stored there yet (`tcc run` or "
                "open_store(create=True) creates it); or pass --store or set TCC_STORE to an "
                "existing store")
        if not os.path.isdir(path):
            os.makedirs(path, mode=0o700, exist_ok=True)
            os.chmod(path, 0o700)
        elif not has_data:
            foreign = {name for name in set(os.listdir(path)) - _OWN_FILES
                       if not _stale_secret_tmp(path, name)}
            if foreign:
                raise StoreCorruptError(
                    f"{path} is not empty and is not a tcc store (it holds {sorted(foreign)[:3]}); "
                    "choose an empty or new directory")
            os.chmod(path, 0o700)  # a new store in an existing empty directory
        return has_data

    def _open_env(self) -> None:
        path = self.path
        try:
            self.env = lmdb.open(
                path, map_size=self.map_size, subdir=True, max_dbs=len(DBS) + 2, mode=0o600,
                sync=self.durability != "none", metasync=True, readahead=False, lock=True,
            )
        except lmdb.InvalidError as exc:
            raise StoreCorruptError(f"{path}/data.mdb is not an LMDB file ({exc}); it is foreign "
                                    "or damaged: move it away or restore a backup") from None
        except (lmdb.VersionMismatchError, lmdb.CorruptedError) as exc:
            raise StoreCorruptError(f"store {path} is unreadable ({exc}); restore a backup") from None
        except lmdb.Error as exc:
            raise StoreError(f"cannot open store {path}: {exc}") from None
        self.env.reader_check()
        self.map_size = self.env.info()["map_size"]
        self.dbs: dict[str, Any] = {}
        for _attempt in range(8):
            try:
                # One read txn for both facts: another process may be initialising
                # the store right now, and mixing snapshots misjudges it as foreign.
                with self.env.begin() as txn:  # look before writing anything into a foreign file
                    # Before LMDB touches a tree page: a damaged page kills the
                    # process (SIGBUS/SIGABRT) instead of raising.  The read txn
                    # pins the pages of the snapshot being checked.
                    if not self._check_structure(txn):
                        continue  # writers moved on past the snapshot: look again
                    entries = txn.stat()["entries"]
                    is_ours = txn.get(b"meta") is not None
                break
            except lmdb.MapResizedError:  # another process grew the map: adopt its size
                self.env.set_mapsize(0)
                self.map_size = self.env.info()["map_size"]
        else:
            self.env.close()
            raise StoreError(f"cannot open store {path}: it changed under every attempt to check it")
        if entries and not is_ours:
            self.env.close()
            raise StoreCorruptError(f"{path} is an LMDB database but not a tcc store; "
                                    "choose another path")
        try:
            for _attempt in range(8):
                try:
                    with self.env.begin(write=True) as txn:
                        self._check_databases(txn)
                        for name in DBS:
                            self.dbs[name] = self.env.open_db(name.encode(), txn=txn, create=True)
                        self._check_format(txn)
                        vouched = self.verdict.before_commit()
                        txnid = txn.id()
                    if vouched:
                        self._vouch(txnid)
                    break
                except lmdb.MapResizedError:
                    self.env.set_mapsize(0)
                    self.map_size = self.env.info()["map_size"]
        except (lmdb.IncompatibleError, lmdb.CorruptedError, lmdb.PageNotFoundError) as exc:
            self.env.close()
            raise StoreCorruptError(f"{path} is an LMDB database but not a tcc store ({exc}); "
                                    "choose another path") from None
        finally:
            if self._downgrade_lock:  # an upgrade held the store alone: share it again
                fcntl.flock(self._lockfd, fcntl.LOCK_SH)
                self._downgrade_lock = False
        _mark_initialised(path)

    def _check_structure(self, txn: Any) -> bool:
        """Verify data.mdb's page structure for ``txn``'s snapshot (False: look again).

        ``TCC_STORE_CHECK``: ``auto`` (default: a full walk up to
        FULL_CHECK_MAX bytes, the cheap checks beyond; no walk if the verdict
        file vouches for the file as it is, see ``_verified``), ``full`` (walk
        at every open), ``quick`` or ``off``.  Raises StoreCorruptError (and
        closes the environment) on damage.
        """
        mode = os.environ.get("TCC_STORE_CHECK", "auto")
        if mode not in ("auto", "full", "quick", "off"):
            self.env.close()
            raise StoreError(f"TCC_STORE_CHECK must be auto, full, quick or off, not {mode!r}")
        self.verdict.reset()
        self.walked = False
        if mode == "off":
            return True
        data = os.path.join(self.path, "data.mdb")
        probe = _PageProbe(self.sealer)
        try:
            vouched = mode == "auto" and self.verdict.matches()
            before = None if vouched else self.verdict.state()  # what a passing walk vouches for
            full = mode == "full" or (mode == "auto" and not vouched
                                      and os.path.getsize(data) <= FULL_CHECK_MAX)
            check_data_file(data, txnid=txn.id(), full=full, probe=probe)
            probe.verdict(data)
            self.walked = full
            if full and not vouched:
                self.verdict.walked(before)
        except LookupError:  # two commits replaced the meta page of this txn's snapshot
            return False
        except (LmdbDamageError, OSError) as exc:
            txn.abort()
            self.env.close()
            raise StoreCorruptError(
                f"store {self.path}: data.mdb is damaged ({exc}); nothing was read from it. "
                "Restore the store from a backup; `tcc gc --compact` on a copy may salvage "
                "what is intact") from None
        return True

    def _check_databases(self, txn: Any) -> None:
        """A formatted store has exactly its named databases: flipped bits in a name
        would otherwise make LMDB create a new, empty database in its place."""
        names = {bytes(k) for k in txn.cursor().iternext(values=False)}
        if b"meta" not in names:
            return  # a new store (or a foreign file, refused after this)
        missing = sorted(n for n in DBS if n.encode() not in names)
        unknown = sorted(names - {n.encode() for n in DBS})
        if missing or unknown:
            raise StoreCorruptError(
                f"store {self.path}: data.mdb is damaged: database(s) {missing} are missing"
                + (f" and {[u.decode('ascii', 'replace') for u in unknown]} are unknown" if unknown else "")
                + " (damage renamed or lost them); restore the store from a backup")

    def _check_format(self, txn: Any) -> None:
        import json

        raw = txn.get(b"format", db=self.dbs["meta"])
        if raw is None:
            if txn.stat(self.dbs["runs"])["entries"] or txn.stat(self.dbs["snaps"])["entries"]:
                raise StoreCorruptError(f"store {self.path} has records but no format header")
            store_id = os.urandom(16).hex()
            hdr = {**FORMAT, "store_id": store_id, "created": time.time(),
                   "check": self.sealer.check_tag(_check_label(store_id, FORMAT["version"])).hex()}
            txn.put(b"format", json.dumps(hdr).encode(), db=self.dbs["meta"])
            self.sealer = self.sealer.with_chunk_hash(_CHUNK_HASH[FORMAT["version"]])
            return
        try:
            hdr = json.loads(bytes(raw))
        except (ValueError, RecursionError):
            hdr = {}
        if not isinstance(hdr, dict):  # damage can leave any JSON value
            hdr = {}
        if hdr.get("magic") != FORMAT["magic"]:
            raise StoreCorruptError(f"{self.path} holds a foreign LMDB database, not a tcc store")
        if hdr.get("version") in _UPGRADABLE:  # everything v1 and v2 wrote, v3 reads the same way
            # An older tcc still running on the store would keep writing records
            # without head records: upgrade only with the store to ourselves.
            try:
                fcntl.flock(self._lockfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                fcntl.flock(self._lockfd, fcntl.LOCK_SH)  # (a failed conversion may drop it)
                raise StoreError(
                    f"store {self.path} has format version {hdr.get('version')} and this tcc "
                    "upgrades it to version 3 when it is open in no other "
                    "process: stop the other tcc processes using it (they may run an older "
                    "tcc) and try again") from None
            self.sealer = self.sealer.with_chunk_hash(_CHUNK_HASH[3])  # its chunks stay BLAKE2b
            self._index_snapshots(txn)
            hdr["version"] = 3
            txn.put(b"format", json.dumps(hdr).encode(), db=self.dbs["meta"])
            self._downgrade_lock = True
        version: Any = hdr.get("version")
        chunk_hash = _CHUNK_HASH.get(version) if type(version) is int else None
        if chunk_hash is None:
            raise StoreCorruptError(f"store {self.path} has format version {hdr.get('version')}; "
                                    f"this tcc reads versions 1 to {FORMAT['version']}: upgrade tcc")
        self.sealer = self.sealer.with_chunk_hash(chunk_hash)
        store_id = str(hdr.get("store_id"))
        if hdr.get("check") != self.sealer.check_tag(_check_label(store_id, version)).hex():
            written = [v for v in _CHUNK_HASH if v != version and hdr.get("check")
                       == self.sealer.check_tag(_check_label(store_id, v)).hex()]
            if written:  # the version picks the chunk hash: reading on would fail every chunk
                raise StoreCorruptError(
                    f"store {self.path}: its format header says version {version} but the store "
                    f"was written as version {written[0]} (damage changed the header); restore "
                    "the store from a backup")
            raise StoreCorruptError(f"the secret file of store {self.path} does not belong to it; "
                                    "restore the original secret file")

    def _index_snapshots(self, txn: Any) -> None:
        """Write the head records (the upgrade to format 3): per run the index of
        its snapshot numbers with its journal length (a journal head instead
        if it has no snapshot), its event and signal counts; per tenant its
        run count."""
        heads: dict[str, dict[bytes, list[int]]] = {}
        for db in ("snaps", "journal", "events", "signals", "runs"):
            found = heads[db] = {}
            with txn.cursor(db=self.dbs[db]) as cur:
                for key in cur.iternext(values=False):
                    key = bytes(key)
                    if is_head_key(db, key):
                        continue
                    if db in ("signals", "runs"):  # counted: runs per tenant, signals per run
                        cut = key.index(b"\x00") + 1
                        if db == "signals":
                            cut = key.index(b"\x00", cut) + 1
                        found.setdefault(key[:cut], []).append(0)
                    else:
                        found.setdefault(key[:-8], []).append(int.from_bytes(key[-8:], "big"))

        def put(db: str, pfx: bytes, n: Any) -> None:
            txn.put(head_key(db, pfx), seal_head(self.sealer, db, pfx, n), db=self.dbs[db])

        journals = {pfx: max(seqs) + 1 for pfx, seqs in heads["journal"].items()}
        for pfx, numbers in heads["snaps"].items():
            put("snaps", pfx, {"n": sorted(numbers), "j": journals.pop(pfx, 0)})
        for pfx, jlen in journals.items():  # runs without a snapshot yet
            put("journal", pfx, jlen)
        for pfx, seqs in heads["events"].items():
            put("events", pfx, max(seqs) + 1)
        for db in ("signals", "runs"):
            for pfx, members in heads[db].items():
                put(db, pfx, len(members))

    # ------------------------------------------------------------------ guards
    def check(self) -> None:
        """Refuse use after close or across fork."""
        if os.getpid() != self.pid:
            raise StoreError(
                f"store {self.path} was opened in process {self.pid} and used in process "
                f"{os.getpid()} after fork(); LMDB environments must not cross fork(): call "
                "open_store() again in the child")
        if self.closed:
            raise StoreError(f"store {self.path} is closed; open it again with open_store()")

    def drop_after_fork(self) -> bool:
        """In a forked child: let go of the parent's environment, so the child can open its own.

        py-lmdb refuses to open files an environment of this process has open,
        and the child inherited the parent's.  Closing that copy is safe when no
        transaction was open at fork(): LMDB then clears only reader slots of
        the closing process (the parent's stay), its fcntl locks belong to the
        parent, and the flock on ``tcc.lock`` is shared with the parent's
        descriptor, which stays open (never unlocked).  Returns False, and
        keeps the copy, if a transaction was open.
        """
        assert os.getpid() != self.pid
        self.closed = True
        if self._active:
            # A thread of the parent was inside a transaction at fork(). Closing the copy
            # would abort that transaction here, which writes to the parent's reader slot
            # (or writer lock) in lock.mdb and exposes its pages to reuse (review finding).
            # Keep the copy; acquire() refuses this store in this child.
            return False
        try:
            self.env.close()  # no transaction: releases only this child's mapping and files
        except lmdb.Error:
            pass
        try:
            os.close(self._lockfd)
        except OSError:
            pass
        self.verdict.close()
        return True

    def _enter(self) -> None:
        with self._gate:
            while self._resizing:
                self._gate.wait()
            self._active += 1

    def _exit(self) -> None:
        with self._gate:
            self._active -= 1
            self._gate.notify_all()

    def _resize(self, grow: bool) -> None:
        """Grow the map (or adopt another process's growth) with no txn open here."""
        with self._gate:
            self._resizing = True
            while self._active:
                self._gate.wait()
            try:
                if grow:
                    current = self.env.info()["map_size"]
                    if current >= self.max_map_size:
                        raise StoreFullError(
                            f"store {self.path} reached its maximum map size of {current} bytes; "
                            "nothing was lost; raise TCC_STORE_MAX_MAP_SIZE or run `tcc gc`")
                    self.env.set_mapsize(min(current * 2, self.max_map_size))
                else:
                    self.env.set_mapsize(0)
                self.map_size = self.env.info()["map_size"]
            finally:
                self._resizing = False
                self._gate.notify_all()

    def translate(self, exc: BaseException) -> BaseException:
        """Map an LMDB/OS exception to a tcc error naming the store and the remedy."""
        if isinstance(exc, TccError):
            return exc
        msg = str(exc)
        eno = getattr(exc, "errno", None)
        if isinstance(exc, lmdb.DiskError) or eno in (errno.ENOSPC, errno.EIO, errno.EFBIG) or any(
            s in msg for s in ("Input/output error", "No space left", "File too large")
        ):
            return StoreFullError(
                f"store {self.path}: the disk is full or failing ({msg}); this write was not "
                "committed and everything committed before is intact: free disk space and retry")
        if isinstance(exc, (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.InvalidError,
                            lmdb.VersionMismatchError, lmdb.BadValsizeError)):
            return StoreCorruptError(f"store {self.path} is damaged ({msg}); restore a backup")
        return StoreError(f"store {self.path}: {type(exc).__name__}: {msg}")

    # ------------------------------------------------------------------ txns
    def read(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(txn)`` in a read transaction."""
        self.check()
        for _ in range(8):
            self._enter()
            try:
                with self.env.begin(buffers=False) as txn:
                    return fn(txn)
            except lmdb.MapResizedError:
                pass
            except lmdb.Error as exc:
                raise self.translate(exc) from exc
            finally:
                self._exit()
            self._resize(grow=False)
        raise StoreError(f"store {self.path}: map size kept changing under this reader")

    def write(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(txn)`` in a write transaction and commit it durably (per mode)."""
        self.check()
        if self.durability != "group":
            with self._wlock:
                return self._run([fn])[0]  # type: ignore[no-any-return]
        return self._group(fn)

    def _run(self, fns: list[Callable[[Any], Any]], nested: bool = False) -> list[Any]:
        """Commit ``fns`` in one txn.

        With ``nested`` (group commit), results are ``(ok, value)`` pairs and a
        closure that raises is taken out of the batch, which is then redone
        from scratch without it, so its partial writes never commit.
        """
        failed: dict[int, BaseException] = {}
        todo: list[Callable[[Any], Any] | None] = list(fns)
        while True:
            grow = False
            self._enter()
            try:
                txn = self.env.begin(write=True)
                try:
                    if nested:
                        out: list[Any] = [None] * len(todo)
                        for i, fn in enumerate(todo):
                            if fn is None:
                                continue
                            try:
                                out[i] = (True, fn(txn))
                            except lmdb.Error:
                                raise
                            except Exception as exc:
                                # this closure may have written part of its work: drop the
                                # whole txn and redo the batch without it (failures are rare:
                                # fencing, missing runs)
                                todo[i] = None
                                failed[i] = exc
                                raise _Retry() from None
                    else:
                        out = [fn(txn) for fn in fns]
                    vouched = self.verdict.before_commit()  # no other commit can come between
                    txnid = txn.id()
                    txn.commit()
                except BaseException:
                    txn.abort()
                    raise
                if vouched:
                    self._vouch(txnid)
                self._after_commit()
                if nested:
                    for i, err in failed.items():
                        out[i] = (False, err)
                return out
            except _Retry:
                continue
            except lmdb.MapFullError:
                grow = True
            except lmdb.MapResizedError:
                pass
            except lmdb.Error as exc:
                raise self.translate(exc) from exc
            finally:
                self._exit()
            self._resize(grow=grow)

    def _vouch(self, txnid: int) -> None:
        """Record the verdict after commit ``txnid`` (see ``_verified``), unless another
        transaction committed since: this handle cannot vouch for what that one wrote.
        (A write transaction that changed nothing commits no txnid; then the file must
        simply be unchanged.)"""
        try:
            if self.env.info()["last_txnid"] == txnid or self.verdict.unchanged():
                self.verdict.record()
        except Exception:  # noqa: BLE001 -- the commit succeeded: never report it as failed
            self.verdict.trusted = False

    def _after_commit(self) -> None:
        self._writes += 1
        if self._writes % 1024 == 0 and time.monotonic() - self._last_reader_check > 60:
            self._last_reader_check = time.monotonic()
            self.env.reader_check()

    def _group(self, fn: Callable[[Any], T]) -> T:
        me = _Pending(fn)
        with self._gcond:
            self._queue.append(me)
            while not me.done and self._leader:
                self._gcond.wait()
            if not me.done:
                self._leader = True
        if not me.done:
            try:
                with self._wlock:
                    with self._gcond:
                        batch, self._queue = self._queue, []
                    try:
                        outs = self._run([p.fn for p in batch], nested=True)
                        for p, (ok, val) in zip(batch, outs):
                            if ok:
                                p.result = val
                            else:
                                p.exc = val
                    except BaseException as exc:
                        for p in batch:
                            p.exc = exc
                    for p in batch:
                        p.done = True
            finally:
                with self._gcond:
                    self._leader = False
                    self._gcond.notify_all()
        if me.exc is not None:
            raise me.exc
        return me.result  # type: ignore[no-any-return]

    # ------------------------------------------------------------------ admin
    def file_size(self) -> int:
        """Bytes the data file occupies on disk."""
        st = os.stat(os.path.join(self.path, "data.mdb"))
        return int(st.st_blocks * 512)

    def compact(self) -> tuple[int, int]:
        """Copy the store compacted and swap it in; needs exclusive use of the store."""
        self.check()
        import shutil

        with self._wlock:
            try:
                fcntl.flock(self._lockfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise StoreError(
                    f"store {self.path} is open in another process; stop the other processes "
                    "and compact again (`tcc gc --compact`)") from None
            try:
                before = self.file_size()
                # With the exclusive lock no other compaction is running: any
                # compact.* left here is the copy of one that was killed.
                for name in os.listdir(self.path):
                    if name.startswith("compact."):
                        shutil.rmtree(os.path.join(self.path, name), ignore_errors=True)
                tmp = os.path.join(self.path, f"compact.{os.getpid()}")
                os.mkdir(tmp, 0o700)
                try:
                    self._enter()
                    try:
                        self.env.copy(tmp, compact=True)
                    finally:
                        self._exit()
                    fd = os.open(os.path.join(tmp, "data.mdb"), os.O_RDONLY)
                    try:
                        os.fchmod(fd, 0o600)
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                    with self._gate:
                        self._resizing = True
                        while self._active:
                            self._gate.wait()
                    try:
                        self.env.close()
                        os.replace(os.path.join(tmp, "data.mdb"), os.path.join(self.path, "data.mdb"))
                        dfd = os.open(self.path, os.O_RDONLY)
                        try:
                            os.fsync(dfd)
                        finally:
                            os.close(dfd)
                        self._open_env()
                    finally:
                        with self._gate:
                            self._resizing = False
                            self._gate.notify_all()
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
                return before, self.file_size()
            finally:
                fcntl.flock(self._lockfd, fcntl.LOCK_SH)

    def release(self) -> None:
        """Drop one user; close the environment when the last one goes."""
        with _registry_lock:
            if self.closed:
                return
            self.users -= 1
            if self.users > 0:
                return
            self.closed = True
            _registry.pop((self.pid, self.path), None)
        if os.getpid() != self.pid:
            return  # never touch an inherited environment
        if self.durability == "none":
            try:
                self.env.sync(True)
            except lmdb.Error:
                pass
        self.env.close()
        self.verdict.close()
        os.close(self._lockfd)
