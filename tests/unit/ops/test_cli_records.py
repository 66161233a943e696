"""Turning typed text into record values: types, unions, timestamps, nested fields, names."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from fastavro import parse_schema
from flotilla_ops.cli.records import (
    InputError,
    build_value,
    from_text,
    parse_field_flags,
    parse_time,
    resolve_type,
)

SCHEMA: dict[str, Any] = parse_schema(
    {
        "type": "record",
        "name": "Thing",
        "namespace": "t",
        "fields": [
            {"name": "count", "type": "int"},
            {"name": "ratio", "type": "double"},
            {"name": "flag", "type": "boolean"},
            {"name": "note", "type": ["null", "string"], "default": None},
            {"name": "size", "type": ["null", "long"], "default": None},
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {
                "name": "target",
                "type": {"type": "record", "name": "Ref", "fields": [{"name": "name", "type": "string"}]},
            },
            {"name": "other", "type": ["null", "Ref"], "default": None},
            {"name": "tags", "type": {"type": "array", "items": "string"}},
            {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
        ],
    }
)


def test_flags_are_typed_by_the_schema() -> None:
    flags = parse_field_flags(
        ["count=3", "ratio=0.5", "flag=yes", "note=null", "size=12", "at=0", "target.name=x", 'tags=["a"]', "kind=B"]
    )
    value = build_value(SCHEMA, None, flags)
    assert value == {
        "count": 3,
        "ratio": 0.5,
        "flag": True,
        "note": None,
        "size": 12,
        "at": datetime(1970, 1, 1, tzinfo=UTC),
        "target": {"name": "x"},
        "tags": ["a"],
        "kind": "B",
    }


def test_text_that_is_not_the_type_stays_text_for_the_validator() -> None:
    value = build_value(SCHEMA, None, parse_field_flags(["count=three", "flag=maybe", "at=soon", "unknown=1"]))
    assert value == {"count": "three", "flag": "maybe", "at": "soon", "unknown": "1"}


def test_a_union_with_a_record_takes_nested_flags_and_json_timestamps() -> None:
    value = build_value(SCHEMA, {"at": "2024-05-01T12:00:00Z", "count": 1}, parse_field_flags(["other.name=y"]))
    assert value["other"] == {"name": "y"}
    assert value["at"] == datetime(2024, 5, 1, 12, tzinfo=UTC)
    assert value["count"] == 1


def test_union_text() -> None:
    named = dict(SCHEMA["__named_schemas"])
    assert from_text("null", ["null", "string"], named) is None
    assert from_text("7", ["null", "long", "string"], named) == 7
    assert from_text("seven", ["null", "long", "string"], named) == "seven"


def test_times() -> None:
    assert parse_time("2024-05-01T12:00:00+02:00") == datetime(2024, 5, 1, 10, tzinfo=UTC)
    assert parse_time("2024-05-01T12:00:00") == datetime(2024, 5, 1, 12, tzinfo=UTC)
    assert parse_time("1714564800000") == datetime(2024, 5, 1, 12, tzinfo=UTC)
    assert abs((parse_time("now") - datetime.now(UTC)).total_seconds()) < 5


def test_bad_flags_are_all_reported() -> None:
    with pytest.raises(InputError) as bad:
        parse_field_flags(["ok=1", "nope", ".x=1", "a..b=2"])
    assert len(bad.value.problems) == 3


def test_record_types_by_short_or_full_name() -> None:
    assert resolve_type("ScaleService").topic == "commands"
    assert resolve_type("scaleservice").full_name == "dev.flotilla.commands.ScaleService"
    assert resolve_type("dev.flotilla.decisions.RecoveryProposed").topic == "incidents"
    with pytest.raises(InputError, match="did you mean RecoveryProposed"):
        resolve_type("RecoveryPropsed")
