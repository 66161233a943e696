"""A record dropped for its spent hop budget claims its drop, not its event id (security
review 3, L1): ``ce_hops`` is outside the producer's signature, so a copy of a genuine record
with ``ce_hops: 0`` verifies; claimed by the event id, it would make the genuine record that
follows a duplicate, never handled. On the real loop, Kafka and PostgreSQL."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from flotilla.serde import AvroSerde
from flotilla.settings import StackSettings
from tests.support.databases import migrated_database

from .kafka_wait import fresh_topic
from .loop_worker import build_loop
from .test_consumer_loop import DB, drain, effects, fact, produce


@pytest.fixture(scope="module")
def database(stack: StackSettings) -> str:
    return migrated_database(stack, DB)


@pytest.fixture()
def topic(stack: StackSettings) -> Iterator[str]:
    with fresh_topic(stack.kafka_bootstrap, "it-hop-claims", partitions=1) as name:
        yield name


def test_a_spent_copy_first_does_not_pre_empt_the_genuine_record(
    stack: StackSettings, serde: AvroSerde, database: str, topic: str
) -> None:
    incident = f"incident-{uuid.uuid4().hex[:8]}"
    payload, genuine = fact(serde, incident)
    spent = dataclasses.replace(genuine, hops=0)  # same id, same payload: only the unsigned ce_hops differs
    # the copy twice (a redelivery), then the genuine record, in one batch and across batches
    produce(stack, topic, [(incident, payload, spent.headers()), (incident, payload, spent.headers())])
    produce(stack, topic, [(incident, payload, genuine.headers()), (incident, payload, genuine.headers())])
    loop, pool = build_loop(stack, topic=topic, database=database, group=f"g-{topic}")
    try:
        drain(loop, 4)
    finally:
        pool.close()
    assert effects(stack, incident) == [genuine.id]  # handled once, despite the copy before it
    with psycopg.connect(stack.pg_dsn(DB)) as conn:
        claims = conn.execute(
            "SELECT event_id, outcome FROM processed_events WHERE consumer = %s ORDER BY event_id", (f"g-{topic}",)
        ).fetchall()
        reports = conn.execute(
            "SELECT count(*) FROM outbox WHERE aggregateid = %s AND type LIKE %s", (incident, "%LoopTerminated")
        ).fetchone()
    assert claims == [(genuine.id, "handled"), (f"loop-dropped:{genuine.id}", "loop-dropped")]
    assert reports == (1,)  # the spent copy is reported once, however often it is read
