"""Quarantining a batch of dead letters: one transaction, then the offsets.

Per letter: a letter already seen (same DLQ topic/partition/offset: a redelivery) is
skipped; a letter about an origin record already quarantined (another consumer gave up
on the same record) adds a sighting; anything else becomes a quarantine entry and a
DeadLetterQuarantined fact in the outbox — in the same transaction, so the alert is
published if and only if the entry exists.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import psycopg
from confluent_kafka import Message
from prometheus_client import Counter
from psycopg.types.json import Jsonb

from flotilla import (
    AfterCommit,
    BusinessRuleViolation,
    RecordValidationError,
    SchemaNotRegisteredError,
    ServiceContext,
    UndecodableRecordError,
    UnknownSchemaIdError,
    metrics,
)
from flotilla.rawrecords import b64
from flotilla.records import DeadLetterQuarantined
from services.dlq_reconciler.quarantine import (
    DeadLetter,
    fact_envelope,
    quarantine_fact,
)

log = logging.getLogger(__name__)

QUARANTINED = Counter(
    "flotilla_quarantined_total",
    "Dead records quarantined by the DLQ reconciler (one per origin record), by error class.",
    ["error_class", "origin_topic"],
)
# Both labels come from dlq_* headers, which any producer to a *.dlq topic writes: an
# origin other than the topics this reconciler reads, and error classes beyond the
# runtime's own and the first few dozen others, are counted as "other" (the quarantine
# entry and its DeadLetterQuarantined fact keep the exact values).
RUNTIME_ERROR_CLASSES = tuple(
    error.__name__
    for error in (
        BusinessRuleViolation,
        RecordValidationError,
        SchemaNotRegisteredError,
        UndecodableRecordError,
        UnknownSchemaIdError,
        ValueError,
    )
)
SPARE_ERROR_CLASSES = 50
SIGHTINGS = Counter(
    "flotilla_dead_letter_sightings_total",
    "Dead letters read by the DLQ reconciler, including further letters about a quarantined record.",
    ["dlq_topic"],
)

_INSERT = """
INSERT INTO quarantine (id, origin_topic, origin_partition, origin_offset, dlq_topic, dlq_partition, dlq_offset,
    consumer, reason, error_class, error_message, first_failure_time, attempts, incident_id, original_event_id,
    original_type, record_key, record_value, headers, tags, fact_event_id, quarantined_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
"""
_SIGHTING = """
INSERT INTO quarantine_sightings (dlq_topic, dlq_partition, dlq_offset, quarantine_id, consumer, reason, error_class)
VALUES (%s, %s, %s, %s, %s, %s, %s)
"""


class Reconciler:
    """The raw loop's batch handler."""

    def __init__(self, ctx: ServiceContext, incidents_topic: str, origin_topics: Iterable[str]) -> None:
        self._ctx = ctx
        self._topic = incidents_topic
        self.origin_label = metrics.BoundedLabel(origin_topics)
        self.error_class_label = metrics.BoundedLabel(RUNTIME_ERROR_CLASSES, spare=SPARE_ERROR_CLASSES)

    def count_quarantined(self, letter: DeadLetter) -> None:
        QUARANTINED.labels(self.error_class_label(letter.error_class), self.origin_label(letter.origin_topic)).inc()

    def __call__(self, conn: psycopg.Connection[Any], msgs: list[Message]) -> AfterCommit:
        letters = [DeadLetter.from_message(m) for m in msgs]
        seen = self._seen(conn, letters)
        new: list[tuple[DeadLetter, bool]] = []
        for letter in letters:
            coordinates = (letter.dlq_topic, letter.dlq_partition, letter.dlq_offset)
            if coordinates in seen:
                continue
            seen.add(coordinates)
            existing = self._by_origin(conn, letter)
            if existing is not None:
                conn.execute("UPDATE quarantine SET sightings = sightings + 1 WHERE id = %s", (existing,))
                self._sighting(conn, letter, existing)
                continue
            announced = self._quarantine(conn, letter)
            new.append((letter, announced))

        def after() -> None:
            for letter in letters:
                SIGHTINGS.labels(letter.dlq_topic).inc()
            for letter, announced in new:
                self.count_quarantined(letter)
                if announced:
                    metrics.count_produced(self._ctx.source, self._topic, DeadLetterQuarantined.TYPE)
                else:
                    log.error(
                        "hop budget of %s spent: quarantined without a DeadLetterQuarantined fact",
                        letter.original_event_id,
                    )
                log.warning(
                    "quarantined %s[%s]@%s from %s (consumer %s, %s: %s)",
                    letter.origin_topic,
                    letter.origin_partition,
                    letter.origin_offset,
                    letter.dlq_topic,
                    letter.consumer,
                    letter.error_class,
                    letter.error_message[:200],
                )

        return after

    @staticmethod
    def _seen(conn: psycopg.Connection[Any], letters: Sequence[DeadLetter]) -> set[tuple[str, int, int]]:
        rows = conn.execute(
            "SELECT dlq_topic, dlq_partition, dlq_offset FROM quarantine_sightings "
            "WHERE (dlq_topic, dlq_partition, dlq_offset) IN "
            "(SELECT * FROM unnest(%s::text[], %s::int[], %s::bigint[]))",
            (
                [x.dlq_topic for x in letters],
                [x.dlq_partition for x in letters],
                [x.dlq_offset for x in letters],
            ),
        ).fetchall()
        return {(str(t), int(p), int(o)) for t, p, o in rows}

    @staticmethod
    def _by_origin(conn: psycopg.Connection[Any], letter: DeadLetter) -> uuid.UUID | None:
        if letter.origin_partition is None or letter.origin_offset is None:
            return None  # no origin to match on: each such letter is its own entry
        row = conn.execute(
            "SELECT id FROM quarantine WHERE origin_topic = %s AND origin_partition = %s AND origin_offset = %s",
            (letter.origin_topic, letter.origin_partition, letter.origin_offset),
        ).fetchone()
        return None if row is None else row[0]

    @staticmethod
    def _sighting(conn: psycopg.Connection[Any], letter: DeadLetter, quarantine_id: uuid.UUID) -> None:
        conn.execute(
            _SIGHTING,
            (
                letter.dlq_topic,
                letter.dlq_partition,
                letter.dlq_offset,
                quarantine_id,
                letter.consumer,
                letter.reason,
                letter.error_class,
            ),
        )

    def _quarantine(self, conn: psycopg.Connection[Any], letter: DeadLetter) -> bool:
        """Insert the entry (and its fact, unless the hop budget is spent); True if a fact went out."""
        quarantine_id = uuid.uuid4()
        now = self._ctx.now()
        envelope = fact_envelope(letter, self._ctx.source)
        conn.execute(
            _INSERT,
            (
                quarantine_id,
                letter.origin_topic,
                letter.origin_partition,
                letter.origin_offset,
                letter.dlq_topic,
                letter.dlq_partition,
                letter.dlq_offset,
                letter.consumer,
                letter.reason,
                letter.error_class,
                letter.error_message,
                letter.first_failure_time,
                letter.attempts,
                letter.incident_id,
                letter.original_event_id,
                letter.original_type,
                letter.key,
                letter.value,
                Jsonb([[name, b64(raw)] for name, raw in letter.headers]),
                Jsonb(letter.tags()),
                None if envelope is None else envelope.id,
                now,
            ),
        )
        self._sighting(conn, letter, quarantine_id)
        if envelope is None:
            return False
        fact = quarantine_fact(letter, quarantine_id, now)
        self._ctx.outbox.append(conn, fact, envelope, key=letter.incident_id, topic=self._topic)
        return True
