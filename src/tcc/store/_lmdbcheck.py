"""A structural verifier for LMDB 0.9 data files, run before LMDB maps the file.

LMDB trusts ``data.mdb`` completely: a truncated file, a torn or zeroed page, a
page written to the wrong place or spliced bytes make it read past the end of
the map (SIGBUS), abort on an internal assertion (SIGABRT), follow wild node
offsets (SIGSEGV) or silently lose records.  :func:`check_data_file` reads the
file with :func:`os.pread` only -- never ``mmap``: touching a mapped page past
EOF is itself a SIGBUS -- and either vouches for the structure of one snapshot
or raises :class:`LmdbDamageError` naming the file, page, database and fault.

Layout facts (``libraries/liblmdb/mdb.c``, 64-bit little-endian), checked
against files written by py-lmdb:

* page header: ``u64 mp_pgno, u16 mp_pad, u16 mp_flags`` then ``u16 mp_lower,
  u16 mp_upper`` (branch/leaf) or ``u32 mp_pages`` (overflow); pages 0 and 1
  are meta pages; the page size is ``mm_dbs[FREE].md_pad`` and the free DB's
  ``md_flags`` double as ``mm_flags`` (``MDB_INTEGERKEY | env flags & 0xffff``);
* nodes are 2-byte aligned, ``EVEN(8 + ksize + inline data)`` bytes, never
  overlapping; a branch node keeps a 48-bit child page number in lo/hi/flags;
* an overflow run may hold more pages than its value needs (LMDB overwrites a
  value in place when the old run is big enough), never fewer;
* a dupsort database counts every duplicate in ``md_entries`` and the pages of
  its duplicate sub-trees in its own page counts;
* a free-DB record is ``u64 count`` then ``count`` page numbers, strictly
  descending, and may be *longer* than ``8 * (count + 1)`` bytes:
  ``mdb_freelist_save`` reserves room and can leave the last reserved records
  unused (``count`` zeroed).

**What passing means.**  The chosen meta page is one LMDB accepts and sits in
the slot its txnid selects (LMDB reads ``me_metas[txnid & 1]``).  Every page
reachable from it (overflow runs whole) lies inside ``[2, mm_last_pg]`` and
inside the file -- which may end before ``mm_last_pg``: pages a transaction
allocated and freed again are never written -- is
reached once, carries its own page number and the expected type; node arrays,
node headers, keys and inline data lie inside their page without overlapping;
keys follow the database's order within each page and within the parent's
separators; every leaf sits at ``md_depth``; recorded entry and page counts
match the walk; and the free list names only pages in range that no tree uses.
(That last check is sound: in one committed snapshot the free list and the
trees are disjoint, because freed pages are reused only after a later
``mdb_freelist_save`` deleted the records naming them.)  That is what LMDB's
read and write paths rely on to stay inside the map and clear of assertions.

**Not checked.**  Value contents (the store's MACs cover those); whether every
page is accounted for (a leaked page is harmless; healthy files have none);
the other meta page's snapshot; the key order of ``MDB_INTEGERDUP`` duplicates
and of ``MDB_INTEGERKEY`` keys of mixed sizes (their structure is checked).
Check a file no writer is changing (environment closed, or a read transaction
pinning the snapshot): writers reuse pages of older snapshots, and a torn view
of them is reported as damage.
"""

from __future__ import annotations

import os
import stat
import struct
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import islice, repeat
from operator import gt, lt
from typing import Any, Final

__all__ = ["CheckReport", "LmdbDamageError", "Probe", "check_data_file"]

Probe = Callable[[str, int, Iterator[tuple[bytes, bytes]]], "str | None"]

# ---------------------------------------------------------------- mdb.c facts
_PAGEHDRSZ: Final = 16
_NODESIZE: Final = 8
# mp_flags; P_DIRTY is also set on P_SUBP pages, which live inside a node.
_P_BRANCH, _P_LEAF, _P_OVERFLOW, _P_META, _P_DIRTY, _P_LEAF2, _P_SUBP = 1, 2, 4, 8, 16, 32, 64
_F_BIGDATA, _F_SUBDATA, _F_DUPDATA = 1, 2, 4  # mn_flags of leaf nodes
# md_flags: what mdb_dbi_open persists (PERSISTENT_FLAGS & VALID_FLAGS).
_REVERSEKEY, _DUPSORT, _INTEGERKEY, _DUPFIXED, _INTEGERDUP, _REVERSEDUP = 2, 4, 8, 16, 32, 64
_DB_FLAGS: Final = 0x7E
_ENV_FLAGS: Final = 0x4001  # MDB_FIXEDMAP | MDB_NOSUBDIR: env flags that land in mm_flags
_MAGIC: Final = 0xBEEFC0DE
_DATA_VERSION: Final = 1
_P_INVALID: Final = (1 << 64) - 1
_MAXKEYSIZE: Final = 511  # MDB_MAXKEYSIZE of a non-MDB_DEVEL build
_CURSOR_STACK: Final = 32  # deeper trees cannot be written (or read) by LMDB
_MIN_PSIZE: Final = 512
_MAX_PSIZE: Final = 0x8000  # MAX_PAGESIZE when PAGEBASE is 0 (mp_upper is a u16)

_HDR: Final = struct.Struct("<QHHHH")  # pgno, pad, flags, lower, upper
_OVHDR: Final = struct.Struct("<QHHI")  # pgno, pad, flags, pages
_NODE: Final = struct.Struct("<HHHH")  # lo, hi, flags, ksize
_DB: Final = struct.Struct("<IHHQQQQQ")  # pad, flags, depth, branch, leaf, overflow, entries, root
_META: Final = struct.Struct("<QHH4x" + "IIQQ" + "IHHQQQQQ" * 2 + "QQ")
_U64: Final = struct.Struct("<Q")
_NODE_AT = _NODE.unpack_from

_FREE_TAG: Final = 255  # owner tag of a page named by the free list
_MAX_TAG: Final = 254  # owner tags 1..254 name a tree; later trees share 254
_READ_GAP: Final = 8  # coalesce reads of pages at most this many pages apart
_READ_MAX: Final = 1 << 20  # bytes per pread

# Key orders: mdb_cmp_memn (Python's bytes order), mdb_cmp_memnr (bytes order of the
# reversed keys), mdb_cmp_cint/long (integers of equal size), and "not checked".
_MEMCMP, _REVERSE, _INTEGER, _UNKNOWN = 0, 1, 2, 3


class LmdbDamageError(Exception):
    """An LMDB data file is structurally damaged; opening it with LMDB is unsafe.

    ``page`` is the page number the message names (``None`` for damage of the
    file as a whole) and ``database`` the database it belongs to (``'main'``,
    ``'free'`` or a named database), when known.
    """

    def __init__(self, message: str, *, page: int | None = None,
                 database: str | None = None) -> None:
        super().__init__(message)
        self.page = page
        self.database = database


@dataclass(frozen=True)
class CheckReport:
    """What :func:`check_data_file` vouched for: one snapshot of one data file."""

    txnid: int  #: ``mm_txnid`` of the meta page that was checked
    page_size: int
    last_page: int  #: ``mm_last_pg`` of that meta page
    pages_walked: int  #: branch, leaf and overflow pages accounted for (0 if not full)
    entries: dict[str, int]  #: ``md_entries`` per database: 'free', 'main', then named ones
    seconds: float


class _Meta:
    """One parsed meta page (the fields this module uses)."""

    __slots__ = ("index", "pgno", "flags", "magic", "version", "free", "main", "psize",
                 "last_pg", "txnid")

    def __init__(self, index: int, raw: bytes) -> None:
        f = _META.unpack_from(raw, 0)
        self.index = index
        self.pgno, self.flags = f[0], f[2]
        self.magic, self.version = f[3], f[4]
        self.free: tuple[int, ...] = f[7:15]
        self.main: tuple[int, ...] = f[15:23]
        self.psize: int = f[7]  # mm_psize is the free DB's md_pad
        self.last_pg: int = f[23]
        self.txnid: int = f[24]

    def lmdb_valid(self) -> bool:
        """Exactly what ``mdb_env_read_header`` accepts: LMDB picks among these."""
        return bool(self.flags & _P_META) and self.magic == _MAGIC and self.version == _DATA_VERSION


class _Tree:
    """One B+tree being walked: its ``MDB_db`` record and what the walk counted."""

    __slots__ = ("name", "tag", "flags", "depth", "branch", "leaf", "overflow", "entries",
                 "root", "pad", "mode", "isize", "kind", "outer", "n_branch", "n_leaf",
                 "n_overflow", "n_entries", "records")

    def __init__(self, name: str, tag: int, rec: tuple[int, ...], kind: str,
                 mode: int, outer: _Tree | None = None) -> None:
        self.name = name
        self.tag = tag
        (self.pad, self.flags, self.depth, self.branch, self.leaf, self.overflow,
         self.entries, self.root) = rec
        self.kind = kind  # 'free', 'main', 'named' or 'dup' (duplicates of one key)
        self.mode = mode
        self.isize = 0  # key size seen in an _INTEGER tree
        self.outer = outer  # the dupsort tree a 'dup' tree belongs to
        self.n_branch = self.n_leaf = self.n_overflow = self.n_entries = 0
        # free DB only: (leaf page, txnid, IDL bytes or overflow page, data size)
        self.records: list[tuple[int, int, bytes | int, int]] = []


def _key_mode(flags: int) -> int:
    """The order ``mdb_default_cmp`` gives a database's keys."""
    return _REVERSE if flags & _REVERSEKEY else _INTEGER if flags & _INTEGERKEY else _MEMCMP


def _dup_mode(flags: int) -> int:
    """The order ``mdb_default_cmp`` gives a dupsort database's data items.

    ``MDB_INTEGERDUP`` is left unchecked: whether LMDB compares them with
    ``mdb_cmp_int`` or ``mdb_cmp_cint`` depends on ``MDB_DUPFIXED`` and the build.
    """
    return _UNKNOWN if flags & _INTEGERDUP else _REVERSE if flags & _REVERSEDUP else _MEMCMP


class _Checker:
    """State of one check: the open file, the chosen meta page and the walk."""

    def __init__(self, path: str, fd: int, size: int) -> None:
        self.path = path
        self.fd = fd
        self.size = size
        self.ps = 0
        self.meta_index = 0
        self.npages = 0  # whole pages in the file
        self.last = 0
        self.txnid = 0
        self.owner = bytearray()  # per page: 0 unused, a tree's tag, or _FREE_TAG
        self.past_eof: set[int] = set()  # free pages past the end of the file
        self.trees: list[_Tree] = []
        self.fmts: dict[int, struct.Struct] = {}
        self.probe: Probe | None = None

    # ------------------------------------------------------------ reporting
    def fail(self, pgno: int | None, tree: _Tree | None, kind: str, what: str) -> LmdbDamageError:
        """Build the exception for damage at ``pgno`` (raise the result)."""
        name = None if tree is None else tree.name
        if pgno is None:
            return LmdbDamageError(f"{self.path}: {what}", database=name)
        where = f"database {name!r}, {kind}" if name is not None else kind
        return LmdbDamageError(f"{self.path} page {pgno} ({where}): {what}", page=pgno, database=name)

    def owner_name(self, tag: int) -> str:
        """Name whatever already claimed a page, for 'reached twice' messages."""
        if tag == _FREE_TAG:
            return "the free list"
        many = tag == _MAX_TAG and len(self.trees) > _MAX_TAG
        return "another database" if many else f"database {self.trees[tag - 1].name!r}"

    # ----------------------------------------------------------------- I/O
    def pread(self, n: int, offset: int, pgno: int, tree: _Tree | None, kind: str) -> bytes:
        """Read exactly ``n`` bytes or report the short read as damage."""
        data = os.pread(self.fd, n, offset)
        if len(data) != n:
            raise self.fail(pgno, tree, kind, f"short read ({len(data)} of {n} bytes at offset "
                            f"{offset}): the file shrank while it was being checked")
        return data

    def batches(self, pgnos: list[int], tail: int) -> Any:
        """Yield ``(index, chunk, offset)`` for sorted ``pgnos``, coalescing nearby pages.

        ``tail`` is how many bytes of the last page of a batch are needed.
        """
        ps, n, i = self.ps, len(pgnos), 0
        limit = max(1, _READ_MAX // ps)
        while i < n:
            first = prev = pgnos[i]
            j = i + 1
            while j < n and pgnos[j] - prev <= _READ_GAP and pgnos[j] - first < limit:
                prev = pgnos[j]
                j += 1
            chunk = self.pread((prev - first) * ps + tail, first * ps, first, None, "read")
            for k in range(i, j):
                yield k, chunk, (pgnos[k] - first) * ps
            i = j

    # ------------------------------------------------------------ meta pages
    def choose_meta(self, txnid: int | None, attempts: int = 5) -> _Meta:
        """Pick the meta page LMDB would use (or the one with ``txnid``)."""
        head = os.pread(self.fd, _META.size, 0)
        if len(head) < _META.size:
            raise self.fail(None, None, "meta", f"the data file is {self.size} bytes, too short "
                            "to hold a meta page")
        m0 = _Meta(0, head)
        # mdb_env_read_header reads meta 1 at meta 0's page size; without a valid
        # meta 0 LMDB refuses the file, and we look for meta 1 at each legal size.
        spots = [m0.psize] if m0.lmdb_valid() else [1 << s for s in range(9, 16)]
        m1: _Meta | None = None
        for spot in spots:
            raw = os.pread(self.fd, _META.size, spot) if 0 < spot < self.size else b""
            if len(raw) == _META.size:
                cand = _Meta(1, raw)
                if cand.lmdb_valid() and (m0.lmdb_valid() or cand.psize == spot):
                    m1 = cand
                    break
        valid = [m for m in (m0, m1) if m is not None and m.lmdb_valid()]
        if not valid:
            raise self.fail(0, None, "meta", "neither meta page is valid (bad magic, version or "
                            "flags): this is not an LMDB file or both meta pages are destroyed")
        if txnid is not None:
            chosen = [m for m in valid if m.txnid == txnid]
            if not chosen:
                have = ", ".join(str(m.txnid) for m in valid)
                raise LookupError(f"{self.path}: no meta page has txnid {txnid} (they have {have})")
            meta = chosen[0]
        else:
            meta = max(valid, key=lambda m: m.txnid)  # first wins a tie, as in LMDB
        if len(valid) == 2 and m0.psize != valid[1].psize:
            raise self.fail(1, None, "meta", f"meta pages disagree on the page size "
                            f"({m0.psize} and {valid[1].psize})")
        # Transactions read and write me_metas[txnid & 1] (mdb_txn_renew0), where
        # txnid is the picked meta's: with the wrong parity LMDB would use the
        # other meta page, whose snapshot this check does not walk.
        if meta.txnid & 1 != meta.index:
            raise self.fail(meta.index, None, "meta", f"txnid {meta.txnid} is stored in meta "
                            f"page {meta.index}, but txnid T belongs in meta page T % 2: LMDB "
                            "would read the other meta page's snapshot")
        # Every commit writes its txnid into meta page txnid % 2, so the two hold
        # consecutive txnids (both 0 before the first commit).  A damaged txnid
        # that looks newer makes LMDB open an older snapshot, consistent in itself.
        if len(valid) == 2 and abs(valid[0].txnid - valid[1].txnid) != 1 and (
                valid[0].txnid or valid[1].txnid):
            if attempts > 1:  # a writer committed twice between our two reads: look again
                time.sleep(0.001)
                return self.choose_meta(txnid, attempts - 1)
            raise self.fail(max(valid, key=lambda m: m.txnid).index, None, "meta",
                            f"the meta pages hold txnids {valid[0].txnid} and {valid[1].txnid}, "
                            "which are not consecutive: one is damaged, and LMDB would open "
                            "the wrong snapshot")
        return meta

    def check_meta(self, meta: _Meta) -> None:
        """The cheap checks of the chosen meta page and the file size."""
        i = meta.index
        if meta.pgno != i or meta.flags != _P_META:
            raise self.fail(i, None, "meta", f"header says page {meta.pgno} with flags "
                            f"{meta.flags:#x}, expected page {i} with flags {_P_META:#x}")
        if not (_MIN_PSIZE <= meta.psize <= _MAX_PSIZE and meta.psize & (meta.psize - 1) == 0):
            raise self.fail(i, None, "meta", f"page size {meta.psize} is not a power of two "
                            f"in [{_MIN_PSIZE}, {_MAX_PSIZE}]")
        self.ps, self.last, self.txnid, self.meta_index = (meta.psize, meta.last_pg,
                                                           meta.txnid, meta.index)
        self.npages = self.size // self.ps
        if not 1 <= meta.last_pg < (1 << 48):
            raise self.fail(i, None, "meta", f"last page {meta.last_pg} is out of range")
        # Not (last_pg + 1) * psize: pages allocated and freed by one transaction
        # ("loose") are never written, so a healthy file may end before last_pg
        # (mdb_env_copyfd0 clamps its copy to the file size for that reason).
        # Free pages past EOF are harmless; every page a tree uses is checked.
        if self.npages < 2:
            raise self.fail(1, None, "meta", f"the file is {self.size} bytes, too short for its "
                            f"two {self.ps}-byte meta pages: the file is truncated")
        fflags = meta.free[1]
        if fflags & ~_ENV_FLAGS != _INTEGERKEY:
            raise self.fail(i, None, "meta", f"free DB flags {fflags:#x} are not MDB_INTEGERKEY")
        if meta.main[1] & ~_DB_FLAGS:
            raise self.fail(i, None, "meta", f"main DB flags {meta.main[1]:#x} are unknown")

    # ------------------------------------------------------------ the trees
    def new_tree(self, name: str, rec: tuple[int, ...], kind: str, mode: int,
                 at: int, outer: _Tree | None = None) -> _Tree:
        """Register a tree after checking its ``MDB_db`` record (found on page ``at``)."""
        tag = min(len(self.trees) + 1, _MAX_TAG) if outer is None else outer.tag
        tree = _Tree(name, tag, rec, kind, mode, outer)
        counts = (tree.depth, tree.branch, tree.leaf, tree.overflow, tree.entries)
        if tree.root == _P_INVALID:
            if any(counts):
                raise self.fail(at, tree, "record", f"empty database (root P_INVALID) has "
                                f"depth/branch/leaf/overflow/entries {counts}, expected zeros")
        else:
            if not 2 <= tree.root <= self.last:
                raise self.fail(at, tree, "record", f"root page {tree.root} is outside "
                                f"[2, {self.last}]")
            if not 1 <= tree.depth <= _CURSOR_STACK:
                raise self.fail(at, tree, "record", f"depth {tree.depth} is not in "
                                f"[1, {_CURSOR_STACK}]")
            if tree.leaf < 1 or tree.entries < 1:
                raise self.fail(at, tree, "record", f"non-empty tree records {tree.leaf} leaf "
                                f"pages and {tree.entries} entries")
        if kind == "dup" and tree.flags & _DUPFIXED and not 1 <= tree.pad <= _MAXKEYSIZE:
            raise self.fail(at, tree, "record", f"fixed duplicate size {tree.pad} is invalid")
        self.trees.append(tree)
        return tree

    def claim(self, pgno: int, tree: _Tree, kind: str, by: int) -> None:
        """Mark a tree page as reached, once; ``by`` is the page that points to it."""
        self.in_file(pgno, 1, tree, kind, by)
        tag = self.owner[pgno]
        if tag:
            raise self.fail(pgno, tree, kind, f"page is reached twice (from page {by}); "
                            f"{self.owner_name(tag)} already uses it")
        self.owner[pgno] = tree.tag

    def in_file(self, pgno: int, pages: int, tree: _Tree, kind: str, by: int) -> None:
        """Pages ``pgno .. pgno + pages - 1`` are in ``[2, last_pg]`` and in the file."""
        if not 2 <= pgno <= self.last - pages + 1:
            raise self.fail(by, tree, kind, f"points to page {pgno}" + (
                f" ({pages} pages)" if pages > 1 else "") + f", outside [2, {self.last}]")
        if pgno + pages > self.npages:
            bad = max(pgno, self.npages)
            raise self.fail(bad, tree, kind, f"page (reached from page {by}) is past the end of "
                            f"the file ({self.size} bytes): the file is truncated")

    def walk(self) -> int:
        """Walk all trees level by level (reading each level in file order); return pages.

        Named and duplicate trees join the level after the leaf that records them.
        """
        level: list[tuple[int, _Tree, int, Any, Any]] = []
        for tree in self.trees:
            if tree.root != _P_INVALID:
                self.claim(tree.root, tree, "root", self.meta_index)
                level.append((tree.root, tree, 1, None, None))
        walked = 0
        while level:
            level.sort(key=lambda item: item[0])
            nxt: list[tuple[int, _Tree, int, Any, Any]] = []
            ovf: list[tuple[int, _Tree, int, int]] = []
            for k, chunk, off in self.batches([item[0] for item in level], self.ps):
                pgno, tree, depth, lo, hi = level[k]
                self.page(chunk, off, pgno, tree, depth, lo, hi, nxt, ovf)
            walked += len(level) + self.overflows(ovf)
            level = nxt
        return walked

    def page(self, buf: bytes, off: int, pgno: int, tree: _Tree, depth: int, lo: Any, hi: Any,
             nxt: list[tuple[int, _Tree, int, Any, Any]],
             ovf: list[tuple[int, _Tree, int, int]]) -> None:
        """Check one branch or leaf page of ``tree`` and queue what it points to."""
        hpgno, _pad, flags, lower, upper = _HDR.unpack_from(buf, off)
        leaf2 = tree.kind == "dup" and bool(tree.flags & _DUPFIXED)
        want_leaf = _P_LEAF | _P_LEAF2 if leaf2 else _P_LEAF
        kind = "leaf" if flags == want_leaf else "branch" if flags == _P_BRANCH else "page"
        if hpgno != pgno:
            raise self.fail(pgno, tree, kind, f"header says it is page {hpgno}: the page was "
                            "written to the wrong place or is stale")
        if flags not in (_P_BRANCH, want_leaf):
            raise self.fail(pgno, tree, kind, f"flags {flags:#x} are not a "
                            f"{'leaf' if depth == tree.depth else 'branch'} page's")
        if kind == "leaf" and depth != tree.depth:
            raise self.fail(pgno, tree, kind, f"leaf at depth {depth}, but the database has "
                            f"depth {tree.depth}")
        if kind == "branch" and depth >= tree.depth:
            raise self.fail(pgno, tree, kind, f"branch at depth {depth}, but the database has "
                            f"depth {tree.depth}")
        self.bounds(pgno, tree, kind, lower, upper, self.ps)
        if kind == "branch":
            tree.n_branch += 1
            self.branch(buf, off, pgno, tree, depth, lo, hi, lower, upper, nxt)
        elif leaf2:
            tree.n_leaf += 1
            tree.n_entries += self.leaf2(buf, off, self.ps, pgno, tree, lower, tree.pad, lo, hi)
        else:
            tree.n_leaf += 1
            n = self.leaf(buf, off, self.ps, pgno, tree, "leaf", lo, hi, lower, upper, nxt, ovf)
            tree.n_entries += n  # after the call: special() adds the duplicates it finds

    def bounds(self, pgno: int, tree: _Tree, kind: str, lower: int, upper: int,
               size: int) -> None:
        """``mp_lower``/``mp_upper`` of a page (or sub-page) of ``size`` bytes."""
        if not _PAGEHDRSZ < lower <= upper <= size or lower & 1:
            what = "hold no node" if lower == _PAGEHDRSZ else "are inconsistent"
            raise self.fail(pgno, tree, kind, f"lower {lower} / upper {upper} {what} (page "
                            f"size {size})")

    def ptrs(self, buf: bytes, off: int, lower: int) -> tuple[int, ...]:
        """The node offset array of the page at ``off``."""
        n = (lower - _PAGEHDRSZ) >> 1
        fmt = self.fmts.get(n)
        if fmt is None:
            fmt = self.fmts[n] = struct.Struct(f"<{n}H")
        ptrs: tuple[int, ...] = fmt.unpack_from(buf, off + _PAGEHDRSZ)
        return ptrs

    def bad_node(self, buf: bytes, off: int, size: int, upper: int, pgno: int, tree: _Tree,
                 kind: str, ptrs: tuple[int, ...], q: int, end: int) -> LmdbDamageError:
        """Say what is wrong with the node at offset ``q`` (the fast loops only detect it)."""
        i = ptrs.index(q)
        if q & 1 or q < upper or q > size - _NODESIZE:
            where = "is odd" if q & 1 else "is outside the page" if q >= size else (
                f"is outside the node area [{upper}, {size})")
            return self.fail(pgno, tree, kind, f"node {i} offset {q} {where}")
        lo16, hi16, flags, ks = _NODE_AT(buf, off + q)
        if ks > _MAXKEYSIZE or (ks == 0 and not (kind == "branch" and i == 0)):
            return self.fail(pgno, tree, kind, f"node {i} key size {ks} is not in "
                             f"[1, {_MAXKEYSIZE}]")
        if kind != "branch" and tree.kind == "dup" and (lo16 or hi16 or flags):
            return self.fail(pgno, tree, kind, f"node {i} of a duplicates tree has flags "
                             f"{flags:#x} and {lo16 | hi16 << 16} data bytes, expected none")
        return self.fail(pgno, tree, kind, f"node {i} at offset {q} ends at {end}, past the "
                         f"end of the page ({size})")

    def overlap(self, pgno: int, tree: _Tree, kind: str, ext: list[int],
                ptrs: tuple[int, ...]) -> None:
        """Nodes (``start << 16 | end``, all inside the page) do not overlap."""
        ext.sort()
        prev = 0
        for x in ext:
            if x >> 16 < prev:
                a = ext[ext.index(x) - 1]
                raise self.fail(pgno, tree, kind, f"node {ptrs.index(a >> 16)} (offset "
                                f"{a >> 16}..{a & 0xFFFF}) overlaps node {ptrs.index(x >> 16)} "
                                f"(offset {x >> 16})")
            prev = x & 0xFFFF

    def order(self, pgno: int, tree: _Tree, kind: str, keys: list[bytes], lo: Any, hi: Any,
              first: int = 0) -> list[Any]:
        """Check keys ascend strictly within ``[lo, hi)``; return them in comparable form."""
        mode = tree.mode
        if not keys:
            return []
        if mode == _INTEGER:
            size = tree.isize or len(keys[0])
            if size not in (4, 8) or any(len(k) != size for k in keys):
                if tree.kind == "free":
                    raise self.fail(pgno, tree, kind, "free DB key is not an 8-byte txnid")
                tree.mode = _UNKNOWN  # mixed sizes: LMDB's order is not defined
                return [None] * len(keys)
            tree.isize = size
            cmp: list[Any] = [int.from_bytes(k, "little") for k in keys]
        elif mode == _MEMCMP:
            cmp = keys
        elif mode == _REVERSE:
            cmp = [k[::-1] for k in keys]
        else:
            return [None] * len(keys)
        if not all(map(lt, cmp, islice(cmp, 1, None))):
            i = next(i for i in range(len(cmp) - 1) if not cmp[i] < cmp[i + 1])
            raise self.fail(pgno, tree, kind, f"keys out of order: key {first + i + 1} "
                            f"{keys[i + 1][:40]!r} does not sort after key {first + i} "
                            f"{keys[i][:40]!r}")
        if lo is not None and cmp[0] < lo:
            raise self.fail(pgno, tree, kind, f"key {first} {keys[0][:40]!r} sorts before the "
                            "parent branch's separator for this page")
        if hi is not None and not cmp[-1] < hi:
            raise self.fail(pgno, tree, kind, f"key {first + len(keys) - 1} "
                            f"{keys[-1][:40]!r} does not sort before the parent branch's "
                            "next separator")
        return cmp

    def branch(self, buf: bytes, off: int, pgno: int, tree: _Tree, depth: int, lo: Any,
               hi: Any, lower: int, upper: int,
               nxt: list[tuple[int, _Tree, int, Any, Any]]) -> None:
        """A branch page: separators in order and in bounds, children claimed once."""
        ptrs = self.ptrs(buf, off, lower)
        # mdb_page_search_root asserts NUMKEYS > 1 outside the free DB (ITS#8336).
        if len(ptrs) < 2 and tree.kind != "free":
            raise self.fail(pgno, tree, "branch", f"branch page has {len(ptrs)} node, LMDB "
                            "needs 2")
        size, lim = self.ps, self.ps - _NODESIZE
        keys: list[bytes] = []
        ext: list[int] = []  # start << 16 | end of each node
        kids: list[int] = []
        o8 = off + _NODESIZE
        for q in ptrs:
            if q < upper or q > lim or q & 1:
                raise self.bad_node(buf, off, size, upper, pgno, tree, "branch", ptrs, q, 0)
            lo16, hi16, fl16, ks = _NODE_AT(buf, off + q)
            end = q + _NODESIZE + ks
            if ks > _MAXKEYSIZE or end > size:
                raise self.bad_node(buf, off, size, upper, pgno, tree, "branch", ptrs, q, end)
            keys.append(buf[o8 + q:o8 + q + ks])
            ext.append(q << 16 | end)
            kids.append(lo16 | hi16 << 16 | fl16 << 32)
        if not all(islice(keys, 1, None)):  # only node 0's key may be (and is) empty
            q = ptrs[next(i for i in range(1, len(keys)) if not keys[i])]
            raise self.bad_node(buf, off, size, upper, pgno, tree, "branch", ptrs, q, 0)
        self.overlap(pgno, tree, "branch", ext, ptrs)
        seps = self.order(pgno, tree, "branch", keys[1:], lo, hi, 1)
        if tree.mode == _UNKNOWN:
            los = his = [None] * (len(kids) + 1)
        else:
            los, his = [lo, *seps], [*seps, hi]
        depth += 1
        for i, child in enumerate(kids):
            self.claim(child, tree, "branch", pgno)
            nxt.append((child, tree, depth, los[i], his[i]))

    def leaf(self, buf: bytes, off: int, size: int, pgno: int, tree: _Tree, kind: str,
             lo: Any, hi: Any, lower: int, upper: int,
             nxt: list[tuple[int, _Tree, int, Any, Any]],
             ovf: list[tuple[int, _Tree, int, int]]) -> int:
        """A leaf page (or sub-page) with node headers; return how many nodes it holds."""
        ptrs = self.ptrs(buf, off, lower)
        keys: list[bytes] = []
        ext: list[int] = []
        lim, o8, nodata = size - _NODESIZE, off + _NODESIZE, tree.kind == "dup"
        for q in ptrs:
            if q < upper or q > lim or q & 1:
                raise self.bad_node(buf, off, size, upper, pgno, tree, kind, ptrs, q, 0)
            lo16, hi16, fl16, ks = _NODE_AT(buf, off + q)
            end = q + _NODESIZE + ks + (lo16 | hi16 << 16)
            if fl16 or not 0 < ks <= _MAXKEYSIZE or (nodata and (lo16 or hi16)):
                if not fl16 or nodata or not 0 < ks <= _MAXKEYSIZE:
                    raise self.bad_node(buf, off, size, upper, pgno, tree, kind, ptrs, q, end)
                end = q + _NODESIZE + ks + self.special(buf, off, pgno, tree, ptrs.index(q), q,
                                                        fl16, ks, lo16 | hi16 << 16, nxt, ovf)
            if end > size:
                raise self.bad_node(buf, off, size, upper, pgno, tree, kind, ptrs, q, end)
            keys.append(buf[o8 + q:o8 + q + ks])
            ext.append(q << 16 | end)
        self.overlap(pgno, tree, kind, ext, ptrs)
        self.order(pgno, tree, kind, keys, lo, hi)
        if self.probe is not None and tree.kind == "named" and kind == "leaf":
            self.belongs(buf, off, pgno, tree, ptrs, keys)
        if tree.kind == "free":
            for q, key in zip(ptrs, keys):
                lo16, hi16, fl16, ks = _NODE_AT(buf, off + q)
                ds, dstart = lo16 | hi16 << 16, o8 + q + ks
                data = _U64.unpack_from(buf, dstart)[0] if fl16 else buf[dstart:dstart + ds]
                tree.records.append((pgno, int.from_bytes(key, "little"), data, ds))
        return len(ptrs)

    def belongs(self, buf: bytes, off: int, pgno: int, tree: _Tree, ptrs: tuple[int, ...],
                keys: list[bytes]) -> None:
        """Ask the probe whether the leaf's records (inline values only) belong to ``tree``."""
        assert self.probe is not None

        def records() -> Iterator[tuple[bytes, bytes]]:  # lazily: a probe usually needs one
            for q, key in zip(ptrs, keys):
                lo16, hi16, fl16, ks = _NODE_AT(buf, off + q)
                if not fl16:
                    dstart = off + q + _NODESIZE + ks
                    yield key, buf[dstart:dstart + (lo16 | hi16 << 16)]

        why = self.probe(tree.name, pgno, records())
        if why:
            raise self.fail(pgno, tree, "leaf", why)

    def special(self, buf: bytes, off: int, pgno: int, tree: _Tree, i: int, ptr: int, fl: int,
                ks: int, ds: int, nxt: list[tuple[int, _Tree, int, Any, Any]],
                ovf: list[tuple[int, _Tree, int, int]]) -> int:
        """A leaf node with flags; return how many data bytes it holds inline."""
        dstart = off + ptr + _NODESIZE + ks
        dupsort = bool(tree.flags & _DUPSORT)
        if fl == _F_BIGDATA and not dupsort:
            if dstart + 8 <= off + self.ps:  # else the caller reports the node's end
                ovf.append((_U64.unpack_from(buf, dstart)[0], tree, ds, pgno))
            return 8
        if fl == _F_SUBDATA and tree.kind == "main" or fl & _F_DUPDATA and dupsort and not (
                fl & ~(_F_DUPDATA | _F_SUBDATA)):
            if fl & _F_SUBDATA and ds != _DB.size:
                raise self.fail(pgno, tree, "leaf", f"node {i} is a sub-database record of "
                                f"{ds} bytes, expected {_DB.size}")
            if dstart + ds > off + self.ps:
                return ds  # the caller reports the node's end
            if fl == _F_SUBDATA:
                self.named(buf[dstart - ks:dstart], _DB.unpack_from(buf, dstart), pgno, nxt)
            elif fl & _F_SUBDATA:
                self.dups(_DB.unpack_from(buf, dstart), pgno, tree, i, nxt)
            else:
                tree.n_entries += self.subpage(buf, dstart, ds, pgno, tree, i) - 1
            return ds
        raise self.fail(pgno, tree, "leaf", f"node {i} has flags {fl:#x}, which "
                        f"{'a dupsort' if dupsort else 'this'} database cannot hold"
                        + ("" if dupsort or not fl & _F_DUPDATA else " (F_DUPDATA outside a "
                           "dupsort database is unsupported)"))

    def named(self, raw: bytes, rec: tuple[int, ...], pgno: int,
              nxt: list[tuple[int, _Tree, int, Any, Any]]) -> None:
        """Register the named database ``raw`` recorded in main's leaf ``pgno``."""
        name = raw.decode("utf-8", "backslashreplace")
        if name in ("main", "free"):
            name = f"db:{name}"
        if rec[1] & ~_DB_FLAGS:
            raise self.fail(pgno, self.trees[1], "leaf", f"sub-database {name!r} has unknown "
                            f"flags {rec[1]:#x}")
        tree = self.new_tree(name, rec, "named", _key_mode(rec[1]), pgno)
        if tree.root != _P_INVALID:
            self.claim(tree.root, tree, "root", pgno)
            nxt.append((tree.root, tree, 1, None, None))

    def dups(self, rec: tuple[int, ...], pgno: int, tree: _Tree, i: int,
             nxt: list[tuple[int, _Tree, int, Any, Any]]) -> None:
        """Register the tree of duplicates recorded in node ``i`` of a dupsort leaf."""
        sub = self.new_tree(tree.name, rec, "dup", _dup_mode(tree.flags), pgno, tree)
        if sub.root == _P_INVALID or rec[1] & ~(_DUPFIXED | _INTEGERKEY) or (
                bool(rec[1] & _DUPFIXED) != bool(tree.flags & _DUPFIXED)):
            raise self.fail(pgno, tree, "leaf", f"node {i} duplicates record is empty or has "
                            f"flags {rec[1]:#x} (database flags {tree.flags:#x})")
        tree.n_entries += sub.entries - 1  # leaf() counts the node itself
        self.claim(sub.root, sub, "leaf", pgno)
        nxt.append((sub.root, sub, 1, None, None))

    def subpage(self, buf: bytes, start: int, size: int, pgno: int, tree: _Tree, i: int) -> int:
        """A ``P_SUBP`` page of duplicates inside node ``i``; return how many it holds."""
        fixed = bool(tree.flags & _DUPFIXED)
        dup = _Tree(tree.name, tree.tag, (0,) * 8, "dup", _dup_mode(tree.flags))
        kind = f"sub-page of node {i}"
        if size < _PAGEHDRSZ:
            raise self.fail(pgno, tree, "leaf", f"node {i} holds a {size}-byte sub-page")
        _p, pad, flags, lower, upper = _HDR.unpack_from(buf, start)
        want = _P_LEAF | _P_SUBP | (_P_LEAF2 if fixed else 0)
        if flags & ~_P_DIRTY != want:
            raise self.fail(pgno, tree, kind, f"flags {flags:#x}, expected {want:#x}")
        self.bounds(pgno, dup, kind, lower, upper, size)
        if fixed:
            return self.leaf2(buf, start, size, pgno, dup, lower, pad, None, None)
        return self.leaf(buf, start, size, pgno, dup, kind, None, None, lower, upper, [], [])

    def leaf2(self, buf: bytes, off: int, size: int, pgno: int, tree: _Tree, lower: int,
              ks: int, lo: Any, hi: Any) -> int:
        """A ``P_LEAF2`` page (fixed-size duplicates, no node headers); return its count."""
        n = (lower - _PAGEHDRSZ) >> 1
        if not 1 <= ks <= _MAXKEYSIZE or _PAGEHDRSZ + n * ks > size:
            raise self.fail(pgno, tree, "leaf", f"{n} fixed-size items of {ks} bytes do not "
                            f"fit in {size} bytes")
        base = off + _PAGEHDRSZ
        keys = [buf[base + j * ks:base + (j + 1) * ks] for j in range(n)]
        self.order(pgno, tree, "leaf", keys, lo, hi)
        return n

    def overflows(self, refs: list[tuple[int, _Tree, int, int]]) -> int:
        """Check the overflow runs queued by leaves; return how many pages they hold."""
        if not refs:
            return 0
        ps, last, owner = self.ps, self.last, self.owner
        refs.sort(key=lambda r: r[0])
        total = 0
        for ovpg, tree, ds, by in refs:  # range and uniqueness of the heads, before any read
            need = (_PAGEHDRSZ - 1 + ds) // ps + 1  # OVPAGES()
            if not 2 <= ovpg <= last - need + 1:
                raise self.fail(by, tree, "leaf", f"value of {ds} bytes points to overflow "
                                f"page {ovpg}, but {need} page(s) from there do not fit in "
                                f"[2, {last}]")
            self.in_file(ovpg, need, tree, "leaf", by)
            if owner[ovpg]:
                raise self.fail(ovpg, tree, "overflow", f"overflow page (from leaf {by}) is "
                                f"also used by {self.owner_name(owner[ovpg])}")
            owner[ovpg] = tree.tag
        for k, chunk, off in self.batches([r[0] for r in refs], _OVHDR.size):
            ovpg, tree, ds, by = refs[k]
            hpgno, _pad, flags, pages = _OVHDR.unpack_from(chunk, off)
            need = (_PAGEHDRSZ - 1 + ds) // ps + 1
            if hpgno != ovpg or flags != _P_OVERFLOW:
                raise self.fail(ovpg, tree, "overflow", f"header says page {hpgno} with flags "
                                f"{flags:#x}, expected an overflow page (from leaf {by})")
            if pages < need or ovpg + pages - 1 > last:
                raise self.fail(ovpg, tree, "overflow", f"run of {pages} page(s) cannot hold "
                                f"the {ds}-byte value of leaf {by} inside [2, {last}]")
            self.in_file(ovpg, pages, tree, "overflow", ovpg)
            if pages > 1:
                if owner.count(0, ovpg + 1, ovpg + pages) != pages - 1:
                    bad = next(p for p in range(ovpg + 1, ovpg + pages) if owner[p])
                    raise self.fail(bad, tree, "overflow", f"page belongs to the overflow run "
                                    f"at page {ovpg} but is also used by "
                                    f"{self.owner_name(owner[bad])}")
                owner[ovpg + 1:ovpg + pages] = bytes([tree.tag]) * (pages - 1)
            tree.n_overflow += pages
            total += pages
        return total

    # ------------------------------------------------------------ free list
    def free_list(self, tree: _Tree) -> None:
        """Every free-DB record is a well-formed IDL of unused pages in range."""
        owner, last, ps = self.owner, self.last, self.ps
        for pgno, txn, data, ds in tree.records:
            if not 1 <= txn <= self.txnid:
                raise self.fail(pgno, tree, "leaf", f"free list record for txnid {txn} is "
                                f"outside [1, {self.txnid}]")
            if isinstance(data, int):  # F_BIGDATA: the IDL lives in the overflow run
                data = self.pread(ds, data * ps + _PAGEHDRSZ, data, tree, "overflow")
            if len(data) < 8:
                raise self.fail(pgno, tree, "leaf", f"free list record for txnid {txn} is "
                                f"{len(data)} bytes, too short for an IDL")
            count = _U64.unpack_from(data)[0]
            if count > len(data) // 8 - 1:
                raise self.fail(pgno, tree, "leaf", f"free list record for txnid {txn} claims "
                                f"{count} pages but has room for {len(data) // 8 - 1}")
            ids = struct.unpack_from(f"<{count}Q", data, 8)
            if not ids:
                continue
            if not all(map(gt, ids, islice(ids, 1, None))) or ids[-1] < 2 or ids[0] > last:
                raise self.fail(pgno, tree, "leaf", f"free list record for txnid {txn} is not "
                                f"a strictly descending list of pages in [2, {last}]")
            if ids[0] >= len(owner):  # free pages past the end of the file (never written)
                k = next((k for k, p in enumerate(ids) if p < len(owner)), len(ids))
                if not self.past_eof.isdisjoint(ids[:k]):
                    bad = next(p for p in ids[:k] if p in self.past_eof)
                    raise self.fail(bad, tree, "free list", f"page is listed as free twice "
                                    f"(again by txnid {txn})")
                self.past_eof.update(ids[:k])
                ids = ids[k:]
            if any(map(owner.__getitem__, ids)):
                bad = next(p for p in ids if owner[p])
                raise self.fail(bad, tree, "free list", f"page is listed as free (txnid {txn}) "
                                f"but is used by {self.owner_name(owner[bad])}")
            deque(map(owner.__setitem__, ids, repeat(_FREE_TAG)), maxlen=0)

    # ------------------------------------------------------------ entry point
    def run(self, txnid: int | None, full: bool) -> CheckReport:
        """Check the file; see :func:`check_data_file`."""
        t0 = time.perf_counter()
        meta = self.choose_meta(txnid)
        self.check_meta(meta)
        free = self.new_tree("free", meta.free, "free", _INTEGER, meta.index)
        main = self.new_tree("main", meta.main, "main", _key_mode(meta.main[1]), meta.index)
        if not full:
            for tree in (free, main):
                if tree.root != _P_INVALID:
                    self.in_file(tree.root, 1, tree, "root", meta.index)
                    raw = self.pread(_HDR.size, tree.root * self.ps, tree.root, tree, "root")
                    hpgno, _pad, flags, lower, upper = _HDR.unpack_from(raw)
                    want = _P_LEAF if tree.depth == 1 else _P_BRANCH
                    if hpgno != tree.root or flags != want:
                        raise self.fail(tree.root, tree, "root", f"header says page {hpgno} "
                                        f"with flags {flags:#x}, expected page {tree.root} with "
                                        f"flags {want:#x}")
                    self.bounds(tree.root, tree, "root", lower, upper, self.ps)
            return CheckReport(meta.txnid, self.ps, self.last, 0,
                               {"free": free.entries, "main": main.entries},
                               time.perf_counter() - t0)
        # Pages in use must be in the file; free pages past EOF go in a set.
        self.owner = bytearray(min(self.last + 1, self.npages))
        walked = self.walk()
        self.free_list(free)
        for tree in self.trees:  # fold duplicate trees into the database they belong to
            if tree.outer is not None:
                self.counts(tree)
                tree.outer.n_branch += tree.n_branch
                tree.outer.n_leaf += tree.n_leaf
                tree.outer.n_overflow += tree.n_overflow
        entries = {}
        for tree in self.trees:
            if tree.outer is None:
                self.counts(tree)
                entries[tree.name] = tree.entries
        return CheckReport(meta.txnid, self.ps, self.last, walked, entries,
                           time.perf_counter() - t0)

    def counts(self, tree: _Tree) -> None:
        """The record's counts equal what the walk found."""
        got = (tree.n_branch, tree.n_leaf, tree.n_overflow, tree.n_entries)
        want = (tree.branch, tree.leaf, tree.overflow, tree.entries)
        if got != want:
            names = ("branch pages", "leaf pages", "overflow pages", "entries")
            diffs = ", ".join(f"{n} {w} recorded but {g} found"
                              for n, g, w in zip(names, got, want) if g != w)
            raise self.fail(tree.root if tree.root != _P_INVALID else None, tree, "root",
                            f"database counts are wrong: {diffs}")


def check_data_file(path: str, *, txnid: int | None = None, full: bool = True,
                    probe: Probe | None = None) -> CheckReport:
    """Verify the structure of one snapshot of the LMDB data file ``path``.

    The snapshot is the meta page whose ``mm_txnid`` is ``txnid`` (``LookupError``
    if neither has it: a writer moved on, retry), else the valid meta page with
    the higher txnid -- the one LMDB itself opens.  ``full=False`` runs only the
    cheap checks (meta pages, page size, main and free root pages inside the
    file with sane headers; ``entries`` then holds the recorded 'free' and
    'main' counts); since a healthy file may end before ``mm_last_pg``, only
    ``full=True`` -- which walks every tree -- catches every truncation that
    cuts a page in use.  Raises :class:`LmdbDamageError` on damage (an empty or
    missing file included) and ``OSError`` if the file cannot be read.  Work
    is bounded by the file's size, memory by its page count; nothing is
    mapped, locked or written.

    ``probe(database, pgno, records)``, in a full check, is called with an
    iterator over the ``(key, value)`` pairs of each leaf page of a named
    database (values held in overflow pages left out; decoded as consumed)
    and returns why the page cannot belong to that database, or None: a page
    of another database written in its place has a valid structure, so only
    the records themselves can tell.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise LmdbDamageError(f"{path}: the data file is missing") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise LmdbDamageError(f"{path}: the data file is not a regular file")
        if st.st_size == 0:
            raise LmdbDamageError(f"{path}: the data file is empty (LMDB would silently start a "
                             "new, empty database in it)")
        checker = _Checker(path, fd, st.st_size)
        checker.probe = probe
        return checker.run(txnid, full)
    finally:
        os.close(fd)
