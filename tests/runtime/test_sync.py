"""Sync scripts run on a greenlet driver and recover by replaying the journal."""

from __future__ import annotations

import json

from tests._support.runs import AGENTS, Cli

WAIT = str(AGENTS / "wait_agent.py")


def test_sync_main_runs_and_says_its_strategy(tmp_path):
    """A plain `def main` runs its effects through the driver; the run records strategy replay."""
    cli = Cli(tmp_path)
    proc = cli.run("run", "--json", "--run-id", "s", f"{WAIT}:sync_main", "3", check=True)
    assert "sync frames cannot be captured" in proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["result"] == ["did sync 0", "did sync 1", "did sync 2", "did after"]
    shown = cli.show("s")
    assert shown["strategy"] == "replay" and shown["effects"] == 4


def test_sync_run_killed_mid_run_recovers_without_repeating_effects(tmp_path):
    """After SIGKILL, a sync run replays its journal: finished effects are not run again."""
    ledger = tmp_path / "ledger.txt"
    cli = Cli(tmp_path, LEDGER=str(ledger), SYNC_DIE="1")
    died = cli.run("run", "--run-id", "k", f"{WAIT}:sync_main", "3")
    assert died.returncode == -9
    again = Cli(tmp_path, LEDGER=str(ledger), SYNC_DIE="1", SYNC_RESUMED="1")
    doc = json.loads(again.run("resume", "--json", "k", check=True).stdout)
    assert doc["result"] == ["did sync 0", "did sync 1", "did sync 2", "did after"]
    assert doc["replayed"] == 3
    lines = ledger.read_text().splitlines()
    assert [line.split()[1:] for line in lines] == [["sync", "0"], ["sync", "1"], ["sync", "2"], ["after"]]
