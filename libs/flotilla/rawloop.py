"""A consumer loop over raw records: one transaction per poll batch, nothing decoded.

:class:`flotilla.consumer.ConsumerLoop` is built for business effects: it decodes every
record, dead-letters what it cannot decode *before* any handler runs, and dedupes by
event id. Two services need the records themselves instead:

- the DLQ reconciler reads ``*.dlq``, whose values are by definition the ones that did
  not decode or validate: the decoding loop would dead-letter them again;
- the audit log records every record as it sits on its topic, identified by
  (topic, partition, offset), including duplicates and re-queued copies that carry an
  event id already seen, which the loop's event-id dedupe would hide.

:class:`RawLoop` keeps the loop's discipline (one database transaction per poll batch,
Kafka offsets committed only after it commits, redelivery absorbed by the caller's own
dedupe key) and reports ``flotilla_consumer_lag`` the same way.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import psycopg
from confluent_kafka import Consumer, Message
from psycopg_pool import ConnectionPool

from flotilla import metrics
from flotilla.consumer import group_consumer_config, poll_batch, store_offsets
from flotilla.settings import KafkaTarget, kafka_connection

__all__ = ["AfterCommit", "BatchHandler", "RawLoop"]

log = logging.getLogger(__name__)

# A batch handler runs inside the batch's transaction; what it returns runs after the
# commit (metrics, logs: things that must not count a rolled-back batch).
AfterCommit = Callable[[], None]
BatchHandler = Callable[[psycopg.Connection[Any], list[Message]], AfterCommit | None]


class RawLoop:
    """Consume ``topics`` undecoded; ``handle`` each batch in one transaction, then store its offsets.

    A failed batch (the database is down, a deadlock) is retried in place with capped
    backoff until it commits or the loop is asked to stop; offsets of a batch that did
    not commit are never stored, so a restart redelivers it (as it may redeliver the
    last second's batches, whose stored offsets the group had not committed yet).
    Handlers must therefore be idempotent per record (both users dedupe by
    topic/partition/offset), and must not fail on content: they store bytes, so poison
    cannot block a partition here.
    """

    def __init__(
        self,
        *,
        group: str,
        topics: Sequence[str],
        bootstrap: KafkaTarget,
        pool: ConnectionPool[Any],
        handle: BatchHandler,
        batch_size: int = 200,
        poll_timeout: float = 0.2,
        backoff_max: float = 5.0,
        kafka: Mapping[str, str | int | bool] | None = None,
        stats_interval_ms: int = 5000,
    ) -> None:
        self.group = group
        self.topics = tuple(topics)
        self._pool = pool
        self._handle = handle
        self._batch_size = batch_size
        self._poll_timeout = poll_timeout
        self._backoff_max = backoff_max
        self._stopping = threading.Event()
        self._lag = metrics.ConsumerLag(group)
        self._kafka = group_consumer_config(
            kafka_connection(bootstrap),
            group,
            lag=self._lag,
            stats_interval_ms=stats_interval_ms,
            overrides=kafka or {},
        )
        self._consumer: Consumer | None = None  # made on first use: librdkafka connects as it is made
        self._subscribed = False

    @property
    def consumer(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(self._kafka)
        return self._consumer

    def kafka_config(self) -> dict[str, Any]:
        """The consumer's librdkafka configuration (``kafka`` overrides won)."""
        return dict(self._kafka)

    def stop(self) -> None:
        self._stopping.set()

    def run(self, stopping: threading.Event | None = None) -> None:
        """Poll until ``stop()`` (or ``stopping`` is set); always closes the consumer."""
        try:
            while not self._stopping.is_set() and not (stopping is not None and stopping.is_set()):
                self.poll_once(stopping)
        finally:
            self.close()

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
        self._lag.clear()

    def poll_once(self, stopping: threading.Event | None = None) -> int:
        """One poll batch, handled in a transaction and its offsets stored; returns how many records it held."""
        if not self._subscribed:
            self.consumer.subscribe(list(self.topics))
            self._subscribed = True
        # Take what is already fetched after the first record, without lingering.
        records = poll_batch(
            self.consumer, poll_timeout=self._poll_timeout, batch_size=self._batch_size, linger=0, name=self.group
        )
        if not records:
            return 0
        after = self._commit_batch(records, stopping)
        if after is None:
            return 0  # asked to stop before the batch committed: redelivered after a restart
        store_offsets(self.consumer, records)
        after()
        return len(records)

    def _halted(self, stopping: threading.Event | None) -> bool:
        return self._stopping.is_set() or (stopping is not None and stopping.is_set())

    def _commit_batch(self, records: list[Message], stopping: threading.Event | None) -> AfterCommit | None:
        attempt = 0
        while True:
            try:
                with self._pool.connection() as conn, conn.transaction():
                    after = self._handle(conn, records)
                return after or (lambda: None)
            except Exception:
                attempt += 1
                first, last = records[0], records[-1]
                log.exception(
                    "%s: batch %s[%s]@%s..%s[%s]@%s failed (attempt %d); retrying in place",
                    self.group,
                    first.topic(),
                    first.partition(),
                    first.offset(),
                    last.topic(),
                    last.partition(),
                    last.offset(),
                    attempt,
                )
                if self._halted(stopping):
                    return None
                time.sleep(min(self._backoff_max, 0.05 * 2 ** min(attempt, 10)))
