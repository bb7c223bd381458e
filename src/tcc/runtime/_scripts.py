"""Load agent scripts under a stable module name.

A script run by ``tcc run`` is not imported as ``__main__``: re-loading it on
resume must not re-run its ``if __name__ == "__main__":`` block, and its
functions must be pickled *by reference* (module + qualname, checked by a
code fingerprint) so that a snapshot names them the same way in every
process.  The module name is derived from the script's absolute path.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import threading
import types
from typing import Any

from .. import errors


def module_name(path: str) -> str:
    """``__tcc_script_<stem>``: stable when the checkout moves or is re-cloned.

    The code fingerprint, not the path, decides whether a snapshot still fits.
    """
    stem = re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
    return f"__tcc_script_{stem}"


def split_entry(entry: str) -> tuple[str, str]:
    """``path/to/agent.py:func`` -> (absolute path, func); func defaults to main."""
    path, sep, func = entry.rpartition(":")
    if not sep or not func.isidentifier() or not path:
        path, func = entry, "main"
    return os.path.abspath(path), func


_LOAD_LOCK = threading.RLock()


def load_script(path: str) -> types.ModuleType:
    """Import the script at ``path`` (once per process) under its stable name."""
    with _LOAD_LOCK:  # a second thread must not see a half-initialised module
        return _load_script(os.path.abspath(path))


def _load_script(path: str) -> types.ModuleType:
    name = module_name(path)
    module = sys.modules.get(name)
    if module is not None:
        if os.path.abspath(getattr(module, "__file__", "") or "") != path:
            raise errors.UsageError(
                f"cannot load {path}: another script with the same name ({module.__file__}) "
                "is already loaded in this process"
            )
        return module
    if os.path.isdir(path):
        raise errors.UsageError(f"script {path} is a directory; name a Python file")
    if not os.path.isfile(path):
        raise errors.UsageError(f"script {path} does not exist")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise errors.UsageError(f"cannot load {path} as a Python script")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    folder = os.path.dirname(path)
    if folder not in sys.path:
        sys.path.insert(0, folder)  # let the script import its neighbours
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise errors.ScriptImportError(
            f"script {path} failed to import: {type(exc).__name__}: {exc}"
        ) from exc
    except SystemExit as exc:  # said in one line, not a silent exit with the script's code
        del sys.modules[name]
        raise errors.ScriptImportError(
            f"script {path} called sys.exit({exc.code!r}) while it was imported; tcc imports "
            "the script to find its entry function, so keep module-level code free of exits"
        ) from exc
    except BaseException:
        del sys.modules[name]
        raise
    return module


def resolve(entry: str) -> Any:
    """The entry function named by ``path:func``."""
    path, func_name = split_entry(entry)
    module = load_script(path)
    func = getattr(module, func_name, None)
    if func is None or not callable(func):
        raise errors.UsageError(f"{path} has no function {func_name!r}")
    return func
