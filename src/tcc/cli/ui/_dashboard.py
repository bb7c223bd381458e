"""What the dashboard reads and does, without HTTP: the JSON API's documents and actions.

Every read and every action goes through the functions the CLI calls (``tcc ls``,
``show --json``, ``inspect --json``, ``approve``/``reject``, ``signal``, ``cancel``,
``resume``, ``fork``), so the rules live in one place (:mod:`tcc.runtime`).  Payloads and
locals are shown with the safe repr, which runs no user code: the snapshot is read by the
restricted unpickler and the run's script is never imported.

Errors are :class:`ApiError` with the HTTP status they deserve: 400 for a bad request
(checked before anything is changed), 404 for what does not exist, 409 for an action the
run's state refuses (a finished run, an approval already answered).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import threading
import time
from typing import Any, Callable

from ... import errors, runtime
from ...effects import check_signal_name
from ...store import RUN_STATUSES, RunInfo, Store, check_name
from .._inspect import inspect_doc
from .._render import JSON_CALLS
from .._safe_repr import safe_repr

MAX_LISTED = 500  # runs in the list, newest first
TREE_DEPTH = 6  # levels of children shown under a run


class ApiError(Exception):
    """A request the dashboard refuses: ``status`` is the HTTP status, ``message`` says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _run_id(value: str) -> str:
    try:
        check_name("run id", value)
    except errors.UsageError as exc:
        raise ApiError(400, str(exc)) from None
    return value


def _fields(body: Any, allowed: dict[str, Callable[[Any], bool]], what: str) -> dict[str, Any]:
    """``body`` checked as a JSON object whose keys are ``allowed``, each value passing
    its check; 400 naming the first thing that is wrong."""
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise ApiError(400, f"the body of {what} must be a JSON object, not {type(body).__name__}")
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise ApiError(400, f"{what} takes {', '.join(sorted(allowed)) or 'no fields'}; "
                            f"unknown field(s): {', '.join(unknown)}")
    for name, ok in allowed.items():
        if name in body and not ok(body[name]):
            raise ApiError(400, f"{what}: field {name!r} has a value of the wrong kind: "
                                f"{json.dumps(body[name])[:100]}")
    return body


def _text_or_null(v: Any) -> bool:
    return v is None or (isinstance(v, str) and len(v) <= 10_000)


def _any_json(v: Any) -> bool:
    return True


def _age(ts: float, now: float) -> str:
    s = max(0.0, now - ts)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= size:
            return f"{s / size:.0f} {unit} ago"
    return f"{s:.0f} s ago"


class Dashboard:
    """The dashboard's store and the resumes it started.  Every store call is made by the
    caller holding :attr:`lock` (the HTTP layer runs them on one thread)."""

    def __init__(self, store: Store, *, command: list[str] | None = None) -> None:
        self.store = store
        self.command = command
        self.lock = threading.Lock()
        # run id -> (the resume process this dashboard started, the file holding its stderr)
        self.resumes: dict[str, tuple[subprocess.Popen[bytes], Any]] = {}

    # ------------------------------------------------------------------ reads

    def runs(self, status: str | None = None, query: str | None = None) -> dict[str, Any]:
        """``GET /api/runs``: the tenant's runs, newest first, with the owner, the last event
        and the waits of a waiting run (the ones that need a person)."""
        self.reap()
        if status is not None and status not in RUN_STATUSES:
            raise ApiError(400, f"status must be one of {', '.join(RUN_STATUSES)}, not {status!r}")
        damaged: list[tuple[str, str]] = []
        runs = self.store.list_runs(status, damaged=damaged)
        if query:
            q = query.lower()
            runs = [r for r in runs if q in r.run_id.lower() or q in r.entry.lower()]
        runs.sort(key=lambda r: r.created, reverse=True)
        now = time.time()
        rows = [self._row(r, now) for r in runs[:MAX_LISTED]]
        return {"runs": rows, "total": len(runs), "shown": len(rows),
                "damaged": [{"id": rid, "why": why} for rid, why in damaged]}

    def _row(self, run: RunInfo, now: float) -> dict[str, Any]:
        events = self.store.events(run.run_id)
        last = events[-1] if events else None
        waits = runtime.pending_waits(self.store, run.run_id) if run.status == "waiting" else []
        alive = runtime.owner_alive(run) if run.status == "running" else None
        return {
            "id": run.run_id, "status": run.status, "entry": run.entry, "strategy": run.strategy,
            "created": run.created, "updated": run.updated, "age": _age(run.created, now),
            "epoch": run.epoch, "owner": f"{run.owner_host}:{run.owner_pid}", "owner_alive": alive,
            "last_event": None if last is None else {"kind": last.kind, "time": last.time},
            "waits": waits,
            # a person is needed: an approval or a signal nobody has sent yet
            "needs_human": any(w.get("signal") == "not sent" for w in waits),
            # answered, and waiting for a resume (or a worker) to go on
            "ready": bool(waits) and all(w.get("signal") == "pending" for w in waits),
        }

    def run(self, run_id: str, calls: int | None = JSON_CALLS) -> dict[str, Any]:
        """``GET /api/runs/{id}``: the document of ``tcc show --json``."""
        self.reap()
        detail = runtime.run_detail(self.store, _run_id(run_id), calls=calls, show_value=safe_repr)
        return detail.doc

    def tree(self, run_id: str) -> dict[str, Any]:
        """The run's children (``tcc.spawn``), and theirs, as ``{id, status, children}``."""
        def node(rid: str, depth: int, seen: set[str]) -> dict[str, Any]:
            seen.add(rid)
            try:
                status = self.store.get_run(rid).status
            except errors.RunNotFoundError:
                return {"id": rid, "status": "missing", "children": []}
            kids = [str(dict(e.data)["child"]) for e in self.store.events(rid)
                    if e.kind == "spawned" and isinstance(dict(e.data).get("child"), str)]
            if depth >= TREE_DEPTH:
                return {"id": rid, "status": status, "children": [], "more": len(kids)}
            return {"id": rid, "status": status,
                    "children": [node(k, depth + 1, seen) for k in kids if k not in seen]}
        return node(_run_id(run_id), 0, set())

    def stack(self, run_id: str, at: str | None = None) -> dict[str, Any]:
        """``GET /api/runs/{id}/stack[?at=N]``: the document of ``tcc inspect --json``."""
        number = None
        if at not in (None, ""):
            try:
                number = int(str(at))
            except ValueError:
                raise ApiError(400, f"at must be a snapshot number, not {at!r}") from None
        self.store.get_run(_run_id(run_id))
        try:
            return inspect_doc(self.store, run_id, number)[0]
        except errors.UsageError as exc:  # no such snapshot, or none at all
            raise ApiError(404, str(exc)) from None

    def code_state(self, run_id: str) -> dict[str, Any] | None:
        """Whether the newest snapshot's frames still match the code on disk: the frames
        whose code changed (a resume refuses them), or None if the run has no snapshot."""
        try:
            doc = inspect_doc(self.store, run_id)[0]
        except errors.TccError:  # no snapshot, or one that cannot be read: nothing to compare
            return None
        changed = [f"{f['qualname']} ({f['file']}:{f['line']})" for f in doc["frames"] if f.get("code_changed")]
        return {"snapshot": doc["snapshot"], "changed": changed}

    # ---------------------------------------------------------------- actions

    def act(self, run_id: str, action: str, body: Any) -> tuple[int, dict[str, Any]]:
        """``POST /api/runs/{id}/{action}``: (HTTP status, answer)."""
        handler = {"approve": self._approve, "reject": self._reject, "signal": self._signal,
                   "cancel": self._cancel, "resume": self._resume, "fork": self._fork}.get(action)
        if handler is None:
            raise ApiError(404, f"no action {action!r}: use approve, reject, signal, cancel, resume or fork")
        run_id = _run_id(run_id)
        self.store.get_run(run_id)  # 404 before anything else
        return handler(run_id, body)

    def _answer(self, run_id: str, body: Any, approved: bool) -> tuple[int, dict[str, Any]]:
        verb = "approve" if approved else "reject"
        fields = _fields(body, {"comment": _text_or_null}, verb)
        try:
            wait_id = runtime.answer(self.store, run_id, approved, fields.get("comment"))
        except errors.UsageError as exc:
            raise ApiError(409, str(exc)) from None
        return 200, {"id": run_id, "signal": wait_id, "delivered": True, "approved": approved}

    def _approve(self, run_id: str, body: Any) -> tuple[int, dict[str, Any]]:
        return self._answer(run_id, body, True)

    def _reject(self, run_id: str, body: Any) -> tuple[int, dict[str, Any]]:
        return self._answer(run_id, body, False)

    def _signal(self, run_id: str, body: Any) -> tuple[int, dict[str, Any]]:
        fields = _fields(body, {"name": lambda v: isinstance(v, str), "value": _any_json}, "signal")
        if "name" not in fields:
            raise ApiError(400, "signal needs a name: {\"name\": NAME, \"value\": JSON}")
        try:
            check_signal_name(fields["name"])
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        try:
            wait_id = runtime.signal(self.store, run_id, fields["name"], fields.get("value"))
        except errors.UsageError as exc:
            raise ApiError(409, str(exc)) from None
        return 200, {"id": run_id, "signal": wait_id, "delivered": True}

    def _cancel(self, run_id: str, body: Any) -> tuple[int, dict[str, Any]]:
        fields = _fields(body, {"reason": _text_or_null}, "cancel")
        try:
            done = runtime.cancel(self.store, run_id, reason=fields.get("reason"))
        except errors.UsageError as exc:
            raise ApiError(409, str(exc)) from None
        return 200, {"id": run_id, "status": done.run.status, "was": done.was.status,
                     "epoch": done.run.epoch,
                     "children": [{"id": c, "was": was} for c, was in done.children]}

    def reap(self) -> None:
        """Forget the resume processes that ended; record the failure of one that failed
        (a ``resume_failed`` event with its exit code and the last line it wrote), which
        would otherwise be seen nowhere."""
        for rid, (proc, err) in list(self.resumes.items()):
            code = proc.poll()
            if code is None:
                continue
            del self.resumes[rid]
            try:
                if code != 0:
                    err.seek(0)
                    lines = [ln.strip() for ln in err.read().decode(errors="replace").splitlines() if ln.strip()]
                    self.store.add_event(rid, "resume_failed", {
                        "pid": proc.pid, "code": code, "error": (lines[-1] if lines else "")[:500]})
            except errors.TccError:  # the run was deleted meanwhile: nothing to record on
                pass
            finally:
                err.close()

    def _resume(self, run_id: str, body: Any) -> tuple[int, dict[str, Any]]:
        _fields(body, {}, "resume")
        self.reap()
        running = self.resumes.get(run_id)
        if running is not None:
            raise ApiError(409, f"a resume of run {run_id} that this dashboard started is still "
                                f"running (pid {running[0].pid})")
        err = tempfile.TemporaryFile()
        try:
            proc = runtime.start_resume(self.store, run_id, command=self.command, stderr=err)
        except errors.UsageError as exc:
            err.close()
            raise ApiError(409, str(exc)) from None
        self.resumes[run_id] = (proc, err)  # its failure is recorded by reap()
        return 202, {"id": run_id, "resuming": True, "pid": proc.pid}

    def _fork(self, run_id: str, body: Any) -> tuple[int, dict[str, Any]]:
        def snapshot_number(v: Any) -> bool:
            return v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 1)

        def locals_map(v: Any) -> bool:
            return isinstance(v, dict) and all(isinstance(k, str) and k.isidentifier() for k in v)

        fields = _fields(body, {"at": snapshot_number, "set": locals_map, "answer": _any_json,
                                "run_id": lambda v: v is None or isinstance(v, str)}, "fork")
        new_id = fields.get("run_id") or None
        if new_id is not None:
            try:
                check_name("run id", new_id, new=True)
            except errors.UsageError as exc:
                raise ApiError(400, str(exc)) from None
            try:  # the store refuses a taken id with a plain StoreError (a 500): say it here
                self.store.get_run(new_id)
            except errors.RunNotFoundError:
                pass
            else:
                raise ApiError(409, f"run {new_id!r} already exists: choose another run_id")
        if fields.get("at") is not None:
            numbers = [s.number for s in self.store.snapshots(run_id)]
            if fields["at"] not in numbers:
                raise ApiError(404, f"run {run_id} has no snapshot {fields['at']}; retained: "
                                    f"{', '.join(map(str, numbers)) or 'none'}")
        extra: dict[str, Any] = {"answer": fields["answer"]} if "answer" in fields else {}
        try:
            child = runtime.fork(self.store, run_id, at=fields.get("at"), sets=fields.get("set") or {},
                                 new_run_id=new_id, **extra)
        except errors.UsageError as exc:  # no such snapshot or local
            raise ApiError(400, str(exc)) from None
        return 201, {"id": child.run_id, "parent": run_id}

