"""A producer for tests that publish records whose order matters."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Producer

from flotilla.settings import KafkaTarget, kafka_connection


def ordered_producer(bootstrap: KafkaTarget, **config: Any) -> Producer:
    """A producer that keeps each partition's records in the order they were produced.

    librdkafka's defaults do not: with several requests in flight, a request retried
    after a transient error (typical on a topic created a moment ago) can land after the
    next one, and a consumer then sees, say, DiagnosisRequested before the
    ServiceLatencyIncreased that caused it. Idempotence makes the broker keep the order
    (and drop a retried duplicate); nothing lingers, so a test waits for no batch.
    """
    return Producer(
        {**kafka_connection(bootstrap), "enable.idempotence": True, "acks": "all", "linger.ms": 0, **config}
    )
