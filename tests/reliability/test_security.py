"""Security: foreign or forged snapshot bytes are refused, never unpickled; inspect runs no user code.

Snapshots are pickles, and pickles are code.  These tests plant bytes with raw
LMDB writes (bypassing tcc, as an attacker with write access to the data file
but not to the store secret would), then drive the real CLI.  A *tripwire*
object in the victim snapshots writes a marker file when it is unpickled, so
"never unpickled" is observed rather than assumed; each test also shows that the
tripwire does fire when the bytes are loaded for real.
"""

from __future__ import annotations

import json
import os
import pathlib
import pickle
import shutil
import subprocess
import sys

import pytest

from tcc.capture import seal
from tcc.store._chunks import pack_entries
from tcc.store._codec import Sealer, seq_key
from tcc.store._heads import is_head_key
from tests._support.reliability import (
    assert_clear_error,
    events,
    is_clear_error,
    ledger,
    raw_items,
    raw_put,
)
from tests._support.runs import Cli

TRIP_AGENT = '''\
import os

import tcc


class Tripwire:
    """Unpickling one appends to $TRIPWIRE: proof that a snapshot holding it was loaded."""

    def __init__(self, tag):
        self.tag = tag

    def __setstate__(self, state):
        path = os.environ.get("TRIPWIRE")
        if path:
            with open(path, "a") as fh:
                fh.write(f"unpickled {state}\\n")
        self.__dict__.update(state)


@tcc.effect
def act(what):
    with open(os.environ["LEDGER"], "a") as fh:
        fh.write(f"{tcc.current().idempotency_key} {what}\\n")
    return f"did {what}"


async def main(flavor="b"):
    wire = Tripwire(flavor) if flavor == "a" else flavor
    ballast = "tcc " * 4096  # 16 KiB: snapshots are cut into chunks, not stored inline
    before = await act(f"prepare {flavor}")
    ok = await tcc.approval("go?")
    return [before, ok, await act(f"deploy {flavor}"), flavor]
'''


def expected(flavor: str) -> list:
    return [f"did prepare {flavor}", True, f"did deploy {flavor}", flavor]


def parked(tmp: pathlib.Path, name: str, flavor: str, tenant: str = "default", folder: str = "") -> Cli:
    """A store folder (tmp/folder or tmp/name) with run "r" parked at its approval, approved."""
    where = tmp / (folder or name)
    where.mkdir(exist_ok=True)
    script = tmp / "trip_agent.py"
    if not script.exists():
        script.write_text(TRIP_AGENT)
    cli = Cli(where, LEDGER=str(where / f"ledger-{tenant}.txt"), TRIPWIRE=str(tmp / f"tripwire-{name}"))
    t = ("--tenant", tenant)
    out = json.loads(cli.run("run", *t, "--json", "--run-id", "r", str(script), flavor, check=True).stdout)
    assert out["status"] == "waiting"
    cli.run("approve", *t, "r", check=True)
    return cli


def tripwire(cli: Cli) -> pathlib.Path:
    return pathlib.Path(cli.env["TRIPWIRE"])


def check_refused_or_own_result(cli: Cli, proc: subprocess.CompletedProcess[str], flavor: str,
                                tenant: str = "default") -> str:
    """The resume either failed with one clear error line or completed with the run's OWN result."""
    assert proc.returncode >= 0, f"killed by signal {-proc.returncode}: {proc.stderr}"
    if proc.returncode != 0:
        assert_clear_error(proc)
        return "refused"
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert doc["status"] == "completed" and doc["result"] == expected(flavor), doc
    kinds = [e["kind"] for e in events_of(cli, tenant)]
    assert "snapshot_corrupt" in kinds and "fell_back" in kinds, kinds  # the refusal is recorded
    assert [v for _, v in ledger(cli.env["LEDGER"])] == [f"prepare {flavor}", f"deploy {flavor}"]
    return "fell back"


def events_of(cli: Cli, tenant: str) -> list[dict]:
    if tenant == "default":
        return events(cli, "r")
    from tcc.store import open_store

    with open_store(cli.store, tenant=tenant, create=False) as store:
        return [{"kind": e.kind, **dict(e.data)} for e in store.events("r")]


# ------------------------------------------------------------------ (a) another store


def test_snapshot_records_copied_from_another_store_are_refused(tmp_path: pathlib.Path) -> None:
    """Store A's snapshot manifests and chunks written under the same keys in store B are refused and never unpickled."""
    a = parked(tmp_path, "A", "a")
    b = parked(tmp_path, "B", "b")
    foreign = {db: raw_items(a.store, db) for db in ("snaps", "chunks")}
    assert foreign["snaps"].keys() == raw_items(b.store, "snaps").keys()  # same run id, same keys
    for db, items in foreign.items():
        raw_put(b.store, db, items)

    proc = b.run("resume", "--json", "r")
    assert not tripwire(b).exists(), tripwire(b).read_text()
    if check_refused_or_own_result(b, proc, "b") == "fell back":  # every planted snapshot was refused
        corrupt = events(b, "r", "snapshot_corrupt")
        assert len(corrupt) == len(foreign["snaps"])
        assert all("failed verification" in e["error"] for e in corrupt), corrupt

    # the control: the same bytes in their own store DO trip the wire when resumed
    done = json.loads(a.run("resume", "--json", "r", check=True).stdout)
    assert done["result"] == expected("a") and tripwire(a).exists()


def test_a_whole_run_transplanted_from_another_store_is_refused(tmp_path: pathlib.Path) -> None:
    """Every record of run r copied from store A into store B (run, journal, snapshots, chunks, signals, events) is refused."""
    a = parked(tmp_path, "A", "a")
    c = parked(tmp_path, "C", "b")
    for db in ("runs", "journal", "snaps", "chunks", "signals", "events"):
        raw_put(c.store, db, raw_items(a.store, db))
    for args in (("ls",), ("show", "r"), ("resume", "r"), ("inspect", "r"), ("fork", "r"), ("approve", "r")):
        proc = c.run(*args)
        assert_clear_error(proc, "failed verification")
    assert not tripwire(c).exists()


def test_a_data_file_copied_next_to_another_stores_secret_is_refused(tmp_path: pathlib.Path) -> None:
    """A's data.mdb placed in a store directory holding B's secret does not open at all."""
    a = parked(tmp_path, "A", "a")
    b = parked(tmp_path, "B", "b")
    shutil.copyfile(a.store / "data.mdb", b.store / "data.mdb")
    for args in (("ls",), ("show", "r"), ("resume", "r"), ("inspect", "r")):
        assert_clear_error(b.run(*args), "does not belong to it")
    assert not tripwire(b).exists()


# ------------------------------------------------------------------ (b) another tenant


def test_snapshot_records_of_another_tenant_are_refused(tmp_path: pathlib.Path) -> None:
    """Tenant ta's snapshot manifests written under tenant tb's keys (same store, same chunks, same secret) are refused."""
    ta = parked(tmp_path, "ta", "a", tenant="ta", folder="shared")
    tb = parked(tmp_path, "tb", "b", tenant="tb", folder="shared")
    assert ta.store == tb.store
    planted = {b"tb" + key[len(b"ta"):]: value for key, value in raw_items(ta.store, "snaps", b"ta\x00r\x00").items()}
    assert planted.keys() == raw_items(tb.store, "snaps", b"tb\x00r\x00").keys()
    raw_put(tb.store, "snaps", planted)

    assert_clear_error(tb.run("inspect", "--tenant", "tb", "r"), "failed verification")
    proc = tb.run("resume", "--tenant", "tb", "--json", "r")
    assert not tripwire(tb).exists(), tripwire(tb).read_text()
    check_refused_or_own_result(tb, proc, "b", tenant="tb")

    # the run record too: tenant tb's run r now carries tenant ta's record
    raw_put(tb.store, "runs", {b"tb\x00r": raw_items(ta.store, "runs")[b"ta\x00r"]})
    for args in (("show", "r"), ("resume", "r"), ("ls",)):
        assert_clear_error(tb.run(args[0], "--tenant", "tb", *args[1:]), "failed verification")
    assert not tripwire(tb).exists()

    # the control: tenant ta's own run resumes from those bytes, tripping the wire
    done = json.loads(ta.run("resume", "--tenant", "ta", "--json", "r", check=True).stdout)
    assert done["result"] == expected("a") and tripwire(ta).exists()


# ------------------------------------------------------------------ (c) permissions


@pytest.mark.parametrize("target,mode", [("", 0o755), ("secret", 0o644), ("data.mdb", 0o644)],
                         ids=["dir-0755", "secret-0644", "data-0644"])
def test_world_readable_store_files_give_a_warning(tmp_path: pathlib.Path, target: str, mode: int) -> None:
    """Opening a store whose directory or files other users can read warns, naming the path, and still works."""
    cli = parked(tmp_path, "P", "b")
    path = cli.store / target if target else cli.store
    os.chmod(path, mode)
    for args in (("ls",), ("show", "r")):
        proc = cli.run(*args)
        assert proc.returncode == 0, proc.stderr
        assert "warning" in proc.stderr.lower() and str(path) in proc.stderr, proc.stderr


# ------------------------------------------------------------------ (d) inspect

TRIPMOD = '''\
import os

MARK = os.environ.get("MARK")


def _mark(what):
    if MARK:
        with open(MARK, "a") as fh:
            fh.write(what + "\\n")


_mark("module body")


class Thing:
    def __init__(self, n):
        self.n = n

    def __repr__(self):
        _mark("__repr__")
        return f"Thing({self.n})"

    def __reduce__(self):
        _mark("__reduce__")
        return (Thing, (self.n,), {"n": self.n})

    def __setstate__(self, state):
        _mark("__setstate__")
        self.__dict__.update(state)
'''

EAGER_AGENT = '''\
import tcc
from tripmod_sec import Thing

_ = __import__("tripmod_sec")._mark("script body")


@tcc.effect
def act(what):
    return f"did {what}"


async def main():
    thing = Thing(7)
    before = await act("prepare")
    ok = await tcc.approval("go?")
    return [before, ok, thing.n]
'''

LAZY_AGENT = '''\
import tcc


@tcc.effect
def act(what):
    return f"did {what}"


async def main():
    from tripmod_sec import Thing

    thing = Thing(7)
    before = await act("prepare")
    ok = await tcc.approval("go?")
    return [before, ok, thing.n]
'''


def inspect_setup(tmp: pathlib.Path) -> tuple[Cli, pathlib.Path]:
    """Runs "eager" and "lazy" parked with a Thing (whose every hook leaves a mark) in a local."""
    (tmp / "tripmod_sec.py").write_text(TRIPMOD)
    (tmp / "eager_agent.py").write_text(EAGER_AGENT)
    (tmp / "lazy_agent.py").write_text(LAZY_AGENT)
    mark = tmp / "marker"
    cli = Cli(tmp, MARK=str(mark))
    for run_id in ("eager", "lazy"):
        cli.run("run", "--run-id", run_id, str(tmp / f"{run_id}_agent.py"), check=True)
    assert "__reduce__" in mark.read_text()  # the Thing really went through its hooks into the snapshot
    mark.unlink()
    return cli, mark


def test_inspect_runs_no_user_code(tmp_path: pathlib.Path) -> None:
    """`tcc inspect` (text, --json, every snapshot) never imports the script or its modules, nor calls a hook."""
    cli, mark = inspect_setup(tmp_path)
    for run_id in ("eager", "lazy"):
        numbers = [s["number"] for s in cli.show(run_id)["snapshots"]]
        for extra in ([], ["--json"], *[["--at", str(n)] for n in numbers]):
            proc = cli.run("inspect", *extra, run_id)
            assert proc.returncode == 0, proc.stderr
            assert not mark.exists(), (extra, mark.read_text())
        assert "tripmod_sec.Thing" in cli.run("inspect", run_id, check=True).stdout
    # the control: --unsafe-repr does import the script and use the real hooks
    cli.run("inspect", "--unsafe-repr", "--yes", "eager", check=True)
    assert {"module body", "__setstate__", "__repr__"} <= set(mark.read_text().splitlines())


def test_inspect_of_a_snapshot_whose_class_module_is_gone(tmp_path: pathlib.Path) -> None:
    """With the module of a snapshotted class deleted, inspect still shows the frame (a stub) and resume refuses clearly."""
    cli, mark = inspect_setup(tmp_path)
    (tmp_path / "tripmod_sec.py").unlink()
    shutil.rmtree(tmp_path / "__pycache__", ignore_errors=True)
    for run_id in ("eager", "lazy"):
        text = cli.run("inspect", run_id, check=True).stdout
        assert "thing" in text and "tripmod_sec.Thing" in text, text
        doc = json.loads(cli.run("inspect", "--json", run_id, check=True).stdout)
        assert doc["run"] == run_id
    assert not mark.exists()
    cli.run("approve", "lazy", check=True)
    # (on the current code: by default the run would continue on its recorded module)
    assert_clear_error(cli.run("resume", "--code", "current", "lazy"), "No module named 'tripmod_sec'",
                       codes=(1,))
    assert cli.show("lazy")["status"] == "waiting"  # the refusal changed nothing
    assert not mark.exists()


def test_resume_when_the_script_no_longer_imports_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    """Resuming a run whose script cannot be imported any more fails with one clear `tcc: error:` line."""
    cli, mark = inspect_setup(tmp_path)
    (tmp_path / "tripmod_sec.py").unlink()
    shutil.rmtree(tmp_path / "__pycache__", ignore_errors=True)
    cli.run("approve", "eager", check=True)
    proc = cli.run("resume", "--code", "current", "eager")
    assert proc.returncode == 1 and not mark.exists()
    assert_clear_error(proc, "tripmod_sec", codes=(1,))


# ------------------------------------------------------------------ (e) a planted os.system pickle


class _Evil:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


def evil_blob(marker: pathlib.Path) -> bytes:
    """A snapshot envelope with a valid (unkeyed) digest around a pickle that runs os.system."""
    payload = pickle.dumps(_Evil(str(marker)), protocol=5)
    assert b"system" in payload
    return seal(payload, compress=False)


def test_evil_blob_control(tmp_path: pathlib.Path) -> None:
    """The planted payload is live: plain pickle.loads of it (in a child) does run os.system."""
    marker = tmp_path / "pwned"
    blob_file = tmp_path / "blob"
    blob_file.write_bytes(pickle.dumps(_Evil(str(marker)), protocol=5))
    subprocess.run([sys.executable, "-c", "import pickle,sys; pickle.loads(open(sys.argv[1],'rb').read())",
                    str(blob_file)], check=True)
    assert marker.exists()


def test_os_system_pickle_planted_in_snapshot_chunks_is_never_unpickled(tmp_path: pathlib.Path) -> None:
    """Every stored chunk replaced by a sealed os.system pickle: resume, inspect and fork refuse, nothing runs."""
    cli = parked(tmp_path, "E", "b")
    marker = tmp_path / "pwned"
    stored = b"\x00" + evil_blob(marker)  # codec byte 0: raw
    chunks = raw_items(cli.store, "chunks")
    raw_put(cli.store, "chunks", {k: stored for k in chunks if k.endswith(b"d")})
    for args in (("inspect", "r"), ("inspect", "--json", "r"), ("fork", "r")):
        proc = cli.run(*args)
        assert not marker.exists(), args
        assert_clear_error(proc)
    check_refused_or_own_result(cli, cli.run("resume", "--json", "r"), "b")
    assert not marker.exists() and not tripwire(cli).exists()


def forge_newer_snapshot(cli: Cli, marker: pathlib.Path) -> int:
    """Plant snapshot newest+1 of run r: a manifest sealed with a guessed key, naming an os.system pickle chunk."""
    blob = evil_blob(marker)
    attacker = Sealer(os.urandom(32))  # does not know the store secret
    cid = max(int.from_bytes(k[:8], "big") for k in raw_items(cli.store, "chunks")) + 1
    newest = max(int.from_bytes(k[-8:], "big") for k in raw_items(cli.store, "snaps")
                 if not is_head_key("snaps", k))
    key = seq_key(b"default", b"r", newest + 1)
    manifest = pack_entries([(cid, attacker.chunk_id(blob), len(blob))])
    record = attacker.seal(b"snaps", key, {"j": 3, "s": len(blob), "t": 0.0, "g": 0}, {"m": manifest})
    raw_put(cli.store, "chunks", {cid.to_bytes(8, "big") + b"d": b"\x00" + blob,
                                  cid.to_bytes(8, "big") + b"r": (1).to_bytes(4, "little")})
    raw_put(cli.store, "snaps", {key: record})
    return newest


def test_forged_newer_snapshot_with_os_system_pickle_is_skipped(tmp_path: pathlib.Path) -> None:
    """A newer snapshot record forged with a guessed key, pointing at an os.system pickle, is skipped for the real one."""
    cli = parked(tmp_path, "F", "b")
    marker = tmp_path / "pwned"
    newest = forge_newer_snapshot(cli, marker)
    for args in (("inspect", "r"), ("fork", "r"), ("show", "r")):
        proc = cli.run(*args)
        assert not marker.exists(), args
        assert proc.returncode == 0 or is_clear_error(proc), (args, proc.returncode, proc.stderr)
    doc = json.loads(cli.run("show", "--json", "r").stdout.strip().splitlines()[-1])
    assert {"number": newest + 1, "damaged": True} in doc["snapshots"]
    done = cli.run("resume", "--json", "r")
    assert not marker.exists()
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    assert doc["status"] == "completed" and doc["result"] == expected("b"), done.stderr
    resumed = events(cli, "r", "resumed")
    assert [e["snapshot"] for e in resumed] == [newest]  # the real newest snapshot
    # the run's snapshot index does not list the forged number: it is never even read (and
    # the resumed run's own snapshot newest + 1 replaced it)
    assert events(cli, "r", "snapshot_corrupt") == []


def test_inspect_and_show_skip_a_forged_snapshot_record(tmp_path: pathlib.Path) -> None:
    """inspect falls back past a forged newest snapshot record (saying so), and show still shows the run.

    Regression (found by the reliability campaign): store.snapshots() raised on
    the first record that failed its MAC, so `tcc inspect` and `tcc show` failed
    outright instead of skipping the forged record.
    """
    cli = parked(tmp_path, "G", "b")
    newest = forge_newer_snapshot(cli, tmp_path / "pwned")
    text = cli.run("inspect", "r")
    assert text.returncode == 0, text.stderr
    assert f"snapshot {newest + 1} fails verification and was skipped" in text.stdout + text.stderr
    shown = cli.run("show", "r")
    assert shown.returncode == 0, shown.stderr
    assert f"snapshot {newest + 1} fails verification" in shown.stdout
    doc = json.loads(cli.run("show", "--json", "r").stdout.strip().splitlines()[-1])
    assert {"number": newest + 1, "damaged": True} in doc["snapshots"]
    assert doc["checkpoints"] == newest  # the forged number is not counted as a checkpoint
