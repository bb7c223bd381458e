"""One store test, both backends (issue 19): where a store of each backend lives.

``BACKENDS`` names them; a :class:`Site` is where a store of one backend will be
(an LMDB directory, or an empty PostgreSQL database and its key file), and
``Site.open(**kwargs)`` is ``open_store`` there, creating the store on first use
on both backends.  tests/store/conftest.py builds ``site`` and ``any_store`` from it.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from tcc.store import Store, open_store

BACKENDS = ("lmdb", "postgres")


@dataclasses.dataclass(frozen=True)
class Site:
    """Where a store of one backend lives, before any store is there.

    ``where`` is what ``open_store`` takes (an LMDB directory or a PostgreSQL URL);
    ``key_file`` the PostgreSQL store's key (None for LMDB, which keeps its own
    secret).  :meth:`open` is ``open_store(where, **kwargs)`` with the key, so it
    creates the store on first use on both backends, like ``open_store(path)``.
    """

    backend: str
    where: str
    key_file: str | None = None

    def open(self, **kwargs: object) -> Store:
        """``open_store`` at this site (with its key file, if any)."""
        if self.key_file is not None:
            kwargs.setdefault("key_file", self.key_file)
        return open_store(self.where, **kwargs)  # type: ignore[arg-type]

    def argv(self) -> list[str]:
        """``[where, key_file or ""]``: how a child process (run_python) is told the site."""
        return [self.where, self.key_file or ""]


def lmdb_site(path: str | Path) -> Site:
    """An LMDB store's site: the directory ``path`` (created by the first open)."""
    return Site("lmdb", str(path))


def postgres_site(dsn: str, key_dir: Path) -> Site:
    """A PostgreSQL store's site: the empty database ``dsn`` and a new key file
    ``key_dir/pg.key`` (mode 0600); the first open creates tcc's schema in it."""
    key_dir.mkdir(parents=True, exist_ok=True)
    key_file = key_dir / "pg.key"
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(os.urandom(32).hex() + "\n")
    return Site("postgres", dsn, str(key_file))
