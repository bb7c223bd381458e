"""Stores of every format this tcc reads, written by the tcc that wrote that format.

The fixtures under ``tests/fixtures/stores/`` (made by ``scripts/make_fixtures.py``;
see ``tests/fixtures/README.md``) are one small store per format version: 1, 2
and 3 written by the last commit that wrote each, 4 and 4-encrypted by the
current code.  Each manifest holds what the writing tcc read back from its own
store: runs, journal records, snapshot digests, signals and events, and what
each snapshot holds once loaded.  A change to the store's reading code that
would strand users' existing stores fails here.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import lmdb
import pytest

from tcc import errors
from tcc.capture import interpreter_tag, loads
from tcc.store import open_store
from tcc.store import _format
from tests._support.fixtures import unpack_private

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
STORES = FIXTURES / "stores"
MANIFESTS = {p.stem: json.loads(p.read_text()) for p in sorted(STORES.glob("v*.json"))}

if str(FIXTURES) not in sys.path:  # the snapshots' programs, by the name they were saved under
    sys.path.insert(0, str(FIXTURES))
import snapshot_programs as programs  # noqa: E402

# What opening a store does to its format header (src/tcc/store/_format.py,
# check_format): versions 1 and 2 are upgraded to version 3 (head records
# written, chunk addresses stay BLAKE2b); 3, 4 and 4-encrypted are left as they are.
AFTER_OPEN: dict[Any, Any] = {1: 3, 2: 3, 3: 3, 4: 4, "4-encrypted": "4-encrypted"}

SIGNAL_NAMES = ("approve", "later", "taken", "never")
TENANTS = ("default", "other")
RUN_FIELDS = ("run_id", "tenant", "entry", "args", "strategy", "status", "created", "updated",
              "epoch", "owner_host", "owner_pid", "lease_expiry", "result", "error", "parent")
JOURNAL_FIELDS = ("seq", "kind", "time", "name", "args", "idempotency_key", "attempt",
                  "intent_seq", "result", "error", "duration")

each_fixture = pytest.mark.parametrize("fixture", sorted(MANIFESTS))


@pytest.fixture(autouse=True)
def _no_key_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TCC_STORE_KEY", raising=False)
    monkeypatch.delenv("TCC_STORE_KEY_FILE", raising=False)


# ------------------------------------------------------------------ helpers


def unpack(fixture: str, tmp_path: Path) -> str:
    """A private copy of the fixture store ``fixture``."""
    manifest = MANIFESTS[fixture]
    return unpack_private(STORES / manifest["archive"], manifest["archive_sha256"], tmp_path / fixture)


def key_of(fixture: str) -> str | None:
    name = MANIFESTS[fixture]["key_file"]
    return (STORES / name).read_text().strip() if name else None


def header(path: str) -> dict[str, Any]:
    """The format header, read with LMDB directly (the store must not be open)."""
    env = lmdb.open(path, readonly=True, lock=False, subdir=True, max_dbs=16)
    try:
        meta = env.open_db(b"meta", create=False)
        with env.begin() as txn:
            raw = txn.get(b"format", db=meta)
    finally:
        env.close()
    assert raw is not None
    hdr: dict[str, Any] = json.loads(bytes(raw))
    return hdr


def jsonable(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "hex:" + bytes(value).hex()
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict) or hasattr(value, "items"):
        return {str(k): jsonable(v) for k, v in value.items()}
    return value


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def describe(path: str, key: str | None, *, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """What the store holds, read through the current API, in the manifest's shape."""
    out: dict[str, Any] = {}
    for tenant in TENANTS:
        with open_store(path, tenant=tenant, create=False, key=key) as store:
            runs: dict[str, Any] = {}
            for info in sorted(store.list_runs(), key=lambda r: r.run_id):
                rid = info.run_id
                if rid in skip:
                    continue
                snaps = store.snapshots(rid)
                assert not any(s.damaged for s in snaps), f"{rid}: damaged snapshots {snaps}"
                runs[rid] = {
                    "run": jsonable({f: getattr(info, f) for f in RUN_FIELDS}),
                    "journal": [jsonable({f: getattr(r, f) for f in JOURNAL_FIELDS})
                                for r in store.journal(rid)],
                    "snapshots": [
                        {"number": s.number, "journal_len": s.journal_len, "size": s.size,
                         "created": s.created, "pinned": s.pinned,
                         "sha256": sha256(store.load_snapshot(rid, s.number))} for s in snaps],
                    "signals": {name: {"state": store.signal_state(rid, name),
                                       "value": jsonable(store.peek_signal(rid, name))}
                                for name in SIGNAL_NAMES},
                    "pending_signals": sorted(store.pending_signals(rid)),
                    "events": [{"seq": e.seq, "kind": e.kind, "time": e.time, "data": jsonable(e.data)}
                               for e in store.events(rid)],
                }
            out[tenant] = runs
    return out


def meaning(payload: bytes) -> dict[str, Any]:
    """What a fixture snapshot holds: a suspended program (resumed to its end) or data."""
    state = loads(payload)
    if "task" in state:
        trace, result = programs.drive(state["task"], state["resume_with"])
        return {"trace": trace, "result": result}
    return {"data_sha256": sha256(state["data"].encode() + state["noise"]), "step": state["step"]}


def check_contents(fixture: str, path: str, *, skip: tuple[str, ...] = ()) -> None:
    got = describe(path, key_of(fixture), skip=skip)
    want = MANIFESTS[fixture]["contents"]
    assert sorted(got) == sorted(want)
    for tenant in want:
        assert sorted(got[tenant]) == sorted(want[tenant]), f"tenant {tenant}: other runs"
        for rid, run in want[tenant].items():
            for part in run:  # one assert per part, so that a failure says what differs
                assert got[tenant][rid][part] == run[part], f"{tenant}/{rid}: {part} differs"


# -------------------------------------------------------------------- tests


def test_every_readable_format_has_a_fixture() -> None:
    """The code reads versions 1 to FORMAT['version'] and the encrypted one: each has a fixture
    (a new format version fails here until its fixture is added)."""
    readable = {*range(1, _format.FORMAT["version"] + 1), _format.ENCRYPTED_FORMAT}
    assert {m["format_version"] for m in MANIFESTS.values()} == readable
    assert set(AFTER_OPEN) == readable


@each_fixture
def test_fixture_is_the_format_it_claims(fixture: str, tmp_path: Path) -> None:
    path = unpack(fixture, tmp_path)
    assert header(path)["version"] == MANIFESTS[fixture]["format_version"]


@each_fixture
def test_reads_what_the_old_tcc_wrote(fixture: str, tmp_path: Path) -> None:
    """Runs, statuses, journal records, snapshots, signals and events, as the writer read them;
    the open upgrades the header where the code does (1 and 2 -> 3), and an upgraded store
    reads the same when opened again."""
    path = unpack(fixture, tmp_path)
    version = MANIFESTS[fixture]["format_version"]
    check_contents(fixture, path)
    hdr = header(path)
    assert hdr["version"] == AFTER_OPEN[version]
    assert hdr["magic"] == "tcc-store"
    check_contents(fixture, path)  # once more, from the (possibly upgraded) store
    assert header(path) == hdr  # a second open changes nothing


@each_fixture
def test_snapshots_load(fixture: str, tmp_path: Path) -> None:
    """Each snapshot loads and means what it meant to the writer -- on the interpreter that
    wrote it; any other interpreter refuses it as incompatible, not as damaged."""
    path = unpack(fixture, tmp_path)
    manifest = MANIFESTS[fixture]
    same_interpreter = manifest["interpreter"] == interpreter_tag().decode()
    assert manifest["snapshot_meanings"]
    for where, want in manifest["snapshot_meanings"].items():
        tenant, rid, number = where.split("/")
        with open_store(path, tenant=tenant, create=False, key=key_of(fixture)) as store:
            payload = store.load_snapshot(rid, int(number))
        if same_interpreter:
            assert meaning(payload) == want, where
        else:
            with pytest.raises(errors.IncompatibleSnapshotError, match="interpreter"):
                loads(payload)


@each_fixture
def test_writable_after_open(fixture: str, tmp_path: Path) -> None:
    """The current code can go on writing into the (upgraded) store: a new run with an inline
    and a chunked snapshot; gc then keeps every chunk the old snapshots need."""
    path = unpack(fixture, tmp_path)
    key = key_of(fixture)
    big = bytes(range(256)) * 64 + b"tail" * 3000  # chunked, partly like nothing stored yet
    with open_store(path, create=False, key=key) as store:
        store.create_run("new:main", b"new args", run_id="new-run")
        store.append_intent("new-run", 1, "step", b"x")
        store.checkpoint("new-run", 1, b"small")
        store.checkpoint("new-run", 1, big)
        store.gc()
        assert store.load_snapshot("new-run", 2) == big
        assert store.load_snapshot("new-run", 1) == b"small"
        assert [r.name for r in store.journal("new-run")] == ["step"]
    check_contents(fixture, path, skip=("new-run",))
    assert header(path)["version"] == AFTER_OPEN[MANIFESTS[fixture]["format_version"]]


def test_encrypted_fixture_needs_its_key(tmp_path: Path) -> None:
    path = unpack("v4-encrypted", tmp_path)
    with pytest.raises(errors.StoreError, match="encrypted"):
        open_store(path, create=False)
