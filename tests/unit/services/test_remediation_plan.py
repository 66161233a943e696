"""Proposals as exact commands: idempotency keys, expiry, and the digest an approver signs."""

from __future__ import annotations

import io
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from flotilla_evidence.model import RevisionFacts, ServiceView, Topology
from flotilla_reasoning import Action, PlannedStep, Proposal, Reasoning, TokenUsage

from flotilla.contracts import load_contracts
from flotilla.digest import command_digest
from flotilla.validation import RecordValidator
from services.remediation_agent.plan import (
    InvalidPlan,
    command_record,
    digest_matches,
    proposal_value,
    to_millis,
    with_revision_facts,
)

NOW = datetime(2026, 8, 17, 14, 2, 7, 123456, tzinfo=UTC)
TTL = timedelta(seconds=900)
DIAGNOSIS_EVENT = "0b6d3d1e-5a43-4c7e-9a8e-3f1c2b7d9e10"


def contract(name: str) -> Any:
    return parse_schema(next(c.schema for c in load_contracts() if c.full_name == name))


def scale(replicas: int = 12, service: str = "checkout-api") -> PlannedStep:
    return PlannedStep(Action.SCALE, service, "production", {"replicas": replicas})


def proposal(*steps: PlannedStep) -> Proposal:
    reasoning = Reasoning("scale checkout-api", (), 0.875, "llm", "m-1", TokenUsage(900, 70))
    return Proposal("incident-204", DIAGNOSIS_EVENT, steps or (scale(),), reasoning)


def value(*steps: PlannedStep, now: datetime = NOW) -> dict[str, Any]:
    return proposal_value(
        proposal(*steps),
        proposal_id=str(uuid.uuid4()),
        proposed_by="remediation-agent",
        now=now,
        ttl=TTL,
    )


PROPOSAL = "7d0c5c8e-2f4b-4f0e-9a51-6b3c1d2e4f50"


@pytest.mark.parametrize(
    ("step", "key"),
    [
        (scale(12), f"incident-204:{PROPOSAL}:scale:checkout-api:12"),
        (PlannedStep(Action.RESTART, "checkout-api", "production", {"rolling": True}), ":restart:checkout-api:rolling"),
        (PlannedStep(Action.RESTART, "checkout-api", "production", {"rolling": False}), ":restart:checkout-api:all"),
        (
            PlannedStep(Action.ROLLBACK, "checkout-api", "production", {"toRevision": "v41"}),
            ":rollback:checkout-api:v41",
        ),
        (
            PlannedStep(
                Action.FAILOVER, "checkout-api", "production", {"dependency": "payments-api", "toTarget": "secondary"}
            ),
            ":failover:checkout-api:payments-api:secondary",
        ),
        (scale(3, "search-api"), ":scale:search-api:3"),
    ],
)
def test_idempotency_keys_name_incident_proposal_action_target_and_parameters(step: PlannedStep, key: str) -> None:
    record = command_record(step, incident_id="incident-204", proposal_id=PROPOSAL, issued_at=NOW, ttl=TTL)
    assert record["idempotencyKey"].endswith(key)
    assert record["idempotencyKey"].startswith(f"incident-204:{PROPOSAL}:")


def test_the_same_effect_in_another_proposal_is_another_key() -> None:
    """Bound to the proposal: nobody who has not seen the proposal can guess (squat) a key."""
    first, second = value()["steps"][0], value(now=NOW + timedelta(minutes=5))["steps"][0]
    assert first["idempotencyKey"] != second["idempotencyKey"]
    assert first["idempotencyKey"].endswith(":scale:checkout-api:12")
    assert first["commandId"] != second["commandId"]


def test_two_steps_that_are_one_command_are_refused() -> None:
    with pytest.raises(InvalidPlan, match="same command"):
        value(scale(12), scale(12))


def test_a_command_carries_target_params_and_expiry() -> None:
    step = command_record(scale(), incident_id="incident-204", proposal_id=PROPOSAL, issued_at=NOW, ttl=TTL)
    assert step["target"] == {"kind": "service", "environment": "production", "name": "checkout-api"}
    assert step["replicas"] == 12
    assert step["issuedAt"] == to_millis(NOW) == NOW.replace(microsecond=123000)
    assert step["expiresAt"] - step["issuedAt"] == TTL
    uuid.UUID(step["commandId"])


def test_the_proposal_is_a_valid_record_with_the_digest_of_its_steps() -> None:
    proposed = {"eventId": str(uuid.uuid4()), **value()}
    schema = contract("dev.flotilla.decisions.RecoveryProposed")
    assert RecordValidator(schema).problems(proposed) == []
    assert proposed["digest"] == command_digest(proposed["steps"])
    assert proposed["digest"].startswith("sha256:") and len(proposed["digest"]) == 7 + 64
    assert proposed["proposedBy"] == "remediation-agent"
    assert proposed["reasoning"]["tokenUsage"] == {"promptTokens": 900, "completionTokens": 70}


def test_the_digest_survives_the_avro_round_trip() -> None:
    """What the policy service decodes digests to what the remediation agent signed."""
    proposed = {
        "eventId": str(uuid.uuid4()),
        **value(PlannedStep(Action.RESTART, "checkout-api", "production", {"rolling": True}), scale()),
    }
    schema = contract("dev.flotilla.decisions.RecoveryProposed")
    buf = io.BytesIO()
    schemaless_writer(buf, schema, proposed)
    buf.seek(0)
    decoded = schemaless_reader(buf, schema, None)
    assert isinstance(decoded, dict)
    assert digest_matches(decoded)
    assert command_digest(decoded["steps"]) == proposed["digest"]


def test_any_change_to_a_step_changes_the_digest() -> None:
    proposed = value()
    tampered = [{**proposed["steps"][0], "replicas": 13}]
    assert command_digest(tampered) != proposed["digest"]
    assert not digest_matches({**proposed, "steps": tampered})


# ------------------------------------------------ a rollback's facts come from the evidence


def _topology(**service: Any) -> Topology:
    view = ServiceView(
        "checkout-api",
        "production",
        4,
        1900.0,
        800.0,
        revision="shop:1.5 (revision 3)",
        previous_revision="shop:1.4 (revision 2)",
        running=RevisionFacts("3", "7f9c", ("shop=shop:1.5",)),
        rollback_candidate=RevisionFacts("2", "5d4b", ("shop=shop:1.4",)),
        **service,
    )
    return Topology({"checkout-api": view})


def rollback(**params: Any) -> PlannedStep:
    return PlannedStep(Action.ROLLBACK, "checkout-api", "production", {"toRevision": "2", **params})


def test_a_rollback_named_by_its_revision_alone_gets_both_revisions_facts_from_the_evidence() -> None:
    completed = with_revision_facts(proposal(rollback()), _topology())
    assert dict(completed.steps[0].params) == {
        "toRevision": "2",
        "fromRevision": "3",
        "fromTemplateHash": "7f9c",
        "toTemplateHash": "5d4b",
        "fromImages": ["shop=shop:1.5"],
        "toImages": ["shop=shop:1.4"],
    }
    step = value(*completed.steps)["steps"][0]
    assert step["fromRevision"] == "3" and step["toImages"] == ["shop=shop:1.4"]
    assert with_revision_facts(proposal(scale()), _topology()).steps == (scale(),)  # other kinds untouched


@pytest.mark.parametrize(
    ("step", "service", "why"),
    [
        (rollback(toRevision="1"), {}, "is not the one the evidence shows before 3"),
        (rollback(toImages=["shop=evil:6.6"]), {}, "toImages differ from the evidence"),
        (rollback(), {"rollback_forbidden": "migration 42 dropped a column"}, "forbids a rollback"),
        (rollback(), {"paused": True}, "its rollout is paused"),
        (rollback(), {"rollback_candidate": None}, "does not show the running revision and an earlier one"),
    ],
)
def test_a_rollback_the_evidence_does_not_support_cannot_be_proposed(
    step: PlannedStep, service: dict[str, Any], why: str
) -> None:
    topology = _topology(**{k: v for k, v in service.items() if k != "rollback_candidate"})
    if "rollback_candidate" in service:
        view = replace(topology.services["checkout-api"], rollback_candidate=None)
        topology = replace(topology, services={"checkout-api": view})
    with pytest.raises(InvalidPlan, match=why):
        with_revision_facts(proposal(step), topology)
