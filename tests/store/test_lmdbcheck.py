"""The LMDB data-file verifier: healthy files pass, damaged ones raise LmdbDamageError, never crash."""

from __future__ import annotations

import os
import pickle
import random
import struct
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import lmdb
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tcc.store import open_store
from tcc.store._lmdbcheck import CheckReport, LmdbDamageError, check_data_file

_HDR = struct.Struct("<QHHHH")
_NODE = struct.Struct("<HHHH")
_P_INVALID = (1 << 64) - 1


# ------------------------------------------------------------------ building
def _build(path: str, *, seed: int, scale: int = 1) -> dict[str, int]:
    """A closed, reader-less env: named DBs, depth >= 3, overflow values, a non-empty free DB.

    Returns ``txn.stat(db)['entries']`` per database name ('main' included).
    """
    rnd = random.Random(seed)
    env = lmdb.open(path, subdir=False, map_size=1 << 30, max_dbs=8)
    names = (b"runs", b"journal", b"chunks")
    dbs = {n: env.open_db(n) for n in names}
    with env.begin(write=True) as txn:
        txn.put(b"meta", b"tcc-test")
    for batch in range(6):
        with env.begin(write=True) as txn:
            for i in range(500 * scale):
                n = batch * 100000 + i
                # long journal keys make a deep tree with few thousand entries
                txn.put(b"run-%03d/" % (n % 37) + b"j" * 140 + b"%08d" % n, rnd.randbytes(40),
                        db=dbs[b"journal"])
                if i % 5 == 0:
                    txn.put(b"c%08d" % n, rnd.randbytes(rnd.choice((300, 2500, 9000))),
                            db=dbs[b"chunks"])
                if i % 25 == 0:
                    txn.put(b"r%06d" % n, rnd.randbytes(100), db=dbs[b"runs"])
        with env.begin(write=True) as txn:  # deletes (and rewrites) feed the free DB
            for name, db in dbs.items():
                cur = txn.cursor(db=db)
                for _ in range({b"runs": 3, b"journal": 60, b"chunks": 15}[name] * scale):
                    if cur.set_range(rnd.randbytes(2)) and cur.delete():
                        pass
    with env.begin() as txn:
        stats = {n.decode(): txn.stat(db)["entries"] for n, db in dbs.items()}
        stats["main"] = txn.stat()["entries"]
    env.close()
    return stats


class _Image:
    """A data file's bytes with just enough parsing to aim damage at live pages."""

    def __init__(self, data: bytes) -> None:
        self.data = bytearray(data)
        self.ps: int = struct.unpack_from("<I", data, 40)[0]
        metas = [struct.unpack_from("<QQ", data, i * self.ps + 136) for i in range(2)]
        self.meta = max((0, 1), key=lambda i: metas[i][1])
        self.last, self.txnid = metas[self.meta]
        base = self.meta * self.ps + 40
        self.roots = {"free": self.u64(base + 40), "main": self.u64(base + 88)}
        for pgno in self.pages("main"):
            if self.header(pgno)[2] == 2:
                for off, _lo, _hi, flags, ks in self.nodes(pgno):
                    if flags == 2:
                        name = bytes(self.data[pgno * self.ps + off + 8:][:ks]).decode()
                        self.roots[name] = self.u64(pgno * self.ps + off + 8 + ks + 40)

    def u64(self, pos: int) -> int:
        """The little-endian u64 at byte ``pos``."""
        value: int = struct.unpack_from("<Q", self.data, pos)[0]
        return value

    def header(self, pgno: int) -> tuple[int, int, int, int, int]:
        """pgno, pad, flags, lower, upper of a page."""
        pgno, pad, flags, lower, upper = _HDR.unpack_from(self.data, pgno * self.ps)
        return pgno, pad, flags, lower, upper

    def nodes(self, pgno: int) -> list[tuple[int, int, int, int, int]]:
        """(offset, lo, hi, flags, ksize) of each node of a branch or leaf page."""
        lower = self.header(pgno)[3]
        base = pgno * self.ps
        offs = struct.unpack_from(f"<{(lower - 16) // 2}H", self.data, base + 16)
        return [(o, *_NODE.unpack_from(self.data, base + o)) for o in offs]

    def pages(self, name: str) -> list[int]:
        """The branch and leaf pages of a database, breadth first."""
        root = self.roots[name]
        out, todo = [], [] if root == _P_INVALID else [root]
        while todo:
            pgno = todo.pop(0)
            out.append(pgno)
            if self.header(pgno)[2] == 1:
                todo += [lo | hi << 16 | fl << 32 for _o, lo, hi, fl, _k in self.nodes(pgno)]
        return out

    def used(self) -> set[int]:
        """Every page the trees use, overflow runs included."""
        pages = {p for name in self.roots for p in self.pages(name)}
        for pgno in [p for p in pages if self.header(p)[2] == 2]:
            for off, _lo, _hi, flags, ks in self.nodes(pgno):
                if flags == 1:
                    head = self.u64(pgno * self.ps + off + 8 + ks)
                    run = struct.unpack_from("<I", self.data, head * self.ps + 12)[0]
                    pages.update(range(head, head + run))
        return pages

    def leaves(self, name: str) -> list[int]:
        """The leaf pages of a database."""
        return [p for p in self.pages(name) if self.header(p)[2] == 2]

    def save(self, path: Path) -> str:
        """Write the (damaged) image and return its path as a string."""
        path.write_bytes(self.data)
        return str(path)


@pytest.fixture(scope="module")
def rich(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, int]]:
    """A several-database env built once: its data file and its LMDB entry counts."""
    path = str(tmp_path_factory.mktemp("rich") / "data.mdb")
    return path, _build(path, seed=1)


@pytest.fixture
def image(rich: tuple[str, dict[str, int]]) -> _Image:
    """A fresh, mutable copy of the rich env's bytes."""
    return _Image(Path(rich[0]).read_bytes())


def _damage(image: _Image, tmp_path: Path) -> LmdbDamageError:
    """Check the damaged image, expecting LmdbDamageError, and return it."""
    with pytest.raises(LmdbDamageError) as info:
        check_data_file(image.save(tmp_path / "bad.mdb"))
    return info.value


# ------------------------------------------------------------------ healthy
def test_rich_env_passes_with_exact_counts(rich: tuple[str, dict[str, int]]) -> None:
    """A healthy multi-database file passes and reports LMDB's own entry counts."""
    path, stats = rich
    report = check_data_file(path)
    img = _Image(Path(path).read_bytes())
    assert {k: v for k, v in report.entries.items() if k != "free"} == stats
    assert report.entries["free"] > 0
    assert report.txnid == img.txnid and report.last_page == img.last and report.page_size == 4096
    assert report.pages_walked > 0 and report.seconds >= 0
    journal = img.pages("journal")  # depth >= 3: root, a branch level, leaves
    assert img.header(journal[0])[2] == 1 and img.header(journal[1])[2] == 1
    assert any(fl & 1 for p in img.leaves("chunks") for _o, _l, _h, fl, _k in img.nodes(p))


def test_cheap_mode_and_snapshot_choice(rich: tuple[str, dict[str, int]]) -> None:
    """full=False checks only the metas and roots; txnid picks a meta page or raises LookupError."""
    path, _ = rich
    img = _Image(Path(path).read_bytes())
    cheap = check_data_file(path, full=False)
    assert cheap.pages_walked == 0 and cheap.txnid == img.txnid
    older = struct.unpack_from("<Q", img.data, (1 - img.meta) * img.ps + 144)[0]
    assert check_data_file(path, txnid=older).txnid == older  # the older snapshot is intact too
    with pytest.raises(LookupError):
        check_data_file(path, txnid=img.txnid + 1)


def test_real_store_passes(tmp_path: Path) -> None:
    """A file written by tcc's own store passes the check."""
    with open_store(str(tmp_path / "store"), durability="none") as store:
        for i in range(5):
            run = store.create_run("agent:main", run_id=f"r{i}")
            for step in range(4):
                store.checkpoint(run.run_id, run.epoch, random.Random(i * 10 + step).randbytes(
                    5000 + 3000 * step))
    report = check_data_file(str(tmp_path / "store" / "data.mdb"))
    assert report.entries["main"] >= 1 and len(report.entries) > 3


def test_dupsort_databases_pass(tmp_path: Path) -> None:
    """Dupsort databases (sub-pages and sub-trees, fixed or not) pass with exact counts."""
    env = lmdb.open(str(tmp_path / "d.mdb"), subdir=False, max_dbs=4, map_size=1 << 28)
    dups = env.open_db(b"dups", dupsort=True)
    fixed = env.open_db(b"fixed", dupsort=True, dupfixed=True)
    with env.begin(write=True) as txn:
        for key, count in ((b"a", 3), (b"b", 3000), (b"c", 1)):
            for i in range(count):
                txn.put(key, b"v%06d" % i, db=dups)
                txn.put(key, struct.pack(">Q", i), db=fixed)
    with env.begin() as txn:
        want = {"dups": txn.stat(dups)["entries"], "fixed": txn.stat(fixed)["entries"]}
    env.close()
    report = check_data_file(str(tmp_path / "d.mdb"))
    assert {k: report.entries[k] for k in want} == want == {"dups": 3004, "fixed": 3004}


_OPS = st.lists(st.tuples(st.sampled_from(["put", "put", "big", "bulk", "del", "drop", "commit",
                                           "reader"]),
                          st.integers(0, 2), st.integers(0, 400)), max_size=250)


@given(ops=_OPS)
def test_random_histories_always_pass(ops: list[tuple[str, int, int]]) -> None:
    """Any history of puts, deletes, drops, commits and pinned readers leaves a file that passes."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "h.mdb")
        env = lmdb.open(path, subdir=False, map_size=1 << 28, max_dbs=4)
        dbs = [env.open_db(b"db%d" % i) for i in range(3)]
        readers: list[lmdb.Transaction] = []
        txn = env.begin(write=True)
        for op, d, n in ops:
            key = b"k%05d" % n * (1 + n % 3)
            if op == "put":
                txn.put(key, b"v" * (n % 300), db=dbs[d])
            elif op == "big":
                txn.put(key, bytes([n % 256]) * (2000 + 37 * n), db=dbs[d])
            elif op == "bulk":  # enough long keys for a tree of depth 3 and more
                for i in range(n):
                    txn.put(b"%03d" % d + b"b" * 200 + b"%06d" % (n * 1000 + i), b"w" * 50,
                            db=dbs[d])
            elif op == "del":
                txn.delete(key, db=dbs[d])
            elif op == "drop":
                txn.drop(dbs[d], delete=False)  # empties the database, frees all its pages
            elif op == "commit":
                txn.commit()
                txn = env.begin(write=True)
            elif len(readers) < 3:
                readers.append(env.begin())  # keeps old pages off the reuse list
        txn.commit()
        with env.begin() as rtxn:
            want = {"db%d" % i: rtxn.stat(db)["entries"] for i, db in enumerate(dbs)}
        for reader in readers:
            reader.abort()
        env.close()
        report = check_data_file(path)
        assert {k: report.entries[k] for k in want} == want


# ------------------------------------------------------------------ damage
def test_empty_and_missing_files(tmp_path: Path) -> None:
    """An empty or missing data file is damage, not a fresh database."""
    (tmp_path / "empty.mdb").write_bytes(b"")
    with pytest.raises(LmdbDamageError, match="empty"):
        check_data_file(str(tmp_path / "empty.mdb"))
    with pytest.raises(LmdbDamageError, match="missing"):
        check_data_file(str(tmp_path / "nope.mdb"))


def test_truncated_file(image: _Image, tmp_path: Path) -> None:
    """A file cut inside the highest page in use is damage naming that page."""
    top = max(image.used())
    del image.data[top * image.ps + 100:]
    exc = _damage(image, tmp_path)
    assert exc.page == top and "truncated" in str(exc)
    del image.data[image.ps + 100:]  # the cheap mode sees a file too short for its metas
    with pytest.raises(LmdbDamageError, match="truncated"):
        check_data_file(image.save(tmp_path / "stub.mdb"), full=False)


def test_unwritten_tail_is_not_truncation(tmp_path: Path) -> None:
    """Pages allocated and freed in one transaction are never written: the file may end early."""
    path = str(tmp_path / "tail.mdb")
    env = lmdb.open(path, subdir=False, map_size=1 << 28, max_dbs=4)
    dbs = [env.open_db(b"db%d" % i) for i in range(3)]
    with env.begin(write=True) as txn:  # found by the history test below
        txn.put(b"key", bytes(8179), db=dbs[0])
        txn.delete(b"key", db=dbs[0])
    last = env.info()["last_pgno"]
    env.close()
    assert os.path.getsize(path) < (last + 1) * 4096  # LMDB's own, healthy output
    report = check_data_file(path)
    assert report.last_page == last and report.entries["db0"] == 0


def test_zeroed_leaf_node_area(image: _Image, tmp_path: Path) -> None:
    """A leaf whose node area was zeroed (header intact) is damage naming it and its database."""
    pgno = image.leaves("journal")[3]
    upper = image.header(pgno)[4]
    image.data[pgno * image.ps + upper:(pgno + 1) * image.ps] = bytes(image.ps - upper)
    exc = _damage(image, tmp_path)
    assert exc.page == pgno and exc.database == "journal"
    assert f"page {pgno} (database 'journal', leaf)" in str(exc)


def test_page_with_foreign_pgno(image: _Image, tmp_path: Path) -> None:
    """A page whose header names another page (written to the wrong place) is damage."""
    pgno = image.leaves("runs")[0]
    struct.pack_into("<Q", image.data, pgno * image.ps, pgno + 1)
    exc = _damage(image, tmp_path)
    assert exc.page == pgno and f"header says it is page {pgno + 1}" in str(exc)


def test_swapped_tree_pages(image: _Image, tmp_path: Path) -> None:
    """Two swapped leaf pages are damage naming one of them."""
    a, b = image.leaves("journal")[5], image.leaves("chunks")[2]
    ps = image.ps
    pa, pb = bytes(image.data[a * ps:(a + 1) * ps]), bytes(image.data[b * ps:(b + 1) * ps])
    image.data[a * ps:(a + 1) * ps], image.data[b * ps:(b + 1) * ps] = pb, pa
    assert _damage(image, tmp_path).page in (a, b)


def test_node_offset_outside_page(image: _Image, tmp_path: Path) -> None:
    """A node offset past the page end is damage naming the page and the offset."""
    pgno = image.leaves("journal")[7]
    struct.pack_into("<H", image.data, pgno * image.ps + 16, 5000)
    exc = _damage(image, tmp_path)
    assert exc.page == pgno and "node 0 offset 5000 is outside the page" in str(exc)


def test_key_size_over_limit(image: _Image, tmp_path: Path) -> None:
    """A key size above 511 is damage naming the page."""
    pgno = image.leaves("runs")[0]
    off = image.nodes(pgno)[1][0]
    struct.pack_into("<H", image.data, pgno * image.ps + off + 6, 600)
    exc = _damage(image, tmp_path)
    assert exc.page == pgno and "key size 600" in str(exc)


def _bigdata_node(image: _Image) -> tuple[int, int]:
    """(leaf page, byte position of the overflow page number) of some F_BIGDATA node."""
    for pgno in image.leaves("chunks"):
        for off, _lo, _hi, flags, ks in image.nodes(pgno):
            if flags == 1:
                return pgno, pgno * image.ps + off + 8 + ks
    raise AssertionError("no overflow value in the fixture")


@pytest.mark.parametrize("target", ["past_last", "meta", "huge"])
def test_bigdata_pointer_out_of_range(image: _Image, tmp_path: Path, target: str) -> None:
    """An overflow pointer outside [2, last_pg] is damage naming the leaf that holds it."""
    pgno, pos = _bigdata_node(image)
    struct.pack_into("<Q", image.data, pos,
                     {"past_last": image.last + 10, "meta": 1, "huge": 1 << 62}[target])
    exc = _damage(image, tmp_path)
    assert exc.page == pgno and "overflow page" in str(exc)


def test_overflow_header_damage(image: _Image, tmp_path: Path) -> None:
    """An overflow run whose header lost its flags is damage naming the overflow page."""
    _leaf, pos = _bigdata_node(image)
    ovpg = image.u64(pos)
    struct.pack_into("<H", image.data, ovpg * image.ps + 10, 2)
    assert _damage(image, tmp_path).page == ovpg


def test_bad_meta_magic(image: _Image, tmp_path: Path) -> None:
    """One bad meta page makes the check use the other; two bad ones are damage."""
    older = 1 - image.meta
    older_txnid = image.u64(older * image.ps + 144)
    image.data[image.meta * image.ps + 16] ^= 0xFF
    assert check_data_file(image.save(tmp_path / "one.mdb")).txnid == older_txnid
    image.data[older * image.ps + 16] ^= 0xFF
    with pytest.raises(LmdbDamageError, match="neither meta page is valid"):
        check_data_file(image.save(tmp_path / "two.mdb"))


def test_meta_txnid_parity(image: _Image, tmp_path: Path) -> None:
    """A newest meta whose txnid has the wrong parity is damage: LMDB would read the other one."""
    pos = image.meta * image.ps + 144
    struct.pack_into("<Q", image.data, pos, image.txnid + 1)
    exc = _damage(image, tmp_path)
    assert exc.page == image.meta and "T % 2" in str(exc)


def test_compacted_copy_passes(rich: tuple[str, dict[str, int]], tmp_path: Path) -> None:
    """LMDB's own copies (plain and compacting) pass the check with the same entry counts."""
    env = lmdb.open(rich[0], subdir=False, max_dbs=8, readonly=True, lock=False)
    for compact in (False, True):
        env.copy(str(tmp_path / f"{compact}.mdb"), compact=compact)  # a file: the env is NOSUBDIR
        report = check_data_file(str(tmp_path / f"{compact}.mdb"))
        assert (report.entries["free"] == 0) == compact
        assert {k: v for k, v in report.entries.items() if k != "free"} == rich[1]
    env.close()


def test_cycle_and_sharing(image: _Image, tmp_path: Path) -> None:
    """A branch pointing at a page another branch already uses is damage (no cycles, no sharing)."""
    branch = image.pages("journal")[0]
    off, *_ = image.nodes(branch)[1]
    struct.pack_into("<HHH", image.data, branch * image.ps + off,
                     image.roots["runs"] & 0xFFFF, image.roots["runs"] >> 16 & 0xFFFF, 0)
    assert "reached twice" in str(_damage(image, tmp_path))


def test_wrong_entry_count(image: _Image, tmp_path: Path) -> None:
    """A named database record whose md_entries disagrees with its tree is damage."""
    for pgno in image.leaves("main"):
        for off, _lo, _hi, flags, ks in image.nodes(pgno):
            name = bytes(image.data[pgno * image.ps + off + 8:][:ks])
            if flags == 2 and name == b"runs":
                pos = pgno * image.ps + off + 8 + ks + 32
                struct.pack_into("<Q", image.data, pos, image.u64(pos) + 1)
    exc = _damage(image, tmp_path)
    assert exc.database == "runs" and "entries" in str(exc)


def test_free_page_in_use(image: _Image, tmp_path: Path) -> None:
    """A free-list IDL that names a live tree page is damage naming that page."""
    live = set(image.pages("journal"))
    for pgno in image.leaves("free"):
        for off, lo, hi, flags, ks in image.nodes(pgno):
            pos = pgno * image.ps + off + 8 + ks
            if flags == 0 and image.u64(pos) >= 2:
                ids = [image.u64(pos + 8 * (i + 1)) for i in range(2)]
                fit = [p for p in live if ids[1] < p <= image.last and p != ids[0]]
                if fit:
                    struct.pack_into("<Q", image.data, pos + 8, max(fit))
                    exc = _damage(image, tmp_path)
                    assert exc.page == max(fit) and "listed as free" in str(exc)
                    return
    pytest.fail("no inline free-list record to edit")


def test_damage_pickles() -> None:
    """LmdbDamageError keeps its message, page and database through pickle."""
    exc = LmdbDamageError("x.mdb page 3 (database 'runs', leaf): bad", page=3, database="runs")
    back = pickle.loads(pickle.dumps(exc))
    assert (str(back), back.page, back.database) == (str(exc), 3, "runs")
    assert issubclass(LmdbDamageError, Exception) and CheckReport.__dataclass_params__.frozen


# ------------------------------------------------------------------ fuzzing
def _mutants(base: bytes, seed: int) -> Iterator[tuple[str, bytes]]:
    """Endless random damage of ``base``: bit flips, splices, zeroed, copied or swapped pages."""
    rnd = random.Random(seed)
    img = _Image(base)
    ps, n = img.ps, len(base) // img.ps
    tree = [p for name in img.roots for p in img.pages(name)]
    while True:
        data = bytearray(base)
        kind = rnd.choice(["flip", "flip_tree", "flip_hdr", "splice", "zero", "copy", "swap",
                           "truncate", "meta"])
        if kind == "flip":
            for _ in range(rnd.randint(1, 8)):
                data[rnd.randrange(len(data))] ^= 1 << rnd.randrange(8)
        elif kind in ("flip_tree", "flip_hdr"):
            page = rnd.choice(tree)
            span = 64 if kind == "flip_hdr" else ps
            for _ in range(rnd.randint(1, 4)):
                data[page * ps + rnd.randrange(span)] ^= 1 << rnd.randrange(8)
        elif kind == "splice":
            size = rnd.choice((2, 8, 16, 100, ps))
            src, dst = rnd.randrange(len(data) - size), rnd.choice(tree) * ps + rnd.randrange(ps)
            data[dst:dst + size] = base[src:src + size]
            del data[len(base):]
        elif kind == "zero":
            page = rnd.choice(tree)
            start = rnd.choice((0, 16, rnd.randrange(ps)))
            data[page * ps + start:(page + 1) * ps] = bytes(ps - start)
        elif kind in ("copy", "swap"):
            a, b = rnd.choice(tree), rnd.randrange(2, n)
            pa, pb = base[a * ps:(a + 1) * ps], base[b * ps:(b + 1) * ps]
            data[b * ps:(b + 1) * ps] = pa
            if kind == "swap":
                data[a * ps:(a + 1) * ps] = pb
        elif kind == "truncate":
            del data[rnd.randrange(len(data)):]
        else:
            pos = rnd.randrange(2) * ps + rnd.randrange(16, 160)
            data[pos] ^= 1 << rnd.randrange(8)
        yield kind, bytes(data)


def _small_env(path: str) -> bytes:
    """Build a small env (a few dozen pages, all page kinds) for fuzzing; return its bytes."""
    _build(path, seed=2, scale=0)
    env = lmdb.open(path, subdir=False, max_dbs=8)
    dbs = [env.open_db(n) for n in (b"runs", b"journal", b"chunks")]
    rnd = random.Random(3)
    for _ in range(3):
        with env.begin(write=True) as txn:
            for i in range(120):
                txn.put(b"k%04d" % rnd.randrange(3000) * 3, rnd.randbytes(rnd.choice((20, 3000))),
                        db=dbs[i % 3])
            cur = txn.cursor(db=dbs[0])
            for _ in range(20):
                if cur.first():
                    cur.delete()
    env.close()
    return Path(path).read_bytes()


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The bytes of a small env for fuzzing."""
    return _small_env(str(tmp_path_factory.mktemp("small") / "data.mdb"))


def _outcome(path: str) -> str:
    """'pass' or 'damage'; any other exception escapes and fails the test."""
    try:
        check_data_file(path)
    except LmdbDamageError:
        return "damage"
    return "pass"


def _fuzz(small: bytes, tmp_path: Path, cases: int, seed: int) -> dict[str, int]:
    seen: dict[str, int] = {}
    path = tmp_path / "fuzz.mdb"
    for (kind, data), _ in zip(_mutants(small, seed), range(cases)):
        path.write_bytes(data)
        try:
            result = _outcome(str(path))
        except Exception as exc:  # noqa: BLE001 - the point: only LmdbDamageError may escape
            pytest.fail(f"{kind} mutant raised {type(exc).__name__}: {exc}")
        seen[result] = seen.get(result, 0) + 1
    return seen


def test_fuzz_only_report_or_damage(small: bytes, tmp_path: Path) -> None:
    """Random bit flips, splices and page moves yield a report or LmdbDamageError, nothing else."""
    seen = _fuzz(small, tmp_path, 400, seed=11)
    assert seen.get("damage", 0) > 100


@pytest.mark.slow
def test_fuzz_campaign(small: bytes, tmp_path: Path) -> None:
    """A larger fuzz campaign (TCC_SLOW_CHECK_MUTANTS, default 20000): still only reports or LmdbDamageError."""
    n = int(os.environ.get("TCC_SLOW_CHECK_MUTANTS", "20000"))
    seen = _fuzz(small, tmp_path, n, seed=12)
    print(f"\nfuzz: layer=lmdb-structure mutants={n} outcomes={dict(sorted(seen.items()))}")


# The child opens each mutant the checker passed, reads every database both ways,
# then writes (which allocates from the free list): it may raise lmdb.Error, but
# it must never die from a signal.
_CHILD = textwrap.dedent(
    """
    import sys, lmdb
    for path in sys.argv[1:]:
        print("start", path, flush=True)
        try:
            env = lmdb.open(path, subdir=False, max_dbs=16, map_size=1 << 26)
        except lmdb.Error:
            continue
        try:
            with env.begin() as txn:
                names = [bytes(k) for k, _ in txn.cursor()]
            dbs = []
            for name in names:
                try:
                    dbs.append(env.open_db(name, create=False))
                except lmdb.Error:
                    pass
            with env.begin() as txn:
                for db in dbs:
                    sum(len(v) for _, v in txn.cursor(db=db))
                    cur = txn.cursor(db=db)
                    ok = cur.last()
                    while ok:
                        ok = cur.prev()
            for round_ in range(3):
                with env.begin(write=True) as txn:
                    for i, db in enumerate(dbs):
                        txn.put(b"new%d-%d" % (round_, i), b"x" * (100 + 3000 * i), db=db)
                        cur = txn.cursor(db=db)
                        if cur.first():
                            cur.delete()
        except lmdb.Error:
            pass
        finally:
            env.close()
    print("finished", flush=True)
    """
)


def _run_children(paths: list[str], workers: int = 2) -> None:
    """Open every path with LMDB in ``workers`` child processes; fail if one dies of a signal."""
    chunks = [paths[i::workers] for i in range(workers)]
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, *chunk], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for chunk in chunks]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        last = ([line for line in out.splitlines() if line.startswith("start")] or ["?"])[-1]
        assert proc.returncode == 0 and out.endswith("finished\n"), (
            f"LMDB died (rc {proc.returncode}) on a file the checker passed: {last}\n{err[-2000:]}")


def _passing_mutants(small: bytes, tmp_path: Path, want: int, seed: int) -> list[str]:
    paths: list[str] = []
    for i, (_kind, data) in enumerate(_mutants(small, seed)):
        if len(paths) >= want or i > 40 * want:
            break
        path = tmp_path / f"m{i}.mdb"
        path.write_bytes(data)
        if _outcome(str(path)) == "pass":
            paths.append(str(path))
        else:
            path.unlink()
    return paths


def test_passing_mutants_do_not_crash_lmdb(small: bytes, tmp_path: Path) -> None:
    """Every mutant the checker passes is read and written by LMDB without a signal."""
    paths = _passing_mutants(small, tmp_path, 250, seed=21)
    assert len(paths) >= 200
    _run_children(paths)


@pytest.mark.slow
def test_passing_mutants_campaign(small: bytes, tmp_path: Path) -> None:
    """A larger campaign of passing mutants, each opened by LMDB in a child process."""
    opened = 0
    for seed in range(30, 40):
        (tmp_path / str(seed)).mkdir()
        paths = _passing_mutants(small, tmp_path / str(seed), 500, seed=seed)
        _run_children(paths)
        opened += len(paths)
    print(f"\nfuzz: layer=lmdb-passing-opened mutants={opened} signals=0")


@pytest.mark.skipif(sys.platform != "linux", reason="SIGBUS on a truncated map is Linux behaviour")
def test_child_harness_sees_crashes(small: bytes, tmp_path: Path) -> None:
    """The harness is not vacuous: a file the checker rejects (truncated) kills LMDB by a signal."""
    path = tmp_path / "short.mdb"
    path.write_bytes(small[:len(small) // 2])
    assert _outcome(str(path)) == "damage"
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(path)], capture_output=True,
                          timeout=120)
    assert proc.returncode < 0


def test_public_names() -> None:
    """The module exports exactly its public API."""
    import tcc.store._lmdbcheck as mod

    assert sorted(mod.__all__) == ["CheckReport", "LmdbDamageError", "Probe", "check_data_file"]
