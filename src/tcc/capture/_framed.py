"""Snapshot payloads whose large buffers travel out of band (pickle protocol 5).

A snapshot the runtime stores may hand large byte buffers to the store beside the pickle
instead of inside it: the pickled segments of long lists (``_segments``) of at least
``SEGMENT_MIN_BYTES`` there (shorter ones stay in the pickle), ``bytes`` and
``bytearray`` values of at least :data:`MIN_BYTES`, and protocol-5 ``PickleBuffer``\\ s of
that size (numpy arrays).  The pickle then holds a ``NEXT_BUFFER`` opcode where each one
goes, and the store receives the payload as pieces -- the envelope with this frame and
the pickle, then each buffer -- whose concatenation is the payload it stores and returns.
A buffer that is the same ``bytes`` object as in the run's previous snapshot is not read
again by the store (``tcc.store._chunks``): an unchanged 100 MB value, or the segments of a
transcript's thousands of messages, cost a step nothing but their chunk references.

Layout of a framed payload (after the envelope; integers big-endian)::

    magic    4 bytes      MAGIC
    count    u32          how many buffers
    lengths  count x u64  the length of each buffer
    stream   the pickle, whose NEXT_BUFFER opcodes take the buffers in order
    buffers  the buffers, one after the other, up to the end

A pickle starts with its PROTO opcode (0x80), never with MAGIC, so one reader takes both
forms.  Loading slices the buffers out of the payload without copying them.
"""

from __future__ import annotations

import struct

from .. import errors

MAGIC = b"TCB\x01"
MIN_BYTES = 64 << 10  # bytes-like values at least this long go out of band
_COUNT = struct.Struct(">I")
_LENGTH = struct.Struct(">Q")
_MAX_BUFFERS = 1 << 24


def head(lengths: list[int]) -> bytes:
    """The frame before the pickle, for buffers of these lengths."""
    return b"".join([MAGIC, _COUNT.pack(len(lengths)), *(_LENGTH.pack(n) for n in lengths)])


def is_framed(payload: bytes | memoryview) -> bool:
    return bytes(payload[:4]) == MAGIC


def unframe(payload: bytes | memoryview) -> tuple[memoryview, list[memoryview]]:
    """The pickle and the buffers of a framed payload (views into it, not copies).

    Raises CorruptSnapshotError if the frame does not describe the payload."""
    view = memoryview(payload).cast("B")
    total = len(view)
    fixed = len(MAGIC) + _COUNT.size
    if total < fixed or bytes(view[:4]) != MAGIC:
        raise errors.CorruptSnapshotError("framed snapshot payload is truncated in its frame")
    (count,) = _COUNT.unpack_from(view, 4)
    table = fixed + count * _LENGTH.size
    if count > _MAX_BUFFERS or table > total:
        raise errors.CorruptSnapshotError(
            f"framed snapshot payload names {count} buffers, more than its {total} bytes hold")
    lengths = [n for (n,) in _LENGTH.iter_unpack(view[fixed:table])]
    stream_len = total - table - sum(lengths)
    if stream_len < 0:
        raise errors.CorruptSnapshotError(
            "framed snapshot payload is shorter than the buffers its frame lists")
    pos = table + stream_len
    buffers = []
    for n in lengths:
        buffers.append(view[pos:pos + n])
        pos += n
    return view[table:table + stream_len], buffers
