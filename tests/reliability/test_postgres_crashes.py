"""Crashes on the PostgreSQL store (issue 19): killed clients, a killed server, cut connections.

Three campaigns, each on the ledger agent (tests/_support/agents/ledger_agent.py: one
ledger line per effect, tagged with the effect's idempotency key ``RUN:N``) and checked
as the LMDB crash campaign (tests/reliability/test_crash_campaign.py) checks its stores,
whose machinery -- ``Attempt``, ``supervise``, the process-group reaper, ``Job``'s
actions, judges, ``finish`` and ``check_run`` -- is reused here:

* **Client kills** (:class:`PgJob`): the campaign's mixed SIGKILLs of `tcc run`,
  `resume`, `worker` (with and without its resumes), `gc`, `gc --compact` (``VACUUM
  FULL`` here), `fork` and a worker racing a resume, on stores that are PostgreSQL
  databases of the session's server (one database per job and segment, made with
  `tcc init`'s ``init_store``).  Every run completes exactly, no acknowledged step is lost
  (each journaled completion's ledger line exists, with its value), duplicates only for the
  effect in flight (<= the kills the run took; none with the verify probe); besides, the
  journal rows themselves (read with SQL) have gapless seqs matching the run row and no
  intent answered twice.  One summary line ``kills=... runs=... exact=... lost=...
  duplicates=...``.  Kill delays of `tcc run`/`resume` reach further than on LMDB
  (``TCC_PG_CAMPAIGN_RUN_HORIZON`` [1.5] s: the first effect comes later), and so do the
  initial horizons of the other commands.  Sizes:
  ``TCC_PG_CAMPAIGN_KILLS`` [12] per CI test,
  ``TCC_SLOW_PG_CAMPAIGN_KILLS`` [2000] in the slow tier; ``TCC_RELIABILITY_SEED`` and
  ``TCC_RELIABILITY_JOBS`` as in the LMDB campaign.

* **Server kills** (:class:`ServerKillJob`): a dedicated server (not the session's
  ``pg_server``: nothing else sees it die) whose postmaster is SIGKILLed while runs execute
  (`tcc run` of new runs, `tcc resume` of unfinished ones, or a `tcc worker --once` that
  resumes them), once the ledger has grown by a random number of lines; it is restarted
  after a random outage (crash recovery), and checked to accept connections.  Each client
  then either carried on (its pool reconnected) or stopped with one line, ``tcc: error:
  lost the connection ... whether it committed is unknown`` or ``cannot connect``; nothing
  else (no traceback).  At the end every run is resumed to completion and checked as
  above: exact, nothing acknowledged lost, each intent answered at most once, gapless
  journals, duplicates <= the server kills the run lived through.  Intents do not wait
  for their own WAL flush (the default; README "The PostgreSQL store"), so a crash can
  take the intent of the call in flight: that call is then re-issued unaware
  (``unrecorded_reissues``: a duplicate ledger line of a call whose journal has a single
  intent), or in doubt when its intent survived (``recorded_duplicates``); with a verify
  probe, which a resumed run asks for its first fresh call, no call runs twice (both 0).
  Sizes: ``TCC_PG_SERVER_KILLS`` [4] and ``TCC_PG_SERVER_VERIFY_KILLS`` [3] in CI,
  ``TCC_SLOW_PG_SERVER_KILLS`` [200] in the slow tier.

* **A cut connection**: an effect (tests/_support/agents/pg_cut_agent.py) terminates its
  own process's backends, between the intent's commit and the completion's: `tcc run`
  fails with one line (exit 1) saying the connection was lost and whether the commit
  landed is unknown; `tcc resume` re-issues the call in doubt with its recorded arguments
  and idempotency key (or, with a verify probe, finds its effect and does not), and ends
  with the result of an uninterrupted run.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import itertools
import json
import os
import pathlib
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests._support.pg_campaign import PgCli, accepts_connections, journal_problems, read_pg_store
from tests._support.pgstores import PgStore, make_pg_store
from tests._support.runs import AGENTS
from tests.reliability.test_crash_campaign import (  # the LMDB campaign's machinery
    DELAY,
    DURABILITIES,
    JOBS,
    MAX_UNFINISHED,
    SEED,
    STEPS,
    Attempt,
    Figures,
    Job,
    Run,
    kill_group,
    ledger_lines,
    reap_group,
    reaper,  # noqa: F401  (a fixture: adopt and reap orphans)
    supervise,
)

CUT_AGENT = str(pathlib.Path(__file__).resolve().parents[1] / "_support" / "agents" / "pg_cut_agent.py")
LOST_INTENT_AGENT = str(pathlib.Path(__file__).resolve().parents[1] / "_support" / "agents"
                        / "pg_lost_intent_agent.py")

KILLS = int(os.environ.get("TCC_PG_CAMPAIGN_KILLS", "12"))
SLOW_KILLS = int(os.environ.get("TCC_SLOW_PG_CAMPAIGN_KILLS", "2000"))
SERVER_KILLS = int(os.environ.get("TCC_PG_SERVER_KILLS", "4"))
SERVER_VERIFY_KILLS = int(os.environ.get("TCC_PG_SERVER_VERIFY_KILLS", "3"))
SLOW_SERVER_KILLS = int(os.environ.get("TCC_SLOW_PG_SERVER_KILLS", "200"))
SERVER_SEED = SEED + 19
# run/resume kill delays: uniform(0.02, RUN_HORIZON) as in the LMDB campaign, but longer: a
# `tcc` process on PostgreSQL takes ~1.2 s (not ~0.6 s) to reach its first effect here
RUN_HORIZON = float(os.environ.get("TCC_PG_CAMPAIGN_RUN_HORIZON", "1.5"))
# initial kill horizons of the short commands (they adapt to the measured natural duration,
# as in the LMDB campaign): ~1 s more than LMDB's, or every kill lands in start-up
HORIZONS = {"worker": 2.5, "gc": 1.3, "compact": 1.4, "fork": 1.3}

_databases = itertools.count(1)
# What a client may say when the server died under it (exit 1, one line).
CONNECTION_ERRORS = ("lost the connection to the PostgreSQL store", "cannot connect to the PostgreSQL store")


def summary(fig: Figures, seconds: float, what: str, **extra: object) -> str:
    by_action = "/".join(f"{a}:{n}" for a, n in sorted(fig.by_action.items()) if n)
    more = " ".join(f"{k}={v}" for k, v in extra.items())
    return (f"\nkills={fig.kills} runs={fig.runs} exact={fig.completed_exactly} lost={fig.lost_steps} "
            f"duplicates={fig.duplicates} in_doubt={fig.in_doubt} forks={fig.forks} "
            f"by_action={by_action} refused={fig.refused} steals={fig.steals} "
            f"worker_child_failures={fig.worker_child_failures} actions={fig.actions} "
            f"stores={fig.stores} {more} seconds={seconds:.1f} ({what})")


# ------------------------------------------------------- client kills


class PgJob(Job):
    """The LMDB campaign's job on PostgreSQL stores: each segment is a new database."""

    def __init__(self, root: pathlib.Path, index: int, seed: int, verify: bool,
                 stop: threading.Event, server: Any) -> None:
        super().__init__(root, index, seed, verify, stop)
        self.horizon = dict(HORIZONS)
        self.server = server
        self.databases: list[str] = []
        self.journal_counts: collections.Counter[str] = collections.Counter()

    def new_store(self, folder: pathlib.Path) -> PgStore:
        name = f"c{os.getpid()}_{self.tag}_{next(_databases)}"
        self.databases.append(name)
        return make_pg_store(self.server.create_database(name), folder)

    def durabilities(self) -> tuple[str, ...]:
        return DURABILITIES

    def extra_env(self) -> dict[str, str]:
        return {}

    def segment(self, kills: int) -> None:
        self.tag = f"j{self.index}s{self.fig.stores}"
        folder = self.root / self.tag
        folder.mkdir(parents=True)
        self.fig.stores += 1
        self.durability = self.rng.choice(self.durabilities())
        self.pg = self.new_store(folder)
        env = {"LEDGER": str(folder / "ledger.txt"), "DELAY": DELAY, "STEPS": str(STEPS),
               "TCC_DURABILITY": self.durability, "VERIFY": "1" if self.verify else "0"}
        env.update(self.extra_env())
        self.cli = PgCli(folder, self.pg, **env)
        self.ledger = folder / "ledger.txt"
        self.runs: dict[str, Run] = {}
        self.made = 0
        self.drive(kills)
        if not self.stop.is_set():
            self.finish()
            self.check()

    def drive(self, kills: int) -> None:
        goal = self.fig.kills + kills
        while self.fig.kills < goal and not self.stop.is_set():
            self.orphans = [g for g in self.orphans if reap_group(g, block=False)]
            self.act(self.pick())

    def pick(self) -> str:
        # Job.pick without its first line (an LMDB store exists once a run made it; `tcc init`
        # made this one)
        unfinished = self.unfinished()
        resumable = [r for r in unfinished if r.state == "live" or r.fork_of]
        weights = {
            "run": 3.0 if len(unfinished) < MAX_UNFINISHED else 0.5,
            "resume": 4.0 if resumable else 0.0,
            "worker": 1.5,
            "gc": 1.0,
            "compact": 0.8,
            "fork": 1.0 if len(unfinished) < MAX_UNFINISHED + 2 else 0.0,
            "overlap": 0.8 if resumable else 0.0,
        }
        return self.rng.choices(list(weights), list(weights.values()))[0]

    def run_delay(self) -> float:
        if self.rng.random() < 0.15:  # now and then long enough to finish, or to die after the last commit
            return self.rng.uniform(RUN_HORIZON, 2.5 * RUN_HORIZON)
        return self.rng.uniform(0.02, RUN_HORIZON)

    def listed(self) -> dict[str, str]:
        ls = Attempt(self.cli, "ls", ("ls", "--json"), None)
        ls.collect()
        if ls.code != 0:
            self.problem(f"the store does not list: {ls.describe()}")
            return {}
        return {r["id"]: r["status"] for r in json.loads(ls.out)}

    def judge_gc(self, attempt: Attempt) -> int:
        # `gc --compact` is VACUUM FULL here: refused (after a 5 s lock timeout) only while
        # another process holds tcc's tables
        if (not attempt.landed and attempt.code == 1 and attempt.action == "compact"
                and "is in use" in attempt.err and "Traceback" not in attempt.err):
            self.learn(attempt)
            self.fig.refused += 1
            if not self.orphans:
                self.problem(f"compaction refused with no other process alive: {attempt.describe()}")
            return 0
        return super().judge_gc(attempt)

    def check(self) -> None:
        """Job.check on the database (read in this process), then the journal rows by SQL."""
        try:
            docs = read_pg_store(self.pg)
        except Exception as exc:  # noqa: BLE001 - reported as a finding, with its type
            self.problem(f"the store does not open after the campaign: {type(exc).__name__}: {exc}")
            return
        ledger, torn = ledger_lines(self.ledger)
        for line in torn:
            self.problem(f"torn ledger line {line!r}")
        own: dict[str, dict[str, int]] = {}
        every: dict[str, dict[str, int]] = {}
        for run_id, doc in docs.items():
            every[run_id] = {k: o[1] for k, o in doc["calls"] if o is not None and o[0] == "send"}
            own[run_id] = {k: v for k, v in every[run_id].items() if k.rpartition(":")[0] == run_id}
        for run_id, doc in docs.items():
            self.fig.runs += 1
            run = self.runs.get(run_id, Run(run_id))
            if self.check_run(run, doc, every, own, ledger):
                self.fig.completed_exactly += 1
        for key, values in ledger.items():
            owner = key.rpartition(":")[0]
            if key not in own.get(owner, {}):
                self.problem(f"ledger line {key} {values} is not a call that run {owner!r} completed "
                             "(a fork writing under another run's key, or a lost acknowledgement)")
        problems, counts = journal_problems(self.pg)
        for text in problems:
            self.problem(f"journal rows: {text}")
        self.journal_counts.update(counts)


def drop_databases(server: Any, jobs: list[PgJob]) -> None:
    for job in jobs:
        for name in job.databases:
            with contextlib.suppress(Exception):
                server.drop_database(name)


def pg_campaign(tmp_path: pathlib.Path, server: Any, kills: int, seed: int, *, verify: bool,
                tier: str) -> Figures:
    """Job.campaign's threads, with PgJobs; prints the summary line."""
    stop = threading.Event()
    total = Figures()
    shares = [kills // JOBS + (1 if j < kills % JOBS else 0) for j in range(JOBS)]
    jobs = [PgJob(tmp_path, j, seed, verify, stop, server) for j, share in enumerate(shares) if share]
    t0 = time.monotonic()
    try:
        with concurrent.futures.ThreadPoolExecutor(JOBS) as pool:
            futures = [pool.submit(job.campaign, share) for job, share in zip(jobs, [s for s in shares if s])]
            try:
                for future in futures:
                    total.add(future.result())
            except BaseException:
                stop.set()
                from tests.reliability.test_crash_campaign import LIVE, LIVE_LOCK

                with LIVE_LOCK:
                    left = list(LIVE)
                for proc in left:
                    kill_group(proc)
                raise
            finally:
                stop.set()
    finally:
        drop_databases(server, jobs)
    counts: collections.Counter[str] = collections.Counter()
    for job in jobs:
        counts.update(job.journal_counts)
    print(summary(total, time.monotonic() - t0,
                  f"postgres client-kill campaign, {tier} tier, verify={int(verify)}, seed={seed}",
                  journal_records=counts["records"], reissued_intents=counts["reissued"], jobs=JOBS))
    return total


def assert_campaign(fig: Figures, kills: int, *, verify: bool) -> None:
    assert not fig.problems, f"{len(fig.problems)} problems:\n" + "\n".join(fig.problems[:20])
    assert fig.kills >= kills
    assert fig.runs == fig.completed_exactly > 0
    assert fig.lost_steps == 0
    if verify:
        assert fig.duplicates == 0


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("reaper")
def test_client_kill_campaign_on_postgres_loses_nothing(tmp_path, pg_server):
    """SIGKILLs of run/resume/worker/gc/compact/fork on PostgreSQL stores: every run exact,
    nothing acknowledged lost, duplicates <= kills, journal rows gapless and answered once."""
    fig = pg_campaign(tmp_path, pg_server, KILLS, SEED + 40, verify=False, tier="ci")
    assert_campaign(fig, KILLS, verify=False)


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("reaper")
def test_client_kill_campaign_on_postgres_with_verify_probe_has_no_duplicates(tmp_path, pg_server):
    """The same campaign with a verify probe on every effect: zero duplicates."""
    fig = pg_campaign(tmp_path, pg_server, KILLS, SEED + 41, verify=True, tier="ci")
    assert_campaign(fig, KILLS, verify=True)


@pytest.mark.slow
@pytest.mark.timeout(max(3600, 2 * SLOW_KILLS))
@pytest.mark.usefixtures("reaper")
def test_large_client_kill_campaign_on_postgres(tmp_path, pg_server):
    """Slow tier: TCC_SLOW_PG_CAMPAIGN_KILLS [2000] client kills, same guarantees."""
    fig = pg_campaign(tmp_path, pg_server, SLOW_KILLS, SEED + 42, verify=False, tier="slow")
    assert_campaign(fig, SLOW_KILLS, verify=False)


# ------------------------------------------------------- server kills


class ServerKillJob(PgJob):
    """Rounds of runs executing while the postmaster is SIGKILLed and restarted.

    ``fig.kills`` counts server kills; ``by_action["mid_run"]`` those that found at least
    one driving process alive.  A run's ``kills`` counts the server kills it lived through
    unfinished (its effect in flight then may run twice).
    """

    def __init__(self, root: pathlib.Path, seed: int, server: Any, probe: bool) -> None:
        # verify=False for Job.check_run: duplicates <= kills (a lost intent's call runs
        # again without its probe being asked); ``probe`` gives the agent its verify probe
        super().__init__(root, 0, seed, False, threading.Event(), server)
        self.probe = probe
        self.connection_errors = 0
        self.outages: list[float] = []
        self.restarts: list[float] = []

    def durabilities(self) -> tuple[str, ...]:
        # durability none (synchronous_commit off) may lose acknowledged commits when the
        # server crashes, by design (README): only the durable modes here
        return ("sync", "group")

    def extra_env(self) -> dict[str, str]:
        return {"SALT": "step", "VERIFY": "1" if self.probe else "0"}

    def drive(self, kills: int) -> None:
        while self.fig.kills < kills:
            self.orphans = [g for g in self.orphans if reap_group(g, block=False)]
            self.server_round()

    def ledger_size(self) -> int:
        try:
            return len(self.ledger.read_text().splitlines())
        except FileNotFoundError:
            return 0

    def server_round(self) -> None:
        self.fig.actions += 1
        drives: list[tuple[Attempt, Run]] = []
        worker: Attempt | None = None
        live = [r for r in self.unfinished() if r.state == "live"]
        if live and self.rng.random() < 0.35:
            worker = self.start_worker(None, True)  # resumes the live runs whose owner died
            self.fig.by_action["round_worker"] += 1
            busy = set(r.run_id for r in live)
        else:
            busy = set()
        for run in self.unfinished():
            if run.run_id not in busy and len(drives) < MAX_UNFINISHED:
                drives.append((self.start_drive(run, None, "resume" if run.state == "live" else "run"), run))
        while len(drives) + len(busy) < MAX_UNFINISHED:
            run = self.new_run()
            drives.append((self.start_drive(run, None, "run"), run))
        at_risk = list(self.unfinished())
        attempts = [a for a, _ in drives] + ([worker] if worker else [])
        start = self.ledger_size()
        target = start + self.rng.randint(1, 2 * STEPS)
        deadline = time.monotonic() + 60
        while (self.ledger_size() < target and any(a.proc.poll() is None for a in attempts)
               and time.monotonic() < deadline):
            time.sleep(0.005)
        time.sleep(self.rng.uniform(0, 0.05))
        running = any(a.proc.poll() is None for a in attempts) or bool(self.orphans)
        t0 = time.monotonic()
        self.server.kill()
        self.fig.kills += 1
        self.fig.by_action["mid_run" if running else "idle"] += 1
        for run in at_risk:
            run.kills += 1
        outage = self.rng.choice((0.0, self.rng.uniform(0, 0.5), self.rng.uniform(0.5, 3.0)))
        time.sleep(outage)
        t1 = time.monotonic()
        self.server.start()
        self.restarts.append(time.monotonic() - t1)
        self.outages.append(time.monotonic() - t0)
        if not accepts_connections(self.pg.url):
            self.problem("the server does not accept connections after its restart")
        supervise(attempts)
        for attempt, run in drives:
            self.judge_drive(attempt, run)
        if worker is not None:
            self.judge_worker(worker, at_risk)

    def connection_error(self, attempt: Attempt) -> bool:
        """A clean stop for want of the server: exit 1 and one `tcc: error:` line about it."""
        lines = [ln for ln in attempt.err.strip().splitlines()
                 if ln.strip() and not ln.startswith(("resuming ", "run ", "worker: ", "tcc worker: "))]
        return (attempt.code == 1 and len(lines) == 1 and lines[0].startswith("tcc: error: ")
                and any(e in lines[0] for e in CONNECTION_ERRORS) and "Traceback" not in attempt.err)

    def judge_drive(self, attempt: Attempt, run: Run) -> int:
        if not attempt.killed and self.connection_error(attempt):
            self.connection_errors += 1
            if "lost the connection" in attempt.err and "whether it committed is unknown" not in attempt.err \
                    and "during" in attempt.err:
                self.problem(f"a write lost its connection without saying its commit is in doubt: "
                             f"{attempt.describe()}")
            if any(ln.strip() in (f"run {run.run_id}", f"resuming {run.run_id}")
                   for ln in attempt.err.splitlines()):
                run.state = "live" if run.state != "done" else "done"
            return 0
        return super().judge_drive(attempt, run)

    def judge_worker(self, attempt: Attempt, at_risk: list[Run]) -> int:
        if not attempt.killed and self.connection_error(attempt):
            self.connection_errors += 1
            # its resumes (own process group) may go on: wait for them before the next round
            if reap_group(attempt.proc.pid, block=False):
                self.orphans.append(attempt.proc.pid)
            return 0
        return super().judge_worker(attempt, at_risk)

    def duplicate_kinds(self) -> tuple[int, int]:
        """Duplicate ledger lines (unrecorded, recorded): of calls whose journal has one
        intent (the first one's intent was lost with the server: re-issued unaware; see the
        module docstring), and of calls re-issued in doubt (two intents or more)."""
        ledger, _ = ledger_lines(self.ledger)
        intents: collections.Counter[str] = collections.Counter()
        with self.pg.open(create=False) as store:
            for info in store.list_runs():
                for rec in store.journal(info.run_id):
                    if rec.kind == "intent":
                        intents[rec.idempotency_key or ""] += 1
        unrecorded = sum(len(v) - 1 for k, v in ledger.items() if len(v) > 1 and intents[k] == 1)
        recorded = sum(len(v) - 1 for k, v in ledger.items() if len(v) > 1 and intents[k] > 1)
        return unrecorded, recorded


@contextlib.contextmanager
def own_server(**settings: Any) -> Iterator[Any]:
    """A TemporaryServer for one test, which it may kill; skipped where there is none we own.
    ``settings``: more server settings (``-c name=value``)."""
    from tcc.testing.postgres import ServerUnavailable, TemporaryServer

    try:
        server = TemporaryServer(fsync=False, settings=settings)
        server.__enter__()
    except ServerUnavailable as exc:
        if os.environ.get("TCC_REQUIRE_POSTGRES", "").strip() not in ("", "0"):
            pytest.fail(f"TCC_REQUIRE_POSTGRES is set but there is no PostgreSQL: {exc}", pytrace=False)
        pytest.skip(f"no PostgreSQL: {exc}")
    try:
        if not server.managed:
            pytest.skip("$TCC_TEST_PG_DSN names a server this test may not kill")
        yield server
    finally:
        server.close()


def server_campaign(tmp_path: pathlib.Path, kills: int, seed: int, tier: str, *,
                    probe: bool) -> tuple[Figures, ServerKillJob, int, int]:
    t0 = time.monotonic()
    with own_server() as server:
        started = time.monotonic() - t0
        job = ServerKillJob(tmp_path, seed, server, probe)
        try:
            job.segment(kills)
            unrecorded, recorded = job.duplicate_kinds() if not job.fig.problems else (-1, -1)
        finally:
            with contextlib.suppress(Exception):
                server.start()  # whatever happened, leave it running for close()
            drop_databases(server, [job])
    fig = job.fig
    counts = job.journal_counts
    print(summary(fig, time.monotonic() - t0,
                  f"postgres server-kill campaign, {tier} tier, verify={int(probe)}, seed={seed}",
                  server_kills=fig.kills, connection_errors=job.connection_errors,
                  unrecorded_reissues=unrecorded, recorded_duplicates=recorded,
                  journal_records=counts["records"],
                  reissued_intents=counts["reissued"],
                  max_outage=f"{max(job.outages, default=0):.2f}s",
                  max_restart=f"{max(job.restarts, default=0):.2f}s", server_start=f"{started:.1f}s"))
    return fig, job, unrecorded, recorded


def assert_server_campaign(fig: Figures, kills: int) -> None:
    assert not fig.problems, f"{len(fig.problems)} problems:\n" + "\n".join(fig.problems[:20])
    assert fig.kills == kills
    assert fig.by_action["mid_run"] >= 1, "no server kill found a run executing"
    assert fig.runs == fig.completed_exactly > 0
    assert fig.lost_steps == 0


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("reaper")
def test_server_killed_mid_run_loses_nothing_acknowledged(tmp_path):
    """SIGKILL the postmaster while runs execute, restart it: runs stop with one clear line
    or carry on, then resume to exactly their results; nothing acknowledged is lost, no
    intent is answered twice, journals are gapless, duplicates <= server kills lived through."""
    fig, _job, _unrecorded, _recorded = server_campaign(tmp_path, SERVER_KILLS, SERVER_SEED, "ci",
                                                        probe=False)
    assert_server_campaign(fig, SERVER_KILLS)


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("reaper")
def test_server_killed_mid_run_with_verify_probe_has_no_duplicates(tmp_path):
    """The server-kill campaign with a verify probe: a call in flight is verified, never run
    twice, whether its intent survived the crash (in doubt) or not (the first call a
    resumed run makes afresh is asked about too)."""
    fig, _job, unrecorded, recorded = server_campaign(tmp_path, SERVER_VERIFY_KILLS, SERVER_SEED + 2,
                                                      "ci", probe=True)
    assert_server_campaign(fig, SERVER_VERIFY_KILLS)
    assert (fig.duplicates, unrecorded, recorded) == (0, 0, 0)


@pytest.mark.slow
@pytest.mark.timeout(max(3600, 20 * SLOW_SERVER_KILLS))
@pytest.mark.usefixtures("reaper")
def test_large_server_kill_campaign(tmp_path):
    """Slow tier: TCC_SLOW_PG_SERVER_KILLS [200] server kills, same guarantees."""
    fig, _job, _unrecorded, _recorded = server_campaign(tmp_path, SLOW_SERVER_KILLS, SERVER_SEED + 1,
                                                        "slow", probe=False)
    assert_server_campaign(fig, SLOW_SERVER_KILLS)


# --------------------------------------------------- a cut connection


def error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.strip().splitlines() if ln.strip() and not ln.startswith(("resuming ", "run "))]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("verify", [False, True], ids=["reissue", "verify"])
def test_connection_lost_before_the_completion_commit_resumes_exactly(tmp_path, pg_dsn, verify):
    """An effect cuts its process's connections: `tcc run` stops with one clear line; `tcc
    resume` re-issues the call in doubt as recorded (or its verify probe finds it) and ends
    with the uninterrupted result."""
    pg = make_pg_store(pg_dsn, tmp_path)
    ledger = tmp_path / "ledger.txt"
    marker = tmp_path / "cut"
    cli = PgCli(tmp_path, pg, LEDGER=str(ledger), STEPS="6", CUT_AT="2", CUT_MARKER=str(marker),
                VERIFY="1" if verify else "0")

    died = cli.run("run", "--json", "--run-id", "cut", CUT_AGENT)
    lines = error_lines(died.stderr)
    assert died.returncode == 1 and "Traceback" not in died.stderr, (died.returncode, died.stderr)
    assert len(lines) == 1, died.stderr
    assert lines[0].startswith("tcc: error: lost the connection to the PostgreSQL store"), lines
    assert "during a checkpoint" in lines[0] and "whether it committed is unknown" in lines[0], lines
    assert "tcc resume" in lines[0], lines
    assert marker.read_text().startswith("cut ") and int(marker.read_text().split()[1]) >= 1

    with pg.open(create=False) as store:
        run = store.get_run("cut")
        assert run.status == "running"  # not failed: it can be resumed
        journal = store.journal("cut")
    in_doubt = [r for r in journal if r.kind == "intent" and r.idempotency_key == "cut:3"]
    assert len(in_doubt) == 1 and not [r for r in journal if r.kind == "completion"
                                       and r.intent_seq == in_doubt[0].seq]

    resumed = cli.run("resume", "--json", "cut")
    assert resumed.returncode == 0, resumed.stderr
    # the agent draws each call's salt from `random` again after the crash: the call in doubt
    # is settled as recorded, and the resume says that the agent's new salt was not used
    said = error_lines(resumed.stderr)
    assert len(said) == 1, resumed.stderr
    assert said[0].startswith("tcc: warning: run cut: call 3 at ") and "was in flight" in said[0]
    doc = json.loads(resumed.stdout.strip().splitlines()[-1])
    # the uninterrupted result: the same agent, not cut (the marker exists now)
    whole = cli.run("run", "--json", "--run-id", "whole", CUT_AGENT, check=True)
    assert doc["status"] == "completed"
    assert doc["result"] == json.loads(whole.stdout.strip().splitlines()[-1])["result"] == {"steps": 6, "total": 15}

    values = collections.defaultdict(list)
    for line in ledger.read_text().splitlines():
        key, _, value = line.partition(" ")
        values[key].append(int(value))
    with pg.open(create=False) as store:
        journal = store.journal("cut")
        events = collections.Counter(e.kind for e in store.events("cut"))
    intents = [r for r in journal if r.kind == "intent" and r.idempotency_key == "cut:3"]
    answers = {r.intent_seq: r for r in journal if r.kind == "completion"}
    assert len({r.args for r in intents}) == 1  # re-issued (or verified) with the recorded arguments
    assert [r.attempt for r in intents] == [1, 2]
    assert intents[0].seq not in answers and intents[1].seq in answers  # answered once, the second time
    assert sorted(values) == [f"cut:{n}" for n in range(1, 7)] + [f"whole:{n}" for n in range(1, 7)]
    if verify:
        assert values["cut:3"] == [values["cut:3"][0]]  # the probe found it: no second effect
        assert events["in_doubt_verified"] == 1 and events["in_doubt_reissued"] == 0
    else:
        assert len(values["cut:3"]) == 2 and values["cut:3"][0] == values["cut:3"][1]  # same arguments
        assert events["in_doubt_reissued"] == 1 and events["in_doubt_verified"] == 0
    assert all(len(v) == 1 for k, v in values.items() if k != "cut:3")
    problems, _ = journal_problems(pg)
    assert problems == []


@pytest.mark.timeout(180)
@pytest.mark.parametrize("verify", [False, True], ids=["rerun", "verify"])
def test_server_crash_that_takes_an_intent_leaves_the_call_in_doubt(tmp_path, verify):
    """An intent does not wait for its own WAL flush (one flush per step): the server is
    SIGKILLed while the effect runs, before anything flushed the intent, and the journal
    comes back without it.  `tcc resume` cannot know the call started, so it treats the
    first call it makes afresh as in doubt: with a verify probe the call is found and not
    run again; without one it runs again (the documented window: one duplicate of the
    call in flight, like a process crash before the completion commit)."""
    # the WAL writer must not flush the intent on its own before the kill (default 200 ms)
    with own_server(wal_writer_delay="10s") as server:
        pg = make_pg_store(server.create_database("lost"), tmp_path)
        ledger = tmp_path / "ledger.txt"
        hand = tmp_path / "hand"
        cli = PgCli(tmp_path, pg, LEDGER=str(ledger), STEPS="5", CRASH_AT="3", HANDSHAKE=str(hand),
                    VERIFY="1" if verify else "0")
        proc = subprocess.Popen(cli.cmd("run", "--json", "--run-id", "lost", LOST_INTENT_AGENT),
                                env=cli.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while not (tmp_path / "hand.ready").exists():
                assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
                time.sleep(0.005)
            server.kill()
            (tmp_path / "hand.go").touch()
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 1 and "Traceback" not in err, (proc.returncode, out, err)
        lines = error_lines(err)
        assert len(lines) == 1 and lines[0].startswith("tcc: error: lost the connection"), err
        server.start()

        with pg.open(create=False) as store:
            journal = store.journal("lost")
        keys = [r.idempotency_key for r in journal if r.kind == "intent"]
        assert keys == ["lost:1", "lost:2"], keys  # the crash took the third call's intent
        assert ledger.read_text().splitlines()[-1].startswith("lost:3 ")  # ... after it ran

        resumed = cli.run("resume", "--json", "lost", timeout=120)
        assert resumed.returncode == 0 and error_lines(resumed.stderr) == [], resumed.stderr
        doc = json.loads(resumed.stdout.strip().splitlines()[-1])
        assert doc["status"] == "completed" and doc["result"] == {"steps": 5, "total": 15}, doc

        values = collections.defaultdict(list)
        for line in ledger.read_text().splitlines():
            key, _, value = line.partition(" ")
            values[key].append(int(value))
        with pg.open(create=False) as store:
            journal = store.journal("lost")
            events = [e for e in store.events("lost") if e.kind.startswith("in_doubt")]
        assert sorted(values) == [f"lost:{n}" for n in range(1, 6)]
        assert all(len(v) == 1 for k, v in values.items() if k != "lost:3")
        third = [r for r in journal if r.kind == "intent" and r.idempotency_key == "lost:3"]
        assert len(third) == 1 and third[0].attempt == 1  # answered once
        if verify:
            assert values["lost:3"] == [values["lost:3"][0]]  # found by the probe: not run again
            assert [(e.kind, e.data) for e in events] == [
                ("in_doubt_verified", {"effect": "pg_lost_intent:append_verified", "key": "lost:3",
                                       "unrecorded": True})]
        else:
            assert len(values["lost:3"]) == 2  # the window: run again, unaware
            assert events == []
        problems, _ = journal_problems(pg)
        assert problems == []


@pytest.mark.timeout(120)
def test_gathered_calls_whose_intents_were_lost_are_all_in_doubt(tmp_path, pg_dsn):
    """A server crash can take every intent of a tcc.gather (none waited for its flush).
    The state such a crash leaves is made exactly, with SQL, after a process crash: the
    gather's intent rows gone and the run's journal length back before them.  On resume,
    every gathered call is asked its verify probe: none runs twice."""
    import psycopg

    pg = make_pg_store(pg_dsn, tmp_path)
    ledger = tmp_path / "ledger.txt"
    cli = PgCli(tmp_path, pg, LEDGER=str(ledger), DIE_ON="b")
    agent = str(AGENTS / "gather_verify_agent.py")
    died = cli.run("run", "--run-id", "g", agent)
    assert died.returncode == -9, died.stderr  # SIGKILLed by the effect, after its line
    with psycopg.connect(pg.url, autocommit=True) as conn:
        rows = conn.execute("SELECT seq FROM tcc.journal WHERE run_id = 'g' ORDER BY seq").fetchall()
        first = len(rows) - 2  # the gather's two intents follow the first call's records
        conn.execute("DELETE FROM tcc.journal WHERE run_id = 'g' AND seq >= %s", (first,))
        conn.execute("UPDATE tcc.runs SET journal_len = %s WHERE run_id = 'g'", (first,))
    with pg.open(create=False) as store:
        assert [r.idempotency_key for r in store.journal("g") if r.kind == "intent"] == ["g:1"]
    resumed = cli.run("resume", "--json", "g")
    assert resumed.returncode == 0, resumed.stderr
    result = json.loads(resumed.stdout.strip().splitlines()[-1])["result"]
    lines = ledger.read_text().splitlines()
    keys = [ln.partition(" ")[0] for ln in lines]
    assert sorted(keys) == ["g:1", "g:2.0", "g:2.1"], lines  # each call ran once
    assert result[0] == "solo" and result[2] == "b (found)", result
    assert result[1] in ("a", "a (found)"), result  # "a" may not have run before the kill
    with pg.open(create=False) as store:
        verified = [e.data for e in store.events("g") if e.kind == "in_doubt_verified"]
    assert {"effect": "gv:write", "key": "g:2.1", "unrecorded": True} in verified
    assert len(verified) == 1 + (result[1] == "a (found)")


@pytest.mark.timeout(120)
def test_only_a_run_that_crashed_while_executing_asks_about_its_first_fresh_call(tmp_path, pg_dsn):
    """A parked run recorded its status after its last call, so resuming it asks no probe;
    a run whose process died while executing asks about the first call it makes afresh,
    once."""
    pg = make_pg_store(pg_dsn, tmp_path)
    ledger = tmp_path / "ledger.txt"
    cli = PgCli(tmp_path, pg, LEDGER=str(ledger))
    agent = f"{AGENTS / 'wait_agent.py'}:gated_checked"
    parked = cli.run("run", "--run-id", "p", agent, check=True)
    assert "waiting" in parked.stdout + parked.stderr
    cli.run("approve", "p", check=True)
    done = cli.run("resume", "--json", "p", check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1])["result"] == [True, "did first", "did second"]
    assert not ledger.exists(), ledger.read_text()  # the probe was never asked

    parked = cli.run("run", "--run-id", "q", agent, check=True)
    cli.run("approve", "q", check=True)
    died = cli.run("resume", "q", DIE_AT="second")  # dies inside its second call
    assert died.returncode == -9, died.stderr
    done = cli.run("resume", "--json", "q", check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1])["result"] == [True, "did first", "did second"]
    assert ledger.read_text().splitlines() == ["probe q:3"]  # the call in flight, once


def _lose_last_intent(pg: PgStore, run_id: str) -> str:
    """Make the state a server crash leaves when it takes the run's last intent (with SQL,
    after a process crash): that intent row gone, the journal length back before it.
    Returns the lost intent's call key."""
    import psycopg

    with pg.open(create=False) as store:
        journal = store.journal(run_id)
    last = journal[-1]
    assert last.kind == "intent", journal
    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute("DELETE FROM tcc.journal WHERE run_id = %s AND seq = %s", (run_id, last.seq))
        conn.execute("UPDATE tcc.runs SET journal_len = %s WHERE run_id = %s", (last.seq, run_id))
    return last.idempotency_key or ""


def _ledger(path: pathlib.Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.timeout(120)
def test_a_replayed_gather_retry_does_not_use_up_the_doubt(tmp_path, pg_dsn):
    """A gather whose call failed for good, caught by the agent, then a call whose intent
    a server crash took: replaying the gather serves the journaled failure and issues
    nothing, so the doubt goes to the call after it, which is asked about."""
    pg = make_pg_store(pg_dsn, tmp_path)
    ledger = tmp_path / "ledger.txt"
    cli = PgCli(tmp_path, pg, LEDGER=str(ledger), DIE_ON="e")
    agent = f"{AGENTS / 'doubt_agent.py'}:gather_then"
    died = cli.run("run", "--run-id", "gt", agent)
    assert died.returncode == -9, died.stderr
    assert _lose_last_intent(pg, "gt") == "gt:2"
    done = cli.run("resume", "--json", "gt", check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1])["result"] == "e (found)"
    assert sorted(_ledger(ledger)) == ["gt:1.0 f", "gt:2 e"]  # e ran once


@pytest.mark.timeout(120)
def test_a_gathered_retry_whose_intent_was_lost_is_asked_about(tmp_path, pg_dsn):
    """A gathered call failed, its retry ran and the process died; a server crash took the
    retry's intent: on resume the retry is in doubt (its probe finds it), not run again."""
    pg = make_pg_store(pg_dsn, tmp_path)
    ledger = tmp_path / "ledger.txt"
    cli = PgCli(tmp_path, pg, LEDGER=str(ledger), DIE_ON="z")
    died = cli.run("run", "--run-id", "gr", f"{AGENTS / 'doubt_agent.py'}:gather_retry_dies")
    assert died.returncode == -9, died.stderr
    assert _lose_last_intent(pg, "gr") == "gr:1.1"
    done = cli.run("resume", "--json", "gr", check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1])["result"] == ["x", "z (found)"]
    assert sorted(_ledger(ledger)) == ["gr:1.0 x", "gr:1.1 z"]  # z's retry ran once


@pytest.mark.timeout(120)
def test_an_attempt_of_tcc_retry_whose_intent_was_lost_is_asked_about(tmp_path, pg_dsn):
    """`tcc retry` issues a new attempt of the failed call; a server crash takes its intent
    and the process dies: the next `tcc resume` asks the probe about that attempt instead
    of serving the old failure (and a second retry would run the effect again)."""
    pg = make_pg_store(pg_dsn, tmp_path)
    ledger, fail = tmp_path / "ledger.txt", tmp_path / "fail"
    fail.touch()
    cli = PgCli(tmp_path, pg, LEDGER=str(ledger), FAIL=str(fail))
    agent = f"{AGENTS / 'doubt_agent.py'}:flaky_once"
    failed = cli.run("run", "--run-id", "fr", agent)
    assert failed.returncode != 0 and "h failed" in failed.stdout + failed.stderr
    fail.unlink()
    died = cli.run("retry", "fr", DIE_ON="h")
    assert died.returncode == -9, died.stderr
    assert _lose_last_intent(pg, "fr") == "fr:1"
    done = cli.run("resume", "--json", "fr", check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1])["result"] == "h (found)"
    assert _ledger(ledger) == ["fr:1 h", "fr:1 h"]  # the failed attempt and the retried one


@pytest.mark.timeout(120)
def test_a_fork_that_never_ran_asks_no_probe(tmp_path, pg_dsn):
    """A fork is created `running` but has issued nothing of its own: its first resume
    asks no probe (one that matched on arguments could hand it the parent's answer)."""
    pg = make_pg_store(pg_dsn, tmp_path)
    ledger = tmp_path / "ledger.txt"
    cli = PgCli(tmp_path, pg, LEDGER=str(ledger))
    agent = f"{AGENTS / 'wait_agent.py'}:gated_checked"
    cli.run("run", "--run-id", "src", agent, check=True)
    cli.run("approve", "src", check=True)
    cli.run("resume", "src", check=True)
    assert _ledger(ledger) == []
    with pg.open(create=False) as store:
        numbers = [s.number for s in store.snapshots("src")]
    cli.run("fork", "src", "--at", str(numbers[-2]), "--run-id", "fk", check=True)
    done = cli.run("resume", "--json", "fk", check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1])["result"] == [True, "did first", "did second"]
    assert _ledger(ledger) == []  # no probe asked


def test_unreachable_server_is_one_line(tmp_path, pg_dsn):
    """A store whose server does not answer: `tcc ls` fails with one `cannot connect` line."""
    import socket
    import urllib.parse

    pg = make_pg_store(pg_dsn, tmp_path)
    parts = urllib.parse.urlsplit(pg.url)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = urllib.parse.urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{port}"))
    cli = PgCli(tmp_path, PgStore(dead, pg.key_file))
    proc = cli.run("ls", timeout=60)
    lines = error_lines(proc.stderr)
    assert proc.returncode == 1 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("tcc: error: cannot connect to the PostgreSQL store"), lines



@pytest.mark.timeout(180)
def _connected_clients(dsn: str) -> int:
    """How many other sessions are connected to the database of ``dsn``."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                           "AND pid <> pg_backend_pid()").fetchone()
    return int(row[0]) if row else 0


def test_worker_rides_out_a_server_outage(tmp_path):
    """`tcc worker` keeps polling while the database is down, says so once, and resumes the
    run whose approval arrived once the server is back (it used to exit on the first
    StoreConnectionError, leaving its resumes unsupervised)."""
    import signal as signals

    with own_server() as server:
        pg = make_pg_store(server.create_database("outage"), tmp_path)
        cli = PgCli(tmp_path, pg)
        agent = str(AGENTS / "wait_agent.py")
        parked = cli.run("run", "--run-id", "gate", f"{agent}:gated", check=True)
        assert "waiting" in parked.stdout + parked.stderr
        worker = subprocess.Popen(cli.cmd("worker", "--poll", "0.2"), env=cli.env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            # the outage must meet the worker's polls, not its start: wait until it is connected
            deadline = time.monotonic() + 60
            while not _connected_clients(pg.url) and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(0.5)
            server.kill()
            time.sleep(2.0)  # several polls meet a dead server
            assert worker.poll() is None, "the worker exited when the server went away"
            server.start()
            assert accepts_connections(pg.url)
            cli.run("approve", "gate", check=True)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                shown = cli.run("show", "--json", "gate")
                if shown.returncode == 0 and json.loads(shown.stdout)["status"] == "completed":
                    break
                time.sleep(0.2)
            else:
                raise AssertionError("the worker never resumed the approved run")
        finally:
            worker.send_signal(signals.SIGTERM)
            log, _ = worker.communicate(timeout=60)
        assert worker.returncode == 0, log
        assert log.count("retrying every") == 1, log
        assert "the store is reachable again" in log, log
        assert json.loads(cli.run("show", "--json", "gate").stdout)["result"] == \
            ["did prepare", True, "did deploy"]
