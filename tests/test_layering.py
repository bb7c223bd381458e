"""The package layering, read from the source: capture -> effects -> store -> runtime -> cli.

- A module may import a private (``_x``) name only from its own package: everything a
  package offers the others goes through its ``__init__``.
- Each set of values (run statuses, durability modes, strategies, journal marker names)
  is spelled out in one module, its owner; everyone else imports it from there.
- Lower layers never import higher ones.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

SRC = pathlib.Path(__file__).resolve().parent.parent / "src" / "tcc"
LAYERS = ["capture", "effects", "store", "runtime", "cli"]  # each may import only those before it
TOP_LEVEL_PRIVATE_OK = {"_native", "_version", "_proc", "_pieces"}  # tcc-wide modules with no package


def _modules() -> list[tuple[str, pathlib.Path, ast.Module]]:
    out = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).with_suffix("")
        name = ".".join(rel.parts)
        if name.endswith(".__init__"):
            name = name[: -len(".__init__")]
        out.append((name, path, ast.parse(path.read_text(encoding="utf-8"), str(path))))
    return out


def _package_of(module: str, is_package: bool) -> str:
    """``tcc.store._env`` -> ``store``; ``tcc.testing`` (a package) -> ``testing``; ``tcc``
    and its top-level modules (``tcc._start``, ``tcc.errors``) -> ``""``."""
    parts = module.split(".")
    if len(parts) == 2 and not is_package:
        return ""
    return parts[1] if len(parts) > 1 else ""


def _imports(module: str, path: pathlib.Path, tree: ast.Module) -> list[tuple[int, str]]:
    """Every ``tcc...`` name the module imports, fully qualified, with its line."""
    is_package = path.name == "__init__.py"
    base = module.split(".") if is_package else module.split(".")[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parent = base[: len(base) - (node.level - 1)]
                target = ".".join(parent + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "tcc" or target.startswith("tcc."):
                found.append((node.lineno, target))
                found.extend((node.lineno, f"{target}.{alias.name}") for alias in node.names)
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, a.name) for a in node.names if a.name.startswith("tcc."))
    return found


def _private_crossings() -> list[str]:
    bad = []
    for module, path, tree in _modules():
        own = _package_of(module, path.name == "__init__.py")
        for line, name in _imports(module, path, tree):
            parts = name.split(".")
            target_pkg = parts[1] if len(parts) > 1 else ""
            if target_pkg == own or target_pkg in TOP_LEVEL_PRIVATE_OK:
                continue
            if own == "" and target_pkg.startswith("_"):
                continue  # tcc's own top-level private module (tcc._start), from tcc itself
            private = [p for p in parts[1:] if p.startswith("_") and not p.startswith("__")]
            if private:
                bad.append(f"{path.relative_to(SRC.parent)}:{line}: imports {name}")
    return bad


def test_no_module_imports_another_packages_private_name():
    assert _private_crossings() == []


def test_the_checker_sees_a_private_import():
    """The rule above can fail: a planted cross-package private import is reported."""
    planted = SRC / "cli" / "_planted_for_test.py"
    planted.write_text("from ..runtime._runs import start\nfrom ..store import _codec\n")
    try:
        bad = [b for b in _private_crossings() if "_planted_for_test" in b]
    finally:
        planted.unlink()
    assert [b.split(": ", 1)[1] for b in bad] == [
        "imports tcc.runtime._runs", "imports tcc.runtime._runs.start", "imports tcc.store._codec"]


def test_lower_layers_do_not_import_higher_ones():
    bad = []
    for module, path, tree in _modules():
        own = _package_of(module, path.name == "__init__.py")
        if own not in LAYERS:
            continue
        allowed = set(LAYERS[: LAYERS.index(own) + 1])
        for line, name in _imports(module, path, tree):
            parts = name.split(".")
            target = parts[1] if len(parts) > 1 else ""
            if target in LAYERS and target not in allowed:
                bad.append(f"{path.relative_to(SRC.parent)}:{line}: {own} imports {name}")
    assert bad == []


# Each value set, and the one module allowed to spell it out.
VALUE_SETS = {
    "run statuses": ({"importing", "queued", "running", "waiting", "sleeping", "completed", "unverified", "failed",
                      "cancelled"}, "tcc.store._api"),
    "durability modes": ({"sync", "group", "none"}, "tcc.store._api"),
    "strategies": ({"continuation", "replay", "hybrid"}, "tcc.runtime._runs"),
}
MARKER_NAMES = ({"tcc:wait", "tcc:sleep", "tcc:spawn"}, "tcc.runtime._markers")


def _literal_sets(tree: ast.Module) -> list[tuple[int, set[str]]]:
    """String members of every tuple/list/set literal (``x in ("a", "b")`` included)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and node.elts and all(
                isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
            out.append((node.lineno, {e.value for e in node.elts}))  # type: ignore[attr-defined]
    return out


def test_each_value_set_is_spelled_out_in_one_module():
    bad = []
    for module, path, tree in _modules():
        for line, members in _literal_sets(tree):
            for what, (values, owner) in VALUE_SETS.items():
                if len(members & values) >= 2 and members <= values | {""} and module != owner:
                    bad.append(f"{path.relative_to(SRC.parent)}:{line}: {what} {sorted(members)} "
                               f"(owner: {owner})")
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in MARKER_NAMES[0] \
                    and module != MARKER_NAMES[1]:
                bad.append(f"{path.relative_to(SRC.parent)}:{node.lineno}: marker {node.value!r} "
                           f"(owner: {MARKER_NAMES[1]})")
    assert bad == []


@pytest.mark.parametrize("module", ["tcc.capture", "tcc.effects", "tcc.store", "tcc.runtime"])
def test_package_docstrings_say_what_the_package_knows(module):
    import importlib

    assert importlib.import_module(module).__doc__
