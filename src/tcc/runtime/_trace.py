"""OpenTelemetry spans for runs, effects and checkpoints (optional: ``tcc[otel]``).

With ``opentelemetry-api`` importable and a tracer provider configured by the
application (or the SDK's environment variables), every drive of a run emits
a ``tcc.run`` span with ``tcc.effect`` and ``tcc.checkpoint`` children.  The
run span's context is stored as a ``trace`` event; a resumed segment starts
a new span *linked* to the previous segment's, so a run that crashed and
resumed reads as one story.  Without OpenTelemetry every call is a no-op.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

try:  # optional dependency
    from opentelemetry import trace as _otel
except ImportError:  # pragma: no cover - exercised where otel is missing
    _otel = None  # type: ignore[assignment]


class Tracer:
    """The driver's view of tracing: no-ops unless OpenTelemetry is present."""

    def __init__(self, store: Any, run_id: str) -> None:
        self.store = store
        self.run_id = run_id
        self.enabled = _otel is not None
        self._tracer = _otel.get_tracer("tcc") if _otel is not None else None
        self._run_span: Any = None

    def _previous_links(self) -> list[Any]:
        assert _otel is not None
        links = []
        for event in self.store.events(self.run_id):
            if event.kind == "trace":
                data = dict(event.data)
                ctx = _otel.SpanContext(
                    trace_id=int(data["trace_id"], 16), span_id=int(data["span_id"], 16),
                    is_remote=True, trace_flags=_otel.TraceFlags(_otel.TraceFlags.SAMPLED),
                )
                links.append(_otel.Link(ctx, {"tcc.relation": "resumed_from"}))
        return links[-1:]

    @contextlib.contextmanager
    def run(self, attributes: dict[str, Any]) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        assert self._tracer is not None and _otel is not None
        links = self._previous_links()
        with self._tracer.start_as_current_span(
            "tcc.run", attributes={"tcc.run_id": self.run_id, **attributes}, links=links
        ) as span:
            self._run_span = span
            ctx = span.get_span_context()
            if ctx.is_valid:
                self.store.add_event(self.run_id, "trace", {
                    "trace_id": format(ctx.trace_id, "032x"), "span_id": format(ctx.span_id, "016x"),
                })
            yield

    @contextlib.contextmanager
    def span(self, name: str, attributes: dict[str, Any]) -> Iterator[Any]:
        if not self.enabled:
            yield None
            return
        assert self._tracer is not None
        with self._tracer.start_as_current_span(name, attributes=attributes) as span:
            yield span
