"""A fleet of workers on one PostgreSQL store (README, "Running a fleet").

Every test runs real ``tcc`` processes against a real server (``pg_dsn``); several
"hosts" share this machine through ``$TCC_HOST_ID``, so a worker of one host knows
nothing of another host's processes but what the database says (leases, epochs).

* **Fleet**: 3 workers of different hosts, 50 submitted runs; workers are SIGKILLed
  with the resumes they started (their process group) and restarted, at random.  Every
  run completes once, with its exact result; every ledger step is there, once (the
  effect has a verify probe).
* **Partition**: the owner of a `tcc run` is SIGSTOPped past its lease; a worker of
  another host takes the run over and finishes it; the owner, SIGCONTed, is fenced: it
  exits non-zero and the store holds nothing it wrote after the takeover.
* **Wake-ups**: a worker whose poll is an hour starts a submitted run and resumes a
  signalled one: only a notification can have woken it (it had polled once, before).
* **Claims**: the epochs the claims recorded are each given once per run; concurrent
  ``claim_due`` calls never hand one run to two claimants.
"""

from __future__ import annotations

import collections
import os
import pathlib
import random
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from tcc.runtime import decode_result
from tests._support.pgstores import PgStore, make_pg_store
from tests._support.runs import AGENTS

LEDGER_AGENT = str(AGENTS / "ledger_agent.py")
WAIT_AGENT = str(AGENTS / "wait_agent.py")


@pytest.fixture
def fleet_store(pg_dsn: str, tmp_path: pathlib.Path) -> PgStore:
    return make_pg_store(pg_dsn, tmp_path / "keys")


def _env(store: PgStore, host: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ, **store.env(), TCC_HOST_ID=host, **extra)
    env.pop("TCC_STORE_KEY", None)
    return env


def _tcc(store: PgStore, host: str, *args: str, timeout: float = 120,
         **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tcc", *args], env=_env(store, host, **extra),
                          capture_output=True, text=True, timeout=timeout)


class Worker:
    """A `tcc worker` of one host, in a process group of its own (with its resumes)."""

    def __init__(self, store: PgStore, host: str, log: pathlib.Path, *args: str, **extra: str) -> None:
        self.store, self.host, self.log_path, self.args, self.extra = store, host, log, args, extra
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tcc", "worker", *self.args], env=_env(self.store, self.host, **self.extra),
            stdout=log, stderr=log, start_new_session=True)
        log.close()

    def kill(self) -> None:
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the worker and every resume it started
        except ProcessLookupError:
            pass
        self.proc.wait()
        _reap_group(self.proc.pid)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def _reap_group(pgid: int) -> None:
    """Wait until no process of group ``pgid`` is left (killed resumes may linger a moment)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.02)


def _wait_until(what: str, cond: Any, timeout: float, *about: Worker) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {w.host}\n{w.log()[-3000:]}" for w in about)
            raise AssertionError(f"timed out waiting for {what}\n{logs}")
        time.sleep(0.05)


def _claims(events: list[Any]) -> list[int]:
    return [e.data["new_epoch"] for e in events if e.kind in ("taken_over", "reclaimed")]


def test_fleet_of_killed_workers_finishes_every_run_once(fleet_store: PgStore, tmp_path: pathlib.Path) -> None:
    runs_n, steps = int(os.environ.get("TCC_FLEET_RUNS", "30")), 4  # (TCC_FLEET_RUNS=200: a longer campaign)
    rng = random.Random(int(os.environ.get("TCC_FLEET_SEED", "20261202")))
    ledger = tmp_path / "ledger"
    extra = {"LEDGER": str(ledger), "VERIFY": "1", "DELAY": "0.1"}
    ids = []
    for i in range(runs_n):  # submitted from "laptop", a host that runs no worker
        out = _tcc(fleet_store, "laptop", "submit", "--run-id", f"job{i:03d}", LEDGER_AGENT, str(steps),
                   **extra)
        assert out.returncode == 0, out.stderr
        ids.append(out.stdout.strip())
    assert ids == [f"job{i:03d}" for i in range(runs_n)]
    workers = [Worker(fleet_store, f"host{k}", tmp_path / f"worker{k}.log", "--concurrency", "2",
                      "--lease", "3", "--poll", "1", **extra) for k in range(3)]
    store = fleet_store.open()
    kills = 0
    try:
        deadline = time.monotonic() + 240
        # The first three kills come a fraction of a second apart from the first claim on:
        # with 0.3-1.5 s between kills, a fast machine once finished the whole fleet after two
        # kills, leaving the campaign weaker than it says.
        _wait_until("a worker to claim a run",
                    lambda: any(r.status == "running" for r in store.list_runs()), 60, *workers)
        while True:
            done = sum(r.status in ("completed", "failed", "unverified") for r in store.list_runs())
            if done == runs_n or time.monotonic() > deadline:
                break
            time.sleep(rng.uniform(0.1, 0.4) if kills < 3 else rng.uniform(0.3, 1.5))
            if done < runs_n - 3 and kills < 12:
                victim = rng.choice(workers)
                victim.kill()
                kills += 1
                victim.start()
        for w in workers:
            w.stop()
        runs = {r.run_id: r for r in store.list_runs()}
        unfinished = {k: r.status for k, r in runs.items() if r.status != "completed"}
        assert not unfinished, (unfinished, "\n".join(w.log()[-2000:] for w in workers))
        lines = ledger.read_text().splitlines()
        keys = collections.Counter(line.split()[0] for line in lines)
        hosts: set[str] = set()
        for run_id, run in runs.items():
            assert decode_result(run.result) == {"steps": steps, "total": steps * (steps - 1) // 2,
                                                          "salts": steps}, run_id
            events = store.events(run_id)
            assert [e.kind for e in events].count("completed") == 1, run_id
            epochs = _claims(events)
            assert len(epochs) == len(set(epochs)), (run_id, epochs)  # one claim per epoch
            for k in range(1, steps + 1):  # every step, exactly once (verify probe)
                assert keys[f"{run_id}:{k}"] == 1, (run_id, k, keys[f"{run_id}:{k}"])
            hosts.update(e.data.get("owner", "").split(":")[0] for e in events if e.kind == "taken_over")
        assert len(lines) == runs_n * steps
        assert kills >= 3
        assert {"host0", "host1", "host2"} & hosts  # the work was shared out
        print(f"\nfleet: {runs_n} runs x {steps} steps, 3 hosts, {kills} worker kills, "
              f"{len(lines)} ledger lines, 0 duplicates, all exact")
    finally:
        for w in workers:
            w.stop()
        store.close()


def test_partitioned_owner_is_taken_over_and_fenced(fleet_store: PgStore, tmp_path: pathlib.Path) -> None:
    ledger = tmp_path / "ledger"
    extra = {"LEDGER": str(ledger), "VERIFY": "1", "DELAY": "0.3"}
    owner = subprocess.Popen(
        [sys.executable, "-m", "tcc", "run", "--run-id", "cut", "--lease", "1.5", LEDGER_AGENT, "8"],
        env=_env(fleet_store, "hostA", **extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    worker: Worker | None = None
    store = fleet_store.open()
    try:
        _wait_until("two ledger lines", lambda: ledger.exists() and len(ledger.read_text().splitlines()) >= 2, 60)
        owner.send_signal(signal.SIGSTOP)  # cut off: no heartbeat, no commit
        stopped_epoch = store.get_run("cut").epoch
        worker = Worker(fleet_store, "hostB", tmp_path / "worker.log", "--lease", "5", "--poll", "0.5", **extra)
        _wait_until("the run to complete on hostB", lambda: store.get_run("cut").status == "completed", 90, worker)
        run = store.get_run("cut")
        before = (run, store.journal("cut"), store.snapshots("cut"), store.events("cut"))
        owner.send_signal(signal.SIGCONT)
        _out, err = owner.communicate(timeout=60)
        assert owner.returncode not in (0, None), err
        assert "taken over" in err, err
        after = (store.get_run("cut"), store.journal("cut"), store.snapshots("cut"), store.events("cut"))
        assert after == before  # the fenced owner committed nothing
        assert decode_result(run.result) == {"steps": 8, "total": 28, "salts": 8}
        takeover = [e for e in before[3] if e.kind == "taken_over" and e.data.get("epoch") == stopped_epoch]
        assert takeover and takeover[0].data["owner"].startswith("hostA:")
        assert "hostB:" in "".join(e.data.get("owner", "") for e in before[3] if e.kind == "taken_over")
        keys = collections.Counter(line.split()[0] for line in ledger.read_text().splitlines())
        # every step is there; the owner, woken inside a step, may finish that one call
        assert all(keys[f"cut:{k}"] >= 1 for k in range(1, 9)), keys
        assert sum(keys.values()) <= 9, keys
    finally:
        if owner.poll() is None:
            owner.send_signal(signal.SIGCONT)
            owner.kill()
            owner.communicate()
        if worker is not None:
            worker.stop()
        store.close()


def test_idle_worker_wakes_for_a_submission_and_a_signal(fleet_store: PgStore, tmp_path: pathlib.Path) -> None:
    # --poll 3600: after its first poll the worker only wakes for a notification
    worker = Worker(fleet_store, "hostW", tmp_path / "worker.log", "--poll", "3600")
    store = fleet_store.open()
    try:
        _wait_until("the worker to listen", lambda: "listening" in worker.log(), 60, worker)
        time.sleep(0.5)  # its first (empty) poll is over
        out = _tcc(fleet_store, "laptop", "submit", "--run-id", "ask", f"{WAIT_AGENT}:gated_checked")
        assert out.returncode == 0, out.stderr
        _wait_until("the submitted run to park", lambda: store.get_run("ask").status == "waiting", 60, worker)
        out = _tcc(fleet_store, "laptop", "approve", "ask")
        assert out.returncode == 0, out.stderr
        _wait_until("the signalled run to complete", lambda: store.get_run("ask").status == "completed", 60,
                    worker)
        assert decode_result(store.get_run("ask").result) == [True, "did first", "did second"]
        log = worker.log()
        assert log.index("resuming ask (submitted)") < log.index("resuming ask (signal arrived)")
        kinds = [e.kind for e in store.events("ask")]
        assert kinds.index("created") < kinds.index("started") < kinds.index("waiting") < kinds.index("completed")
    finally:
        worker.stop()
        store.close()


def test_concurrent_claims_never_share_a_run(fleet_store: PgStore) -> None:
    stores = [fleet_store.open() for _ in range(4)]
    try:
        for i in range(40):
            stores[0].create_run(f"{LEDGER_AGENT}:main", b"[]", run_id=f"q{i:02d}", status="queued")
        got: list[list[str]] = [[] for _ in stores]
        barrier = threading.Barrier(len(stores))

        def claimer(k: int) -> None:
            barrier.wait()
            while True:
                claimed = stores[k].claim_due(3, lease=60, check=lambda run: ("claim", "test"))  # type: ignore[attr-defined]
                if not claimed:
                    return
                got[k].extend(run.run_id for run, _ in claimed)

        threads = [threading.Thread(target=claimer, args=(k,)) for k in range(len(stores))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        flat = [r for g in got for r in g]
        assert sorted(flat) == [f"q{i:02d}" for i in range(40)]  # each run once, none lost
        for i in range(40):
            run = stores[0].get_run(f"q{i:02d}")
            assert run.epoch == 2 and run.status == "queued"
            assert _claims(stores[0].events(run.run_id)) == [2]
        # a claimed run is not due again while the claim's lease runs
        assert stores[1].claim_due(10, lease=60, check=lambda run: ("claim", "test")) == []  # type: ignore[attr-defined]
    finally:
        for s in stores:
            s.close()


def test_queue_order_and_hand_over(fleet_store: PgStore) -> None:
    store = fleet_store.open()
    try:
        for name in ("b", "a", "c"):  # submission order, not id order
            store.create_run(f"{LEDGER_AGENT}:main", b"[]", run_id=name, status="queued")
        order = [run.run_id for run, _ in store.claim_due(3, lease=60, check=lambda r: ("claim", "t"))]  # type: ignore[attr-defined]
        assert order == ["b", "a", "c"]
        # the resume a worker starts takes the run at the claimed epoch, and only then
        run = store.claim_run("b", expect_epoch=2)
        assert run.epoch == 3
        from tcc.errors import FencedError

        with pytest.raises(FencedError, match="moved on to epoch 3"):
            store.claim_run("b", expect_epoch=2)
    finally:
        store.close()


def test_a_schema_2_store_is_migrated_and_its_parked_runs_are_looked_at(fleet_store: PgStore,
                                                                         tmp_path: pathlib.Path) -> None:
    """A database an older tcc made (schema 2: no wake column) gains the fleet columns when
    opened, and a run parked there is made due once, for a worker to check."""
    import psycopg

    out = _tcc(fleet_store, "hostA", "run", "--run-id", "old", f"{WAIT_AGENT}:gated_checked")
    assert out.returncode == 0 and "waiting" in out.stdout, out.stdout + out.stderr
    assert _tcc(fleet_store, "hostA", "approve", "old").returncode == 0
    with psycopg.connect(fleet_store.url, autocommit=True) as conn:
        conn.execute("DROP INDEX tcc.runs_wake, tcc.runs_lease, tcc.runs_by_host")
        conn.execute("ALTER TABLE tcc.runs DROP COLUMN wake, DROP COLUMN spawned_by")
        conn.execute("UPDATE tcc.meta SET value = '2' WHERE key = 'schema_version'")
    worker = Worker(fleet_store, "hostB", tmp_path / "worker.log", "--poll", "3600")
    store = fleet_store.open()
    try:
        _wait_until("the old run to complete", lambda: store.get_run("old").status == "completed", 60, worker)
        assert decode_result(store.get_run("old").result) == [True, "did first", "did second"]
        with psycopg.connect(fleet_store.url, autocommit=True) as conn:
            version = conn.execute("SELECT value FROM tcc.meta WHERE key = 'schema_version'").fetchone()
        assert version == ("3",)
    finally:
        worker.stop()
        store.close()


def test_a_dead_owner_on_the_workers_host_is_taken_over_at_once(fleet_store: PgStore, tmp_path: pathlib.Path) -> None:
    """A `tcc run` of this host with a 10-minute lease dies; a worker of the same host whose
    poll is an hour takes its run over: it learnt of the run from the run's creation
    (NOTIFY) and watched its process (a pidfd), so neither the lease nor the poll is waited
    for."""
    ledger = tmp_path / "ledger"
    extra = {"LEDGER": str(ledger), "VERIFY": "1", "DELAY": "0.2"}
    worker = Worker(fleet_store, "hostS", tmp_path / "worker.log", "--poll", "3600", "--lease", "600", **extra)
    store = fleet_store.open()
    owner = None
    try:
        _wait_until("the worker to listen", lambda: "listening" in worker.log(), 60, worker)
        owner = subprocess.Popen(
            [sys.executable, "-m", "tcc", "run", "--run-id", "local", "--lease", "600", LEDGER_AGENT, "6"],
            env=_env(fleet_store, "hostS", **extra), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_until("two ledger lines", lambda: ledger.exists() and len(ledger.read_text().splitlines()) >= 2,
                    60, worker)
        owner.kill()
        owner.wait()
        _wait_until("the run to complete", lambda: store.get_run("local").status == "completed", 60, worker)
        assert decode_result(store.get_run("local").result) == {"steps": 6, "total": 15, "salts": 6}
        assert "resuming local (owner dead)" in worker.log()
        takeover = [e for e in store.events("local") if e.kind == "taken_over" and e.data.get("by") == "worker"]
        assert takeover and takeover[0].data["owner"] == f"hostS:{owner.pid}"
    finally:
        if owner is not None and owner.poll() is None:
            owner.kill()
            owner.wait()
        worker.stop()
        store.close()


def test_a_wait_timeout_and_a_release_wake_the_workers(fleet_store: PgStore) -> None:
    """Store level: parking at a wait with a deadline notifies (idle workers learn when it
    is due), and so does the release of a parked run that a signal made due while its
    owner still held it (the signal's own notification found it held)."""
    store = fleet_store.open()
    listener = store.listener()  # type: ignore[attr-defined]
    try:
        assert listener.start()
        run = store.create_run(f"{WAIT_AGENT}:gated", b"[]", run_id="w")
        assert listener.wait(2.0)  # a new run: workers learn its lease
        store.set_status("w", run.epoch, "waiting", wake=time.time() + 3600)
        assert listener.wait(2.0)  # a deadline
        soon = store.next_due()  # type: ignore[attr-defined]
        assert soon is not None and 3500 < soon <= 3600  # the deadline (the lease ends before)
        store.send_signal("w", "go", b"1")
        assert listener.wait(2.0)
        assert not listener.wait(0.3)  # (nothing more)
        store.renew_lease("w", run.epoch, 0.0)  # the owner lets go: due now
        assert listener.wait(2.0)
        due = store.next_due()  # type: ignore[attr-defined]
        assert due is not None and due <= 0
    finally:
        listener.close()
        store.close()


def test_runs_a_worker_skips_do_not_crowd_out_the_queue(fleet_store: PgStore, tmp_path: pathlib.Path) -> None:
    """A dozen runs in back-off (their resumes kept failing) sit at the head of the queue;
    the run submitted after them is still claimed, and the ones skipped are not locked."""
    from tcc.runtime import Worker as RuntimeWorker

    store = fleet_store.open()
    try:
        for i in range(12):
            store.create_run(f"{LEDGER_AGENT}:main", b"[]", run_id=f"bad{i:02d}", status="queued")
        store.create_run(f"{LEDGER_AGENT}:main", b"[]", run_id="good", status="queued")
        worker = RuntimeWorker(store, concurrency=1, command=[sys.executable, "-c", "pass", "--"],
                               log=lambda msg: None)
        worker.backoff = {f"bad{i:02d}": (5, time.time() + 600) for i in range(12)}
        assert worker.tick() == 1
        assert list(worker.children) == ["good"]
        for proc in worker.children.values():
            proc.wait()
        worker._reap()  # (closes what it kept of the child's stderr)
        assert store.get_run("good").epoch == 2 and store.get_run("bad00").epoch == 1
    finally:
        store.close()


def test_a_damaged_trail_of_a_due_run_is_reported_and_the_others_are_served(fleet_store: PgStore,
                                                                           tmp_path: pathlib.Path) -> None:
    import psycopg

    out = _tcc(fleet_store, "hostA", "run", "--run-id", "hurt", f"{WAIT_AGENT}:gated_checked")
    assert out.returncode == 0 and "waiting" in out.stdout, out.stderr
    assert _tcc(fleet_store, "hostA", "approve", "hurt").returncode == 0  # due now
    with psycopg.connect(fleet_store.url, autocommit=True) as conn:  # flip a byte of an event
        conn.execute("UPDATE tcc.events SET record = set_byte(record, 40, 255 - get_byte(record, 40)) "
                     "WHERE id = (SELECT max(id) FROM tcc.events WHERE run_id = 'hurt' AND record IS NOT NULL)")
    out = _tcc(fleet_store, "laptop", "submit", "--run-id", "fine", LEDGER_AGENT, "2",
               LEDGER=str(tmp_path / "ledger"))
    assert out.returncode == 0, out.stderr
    out = _tcc(fleet_store, "hostB", "worker", "--once", LEDGER=str(tmp_path / "ledger"))
    assert out.returncode == 0, out.stderr
    assert "worker: skipping run hurt" in out.stderr and "failed verification" in out.stderr
    store = fleet_store.open()
    try:
        assert store.get_run("fine").status == "completed"
    finally:
        store.close()


def test_migration_gives_old_children_their_parent(fleet_store: PgStore) -> None:
    import psycopg

    store = fleet_store.open()
    try:
        for rid in ("p", "p.1", "p.1.2", "p.x", "q.3"):
            store.create_run(f"{WAIT_AGENT}:parent", b"[]", run_id=rid)
    finally:
        store.close()
    with psycopg.connect(fleet_store.url, autocommit=True) as conn:
        conn.execute("DROP INDEX tcc.runs_wake, tcc.runs_lease, tcc.runs_by_host")
        conn.execute("ALTER TABLE tcc.runs DROP COLUMN wake, DROP COLUMN spawned_by")
        conn.execute("UPDATE tcc.meta SET value = '2' WHERE key = 'schema_version'")
    fleet_store.open().close()  # migrates
    with psycopg.connect(fleet_store.url, autocommit=True) as conn:
        got = dict(conn.execute("SELECT run_id, spawned_by FROM tcc.runs").fetchall())
    assert got == {"p": None, "p.1": "p", "p.1.2": "p.1", "p.x": None, "q.3": None}


def test_a_fleet_worker_leaves_a_fork_nobody_started_alone(fleet_store: PgStore) -> None:
    """A fork's owner (the `tcc fork` process) is gone at once; on this host the worker
    fetches such a run immediately, and used to resume it: a fork starts only with
    `tcc resume` (README)."""
    out = _tcc(fleet_store, "hostF", "run", "--run-id", "fp", f"{WAIT_AGENT}:forkable")
    assert out.returncode == 0, out.stderr
    store = fleet_store.open()
    try:
        first = min(s.number for s in store.snapshots("fp"))
        out = _tcc(fleet_store, "hostF", "fork", "fp", "--at", str(first), "--answer", '"what-if"',
                   "--run-id", "ff")
        assert out.returncode == 0, out.stderr
        out = _tcc(fleet_store, "hostF", "worker", "--once")
        assert out.returncode == 0 and "resuming ff" not in out.stderr, out.stderr
        fork = store.get_run("ff")
        assert (fork.status, fork.epoch) == ("running", 1)
        out = _tcc(fleet_store, "hostF", "resume", "ff")
        assert out.returncode == 0, out.stderr
        assert decode_result(store.get_run("ff").result) == ["what-if", "did follow-up to what-if"]
    finally:
        store.close()


UPGRADABLE = '''\
import os
import signal

import tcc
import helpers


@tcc.effect
def step(i):
    if os.environ.get("KILL_IN") == str(i) and not os.path.exists(os.environ["MARK"]):
        open(os.environ["MARK"], "w").close()
        os.kill(os.getpid(), signal.SIGKILL)  # in flight: its intent is open, no completion
    return i


async def main(n):
    return [helpers.shape(await step(i)) for i in range(int(n))]
'''


def test_a_fleet_worker_upgrades_a_run_killed_in_a_call_under_the_upgrade_policy(
        fleet_store: PgStore, tmp_path: pathlib.Path) -> None:
    """A worker hands a claimed run to its `tcc resume` at the epoch it claimed: the upgrade
    the policy asks for must claim it at that epoch (it was refused, the worker's own claim
    being live), and the run, killed inside a call after its snapshot, continues on its
    recorded code to its next snapshot and then on the current code."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "agent.py").write_text(UPGRADABLE)
    (folder / "helpers.py").write_text("def shape(v):\n    return v * 10\n")
    extra = {"KILL_IN": "2", "MARK": str(tmp_path / "mark")}
    out = _tcc(fleet_store, "hostU", "run", "--run-id", "up", "--on-code-change", "upgrade",
               str(folder / "agent.py"), "4", **extra)
    assert out.returncode == -9, out.stderr
    (folder / "helpers.py").write_text("def shape(v):\n    return v * 100\n")
    out = _tcc(fleet_store, "hostU", "worker", "--once", **extra)
    assert out.returncode == 0, out.stderr
    store = fleet_store.open()
    try:
        deadline = time.monotonic() + 60
        while store.get_run("up").status != "completed":
            assert time.monotonic() < deadline, (store.get_run("up"), out.stderr)
            time.sleep(0.2)
        assert decode_result(store.get_run("up").result) == [0, 10, 200, 300]
        kinds = [e.kind for e in store.events("up")]
        assert "upgraded" in kinds and "in_doubt_verified" not in kinds
    finally:
        store.close()


def test_a_worker_started_before_its_database_waits_for_it(tmp_path: pathlib.Path) -> None:
    """A worker whose database is not up yet (a host booting, a deployment bringing both up)
    used to exit 1 at once, so a fleet restarted out of order stayed down: it says so once,
    waits, and serves the runs once the server answers.  `--once` still fails at once."""
    from tcc.testing.postgres import ServerUnavailable, TemporaryServer

    try:
        server = TemporaryServer(fsync=False)
        server.__enter__()
    except ServerUnavailable as exc:
        if os.environ.get("TCC_REQUIRE_POSTGRES", "").strip() not in ("", "0"):
            pytest.fail(f"TCC_REQUIRE_POSTGRES is set but there is no PostgreSQL: {exc}", pytrace=False)
        pytest.skip(f"no PostgreSQL: {exc}")
    worker = None
    try:
        if not server.managed:
            pytest.skip("$TCC_TEST_PG_DSN names a server this test may not stop")
        pg = make_pg_store(server.create_database("boot"), tmp_path / "keys")
        server.stop()
        once = _tcc(pg, "hostB", "worker", "--once")
        assert once.returncode == 1 and "cannot connect to the PostgreSQL store" in once.stderr, once.stderr
        worker = Worker(pg, "hostB", tmp_path / "worker.log", "--poll", "0.2")
        _wait_until("the worker to say the store is unreachable", lambda: "retrying every 0.2 s" in worker.log(),
                    60, worker)
        time.sleep(0.5)
        assert worker.proc is not None and worker.proc.poll() is None, worker.log()
        server.start()
        _wait_until("the worker to reach the store", lambda: "the store is reachable" in worker.log(), 60, worker)
        out = _tcc(pg, "laptop", "submit", "--run-id", "late", f"{WAIT_AGENT}:forkable")
        assert out.returncode == 0, out.stderr
        store = pg.open()
        try:
            _wait_until("the run to complete", lambda: store.get_run("late").status == "completed", 60, worker)
            assert decode_result(store.get_run("late").result) == ["did question", "did follow-up to did question"]
        finally:
            store.close()
        assert worker.log().count("retrying every") == 1, worker.log()
        # a server that answers no (no such database) is no outage: said, and the worker ends
        wrong = PgStore(pg.url.rsplit("/", 1)[0] + "/no_such_database", pg.key_file)
        proc = _tcc(wrong, "hostB", "worker", "--poll", "0.2", timeout=60)
        assert proc.returncode == 1 and "no_such_database" in proc.stderr, proc.stderr
        assert "retrying" not in proc.stderr
    finally:
        if worker is not None:
            worker.stop()
        server.__exit__(None, None, None)
