"""How the CLI shows runs: human text on a terminal, or JSON with ``--json``."""

from __future__ import annotations

import datetime
import json
import sys
from typing import Any, Callable

from ..store import RunInfo

MARKERS = ("tcc:wait", "tcc:sleep")  # runtime._driver's WAIT_EFFECT, SLEEP_EFFECT


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
    if not blob:
        return None
    try:
        doc = json.loads(blob)
    except ValueError:
        return blob.decode(errors="replace")
    name = str(doc.get("type", "Error")).rpartition(".")[2]
    return f"{name}: {doc.get('message', '')}"


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
    doc = {
        "id": run.run_id,
        "tenant": run.tenant,
        "status": run.status,
        "entry": run.entry,
        "args": json.loads(run.args or b"[]"),
        "strategy": run.strategy,
        "result": decode_result(run.result),
        "error": decode_error(run.error),
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
    for s in snapshots:
        if s.damaged:
            print(f"  damaged    snapshot {s.number} fails verification or its record is missing "
                  "(recovery skips it)")
    for child in doc["children"]:
        print(f"  child      {child}")
    for w in doc["waits"]:
        what = f"approval {w.get('prompt')!r}" if w.get("kind") == "approval" else f"signal {w.get('name')!r}"
        print(f"  waiting    {what} (id {w['id']}, signal {w['signal']})")
    print("  events")
    for e in events:
        extra = " ".join(f"{k}={v}" for k, v in dict(e.data).items())
        print(f"    {_when(e.time)}  {e.kind:<20} {extra}")
