"""The fleet side of the PostgreSQL store: finding due runs, claiming them, and waking up.

Workers on many hosts share one database.  What makes a run due is written on its row
(schema version 3, ``_pgschema``):

* a run that is not running is due once ``wake <= now()`` and no lease on it runs: a
  submission sets ``wake`` to its time, a sleep to its end, a signal and a finished
  ``tcc.spawn`` child to their time;
* a running run is due once its lease expires (its owner stopped renewing it), or at
  once if its owner ran on this host and its pid is gone.

:func:`claim_due` reads candidates with ``FOR UPDATE SKIP LOCKED`` (two workers never
look at one row at once), lets the worker check each (``check``: the exact rule, which
reads the run's events), and claims what it takes in the same transaction: epoch + 1,
owner this worker, a ``taken_over`` event.  The worker then hands the run over to a ``tcc
resume`` of its own (``claim_run(expect_epoch=...)``).  A candidate that is not due after
all gets its ``wake`` corrected under the row's lock, so a signal committing meanwhile
(it updates the same row) is never lost.

Work-creating writes ``NOTIFY tcc_work`` (payload: the tenant); :class:`Listener` is a
worker's ``LISTEN`` connection.  Notifications are lost while it is disconnected, so the
worker's poll stays the correctness path; :func:`next_due` tells it how long it may sleep.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

from .._proc import pid_alive
from ..errors import StoreCorruptError
from ._api import HOST, LIVE_STATUSES, PARKED_STATUSES, RunInfo
from ._pgschema import WORK_CHANNEL

if TYPE_CHECKING:
    from ._postgres import PgStore

__all__ = ["Listener", "claim_due", "next_due"]

#: What a worker's check says of a candidate: ("claim", reason), ("later", time or None:
#: not due; when it is, if known), or ("skip", None): due, but not taken by this worker now.
Verdict = tuple[str, Any]

def _sql_set(values: tuple[str, ...]) -> str:
    return "(" + ", ".join(f"'{v}'" for v in values) + ")"


#: The statuses whose rows a worker finds by ``wake``: every live one but ``running``.
_PARKED = _sql_set(tuple(s for s in LIVE_STATUSES if s != "running"))
_LIVE = _sql_set(LIVE_STATUSES)


def claim_due(store: PgStore, limit: int, *, lease: float, check: Callable[[RunInfo], Verdict],
              exclude: Collection[str] = (), damaged: list[tuple[str, str]] | None = None,
              watch: list[int] | None = None) -> list[tuple[RunInfo, str]]:
    """Claim up to ``limit`` due runs for this worker (epoch + 1 each), in one transaction;
    returns each claimed run (at its new epoch) with the reason ``check`` gave.  A due run
    whose record fails verification is not claimed but appended to ``damaged`` as ``(run
    id, message)`` (pass it in ``exclude`` from then on).  ``watch`` gets the pids of the
    live processes of this host that own runs (the worker wakes when one exits)."""
    if limit < 1:
        return []
    cols = store._RUN_COLS
    tenant = store.tenant

    def op(conn: Any) -> list[tuple[RunInfo, str]]:
        rows = conn.execute(
            f"SELECT {cols} FROM tcc.runs WHERE tenant = %s AND NOT (run_id = ANY(%s)) AND ("
            "(status = 'running' AND lease_expiry <= now()) OR "
            f"(status IN {_PARKED} AND wake <= now() AND lease_expiry <= now())) "
            "ORDER BY coalesce(wake, lease_expiry), run_id LIMIT %s FOR UPDATE SKIP LOCKED",
            (tenant, list(exclude), limit + 8)).fetchall()
        # runs this host owned whose process is gone: taken over before their lease ends
        mine = conn.execute(
            "SELECT run_id, owner_pid FROM tcc.runs WHERE tenant = %s AND owner_host = %s AND "
            f"status IN {_LIVE} AND lease_expiry > now() AND NOT (run_id = ANY(%s))",
            (tenant, HOST, list(exclude))).fetchall()
        dead = [(rid, pid) for rid, pid in mine if not pid_alive(pid) and pid != os.getpid()]
        if watch is not None:
            watch.extend(sorted({pid for _, pid in mine if pid != os.getpid()} - {p for _, p in dead}))
        if dead:
            rows += conn.execute(
                f"SELECT {cols} FROM tcc.runs WHERE tenant = %s AND owner_host = %s AND "
                "(run_id, owner_pid) IN (SELECT * FROM unnest(%s::text[], %s::int[])) "
                "ORDER BY run_id FOR UPDATE SKIP LOCKED",
                (tenant, HOST, [r for r, _ in dead], [p for _, p in dead])).fetchall()
        out: list[tuple[RunInfo, str]] = []
        for row in rows:
            if len(out) >= limit:
                break
            try:
                run = store._info(tuple(row))
            except StoreCorruptError as exc:  # needs a person; the others are served
                if damaged is not None:
                    damaged.append((row[0], str(exc)))
                continue
            try:
                what, detail = check(run)
            except StoreCorruptError as exc:  # its trail, a child's record: needs a person
                if damaged is not None:
                    damaged.append((run.run_id, str(exc)))
                continue
            if what == "claim":
                out.append((claim(conn, store, run, lease, str(detail)), str(detail)))
            elif what == "later" and run.status in PARKED_STATUSES:
                when = None if detail is None else float(detail) + store._skew
                conn.execute("UPDATE tcc.runs SET wake = to_timestamp(%s) WHERE tenant = %s AND "
                             "run_id = %s", (when, tenant, run.run_id))
        return out

    return store._tx(op, "claiming due runs")


def claim(conn: Any, store: PgStore, run: RunInfo, lease: float, reason: str) -> RunInfo:
    """Take ``run`` (its row locked by this transaction) for this worker: epoch + 1."""
    rec = store._event_record(run.run_id.encode(), "taken_over", {
        "epoch": run.epoch, "owner": f"{run.owner_host}:{run.owner_pid}",
        "new_epoch": run.epoch + 1, "by": "worker", "reason": reason})
    row = conn.execute(
        "WITH u AS (UPDATE tcc.runs SET epoch = epoch + 1, owner_host = %s, owner_pid = %s, "
        "lease_expiry = now() + make_interval(secs => %s), updated = now() WHERE tenant = %s "
        "AND run_id = %s AND epoch = %s RETURNING *), e AS (INSERT INTO tcc.events (tenant, "
        f"run_id, record) SELECT tenant, run_id, %s FROM u) SELECT {store._RUN_COLS} FROM u",
        (HOST, os.getpid(), float(lease), store.tenant, run.run_id, run.epoch, rec)).fetchone()
    return store._info(tuple(row))


def next_due(store: PgStore) -> float | None:
    """Seconds until the next run becomes due by time (a sleep ends, a lease runs out, a
    claimed run's lease runs out), <= 0 if one is due now, None if none ever will by time."""
    def op(conn: Any) -> float | None:
        row = conn.execute(
            "SELECT extract(epoch FROM least("
            f"(SELECT min(greatest(wake, lease_expiry)) FROM tcc.runs WHERE tenant = %s AND "
            f"status IN {_PARKED} AND wake IS NOT NULL), "
            "(SELECT min(lease_expiry) FROM tcc.runs WHERE tenant = %s AND status = 'running')"
            ") - now())::float8", (store.tenant, store.tenant)).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    return store._read(op)


def _wait_fds(fds: Collection[int], timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for one of ``fds`` to become readable."""
    timeout = max(0.0, timeout)
    if not fds:
        time.sleep(timeout)
        return False
    try:
        return bool(select.select(list(fds), [], [], timeout)[0])
    except (OSError, ValueError):  # a closed descriptor: the caller's next poll sorts it out
        time.sleep(timeout)
        return False


class Listener:
    """A worker's ``LISTEN tcc_work`` connection (its own, outside the pool)."""

    def __init__(self, store: PgStore) -> None:
        self.store = store
        self.conn: Any = None

    def _connect(self) -> Any:
        import psycopg

        conn = psycopg.connect(self.store.url, autocommit=True, connect_timeout=10,
                               application_name="tcc-listen")
        conn.execute(f"LISTEN {WORK_CHANNEL}")
        return conn

    def start(self) -> bool:
        """Listen from now on (notifications before this are not seen); False if the server
        cannot be reached (the poll covers for it; the next :meth:`wait` tries again)."""
        if self.conn is None:
            try:
                self.conn = self._connect()
            except Exception:  # noqa: BLE001 - unreachable now: polled meanwhile
                self.conn = None
                return False
        return True

    def wait(self, timeout: float, fds: Collection[int] = ()) -> bool:
        """Wait up to ``timeout`` seconds for a notification of this store's tenant, or for
        one of ``fds`` to become readable (a pidfd: that process exited); True if either
        came.  Never raises: a lost connection waits on ``fds`` alone instead."""
        deadline = time.monotonic() + max(0.0, timeout)
        if not self.start():
            return _wait_fds(fds, timeout)
        try:
            while True:
                for note in self.conn.notifies(timeout=0, stop_after=64):
                    if note.payload == self.store.tenant:
                        return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                conn_fd = self.conn.fileno()
                ready, _, _ = select.select([conn_fd, *fds], [], [], left)
                if not ready:
                    return False
                if any(fd != conn_fd for fd in ready):
                    return True
        except Exception:  # noqa: BLE001 - the connection broke: reconnect next time
            self.close()
            return _wait_fds(fds, deadline - time.monotonic())

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:  # noqa: BLE001
                pass
            self.conn = None
