"""The transactional outbox: records leave a service only through its own database.

A service writes its state change and its outgoing records in one PostgreSQL
transaction; Debezium reads the committed rows from the WAL and the Outbox Event
Router publishes each to the topic in ``aggregatetype``, keyed by ``aggregateid``, with
``payload`` passed through byte for byte and the ``ce_*`` columns as headers. The value
is serialized (and validated) *before* the INSERT, so a record that breaks its contract
raises and the transaction — state change included — never commits.

There is one way in: :meth:`Outbox.row` takes a typed record and its envelope (which
names its cause), fills in the record's identity, serializes, signs the exact payload
with the service's key (``flotilla.provenance``: the ``ce_signature`` header consumers
verify) and returns the row; :meth:`Outbox.append` inserts it at once.

It is also where a record's size is checked: a row Kafka would refuse fails the outbox
connector's task on every restart (the connector resumes at that row), so a record over
the configured maximum raises :class:`RecordTooLargeError` here, before the INSERT.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from flotilla.authority import Signer
from flotilla.bounds import DEFAULT_MAX_RECORD_BYTES
from flotilla.envelope import CONTENT_TYPE, Envelope
from flotilla.provenance import SIGNATURE_HEADER, sign_fact
from flotilla.serde import AvroSerde, SerdeError
from flotilla.typedrecord import Record

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
    created_at       timestamptz NOT NULL DEFAULT now(),
    ce_signature     text
);
CREATE INDEX IF NOT EXISTS {OUTBOX_TABLE}_created_at_idx ON {OUTBOX_TABLE} (created_at);
ALTER TABLE {OUTBOX_TABLE} ADD COLUMN IF NOT EXISTS ce_signature text;
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
    "ce_signature": SIGNATURE_HEADER,
}

# An OutboxRow's columns, in order (the INSERT's; record_bytes finds the Kafka record's parts by them).
COLUMNS = (
    "id",
    "aggregatetype",
    "aggregateid",
    "type",
    "payload",
    "ce_specversion",
    "ce_source",
    "ce_time",
    "ce_correlationid",
    "ce_causationid",
    "ce_hops",
    "ce_traceparent",
    "content_type",
    "ce_signature",
)
_INSERT = f"""
INSERT INTO {OUTBOX_TABLE} ({", ".join(COLUMNS)})
VALUES ({", ".join(["%s"] * len(COLUMNS))})
"""


def migrate(conn: psycopg.Connection[Any]) -> None:
    """Create the outbox table if it is not there (idempotent)."""
    conn.execute(OUTBOX_MIGRATION)


ALLOWLIST_CONSTRAINT = f"{OUTBOX_TABLE}_topic_allowed"


def allow_topics(conn: psycopg.Connection[Any], topics: Sequence[str]) -> None:
    """Let this database's outbox hold rows for ``topics`` only (idempotent, re-applied
    at every start so a changed declaration takes effect).

    The connector routes a row to whatever topic its ``aggregatetype`` names, so without
    this any service's outbox could publish to ``commands``. The constraint makes that a
    refused INSERT in the service's own database; ``NOT VALID`` leaves rows written before
    it existed alone (they are history) while every new row is checked.
    """
    table, name = sql.Identifier(OUTBOX_TABLE), sql.Identifier(ALLOWLIST_CONSTRAINT)
    allowed = sql.SQL(", ").join(sql.Literal(t) for t in sorted(set(topics)))
    check = sql.SQL("aggregatetype IN ({})").format(allowed) if topics else sql.SQL("false")
    with conn.transaction():
        conn.execute(sql.SQL("ALTER TABLE {} DROP CONSTRAINT IF EXISTS {}").format(table, name))
        conn.execute(sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} CHECK ({}) NOT VALID").format(table, name, check))


class UndeclaredTopicError(RuntimeError):
    """A service emitted to a topic it did not declare: a programming error, never data."""


class RecordTooLargeError(SerdeError):
    """A record over the outbox's maximum size: it would be refused by Kafka and stop the
    service's publishing, so it is never written. A SerdeError (a value that cannot be
    turned into a publishable record): a consumer dead-letters the input that made it
    at once, since trying again makes the same record."""

    def __init__(self, type_: str, topic: str, size: int, limit: int) -> None:
        self.type = type_
        self.topic = topic
        self.size = size
        self.limit = limit
        super().__init__(
            f"a {type_} record for {topic} is {size} bytes (payload, key and headers), over the outbox's "
            f"limit of {limit} bytes (FLOTILLA_OUTBOX_MAX_RECORD_BYTES): not written"
        )


OutboxRow = tuple[Any, ...]

_PAYLOAD, _KEY = COLUMNS.index("payload"), COLUMNS.index("aggregateid")
_HEADERS = tuple((COLUMNS.index(column), header.encode()) for column, header in HEADER_COLUMNS.items())


def record_bytes(row: OutboxRow) -> int:
    """What the Kafka record of ``row`` weighs: its value, key and headers (names and
    values; a NULL column is no header). The batch's own framing is a few dozen bytes."""
    size = len(row[_PAYLOAD]) + len(str(row[_KEY]).encode())
    for index, name in _HEADERS:
        if row[index] is not None:
            size += len(name) + len(str(row[index]).encode())
    return size


class Outbox:
    """Validated, serialized, signed records into the outbox, inside the caller's transaction.

    ``topics`` are the topics this service may publish to (its ``ServiceSpec.emits``);
    None leaves the choice to the database constraint alone (tools and tests). ``signer``
    is the service's key: every fleet member has one, and its consumers refuse what it
    did not sign; None writes unsigned rows (tools, and tests of the outbox itself).
    ``max_record_bytes`` (FLOTILLA_OUTBOX_MAX_RECORD_BYTES): no larger record is made.
    """

    def __init__(
        self,
        serde: AvroSerde,
        topics: Sequence[str] | None = None,
        signer: Signer | None = None,
        *,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    ) -> None:
        if max_record_bytes <= 0:
            raise ValueError("max_record_bytes is a number of bytes above 0")
        self._serde = serde
        self._topics = None if topics is None else frozenset(topics)
        self._signer = signer
        self.max_record_bytes = max_record_bytes

    @property
    def serde(self) -> AvroSerde:
        return self._serde

    def row(self, record: Record, envelope: Envelope, *, key: str | None = None, topic: str | None = None) -> OutboxRow:
        """The row for ``record`` under ``envelope``: on its type's topic (or ``topic``, for
        a service configured with another), keyed by its incident unless ``key`` says
        otherwise. A fact's empty ``eventId`` becomes its envelope's id.

        Raises RecordValidationError when the value does not match its contract, so
        nothing invalid ever reaches the table, RecordTooLargeError when the record would
        be over ``max_record_bytes``, and UndeclaredTopicError for a topic the service
        did not declare.
        """
        if envelope.type != record.TYPE:
            raise ValueError(f"a {record.TYPE} record under an envelope of type {envelope.type}")
        topic = topic or record.TOPIC
        if self._topics is not None and topic not in self._topics:
            raise UndeclaredTopicError(
                f"{envelope.source} may publish to {', '.join(sorted(self._topics)) or 'no topic'}, not to {topic!r}"
            )
        value = record.to_value()
        if hasattr(record, "event_id"):
            value.setdefault("eventId", envelope.id)
        if key is None:
            key = str(getattr(record, "incident_id", "") or envelope.correlationid)
        payload = self._serde.serialize(topic, envelope.type, value)
        signature = None if self._signer is None else sign_fact(self._signer, envelope, payload)
        row = (
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
            signature,
        )
        size = record_bytes(row)
        if size > self.max_record_bytes:
            raise RecordTooLargeError(envelope.type, topic, size, self.max_record_bytes)
        return row

    @staticmethod
    def insert(conn: psycopg.Connection[Any], rows: list[OutboxRow], *, if_absent: bool = False) -> None:
        """Insert prepared rows in order (one pipelined statement batch). ``if_absent``: a
        row whose id is already there is left alone (for ids derived, not drawn)."""
        statement = _INSERT + " ON CONFLICT (id) DO NOTHING" if if_absent else _INSERT
        if len(rows) == 1:
            conn.execute(statement, rows[0])
        elif rows:
            with conn.cursor() as cur:
                cur.executemany(statement, rows)

    def append(
        self,
        conn: psycopg.Connection[Any],
        record: Record,
        envelope: Envelope,
        *,
        key: str | None = None,
        topic: str | None = None,
    ) -> bytes:
        """:meth:`row`, inserted now; returns the payload that will be published."""
        row = self.row(record, envelope, key=key, topic=topic)
        self.insert(conn, [row])
        return bytes(row[4])
