"""Static shape checks for frame records: stack depth and NULL slots.

``tcc._native`` validates a record's offset, slot-count bounds, cell slots
and exception before it writes a frame, but it cannot see the bytecode's
data flow.  Two things that only the bytecode knows can still crash the
interpreter when a restored frame resumes (or is closed):

* the **value-stack depth** must be exactly the depth the compiler has at
  that ``YIELD_VALUE`` (every later instruction pops what it assumes is
  there);
* **C NULL slots** are legal only where the bytecode expects them: on the
  value stack only where a NULL can have been pushed (``PUSH_NULL``,
  ``LOAD_GLOBAL``/``LOAD_ATTR``/``LOAD_SUPER_ATTR`` with the low oparg bit,
  3.11's ``LOAD_METHOD``, 3.12+'s ``LOAD_FAST_AND_CLEAR``), and in a plain
  local only if no path from the resumption point reaches an *unchecked*
  load of it (3.12+: ``LOAD_FAST``, ``LOAD_FAST_LOAD_FAST``,
  ``STORE_FAST_LOAD_FAST``) before a store.

:func:`check_record_shape` checks both.  The per-code analysis (an abstract
interpretation of ``dis.get_instructions`` plus the exception table, using
``dis.stack_effect`` exactly like the compiler's own stack-depth pass) is
cached, so a check is a dictionary lookup and a pass over the slots.

Soundness comes first: a record read from a real suspended frame is never
rejected.  Wherever the analysis cannot decide (an opcode ``dis`` does not
know, inconsistent depths at a join, a ``YIELD_VALUE`` the analysis does
not reach), the affected rule is skipped for that code object rather than
guessed.
"""

from __future__ import annotations

import dis
import sys
import types
from typing import Any

__all__ = ["check_record_shape", "expected_stack_depth"]

_PY = sys.version_info[:2]
_OPMAP = dis.opmap


def _op(name: str) -> int:
    return _OPMAP.get(name, -1)


# ------------------------------------------------------------ opcode kinds

# Stack / locals transfer kinds.
_GENERIC = 0  # pops max(0, -effect) slots, pushes max(0, effect) non-NULL ones
_PUSH_NULL = 1  # pushes one NULL
_PAIR = 2  # pops ``a`` slots, pushes [maybe-NULL, value] (or [value, maybe-NULL])
_CALL = 3  # pops 1 - effect slots (callable, NULL/self, args), pushes the result
_SWAP = 4
_COPY = 5
_LOAD_AND_CLEAR = 6  # LOAD_FAST_AND_CLEAR: pushes the local (maybe NULL), clears it
_LOAD = 7  # unchecked LOAD_FAST (3.12+)
_LOAD_LOAD = 8  # LOAD_FAST_LOAD_FAST (3.13)
_STORE = 9  # STORE_FAST
_STORE_STORE = 10  # STORE_FAST_STORE_FAST (3.13)
_STORE_LOAD = 11  # STORE_FAST_LOAD_FAST (3.13)
_LOAD_CHECK = 12  # LOAD_FAST_CHECK: raises on NULL, so the local is bound after it
_DELETE = 13  # DELETE_FAST: the local is NULL after it
_MAKE_CELL = 14  # MAKE_CELL: the slot holds a (non-NULL) cell after it
_RETURN_GENERATOR = 15  # the value sent on the first resume is pushed

# On 3.13 a call's NULL/self slot sits *above* the callable.
_NULL_ABOVE = _PY >= (3, 13)

_NO_FALLTHROUGH = {
    _op(name)
    for name in (
        "RETURN_VALUE",
        "RETURN_CONST",
        "RAISE_VARARGS",
        "RERAISE",
        "JUMP_FORWARD",
        "JUMP_BACKWARD",
        "JUMP_BACKWARD_NO_INTERRUPT",
        "JUMP_ABSOLUTE",
        "JUMP",
        "JUMP_NO_INTERRUPT",
    )
} - {-1}

_JUMPS = set(getattr(dis, "hasjump", ())) | set(dis.hasjrel) | set(dis.hasjabs)

_CALLS = {_op("CALL"), _op("CALL_KW"), _op("CALL_FUNCTION_EX")} - {-1}

_YIELD_VALUE = _op("YIELD_VALUE")

# CPython 3.13.0's CALL_LIST_APPEND specialisation assumes that a call site
# whose callable is ``list.append`` has a non-NULL self, and dereferences it
# (``o.append(x)`` with ``o = list`` after a few list ``o`` segfaults in pure
# Python).  A NULL self next to ``list.append`` is therefore refused on 3.13.
_LIST_APPEND = list.append
_GET_ITER = _op("GET_ITER")
_GET_ANEXT = _op("GET_ANEXT")
_FOR_ITER = _op("FOR_ITER")
_PUSH_EXC_INFO = _op("PUSH_EXC_INFO")
_EXTENDED_ARG = _op("EXTENDED_ARG")

# Loads of plain locals that dereference without a NULL check exist only on
# 3.12+ (3.11's LOAD_FAST raises UnboundLocalError on NULL).
_UNCHECKED_LOADS = _PY >= (3, 12)


def _kind(op: int, arg: int | None) -> tuple[int, int]:
    """(kind, pops) of one instruction; ``pops`` only matters for _PAIR."""
    name = dis.opname[op]
    if name == "PUSH_NULL":
        return _PUSH_NULL, 0
    if name == "LOAD_GLOBAL" and arg is not None and arg & 1:
        return _PAIR, 0
    if name == "LOAD_METHOD" and _PY < (3, 12):
        return _PAIR, 1
    if name == "LOAD_ATTR" and _PY >= (3, 12) and arg is not None and arg & 1:
        return _PAIR, 1
    if name == "LOAD_SUPER_ATTR" and arg is not None and arg & 1:
        return _PAIR, 3
    if op in _CALLS:
        return _CALL, 0
    if name == "SWAP":
        return _SWAP, 0
    if name == "COPY":
        return _COPY, 0
    if name == "RETURN_GENERATOR":
        return _RETURN_GENERATOR, 0
    if name == "LOAD_FAST_AND_CLEAR":
        return _LOAD_AND_CLEAR, 0
    if name == "MAKE_CELL":
        return _MAKE_CELL, 0
    if name == "DELETE_FAST":
        return _DELETE, 0
    if name == "STORE_FAST":
        return _STORE, 0
    if name == "STORE_FAST_STORE_FAST":
        return _STORE_STORE, 0
    if _UNCHECKED_LOADS:
        if name == "LOAD_FAST":
            return _LOAD, 0
        if name == "LOAD_FAST_LOAD_FAST":
            return _LOAD_LOAD, 0
        if name == "STORE_FAST_LOAD_FAST":
            return _STORE_LOAD, 0
        if name == "LOAD_FAST_CHECK":
            return _LOAD_CHECK, 0
    return _GENERIC, 0


class _Undecidable(Exception):
    """The analysis cannot model this code; the affected rule is skipped."""


# ------------------------------------------------------------- per-code data


class _Instr:
    __slots__ = (
        "offset",
        "kind",
        "arg",
        "pops",
        "op",
        "fall_effect",
        "jump_effect",
        "target",
        "falls",
        "handler",
        "hdepth",
        "hlasti",
        "line",
    )

    offset: int
    kind: int
    arg: int
    pops: int
    op: int
    fall_effect: int
    jump_effect: int
    target: int
    falls: bool
    handler: int
    hdepth: int
    hlasti: int
    line: int | None


class _Point:
    """What the analysis knows about one suspension point."""

    __slots__ = ("depth", "null_ok", "method_self", "start", "iters", "excs", "lastis")

    def __init__(self, depth: int | None, null_ok: int, method_self: int, start: int,
                 iters: int = 0, excs: int = 0, lastis: int = 0) -> None:
        self.depth = depth  # exact value-stack depth while suspended; None: unknown
        self.null_ok = null_ok  # bit i: stack[i] may legally be NULL
        # bit i: stack[i] is the NULL-or-self half of a method load (3.13 only)
        self.method_self = method_self
        self.start = start  # index of the instruction a resume runs first
        # Slots the bytecode uses without a type check (rule 4):
        self.iters = iters  # bit i: stack[i] is a for loop's iterator; FOR_ITER calls its tp_iternext
        self.excs = excs  # bit i: stack[i] is a caught or saved exception (or None)
        self.lastis = lastis  # bit i: stack[i] is a handler's lasti; RERAISE jumps to it


class _CodeInfo:
    __slots__ = (
        "code",
        "qualname",
        "nlocalsplus",
        "plain_locals",
        "names",
        "instrs",
        "points",
        "flow_cache",
        "flow_ok",
        "decided",
    )

    def __init__(self, code: types.CodeType) -> None:
        self.code = code  # keeps id(code) from being reused while cached
        self.qualname = code.co_qualname
        names = list(code.co_varnames)
        names += [c for c in code.co_cellvars if c not in code.co_varnames]
        names += list(code.co_freevars)
        self.names = names
        self.nlocalsplus = len(names)
        cells = set(code.co_cellvars)
        self.plain_locals = tuple(
            i for i, name in enumerate(code.co_varnames) if name not in cells
        )
        self.points: dict[int, _Point] = {}
        self.flow_cache: dict[tuple[int, int, int], tuple[int, int] | None] = {}
        self.flow_ok = _UNCHECKED_LOADS  # rule 3 applies
        self.decided = True  # the analysis modelled this code
        try:
            self.instrs = _decode(code)
        except _Undecidable:
            self.instrs = []
            self.flow_ok = self.decided = False
            return
        self._analyse_stack()

    # -- rule 1 and 2: forward from the entry --------------------------------

    def _analyse_stack(self) -> None:
        instrs = self.instrs
        n = len(instrs)
        states: list[tuple[int, ...] | None] = [None] * n
        try:
            if n:
                _join(states, 0, (0, 0, 0, 0, 0, 0))
            work = [0] if n else []
            while work:
                i = work.pop()
                state = states[i]
                assert state is not None
                ins = instrs[i]
                if ins.handler >= 0:
                    depth, mask, pmask, imask, emask, lmask = state
                    if ins.hdepth > depth:
                        raise _Undecidable
                    keep = (1 << ins.hdepth) - 1
                    top = ins.hdepth + ins.hlasti  # the exception; lasti below it if pushed
                    hstate = (top + 1, mask & keep, pmask & keep, imask & keep,
                              (emask & keep) | (1 << top),
                              (lmask & keep) | ((1 << ins.hdepth) if ins.hlasti else 0))
                    if _join(states, ins.handler, hstate):
                        work.append(ins.handler)
                if ins.falls and i + 1 < n:
                    out = _step(ins, state, ins.fall_effect)
                    if _join(states, i + 1, out):
                        work.append(i + 1)
                if ins.target >= 0:
                    out = _step(ins, state, ins.jump_effect)
                    if _join(states, ins.target, out):
                        work.append(ins.target)
        except _Undecidable:
            states = [None] * n
            self.flow_ok = self.decided = False
        for i, ins in enumerate(instrs):
            if ins.kind == _RETURN_GENERATOR and i + 1 < n:
                # A fresh (CREATED) frame: its first resume runs the
                # instruction after RETURN_GENERATOR with an empty stack.
                self.points[-1] = _Point(0, 0, 0, i + 1)
            elif _is_yield(self.code, ins) and i + 1 < n:
                state = states[i]
                if state is None or state[0] < 1:
                    point = _Point(None, -1, 0, i + 1)
                else:
                    depth, mask, pmask, imask, emask, lmask = state
                    keep = (1 << (depth - 1)) - 1
                    point = _Point(depth - 1, mask & keep, pmask & keep if _NULL_ABOVE else 0, i + 1,
                                   imask & keep, emask & keep, lmask & keep)
                self.points[ins.offset // 2] = point

    # -- rule 3: forward from the resumption point, with the record's NULLs --

    def unchecked_null_read(
        self, point: _Point, depth: int, lmask: int, smask: int
    ) -> tuple[int, int] | None:
        """First (instruction index, local) an unchecked load of a maybe-NULL local hits."""
        key = (point.start, lmask, smask)
        try:
            return self.flow_cache[key]
        except KeyError:
            pass
        try:
            result = _flow(self.instrs, point.start, depth, lmask, smask, self.plain_mask())
        except _Undecidable:
            result = None
        if len(self.flow_cache) > 512:
            self.flow_cache.clear()
        self.flow_cache[key] = result
        return result

    def plain_mask(self) -> int:
        m = 0
        for i in self.plain_locals:
            m |= 1 << i
        return m


def _is_yield(code: types.CodeType, ins: _Instr) -> bool:
    raw = code.co_code
    return raw[ins.offset] == _YIELD_VALUE


def _decode(code: types.CodeType) -> list[_Instr]:
    """Instructions with their effects, successors and exception handlers."""
    raw = list(dis.get_instructions(code))
    index = {ins.offset: i for i, ins in enumerate(raw)}
    out: list[_Instr] = []
    for ins in raw:
        op = ins.opcode
        arg = ins.arg if op >= dis.HAVE_ARGUMENT else None
        x = _Instr()
        x.offset = ins.offset
        x.kind, x.pops = _kind(op, arg)
        x.op = op
        x.arg = arg or 0
        positions = getattr(ins, "positions", None)
        x.line = positions.lineno if positions is not None else None
        x.handler, x.hdepth, x.hlasti = -1, 0, 0
        if op == _EXTENDED_ARG:
            x.fall_effect = x.jump_effect = 0
            x.target, x.falls = -1, True
            out.append(x)
            continue
        try:
            x.fall_effect = dis.stack_effect(op, arg, jump=False)
            if op in _JUMPS:
                x.jump_effect = dis.stack_effect(op, arg, jump=True)
            else:
                x.jump_effect = 0
        except (ValueError, TypeError):
            raise _Undecidable from None
        if x.kind == _RETURN_GENERATOR:
            x.fall_effect = 1  # 3.11/3.12 report 0: the prologue is not in the model
        if op in _JUMPS:
            target = getattr(ins, "jump_target", None)
            if target is None:
                target = ins.argval
            if not isinstance(target, int) or target not in index:
                raise _Undecidable
            x.target = index[target]
        else:
            x.target = -1
        x.falls = op not in _NO_FALLTHROUGH
        out.append(x)
    for start, end, target, depth, lasti in _exception_table(code):
        if target not in index:
            raise _Undecidable
        h = index[target]
        for i, ins in enumerate(raw):
            if start <= ins.offset < end:
                out[i].handler, out[i].hdepth, out[i].hlasti = h, depth, int(lasti)
    return out


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    b = data[pos]
    pos += 1
    val = b & 63
    while b & 64:
        b = data[pos]
        pos += 1
        val = (val << 6) | (b & 63)
    return val, pos


def _exception_table(code: types.CodeType) -> list[tuple[int, int, int, int, bool]]:
    """``co_exceptiontable`` as (start, end, target, depth, lasti), byte offsets, end exclusive."""
    data = code.co_exceptiontable
    entries = []
    pos = 0
    try:
        while pos < len(data):
            start, pos = _varint(data, pos)
            length, pos = _varint(data, pos)
            target, pos = _varint(data, pos)
            dl, pos = _varint(data, pos)
            entries.append((start * 2, (start + length) * 2, target * 2, dl >> 1, bool(dl & 1)))
    except IndexError:
        raise _Undecidable from None
    return entries


def _join(states: list[Any], i: int, state: tuple[int, ...]) -> bool:
    """Merge ``state`` into ``states[i]``; True if it changed."""
    old = states[i]
    if old is None:
        states[i] = state
        return True
    if old[0] != state[0]:
        raise _Undecidable  # inconsistent depths: not a layout we understand
    merged = tuple(a | b for a, b in zip(old, state))
    merged = (old[0],) + merged[1:]
    if merged != old:
        states[i] = merged
        return True
    return False


def _step(ins: _Instr, state: tuple[int, ...], effect: int) -> tuple[int, ...]:
    """Stack transfer (depth, may-NULL mask, method-self mask, iterator, exception
    and lasti masks) for rules 2 and 4."""
    depth, mask, pmask, imask, emask, lmask = state
    kind = ins.kind
    if kind == _PUSH_NULL or kind == _LOAD_AND_CLEAR:
        return depth + 1, mask | (1 << depth), pmask, imask, emask, lmask
    new, mask = _stack_step(ins, depth, mask, effect)
    pmask = _stack_step(ins, depth, pmask, effect)[1]
    imask, emask, lmask = (_type_step(ins, depth, m, effect) for m in (imask, emask, lmask))
    if ins.op == _GET_ITER and new >= 1:
        imask |= 1 << (new - 1)
    elif ins.op == _FOR_ITER and 1 <= depth <= new:
        # the iterator FOR_ITER calls (a genexpr loads it with LOAD_FAST .0,
        # not GET_ITER) stays below the value it pushes
        imask |= 1 << (depth - 1)
    elif ins.op == _PUSH_EXC_INFO and new >= 2:  # [exc] -> [previous exception, exc]
        emask |= 3 << (new - 2)
    return new, mask, pmask, imask, emask, lmask


def _type_step(ins: _Instr, depth: int, mask: int, effect: int) -> int:
    """Transfer of a "this slot holds a value of kind X" mask: nothing pushed has it."""
    if ins.kind == _PAIR:
        return mask & ((1 << max(0, depth - ins.pops)) - 1)
    return _stack_step(ins, depth, mask, effect)[1]


def _stack_step(ins: _Instr, depth: int, mask: int, effect: int) -> tuple[int, int]:
    kind = ins.kind
    new = depth + effect
    if new < 0:
        raise _Undecidable
    if kind == _PAIR:
        base = depth - ins.pops
        if base < 0 or base + 2 != new:
            raise _Undecidable
        mask &= (1 << base) - 1
        return new, mask | (1 << (base + 1 if _NULL_ABOVE else base))
    if kind == _CALL:
        if new < 1:
            raise _Undecidable
        return new, mask & ((1 << (new - 1)) - 1)
    if kind == _SWAP:
        a, b = depth - 1, depth - ins.arg
        if b < 0 or effect != 0:
            raise _Undecidable
        ba, bb = (mask >> a) & 1, (mask >> b) & 1
        mask &= ~((1 << a) | (1 << b))
        return depth, mask | (bb << a) | (ba << b)
    if kind == _COPY:
        src = depth - ins.arg
        if src < 0 or effect != 1:
            raise _Undecidable
        return depth + 1, mask | (((mask >> src) & 1) << depth)
    if effect < 0:
        mask &= (1 << new) - 1
    # Everything else pushes non-NULL values.  Slots it may pop and push
    # back beyond max(0, -effect) keep their old bit: conservative.
    return new, mask


def _flow(
    instrs: list[_Instr], start: int, depth: int, lmask: int, smask: int, plain: int
) -> tuple[int, int] | None:
    """Forward may-NULL propagation over locals and stack from a resume.

    Returns (instruction index, local index) of the first unchecked load of
    a plain local that may be NULL, or None.  The analysis mirrors the
    compiler's own (flowgraph.c ``scan_block_for_locals``), which turns every
    load of a maybe-unbound local into ``LOAD_FAST_CHECK``; starting from the
    NULLs of a real frame it can therefore never find a hit.
    """
    n = len(instrs)
    states: list[tuple[int, int, int] | None] = [None] * n
    work: list[int] = []
    # The value sent by send() is pushed before the first instruction runs.
    first = (depth + 1, smask, lmask)
    _join(states, start, first)
    work.append(start)
    # throw()/close() unwind from the YIELD_VALUE (or RETURN_GENERATOR)
    # just before ``start``: same state, that instruction's handler.
    prev = instrs[start - 1] if start > 0 else None
    if prev is not None and prev.handler >= 0:
        hs = _handler_state(prev, first)
        if _join(states, prev.handler, hs):
            work.append(prev.handler)
    while work:
        i = work.pop()
        state = states[i]
        assert state is not None
        ins = instrs[i]
        if ins.handler >= 0:
            if _join(states, ins.handler, _handler_state(ins, state)):
                work.append(ins.handler)
        depth, smask, lmask = state
        kind = ins.kind
        arg = ins.arg
        hit = -1
        if kind == _LOAD:
            if lmask >> arg & 1:
                hit = arg
        elif kind == _LOAD_LOAD:
            a, b = arg >> 4, arg & 15
            if lmask >> a & 1:
                hit = a
            elif lmask >> b & 1:
                hit = b
        elif kind == _STORE_LOAD:
            s, b = arg >> 4, arg & 15
            stored = (lmask & ~(1 << s)) | (((smask >> (depth - 1)) & 1) << s)
            if stored >> b & 1:
                hit = b
        if hit >= 0 and plain >> hit & 1:
            return i, hit
        for nxt, effect in ((i + 1, ins.fall_effect), (ins.target, ins.jump_effect)):
            if nxt < 0 or nxt >= n or (nxt == i + 1 and not ins.falls):
                continue
            out = _flow_step(ins, depth, smask, lmask, effect)
            if _join(states, nxt, out):
                work.append(nxt)
    return None


def _handler_state(ins: _Instr, state: tuple[int, int, int]) -> tuple[int, int, int]:
    depth, smask, lmask = state
    if ins.hdepth > depth:
        raise _Undecidable
    return ins.hdepth + ins.hlasti + 1, smask & ((1 << ins.hdepth) - 1), lmask


def _flow_step(
    ins: _Instr, depth: int, smask: int, lmask: int, effect: int
) -> tuple[int, int, int]:
    kind = ins.kind
    arg = ins.arg
    if kind == _PUSH_NULL:
        return depth + 1, smask | (1 << depth), lmask
    if kind == _LOAD_AND_CLEAR:
        return depth + 1, smask | (((lmask >> arg) & 1) << depth), lmask | (1 << arg)
    if kind == _STORE or kind == _STORE_STORE or kind == _STORE_LOAD:
        if depth < 1:
            raise _Undecidable
        bit = (smask >> (depth - 1)) & 1
        lmask = (lmask & ~(1 << arg)) | (bit << arg) if kind == _STORE else lmask
        if kind == _STORE_STORE:
            if depth < 2:
                raise _Undecidable
            a, b = arg >> 4, arg & 15
            bit2 = (smask >> (depth - 2)) & 1
            lmask = (lmask & ~(1 << a)) | (bit << a)
            lmask = (lmask & ~(1 << b)) | (bit2 << b)
        elif kind == _STORE_LOAD:
            s, b = arg >> 4, arg & 15
            lmask = (lmask & ~(1 << s)) | (bit << s)
        new = depth + effect
        if new < 0:
            raise _Undecidable
        return new, smask & ((1 << min(new, depth - 1)) - 1), lmask
    if kind == _LOAD_CHECK or kind == _MAKE_CELL:
        lmask &= ~(1 << arg)
    elif kind == _DELETE:
        lmask |= 1 << arg
    new, smask = _stack_step(ins, depth, smask, effect)
    return new, smask, lmask


# ------------------------------------------------------------------- cache

_CACHE: dict[int, _CodeInfo] = {}
_CACHE_LIMIT = 4096


def _info(code: types.CodeType) -> _CodeInfo:
    info = _CACHE.get(id(code))
    if info is None or info.code is not code:
        info = _CodeInfo(code)
        if len(_CACHE) >= _CACHE_LIMIT:
            _CACHE.clear()
        _CACHE[id(code)] = info
    return info


# --------------------------------------------------------------------- API


def expected_stack_depth(code: types.CodeType, offset: int) -> int | None:
    """Exact value-stack depth of a frame of ``code`` suspended at ``offset``.

    ``offset`` is the code-unit index of the ``YIELD_VALUE`` (``-1`` for an
    unstarted frame).  None if the analysis cannot tell.
    """
    point = _info(code).points.get(offset)
    return None if point is None else point.depth


def _where(info: _CodeInfo, offset: int) -> str:
    return f"{info.qualname}() at offset {offset}"


def _slot_name(info: _CodeInfo, index: int) -> str:
    if index < info.nlocalsplus:
        return f"local {info.names[index]!r} (slot {index})"
    return f"stack[{index - info.nlocalsplus}] (slot {index})"


def _is_iterator(value: Any) -> bool:
    return getattr(type(value), "__next__", None) is not None


def _check_types(info: _CodeInfo, offset: int, point: _Point, slots: tuple[Any, ...], null: Any) -> None:
    """Rule 4: slots the bytecode uses without a type check hold the right kind of object."""
    nlp = info.nlocalsplus
    code = info.code
    if (nlp and code.co_varnames[:1] == (".0",) and code.co_argcount == 1
            and not any(ins.op == _GET_ANEXT for ins in info.instrs)):
        # a (sync) generator expression or comprehension: its body runs
        # FOR_ITER straight on the argument (an async one awaits __anext__)
        value = slots[0]
        if value is not null and not _is_iterator(value):
            raise ValueError(
                f"record of {_where(info, offset)} has a {type(value).__name__} in "
                f"{_slot_name(info, 0)}, the iterator the generator expression loops over")
    units = len(code.co_code) // 2
    for i in range(nlp, len(slots)):
        k = i - nlp
        value = slots[i]
        if value is null:
            continue
        if (point.iters >> k) & 1 and not _is_iterator(value):
            raise ValueError(
                f"record of {_where(info, offset)} has a {type(value).__name__} in "
                f"{_slot_name(info, i)}, where a for loop keeps its iterator")
        if (point.excs >> k) & 1 and not (value is None or isinstance(value, BaseException)):
            raise ValueError(
                f"record of {_where(info, offset)} has a {type(value).__name__} in "
                f"{_slot_name(info, i)}, where an except block keeps an exception")
        if (point.lastis >> k) & 1 and not (isinstance(value, int) and 0 <= value <= units):
            raise ValueError(
                f"record of {_where(info, offset)} has {value!r} in {_slot_name(info, i)}, "
                f"where an exception handler keeps the offset (0..{units}) it re-raises at")


def check_record_shape(code: types.CodeType, offset: int, slots: tuple[Any, ...], null: Any) -> None:
    """Raise ValueError unless ``slots`` has a shape ``code`` can resume at ``offset``.

    ``offset`` is the code-unit index of the ``YIELD_VALUE`` the frame is
    suspended at (-1: unstarted), ``slots`` is ``localsplus[0:stacktop]``
    with C NULLs represented by ``null``.  Rejects:

    1. a value stack (``len(slots)`` minus the number of locals, cells and
       free variables) whose depth differs from the compiler's at that point;
    2. a NULL in a value-stack slot into which no NULL can have been pushed;
    3. (3.12+) a NULL in a plain local that some path from the resumption
       point (including the exception handlers ``throw()``/``close()`` run)
       reads with an unchecked load before storing to it;
    4. a value of the wrong kind where the interpreter uses it without a type
       check: a non-iterator where a for loop keeps its iterator (FOR_ITER
       calls ``tp_iternext`` directly) or in a generator expression's ``.0``,
       a non-exception where an except block keeps the caught or saved
       exception, a handler's re-raise offset that is not an int inside the
       code (found by fuzzing: each of these crashed the interpreter).

    Offsets that are not suspension points are left to ``tcc._native``.
    """
    info = _info(code)
    point = info.points.get(offset)
    if point is None:
        return
    nlp = info.nlocalsplus
    n = len(slots)
    depth = n - nlp
    if point.depth is not None and depth != point.depth:
        raise ValueError(
            f"record of {_where(info, offset)} has {depth} value-stack entries; "
            f"the bytecode has exactly {point.depth} there"
        )
    if depth < 0:
        return  # the native check reports the slot count
    lmask = 0
    smask = 0
    for i in info.plain_locals:
        if slots[i] is null:
            lmask |= 1 << i
    null_ok = point.null_ok
    for i in range(nlp, n):
        if slots[i] is null:
            k = i - nlp
            if not (null_ok >> k) & 1:
                raise ValueError(
                    f"record of {_where(info, offset)} has NULL in "
                    f"{_slot_name(info, i)}, where the bytecode never has a NULL"
                )
            if (point.method_self >> k) & 1 and slots[i - 1] is _LIST_APPEND:
                raise ValueError(
                    f"record of {_where(info, offset)} has NULL in "
                    f"{_slot_name(info, i)} (the self of a method call) next to "
                    "list.append, which a specialised CALL_LIST_APPEND would "
                    "dereference"
                )
            smask |= 1 << k
    _check_types(info, offset, point, slots, null)
    if not info.flow_ok or (lmask == 0 and smask == 0):
        return
    hit = info.unchecked_null_read(point, depth, lmask, smask)
    if hit is None:
        return
    # The analysis is distributive: one NULL alone reaches the read.
    culprit = None
    for i in range(n):
        if i < nlp:
            single = (1 << i, 0) if lmask >> i & 1 else None
        else:
            single = (0, 1 << (i - nlp)) if smask >> (i - nlp) & 1 else None
        if single is not None and info.unchecked_null_read(point, depth, *single) is not None:
            culprit = i
            break
    at, local = hit
    ins = info.instrs[at]
    line = f" (line {ins.line})" if ins.line is not None else ""
    what = _slot_name(info, culprit) if culprit is not None else "a NULL slot"
    raise ValueError(
        f"record of {_where(info, offset)} has NULL in {what}, but after resuming "
        f"the bytecode reads local {info.names[local]!r} without a check at "
        f"offset {ins.offset // 2}{line}"
    )
