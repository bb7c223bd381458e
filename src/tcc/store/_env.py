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
* A store is opened only if no other user can change it (:class:`_Trust`):
  snapshots are pickles, so whoever can write a store's files can run code as
  whoever resumes from it.  The directory is checked through a descriptor
  (``O_NOFOLLOW``), and the secret is read through that same descriptor, so a
  directory swapped in after the check cannot supply it; directories tcc
  creates are 0700 whatever the umask.
"""

from __future__ import annotations

import errno
import fcntl
import grp
import mmap
import os
import pwd
import stat
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import lmdb

from ..errors import (StoreCorruptError, StoreError, StoreFullError, StoreInsecureError,
                      StoreNotFoundError, TccError, UsageError)
from ._codec import RECORD_MIN, SECRET_NAME, Corrupt, Sealer
from ._crypt import StoreKey, new_header, open_header, refuse_plain
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
# A store created with a key is format 4 with records and chunks encrypted (_crypt);
# its header says so in the version, so that a tcc without encryption refuses it
# ("format version 4-encrypted ... upgrade tcc") instead of writing plain records into it.
ENCRYPTED_FORMAT = "4-encrypted"
_UPGRADABLE = (1, 2)
_CHUNK_HASH = {3: "blake2b", 4: "blake3"}  # format version -> chunk address hash


def _check_label(store_id: str, version: int, encrypted: bool = False) -> bytes:
    """What the header's ``check`` MAC covers: the store id and, from format 4 on, the
    version (which selects the chunk hash), so a version changed by damage is refused at
    open instead of failing every chunk (and letting gc count none of them); and whether
    the store is encrypted."""
    if version <= 3:
        return store_id.encode()
    label = f"{store_id} format {version} chunk hash {_CHUNK_HASH[version]}"
    return (label + " encrypted").encode() if encrypted else label.encode()
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
    path: str, *, create: bool, durability: str, map_size: int | None, max_map_size: int | None,
    store_key: StoreKey | None = None,
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


SHARED_GROUP_ENV = "TCC_STORE_SHARED_GROUP"
_WHY_TRUST = ("snapshots are pickles, which run code when they are loaded, so tcc opens only a "
              "store that no other user can change")


def _secret_tmp_pid(name: str) -> int | None:
    """The creator's pid if ``name`` is a secret temp file (``secret.<pid>.<random>.tmp``,
    or ``secret.<pid>.tmp`` as older versions named it), else None."""
    parts = name.split(".")
    if (len(parts) not in (3, 4) or parts[0] != SECRET_NAME or parts[-1] != "tmp"
            or not parts[1].isdigit()):
        return None
    return int(parts[1])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _kind(mode: int) -> str:
    for test, what in ((stat.S_ISLNK, "symbolic link"), (stat.S_ISDIR, "directory"),
                       (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"),
                       (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device")):
        if test(mode):
            return what
    return "special file"


class _Trust:
    """Whom a store may belong to: the rule :func:`tcc.store.open_store` documents.

    Every store directory, every file tcc keeps in it (``data.mdb``,
    ``lock.mdb``, ``secret``, ``verified``, ``tcc.lock``, ``initialised``)
    and every directory tcc creates on the way to it must be owned by the
    current (effective) user or root, writable by no other user, and -- the
    files -- regular files with a single link.  Any other entry in the
    directory must be owned by the user or root too.

    ``TCC_STORE_SHARED_GROUP=GROUP`` (a group name or number) opts in to one
    exception, for deployments where the members of one group share a store:
    an entry may then be writable by its group if that group is GROUP and
    the current process is a member of it, and may be owned by a member of
    GROUP (whose primary group it is, or who is listed in it).  Everybody in
    GROUP can then run code as everybody else who uses the store.  Writable
    by others than owner and group is never allowed.
    """

    __slots__ = ("uid", "gid", "name", "member", "members")

    def __init__(self) -> None:
        self.uid = os.geteuid()
        self.gid: int | None = None
        self.name = ""
        self.member = False
        self.members: set[str] = set()
        value = os.environ.get(SHARED_GROUP_ENV, "").strip()
        if not value:
            return
        try:
            entry = grp.getgrgid(int(value)) if value.isdigit() else grp.getgrnam(value)
        except (KeyError, OverflowError):
            raise StoreInsecureError(
                f"{SHARED_GROUP_ENV}={value!r} names no group of this system; set it to the "
                "name (or number) of the group that shares the store, or unset it") from None
        self.gid, self.name, self.members = entry.gr_gid, entry.gr_name, set(entry.gr_mem)
        self.member = self.gid == os.getegid() or self.gid in os.getgroups()

    def owner_ok(self, uid: int) -> bool:
        if uid in (self.uid, 0):
            return True
        if self.gid is None or not self.member:
            return False
        try:
            who = pwd.getpwuid(uid)
        except KeyError:
            return False
        return who.pw_gid == self.gid or who.pw_name in self.members

    def group_ok(self, gid: int) -> bool:
        """Whether an entry of group ``gid`` may be writable by that group."""
        return self.gid is not None and self.member and gid == self.gid

    def problem(self, st: os.stat_result, full: str, *, kind: str,
                spare_links: int = 0) -> tuple[str, str] | None:
        """Why ``full`` (``st`` from lstat/fstat) must not be trusted, with its fix; None if
        it may be.  ``kind``: "dir" (a store directory or one tcc created on the way),
        "file" (one of tcc's files) or "entry" (anything else in the store directory).
        ``spare_links``: how many of a file's links are known to be harmless."""
        mode = stat.S_IMODE(st.st_mode)
        if kind == "dir" and not stat.S_ISDIR(st.st_mode):
            return f"{full} is a {_kind(st.st_mode)}, not a directory", "choose another path"
        if kind == "file" and not stat.S_ISREG(st.st_mode):
            what = ("is a symbolic link, which tcc never follows inside a store"
                    if stat.S_ISLNK(st.st_mode)
                    else f"is not a regular file (it is a {_kind(st.st_mode)})")
            return f"{full} {what}", "put the store's real file there (restore it from a backup)"
        # a store shared with a group of this user's on purpose? the opt-in is the way
        shared = (f"+{_group(st.st_gid)}" if self.gid is None and mode & 0o020
                  and (st.st_gid == os.getegid() or st.st_gid in os.getgroups()) else "")
        if not self.owner_ok(st.st_uid):
            why = (f"{full} is owned by {_user(st.st_uid)} (uid {st.st_uid}), not by you "
                   f"({_user(self.uid)})")
            if self.gid is not None:
                why += (f", and you are not a member of {SHARED_GROUP_ENV}={self.name}"
                        if not self.member else f" nor by a member of group {self.name}")
            return why, "owner" + shared
        if kind == "entry":
            return None
        if mode & 0o002:
            return f"{full} is writable by other users (mode {mode:03o})", "mode"
        if mode & 0o020 and not self.group_ok(st.st_gid):
            why = f"{full} is writable by group {_group(st.st_gid)} (mode {mode:03o})"
            if self.gid is None:
                return why, "mode" + (shared or "+GROUP")
            if not self.member:
                return (f"{why}, and you are not a member of {SHARED_GROUP_ENV}={self.name}"), "mode"
            return f"{why}, not by the shared group {self.name} ({SHARED_GROUP_ENV})", "mode"
        if kind == "file" and st.st_nlink - spare_links != 1:
            return (f"{full} has {st.st_nlink} hard links, so it can be changed through another "
                    "name", f"give it a copy of its own: cp -p {full} {full}.copy && "
                    f"mv {full}.copy {full}")
        return None

    def refuse(self, store: str, problem: tuple[str, str]) -> StoreInsecureError:
        """The error for ``problem``: one line, saying why and what fixes it."""
        why, fix = problem
        me = _user(self.uid)
        modes = f"chmod 700 {store} && chmod 600 {store}/*"
        kind, _, group = fix.partition("+")
        if kind == "owner":
            fix = (f"if you trust its contents, take it over: chown -R {me} {store} && {modes}; "
                   "otherwise move it away")
        elif kind == "mode":
            fix = f"fix: {modes}"
        if group:  # "owner+GROUP", "mode+GROUP"
            fix += (f" (or, if the store is shared with group {group} on purpose and you trust "
                    f"its members, set {SHARED_GROUP_ENV}={group})")
        return StoreInsecureError(f"store {store} is not safe to use: {why}; {_WHY_TRUST}. "
                                  f"{fix[0].upper()}{fix[1:]}")


def _open_dir(path: str, trust: _Trust, store: str) -> int:
    """``path`` opened as a directory, never through a symbolic link as its last part."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise StoreError(f"cannot open the store directory {path}: {exc.strerror}") from None
    try:  # replaced since it was looked at (by someone who can write its parent)
        problem = trust.problem(os.lstat(path), path, kind="dir")
    except OSError:
        problem = None
    raise trust.refuse(store, problem or (f"{path} is not a directory", "choose another path"))


def _make_private_dirs(path: str, trust: _Trust) -> None:
    """Create ``path`` and its missing parents, each 0700 whatever the umask, and check them.

    ``os.makedirs`` gives parents the umask's mode: under umask 000 another
    user could then rename the store away and put their own in its place.
    """
    missing = []
    p = path
    while not os.path.lexists(p):
        missing.append(p)
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
            made = True
        except FileExistsError:  # made meanwhile (say, by another tcc): checked all the same
            made = False
        except OSError as exc:
            raise StoreError(f"cannot create the store directory {d}: {exc.strerror}") from None
        fd = _open_dir(d, trust, path)
        try:
            st = os.fstat(fd)
            problem = trust.problem(st, d, kind="dir")
            if problem is not None:
                raise trust.refuse(path, problem)
            if made and stat.S_IMODE(st.st_mode) != 0o700:
                os.fchmod(fd, 0o700)  # the umask may have taken the owner's bits too
        finally:
            os.close(fd)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _warn_if_exposed(exposed: list[str]) -> None:
    """Warn once per open when the store or its files are readable by others."""
    import warnings

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
        max_map_size: int | None, store_key: StoreKey | None = None,
    ) -> None:
        if durability not in ("sync", "group", "none"):
            raise UsageError(  # a ValueError too
                f"durability must be 'sync', 'group' or 'none', not {durability!r}")
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
        self._trust = _Trust()
        self._exposed: list[str] = []
        has_data = self._prepare_dir(create)  # opens self._dirfd, the directory it checked
        try:
            self._open_checked(create, has_data)
        finally:
            os.close(self._dirfd)
        if not has_data:
            _fsync_dir(path)  # the secret's and data.mdb's directory entries are durable too
        _warn_if_exposed(self._exposed)

    # ------------------------------------------------------------------ opening
    def _open_checked(self, create: bool, has_data: bool) -> None:
        """Open the secret, the lock file and the environment of the directory
        :meth:`_prepare_dir` checked (``self._dirfd``), and check it once more."""
        path = self.path
        try:
            self.sealer = Sealer(self._load_secret(create and not has_data))
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
                                   0o600, dir_fd=self._dirfd)
        except OSError as exc:  # a read-only file system or directory
            raise StoreError(
                f"store {path}: cannot open its lock file {LOCK_NAME!r} for writing "
                f"({exc.strerror}); tcc needs write access to the store directory, even to "
                "read it (copy the store somewhere writable to inspect it)") from None
        fcntl.flock(self._lockfd, fcntl.LOCK_SH)
        self._downgrade_lock = False  # set while a format upgrade holds the lock exclusively
        try:
            self._open_env()
            self._check_unchanged()
        except BaseException:  # a refused store: release it, so that a retry here can open it
            env = getattr(self, "env", None)
            if env is not None:
                env.close()
            self.verdict.close()
            os.close(self._lockfd)
            raise

    def _prepare_dir(self, create: bool) -> bool:
        """Find (or create) the store directory, open it as ``self._dirfd`` and check that
        only this user can change it and what it holds (:class:`_Trust`); whether it
        holds a data file."""
        path, trust = self.path, self._trust
        try:
            st: os.stat_result | None = os.stat(path)
        except FileNotFoundError:
            st = None
        if st is not None and not stat.S_ISDIR(st.st_mode):
            raise StoreCorruptError(f"store path {path} is a file, not a store directory; "
                                    "choose another path (TCC_STORE)")
        if st is None:
            if not create:
                raise self._not_found()
            _make_private_dirs(path, trust)
        self._dirfd = fd = _open_dir(path, trust, path)
        try:
            return self._check_dir(create)
        except BaseException:
            os.close(fd)
            raise

    def _not_found(self) -> StoreNotFoundError:
        return StoreNotFoundError(
            f"no tcc store at {self.path}: nothing was stored there yet (`tcc run` or "
            "open_store(create=True) creates it); or pass --store or set TCC_STORE to an "
            "existing store")

    def _check_dir(self, create: bool) -> bool:
        path, trust, fd = self.path, self._trust, self._dirfd
        dst = os.fstat(fd)
        problem = trust.problem(dst, path, kind="dir")
        if problem is not None:
            raise trust.refuse(path, problem)
        # Nobody else can add, remove or rename entries now: what is listed stays.
        entries = self._check_entries()
        data = os.path.join(path, "data.mdb")
        has_data = "data.mdb" in entries
        if INIT_MARK in entries:
            size = entries["data.mdb"].st_size if has_data else None
            if size is None or size < 2 * mmap.PAGESIZE:  # not even LMDB's two meta pages
                what = "is missing" if size is None else f"is empty ({size} bytes)"
                raise StoreCorruptError(
                    f"the data file {data} {what}, but store {path} was initialised: its runs "
                    "and snapshots are gone. Restore data.mdb from a backup, or delete the store "
                    "directory to start over")
        if not has_data and not create:
            raise self._not_found()
        if not has_data:
            foreign = {name for name in entries if name not in _OWN_FILES
                       and _secret_tmp_pid(name) is None}
            if foreign:
                raise StoreCorruptError(
                    f"{path} is not empty and is not a tcc store (it holds {sorted(foreign)[:3]}); "
                    "choose an empty or new directory")
            if stat.S_IMODE(dst.st_mode) != 0o700:
                os.fchmod(fd, 0o700)  # a new store in an existing empty directory
                dst = os.fstat(fd)
        group = trust.group_ok
        for name, st in (("", dst), (SECRET_NAME, entries.get(SECRET_NAME)),
                         ("data.mdb", entries.get("data.mdb"))):
            if st is None:
                continue
            mode = stat.S_IMODE(st.st_mode)
            if mode & (0o007 if group(st.st_gid) else 0o077):
                self._exposed.append(f"{os.path.join(path, name) if name else path} (mode {mode:o})")
        return has_data

    def _check_entries(self) -> dict[str, os.stat_result]:
        """lstat every entry of the store directory and refuse any that is not to be
        trusted; remove secret temp files their (dead) creators left."""
        path, trust, fd = self.path, self._trust, self._dirfd
        entries: dict[str, os.stat_result] = {}
        links: dict[tuple[int, int], int] = {}  # secret temp files' inodes: how many
        for name in os.listdir(fd):
            try:
                st = os.lstat(name, dir_fd=fd)
            except FileNotFoundError:  # another process of ours removed it meanwhile
                continue
            full = os.path.join(path, name)
            problem = trust.problem(st, full, kind="entry")
            # (the secret is checked below; a verdict file that is not a regular file is
            # never read or written -- it is a cache -- so it may be anything of this user's)
            if (problem is None and name in _OWN_FILES and name != SECRET_NAME
                    and (name != VERIFIED_NAME or stat.S_ISREG(st.st_mode))):
                problem = trust.problem(st, full, kind="file")
            if problem is not None:
                raise trust.refuse(path, problem)
            pid = _secret_tmp_pid(name)
            if pid is not None and not _alive(pid):
                try:  # a creator killed while writing the secret (ours: the owner was checked)
                    os.unlink(name, dir_fd=fd)
                except FileNotFoundError:
                    pass
                continue
            if pid is not None:
                links[(st.st_dev, st.st_ino)] = links.get((st.st_dev, st.st_ino), 0) + 1
            entries[name] = st
        if SECRET_NAME in entries:  # checked once dead creators' temp links are gone
            try:
                entries[SECRET_NAME] = os.lstat(SECRET_NAME, dir_fd=fd)
            except FileNotFoundError:  # (only tcc can remove it: trust the listing)
                pass
            self._check_secret(entries[SECRET_NAME], links)
        return entries

    def _check_secret(self, st: os.stat_result, links: dict[tuple[int, int], int] | None) -> None:
        """Refuse a secret file that is not to be trusted.  Its extra links may be the temp
        files of creators still linking it into place (``links``: their count by inode)."""
        full = os.path.join(self.path, SECRET_NAME)
        problem = self._trust.problem(st, full, kind="file")
        if problem is not None and stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
            if links is None:  # count them (a creator may have linked it since the listing)
                links = {}
                for name in os.listdir(self._dirfd):
                    if _secret_tmp_pid(name) is not None:
                        try:
                            t = os.lstat(name, dir_fd=self._dirfd)
                        except FileNotFoundError:
                            continue
                        if self._trust.owner_ok(t.st_uid):
                            links[(t.st_dev, t.st_ino)] = links.get((t.st_dev, t.st_ino), 0) + 1
            # the other names that are temp files in this private directory are harmless
            problem = self._trust.problem(st, full, kind="file",
                                          spare_links=links.get((st.st_dev, st.st_ino), 0))
        if problem is not None:
            raise self._trust.refuse(self.path, problem)

    def _load_secret(self, create: bool) -> bytes:
        """The store secret, read through the checked directory; created (0600) if
        ``create`` and missing.

        The creator writes a temp file of a name no one can have made before
        (``O_EXCL``: never a file someone planted) in the private directory,
        links it into place and removes it; concurrent creators race safely:
        the loser reads the winner's secret.
        """
        fd = self._dirfd
        try:
            return self._read_secret()
        except FileNotFoundError:
            if not create:
                raise
        tmp = f"{SECRET_NAME}.{os.getpid()}.{os.urandom(8).hex()}.tmp"
        tfd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                      0o600, dir_fd=fd)
        try:
            os.fchmod(tfd, 0o600)
            data = memoryview(os.urandom(32))
            while data:
                data = data[os.write(tfd, data):]
            os.fsync(tfd)
        finally:
            os.close(tfd)
        try:  # (by full names, so that a trace shows where the secret was made)
            os.link(os.path.join(self.path, tmp), os.path.join(self.path, SECRET_NAME))
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp, dir_fd=fd)
        return self._read_secret()

    def _read_secret(self) -> bytes:
        """Read the secret: never through a link, never blocking (a FIFO), only from a
        regular file this user may trust, and no more than one byte too many."""
        full = os.path.join(self.path, SECRET_NAME)
        try:
            sfd = os.open(SECRET_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
                          | os.O_CLOEXEC, dir_fd=self._dirfd)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise  # FileNotFoundError: the caller decides
            raise self._trust.refuse(self.path, self._trust.problem(
                os.lstat(SECRET_NAME, dir_fd=self._dirfd), full, kind="file")
                or (f"{full} is a symbolic link", "restore the secret file from a backup")) from None
        try:
            self._check_secret(os.fstat(sfd), None)
            data = os.read(sfd, 33)
        finally:
            os.close(sfd)
        if len(data) != 32:
            size = os.stat(SECRET_NAME, dir_fd=self._dirfd, follow_symlinks=False).st_size
            raise Corrupt(f"secret file {full} has {size} bytes, expected 32")
        return data

    def _check_unchanged(self) -> None:
        """After LMDB opened the store by its path: the path still names the directory that
        was checked, and the files LMDB may just have created are to be trusted too."""
        here = os.fstat(self._dirfd)
        try:
            now = os.stat(self.path)
        except OSError:
            now = None
        if now is None or (now.st_dev, now.st_ino) != (here.st_dev, here.st_ino):
            raise StoreInsecureError(
                f"store {self.path} is not safe to use: the directory was replaced while tcc "
                f"opened it; {_WHY_TRUST}. Check who can write its parent directory")
        for name in ("data.mdb", "lock.mdb"):
            st = os.lstat(name, dir_fd=self._dirfd)
            problem = self._trust.problem(st, os.path.join(self.path, name), kind="file")
            if problem is not None:
                raise self._trust.refuse(self.path, problem)

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
            label = _check_label(store_id, FORMAT["version"], self.store_key is not None)
            hdr = {**FORMAT, "store_id": store_id, "created": time.time(),
                   "check": self.sealer.check_tag(label).hex()}
            crypt = None
            if self.store_key is not None:
                hdr["version"] = ENCRYPTED_FORMAT
                hdr["enc"], crypt = new_header(self.store_key, store_id, ENCRYPTED_FORMAT)
            txn.put(b"format", json.dumps(hdr).encode(), db=self.dbs["meta"])
            self.sealer = self.sealer.with_chunk_hash(_CHUNK_HASH[FORMAT["version"]])
            if crypt is not None:
                self.sealer = self.sealer.with_crypt(crypt)
            return
        try:
            hdr = json.loads(bytes(raw))
        except (ValueError, RecursionError):
            hdr = {}
        if not isinstance(hdr, dict):  # damage can leave any JSON value
            hdr = {}
        if hdr.get("magic") != FORMAT["magic"]:
            raise StoreCorruptError(f"{self.path} holds a foreign LMDB database, not a tcc store")
        encrypted = hdr.get("version") == ENCRYPTED_FORMAT
        if self.store_key is not None and hdr.get("version") in _UPGRADABLE:  # before upgrading
            raise refuse_plain(self.store_key, self.path)
        if encrypted:
            hdr["version"] = FORMAT["version"]  # (a copy) read as format 4
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
        label = _check_label(store_id, version, encrypted)
        if hdr.get("check") != self.sealer.check_tag(label).hex():
            written = [ENCRYPTED_FORMAT if e else v for v, e in [(3, False), (4, False), (4, True)]
                       if (v, e) != (version, encrypted) and hdr.get("check")
                       == self.sealer.check_tag(_check_label(store_id, v, e)).hex()]
            if written:  # the version picks the chunk hash: reading on would fail every chunk
                raise StoreCorruptError(
                    f"store {self.path}: its format header says version "
                    f"{ENCRYPTED_FORMAT if encrypted else version} but the store "
                    f"was written as version {written[0]} (damage changed the header); restore "
                    "the store from a backup")
            raise StoreCorruptError(f"the secret file of store {self.path} does not belong to it; "
                                    "restore the original secret file")
        if self.store_key is not None and not encrypted:
            raise refuse_plain(self.store_key, self.path)
        if encrypted:  # after the secret check: the data key, unwrapped with the store key
            self.sealer = self.sealer.with_crypt(
                open_header(hdr.get("enc"), self.store_key, store_id, ENCRYPTED_FORMAT, self.path))

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
