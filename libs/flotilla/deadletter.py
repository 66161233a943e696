"""Dead letters: a record that cannot be processed goes to ``<topic>.dlq`` and the
consumer moves on.

The dead letter keeps the original key, value bytes and headers untouched (so an
operator can re-queue it with its original identity) and adds context headers saying
where it came from and why it failed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import UTC, datetime

from confluent_kafka import Message, Producer

from flotilla.envelope import header_pairs
from flotilla.settings import KafkaTarget, kafka_connection


class Reason(enum.StrEnum):
    UNDECODABLE = "undecodable"  # not a framed Avro value, or no valid CloudEvents envelope
    UNKNOWN_SCHEMA = "unknown-schema"  # the frame names a schema id the registry does not know
    INVALID_RECORD = "invalid-record"  # decodes, but breaks a business rule or its envelope
    RETRIES_EXHAUSTED = "retries-exhausted"  # the handler kept failing
    UNAUTHORIZED = "unauthorized"  # decodes, but its signature does not hold (flotilla.authority)
    # never published: Kafka would refuse the outbox row (too large); Connect sets it aside
    # as a notice on <topic>.dlq (dev.flotilla.connect.SetAside; docs/operations/delivery.md)
    UNPUBLISHABLE = "unpublishable"


# Context header names, all prefixed so they never collide with ce_* attributes.
ORIGIN_TOPIC = "dlq_origin_topic"
ORIGIN_PARTITION = "dlq_origin_partition"
ORIGIN_OFFSET = "dlq_origin_offset"
CONSUMER = "dlq_consumer"
REASON = "dlq_reason"
ERROR_CLASS = "dlq_error_class"
ERROR_MESSAGE = "dlq_error_message"
FIRST_FAILURE_TIME = "dlq_first_failure_time"
ATTEMPTS = "dlq_attempts"

_MAX_MESSAGE = 2000


# A topic's dead letters go to the topic of its name plus this (the consumers' and SetAside's).
DLQ_SUFFIX = ".dlq"


def dlq_topic(topic: str) -> str:
    return f"{topic}{DLQ_SUFFIX}"


@dataclass(frozen=True)
class DeadLetter:
    """Why one record could not be processed."""

    reason: Reason
    error: BaseException
    first_failure: datetime
    attempts: int = 1

    def headers(self, msg: Message, consumer: str) -> list[tuple[str, str | bytes | None]]:
        """The original headers followed by the context headers."""
        context = {
            ORIGIN_TOPIC: msg.topic() or "",
            ORIGIN_PARTITION: str(msg.partition()),
            ORIGIN_OFFSET: str(msg.offset()),
            CONSUMER: consumer,
            REASON: self.reason.value,
            ERROR_CLASS: type(self.error).__name__,
            ERROR_MESSAGE: str(self.error)[:_MAX_MESSAGE],
            FIRST_FAILURE_TIME: self.first_failure.isoformat(timespec="milliseconds"),
            ATTEMPTS: str(self.attempts),
        }
        original: list[tuple[str, str | bytes | None]] = list(header_pairs(msg.headers()))
        return original + [(k, v.encode()) for k, v in context.items()]


class DeadLetterPublisher:
    """Produces dead letters; ``flush`` makes them durable before the caller commits."""

    def __init__(self, bootstrap: KafkaTarget, consumer: str) -> None:
        self._consumer = consumer
        self._config = {**kafka_connection(bootstrap), "enable.idempotence": True, "acks": "all", "linger.ms": 0}
        # Made with the first dead letter: librdkafka connects as a client is made, and
        # most loops never dead-letter anything.
        self._producer: Producer | None = None
        self._failed: list[str] = []

    def publish(self, msg: Message, letter: DeadLetter) -> None:
        if self._producer is None:
            self._producer = Producer(self._config)
        self._producer.produce(
            dlq_topic(msg.topic() or "unknown"),
            key=msg.key(),
            value=msg.value(),
            headers=letter.headers(msg, self._consumer),
            on_delivery=self._delivered,
        )

    def _delivered(self, err: object, msg: Message) -> None:
        if err is not None:
            self._failed.append(str(err))

    def flush(self, timeout: float = 30) -> None:
        """Block until every dead letter is acknowledged; raise if any was not."""
        remaining = 0 if self._producer is None else self._producer.flush(timeout)
        failed, self._failed = self._failed, []
        if remaining or failed:
            raise RuntimeError(f"dead letters not acknowledged: {remaining} pending, errors {failed}")


def now() -> datetime:
    return datetime.now(UTC)
