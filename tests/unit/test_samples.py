"""Sample records: valid by construction for every contract in schemas/."""

from __future__ import annotations

import io
import uuid
from typing import Any

import fastavro
import pytest
from fastavro.validation import validate
from flotilla_ops.samples import SERVICE_LATENCY_INCREASED, latency_fact, sample_value

from flotilla.contracts import Contract, load_contracts
from flotilla.envelope import Envelope

CONTRACTS = load_contracts()
BY_NAME = {c.full_name: c for c in CONTRACTS}


def _parsed(contract: Contract) -> Any:
    return fastavro.parse_schema(contract.schema, named_schemas={})


def test_there_are_contracts_to_sample() -> None:
    assert SERVICE_LATENCY_INCREASED in BY_NAME
    assert len(CONTRACTS) > 1


@pytest.mark.parametrize("contract", CONTRACTS, ids=lambda c: c.full_name)
def test_a_sample_of_every_contract_is_valid(contract: Contract) -> None:
    value = sample_value(contract.schema)
    assert validate(value, _parsed(contract), raise_errors=True)
    assert set(value) == {f["name"] for f in contract.schema["fields"]}  # type: ignore[attr-defined]


@pytest.mark.parametrize("contract", CONTRACTS, ids=lambda c: c.full_name)
def test_a_sample_survives_an_avro_round_trip(contract: Contract) -> None:
    parsed = _parsed(contract)
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, parsed, sample_value(contract.schema))
    buffer.seek(0)
    assert isinstance(fastavro.schemaless_reader(buffer, parsed), dict)


def test_overrides_are_applied() -> None:
    contract = BY_NAME[SERVICE_LATENCY_INCREASED]
    event_id = str(uuid.uuid4())
    value = sample_value(contract.schema, incidentId="incident-204", eventId=event_id, p95LatencyMs=2500.0)
    assert value["incidentId"] == "incident-204"
    assert value["eventId"] == event_id
    assert value["p95LatencyMs"] == 2500.0
    assert validate(value, _parsed(contract), raise_errors=True)


def test_an_override_can_make_a_sample_invalid() -> None:
    contract = BY_NAME[SERVICE_LATENCY_INCREASED]
    value = sample_value(contract.schema, p95LatencyMs="slow")
    assert value["p95LatencyMs"] == "slow"
    assert not validate(value, _parsed(contract), raise_errors=False)


def test_samples_fill_fields_by_type() -> None:
    schema = {
        "type": "record",
        "name": "Probe",
        "namespace": "dev.flotilla.tests",
        "fields": [
            {"name": "s", "type": "string"},
            {"name": "i", "type": "int"},
            {"name": "maybe", "type": ["null", "long"]},
            {"name": "nothing", "type": ["null"]},
            {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
            {"name": "color", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}},
            {"name": "again", "type": "Color"},
            {"name": "tags", "type": {"type": "array", "items": "string"}},
            {"name": "labels", "type": {"type": "map", "values": "int"}},
            {"name": "hash", "type": {"type": "fixed", "name": "Hash", "size": 4}},
        ],
    }
    value = sample_value(schema)
    assert value["s"] == "sample-s"
    assert value["i"] == 1
    assert value["maybe"] == 1
    assert value["nothing"] is None
    uuid.UUID(value["id"])
    assert value["color"] == value["again"] == "RED"
    assert value["tags"] == ["sample-tags"]
    assert value["labels"] == {"key": 1}
    assert value["hash"] == b"\0\0\0\0"
    assert validate(value, fastavro.parse_schema(schema, named_schemas={}), raise_errors=True)


def test_latency_fact_shares_its_event_id_with_the_envelope() -> None:
    value, envelope = latency_fact("incident-204")
    assert isinstance(envelope, Envelope)
    assert value["eventId"] == envelope.id
    assert uuid.UUID(envelope.id)
    assert envelope.type == SERVICE_LATENCY_INCREASED
    assert envelope.correlationid == value["incidentId"] == "incident-204"
    assert envelope.source == "/flotilla/health-agent"  # its one producer (flotilla.provenance)


def test_latency_fact_is_a_valid_record_with_the_given_parameters() -> None:
    value, envelope = latency_fact("incident-9", source="/agents/health", service="payments-api", p95_ms=900.0)
    assert value["service"] == "payments-api"
    assert value["p95LatencyMs"] == 900.0
    assert envelope.source == "/agents/health"
    assert value["observedAt"].microsecond == 0
    assert validate(value, _parsed(BY_NAME[SERVICE_LATENCY_INCREASED]), raise_errors=True)


def test_each_latency_fact_is_a_new_event() -> None:
    a, _ = latency_fact("incident-204")
    b, _ = latency_fact("incident-204")
    assert a["eventId"] != b["eventId"]


@pytest.mark.parametrize(
    "schema",
    [
        # a record referred to by its short name after its definition
        {
            "type": "record",
            "name": "A",
            "namespace": "x",
            "fields": [
                {
                    "name": "a",
                    "type": {"type": "record", "name": "B", "namespace": "x", "fields": [{"name": "n", "type": "int"}]},
                },
                {"name": "b", "type": "B"},
            ],
        },
        # a nested record without a namespace takes its parent's, and is referred to by full name
        {
            "type": "record",
            "name": "A",
            "namespace": "x",
            "fields": [
                {"name": "a", "type": {"type": "record", "name": "B", "fields": [{"name": "n", "type": "int"}]}},
                {"name": "b", "type": "x.B"},
            ],
        },
        # the same for an enum
        {
            "type": "record",
            "name": "A",
            "namespace": "x",
            "fields": [
                {"name": "a", "type": {"type": "enum", "name": "E", "symbols": ["P", "Q"]}},
                {"name": "b", "type": "x.E"},
            ],
        },
    ],
)
def test_named_types_resolve_by_short_and_inherited_full_names(schema: dict[str, Any]) -> None:
    value = sample_value(schema)
    assert validate(value, fastavro.parse_schema(schema), raise_errors=True)
