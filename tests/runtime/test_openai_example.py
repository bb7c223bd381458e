"""examples/openai_agent.py with the real `openai` client against examples/openai_stub.py.

The stub runs in this process on 127.0.0.1 (ephemeral port) and logs every
request with its ``Idempotency-Key``.  A run that is SIGKILLed mid-way and
resumed must give the uninterrupted run's result, and the stub must see every
effect's key at least once and at most twice (twice only for the call that was
in flight at the kill, re-sent with the same key and the same messages).
"""

from __future__ import annotations

import collections
import importlib.util
import json
import pathlib
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

openai = pytest.importorskip("openai")

from tests._support.runs import Cli  # noqa: E402

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
AGENT = str(EXAMPLES / "openai_agent.py")
STUB = EXAMPLES / "openai_stub.py"
TOPIC = "durable execution"
CALLS = 5  # plan + 3 answers + summary


def load_stub():
    spec = importlib.util.spec_from_file_location("openai_stub", STUB)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def stub(tmp_path):
    server = load_stub().StubServer(log=str(tmp_path / "stub.jsonl"), delay=0.25)
    with server:
        yield server


def logged(stub) -> list[dict]:
    try:
        with open(stub.log) as fh:
            return [json.loads(line) for line in fh if line.endswith("\n")]
    except FileNotFoundError:
        return []


def by_key(stub, run_id: str) -> dict[str, list[dict]]:
    seen: dict[str, list[dict]] = collections.defaultdict(list)
    for entry in logged(stub):
        if (entry["idempotency_key"] or "").startswith(run_id + ":"):
            seen[entry["idempotency_key"]].append(entry)
    return seen


def test_killed_run_resumes_to_the_same_result_with_stable_idempotency_keys(tmp_path, stub):
    """SIGKILL after the stub served 2 requests, resume: same result, each key seen once or twice."""
    cli = Cli(tmp_path, OPENAI_BASE_URL=stub.base_url)
    straight = cli.run("run", "--json", "--run-id", "straight", AGENT, TOPIC, timeout=60, check=True)
    expected = json.loads(straight.stdout)
    assert expected["status"] == "completed" and expected["effects"] == CALLS
    assert expected["result"]["topic"] == TOPIC and len(expected["result"]["answers"]) == CALLS - 2
    seen = by_key(stub, "straight")
    assert sorted(seen) == sorted(f"straight:{i}" for i in range(1, CALLS + 1))
    assert all(len(v) == 1 for v in seen.values())

    proc = cli.popen("run", "--json", "--run-id", "crash", AGENT, TOPIC)
    try:
        deadline = time.monotonic() + 15
        # The agent is sequential: a 3rd request arriving means 2 were served;
        # the stub's delay keeps the 3rd in flight while the kill lands.
        while sum(len(v) for v in by_key(stub, "crash").values()) < 3:
            assert proc.poll() is None, f"agent exited early: {proc.communicate()}"
            assert time.monotonic() < deadline, "the stub never saw 3 requests"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL

    resumed = cli.run("resume", "--json", "crash", timeout=60, check=True)
    doc = json.loads(resumed.stdout)
    assert doc["status"] == "completed", doc
    assert doc["result"] == expected["result"]
    shown = cli.show("crash")
    assert shown["status"] == "completed" and shown["result"] == expected["result"]

    seen = by_key(stub, "crash")
    assert sorted(seen) == sorted(f"crash:{i}" for i in range(1, CALLS + 1))
    assert all(1 <= len(v) <= 2 for v in seen.values()), {k: len(v) for k, v in seen.items()}
    twice = {k for k, v in seen.items() if len(v) == 2}
    assert len(twice) <= 1  # one kill, one call in flight at most
    for key in twice:  # the re-issue is the same request, under the same key
        first, again = seen[key]
        assert first["messages"] == again["messages"] and again["repeat"]
    reissued = {e["key"] for e in shown["events"] if e["kind"] == "in_doubt_reissued"}
    assert twice <= reissued


def test_stub_answers_deterministically_and_logs_keys(tmp_path, stub):
    """The stub gives a valid chat.completion, the same content for the same messages, and logs each key."""
    client = openai.OpenAI(base_url=stub.base_url, api_key="stub", max_retries=0)
    try:
        messages = [{"role": "user", "content": "Plan: list 2 questions about stubs"}]
        first = client.chat.completions.create(
            model="m", messages=messages, extra_headers={"Idempotency-Key": "k1"}
        )
        second = client.chat.completions.create(model="m", messages=messages)
    finally:
        client.close()
    assert first.choices[0].message.content == second.choices[0].message.content
    assert first.choices[0].message.content.splitlines() == [
        "What about the history of stubs?", "What about the core mechanism of stubs?",
    ]
    assert [e["idempotency_key"] for e in logged(stub)] == ["k1", None]
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(urllib.request.Request(stub.base_url + "/nope", data=b"{}"), timeout=5)
    info.value.close()
    assert info.value.code == 404


def test_stub_script_prints_its_port_and_serves(tmp_path):
    """`python examples/openai_stub.py --port 0 --log FILE` prints the port and serves the API there."""
    log = tmp_path / "cli-stub.jsonl"
    proc = subprocess.Popen(
        [sys.executable, str(STUB), "--port", "0", "--log", str(log)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="stub", max_retries=0)
        with client:
            reply = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}],
                extra_headers={"Idempotency-Key": "cli-1"},
            )
        assert reply.object == "chat.completion" and reply.choices[0].finish_reason == "stop"
        assert json.loads(log.read_text())["idempotency_key"] == "cli-1"
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
