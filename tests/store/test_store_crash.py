"""Crash safety and multi-process behaviour: kill -9, fencing across processes, concurrency."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap

import pytest

from tcc.errors import FencedError
from tcc.store import Completion, open_store
from tests._support import ROOT
from tests._support.stores import payload, run_python

# The child claims the run (taking it over from the killed predecessor), then
# loops intent + checkpoint, printing the step number only after checkpoint()
# returned: every printed number is an acknowledged commit.
_CHILD = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[3])
    from tests._support.stores import payload
    from tcc.errors import RunNotFoundError
    from tcc.store import Completion, open_store
    s = open_store(sys.argv[1], durability=sys.argv[2])
    try:
        run = s.claim_run("crash", steal=True)
    except RunNotFoundError:
        run = s.create_run("loop", run_id="crash")
    n = sum(1 for j in s.journal("crash") if j.kind == "completion")
    while True:
        seq = s.append_intent("crash", run.epoch, "step", b"%d" % n)
        s.checkpoint("crash", run.epoch, payload(n, 2000 + 500 * (n % 40)),
                     completion=Completion(seq, result=b"%d" % n))
        print(n, flush=True)
        n += 1
    """
)


def _kill_cycles(path: str, kills: int, durability: str, seed: int) -> None:
    rng = random.Random(seed)
    here = str(ROOT)  # the child imports tests._support.stores from the repository root
    acked = -1
    for cycle in range(kills):
        proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, path, durability, here],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        assert proc.stdout is not None
        want = rng.randint(1, 12)
        for _ in range(want):
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else ""
            acked = int(line)
        os.kill(proc.pid, signal.SIGKILL)
        rest, _ = proc.communicate()
        for line in rest.split():  # acks still in the pipe when the kill landed
            acked = max(acked, int(line))
        _verify(path, acked, cycle)


def _verify(path: str, acked: int, cycle: int) -> None:
    with open_store(path) as s:
        journal = s.journal("crash")
        done = [j for j in journal if j.kind == "completion"]
        # every acknowledged step is journaled, in order, with its result
        assert len(done) >= acked + 1, (cycle, acked, len(done))
        assert [j.result for j in done] == [b"%d" % i for i in range(len(done))]
        snaps = s.snapshots("crash")
        newest = snaps[-1]
        # the newest snapshot and the journal agree: nothing completed after it
        assert newest.journal_len in (len(journal), len(journal) - 1)
        assert all(j.kind == "intent" for j in journal[newest.journal_len:])
        assert s.load_snapshot("crash") == payload(len(done) - 1, 2000 + 500 * ((len(done) - 1) % 40))
        for snap in snaps:
            s.load_snapshot("crash", snap.number)  # every stored snapshot verifies
        assert s.get_run("crash").epoch == cycle + 1


def test_kill9_loses_no_acknowledged_commit(store_path: str) -> None:
    """A few SIGKILLs of a committing process lose no acknowledged commit (sync)."""
    _kill_cycles(store_path, kills=4, durability="sync", seed=1)


def test_kill9_group_mode(store_path: str) -> None:
    """SIGKILL loses no acknowledged commit in group durability either."""
    _kill_cycles(store_path, kills=2, durability="group", seed=2)


@pytest.mark.slow
def test_kill9_campaign(store_path: str) -> None:
    """200 SIGKILLs at random points lose no acknowledged commit and corrupt nothing."""
    _kill_cycles(store_path, kills=200, durability="sync", seed=3)


@pytest.mark.slow
def test_kill9_campaign_none_mode(store_path: str) -> None:
    """durability='none' also survives process kills (only OS crashes can lose data)."""
    _kill_cycles(store_path, kills=50, durability="none", seed=4)


def test_stale_writer_fenced_across_processes(store_path: str) -> None:
    """A writer whose run was claimed by another process is fenced and writes nothing."""
    with open_store(store_path) as s:
        run = s.create_run("e", run_id="r", lease=0.0)
        seq = s.append_intent("r", run.epoch, "e")
        s.checkpoint("r", run.epoch, payload(1), completion=Completion(seq, result=b"a"))
        out = run_python(
            """
            import sys
            from tcc.store import open_store
            with open_store(sys.argv[1]) as s:
                print(s.claim_run("r").epoch)
            """,
            store_path,
        )
        assert out.stdout.strip() == "2", out.stderr
        with pytest.raises(FencedError, match="taken over"):
            s.checkpoint("r", run.epoch, payload(2), completion=Completion(seq, result=b"b"))
        assert [x.number for x in s.snapshots("r")] == [1]
        assert len(s.journal("r")) == 2
        assert s.load_snapshot("r") == payload(1)
        assert s.events("r")[-1].kind == "taken_over"


def test_concurrent_processes_share_store(store_path: str) -> None:
    """Several processes commit to one store at once without losing or mixing records."""
    code = textwrap.dedent(
        """
        import sys
        sys.path.insert(0, sys.argv[3])
        from tests._support.stores import payload
        from tcc.store import Completion, open_store
        with open_store(sys.argv[1], map_size=1 << 20) as s:
            rid = sys.argv[2]
            run = s.create_run("e", run_id=rid)
            for i in range(25):
                seq = s.append_intent(rid, run.epoch, "e")
                s.checkpoint(rid, run.epoch, payload(i, 30_000) + rid.encode(),
                             completion=Completion(seq))
        """
    )
    here = str(ROOT)  # the child imports tests._support.stores from the repository root
    with open_store(store_path, map_size=1 << 20):
        pass
    procs = [subprocess.Popen([sys.executable, "-c", code, store_path, f"p{i}", here],
                              stderr=subprocess.PIPE) for i in range(3)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    with open_store(store_path) as s:
        assert s.map_size > 1 << 20  # someone grew the map; others adopted it
        for i in range(3):
            rid = f"p{i}"
            assert len(s.journal(rid)) == 50
            assert s.load_snapshot(rid) == payload(24, 30_000) + rid.encode()
        assert s.gc().refs_repaired == 0
