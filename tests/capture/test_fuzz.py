"""Fuzz: mutated snapshots and frame records never crash the interpreter.

Three layers, each run in a child process whose death by a signal fails the
test (the last mutant it started is written out for reproduction):

* ``sealed``  -- bit flips, truncations, splices and byte insertions in whole
  blobs.  All must be refused (the integrity digest guarantees it).
* ``payload`` -- the same mutations applied to the pickle *inside* the
  envelope, which is then resealed, so they reach the unpickler and the
  native validation.  Each must load or raise; none may crash.
* ``record``  -- frame records handed straight to ``_native.check_frame`` /
  ``write_frame`` with corrupted offsets, states, slot counts, cell slots and
  exception state.
* ``structured`` -- structured slot substitutions through the public load
  path (``load_payload``'s ``edit`` hook, the one ``tcc fork --set`` uses):
  one value-stack slot of one frame of a suspended corpus program, or its
  saved exception, is replaced by an object of a foreign type (int, tuple,
  str, None, NULL, lists and sets and dicts, a real exception or iterator) or
  a fake one (an ``int`` whose ``__class__`` property claims ``ValueError``
  and whose digits hold an unmapped pointer, objects claiming ``list``,
  ``dict`` or ``list_iterator``, an iterator class whose metaclass invents
  ``__next__``, an int lying about its range).  Each mutant must be refused
  with a ``RestoreError`` or, if loaded, run on (driven, thrown into or
  closed) to a Python-level outcome.

Sizes: ``TCC_FUZZ_MUTANTS`` per layer (default 300); the slow tier runs
``TCC_SLOW_FUZZ_MUTANTS`` per layer (default 30000).  Each layer prints one
``fuzz:`` line with its outcomes (for benchmarks/reliability_report.py).
"""

from __future__ import annotations

import base64
import json
import os
import random
import resource
import subprocess
import sys

import pytest

import tcc
from tcc.capture import _blob
from tests._support import programs
from tests._support.childrun import child_env

MUTANTS = int(os.environ.get("TCC_FUZZ_MUTANTS", "300"))
SLOW_MUTANTS = int(os.environ.get("TCC_SLOW_FUZZ_MUTANTS", "30000"))

CHILD = r"""
import base64, json, os, sys
import tcc
from tcc import _native
from tcc.capture import _records, _frames
from tests._support import programs

mode, path = sys.argv[1], sys.argv[2]
outcomes = {}
keep = []  # never finalised: see the module docstring
def note(key):
    outcomes[key] = outcomes.get(key, 0) + 1

if mode == "record":
    import random
    rng = random.Random(int(sys.argv[3]))
    count = int(sys.argv[4])
    sources = []
    for name in sorted(programs.PROGRAMS):
        task = programs.PROGRAMS[name]()
        programs.advance(task, 1)
        gen = task
        while gen is not None:  # every frame of the chain
            sources.append((gen, _native.read_frame(gen, _records.NULL)))
            gen = getattr(gen, "cr_await", None) or getattr(gen, "gi_yieldfrom", None)
            if not isinstance(gen, _frames.GENERATOR_TYPES):
                gen = None
        keep.append(task)
    pool = [None, _records.NULL, 0, -1, "x", (), object(), ValueError("v"), type(lambda: 0).__code__]
    for i in range(count):
        gen, (state, offset, slots, exc, func) = rng.choice(sources)
        if state != _frames.SUSPENDED:
            continue
        slots = list(slots)
        what = rng.randrange(6)
        if what == 0:
            offset = rng.choice([offset + rng.randint(-6, 6), rng.randint(-3, 10**6), -1, 2**31 - 1])
        elif what == 1:
            state = rng.choice([-5, 0, 2, 3, 99])
        elif what == 2:
            n = rng.randint(0, len(slots) + 40)
            slots = (slots + [None] * n)[:n]
        elif what == 3 and slots:
            slots[rng.randrange(len(slots))] = rng.choice(pool)
        elif what == 4:
            exc = rng.choice(pool)
        else:
            rng.shuffle(slots)
        fresh = _frames.fresh_generator(func)
        keep.append(fresh)
        print(i, flush=True)
        try:
            _native.check_frame(fresh, func.__code__, state, offset, tuple(slots), exc, _records.NULL)
            _native.write_frame(fresh, func.__code__, state, offset, tuple(slots), exc, _records.NULL)
            note("written")
        except (TypeError, ValueError, OverflowError) as e:
            note(type(e).__name__)
elif mode == "structured":
    import random
    from tcc.capture import load_payload
    rng = random.Random(int(sys.argv[3]))
    count = int(sys.argv[4])

    class FakeExc(int):
        @property
        def __class__(self):
            return ValueError

    # 30-bit digits whose 64-bit words read 0x00000bad00000010 where an
    # exception keeps its args, notes, traceback, context and cause.
    POINTERS = sum(d << (30 * i) for i, d in enumerate([1, 1] + [0x10, 0xBAD] * 4 + [1]))

    class Claims:
        def __init__(self, cls):
            self._cls = cls

        @property
        def __class__(self):
            return self._cls

    class NextMeta(type):
        def __getattr__(cls, name):
            if name == "__next__":
                return lambda self: 1
            raise AttributeError(name)

    class FakeIter(Claims, metaclass=NextMeta):
        pass

    class SneakyInt(int):
        def __le__(self, other):
            return True

        __ge__ = __lt__ = __gt__ = __le__

    pool = [
        lambda: 5, lambda: -1, lambda: 2 ** 40, lambda: (1, 2), lambda: "s", lambda: None,
        lambda: _records.NULL, lambda: [5], lambda: [], lambda: {}, lambda: set(),
        lambda: ValueError("v"), lambda: iter(()), lambda: [FakeExc(POINTERS)],
        lambda: FakeExc(POINTERS), lambda: Claims(ValueError), lambda: Claims(list),
        lambda: Claims(dict), lambda: FakeIter(type(iter([]))), lambda: SneakyInt(10 ** 6),
        lambda: SneakyInt(3),
    ]
    # The corpus: programs.py and test_flow.py's tricky programs (with,
    # except*, comprehensions, match, calls with * and **...).  Targets: every
    # value-stack slot (-1: the saved exception) of every suspension point
    # (code, offset) met in the chains of the seeds.  Each round of
    # len(targets) mutants substitutes every target once, in random order.
    from tests.capture import test_flow
    corpus = {**programs.PROGRAMS, **test_flow.TRICKY}
    seeds, targets, met = [], [], set()
    for name in sorted(corpus):
        trace, _ = programs.drive(corpus[name]())
        for k in sorted({1, len(trace) // 2, len(trace)} - {0}):
            task = corpus[name]()
            pending = programs.advance(task, k)
            seeds.append((tcc.capture.dump_payload(task), pending))
            keep.append(task)
            gen = task
            while isinstance(gen, _frames.GENERATOR_TYPES):
                code = _frames.code_of(gen)
                state, offset, slots, _exc, _func = _native.read_frame(gen, _records.NULL)
                if (code, offset) not in met and state == _frames.SUSPENDED:
                    met.add((code, offset))
                    depth = len(slots) - len(_frames.slot_names(code))
                    targets += [(len(seeds) - 1, code, offset, at) for at in range(-1, depth)]
                gen = getattr(gen, "cr_await", None) or getattr(gen, "gi_yieldfrom", None)
    print(f"{len(targets)} targets", file=sys.stderr)
    order = []
    for i in range(count):
        if not order:
            order = list(targets)
            rng.shuffle(order)
        seed, code, offset, at = order.pop()
        payload, pending = seeds[seed]
        value = rng.choice(pool)()

        def edit(obj, records, code=code, offset=offset, at=at, value=value):
            # (==: a nested function travels by value, with a copy of its code)
            j = next(j for j, (g, r) in enumerate(records)
                     if _frames.code_of(g) == code and r[1:3] == (_frames.SUSPENDED, offset))
            gen, (version, state, off, slots, exc, name, qualname) = records[j]
            nlp = len(_frames.slot_names(code))
            slots = list(slots)
            if at < 0:
                exc = value
            else:
                slots[nlp + at] = value
            records[j] = (gen, (version, state, off, tuple(slots), exc, name, qualname))

        print(i, flush=True)
        try:
            task = load_payload(payload, edit=edit)
        except tcc.RestoreError as e:
            note(type(e).__name__)
            continue
        except Exception as e:  # a non-tcc error at load is a finding, but not a crash
            note("other:" + type(e).__name__)
            continue
        keep.append(task)
        how = rng.choice(("drive", "drive", "throw", "close"))  # resuming reaches most uses
        try:
            if how == "drive":
                programs.drive(task, first=pending, limit=40)
            elif how == "throw":
                task.throw(KeyError("fuzz"))
            else:
                task.close()
            note("ran")
        except BaseException:  # noqa: BLE001 - any Python-level outcome is fine
            note("ran-raised")
else:
    for i, line in enumerate(open(path)):
        print(i, flush=True)
        try:
            keep.append(tcc.loads(base64.b64decode(line)))
            note("loaded")
        except tcc.RestoreError as e:
            note(type(e).__name__)
        except Exception as e:  # a non-tcc error is a finding, but not a crash
            note("other:" + type(e).__name__)
print(json.dumps(outcomes), flush=True)
os._exit(0)  # skip finalisers: we test loading, not running, mutants
"""


def corpus() -> list[tuple[bytes, bytes]]:
    """(blob, payload) pairs: every program at a few suspension points."""
    out = []
    for name in sorted(programs.PROGRAMS):
        trace, _ = programs.drive(programs.PROGRAMS[name]())
        for k in sorted({0, 1, len(trace) // 2, len(trace)}):
            task = programs.PROGRAMS[name]()
            pending = programs.advance(task, k)
            payload = tcc.capture.dump_payload((task, pending))
            out.append((_blob.seal(payload), payload))
            programs.drive(task, first=pending)
    return out


def mutate(rng: random.Random, data: bytes, other: bytes) -> bytes:
    data = bytearray(data)
    kind = rng.randrange(5)
    if kind == 0:
        for _ in range(rng.randint(1, 4)):
            pos = rng.randrange(len(data))
            data[pos] ^= 1 << rng.randrange(8)
    elif kind == 1:
        del data[rng.randrange(len(data)) :]
    elif kind == 2:
        cut = rng.randrange(len(data))
        data = data[:cut] + other[rng.randrange(len(other)) :]
    elif kind == 3:
        pos = rng.randrange(len(data))
        data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    else:
        pos = rng.randrange(len(data))
        data[pos] = rng.choice([0, 0xFF, 0x7F, 0x80, data[pos] + 1 & 0xFF])
    return bytes(data)


def limit_memory() -> None:
    # A mutated length field must end as MemoryError, not as an OOM kill.
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def run_child(tmp_path, mode: str, *args: str) -> dict[str, int]:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, mode, *args],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=900,
        preexec_fn=limit_memory,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and lines:
        outcomes = json.loads(lines[-1])
        print(f"\nfuzz: layer={mode} mutants={sum(outcomes.values())} signals=0 "
              f"outcomes={json.dumps(outcomes, sort_keys=True)}")
    if proc.returncode != 0:
        last = lines[-1] if lines else "?"
        (tmp_path / "crasher.txt").write_text(f"mode={mode} args={args} last-index={last}\n")
        pytest.fail(
            f"child died (returncode {proc.returncode}) at {mode} mutant {last}; "
            f"stderr tail: {proc.stderr[-2000:]}"
        )
    return json.loads(lines[-1])


def write_mutants(tmp_path, mutants: list[bytes]) -> str:
    path = tmp_path / "mutants.txt"
    path.write_text("".join(base64.b64encode(m).decode() + "\n" for m in mutants))
    return str(path)


@pytest.fixture(scope="module")
def seeds():
    return corpus()


def test_mutated_sealed_blobs_are_all_refused(seeds, tmp_path):
    """Every mutation of a sealed snapshot is refused with a RestoreError in a child."""
    rng = random.Random(1234)
    valid = {blob for blob, _ in seeds}
    mutants = []
    while len(mutants) < MUTANTS:
        blob, _ = rng.choice(seeds)
        mutant = mutate(rng, blob, rng.choice(seeds)[0])
        # a splice can rebuild another seed exactly (same header, cut where the
        # tails line up): a valid blob, not a mutant -- the slow tier hit one
        if mutant not in valid:
            mutants.append(mutant)
    outcomes = run_child(tmp_path, "sealed", write_mutants(tmp_path, mutants))
    assert sum(outcomes.values()) == MUTANTS
    assert "loaded" not in outcomes, outcomes
    assert not any(key.startswith("other:") for key in outcomes), outcomes


def test_mutated_payloads_never_crash_the_loader(seeds, tmp_path):
    """Mutated pickles behind a valid envelope load or raise, and never crash the child."""
    rng = random.Random(5678)
    mutants = []
    while len(mutants) < MUTANTS:
        _, payload = rng.choice(seeds)
        mutant = mutate(rng, payload, rng.choice(seeds)[1])
        if mutant != payload:
            mutants.append(_blob.seal(mutant))
    outcomes = run_child(tmp_path, "payload", write_mutants(tmp_path, mutants))
    assert sum(outcomes.values()) == MUTANTS
    assert outcomes.get("CorruptSnapshotError", 0) > MUTANTS // 4, outcomes
    assert not any(key.startswith("other:") for key in outcomes), outcomes


def test_corrupted_frame_records_are_rejected_or_written_safely(tmp_path):
    """Native validation rejects bad offsets, states, sizes, cells and exception state without crashing."""
    outcomes = run_child(tmp_path, "record", "-", "99", str(MUTANTS))
    assert outcomes.get("ValueError", 0) > 0 and outcomes.get("TypeError", 0) > 0, outcomes


def test_structured_slot_substitutions_never_crash(tmp_path):
    """Foreign-typed and fake-`__class__` objects in value-stack slots are refused or run cleanly, never crash."""
    outcomes = run_child(tmp_path, "structured", "-", "4242", str(MUTANTS))
    assert sum(outcomes.values()) == MUTANTS, outcomes
    assert outcomes.get("CorruptSnapshotError", 0) > 0, outcomes
    assert outcomes.get("ran", 0) + outcomes.get("ran-raised", 0) > 0, outcomes
    assert not any(key.startswith("other:") for key in outcomes), outcomes


@pytest.mark.slow
def test_large_fuzz_campaign(seeds, tmp_path, monkeypatch):
    """The slow tier: TCC_SLOW_FUZZ_MUTANTS (default 30000) mutants per layer."""
    monkeypatch.setattr(sys.modules[__name__], "MUTANTS", SLOW_MUTANTS)
    test_mutated_sealed_blobs_are_all_refused(seeds, tmp_path)
    test_mutated_payloads_never_crash_the_loader(seeds, tmp_path)
    test_corrupted_frame_records_are_rejected_or_written_safely(tmp_path)
    test_structured_slot_substitutions_never_crash(tmp_path)


class _FillAgain:
    """Pickles as one more ``fill_generator(gen, record)`` call for an already-filled generator."""

    def __init__(self, gen, record):
        self.gen, self.record = gen, record

    def __reduce__(self):
        from tcc.capture import _records

        return (_records.fill_generator, (self.gen, self.record))


def test_two_records_for_one_generator_are_refused_before_any_frame_is_written():
    """Regression (found by atheris): a payload filling one generator twice was half-restored.

    Both records passed the per-record check, the first frame was written and
    the second write raised a bare ValueError; the half-restored coroutine then
    ran its ``finally`` block when collected.  Now: RestoreError, no frame
    written, no user code run.
    """
    import gc

    from tcc import _native
    from tcc.capture import _records, dump_payload, seal

    task = programs.PROGRAMS["with_cleanup"]()
    pending = programs.advance(task, 1)
    state, offset, slots, exc, _func = _native.read_frame(task, _records.NULL)
    record = (1, state, offset, slots, exc, task.__name__, task.__qualname__)
    blob = seal(dump_payload((task, _FillAgain(task, record))))
    programs.drive(task, first=pending)
    programs.CLEANUP_LOG.clear()
    with pytest.raises(tcc.RestoreError, match="two frame records for one generator of with_cleanup"):
        tcc.loads(blob)
    gc.collect()
    assert programs.CLEANUP_LOG == []
