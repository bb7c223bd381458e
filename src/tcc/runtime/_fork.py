"""Fork a run from one of its snapshots, optionally changing a local first.

``tcc fork RUN --at N --set answer='"yes"'`` makes a new run that starts from
snapshot N of RUN ("what if the model had answered yes?").  The parent is
untouched; the fork shares the snapshot's chunks and a copy of the journal
prefix the snapshot reflects.  The fork is not started: ``tcc resume`` does.
"""

from __future__ import annotations

import os
import types
from typing import Any

from .. import errors
from ..capture import _frames, dump_payload, load_payload, seal, unseal
from ..effects._effect import WaitRequest
from ..store import RunInfo, Store
from . import _scripts

_TCC_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _chain(root: Any, records: list[tuple[Any, Any]]) -> list[int]:
    """Indexes into ``records`` of the await chain from ``root`` inwards."""
    where = {id(gen): i for i, (gen, _record) in enumerate(records)}
    out: list[int] = []
    gen = root
    while id(gen) in where and len(out) < 10_000:
        i = where[id(gen)]
        out.append(i)
        code = _frames.code_of(gen)
        slots = records[i][1][3]
        nlocals = len(_frames.slot_names(code))
        gen = slots[-1] if len(slots) > nlocals else None
    return out


def _innermost_user_frame(root: Any, records: list[tuple[Any, Any]]) -> int:
    for i in reversed(_chain(root, records)):
        if not _frames.code_of(records[i][0]).co_filename.startswith(_TCC_DIR):
            return i
    raise errors.UsageError("the snapshot has no suspended frame of the agent to change")


def _setter(sets: dict[str, Any]) -> Any:
    def edit(state: Any, records: list[tuple[Any, Any]]) -> None:
        i = _innermost_user_frame(state[2], records)
        gen, record = records[i]
        code = _frames.code_of(gen)
        names = _frames.slot_names(code)
        slots = list(record[3])
        for name, value in sets.items():
            if name not in names:
                raise errors.UsageError(
                    f"{code.co_qualname}() has no local {name!r}; its locals are {', '.join(names)}"
                )
            idx = names.index(name)
            if isinstance(slots[idx], types.CellType):
                slots[idx].cell_contents = value
            else:
                slots[idx] = value
        records[i] = (gen, record[:3] + (tuple(slots),) + record[4:])

    return edit


def fork(
    store: Store,
    run_id: str,
    *,
    at: int | None = None,
    sets: dict[str, Any] | None = None,
    new_run_id: str | None = None,
) -> RunInfo:
    """Create (but do not start) a run from snapshot ``at`` of ``run_id``."""
    parent = store.get_run(run_id)
    numbers = [s.number for s in store.snapshots(run_id)]
    if not numbers:  # usage errors, as `tcc inspect` reports them
        why = (" (a --strategy replay run takes none)" if parent.strategy == "replay"
               else "; resume it until it has taken one")
        raise errors.UsageError(f"run {run_id} has no snapshot to fork{why}")
    if at is not None and at not in numbers:
        raise errors.UsageError(
            f"run {run_id} has no snapshot {at}; retained: {', '.join(map(str, numbers))}")
    _scripts.resolve(parent.entry)  # the frames' functions must be importable
    child = store.fork_run(run_id, at, new_run_id=new_run_id)
    try:
        payload = store.load_snapshot(child.run_id)
        state = load_payload(unseal(payload), edit=_setter(sets) if sets else None)
        if sets:
            store.checkpoint(child.run_id, child.epoch, seal(dump_payload(state), compress=False))
        pending = state[3]
        if pending[0] == "request" and isinstance(pending[1], WaitRequest):
            req = pending[1]  # the fork waits for its own answer
            store.add_event(child.run_id, "wait", {"id": req.wait_id, "name": req.name,
                                                   "kind": req.kind, "prompt": req.prompt})
        store.add_event(child.run_id, "forked", {"parent": run_id, "snapshot": at, "set": sorted(sets or {})})
        store.add_event(run_id, "fork", {"child": child.run_id, "snapshot": at})
        store.renew_lease(child.run_id, child.epoch, 0.0)  # resumable at once
    except BaseException:
        store.delete_run(child.run_id)
        raise
    return store.get_run(child.run_id)
