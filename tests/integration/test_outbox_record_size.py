"""A record over the outbox's limit on real PostgreSQL and a real connector: Outbox.row
refuses it where it is made, the transaction that would have carried it (state change
included) never commits, and the outbox's connector goes on publishing the next record
(security review 3, H2: a 1.1 MB row used to fail the connector's task on every restart)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer
from flotilla_ops.samples import latency_fact

from flotilla.bootstrap import bootstrap_outbox, drop_outbox
from flotilla.bounds import DEFAULT_MAX_RECORD_BYTES, KAFKA_MAX_REQUEST_BYTES
from flotilla.outbox import Outbox, RecordTooLargeError
from flotilla.records import ServiceLatencyIncreased
from flotilla.serde import AvroSerde
from flotilla.settings import StackSettings

from .kafka_wait import by_event_id, header, tail_consumer, wait_for

DB = "flotilla_it_record_size"

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


def _open(conn: psycopg.Connection[Any], outbox: Outbox, incident: str, service: str) -> bytes:
    """The state change and its record, in the caller's transaction (as every service does)."""
    value, env = latency_fact(incident, service=service)
    conn.execute("INSERT INTO incident_state (incident_id, status) VALUES (%s, 'detected')", (incident,))
    return outbox.append(conn, ServiceLatencyIncreased.from_value(value), env, key=incident)


def _committed(stack: StackSettings, incident: str) -> tuple[int, int]:
    with psycopg.connect(stack.pg_dsn(DB)) as conn:
        state = conn.execute("SELECT count(*) FROM incident_state WHERE incident_id = %s", (incident,)).fetchone()
        rows = conn.execute("SELECT count(*) FROM outbox WHERE aggregateid = %s", (incident,)).fetchone()
    assert state is not None and rows is not None
    return int(state[0]), int(rows[0])


def test_a_record_over_the_limit_is_refused_nothing_commits_and_the_next_one_is_published(
    stack: StackSettings, serde: AvroSerde, incidents: Consumer
) -> None:
    outbox = Outbox(serde)  # the fleet's default limit (FLOTILLA_OUTBOX_MAX_RECORD_BYTES)
    refused = f"incident-{uuid.uuid4().hex[:8]}"
    # the review's attack: a 1.1 MB self-declared service name, over what Kafka takes
    with pytest.raises(RecordTooLargeError) as caught, psycopg.connect(stack.pg_dsn(DB)) as conn:
        _open(conn, outbox, refused, "s" * 1_100_000)
    error = caught.value
    assert error.size > KAFKA_MAX_REQUEST_BYTES and error.limit == DEFAULT_MAX_RECORD_BYTES
    assert (error.type, error.topic) == (ServiceLatencyIncreased.TYPE, "incidents")
    assert f"{error.size} bytes" in str(error) and f"limit of {DEFAULT_MAX_RECORD_BYTES} bytes" in str(error)
    assert _committed(stack, refused) == (0, 0)  # the state change went with it

    # a configured lower limit holds the same way, just above an ordinary record
    small = Outbox(serde, max_record_bytes=1024)
    with pytest.raises(RecordTooLargeError), psycopg.connect(stack.pg_dsn(DB)) as conn:
        _open(conn, small, refused, "checkout-api-" + "x" * 1000)
    assert _committed(stack, refused) == (0, 0)

    # the connector was never given the oversized row: the next record flows
    published = f"incident-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(stack.pg_dsn(DB)) as conn:
        payload = _open(conn, small, published, "checkout-api")
    assert _committed(stack, published) == (1, 1)
    with psycopg.connect(stack.pg_dsn(DB)) as conn:
        row = conn.execute("SELECT id FROM outbox WHERE aggregateid = %s", (published,)).fetchone()
    assert row is not None
    msg = wait_for(incidents, by_event_id(str(row[0])), timeout=60)
    assert msg.value() == payload and header(msg, "ce_type") == ServiceLatencyIncreased.TYPE.encode()
