"""Child runs (`tcc.spawn`) and verified completion."""

from __future__ import annotations

import json

from tests._support.runs import AGENTS, Cli

WAIT = str(AGENTS / "wait_agent.py")


def test_child_run_has_its_own_journal_and_is_listed(tmp_path):
    """tcc.spawn runs a child run with its own id and journal; the parent lists it."""
    cli = Cli(tmp_path)
    doc = json.loads(cli.run("run", "--json", "--run-id", "p", f"{WAIT}:parent", check=True).stdout)
    assert doc["result"] == ["did parent start", ["did kid 0", "did kid 1", "did kid 2"], "did parent end"]
    parent = cli.show("p")
    assert parent["children"] == ["p.2"]
    child = cli.show("p.2")
    assert child["status"] == "completed" and child["parent"] == "p" and child["effects"] == 3


def test_child_survives_a_parent_crash_without_starting_twice(tmp_path):
    """SIGKILL inside the child: resuming the parent re-attaches to the child, which is not restarted."""
    ledger = tmp_path / "ledger.txt"
    cli = Cli(tmp_path, LEDGER=str(ledger), DIE_AT="kid 1")
    died = cli.run("run", "--run-id", "q", f"{WAIT}:parent")
    assert died.returncode == -9
    healthy = Cli(tmp_path, LEDGER=str(ledger))
    healthy.env.pop("DIE_AT", None)
    doc = json.loads(healthy.run("resume", "--json", "q", check=True).stdout)
    assert doc["result"] == ["did parent start", ["did kid 0", "did kid 1", "did kid 2"], "did parent end"]
    lines = [line.split(" ", 1)[1] for line in ledger.read_text().splitlines()]
    assert lines.count("kid 0") == 1 and lines.count("parent start") == 1
    assert cli.show("q")["children"] == ["q.2"]  # one child, attached once


def test_verify_passes_or_leaves_the_run_unverified(tmp_path):
    """A script's verify() decides between completed and unverified, with the evidence recorded."""
    cli = Cli(tmp_path)
    ok = json.loads(cli.run("run", "--json", "--run-id", "v1", f"{WAIT}:checked", "fine", check=True).stdout)
    assert ok["status"] == "completed"
    bad = cli.run("run", "--json", "--run-id", "v2", f"{WAIT}:checked", "bad")
    assert bad.returncode == 1
    assert json.loads(bad.stdout)["status"] == "unverified"
    shown = cli.show("v2")
    assert shown["status"] == "unverified" and shown["result"] == "did bad"
    assert "failed the check" in shown["error"]
    assert any(e["kind"] == "verification_failed" for e in shown["events"])


def test_worker_resumes_a_parent_once_its_waiting_child_finished(tmp_path):
    """A parent parked on a child that waits for an approval says which child to look at; once
    the child is approved and finished (by the worker), the worker resumes the parent too,
    so the parent does not wait for ever, and `tcc run` never tells the user to send a
    signal named None."""
    cli = Cli(tmp_path)
    proc = cli.run("run", "--run-id", "pg", f"{WAIT}:parent_of_gated", check=True)
    child = cli.show("pg")["children"][0]
    assert f"waiting for child run {child} (waiting)" in proc.stdout, proc.stdout
    assert "None" not in proc.stdout
    idle = cli.run("worker", "--once", check=True)  # nothing is due yet
    assert "resuming" not in idle.stderr, idle.stderr
    cli.run("approve", child, check=True)
    first = cli.run("worker", "--once", check=True)
    assert f"resuming {child} (signal arrived)" in first.stderr, first.stderr
    assert cli.show(child)["status"] == "completed"
    second = cli.run("worker", "--once", check=True)
    assert "resuming pg (child finished)" in second.stderr, second.stderr
    parent = cli.show("pg")
    assert parent["status"] == "completed"
    assert parent["result"] == ["did child 3 True", "did parent end"]


def test_spawn_with_arguments_the_child_cannot_take_raises_in_the_parent(tmp_path):
    """tcc.spawn with bad arguments raises TypeError in the parent's code, which can handle
    it; the usage error never escapes the parent's driver, which would leave it running."""
    cli = Cli(tmp_path)
    doc = json.loads(cli.run("run", "--json", "--run-id", "sb", f"{WAIT}:spawns_badly", check=True).stdout)
    assert doc["status"] == "completed" and doc["result"][0] == "refused", doc
    assert "cannot be called with the arguments" in doc["result"][1]
    assert [r["id"] for r in json.loads(cli.run("ls", "--json", check=True).stdout)] == ["sb"]


def test_sigterm_inside_a_child_stops_the_parent_without_failing_its_spawn(tmp_path):
    """SIGTERM while a spawned child runs in the parent's process stops both; a resume
    finishes both: the parent does not journal the stopped child as a failed spawn, which
    would be final."""
    import signal
    import time

    cli = Cli(tmp_path, STEP_DELAY="0.3")
    proc = cli.popen("run", "--json", "--run-id", "ps", f"{WAIT}:parent_of_slow")
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline and proc.poll() is None
        shown = cli.run("show", "--json", "ps")
        children = json.loads(shown.stdout)["children"] if shown.returncode == 0 else []
        if children and cli.show(children[0])["effects"] >= 1:
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and json.loads(out)["status"] == "stopped", (out, err)
    done = json.loads(Cli(tmp_path).run("resume", "--json", "ps", check=True).stdout)
    assert done["status"] == "completed", done
    assert done["result"] == ["parent", [f"did step {i}" for i in range(6)]]


def test_cancel_of_a_parent_cancels_its_waiting_child(tmp_path):
    """Cancelling a parent also cancels the unfinished child it spawned: nothing would ever
    resume a child whose parent is cancelled, so it would wait for ever.  The
    output names each child cancelled; a finished child is left as it was."""
    cli = Cli(tmp_path)
    cli.run("run", "--run-id", "pc", f"{WAIT}:parent_of_gated", check=True)
    child = cli.show("pc")["children"][0]
    assert cli.show(child)["status"] == "waiting"
    doc = json.loads(cli.run("cancel", "--json", "pc", check=True).stdout)
    assert doc["status"] == "cancelled" and doc["children"] == [{"id": child, "was": "waiting"}]
    assert cli.show(child)["status"] == "cancelled"
    idle = cli.run("worker", "--once", check=True)
    assert "resuming" not in idle.stderr, idle.stderr
    cli.run("run", "--run-id", "pe", f"{WAIT}:parent_of_gated", check=True)
    kid = cli.show("pe")["children"][0]
    cli.run("approve", kid, check=True)
    cli.run("worker", "--once", check=True)  # the child finishes; the parent waits for the next poll
    assert (cli.show(kid)["status"], cli.show("pe")["status"]) == ("completed", "waiting")
    text = cli.run("cancel", "pe", check=True)
    assert "cancelled run pe" in text.stdout and "child run" not in text.stdout, text.stdout
    assert cli.show(kid)["status"] == "completed"


def test_a_child_spawned_after_its_parent_was_cancelled_is_cancelled_too(tmp_path):
    """If `tcc cancel` of the parent commits while the parent is spawning (after the cancel
    listed the parent's children), the spawn cancels the new child itself and stops the
    parent, so no child is left waiting for ever."""
    import pytest

    from tcc import errors, runtime
    from tcc.store import open_store

    with open_store(tmp_path / "store") as store:
        parent = store.create_run(f"{WAIT}:parent_of_gated", b"[]", run_id="pp")
        store.cancel_run("pp", reason="test")
        with pytest.raises(errors.FencedError, match="was cancelled while it spawned child run 'pp.1'"):
            runtime.start(store, f"{WAIT}:gated_child", ["3"], run_id="pp.1", parent="pp")
        assert store.get_run("pp.1").status == "cancelled"
        assert store.get_run(parent.run_id).status == "cancelled"
