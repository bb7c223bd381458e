"""Fork a run from one of its snapshots, optionally changing a local first.

``tcc fork RUN --at N --set answer='"yes"'`` makes a new run that starts from
snapshot N of RUN ("what if the model had answered yes?").  The parent is
untouched; the fork shares the snapshot's chunks and a copy of the journal
prefix the snapshot reflects.  The fork is not started: ``tcc resume`` does.
"""

from __future__ import annotations

import dis
import os
import reprlib
import types
from typing import Any

from .. import errors
from ..capture import code_of, dump_stored, load_payload, slot_names, unseal
from ..effects import WaitRequest
from ..store import RunInfo, Store
from ._pinning import CODE_EVENT, PinnedCode, manifest_of, policy_of
from ._state import RunState, pack_state, unpack_state

_NO_ANSWER: Any = object()
_TCC_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _chain(root: Any, records: list[tuple[Any, Any]]) -> list[int]:
    """Indexes into ``records`` of the await chain from ``root`` inwards."""
    where = {id(gen): i for i, (gen, _record) in enumerate(records)}
    out: list[int] = []
    gen = root
    while id(gen) in where and len(out) < 10_000:
        i = where[id(gen)]
        out.append(i)
        code = code_of(gen)
        slots = records[i][1][3]
        nlocals = len(slot_names(code))
        gen = slots[-1] if len(slots) > nlocals else None
    return out


def _innermost_user_frame(root: Any, records: list[tuple[Any, Any]]) -> int:
    for i in reversed(_chain(root, records)):
        if not code_of(records[i][0]).co_filename.startswith(_TCC_DIR):
            return i
    raise errors.UsageError("the snapshot has no suspended frame of the agent to change")


_STORES = ("STORE_FAST", "STORE_DEREF", "STORE_NAME", "STORE_GLOBAL")


def stored_answer(code: types.CodeType, offset: int) -> tuple[list[str], int] | None:
    """The variables (and their line) that the value sent into a frame suspended at
    ``offset`` is stored into straight away (``answer = await llm(...)``, or ``a, b =
    await tcc.gather(...)``), or None.

    ``offset`` is the frame record's position: the ``YIELD_VALUE`` of the await, in code
    units, on 3.11-3.13.  The awaited value lands where the await's ``SEND`` jumps to
    when the awaited object returns (3.12+: an ``END_SEND`` first).
    """
    instructions = list(dis.get_instructions(code))
    at = next((k for k, ins in enumerate(instructions) if ins.offset == offset * 2), None)
    if at is None or instructions[at].opname != "YIELD_VALUE":
        return None
    send = next((ins for ins in reversed(instructions[:at]) if ins.opname == "SEND"), None)
    if send is None or not isinstance(send.argval, int):
        return None
    after = [ins for ins in instructions if ins.offset >= send.argval
             and ins.opname not in ("END_SEND", "NOP", "CACHE")]
    if not after:
        return None
    first = after[0]
    line = (first.positions.lineno if first.positions is not None else None) or code.co_firstlineno
    if first.opname in _STORES:
        return [str(first.argval)], line
    if first.opname == "UNPACK_SEQUENCE" and isinstance(first.arg, int):
        names: list[str] = []
        for ins in after[1:]:
            if len(names) >= first.arg:
                break
            if ins.opname == "STORE_FAST_STORE_FAST" and isinstance(ins.argval, tuple):
                names += [str(n) for n in ins.argval]  # 3.13: two stores in one instruction
            elif ins.opname in _STORES:
                names.append(str(ins.argval))
            else:
                return None
        return (names, line) if len(names) == first.arg else None
    return None


def _awaited_kind(root: Any, records: list[tuple[Any, Any]]) -> str:
    """What the innermost frame of the chain awaits: 'EffectRequest', 'GatherRequest',
    'CheckpointRequest' ... (the class whose ``__await__`` is suspended), or ''."""
    return _awaited(root, records)[0]


def _awaited(root: Any, records: list[tuple[Any, Any]]) -> tuple[str, Any]:
    """(:func:`_awaited_kind`, the request object awaited, or None)."""
    chain = _chain(root, records)
    if not chain:
        return "", None
    gen, record = records[chain[-1]]
    code = code_of(gen)
    if not code.co_filename.startswith(_TCC_DIR) or not code.co_qualname.endswith(".__await__"):
        return "", None
    slots = record[3]
    return code.co_qualname.rpartition(".")[0], (slots[0] if slots else None)


def _setter(sets: dict[str, Any], answering: bool) -> Any:
    def edit(root: Any, records: list[tuple[Any, Any]]) -> None:
        i = _innermost_user_frame(root, records)
        gen, record = records[i]
        code = code_of(gen)
        names = slot_names(code)
        slots = list(record[3])
        stored = stored_answer(code, record[2])
        for name, value in sets.items():
            if name not in names:
                raise errors.UsageError(
                    f"{code.co_qualname}() has no local {name!r}; its locals are {', '.join(names)}"
                )
            kind = _awaited_kind(root, records)
            if stored is not None and name in stored[0] and kind:
                if kind not in ("EffectRequest", "GatherRequest"):
                    how = ("resume the fork and send the value it waits for with `tcc signal` "
                           "or `tcc approve` instead")
                elif answering:
                    how = "--answer already replaces that answer"
                else:
                    how = "use --answer JSON to replace the answer instead"
                raise errors.UsageError(
                    f"--set {name}: {code.co_qualname}() stores the answer it is waiting for into "
                    f"{name!r} as soon as it resumes ({code.co_filename}:{stored[1]}), so the "
                    f"value set would be overwritten; {how}")
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
    answer: Any = _NO_ANSWER,
    new_run_id: str | None = None,
) -> RunInfo:
    """Create (but do not start) a run from snapshot ``at`` of ``run_id``.

    ``sets`` changes locals of the innermost agent frame; ``answer`` replaces the answer
    that frame receives when it resumes (the result of the effect call, or the list of a
    ``tcc.gather``, that it awaits).
    """
    parent = store.get_run(run_id)
    numbers = [s.number for s in store.snapshots(run_id)]
    if not numbers:  # usage errors, as `tcc inspect` reports them
        why = (" (a --strategy replay run takes none)" if parent.strategy == "replay"
               else "; resume it until it has taken one")
        raise errors.UsageError(f"run {run_id} has no snapshot to fork{why}")
    if at is not None and at not in numbers:
        raise errors.UsageError(
            f"run {run_id} has no snapshot {at}; retained: {', '.join(map(str, numbers))}")
    events = store.events(run_id)
    manifest, policy = manifest_of(events), policy_of(events)
    # the snapshot's frames on the code they were taken in, if the files changed since
    pinned = PinnedCode(store, run_id, manifest, pin=bool(manifest))
    pinned.entry_module(parent.entry)  # the frames' functions must be importable
    # Everything that can be refused (a local that does not exist, an answer with nothing
    # to replace) is checked on the parent's snapshot, before the fork exists: a refused
    # fork leaves no trace on the parent.
    payload = store.load_snapshot(run_id, at)
    answering = answer is not _NO_ANSWER
    kinds: list[tuple[str, Any]] = []
    number = at if at is not None else max(numbers)

    def edit(stored: Any, records: list[tuple[Any, Any]]) -> None:
        root = unpack_state(stored, run_id, number).coro
        kinds.append(_awaited(root, records))
        if sets:
            _setter(sets, answering)(root, records)

    state = unpack_state(load_payload(unseal(payload, authenticated=True), modules=pinned.resolve,
                                      edit=edit if sets or answering else None), run_id, number)
    if answering:
        state = _answered(state, answer, kinds[0] if kinds else ("", None), run_id, at)
    edited = dump_stored(pack_state(state)) if sets or answering else None
    child = store.fork_run(run_id, at, new_run_id=new_run_id)
    try:
        if manifest:  # the fork's snapshot needs the same code (deferred: with its commit)
            carried = dict(manifest)
            if edited is not None:  # re-taken on the pinned modules: it names them
                carried.update({pname: {**manifest[name], "from": name}
                                for name, pname in pinned.remap.items()})
            store.add_event(child.run_id, CODE_EVENT, {"modules": carried, "forked_from": run_id},
                            epoch=child.epoch, deferred=edited is not None)
        if edited is not None:
            store.checkpoint(child.run_id, child.epoch, edited)
        if state.resumption[0] == "request" and isinstance(state.resumption[1], WaitRequest):
            req = state.resumption[1]  # the fork waits for its own answer
            store.add_event(child.run_id, "wait", {"id": req.wait_id, "name": req.name,
                                                   "kind": req.kind, "prompt": req.prompt})
        answered = {"answer": True, "answer_value": reprlib.repr(answer),
                    "journal": store.journal_length(child.run_id)} if answering else {}
        store.add_event(child.run_id, "forked", {"parent": run_id, "snapshot": at, "set": sorted(sets or {}),
                                                 "on_code_change": policy, **answered})
        store.add_event(run_id, "fork", {"child": child.run_id, "snapshot": at})
        store.renew_lease(child.run_id, child.epoch, 0.0)  # resumable at once
    except BaseException:
        store.delete_run(child.run_id)
        raise
    return store.get_run(child.run_id)


def _answered(state: RunState, answer: Any, awaited: tuple[str, Any], run_id: str,
              at: int | None) -> RunState:
    """``state`` with the answer its innermost frame receives on resume replaced."""
    kind, request = awaited
    which = f"snapshot {at}" if at is not None else "the newest snapshot"
    if state.resumption[0] == "request":
        raise errors.UsageError(
            f"run {run_id}'s {which} was taken where it waits for a signal or sleeps, so there "
            "is no answer to replace: resume the fork and answer it with `tcc signal` / "
            "`tcc approve`")
    if kind not in ("EffectRequest", "GatherRequest"):
        raise errors.UsageError(
            f"run {run_id}'s {which} was not taken after an effect call (it was taken at "
            f"{'tcc.checkpoint()' if kind == 'CheckpointRequest' else 'a point with no answer'}), "
            "so --answer has nothing to replace; fork from a snapshot taken after an effect")
    calls = getattr(request, "requests", None)
    if kind == "GatherRequest" and not (isinstance(answer, list) and isinstance(calls, tuple)
                                        and len(answer) == len(calls)):
        raise errors.UsageError(
            f"the snapshot's frame awaits a tcc.gather() of {len(calls or ())} calls: --answer "
            "must be a JSON list with one answer per gathered call")
    return state._replace(resumption=("send", answer))
