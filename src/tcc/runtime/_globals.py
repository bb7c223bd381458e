"""Module-level data of the agent's own modules, as part of a run's state.

A snapshot holds the agent's frames, but a frame reads its module's globals
from the live module, and a resumed process has a freshly imported one: a
history, counter or cache kept at module level would quietly restart from
its import-time value.  So each snapshot also records the module-level data
of

- the agent script's module, and
- the modules whose file sits in the script's own directory (not in a
  sub-folder, and never under ``site-packages``),

and a restore writes those values back over the fresh import before the
frames continue.  Globals and frames are pickled together, so an object that
both a global and a local refer to is still one object after the restore.

What a snapshot does **not** record, because the import rebuilds it:

- dunder names (``__name__``, ``__file__`` ...) and imported modules;
- functions, classes, effects and ``tcc.resource`` objects, while they are
  still the object the import bound (rebound to another one, they are
  recorded like data);
- objects that cannot be captured (a client, a lock, an open file) while
  they are still the object bound when tcc first saw the module in this
  process, normally at import.  Such an object is rebuilt by the import; what
  the run changed inside it is not kept.

A global rebound during the run to a value that cannot be captured fails the
checkpoint with :class:`~tcc.errors.CaptureError` naming the global.
"""

from __future__ import annotations

import functools
import os
import sys
import types
import weakref
from collections.abc import Callable
from typing import Any

from .. import errors
from ..capture import PINNED_PREFIX, dump_payload
from ..effects import Effect, Resource

_CODE_TYPES = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, type,
               types.ModuleType, Effect, Resource, staticmethod, classmethod)


_MISSING: Any = object()


def _is_code(value: Any) -> bool:
    return isinstance(value, _CODE_TYPES)


@functools.lru_cache(maxsize=1024)
def _real_dir(folder: str) -> str:
    """``os.path.realpath(folder)``, once per folder: a process with a few hundred modules
    loaded (psycopg, say) has them in a few dozen folders, and resolving every module's
    path anew took ~11 ms of each recovery."""
    return os.path.realpath(folder)


@functools.lru_cache(maxsize=4096)
def _real_path(file: str) -> str:
    """``os.path.realpath(file)``, once per file, resolving its folder from a cache (the
    file itself may be a symbolic link)."""
    if not os.path.isabs(file) or os.path.islink(file):  # (a relative path depends on the cwd)
        return os.path.realpath(file)
    return os.path.join(_real_dir(os.path.dirname(file)), os.path.basename(file))


@functools.lru_cache(maxsize=1024)
def _dir_id(folder: str) -> tuple[int, int] | None:
    """(device, inode) of ``folder``, once per folder: two folders whose ids differ have
    different real paths, so most modules are told apart from the agent's folder by one
    ``stat`` of their folder instead of a ``realpath`` (an ``lstat`` per path component)."""
    try:
        st = os.stat(folder)
    except OSError:
        return None
    return st.st_dev, st.st_ino


# id(module) -> (a weak reference to the module, {(agent folder, the module's __file__ and
# __name__ then): whether the module is in that folder}): shared by every ModuleState of the process, so that a recovery in a
# long-lived process (a worker, a harness) judges only the modules imported since the last
# one instead of all of them again (~3 ms with ~230 modules loaded, most of it an ``lstat``
# per module).  The weak reference tells a module from a later one that reuses its id (a
# module imported again is another object, judged again) and keeps nothing alive; the rare
# module object that takes no weak reference is held instead.  A verdict is keyed by the
# module's ``__file__`` and ``__name__`` too, which decide it: a module that changes either is
# judged again.  Both maps are bounded (cleared when full): a process that loads agents from
# many folders, or whose modules change their files, judges again rather than grows.
_VERDICTS: dict[int, tuple[Callable[[], Any], dict[tuple[str, Any, Any], bool]]] = {}
_VERDICTS_LIMIT = 1 << 14
_FOLDERS_LIMIT = 16  # verdicts kept per module


def _same(value: Any) -> Any:
    return value


def _dunder(name: str) -> bool:
    """``__x__``: a module's own bookkeeping (``__file__``, ``__name__``), never its data."""
    return name.startswith("__") and name.endswith("__")


def _in_site_packages(path: str) -> bool:
    parts = path.split(os.sep)
    return "site-packages" in parts or "dist-packages" in parts


class ModuleState:
    """The agent's modules and what their import bound, for one process."""

    def __init__(self, script_module: types.ModuleType, *,
                 resolve: Callable[[str], types.ModuleType | None] | None = None,
                 pinned: bool = False) -> None:
        self.script = script_module
        # whether the run runs on pinned code in this process: else a pinned module loaded
        # here (an upgrade's first leg ran on it) is none of its modules
        self.pinned = pinned
        # the module a snapshot's module name stands for (pinned code), None: sys.modules
        self.resolve = resolve
        file = getattr(script_module, "__file__", None) or ""
        self.folder = os.path.dirname(os.path.realpath(file)) if file else ""
        self._folder_id = _dir_id(self.folder) if self.folder else None
        # module name -> {global name: the object bound when tcc first saw the module,
        # for the globals a snapshot leaves to the import (see the module docstring)}
        self._from_import: dict[str, dict[str, Any]] = {}
        # module name -> its globals when tcc first saw it (to tell a mutated import-time
        # object from one the run bound later)
        self._first: dict[str, dict[str, Any]] = {}
        self._seen_modules = 0
        self._modules: list[types.ModuleType] = []
        self.refresh()

    def agent_modules(self) -> list[types.ModuleType]:
        """The agent's own modules (the script's, and those beside it) found so far."""
        return list(self._modules)

    # ----------------------------------------------------------- which modules

    def _belongs(self, module: types.ModuleType) -> bool:
        if module is self.script:
            return True
        entry = _VERDICTS.get(id(module))
        if entry is None or entry[0]() is not module:
            try:
                ref: Callable[[], Any] = weakref.ref(module)
            except TypeError:  # a module object that takes no weak reference (a cffi ``lib``):
                ref = functools.partial(_same, module)  # held, as sys.modules holds it
            entry = (ref, {})
            if len(_VERDICTS) >= _VERDICTS_LIMIT:
                _VERDICTS.clear()
            _VERDICTS[id(module)] = entry
        known = entry[1]
        file, name = getattr(module, "__file__", None), getattr(module, "__name__", None)
        key = (self.folder, file if isinstance(file, str) else None, name if isinstance(name, str) else None)
        verdict = known.get(key)
        if verdict is None:
            if len(known) >= _FOLDERS_LIMIT:
                known.clear()
            verdict = known[key] = self._judge(module)
        return verdict

    def _judge(self, module: types.ModuleType) -> bool:
        """Whether ``module`` (not the script's own) is a module of the agent's folder.  The
        answer depends only on the folder and the module's ``__file__`` and name, which
        ``_VERDICTS`` caches per module object (a re-imported module is another object, judged
        again) and per value of those three."""
        if module is self.script:
            return True
        file = getattr(module, "__file__", None)
        if not self.folder or not isinstance(file, str) or not file.endswith(".py"):
            return False
        if os.path.isabs(file) and self._folder_id is not None \
                and _dir_id(os.path.dirname(file)) != self._folder_id and not os.path.islink(file):
            return False  # another folder (and not a link to a file of this one)
        real = _real_path(file)
        name = getattr(module, "__name__", "")
        return os.path.dirname(real) == self.folder and not _in_site_packages(real) \
            and name != "tcc" and not name.startswith("tcc.")

    def refresh(self) -> None:
        """Find the agent's modules again if modules were imported since the last look."""
        if len(sys.modules) == self._seen_modules:
            return
        self._seen_modules = len(sys.modules)
        found = [m for m in list(sys.modules.values())
                 if isinstance(m, types.ModuleType) and self._belongs(m)
                 and (self.pinned or m is self.script
                      or not str(getattr(m, "__name__", "")).startswith(PINNED_PREFIX))]
        for module in found:
            if module.__name__ not in self._from_import:
                self._from_import[module.__name__] = self._import_bound(module)
                self._first[module.__name__] = dict(vars(module))
        self._modules = found

    def _borrowed(self, name: str, value: Any) -> bool:
        """``value`` is another (non-agent) module's object bound here by ``from M import
        name`` (``os.environ``, a library's registry): its state belongs to that module,
        which keeps it (and it may hold secrets)."""
        if value is os.environ:
            return True
        for where in (getattr(type(value), "__module__", None), getattr(value, "__module__", None)):
            module = sys.modules.get(where) if isinstance(where, str) else None
            if module is not None and not self._belongs(module) \
                    and getattr(module, name, _MISSING) is value:
                return True
        return False

    def _import_bound(self, module: types.ModuleType) -> dict[str, Any]:
        """The globals of ``module`` that its import rebuilds: code, other modules' objects
        imported by name, and what cannot be captured (each value is tried once, here)."""
        keep: dict[str, Any] = {}
        for name, value in list(vars(module).items()):
            if _dunder(name):
                continue
            if _is_code(value) or self._borrowed(name, value):
                keep[name] = value
                continue
            try:
                dump_payload(value)
            except errors.CaptureError:
                keep[name] = value
            except Exception:  # noqa: BLE001 - a value whose pickling itself breaks
                keep[name] = value
        return keep

    def left_to_import(self) -> list[str]:
        """``NAME (type) of file.py`` for each module-level object that cannot be captured
        and is left to the import: what a run changes inside it does not survive a crash."""
        out = []
        for modname, bound in self._from_import.items():
            for name, value in bound.items():
                if not _is_code(value) and not self._borrowed(name, value):
                    kind = f"{type(value).__module__}.{type(value).__qualname__}"
                    out.append(f"{name} ({kind}) of {self._where(modname)}")
        return out

    # ------------------------------------------------------------ capture

    def capture(self) -> dict[str, dict[str, Any]]:
        """``{module name: {global: value}}``: the module-level data a snapshot records."""
        self.refresh()
        state: dict[str, dict[str, Any]] = {}
        for module in self._modules:
            rebuilt = self._from_import.get(module.__name__, {})
            data: dict[str, Any] = {}
            for name, value in list(vars(module).items()):
                if _dunder(name):
                    continue
                if name in rebuilt and rebuilt[name] is value:
                    continue
                if isinstance(value, types.ModuleType):
                    continue
                data[name] = value
            state[module.__name__] = data
        return state

    def release_mutated(self, state: dict[str, dict[str, Any]]) -> list[str]:
        """Leave to the import the globals of ``state`` that cannot be captured now but are
        still the object bound when tcc first saw the module (a module-level cache that
        the run filled with clients): like an uncapturable object made at import, it is
        rebuilt by the import after a crash.  Returns ``NAME (type) of file.py`` for each."""
        released = []
        for modname, data in state.items():
            first = self._first.get(modname, {})
            for name, value in data.items():
                if name not in first or first[name] is not value:
                    continue
                try:
                    dump_payload(value)
                except errors.CaptureError:
                    self._from_import.setdefault(modname, {})[name] = value
                    kind = f"{type(value).__module__}.{type(value).__qualname__}"
                    released.append(f"{name} ({kind}) of {self._where(modname)}")
        return released

    def culprit(self, state: dict[str, dict[str, Any]]) -> str | None:
        """Why ``state`` cannot be captured, naming the global, or None if every global can
        be captured on its own (the frames are to blame)."""
        for modname, data in state.items():
            for name, value in data.items():
                try:
                    dump_payload(value)
                except errors.CaptureError as exc:
                    where = self._where(modname)
                    return (f"module-level {name!r} of {where} cannot be captured ({exc}); "
                            "module-level data is part of the run's state, so keep only "
                            "capturable values there, or build the object at import and do "
                            "not rebind it (it is then rebuilt by the import), or keep it in a "
                            "tcc.resource(...)")
        return None

    def _where(self, modname: str) -> str:
        module = sys.modules.get(modname)
        file = getattr(module, "__file__", None)
        return os.path.basename(file) if isinstance(file, str) else modname

    # ------------------------------------------------------------ restore

    def restore(self, state: Any) -> None:
        """Write a snapshot's module-level data back over the live modules."""
        if not isinstance(state, dict):
            raise errors.CorruptSnapshotError("the snapshot's module state is not a mapping")
        for modname, data in state.items():
            module = self.resolve(modname) if self.resolve is not None else None
            if module is None:
                module = sys.modules.get(modname)
            if module is None:
                try:
                    module = __import__(modname)
                    module = sys.modules[modname]
                except Exception as exc:  # noqa: BLE001 - said as a restore error
                    raise errors.RestoreError(
                        f"the snapshot holds module-level data of module {modname!r}, which "
                        f"cannot be imported now: {type(exc).__name__}: {exc}") from exc
            if not isinstance(data, dict):
                raise errors.CorruptSnapshotError(
                    f"the snapshot's module state of {modname!r} is not a mapping")
            if any(type(k) is not str or _dunder(k) for k in data):
                # (a snapshot's data never holds ``__x__`` names: capture skips them; data
                # that does could change a module's ``__file__`` or
                # ``__name__``, which decide whether it is the agent's: look at every
                # module again.  A private ``__x`` global is data like any other.)
                self._seen_modules = 0
            vars(module).update(data)
        # Modules imported since the first look (restoring the frames imports the modules
        # their objects name) are found by the count; the rest were judged already.
        self.refresh()
