"""Reading a RecoveryProposed and turning its steps into commands, without the stack."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flotilla.commands import record_type as command_type
from flotilla.commands import resource_key
from flotilla.digest import command_digest
from services.policy.commands import (
    MalformedStep,
    command_kind,
    command_record,
    describe,
    epoch_ms,
    from_epoch_ms,
    summarize,
)
from services.policy.decide import Target
from services.policy.handlers import approval_deadline
from services.policy.proposals import InvalidProposal, read_proposal
from services.policy.testing import proposal, step

INCIDENT = "incident-204"


def scale_plan(**overrides: Any) -> dict[str, Any]:
    pid = str(uuid.uuid4())
    value = proposal(INCIDENT, [step("ScaleService", INCIDENT, pid)])
    value.update(overrides)
    return value


def test_a_valid_proposal_is_read_and_canonicalized() -> None:
    value = scale_plan()
    read = read_proposal(value, correlation_id=INCIDENT)
    assert read.kinds == ("ScaleService",)
    assert read.digest == value["digest"] == command_digest(read.steps)
    assert isinstance(read.steps[0]["issuedAt"], int)  # epoch ms, the digest's form
    assert read.resources == ["production/checkout-api"]
    assert read.summary == "scale checkout-api in production to 12 replicas"
    assert read.confidence == 0.9


def test_the_stored_steps_give_back_the_commands_exactly() -> None:
    value = scale_plan()
    read = read_proposal(value, correlation_id=INCIDENT)
    records = [command_record(s) for s in read.steps]
    assert records == value["steps"]
    assert command_digest(records) == value["digest"]


def test_a_digest_that_does_not_cover_the_steps_is_refused() -> None:
    value = scale_plan()
    value["steps"][0]["replicas"] = 13  # changed after the digest was taken
    with pytest.raises(InvalidProposal, match="does not match"):
        read_proposal(value, correlation_id=INCIDENT)


def test_a_step_of_another_proposal_is_refused() -> None:
    pid = str(uuid.uuid4())
    plan = [step("ScaleService", INCIDENT, pid), step("RestartService", INCIDENT, str(uuid.uuid4()))]
    with pytest.raises(InvalidProposal, match="belongs to proposal"):
        read_proposal(proposal(INCIDENT, plan, proposal_id=pid), correlation_id=INCIDENT)


def test_a_step_of_another_incident_is_refused() -> None:
    pid = str(uuid.uuid4())
    plan = [step("ScaleService", "incident-1", pid)]
    with pytest.raises(InvalidProposal, match="belongs to incident"):
        read_proposal(proposal(INCIDENT, plan, proposal_id=pid), correlation_id=INCIDENT)


def test_the_record_must_belong_to_the_incident_it_travels_under() -> None:
    with pytest.raises(InvalidProposal, match="ce_correlationid"):
        read_proposal(scale_plan(), correlation_id="incident-9")


def test_an_empty_plan_is_refused() -> None:
    with pytest.raises(InvalidProposal, match="at least one step"):
        read_proposal(proposal(INCIDENT, []), correlation_id=INCIDENT)


def test_repeated_command_ids_are_refused() -> None:
    pid = str(uuid.uuid4())
    first = step("ScaleService", INCIDENT, pid)
    second = {**step("RestartService", INCIDENT, pid), "commandId": first["commandId"]}
    with pytest.raises(InvalidProposal, match="repeats commandId"):
        read_proposal(proposal(INCIDENT, [first, second]), correlation_id=INCIDENT)


def test_an_unknown_step_shape_is_refused() -> None:
    pid = str(uuid.uuid4())
    odd = {**step("ScaleService", INCIDENT, pid), "rolling": True}
    with pytest.raises(InvalidProposal, match="no single command kind"):
        read_proposal(proposal(INCIDENT, [odd]), correlation_id=INCIDENT)


def test_naive_timestamps_are_refused() -> None:
    pid = str(uuid.uuid4())
    naive = step("ScaleService", INCIDENT, pid, issued=datetime(2024, 5, 1, 12, 0))
    with pytest.raises(InvalidProposal, match="cannot be digested"):
        read_proposal(proposal(INCIDENT, [naive], digest="sha256:x"), correlation_id=INCIDENT)


def test_facts_ask_the_inventory_for_scaled_targets_only() -> None:
    pid = str(uuid.uuid4())
    plan = [
        step("ScaleService", INCIDENT, pid, replicas=8),
        step("RestartService", INCIDENT, pid, name="payments-api"),
    ]
    read = read_proposal(proposal(INCIDENT, plan), correlation_id=INCIDENT)
    asked: list[str] = []

    def replicas(target: Target) -> int | None:
        asked.append(target.key)
        return 4

    facts = read.facts(replicas)
    assert asked == ["production/checkout-api"]
    assert facts.steps[0].current_replicas == 4
    assert facts.steps[0].params == {"replicas": 8}
    assert facts.steps[1].current_replicas is None
    assert facts.steps[1].params == {"rolling": True}
    assert facts.services == 2


# ------------------------------------------------------------------ commands


@pytest.mark.parametrize("kind", ["ScaleService", "RestartService", "RollbackDeployment", "FailoverDependency"])
def test_each_command_kind_is_recognized_by_its_fields(kind: str) -> None:
    s = step(kind, INCIDENT, str(uuid.uuid4()))
    assert command_kind(s) == kind
    assert command_type(kind) == f"dev.flotilla.commands.{kind}"


def test_a_step_with_missing_fields_is_no_command() -> None:
    s = step("ScaleService", INCIDENT, str(uuid.uuid4()))
    del s["expiresAt"]
    with pytest.raises(MalformedStep):
        command_kind(s)


def test_descriptions() -> None:
    pid = str(uuid.uuid4())
    plan = [
        step("ScaleService", INCIDENT, pid),
        step("RestartService", INCIDENT, pid, rolling=False),
        step("RollbackDeployment", INCIDENT, pid, environment="staging"),
        step("FailoverDependency", INCIDENT, pid),
    ]
    assert [describe(s) for s in plan] == [
        "scale checkout-api in production to 12 replicas",
        "restart checkout-api in production (all instances at once)",
        "roll checkout-api in staging back to revision r41",
        "fail over payments-db of checkout-api in production to payments-db-replica",
    ]
    assert summarize(plan[:2]) == "; then ".join(describe(s) for s in plan[:2])


def test_resource_key() -> None:
    assert resource_key({"kind": "service", "environment": "production", "name": "checkout-api"}) == (
        "production/checkout-api"
    )


def test_epoch_ms_is_exact() -> None:
    when = datetime(2024, 5, 1, 12, 0, 0, 123000, tzinfo=UTC)
    assert epoch_ms(when) == 1714564800123
    assert from_epoch_ms(1714564800123) == when
    assert epoch_ms(1714564800123) == 1714564800123


def test_the_deadline_never_outlives_the_commands() -> None:
    now = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    pid = str(uuid.uuid4())
    long_lived = read_proposal(
        proposal(INCIDENT, [step("ScaleService", INCIDENT, pid, issued=now, ttl=timedelta(hours=1))]),
        correlation_id=INCIDENT,
    )
    assert approval_deadline(now, 900, long_lived) == now + timedelta(seconds=900)
    short_lived = read_proposal(
        proposal(INCIDENT, [step("ScaleService", INCIDENT, pid, issued=now, ttl=timedelta(minutes=5))]),
        correlation_id=INCIDENT,
    )
    assert approval_deadline(now, 900, short_lived) == now + timedelta(minutes=5)
