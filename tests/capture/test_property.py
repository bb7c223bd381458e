"""Property: capture/restore at any points of any interleaving never changes the outcome."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

import tcc
from tests._support import programs

NAMES = sorted(programs.PROGRAMS)


def step(task: Any, pending: Any) -> tuple[str, Any] | None:
    """Advance one request; None when the task has finished."""
    try:
        req = task.throw(pending) if isinstance(pending, BaseException) else task.send(pending)
    except StopIteration:
        return None
    return repr(req), programs.answer(req)


@given(
    name=st.sampled_from(NAMES),
    cuts=st.sets(st.integers(min_value=0, max_value=40), max_size=6),
)
def test_snapshots_at_arbitrary_points_preserve_the_run(name, cuts):
    """Restoring at any subset of suspension points yields the uninterrupted trace and result."""
    expected = programs.drive(programs.PROGRAMS[name]())
    task, pending, trace, n = programs.PROGRAMS[name](), None, [], 0
    originals = []
    while True:
        if n in cuts:
            originals.append((task, pending))
            task, pending = tcc.loads(tcc.dumps((task, pending)))
        try:
            req = task.throw(pending) if isinstance(pending, BaseException) else task.send(pending)
        except StopIteration as stop:
            result = repr(stop.value)
            break
        trace.append(repr(req))
        pending = programs.answer(req)
        n += 1
    assert (trace, result) == expected
    for old, old_pending in originals:  # finish them: none is left suspended
        assert programs.drive(old, first=old_pending)[1] == result


@given(
    schedule=st.lists(st.sampled_from([0, 1]), min_size=1, max_size=30),
    cuts=st.sets(st.integers(min_value=0, max_value=30), max_size=5),
)
def test_interleaved_tasks_sharing_state_survive_joint_capture(schedule, cuts):
    """Two interleaved coroutines sharing one list keep sharing it across joint snapshots."""

    def run(with_cuts: bool) -> list[Any]:
        shared: list[Any] = []
        tasks = [programs.fill(shared, 6), programs.fill(shared, 6)]
        pending: list[Any] = [None, None]
        done = [False, False]
        originals = []
        for i, who in enumerate(schedule):
            if with_cuts and i in cuts:
                originals.append((list(tasks), list(pending), list(done)))
                shared, tasks, pending = tcc.loads(tcc.dumps((shared, tasks, pending)))
            if done[who]:
                continue
            out = step(tasks[who], pending[who])
            if out is None:
                done[who] = True
            else:
                pending[who] = out[1]
        for who in (0, 1):  # finish both so nothing is left suspended
            while not done[who]:
                out = step(tasks[who], pending[who])
                done[who] = out is None
                if out is not None:
                    pending[who] = out[1]
        for old_tasks, old_pending, old_done in originals:
            for old, value, finished in zip(old_tasks, old_pending, old_done):
                if not finished:
                    programs.drive(old, first=value)
        return shared

    assert run(True) == run(False)


_ATOM = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
         | st.binary(max_size=20) | st.complex_numbers(allow_nan=False))
_DATA = st.recursive(_ATOM, lambda inner: st.lists(inner, max_size=6) | st.tuples(inner, inner)
                     | st.dictionaries(st.text(max_size=5) | st.integers(), inner, max_size=6),
                     max_leaves=80)


@given(_DATA)
def test_plain_payloads_are_the_bytes_the_pickler_writes(obj):
    """Effect arguments and results that are small plain data skip tcc's pickler (and
    importing it) and take ``pickle.dumps``: the bytes must be the pickler's own, so that
    nothing that reads or compares payloads can tell the two paths apart."""
    import io

    from tcc.capture import _api
    from tcc.capture._pickler import Pickler

    buf = io.BytesIO()
    Pickler(buf, protocol=_api.PROTOCOL).dump(obj)
    assert _api.dump_payload(obj) == buf.getvalue()
    assert tcc.loads(tcc.dumps(obj)) == obj or obj != obj


def test_large_or_unusual_payloads_take_the_pickler():
    from tcc.capture import _api

    shared: list[Any] = [1]
    loop: list[Any] = []
    loop.append(loop)

    class Str(str):
        pass

    assert _api._plain(((1, "a"), {"k": [shared, shared]}))
    assert not _api._plain(list(range(_api._PLAIN_ITEMS + 1)))  # the walk is bounded
    assert not _api._plain(loop)  # and ends on cycles
    assert not _api._plain([Str("x")])  # a subclass may have its own reduction
    assert not _api._plain({1, 2})  # sets are not walked: the pickler takes them
    assert not _api._plain([1j])  # reducer_override sees complex: a registered reducer applies
