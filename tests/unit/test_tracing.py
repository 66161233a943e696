"""flotilla.tracing: OTEL_* settings, spans parented by a record's traceparent, and the
traceparent a caused record carries."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from flotilla import tracing
from flotilla.envelope import Envelope, child_traceparent
from flotilla.handling import Incoming

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
_EXPORTER = InMemorySpanExporter()


@pytest.fixture()
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on for one test, into memory (one provider per process: installed once)."""
    if not isinstance(getattr(tracing.trace, "_TRACER_PROVIDER", None), TracerProvider):
        tracing.install(TracerProvider(), [_EXPORTER], batch=False)
    else:
        tracing._enabled = True  # the provider of an earlier test is still this process's
    _EXPORTER.clear()
    yield _EXPORTER
    tracing.disable()
    _EXPORTER.clear()


def _incoming(traceparent: str = PARENT) -> Incoming:
    envelope = Envelope(
        type="dev.flotilla.incidents.DiagnosisRequested",
        source="/flotilla/health-agent",
        correlationid="incident-7",
        traceparent=traceparent,
    )
    return Incoming("incidents", 2, 41, "checkout", envelope, envelope.type, {})


# ----------------------------------------------------------------------------- settings


def test_tracing_is_off_unless_an_exporter_is_named() -> None:
    assert tracing.exporters_from_env({}) == []
    assert tracing.exporters_from_env({"OTEL_TRACES_EXPORTER": "none"}) == []
    assert tracing.exporters_from_env({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}) == []
    assert tracing.configure("executor", {}) is False
    assert not tracing.enabled()


def test_the_exporters_named_are_built() -> None:
    (otlp,) = tracing.exporters_from_env({"OTEL_TRACES_EXPORTER": "otlp"})
    assert isinstance(otlp, OTLPSpanExporter)
    both = tracing.exporters_from_env({"OTEL_TRACES_EXPORTER": "otlp, console,otlp"})
    assert [type(e) for e in both] == [OTLPSpanExporter, ConsoleSpanExporter]


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({"OTEL_TRACES_EXPORTER": "jaeger"}, "OTEL_TRACES_EXPORTER"),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "grpc"),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"}, "http/json"),
    ],
)
def test_settings_it_cannot_honour_are_refused_by_name(environ: dict[str, str], named: str) -> None:
    with pytest.raises(tracing.TracingConfigError, match=named):
        tracing.exporters_from_env(environ)


# ----------------------------------------------------------------------------- spans


def test_with_tracing_off_no_span_is_made_and_hops_get_fresh_span_ids() -> None:
    with tracing.handling_span("diagnostic-agent", _incoming()) as span:
        assert span is None
        assert tracing.current_traceparent() is None
        child = child_traceparent(PARENT)
    assert child.split("-")[1] == PARENT.split("-")[1] and child != PARENT


def test_a_handled_record_is_a_consumer_span_parented_by_its_traceparent(spans: InMemorySpanExporter) -> None:
    with tracing.handling_span("diagnostic-agent", _incoming()) as span:
        tracing.set_outcome(span, "handled")
        caused = child_traceparent(PARENT)
    (finished,) = spans.get_finished_spans()
    assert finished.kind is SpanKind.CONSUMER
    assert f"{finished.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    assert finished.parent is not None and f"{finished.parent.span_id:016x}" == "b7ad6b7169203331"
    assert finished.attributes is not None
    assert finished.attributes["flotilla.incident_id"] == "incident-7"
    assert finished.attributes["flotilla.record_type"] == "dev.flotilla.incidents.DiagnosisRequested"
    assert finished.attributes["flotilla.outcome"] == "handled"
    assert finished.attributes["messaging.destination.name"] == "incidents"
    # what the handler emits is parented by this span
    flags = int(finished.context.trace_flags)
    assert caused == f"00-{finished.context.trace_id:032x}-{finished.context.span_id:016x}-{flags:02x}"


def test_a_record_of_another_trace_is_not_parented_by_the_current_span(spans: InMemorySpanExporter) -> None:
    other = "00-11111111111111111111111111111111-2222222222222222-01"
    with tracing.handling_span("policy-service", _incoming()):
        caused = child_traceparent(other)
    assert caused.split("-")[1] == "1" * 32 and caused.split("-")[2] != "2" * 16


def test_an_invalid_traceparent_starts_a_new_trace(spans: InMemorySpanExporter) -> None:
    with tracing.handling_span("policy-service", _incoming("not-a-traceparent")):
        pass
    (finished,) = spans.get_finished_spans()
    assert finished.parent is None


def test_a_failing_handler_leaves_an_error_span(spans: InMemorySpanExporter) -> None:
    with pytest.raises(RuntimeError), tracing.handling_span("executor", _incoming()):
        raise RuntimeError("target down")
    (finished,) = spans.get_finished_spans()
    assert finished.status.status_code is StatusCode.ERROR
    assert [e.name for e in finished.events] == ["exception"]


def test_child_spans_nest_under_the_handling_span(spans: InMemorySpanExporter) -> None:
    with tracing.handling_span("executor", _incoming()), tracing.child_span("target ScaleService", {"a": 1}):
        pass
    child, parent = spans.get_finished_spans()
    assert child.parent is not None and child.parent.span_id == parent.context.span_id
    assert child.kind is SpanKind.CLIENT


def test_a_root_span_starts_a_trace_and_yields_the_traceparent_to_carry(spans: InMemorySpanExporter) -> None:
    with tracing.root_span("IncidentDetected publish") as traceparent:
        assert traceparent is not None
    (finished,) = spans.get_finished_spans()
    assert finished.parent is None and finished.kind is SpanKind.PRODUCER
    flags = int(finished.context.trace_flags)
    assert flags & 0x01  # sampled
    assert traceparent == f"00-{finished.context.trace_id:032x}-{finished.context.span_id:016x}-{flags:02x}"
    with tracing.root_span("RecoveryApproved publish", parent=PARENT) as continued:
        assert continued is not None and continued.split("-")[1] == PARENT.split("-")[1]
