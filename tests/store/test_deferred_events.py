"""Deferred events (``add_event(..., deferred=True)``): written by the owner's next commit,
not by a flushed commit of their own -- a resume costs one fsync (its claim) before its
first new effect -- fenced when written, and lost only with a process that dies first."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tcc.store import open_store
from tests._support.runs import AGENTS, Cli


def _kinds(store, run_id: str) -> list[str]:
    return [e.kind for e in store.events(run_id)]


@pytest.mark.parametrize("durability", ["sync", "group", "none"])
def test_a_deferred_event_waits_for_the_next_commit_and_keeps_its_time(tmp_path: Path, durability: str) -> None:
    with open_store(tmp_path / "s", durability=durability) as store:
        run = store.create_run("agent.py:main", run_id="r")
        before = _kinds(store, "r")
        t0 = time.time()
        store.add_event("r", "resumed", {"snapshot": 3}, epoch=run.epoch, deferred=True)
        assert _kinds(store, "r") == before  # not written yet
        time.sleep(0.05)
        store.add_event("r", "noted", {"by": "owner"}, epoch=run.epoch)  # the next commit
        events = store.events("r")
        assert [e.kind for e in events] == before + ["resumed", "noted"]  # in the order added
        assert events[-2].data == {"snapshot": 3} and t0 <= events[-2].time < events[-1].time - 0.04


def test_a_deferred_event_of_a_writer_taken_over_is_void(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with open_store(path) as store:
        run = store.create_run("agent.py:main", run_id="r", lease=0.0)
        store.create_run("agent.py:main", run_id="other")
        store.add_event("r", "resumed", {}, epoch=run.epoch, deferred=True)
        with open_store(path) as thief:
            thief.claim_run("r", steal=True)
        store.add_event("other", "noted", {})  # this handle's next commit: "r" moved on
        assert "resumed" not in _kinds(store, "r")


def test_closing_the_handle_writes_what_was_deferred(tmp_path: Path) -> None:
    path = tmp_path / "s"
    store = open_store(path)
    run = store.create_run("agent.py:main", run_id="r")
    store.add_event("r", "resumed", {"n": 1}, epoch=run.epoch, deferred=True)
    store.close()
    with open_store(path) as again:
        assert _kinds(again, "r")[-1] == "resumed"


def test_a_deferred_event_needs_its_writers_epoch_and_json_data(tmp_path: Path) -> None:
    with open_store(tmp_path / "s") as store:
        run = store.create_run("agent.py:main", run_id="r")
        with pytest.raises(ValueError, match="epoch"):
            store.add_event("r", "resumed", {}, deferred=True)
        with pytest.raises(TypeError):
            store.add_event("r", "resumed", {"x": object()}, epoch=run.epoch, deferred=True)
        store.add_event("r", "noted", {})
        assert "resumed" not in _kinds(store, "r")  # neither was kept for later


@pytest.mark.parametrize("durability", ["sync", "group"])
def test_commits_on_many_threads_write_a_deferred_event_once(tmp_path: Path, durability: str) -> None:
    """A heartbeat's commit and the owner's step may race for the deferred events (and
    ``group`` batches them into one transaction): each is written exactly once."""
    with open_store(tmp_path / "s", durability=durability) as store:
        run = store.create_run("agent.py:main", run_id="r")
        for i in range(20):
            store.add_event("r", f"deferred-{i}", {}, epoch=run.epoch, deferred=True)
        errors: list[BaseException] = []

        def beat() -> None:
            try:
                for _ in range(5):
                    store.renew_lease("r", run.epoch)
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=beat) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        kinds = _kinds(store, "r")
        assert [k for k in kinds if k.startswith("deferred-")] == [f"deferred-{i}" for i in range(20)]


KILLED = r"""
import os, signal, sys
from tcc.store import Completion, open_store
store = open_store(sys.argv[1])
run = store.create_run("agent.py:main", run_id="r")
seq = store.append_intent("r", run.epoch, "step", b"0")
store.checkpoint("r", run.epoch, b"state", completion=Completion(seq, result=b"ok"))
store.add_event("r", "resumed", {}, epoch=run.epoch, deferred=True)
os.kill(os.getpid(), signal.SIGKILL)  # before any further commit
"""


def test_a_process_killed_before_its_next_commit_loses_only_the_deferred_event(tmp_path: Path) -> None:
    path = tmp_path / "s"
    proc = subprocess.run([sys.executable, "-c", KILLED, str(path)], timeout=120)
    assert proc.returncode == -signal.SIGKILL
    with open_store(path) as store:
        assert "resumed" not in _kinds(store, "r")
        assert store.latest_good_snapshot("r") is not None and len(store.journal("r")) == 2  # intent, completion


AGENT = """
import os, signal
import tcc

@tcc.effect
def step(i):
    if i == 1 and os.environ.get("DIE") == "1":
        os.kill(os.getpid(), signal.SIGKILL)  # the first process dies inside step 1
    if i == 1 and os.environ.get("EXIT") == "1":
        os._exit(0)  # the resumed process stops at its first new effect
    return i

async def main():
    return [await step(i) for i in range(3)]
"""


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_a_resume_flushes_once_before_its_first_new_effect(tmp_path: Path) -> None:
    """Counted with strace: the claim is the one flushed commit before the first new effect;
    the ``resumed`` and ``in_doubt_reissued`` events ride with the step's commit."""
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    env = {**os.environ, "TCC_STORE": str(tmp_path / "store")}
    died = subprocess.run([sys.executable, "-m", "tcc", "run", "--run-id", "r", str(script)],
                          env={**env, "DIE": "1"}, capture_output=True, text=True, timeout=120)
    assert died.returncode == -signal.SIGKILL, died.stderr
    trace = tmp_path / "trace"
    subprocess.run(["strace", "-f", "-qq", "-o", str(trace), "-e", "trace=fsync,fdatasync,msync",
                    sys.executable, "-m", "tcc", "resume", "r"], env={**env, "EXIT": "1"},
                   capture_output=True, timeout=120, check=True)
    flushes = [line for line in trace.read_text().splitlines() if "sync(" in line]
    assert len(flushes) == 1, flushes
    done = subprocess.run([sys.executable, "-m", "tcc", "resume", "--json", "r"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert json.loads(done.stdout)["result"] == [0, 1, 2], done.stderr
    with open_store(tmp_path / "store") as store:
        kinds = _kinds(store, "r")
    # the second process (stopped at its first new effect) left its claim only: its deferred
    # events went with it; the third process's are all there, in order
    # (``code``: the run's first snapshot recorded its module sources)
    assert kinds == ["created", "started", "code", "taken_over", "taken_over", "resumed",
                     "in_doubt_reissued", "completed"], kinds


def test_a_fork_resumed_once_is_known_to_have_run_though_its_resumed_event_was_lost(tmp_path: Path) -> None:
    """The claim's own event (flushed) says a process took the run up.  A fork's first
    resume dies inside its first call and an OS crash takes that call's intent (and the
    ``resumed`` event, never committed): the next resume still asks the call's probe
    rather than running it a second time."""
    ledger = tmp_path / "ledger.txt"
    cli = Cli(tmp_path, LEDGER=str(ledger))
    cli.run("run", "--run-id", "p", f"{AGENTS / 'doubt_agent.py'}:write_then_flaky", check=True)
    forked = cli.run("fork", "--at", "1", "p", check=True).stdout.strip().splitlines()[-1]
    fork_id = forked.split()[-1] if " " in forked else forked
    died = Cli(tmp_path, LEDGER=str(ledger), DIE_ON="h").run("resume", fork_id)
    assert died.returncode == -signal.SIGKILL, died.stderr
    shutil.rmtree(tmp_path / "store" / "inflight")  # what an OS crash may take
    done = cli.run("resume", "--json", fork_id, check=True)
    assert json.loads(done.stdout)["result"] == "a h (found)"
    fork_lines = [line for line in ledger.read_text().splitlines() if line.startswith(fork_id)]
    assert len(fork_lines) == 1, ledger.read_text()


# Both backends (tests/store/conftest.py ``site``): PostgreSQL writes a deferred event in
# the statement of the handle's next write, fenced by its writer's epoch there too.


def test_a_deferred_event_rides_with_the_next_step_write_on_both_backends(site) -> None:
    from tcc.store import Completion

    with site.open() as store:
        run = store.create_run("agent.py:main", run_id="r")
        store.claim_run("r")
        epoch = store.get_run("r").epoch
        before = _kinds(store, "r")
        t0 = time.time()
        store.add_event("r", "resumed", {"snapshot": 3}, epoch=epoch, deferred=True)
        store.add_event("r", "in_doubt_reissued", {"attempt": 2}, epoch=epoch, deferred=True)
        assert _kinds(store, "r") == before  # not written yet
        time.sleep(0.05)
        # the next write: on PostgreSQL the intent's statement (LMDB journals an intent in
        # flight, with no commit of its own: there the step's commit is the next one)
        seq = store.append_intent("r", epoch, "step", b"0")
        if site.backend == "postgres":
            assert _kinds(store, "r") == before + ["resumed", "in_doubt_reissued"]
        store.add_event("r", "verified", {}, epoch=epoch, deferred=True)
        store.checkpoint("r", epoch, b"state", completion=Completion(seq, result=b"ok"))
        events = store.events("r")
        assert [e.kind for e in events] == before + ["resumed", "in_doubt_reissued", "verified"]
        assert events[-3].data == {"snapshot": 3} and t0 <= events[-3].time < time.time() - 0.04
        # and before an ordinary event the handle adds later (a statement of their own first)
        store.add_event("r", "parked", {}, epoch=epoch, deferred=True)
        store.add_event("r", "noted", {"by": "owner"}, epoch=epoch)
        assert _kinds(store, "r")[-2:] == ["parked", "noted"]
        # and in the transaction of a status change, before its own event
        store.add_event("r", "in_doubt_verified", {}, epoch=epoch, deferred=True)
        store.set_status("r", epoch, "waiting")
        assert _kinds(store, "r")[-2:] == ["in_doubt_verified", "waiting"]
        del run


def test_a_deferred_event_of_a_writer_taken_over_is_void_on_both_backends(site) -> None:
    with site.open() as store:
        run = store.create_run("agent.py:main", run_id="r", lease=0.0)
        other = store.create_run("agent.py:main", run_id="other")
        store.add_event("r", "resumed", {}, epoch=run.epoch, deferred=True)
        store.add_event("other", "resumed", {}, epoch=other.epoch, deferred=True)
        with site.open() as thief:
            thief.claim_run("r", steal=True)
        store.add_event("other", "noted", {})  # this handle's next commit
        assert "resumed" not in _kinds(store, "r")  # "r" moved on: void
        assert "resumed" in _kinds(store, "other")


def test_a_fenced_write_keeps_the_deferred_events_for_the_next_one_on_both_backends(site) -> None:
    """A write that fails (fenced) commits nothing: the events wait for the next write."""
    from tcc.errors import FencedError

    with site.open() as store:
        run = store.create_run("agent.py:main", run_id="r", lease=0.0)
        other = store.create_run("agent.py:main", run_id="other")
        store.add_event("other", "resumed", {}, epoch=other.epoch, deferred=True)
        with site.open() as thief:
            thief.claim_run("r", steal=True)
        with pytest.raises(FencedError):  # a commit on both backends (an intent is not on LMDB)
            store.checkpoint("r", run.epoch, b"state")
        assert "resumed" not in _kinds(store, "other")
        store.add_event("other", "noted", {})
        assert _kinds(store, "other")[-2:] == ["resumed", "noted"]


def test_closing_the_handle_writes_what_was_deferred_on_both_backends(site) -> None:
    store = site.open()
    run = store.create_run("agent.py:main", run_id="r")
    store.add_event("r", "resumed", {"n": 1}, epoch=run.epoch, deferred=True)
    store.close()
    with site.open() as again:
        assert _kinds(again, "r")[-1] == "resumed"
