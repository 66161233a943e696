"""Prometheus metrics every Flotilla service exposes on ``/metrics``.

One set of names for the whole fleet, labelled by consumer (service) so a dashboard
works for all seven services without per-service queries.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable

from prometheus_client import Counter, Gauge, Histogram

log = logging.getLogger(__name__)

RECORDS_CONSUMED = Counter(
    "flotilla_records_consumed_total", "Records taken off a topic by a consumer loop.", ["consumer", "topic"]
)
RECORDS_SKIPPED = Counter(
    "flotilla_records_skipped_total",
    "Records a consumer loop passed over unread: their type (ce_type) is one it neither handles nor needs.",
    ["consumer", "type"],
)
RECORDS_HANDLED = Counter(
    "flotilla_records_handled_total", "Records whose handler ran and committed.", ["consumer", "type"]
)
RECORDS_PRODUCED = Counter(
    "flotilla_records_produced_total", "Records written to the outbox for publication.", ["source", "topic", "type"]
)


def count_produced(source: str, topic: str, record_type: str) -> None:
    """Count one record appended to the outbox: the one place every emit path counts it."""
    RECORDS_PRODUCED.labels(source, topic, record_type).inc()


HANDLER_SECONDS = Histogram(
    "flotilla_handler_seconds",
    "Time in a record's handler, dedupe and state included.",
    ["consumer", "type"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
BATCH_SECONDS = Histogram(
    "flotilla_batch_seconds",
    "Time to process one poll batch, commit included.",
    ["consumer"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
DEDUPE_HITS = Counter(
    "flotilla_dedupe_hits_total",
    "Records skipped because this consumer already processed their event id.",
    ["consumer"],
)
DEAD_LETTERS = Counter(
    "flotilla_dead_letters_total", "Records sent to a dead-letter topic, by reason.", ["consumer", "reason"]
)
RECORDS_UNAUTHORIZED = Counter(
    "flotilla_records_unauthorized_total",
    "Records refused before any handler because their producer's signature does not hold "
    "(flotilla.provenance), by record type and why.",
    ["consumer", "type", "refusal"],
)
CONNECTOR_RESTARTS = Counter(
    "flotilla_outbox_connector_restarts_total",
    "Times a service found its outbox connector (or its task) FAILED in Kafka Connect and restarted it.",
    ["service"],
)
CONNECTOR_FAILURES = Gauge(
    "flotilla_outbox_connector_failures",
    "Times in a row a service's outbox connector failed at the same source position (0 while it runs); "
    "2 or more: it is held up at one row, restarted with back-off (the service's log has the trace and position).",
    ["service"],
)
ROWS_SET_ASIDE = Gauge(
    "flotilla_outbox_rows_set_aside",
    "Rows in a service's outbox too large for Kafka, which its connector set aside (a notice on <topic>.dlq) "
    "instead of publishing; counted while the rows are kept (outbox retention).",
    ["service"],
)
LOOP_DROPS = Counter("flotilla_loop_drops_total", "Records dropped because their hop budget was spent.", ["consumer"])
STALE_TRANSITIONS = Counter(
    "flotilla_stale_transitions_total",
    "Records the incident workflow did not accept in its current state.",
    ["consumer", "type"],
)
RETRIES = Counter("flotilla_handler_retries_total", "Handler attempts retried after a transient error.", ["consumer"])
BUDGETS_EXCEEDED = Counter(
    "flotilla_budget_exceeded_total", "Incidents routed to a human for exceeding a budget.", ["consumer", "budget"]
)
CONSUMER_LAG = Gauge(
    "flotilla_consumer_lag",
    "Records between a partition's end and the consumer's committed offset, per assigned partition.",
    ["consumer", "topic", "partition"],
)


class ConsumerLag:
    """librdkafka's ``stats_cb``: keeps ``flotilla_consumer_lag`` in step with one consumer.

    librdkafka already knows each assigned partition's end offset (from its fetch
    responses) and the group's committed offset, and reports their difference as
    ``topics.<t>.partitions.<p>.consumer_lag`` every ``statistics.interval.ms``. Reading
    that costs no request to the broker; asking for watermarks and committed offsets
    ourselves would cost two per partition per scrape. A partition that is no longer
    reported with a known lag (revoked, or nothing committed yet: -1) loses its series,
    so a dashboard never shows the lag of a partition this process stopped owning.
    """

    def __init__(self, consumer: str) -> None:
        self.consumer = consumer
        self._shown: set[tuple[str, str]] = set()

    def __call__(self, stats_json: str) -> None:
        try:
            stats = json.loads(stats_json)
        except ValueError:
            log.warning("unreadable librdkafka statistics for %s", self.consumer)
            return
        seen: set[tuple[str, str]] = set()
        for topic, detail in (stats.get("topics") or {}).items():
            for partition, numbers in (detail.get("partitions") or {}).items():
                lag = numbers.get("consumer_lag", -1)
                if partition == "-1" or not isinstance(lag, int) or lag < 0:  # -1: librdkafka's internal partition
                    continue
                CONSUMER_LAG.labels(self.consumer, topic, partition).set(lag)
                seen.add((topic, partition))
        for topic, partition in self._shown - seen:
            CONSUMER_LAG.remove(self.consumer, topic, partition)
        self._shown = seen

    def clear(self) -> None:
        """Drop every series of this consumer (it closed)."""
        for topic, partition in self._shown:
            CONSUMER_LAG.remove(self.consumer, topic, partition)
        self._shown = set()


class BoundedLabel:
    """The values one metric label may take when they come from incoming data.

    Every distinct label value is a series kept for the life of the process, so a label
    read from a header or a record any producer controls would let that producer grow
    the process's memory (and the monitoring system's) without bound. ``known`` values
    pass; the first ``spare`` other values (at most ``max_length`` characters) are
    admitted as they come; anything else is counted as ``overflow``.
    """

    def __init__(
        self, known: Iterable[str] = (), *, spare: int = 0, max_length: int = 100, overflow: str = "other"
    ) -> None:
        self._known = frozenset(known)
        self._spare = spare
        self._max_length = max_length
        self._overflow = overflow
        self._admitted: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        if value in self._known:
            return value
        if len(value) > self._max_length:
            return self._overflow
        with self._lock:
            if value in self._admitted:
                return value
            if len(self._admitted) < self._spare:
                self._admitted.add(value)
                return value
        return self._overflow
