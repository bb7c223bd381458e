"""Shared fixtures and helpers for the store tests.

``store_path`` and ``store`` are LMDB stores (most store tests are about LMDB
files).  Tests of the :class:`~tcc.store.Store` protocol's behaviour ask for
``site`` or ``any_store`` instead: those are parametrised over ``backend``
(``lmdb`` and ``postgres``), so one test runs against both backends (issue 19).
The ``postgres`` half needs a PostgreSQL server (``pg_dsn``, tests/conftest.py)
and is skipped where there is none (unless ``TCC_REQUIRE_POSTGRES`` is set).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tcc.store import LmdbStore, Store, open_store
from tests._support.backends import BACKENDS, Site, lmdb_site, postgres_site
from tests._support.users import Users, public_dir, scratch_base, users_or_skip


@pytest.fixture
def store_path(tmp_path: Path) -> str:
    """A path where no store exists yet."""
    return str(tmp_path / "store")


@pytest.fixture
def store(store_path: str) -> Iterator[LmdbStore]:
    """A fresh store (sync durability) closed after the test."""
    s = open_store(store_path)
    try:
        yield s
    finally:
        s.close()


# One suite, both backends (issue 19).


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """``lmdb`` or ``postgres``: a test that asks for it (or for ``site``/``any_store``)
    runs once per backend."""
    return str(request.param)


@pytest.fixture
def site(backend: str, store_path: str, tmp_path: Path, request: pytest.FixtureRequest) -> Site:
    """Where no store exists yet, on ``backend``: ``store_path`` for LMDB; for PostgreSQL a
    fresh, empty database (``pg_dsn``) and a new key file, so that the first
    :meth:`Site.open` creates the schema, as the first ``open_store`` creates an LMDB store."""
    if backend == "lmdb":
        return lmdb_site(store_path)
    return postgres_site(request.getfixturevalue("pg_dsn"), tmp_path)


@pytest.fixture
def any_store(site: Site) -> Iterator[Store]:
    """A fresh store (sync durability) on ``backend``, closed after the test."""
    s = site.open()
    try:
        yield s
    finally:
        s.close()


# Two real users, for the store-trust tests (see tests/_support/users.py).


@pytest.fixture
def base() -> Iterator[Path]:
    """A scratch directory (0755) that user B can reach, removed afterwards."""
    with scratch_base() as path:
        yield path


@pytest.fixture
def users(base: Path) -> Users:
    """Users A and B, or a loud skip where this process cannot be two users."""
    return users_or_skip(base)


@pytest.fixture
def pub(base: Path) -> Path:
    """A directory every user may write (0777, no sticky bit), inside ``base``."""
    return public_dir(base)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "lmdb_only: a store test about LMDB itself (its files, format, environment), "
        "not the Store protocol, so it runs on the LMDB backend only (its docstring says why)")
