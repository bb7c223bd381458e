"""Who may own a store, and the checked store directory with its secret.

A store is opened only if no other user can change it: snapshots are pickles,
so whoever can write a store's files can run code as whoever resumes from it.
:class:`Trust` is the rule :func:`tcc.store.open_store` documents;
:class:`StoreDir` finds (or creates) the store directory, checks it and every
entry in it through one descriptor (``O_NOFOLLOW``), and reads the secret
through that same descriptor, so a directory swapped in after the check
cannot supply it.  Directories tcc creates are 0700 whatever the umask.
"""

from __future__ import annotations

import errno
import grp
import mmap
import os
import pwd
import stat

from ..errors import StoreCorruptError, StoreError, StoreInsecureError, StoreNotFoundError
from ._codec import SECRET_NAME, Corrupt
from ._verified import VERIFIED_NAME

__all__ = [
    "INIT_MARK",
    "LOCK_NAME",
    "SHARED_GROUP_ENV",
    "StoreDir",
    "StoreSecurityWarning",
    "Trust",
    "fsync_dir",
    "mark_initialised",
    "warn_if_exposed",
]

LOCK_NAME = "tcc.lock"
# Created once the store's format header is committed: from then on a missing
# or empty data.mdb means lost records, not a store still being created.
INIT_MARK = "initialised"
_OWN_FILES = {"data.mdb", "lock.mdb", SECRET_NAME, LOCK_NAME, INIT_MARK, VERIFIED_NAME}

SHARED_GROUP_ENV = "TCC_STORE_SHARED_GROUP"
_WHY_TRUST = ("snapshots are pickles, which run code when they are loaded, so tcc opens only a "
              "store that no other user can change")


def _secret_tmp_pid(name: str) -> int | None:
    """The creator's pid if ``name`` is a secret temp file (``secret.<pid>.<random>.tmp``,
    or ``secret.<pid>.tmp``, the form a store made by an earlier tcc may still hold),
    else None."""
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


class Trust:
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
        # (the folders, inflight/ included, keep their x bit; every file is 0600)
        modes = f"find {store} -type d -exec chmod 700 {{}} + && find {store} -type f -exec chmod 600 {{}} +"
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


def _open_dir(path: str, trust: Trust, store: str) -> int:
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


def _make_private_dirs(path: str, trust: Trust) -> None:
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


def fsync_dir(path: str) -> None:
    """Make the entries of directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def warn_if_exposed(exposed: list[str]) -> None:
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


def mark_initialised(path: str) -> None:
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
    fsync_dir(path)


class StoreDir:
    """A store directory opened as ``fd`` and checked: only this user (or the shared
    group, :class:`Trust`) can change it and what it holds."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.trust = Trust()
        self.fd = -1
        self.exposed: list[str] = []  # entries others can read: warned about once opened

    def close(self) -> None:
        """Close the directory descriptor (the checks are done)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def prepare(self, create: bool) -> bool:
        """Find (or create) the store directory, open it as ``self.fd`` and check that
        only this user can change it and what it holds (:class:`Trust`); whether it
        holds a data file."""
        path, trust = self.path, self.trust
        try:
            st: os.stat_result | None = os.stat(path)
        except FileNotFoundError:
            st = None
        if st is not None and not stat.S_ISDIR(st.st_mode):
            raise StoreCorruptError(f"store path {path} is a file, not a store directory; "
                                    "choose another path (TCC_STORE)")
        if st is None:
            if not create:
                raise self.not_found()
            _make_private_dirs(path, trust)
        self.fd = _open_dir(path, trust, path)
        try:
            return self._check_dir(create)
        except BaseException:
            self.close()
            raise

    def not_found(self) -> StoreNotFoundError:
        """The error for a store that does not exist (and may not be created)."""
        return StoreNotFoundError(
            f"no tcc store at {self.path}: nothing was stored there yet (`tcc run` or "
            "open_store(create=True) creates it); or pass --store or set TCC_STORE to an "
            "existing store")

    def _check_dir(self, create: bool) -> bool:
        path, trust, fd = self.path, self.trust, self.fd
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
            raise self.not_found()
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
                self.exposed.append(f"{os.path.join(path, name) if name else path} (mode {mode:o})")
        return has_data

    def _check_entries(self) -> dict[str, os.stat_result]:
        """lstat every entry of the store directory and refuse any that is not to be
        trusted; remove secret temp files their (dead) creators left."""
        path, trust, fd = self.path, self.trust, self.fd
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
        problem = self.trust.problem(st, full, kind="file")
        if problem is not None and stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
            if links is None:  # count them (a creator may have linked it since the listing)
                links = {}
                for name in os.listdir(self.fd):
                    if _secret_tmp_pid(name) is not None:
                        try:
                            t = os.lstat(name, dir_fd=self.fd)
                        except FileNotFoundError:
                            continue
                        if self.trust.owner_ok(t.st_uid):
                            links[(t.st_dev, t.st_ino)] = links.get((t.st_dev, t.st_ino), 0) + 1
            # the other names that are temp files in this private directory are harmless
            problem = self.trust.problem(st, full, kind="file",
                                          spare_links=links.get((st.st_dev, st.st_ino), 0))
        if problem is not None:
            raise self.trust.refuse(self.path, problem)

    def load_secret(self, create: bool) -> bytes:
        """The store secret, read through the checked directory; created (0600) if
        ``create`` and missing.

        The creator writes a temp file of a name no one can have made before
        (``O_EXCL``: never a file someone planted) in the private directory,
        links it into place and removes it; concurrent creators race safely:
        the loser reads the winner's secret.
        """
        fd = self.fd
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
                          | os.O_CLOEXEC, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise  # FileNotFoundError: the caller decides
            raise self.trust.refuse(self.path, self.trust.problem(
                os.lstat(SECRET_NAME, dir_fd=self.fd), full, kind="file")
                or (f"{full} is a symbolic link", "restore the secret file from a backup")) from None
        try:
            self._check_secret(os.fstat(sfd), None)
            data = os.read(sfd, 33)
        finally:
            os.close(sfd)
        if len(data) != 32:
            size = os.stat(SECRET_NAME, dir_fd=self.fd, follow_symlinks=False).st_size
            raise Corrupt(f"secret file {full} has {size} bytes, expected 32")
        return data

    def check_unchanged(self) -> None:
        """After LMDB opened the store by its path: the path still names the directory that
        was checked, and the files LMDB may just have created are to be trusted too."""
        here = os.fstat(self.fd)
        try:
            now = os.stat(self.path)
        except OSError:
            now = None
        if now is None or (now.st_dev, now.st_ino) != (here.st_dev, here.st_ino):
            raise StoreInsecureError(
                f"store {self.path} is not safe to use: the directory was replaced while tcc "
                f"opened it; {_WHY_TRUST}. Check who can write its parent directory")
        for name in ("data.mdb", "lock.mdb"):
            st = os.lstat(name, dir_fd=self.fd)
            problem = self.trust.problem(st, os.path.join(self.path, name), kind="file")
            if problem is not None:
                raise self.trust.refuse(self.path, problem)
