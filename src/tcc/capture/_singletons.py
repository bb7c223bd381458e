"""Objects with no state of their own that a module binds at module level: sentinels.

``MISSING = object()``, ``dataclasses.MISSING``, ``openai.NOT_GIVEN``: code tests them
with ``is``.  Pickled by value, a sentinel held in a local, an argument or a module's
data comes back as a new object, and ``value is MISSING`` turns false after a crash while
it was true before it.  Such an object has nothing to lose by being named instead, so
it is pickled as "attribute NAME of module M" (:func:`tcc.capture._records.module_attribute`)
and loads as the object the import binds there.

Which module binds which sentinel is found by reading module namespaces, once per module,
and only when the pickler first meets a stateless object that might be one (most dumps
never do).  ``__main__`` is left out: another process's ``__main__`` is another script.
"""

from __future__ import annotations

import sys
import threading
import types
from typing import Any

__all__ = ["home", "stateless_type"]

_lock = threading.Lock()
# id(object) -> (object, module name, attribute name): every stateless module-level object
# of the modules read so far (held: an id is only looked up while its object lives)
_HOMES: dict[int, tuple[Any, str, str]] = {}
_READ: dict[str, int] = {}  # name -> id of each module object read
# (len(sys.modules), its newest name, that module's id) when they were last looked over: an
# import adds a name at the end, so a new module changes it, even after a removal
_seen: tuple[int, str, int] = (0, "", 0)


def _modules_mark() -> tuple[int, str, int]:
    modules = sys.modules
    try:
        last = next(reversed(modules))
    except StopIteration:
        return (0, "", 0)
    return (len(modules), last, id(modules.get(last)))


def stateless_type(t: type) -> bool:
    """Whether instances of ``t`` can be stateless sentinels: ``object`` itself, or a class
    written in Python (every class in its MRO has an instance ``__dict__`` or ``__slots__``:
    no C type, whose instances keep state ``__getstate__`` does not show) and pickled the
    default way (no ``__reduce__``, ``__reduce_ex__``, ``__getstate__`` or
    ``__getnewargs__`` of its own)."""
    if t is object:
        return True
    if t.__module__ == "builtins" or issubclass(t, (type, types.ModuleType, BaseException)):
        return False
    for base in t.__mro__[:-1]:  # Python classes only: a C type keeps state out of sight (a lock)
        if "__slots__" not in base.__dict__ and base.__dictoffset__ == 0:
            return False
    return (t.__reduce_ex__ is object.__reduce_ex__ and t.__reduce__ is object.__reduce__
            and t.__getstate__ is object.__getstate__
            and not hasattr(t, "__getnewargs__") and not hasattr(t, "__getnewargs_ex__"))


def stateless(obj: Any) -> bool:
    """Whether ``obj`` (of a :func:`stateless_type`) holds no state: no instance
    attributes (but dunders: openai sets ``NOT_GIVEN.__module__``), no slot set."""
    state = obj.__getstate__()
    return state is None or (type(state) is dict and all(
        type(k) is str and k.startswith("__") and k.endswith("__") for k in state))


def home(obj: Any) -> tuple[str, str] | None:
    """``(module name, attribute name)`` of a module that binds ``obj`` at module level
    (the module first read that does), or None."""
    key = id(obj)
    found = _HOMES.get(key)
    if found is None and _modules_mark() != _seen:
        _read_new_modules()
        found = _HOMES.get(key)
    if found is None or found[0] is not obj:
        return None
    _obj, module_name, name = found
    module = sys.modules.get(module_name)
    if module is None or getattr(module, name, None) is not obj:  # rebound since it was read
        with _lock:
            _HOMES.pop(key, None)
        return None
    return module_name, name


def _read_new_modules() -> None:
    global _seen
    with _lock:
        _seen = _modules_mark()
        for module_name, module in list(sys.modules.items()):
            if _READ.get(module_name) == id(module) or module_name == "__main__" \
                    or type(module) is not types.ModuleType or getattr(module, "__name__", None) != module_name:
                continue
            _READ[module_name] = id(module)
            try:
                namespace = list(vars(module).items())
            except TypeError:
                continue
            for name, value in namespace:
                if type(name) is not str or name.startswith("__"):
                    continue
                t = type(value)
                if not (t is object or (_classish(t) and stateless_type(t))):
                    continue
                try:
                    if not stateless(value):
                        continue
                except Exception:  # noqa: BLE001 - a __getstate__ that fails: not a sentinel
                    continue
                _HOMES.setdefault(id(value), (value, module_name, name))


def _classish(t: type) -> bool:
    """A class whose instances are plain objects (not functions, classes, modules...)."""
    return isinstance(t, type) and t.__module__ != "builtins"
