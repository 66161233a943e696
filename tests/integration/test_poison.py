"""Poison on the real stack: a record framed with a registered schema id of any kind that is
not a record of its topic's subject (an Avro primitive, an enum, a JSON Schema, a Protobuf
schema, a record registered under another subject), or any other decode surprise, is
dead-lettered by the consumer loop and recorded as undecodable by the audit — and the
records behind it on the same partition are handled.
"""

from __future__ import annotations

import json
import struct
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flotilla_ops.samples import SERVICE_LATENCY_INCREASED, latency_fact
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flotilla.envelope import Envelope
from flotilla.provenance import Provenance
from flotilla.registry import registry_client
from flotilla.serde import AvroSerde
from flotilla.settings import StackSettings
from services.audit.chain import Signer
from services.audit.recorder import Recorder
from tests.integration.kafka_wait import fresh_topic
from tests.keys import producer_keys
from tests.support.databases import migrated_database
from tests.support.messages import FakeMessage

from .kafka_wait import header, wait_for
from .loop_worker import build_loop
from .test_consumer_loop import dlq_reader, drain, produce

DB = "flotilla_it_poison"
RUN = uuid.uuid4().hex[:8]

pytestmark = pytest.mark.timeout(300)

# One registered schema of every kind a Confluent-API registry holds that is not a record
# of our subjects.
KINDS: dict[str, Schema] = {
    "avro-primitive": Schema('"string"', "AVRO"),
    "avro-enum": Schema(json.dumps({"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}), "AVRO"),
    "avro-array": Schema(json.dumps({"type": "array", "items": "long"}), "AVRO"),
    "avro-map": Schema(json.dumps({"type": "map", "values": "string"}), "AVRO"),
    "avro-union": Schema(json.dumps(["null", "string"]), "AVRO"),
    "avro-fixed": Schema(json.dumps({"type": "fixed", "name": "Four", "size": 4}), "AVRO"),
    "json-schema": Schema(
        json.dumps(
            {
                "$schema": "http://json-schema.org/draft-07/schema#",
                "type": "object",
                "properties": {"a": {"type": "string"}},
            }
        ),
        "JSON",
    ),
    "protobuf": Schema('syntax = "proto3";\nmessage Poison { string a = 1; }\n', "PROTOBUF"),
}


@pytest.fixture(scope="module")
def poison_ids(registry: SchemaRegistryClient, serde: AvroSerde) -> dict[str, int]:
    """Schema ids of every kind, plus our own record's schema under a rogue subject."""
    ids = {name: registry.register_schema(f"it-poison-{RUN}-{name}", schema) for name, schema in KINDS.items()}
    ours = serde.writer("incidents", SERVICE_LATENCY_INCREASED)
    rogue = json.loads(registry.get_schema(ours.schema_id).schema_str or "{}")
    rogue["doc"] = f"the same record, registered under a subject nobody checks ({RUN})"
    ids["rogue-subject"] = registry.register_schema(
        f"it-poison-{RUN}-{SERVICE_LATENCY_INCREASED}", Schema(json.dumps(rogue), "AVRO")
    )
    return ids


@pytest.fixture(scope="module")
def database(stack: StackSettings) -> str:
    return migrated_database(stack, DB)


@pytest.fixture()
def topic(stack: StackSettings) -> Iterator[str]:
    with fresh_topic(stack.kafka_bootstrap, "it-poison") as name:
        yield name


def effects(stack: StackSettings, incident: str) -> list[str]:
    with psycopg.connect(stack.pg_dsn(DB)) as conn:
        rows = conn.execute("SELECT event_id FROM effects WHERE incident_id = %s", (incident,)).fetchall()
    return [r[0] for r in rows]


def framed(schema_id: int, body: bytes) -> bytes:
    return struct.pack(">bI", 0, schema_id) + body


def test_fuzzed_framings_with_registered_ids_of_every_kind_never_crash_decoding(
    stack: StackSettings, serde: AvroSerde, poison_ids: dict[str, int]
) -> None:
    """The loop's decoder and the audit's recorder, against the real registry: 0 crashes."""
    loop, pool = build_loop(stack, topic="incidents", database="flotilla", group=f"it-poison-fuzz-{RUN}")
    pool.close()
    fresh = AvroSerde(registry_client(stack.schema_registry_url))  # nothing cached from writing
    recorder = Recorder(fresh, Signer(Ed25519PrivateKey.generate()), Provenance.parse(producer_keys()))
    good_payload, good_env = latency_fact(f"incident-{RUN}")
    good = serde.serialize("incidents", SERVICE_LATENCY_INCREASED, good_payload)
    ids = [*poison_ids.values(), struct.unpack(">I", good[1:5])[0]]
    outcomes: dict[str, int] = {}

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(
        schema_id=st.sampled_from(ids) | st.integers(0, 2**31),
        body=st.binary(max_size=48) | st.integers(0, len(good) - 5).map(lambda cut: good[5 : 5 + cut]),
        magic=st.sampled_from([0, 0, 0, 1, 255]),
    )
    def decode(schema_id: int, body: bytes, magic: int) -> None:
        value = struct.pack(">BI", magic, schema_id) + body
        msg = FakeMessage(topic="incidents", key=b"k", value=value, headers=good_env.headers())
        item = loop._decode(msg)  # must not raise
        kind = "handled" if item.incoming is not None else f"dead-letter:{item.letter.reason.value}"  # type: ignore[union-attr]
        outcomes[kind] = outcomes.get(kind, 0) + 1
        entry = recorder.entry(msg, 1, datetime.now(UTC))  # must not raise either
        assert (entry.decode_error is None) == (entry.record_type is not None)
        assert entry.verified_by is None and entry.unverified is not None  # nobody signed it

    decode()
    assert any(k.startswith("dead-letter:undecodable") for k in outcomes), outcomes
    for name, schema_id in poison_ids.items():
        item = loop._decode(
            FakeMessage(topic="incidents", value=framed(schema_id, b"\x02a"), headers=good_env.headers())
        )
        assert item.letter is not None, name


def test_a_record_framed_with_a_non_record_schema_id_is_dead_lettered_and_the_partition_moves_on(
    stack: StackSettings, serde: AvroSerde, poison_ids: dict[str, int], database: str, topic: str
) -> None:
    incident = f"incident-{uuid.uuid4().hex[:8]}"  # one key, one partition: poison first
    records: list[tuple[str, bytes | None, list[tuple[str, bytes]]]] = []
    envelopes: dict[str, str] = {}
    for name, schema_id in poison_ids.items():
        env = Envelope(type=SERVICE_LATENCY_INCREASED, source="/tests/poison", correlationid=incident)
        envelopes[env.id] = name
        records.append((incident, framed(schema_id, b"\x06abc"), env.headers()))
    value, good_env = latency_fact(incident)
    records.append((incident, serde.serialize("incidents", SERVICE_LATENCY_INCREASED, value), good_env.headers()))
    produce(stack, topic, records)

    loop, pool = build_loop(stack, topic=topic, database=database, group=f"g-{topic}")
    try:
        drain(loop, len(records))
    finally:
        pool.close()
    assert effects(stack, incident) == [good_env.id]  # the record behind the poison was handled

    reader = dlq_reader(stack, topic)
    seen: dict[str, dict[str, Any]] = {}
    try:
        while len(seen) < len(envelopes):
            msg = wait_for(reader, lambda m: True, timeout=30)
            seen[(header(msg, "ce_id") or b"").decode()] = {k: (v or b"").decode() for k, v in msg.headers() or []}
    finally:
        reader.close()
    assert set(seen) == set(envelopes)
    for event_id, headers in seen.items():
        assert headers["dlq_reason"] == "undecodable", (envelopes[event_id], headers)
        assert headers["dlq_error_class"] == "UndecodableRecordError", (envelopes[event_id], headers)
