"""The rules reasoner: deterministic diagnoses and plans from a topology snapshot."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest
from flotilla_evidence.model import RevisionFacts
from flotilla_reasoning import (
    Action,
    AgentSettings,
    Diagnosis,
    DiagnosticEvidence,
    LLMReasoner,
    ReasoningFailed,
    RulesConfig,
    RulesReasoner,
    ServiceView,
    Topology,
    Verdict,
    make_reasoner,
)
from flotilla_reasoning.rules import readings, replicas_for

INCIDENT = "incident-204"


def demo_topology(
    *,
    payments_ms: float = 280.0,
    inventory_ms: float = 25.0,
    checkout_p95: float = 1831.0,
    utilization: float | None = 2.125,
    baselines: bool = True,
    revision: str = "v41",
    replicas: int = 4,
) -> Topology:
    """The demo: checkout-api (4 replicas) calls payments-api (slow) and inventory-db."""
    services = {
        "checkout-api": ServiceView(
            "checkout-api",
            "production",
            replicas,
            checkout_p95,
            500.0,
            ("payments-api", "inventory-db"),
            revision,
            "v40",
            {"payments-api": "payments-api-secondary"},
            {"payments-api": "payments-api", "inventory-db": "inventory-db"},
        ),
        "payments-api": ServiceView("payments-api", "production", 3, payments_ms, 400.0, (), "v17", "v16"),
        "payments-api-secondary": ServiceView("payments-api-secondary", "production", 2, 45.0, 400.0),
        "inventory-db": ServiceView("inventory-db", "production", 2, inventory_ms, 150.0, (), "v8", "v7"),
    }
    return Topology(
        services=services,
        dependency_p95={("checkout-api", "payments-api"): payments_ms, ("checkout-api", "inventory-db"): inventory_ms},
        utilization={} if utilization is None else {"checkout-api": utilization},
        baselines={("checkout-api", "payments-api"): 35.0, ("checkout-api", "inventory-db"): 25.0} if baselines else {},
        healthy_revisions={"checkout-api": "v41"} if baselines else {},
        source="sim",
    )


def evidence(topology: Topology, **changes: object) -> DiagnosticEvidence:
    base = DiagnosticEvidence(INCIDENT, "checkout-api", "production", "p95 1831 ms against 500 ms", topology)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_a_slow_dependency_with_a_waiting_pool_is_suspected_with_confidence_from_the_ratio() -> None:
    diagnosis = RulesReasoner().diagnose(evidence(demo_topology()))
    assert diagnosis.verdict is Verdict.DEPENDENCY_FAILURE
    assert diagnosis.suspected_dependency == "payments-api"
    assert diagnosis.failure_mode == "slow-responses"
    assert diagnosis.reasoning.confidence == pytest.approx(1 - 35 / 280)  # 8x normal -> 0.875
    assert diagnosis.reasoning.reasoner == "rules"
    assert diagnosis.reasoning.model is None
    assert diagnosis.reasoning.usage.total == 0
    kinds = [e.kind for e in diagnosis.reasoning.evidence]
    assert kinds[:3] == ["metric", "metric", "dependency-health"]  # p95, pool utilization, the suspect
    assert "280 ms" in [e.observed_value for e in diagnosis.reasoning.evidence]


def test_the_same_evidence_gives_the_same_decision() -> None:
    reasoner = RulesReasoner()
    assert reasoner.diagnose(evidence(demo_topology())) == reasoner.diagnose(evidence(demo_topology()))
    first = RulesReasoner().diagnose(evidence(demo_topology()))
    plan = [RulesReasoner().propose(dataclasses.replace(first, event_id="e-1"), demo_topology()) for _ in range(2)]
    assert plan[0] == plan[1]


def test_confidence_grows_with_the_ratio() -> None:
    low = RulesReasoner().diagnose(evidence(demo_topology(payments_ms=80.0))).reasoning.confidence
    high = RulesReasoner().diagnose(evidence(demo_topology(payments_ms=700.0))).reasoning.confidence
    assert 0 < low < high < 1


def test_without_a_learned_baseline_the_dominant_dependency_is_suspected_with_less_confidence() -> None:
    diagnosis = RulesReasoner().diagnose(evidence(demo_topology(baselines=False)))
    assert diagnosis.verdict is Verdict.DEPENDENCY_FAILURE
    assert diagnosis.suspected_dependency == "payments-api"
    assert diagnosis.reasoning.confidence == pytest.approx(0.5 * 280 / 305, abs=1e-3)


def test_when_no_dependency_explains_it_asks_for_a_job_once_then_concludes() -> None:
    healthy_deps = demo_topology(payments_ms=36.0)
    first = RulesReasoner().diagnose(evidence(healthy_deps))
    assert first.verdict is Verdict.NEEDS_EVIDENCE
    assert first.job_kind == "cpu-profile"
    after_job = RulesReasoner().diagnose(
        evidence(healthy_deps, job_id="j-1", job_kind="cpu-profile", may_request_more=False)
    )
    assert after_job.verdict is Verdict.CONCLUDED
    assert after_job.cause_category == "capacity"
    bad_deploy = RulesReasoner().diagnose(
        evidence(demo_topology(payments_ms=36.0, revision="v42"), may_request_more=False)
    )
    assert bad_deploy.cause_category == "bad-deployment"


def test_an_unknown_service_cannot_be_diagnosed() -> None:
    with pytest.raises(ReasoningFailed, match="not in the topology"):
        RulesReasoner().diagnose(evidence(demo_topology(), service="ghost-api"))


REQUESTED = datetime(2026, 12, 7, 5, 7, 13, tzinfo=UTC)


def calm(history: list[tuple[datetime, float]] | None) -> Topology:
    """checkout-api under its threshold now, with this p95 history (None: no history at all)."""
    topology = demo_topology(checkout_p95=320.0, payments_ms=35.0)
    return dataclasses.replace(topology, history={} if history is None else {"checkout-api": tuple(history)})


def test_evidence_with_no_breach_since_the_request_is_read_again_before_concluding() -> None:
    # what a storm showed: the health agent's reading opened the incident a scrape before
    # Prometheus saw the breach, and "unknown" led to a restart that fixed nothing
    before = [(REQUESTED - timedelta(seconds=30 * i), 310.0) for i in range(3, 0, -1)]
    for history in (None, [], before, [*before, (REQUESTED + timedelta(seconds=1), 320.0)]):
        diagnosis = RulesReasoner().diagnose(evidence(calm(history), requested_at=REQUESTED))
        assert diagnosis.verdict is Verdict.NEEDS_EVIDENCE, history
        assert diagnosis.job_kind == "evidence-recheck"
        assert "behind the detection" in diagnosis.reasoning.summary


def test_an_old_breach_before_the_request_does_not_count_as_seeing_this_one() -> None:
    # an earlier incident of the same service, recovered, is still in the look-back
    history = [(REQUESTED - timedelta(seconds=60), 900.0), (REQUESTED - timedelta(seconds=30), 300.0)]
    diagnosis = RulesReasoner().diagnose(evidence(calm(history), requested_at=REQUESTED))
    assert diagnosis.verdict is Verdict.NEEDS_EVIDENCE


def test_a_breach_seen_and_over_before_the_agent_looked_concludes_unknown() -> None:
    history = [(REQUESTED, 900.0), (REQUESTED + timedelta(seconds=30), 320.0)]
    diagnosis = RulesReasoner().diagnose(evidence(calm(history), requested_at=REQUESTED))
    assert (diagnosis.verdict, diagnosis.cause_category) == (Verdict.CONCLUDED, "unknown")


def test_after_the_recheck_or_without_a_request_time_the_reasoner_concludes_with_what_it_has() -> None:
    again = evidence(calm([]), requested_at=REQUESTED, may_request_more=False, job_id="job-1")
    unknown_when = evidence(calm([]))  # requested_at None: a caller that did not say
    for asked in (again, unknown_when):
        diagnosis = RulesReasoner().diagnose(asked)
        assert (diagnosis.verdict, diagnosis.cause_category) == (Verdict.CONCLUDED, "unknown")


# ------------------------------------------------------------------ plans


def diagnosed(topology: Topology | None = None) -> Diagnosis:
    d = RulesReasoner().diagnose(evidence(topology or demo_topology()))
    return dataclasses.replace(d, event_id="6f1c7c8e-0000-4000-8000-000000000001")


def test_the_demo_plan_scales_checkout_from_4_to_12_replicas() -> None:
    proposal = RulesReasoner().propose(diagnosed(), demo_topology())
    assert [(s.action, s.service, s.environment, dict(s.params)) for s in proposal.steps] == [
        (Action.SCALE, "checkout-api", "production", {"replicas": 12})
    ]
    assert proposal.incident_id == INCIDENT
    assert proposal.diagnosis_event_id == "6f1c7c8e-0000-4000-8000-000000000001"
    assert proposal.reasoning.confidence == pytest.approx(0.875)
    model = next(e for e in proposal.reasoning.evidence if e.kind == "latency-model")
    assert model.observed_value == "12 replicas"


def test_replicas_come_from_the_pool_model() -> None:
    assert replicas_for(4, 2.125, 0.75) == 12  # ceil(11.33)
    assert replicas_for(4, 1.5, 0.75) == 8  # exact products stay exact
    assert replicas_for(3, 0.1, 0.75) == 1


def test_without_a_utilization_metric_the_latency_over_threshold_stands_in() -> None:
    topology = demo_topology(utilization=None)
    proposal = RulesReasoner().propose(diagnosed(topology), topology)
    assert proposal.steps[0].params == {"replicas": 15}  # ceil(4 x 1831 / 500)


def test_the_plan_never_exceeds_max_replicas_and_says_so() -> None:
    reasoner = RulesReasoner(RulesConfig(max_replicas=10))
    proposal = reasoner.propose(diagnosed(), demo_topology())
    assert proposal.steps[0].params == {"replicas": 10}
    assert proposal.reasoning.confidence < 0.875
    assert any("capped at 10" in e.description for e in proposal.reasoning.evidence)


def test_preferring_failover_fails_the_dependency_over() -> None:
    proposal = RulesReasoner(RulesConfig(strategy="failover")).propose(diagnosed(), demo_topology())
    assert [(s.action, dict(s.params)) for s in proposal.steps] == [
        (Action.FAILOVER, {"dependency": "payments-api", "toTarget": "payments-api-secondary"})
    ]


def test_failover_then_scale_is_a_two_step_plan() -> None:
    reasoner = RulesReasoner(RulesConfig(strategy="failover-then-scale"))
    proposal = reasoner.propose(diagnosed(), demo_topology())
    assert [s.action for s in proposal.steps] == [Action.FAILOVER, Action.SCALE]


def test_at_max_replicas_it_fails_over_or_gives_up() -> None:
    full = demo_topology(replicas=20)
    proposal = RulesReasoner().propose(diagnosed(full), full)
    assert [s.action for s in proposal.steps] == [Action.FAILOVER]
    no_standby = dataclasses.replace(
        full,
        services={
            **full.services,
            "checkout-api": dataclasses.replace(full.services["checkout-api"], failover_targets={}),
        },
    )
    with pytest.raises(ReasoningFailed, match="20 replicas"):
        RulesReasoner().propose(diagnosed(no_standby), no_standby)


def test_a_bad_deployment_is_rolled_back_to_the_last_healthy_revision() -> None:
    """More cases (Kubernetes' facts, a forbidden or paused rollback): test_reasoner_rules_rollback.py."""
    topology = demo_topology(payments_ms=36.0, revision="v42")
    checkout = dataclasses.replace(
        topology.services["checkout-api"],
        previous_revision="v41",
        running=RevisionFacts("v42"),
        rollback_candidate=RevisionFacts("v41"),
    )
    topology = dataclasses.replace(topology, services={**topology.services, "checkout-api": checkout})
    d = RulesReasoner().diagnose(evidence(topology, may_request_more=False))
    proposal = RulesReasoner().propose(dataclasses.replace(d, event_id="e-2"), topology)
    rollback = {"toRevision": "v41", "fromRevision": "v42", "fromTemplateHash": None, "toTemplateHash": None}
    assert [(s.action, dict(s.params)) for s in proposal.steps] == [
        (Action.ROLLBACK, {**rollback, "fromImages": [], "toImages": []})
    ]


def test_readings_are_ordered_by_slowdown() -> None:
    topology = demo_topology()
    found = readings(topology, topology.services["checkout-api"], 100.0)
    assert [(r.dependency, r.slowdown, r.learned) for r in found] == [
        ("payments-api", 8.0, True),
        ("inventory-db", 1.0, True),
    ]


def test_settings_choose_the_reasoner() -> None:
    assert isinstance(make_reasoner(AgentSettings()), RulesReasoner)
    chosen = make_reasoner(AgentSettings(reasoner="llm", llm_base_url="http://127.0.0.1:9/v1", llm_model="m"))
    assert isinstance(chosen, LLMReasoner)
    with pytest.raises(ValueError, match="FLOTILLA_LLM_BASE_URL"):
        make_reasoner(AgentSettings(reasoner="llm"))


def test_without_a_replica_count_no_scale_out_is_sized() -> None:
    """Prometheus had no kube_deployment_spec_replicas for the service: a person decides."""
    topology = demo_topology()
    unknown = dataclasses.replace(topology.services["checkout-api"], replicas=None)
    topology = dataclasses.replace(topology, services={**topology.services, "checkout-api": unknown})
    diagnosis = RulesReasoner().diagnose(evidence(topology))
    assert "an unknown number of replicas" in diagnosis.reasoning.evidence[0].description
    diagnosis = dataclasses.replace(diagnosis, event_id="e-1")
    [step] = RulesReasoner().propose(diagnosis, topology).steps  # the failover needs no count
    assert step.action is Action.FAILOVER
    alone = dataclasses.replace(unknown, failover_targets={})
    topology = dataclasses.replace(topology, services={**topology.services, "checkout-api": alone})
    with pytest.raises(ReasoningFailed, match="no replica count for production/checkout-api"):
        RulesReasoner().propose(diagnosis, topology)


def test_history_says_when_the_breach_began_and_what_it_was_before() -> None:
    from datetime import UTC, datetime

    at = [datetime(2026, 12, 6, 12, 0, s, tzinfo=UTC) for s in (0, 15, 30, 45)]
    topology = dataclasses.replace(
        demo_topology(), history={"checkout-api": tuple(zip(at, (180.0, 190.0, 1200.0, 1831.0), strict=True))}
    )
    diagnosis = RulesReasoner().diagnose(evidence(topology))
    [item] = [e for e in diagnosis.reasoning.evidence if e.kind == "metric-history"]
    assert item.description == (
        "checkout-api p95 crossed its 500 ms threshold at 12:00:30 UTC (190 ms at most before); 1831 ms now"
    )
