"""The snapshot envelope: header, integrity digest, zstandard payload.

Layout (all integers big-endian)::

    magic      4 bytes   b"TCC\\x00"
    version    u16       FORMAT_VERSION
    taglen     u8        length of the interpreter tag
    tag        taglen    e.g. b"cpython-312|cb0d0d0a|O0"
    flags      u8        bit 0: payload is zstandard-compressed;
                         bit 1: *stored*, the digest is left out (zero)
    digest     16 bytes  BLAKE2b-128 of the payload bytes as stored
    payload    rest      the pickle (compressed if flag bit 0)

The digest is checked before decompression and before anything is unpickled,
so a damaged blob is always refused and never reaches the pickle machine.  It
is an integrity check, not authentication: the store adds a keyed MAC.

A snapshot the runtime hands to a store is sealed ``stored=True``: the store
authenticates every byte of it (MACs over its record and keyed addresses over
its chunks) before returning it, so a digest of its own would only be a second
pass over the whole state at every step.  Such a blob is read only by a caller
that says its bytes were authenticated (``unseal(..., authenticated=True)``);
:func:`tcc.loads` and any other reader refuse it.

Decompression is bounded: a payload inflates to at most :func:`max_payload`
bytes (``$TCC_MAX_SNAPSHOT_SIZE``, default 256 MiB).  A frame that declares a
larger size is refused before anything is allocated, and one that does not
declare its size is inflated piece by piece and cut off at the limit, so a few
kilobytes of hostile zstandard cannot make a reader allocate gigabytes.
:func:`seal` refuses to compress a payload larger than the limit, so that a
run never stores a snapshot it could not read back.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import struct
import sys

import zstandard

from .. import errors

MAGIC = b"TCC\x00"
FORMAT_VERSION = 1
FLAG_ZSTD = 0x01
FLAG_STORED = 0x02
_NO_DIGEST = bytes(16)
_FIXED = struct.Struct(">4sHB")
_DIGEST = 16


def interpreter_tag() -> bytes:
    """What an instruction offset depends on besides the code itself."""
    impl = sys.implementation.cache_tag or sys.implementation.name
    magic = importlib.util.MAGIC_NUMBER.hex()
    return f"{impl}|{magic}|O{sys.flags.optimize}".encode()


DEFAULT_MAX_PAYLOAD = 256 << 20
_READ_STEP = 1 << 20  # bytes inflated at a time when a frame does not declare its size
_SIZE = re.compile(r"\s*(\d+)\s*([KMGT]?)(?:I?B)?\s*", re.IGNORECASE)


def max_payload() -> int:
    """The largest payload (in bytes, after decompression) a snapshot may inflate to.

    ``$TCC_MAX_SNAPSHOT_SIZE`` (bytes, or with a K/M/G/T suffix) raises or lowers
    it; the default is 256 MiB.  A value that does not parse is ignored.
    """
    raw = os.environ.get("TCC_MAX_SNAPSHOT_SIZE", "")
    m = _SIZE.fullmatch(raw) if raw else None
    if m is None:
        return DEFAULT_MAX_PAYLOAD
    value = int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}[m.group(2).upper()]
    return max(value, 1)


def _too_large(size: int | None, limit: int) -> errors.CorruptSnapshotError:
    what = (f"says it inflates to {size} bytes, more than the limit of {limit} bytes; it was not "
            "decompressed" if size is not None else
            f"inflates to more than the limit of {limit} bytes; decompression stopped there")
    return errors.CorruptSnapshotError(
        f"snapshot payload {what} (raise $TCC_MAX_SNAPSHOT_SIZE if a snapshot this large is "
        "expected)")


_TAG = interpreter_tag()
_cctx: dict[int, zstandard.ZstdCompressor] = {}
_dctx = zstandard.ZstdDecompressor()


def seal(payload: bytes, *, level: int = 3, compress: bool = True, stored: bool = False) -> bytes:
    """Wrap a pickle payload into a snapshot blob.

    ``stored``: the blob goes to a tcc store, which authenticates it, and carries no
    digest of its own (see the module docstring); only ``unseal(..., authenticated=True)``
    reads it."""
    flags = FLAG_STORED if stored else 0
    if compress:
        limit = max_payload()
        if len(payload) > limit:
            raise errors.CaptureError(
                f"the snapshot payload is {len(payload)} bytes, more than the limit of {limit} "
                "bytes a snapshot may inflate to (readers would refuse it); raise "
                "$TCC_MAX_SNAPSHOT_SIZE, or keep large data out of the captured state")
        cctx = _cctx.get(level)
        if cctx is None:
            cctx = _cctx[level] = zstandard.ZstdCompressor(level=level, write_checksum=True)
        payload = cctx.compress(payload)
        flags |= FLAG_ZSTD
    digest = _NO_DIGEST if stored else hashlib.blake2b(payload, digest_size=_DIGEST).digest()
    return b"".join((_header(flags, digest), payload))


def stored_header() -> bytes:
    """The envelope header of an uncompressed blob sealed ``stored=True``: it does not
    depend on the payload, so a pickle can be written right after it (no copy)."""
    return _header(FLAG_STORED, _NO_DIGEST)


def _header(flags: int, digest: bytes) -> bytes:
    return _FIXED.pack(MAGIC, FORMAT_VERSION, len(_TAG)) + _TAG + bytes((flags,)) + digest


def unseal(blob: bytes | bytearray | memoryview, *, authenticated: bool = False) -> bytes:
    """Check a snapshot blob's envelope and return the pickle payload.

    ``authenticated``: the caller has verified every byte of ``blob`` (a store returned
    it), so a blob sealed ``stored=True``, which has no digest, is accepted too."""
    view = memoryview(blob)
    if len(view) < _FIXED.size:
        raise errors.CorruptSnapshotError(
            f"snapshot is truncated: {len(view)} bytes is shorter than its header"
        )
    magic, version, taglen = _FIXED.unpack_from(view)
    if magic != MAGIC:
        raise errors.CorruptSnapshotError(
            f"not a tcc snapshot (magic {bytes(magic)!r}, expected {MAGIC!r})"
        )
    if version != FORMAT_VERSION:
        raise errors.IncompatibleSnapshotError(
            f"snapshot format version {version}, but this tcc reads version "
            f"{FORMAT_VERSION}; use the tcc release that wrote it, or replay the run"
        )
    pos = _FIXED.size
    end = pos + taglen + 1 + _DIGEST
    if len(view) < end:
        raise errors.CorruptSnapshotError("snapshot is truncated inside its header")
    tag = bytes(view[pos : pos + taglen])
    if tag != _TAG:
        raise errors.IncompatibleSnapshotError(
            f"snapshot was taken on interpreter {tag.decode(errors='replace')!r}, "
            f"this is {_TAG.decode()!r}; frames can only resume on the interpreter "
            "(version, bytecode magic, -O level) that captured them"
        )
    flags = view[pos + taglen]
    digest = bytes(view[pos + taglen + 1 : end])
    payload = view[end:]
    if flags & ~(FLAG_ZSTD | FLAG_STORED):
        raise errors.CorruptSnapshotError(f"unknown snapshot flags 0x{flags:02x}")
    if flags & FLAG_STORED:
        if not authenticated:
            raise errors.CorruptSnapshotError(
                "this snapshot has no digest of its own: it was written into a tcc store, which "
                "authenticates it, and is read only from there (tcc.loads reads what tcc.dumps "
                "wrote)")
        if digest != _NO_DIGEST:
            raise errors.CorruptSnapshotError("snapshot envelope is damaged (a stored blob with a digest)")
    elif hashlib.blake2b(payload, digest_size=_DIGEST).digest() != digest:
        raise errors.CorruptSnapshotError("snapshot payload fails its integrity check")
    if flags & FLAG_ZSTD:
        try:
            return _inflate(payload, max_payload())
        except zstandard.ZstdError as exc:
            raise errors.CorruptSnapshotError(f"snapshot payload does not decompress: {exc}") from None
    return bytes(payload)


def _inflate(payload: memoryview, limit: int) -> bytes:
    """Decompress one zstandard frame of at most ``limit`` bytes (else CorruptSnapshotError)."""
    size = zstandard.frame_content_size(payload)
    if size > limit:
        raise _too_large(size, limit)
    if size >= 0:  # the frame says its size (seal's do): zstandard checks that it is true
        data: bytes = _dctx.decompress(payload)
        return data
    # No size in the frame header: inflate a step at a time, never past the limit.
    parts: list[bytes] = []
    total = 0
    with _dctx.stream_reader(payload, read_across_frames=False) as reader:
        while True:
            part = reader.read(_READ_STEP)
            if not part:
                break
            total += len(part)
            if total > limit:
                raise _too_large(None, limit)
            parts.append(part)
    return b"".join(parts)
