"""Snapshot every program at every suspension point; finish it in a fresh process."""

from __future__ import annotations

import base64

import pytest

import tcc
from tests._support import programs
from tests._support.childrun import run_child_json

CHILD = r"""
import base64, json, sys
import tcc
from tests._support import programs
out = []
for line in open(sys.argv[1]):
    task, pending = tcc.loads(base64.b64decode(line))
    out.append(programs.drive(task, first=pending))
print(json.dumps(out))
"""


def uninterrupted(name: str) -> tuple[list[str], str]:
    return programs.drive(programs.PROGRAMS[name]())


@pytest.mark.parametrize("name", sorted(programs.PROGRAMS))
def test_resume_at_every_suspension_point_in_fresh_process(name, tmp_path):
    """For every k, a snapshot taken after k requests finishes exactly like the uninterrupted run."""
    trace, result = uninterrupted(name)
    assert len(trace) >= 2
    lines = []
    for k in range(len(trace) + 1):
        task = programs.PROGRAMS[name]()
        pending = programs.advance(task, k) if k else None
        lines.append(base64.b64encode(tcc.dumps((task, pending))).decode())
        programs.drive(task, first=pending)  # finish it: nothing left dangling
    blobs = tmp_path / "blobs.txt"
    blobs.write_text("\n".join(lines) + "\n")
    runs = run_child_json(CHILD, str(blobs))
    assert len(runs) == len(trace) + 1
    for k, (tail, child_result) in enumerate(runs):
        assert tail == trace[k:], f"{name}: divergence after restoring at point {k}"
        assert child_result == result, f"{name}: different result after restoring at point {k}"


@pytest.mark.parametrize("name", sorted(programs.PROGRAMS))
def test_dumps_does_not_disturb_the_original(name):
    """Capturing a task mid-run leaves the task itself able to finish normally."""
    trace, result = uninterrupted(name)
    k = len(trace) // 2
    task = programs.PROGRAMS[name]()
    pending = programs.advance(task, k)
    tcc.dumps(task)
    assert programs.drive(task, first=pending) == (trace[k:], result)


def test_two_loads_are_independent():
    """loads() twice on one blob gives two continuations that share nothing."""
    task = programs.shared_objects(4)
    pending = programs.advance(task, 2)
    blob = tcc.dumps((task, pending))
    (a, pa), (b, pb) = tcc.loads(blob), tcc.loads(blob)
    assert a is not b
    data_a = a.cr_frame.f_locals["data"]
    data_b = b.cr_frame.f_locals["data"]
    assert data_a == data_b and data_a is not data_b
    ra = programs.drive(a, first=pa)
    assert data_b == [programs.answer(programs.Req("fill", i)) for i in range(1)]
    rb = programs.drive(b, first=pb)
    assert ra == rb


def test_shared_list_identity_across_frames_survives(tmp_path):
    """A list referenced by an outer and an inner frame is still one list after restore."""
    task = programs.shared_objects(3)
    pending = programs.advance(task, 2)
    blob = tcc.dumps((task, pending))
    restored, pending = tcc.loads(blob)
    outer_data = restored.cr_frame.f_locals["data"]
    inner = restored.cr_await  # the `fill` coroutine
    assert inner.cr_frame.f_locals["data"] is outer_data
    trace, result = programs.drive(restored, first=pending)
    assert outer_data == [programs.answer(programs.Req("fill", i)) for i in range(3)]
    assert result == repr((outer_data, 3))


def test_generator_reachable_from_its_own_locals():
    """A coroutine whose local refers back to the coroutine is restored as a cycle."""

    class Box:
        pass

    async def selfref(box):
        box.seen = await programs.call("x", 1)
        return box.task is me_marker[0]

    me_marker = []
    box = Box()
    task = selfref(box)
    box.task = task
    me_marker.append(task)
    task.send(None)
    restored = tcc.loads(tcc.dumps(task))
    rbox = restored.cr_frame.f_locals["box"]
    assert rbox.task is restored
    assert rbox is not box
