"""How the CLI shows runs: human text on a terminal, or JSON with ``--json``."""

from __future__ import annotations

import datetime
import json
import sys
from typing import Any, Callable

from ..runtime import _report
from ..store import JournalRecord, RunInfo

MARKERS = ("tcc:wait", "tcc:sleep")  # runtime._driver's WAIT_EFFECT, SLEEP_EFFECT
SHOWN_CALLS = 50  # the text of `tcc show` lists the last this many calls; --json lists all
REPR_LIMIT = 200  # characters of an argument list, a result or an error in the call listing


def _when(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts).isoformat(sep=" ", timespec="seconds")


def decode_result(blob: bytes | None) -> Any:
    if not blob:
        return None
    try:
        doc = json.loads(blob)
    except ValueError:
        return repr(blob)
    return doc["value"] if "value" in doc else doc.get("repr")


def decode_error(blob: bytes | None) -> str | None:
    """The one-line form of a stored error: ``KeyError: 'missing_key'``."""
    error = _report.decode_error(blob)
    return None if error is None else _report.error_line(error)


def started(run_id: str, *, resumed: bool, as_json: bool) -> None:
    verb = "resuming" if resumed else "run"
    stream = sys.stderr if as_json else sys.stdout
    print(f"{verb} {run_id}", file=stream, flush=True)


def progress_printer() -> Callable[[str, Any], None] | None:
    if not sys.stderr.isatty():
        return None

    def show(what: str, driver: Any) -> None:
        line = (
            f"\r\x1b[2K[{driver.run_id[:12]}] effects {driver.effects} · "
            f"checkpoints {driver.checkpoints} · last {driver.last_effect.rpartition(':')[2]}"
        )
        sys.stderr.write(line)
        sys.stderr.flush()

    return show


def outcome(out: Any, *, as_json: bool) -> int:
    if sys.stderr.isatty():
        sys.stderr.write("\r\x1b[2K")
    if as_json:
        print(json.dumps({
            "id": out.run_id, "status": out.status, "result": _jsonable(out.result),
            "error": out.error, "effects": out.effects, "checkpoints": out.checkpoints,
            "replayed": out.replayed, "parked": out.parked,
        }))
    elif out.status == "completed":
        print(f"completed: {json.dumps(_jsonable(out.result))}")
    elif out.status == "waiting":
        info = out.parked or {}
        if info.get("child"):
            child = info["child"]
            print(f"waiting for child run {child} ({info.get('child_status')}) -- see "
                  f"`tcc show {child}`; once it has finished, `tcc resume {out.run_id}` (or "
                  "`tcc worker`) continues this run")
        elif info.get("kind") == "approval":
            print(f"waiting for approval: {info.get('prompt')!r} -- answer with "
                  f"`tcc approve {out.run_id}` or `tcc reject {out.run_id}`, then `tcc resume {out.run_id}`")
        else:
            print(f"waiting for signal {info.get('name')!r} -- send it with "
                  f"`tcc signal {out.run_id} {info.get('name')} --value JSON`, then `tcc resume {out.run_id}`")
    elif out.status == "unverified":
        print(f"unverified: {json.dumps(_jsonable(out.result))} -- {out.error}", file=sys.stderr)
    elif out.status == "stopped":
        print(f"stopped after its last commit (SIGTERM); `tcc resume {out.run_id}` continues it")
    elif out.status == "sleeping":
        until = (out.parked or {}).get("until", 0)
        print(f"sleeping until {_when(until)} -- `tcc resume {out.run_id}` after that (or run `tcc worker`)")
    else:
        print(f"failed: {out.error}", file=sys.stderr)
    return 1 if out.status in ("failed", "unverified") else 0


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def run_list(runs: list[RunInfo], *, as_json: bool) -> None:
    if as_json:
        print(json.dumps([
            {"id": r.run_id, "status": r.status, "entry": r.entry, "strategy": r.strategy,
             "created": r.created, "updated": r.updated, "epoch": r.epoch}
            for r in runs
        ]))
        return
    if not runs:
        print("no runs")
        return
    print(f"{'ID':<34} {'STATUS':<10} {'UPDATED':<19}  ENTRY")
    for r in sorted(runs, key=lambda r: r.created):
        print(f"{r.run_id:<34} {r.status:<10} {_when(r.updated):<19}  {r.entry}")


def delivered(run_id: str, wait_id: str, *, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"id": run_id, "signal": wait_id, "delivered": True}))
    else:
        print(f"delivered {wait_id} to run {run_id}")


def cancelled(run: Any, before: Any, children: list[tuple[str, str]], *, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"id": run.run_id, "status": run.status, "was": before.status,
                          "epoch": run.epoch,
                          "children": [{"id": c, "was": was} for c, was in children]}))
    else:
        print(f"cancelled run {run.run_id} (it was {before.status}; epoch {run.epoch})")
        for child, was in children:
            print(f"cancelled its child run {child} (it was {was})")


def pending_waits(store: Any, run_id: str) -> list[dict[str, Any]]:
    from ..runtime import pending_waits as waits

    return waits(store, run_id)


def owner_alive(run: Any) -> bool:
    """Whether the owner of a running run still holds it, as the worker judges it."""
    import time

    from ..runtime._worker import owner_dead

    return not owner_dead(run, time.time())


def _payload(blob: bytes | None) -> tuple[bool, Any]:
    """(True, a view of ``blob``) from the restricted unpickler of `tcc inspect`, which runs
    no user code (`show` must not: no import, no ``__reduce__``, no ``__repr__``), or
    (False, why not)."""
    from ..capture import _inspect as insp

    if blob is None:
        return False, "<nothing recorded>"
    try:
        return True, insp.safe_loads(bytes(blob))
    except Exception as exc:  # noqa: BLE001 - a payload it cannot read is shown as such
        return False, f"<unreadable payload: {type(exc).__name__}>"


def _safe(value: Any, limit: int = REPR_LIMIT) -> str:
    from ..capture import _inspect as insp

    try:
        return insp.safe_repr(value, limit)
    except Exception as exc:  # noqa: BLE001 - never let one value end the listing
        return f"<repr failed: {type(exc).__name__}>"


def _clip(text: str, limit: int = REPR_LIMIT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _call_args(name: str, blob: bytes | None) -> str:
    """The argument list of a journaled call, as it would be written in the call."""
    ok, value = _payload(blob)
    if not ok:
        return str(value)
    if name == "tcc:sleep" and isinstance(value, (int, float)):
        return f"until {_when(value)}"
    if not name.startswith("tcc:") and isinstance(value, tuple) and len(value) == 2 \
            and isinstance(value[0], tuple) and isinstance(value[1], dict):
        args, kwargs = value
        parts = [_safe(a) for a in args] + [f"{k}={_safe(v)}" for k, v in kwargs.items()]
        return _clip(", ".join(parts))
    if name == "tcc:spawn" and isinstance(value, tuple):
        return _clip(", ".join(_safe(v) for v in value))
    return _safe(value)


def _outcome(c: JournalRecord | None) -> dict[str, Any]:
    if c is None:
        return {"status": "pending", "result": None, "error": None, "duration": None}
    if c.error is not None:
        ok, value = _payload(c.error)
        return {"status": "error", "result": None, "error": _safe(value) if ok else str(value),
                "duration": c.duration}
    ok, value = _payload(c.result)
    return {"status": "ok", "result": _safe(value) if ok else str(value), "error": None,
            "duration": c.duration}


def _logical_calls(journal: list[JournalRecord]) -> list[list[JournalRecord]]:
    """The journal's intents grouped into calls: the attempts of one call (retries, a
    re-issue after a crash) share its idempotency key.  In order of their first intent."""
    calls: dict[str, list[JournalRecord]] = {}
    for r in journal:
        if r.kind == "intent":
            calls.setdefault(r.idempotency_key or f"#{r.seq}", []).append(r)
    return list(calls.values())


def _call_doc(number: int, intents: list[JournalRecord], done: dict[int, JournalRecord]) -> dict[str, Any]:
    first, last = intents[0], intents[-1]
    attempts = [{"attempt": i.attempt, "seq": i.seq, **_outcome(done.get(i.seq))} for i in intents]
    args = _call_args(first.name, first.args)
    short = first.name if first.name.startswith("tcc:") else first.name.rpartition(":")[2]
    return {"number": number, "seq": first.seq, "key": first.idempotency_key, "name": first.name,
            "call": f"{short}({args})", "args": args, **attempts[-1], "attempt": last.attempt,
            "time": first.time, "attempts": attempts}


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    return f"{seconds * 1e3:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"


def _call_line(call: dict[str, Any]) -> str:
    if call["status"] == "pending":
        what = {"tcc:wait": "(not signalled yet)", "tcc:sleep": "(not due yet)"}.get(
            call["name"], "(no outcome recorded: still running, or in doubt after a crash)")
    elif call["status"] == "error":
        what = f"raised {call['error']}"
    else:
        what = str(call["result"])
    return (f"    {call['number']:>3}  {call['call']} -> {what}   attempt {call['attempt']}"
            f"  {_duration(call['duration'])}").rstrip()


def run_detail(store: Any, run_id: str, *, as_json: bool) -> None:
    run = store.get_run(run_id)
    journal = store.journal(run_id)
    snapshots = store.snapshots(run_id)
    events = store.events(run_id)
    completions = [r for r in journal if r.kind == "completion"]
    intents = {r.seq: r for r in journal if r.kind == "intent"}
    # wait and sleep markers are journaled like effects but are not effects (as in `tcc run`)
    done_keys = {intents[c.intent_seq].idempotency_key for c in completions
                 if c.intent_seq in intents and intents[c.intent_seq].name not in MARKERS}
    checkpoints = max((s.number for s in snapshots if not s.damaged), default=0)
    done = {c.intent_seq: c for c in completions if c.intent_seq is not None}
    logical = _logical_calls(journal)
    # the text lists the last SHOWN_CALLS calls: only those are read
    listed = range(len(logical)) if as_json else range(max(0, len(logical) - SHOWN_CALLS), len(logical))
    calls = [_call_doc(i + 1, logical[i], done) for i in listed]
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
        "effects": len(done_keys),
        "checkpoints": checkpoints,
        "epoch": run.epoch,
        "owner": f"{run.owner_host}:{run.owner_pid}",
        # for a running run: whether its owner still holds it (False: its process is gone
        # from this host or its lease ran out, so a resume or the worker takes it over)
        "owner_alive": owner_alive(run) if run.status == "running" else None,
        "created": run.created,
        "updated": run.updated,
        "waits": pending_waits(store, run_id),
        "children": [dict(e.data)["child"] for e in events if e.kind == "spawned"],
        "parent": next((dict(e.data).get("parent") for e in events if e.kind == "started"), None),
        "snapshots": [{"number": s.number, "journal": s.journal_len, "bytes": s.size}
                      if not s.damaged else {"number": s.number, "damaged": True} for s in snapshots],
        "events": [{**dict(e.data), "kind": e.kind, "time": e.time, "data": dict(e.data)} for e in events],
        # every journaled call (effects, and tcc:wait/sleep/spawn markers), oldest first
        "calls": calls,
    }
    if as_json:
        print(json.dumps(doc, default=repr))
        return
    print(f"run {doc['id']}  [{doc['status']}]")
    print(f"  entry      {doc['entry']} {' '.join(map(str, doc['args']))}")
    gone = ("  (gone: `tcc resume` or a worker takes the run over)"
            if doc["owner_alive"] is False else "")
    print(f"  strategy   {doc['strategy']}   epoch {doc['epoch']}   owner {doc['owner']}{gone}")
    print(f"  created    {_when(run.created)}   updated {_when(run.updated)}")
    print(f"  effects    {doc['effects']}   checkpoints {doc['checkpoints']}   "
          f"snapshots kept {len(snapshots)}")
    if doc["result"] is not None:
        print(f"  result     {json.dumps(doc['result'])}")
    if doc["error"]:
        print(f"  error      {doc['error']}")
        assert error is not None
        for line in _report.traceback_lines(error):
            print(f"  {line}")
    for s in snapshots:
        if s.damaged:
            print(f"  damaged    snapshot {s.number} fails verification or its record is missing "
                  "(recovery skips it)")
    for child in doc["children"]:
        print(f"  child      {child}")
    for w in doc["waits"]:
        what = f"approval {w.get('prompt')!r}" if w.get("kind") == "approval" else f"signal {w.get('name')!r}"
        print(f"  waiting    {what} (id {w['id']}, signal {w['signal']})")
    if logical:
        print(f"  calls      {len(logical)}")
        if len(logical) > len(calls):
            print(f"    … {len(logical) - len(calls)} earlier calls (`tcc show --json` lists all)")
        for call in calls:
            print(_call_line(call))
    print("  events")
    for e in events:
        extra = " ".join(f"{k}={v}" for k, v in dict(e.data).items())
        print(f"    {_when(e.time)}  {e.kind:<20} {extra}")
