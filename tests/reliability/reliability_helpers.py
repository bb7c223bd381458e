"""Shared helpers of the reliability suite: ledgers, clear-error checks, raw LMDB access.

The raw LMDB helpers open a store's environment directly, bypassing tcc, to
plant or copy bytes the way an attacker or a damaged disk would.  Only use
them while no tcc store for that path is open in this process (LMDB must not
open one environment twice in a process).
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import lmdb

from helpers import AGENTS, Cli
from tcc.store import open_store

WAIT = str(AGENTS / "wait_agent.py")
LEDGER_AGENT = str(AGENTS / "ledger_agent.py")
STORE_DBS = ("meta", "runs", "journal", "snaps", "chunks", "signals", "events", "pins")
# What `tcc run/resume --json` prints on stderr before the result: not an error line.
_PROGRESS = ("resuming ", "run ")


def ledger(path: pathlib.Path | str) -> list[tuple[str, str]]:
    """The (idempotency key, value) lines an agent appended to its ledger file."""
    p = pathlib.Path(path)
    if not p.exists():
        return []
    out = []
    for line in p.read_text().splitlines():
        key, _, value = line.partition(" ")
        out.append((key, value))
    return out


def outcome(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The JSON document a `--json` run/resume printed (its last stdout line)."""
    assert proc.returncode in (0, 1), (proc.returncode, proc.stdout, proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def error_lines(stderr: str) -> list[str]:
    """stderr without the "resuming ID" / "run ID" progress lines."""
    return [ln for ln in stderr.strip().splitlines() if ln.strip() and not ln.startswith(_PROGRESS)]


def is_clear_error(proc: subprocess.CompletedProcess[str], codes: tuple[int, ...] = (1, 2)) -> bool:
    """True if the command failed with exit code in ``codes`` and exactly one `tcc: error:` line."""
    lines = error_lines(proc.stderr)
    return (
        proc.returncode in codes
        and len(lines) == 1
        and lines[0].startswith("tcc: error:")
        and "Traceback" not in proc.stderr
    )


def assert_clear_error(proc: subprocess.CompletedProcess[str], *needles: str,
                       codes: tuple[int, ...] = (1, 2)) -> str:
    """Assert a one-line `tcc: error:` failure (mentioning ``needles``); return the line."""
    assert is_clear_error(proc, codes), (proc.returncode, proc.stdout, proc.stderr)
    line = error_lines(proc.stderr)[0]
    for needle in needles:
        assert needle in line, (needle, line)
    return line


@contextlib.contextmanager
def store_of(cli: Cli, tenant: str = "default") -> Iterator[Any]:
    """The CLI's store opened in this process (for reading journals, signals, snapshots)."""
    with open_store(cli.store, tenant=tenant, create=False) as store:
        yield store


def journal_len(cli: Cli, run_id: str, tenant: str = "default") -> int:
    with store_of(cli, tenant) as store:
        return len(store.journal(run_id))


def events(cli: Cli, run_id: str, kind: str | None = None) -> list[dict[str, Any]]:
    """The run's events (data plus ``kind``), read from the store (only those of ``kind`` if given).

    Read in-process rather than from `tcc show --json`, whose event objects let a
    data key named "kind" overwrite the event kind (see test_show_json_keeps_event_kinds).
    """
    with store_of(cli) as store:
        evs = store.events(run_id)
    return [{**dict(e.data), "kind": e.kind, "time": e.time} for e in evs
            if kind is None or e.kind == kind]


@contextlib.contextmanager
def raw_env(store_dir: pathlib.Path | str) -> Iterator[lmdb.Environment]:
    """The store's LMDB environment opened directly, bypassing tcc (no MAC, no checks)."""
    env = lmdb.open(str(store_dir), max_dbs=len(STORE_DBS) + 2, map_size=1 << 30, subdir=True)
    try:
        yield env
    finally:
        env.close()


def raw_items(store_dir: pathlib.Path | str, db: str, prefix: bytes = b"") -> dict[bytes, bytes]:
    """Every (key, value) of one database whose key starts with ``prefix``, as raw bytes."""
    with raw_env(store_dir) as env:
        dbi = env.open_db(db.encode(), create=False)
        with env.begin(db=dbi) as txn:
            return {bytes(k): bytes(v) for k, v in txn.cursor() if bytes(k).startswith(prefix)}


def raw_put(store_dir: pathlib.Path | str, db: str, items: dict[bytes, bytes]) -> None:
    """Write raw values under raw keys (overwriting), bypassing tcc."""
    with raw_env(store_dir) as env:
        dbi = env.open_db(db.encode(), create=False)
        with env.begin(write=True, db=dbi) as txn:
            for key, value in items.items():
                txn.put(key, value)


def wait_until(predicate: Any, what: str, timeout: float = 60.0, pause: float = 0.02) -> Any:
    """Poll ``predicate`` until it returns a true value; a deadline guards against hangs."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what} after {timeout} s")
        time.sleep(pause)
