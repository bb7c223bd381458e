"""Code fingerprints: an instruction offset means something only for the
identical code object, so every by-reference function in a snapshot carries a
digest of everything that shapes its frame and bytecode.
"""

from __future__ import annotations

import functools
import hashlib
import types
from typing import Any


def _feed_const(h: Any, value: Any) -> None:
    if isinstance(value, types.CodeType):
        h.update(b"C")
        h.update(fingerprint(value))
    elif isinstance(value, tuple):
        h.update(b"T%d(" % len(value))
        for item in value:
            _feed_const(h, item)
        h.update(b")")
    elif isinstance(value, frozenset):
        h.update(b"F%d(" % len(value))
        for text in sorted(repr(v) for v in value):
            h.update(text.encode("utf-8", "surrogatepass"))
            h.update(b",")
        h.update(b")")
    else:
        h.update(type(value).__name__.encode())
        h.update(b":")
        h.update(repr(value).encode("utf-8", "surrogatepass"))
        h.update(b";")


@functools.lru_cache(maxsize=4096)
def fingerprint(code: types.CodeType) -> bytes:
    """16-byte BLAKE2b digest of a code object's bytecode-relevant parts.

    Line numbers are left out on purpose: adding a comment above a function
    must not invalidate its snapshots, since offsets do not move.
    """
    h = hashlib.blake2b(digest_size=16)
    h.update(code.co_code)
    h.update(code.co_exceptiontable)
    for names in (code.co_names, code.co_varnames, code.co_cellvars, code.co_freevars):
        h.update(b"\x00".join(n.encode("utf-8", "surrogatepass") for n in names))
        h.update(b"\x01")
    h.update(
        b"%d,%d,%d,%d,%d,%d"
        % (
            code.co_flags,
            code.co_argcount,
            code.co_posonlyargcount,
            code.co_kwonlyargcount,
            code.co_nlocals,
            code.co_stacksize,
        )
    )
    _feed_const(h, code.co_consts)
    return h.digest()
