"""Registry writes need the registrar's credentials; readers keep reading anonymously.

Against the stack's registry: a compatible new version of a real subject, registered
anonymously, is refused (401/403); the registrar registers it. Meanwhile a writer and a
reader with anonymous clients (as every service has) serialize and deserialize as before,
and a frame written with the new version decodes too. The new version is deleted again
(as the registrar) whatever happens; while it exists, the subject's "latest" is this
probe, so a concurrent session comparing latest versions may see it for a moment.
"""

from __future__ import annotations

import io
import json
import struct
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError
from fastavro import parse_schema, schemaless_writer

from flotilla.contracts import Contract, load_contracts
from flotilla.registry import registry_client
from flotilla.serde import AvroSerde
from flotilla.settings import StackSettings

from ..unit.test_catalogue import comparable, sample_value

pytestmark = pytest.mark.timeout(120)

REFUSED = (401, 403)
# A real subject: the first contract of the incidents topic (any would do).
CONTRACT = next(c for c in load_contracts() if c.topic == "incidents")


def _with_optional_field(contract: Contract, name: str) -> dict[str, Any]:
    """The contract plus one optional field: BACKWARD-compatible, a new version of the subject."""
    field = {"name": name, "type": ["null", "string"], "default": None}
    return {**contract.schema, "fields": [*contract.schema["fields"], field]}


@pytest.fixture()
def anonymous(stack: StackSettings, registry: SchemaRegistryClient) -> SchemaRegistryClient:
    """A client with no credentials, made after ``registry`` registered the catalogue."""
    client: SchemaRegistryClient = registry_client(stack.schema_registry_url)
    return client


@pytest.fixture()
def probe_version(registry: SchemaRegistryClient) -> Iterator[dict[str, Any]]:
    """A compatible new version of CONTRACT's subject, unique to this run; whatever version
    the registrar registers of it is deleted again (soft, then permanently)."""
    schema = _with_optional_field(CONTRACT, f"itRegistryAuthProbe{uuid.uuid4().hex[:8]}")
    yield schema
    try:
        found = registry.lookup_schema(CONTRACT.subject, Schema(json.dumps(schema), "AVRO"))
    except SchemaRegistryError as exc:
        if exc.http_status_code == 404:
            return  # never registered
        raise
    assert found.version is not None
    registry.delete_version(CONTRACT.subject, found.version)
    try:
        registry.delete_version(CONTRACT.subject, found.version, permanent=True)
    except SchemaRegistryError as exc:
        if exc.http_status_code != 404:  # a registry that deletes at once has nothing left
            raise


def _frame(schema_id: int, schema: dict[str, Any], value: dict[str, Any]) -> bytes:
    body = io.BytesIO()
    schemaless_writer(body, parse_schema(schema), value)
    return struct.pack(">bI", 0, schema_id) + body.getvalue()


def test_anonymous_writes_are_refused_the_registrar_s_accepted_and_readers_read_throughout(
    stack: StackSettings,
    registry: SchemaRegistryClient,
    anonymous: SchemaRegistryClient,
    probe_version: dict[str, Any],
) -> None:
    subject = CONTRACT.subject
    versions = registry.get_versions(subject)
    candidate = Schema(json.dumps(probe_version), "AVRO")
    # The candidate is compatible, so only the missing credentials can refuse it; asking is a read.
    assert anonymous.test_compatibility(subject, candidate) is True

    with pytest.raises(SchemaRegistryError) as refused:
        anonymous.register_schema(subject, candidate)
    assert refused.value.http_status_code in REFUSED, refused.value
    # The global rule cannot be changed anonymously either (set to what it is: harmless if it were allowed).
    level = anonymous.get_compatibility()
    with pytest.raises(SchemaRegistryError) as config_refused:
        anonymous.set_compatibility(level=level)
    assert config_refused.value.http_status_code in REFUSED, config_refused.value
    assert registry.get_versions(subject) == versions, "the anonymous registration left a version"

    writer = AvroSerde(registry_client(stack.schema_registry_url))
    reader = AvroSerde(registry_client(stack.schema_registry_url))
    value = sample_value(CONTRACT)
    before = reader.deserialize(writer.serialize(CONTRACT.topic, CONTRACT.full_name, value), topic=CONTRACT.topic)
    assert comparable(before.value) == value

    new_id = registry.register_schema(subject, candidate)  # the registrar
    version = registry.lookup_schema(subject, candidate).version
    assert version is not None and version not in versions
    assert registry.get_versions(subject) == [*versions, version]

    # Meanwhile: the writer still writes the repository's contract (looked up by content,
    # never "latest"), and readers decode both that and a record of the new version.
    framed = AvroSerde(registry_client(stack.schema_registry_url)).serialize(CONTRACT.topic, CONTRACT.full_name, value)
    assert framed[1:5] == before.schema_id.to_bytes(4, "big")
    decoded = AvroSerde(registry_client(stack.schema_registry_url)).deserialize(framed, topic=CONTRACT.topic)
    assert (decoded.record_name, comparable(decoded.value)) == (CONTRACT.full_name, value)
    probe_field = probe_version["fields"][-1]["name"]
    newer = reader.deserialize(_frame(new_id, probe_version, {**value, probe_field: "x"}), topic=CONTRACT.topic)
    assert (newer.schema_id, newer.value[probe_field]) == (new_id, "x")

    # Deleting is a write too: refused anonymously (the probe is what it would delete).
    with pytest.raises(SchemaRegistryError) as delete_refused:
        anonymous.delete_version(subject, version)
    assert delete_refused.value.http_status_code in REFUSED, delete_refused.value
