"""Small Kafka helpers for tests: a consumer positioned at the end, and waiting for records."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from confluent_kafka import Consumer, Message, TopicPartition


def tail_consumer(bootstrap: str, topic: str) -> Consumer:
    """A consumer assigned every partition of ``topic`` at its current end offset.

    Offsets are resolved here, synchronously: with ``auto.offset.reset=latest`` they
    would be resolved at the first fetch, and a record produced in between is skipped.
    """
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"test-{uuid.uuid4()}", "enable.auto.commit": False}
    )
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    assignment = []
    for partition in partitions:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
        assignment.append(TopicPartition(topic, partition, high))
    consumer.assign(assignment)
    return consumer


def wait_for(consumer: Consumer, match: Callable[[Message], bool], timeout: float = 30) -> Message:
    """The first record for which ``match`` is true; fails the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is None or msg.error():
            continue
        if match(msg):
            return msg
    raise AssertionError(f"no matching record within {timeout:.0f} s")


def header(msg: Message, name: str) -> bytes | None:
    for key, value in msg.headers() or []:
        if key == name:
            return value
    return None


def by_event_id(event_id: str) -> Callable[[Message], bool]:
    return lambda msg: header(msg, "ce_id") == event_id.encode()
