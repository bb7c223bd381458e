"""``tcc.gather`` after a crash: a gathered call in flight asks its effect's verify probe on resume.

The calls of a ``tcc.gather`` that were in flight when the process died are in
doubt.  On resume, a call whose effect has a verify probe asks it, so an effect
the probe proves already happened is not run a second time (exactly-once); a
call whose effect has no probe runs again.  Each test SIGKILLs a real
``tcc run`` right after the side effect of one call.
"""

from __future__ import annotations

import collections
import json

from tcc.store import open_store

from tests._support.runs import AGENTS, Cli

AGENT = str(AGENTS / "gather_verify_agent.py")


def _crash_and_resume(tmp_path, **env: str) -> tuple[Cli, dict, collections.Counter[str]]:
    ledger = tmp_path / "ledger"
    cli = Cli(tmp_path, LEDGER=str(ledger), **env)
    died = cli.run("run", "--json", "--run-id", "g", f"{AGENT}:main")
    assert died.returncode == -9, (died.returncode, died.stderr)  # SIGKILL inside call "b"
    assert (tmp_path / "ledger.died").exists()
    done = json.loads(cli.run("resume", "--json", "g", check=True).stdout)
    tags = collections.Counter(line.split(" ", 1)[1] for line in ledger.read_text().splitlines())
    return cli, done, tags


def _events(cli: Cli, run_id: str) -> list[tuple[str, dict]]:
    with open_store(str(cli.store)) as store:
        return [(e.kind, e.data) for e in store.events(run_id)]


def test_gathered_call_in_doubt_is_verified_not_rerun(tmp_path):
    cli, done, tags = _crash_and_resume(tmp_path, DIE_ON="b")
    assert done["status"] == "completed", done
    assert done["result"][0] == "solo" and done["result"][2] == "b (found)", done
    # "a" ran concurrently: completed before the kill (its outcome served), or in doubt
    # and either found by the probe or run again; in every case its line is written once
    assert done["result"][1] in ("a", "a (found)"), done
    assert tags == {"solo": 1, "a": 1, "b": 1}, tags
    verified = [d for k, d in _events(cli, "g") if k == "in_doubt_verified"]
    assert any(d["effect"] == "gv:write" and d["key"].endswith(".1") for d in verified), verified


def test_gathered_call_in_doubt_without_a_probe_runs_again(tmp_path):
    """Without a probe the in-doubt call is re-issued (at-least-once), and an event says so."""
    cli, done, tags = _crash_and_resume(tmp_path, DIE_ON="b", VERIFY="0")
    assert done["status"] == "completed" and done["result"][2] == "b", done
    assert tags["b"] == 2 and tags["solo"] == 1, tags
    reissued = [d for k, d in _events(cli, "g") if k == "in_doubt_reissued"]
    assert any(d["key"].endswith(".1") and d["attempt"] == 2 for d in reissued), reissued


DOUBT_AGENT = str(AGENTS / "doubt_agent.py")


def _attempts(cli: Cli, run_id: str, suffix: str) -> list[int]:
    with open_store(str(cli.store)) as store:
        return [r.attempt for r in store.journal(run_id)
                if r.kind == "intent" and (r.idempotency_key or "").endswith(suffix)]


def test_a_gathered_call_is_retried_as_a_single_call_would_be(tmp_path):
    """`retries` holds inside a gather too (as tcc.testing runs it): each attempt journaled
    with its own intent; a replay then finds the call already retried, so a resumed run
    and an uninterrupted one take the same path."""
    ledger = tmp_path / "ledger"
    cli = Cli(tmp_path, LEDGER=str(ledger))
    done = json.loads(cli.run("run", "--json", "--run-id", "r", f"{DOUBT_AGENT}:gather_retries",
                              check=True).stdout)
    assert done["result"] == ["x", "y"], done
    assert sorted(ledger.read_text().splitlines()) == ["r:1.0 x", "r:1.1 y", "r:1.1 y"]
    assert _attempts(cli, "r", ".1") == [1, 2]


def test_a_gathered_call_whose_retries_are_spent_raises_its_last_error(tmp_path):
    cli = Cli(tmp_path, LEDGER=str(tmp_path / "ledger"))
    done = json.loads(cli.run("run", "--json", "--run-id", "s", f"{DOUBT_AGENT}:gather_gives_up",
                              check=True).stdout)
    assert done["result"] == "g failed", done
    assert _attempts(cli, "s", ".1") == [1, 2]
