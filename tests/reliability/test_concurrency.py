"""Concurrency: racing resumers, worker vs. manual resume, signals racing resumes, group commit.

The guarantees checked (issue 7, item 6):

* two `tcc resume` of one crashed run: exactly one claims and drives it at a
  time; the run completes with the exact result, no step is missing, and a
  step runs twice only if it was in flight at a SIGKILL;
* a `tcc worker` and manual `tcc resume` racing on crashed, waiting and
  sleeping runs: the same, plus every signal consumed once;
* `tcc approve` / `tcc signal` racing a `tcc resume --wait`: the value is
  consumed exactly once, by the matching wait, and the run completes;
* 50 runs checkpointing concurrently into one store with ``group``
  durability: no lost update (each journal and result exact), no deadlock.

Sizes (CI defaults in brackets): ``TCC_CONC_RACE_RUNS`` [3] runs raced by two
resumers, ``TCC_CONC_SIGNAL_ROUNDS`` [3] simultaneous approve/resume rounds,
``TCC_CONC_RUNS`` [50] concurrent group-commit runs; the slow tier uses
``TCC_SLOW_CONC_RACE_RUNS`` [25], ``TCC_SLOW_CONC_WORKER_RUNS`` [8 of each kind],
``TCC_SLOW_CONC_SIGNAL_ROUNDS`` [40], ``TCC_SLOW_CONC_PROCS`` [50] and
``TCC_SLOW_CONC_THREADS`` [300].
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import io
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests._support.runs import AGENTS, Cli
from tests._support.reliability import wait_until

LEDGER_AGENT = str(AGENTS / "ledger_agent.py")
WAIT_AGENT = str(AGENTS / "wait_agent.py")
STEPS = 20
EXPECTED = {"steps": STEPS, "total": sum(range(STEPS)), "salts": STEPS}
LOSER_MESSAGES = ("owned by", "already completed", "no longer pending", "nothing to resume")

FIG: collections.Counter[str] = collections.Counter()


@pytest.fixture(scope="module", autouse=True)
def _summary():
    """Print the module's figures once all its tests ran (visible with -s)."""
    yield
    print(
        f"\nconcurrency: race_runs={FIG['race_runs']} racers={FIG['racers']} "
        f"race_kills={FIG['race_kills']} completed={FIG['completed']} "
        f"duplicates={FIG['duplicates']} fenced_losers={FIG['fenced_losers']} "
        f"second_completions={FIG['second_completions']} "
        f"worker_resumes={FIG['worker_resumes']} manual_wins={FIG['manual_wins']} "
        f"signal_races={FIG['signal_races']} signals_consumed={FIG['signals_consumed']} "
        f"group_runs={FIG['group_runs']} group_commits={FIG['group_commits']} "
        f"group_txns={FIG['group_txns']} group_max_batch={FIG['group_max_batch']} "
        f"proc_runs={FIG['proc_runs']}"
    )


# --------------------------------------------------------------------- helpers




def ledger(path: Path, run_id: str | None = None) -> list[tuple[str, str]]:
    """(idempotency key, value) lines of a ledger, optionally only one run's."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if run_id is None or key.startswith(f"{run_id}:"):
            out.append((key, value))
    return out


def show(cli: Cli, run_id: str) -> dict:
    """`tcc show --json RUN` run in this process (same code and output, no process start-up)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = importlib.import_module("tcc.cli._main")._main(
            ["show", "--json", "--store", str(cli.store), run_id])
    assert code == 0, f"tcc show {run_id} exited {code}"
    return json.loads(buf.getvalue())


def listing(cli: Cli) -> list[dict]:
    """`tcc ls --json` run in this process."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = importlib.import_module("tcc.cli._main")._main(["ls", "--json", "--store", str(cli.store)])
    assert code == 0, f"tcc ls exited {code}"
    return json.loads(buf.getvalue())


def step_of(key: str) -> int:
    return int(key.rpartition(":")[2])


def kill_all(procs: list[subprocess.Popen[str]]) -> list[tuple[str, str]]:
    """SIGKILL every process still running and collect all outputs (closing the pipes)."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
    outs = []
    for p in procs:
        if p.stdout is not None and not p.stdout.closed:
            outs.append(p.communicate(timeout=60))
        else:  # already collected
            p.wait(timeout=60)
            outs.append(("", ""))
    return outs


def check_ledger_run(path: Path, run_id: str, kills: int, in_flight: set[str]) -> int:
    """No step missing; duplicates <= kills, only of keys in flight at a kill, same value.

    Returns the number of duplicate executions.
    """
    lines = ledger(path, run_id)
    by_key: dict[str, list[str]] = collections.defaultdict(list)
    for key, value in lines:
        by_key[key].append(value)
    assert sorted(by_key, key=step_of) == [f"{run_id}:{s}" for s in range(1, STEPS + 1)], by_key
    dups = {k: v for k, v in by_key.items() if len(v) > 1}
    duplicates = sum(len(v) - 1 for v in dups.values())
    assert duplicates <= kills, (run_id, dups, kills)
    assert set(dups) <= in_flight, f"{run_id}: {sorted(dups)} ran twice but only {sorted(in_flight)} were in flight"
    for key, values in dups.items():
        assert len(set(values)) == 1, f"{key} re-issued with other arguments: {values}"
    # one driver at a time: the ledger advances one step at a time (or repeats the re-issued one)
    steps = [step_of(k) for k, _ in lines]
    for a, b in zip(steps, steps[1:]):
        assert b in (a, a + 1), f"{run_id}: ledger went from step {a} to {b}: {steps}"
    return duplicates


def completed_events(doc: dict) -> int:
    return sum(1 for e in doc["events"] if e["kind"] == "completed")


# ------------------------------------------------------- (a) racing resumers


def race_resumers_until_done(cli: Cli, path: Path, run_id: str, rng: random.Random) -> dict:
    """SIGKILL a `tcc run`, then start two `tcc resume` at once, again and again until completed."""
    proc = cli.popen("run", "--run-id", run_id, LEDGER_AGENT)
    at = rng.randint(2, 8)
    wait_until(lambda: len(ledger(path, run_id)) >= at or proc.poll() is not None, "the first effects")
    kill_all([proc])
    kills, in_flight, cycles, winners = 1, {ledger(path, run_id)[-1][0]}, 0, 0
    while True:
        shown = show(cli, run_id)
        if shown["status"] == "completed":
            break
        assert cycles < 40, f"{run_id} did not complete after {cycles} races"
        cycles += 1
        before = len(ledger(path, run_id))
        racers = [cli.popen("resume", run_id), cli.popen("resume", run_id)]
        FIG["racers"] += 2
        if rng.random() < 0.5 and cycles < 6:  # kill both once the driving one made progress
            grow = rng.randint(1, 3)
            wait_until(lambda: len(ledger(path, run_id)) >= before + grow
                       or all(p.poll() is not None for p in racers), "a racer to make progress")
            outs = kill_all(racers)
            if any(p.returncode == -signal.SIGKILL for p in racers):
                kills += 1
                in_flight.add(ledger(path, run_id)[-1][0])
        else:
            outs = [p.communicate(timeout=120) for p in racers]
        codes = [p.returncode for p in racers]
        for code, (out, err) in zip(codes, outs):
            assert "internal error" not in err and "Traceback" not in err, err
            if code == 0:
                winners += 1
                assert "completed:" in out, out
            elif code in (1, 2):  # lost the claim: one clear line
                assert any(m in err for m in LOSER_MESSAGES), err
                FIG["fenced_losers"] += 1
        if -signal.SIGKILL not in codes:
            assert codes.count(0) >= 1, (codes, outs)  # someone drove it to the end
    FIG["race_kills"] += kills
    doc = show(cli, run_id)
    assert doc["status"] == "completed" and doc["result"] == EXPECTED, doc
    assert doc["effects"] == STEPS
    resumed = [e for e in doc["events"] if e["kind"] == "resumed"]
    taken = [e for e in doc["events"] if e["kind"] in ("taken_over", "reclaimed")]
    # every claim is one driver: at most one claim per race cycle, epochs strictly increasing,
    # and the run completed once (see the second-completion regression test below)
    again = completed_events(doc) - 1
    assert again == 0, [e["kind"] for e in doc["events"]]
    assert len(resumed) <= len(taken) <= cycles, (len(taken), len(resumed), cycles)
    assert [e["new_epoch"] for e in taken] == list(range(2, 2 + len(taken)))
    assert doc["epoch"] == 1 + len(taken)
    FIG["second_completions"] += again
    FIG["duplicates"] += check_ledger_run(path, run_id, kills, in_flight)
    FIG["completed"] += 1
    FIG["race_runs"] += 1
    return doc


def _race_runs(tmp_path: Path, runs: int, seed: int) -> None:
    path = tmp_path / "ledger.txt"
    cli = Cli(tmp_path, LEDGER=str(path), DELAY="0.02", STEPS=str(STEPS))
    rng = random.Random(seed)
    for r in range(runs):
        race_resumers_until_done(cli, path, f"race{seed}-{r}", rng)


@pytest.mark.timeout(240)
def test_two_resumers_race_for_a_crashed_run(tmp_path):
    """Two `tcc resume` racing for a SIGKILLed run: one driver at a time, exact result, dups only in flight."""
    _race_runs(tmp_path, int(os.environ.get("TCC_CONC_RACE_RUNS", "3")), 11)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_two_resumers_race_campaign(tmp_path):
    """Slow tier: many crashed runs raced by two resumers each (TCC_SLOW_CONC_RACE_RUNS)."""
    _race_runs(tmp_path, int(os.environ.get("TCC_SLOW_CONC_RACE_RUNS", "25")), 12)


HOLD_AGENT = '''
"""Loads slowly when HOLD is set (a heavy import), so a resumer can be held between reads."""
import os
import signal
import time

import tcc

if os.environ.get("HOLD"):
    open(os.environ["HOLD"] + ".loading", "w").close()
    while not os.path.exists(os.environ["HOLD"]):
        time.sleep(0.01)


@tcc.effect
def step(i):
    if os.environ.get("DIE_AT") == str(i):
        os.kill(os.getpid(), signal.SIGKILL)
    with open(os.environ["LEDGER"], "a") as fh:
        fh.write(f"{tcc.current().idempotency_key} {i}\\n")
    return i


async def main(n="3"):
    total = 0
    for i in range(int(n)):
        total += await step(i)
    return {"total": total, "finished_by": os.getpid()}
'''


# Regression test for a bug this campaign found: runtime.resume checked the run's status
# (get_run) before claim_run, and claim_run accepted a completed run, so a resumer that had
# read the run while it was running and claimed it after another resumer completed it
# resumed it into a second completion (epoch+1, completed->running->completed, result
# overwritten).  Fixed by claim_run refusing completed/cancelled runs in its transaction.
@pytest.mark.timeout(120)
def test_resumer_that_read_a_running_run_does_not_complete_it_again(tmp_path):
    """Regression (second completion): a resumer slowed before its claim does not complete a finished run again."""
    script = tmp_path / "conc_hold_agent.py"
    script.write_text(HOLD_AGENT)
    path = tmp_path / "ledger.txt"
    gate = tmp_path / "gate"
    cli = Cli(tmp_path, LEDGER=str(path))
    crashed = Cli(tmp_path, LEDGER=str(path), DIE_AT="2").run("run", "--run-id", "twice", str(script), "3")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert show(cli, "twice")["status"] == "running"
    slow = Cli(tmp_path, LEDGER=str(path), HOLD=str(gate)).popen("resume", "twice")
    try:
        wait_until(lambda: Path(str(gate) + ".loading").exists() or slow.poll() is not None,
                   "the slow resumer to load the script")
        done = cli.run("resume", "twice", check=True)
        assert "completed:" in done.stdout
        first = show(cli, "twice")
        assert first["status"] == "completed"
    finally:
        gate.touch()
        out, err = slow.communicate(timeout=60)
    second = show(cli, "twice")
    assert completed_events(second) == 1, [e["kind"] for e in second["events"]]
    assert (second["epoch"], second["result"]) == (first["epoch"], first["result"])
    # exit 2, as for a resume that saw the run finished before claiming it
    # (found by the kill campaign: losing the claim race exited 1)
    assert slow.returncode == 2 and "already completed" in err, (slow.returncode, out, err)


# ------------------------------------------------- (b) worker vs. manual resume


def _worker_race(tmp_path: Path, crashes: int, gates: int, naps: int, seed: int) -> None:
    path = tmp_path / "ledger.txt"
    cli = Cli(tmp_path, LEDGER=str(path), DELAY="0.02", STEPS=str(STEPS), TCC_SLEEP_INLINE="0.2")
    rng = random.Random(seed)
    crashed: dict[str, str] = {}  # run id -> key in flight at the kill
    for n in range(crashes):
        run_id = f"crash{n}"
        proc = cli.popen("run", "--run-id", run_id, LEDGER_AGENT)
        at = rng.randint(2, 10)
        wait_until(lambda: len(ledger(path, run_id)) >= at or proc.poll() is not None, "first effects")
        kill_all([proc])
        crashed[run_id] = ledger(path, run_id)[-1][0]
    for n in range(gates):
        parked = json.loads(cli.run("run", "--json", "--run-id", f"gate{n}", f"{WAIT_AGENT}:gated",
                                    check=True).stdout)
        assert parked["status"] == "waiting"
        cli.run("approve", f"gate{n}", check=True)
    for n in range(naps):
        parked = json.loads(cli.run("run", "--json", "--run-id", f"nap{n}", f"{WAIT_AGENT}:sleeper",
                                    "0.6", check=True).stdout)
        assert parked["status"] == "sleeping"
    runs = [*crashed, *(f"gate{n}" for n in range(gates)), *(f"nap{n}" for n in range(naps))]
    worker = cli.popen("worker", "--poll", "0.2", "--concurrency", "4")
    manual: list[tuple[str, subprocess.Popen[str]]] = []
    try:
        for run_id in rng.sample(runs, len(runs)):  # manual resumes race the worker's polls
            time.sleep(rng.uniform(0, 0.25))
            manual.append((run_id, cli.popen("resume", run_id)))
        outs = [(run_id, p, *p.communicate(timeout=120)) for run_id, p in manual]

        def all_done():
            listed = listing(cli)
            return all(r["status"] == "completed" for r in listed) and len(listed) == len(runs)

        wait_until(all_done, "every run to complete", timeout=60 + 10 * len(runs), pause=0.2)
    finally:
        worker.send_signal(signal.SIGTERM)
        _wout, werr = worker.communicate(timeout=60)
    assert worker.returncode == 0, werr
    for run_id, p, out, err in outs:
        assert "internal error" not in err and "Traceback" not in err, (run_id, err)
        if p.returncode == 0:
            if "completed:" in out:
                FIG["manual_wins"] += 1
            else:
                assert "sleeping until" in out, (run_id, out)  # resumed before its timer was due
        else:
            assert any(m in err for m in LOSER_MESSAGES), (run_id, p.returncode, err)
            FIG["fenced_losers"] += 1
    FIG["worker_resumes"] += werr.count("worker: resuming")
    FIG["racers"] += len(manual)
    for run_id, key in crashed.items():
        doc = show(cli, run_id)
        assert doc["result"] == EXPECTED, doc
        FIG["second_completions"] += completed_events(doc) - 1
        assert completed_events(doc) == 1, [e["kind"] for e in doc["events"]]
        FIG["duplicates"] += check_ledger_run(path, run_id, 1, {key})
        FIG["completed"] += 1
    for n in range(gates):
        doc = show(cli, f"gate{n}")
        assert doc["result"] == ["did prepare", True, "did deploy"] and doc["waits"] == []
        assert sum(e["kind"] == "wait_satisfied" for e in doc["events"]) == 1
        assert completed_events(doc) == 1
        assert [v for k, v in ledger(path, f"gate{n}")] == ["prepare", "deploy"]
        FIG["signals_consumed"] += 1
        FIG["completed"] += 1
    for n in range(naps):
        doc = show(cli, f"nap{n}")
        assert doc["result"] == "did after" and completed_events(doc) == 1
        assert [v for k, v in ledger(path, f"nap{n}")] == ["before", "after"]
        FIG["completed"] += 1


@pytest.mark.timeout(240)
def test_worker_and_manual_resume_race_on_crashed_waiting_and_sleeping_runs(tmp_path):
    """A `tcc worker` and manual `tcc resume`s race on crashed, approved and due runs: each runs once."""
    _worker_race(tmp_path, 3, 2, 2, 21)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_worker_and_manual_resume_race_campaign(tmp_path):
    """Slow tier: the worker/manual race on TCC_SLOW_CONC_WORKER_RUNS runs of each kind."""
    n = int(os.environ.get("TCC_SLOW_CONC_WORKER_RUNS", "8"))
    _worker_race(tmp_path, n, n, n, 22)


# ------------------------------------------------ (c) signals racing a resume


def _consumed_once(cli: Cli, path: Path, run_id: str) -> None:
    doc = show(cli, run_id)
    assert doc["status"] == "completed", doc
    assert doc["result"] == ["did prepare", True, "did deploy"], doc["result"]
    assert doc["waits"] == []
    kinds = [e["kind"] for e in doc["events"]]
    assert kinds.count("wait_satisfied") == 1 and kinds.count("approved") == 1, kinds
    assert kinds.count("completed") == 1, kinds
    assert [v for _k, v in ledger(path, run_id)] == ["prepare", "deploy"]
    again = cli.run("approve", run_id)
    assert again.returncode == 2, again.stderr  # nothing left to answer
    FIG["signals_consumed"] += 1
    FIG["signal_races"] += 1


def _finish(cli: Cli, run_id: str, proc: subprocess.Popen[str]) -> None:
    """Collect a resume; if it parked again before the answer came, resume once more (a
    second resumer of the round, still running, may take the run first: that resume then
    loses like any other)."""
    out, err = proc.communicate(timeout=120)
    assert proc.returncode in (0, 1, 2), err
    if proc.returncode != 0:  # lost the claim, or came after the run had completed
        assert any(m in err for m in LOSER_MESSAGES), err
    assert "internal error" not in err and "Traceback" not in err, err
    if show(cli, run_id)["status"] == "waiting":
        again = cli.run("resume", run_id)
        if again.returncode != 0:  # another resumer of the same round got there first
            assert again.returncode in (1, 2), again.stderr
            assert any(m in again.stderr for m in LOSER_MESSAGES), again.stderr


@pytest.mark.timeout(240)
def test_approval_racing_a_polling_resume_is_consumed_once(tmp_path):
    """`tcc approve` during, before and at the same time as `tcc resume --wait`: consumed once, completed."""
    path = tmp_path / "ledger.txt"
    cli = Cli(tmp_path, LEDGER=str(path))

    def park(run_id: str) -> None:
        out = json.loads(cli.run("run", "--json", "--run-id", run_id, f"{WAIT_AGENT}:gated",
                                 check=True).stdout)
        assert out["status"] == "waiting"

    # approve while the resume polls
    park("during")
    proc = cli.popen("resume", "--wait", "10", "during")
    wait_until(lambda: any(e["kind"] == "resumed" for e in show(cli, "during")["events"]), "the resume")
    cli.run("approve", "during", check=True)
    _finish(cli, "during", proc)
    _consumed_once(cli, path, "during")

    # the reverse order: approve first, then the polling resume
    park("before")
    cli.run("approve", "before", check=True)
    _finish(cli, "before", cli.popen("resume", "--wait", "5", "before"))
    _consumed_once(cli, path, "before")

    _simultaneous_rounds(cli, path, int(os.environ.get("TCC_CONC_SIGNAL_ROUNDS", "3")), 31)


def _simultaneous_rounds(cli: Cli, path: Path, rounds: int, seed: int) -> None:
    """Approve and one or two polling resumers start together; the approval lands anywhere."""
    rng = random.Random(seed)
    for n in range(rounds):
        run_id = f"same{seed}-{n}"
        out = json.loads(cli.run("run", "--json", "--run-id", run_id, f"{WAIT_AGENT}:gated",
                                 check=True).stdout)
        assert out["status"] == "waiting"
        resumers = [cli.popen("resume", "--wait", "10", run_id) for _ in range(1 + n % 2)]
        time.sleep(rng.uniform(0, 0.3))  # where the approval lands in the resumers' startup
        cli.run("approve", run_id, check=True)
        for p in resumers:
            _finish(cli, run_id, p)
        _consumed_once(cli, path, run_id)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_approval_racing_resumes_campaign(tmp_path):
    """Slow tier: TCC_SLOW_CONC_SIGNAL_ROUNDS approve/resume races, each consumed exactly once."""
    path = tmp_path / "ledger.txt"
    _simultaneous_rounds(Cli(tmp_path, LEDGER=str(path)),
                         path, int(os.environ.get("TCC_SLOW_CONC_SIGNAL_ROUNDS", "40")), 32)


@pytest.mark.timeout(180)
def test_signals_racing_a_polling_resume_each_go_to_their_wait(tmp_path):
    """`tcc signal` alpha, beta, alpha racing `tcc resume --wait`: each wait gets its own value once."""
    path = tmp_path / "ledger.txt"
    cli = Cli(tmp_path, LEDGER=str(path))
    rng = random.Random(41)
    for n in range(2):
        run_id = f"sig{n}"
        out = json.loads(cli.run("run", "--json", "--run-id", run_id, f"{WAIT_AGENT}:two_signals",
                                 check=True).stdout)
        assert out["status"] == "waiting"
        proc = cli.popen("resume", "--wait", "15", run_id)
        time.sleep(rng.uniform(0, 0.4))
        for name, value in (("alpha", '"a1"'), ("beta", '{"b": 2}'), ("alpha", '"a2"')):
            cli.run("signal", run_id, name, "--value", value, check=True)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        while show(cli, run_id)["status"] == "waiting":  # parked between two signals: go on
            cli.run("resume", run_id, check=True)
        doc = show(cli, run_id)
        assert doc["result"] == ["a1", {"b": 2}, "a2", "did done"], doc
        kinds = [e["kind"] for e in doc["events"]]
        assert kinds.count("wait_satisfied") == 3, kinds
        assert [v for _k, v in ledger(path, run_id)] == ["done"]
        FIG["signals_consumed"] += 3
        FIG["signal_races"] += 1


# ------------------------------------------------- (d) group commit, 50 runs

GROUP_AGENT = '''
"""A short agent: STEPS effects whose results name the run and the step."""
import tcc


@tcc.effect
def note(tag, i):
    return f"{tag}:{i}"


async def main(tag, steps="8"):
    out = []
    for i in range(int(steps)):
        out.append(await note(tag, i))
        if i % 3 == 2:
            await tcc.checkpoint()
    return out
'''


def _check_group_run(store, run_id: str, tag: str, steps: int) -> None:
    """The run's journal, snapshots and result are exactly what its agent did."""
    from tcc.capture import load_payload

    run = store.get_run(run_id)
    assert run.status == "completed", (run_id, run.status, run.error)
    assert json.loads(run.result)["value"] == [f"{tag}:{i}" for i in range(steps)]
    journal = store.journal(run_id)
    assert len(journal) == 2 * steps, (run_id, len(journal))
    for i in range(steps):
        intent, done = journal[2 * i], journal[2 * i + 1]
        assert intent.kind == "intent" and intent.idempotency_key == f"{run_id}:{i + 1}"
        assert done.kind == "completion" and done.intent_seq == intent.seq
        assert load_payload(done.result) == f"{tag}:{i}"
    assert store.snapshots(run_id)[-1].journal_len == 2 * steps


def _group_threads(tmp_path: Path, runs: int, steps: int) -> None:
    script = tmp_path / "conc_group_agent.py"
    script.write_text(GROUP_AGENT)
    try:
        _group_threads_in(tmp_path, script, runs, steps)
    finally:  # another test may load a script of the same name from its own folder
        sys.modules.pop("__tcc_script_conc_group_agent", None)
    # another process sees every run completed: the acknowledged commits are on disk
    listed = json.loads(Cli(tmp_path).run("ls", "--json", check=True).stdout)
    assert sorted(r["id"] for r in listed if r["status"] == "completed") == sorted(f"g{k}" for k in range(runs))


def _group_threads_in(tmp_path: Path, script: Path, runs: int, steps: int) -> None:
    from tcc import runtime
    from tcc.store import open_store

    with open_store(tmp_path / "store", durability="group") as store:
        # loaded once up front: cold concurrent loads have their own regression test below
        runtime.load_script(str(script))
        handle = getattr(getattr(store, "_scope", None), "env", None)
        batches: list[int] = []
        if handle is not None and hasattr(handle, "_run"):  # count transactions per batch (figure only)
            real = handle._run

            def counting(fns, nested=False):
                batches.append(len(fns))
                return real(fns, nested)

            handle._run = counting
        barrier = threading.Barrier(runs)
        outcomes: dict[int, object] = {}
        errors: dict[int, BaseException] = {}

        def go(k: int) -> None:
            try:
                barrier.wait(timeout=60)
                outcomes[k] = runtime.start(store, str(script), [f"t{k}", str(steps)], run_id=f"g{k}")
            except BaseException as exc:  # reported below
                errors[k] = exc

        threads = [threading.Thread(target=go, args=(k,), daemon=True) for k in range(runs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=150)
        assert not any(t.is_alive() for t in threads), "deadlock: a run never finished"
        assert not errors, {k: repr(e) for k, e in list(errors.items())[:3]}
        for k in range(runs):
            assert outcomes[k].status == "completed", outcomes[k]
            _check_group_run(store, f"g{k}", f"t{k}", steps)
        if handle is not None and "_run" in vars(handle):
            del handle._run
    FIG["group_runs"] += runs
    FIG["group_commits"] += sum(batches)
    FIG["group_txns"] += len(batches)
    FIG["group_max_batch"] = max(FIG["group_max_batch"], max(batches, default=0))


@pytest.mark.timeout(300)
def test_fifty_concurrent_runs_group_commit_into_one_store(tmp_path):
    """50 runs in threads share one group-durability store: every journal and result exact, no deadlock."""
    _group_threads(tmp_path, int(os.environ.get("TCC_CONC_RUNS", "50")), 8)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_many_concurrent_runs_group_commit_threads(tmp_path):
    """Slow tier: TCC_SLOW_CONC_THREADS runs in threads on one group-durability store."""
    _group_threads(tmp_path, int(os.environ.get("TCC_SLOW_CONC_THREADS", "300")), 12)


def _group_processes(tmp_path: Path, runs: int, batch: int, steps: int) -> None:
    from tcc.store import open_store

    script = tmp_path / "conc_group_agent.py"
    script.write_text(GROUP_AGENT)
    cli = Cli(tmp_path)
    # created up front: concurrent first opens of a new store hit the bug in the xfail test below
    open_store(cli.store).close()
    for start in range(0, runs, batch):
        procs = {k: cli.popen("run", "--durability", "group", "--json", "--run-id", f"p{k}", str(script),
                              f"t{k}", str(steps)) for k in range(start, min(runs, start + batch))}
        try:
            outs = {k: p.communicate(timeout=300) for k, p in procs.items()}
        finally:
            kill_all(list(procs.values()))
        for k, p in procs.items():
            assert p.returncode == 0, outs[k][1]
            assert json.loads(outs[k][0])["result"] == [f"t{k}:{i}" for i in range(steps)]
    with open_store(cli.store, create=False) as store:
        for k in range(runs):
            _check_group_run(store, f"p{k}", f"t{k}", steps)
    FIG["proc_runs"] += runs


@pytest.mark.timeout(300)
def test_concurrent_run_processes_with_group_durability(tmp_path):
    """Ten `tcc run --durability group` processes at once on one store: every journal and result exact."""
    _group_processes(tmp_path, 10, 10, 8)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_fifty_run_processes_with_group_durability(tmp_path):
    """Slow tier: TCC_SLOW_CONC_PROCS `tcc run --durability group` processes, all at once."""
    n = int(os.environ.get("TCC_SLOW_CONC_PROCS", "50"))
    _group_processes(tmp_path, n, n, 20)


LOADING_AGENT = '''
"""Its import takes a while (held by a gate file), like a script importing heavy libraries."""
import os
import time

import tcc

open(os.environ["CONC_GATE"] + ".loading", "w").close()
while not os.path.exists(os.environ["CONC_GATE"]):
    time.sleep(0.01)


@tcc.effect
def note(i):
    return i


async def main(tag):
    return [tag, await note(1)]
'''


# Regression test for a bug this campaign found: load_script put the module into
# sys.modules before executing it, without a lock, so a second thread starting a run of the
# same script while the first was still importing it got the half-initialised module and
# failed with UsageError "... has no function 'main'".  Fixed by a load lock.
@pytest.mark.timeout(120)
def test_runs_of_one_script_started_from_two_threads_while_it_loads(tmp_path, monkeypatch):
    """Regression (half-loaded script): two threads start runs of a script still importing; both complete."""
    script = tmp_path / "conc_loading_agent.py"
    script.write_text(LOADING_AGENT)
    gate = tmp_path / "gate"
    monkeypatch.setenv("CONC_GATE", str(gate))
    try:
        got = _two_threads_while_loading(tmp_path, script, gate)
    finally:
        sys.modules.pop("__tcc_script_conc_loading_agent", None)
    assert got == {"first": ["first", 1], "second": ["second", 1]}, got


def _two_threads_while_loading(tmp_path: Path, script: Path, gate: Path) -> dict[str, object]:
    from tcc import runtime
    from tcc.store import open_store

    with open_store(tmp_path / "store", durability="group") as store:
        got: dict[str, object] = {}

        def go(tag: str) -> None:
            try:
                got[tag] = runtime.start(store, str(script), [tag], run_id=tag).result
            except BaseException as exc:  # reported below
                got[tag] = exc

        first = threading.Thread(target=go, args=("first",), daemon=True)
        first.start()
        try:
            wait_until(lambda: Path(str(gate) + ".loading").exists(), "the first import")
            second = threading.Thread(target=go, args=("second",), daemon=True)
            second.start()
            second.join(timeout=5)  # fails at once if it sees the half-loaded module
        finally:
            gate.touch()
        first.join(timeout=60)
        second.join(timeout=60)
    return got


OPENER = """
import sys

import lmdb

real_open = lmdb.open


class PausingEnv:
    \"\"\"Forwards to the real environment; holds the first read transaction until told to go.\"\"\"

    def __init__(self, env):
        self._env = env
        self._paused = False

    def __getattr__(self, name):
        return getattr(self._env, name)

    def begin(self, *args, **kwargs):
        txn = self._env.begin(*args, **kwargs)
        if not self._paused and not kwargs.get("write"):
            self._paused = True
            print("paused", flush=True)
            sys.stdin.readline()
        return txn


lmdb.open = lambda *a, **k: PausingEnv(real_open(*a, **k))
from tcc.store import open_store

try:
    with open_store(sys.argv[1]) as store:
        print("ok", len(store.list_runs()), flush=True)
except Exception as exc:
    print("error", type(exc).__name__, exc, flush=True)
"""


@pytest.mark.timeout(120)
def test_processes_opening_a_new_store_at_once_all_succeed(tmp_path):
    """A process opening a brand-new store while another initialises it opens it normally."""
    store = tmp_path / "store"
    opener = subprocess.Popen([sys.executable, "-c", OPENER, str(store)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert opener.stdout.readline().strip() == "paused", opener.stderr.read()
        # while the first opener looks at the empty file, a second process initialises the store
        other = Cli(tmp_path).run("ls", "--store", str(store))
        assert other.returncode == 0, other.stderr
        out, err = opener.communicate("go\n", timeout=60)
    finally:
        kill_all([opener])
    assert out.strip().startswith("ok"), (out, err)
