"""Parking (sleeps, waits): resuming from the snapshot taken where a run parked, after the park ended.

The sleep's (or wait's) completion then lies in the journal after the snapshot:
the run was resumed from there once, and the snapshot taken then failed
verification, or that resume used the replay strategy, which takes none.  The
recorded outcome stands: the resume journals no second completion for the same
intent (the store would refuse it, and the run could not be resumed at all).
Each test parks a real run in a sleep (or an approval wait), resumes it past the
park into an effect that SIGKILLs its process, and resumes it again.
"""

from __future__ import annotations

import json
import time

import lmdb

from tcc.store import open_store

from tests._support.runs import AGENTS, Cli

AGENT = f"{AGENTS / 'sleep_crash_agent.py'}:main"


def _parked_then_killed(tmp_path, *resume_args: str) -> Cli:
    cli = Cli(tmp_path, LEDGER=str(tmp_path / "ledger"), TCC_SLEEP_INLINE="0")
    parked = json.loads(cli.run("run", "--json", "--run-id", "r", AGENT, check=True).stdout)
    assert parked["status"] == "sleeping", parked
    time.sleep(0.4)  # past the wake time
    died = cli.run("resume", *resume_args, "r")
    assert died.returncode == -9, (died.returncode, died.stderr)  # inside step(1)
    return cli


def _sleep_completions(cli: Cli, marker: str = "tcc:sleep") -> list[int]:
    with open_store(str(cli.store)) as store:
        journal = store.journal("r")
    sleeps = {r.seq for r in journal if r.kind == "intent" and r.name == marker}
    assert len(sleeps) == 1, journal
    return [r.seq for r in journal if r.kind == "completion" and r.intent_seq in sleeps]


def _damage_snapshot(cli: Cli, number: int) -> None:
    """Flip one byte of snapshot ``number``'s record (the store is closed)."""
    env = lmdb.open(str(cli.store), max_dbs=16, map_size=1 << 30)
    try:
        snaps = env.open_db(b"snaps")
        with env.begin(write=True) as txn:
            keys = [bytes(k) for k, _ in txn.cursor(db=snaps)
                    if k[-8:] == number.to_bytes(8, "big") and b"r\x00" in k]
            assert len(keys) == 1, keys
            value = bytearray(txn.get(keys[0], db=snaps))
            value[len(value) // 2] ^= 0xFF
            txn.put(keys[0], bytes(value), db=snaps)
    finally:
        env.close()


def test_resume_falls_back_to_the_parked_snapshot(tmp_path):
    cli = _parked_then_killed(tmp_path)
    with open_store(str(cli.store)) as store:
        numbers = [s.number for s in store.snapshots("r")]
    assert len(numbers) >= 2, numbers
    _damage_snapshot(cli, numbers[-1])  # the one taken when the sleep ended
    done = json.loads(cli.run("resume", "--json", "r", check=True).stdout)
    assert done["status"] == "completed" and done["result"] == 10, done
    assert len(_sleep_completions(cli)) == 1  # the recorded end of the sleep stands
    with open_store(str(cli.store)) as store:
        assert "fell_back" in [e.kind for e in store.events("r")]
    assert (tmp_path / "ledger").read_text().splitlines() == ["step 1", "step 1"]


def test_resume_after_a_replay_resume(tmp_path):
    cli = _parked_then_killed(tmp_path, "--strategy", "replay")
    done = json.loads(cli.run("resume", "--json", "r", check=True).stdout)
    assert done["status"] == "completed" and done["result"] == 10, done
    assert len(_sleep_completions(cli)) == 1
    assert (tmp_path / "ledger").read_text().splitlines() == ["step 1", "step 1"]


def test_resume_falls_back_past_an_answered_approval(tmp_path):
    """The approval's signal was consumed when its completion was journaled; resumed
    from the snapshot where the run waited, the recorded answer stands (the run used
    to wait again for a signal that can never come)."""
    cli = Cli(tmp_path, LEDGER=str(tmp_path / "ledger"))
    parked = json.loads(cli.run("run", "--json", "--run-id", "r", f"{AGENT[:-5]}:approved",
                                check=True).stdout)
    assert parked["status"] == "waiting", parked
    cli.run("approve", "r", check=True)
    died = cli.run("resume", "r")
    assert died.returncode == -9, (died.returncode, died.stderr)
    with open_store(str(cli.store)) as store:
        numbers = [s.number for s in store.snapshots("r")]
    _damage_snapshot(cli, numbers[-1])
    done = json.loads(cli.run("resume", "--json", "r", check=True).stdout)
    assert done["status"] == "completed" and done["result"] == 20, done
    assert len(_sleep_completions(cli, "tcc:wait")) == 1
