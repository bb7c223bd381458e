"""Encryption at rest (optional): the store key, the per-store data key, and the AEAD.

Where the key comes from (:func:`resolve_key`), first match wins:

* ``open_store(key=...)``: 32 bytes, or a string of 64 hex digits;
* ``$TCC_STORE_KEY_FILE``: a file holding 32 raw bytes or 64 hex digits
  (whitespace around them is ignored), owned by this user and closed to the
  group and others (mode 0600 or 0400; refused otherwise);
* ``$TCC_STORE_KEY``: 64 hex digits.

Setting both variables is refused.  A store created with a key is encrypted
for good; a store created without one never is: opening an encrypted store
without a key, or a plain store with one, is refused with one error line.

Key hierarchy.  The *store key* (the user's, kept outside the store) never
encrypts data: it wraps a random 256-bit *data key* created with the store.
The format header in ``meta`` holds the wrapped data key (AES-256-GCM under a
key derived from the store key and a random salt, with the store id and format
version as associated data), so a wrong store key fails to unwrap it and is
refused at open, before any record is read.  The header also holds a 64-bit
*key id* (a keyed hash of a constant under the store key) that only tells a
wrong key from a damaged header in the error message.  Everything else is
derived from the data key with keyed BLAKE2b, one purpose per key: the chunk
address key (keyed BLAKE3, as in plain stores, but under this key instead of
the secret file's) and the session-key derivation key.

The AEAD is AES-256-GCM (``cryptography``'s ``AESGCM``).  Nonces never repeat
under one key: a process that encrypts starts a *session* -- 16 random bytes
``salt``, a session key ``BLAKE2b(session-derivation key, salt)`` and a 64-bit
counter starting at 0 -- and the nonce of each message is its counter.  A
sealed message is ``salt(16) | counter(8, big-endian) | ciphertext | tag(16)``
(40 bytes of overhead).  The counter is taken under a lock (threads) and a new
session starts in a forked child (the pid is checked per message), so one
(session key, nonce) pair is never used twice; two sessions share a key only if
their random 128-bit salts collide.  So there is no birthday bound on the
number of records or chunks a store may write under one data key (random
96-bit nonces would allow ~2^32 messages per key, which a busy store's head
records -- rewritten by every commit -- reach in months).  Decryption derives
and caches the session key of each salt it meets.

What is encrypted, and what it is bound to (associated data):

* every sealed record's body (JSON header and blobs: arguments, results,
  errors, signal values, event details, effect names, idempotency keys,
  manifests, inline payloads, head records), bound to its database and key,
  so a record moved to another key, run or tenant does not decrypt;
* every chunk and group node (after compression), bound to its address.

Deduplication is unaffected: it is decided on chunk *addresses* (a keyed hash
of the plaintext), never on stored bytes, so an unchanged chunk keeps its id
and is not written again; a chunk is encrypted once, when it is first stored.
The outer record MAC (keyed with the store's ``secret`` file) stays: it lets
the structure check at open tell a misplaced page before the header (and so
the data key) is read.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
import threading
from collections import OrderedDict
from typing import Any

from ..errors import StoreCorruptError, StoreError, StoreInsecureError, UsageError
from ._codec import Corrupt

__all__ = [
    "ALG",
    "Crypt",
    "KEY_ENV",
    "KEY_FILE_ENV",
    "OVERHEAD",
    "StoreKey",
    "key_id",
    "new_header",
    "open_header",
    "refuse_plain",
    "resolve_key",
]

KEY_FILE_ENV = "TCC_STORE_KEY_FILE"
KEY_ENV = "TCC_STORE_KEY"
ALG = "aes-256-gcm"
OVERHEAD = 16 + 8 + 16  # salt, counter, tag
_KEY_FILE_MAX = 4096
_NONCE_PAD = bytes(4)
_SESSION_CACHE = 256  # session keys of other processes' salts kept for decryption


def _aesgcm() -> Any:
    """The AESGCM class, or one clear error saying how to install it.

    The class lives in cryptography's compiled module, which its public ``aead`` module
    re-exports; importing that one also imports the package's whole ``ciphers`` layer (~15 ms
    in a fresh process, on the path of every ``tcc resume`` of an encrypted store).  The
    compiled module's class is taken when the compiled module has one (cryptography 50 does;
    ``test_encryption`` checks it is the public class), else the public module's."""
    try:
        from cryptography.hazmat.bindings._rust import openssl as rust_openssl

        return rust_openssl.aead.AESGCM
    except (ImportError, AttributeError):
        pass
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError:
        raise StoreError(
            "encryption at rest needs the 'cryptography' package, which is not installed: "
            "pip install 'tcc[encryption]'") from None
    return AESGCM


def _invalid_tag() -> type[Exception]:
    from cryptography.exceptions import InvalidTag

    return InvalidTag


class StoreKey:
    """A store key and where it came from; its repr never shows the key."""

    __slots__ = ("key", "source")

    def __init__(self, key: bytes, source: str) -> None:
        self.key = key
        self.source = source

    def __repr__(self) -> str:
        return f"<tcc store key from {self.source} (key id {key_id(self.key)})>"

    def same(self, other: StoreKey | None) -> bool:
        return other is not None and hmac.compare_digest(self.key, other.key)


def key_id(key: bytes) -> str:
    """A 64-bit fingerprint of a store key (a keyed hash of nothing): safe to show."""
    return hashlib.blake2b(b"", key=key, digest_size=8, person=b"tcc-key-id").hexdigest()


def _parse(raw: bytes | str, what: str) -> bytes:
    if isinstance(raw, (bytes, bytearray, memoryview)):
        raw = bytes(raw)
        if len(raw) == 32:
            if all(32 <= c < 127 for c in raw):  # random bytes are never all text (p < 1e-13)
                raise UsageError(f"{what} is 32 characters of text, not 32 random bytes: use "
                                 "64 hex digits (python -c 'import os; print(os.urandom(32).hex())')")
            return raw
        try:
            raw = raw.decode("ascii")
        except UnicodeDecodeError:
            raise UsageError(f"{what} must be 32 bytes or 64 hex digits, not {len(raw)} bytes") from None
    text = raw.strip()
    if len(text) != 64:
        raise UsageError(f"{what} must be 32 bytes or 64 hex digits, not {len(text)} characters")
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise UsageError(f"{what} must be 64 hex digits (0-9 a-f), and it is not") from None


def read_secret_file(path: str, name: str, *, unreadable: type[Exception] = StoreError) -> bytes:
    """The first bytes of the secret file ``path`` (a key is far smaller: more than
    ``_KEY_FILE_MAX`` means it is not one), once it is checked to be a regular file of this
    user, closed to group and others.  ``name`` is how messages call it (``the store key
    file (TCC_STORE_KEY_FILE=PATH)``); ``unreadable``: the error if it cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise unreadable(f"cannot read {name}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StoreInsecureError(f"{name} is not a regular file")
        if st.st_uid != os.geteuid():
            raise StoreInsecureError(
                f"{name} belongs to uid {st.st_uid}, not to this user "
                f"(uid {os.geteuid()}): whoever owns it controls the key; chown it")
        if st.st_mode & 0o077:
            raise StoreInsecureError(
                f"{name} has mode {stat.S_IMODE(st.st_mode):o}: other users "
                f"could read it; chmod 600 {path}")
        return os.read(fd, _KEY_FILE_MAX + 1)
    finally:
        os.close(fd)


def write_key_file(path: str, name: str, *, error: type[Exception] = StoreError,
                   make_folder: bool = False) -> bool:
    """Create ``path`` with a new random key (64 hex digits, mode 0600) unless it exists;
    True if created.  ``name``: how messages call it; ``error``: what a failure raises.

    Written in full under a temporary name (mkstemp: mode 0600), then linked into place,
    which fails if the name exists: a process racing this one never reads a key file that
    is still empty.  ``make_folder``: a missing folder is made (mode 0700)."""
    import secrets
    import tempfile

    if os.path.lexists(path):
        return False
    folder = os.path.dirname(os.path.abspath(path))
    try:
        if make_folder and not os.path.isdir(folder):  # (~/.tcc/transfer.key, a new machine)
            os.makedirs(folder, mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tcc-key-", dir=folder)
    except OSError as exc:
        raise error(f"cannot create {name}: {exc.strerror}") from None
    try:
        try:
            os.write(fd, (secrets.token_bytes(32).hex() + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError as exc:
            raise error(f"cannot create {name}: {exc.strerror}") from None
    finally:
        os.unlink(tmp)
    return True


def _read_key_file(path: str, label: str | None = None) -> bytes:
    """The key in ``path``: a regular file of this user, closed to group and others.
    ``label``: how messages name it (default ``TCC_STORE_KEY_FILE=path``)."""
    where = label or f"{KEY_FILE_ENV}={path}"
    data = read_secret_file(path, f"the store key file ({where})")
    if len(data) > _KEY_FILE_MAX:
        raise UsageError(f"the store key file ({where}) is too large to be a key")
    return _parse(data, f"the store key in {where}")


def resolve_key(key: bytes | str | StoreKey | None = None) -> StoreKey | None:
    """The store key to use: ``key`` if given, else from the environment (None: no key).

    Also checks that encryption is available when there is a key, so that a
    store is never created unencrypted for want of the library.
    """
    if isinstance(key, StoreKey):
        return key
    if key is not None:
        if not isinstance(key, (bytes, bytearray, memoryview, str)):
            raise UsageError(f"key must be 32 bytes or 64 hex digits, not {type(key).__name__}")
        found = StoreKey(_parse(key, "key"), "open_store(key=...)")
    else:
        path = os.environ.get(KEY_FILE_ENV) or ""
        text = os.environ.get(KEY_ENV) or ""
        if path and text:
            raise UsageError(f"both {KEY_FILE_ENV} and {KEY_ENV} are set: set only one")
        if path:
            found = StoreKey(_read_key_file(path), KEY_FILE_ENV)
        elif text:
            found = StoreKey(_parse(text, KEY_ENV), KEY_ENV)
        else:
            return None
    _aesgcm()
    return found


def _derive(key: bytes, purpose: bytes, data: bytes = b"") -> bytes:
    return hashlib.blake2b(data, key=key, digest_size=32, person=purpose).digest()


def _wrap_ad(store_id: str, version: int | str) -> bytes:
    return f"tcc store data key {store_id} format {version}".encode()


class Crypt:
    """The data key of one encrypted store: chunk address key and AEAD sessions (see above)."""

    __slots__ = ("address_key", "_aead", "_invalid", "_kdf", "_lock", "_pid", "_salt", "_cipher",
                 "_counter", "_ciphers")

    def __init__(self, data_key: bytes) -> None:
        if len(data_key) != 32:
            raise ValueError("a data key has 32 bytes")
        self._aead = _aesgcm()
        self._invalid = _invalid_tag()
        self.address_key = _derive(data_key, b"tcc-address")
        self._kdf = hashlib.blake2b(key=_derive(data_key, b"tcc-sessions"), digest_size=32,
                                    person=b"tcc-session")
        self._lock = threading.Lock()
        self._pid = -1  # no session yet
        self._salt = b""
        self._cipher: Any = None
        self._counter = 0
        self._ciphers: OrderedDict[bytes, Any] = OrderedDict()

    def _session_cipher(self, salt: bytes) -> Any:
        h = self._kdf.copy()
        h.update(salt)
        return self._aead(h.digest())

    def encrypt(self, ad: bytes, plain: bytes | memoryview, head: bytes = b"") -> bytes:
        """``head`` + ``plain`` sealed under this process's session, bound to ``ad``."""
        with self._lock:
            if self._pid != os.getpid() or self._counter >= 1 << 63:
                # a new process (fork) or an exhausted counter: a new session key
                self._salt = os.urandom(16)
                self._cipher = self._session_cipher(self._salt)
                self._counter = 0
                self._pid = os.getpid()
            n = self._counter
            self._counter = n + 1
            salt, cipher = self._salt, self._cipher
        ctr = n.to_bytes(8, "big")
        sealed: bytes = cipher.encrypt(_NONCE_PAD + ctr, plain, ad)
        return b"".join((head, salt, ctr, sealed))  # one copy of the ciphertext

    def decrypt(self, ad: bytes, blob: bytes | memoryview) -> bytes:
        """The plaintext of :meth:`encrypt` output; raise Corrupt if it does not verify."""
        blob = memoryview(blob)
        if len(blob) < OVERHEAD:
            raise Corrupt("too short to be encrypted")
        salt = bytes(blob[:16])
        with self._lock:
            cipher = self._ciphers.get(salt)
            if cipher is None:
                cipher = self._ciphers[salt] = self._session_cipher(salt)
                if len(self._ciphers) > _SESSION_CACHE:
                    self._ciphers.popitem(last=False)
        try:
            plain: bytes = cipher.decrypt(_NONCE_PAD + bytes(blob[16:24]), blob[24:], ad)
        except self._invalid:
            raise Corrupt("does not decrypt: damaged, moved, or written under another key") from None
        return plain


def new_header(key: StoreKey, store_id: str, version: int | str) -> tuple[dict[str, Any], Crypt]:
    """A new data key: the ``enc`` entry of a new store's format header, and its Crypt."""
    data_key = os.urandom(32)
    salt = os.urandom(16)
    wrap = _aesgcm()(_derive(key.key, b"tcc-wrap", salt))
    wrapped = wrap.encrypt(bytes(12), data_key, _wrap_ad(store_id, version))  # its key is used once
    enc = {"alg": ALG, "key_id": key_id(key.key), "salt": salt.hex(), "data_key": wrapped.hex()}
    return enc, Crypt(data_key)


def open_header(enc: object, key: StoreKey | None, store_id: str, version: int | str,
                path: str) -> Crypt:
    """The Crypt of an encrypted store whose header holds ``enc``; a clear error otherwise."""
    if not (isinstance(enc, dict) and all(isinstance(enc.get(f), str)
                                          for f in ("alg", "key_id", "salt", "data_key"))):
        raise StoreCorruptError(
            f"store {path} is encrypted but its format header's key entry is damaged; restore "
            "the store from a backup")
    if enc["alg"] != ALG:
        raise StoreError(f"store {path} is encrypted with {enc['alg']!r}, which this tcc does not "
                         f"know (it knows {ALG!r}): upgrade tcc")
    if key is None:
        raise StoreError(
            f"store {path} is encrypted; set {KEY_FILE_ENV} (or {KEY_ENV}) to its key "
            f"(key id {enc['key_id']}), or pass open_store(key=...)")
    try:
        salt, wrapped = bytes.fromhex(enc["salt"]), bytes.fromhex(enc["data_key"])
        wrap = _aesgcm()(_derive(key.key, b"tcc-wrap", salt))
        data_key = wrap.decrypt(bytes(12), wrapped, _wrap_ad(store_id, version))
    except (ValueError, _invalid_tag()):
        if not hmac.compare_digest(enc["key_id"], key_id(key.key)):
            raise StoreError(
                f"the key from {key.source} (key id {key_id(key.key)}) is not the key of store "
                f"{path} (key id {enc['key_id']}): wrong key; nothing was read or changed") from None
        raise StoreCorruptError(
            f"store {path}: the key from {key.source} is the store's (key id {enc['key_id']}) but "
            "the data key in the format header does not unwrap (damage changed the header); "
            "restore the store from a backup") from None
    return Crypt(data_key)


def refuse_plain(key: StoreKey, path: str) -> StoreError:
    """The error for a key given to open a store that is not encrypted."""
    return StoreError(
        f"store {path} is not encrypted, but a key was given ({key.source}); tcc does not encrypt "
        f"an existing store: unset {KEY_FILE_ENV} and {KEY_ENV} to use it as it is, or create a "
        "new store with the key")
