"""``tcc inspect``: the frozen call stack of a snapshot, like a traceback.

The snapshot is read with :func:`tcc.capture.safe_loads`, a restricted
unpickler, and its frames are described by :func:`tcc.cli._stack.describe`:
nothing is resumed, the agent's script is not imported and no user code runs
(``--unsafe-repr`` imports the script, loads the snapshot normally and uses
real reprs: any code in the snapshot runs, which is why the CLI asks first).
The module globals a snapshot holds (the run state's 7th item) are shown
after the stack, with the same safe reprs as the locals.

A snapshot is treated as untrusted data: source lines are read only from the
run's own files (see :func:`_readable`), and every text it contributes is
printed through :func:`tcc.cli._render.clean`.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from typing import Any

from ..runtime import (SCRIPT_PREFIX, is_module_entry, script_display_name, script_module_name,
                       snapshot_state, split_entry)
from ..store import RunInfo, Store
from ._render import clean
from ._safe_repr import safe_repr
from ._stack import Awaiting, FrameInfo, Locator, Readable, describe, find_module_file

def _entry_file(run: RunInfo) -> tuple[str, str]:
    """(the file of the run's entry, the folder whose ``.py`` files inspect may show).

    A script entry names its file.  A module entry (``pkg.mod:main``) is looked up from
    the current directory without importing anything; its folder is the package root."""
    if not is_module_entry(run.entry):
        path = split_entry(run.entry)[0]
        return path, os.path.dirname(path)
    module = run.entry.rpartition(":")[0]
    path = find_module_file(module, (os.getcwd(),)) or ""
    folder = os.path.dirname(path) if path else os.getcwd()
    for _ in range(module.count(".") + (os.path.basename(path) == "__init__.py")):
        folder = os.path.dirname(folder)
    return path, folder


def _locator(run: RunInfo) -> Locator:
    path, folder = _entry_file(run)
    script_module = script_module_name(path)
    stem = script_display_name(script_module)

    def locate(module: str) -> str | None:
        # The script's module name (older tcc versions added a path hash).
        if module == script_module or (
            module.startswith(SCRIPT_PREFIX) and script_display_name(module) == stem
        ):
            return path if os.path.isfile(path) else None
        if module.startswith(SCRIPT_PREFIX):
            return None
        return find_module_file(module, (folder,))

    return locate


def _readable(run: RunInfo) -> Readable:
    """Which files inspect may print source lines of: the run's script and the ``.py``
    files under its directory (a snapshot's code names its own file, and must not
    make inspect print, say, /etc/passwd).  Modules found by import rules are
    readable too (:func:`tcc.cli._stack.describe`)."""
    folder = os.path.realpath(_entry_file(run)[1])

    def readable(candidate: str) -> bool:
        if not candidate.endswith(".py"):
            return False
        real = os.path.realpath(candidate)
        try:
            inside = os.path.commonpath([real, folder]) == folder
        except ValueError:  # another drive
            return False
        return inside and os.path.isfile(real)

    return readable


def _globals_doc(module_globals: Any, unsafe: bool) -> dict[str, dict[str, str]]:
    """{module: {global name: safe repr}} of the module globals a snapshot holds."""
    if not isinstance(module_globals, dict):
        return {}
    doc: dict[str, dict[str, str]] = {}
    for module, values in module_globals.items():
        if not isinstance(values, dict) or not values:
            continue
        shown = {str(name): safe_repr(value, unsafe=unsafe) for name, value in values.items()}
        doc[script_display_name(str(module)) or str(module)] = shown
    return doc


def _pending_text(pending: Any, unsafe: bool) -> str | None:
    if not (isinstance(pending, tuple) and len(pending) == 2):
        return None
    how, value = pending
    if how == "send":
        if value is None:
            return "resumes by sending None into the innermost frame"
        return f"resumes by sending {safe_repr(value, unsafe=unsafe)} into the innermost frame"
    if how == "throw":
        return f"resumes by raising {safe_repr(value, unsafe=unsafe)} in the innermost frame"
    if how == "request":
        return "parked: `tcc resume` (or the worker) takes this request up again"
    return None


def inspect_command(store: Store, run_id: str, at: int | None, as_json: bool, unsafe_repr: bool,
                    *, color: bool | None = None) -> str:
    """The frozen call stack of snapshot ``at`` (default: newest) of ``run_id``.

    Returns the text to print (a JSON document with ``as_json``).  Colors are
    used when ``color`` is true, by default when stdout is a terminal and
    ``NO_COLOR`` is unset.
    """
    doc, frames, awaiting = inspect_doc(store, run_id, at, unsafe_repr=unsafe_repr)
    if as_json:
        return json.dumps(doc, indent=2)
    if color is None:
        color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    return _render(doc, frames, awaiting, _Style(bool(color)))


def inspect_doc(store: Store, run_id: str, at: int | None = None, *,
                unsafe_repr: bool = False) -> tuple[dict[str, Any], list[FrameInfo], Awaiting | None]:
    """The document of ``tcc inspect --json`` for snapshot ``at`` (default: newest) of
    ``run_id``, with the frames and awaited request it was made from.  Runs no user code
    unless ``unsafe_repr`` (which the CLI confirms first; the dashboard never asks for it)."""
    view = snapshot_state(store, run_id, at, unsafe=unsafe_repr)
    run, info, numbers, notes, unsafe = view.run, view.info, view.numbers, view.notes, view.unsafe
    coro, pending, calls = view.state.coro, view.state.resumption, view.state.calls
    module_globals = view.state.module_state or {}
    frames, awaiting = describe(coro, _locator(run), unsafe=unsafe, readable=_readable(run))
    doc = {
        "run": run_id,
        "status": run.status,
        "entry": run.entry,
        "snapshot": info.number,
        "snapshots": numbers,
        "taken": info.created,
        "journal_len": info.journal_len,
        "size": info.size,
        "effect_calls": calls if isinstance(calls, int) else None,
        "unsafe_repr": unsafe,
        "frames": [_frame_doc(f) for f in frames],
        "awaiting": dataclass_doc(awaiting),
        "pending": _pending_text(pending, unsafe),
        "globals": _globals_doc(module_globals, unsafe),
        "notes": notes,
    }
    return doc, frames, awaiting


def dataclass_doc(awaiting: Awaiting | None) -> dict[str, Any] | None:
    if awaiting is None:
        return None
    return {"kind": awaiting.kind, "text": awaiting.text, **awaiting.detail}


def _frame_doc(f: FrameInfo) -> dict[str, Any]:
    return {
        "function": f.function,
        "qualname": f.qualname,
        "module": script_display_name(f.module),
        "file": f.file,
        "line": f.line,
        "source": f.source.strip() if f.source else None,
        "status": f.status,
        "resumes_after": f.resumes_after,
        "awaits": f.awaits,
        "by_reference": f.by_reference,
        "fingerprint": f.fingerprint,
        "code_changed": f.code_changed,
        "notes": f.notes,
        "locals": {v.name: v.value for v in f.locals},
        "unbound": [v.name for v in f.locals if v.unbound],
        "cells": [v.name for v in f.locals if v.kind in ("cell", "free")],
        "stack": f.stack,
        "handling": f.handling,
    }


# ---------------------------------------------------------------- rendering


class _Style:
    def __init__(self, on: bool) -> None:
        self.on = on

    def _sgr(self, code: str, text: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.on else text

    def bold(self, t: str) -> str:
        return self._sgr("1", t)

    def dim(self, t: str) -> str:
        return self._sgr("2", t)

    def name(self, t: str) -> str:
        return self._sgr("1;35", t)

    def file(self, t: str) -> str:
        return self._sgr("36", t)

    def num(self, t: str) -> str:
        return self._sgr("1;36", t)

    def var(self, t: str) -> str:
        return self._sgr("33", t)

    def ok(self, t: str) -> str:
        return self._sgr("32", t)

    def bad(self, t: str) -> str:
        return self._sgr("1;31", t)

    def caret(self, t: str) -> str:
        return self._sgr("1;31", t)


def _when(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts).isoformat(sep=" ", timespec="seconds")


def _render(doc: dict[str, Any], frames: list[FrameInfo], awaiting: Awaiting | None, s: _Style) -> str:
    out: list[str] = []
    others = [n for n in doc["snapshots"] if n != doc["snapshot"]]
    head = (
        f"{s.bold('run')} {s.name(clean(doc['run']))}  {s.dim('·')}  {clean(doc['status'])}  "
        f"{s.dim('·')}  {s.bold('snapshot')} {s.num(str(doc['snapshot']))}"
    )
    if others:
        head += s.dim(f" (also retained: {', '.join(map(str, others))})")
    out.append(head)
    out.append(s.dim(
        f"{clean(doc['entry'])}  ·  taken {_when(doc['taken'])}  ·  {doc['journal_len']} journal records  ·  "
        f"{doc['size']} bytes" + ("  ·  real reprs (--unsafe-repr)" if doc["unsafe_repr"] else "")
    ))
    for note in doc["notes"]:
        out.append(s.bad("! ") + clean(note))
    out.append("")
    out.append(s.bold("Frozen call stack (most recent call last):"))
    for f in frames:
        out.extend(_render_frame(f, s))
    if awaiting is not None:
        marker = "⏸ " if awaiting.kind in ("approval", "wait", "sleep") else "→ "
        out.append(f"  {s.bold(marker + clean(awaiting.text))}")
    if doc["pending"]:
        out.append(s.dim(f"  ({clean(doc['pending'])})"))
    if not frames:
        out.append(s.dim("  (no suspended frames)"))
    if doc["globals"]:
        out.append("")
        out.append(s.bold("Module globals:"))
        for module, values in doc["globals"].items():
            out.append(f"  {s.name(clean(module))}")
            width = min(max((len(clean(name)) for name in values), default=0), 18)
            for name, value in values.items():
                out.append(f"    {s.dim('│')} {s.var(clean(name).ljust(width))} = {clean(value)}")
    return "\n".join(out) + "\n"


def _render_frame(f: FrameInfo, s: _Style) -> list[str]:
    lines: list[str] = []
    where = (f'  File {s.file(chr(34) + clean(f.file or "?") + chr(34))}, '
             f'line {s.num(str(f.line or "?"))}, in {s.name(clean(f.qualname))}')
    if f.status != "suspended":
        where += s.dim(f"  [{f.status}]")
    lines.append(where)
    if f.source is not None:
        source = clean(f.source)
        stripped = source.lstrip()
        indent = len(source) - len(stripped)
        lines.append("    " + stripped)
        if f.columns is not None:
            start, end = f.columns
            start -= indent
            end = min(end - indent, len(stripped))
            if 0 <= start < end and end - start < len(stripped):
                lines.append("    " + " " * start + s.caret("^" * (end - start)))
    width = min(max((len(clean(v.name)) for v in f.locals), default=0), 18)
    bar = s.dim("│")
    for v in f.locals:
        tag = s.dim(" (cell)") if v.kind in ("cell", "free") else ""
        value = s.dim(clean(v.value)) if v.unbound else clean(v.value)
        lines.append(f"    {bar} {s.var(clean(v.name).ljust(width))} = {value}{tag}")
    if f.handling:
        lines.append(f"    {bar} {s.dim('handling')} {clean(f.handling)}")
    if f.stack:
        shown = clean(", ".join(f.stack))
        if len(shown) > 100:
            shown = shown[:99] + "…"
        lines.append(f"    {bar} {s.dim('stack: ' + shown)}")
    if f.fingerprint is not None:
        fp = f"{f.fingerprint[:12]}…"
        how = "by reference" if f.by_reference else "by value"
        if f.code_changed is True:
            verdict = s.bad("CODE CHANGED since the snapshot") if f.by_reference else s.bad("source changed since the snapshot")
        elif f.code_changed is False:
            verdict = s.ok("code unchanged")
        else:
            verdict = s.dim("current code not found")
        lines.append(f"    {s.dim(f'fingerprint {fp} ({how})')}  {verdict}")
    for note in f.notes:
        lines.append(f"    {s.bad('!')} {clean(note)}")
    return lines
