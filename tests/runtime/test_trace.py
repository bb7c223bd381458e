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


def test_without_a_configured_provider_tcc_does_not_even_import_opentelemetry(tmp_path):
    """A process that configured no tracing pays nothing for it: a run neither imports
    OpenTelemetry (an application that traces has imported it already) nor reads its
    events for links, and records no ``trace`` event."""
    import subprocess
    import sys

    script = tmp_path / "agent.py"
    script.write_text("import tcc\n\n@tcc.effect\ndef one():\n    return 1\n\n"
                      "async def main():\n    return await one()\n")
    code = (
        "import sys\n"
        "from tcc import runtime\n"
        "from tcc.store import open_store\n"
        f"with open_store({str(tmp_path / 'store')!r}) as store:\n"
        f"    out = runtime.start(store, {str(script)!r}, [], run_id='quiet')\n"
        "    kinds = [e.kind for e in store.events('quiet')]\n"
        "print(out.status, out.result, 'trace' in kinds, 'opentelemetry.trace' in sys.modules)\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("OTEL_")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["completed", "1", "False", "False"]
