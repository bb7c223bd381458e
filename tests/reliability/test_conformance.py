"""The checkpoint/interrupt/resume contract, one table row (and one test id) per clause.

Every clause drives the real CLI (`python -m tcc ...`) in subprocesses against a
private store; the store is only read in-process (journal, signals, snapshots).
Each clause runs on both backends (issue 19): ``test_clause[C1-lmdb]`` on an LMDB
store, ``test_clause[C1-postgres]`` on a PostgreSQL store (a fresh database, its
key file given to every command as ``TCC_STORE_KEY_FILE``).
docs/conformance.md lists the same clauses and the
test that enforces each; `test_conformance_doc_lists_every_clause` keeps the two
in step.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import pathlib
import re
import signal
import time
from typing import Callable, Protocol

import pytest
from tests._support.reliability import (
    LEDGER_AGENT,
    WAIT,
    assert_clear_error,
    events,
    journal_len,
    ledger,
    outcome,
    store_of,
)
from tests._support.backends import BACKENDS
from tests._support.pgstores import make_pg_store
from tests._support.runs import Cli


DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "conformance.md"


class NewCli(Protocol):
    """``new_cli(**env)``: a Cli on the clause's store (its backend), with extra environment."""

    def __call__(self, **env: str) -> Cli: ...


def wait_until(predicate: Callable[[], bool], timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def completed_keys(cli: Cli, run_id: str, upto: int | None = None) -> list[str]:
    """Idempotency keys of the effects whose completion is in journal[0:upto]."""
    with store_of(cli) as store:
        records = store.journal(run_id)
    intents = {r.seq: r for r in records if r.kind == "intent"}
    return [intents[r.intent_seq].idempotency_key for r in records
            if r.kind == "completion" and (upto is None or r.seq < upto) and r.intent_seq in intents]


def worker_until(cli: Cli, done: Callable[[], bool], what: str) -> str:
    """Run `tcc worker --poll 0.1` until ``done()``, give it a few more polls, SIGTERM it; return its log.

    (Not `tcc worker --once`: it SIGTERMs the runs it has just started, see
    test_worker_once_waits_for_the_runs_it_started.)
    """
    worker = cli.popen("worker", "--poll", "0.1")
    try:
        wait_until(done, what=what)
        time.sleep(0.5)  # more polls: time to (wrongly) pick up anything else
    finally:
        worker.send_signal(signal.SIGTERM)
        _out, err = worker.communicate(timeout=120)
    assert worker.returncode == 0, err
    return err


def status_is(cli: Cli, run_id: str, status: str) -> Callable[[], bool]:
    def check() -> bool:
        shown = cli.run("show", "--json", run_id)
        return shown.returncode == 0 and json.loads(shown.stdout)["status"] == status
    return check


def newest_snapshot(cli: Cli, run_id: str) -> dict:
    return cli.show(run_id)["snapshots"][-1]


def parent_view(cli: Cli, run_id: str) -> dict:
    """Everything a fork must leave untouched in its parent."""
    doc = cli.show(run_id)
    with store_of(cli) as store:
        signals = {w["id"]: store.signal_state(run_id, w["id"]) for w in doc["waits"]}
        jlen = len(store.journal(run_id))
    return {"status": doc["status"], "result": doc["result"], "effects": doc["effects"],
            "snapshots": doc["snapshots"], "journal": jlen, "epoch": doc["epoch"],
            "waits": doc["waits"], "signals": signals}


# ---------------------------------------------------------------------- C1


def c1_resume_from_newest_checkpoint(tmp: pathlib.Path, new_cli: NewCli) -> None:
    """SIGKILLed runs resume from their newest snapshot: effects it covers never run again."""
    book = tmp / "ledger.txt"
    base = {"LEDGER": str(book), "STEPS": "8"}
    cli = new_cli(**base)
    expected = {"steps": 8, "total": sum(range(8)), "salts": 8}

    # (a) a deterministic kill -9 inside step 5 (before its ledger line is written)
    died = new_cli(**base, DIE_AT="5").run("run", "--run-id", "c1", LEDGER_AGENT)
    assert died.returncode == -9, (died.returncode, died.stderr)
    assert cli.show("c1")["status"] == "running"  # the dead owner left it running
    newest = newest_snapshot(cli, "c1")
    covered = completed_keys(cli, "c1", newest["journal"])
    assert covered == [f"c1:{i}" for i in range(1, 6)]  # steps 0..4 are in the newest snapshot
    assert [k for k, _ in ledger(book)] == covered
    done = outcome(cli.run("resume", "--json", "c1"))
    assert done["status"] == "completed" and done["result"] == expected
    resumed = events(cli, "c1", "resumed")
    assert [(e["snapshot"], e["journal"]) for e in resumed] == [(newest["number"], newest["journal"])]
    keys = [k for k, _ in ledger(book)]
    assert keys == [f"c1:{i}" for i in range(1, 9)], keys  # nothing ran twice, nothing was lost

    # (b) a kill -9 from outside at an arbitrary moment of a slower run
    book2 = tmp / "ledger2.txt"
    slow = new_cli(LEDGER=str(book2), STEPS="12", DELAY="0.08")
    proc = slow.popen("run", "--run-id", "c1b", LEDGER_AGENT)
    try:
        wait_until(lambda: len(ledger(book2)) >= 3 or proc.poll() is not None, what="three effects")
        assert proc.poll() is None, "the run finished before it could be killed"
    finally:
        proc.kill()
        proc.communicate()
    newest = newest_snapshot(slow, "c1b")
    covered = completed_keys(slow, "c1b", newest["journal"])
    before = [k for k, _ in ledger(book2)]
    assert set(covered) <= set(before) and len(set(before) - set(covered)) <= 1  # <= 1 in flight
    done = outcome(slow.run("resume", "--json", "c1b"))
    assert done["status"] == "completed"
    assert done["result"] == {"steps": 12, "total": sum(range(12)), "salts": 12}
    assert [e["snapshot"] for e in events(slow, "c1b", "resumed")] == [newest["number"]]
    counts = collections.Counter(k for k, _ in ledger(book2))
    assert all(counts[k] == 1 for k in covered), counts  # covered effects never re-run
    assert sorted(counts) == sorted(f"c1b:{i}" for i in range(1, 13))
    assert sum(counts.values()) - len(counts) <= 1  # only an in-flight effect may repeat
    values = collections.defaultdict(set)
    for k, v in ledger(book2):
        values[k].add(v)
    assert all(len(v) == 1 for v in values.values()), values  # re-issued with recorded args


# ---------------------------------------------------------------------- C2


def c2_interrupt_value_consumed_once_by_matching_wait(tmp: pathlib.Path, new_cli: NewCli) -> None:
    """Signals sent in the opposite order reach the waits they name, each exactly once."""
    book = tmp / "ledger.txt"
    cli = new_cli(LEDGER=str(book))
    assert outcome(cli.run("run", "--json", "--run-id", "c2", f"{WAIT}:two_signals"))["status"] == "waiting"

    def states() -> dict[str, str | None]:
        with store_of(cli) as store:
            return {w: store.signal_state("c2", w) for w in ("alpha@1", "beta@1", "alpha@2", "beta@2")}

    # beta first, although the run waits for alpha first: kept, not consumed by the alpha wait
    assert "delivered beta@1" in cli.run("signal", "c2", "beta", "--value", '{"b": 2}', check=True).stdout
    parked = outcome(cli.run("resume", "--json", "c2"))
    assert parked["status"] == "waiting" and parked["parked"]["id"] == "alpha@1"
    assert states() == {"alpha@1": None, "beta@1": "pending", "alpha@2": None, "beta@2": None}

    assert "delivered alpha@1" in cli.run("signal", "c2", "alpha", "--value", '"A1"', check=True).stdout
    parked = outcome(cli.run("resume", "--json", "c2"))  # takes alpha@1 and beta@1, parks at alpha@2
    assert parked["status"] == "waiting" and parked["parked"]["id"] == "alpha@2"
    assert states() == {"alpha@1": "consumed", "beta@1": "consumed", "alpha@2": None, "beta@2": None}

    # a second resume with nothing new re-consumes nothing: still parked at alpha@2
    again = outcome(cli.run("resume", "--json", "c2"))
    assert again["status"] == "waiting" and again["parked"]["id"] == "alpha@2"
    assert [w["id"] for w in cli.show("c2")["waits"]] == ["alpha@2"]
    assert states()["alpha@2"] is None

    assert "delivered alpha@2" in cli.run("signal", "c2", "alpha", "--value", '"A2"', check=True).stdout
    done = outcome(cli.run("resume", "--json", "c2"))
    assert done["status"] == "completed"
    assert done["result"] == ["A1", {"b": 2}, "A2", "did done"]
    assert states() == {"alpha@1": "consumed", "beta@1": "consumed", "alpha@2": "consumed", "beta@2": None}
    satisfied = collections.Counter(e["id"] for e in events(cli, "c2", "wait_satisfied"))
    assert satisfied == {"alpha@1": 1, "beta@1": 1, "alpha@2": 1}
    assert_clear_error(cli.run("resume", "c2"), "already completed")  # no second consumption
    assert [v for _, v in ledger(book)] == ["done"]


# ---------------------------------------------------------------------- C3

WRITER_AGENT = '''\
import os

import tcc


@tcc.effect
def write(what):
    with open(os.environ["LEDGER"], "a") as fh:
        fh.write(f"{tcc.current().idempotency_key} {what}\\n")
    return what


async def main():
    done = []
    for i in range(3):
        done.append(await write(f"w{i}"))
    ok = await tcc.approval("ship it?")
    done.append(await write("after" if ok else "rolled back"))
    return done
'''


def c3_writes_before_interrupt_are_durable(tmp: pathlib.Path, new_cli: NewCli) -> None:
    """Effects before a tcc.approval are journaled and in the ledger once the process is gone, and never repeat."""
    script = tmp / "writer_agent.py"
    script.write_text(WRITER_AGENT)
    for run_id, how in (("c3park", "park"), ("c3kill", "kill")):
        book = tmp / f"{run_id}.txt"
        cli = new_cli(LEDGER=str(book))
        if how == "park":  # the run parks at the approval and its process exits
            parked = outcome(cli.run("run", "--json", "--run-id", run_id, str(script)))
            assert parked["status"] == "waiting"
        else:  # the run polls for its approval in-process and is SIGKILLed there
            proc = cli.popen("run", "--json", "--wait", "120", "--run-id", run_id, str(script))
            try:
                wait_until(lambda: cli.run("show", run_id).returncode == 0
                           and events(cli, run_id, "wait") != [], what="the approval wait")
                assert proc.poll() is None
            finally:
                proc.kill()
                proc.communicate()
            assert cli.show(run_id)["status"] == "running"
        writes = [f"{run_id}:{i}" for i in (1, 2, 3)]
        assert ledger(book) == [(k, f"w{i}") for i, k in enumerate(writes)]
        assert completed_keys(cli, run_id) == writes  # durable in the journal ...
        assert set(writes) <= set(completed_keys(cli, run_id, newest_snapshot(cli, run_id)["journal"]))
        assert cli.show(run_id)["effects"] == 3  # ... and visible to any reader
        cli.run("approve", run_id, check=True)
        done = outcome(cli.run("resume", "--json", run_id))
        assert done["status"] == "completed" and done["result"] == ["w0", "w1", "w2", "after"]
        assert [v for _, v in ledger(book)] == ["w0", "w1", "w2", "after"]  # no write repeated


# ---------------------------------------------------------------------- C4

NOTE_AGENT = '''\
import os

import tcc


async def main():
    note = await tcc.wait_for("note")
    return {"note": note, "resumer": os.getpid()}
'''


def c4_resume_value_crosses_processes(tmp: pathlib.Path, new_cli: NewCli) -> None:
    """A signal delivered by one process is seen by a resumer in another: a later one, a live poller, a worker's child."""
    script = tmp / "note_agent.py"
    script.write_text(NOTE_AGENT)
    cli = new_cli()
    for run_id in ("c4later", "c4live", "c4worker"):
        assert outcome(cli.run("run", "--json", "--run-id", run_id, str(script)))["status"] == "waiting"

    # 1. process A delivers and exits; process B, started afterwards, resumes
    cli.run("signal", "c4later", "note", "--value", '{"from": "A"}', check=True)
    proc_b = cli.popen("resume", "--json", "c4later")
    out, err = proc_b.communicate(timeout=120)
    assert proc_b.returncode == 0, err
    assert json.loads(out)["result"] == {"note": {"from": "A"}, "resumer": proc_b.pid}

    # 2. process B is already polling in-process when process A delivers
    proc_b = cli.popen("resume", "--json", "--wait", "120", "c4live")
    try:
        wait_until(lambda: any(e.get("pid") == proc_b.pid for e in events(cli, "c4live", "resumed")),
                   what="the resumer to start polling")
        assert proc_b.poll() is None
        cli.run("signal", "c4live", "note", "--value", '"while you wait"', check=True)
        out, err = proc_b.communicate(timeout=120)
    finally:
        if proc_b.poll() is None:
            proc_b.kill()
            proc_b.communicate()
    assert proc_b.returncode == 0, err
    assert json.loads(out)["result"] == {"note": "while you wait", "resumer": proc_b.pid}

    # 3. process A delivers; a worker sees it and resumes the run in a child process
    signal_proc = cli.popen("signal", "c4worker", "note", "--value", "42")
    signal_proc.communicate(timeout=120)
    assert signal_proc.returncode == 0
    log = worker_until(cli, status_is(cli, "c4worker", "completed"), "the worker to finish c4worker")
    assert "resuming c4worker (signal arrived)" in log, log
    doc = cli.show("c4worker")
    assert doc["status"] == "completed" and doc["result"]["note"] == 42
    assert doc["result"]["resumer"] != signal_proc.pid


# ---------------------------------------------------------------------- C5


def c5_fork_never_affects_parent(tmp: pathlib.Path, new_cli: NewCli) -> None:
    """A fork (with --set) resumed to completion leaves the parent's status, result, journal, snapshots and signals alone."""
    book = tmp / "ledger.txt"
    cli = new_cli(LEDGER=str(book))
    assert outcome(cli.run("run", "--json", "--run-id", "p", f"{WAIT}:gated"))["status"] == "waiting"
    cli.run("approve", "p", check=True)  # the parent's answer is pending: the fork must not take it
    before = parent_view(cli, "p")
    assert before["signals"] == {"approval@1": "pending"}
    lines_before = ledger(book)

    forked = json.loads(cli.run("fork", "--json", "p", "--set", 'before="forked"', "--run-id", "f",
                                check=True).stdout)
    assert forked == {"id": "f", "parent": "p"}
    assert parent_view(cli, "p") == before
    assert [w["signal"] for w in cli.show("f")["waits"]] == ["not sent"]  # the fork waits for its own
    cli.run("approve", "f", check=True)
    done = outcome(cli.run("resume", "--json", "f"))
    assert done["status"] == "completed" and done["result"] == ["forked", True, "did deploy"]

    assert parent_view(cli, "p") == before  # status, result, journal, snapshots, epoch, signal
    assert [ln for ln in ledger(book) if ln[0].startswith("p:")] == lines_before
    assert [ln for ln in ledger(book) if ln[0].startswith("f:")] == [("f:3", "deploy")]

    parent = outcome(cli.run("resume", "--json", "p"))  # the parent still completes, on its own
    assert parent["status"] == "completed" and parent["result"] == ["did prepare", True, "did deploy"]
    assert cli.show("f")["result"] == ["forked", True, "did deploy"]
    assert ledger(book) == [("p:1", "prepare"), ("f:3", "deploy"), ("p:3", "deploy")]


# ---------------------------------------------------------------------- C6


def c6_completed_run_cannot_complete_twice(tmp: pathlib.Path, new_cli: NewCli) -> None:
    """resume (plain, --steal, --strategy replay), run --run-id and the worker all refuse a completed run."""
    book = tmp / "ledger.txt"
    cli = new_cli(LEDGER=str(book), STEPS="3")
    first = outcome(cli.run("run", "--json", "--run-id", "c6", LEDGER_AGENT))
    assert first["status"] == "completed"
    shown = cli.show("c6")
    jlen, lines = journal_len(cli, "c6"), ledger(book)
    assert len(lines) == 3

    for args in (("resume", "c6"), ("resume", "--json", "c6"), ("resume", "--steal", "c6"),
                 ("resume", "--strategy", "replay", "c6")):
        assert_clear_error(cli.run(*args), "already completed", codes=(2,))
    assert_clear_error(cli.run("run", "--run-id", "c6", LEDGER_AGENT), "is completed", codes=(2,))
    book2 = tmp / "control.txt"  # a crashed control run shows that the worker is at work
    died = new_cli(LEDGER=str(book2), STEPS="3", DIE_AT="1").run("run", "--run-id", "c6control", LEDGER_AGENT)
    assert died.returncode == -9
    log = worker_until(cli, status_is(cli, "c6control", "completed"), "the worker to finish c6control")
    assert "resuming c6control" in log and not re.search(r"\bc6\b", log), log

    after = cli.show("c6")
    assert after["status"] == "completed" and after["result"] == first["result"]
    assert after["epoch"] == shown["epoch"] and after["snapshots"] == shown["snapshots"]
    assert [e["kind"] for e in after["events"]].count("completed") == 1
    assert journal_len(cli, "c6") == jlen  # nothing ran
    assert [ln for ln in ledger(book) if ln[0].startswith("c6:")] == lines


# ---------------------------------------------------------------------- C7


def cancel(cli: Cli, run_id: str) -> int:
    """Cancel a run with `tcc cancel`; return its new epoch."""
    doc = json.loads(cli.run("cancel", "--json", run_id, check=True).stdout)
    assert doc["status"] == "cancelled", doc
    return int(doc["epoch"])


def c7_cancelled_run_stays_cancelled(tmp: pathlib.Path, new_cli: NewCli) -> None:
    """A cancelled run (a waiting one with its answer pending, a crashed one) is left cancelled by resume, run and the worker."""
    book = tmp / "ledger.txt"
    cli = new_cli(LEDGER=str(book), STEPS="6")
    assert outcome(cli.run("run", "--json", "--run-id", "c7wait", f"{WAIT}:gated"))["status"] == "waiting"
    cli.run("approve", "c7wait", check=True)  # due for the worker: its answer is pending
    for run_id in ("c7crash", "c7control"):  # due for the worker: their owner is dead
        died = new_cli(LEDGER=str(book), STEPS="6", DIE_AT="3").run("run", "--run-id", run_id, LEDGER_AGENT)
        assert died.returncode == -9
    epochs = {run_id: cancel(cli, run_id) for run_id in ("c7wait", "c7crash")}
    frozen = {run_id: (journal_len(cli, run_id), cli.show(run_id)["snapshots"]) for run_id in epochs}
    lines = ledger(book)

    for run_id, entry in (("c7wait", f"{WAIT}:gated"), ("c7crash", LEDGER_AGENT)):
        for args in (("resume", run_id), ("resume", "--steal", run_id),
                     ("resume", "--strategy", "replay", run_id)):
            assert_clear_error(cli.run(*args), "already cancelled", codes=(2,))
        assert_clear_error(cli.run("run", "--run-id", run_id, entry), "is cancelled", codes=(2,))
    log = worker_until(cli, status_is(cli, "c7control", "completed"), "the worker to finish c7control")
    assert "resuming c7control" in log and "c7wait" not in log and "c7crash" not in log, log

    for run_id, epoch in epochs.items():
        doc = cli.show(run_id)
        assert (doc["status"], doc["epoch"], doc["result"]) == ("cancelled", epoch, None)
        assert (journal_len(cli, run_id), doc["snapshots"]) == frozen[run_id]
        assert not [k for k, _ in ledger(book)[len(lines):] if k.startswith(f"{run_id}:")]
    with store_of(cli) as store:
        assert store.signal_state("c7wait", "approval@1") == "pending"  # never consumed


# ---------------------------------------------------------------------- the table


@dataclasses.dataclass(frozen=True)
class Clause:
    id: str
    text: str
    check: Callable[[pathlib.Path, NewCli], None]


CLAUSES = [
    Clause("C1", "A resume continues from the newest durable checkpoint.", c1_resume_from_newest_checkpoint),
    Clause("C2", "An interrupt value is consumed exactly once, by the matching interrupt.",
           c2_interrupt_value_consumed_once_by_matching_wait),
    Clause("C3", "Writes made before an interrupt are durable.", c3_writes_before_interrupt_are_durable),
    Clause("C4", "A resume value given in one process is visible to a resumer in another.",
           c4_resume_value_crosses_processes),
    Clause("C5", "A forked run never affects its parent.", c5_fork_never_affects_parent),
    Clause("C6", "A completed run cannot be resumed into a second completion.",
           c6_completed_run_cannot_complete_twice),
    Clause("C7", "A cancelled run stays cancelled.", c7_cancelled_run_stays_cancelled),
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("clause", CLAUSES, ids=[c.id for c in CLAUSES])
def test_clause(clause: Clause, backend: str, tmp_path: pathlib.Path,
                request: pytest.FixtureRequest) -> None:
    """The clause holds when driven through the real `tcc` CLI in subprocesses, on an LMDB
    store and on a PostgreSQL store (made with ``tcc.store.init_store``, as `tcc init` does)."""
    if backend == "lmdb":
        def new_cli(**env: str) -> Cli:
            return Cli(tmp_path, **env)
    else:
        pg = make_pg_store(request.getfixturevalue("pg_dsn"), tmp_path / "pg")

        def new_cli(**env: str) -> Cli:
            return Cli(tmp_path, store_url=pg.url, key_file=pg.key_file, **env)
    clause.check(tmp_path, new_cli)
    assert (tmp_path / "store").exists() == (backend == "lmdb")  # no command fell back to LMDB


def test_show_json_keeps_event_kinds(tmp_path: pathlib.Path) -> None:
    """`tcc show --json` reports each event under the kind it was recorded with."""
    cli = Cli(tmp_path)
    cli.run("run", "--run-id", "k", f"{WAIT}:gated", check=True)
    recorded = [e["kind"] for e in events(cli, "k")]
    assert "wait" in recorded
    assert [e["kind"] for e in cli.show("k")["events"]] == recorded


def test_worker_once_waits_for_the_runs_it_started(tmp_path: pathlib.Path) -> None:
    """`tcc worker --once` resumes a signalled run and waits for it to finish."""
    cli = Cli(tmp_path)
    cli.run("run", "--run-id", "w", f"{WAIT}:gated", check=True)
    cli.run("approve", "w", check=True)
    worker = cli.run("worker", "--once", "--poll", "0.1")
    assert worker.returncode == 0 and "resuming w (signal arrived)" in worker.stderr, worker.stderr
    assert "exited with 0" in worker.stderr, worker.stderr
    assert cli.show("w")["status"] == "completed"


def test_conformance_doc_lists_every_clause() -> None:
    """docs/conformance.md states every clause of the table, with its id and enforcing test."""
    text = DOC.read_text()
    for clause in CLAUSES:
        assert f"| {clause.id} | {clause.text} |" in text, clause.id
        for backend in ("lmdb", "postgres"):
            assert f"test_clause[{clause.id}-{backend}]" in text, (clause.id, backend)
        assert clause.check.__name__ in text, clause.id
