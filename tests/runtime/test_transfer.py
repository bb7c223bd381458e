"""`tcc export` / `tcc import`: a run (with its children) moved between stores as one file."""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from tcc import errors
from tcc.runtime import export_run, import_run, make_transfer_key, read_transfer_key
from tcc.store import open_store
from tests._support.pgstores import make_pg_store
from tests._support.runs import AGENTS, Cli

LEDGER = str(AGENTS / "ledger_agent.py")
WAIT = str(AGENTS / "wait_agent.py")


def _key(tmp: pathlib.Path, name: str = "transfer.key") -> str:
    path = str(tmp / name)
    assert make_transfer_key(path)
    return path


def _runs(where: str | pathlib.Path, **kwargs: object) -> list[str]:
    with open_store(str(where), create=False, **kwargs) as store:  # type: ignore[arg-type]
        return [r.run_id for r in store.list_runs()]


def _events(cli: Cli, run_id: str) -> list[dict]:
    return cli.show(run_id)["events"]


# ------------------------------------------------------------------ resumed exactly

def test_crashed_run_goes_lmdb_to_postgres_to_lmdb_and_resumes_exactly(tmp_path, pg_dsn):
    """A `tcc run` killed with SIGKILL mid-call, moved LMDB -> PostgreSQL -> LMDB, resumes
    from its newest snapshot and finishes with the uninterrupted run's result, each ledger
    step done exactly once (the journal before the crash is served, not re-executed)."""
    env = {"STEPS": "8", "VERIFY": "1"}
    ref = Cli(tmp_path / "ref", LEDGER=str(tmp_path / "ref.ledger"), **env)
    expected = json.loads(ref.run("run", "--json", "--run-id", "r", LEDGER, check=True).stdout)["result"]
    ledger = tmp_path / "ledger"
    src = Cli(tmp_path / "a", LEDGER=str(ledger), **env)
    killed = Cli(tmp_path / "a", LEDGER=str(ledger), DIE_AT="4", **env)
    proc = killed.run("run", "--run-id", "r", LEDGER)
    assert proc.returncode == -9, proc.stderr  # SIGKILL inside step 4, its intent journaled
    assert src.show("r")["status"] == "running"
    before = ledger.read_text().splitlines()
    assert [line.split()[0] for line in before] == ["r:1", "r:2", "r:3", "r:4"]

    key = _key(tmp_path)
    src.run("export", "r", "-o", str(tmp_path / "one.tccx"), "--transfer-key", key, check=True)
    pg = make_pg_store(pg_dsn, tmp_path / "pg")
    mid = Cli(tmp_path, store_url=pg.url, key_file=pg.key_file, LEDGER=str(ledger), **env)
    assert mid.run("import", str(tmp_path / "one.tccx"), "--transfer-key", key, check=True).stdout.strip() == "r"
    assert mid.show("r")["status"] == "running"
    mid.run("export", "r", "-o", str(tmp_path / "two.tccx"), "--transfer-key", key, check=True)
    dst = Cli(tmp_path / "c", LEDGER=str(ledger), **env)
    dst.run("import", str(tmp_path / "two.tccx"), "--transfer-key", key, check=True)

    done = json.loads(dst.run("resume", "--json", "r", check=True).stdout)
    assert done["status"] == "completed" and done["result"] == expected
    lines = ledger.read_text().splitlines()
    assert lines[:4] == before  # nothing before the crash ran again
    keys = [line.split()[0] for line in lines]
    assert keys == [f"r:{k}" for k in range(1, 9)]  # each step once: the in-doubt one too
    kinds = [e["kind"] for e in _events(dst, "r")]
    assert kinds.count("imported") == 2 and kinds.count("started") == 1
    imported = [e["data"] for e in _events(dst, "r") if e["kind"] == "imported"]
    assert imported[0]["store"] == str(src.store) and imported[1]["store"].startswith("postgresql://")
    assert all(i["run"] == "r" and i["status"] == "running" for i in imported)
    assert [e["kind"] for e in _events(src, "r")][-1] == "exported"
    assert src.show("r")["status"] == "running"  # export copies: the source is left alone


def test_parent_parked_on_a_child_moves_with_it_and_both_finish(tmp_path):
    """A parent waiting for a spawned child that waits for an approval moves with the child
    (same ids); approved and resumed in the new store, both finish as they would have."""
    key = _key(tmp_path)
    src = Cli(tmp_path / "a")
    src.run("run", "--run-id", "p", f"{WAIT}:parent_of_gated", check=True)
    assert src.show("p")["status"] == "waiting"
    child = src.show("p")["children"][0]
    assert child.startswith("p.") and src.show(child)["status"] == "waiting"
    out = json.loads(src.run("export", "--json", "p", "-o", str(tmp_path / "p.tccx"),
                             "--transfer-key", key, check=True).stdout)
    assert out["runs"] == ["p", child]

    dst = Cli(tmp_path / "b")
    got = json.loads(dst.run("import", "--json", str(tmp_path / "p.tccx"), "--transfer-key", key,
                             check=True).stdout)
    assert got["runs"] == {"p": "p", child: child}
    assert dst.show(child)["parent"] == "p" and dst.show("p")["children"] == [child]
    results = []
    for cli in (src, dst):  # the original and the moved copy, the same way
        cli.run("approve", child, check=True)
        cli.run("resume", child, check=True)
        results.append(json.loads(cli.run("resume", "--json", "p", check=True).stdout)["result"])
    assert results[0] == results[1] and results[0][1] == "did parent end"


def test_run_id_is_refused_while_a_call_is_in_flight_and_nothing_is_written(tmp_path):
    """--run-id of a tree whose parent waits inside tcc.spawn (an issued call without an
    outcome) is refused: renaming would change the call's idempotency key."""
    key = _key(tmp_path)
    src = Cli(tmp_path / "a")
    src.run("run", "--run-id", "p", f"{WAIT}:parent_of_gated", check=True)
    src.run("export", "p", "-o", str(tmp_path / "p.tccx"), "--transfer-key", key, check=True)
    dst = Cli(tmp_path / "b")
    proc = dst.run("import", "--run-id", "q", str(tmp_path / "p.tccx"), "--transfer-key", key)
    assert proc.returncode == 2 and "in flight" in proc.stderr and "without --run-id" in proc.stderr
    assert _runs(dst.store) == []


def test_run_id_renames_a_finished_tree_consistently(tmp_path):
    """A finished parent imported with --run-id NEW keeps its result; its child becomes
    NEW.k with its result, and the ids in their events follow."""
    key = _key(tmp_path)
    src = Cli(tmp_path / "a")
    first = json.loads(src.run("run", "--json", "--run-id", "p", f"{WAIT}:parent", check=True).stdout)
    child = src.show("p")["children"][0]
    src.run("export", "p", "-o", str(tmp_path / "p.tccx"), "--transfer-key", key, check=True)
    dst = Cli(tmp_path / "b")
    got = json.loads(dst.run("import", "--json", "--run-id", "n", str(tmp_path / "p.tccx"),
                             "--transfer-key", key, check=True).stdout)
    new_child = "n" + child[1:]
    assert got == {"id": "n", "from": "p", "status": "completed", "runs": {"p": "n", child: new_child}}
    shown = dst.show("n")
    assert shown["status"] == "completed" and shown["result"] == first["result"]
    assert shown["children"] == [new_child]
    kid = dst.show(new_child)
    assert kid["parent"] == "n" and kid["result"] == src.show(child)["result"]
    assert _runs(dst.store) == ["n", new_child]


def test_existing_run_id_is_refused_with_a_hint_and_changes_nothing(tmp_path):
    """Importing a run whose id the store has already exits 2, suggests --run-id, and leaves
    the existing run as it was; with --run-id it is imported beside it."""
    key = _key(tmp_path)
    src = Cli(tmp_path / "a")
    src.run("run", "--run-id", "r", f"{WAIT}:checked", check=True)
    src.run("export", "r", "-o", str(tmp_path / "r.tccx"), "--transfer-key", key, check=True)
    before = src.show("r")
    proc = src.run("import", str(tmp_path / "r.tccx"), "--transfer-key", key)
    assert proc.returncode == 2 and "exists" in proc.stderr and "--run-id" in proc.stderr
    assert src.show("r") == before
    src.run("import", "--run-id", "r2", str(tmp_path / "r.tccx"), "--transfer-key", key, check=True)
    assert src.show("r2")["result"] == before["result"] and src.show("r2")["status"] == "completed"


# ------------------------------------------------------------ damaged and foreign files

def _exported(tmp_path: pathlib.Path) -> tuple[bytes, bytes]:
    """(the bytes of an export of a finished run, its key)."""
    key_file = _key(tmp_path)
    src = Cli(tmp_path / "a")
    src.run("run", "--run-id", "r", f"{WAIT}:parent", check=True)
    src.run("export", "r", "-o", str(tmp_path / "r.tccx"), "--transfer-key", key_file, check=True)
    return (tmp_path / "r.tccx").read_bytes(), read_transfer_key(key_file)


def _refused(tmp_path: pathlib.Path, data: bytes, key: bytes) -> str:
    """The error importing ``data`` gives; asserts the target store got nothing."""
    path = tmp_path / "bad.tccx"
    path.write_bytes(data)
    target = tmp_path / "target"
    with open_store(str(target)) as store:
        with pytest.raises(errors.StoreCorruptError) as info:
            import_run(store, path, key=key)
        assert store.list_runs() == [] and store.events("r") == [] and store.events("r.1") == []
    return str(info.value)


def test_a_damaged_file_is_refused_naming_the_damage_and_nothing_is_written(tmp_path):
    """Any flipped byte (header, body, tag) or a truncation is refused before anything is
    written, and the error says the file is damaged or truncated."""
    data, key = _exported(tmp_path)
    for at in (9, 12, 22, 36, 40, len(data) // 2, len(data) - 1):
        flipped = bytearray(data)
        flipped[at] ^= 0x01
        message = _refused(tmp_path, bytes(flipped), key)
        assert "damaged" in message or "format" in message, (at, message)
    for size in (len(data) - 1, len(data) // 2, 30, 4):
        message = _refused(tmp_path, data[:size], key)
        assert "truncated" in message, (size, message)
    assert "damaged" in _refused(tmp_path, data + b"\0", key)


def test_a_foreign_file_is_refused_and_nothing_is_written(tmp_path):
    """A file that is not an export, or an export made with another transfer key, is
    refused with an error that says which."""
    data, key = _exported(tmp_path)
    assert "not a tcc run export" in _refused(tmp_path, b"PK\x03\x04 a zip, say" * 10, key)
    assert "not a tcc run export" in _refused(tmp_path, b"", key)
    other = read_transfer_key(_key(tmp_path, "other.key"))
    assert "another transfer key" in _refused(tmp_path, data, other)


def test_cli_refuses_a_damaged_file_with_one_line_and_exit_1(tmp_path):
    """`tcc import` of a damaged file exits 1 with a one-line error and creates no run."""
    data, _key_bytes = _exported(tmp_path)
    bad = tmp_path / "bad.tccx"
    bad.write_bytes(data[:-10])
    dst = Cli(tmp_path / "b")
    proc = dst.run("import", str(bad), "--transfer-key", str(tmp_path / "transfer.key"))
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "truncated" in proc.stderr
    assert _runs(dst.store) == []


# --------------------------------------------------------------------- refusals, keys

def test_a_run_with_a_live_owner_is_refused_for_export(tmp_path):
    """A running run whose owner (this process) is alive and holds its lease is not exported."""
    with open_store(str(tmp_path / "a")) as store:
        store.create_run("x.py:main", b"[]", run_id="live")
        with pytest.raises(errors.UsageError, match="its owner .* is alive"):
            export_run(store, "live", tmp_path / "x.tccx", key=bytes(32))
    assert not (tmp_path / "x.tccx").exists()


def test_transfer_key_files_follow_the_store_key_file_rules(tmp_path):
    """A transfer key file readable by others, or missing on import, is refused; export
    creates a missing one with mode 0600."""
    path = tmp_path / "k"
    path.write_text("ab" * 32)
    path.chmod(0o644)
    with pytest.raises(errors.StoreInsecureError, match="chmod 600"):
        read_transfer_key(path)
    src = Cli(tmp_path / "a")
    src.run("run", "--run-id", "r", f"{WAIT}:checked", check=True)
    made = tmp_path / "made.key"
    out = json.loads(src.run("export", "--json", "r", "-o", str(tmp_path / "r.tccx"), "--transfer-key",
                             str(made), check=True).stdout)
    assert out["key_file_created"] and (os.stat(made).st_mode & 0o777) == 0o600
    # in a folder that does not exist yet (~/.tcc/transfer.key on a new machine): made, 0700
    nested = tmp_path / "home" / ".tcc" / "transfer.key"
    out = json.loads(src.run("export", "--json", "r", "-o", str(tmp_path / "r2.tccx"), "--transfer-key",
                             str(nested), check=True).stdout)
    assert out["key_file_created"] and (os.stat(nested.parent).st_mode & 0o777) == 0o700
    proc = Cli(tmp_path / "b").run("import", str(tmp_path / "r.tccx"),
                                           "--transfer-key", str(tmp_path / "missing.key"))
    assert proc.returncode == 2 and "missing.key" in proc.stderr
    proc = Cli(tmp_path / "b").run("import", str(tmp_path / "r.tccx"))
    assert proc.returncode == 2 and "--transfer-key" in proc.stderr


def test_export_and_import_are_tcc_commands(tmp_path):
    """`python -m tcc export` and `python -m tcc import` exist and move a run."""
    key = _key(tmp_path)
    src = Cli(tmp_path / "a")
    src.run("run", "--run-id", "r", f"{WAIT}:checked", check=True)
    src.run("export", "r", "-o", str(tmp_path / "r.tccx"), "--transfer-key", key, check=True)
    dst = Cli(tmp_path / "b")
    assert dst.run("import", str(tmp_path / "r.tccx"), "--transfer-key", key, check=True).stdout.strip() == "r"
    assert dst.show("r")["result"] == src.show("r")["result"]


def test_an_import_killed_midway_leaves_runs_nothing_resumes_and_a_new_import_replaces_them(tmp_path):
    """`tcc import` writes a run in status `importing` and gives it its status last: a
    process killed in between leaves a run no worker or resume takes up (its effects are
    not run again), and importing the file again replaces it."""
    import subprocess
    import sys

    src, dst = tmp_path / "src", tmp_path / "dst"
    ledger = tmp_path / "ledger"
    env = {"LEDGER": str(ledger), "SALT": "step"}
    a = Cli(src, **env)
    a.run("run", "--run-id", "job", LEDGER, "4", check=True)
    key = tmp_path / "transfer.key"
    a.run("export", "job", "-o", str(tmp_path / "job.tccx"), "--transfer-key", str(key), check=True)
    lines = ledger.read_text().splitlines()
    dies = (
        "import os, sys\n"
        "from tcc.runtime import import_run, read_transfer_key\n"
        "from tcc.store import open_store\n"
        "store = open_store(sys.argv[1])\n"
        "calls = [0]\n"
        "real = store.append_completion\n"
        "def dying(*a, **k):\n"
        "    calls[0] += 1\n"
        "    if calls[0] == 2:\n"
        "        os._exit(9)\n"
        "    return real(*a, **k)\n"
        "store.append_completion = dying\n"
        "import_run(store, sys.argv[2], key=read_transfer_key(sys.argv[3]))\n")
    proc = subprocess.run([sys.executable, "-c", dies, str(dst / "store"), str(tmp_path / "job.tccx"), str(key)],
                          capture_output=True, text=True, env=dict(a.env), timeout=120)
    assert proc.returncode == 9, proc.stderr
    b = Cli(dst, **env)
    assert b.show("job")["status"] == "importing"
    out = b.run("worker", "--once", check=True)
    assert "resuming" not in out.stderr
    refused = b.run("resume", "job")
    assert refused.returncode != 0 and "import the file again" in refused.stderr, refused.stderr
    assert ledger.read_text().splitlines() == lines  # no effect ran again
    b.run("import", str(tmp_path / "job.tccx"), "--transfer-key", str(key), check=True)
    assert b.show("job")["status"] == "completed"
    assert b.show("job")["result"] == a.show("job")["result"]
    assert ledger.read_text().splitlines() == lines


def test_run_id_renames_a_run_parked_at_a_wait_and_the_signal_reaches_it(tmp_path):
    """A wait (or sleep) the run is parked at is an open marker, not a call the outside world
    saw: --run-id imports such a run (it was refused as "a call in flight")."""
    key = _key(tmp_path)
    src = Cli(tmp_path / "a")
    src.run("run", "--run-id", "w", f"{WAIT}:gated", check=True)  # parks at its approval
    src.run("export", "w", "-o", str(tmp_path / "w.tccx"), "--transfer-key", key, check=True)
    dst = Cli(tmp_path / "b")
    got = json.loads(dst.run("import", "--json", "--run-id", "w2", str(tmp_path / "w.tccx"),
                             "--transfer-key", key, check=True).stdout)
    assert got["id"] == "w2" and got["status"] == "waiting"
    dst.run("approve", "w2", check=True)
    done = json.loads(dst.run("resume", "--json", "w2", check=True).stdout)
    assert done["result"] == ["did prepare", True, "did deploy"]
