"""Outbox.row refuses a record over the configured maximum, naming type, topic, size and
limit, before anything is inserted (security review 3, H2). The same on real PostgreSQL,
with the transaction rolled back: tests/integration/test_outbox_record_size.py."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flotilla.bounds import DEFAULT_MAX_RECORD_BYTES, KAFKA_MAX_REQUEST_BYTES
from flotilla.envelope import Envelope
from flotilla.escalations import escalation
from flotilla.outbox import COLUMNS, HEADER_COLUMNS, Outbox, RecordTooLargeError, record_bytes
from flotilla.settings import ServiceSettings


class _Serde:
    """Serializes to a payload of a chosen size (the serde's own work is tested elsewhere)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def serialize(self, topic: str, record: str, value: dict[str, Any]) -> bytes:
        return b"x" * self.size


ENVELOPE = Envelope(
    type="dev.flotilla.incidents.IncidentEscalated", source="/flotilla/health-agent", correlationid="i-1"
)


def _row(outbox: Outbox) -> tuple[Any, ...]:
    return outbox.row(escalation("i-1", "test", cause=ENVELOPE), ENVELOPE, key="production/checkout-api")


def test_the_size_is_the_payload_key_and_every_header_kafka_carries() -> None:
    row = _row(Outbox(_Serde(1000)))  # type: ignore[arg-type]
    columns = dict(zip(COLUMNS, row, strict=True))
    assert columns["ce_causationid"] is None  # a root record: no such header, it weighs nothing
    headers = {name: columns[column] for column, name in HEADER_COLUMNS.items() if columns[column] is not None}
    expected = 1000 + len(b"production/checkout-api") + sum(len(k) + len(str(v).encode()) for k, v in headers.items())
    assert record_bytes(row) == expected


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=0, max_value=4096), st.integers(min_value=256, max_value=4096))
def test_a_record_is_made_exactly_when_it_fits(payload: int, limit: int) -> None:
    outbox = Outbox(_Serde(payload), max_record_bytes=limit)  # type: ignore[arg-type]
    fits = _row(Outbox(_Serde(payload)))  # type: ignore[arg-type]
    if record_bytes(fits) <= limit:
        assert _row(outbox) == fits
    else:
        with pytest.raises(RecordTooLargeError) as refused:
            _row(outbox)
        assert (refused.value.size, refused.value.limit) == (record_bytes(fits), limit)


def test_the_error_names_type_topic_size_and_limit() -> None:
    with pytest.raises(RecordTooLargeError) as refused:
        _row(Outbox(_Serde(1_100_000)))  # type: ignore[arg-type]
    message = str(refused.value)
    assert "IncidentEscalated" in message and "incidents" in message
    assert str(DEFAULT_MAX_RECORD_BYTES) in message and str(refused.value.size) in message
    assert refused.value.size > 1_100_000


def test_the_limit_is_a_setting_below_kafkas(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ServiceSettings().outbox_max_record_bytes == DEFAULT_MAX_RECORD_BYTES < KAFKA_MAX_REQUEST_BYTES
    monkeypatch.setenv("FLOTILLA_OUTBOX_MAX_RECORD_BYTES", "2048")
    assert ServiceSettings().outbox_max_record_bytes == 2048
    monkeypatch.setenv("FLOTILLA_OUTBOX_MAX_RECORD_BYTES", str(KAFKA_MAX_REQUEST_BYTES))
    with pytest.raises(ValueError, match="outbox_max_record_bytes"):
        ServiceSettings()
    with pytest.raises(ValueError):
        Outbox(_Serde(1), max_record_bytes=0)  # type: ignore[arg-type]
