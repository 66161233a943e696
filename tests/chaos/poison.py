"""Poison among the real records: what a broken producer or an attacker puts on a topic."""

from __future__ import annotations

import os
import uuid
from functools import partial

from confluent_kafka import KafkaError, Message

from flotilla.settings import StackSettings
from tests.support.producing import ordered_producer

# Each kind fails differently at the consumers: bytes that are no Avro at all under a
# plausible envelope, and an Avro-looking frame naming a schema id the registry never issued.
KINDS = {
    "not-avro": lambda: os.urandom(48),
    "unknown-schema": lambda: b"\x00\x7f\xff\xff\xf0" + os.urandom(16),
}


def publish(stack: StackSettings, count: int) -> dict[str, tuple[str, int, int]]:
    """``count`` poison records on ``incidents`` and ``commands``; their event id ->
    (topic, partition, offset) as Kafka acknowledged them."""
    producer = ordered_producer(stack.kafka_bootstrap, **{"delivery.timeout.ms": 120_000})
    where: dict[str, tuple[str, int, int]] = {}
    failures: list[str] = []

    def delivered(event_id: str, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            failures.append(f"{event_id}: {err}")
        else:
            where[event_id] = (msg.topic() or "", msg.partition() or 0, msg.offset() or 0)

    kinds = list(KINDS.items())
    for i in range(count):
        topic = ("incidents", "commands")[i % 2]
        kind, payload = kinds[(i // 2) % len(kinds)]
        event_id = str(uuid.uuid4())
        headers = {
            "ce_id": event_id,
            "ce_specversion": "1.0",
            "ce_source": "/chaos/poison",
            "ce_type": f"dev.flotilla.chaos.{kind}",
            "ce_correlationid": f"chaos-poison-{event_id[:8]}",
            "ce_hops": "16",  # a fresh record's budget: 0 would be dropped as a spent loop, unread
        }
        producer.produce(
            topic,
            key=f"poison-{i}",
            value=payload(),
            headers=list(headers.items()),
            on_delivery=partial(delivered, event_id),
        )
    producer.flush(150)
    assert not failures and len(where) == count, f"poison not delivered: {failures}"
    return where
