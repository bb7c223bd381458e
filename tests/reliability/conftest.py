"""``TCC_TEST_ENCRYPT=1`` runs every test here on encrypted stores."""

import tempfile

import pytest

from tests._support.reliability import ENCRYPT_ALL, store_key_in_environment


@pytest.fixture(scope="session", autouse=True)
def _encrypt_every_store():
    """With TCC_TEST_ENCRYPT=1, a store key in the environment for the whole session (it
    is set before any module-scoped store is built, and `tcc` subprocesses inherit it)."""
    if not ENCRYPT_ALL:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="tcc-key-") as directory, \
            store_key_in_environment(directory) as key:
        yield key
