"""`tcc worker`: takeover of dead runs, due timers, signalled waits; fencing of zombies."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests._support.runs import AGENTS, Cli

WAIT = str(AGENTS / "wait_agent.py")
LEDGER_AGENT = str(AGENTS / "ledger_agent.py")


def wait_for_status(cli: Cli, run_id: str, status: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        shown = cli.run("show", "--json", run_id)
        if shown.returncode == 0 and json.loads(shown.stdout)["status"] == status:
            return json.loads(shown.stdout)
        time.sleep(0.1)
    raise AssertionError(f"run {run_id} never reached {status}: {cli.run('show', run_id).stdout}")


def test_worker_takes_over_a_sigkilled_run_and_resumes_due_and_signalled_runs(tmp_path):
    """One worker finishes a SIGKILLed run, a due timer and an approved wait."""
    ledger = tmp_path / "ledger.txt"
    cli = Cli(tmp_path, LEDGER=str(ledger), DELAY="0.1", STEPS="10", TCC_SLEEP_INLINE="0.1")
    victim = cli.popen("run", "--run-id", "dead", "--lease", "2", LEDGER_AGENT)
    while not ledger.exists() or len(ledger.read_text().splitlines()) < 3:
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.communicate()
    cli.run("run", "--run-id", "nap", f"{WAIT}:sleeper", "1.0", check=True)
    cli.run("run", "--run-id", "gate", f"{WAIT}:gated", check=True)
    cli.run("approve", "gate", check=True)
    worker = cli.popen("worker", "--poll", "0.2")
    try:
        dead = wait_for_status(cli, "dead", "completed")
        assert dead["result"]["steps"] == 10 and dead["epoch"] == 2
        assert any(e["kind"] == "taken_over" for e in dead["events"])
        assert wait_for_status(cli, "gate", "completed")["result"] == ["did prepare", True, "did deploy"]
        assert wait_for_status(cli, "nap", "completed")["result"] == "did after"
    finally:
        worker.send_signal(signal.SIGTERM)
        _out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    assert "resuming dead (owner dead)" in err


PROBE_WRITE = """
import sys
from tcc.store import open_store
with open_store(sys.argv[1], create=False) as store:  # opening takes LMDB's writer lock
    pass
"""


def stop_outside_a_write(cli: Cli, proc: subprocess.Popen[str], attempts: int = 20) -> None:
    """SIGSTOP ``proc`` at a moment it does not hold LMDB's writer lock.

    A process stopped inside a write transaction keeps the lock, so every other
    writer -- the resume under test included -- would wait for it forever (on a
    loaded machine commits are slow enough to be hit; CI saw it).  Probe with a
    writer in a child; if it cannot get the lock, let the process run on and
    stop it again.
    """
    for _ in range(attempts):
        proc.send_signal(signal.SIGSTOP)
        try:
            subprocess.run([sys.executable, "-c", PROBE_WRITE, str(cli.store)], env=cli.env,
                           timeout=5, check=True, capture_output=True)
            return
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGCONT)
            time.sleep(0.05)
    raise AssertionError("the process always held the writer lock when stopped")


def test_stale_epoch_zombie_is_fenced(tmp_path):
    """A stopped owner whose lease expired is taken over; when it wakes it is fenced and writes nothing."""
    cli = Cli(tmp_path, STEP_DELAY="0.3")
    zombie = cli.popen("run", "--run-id", "z", "--lease", "1", f"{WAIT}:slow_steps", "8")
    wait_for_status(cli, "z", "running")
    time.sleep(0.8)
    stop_outside_a_write(cli, zombie)
    try:
        time.sleep(1.5)  # the lease (1 s) expires without heartbeats
        done = json.loads(cli.run("resume", "--json", "z", check=True).stdout)
        assert done["status"] == "completed"
    finally:
        zombie.send_signal(signal.SIGCONT)
    _out, err = zombie.communicate(timeout=60)
    assert zombie.returncode == 1
    assert "epoch" in err and ("fenced" in err.lower() or "stale" in err.lower() or "owned" in err.lower())
    shown = cli.show("z")
    assert shown["status"] == "completed" and shown["epoch"] == 2
    assert shown["result"] == [f"did step {i}" for i in range(8)]


def test_sigterm_stops_a_run_after_its_commit(tmp_path):
    """SIGTERM makes `tcc run` stop cleanly between effects; resume finishes the run."""
    cli = Cli(tmp_path, STEP_DELAY="0.2")
    proc = cli.popen("run", "--json", "--run-id", "t", f"{WAIT}:slow_steps", "6")
    wait_for_status(cli, "t", "running")
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert json.loads(out)["status"] == "stopped"
    done = json.loads(cli.run("resume", "--json", "t", check=True).stdout)
    assert done["result"] == [f"did step {i}" for i in range(6)]


def _killed_after_two_steps(cli: Cli, ledger: Path, *args: str) -> None:
    """``tcc run ARGS`` SIGKILLed once its ledger has two lines."""
    victim = cli.popen(*args)
    while not ledger.exists() or len(ledger.read_text().splitlines()) < 2:
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.communicate()


def test_worker_logs_why_a_resume_failed(tmp_path):
    """A resume the worker starts that fails is logged with the child's error line, not just its code.

    Found by the kill campaign: the worker discarded its children's stderr, so
    a failed takeover said only "exited with 1".
    """
    ledger = tmp_path / "ledger.txt"
    script = tmp_path / "agent.py"
    script.write_text(Path(LEDGER_AGENT).read_text() + "\nif os.environ.get('BREAK_IMPORT'):\n"
                      "    raise RuntimeError('broken at import')\n")
    cli = Cli(tmp_path, LEDGER=str(ledger), DELAY="0.1", STEPS="10")
    _killed_after_two_steps(cli, ledger, "run", "--run-id", "edited", "--lease", "1", str(script))
    breaking = Cli(tmp_path, LEDGER=str(ledger), BREAK_IMPORT="1")  # the resume's import fails
    proc = breaking.run("worker", "--once")
    assert proc.returncode == 0, proc.stderr
    failed = [ln for ln in proc.stderr.splitlines() if "run edited exited with" in ln]
    assert failed and "exited with 0" not in failed[0], proc.stderr
    assert "tcc: error:" in failed[0] and "broken at import" in failed[0], failed


def test_worker_leaves_a_run_whose_code_changed_under_refuse_to_a_person(tmp_path):
    """Policy refuse: the worker does not resume it again and again, it says once what to do."""
    ledger = tmp_path / "ledger.txt"
    script = tmp_path / "agent.py"
    script.write_text(Path(LEDGER_AGENT).read_text())
    cli = Cli(tmp_path, LEDGER=str(ledger), DELAY="0.1", STEPS="10")
    _killed_after_two_steps(cli, ledger, "run", "--run-id", "edited", "--lease", "1",
                            "--on-code-change", "refuse", str(script))
    script.write_text(script.read_text().replace("STEPS", "STEPS_CHANGED"))  # the code changed
    proc = cli.run("worker", "--once")
    assert proc.returncode == 0, proc.stderr
    said = [ln for ln in proc.stderr.splitlines() if "run edited needs a decision" in ln]
    assert len(said) == 1 and "tcc upgrade edited" in said[0], proc.stderr
    assert "resuming edited" not in proc.stderr
    assert cli.show("edited")["status"] == "running"
    # decided: the operator continues it on its recorded code
    done = cli.run("resume", "--code", "pinned", "--json", "edited")
    assert done.returncode == 0 and json.loads(done.stdout)["status"] == "completed", done.stderr


def test_worker_continues_a_run_whose_code_changed_on_its_recorded_code(tmp_path):
    """The default policy: the worker's resume finishes the run on the code it started with."""
    ledger = tmp_path / "ledger.txt"
    script = tmp_path / "agent.py"
    script.write_text(Path(LEDGER_AGENT).read_text())
    cli = Cli(tmp_path, LEDGER=str(ledger), DELAY="0.1", STEPS="6")
    _killed_after_two_steps(cli, ledger, "run", "--run-id", "moved", "--lease", "1", str(script))
    script.write_text(script.read_text().replace("STEPS", "STEPS_CHANGED"))  # broken if it ran
    proc = cli.run("worker", "--once")
    assert proc.returncode == 0, proc.stderr
    doc = cli.show("moved")
    assert doc["status"] == "completed", proc.stderr
    assert doc["result"]["steps"] == 6


def test_worker_backs_off_a_run_whose_resume_keeps_failing(tmp_path):
    """A run whose resume fails is not resumed again at the next poll, but after a delay that
    doubles with each failure, so a run that cannot start is not taken over (its epoch
    raised) at every poll for ever."""
    from tcc.runtime import Worker
    from tcc.store import open_store

    logs: list[str] = []
    with open_store(str(tmp_path / "store")) as store:
        run = store.create_run("agent.py:main", b"[]", lease=0.001)
        time.sleep(0.05)  # the owner's lease has expired: the run is due for a takeover
        failing = [sys.executable, "-c", "import sys; sys.exit(2)"]  # a resume that fails
        worker = Worker(store, poll=0.01, command=failing, log=logs.append)
        assert worker.tick() == 1
        worker.children[run.run_id].wait()
        assert worker.tick() == 0 and worker.tick() == 0  # reaped, backed off: not restarted
        failed = [m for m in logs if "exited with 2" in m]
        assert len(failed) == 1 and "failure 1 in a row; next try in 1 s" in failed[0], logs
        deadline = time.monotonic() + 30
        while worker.tick() == 0:  # due again after the delay
            assert time.monotonic() < deadline, logs
            time.sleep(0.1)
        worker.children[run.run_id].wait()
        worker.tick()
        assert "failure 2 in a row; next try in 2 s" in [m for m in logs if "exited" in m][-1]
        assert store.get_run(run.run_id).epoch == 1  # the failed resumes took nothing over
        worker.backoff[run.run_id] = (5000, 0.0)  # a run that has failed for days (review
        worker._finished(run.run_id, 2)           # finding: 2 ** 1024 overflowed a float)
        assert worker.backoff[run.run_id][0] == 5001 and "next try in 300 s" in logs[-1], logs[-1]


def _damage_run_record(store: str, run_id: str) -> None:
    """Flip one bit of a run record with LMDB directly (the store is closed)."""
    import lmdb

    env = lmdb.open(store, max_dbs=16)
    try:
        dbi = env.open_db(b"runs")
        with env.begin(write=True) as txn:
            key = b"default\x00" + run_id.encode()
            value = bytearray(txn.get(key, db=dbi))
            value[40] ^= 8
            txn.put(key, bytes(value), db=dbi)
    finally:
        env.close()


def test_worker_skips_a_damaged_run_and_serves_the_others(tmp_path: Path) -> None:
    """A run record that fails verification is logged once and skipped; the worker goes on
    taking over the other runs instead of stopping at the first damaged record."""
    from tcc.runtime import Worker
    from tcc.store import open_store

    path = str(tmp_path / "store")
    with open_store(path) as store:
        store.create_run("agent.py:main", b"[]", run_id="bad", lease=0.001)
        store.create_run("agent.py:main", b"[]", run_id="good", lease=0.001)
    _damage_run_record(path, "bad")
    time.sleep(0.05)  # both leases have expired
    logs: list[str] = []
    with open_store(path) as store:
        worker = Worker(store, poll=0.01, command=[sys.executable, "-c", "pass"], log=logs.append)
        assert worker.tick() == 1
        assert list(worker.children) == ["good"]
        worker.children["good"].wait()
        worker.tick()
        for proc in worker.children.values():  # "good" may have been started again
            proc.wait()
        worker._reap()
        skipped = [m for m in logs if "skipping run bad" in m]
        assert len(skipped) == 1 and "failed verification" in skipped[0], logs


def test_ls_lists_intact_runs_and_names_a_damaged_one(tmp_path: Path) -> None:
    """`tcc ls` prints the intact runs, names the damaged one on stderr and exits 1."""
    from tcc.store import open_store

    cli = Cli(tmp_path)
    with open_store(str(cli.store)) as store:
        for rid in ("r1", "r2"):
            store.create_run("agent.py:main", b"[]", run_id=rid)
    _damage_run_record(str(cli.store), "r1")
    proc = cli.run("ls", "--json")
    assert proc.returncode == 1
    assert [r["id"] for r in json.loads(proc.stdout)] == ["r2"]
    assert proc.stderr.startswith("tcc: error: run r1 is not listed: ")
    assert proc.stderr.count("\n") == 1 and "failed verification" in proc.stderr


def test_worker_says_when_it_created_the_store(tmp_path: Path) -> None:
    """A worker pointed at a path with no store (a typo in --store) creates an empty one, as
    a worker started before any run must, but says so on stderr instead of polling an
    empty store in silence; an existing store gets no such notice."""
    cli = Cli(tmp_path)
    typo = tmp_path / "stroe"
    first = cli.run("worker", "--once", "--store", str(typo), check=True)
    assert f"there was no store at {typo}" in first.stderr and "--store" in first.stderr
    again = cli.run("worker", "--once", "--store", str(typo), check=True)
    assert "there was no store" not in again.stderr


def test_show_says_when_a_running_runs_owner_is_gone(tmp_path: Path) -> None:
    """`tcc show` of a run whose owner was killed says the owner is gone and what takes the
    run over, instead of showing `running` as if the dead owner were alive;
    while the owner lives it says nothing of the kind."""
    ledger = tmp_path / "ledger.txt"
    cli = Cli(tmp_path, LEDGER=str(ledger), DELAY="0.2", STEPS="50")
    owner = cli.popen("run", "--run-id", "g", LEDGER_AGENT)
    try:
        while not ledger.exists() or len(ledger.read_text().splitlines()) < 2:
            time.sleep(0.05)
        live = cli.show("g")
        assert (live["status"], live["owner_alive"]) == ("running", True)
        assert "gone" not in cli.run("show", "g", check=True).stdout
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.communicate()
    dead = cli.show("g")
    assert (dead["status"], dead["owner_alive"]) == ("running", False)
    text = cli.run("show", "g", check=True).stdout
    assert f"owner {dead['owner']}  (gone: `tcc resume` or a worker takes the run over)" in text


def test_the_worker_says_no_retry_is_coming_for_a_run_that_ended_failed(tmp_path):
    """A resume that exits 1 because its run failed for good is not retried, and the log says
    so (it promised "next try in 1 s")."""
    from tcc.runtime import Worker
    from tcc.store import open_store

    logs: list[str] = []
    with open_store(str(tmp_path / "store")) as store:
        run = store.create_run("agent.py:main", b"[]", lease=0.001)
        time.sleep(0.05)
        store.claim_run(run.run_id, steal=True)
        ended = store.get_run(run.run_id)
        store.set_status(run.run_id, ended.epoch, "failed", error=b'{"type": "ValueError"}')
        worker = Worker(store, poll=0.01, command=[sys.executable, "-c", "import sys; sys.exit(1)"],
                        log=logs.append)
        worker.children[run.run_id] = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(1)"])
        worker.children[run.run_id].wait()
        worker.tick()
        said = [m for m in logs if "exited with 1" in m]
        assert said and "the run is failed; the worker leaves it" in said[0] and "next try" not in said[0]
        assert run.run_id not in worker.backoff


def test_the_worker_relays_a_resumes_warnings(tmp_path):
    """A `tcc resume` the worker starts may say `tcc: warning: ...` and succeed: the worker's
    log shows it (it read the child's stderr only on a failure)."""
    cli = Cli(tmp_path)
    script = tmp_path / "w.py"
    script.write_text("import warnings\nimport tcc\n\n@tcc.effect\ndef step(i):\n    return i\n\n"
                      "async def main():\n    await step(1)\n"
                      "    warnings.warn('tcc: warning: ' + 'x', UserWarning)\n"
                      "    import sys\n    print('tcc: warning: run says hello', file=sys.stderr)\n"
                      "    return await step(2)\n")
    killer = Cli.__new__(Cli)
    killer.store, killer.env = cli.store, dict(cli.env, TCC_TEST_KILL_AFTER="1")
    assert killer.run("run", "--run-id", "r", "--lease", "1", str(script)).returncode == -9
    time.sleep(1.2)  # the lease ran out (the owner's pid is gone too)
    proc = cli.run("worker", "--once", check=True)
    assert "worker: run r: warning: run says hello" in proc.stderr, proc.stderr


def test_the_worker_stops_its_own_hung_resume_and_takes_the_run_over(tmp_path):
    """A resume this worker started that stops renewing its lease (SIGSTOPped here; stuck
    where its heartbeat cannot run, in general) is killed once the lease has run out, and
    the run is resumed again; a single worker used to leave it for ever, since it never
    claims its own children's runs."""
    import json
    import os
    import signal

    ledger = tmp_path / "ledger.txt"
    cli = Cli(tmp_path, LEDGER=str(ledger), DELAY="0.3", STEPS="8")
    cli.run("submit", "--run-id", "h", LEDGER_AGENT, check=True)
    worker = cli.popen("worker", "--poll", "0.2", "--lease", "2")
    try:
        deadline = time.monotonic() + 60
        while not (ledger.exists() and ledger.read_text().count("\n") >= 2):
            assert time.monotonic() < deadline and worker.poll() is None
            time.sleep(0.05)
        child = cli.show("h")["owner"].rpartition(":")[2]
        os.kill(int(child), signal.SIGSTOP)
        while cli.show("h")["status"] != "completed":
            assert time.monotonic() < deadline + 60 and worker.poll() is None
            time.sleep(0.2)
    finally:
        worker.send_signal(signal.SIGTERM)
        _out, err = worker.communicate(timeout=60)
    assert f"its resume (pid {child}) has not renewed its lease" in err, err
    assert json.loads(cli.run("show", "--json", "h", check=True).stdout)["result"] == \
        json.loads(Cli(tmp_path / "ref", LEDGER=str(tmp_path / "ref.txt"), STEPS="8").run(
            "run", "--json", LEDGER_AGENT, check=True).stdout)["result"]
