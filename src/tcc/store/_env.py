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
  write transaction (a closure that fails is taken out and the batch redone
  without it, so its partial writes never commit): N commits share one
  fsync, with exactly the guarantees of ``sync``.
* Opening a store checks, in this order: who may change it (``_trust``), the
  page structure of ``data.mdb`` (``_structure``), its databases and format
  header (``_format``, which also upgrades older formats).
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import lmdb

from ..errors import StoreCorruptError, StoreError, StoreFullError, TccError, UsageError
from ._api import DURABILITIES
from ._codec import DBS, SECRET_NAME, Corrupt, Sealer
from ._crypt import StoreKey
from ._format import check_format
from ._structure import check_databases, check_structure
from ._trust import LOCK_NAME, StoreDir, fsync_dir, mark_initialised, warn_if_exposed
from ._verified import Verdict

__all__ = ["EnvHandle", "acquire", "parse_size"]

T = TypeVar("T")
# how acquire() and EnvHandle() name the durability modes in their error message
_DURABILITY_CHOICES = ", ".join(repr(d) for d in DURABILITIES[:-1]) + f" or {DURABILITIES[-1]!r}"

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
    path: str, *, create: bool, durability: str, map_size: int | None, max_map_size: int | None,
    store_key: StoreKey | None = None,
) -> EnvHandle:
    """The process-wide handle for ``path``, opened on first use."""
    if durability not in DURABILITIES:  # before "already open with ..."
        raise UsageError(f"durability must be {_DURABILITY_CHOICES}, not {durability!r}")
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
            if (store_key is None) != (h.store_key is None) or (
                    store_key is not None and not store_key.same(h.store_key)):
                raise StoreError(
                    f"store {real} is already open in this process "
                    f"{'without a key' if h.store_key is None else 'with another key'}; "
                    "open it with the same key (TCC_STORE_KEY_FILE, TCC_STORE_KEY or key=)")
            h.users += 1
            return h
        h = EnvHandle(real, create=create, durability=durability, map_size=map_size,
                      max_map_size=max_map_size, store_key=store_key)
        _registry[key] = h
        return h


class _Retry(Exception):
    """Internal: redo a group batch without the closure that failed."""


class _Pending:
    __slots__ = ("fn", "result", "exc", "done")

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn
        self.result: Any = None
        self.exc: BaseException | None = None
        self.done = False


class EnvHandle:
    """An open LMDB environment plus everything needed to use it safely."""

    def __init__(
        self, path: str, *, create: bool, durability: str, map_size: int | None,
        max_map_size: int | None, store_key: StoreKey | None = None,
    ) -> None:
        if durability not in DURABILITIES:
            raise UsageError(  # a ValueError too
                f"durability must be {_DURABILITY_CHOICES}, not {durability!r}")
        self.path = path
        self.store_key = store_key  # encrypts a new store; an encrypted store needs it
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
        self._dir = StoreDir(path)
        has_data = self._dir.prepare(create)  # opens self._dir.fd, the directory it checked
        try:
            self._open_checked(create, has_data)
        finally:
            self._dir.close()
        if not has_data:
            fsync_dir(path)  # the secret's and data.mdb's directory entries are durable too
        warn_if_exposed(self._dir.exposed)

    # ------------------------------------------------------------------ opening
    def _open_checked(self, create: bool, has_data: bool) -> None:
        """Open the secret, the lock file and the environment of the directory
        ``self._dir`` checked, and check it once more."""
        path = self.path
        try:
            self.sealer = Sealer(self._dir.load_secret(create and not has_data))
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
            self._lockfd = os.open(LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                                   0o600, dir_fd=self._dir.fd)
        except OSError as exc:  # a read-only file system or directory
            raise StoreError(
                f"store {path}: cannot open its lock file {LOCK_NAME!r} for writing "
                f"({exc.strerror}); tcc needs write access to the store directory, even to "
                "read it (copy the store somewhere writable to inspect it)") from None
        fcntl.flock(self._lockfd, fcntl.LOCK_SH)
        self._downgrade_lock = False  # set while a format upgrade holds the lock exclusively
        try:
            self._open_env()
            self._dir.check_unchanged()
        except BaseException:  # a refused store: release it, so that a retry here can open it
            env = getattr(self, "env", None)
            if env is not None:
                env.close()
            self.verdict.close()
            os.close(self._lockfd)
            raise

    def _open_env(self) -> None:
        """Open the LMDB environment, check it (:func:`check_structure`, then its
        databases and format header) and open its databases as ``self.dbs``."""
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
                    self.walked = False
                    walked = check_structure(self.env, txn, path, self.sealer, self.verdict)
                    if walked is None:
                        continue  # writers moved on past the snapshot: look again
                    self.walked = walked
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
                        check_databases(txn, path)
                        for name in DBS:
                            self.dbs[name] = self.env.open_db(name.encode(), txn=txn, create=True)
                        self.sealer = check_format(
                            txn, self.dbs, self.sealer, path=path, store_key=self.store_key,
                            lockfd=self._lockfd, upgraded=self._hold_until_committed)
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
        mark_initialised(path)

    def _hold_until_committed(self) -> None:
        # an upgrade took the store to itself: share it again once the open commits
        self._downgrade_lock = True

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
            # (or writer lock) in lock.mdb and exposes its pages to reuse: keep the copy;
            # acquire() refuses this store in this child.
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
