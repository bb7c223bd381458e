"""Chunking (incremental cuts equal a full cut; only what changed is re-cut) and encoding."""

from __future__ import annotations

import os
import pickle
import random
from collections.abc import Iterator
from typing import Any

import pytest

from tcc.store import _chunks as chunks_mod
from tcc.store import open_store
from tcc.store._chunks import (
    _SKIP_MAX,
    ChunkEncoder,
    SplitMemo,
    _chunker,
    decode_inline,
    encode_chunk,
    split,
)
from tcc.store._codec import Sealer


def _text(n: int, seed: int) -> bytes:
    rng = random.Random(seed)
    return bytes(rng.choice(b"abcdefghij klmnop") for _ in range(n))


def _full(sealer: Sealer, data: bytes) -> list[tuple[bytes, bytes]]:
    return [(sealer.chunk_id(c.data), bytes(c.data)) for c in _chunker().cut_buf(memoryview(data))]


def test_incremental_split_matches_full_cut() -> None:
    sealer = Sealer(os.urandom(32))
    rng = random.Random(7)
    memo = SplitMemo()
    buf = bytearray(_text(120_000, 0))
    for step in range(150):
        op = rng.randrange(6)
        at = rng.randrange(len(buf) + 1)
        if op == 0:  # edit in place or resize a region
            buf[at:at + rng.randrange(1, 200)] = os.urandom(rng.randrange(0, 300))
        elif op == 1:  # append
            buf += _text(rng.randrange(1, 5000), step)
        elif op == 2:  # delete
            del buf[at:at + rng.randrange(1, 20000)]
        elif op == 3:  # insert
            buf[at:at] = _text(rng.randrange(1, 20000), step)
        elif op == 4:  # replace everything
            buf = bytearray(_text(rng.randrange(0, 60000), step))
        else:  # change the head
            buf[:8] = os.urandom(8)
        data = bytes(buf)
        got = [(a, bytes(p)) for a, p in split(sealer, data, memo)]
        assert got == _full(sealer, data), step


def test_transcript_split_matches_full_cut() -> None:
    sealer = Sealer(os.urandom(32))
    memo = SplitMemo()
    msgs: list[bytes] = []
    for i in range(120):
        msgs.append(_text(1024, i))
        data = pickle.dumps({"step": i, "messages": msgs}, protocol=5)
        assert [(a, bytes(p)) for a, p in split(sealer, data, memo)] == _full(sealer, data)


def test_checkpoint_after_another_writer(tmp_path: object) -> None:
    """The per-process memo of the last commit is only a guess: it is checked in the txn."""
    path = str(tmp_path) + "/s"  # type: ignore[operator]
    with open_store(path, tenant="a") as s1, open_store(path, tenant="a") as s2:
        run = s1.create_run("x")
        base = _text(50_000, 1)
        s1.checkpoint(run.run_id, 1, base)
        s2.checkpoint(run.run_id, 1, base + b"two")  # s1's memo is now stale
        s1.checkpoint(run.run_id, 1, base + b"three")
        s2.checkpoint(run.run_id, 1, b"x" + base)
        assert s1.load_snapshot(run.run_id) == b"x" + base
        assert [i.number for i in s1.snapshots(run.run_id)] == [2, 3, 4]
        assert s1.load_snapshot(run.run_id, 3) == base + b"three"
        stats = s1.gc()
        assert (stats.chunks_deleted, stats.refs_repaired) == (0, 0)  # counts stayed exact
        assert s2.load_snapshot(run.run_id, 2) == base + b"two"


def test_deferred_releases_keep_counts_exact(tmp_path: object) -> None:
    """Releases wait in the newest record's pending list, then are applied in batches.

    A growing transcript with edits in the middle releases chunks on most
    commits; forks share chunks and are deleted again.  Afterwards every kept
    snapshot loads, a full recount (gc's sweep) finds every reference count
    exact, and the chunks stored beyond those the kept snapshots hold never
    exceed one batch of pending releases.
    """
    from tcc.store._chunkrefs import FLUSH_RELEASES

    path = str(tmp_path) + "/s"  # type: ignore[operator]
    rng = random.Random(5)
    with open_store(path, keep=3, durability="none") as s:
        run = s.create_run("x").run_id
        msgs: list[bytes] = []
        forks: list[tuple[str, bytes]] = []
        expect: dict[str, bytes] = {}
        for step in range(300):
            msgs.append(_text(700, step))
            if rng.random() < 0.2:  # rewrite an old message: chunks in the middle are released
                msgs[rng.randrange(len(msgs))] = _text(700, 10_000 + step)
            data = pickle.dumps({"step": step, "messages": msgs}, protocol=5)
            s.checkpoint(run, 1, data)
            expect[run] = data
            if step % 60 == 30:
                forks.append((s.fork_run(run).run_id, data))
            if step % 60 == 50 and len(forks) > 1:
                s.delete_run(forks.pop(0)[0])
            if step % 100 == 99:
                stored, held = _chunk_census(s)
                assert stored - held <= FLUSH_RELEASES, (step, stored, held)
        for fork, data in forks:
            assert s.load_snapshot(fork) == data
        assert s.load_snapshot(run) == expect[run]
        stats = s.gc()
        assert (stats.chunks_deleted, stats.refs_repaired) == (0, 0)
        s.delete_run(run)
        for fork, _ in forks:
            s.delete_run(fork)
        assert _chunk_census(s) == (0, 0)  # every count reached zero: nothing leaked


def _chunk_census(s: object) -> tuple[int, int]:
    """(chunks stored, chunks some kept snapshot's manifest references), read from the store."""
    from tcc.store._codec import iter_prefix
    from tcc.store._heads import is_head_key

    def op(txn: object) -> tuple[int, int]:
        dbs = s._scope.dbs  # type: ignore[attr-defined]
        stored = sum(1 for k, _ in iter_prefix(txn, dbs["chunks"], b"") if k.endswith(b"d"))
        held: set[int] = set()
        for key, value in iter_prefix(txn, dbs["snaps"], b""):
            if is_head_key("snaps", key):  # a run's snapshot index, not a snapshot
                continue
            held |= s._scope.held.held(txn, dbs, bytes(key), bytes(value)).ids  # type: ignore[attr-defined]
        return stored, len(held)

    return s._scope.read(op)  # type: ignore[attr-defined,no-any-return]


def _kinds(pieces: list[bytes]) -> tuple[ChunkEncoder, list[int]]:
    enc = ChunkEncoder()
    stored = [enc.encode(p) for p in pieces]
    for p, s in zip(pieces, stored):
        assert decode_inline(s, len(p)) == p  # every stored form reads back
    return enc, [s[0] for s in stored]


def test_encoder_stops_trying_zstd_on_random_bytes() -> None:
    """A run of incompressible chunks is stored raw with one zstd try per 17 chunks."""
    pieces = [os.urandom(4096) for _ in range(200)]
    enc, codecs = _kinds(pieces)
    assert set(codecs) == {0}  # raw: nothing compressed
    # tries at chunks 0, 2, 5, 10, 19 (skipping 1, 2, 4, 8 while backing off), then one
    # in every 17 (16 skipped): 36, 53, ..., 189
    assert enc.tried == 5 + len(range(36, 200, 17))


def test_encoder_compresses_every_chunk_of_text() -> None:
    """Compressible chunks are all tried and stored exactly as encode_chunk stores them."""
    pieces = [_text(4096, i) for i in range(50)]
    enc, codecs = _kinds(pieces)
    assert enc.tried == 50
    assert set(codecs) == {1}
    # exactly what encode_chunk stores
    assert [ChunkEncoder().encode(p) for p in pieces] == [encode_chunk(p) for p in pieces]


def test_encoder_tries_every_chunk_longer_than_a_cut_one() -> None:
    """A chunk longer than PIECE_WHOLE (a whole list segment's pickle, up to 16 MiB) is
    tried even right after random bytes: storing it raw could cost ~90 times its size (found
    by review: a new 2,048-message segment after a screenshot went raw)."""
    segment = _text(chunks_mod.PIECE_WHOLE + 4096, 3)
    enc, codecs = _kinds([os.urandom(4096) for _ in range(3)] + [segment, _text(4096, 4)])
    assert codecs == [0, 0, 0, 1, 1]  # tried, compressed, and the back-off is over
    assert enc.tried == 4  # (the second random chunk was skipped in the back-off)


def test_encoder_resumes_compressing_after_a_random_run() -> None:
    """After a random run, compression resumes within the longest back-off."""
    pieces = [os.urandom(4096) for _ in range(100)] + [_text(4096, i) for i in range(40)]
    _, codecs = _kinds(pieces)
    text = codecs[100:]
    # at most the longest back-off is stored raw after the run; then all compress
    first = text.index(1)
    assert first <= _SKIP_MAX
    assert set(text[first:]) == {1}


class _CountingSealer(Sealer):
    hashed = 0

    def chunk_id(self, data: bytes | memoryview) -> bytes:
        self.hashed += 1
        return super().chunk_id(data)

    def chunk_ids(self, pieces: list[memoryview]) -> list[bytes]:
        self.hashed += len(pieces)
        return super().chunk_ids(pieces)


class _CountingChunker:
    """The thread's FastCDC, counting the cuts split() takes from it."""

    def __init__(self, cdc: Any) -> None:
        self.cdc = cdc
        self.max_size = cdc.max_size
        self.taken = 0

    def cut_buf(self, buf: memoryview) -> Iterator[Any]:
        for ch in self.cdc.cut_buf(buf):
            self.taken += 1
            yield ch


def test_split_recuts_and_hashes_only_what_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    """An edit in place of a 1 MiB payload re-cuts and re-hashes a chunk or two, not ~200."""
    counter = _CountingChunker(_chunker())
    monkeypatch.setattr(chunks_mod._local, "cdc", counter)
    sealer = _CountingSealer(os.urandom(32))
    memo = SplitMemo()
    buf = bytearray(_text(1 << 20, 3))
    first = split(sealer, bytes(buf), memo)
    # the first cut cuts and hashes every chunk
    assert sealer.hashed == counter.taken == len(first) > 150
    rng = random.Random(5)
    for _ in range(20):
        at = rng.randrange(len(buf) - 64)
        buf[at:at + 64] = os.urandom(64)
        sealer.hashed = counter.taken = 0
        got = split(sealer, bytes(buf), memo)
        assert 1 <= sealer.hashed <= 3
        assert 1 <= counter.taken <= 3
        assert [a for a, _ in got] == [a for a, _ in _full(sealer, bytes(buf))]


def test_a_payload_in_pieces_keeps_the_chunks_of_a_piece_it_saw_before() -> None:
    """The pieces after the first are cut on their own; the same ``bytes`` object again
    is not read (no cut, no hash), while an equal copy of it is, to the same addresses."""
    sealer = _CountingSealer(os.urandom(32))
    memo = SplitMemo()
    big = _text(1 << 20, 11)
    first = split(sealer, (_text(20_000, 1), big), memo)
    assert b"".join(bytes(p) for _, p in first) == _text(20_000, 1) + big
    head = [a for a, _ in split(sealer, _text(20_000, 1))]
    assert [a for a, _ in first[:len(head)]] == head  # the first piece is cut as a whole payload
    assert max(len(p) for _, p in first[len(head):]) > chunks_mod.AVG_CHUNK * 4  # larger chunks
    sealer.hashed = 0
    again = split(sealer, (_text(20_000, 1) + b"!", big), memo)
    assert sealer.hashed <= 2  # the first piece's last chunk; nothing of ``big``
    assert again[-len(first) + len(head):] == first[len(head):]
    sealer.hashed = 0
    copy = bytes(bytearray(big))
    other = split(sealer, (_text(20_000, 1) + b"!", copy), memo)
    assert sealer.hashed >= len(first) - len(head)  # not the same object: read again
    assert [a for a, _ in other] == [a for a, _ in again]


def test_a_piece_up_to_the_largest_chunk_is_one_chunk_and_a_longer_one_is_cut() -> None:
    """A later piece no longer than PIECE_WHOLE (a list segment's pickle, a buffer) is one
    chunk: the store then keeps one manifest entry per segment at every checkpoint.  A
    longer piece is cut by content, into chunks no longer than that."""
    sealer = Sealer(os.urandom(32))
    assert chunks_mod.PIECE_WHOLE == chunks_mod._piece_chunker().max_size  # type: ignore[attr-defined]
    head = _text(5_000, 1)
    head_chunks = len(split(sealer, head))
    for size in (70_000, 300_000, chunks_mod.PIECE_WHOLE):
        piece = _text(size, size)
        got = split(sealer, (head, piece))
        assert len(got) == head_chunks + 1
        address, view = got[-1]
        assert bytes(view) == piece and address == sealer.chunk_id(piece)
    big = _text(3 * chunks_mod.PIECE_WHOLE, 5)
    got = split(sealer, (head, big))[head_chunks:]
    assert len(got) > 3
    assert max(len(v) for _, v in got) <= chunks_mod.PIECE_WHOLE
    assert b"".join(bytes(v) for _, v in got) == big


def test_a_piece_marked_whole_is_one_chunk_up_to_whole_max(monkeypatch) -> None:
    """A WholePiece (a list segment's pickle, which never changes) is one chunk up to
    WHOLE_MAX, however much longer than PIECE_WHOLE, and is known by identity afterwards;
    beyond WHOLE_MAX it is cut as any piece is."""
    from tcc._pieces import WholePiece

    sealer = _CountingSealer(os.urandom(32))
    head = _text(5_000, 1)
    head_chunks = len(split(sealer, head))
    big = WholePiece(_text(3 * chunks_mod.PIECE_WHOLE, 5))
    memo = SplitMemo()
    got = split(sealer, (head, big), memo)
    assert len(got) == head_chunks + 1
    address, view = got[-1]
    assert view.obj is big and address == sealer.chunk_id(big)  # (no copy)
    sealer.hashed = 0
    assert split(sealer, (head, big), memo)[-1][0] == address
    assert sealer.hashed == 0  # the same object: not read again
    assert len(split(sealer, (head, bytes(big)))) > head_chunks + 3  # unmarked: cut
    monkeypatch.setattr(chunks_mod, "WHOLE_MAX", chunks_mod.PIECE_WHOLE)
    cut = split(sealer, (head, big))[head_chunks:]
    assert len(cut) > 3 and b"".join(bytes(v) for _, v in cut) == big


def test_pieces_that_are_not_bytes_like_are_refused() -> None:
    from tcc.errors import UsageError
    from tcc.store._chunks import payload_size

    assert payload_size((b"ab", memoryview(b"cd"), bytearray(b"e"))) == 5
    for bad in ((), [b"a", "b"], (b"a", None), "text", 5):
        with pytest.raises(UsageError, match="snapshot payload"):
            payload_size(bad)
