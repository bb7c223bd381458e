"""``tcc upgrade``: move a suspended run onto the current code.

A snapshot holds each suspended frame as an instruction offset, a value stack and
locals, which mean something only for the code they were taken in.  An upgrade maps
them onto the current code, frame by frame, and stores the result as a new snapshot;
``tcc resume`` then continues on the current code.  It needs the code the snapshot was
taken in, which the run recorded (pinned code, :mod:`._pinning`), to read the old frame.

For each frame whose code changed:

* **Suspension point.**  Each await site of a function has an identity in the source:
  the awaited call as written (``step``, ``tcc.approval``), and its ordinal among the
  function's sites that await the same call.  ``await tcc.checkpoint("label")`` is the
  site ``label``, and labels the sites after it (up to the next label): those are
  numbered within their label.  The old site maps to the new site of the same identity,
  if the new code has as many sites of that call (in that label) as the old one;
  otherwise the mapping is ambiguous (a site of the same call was added or removed) or
  the site is gone, and the upgrade is refused.
* **Value stack.**  While suspended, the stack holds what enclosing constructs keep
  (a ``for`` loop's iterator, a ``with`` block's exit, an exception being handled) and
  the partial results of the expression around the await.  It is mapped slot by slot
  only if the new code has the same depth there and each slot is pushed by the same
  instruction for the same source text; otherwise refused, naming the line.
* **Locals** map by name.  A local that is new is left unbound if every path from the
  resumption point assigns it before reading it; if one reads it first, it needs
  ``--set NAME=JSON`` (or ``--rename OLD=NEW`` for a renamed one).  A local the new code
  no longer has is dropped, and the plan says so.  A local that became a closure cell,
  or stopped being one, is refused.

A frame whose code did not change is kept as it is, and a snapshot is upgraded whole or
not at all.  The new frames are written through the native validator and the flow
analysis, as every restore is.  Instances of the project's dataclasses (and pydantic
models) in the state that lack a field the new class has get its default, or the
upgrade is refused, naming the class and the field.
"""

from __future__ import annotations

import ast
import dataclasses
import dis
import gc
import importlib
import json
import os
import sys
import types
from typing import Any

from .. import errors
from ..capture import (NULL_SLOT, PINNED_PREFIX, check_frame_record, dump_stored, fingerprint,
                       flow_instructions, flow_points, load_payload, slot_names, unseal)
from ..store import FINAL_STATUSES, Store
from . import _scripts
from ._markers import UPGRADE_EVENT
from ._pinning import (CodeRecorder, Manifest, compiled_codes, fingerprints_by_name, manifest_of,
                       project_root)
from ._state import pack_state, unpack_state

__all__ = ["FrameMap", "Plan", "upgrade"]

_TCC_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


@dataclasses.dataclass
class FrameMap:
    """How one frame maps onto the current code."""

    qualname: str
    file: str
    changed: bool
    old_line: int | None = None
    new_line: int | None = None
    site: str = ""
    kept: list[str] = dataclasses.field(default_factory=list)
    dropped: list[str] = dataclasses.field(default_factory=list)
    unbound: list[str] = dataclasses.field(default_factory=list)  # new, assigned before use
    given: list[str] = dataclasses.field(default_factory=list)  # --set
    renamed: list[str] = dataclasses.field(default_factory=list)  # "old -> new"
    stack: str = ""
    refusals: list[str] = dataclasses.field(default_factory=list)
    internal: bool = False  # a frame of tcc itself (an effect call's own await)


@dataclasses.dataclass
class Plan:
    """What an upgrade does (or would do), frame by frame, outermost first."""

    run_id: str
    snapshot: int
    frames: list[FrameMap] = dataclasses.field(default_factory=list)
    defaults: list[str] = dataclasses.field(default_factory=list)
    refusals: list[str] = dataclasses.field(default_factory=list)
    written: int | None = None  # the snapshot an upgrade stored
    nothing_changed: bool = False  # no suspended frame's code changed (a resume needs none)
    # refused only because the journal has records after the snapshot (a call in flight at
    # a crash): the run can move once it has taken its next snapshot on its recorded code
    after_snapshot: bool = False

    @property
    def ok(self) -> bool:
        return not self.refusals and not any(f.refusals for f in self.frames)

    def all_refusals(self) -> list[str]:
        return [*self.refusals, *(r for f in self.frames for r in f.refusals)]

    def to_json(self) -> dict[str, Any]:
        return {"run": self.run_id, "snapshot": self.snapshot, "ok": self.ok,
                "written": self.written, "nothing_changed": self.nothing_changed, "defaults": self.defaults, "refusals": self.all_refusals(),
                "frames": [dataclasses.asdict(f) for f in self.frames]}


class _Stop(Exception):
    """Ends a load that must write nothing (a refusal, or a dry run)."""


# ------------------------------------------------------------------ await sites


@dataclasses.dataclass(frozen=True)
class _Site:
    offset: int  # code-unit index of the YIELD_VALUE
    line: int
    col: int
    text: str  # the awaited expression as written
    label: str | None  # the site's own label (a labelled checkpoint), or its region's
    call: str  # what it awaits ("step", "tcc.approval"), "" if unknown
    own_label: bool
    expr: str = ""  # the awaited expression, normalised (ast.dump, no positions)


def _segment(lines: list[bytes], pos: Any) -> str:
    """The source text of a ``dis`` position (columns are UTF-8 byte offsets)."""
    if pos is None or pos.lineno is None or pos.end_lineno is None \
            or pos.col_offset is None or pos.end_col_offset is None:
        return ""
    first, last = pos.lineno - 1, pos.end_lineno - 1
    if not (0 <= first <= last < len(lines)):
        return ""
    if first == last:
        chunk = lines[first][pos.col_offset:pos.end_col_offset]
    else:
        chunk = b"".join([lines[first][pos.col_offset:], *lines[first + 1:last],
                          lines[last][:pos.end_col_offset]])
    text: str = chunk.decode("utf-8", "replace")
    return text


def _label_of(node: ast.AST) -> str | None:
    """``L`` for ``await tcc.checkpoint("L")`` (or ``checkpoint("L")``)."""
    if isinstance(node, ast.Await) and isinstance(node.value, ast.Call):
        func = node.value.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        args = node.value.args
        if name == "checkpoint" and args and isinstance(args[0], ast.Constant) \
                and isinstance(args[0].value, str):
            return args[0].value
        for kw in node.value.keywords:
            if name == "checkpoint" and kw.arg == "label" and isinstance(kw.value, ast.Constant) \
                    and isinstance(kw.value.value, str):
                return kw.value.value
    return None


class _Source:
    """A module's source: its lines and the await expressions of its AST by position."""

    def __init__(self, source: bytes) -> None:
        self.lines = source.splitlines(keepends=True)
        self.nodes: dict[tuple[int, int, int, int], ast.AST] = {}
        self.handlers: list[tuple[tuple[int, int], tuple[int, int], str]] = []
        try:
            tree = ast.parse(source)
        except SyntaxError:
            return
        for node in ast.walk(tree):
            if isinstance(node, (ast.Await, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
                # ast columns count UTF-8 bytes too (as dis positions do)
                key = (node.lineno, node.col_offset, node.end_lineno or 0, node.end_col_offset or 0)
                self.nodes[key] = node
            elif isinstance(node, ast.ExceptHandler):
                caught = ast.unparse(node.type) if node.type is not None else "(everything)"
                self.handlers.append(((node.lineno, node.col_offset),
                                      (node.end_lineno or 0, node.end_col_offset or 0), caught))

    def handlers_around(self, line: int, col: int) -> list[str]:
        """What the ``except`` clauses enclosing (line, col) catch, outermost first."""
        at = (line, col)
        inside = [(start, caught) for start, end, caught in self.handlers if start <= at <= end]
        return [caught for _start, caught in sorted(inside)]

    def sites(self, code: types.CodeType) -> dict[int, _Site]:
        found = []
        for ins in dis.get_instructions(code):
            if ins.opname != "YIELD_VALUE":
                continue
            pos = ins.positions
            key = (pos.lineno or 0, pos.col_offset or 0, pos.end_lineno or 0, pos.end_col_offset or 0) \
                if pos is not None else (0, 0, 0, 0)
            node = self.nodes.get(key)
            call, expr = "", ""
            if isinstance(node, ast.Await):
                value = node.value
                call = ast.unparse(value.func if isinstance(value, ast.Call) else value)
                expr = ast.dump(value)
            elif node is not None:
                call, expr = "<comprehension>", ast.dump(node)
            found.append((key, ins.offset // 2, _segment(self.lines, pos), call,
                          _label_of(node) if node is not None else None, expr))
        found.sort()
        out: dict[int, _Site] = {}
        region: str | None = None
        for key, offset, text, call, own, expr in found:
            if own is not None:
                region = own
            out[offset] = _Site(offset, key[0], key[1], text, region, call, own is not None, expr)
        return out


def _identity(site: _Site) -> tuple[Any, ...]:
    return ("label", site.label) if site.own_label else ("await", site.label, site.call)


def _describe(site: _Site) -> str:
    where = f"line {site.line}"
    if site.own_label:
        return f"checkpoint {site.label!r} ({where})"
    label = f", after checkpoint {site.label!r}" if site.label else ""
    return f"`{site.text or site.call}` ({where}{label})"


def _match(old: _Site, old_sites: dict[int, _Site], new_sites: dict[int, _Site]) -> tuple[_Site | None, str]:
    """The new site ``old`` maps to, or None and why not.

    First by the awaited expression itself (``step(a)``: its ordinal among the sites
    awaiting exactly that, in its label); then, if the arguments changed, by the call
    (``step``) when it is awaited at one site only in both versions; else ambiguous."""
    ident = _identity(old)
    if not old.call:
        return None, (f"the frame is suspended at line {old.line} in something other than an "
                      "`await` expression (async for/with), which tcc does not map")
    if not old.own_label:
        exact = (*ident, old.expr)
        same_old = sorted((s for s in old_sites.values() if (*_identity(s), s.expr) == exact),
                          key=lambda s: s.offset)
        same_new = sorted((s for s in new_sites.values() if (*_identity(s), s.expr) == exact),
                          key=lambda s: s.offset)
        if same_new and len(same_new) == len(same_old):
            return same_new[same_old.index(old)], ""
    same_old = sorted((s for s in old_sites.values() if _identity(s) == ident), key=lambda s: s.offset)
    same_new = sorted((s for s in new_sites.values() if _identity(s) == ident), key=lambda s: s.offset)
    if not old.own_label and len(same_old) > 1 and same_new:
        return None, (f"the suspension point {_describe(old)} is ambiguous: the old code awaits "
                      f"{old.call} at {len(same_old)} sites there and the new code at "
                      f"{len(same_new)}, and not every one of them is written as before, so which "
                      "one it is cannot be told; name the site with `await tcc.checkpoint(\"label\")` "
                      "before it in both versions")
    if not same_new:
        return None, (f"the suspension point {_describe(old)} has no counterpart in the new code "
                      f"(no await of {old.call} there"
                      + (f" after checkpoint {old.label!r}" if old.label and not old.own_label else "")
                      + ")")
    if len(same_new) != len(same_old):
        return None, (f"the suspension point {_describe(old)} is ambiguous: the old code awaits "
                      f"{old.call} {len(same_old)} time(s) there and the new code "
                      f"{len(same_new)} time(s), so which one it is cannot be told; name the site "
                      "with `await tcc.checkpoint(\"label\")` before it in both versions")
    return same_new[same_old.index(old)], ""


# ---------------------------------------------------------------- frame mapping


def _slot_kind(code: types.CodeType, index: int) -> str:
    names = slot_names(code)
    name = names[index]
    if index >= len(names) - len(code.co_freevars):
        return "free"
    return "cell" if name in code.co_cellvars else "local"


_READS = {"LOAD_FAST", "LOAD_FAST_CHECK", "DELETE_FAST", "LOAD_DEREF", "DELETE_DEREF"}
_WRITES = {"STORE_FAST", "STORE_DEREF"}


def _touches(ins: Any) -> tuple[set[int], set[int]]:
    """(local slots read, written) by one instruction, reads first."""
    name, arg = ins.name, ins.arg
    if name in _READS:
        return {arg}, set()
    if name in _WRITES:
        return set(), {arg}
    if name == "LOAD_FAST_LOAD_FAST":
        return {arg >> 4, arg & 15}, set()
    if name == "STORE_FAST_STORE_FAST":
        return set(), {arg >> 4, arg & 15}
    if name == "STORE_FAST_LOAD_FAST":
        store, load = arg >> 4, arg & 15
        return ({load} if load != store else set()), {store}
    return set(), set()


def _read_before_write(instrs: list[Any], start: int, slot: int) -> int | None:
    """The line of a read of ``slot`` reachable from ``start`` before a write to it."""
    seen: set[int] = set()
    work = [start]
    while work:
        i = work.pop()
        if i in seen or not 0 <= i < len(instrs):
            continue
        seen.add(i)
        ins = instrs[i]
        reads, writes = _touches(ins)
        if slot in reads:
            return ins.line or 0
        if slot in writes:
            continue
        if ins.falls:
            work.append(i + 1)
        if ins.target >= 0:
            work.append(ins.target)
        if ins.handler >= 0:
            work.append(ins.handler)
    return None


def _maker(code: types.CodeType, source: _Source, maker: tuple[int, int]) -> tuple[str, int, str] | None:
    """(instruction, output, source text) of what pushed a stack slot; None if unknown."""
    index, output = maker
    if index < 0:
        return None
    ins = flow_instructions(code)[index]
    positions = {i.offset: i.positions for i in dis.get_instructions(code)}
    if ins.name == "GET_AWAITABLE":  # the awaited call in flight: the site match covers it
        return ins.name, output, ""
    # the first line: a loop's or with block's instruction spans its whole statement
    text = _segment(source.lines, positions.get(ins.offset)).split("\n", 1)[0].strip()
    return ins.name, output, text


def _slot_words(maker: tuple[str, int, str] | None) -> str:
    """A stack slot as a reviewer reads it: what pushed it."""
    if maker is None:
        return "?"
    name, output, text = maker
    if name == "GET_ITER":
        return f"the iterator of `{text}`"
    if name in ("BEFORE_WITH", "BEFORE_ASYNC_WITH", "LOAD_SPECIAL"):
        return f"the exit of `{text}`"
    if name == "GET_AWAITABLE":
        return "the awaited call"
    if output:
        return "the exception being handled"
    return f"`{text}` ({name})"


def _map_frame(old_code: types.CodeType, old_src: _Source, new_code: types.CodeType,
               new_src: _Source, record: tuple[Any, ...], sets: dict[str, Any],
               renames: dict[str, str], fm: FrameMap) -> tuple[Any, ...] | None:
    """The record ``record`` of ``old_code`` mapped onto ``new_code``, or None (refusals
    in ``fm``)."""
    _version, state, offset, slots, exc, _name, _qualname = record
    old_names, new_names = slot_names(old_code), slot_names(new_code)
    old_index = {n: i for i, n in enumerate(old_names)}
    nl = len(old_names)
    if offset == -1:  # never started: only its arguments
        new_offset = -1
        fm.site = "not started"
        if old_code.co_varnames[:old_code.co_argcount] != new_code.co_varnames[:new_code.co_argcount]:
            fm.refusals.append(f"{fm.qualname}() has not started and its arguments changed")
            return None
        stack: tuple[Any, ...] = ()
        start = 0
    else:
        old_sites, new_sites = old_src.sites(old_code), new_src.sites(new_code)
        site = old_sites.get(offset)
        if site is None:
            fm.refusals.append(f"{fm.qualname}(): the suspension point at offset {offset} is not an "
                               "await site tcc can read")
            return None
        fm.old_line = site.line
        fm.site = _describe(site)
        new_site, why = _match(site, old_sites, new_sites)
        if new_site is None:
            fm.refusals.append(f"{fm.qualname}(): {why}")
            return None
        fm.new_line = new_site.line
        caught_was = old_src.handlers_around(site.line, site.col)
        caught_now = new_src.handlers_around(new_site.line, new_site.col)
        if caught_was != caught_now:  # the exception being handled is on the stack
            fm.refusals.append(
                f"{fm.qualname}(): the await at line {site.line} is inside `except` clause(s) "
                f"catching {', '.join(caught_was) or 'nothing'}, and at line {new_site.line} the new "
                f"code's catch {', '.join(caught_now) or 'nothing'}: the exception being handled "
                "would not match")
            return None
        if new_site.text != site.text:
            fm.site += f", now `{new_site.text}`"
        new_offset = new_site.offset
        old_point = flow_points(old_code).get(offset)
        new_point = flow_points(new_code).get(new_offset)
        stack = tuple(slots[nl:])
        if old_point is None or new_point is None or old_point.depth is None \
                or new_point.depth != len(stack):
            fm.refusals.append(
                f"{fm.qualname}(): at line {site.line} the frame holds {len(stack)} value(s) on its "
                f"stack (loops, with blocks, partial results), and at line {new_site.line} the new "
                f"code holds {new_point.depth if new_point is not None else 'an unknown number'}: "
                "the enclosing constructs changed")
            return None
        for k in range(len(stack)):
            was = _maker(old_code, old_src, old_point.makers[k])
            now = _maker(new_code, new_src, new_point.makers[k])
            if was is None or now is None or was != now:
                what = f"`{was[2]}` ({was[0]})" if was else "a value the analysis cannot trace"
                then = f"`{now[2]}` ({now[0]})" if now else "a value the analysis cannot trace"
                fm.refusals.append(
                    f"{fm.qualname}(): stack slot {k} at line {site.line} holds {what}, where the "
                    f"new code at line {new_site.line} has {then}: the loop, with block or "
                    "expression around the await changed")
                return None
        fm.stack = ", ".join(_slot_words(_maker(old_code, old_src, m)) for m in old_point.makers) \
            if stack else "empty"
        start = new_point.start
    renamed_from = {new: old for old, new in renames.items()}
    new_slots: list[Any] = []
    for j, name in enumerate(new_names):
        kind = _slot_kind(new_code, j)
        source_name = renamed_from.get(name, name)
        if name in sets:
            value = sets[name]
            new_slots.append(types.CellType(value) if kind == "cell" else value)
            fm.given.append(name)
            continue
        i = old_index.get(source_name)
        if i is not None:
            if _slot_kind(old_code, i) != kind:
                fm.refusals.append(
                    f"{fm.qualname}(): {source_name!r} was a {_slot_kind(old_code, i)} variable and "
                    f"is now a {kind} one (a closure started or stopped using it)")
                return None
            if slots[i] is NULL_SLOT and kind == "local" and start >= 0:
                line = _read_before_write(flow_instructions(new_code), start, j)
                if line is not None:  # unassigned where the frame waits, and read first now
                    fm.refusals.append(
                        f"{fm.qualname}(): local {name!r} is not assigned where the frame waits, "
                        f"and the new code reads it at line {line} before assigning it: give it "
                        f"with --set {name}=JSON")
                    continue
            new_slots.append(slots[i])
            if source_name != name:
                fm.renamed.append(f"{source_name} -> {name}")
            elif slots[i] is NULL_SLOT:
                fm.unbound.append(name)  # not assigned yet where the frame waits
            else:
                fm.kept.append(name)
            continue
        if kind == "free":
            fm.refusals.append(f"{fm.qualname}(): new free variable {name!r} cannot be given")
            return None
        line = _read_before_write(flow_instructions(new_code), start, j) if start >= 0 else None
        if line is not None:
            hint = [o for o in old_names if o not in new_names and o not in renames]
            fm.refusals.append(
                f"{fm.qualname}(): new local {name!r} is read at line {line} before the code "
                f"assigns it after the suspension point: give it with --set {name}=JSON"
                + (f", or map an old local onto it with --rename OLD={name} (old locals the new "
                   f"code lacks: {', '.join(hint)})" if hint else ""))
            continue
        new_slots.append(types.CellType() if kind == "cell" else NULL_SLOT)
        fm.unbound.append(name)
    if fm.refusals:
        return None
    fm.dropped = [n for n in old_names if n not in new_names and n not in renames]
    return (1, state, new_offset, tuple(new_slots) + stack, exc, new_code.co_name, new_code.co_qualname)


# ------------------------------------------------------------ the old code


class _OldCode:
    """The code objects a snapshot was taken in, compiled from the run's recorded sources."""

    def __init__(self, store: Store, manifest: Manifest) -> None:
        self.store, self.manifest = store, manifest
        self._compiled: dict[str, tuple[_Source, dict[tuple[str, bytes], types.CodeType]]] = {}

    def find(self, module: str, qualname: str, fp: bytes) -> tuple[types.CodeType, _Source] | None:
        for name, entry in reversed(list(self.manifest.items())):
            if name != module and entry.get("from") != module:
                continue
            src, codes = self._compile(entry["sha256"], entry["file"])
            code = codes.get((qualname, fp))
            if code is not None:
                return code, src
        return None

    def _compile(self, digest: str, file: str) -> tuple[_Source, dict[tuple[str, bytes], types.CodeType]]:
        if digest not in self._compiled:
            source = self.store.get_code(digest)
            codes = {(code.co_qualname, fingerprint(code)): code
                     for code in compiled_codes(source, file)}
            self._compiled[digest] = (_Source(source), codes)
        return self._compiled[digest]


def _current_source(code: types.CodeType) -> _Source:
    try:
        with open(code.co_filename, "rb") as f:
            return _Source(f.read())
    except OSError:
        return _Source(b"")


# --------------------------------------------------------- dataclass fields


def _fill_defaults(roots: list[Any], project: set[str], plan: Plan, apply: bool) -> None:
    """Give instances of the project's dataclasses/pydantic models the new fields'
    defaults, or refuse naming the class and the field."""
    seen: set[int] = set()
    work = list(roots)
    told: set[tuple[type, str]] = set()
    nested = _NestedCode(project, plan)
    skip = (type, types.ModuleType, types.BuiltinFunctionType, types.CodeType, str, bytes, int, float)
    while work:
        obj = work.pop()
        if id(obj) in seen or isinstance(obj, skip):
            continue
        seen.add(id(obj))
        if isinstance(obj, types.FunctionType):  # its closure and defaults, not its module
            nested.check(obj.__code__, obj.__module__)
            work.extend(c.cell_contents for c in obj.__closure__ or () if _filled(c))
            work.extend(obj.__defaults__ or ())
            continue
        if isinstance(obj, (types.CoroutineType, types.GeneratorType)):
            code = obj.cr_code if isinstance(obj, types.CoroutineType) else obj.gi_code
            frame = obj.cr_frame if isinstance(obj, types.CoroutineType) else obj.gi_frame
            nested.check(code, frame.f_globals.get("__name__") if frame is not None else None)
            continue  # its frame's values are in the records, which are roots
        cls = type(obj)
        if cls.__module__ in project or cls.__module__.startswith(PINNED_PREFIX):
            _defaults_of(obj, cls, plan, apply, told)
        if isinstance(obj, dict) and "__builtins__" in obj and "__name__" in obj:
            continue  # a module's globals
        work.extend(gc.get_referents(obj))


def _filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


class _NestedCode:
    """Refuses when the run holds a nested function (a closure, a lambda: captured with
    its code, as data) or a suspended frame of one, whose code the new source changed:
    tcc moves module-level functions onto new code, and this one would run old code."""

    def __init__(self, project: set[str], plan: Plan) -> None:
        self.project, self.plan = project, plan
        self.compiled: dict[str, dict[str, set[bytes]]] = {}
        self.told: set[str] = set()

    def check(self, code: types.CodeType, module: Any) -> None:
        if "<locals>" not in code.co_qualname or not isinstance(module, str) \
                or module not in self.project or code.co_qualname in self.told:
            return
        current = self._codes(module).get(code.co_qualname)
        if current and fingerprint(code) not in current:
            self.told.add(code.co_qualname)
            self.plan.refusals.append(
                f"nested function {code.co_qualname}() changed, and the run holds it (in a local, "
                "or a suspended call of it): tcc moves module-level functions onto new code, not "
                "nested ones, which the run carries with their code; make it a module-level "
                "function, or let the run finish on its recorded code")

    def _codes(self, module: str) -> dict[str, set[bytes]]:
        if module not in self.compiled:
            file = str(getattr(sys.modules.get(module), "__file__", None))
            try:
                with open(file, "rb") as f:
                    self.compiled[module] = fingerprints_by_name(f.read(), file)
            except OSError:
                self.compiled[module] = {}
        return self.compiled[module]


def _defaults_of(obj: Any, cls: type, plan: Plan, apply: bool, told: set[tuple[type, str]]) -> None:
    state = getattr(obj, "__dict__", None)
    if not isinstance(state, dict):
        return
    missing: list[tuple[str, Any, bool]] = []  # (field, default, has default)
    if dataclasses.is_dataclass(cls):
        for f in dataclasses.fields(cls):
            if f.name in state:
                continue
            if f.default is not dataclasses.MISSING:
                missing.append((f.name, f.default, True))
            elif f.default_factory is not dataclasses.MISSING:
                missing.append((f.name, f.default_factory, True))
            else:
                missing.append((f.name, None, False))
    elif isinstance(getattr(cls, "model_fields", None), dict) and hasattr(cls, "model_validate"):
        model_fields: dict[str, Any] = getattr(cls, "model_fields")  # noqa: B009 - pydantic v2
        for name, info in model_fields.items():
            if name in state:
                continue
            if info.is_required():
                missing.append((name, None, False))
            else:
                missing.append((name, info, True))
    for name, default, has in missing:
        where = f"{_scripts.script_display_name(cls.__module__)}.{cls.__qualname__}"
        if not has:
            if (cls, name) not in told:
                plan.refusals.append(
                    f"class {where} has a new field {name!r} without a default, and the state "
                    f"holds instances made before it: give the field a default")
                told.add((cls, name))
            continue
        if (cls, name) not in told:
            plan.defaults.append(f"{where}.{name}: its default, on every instance in the state")
            told.add((cls, name))
        if apply:
            try:
                if callable(default) and not hasattr(default, "get_default"):
                    value = default()  # a dataclass default_factory
                elif hasattr(default, "get_default"):
                    value = default.get_default(call_default_factory=True)
                else:
                    value = default
            except Exception as exc:  # noqa: BLE001 - the user's factory: said as a refusal
                plan.refusals.append(f"the default of {where}.{name} raised {type(exc).__name__}: {exc}")
                continue
            state[name] = value


# ------------------------------------------------------------------ upgrade


def _parse_sets(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or not name.isidentifier():
            raise errors.UsageError(f"--set takes NAME=JSON, not {item!r}")
        try:
            out[name] = json.loads(raw)
        except ValueError as exc:
            raise errors.UsageError(f"--set {name}: the value must be JSON ({exc})") from None
    return out


def _parse_renames(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        old, sep, new = item.partition("=")
        if not sep or not old.isidentifier() or not new.isidentifier():
            raise errors.UsageError(f"--rename takes OLD=NEW (two local names), not {item!r}")
        out[old] = new
    return out


def upgrade(store: Store, run_id: str, *, dry_run: bool = False, sets: list[str] = (),  # type: ignore[assignment]
            renames: list[str] = (), steal: bool = False,  # type: ignore[assignment]
            expect_epoch: int | None = None, ignore_tail: bool = False, keep_claim: bool = False) -> Plan:
    """Map the run's newest snapshot onto the current code; unless ``dry_run``, store
    the result as a new snapshot (with an ``upgraded`` event).  Returns the plan; a
    refused upgrade writes nothing (``plan.ok`` is False)."""
    values, rename = _parse_sets(list(sets)), _parse_renames(list(renames))
    run = store.get_run(run_id)
    if run.status in FINAL_STATUSES:
        raise errors.UsageError(f"run {run_id} is already {run.status}; there is nothing to upgrade")
    if run.strategy.split(":")[0] == "replay":
        raise errors.UsageError(f"run {run_id} uses the replay strategy: it has no snapshot to "
                                "upgrade (a replayed run re-executes the current code anyway)")
    found = store.latest_good_snapshot(run_id)
    if found is None:
        raise errors.UsageError(f"run {run_id} has no snapshot to upgrade")
    info, payload = found
    plan = Plan(run_id, info.number)
    if store.journal_length(run_id) != info.journal_len and not (ignore_tail and dry_run):
        plan.refusals.append(
            f"run {run_id} has {store.journal_length(run_id) - info.journal_len} journal record(s) "
            f"after its newest snapshot {info.number} (a call in flight, or the hybrid strategy's "
            "calls since the snapshot): they belong to the old code's frame; `tcc resume --code "
            f"upgrade {run_id}` continues it on its recorded code until its next snapshot and "
            f"upgrades it there (`tcc resume --code pinned {run_id}` finishes it on its recorded "
            "code)")
        plan.after_snapshot = True
        return plan
    manifest = manifest_of(store.events(run_id))
    if not manifest:
        plan.refusals.append(f"run {run_id} has no recorded code, and an upgrade needs the code "
                             "its snapshot was taken in (runs record it from this tcc on)")
        return plan
    entry_module = _scripts.entry_module(run.entry)
    entry_name = entry_module.__name__
    originals = {n: e.get("from", n) for n, e in manifest.items()}

    def current(name: str) -> types.ModuleType | None:
        """A pinned module's name stands for the current module it was pinned from."""
        if not name.startswith(PINNED_PREFIX):
            return None
        original = originals.get(name)
        if original is None:
            raise errors.IncompatibleSnapshotError(
                f"the snapshot names pinned module {name}, which the run's recorded code lacks")
        if original == entry_name or original.startswith(_scripts.SCRIPT_PREFIX):
            return entry_module if original == entry_name else sys.modules.get(original)
        return importlib.import_module(original)

    old = _OldCode(store, manifest)
    changed: dict[int, tuple[types.FunctionType, bytes]] = {}

    def on_changed(gen: Any, func: types.FunctionType, fp: bytes) -> None:
        changed[id(gen)] = (func, fp)

    project = {originals[n] for n in manifest} | set(manifest)

    def edit(obj: Any, pending: list[Any]) -> None:
        frames: list[FrameMap] = []
        for k, (gen, record) in enumerate(pending):
            code = gen.cr_code if isinstance(gen, types.CoroutineType) else gen.gi_code
            fm = FrameMap(code.co_qualname, code.co_filename, id(gen) in changed,
                          internal=code.co_filename.startswith(_TCC_DIR))
            frames.append(fm)
            if not fm.changed:
                if isinstance(record, tuple) and len(record) == 7:
                    fm.site = "unchanged"
                continue
            func, fp = changed[id(gen)]
            module = func.__module__
            module = originals.get(module, module)
            found_old = old.find(module, code.co_qualname, fp)
            if found_old is None:
                fm.refusals.append(
                    f"{code.co_qualname}(): the code it was suspended in is not among the run's "
                    "recorded sources (it changed on disk while the run executed, or lives outside "
                    "the project), so its frame cannot be read")
                continue
            old_code, old_src = found_old
            mapped = _map_frame(old_code, old_src, code, _current_source(code), record, values,
                                rename, fm)
            if mapped is not None:
                pending[k] = (gen, mapped)
        plan.frames = list(reversed(frames))  # outermost first
        plan.nothing_changed = not changed  # the snapshot still moves onto the current modules
        for k, (gen, record) in enumerate(pending):  # what a restore checks, before anything is written
            fm = frames[k]
            if fm.changed and not fm.refusals:
                try:
                    check_frame_record(gen, record)
                except errors.RestoreError as exc:
                    fm.refusals.append(f"{fm.qualname}(): the mapped frame fails validation: {exc}")
        unused = [f"{o}={n}" for o, n in rename.items()
                  if not any(f"{o} -> {n}" in f.renamed for f in frames)]
        if unused:
            plan.refusals.append(f"--rename {', '.join(unused)}: no changed frame has that old local "
                                 "and that new one")
        _fill_defaults([obj, *(rec for _g, rec in pending)], project, plan, apply=not dry_run)
        unknown = set(values) - {n for f in plan.frames for n in f.given}
        if unknown:
            plan.refusals.append(f"--set {', '.join(sorted(unknown))}: no changed frame has a "
                                 "local of that name that needs a value")
        if dry_run or not plan.ok:
            raise _Stop

    try:
        stored = load_payload(unseal(payload, authenticated=True), modules=current,
                              upgrade=on_changed, edit=edit)
    except _Stop:
        return plan
    except errors.RestoreError as exc:
        plan.refusals.append(f"the mapped snapshot does not restore: {exc}")
        return plan
    state = unpack_state(stored, run_id, info.number)
    if state.module_state is not None:  # a pinned module's data goes to its current module
        state = state._replace(module_state={originals.get(k, k): v for k, v in state.module_state.items()})
    new_payload = dump_stored(pack_state(state))
    claimed = store.claim_run(run_id, lease=30.0, steal=steal, expect_epoch=expect_epoch)
    try:
        if store.snapshots(run_id)[-1].number != info.number or \
                store.journal_length(run_id) != info.journal_len:
            plan.refusals.append(f"run {run_id} moved on while it was being upgraded; try again")
            return plan
        CodeRecorder(store, run_id, claimed.epoch, project_root(run.entry), manifest).reset(manifest)
        store.add_event(run_id, UPGRADE_EVENT, {
            "from_snapshot": info.number, "epoch": claimed.epoch,  # (its claim ran nothing)
            "frames": [{"function": f.qualname, "old_line": f.old_line, "new_line": f.new_line,
                        "dropped": f.dropped, "set": f.given, "renamed": f.renamed}
                       for f in plan.frames if f.changed],
            "defaults": plan.defaults}, epoch=claimed.epoch, deferred=True)
        written = store.checkpoint(run_id, claimed.epoch, new_payload)
        plan.written = written.number
    finally:
        try:  # anyone may resume it now (unless this process resumes it at once)
            store.renew_lease(run_id, claimed.epoch, 30.0 if keep_claim else 0.0)
        except errors.TccError:
            pass
    return plan

