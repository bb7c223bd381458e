"""OpenTelemetry: spans for the run, each effect and each checkpoint; resumes link back."""

from __future__ import annotations

import pytest

otel_sdk = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from tests._support.runs import AGENTS  # noqa: E402

EXPORTER = InMemorySpanExporter()
PROVIDER = otel_sdk.TracerProvider()
PROVIDER.add_span_processor(SimpleSpanProcessor(EXPORTER))
trace.set_tracer_provider(PROVIDER)


def test_run_effect_and_checkpoint_spans_and_resume_link(tmp_path):
    """A run emits run/effect/checkpoint spans; the resumed segment links to the first."""
    from tcc import runtime
    from tcc.store import open_store

    EXPORTER.clear()
    agent = str(AGENTS / "wait_agent.py")
    with open_store(tmp_path / "store") as store:
        parked = runtime.start(store, f"{agent}:gated", [], run_id="tr")
        assert parked.status == "waiting"
        store.send_signal("tr", "approval@1", b'{"approved": true}')
        done = runtime.resume(store, "tr")
        assert done.status == "completed"
    spans = EXPORTER.get_finished_spans()
    names = [s.name for s in spans]
    assert names.count("tcc.run") == 2
    assert names.count("tcc.effect") == 2
    assert names.count("tcc.checkpoint") >= 2
    effect = next(s for s in spans if s.name == "tcc.effect")
    assert effect.attributes["tcc.idempotency_key"] == "tr:1"
    checkpoint = next(s for s in spans if s.name == "tcc.checkpoint")
    assert checkpoint.attributes["tcc.bytes"] > 0
    first, second = [s for s in spans if s.name == "tcc.run"]
    assert len(second.links) == 1
    assert second.links[0].context.trace_id == first.context.trace_id
    assert second.links[0].context.span_id == first.context.span_id
