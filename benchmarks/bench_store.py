"""Store benchmarks: checkpoint commit latency vs. the raw LMDB floor, and bytes per step.

Two ways to run it:

* ``pytest benchmarks/bench_store.py`` -- pytest-benchmark timings of one
  checkpoint commit for 4 KiB, 100 KiB and 1 MiB snapshots under each
  durability mode, next to a raw LMDB put+commit of the same bytes.
* ``python benchmarks/bench_store.py --report [--steps 5000]`` -- a table of
  p50/p99 latencies and ratios to the floor, plus bytes written per step for
  a growing transcript (+1 KiB per step) at 100, 1,000 and 5,000 steps next to
  the raw floor (committing just the new 1 KiB into a fresh LMDB key).
  Latencies are also shown against a second floor that MACs the payload
  (keyed BLAKE3, the store's chunk hash) before the same put+commit, as the
  store must, and against a third that also cuts the payload by content,
  stores each chunk it lacks and drops those its newest 3 commits no longer
  hold (``RawChunked``: on all-new payloads, the least any chunked,
  authenticated store does).
  A second table splits each commit: this process's CPU time and the bytes
  handed to write calls, next to the floor's, so the part of the latency
  that is the store's own work stands apart from waiting for the disk.
  ``--json FILE`` also writes the raw figures.

Workloads.  *small delta*: each commit changes 64 bytes at a random place
in a payload of word-like text (what consecutive agent snapshots look like).
*all new*: every commit is fresh incompressible bytes (the worst case: no
dedup, nothing to compress).  Bytes written are read from ``wchar`` in
``/proc/self/io``: LMDB writes every dirty page with pwrite, so this counts
exactly the pages a commit writes.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pickle
import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import blake3
import lmdb

from tcc.store import Completion, LmdbStore, open_store

SIZES = {"4KiB": 4 << 10, "100KiB": 100 << 10, "1MiB": 1 << 20}
MODES = ("sync", "group", "none")
_WORDS = ["".join(random.Random(i).choice("abcdefghijklmnopqrstuvwxyz") for _ in range(2 + i % 8))
          for i in range(3000)]


def text(n: int, seed: int = 0) -> bytes:
    """``n`` bytes of word-like text (compresses ~2x, like transcripts)."""
    rng = random.Random(seed)
    out = " ".join(rng.choice(_WORDS) for _ in range(n // 4 + 8)).encode()
    return out[:n]


def message(i: int) -> bytes:
    """The ~1 KiB transcript message of step ``i``."""
    return text(1024, seed=i)


def mutations(size: int, fresh: bool) -> Iterator[bytes]:
    """Endless payloads of ``size`` bytes: small random edits, or all-new bytes."""
    buf = bytearray(text(size))
    rng = random.Random(1)
    while True:
        if fresh:
            yield os.urandom(size)
        else:
            at = rng.randrange(max(1, size - 64))
            buf[at:at + 64] = os.urandom(32).hex().encode()
            yield bytes(buf)


class Raw:
    """The floor: a bare LMDB environment doing put+commit of the same bytes."""

    def __init__(self, path: str, sync: bool) -> None:
        self.env = lmdb.open(path, map_size=1 << 32, sync=sync, readahead=False)
        self.n = 0

    def commit(self, data: bytes, fresh_key: bool = False) -> None:
        with self.env.begin(write=True) as txn:
            self.n += 1
            txn.put(b"%012d" % self.n if fresh_key else b"snapshot", data)

    def close(self) -> None:
        self.env.close()


class RawAuth(Raw):
    """A second floor: the same put+commit, plus a keyed BLAKE3 of the bytes stored with them.

    The store must MAC everything it stores (``docs/store.md``); this floor
    pays that once over the payload, and nothing else (no chunking, no
    compression, no journal, no head records).  It shows how much of the
    store's cost over the raw floor is authentication that any store meeting
    the integrity requirement pays.
    """

    def __init__(self, path: str, sync: bool) -> None:
        super().__init__(path, sync)
        self.key = blake3.blake3(key=os.urandom(32))  # the chunk hash of format 4 stores

    def commit(self, data: bytes, fresh_key: bool = False) -> None:
        h = self.key.copy()
        h.update(data)
        tag = h.digest()
        with self.env.begin(write=True) as txn:
            self.n += 1
            txn.put(b"%012d" % self.n if fresh_key else b"snapshot", tag + data)


class RawChunked(Raw):
    """A third reference: the least a store meeting the O(delta), MAC and retention needs does.

    It cuts the payload with the same FastCDC parameters as the store, hashes
    every chunk with keyed BLAKE3 (its address and MAC), puts the chunks it
    does not hold yet under ascending ids (MDB_APPEND, as the store does) and
    a manifest of the addresses, deletes the chunks that no longer belong to
    any of the newest ``KEEP`` commits (the store's default retention; without
    it the file grows by every all-new payload and each commit pays for the
    growth), and commits, all in one transaction.  It does not compress, seal
    records, keep reference counts on disk, journal or fence, and it re-cuts
    every payload from scratch (the store re-uses the previous payload's cuts
    where the bytes compare equal, so on small-delta payloads the store can
    be *faster* than this).  On all-new payloads, where nothing can be
    re-used, it is a lower bound of a chunked, authenticated commit: the part
    of the store's cost above it is the store's own bookkeeping, the part
    below it is what the requirements cost.
    """

    KEEP = 3

    def __init__(self, path: str, sync: bool) -> None:
        super().__init__(path, sync)
        from pyfastcdc import FastCDC

        from tcc.store._chunks import AVG_CHUNK

        self.key = blake3.blake3(key=os.urandom(32))
        self.cdc = FastCDC(avg_size=AVG_CHUNK)
        self.ids: dict[bytes, bytes] = {}  # address -> key of every chunk stored
        self.window: list[set[bytes]] = []  # the addresses of each kept commit
        self.next_id = 1

    def commit(self, data: bytes, fresh_key: bool = False) -> None:
        view = memoryview(data)
        addrs, new = [], []
        ids, key = self.ids, self.key
        for ch in self.cdc.cut_buf(view):
            piece = view[ch.offset:ch.offset + ch.length]
            h = key.copy()
            h.update(piece)
            a = h.digest()
            addrs.append(a)
            if a not in ids:
                ids[a] = k = b"%016d" % self.next_id
                self.next_id += 1
                new.append((k, piece))
        self.window.append(set(addrs))
        drop: set[bytes] = set()
        if len(self.window) > self.KEEP:
            drop = self.window.pop(0).difference(*self.window)
        with self.env.begin(write=True) as txn:
            # the manifest's key sorts below every chunk key, so that the chunks can be
            # appended (MDB_APPEND skips, without a word, a key that sorts below the last)
            txn.put(b"\x00manifest", b"".join(addrs))
            _, added = txn.cursor().putmulti(new, append=True)
            if added != len(new):
                raise RuntimeError(f"RawChunked: {len(new) - added} chunk puts were skipped")
            for a in drop:
                txn.delete(ids.pop(a))


def _store(path: str, mode: str) -> tuple[LmdbStore, str]:
    s = open_store(path, durability=mode)
    return s, s.create_run("bench").run_id


# ------------------------------------------------------------ pytest-benchmark
try:
    import pytest
except ImportError:  # script mode does not need pytest
    pytest = None  # type: ignore[assignment]

if pytest is not None:

    @pytest.mark.parametrize("size", list(SIZES))
    @pytest.mark.parametrize("mode", MODES)
    def test_checkpoint_commit(benchmark: Any, tmp_path: Any, mode: str, size: str) -> None:
        """Latency of one checkpoint (small-delta payload) under one durability mode."""
        s, rid = _store(str(tmp_path / "s"), mode)
        gen = mutations(SIZES[size], fresh=False)
        benchmark.group = f"commit {size}"
        benchmark.pedantic(lambda: s.checkpoint(rid, 1, next(gen)), rounds=100, warmup_rounds=5)
        s.close()

    @pytest.mark.parametrize("size", list(SIZES))
    @pytest.mark.parametrize("sync", [True, False], ids=["raw-sync", "raw-nosync"])
    def test_raw_lmdb_floor(benchmark: Any, tmp_path: Any, sync: bool, size: str) -> None:
        """Latency of a bare LMDB put+commit of the same bytes (the floor)."""
        raw = Raw(str(tmp_path / "raw"), sync)
        gen = mutations(SIZES[size], fresh=False)
        benchmark.group = f"commit {size}"
        benchmark.pedantic(lambda: raw.commit(next(gen)), rounds=100, warmup_rounds=5)
        raw.close()


# ------------------------------------------------------------------ report mode
def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def latency_table(rounds: int, others: dict[str, Any] | None = None,
                  modes: tuple[str, ...] = MODES) -> list[dict[str, Any]]:
    """p50/p99 commit latency per size, mode and workload, with the raw floor.

    Fair to the floor: every payload is generated before timing starts (not
    inside the timed call), the raw floor and the store commit the very same
    payloads, and their commits are interleaved round by round, in a new
    random order each round, so that all see the same machine (the dev VM is
    shared) and none always follows the same neighbour.  Both do exactly one write
    transaction per commit with LMDB's default sync (one ``fdatasync`` of the
    data plus the ``O_DSYNC`` meta page write; checked with ``strace``).
    ``others`` maps a label to another ``open_store`` (say, an older version
    of the store) to time side by side in the same rounds.
    """
    rows = []
    stores = {"store": open_store, **(others or {})}
    for size_name, size in SIZES.items():
        for fresh in (False, True):
            n = rounds if size < (1 << 20) else max(30, rounds // 4)
            gen = mutations(size, fresh)
            payloads = [next(gen) for _ in range(n + 5)]
            with tempfile.TemporaryDirectory() as d:
                raws: dict[Any, Raw] = {
                    sync: Raw(os.path.join(d, f"raw{sync}"), sync) for sync in (True, False)}
                raws.update({("auth", sync): RawAuth(os.path.join(d, f"auth{sync}"), sync)
                             for sync in (True, False)})
                raws.update({("cut", sync): RawChunked(os.path.join(d, f"cut{sync}"), sync)
                             for sync in (True, False)})
                subjects = {}
                for label, opener in stores.items():
                    for mode in modes:
                        st = opener(os.path.join(d, f"{label}-{mode}"), durability=mode)
                        subjects[label, mode] = (st, st.create_run("bench").run_id)
                lat: dict[Any, list[float]] = {k: [] for k in [*raws, *subjects]}
                cpu: dict[Any, list[float]] = {k: [] for k in lat}
                wrote: dict[Any, list[int]] = {k: [] for k in lat}
                clock, proc = time.perf_counter, time.process_time
                commits: list[tuple[Any, Callable[[bytes], Any]]] = [
                    *((k, raw.commit) for k, raw in raws.items()),
                    *((k, functools.partial(st.checkpoint, rid, 1))
                      for k, (st, rid) in subjects.items())]
                order = random.Random(size + fresh)
                for p in payloads:
                    # A new order every round: on ext4 (data=ordered) a sync commit also
                    # flushes what the no-sync subjects just wrote, so a fixed order
                    # charged whoever came after them (the first subject after the
                    # floors measured ~10% slower than an identical copy of itself).
                    order.shuffle(commits)
                    for k, commit in commits:
                        w, c, t = _wchar(), proc(), clock()
                        commit(p)
                        lat[k].append(clock() - t)
                        cpu[k].append(proc() - c)
                        wrote[k].append(_wchar() - w)
                for raw in raws.values():
                    raw.close()
                for st, _ in subjects.values():
                    st.close()
            lat = {k: v[5:] for k, v in lat.items()}  # warm-up rounds
            cpu = {k: v[5:] for k, v in cpu.items()}
            wrote = {k: v[5:] for k, v in wrote.items()}
            for (label, mode) in subjects:
                xs, floor = lat[label, mode], lat[mode != "none"]
                fk = mode != "none"
                auth = lat["auth", mode != "none"]
                cut = lat["cut", mode != "none"]
                rows.append({
                    "size": size_name, "workload": "all new" if fresh else "small delta",
                    "mode": mode, "store": label,
                    "p50_ms": _pct(xs, .5) * 1e3, "p99_ms": _pct(xs, .99) * 1e3,
                    "floor": "raw sync" if mode != "none" else "raw nosync",
                    "floor_p50_ms": _pct(floor, .5) * 1e3, "floor_p99_ms": _pct(floor, .99) * 1e3,
                    "ratio_p50": _pct(xs, .5) / _pct(floor, .5),
                    "ratio_p99": _pct(xs, .99) / _pct(floor, .99),
                    "auth_floor_p50_ms": _pct(auth, .5) * 1e3,
                    "ratio_auth_p50": _pct(xs, .5) / _pct(auth, .5),
                    "cut_floor_p50_ms": _pct(cut, .5) * 1e3,
                    "ratio_cut_p50": _pct(xs, .5) / _pct(cut, .5),
                    # where the time goes: CPU of this process (user + system) and the bytes
                    # handed to write calls, per commit (the rest of the latency is waiting
                    # for the disk)
                    "cpu_p50_ms": _pct(cpu[label, mode], .5) * 1e3,
                    "floor_cpu_p50_ms": _pct(cpu[fk], .5) * 1e3,
                    "written_kib": sum(wrote[label, mode]) / len(wrote[label, mode]) / 1024,
                    "floor_written_kib": sum(wrote[fk]) / len(wrote[fk]) / 1024,
                })
    return rows


def group_throughput(threads: int = 4, per_thread: int = 50) -> dict[str, float]:
    """Commits per second with ``threads`` concurrent committers, sync vs group (4 KiB).

    Each commit is a checkpoint alone, with no journal record (until 2026-12 each also
    journaled a completion of no intent, which the store now refuses): figures from
    before are not comparable.
    """
    out = {}
    for mode in ("sync", "group"):
        with tempfile.TemporaryDirectory() as d:
            s = open_store(os.path.join(d, "s"), durability=mode)
            rids = [s.create_run("b").run_id for _ in range(threads)]

            def work(rid: str) -> None:
                gen = mutations(4096, False)
                for _ in range(per_thread):
                    s.checkpoint(rid, 1, next(gen))

            ts = [threading.Thread(target=work, args=(r,)) for r in rids]
            t0 = time.perf_counter()
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            out[mode] = threads * per_thread / (time.perf_counter() - t0)
            s.close()
    return out


def _wchar() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("wchar"):
                return int(line.split()[1])
    return 0


def bytes_per_step(steps: int, marks: tuple[int, ...], window: int = 80,
                   opener: Callable[..., Any] = open_store) -> list[dict[str, Any]]:
    """Bytes written per checkpoint of a growing transcript vs. the raw 1 KiB-delta floor.

    Means over the ``window`` steps up to each mark: chunk releases are applied
    in batches (one commit in ~20 writes more), so a window must span several.
    """
    acc: dict[int, list[float]] = {m: [0.0, 0.0, 0.0] for m in marks if m <= steps}
    with tempfile.TemporaryDirectory() as d:
        s = opener(os.path.join(d, "s"), durability="none")
        rid = s.create_run("transcript").run_id
        raw = Raw(os.path.join(d, "raw"), sync=False)
        msgs: list[bytes] = []
        for i in range(1, steps + 1):
            msgs.append(message(i))
            state = pickle.dumps({"step": i, "messages": msgs}, protocol=5)
            seq = s.append_intent(rid, 1, "llm")
            a = _wchar()
            t = time.perf_counter()
            s.checkpoint(rid, 1, state, completion=Completion(seq, result=msgs[-1]))
            dt = time.perf_counter() - t
            b = _wchar()
            raw.commit(msgs[-1], fresh_key=True)
            c = _wchar()
            for m, v in acc.items():
                if m - window < i <= m:
                    v[0] += (b - a) / window
                    v[1] += (c - b) / window
                    v[2] += dt / window
        size = os.path.getsize(os.path.join(d, "s", "data.mdb"))
        raw.close()
        s.close()
    return [{"step": m, "state_bytes": m * 1024, "store_bytes_per_step": v[0],
             "raw_floor_bytes_per_step": v[1], "ratio_to_floor": v[0] / v[1],
             "ratio_to_step_100": v[0] / acc[min(acc)][0], "commit_ms": v[2] * 1e3,
             "store_file_bytes": size} for m, v in acc.items()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--report", action="store_true", help="print the tables")
    p.add_argument("--steps", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--json", help="also write raw figures to this file")
    p.add_argument("--modes", default=",".join(MODES), help="durability modes to time (a,b)")
    p.add_argument("--compare-with", metavar="PKG",
                   help="also time an importable copy of tcc (e.g. an older checkout copied "
                        "as package PKG) side by side, in the same rounds")
    p.add_argument("--no-throughput", action="store_true", help="skip the group-commit test")
    args = p.parse_args(argv)
    if not args.report:
        p.print_help()
        return 2
    modes = tuple(m for m in args.modes.split(",") if m)
    others: dict[str, Any] = {}
    if args.compare_with:
        import importlib

        others["other"] = importlib.import_module(f"{args.compare_with}.store").open_store
    lat = latency_table(args.rounds, others, modes)
    print(f"{'size':>7} {'workload':>11} {'mode':>6} {'store':>6} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'floor':>10} {'fl p50':>8} {'fl p99':>8} {'x p50':>6} {'x p99':>6} "
          f"{'auth p50':>8} {'x auth':>6} {'cut p50':>8} {'x cut':>6}")
    for r in lat:
        print(f"{r['size']:>7} {r['workload']:>11} {r['mode']:>6} {r['store']:>6} "
              f"{r['p50_ms']:8.3f} {r['p99_ms']:8.3f} {r['floor']:>10} {r['floor_p50_ms']:8.3f} "
              f"{r['floor_p99_ms']:8.3f} {r['ratio_p50']:6.2f} {r['ratio_p99']:6.2f} "
              f"{r['auth_floor_p50_ms']:8.3f} {r['ratio_auth_p50']:6.2f} "
              f"{r['cut_floor_p50_ms']:8.3f} {r['ratio_cut_p50']:6.2f}")
    print("(x: vs the raw floor; x auth: vs the raw floor plus a keyed BLAKE3 of the payload;\n"
          " x cut: vs cutting by content, a keyed BLAKE3 per chunk, a put of each new chunk and\n"
          " a delete of those the newest 3 commits no longer hold -- on all-new rows the least\n"
          " a chunked, authenticated store does)")
    print(f"\n{'size':>7} {'workload':>11} {'mode':>6} {'store':>6} {'cpu p50':>8} "
          f"{'fl cpu':>8} {'KiB/commit':>10} {'fl KiB':>8}")
    for r in lat:
        print(f"{r['size']:>7} {r['workload']:>11} {r['mode']:>6} {r['store']:>6} "
              f"{r['cpu_p50_ms']:8.3f} {r['floor_cpu_p50_ms']:8.3f} {r['written_kib']:10.1f} "
              f"{r['floor_written_kib']:8.1f}")
    print("(cpu: this process's CPU time per commit, ms; KiB/commit: bytes handed to write "
          "calls, mostly LMDB's dirty pages; the rest of the latency is waiting for the disk)")
    thr: dict[str, float] = {}
    if not args.no_throughput:
        thr = group_throughput()
        print(f"\n4 threads x 4 KiB commits: sync {thr['sync']:.0f}/s, group {thr['group']:.0f}/s "
              f"({thr['group'] / thr['sync']:.2f}x)")
    bps = bytes_per_step(args.steps, (100, 1000, 5000))
    runs = [("store", bps)]
    if args.compare_with:
        runs.append(("other", bytes_per_step(args.steps, (100, 1000, 5000), opener=others["other"])))
    print(f"\n{'step':>6} {'store':>6} {'store B/step':>13} {'raw floor':>10} {'x floor':>8} "
          f"{'x step100':>10} {'commit ms':>10}")
    for label, rs in runs:
        for r in rs:
            print(f"{r['step']:>6} {label:>6} {r['store_bytes_per_step']:13.0f} "
                  f"{r['raw_floor_bytes_per_step']:10.0f} {r['ratio_to_floor']:8.2f} "
                  f"{r['ratio_to_step_100']:10.2f} {r['commit_ms']:10.2f}")
    print(f"store file after {args.steps} steps: {bps[-1]['store_file_bytes'] / 2**20:.1f} MiB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"latency": lat, "group_throughput": thr, "bytes_per_step": bps,
                       "python": sys.version.split()[0]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
