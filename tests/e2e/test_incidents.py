"""Whole incidents through the running fleet: detection → diagnosis → proposal → policy
→ (approval) → fenced execution → verified recovery, and the ways that can go wrong."""

from __future__ import annotations

import json
import time
from typing import Any

import psycopg
import pytest

from flotilla import Status, WorkflowStore
from flotilla.envelope import Envelope
from flotilla.fleet import EXECUTOR, HEALTH
from flotilla.rawrecords import jsonable
from services.executor import leases

from .conftest import E2E_SETTINGS
from .fleet import (
    APPROVER,
    DEMO_SERVICE,
    PROPOSED,
    VIEWER,
    Fleet,
    HttpError,
    Watch,
    awaiting_approval,
    counter_proposal,
    open_incident,
    produce,
)

pytestmark = pytest.mark.timeout(300)

OPERATOR = "operator-token"  # the DLQ reconciler's local default operator
PROPOSER_TOKEN = "mallory-token"  # configured as user "remediation-agent" with the approver role


def test_happy_path_with_a_human_approval(fleet: Fleet, watch: Watch) -> None:
    incident, request = awaiting_approval(fleet, watch)
    for kind in ("DiagnosisRequested", "DependencyFailureSuspected", "RecoveryProposed"):
        assert watch.of(incident, kind), f"no {kind} before the approval request"
    proposal = str(request.value["proposalId"])
    fleet.approve(proposal, str(request.value["digest"]))

    approved = watch.kind("RecoveryApproved", incident)
    assert approved.value["auto"] is False
    assert approved.value["approvedBy"] == "alice"
    executed = watch.kind("RecoveryExecuted", incident)
    key = f"{incident}:{proposal}:scale:checkout-api:12"  # bound to the proposal: nobody could guess it
    assert executed.value["idempotencyKey"] == key
    watch.kind("RecoveryCompleted", incident, timeout=60)

    # one incident for one ongoing breach, one action for one approval
    opened = [s for s in watch.seen if s.kind == "ServiceLatencyIncreased" and s.value["service"] == DEMO_SERVICE]
    assert len(opened) == 1
    assert len(watch.of(incident, "RecoveryExecuted")) == 1
    assert fleet.sim_action("GET", f"/actions/{key}")["status"] == "applied"
    # causation links the chain back to the opening fact
    assert executed.envelope.causationid is not None
    verdict = fleet.audit_verify()
    assert verdict["ok"] is True, verdict


def test_auto_authorized_path_in_dev(fleet: Fleet, watch: Watch) -> None:
    fleet.wait_until_healthy("checkout-dev")
    incident = open_incident(fleet, watch, service="checkout-dev", dependency="payments-dev")
    approved = watch.kind("RecoveryApproved", incident, timeout=90)
    assert approved.value["auto"] is True
    executed = watch.kind("RecoveryExecuted", incident)
    assert executed.value["idempotencyKey"] == f"{incident}:{approved.value['proposalId']}:scale:checkout-dev:6"
    watch.kind("RecoveryCompleted", incident, timeout=60)
    assert not watch.of(incident, "HumanApprovalRequired")
    fleet.reset_sim()
    fleet.wait_until_healthy("checkout-dev")


def test_approval_by_the_proposer_is_refused(fleet: Fleet, watch: Watch) -> None:
    incident, request = awaiting_approval(fleet, watch)
    with pytest.raises(HttpError) as refused:
        fleet.approve(str(request.value["proposalId"]), str(request.value["digest"]), token=PROPOSER_TOKEN)
    assert refused.value.status == 403
    with pytest.raises(HttpError) as viewer:
        fleet.approve(str(request.value["proposalId"]), str(request.value["digest"]), token=VIEWER)
    assert viewer.value.status == 403
    watch.settle(2)
    assert not watch.of(incident, "RecoveryApproved")
    assert not [s for s in watch.seen if s.topic == "commands" and s.value.get("incidentId") == incident]


def test_approval_with_a_wrong_digest_is_refused(fleet: Fleet, watch: Watch) -> None:
    incident, request = awaiting_approval(fleet, watch)
    wrong = "sha256:" + "0" * 64
    with pytest.raises(HttpError) as refused:
        fleet.approve(str(request.value["proposalId"]), wrong)
    assert refused.value.status == 409
    watch.settle(2)
    assert not watch.of(incident, "RecoveryApproved")
    # the right digest still works afterwards: the refusal changed nothing
    fleet.approve(str(request.value["proposalId"]), str(request.value["digest"]))
    watch.kind("RecoveryExecuted", incident)


def test_approval_after_the_deadline_is_refused_and_escalates(fleet: Fleet, watch: Watch) -> None:
    incident, request = awaiting_approval(fleet, watch)
    expired = watch.kind("ApprovalExpired", incident, timeout=120)  # the TTL is 75 s
    assert expired.value["proposalId"] == request.value["proposalId"]
    watch.kind("IncidentEscalated", incident)
    with pytest.raises(HttpError) as late:
        fleet.approve(str(request.value["proposalId"]), str(request.value["digest"]), token=APPROVER)
    assert late.value.status == 409
    watch.settle(2)
    assert not watch.of(incident, "RecoveryExecuted")


def test_every_service_restarted_while_waiting_for_approval_resumes(fleet: Fleet, watch: Watch) -> None:
    incident, request = awaiting_approval(fleet, watch)
    for service in (
        "health-agent",
        "diagnostic-agent",
        "remediation-agent",
        "policy-service",
        "executor",
        "audit",
        "dlq-reconciler",
    ):
        fleet.restart(service)
    fleet.approve(str(request.value["proposalId"]), str(request.value["digest"]))
    watch.kind("RecoveryExecuted", incident)
    watch.kind("RecoveryCompleted", incident, timeout=60)
    assert len(watch.of(incident, "HumanApprovalRequired")) == 1  # nothing replayed into a second request
    assert fleet.audit_verify()["ok"] is True


def test_two_conflicting_proposals_for_one_resource_execute_once(fleet: Fleet, watch: Watch) -> None:
    incident, first_request = awaiting_approval(fleet, watch)
    first = watch.kind("RecoveryProposed", incident)
    value, envelope = counter_proposal(first, replicas=10, signer=fleet.agent_signer)
    produce(fleet, "incidents", incident, PROPOSED, value, envelope)
    second_request = watch.wait(
        lambda s: s.kind == "HumanApprovalRequired" and str(s.value["proposalId"]) == value["proposalId"],
        what="approval request for the newer proposal",
    )
    # the older proposal is no longer current: approving it is refused
    with pytest.raises(HttpError) as stale:
        fleet.approve(str(first_request.value["proposalId"]), str(first_request.value["digest"]))
    assert stale.value.status == 409
    fleet.approve(str(second_request.value["proposalId"]), str(second_request.value["digest"]))
    executed = watch.kind("RecoveryExecuted", incident)
    assert executed.value["idempotencyKey"] == f"{incident}:{value['proposalId']}:scale:checkout-api:10"
    watch.settle(3)
    assert len(watch.of(incident, "RecoveryExecuted")) == 1


def test_a_proposal_beyond_the_limits_is_denied(fleet: Fleet, watch: Watch) -> None:
    incident, _ = awaiting_approval(fleet, watch)
    first = watch.kind("RecoveryProposed", incident)
    value, envelope = counter_proposal(first, replicas=40, signer=fleet.agent_signer)
    produce(fleet, "incidents", incident, PROPOSED, value, envelope)
    denied = watch.kind("CommandDenied", incident)
    assert any("20" in reason for reason in denied.value["reasons"]), denied.value
    escalated = watch.kind("IncidentEscalated", incident)  # nothing of the plan runs: a person decides
    assert escalated.value["causeEventId"] == denied.value["eventId"], escalated.value
    watch.settle(2)
    assert not [s for s in watch.seen if s.topic == "commands" and s.value.get("incidentId") == incident]


def test_a_redelivered_command_acts_once(fleet: Fleet, watch: Watch) -> None:
    incident, request = awaiting_approval(fleet, watch)
    fleet.approve(str(request.value["proposalId"]), str(request.value["digest"]))
    command = watch.wait(lambda s: s.topic == "commands" and s.value.get("incidentId") == incident, what="command")
    watch.kind("RecoveryExecuted", incident)
    kind = f"dev.flotilla.commands.{command.kind}"
    key = str(command.value["target"]["environment"]) + "/" + str(command.value["target"]["name"])
    # the same record again (same ce_id), and the same command under a new record id
    produce(fleet, "commands", key, kind, command.value, command.envelope)
    again = Envelope(type=kind, source=command.envelope.source, correlationid=incident, hops=command.envelope.hops)
    produce(fleet, "commands", key, kind, command.value, again)
    watch.settle(4)
    assert len(watch.of(incident, "RecoveryExecuted")) == 1
    assert not watch.of(incident, "CommandFailed")


def test_a_recovery_that_fails_before_changing_anything_ends_with_people(fleet: Fleet, watch: Watch) -> None:
    """Someone else holds the resource's lease (a person's own change, another tool) for
    longer than the executor waits, so the approved command fails without acting. The saga
    still ends with a fact (nothing undone): a FAILED incident was never finished, and held
    its service at the health agent for as long as an alert about it stayed firing (a storm
    found ten such). The service still breaches, so the health agent hands it to people:
    the detector opens one incident per breach, and nothing else would happen."""
    incident, request = awaiting_approval(fleet, watch)
    resource = f"production/{DEMO_SERVICE}"
    with psycopg.connect(fleet.stack.pg_dsn(str(EXECUTOR.database)), autocommit=True) as conn:
        held = leases.acquire(conn, resource, "someone-else", 120)
    assert held is not None
    try:
        fleet.approve(str(request.value["proposalId"]), str(request.value["digest"]))
        # after the executor's 20 s lease wait, longer than its transaction may sit idle
        failed = watch.kind("CommandFailed", incident, timeout=90)
        assert failed.value["errorClass"] == "LeaseUnavailable"
        ended = watch.kind("CompensationCompleted", incident)
        assert ended.value["compensatedCommandIds"] == [] and "nothing to undo" in ended.value["summary"]
        assert str(ended.value["causeEventId"]) == str(failed.value["eventId"])
        escalated = watch.kind("IncidentEscalated", incident)
        assert escalated.envelope.causationid == ended.envelope.id
        assert f"production/{DEMO_SERVICE} still breaches" in escalated.value["reason"]
        assert not watch.of(incident, "RecoveryExecuted")
    finally:
        with psycopg.connect(fleet.stack.pg_dsn(str(EXECUTOR.database)), autocommit=True) as conn:
            leases.release(conn, held)  # released, not deleted: an epoch never goes back
    deadline = time.monotonic() + 30
    with psycopg.connect(fleet.stack.pg_dsn(str(HEALTH.database)), autocommit=True) as conn:
        while WorkflowStore.status_of(conn, incident) is not Status.ESCALATED:
            assert time.monotonic() < deadline, f"{incident} is {WorkflowStore.status_of(conn, incident)}"
            time.sleep(0.2)
    # the service's next breach is a new incident
    with fleet.fresh_watch() as again:
        assert open_incident(fleet, again) != incident


def test_a_slow_diagnostic_job_outlives_a_restart_of_the_diagnostic_agent(fleet: Fleet, watch: Watch) -> None:
    incident = open_incident(fleet, watch)
    watch.kind("DiagnosticJobStarted", incident, timeout=60)
    fleet.restart("diagnostic-agent")
    watch.kind("DependencyFailureSuspected", incident, timeout=60)
    watch.kind("HumanApprovalRequired", incident, timeout=60)
    watch.settle(2)
    assert len(watch.of(incident, "DependencyFailureSuspected")) == 1


def test_the_executor_killed_mid_action_acts_exactly_once(fleet: Fleet, watch: Watch) -> None:
    incident, request = awaiting_approval(fleet, watch)
    fleet.sim("PUT", "/settings", {"actionSeconds": 3})
    try:
        fleet.approve(str(request.value["proposalId"]), str(request.value["digest"]))
        command = watch.wait(lambda s: s.topic == "commands" and s.value.get("incidentId") == incident, what="command")
        key = str(command.value["idempotencyKey"])
        deadline = time.monotonic() + 30
        while True:  # the executor has called the sim: the action is in flight
            assert time.monotonic() < deadline, "the executor never started the action"
            try:
                fleet.sim_action("GET", f"/actions/{key}")
                break  # already applied: too late to kill mid-action, still a valid run
            except HttpError:
                if fleet.executor_pending(key):
                    break
            time.sleep(0.05)
        fleet.kill("executor")
        watch.kind("RecoveryExecuted", incident, timeout=90)
    finally:
        fleet.sim("PUT", "/settings", {"actionSeconds": 0.1})
    watch.settle(3)
    assert len(watch.of(incident, "RecoveryExecuted")) == 1
    assert fleet.sim_action("GET", f"/actions/{key}")["status"] == "applied"


def as_json(value: Any) -> Any:
    """A value as an operator would type it (as the DLQ API shows it): UUIDs as text, times
    as epoch ms, bytes (the agent's signature) as base64."""
    return jsonable(value)


def test_poison_is_quarantined_and_a_sanitized_copy_is_refused_as_no_longer_its_producers(
    fleet: Fleet, watch: Watch
) -> None:
    incident, request = awaiting_approval(fleet, watch)
    first = watch.kind("RecoveryProposed", incident)
    # the agent's record (signed by it), whose attestation was made over another digest
    signed, envelope = counter_proposal(first, replicas=10, signer=fleet.agent_signer)
    good_digest = signed["digest"]
    value = {**signed, "digest": "sha256:" + "f" * 64}
    produce(fleet, "incidents", incident, PROPOSED, value, envelope)

    fact = watch.wait(
        lambda s: s.kind == "DeadLetterQuarantined" and str(s.value.get("originalEventId")) == envelope.id,
        what="DeadLetterQuarantined for the poisoned proposal",
    )
    entry = fleet.dlq("GET", f"/quarantine/{fact.value['quarantineId']}")
    assert entry["reason"] == "unauthorized" and entry["errorClass"] == "RecordRefused", entry

    # an invalid sanitized value is refused, naming the field; nothing is sent
    with pytest.raises(HttpError) as refused:
        fleet.dlq("POST", f"/quarantine/{entry['id']}/requeue", {"value": {**as_json(value), "digest": 7}}, OPERATOR)
    assert refused.value.status == 422 and "digest" in json.dumps(refused.value.body)
    # a valid one is refused too: it is no longer what the agent signed (flotilla.provenance),
    # and an operator's token does not speak for the agent
    sanitized = {**as_json(value), "digest": good_digest}
    with pytest.raises(HttpError) as unsigned:
        fleet.dlq("POST", f"/quarantine/{entry['id']}/requeue", {"value": sanitized}, OPERATOR)
    assert unsigned.value.status == 422 and "signature: bad-signature" in json.dumps(unsigned.value.body)
    watch.settle(3)
    assert not [s for s in watch.seen if s.kind == "HumanApprovalRequired" and s.envelope.causationid == envelope.id]
    assert fleet.dlq("GET", f"/quarantine/{entry['id']}")["status"] == "quarantined"
    # the person's decision on the agent's real plan still stands
    fleet.approve(str(request.value["proposalId"]), str(request.value["digest"]))
    watch.kind("RecoveryExecuted", incident)


def test_a_target_slower_than_the_lease_acts_once_and_reports_what_happened(fleet: Fleet, watch: Watch) -> None:
    """The sim takes 25 s per action, the executor's lease lives 15 s: the heartbeat keeps
    the lease (one epoch) and the handler's transaction, so the action is applied once and
    reported executed — no livelock of newer epochs, no failure for an action that happened."""
    fleet.wait_until_healthy("checkout-dev")
    fleet.sim("PUT", "/settings", {"actionSeconds": 25})
    try:
        incident = open_incident(fleet, watch, service="checkout-dev", dependency="payments-dev")
        executed = watch.kind("RecoveryExecuted", incident, timeout=150)
        assert executed.value["actionDurationMs"] >= 25_000
        key = str(executed.value["idempotencyKey"])
        watch.settle(3)
        assert len(watch.of(incident, "RecoveryExecuted")) == 1 and not watch.of(incident, "CommandFailed")
        assert fleet.sim_action("GET", f"/actions/{key}")["status"] == "applied"
        [lease] = [entry for entry in fleet.call(EXECUTOR, "GET", "/leases") if entry["resource"] == "dev/checkout-dev"]
        assert lease["epoch"] == executed.value["fencingEpoch"]  # nobody took it over meanwhile
    finally:
        fleet.sim("PUT", "/settings", {"actionSeconds": float(E2E_SETTINGS["FLOTILLA_SIM_ACTION_SECONDS"])})
    watch.kind("RecoveryCompleted", incident, timeout=60)
    fleet.reset_sim()
    fleet.wait_until_healthy("checkout-dev")
