"""The verdict file: data.mdb, exactly as it is now, was checked or written by checked writers.

The structural walk of ``data.mdb`` (``_lmdbcheck``) reads every page, so its
cost grows with the store: ~25 ms for a 9 MiB store holding 10,000 journal
records, paid by every process that opens it -- recovery after a crash
included, which should read only the chunks of one snapshot.

What the walk guards against is damage LMDB did not make: a disk or an
operating system that lost or tore writes in a crash, a file swapped in or
copied half-way, bytes changed by another program.  An LMDB commit on top of
a valid file leaves a valid file (it writes whole pages, copy-on-write, then
the meta page; a page it reuses is rewritten in full, so damage to a page no
tree reaches never matters), and a process killed mid-commit leaves the
previous state intact.  So a file that was walked, and since then changed
only by LMDB commits, needs no second walk.

The verdict file (``verified``, 0600, 80 bytes) records that trust: the boot
id of the machine, and data.mdb's device, inode, size, modification and
change times (nanoseconds), MAC'd with the store secret.  A handle becomes
*trusted* when its open walked the file, or found a verdict matching it.

* After a walk it vouches for the state it took just before walking (a write
  that landed earlier is one the walk read; one that lands during the walk
  changes that state, so nothing is vouched for).
* Around each of its commits (the open's own write transaction included) it
  checks, while LMDB's write lock is held, that the file is still a vouched
  state (its own last verdict, or the one another process wrote after its
  commit), and after the commit that no other transaction has committed
  since; only then does it record the new state.  That costs two ``fstat``
  calls, one 80-byte ``pwrite`` and a look at LMDB's last txnid per commit.

At open, ``auto`` skips the walk only if every field matches.  Any write to
data.mdb by something else changes its times (the change time cannot be set
by a user), a copied or restored file is another inode, and a reboot --
after which unsynced writes may be lost or torn -- changes the boot id: each
means the file is walked again.  Not seen: damage that leaves the metadata
alone -- a medium rotting under a running system, a disk detached and
reattached without a reboot, a write by another program in the microseconds
between a commit and its verdict (or within one timestamp tick of it, on a
file system whose clock is coarse; one whose times are whole milliseconds or
coarser gets no verdicts at all), or an administrator resetting the clock to
the nanosecond.  ``TCC_STORE_CHECK=full`` walks at every open.

A verdict that cannot be written (read-only directory, disk full) is simply
missing: the next open walks.  It is a cache, never a source of truth.
"""

from __future__ import annotations

import os
import stat
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
    """Reads and writes the verdict file of one store for one open handle (see above)."""

    __slots__ = ("_boot", "_data", "_dfd", "_fd", "_last", "_path", "_sealer", "trusted")

    def __init__(self, store_path: str, sealer: Sealer) -> None:
        self._path = os.path.join(store_path, VERIFIED_NAME)
        self._data = os.path.join(store_path, "data.mdb")
        self._sealer = sealer
        self._boot = boot_id()
        self._fd: int | None = None  # the verdict file, for writing
        self._dfd: int | None = None  # data.mdb as this handle opened it (fstat is cheaper)
        self._last: bytes | None = None  # the state this handle last vouched for
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

    def state(self) -> bytes | None:
        """data.mdb's state as a verdict body (None: verdicts are not possible here)."""
        if self._boot is None or self._dfd is None:
            return None
        try:
            st = os.fstat(self._dfd)
        except OSError:
            return None
        if not (st.st_mtime_ns % 1_000_000 or st.st_ctime_ns % 1_000_000):
            return None  # whole milliseconds or coarser: a later write could keep both times
        return _BODY.pack(_MAGIC, self._boot, st.st_dev, st.st_ino, st.st_size,
                          st.st_mtime_ns, st.st_ctime_ns)

    def _file_vouches(self, body: bytes) -> bool:
        try:
            # never block (a FIFO put in its place), never follow a link, read only a regular file
            fd = os.open(self._path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return False
            raw = os.read(fd, 256)
        except OSError:
            return False
        finally:
            os.close(fd)
        return raw[16:] == body and self._sealer.mac_ok(_DB, _KEY, raw[:16], body)

    def matches(self) -> bool:
        """At open, with the read transaction begun: whether the verdict file vouches for
        data.mdb as it is now.  If so, this handle is trusted."""
        body = self.state()
        if body is None or not self._file_vouches(body):
            return False
        self.trusted, self._last = True, body
        return True

    def walked(self, before: bytes | None) -> None:
        """The walk passed; ``before`` is the state taken just before it began."""
        self.trusted, self._last = True, before

    def before_commit(self) -> bool:
        """With LMDB's write lock held: whether data.mdb is a state this handle vouched
        for, or one the verdict file vouches for (another process committed since)."""
        if not self.trusted:
            return False
        body = self.state()
        return body is not None and (body == self._last or self._file_vouches(body))

    def unchanged(self) -> bool:
        """Whether data.mdb is still the state this handle last vouched for."""
        return self.trusted and self._last is not None and self.state() == self._last

    def record(self) -> None:
        """Vouch for data.mdb as it is now: call right after a commit that
        :meth:`before_commit` allowed, once no other transaction committed since."""
        body = self.state() if self.trusted else None
        if body is None:
            return
        try:
            if self._fd is None:
                fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o600)
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:  # written through no other name
                    os.close(fd)
                    raise OSError(f"{self._path} is not a regular file with one link")
                self._fd = fd
            os.pwrite(self._fd, self._sealer.mac(_DB, _KEY, body) + body, 0)
            self._last = body
        except OSError:
            # a cache: stop vouching for this handle's commits; the next open walks
            self.trusted = False

    def close(self) -> None:
        """Close the files (the verdict stays)."""
        for fd in (self._fd, self._dfd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._fd = self._dfd = None
