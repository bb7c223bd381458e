"""A sync effect stuck past its timeout does not make SIGTERM wait for it.

A timed-out sync call's thread cannot be stopped.  The driver waits for it
before a retry, before another call of the same effect and when the drive
ends; each of those waits stops on SIGTERM, and the call runs in a daemon
thread that interpreter exit does not join, so one stuck call never keeps a
stopped run's process alive while the call runs.  Each test runs ``tcc run`` in a
real process whose stuck call would take 600 s; a process that does not end
within 60 s of SIGTERM fails the test.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time

from tcc.errors import RunNotFoundError
from tcc.store import open_store

from tests._support.runs import AGENTS, Cli

AGENT = str(AGENTS / "stuck_agent.py")


def _cli(tmp_path) -> Cli:
    return Cli(tmp_path, STUCK_LEDGER=str(tmp_path / "ledger"), STUCK_RELEASE=str(tmp_path / "release"))


def _ledger(tmp_path) -> list[str]:
    path = tmp_path / "ledger"
    return path.read_text().splitlines() if path.exists() else []


def _journal(cli: Cli, run_id: str):
    """The run's journal; empty while the run (or its store) does not exist yet."""
    if not cli.store.exists():
        return []
    try:
        with open_store(str(cli.store)) as store:
            return store.journal(run_id)
    except RunNotFoundError:
        return []


def _run(cli: Cli, run_id: str):
    """The run's record; None while the run (or its store) does not exist yet."""
    if not cli.store.exists():
        return None
    try:
        with open_store(str(cli.store)) as store:
            return store.get_run(run_id)
    except RunNotFoundError:
        return None


def _status(cli: Cli, run_id: str) -> str | None:
    info = _run(cli, run_id)
    return None if info is None else info.status


def _until(cond, what: str, proc, limit: float = 60) -> None:
    deadline = time.monotonic() + limit
    while not cond():
        if proc.poll() is not None:
            raise AssertionError(f"tcc run exited before {what}: {proc.communicate()}")
        if time.monotonic() >= deadline:
            proc.kill()
            proc.communicate()
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _ended(proc, failure: str) -> tuple[str, str]:
    """The process's output once it exits; ``failure`` if it is still running after 60 s."""
    try:
        return proc.communicate(timeout=60)  # the stuck call would take 600 s
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError(failure) from None


def _terminate(proc) -> dict:
    proc.send_signal(signal.SIGTERM)
    out, err = _ended(proc, "SIGTERM did not stop the run while a timed-out call was stuck")
    assert proc.returncode == 0, err
    return json.loads(out)


def _failed_attempts(cli: Cli, run_id: str) -> int:
    return sum(1 for r in _journal(cli, run_id) if r.kind == "completion" and r.error is not None)


def test_sigterm_stops_a_retry_waiting_for_a_stuck_thread(tmp_path):
    """SIGTERM while the retry waits for the timed-out attempt's thread stops the run at
    once; resumed, the retry runs (the first attempt's failure is not the outcome)."""
    cli = _cli(tmp_path)
    proc = cli.popen("run", "--json", "--run-id", "r1", f"{AGENT}:retry_after_stuck")
    _until(lambda: _failed_attempts(cli, "r1") == 1,
           "the first attempt to time out", proc)
    doc = _terminate(proc)
    assert doc["status"] == "stopped" and doc["parked"] == {"reason": "SIGTERM"}, doc
    assert _ledger(tmp_path) == [f"start 1 pid {proc.pid}"]  # the retry never started
    intents = [r for r in _journal(cli, "r1") if r.kind == "intent"]
    assert [r.attempt for r in intents] == [1]

    (tmp_path / "release").touch()
    done = json.loads(cli.run("resume", "--json", "r1", check=True).stdout)
    assert done["status"] == "completed" and done["result"] == "done 1", done
    journal = _journal(cli, "r1")
    assert [r.attempt for r in journal if r.kind == "intent"] == [1, 2]
    completions = [r for r in journal if r.kind == "completion"]
    assert [c.error is None for c in completions] == [False, True]


def test_sigterm_ends_the_wait_for_a_stuck_thread_after_the_run_completed(tmp_path):
    """A run that gave up on a timed-out call completes; its process then waits for the
    stuck thread (a later drive must not overlap it), but SIGTERM ends that wait at once
    and the completed outcome is reported."""
    cli = _cli(tmp_path)
    proc = cli.popen("run", "--json", "--run-id", "f1", f"{AGENT}:finish_with_a_stuck_thread")
    _until(lambda: _status(cli, "f1") == "completed", "the run to complete", proc)
    assert proc.poll() is None  # still waiting for the stuck call's thread
    doc = _terminate(proc)
    assert doc["status"] == "completed", doc
    assert doc["result"].startswith("gave up: effect '__tcc_script_stuck_agent:stuck_once' timed out")
    assert not (tmp_path / "release").exists()  # the call was still stuck when the process ended
    assert _ledger(tmp_path) == [f"start 1 pid {proc.pid}"]


def test_sigterm_stops_a_gathered_call_waiting_for_a_stuck_thread(tmp_path):
    """In a gather, the call that waits for its effect's stuck thread is stopped by SIGTERM
    before it starts; the other call's outcome is kept, and on resume only the stopped
    call runs."""
    cli = _cli(tmp_path)
    proc = cli.popen("run", "--json", "--run-id", "g1", f"{AGENT}:gather_after_stuck")
    _until(lambda: "quick 2" in _ledger(tmp_path), "the gather to start", proc)
    # the gather now waits for call 3; quick's outcome is kept whenever SIGTERM lands,
    # because the stop only ends the call that has not started
    doc = _terminate(proc)
    assert doc["status"] == "stopped", doc
    assert _ledger(tmp_path) == [f"start 1 pid {proc.pid}", "quick 2"]  # call 3 never started
    journal = _journal(cli, "g1")
    assert [r.name.rpartition(":")[2] for r in journal if r.kind == "intent"] == [
        "stuck_once", "quick", "stuck_once"]
    done_calls = {r.intent_seq for r in journal if r.kind == "completion"}
    assert done_calls == {0, 2}  # call 1 timed out, quick's outcome kept; call 3's intent is open

    (tmp_path / "release").touch()
    done = json.loads(cli.run("resume", "--json", "g1", check=True).stdout)
    assert done["status"] == "completed" and done["result"] == ["quick 2", "done 3"], done
    runs = [line.split(" pid")[0] for line in _ledger(tmp_path)]
    assert runs == ["start 1", "quick 2", "start 3"]  # quick ran once, call 3 once


def test_sigterm_stops_a_long_retry_back_off(tmp_path):
    """SIGTERM during the back-off before a retry stops the run; resumed, the retry runs."""
    cli = _cli(tmp_path)
    proc = cli.popen("run", "--json", "--run-id", "b1", f"{AGENT}:long_backoff")
    _until(lambda: _failed_attempts(cli, "b1") == 1,
           "the first attempt to fail", proc)
    doc = _terminate(proc)
    assert doc["status"] == "stopped", doc
    assert _ledger(tmp_path) == ["flaky 1 attempt 1"]
    done = json.loads(cli.run("resume", "--json", "b1", check=True).stdout)
    assert done["status"] == "completed" and done["result"] == "flaky 1 ok", done
    assert _ledger(tmp_path) == ["flaky 1 attempt 1", "flaky 1 attempt 2"]


def test_effect_options_are_checked():
    """Bad retry settings are refused when the effect is declared, naming the option."""
    import math

    import pytest

    import tcc

    def f():
        return 1

    bad = (({"retries": -1}, "retries"), ({"timeout": 0}, "timeout"),
           ({"timeout": math.nan}, "timeout"), ({"timeout": math.inf}, "timeout"),
           ({"retry_delay": -0.1}, "retry_delay"), ({"retry_delay": math.nan}, "retry_delay"),
           ({"retry_delay": math.inf}, "retry_delay"))
    for kwargs, what in bad:
        with pytest.raises(ValueError, match=what):
            tcc.effect(name=f"opt-{what}", **kwargs)(f)
    assert tcc.effect(name="opt-ok", retries=2, retry_delay=0)(f).retry_delay == 0


def test_retry_backoff_doubles_and_is_capped():
    """The wait before a retry doubles per retry and stays a finite, bounded number even
    for a very long retry chain (an uncapped 2**n overflowed the float)."""
    import threading

    from tcc.runtime._attempts import _backoff

    assert [_backoff(0.5, n) for n in range(4)] == [0.5, 1.0, 2.0, 4.0]
    assert _backoff(0, 10_000) == 0
    for n in (30, 64, 1_000, 10_000):
        wait = _backoff(1e300, n)
        assert wait == 86_400.0 and wait <= threading.TIMEOUT_MAX


def test_a_parked_run_keeps_its_lease_until_a_stuck_thread_ends(tmp_path):
    """A run that parks (here for an approval) while a timed-out call's thread still runs
    keeps its lease until that thread ends, so no other process resumes the run beside
    the stuck call; the lease is not released before the thread ends."""
    cli = _cli(tmp_path)
    proc = cli.popen("run", "--json", "--run-id", "p1", f"{AGENT}:park_with_a_stuck_thread")
    _until(lambda: _status(cli, "p1") == "waiting", "the run to park", proc)
    time.sleep(0.5)  # a lease released at the park would be visible by now
    assert proc.poll() is None  # still waiting for the stuck call's thread
    assert _run(cli, "p1").lease_expiry > time.time(), "the lease was released while the call was stuck"

    (tmp_path / "release").touch()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert json.loads(out)["status"] == "waiting"
    assert _run(cli, "p1").lease_expiry <= time.time()  # released once the thread ended: resumable
    assert _ledger(tmp_path) == [f"start 1 pid {proc.pid}"]


def test_a_cancel_ends_the_wait_of_a_parked_run_for_a_stuck_thread(tmp_path):
    """While a parked run's process waits for a stuck call's thread before releasing its
    lease, `tcc cancel` ends that wait: the run is no longer this process's to guard."""
    cli = _cli(tmp_path)
    proc = cli.popen("run", "--json", "--run-id", "p2", f"{AGENT}:park_with_a_stuck_thread")
    _until(lambda: _status(cli, "p2") == "waiting", "the run to park", proc)
    assert proc.poll() is None  # waiting for the stuck call's thread
    cli.run("cancel", "p2", check=True)
    out, err = _ended(proc, "a cancel did not end the wait for the stuck call")
    # reported as a cancel, as anywhere else a running process notices one (not "waiting")
    assert proc.returncode == 1 and "was cancelled" in err and not out.strip(), (out, err)
    assert not (tmp_path / "release").exists()  # the call was still stuck
    assert _status(cli, "p2") == "cancelled"
