"""Static record-shape checks (tcc.capture._flow): stack depth and NULL slots.

Soundness first: every record read from a real suspended frame, at every
suspension point of every program here, must be accepted.  Then mutated
records: a wrong stack depth is always refused, and every mutation that
*is* accepted (by both ``check_frame`` and ``check_record_shape``) is
written into a fresh frame in a child process and resumed, thrown into and
closed there -- the child must not die from a signal.
"""

from __future__ import annotations

import json
import sys
import types
from typing import Any, Iterator

import pytest

from tests._support import programs
from tests._support.childrun import run_child
from tests._support.programs import Req, call

_native = pytest.importorskip("tcc._native")
from tcc.capture import _flow, _frames, _records  # noqa: E402

NULL = _records.NULL
PY312 = sys.version_info >= (3, 12)


# ------------------------------------------------------------ tricky programs


def kw(*args: Any, **kwargs: Any) -> Any:
    return args, sorted(kwargs.items())


class Sub(programs.Planner):
    async def step(self, i: int) -> Any:
        return (await super().step(i), await call("sub", i))


async def t_with(tag: str) -> Any:
    log: list[str] = []
    with programs.SyncBlock(log):
        log.append(await call("with", tag))
        with programs.SyncBlock(log) as inner:
            log.append(await call("with2", inner.__class__.__name__))
    return log


async def t_async_with(tag: str) -> Any:
    log: list[str] = []
    async with programs.Session(log) as s:
        log.append(await call("aw", tag))
        async with programs.Session(s.log):
            log.append(await call("aw2", tag))
    return log


async def t_except_finally(tag: str) -> Any:
    out = []
    try:
        raise KeyError(tag)
    except KeyError as e:
        out.append(await call("ex", str(e)))
    try:
        out.append(await call("body", tag))
        try:
            await call("fail", tag)  # answered with a KeyError thrown in
        finally:
            out.append(await call("fin", tag))
    except KeyError as e2:
        out.append(await call("caught", str(e2)))
    finally:
        out.append(await call("outer-fin", tag))
    return out


async def t_comprehensions(n: int) -> Any:
    a = [await call("c", i) for i in range(n)]
    b = {i: [await call("d", (i, j)) for j in range(i)] for i in range(n)}
    c = [x async for x in programs.Counter(2)]
    d = sorted({await call("s", k) for k in "ab"})
    return a, b, c, d


async def t_shadowing(n: int) -> Any:
    """Comprehension variables shadowing bound and unbound outer locals."""
    x = "outer"
    r = [await call("sh", x) for x in range(n)]
    s = [await call("sh2", y) for y in range(n)]
    y = len(s)
    fs = [lambda: z for z in range(n) if await call("cell", z)]
    return r, x, y, [f() for f in fs]


async def t_call_args(seed: int) -> Any:
    a = programs.combine(seed, await call("mid", 1), seed + 1)
    b = kw(seed, await call("kw-pos", 2), key=await call("kw", 3), other=seed)
    c = kw(*[seed, 1], await call("star", 4), **{"k": await call("dstar", 5)})
    d = (lambda *p: p)(await call("lambda", 6))
    return a, b, c, d


async def t_methods(topic: str) -> Any:
    p = programs.Planner(topic)
    p.steps.append(await call("m", 1))
    joined = "-".join([await call("j", 2), "x"])
    sub = Sub(topic)
    r = await sub.step(3)
    return p.steps, joined, r, await sub.run(1)


async def t_match(v: int) -> Any:
    out = []
    for value in (v, str(v) * 5, [v, v]):
        match await call("match", value):
            case str(s) if len(s) > 12:
                out.append(await call("long", s[:3]))
            case str(s):
                out.append(await call("short", s))
            case _:
                out.append(None)
    return out


async def t_except_star(tag: str) -> Any:
    out = []
    try:
        raise ExceptionGroup("g", [KeyError(tag), ValueError(tag)])
    except* KeyError as eg:
        out.append(await call("kstar", len(eg.exceptions)))
    except* ValueError:
        out.append(await call("vstar", tag))
    return out


async def t_unbound(flag: bool) -> Any:
    """Locals that are legitimately unbound (NULL) while suspended."""
    if flag:
        x = 1
    y = await call("u", flag)
    try:
        got = x  # noqa: F821 - maybe unbound on purpose
    except UnboundLocalError:
        got = None
    del y
    y = await call("u2", got)
    return got, y


def t_generators(n: int) -> Any:
    squares = (x * x for x in range(n))
    first = next(squares)
    got = yield from (Req("ge", x + first) for x in squares)
    total = yield from programs.gen_source(n)
    sent = yield Req("plain", (got, total))
    return sent


async def t_unstarted(n: int) -> Any:
    """Holds an unstarted coroutine in a local across a suspension."""
    later = call("later", n)
    now = await call("now", n)
    return now, await later


async def t_cell_shadow(n: int) -> Any:
    """A comprehension's loop variable named like a closure's cell (3.12+ keeps the cell on
    the stack and the slot plain), once and nested (the inner one saves a NULL above it)."""
    name, other = "outer", "other"
    label = lambda: (name, other)  # noqa: E731
    got = {name: await call("cs", name) for name in range(n)}
    nested = [[await call("cs2", (name, j)) for name in "xy"] for j in range(2)]
    # the comprehension's own variable is a cell too (a lambda in it captures it): the body
    # makes a new cell in the slot and reads it as one; never a plain value there
    other_vals = [(await call("cs3", other), (lambda: other)()) for other in range(2)]
    return got, nested, label(), other_vals


TRICKY = {
    "t_with": lambda: t_with("w"),
    "t_async_with": lambda: t_async_with("a"),
    "t_except_finally": lambda: t_except_finally("e"),
    "t_comprehensions": lambda: t_comprehensions(3),
    "t_shadowing": lambda: t_shadowing(2),
    "t_call_args": lambda: t_call_args(4),
    "t_methods": lambda: t_methods("m"),
    "t_match": lambda: t_match(7),
    "t_except_star": lambda: t_except_star("s"),
    "t_unbound_true": lambda: t_unbound(True),
    "t_unbound_false": lambda: t_unbound(False),
    "t_generators": lambda: t_generators(3),
    "t_unstarted": lambda: t_unstarted(2),
    "t_cell_shadow": lambda: t_cell_shadow(2),
}

ALL = {**programs.PROGRAMS, **TRICKY}
# The 210-frame recursion adds nothing per frame after the first few.
CHAIN_LIMIT = 8


# ------------------------------------------------------------------- helpers


def chain(task: Any) -> Iterator[Any]:
    """The task and every generator/coroutine it waits on, outermost first."""
    gen = task
    while isinstance(gen, _frames.GENERATOR_TYPES):
        yield gen
        gen = gen.cr_await if isinstance(gen, types.CoroutineType) else gen.gi_yieldfrom


def frames_of(task: Any) -> Iterator[tuple[Any, Any]]:
    """(generator, native record) of the first frames of the chain, plus unstarted locals."""
    gens = list(chain(task))
    gens = gens[: CHAIN_LIMIT // 2] + gens[max(CHAIN_LIMIT // 2, len(gens) - CHAIN_LIMIT // 2) :]
    for gen in gens:
        record = _native.read_frame(gen, NULL)
        yield gen, record
        # the locals from the record, not frame.f_locals: on 3.13.0 reading f_locals of a
        # frame suspended in a comprehension that shadows a cell crashes CPython itself
        for slot in record[2][:nlocalsplus(_frames.code_of(gen))]:
            value = slot
            if type(slot) is types.CellType:
                try:
                    value = slot.cell_contents
                except ValueError:  # an empty cell
                    continue
            if isinstance(value, _frames.GENERATOR_TYPES) and value is not gen:
                inner = _native.read_frame(value, NULL)
                if inner[0] in (_frames.CREATED, _frames.SUSPENDED):
                    yield value, inner


def points(name: str) -> int:
    trace, _result = programs.drive(ALL[name]())
    return len(trace)


def at_point(name: str, k: int) -> tuple[Any, Any]:
    task = ALL[name]()
    pending = programs.advance(task, k) if k else None
    return task, pending


def finish(task: Any, pending: Any) -> None:
    try:
        programs.drive(task, first=pending)
    except Exception:  # noqa: BLE001 - t_except_finally lets its KeyError escape
        pass


def shape(gen: Any, record: Any) -> None:
    _state, offset, slots, _exc, _func = record
    _flow.check_record_shape(_frames.code_of(gen), offset, slots, NULL)


def nlocalsplus(code: types.CodeType) -> int:
    return len(_frames.slot_names(code))


# --------------------------------------------------------------- soundness


@pytest.mark.parametrize("name", sorted(ALL))
def test_every_real_record_is_accepted(name):
    """Every frame of every chain at every suspension point passes the check with its exact depth."""
    checked = 0
    for k in range(points(name) + 1):
        task, pending = at_point(name, k)
        for gen, record in frames_of(task):
            state, offset, slots, _exc, _func = record
            if state not in (_frames.CREATED, _frames.SUSPENDED):
                continue
            code = _frames.code_of(gen)
            shape(gen, record)
            assert _flow.expected_stack_depth(code, offset) == len(slots) - nlocalsplus(code)
            checked += 1
        finish(task, pending)
    assert checked > 0


def test_every_yield_of_every_code_here_is_analysed():
    """The analysis decides every suspension point of the programs' code objects."""
    codes: list[types.CodeType] = []

    def walk(code: types.CodeType) -> None:
        codes.append(code)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                walk(const)

    for module in (programs, sys.modules[__name__]):
        for value in vars(module).values():
            for obj in (value, *vars(value).values()) if isinstance(value, type) else (value,):
                if isinstance(obj, types.FunctionType):
                    walk(obj.__code__)
    assert len(codes) > 40
    for code in codes:
        info = _flow._info(code)
        assert info.decided, code.co_qualname
        for offset, point in info.points.items():
            assert point.depth is not None, (code.co_qualname, offset)
            assert 0 <= point.depth <= code.co_stacksize


def test_analysis_is_cached_per_code_object():
    """A second check of the same code reuses the cached analysis."""
    task, pending = at_point("research_agent", 3)
    record = _native.read_frame(task, NULL)
    shape(task, record)
    info = _flow._info(task.cr_code)
    shape(task, record)
    assert _flow._info(task.cr_code) is info
    finish(task, pending)


# ---------------------------------------------------------------- rejections


def real_records() -> Iterator[tuple[str, int, Any, Any]]:
    for name in sorted(ALL):
        for k in range(points(name) + 1):
            task, pending = at_point(name, k)
            for gen, record in frames_of(task):
                if record[0] == _frames.SUSPENDED:
                    yield name, k, gen, record
            finish(task, pending)


def test_wrong_stack_depth_is_rejected():
    """Adding or removing a value-stack entry is always refused."""
    count = 0
    for _name, _k, gen, record in real_records():
        state, offset, slots, exc, func = record
        code = _frames.code_of(gen)
        for bad in (slots + (None,), slots + (NULL,), slots[:-1]):
            if len(bad) < nlocalsplus(code):
                continue
            with pytest.raises(ValueError, match="value-stack entries"):
                _flow.check_record_shape(code, offset, bad, NULL)
            count += 1
    assert count > 500


def test_null_receiver_of_await_is_rejected():
    """A NULL in place of the awaited/delegated-to object (top of stack) is refused."""
    count = 0
    for _name, _k, gen, record in real_records():
        state, offset, slots, exc, func = record
        inner = gen.cr_await if isinstance(gen, types.CoroutineType) else gen.gi_yieldfrom
        if inner is None:
            continue
        assert slots[-1] is inner
        with pytest.raises(ValueError, match="never has a NULL"):
            _flow.check_record_shape(_frames.code_of(gen), offset, slots[:-1] + (NULL,), NULL)
        count += 1
    assert count > 100


def test_null_for_loop_iterator_is_rejected():
    """A NULL where a for loop keeps its iterator is refused."""
    task, pending = at_point("research_agent", 2)
    state, offset, slots, exc, func = _native.read_frame(task, NULL)
    code = task.cr_code
    first = nlocalsplus(code)
    assert type(slots[first]).__name__ == "enumerate"
    mutated = slots[:first] + (NULL,) + slots[first + 1 :]
    with pytest.raises(ValueError, match=r"stack\[0\]"):
        _flow.check_record_shape(code, offset, mutated, NULL)
    finish(task, pending)


async def reads_after(n: int) -> Any:
    total = n * 2
    got = await call("x", total)
    return total, got


def test_null_local_read_after_resume():
    """A NULL in a local read without a check after resuming is refused on 3.12+ only."""
    task = reads_after(3)
    pending = programs.advance(task, 1)
    state, offset, slots, exc, func = _native.read_frame(task, NULL)
    code = task.cr_code
    index = code.co_varnames.index("total")
    mutated = slots[:index] + (NULL,) + slots[index + 1 :]
    if PY312:
        with pytest.raises(ValueError, match=r"local 'total'.*without a check"):
            _flow.check_record_shape(code, offset, mutated, NULL)
    else:  # 3.11's LOAD_FAST raises UnboundLocalError instead of crashing
        _flow.check_record_shape(code, offset, mutated, NULL)
        fresh = _frames.fresh_generator(func)
        _native.write_frame(fresh, code, state, offset, mutated, exc, NULL)
        with pytest.raises(UnboundLocalError):
            fresh.send(pending)
    # A NULL in a local that is stored before it is read is fine everywhere.
    index = code.co_varnames.index("got")
    assert slots[index] is NULL
    _flow.check_record_shape(code, offset, slots, NULL)
    finish(task, pending)


def test_null_argument_of_unstarted_coroutine():
    """An unstarted record whose argument is NULL is refused on 3.12+ (the body loads it unchecked)."""
    task = reads_after(3)
    state, offset, slots, exc, func = _native.read_frame(task, NULL)
    assert (state, offset) == (_frames.CREATED, -1)
    _flow.check_record_shape(task.cr_code, -1, slots, NULL)
    mutated = (NULL,) + slots[1:]
    if PY312:
        with pytest.raises(ValueError, match=r"local 'n'"):
            _flow.check_record_shape(task.cr_code, -1, mutated, NULL)
    else:
        _flow.check_record_shape(task.cr_code, -1, mutated, NULL)
    task.close()


def test_saved_comprehension_variable():
    """On 3.12+ a NULL in the slot saving an outer variable during an inlined comprehension is accepted: later reads are checked."""
    name = "t_shadowing"
    task, pending = at_point(name, 1)  # inside the first comprehension
    state, offset, slots, exc, func = _native.read_frame(task, NULL)
    code = task.cr_code
    first = nlocalsplus(code)
    if PY312:
        # The saved outer ``x`` ("outer") is on the stack; the compiler reads
        # ``x`` with LOAD_FAST_CHECK after restoring it, so NULL is safe.
        at = first + [i for i, v in enumerate(slots[first:]) if v == "outer"][0]
        mutated = slots[:at] + (NULL,) + slots[at + 1 :]
        _flow.check_record_shape(code, offset, mutated, NULL)
        fresh = _frames.fresh_generator(func)
        _native.write_frame(fresh, code, state, offset, mutated, exc, NULL)
        with pytest.raises(UnboundLocalError):
            programs.drive(fresh, first=pending)
    finish(task, pending)
    # Inside the second comprehension the saved ``y`` is a real NULL: accepted.
    task, pending = at_point(name, 3)
    state, offset, slots, exc, func = _native.read_frame(task, NULL)
    if PY312:
        assert any(v is NULL for v in slots[nlocalsplus(task.cr_code) :])
    _flow.check_record_shape(task.cr_code, offset, slots, NULL)
    finish(task, pending)


def test_checker_raises_only_value_error_on_garbage():
    """Odd offsets, lengths and slot values give ValueError or pass, never another error."""
    task, pending = at_point("half_evaluated", 2)
    state, offset, slots, exc, func = _native.read_frame(task, NULL)
    code = task.cr_code
    for off in (offset, offset + 1, -1, -2, 0, 10**6, 2**40):
        for sl in ((), slots[:1], slots, slots + (NULL,) * 40, (NULL,) * len(slots)):
            try:
                _flow.check_record_shape(code, off, sl, NULL)
            except ValueError:
                pass
    finish(task, pending)


# ----------------------------------------------------- crash oracle (child)

CHILD = r"""
import json, sys, types, warnings
warnings.simplefilter("ignore")
from tests._support import programs
from tests.capture import test_flow
from tcc import _native
from tcc.capture import _flow, _frames, _records
NULL = _records.NULL
names = json.loads(sys.argv[1])
stats = {"accepted": 0, "rejected_flow": 0, "rejected_native": 0}
keep = []

def mutants(slots, nlp):
    for i in range(len(slots)):
        if slots[i] is not NULL:
            yield ("null", i), slots[:i] + (NULL,) + slots[i + 1:]
    yield ("push",), slots + (None,)
    if len(slots) > nlp:
        yield ("pop",), slots[:-1]

def fresh_record(name, k, j):
    task, pending = test_flow.at_point(name, k)
    keep.append(task)
    gens = list(test_flow.frames_of(task))
    return gens[j], pending

for name in names:
    n = test_flow.points(name)
    for k in range(n + 1):
        j = 0
        while True:
            task, pending = test_flow.at_point(name, k)
            keep.append(task)
            gens = list(test_flow.frames_of(task))
            if j >= len(gens):
                break
            gen, (state, offset, slots, exc, func) = gens[j]
            code = _frames.code_of(gen)
            nlp = len(_frames.slot_names(code))
            for tag, mslots in list(mutants(slots, nlp)):
                for how in ("drive", "close", "throw"):
                    (gen2, rec2), pend2 = fresh_record(name, k, j)
                    state2, offset2, slots2, exc2, func2 = rec2
                    # the same mutation, applied to this fresh copy of the record
                    if tag[0] == "null":
                        m = slots2[:tag[1]] + (NULL,) + slots2[tag[1] + 1:]
                    elif tag[0] == "push":
                        m = slots2 + (None,)
                    else:
                        m = slots2[:-1]
                    target = _frames.fresh_generator(func2)
                    keep.append(target)
                    shadowed = _flow.shadowed_cells(code, offset2, len(m)) if state2 == _frames.SUSPENDED else None
                    try:
                        _native.check_frame(target, code, state2, offset2, m, exc2, NULL, shadowed)
                    except (TypeError, ValueError):
                        stats["rejected_native"] += 1
                        continue
                    try:
                        _flow.check_record_shape(code, offset2, m, NULL)
                    except ValueError:
                        stats["rejected_flow"] += 1
                        continue
                    stats["accepted"] += 1
                    print(json.dumps(["start", name, k, j, code.co_qualname, tag, how]), file=sys.stderr, flush=True)
                    _native.write_frame(target, code, state2, offset2, m, exc2, NULL, shadowed)
                    try:
                        if how == "drive":
                            programs.drive(target, first=pend2)
                        elif how == "close":
                            target.close()
                        else:
                            target.throw(KeyError("oracle"))
                    except BaseException:
                        pass
            j += 1
print(json.dumps(stats))
"""


@pytest.mark.parametrize("name", sorted(ALL))
def test_accepted_mutations_never_crash(name):
    """Each accepted single-slot NULL/extra/missing-entry mutation resumes, throws and closes without a crash."""
    proc = run_child(CHILD, json.dumps([name]), timeout=600)
    last = proc.stderr.strip().splitlines()[-1:] if proc.stderr.strip() else []
    assert proc.returncode == 0, f"child died ({proc.returncode}) after {last}:\n{proc.stderr[-3000:]}"
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    assert stats["rejected_flow"] > 0


def test_null_self_next_to_list_append():
    """On 3.13 a NULL self beside list.append is refused (CALL_LIST_APPEND would dereference it); earlier versions keep the NULL below the callable."""
    task, pending = at_point("t_with", 1)  # suspended in log.append(await ...)
    state, offset, slots, exc, func = _native.read_frame(task, NULL)
    code = task.cr_code
    first = nlocalsplus(code)
    stack = slots[first:]
    at = first + [i for i, v in enumerate(stack) if v is list.append][0]
    if sys.version_info >= (3, 13):
        mutated = slots[: at + 1] + (NULL,) + slots[at + 2 :]
        with pytest.raises(ValueError, match=r"t_with\(\) at offset \d+ .*stack\[\d\].*list\.append"):
            _flow.check_record_shape(code, offset, mutated, NULL)
    else:
        # [NULL-or-method, self-or-callable]: a NULL method slot is what a bound attribute gives.
        mutated = slots[:at] + (NULL,) + slots[at + 1 :]
        _flow.check_record_shape(code, offset, mutated, NULL)
    finish(task, pending)


# ------------------------------------------------------ rule 4: unchecked slot types


def test_wrong_kinds_in_unchecked_slots_are_refused():
    """Every iterator, exception and re-raise-offset slot of every real record refuses a wrong kind.

    Regression (found by atheris): a record with an int where a for loop keeps
    its iterator passed every check and crashed the interpreter on resume
    (FOR_ITER calls the iterator's tp_iternext without a type check).  The same
    holds for the exception an except block saved (POP_EXCEPT restores it
    unchecked) and a handler's lasti (RERAISE jumps to it).  A generator
    expression's loop iterator comes from LOAD_FAST .0, not GET_ITER: atheris
    found that one too (a str there crashed 3.11 and 3.13).
    """
    found = {"iters": 0, "excs": 0, "lastis": 0}
    bad = {"iters": 12345, "excs": 12345, "lastis": 1 << 40}
    for name in sorted(ALL):
        for k in range(points(name) + 1):
            task, pending = at_point(name, k)
            for gen, record in frames_of(task):
                state, offset, slots, _exc, _func = record
                if state != _frames.SUSPENDED:
                    continue
                code = _frames.code_of(gen)
                point = _flow._info(code).points.get(offset)
                if point is None or point.depth is None:
                    continue
                nlp = nlocalsplus(code)
                for kind in found:
                    mask = getattr(point, kind)
                    for i in range(nlp, len(slots)):
                        if not (mask >> (i - nlp)) & 1 or slots[i] is NULL:
                            continue
                        found[kind] += 1
                        broken = list(slots)
                        broken[i] = bad[kind]
                        with pytest.raises(ValueError, match=rf"stack\[{i - nlp}\]"):
                            _flow.check_record_shape(code, offset, tuple(broken), NULL)
            finish(task, pending)
    assert all(found.values()), found  # the programs exercise every kind of slot


def test_generator_expression_needs_an_iterator_in_dot_zero():
    """A genexpr's `.0` is looped over unchecked: a non-iterator there is refused."""
    gen = (x * 2 for x in range(5))
    next(gen)
    state, offset, slots, _exc, _func = _native.read_frame(gen, NULL)
    _flow.check_record_shape(gen.gi_code, offset, slots, NULL)  # the real record passes
    with pytest.raises(ValueError, match="the iterator the generator expression loops over"):
        _flow.check_record_shape(gen.gi_code, offset, (7, *slots[1:]), NULL)


FRESH_GENEXPR_RUN_DURING_LOAD = """
import tcc
from tcc.capture import dump_payload, seal

class ListOf:
    def __init__(self, gen): self.gen = gen
    def __reduce__(self): return (list, (self.gen,))   # list(gen) runs while loading

gen = (x * 2 for x in range(3))
try:
    tcc.loads(seal(dump_payload([gen, ListOf(gen)])))
except tcc.RestoreError as exc:
    print("refused:", exc)
"""


def test_generator_run_before_its_frame_is_filled_does_not_crash(tmp_path):
    """Regression (found by atheris): a pickle that iterates a generator expression while it is
    still being loaded ran FOR_ITER on the placeholder None and crashed; now it is refused."""
    import subprocess

    proc = subprocess.run([sys.executable, "-c", FRESH_GENEXPR_RUN_DURING_LOAD],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "refused:" in proc.stdout and "not fresh" in proc.stdout, proc.stdout


def _all_code(obj: types.CodeType) -> Iterator[types.CodeType]:
    yield obj
    for const in obj.co_consts:
        if isinstance(const, types.CodeType):
            yield from _all_code(const)


def test_the_fast_decoder_reads_every_standard_library_code_as_dis_does():
    """``_flow.raw_instructions`` (what a restore decodes suspended frames with) gives exactly
    what ``dis.get_instructions`` gives: offsets, opcodes, arguments (EXTENDED_ARG
    included), lines and jump targets, for every code object of asyncio, tcc, these tests and a few more modules."""
    import dis
    import importlib
    import pkgutil

    for name in ("asyncio", "json", "argparse", "dataclasses", "typing", "inspect", "enum"):
        importlib.import_module(name)
    wanted = ("asyncio", "json", "argparse", "dataclasses", "typing", "inspect", "enum", "tcc",
              "tests")
    checked = 0
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None) or ""
        if not file.endswith(".py") or getattr(module, "__name__", "").split(".")[0] not in wanted:
            continue
        try:
            with open(file, encoding="utf-8") as fh:
                top = compile(fh.read(), file, "exec")
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for code in _all_code(top):
            want = []
            for ins in dis.get_instructions(code):
                target = getattr(ins, "jump_target", None)
                if target is None and (ins.opcode in dis.hasjrel or ins.opcode in dis.hasjabs):
                    target = ins.argval
                line = ins.positions.lineno if ins.positions is not None else None
                want.append((ins.offset, ins.opcode, ins.arg, line, target))
            assert _flow.raw_instructions(code) == want, (file, code.co_qualname)
            checked += 1
    # and code whose arguments and jumps need EXTENDED_ARG (300 locals, a long jump)
    body = "".join(f"    v{k} = {k}\n" for k in range(300))
    inner = body.replace("\n    ", "\n        ").replace("    v0", "        v0", 1)
    src = f"async def big(x):\n{body}    while x:\n{inner}        x = await x\n    return v299\n"
    extended = 0
    for code in _all_code(compile(src, "<big>", "exec")):
        assert _flow.raw_instructions(code) == [
            (ins.offset, ins.opcode, ins.arg, ins.positions.lineno,
             getattr(ins, "jump_target", None) if sys.version_info >= (3, 13) else
             (ins.argval if ins.opcode in dis.hasjrel or ins.opcode in dis.hasjabs else None))
            for ins in dis.get_instructions(code)]
        extended += sum(op == dis.opmap["EXTENDED_ARG"] for _, op, *_ in _flow.raw_instructions(code))
    del pkgutil
    assert checked > 2000 and extended > 100


def test_a_cell_a_comprehension_keeps_on_the_stack():
    """On 3.12+ a frame suspended inside a comprehension whose loop variable shadows a cell holds
    a plain value in the cell's slot: accepted, with the cell on the stack.  The native check
    allows that only for a slot the code clears with LOAD_FAST_AND_CLEAR, and only when told;
    anything but a cell in the stack slot the comprehension stores back is refused."""
    task, pending = at_point("t_cell_shadow", 1)  # inside the dict comprehension
    state, offset, slots, exc, func = _native.read_frame(task, NULL)
    code = task.cr_code
    slot = _frames.slot_names(code).index("name")
    shadowed = _flow.shadowed_cells(code, offset, len(slots))
    if not PY312:
        assert shadowed is None and type(slots[slot]) is types.CellType
        finish(task, pending)
        return
    assert shadowed is not None and shadowed[slot] == 1 and type(slots[slot]) is not types.CellType
    _flow.check_record_shape(code, offset, slots, NULL)
    fresh = _frames.fresh_generator(func)
    with pytest.raises(ValueError, match="must hold a cell"):  # not told: refused as before
        _native.check_frame(fresh, code, state, offset, slots, exc, NULL)
    with pytest.raises(TypeError, match="bytes of length"):
        _native.check_frame(fresh, code, state, offset, slots, exc, NULL, b"\x01")
    # the saved cell replaced by a plain value: refused by the native check itself too
    saved = shadowed.index(2)
    with pytest.raises(ValueError, match="keeps a comprehension's saved cell"):
        _native.check_frame(fresh, code, state, offset, slots[:saved] + ("x",) + slots[saved + 1:],
                            exc, NULL, shadowed)
    # the cell the comprehension stores back, replaced by a plain value: refused
    at = nlocalsplus(code) + [i for i, v in enumerate(slots[nlocalsplus(code):])
                              if type(v) is types.CellType][0]
    with pytest.raises(ValueError, match="keeps the cell of 'name'"):
        _flow.check_record_shape(code, offset, slots[:at] + ("x",) + slots[at + 1:], NULL)
    _native.write_frame(fresh, code, state, offset, slots, exc, NULL, shadowed)
    trace, result = programs.drive(fresh, first=pending)
    assert result == repr(({0: "cs<0>", 1: "cs<1>"}, [[f"cs2<({k!r}, {j})>" for k in "xy"] for j in range(2)],
                           ("outer", "other"), [("cs3<0>", 0), ("cs3<1>", 1)]))
    finish(task, pending)
    # a cell slot the code never clears that way must hold a cell, whatever the caller says
    task, pending = at_point("t_cell_shadow", 1)
    state, offset, slots, exc, func = _native.read_frame(task, NULL)
    other = _frames.slot_names(code).index("other")
    forced = bytearray(shadowed)
    forced[other] = 1
    bad = slots[:other] + ("not a cell",) + slots[other + 1:]
    target = _frames.fresh_generator(func)
    with pytest.raises(ValueError, match="'other'.* must hold a cell"):
        _native.check_frame(target, code, state, offset, bad, exc, NULL, bytes(forced))
    target.close()
    finish(task, pending)


def test_a_comprehension_variable_that_is_a_cell_itself_must_stay_a_cell():
    """Where the comprehension's own variable is a cell (a lambda in it captures it), the body
    makes a new cell in the slot and reads it as one: a plain value there is refused, by the
    flow analysis and by the native check (it crashed CPython when it was let through)."""
    task, pending = at_point("t_cell_shadow", 7)  # inside the third comprehension
    state, offset, slots, exc, func = _native.read_frame(task, NULL)
    code = task.cr_code
    slot = _frames.slot_names(code).index("other")
    assert type(slots[slot]) is types.CellType
    bad = slots[:slot] + (12345,) + slots[slot + 1:]
    shadowed = _flow.shadowed_cells(code, offset, len(bad))
    assert shadowed is None or shadowed[slot] != 1
    forced = bytearray(len(bad))
    forced[slot] = 1  # even told so, the native check refuses: the body remakes the cell
    if PY312:  # (3.11 runs a comprehension in a function of its own: nothing is saved)
        nlp = nlocalsplus(code)
        kept = [i for i in range(nlp, len(bad)) if type(bad[i]) is types.CellType]
        assert kept  # the outer cell the comprehension saved
        forced[kept[0]] = 2
    target = _frames.fresh_generator(func)
    for flags in (shadowed, bytes(forced)):
        with pytest.raises(ValueError, match="must hold a cell"):
            _native.check_frame(target, code, state, offset, bad, exc, NULL, flags)
    target.close()
    finish(task, pending)
