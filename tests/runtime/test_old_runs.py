"""Runs killed mid-way under an older tcc resume with this one.

Each interpreter's fixture under ``tests/fixtures/runs/<cache tag>/`` (made by
``scripts/make_fixtures.py runs``; see ``tests/fixtures/README.md``) is a store
holding run ``fixture-run`` of ``tests/fixtures/run_agent.py``: parked at the
wait ``go@1``, signalled, resumed and SIGKILLed by the driver's
``TCC_TEST_KILL_AFTER`` hook after 6 of its 11 effect calls, with ``go@2``
signalled afterwards.  Its newest snapshot is the runtime's own run state (the
tuple tagged ``tcc-run-state``: version, coroutine, resumption, call count, waits,
module globals).  The manifest holds what the writing tcc read back and the result
of an uninterrupted run.  A change to how ``tcc resume`` reads a run's state that
would strand users' unfinished runs fails here.

The run's entry is the agent's absolute path at generation time, outside any
checkout (``agent_path`` in the manifest); ``tcc resume`` loads the script from
there, so the tests put the checked-in agent at that path first.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests._support.fixtures import unpack_private

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
RUNS = FIXTURES / "runs"
AGENT = FIXTURES / "run_agent.py"
CASE = "run_agent"
MANIFESTS = {p.parent.name: json.loads(p.read_text()) for p in sorted(RUNS.glob(f"*/{CASE}.json"))}
OWN = sys.implementation.cache_tag
OTHERS = sorted(tag for tag in MANIFESTS if tag != OWN)

own_fixture = pytest.mark.skipif(OWN not in MANIFESTS,
                                 reason=f"no run fixture for {OWN} (scripts/make_fixtures.py runs)")


# ------------------------------------------------------------------ helpers


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def jsonable(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "hex:" + bytes(value).hex()
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict) or hasattr(value, "items"):
        return {str(k): jsonable(v) for k, v in value.items()}
    return value


@pytest.fixture
def agent() -> Path:
    """The checked-in agent at the path the fixture runs were made with (the same for every
    fixture).  That directory must be this user's and writable by no one else; the file is
    replaced atomically and only if it differs, so concurrent test processes agree."""
    paths = {m["agent_path"] for m in MANIFESTS.values()}
    assert len(paths) == 1, f"the run fixtures name different agent paths: {paths}"
    path = Path(paths.pop())
    folder = path.parent
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        pytest.skip(f"cannot make {folder} for the fixture runs' agent: {exc}")
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        pytest.skip(f"{folder} (where the fixture runs' entry points) is not a directory of this "
                    "user's: the agent cannot be put there")
    if stat.S_IMODE(st.st_mode) & 0o022:
        os.chmod(folder, 0o700)
    data = AGENT.read_bytes()
    if not path.is_file() or path.read_bytes() != data:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".run_agent.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    return path


def unpack(tag: str, tmp_path: Path) -> str:
    """A private copy of this interpreter's (or ``tag``'s) fixture store."""
    manifest = MANIFESTS[tag]
    return unpack_private(RUNS / tag / manifest["archive"], manifest["archive_sha256"],
                          tmp_path / f"store-{tag}")


def tcc(store: str, *args: str, ledger: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m tcc CMD --store STORE ARGS`` with no TCC_* settings from the environment
    (no kill hook, no key, no retention), the agent's call ledger going to ``ledger``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TCC_")}
    if ledger is not None:
        env["TCC_FIXTURE_LEDGER"] = str(ledger)
    command, *rest = args
    return subprocess.run([sys.executable, "-m", "tcc", command, "--store", store, *rest],
                          env=env, cwd=os.path.dirname(store), capture_output=True, text=True,
                          timeout=120)


def journal(store_path: str, run_id: str) -> list[dict[str, Any]]:
    """The run's journal as the current code reads it, in the manifest's shape."""
    from tcc.capture import load_payload
    from tcc.store import open_store

    with open_store(store_path, create=False) as store:
        return [{"seq": r.seq, "kind": r.kind, "idempotency_key": r.idempotency_key, "name": r.name,
                 "attempt": r.attempt, "intent_seq": r.intent_seq,
                 "args": jsonable(load_payload(r.args)) if r.kind == "intent" and r.args else None,
                 "result": jsonable(load_payload(r.result)) if r.result is not None else None,
                 "error": repr(load_payload(r.error)) if r.error is not None else None}
                for r in store.journal(run_id)]


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


# -------------------------------------------------------------------- tests


@pytest.mark.parametrize("tag", sorted(MANIFESTS))
def test_agent_is_the_one_the_runs_ran(tag: str) -> None:
    """run_agent.py is frozen: the snapshots fingerprint its code and hold its globals."""
    assert sha256(AGENT.read_bytes()) == MANIFESTS[tag]["agent_sha256"], (
        f"{AGENT} changed since the {tag} fixture run was made: it is frozen (README.md)")


@own_fixture
def test_old_run_resumes_to_the_uninterrupted_result(agent: Path, tmp_path: Path) -> None:
    """`tcc resume` finishes the killed run with the uninterrupted run's result, issuing only
    the calls after the kill: each idempotency key has one intent, the journal written before
    the kill reads as the old tcc wrote it, and the agent's ledger shows just the rest."""
    manifest = MANIFESTS[OWN]
    run_id = manifest["run_id"]
    path = unpack(OWN, tmp_path)
    before = journal(path, run_id)
    assert before == manifest["at_kill"]["journal"]

    ledger = tmp_path / "ledger.txt"
    proc = tcc(path, "resume", "--json", run_id, ledger=ledger)
    assert proc.returncode == 0, f"tcc resume exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    outcome = json.loads(proc.stdout)
    assert outcome["status"] == "completed", outcome
    assert outcome["result"] == manifest["expected_result"]
    assert lines(ledger) == manifest["expected_calls_on_resume"], "the resume made other calls"

    after = journal(path, run_id)
    assert after[:len(before)] == before, "the resume changed the journal written before the kill"
    intents = [(r["idempotency_key"], r["name"]) for r in after if r["kind"] == "intent"]
    per_key = collections.Counter(key for key, _name in intents)
    assert [k for k, n in per_key.items() if n > 1] == [], "calls issued again after the kill"
    assert intents == [tuple(i) for i in manifest["uninterrupted"]["intents"]]
    assert len([r for r in after if r["kind"] == "completion"]) == len(intents)

    shown = tcc(path, "show", "--json", run_id)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["status"] == "completed"


@own_fixture
def test_inspect_reads_the_old_snapshot(agent: Path, tmp_path: Path) -> None:
    manifest = MANIFESTS[OWN]
    path = unpack(OWN, tmp_path)
    proc = tcc(path, "inspect", "--json", manifest["run_id"])
    assert proc.returncode == 0, f"tcc inspect exited {proc.returncode}:\n{proc.stderr}"
    doc = json.loads(proc.stdout)
    want = manifest["inspect"]
    assert doc["snapshot"] == manifest["at_kill"]["snapshot"]["number"]
    assert doc["entry"] == manifest["at_kill"]["run"]["entry"]
    assert [f["function"] for f in doc["frames"]] == want["frames"]
    assert not any(f.get("code_changed") for f in doc["frames"])
    assert doc["awaiting"]["effect"] == want["awaiting"]["effect"]
    assert doc["awaiting"]["call"] == want["awaiting"]["call"]
    assert doc["globals"] == want["globals"]


@own_fixture
def test_run_state_as_the_reader_unpacks_it(agent: Path, tmp_path: Path) -> None:
    """The newest snapshot's run state, unpacked by the current reader, is what the writer
    stored: version, resumption, call count, waits, module globals and the frame chain."""
    from tcc.capture import load_payload, unseal
    from tcc.runtime import load_script, unpack_state
    from tcc.store import open_store

    manifest = MANIFESTS[OWN]
    run_id, want = manifest["run_id"], manifest["at_kill"]
    path = unpack(OWN, tmp_path)
    load_script(str(agent))  # the snapshot names the agent's functions by its module
    with open_store(path, create=False) as store:
        run = store.get_run(run_id)
        info = store.snapshots(run_id)[-1]
        stored = load_payload(unseal(store.load_snapshot(run_id, info.number), authenticated=True))
        pending = sorted(store.pending_signals(run_id))
    assert {"entry": run.entry, "args": json.loads(run.args), "status": run.status,
            "epoch": run.epoch, "strategy": run.strategy} == want["run"]
    assert {"number": info.number, "journal_len": info.journal_len} == want["snapshot"]
    assert pending == want["pending_signals"]
    assert stored[0] == manifest["state_tag"] and len(stored) == want["state"]["items"]

    state = unpack_state(stored, run_id, info.number)
    frames, link = [], state.coro
    while link is not None:
        frame = getattr(link, "cr_frame", None) or getattr(link, "gi_frame", None)
        if frame is None:
            break
        frames.append(frame.f_code.co_qualname)
        link = getattr(link, "cr_await", None) or getattr(link, "gi_yieldfrom", None)
    got = {
        "version": state.version, "coroutine": type(state.coro).__name__, "frames": frames,
        "resumption": jsonable(list(state.resumption)), "calls": state.calls,
        "waits": state.waits, "module_state": jsonable(state.module_state),
    }
    assert got == {k: want["state"][k] for k in got}
    state.coro.close()


@pytest.mark.parametrize("tag", OTHERS)
def test_other_interpreters_run_is_refused(agent: Path, tmp_path: Path, tag: str) -> None:
    """Another interpreter's run: `tcc resume` refuses its snapshot as incompatible, says
    which interpreter wrote it, and issues no call."""
    manifest = MANIFESTS[tag]
    run_id = manifest["run_id"]
    path = unpack(tag, tmp_path)
    before = journal(path, run_id)
    ledger = tmp_path / "ledger.txt"
    proc = tcc(path, "resume", "--json", run_id, ledger=ledger)
    assert proc.returncode != 0, f"resumed a {tag} run on {OWN}:\n{proc.stdout}"
    message = proc.stdout + proc.stderr
    assert "interpreter" in message and tag in message, message
    assert "Traceback" not in message, message
    assert lines(ledger) == []
    assert journal(path, run_id) == before
