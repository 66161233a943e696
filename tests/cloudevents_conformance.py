"""Reading our Kafka records with the official CloudEvents SDK, as a foreign consumer would.

Used by the integration test of the outbox path and the end-to-end test of a whole
incident. Two readers of the SDK (``cloudevents`` 2.x) decode every record:

* ``cloudevents.core.bindings.kafka.from_binary`` — the SDK's current binding, which
  validates: required attributes present and non-empty, ``specversion`` 1.0, ``time``
  parsed as RFC 3339 and timezone-aware, extension names ``[a-z0-9]+``;
* ``cloudevents.v1.kafka.from_binary`` — the 1.x API (``cloudevents.kafka`` before 2.0),
  which validates nothing beyond the required attributes.

Both turn every header value into text with ``bytes.decode``: a header without a value
(what Debezium's outbox router makes of a NULL column) fails them with AttributeError.
The SDK reads headers into a dict, so a repeated header name would silently keep only
one value; it is refused here before the SDK sees it.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Any, Protocol

from cloudevents.core.bindings import kafka as ce_kafka
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent
from cloudevents.v1 import kafka as ce_kafka_v1

from flotilla.envelope import CONTENT_TYPE, Envelope, RawHeaders, header_pairs

# Our extension attributes: on every record, and causationid exactly on a caused one.
EXTENSIONS = ("correlationid", "hops", "traceparent")
CAUSATION = "causationid"


class Record(Protocol):
    """What is read of a polled record (a confluent_kafka Message, or tests.support's FakeMessage)."""

    def headers(self) -> Any: ...
    def key(self) -> bytes | None: ...
    def value(self) -> bytes | None: ...


def null_valued_headers(headers: RawHeaders) -> list[str]:
    """The names of the headers that carry no value at all (not even an empty one)."""
    return [name for name, value in header_pairs(headers) if value is None]


def sdk_headers(headers: RawHeaders) -> dict[str, bytes | None]:
    """Headers as the SDK's KafkaMessage holds them; a repeated name is refused (a dict would
    hide it). A header without a value is passed on as None, for the SDK to refuse."""
    pairs = list(header_pairs(headers))
    repeated = sorted(name for name, count in Counter(name for name, _ in pairs).items() if count > 1)
    if repeated:
        raise ValueError(f"header(s) repeated on one record: {', '.join(repeated)}")
    return dict(pairs)


def decode(msg: Record) -> CloudEvent:
    """The record through both SDK readers; returns the validating reader's event."""
    headers: Any = sdk_headers(msg.headers())  # KafkaMessage declares bytes values; a None is the case under test
    value = msg.value() or b""
    event = ce_kafka.from_binary(ce_kafka.KafkaMessage(headers, msg.key(), value), JSONFormat(), CloudEvent)
    legacy = ce_kafka_v1.from_binary(ce_kafka_v1.KafkaMessage(headers, msg.key(), value), data_unmarshaller=bytes)
    if legacy["id"] != event.get_id() or legacy.get_data() != value:
        raise AssertionError(f"the two SDK readers disagree on record {event.get_id()}")
    assert isinstance(event, CloudEvent)
    return event


def assert_conformant(msg: Record, *, caused_by: str | None) -> CloudEvent:
    """Fail unless the record is a CloudEvent the SDK reads, with our attributes exactly.

    No header without a value; the envelope the services read and the event the SDK reads
    agree; ``datacontenttype`` is ours; every extension is present and non-empty; and
    ``causationid`` is ``caused_by`` — the id of the record's cause, which the caller
    knows — and absent when that is None (a root record).
    """
    nulls = null_valued_headers(msg.headers())
    assert not nulls, f"header(s) without a value: {nulls}"
    envelope = Envelope.from_headers(msg.headers())
    event = decode(msg)
    assert event.get_specversion() == "1.0"
    assert (event.get_id(), event.get_type(), event.get_source()) == (envelope.id, envelope.type, envelope.source)
    assert event.get_datacontenttype() == CONTENT_TYPE
    time = event.get_time()
    assert isinstance(time, datetime) and time.tzinfo is not None
    attributes = event.get_attributes()
    for name in EXTENSIONS:
        assert attributes.get(name), f"{envelope.type} {envelope.id}: extension {name} missing or empty"
    assert event.get_extension("correlationid") == envelope.correlationid
    assert event.get_extension("hops") == str(envelope.hops)
    if caused_by is None:
        assert CAUSATION not in attributes, f"{envelope.type} {envelope.id}: a root record with a causationid"
    else:
        assert event.get_extension(CAUSATION) == caused_by, f"{envelope.type} {envelope.id}: causationid"
    assert envelope.causationid == caused_by
    return event
