"""The store's format header (``meta``: ``b"format"``), and upgrading older formats.

The header is JSON: ``{"magic": "tcc-store", "version", "store_id",
"created", "check"}`` (plus ``"enc"`` in an encrypted store).  ``check`` is a
MAC under the store secret (see :func:`_check_label`), so a wrong secret, or
a version that damage changed, is refused at open.

Format versions:

* 1 -- the first format;
* 2 -- inline payloads and pending-release lists in snapshot records (see
  ``_chunks`` and ``_chunkrefs``);
* 3 -- per-run head records: the snapshot index and the journal, event,
  signal and run counts (``_heads``);
* 4 -- chunk addresses hashed with keyed BLAKE3 instead of BLAKE2b
  (``_codec.Sealer``); what new stores are;
* ``"4-encrypted"`` -- format 4 with records and chunks encrypted
  (``_crypt``), what a store created with a key is.  A tcc without encryption
  reads it as an unknown version and refuses the store ("upgrade tcc")
  instead of writing plain records into it.

Version 1 and 2 stores are upgraded in place to version 3 when opened (they
are read the same way; the upgrade writes every run's head records), and
only with the store to this process alone.  A version 3 store stays version
3: its chunk addresses are BLAKE2b, and re-addressing them would rewrite the
whole store.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Callable
from typing import Any

from ..errors import StoreCorruptError, StoreError
from ._codec import Sealer
from ._crypt import StoreKey, new_header, open_header, refuse_plain
from ._heads import head_key, is_head_key, seal_head

__all__ = ["CHUNK_HASH", "ENCRYPTED_FORMAT", "FORMAT", "check_format"]

FORMAT: dict[str, Any] = {"magic": "tcc-store", "version": 4}  # what new stores are
ENCRYPTED_FORMAT = "4-encrypted"
_UPGRADABLE = (1, 2)  # upgraded to 3 when opened
CHUNK_HASH = {3: "blake2b", 4: "blake3"}  # format version -> chunk address hash


def _check_label(store_id: str, version: int, encrypted: bool = False) -> bytes:
    """What the header's ``check`` MAC covers: the store id and, from format 4 on, the
    version (which selects the chunk hash), so a version changed by damage is refused at
    open instead of failing every chunk (and letting gc count none of them); and whether
    the store is encrypted."""
    if version <= 3:
        return store_id.encode()
    label = f"{store_id} format {version} chunk hash {CHUNK_HASH[version]}"
    return (label + " encrypted").encode() if encrypted else label.encode()


def check_format(txn: Any, dbs: dict[str, Any], sealer: Sealer, *, path: str,
                 store_key: StoreKey | None, lockfd: int,
                 upgraded: Callable[[], None]) -> Sealer:
    """Check the format header in write transaction ``txn`` (writing one into a new
    store, upgrading a version 1 or 2 store) and return ``sealer`` set up for it:
    its chunk hash, and its encryption if the store is encrypted.

    ``store_key`` encrypts a new store and must open an encrypted one (a plain
    store opened with a key is refused).  An upgrade needs the store to this
    process alone: it takes ``lockfd`` (the flock on ``tcc.lock``) exclusively,
    refuses with StoreError if another process has the store open, and calls
    ``upgraded()`` once it wrote the new header, so that the caller shares the
    lock again after the commit.
    """
    raw = txn.get(b"format", db=dbs["meta"])
    if raw is None:
        if txn.stat(dbs["runs"])["entries"] or txn.stat(dbs["snaps"])["entries"]:
            raise StoreCorruptError(f"store {path} has records but no format header")
        store_id = os.urandom(16).hex()
        label = _check_label(store_id, FORMAT["version"], store_key is not None)
        hdr = {**FORMAT, "store_id": store_id, "created": time.time(),
               "check": sealer.check_tag(label).hex()}
        crypt = None
        if store_key is not None:
            hdr["version"] = ENCRYPTED_FORMAT
            hdr["enc"], crypt = new_header(store_key, store_id, ENCRYPTED_FORMAT)
        txn.put(b"format", json.dumps(hdr).encode(), db=dbs["meta"])
        sealer = sealer.with_chunk_hash(CHUNK_HASH[FORMAT["version"]])
        if crypt is not None:
            sealer = sealer.with_crypt(crypt)
        return sealer
    try:
        hdr = json.loads(bytes(raw))
    except (ValueError, RecursionError):
        hdr = {}
    if not isinstance(hdr, dict):  # damage can leave any JSON value
        hdr = {}
    if hdr.get("magic") != FORMAT["magic"]:
        raise StoreCorruptError(f"{path} holds a foreign LMDB database, not a tcc store")
    encrypted = hdr.get("version") == ENCRYPTED_FORMAT
    if store_key is not None and hdr.get("version") in _UPGRADABLE:  # before upgrading
        raise refuse_plain(store_key, path)
    if encrypted:
        hdr["version"] = FORMAT["version"]  # (a copy) read as format 4
    if hdr.get("version") in _UPGRADABLE:  # everything v1 and v2 wrote, v3 reads the same way
        # A tcc that predates head records, still running on the store, would go
        # on writing records without them: upgrade only with the store to ourselves.
        try:
            fcntl.flock(lockfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fcntl.flock(lockfd, fcntl.LOCK_SH)  # (a failed conversion may drop it)
            raise StoreError(
                f"store {path} has format version {hdr.get('version')} and this tcc "
                "upgrades it to version 3 when it is open in no other "
                "process: stop the other tcc processes using it (they may run an older "
                "tcc) and try again") from None
        sealer = sealer.with_chunk_hash(CHUNK_HASH[3])  # its chunks stay BLAKE2b
        _write_head_records(txn, dbs, sealer)
        hdr["version"] = 3
        txn.put(b"format", json.dumps(hdr).encode(), db=dbs["meta"])
        upgraded()
    version: Any = hdr.get("version")
    chunk_hash = CHUNK_HASH.get(version) if type(version) is int else None
    if chunk_hash is None:
        raise StoreCorruptError(f"store {path} has format version {hdr.get('version')}; "
                                f"this tcc reads versions 1 to {FORMAT['version']}: upgrade tcc")
    sealer = sealer.with_chunk_hash(chunk_hash)
    store_id = str(hdr.get("store_id"))
    label = _check_label(store_id, version, encrypted)
    if hdr.get("check") != sealer.check_tag(label).hex():
        written = [ENCRYPTED_FORMAT if e else v for v, e in [(3, False), (4, False), (4, True)]
                   if (v, e) != (version, encrypted) and hdr.get("check")
                   == sealer.check_tag(_check_label(store_id, v, e)).hex()]
        if written:  # the version picks the chunk hash: reading on would fail every chunk
            raise StoreCorruptError(
                f"store {path}: its format header says version "
                f"{ENCRYPTED_FORMAT if encrypted else version} but the store "
                f"was written as version {written[0]} (damage changed the header); restore "
                "the store from a backup")
        raise StoreCorruptError(f"the secret file of store {path} does not belong to it; "
                                "restore the original secret file")
    if store_key is not None and not encrypted:
        raise refuse_plain(store_key, path)
    if encrypted:  # after the secret check: the data key, unwrapped with the store key
        sealer = sealer.with_crypt(
            open_header(hdr.get("enc"), store_key, store_id, ENCRYPTED_FORMAT, path))
    return sealer


def _write_head_records(txn: Any, dbs: dict[str, Any], sealer: Sealer) -> None:
    """Write the head records (the upgrade to format 3): per run the index of
    its snapshot numbers with its journal length (a journal head instead
    if it has no snapshot), its event and signal counts; per tenant its
    run count."""
    heads: dict[str, dict[bytes, list[int]]] = {}
    for db in ("snaps", "journal", "events", "signals", "runs"):
        found = heads[db] = {}
        with txn.cursor(db=dbs[db]) as cur:
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
        txn.put(head_key(db, pfx), seal_head(sealer, db, pfx, n), db=dbs[db])

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
