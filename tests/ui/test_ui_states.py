"""The dashboard in the states a review found it mishandled: a resume that fails, a run
whose approval is answered, a finished run, another loopback address, POSTs that carry the
token where they should not."""

from __future__ import annotations

import json
import pathlib
import shutil
import time

from tests._support.ui import AGENT, parked_run, running_ui, tcc


def _events(store: str, run_id: str) -> list[dict]:
    return json.loads(tcc("show", "--json", "--store", store, run_id).stdout)["events"]


def test_a_resume_that_fails_is_recorded_on_the_run(tmp_path: pathlib.Path) -> None:
    """The resume process the dashboard starts may fail (here: the script changed under the
    suspended frame); its error is recorded as a resume_failed event, not dropped."""
    script = tmp_path / "agent.py"
    shutil.copy(AGENT, script)
    store = str(tmp_path / "store")
    out = tcc("run", "--json", "--store", store, "--on-code-change", "refuse", f"{script}:gated", "x")
    run_id = json.loads(out.stdout)["id"]
    tcc("approve", "--store", store, run_id)
    script.write_text(script.read_text().replace('ok = await tcc.approval("Deploy to prod?")',
                                                 'ok = await tcc.approval("Deploy to staging?")'))
    with running_ui(store) as ui:
        answer = ui.post(f"/api/runs/{run_id}/resume")
        assert answer.status == 202, answer.text
        deadline = time.monotonic() + 60
        while True:
            ui.get(f"/api/runs/{run_id}")  # the dashboard looks at its resumes as pages poll
            failed = [e for e in _events(store, run_id) if e["kind"] == "resume_failed"]
            if failed or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert failed, _events(store, run_id)
        assert failed[0]["data"]["pid"] == answer.json()["pid"] and failed[0]["data"]["code"] == 1
        assert "changed" in failed[0]["data"]["error"], failed[0]
        page = ui.get(f"/fragments/runs/{run_id}").text
        assert "resume_failed" in page


def test_an_answered_approval_offers_the_resume_and_a_finished_run_only_a_fork(tmp_path: pathlib.Path) -> None:
    store = str(tmp_path / "store")
    run_id = parked_run(store)
    done = parked_run(store, func="quick")
    with running_ui(store) as ui:
        before = ui.get(f"/fragments/runs/{run_id}").text
        assert 'data-action="approve"' in before and "answered" not in before
        assert ui.post(f"/api/runs/{run_id}/approve", {}).status == 200
        after = ui.get(f"/fragments/runs/{run_id}").text
        assert 'data-action="approve"' not in after and "answered" in after
        assert 'data-action="resume"' in after
        row = [r for r in ui.get("/api/runs").json()["runs"] if r["id"] == run_id][0]
        assert row["ready"] and not row["needs_human"]
        assert "ready to resume" in ui.get("/fragments/runs").text
        finished = ui.get(f"/fragments/runs/{done}").text
        assert "data-action=" not in finished and "Frozen stack and fork" in finished
        assert "data-final" in finished  # the page stops polling a finished run


def test_a_post_with_the_token_in_the_url_or_a_form_body_is_refused(tmp_path: pathlib.Path) -> None:
    store = str(tmp_path / "store")
    run_id = parked_run(store)
    with running_ui(store) as ui:
        csrf = ui.get(f"/runs/{run_id}", token="cookie").text.split('name="tcc-csrf" content="')[1].split('"')[0]
        url = f"/api/runs/{run_id}/cancel"
        assert ui.request("POST", url, raw=b"", token="query").status == 403
        form = ui.request("POST", url, raw=b"reason=x", token="cookie",
                          headers={"X-TCC-CSRF": csrf, "Content-Type": "application/x-www-form-urlencoded"})
        assert form.status == 403 and "application/json" in form.json()["error"]
        assert ui.request("POST", url, raw=b"", token="cookie", headers={"X-TCC-CSRF": csrf}).status == 403
        assert json.loads(tcc("show", "--json", "--store", store, run_id).stdout)["status"] == "waiting"
        # a script with the header needs no body
        assert ui.post(url, token="header").status == 200


def test_another_loopback_address_is_served(tmp_path: pathlib.Path) -> None:
    store = str(tmp_path / "store")
    parked_run(store)
    with running_ui(store, extra=("--host", "127.0.0.2")) as ui:
        assert ui.base.startswith("http://127.0.0.2:")
        assert ui.get("/api/runs").status == 200
        assert ui.get("/api/runs", headers={"Host": "evil.example"}).status == 403
