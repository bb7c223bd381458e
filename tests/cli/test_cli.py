"""`tcc run`, `resume`, `ls` and `show` through the command line."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

import tcc
from tests._support.runs import AGENTS, Cli

MISC = str(AGENTS / "misc_agent.py")


def test_run_prints_id_and_result_and_show_reports_it(tmp_path):
    """A completed run exits 0, prints its id and result, and `show --json` has the contract fields."""
    cli = Cli(tmp_path)
    proc = cli.run("run", "--json", f"{MISC}:ok", "5", check=True)
    doc = json.loads(proc.stdout)
    assert doc["status"] == "completed" and doc["result"] == [5, 6, True]
    assert proc.stderr.startswith("run ")
    shown = cli.show(doc["id"])
    for field in ("id", "status", "result", "error", "effects", "checkpoints"):
        assert field in shown
    assert shown["status"] == "completed" and shown["result"] == [5, 6, True]
    assert shown["effects"] == 2 and shown["checkpoints"] >= 2
    listing = json.loads(cli.run("ls", "--json", check=True).stdout)
    assert [r["id"] for r in listing] == [doc["id"]]
    assert json.loads(cli.run("ls", "--json", "--status", "failed", check=True).stdout) == []


def test_text_output_and_exit_codes(tmp_path):
    """Plain output shows the result; a failing agent exits 1 with a one-line reason."""
    cli = Cli(tmp_path)
    ok = cli.run("run", f"{MISC}:ok", check=True)
    assert ok.stdout.splitlines()[0].startswith("run ")
    assert ok.stdout.splitlines()[-1] == "completed: [1, 2, true]"
    bad = cli.run("run", "--run-id", "b1", f"{MISC}:boom")
    assert bad.returncode == 1
    assert bad.stderr.strip() == "failed: ValueError: agent gave up"
    shown = cli.show("b1")
    assert shown["status"] == "failed" and shown["error"] == "ValueError: agent gave up"


@pytest.mark.parametrize(
    "args, needle",
    [
        (("run", "/nonexistent/agent.py"), "does not exist"),
        (("run", f"{MISC}:nope"), "has no function 'nope'"),
        (("run", f"{MISC}:Helper"), "'Helper' is a class, not a function"),
        (("run", f"{MISC}:Helper.run"), "the entry 'Helper.run' names an attribute of an attribute"),

        (("resume", "no-such-run"), "no-such-run"),
    ],
)
def test_usage_errors_are_one_line_without_traceback(tmp_path, args, needle):
    """Bad input gives exit 2 (usage) or 1 (tcc error) and a single clear line."""
    cli = Cli(tmp_path)
    cli.run("run", f"{MISC}:ok", check=True)  # create the store
    proc = cli.run(*args)
    assert proc.returncode in (1, 2)
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_completed_run_cannot_be_resumed(tmp_path):
    """Resuming a completed run is refused; it never completes twice."""
    cli = Cli(tmp_path)
    cli.run("run", "--run-id", "done", f"{MISC}:ok", check=True)
    proc = cli.run("resume", "done")
    assert proc.returncode == 2 and "already completed" in proc.stderr
    assert "resuming" not in proc.stdout + proc.stderr  # refused before it says it resumes
    assert cli.show("done")["status"] == "completed"


def test_script_main_block_does_not_run_under_tcc(tmp_path):
    """The script is loaded under a stable module name, so its __main__ block stays quiet."""
    mark = tmp_path / "mark.txt"
    cli = Cli(tmp_path, MARK=str(mark))
    cli.run("run", f"{MISC}:ok", check=True)
    assert not mark.exists()


def test_effects_outside_a_run_just_run():
    """Calling an effect outside a run calls the function (tools stay unit-testable)."""

    @tcc.effect
    def add(a, b):
        return a + b

    @tcc.effect(retries=1)
    async def aadd(a, b):
        return a + b

    import asyncio

    assert add(2, 3) == 5
    assert asyncio.run(aadd(2, 3)) == 5
    with pytest.raises(LookupError):
        tcc.current()


def test_unpicklable_local_fails_the_run_and_names_it(tmp_path):
    """A lock held across an effect fails the run with the frame and variable named."""
    cli = Cli(tmp_path)
    proc = cli.run("run", "--run-id", "lk", f"{MISC}:holds_lock")
    assert proc.returncode == 1
    assert "holds_lock() line" in proc.stderr and "local 'guard'" in proc.stderr
    shown = cli.show("lk")
    assert shown["status"] == "failed"
    assert "local 'guard'" in shown["error"]
    assert shown["checkpoints"] >= 1  # the snapshot before the lock is kept
    assert proc.stderr.splitlines()[-1].startswith("failed: CaptureError: checkpoint failed")


def test_a_run_failed_at_a_checkpoint_prints_its_outcome_with_json(tmp_path):
    """`--json` gives one object for a run that a checkpoint failed too (it used to print
    nothing on stdout, only an error line), with the same fields as any other outcome."""
    cli = Cli(tmp_path)
    proc = cli.run("run", "--json", "--run-id", "lk", f"{MISC}:holds_lock")
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    assert doc["id"] == "lk" and doc["status"] == "failed" and doc["result"] is None
    assert doc["error"].startswith("CaptureError: checkpoint failed, the previous snapshot is kept")
    assert "local 'guard'" in doc["error"] and doc["effects"] == 2
    assert "tcc: error" not in proc.stderr
    assert cli.show("lk")["status"] == "failed"


def test_resource_keeps_a_live_object_across_checkpoints(tmp_path):
    """tcc.resource wraps a lock so the run checkpoints and completes."""
    cli = Cli(tmp_path)
    doc = json.loads(cli.run("run", "--json", f"{MISC}:with_resource", check=True).stdout)
    assert doc["status"] == "completed" and doc["result"] is False


def test_gather_runs_effects_concurrently_and_journals_each(tmp_path):
    """tcc.gather returns results in order and journals one completion per effect."""
    cli = Cli(tmp_path, SLOW="0.3")
    t0 = time.monotonic()
    doc = json.loads(cli.run("run", "--json", f"{MISC}:concurrent", check=True).stdout)
    assert doc["result"] == [1, 2, 3]
    assert doc["effects"] == 3
    assert cli.show(doc["id"])["effects"] == 3
    del t0  # concurrency itself is measured in benchmarks, not asserted here


def test_retries_and_thrown_errors(tmp_path):
    """A flaky effect is retried; an effect that keeps failing raises inside the agent."""
    cli = Cli(tmp_path)
    counter = tmp_path / "count"
    doc = json.loads(cli.run("run", "--json", f"{MISC}:retrying", str(counter), check=True).stdout)
    assert doc["result"] == 3 and counter.read_text() == "3"
    doc = json.loads(cli.run("run", "--json", f"{MISC}:catches", check=True).stdout)
    assert doc["result"] == "caught service down"


def test_awaiting_asyncio_inside_a_run_is_explained(tmp_path):
    """Awaiting an asyncio future inside a run fails with an explanation."""
    cli = Cli(tmp_path)
    proc = cli.run("run", f"{MISC}:awaits_future")
    assert proc.returncode == 1
    assert "asyncio APIs do not work inside a tcc run" in proc.stderr


def test_changed_script_is_refused_on_resume_and_replay_is_offered(tmp_path):
    """After the script changes, resume on the current code refuses with a hint; --strategy
    replay re-executes.  (By default a resume continues on the recorded code: test_pinned_code.)"""
    script = tmp_path / "agent.py"
    source = (AGENTS / "ledger_agent.py").read_text()
    script.write_text(source)
    ledger = tmp_path / "ledger.txt"
    # SALT=step: replay serves a journaled answer only to the same call, so the agent's
    # arguments must not be random
    cli = Cli(tmp_path, LEDGER=str(ledger), DELAY="0.2", STEPS="6", SALT="step")
    proc = cli.popen("run", "--run-id", "drift", str(script))
    while not ledger.exists() or len(ledger.read_text().splitlines()) < 3:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    script.write_text(source.replace("assert value // 1000 == step", "assert value // 1000 == step, 'x'"))
    refused = cli.run("resume", "--code", "current", "drift")
    assert refused.returncode == 1
    assert "has changed since the snapshot" in refused.stderr
    assert "--strategy replay" in refused.stderr
    assert cli.show("drift")["status"] == "running"
    replayed = cli.run("resume", "--strategy", "replay", "--json", "drift", check=True)
    doc = json.loads(replayed.stdout)
    assert doc["status"] == "completed" and doc["result"]["steps"] == 6
    assert doc["replayed"] >= 2


def test_live_owner_blocks_resume_until_dead(tmp_path):
    """A resume is refused while the owner is alive, and succeeds at once after it is killed."""
    ledger = tmp_path / "ledger.txt"
    cli = Cli(tmp_path, LEDGER=str(ledger), DELAY="0.3", STEPS="8")
    owner = cli.popen("run", "--run-id", "lease", str(AGENTS / "ledger_agent.py"))
    while not ledger.exists():
        time.sleep(0.05)
    blocked = cli.run("resume", "lease")
    assert blocked.returncode == 1 and "is owned by" in blocked.stderr
    owner.kill()
    owner.communicate()
    doc = json.loads(cli.run("resume", "--json", "lease", check=True).stdout)
    assert doc["status"] == "completed"
    assert cli.show("lease")["epoch"] == 2


def test_without_native_module_runs_recover_by_replay(tmp_path):
    """With the native module disabled, tcc run says so once and recovers by replaying the journal."""
    ledger = tmp_path / "ledger.txt"
    cli = Cli(tmp_path, LEDGER=str(ledger), DELAY="0.1", STEPS="6", TCC_DISABLE_NATIVE="1", SALT="step")
    proc = cli.popen("run", "--run-id", "nonative", str(AGENTS / "ledger_agent.py"))
    while not ledger.exists() or len(ledger.read_text().splitlines()) < 2:
        time.sleep(0.05)
    proc.kill()
    _out, err = proc.communicate()
    assert err.count("tcc._native is not available") == 1
    doc = json.loads(cli.run("resume", "--json", "nonative", check=True).stdout)
    assert doc["status"] == "completed" and doc["result"]["steps"] == 6
    assert doc["checkpoints"] == 0 and doc["replayed"] >= 1
    assert cli.show("nonative")["strategy"] == "replay"
    assert os.path.exists(ledger)


def test_cancel_stops_a_live_owner_and_keeps_the_run_cancelled(tmp_path):
    """`tcc cancel` fences the process running the run: it stops at its next effect or
    checkpoint with a clear error and writes nothing more; resume and cancel then say
    the run is already cancelled (exit 2), and show keeps its history."""
    ledger = tmp_path / "ledger.txt"
    cli = Cli(tmp_path, LEDGER=str(ledger), DELAY="0.3", STEPS="40")
    owner = cli.popen("run", "--run-id", "c", str(AGENTS / "ledger_agent.py"))
    deadline = time.monotonic() + 60
    while not (ledger.exists() and len(ledger.read_text().splitlines()) >= 2):
        assert time.monotonic() < deadline and owner.poll() is None
        time.sleep(0.05)
    doc = json.loads(cli.run("cancel", "--json", "--reason", "changed my mind", "c", check=True).stdout)
    assert (doc["status"], doc["was"], doc["epoch"]) == ("cancelled", "running", 2)
    lines, effects = len(ledger.read_text().splitlines()), cli.show("c")["effects"]
    _, err = owner.communicate(timeout=60)
    assert owner.returncode == 1, err
    errors = [ln for ln in err.splitlines() if ln.startswith("tcc: error:")]
    assert len(errors) == 1 and "was cancelled" in errors[0] and "Traceback" not in err, err
    # at most the effect already running when it was cancelled ran to the end; none was journalled
    assert lines <= len(ledger.read_text().splitlines()) <= lines + 1
    shown = cli.show("c")
    assert (shown["status"], shown["epoch"], shown["effects"]) == ("cancelled", 2, effects)
    cancelled = [e for e in shown["events"] if e["kind"] == "cancelled"]
    assert len(cancelled) == 1 and cancelled[0]["data"]["reason"] == "changed my mind", cancelled
    assert shown["events"][-1]["kind"] == "cancelled"  # the owner wrote nothing after it
    for args in (("resume", "c"), ("cancel", "c")):
        again = cli.run(*args)
        assert again.returncode == 2 and "already cancelled" in again.stderr, again.stderr


def test_cancel_refuses_completed_and_unknown_runs(tmp_path):
    """A completed run cannot be cancelled (exit 2, unchanged); an unknown id is named."""
    cli = Cli(tmp_path)
    cli.run("run", "--run-id", "done", f"{MISC}:ok", "1", check=True)
    proc = cli.run("cancel", "done")
    assert proc.returncode == 2 and "already completed" in proc.stderr, proc.stderr
    assert cli.show("done")["status"] == "completed"
    proc = cli.run("cancel", "nope")
    assert proc.returncode != 0 and "'nope'" in proc.stderr and "Traceback" not in proc.stderr


def test_bad_arguments_are_refused_before_a_run_is_stored(tmp_path):
    """Arguments the entry cannot take, or a generator entry, are usage errors (exit 2) before
    anything is stored, not internal errors after the run record exists, so no run is left
    `running` for ever."""
    cli = Cli(tmp_path)
    script = tmp_path / "a.py"
    script.write_text("async def main(n='1'):\n    return int(n)\n\n"
                      "async def agen():\n    yield 1\n\n"
                      "def gen():\n    yield 1\n")
    cli.run("run", "--run-id", "ok", str(script), "2", check=True)  # creates the store
    for args, needle in (
        (("run", str(script), "1", "2", "--json"), "cannot be called with the arguments"),
        (("run", f"{script}:agen"), "is a generator function"),
        (("run", f"{script}:gen"), "is a generator function"),
    ):
        proc = cli.run(*args)
        assert proc.returncode == 2, proc.stderr
        assert needle in proc.stderr and "internal error" not in proc.stderr, proc.stderr
        assert "note:" not in proc.stderr, proc.stderr  # no misleading "plain function" note
    assert "options go before SCRIPT" in cli.run("run", str(script), "1", "--json").stderr
    proc = cli.run("run", str(tmp_path))
    assert proc.returncode == 2 and "is a directory" in proc.stderr, proc.stderr
    proc = cli.run("resume", "nosuch")
    assert proc.returncode == 1 and proc.stdout == "" and "no run 'nosuch'" in proc.stderr
    assert [r["id"] for r in json.loads(cli.run("ls", "--json", check=True).stdout)] == ["ok"]


@pytest.mark.parametrize("args, needle", [
    (("run", "--run-id", "bad/id", f"{MISC}:ok"), "invalid run id 'bad/id'"),
    (("show", "bad/id"), "invalid run id 'bad/id'"),
    (("ls", "--tenant", "bad tenant"), "invalid tenant 'bad tenant'"),
    (("run", "--checkpoint-every", "0", f"{MISC}:ok"), "--checkpoint-every must be at least 1"),
    (("run", "--lease", "-5", f"{MISC}:ok"), "--lease must be more than 0"),
    (("worker", "--poll", "-1"), "--poll must be more than 0"),
    (("worker", "--concurrency", "0"), "--concurrency must be at least 1"),
    (("run", "--run-id", "", f"{MISC}:ok"), "a run id cannot be empty"),
    (("run", "--lease", "nan", f"{MISC}:ok"), "--lease must be a finite number"),
    (("resume", "--lease", "inf", "x"), "--lease must be a finite number"),
])
def test_bad_names_and_numbers_are_usage_errors(tmp_path, args, needle):
    """Bad ids, tenants and option values: one line, exit 2, no store created (review
    finding: several were "internal error ... please report it")."""
    cli = Cli(tmp_path / "fresh")
    proc = cli.run(*args)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    assert not cli.store.exists()


def test_durability_from_the_environment_is_checked(tmp_path):
    """An unknown $TCC_DURABILITY is a usage error naming the variable."""
    proc = Cli(tmp_path, TCC_DURABILITY="fast").run("ls")
    assert proc.returncode == 2 and "TCC_DURABILITY='fast'" in proc.stderr, proc.stderr


def test_top_level_debug_flag_is_honoured(tmp_path):
    """`tcc --debug COMMAND` shows the traceback, like `tcc COMMAND --debug`: the subcommand's
    own default for --debug does not switch the top-level flag off."""
    cli = Cli(tmp_path)
    cli.run("run", f"{MISC}:ok", check=True)
    for args in (("--debug", "show", "nope"), ("show", "--debug", "nope")):
        proc = cli.run(*args)
        assert "Traceback" in proc.stderr and "RunNotFoundError" in proc.stderr, proc.stderr
    assert "Traceback" not in cli.run("show", "nope").stderr


def test_signals_and_answers_to_runs_that_cannot_read_them(tmp_path):
    """A signal to a completed or cancelled run is refused (exit 2); approving an unknown run
    says it does not exist (exit 1, like every other command)."""
    cli = Cli(tmp_path)
    cli.run("run", "--run-id", "done", f"{MISC}:ok", check=True)
    proc = cli.run("signal", "done", "note", "--value", "1")
    assert proc.returncode == 2 and "already completed" in proc.stderr, proc.stderr
    proc = cli.run("approve", "nosuch")
    assert proc.returncode == 1 and "no run 'nosuch'" in proc.stderr, proc.stderr


def test_missing_store_message_names_the_cli_remedy(tmp_path):
    """`tcc ls` where nothing has run yet says so, and how to point at a store."""
    proc = Cli(tmp_path / "none").run("ls")
    assert proc.returncode == 1, proc.stderr
    assert "nothing was stored there yet" in proc.stderr and "--store" in proc.stderr


@pytest.mark.parametrize("code, status, rc", [(4, "failed", 1), (0, "completed", 0), (None, "completed", 0)])
def test_sys_exit_inside_the_agent_ends_the_run(tmp_path, code, status, rc):
    """An agent that calls sys.exit() ends its run as a script would: a code of 0 or None
    completes it, any other code fails it with a message naming the call (the process does
    not just exit with the code: that would leave the run `running`, and each takeover by
    the worker would call sys.exit again)."""
    script = tmp_path / "quits.py"
    script.write_text("import sys\n\nasync def main():\n"
                      f"    sys.exit({code!r})\n")
    cli = Cli(tmp_path)
    proc = cli.run("run", "--run-id", "q", str(script))
    assert proc.returncode == rc, proc.stderr
    shown = cli.show("q")
    assert shown["status"] == status
    if status == "failed":
        assert "the agent called sys.exit(4)" in shown["error"]
        assert "the agent called sys.exit(4)" in proc.stderr
    assert "resuming" not in cli.run("worker", "--once", check=True).stderr


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_sys_exit_inside_an_effect_ends_the_run(tmp_path, kind):
    """sys.exit() inside a sync (thread) or async effect ends the run the same way (review
    finding: only the agent's own code was covered, and the worker re-ran the effect)."""
    script = tmp_path / "effect_quits.py"
    script.write_text("import sys\nimport tcc\n\n@tcc.effect\ndef quit_now(n):\n    sys.exit(n)\n\n"
                      "@tcc.effect\nasync def aquit(n):\n    sys.exit(n)\n\n"
                      "async def main(kind):\n"
                      "    await (quit_now(5) if kind == 'sync' else aquit(5))\n    return 'after'\n")
    cli = Cli(tmp_path)
    proc = cli.run("run", "--run-id", "e", str(script), kind)
    assert proc.returncode == 1, proc.stderr
    shown = cli.show("e")
    assert shown["status"] == "failed" and "an effect of the agent called sys.exit(5)" in shown["error"]
    assert "resuming" not in cli.run("worker", "--once", check=True).stderr


def test_sys_exit_while_the_script_is_imported_is_a_clear_error(tmp_path):
    """A script that calls sys.exit() at import time is reported in one line, and no run is
    created; tcc does not exit with the script's code in silence."""
    script = tmp_path / "early.py"
    script.write_text("import sys\nsys.exit(3)\n\nasync def main():\n    return 1\n")
    cli = Cli(tmp_path)
    proc = cli.run("run", str(script))
    assert proc.returncode == 1
    assert f"script {script} called sys.exit(3) while it was imported" in proc.stderr
    assert json.loads(cli.run("ls", "--json").stdout or "[]") == []
