"""The transactional outbox: records leave a service only through its own database.

A service writes its state change and its outgoing records in one PostgreSQL
transaction; Debezium reads the committed rows from the WAL and the Outbox Event
Router publishes each to the topic in ``aggregatetype``, keyed by ``aggregateid``, with
``payload`` passed through byte for byte and the ``ce_*`` columns as headers. The value
is serialized (and validated) *before* the INSERT, so a record that breaks its contract
raises and the transaction — state change included — never commits.
"""

from __future__ import annotations

from typing import Any

import psycopg

from flotilla.envelope import CONTENT_TYPE, Envelope
from flotilla.serde import AvroSerde

OUTBOX_TABLE = "outbox"

# Rows are kept after publication (they are the service's own record of what it sent,
# and a connector registered late still snapshots them); a retention job prunes them.
OUTBOX_MIGRATION = f"""
CREATE TABLE IF NOT EXISTS {OUTBOX_TABLE} (
    id               uuid        PRIMARY KEY,
    aggregatetype    text        NOT NULL,
    aggregateid      text        NOT NULL,
    type             text        NOT NULL,
    payload          bytea       NOT NULL,
    ce_specversion   text        NOT NULL,
    ce_source        text        NOT NULL,
    ce_time          text        NOT NULL,
    ce_correlationid text        NOT NULL,
    ce_causationid   text,
    ce_hops          text        NOT NULL,
    ce_traceparent   text        NOT NULL,
    content_type     text        NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS {OUTBOX_TABLE}_created_at_idx ON {OUTBOX_TABLE} (created_at);
"""

# Outbox columns that the connector places as Kafka headers, and the header names.
HEADER_COLUMNS: dict[str, str] = {
    "id": "ce_id",
    "type": "ce_type",
    "ce_specversion": "ce_specversion",
    "ce_source": "ce_source",
    "ce_time": "ce_time",
    "ce_correlationid": "ce_correlationid",
    "ce_causationid": "ce_causationid",
    "ce_hops": "ce_hops",
    "ce_traceparent": "ce_traceparent",
    "content_type": "content-type",
}

_INSERT = f"""
INSERT INTO {OUTBOX_TABLE} (id, aggregatetype, aggregateid, type, payload, ce_specversion, ce_source,
    ce_time, ce_correlationid, ce_causationid, ce_hops, ce_traceparent, content_type)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
"""


def migrate(conn: psycopg.Connection[Any]) -> None:
    """Create the outbox table if it is not there (idempotent)."""
    conn.execute(OUTBOX_MIGRATION)


OutboxRow = tuple[Any, ...]


class Outbox:
    """Validated, serialized records into the outbox, inside the caller's transaction."""

    def __init__(self, serde: AvroSerde) -> None:
        self._serde = serde

    def row(self, *, topic: str, key: str, value: dict[str, Any], envelope: Envelope) -> OutboxRow:
        """Serialize ``value`` as ``envelope.type`` for ``topic``: the row to insert.

        Raises RecordValidationError when the value does not match the registered schema,
        so nothing invalid ever reaches the table.
        """
        payload = self._serde.serialize(topic, envelope.type, value)
        return (
            envelope.id,
            topic,
            key,
            envelope.type,
            payload,
            envelope.specversion,
            envelope.source,
            envelope.time,
            envelope.correlationid,
            envelope.causationid,
            str(envelope.hops),
            envelope.traceparent,
            CONTENT_TYPE,
        )

    @staticmethod
    def insert(conn: psycopg.Connection[Any], rows: list[OutboxRow]) -> None:
        """Insert prepared rows in order (one pipelined statement batch)."""
        if len(rows) == 1:
            conn.execute(_INSERT, rows[0])
        elif rows:
            with conn.cursor() as cur:
                cur.executemany(_INSERT, rows)

    def append(
        self,
        conn: psycopg.Connection[Any],
        *,
        topic: str,
        key: str,
        value: dict[str, Any],
        envelope: Envelope,
    ) -> bytes:
        """Serialize and insert one record now; returns the payload that will be published."""
        row = self.row(topic=topic, key=key, value=value, envelope=envelope)
        self.insert(conn, [row])
        return bytes(row[4])
