"""What a service's handler sees and may do.

A handler is a plain function ``handle(ctx)``: it reads ``ctx.incoming`` (the decoded
record and its envelope), reads and writes its own tables through ``ctx.conn`` (inside
the consumer's transaction), and emits caused records with ``ctx.emit``. It never
produces to Kafka, never commits, never dedupes: the consumer loop does those.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg

from flotilla import metrics
from flotilla.deadletter import Reason
from flotilla.envelope import Envelope
from flotilla.outbox import Outbox, OutboxRow
from flotilla.serde import AvroSerde
from flotilla.typedrecord import Record
from flotilla.workflow import IncidentState

R = TypeVar("R", bound=Record)


class BusinessRuleViolation(Exception):
    """The record is well-formed but must not be acted on; it goes to the DLQ, no retry."""


@dataclass(frozen=True)
class Report:
    """A fact about a refused record, emitted although the record itself had no effect."""

    key: str
    record: Record


class RecordRefused(BusinessRuleViolation):
    """The record must not be acted on, for ``reason`` (a dead-letter reason), and the
    refusal itself is a fact worth publishing (``report``).

    Everything the handler did is rolled back — including the record's dedupe claim, so a
    copy re-queued later (say, once a missing key is trusted) is judged afresh — and the
    report is emitted on its own, under an id derived from the refused record's, so a
    redelivery refuses again without reporting twice.
    """

    def __init__(self, reason: Reason, message: str, report: Report | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.report = report


@dataclass(frozen=True)
class Incoming:
    """A decoded record as a handler sees it."""

    topic: str
    partition: int
    offset: int
    key: str | None
    envelope: Envelope
    record_type: str
    value: dict[str, Any]
    # SHA-256 of the payload as received, which its producer's signature covers
    # (flotilla.provenance.payload_digest); None where no loop received it (tests, tools).
    digest: str | None = None

    def typed(self, record_class: type[R]) -> R:
        """The value as its typed record (``flotilla.records``); a record of another type
        is a programming error (the handler was registered for the wrong type)."""
        if self.record_type != record_class.TYPE:
            raise TypeError(f"a {self.record_type} record read as {record_class.TYPE}")
        return record_class.from_value(self.value)


class HandlerContext:
    """What a handler may touch: the transaction, the incident state, and the outbox."""

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        incoming: Incoming,
        state: IncidentState | None,
        outbox: Outbox,
        source: str,
        pending: list[OutboxRow],
    ) -> None:
        self.conn = conn
        self.incoming = incoming
        self.state = state
        self.tokens_spent = 0
        self.emitted: list[Envelope] = []
        self._outbox = outbox
        self._source = source
        self._pending = pending

    def emit(self, record: Record, *, key: str | None = None, topic: str | None = None) -> Envelope:
        """Append a record caused by the incoming one (same transaction, one hop fewer), on
        its type's topic (or ``topic``, for a service configured with another), keyed by
        its incident unless ``key`` says otherwise.

        A fact's ``eventId`` is its envelope's id: it is filled in here when left empty. The
        value is validated now (an invalid record raises here, in the handler); the row is
        inserted by the consumer loop, in bulk, before the transaction commits.
        """
        return self.emit_as(record, self.incoming.envelope.caused(record.TYPE, self._source), key, topic)

    def emit_as(self, record: Record, envelope: Envelope, key: str | None = None, topic: str | None = None) -> Envelope:
        """Append ``record`` under an envelope of the caller's making (a command whose id is
        fixed in advance, caused by a record this handler emitted), after what the handler
        emitted so far."""
        self._pending.append(self._outbox.row(record, envelope, key=key, topic=topic))
        metrics.count_produced(self._source, topic or record.TOPIC, record.TYPE)
        self.emitted.append(envelope)
        return envelope

    @property
    def serde(self) -> AvroSerde:
        """The service's serde: to keep a record for later (``flotilla.deferred``)."""
        return self._outbox.serde

    def spend_tokens(self, tokens: int) -> None:
        """Charge LLM tokens to the incident's budget."""
        self.tokens_spent += tokens


Handler = Callable[[HandlerContext], None]
