"""`tcc fork`: a new run from a snapshot, optionally with a changed local."""

from __future__ import annotations

import json

from tests._support.runs import AGENTS, Cli

WAIT = str(AGENTS / "wait_agent.py")


def test_fork_with_set_changes_the_result_and_leaves_the_parent_alone(tmp_path):
    """A fork with --set gives a different result; the parent's result and journal are unchanged."""
    cli = Cli(tmp_path)
    parent = json.loads(cli.run("run", "--json", "--run-id", "p", f"{WAIT}:forkable", check=True).stdout)
    assert parent["result"] == ["did question", "did follow-up to did question"]
    snaps = cli.show("p")["snapshots"]
    second = snaps[1]["number"]  # taken at `await tcc.checkpoint()`, after the first effect
    forked = json.loads(cli.run("fork", "--json", "p", "--at", str(second), "--set", 'answer="forked"',
                                "--run-id", "f", check=True).stdout)
    assert forked == {"id": "f", "parent": "p"}
    assert cli.show("f")["status"] != "completed"
    done = json.loads(cli.run("resume", "--json", "f", check=True).stdout)
    assert done["result"] == ["forked", "did follow-up to forked"]
    after = cli.show("p")
    assert after["status"] == "completed" and after["result"] == parent["result"]
    assert any(e["kind"] == "fork" for e in after["events"])


def test_fork_without_set_replays_nothing_and_matches(tmp_path):
    """A plain fork of the newest snapshot resumes to the parent's result."""
    cli = Cli(tmp_path)
    cli.run("run", "--run-id", "p2", f"{WAIT}:gated", check=True)  # parks at the approval
    child = cli.run("fork", "p2", check=True).stdout.strip()
    cli.run("approve", child, check=True)
    done = json.loads(cli.run("resume", "--json", child, check=True).stdout)
    assert done["result"] == ["did prepare", True, "did deploy"]
    assert cli.show("p2")["status"] == "waiting"


def test_fork_set_unknown_local_is_a_usage_error(tmp_path):
    """--set of a name the frame does not have is refused and lists the locals."""
    cli = Cli(tmp_path)
    cli.run("run", "--run-id", "p3", f"{WAIT}:gated", check=True)
    before = cli.show("p3")["events"]
    proc = cli.run("fork", "p3", "--set", "nope=1")
    assert proc.returncode == 2 and "has no local 'nope'" in proc.stderr and "before" in proc.stderr
    assert [r["id"] for r in json.loads(cli.run("ls", "--json", check=True).stdout)] == ["p3"]
    # refused before the fork existed: the parent's history does not name a child that never was
    assert cli.show("p3")["events"] == before
    proc = cli.run("fork", "p3", "--answer", "1")  # it waits for an approval: nothing to replace
    assert proc.returncode == 2 and cli.show("p3")["events"] == before


def test_fork_of_a_missing_snapshot_is_a_usage_error_like_inspect(tmp_path):
    """`tcc fork --at N` of a snapshot that is not there, and a fork of a run without snapshots,
    exit 2 with the retained numbers or the reason, as `tcc inspect` does (not exit 1, and a
    completed replay run is never told to "resume it first")."""
    cli = Cli(tmp_path)
    cli.run("run", "--run-id", "src", f"{WAIT}:gated", check=True)
    retained = [s["number"] for s in cli.show("src")["snapshots"]]
    for cmd in ("fork", "inspect"):
        proc = cli.run(cmd, "--at", "99", "src")
        assert proc.returncode == 2, proc.stderr
        assert f"has no snapshot 99; retained: {', '.join(map(str, retained))}" in proc.stderr
    cli.run("run", "--run-id", "rp", "--strategy", "replay", f"{WAIT}:sleeper", "0", check=True)
    proc = cli.run("fork", "rp")
    assert proc.returncode == 2 and "has no snapshot to fork (a --strategy replay run takes none)" \
        in proc.stderr, proc.stderr
    assert [r["id"] for r in json.loads(cli.run("ls", "--json", check=True).stdout)] == ["rp", "src"]


def test_a_worker_leaves_a_fork_nobody_started_alone_and_takes_over_one_that_was(tmp_path):
    """A fork starts only with `tcc resume` (README): a worker used to see it as a run whose
    owner (the `tcc fork` process) died and ran its effects at once.  Once a resume has
    started it, a fork is a run like any other: killed, the worker takes it over."""
    cli = Cli(tmp_path)
    cli.run("run", "--run-id", "p", f"{WAIT}:forkable", check=True)
    first = cli.show("p")["snapshots"][0]["number"]  # after the first effect
    cli.run("fork", "p", "--at", str(first), "--answer", '"what-if"', "--run-id", "f", check=True)
    shown = cli.show("f")
    assert shown["unstarted_fork"] is True and shown["epoch"] == 1
    # the call the fork's snapshot was taken after shows the fork's answer, not the parent's
    answered = shown["calls"][-1]
    assert answered["result"] == "'what-if' (the fork's --answer; the parent got 'did question')", answered
    assert "a fork nobody started: `tcc resume f` starts it" in cli.run("show", "f", check=True).stdout
    worker = cli.run("worker", "--once", check=True)
    assert "resuming f" not in worker.stderr
    after = cli.show("f")
    assert (after["status"], after["epoch"], after["effects"]) == ("running", 1, shown["effects"])
    # started by a resume that is killed (SIGKILL after its first step): the worker finishes it
    killer = Cli.__new__(Cli)
    killer.store, killer.env = cli.store, dict(cli.env, TCC_TEST_KILL_AFTER="1")
    assert killer.run("resume", "f").returncode == -9
    assert cli.show("f")["unstarted_fork"] is False
    worker = cli.run("worker", "--once", check=True)
    assert "resuming f" in worker.stderr
    done = cli.show("f")
    assert done["status"] == "completed" and done["result"] == ["what-if", "did follow-up to what-if"]
