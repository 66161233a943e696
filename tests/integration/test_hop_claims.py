"""A record dropped for its spent hop budget claims its drop, not its event id (security
review 3, L1): ``ce_hops`` is outside the producer's signature, so a copy of a genuine record
with ``ce_hops: 0`` verifies; claimed by the event id, it would make the genuine record that
follows a duplicate, never handled. On the real loop, Kafka and PostgreSQL."""

from __future__ import annotations

import dataclasses
import uuid

import psycopg

from flotilla.serde import AvroSerde
from flotilla.settings import StackSettings

from .loop_worker import build_loop

# the loop tests' own database and a fresh 3-partition topic (one incident: one partition)
from .test_consumer_loop import DB, database, drain, effects, fact, produce, topic  # noqa: F401


def test_a_spent_copy_first_does_not_pre_empt_the_genuine_record(
    stack: StackSettings,
    serde: AvroSerde,
    database: str,  # noqa: F811  (the imported fixture)
    topic: str,  # noqa: F811
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
