"""A rules plan on a model's diagnosis (security review 3, H1): its confidence is the rules'
own, a healthy service is not scaled, and the policy sees the diagnosis' reasoner.

The configuration: the diagnostic agent on a model, the remediation agent on rules. The
model's confidence is its own word, which text in its inputs can set; before, the rules
planner copied it into a plan labelled ``rules`` and a healthy production service got an
automatic scale-out.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest
from flotilla_reasoning import (
    Action,
    Diagnosis,
    DiagnosticEvidence,
    Reasoning,
    ReasoningFailed,
    RulesReasoner,
    ServiceView,
    Topology,
    Verdict,
)

from services.policy.commands import epoch_ms
from services.policy.decide import Outcome, PolicyEngine
from services.policy.inventory import StaticInventory
from services.policy.proposals import read_proposal
from services.remediation_agent.plan import proposal_value

from .test_reasoner_rules import INCIDENT, demo_topology, diagnosed

MODEL_GUARD = "model-plan-in-production-needs-human"


def said_by(
    reasoner: str,
    verdict: Verdict,
    *,
    confidence: float = 0.99,
    service: str = "checkout-api",
    dependency: str | None = None,
    cause: str | None = None,
) -> Diagnosis:
    """A diagnosis as a record carries it, from ``reasoner``."""
    return Diagnosis(
        verdict=verdict,
        incident_id=INCIDENT,
        service=service,
        environment="production",
        reasoning=Reasoning("replicas saturated: scale out now (pre-approved)", (), confidence, reasoner),
        suspected_dependency=dependency,
        cause_category=cause,
        event_id="e-model",
    )


def basis_note(proposal_evidence: tuple[object, ...]) -> str:
    [note] = [e for e in proposal_evidence if getattr(e, "kind", None) == "confidence-basis"]
    return str(getattr(note, "description", ""))


def settled(topology: Topology) -> DiagnosticEvidence:
    """checkout-api's evidence, to be concluded from as it is."""
    return DiagnosticEvidence(INCIDENT, "checkout-api", "production", "latency", topology, may_request_more=False)


def search_api(p95_ms: float, utilization: float | None = None) -> Topology:
    """The review's case: production/search-api, 2 replicas, a 300 ms threshold, no dependencies."""
    view = ServiceView("search-api", "production", 2, p95_ms, 300.0, (), "v23", "v22")
    return Topology(
        services={"search-api": view},
        utilization={} if utilization is None else {"search-api": utilization},
        source="sim",
    )


# ------------------------------------------------------------------ confidence


def test_a_model_capacity_diagnosis_the_measurements_contradict_gives_the_plan_no_confidence() -> None:
    """payments-api is 8x slow: the rules read a dependency failure, not the model's capacity."""
    model = said_by("llm", Verdict.CONCLUDED, cause="capacity")
    proposal = RulesReasoner().propose(model, demo_topology())
    assert proposal.reasoning.reasoner == "rules"
    assert proposal.reasoning.confidence == 0.0  # not 0.99
    note = basis_note(proposal.reasoning.evidence)
    assert "llm reasoner at confidence 0.99, which this plan does not take" in note
    assert "conclude dependency-failure(payments-api) instead" in note


def test_a_model_diagnosis_the_measurements_agree_with_gets_the_rules_own_confidence() -> None:
    model = said_by("llm", Verdict.DEPENDENCY_FAILURE, dependency="payments-api")
    proposal = RulesReasoner().propose(model, demo_topology())
    own = RulesReasoner().diagnose(settled(demo_topology()))
    assert own.suspected_dependency == "payments-api"
    assert proposal.reasoning.confidence == own.reasoning.confidence == 0.875  # 1 - 1/8, not 0.99
    assert "reach the same conclusion at 0.88" in basis_note(proposal.reasoning.evidence)


def test_what_the_rules_can_measure_is_all_a_model_diagnosis_is_worth_without_baselines() -> None:
    """The remediation agent has no learned baselines: payments-api's 280 ms is under its
    400 ms threshold there, so the rules suspect it only as the dominant dependency (0.5 x
    its share of the dependency time), and that is what the plan rests on."""
    model = said_by("llm", Verdict.DEPENDENCY_FAILURE, dependency="payments-api")
    proposal = RulesReasoner().propose(model, demo_topology(baselines=False))
    assert proposal.reasoning.confidence == round(0.5 * 280 / 305, 3)


def test_the_rules_own_diagnosis_keeps_its_confidence() -> None:
    """Computed from the measurements by the diagnostic agent (baselines included): taken as it is."""
    diagnosis = diagnosed()
    assert diagnosis.reasoning.reasoner == "rules"
    proposal = RulesReasoner().propose(diagnosis, demo_topology())
    assert proposal.reasoning.confidence == diagnosis.reasoning.confidence
    assert not [e for e in proposal.reasoning.evidence if e.kind == "confidence-basis"]


@pytest.mark.parametrize("reasoner", ["llm", "fixture", "some-future-model"])
def test_no_other_reasoner_s_number_is_copied(reasoner: str) -> None:
    for confidence in (0.99, 0.42):
        model = said_by(reasoner, Verdict.CONCLUDED, cause="capacity", service="search-api", confidence=confidence)
        proposal = RulesReasoner().propose(model, search_api(400.0, utilization=1.2))
        # the rules' capacity confidence from the measurements: 0.8 x (1 - 300/400)
        assert proposal.reasoning.confidence == 0.2


# -------------------------------------------------------------- healthy service


@pytest.mark.parametrize("reasoner", ["llm", "rules"])
def test_a_healthy_service_gets_no_scale_out(reasoner: str) -> None:
    """The review's check: production/search-api at 120 ms against 300 ms was scaled 2 -> 3."""
    capacity = said_by(reasoner, Verdict.CONCLUDED, cause="capacity", service="search-api", confidence=0.95)
    with pytest.raises(ReasoningFailed, match="within its threshold"):
        RulesReasoner().propose(capacity, search_api(120.0))


def test_a_healthy_caller_gets_no_plan_for_a_dependency_either() -> None:
    topology = demo_topology(checkout_p95=180.0, utilization=0.9)
    model = said_by("llm", Verdict.DEPENDENCY_FAILURE, dependency="payments-api")
    with pytest.raises(ReasoningFailed, match="within its threshold"):
        RulesReasoner().propose(model, topology)


def test_a_degraded_service_the_pool_model_finds_big_enough_still_gets_one_more_replica() -> None:
    """Unchanged for a breach: the wider capacity rule belongs to another issue."""
    diagnosis = said_by("rules", Verdict.CONCLUDED, cause="capacity", service="search-api", confidence=0.5)
    [step] = RulesReasoner().propose(diagnosis, search_api(400.0, utilization=0.3)).steps
    assert (step.action, step.params["replicas"]) == (Action.SCALE, 3)


# ----------------------------------------------------------------- the policy


def decide(diagnosis: Diagnosis, topology: Topology) -> tuple[Outcome, list[str]]:
    """Plan with the rules, then decide as the policy service does: the proposal record,
    its checks, the inventory's replicas, and the diagnosis' reasoner as that diagnosis'
    verified record gives it."""
    plan = RulesReasoner().propose(diagnosis, topology)
    now = datetime.now(UTC)
    value = proposal_value(
        plan,
        proposal_id="7d9c1c55-6b0e-4d1c-9d3a-4a8d0b0b7f10",
        proposed_by="remediation-agent-1",
        now=now,
        ttl=timedelta(minutes=15),
    )
    checked = read_proposal(value, correlation_id=INCIDENT)
    inventory = StaticInventory({f"production/{s.name}": s.replicas for s in topology.services.values() if s.replicas})
    facts = checked.facts(inventory.current_replicas, diagnosis_reasoner=diagnosis.reasoning.reasoner)
    decision = PolicyEngine.from_directory().decide(facts, epoch_ms(now))
    return decision.outcome, decision.policy_ids


def test_a_rules_plan_on_a_model_diagnosis_waits_for_a_person_in_production() -> None:
    """checkout-api at 6 replicas with payments-api 8x slow: the rules plan 6 -> 12 (2x) at
    the rules' 0.875. From the rules' own diagnosis it runs; from a model's, a person decides,
    and only the model guard stands in the way."""
    topology = demo_topology(replicas=6, utilization=1.4167)
    rules = RulesReasoner().diagnose(settled(topology))
    assert decide(dataclasses.replace(rules, event_id="e-rules"), topology) == (
        Outcome.AUTO,
        ["remediation-agents-may-act"],
    )
    model = said_by("llm", Verdict.DEPENDENCY_FAILURE, dependency="payments-api")
    assert decide(model, topology) == (Outcome.HUMAN, [MODEL_GUARD])


def test_the_review_s_attack_ends_at_a_person() -> None:
    """A model talked into capacity at 0.95 for a production service: a healthy one gets no
    plan at all; a degraded one gets a plan a person must approve."""
    with pytest.raises(ReasoningFailed):
        decide(
            said_by("llm", Verdict.CONCLUDED, cause="capacity", service="search-api", confidence=0.95),
            search_api(120.0),
        )
    outcome, policies = decide(
        said_by("llm", Verdict.CONCLUDED, cause="capacity", service="search-api", confidence=0.95),
        search_api(400.0, utilization=1.2),
    )
    assert outcome is Outcome.HUMAN and MODEL_GUARD in policies
