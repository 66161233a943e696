"""Forged facts against the running fleet (flotilla.provenance): the attacks of the security
review that went around the signed proposals and commands, written to the topic with a
raw producer, as anyone with write access to ``incidents`` could.

- ServiceLatencyIncreased + DiagnosisRequested + DiagnosisConcluded (cause capacity,
  confidence 0.99) for a healthy production service, in the producers' names: unsigned,
  or signed with another member's key. Before, the remediation agent planned and signed
  a scale-up and the policy authorized it with no person involved;
- RecoveryExecuted, RecoveryCompleted and RecoveryFailed forged while a person's approval
  waits: before, the first made the policy refuse the approval, the second closed the
  executor's saga, the third started a compensation.

Each forged record is refused by every consumer before any handler, dead-lettered
``unauthorized`` and counted; nothing moves: no incident state, no proposal, no command, no
compensation, and the real incident goes on as if nothing had been written.
"""

from __future__ import annotations

import time
import urllib.request
import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from flotilla_ops.samples import sample_value

from flotilla.contracts import load_contracts
from flotilla.envelope import Envelope
from flotilla.fleet import DIAGNOSTIC, EXECUTOR, HEALTH, POLICY, REMEDIATION, Member, url
from flotilla.provenance import SIGNATURE_HEADER, sign_fact
from flotilla.records import (
    DiagnosisConcluded,
    DiagnosisRequested,
    RecoveryCompleted,
    RecoveryExecuted,
    RecoveryFailed,
    ServiceLatencyIncreased,
)
from tests.support.producing import ordered_producer

from .fleet import Fleet, Watch, awaiting_approval

pytestmark = pytest.mark.timeout(300)

SCHEMAS = {c.full_name: c.schema for c in load_contracts()}
HEALTHY = "search-api"  # production, healthy in the sim: nothing should ever touch it
CONSUMERS = (HEALTH, DIAGNOSTIC, REMEDIATION, POLICY, EXECUTOR)
# What the fleet emits for an incident it believes in (a forged record's own copy on the
# topic, and the reconciler's quarantine notices, are not the fleet acting on it).
MOVES = {
    "DiagnosisRequested",
    "RecoveryProposed",
    "HumanApprovalRequired",
    "RecoveryApproved",
    "RecoveryRejected",
    "IncidentEscalated",
    "RecoveryExecuted",
    "CompensationCompleted",
    "CommandFailed",
    "CommandRejected",
}


def forged(record_type: str, producer: Member, incident: str, cause: Envelope | None, **fields: Any) -> tuple:
    """A schema-valid record in ``producer``'s name, as a forger writes it."""
    envelope = Envelope(
        type=record_type,
        source=f"/flotilla/{producer.name}",
        correlationid=incident,
        causationid=cause.id if cause else None,
    )
    value = sample_value(SCHEMAS[record_type], eventId=envelope.id, incidentId=incident, **fields)
    return envelope, value


def publish(fleet: Fleet, records: list[tuple[Envelope, dict[str, Any]]], signer: Any = None) -> None:
    producer = ordered_producer(fleet.stack.kafka_bootstrap)
    for envelope, value in records:
        payload = fleet.serde.serialize("incidents", envelope.type, value)
        headers = envelope.headers()
        if signer is not None:
            headers.append((SIGNATURE_HEADER, sign_fact(signer, envelope, payload).encode()))
        producer.produce("incidents", key=envelope.correlationid, value=payload, headers=headers)
    assert producer.flush(10) == 0


def refused(watch: Watch, envelope: Envelope, refusal: str) -> None:
    """The forged record was dead-lettered ``unauthorized``, saying why, and quarantined (one
    entry per record, whichever consumers dead-lettered it)."""
    notice = watch.wait(
        lambda s: s.kind == "DeadLetterQuarantined" and str(s.value.get("originalEventId")) == envelope.id,
        timeout=60,
        what=f"a quarantine of the forged {envelope.type}",
    )
    assert notice.value["tags"]["reason"] == "unauthorized", notice.value
    assert refusal in notice.value["errorMessage"], notice.value


def refusals(record_types: list[str]) -> dict[tuple[str, str], float]:
    """Per consumer and record type: the records it refused as unsigned
    (flotilla_records_unauthorized_total) plus those of a type it does not read, which it
    passes over unread and so never verifies (flotilla_records_skipped_total): either way,
    nothing of the record reached a handler or the consumer's workflow."""
    return {(m.name, t): unauthorized_count(m, t) + skipped_count(m, t) for m in CONSUMERS for t in record_types}


def every_consumer_refused(before: dict[tuple[str, str], float], record_types: list[str]) -> None:
    """Each consumer counted each forged record once, refused or passed over unread (metrics
    come up a little after the letter); who needs the type dead-lettered it (``refused``)."""
    deadline = time.monotonic() + 30
    while True:
        after = refusals(record_types)
        missing = [k for k in before if after[k] < before[k] + 1]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not missing, f"not counted as refused by: {missing}"


def fleet_moves(watch: Watch, incident: str, forged_ids: set[str]) -> list[str]:
    return [
        f"{s.kind} from {s.envelope.source}"
        for s in watch.of(incident)
        if s.envelope.id not in forged_ids and (s.kind in MOVES or s.topic == "commands")
    ]


def real(forged_ids: set[str], kind: str, incident: str) -> Any:
    """A match for the fleet's own ``kind`` record of ``incident`` (not one of the forged)."""
    return lambda s: s.kind == kind and s.envelope.correlationid == incident and s.envelope.id not in forged_ids


def unauthorized_count(member: Member, record_type: str) -> float:
    with urllib.request.urlopen(f"{url(member)}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("flotilla_records_unauthorized_total{") and f'type="{record_type}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def skipped_count(member: Member, record_type: str) -> float:
    with urllib.request.urlopen(f"{url(member)}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    label = f'type="{record_type}"'
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("flotilla_records_skipped_total{") and label in line
    )


def workflow_rows(fleet: Fleet, member: Member, incident: str) -> int:
    with psycopg.connect(fleet.stack.pg_dsn(member.database or "")) as conn:
        row = conn.execute("SELECT count(*) FROM incident_workflow WHERE incident_id = %s", (incident,)).fetchone()
    return int(row[0]) if row else 0


def diagnosis_chain(incident: str) -> list[tuple[Envelope, dict[str, Any]]]:
    """The review's N1: a healthy production service, diagnosed as short of capacity."""
    now = datetime.now(UTC)
    where = {"service": HEALTHY, "environment": "production"}
    opened = forged(ServiceLatencyIncreased.TYPE, HEALTH, incident, None, p95LatencyMs=1900.0, **where)
    requested = forged(
        DiagnosisRequested.TYPE, HEALTH, incident, opened[0], triggerEventId=opened[0].id, requestedAt=now, **where
    )
    reasoning = {
        "summary": "replicas saturated",
        "evidence": [],
        "confidence": 0.99,
        "reasoner": "rules",
        "model": None,
        "tokenUsage": {"promptTokens": 0, "completionTokens": 0},
    }
    concluded = forged(
        DiagnosisConcluded.TYPE,
        DIAGNOSTIC,
        incident,
        requested[0],
        causeCategory="capacity",
        reasoning=reasoning,
        concludedAt=now,
        **where,
    )
    return [opened, requested, concluded]


@pytest.mark.parametrize("signed_by", [None, EXECUTOR], ids=["unsigned", "another-members-key"])
def test_a_forged_diagnosis_of_a_healthy_service_moves_nothing(
    fleet: Fleet, watch: Watch, signed_by: Member | None
) -> None:
    incident = f"incident-forged-{uuid.uuid4().hex[:8]}"
    chain = diagnosis_chain(incident)
    types = [e.type for e, _ in chain]
    before = refusals(types)
    replicas = fleet.sim("GET", f"/services/{HEALTHY}")["replicas"]
    publish(fleet, chain, fleet.producer_signer(signed_by.name) if signed_by else None)

    reason = "carries no ce_signature" if signed_by is None else "which is not trusted"
    for envelope, _ in chain:
        refused(watch, envelope, reason)
    every_consumer_refused(before, types)
    watch.settle(3)
    assert fleet_moves(watch, incident, {e.id for e, _ in chain}) == []
    for member in (DIAGNOSTIC, REMEDIATION, POLICY):
        assert workflow_rows(fleet, member, incident) == 0, member.name  # no incident state anywhere
    assert fleet.sim("GET", f"/services/{HEALTHY}")["replicas"] == replicas


def test_forged_outcomes_while_a_person_decides_neither_refuse_close_nor_undo_anything(
    fleet: Fleet, watch: Watch
) -> None:
    incident, request = awaiting_approval(fleet, watch)
    proposal = str(request.value["proposalId"])
    now = datetime.now(UTC)
    target = {"kind": "service", "environment": "production", "name": "checkout-api"}
    outcomes = [
        forged(
            RecoveryExecuted.TYPE,
            EXECUTOR,
            incident,
            request.envelope,
            proposalId=proposal,
            target=target,
            outcome="applied",
            executedAt=now,
        ),
        forged(RecoveryCompleted.TYPE, HEALTH, incident, request.envelope, proposalId=proposal, service="checkout-api"),
        forged(RecoveryFailed.TYPE, HEALTH, incident, request.envelope, proposalId=proposal, compensationRequired=True),
    ]
    types = [e.type for e, _ in outcomes]
    before = refusals(types)
    publish(fleet, outcomes)
    for envelope, _ in outcomes:
        refused(watch, envelope, "carries no ce_signature")
    every_consumer_refused(before, types)
    forged_ids = {e.id for e, _ in outcomes}
    watch.settle(2)
    acted = {"RecoveryExecuted", "RecoveryRejected", "CompensationCompleted", "CommandFailed", "IncidentEscalated"}
    before = [s for s in watch.of(incident) if s.envelope.id not in forged_ids]
    assert not [s.kind for s in before if s.kind in acted or s.topic == "commands"]

    # The person's approval is still the one that counts: it executes once, is verified by
    # the health agent, and nothing was ever compensated.
    fleet.approve(proposal, str(request.value["digest"]))
    executed = watch.wait(real(forged_ids, "RecoveryExecuted", incident), what="the real RecoveryExecuted")
    assert executed.envelope.source == "/flotilla/executor"
    completed = watch.wait(
        real(forged_ids, "RecoveryCompleted", incident), timeout=120, what="the health agent's own verification"
    )
    assert completed.envelope.source == "/flotilla/health-agent"
    watch.settle(2)
    fleets = [s for s in watch.of(incident) if s.envelope.id not in forged_ids]
    assert [s.kind for s in fleets].count("RecoveryExecuted") == 1
    assert not [s for s in fleets if s.kind in {"CompensationCompleted", "RecoveryFailed", "RecoveryRejected"}]
