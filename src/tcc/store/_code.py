"""Module sources a run needs to continue on the code it started with (``tcc resume
--code pinned``), stored once per content.

A source is addressed by its SHA-256 (64 hex digits) and stored as a sealed
record, so it is authenticated (and encrypted in an encrypted store) like every
other record.  LMDB keeps them in ``meta`` under ``code`` + tenant + digest: a
store an older tcc wrote needs no new database, and an older tcc ignores them.
Sources are small and shared by every run of the same code, so gc keeps them.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..errors import StoreError, UsageError
from ._codec import Corrupt

if TYPE_CHECKING:
    from ._scope import Scope

__all__ = ["check_digest", "check_sources", "get_code", "put_code", "verify_source"]

_DIGEST = re.compile(r"[0-9a-f]{64}\Z")
MAX_SOURCE = 64 << 20  # a module bigger than this is not source a person wrote


def check_digest(digest: object) -> str:
    """``digest`` if it is 64 lowercase hex digits, else UsageError naming it."""
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        raise UsageError(f"a code digest is 64 lowercase hex digits (SHA-256), not {digest!r}")
    return digest


def check_sources(sources: Mapping[str, bytes]) -> dict[str, bytes]:
    """``{digest: source}`` with every source matching its digest, else UsageError."""
    out: dict[str, bytes] = {}
    for digest, source in sources.items():
        check_digest(digest)
        if not isinstance(source, (bytes, bytearray)):
            raise UsageError(f"source {digest[:12]}… must be bytes, not {type(source).__name__}")
        if len(source) > MAX_SOURCE:
            raise UsageError(f"source {digest[:12]}… is {len(source)} bytes; the limit is {MAX_SOURCE}")
        if hashlib.sha256(source).hexdigest() != digest:
            raise UsageError(f"source stored under {digest[:12]}… does not hash to it")
        out[digest] = bytes(source)
    return out


def verify_source(digest: str, source: bytes, where: str) -> bytes:
    """``source`` if its SHA-256 is ``digest``, else StoreError naming ``where``."""
    if hashlib.sha256(source).hexdigest() != digest:
        raise StoreError(f"{where}: the source stored under {digest[:12]}… does not hash to it")
    return source


def _key(scope: Scope, digest: str) -> bytes:
    return b"code\x00" + scope.tenant_key + b"\x00" + bytes.fromhex(digest)


def put_code(scope: Scope, sources: Mapping[str, bytes]) -> None:
    """See :meth:`tcc.store.Store.put_code`."""
    checked = check_sources(sources)
    if not checked:
        return
    db = scope.dbs["meta"]
    missing = scope.read(lambda txn: [d for d in checked if txn.get(_key(scope, d), db=db) is None])
    if not missing:
        return  # nothing to write: no transaction, no fsync

    def op(txn: Any) -> None:
        for digest in missing:
            key = _key(scope, digest)
            if txn.get(key, db=db) is None:
                txn.put(key, scope.sealer.seal(b"code", key, {"n": len(checked[digest])},
                                               {"src": checked[digest]}), db=db)

    scope.write(op)


def get_code(scope: Scope, digest: str) -> bytes:
    """See :meth:`tcc.store.Store.get_code`."""
    key = _key(scope, check_digest(digest))
    raw = scope.read(lambda txn: txn.get(key, db=scope.dbs["meta"]))
    if raw is None:
        raise StoreError(f"store {scope.path} holds no source with digest {digest[:12]}…")
    try:
        _, blobs = scope.sealer.open(b"code", key, raw)
    except Corrupt as exc:
        raise scope.corrupt(f"the source {digest[:12]}…", exc) from None
    return verify_source(digest, blobs.get("src", b""), f"store {scope.path}")
