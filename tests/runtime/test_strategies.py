"""Recovery strategies: continuation, hybrid (snapshot every K) and replay."""

from __future__ import annotations

import json

import pytest

from tests._support.runs import AGENTS, Cli

LEDGER_AGENT = str(AGENTS / "ledger_agent.py")
STEPS = 12


@pytest.mark.parametrize(
    "strategy, extra, stored",
    [
        ("continuation", (), "continuation"),
        ("hybrid", ("--snapshot-every", "3"), "hybrid:3"),
        ("replay", (), "replay"),
    ],
)
def test_each_strategy_recovers_a_killed_run_to_the_same_result(tmp_path, strategy, extra, stored):
    """A run SIGKILLed inside step 9 resumes to the uninterrupted result under every strategy."""
    ledger = tmp_path / "ledger.txt"
    reference = Cli(tmp_path / "ref", LEDGER=str(tmp_path / "ref-ledger.txt"), STEPS=str(STEPS))
    reference.env.pop("DIE_AT")
    expected = json.loads(reference.run("run", "--json", LEDGER_AGENT, check=True).stdout)["result"]

    # replay and hybrid serve journaled answers only to the same calls: a deterministic salt
    salt = {} if strategy == "continuation" else {"SALT": "step"}
    cli = Cli(tmp_path, LEDGER=str(ledger), STEPS=str(STEPS), **salt)
    dying = cli.run("run", "--run-id", "s", "--strategy", strategy, *extra, LEDGER_AGENT,
                    timeout=120, check=False)
    assert dying.returncode != 0
    assert cli.show("s")["strategy"] == stored
    survivor = Cli(tmp_path, LEDGER=str(ledger), STEPS=str(STEPS), **salt)
    survivor.env.pop("DIE_AT", None)
    doc = json.loads(survivor.run("resume", "--json", "s", check=True).stdout)
    assert doc["status"] == "completed" and doc["result"] == expected
    shown = survivor.show("s")
    assert shown["effects"] == STEPS
    served = {"continuation": 0, "hybrid": 8 - 6, "replay": 8}[strategy]
    assert doc["replayed"] == served, doc
    lines = ledger.read_text().splitlines()
    assert len(lines) == STEPS  # step 9 died before writing; nothing else repeated


@pytest.fixture(autouse=True)
def die_inside_step_nine(monkeypatch):
    monkeypatch.setenv("DIE_AT", "8")


def test_replay_reports_divergence_when_the_code_asks_for_another_effect(tmp_path):
    """Replaying a journal against code that now calls a different effect fails with a divergence error."""
    misc = str(AGENTS / "misc_agent.py")
    cli = Cli(tmp_path, DIE_AT="3")
    died = cli.run("run", "--run-id", "d", "--strategy", "replay", f"{misc}:diverge")
    assert died.returncode != 0
    changed = Cli(tmp_path, FLAVOR="b")
    changed.env.pop("DIE_AT", None)
    proc = changed.run("resume", "d")
    assert proc.returncode == 1
    assert "journal's next call is" in proc.stderr and "slow_echo" in proc.stderr
    same = Cli(tmp_path)
    same.env.pop("DIE_AT", None)
    doc = json.loads(same.run("resume", "--json", "d", check=True).stdout)
    assert doc["result"] == "done" and doc["replayed"] == 2
