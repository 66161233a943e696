"""Two misconfigured handlers that answer each other forever: the hop budget cuts the loop.

Handler A turns every record on the ping topic into one on the pong topic; handler B
does the reverse. Each caused record carries one hop fewer, so a chain started with
``ce_hops=N`` produces exactly N records before one arrives with no hops left, is
dropped, and is reported once as LoopTerminated.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from flotilla_ops.samples import sample_value
from psycopg_pool import ConnectionPool

from flotilla.bootstrap import bootstrap_outbox, drop_outbox
from flotilla.consumer import ConsumerLoop, LoopConfig, migrate
from flotilla.contracts import Contract, load_contracts, register
from flotilla.envelope import Envelope
from flotilla.handling import HandlerContext
from flotilla.records import BY_TYPE
from flotilla.serde import AvroSerde
from flotilla.settings import StackSettings
from tests.support.producing import ordered_producer

pytestmark = pytest.mark.timeout(240)

REQUEST = "dev.flotilla.incidents.DiagnosisRequested"
HOPS = 12


@pytest.fixture()
def ping_pong(stack: StackSettings, registry: SchemaRegistryClient) -> Iterator[tuple[str, str, str, str]]:
    suffix = uuid.uuid4().hex[:6]
    ping, pong = f"it-ping-{suffix}", f"it-pong-{suffix}"
    admin = AdminClient({"bootstrap.servers": stack.kafka_bootstrap})
    for fut in admin.create_topics([NewTopic(t, 1, 1) for t in (ping, pong, f"{ping}.dlq", f"{pong}.dlq")]).values():
        fut.result(15)
    schema = next(c.schema for c in load_contracts() if c.full_name == REQUEST)
    for topic in (ping, pong):
        register(registry, Contract(topic, schema))
    db_a, db_b = f"flotilla_it_ping_{suffix}", f"flotilla_it_pong_{suffix}"
    for db in (db_a, db_b):
        bootstrap_outbox(stack, db)
        with psycopg.connect(stack.pg_dsn(db), autocommit=True) as conn:
            migrate(conn)
    yield ping, pong, db_a, db_b
    for db in (db_a, db_b):
        drop_outbox(stack, db)
    admin.delete_topics([ping, pong, f"{ping}.dlq", f"{pong}.dlq"])
    for topic in (ping, pong):
        subject = Contract(topic, schema).subject
        registry.delete_subject(subject)
        registry.delete_subject(subject, permanent=True)


def bouncer(target: str) -> Any:
    def bounce(ctx: HandlerContext) -> None:
        value = {k: v for k, v in ctx.incoming.value.items() if k != "eventId"}
        ctx.emit(BY_TYPE[REQUEST].from_value(value), key=ctx.incoming.envelope.correlationid, topic=target)

    return {REQUEST: bounce}


def loop(stack: StackSettings, serde: AvroSerde, db: str, consume: str, emit: str) -> tuple[ConsumerLoop, Any]:
    pool: ConnectionPool[Any] = ConnectionPool(
        stack.pg_dsn(db), min_size=1, max_size=2, kwargs={"autocommit": True}, open=True
    )
    config = LoopConfig(name=f"bouncer-{db}", topics=(consume,), source=f"/tests/{db}", follow_workflow=False)
    return ConsumerLoop(config, stack, serde, pool, bouncer(emit)), pool


def outbox(stack: StackSettings, db: str) -> list[tuple[str, str]]:
    with psycopg.connect(stack.pg_dsn(db)) as conn:
        return [(r[0], r[1]) for r in conn.execute("SELECT type, ce_hops FROM outbox ORDER BY created_at").fetchall()]


def _terminated(stack: StackSettings, *databases: str) -> bool:
    return any(kind.endswith("LoopTerminated") for db in databases for kind, _ in outbox(stack, db))


def test_a_ping_pong_loop_is_cut_by_the_hop_budget(
    stack: StackSettings, serde: AvroSerde, ping_pong: tuple[str, str, str, str]
) -> None:
    ping, pong, db_a, db_b = ping_pong
    incident = f"incident-loop-{uuid.uuid4().hex[:6]}"
    schema = next(c.schema for c in load_contracts() if c.full_name == REQUEST)
    first = sample_value(schema, incidentId=incident)
    envelope = Envelope(type=REQUEST, source="/tests", correlationid=incident, id=first["eventId"], hops=HOPS)
    producer = ordered_producer(stack.kafka_bootstrap)
    producer.produce(ping, key=incident, value=serde.serialize(ping, REQUEST, first), headers=envelope.headers())
    assert producer.flush(10) == 0

    a, pool_a = loop(stack, serde, db_a, ping, pong)
    b, pool_b = loop(stack, serde, db_b, pong, ping)
    try:
        # Until the loop was reported cut, then a quiet while for any record after it (a
        # quiet spell alone could be one slow Debezium hop, not the end of the loop).
        quiet_since = time.monotonic()
        deadline = time.monotonic() + 120
        while not (time.monotonic() - quiet_since >= 2 and _terminated(stack, db_a, db_b)):
            assert time.monotonic() < deadline, "the loop was not cut within 120 s"
            if a.poll_once() + b.poll_once():
                quiet_since = time.monotonic()
    finally:
        pool_a.close()
        pool_b.close()

    emitted = outbox(stack, db_a) + outbox(stack, db_b)
    bounced = [hops for kind, hops in emitted if kind == REQUEST]
    reports = [hops for kind, hops in emitted if kind.endswith("LoopTerminated")]
    # hops HOPS-1 … 0: HOPS records, then the one with no hops left is dropped and reported once
    assert sorted(int(h) for h in bounced) == list(range(HOPS))
    assert len(reports) == 1
    print(f"\nping-pong started with ce_hops={HOPS}: {len(bounced)} records bounced, then 1 LoopTerminated")
