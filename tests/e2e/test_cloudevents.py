"""Every record of a whole incident is a CloudEvent that the official SDK's Kafka binding reads.

One incident through the running fleet, from the opening fact to a verified recovery,
read raw from ``incidents`` and ``commands`` (as a consumer outside Flotilla would read
it) and decoded with the CloudEvents SDK (tests/cloudevents_conformance.py): no header
without a value, ``datacontenttype`` and the extensions on every record, and
``causationid`` exactly on the records that have a cause — all but the opening fact,
each naming another record of the same incident.
"""

from __future__ import annotations

import pytest

from flotilla.tailing import header, tail_consumer

from ..cloudevents_conformance import assert_conformant
from ..integration.kafka_wait import read_until_all
from .fleet import Fleet, Watch, awaiting_approval

pytestmark = pytest.mark.timeout(300)

# The records of a happy path with a human approval (tests/e2e/test_incidents.py), at the least.
HAPPY_PATH = {
    "ServiceLatencyIncreased",
    "DiagnosisRequested",
    "DependencyFailureSuspected",
    "RecoveryProposed",
    "HumanApprovalRequired",
    "RecoveryApproved",
    "RecoveryExecuted",
    "RecoveryCompleted",
}


def test_every_record_of_an_incident_is_read_by_the_cloudevents_sdk(fleet: Fleet, watch: Watch) -> None:
    raw = tail_consumer(fleet.stack.kafka_bootstrap, ["incidents", "commands"])
    try:
        incident, request = awaiting_approval(fleet, watch)
        fleet.approve(str(request.value["proposalId"]), str(request.value["digest"]))
        watch.kind("RecoveryCompleted", incident, timeout=60)
        seen = watch.of(incident)
        records = [
            msg
            for msg in read_until_all(raw, {s.envelope.id for s in seen}, timeout=60)
            if header(msg.headers(), "ce_correlationid") == incident.encode()
        ]
    finally:
        raw.close()

    kinds = {s.kind for s in seen}
    assert kinds >= HAPPY_PATH, f"missing from the incident: {sorted(HAPPY_PATH - kinds)}"
    assert {s.topic for s in seen} == {"incidents", "commands"}
    (opening,) = [s for s in seen if s.kind == "ServiceLatencyIncreased"]
    ids = {s.envelope.id for s in seen}

    decoded_kinds = set()
    for msg in records:
        event_id = (header(msg.headers(), "ce_id") or b"").decode()
        if event_id == opening.envelope.id:
            event = assert_conformant(msg, caused_by=None)
        else:
            cause = header(msg.headers(), "ce_causationid")
            assert cause is not None, f"{msg.topic()} record {event_id} has no ce_causationid header"
            assert cause.decode() in ids, f"{event_id} names a cause outside its incident: {cause.decode()}"
            event = assert_conformant(msg, caused_by=cause.decode())
        decoded_kinds.add(event.get_type().rsplit(".", 1)[-1])
    assert decoded_kinds == kinds, "every record type the fleet produced was decoded by the SDK"
