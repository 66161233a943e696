"""AvroSerde: Confluent framing, strict validation and registry caching, offline.

The registry is an in-memory stand-in answering the calls AvroSerde makes (look up a
schema under a subject by content, a schema by id, the subjects of an id), with the
confluent-kafka result and error types, holding any number of versions per subject and
counting how often it is asked.
"""

from __future__ import annotations

import io
import json
import re
import struct
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry import RegisteredSchema, Schema
from confluent_kafka.schema_registry.common.schema_registry_client import SchemaVersion
from confluent_kafka.schema_registry.error import SchemaRegistryError
from fastavro import parse_schema, schemaless_writer
from hypothesis import given, settings
from hypothesis import strategies as st

from flotilla.contracts import Contract, load_contracts
from flotilla.serde import (
    MAGIC_BYTE,
    AvroSerde,
    Decoded,
    RecordValidationError,
    RegistryUnavailableError,
    SchemaNotRegisteredError,
    SerdeError,
    UndecodableRecordError,
    UnknownContractError,
    UnknownSchemaIdError,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
RECORD = "dev.flotilla.incidents.ServiceLatencyIncreased"
CONTRACT = next(c for c in load_contracts(REPO_ROOT / "schemas") if c.full_name == RECORD)
# The text `make schemas` registers (flotilla.contracts.register), hence the text a writer looks up.
SCHEMA_STR = CONTRACT.schema_str
TOPIC = "incidents"
SUBJECT = f"{TOPIC}-{RECORD}"
# Every byte differs, so a little-endian or truncated id would show.
SCHEMA_ID = 0x0A0B0C0D


def _without_docs(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_docs(v) for k, v in value.items() if k != "doc"}
    if isinstance(value, list):
        return [_without_docs(v) for v in value]
    return value


def _normalized(text: str) -> str | None:
    """Roughly what Apicurio compares with ``normalize=true``: the content without docs."""
    try:
        return json.dumps(_without_docs(json.loads(text)), sort_keys=True)
    except ValueError:
        return None


class FakeRegistry:
    """Answers lookup_schema / get_schema / get_schema_versions (and get_latest_version, which
    writers must never ask) from dicts; a subject holds versions in the order added (the last
    is the latest); counts every call."""

    def __init__(self) -> None:
        self.versions: dict[str, list[tuple[int, str]]] = {}
        self.by_id: dict[int, str] = {}
        self.types: dict[int, str] = {}
        self.subjects_of: dict[int, list[str]] = {}
        self.calls: Counter[tuple[str, object]] = Counter()
        self.fail_with: Exception | None = None

    def add(self, subject: str, schema_id: int, schema_str: str, schema_type: str = "AVRO") -> None:
        """Register a version: ``schema_str`` becomes the latest version of ``subject``."""
        self.versions.setdefault(subject, []).append((schema_id, schema_str))
        self.by_id[schema_id] = schema_str
        self.types[schema_id] = schema_type
        self.subjects_of.setdefault(schema_id, []).append(subject)

    def lookup_schema(
        self, subject_name: str, schema: Schema, normalize_schemas: bool = False, deleted: bool = False
    ) -> RegisteredSchema:
        """POST /subjects/{subject}: the version whose content is ``schema`` (exactly, or
        without docs when normalizing); 40401 without the subject, 40403 without a match."""
        self.calls["lookup_schema", subject_name] += 1
        self.calls["lookup_schema normalized" if normalize_schemas else "lookup_schema exact", subject_name] += 1
        if self.fail_with is not None:
            raise self.fail_with
        if subject_name not in self.versions:
            raise SchemaRegistryError(404, 40401, "Subject not found")
        wanted = schema.schema_str or ""
        for version, (schema_id, text) in enumerate(self.versions[subject_name], start=1):
            if text == wanted or (normalize_schemas and _normalized(text) == _normalized(wanted)):
                return RegisteredSchema(
                    subject=subject_name, version=version, schema_id=schema_id, guid=None, schema=schema
                )
        raise SchemaRegistryError(404, 40403, "Schema not found")

    def get_schema_versions(self, schema_id: int) -> list[SchemaVersion]:
        self.calls["get_schema_versions", schema_id] += 1
        if self.fail_with is not None:
            raise self.fail_with
        return [SchemaVersion(subject=s, version=1) for s in self.subjects_of.get(schema_id, [])]

    def get_latest_version(self, subject: str) -> RegisteredSchema:
        self.calls["get_latest_version", subject] += 1
        if self.fail_with is not None:
            raise self.fail_with
        if subject not in self.versions:
            raise SchemaRegistryError(404, 40401, "Subject not found")
        schema_id, text = self.versions[subject][-1]
        return RegisteredSchema(
            subject=subject,
            version=len(self.versions[subject]),
            schema_id=schema_id,
            guid=None,
            schema=Schema(text, schema_type="AVRO"),
        )

    def get_schema(self, schema_id: int) -> Schema:
        self.calls["get_schema", schema_id] += 1
        if self.fail_with is not None:
            raise self.fail_with
        if schema_id not in self.by_id:
            raise SchemaRegistryError(404, 40403, "Schema not found")
        return Schema(self.by_id[schema_id], schema_type=self.types[schema_id])


@pytest.fixture
def registry() -> FakeRegistry:
    reg = FakeRegistry()
    reg.add(SUBJECT, SCHEMA_ID, SCHEMA_STR)
    return reg


@pytest.fixture
def serde(registry: FakeRegistry) -> AvroSerde:
    return AvroSerde(registry)


def _value(**overrides: Any) -> dict[str, Any]:
    value: dict[str, Any] = {
        "eventId": "6f1c1b52-8a55-4d55-9c69-5e0f4b1e2a10",
        "incidentId": "incident-204",
        "service": "checkout-api",
        "environment": "production",
        "p95LatencyMs": 812.5,
        "thresholdMs": 500.0,
        "windowSeconds": 300,
        "observedAt": datetime(2024, 5, 1, 12, 0, 0, 123000, tzinfo=UTC),
    }
    value.update(overrides)
    return value


def _as_decoded(value: dict[str, Any]) -> dict[str, Any]:
    """What a reader gets back: the uuid logical type decodes to uuid.UUID."""
    return {**value, "eventId": uuid.UUID(value["eventId"])}


# ------------------------------------------------------------------- framing


def test_frame_is_magic_byte_then_big_endian_schema_id(serde: AvroSerde) -> None:
    data = serde.serialize(TOPIC, RECORD, _value())
    assert MAGIC_BYTE == 0
    assert data[0] == 0
    assert data[1:5] == bytes([0x0A, 0x0B, 0x0C, 0x0D])
    assert struct.unpack(">I", data[1:5])[0] == SCHEMA_ID
    assert len(data) > 5 + len("checkout-api")


def test_round_trip(serde: AvroSerde) -> None:
    value = _value()
    decoded = serde.deserialize(serde.serialize(TOPIC, RECORD, value))
    assert isinstance(decoded, Decoded)
    assert decoded.schema_id == SCHEMA_ID
    assert decoded.record_name == RECORD
    assert decoded.value == _as_decoded(value)
    assert decoded.value["observedAt"].tzinfo is not None


def test_round_trip_through_a_fresh_reader(registry: FakeRegistry, serde: AvroSerde) -> None:
    data = serde.serialize(TOPIC, RECORD, _value())
    asked = registry.calls["get_schema", SCHEMA_ID]
    reader = AvroSerde(registry)
    decoded = reader.deserialize(data)
    assert decoded.record_name == RECORD
    assert decoded.value == _as_decoded(_value())
    assert registry.calls["get_schema", SCHEMA_ID] == asked + 1


def test_an_omitted_defaulted_field_is_written_with_its_default(serde: AvroSerde) -> None:
    value = _value()
    del value["environment"]
    decoded = serde.deserialize(serde.serialize(TOPIC, RECORD, value))
    assert decoded.value["environment"] == "production"


def test_an_epoch_millis_timestamp_decodes_as_an_aware_datetime(serde: AvroSerde) -> None:
    decoded = serde.deserialize(serde.serialize(TOPIC, RECORD, _value(observedAt=1_714_564_800_123)))
    assert decoded.value["observedAt"] == datetime(2024, 5, 1, 12, 0, 0, 123000, tzinfo=UTC)


def test_a_schema_without_namespace_is_named_by_its_bare_name(registry: FakeRegistry) -> None:
    ping = Contract("pings", {"type": "record", "name": "Ping", "fields": [{"name": "n", "type": "int"}]})
    registry.add("pings-Ping", 7, ping.schema_str)
    data = AvroSerde(registry, contracts=[ping]).serialize("pings", "Ping", {"n": 3})
    decoded = AvroSerde(registry).deserialize(data)
    assert decoded == Decoded(schema_id=7, record_name="Ping", value={"n": 3})


# ------------------------------------------------------------ writer failures


def test_an_unregistered_subject_is_refused(serde: AvroSerde, registry: FakeRegistry) -> None:
    subject = f"scratch-{RECORD}"
    with pytest.raises(SchemaNotRegisteredError, match=rf"^{re.escape(subject)}: no schema is registered") as info:
        serde.serialize("scratch", RECORD, _value())
    assert isinstance(info.value, SerdeError)
    assert isinstance(info.value.__cause__, SchemaRegistryError)
    # The subject is looked up under the topic-record strategy, nothing else, and once:
    # without the subject, no other comparison can find anything.
    assert registry.calls["lookup_schema", subject] == 1
    assert not any(call == "get_latest_version" for call, _ in registry.calls)


def test_a_record_type_without_a_contract_in_schemas_is_refused_without_asking(
    serde: AvroSerde, registry: FakeRegistry
) -> None:
    unknown = "dev.flotilla.incidents.Unknown"
    registry.add(f"{TOPIC}-{unknown}", 99, SCHEMA_STR.replace("ServiceLatencyIncreased", "Unknown"))
    with pytest.raises(UnknownContractError, match=re.escape(unknown)) as info:
        serde.serialize(TOPIC, unknown, _value())
    assert isinstance(info.value, SchemaNotRegisteredError)  # what callers already catch
    assert not registry.calls


def test_the_same_record_on_another_topic_is_another_subject(serde: AvroSerde) -> None:
    with pytest.raises(SchemaNotRegisteredError, match=re.escape(f"commands-{RECORD}")):
        serde.serialize("commands", RECORD, _value())


def test_other_registry_errors_propagate(serde: AvroSerde, registry: FakeRegistry) -> None:
    registry.fail_with = SchemaRegistryError(500, 50001, "backend down")
    with pytest.raises(SchemaRegistryError) as info:
        serde.serialize(TOPIC, RECORD, _value())
    assert not isinstance(info.value, SerdeError)
    assert info.value.http_status_code == 500


def test_an_invalid_value_raises_with_subject_and_every_problem(serde: AvroSerde) -> None:
    value = _value(eventId="not-a-uuid", windowSeconds="300", extra=True)
    del value["service"]
    with pytest.raises(RecordValidationError) as info:
        serde.serialize(TOPIC, RECORD, value)
    err = info.value
    assert isinstance(err, SerdeError)
    assert err.subject == SUBJECT
    assert len(err.problems) == 4
    assert any("'eventId'" in p and "UUID" in p for p in err.problems)
    assert "field 'service' is missing (expected string)" in err.problems
    assert "field 'windowSeconds': expected int, got str '300'" in err.problems
    assert "field 'extra' is not in the schema" in err.problems
    message = str(err)
    assert message.startswith(SUBJECT)
    assert all(p in message for p in err.problems)


def test_validate_alone_returns_the_writer_and_raises_the_same_way(serde: AvroSerde) -> None:
    writer = serde.validate(TOPIC, RECORD, _value())
    assert writer.schema_id == SCHEMA_ID
    assert writer.full_name == RECORD
    with pytest.raises(RecordValidationError):
        serde.validate(TOPIC, RECORD, _value(p95LatencyMs="slow"))


# ------------------------------------------- the contract, never "the latest version"
# Whoever can write to the registry can register a compatible version beside ours; writers
# must go on writing the repository's contract (finding 3 of security-review-2).

NEWER_ID = 0x0A0B0C0E


def _edited(text: str, *, add: dict[str, Any] | None = None, drop: str | None = None) -> str:
    schema = json.loads(text)
    fields = [f for f in schema["fields"] if f["name"] != drop] + ([add] if add else [])
    return json.dumps({**schema, "fields": fields}, sort_keys=True, separators=(",", ":"))


REGION = {"name": "region", "type": ["null", "string"], "default": None}
WITH_REGION = _edited(SCHEMA_STR, add=REGION)  # compatible: a defaulted field more
WITHOUT_ENVIRONMENT = _edited(SCHEMA_STR, drop="environment")  # compatible: a defaulted field less


@pytest.mark.parametrize("newer", [WITH_REGION, WITHOUT_ENVIRONMENT], ids=["adds-a-field", "drops-a-field"])
def test_a_newer_compatible_version_under_the_subject_is_not_what_writers_write(
    registry: FakeRegistry, newer: str
) -> None:
    registry.add(SUBJECT, NEWER_ID, newer)
    assert registry.get_latest_version(SUBJECT).schema_id == NEWER_ID  # the registry's "latest"
    registry.calls.clear()
    writer = AvroSerde(registry)
    data = writer.serialize(TOPIC, RECORD, _value())
    assert struct.unpack(">I", data[1:5])[0] == SCHEMA_ID
    assert writer.writer(TOPIC, RECORD).schema_id == SCHEMA_ID
    assert not any(call == "get_latest_version" for call, _ in registry.calls)
    # The bytes are the contract's, whatever a reader knows: every field, nothing else.
    decoded = AvroSerde(registry).deserialize(data, topic=TOPIC)
    assert decoded.schema_id == SCHEMA_ID
    assert decoded.value == _as_decoded(_value())
    # What the newer version adds is not in the contract, so it is refused.
    with pytest.raises(RecordValidationError, match="field 'region' is not in the schema"):
        writer.serialize(TOPIC, RECORD, _value(region="eu-west-1"))


def test_the_writer_uses_the_id_of_the_repository_schema_among_several_versions() -> None:
    registry = FakeRegistry()
    registry.add(SUBJECT, 41, WITHOUT_ENVIRONMENT)
    registry.add(SUBJECT, 42, SCHEMA_STR)
    registry.add(SUBJECT, 43, WITH_REGION)
    data = AvroSerde(registry).serialize(TOPIC, RECORD, _value())
    assert struct.unpack(">I", data[1:5])[0] == 42
    assert registry.calls["lookup_schema exact", SUBJECT] == 1
    assert registry.calls["lookup_schema normalized", SUBJECT] == 0


@pytest.mark.parametrize("held", [[WITH_REGION], [WITHOUT_ENVIRONMENT, WITH_REGION]], ids=["one", "two"])
def test_a_subject_without_the_repository_schema_fails_naming_the_subject(held: list[str]) -> None:
    registry = FakeRegistry()
    for n, text in enumerate(held):
        registry.add(SUBJECT, 50 + n, text)
    with pytest.raises(SchemaNotRegisteredError, match=rf"^{re.escape(SUBJECT)}: none of the versions") as info:
        AvroSerde(registry).serialize(TOPIC, RECORD, _value())
    assert isinstance(info.value.__cause__, SchemaRegistryError)
    assert info.value.__cause__.error_code == 40403
    # Asked exactly, then normalised; never for another version.
    assert registry.calls["lookup_schema exact", SUBJECT] == 1
    assert registry.calls["lookup_schema normalized", SUBJECT] == 1
    assert not any(call in ("get_latest_version", "get_schema") for call, _ in registry.calls)


def test_the_contract_registered_from_other_text_is_found_by_the_normalised_lookup() -> None:
    """Other formatting and other docs (the registry's canonical form leaves docs out)."""
    schema = json.loads(SCHEMA_STR)
    reworded = {**schema, "doc": "Reworded since it was registered."}
    registry = FakeRegistry()
    registry.add(SUBJECT, 77, json.dumps(reworded, indent=2))
    registry.add(SUBJECT, NEWER_ID, WITH_REGION)
    data = AvroSerde(registry).serialize(TOPIC, RECORD, _value())
    assert struct.unpack(">I", data[1:5])[0] == 77
    assert registry.calls["lookup_schema normalized", SUBJECT] == 1


class _LyingRegistry(FakeRegistry):
    """Answers every look-up with the latest version, whatever was asked."""

    def lookup_schema(
        self, subject_name: str, schema: Schema, normalize_schemas: bool = False, deleted: bool = False
    ) -> RegisteredSchema:
        self.calls["lookup_schema", subject_name] += 1
        schema_id, _ = self.versions[subject_name][-1]
        return RegisteredSchema(subject=subject_name, version=2, schema_id=schema_id, guid=None, schema=schema)


@pytest.mark.parametrize("other", [WITH_REGION, SCHEMA_STR.replace('"timestamp-millis"', '"local-timestamp-millis"')])
def test_an_id_answered_for_the_contract_that_names_another_schema_is_refused(other: str) -> None:
    registry = _LyingRegistry()
    registry.add(SUBJECT, SCHEMA_ID, SCHEMA_STR)
    registry.add(SUBJECT, NEWER_ID, other)
    refused = rf"^{re.escape(SUBJECT)}: .*id {NEWER_ID} .*names a different schema"
    with pytest.raises(SchemaNotRegisteredError, match=refused):
        AvroSerde(registry).serialize(TOPIC, RECORD, _value())


def test_a_reader_decodes_a_record_written_with_a_newer_compatible_version(
    registry: FakeRegistry, serde: AvroSerde
) -> None:
    registry.add(SUBJECT, NEWER_ID, WITH_REGION)
    buf = io.BytesIO()
    buf.write(b"\x00" + NEWER_ID.to_bytes(4, "big"))
    schemaless_writer(buf, parse_schema(json.loads(WITH_REGION)), {**_value(), "region": "eu-west-1"})
    serde.serialize(TOPIC, RECORD, _value())  # a process that also writes: its reader cache holds only ours
    for reader in (serde, AvroSerde(registry)):
        decoded = reader.deserialize(buf.getvalue(), topic=TOPIC)
        assert decoded.schema_id == NEWER_ID
        assert decoded.record_name == RECORD
        assert decoded.value == {**_as_decoded(_value()), "region": "eu-west-1"}


# ------------------------------------------------------------ reader failures


@pytest.mark.parametrize("data", [None, b"", b"\x00", b"\x00\x00\x00\x00"])
def test_empty_or_short_input_is_undecodable(serde: AvroSerde, data: bytes | None) -> None:
    with pytest.raises(UndecodableRecordError, match="shorter than the 5-byte"):
        serde.deserialize(data)


@pytest.mark.parametrize("magic", [1, 0x7F, 0xFF])
def test_a_wrong_magic_byte_is_undecodable(serde: AvroSerde, registry: FakeRegistry, magic: int) -> None:
    good = serde.serialize(TOPIC, RECORD, _value())
    asked = dict(registry.calls)
    with pytest.raises(UndecodableRecordError, match="magic byte") as info:
        serde.deserialize(bytes([magic]) + good[1:])
    assert not isinstance(info.value, UnknownSchemaIdError)
    assert dict(registry.calls) == asked


def test_a_garbled_body_is_undecodable(serde: AvroSerde) -> None:
    good = serde.serialize(TOPIC, RECORD, _value())
    bodies = [
        good[:5],  # frame, no body
        good[: len(good) // 2],  # truncated mid-record
        good[:-1],  # last byte of the timestamp missing
        good[:5] + b"\xff" * 10 + b"\x01",  # absurd string length
        good[:5] + b"\x48" + b"\xff" * 36 + good[42:],  # 36 bytes that are not UTF-8
    ]
    for data in bodies:
        with pytest.raises(UndecodableRecordError, match=f"schema id {SCHEMA_ID}") as info:
            serde.deserialize(data)
        assert RECORD in str(info.value)
        assert not isinstance(info.value, UnknownSchemaIdError)


def test_an_unknown_schema_id_is_reported(serde: AvroSerde, registry: FakeRegistry) -> None:
    with pytest.raises(UnknownSchemaIdError, match="schema id 999") as info:
        serde.deserialize(b"\x00" + (999).to_bytes(4, "big") + b"\x02")
    assert isinstance(info.value, UndecodableRecordError)
    assert registry.calls["get_schema", 999] == 1


@pytest.mark.parametrize(
    "failure",
    [
        SchemaRegistryError(503, 50301, "unavailable"),
        SchemaRegistryError(500, 50001, "boom"),
        ConnectionError("refused"),
    ],
)
def test_a_registry_that_cannot_answer_is_unavailable_not_poison(registry: FakeRegistry, failure: Exception) -> None:
    """Not the record's fault: not a SerdeError, so no consumer dead-letters it; decoding again
    once the registry is back works."""
    data = AvroSerde(registry).serialize(TOPIC, RECORD, _value())
    reader = AvroSerde(registry)
    registry.fail_with = failure
    with pytest.raises(RegistryUnavailableError) as info:
        reader.deserialize(data)
    assert not isinstance(info.value, SerdeError)
    registry.fail_with = None
    assert reader.deserialize(data).record_name == RECORD


def test_a_registry_refusal_other_than_404_is_undecodable(registry: FakeRegistry) -> None:
    registry.fail_with = SchemaRegistryError(422, 42202, "invalid schema id")
    with pytest.raises(UndecodableRecordError, match="refused"):
        AvroSerde(registry).deserialize(b"\x00" + (77).to_bytes(4, "big") + b"\x02")


# A registry holds schemas of every kind; only an Avro record describes a Flotilla value.
_NOT_RECORDS = {
    101: ('"string"', "AVRO"),
    102: ('{"type": "enum", "name": "E", "symbols": ["A", "B"]}', "AVRO"),
    103: ('{"type": "array", "items": "long"}', "AVRO"),
    104: ('{"type": "map", "values": "string"}', "AVRO"),
    105: ('["null", "string"]', "AVRO"),
    106: ('{"type": "fixed", "name": "F", "size": 4}', "AVRO"),
    107: ('{"type": "record", "name": "R", "fields": [{"name": "x", "type": "NoSuchType"}]}', "AVRO"),
    108: ("not json at all", "AVRO"),
    109: ('{"type": "object", "properties": {"a": {"type": "string"}}}', "JSON"),
    110: ('syntax = "proto3";\nmessage M { string a = 1; }\n', "PROTOBUF"),
    111: ('{"type": "record", "fields": []}', "AVRO"),
}


@pytest.mark.parametrize("schema_id", sorted(_NOT_RECORDS))
def test_an_id_of_any_other_kind_of_schema_is_undecodable_and_asked_once(
    registry: FakeRegistry, schema_id: int
) -> None:
    text, kind = _NOT_RECORDS[schema_id]
    registry.add(f"elsewhere-{schema_id}", schema_id, text, kind)
    reader = AvroSerde(registry)
    frame = b"\x00" + schema_id.to_bytes(4, "big") + b"\x06abc"
    for _ in range(3):
        with pytest.raises(UndecodableRecordError, match=f"schema id {schema_id}"):
            reader.deserialize(frame)
    assert registry.calls["get_schema", schema_id] == 1


def test_an_id_registered_under_another_subject_is_refused_for_the_topic(registry: FakeRegistry) -> None:
    """Same record name, but registered where our compatibility rule never looked."""
    registry.add(f"rogue-{RECORD}", 4242, SCHEMA_STR)
    rogue = b"\x00" + (4242).to_bytes(4, "big") + AvroSerde(registry).serialize(TOPIC, RECORD, _value())[5:]
    reader = AvroSerde(registry)
    assert reader.deserialize(rogue).record_name == RECORD  # no topic given: not bound
    with pytest.raises(UndecodableRecordError, match=f"not registered under subject {SUBJECT}"):
        reader.deserialize(rogue, topic=TOPIC)
    ours = AvroSerde(registry).serialize(TOPIC, RECORD, _value())
    assert reader.deserialize(ours, topic=TOPIC).record_name == RECORD
    reader.deserialize(ours, topic=TOPIC)
    assert registry.calls["get_schema_versions", SCHEMA_ID] == 1  # the binding is cached


def test_the_reader_cache_is_bounded(registry: FakeRegistry) -> None:
    reader = AvroSerde(registry, reader_cache_size=8)
    for schema_id in range(500, 600):
        registry.add(f"s-{schema_id}", schema_id, '"string"')
        with pytest.raises(UndecodableRecordError):
            reader.deserialize(b"\x00" + schema_id.to_bytes(4, "big") + b"\x00")
    assert len(reader._readers) == 8


# ------------------------------------------------------------------- caching


def test_the_registry_is_asked_once_per_subject(serde: AvroSerde, registry: FakeRegistry) -> None:
    for _ in range(5):
        serde.serialize(TOPIC, RECORD, _value())
    with pytest.raises(RecordValidationError):
        serde.serialize(TOPIC, RECORD, _value(windowSeconds=None))
    assert registry.calls["lookup_schema", SUBJECT] == 1
    assert registry.calls["get_schema", SCHEMA_ID] == 1  # the id's schema, checked once
    registry.add(f"commands-{RECORD}", 11, SCHEMA_STR)
    serde.serialize("commands", RECORD, _value())
    serde.serialize("commands", RECORD, _value())
    assert registry.calls["lookup_schema", f"commands-{RECORD}"] == 1
    assert registry.calls["lookup_schema", SUBJECT] == 1


def test_the_registry_is_asked_once_per_schema_id(registry: FakeRegistry) -> None:
    data = AvroSerde(registry).serialize(TOPIC, RECORD, _value())
    registry.calls.clear()
    reader = AvroSerde(registry)
    for _ in range(5):
        reader.deserialize(data)
    assert registry.calls["get_schema", SCHEMA_ID] == 1
    assert sum(n for (call, _), n in registry.calls.items() if call == "get_schema") == 1


def test_a_writer_primes_the_reader_cache(serde: AvroSerde, registry: FakeRegistry) -> None:
    data = serde.serialize(TOPIC, RECORD, _value())
    asked = dict(registry.calls)
    serde.deserialize(data, topic=TOPIC)
    assert dict(registry.calls) == asked


# ------------------------------------------------------------------ property

_text = st.text(st.characters(codec="utf-8"), max_size=30)
_double = st.floats(allow_nan=False, allow_infinity=False)
_observed = st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)).map(
    lambda dt: dt.replace(microsecond=dt.microsecond // 1000 * 1000)
)

_valid_values = st.fixed_dictionaries(
    {
        "eventId": st.uuids().map(str),
        "incidentId": _text,
        "service": _text,
        "environment": _text,
        "p95LatencyMs": _double,
        "thresholdMs": _double,
        "windowSeconds": st.integers(min_value=-(2**31), max_value=2**31 - 1),
        "observedAt": _observed,
    }
)

_shared_registry = FakeRegistry()
_shared_registry.add(SUBJECT, SCHEMA_ID, SCHEMA_STR)
_shared_serde = AvroSerde(_shared_registry)


@settings(max_examples=150)
@given(value=_valid_values)
def test_any_valid_value_round_trips(value: dict[str, Any]) -> None:
    decoded = _shared_serde.deserialize(_shared_serde.serialize(TOPIC, RECORD, value))
    assert decoded.record_name == RECORD
    got = decoded.value
    assert got["eventId"] == uuid.UUID(value["eventId"])
    assert got["observedAt"].tzinfo is not None
    assert got["observedAt"] == value["observedAt"]
    assert got == _as_decoded(value)
