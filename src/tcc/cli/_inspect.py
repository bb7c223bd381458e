"""``tcc inspect``: the frozen call stack of a snapshot, like a traceback.

The snapshot is read with :mod:`tcc.capture._inspect`'s restricted unpickler:
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

from .. import errors
from ..capture import _inspect as insp
from ..capture import load_payload, unseal
from ..runtime import _scripts
from ..runtime._driver import STATE_TAG
from ..store import RunInfo, SnapshotInfo, Store
from ._render import clean

# Generators loaded for --unsafe-repr are kept alive: collecting a suspended
# coroutine would close it, running its `finally` blocks.
_KEEP: list[Any] = []


def _locator(run: RunInfo) -> insp.Locator:
    path, _func = _scripts.split_entry(run.entry)
    script_module = _scripts.module_name(path)
    stem = insp.display_module(script_module)
    folder = os.path.dirname(path)

    def locate(module: str) -> str | None:
        # The script's module name (older tcc versions added a path hash).
        if module == script_module or (
            module.startswith("__tcc_script_") and insp.display_module(module) == stem
        ):
            return path if os.path.isfile(path) else None
        if module.startswith("__tcc_script_"):
            return None
        return insp.find_module_file(module, (folder,))

    return locate


def _readable(run: RunInfo) -> insp.Readable:
    """Which files inspect may print source lines of: the run's script and the ``.py``
    files under its directory (a snapshot's code names its own file, and must not
    make inspect print, say, /etc/passwd).  Modules found by import rules are
    readable too (:func:`tcc.capture._inspect.describe`)."""
    path, _func = _scripts.split_entry(run.entry)
    folder = os.path.realpath(os.path.dirname(path))

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


def _pick_snapshot(store: Store, run_id: str, at: int | None) -> tuple[SnapshotInfo, bytes, list[int], list[str]]:
    snaps = store.snapshots(run_id)
    numbers = [s.number for s in snaps]
    notes: list[str] = []
    if not snaps:
        raise errors.UsageError(f"run {run_id} has no snapshots to inspect")
    if at is not None:
        chosen = [s for s in snaps if s.number == at]
        if not chosen:
            raise errors.UsageError(
                f"run {run_id} has no snapshot {at}; retained: {', '.join(map(str, numbers))}"
            )
        return chosen[0], store.load_snapshot(run_id, at), numbers, notes
    for info in reversed(snaps):
        if info.damaged:
            notes.append(f"snapshot {info.number} fails verification and was skipped: "
                         "its record does not verify, is missing or is not in the run's index")
            continue
        try:
            return info, store.load_snapshot(run_id, info.number), numbers, notes
        except errors.StoreCorruptError as exc:
            notes.append(f"snapshot {info.number} fails verification and was skipped: {exc}")
    raise errors.StoreCorruptError(
        f"run {run_id}: no snapshot verifies: snapshot(s) {', '.join(map(str, numbers))} "
        "failed verification and none was loaded; restore the store from a backup")


def _split_state(state: Any, run_id: str, number: int) -> tuple[Any, Any, Any, Any, Any]:
    """(coro, pending, calls, waits, module globals) of a run state.

    A run state is ``(STATE_TAG, version, coro, pending, calls[, waits[, globals]])``:
    older snapshots have no waits (5 items) or no module globals (6 items).
    """
    if not (isinstance(state, tuple) and len(state) in (5, 6, 7) and state[0] == STATE_TAG):
        raise errors.CorruptSnapshotError(f"run {run_id}: snapshot {number} is not a run state")
    coro, pending, calls = state[2], state[3], state[4]
    waits = state[5] if len(state) >= 6 else {}
    module_globals = state[6] if len(state) >= 7 else {}
    return coro, pending, calls, waits, module_globals


def _globals_doc(module_globals: Any, unsafe: bool) -> dict[str, dict[str, str]]:
    """{module: {global name: safe repr}} of the module globals a snapshot holds."""
    if not isinstance(module_globals, dict):
        return {}
    doc: dict[str, dict[str, str]] = {}
    for module, values in module_globals.items():
        if not isinstance(values, dict) or not values:
            continue
        shown = {str(name): insp.safe_repr(value, unsafe=unsafe) for name, value in values.items()}
        doc[insp.display_module(str(module)) or str(module)] = shown
    return doc


def _pending_text(pending: Any, unsafe: bool) -> str | None:
    if not (isinstance(pending, tuple) and len(pending) == 2):
        return None
    how, value = pending
    if how == "send":
        if value is None:
            return "resumes by sending None into the innermost frame"
        return f"resumes by sending {insp.safe_repr(value, unsafe=unsafe)} into the innermost frame"
    if how == "throw":
        return f"resumes by raising {insp.safe_repr(value, unsafe=unsafe)} in the innermost frame"
    if how == "request":
        return "parked: `tcc resume` (or the worker) takes this request up again"
    return None


def _load_unsafe(run: RunInfo, payload: bytes) -> Any:
    path, _func = _scripts.split_entry(run.entry)
    _scripts.load_script(path)
    state = load_payload(payload)
    _KEEP.append(state)
    return state


def inspect_command(store: Store, run_id: str, at: int | None, as_json: bool, unsafe_repr: bool,
                    *, color: bool | None = None) -> str:
    """The frozen call stack of snapshot ``at`` (default: newest) of ``run_id``.

    Returns the text to print (a JSON document with ``as_json``).  Colors are
    used when ``color`` is true, by default when stdout is a terminal and
    ``NO_COLOR`` is unset.
    """
    run = store.get_run(run_id)
    info, blob, numbers, notes = _pick_snapshot(store, run_id, at)
    payload = unseal(blob)
    state: Any = None
    unsafe = False
    if unsafe_repr:
        try:
            state = _load_unsafe(run, payload)
            unsafe = True
        except (errors.TccError, ImportError, OSError, SyntaxError) as exc:
            notes.append(f"--unsafe-repr: the snapshot cannot be loaded ({exc}); showing the safe view")
    if state is None:
        try:
            state = insp.safe_loads(payload)
        except Exception as exc:  # noqa: BLE001 - report damage, never crash
            raise errors.CorruptSnapshotError(
                f"run {run_id}: snapshot {info.number} cannot be read: {type(exc).__name__}: {exc}"
            ) from exc
    coro, pending, calls, waits, module_globals = _split_state(state, run_id, info.number)
    frames, awaiting = insp.describe(coro, _locator(run), unsafe=unsafe, readable=_readable(run))
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
    if as_json:
        return json.dumps(doc, indent=2)
    if color is None:
        color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    return _render(doc, frames, awaiting, _Style(bool(color)))


def dataclass_doc(awaiting: insp.Awaiting | None) -> dict[str, Any] | None:
    if awaiting is None:
        return None
    return {"kind": awaiting.kind, "text": awaiting.text, **awaiting.detail}


def _frame_doc(f: insp.FrameInfo) -> dict[str, Any]:
    return {
        "function": f.function,
        "qualname": f.qualname,
        "module": insp.display_module(f.module),
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


def _render(doc: dict[str, Any], frames: list[insp.FrameInfo], awaiting: insp.Awaiting | None, s: _Style) -> str:
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


def _render_frame(f: insp.FrameInfo, s: _Style) -> list[str]:
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
