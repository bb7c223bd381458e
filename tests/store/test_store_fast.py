"""The optional C helper ``tcc.store._fast`` agrees with its pure-Python form.

The store uses ``common_len`` to find where a payload stops matching the
previous one (``_chunks.split``).  Without the extension it falls back to
``_py_common``; a wrong answer from either would make the store reuse a
chunk address for bytes that changed, so both are checked against a
byte-by-byte reference and against each other, and ``split`` is checked to
give the same cuts with either.
"""

from __future__ import annotations

import os
import random
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tcc.store import _chunks
from tcc.store._chunks import SplitMemo, _py_common, split
from tcc.store._codec import Sealer

try:
    from tcc.store._fast import common_len
except ImportError:  # pragma: no cover - only without a compiler
    common_len = None

needs_fast = pytest.mark.skipif(common_len is None, reason="tcc.store._fast is not built")


def _reference(a: bytes, i: int, b: bytes, j: int) -> int:
    n = 0
    while i + n < len(a) and j + n < len(b) and a[i + n] == b[j + n]:
        n += 1
    return n


def test_fast_helper_is_built_when_required() -> None:
    """With TCC_REQUIRE_NATIVE set (as in CI) the store helper must be importable."""
    if os.environ.get("TCC_REQUIRE_NATIVE", "") in ("", "0"):
        pytest.skip("TCC_REQUIRE_NATIVE is not set")
    assert common_len is not None
    assert _chunks._common is common_len  # and the store uses it


@st.composite
def _pairs(draw: st.DrawFn) -> tuple[bytes, int, bytes, int]:
    base = draw(st.binary(max_size=3000))
    other = bytearray(base)
    for _ in range(draw(st.integers(0, 3))):  # a few edits, so long common runs are common
        at = draw(st.integers(0, len(other)))
        other[at:at + draw(st.integers(0, 40))] = draw(st.binary(max_size=40))
    i = draw(st.integers(0, len(base)))
    j = draw(st.integers(0, len(other)))
    if draw(st.booleans()):
        j = min(i, len(other))  # same offset: the case split uses most
    return base, i, bytes(other), j


@given(_pairs())
def test_python_form_matches_reference(case: tuple[bytes, int, bytes, int]) -> None:
    a, i, b, j = case
    assert _py_common(a, i, memoryview(b), j) == _reference(a, i, b, j)


@needs_fast
@given(_pairs())
def test_c_helper_matches_reference(case: tuple[bytes, int, bytes, int]) -> None:
    a, i, b, j = case
    assert common_len(a, i, memoryview(b), j) == _reference(a, i, b, j)


@needs_fast
@pytest.mark.parametrize("n", [0, 1, 255, 256, 257, 4096, 200_000])
@pytest.mark.parametrize("diff_at", [None, 0, 1, 255, 256, 511, -1])
def test_c_helper_block_edges(n: int, diff_at: int | None) -> None:
    """A difference just before, at and after the 256-byte block edges is found exactly."""
    a = bytes(random.Random(n).randrange(256) for _ in range(min(n, 4096))) * (n // 4096 + 1)
    a = a[:n]
    b = bytearray(a)
    if diff_at is not None and n:
        at = diff_at % n
        b[at] ^= 0x5A
    expect = _reference(a, 0, bytes(b), 0) if n < 5000 else (
        n if diff_at is None else diff_at % n)
    assert common_len(a, 0, bytes(b), 0) == expect
    assert common_len(a + b"x", 0, bytes(b), 0) == expect  # unequal lengths stop at the shorter


@needs_fast
def test_c_helper_accepts_buffers_and_refuses_bad_offsets() -> None:
    data = b"abcdefgh"
    for other in (bytearray(data), memoryview(data), memoryview(b"..abcdefgh")[2:]):
        assert common_len(data, 0, other, 0) == 8
    assert common_len(data, 8, data, 8) == 0  # an offset at the end is empty, not an error
    for bad in ((data, -1, data, 0), (data, 9, data, 0), (data, 0, data, 9), (data, 0, data, -5)):
        with pytest.raises(ValueError, match="outside 0..8"):
            common_len(*bad)
    with pytest.raises(TypeError):
        common_len("text", 0, data, 0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        common_len(data, 0, data)  # type: ignore[call-arg]


@needs_fast
def test_c_helper_does_not_leak_buffers() -> None:
    """Every exported buffer is released, on success and on error (a bytearray stays resizable)."""
    buf = bytearray(b"x" * 100)
    for _ in range(3):
        common_len(buf, 0, buf, 0)
        with pytest.raises(ValueError):
            common_len(buf, 500, buf, 0)
    buf.extend(b"more")  # BufferError if a view were still held
    assert len(buf) == 104
    if hasattr(sys, "gettotalrefcount"):  # debug builds only
        before = sys.gettotalrefcount()
        for _ in range(1000):
            common_len(buf, 0, buf, 0)
        assert sys.gettotalrefcount() - before < 50


def test_split_is_the_same_with_either_helper(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run of edits cut with the C helper and with the Python form gives identical chunks."""
    sealer = Sealer(os.urandom(32))
    rng = random.Random(11)
    buf = bytearray(rng.randbytes(60_000))
    payloads = []
    for _ in range(60):
        at = rng.randrange(len(buf))
        if rng.random() < 0.5:
            buf[at:at + 64] = rng.randbytes(rng.choice([0, 64, 300]))
        else:
            buf += rng.randbytes(rng.randrange(1, 3000))
        payloads.append(bytes(buf))
    runs = []
    for helper in ({common_len, _py_common} - {None}):
        monkeypatch.setattr(_chunks, "_common", helper)
        memo = SplitMemo()
        runs.append([[(a, bytes(p)) for a, p in split(sealer, data, memo)] for data in payloads])
    assert all(r == runs[0] for r in runs)
    full = [[(a, bytes(p)) for a, p in split(sealer, data)] for data in payloads]  # no memo
    assert runs[0] == full
