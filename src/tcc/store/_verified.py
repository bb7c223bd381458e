"""The verdict file: data.mdb, exactly as it is now, was checked or written by checked writers.

The structural walk of ``data.mdb`` (``_lmdbcheck``) reads every page, so its
cost grows with the store: ~25 ms for a 9 MiB store holding 10,000 journal
records, paid by every process that opens it -- recovery after a crash
included, which should read only the chunks of one snapshot.

What the walk guards against is damage LMDB did not make: a disk or an
operating system that lost or tore writes in a crash, a file swapped in or
copied half-way, bytes changed by another program.  LMDB's own commits keep
a valid file valid (copy-on-write pages, then the meta page), and a process
killed mid-commit leaves the previous state intact.  So a file that was
walked, and since then changed only by commits of processes that trust it,
needs no second walk.

The verdict file (``verified``, 0600) records that trust: the boot id of the
machine, and data.mdb's device, inode, size, modification and change times
(nanoseconds), MAC'd with the store secret.  A process writes it after a walk
that passed, and again after each of its own commits if the file was vouched
for just before that commit (checked while LMDB's write lock is held, so that
a commit never vouches for a change something else made in between).  That
costs two ``stat`` calls and one 80-byte ``pwrite`` per commit, a few
microseconds.  At open the walk is skipped only if every field matches.  Any
write to data.mdb by something else changes its times (the change time
cannot be set back by a user), a copied or restored file is another inode,
and a reboot -- after which unsynced writes may be lost or torn -- changes
the boot id: each means the file is walked again.  What it cannot see is
damage that leaves no trace in the file's metadata (a medium that rots under
a running system, a write landing within the same coarse timestamp tick as a
commit's); ``TCC_STORE_CHECK=full`` walks at every open.

A verdict that cannot be written (read-only directory, disk full) is simply
missing: the next open walks.  It is a cache, never a source of truth.
"""

from __future__ import annotations

import os
import struct

from ._codec import Sealer

__all__ = ["VERIFIED_NAME", "Verdict", "boot_id"]

VERIFIED_NAME = "verified"
_MAGIC = b"tccvrfy1"
_BODY = struct.Struct("<8s16sQQQqq")  # magic, boot id, dev, ino, size, mtime ns, ctime ns
_DB, _KEY = b"verified", b"data.mdb"
_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def boot_id() -> bytes | None:
    """This boot's id (16 bytes), or None where the system does not tell it."""
    try:
        with open(_BOOT_ID, "rb") as f:
            text = f.read(64).strip().replace(b"-", b"")
        return bytes.fromhex(text.decode("ascii")) if len(text) == 32 else None
    except (OSError, ValueError):
        return None


class Verdict:
    """Reads and writes the verdict file of one store for one open handle.

    ``trusted`` is set once this handle has walked data.mdb or found a
    matching verdict.  A commit then keeps the verdict current only if the
    file was vouched for just before it (:meth:`before_commit`, called with
    LMDB's write lock held): a change made by something else in between --
    damage -- must not be vouched for by the next commit.
    """

    __slots__ = ("_boot", "_data", "_dfd", "_fd", "_last", "_path", "_sealer", "trusted")

    def __init__(self, store_path: str, sealer: Sealer) -> None:
        self._path = os.path.join(store_path, VERIFIED_NAME)
        self._data = os.path.join(store_path, "data.mdb")
        self._sealer = sealer
        self._boot = boot_id()
        self._fd: int | None = None  # the verdict file, for writing
        self._dfd: int | None = None  # data.mdb as this handle opened it (fstat is cheaper)
        self._last: bytes | None = None  # the body this handle last wrote or matched
        self.trusted = False

    def reset(self) -> None:
        """Forget all trust: called as the environment is (re)opened, before its check."""
        self.close()
        self.trusted = False
        self._last = None
        if self._boot is not None:
            try:
                self._dfd = os.open(self._data, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                self._dfd = None

    def _body(self) -> bytes | None:
        if self._boot is None or self._dfd is None:
            return None
        st = os.fstat(self._dfd)
        return _BODY.pack(_MAGIC, self._boot, st.st_dev, st.st_ino, st.st_size,
                          st.st_mtime_ns, st.st_ctime_ns)

    def _file_vouches(self, body: bytes) -> bool:
        try:
            with open(self._path, "rb") as f:
                raw = f.read(256)
        except OSError:
            return False
        return raw[16:] == body and self._sealer.mac_ok(_DB, _KEY, raw[:16], body)

    def matches(self) -> bool:
        """Whether the verdict file vouches for data.mdb as it is now (at open)."""
        try:
            body = self._body()
        except OSError:
            return False
        if body is None or not self._file_vouches(body):
            return False
        self._last = body
        return True

    def before_commit(self) -> bool:
        """Whether data.mdb is, right now, a state this handle or the verdict file vouches for."""
        if not self.trusted:
            return False
        try:
            body = self._body()
        except OSError:
            return False
        # another process's commit since ours: its verdict, if it wrote one, vouches
        return body is not None and (body == self._last or self._file_vouches(body))

    def record(self) -> None:
        """Vouch for data.mdb as it is now (after a walk, or a commit :meth:`before_commit` allowed)."""
        if not self.trusted:
            return
        try:
            body = self._body()
            if body is None:
                return
            if self._fd is None:
                self._fd = os.open(self._path, os.O_WRONLY | os.O_CREAT, 0o600)
            os.pwrite(self._fd, self._sealer.mac(_DB, _KEY, body) + body, 0)
            self._last = body
        except OSError:  # a cache: the next open walks instead
            self.close()

    def close(self) -> None:
        """Close the files (the verdict stays)."""
        for fd in (self._fd, self._dfd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._fd = self._dfd = None
