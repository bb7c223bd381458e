"""The public surface of the tcc package."""

from __future__ import annotations

import subprocess
import sys

import tcc
import tcc.errors


def test_every_public_symbol_is_exported_exactly_once():
    """__all__ lists each public name once, and each exists."""
    assert len(tcc.__all__) == len(set(tcc.__all__))
    for name in tcc.__all__:
        assert hasattr(tcc, name), name
    public = {n for n in dir(tcc) if not n.startswith("_") and n not in {"capture", "errors", "cli", "store", "effects", "runtime", "testing"}}
    assert public <= set(tcc.__all__), public - set(tcc.__all__)


def test_error_tree_is_rooted_at_tcc_error_with_matching_builtins():
    """Every tcc exception derives from TccError and a fitting builtin."""
    for name in tcc.errors.__all__:
        cls = getattr(tcc.errors, name)
        assert issubclass(cls, tcc.TccError), name
        assert cls.__doc__, name
    assert issubclass(tcc.RestoreError, ValueError)
    assert issubclass(tcc.errors.RunNotFoundError, LookupError)
    assert issubclass(tcc.errors.StoreNotFoundError, FileNotFoundError)


def test_version_from_console_script_and_module():
    """`python -m tcc --version` prints the package version."""
    out = subprocess.run(
        [sys.executable, "-m", "tcc", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == f"tcc {tcc.__version__}"


def test_native_module_is_built_when_required():
    """With TCC_REQUIRE_NATIVE set (as in CI) the C extension must be importable."""
    import os

    if os.environ.get("TCC_REQUIRE_NATIVE", "") in ("", "0"):
        import pytest

        pytest.skip("TCC_REQUIRE_NATIVE is not set")
    from tcc import _native

    assert _native.BUILT_FOR.split(".")[:2] == [str(v) for v in sys.version_info[:2]]
