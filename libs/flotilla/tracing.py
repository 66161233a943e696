"""Traces: an incident as one OpenTelemetry trace across every service.

Every record carries a W3C ``ce_traceparent``. When tracing is on, the consumer loop opens
one span per handled record, parented by that traceparent, and the records the handler
emits carry *this* span as their parent (:func:`current_traceparent`), so the spans of
every service that touched an incident join into one trace. Slow calls inside a handler
(the executor's target, the LLM) are child spans (:func:`child_span`).

Configuration is OpenTelemetry's own: ``OTEL_TRACES_EXPORTER`` (``otlp`` over
HTTP/protobuf, ``console`` or ``none``), ``OTEL_EXPORTER_OTLP_ENDPOINT`` /
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``,
``OTEL_BSP_*``, ``OTEL_TRACES_SAMPLER``. One departure: with ``OTEL_TRACES_EXPORTER`` unset
tracing is **off** (the SDK would default to OTLP to localhost), so a local fleet with no
collector neither pays for spans nor logs export errors. When off, no span is made and
records get a fresh span id per hop, as before.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

    from flotilla.handling import Incoming

__all__ = [
    "TracingConfigError",
    "child_span",
    "configure",
    "current_traceparent",
    "disable",
    "enabled",
    "exporters_from_env",
    "handling_span",
    "install",
    "root_span",
    "set_outcome",
]

log = logging.getLogger(__name__)

TRACER = "flotilla"
EXPORTERS = ("otlp", "console", "none")
OUTCOME = "flotilla.outcome"  # what the loop did with the record: handled, stale, escalated, refused, …

_PROPAGATOR = TraceContextTextMapPropagator()
_enabled = False


class TracingConfigError(ValueError):
    """OTEL_* settings this runtime cannot honour; the message names the variable."""


def enabled() -> bool:
    """Whether this process records spans (``configure`` or ``install`` turned it on)."""
    return _enabled


def configure(service_name: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Turn tracing on from the ``OTEL_*`` variables; False (and nothing done) when off.

    Called once per process by the runner before any record is handled.
    """
    exporters = exporters_from_env(environ)
    if not exporters:
        return False
    install(_provider(service_name, environ), exporters)
    log.info("tracing on: %s", ", ".join(type(e).__name__ for e in exporters))
    return True


def exporters_from_env(environ: Mapping[str, str]) -> list[SpanExporter]:
    """The exporters the ``OTEL_*`` variables ask for; none when tracing is off."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    names = [n.strip().lower() for n in environ.get("OTEL_TRACES_EXPORTER", "none").split(",") if n.strip()]
    unknown = sorted(set(names) - set(EXPORTERS))
    if unknown:
        raise TracingConfigError(f"OTEL_TRACES_EXPORTER: {', '.join(unknown)} unsupported (one of {EXPORTERS})")
    return [_exporter(name, environ) for name in dict.fromkeys(names) if name != "none"]


def install(provider: TracerProvider, exporters: list[SpanExporter] | None = None, *, batch: bool = True) -> None:
    """Make ``provider`` this process's tracer provider, exporting to ``exporters``.

    OpenTelemetry allows one provider per process: a second call keeps the first one's
    provider (and says so). Tests pass an in-memory exporter with ``batch=False``.
    """
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    global _enabled
    for exporter in exporters or ():
        provider.add_span_processor(BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _enabled = True


def disable() -> None:
    """Stop making spans (the provider stays: OpenTelemetry cannot unset it). For tests."""
    global _enabled
    _enabled = False


def _provider(service_name: str, environ: Mapping[str, str]) -> TracerProvider:
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider

    # OTEL_SERVICE_NAME, when set, names the service (Resource.create reads it); else the member's name.
    attributes = {} if environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service_name}
    return TracerProvider(resource=Resource.create(attributes))


def _exporter(name: str, environ: Mapping[str, str]) -> SpanExporter:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    if protocol not in (None, "", "http/protobuf"):
        # grpc would add grpcio (tens of MB) to every service for no gain over HTTP
        raise TracingConfigError(f"OTLP protocol {protocol!r} unsupported: use http/protobuf (port 4318)")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()  # endpoint, headers, timeout: from OTEL_EXPORTER_OTLP_*


def _tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER)


@contextmanager
def handling_span(service: str, incoming: Incoming) -> Iterator[Span | None]:
    """The span of one handled record, parented by its traceparent; None when tracing is off.

    An exception leaving the block is recorded on the span (status error) and re-raised.
    """
    if not _enabled:
        yield None
        return
    parent = _PROPAGATOR.extract({"traceparent": incoming.envelope.traceparent})
    attributes: dict[str, Any] = {
        "flotilla.service": service,
        "flotilla.incident_id": incoming.envelope.correlationid,
        "flotilla.record_type": incoming.record_type,
        "cloudevents.event_id": incoming.envelope.id,
        "cloudevents.event_type": incoming.record_type,
        "messaging.system": "kafka",
        "messaging.destination.name": incoming.topic,
        "messaging.destination.partition.id": str(incoming.partition),
        "messaging.kafka.offset": incoming.offset,
    }
    with _tracer().start_as_current_span(
        f"{incoming.record_type} process", context=parent, kind=SpanKind.CONSUMER, attributes=attributes
    ) as span:
        yield span


@contextmanager
def child_span(name: str, attributes: Mapping[str, Any] | None = None) -> Iterator[Span | None]:
    """A span inside the current one (a target call, an LLM call); None when tracing is off."""
    if not _enabled:
        yield None
        return
    with _tracer().start_as_current_span(name, kind=SpanKind.CLIENT, attributes=dict(attributes or {})) as span:
        yield span


def set_outcome(span: Span | None, outcome: str) -> None:
    if span is not None:
        span.set_attribute(OUTCOME, outcome)


def current_traceparent(trace_id: str | None = None) -> str | None:
    """The W3C traceparent of the span being recorded, to parent what it causes.

    None when no span is recording, or when it belongs to another trace than ``trace_id``
    (a record must stay in its incident's trace).
    """
    if not _enabled:
        return None
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    if trace_id is not None and trace_id != f"{context.trace_id:032x}":
        return None
    return _traceparent(context)


def _traceparent(context: trace.SpanContext) -> str:
    """The W3C ``traceparent`` header of a span."""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


@contextmanager
def root_span(
    name: str, attributes: Mapping[str, Any] | None = None, *, parent: str | None = None
) -> Iterator[str | None]:
    """A producer span for a record emitted outside any handler (a scrape, a timer, a
    person); yields the traceparent the record must carry, None when tracing is off.

    With ``parent`` (the traceparent of the record it continues) the span joins that
    trace; without, it starts a new trace: the incident's.
    """
    if not _enabled:
        yield None
        return
    context = _PROPAGATOR.extract({"traceparent": parent}) if parent else None
    with _tracer().start_as_current_span(
        name, context=context, kind=SpanKind.PRODUCER, attributes=dict(attributes or {})
    ) as span:
        yield _traceparent(span.get_span_context())
