"""Intents in flight (``tcc.store._inflight``): one write(2) each, made durable by the step's
commit -- one fsync per step in ``sync`` durability -- and never lost to a process crash."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tcc.store import Completion, open_store
from tests._support.runs import AGENTS, Cli

STEPS_CHILD = r"""
import sys
from tcc.store import Completion, open_store
path, steps, sync_intents = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
with open_store(path, sync_intents=sync_intents) as store:
    run = store.create_run("agent.py:main", run_id="r")
    for i in range(steps):
        seq = store.append_intent("r", run.epoch, "step", b"%d" % i)
        store.checkpoint("r", run.epoch, b"state %d" % i * 2000, completion=Completion(seq, result=b"ok"))
"""


def _syncs(tmp_path: Path, steps: int, sync_intents: bool) -> int:
    """fsync, fdatasync and msync calls of a process that runs ``steps`` steps."""
    trace = tmp_path / f"trace-{steps}-{int(sync_intents)}"
    store = tmp_path / f"store-{steps}-{int(sync_intents)}"
    subprocess.run(["strace", "-f", "-qq", "-o", str(trace), "-e", "trace=fsync,fdatasync,msync",
                    sys.executable, "-c", STEPS_CHILD, str(store), str(steps), str(int(sync_intents))],
                   check=True, timeout=120)
    return sum(1 for line in trace.read_text().splitlines() if "sync(" in line)


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_a_step_in_sync_durability_is_one_fsync(tmp_path: Path) -> None:
    """Counted with strace: each step (intent + completion with its snapshot) adds exactly
    one flush; with ``sync_intents=True`` the intent is a flushed commit of its own (two)."""
    per_step = (_syncs(tmp_path, 30, False) - _syncs(tmp_path, 10, False)) / 20
    assert per_step == 1.0
    per_step_synced = (_syncs(tmp_path, 30, True) - _syncs(tmp_path, 10, True)) / 20
    assert per_step_synced == 2.0


KILLED_CHILD = r"""
import os, signal, sys
from tcc.store import open_store
store = open_store(sys.argv[1])
run = store.create_run("agent.py:main", run_id="r")
store.append_intent("r", run.epoch, "charge", b"card", idempotency_key="r:1")
os.kill(os.getpid(), signal.SIGKILL)  # while the effect runs: no completion, no commit
"""


def test_a_killed_process_leaves_its_intent_in_flight_to_the_claim(tmp_path: Path) -> None:
    path = str(tmp_path / "store")
    proc = subprocess.run([sys.executable, "-c", KILLED_CHILD, path], timeout=60)
    assert proc.returncode == -signal.SIGKILL
    with open_store(path) as store:
        seen = store.journal("r")  # a reader sees the call in flight
        assert [(r.kind, r.name, r.args, r.idempotency_key) for r in seen] == [
            ("intent", "charge", b"card", "r:1")]
        assert store.journal_length("r") == 1
        claimed = store.claim_run("r", steal=True)
        taken = [e for e in store.events("r") if e.kind == "taken_over"][-1]
        assert taken.data["in_flight"] == 1
        # journaled under the old epoch by the claim: the new owner completes it (in doubt)
        store.append_completion("r", claimed.epoch, Completion(0, result=b"done"))
        assert [r.kind for r in store.journal("r")] == ["intent", "completion"]
    assert os.listdir(tmp_path / "store" / "inflight") == []  # the dead process's file went


def test_another_handle_completes_an_intent_written_in_flight(tmp_path: Path) -> None:
    path = str(tmp_path / "store")
    with open_store(path) as first:
        run = first.create_run("agent.py:main", run_id="r")
        seq = first.append_intent("r", run.epoch, "step", b"a")
    with open_store(path) as second:  # the same writer (epoch), a new handle
        second.checkpoint("r", run.epoch, b"s" * 10_000, completion=Completion(seq, result=b"x"))
        assert [r.kind for r in second.journal("r")] == ["intent", "completion"]
        assert second.load_snapshot("r") == b"s" * 10_000


def test_a_fenced_writer_cannot_complete_its_intent_in_flight(tmp_path: Path) -> None:
    from tcc.errors import FencedError

    path = str(tmp_path / "store")
    with open_store(path) as owner, open_store(path) as other:
        run = owner.create_run("agent.py:main", run_id="r")
        seq = owner.append_intent("r", run.epoch, "step", b"a")
        other.claim_run("r", steal=True)  # takes the intent in flight into the journal
        with pytest.raises(FencedError):
            owner.checkpoint("r", run.epoch, b"late", completion=Completion(seq, result=b"x"))
        assert [r.kind for r in other.journal("r")] == ["intent"]
        assert other.snapshots("r") == []


def test_damaged_torn_and_foreign_files_in_flight_are_ignored(tmp_path: Path) -> None:
    """Garbage, a torn copy, an entry sealed with another store's key and a torn tail
    after a good entry: only the good entry counts, once."""
    path = str(tmp_path / "store")
    assert subprocess.run([sys.executable, "-c", KILLED_CHILD, path], timeout=60).returncode == -signal.SIGKILL
    folder = tmp_path / "store" / "inflight"
    (real,) = folder.iterdir()
    data = real.read_bytes()
    other = str(tmp_path / "other")
    assert subprocess.run([sys.executable, "-c", KILLED_CHILD, other], timeout=60).returncode == -signal.SIGKILL
    (foreign,) = (tmp_path / "other" / "inflight").iterdir()
    real.unlink()
    (folder / "x-1-garbage.log").write_bytes(os.urandom(300))
    (folder / "x-2-torn.log").write_bytes(data[: len(data) // 2])
    (folder / "x-3-foreign.log").write_bytes(foreign.read_bytes())
    with open_store(path) as store:  # nothing good is in flight
        assert store.journal("r") == []
    (folder / "x-4-real.log").write_bytes(data + os.urandom(7))
    with open_store(path) as store:
        assert [r.name for r in store.journal("r")] == ["charge"]
        store.claim_run("r", steal=True)
        assert [r.name for r in store.journal("r")] == ["charge"]
        assert [e.data.get("in_flight") for e in store.events("r") if e.kind == "taken_over"] == [1]


def test_an_os_crash_that_took_the_intent_leaves_the_call_to_its_probe(tmp_path: Path) -> None:
    """The process dies after the call's effect, before its completion; then the machine
    loses the in-flight file (what an OS crash may do to unflushed data).  The resumed run
    finds no intent, so it asks the probe of the first call it makes: exactly once."""
    ledger = tmp_path / "ledger.txt"
    cli = Cli(tmp_path, LEDGER=str(ledger), DIE_ON="h")
    died = cli.run("run", "--run-id", "h1", f"{AGENTS / 'doubt_agent.py'}:flaky_once")
    assert died.returncode == -signal.SIGKILL, died.stderr
    shutil.rmtree(tmp_path / "store" / "inflight")
    done = cli.run("resume", "--json", "h1", check=True)
    assert json.loads(done.stdout)["result"] == "h (found)"
    assert len(ledger.read_text().splitlines()) == 1


def test_commits_on_other_threads_fold_intents_without_losing_or_renumbering_one(tmp_path: Path) -> None:
    """A heartbeat (any write of the handle, on another thread) folds the intents in flight
    while the owner keeps appending and completing: every intent keeps its number, is
    journaled once, and is answered by its own completion."""
    import threading

    with open_store(str(tmp_path / "store")) as store:
        run = store.create_run("agent.py:main", run_id="r")
        stop = threading.Event()

        def heartbeat() -> None:
            while not stop.is_set():
                store.renew_lease("r", run.epoch, 30.0)

        beats = threading.Thread(target=heartbeat)
        beats.start()
        try:
            for i in range(300):
                seqs = [store.append_intent("r", run.epoch, "step", b"%d.%d" % (i, k)) for k in range(2)]
                for seq in seqs:
                    store.append_completion("r", run.epoch, Completion(seq, result=b"ok %d" % seq))
        finally:
            stop.set()
            beats.join()
        records = store.journal("r")
    assert [r.seq for r in records] == list(range(1200))
    intents = [r for r in records if r.kind == "intent"]
    assert [r.args for r in intents] == [b"%d.%d" % (i, k) for i in range(300) for k in range(2)]
    answered = [r.intent_seq for r in records if r.kind == "completion"]
    assert sorted(answered) == [r.seq for r in intents]
    assert all(r.result == b"ok %d" % r.intent_seq for r in records if r.kind == "completion")


def _reads_of(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The journal keys of the in-flight entries verified from now on (each read of a file
    verifies every entry in it)."""
    from tcc.store._codec import Sealer

    verified: list[bytes] = []
    real = Sealer.open

    def counting(self: Sealer, domain: bytes, key: bytes, sealed: bytes) -> object:
        if domain == b"inflight":
            verified.append(bytes(key))
        return real(self, domain, key, sealed)

    monkeypatch.setattr(Sealer, "open", counting)
    return verified


def test_a_dead_process_s_file_is_read_once_by_a_resume_and_again_only_if_it_changed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A resume looks at a dead owner's file three times (the open's sweep, the claim's
    adoption, the sweep after the claim): one read.  A file that changed since is read again,
    whether its size changed or only its time, so a later look never acts on what it held."""
    path = str(tmp_path / "store")
    folder = tmp_path / "store" / "inflight"

    def killed(run_id: str) -> Path:
        proc = subprocess.run([sys.executable, "-c", KILLED_CHILD.replace('"r"', f'"{run_id}"'), path],
                              timeout=60)
        assert proc.returncode == -signal.SIGKILL
        (left,) = folder.iterdir()
        return left

    dead = killed("r")
    opened = _reads_of(monkeypatch)
    with open_store(path) as store:
        claimed = store.claim_run("r", steal=True)
        assert [e for e in store.events("r") if e.kind == "taken_over"][-1].data["in_flight"] == 1
        assert len(opened) == 1  # read once; adopted; then deleted by the sweep
        assert not dead.exists()
        store.append_completion("r", claimed.epoch, Completion(0, result=b"done"))

    # another size: a torn tail after the entry (the entry itself still counts)
    second = killed("s")
    whole = second.read_bytes()
    opened.clear()
    with open_store(path) as store:
        assert len(opened) == 1  # the open's sweep: kept (its intent is not journaled yet)
        second.write_bytes(whole + whole[:5])
        store.claim_run("s", steal=True)
        assert len(opened) == 2  # read again, and its entry adopted
        assert [e for e in store.events("s") if e.kind == "taken_over"][-1].data["in_flight"] == 1
        assert [r.kind for r in store.journal("s")] == ["intent"]

    # the same size, another time: garbage where the entry was (nothing to adopt)
    third = killed("t")
    opened.clear()
    with open_store(path) as store:
        assert len(opened) == 1
        before = third.stat()
        third.write_bytes(os.urandom(before.st_size))
        os.utime(third, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000))
        store.claim_run("t", steal=True)
        assert len(opened) == 1  # read again: no entry verifies
        assert "in_flight" not in [e for e in store.events("t") if e.kind == "taken_over"][-1].data
        assert store.journal("t") == []


LIVE_CHILD = r"""
import sys
from tcc.store import open_store
with open_store(sys.argv[1]) as store:
    run = store.create_run("agent.py:main", run_id="r")
    store.append_intent("r", run.epoch, "a", b"1")
    print("ready", flush=True)
    sys.stdin.read()  # alive, its intent in flight, until the test closes stdin
"""


def test_a_live_process_s_file_is_read_afresh_every_time(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The file of another process that lives can change at any time, even to the same size
    within the file system's timestamp granularity: it is never answered from what it held
    before."""
    path = str(tmp_path / "store")
    folder = tmp_path / "store" / "inflight"
    child = subprocess.Popen([sys.executable, "-c", LIVE_CHILD, path], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        opened = _reads_of(monkeypatch)
        with open_store(path) as store:
            assert [r.name for r in store.journal("r")] == ["a"]
            (theirs,) = folder.iterdir()
            before = theirs.stat()
            theirs.write_bytes(os.urandom(before.st_size))  # same inode and size ...
            os.utime(theirs, ns=(before.st_atime_ns, before.st_mtime_ns))  # ... and time
            assert store.journal("r") == []  # read again: garbage, skipped
            assert len(opened) == 1
    finally:
        assert child.stdin is not None and child.stdout is not None
        child.stdin.close()
        child.wait(timeout=60)
        child.stdout.close()
