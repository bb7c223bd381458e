"""``tcc submit`` on the embedded LMDB store: queued runs, started by a worker in the order
they were submitted; refused submissions store nothing."""

from __future__ import annotations

import json
import pathlib

from tcc.runtime import decode_result
from tcc.store import open_store
from tests._support.runs import AGENTS, Cli

LEDGER_AGENT = str(AGENTS / "ledger_agent.py")


def test_submitted_runs_start_in_submission_order(tmp_path: pathlib.Path) -> None:
    cli = Cli(tmp_path, LEDGER=str(tmp_path / "ledger"), SALT="step")
    ids = []
    for name in ("zeta", "alpha", "mid"):  # submission order differs from id order
        out = cli.run("submit", "--run-id", name, LEDGER_AGENT, "3", check=True)
        ids.append(out.stdout.strip())
    assert ids == ["zeta", "alpha", "mid"]
    out = cli.run("submit", "--json", LEDGER_AGENT, "2", check=True)
    last = json.loads(out.stdout)
    assert last["status"] == "queued" and last["entry"].endswith("ledger_agent.py:main")
    listed = json.loads(cli.run("ls", "--json", check=True).stdout)
    assert {r["status"] for r in listed} == {"queued"} and not any(r["held"] for r in listed)
    out = cli.run("worker", "--once", "--concurrency", "4", check=True)
    order = [line.split()[2] for line in out.stderr.splitlines() if "resuming" in line]
    assert order == [*ids, last["id"]], out.stderr
    assert all(line.endswith("(submitted)") for line in out.stderr.splitlines() if "resuming" in line)
    with open_store(str(cli.store)) as store:
        for run_id, steps in [("zeta", 3), ("alpha", 3), ("mid", 3), (last["id"], 2)]:
            run = store.get_run(run_id)
            assert run.status == "completed"
            assert decode_result(run.result) == {"steps": steps, "total": steps * (steps - 1) // 2,
                                                 "salts": steps}
            kinds = [e.kind for e in store.events(run_id)]
            assert kinds[:3] == ["created", "taken_over", "started"], kinds
            created = store.events(run_id)[0].data
            assert created["status"] == "queued" and created["on_code_change"] == "pinned"
            started = next(e for e in store.events(run_id) if e.kind == "started")
            assert started.data["queued"] is True and started.data["on_code_change"] == "pinned"


def test_a_queued_run_can_be_resumed_by_hand_or_cancelled(tmp_path: pathlib.Path) -> None:
    cli = Cli(tmp_path, LEDGER=str(tmp_path / "ledger"))
    cli.run("submit", "--run-id", "byhand", "--on-code-change", "refuse", LEDGER_AGENT, "2", check=True)
    cli.run("submit", "--run-id", "dropped", LEDGER_AGENT, "2", check=True)
    out = cli.run("resume", "byhand", check=True)
    assert "completed" in out.stdout
    cli.run("cancel", "dropped", check=True)
    out = cli.run("worker", "--once", check=True)
    assert "resuming" not in out.stderr  # nothing left to start
    detail = cli.show("byhand")
    assert detail["status"] == "completed"
    started = [e for e in detail["events"] if e["kind"] == "started"]
    assert started and started[0]["data"]["on_code_change"] == "refuse"
    assert cli.show("dropped")["status"] == "cancelled"


def test_bad_submissions_are_refused_and_store_nothing(tmp_path: pathlib.Path) -> None:
    cli = Cli(tmp_path, LEDGER=str(tmp_path / "ledger"))
    cli.run("submit", "--run-id", "taken", LEDGER_AGENT, "2", check=True)
    cases = [
        (["submit", str(tmp_path / "missing.py")], "missing.py"),
        (["submit", f"{LEDGER_AGENT}:nope"], "nope"),
        (["submit", LEDGER_AGENT, "1", "2", "3"], "argument"),
        (["submit", "--run-id", "taken", LEDGER_AGENT, "2"], "already exists"),
        (["submit", "--run-id=-x", LEDGER_AGENT], "run id"),
        (["submit", "--verify", "no_such_check", LEDGER_AGENT], "no_such_check"),
    ]
    for args, needle in cases:
        out = cli.run(*args)
        assert out.returncode != 0, args
        assert needle in out.stderr and "Traceback" not in out.stderr, (args, out.stderr)
    listed = json.loads(cli.run("ls", "--json", check=True).stdout)
    assert [r["id"] for r in listed] == ["taken"]
