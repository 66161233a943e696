"""What a dead letter says, and what may be done with it: pure, tested without the stack.

A dead letter (see :mod:`flotilla.deadletter`) is the original record — key, value bytes
and headers untouched — followed by ``dlq_*`` context headers: where it came from, which
consumer gave up on it and why. This module reads that into a :class:`DeadLetter`,
derives the quarantine tags and the DeadLetterQuarantined fact, and checks and builds a
re-queued copy: same key, same ``ce_*`` headers (so the same event id), a value that
passes its registered schema, and provenance headers saying where it was re-queued from.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from confluent_kafka import Message

from flotilla import DEFAULT_HOPS, Envelope, child_traceparent, deadletter, new_traceparent
from flotilla.rawrecords import clean_text, first_header, headers_of, is_uuid
from flotilla.records import DeadLetterQuarantined

UNATTRIBUTED = "unattributed"

REQUEUED_FROM = "flotilla_requeued_from"
REQUEUED_BY = "flotilla_requeued_by"
_PROVENANCE = (REQUEUED_FROM, REQUEUED_BY)

# Top-level fields that carry a record's identity; a re-queued copy must keep them equal
# to its ce_id (facts and decisions: eventId; authorized commands: commandId).
IDENTITY_FIELDS = ("eventId", "commandId")

Headers = list[tuple[str, bytes | None]]


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


@dataclass(frozen=True)
class DeadLetter:
    """One record read from a ``*.dlq`` topic."""

    dlq_topic: str
    dlq_partition: int
    dlq_offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers = field(default_factory=list)

    @classmethod
    def from_message(cls, msg: Message) -> DeadLetter:
        key = msg.key()
        value = msg.value()
        return cls(
            dlq_topic=msg.topic() or "",
            dlq_partition=msg.partition() or 0,
            dlq_offset=msg.offset() or 0,
            key=key.encode() if isinstance(key, str) else key,
            value=value.encode() if isinstance(value, str) else value,
            headers=headers_of(msg.headers()),
        )

    # -- context headers -------------------------------------------------------

    def _context(self, name: str) -> str | None:
        return first_header(self.headers, name)

    @property
    def origin_topic(self) -> str:
        """The topic the record came from: its DLQ topic's name without ``.dlq``.

        Never the ``dlq_origin_topic`` header: anyone who can write to a DLQ can put any
        topic there, and a re-queue sends the record back to this topic (a letter planted
        on ``incidents.dlq`` must not be re-queued onto ``commands``)."""
        return self.dlq_topic.removesuffix(".dlq")

    @property
    def claimed_origin_topic(self) -> str | None:
        """What the context header says, when it says something else (then it is tagged)."""
        named = self._context(deadletter.ORIGIN_TOPIC)
        return named if named and named != self.origin_topic else None

    @property
    def origin_partition(self) -> int | None:
        """What the ``dlq_origin_partition`` header says: shown and reported, never where a
        re-queue goes (the key decides that, as for the original: ``api._RequeueProducer``),
        since anyone who can write to a DLQ writes this header too."""
        return _int(self._context(deadletter.ORIGIN_PARTITION))

    @property
    def origin_offset(self) -> int | None:
        return _int(self._context(deadletter.ORIGIN_OFFSET))

    @property
    def consumer(self) -> str:
        return self._context(deadletter.CONSUMER) or "unknown"

    @property
    def reason(self) -> str:
        return self._context(deadletter.REASON) or "unknown"

    @property
    def error_class(self) -> str:
        return self._context(deadletter.ERROR_CLASS) or "Unknown"

    @property
    def error_message(self) -> str:
        return self._context(deadletter.ERROR_MESSAGE) or ""

    @property
    def first_failure_time(self) -> str | None:
        return self._context(deadletter.FIRST_FAILURE_TIME)

    @property
    def attempts(self) -> int | None:
        return _int(self._context(deadletter.ATTEMPTS))

    # -- the original record ---------------------------------------------------

    @property
    def original_headers(self) -> Headers:
        """The headers the record had on its origin topic (context headers removed)."""
        return [(k, v) for k, v in self.headers if not k.startswith("dlq_")]

    @property
    def envelope(self) -> Envelope | None:
        """The original CloudEvents envelope, when its headers are readable."""
        try:
            return Envelope.from_headers(self.original_headers)
        except ValueError:
            return None

    @property
    def original_event_id(self) -> str | None:
        return first_header(self.original_headers, "ce_id")

    @property
    def original_type(self) -> str | None:
        return first_header(self.original_headers, "ce_type")

    @property
    def incident_id(self) -> str:
        """ce_correlationid, else the key of an ``incidents`` record, else 'unattributed'."""
        correlation = first_header(self.original_headers, "ce_correlationid")
        if correlation:
            return correlation
        if self.key and self.origin_topic.startswith("incidents"):
            return clean_text(self.key)
        return UNATTRIBUTED

    def tags(self) -> dict[str, str]:
        """Labels alerts are routed by: why it failed, where, and who produced it."""
        tags = {
            "reason": self.reason,
            "errorClass": self.error_class,
            "consumer": self.consumer,
            "origin": self.origin_topic,
        }
        producer = first_header(self.original_headers, "ce_source")
        if producer:
            tags["producer"] = producer
        if self.original_type:
            tags["recordType"] = self.original_type
        if self.claimed_origin_topic is not None:
            tags["claimedOrigin"] = clean_text(self.claimed_origin_topic.encode())[:200]
        requeued_from = first_header(self.original_headers, REQUEUED_FROM)
        if requeued_from:
            tags["requeuedFrom"] = requeued_from  # it failed again after an operator re-queued it
        return tags


def fact_envelope(letter: DeadLetter, source: str) -> Envelope | None:
    """The envelope of the DeadLetterQuarantined fact about ``letter``; None when the
    dead record's hop budget is spent.

    The fact continues the dead record's chain — caused by it (timelines link them),
    same trace, one hop fewer — rather than starting a fresh budget. That bounds the one
    loop the reconciler could otherwise feed: a consumer that dead-letters the fact
    itself would get a new fact about that, and so on. With no hop left the record is
    still quarantined and counted, but no fact is emitted (principle 5). A letter whose
    envelope is unreadable starts a new chain: there is none to continue, and the
    reconciler's own facts always have readable envelopes, so it cannot loop.
    """
    original = letter.envelope
    if original is None:
        return Envelope(
            type=DeadLetterQuarantined.TYPE,
            source=source,
            correlationid=letter.incident_id,
            causationid=letter.original_event_id,
            hops=DEFAULT_HOPS,
            traceparent=new_traceparent(),
        )
    if original.hops <= 1:
        return None
    return Envelope(
        type=DeadLetterQuarantined.TYPE,
        source=source,
        correlationid=letter.incident_id,
        causationid=original.id,
        hops=min(original.hops - 1, DEFAULT_HOPS),
        traceparent=child_traceparent(original.traceparent),
    )


def quarantine_fact(letter: DeadLetter, quarantine_id: uuid.UUID, at: datetime) -> DeadLetterQuarantined:
    """The DeadLetterQuarantined record (``event_id`` is filled in by the emitter)."""
    event_id = letter.original_event_id
    return DeadLetterQuarantined(
        incident_id=letter.incident_id,
        quarantine_id=str(quarantine_id),
        origin_topic=letter.origin_topic,
        origin_partition=letter.origin_partition if letter.origin_partition is not None else -1,
        origin_offset=letter.origin_offset if letter.origin_offset is not None else -1,
        dlq_topic=letter.dlq_topic,
        dlq_partition=letter.dlq_partition,
        dlq_offset=letter.dlq_offset,
        # a uuid field: a foreign producer's non-UUID id is reported as unknown
        original_event_id=event_id.lower() if event_id is not None and is_uuid(event_id) else None,
        original_type=letter.original_type,
        error_class=letter.error_class,
        error_message=letter.error_message,
        consumer=letter.consumer,
        tags=letter.tags(),
        quarantined_at=at,
    )


# ------------------------------------------------------------------ re-queue


class RequeueRefused(Exception):
    """The record may not be re-queued as asked; ``problems`` say why (HTTP 422)."""

    def __init__(self, message: str, problems: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.problems = list(problems)


def check_envelope(headers: Headers) -> Envelope:
    """The original headers must form a valid envelope, or the copy would die again."""
    try:
        return Envelope.from_headers(headers)
    except ValueError as exc:
        raise RequeueRefused(f"the original headers are not a valid CloudEvents envelope: {exc}") from exc


def with_identity(value: Mapping[str, Any], field_names: Iterable[str], event_id: str) -> dict[str, Any]:
    """``value`` with its identity field(s) equal to the original ce_id.

    A missing identity field is filled in; a different one is refused: a re-queued copy
    is the same record, and consumers dedupe by that id.
    """
    result = dict(value)
    for name in IDENTITY_FIELDS:
        if name not in field_names:
            continue
        given = result.get(name)
        if given is None:
            result[name] = event_id
        elif str(given).lower() != event_id.lower():
            raise RequeueRefused(
                f"field '{name}' must keep the original identity {event_id}, got {given}",
                [f"field '{name}': must equal the original ce_id {event_id}"],
            )
    return result


def requeue_headers(original: Headers, *, requeued_from: str, requeued_by: str) -> list[tuple[str, str | bytes | None]]:
    """The original headers (ce_* and all, context removed) plus fresh provenance headers.

    Provenance from an earlier re-queue of the same record is replaced, not stacked:
    readers take a header's first value, and it must be this re-queue's.
    """
    kept: list[tuple[str, str | bytes | None]] = [
        (k, v) for k, v in original if not k.startswith("dlq_") and k not in _PROVENANCE
    ]
    return [*kept, (REQUEUED_FROM, requeued_from.encode()), (REQUEUED_BY, requeued_by.encode())]


def provenance(dlq_topic: str, dlq_partition: int, dlq_offset: int) -> str:
    return f"{dlq_topic}/{dlq_partition}/{dlq_offset}"
