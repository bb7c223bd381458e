"""Crafted frame records: a foreign or fake-typed object in a slot is refused, never run.

Each test builds a snapshot through the public ``tcc.dumps`` with an object
whose ``__reduce__`` emits tcc's own generator rebuild
(``_records.new_generator`` + ``_records.fill_generator``) around a frame
record read from a real suspended coroutine, with one slot edited.  The
snapshot is loaded with the public ``tcc.loads`` in a child process, so that a
crash shows up as a signal instead of killing pytest: the child must exit
cleanly, and the load must be refused with ``CorruptSnapshotError`` naming the
slot.  Each edited slot is one the interpreter uses without a type check
(``LIST_APPEND``'s list, ``MAP_ADD``'s dict, ``FOR_ITER``'s iterator, the
exceptions an ``except``/``finally``/``except*`` block keeps, a handler's
lasti, the defaults ``MAKE_FUNCTION`` stores): before the checks were made
exact, most of these loaded and then crashed the interpreter on resume.

Fake types: ``FakeExc`` is an ``int`` subclass whose ``__class__`` property
claims ``ValueError`` (so ``isinstance(v, BaseException)`` is true) and whose
digits put an unmapped address where an exception keeps its traceback and
context; ``FakeIter`` claims to be a ``list_iterator`` and its metaclass
answers ``__next__`` on the class (so ``getattr(type(v), "__next__")`` finds
one), though its type is no iterator (``PyIter_Check`` is false).

The last two tests check the checks: the flow analysis's Python twin of the
native kind test agrees with it, and every slot an instruction trusts in
asyncio's code has a producer the analysis can name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("tcc._native")

MODULE = r'''
"""Programs, fake objects and the crafted reducer (written out by test_frame_records.py)."""

import json, sys, types
import tcc
from tcc import _native
from tcc.capture import _frames, _records
from tcc.capture._fingerprint import fingerprint


class Req:
    def __await__(self):
        return (yield self)


async def g(x=None):
    return await Req()


# ------------------------------------------------------------ the programs

async def star_list(xs):
    return [*xs, await g(), *xs]          # LIST_APPEND, LIST_EXTEND after the await


async def star_tuple(xs):
    return (*xs, await g())               # LIST_APPEND, then LIST_TO_TUPLE


async def star_set(xs):
    return {*xs, await g(), *xs}          # SET_ADD, SET_UPDATE


async def list_comp(xs):
    return [await g(x) for x in xs]       # LIST_APPEND (in <listcomp> on 3.11)


async def set_comp(xs):
    return {await g(x) for x in xs}       # SET_ADD


async def dict_comp(xs):
    return {x: await g(x) for x in xs}    # MAP_ADD


async def for_loop(xs):
    out = []
    for x in xs:                          # FOR_ITER
        out.append(await g(x))
    return out


async def in_except(x):
    try:
        raise KeyError(x)
    except KeyError:
        got = await g()                   # stack: [previous exception (None), awaitable]
    return sys.exc_info()[0], got         # POP_EXCEPT restored the previous exception


async def in_finally(x):
    try:
        raise KeyError(x)
    finally:
        await g()                         # stack: [previous, the KeyError, awaitable]; RERAISE


async def except_star(x):
    try:
        raise KeyError(x)
    except* KeyError:
        await g()                         # stack: [prev, exc, raised list, rest, awaitable]
    return "handled"


async def make_fn(x):
    def h(a=1, *, k=2) -> (await g()):    # stack: [defaults (1,), kwdefaults {'k': 2}, ...]
        return a, k
    return h(), h(0, k=1)                 # MAKE_FUNCTION stored both unchecked


class Exit:
    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await g()
        return False


async def with_exit(x):
    async with Exit():
        raise KeyError(x)                 # suspended in __aexit__: [exit, lasti, prev, exc, aw]


PROGRAMS = {f.__name__: f for f in (star_list, star_tuple, star_set, list_comp, set_comp,
                                     dict_comp, for_loop, in_except, in_finally,
                                     except_star, with_exit, make_fn)}
ARGS = {"for_loop": ([1, 2],), "list_comp": ([1, 2],), "set_comp": ([1, 2],),
        "dict_comp": ([1, 2],)}


# ----------------------------------------------------------- fake objects

def pointer_digits(n_words):
    # 30-bit digits whose 64-bit words read as 0x00000bad00000010: unmapped.
    return [0x10, 0xBAD] * n_words


class FakeExc(int):
    """isinstance(FakeExc(...), ValueError) is true; the memory is an int's."""

    @property
    def __class__(self):
        return ValueError

    def __reduce__(self):
        return (FakeExc, (int(self),))


def fake_exc():
    # An exception keeps dict, args, notes, traceback, context, cause at
    # offsets 16..63; an int's digits start at offset 24.
    digits = [1, 1] + pointer_digits(4) + [1]
    return FakeExc(sum(d << (30 * i) for i, d in enumerate(digits)))


class NextMeta(type):
    def __getattr__(cls, name):
        if name == "__next__":
            return lambda self: 1
        raise AttributeError(name)


class FakeIter(metaclass=NextMeta):
    """Claims to be a list_iterator; its class seems to have __next__, its type has no tp_iternext."""

    @property
    def __class__(self):
        return type(iter([]))

    def __reduce__(self):
        return (FakeIter, ())


class PlainFakeIter:
    @property
    def __class__(self):
        return type(iter([]))

    def __reduce__(self):
        return (PlainFakeIter, ())


class SneakyInt(int):
    """An int subclass that says it lies in every range."""

    def __le__(self, other):
        return True

    def __ge__(self, other):
        return True

    def __lt__(self, other):
        return True

    def __gt__(self, other):
        return True

    def __reduce__(self):
        return (SneakyInt, (int(self),))


VALUES = {
    "tuple": lambda: (1, 2),
    "int": lambda: 5,
    "str": lambda: "s",
    "list": lambda: [1],
    "none": lambda: None,
    "fake_exc": fake_exc,
    "list_of_fake_exc": lambda: [fake_exc()],
    "list_of_int": lambda: [5],
    "fake_iter": FakeIter,
    "plain_fake_iter": PlainFakeIter,
    "sneaky_int": lambda: SneakyInt(10 ** 6),
}

# Which slot to replace: (code names, predicate on the stack values, offset from the match).
SLOTS = {
    "list": lambda v: type(v) is list,
    "set": lambda v: type(v) is set,
    "dict": lambda v: type(v) is dict,
    "tuple": lambda v: type(v) is tuple,
    "list_iterator": lambda v: type(v).__name__ == "list_iterator",
    "none": lambda v: v is None,
    "exception": lambda v: isinstance(v, BaseException),
    "int": lambda v: type(v) is int,
}


# ------------------------------------------------------------- the edit

class Crafted:
    """Pickles as tcc's own rebuild of ``gen``, with ``edit`` applied to each frame record."""

    def __init__(self, gen, edit):
        self.gen, self.edit = gen, edit

    def __reduce__(self):
        gen = self.gen
        state, offset, slots, exc, func = _native.read_frame(gen, _records.NULL)
        code = _frames.code_of(gen)
        slots = list(slots)
        inner = gen.cr_await if isinstance(gen, types.CoroutineType) else gen.gi_yieldfrom
        for i, v in enumerate(slots):
            if v is inner and isinstance(v, _frames.GENERATOR_TYPES):
                slots[i] = Crafted(v, self.edit)   # edit the frames it awaits, too
        exc = self.edit(code, len(_frames.slot_names(code)), slots, exc)
        record = (1, state, offset, tuple(slots), exc, gen.__name__, gen.__qualname__)
        return (_records.new_generator, (func, fingerprint(code), 0), record, None, None,
                _records.fill_generator)


def main(program, where, value, shift):
    task = PROGRAMS[program](*ARGS.get(program, ("x",)))
    task.send(None)
    edited = []

    def edit(code, nlp, slots, exc):
        if edited or code.co_name not in (program, "<listcomp>", "<setcomp>", "<dictcomp>"):
            return exc
        if where == "saved_exception":
            edited.append("exc")
            return VALUES[value]()
        if where == "none_value":
            return exc
        test = SLOTS[where]
        for i in range(nlp, len(slots)):
            if slots[i] is not _records.NULL and test(slots[i]):
                edited.append(f"stack[{i + shift - nlp}]: {type(slots[i + shift]).__name__}")
                slots[i + shift] = VALUES[value]()
                break
        return exc

    blob = tcc.dumps(Crafted(task, edit))
    out = {"edited": edited}
    try:
        coro = tcc.loads(blob)
    except tcc.RestoreError as exc:
        out.update(outcome="refused", error=type(exc).__name__, message=str(exc))
        print(json.dumps(out), flush=True)
        return
    out["outcome"] = "loaded"
    print(json.dumps(out), flush=True)   # before resuming: a crash comes next
    try:
        reply = "sent"
        for _ in range(10):
            coro.send(reply)
        out["ran"] = "still suspended"
    except StopIteration as stop:
        out["ran"] = f"returned {stop.value!r}"[:200]
    except BaseException as exc:  # noqa: BLE001 - any Python error is a clean outcome here
        out["ran"] = f"raised {type(exc).__name__}: {exc}"[:200]
    print(json.dumps(out), flush=True)
'''

# The fake classes must be pickled by reference: cloudpickle cannot rebuild a
# class with a ``__class__`` property by value.  So they live in a module the
# child imports, like a user's module would.
CHILD = "import sys, frame_record_crafts as m; m.main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))"


@pytest.fixture(scope="module")
def module_dir(tmp_path_factory):
    """A directory holding the programs and fakes as the importable module ``frame_record_crafts``."""
    path = tmp_path_factory.mktemp("crafts")
    (path / "frame_record_crafts.py").write_text(MODULE)
    return path


def child(module_dir, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(module_dir), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-X", "faulthandler", "-c", CHILD, *args],
                          check=False, capture_output=True, text=True, timeout=120, env=env)


def run_case(module_dir, program: str, where: str, value: str, shift: int = 0) -> dict:
    """Run one crafted load in a child; fail on a signal, return the child's last report."""
    proc = child(module_dir, program, where, value, str(shift))
    lines = proc.stdout.strip().splitlines()
    report = json.loads(lines[-1]) if lines else {}
    assert proc.returncode == 0, (
        f"child died with {proc.returncode} (a signal if negative) after {report}; "
        f"stderr: {proc.stderr[-1500:]}")
    assert report.get("edited"), f"the edit found no slot to change: {report}"
    return report


def assert_refused(report: dict, *words: str) -> None:
    assert report["outcome"] == "refused", f"loaded instead of refused: {report}"
    assert report["error"] == "CorruptSnapshotError", report
    for word in words:
        assert word in report["message"], report


# ------------------------------------------------------------- the tests


@pytest.mark.parametrize("value", ["tuple", "int", "str"])
def test_list_slot_of_a_star_display(module_dir, value):
    """A tuple, int or str where `[*xs, await g(), *xs]` builds its list is refused (LIST_APPEND/LIST_EXTEND cast it)."""
    assert_refused(run_case(module_dir, "star_list", "list", value), "stack[0]", "list")


@pytest.mark.parametrize("value", ["tuple", "int", "str"])
def test_list_slot_of_a_list_comprehension(module_dir, value):
    """A tuple, int or str where a list comprehension with an await builds its list is refused."""
    assert_refused(run_case(module_dir, "list_comp", "list", value), "stack[", "list")


@pytest.mark.parametrize("value", ["int", "list", "str"])
def test_set_slot_of_a_set_comprehension(module_dir, value):
    """A foreign object where a set comprehension with an await builds its set is refused (SET_ADD)."""
    assert_refused(run_case(module_dir, "set_comp", "set", value), "stack[", "set")


@pytest.mark.parametrize("value", ["int", "list", "tuple"])
def test_dict_slot_of_a_dict_comprehension(module_dir, value):
    """A foreign object where a dict comprehension with an await builds its dict is refused (MAP_ADD casts it)."""
    assert_refused(run_case(module_dir, "dict_comp", "dict", value), "stack[", "dict")


@pytest.mark.parametrize("program, slot", [("star_set", "set"), ("star_tuple", "list")])
def test_other_builders(module_dir, program, slot):
    """The set of `{*xs, await g(), *xs}` (SET_UPDATE) and the list of `(*xs, await g())` (LIST_TO_TUPLE) refuse an int."""
    assert_refused(run_case(module_dir, program, slot, "int"), "stack[0]", slot)


def test_fake_exception_in_an_except_block(module_dir):
    """A fake-`__class__` ValueError in the previous-exception slot of an except block suspended at an await is refused."""
    assert_refused(run_case(module_dir, "in_except", "none", "fake_exc"), "stack[0]", "exception")


def test_fake_exception_in_a_finally_block(module_dir):
    """A fake-`__class__` ValueError in the slot a finally block re-raises is refused."""
    assert_refused(run_case(module_dir, "in_finally", "exception", "fake_exc"), "stack[1]", "exception")


def test_fake_saved_exception_state(module_dir):
    """A fake-`__class__` ValueError as the generator's saved exception (gi_exc_state) is refused."""
    assert_refused(run_case(module_dir, "in_except", "saved_exception", "fake_exc"), "exception")


@pytest.mark.parametrize("value", ["list_of_fake_exc", "list_of_int", "tuple"])
def test_except_star_list_of_raised_exceptions(module_dir, value):
    """The list an except* block collects raised exceptions in must be a list of exceptions or None."""
    assert_refused(run_case(module_dir, "except_star", "list", value), "stack[2]")


@pytest.mark.parametrize("value", ["int", "fake_exc"])
def test_except_star_rest_slot(module_dir, value):
    """The unmatched rest of an except* block (appended to that list, then re-raised) must be an exception or None."""
    assert_refused(run_case(module_dir, "except_star", "list", value, shift=1), "stack[3]")


@pytest.mark.parametrize("value", ["int", "plain_fake_iter", "fake_iter"])
def test_for_loop_iterator_slot(module_dir, value):
    """A non-iterator where a for loop keeps its iterator is refused, even one faking `__class__` and `__next__`."""
    assert_refused(run_case(module_dir, "for_loop", "list_iterator", value), "stack[0]", "iterator")


@pytest.mark.parametrize("value", ["sneaky_int", "fake_exc"])
def test_lasti_slot_of_a_with_block(module_dir, value):
    """A handler's lasti must be an exact int inside the code: an int subclass lying about its range is refused."""
    assert_refused(run_case(module_dir, "with_exit", "int", value), "stack[1]")


@pytest.mark.parametrize("slot, value", [("tuple", "int"), ("tuple", "list"), ("dict", "list"),
                                         ("dict", "int")])
def test_defaults_of_a_function_being_made(module_dir, slot, value):
    """The defaults tuple and keyword-defaults dict of a `def` suspended in its annotation must be exact (MAKE_FUNCTION stores them unchecked)."""
    assert_refused(run_case(module_dir, "make_fn", slot, value), "stack[", slot)


@pytest.mark.parametrize("program", ["star_list", "list_comp", "dict_comp", "for_loop",
                                     "in_except", "except_star", "make_fn"])
def test_unedited_records_load_and_resume(module_dir, program):
    """The same path with nothing edited loads and runs on (the harness itself is sound)."""
    proc = child(module_dir, program, "none_value", "none", "0")
    assert proc.returncode == 0, proc.stderr[-1500:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["outcome"] == "loaded", report
    assert report["ran"].startswith("returned"), report


# ------------------------------------------------------- the checks themselves


def test_python_and_native_kinds_agree():
    """The flow analysis's KIND_* flags and its pure-Python twin agree with tcc._native.check_kinds on real and fake objects."""
    from tcc import _native
    from tcc.capture import _flow

    names = ("ITER", "EXC", "EXC_OR_NONE", "LASTI", "LIST", "SET", "DICT", "TUPLE", "EXC_ITEMS")
    for name in names:
        assert getattr(_flow, f"KIND_{name}") == getattr(_native, f"KIND_{name}"), name

    class ClaimsValueError:
        @property
        def __class__(self):
            return ValueError

    class Meta(type):
        def __getattr__(cls, name):
            if name == "__next__":
                return lambda self: 1
            raise AttributeError(name)

    class NoNext(metaclass=Meta):
        pass

    class Lying(int):
        def __le__(self, other):
            return True

        __ge__ = __le__

    values = [None, 0, 5, 99, -1, 2**70, True, Lying(3), "s", (1,), [], [None, KeyError()], [1],
              {}, set(), frozenset(), ValueError(), ClaimsValueError(), NoNext(), iter([]),
              (x for x in ()), [ClaimsValueError()], type("L", (list,), {})()]
    kinds = [getattr(_flow, f"KIND_{name}") for name in names]
    for value in values:
        for kind in kinds:
            native = _native.check_kinds((value,), (kind,), object(), 10) == -1
            assert _flow._kinds_ok(value, kind, 10) == native, (value, kind)
    assert _native.check_kinds((ClaimsValueError(),), (_flow.KIND_EXC,), object(), 10) == 0
    assert _native.check_kinds((NoNext(),), (_flow.KIND_ITER,), object(), 10) == 0


def test_every_trusted_slot_has_a_known_producer():
    """In asyncio's code, every slot an instruction trusts has one known producer, so its kind reaches the record."""
    import asyncio
    import pathlib
    import types

    from tcc.capture import _flow

    def walk(code):
        yield code
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                yield from walk(const)

    checked = 0
    for path in sorted(pathlib.Path(asyncio.__file__).parent.glob("*.py")):
        for code in walk(compile(path.read_text(encoding="utf-8"), str(path), "exec")):
            info = _flow._CodeInfo(code)
            assert info.decided, code.co_qualname
            assert info.holes == [], (code.co_qualname, info.holes)
            checked += 1
    assert checked > 500
