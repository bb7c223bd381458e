"""A run's detail view (``tcc show``): what the store holds about one run, as one document.

The CLI prints it as text or JSON; a dashboard can serve it as is.  Payloads (effect
arguments, results, errors) are read with capture's restricted unpickler, which runs no
user code, and shown with the caller's ``show_value(value, limit)`` (the CLI's safe repr).

A long journal is read from its end only, growing the window until it holds the calls
asked for; then the calls before them, and the run's effects, are not counted.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import time
from typing import Any, Callable

from .. import errors
from ..capture import PINNED_PREFIX, load_payload, unseal
from ..store import FINAL_STATUSES, Event, JournalRecord, RunInfo, SnapshotInfo, Store
from . import _report, _scripts
from ._outcome import decode_result
from ._pinning import changed_files, manifest_of, policy_of
from ._state import RunState, unpack_state
from ._worker import owner_dead, pending_waits, unstarted_fork

FULL_READ = 5000  # a journal of at most this many records is read whole (exact counts)
REPR_LIMIT = 200  # characters of an argument list, a result or an error in the call listing

ShowValue = Callable[[Any, int], str]


def when(ts: float) -> str:
    """A time stamp as the CLI and the call listing write it (local time, seconds)."""
    return datetime.datetime.fromtimestamp(ts).isoformat(sep=" ", timespec="seconds")


@dataclasses.dataclass
class RunDetail:
    """:func:`run_detail`'s answer: ``doc`` is the JSON document of ``tcc show --json``;
    the other fields are what the text form needs besides it."""

    doc: dict[str, Any]
    run: RunInfo
    snapshots: list[SnapshotInfo]
    events: list[Event]
    error: dict[str, Any] | None  # the decoded error (runtime._report), for its traceback
    whole: bool  # the whole journal was read (counts are exact)
    calls_total: int  # logical calls in what was read
    shown: int  # ... of which the document lists this many


def owner_alive(run: RunInfo) -> bool:
    """Whether the owner of a running run still holds it, as the worker judges it."""
    return not owner_dead(run, time.time())


def _payload(blob: bytes | None) -> tuple[bool, Any]:
    """(True, a view of ``blob``) from the restricted unpickler, or (False, why not)."""
    from ..capture import safe_loads  # the restricted loader, for displays only

    if blob is None:
        return False, "<nothing recorded>"
    try:
        return True, safe_loads(bytes(blob))
    except Exception as exc:  # noqa: BLE001 - a payload it cannot read is shown as such
        return False, f"<unreadable payload: {type(exc).__name__}>"


def _clip(text: str, limit: int = REPR_LIMIT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


class _Calls:
    """Journal records grouped into calls and described with ``show_value``."""

    def __init__(self, show_value: ShowValue) -> None:
        self.show_value = show_value

    def safe(self, value: Any, limit: int = REPR_LIMIT) -> str:
        try:
            return self.show_value(value, limit)
        except Exception as exc:  # noqa: BLE001 - never let one value end the listing
            return f"<repr failed: {type(exc).__name__}>"

    def args(self, name: str, blob: bytes | None) -> str:
        """The argument list of a journaled call, as it would be written in the call."""
        from ._markers import SLEEP_EFFECT, SPAWN_EFFECT, WAIT_EFFECT, read_wait_args

        ok, value = _payload(blob)
        if not ok:
            return str(value)
        if name == SLEEP_EFFECT and isinstance(value, (int, float)):
            return f"until {when(value)}"
        if name == WAIT_EFFECT and isinstance(value, tuple):
            wait_id, deadline = read_wait_args(value)
            if wait_id is not None and deadline is not None:
                return f"{self.safe(wait_id)}, timeout at {when(deadline)}"
        if not name.startswith("tcc:") and isinstance(value, tuple) and len(value) == 2 \
                and isinstance(value[0], tuple) and isinstance(value[1], dict):
            args, kwargs = value
            parts = [self.safe(a) for a in args] + [f"{k}={self.safe(v)}" for k, v in kwargs.items()]
            return _clip(", ".join(parts))
        if name == SPAWN_EFFECT and isinstance(value, tuple):
            return _clip(", ".join(self.safe(v) for v in value))
        return self.safe(value)

    def outcome(self, c: JournalRecord | None) -> dict[str, Any]:
        if c is None:
            return {"status": "pending", "result": None, "error": None, "duration": None}
        if c.error is not None:
            ok, value = _payload(c.error)
            return {"status": "error", "result": None, "error": self.safe(value) if ok else str(value),
                    "duration": c.duration}
        ok, value = _payload(c.result)
        return {"status": "ok", "result": self.safe(value) if ok else str(value), "error": None,
                "duration": c.duration}

    def doc(self, number: int, intents: list[JournalRecord], done: dict[int, JournalRecord]) -> dict[str, Any]:
        first, last = intents[0], intents[-1]
        attempts = [{"attempt": i.attempt, "seq": i.seq, **self.outcome(done.get(i.seq))} for i in intents]
        args = self.args(first.name, first.args)
        short = first.name if first.name.startswith("tcc:") else first.name.rpartition(":")[2]
        return {"number": number, "seq": first.seq, "key": first.idempotency_key, "name": first.name,
                "call": f"{short}({args})", "args": args, **attempts[-1], "attempt": last.attempt,
                "time": first.time, "attempts": attempts}


def logical_calls(journal: list[JournalRecord]) -> list[list[JournalRecord]]:
    """The journal's intents grouped into calls: the attempts of one call (retries, a
    re-issue after a crash) share its idempotency key.  In order of their first intent."""
    calls: dict[str, list[JournalRecord]] = {}
    for r in journal:
        if r.kind == "intent":
            calls.setdefault(r.idempotency_key or f"#{r.seq}", []).append(r)
    return list(calls.values())


def _journal_length(store: Store, run_id: str) -> int | None:
    """How many journal records the run has, from the store's count (None: this store
    cannot say without reading the journal)."""
    length = getattr(store, "journal_length", None)
    return int(length(run_id)) if callable(length) else None


def _journal_tail(store: Store, run_id: str, calls: int | None) -> tuple[list[JournalRecord], int]:
    """(journal records, seq of the first) holding the last ``calls`` logical calls whole
    (all records if ``calls`` is None or the journal is short).

    Only the tail is read: from the end back as far as needed, growing the window
    until it holds more than ``calls`` calls (the oldest one in it may have attempts
    before the window; it is left out of the listing)."""
    total = _journal_length(store, run_id) if calls is not None else None
    if calls is None or total is None or total <= FULL_READ:
        return store.journal(run_id), 0
    window = 4 * (calls + 1)
    while True:
        start = max(0, total - window)
        journal: list[JournalRecord] = store.journal(run_id, start)
        if start == 0 or len(logical_calls(journal)) > calls:
            return journal, start
        window *= 4


def code_state(events: list[Event], status: str) -> dict[str, Any] | None:
    """The run's recorded code and whether its files changed since (read, never run):
    ``{"policy", "modules": {name: {"file", "sha256"}}, "changed": [names], "pinned":
    whether the run already continues on pinned code}``; None if it recorded none."""
    manifest = manifest_of(events)
    if not manifest:
        return None
    on_pinned = any(name.startswith(PINNED_PREFIX) for name in list(manifest)[-1:])
    return {"policy": policy_of(events), "modules": manifest,
            "changed": changed_files(manifest) if status not in FINAL_STATUSES else [],
            "pinned": on_pinned}


def run_detail(store: Store, run_id: str, *, calls: int | None, show_value: ShowValue) -> RunDetail:
    """The run, its last ``calls`` effect calls (None: all of them), snapshots and events."""
    from ._markers import MARKERS

    run = store.get_run(run_id)
    journal, start = _journal_tail(store, run_id, calls)
    whole = start == 0
    snapshots = store.snapshots(run_id)
    events = store.events(run_id)
    completions = [r for r in journal if r.kind == "completion"]
    intents = {r.seq: r for r in journal if r.kind == "intent"}
    # wait and sleep markers are journaled like effects but are not effects (as in `tcc run`)
    done_keys = {intents[c.intent_seq].idempotency_key for c in completions
                 if c.intent_seq in intents and intents[c.intent_seq].name not in MARKERS}
    checkpoints = max((s.number for s in snapshots if not s.damaged), default=0)
    done = {c.intent_seq: c for c in completions if c.intent_seq is not None}
    logical = logical_calls(journal)
    if not whole:
        logical = logical[1:]  # its first attempts may lie before the window
    shown = len(logical) if calls is None else min(calls, len(logical))
    describe = _Calls(show_value)
    numbered = [describe.doc(i + 1, logical[i], done) for i in range(len(logical) - shown, len(logical))]
    if not whole:
        for call in numbered:
            call["number"] = None  # the calls before the window are not counted
    forked = next((dict(e.data) for e in events if e.kind == "forked"), {})
    if isinstance(forked.get("answer_value"), str) and isinstance(forked.get("journal"), int):
        # a fork made with --answer: the call its snapshot was taken after got that answer,
        # not the parent's, which its copy of the journal holds
        before = [c for c in numbered if c["seq"] < forked["journal"]]
        if before and "." not in str(before[-1]["key"]).rpartition(":")[2]:  # (a gather's: no)
            before[-1]["result"] = (f"{forked['answer_value']} (the fork's --answer; the parent "
                                    f"got {before[-1]['result'] if before[-1]['status'] == 'ok' else before[-1]['error']})")
            before[-1]["status"], before[-1]["error"] = "ok", None
    error = _report.decode_error(run.error)
    doc = {
        "id": run.run_id,
        "tenant": run.tenant,
        "status": run.status,
        "entry": run.entry,
        "args": json.loads(run.args or b"[]"),
        "strategy": run.strategy,
        "result": decode_result(run.result),
        "error": None if error is None else _report.error_line(error),
        # the error's type, message and the agent's frames where it was raised, innermost last
        "error_detail": None if error is None else {k: error[k] for k in ("type", "message", "frames",
                                                                          "frames_omitted")},
        # effects completed (None: not counted, the journal was only read from its end)
        "effects": len(done_keys) if whole else None,
        "checkpoints": checkpoints,
        "epoch": run.epoch,
        "owner": f"{run.owner_host}:{run.owner_pid}",
        # for a running run: whether its owner still holds it (False: its process is gone
        # from this host or its lease ran out, so a resume or the worker takes it over)
        "owner_alive": owner_alive(run) if run.status == "running" else None,
        # a fork (`tcc fork`) nothing has resumed: only `tcc resume` starts it, never a worker
        "unstarted_fork": unstarted_fork(run, store),
        "created": run.created,
        "updated": run.updated,
        "waits": pending_waits(store, run_id),
        # (once each: an import interrupted and made again leaves the first one's events)
        "children": list(dict.fromkeys(dict(e.data)["child"] for e in events if e.kind == "spawned")),
        "parent": next((dict(e.data).get("parent") for e in events if e.kind == "started"), None),
        "snapshots": [{"number": s.number, "journal": s.journal_len, "bytes": s.size}
                      if not s.damaged else {"number": s.number, "damaged": True} for s in snapshots],
        "events": [{**dict(e.data), "kind": e.kind, "time": e.time, "data": dict(e.data)} for e in events],
        # the last journaled calls (effects, and tcc:wait/sleep/spawn markers), oldest first
        "calls": numbered,
        "journal_records": start + len(journal),
        # calls before the listed ones (None: not counted, only the journal's end was read)
        "calls_earlier": len(logical) - shown if whole else None,
        # the code the run recorded, its --on-code-change policy, and what changed since
        "code": code_state(events, run.status),
    }
    return RunDetail(doc, run, snapshots, events, error, whole, len(logical), shown)


@dataclasses.dataclass
class SnapshotView:
    """:func:`snapshot_state`'s answer: which snapshot was read and the run state it holds.

    ``state``'s objects are the restricted unpickler's inert views (capture's
    ``safe_loads``), or the real objects when ``unsafe`` is true.  ``notes`` says what was
    skipped on the way (a damaged newer snapshot; an unsafe load that failed)."""

    run: RunInfo
    info: SnapshotInfo
    numbers: list[int]  # every retained snapshot's number
    state: RunState
    unsafe: bool
    notes: list[str]


# Generators loaded for an unsafe view are kept alive: collecting a suspended coroutine
# would close it, running its `finally` blocks.
_KEEP: list[Any] = []


def _pick_snapshot(store: Store, run_id: str, at: int | None) -> tuple[SnapshotInfo, bytes, list[int], list[str]]:
    snaps = store.snapshots(run_id)
    numbers = [s.number for s in snaps]
    notes: list[str] = []
    if not snaps:
        raise errors.UsageError(f"run {run_id} has no snapshots to inspect")
    if at is not None:
        chosen = [s for s in snaps if s.number == at]
        if not chosen:
            raise errors.UsageError(
                f"run {run_id} has no snapshot {at}; retained: {', '.join(map(str, numbers))}"
            )
        return chosen[0], store.load_snapshot(run_id, at), numbers, notes
    for info in reversed(snaps):
        if info.damaged:
            notes.append(f"snapshot {info.number} fails verification and was skipped: "
                         "its record does not verify, is missing or is not in the run's index")
            continue
        try:
            return info, store.load_snapshot(run_id, info.number), numbers, notes
        except errors.StoreCorruptError as exc:
            notes.append(f"snapshot {info.number} fails verification and was skipped: {exc}")
    raise errors.StoreCorruptError(
        f"run {run_id}: no snapshot verifies: snapshot(s) {', '.join(map(str, numbers))} "
        "failed verification and none was loaded; restore the store from a backup")


def snapshot_state(store: Store, run_id: str, at: int | None = None, *,
                   unsafe: bool = False) -> SnapshotView:
    """The run state in snapshot ``at`` of ``run_id`` (default: the newest that verifies).

    By default it is read with the restricted unpickler: nothing is imported, no user code
    runs.  ``unsafe=True`` imports the run's entry module and unpickles for real -- any
    code in the snapshot runs, as the caller: only for a store the caller trusts.  If that
    fails, the safe view is returned with a note saying why.
    """
    run = store.get_run(run_id)
    info, blob, numbers, notes = _pick_snapshot(store, run_id, at)
    payload = unseal(blob, authenticated=True)
    stored: Any = None
    loaded_unsafe = False
    if unsafe:
        try:
            _scripts.entry_module(run.entry)
            stored = load_payload(payload)
            _KEEP.append(stored)
            loaded_unsafe = True
        except (errors.TccError, ImportError, OSError, SyntaxError) as exc:
            notes.append(f"--unsafe-repr: the snapshot cannot be loaded ({exc}); showing the safe view")
    if stored is None:
        from ..capture import safe_loads

        try:
            stored = safe_loads(payload)
        except Exception as exc:  # noqa: BLE001 - report damage, never crash
            raise errors.CorruptSnapshotError(
                f"run {run_id}: snapshot {info.number} cannot be read: {type(exc).__name__}: {exc}"
            ) from exc
    state = unpack_state(stored, run_id, info.number)
    return SnapshotView(run, info, numbers, state, loaded_unsafe, notes)
