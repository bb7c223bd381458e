"""The reducers users register (:func:`register_reducer`), kept apart from the pickler.

The pickler (``_pickler``) subclasses cloudpickle's, and importing cloudpickle costs
~14 ms (it brings ``dis``, ``platform``, ``logging``...).  A process that only reads runs
(``tcc ls``/``show``) or restores a snapshot (``tcc resume``, before its first
checkpoint) needs neither, yet an agent script registers its reducers at import.  So
the registry lives here, and the pickler is imported when something is first pickled.
"""

from __future__ import annotations

from typing import Any, Callable

Reduce = tuple[Any, ...]

REGISTRY: dict[type, Callable[[Any], Reduce]] = {}

# The pickler's per-type decision cache (type -> handler, or None for "let pickle
# decide"): a registration can change a decision, so it is emptied here.
KIND_CACHE: dict[type, Any] = {}


def register_reducer(cls: type, reducer: Callable[[Any], Reduce]) -> None:
    """Teach tcc how to capture instances of ``cls`` (and its subclasses).

    ``reducer(obj)`` returns a ``__reduce__``-style tuple, e.g.
    ``(threading.Lock, ())`` to rebuild a lock as a new, unlocked lock.  Use it
    for objects tcc refuses by default (files, sockets, clients holding them)
    when you know how to rebuild them on restore.
    """
    if not isinstance(cls, type):
        raise TypeError(f"register_reducer() needs a class, not {cls!r}")
    if not callable(reducer):  # found at the next capture otherwise, far from the mistake
        raise TypeError(f"register_reducer({cls.__qualname__}, ...) needs a function taking the "
                        f"object and returning a __reduce__ tuple, not {reducer!r}")
    REGISTRY[cls] = reducer
    KIND_CACHE.clear()
