"""The CloudEvents SDK check the integration and e2e tests rely on (tests/cloudevents_conformance.py),
on records built here: what the SDK accepts, and the records it must refuse — above all the
one Debezium's outbox router made of a root record before DropNullHeaders, with a
``ce_causationid`` header whose value is null."""

from __future__ import annotations

import pytest
from cloudevents.core.exceptions import CloudEventValidationError

from flotilla.envelope import CONTENT_TYPE, Envelope
from tests.support.messages import FakeMessage

from ..cloudevents_conformance import assert_conformant, decode, null_valued_headers, sdk_headers

PAYLOAD = b"\x00\x00\x00\x00\x07\x02\xc3\x28"  # a Confluent-framed Avro value: not JSON, not UTF-8

ROOT = Envelope(type="dev.flotilla.incidents.ServiceLatencyIncreased", source="/flotilla/health", correlationid="inc-1")
CAUSED = ROOT.caused("dev.flotilla.incidents.DiagnosisRequested", "/flotilla/health")


def _record(headers: list[tuple[str, bytes | None]], key: bytes | None = b"inc-1") -> FakeMessage:
    return FakeMessage(key=key, value=PAYLOAD, headers=headers)


def _as_router_sends(envelope: Envelope) -> list[tuple[str, bytes | None]]:
    """The headers as the outbox connector publishes them: Debezium's own ``id`` header too."""
    return [("id", envelope.id.encode()), *envelope.headers()]


def _with(headers: list[tuple[str, bytes | None]], name: str, value: bytes | None) -> list[tuple[str, bytes | None]]:
    return [(n, value if n == name else v) for n, v in headers]


def test_a_root_record_without_a_causation_header_is_read() -> None:
    event = assert_conformant(_record(_as_router_sends(ROOT)), caused_by=None)
    assert event.get_id() == ROOT.id
    assert event.get_datacontenttype() == CONTENT_TYPE == "application/avro"
    assert event.get_extension("partitionkey") == "inc-1"  # the SDK maps the record key to this extension
    assert "causationid" not in event.get_attributes()


def test_a_caused_record_carries_its_cause() -> None:
    event = assert_conformant(_record(_as_router_sends(CAUSED)), caused_by=ROOT.id)
    assert event.get_extension("causationid") == ROOT.id
    assert event.get_extension("hops") == str(ROOT.hops - 1)
    assert event.get_extension("traceparent") == CAUSED.traceparent


def test_the_payload_reaches_the_sdk_byte_for_byte() -> None:
    data = decode(_record(_as_router_sends(ROOT))).get_data()
    assert data == PAYLOAD


def test_the_router_s_null_causation_header_fails_the_sdk() -> None:
    # What the Outbox Event Router publishes for a NULL column, without DropNullHeaders.
    headers = [*_as_router_sends(ROOT), ("ce_causationid", None)]
    record = _record(headers)
    assert null_valued_headers(record.headers()) == ["ce_causationid"]
    with pytest.raises(AttributeError, match="'NoneType' object has no attribute 'decode'"):
        decode(record)
    with pytest.raises(AssertionError, match=r"header\(s\) without a value: \['ce_causationid'\]"):
        assert_conformant(record, caused_by=None)


def test_a_root_record_with_a_causation_is_refused() -> None:
    headers = [*_as_router_sends(ROOT), ("ce_causationid", b"someone-else")]
    with pytest.raises(AssertionError, match="a root record with a causationid"):
        assert_conformant(_record(headers), caused_by=None)


def test_a_caused_record_without_its_cause_is_refused() -> None:
    headers = [(n, v) for n, v in _as_router_sends(CAUSED) if n != "ce_causationid"]
    with pytest.raises(AssertionError, match="causationid"):
        assert_conformant(_record(headers), caused_by=ROOT.id)


def test_a_wrong_cause_is_refused() -> None:
    with pytest.raises(AssertionError, match="causationid"):
        assert_conformant(_record(_as_router_sends(CAUSED)), caused_by="another-record")


def test_a_repeated_header_is_refused_before_the_sdk_hides_it() -> None:
    headers = [*_as_router_sends(ROOT), ("ce_hops", b"99")]
    with pytest.raises(ValueError, match="repeated on one record: ce_hops"):
        sdk_headers(headers)


@pytest.mark.parametrize("missing", ["ce_correlationid", "ce_hops", "ce_traceparent"])
def test_a_missing_extension_is_refused(missing: str) -> None:
    headers = [(n, v) for n, v in _as_router_sends(ROOT) if n != missing]
    with pytest.raises((AssertionError, ValueError), match=missing.removeprefix("ce_")):
        assert_conformant(_record(headers), caused_by=None)


def test_an_empty_extension_is_refused() -> None:
    with pytest.raises(AssertionError, match="extension traceparent missing or empty"):
        assert_conformant(_record(_with(_as_router_sends(ROOT), "ce_traceparent", b"")), caused_by=None)


def test_a_time_without_a_zone_is_refused_by_the_sdk() -> None:
    with pytest.raises(CloudEventValidationError, match="timezone aware"):
        decode(_record(_with(_as_router_sends(ROOT), "ce_time", b"2026-01-02T03:04:05.678")))


def test_a_time_that_is_not_rfc3339_is_refused_by_the_sdk() -> None:
    with pytest.raises(ValueError):
        decode(_record(_with(_as_router_sends(ROOT), "ce_time", b"yesterday")))


def test_a_wrong_content_type_is_refused() -> None:
    with pytest.raises(AssertionError):
        assert_conformant(_record(_with(_as_router_sends(ROOT), "content-type", b"application/json")), caused_by=None)


def test_an_extension_name_the_spec_forbids_is_refused_by_the_sdk() -> None:
    # CloudEvents extension names are [a-z0-9]+; the SDK lower-cases header names first.
    headers = [*_as_router_sends(ROOT), ("ce_trace_id", b"x")]
    with pytest.raises(CloudEventValidationError, match="trace_id"):
        decode(_record(headers))


def test_a_missing_required_attribute_is_refused_by_the_sdk() -> None:
    headers = [(n, v) for n, v in _as_router_sends(ROOT) if n != "ce_source"]
    with pytest.raises((CloudEventValidationError, ValueError), match="source"):
        decode(_record(headers))
