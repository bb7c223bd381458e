"""SIGKILL `tcc run` / `tcc resume` at random moments; nothing acknowledged is lost.

The agent appends one ledger line per effect, tagged with the effect's
idempotency key.  After the run completes:

* the result equals an uninterrupted run's;
* every step's line is in the ledger (no missing step);
* a step appears twice only if it was in flight at a kill, with the same
  recorded value -- so duplicates <= kills; with a verify probe, never.

Sizes: ``TCC_CRASH_KILLS`` kills per test (default 20; the slow tier 500).
"""

from __future__ import annotations

import collections
import os
import random
import subprocess

import pytest

from tests._support.runs import AGENTS, Cli

KILLS = int(os.environ.get("TCC_CRASH_KILLS", "20"))
STEPS = 40
EXPECTED = {"steps": STEPS, "total": sum(range(STEPS)), "salts": STEPS}


def crash_until_done(tmp_path, kills: int, seed: int, **env: str) -> list[tuple[Cli, dict, int]]:
    """Kill runs of the ledger agent until ``kills`` SIGKILLs have landed.

    Each run is killed and resumed until it completes; if a run completes
    while kills remain, a new run (with its own ledger) takes over.  Returns
    (cli, final `tcc show --json`, kills that run took) for every run.
    """
    rng = random.Random(seed)
    scenarios = []
    landed = 0
    while landed < kills:
        folder = tmp_path / f"run{len(scenarios)}"
        folder.mkdir()
        cli = Cli(folder, LEDGER=str(folder / "ledger.txt"), DELAY="0.02", STEPS=str(STEPS), **env)
        run_id = f"crash{seed}-{len(scenarios)}"
        mine = 0
        while True:
            shown = cli.run("show", "--json", run_id)
            exists = shown.returncode == 0
            if exists and '"status": "completed"' in shown.stdout:
                break  # a kill landed after the final commit
            args = ("resume", run_id) if exists and rng.random() < 0.7 else (
                "run", "--run-id", run_id, str(AGENTS / "ledger_agent.py"))
            proc = cli.popen(*args)
            try:
                proc.wait(timeout=rng.uniform(0.15, 1.2) if landed < kills else 120)
            except subprocess.TimeoutExpired:
                proc.kill()  # SIGKILL
                proc.communicate()
                landed += 1
                mine += 1
                continue
            _out, err = proc.communicate()
            assert proc.returncode == 0, f"{args} exited {proc.returncode}: {err}"
            break
        scenarios.append((cli, cli.show(run_id), mine))
    return scenarios


def ledger_counts(cli: Cli) -> tuple[dict[str, list[str]], str]:
    path = cli.env["LEDGER"]
    values: dict[str, list[str]] = collections.defaultdict(list)
    with open(path) as fh:
        for line in fh:
            key, _, value = line.strip().partition(" ")
            values[key].append(value)
    return values, path


def check_at_least_once(cli: Cli, doc: dict, kills: int) -> int:
    assert doc["status"] == "completed", doc
    assert doc["result"] == EXPECTED
    assert doc["effects"] == STEPS
    values, _ = ledger_counts(cli)
    for step in range(1, STEPS + 1):
        assert f"{doc['id']}:{step}" in values, f"step {step} missing from the ledger"
    duplicates = sum(len(v) - 1 for v in values.values())
    assert duplicates <= kills, (duplicates, kills)
    for key, seen in values.items():
        assert len(set(seen)) == 1, f"{key} was re-issued with different arguments: {seen}"
    return duplicates


def test_sigkill_during_run_and_resume_loses_nothing(tmp_path):
    """Repeated SIGKILLs: completed, exact result, no missing step, duplicates <= kills."""
    scenarios = crash_until_done(tmp_path, KILLS, 1)
    assert sum(k for *_, k in scenarios) == KILLS
    for cli, doc, kills in scenarios:
        check_at_least_once(cli, doc, kills)


def test_sigkill_with_verify_probe_has_no_duplicates(tmp_path):
    """With a verify probe, an in-flight effect is not run twice: zero duplicates."""
    for cli, doc, _kills in crash_until_done(tmp_path, KILLS, 7, VERIFY="1"):
        assert doc["status"] == "completed"
        assert doc["result"] == EXPECTED
        values, _ = ledger_counts(cli)
        assert all(len(v) == 1 for v in values.values()), {k: v for k, v in values.items() if len(v) > 1}
        assert len(values) == STEPS


@pytest.mark.slow
def test_large_crash_campaign(tmp_path):
    """The slow tier: 500 kills (TCC_SLOW_KILLS), same guarantees."""
    scenarios = crash_until_done(tmp_path, int(os.environ.get("TCC_SLOW_KILLS", "500")), 99)
    duplicates = sum(check_at_least_once(cli, doc, kills) for cli, doc, kills in scenarios)
    print(f"kills=500 runs={len(scenarios)} duplicates={duplicates}")
