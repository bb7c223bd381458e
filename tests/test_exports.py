"""Every public module says exactly what it exports (trio's test_exports.py is the model).

For each package a user or another tcc package may import from: ``__all__`` names each
public name once, every name in it exists, nothing public is left out of it, a star
import gives exactly ``__all__``, and every exported function and class is documented.
"""

from __future__ import annotations

import importlib
import inspect
import types

import pytest

PUBLIC_MODULES = ["tcc", "tcc.capture", "tcc.effects", "tcc.store", "tcc.runtime", "tcc.errors",
                  "tcc.testing"]
SUBPACKAGES = {"capture", "cli", "effects", "errors", "runtime", "store", "testing"}


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_all_is_complete_and_exact(name: str) -> None:
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert len(exported) == len(set(exported)), f"{name}.__all__ repeats a name"
    missing = [n for n in exported if not hasattr(module, n)]
    assert missing == [], f"{name}.__all__ names what it lacks: {missing}"
    public = {n for n, v in vars(module).items()
              if not n.startswith("_") and not isinstance(v, types.ModuleType)
              and n not in SUBPACKAGES and n != "annotations"}
    assert public - set(exported) == set(), f"{name} has public names not in __all__"
    namespace: dict[str, object] = {}
    exec(f"from {name} import *", namespace)  # noqa: S102 - the star import is the subject
    assert set(namespace) - {"__builtins__"} == set(exported)


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_every_exported_function_and_class_is_documented(name: str) -> None:
    module = importlib.import_module(name)
    undocumented = [n for n in module.__all__
                    if (inspect.isfunction(getattr(module, n)) or inspect.isclass(getattr(module, n)))
                    and not inspect.getdoc(getattr(module, n))]
    assert undocumented == []


def test_start_and_resume_are_the_library_entry_points() -> None:
    """``tcc.start``/``tcc.resume`` are the runtime's run/resume behind a store argument."""
    import tcc

    start = inspect.signature(tcc.start)
    assert list(start.parameters)[:2] == ["func", "args"]
    assert {"run_id", "store", "tenant", "strategy"} <= set(start.parameters)
    assert {"store", "tenant", "strategy", "steal"} <= set(inspect.signature(tcc.resume).parameters)
