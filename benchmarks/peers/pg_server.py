"""The PostgreSQL server every system of ``benchmarks.postgres`` shares, and the floor.

:class:`Server` wraps either a throw-away cluster (``tcc.testing.postgres.TemporaryServer``,
fsync on) or an existing server named by a ``postgresql://`` URL (``--dsn``).  It creates,
copies (``CREATE DATABASE ... TEMPLATE``) and drops the per-run databases, reads the
durability settings the numbers depend on, and measures the floor: a bare single-row
``INSERT`` + ``COMMIT`` with psycopg 3.
"""

from __future__ import annotations

import contextlib
import statistics
import time
import urllib.parse
from typing import Any, Iterator

SETTINGS = ("server_version", "fsync", "synchronous_commit", "full_page_writes", "wal_sync_method",
            "shared_buffers", "wal_level", "max_connections")


def url_with_database(url: str, database: str) -> str:
    """``url`` (a ``postgresql://`` URL) naming ``database`` instead of its own."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ValueError(f"not a postgresql:// URL: {url!r} (the store, DBOS and LangGraph all take URLs)")
    return urllib.parse.urlunsplit(parts._replace(path="/" + database))


def redact(url: str) -> str:
    """``url`` without its password, for reports."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(":" + parts.password + "@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


class Server:
    """Database-level operations on one PostgreSQL server, through its ``postgres`` database."""

    def __init__(self, url: str, *, origin: str) -> None:
        self.base_url = url
        self.origin = origin  # "temporary" or "dsn"
        self.created: list[str] = []

    def url(self, database: str) -> str:
        return url_with_database(self.base_url, database)

    def _admin(self) -> Any:
        import psycopg

        return psycopg.connect(self.url("postgres"), autocommit=True)

    def create(self, database: str, *, template: str | None = None) -> str:
        """Create ``database`` (dropping a leftover of that name first); return its URL.

        With ``template``, a copy of that database: its sessions must be gone, and a backend
        of a SIGKILLed client may take a moment to notice its peer is dead, so a busy
        template is retried for a few seconds."""
        import psycopg

        with self._admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
            sql = f'CREATE DATABASE "{database}"' + (f' TEMPLATE "{template}"' if template else "")
            deadline = time.monotonic() + 20.0
            while True:
                try:
                    conn.execute(sql)
                    break
                except psycopg.errors.ObjectInUse:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
        self.created.append(database)
        return self.url(database)

    def drop(self, *databases: str) -> None:
        with self._admin() as conn:
            for database in databases:
                conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
                if database in self.created:
                    self.created.remove(database)

    def drop_all(self) -> None:
        if self.created:
            with contextlib.suppress(Exception):
                self.drop(*list(self.created))

    def checkpoint(self) -> None:
        """``CHECKPOINT`` (write every dirty page now), so that a timed recovery does not share
        the disk with the write-back of the crash run or of a database copy.  Needs superuser
        (or pg_checkpoint); without it, nothing."""
        with contextlib.suppress(Exception), self._admin() as conn:
            conn.execute("CHECKPOINT")

    def settings(self) -> dict[str, str]:
        with self._admin() as conn:
            return {name: conn.execute(f"SHOW {name}").fetchone()[0] for name in SETTINGS}

    def bytes_of(self, database: str) -> dict[str, int]:
        """``tables``: heap + indexes + TOAST of every table outside the system schemas (what
        the system stored); ``database``: ``pg_database_size`` (with the catalogue, ~7.5 MB)."""
        import psycopg

        with psycopg.connect(self.url(database), autocommit=True) as conn:
            tables = conn.execute(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE c.relkind IN ('r', 'm', 'p')"
                " AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
                " AND n.nspname NOT LIKE 'pg_toast%'"
            ).fetchone()[0]
            whole = conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]
        return {"tables": int(tables), "database": int(whole)}


@contextlib.contextmanager
def server(dsn: str | None, log: Any) -> Iterator[Server]:
    """The server of the run: ``dsn`` if given, else a TemporaryServer with fsync on."""
    if dsn:
        srv = Server(dsn, origin="dsn")
        try:
            yield srv
        finally:
            srv.drop_all()
        return
    try:
        from tcc.testing.postgres import TemporaryServer
    except ImportError as exc:
        raise SystemExit(f"tcc.testing.postgres.TemporaryServer is not available ({exc}); "
                         "pass --dsn postgresql://USER@HOST:PORT/postgres") from exc
    t = time.perf_counter()
    with TemporaryServer(fsync=True) as temp:
        first = temp.create_database("bench_floor")
        log(f"temporary server up in {time.perf_counter() - t:.1f} s: {redact(url_with_database(first, ''))}")
        srv = Server(url_with_database(first, "postgres"), origin="temporary")
        srv.created.append("bench_floor")
        try:
            yield srv
        finally:
            srv.drop_all()


class Floor:
    """A bare single-row ``INSERT`` + ``COMMIT`` (psycopg 3, prepared after the 5th run, one
    transaction per row) into its own database: the commit floor every step is compared with."""

    def __init__(self, srv: Server, database: str = "bench_floor") -> None:
        import psycopg

        if database not in srv.created:
            srv.create(database)
        self.conn = psycopg.connect(srv.url(database))
        self.conn.execute("DROP TABLE IF EXISTS floor")
        self.conn.execute("CREATE TABLE floor (id bigserial PRIMARY KEY, v text NOT NULL)")
        self.conn.commit()
        self.samples: list[float] = []
        self.blocks: list[float] = []  # one median per block: a contention gauge over the run
        self.autocommit_samples: list[float] = []
        self.sample(50, keep=False)  # warm the connection and the prepared statement

    def sample(self, iterations: int, *, keep: bool = True) -> float:
        conn = self.conn
        times = []
        for _ in range(iterations):
            t = time.perf_counter()
            conn.execute("INSERT INTO floor (v) VALUES (%s)", ("step",))
            conn.commit()
            times.append(time.perf_counter() - t)
        if keep:
            self.samples.extend(times)
            self.blocks.append(statistics.median(times))
        return statistics.median(times)

    def sample_autocommit(self, iterations: int) -> float:
        """The same row as one autocommit statement (the implicit transaction saves BEGIN's
        round trip): a second reference, reported apart."""
        conn = self.conn
        conn.autocommit = True
        times = []
        try:
            for _ in range(iterations):
                t = time.perf_counter()
                conn.execute("INSERT INTO floor (v) VALUES (%s)", ("step",))
                times.append(time.perf_counter() - t)
        finally:
            conn.autocommit = False
        self.autocommit_samples.extend(times)
        return statistics.median(times)

    def close(self) -> None:
        self.conn.close()
