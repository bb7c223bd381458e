"""OpenTelemetry spans for runs, effects and checkpoints (optional: ``tcc[otel]``).

With a tracer provider configured by the application (or named by
``$OTEL_PYTHON_TRACER_PROVIDER``), every drive of a run emits a ``tcc.run``
span with ``tcc.effect`` and ``tcc.checkpoint`` children.  The run span's
context is stored as a ``trace`` event; a resumed segment starts a new span
*linked* to the previous segment's, so a run that crashed and resumed reads as
one story.  Otherwise every call is a no-op, and costs nothing: tcc does not
import OpenTelemetry itself (an application that configures tracing has
imported it), and with only the API's default provider, which records nothing,
it neither reads the run's events for links nor writes a ``trace`` event.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Iterator


def _configured() -> Any:
    """``opentelemetry.trace``, if tracing is configured in this process; else None."""
    otel = sys.modules.get("opentelemetry.trace")
    if otel is None and os.environ.get("OTEL_PYTHON_TRACER_PROVIDER"):
        try:
            from opentelemetry import trace as otel
        except ImportError:  # pragma: no cover - the variable names a provider we cannot load
            return None
    if otel is None:
        return None
    provider = otel.get_tracer_provider()
    idle = tuple(t for t in (getattr(otel, "ProxyTracerProvider", None),
                             getattr(otel, "NoOpTracerProvider", None)) if isinstance(t, type))
    return None if isinstance(provider, idle) else otel


class Tracer:
    """The driver's view of tracing: no-ops unless OpenTelemetry is present."""

    def __init__(self, store: Any, run_id: str) -> None:
        self.store = store
        self.run_id = run_id
        otel = self._otel = _configured()
        self.enabled = otel is not None
        self._tracer = otel.get_tracer("tcc") if otel is not None else None
        self._run_span: Any = None

    def _previous_links(self) -> list[Any]:
        _otel = self._otel
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
        assert self._tracer is not None and self._otel is not None
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
