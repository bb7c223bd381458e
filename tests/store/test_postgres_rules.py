"""The PostgreSQL store's rules, enforced by the database itself (issue 19).

The store's own code checks these too; here each rule is broken behind its back, with
plain SQL on the store's tables, to show that the database refuses: an intent answered
twice, a signal consumed twice, a signal delivered twice.  Leases are the server's: a
host whose clock runs an hour ahead still sees a live owner's lease as live.  And a
machine without the ``postgres`` extra gets one line saying what to install.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tcc.errors import FencedError
from tcc.store import Completion
from tests._support.pgstores import PgStore, make_pg_store

psycopg = pytest.importorskip("psycopg")


@pytest.fixture
def pg(pg_dsn: str, tmp_path: Path) -> PgStore:
    return make_pg_store(pg_dsn, tmp_path)


def _sql(pg: PgStore, statement: str, *params: object) -> None:
    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute(statement, params)


def test_an_intent_is_answered_once_by_the_database(pg: PgStore) -> None:
    with pg.open() as store:
        run = store.create_run("agent.py:main", run_id="r")
        seq = store.append_intent("r", run.epoch, "llm", b"a")
        store.checkpoint("r", run.epoch, b"state", completion=Completion(seq, result=b"x"))
    with pytest.raises(psycopg.errors.UniqueViolation, match="journal_answered_once"):
        _sql(pg, "INSERT INTO tcc.journal VALUES ('default', 'r', 99, 'completion', %s, "
                 "'\\x00'::bytea)", seq)


def test_a_signal_is_delivered_once_and_consumed_once_by_the_database(pg: PgStore) -> None:
    with pg.open() as store:
        run = store.create_run("agent.py:main", run_id="r")
        assert store.send_signal("r", "go", b"1")
        assert store.take_signal("r", run.epoch, "go") == b"1"
        assert store.signal_state("r", "go") == "consumed"
    with pytest.raises(psycopg.errors.UniqueViolation):
        _sql(pg, "INSERT INTO tcc.signal_consumptions (tenant, run_id, name) "
                 "VALUES ('default', 'r', 'go')")
    with pytest.raises(psycopg.errors.UniqueViolation):
        _sql(pg, "INSERT INTO tcc.signals VALUES ('default', 'r', 'go', '\\x00'::bytea)")


def test_a_stale_epoch_writes_nothing_whatever_the_client_believes(pg: PgStore) -> None:
    """The fence is in the functions: a call with an old epoch, made straight to the
    database, raises and leaves the journal as it was."""
    with pg.open() as store:
        run = store.create_run("agent.py:main", run_id="r")
        store.claim_run("r", steal=True)
        with pytest.raises(psycopg.Error, match="fenced"):
            _sql(pg, "SELECT tcc.append_intent('default', 'r', %s, 0, '\\x00'::bytea, true)",
                 run.epoch)
        assert store.journal("r") == []


def test_leases_are_the_servers_not_the_hosts(pg: PgStore) -> None:
    """A claimer whose clock is an hour ahead still sees the owner's 30 s lease as live
    (the server compares its expiry with its own now()), so the claim is refused."""
    with pg.open() as owner:
        owner.create_run("agent.py:main", run_id="r", lease=30.0)
    code = (
        "import os, sys, time\n"
        "real = time.time\n"
        "time.time = lambda: real() + 3600\n"
        "from tcc.store import open_store\n"
        "from tcc.errors import FencedError\n"
        "with open_store(sys.argv[1], key_file=sys.argv[2]) as s:\n"
        "    try:\n"
        "        s.claim_run('r')\n"
        "    except FencedError as e:\n"
        "        print('refused:', e)\n"
        "    else:\n"
        "        print('claimed')\n"
    )
    # another process: an owner on this host whose pid is alive counts as alive anyway, so
    # make the owner look like another host's
    _sql(pg, "UPDATE tcc.runs SET owner_host = 'elsewhere' WHERE run_id = 'r'")
    out = subprocess.run([sys.executable, "-c", code, pg.url, pg.key_file], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("refused:") and "owned by elsewhere" in out.stdout, out.stdout
    # and once the server says the lease is over, the same claimer may take it
    _sql(pg, "UPDATE tcc.runs SET lease_expiry = now() - interval '1 second' WHERE run_id = 'r'")
    out = subprocess.run([sys.executable, "-c", code, pg.url, pg.key_file], capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.strip() == "claimed", out.stdout + out.stderr
    with pg.open() as store, pytest.raises(FencedError):
        store.renew_lease("r", 1)


def test_without_the_postgres_extra_one_line_says_how(pg: PgStore, tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "psycopg.py").write_text("raise ImportError('No module named psycopg')\n")
    env = dict(os.environ, PYTHONPATH=f"{blocker}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               TCC_STORE=pg.url, TCC_STORE_KEY_FILE=pg.key_file)
    out = subprocess.run([sys.executable, "-m", "tcc", "ls"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "pip install 'tcc[postgres]'" in lines[0], lines[0]


def test_the_cli_loads_the_postgresql_store_only_for_a_url(tmp_path: Path) -> None:
    """An LMDB user pays nothing for the PostgreSQL store: the CLI and ``tcc.store``
    recognise and print URLs (``tcc.store._pgurl``) without importing it."""
    code = ("import sys, tcc.cli._main, tcc.store\n"
            "assert tcc.store.is_postgres_url('postgresql://u@h/d')\n"
            "assert tcc.store.redact_url('postgresql://u:pw@h/d') == 'postgresql://u:***@h/d'\n"
            "print(sorted(m for m in ('tcc.store._postgres', 'psycopg') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_server_that_came_back_without_an_intent_is_a_lost_connection(pg: PgStore) -> None:
    """A server crash took the intent this handle wrote (it did not wait for its flush),
    and the pool reconnected: the step's commit is refused as a lost connection (the run
    stops, and resumes in doubt), not as a misuse ("record N is not an intent") that
    would fail the run, and it writes nothing."""
    from tcc.errors import StoreConnectionError

    with pg.open() as store:
        run = store.create_run("agent.py:main", run_id="r")
        seq = store.append_intent("r", run.epoch, "llm", b"a", idempotency_key="r:1")
        _sql(pg, "DELETE FROM tcc.journal WHERE run_id = 'r' AND seq = %s", seq)
        _sql(pg, "UPDATE tcc.runs SET journal_len = %s WHERE run_id = 'r'", seq)
        with pytest.raises(StoreConnectionError, match="lost this run's latest writes"):
            store.checkpoint("r", run.epoch, b"state", completion=Completion(seq, result=b"x"))
        assert store.journal("r") == [] and store.snapshots("r") == []
        again = store.append_intent("r", run.epoch, "llm", b"a", idempotency_key="r:1")
        assert again == seq  # the handle re-read the run and goes on from what is stored


def test_sync_turns_synchronous_commit_back_on_where_the_database_turned_it_off(
        pg: PgStore) -> None:
    _sql(pg, "ALTER ROLE CURRENT_USER SET synchronous_commit = off")
    try:
        with pg.open() as store:
            with store._pool.connection() as conn:  # a connection as every write gets one
                assert conn.execute("SHOW synchronous_commit").fetchone()[0] == "on"
        with pg.open(durability="none") as store:
            with store._pool.connection() as conn:
                assert conn.execute("SHOW synchronous_commit").fetchone()[0] == "off"
    finally:
        _sql(pg, "ALTER ROLE CURRENT_USER RESET synchronous_commit")


def test_a_connection_lost_while_opening_is_tried_again_then_named(
        pg: PgStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server goes away under the open's schema check (its backend is terminated, as
    a killed server's are): the open tries once more on a new connection, and if that one
    is lost too, says the connection was lost (a StoreConnectionError, which `tcc` reports
    as one line), not a misuse."""
    from tcc.errors import StoreConnectionError
    from tcc.store._postgres import PgStore as Backend

    read_meta = Backend._read_meta
    kills = {"left": 1}

    def dying_read_meta(self: Backend, conn: object) -> dict[str, str]:
        if kills["left"]:
            kills["left"] -= 1
            conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")  # type: ignore[attr-defined]
        return read_meta(self, conn)

    monkeypatch.setattr(Backend, "_read_meta", dying_read_meta)
    with pg.open() as store:  # one lost connection: the second try opens it
        assert store.list_runs() == []
    assert kills["left"] == 0
    kills["left"] = 10**6
    with pytest.raises(StoreConnectionError,
                       match="lost the connection to the PostgreSQL store .* while opening it"):
        pg.open()
