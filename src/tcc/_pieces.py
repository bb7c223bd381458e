"""What the snapshot writer (``tcc.capture``) tells a store about the pieces of a payload.

A snapshot can reach the store as pieces: the pickle stream, then its out-of-band buffers
(``tcc.capture._framed``).  The store cuts each piece into content-defined chunks, so that
a large buffer changed in a few places shares the rest with the previous snapshot.  Some
pieces never change once written: a list segment's pickle (``tcc.capture._segments``) is
pickled anew, with other bytes throughout, whenever its items change.  Cutting such a
piece finds nothing to share, and every chunk it becomes costs the store bookkeeping at
every later checkpoint (manifest entries, reference sets).  A :class:`WholePiece` asks the
store to keep the piece as one chunk (up to ``tcc.store._chunks.WHOLE_MAX`` bytes).  This
module imports nothing, so that the capture side does not load a store to name it.
"""

from __future__ import annotations

__all__ = ["WholePiece"]


class WholePiece(bytes):
    """A payload piece that is only ever stored as a whole: ``bytes`` in every other way."""

    __slots__ = ()
