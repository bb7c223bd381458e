"""The PostgreSQL store's key (issue 19): who may read a store, and what is never unpickled.

A snapshot is a pickle, and a pickle is code: whoever can write the database must not be
able to make a tcc process run code.  So every row's record is sealed with keys derived
from the store key in a key file the database never sees.  Checked here, through the CLI
(exit code and one ``tcc: error:`` line) and the Python API:

* a wrong key (another key file) is refused at open, naming both key ids, before any
  record is read: a run whose snapshot would run code when unpickled is not loaded, even
  by ``tcc inspect --unsafe-repr --yes``, until the right key is given;
* no key at all is one line saying how to give one (``--key-file``,
  ``$TCC_STORE_KEY_FILE``, ``tcc init``);
* ``tcc init`` makes the key file (mode 0600 whatever the umask), keeps an existing one,
  refuses one that is not the store's key without touching it, and removes a key file it
  made for a store it could not open;
* a key file group or others can read is refused;
* records sealed with another store's key, copied into a store by SQL -- its run row,
  journal rows, snapshot rows, or all of them -- fail verification and are never
  unpickled: they hold ``Bomb`` objects (tests/_support/agents/pg_bomb_agent.py) that
  write a marker file when unpickled, and the marker never appears, whatever command
  meets them; in their own store, ``tcc inspect --unsafe-repr`` does write it (the
  control that shows the records would run code);
* a database whose schema is newer than this tcc is refused with "upgrade tcc";
* processes initialising or opening a fresh database at the same moment migrate it
  once, and racing ``tcc init``s of one new key file all get the same, whole key.
"""

from __future__ import annotations

import itertools
import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tcc.errors import StoreCorruptError, StoreError, StoreInsecureError, UsageError
from tcc.store import open_store
from tcc.store._crypt import key_id
from tcc.store._pgschema import SCHEMA_VERSION
from tests._support.pgstores import PgStore, make_pg_store

psycopg = pytest.importorskip("psycopg")

BOMB_AGENT = str(pathlib.Path(__file__).resolve().parents[1] / "_support" / "agents" / "pg_bomb_agent.py")
_databases = itertools.count(1)


# ----------------------------------------------------------------- helpers


def clean_env(**env: str) -> dict[str, str]:
    """The environment without tcc's variables (no store, no key), plus ``env``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("TCC_")}
    return dict(base, **env)


def tcc(*args: str, env: dict[str, str], timeout: float = 120, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tcc", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, **kwargs)  # type: ignore[call-overload]


def error_line(proc: subprocess.CompletedProcess[str], code: int = 1) -> str:
    """The one `tcc: error:` line of a failed command (asserted: exit code, one line, no traceback)."""
    lines = [ln for ln in proc.stderr.strip().splitlines()
             if ln.strip() and not ln.startswith(("resuming ", "run "))]
    assert proc.returncode == code and len(lines) == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert lines[0].startswith("tcc: error: ") and "Traceback" not in proc.stderr, proc.stderr
    assert "internal error" not in lines[0], lines[0]
    return lines[0]


def key_of(path: str | pathlib.Path) -> bytes:
    return bytes.fromhex(pathlib.Path(path).read_text().strip())


def write_key(path: pathlib.Path, mode: int = 0o600) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(os.urandom(32).hex() + "\n")
    path.chmod(mode)
    return path


def meta(url: str) -> dict[str, str]:
    with psycopg.connect(url, autocommit=True) as conn:
        return dict(conn.execute("SELECT key, value FROM tcc.meta").fetchall())


@pytest.fixture
def pg(pg_dsn: str, tmp_path: pathlib.Path) -> PgStore:
    """A PostgreSQL store (schema and key file made by init_store)."""
    return make_pg_store(pg_dsn, tmp_path / "a")


@pytest.fixture
def second_dsn(pg_server) -> Iterator[str]:
    """Another fresh database on the session's server."""
    name = f"k{os.getpid()}_{next(_databases)}"
    dsn = pg_server.create_database(name)
    try:
        yield dsn
    finally:
        pg_server.drop_database(name)


def bomb_run(pg: PgStore, marker: pathlib.Path, run_id: str = "evil") -> None:
    """A run of the bomb agent, parked at its wait: its journal and snapshot hold Bombs.

    The run itself unpickles one Bomb, once: the agent gets an effect's result as the
    journal recorded it (README, "The agent receives a copy of an effect's result"), in
    the run's own process and store.  The marker is cleared after, so that the tests
    count only what later commands unpickle."""
    proc = tcc("run", "--json", "--run-id", run_id, BOMB_AGENT,
               env=clean_env(**pg.env(), BOMB_MARKER=str(marker)))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["status"] == "waiting"
    assert len(marker.read_text().splitlines()) == 1  # the agent's copy of arm()'s result
    marker.unlink()


def unsafe_inspect_runs_the_bomb(pg: PgStore, marker: pathlib.Path, run_id: str = "evil") -> None:
    """The control: in its own store, loading the snapshot with the real unpickler runs its code."""
    proc = tcc("inspect", "--unsafe-repr", "--yes", run_id, env=clean_env(**pg.env()))
    assert proc.returncode == 0, proc.stderr
    assert marker.exists() and marker.read_text().startswith("unpickled")


# --------------------------------------------------------------- wrong key


def test_wrong_key_is_refused_before_anything_is_read(pg, tmp_path):
    marker = tmp_path / "marker"
    bomb_run(pg, marker)
    with pg.open(create=False) as store:
        before = store.get_run("evil")
        events = len(store.events("evil"))
    other = write_key(tmp_path / "other.key")
    mine, theirs = key_id(key_of(pg.key_file)), key_id(key_of(other))
    assert mine != theirs and meta(pg.url)["key_id"] == mine

    commands = [("ls",), ("show", "evil"), ("inspect", "evil"), ("inspect", "--unsafe-repr", "--yes", "evil"),
                ("resume", "evil"), ("signal", "evil", "go"), ("fork", "evil"), ("cancel", "evil"),
                ("worker", "--once"), ("gc",), ("init",)]
    for args in commands:
        # the key from --key-file, and from $TCC_STORE_KEY_FILE
        for env, extra in ((clean_env(TCC_STORE=pg.url), ("--key-file", str(other))),
                           (clean_env(TCC_STORE=pg.url, TCC_STORE_KEY_FILE=str(other)), ())):
            line = error_line(tcc(args[0], *extra, *args[1:], env=env))
            assert f"(key id {theirs})" in line and f"(key id {mine})" in line, line
            assert "is not the key of the PostgreSQL store" in line and "nothing was read" in line, line
            assert not marker.exists(), args

    with pytest.raises(StoreError, match=f"key id {theirs}.*key id {mine}"):
        open_store(pg.url, key_file=str(other))
    with pg.open(create=False) as store:  # nothing was claimed, cancelled or written
        after = store.get_run("evil")
        assert (after.status, after.epoch, after.owner_pid) == (before.status, before.epoch, before.owner_pid)
        assert len(store.events("evil")) == events
    assert key_of(other) != key_of(pg.key_file)  # `tcc init` left the other key file alone
    assert not marker.exists()
    unsafe_inspect_runs_the_bomb(pg, marker)


def test_missing_key_is_one_line_saying_how(pg):
    for args in (("ls",), ("show", "x"), ("resume", "x"), ("worker", "--once"), ("gc",)):
        for env, extra in ((clean_env(TCC_STORE=pg.url), ()), (clean_env(), ("--store", pg.url))):
            line = error_line(tcc(args[0], *extra, *args[1:], env=env), code=2)
            assert "needs its key" in line and "--key-file PATH" in line, line
            assert "$TCC_STORE_KEY_FILE" in line and "tcc init --store URL --key-file PATH" in line, line
    line = error_line(tcc("init", "--store", pg.url, env=clean_env()), code=2)
    assert "needs a key file" in line and "--key-file PATH" in line, line
    line = error_line(tcc("ls", "--store", pg.url, "--key-file", str(pathlib.Path(pg.key_file).parent / "nope"),
                          env=clean_env()))
    assert "cannot read the store key file" in line and "No such file" in line, line
    with pytest.raises(UsageError, match="needs its key"):
        open_store(pg.url)


# ---------------------------------------------------------------- tcc init


def test_init_makes_a_private_key_file_and_keeps_an_existing_one(pg_dsn, second_dsn, tmp_path):
    keys = tmp_path / "keys"
    keys.mkdir()
    key = keys / "store.key"
    env = clean_env()
    made = tcc("init", "--json", "--store", pg_dsn, "--key-file", str(key), env=env,
               preexec_fn=lambda: os.umask(0))  # the file is 0600 whatever the umask
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout) == {"store": pg_dsn, "key_file": str(key), "key_file_created": True}
    assert (key.stat().st_mode & 0o777) == 0o600
    text = key.read_text()
    assert len(text.strip()) == 64 and int(text, 16) >= 0 and text.endswith("\n")
    assert meta(pg_dsn)["key_id"] == key_id(key_of(key))
    assert sorted(p.name for p in keys.iterdir()) == ["store.key"]  # no temporary file left

    again = tcc("init", "--json", "--store", pg_dsn, "--key-file", str(key), env=env)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["key_file_created"] is False
    assert key.read_text() == text and meta(pg_dsn)["schema_version"] == str(SCHEMA_VERSION)
    text_out = tcc("init", "--store", pg_dsn, "--key-file", str(key), env=env)
    assert text_out.returncode == 0 and "is ready" in text_out.stdout and "created the key file" not in text_out.stdout

    other = write_key(keys / "other.key")
    other_text = other.read_text()
    line = error_line(tcc("init", "--store", pg_dsn, "--key-file", str(other), env=env))
    assert f"(key id {key_id(key_of(other))})" in line and f"(key id {key_id(key_of(key))})" in line, line
    assert other.read_text() == other_text  # an existing key file is never replaced, nor removed

    fresh = keys / "fresh.key"  # made for a store it is not the key of: removed again
    line = error_line(tcc("init", "--store", pg_dsn, "--key-file", str(fresh), env=env))
    assert "is not the key of the PostgreSQL store" in line, line
    assert not fresh.exists()

    # a fresh database with an existing key file: the file is used as it is
    used = tcc("init", "--json", "--store", second_dsn, "--key-file", str(other), env=env)
    assert used.returncode == 0, used.stderr
    assert json.loads(used.stdout)["key_file_created"] is False
    assert other.read_text() == other_text and meta(second_dsn)["key_id"] == key_id(key_of(other))
    with open_store(second_dsn, key_file=str(other), create=False) as store:
        assert store.list_runs() == []

    line = error_line(tcc("init", "--store", pg_dsn, "--key-file", str(tmp_path / "no" / "such" / "k"), env=env))
    assert "cannot create the key file" in line, line


def test_key_file_others_can_read_is_refused(pg, second_dsn):
    for mode in (0o644, 0o640, 0o604):
        os.chmod(pg.key_file, mode)
        for args in (("ls",), ("init",)):
            line = error_line(tcc(args[0], "--store", pg.url, "--key-file", pg.key_file, env=clean_env()))
            assert f"has mode {mode:o}" in line and f"chmod 600 {pg.key_file}" in line, line
        line = error_line(tcc("ls", env=clean_env(**pg.env())))
        assert f"has mode {mode:o}" in line, line
        with pytest.raises(StoreInsecureError):
            open_store(pg.url, key_file=pg.key_file)
        # nor does `tcc init` make a store with it
        line = error_line(tcc("init", "--store", second_dsn, "--key-file", pg.key_file, env=clean_env()))
        assert f"has mode {mode:o}" in line, line
    with psycopg.connect(second_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('tcc.meta')").fetchone()[0] is None
    os.chmod(pg.key_file, 0o600)
    assert tcc("ls", env=clean_env(**pg.env())).returncode == 0


# ------------------------------------------------- records of another key


PLANTS = ("runs", "journal", "snapshots", "everything")
KEYS = {"runs": ("run_id",), "journal": ("run_id", "seq"), "snapshots": ("run_id", "number")}


def plant(source: str, target: str, what: str) -> int:
    """Copy ``what`` of run ``evil`` from database ``source`` to ``target`` by SQL: the
    records of rows that exist in both (``everything``: every row, into a target without
    the run).  Returns how many rows were planted."""
    planted = 0
    with psycopg.connect(source, autocommit=True) as src, psycopg.connect(target, autocommit=True) as dst:
        if what == "everything":
            for table in ("runs", "journal", "snapshots", "chunks", "events"):
                cur = src.execute(f"SELECT * FROM tcc.{table}")
                rows = cur.fetchall()
                marks = ", ".join(["%s"] * len(cur.description))
                with dst.cursor() as out:
                    out.executemany(f"INSERT INTO tcc.{table} VALUES ({marks}) ON CONFLICT DO NOTHING", rows)
                planted += len(rows)
            return planted
        key = KEYS[what]
        rows = src.execute(f"SELECT {', '.join(key)}, record FROM tcc.{what} WHERE run_id = 'evil'").fetchall()
        for row in rows:
            where = " AND ".join(f"{k} = %s" for k in key)
            planted += dst.execute(f"UPDATE tcc.{what} SET record = %s WHERE {where}", (row[-1], *row[:-1])).rowcount
        assert planted == len(rows) > 0
        if what == "snapshots":  # and the chunks they reference, if any
            for address, data in src.execute("SELECT address, data FROM tcc.chunks"):
                dst.execute("INSERT INTO tcc.chunks VALUES (%s, %s) ON CONFLICT DO NOTHING", (address, data))
    return planted


@pytest.mark.parametrize("what", PLANTS)
def test_records_sealed_with_another_key_are_never_unpickled(what, pg, second_dsn, tmp_path):
    """Rows of a store keyed otherwise, copied in by SQL, fail their MAC: refused, never unpickled."""
    theirs = make_pg_store(second_dsn, tmp_path / "b")
    assert key_of(theirs.key_file) != key_of(pg.key_file)
    foreign = tmp_path / "foreign-marker"  # the Bombs of the planted records name this file
    own = tmp_path / "own-marker"  # the target's own run (same id, same shape), if it has one
    bomb_run(theirs, foreign)
    if what != "everything":
        bomb_run(pg, own)
    assert plant(theirs.url, pg.url, what) > 0

    # the API refuses each planted record (read before any command may have replaced it)
    with pg.open(create=False) as store:
        if what in ("runs", "everything"):
            with pytest.raises(StoreCorruptError, match="MAC mismatch"):
                store.get_run("evil")
        if what in ("journal", "everything"):
            with pytest.raises(StoreCorruptError, match="journal record 0 .* failed verification"):
                store.journal("evil")
        if what in ("snapshots", "everything"):
            with pytest.raises(StoreCorruptError, match="snapshot .* failed verification"):
                store.load_snapshot("evil", 1)
            with pytest.raises(StoreCorruptError, match="snapshot .* failed verification"):
                store.load_snapshot("evil")
        if what == "snapshots":
            assert store.latest_good_snapshot("evil") is None

    env = clean_env(**pg.env(), BOMB_MARKER=str(own))
    outcomes = {}
    for args in (("ls",), ("show", "evil"), ("inspect", "evil"), ("inspect", "--unsafe-repr", "--yes", "evil"),
                 ("fork", "evil"), ("resume", "evil"), ("signal", "evil", "go", "--value", "1"),
                 ("resume", "evil"), ("worker", "--once")):
        proc = tcc(*args, env=env)
        assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, (args, proc.stderr)
        assert not foreign.exists(), (args, proc.returncode, proc.stderr)
        outcomes[args] = proc

    def refused(args: tuple[str, ...], *needles: str) -> None:
        line = error_line(outcomes[args])
        for needle in needles:
            assert needle in line, (args, line)

    if what in ("runs", "everything"):
        refused(("ls",), "run evil is not listed", "run 'evil' record failed verification")
        for args in outcomes:
            if args[0] not in ("ls", "worker"):
                refused(args, "run 'evil' record failed verification (record MAC mismatch)")
        worker = outcomes[("worker", "--once")]
        assert worker.returncode == 0 and "worker: skipping run evil" in worker.stderr, worker.stderr
        assert "failed verification" in worker.stderr
    elif what == "journal":
        refused(("show", "evil"), "journal record 0 of run 'evil' failed verification")
        refused(("fork", "evil"), "failed verification")
    else:
        refused(("inspect", "evil"), "no snapshot verifies", "none was loaded")
        refused(("inspect", "--unsafe-repr", "--yes", "evil"), "no snapshot verifies", "none was loaded")
        refused(("fork", "evil"), "snapshot", "failed verification (record MAC mismatch)")

    assert not foreign.exists()
    unsafe_inspect_runs_the_bomb(theirs, foreign)  # the control: these records do run code


# ------------------------------------------------------------- the schema


def test_newer_schema_is_refused_with_upgrade_tcc(pg):
    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute("UPDATE tcc.meta SET value = '99' WHERE key = 'schema_version'")
    for args in (("ls",), ("worker", "--once"), ("init",)):
        line = error_line(tcc(*args, env=clean_env(**pg.env())))
        assert "schema version 99" in line and f"({SCHEMA_VERSION})" in line and "upgrade tcc" in line, line
    for create in (True, False):
        with pytest.raises(StoreError, match="upgrade tcc"):
            open_store(pg.url, key_file=pg.key_file, create=create)
    assert meta(pg.url)["schema_version"] == "99"  # nothing "migrated" it back


OPENER = r"""
import json, os, sys, time
from tcc.store import init_store, open_store
how, url, key_file, go = sys.argv[1:]
while not os.path.exists(go):
    time.sleep(0.0005)
try:
    if how == "init":
        store, made = init_store(url, key_file=key_file)
    else:
        store, made = open_store(url, key_file=key_file, create=True), False
    with store:
        runs = len(store.list_runs())
    print(json.dumps({"ok": True, "made": made, "runs": runs}))
except Exception as exc:
    print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}))
"""


def race(url: str, key_file: pathlib.Path, hows: list[str], go: pathlib.Path) -> list[dict[str, object]]:
    """Start one process per entry of ``hows`` (init or open), release them together."""
    procs = [subprocess.Popen([sys.executable, "-c", OPENER, how, url, str(key_file), str(go)],
                              env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for how in hows]
    try:
        import time

        time.sleep(1.5)  # all of them started and waiting (they poll for ``go``)
        go.touch()
        results = []
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))
        return results
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def test_processes_opening_a_fresh_database_together_migrate_it_once(pg_dsn, second_dsn, tmp_path):
    # `tcc init` and open_store(create=True) at once, with an existing key file
    key = write_key(tmp_path / "k1" / "store.key")
    results = race(pg_dsn, key, ["init", "open"] * 3, tmp_path / "go1")
    assert all(r["ok"] for r in results), results
    assert not any(r["made"] for r in results)
    assert meta(pg_dsn) == {"schema_version": str(SCHEMA_VERSION), "key_check": meta(pg_dsn)["key_check"],
                            "key_id": key_id(key_of(key))}
    assert SCHEMA_VERSION == 3

    # six `tcc init`s of one new key file: one makes it, whole, and all use that key
    key = tmp_path / "k2" / "store.key"
    key.parent.mkdir()
    results = race(second_dsn, key, ["init"] * 6, tmp_path / "go2")
    assert all(r["ok"] for r in results), results
    assert sum(bool(r["made"]) for r in results) == 1, results
    assert (key.stat().st_mode & 0o777) == 0o600 and sorted(p.name for p in key.parent.iterdir()) == ["store.key"]
    assert meta(second_dsn)["schema_version"] == str(SCHEMA_VERSION) and meta(second_dsn)["key_id"] == key_id(key_of(key))
    with open_store(second_dsn, key_file=str(key), create=False) as store:
        assert store.list_runs() == []
