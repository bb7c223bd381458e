"""How the CLI shows runs: human text on a terminal, or JSON with ``--json``.

Everything a run, a snapshot or a store says -- script paths, errors, reasons,
reprs, event details -- reaches the terminal through :func:`clean`, which
escapes control characters, so that none of it can clear the screen, set the
window title or reorder the text a reader sees.  JSON output is escaped by
``json.dumps`` already.
"""

from __future__ import annotations

import datetime
import json
import re
import sys
from typing import Any, Callable

from ..runtime import _report
from ..store import JournalRecord, RunInfo

MARKERS = ("tcc:wait", "tcc:sleep")  # runtime._driver's WAIT_EFFECT, SLEEP_EFFECT
SHOWN_CALLS = 50  # the text of `tcc show` lists the last this many calls (--calls N, --all-calls)
JSON_CALLS = 1000  # ... and --json the last this many
FULL_READ = 5000  # a journal of at most this many records is read whole (exact counts)
REPR_LIMIT = 200  # characters of an argument list, a result or an error in the call listing

# C0 controls (but newline), DEL, C1 controls, line and paragraph separators,
# and the bidirectional marks, embeddings, overrides and isolates.
_CONTROLS = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029"
                       "\u202a-\u202e\u2066-\u2069]")
_CONTROLS_AND_NEWLINE = re.compile(_CONTROLS.pattern[:-1] + "\n]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def clean(text: object, *, newlines: bool = False) -> str:
    """``text`` made safe to print on a terminal: control characters escaped as ``\\x1b``,
    ``\\u202e``... (newlines too, unless ``newlines`` says a multi-line block is meant)."""
    return (_CONTROLS if newlines else _CONTROLS_AND_NEWLINE).sub(_escape, str(text))


def say(text: object = "", *, file: Any = None, newlines: bool = True) -> None:
    """Print a line of human output (the newlines in it are kept, nothing else)."""
    print(clean(text, newlines=newlines), file=file)


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
    print(f"{verb} {clean(run_id)}", file=stream, flush=True)


def progress_printer() -> Callable[[str, Any], None] | None:
    if not sys.stderr.isatty():
        return None

    def show(what: str, driver: Any) -> None:
        line = (
            f"\r\x1b[2K[{clean(driver.run_id[:12])}] effects {driver.effects} · "
            f"checkpoints {driver.checkpoints} · last {clean(driver.last_effect.rpartition(':')[2])}"
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
        say(f"completed: {json.dumps(_jsonable(out.result))}")
    elif out.status == "waiting":
        info = out.parked or {}
        if info.get("child"):
            child = info["child"]
            say(f"waiting for child run {child} ({info.get('child_status')}) -- see "
                f"`tcc show {child}`; once it has finished, `tcc resume {out.run_id}` (or "
                "`tcc worker`) continues this run", newlines=False)
        elif info.get("kind") == "approval":
            say(f"waiting for approval: {info.get('prompt')!r} -- answer with "
                f"`tcc approve {out.run_id}` or `tcc reject {out.run_id}`, then `tcc resume {out.run_id}`",
                newlines=False)
        else:
            say(f"waiting for signal {info.get('name')!r} -- send it with "
                f"`tcc signal {out.run_id} {info.get('name')} --value JSON`, then `tcc resume {out.run_id}`",
                newlines=False)
    elif out.status == "unverified":
        say(f"unverified: {json.dumps(_jsonable(out.result))} -- {out.error}", file=sys.stderr)
    elif out.status == "stopped":
        say(f"stopped after its last commit (SIGTERM); `tcc resume {out.run_id}` continues it")
    elif out.status == "sleeping":
        until = (out.parked or {}).get("until", 0)
        say(f"sleeping until {_when(until)} -- `tcc resume {out.run_id}` after that (or run `tcc worker`)")
    else:
        say(f"failed: {out.error}", file=sys.stderr)
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
        print(f"{clean(r.run_id):<34} {clean(r.status):<10} {_when(r.updated):<19}  {clean(r.entry)}")


def delivered(run_id: str, wait_id: str, *, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"id": run_id, "signal": wait_id, "delivered": True}))
    else:
        say(f"delivered {wait_id} to run {run_id}", newlines=False)


def cancelled(run: Any, before: Any, children: list[tuple[str, str]], *, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"id": run.run_id, "status": run.status, "was": before.status,
                          "epoch": run.epoch,
                          "children": [{"id": c, "was": was} for c, was in children]}))
    else:
        say(f"cancelled run {run.run_id} (it was {before.status}; epoch {run.epoch})", newlines=False)
        for child, was in children:
            say(f"cancelled its child run {child} (it was {was})", newlines=False)


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
    number = call["number"] if call["number"] is not None else f"@{call['seq']}"
    return clean(f"    {number:>3}  {call['call']} -> {what}   attempt {call['attempt']}"
                 f"  {_duration(call['duration'])}").rstrip()


def _journal_length(store: Any, run_id: str) -> int | None:
    """How many journal records the run has, from the store's count (None: this store
    cannot say without reading the journal)."""
    length = getattr(store, "journal_length", None)
    return int(length(run_id)) if callable(length) else None


def _journal_tail(store: Any, run_id: str, calls: int | None) -> tuple[list[JournalRecord], int]:
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
        if start == 0 or len(_logical_calls(journal)) > calls:
            return journal, start
        window *= 4


def run_detail(store: Any, run_id: str, *, as_json: bool, calls: int | None = -1) -> None:
    """Print ``tcc show``: the run, its last ``calls`` effect calls (None: all; -1: the
    default, SHOWN_CALLS for text and JSON_CALLS for JSON), snapshots and events.

    A long journal is read from its end only: the calls listed, not the whole
    journal.  Then the calls before them are not counted, nor are the run's
    effects (``--all-calls`` reads everything)."""
    if calls == -1:
        calls = JSON_CALLS if as_json else SHOWN_CALLS
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
    logical = _logical_calls(journal)
    if not whole:
        logical = logical[1:]  # its first attempts may lie before the window
    shown = len(logical) if calls is None else min(calls, len(logical))
    listed = range(len(logical) - shown, len(logical))
    numbered = [_call_doc(i + 1, logical[i], done) for i in listed]
    if not whole:
        for call in numbered:
            call["number"] = None  # the calls before the window are not counted
    journal_records = start + len(journal)
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
        "created": run.created,
        "updated": run.updated,
        "waits": pending_waits(store, run_id),
        "children": [dict(e.data)["child"] for e in events if e.kind == "spawned"],
        "parent": next((dict(e.data).get("parent") for e in events if e.kind == "started"), None),
        "snapshots": [{"number": s.number, "journal": s.journal_len, "bytes": s.size}
                      if not s.damaged else {"number": s.number, "damaged": True} for s in snapshots],
        "events": [{**dict(e.data), "kind": e.kind, "time": e.time, "data": dict(e.data)} for e in events],
        # the last journaled calls (effects, and tcc:wait/sleep/spawn markers), oldest first:
        # --calls N of them (default 1000), or every one with --all-calls
        "calls": numbered,
        "journal_records": journal_records,
        # calls before the listed ones (None: not counted, only the journal's end was read)
        "calls_earlier": len(logical) - shown if whole else None,
    }
    if as_json:
        print(json.dumps(doc, default=repr))
        return
    say(f"run {doc['id']}  [{doc['status']}]", newlines=False)
    say(f"  entry      {doc['entry']} {' '.join(map(str, doc['args']))}", newlines=False)
    gone = ("  (gone: `tcc resume` or a worker takes the run over)"
            if doc["owner_alive"] is False else "")
    say(f"  strategy   {doc['strategy']}   epoch {doc['epoch']}   owner {doc['owner']}{gone}",
        newlines=False)
    print(f"  created    {_when(run.created)}   updated {_when(run.updated)}")
    effects = doc["effects"] if whole else "(not counted: `tcc show --all-calls` reads the whole journal)"
    say(f"  effects    {effects}   checkpoints {doc['checkpoints']}   snapshots kept {len(snapshots)}")
    if doc["result"] is not None:
        print(f"  result     {json.dumps(doc['result'])}")
    if doc["error"]:
        say(f"  error      {doc['error']}")
        assert error is not None
        for line in _report.traceback_lines(error):
            say(f"  {line}")
    for s in snapshots:
        if s.damaged:
            print(f"  damaged    snapshot {s.number} fails verification or its record is missing "
                  "(recovery skips it)")
    for child in doc["children"]:
        say(f"  child      {child}", newlines=False)
    for w in doc["waits"]:
        what = f"approval {w.get('prompt')!r}" if w.get("kind") == "approval" else f"signal {w.get('name')!r}"
        say(f"  waiting    {what} (id {w['id']}, signal {w['signal']})", newlines=False)
    if logical:
        if whole:
            print(f"  calls      {len(logical)}")
            if shown < len(logical):
                print(f"    … {len(logical) - shown} earlier calls (`tcc show --all-calls` lists all)")
        else:
            print(f"  calls      the last {shown} of a journal of {journal_records} records (numbered "
                  "@journal record; `tcc show --all-calls` lists and counts them all)")
        for call in numbered:
            print(_call_line(call))
    print("  events")
    for e in events:
        extra = " ".join(f"{k}={v}" for k, v in dict(e.data).items())
        say(f"    {_when(e.time)}  {e.kind:<20} {extra}", newlines=False)
