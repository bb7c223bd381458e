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
  ``STORE_FAST_LOAD_FAST``) before a store;
* the **kind of object** in a value-stack slot matters wherever an
  instruction uses it without a type check: ``LIST_APPEND`` casts its list,
  ``MAP_ADD`` its dict, ``FOR_ITER`` calls its iterator's ``tp_iternext``,
  ``POP_EXCEPT``/``RERAISE``/``WITH_EXCEPT_START`` trust their exceptions,
  and so on (see ``_consumes``).  Each stack slot is labelled with the
  instruction (and output) that produced its value; an instruction that
  trusts a slot's type imposes that type on the slot's label, and so does a
  producer whose result has a known exact type (``BUILD_LIST`` makes a list,
  an exception handler is entered with an exception).  The slots of a record
  must then have those kinds, tested by the interpreter's own checks on the
  object's real type (``tcc._native.check_kinds``), never by ``isinstance``,
  which a ``__class__`` property fools.

:func:`check_record_shape` checks all three.  The per-code analysis (an
abstract interpretation of ``dis.get_instructions`` plus the exception table,
using ``dis.stack_effect`` exactly like the compiler's own stack-depth pass)
is cached, so a check is a dictionary lookup and a pass over the slots.

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
from collections.abc import Callable
from typing import Any

from . import _frames

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
_GET_ANEXT = _op("GET_ANEXT")
_PUSH_EXC_INFO = _op("PUSH_EXC_INFO")
_EXTENDED_ARG = _op("EXTENDED_ARG")

# Loads of plain locals that dereference without a NULL check exist only on
# 3.12+ (3.11's LOAD_FAST raises UnboundLocalError on NULL).
_UNCHECKED_LOADS = _PY >= (3, 12)


# ------------------------------------------------------------- slot kinds

# What a slot must hold because an instruction uses it without a type check.
# Flags with the values of tcc._native's KIND_* (its check_kinds() tests them
# with the interpreter's own checks; _kinds_ok() below is the fallback).
KIND_ITER = 1  # PyIter_Check: FOR_ITER calls tp_iternext directly
KIND_EXC = 2  # an exception instance (PyExceptionInstance_Check)
KIND_EXC_OR_NONE = 4
KIND_LASTI = 8  # an exact int inside the code: RERAISE jumps to it
KIND_LIST = 16  # exact types: the interpreter casts the object
KIND_SET = 32
KIND_DICT = 64
KIND_TUPLE = 128
KIND_EXC_ITEMS = 256  # a list of exceptions or None: what except* re-raises

_KIND_WORDS = (
    (KIND_EXC_ITEMS, "a list of exceptions or None"),
    (KIND_ITER, "an iterator"),
    (KIND_EXC, "an exception"),
    (KIND_EXC_OR_NONE, "an exception or None"),
    (KIND_LASTI, "an int offset inside the code"),
    (KIND_LIST, "a list"),
    (KIND_SET, "a set"),
    (KIND_DICT, "a dict"),
    (KIND_TUPLE, "a tuple"),
)

# Labels: who produced the value in a stack slot.  An instruction's outputs
# are (index << _OUT_BITS) | output; what unwinding pushes before a handler
# runs counts as two more outputs of the handler's first instruction.
_UNKNOWN = -1  # paths that meet disagree: no one producer
_OUT_BITS = 20
_OUT_EXC = (1 << _OUT_BITS) - 1  # the exception a handler is entered with
_OUT_LASTI = (1 << _OUT_BITS) - 2  # the offset a handler with "lasti" gets below it


def _label(index: int, output: int) -> int:
    return (index << _OUT_BITS) | output if output < _OUT_LASTI else _UNKNOWN


# How many slots an instruction consumes from the top of the stack: the rest
# of its stack effect is what it pushes, each a new value labelled with it.
# Counting a slot that an instruction leaves alone as consumed only renames
# its value (its kind then comes from the instructions that use it), so
# when in doubt a count errs upwards; an instruction named nowhere here is
# taken to consume the whole stack.  From the interpreters' bytecodes.c
# (3.12, 3.13; ceval.c in 3.11); calls, method loads, COPY, SWAP and pushes of
# NULL are handled by their _kind.
_POPS: dict[str, Callable[[int], int]] = {}
for _name in ("UNARY_POSITIVE", "UNARY_NEGATIVE", "UNARY_NOT", "UNARY_INVERT", "TO_BOOL",
              "GET_ITER", "GET_AITER", "GET_AWAITABLE", "GET_YIELD_FROM_ITER", "LIST_TO_TUPLE",
              "ASYNC_GEN_WRAP", "YIELD_VALUE", "CALL_INTRINSIC_1", "FORMAT_SIMPLE",
              "CONVERT_VALUE", "LOAD_FROM_DICT_OR_GLOBALS", "LOAD_FROM_DICT_OR_DEREF",
              "STORE_FAST_LOAD_FAST", "UNPACK_SEQUENCE", "UNPACK_EX", "BEFORE_WITH",
              "BEFORE_ASYNC_WITH", "LOAD_ATTR", "LOAD_METHOD",
              "PUSH_EXC_INFO",  # (exc -- previous, exc): _step keeps exc's label
              "CHECK_EXC_MATCH"):  # (left, right -- left, match): only right is replaced
    _POPS[_name] = lambda arg: 1
for _name in ("BINARY_SUBSCR", "BINARY_OP", "COMPARE_OP", "IS_OP", "CONTAINS_OP",
              "CALL_INTRINSIC_2", "IMPORT_NAME", "PREP_RERAISE_STAR", "CHECK_EG_MATCH",
              "END_SEND", "FORMAT_WITH_SPEC", "SET_FUNCTION_ATTRIBUTE"):
    _POPS[_name] = lambda arg: 2
for _name in ("BINARY_SLICE", "MATCH_CLASS", "CLEANUP_THROW", "LOAD_SUPER_ATTR"):
    _POPS[_name] = lambda arg: 3
for _name in ("BUILD_TUPLE", "BUILD_LIST", "BUILD_SET", "BUILD_STRING", "BUILD_SLICE"):
    _POPS[_name] = lambda arg: arg
_POPS["BUILD_MAP"] = lambda arg: 2 * arg
_POPS["BUILD_CONST_KEY_MAP"] = lambda arg: arg + 1
_POPS["FORMAT_VALUE"] = lambda arg: 2 if arg & 4 else 1  # FVS_HAVE_SPEC
if _PY >= (3, 13):
    _POPS["MAKE_FUNCTION"] = lambda arg: 1  # gh-104584: attributes moved to SET_FUNCTION_ATTRIBUTE
else:
    _POPS["MAKE_FUNCTION"] = lambda arg: 1 + (arg & 15).bit_count()

# Instructions that only push or only pop: they consume max(0, -effect).
_PUSH_OR_POP = frozenset((
    "NOP", "RESUME", "CACHE", "EXTENDED_ARG", "POP_TOP", "END_FOR", "LOAD_CONST",
    "LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_LOAD_FAST", "LOAD_CLOSURE", "LOAD_DEREF",
    "LOAD_CLASSDEREF", "LOAD_GLOBAL", "LOAD_NAME", "LOAD_BUILD_CLASS", "LOAD_ASSERTION_ERROR",
    "LOAD_LOCALS", "RETURN_CONST", "RETURN_VALUE", "STORE_FAST", "STORE_FAST_STORE_FAST",
    "STORE_DEREF", "STORE_GLOBAL", "STORE_NAME", "STORE_ATTR", "STORE_SUBSCR", "STORE_SLICE",
    "DELETE_FAST", "DELETE_DEREF", "DELETE_GLOBAL", "DELETE_NAME", "DELETE_ATTR",
    "DELETE_SUBSCR", "POP_EXCEPT", "RAISE_VARARGS", "RERAISE", "PRINT_EXPR", "IMPORT_STAR",
    "SETUP_ANNOTATIONS", "MAKE_CELL", "COPY_FREE_VARS", "KW_NAMES", "LIST_APPEND", "SET_ADD",
    "LIST_EXTEND", "SET_UPDATE", "MAP_ADD", "DICT_UPDATE", "DICT_MERGE", "END_ASYNC_FOR",
    "EXIT_INIT_CHECK", "GET_LEN", "MATCH_MAPPING", "MATCH_SEQUENCE", "MATCH_KEYS",
    "IMPORT_FROM", "GET_ANEXT", "WITH_EXCEPT_START", "FOR_ITER", "JUMP_FORWARD",
    "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP_IF_FALSE_OR_POP",
    "JUMP_IF_TRUE_OR_POP", "POP_JUMP_IF_FALSE", "POP_JUMP_IF_TRUE", "POP_JUMP_IF_NONE",
    "POP_JUMP_IF_NOT_NONE", "POP_JUMP_FORWARD_IF_FALSE", "POP_JUMP_FORWARD_IF_TRUE",
    "POP_JUMP_FORWARD_IF_NONE", "POP_JUMP_FORWARD_IF_NOT_NONE", "POP_JUMP_BACKWARD_IF_FALSE",
    "POP_JUMP_BACKWARD_IF_TRUE", "POP_JUMP_BACKWARD_IF_NONE", "POP_JUMP_BACKWARD_IF_NOT_NONE",
    "PRECALL",  # 3.11: the model pops its arguments here, CALL pops the rest
))


def _pops(name: str, arg: int, effect: int) -> int | None:
    """Slots consumed by a generic instruction (None: not known, assume all)."""
    if name == "SEND":  # (receiver, value -- receiver, result); 3.11's jump also pops the receiver
        return 1 + max(0, -effect)
    fn = _POPS.get(name)
    if fn is not None:
        return fn(arg)
    if name in _PUSH_OR_POP:
        return max(0, -effect)
    return None


if _PY >= (3, 12):
    _INTRINSIC_LIST_TO_TUPLE = dis._intrinsic_1_descs.index("INTRINSIC_LIST_TO_TUPLE")  # type: ignore[attr-defined]
    _INTRINSIC_STOPITERATION_ERROR = dis._intrinsic_1_descs.index(  # type: ignore[attr-defined]
        "INTRINSIC_STOPITERATION_ERROR")
    _INTRINSIC_PREP_RERAISE_STAR = dis._intrinsic_2_descs.index(  # type: ignore[attr-defined]
        "INTRINSIC_PREP_RERAISE_STAR")
else:
    _INTRINSIC_LIST_TO_TUPLE = _INTRINSIC_STOPITERATION_ERROR = _INTRINSIC_PREP_RERAISE_STAR = -1


def _consumes(name: str, arg: int) -> tuple[tuple[int, int], ...]:
    """(position from the top, kind) of each slot ``name`` uses without a type check.

    From bytecodes.c (3.12, 3.13) and ceval.c (3.11).  Not listed, because the
    interpreter checks the type: SET_ADD's PySet_Add, DICT_UPDATE/DICT_MERGE's
    dict_merge, 3.11's LIST_TO_TUPLE, SEND and GET_AWAITABLE/GET_ANEXT's
    receivers, CALL_FUNCTION_EX's arguments, BUILD_STRING's parts, callables
    and the self of method calls (the specialisations test exact types before
    they trust one: FOR_ITER_LIST, SEND_GEN, CALL_*...), except where NULL is
    involved, which rule 2 covers.  Kinds stricter than needed (SET_ADD's set)
    are given anyway where every real frame has them: they cost nothing.
    """
    if name in ("LIST_APPEND", "LIST_EXTEND"):
        return ((arg, KIND_LIST),)
    if name in ("SET_ADD", "SET_UPDATE"):
        return ((arg, KIND_SET),)
    if name == "MAP_ADD":  # (dict, unused[oparg - 1], key, value --)
        return ((arg + 1, KIND_DICT),)
    if name in ("DICT_UPDATE", "DICT_MERGE"):
        return ((arg, KIND_DICT),)
    if name == "LIST_TO_TUPLE":
        return ((0, KIND_LIST),)
    if name == "FOR_ITER":
        return ((0, KIND_ITER),)
    if name == "POP_EXCEPT":  # becomes the thread's handled exception unchecked
        return ((0, KIND_EXC_OR_NONE),)
    if name == "RERAISE":  # (values[oparg], exc --): values[0] is the lasti
        return ((0, KIND_EXC), (arg, KIND_LASTI)) if arg else ((0, KIND_EXC),)
    if name == "WITH_EXCEPT_START":  # (exit_func, lasti, prev_exc, val -- ..., res)
        return ((0, KIND_EXC), (1, KIND_EXC_OR_NONE), (2, KIND_LASTI))
    if name == "PUSH_EXC_INFO":
        return ((0, KIND_EXC),)
    if name in ("CHECK_EXC_MATCH", "CHECK_EG_MATCH"):
        return ((1, KIND_EXC),)
    if name in ("END_ASYNC_FOR", "CLEANUP_THROW"):
        return ((0, KIND_EXC),)
    if name == "PREP_RERAISE_STAR":  # (orig, excs -- result)
        return ((1, KIND_EXC), (0, KIND_EXC_ITEMS))
    if name == "CALL_INTRINSIC_1":
        if arg == _INTRINSIC_LIST_TO_TUPLE:  # 3.12+: reads ob_item without a check
            return ((0, KIND_LIST),)
        if arg == _INTRINSIC_STOPITERATION_ERROR:
            return ((0, KIND_EXC),)
    if name == "CALL_INTRINSIC_2" and arg == _INTRINSIC_PREP_RERAISE_STAR:
        return ((1, KIND_EXC), (0, KIND_EXC_ITEMS))
    if name in ("MATCH_KEYS", "MATCH_CLASS", "CALL_KW"):  # a constant tuple of names on top
        return ((0, KIND_TUPLE),)
    if name == "MAKE_FUNCTION" and _PY < (3, 13):
        # (defaults?, kwdefaults?, annotations?, closure?, codeobj -- func): stored
        # into the function unchecked.  The code object and closure are loaded
        # just before, but a def suspended in its annotations (or keyword
        # defaults) has the defaults (and keyword defaults) in its record.
        pos, out = 1, []
        for flag, kind in ((8, KIND_TUPLE), (4, KIND_TUPLE), (2, KIND_DICT), (1, KIND_TUPLE)):
            if arg & flag:
                out.append((pos, kind))
                pos += 1
        return tuple(out)
    if name == "SET_FUNCTION_ATTRIBUTE":  # 3.13: (attr, func -- func), stored unchecked
        return ((1, KIND_DICT if arg == 2 else KIND_TUPLE),)
    return ()


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
        "name",
        "fall_pops",
        "jump_pops",
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
    name: str
    fall_pops: int | None  # slots consumed when it falls through (None: all)
    jump_pops: int | None  # and when it jumps


class _Point:
    """What the analysis knows about one suspension point."""

    __slots__ = ("depth", "null_ok", "method_self", "start", "kinds", "why",
                 "iters", "excs", "lastis", "makers")

    def __init__(self, depth: int | None, null_ok: int, method_self: int, start: int,
                 kinds: tuple[int, ...] = (),
                 why: tuple[tuple[tuple[int, str], ...], ...] = (),
                 makers: tuple[tuple[int, int], ...] = ()) -> None:
        self.depth = depth  # exact value-stack depth while suspended; None: unknown
        self.null_ok = null_ok  # bit i: stack[i] may legally be NULL
        # bit i: stack[i] is the NULL-or-self half of a method load (3.13 only)
        self.method_self = method_self
        self.start = start  # index of the instruction a resume runs first
        # Rule 4: kinds[i] are the KIND_* flags stack[i] must have (0: any);
        # why[i] are (kinds, phrase) naming the instructions that need them,
        # those a resume runs soonest first.
        self.kinds = kinds
        self.why = why
        # makers[i]: (index of the instruction that pushed stack[i], which of its outputs
        # it is), (-1, 0) if the paths that meet disagree (``tcc upgrade`` compares them)
        self.makers = makers
        # The same as bit masks, by kind: bit i set if stack[i] is a for loop's
        # iterator / an exception (or None) / a handler's lasti.
        self.iters = _mask(kinds, KIND_ITER)
        self.excs = _mask(kinds, KIND_EXC | KIND_EXC_OR_NONE)
        self.lastis = _mask(kinds, KIND_LASTI)


def _mask(kinds: tuple[int, ...], kind: int) -> int:
    m = 0
    for i, k in enumerate(kinds):
        if k & kind:
            m |= 1 << i
    return m


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
        "local_kinds",
        "holes",
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
        self.flow_cache: dict[tuple[int, int, int, int], tuple[int, int] | None] = {}
        self.flow_ok = _UNCHECKED_LOADS  # rule 3 applies
        self.decided = True  # the analysis modelled this code
        # Rule 4 for locals: a (sync) generator expression or comprehension
        # runs FOR_ITER straight on its argument ``.0`` (an async one awaits
        # __anext__, looked up with a check).  (In co_code every even byte is
        # an opcode: inline caches are CACHE, arguments odd.)
        self.local_kinds: tuple[int, ...] = ()
        raw = code.co_code
        if (self.nlocalsplus and code.co_varnames[:1] == (".0",) and code.co_argcount == 1
                and _GET_ANEXT not in raw[::2]):
            self.local_kinds = (KIND_ITER,)
        # (offset, instruction, position) of each slot an instruction trusts
        # whose producer the analysis could not pin down (paths that meet
        # disagree); empty for every code the compiler makes that we know of.
        self.holes: list[tuple[int, str, int]] = []
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
        # state: (depth, may-NULL mask, method-self mask, labels of the slots)
        states: list[tuple[int, int, int, tuple[int, ...]] | None] = [None] * n
        try:
            if n:
                _join_state(states, 0, (0, 0, 0, ()))
            work = [0] if n else []
            while work:
                i = work.pop()
                state = states[i]
                assert state is not None
                ins = instrs[i]
                # PUSH_EXC_INFO, first in the range of the handler that cleans
                # up after an except block, cannot raise; from its edge the
                # slot below would seem to hold either the caught or the
                # previous exception.
                if ins.handler >= 0 and ins.op != _PUSH_EXC_INFO:
                    depth, mask, pmask, labels = state
                    if ins.hdepth > depth:
                        raise _Undecidable
                    keep = (1 << ins.hdepth) - 1
                    # the exception on top; the lasti below it if pushed
                    exc = (ins.handler << _OUT_BITS) | _OUT_EXC
                    pushed = (exc - 1, exc) if ins.hlasti else (exc,)
                    hstate = (ins.hdepth + len(pushed), mask & keep, pmask & keep,
                              labels[:ins.hdepth] + pushed)
                    if _join_state(states, ins.handler, hstate):
                        work.append(ins.handler)
                if ins.falls and i + 1 < n:
                    out = _step(i, ins, state, ins.fall_effect, ins.fall_pops)
                    if _join_state(states, i + 1, out):
                        work.append(i + 1)
                if ins.target >= 0:
                    out = _step(i, ins, state, ins.jump_effect, ins.jump_pops)
                    if _join_state(states, ins.target, out):
                        work.append(ins.target)
        except _Undecidable:
            states = [None] * n
            self.flow_ok = self.decided = False
        reqs, uses = self._requirements(states)
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
                    depth, mask, pmask, labels = state
                    keep = (1 << (depth - 1)) - 1
                    kinds, whys, makers = [], [], []
                    here = ins.offset // 2
                    for label in labels[: depth - 1]:  # the yielded value is not in the record
                        makers.append((label >> _OUT_BITS, label & ((1 << _OUT_BITS) - 1))
                                      if label >= 0 else (-1, 0))
                        made, made_by = self._produced(label)
                        kinds.append(made | reqs.get(label, 0))
                        found = sorted(uses.get(label, ()), key=lambda u: (u[0] < here, u[0]))
                        whys.append(tuple((kind, what) for _at, kind, what in found)
                                    + ((made, made_by),))
                    point = _Point(depth - 1, mask & keep, pmask & keep if _NULL_ABOVE else 0, i + 1,
                                   tuple(kinds), tuple(whys), tuple(makers))
                self.points[ins.offset // 2] = point

    def _produced(self, label: int) -> tuple[int, str]:
        """The kind a producer guarantees for its output, and a phrase naming it."""
        if label < 0:
            return 0, ""
        ins = self.instrs[label >> _OUT_BITS]
        output = label & ((1 << _OUT_BITS) - 1)
        if output == _OUT_EXC:
            return KIND_EXC, f"the interpreter enters the handler at offset {ins.offset // 2} with one"
        if output == _OUT_LASTI:
            return KIND_LASTI, f"the interpreter enters the handler at offset {ins.offset // 2} with one"
        made = 0
        if output == 0:
            name = ins.name
            if name == "BUILD_LIST":
                made = KIND_LIST
            elif name == "BUILD_SET":
                made = KIND_SET
            elif name in ("BUILD_MAP", "BUILD_CONST_KEY_MAP"):
                made = KIND_DICT
            elif name in ("BUILD_TUPLE", "LIST_TO_TUPLE") or (
                    name == "CALL_INTRINSIC_1" and ins.arg == _INTRINSIC_LIST_TO_TUPLE):
                made = KIND_TUPLE
            elif name == "GET_ITER":
                made = KIND_ITER
            elif name == "PUSH_EXC_INFO":  # the exception handled before, or None
                made = KIND_EXC_OR_NONE
        return made, f"the {ins.name} at offset {ins.offset // 2} made it"

    def _requirements(
        self, states: list[tuple[int, int, int, tuple[int, ...]] | None]
    ) -> tuple[dict[int, int], dict[int, list[tuple[int, int, str]]]]:
        """Kinds that the instructions using a label's value without a type check impose on it.

        Also, for each label, (offset, kind, phrase) of each such instruction.
        """
        reqs: dict[int, int] = {}
        uses: dict[int, list[tuple[int, int, str]]] = {}
        appends: list[tuple[int, int, int]] = []  # LIST_APPEND: (index, list label, value label)

        def need(label: int, kind: int, i: int, pos: int, what: str) -> bool:
            at = self.instrs[i].offset // 2
            if label == _UNKNOWN:
                self.holes.append((at, self.instrs[i].name, pos))
                return False
            if (at, kind, what) in uses.setdefault(label, []):
                return False
            uses[label].append((at, kind, what))
            reqs[label] = reqs.get(label, 0) | kind
            return True

        for i, ins in enumerate(self.instrs):
            state = states[i]
            if state is None:
                continue
            labels = state[3]
            user = f"the {ins.name} at offset {ins.offset // 2} uses it without a type check"
            for pos, kind in _consumes(ins.name, ins.arg):
                if pos < len(labels):
                    need(labels[-1 - pos], kind, i, pos, user)
            if ins.name == "LIST_APPEND" and 0 < ins.arg < len(labels):
                appends.append((i, labels[-1 - ins.arg], labels[-1]))
        # What is appended to a list of exceptions (except*) must be one, too.
        changed = True
        while changed:
            changed = False
            for i, lst, value in appends:
                if lst != _UNKNOWN and reqs.get(lst, 0) & KIND_EXC_ITEMS:
                    at = self.instrs[i].offset // 2
                    changed |= need(value, KIND_EXC_OR_NONE, i, 0,
                                    f"the LIST_APPEND at offset {at} adds it to the exceptions "
                                    "an except* block re-raises")
        return reqs, uses

    # -- rule 3: forward from the resumption point, with the record's NULLs --

    def unchecked_null_read(
        self, point: _Point, depth: int, lmask: int, smask: int, extra_plain: int = 0
    ) -> tuple[int, int] | None:
        """First (instruction index, local) an unchecked load of a maybe-NULL local hits
        (``extra_plain``: cell slots a comprehension uses as plain locals at this point)."""
        key = (point.start, lmask, smask, extra_plain)
        try:
            return self.flow_cache[key]
        except KeyError:
            pass
        try:
            result = _flow(self.instrs, point.start, depth, lmask, smask,
                           self.plain_mask() | extra_plain)
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


# Inline cache entries after each opcode (3.11/3.12: a list by opcode; 3.13: a dict by name).
_CACHE_ENTRIES = tuple(
    dis._inline_cache_entries[op] if isinstance(dis._inline_cache_entries, list)  # type: ignore[attr-defined]
    else dis._inline_cache_entries.get(dis.opname[op], 0)  # type: ignore[attr-defined]
    for op in range(256)
)
_HAS_ARG = frozenset(getattr(dis, "hasarg", range(dis.HAVE_ARGUMENT, 256)))
_JREL = frozenset(dis.hasjrel)
_JABS = frozenset(dis.hasjabs)
_BACKWARD = frozenset(op for op in range(256) if "JUMP_BACKWARD" in dis.opname[op])
# 3.12+ count a relative jump from after the instruction's inline caches (3.11's relative
# jumps have none)
_JREL_AFTER_CACHES = _PY >= (3, 12)
_INT_OVERFLOW = 2 ** 31
_MISSING: Any = object()


def raw_instructions(code: types.CodeType) -> list[tuple[int, int, int | None, int | None, int | None]]:
    """``(offset, opcode, arg, line, jump target)`` of each instruction of ``code``, as
    ``dis.get_instructions`` gives them (``arg`` None for an opcode without one, ``target``
    None for a non-jump; inline caches skipped, EXTENDED_ARG kept), without building its
    argument descriptions: about ten times faster, and restoring a snapshot in a new
    process decodes every suspended frame's code (``test_flow`` checks the two agree on
    every code object of the standard library)."""
    raw = code.co_code  # the de-specialised instructions
    positions = list(code.co_positions())
    out = []
    extended = 0
    caches = 0
    for i in range(0, len(raw), 2):
        if caches:
            caches -= 1
            continue
        op = raw[i]
        caches = _CACHE_ENTRIES[op]
        arg: int | None
        if op in _HAS_ARG:
            arg = raw[i + 1] | extended
            extended = (arg << 8) if op == _EXTENDED_ARG else 0
            if extended >= _INT_OVERFLOW:
                extended -= 2 * _INT_OVERFLOW
        else:
            arg = None
            extended = 0
        target = None
        if op in _JREL:
            target = i + 2 + (-arg if op in _BACKWARD else arg) * 2  # type: ignore[operator]
            if _JREL_AFTER_CACHES:
                target += 2 * caches
        elif op in _JABS:
            target = arg * 2  # type: ignore[operator]
        out.append((i, op, arg, positions[i // 2][0] if i // 2 < len(positions) else None, target))
    return out


# (opcode, arg) -> what _decode derives from the pair alone (kind, pops, effects and the
# slots consumed along each edge), or None when the interpreter cannot say (undecidable)
_SHAPES: dict[tuple[int, int | None], tuple[int, int, int, int, int | None, int | None] | None] = {}


def _shape(op: int, arg: int | None) -> tuple[int, int, int, int, int | None, int | None] | None:
    x = _Instr()
    x.kind, x.pops = _kind(op, arg)
    x.op, x.arg, x.name = op, arg or 0, dis.opname[op]
    if op == _EXTENDED_ARG:
        return x.kind, x.pops, 0, 0, 0, 0
    try:
        fall = dis.stack_effect(op, arg, jump=False)
        jump = dis.stack_effect(op, arg, jump=True) if op in _JUMPS else 0
    except (ValueError, TypeError):
        return None
    if x.kind == _RETURN_GENERATOR:
        fall = 1  # 3.11/3.12 report 0: the prologue is not in the model
    return x.kind, x.pops, fall, jump, _consumed(x, fall), _consumed(x, jump)


def _decode(code: types.CodeType) -> list[_Instr]:
    """Instructions with their effects, successors and exception handlers."""
    raw = raw_instructions(code)
    index = {ins[0]: i for i, ins in enumerate(raw)}
    out: list[_Instr] = []
    shapes = _SHAPES
    for offset, op, ins_arg, line, jump_target in raw:
        arg = ins_arg if op >= dis.HAVE_ARGUMENT else None
        key = (op, arg)
        shape = shapes.get(key, _MISSING)
        if shape is _MISSING:
            shape = shapes[key] = _shape(op, arg)
            if len(shapes) > 65536:  # (huge args: do not grow without bound)
                shapes.clear()
        if shape is None:
            raise _Undecidable
        x = _Instr()
        x.offset = offset
        x.kind, x.pops, x.fall_effect, x.jump_effect, x.fall_pops, x.jump_pops = shape
        x.op = op
        x.arg = arg or 0
        x.name = dis.opname[op]
        x.line = line
        x.handler, x.hdepth, x.hlasti = -1, 0, 0
        if op == _EXTENDED_ARG:
            x.target, x.falls = -1, True
            out.append(x)
            continue
        if op in _JUMPS:
            target = jump_target
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
            if start <= ins[0] < end:
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


def _join_state(
    states: list[tuple[int, int, int, tuple[int, ...]] | None],
    i: int,
    state: tuple[int, int, int, tuple[int, ...]],
) -> bool:
    """Merge ``state`` into ``states[i]``: masks may-union, labels must-agree; True if it changed."""
    old = states[i]
    if old is None:
        states[i] = state
        return True
    if old[0] != state[0]:
        raise _Undecidable  # inconsistent depths: not a layout we understand
    labels = old[3]
    if labels != state[3]:
        labels = tuple(a if a == b else _UNKNOWN for a, b in zip(labels, state[3]))
    merged = (old[0], old[1] | state[1], old[2] | state[2], labels)
    if merged != old:
        states[i] = merged
        return True
    return False


def _consumed(ins: _Instr, effect: int) -> int | None:
    """Slots ``ins`` consumes from the top of the stack along an edge with ``effect``."""
    kind = ins.kind
    if kind in (_PUSH_NULL, _LOAD_AND_CLEAR, _RETURN_GENERATOR, _SWAP, _COPY):
        return 0
    if kind == _PAIR:
        return ins.pops
    if kind == _CALL:
        return 1 - effect  # callable, NULL/self and the arguments
    return _pops(ins.name, ins.arg, effect)


def _step(
    index: int,
    ins: _Instr,
    state: tuple[int, int, int, tuple[int, ...]],
    effect: int,
    pops: int | None,
) -> tuple[int, int, int, tuple[int, ...]]:
    """Stack transfer (depth, may-NULL mask, method-self mask, labels) for rules 2 and 4."""
    depth, mask, pmask, labels = state
    kind = ins.kind
    if kind == _PUSH_NULL or kind == _LOAD_AND_CLEAR:
        return depth + 1, mask | (1 << depth), pmask, labels + (_label(index, 0),)
    new, mask = _stack_step(ins, depth, mask, effect)
    pmask = _stack_step(ins, depth, pmask, effect)[1]
    if kind == _SWAP:
        swapped = list(labels)
        b = depth - ins.arg
        swapped[-1], swapped[b] = swapped[b], swapped[-1]
        return new, mask, pmask, tuple(swapped)
    if kind == _COPY:
        return new, mask, pmask, labels + (labels[depth - ins.arg],)
    if ins.op == _PUSH_EXC_INFO and depth >= 1 and new == depth + 1:
        # (exc -- previous exception, exc): exc itself stays
        return new, mask, pmask, labels[:-1] + (_label(index, 0), labels[-1])
    keep = max(0, min(depth - pops if pops is not None else 0, new))
    return new, mask, pmask, labels[:keep] + tuple(_label(index, j) for j in range(new - keep))


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


_TYPE_NAME = type.__dict__["__name__"]  # a metaclass cannot override it: no user code runs
_TYPE_MRO = type.__dict__["__mro__"]
_TYPE_DICT = type.__dict__["__dict__"]


def _type_name(value: Any) -> str:
    name: str = _TYPE_NAME.__get__(type(value))
    return name


def _has_next(cls: type) -> bool:
    """Whether ``cls`` has a ``tp_iternext`` that iterates (PyIter_Check), from its real MRO."""
    return any("__next__" in _TYPE_DICT.__get__(base) for base in _TYPE_MRO.__get__(cls))


def _is_exception(value: Any) -> bool:
    # issubclass on the real type, never isinstance (which asks value.__class__);
    # BaseException's metaclass is type, whose __subclasscheck__ reads the MRO.
    return issubclass(type(value), BaseException)


def _kinds_ok(value: Any, kinds: int, lasti_max: int) -> bool:
    """Pure-Python twin of ``tcc._native.check_kinds`` for one slot (used without the module)."""
    t = type(value)
    if kinds & KIND_ITER and not _has_next(t):
        return False
    if kinds & KIND_EXC and not _is_exception(value):
        return False
    if kinds & KIND_EXC_OR_NONE and not (value is None or _is_exception(value)):
        return False
    if kinds & KIND_LASTI and not (t is int and 0 <= value <= lasti_max):
        return False
    if kinds & (KIND_LIST | KIND_EXC_ITEMS) and t is not list:
        return False
    if kinds & KIND_SET and t is not set:
        return False
    if kinds & KIND_DICT and t is not dict:
        return False
    if kinds & KIND_TUPLE and t is not tuple:
        return False
    if kinds & KIND_EXC_ITEMS:
        return all(item is None or _is_exception(item) for item in value)
    return True


def _first_bad_slot(slots: tuple[Any, ...], kinds: tuple[int, ...], null: Any, lasti_max: int) -> int:
    native = _frames.native() if _frames.available() else None
    if native is not None and hasattr(native, "check_kinds"):
        bad: int = native.check_kinds(slots, kinds, null, lasti_max)
        return bad
    for i, (value, kind) in enumerate(zip(slots, kinds)):
        if kind and value is not null and not _kinds_ok(value, kind, lasti_max):
            return i
    return -1


def _words(kinds: int) -> str:
    for kind, words in _KIND_WORDS:
        if kinds & kind:
            return words
    return "something else"


def _check_types(info: _CodeInfo, offset: int, point: _Point, slots: tuple[Any, ...], null: Any) -> None:
    """Rule 4: slots the bytecode uses without a type check hold the right kind of object."""
    nlp = info.nlocalsplus
    if not info.local_kinds and not any(point.kinds):
        return
    kinds = info.local_kinds + (0,) * (nlp - len(info.local_kinds)) + point.kinds
    units = len(info.code.co_code) // 2
    bad = _first_bad_slot(slots, kinds, null, units)
    if bad < 0:
        return
    value = slots[bad]
    if bad < nlp:
        raise ValueError(
            f"record of {_where(info, offset)} has a {_type_name(value)} in "
            f"{_slot_name(info, bad)}, the iterator the generator expression loops over")
    k = bad - nlp
    kind = point.kinds[k]
    # The kind it lacks (the Python twin only picks the words: C decided).
    missing = next((b for b, _w in _KIND_WORDS if kind & b and not _kinds_ok(value, b, units)), kind)
    what = _words(missing)
    if missing & KIND_LASTI:
        what = f"an int offset in 0..{units} (where an exception handler re-raises)"
    who = next((w for kinds, w in point.why[k] if kinds & missing), "")
    shown = f"the int {value}" if type(value) is int and -(10**9) < value < 10**9 else f"a {_type_name(value)}"
    raise ValueError(
        f"record of {_where(info, offset)} has {shown} in {_slot_name(info, bad)}, which must be "
        f"{what}: {who}")


def _cleared_cells(info: _CodeInfo, point: _Point) -> dict[int, int]:
    """``{cell slot: stack position}``: the cell and free-variable slots an inlined
    comprehension (3.12+) has saved on the value stack at ``point`` with
    ``LOAD_FAST_AND_CLEAR``, using the slot as a plain local of its own until it stores
    the saved cell back.  While suspended there the slot holds that local (or NULL), and
    the stack position the cell: the lowest one, when comprehensions nest (an inner one
    saves the outer one's local, which may be NULL, above it)."""
    cells = set(info.code.co_cellvars)
    nfree = len(info.code.co_freevars)
    # a slot the body makes a cell again (a comprehension whose own variable is a cell:
    # MAKE_CELL after the prologue) is read as a cell inside it: never plain
    remade: set[int] = set()
    begun = False
    for ins in info.instrs:
        if ins.name == "RESUME":
            begun = True
        elif begun and ins.name == "MAKE_CELL":
            remade.add(ins.arg)
    out: dict[int, int] = {}
    for pos, (index, _out) in enumerate(point.makers):
        if index < 0:
            continue
        ins = info.instrs[index]
        if ins.name != "LOAD_FAST_AND_CLEAR" or not 0 <= ins.arg < info.nlocalsplus:
            continue
        slot = ins.arg
        if (info.names[slot] in cells or slot >= info.nlocalsplus - nfree) and slot not in remade:
            out.setdefault(slot, pos)
    return out


def shadowed_cells(code: types.CodeType, offset: int, nslots: int) -> bytes | None:
    """For ``tcc._native.check_frame``/``write_frame``, given a record of ``nslots``
    slots: one flag per slot, 1 on each cell slot an inlined comprehension has cleared at
    suspension point ``offset``, 2 on the stack slot keeping its cell (see
    :func:`_cleared_cells`); None if there are none (or the stack is not as deep)."""
    info = _info(code)
    point = info.points.get(offset)
    if point is None:
        return None
    cleared = _cleared_cells(info, point)
    if not cleared or any(info.nlocalsplus + pos >= nslots for pos in cleared.values()):
        return None
    flags = bytearray(nslots)
    for slot, pos in cleared.items():
        flags[slot] = 1
        flags[info.nlocalsplus + pos] = 2
    return bytes(flags)


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
       check, or where the instruction that made it guarantees its exact type:
       a non-iterator where a for loop keeps its iterator (FOR_ITER calls
       ``tp_iternext`` directly) or in a generator expression's ``.0``, a
       non-exception where an except/finally/with block keeps the caught or
       saved exception, a handler's re-raise offset that is not an exact int
       inside the code, anything but an exact list/set/dict where
       ``LIST_APPEND``/``SET_ADD``/``MAP_ADD`` and friends build one, an
       except* block's list of raised exceptions holding anything but
       exceptions or None.  The kinds are tested on the object's real type
       (``tcc._native.check_kinds``): a ``__class__`` property or a metaclass
       ``__getattr__`` cannot fake them (each of these, written into a frame,
       would crash the interpreter).

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
    # A cell slot an inlined comprehension cleared holds its own plain local (which may be
    # NULL) while the cell waits on the stack, to be stored back: that stack slot must hold
    # a cell, or the LOAD_DEREFs after the comprehension would read something else as one.
    extra_plain = 0
    for slot, pos in _cleared_cells(info, point).items():
        extra_plain |= 1 << slot
        if slots[slot] is null:
            lmask |= 1 << slot
        saved = slots[nlp + pos] if nlp + pos < n else null
        if type(saved) is not types.CellType:
            raise ValueError(
                f"record of {_where(info, offset)} has "
                f"{'NULL' if saved is null else type(saved).__name__} in "
                f"{_slot_name(info, nlp + pos)}, where a comprehension keeps the cell of "
                f"{info.names[slot]!r} until it stores it back")
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
    hit = info.unchecked_null_read(point, depth, lmask, smask, extra_plain)
    if hit is None:
        return
    # The analysis is distributive: one NULL alone reaches the read.
    culprit = None
    for i in range(n):
        if i < nlp:
            single = (1 << i, 0) if lmask >> i & 1 else None
        else:
            single = (0, 1 << (i - nlp)) if smask >> (i - nlp) & 1 else None
        if single is not None and info.unchecked_null_read(point, depth, *single, extra_plain) is not None:
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


def suspension_points(code: types.CodeType) -> dict[int, Any]:
    """``{offset: point}`` for each place a frame of ``code`` can be suspended at (the
    code-unit index of a ``YIELD_VALUE``; -1: unstarted).  A point has ``depth`` (the
    value-stack depth, None if unknown), ``start`` (the instruction index a resume runs
    first) and ``makers`` (for each stack slot, the index of the instruction in
    :func:`instructions` that pushed it, and which of its outputs it is)."""
    return dict(_info(code).points)


def instructions(code: types.CodeType) -> list[Any]:
    """The decoded instructions of ``code`` as the analysis sees them (``offset`` in bytes,
    ``name``, ``arg``, ``target``/``handler``: instruction indexes or -1, ``falls``)."""
    return list(_info(code).instrs)
