"""Raw Kafka records: a consumer loop that does not decode, and helpers to show them.

The runtime's :class:`flotilla.consumer.ConsumerLoop` is built for business effects: it
decodes every record, dead-letters what it cannot decode *before* any handler runs,
and dedupes by event id. Two services need the records themselves instead:

- the DLQ reconciler reads ``*.dlq``, whose values are by definition the ones that did
  not decode or validate — the decoding loop would dead-letter them again (to a
  ``*.dlq.dlq`` topic that does not exist);
- the audit log records every record as it sits on its topic, identified by
  (topic, partition, offset), including duplicates and re-queued copies that carry an
  event id already seen, which the loop's event-id dedupe would hide.

:class:`RawLoop` keeps the loop's discipline — one database transaction per poll batch,
Kafka offsets committed only after it commits, redelivery absorbed by the caller's own
dedupe key — without decoding anything. It belongs in ``libs/flotilla`` (see the
report that came with it); it lives here until the library grows it, and the audit
service imports it from here.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
from confluent_kafka import Consumer, KafkaError, Message, TopicPartition
from psycopg_pool import ConnectionPool

from flotilla.envelope import RawHeaders, header_pairs
from flotilla.settings import KafkaTarget, kafka_connection

log = logging.getLogger(__name__)

# A batch handler runs inside the batch's transaction; what it returns runs after the
# commit (metrics, logs: things that must not count a rolled-back batch).
AfterCommit = Callable[[], None]
BatchHandler = Callable[[psycopg.Connection[Any], list[Message]], AfterCommit | None]


class RawLoop:
    """Consume ``topics`` undecoded; ``handle`` each batch in one transaction, then commit offsets.

    A failed batch (the database is down, a deadlock) is retried in place with capped
    backoff until it commits or the loop is asked to stop; offsets of a batch that did
    not commit are never committed, so a restart redelivers it. Handlers must therefore
    be idempotent per record (both users dedupe by topic/partition/offset), and must not
    fail on content: they store bytes, so poison cannot block a partition here.
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
    ) -> None:
        self.group = group
        self.topics = tuple(topics)
        self._pool = pool
        self._handle = handle
        self._batch_size = batch_size
        self._poll_timeout = poll_timeout
        self._backoff_max = backoff_max
        self._stopping = threading.Event()
        self._consumer = Consumer(
            {
                **kafka_connection(bootstrap),
                "group.id": group,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 50,
                **(kafka or {}),
            }
        )
        self._subscribed = False

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
        self._consumer.close()

    def poll_once(self, stopping: threading.Event | None = None) -> int:
        """One poll batch, handled and committed; returns how many records it held."""
        if not self._subscribed:
            self._consumer.subscribe(list(self.topics))
            self._subscribed = True
        # Wait for one record, then take what is already fetched: consume() with a timeout
        # would wait for a full batch.
        first = self._consumer.poll(self._poll_timeout)
        msgs = [] if first is None else [first, *self._consumer.consume(num_messages=self._batch_size - 1, timeout=0)]
        records = []
        for msg in msgs:
            err = msg.error()
            if err is None:
                records.append(msg)
            elif err.code() != KafkaError._PARTITION_EOF:
                log.warning("%s: consumer error: %s", self.group, err)
        if not records:
            return 0
        after = self._commit_batch(records, stopping)
        if after is None:
            return 0  # asked to stop before the batch committed: redelivered after a restart
        self._commit_offsets(records)
        if after is not None:
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

    def _commit_offsets(self, records: Iterable[Message]) -> None:
        highest: dict[tuple[str, int], int] = {}
        for msg in records:
            key = (msg.topic() or "", msg.partition() or 0)
            highest[key] = max(highest.get(key, -1), msg.offset() or 0)
        self._consumer.commit(
            offsets=[TopicPartition(t, p, o + 1) for (t, p), o in highest.items()], asynchronous=False
        )


# ------------------------------------------------------------------ rendering


def headers_of(raw: RawHeaders) -> list[tuple[str, bytes | None]]:
    """A record's headers as an ordered list of (name, bytes-or-None)."""
    return list(header_pairs(raw))


def first_header(headers: Iterable[tuple[str, bytes | None]], name: str) -> str | None:
    """The first value of header ``name`` as text (Kafka headers may repeat)."""
    for key, value in headers:
        if key == name:
            return None if value is None else clean_text(value)
    return None


def clean_text(value: bytes) -> str:
    """Bytes as text PostgreSQL will store: undecodable bytes and NULs replaced."""
    return value.decode("utf-8", errors="replace").replace("\x00", "\ufffd")


def is_uuid(text: str | None) -> bool:
    if not text:
        return False
    try:
        return str(uuid.UUID(text)) == text.lower()
    except ValueError:
        return False


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def epoch_millis(at: datetime) -> int:
    """Milliseconds since the epoch, in integers (floats would round 123 ms to 122)."""
    aware = at if at.tzinfo is not None else at.replace(tzinfo=UTC)
    return (aware - _EPOCH) // timedelta(milliseconds=1)


def b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def jsonable(value: Any) -> Any:
    """A decoded Avro value as JSON-ready data that round-trips through the serde.

    Timestamps become epoch milliseconds and UUIDs text — what Avro's ``long``
    (timestamp-millis) and ``string`` (uuid) accept back — so a value shown by an API can
    be edited and sent back as a sanitized replacement unchanged in form.
    """
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, datetime):
        return epoch_millis(value)
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return b64(bytes(value))
    if isinstance(value, Decimal):
        return str(value)
    return value
