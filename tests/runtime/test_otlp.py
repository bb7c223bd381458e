"""Traces that reach the operator's collector: ``tcc run``/``resume`` configured only by the
standard ``OTEL_*`` variables send their spans over OTLP/HTTP to a real receiver (an
http.server on 127.0.0.1 that decodes the protobuf requests), across a SIGKILL and a
resume, a park and a SIGTERM -- and a CLI that leaves with ``os._exit`` flushes first."""

from __future__ import annotations

import gzip
import http.server
import os
import signal
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk.trace")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http.trace_exporter")
trace_service_pb2 = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")

from tests._support.runs import AGENTS, Cli  # noqa: E402

AGENT = str(AGENTS / "otel_agent.py")
SERVICE = "tcc-otlp-test"
NEVER = "600000"  # OTEL_BSP_SCHEDULE_DELAY (ms): only a flush exports the spans


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent: str
    attributes: dict[str, Any]
    links: list[tuple[str, str, dict[str, Any]]]
    resource: dict[str, Any]


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return None if kind is None else getattr(any_value, kind)


def _attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


@dataclass
class Receiver:
    """The spans an OTLP/HTTP receiver on 127.0.0.1 was sent, in arrival order."""

    url: str = ""
    spans: list[Span] = field(default_factory=list)
    encodings: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, body: bytes, encoding: str) -> None:
        request = trace_service_pb2.ExportTraceServiceRequest()
        request.ParseFromString(body)
        got = []
        for rs in request.resource_spans:
            resource = _attributes(rs.resource.attributes)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.append(Span(
                        s.name, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(),
                        _attributes(s.attributes),
                        [(li.trace_id.hex(), li.span_id.hex(), _attributes(li.attributes)) for li in s.links],
                        resource,
                    ))
        with self.lock:
            self.spans += got
            self.encodings.append(encoding)

    def of(self, run_id: str, name: str | None = None) -> list[Span]:
        with self.lock:
            return [s for s in self.spans if s.attributes.get("tcc.run_id") == run_id
                    and (name is None or s.name == name)]


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Any

    def do_POST(self) -> None:  # noqa: N802 - the http.server protocol
        if self.path != "/v1/traces":
            self.send_error(404)
            return
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        encoding = (self.headers.get("Content-Encoding") or "identity").lower()
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding == "deflate":
            body = zlib.decompress(body)
        self.server.receiver.add(body, encoding)  # before answering: an export returns after this
        reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        pass


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.receiver = Receiver(url=f"http://127.0.0.1:{server.server_address[1]}")  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              name="otlp-receiver", daemon=True)
    thread.start()
    try:
        yield server.receiver  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()  # joins the request threads
        thread.join(timeout=30)
        assert not thread.is_alive()


def _cli(tmp_path: Any, receiver: Receiver, **env: str) -> Cli:
    """A Cli whose environment has no OTEL_* variable but the ones given (and the endpoint)."""
    cli = Cli(tmp_path)
    cli.env = {k: v for k, v in cli.env.items() if not k.startswith("OTEL_")}
    cli.env.update(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url, OTEL_SERVICE_NAME=SERVICE, **env)
    return cli


def _wait(what: str, done: Callable[[], bool], proc: subprocess.Popen[str] | None = None,
          timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate(timeout=30)
            raise AssertionError(f"waiting for {what}: tcc exited with {proc.returncode}\n{out}\n{err}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.communicate(timeout=30)


def _trace_events(cli: Cli, run_id: str) -> list[dict[str, Any]]:
    return [e["data"] for e in cli.show(run_id)["events"] if e["kind"] == "trace"]


def test_a_crashed_and_resumed_run_reaches_the_collector_as_one_linked_story(tmp_path, receiver):
    """SIGKILL mid-run, then ``tcc resume``: both segments' spans arrive over OTLP/HTTP (gzip),
    with the service name from $OTEL_SERVICE_NAME; the resumed ``tcc.run`` span links to the
    crashed segment's; and the resume's spans arrive although the process leaves with
    ``os._exit`` and its batch processor would not export them for ten minutes: the flush."""
    gate = tmp_path / "gate"
    cli = _cli(tmp_path, receiver, OTEL_BSP_SCHEDULE_DELAY="50", OTEL_EXPORTER_OTLP_COMPRESSION="gzip",
               GATE=str(gate))
    proc = cli.popen("run", "--run-id", "o1", AGENT)
    try:
        _wait("the first segment's effect spans", lambda: len(receiver.of("o1", "tcc.effect")) >= 3, proc)
        _wait("the gate effect to start", lambda: os.path.exists(f"{gate}.started"), proc)
        proc.send_signal(signal.SIGKILL)  # a real crash: no flush, no clean-up
        proc.communicate(timeout=60)
    finally:
        _stop(proc)
    assert proc.returncode == -signal.SIGKILL
    first = receiver.of("o1")
    assert not [s for s in first if s.name == "tcc.run"]  # it never ended
    first_effects = [s for s in first if s.name == "tcc.effect"]
    assert sorted(s.attributes["tcc.idempotency_key"] for s in first_effects) == ["o1:1", "o1:2", "o1:3"]
    first_run_span = {s.parent for s in first_effects}
    assert len(first_run_span) == 1 and len({s.trace_id for s in first_effects}) == 1
    (trace_event,) = _trace_events(cli, "o1")
    assert trace_event["span_id"] in first_run_span
    assert trace_event["trace_id"] == first_effects[0].trace_id

    gate.touch()
    cli.env["OTEL_BSP_SCHEDULE_DELAY"] = NEVER
    done = cli.run("resume", "o1", timeout=120)
    assert done.returncode == 0, done.stderr
    assert cli.show("o1")["status"] == "completed"

    # no waiting: each export is answered after the receiver stored it, and the
    # process has exited
    (resumed,) = receiver.of("o1", "tcc.run")
    assert resumed.attributes["tcc.resumed"] is True
    assert [(t, s) for t, s, _ in resumed.links] == [(trace_event["trace_id"], trace_event["span_id"])]
    assert resumed.links[0][2] == {"tcc.relation": "resumed_from"}
    second = [s for s in receiver.of("o1") if s not in first]
    assert {s.trace_id for s in second} == {resumed.trace_id} != {first_effects[0].trace_id}
    second_effects = [s for s in second if s.name == "tcc.effect"]
    assert {s.parent for s in second_effects} == {resumed.span_id}
    assert {s.attributes["tcc.idempotency_key"] for s in second_effects} >= {"o1:5", "o1:6"}
    assert any(s.attributes["tcc.effect"].endswith(":gate") for s in second_effects)
    assert [s for s in second if s.name == "tcc.checkpoint"]
    assert {s.resource.get("service.name") for s in first + second} == {SERVICE}
    assert "gzip" in receiver.encodings


def test_a_run_that_parks_exports_its_spans_before_tcc_run_exits(tmp_path, receiver):
    """``tcc run`` of a run that parks at an approval exits after flushing its spans; after
    the approval, the resume's run span links to the parked segment's."""
    cli = _cli(tmp_path, receiver, OTEL_BSP_SCHEDULE_DELAY=NEVER)
    parked = cli.run("run", "--run-id", "p1", f"{AGENT}:parks")
    assert parked.returncode == 0, parked.stderr
    assert cli.show("p1")["status"] == "waiting"
    (run_span,) = receiver.of("p1", "tcc.run")
    (effect,) = receiver.of("p1", "tcc.effect")
    assert effect.parent == run_span.span_id and effect.attributes["tcc.idempotency_key"] == "p1:1"
    assert run_span.resource["service.name"] == SERVICE
    assert _trace_events(cli, "p1") == [{"trace_id": run_span.trace_id, "span_id": run_span.span_id}]

    cli.run("approve", "p1", check=True)
    cli.run("resume", "p1", check=True)
    assert cli.show("p1")["status"] == "completed"
    first, second = receiver.of("p1", "tcc.run")
    assert first == run_span
    assert [(t, s) for t, s, _ in second.links] == [(run_span.trace_id, run_span.span_id)]


def test_a_run_stopped_by_sigterm_exports_its_run_span(tmp_path, receiver):
    """SIGTERM: the run stops after its current commit, ``main`` returns, and the spans --
    the run span included -- are flushed before the process leaves."""
    gate = tmp_path / "gate"
    cli = _cli(tmp_path, receiver, OTEL_BSP_SCHEDULE_DELAY=NEVER, GATE=str(gate))
    proc = cli.popen("run", "--run-id", "t1", AGENT)
    try:
        _wait("the gate effect to start", lambda: os.path.exists(f"{gate}.started"), proc)
        proc.send_signal(signal.SIGTERM)
        gate.touch()  # the effect in flight finishes and commits; then the run stops
        out, err = proc.communicate(timeout=120)
    finally:
        _stop(proc)
    assert proc.returncode >= 0, err  # it returned; no signal killed it
    assert cli.show("t1")["status"] != "completed"
    (run_span,) = receiver.of("t1", "tcc.run")
    effects = receiver.of("t1", "tcc.effect")
    assert sorted(s.attributes["tcc.idempotency_key"] for s in effects) == ["t1:1", "t1:2", "t1:3", "t1:4"]
    assert {s.parent for s in effects} == {run_span.span_id}
    assert run_span.resource["service.name"] == SERVICE


_IN_PROCESS = (
    "import sys\n"
    "{prelude}"
    "from tcc import runtime\n"
    "from tcc.store import open_store\n"
    "with open_store(sys.argv[1]) as store:\n"
    "    for run_id in ('q1', 'q2'):\n"
    "        out = runtime.start(store, sys.argv[2], [], run_id=run_id)\n"
    "        kinds = [e.kind for e in store.events(run_id)]\n"
    "        print(out.status, 'trace' in kinds)\n"
    "flushed = runtime.flush_tracing(timeout_ms=1000)\n"
    "print(flushed, 'opentelemetry.trace' in sys.modules)\n"
)


def _in_process(tmp_path: Any, env: dict[str, str], prelude: str = "") -> subprocess.CompletedProcess[str]:
    script = tmp_path / "agent.py"
    script.write_text("import tcc\n\n@tcc.effect\ndef one():\n    return 1\n\n"
                      "async def main():\n    return await one()\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.run(
        [sys.executable, "-c", _IN_PROCESS.format(prelude=prelude), str(tmp_path / "store"), str(script)],
        capture_output=True, text=True, env={**base, **env}, timeout=120,
    )


@pytest.mark.parametrize("off", [{"OTEL_TRACES_EXPORTER": "none"}, {"OTEL_SDK_DISABLED": "true"}])
def test_otel_variables_that_turn_tracing_off_configure_nothing(tmp_path, receiver, off):
    """With an endpoint set but OTEL_TRACES_EXPORTER=none (or OTEL_SDK_DISABLED=true), tcc
    sets up nothing and imports no OpenTelemetry; flush_tracing then costs nothing either."""
    proc = _in_process(tmp_path, {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, **off})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["completed", "False", "completed", "False", "True", "False"]
    assert proc.stderr == ""
    assert receiver.spans == []


def test_variables_alone_trace_a_library_run_too(tmp_path, receiver):
    """The set-up is in the runtime, not the CLI: runs started in-process are traced from the
    variables as well (one provider for the process), and flush_tracing exports them."""
    proc = _in_process(tmp_path, {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
                                  "OTEL_BSP_SCHEDULE_DELAY": NEVER})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["completed", "True", "completed", "True", "True", "True"]
    for run_id in ("q1", "q2"):
        (run_span,) = receiver.of(run_id, "tcc.run")
        assert run_span.resource["service.name"] == "tcc"  # the default when none is set
    assert len({s.resource["service.instance.id"] for s in receiver.spans}) == 1


def test_a_missing_exporter_warns_once_and_traces_nothing(tmp_path, receiver):
    """An OTLP endpoint set, but the exporter package not importable: one warning line naming
    the extra to install, and the runs go on untraced."""
    blocked = "sys.modules['opentelemetry.exporter.otlp.proto.http.trace_exporter'] = None\n"
    proc = _in_process(tmp_path, {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url}, prelude=blocked)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[:4] == ["completed", "False", "completed", "False"]
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("tcc: warning: ") and "pip install 'tcc[otel]'" in lines[0]
    assert receiver.spans == []
