"""The raw loop (audit, DLQ reconciler) on the real broker: every record handled once,
offsets committed after the transaction, and consumer lag read from librdkafka."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from confluent_kafka import Message
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client import REGISTRY
from psycopg_pool import ConnectionPool

from flotilla.rawloop import RawLoop
from flotilla.settings import StackSettings
from tests.support.producing import ordered_producer

pytestmark = pytest.mark.timeout(120)


@pytest.fixture()
def topic(stack: StackSettings) -> Iterator[str]:
    name = f"it-raw-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": stack.kafka_bootstrap})
    for future in admin.create_topics([NewTopic(name, num_partitions=2, replication_factor=1)]).values():
        future.result(30)
    yield name
    admin.delete_topics([name])


@pytest.fixture()
def pool(stack: StackSettings) -> Iterator[ConnectionPool[Any]]:
    with ConnectionPool(stack.pg_dsn(stack.pg_database), min_size=1, max_size=1, open=True) as opened:
        yield opened


def _lag(group: str, topic: str, partition: int) -> float | None:
    return REGISTRY.get_sample_value(
        "flotilla_consumer_lag", {"consumer": group, "topic": topic, "partition": str(partition)}
    )


def test_every_record_is_handled_in_a_transaction_and_the_lag_drains_to_zero(
    stack: StackSettings, topic: str, pool: ConnectionPool[Any]
) -> None:
    producer = ordered_producer(stack.kafka_bootstrap)
    for i in range(6):
        producer.produce(topic, key=f"k{i}", value=f"not avro {i}".encode(), partition=i % 2)
    assert producer.flush(10) == 0

    handled: list[tuple[int, int]] = []

    def handle(conn: psycopg.Connection[Any], records: list[Message]) -> None:
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        handled.extend((m.partition() or 0, m.offset() or 0) for m in records)

    group = f"it-raw-{uuid.uuid4().hex[:8]}"
    loop = RawLoop(
        group=group, topics=[topic], bootstrap=stack.kafka_bootstrap, pool=pool, handle=handle, stats_interval_ms=100
    )
    try:
        deadline = time.monotonic() + 30
        while len(handled) < 6 and time.monotonic() < deadline:
            loop.poll_once()
        assert sorted(handled) == [(p, o) for p in (0, 1) for o in range(3)]

        # The statistics arrive on later polls; the committed offsets are at the end.
        deadline = time.monotonic() + 10
        while (_lag(group, topic, 0), _lag(group, topic, 1)) != (0, 0) and time.monotonic() < deadline:
            assert loop.poll_once() == 0
        assert (_lag(group, topic, 0), _lag(group, topic, 1)) == (0, 0)
    finally:
        loop.close()
    assert _lag(group, topic, 0) is None  # a closed loop leaves no series behind
