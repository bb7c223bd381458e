"""Shared fixtures and helpers for the store tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tcc.store import LmdbStore, open_store
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
