"""The policy service on the real stack: its database, the registry, Kafka, the HTTP API.

The service is built with ``flotilla.runner.prepare`` on a database of its own (dropped
at the end). It does not publish: no Debezium connector reads this database, so the
test's commands never reach the real ``commands`` topic (where a running executor would
carry them out); what would be published is read back from the outbox. Proposals reach
the handlers through a ConsumerLoop on a fresh topic, or by calling the handler inside a
transaction where a test needs a variant of the service (a short TTL, a dry run).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY
from psycopg.rows import dict_row

from flotilla.actions import Change, NoPreview
from flotilla.authority import Grant, Signer, verify_command
from flotilla.bootstrap import drop_outbox
from flotilla.commands import idempotency_key
from flotilla.consumer import ConsumerLoop, LoopConfig
from flotilla.digest import command_digest
from flotilla.envelope import Envelope
from flotilla.handling import BusinessRuleViolation, HandlerContext, Incoming
from flotilla.http import create_app
from flotilla.keys import Keyring
from flotilla.outbox import Outbox, OutboxRow
from flotilla.records import (
    ApprovalExpired,
    CommandDenied,
    HumanApprovalRequired,
    IncidentEscalated,
    RecoveryApproved,
    RecoveryProposed,
    RecoveryRejected,
)
from flotilla.runner import ServiceContext, prepare
from flotilla.serde import AvroSerde
from flotilla.settings import ServiceSettings, StackSettings
from flotilla.workflow import IncidentState, Status, WorkflowStore, transition
from services.policy import approvals
from services.policy.api import install_routes
from services.policy.auth import TokenStore
from services.policy.decide import PolicyEngine, StepFacts, Target
from services.policy.handlers import make_handlers
from services.policy.inventory import StaticInventory
from services.policy.preview import SIM_CANNOT, changes_digest
from services.policy.runtime import PolicyRuntime
from services.policy.service import build_spec
from services.policy.testing import AGENT, diagnosis_of, proposal, step, verified_basis
from tests.integration.kafka_wait import fresh_topic
from tests.keys import fact_settings, signed_headers
from tests.signing import AGENT_SIGNER, POLICY_SIGNER, attest
from tests.support.producing import ordered_producer

pytestmark = pytest.mark.timeout(180)

DB = f"flotilla_it_policy_{uuid.uuid4().hex[:8]}"
SCALE = "dev.flotilla.commands.ScaleService"
USERS = {
    "alice-token": {"user": "alice", "roles": ["approver"]},
    "carol-token": {"user": "carol", "roles": ["approver"]},
    "bob-token": {"user": "bob", "roles": ["viewer"]},
    # the proposer, somehow holding the approver role: still may not approve its own plan
    "agent-token": {"user": AGENT, "roles": ["approver"]},
}
REPLICAS = {"production/checkout-api": 4, "production/payments-api": 4, "dev/checkout-api": 2}


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def runtime() -> PolicyRuntime:
    return PolicyRuntime(
        engine=PolicyEngine.from_directory(),
        inventory=StaticInventory(REPLICAS),
        tokens=TokenStore(USERS),
        signer=POLICY_SIGNER,
        proposers=Keyring([AGENT_SIGNER.public_key]),
        approval_ttl_seconds=900,
    )


@pytest.fixture(scope="module")
def svc(stack: StackSettings, serde: AvroSerde, runtime: PolicyRuntime) -> Iterator[ServiceContext]:
    settings = ServiceSettings(**stack.model_dump(), **fact_settings())
    spec = replace(build_spec(runtime=runtime), database=DB, publishes=False)
    ctx = prepare(spec, settings)
    try:
        yield ctx
    finally:
        ctx.pool.close()
        drop_outbox(stack, DB)


@pytest.fixture(scope="module")
def topic(stack: StackSettings) -> Iterator[str]:
    with fresh_topic(stack.kafka_bootstrap, "it-policy", partitions=3) as name:
        yield name


@pytest.fixture(scope="module")
def loop(stack: StackSettings, svc: ServiceContext, runtime: PolicyRuntime, topic: str) -> Iterator[ConsumerLoop]:
    # Its own group id: never join (and rebalance) a running policy service's group.
    config = LoopConfig(
        name=f"policy-it-{uuid.uuid4().hex[:8]}",
        topics=(topic,),
        source=svc.source,
        contract_topics={topic: "incidents"},
    )
    consumer = ConsumerLoop(config, stack, svc.serde, svc.pool, make_handlers(svc, runtime))
    yield consumer
    consumer.stop()


@pytest.fixture(scope="module")
def client(svc: ServiceContext, runtime: PolicyRuntime) -> TestClient:
    app = create_app("policy-service", lambda: True)
    install_routes(app, svc, runtime)
    return TestClient(app)


# ------------------------------------------------------------------- helpers


def new_incident(svc: ServiceContext) -> str:
    """An incident the workflow has diagnosed: it accepts a RecoveryProposed."""
    incident = f"incident-{uuid.uuid4().hex[:8]}"
    with svc.pool.connection() as conn, conn.transaction():
        WorkflowStore.save(conn, IncidentState(incident_id=incident, status=Status.DIAGNOSED, version=3, steps=3))
        verified_basis(conn, incident)  # what its loop keeps on seeing the signed facts
    return incident


def set_incident_status(svc: ServiceContext, incident: str, status: Status) -> None:
    with svc.pool.connection() as conn, conn.transaction():
        WorkflowStore.save(conn, IncidentState(incident_id=incident, status=status, version=9, steps=9))


def envelope_for(value: dict[str, Any]) -> Envelope:
    return Envelope(type=RecoveryProposed.TYPE, source="/flotilla/remediation-agent", correlationid=value["incidentId"])


def produce(
    stack: StackSettings, serde: AvroSerde, topic: str, values: list[dict[str, Any]], *, attested: bool = True
) -> list[Envelope]:
    """Proposals as the remediation agent emits them (attested), or as anyone else could."""
    producer = ordered_producer(stack.kafka_bootstrap)
    envelopes = []
    for value in values:
        env = envelope_for(value)
        signed = attest(value) if attested and value.get("attestation") is None else value
        payload = serde.serialize("incidents", RecoveryProposed.TYPE, {"eventId": env.id, **signed})
        producer.produce(topic, key=value["incidentId"], value=payload, headers=signed_headers(env, payload))
        envelopes.append(env)
    assert producer.flush(15) == 0
    return envelopes


def drain(loop: ConsumerLoop, expected: int, timeout: float = 60) -> None:
    seen = 0
    deadline = time.monotonic() + timeout
    while seen < expected:
        assert time.monotonic() < deadline, f"consumed {seen} of {expected} records"
        seen += loop.poll_once()


def handle_directly(svc: ServiceContext, runtime: PolicyRuntime, value: dict[str, Any]) -> Envelope:
    """Run the RecoveryProposed handler in a transaction as the loop would: workflow
    state locked and advanced, emitted rows inserted (no dedupe: the caller's choice)."""
    env = envelope_for(value)
    signed = attest(value) if value.get("attestation") is None else value
    incoming = Incoming(
        "incidents", 0, 0, value["incidentId"], env, RecoveryProposed.TYPE, {"eventId": env.id, **signed}
    )
    handler = make_handlers(svc, runtime)[RecoveryProposed.TYPE]
    with svc.pool.connection() as conn, conn.transaction():
        state = WorkflowStore.load_for_update(conn, value["incidentId"])
        pending: list[OutboxRow] = []
        handler(HandlerContext(conn, incoming, state, svc.outbox, svc.source, pending))
        Outbox.insert(conn, pending)
        WorkflowStore.save(conn, transition(state, RecoveryProposed.TYPE, event_id=env.id, at=datetime.now(UTC)))
    return env


@dataclass(frozen=True)
class Row:
    id: str
    topic: str
    key: str
    type: str
    causation: str | None
    hops: int
    value: dict[str, Any]


def outbox(svc: ServiceContext, incident: str) -> list[Row]:
    with svc.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            "SELECT id::text, aggregatetype, aggregateid, type, ce_causationid, ce_hops, payload FROM outbox "
            "WHERE ce_correlationid = %s ORDER BY created_at, type",
            (incident,),
        ).fetchall()
    return [
        Row(
            r["id"],
            r["aggregatetype"],
            r["aggregateid"],
            r["type"],
            r["ce_causationid"],
            int(r["ce_hops"]),
            svc.serde.deserialize(bytes(r["payload"])).value,
        )
        for r in rows
    ]


def of_type(rows: list[Row], record_type: str) -> list[Row]:
    return [r for r in rows if r.type == record_type]


def status_of(svc: ServiceContext, proposal_id: str) -> tuple[str, str | None]:
    with svc.pool.connection() as conn:
        row = conn.execute(
            "SELECT status, superseded_by::text FROM policy_proposals WHERE proposal_id = %s", (proposal_id,)
        ).fetchone()
    assert row is not None
    return row[0], row[1]


def scale_proposal(
    incident: str, replicas: int = 12, *, name: str = "checkout-api", env: str = "production"
) -> dict[str, Any]:
    pid = str(uuid.uuid4())
    return proposal(incident, [step("ScaleService", incident, pid, replicas=replicas, name=name, environment=env)])


def pending_proposal(svc: ServiceContext, runtime: PolicyRuntime, **kw: Any) -> dict[str, Any]:
    incident = new_incident(svc)
    value = scale_proposal(incident, **kw)
    handle_directly(svc, runtime, value)
    assert status_of(svc, value["proposalId"])[0] == "pending"
    return value


# --------------------------------------------------------------------- tests


def test_an_auto_authorized_plan_emits_approval_and_commands(
    stack: StackSettings, serde: AvroSerde, svc: ServiceContext, loop: ConsumerLoop, topic: str
) -> None:
    incident = new_incident(svc)
    value = scale_proposal(incident, replicas=8)  # 4 -> 8: within 2x
    [proposed] = produce(stack, serde, topic, [value])
    drain(loop, 1)

    rows = outbox(svc, incident)
    assert [r.type for r in rows if r.topic == "incidents"] == [RecoveryApproved.TYPE]
    [approved] = of_type(rows, RecoveryApproved.TYPE)
    assert approved.value["auto"] is True
    assert approved.value["approvedBy"] == "policy-service"
    assert approved.value["digest"] == value["digest"]
    assert approved.value["policyIds"] == ["remediation-agents-may-act"]
    assert approved.causation == proposed.id and approved.hops == proposed.hops - 1

    [command] = of_type(rows, SCALE)
    assert (command.topic, command.key) == ("commands", "production/checkout-api")
    assert command.id == value["steps"][0]["commandId"]  # ce_id is the commandId the digest covers
    assert command_digest([command.value]) == value["digest"]  # exactly the digested command
    assert command.causation == approved.id
    assert status_of(svc, value["proposalId"])[0] == "authorized"
    # signed by the policy service, as an automatic decision about this proposal
    signed = verify_command(Keyring([POLICY_SIGNER.public_key]), SCALE, command.value)
    assert (signed.decision, signed.approved_by, signed.proposal_digest) == (
        Grant.AUTO,
        "policy-service",
        value["digest"],
    )


def test_a_plan_needing_a_person_is_approved_over_http(
    stack: StackSettings,
    serde: AvroSerde,
    svc: ServiceContext,
    loop: ConsumerLoop,
    topic: str,
    client: TestClient,
) -> None:
    incident = new_incident(svc)
    value = scale_proposal(incident, replicas=12)  # 4 -> 12: the demo
    produce(stack, serde, topic, [value])
    drain(loop, 1)

    rows = outbox(svc, incident)
    assert [r.type for r in rows] == [HumanApprovalRequired.TYPE]  # no command yet
    request = rows[0]
    assert request.value["requiredRole"] == "approver"
    assert request.value["proposedBy"] == AGENT
    assert request.value["policyIds"] == ["scale-beyond-2x-needs-human"]
    assert request.value["reasons"] == ["scaling production/checkout-api from 4 to 12 replicas is more than 2x"]
    assert request.value["summary"] == "scale checkout-api in production to 12 replicas"
    left = (request.value["deadline"] - request.value["requestedAt"]).total_seconds()
    assert 890 <= left <= 900

    listed = client.get("/approvals?status=pending", headers=auth("bob-token"))
    assert listed.status_code == 200
    [shown] = [a for a in listed.json() if a["proposalId"] == value["proposalId"]]
    assert shown["incidentId"] == incident
    assert shown["digest"] == value["digest"]
    assert shown["reasons"] == request.value["reasons"]
    assert 0 < shown["secondsLeft"] <= 900
    assert shown["commands"][0]["description"] == "scale checkout-api in production to 12 replicas"
    assert client.get(f"/approvals/{value['proposalId']}", headers=auth("bob-token")).json()["status"] == "pending"

    answer = client.post(
        f"/approvals/{value['proposalId']}/approve", json={"digest": value["digest"]}, headers=auth("alice-token")
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "approved"

    rows = outbox(svc, incident)
    [approved] = of_type(rows, RecoveryApproved.TYPE)
    assert approved.value["auto"] is False
    assert approved.value["approvedBy"] == "alice"
    assert approved.value["policyIds"] == ["approvers-may-decide"]
    assert approved.causation == request.id and approved.hops == request.hops - 1  # the request's chain
    [command] = of_type(rows, SCALE)
    assert command.key == "production/checkout-api"
    assert command.id == value["steps"][0]["commandId"]
    assert command_digest([command.value]) == value["digest"]
    assert command.causation == approved.id
    assert answer.json()["commandIds"] == [command.id]
    signed = verify_command(Keyring([POLICY_SIGNER.public_key]), SCALE, command.value)
    assert (signed.decision, signed.approved_by) == (Grant.APPROVED, "alice")  # who approved travels, signed

    again = client.post(
        f"/approvals/{value['proposalId']}/approve", json={"digest": value["digest"]}, headers=auth("carol-token")
    )
    assert again.status_code == 409
    assert "approved" in again.json()["detail"]
    assert len(of_type(outbox(svc, incident), SCALE)) == 1


def test_an_approval_after_the_deadline_is_refused_and_the_proposal_expires(
    svc: ServiceContext, runtime: PolicyRuntime, client: TestClient
) -> None:
    value = pending_proposal(svc, replace(runtime, approval_ttl_seconds=1))
    time.sleep(1.2)
    answer = client.post(
        f"/approvals/{value['proposalId']}/approve", json={"digest": value["digest"]}, headers=auth("alice-token")
    )
    assert answer.status_code == 409
    assert "deadline" in answer.json()["detail"]
    assert status_of(svc, value["proposalId"])[0] == "expired"
    rows = outbox(svc, value["incidentId"])
    assert len(of_type(rows, ApprovalExpired.TYPE)) == 1
    assert len(of_type(rows, IncidentEscalated.TYPE)) == 1
    assert not of_type(rows, RecoveryApproved.TYPE)
    assert not of_type(rows, SCALE)

    # it stays expired: a second try, and the sweep, change nothing
    again = client.post(
        f"/approvals/{value['proposalId']}/approve", json={"digest": value["digest"]}, headers=auth("alice-token")
    )
    assert again.status_code == 409
    approvals.expire(svc)
    assert len(of_type(outbox(svc, value["incidentId"]), ApprovalExpired.TYPE)) == 1


def test_the_proposer_cannot_approve(svc: ServiceContext, runtime: PolicyRuntime, client: TestClient) -> None:
    value = pending_proposal(svc, runtime)
    answer = client.post(
        f"/approvals/{value['proposalId']}/approve", json={"digest": value["digest"]}, headers=auth("agent-token")
    )
    assert answer.status_code == 403
    assert "cannot approve" in answer.json()["detail"]
    assert answer.json()["policyIds"] == ["proposer-cannot-approve"]
    assert status_of(svc, value["proposalId"])[0] == "pending"
    assert not of_type(outbox(svc, value["incidentId"]), RecoveryApproved.TYPE)


def test_a_wrong_digest_is_refused(svc: ServiceContext, runtime: PolicyRuntime, client: TestClient) -> None:
    value = pending_proposal(svc, runtime)
    other = "sha256:" + "0" * 64
    answer = client.post(
        f"/approvals/{value['proposalId']}/approve", json={"digest": other}, headers=auth("alice-token")
    )
    assert answer.status_code == 409
    assert answer.json()["detail"].startswith("digest mismatch")
    assert status_of(svc, value["proposalId"])[0] == "pending"


def test_a_viewer_and_a_stranger_are_refused(svc: ServiceContext, runtime: PolicyRuntime, client: TestClient) -> None:
    value = pending_proposal(svc, runtime)
    path, body = f"/approvals/{value['proposalId']}/approve", {"digest": value["digest"]}
    viewer = client.post(path, json=body, headers=auth("bob-token"))
    assert viewer.status_code == 403
    assert client.post(path.replace("approve", "reject"), json=body, headers=auth("bob-token")).status_code == 403
    assert client.post(path, json=body).status_code == 401
    assert client.post(path, json=body, headers=auth("made-up")).status_code == 401
    assert client.get("/approvals").status_code == 401
    assert status_of(svc, value["proposalId"])[0] == "pending"


def test_a_token_says_whose_it_is(client: TestClient) -> None:
    assert client.get("/me", headers=auth("alice-token")).json() == {"user": "alice", "roles": ["approver"]}
    assert client.get("/me", headers=auth("bob-token")).json() == {"user": "bob", "roles": ["viewer"]}
    assert client.get("/me", headers=auth("made-up")).status_code == 401
    assert client.get("/me").status_code == 401


def test_unknown_and_malformed_requests(svc: ServiceContext, client: TestClient) -> None:
    unknown = str(uuid.uuid4())
    answer = client.post(f"/approvals/{unknown}/approve", json={"digest": "sha256:x"}, headers=auth("alice-token"))
    assert answer.status_code == 404
    assert client.get(f"/approvals/{unknown}", headers=auth("alice-token")).status_code == 404
    assert (
        client.post("/approvals/not-a-uuid/approve", json={"digest": "x"}, headers=auth("alice-token")).status_code
        == 422
    )
    assert client.post(f"/approvals/{unknown}/approve", json={}, headers=auth("alice-token")).status_code == 422
    assert client.get("/approvals?status=bogus", headers=auth("alice-token")).status_code == 422


def test_only_the_current_proposal_for_a_resource_can_be_approved(
    stack: StackSettings,
    serde: AvroSerde,
    svc: ServiceContext,
    loop: ConsumerLoop,
    topic: str,
    client: TestClient,
) -> None:
    incident = new_incident(svc)
    older, newer = scale_proposal(incident, replicas=12), scale_proposal(incident, replicas=10)
    produce(stack, serde, topic, [older, newer])  # one key: in this order
    drain(loop, 2)

    assert status_of(svc, older["proposalId"]) == ("superseded", newer["proposalId"])
    assert status_of(svc, newer["proposalId"]) == ("pending", None)
    refused = client.post(
        f"/approvals/{older['proposalId']}/approve", json={"digest": older["digest"]}, headers=auth("alice-token")
    )
    assert refused.status_code == 409
    assert f"superseded by proposal {newer['proposalId']}" in refused.json()["detail"]

    accepted = client.post(
        f"/approvals/{newer['proposalId']}/approve", json={"digest": newer["digest"]}, headers=auth("alice-token")
    )
    assert accepted.status_code == 200, accepted.text
    [command] = of_type(outbox(svc, incident), SCALE)
    assert command.value["replicas"] == 10


def test_the_current_proposal_is_rechecked_under_lock(
    svc: ServiceContext, runtime: PolicyRuntime, client: TestClient
) -> None:
    """A newer proposal recorded but not yet superseding (the pointer moved): refused."""
    value = pending_proposal(svc, runtime)
    with svc.pool.connection() as conn:
        conn.execute(
            "UPDATE policy_current_proposals SET proposal_id = %s WHERE incident_id = %s",
            (str(uuid.uuid4()), value["incidentId"]),
        )
    answer = client.post(
        f"/approvals/{value['proposalId']}/approve", json={"digest": value["digest"]}, headers=auth("alice-token")
    )
    assert answer.status_code == 409
    assert "no longer the current proposal for production/checkout-api" in answer.json()["detail"]
    assert not of_type(outbox(svc, value["incidentId"]), SCALE)


def test_a_proposal_for_another_resource_does_not_supersede(svc: ServiceContext, runtime: PolicyRuntime) -> None:
    value = pending_proposal(svc, runtime)
    other = scale_proposal(value["incidentId"], replicas=12, name="payments-api")
    handle_directly(svc, runtime, other)
    assert status_of(svc, value["proposalId"])[0] == "pending"
    assert status_of(svc, other["proposalId"])[0] == "pending"


def test_an_incident_that_moved_on_takes_no_approval(
    svc: ServiceContext, runtime: PolicyRuntime, client: TestClient
) -> None:
    value = pending_proposal(svc, runtime)
    set_incident_status(svc, value["incidentId"], Status.RESOLVED)
    answer = client.post(
        f"/approvals/{value['proposalId']}/approve", json={"digest": value["digest"]}, headers=auth("alice-token")
    )
    assert answer.status_code == 409
    assert "RESOLVED" in answer.json()["detail"]


def test_a_rejection_escalates(svc: ServiceContext, runtime: PolicyRuntime, client: TestClient) -> None:
    value = pending_proposal(svc, runtime)
    answer = client.post(
        f"/approvals/{value['proposalId']}/reject",
        json={"digest": value["digest"], "reason": "payments is failing over already"},
        headers=auth("alice-token"),
    )
    assert answer.status_code == 200, answer.text
    rows = outbox(svc, value["incidentId"])
    [request] = of_type(rows, HumanApprovalRequired.TYPE)
    [rejected] = of_type(rows, RecoveryRejected.TYPE)
    [escalated] = of_type(rows, IncidentEscalated.TYPE)
    assert rejected.value["rejectedBy"] == "alice"
    assert rejected.value["reason"] == "payments is failing over already"
    assert rejected.causation == request.id
    assert str(escalated.value["causeEventId"]) == rejected.id
    assert escalated.value["causeType"] == RecoveryRejected.TYPE
    assert escalated.value["escalatedTo"] == "on-call"
    assert not of_type(rows, SCALE)
    assert status_of(svc, value["proposalId"])[0] == "rejected"


class Estate:
    """An inventory whose services can leave: a StaticInventory over a table the test edits,
    plus services it cannot say anything about (an unreachable platform)."""

    def __init__(self, replicas: dict[str, int], unknown: frozenset[str] = frozenset()) -> None:
        self.replicas = dict(replicas)
        self.unknown = unknown

    def current_replicas(self, target: Target) -> int | None:
        return StaticInventory(self.replicas).current_replicas(target)

    def exists(self, target: Target) -> bool | None:
        return None if target.key in self.unknown else StaticInventory(self.replicas).exists(target)


def assert_withdrawn(svc: ServiceContext, value: dict[str, Any], gone: str) -> None:
    """Withdrawn once, on the policy service's account: RecoveryRejected (continuing the
    request's chain) and the incident escalated; no approval, no command."""
    rows = outbox(svc, value["incidentId"])
    [request] = of_type(rows, HumanApprovalRequired.TYPE)
    [rejected] = of_type(rows, RecoveryRejected.TYPE)
    [escalated] = of_type(rows, IncidentEscalated.TYPE)
    assert rejected.value["rejectedBy"] == "policy-service"
    assert f"{gone} no longer exists in the estate" in rejected.value["reason"]
    assert rejected.causation == request.id
    assert str(escalated.value["causeEventId"]) == rejected.id
    assert "withdrew proposal" in escalated.value["reason"]
    assert not of_type(rows, RecoveryApproved.TYPE) and not of_type(rows, SCALE)
    with svc.pool.connection() as conn:
        row = conn.execute(
            "SELECT status, resolved_by, resolution FROM policy_proposals WHERE proposal_id = %s",
            (value["proposalId"],),
        ).fetchone()
    assert row is not None and row[:2] == ("withdrawn", "policy-service") and gone in row[2]


def test_approving_a_proposal_whose_target_left_the_estate_withdraws_it(
    svc: ServiceContext, runtime: PolicyRuntime
) -> None:
    """The fresh-clone chaos failure (issue 31): a proposal left pending for a service that
    is gone when someone approves it. Refused, withdrawn and escalated; never a command."""
    estate = Estate(REPLICAS)
    moving = replace(runtime, inventory=estate)
    app = create_app("policy-service", lambda: True)
    install_routes(app, svc, moving)
    client = TestClient(app)
    value = pending_proposal(svc, moving)
    del estate.replicas["production/checkout-api"]  # the estate changes under the waiting proposal

    answer = client.post(
        f"/approvals/{value['proposalId']}/approve", json={"digest": value["digest"]}, headers=auth("alice-token")
    )
    assert answer.status_code == 409
    assert "withdrawn" in answer.json()["detail"]
    assert "production/checkout-api no longer exists" in answer.json()["detail"]
    assert_withdrawn(svc, value, "production/checkout-api")
    listed = client.get("/approvals?status=pending", headers=auth("bob-token")).json()
    assert value["proposalId"] not in {p["proposalId"] for p in listed}

    # it stays withdrawn: a second approval, and the periodic check, change nothing
    again = client.post(
        f"/approvals/{value['proposalId']}/approve", json={"digest": value["digest"]}, headers=auth("carol-token")
    )
    assert again.status_code == 409 and "withdrawn, not waiting" in again.json()["detail"]
    approvals.withdraw_orphaned(svc, moving)
    assert_withdrawn(svc, value, "production/checkout-api")


def test_the_target_check_withdraws_orphaned_proposals_and_leaves_the_rest(
    svc: ServiceContext, runtime: PolicyRuntime
) -> None:
    estate = Estate(REPLICAS, unknown=frozenset({"production/payments-api"}))
    moving = replace(runtime, inventory=estate)
    kept_name = f"kept-{uuid.uuid4().hex[:6]}"
    estate.replicas[f"production/{kept_name}"] = 4
    orphaned = pending_proposal(svc, moving)
    kept = pending_proposal(svc, moving, name=kept_name)
    unanswered = pending_proposal(svc, moving, name="payments-api")
    # checkout-api leaves production (it is still in dev: a target is environment and name)
    estate.replicas.pop("production/checkout-api")

    withdrawn = approvals.withdraw_orphaned(svc, moving)
    assert orphaned["proposalId"] in withdrawn
    assert kept["proposalId"] not in withdrawn and unanswered["proposalId"] not in withdrawn
    assert_withdrawn(svc, orphaned, "production/checkout-api")
    assert status_of(svc, kept["proposalId"])[0] == "pending"
    # an inventory that cannot answer is not a verdict: that proposal waits for a person
    assert status_of(svc, unanswered["proposalId"])[0] == "pending"
    assert approvals.withdraw_orphaned(svc, moving) == []  # once


def test_the_expiry_sweep_emits_once_however_many_sweeps_race(svc: ServiceContext, runtime: PolicyRuntime) -> None:
    short = replace(runtime, approval_ttl_seconds=1)
    values = [pending_proposal(svc, short) for _ in range(3)]
    time.sleep(1.2)
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def sweep() -> None:
        try:
            barrier.wait(10)
            approvals.sweep(svc)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=sweep) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    approvals.sweep(svc)  # and once more, later

    for value in values:
        rows = outbox(svc, value["incidentId"])
        [request] = of_type(rows, HumanApprovalRequired.TYPE)
        [expired] = of_type(rows, ApprovalExpired.TYPE)
        [escalated] = of_type(rows, IncidentEscalated.TYPE)
        assert expired.causation == request.id
        assert expired.value["deadline"] == request.value["deadline"]
        assert expired.value["requiredRole"] == "approver"
        assert str(escalated.value["causeEventId"]) == expired.id
        assert escalated.value["escalatedTo"] == "on-call"
        assert status_of(svc, value["proposalId"])[0] == "expired"


def test_a_dry_run_emits_no_commands(svc: ServiceContext, runtime: PolicyRuntime) -> None:
    dry = replace(runtime, dry_run=True)
    for replicas, would in ((12, "require human approval"), (8, "auto-authorize"), (40, "deny")):
        incident = new_incident(svc)
        value = scale_proposal(incident, replicas=replicas)
        handle_directly(svc, dry, value)
        rows = outbox(svc, incident)
        assert [r.type for r in rows] == [CommandDenied.TYPE, IncidentEscalated.TYPE]
        assert rows[1].value["reason"].startswith(f"policy denied proposal {value['proposalId']}")
        assert f"dry-run: would {would}" in rows[1].value["reason"]
        assert rows[0].value["reasons"][0] == f"dry-run: would {would}"
        assert len(rows[0].value["reasons"]) > 1
        assert rows[0].value["policyIds"]
        assert status_of(svc, value["proposalId"])[0] == "dry-run"


def test_a_denied_plan(svc: ServiceContext, runtime: PolicyRuntime) -> None:
    incident = new_incident(svc)
    value = scale_proposal(incident, replicas=40)
    handle_directly(svc, runtime, value)
    [denied, escalated] = outbox(svc, incident)
    assert (denied.type, escalated.type) == (CommandDenied.TYPE, IncidentEscalated.TYPE)
    # a denial is the end of the plan, so the incident goes to a person (it used to stay DENIED)
    assert escalated.value["causeEventId"] == denied.value["eventId"]
    assert escalated.value["reason"].endswith("replicas 40 above the limit of 20")
    assert denied.value["reasons"] == ["replicas 40 above the limit of 20"]
    assert denied.value["policyIds"] == ["max-replicas"]
    assert str(denied.value["commandId"]) == value["steps"][0]["commandId"]
    assert status_of(svc, value["proposalId"])[0] == "denied"


def test_dev_is_auto_authorized(svc: ServiceContext, runtime: PolicyRuntime) -> None:
    incident = new_incident(svc)
    value = scale_proposal(incident, replicas=12, env="dev")  # 2 -> 12 in dev
    handle_directly(svc, runtime, value)
    rows = outbox(svc, incident)
    assert [r.type for r in rows] == [SCALE, RecoveryApproved.TYPE] or [r.type for r in rows] == [
        RecoveryApproved.TYPE,
        SCALE,
    ]
    assert of_type(rows, SCALE)[0].key == "dev/checkout-api"


def test_a_digest_that_does_not_cover_the_steps_is_a_business_rule_violation(
    svc: ServiceContext, runtime: PolicyRuntime
) -> None:
    incident = new_incident(svc)
    value = scale_proposal(incident)
    value["digest"] = "sha256:" + "f" * 64
    with pytest.raises(BusinessRuleViolation, match="does not match"):
        handle_directly(svc, runtime, value)
    with svc.pool.connection() as conn:
        assert conn.execute(
            "SELECT count(*) FROM policy_proposals WHERE proposal_id = %s", (value["proposalId"],)
        ).fetchone() == (0,)
    assert outbox(svc, incident) == []


def test_a_redelivered_proposal_under_a_new_event_id_is_decided_once(
    svc: ServiceContext, runtime: PolicyRuntime
) -> None:
    incident = new_incident(svc)
    value = scale_proposal(incident, replicas=8)
    handle_directly(svc, runtime, value)
    handle_directly(svc, runtime, value)
    assert len(of_type(outbox(svc, incident), SCALE)) == 1
    six = {**value["steps"][0], "replicas": 6}
    changed = {**value, "steps": [{**six, "idempotencyKey": idempotency_key("ScaleService", six)}]}
    changed["digest"] = proposal(incident, changed["steps"])["digest"]
    with pytest.raises(BusinessRuleViolation, match="already received with other steps"):
        handle_directly(svc, runtime, changed)


def test_an_escalated_incident_cancels_its_pending_approvals(
    svc: ServiceContext, runtime: PolicyRuntime, client: TestClient
) -> None:
    value = pending_proposal(svc, runtime)
    incident = value["incidentId"]
    env = Envelope(type=IncidentEscalated.TYPE, source="/flotilla/health-agent", correlationid=incident)
    escalation = {
        "eventId": env.id,
        "incidentId": incident,
        "reason": "wall time budget exceeded",
        "causeEventId": str(uuid.uuid4()),
        "causeType": "dev.flotilla.incidents.BudgetExceeded",
        "escalatedTo": "on-call",
        "escalatedAt": value["proposedAt"],
    }
    incoming = Incoming("incidents", 0, 1, incident, env, IncidentEscalated.TYPE, escalation)
    with svc.pool.connection() as conn, conn.transaction():
        make_handlers(svc, runtime)[IncidentEscalated.TYPE](
            HandlerContext(conn, incoming, None, svc.outbox, svc.source, [])
        )
    assert status_of(svc, value["proposalId"])[0] == "cancelled"
    answer = client.post(
        f"/approvals/{value['proposalId']}/approve", json={"digest": value["digest"]}, headers=auth("alice-token")
    )
    assert answer.status_code == 409


# ------------------------------------------------ proposals are believed only from the agent


def dead_letter_reasons(stack: StackSettings, topic: str, event_ids: set[str]) -> dict[str, str]:
    """ce_id -> dlq_reason of the letters on ``<topic>.dlq`` for ``event_ids``."""
    from confluent_kafka import Consumer

    reader = Consumer(
        {"bootstrap.servers": stack.kafka_bootstrap, "group.id": f"dlq-{uuid.uuid4()}", "auto.offset.reset": "earliest"}
    )
    reader.subscribe([f"{topic}.dlq"])
    found: dict[str, str] = {}
    deadline = time.monotonic() + 30
    try:
        while set(found) != event_ids and time.monotonic() < deadline:
            msg = reader.poll(0.2)
            if msg is None or msg.error():
                continue
            headers = {k: (v or b"").decode() for k, v in msg.headers() or []}
            if headers.get("ce_id") in event_ids:
                found[headers["ce_id"]] = headers["dlq_reason"]
    finally:
        reader.close()
    return found


def test_a_forged_proposal_never_replaces_one_waiting_for_a_person(
    stack: StackSettings, serde: AvroSerde, svc: ServiceContext, runtime: PolicyRuntime, loop: ConsumerLoop, topic: str
) -> None:
    """The attack of the review (H6): while alice's decision on 4 -> 12 is pending, someone
    who can write to incidents publishes 4 -> 8 (exactly 2x: auto) claiming to be the agent,
    with confidence 0.99 — unsigned, signed by a key nobody trusts, or the agent's own
    proposal with its confidence raised after signing. Each is refused as unauthorized;
    the pending proposal stays pending and current, and no command is issued."""
    waiting = pending_proposal(svc, runtime, replicas=12)
    incident = waiting["incidentId"]

    def forged(**reasoning: Any) -> dict[str, Any]:
        value = scale_proposal(incident, replicas=8)
        value["proposedBy"] = AGENT
        value["reasoning"] = {**value["reasoning"], "confidence": 0.99, **reasoning}
        return value

    rogue = Signer(Ed25519PrivateKey.generate())
    raised = attest(forged(confidence=0.5))
    raised["reasoning"] = {**raised["reasoning"], "confidence": 0.99}
    sent = [
        *produce(stack, serde, topic, [forged()], attested=False),
        *produce(stack, serde, topic, [attest(forged(), rogue)]),
        *produce(stack, serde, topic, [raised]),
    ]
    drain(loop, 3)
    assert status_of(svc, waiting["proposalId"]) == ("pending", None)
    rows = outbox(svc, incident)
    assert of_type(rows, SCALE) == [] and of_type(rows, RecoveryApproved.TYPE) == []
    assert dead_letter_reasons(stack, topic, {e.id for e in sent}) == {e.id: "unauthorized" for e in sent}
    with svc.pool.connection() as conn:
        current = conn.execute(
            "SELECT proposal_id::text FROM policy_current_proposals WHERE incident_id = %s", (incident,)
        ).fetchall()
    assert current == [(waiting["proposalId"],)]


def test_an_attested_proposal_resting_on_no_verified_diagnosis_is_refused_before_any_decision(
    stack: StackSettings, serde: AvroSerde, svc: ServiceContext, runtime: PolicyRuntime, loop: ConsumerLoop, topic: str
) -> None:
    """The agent's own signature is not enough: the diagnosis a plan names must be one the
    diagnostic agent stated to this service, for the same incident, and the incident must
    have been opened by the health agent (services/policy/basis.py). An agent planning from
    a forged or foreign diagnosis (its key stolen, or fooled) gets no decision."""
    incident, other = new_incident(svc), new_incident(svc)
    unknown = scale_proposal(incident, replicas=8)
    unknown["diagnosisEventId"] = str(uuid.uuid4())  # a diagnosis nobody verified
    foreign = scale_proposal(incident, replicas=8)
    foreign["diagnosisEventId"] = diagnosis_of(other)  # verified, but another incident's
    unopened = f"incident-{uuid.uuid4().hex[:8]}"
    set_incident_status(svc, unopened, Status.DIAGNOSED)
    with svc.pool.connection() as conn, conn.transaction():  # a diagnosis, but no opening
        conn.execute(
            "INSERT INTO policy_verified_facts (event_id, incident_id, record_type, producer, digest) "
            "VALUES (%s, %s, 'dev.flotilla.decisions.DiagnosisConcluded', 'diagnostic-agent', 'sha256:x')",
            (diagnosis_of(unopened), unopened),
        )
    baseless = scale_proposal(unopened, replicas=8)
    before = REGISTRY.get_sample_value("flotilla_policy_unsupported_proposals_total") or 0.0
    sent = produce(stack, serde, topic, [unknown, foreign, baseless])
    drain(loop, 3)
    assert dead_letter_reasons(stack, topic, {e.id for e in sent}) == {e.id: "unauthorized" for e in sent}
    for value in (unknown, foreign, baseless):
        with svc.pool.connection() as conn:  # never decided, never stored
            stored = conn.execute("SELECT 1 FROM policy_proposals WHERE proposal_id = %s", (value["proposalId"],))
            assert stored.fetchone() is None, value["proposalId"]
        rows = outbox(svc, value["incidentId"])
        assert of_type(rows, SCALE) == [] and of_type(rows, RecoveryApproved.TYPE) == []
        # the incident has no plan now: a person takes it, told why
        escalated = of_type(rows, IncidentEscalated.TYPE)
        assert escalated and all("was refused" in e.value["reason"] for e in escalated), escalated
    # at least once each: a batch with a refusal is run again record by record
    assert REGISTRY.get_sample_value("flotilla_policy_unsupported_proposals_total") >= before + 3


def test_a_pending_proposal_edited_in_the_database_is_refused_at_approval_and_nothing_is_signed(
    svc: ServiceContext, runtime: PolicyRuntime, client: TestClient
) -> None:
    """Security review 2 (Medium): whoever holds the policy's database role edits a pending
    proposal's stored steps (4 -> 40 replicas); the approver approves the digest they were
    shown. The stored steps no longer hash to it: 409, and no command is signed."""
    value = pending_proposal(svc, runtime, replicas=12)
    with svc.pool.connection() as conn, conn.transaction():
        conn.execute(
            "UPDATE policy_proposals SET steps = jsonb_set(steps, '{0,replicas}', '40') WHERE proposal_id = %s",
            (value["proposalId"],),
        )
    answer = client.post(
        f"/approvals/{value['proposalId']}/approve", json={"digest": value["digest"]}, headers=auth("alice-token")
    )
    assert answer.status_code == 409, answer.text
    assert "edited after it was proposed" in answer.text
    assert status_of(svc, value["proposalId"])[0] == "pending"
    rows = outbox(svc, value["incidentId"])
    assert of_type(rows, SCALE) == [] and of_type(rows, RecoveryApproved.TYPE) == []


def test_a_step_whose_idempotency_key_is_not_its_own_is_refused(svc: ServiceContext, runtime: PolicyRuntime) -> None:
    """A key chosen freely could be another proposal's (key squatting, H2): the agent's
    proposals carry the key derived from the step, and nothing else is decided on."""
    incident = new_incident(svc)
    value = scale_proposal(incident, replicas=8)
    value["steps"] = [{**value["steps"][0], "idempotencyKey": f"{incident}:scale:12"}]
    value["digest"] = command_digest(value["steps"])
    with pytest.raises(BusinessRuleViolation, match="is not"):
        handle_directly(svc, runtime, value)
    doubled = scale_proposal(incident, replicas=8)
    doubled["steps"] = [doubled["steps"][0], {**doubled["steps"][0], "commandId": str(uuid.uuid4())}]
    doubled["digest"] = command_digest(doubled["steps"])
    with pytest.raises(BusinessRuleViolation, match="repeats idempotency key"):
        handle_directly(svc, runtime, doubled)
    assert outbox(svc, incident) == []


def test_a_rules_plan_resting_on_a_model_diagnosis_waits_for_a_person_in_production(
    stack: StackSettings, serde: AvroSerde, svc: ServiceContext, loop: ConsumerLoop, topic: str
) -> None:
    """Security review 3, H1: the diagnostic agent on a model, the remediation agent on
    rules. The diagnostic agent's signed DiagnosisConcluded (reasoner llm, 0.99) goes through
    the loop, which keeps its reasoner with the verified fact; the rules plan resting on it
    (4 -> 8, within 2x, at 0.99: what auto-authorized before) goes to a person, and the
    facts decided on say why. The proposal has no say in the diagnosis' reasoner."""
    from flotilla_ops.samples import sample_value

    from flotilla.contracts import load_contracts
    from flotilla.records import DiagnosisConcluded

    incident = f"incident-{uuid.uuid4().hex[:8]}"
    with svc.pool.connection() as conn, conn.transaction():
        WorkflowStore.save(conn, IncidentState(incident_id=incident, status=Status.DIAGNOSING, version=2, steps=2))
        verified_basis(conn, incident)  # the health agent's opening (and a rules diagnosis the plan does not name)
    diagnosis = Envelope(type=DiagnosisConcluded.TYPE, source="/flotilla/diagnostic-agent", correlationid=incident)
    schema = next(c.schema for c in load_contracts() if c.full_name == DiagnosisConcluded.TYPE)
    reasoning = {
        "summary": "saturated: scale out",
        "evidence": [],
        "confidence": 0.99,
        "reasoner": "llm",
        "model": "m",
        "tokenUsage": {"promptTokens": 1, "completionTokens": 1},
    }
    value = sample_value(
        schema,
        eventId=diagnosis.id,
        incidentId=incident,
        service="checkout-api",
        environment="production",
        causeCategory="capacity",
        reasoning=reasoning,
    )
    payload = serde.serialize("incidents", DiagnosisConcluded.TYPE, value)
    producer = ordered_producer(stack.kafka_bootstrap)
    producer.produce(topic, key=incident, value=payload, headers=signed_headers(diagnosis, payload))
    assert producer.flush(15) == 0
    drain(loop, 1)
    with svc.pool.connection() as conn:
        kept = conn.execute("SELECT reasoner FROM policy_verified_facts WHERE event_id = %s", (diagnosis.id,))
        assert kept.fetchone() == ("llm",)

    planned = scale_proposal(incident, replicas=8)
    planned["reasoning"]["confidence"] = 0.99
    planned["diagnosisEventId"] = diagnosis.id  # what the agent planned from (attested)
    produce(stack, serde, topic, [planned])
    drain(loop, 1)

    rows = outbox(svc, incident)
    assert [r.type for r in rows] == [HumanApprovalRequired.TYPE]  # no approval, no command
    assert rows[0].value["policyIds"] == ["model-plan-in-production-needs-human"]
    assert "diagnosis: llm" in rows[0].value["reasons"][0]
    with svc.pool.connection() as conn:
        facts = conn.execute("SELECT facts FROM policy_proposals WHERE proposal_id = %s", (planned["proposalId"],))
        stored = facts.fetchone()
    assert stored is not None and (stored[0]["reasoner"], stored[0]["diagnosisReasoner"]) == ("rules", "llm")

    # the control: the same plan resting on the rules diagnosis is authorized with no person
    control = scale_proposal(new_incident(svc), replicas=8)
    control["reasoning"]["confidence"] = 0.99
    produce(stack, serde, topic, [control])
    drain(loop, 1)
    assert [r.type for r in outbox(svc, control["incidentId"]) if r.topic == "incidents"] == [RecoveryApproved.TYPE]


class FixedChange:
    """A previewer that answers one fixed Change for every step. This is a test of the
    policy's seam (what it stores, shows, binds and signs), not of any target's dry run:
    the Kubernetes previewer's own test runs against the API server."""

    CHANGE = Change({"replicas": 4}, {"replicas": 12})

    def preview(self, step: StepFacts) -> Change | NoPreview:
        return self.CHANGE


class Broken:
    def preview(self, step: StepFacts) -> Change | NoPreview:
        raise RuntimeError("the API server refused the dry run (403)")


def test_the_change_a_dry_run_showed_is_shown_required_and_signed(
    svc: ServiceContext, runtime: PolicyRuntime, client: TestClient
) -> None:
    change = FixedChange.CHANGE
    bound = changes_digest([change])
    assert bound is not None
    value = pending_proposal(svc, replace(runtime, previewer=FixedChange()), replicas=12)
    proposal_id, incident = value["proposalId"], value["incidentId"]
    [request] = of_type(outbox(svc, incident), HumanApprovalRequired.TYPE)
    assert request.value["changeDigest"] == bound

    shown = client.get(f"/approvals/{proposal_id}", headers=auth("bob-token")).json()
    assert shown["changeDigest"] == bound
    assert shown["commands"][0]["change"] == change.to_json()
    assert shown["commands"][0]["change"]["lines"] == ["replicas: 4 → 12"]

    path = f"/approvals/{proposal_id}/approve"
    for body in ({"digest": value["digest"]}, {"digest": value["digest"], "changeDigest": "sha256:" + "0" * 64}):
        refused = client.post(path, json=body, headers=auth("alice-token"))
        assert refused.status_code == 409, refused.text
        assert "you were shown another change" in refused.json()["detail"]
    assert status_of(svc, proposal_id)[0] == "pending"
    assert not of_type(outbox(svc, incident), SCALE)

    answer = client.post(path, json={"digest": value["digest"], "changeDigest": bound}, headers=auth("alice-token"))
    assert answer.status_code == 200, answer.text
    rows = outbox(svc, incident)
    [approved] = of_type(rows, RecoveryApproved.TYPE)
    assert approved.value["changeDigest"] == bound
    [command] = of_type(rows, SCALE)
    assert command.value["authorization"]["expectedChange"] == change.digest
    signed = verify_command(Keyring([POLICY_SIGNER.public_key]), SCALE, command.value)
    assert (signed.decision, signed.expected_change) == (Grant.APPROVED, change.digest)


def test_a_target_that_cannot_dry_run_says_so_and_binds_nothing(
    svc: ServiceContext, runtime: PolicyRuntime, client: TestClient
) -> None:
    """The sim's previewer (the default) and a previewer that fails: the person is asked all
    the same, told why there is no change to see, and approves the digest alone."""
    for previewer, expected in ((runtime.previewer, SIM_CANNOT), (Broken(), "refused the dry run (403)")):
        value = pending_proposal(svc, replace(runtime, previewer=previewer), replicas=12)
        [request] = of_type(outbox(svc, value["incidentId"]), HumanApprovalRequired.TYPE)
        assert request.value["changeDigest"] is None
        shown = client.get(f"/approvals/{value['proposalId']}", headers=auth("bob-token")).json()
        assert shown["changeDigest"] is None
        assert expected in shown["commands"][0]["change"]["unavailable"]
        answer = client.post(
            f"/approvals/{value['proposalId']}/approve", json={"digest": value["digest"]}, headers=auth("alice-token")
        )
        assert answer.status_code == 200, answer.text
        [command] = of_type(outbox(svc, value["incidentId"]), SCALE)
        assert command.value["authorization"]["expectedChange"] is None
        verify_command(Keyring([POLICY_SIGNER.public_key]), SCALE, command.value)


def test_changes_edited_in_the_database_are_refused_at_approval_and_nothing_is_signed(
    svc: ServiceContext, runtime: PolicyRuntime, client: TestClient
) -> None:
    """Whoever holds the policy's database role rewrites the change a person will be shown
    (and its digest, consistently): the stored changes no longer hash to it, 409."""
    value = pending_proposal(svc, replace(runtime, previewer=FixedChange()), replicas=12)
    with svc.pool.connection() as conn, conn.transaction():
        conn.execute(
            "UPDATE policy_proposals SET changes = jsonb_set(changes, '{0,after,replicas}', '5') "
            "WHERE proposal_id = %s",
            (value["proposalId"],),
        )
    bound = changes_digest([FixedChange.CHANGE])
    answer = client.post(
        f"/approvals/{value['proposalId']}/approve",
        json={"digest": value["digest"], "changeDigest": bound},
        headers=auth("alice-token"),
    )
    assert answer.status_code == 409, answer.text
    assert "edited after they were shown" in answer.text
    rows = outbox(svc, value["incidentId"])
    assert of_type(rows, SCALE) == [] and of_type(rows, RecoveryApproved.TYPE) == []
