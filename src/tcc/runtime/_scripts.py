"""Entries: where a run's function lives, and loading it again in any process.

A run's entry is stored as a string in one of two forms:

- ``/abs/path/agent.py:main`` -- a *script* (``tcc run agent.py``).  It is not
  imported as ``__main__``: re-loading it on resume must not re-run its
  ``if __name__ == "__main__":`` block, and its functions must be pickled *by
  reference* (module + qualname, checked by a code fingerprint) so that a
  snapshot names them the same way in every process.  The module name is
  ``__tcc_script_<stem>`` (:data:`SCRIPT_PREFIX`).
- ``package.module:main`` -- a function of an *importable module*
  (``tcc.start(agent.main, ...)``), imported by name wherever the run resumes.

A stored script entry is always an absolute path, so an entry whose path part
is a dotted name is a module entry.
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


SCRIPT_PREFIX = "__tcc_script_"  # the module name of a script is this + its file's stem

_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


def module_name(path: str) -> str:
    """``__tcc_script_<stem>``: stable when the checkout moves or is re-cloned.

    The code fingerprint, not the path, decides whether a snapshot still fits.
    """
    stem = re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
    return f"{SCRIPT_PREFIX}{stem}"


# A script's module name, with or without the hash of its path that older snapshots name.
_SCRIPT_MODULE = re.compile(rf"^{re.escape(SCRIPT_PREFIX)}(.+?)(?:_[0-9a-f]{{8}})?$")


def script_display_name(module: str | None) -> str:
    """How a module is named to a person: a script's module (``__tcc_script_agent``, or
    ``__tcc_script_agent_1a2b3c4d``) by its stem ``agent``; any other as it is ("" for none)."""
    if not module:
        return ""
    m = _SCRIPT_MODULE.match(module)
    return m.group(1) if m else module


def is_module_entry(entry: str) -> bool:
    """Whether a *stored* entry names an importable module (``pkg.mod:func``) rather
    than a script (``/abs/path.py:func``)."""
    path, sep, func = entry.rpartition(":")
    return bool(sep) and func.isidentifier() and not os.path.isabs(path) \
        and _DOTTED.fullmatch(path) is not None and not path.endswith(".py")


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
        head, sep, tail = path.rpartition(":")
        if sep and os.path.isfile(head) and all(part.isidentifier() for part in tail.split(".")):
            raise errors.UsageError(
                f"{head}: the entry {tail!r} names an attribute of an attribute; give a "
                "module-level function of the script (`script.py:main`), and have it call the "
                "method (`return await Agent().main()`)")
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


def entry_module(entry: str) -> types.ModuleType:
    """The module that holds a stored entry's function: the script loaded by path, or the
    module imported by name."""
    if is_module_entry(entry):
        name = entry.rpartition(":")[0]
        try:
            try:
                return importlib.import_module(name)
            except ImportError:
                if "" in sys.path or os.getcwd() in sys.path:
                    raise
                sys.path.insert(0, os.getcwd())  # as `python -m`: modules of this directory
                return importlib.import_module(name)
        except ImportError as exc:
            raise errors.ScriptImportError(
                f"module {name} of the run's entry {entry} cannot be imported here: "
                f"{type(exc).__name__}: {exc} (a run started from a module's function resumes "
                "where that module is importable)") from exc
    return load_script(split_entry(entry)[0])


def sibling_entry(entry: str, func: str) -> str:
    """The entry of function ``func`` next to ``entry``'s (``tcc.spawn`` of a child)."""
    if is_module_entry(entry):
        return f"{entry.rpartition(':')[0]}:{func}"
    return f"{split_entry(entry)[0]}:{func}"


def entry_of(func: Any) -> str:
    """The stored entry for a function object (``tcc.start(agent.main, ...)``).

    A function of the ``__main__`` script becomes a script entry (resumed by ``tcc resume``
    like ``tcc run``'s); any other must be reachable by its module and qualified name,
    since a resumed run imports it that way.
    """
    module = getattr(func, "__module__", None)
    qualname = getattr(func, "__qualname__", None)
    if not callable(func) or not isinstance(module, str) or not isinstance(qualname, str):
        raise errors.UsageError(f"{func!r} is not a function tcc can start a run of")
    if "<locals>" in qualname or "." in qualname:
        raise errors.UsageError(
            f"{module}.{qualname} is not a module-level function: a run's entry must be "
            "importable by its name, so define it at the top level of a module")
    if module == "__main__":
        path = getattr(sys.modules.get("__main__"), "__file__", None)
        if not path:
            raise errors.UsageError(
                f"{qualname} is defined in an interactive __main__ that has no file: put it in "
                "a module or a script, so that the run can be resumed in another process")
        return f"{os.path.abspath(path)}:{qualname}"
    entry = f"{module}:{qualname}"
    if not is_module_entry(entry) or module.startswith(SCRIPT_PREFIX):
        if module.startswith(SCRIPT_PREFIX):
            path = getattr(sys.modules.get(module), "__file__", None)
            if path:
                return f"{os.path.abspath(path)}:{qualname}"
        raise errors.UsageError(f"{module}.{qualname} cannot be named as a run's entry")
    if getattr(entry_module(entry), qualname, None) is not func:
        raise errors.UsageError(
            f"{module}.{qualname} is not the object that importing {module} gives under that "
            "name (a decorated or replaced function?): a run's entry must be importable by name")
    return entry


def describe_entry(entry: str) -> str:
    """How errors name an entry's home: the script path, or ``module pkg.mod``."""
    if is_module_entry(entry):
        return f"module {entry.rpartition(':')[0]}"
    return split_entry(entry)[0]


def resolve(entry: str) -> Any:
    """The entry function named by a stored entry (``path:func`` or ``module:func``)."""
    func_name = entry.rpartition(":")[2] if is_module_entry(entry) else split_entry(entry)[1]
    module = entry_module(entry)
    func = getattr(module, func_name, None)
    if func is None or not callable(func):
        raise errors.UsageError(f"{describe_entry(entry)} has no function {func_name!r}")
    if isinstance(func, type):
        raise errors.UsageError(
            f"{describe_entry(entry)}: {func_name!r} is a class, not a function; give a "
            "module-level function that makes and runs it")
    return func
