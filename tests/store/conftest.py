"""Shared fixtures and helpers for the store tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tcc.store import LmdbStore, open_store


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
