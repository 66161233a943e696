"""The typed records (``flotilla.records``): generated from ``schemas/``, current, and
faithful — a value read into its class and written back reads the same."""

from __future__ import annotations

import io
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.utils import generate_many
from flotilla_ops import genrecords

from flotilla import records
from flotilla.contracts import load_contracts
from flotilla.envelope import Envelope
from flotilla.handling import Incoming
from flotilla.typedrecord import avro_name, millis

CONTRACTS = load_contracts()


def test_the_generated_module_is_current() -> None:
    assert genrecords.main(["--check"]) == 0, "run: python -m flotilla_ops.genrecords"


def test_a_schema_change_makes_it_stale() -> None:
    [first, *rest] = CONTRACTS
    fields = [*first.schema["fields"], {"name": "addedLater", "type": ["null", "string"], "default": None}]  # type: ignore[misc]
    changed = replace(first, schema={**first.schema, "fields": fields})
    assert "added_later: str | None = None" in genrecords.render([changed, *rest])
    assert genrecords.render([changed, *rest]) != genrecords.render(CONTRACTS)


def test_every_published_record_has_its_class() -> None:
    assert set(records.BY_TYPE) == {c.full_name for c in CONTRACTS}
    for contract in CONTRACTS:
        assert contract.topic == records.BY_TYPE[contract.full_name].TOPIC


@pytest.mark.parametrize("contract", CONTRACTS, ids=lambda c: c.full_name.rsplit(".", 1)[-1])
def test_a_value_read_into_its_class_and_written_back_reads_the_same(contract) -> None:  # type: ignore[no-untyped-def]
    parsed = parse_schema(contract.schema)
    record_class = records.BY_TYPE[contract.full_name]

    def round_trip(value: object) -> object:
        written = io.BytesIO()
        schemaless_writer(written, parsed, value)
        return schemaless_reader(io.BytesIO(written.getvalue()), parsed, None)

    for sample in generate_many(contract.schema, 25):
        decoded = round_trip(sample)
        assert round_trip(record_class.from_value(decoded).to_value()) == decoded  # type: ignore[arg-type]


def test_fields_are_snake_case_attributes_of_the_avro_names() -> None:
    assert avro_name("incident_id") == "incidentId"
    assert avro_name("p95_latency_ms") == "p95LatencyMs"
    escalated = records.IncidentEscalated(
        incident_id="incident-1",
        reason="r",
        cause_event_id="c",
        cause_type="t",
        escalated_to="on-call",
        escalated_at=datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=UTC),
    )
    value = escalated.to_value()
    assert "eventId" not in value  # left for emit to fill in
    assert value["escalatedAt"] == datetime(2026, 1, 1, 12, 0, 0, 123000, tzinfo=UTC)
    assert millis(value["escalatedAt"]) == value["escalatedAt"]


def test_a_handler_reading_the_wrong_type_is_told_so() -> None:
    envelope = Envelope(type=records.RecoveryFailed.TYPE, source="/t", correlationid="incident-1")
    incoming = Incoming("incidents", 0, 0, "incident-1", envelope, envelope.type, {})
    with pytest.raises(TypeError, match=r"RecoveryFailed record read as .*RecoveryCompleted"):
        incoming.typed(records.RecoveryCompleted)
