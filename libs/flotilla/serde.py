"""Avro in the Confluent wire format, validated at the perimeter.

A value on a Flotilla topic is ``0x00 | schema id (4 bytes, big-endian) | Avro binary``.
Writers serialize against the schema *registered* for ``<topic>-<record full name>``
(never auto-registering), after validating the value strictly, so a record that does
not match its contract is refused where it is produced, with an error naming the field.
Registry look-ups are cached per subject and per schema id: the registry is consulted
once per record type per process, not per record.
"""

from __future__ import annotations

import io
import json
import struct
from dataclasses import dataclass
from typing import Any, cast

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError
from fastavro import parse_schema, schemaless_reader, schemaless_writer

from flotilla.contracts import subject_for
from flotilla.validation import RecordValidator

MAGIC_BYTE = 0
_HEADER = struct.Struct(">bI")


class SerdeError(ValueError):
    """Base class: a value could not be turned into bytes or back."""


class RecordValidationError(SerdeError):
    """A value does not match its registered schema; ``problems`` name each field."""

    def __init__(self, subject: str, problems: list[str]) -> None:
        self.subject = subject
        self.problems = problems
        super().__init__(f"{subject}: record does not match its registered schema: " + "; ".join(problems))


class SchemaNotRegisteredError(SerdeError):
    """No schema is registered for the subject (services never auto-register)."""


class UndecodableRecordError(SerdeError):
    """The bytes are not a Confluent-framed Avro value of a known schema."""


class UnknownSchemaIdError(UndecodableRecordError):
    """The frame names a schema id the registry does not know."""


@dataclass(frozen=True)
class _Writer:
    schema_id: int
    parsed: Any
    full_name: str
    validator: RecordValidator


@dataclass(frozen=True)
class Decoded:
    """A deserialized value and what it was written with."""

    schema_id: int
    record_name: str
    value: dict[str, Any]


class AvroSerde:
    """Serialize and deserialize through one registry client, with caches."""

    def __init__(self, client: SchemaRegistryClient) -> None:
        self._client = client
        self._writers: dict[str, _Writer] = {}
        self._readers: dict[int, tuple[Any, str]] = {}

    @property
    def client(self) -> SchemaRegistryClient:
        return self._client

    def writer(self, topic: str, record_full_name: str) -> _Writer:
        subject = subject_for(topic, record_full_name)
        cached = self._writers.get(subject)
        if cached is not None:
            return cached
        try:
            registered = self._client.get_latest_version(subject)
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                raise SchemaNotRegisteredError(
                    f"no schema registered for subject {subject}; register the contracts "
                    "(make schemas) — services never auto-register"
                ) from exc
            raise
        if registered.schema is None or registered.schema.schema_str is None or registered.schema_id is None:
            raise SchemaNotRegisteredError(f"registry returned no schema for subject {subject}")
        schema_dict = json.loads(registered.schema.schema_str)
        parsed = parse_schema(schema_dict)
        writer = _Writer(registered.schema_id, parsed, record_full_name, RecordValidator(cast(dict[str, Any], parsed)))
        self._writers[subject] = writer
        self._readers.setdefault(writer.schema_id, (writer.parsed, record_full_name))
        return writer

    def validate(self, topic: str, record_full_name: str, value: dict[str, Any]) -> _Writer:
        """Raise RecordValidationError naming every field that breaks the schema."""
        writer = self.writer(topic, record_full_name)
        problems = writer.validator.problems(value)
        if problems:
            raise RecordValidationError(subject_for(topic, record_full_name), problems)
        return writer

    def serialize(self, topic: str, record_full_name: str, value: dict[str, Any]) -> bytes:
        """Validate, then frame and encode against the registered schema."""
        writer = self.validate(topic, record_full_name, value)
        buf = io.BytesIO()
        buf.write(_HEADER.pack(MAGIC_BYTE, writer.schema_id))
        schemaless_writer(buf, writer.parsed, value)
        return buf.getvalue()

    def _reader(self, schema_id: int) -> tuple[Any, str]:
        cached = self._readers.get(schema_id)
        if cached is not None:
            return cached
        try:
            schema = self._client.get_schema(schema_id)
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                raise UnknownSchemaIdError(f"schema id {schema_id} is not known to the registry") from exc
            raise
        if schema.schema_str is None:
            raise UnknownSchemaIdError(f"schema id {schema_id} has no schema text in the registry")
        schema_dict = json.loads(schema.schema_str)
        name = schema_dict.get("name", "?")
        full = f"{schema_dict['namespace']}.{name}" if schema_dict.get("namespace") else name
        reader = (parse_schema(schema_dict), full)
        self._readers[schema_id] = reader
        return reader

    def deserialize(self, data: bytes | None) -> Decoded:
        """Decode a framed value; raises UndecodableRecordError for anything else."""
        if data is None or len(data) < _HEADER.size:
            raise UndecodableRecordError("value is empty or shorter than the 5-byte Confluent frame")
        magic, schema_id = _HEADER.unpack_from(data)
        if magic != MAGIC_BYTE:
            raise UndecodableRecordError(f"unknown magic byte {magic}: not a Confluent-framed Avro value")
        parsed, full_name = self._reader(schema_id)
        try:
            value = schemaless_reader(io.BytesIO(data[_HEADER.size :]), parsed, None)
        except Exception as exc:  # fastavro raises several types on truncated/garbled input
            raise UndecodableRecordError(
                f"bytes do not decode with schema id {schema_id} ({full_name}): {exc.__class__.__name__}: {exc}"
            ) from exc
        if not isinstance(value, dict):
            raise UndecodableRecordError(f"schema id {schema_id} does not describe a record")
        return Decoded(schema_id=schema_id, record_name=full_name, value=value)


def registry_client(url: str) -> SchemaRegistryClient:
    """A registry client for the Confluent-compatible API at ``url``."""
    return SchemaRegistryClient({"url": url})
