"""Intents in flight: one ``write(2)`` each, made durable by the step's commit.

In ``sync`` durability a step used to cost two fsync'd commits: the intent, before the
effect runs, then the completion with the snapshot.  The intent's job is to survive the
*process*: if the process dies while the effect runs, the run resumes knowing the call
may have happened (it is *in doubt*, and its verify probe is asked).  A process crash
never loses what a process wrote to a file, fsync'd or not; only an OS crash does.

So an intent is sealed exactly as its journal record will be, and appended to a file of
this process under ``<store>/inflight/`` with one ``write(2)``, no fsync and no LMDB
transaction.  The process remembers it (:class:`InflightLog`), and the next write
transaction of this handle -- the step's commit, a park, a failure -- writes it into the
journal first, under the same fence: the one fsync of the step makes both durable, in
order.  A run taken over (``claim_run``) after its owner died gets the intents the owner
left in its file written into the journal by the claiming transaction, before the new
epoch: the resumed run sees them exactly as if they had been committed, in doubt.
Readers of the journal (``tcc show``, the dashboard) see them too
(:func:`left_behind`).

What an OS crash can take: the intent of the call in flight (its file's tail was never
flushed), never an acknowledged step.  A resumed run then finds no intent after its
snapshot, so it treats the first call it makes afresh as in doubt and asks that call's
verify probe first (``Store.intents_durable`` is False, as on PostgreSQL).
``open_store(..., sync_intents=True)`` gives every intent its own fsync'd commit again.

Every entry is sealed with the store key (MAC, and encryption in an encrypted store) for
its journal key and its writer's epoch, so a file another user put there, a torn tail
after a crash, or garbage is skipped, never trusted, and never parsed by anything but
this module's length-prefixed reader.  A file whose process is gone is deleted once
every intent in it is in the journal or outdated.
"""

from __future__ import annotations

import os
import struct
import threading
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._proc import pid_alive
from ._api import HOST
from ._codec import Corrupt, last_seq, seq_key
from ._heads import put_head
from ._runrecord import load_run

if TYPE_CHECKING:
    from ._scope import Scope

__all__ = ["InflightLog", "adopt", "ensure", "left_behind", "sweep"]

DIR = "inflight"
_FRAME = struct.Struct(">II")  # key length, sealed entry length
_MAX_FILE = 256 << 20  # read at most this much of one file (entries past it wait for a commit)
_CACHE_MAX = 64 << 10  # a dead process's file up to this size is read once per handle (_entries):
# it holds the few intents that process left in flight, one per run it was driving


class _Intent:
    __slots__ = ("rid", "seq", "key", "epoch", "value")

    def __init__(self, rid: bytes, seq: int, key: bytes, epoch: int, value: bytes) -> None:
        self.rid, self.seq, self.key, self.epoch, self.value = rid, seq, key, epoch, value


class InflightLog:
    """This process's file of intents in flight for one store, and the intents of it that
    are not in the journal yet (by run)."""

    def __init__(self, store_dir: str) -> None:
        self.dir = os.path.join(store_dir, DIR)
        self.lock = threading.Lock()
        self.pending: dict[bytes, list[_Intent]] = {}
        self.high: dict[bytes, tuple[int, int]] = {}  # run -> (epoch, seq after its last intent here)
        self._fd: int | None = None
        self._pid = os.getpid()
        self._name = ""

    # ---------------------------------------------------------------- writing
    def append(self, scope: Scope, rid: bytes, epoch: int, stored: int,
               seal: Callable[[bytes], bytes]) -> int:
        """Write the run's next intent at ``epoch`` to the file and remember it; return its
        sequence number.  ``stored``: the journal's length, read after the fence check;
        ``seal(key)``: the sealed journal record.  OSError if the file cannot be written
        (the caller then commits the intent as before)."""
        with self.lock:  # one lock from numbering to writing: heartbeats fold concurrently
            mine = self.pending.get(rid)
            if mine and mine[0].epoch != epoch:
                del self.pending[rid]  # another epoch's: void
                mine = None
            seq = stored
            high = self.high.get(rid)
            if high is not None and high[0] == epoch:
                seq = max(seq, high[1])  # after this handle's intents, folded or not
            key = seq_key(scope.tenant_key, rid, seq)
            value = seal(key)
            entry = scope.sealer.seal(b"inflight", key, {"e": epoch}, {"r": value})
            frame = _FRAME.pack(len(key), len(entry)) + key + entry
            fd = self._open()
            written = os.write(fd, frame)
            if written != len(frame):  # a short write to a regular file: no space left
                os.ftruncate(fd, os.lseek(fd, 0, os.SEEK_END) - written)
                raise OSError(f"short write to {self._name}")
            self.pending.setdefault(rid, []).append(_Intent(rid, seq, key, epoch, value))
            self.high[rid] = (epoch, seq + 1)
            return seq

    def _open(self) -> int:
        if self._fd is None or self._pid != os.getpid():
            os.makedirs(self.dir, mode=0o700, exist_ok=True)
            self._name = os.path.join(self.dir, f"{HOST}-{os.getpid()}-{uuid.uuid4().hex[:12]}.log")
            self._fd = os.open(self._name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL
                               | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0), 0o600)
            self._pid = os.getpid()
        return self._fd

    # ---------------------------------------------------------------- folding
    def fold(self, scope: Scope, txn: Any) -> list[_Intent]:
        """Inside a write transaction: journal every remembered intent whose run is still at
        its writer's epoch and whose journal ends where it begins.  Returns the intents done
        with (journaled, already journaled, or void), to forget once it committed."""
        with self.lock:
            todo = [(rid, list(intents)) for rid, intents in self.pending.items()]
        done: list[_Intent] = []
        for rid, intents in todo:
            try:
                hdr, _ = load_run(scope, txn, rid)
            except Exception:  # noqa: BLE001 - the run is gone or damaged: nothing to add
                done += intents
                continue
            if hdr["epoch"] != intents[0].epoch:
                done += intents  # taken over or cancelled: this writer's intents are void
                continue
            pfx = scope.run_prefix(rid)
            stored = last_seq(txn, scope.dbs["journal"], pfx) + 1
            for intent in intents:
                if intent.seq > stored:
                    break  # a gap: left for a completion to find in the file
                if intent.seq == stored:
                    stored = _journal(scope, txn, pfx, intent.key, intent.value, stored)
                done.append(intent)
        return done

    def committed(self, done: list[_Intent]) -> None:
        """The transaction that folded ``done`` committed: forget them, and empty the file
        when nothing in it is pending any more."""
        if not done:
            return
        gone = {id(i) for i in done}
        with self.lock:
            for rid in {i.rid for i in done}:
                left = [i for i in self.pending.get(rid, ()) if id(i) not in gone]
                if left:
                    self.pending[rid] = left
                else:
                    self.pending.pop(rid, None)
            if not self.pending and self._fd is not None and self._pid == os.getpid():
                os.ftruncate(self._fd, 0)

    def close(self) -> None:
        with self.lock:
            if self._fd is not None and self._pid == os.getpid():
                os.close(self._fd)
                if not self.pending:
                    try:
                        os.unlink(self._name)
                    except OSError:
                        pass
            self._fd = None


# ------------------------------------------------------------------- reading
def _owner(path: str) -> tuple[str, int] | None:
    """(host, pid) of the process whose file ``path`` is (``HOST-PID-ID.log``), or None."""
    host, _, rest = os.path.basename(path).rpartition("-")[0].rpartition("-")
    try:
        return host, int(rest)
    except ValueError:
        return None


def _final(path: str) -> bool:
    """Whether nothing can append to ``path`` any more: its process ran on this host and is
    gone (only the process that made a file writes to it, and its name is never reused)."""
    owner = _owner(path)
    return owner is not None and owner[0] == HOST and owner[1] != os.getpid() \
        and not pid_alive(owner[1])


def _stamp(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _entries(scope: Scope, path: str, final: bool | None = None) -> list[tuple[bytes, int, bytes]]:
    """The intact entries of one file: ``(journal key, epoch, sealed journal record)``.
    A torn or foreign tail ends the reading; an entry that does not verify is skipped.

    The file of a process that is gone (``final``: :func:`_final`, judged here if None) is
    read and verified once per store handle: a resume reads it three times (the open's sweep,
    the claim's adoption, the sweep after the claim).  Its entries are kept, if the file is
    at most ``_CACHE_MAX`` bytes, with the (device, inode, size, mtime) of the file they were
    read from, and it is read again if any of those differ.  A file cached is final for good:
    its process was gone before it was read, and no other process writes to a file of that
    name."""
    seen = scope.inflight_seen.get(path)
    if seen is not None:
        try:
            if seen[0] == _stamp(os.lstat(path)):
                return list(seen[1])
        except OSError:
            return []
        final = True
    elif final is None:
        final = _final(path)  # (before the reading: what is read then is all there will be)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return []
    try:
        stamp = _stamp(os.fstat(fd))
        chunks = []
        left = min(stamp[2], _MAX_FILE)
        while left > 0:
            got = os.read(fd, left)
            if not got:
                break
            chunks.append(got)
            left -= len(got)
        data = b"".join(chunks)
    except OSError:
        return []
    finally:
        os.close(fd)
    out = []
    pos = 0
    while pos + _FRAME.size <= len(data):
        klen, elen = _FRAME.unpack_from(data, pos)
        start = pos + _FRAME.size
        end = start + klen + elen
        if klen > 4096 or end > len(data):
            break
        key, entry = data[start:start + klen], data[start + klen:end]
        pos = end
        try:
            hdr, blobs = scope.sealer.open(b"inflight", key, entry)
            epoch, value = hdr["e"], blobs["r"]
        except (Corrupt, KeyError, TypeError, ValueError):
            continue
        if type(epoch) is int and isinstance(value, bytes):
            out.append((key, epoch, value))
    if final and stamp[2] <= _CACHE_MAX:
        if len(scope.inflight_seen) >= 64:
            scope.inflight_seen.clear()
        scope.inflight_seen[path] = (stamp, tuple(out))
    return out


def _files(scope: Scope) -> list[str]:
    folder = os.path.join(scope.path, DIR)
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return [os.path.join(folder, n) for n in sorted(names) if n.endswith(".log")]


def left_behind(scope: Scope, rid: bytes, epoch: int, stored: int) -> list[tuple[bytes, bytes]]:
    """The intents of run ``rid`` written in flight at ``epoch`` that follow its journal of
    ``stored`` records, in order: ``(key, sealed journal record)`` (readers show them)."""
    pfx = scope.run_prefix(rid)
    found: dict[int, tuple[bytes, bytes]] = {}
    for path in _files(scope):
        for key, e, value in _entries(scope, path):
            if e == epoch and key[:-8] == pfx and len(key) == len(pfx) + 8:
                found.setdefault(int.from_bytes(key[-8:], "big"), (key, value))
    out = []
    while stored in found:
        out.append(found[stored])
        stored += 1
    return out


def adopt(scope: Scope, txn: Any, rid: bytes, hdr: dict[str, Any]) -> int:
    """Inside the transaction that claims run ``rid`` (before its epoch moves): journal the
    intents its previous owner left in flight.  Returns how many."""
    pfx = scope.run_prefix(rid)
    stored = last_seq(txn, scope.dbs["journal"], pfx) + 1
    left = left_behind(scope, rid, hdr["epoch"], stored)
    for key, value in left:
        stored = _journal(scope, txn, pfx, key, value, stored)
    return len(left)


def _journal(scope: Scope, txn: Any, pfx: bytes, key: bytes, value: bytes, stored: int) -> int:
    """Put intent record ``stored`` (``key``, ``value``) into the journal and count it."""
    txn.put(key, value, db=scope.dbs["journal"])
    put_head(scope, txn, "journal", pfx, stored + 1)
    return stored + 1


def ensure(scope: Scope, txn: Any, rid: bytes, hdr: dict[str, Any], intent_seq: int) -> None:
    """Inside a fenced write that completes intent ``intent_seq``: if the journal does not
    have it yet, journal the intents in flight at the run's epoch (written by another
    handle of the store, in this process or one that closed it)."""
    if last_seq(txn, scope.dbs["journal"], scope.run_prefix(rid)) < intent_seq:
        adopt(scope, txn, rid, hdr)


def sweep(scope: Scope) -> None:
    """Delete the files of this host's processes that are gone once nothing in them is
    still to be journaled (each intent is in the journal, or its run moved on)."""
    for path in _files(scope):
        if not _final(path):
            continue
        entries = _entries(scope, path, final=True)

        def stale(txn: Any) -> bool:
            mine = scope.tenant_key + b"\x00"
            for key, epoch, _value in entries:
                if not key.startswith(mine):
                    return False  # another tenant's: not this handle's to judge
                rid = key[len(mine):-9]
                try:
                    hdr, _ = load_run(scope, txn, rid)
                except Exception:  # noqa: BLE001 - no such run (or not ours to judge): done
                    continue
                if hdr["epoch"] == epoch and \
                        last_seq(txn, scope.dbs["journal"], scope.run_prefix(rid)) < int.from_bytes(key[-8:], "big"):
                    return False
            return True

        try:
            if scope.read(stale):
                os.unlink(path)
                scope.inflight_seen.pop(path, None)
        except OSError:
            pass
