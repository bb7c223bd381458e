"""PostgreSQL stores for tests: a database made into a tcc store, with its key file.

``pg_dsn`` (tests/conftest.py) gives a fresh database per test; :func:`make_pg_store`
runs ``init_store`` on it (schema + a new key file) and returns what a test or a
subprocess needs to open it: the URL and the key file, and the environment
(``TCC_STORE``, ``TCC_STORE_KEY_FILE``) that points ``tcc`` commands at it.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from tcc.store import Store, init_store, open_store


@dataclasses.dataclass(frozen=True)
class PgStore:
    """A PostgreSQL tcc store made for one test."""

    url: str
    key_file: str

    def open(self, **kwargs: object) -> Store:
        """The store, opened with its key file."""
        return open_store(self.url, key_file=self.key_file, **kwargs)  # type: ignore[arg-type]

    def env(self) -> dict[str, str]:
        """Environment variables that point `tcc` commands at this store."""
        return {"TCC_STORE": self.url, "TCC_STORE_KEY_FILE": self.key_file}


def make_pg_store(dsn: str, where: Path, name: str = "store.key") -> PgStore:
    """Make the database at ``dsn`` a tcc store; its key file is created at ``where/name``."""
    where.mkdir(parents=True, exist_ok=True)
    key_file = str(where / name)
    store, made = init_store(dsn, key_file=key_file)
    store.close()
    assert made and (os.stat(key_file).st_mode & 0o777) == 0o600
    return PgStore(dsn, key_file)
