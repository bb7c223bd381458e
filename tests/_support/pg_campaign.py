"""Helpers of the PostgreSQL crash tests (tests/reliability/test_postgres_crashes.py).

* :class:`PgCli` -- the ``tcc`` command line pointed at a PostgreSQL store (``TCC_STORE``
  is its URL, ``TCC_STORE_KEY_FILE`` its key file); it has the ``cmd``/``env``/``store``
  the crash campaign's ``Attempt`` uses.  ``store`` is a folder that is never created (the
  campaign's LMDB-only checks, compaction copies, find nothing there).
* :func:`read_pg_store` -- every run of a store, in the shape the campaign's checks read.
* :func:`journal_problems` -- what the journal rows themselves say, read with SQL past
  tcc: per run, seqs ``0..n-1`` with no gap and ``n`` the run row's ``journal_len``;
  every completion answers an earlier intent of its run, and no intent twice; and per
  call key (decoded through the store) at most one completion, and exactly one for a
  completed run.
* :func:`accepts_connections` -- whether a server answers ``SELECT 1`` now.
"""

from __future__ import annotations

import collections
import json
import os
import pathlib
import subprocess
import sys
from typing import Any

from tests._support.pgstores import PgStore

TCC = [sys.executable, "-m", "tcc"]


class PgCli:
    """``tcc`` commands against one PostgreSQL store (plus the agent's environment)."""

    def __init__(self, folder: pathlib.Path, pg: PgStore, **env: str) -> None:
        self.pg = pg
        self.store = folder / "no-lmdb-store"  # never created
        base = {k: v for k, v in os.environ.items() if k not in ("TCC_STORE_KEY", "TCC_STORE")}
        self.env = dict(base, **pg.env(), **env)

    def cmd(self, *args: str) -> list[str]:
        return [*TCC, *args]

    def run(self, *args: str, timeout: float = 120, check: bool = False,
            **env: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(self.cmd(*args), env=dict(self.env, **env), capture_output=True,
                              text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"tcc {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc


def read_pg_store(pg: PgStore) -> dict[str, dict[str, Any]]:
    """Every run: status, result value, completed calls (key, outcome) and in-doubt re-issues."""
    from tcc.runtime._journal import logged_calls

    out: dict[str, dict[str, Any]] = {}
    with pg.open(create=False) as store:
        for info in store.list_runs():
            run = store.get_run(info.run_id)
            calls = logged_calls(store.journal(run.run_id))
            kinds = collections.Counter(e.kind for e in store.events(run.run_id))
            out[run.run_id] = {
                "status": run.status,
                "result": json.loads(run.result or b"{}").get("value"),
                "calls": [(c.key, c.outcome) for c in calls],
                "in_doubt": kinds["in_doubt_reissued"] + kinds["in_doubt_verified"],
            }
    return out


def journal_problems(pg: PgStore) -> tuple[list[str], dict[str, int]]:
    """Problems with the journal rows of every run (see the module docstring), and counts:
    ``runs``, ``records``, ``intents``, ``completions``, ``reissued`` (intents beyond the
    first of a call key: re-issues of calls in doubt)."""
    import psycopg

    problems: list[str] = []
    counts: collections.Counter[str] = collections.Counter()
    with psycopg.connect(pg.url, autocommit=True, application_name="tcc-test-check") as conn:
        lengths = dict(conn.execute("SELECT run_id, journal_len FROM tcc.runs").fetchall())
        rows: dict[str, list[tuple[int, str, int | None]]] = collections.defaultdict(list)
        for run_id, seq, kind, intent in conn.execute(
                "SELECT run_id, seq, kind, intent_seq FROM tcc.journal ORDER BY run_id, seq"):
            rows[run_id].append((seq, kind, intent))
    for run_id in sorted(set(rows) - set(lengths)):
        problems.append(f"journal rows of run {run_id!r}, which has no run row")
    with pg.open(create=False) as store:
        for run_id, length in sorted(lengths.items()):
            counts["runs"] += 1
            got = rows.get(run_id, [])
            counts["records"] += len(got)
            seqs = [seq for seq, _, _ in got]
            if seqs != list(range(length)):
                problems.append(f"run {run_id}: journal seqs {_gaps(seqs)} but journal_len {length}")
            kinds = {seq: kind for seq, kind, _ in got}
            answered: set[int] = set()
            for seq, kind, intent in got:
                counts[kind + "s"] += 1
                if kind != "completion":
                    continue
                if intent is None or kinds.get(intent) != "intent" or intent >= seq:
                    problems.append(f"run {run_id}: completion {seq} answers {intent}, not an earlier intent")
                elif intent in answered:
                    problems.append(f"run {run_id}: intent {intent} has a second completion ({seq})")
                answered.add(intent)
            keys: dict[int, str] = {}
            completions: collections.Counter[str] = collections.Counter()
            intents: collections.Counter[str] = collections.Counter()
            for rec in store.journal(run_id):
                if rec.kind == "intent":
                    keys[rec.seq] = rec.idempotency_key or f"seq:{rec.seq}"
                    intents[keys[rec.seq]] += 1
                elif rec.intent_seq in keys:
                    completions[keys[rec.intent_seq]] += 1
            counts["reissued"] += sum(n - 1 for n in intents.values())
            for key, n in completions.items():
                if n > 1:
                    problems.append(f"run {run_id}: call {key} was completed {n} times")
            if store.get_run(run_id).status == "completed":
                for key in intents:
                    if not completions[key]:
                        problems.append(f"run {run_id} is completed but call {key} has no completion")
    return problems, dict(counts)


def _gaps(seqs: list[int]) -> str:
    if not seqs:
        return "none"
    missing = sorted(set(range(max(seqs) + 1)) - set(seqs))
    return f"0..{max(seqs)} ({len(seqs)} rows, missing {missing[:5]})"


def accepts_connections(dsn: str, timeout: float = 5.0) -> bool:
    """Whether the server at ``dsn`` answers ``SELECT 1`` within ``timeout`` seconds."""
    import psycopg

    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=max(1, int(timeout))) as conn:
            return conn.execute("SELECT 1").fetchone() == (1,)
    except psycopg.Error:
        return False
