"""The whole outbox path on the real stack.

state change + outbox row (one transaction) → PostgreSQL WAL → Debezium (pgoutput,
filtered publication) → Outbox Event Router → our DropNullHeaders → Kafka topic →
consumer decoding through the registry, and the official CloudEvents SDK reading the
record. A root record (no cause) has a NULL ``ce_causationid`` column, which the router
alone would publish as a header with a null value (the SDK refuses that); with the
transform the header is absent.
"""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer
from confluent_kafka.schema_registry import SchemaRegistryClient
from flotilla_ops.samples import SERVICE_LATENCY_INCREASED as LATENCY
from flotilla_ops.samples import latency_fact

from flotilla import connectors
from flotilla.bootstrap import bootstrap_outbox, drop_outbox
from flotilla.contracts import Contract, IncompatibleSchemaError, load_contracts, register
from flotilla.envelope import CONTENT_TYPE, Envelope
from flotilla.outbox import Outbox
from flotilla.records import ServiceLatencyIncreased
from flotilla.registry import registrar_client, registry_client
from flotilla.serde import AvroSerde, RecordValidationError
from flotilla.settings import StackSettings

from ..cloudevents_conformance import assert_conformant, null_valued_headers
from ..poms import TRANSFORMS_POM, pom_text
from .kafka_wait import by_event_id, header, read_until_all, tail_consumer, wait_for

DB = "flotilla_it_outbox"

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def outbox_db(stack: StackSettings, serde: AvroSerde) -> Iterator[str]:
    bootstrap_outbox(stack, DB)
    with psycopg.connect(stack.pg_dsn(DB)) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS incident_state (incident_id text PRIMARY KEY, status text NOT NULL)")
    yield DB
    drop_outbox(stack, DB)


@pytest.fixture()
def incidents(stack: StackSettings, outbox_db: str) -> Iterator[Consumer]:
    consumer = tail_consumer(stack.kafka_bootstrap, "incidents")
    yield consumer
    consumer.close()


def _open_incident(conn: psycopg.Connection[Any], outbox: Outbox, incident: str) -> tuple[bytes, Envelope]:
    value, env = latency_fact(incident)
    conn.execute("INSERT INTO incident_state (incident_id, status) VALUES (%s, 'detected')", (incident,))
    payload = outbox.append(conn, ServiceLatencyIncreased.from_value(value), env, key=incident)
    return payload, env


def _row_counts(stack: StackSettings, incident: str) -> tuple[int, int]:
    with psycopg.connect(stack.pg_dsn(DB)) as conn:
        state = conn.execute("SELECT count(*) FROM incident_state WHERE incident_id = %s", (incident,)).fetchone()
        rows = conn.execute("SELECT count(*) FROM outbox WHERE aggregateid = %s", (incident,)).fetchone()
    assert state is not None and rows is not None
    return int(state[0]), int(rows[0])


def test_contracts_are_registered_under_topic_record_subjects(registry: SchemaRegistryClient) -> None:
    subjects = set(registry.get_subjects())
    for contract in load_contracts():
        assert contract.subject in subjects
        registered = json.loads(registry.get_latest_version(contract.subject).schema.schema_str or "{}")
        assert registered["name"] == contract.schema["name"]
        assert [f["name"] for f in registered["fields"]] == [f["name"] for f in contract.schema["fields"]]  # type: ignore[union-attr]


def test_registry_enforces_backward_compatibility_globally(stack: StackSettings) -> None:
    with urllib.request.urlopen(f"{stack.schema_registry_url}/config", timeout=5) as resp:
        assert json.loads(resp.read())["compatibilityLevel"] == "BACKWARD"

    client = registrar_client(stack)  # it registers and deletes: the registrar
    topic = f"it-compat-{uuid.uuid4().hex[:8]}"
    v1 = {
        "type": "record",
        "name": "Probe",
        "namespace": "dev.flotilla.tests",
        "fields": [{"name": "a", "type": "string"}],
    }
    subject = Contract(topic, v1).subject
    try:
        register(client, Contract(topic, v1))
        required_b = {**v1, "fields": [*v1["fields"], {"name": "b", "type": "int"}]}  # type: ignore[list-item]
        with pytest.raises(IncompatibleSchemaError, match=rf"{topic}-dev.flotilla.tests.Probe.*incompatible"):
            register(client, Contract(topic, required_b))
        defaulted_b = {**v1, "fields": [*v1["fields"], {"name": "b", "type": "int", "default": 0}]}  # type: ignore[list-item]
        assert register(client, Contract(topic, defaulted_b)) > 0
    finally:  # leave the registry as we found it
        client.delete_subject(subject)
        client.delete_subject(subject, permanent=True)


def test_record_reaches_its_topic_keyed_with_payload_and_cloudevents_headers(
    stack: StackSettings, serde: AvroSerde, incidents: Consumer
) -> None:
    incident = f"incident-{uuid.uuid4().hex[:8]}"
    value, env = latency_fact(incident)
    with psycopg.connect(stack.pg_dsn(DB)) as conn:
        conn.execute("INSERT INTO incident_state (incident_id, status) VALUES (%s, 'detected')", (incident,))
        payload = Outbox(serde).append(conn, ServiceLatencyIncreased.from_value(value), env, key=incident)

    msg = wait_for(incidents, by_event_id(env.id))
    assert msg.topic() == "incidents"  # routed by aggregatetype
    assert msg.key() == incident.encode()  # keyed by aggregateid
    assert msg.value() == payload  # passed through byte for byte
    assert payload[0] == 0  # Confluent frame: magic byte, then the schema id
    expected = {
        "ce_id": env.id,
        "ce_type": LATENCY,
        "ce_source": "/flotilla/health-agent",
        "ce_specversion": "1.0",
        "ce_time": env.time,
        "ce_correlationid": incident,
        "ce_hops": str(env.hops),
        "ce_traceparent": env.traceparent,
        "content-type": CONTENT_TYPE,
    }
    for name, want in expected.items():
        assert header(msg, name) == want.encode(), name
    assert Envelope.from_headers(msg.headers()) == env

    # A consumer with its own registry client decodes through the registry.
    decoded = AvroSerde(registry_client(stack.schema_registry_url)).deserialize(msg.value())
    assert decoded.record_name == LATENCY
    assert decoded.value == {**value, "eventId": uuid.UUID(value["eventId"])}


def test_state_change_and_record_commit_together_or_not_at_all(
    stack: StackSettings, serde: AvroSerde, incidents: Consumer
) -> None:
    outbox = Outbox(serde)
    rolled_back = f"incident-{uuid.uuid4().hex[:8]}"
    with pytest.raises(RuntimeError, match="handler crashed"), psycopg.connect(stack.pg_dsn(DB)) as conn:
        _, lost_env = _open_incident(conn, outbox, rolled_back)
        raise RuntimeError("handler crashed after writing")
    assert _row_counts(stack, rolled_back) == (0, 0)

    committed = f"incident-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(stack.pg_dsn(DB)) as conn:
        _, kept_env = _open_incident(conn, outbox, committed)
    assert _row_counts(stack, committed) == (1, 1)

    # Records on one partition arrive in order; use a record on the rolled-back key's
    # partition as the sentinel after which the lost record can no longer appear.
    sentinel_env = Envelope(type=LATENCY, source="/flotilla/tests", correlationid=rolled_back)
    sentinel_value = {**latency_fact(rolled_back)[0], "eventId": sentinel_env.id}
    with psycopg.connect(stack.pg_dsn(DB)) as conn:
        outbox.append(conn, ServiceLatencyIncreased.from_value(sentinel_value), sentinel_env, key=rolled_back)

    # The kept record and the sentinel are on different partitions: either may come first.
    seen = [header(msg, "ce_id") for msg in read_until_all(incidents, {kept_env.id, sentinel_env.id})]
    assert lost_env.id.encode() not in seen


def test_invalid_record_is_refused_before_insert_naming_the_field(stack: StackSettings, serde: AvroSerde) -> None:
    incident = f"incident-{uuid.uuid4().hex[:8]}"
    value, env = latency_fact(incident)
    # A typed record cannot lack a field; a wrong type still gets through Python.
    bad = ServiceLatencyIncreased.from_value(value | {"p95LatencyMs": "very slow", "windowSeconds": 1.5})
    with pytest.raises(RecordValidationError) as caught, psycopg.connect(stack.pg_dsn(DB)) as conn:
        conn.execute("INSERT INTO incident_state (incident_id, status) VALUES (%s, 'detected')", (incident,))
        Outbox(serde).append(conn, bad, env, key=incident)
    message = str(caught.value)
    assert "field 'p95LatencyMs': expected double, got str 'very slow'" in message
    assert "field 'windowSeconds'" in message
    assert caught.value.subject == f"incidents-{LATENCY}"
    assert _row_counts(stack, incident) == (0, 0)


def test_rows_written_before_the_connector_exists_are_published(stack: StackSettings, serde: AvroSerde) -> None:
    late_db = f"flotilla_it_late_{uuid.uuid4().hex[:6]}"
    from flotilla.bootstrap import ensure_database
    from flotilla.outbox import migrate

    ensure_database(stack, late_db)
    with psycopg.connect(stack.pg_dsn(late_db)) as conn:
        migrate(conn)
        value, env = latency_fact(f"incident-{uuid.uuid4().hex[:8]}")
        payload = Outbox(serde).append(conn, ServiceLatencyIncreased.from_value(value), env, key=env.correlationid)
    consumer = Consumer(
        {
            "bootstrap.servers": stack.kafka_bootstrap,
            "group.id": f"test-{uuid.uuid4()}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe(["incidents"])
    try:
        bootstrap_outbox(stack, late_db)
        msg = wait_for(consumer, by_event_id(env.id), timeout=60)
        assert msg.value() == payload
    finally:
        consumer.close()
        drop_outbox(stack, late_db)


def test_connector_registration_is_idempotent(stack: StackSettings, outbox_db: str) -> None:
    name = connectors.connector_name(outbox_db)
    before = time.monotonic()
    connectors.register_connector(stack.connect_url, name, connectors.outbox_connector_config(outbox_db))
    connectors.wait_running(stack.connect_url, name, timeout=30)
    with urllib.request.urlopen(f"{stack.connect_url}/connectors/{name}/config", timeout=5) as resp:
        live = json.loads(resp.read())
    assert {k: v for k, v in live.items() if k != "name"} == connectors.outbox_connector_config(outbox_db)
    assert time.monotonic() - before < 30


def test_an_idle_connector_hands_a_row_over_at_once(
    stack: StackSettings, serde: AvroSerde, incidents: Consumer
) -> None:
    # Our task returns an empty batch to the worker only once per flotilla.idle.return.ms;
    # a row must still pass as soon as Debezium reads it, not at the next idle return.
    idle_return = int(connectors.outbox_connector_config(DB)["flotilla.idle.return.ms"]) / 1000
    hops = []
    for pause in (1.3, 2.1, 1.7, 2.6, 1.1):  # idle past an idle return, at different phases
        time.sleep(pause)
        incident = f"incident-{uuid.uuid4().hex[:8]}"
        with psycopg.connect(stack.pg_dsn(DB)) as conn:
            _, env = _open_incident(conn, Outbox(serde), incident)
        committed = time.monotonic()
        wait_for(incidents, by_event_id(env.id))
        hops.append(time.monotonic() - committed)
    hops.sort()
    assert hops[2] < idle_return / 3, f"median {hops[2]:.3f} s: rows wait for the idle return ({hops})"


def test_connect_runs_our_outbox_connector(stack: StackSettings, outbox_db: str) -> None:
    with urllib.request.urlopen(f"{stack.connect_url}/connector-plugins", timeout=10) as resp:
        plugins = {p["class"]: p for p in json.loads(resp.read())}
    assert plugins[connectors.OUTBOX_CONNECTOR_CLASS]["type"] == "source"
    name = connectors.connector_name(outbox_db)
    with urllib.request.urlopen(f"{stack.connect_url}/connectors/{name}/status", timeout=10) as resp:
        status = json.loads(resp.read())
    assert [t["state"] for t in status["tasks"]] == ["RUNNING"]


# ------------------------------------------------------- CloudEvents conformance


def test_connect_has_our_transform_and_the_connector_chains_it(stack: StackSettings, outbox_db: str) -> None:
    with urllib.request.urlopen(f"{stack.connect_url}/connector-plugins?connectorsOnly=false", timeout=10) as resp:
        plugins = {p["class"]: p for p in json.loads(resp.read())}
    ours = plugins.get(connectors.DROP_NULL_HEADERS)
    assert ours is not None, "DropNullHeaders is not on Connect's plugin.path"
    assert ours["type"] == "transformation" and ours["version"] == pom_text(TRANSFORMS_POM, "m:version")
    name = connectors.connector_name(outbox_db)
    with urllib.request.urlopen(f"{stack.connect_url}/connectors/{name}/config", timeout=10) as resp:
        live = json.loads(resp.read())
    assert live["transforms"] == "outbox,dropnulls,setaside"
    assert live["transforms.dropnulls.type"] == connectors.DROP_NULL_HEADERS
    # SetAside, last: a row too large for Kafka becomes a notice on <topic>.dlq (test_outbox_set_aside.py)
    aside = plugins.get(connectors.SET_ASIDE)
    assert aside is not None and aside["type"] == "transformation", "SetAside is not on Connect's plugin.path"
    assert live["transforms.setaside.type"] == connectors.SET_ASIDE


def test_a_root_record_has_no_causation_header_and_a_caused_one_has_it(
    stack: StackSettings, serde: AvroSerde, incidents: Consumer, outbox_db: str
) -> None:
    incident = f"incident-{uuid.uuid4().hex[:8]}"
    root_value, root = latency_fact(incident)
    assert root.causationid is None
    caused = root.caused(root.type, "/flotilla/tests")
    caused_value = {**latency_fact(incident)[0], "eventId": caused.id}
    outbox = Outbox(serde)
    with psycopg.connect(stack.pg_dsn(outbox_db)) as conn:
        outbox.append(conn, ServiceLatencyIncreased.from_value(root_value), root, key=incident)
        outbox.append(conn, ServiceLatencyIncreased.from_value(caused_value), caused, key=incident)
    with psycopg.connect(stack.pg_dsn(outbox_db)) as conn:
        stored = conn.execute("SELECT ce_causationid FROM outbox WHERE id = %s", (root.id,)).fetchone()
    assert stored == (None,), "the root row's column is NULL: the case the transform exists for"

    by_id = {(header(msg, "ce_id") or b"").decode(): msg for msg in read_until_all(incidents, {root.id, caused.id}, 60)}
    root_msg, caused_msg = by_id[root.id], by_id[caused.id]

    root_names = [name for name, _ in root_msg.headers() or []]
    assert "ce_causationid" not in root_names, root_names
    assert null_valued_headers(root_msg.headers()) == []
    assert Envelope.from_headers(root_msg.headers()) == root
    root_event = assert_conformant(root_msg, caused_by=None)
    assert "causationid" not in root_event.get_attributes()

    assert header(caused_msg, "ce_causationid") == root.id.encode()
    assert null_valued_headers(caused_msg.headers()) == []
    caused_event = assert_conformant(caused_msg, caused_by=root.id)
    assert caused_event.get_extension("causationid") == root.id

    # Debezium's own `id` header and every CloudEvents header survive, in the router's order.
    assert root_names == ["id", "ce_id", "ce_type", "ce_specversion", "ce_source", "ce_time",
                          "ce_correlationid", "ce_hops", "ce_traceparent", "content-type"]  # fmt: skip
