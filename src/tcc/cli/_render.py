"""How the CLI shows runs: human text on a terminal, or JSON with ``--json``.

Everything a run, a snapshot or a store says -- script paths, errors, reasons,
reprs, event details -- reaches the terminal through :func:`clean`, which
escapes control characters, so that none of it can clear the screen, set the
window title or reorder the text a reader sees.  JSON output is escaped by
``json.dumps`` already.
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any, Callable

from ..runtime import SLEEP_EFFECT, WAIT_EFFECT, traceback_lines
from ..store import FINAL_STATUSES, FINISHED_STATUSES, RunInfo


def _when(ts: float) -> str:
    from ..runtime import when  # the run views (datetime): not imported by every `tcc resume`

    return when(ts)


FAILED_OUTCOMES = frozenset(FINISHED_STATUSES) - frozenset(FINAL_STATUSES)  # exit 1: failed, unverified
SHOWN_CALLS = 50  # the text of `tcc show` lists the last this many calls (--calls N, --all-calls)
JSON_CALLS = 1000  # ... and --json the last this many

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
    return 1 if out.status in FAILED_OUTCOMES else 0


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


_CODE_FLAG = {"pinned": "code changed: continues pinned", "refuse": "code changed: needs a decision",
              "upgrade": "code changed: upgrades on resume"}


def run_list(runs: list[RunInfo], *, as_json: bool, code: dict[str, str] | None = None) -> None:
    """``code``: run id -> the policy of each unfinished run whose files changed since."""
    code = code or {}
    if as_json:
        print(json.dumps([
            {"id": r.run_id, "status": r.status, "entry": r.entry, "strategy": r.strategy,
             "created": r.created, "updated": r.updated, "epoch": r.epoch,
             "owner": {"host": r.owner_host, "pid": r.owner_pid, "lease_expiry": r.lease_expiry},
             "held": _held(r), "code_changed": code.get(r.run_id)}
            for r in runs
        ]))
        return
    if not runs:
        print("no runs")
        return
    print(f"{'ID':<34} {'STATUS':<10} {'UPDATED':<19}  {'HOST':<16} ENTRY")
    for r in sorted(runs, key=lambda r: r.created):
        flag = f"  [{_CODE_FLAG[code[r.run_id]]}]" if r.run_id in code else ""
        host = clean(r.owner_host) if _held(r) else "-"
        print(f"{clean(r.run_id):<34} {clean(r.status):<10} {_when(r.updated):<19}  {host:<16} "
              f"{clean(r.entry)}{flag}")


def _held(run: RunInfo) -> bool:
    """Whether a process holds the run now (its lease runs): then its host owns it."""
    import time

    from ..store import LIVE_STATUSES

    return run.status in LIVE_STATUSES and run.lease_expiry > time.time()


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


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    return f"{seconds * 1e3:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"


def _call_line(call: dict[str, Any]) -> str:
    if call["status"] == "pending":
        what = {WAIT_EFFECT: "(not signalled yet)", SLEEP_EFFECT: "(not due yet)"}.get(
            call["name"], "(no outcome recorded: still running, or in doubt after a crash)")
    elif call["status"] == "error":
        what = f"raised {call['error']}"
    else:
        what = str(call["result"])
    number = call["number"] if call["number"] is not None else f"@{call['seq']}"
    return clean(f"    {number:>3}  {call['call']} -> {what}   attempt {call['attempt']}"
                 f"  {_duration(call['duration'])}").rstrip()


def run_detail(store: Any, run_id: str, *, as_json: bool, calls: int | None = -1) -> None:
    """Print ``tcc show``: the run, its last ``calls`` effect calls (None: all; -1: the
    default, SHOWN_CALLS for text and JSON_CALLS for JSON), snapshots and events
    (:func:`tcc.runtime.run_detail` reads them; this prints them)."""
    from ..runtime import run_detail as read_detail
    from ._safe_repr import safe_repr

    if calls == -1:
        calls = JSON_CALLS if as_json else SHOWN_CALLS
    detail = read_detail(store, run_id, calls=calls, show_value=safe_repr)
    doc, run, snapshots, events, error = detail.doc, detail.run, detail.snapshots, detail.events, detail.error
    whole, shown, numbered, journal_records = detail.whole, detail.shown, doc["calls"], doc["journal_records"]
    logical_count = detail.calls_total
    if as_json:
        print(json.dumps(doc, default=repr))
        return
    say(f"run {doc['id']}  [{doc['status']}]", newlines=False)
    say(f"  entry      {doc['entry']} {' '.join(map(str, doc['args']))}", newlines=False)
    gone = (f"  (a fork nobody started: `tcc resume {doc['id']}` starts it)" if doc.get("unstarted_fork")
            else "  (gone: `tcc resume` or a worker takes the run over)" if doc["owner_alive"] is False
            else "")
    say(f"  strategy   {doc['strategy']}   epoch {doc['epoch']}   owner {doc['owner']}{gone}",
        newlines=False)
    print(f"  created    {_when(run.created)}   updated {_when(run.updated)}")
    effects = doc["effects"] if whole else "(not counted: `tcc show --all-calls` reads the whole journal)"
    say(f"  effects    {effects}   checkpoints {doc['checkpoints']}   snapshots kept {len(snapshots)}")
    code = doc.get("code")
    if code is not None and (code["changed"] or code["pinned"] or code["policy"] != "pinned"):
        say(f"  code       {_code_line(doc['id'], code)}")
    if doc["result"] is not None:
        print(f"  result     {json.dumps(doc['result'])}")
    if doc["error"]:
        say(f"  error      {doc['error']}")
        assert error is not None
        for line in traceback_lines(error):
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
    if logical_count:
        if whole:
            print(f"  calls      {logical_count}")
            if shown < logical_count:
                print(f"    … {logical_count - shown} earlier calls (`tcc show --all-calls` lists all)")
        else:
            print(f"  calls      the last {shown} of a journal of {journal_records} records (numbered "
                  "@journal record; `tcc show --all-calls` lists and counts them all)")
        for call in numbered:
            print(_call_line(call))
    print("  events")
    for e in events:
        extra = _code_event(e.data) if e.kind == "code" else \
            " ".join(f"{k}={v}" for k, v in dict(e.data).items())
        say(f"    {_when(e.time)}  {e.kind:<20} {extra}", newlines=False)


def _code_event(data: Any) -> str:
    """A ``code`` event in one line: each module by its file (and whether it is pinned) and
    the first 8 digits of its digest; files changed under the run, as stale."""
    modules = data.get("modules") if isinstance(data, dict) else None
    parts = []
    for name, entry in (modules.items() if isinstance(modules, dict) else ()):
        if isinstance(entry, dict):
            file = os.path.basename(str(entry.get("file", name)))
            pinned = " (pinned)" if str(name).startswith("__tcc_pinned_") else ""
            parts.append(f"{file}{pinned} {str(entry.get('sha256', ''))[:8]}")
    stale = data.get("stale") if isinstance(data, dict) else None
    if isinstance(stale, dict) and stale:
        parts.append("stale: " + ", ".join(os.path.basename(str(f)) for f in stale.values()))
    return ", ".join(parts)


def upgrade_plan(plan: Any, *, dry_run: bool, as_json: bool) -> int:
    """Print an upgrade's mapping as a reviewer reads it; exit 0 if it is (or would be)
    applied, 1 if it is refused."""
    if as_json:
        print(json.dumps(plan.to_json()))
        return 0 if plan.ok else 1
    head = "would upgrade" if dry_run else "upgrade of"
    print(f"{head} run {plan.run_id}, snapshot {plan.snapshot}, onto the current code")
    for f in plan.frames:
        where = f"{f.qualname}()  {os.path.basename(f.file)}"
        if f.internal and not f.changed:
            continue
        if not f.changed:
            print(f"  {where}: code unchanged, kept as it is")
            continue
        lines = f"line {f.old_line} -> {f.new_line}" if f.new_line is not None else \
            (f"line {f.old_line}" if f.old_line is not None else "")
        print(f"  {where}: {lines}  at {f.site}".rstrip())
        for label, names in (("kept", f.kept), ("renamed", f.renamed), ("set", f.given),
                             ("unbound, assigned later", f.unbound), ("dropped", f.dropped)):
            if names:
                print(f"      {label + ':':<26}{', '.join(names)}")
        if f.stack:
            print(f"      {'stack:':<26}{f.stack}")
        for why in f.refusals:
            print(f"      REFUSED: {why}")
    if plan.nothing_changed:
        print("  no suspended frame's code changed: the snapshot moves onto the current modules as "
              "it is, and the run's recorded code becomes the current files")
    for d in plan.defaults:
        print(f"  field {d}")
    for why in plan.refusals:
        print(f"  REFUSED: {why}")
    if not plan.ok:
        print("nothing was written")
        return 1
    if dry_run:
        print("nothing was written (--dry-run); run it without --dry-run to store the new snapshot")
    else:
        print(f"stored as snapshot {plan.written}; `tcc resume {plan.run_id}` continues on the new code")
    return 0


def _code_line(run_id: str, code: dict[str, Any]) -> str:
    """What a person needs to know about the run's code: its policy, whether it continues
    on pinned code, and which files changed since it recorded them."""
    policy = code["policy"]
    parts = [f"on code change: {policy}"]
    if code["pinned"]:
        parts.append("continues on its recorded (pinned) code")
    changed = [os.path.basename(code["modules"][n]["file"]) for n in code["changed"]
               if n in code["modules"]]
    if changed:
        action = {"pinned": "a resume continues on the recorded code",
                  "refuse": f"a resume is refused: decide with `tcc resume --code pinned {run_id}` "
                            f"or `tcc upgrade {run_id}`",
                  "upgrade": "a resume upgrades it first"}[policy]
        parts.append(f"changed since recorded: {', '.join(changed)} ({action}; "
                     f"`tcc upgrade --dry-run {run_id}` shows whether it can move onto the new code)")
    return "; ".join(parts)
