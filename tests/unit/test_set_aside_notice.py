"""A notice SetAside writes for a row too large for Kafka (infra/connect-transforms) is a dead
letter the DLQ reconciler handles like any other: attributed to its incident and its producer,
announced by a DeadLetterQuarantined fact that matches its contract, and not re-queued as it is
(it has no value). The headers are those tests/integration/test_outbox_set_aside.py reads off a
real notice."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from fastavro import parse_schema
from flotilla_ops.samples import latency_fact

from flotilla.contracts import load_contracts
from flotilla.records import DeadLetterQuarantined
from flotilla.serde import AvroSerde
from flotilla.validation import RecordValidator
from services.dlq_reconciler.api import requeue_payload
from services.dlq_reconciler.quarantine import DeadLetter, RequeueRefused, fact_envelope, quarantine_fact
from tests.unit.services.test_dlq_reconciler import serde  # noqa: F401  (the fixture)


def notice() -> tuple[DeadLetter, str]:
    """A notice as SetAside makes it: the row's headers, no value, the fleet's dlq_* context."""
    _, envelope = latency_fact("incident-aside")
    context = {
        "dlq_origin_topic": "incidents",
        "dlq_consumer": "outbox-flotilla-health",
        "dlq_reason": "unpublishable",
        "dlq_error_class": "RecordTooLargeException",
        "dlq_error_message": f"record of about 1100649 bytes … (id {envelope.id}, type …) stays in its outbox table",
        "dlq_first_failure_time": "2026-12-07T17:20:00.123Z",
        "dlq_attempts": "1",
        "dlq_record_bytes": "1100649",
        "dlq_source_position": "{lsn=40512344, txId=812}",
    }
    headers = [*envelope.headers(), *((k, v.encode()) for k, v in context.items())]
    return DeadLetter("incidents.dlq", 0, 3, b"incident-aside", None, headers), envelope.id


def test_a_notice_is_attributed_and_announced_like_any_dead_letter() -> None:
    letter, event_id = notice()
    assert (letter.reason, letter.consumer, letter.error_class) == (
        "unpublishable",
        "outbox-flotilla-health",
        "RecordTooLargeException",
    )
    assert letter.origin_topic == "incidents" and letter.claimed_origin_topic is None
    assert letter.origin_partition is None and letter.origin_offset is None  # never on its topic
    assert letter.incident_id == "incident-aside" and letter.original_event_id == event_id
    fact_env = fact_envelope(letter, "/flotilla/dlq-reconciler")
    assert fact_env is not None and fact_env.causationid == event_id
    value = {"eventId": fact_env.id, **quarantine_fact(letter, uuid.uuid4(), datetime.now(UTC)).to_value()}
    schema = next(c.schema for c in load_contracts() if c.full_name == DeadLetterQuarantined.TYPE)
    assert RecordValidator(parse_schema(schema)).problems(value) == []
    assert value["tags"]["reason"] == "unpublishable" and value["originPartition"] == -1


def test_a_notice_is_not_requeued_as_it_is(serde: AvroSerde) -> None:  # noqa: F811
    letter, _ = notice()
    with pytest.raises(RequeueRefused, match="does not decode"):
        requeue_payload(serde, letter, None)
