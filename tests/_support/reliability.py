"""Shared helpers of the reliability suite: ledgers, clear-error checks, raw LMDB access.

The raw LMDB helpers open a store's environment directly, bypassing tcc, to
plant or copy bytes the way an attacker or a damaged disk would.  Only use
them while no tcc store for that path is open in this process (LMDB must not
open one environment twice in a process).
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import lmdb

from tcc.store import open_store
from tests._support.runs import AGENTS, Cli

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
    """The CLI's store opened in this process (for reading journals, signals, snapshots),
    with the CLI's key file if it has one (a PostgreSQL store)."""
    with open_store(cli.store, tenant=tenant, create=False, key_file=cli.key_file) as store:
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


# ------------------------------------------------------------------ encrypted stores
#
# The campaigns run on encrypted stores too (issue 25, finding 4): each has a
# small encrypted variant in CI, and ``TCC_TEST_ENCRYPT=1`` runs the whole of
# this directory with a store key in the environment (conftest.py), so every
# store the tests and their `tcc` subprocesses create is encrypted, e.g.
# ``TCC_TEST_ENCRYPT=1 pytest -m slow tests/reliability/test_crash_campaign.py``.
# (Tests that plant raw records assume plain stores: use the switch for the
# campaigns.)

KEY_VARS = ("TCC_STORE_KEY_FILE", "TCC_STORE_KEY")
ENCRYPT_ALL = os.environ.get("TCC_TEST_ENCRYPT", "") not in ("", "0")


def write_key_file(directory: pathlib.Path | str) -> pathlib.Path:
    """A new store key (64 hex digits) in ``directory``/store.key, mode 0600."""
    path = pathlib.Path(directory) / "store.key"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(os.urandom(32).hex() + "\n")
    return path


@contextlib.contextmanager
def store_key_in_environment(directory: pathlib.Path | str) -> Iterator[pathlib.Path]:
    """Within the block, TCC_STORE_KEY_FILE names a new key file: stores opened or created
    here, and by `tcc` subprocesses started here (they inherit os.environ), are encrypted."""
    saved = {k: os.environ.get(k) for k in KEY_VARS}
    key = write_key_file(directory)
    os.environ.pop("TCC_STORE_KEY", None)
    os.environ["TCC_STORE_KEY_FILE"] = str(key)
    try:
        yield key
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def is_encrypted_store(store_dir: pathlib.Path | str) -> bool:
    """Whether the store's format header (read raw) says it is encrypted."""
    with raw_env(store_dir) as env:
        dbi = env.open_db(b"meta", create=False)
        with env.begin(db=dbi) as txn:
            raw = txn.get(b"format")
    return raw is not None and json.loads(bytes(raw)).get("version") == "4-encrypted"
