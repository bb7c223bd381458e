"""Explain a failed capture: which frame, which variable, which path.

Runs only after pickling has failed, so it may be slow.  It walks the object
graph the way the pickler does, probing each child on its own, and descends
into the first child that cannot be captured until it reaches an object
whose own parts are all fine: that object is the culprit.  The path is reset
at every generator frame on the way, so the message starts at the innermost
frame that holds the culprit:

    cannot capture agent.main() line 42 (agent.py:42): local 'client'
    -> _transport -> _pool: cannot pickle '_thread.RLock' object
"""

from __future__ import annotations

import io
import itertools
import types
from typing import Any, Callable, Iterator

from . import _frames, _pickler, _records

Child = tuple[str, Any]

_MAX_DEPTH = 100
_MAX_CHILDREN = 10_000


def _short(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a broken __repr__ must not hide the real error
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 40 else text[:37] + "..."


def _children(obj: Any) -> Iterator[Child]:
    if isinstance(obj, _frames.GENERATOR_TYPES):
        state, _offset, slots, exc, func = _frames.native().read_frame(obj, _records.NULL)
        if state in (_frames.CREATED, _frames.SUSPENDED):
            code = _frames.code_of(obj)
            for i, value in enumerate(slots):
                if value is _records.NULL:
                    continue
                label = _frames.describe_slot(code, i)
                if isinstance(value, types.CellType):
                    try:
                        value = value.cell_contents
                    except ValueError:
                        continue
                yield label, value
            if exc is not _records.NULL and exc is not None:
                yield "handled exception", exc
            yield "function", func
        return
    if isinstance(obj, types.CellType):
        try:
            yield "cell contents", obj.cell_contents
        except ValueError:
            pass
        return
    if isinstance(obj, types.FunctionType):
        for name, cell in zip(obj.__code__.co_freevars, obj.__closure__ or ()):
            try:
                yield f"closure {name!r}", cell.cell_contents
            except ValueError:
                pass
        if _pickler.home_module(obj) is None:  # else its globals are not captured
            for name in obj.__code__.co_names:
                if name in obj.__globals__:
                    yield f"global {name!r}", obj.__globals__[name]
        yield "defaults", obj.__defaults__
        yield "__dict__", obj.__dict__
        return
    if isinstance(obj, types.MethodType):
        yield "__self__", obj.__self__
        yield "__func__", obj.__func__
        return
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield f"[{_short(key)}]", value
            yield f"key {_short(key)}", key
        return
    if isinstance(obj, (list, tuple, set, frozenset)):
        for i, value in enumerate(obj):
            yield f"[{i}]", value
        return
    if isinstance(obj, BaseException):
        yield "args", obj.args
        yield "__dict__", obj.__dict__
        yield "__cause__", obj.__cause__
        yield "__context__", obj.__context__
        return
    if isinstance(obj, type):
        return
    try:
        rv = obj.__reduce_ex__(5)
    except Exception:  # noqa: BLE001 - the object itself is the culprit
        return
    if not isinstance(rv, tuple):
        return
    args = rv[1] if len(rv) > 1 else ()
    state = rv[2] if len(rv) > 2 else None
    if isinstance(state, tuple) and len(state) == 2:
        dict_state, slot_state = state
    else:
        dict_state, slot_state = state, None
    for part in (dict_state, slot_state):
        if isinstance(part, dict):
            for key, value in part.items():
                yield str(key), value
        elif part is not None:
            yield "state", part
    for i, value in enumerate(args or ()):
        yield f"arg {i}", value
    if len(rv) > 3 and rv[3] is not None:
        for i, value in enumerate(rv[3]):
            yield f"[{i}]", value
    if len(rv) > 4 and rv[4] is not None:
        for key, value in rv[4]:
            yield f"[{_short(key)}]", value


def _probe(obj: Any, make_pickler: Callable[[io.BytesIO], Any]) -> BaseException | None:
    try:
        make_pickler(io.BytesIO()).dump(obj)
    except RecursionError:
        return None  # too deep to judge on its own; do not descend blindly
    except Exception as exc:  # noqa: BLE001 - we are collecting the reason
        return exc
    return None


def explain(root: Any, original: BaseException, make_pickler: Callable[[io.BytesIO], Any]) -> str:
    """A one-line description of where ``root`` fails to capture, and why."""
    frame: str | None = None
    path: list[str] = []
    reason: BaseException = original
    obj = root
    seen = {id(root)}
    if isinstance(root, _frames.GENERATOR_TYPES):
        frame = _frames.where(root)
    for _ in range(_MAX_DEPTH):
        for label, child in itertools.islice(_children(obj), _MAX_CHILDREN):
            if id(child) in seen:
                continue
            failure = _probe(child, make_pickler)
            if failure is None:
                continue
            seen.add(id(child))
            reason = failure
            if isinstance(child, _frames.GENERATOR_TYPES):
                frame, path = _frames.where(child), []
            else:
                path.append(label)
            obj = child
            break
        else:
            break
    where = f"cannot capture {frame}" if frame else "cannot capture object"
    if path:
        where += ": " + " -> ".join(path)
    detail = str(reason) or type(reason).__name__
    return f"{where}: {detail}"
