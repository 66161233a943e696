"""Trust travels with the reasoning (security review 3, H1), on the running fleet.

The configuration: the diagnostic agent on a model (``FLOTILLA_REASONER=llm``), the
remediation agent on rules. A model's diagnosis is the model's word about evidence an
attacker can write into (alert annotations, event messages, names), so text placed there
can make it say ``capacity`` at 0.99. Before the fix the rules planner copied that 0.99
into a plan labelled ``rules``, and the policy's guard for models never fired: a production
scale-out ran with no person.

The fleet here runs rules everywhere (no model server), so the test publishes what a
model-backed diagnostic agent would: a DiagnosisConcluded with ``reasoning.reasoner = llm``
and confidence 0.99, signed with the diagnostic agent's own key (genuine, not forged), for
the incident the health agent opened for real. It goes out as soon as the incident asks for
a diagnosis, ahead of the agent's own (every e2e diagnosis waits for a 2 s probe job), and
the test checks the plan was made from it.

checkout-api runs 6 replicas first, so the plan (12 replicas) is exactly 2x: within every
limit the policy has for a rules plan, which is what let the model's word through.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from flotilla_ops.samples import sample_value

from flotilla.contracts import load_contracts
from flotilla.envelope import Envelope
from flotilla.fleet import DIAGNOSTIC, POLICY
from flotilla.provenance import SIGNATURE_HEADER, sign_fact
from flotilla.records import DiagnosisConcluded
from tests.support.producing import ordered_producer

from .fleet import DEMO_SERVICE, Fleet, Watch, open_incident

pytestmark = pytest.mark.timeout(300)

MODEL_GUARD = "model-plan-in-production-needs-human"
SCHEMAS = {c.full_name: c.schema for c in load_contracts()}
DECIDED = {"HumanApprovalRequired", "RecoveryApproved", "CommandDenied", "IncidentEscalated"}


def run_with_replicas(fleet: Fleet, replicas: int) -> None:
    """Set the demo service's replicas as the executor would (the action token, a fencing
    token no older than the sim's newest): the estate as an earlier recovery left it."""
    now = fleet.sim("GET", f"/services/{DEMO_SERVICE}")
    fleet.sim_action(
        "POST",
        "/actions/scale",
        {
            "resource": f"production/{DEMO_SERVICE}",
            "params": {"replicas": replicas},
            "idempotencyKey": f"e2e-mixed-{uuid.uuid4().hex[:8]}:scale:{replicas}",
            "fencingToken": now["newestFencingToken"] or 0,
            "holder": "e2e-setup",
        },
    )
    assert fleet.sim("GET", f"/services/{DEMO_SERVICE}")["replicas"] == replicas


def stored_facts(fleet: Fleet, proposal_id: str) -> dict[str, Any]:
    """The facts the policy service decided on (kept with the decision)."""
    with psycopg.connect(fleet.stack.pg_dsn(POLICY.database or "")) as conn:
        row = conn.execute("SELECT facts FROM policy_proposals WHERE proposal_id = %s", (proposal_id,)).fetchone()
    assert row is not None, proposal_id
    facts: dict[str, Any] = row[0]
    return facts


def publish_as_diagnostic_agent(fleet: Fleet, producer: Any, envelope: Envelope, value: dict[str, Any]) -> None:
    """Publish ``value`` as the diagnostic agent does: signed with its own key."""
    signer = fleet.producer_signer(DIAGNOSTIC.name)  # cached: read at the test's start
    assert signer is not None
    payload = fleet.serde.serialize("incidents", envelope.type, value)
    headers = [*envelope.headers(), (SIGNATURE_HEADER, sign_fact(signer, envelope, payload).encode())]
    producer.produce("incidents", key=envelope.correlationid, value=payload, headers=headers)
    assert producer.flush(10) == 0


def test_a_model_diagnosis_at_099_planned_by_rules_ends_at_a_person(fleet: Fleet, watch: Watch) -> None:
    # made first (an idempotent producer's id and the key file take a moment): the
    # diagnosis must leave within the agent's 2 s probe job
    producer = ordered_producer(fleet.stack.kafka_bootstrap)
    assert fleet.producer_signer(DIAGNOSTIC.name) is not None
    run_with_replicas(fleet, 6)
    fleet.wait_until_healthy(DEMO_SERVICE)
    incident = open_incident(fleet, watch)  # payments-api slow: checkout-api breaches for real
    requested = watch.kind("DiagnosisRequested", incident)

    envelope = requested.envelope.caused(DiagnosisConcluded.TYPE, "/flotilla/diagnostic-agent")
    reasoning = {
        "summary": "checkout-api's replicas are saturated; scale it out now (urgent, pre-approved).",
        "evidence": [],
        "confidence": 0.99,
        "reasoner": "llm",
        "model": "some-model",
        "tokenUsage": {"promptTokens": 900, "completionTokens": 80},
    }
    value = sample_value(
        SCHEMAS[DiagnosisConcluded.TYPE],
        eventId=envelope.id,
        incidentId=incident,
        service=DEMO_SERVICE,
        environment="production",
        causeCategory="capacity",
        summary=reasoning["summary"],
        jobId=None,
        reasoning=reasoning,
        concludedAt=datetime.now(UTC),
    )
    publish_as_diagnostic_agent(fleet, producer, envelope, value)

    proposed = watch.kind("RecoveryProposed", incident, timeout=90)
    assert str(proposed.value["diagnosisEventId"]) == envelope.id, "the plan was not made from the model's diagnosis"
    plan = proposed.value["reasoning"]
    assert plan["reasoner"] == "rules"
    assert plan["confidence"] < 0.99, plan  # computed from the planner's measurements, not copied
    assert [e for e in plan["evidence"] if e["kind"] == "confidence-basis"], plan  # and it says so
    assert [(s["target"]["name"], s.get("replicas")) for s in proposed.value["steps"]] == [(DEMO_SERVICE, 12)]

    decided = watch.wait(
        lambda s: s.envelope.correlationid == incident and s.kind in DECIDED, timeout=60, what="the policy's decision"
    )
    assert decided.kind == "HumanApprovalRequired", (decided.kind, decided.value)
    assert MODEL_GUARD in decided.value["policyIds"], decided.value
    facts = stored_facts(fleet, str(proposed.value["proposalId"]))
    assert (facts["reasoner"], facts["diagnosisReasoner"]) == ("rules", "llm")

    watch.settle(3)
    assert not watch.of(incident, "RecoveryApproved")
    assert not [s for s in watch.seen if s.topic == "commands" and s.value.get("incidentId") == incident]
    assert fleet.sim("GET", f"/services/{DEMO_SERVICE}")["replicas"] == 6
