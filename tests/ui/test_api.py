"""``tcc ui``'s HTTP side against a real server: the JSON API, the pages, the checks on
what a request may do (token, host, cross-site POSTs, bodies), and the ``tcc ui`` command.

One ``tcc ui`` process serves the module (starting one costs about half a second); each
test starts the runs it needs with ``tcc run`` in the shared LMDB store, so the tests do
not depend on their order.  A refused request is checked to have changed nothing, with
``tcc show --json`` or the API.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlsplit

import pytest

from tests._support.ui import AGENT, Answer, Ui, parked_run, running_ui, tcc

POLL = 60.0  # seconds a polling loop waits at most
SECURITY_HEADERS = {"x-frame-options": "DENY", "x-content-type-options": "nosniff",
                    "referrer-policy": "no-referrer", "cache-control": "no-store"}
RAW_SCRIPT = "<script>window.pwned"
ESCAPED_SCRIPT = "&lt;script&gt;window.pwned"


# ----------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("ui") / "store")
    parked_run(path, func="quick")  # `tcc run` creates the store; `tcc ui` wants one
    return path


@pytest.fixture(scope="module")
def ui(store: str) -> Iterator[Ui]:
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    with running_ui(store) as server:
        yield server


# ------------------------------------------------------------------------------ helpers

def show(store: str, run_id: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    return json.loads(tcc("show", "--json", "--store", store, run_id, env=env).stdout)  # type: ignore[no-any-return]


def inspect(store: str, run_id: str, *extra: str) -> dict[str, Any]:
    return json.loads(tcc("inspect", "--json", "--store", store, *extra, run_id).stdout)  # type: ignore[no-any-return]


def listed(store: str) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in json.loads(tcc("ls", "--json", "--store", store).stdout)}


def resume(store: str, run_id: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    return json.loads(tcc("resume", "--json", "--store", store, run_id, env=env).stdout)  # type: ignore[no-any-return]


def api(ui: Ui, run_id: str) -> dict[str, Any]:
    answer = ui.get(f"/api/runs/{run_id}")
    assert answer.status == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


def approval_pending(ui: Ui, run_id: str) -> bool:
    """Whether the gated run's approval is still unanswered (per the API)."""
    doc = api(ui, run_id)
    return doc["status"] == "waiting" and [w["signal"] for w in doc["waits"]] == ["not sent"]


def kinds(doc: dict[str, Any]) -> list[str]:
    return [e["kind"] for e in doc["events"]]


def wait_until_finished(ui: Ui, run_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + POLL
    while True:
        doc = api(ui, run_id)
        if doc["status"] in ("completed", "failed", "cancelled"):
            return doc
        assert time.monotonic() < deadline, f"run {run_id} still {doc['status']} after {POLL} s: {kinds(doc)}"
        time.sleep(0.1)


def error_of(answer: Answer, status: int) -> str:
    """The JSON error message of a refused API request with ``status``."""
    assert answer.status == status, (answer.status, answer.text)
    assert answer.headers["content-type"].startswith("application/json"), answer.headers
    message = answer.json()["error"]
    assert isinstance(message, str) and message
    return message


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def csrf_of(page: Answer) -> str:
    found = re.search(r'<meta name="tcc-csrf" content="([^"]+)">', page.text)
    assert found, page.text[:500]
    return found.group(1)


# ------------------------------------------------------------------------------- reads

def test_the_run_list_filters_by_status_and_search(ui: Ui, store: str) -> None:
    gated = parked_run(store, func="gated")
    quick = parked_run(store, func="quick")

    everything = ui.get("/api/runs")
    assert everything.status == 200 and everything.headers["content-type"].startswith("application/json")
    doc = everything.json()
    rows = {r["id"]: r for r in doc["runs"]}
    assert {gated, quick} <= set(rows)
    assert doc["total"] == len(doc["runs"]) == doc["shown"] and doc["damaged"] == []
    assert set(rows) == set(listed(store))  # the same runs as `tcc ls`
    created = [r["created"] for r in doc["runs"]]
    assert created == sorted(created, reverse=True)  # newest first
    row = rows[gated]
    assert row["status"] == "waiting" and row["entry"] == f"{AGENT}:gated"
    assert row["needs_human"] is True
    assert [(w["kind"], w["prompt"], w["signal"]) for w in row["waits"]] == [
        ("approval", "Deploy to prod?", "not sent")]
    assert rows[quick]["status"] == "completed" and rows[quick]["needs_human"] is False
    assert rows[quick]["waits"] == [] and rows[quick]["last_event"]["kind"] == "completed"

    waiting = ui.get("/api/runs?status=waiting").json()["runs"]
    assert gated in {r["id"] for r in waiting} and quick not in {r["id"] for r in waiting}
    assert {r["status"] for r in waiting} == {"waiting"}
    completed = ui.get("/api/runs?status=completed").json()["runs"]
    assert quick in {r["id"] for r in completed} and {r["status"] for r in completed} == {"completed"}

    assert [r["id"] for r in ui.get(f"/api/runs?q={gated}").json()["runs"]] == [gated]
    assert [r["id"] for r in ui.get(f"/api/runs?q={gated[:12].upper()}").json()["runs"]] == [gated]
    by_entry = ui.get("/api/runs?q=ui_agent.py:quick").json()["runs"]
    assert quick in {r["id"] for r in by_entry} and {r["entry"] for r in by_entry} == {f"{AGENT}:quick"}
    assert ui.get("/api/runs?q=no-such-run-anywhere").json() == {"runs": [], "total": 0, "shown": 0,
                                                                  "damaged": []}
    assert ui.get("/api/runs?status=waiting&q=ui_agent.py:quick").json()["runs"] == []  # both filters apply
    assert "status must be one of" in error_of(ui.get("/api/runs?status=bogus"), 400)


@pytest.mark.parametrize("func", ["gated", "quick"])
def test_a_run_is_the_document_of_tcc_show_json(ui: Ui, store: str, func: str) -> None:
    run_id = parked_run(store, func=func)
    doc = api(ui, run_id)
    cli = show(store, run_id)
    assert set(doc) == set(cli)
    for key in ("id", "tenant", "status", "entry", "args", "result", "error", "strategy", "epoch", "waits",
                "children", "parent", "snapshots", "effects", "checkpoints", "created"):
        assert doc[key] == cli[key], key
    assert kinds(doc) == kinds(cli)
    assert [c["call"] for c in doc["calls"]] == [c["call"] for c in cli["calls"]]
    assert doc["id"] == run_id and doc["args"] == ["hello"] and doc["entry"] == f"{AGENT}:{func}"
    if func == "quick":
        assert doc["status"] == "completed"
        assert doc["result"] == ["step 0 of hello", "step 1 of hello", "step 2 of hello"]
    else:
        assert doc["status"] == "waiting" and doc["result"] is None
        assert [w["id"] for w in doc["waits"]] == ["approval@1"]


def test_the_stack_is_the_document_of_tcc_inspect_json(ui: Ui, store: str) -> None:
    run_id = parked_run(store)
    newest = ui.get(f"/api/runs/{run_id}/stack")
    assert newest.status == 200 and newest.headers["content-type"].startswith("application/json")
    doc = newest.json()
    cli = inspect(store, run_id)
    assert set(doc) == set(cli)
    for key in ("run", "status", "entry", "snapshot", "snapshots", "journal_len", "awaiting", "unsafe_repr"):
        assert doc[key] == cli[key], key
    assert doc["frames"] == cli["frames"]
    assert doc["unsafe_repr"] is False
    frame = doc["frames"][-1]
    assert frame["function"] == "gated"
    assert frame["locals"]["topic"] == "'hello'"
    assert frame["locals"]["steps"] == repr([f"step {i} of hello" for i in range(3)])
    assert frame["locals"]["note"] == repr("<script>window.pwned = 1</script>")
    assert doc["awaiting"]["kind"] == "approval" and doc["awaiting"]["wait_id"] == "approval@1"

    first_number = doc["snapshots"][0]
    assert first_number < doc["snapshot"]
    first = ui.get(f"/api/runs/{run_id}/stack?at={first_number}")
    assert first.status == 200
    first_cli = inspect(store, run_id, "--at", str(first_number))
    assert first.json()["snapshot"] == first_cli["snapshot"] == first_number
    assert first.json()["frames"] == first_cli["frames"]
    assert first.json()["frames"][-1]["locals"]["note"] == "<unbound>"  # not assigned yet back then


# ----------------------------------------------------------------------------- actions

def test_approve_then_tcc_resume_completes_the_deploy(ui: Ui, store: str) -> None:
    run_id = parked_run(store)
    answer = ui.post(f"/api/runs/{run_id}/approve", {"comment": "ship it"})
    assert answer.status == 200, answer.text
    assert answer.json() == {"id": run_id, "signal": "approval@1", "delivered": True, "approved": True}
    doc = show(store, run_id)
    assert doc["status"] == "waiting" and [w["signal"] for w in doc["waits"]] != ["not sent"]

    again = ui.post(f"/api/runs/{run_id}/approve", {})  # answered already
    assert "already answered" in error_of(again, 409)
    assert "already answered" in error_of(ui.post(f"/api/runs/{run_id}/reject"), 409)
    assert kinds(show(store, run_id)) == kinds(doc)

    done = resume(store, run_id)
    assert done["status"] == "completed"
    assert done["result"] == {"ok": True, "done": "deployed 3 steps", "note": "<script>window.pwned = 1</script>"}


def test_reject_takes_the_rollback_path(ui: Ui, store: str) -> None:
    run_id = parked_run(store)
    answer = ui.post(f"/api/runs/{run_id}/reject", raw=json.dumps({"comment": None}).encode(),
                     headers={"Content-Type": "application/json; charset=utf-8"})
    assert answer.status == 200, answer.text
    assert answer.json()["approved"] is False and answer.json()["delivered"] is True
    done = resume(store, run_id)
    assert done["status"] == "completed"
    assert done["result"] == {"ok": False, "done": "rolled back", "note": "<script>window.pwned = 1</script>"}


def test_a_signal_is_delivered_and_the_resumed_run_reads_its_value(ui: Ui, store: str) -> None:
    run_id = parked_run(store, func="signalled")
    assert api(ui, run_id)["waits"][0]["name"] == "go"
    answer = ui.post(f"/api/runs/{run_id}/signal", {"name": "go", "value": {"n": 7, "who": "ui"}})
    assert answer.status == 200, answer.text
    assert answer.json()["delivered"] is True and answer.json()["id"] == run_id
    doc = show(store, run_id)
    signalled = [e for e in doc["events"] if e["kind"] == "signalled"]
    assert len(signalled) == 1, kinds(doc)
    done = resume(store, run_id)
    assert done["status"] == "completed"
    value = {"n": 7, "who": "ui"}
    assert done["result"] == [f"step {i} of hello/{value}" for i in range(3)]


def test_cancel_with_a_reason_cancels_the_children_too(ui: Ui, store: str) -> None:
    parent = parked_run(store, func="parent")
    child = show(store, parent)["children"]
    assert len(child) == 1 and show(store, child[0])["status"] == "waiting"
    answer = ui.post(f"/api/runs/{parent}/cancel", {"reason": "changed my mind"})
    assert answer.status == 200, answer.text
    doc = answer.json()
    assert doc["id"] == parent and doc["status"] == "cancelled" and doc["was"] == "waiting"
    assert doc["children"] == [{"id": child[0], "was": "waiting"}]
    for rid in (parent, child[0]):
        cli = show(store, rid)
        assert cli["status"] == "cancelled"
        cancelled = [e for e in cli["events"] if e["kind"] == "cancelled"]
        assert len(cancelled) == 1 and cancelled[0]["data"]["reason"] == "changed my mind"
    assert {r["status"] for rid, r in listed(store).items() if rid in (parent, child[0])} == {"cancelled"}
    assert "already cancelled" in error_of(ui.post(f"/api/runs/{parent}/cancel"), 409)


def test_resume_from_the_dashboard_runs_the_approved_run_to_its_end(ui: Ui, store: str) -> None:
    run_id = parked_run(store)
    not_due = ui.post(f"/api/runs/{run_id}/resume")
    assert "answer it first" in error_of(not_due, 409)
    assert approval_pending(ui, run_id) and "resume_requested" not in kinds(api(ui, run_id))

    assert ui.post(f"/api/runs/{run_id}/approve").status == 200
    started = ui.post(f"/api/runs/{run_id}/resume", {})
    assert started.status == 202, started.text
    assert started.json()["id"] == run_id and started.json()["resuming"] is True
    assert isinstance(started.json()["pid"], int)
    # a second resume while the first runs (or after it ended) is refused
    error_of(ui.post(f"/api/runs/{run_id}/resume"), 409)
    doc = wait_until_finished(ui, run_id)
    assert doc["status"] == "completed", doc["error"]
    assert doc["result"] == {"ok": True, "done": "deployed 3 steps", "note": "<script>window.pwned = 1</script>"}
    requested = [e for e in doc["events"] if e["kind"] == "resume_requested"]
    assert len(requested) == 1 and requested[0]["data"]["pid"] == started.json()["pid"]
    assert show(store, run_id)["result"] == doc["result"]


def test_a_fork_with_an_edited_local_resumes_with_it(ui: Ui, store: str) -> None:
    run_id = parked_run(store)
    newest = api(ui, run_id)["snapshots"][-1]["number"]
    fork_id = new_id("fork")
    answer = ui.post(f"/api/runs/{run_id}/fork",
                     {"set": {"steps": ["just one"], "note": "edited"}, "at": newest, "run_id": fork_id})
    assert answer.status == 201, answer.text
    assert answer.json() == {"id": fork_id, "parent": run_id}
    doc = show(store, fork_id)
    forked = [e["data"] for e in doc["events"] if e["kind"] == "forked"]
    assert len(forked) == 1 and forked[0]["parent"] == run_id and forked[0]["snapshot"] == newest
    assert sorted(forked[0]["set"]) == ["note", "steps"]
    locals_ = ui.get(f"/api/runs/{fork_id}/stack").json()["frames"][-1]["locals"]
    assert locals_["note"] == "'edited'" and locals_["steps"] == "['just one']"

    assert ui.post(f"/api/runs/{fork_id}/approve").status == 200
    done = resume(store, fork_id)
    assert done["status"] == "completed"
    assert done["result"] == {"ok": True, "done": "deployed 1 steps", "note": "edited"}
    assert approval_pending(ui, run_id)  # the original is untouched

    # a fork without a chosen id gets one
    auto = ui.post(f"/api/runs/{run_id}/fork", {})
    assert auto.status == 201 and auto.json()["id"] != run_id and api(ui, auto.json()["id"])["status"]
    # and a taken id, an unknown local, a missing snapshot are refused
    before = set(listed(store))
    assert "already exists" in error_of(ui.post(f"/api/runs/{run_id}/fork", {"run_id": fork_id}), 409)
    assert "already exists" in error_of(ui.post(f"/api/runs/{run_id}/fork", {"run_id": run_id}), 409)
    error_of(ui.post(f"/api/runs/{run_id}/fork", {"set": {"no_such_local": 1}, "run_id": new_id("f")}), 400)
    error_of(ui.post(f"/api/runs/{run_id}/fork", {"at": 99, "run_id": new_id("f")}), 404)  # as /stack?at=99
    assert set(listed(store)) == before


# --------------------------------------------------------------------------------- pages

@pytest.mark.parametrize("path, ctype", [
    ("/", "text/html"),
    ("/?status=waiting&q=gated", "text/html"),
    ("/runs/{id}", "text/html"),
    ("/runs/{id}/stack", "text/html"),
    ("/runs/{id}/stack?at=1", "text/html"),
    ("/fragments/runs", "text/html"),
    ("/fragments/runs?status=waiting", "text/html"),
    ("/fragments/runs/{id}", "text/html"),
    ("/static/app.js", "text/javascript"),
    ("/static/app.css", "text/css"),
])
def test_pages_are_served_with_their_content_type(ui: Ui, store: str, path: str, ctype: str) -> None:
    run_id = parked_run(store)
    answer = ui.get(path.format(id=run_id))
    assert answer.status == 200, answer.text
    assert answer.headers["content-type"].split(";")[0] == ctype
    for name, value in SECURITY_HEADERS.items():
        assert answer.headers[name] == value, name
    assert "script-src 'self'" in answer.headers["content-security-policy"]
    assert answer.body
    if path.startswith("/fragments/runs") and "{id}" not in path:
        assert run_id in answer.text
    if path.startswith("/runs/"):
        assert run_id in answer.text and csrf_of(answer)


def test_unknown_pages_and_routes_are_404(ui: Ui) -> None:
    page = ui.get("/no/such/page")
    assert page.status == 404 and page.headers["content-type"].startswith("text/html")
    assert "/no/such/page" in page.text
    assert "no such route" in error_of(ui.get("/api/nope"), 404)
    missing = ui.get("/runs/no-such-run")
    assert missing.status == 404 and missing.headers["content-type"].startswith("text/html")
    assert ui.get("/runs/no-such-run/stack").status == 404
    assert ui.get("/fragments/runs/no-such-run").status == 404
    bad = ui.get("/runs/bad%20id")
    assert bad.status == 400 and bad.headers["content-type"].startswith("text/html")
    assert "x-frame-options" in page.headers and "content-security-policy" in page.headers


def test_run_text_is_escaped_on_every_page(ui: Ui, store: str) -> None:
    run_id = parked_run(store)
    stack = ui.get(f"/runs/{run_id}/stack")
    assert stack.status == 200
    assert ESCAPED_SCRIPT in stack.text
    assert RAW_SCRIPT not in stack.text
    assert "script-src 'self'" in stack.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in stack.headers["content-security-policy"]
    assert stack.headers["x-frame-options"] == "DENY"
    for path in (f"/runs/{run_id}", f"/fragments/runs/{run_id}", "/fragments/runs", "/",
                 f"/runs/{run_id}/stack?at=1"):
        page = ui.get(path)
        assert page.status == 200 and RAW_SCRIPT not in page.text, path
    # the API carries the repr as JSON data, never as HTML
    api_stack = ui.get(f"/api/runs/{run_id}/stack")
    assert api_stack.headers["content-type"].startswith("application/json")
    assert api_stack.headers["x-content-type-options"] == "nosniff"
    assert api_stack.json()["frames"][-1]["locals"]["note"] == "'<script>window.pwned = 1</script>'"
    assert "script-src 'self'" in api_stack.headers["content-security-policy"]


# ----------------------------------------------------------------------------- bad input

def test_bad_and_unknown_run_ids(ui: Ui, store: str) -> None:
    for path in ("/api/runs/bad%21id", "/api/runs/bad%20id/stack", "/api/runs/" + "x" * 129):
        assert "invalid run id" in error_of(ui.get(path), 400), path
    assert "invalid run id" in error_of(ui.post("/api/runs/bad%21id/approve"), 400)
    for path in ("/api/runs/no-such-run", "/api/runs/no-such-run/stack"):
        assert "no run 'no-such-run'" in error_of(ui.get(path), 404)
    for action in ("approve", "reject", "signal", "cancel", "resume", "fork"):
        error_of(ui.post(f"/api/runs/no-such-run/{action}", {}), 404)
    assert "no-such-run" not in listed(store)


def test_bad_bodies_are_refused_before_anything_changes(ui: Ui, store: str) -> None:
    run_id = parked_run(store)
    approve = f"/api/runs/{run_id}/approve"
    before = show(store, run_id)
    runs_before = set(listed(store))

    assert "not valid JSON" in error_of(ui.post(approve, raw=b"{nope", headers={"Content-Type": "application/json"}),
                                        400)
    assert "must be a JSON object" in error_of(ui.post(approve, ["yes"]), 400)
    assert "must be a JSON object" in error_of(ui.post(approve, "yes"), 400)
    assert "unknown field(s): commnet" in error_of(ui.post(approve, {"commnet": "typo"}), 400)
    assert "wrong kind" in error_of(ui.post(approve, {"comment": 5}), 400)
    assert "wrong kind" in error_of(ui.post(approve, {"comment": "x" * 10_001}), 400)
    for ctype in ("application/x-www-form-urlencoded", "text/plain", None):
        headers = {"Content-Type": ctype} if ctype else {}
        answer = ui.post(approve, raw=b'{"comment": "x"}', headers=headers)
        assert "Content-Type: application/json" in error_of(answer, 415), ctype
    assert "unknown field(s): x" in error_of(ui.post(f"/api/runs/{run_id}/resume", {"x": 1}), 400)
    assert "wrong kind" in error_of(ui.post(f"/api/runs/{run_id}/cancel", {"reason": ["no"]}), 400)
    for body in ({"at": "2"}, {"at": 0}, {"at": True}, {"set": {"not an identifier": 1}}, {"set": [1]},
                 {"run_id": 7}, {"run_id": "bad id"}):
        error_of(ui.post(f"/api/runs/{run_id}/fork", body), 400)

    assert show(store, run_id) == before  # nothing recorded, nothing answered
    assert set(listed(store)) == runs_before  # nothing forked


def test_bad_signals_are_refused(ui: Ui, store: str) -> None:
    run_id = parked_run(store, func="signalled")
    path = f"/api/runs/{run_id}/signal"
    before = show(store, run_id)
    assert "needs a name" in error_of(ui.post(path, {"value": 1}), 400)
    assert "needs a name" in error_of(ui.post(path), 400)
    assert "invalid signal name" in error_of(ui.post(path, {"name": "no spaces"}), 400)
    assert "invalid signal name" in error_of(ui.post(path, {"name": ""}), 400)
    assert "invalid signal name" in error_of(ui.post(path, {"name": "x" * 101}), 400)
    assert "wrong kind" in error_of(ui.post(path, {"name": 5}), 400)
    assert "unknown field(s): data" in error_of(ui.post(path, {"name": "go", "data": 1}), 400)
    assert show(store, run_id) == before
    assert "signalled" not in kinds(before)


def test_the_stack_at_a_bad_or_missing_snapshot(ui: Ui, store: str) -> None:
    run_id = parked_run(store)
    assert "snapshot number" in error_of(ui.get(f"/api/runs/{run_id}/stack?at=newest"), 400)
    assert "no snapshot 99" in error_of(ui.get(f"/api/runs/{run_id}/stack?at=99"), 404)
    page = ui.get(f"/runs/{run_id}/stack?at=99")
    assert page.status == 404 and page.headers["content-type"].startswith("text/html")
    assert ui.get(f"/runs/{run_id}/stack?at=x").status == 400


def test_unknown_actions_and_wrong_methods(ui: Ui, store: str) -> None:
    run_id = parked_run(store)
    assert "no action 'frobnicate'" in error_of(ui.post(f"/api/runs/{run_id}/frobnicate", {}), 404)
    assert error_of(ui.get(f"/api/runs/{run_id}/approve"), 405)
    wrong = ui.post("/api/runs", {})
    assert wrong.status in (404, 405) and wrong.json()["error"]
    wrong = ui.post(f"/api/runs/{run_id}", {})
    assert wrong.status in (404, 405) and wrong.json()["error"]
    wrong = ui.post(f"/api/runs/{run_id}/stack", {})  # a GET route: not an action
    assert wrong.status in (404, 405) and wrong.json()["error"]
    assert ui.request("DELETE", f"/api/runs/{run_id}").status in (404, 405)
    assert approval_pending(ui, run_id)


def test_actions_on_a_finished_run_are_409_and_change_nothing(ui: Ui, store: str) -> None:
    run_id = parked_run(store, func="quick")
    before = show(store, run_id)
    assert before["status"] == "completed"
    for action, body in (("approve", None), ("reject", {"comment": "no"}), ("signal", {"name": "go", "value": 1}),
                         ("cancel", {"reason": "late"}), ("resume", None)):
        error_of(ui.post(f"/api/runs/{run_id}/{action}", body), 409)
    assert show(store, run_id) == before
    # a finished run can still be forked, which is how one tries a variation
    assert ui.post(f"/api/runs/{run_id}/fork", {"run_id": new_id("done")}).status == 201


# ------------------------------------------------------------------------------- auth

def test_no_token_is_401_and_a_wrong_one_is_403(ui: Ui, store: str) -> None:
    run_id = parked_run(store)
    assert "access token is needed" in error_of(ui.get("/api/runs", token=None), 401)
    page = ui.get("/", token=None)
    assert page.status == 401 and page.headers["content-type"].startswith("text/html")
    assert "access token is needed" in page.text
    assert ui.get("/static/app.js", token=None).status == 401
    assert "wrong access token" in error_of(ui.get("/api/runs", token="not-the-token"), 403)
    assert ui.get(f"/runs/{run_id}", token="not-the-token").status == 403
    assert ui.get("/api/runs?token=not-the-token", token=None).status == 403
    assert ui.get("/api/runs", token=None, headers={"Cookie": f"{ui.cookie}=nope"}).status == 403
    # and an action without a (good) token does nothing
    error_of(ui.post(f"/api/runs/{run_id}/approve", {}, token=None), 401)
    error_of(ui.post(f"/api/runs/{run_id}/approve", {}, token="not-the-token"), 403)
    assert approval_pending(ui, run_id)


def test_the_token_by_query_or_cookie_works_for_reads(ui: Ui, store: str) -> None:
    run_id = parked_run(store)
    by_query = ui.get(f"/api/runs/{run_id}", token="query")
    assert by_query.status == 200 and by_query.json()["id"] == run_id
    by_cookie = ui.get(f"/api/runs/{run_id}", token="cookie")
    assert by_cookie.status == 200 and by_cookie.json()["id"] == run_id
    page = ui.get(f"/runs/{run_id}", token="cookie")
    assert page.status == 200 and run_id in page.text
    assert ui.get("/static/app.css", token="cookie").status == 200


def test_opening_the_printed_url_sets_a_strict_cookie_and_drops_the_token(ui: Ui) -> None:
    answer = ui.get("/", token="query")
    assert answer.status == 303
    assert answer.headers["location"] == "/"
    cookie = answer.headers["set-cookie"]
    assert cookie.startswith(f"{ui.cookie}={ui.token};")
    attrs = {a.strip().lower() for a in cookie.split(";")[1:]}
    assert "httponly" in attrs and "samesite=strict" in attrs and "path=/" in attrs
    kept = ui.get("/runs/x/stack?at=1", token="query")
    assert kept.status == 303 and kept.headers["location"] == "/runs/x/stack?at=1"
    assert ui.token not in kept.headers["location"]


def test_a_host_name_that_is_not_loopback_is_refused(ui: Ui, store: str) -> None:
    port = ui.base.rsplit(":", 1)[1]
    assert "loopback host name" in error_of(ui.get("/api/runs", headers={"Host": f"evil.example:{port}"}), 403)
    page = ui.get("/", headers={"Host": f"evil.example:{port}"})
    assert page.status == 403 and page.headers["content-type"].startswith("text/html")
    assert ui.get("/api/runs", headers={"Host": "evil.example"}).status == 403
    assert ui.get("/api/runs", headers={"Host": f"127.0.0.1.evil.example:{port}"}).status == 403
    assert ui.get("/api/runs", headers={"Host": f"localhost:{port}"}).status == 200
    assert ui.get("/api/runs", headers={"Host": f"[::1]:{port}"}).status == 200
    run_id = parked_run(store)
    error_of(ui.post(f"/api/runs/{run_id}/approve", headers={"Host": f"evil.example:{port}"}), 403)
    assert approval_pending(ui, run_id)


# ------------------------------------------------------------------------ cross-site

def test_a_cookie_post_needs_the_pages_csrf_token(ui: Ui, store: str) -> None:
    run_id = parked_run(store)
    approve = f"/api/runs/{run_id}/approve"
    assert "X-TCC-CSRF" in error_of(ui.post(approve, {}, token="cookie"), 403)
    assert "X-TCC-CSRF" in error_of(ui.post(approve, {}, token="cookie", headers={"X-TCC-CSRF": "guess"}), 403)
    assert approval_pending(ui, run_id)
    assert "approval_answered" not in kinds(show(store, run_id))

    page = ui.get(f"/runs/{run_id}", token="cookie")
    csrf = csrf_of(page)
    assert csrf != ui.token
    ok = ui.post(approve, {"comment": "from the page"}, token="cookie",
                 headers={"X-TCC-CSRF": csrf, "Origin": ui.base, "Sec-Fetch-Site": "same-origin"})
    assert ok.status == 200, ok.text
    assert ok.json()["approved"] is True
    assert not approval_pending(ui, run_id)


def test_a_post_from_another_site_is_refused_even_with_the_token(ui: Ui, store: str) -> None:
    run_id = parked_run(store)
    approve = f"/api/runs/{run_id}/approve"
    page = ui.get(f"/runs/{run_id}", token="cookie")
    csrf = csrf_of(page)
    for headers in ({"Origin": "http://evil.example"}, {"Origin": "null"},
                    {"Origin": ui.base.replace("127.0.0.1", "localhost")},
                    {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"}):
        assert "cross-site" in error_of(ui.post(approve, {}, headers=headers), 403), headers
        assert "cross-site" in error_of(ui.post(approve, {}, token="cookie", headers={**headers, "X-TCC-CSRF": csrf}),
                                        403), headers
    error_of(ui.post(f"/api/runs/{run_id}/cancel", {}, headers={"Origin": "http://evil.example"}), 403)
    assert approval_pending(ui, run_id)
    # the same request from the dashboard's own origin is fine
    assert ui.post(approve, {}, headers={"Origin": ui.base, "Sec-Fetch-Site": "same-origin"}).status == 200


# ------------------------------------------------------------------------ the command

def _ui_command(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tcc", "ui", *args], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, **(env or {})))


def test_tcc_ui_on_a_missing_store_says_so_in_one_line(tmp_path: Path) -> None:
    pytest.importorskip("starlette")
    out = _ui_command("--store", str(tmp_path / "nothing-here"), "--port", "0")
    assert out.returncode == 1
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "no tcc store at" in lines[0], out.stderr
    assert not (tmp_path / "nothing-here").exists()


def test_tcc_ui_refuses_a_remote_host_without_allow_remote_and_a_bad_port(store: str) -> None:
    pytest.importorskip("starlette")
    out = _ui_command("--store", store, "--port", "0", "--host", "0.0.0.0")
    assert out.returncode == 2
    assert out.stdout == ""  # no URL: nothing is served
    assert "--allow-remote" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    out = _ui_command("--store", store, "--port", "99999")
    assert out.returncode == 2 and out.stdout == ""
    assert "--port must be 0-65535" in out.stderr


def test_tcc_ui_with_allow_remote_serves_and_warns(store: str) -> None:
    pytest.importorskip("starlette")
    with running_ui(store, extra=("--host", "0.0.0.0", "--allow-remote")) as remote:
        assert remote.url.startswith("http://0.0.0.0:") and "/?token=" in remote.url
        assert remote.proc.stderr is not None
        warning = remote.proc.stderr.readline()
        assert warning.startswith("tcc: warning:") and "0.0.0.0" in warning and "TLS" in warning
        assert remote.get("/api/runs").status == 200
        assert remote.get("/api/runs", token=None).status == 401


def test_tcc_ui_without_the_ui_extra_one_line_says_how(store: str, tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "starlette.py").write_text("raise ImportError('No module named starlette')\n")
    env = {"PYTHONPATH": f"{blocker}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = _ui_command("--store", store, "--port", "0", env=env)
    assert out.returncode == 1
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "pip install 'tcc[ui]'" in lines[0], lines[0]


# ------------------------------------------------------------------------- PostgreSQL

def test_the_dashboard_on_a_postgresql_store(pg_dsn: str, tmp_path: Path) -> None:
    pytest.importorskip("starlette")
    pytest.importorskip("psycopg")
    from tests._support.pgstores import make_pg_store

    pg = make_pg_store(pg_dsn, tmp_path)
    run_id = parked_run(pg.url, env=pg.env())
    with running_ui(pg.url, env=pg.env()) as server:
        rows = server.get("/api/runs?status=waiting").json()["runs"]
        assert [r["id"] for r in rows] == [run_id] and rows[0]["needs_human"] is True
        page = server.get("/")
        assert page.status == 200 and "postgresql://" in page.text
        password = urlsplit(pg.url).password
        assert not password or password not in page.text  # the store's URL is shown redacted
        assert server.post(f"/api/runs/{run_id}/approve", {"comment": "pg"}).status == 200
        assert server.post(f"/api/runs/{run_id}/approve", {}).status == 409
        assert show(pg.url, run_id, env=pg.env())["waits"][0]["signal"] != "not sent"
        assert server.post(f"/api/runs/{run_id}/resume").status == 202
        doc = wait_until_finished(server, run_id)
    assert doc["status"] == "completed", doc["error"]
    assert doc["result"]["ok"] is True and doc["result"]["done"] == "deployed 3 steps"
