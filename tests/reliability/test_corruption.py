"""Corruption of the LMDB data file: every outcome is a correct completion or a clear tcc error.

A store holding four runs (completed, SIGKILLed mid-run, parked at an approval
that was answered, and a fork of the latter) is built once.  Each *mutant* is a
copy of it with a damaged ``data.mdb``; one child process per mutant
(``corruption_child.py``) runs `tcc ls`, `tcc show` of every run and
`tcc resume` of every run through the CLI's entry point.  Per command the
outcome is

* ``ok``: the same as on the undamaged store (same exit code; same runs, status,
  result, effects, snapshots and events; for a resume the same status and result),
* ``refused``: exit code 1 or 2 with exactly one `tcc: error:` line, no traceback,
* ``other``: anything else -- a different result or state, a traceback, an
  internal error, a timeout, or the child killed by a signal.

A mutant counts as its worst command.  Sizes: ``TCC_RELIABILITY_CI_MUTANTS``
(default 60) per CI campaign, ``TCC_RELIABILITY_MUTANTS`` (default 2000) per slow
campaign (``-m slow``); ``TCC_RELIABILITY_ENCRYPTED_MUTANTS`` (default 12) per CI
campaign on an encrypted copy of the store; ``TCC_RELIABILITY_SEED`` fixes the mutants,
``TCC_RELIABILITY_JOBS`` (default 2) runs children in parallel.  Each campaign
prints ``corruption: mutants=N ok=.. refused=.. other=..`` (visible with -s).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import json
import os
import pathlib
import random
import shutil
import signal
import struct
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import lmdb
import pytest
from tests._support.reliability import (KEY_VARS, STORE_DBS, WAIT, is_clear_error, is_encrypted_store,
                                        write_key_file)
from tests._support.runs import Cli


CHILD = pathlib.Path(__file__).resolve().parent / "corruption_child.py"
CI_MUTANTS = int(os.environ.get("TCC_RELIABILITY_CI_MUTANTS", "60"))
SLOW_MUTANTS = int(os.environ.get("TCC_RELIABILITY_MUTANTS", "2000"))
# the campaigns on an encrypted copy of the store (a key in TCC_STORE_KEY_FILE)
ENCRYPTED_MUTANTS = int(os.environ.get("TCC_RELIABILITY_ENCRYPTED_MUTANTS", "12"))
SEED = int(os.environ.get("TCC_RELIABILITY_SEED", "20261130"))
JOBS = int(os.environ.get("TCC_RELIABILITY_JOBS", "2"))
CHILD_TIMEOUT = 60.0
PAGE = 4096  # LMDB's page size: the OS page size on Linux x86-64 and arm64 (asserted below)
RUNS = ("done", "crashed", "parked", "forked")
COMMANDS = [["ls", "--json"]] + [["show", "--json", r] for r in RUNS] + [["resume", "--json", r] for r in RUNS]
FILE_KINDS = ("bitflip", "truncate", "splice", "page")  # "stale" has its own campaign


# ------------------------------------------------------------------ the store


@dataclasses.dataclass
class Pristine:
    store: pathlib.Path  # data.mdb + secret of the undamaged store
    data: bytes  # its data.mdb
    later: bytes  # data.mdb after the baseline commands ran on a copy (donor of `page` mutants)
    baseline: list[dict[str, Any]]  # what the commands give on the undamaged store
    env: dict[str, str]


def build_store(tmp: pathlib.Path, **env: str) -> pathlib.Path:
    """Four runs: completed, SIGKILLed inside its 4th effect, parked + approved, and a fork of that one.

    ``env``: more environment for every command (a store key: an encrypted store)."""
    cli = Cli(tmp, **env)
    cli.run("run", "--run-id", "done", f"{WAIT}:slow_steps", "5", check=True)
    died = Cli(tmp, DIE_AT="step 3", **env).run("run", "--run-id", "crashed", f"{WAIT}:slow_steps", "6")
    assert died.returncode == -signal.SIGKILL
    cli.run("run", "--run-id", "parked", f"{WAIT}:gated", check=True)
    cli.run("approve", "parked", check=True)
    cli.run("fork", "parked", "--run-id", "forked", check=True)
    cli.run("approve", "forked", check=True)
    return cli.store


def child_env(**extra: str) -> dict[str, str]:
    """The children's environment: no TCC_* settings but a store key (if any), plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TCC_", "DIE_AT", "LEDGER")) or k in KEY_VARS}
    env["PYTHONFAULTHANDLER"] = "1"
    env.update(extra)
    return env


@dataclasses.dataclass
class ChildRun:
    code: int | str  # exit code, negative for a signal, or "timeout"
    results: list[dict[str, Any]]
    tail: str  # last lines of the child's own stderr (faulthandler output)


def run_child(store_src: pathlib.Path, data: bytes, work: pathlib.Path, env: dict[str, str]) -> ChildRun:
    """Copy the store with ``data`` as its data.mdb into ``work`` and run COMMANDS on it in a child."""
    shutil.rmtree(work, ignore_errors=True)
    store = work / "store"
    store.mkdir(parents=True, mode=0o700)
    (store / "data.mdb").write_bytes(data)
    os.chmod(store / "data.mdb", 0o600)  # as tcc creates it: no permission warning in the way
    for name in ("secret", "initialised"):  # the store's other files, as they are
        if (store_src / name).exists():
            shutil.copy2(store_src / name, store / name)
    out, cmds = work / "out.json", work / "commands.json"
    cmds.write_text(json.dumps(COMMANDS))
    try:
        proc = subprocess.run([sys.executable, str(CHILD), str(store), str(out), str(cmds)],
                              env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT)
        code: int | str = proc.returncode
        tail = "\n".join(proc.stderr.strip().splitlines()[-12:])
    except subprocess.TimeoutExpired:
        code, tail = "timeout", ""
    results = json.loads(out.read_text()) if out.exists() else []
    return ChildRun(code, results, tail)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Pristine:
    return make_pristine(tmp_path_factory.mktemp("corruption"))


@pytest.fixture(scope="module")
def pristine_encrypted(tmp_path_factory: pytest.TempPathFactory) -> Pristine:
    """The same four runs in an encrypted store (its key in TCC_STORE_KEY_FILE, for the
    children too)."""
    tmp = tmp_path_factory.mktemp("corruption-encrypted")
    key = {"TCC_STORE_KEY_FILE": str(write_key_file(tmp)), "TCC_STORE_KEY": ""}
    found = make_pristine(tmp, key)
    assert is_encrypted_store(found.store)
    return found


def make_pristine(tmp: pathlib.Path, key: dict[str, str] | None = None) -> Pristine:
    store = build_store(tmp / "build", **(key or {}))
    data = (store / "data.mdb").read_bytes()
    assert len(data) % PAGE == 0 and data[16:20] == struct.pack("<I", 0xBEEFC0DE)  # LMDB meta, 4 KiB pages
    env = child_env(**(key or {}))
    base = run_child(store, data, tmp / "baseline", env)
    assert base.code == 0 and len(base.results) == len(COMMANDS), base.tail
    by = {tuple(r["argv"]): r for r in base.results}
    assert [(r["id"], r["status"]) for r in json.loads(by[("ls", "--json")]["stdout"])] == [
        ("crashed", "running"), ("done", "completed"), ("forked", "running"), ("parked", "waiting")]
    results = {r: json.loads(by[("resume", "--json", r)]["stdout"] or "null") for r in RUNS}
    assert results["done"] is None and "already completed" in by[("resume", "--json", "done")]["stderr"]
    assert results["crashed"]["result"] == [f"did step {i}" for i in range(6)]
    assert results["parked"]["result"] == results["forked"]["result"] == ["did prepare", True, "did deploy"]
    later = (tmp / "baseline" / "store" / "data.mdb").read_bytes()
    return Pristine(store, data, later, base.results, env)


# ------------------------------------------------------------------ outcomes


def meaning(argv: list[str], stdout: str) -> dict[str, Any]:
    """What a successful command said, without timestamps, pids and other incidental detail."""
    doc = json.loads(stdout.strip().splitlines()[-1])
    if argv[0] == "ls":
        return {"runs": sorted((r["id"], r["status"], r["epoch"]) for r in doc)}
    if argv[0] == "show":
        return {"status": doc["status"], "result": doc["result"], "error": doc["error"],
                "effects": doc["effects"], "snapshots": doc["snapshots"],
                "waits": [(w["id"], w["signal"]) for w in doc["waits"]],
                "events": [e["kind"] for e in doc["events"]]}
    return {"status": doc["status"], "result": doc["result"], "error": doc["error"]}


def reports_damage(want: dict[str, Any], have: dict[str, Any]) -> bool:
    """``tcc show`` said the same, except that snapshots it could not verify are marked damaged
    (a record moved in under another number of the run is listed, marked, as well)."""
    if "snapshots" not in want or {k: v for k, v in have.items() if k != "snapshots"} != {
            k: v for k, v in want.items() if k != "snapshots"}:
        return False
    before = {s["number"]: s for s in want["snapshots"]}
    after = {s["number"]: s for s in have["snapshots"]}
    # every snapshot is still listed (intact or marked), and any other number is marked damaged
    return (any(s.get("damaged") for s in after.values()) and set(before) <= set(after)
            and all(s == before.get(n) or s == {"number": n, "damaged": True} for n, s in after.items()))


def judge(base: dict[str, Any], got: dict[str, Any] | None) -> tuple[str, str]:
    """(outcome, why) of one command against the undamaged store's run of it."""
    if got is None:
        return "other", "no result (the child died before this command)"
    if got["escaped"]:
        return "other", "traceback: " + got["escaped"].strip().splitlines()[-1]
    diff = ""
    if got["rc"] == base["rc"]:
        if base["rc"] == 0:
            want = meaning(base["argv"], base["stdout"])
            try:
                have = meaning(got["argv"], got["stdout"])
            except (ValueError, KeyError, IndexError, TypeError):
                return "other", f"unreadable output {got['stdout'][-200:]!r}"
            if have == want:
                return "ok", ""
            if reports_damage(want, have):
                return "refused", "the damaged snapshot is listed as damaged"
            diff = "; ".join(f"{k}: {str(want[k])[:90]} -> {str(have[k])[:90]}" for k in want if have[k] != want[k])
        elif got["stderr"] == base["stderr"]:
            return "ok", ""
    proc = subprocess.CompletedProcess(got["argv"], got["rc"] if got["rc"] is not None else -1,
                                       got["stdout"], got["stderr"])
    if is_clear_error(proc):
        return "refused", ""
    if got["rc"] == 0:
        return "other", f"succeeded differently: {diff or got['stdout'].strip()[-200:]}"
    return "other", f"exit {got['rc']}: {got['stderr'].strip()[-300:]}"


@dataclasses.dataclass
class Tally:
    scope: str
    seed: int
    mutants: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    commands: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    by_kind: dict[str, collections.Counter] = dataclasses.field(default_factory=dict)
    signals: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    timeouts: int = 0
    examples: list[str] = dataclasses.field(default_factory=list)

    def add(self, index: int, kind: str, what: str, run: ChildRun, baseline: list[dict[str, Any]]) -> None:
        worst = "ok"
        rank = {"ok": 0, "refused": 1, "other": 2}
        for i, base in enumerate(baseline):
            got = run.results[i] if i < len(run.results) else None
            if got is None and run.code == 0:
                got = {"argv": base["argv"], "rc": None, "stdout": "", "stderr": "", "escaped": "missing"}
            outcome, why = judge(base, got)
            self.commands[outcome] += 1
            if rank[outcome] > rank[worst]:
                worst = outcome
            if outcome == "other" and got is not None and len(self.examples) < 12:
                self.examples.append(f"#{index} {kind} ({what}) `tcc {' '.join(base['argv'])}`: {why}")
        if run.code == "timeout":
            self.timeouts += 1
            worst = "other"
            self.examples.append(f"#{index} {kind} ({what}): timed out")
        elif isinstance(run.code, int) and run.code < 0:
            name = signal.Signals(-run.code).name
            self.signals[name] += 1
            worst = "other"
            if sum(self.signals.values()) <= 6:
                where = [ln for ln in run.tail.splitlines() if "Assertion" in ln or "File " in ln][:2]
                self.examples.append(f"#{index} {kind} ({what}): child killed by {name} {where}")
        self.mutants[worst] += 1
        self.by_kind.setdefault(kind, collections.Counter())[worst] += 1

    def report(self) -> str:
        n = sum(self.mutants.values())
        kinds = " ".join(f"{k}={c['ok']}/{c['refused']}/{c['other']}" for k, c in sorted(self.by_kind.items()))
        sigs = ",".join(f"{k}:{v}" for k, v in sorted(self.signals.items())) or "none"
        line = (f"corruption: mutants={n} ok={self.mutants['ok']} refused={self.mutants['refused']} "
                f"other={self.mutants['other']} scope={self.scope} signals={sigs} timeouts={self.timeouts} "
                f"commands={sum(self.commands.values())} (ok={self.commands['ok']} "
                f"refused={self.commands['refused']} other={self.commands['other']}) "
                f"by_kind(ok/refused/other)=[{kinds}] seed={self.seed}")
        return line


def campaign(pristine: Pristine, mutants: Iterator[tuple[str, str, bytes]], work: pathlib.Path, scope: str,
             seed: int) -> Tally:
    """Run every (kind, description, data.mdb bytes) mutant in its own child; tally and print.

    Mutants are made lazily and at most 2 * JOBS are in flight, so a large
    campaign does not hold every damaged file in memory.
    """
    tally = Tally(scope, seed)
    inflight: collections.deque[tuple[int, str, str, concurrent.futures.Future[ChildRun]]] = collections.deque()

    def settle() -> None:
        i, kind, what, future = inflight.popleft()
        tally.add(i, kind, what, future.result(), pristine.baseline)
        shutil.rmtree(work / f"m{i}", ignore_errors=True)

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, JOBS)) as pool:
        for i, (kind, what, data) in enumerate(mutants):
            inflight.append((i, kind, what, pool.submit(run_child, pristine.store, data, work / f"m{i}",
                                                        pristine.env)))
            if len(inflight) >= 2 * max(1, JOBS):
                settle()
        while inflight:
            settle()
    print("\n" + tally.report())
    for example in tally.examples:
        print("  other:", example)
    return tally


# ------------------------------------------------------------------ mutants of data.mdb


def file_mutants(pristine: Pristine, n: int, seed: int,
                 kinds: tuple[str, ...] = FILE_KINDS) -> Iterator[tuple[str, str, bytes]]:
    """``n`` damaged copies of data.mdb, the kinds taken in turn: bit flips, truncation, splices,
    two pages swapped, or (``stale``) one page replaced by that page of a later state of the store."""
    rng = random.Random(seed)
    data = pristine.data
    pages = [p for p in range(len(data) // PAGE) if any(data[p * PAGE:(p + 1) * PAGE])]
    for i in range(n):
        kind = kinds[i % len(kinds)]
        d = bytearray(data)
        if kind == "bitflip":
            flips = rng.choice((1, 1, 2, 3, 8))
            spots = []
            for _ in range(flips):
                off = rng.choice(pages) * PAGE + rng.randrange(PAGE)
                d[off] ^= 1 << rng.randrange(8)
                spots.append(off)
            what = f"{flips} bit(s) at {spots[:3]}"
        elif kind == "truncate":
            cut = rng.randrange(len(data))
            d = d[:cut]
            what = f"cut at {cut} of {len(data)}"
        elif kind == "splice":
            n_bytes = rng.choice((8, 64, 512, 4096))
            src = rng.randrange(len(data) - n_bytes)
            dst = rng.choice(pages) * PAGE + rng.randrange(PAGE)
            seg = data[src:src + n_bytes]
            d[dst:dst + n_bytes] = seg
            d = d[:len(data)]
            what = f"{n_bytes} bytes from {src} to {dst}"
        else:
            a = rng.choice(pages)
            if kind == "stale" and len(pristine.later) >= (a + 1) * PAGE:
                d[a * PAGE:(a + 1) * PAGE] = pristine.later[a * PAGE:(a + 1) * PAGE]
                what = f"page {a} from a later state of the same store"
            else:
                b = rng.choice([p for p in pages if p != a])
                d[a * PAGE:(a + 1) * PAGE], d[b * PAGE:(b + 1) * PAGE] = (
                    data[b * PAGE:(b + 1) * PAGE], data[a * PAGE:(a + 1) * PAGE])
                what = f"pages {a} and {b} swapped"
        yield kind, what, bytes(d)


def check_file_campaign(tally: Tally) -> None:
    assert not tally.signals and not tally.timeouts and tally.mutants["other"] == 0, (
        tally.report() + "\n" + "\n".join(tally.examples))


@pytest.mark.timeout(900)
def test_data_file_mutants(pristine: Pristine, tmp_path: pathlib.Path) -> None:
    """Bit flips, truncations, splices and page swaps of data.mdb give a correct completion or a clear error, never a crash."""
    tally = campaign(pristine, file_mutants(pristine, CI_MUTANTS, SEED), tmp_path, "data.mdb", SEED)
    check_file_campaign(tally)


@pytest.mark.slow
@pytest.mark.timeout(0)
def test_data_file_mutants_large(pristine: Pristine, tmp_path: pathlib.Path) -> None:
    """The slow tier: TCC_RELIABILITY_MUTANTS (default 2000) damaged data.mdb files, same guarantee."""
    tally = campaign(pristine, file_mutants(pristine, SLOW_MUTANTS, SEED + 1), tmp_path, "data.mdb", SEED + 1)
    check_file_campaign(tally)


@pytest.mark.timeout(900)
def test_stale_pages_from_a_later_state(pristine: Pristine, tmp_path: pathlib.Path) -> None:
    """A page replaced by the same page of a later state of the store (a lost or misdirected
    write) gives a correct completion or a clear error, never a crash or a rolled-back record.

    Regression (found by the campaign): the signals page of a later state made a delivered
    approval read as consumed, so `tcc resume` parked waiting for it again.  A consumption now
    names the journal record committed with it; without that record the signal is pending.
    """
    tally = campaign(pristine, file_mutants(pristine, max(1, CI_MUTANTS // 2), SEED + 3, ("stale",)),
                     tmp_path, "data.mdb stale pages", SEED + 3)
    check_file_campaign(tally)


@pytest.mark.slow
@pytest.mark.timeout(0)
def test_stale_pages_from_a_later_state_large(pristine: Pristine, tmp_path: pathlib.Path) -> None:
    """The slow tier: TCC_RELIABILITY_MUTANTS (default 2000) stale-page mutants, same guarantee."""
    tally = campaign(pristine, file_mutants(pristine, SLOW_MUTANTS, SEED + 4, ("stale",)), tmp_path,
                     "data.mdb stale pages", SEED + 4)
    check_file_campaign(tally)


# ------------------------------------------------------------------ mutants of record values


def value_mutants(pristine: Pristine, n: int, seed: int, work: pathlib.Path) -> Iterator[tuple[str, str, bytes]]:
    """``n`` copies of data.mdb with 1-3 bits flipped inside ONE stored value, written through LMDB.

    The B-tree stays valid, so this is exactly the damage per-record MACs and
    chunk addresses must catch: a flipped record must be refused, a flipped
    chunk must make recovery fall back, and nothing may come out different.
    """
    rng = random.Random(seed)
    scratch = work / "value-scratch"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(mode=0o700)
    (scratch / "data.mdb").write_bytes(pristine.data)
    env = lmdb.open(str(scratch), max_dbs=len(STORE_DBS) + 2, map_size=1 << 30)
    try:
        records = []
        for db in STORE_DBS:
            dbi = env.open_db(db.encode(), create=False)
            with env.begin(db=dbi) as txn:
                records += [(db, bytes(k), bytes(v)) for k, v in txn.cursor() if len(v)]
    finally:
        env.close()
    for _ in range(n):
        db, key, value = rng.choice(records)
        flipped = bytearray(value)
        for _ in range(rng.randint(1, 3)):
            flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(mode=0o700)
        (scratch / "data.mdb").write_bytes(pristine.data)
        env = lmdb.open(str(scratch), max_dbs=len(STORE_DBS) + 2, map_size=1 << 30)
        try:
            with env.begin(write=True, db=env.open_db(db.encode(), create=False)) as txn:
                txn.put(key, bytes(flipped))
        finally:
            env.close()
        yield db, f"{db} {key[-12:]!r}", (scratch / "data.mdb").read_bytes()


def check_value_campaign(tally: Tally) -> None:
    assert not tally.signals and not tally.timeouts, tally.report() + "\n" + "\n".join(tally.examples)
    assert tally.mutants["other"] == 0, tally.report() + "\n" + "\n".join(tally.examples)


@pytest.mark.timeout(900)
def test_record_value_flips_are_detected(pristine: Pristine, tmp_path: pathlib.Path) -> None:
    """Bits flipped inside stored records and chunks are always refused or fallen back from, never believed."""
    n = max(1, CI_MUTANTS // 2)
    tally = campaign(pristine, value_mutants(pristine, n, SEED, tmp_path), tmp_path, "record-values", SEED)
    check_value_campaign(tally)


@pytest.mark.slow
@pytest.mark.timeout(0)
def test_record_value_flips_are_detected_large(pristine: Pristine, tmp_path: pathlib.Path) -> None:
    """The slow tier: TCC_RELIABILITY_MUTANTS (default 2000) record-value flips, same guarantee."""
    tally = campaign(pristine, value_mutants(pristine, SLOW_MUTANTS, SEED + 2, tmp_path), tmp_path,
                     "record-values", SEED + 2)
    check_value_campaign(tally)


# ------------------------------------------------------------------ the same, encrypted


@pytest.mark.timeout(900)
def test_encrypted_data_file_mutants(pristine_encrypted: Pristine, tmp_path: pathlib.Path) -> None:
    """An encrypted store's damaged data.mdb (flips, truncations, splices, page swaps, stale
    pages) gives a correct completion or a clear error, never a crash."""
    tally = campaign(pristine_encrypted, file_mutants(pristine_encrypted, ENCRYPTED_MUTANTS, SEED + 7,
                                                      FILE_KINDS + ("stale",)),
                     tmp_path, "encrypted data.mdb", SEED + 7)
    check_file_campaign(tally)


@pytest.mark.timeout(900)
def test_encrypted_record_value_flips_are_detected(pristine_encrypted: Pristine,
                                                   tmp_path: pathlib.Path) -> None:
    """Bits flipped inside an encrypted store's records and chunks are refused or fallen
    back from, never believed (and never decrypted into something else)."""
    tally = campaign(pristine_encrypted, value_mutants(pristine_encrypted, ENCRYPTED_MUTANTS, SEED + 8,
                                                       tmp_path),
                     tmp_path, "encrypted record-values", SEED + 8)
    check_value_campaign(tally)


@pytest.mark.slow
@pytest.mark.timeout(0)
def test_encrypted_mutants_large(pristine_encrypted: Pristine, tmp_path: pathlib.Path) -> None:
    """The slow tier: TCC_RELIABILITY_MUTANTS (default 2000) data.mdb mutants and as many
    record-value flips of an encrypted store, same guarantees."""
    tally = campaign(pristine_encrypted, file_mutants(pristine_encrypted, SLOW_MUTANTS, SEED + 9,
                                                      FILE_KINDS + ("stale",)),
                     tmp_path, "encrypted data.mdb", SEED + 9)
    check_file_campaign(tally)
    tally = campaign(pristine_encrypted, value_mutants(pristine_encrypted, SLOW_MUTANTS, SEED + 10,
                                                       tmp_path),
                     tmp_path, "encrypted record-values", SEED + 10)
    check_value_campaign(tally)


# ------------------------------------------------------------------ deterministic structural damage


def outcomes_on(pristine: Pristine, data: bytes, work: pathlib.Path) -> tuple[ChildRun, list[str]]:
    return outcomes_on_store(pristine, pristine.store, data, work)


def outcomes_on_store(pristine: Pristine, store: pathlib.Path, data: bytes,
                      work: pathlib.Path) -> tuple[ChildRun, list[str]]:
    """Run the commands on ``data`` (with ``store``'s secret); judge each against the baseline."""
    run = run_child(store, data, work, pristine.env)
    got = [judge(b, run.results[i] if i < len(run.results) else None)[0] for i, b in enumerate(pristine.baseline)]
    return run, got


@pytest.mark.parametrize("keep", ["meta-pages", "half"])
def test_truncated_data_file_is_a_clear_error(pristine: Pristine, tmp_path: pathlib.Path, keep: str) -> None:
    """A data.mdb cut short gives each command a clear error (or its correct outcome), never a signal.

    Regression (found by the reliability campaign): a truncated data.mdb killed every tcc command with SIGBUS (LMDB read pages past the end of the file through the map); data.mdb's
    structure is now verified at open (store/_lmdbcheck.py).
    """
    cut = 2 * PAGE if keep == "meta-pages" else (len(pristine.data) // PAGE // 2) * PAGE
    run, got = outcomes_on(pristine, pristine.data[:cut], tmp_path)
    assert run.code == 0, f"child killed: exit {run.code}\n{run.tail}"
    assert "other" not in got, got


def test_empty_data_file_is_not_silently_reinitialised(pristine: Pristine, tmp_path: pathlib.Path) -> None:
    """A store whose data.mdb was emptied refuses to open instead of starting over empty.

    Regression (found by the reliability campaign): LMDB re-initialised a
    0-byte data.mdb as a new, empty store, so `tcc ls` exited 0 with no runs.
    """
    run, got = outcomes_on(pristine, b"", tmp_path)
    assert run.code == 0, run.tail
    ls = run.results[0]
    assert ls["rc"] != 0 and "tcc: error:" in ls["stderr"], ls
    assert "other" not in got, got


def compacted(pristine: Pristine, tmp: pathlib.Path) -> tuple[pathlib.Path, bytearray, int, int]:
    """A compacted copy of the store (no free pages, so LMDB's next page is the end of the file).

    Returns (store dir, its data.mdb, main DB root page, last page).  In the newer
    of the two meta pages, MDB_meta follows the 16-byte page header; the main
    DB's root page number is at +128, the last page number at +136 and the
    transaction id at +144 (LMDB 0.9 on 64-bit).
    """
    work = tmp / "compact"
    shutil.copytree(pristine.store, work, ignore=shutil.ignore_patterns("lock.mdb", "tcc.lock"))
    Cli(tmp).run("gc", "--compact", "--store", str(work), check=True)
    data = bytearray((work / "data.mdb").read_bytes())
    meta = max((0, PAGE), key=lambda off: struct.unpack_from("<Q", data, off + 144)[0])
    root, last = struct.unpack_from("<QQ", data, meta + 128)
    assert struct.unpack_from("<Q", data, root * PAGE)[0] == root  # a page header starts with its number
    return work, data, root, last


def test_misdirected_page_write_is_a_clear_error(pristine: Pristine, tmp_path: pathlib.Path) -> None:
    """A page that carries the wrong page number gives a clear error (or the correct outcome), never a signal.

    Regression (found by the reliability campaign): a page naming another page number killed `tcc resume` with SIGABRT (LMDB assertion in mdb_page_touch); data.mdb's
    structure is now verified at open (store/_lmdbcheck.py).
    """
    work, data, root, last = compacted(pristine, tmp_path)
    struct.pack_into("<Q", data, root * PAGE, last + 1)  # the main DB root claims to be the next free page
    run, got = outcomes_on_store(pristine, work, bytes(data), tmp_path / "child")
    assert run.code == 0, f"child killed: exit {run.code}\n{run.tail}"
    assert "other" not in got, got


def test_torn_runs_page_is_detected(pristine: Pristine, tmp_path: pathlib.Path) -> None:
    """A zeroed leaf page of the runs database is reported as damage, not as a store without runs.

    Regression (found by the reliability campaign): a zeroed leaf page of `runs` made `tcc ls` exit 0 with no runs; data.mdb's
    structure is now verified at open (store/_lmdbcheck.py).
    """
    work, data, root, _last = compacted(pristine, tmp_path)
    page = bytes(data[root * PAGE:(root + 1) * PAGE])
    at = page.index(b"\x04\x00runs")  # the main DB's node for "runs": key size 4, key, then its MDB_db
    runs_root = struct.unpack_from("<Q", page, at + 2 + 4 + 40)[0]  # MDB_db.md_root is its last field
    upper = struct.unpack_from("<H", data, runs_root * PAGE + 14)[0]  # nodes live in [upper, PAGE)
    data[runs_root * PAGE + upper:(runs_root + 1) * PAGE] = bytes(PAGE - upper)
    run, got = outcomes_on_store(pristine, work, bytes(data), tmp_path / "child")
    assert run.code == 0, run.tail
    assert got[0] != "ok" and "other" not in got, (got, run.results[0]["stdout"])
