"""Reading a topic from "now" on, for tools, demos, benchmarks and tests.

Not the services' consumer loop (that one commits offsets after its database
transaction); this is a throwaway reader that never joins a group.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from confluent_kafka import Consumer, TopicPartition

from flotilla.envelope import RawHeaders, header_value
from flotilla.settings import KafkaTarget, kafka_connection


def tail_consumer(bootstrap: KafkaTarget, topic: str | Sequence[str], **config: str | int | bool) -> Consumer:
    """A consumer assigned every partition of ``topic`` (or topics) at its current end offset.

    Offsets are resolved here, synchronously: with ``auto.offset.reset=latest`` they
    would be resolved at the first fetch, and a record produced in between is skipped.
    """
    consumer = Consumer(
        {
            **kafka_connection(bootstrap),
            "group.id": f"flotilla-tail-{uuid.uuid4()}",
            "enable.auto.commit": False,
            **config,
        }
    )
    assignment = []
    for name in [topic] if isinstance(topic, str) else topic:
        for partition in consumer.list_topics(name, timeout=10).topics[name].partitions:
            _, high = consumer.get_watermark_offsets(TopicPartition(name, partition), timeout=10)
            assignment.append(TopicPartition(name, partition, high))
    consumer.assign(assignment)
    return consumer


def header(headers: RawHeaders, name: str) -> bytes | None:
    """The value of header ``name``; None when absent or when a ``ce_*`` header repeats
    (Kafka headers are a list: :func:`flotilla.envelope.header_value` decides for everyone)."""
    return header_value(headers, name)
