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

No code is needed to send spans to a collector: when the application has not
configured a provider and the standard ``OTEL_*`` variables ask for traces
(``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, or
``OTEL_TRACES_EXPORTER=otlp|console``; ``none`` or ``OTEL_SDK_DISABLED=true``
turn that off), tcc sets up the SDK from them once per process: a
``TracerProvider`` whose resource comes from the environment (service name
``tcc`` unless one is set), batching spans to the OTLP exporter (http/protobuf,
or grpc when ``OTEL_EXPORTER_OTLP[_TRACES]_PROTOCOL=grpc``) or the console.
Whether to do so is decided from the environment alone, so a process without
those variables still imports nothing.  A process that exits with
``os._exit`` (the CLI) calls :func:`flush_tracing` first: batched spans are
otherwise lost.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import threading
from typing import Any, Iterator

_FROM_ENV_LOCK = threading.Lock()
_from_env_tried = False  # tcc has looked at the OTEL_* variables once (set up, or failed)


def _idle(otel: Any, provider: Any) -> bool:
    """Whether ``provider`` records nothing (the API's proxy or no-op provider)."""
    idle = tuple(t for t in (getattr(otel, "ProxyTracerProvider", None),
                             getattr(otel, "NoOpTracerProvider", None)) if isinstance(t, type))
    return isinstance(provider, idle)


def _configured() -> Any:
    """``opentelemetry.trace``, if tracing is configured in this process; else None.

    Configured means: by the application (a provider set before the run), by
    ``$OTEL_PYTHON_TRACER_PROVIDER``, or else by tcc from the ``OTEL_*``
    variables (:func:`_exporters_wanted`), at most once per process.
    """
    otel = sys.modules.get("opentelemetry.trace")
    if otel is None and os.environ.get("OTEL_PYTHON_TRACER_PROVIDER"):
        try:
            from opentelemetry import trace as otel
        except ImportError:  # pragma: no cover - the variable names a provider we cannot load
            otel = None
    if otel is not None and not _idle(otel, otel.get_tracer_provider()):
        return otel
    if _from_env_tried or not _exporters_wanted():
        return None
    otel = _configure_from_env()
    if otel is None or _idle(otel, otel.get_tracer_provider()):
        return None
    return otel


def _env(name: str) -> str:
    return os.environ.get(name, "").strip()


def _exporters_wanted() -> list[str]:
    """The span exporters the ``OTEL_*`` variables ask for (``otlp``, ``console``, or others
    tcc does not set up); none when they ask for nothing.  Reads only the environment.

    ``OTEL_TRACES_EXPORTER`` decides when set (``none`` is off); unset, an OTLP endpoint
    variable means ``otlp`` (the specification's default exporter, but only when asked for:
    a process with no such variable does not start sending to ``localhost:4318``).
    """
    if _env("OTEL_SDK_DISABLED").lower() == "true":
        return []
    names = [n.strip().lower() for n in _env("OTEL_TRACES_EXPORTER").split(",") if n.strip()]
    if names:
        return [] if "none" in names else list(dict.fromkeys(names))
    if _env("OTEL_EXPORTER_OTLP_ENDPOINT") or _env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return ["otlp"]
    return []


def _warn(message: str) -> None:
    """One ``tcc: warning:`` line on stderr (never an exception: tracing must not fail a run)."""
    try:
        print(f"tcc: warning: {message}", file=sys.stderr, flush=True)
    except Exception:  # noqa: BLE001 - a closed stderr
        pass


def _otlp_exporter() -> Any:
    """An OTLP span exporter as the variables describe it, or None (and a warning)."""
    protocol = (_env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or _env("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "http/protobuf").lower()
    if protocol == "grpc":
        package = "opentelemetry-exporter-otlp-proto-grpc"
        try:  # by name: an optional package that mypy may not find
            grpc = importlib.import_module("opentelemetry.exporter.otlp.proto.grpc.trace_exporter")
        except ImportError:
            _warn(f"OTEL_EXPORTER_OTLP_PROTOCOL is grpc but {package} is not installed; "
                  f"tcc sends no traces (pip install {package})")
            return None
        return grpc.OTLPSpanExporter()
    if protocol != "http/protobuf":
        _warn(f"OTLP protocol {protocol!r} is not supported; tcc sends traces as http/protobuf")
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http
    except ImportError:
        _warn("OTLP tracing is configured (OTEL_* variables) but the OTLP exporter is not "
              "installed; tcc sends no traces (pip install 'tcc[otel]')")
        return None
    return Http()


def _configure_from_env() -> Any:
    """Set up the SDK from the ``OTEL_*`` variables, once per process; ``opentelemetry.trace``
    if a provider is now set, else None.  Never raises: a tracing setup that fails warns
    once and the runs go on untraced."""
    global _from_env_tried
    with _FROM_ENV_LOCK:
        if _from_env_tried:
            return sys.modules.get("opentelemetry.trace")
        _from_env_tried = True
        try:
            return _set_up_sdk(_exporters_wanted())
        except Exception as exc:  # noqa: BLE001 - a bad variable, a broken install
            _warn(f"tracing from the OTEL_* variables is off: {type(exc).__name__}: {exc}")
            return None


def _set_up_sdk(wanted: list[str]) -> Any:
    try:
        from opentelemetry import trace as otel
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError:
        _warn("tracing is configured (OTEL_* variables) but the OpenTelemetry SDK is not "
              "installed; tcc sends no traces (pip install 'tcc[otel]')")
        return None
    if not _idle(otel, otel.get_tracer_provider()):  # set meanwhile, by another thread
        return otel
    exporters = []
    for name in wanted:
        if name == "otlp":
            exporter = _otlp_exporter()
            if exporter is not None:
                exporters.append(exporter)
        elif name == "console":
            exporters.append(ConsoleSpanExporter(out=sys.stderr))  # stdout is the result
        else:
            _warn(f"OTEL_TRACES_EXPORTER={name} is not one tcc sets up (otlp, console, none); "
                  "configure a tracer provider in the application to use it")
    if not exporters:
        return None
    resource = Resource.create()  # OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "tcc"}))
    provider = TracerProvider(resource=resource)  # OTEL_TRACES_SAMPLER, span limits
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))  # OTEL_BSP_*
    otel.set_tracer_provider(provider)
    return otel


def flush_tracing(timeout_ms: int = 5000) -> bool:
    """Export the spans the configured tracer provider still holds, waiting up to
    ``timeout_ms``; True if they went (or there was nothing to flush).

    For a process about to leave without running its ``atexit`` handlers (the CLI ends
    with ``os._exit``), where a batching processor's spans would be lost.  Never raises;
    a process that has not imported OpenTelemetry pays nothing and imports nothing.
    """
    otel = sys.modules.get("opentelemetry.trace")
    if otel is None:
        return True
    try:
        provider = otel.get_tracer_provider()
        flush = getattr(provider, "force_flush", None)
        if flush is None or _idle(otel, provider):
            return True
        # In a thread: an exporter retrying an unreachable collector may not honour the
        # timeout itself (the SDK's batch processor ignores it), and exit must not hang.
        done: list[bool] = []

        def _flush() -> None:
            try:
                done.append(bool(flush(timeout_ms)))
            except Exception:  # noqa: BLE001 - an exporter's failure is not ours to raise
                done.append(False)

        worker = threading.Thread(target=_flush, name="tcc-trace-flush", daemon=True)
        worker.start()
        worker.join(max(timeout_ms, 0) / 1000)
        return bool(done and done[0])
    except Exception:  # noqa: BLE001 - tracing must never fail the command
        return False


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
        with self._tracer.start_as_current_span(
            name, attributes={"tcc.run_id": self.run_id, **attributes}
        ) as span:
            yield span
