"""Integrity and authenticity: damaged or foreign bytes are detected, never returned."""

from __future__ import annotations

import os
import random

import lmdb
import pytest
from store_helpers import payload

from tcc.errors import StoreCorruptError
from tcc.store._chunks import INLINE_MAX
from tcc.store import Completion, open_store


def _edit(path: str, db: bytes, fn: object) -> None:
    """Open the store's LMDB file directly (store closed) and let ``fn(txn, dbi)`` edit it."""
    env = lmdb.open(path, max_dbs=16, map_size=1 << 30)
    try:
        dbi = env.open_db(db)
        with env.begin(write=True) as txn:
            fn(txn, dbi)  # type: ignore[operator]
    finally:
        env.close()


def _chunk_keys(path: str) -> list[bytes]:
    keys: list[bytes] = []
    _edit(path, b"chunks", lambda txn, dbi: keys.extend(
        bytes(k) for k, _ in txn.cursor(db=dbi) if k.endswith(b"d")))
    return keys


def _flip(path: str, db: bytes, key: bytes, pos: int, bit: int) -> None:
    def fn(txn: lmdb.Transaction, dbi: object) -> None:
        value = bytearray(txn.get(key, db=dbi))
        value[pos % len(value)] ^= 1 << bit
        txn.put(key, bytes(value), db=dbi)
    _edit(path, db, fn)


SIZE = 3 * INLINE_MAX  # large enough to be cut into chunks, not stored in the record


def _make(path: str, n: int = 3, size: int = SIZE) -> str:
    with open_store(path) as s:
        run = s.create_run("e", run_id="r")
        for i in range(n):
            seq = s.append_intent(run.run_id, 1, "step")
            s.checkpoint(run.run_id, 1, payload(i, size), completion=Completion(seq, result=b"%d" % i))
    return "r"


def test_bit_flips_in_newest_chunk_always_detected(store_path: str) -> None:
    """Every sampled bit flip in the newest snapshot's chunk is detected and recovery falls back."""
    _make(store_path)
    newest = max(_chunk_keys(store_path))  # chunk ids grow: the newest snapshot's own chunk
    length = len(_edit_get(store_path, b"chunks", newest))
    rng = random.Random(7)
    positions = list(range(min(length, 24))) + [rng.randrange(length) for _ in range(40)]
    _each_flip_falls_back(store_path, b"chunks", newest, positions, SIZE, rng)


def _each_flip_falls_back(store_path: str, db: bytes, key: bytes, positions: list[int], size: int,
                          rng: random.Random) -> None:
    """Flip one bit at each position of record ``key``: snapshot 3 is refused, 2 is used, and undo."""
    for pos in positions:
        bit = rng.randrange(8)
        _flip(store_path, db, key, pos, bit)
        with open_store(store_path) as s:
            with pytest.raises(StoreCorruptError, match="run 'r' snapshot 3"):
                s.load_snapshot("r")
            info, data = s.latest_good_snapshot("r")  # type: ignore[misc]
            assert (info.number, data) == (2, payload(1, size))
            kinds = [e.kind for e in s.events("r")][-2:]
            assert kinds == ["snapshot_corrupt", "fell_back"]
        _flip(store_path, db, key, pos, bit)  # undo
    with open_store(store_path) as s:
        assert s.load_snapshot("r") == payload(2, size)


def _edit_get(path: str, db: bytes, key: bytes) -> bytes:
    out: list[bytes] = []
    _edit(path, db, lambda txn, dbi: out.append(bytes(txn.get(key, db=dbi))))
    return out[0]


def test_bit_flip_in_manifest_detected(store_path: str) -> None:
    """A flipped bit in a snapshot manifest record is detected like one in a chunk."""
    _make(store_path)
    keys: list[bytes] = []
    _edit(store_path, b"snaps", lambda txn, dbi: keys.extend(bytes(k) for k, _ in txn.cursor(db=dbi)))
    for pos in range(0, 120, 7):
        _flip(store_path, b"snaps", keys[-1], pos, pos % 8)
        with open_store(store_path) as s:
            with pytest.raises(StoreCorruptError):
                s.load_snapshot("r")
            found = s.latest_good_snapshot("r")
            assert found is not None and found[0].number == 2
        _flip(store_path, b"snaps", keys[-1], pos, pos % 8)


def test_bit_flip_in_group_node_detected(store_path: str) -> None:
    """Damage to a group node of a large (grouped) manifest is detected."""
    with open_store(store_path, keep=5) as s:
        run = s.create_run("e", run_id="r")
        s.checkpoint(run.run_id, 1, payload(1, 600_000))
        s.checkpoint(run.run_id, 1, payload(2, 600_000))
    keys = _chunk_keys(store_path)
    # group nodes are written after the leaves of their snapshot: the last ids
    flipped = 0
    for key in keys[-3:]:
        _flip(store_path, b"chunks", key, 5, 3)
        with open_store(store_path) as s:
            with pytest.raises(StoreCorruptError):
                s.load_snapshot("r")
            found = s.latest_good_snapshot("r")
            assert found is not None and found[1] == payload(1, 600_000)
        _flip(store_path, b"chunks", key, 5, 3)
        flipped += 1
    assert flipped == 3


def test_record_moved_between_runs_detected(store_path: str) -> None:
    """A journal record copied under another run's key fails verification (the MAC binds the key)."""
    with open_store(store_path) as s:
        for rid in ("a", "b"):
            s.create_run("e", run_id=rid)
            s.append_intent(rid, 1, f"from-{rid}")
    def fn(txn: lmdb.Transaction, dbi: object) -> None:
        items = {bytes(k): bytes(v) for k, v in txn.cursor(db=dbi)}
        ka = next(k for k in items if b"\x00a\x00" in k)
        kb = next(k for k in items if b"\x00b\x00" in k)
        txn.put(kb, items[ka], db=dbi)
    _edit(store_path, b"journal", fn)
    with open_store(store_path) as s:
        assert s.journal("a")[0].name == "from-a"
        with pytest.raises(StoreCorruptError, match="journal record 0 of run 'b'"):
            s.journal("b")


def test_every_snapshot_corrupt_returns_none(store_path: str) -> None:
    """latest_good_snapshot returns None (and says so in events) when nothing verifies."""
    _make(store_path, n=2)
    for key in _chunk_keys(store_path):
        _flip(store_path, b"chunks", key, 1, 0)
    with open_store(store_path) as s:
        assert s.latest_good_snapshot("r") is None
        ev = s.events("r")[-1]
        assert (ev.kind, ev.data["to"]) == ("fell_back", None)


def test_wrong_secret_refused(store_path: str) -> None:
    """A store whose secret file was replaced refuses to open."""
    _make(store_path, n=1)
    with open(os.path.join(store_path, "secret"), "wb") as f:
        f.write(os.urandom(32))
    with pytest.raises(StoreCorruptError, match="secret"):
        open_store(store_path)


def test_missing_secret_refused(store_path: str) -> None:
    """A store without its secret file refuses to open (nothing could be verified)."""
    _make(store_path, n=1)
    os.unlink(os.path.join(store_path, "secret"))
    with pytest.raises(StoreCorruptError, match="no 'secret' file"):
        open_store(store_path)


def test_foreign_directory_refused(tmp_path: object) -> None:
    """A non-empty directory that is not a store is not turned into one."""
    d = os.path.join(str(tmp_path), "project")
    os.mkdir(d)
    open(os.path.join(d, "notes.txt"), "w").close()
    with pytest.raises(StoreCorruptError, match="not a tcc store"):
        open_store(d)


def test_garbage_data_file_refused(store_path: str) -> None:
    """A data.mdb that is not an LMDB file raises StoreCorruptError naming it."""
    os.makedirs(store_path)
    with open(os.path.join(store_path, "data.mdb"), "wb") as f:
        f.write(os.urandom(64 * 1024))
    with open(os.path.join(store_path, "secret"), "wb") as f:
        f.write(os.urandom(32))
    with pytest.raises(StoreCorruptError, match="data.mdb"):
        open_store(store_path)


def test_foreign_lmdb_refused_and_untouched(store_path: str) -> None:
    """Another program's LMDB database is refused and not modified."""
    env = lmdb.open(store_path, map_size=1 << 20)
    with env.begin(write=True) as txn:
        txn.put(b"hello", b"world")
    env.close()
    data = os.path.join(store_path, "data.mdb")
    with open(data, "rb") as f:
        before = f.read()
    with pytest.raises(StoreCorruptError, match="not a tcc store"):
        open_store(store_path)
    with open(data, "rb") as f:
        assert f.read() == before


def test_store_path_is_a_file(tmp_path: object) -> None:
    """A store path that is a regular file raises a clear StoreCorruptError."""
    p = os.path.join(str(tmp_path), "file")
    open(p, "w").close()
    with pytest.raises(StoreCorruptError, match="is a file"):
        open_store(p)


def test_bit_flips_in_inline_snapshot_always_detected(store_path: str) -> None:
    """A small payload lives inside its snapshot record: a flip anywhere in it is caught by the record MAC."""
    _make(store_path, size=INLINE_MAX // 2)
    assert not _chunk_keys(store_path)  # nothing was cut into chunks
    key = _snap_keys(store_path)[-1]
    length = len(_edit_get(store_path, b"snaps", key))
    rng = random.Random(11)
    positions = [rng.randrange(length) for _ in range(40)]
    _each_flip_falls_back(store_path, b"snaps", key, positions, INLINE_MAX // 2, rng)


def _snap_keys(path: str) -> list[bytes]:
    keys: list[bytes] = []
    _edit(path, b"snaps", lambda txn, dbi: keys.extend(bytes(k) for k, _ in txn.cursor(db=dbi)))
    return keys


@pytest.mark.parametrize("header,tail", [
    (b'{"a":', b""), (b'{"a":"\x8c"}', b""), (b"[1, 2]", b""), (b"7", b""),
    (b'{"_b":[["m"]]}', b""), (b'{"_b":[["m","x"]]}', b"abc"), (b'{"_b":5}', b""),
    (b'{"_b":[["m",99]]}', b"abc"), (b'{"_b":[["m",-1]]}', b"abc"), (b"{}", b"trailing"),
    (b"[" * 100_000, b""),
], ids=["truncated", "not-utf8", "list", "int", "short-entry", "str-length", "table-int",
        "past-end", "negative", "trailing", "deep"])
def test_records_whose_mac_verifies_but_body_is_malformed_are_corrupt(header: bytes, tail: bytes) -> None:
    """Regression (found by atheris): Sealer.open raised JSONDecodeError/TypeError/RecursionError
    on a MAC-valid but malformed body; every malformation is now Corrupt."""
    import struct

    from tcc.store._codec import Corrupt, Sealer

    sealer = Sealer(bytes(range(32)))
    body = b"\x01" + struct.pack("<I", len(header)) + header + tail
    value = sealer._mac(b"runs", b"k", body) + body  # what a holder of the secret could write
    with pytest.raises(Corrupt):
        sealer.open(b"runs", b"k", value)


@pytest.mark.parametrize("db", [b"events", b"journal"])
def test_record_moved_to_another_key_is_reported_missing(store_path: str, db: bytes) -> None:
    """Regression (found by the slow corruption campaign): bits flipped in a record's KEY moved
    an event to another run's key range; the run's audit trail silently lost its first event.
    Events and journal records are numbered without gaps, so a hole is damage."""
    _make(store_path, n=2)
    with open_store(store_path) as s:  # events after the first, so that a hole can show
        s.add_event("r", "note", {"i": 1})
        s.add_event("r", "note", {"i": 2})
    keys: list[bytes] = []
    _edit(store_path, db, lambda txn, dbi: keys.extend(bytes(k) for k, _ in txn.cursor(db=dbi)))
    first = keys[0]
    moved = first[:-9] + b"\xfe" + first[-8:]  # same seq, a run id that sorts elsewhere

    def move(txn: lmdb.Transaction, dbi: object) -> None:
        txn.put(moved, txn.get(first, db=dbi), db=dbi)
        txn.delete(first, db=dbi)

    _edit(store_path, db, move)
    with open_store(store_path) as s:
        with pytest.raises(StoreCorruptError, match=r"(event|journal record) 0 of run 'r' is missing"):
            s.events("r") if db == b"events" else s.journal("r")
