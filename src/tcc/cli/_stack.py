"""The frozen call stack of a snapshot, as ``tcc inspect`` shows it.

:func:`describe` turns the root of a run state (the root coroutine) into a
list of :class:`FrameInfo`, outermost first, following the await chain
through the value stacks, with lines mapped from the stored instruction
offsets (decoded from the stored line table, :func:`tcc.capture.code_line`)
and locals rendered by :func:`~tcc.cli._safe_repr.safe_repr`.  Code of
functions captured *by reference* is found by compiling the current source
file (compiling executes nothing) and is compared with the stored
fingerprint.  Source lines are read only from module files found by import
rules and from the files the caller says belong to the run: a snapshot names
its code's file, and must not make inspect print another one.

The views come from :func:`tcc.capture.safe_loads`; live generators (from
:func:`tcc.capture.loads`, for ``--unsafe-repr``) are accepted too, read with
the native ``read_frame`` (:func:`tcc.capture.frame_view`) and rendered with
real reprs.
"""

from __future__ import annotations

import dataclasses
import datetime
import linecache
import os
import sys
import tokenize
import types
from typing import Any, Callable, Iterator

from ..capture import UNBOUND, AnyCode, CellView, FrameView, code_line, fingerprint, frame_view, stub_name
from ..effects import EffectRequest
from ..runtime import script_display_name
from ._safe_repr import safe_repr

# ------------------------------------------------------------ finding code

Locator = Callable[[str], "str | None"]


def find_module_file(module: str, extra_paths: tuple[str, ...] = ()) -> str | None:
    """The source file of ``module`` without importing it (or anything else)."""
    mod = sys.modules.get(module)
    if mod is not None:
        path = vars(mod).get("__file__")
        if isinstance(path, str) and path.endswith(".py") and os.path.isfile(path):
            return path
    parts = module.split(".")
    if not all(p.isidentifier() for p in parts):
        return None
    for base in (*extra_paths, *sys.path):
        base = base or os.getcwd()
        for candidate in (
            os.path.join(base, *parts) + ".py",
            os.path.join(base, *parts, "__init__.py"),
        ):
            if os.path.isfile(candidate):
                return candidate
    return None


_COMPILED: dict[tuple[str, float, int], types.CodeType | str] = {}


def compile_file(path: str) -> types.CodeType | str:
    """The module code of ``path`` as import would compile it, or an error text."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror}"
    key = (path, st.st_mtime, st.st_size)
    cached = _COMPILED.get(key)
    if cached is not None:
        return cached
    try:
        with tokenize.open(path) as fh:
            source = fh.read()
        result: types.CodeType | str = compile(source, path, "exec", dont_inherit=True)
    except (OSError, SyntaxError, ValueError) as exc:
        result = f"the current {os.path.basename(path)} does not compile: {exc}"
    _COMPILED[key] = result
    return result


def _walk_code(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _walk_code(const)


def find_code(module_code: types.CodeType, qualname: str, want: bytes | None) -> types.CodeType | None:
    """The code object of ``qualname`` in a module (the fingerprint match if several).

    The wrapper made by a decorator with ``functools.wraps`` is named by the
    decorated function's qualname but runs the decorator's nested code
    (``traced.<locals>.wrapper``): when no code of that qualname matches, a
    nested code of the module with the stored fingerprint is that wrapper's.
    """
    codes = list(_walk_code(module_code))
    found = [c for c in codes if c.co_qualname == qualname]
    if want is not None:
        for c in found:
            if fingerprint(c) == want:
                return c
        for c in codes:
            if "<locals>" in c.co_qualname and fingerprint(c) == want:
                return c
    return found[-1] if found else None


# ------------------------------------------------------------- description


@dataclasses.dataclass
class Local:
    name: str
    kind: str  # "arg", "local", "cell", "free", "stack"
    value: str
    unbound: bool = False


@dataclasses.dataclass
class FrameInfo:
    """One frame of the frozen call stack, ready to render."""

    function: str
    qualname: str
    module: str | None
    file: str | None
    line: int | None
    source: str | None
    columns: tuple[int, int] | None
    status: str  # "suspended", "not started", "finished"
    by_reference: bool
    fingerprint: str | None
    code_changed: bool | None
    notes: list[str]
    locals: list[Local]
    stack: list[str]
    handling: str | None = None
    resumes_after: str | None = None  # "await", "yield from", "yield"
    awaits: str | None = None  # qualname of the frame it awaits (the next one)


@dataclasses.dataclass
class Awaiting:
    kind: str  # "effect", "wait", "approval", "sleep", "checkpoint", "gather", "object"
    text: str
    detail: dict[str, Any]


def _is_internal(frame: FrameView) -> bool:
    module = frame.module or ""
    return module == "tcc" or module.startswith("tcc.")


# The module tcc's requests (what an effect call awaits) are pickled under.
_REQUEST_MODULE = EffectRequest.__module__


def _request_fields(obj: Any) -> tuple[str, dict[str, Any]] | None:
    """(class name, fields) of a tcc request, stub or live."""
    name = stub_name(obj)
    if name is not None:
        if not name.startswith(_REQUEST_MODULE + "."):
            return None
        cls = name.rpartition(".")[2]
        fields = dict(obj._tcc_attrs())
        args = obj._tcc_args
        if cls == "EffectRequest" and len(args) == 3:
            fields.update(name=args[0], args=args[1], kwargs=args[2])
        elif cls == "GatherRequest" and len(args) == 1:
            fields.update(requests=args[0])
        return cls, fields
    t = type(obj)
    if t.__module__ == _REQUEST_MODULE and t.__name__.endswith("Request"):
        fields = {k: getattr(obj, k, None) for k in getattr(t, "__slots__", ())}
        return t.__name__, fields
    return None


def _effect_call(fields: dict[str, Any], r: Callable[[Any], str]) -> str:
    got = fields.get("name", "?")
    name = (got if isinstance(got, str) else r(got)).rpartition(":")[2]
    args = got_args if isinstance(got_args := fields.get("args"), tuple) else ()
    kwargs = got_kwargs if isinstance(got_kwargs := fields.get("kwargs"), dict) else {}
    parts = [r(a) for a in args] + [f"{k}={r(v)}" for k, v in kwargs.items()]
    return f"{name}({', '.join(parts)})"


def _plain(value: Any) -> bool:
    """Whether ``value`` may go into the JSON document as it is (a huge int would not print)."""
    if type(value) is int:
        return value.bit_length() <= 64
    return isinstance(value, (str, float, bool, type(None)))


def _when(value: Any) -> str | None:
    """A timestamp as local time, or None if ``value`` is not one."""
    if type(value) not in (int, float):
        return None
    try:
        return datetime.datetime.fromtimestamp(value).isoformat(sep=" ", timespec="seconds")
    except (OverflowError, OSError, ValueError):
        return None


def describe_request(obj: Any, *, unsafe: bool = False) -> Awaiting | None:
    def r(value: Any) -> str:
        return safe_repr(value, 40, unsafe=unsafe)

    info = _request_fields(obj)
    if info is None:
        if obj is None:
            return None
        return Awaiting("object", f"awaiting {safe_repr(obj, unsafe=unsafe)}", {})
    cls, f = info
    if cls == "EffectRequest":
        call = _effect_call(f, r)
        return Awaiting("effect", f"awaiting effect {call}", {"effect": f.get("name"), "call": call})
    if cls == "GatherRequest":
        reqs = got_reqs if isinstance(got_reqs := f.get("requests"), tuple) else ()
        calls = []
        for req in reqs:
            sub = _request_fields(req)
            calls.append(_effect_call(sub[1], r) if sub else r(req))
        return Awaiting("gather", f"awaiting tcc.gather of {len(calls)} effects: {', '.join(calls)}",
                        {"calls": calls})
    if cls == "CheckpointRequest":
        return Awaiting("checkpoint", "at an explicit tcc.checkpoint()", {})
    if cls == "WaitRequest":
        detail = {k: f.get(k) for k in ("name", "kind", "prompt", "wait_id", "timeout", "deadline")}
        detail = {k: v if _plain(v) else r(v) for k, v in detail.items()}
        if f.get("kind") == "approval":
            text = f"waiting for approval {r(f.get('prompt'))}"
        else:
            text = f"waiting for signal {r(f.get('name'))}"
        wait_id = f.get("wait_id")
        if wait_id:
            text += f" (id {wait_id if isinstance(wait_id, str) else r(wait_id)})"
        when = _when(f.get("deadline"))
        if when is not None:
            text += f", times out at {when}"
        return Awaiting("approval" if f.get("kind") == "approval" else "wait", text, detail)
    if cls == "SleepRequest":
        until = f.get("until")
        when = _when(until)
        if when is not None:
            return Awaiting("sleep", f"sleeping until {when}", {"until": until})
        return Awaiting("sleep", "sleeping", {})
    return Awaiting("object", f"awaiting {safe_repr(obj, unsafe=unsafe)}", {})


def _source_line(path: str | None, line: int | None) -> str | None:
    if not path or not line:
        return None
    linecache.checkcache(path)
    text = linecache.getline(path, line)
    return text.rstrip("\n") if text else None


def _slot_names(code: AnyCode) -> list[str]:
    """Names of ``localsplus``: locals, then cell-only variables, then free ones."""
    names = list(code.co_varnames)
    names += [c for c in code.co_cellvars if c not in code.co_varnames]
    names += list(code.co_freevars)
    return names


def _slot_kind(code: AnyCode, index: int, name: str, names: list[str]) -> str:
    if index >= len(names) - len(code.co_freevars):
        return "free"
    if name in code.co_cellvars:
        return "cell"
    nargs = code.co_argcount + code.co_kwonlyargcount
    nargs += bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)  # *args, **kwargs
    return "arg" if index < nargs else "local"


Readable = Callable[[str], bool]


def _describe_frame(frame: FrameView, locate: Locator, unsafe: bool,
                    readable: Readable) -> tuple[FrameInfo, AnyCode | None]:
    notes: list[str] = []
    module = frame.module
    qualname = frame.func_qualname
    stored = frame.fingerprint
    captured = frame.captured_code
    current: types.CodeType | None = None
    path: str | None = None
    compile_problem: str | None = None
    # The module's source as the import system finds it (.py files only) is
    # readable; any other file only if ``readable`` says it belongs to the run.
    located = locate(module) if module is not None else None

    def may_read(candidate: str | None) -> bool:
        return bool(candidate) and (candidate == located or readable(str(candidate)))

    if module is not None and not (frame.live is not None and captured is not None):
        path = located
        if path is None and captured is not None and may_read(captured.co_filename) \
                and os.path.isfile(captured.co_filename):
            path = captured.co_filename
        if path is not None:
            mod_code = compile_file(path)
            if isinstance(mod_code, str):
                compile_problem = mod_code
            else:
                current = find_code(mod_code, qualname, stored)
    elif captured is not None:
        path = captured.co_filename

    code_changed: bool | None = None
    if current is not None and stored is not None:
        code_changed = fingerprint(current) != stored
    elif frame.live is not None:
        code_changed = False
    elif frame.by_reference:
        code_changed = None
        if compile_problem:
            notes.append(compile_problem)
        elif path is None:
            notes.append(f"source of module {script_display_name(module)!r} not found")
        else:
            notes.append(f"{qualname} no longer exists in {path}")

    # The code whose offsets the record refers to (or the best stand-in).
    code: AnyCode | None
    if captured is not None and (current is None or code_changed):
        code = captured
        if current is None and captured.co_filename and path is None:
            path = captured.co_filename
        if code_changed and not frame.by_reference:
            notes.append("source changed since the snapshot; the frame was captured by value "
                         "and resumes with the captured code (line shown from that code)")
    elif current is not None:
        code = current
        if code_changed:
            notes.append("this frame cannot resume with the current code; the line and the "
                         "variable names shown come from the current source and may not match")
    else:
        code = None

    offset = frame.offset
    status = {FrameView.CREATED: "not started", FrameView.SUSPENDED: "suspended",
              FrameView.RUNNING: "running", FrameView.FINISHED: "finished"}.get(frame.state, "unknown")
    line: int | None = None
    columns: tuple[int, int] | None = None
    if code is not None:
        if code_changed and frame.by_reference:
            line = code.co_firstlineno or None
        else:
            line, columns = code_line(code, offset)
        if path is None:
            path = code.co_filename or None
    source: str | None = None
    if path and line:
        if may_read(path):
            source = _source_line(path, line)
        elif os.path.isfile(path):
            notes.append(f"source not shown: {path} is not one of this run's files")
    if code_changed and frame.by_reference:
        columns = None

    slots = frame.slots
    names = _slot_names(code) if code is not None else []
    nnames = min(len(names), len(slots))
    locals_: list[Local] = []
    for i in range(nnames):
        value = slots[i]
        name = names[i]
        kind = _slot_kind(code, i, name, names) if code is not None else "local"
        if isinstance(value, CellView):
            unbound = value.empty
            shown = "<unbound>" if unbound else safe_repr(value.contents, unsafe=unsafe)
        elif isinstance(value, types.CellType):
            try:
                contents = value.cell_contents
            except ValueError:
                unbound, shown = True, "<unbound>"
            else:
                unbound, shown = False, safe_repr(contents, unsafe=unsafe)
        else:
            unbound = value is UNBOUND
            shown = "<unbound>" if unbound else safe_repr(value, unsafe=unsafe)
        locals_.append(Local(name, kind, shown, unbound))
    if code is None:
        nnames = 0
    stack = [safe_repr(v, 48, unsafe=unsafe) for v in slots[nnames:]]
    if code is None and slots:
        notes.append(f"{len(slots)} slots stored; their names are unknown without the code")

    exc = frame.exc
    handling = None if exc is UNBOUND or exc is None else safe_repr(exc, unsafe=unsafe)
    info = FrameInfo(
        function=frame.name,
        qualname=frame.qualname,
        module=module,
        file=path,
        line=line,
        source=source,
        columns=columns,
        status=status,
        by_reference=frame.by_reference or (frame.live is not None and "<locals>" not in qualname),
        fingerprint=stored.hex() if stored is not None else None,
        code_changed=code_changed,
        notes=notes,
        locals=locals_,
        stack=stack,
        handling=handling,
    )
    return info, code


def _resume_kind(code: AnyCode | None, offset: int) -> str | None:
    """'yield', 'yield from' or 'await' for the RESUME after the YIELD_VALUE at ``offset``."""
    if code is None or offset < 0:
        return None
    raw = code.co_code
    if 2 * offset + 3 >= len(raw):
        return None
    return {1: "yield", 2: "yield from", 3: "await"}.get(raw[2 * offset + 3] & 3)


def describe(root: Any, locate: Locator | None = None, *, unsafe: bool = False,
             readable: Readable | None = None) -> tuple[list[FrameInfo], Awaiting | None]:
    """Frames of the await chain under ``root`` (outermost first) and what it awaits.

    ``locate(module)`` returns the source file of a module captured by
    reference (default: :func:`find_module_file`); it must not import it.
    Source lines are read only from files ``locate`` returned and from files
    ``readable(path)`` accepts (the run's own; default: none): a snapshot's
    code names its own file, and must not make inspect print another one.
    tcc's own request frames (``EffectRequest.__await__`` ...) are folded into
    the :class:`Awaiting` description.
    """
    locate = locate or find_module_file
    readable = readable or (lambda _path: False)
    frames: list[FrameInfo] = []
    seen: set[int] = set()
    obj: Any = root
    while id(obj) not in seen:
        seen.add(id(obj))
        frame = frame_view(obj)
        if frame is None:
            return frames, (describe_request(obj, unsafe=unsafe) if frames else None)
        if _is_internal(frame):
            request = next((s for s in frame.slots if _request_fields(s) is not None), None)
            if request is not None:
                return frames, describe_request(request, unsafe=unsafe)
        info, code = _describe_frame(frame, locate, unsafe, readable)
        frames.append(info)
        if frame.state != FrameView.SUSPENDED or not frame.slots:
            break
        top = frame.slots[-1]
        kind = _resume_kind(code, frame.offset) if info.code_changed is not True else None
        info.resumes_after = kind
        if kind in ("await", "yield from") or (kind is None and frame_view(top) is not None):
            if info.stack:
                info.stack.pop()  # the delegate: shown as the next frame
            delegate = frame_view(top)
            info.awaits = delegate.qualname if delegate is not None else info.awaits
            obj = top
            continue
        break
    return frames, None
