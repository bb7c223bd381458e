"""Integrity and authenticity: damaged or foreign bytes are detected, never returned."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import lmdb
import pytest

from tcc.errors import StoreCorruptError, StoreError
from tcc.store._chunks import INLINE_MAX
from tcc.store._heads import HEAD, head_key, is_head_key
from tcc.store import Completion, open_store
from tests._support.stores import payload


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
    keys = _snap_keys(store_path)
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
    with open_store(store_path, sync_intents=True) as s:  # each intent committed on its own
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
    """Keys of the snapshot records, oldest first (not the runs' snapshot indexes)."""
    return [k for k in _keys(path, b"snaps") if not is_head_key("snaps", k)]


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


def _move(path: str, old: bytes, new: bytes) -> None:
    """Move the ``snaps`` record at ``old`` to key ``new``, as flipped key bits do."""
    def fn(txn: lmdb.Transaction, dbi: object) -> None:
        txn.put(new, txn.get(old, db=dbi), db=dbi)
        txn.delete(old, db=dbi)
    _edit(path, b"snaps", fn)


@pytest.mark.parametrize("n", [1, 3])
def test_snapshot_record_moved_away_is_reported_and_recovery_falls_back(store_path: str, n: int) -> None:
    """Regression (found by the slow corruption campaign, mutant #304): flipped key bits moved a
    snapshot record out of its run's key range, and `tcc show` listed the run's snapshots
    without it and without an error.  Each run's index of snapshot numbers names the record,
    so it is listed as damaged, reading it says it is missing, and recovery falls back."""
    size = INLINE_MAX // 2 if n == 1 else SIZE
    _make(store_path, n=n, size=size)
    newest = _snap_keys(store_path)[-1]
    _move(store_path, newest, newest[:-11] + b"\xfe" + newest[-10:])  # another run id
    with open_store(store_path) as s:
        listed = s.snapshots("r")
        assert [(i.number, i.damaged) for i in listed] == [(k, k == n) for k in range(1, n + 1)]
        with pytest.raises(StoreCorruptError, match=rf"run 'r' snapshot {n} is missing"):
            s.load_snapshot("r")
        with pytest.raises(StoreCorruptError, match=rf"snapshot {n} of run 'r' is missing"):
            s.checkpoint("r", 1, payload(7, size))  # nothing is written over a damaged run
        found = s.latest_good_snapshot("r")
        if n == 1:
            assert found is None
        else:
            assert found is not None and found[0].number == n - 1 and found[1] == payload(n - 2, size)
        kinds = [e.kind for e in s.events("r")][-2:]
        assert kinds == ["snapshot_corrupt", "fell_back"]
        # the fallback dropped the lost number from the index: the run goes on from there
        assert [i.number for i in s.snapshots("r")] == list(range(1, n))
        info = s.checkpoint("r", 1, payload(8, size))
        assert info.number == n and s.load_snapshot("r") == payload(8, size)


def test_snapshot_record_moved_within_its_run_is_listed_damaged(store_path: str) -> None:
    """A record moved to another number of the same run is not taken for that snapshot: the
    number it left is missing and the number it reached is a stray, both listed as damaged."""
    _make(store_path, n=3)
    second = _snap_keys(store_path)[1]
    _move(store_path, second, second[:-8] + (7).to_bytes(8, "big"))
    with open_store(store_path) as s:
        assert [(i.number, i.damaged) for i in s.snapshots("r")] == [
            (1, False), (2, True), (3, False), (7, True)]
        assert s.load_snapshot("r") == payload(2, SIZE)  # the newest is intact
        with pytest.raises(StoreError, match="has no snapshot 7"):
            s.load_snapshot("r", 7)
        with pytest.raises(StoreCorruptError, match="snapshot 2 of run 'r' is missing"):
            s.fork_run("r", 3)


@pytest.mark.parametrize("damage", ["moved", "flipped"])
def test_snapshot_index_damaged_or_missing_is_refused(store_path: str, damage: str) -> None:
    """Without a trustworthy index nothing can tell whether a snapshot went missing: reads and
    writes of the run are refused with an error naming the run; other runs are unaffected."""
    _make(store_path, n=2)
    with open_store(store_path) as s:
        other = s.create_run("e", run_id="o")
        s.checkpoint("o", other.epoch, payload(5, 100))
    key = head_key("snaps", b"default\x00r\x00")
    if damage == "moved":
        _move(store_path, key, key[:-1] + b"\xfe")
    else:
        _flip(store_path, b"snaps", key, 20, 3)
    why = "is missing" if damage == "moved" else "failed verification"
    with open_store(store_path) as s:
        with pytest.raises(StoreCorruptError, match=f"the snapshot index of run 'r' {why}"):
            s.snapshots("r")
        with pytest.raises(StoreCorruptError, match=f"the snapshot index of run 'r' {why}"):
            s.latest_good_snapshot("r")
        # (a checkpoint may notice first that the index also counted the journal)
        with pytest.raises(StoreCorruptError, match=rf"the (snapshot index|journal record count) of run 'r' {why}"):
            s.checkpoint("r", 1, payload(9, SIZE))
        assert s.load_snapshot("o") == payload(5, 100)


def _leaves(path: str) -> dict[str, list[tuple[int, list[tuple[bytes, bytes]]]]]:
    """Per database: (page number, records) of each leaf page, from the structure check's walk."""
    from tcc.store._lmdbcheck import check_data_file

    out: dict[str, list[tuple[int, list[tuple[bytes, bytes]]]]] = {}

    def probe(name: str, pgno: int, records: Iterator[tuple[bytes, bytes]]) -> None:
        out.setdefault(name, []).append((pgno, list(records)))

    check_data_file(os.path.join(path, "data.mdb"), probe=probe)
    return out


def test_page_of_another_database_in_place_of_a_leaf_is_refused(store_path: str) -> None:
    """Regression (found by the stale-page campaign): a leaf of the events database written
    where the signals leaf was has a valid structure (same entry count, keys in order), so
    LMDB just did not find the signals: a delivered approval read as never sent.  Each
    record's MAC names its database, so the page is refused as misplaced at open."""
    with open_store(store_path) as s:
        for rid in ("a", "b", "c"):
            s.create_run("e", run_id=rid)
        for rid in ("a", "b"):
            s.send_signal(rid, "go", b"yes")
    leaves = _leaves(store_path)
    [(target, sigs)] = leaves["signals"]
    [(source, runs)] = leaves["runs"]
    # 3 runs + the tenant's run count; 2 signals + each run's signal count: the same number
    # of entries, so the database's recorded counts still match
    assert len(sigs) == len(runs) == 4
    mdb = Path(store_path) / "data.mdb"
    data = bytearray(mdb.read_bytes())
    page = bytearray(data[source * 4096:(source + 1) * 4096])
    page[:8] = target.to_bytes(8, "little")  # it claims the place it was written to
    data[target * 4096:(target + 1) * 4096] = page
    mdb.write_bytes(data)
    with pytest.raises(StoreCorruptError, match=rf"page {target} of database 'signals' is not that "
                       r"database's page \(it holds records of database 'runs'\)"):
        open_store(store_path)


def test_one_damaged_record_does_not_make_its_page_misplaced(store_path: str) -> None:
    """The page check asks only that some record of a leaf verifies as its database's: a
    flipped value is still reported for that record alone, and the store opens."""
    with open_store(store_path) as s:
        for rid in ("a", "b"):
            s.create_run("e", run_id=rid)
            s.send_signal(rid, "go", b"yes")
    key = b"default\x00a\x00go"
    _flip(store_path, b"signals", key, 30, 1)
    with open_store(store_path) as s:
        assert s.peek_signal("b", "go") == b"yes"
        with pytest.raises(StoreCorruptError, match="signal"):
            s.peek_signal("a", "go")


@pytest.mark.parametrize("db", [b"events", b"journal"])
def test_newest_record_moved_away_is_reported_missing(store_path: str, db: bytes) -> None:
    """Regression (found by the slow corruption campaign, mutants #8 and #196): flipped key bits
    moved a run's NEWEST event away; that leaves no gap, so `tcc show` silently lost the
    'approved' event.  Each run's journal and events keep a sealed record count."""
    _make(store_path, n=2)
    with open_store(store_path) as s:
        s.add_event("r", "note", {"i": 1})
        count = len(s.events("r")) if db == b"events" else len(s.journal("r"))
    keys = [k for k in _keys(store_path, db) if k.startswith(b"default\x00r\x00")]
    newest = [k for k in keys if not k.endswith(HEAD)][-1]
    assert int.from_bytes(newest[-8:], "big") == count - 1
    _edit(store_path, db, lambda txn, dbi: txn.put(newest[:-9] + b"\xfe" + newest[-8:],
                                                     txn.get(newest, db=dbi), db=dbi))
    _edit(store_path, db, lambda txn, dbi: txn.delete(newest, db=dbi))
    what = "event" if db == b"events" else "journal record"
    with open_store(store_path) as s:
        with pytest.raises(StoreCorruptError, match=rf"{what} {count - 1} of run 'r' is missing"):
            s.events("r") if db == b"events" else s.journal("r")
        if db == b"journal":  # nothing is appended to a journal that lost records
            with pytest.raises(StoreCorruptError, match=rf"journal record {count - 1} of run 'r' is missing"):
                s.append_intent("r", 1, "step")
        else:  # an event still gets recorded, after the hole, which stays visible
            s.add_event("r", "later")
            with pytest.raises(StoreCorruptError, match=rf"event {count - 1} of run 'r' is missing"):
                s.events("r")


@pytest.mark.parametrize("where", ["journal head", "snapshot index"])
def test_missing_count_record_is_reported(store_path: str, where: str) -> None:
    """The journal length lives in the snapshot index as of the last checkpoint and in a
    journal head record after it: either one going missing is refused for reading and
    appending (the other cannot stand in for it)."""
    _make(store_path, n=2)
    with open_store(store_path, sync_intents=True) as s:
        s.append_intent("r", 1, "step")  # a journal head: one record after the checkpoint
        records = len(s.journal("r"))
    db = b"journal" if where == "journal head" else b"snaps"
    key = head_key(db.decode(), b"default\x00r\x00")
    _edit(store_path, db, lambda txn, dbi: txn.delete(key, db=dbi))
    with open_store(store_path) as s:
        if where == "journal head":  # the index says one record fewer than there are
            with pytest.raises(StoreCorruptError, match=rf"run 'r' has {records} journal records "
                               rf"but its count says {records - 1}"):
                s.journal("r")
            with pytest.raises(StoreCorruptError, match="but its count says"):
                s.checkpoint("r", 1, payload(9, SIZE))
        else:
            with pytest.raises(StoreCorruptError, match="the snapshot index of run 'r' is missing"):
                s.snapshots("r")
            with pytest.raises(StoreCorruptError, match="the snapshot index of run 'r' is missing"):
                s.checkpoint("r", 1, payload(9, SIZE))


def _keys(path: str, db: bytes) -> list[bytes]:
    """Every key of database ``db``, in order (head records included)."""
    keys: list[bytes] = []
    _edit(path, db, lambda txn, dbi: keys.extend(bytes(k) for k, _ in txn.cursor(db=dbi)))
    return keys


def test_run_record_moved_away_is_reported(store_path: str) -> None:
    """A run record moved to another key by damage does not just vanish from the list: the
    tenant's sealed run count disagrees, for `list_runs` and for a lookup of that run."""
    with open_store(store_path) as s:
        for rid in ("a", "b"):
            run = s.create_run("e", run_id=rid)
            s.checkpoint(rid, run.epoch, payload(1, 100))
    _edit(store_path, b"runs", lambda txn, dbi: txn.put(b"defaulu\x00a", txn.get(b"default\x00a", db=dbi), db=dbi))
    _edit(store_path, b"runs", lambda txn, dbi: txn.delete(b"default\x00a", db=dbi))
    with open_store(store_path) as s:
        with pytest.raises(StoreCorruptError, match="tenant 'default' has 1 runs but its count says 2"):
            s.list_runs()
        lost = "the record of run 'a' is missing but its snaps is there"
        with pytest.raises(StoreCorruptError, match=lost):
            s.get_run("a")
        with pytest.raises(StoreCorruptError, match=lost):  # a new run may not adopt its records
            s.create_run("e", run_id="a")
        with pytest.raises(StoreCorruptError, match=lost):
            s.fork_run("b", new_run_id="a")
        assert s.get_run("b").run_id == "b"


def test_list_runs_can_report_a_damaged_run_record_and_list_the_others(store_path: str) -> None:
    """A run record whose MAC fails stops `list_runs()`, or, with a ``damaged`` list, is
    named there while the intact runs are listed (one bad record no longer hides a tenant)."""
    with open_store(store_path) as s:
        for rid in ("a", "b", "c"):
            s.create_run("e", run_id=rid)
    _flip(store_path, b"runs", b"default\x00b", 40, 3)
    with open_store(store_path) as s:
        with pytest.raises(StoreCorruptError, match="run 'b' record failed verification"):
            s.list_runs()
        damaged: list[tuple[str, str]] = []
        assert [r.run_id for r in s.list_runs(damaged=damaged)] == ["a", "c"]
        assert [rid for rid, _ in damaged] == ["b"]
        assert "run 'b' record failed verification" in damaged[0][1]
        assert [r.run_id for r in s.list_runs("running", damaged=[])] == ["a", "c"]


def test_a_run_key_damaged_into_invalid_utf8_is_reported_not_a_crash(store_path: str) -> None:
    """Regression (CI, a bit flip in data.mdb): a run record's key that damage turned into
    bytes that are not UTF-8 is reported as damage by `list_runs`, `gc` and `tcc ls --json`;
    reporting it used to fail with UnicodeDecodeError (an internal error)."""
    import json
    import subprocess
    import sys
    import warnings

    from tcc.store import StoreDamageWarning

    with open_store(store_path) as s:
        for rid in ("ab", "cd"):
            run = s.create_run("e", run_id=rid)
            s.checkpoint(rid, run.epoch, payload(1, 100))
    bad = b"default\x00a\xf3"  # the second byte of 'ab' flipped: not UTF-8
    _edit(store_path, b"runs", lambda txn, dbi: txn.put(bad, txn.get(b"default\x00ab", db=dbi), db=dbi))
    _edit(store_path, b"runs", lambda txn, dbi: txn.delete(b"default\x00ab", db=dbi))
    with open_store(store_path) as s:
        damaged: list[tuple[str, str]] = []
        assert [r.run_id for r in s.list_runs(damaged=damaged)] == ["cd"]
        assert [rid for rid, _ in damaged] == ["a\\xf3"]  # the bytes, as in the message
        assert "run 'a\\\\xf3' record failed verification" in damaged[0][1]
        with pytest.raises(StoreCorruptError, match="record failed verification"):
            s.list_runs()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            s.gc()
        assert any(issubclass(w.category, StoreDamageWarning) and "xf3" in str(w.message)
                   for w in seen)
    out = subprocess.run([sys.executable, "-m", "tcc", "ls", "--json", "--store", store_path],
                         capture_output=True, text=True, timeout=120)
    assert "internal error" not in out.stderr, out.stderr
    assert "xf3" in out.stdout + out.stderr, (out.stdout, out.stderr)
    assert out.returncode == 1, (out.returncode, out.stderr)  # damage: not a clean listing
    assert [r["id"] for r in json.loads(out.stdout)] == ["cd"]  # the intact run is listed


def test_signal_record_moved_to_another_name_of_the_same_run_is_reported(store_path: str) -> None:
    """Regression (data.mdb splice campaign): damage rewrote a delivered approval's key to
    another name of the same run, so the run's signal count still agreed; the approval read as
    never sent (`tcc show` said 'not sent', `tcc resume` parked again) and could have been
    delivered a second time.  A lookup that misses now checks the run's records' MACs."""
    with open_store(store_path) as s:
        s.create_run("e", run_id="r")
        s.send_signal("r", "approval@1", b"yes")
    key, moved = b"default\x00r\x00approval@1", b"default\x00r\x00appr\x00\x00\x00\x00\x00\x00"
    _edit(store_path, b"signals", lambda txn, dbi: txn.put(moved, txn.get(key, db=dbi), db=dbi))
    _edit(store_path, b"signals", lambda txn, dbi: txn.delete(key, db=dbi))
    with open_store(store_path) as s:
        for read in (lambda: s.peek_signal("r", "approval@1"), lambda: s.signal_state("r", "approval@1"),
                     lambda: s.send_signal("r", "approval@1", b"again"),
                     lambda: s.take_signal("r", 1, "approval@1"),
                     lambda: s.peek_signal("r", "other")):
            with pytest.raises(StoreCorruptError, match="a signal record of run 'r'.*failed verification"):
                read()
        with pytest.raises(StoreCorruptError, match="failed verification"):
            s.pending_signals("r")


def test_signal_record_moved_away_is_reported(store_path: str) -> None:
    """Regression class of the stale-signals finding: a delivered approval whose record damage
    moved away must not read as never sent; the run's sealed signal count disagrees."""
    with open_store(store_path) as s:
        s.create_run("e", run_id="r")
        s.send_signal("r", "go@1", b"yes")
    key = b"default\x00r\x00go@1"
    _edit(store_path, b"signals", lambda txn, dbi: txn.put(b"default\x00s\x00go@1", txn.get(key, db=dbi), db=dbi))
    _edit(store_path, b"signals", lambda txn, dbi: txn.delete(key, db=dbi))
    with open_store(store_path) as s:
        for read in (lambda: s.peek_signal("r", "go@1"), lambda: s.signal_state("r", "go@1"),
                     lambda: s.pending_signals("r")):
            with pytest.raises(StoreCorruptError, match="run 'r' has 0 signals but its count says 1"):
                read()
        with pytest.raises(StoreCorruptError, match="run 'r' has 0 signals but its count says 1"):
            s.take_signal("r", 1, "go@1")
        with pytest.raises(StoreCorruptError, match="run 'r' has 0 signals but its count says 1"):
            s.send_signal("r", "go@1", b"again")  # delivered once, ever: not a second time


def test_gc_leaves_a_damaged_run_alone_and_says_so(store_path: str) -> None:
    """gc applies retention to intact runs and skips one whose snapshot index disagrees with
    its records (deleting there could lose more), with a warning naming the run.  The moved
    record no longer verifies at its new key, so the sweep frees no chunk either, and says so."""
    from tcc.store import StoreDamageWarning

    _make(store_path, n=3)
    with open_store(store_path, keep=3) as s:
        other = s.create_run("e", run_id="o")
        for i in range(4):
            s.checkpoint("o", other.epoch, payload(i, SIZE))
    second = [k for k in _snap_keys(store_path) if k.startswith(b"default\x00r\x00")][1]
    _move(store_path, second, second[:-11] + b"\xfe" + second[-10:])
    with open_store(store_path, keep=1) as s:
        with pytest.warns(StoreDamageWarning) as caught:
            stats = s.gc()
        said = [str(w.message) for w in caught]
        assert any("snapshot 2 of run 'r' is missing" in m for m in said), said
        assert any("1 snapshot(s) fail verification, so gc deleted no chunk" in m for m in said), said
        assert stats.snapshots_deleted == 2 and stats.chunks_deleted == 0  # o's 2 and 3
        assert [i.number for i in s.snapshots("o")] == [4]
        assert [(i.number, i.damaged) for i in s.snapshots("r")] == [(1, False), (2, True), (3, False)]


def test_snapshot_lost_below_the_newest_is_recorded_and_dropped(store_path: str) -> None:
    """A lost OLDER snapshot is no reason to fall back, but it is damage: latest_good_snapshot
    records it and drops it from the index, so the run can checkpoint again."""
    _make(store_path, n=3)
    first = _snap_keys(store_path)[0]
    _move(store_path, first, first[:-11] + b"\xfe" + first[-10:])
    with open_store(store_path) as s:
        with pytest.raises(StoreCorruptError, match="snapshot 1 of run 'r' is missing"):
            s.checkpoint("r", 1, payload(7, SIZE))
        found = s.latest_good_snapshot("r")
        assert found is not None and found[0].number == 3
        events = [(e.kind, e.data.get("number")) for e in s.events("r")][-1:]
        assert events == [("snapshot_corrupt", 1)]  # and no fell_back: the newest was used
        assert s.checkpoint("r", 1, payload(7, SIZE)).number == 4


def test_lost_count_record_is_not_recreated_silently(store_path: str) -> None:
    """Adding a run when the tenant's run count is gone (and runs exist) is refused: only
    damage removes it, and recounting would hide what else went with it."""
    with open_store(store_path) as s:
        for rid in ("a", "b"):
            s.create_run("e", run_id=rid)
    _edit(store_path, b"runs", lambda txn, dbi: txn.delete(b"default\x00" + HEAD, db=dbi))
    with open_store(store_path) as s:
        with pytest.raises(StoreCorruptError, match="the run count of tenant 'default' is missing"):
            s.create_run("e", run_id="c")
        with pytest.raises(StoreCorruptError, match="the run count of tenant 'default' is missing"):
            s.delete_run("a")
        with pytest.raises(StoreCorruptError, match="the run count of tenant 'default' is missing"):
            s.list_runs()


@pytest.mark.parametrize("name", [b"runs", b"snaps"])
def test_renamed_database_is_refused_not_recreated_empty(store_path: str, name: bytes) -> None:
    """Regression (found by the slow corruption campaign, mutants #392 and #1876): one flipped
    bit in a database's NAME (in LMDB's main database) made `tcc ls` list no runs, or `tcc
    show` no snapshots, without an error: opening the store created a new, empty database
    under the old name.  A formatted store must have exactly its databases."""
    _make(store_path, n=2)
    renamed = name[:-1] + bytes([name[-1] ^ 0x02])
    mdb = Path(store_path) / "data.mdb"
    data = mdb.read_bytes()
    assert data.count(name) >= 1
    mdb.write_bytes(data.replace(name, renamed))  # every copy (both meta snapshots' main leaves)
    with pytest.raises(StoreCorruptError, match=rf"database\(s\) \['{name.decode()}'\] are missing "
                       rf"and \['{renamed.decode()}'\] are unknown"):
        open_store(store_path)
    assert mdb.read_bytes() == data.replace(name, renamed)  # nothing was created or written


def test_meta_txnid_that_looks_newer_is_refused(store_path: str) -> None:
    """Regression (found by the slow corruption campaign, mutant #672): a flipped bit in the
    older meta page's txnid made it look newer, so LMDB opened the previous transaction's
    snapshot -- consistent in itself, so `tcc show` silently lost the run's last event.  The
    two meta pages of a committed file hold consecutive txnids."""
    import struct

    _make(store_path, n=2)
    mdb = Path(store_path) / "data.mdb"
    data = bytearray(mdb.read_bytes())
    at = 16 + 128  # mm_txnid: page header, magic/version/address/mapsize, two MDB_db records, last_pg
    t0, t1 = struct.unpack_from("<Q", data, at)[0], struct.unpack_from("<Q", data, 4096 + at)[0]
    assert abs(t0 - t1) == 1
    older = 0 if t0 < t1 else 4096
    data[older + at + 1] ^= 0x10  # + 4096: even, so it stays in its slot
    mdb.write_bytes(bytes(data))
    with pytest.raises(StoreCorruptError, match="which are not consecutive"):
        open_store(store_path)


def test_gc_frees_no_chunk_while_a_snapshot_fails_verification(store_path: str) -> None:
    """While a snapshot record fails verification, gc deletes no chunk and says why: the chunks
    it references cannot be known, and damage that is undone (the record restored) must find
    them there, so restoring the record is enough to recover the snapshot."""
    from tcc.store import StoreDamageWarning

    _make(store_path, n=1, size=400_000)
    key = _snap_keys(store_path)[0]
    good = _edit_get(store_path, b"snaps", key)
    bad = bytes([good[0] ^ 0x01]) + good[1:]  # a flipped bit in the MAC
    _edit(store_path, b"snaps", lambda txn, dbi: txn.put(key, bad, db=dbi))
    with open_store(store_path) as s:
        with pytest.warns(StoreDamageWarning, match=r"1 snapshot\(s\) fail verification, so gc "
                                                    "deleted no chunk"):
            assert s.gc().chunks_deleted == 0
    _edit(store_path, b"snaps", lambda txn, dbi: txn.put(key, good, db=dbi))
    with open_store(store_path) as s:
        assert s.load_snapshot("r") == payload(0, 400_000)


def test_a_stray_key_in_the_chunk_database_does_not_reuse_chunk_ids(store_path: str) -> None:
    """A key that is not a chunk key and sorts last (only damage puts one there) is stepped
    over when new chunk ids are chosen, and new chunks are not appended above it (review
    finding: a short key read as id 1, the next checkpoint reused ids of another run's chunks
    and overwrote them, and that run's snapshot failed verification)."""
    with open_store(store_path) as s:
        a = s.create_run("e", run_id="a")
        b = s.create_run("e", run_id="b")
        s.checkpoint("a", a.epoch, payload(1, 60_000))
        s.checkpoint("b", b.epoch, payload(2, 60_000))
    _edit(store_path, b"chunks", lambda txn, dbi: txn.put(b"\x01", b"stray", db=dbi))
    with open_store(store_path) as s:
        s.checkpoint("b", b.epoch, payload(3, 60_000))
        assert s.load_snapshot("a") == payload(1, 60_000)
        assert s.load_snapshot("b") == payload(3, 60_000)
        assert s.load_snapshot("b", 1) == payload(2, 60_000)


def test_releases_decrement_shared_chunks_and_delete_the_last_holder(store_path: str) -> None:
    """Chunks a run stops holding are decremented through one cursor: a chunk a fork still
    holds keeps its data (count 2 -> 1), one nobody holds is deleted with its count, and a
    chunk whose count record damage removed is deleted without error."""
    with open_store(store_path, keep=1) as s:
        run = s.create_run("e", run_id="r")
        s.checkpoint("r", run.epoch, payload(1, 60_000))
        s.fork_run("r", 1, new_run_id="f")
        for i in range(2, 2 + 200):  # enough commits to flush the pending releases
            s.checkpoint("r", run.epoch, payload(i, 60_000))
        assert s.load_snapshot("f") == payload(1, 60_000)  # its chunks outlived r's releases
        assert s.gc().chunks_deleted == 0  # and every count stayed exact
        s.delete_run("f")
        assert s.gc().chunks_deleted == 0
    refs = [k for k in _keys(store_path, b"chunks") if k.endswith(b"r")]
    _edit(store_path, b"chunks", lambda txn, dbi: txn.delete(refs[-1], db=dbi))
    with open_store(store_path, keep=1) as s:
        for i in range(300, 300 + 200):
            s.checkpoint("r", run.epoch, payload(i, 60_000))
        assert s.load_snapshot("r") == payload(299 + 200, 60_000)
