"""Strict record validation against the real contract, every problem at once."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastavro import parse_schema

from flotilla.validation import RecordValidator, type_label

REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMA_FILE = REPO_ROOT / "schemas" / "incidents" / "ServiceLatencyIncreased.avsc"


@pytest.fixture(scope="module")
def validator() -> RecordValidator:
    return RecordValidator(parse_schema(json.loads(SCHEMA_FILE.read_text())))


def _valid(**overrides: Any) -> dict[str, Any]:
    value: dict[str, Any] = {
        "eventId": str(uuid.uuid4()),
        "incidentId": "incident-204",
        "service": "checkout-api",
        "environment": "staging",
        "p95LatencyMs": 812.5,
        "thresholdMs": 500.0,
        "windowSeconds": 300,
        "observedAt": datetime(2024, 5, 1, 12, 0, tzinfo=UTC),
    }
    value.update(overrides)
    return value


def test_validator_is_named_after_the_record(validator: RecordValidator) -> None:
    assert validator.name == "dev.flotilla.incidents.ServiceLatencyIncreased"


def test_a_valid_value_has_no_problems(validator: RecordValidator) -> None:
    assert validator.problems(_valid()) == []
    # Numeric widening Avro allows: an int for a double, epoch millis for a timestamp.
    assert validator.problems(_valid(p95LatencyMs=900, observedAt=1_714_564_800_000)) == []


@pytest.mark.parametrize(
    ("field", "label"),
    [
        ("eventId", "string (uuid)"),
        ("incidentId", "string"),
        ("service", "string"),
        ("p95LatencyMs", "double"),
        ("thresholdMs", "double"),
        ("windowSeconds", "int"),
        ("observedAt", "long (timestamp-millis)"),
    ],
)
def test_a_missing_required_field_is_named_with_its_type(validator: RecordValidator, field: str, label: str) -> None:
    value = _valid()
    del value[field]
    assert validator.problems(value) == [f"field '{field}' is missing (expected {label})"]


def test_a_field_with_a_default_may_be_omitted(validator: RecordValidator) -> None:
    value = _valid()
    del value["environment"]
    assert validator.problems(value) == []


@pytest.mark.parametrize(
    ("field", "given", "expected", "shown"),
    [
        ("windowSeconds", "300", "int", "str '300'"),
        ("windowSeconds", 2**31, "int", f"int {2**31}"),
        ("windowSeconds", True, "int", "bool True"),
        ("p95LatencyMs", "fast", "double", "str 'fast'"),
        ("service", None, "string", "NoneType None"),
        ("observedAt", "yesterday", "long (timestamp-millis)", "str 'yesterday'"),
        ("environment", 3, "string", "int 3"),
    ],
)
def test_a_wrong_type_names_expected_and_given(
    validator: RecordValidator, field: str, given: Any, expected: str, shown: str
) -> None:
    problems = validator.problems(_valid(**{field: given}))
    assert problems == [f"field '{field}': expected {expected}, got {shown}"]


def test_a_long_given_value_is_shortened(validator: RecordValidator) -> None:
    (problem,) = validator.problems(_valid(windowSeconds="x" * 500))
    assert problem.startswith("field 'windowSeconds': expected int, got str 'xxx")
    assert problem.endswith("...")
    assert len(problem) < 120


def test_an_extra_field_is_reported(validator: RecordValidator) -> None:
    assert validator.problems(_valid(severity="high")) == ["field 'severity' is not in the schema"]


@pytest.mark.parametrize(
    "not_a_uuid",
    [
        "incident-204",
        "",
        "6f1c1b52-8a55-4d55-9c69-5e0f4b1e2a1",
        # forms Python's uuid.UUID accepts but other consumers (Java) do not
        "6f1c1b528a554d559c695e0f4b1e2a10",
        "{6f1c1b52-8a55-4d55-9c69-5e0f4b1e2a10}",
        "urn:uuid:6f1c1b52-8a55-4d55-9c69-5e0f4b1e2a10",
    ],
)
def test_a_non_uuid_string_in_a_uuid_field_is_reported(validator: RecordValidator, not_a_uuid: str) -> None:
    assert validator.problems(_valid(eventId=not_a_uuid)) == [
        "field 'eventId': expected string (uuid), got a string that is not a UUID"
    ]


def test_a_uuid_field_still_checks_the_base_type(validator: RecordValidator) -> None:
    (problem,) = validator.problems(_valid(eventId=42))
    assert problem == "field 'eventId': expected string (uuid), got int 42"


def test_every_problem_is_reported_at_once(validator: RecordValidator) -> None:
    value = _valid(eventId="nope", windowSeconds="300", extra=1, another=2)
    del value["service"]
    del value["observedAt"]
    problems = validator.problems(value)
    assert problems == [
        "field 'eventId': expected string (uuid), got a string that is not a UUID",
        "field 'service' is missing (expected string)",
        "field 'windowSeconds': expected int, got str '300'",
        "field 'observedAt' is missing (expected long (timestamp-millis))",
        "field 'another' is not in the schema",
        "field 'extra' is not in the schema",
    ]


def test_an_empty_mapping_names_every_required_field(validator: RecordValidator) -> None:
    problems = validator.problems({})
    assert len(problems) == 7
    assert all("is missing" in p for p in problems)
    assert not any("'environment'" in p for p in problems)


@pytest.mark.parametrize("value", [None, [], "a record", 7, [("eventId", "x")]])
def test_a_non_mapping_is_reported(validator: RecordValidator, value: Any) -> None:
    assert validator.problems(value) == [
        f"expected a record ServiceLatencyIncreased (a mapping), got {type(value).__name__}"
    ]


def test_nested_named_types_are_validated_and_labelled() -> None:
    schema = {
        "type": "record",
        "name": "Outer",
        "namespace": "ns",
        "fields": [
            {"name": "inner", "type": {"type": "record", "name": "Inner", "fields": [{"name": "x", "type": "int"}]}},
            {"name": "severity", "type": {"type": "enum", "name": "Severity", "symbols": ["LOW", "HIGH"]}},
            {"name": "note", "type": ["null", "string"], "default": None},
        ],
    }
    validator = RecordValidator(parse_schema(schema))
    assert validator.problems({"inner": {"x": 1}, "severity": "LOW"}) == []
    assert validator.problems({"inner": {"x": 1}, "severity": "HIGH", "note": "n"}) == []
    problems = validator.problems({"inner": {"x": "1"}, "severity": "MID", "note": 3})
    assert len(problems) == 3
    assert problems[0].startswith("field 'inner' at ns.Inner.x: expected record Inner, got dict")
    assert problems[1] == "field 'severity': expected enum Severity {LOW, HIGH}, got str 'MID'"
    assert problems[2] == "field 'note': expected null | string, got int 3"


def test_a_field_referencing_an_earlier_named_type_is_validated() -> None:
    schema = {
        "type": "record",
        "name": "Outer",
        "namespace": "ns",
        "fields": [
            {"name": "first", "type": {"type": "record", "name": "Inner", "fields": [{"name": "x", "type": "int"}]}},
            {"name": "second", "type": "Inner"},
        ],
    }
    validator = RecordValidator(parse_schema(schema))
    assert validator.problems({"first": {"x": 1}, "second": {"x": 2}}) == []
    assert len(validator.problems({"first": {"x": 1}, "second": {"x": "2"}})) == 1


# ------------------------------------------------------------------- type_label


@pytest.mark.parametrize(
    ("avro_type", "label"),
    [
        ("string", "string"),
        ({"type": "int"}, "int"),
        (["null", "string"], "null | string"),
        (["null", "int", "double"], "null | int | double"),
        ({"type": "long", "logicalType": "timestamp-millis"}, "long (timestamp-millis)"),
        ({"type": "string", "logicalType": "uuid"}, "string (uuid)"),
        ({"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}, "bytes (decimal)"),
        ({"type": "array", "items": "string"}, "array<string>"),
        ({"type": "array", "items": ["null", "long"]}, "array<null | long>"),
        ({"type": "map", "values": "double"}, "map<double>"),
        ({"type": "map", "values": {"type": "array", "items": "int"}}, "map<array<int>>"),
        ({"type": "enum", "name": "dev.flotilla.Severity", "symbols": ["LOW", "HIGH"]}, "enum Severity {LOW, HIGH}"),
        ({"type": "enum", "name": "Color", "symbols": []}, "enum Color {}"),
        ({"type": "record", "name": "dev.flotilla.incidents.Thing", "fields": []}, "record Thing"),
        ({"type": "fixed", "name": "ns.Hash", "size": 16}, "fixed Hash"),
        (["null", {"type": "record", "name": "a.B", "fields": []}], "null | record B"),
        ({"type": "array", "items": {"type": "enum", "name": "E", "symbols": ["A"]}}, "array<enum E {A}>"),
    ],
)
def test_type_label(avro_type: Any, label: str) -> None:
    assert type_label(avro_type) == label
