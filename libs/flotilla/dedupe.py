"""Claiming (consumer, event id) pairs: the idempotent-consumer table.

A claim is an INSERT that succeeds once per consumer and event id; it commits with
the handler's effects, so a record is either processed-with-effects or not processed
at all. Batches claim every id in one statement. A dead-lettered record holds no claim
(its savepoint, claim included, was rolled back), so a re-queued copy is processed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

DEDUPE_MIGRATION = """
CREATE TABLE IF NOT EXISTS processed_events (
    consumer     text        NOT NULL,
    event_id     text        NOT NULL,
    record_type  text        NOT NULL,
    outcome      text        NOT NULL,
    topic        text,
    partition    integer,
    "offset"     bigint,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);
CREATE TABLE IF NOT EXISTS stale_transitions (
    id          bigserial   PRIMARY KEY,
    consumer    text        NOT NULL,
    event_id    text        NOT NULL,
    incident_id text        NOT NULL,
    record_type text        NOT NULL,
    status      text        NOT NULL,
    version     integer     NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now()
);
"""


@dataclass(frozen=True)
class Claim:
    event_id: str
    record_type: str
    outcome: str
    topic: str
    partition: int
    offset: int


_INSERT_ONE = (
    'INSERT INTO processed_events (consumer, event_id, record_type, outcome, topic, partition, "offset") '
    "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING"
)

_INSERT_MANY = """
INSERT INTO processed_events (consumer, event_id, record_type, outcome, topic, partition, "offset")
SELECT %s, e, t, o, tp, p, off
FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::int[], %s::bigint[]) AS u(e, t, o, tp, p, off)
ON CONFLICT DO NOTHING
RETURNING event_id
"""


def letter_claim(topic: str, partition: int, offset: int) -> Claim:
    """The claim of a record this consumer dead-lettered: keyed by the record's position
    (``dead-letter:<topic>:<partition>:<offset>``), which poison always has, unlike an id."""
    return Claim(f"dead-letter:{topic}:{partition}:{offset}", "", "dead-lettered", topic, partition, offset)


def claim_one(conn: psycopg.Connection[Any], consumer: str, claim: Claim) -> bool:
    """Claim one event id; False when this consumer already processed it."""
    cur = conn.execute(
        _INSERT_ONE,
        (consumer, claim.event_id, claim.record_type, claim.outcome, claim.topic, claim.partition, claim.offset),
    )
    return cur.rowcount == 1


def claim_many(conn: psycopg.Connection[Any], consumer: str, claims: Sequence[Claim]) -> set[str]:
    """Claim a batch in one round trip; returns the event ids that were new.

    An id repeated inside the batch is claimed once: callers treat its later
    occurrences as duplicates.
    """
    if not claims:
        return set()
    rows = conn.execute(
        _INSERT_MANY,
        (
            consumer,
            [c.event_id for c in claims],
            [c.record_type for c in claims],
            [c.outcome for c in claims],
            [c.topic for c in claims],
            [c.partition for c in claims],
            [c.offset for c in claims],
        ),
    ).fetchall()
    fresh = {r[0] for r in rows}
    if any(not isinstance(event_id, str) for event_id in fresh):
        # Never "all duplicates" by a type mismatch: that would drop the batch silently.
        raise TypeError(f"claimed event ids came back as {type(next(iter(fresh))).__name__}, not str")
    return fresh


def set_outcome(conn: psycopg.Connection[Any], consumer: str, event_id: str, outcome: str) -> None:
    conn.execute(
        "UPDATE processed_events SET outcome = %s WHERE consumer = %s AND event_id = %s",
        (outcome, consumer, event_id),
    )
