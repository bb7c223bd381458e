"""Content-defined chunking of snapshot payloads, so storage grows O(delta).

A payload is cut with FastCDC (gear hash, via ``pyfastcdc``'s Cython code:
about 0.3 ms per MiB here) into chunks of ~``AVG_CHUNK`` bytes whose
boundaries depend only on nearby content.  When a transcript grows at the end,
only the last chunk (and any chunk whose bytes really changed) is new; every
other chunk hashes to an address already in the store and is not written
again.  Each new chunk is compressed on its own with zstd, so compression no
longer defeats deduplication (compressing the whole payload first would).

A snapshot's *manifest* lists its chunks as ``(address, raw length)`` entries.
A long manifest would itself be O(state) per step, so past ``DIRECT_MAX``
entries it is cut, again by content (an entry ends a group when its address'
last byte has its low ``log2(GROUP_FANOUT)`` bits set), into *group nodes*
that are stored and deduplicated like chunks; the manifest then lists only
the groups.  Appending to a transcript then writes the new tail chunk, the
changed head chunk, one or two new group nodes and a short manifest.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Iterable
from typing import Any

from ._codec import Corrupt, Sealer

__all__ = [
    "AVG_CHUNK",
    "Entry",
    "build_manifest",
    "decode_chunk",
    "encode_chunk",
    "encode_node",
    "pack_entries",
    "parse_entries",
    "SplitMemo",
    "split",
]

AVG_CHUNK = 4096
DIRECT_MAX = 32
GROUP_FANOUT = 16
GROUP_MAX = 128
_RAW = 0
_ZSTD = 1
_ENTRY = struct.Struct("<Q32sI")

_local = threading.local()

Entry = tuple[int, bytes, int]  # (chunk id, keyed-hash address, raw length)


def _chunker() -> object:
    c = getattr(_local, "cdc", None)
    if c is None:
        from pyfastcdc import FastCDC  # imported lazily: keeps ``import tcc.store`` light

        c = _local.cdc = FastCDC(avg_size=AVG_CHUNK)
    return c


def _zstd() -> tuple[Any, Any]:
    pair: tuple[Any, Any] | None = getattr(_local, "zstd", None)
    if pair is None:
        import zstandard

        pair = _local.zstd = (zstandard.ZstdCompressor(level=3), zstandard.ZstdDecompressor())
    return pair


class SplitMemo:
    """The previous payload of one run, to skip re-hashing chunks that did not change.

    A new chunk whose FastCDC gear hash and length match a chunk of the
    previous payload is compared byte for byte with it (memcmp: ~10x faster
    than BLAKE2b) and, if equal, reuses its address.
    """

    __slots__ = ("payload", "index")

    def __init__(self) -> None:
        self.payload = b""
        self.index: dict[tuple[int, int], tuple[int, bytes]] = {}


def split(
    sealer: Sealer, payload: bytes | memoryview, memo: SplitMemo | None = None
) -> list[tuple[bytes, memoryview]]:
    """Cut ``payload`` into content-defined chunks; return ``(address, piece)`` pairs."""
    view = memoryview(payload).cast("B")
    if len(view) == 0:
        return []
    out: list[tuple[bytes, memoryview]] = []
    old = memo.payload if memo is not None else b""
    data = payload if isinstance(payload, bytes) else bytes(view)
    index: dict[tuple[int, int], tuple[int, bytes]] = {}
    for ch in _chunker().cut_buf(view):  # type: ignore[attr-defined]
        off, n = ch.offset, ch.length
        piece = view[off : off + n]
        sig = (ch.gear_hash, n)
        addr = None
        if memo is not None:
            hit = memo.index.get(sig)
            if hit is not None and old[hit[0] : hit[0] + n] == data[off : off + n]:
                addr = hit[1]
        if addr is None:
            addr = sealer.chunk_id(piece)
        index[sig] = (off, addr)
        out.append((addr, piece))
    if memo is not None:
        memo.payload = data
        memo.index = index
    return out


def encode_chunk(piece: bytes | memoryview) -> bytes:
    """Stored form of a chunk: a codec byte, then zstd (or raw if that is smaller)."""
    comp: bytes = _zstd()[0].compress(piece)
    if len(comp) < len(piece):
        return bytes([_ZSTD]) + comp
    return bytes([_RAW]) + bytes(piece)


def encode_node(content: bytes) -> bytes:
    """Stored form of a group node (never compressed: it is hashes)."""
    return bytes([_RAW]) + content


def decode_chunk(sealer: Sealer, address: bytes, stored: bytes | memoryview, raw_len: int) -> bytes:
    """Decode a stored chunk and verify it against its address; raise Corrupt if it fails."""
    stored = memoryview(stored)
    if len(stored) < 1:
        raise Corrupt("empty chunk")
    codec = stored[0]
    if codec == _RAW:
        data = bytes(stored[1:])
    elif codec == _ZSTD:
        try:
            data = _zstd()[1].decompress(stored[1:], max_output_size=raw_len)
        except Exception as exc:  # zstd raises its own ZstdError on damage
            raise Corrupt(f"chunk does not decompress: {exc}") from None
    else:
        raise Corrupt(f"unknown chunk codec {codec}")
    if len(data) != raw_len or sealer.chunk_id(data) != address:
        raise Corrupt("chunk content does not match its address")
    return data


def pack_entries(entries: Iterable[Entry]) -> bytes:
    """Binary form of a list of ``(chunk id, address, length)`` entries."""
    return b"".join(_ENTRY.pack(i, h, n) for i, h, n in entries)


def parse_entries(blob: bytes) -> list[Entry]:
    """Inverse of :func:`pack_entries`; raise Corrupt on a bad length."""
    if len(blob) % _ENTRY.size:
        raise Corrupt("manifest has a truncated entry")
    return [(int(i), bytes(h), int(n)) for i, h, n in _ENTRY.iter_unpack(blob)]


def build_manifest(
    sealer: Sealer,
    leaves: list[Entry],
    node_id: Callable[[bytes], int],
    memo: dict[bytes, bytes] | None = None,
) -> tuple[int, list[Entry], dict[int, bytes]]:
    """Group ``leaves`` by content, level over level, until at most ``DIRECT_MAX`` remain.

    Returns ``(depth, top entries, group nodes by id)``: depth 0 means the top
    entries are the leaves themselves.  ``node_id(address)`` gives the chunk
    id of a group node (reusing the previous snapshot's id when unchanged).
    ``memo`` maps node content to address across calls (it is replaced by
    this call's nodes), to avoid re-hashing unchanged nodes.
    """
    seen: dict[bytes, bytes] = {}
    mask = GROUP_FANOUT - 1
    nodes: dict[int, bytes] = {}
    level = list(leaves)
    depth = 0
    while len(level) > DIRECT_MAX:
        depth += 1
        upper: list[Entry] = []
        group: list[Entry] = []
        for i, entry in enumerate(level):
            group.append(entry)
            if (entry[1][-1] & mask) == mask or len(group) >= GROUP_MAX or i == len(level) - 1:
                content = pack_entries(group)
                addr = (memo or seen).get(content) or sealer.chunk_id(content)
                seen[content] = addr
                nid = node_id(addr)
                nodes[nid] = content
                upper.append((nid, addr, len(content)))
                group = []
        level = upper
    if memo is not None:
        memo.clear()
        memo.update(seen)
    return depth, level, nodes
