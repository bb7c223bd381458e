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
from collections.abc import Iterable

from ._codec import Corrupt, Sealer

__all__ = [
    "AVG_CHUNK",
    "Manifest",
    "build_manifest",
    "decode_chunk",
    "encode_chunk",
    "parse_entries",
    "split",
]

AVG_CHUNK = 8192
DIRECT_MAX = 32
GROUP_FANOUT = 16
GROUP_MAX = 128
_RAW = 0
_ZSTD = 1
_ENTRY = struct.Struct("<32sI")

_local = threading.local()

Entry = tuple[bytes, int]


def _chunker() -> object:
    c = getattr(_local, "cdc", None)
    if c is None:
        from pyfastcdc import FastCDC  # imported lazily: keeps ``import tcc.store`` light

        c = _local.cdc = FastCDC(avg_size=AVG_CHUNK)
    return c


def _zstd() -> tuple[object, object]:
    pair = getattr(_local, "zstd", None)
    if pair is None:
        import zstandard

        pair = _local.zstd = (zstandard.ZstdCompressor(level=3), zstandard.ZstdDecompressor())
    return pair  # type: ignore[no-any-return]


def split(sealer: Sealer, payload: bytes | memoryview) -> list[tuple[bytes, memoryview]]:
    """Cut ``payload`` into content-defined chunks; return ``(address, piece)`` pairs."""
    view = memoryview(payload).cast("B")
    if len(view) == 0:
        return []
    out: list[tuple[bytes, memoryview]] = []
    for ch in _chunker().cut_buf(view):  # type: ignore[attr-defined]
        piece = view[ch.offset : ch.offset + ch.length]
        out.append((sealer.chunk_id(piece), piece))
    return out


def encode_chunk(piece: bytes | memoryview) -> bytes:
    """Stored form of a chunk: a codec byte, then zstd (or raw if that is smaller)."""
    comp = _zstd()[0].compress(piece)  # type: ignore[attr-defined]
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
            data = _zstd()[1].decompress(stored[1:], max_output_size=raw_len)  # type: ignore[attr-defined]
        except Exception as exc:  # zstd raises its own ZstdError on damage
            raise Corrupt(f"chunk does not decompress: {exc}") from None
    else:
        raise Corrupt(f"unknown chunk codec {codec}")
    if len(data) != raw_len or sealer.chunk_id(data) != address:
        raise Corrupt("chunk content does not match its address")
    return data


def pack_entries(entries: Iterable[Entry]) -> bytes:
    """Binary form of a list of ``(address, length)`` entries."""
    return b"".join(_ENTRY.pack(h, n) for h, n in entries)


def parse_entries(blob: bytes) -> list[Entry]:
    """Inverse of :func:`pack_entries`; raise Corrupt on a bad length."""
    if len(blob) % _ENTRY.size:
        raise Corrupt("manifest has a truncated entry")
    return [(bytes(h), int(n)) for h, n in _ENTRY.iter_unpack(blob)]


class Manifest:
    """A snapshot's chunk list, either direct or through group nodes."""

    __slots__ = ("grouped", "top", "nodes")

    def __init__(self, grouped: bool, top: list[Entry], nodes: dict[bytes, bytes]) -> None:
        self.grouped = grouped
        #: direct: the leaf entries; grouped: (group address, node length) entries
        self.top = top
        #: group node contents by address (only those built here)
        self.nodes = nodes


def build_manifest(sealer: Sealer, leaves: list[Entry]) -> Manifest:
    """Group ``leaves`` by content when there are many of them."""
    if len(leaves) <= DIRECT_MAX:
        return Manifest(False, list(leaves), {})
    mask = GROUP_FANOUT - 1
    top: list[Entry] = []
    nodes: dict[bytes, bytes] = {}
    group: list[Entry] = []
    for i, entry in enumerate(leaves):
        group.append(entry)
        if (entry[0][-1] & mask) == mask or len(group) >= GROUP_MAX or i == len(leaves) - 1:
            content = pack_entries(group)
            addr = sealer.chunk_id(content)
            nodes[addr] = content
            top.append((addr, len(content)))
            group = []
    return Manifest(True, top, nodes)
