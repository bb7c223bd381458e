"""Content-defined chunking of snapshot payloads, so storage grows O(delta).

A payload is cut with FastCDC (gear hash, via ``pyfastcdc``'s Cython code:
about 0.3 ms per MiB here) into chunks of ~``AVG_CHUNK`` bytes whose
boundaries depend only on nearby content.  When a transcript grows at the end,
only the last chunk (and any chunk whose bytes really changed) is new; every
other chunk hashes to an address already in the store and is not written
again.  Each new chunk is compressed on its own with zstd, so compression no
longer defeats deduplication (compressing the whole payload first would).
In an encrypted store each stored chunk is then encrypted on its own
(``Sealer.lock_chunk``): deduplication is decided on addresses, never on the
stored bytes, so it works the same.

A snapshot's *manifest* lists its chunks as ``(address, raw length)`` entries.
A long manifest would itself be O(state) per step, so past ``DIRECT_MAX``
entries it is cut, again by content (an entry ends a group when its address'
last byte has its low ``log2(GROUP_FANOUT)`` bits set), into *group nodes*
that are stored and deduplicated like chunks; the manifest then lists only
the groups.  Appending to a transcript then writes the new tail chunk, the
changed head chunk, one or two new group nodes and a short manifest.

Payloads of at most ``INLINE_MAX`` bytes are not chunked: their compressed
form goes into the snapshot record itself (blob ``p``), which the record's MAC
(and, in an encrypted store, its encryption) covers.  Cutting, hashing and
reference-counting a payload that fits in one or two chunks costs more than
rewriting it, and it dirties the chunk tree.
"""

from __future__ import annotations

import struct
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable
from typing import Any

from .._pieces import WholePiece
from ..errors import UsageError
from ._codec import Corrupt, Sealer

__all__ = [
    "AVG_CHUNK",
    "ChunkEncoder",
    "Entry",
    "build_manifest",
    "INLINE_MAX",
    "decode_chunk",
    "decode_inline",
    "encode_chunk",
    "encode_node",
    "joined",
    "payload_size",
    "pack_entries",
    "parse_entries",
    "SplitMemo",
    "split",
]

AVG_CHUNK = 4096
INLINE_MAX = 8192  # payloads up to this size are stored whole in their snapshot record
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
    """The previous payload of one run and how it was cut, to re-cut only what changed.

    FastCDC decides each cut from the bytes after the previous cut only (and
    from how many bytes remain, up to its maximum chunk size).  So where the
    new payload has the same bytes as the old one starting at an old cut --
    at the same offset (an edit in place) or shifted by the change in length
    (an insertion) -- the old chunks there are the chunks a full cut would
    produce, with the same addresses.  Such runs are found with ``memcmp``
    (``bytes.startswith`` on a memoryview: ~30 us per MiB) instead of running
    the gear hash and the chunk hash over them, and without a Python step per chunk.
    Only chunks whose bytes really differ are cut and hashed.  The memo lives
    in memory only: an address reused from it was computed here over bytes
    just compared equal, never read back from disk.
    """

    __slots__ = ("payload", "cuts", "starts", "offsets", "ends", "pieces")

    def __init__(self) -> None:
        self.pieces: dict[int, tuple[bytes, list[tuple[bytes, memoryview]]]] = {}
        self.payload = b""
        self.cuts: list[tuple[int, int, bytes]] = []  # (offset, length, address)
        self.starts: dict[int, int] = {}  # offset -> index in cuts
        self.offsets: list[int] = []  # offset of each cut (ascending)
        self.ends: list[int] = []  # end of each cut (ascending)


def _py_common(new: bytes, pos: int, old_view: memoryview, b: int) -> int:
    """Length of the common run of ``new[pos:]`` and ``old[b:]`` (galloping memcmp).

    The pure-Python form of ``tcc.store._fast.common_len``, used when the C
    helper is not built.
    """
    limit = min(len(new) - pos, len(old_view) - b)
    lo, step = 0, 16384
    while lo < limit:  # gallop: grow the compared span while it matches
        hi = min(limit, lo + step)
        if not new.startswith(old_view[b + lo : b + hi], pos + lo):
            break
        lo = hi
        step *= 2
    else:
        return limit
    hi = min(limit, lo + step)
    while hi - lo > 64:  # the first difference is in [lo, hi): bisect it
        mid = (lo + hi) // 2
        if new.startswith(old_view[b + lo : b + mid], pos + lo):
            lo = mid
        else:
            hi = mid
    while lo < hi and new[pos + lo] == old_view[b + lo]:
        lo += 1
    return lo


try:
    from ._fast import common_len as _common  # optional C helper (native/tcc_store.c)
except ImportError:  # not built: the pure-Python form gives the same answers
    _common = _py_common


Payload = bytes | bytearray | memoryview | tuple[Any, ...] | list[Any]  # tuple, list: pieces


def payload_size(payload: Any) -> int:
    """The length of a payload given whole or as pieces; UsageError for anything else."""
    if isinstance(payload, (tuple, list)):
        if not payload or not all(isinstance(p, (bytes, bytearray, memoryview)) for p in payload):
            raise UsageError("a snapshot payload given as pieces must be a non-empty tuple or "
                             "list of bytes-like objects")
        return sum(memoryview(p).nbytes for p in payload)
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise UsageError(f"snapshot payload must be bytes, not {type(payload).__name__}")
    return memoryview(payload).nbytes


def joined(payload: Any) -> bytes | memoryview:
    """The payload as one bytes-like object."""
    if isinstance(payload, (tuple, list)):
        return b"".join(payload)
    return memoryview(payload)


def split(
    sealer: Sealer, payload: Any, memo: SplitMemo | None = None
) -> list[tuple[bytes, memoryview]]:
    """Cut ``payload`` into content-defined chunks; return ``(address, piece)`` pairs.

    The result is exactly that of a full FastCDC cut; ``memo`` (the previous
    payload of the same run) only avoids re-cutting and re-hashing what did
    not change.

    A payload given as pieces (a tuple or list whose concatenation it is; see
    ``tcc.capture._framed``) is cut piece by piece: its first piece as above, each
    other one on its own: whole up to ``PIECE_WHOLE`` bytes (``WHOLE_MAX`` for a
    :class:`tcc._pieces.WholePiece`), else with larger chunks (``PIECE_CHUNK``).  A piece that is the
    same ``bytes`` object as a piece of the memo's payload keeps its chunks without
    being read: a ``bytes`` object cannot change.
    """
    if isinstance(payload, (tuple, list)):
        return _split_pieces(sealer, payload, memo)
    if memo is not None:
        memo.pieces = {}
    return _split_one(sealer, payload, memo)


def _split_one(
    sealer: Sealer, payload: bytes | memoryview, memo: SplitMemo | None
) -> list[tuple[bytes, memoryview]]:
    view = memoryview(payload).cast("B")
    data = payload if isinstance(payload, bytes) else bytes(view)
    total = len(data)
    cuts: list[tuple[int, int, bytes]] = []
    fresh: list[int] = []  # indices in cuts of the pieces cut here, still without an address
    if total:
        cdc = _chunker()
        big = cdc.max_size  # type: ignore[attr-defined]
        if memo is not None and memo.cuts:
            old = memo.payload
            old_view = memoryview(old)
            old_cuts, starts, offsets, ends = memo.cuts, memo.starts, memo.offsets, memo.ends
            shift = total - len(old)
            shifts: tuple[int, ...] = (0, shift) if shift else (0,)
        else:
            old, old_cuts, starts, offsets, ends, shifts = b"", [], {}, [], [], ()
            old_view = memoryview(old)
        pos = 0
        it = None
        while pos < total:
            reused = False
            for sh in shifts:
                j = starts.get(pos - sh)
                if j is None:
                    continue
                b = pos - sh
                same = _common(data, pos, old_view, b)
                if same == len(old) - b == total - pos:
                    # the whole rest is unchanged: so are its cuts
                    cuts.extend(old_cuts[j:] if not sh else [(o + sh, n, a) for o, n, a in old_cuts[j:]])
                    pos = total
                    reused = True
                    break
                # A cut is reproduced if every byte it looked at (up to and including
                # the first byte after it) is unchanged and neither buffer ends within
                # the chunker's window (the remaining length steers FastCDC near the
                # end).  Both limits are monotone in k, so each is one bisection:
                # the cut must end before b + same, and start before ``window``.
                k = min(bisect_left(ends, b + same, j),
                        bisect_left(offsets, min(len(old), total - sh) - big, j))
                if k > j:
                    cuts.extend(old_cuts[j:k] if not sh else [(o + sh, n, a) for o, n, a in old_cuts[j:k]])
                    o, n, _ = old_cuts[k - 1]
                    pos = o + sh + n
                    reused = True
                    break
            if reused:
                it = None
                continue
            if it is None:
                it = iter(cdc.cut_buf(view[pos:]))  # type: ignore[attr-defined]
                base = pos
            # Take new cuts until one ends where an old cut starts (from there the
            # old cuts may apply again) or the payload ends.  All-new bytes take
            # ~210 cuts per MiB in this loop, so it does no more than it must.
            shift = shifts[-1] if shifts else 0
            for ch in it:
                n = ch.length
                fresh.append(len(cuts))
                cuts.append((pos, n, b""))
                pos = base + ch.offset + n
                if pos >= total or pos in starts or pos - shift in starts:
                    break
            else:
                if pos < total:  # FastCDC always cuts to the end of its buffer
                    raise RuntimeError(f"chunker stopped at {pos} of {total} bytes")
    if fresh:
        todo: list[int] = []
        for i in fresh:
            o, n, _ = cuts[i]
            # Re-cut near the end (where FastCDC's cuts depend on the remaining
            # length) or after an edit: the same cut over the same bytes keeps
            # its address, checked with memcmp instead of hashing it again.
            for sh in shifts:
                j = starts.get(o - sh)
                if j is not None and old_cuts[j][1] == n and data.startswith(
                        old_view[o - sh : o - sh + n], o):
                    cuts[i] = (o, n, old_cuts[j][2])
                    break
            else:
                todo.append(i)
        if todo:
            addresses = sealer.chunk_ids([view[cuts[i][0] : cuts[i][0] + cuts[i][1]] for i in todo])
            for i, a in zip(todo, addresses):
                o, n, _ = cuts[i]
                cuts[i] = (o, n, a)
    out = [(a, view[o : o + n]) for o, n, a in cuts]
    if memo is not None:
        memo.payload = data
        memo.cuts = cuts
        memo.offsets = [c[0] for c in cuts]
        memo.starts = dict(zip(memo.offsets, range(len(cuts))))
        memo.ends = [o + n for o, n, _ in cuts]
    return out


PIECE_CHUNK = 128 << 10  # average chunk of a payload's later pieces (large buffers)
# A later piece up to the largest chunk the piece chunker makes is one chunk, uncut.  Such
# a piece is usually a list segment's pickle (``tcc.capture._segments``), which never
# changes: a changed segment is pickled anew, with other bytes throughout, so cutting it
# would find nothing to share.  A buffer of that size that changes is stored again whole
# (at most PIECE_WHOLE bytes) instead of its changed chunks.  In exchange every checkpoint
# holds one chunk per segment instead of three or four, and the store's bookkeeping per
# held chunk (manifest entries, reference sets, the address map) shrinks with it: ~11%
# fewer instructions per step on a 10,000-message transcript.
PIECE_WHOLE = 4 * PIECE_CHUNK  # FastCDC's largest chunk for that average
# A piece the writer marks as never changing (``tcc._pieces.WholePiece``: a list segment's
# pickle, up to 2,048 messages) is one chunk up to this length, cut as above beyond it.
WHOLE_MAX = 16 << 20


def _split_pieces(sealer: Sealer, pieces: tuple[Any, ...] | list[Any],
                  memo: SplitMemo | None) -> list[tuple[bytes, memoryview]]:
    out = _split_one(sealer, pieces[0], memo)
    known = memo.pieces if memo is not None else {}
    now: dict[int, tuple[bytes, list[tuple[bytes, memoryview]]]] = {}
    for piece in pieces[1:]:
        kind = type(piece)
        fixed = kind is bytes or kind is WholePiece  # cannot change: known by identity
        got = known.get(id(piece)) if fixed else None
        if got is not None and got[0] is piece:
            cuts = got[1]
        else:
            view = memoryview(piece).cast("B")
            if len(view) <= (WHOLE_MAX if kind is WholePiece else PIECE_WHOLE):
                spans = [(0, len(view))]
            else:
                spans = [(c.offset, c.length) for c in _piece_chunker().cut_buf(view)]  # type: ignore[attr-defined]
            addresses = sealer.chunk_ids([view[o:o + n] for o, n in spans])
            cuts = [(a, view[o:o + n]) for (o, n), a in zip(spans, addresses)]
        if fixed:
            now[id(piece)] = (piece, cuts)
        out.extend(cuts)
    if memo is not None:
        memo.pieces = now
    return out


def _piece_chunker() -> object:
    c = getattr(_local, "piece_cdc", None)
    if c is None:
        from pyfastcdc import FastCDC

        c = _local.piece_cdc = FastCDC(avg_size=PIECE_CHUNK)
    return c


def encode_chunk(piece: bytes | memoryview) -> bytes:
    """Stored form of a chunk: a codec byte, then zstd (or raw if that is smaller)."""
    return _smaller(piece, _zstd()[0].compress(piece))


def _smaller(piece: bytes | memoryview, comp: bytes) -> bytes:
    """Stored form of ``piece`` given its zstd form ``comp``: whichever is smaller."""
    if len(comp) < len(piece):
        return bytes([_ZSTD]) + comp
    return bytes([_RAW]) + bytes(piece)


# A chunk that zstd shrinks by less than 1/_WORTH is "incompressible" to
# :class:`ChunkEncoder`; after one, it stores the next 1, 2, 4 ... up to
# _SKIP_MAX new chunks raw without trying.
_WORTH = 32
_SKIP_MAX = 16


class ChunkEncoder:
    """Encodes the new chunks of one payload, in payload order, skipping hopeless zstd calls.

    zstd spends about as long failing to compress random bytes (encrypted
    or already-compressed data, float arrays) as compressing text: 0.8 ms
    per MiB here, a third of the store's CPU for a payload of all-new random
    bytes.  Such bytes come in runs, so after a chunk that does not compress
    the encoder stores the next ones raw without trying, backing off
    exponentially (1, 2, 4 ... ``_SKIP_MAX`` chunks) while they keep failing,
    and tries every chunk again after one that compresses.  A long random
    run costs one zstd call per ``_SKIP_MAX + 1`` chunks; the price is that up
    to ``_SKIP_MAX`` compressible chunks right after one are stored raw.
    The stored form is :func:`encode_chunk`'s, so readers see no difference.
    """

    __slots__ = ("_skip", "_backoff", "tried")

    def __init__(self) -> None:
        self._skip = 0
        self._backoff = 0
        self.tried = 0  # zstd calls made (for tests)

    def encode(self, piece: bytes | memoryview) -> bytes:
        """Stored form of the next new chunk of the payload."""
        if self._skip and len(piece) <= PIECE_WHOLE:  # (a longer one, a whole list
            # segment's pickle, is worth a try of its own: random bytes come in smaller runs)
            self._skip -= 1
            return bytes([_RAW]) + bytes(piece)
        self.tried += 1
        comp: bytes = _zstd()[0].compress(piece)
        n = len(piece)
        if len(comp) * _WORTH < n * (_WORTH - 1):
            self._backoff = self._skip = 0  # (a long chunk tried during a back-off ends it)
            return bytes([_ZSTD]) + comp
        self._backoff = min(2 * self._backoff or 1, _SKIP_MAX)
        self._skip = self._backoff
        return _smaller(piece, comp)


def encode_node(content: bytes) -> bytes:
    """Stored form of a group node (never compressed: it is hashes)."""
    return bytes([_RAW]) + content


def decode_chunk(sealer: Sealer, address: bytes, stored: bytes | memoryview, raw_len: int) -> bytes:
    """Decode a stored chunk (decrypting it first in an encrypted store) and verify it
    against its address; raise Corrupt if it fails."""
    data = decode_inline(sealer.unlock_chunk(address, stored), raw_len)
    if sealer.chunk_id(data) != address:
        raise Corrupt("chunk content does not match its address")
    return data


def decode_inline(stored: bytes | memoryview, raw_len: int) -> bytes:
    """Decode :func:`encode_chunk` output of ``raw_len`` bytes; raise Corrupt if it fails.

    No MAC check here: callers verify the bytes (a chunk against its address
    in :func:`decode_chunk`, an inline payload by its record's MAC).
    """
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
    if len(data) != raw_len:
        raise Corrupt(f"chunk decodes to {len(data)} bytes, expected {raw_len}")
    return data


def pack_entries(entries: Iterable[Entry]) -> bytes:
    """Binary form of a list of ``(chunk id, address, length)`` entries."""
    pack = _ENTRY.pack
    return b"".join([pack(i, h, n) for i, h, n in entries])


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
    known = memo if memo is not None else seen
    mask = GROUP_FANOUT - 1
    size = _ENTRY.size
    chunk_id = sealer.chunk_id
    nodes: dict[int, bytes] = {}
    level = list(leaves)
    depth = 0
    while len(level) > DIRECT_MAX:
        depth += 1
        packed = pack_entries(level)
        # an entry ends a group when its address' last byte has the low bits set
        ends = [i + 1 for i, e in enumerate(level) if (e[1][-1] & mask) == mask]
        if not ends or ends[-1] != len(level):
            ends.append(len(level))
        upper: list[Entry] = []
        start = 0
        for end in ends:
            while start < end:
                stop = min(end, start + GROUP_MAX)
                content = packed[start * size : stop * size]
                addr = known.get(content) or chunk_id(content)
                seen[content] = addr
                nid = node_id(addr)
                nodes[nid] = content
                upper.append((nid, addr, len(content)))
                start = stop
        level = upper
    if memo is not None:
        memo.clear()
        memo.update(seen)
    return depth, level, nodes
