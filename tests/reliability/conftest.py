"""Make tests/runtime's helper module (Cli, AGENTS) importable by plain name;
``TCC_TEST_ENCRYPT=1`` runs every test here on encrypted stores."""

import pathlib
import sys
import tempfile

import pytest

RUNTIME = str(pathlib.Path(__file__).resolve().parent.parent / "runtime")
if RUNTIME not in sys.path:
    sys.path.insert(0, RUNTIME)

from reliability_helpers import ENCRYPT_ALL, store_key_in_environment  # noqa: E402


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
