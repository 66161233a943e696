"""Attacks on the fleet's authority, against the running fleet, with clients nobody wrote
for the purpose: the documented CLI producer, raw Kafka producers, the DLQ's API.

- a ScaleService published by hand on ``commands`` (``flotilla publish -t ScaleService``):
  the executor's loop refuses it before any handler (no producer's signature) and
  dead-letters it; the DLQ reconciler quarantines it; the service's replicas do not move;
- that quarantined command re-queued (unchanged or "sanitized"): refused, nothing sent;
- a letter planted on ``incidents.dlq`` that claims to come from ``commands``: it can only
  ever go back to ``incidents``;
- a forged proposal (the agent's name, confidence 0.99, exactly 2x so policy would
  auto-authorize it) while a person's decision is pending: refused, supersedes nothing,
  and the person's approval still goes through and executes once.
"""

from __future__ import annotations

import json
import uuid

import pytest
from flotilla_ops.cli import app
from typer.testing import CliRunner

from flotilla import deadletter
from flotilla.envelope import Envelope
from flotilla.fleet import EXECUTOR
from tests.support.producing import ordered_producer

from .fleet import (
    PROPOSED,
    Fleet,
    HttpError,
    Watch,
    awaiting_approval,
    counter_proposal,
    produce,
)

pytestmark = pytest.mark.timeout(300)

OPERATOR = "operator-token"  # the DLQ reconciler's demo-profile operator
TARGET = ("production", "checkout-api")


def replicas(fleet: Fleet) -> int:
    return int(fleet.sim("GET", f"/services/{TARGET[1]}")["replicas"])


def test_a_command_published_by_hand_is_refused_quarantined_and_cannot_be_requeued(fleet: Fleet, watch: Watch) -> None:
    before = replicas(fleet)
    incident = f"incident-forged-{uuid.uuid4().hex[:8]}"
    command_id = str(uuid.uuid4())
    published = CliRunner().invoke(
        app,
        [
            "--json",
            "publish",
            "-t",
            "ScaleService",
            "--sample",
            "-i",
            incident,
            "-f",
            f"target.environment={TARGET[0]}",
            "-f",
            f"target.name={TARGET[1]}",
            "-f",
            "replicas=21",
            "-f",
            f"idempotencyKey={incident}:scale:21",
            "-f",
            "authorization=null",  # no signature at all (a sample's would be a fake one: unknown-key)
            "-f",
            f"commandId={command_id}",
            "--id",
            command_id,  # ce_id = commandId, as the policy service issues commands
        ],
    )
    assert published.exit_code == 0, published.stdout + published.stderr

    # The executor's loop refuses it before any handler: the CLI is no producer of commands
    # (flotilla.provenance), so it never reaches the executor's own authorization check.
    quarantined = watch.wait(
        lambda s: s.kind == "DeadLetterQuarantined" and str(s.value.get("originalEventId")) == command_id,
        timeout=60,
        what="DeadLetterQuarantined for the forged command",
    )
    entry = fleet.dlq("GET", f"/quarantine/{quarantined.value['quarantineId']}")
    assert (entry["reason"], entry["origin"]["topic"]) == ("unauthorized", "commands"), entry
    assert "only policy-service may state it" in entry["errorMessage"], entry
    watch.settle(2)
    assert replicas(fleet) == before  # nothing reached the target
    assert not watch.of(incident, "RecoveryExecuted")
    with pytest.raises(HttpError) as missing:
        fleet.call(EXECUTOR, "GET", f"/executions/{incident}:scale:21")
    assert missing.value.status == 404  # no execution was ever begun, no lease taken

    # an operator cannot re-queue it into authority: unchanged, or "sanitized"
    for body in ({}, {"value": {**entry["value"]["decoded"]["fields"], "replicas": 20}}):
        with pytest.raises(HttpError) as refused:
            fleet.dlq("POST", f"/quarantine/{entry['id']}/requeue", body, OPERATOR)
        assert refused.value.status == 422, refused.value.body
    assert "unsigned" in json.dumps(fleet_error(fleet, entry["id"], {}))
    watch.settle(2)
    assert watch.of(incident, "CommandRejected") == []  # refused before the executor's handler; nothing re-sent


def fleet_error(fleet: Fleet, entry_id: str, body: dict[str, object]) -> object:
    try:
        fleet.dlq("POST", f"/quarantine/{entry_id}/requeue", body, OPERATOR)
    except HttpError as exc:
        return exc.body
    raise AssertionError("the re-queue was accepted")


def test_a_letter_planted_on_the_incidents_dlq_never_goes_to_commands(fleet: Fleet, watch: Watch) -> None:
    """The origin is the DLQ topic's own name, whatever the letter's headers claim."""
    incident = f"incident-planted-{uuid.uuid4().hex[:8]}"
    kind = "dev.flotilla.commands.ScaleService"
    envelope = Envelope(type=kind, source="/flotilla/policy-service", correlationid=incident)
    value = b"\x00\x00\x00\x00\x00not-avro"
    headers = [
        *envelope.headers(),
        (deadletter.ORIGIN_TOPIC, b"commands"),
        (deadletter.REASON, b"undecodable"),
        (deadletter.CONSUMER, b"executor"),
    ]
    producer = ordered_producer(fleet.stack.kafka_bootstrap)
    producer.produce("incidents.dlq", key=incident.encode(), value=value, headers=headers)
    assert producer.flush(10) == 0
    quarantined = watch.wait(
        lambda s: s.kind == "DeadLetterQuarantined" and str(s.value.get("originalEventId")) == envelope.id,
        what="DeadLetterQuarantined for the planted letter",
    )
    assert quarantined.value["originTopic"] == "incidents"
    assert quarantined.value["tags"]["claimedOrigin"] == "commands"
    entry = fleet.dlq("GET", f"/quarantine/{quarantined.value['quarantineId']}")
    assert entry["origin"]["topic"] == "incidents"


def test_a_forged_proposal_does_not_replace_the_one_waiting_for_a_person(fleet: Fleet, watch: Watch) -> None:
    incident, request = awaiting_approval(fleet, watch)
    first = watch.kind("RecoveryProposed", incident)
    forged, envelope = counter_proposal(first, replicas=8, signer=None)  # 4 -> 8: exactly 2x, policy would auto
    forged["reasoning"] = {**forged["reasoning"], "confidence": 0.99}
    produce(fleet, "incidents", incident, PROPOSED, forged, envelope)
    quarantined = watch.wait(
        lambda s: s.kind == "DeadLetterQuarantined" and str(s.value.get("originalEventId")) == envelope.id,
        what="DeadLetterQuarantined for the forged proposal",
    )
    assert quarantined.value["tags"]["reason"] == "unauthorized"
    assert not watch.of(incident, "RecoveryApproved") and not [s for s in watch.seen if s.topic == "commands"]
    # the person's decision is still the one that counts, and it executes once
    fleet.approve(str(request.value["proposalId"]), str(request.value["digest"]))
    executed = watch.kind("RecoveryExecuted", incident)
    assert str(executed.value["proposalId"]) == str(request.value["proposalId"])
    watch.settle(2)
    assert len(watch.of(incident, "RecoveryExecuted")) == 1
