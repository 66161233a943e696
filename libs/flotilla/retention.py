"""Pruning the tables that grow with every record, without weakening dedupe.

``processed_events`` (one row per record per consumer) and the outbox (one row per
record emitted) grow for ever otherwise. Both are pruned by a periodic task of every
service (``flotilla.runner``), a batch at a time so no statement holds locks for long.

The dedupe window is not a free setting: a row may go only once Kafka can no longer
deliver its record again. A consumer group rewound to the start re-reads at most what
the topic still holds, so the window is the longest retention among the topics the
service consumes plus a margin (``dedupe_window``), read from the brokers at start-up.
A topic that keeps its records for ever (``retention.ms`` = -1) means dedupe rows are
never pruned. Past the window dedupe does not stand alone either: a record of an incident
is also gated by the workflow state (a copy of a fact the incident has moved past is a
stale transition, ``flotilla.consumer``), the executor by its idempotency keys, the audit
by event id, the DLQ reconciler by DLQ offset.

The outbox needs no such care: Debezium reads the write-ahead log, not the table, so a
row can go as soon as it is committed. It is kept ``outbox_retention`` (a day by default)
as the service's own record of what it sent.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType  # type: ignore[attr-defined]
from prometheus_client import Counter

log = logging.getLogger(__name__)

FOREVER = -1  # retention.ms of a topic that keeps its records for ever
BATCH = 5000  # rows per DELETE: short statements, short locks

PRUNED = Counter("flotilla_pruned_rows_total", "Rows removed by the retention task.", ["service", "table"])


@dataclass(frozen=True)
class Retention:
    """How long a service keeps its dedupe claims and its outbox rows (None: for ever; an
    outbox of None also stands for a service without one)."""

    dedupe: timedelta | None
    outbox: timedelta | None


def dedupe_window(retention_ms: Iterable[int], *, margin: timedelta) -> timedelta | None:
    """Longer than any consumed topic keeps a record (plus ``margin``); None when one of
    them keeps records for ever."""
    longest = 0
    for ms in retention_ms:
        if ms < 0:
            return None
        longest = max(longest, ms)
    return timedelta(milliseconds=longest) + margin


def topic_retention_ms(admin: AdminClient, topics: Iterable[str], timeout: float = 10.0) -> dict[str, int]:
    """Each topic's ``retention.ms`` as the brokers have it (the topic's own or the default)."""
    resources = [ConfigResource(ResourceType.TOPIC, topic) for topic in topics]
    if not resources:
        return {}
    found: dict[str, int] = {}
    for resource, future in admin.describe_configs(resources).items():
        config: Mapping[str, Any] = future.result(timeout=timeout)
        found[resource.name] = int(config["retention.ms"].value)
    return found


def prune(conn: psycopg.Connection[Any], retention: Retention, now: datetime, *, service: str) -> dict[str, int]:
    """Remove what ``retention`` lets go, a batch at a time; returns rows removed by table."""
    removed: dict[str, int] = {}
    if retention.outbox is not None:
        removed["outbox"] = _prune(conn, "outbox", "created_at", now - retention.outbox)
    if retention.dedupe is not None:
        cutoff = now - retention.dedupe
        removed["processed_events"] = _prune(conn, "processed_events", "processed_at", cutoff)
        removed["stale_transitions"] = _prune(conn, "stale_transitions", "recorded_at", cutoff)
    for table, count in removed.items():
        if count:
            PRUNED.labels(service, table).inc(count)
    return removed


def _prune(conn: psycopg.Connection[Any], table: str, column: str, cutoff: datetime) -> int:
    total = 0
    while True:
        with conn.transaction():
            cur = conn.execute(
                f"DELETE FROM {table} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {table} WHERE {column} < %s LIMIT %s))",
                (cutoff, BATCH),
            )
        total += cur.rowcount
        if cur.rowcount < BATCH:
            return total
