"""Approvals, signals and durable timers: runs park, processes exit, resumes continue."""

from __future__ import annotations

import json
import signal
import time

from tests._support.runs import AGENTS, Cli

WAIT = str(AGENTS / "wait_agent.py")


def start(cli: Cli, run_id: str, func: str, *args: str) -> dict:
    proc = cli.run("run", "--json", "--run-id", run_id, f"{WAIT}:{func}", *args, check=True)
    return json.loads(proc.stdout)


def test_approval_delivered_after_the_process_exited(tmp_path):
    """A run parks on tcc.approval, its process exits, and `tcc approve` + `tcc resume` finish it."""
    cli = Cli(tmp_path)
    parked = start(cli, "g1", "gated")
    assert parked["status"] == "waiting"
    assert parked["parked"]["prompt"] == "Deploy to prod?"
    shown = cli.show("g1")
    assert shown["status"] == "waiting"
    assert [(w["kind"], w["prompt"], w["signal"]) for w in shown["waits"]] == [
        ("approval", "Deploy to prod?", "not sent")]
    cli.run("approve", "g1", "--comment", "lgtm", check=True)
    done = json.loads(cli.run("resume", "--json", "g1", check=True).stdout)
    assert done["status"] == "completed"
    assert done["result"] == ["did prepare", True, "did deploy"]
    assert cli.show("g1")["waits"] == []


def test_reject_takes_the_other_branch_and_a_second_answer_is_refused(tmp_path):
    """`tcc reject` makes tcc.approval return False; answering twice is refused."""
    cli = Cli(tmp_path)
    start(cli, "g2", "gated")
    cli.run("reject", "g2", check=True)
    again = cli.run("approve", "g2")
    assert again.returncode == 2 and "already answered" in again.stderr
    done = json.loads(cli.run("resume", "--json", "g2", check=True).stdout)
    assert done["result"] == ["did prepare", False, "did rollback"]
    assert cli.run("approve", "g2").returncode == 2


def test_signals_sent_early_are_kept_and_each_wait_gets_its_own(tmp_path):
    """Signals sent before the run waits are kept, and each wait consumes the matching one only."""
    cli = Cli(tmp_path)
    start(cli, "s1", "two_signals")
    cli.run("signal", "s1", "beta", "--value", '{"b": 2}', check=True)
    cli.run("signal", "s1", "alpha", "--value", '"a1"', check=True)
    cli.run("signal", "s1", "alpha", "--value", '"a2"', check=True)
    done = json.loads(cli.run("resume", "--json", "s1", check=True).stdout)
    assert done["result"] == ["a1", {"b": 2}, "a2", "did done"]


def test_signal_is_consumed_once_when_two_resumers_race(tmp_path):
    """Two concurrent `tcc resume` of one waiting run consume its signal once and act once."""
    ledger = tmp_path / "ledger.txt"
    cli = Cli(tmp_path, LEDGER=str(ledger))
    start(cli, "race", "gated")
    cli.run("approve", "race", check=True)
    procs = [cli.popen("resume", "--json", "race") for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes[0] == 0, outs
    assert cli.show("race")["status"] == "completed"
    deploys = [line for line in ledger.read_text().splitlines() if line.endswith("deploy")]
    assert len(deploys) == 1, ledger.read_text()
    # the loser either found the run owned, or found it completed
    loser = [o for p, o in zip(procs, outs) if p.returncode != 0]
    assert all("owned by" in err or "already completed" in err or "no longer pending" in err
               for _out, err in loser), loser


def test_wait_timeout_raises_inside_the_agent(tmp_path):
    """A wait with a timeout raises TimeoutError in the agent once it has passed."""
    cli = Cli(tmp_path)
    assert start(cli, "t1", "timed_out")["status"] == "waiting"
    time.sleep(0.4)
    done = json.loads(cli.run("resume", "--json", "t1", check=True).stdout)
    assert done["status"] == "completed"
    assert done["result"].startswith("timed out: no signal 'never@1'")


def test_long_sleep_parks_and_short_sleep_runs_inline(tmp_path):
    """A sleep beyond the inline threshold leaves the run sleeping until it is due."""
    cli = Cli(tmp_path, TCC_SLEEP_INLINE="0.2")
    parked = start(cli, "z1", "sleeper", "1.5")
    assert parked["status"] == "sleeping"
    assert cli.show("z1")["status"] == "sleeping"
    early = json.loads(cli.run("resume", "--json", "z1", check=True).stdout)
    assert early["status"] == "sleeping"  # not due yet: parks again
    time.sleep(1.6)
    done = json.loads(cli.run("resume", "--json", "z1", check=True).stdout)
    assert done["status"] == "completed" and done["result"] == "did after"
    inline = start(Cli(tmp_path / "inline"), "z2", "sleeper", "0.1")
    assert inline["status"] == "completed"


def test_run_with_wait_option_picks_up_a_signal_in_process(tmp_path):
    """With --wait, a run polls for its signal in-process instead of parking."""
    cli = Cli(tmp_path)
    proc = cli.popen("run", "--json", "--wait", "30", "--run-id", "w1", f"{WAIT}:gated")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if cli.run("approve", "w1").returncode == 0:
            break
        time.sleep(0.1)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert json.loads(out)["result"] == ["did prepare", True, "did deploy"]


def _until(cond, what: str, proc, limit: float = 60) -> None:
    deadline = time.monotonic() + limit
    while not cond():
        assert proc.poll() is None, f"owner exited before {what}: {proc.communicate()}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _assert_stopped_by_cancel(cli: Cli, proc, run_id: str, doing: str) -> None:
    doc = json.loads(cli.run("cancel", "--json", run_id, check=True).stdout)
    assert doc["status"] == "cancelled"
    # far sooner than the 300 s the run would otherwise wait or sleep in-process
    try:
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # do not leave it running if the assertion fails
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, err
    errors = [ln for ln in err.splitlines() if ln.startswith("tcc: error:")]
    assert len(errors) == 1 and "Traceback" not in err, err
    assert f"run {run_id} was cancelled while this process" in errors[0], errors
    assert doing in errors[0] and "nothing more was written" in errors[0], errors
    shown = cli.show(run_id)
    assert shown["status"] == "cancelled"
    assert shown["events"][-1]["kind"] == "cancelled", shown["events"]  # no write after it


def test_cancel_stops_an_owner_waiting_in_process(tmp_path):
    """A run polling for its approval in-process (--wait) notices `tcc cancel` while it waits,
    exits 1 saying so without waiting out --wait, and writes nothing after the cancel."""
    cli = Cli(tmp_path)
    proc = cli.popen("run", "--json", "--wait", "300", "--run-id", "wc", f"{WAIT}:gated")
    _until(lambda: cli.run("show", "--json", "wc").returncode == 0
           and any(e["kind"] == "wait" for e in cli.show("wc")["events"]),
           "the wait to start", proc)
    _assert_stopped_by_cancel(cli, proc, "wc", "waited for 'approval@1'")


def test_cancel_stops_an_owner_sleeping_in_process(tmp_path):
    """A durable sleep short enough to sleep in-process is cut short by `tcc cancel`."""
    cli = Cli(tmp_path, TCC_SLEEP_INLINE="1000")
    proc = cli.popen("run", "--json", "--run-id", "sc", f"{WAIT}:sleeper", "300")
    _until(lambda: cli.run("show", "--json", "sc").returncode == 0
           and cli.show("sc")["effects"] >= 1, "the first effect", proc)
    time.sleep(0.5)  # into the sleep
    _assert_stopped_by_cancel(cli, proc, "sc", "slept until")


def _terminate(proc) -> tuple[str, str]:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.communicate(timeout=60)  # far sooner than the 300 s wait or sleep
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_sigterm_parks_a_run_waiting_in_process(tmp_path):
    """SIGTERM during an in-process wait (--wait) parks the run as waiting at once (it used
    to be ignored until the wait ended); approve + resume then finish it."""
    cli = Cli(tmp_path)
    proc = cli.popen("run", "--json", "--wait", "300", "--run-id", "wt", f"{WAIT}:gated")
    _until(lambda: cli.run("show", "--json", "wt").returncode == 0
           and any(e["kind"] == "wait" for e in cli.show("wt")["events"]),
           "the wait to start", proc)
    out, err = _terminate(proc)
    assert proc.returncode == 0, err
    assert json.loads(out)["status"] == "waiting"
    assert cli.show("wt")["status"] == "waiting"
    cli.run("approve", "wt", check=True)
    done = json.loads(cli.run("resume", "--json", "wt", check=True).stdout)
    assert done["status"] == "completed"
    assert done["result"] == ["did prepare", True, "did deploy"]


def test_sigterm_parks_a_run_sleeping_in_process(tmp_path):
    """SIGTERM during an in-process durable sleep parks the run as sleeping, with its wake-up
    time kept, instead of sleeping on."""
    cli = Cli(tmp_path, TCC_SLEEP_INLINE="1000")
    proc = cli.popen("run", "--json", "--run-id", "st", f"{WAIT}:sleeper", "300")
    _until(lambda: cli.run("show", "--json", "st").returncode == 0
           and cli.show("st")["effects"] >= 1, "the first effect", proc)
    time.sleep(0.5)  # into the sleep
    out, err = _terminate(proc)
    assert proc.returncode == 0, err
    doc = json.loads(out)
    assert doc["status"] == "sleeping", doc
    shown = cli.show("st")
    assert shown["status"] == "sleeping" and shown["effects"] == 1
    plain = Cli(tmp_path)  # the same store, default in-process sleep limit (5 s)
    again = json.loads(plain.run("resume", "--json", "st", check=True).stdout)
    assert again["status"] == "sleeping"  # not due yet: parks again, "after" never ran
    assert cli.show("st")["effects"] == 1


def test_show_does_not_count_wait_and_sleep_markers_as_effects(tmp_path):
    """`tcc show` counts effects as `tcc run` does: a finished sleep or wait is not an effect
    (a run with 2 effect calls and a sleep shows 2, not 3)."""
    cli = Cli(tmp_path)
    done = start(cli, "n", "sleeper", "0")
    assert done["status"] == "completed" and done["effects"] == 2
    assert cli.show("n")["effects"] == 2


def test_a_signal_after_a_timed_out_wait_reaches_the_next_wait(tmp_path):
    """A wait on NAME that timed out leaves its slot unused; the next signal goes to the wait
    the run is parked at (it went to the dead slot, and the run waited for ever)."""
    script = tmp_path / "w.py"
    script.write_text(
        "import tcc\n"
        "async def main():\n"
        "    try:\n"
        "        first = await tcc.wait_for('note', timeout=0.2)\n"
        "    except TimeoutError:\n"
        "        first = 'timed out'\n"
        "    return [first, await tcc.wait_for('note')]\n")
    cli = Cli(tmp_path)
    cli.run("run", "--run-id", "w", "--wait", "1", str(script), check=True)
    assert cli.show("w")["status"] == "waiting"
    sent = cli.run("signal", "w", "note", "--value", "5", check=True)
    assert "note@2" in sent.stdout
    done = json.loads(cli.run("resume", "--json", "w", check=True).stdout)
    assert done["result"] == ["timed out", 5]


def test_the_worker_takes_up_a_wait_whose_timeout_ran_out(tmp_path):
    """A run parked at a wait with a timeout is due once the timeout has passed: the worker
    resumes it, and the wait raises TimeoutError inside the agent, with no signal."""
    cli = Cli(tmp_path)
    assert start(cli, "t2", "timed_out")["status"] == "waiting"
    early = cli.run("worker", "--once", check=True)
    if "resuming t2" not in early.stderr:  # (the timeout is 0.3 s: it may be over already)
        time.sleep(0.4)
        cli.run("worker", "--once", check=True)
    detail = cli.show("t2")
    assert detail["status"] == "completed", detail["status"]
    assert detail["result"].startswith("timed out: no signal 'never@1'")


DEADLINE_AGENT = (
    "import tcc\n"
    "async def main(timeout):\n"
    "    try:\n"
    "        first = await tcc.wait_for('note', timeout=float(timeout))\n"
    "    except TimeoutError:\n"
    "        first = 'timed out'\n"
    "    return [first, await tcc.wait_for('note')]\n")


def _killed_in_its_wait(cli: Cli, run_id: str, script, timeout: str) -> None:
    """Start ``script`` waiting in-process (--wait), and SIGKILL it inside the wait."""
    proc = cli.popen("run", "--wait", "300", "--run-id", run_id, str(script), timeout)

    def waiting() -> bool:
        shown = cli.run("show", "--json", run_id)  # (fails until the run exists)
        return shown.returncode == 0 and any(e["kind"] == "wait" for e in json.loads(shown.stdout)["events"])

    try:
        _until(waiting, "the wait", proc)
    finally:
        proc.kill()
        proc.communicate(timeout=60)
    assert proc.returncode == -9


def test_a_crash_does_not_restart_a_waits_timeout(tmp_path):
    """A run killed inside `wait_for(timeout=T)` and resumed after the deadline times out at
    once, as it would have uninterrupted (each takeover used to start the timeout again, so
    a run that kept crashing never timed out); the deadline is the one journaled."""
    script = tmp_path / "w.py"
    script.write_text(DEADLINE_AGENT)
    cli = Cli(tmp_path)
    _killed_in_its_wait(cli, "w", script, "1")
    calls = cli.show("w")["calls"]
    assert "timeout at" in calls[0]["args"], calls
    time.sleep(1.2)  # past the deadline: not a timing assertion, the run must time out whenever
    parked = json.loads(cli.run("resume", "--json", "w", check=True).stdout)
    assert parked["status"] == "waiting"  # at the second wait: the first timed out
    cli.run("signal", "w", "note", "--value", "7", check=True)
    done = json.loads(cli.run("resume", "--json", "w", check=True).stdout)
    assert done["result"] == ["timed out", 7]


def test_a_signal_sent_after_the_deadline_of_a_crashed_wait_goes_to_the_next_wait(tmp_path):
    """Uninterrupted, a signal sent after `wait_for(timeout=T)` timed out reaches the next
    wait.  With the run killed inside the first wait and the signal sent after its deadline,
    the first wait used to take it on resume: now it goes to the next wait, as before."""
    script = tmp_path / "w.py"
    script.write_text(DEADLINE_AGENT)
    cli = Cli(tmp_path)
    _killed_in_its_wait(cli, "late", script, "1")
    time.sleep(1.2)
    sent = cli.run("signal", "late", "note", "--value", "5", check=True)
    assert "note@2" in sent.stdout
    done = json.loads(cli.run("resume", "--json", "late", check=True).stdout)
    assert done["result"] == ["timed out", 5]
    # sent before the deadline, it is the first wait's, as uninterrupted
    _killed_in_its_wait(cli, "early", script, "300")
    assert "note@1" in cli.run("signal", "early", "note", "--value", "6", check=True).stdout
    json.loads(cli.run("resume", "--json", "early", check=True).stdout)
    cli.run("signal", "early", "note", "--value", "8", check=True)
    done = json.loads(cli.run("resume", "--json", "early", check=True).stdout)
    assert done["result"] == [6, 8]


def test_an_approval_whose_timeout_passed_is_refused(tmp_path):
    """`tcc approve` after an approval's deadline is refused, as a late signal is never the
    timed-out wait's: a run resumed later gets TimeoutError, as it would have running."""
    script = tmp_path / "a.py"
    script.write_text("import tcc\nasync def main():\n    try:\n"
                      "        return await tcc.approval('ship?', timeout=0.5)\n"
                      "    except TimeoutError:\n        return 'timed out'\n")
    cli = Cli(tmp_path)
    cli.run("run", "--run-id", "a", str(script), check=True)  # parks at the approval
    time.sleep(0.7)
    late = cli.run("approve", "a")
    assert late.returncode == 2 and "timed out at" in late.stderr, late.stderr
    done = json.loads(cli.run("resume", "--json", "a", check=True).stdout)
    assert done["result"] == "timed out"
