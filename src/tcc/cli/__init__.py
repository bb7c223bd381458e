"""The ``tcc`` command line."""

from ._main import main as main

__all__ = ["main"]
