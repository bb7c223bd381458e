"""Key layout, range reads over it, names, and authenticated record encoding.

Key layout (all keys are bytes, well under LMDB's 511-byte limit)::

    runs      tenant 0x00 run_id                      -> sealed run record
    journal   tenant 0x00 run_id 0x00 seq(u64 BE)     -> sealed journal record
    snaps     tenant 0x00 run_id 0x00 number(u64 BE)  -> sealed snapshot manifest
    signals   tenant 0x00 run_id 0x00 name            -> sealed signal record
    events    tenant 0x00 run_id 0x00 seq(u64 BE)     -> sealed event record
    pins      tenant 0x00 run_id 0x00 number 0x00 holder_run_id -> b""
    chunks    chunk id(u64 BE) b"d"                   -> codec byte + stored bytes
    chunks    chunk id(u64 BE) b"r"                   -> holder count (u32 LE), see _chunkrefs
    meta      b"format"                               -> JSON store header

Tenant, run ids and signal names never contain NUL (validated by
:func:`check_name`), so one run's keys are a contiguous range that never
overlaps another run's or tenant's; :func:`iter_prefix` reads such a range.
Each counted range also has a sealed *head record* (see ``_heads``).

A *sealed* record is ``MAC(16) | version(1) | header_len(u32 LE) | JSON header
| blob bytes...``.  The MAC is keyed BLAKE2b over the database name, the key
and the body, so a record moved to another key, run or tenant fails to verify
just like a flipped bit.  A chunk's identity is a keyed 256-bit hash (its
*address*), recorded next to its id in the (MAC'd) manifest, so the address
authenticates the content: manifest -> group nodes -> chunks is a Merkle chain.
The chunk hash is keyed BLAKE3 in stores of format 4 (~0.2 ms per MiB here,
against ~1.3 ms for BLAKE2b: it is on the path of every checkpoint of new
bytes and of every recovery) and keyed BLAKE2b-256 in stores of format 3,
whose chunk addresses stay as they were written.

In an encrypted store (format ``4-encrypted``, ``_crypt``), the body after the MAC is
``0x02 | AEAD(plain body)``, bound to the database and key, and a stored chunk
is ``0x02 | AEAD(codec byte + bytes)``, bound to its address; the MAC is
computed over the encrypted body, so the structure check can verify records
before the data key is known.  Chunk addresses are keyed with a key derived
from the data key.  A sealer with a Crypt refuses plain records and chunks;
one without refuses encrypted ones.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import struct
from collections.abc import Iterator
from typing import Any

from ..errors import UsageError

__all__ = [
    "CHUNK_HASHES",
    "DBS",
    "ENCRYPTED",
    "RECORD_MIN",
    "SECRET_NAME",
    "Corrupt",
    "Sealer",
    "SnapRow",
    "as_bytes",
    "check_int",
    "check_name",
    "iter_prefix",
    "last_seq",
    "prefix",
    "seq_key",
    "snap_rows",
    "shown",
    "u64",
]

SECRET_NAME = "secret"
DBS = ("meta", "runs", "journal", "snaps", "chunks", "signals", "events", "pins")  # see above
_VERSION = 1
ENCRYPTED = 2  # the version byte of an encrypted record body, the codec byte of an encrypted chunk
_ENCRYPTED_HEAD = bytes([ENCRYPTED])
CHUNK_HASHES = ("blake3", "blake2b")  # the first is what new stores use
_MAC_LEN = 16
RECORD_MIN = _MAC_LEN + 5  # the shortest sealed record: MAC, version byte, header length
_JSON = json.JSONEncoder(separators=(",", ":"))  # json.dumps with options builds one per call
_NAME_RE = re.compile(r"[A-Za-z0-9._:@+=-]{1,128}\Z")
_U32 = struct.Struct("<I")
_U64 = struct.Struct(">Q")


class Corrupt(Exception):
    """Internal: a record or chunk failed verification (mapped to StoreCorruptError)."""


def check_name(kind: str, value: str, *, new: bool = False) -> bytes:
    """Validate a tenant, run id or signal name and return it ASCII-encoded.

    Accepted: a ``str`` of 1 to 128 characters, each one of ``A-Z a-z 0-9``
    and ``. _ : @ + = -`` (so never NUL, ``/`` or whitespace).  Anything
    else raises :class:`~tcc.errors.UsageError` (a ``ValueError``) naming
    ``kind`` (say ``"run id"``) and the value.

    ``new``: the name is being given to something created now (a run id at
    ``create_run``/``fork_run``, ``tcc run --run-id``): then it may not start
    with "-" either, because a command line that is handed the id (``tcc
    resume ID``) would read it as an option.  Existing names that start with
    "-" are still accepted, so that their runs can be found.

    (The signal names a program waits on are checked by ``tcc.effects``
    under a stricter rule, without "@": the runtime stores each wait as
    ``NAME@k``, which this rule accepts.)
    """
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise UsageError(  # a ValueError too
            f"invalid {kind} {value!r}: use 1-128 characters from A-Z a-z 0-9 . _ : @ + = -"
        )
    if new and value.startswith("-"):
        raise UsageError(
            f"invalid {kind} {value!r}: it may not start with '-' (a command line would read "
            "it as an option)")
    return value.encode("ascii")


def as_bytes(what: str, value: object) -> bytes:
    """``value`` if it is bytes-like, as bytes; else UsageError naming ``what``.

    Never converts anything else: ``bytes(5)`` is five zero bytes and
    ``bytes([1, 2])`` two bytes, so converting would store a wrong value
    without a word.
    """
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise UsageError(f"{what} must be bytes, not {type(value).__name__}")


def check_int(what: str, value: object, least: int = 0) -> int:
    """``value`` if it is an int (not a bool) of at least ``least``; else UsageError."""
    if type(value) is not int or value < least:
        raise UsageError(f"{what} must be an integer of at least {least}, not {value!r}")
    return value


def created_event(entry: str, status: str, info: Any, spawned_by: str | None) -> dict[str, Any]:
    """The data of a new run's ``created`` event, once ``create_run``'s ``status``, ``info``
    and ``spawned_by`` are checked (UsageError naming what is wrong)."""
    from ._api import CREATE_STATUSES

    if status not in CREATE_STATUSES:
        raise UsageError(f"a run is created {', '.join(CREATE_STATUSES[:-1])} or "
                         f"{CREATE_STATUSES[-1]}, not {status!r}")
    if spawned_by is not None:
        check_name("run id", spawned_by)
    data: dict[str, Any] = {"entry": entry, "epoch": 1}
    if status != "running":
        data["status"] = status
    if info is not None:
        if not isinstance(info, dict) or not all(isinstance(k, str) for k in info):
            raise UsageError(f"info must be a dict with str keys, not {type(info).__name__}")
        clash = sorted(set(info) & {"entry", "epoch", "status"})
        if clash:
            raise UsageError(f"info may not set {', '.join(clash)} of the created event")
        try:
            json.dumps(info)
        except (TypeError, ValueError) as exc:
            raise UsageError(f"info must be JSON-able: {exc}") from None
        data.update(info)
    return data


def shown(rid: bytes) -> str:
    """A run id from a key, for a message: a damaged key need not be UTF-8, and the
    error that reports the damage must not fail itself."""
    return bytes(rid).decode("utf-8", "backslashreplace")


def u64(n: int) -> bytes:
    """Big-endian u64, so byte order is numeric order."""
    return _U64.pack(n)


def prefix(tenant: bytes, run_id: bytes) -> bytes:
    """The key prefix of everything a run owns in a per-run database."""
    return tenant + b"\x00" + run_id + b"\x00"


def seq_key(tenant: bytes, run_id: bytes, n: int) -> bytes:
    """Key of the ``n``-th record of a run in a sequenced database."""
    return prefix(tenant, run_id) + _U64.pack(n)


SnapRow = tuple[int, bytes, bytes]  # a stored snapshot record: (number, key, sealed value)


def iter_prefix(txn: Any, db: Any, pfx: bytes, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
    """All (key, value) pairs of ``db`` whose key starts with ``pfx``, in key order.

    ``start`` (a key with that prefix) skips straight to it: reading the tail of
    a long journal costs the tail, not the whole journal.
    """
    cur = txn.cursor(db=db)
    first = start if start is not None else pfx
    if not (cur.set_range(first) if first else cur.first()):
        return
    for key, value in cur:
        if not key.startswith(pfx):
            return
        yield key, value


def last_seq(txn: Any, db: Any, pfx: bytes) -> int:
    """Sequence number of the last record under ``pfx`` (-1 if none)."""
    cur = txn.cursor(db=db)
    if cur.set_range(pfx + b"\xff" * 9):
        ok = cur.prev()
    else:
        ok = cur.last()
    if ok:
        k = cur.key()
        if k.startswith(pfx) and len(k) == len(pfx) + 8:
            return int.from_bytes(k[-8:], "big")
    return -1


def snap_rows(txn: Any, db: Any, pfx: bytes) -> list[SnapRow]:
    """The stored snapshot records of one run (key prefix ``pfx``), oldest first."""
    n = len(pfx) + 8
    return [
        (int.from_bytes(k[-8:], "big"), k, v) for k, v in iter_prefix(txn, db, pfx) if len(k) == n
    ]


class Sealer:
    """MACs records and chunk contents with the per-store secret (and, in an
    encrypted store, encrypts them with its data key: ``crypt``, a ``_crypt.Crypt``)."""

    __slots__ = ("_secret", "_chunk", "_record", "chunk_hash", "crypt")

    def __init__(self, secret: bytes, chunk_hash: str = CHUNK_HASHES[0], crypt: Any = None) -> None:
        self._secret = secret
        self.chunk_hash = chunk_hash
        self.crypt = crypt
        # keyed states to copy: setting a key up costs more than hashing a small record
        self._chunk: Any
        if chunk_hash == "blake3":
            import blake3  # imported here: keeps ``import tcc.store`` light

            if crypt is not None:  # addresses keyed by the data key, not by the secret file
                key = crypt.address_key
            else:  # its own key, derived from the secret for this one purpose
                key = blake3.blake3(secret, derive_key_context="tcc store 2026 chunk address").digest()
            self._chunk = blake3.blake3(key=key)
        elif chunk_hash == "blake2b" and crypt is None:
            self._chunk = hashlib.blake2b(key=secret, digest_size=32, person=b"tcc-chunk")
        else:
            raise ValueError(f"unknown chunk hash {chunk_hash!r}; known: {CHUNK_HASHES}"
                             + (" (blake3 only with encryption)" if crypt is not None else ""))
        self._record = hashlib.blake2b(key=secret, digest_size=_MAC_LEN, person=b"tcc-record")

    def with_chunk_hash(self, chunk_hash: str) -> Sealer:
        """This sealer (same secret and encryption) with chunk addresses hashed by ``chunk_hash``."""
        if chunk_hash == self.chunk_hash:
            return self
        return Sealer(self._secret, chunk_hash, self.crypt)

    def with_crypt(self, crypt: Any) -> Sealer:
        """This sealer (same secret and chunk hash) encrypting with ``crypt``."""
        return Sealer(self._secret, self.chunk_hash, crypt)

    def chunk_id(self, data: bytes | memoryview) -> bytes:
        """Content address (and MAC) of a chunk: keyed BLAKE3 or BLAKE2b, 256 bits."""
        h = self._chunk.copy()
        h.update(data)
        digest: bytes = h.digest()
        return digest

    def chunk_ids(self, pieces: list[memoryview]) -> list[bytes]:
        """:meth:`chunk_id` of each piece (one call for the ~210 chunks of a new MiB)."""
        base = self._chunk
        out = []
        for piece in pieces:
            h = base.copy()
            h.update(piece)
            out.append(h.digest())
        return out

    def lock_chunk(self, address: bytes, stored: bytes) -> bytes:
        """What goes into the chunks database for a chunk's stored form
        (``_chunks.encode_chunk`` output): encrypted, bound to ``address``, in an
        encrypted store; as it is otherwise."""
        if self.crypt is None:
            return stored
        sealed: bytes = self.crypt.encrypt(_chunk_ad(address), stored, _ENCRYPTED_HEAD)
        return sealed

    def unlock_chunk(self, address: bytes, value: bytes | memoryview) -> bytes | memoryview:
        """Inverse of :meth:`lock_chunk`; raise :class:`Corrupt` if it does not decrypt.

        The caller still verifies the decoded bytes against ``address``.
        """
        if self.crypt is None:
            return value
        view = memoryview(value)
        if len(view) < 1 or view[0] != ENCRYPTED:
            raise Corrupt("chunk is not encrypted, in an encrypted store")
        plain: bytes = self.crypt.decrypt(_chunk_ad(address), view[1:])
        return plain

    def check_tag(self, label: bytes) -> bytes:
        """A MAC proving this secret belongs to this store (kept in ``meta``)."""
        return hashlib.blake2b(label, key=self._secret, digest_size=16, person=b"tcc-check").digest()

    def _mac(self, db: bytes, key: bytes, body: bytes) -> bytes:
        h = self._record.copy()
        h.update(_U32.pack(len(db)) + db + _U32.pack(len(key)) + key)
        h.update(body)
        return h.digest()

    def mac(self, db: bytes, key: bytes, body: bytes) -> bytes:
        """The record MAC of ``body`` stored under (db, key)."""
        return self._mac(db, key, body)

    def mac_ok(self, db: bytes, key: bytes, mac: bytes, body: bytes) -> bool:
        """Whether ``mac`` is the record MAC of ``body`` under (db, key)."""
        return hmac.compare_digest(mac, self._mac(db, key, body))

    def verifies(self, db: bytes, key: bytes, value: bytes) -> bool:
        """Whether ``value`` is a sealed record of (db, key): its MAC checks out.

        Only the MAC: it needs no data key, so the structure check at open can
        ask it of an encrypted store's records too.
        """
        if len(value) < RECORD_MIN:
            return False
        return hmac.compare_digest(value[:_MAC_LEN], self._mac(db, key, value[_MAC_LEN:]))

    def seal(
        self, db: bytes, key: bytes, header: dict[str, Any], blobs: dict[str, bytes] | None = None
    ) -> bytes:
        """Encode ``header`` (JSON) plus named opaque ``blobs`` and MAC it for (db, key)."""
        parts: list[bytes] = []
        if blobs:
            lens: list[list[Any]] = []
            for name, blob in blobs.items():
                lens.append([name, len(blob)])
                parts.append(bytes(blob))
            header = {**header, "_b": lens}
        hjson = _JSON.encode(header).encode()
        body = bytes([_VERSION]) + _U32.pack(len(hjson)) + hjson + b"".join(parts)
        if self.crypt is not None:
            body = self.crypt.encrypt(_record_ad(db, key), body, _ENCRYPTED_HEAD)
        return self._mac(db, key, body) + body

    def open(
        self, db: bytes, key: bytes, value: bytes | memoryview
    ) -> tuple[dict[str, Any], dict[str, bytes]]:
        """Verify and decode a sealed record; raise :class:`Corrupt` if it does not verify."""
        value = bytes(value)
        if len(value) < _MAC_LEN + 5:
            raise Corrupt("record too short")
        mac, body = value[:_MAC_LEN], value[_MAC_LEN:]
        if not hmac.compare_digest(mac, self._mac(db, key, body)):
            raise Corrupt("record MAC mismatch")
        if self.crypt is not None:
            if body[0] != ENCRYPTED:
                raise Corrupt("record is not encrypted, in an encrypted store")
            body = self.crypt.decrypt(_record_ad(db, key), memoryview(body)[1:])
            if len(body) < 5:
                raise Corrupt("record too short")
        elif body[0] == ENCRYPTED:
            raise Corrupt("record is encrypted, in a store that is not")
        if body[0] != _VERSION:
            raise Corrupt(f"unknown record version {body[0]}")
        (hlen,) = _U32.unpack_from(body, 1)
        if 5 + hlen > len(body):
            raise Corrupt("record header runs past the record")
        # A record that verifies was written by a holder of the secret, but
        # decode it defensively anyway: every malformation is Corrupt.
        try:
            header = json.loads(body[5 : 5 + hlen])
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            raise Corrupt(f"record header is not JSON: {type(exc).__name__}") from None
        if not isinstance(header, dict):
            raise Corrupt("record header is not a JSON object")
        layout = header.pop("_b", [])
        if not isinstance(layout, list):
            raise Corrupt("record blob table is malformed")
        blobs: dict[str, bytes] = {}
        pos = 5 + hlen
        for item in layout:
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
                    and type(item[1]) is int and 0 <= item[1] <= len(body) - pos):
                raise Corrupt("record blob table is malformed")
            blobs[item[0]] = body[pos : pos + item[1]]
            pos += item[1]
        if pos != len(body):
            raise Corrupt("record has bytes beyond its blobs")
        return header, blobs


def _record_ad(db: bytes, key: bytes) -> bytes:
    """What an encrypted record body is bound to: its database and key (as the MAC is)."""
    return _U32.pack(len(db)) + db + _U32.pack(len(key)) + key


def _chunk_ad(address: bytes) -> bytes:
    """What an encrypted chunk is bound to: its address (never a record's: no database
    of records is called ``chunks``)."""
    return _record_ad(b"chunks", address)
