"""The policy table: the Cedar policies in infra/policies, case by case, without the stack.

Each row is a one-step plan (unless it says otherwise) and the outcome and deciding
policies the policy service must reach. The table *is* the specification of what runs
on its own, what waits for a person, and what never runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from services.policy.decide import (
    EVALUATION_ERROR,
    NO_PERMIT,
    Decision,
    Outcome,
    PolicyEngine,
    PolicyError,
    ProposalFacts,
    StepFacts,
    Target,
    dry_run_reasons,
    plan_outcome,
)

NOW_MS = 1_714_564_800_000
LATER_MS = NOW_MS + 15 * 60 * 1000
AGENT = "remediation-agent-1"

SCALE = "ScaleService"
RESTART = "RestartService"
ROLLBACK = "RollbackDeployment"
FAILOVER = "FailoverDependency"
FAILOVER_PARAMS = {"dependency": "payments-db", "toTarget": "payments-db-replica"}


@pytest.fixture(scope="module")
def engine() -> PolicyEngine:
    return PolicyEngine.from_directory()


@dataclass(frozen=True)
class Case:
    name: str
    kind: str
    params: dict[str, Any]
    outcome: Outcome
    policies: list[str]
    environment: str = "production"
    current: int | None = None
    confidence: float = 0.9
    proposer: str = AGENT
    services: int = 1  # the same step on this many distinct services
    resource_kind: str = "service"
    expires_at_ms: int = LATER_MS
    reason_contains: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


CASES = [
    # --- scaling: the 2x rule, the 20-replica ceiling, unknown capacity
    Case("scale 4->8 production (2x)", SCALE, {"replicas": 8}, Outcome.AUTO, ["remediation-agents-may-act"], current=4),
    Case(
        "scale 4->12 production (3x): the demo",
        SCALE,
        {"replicas": 12},
        Outcome.HUMAN,
        ["scale-beyond-2x-needs-human"],
        current=4,
        reason_contains="from 4 to 12 replicas is more than 2x",
    ),
    Case("scale 4->9 production", SCALE, {"replicas": 9}, Outcome.HUMAN, ["scale-beyond-2x-needs-human"], current=4),
    Case("scale 4->12 staging", SCALE, {"replicas": 12}, Outcome.HUMAN, ["scale-beyond-2x-needs-human"], "staging", 4),
    Case(
        "scale 4->21 production",
        SCALE,
        {"replicas": 21},
        Outcome.DENY,
        ["max-replicas"],
        current=4,
        reason_contains="replicas 21 above the limit of 20",
    ),
    Case(
        "scale 12->20 production (at the limit)",
        SCALE,
        {"replicas": 20},
        Outcome.AUTO,
        ["remediation-agents-may-act"],
        current=12,
    ),
    Case("scale 4->40 production", SCALE, {"replicas": 40}, Outcome.DENY, ["max-replicas"], current=4),
    Case("scale 4->0 production", SCALE, {"replicas": 0}, Outcome.DENY, ["min-replicas"], current=4),
    Case(
        "scale production, replicas unknown",
        SCALE,
        {"replicas": 5},
        Outcome.HUMAN,
        ["unknown-capacity-needs-human"],
        current=None,
    ),
    Case(
        "scale in 8->4 production",
        SCALE,
        {"replicas": 4},
        Outcome.HUMAN,
        ["scale-in-production-needs-human"],
        current=8,
    ),
    Case("scale in 8->4 staging", SCALE, {"replicas": 4}, Outcome.AUTO, ["remediation-agents-may-act"], "staging", 8),
    # --- dev: everything auto-authorized, but the hard limits still hold
    Case(
        "scale 4->12 dev",
        SCALE,
        {"replicas": 12},
        Outcome.AUTO,
        ["remediation-agents-may-act", "dev-is-auto-authorized"],
        "dev",
        4,
    ),
    Case(
        "scale dev, replicas unknown",
        SCALE,
        {"replicas": 12},
        Outcome.AUTO,
        ["remediation-agents-may-act", "dev-is-auto-authorized"],
        "dev",
    ),
    Case("scale 4->40 dev", SCALE, {"replicas": 40}, Outcome.DENY, ["max-replicas"], "dev", 4),
    Case(
        "failover dev",
        FAILOVER,
        FAILOVER_PARAMS,
        Outcome.AUTO,
        ["remediation-agents-may-act", "dev-is-auto-authorized"],
        "dev",
    ),
    Case(
        "low confidence dev",
        RESTART,
        {"rolling": False},
        Outcome.AUTO,
        ["remediation-agents-may-act", "dev-is-auto-authorized"],
        "dev",
        confidence=0.1,
    ),
    # --- failover, rollback, restart
    Case("failover production", FAILOVER, FAILOVER_PARAMS, Outcome.HUMAN, ["production-failover-needs-human"]),
    Case("failover staging", FAILOVER, FAILOVER_PARAMS, Outcome.AUTO, ["remediation-agents-may-act"], "staging"),
    Case("rollback production", ROLLBACK, {"toRevision": "r41"}, Outcome.HUMAN, ["production-rollback-needs-human"]),
    Case("rollback staging", ROLLBACK, {"toRevision": "r41"}, Outcome.AUTO, ["remediation-agents-may-act"], "staging"),
    Case(
        "exact rollback production",
        ROLLBACK,
        {"toRevision": "2", "fromRevision": "3", "fromImages": ["shop=shop:1.5"], "toImages": ["shop=shop:1.4"]},
        Outcome.HUMAN,
        ["production-rollback-needs-human"],
    ),
    # --- the Kubernetes kinds: pausing is the safe direction; ceilings and limits are a person's call in
    # production, raised only, at most 2x anywhere
    Case("pause production", "PauseRollout", {"paused": True}, Outcome.AUTO, ["remediation-agents-may-act"]),
    Case("resume production", "PauseRollout", {"paused": False}, Outcome.HUMAN, ["production-resume-needs-human"]),
    Case("resume staging", "PauseRollout", {"paused": False}, Outcome.AUTO, ["remediation-agents-may-act"], "staging"),
    Case(
        "ceiling 10->15 production",
        "RaiseAutoscalerCeiling",
        {"autoscalerKind": "HorizontalPodAutoscaler", "autoscaler": "web", "fromMaxReplicas": 10, "maxReplicas": 15},
        Outcome.HUMAN,
        ["production-ceiling-needs-human"],
    ),
    Case(
        "ceiling 10->20 staging (2x)",
        "RaiseAutoscalerCeiling",
        {"autoscalerKind": "ScaledObject", "autoscaler": "web", "fromMaxReplicas": 10, "maxReplicas": 20},
        Outcome.AUTO,
        ["remediation-agents-may-act"],
        "staging",
    ),
    Case(
        "ceiling 10->21 dev (over 2x)",
        "RaiseAutoscalerCeiling",
        {"autoscalerKind": "HorizontalPodAutoscaler", "autoscaler": "web", "fromMaxReplicas": 10, "maxReplicas": 21},
        Outcome.DENY,
        ["ceiling-at-most-2x"],
        "dev",
    ),
    Case(
        "ceiling lowered staging",
        "RaiseAutoscalerCeiling",
        {"autoscalerKind": "HorizontalPodAutoscaler", "autoscaler": "web", "fromMaxReplicas": 10, "maxReplicas": 8},
        Outcome.DENY,
        ["ceiling-only-raised"],
        "staging",
    ),
    Case(
        "memory 256Mi->512Mi production",
        "RaiseMemoryLimit",
        {"container": "app", "fromMemoryLimitBytes": 256 << 20, "memoryLimitBytes": 512 << 20},
        Outcome.HUMAN,
        ["production-memory-limit-needs-human"],
    ),
    Case(
        "memory 256Mi->513Mi staging (over 2x)",
        "RaiseMemoryLimit",
        {"container": "app", "fromMemoryLimitBytes": 256 << 20, "memoryLimitBytes": 513 << 20},
        Outcome.DENY,
        ["memory-limit-at-most-2x"],
        "staging",
    ),
    Case(
        "memory 256Mi->384Mi staging",
        "RaiseMemoryLimit",
        {"container": "app", "fromMemoryLimitBytes": 256 << 20, "memoryLimitBytes": 384 << 20},
        Outcome.AUTO,
        ["remediation-agents-may-act"],
        "staging",
    ),
    Case("rolling restart production", RESTART, {"rolling": True}, Outcome.AUTO, ["remediation-agents-may-act"]),
    Case(
        "all-at-once restart production",
        RESTART,
        {"rolling": False},
        Outcome.HUMAN,
        ["all-at-once-restart-needs-human"],
    ),
    # --- plan-wide guards: blast radius and confidence
    Case("restart 2 services", RESTART, {"rolling": True}, Outcome.AUTO, ["remediation-agents-may-act"], services=2),
    Case(
        "restart 3 services",
        RESTART,
        {"rolling": True},
        Outcome.HUMAN,
        ["blast-radius-needs-human"],
        services=3,
        reason_contains="touches 3 services, more than 2",
    ),
    Case(
        "confidence 0.62",
        RESTART,
        {"rolling": True},
        Outcome.HUMAN,
        ["low-confidence-needs-human"],
        confidence=0.62,
        reason_contains="confidence 0.62 below 0.8",
    ),
    Case("confidence 0.8", RESTART, {"rolling": True}, Outcome.AUTO, ["remediation-agents-may-act"], confidence=0.8),
    Case(
        "several guards at once",
        SCALE,
        {"replicas": 12},
        Outcome.HUMAN,
        ["scale-beyond-2x-needs-human", "low-confidence-needs-human"],
        current=4,
        confidence=0.5,
    ),
    Case(
        "a guard and a limit: the limit wins",
        SCALE,
        {"replicas": 30},
        Outcome.DENY,
        ["max-replicas"],
        current=4,
        confidence=0.5,
    ),
    # --- who proposes, what it targets, whether it is still fresh
    Case(
        "an unknown agent",
        RESTART,
        {"rolling": True},
        Outcome.DENY,
        [NO_PERMIT],
        proposer="diagnostic-agent-1",
        reason_contains="no policy permits diagnostic-agent-1",
    ),
    Case("an unknown agent in dev", RESTART, {"rolling": True}, Outcome.DENY, [NO_PERMIT], "dev", proposer="x"),
    Case("not a service", RESTART, {"rolling": True}, Outcome.DENY, ["services-only"], resource_kind="database"),
    Case(
        "expired command",
        RESTART,
        {"rolling": True},
        Outcome.DENY,
        ["command-expired"],
        expires_at_ms=NOW_MS - 1,
    ),
    Case(
        "expired command in dev",
        SCALE,
        {"replicas": 3},
        Outcome.DENY,
        ["command-expired"],
        "dev",
        2,
        expires_at_ms=NOW_MS,
    ),
]


RULES = {"reasoner": "rules", "diagnosis_reasoner": "rules"}


def facts_for(case: Case) -> ProposalFacts:
    steps = tuple(
        StepFacts(
            command_id=f"cmd-{i}",
            kind=case.kind,
            target=Target(case.resource_kind, case.environment, "checkout-api" if i == 0 else f"service-{i}"),
            params=case.params,
            expires_at_ms=case.expires_at_ms,
            current_replicas=case.current,
        )
        for i in range(case.services)
    )
    # the table is about rules plans resting on rules diagnoses; the reasoners' cases are below
    return ProposalFacts("incident-204", "proposal-1", case.proposer, case.confidence, steps, **RULES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_policy_table(engine: PolicyEngine, case: Case) -> None:
    decision = engine.decide(facts_for(case), NOW_MS)
    assert decision.outcome is case.outcome, decision.reasons
    assert decision.policy_ids == case.policies
    assert len(decision.reasons) >= 1
    if case.reason_contains:
        assert any(case.reason_contains in r for r in decision.reasons), decision.reasons


@pytest.mark.parametrize("case", [c for c in CASES if c.outcome is Outcome.HUMAN], ids=lambda c: c.name)
def test_what_needs_a_person_is_allowed_once_a_person_approves(engine: PolicyEngine, case: Case) -> None:
    decision = engine.decide(facts_for(case), NOW_MS, human_approved=True)
    assert decision.outcome is Outcome.AUTO


@pytest.mark.parametrize("case", [c for c in CASES if c.outcome is Outcome.DENY], ids=lambda c: c.name)
def test_what_is_denied_stays_denied_when_a_person_approves(engine: PolicyEngine, case: Case) -> None:
    decision = engine.decide(facts_for(case), NOW_MS, human_approved=True)
    assert decision.outcome is Outcome.DENY


def test_a_plan_is_as_strict_as_its_strictest_step(engine: PolicyEngine) -> None:
    target = Target("service", "production", "checkout-api")
    steps = (
        StepFacts("a", RESTART, target, {"rolling": True}, LATER_MS),
        StepFacts("b", SCALE, target, {"replicas": 12}, LATER_MS, current_replicas=4),
        StepFacts("c", SCALE, target, {"replicas": 8}, LATER_MS, current_replicas=4),
    )
    decision = engine.decide(ProposalFacts("i", "p", AGENT, 0.9, steps, **RULES), NOW_MS)
    assert decision.outcome is Outcome.HUMAN
    assert [s.outcome for s in decision.steps] == [Outcome.AUTO, Outcome.HUMAN, Outcome.AUTO]
    # the reasons are those of the deciding step only
    assert decision.policy_ids == ["scale-beyond-2x-needs-human"]
    assert decision.denied_command_id is None

    denied = engine.decide(
        ProposalFacts(
            "i", "p", AGENT, 0.9, (*steps, StepFacts("d", SCALE, target, {"replicas": 50}, LATER_MS, 4)), **RULES
        ),
        NOW_MS,
    )
    assert denied.outcome is Outcome.DENY
    assert denied.policy_ids == ["max-replicas"]
    assert denied.denied_command_id == "d"


def test_plan_outcome() -> None:
    assert plan_outcome([]) is Outcome.DENY
    assert plan_outcome([Outcome.AUTO, Outcome.AUTO]) is Outcome.AUTO
    assert plan_outcome([Outcome.AUTO, Outcome.HUMAN]) is Outcome.HUMAN
    assert plan_outcome([Outcome.DENY, Outcome.HUMAN, Outcome.AUTO]) is Outcome.DENY


def test_an_empty_plan_is_denied(engine: PolicyEngine) -> None:
    assert engine.decide(ProposalFacts("i", "p", AGENT, 0.9, ()), NOW_MS).outcome is Outcome.DENY


def test_an_unknown_command_kind_fails_closed(engine: PolicyEngine) -> None:
    step = StepFacts("a", "DeleteDatabase", Target("service", "dev", "x"), {}, LATER_MS)
    decision = engine.decide(ProposalFacts("i", "p", AGENT, 0.9, (step,)), NOW_MS)
    assert decision.outcome is Outcome.DENY
    assert decision.policy_ids == [EVALUATION_ERROR]


def test_dry_run_reasons_lead_with_the_would_be_decision(engine: PolicyEngine) -> None:
    case = next(c for c in CASES if c.name.endswith("the demo"))
    decision = engine.decide(facts_for(case), NOW_MS)
    reasons = dry_run_reasons(decision)
    assert reasons[0] == "dry-run: would require human approval"
    assert reasons[1:] == decision.reasons
    assert dry_run_reasons(Decision(Outcome.AUTO, ()))[0] == "dry-run: would auto-authorize"
    assert dry_run_reasons(Decision(Outcome.DENY, ()))[0] == "dry-run: would deny"


def test_facts_round_trip_through_json(engine: PolicyEngine) -> None:
    facts = facts_for(CASES[1])
    assert ProposalFacts.from_json(facts.to_json()) == facts


def test_confidence_is_read_in_whole_percent() -> None:
    def pct(confidence: float) -> int:
        return ProposalFacts("i", "p", AGENT, confidence, ()).confidence_pct

    assert pct(0.8) == 80
    assert pct(0.29) == 29
    assert pct(0.799) == 79
    assert pct(1.5) == 100
    assert pct(-1) == 0
    assert pct(float("nan")) == 0


# ------------------------------------------------ a model's confidence is not enough
# A production step from any reasoner but the deterministic rules waits for a person,
# whatever its confidence (model-plan-in-production-needs-human). Cedar reads the
# reasoner from context.plan.reasoner: these cases ask Cedar with it, the way the policy
# service asks with the rest of the plan.


def ask_cedar(
    engine: PolicyEngine,
    kind: str,
    params: dict[str, Any],
    *,
    reasoner: str,
    diagnosis_reasoner: str = "rules",
    environment: str = "production",
    confidence_pct: int = 100,
    current: int | None = None,
) -> tuple[Outcome, list[str]]:
    """The step's outcome and deciding policies, asked as decide.py asks: without a person,
    then with one."""
    target = Target("service", environment, "checkout-api")

    def ask(human: bool) -> tuple[bool, list[str]]:
        context: dict[str, Any] = {
            "humanApproved": human,
            "plan": {
                "steps": 1,
                "services": 1,
                "confidencePct": confidence_pct,
                "reasoner": reasoner,
                "diagnosisReasoner": diagnosis_reasoner,
            },
            "secondsToExpiry": 900,
            **params,
        }
        if current is not None:
            context["currentReplicas"] = current
        request = {
            "principal": {"type": "Agent", "id": AGENT},
            "action": {"type": "Action", "id": kind},
            "resource": {"type": "Service", "id": target.key},
            "context": context,
        }
        entities = [{"uid": {"type": "Agent", "id": AGENT}, "attrs": {"name": AGENT}, "parents": []}, target.entity()]
        answer = engine._ask(request, entities, {"service": target.key, "confidence": f"{confidence_pct / 100:.2f}"})
        assert not answer.errored, answer.findings
        return answer.allowed, [f.policy_id for f in answer.findings]

    alone, found = ask(False)
    if alone:
        return Outcome.AUTO, found
    with_person, remaining = ask(True)
    return (Outcome.HUMAN, found) if with_person else (Outcome.DENY, remaining)


MODEL_GUARD = "model-plan-in-production-needs-human"


@pytest.mark.parametrize(
    ("kind", "params", "current"),
    [(SCALE, {"replicas": 8}, 4), (SCALE, {"replicas": 5}, 4), (RESTART, {"rolling": True}, None)],
    ids=["scale 4->8", "scale 4->5", "rolling restart"],
)
@pytest.mark.parametrize("reasoner", ["llm", "some-future-model"])
def test_a_production_step_from_a_model_needs_a_person_even_at_confidence_1(
    engine: PolicyEngine, kind: str, params: dict[str, Any], current: int | None, reasoner: str
) -> None:
    outcome, policies = ask_cedar(engine, kind, params, reasoner=reasoner, confidence_pct=100, current=current)
    assert (outcome, policies) == (Outcome.HUMAN, [MODEL_GUARD])
    # the same step from the rules reasoner keeps the guards it always had: it runs
    assert ask_cedar(engine, kind, params, reasoner="rules", current=current) == (
        Outcome.AUTO,
        ["remediation-agents-may-act"],
    )


def test_the_model_guard_is_about_production_and_never_lifts_a_limit(engine: PolicyEngine) -> None:
    def outcome(**how: Any) -> Outcome:
        return ask_cedar(engine, SCALE, {"replicas": 8}, reasoner="llm", current=4, **how)[0]

    assert outcome(environment="staging") is Outcome.AUTO
    assert outcome(environment="dev") is Outcome.AUTO
    assert ask_cedar(engine, SCALE, {"replicas": 40}, reasoner="llm", current=4) == (Outcome.DENY, ["max-replicas"])
    # with other guards it is one reason among them
    found = ask_cedar(engine, SCALE, {"replicas": 12}, reasoner="llm", current=4, confidence_pct=50)
    assert found == (Outcome.HUMAN, ["scale-beyond-2x-needs-human", "low-confidence-needs-human", MODEL_GUARD])


def test_a_production_proposal_from_a_model_needs_a_person_whatever_its_confidence(engine: PolicyEngine) -> None:
    step = StepFacts("a", SCALE, Target("service", "production", "checkout-api"), {"replicas": 8}, LATER_MS, 4)
    facts = ProposalFacts("i", "p", AGENT, 1.0, (step,), reasoner="llm", diagnosis_reasoner="rules")
    decision = engine.decide(facts, NOW_MS)
    assert decision.outcome is Outcome.HUMAN
    assert decision.policy_ids == [MODEL_GUARD]
    assert engine.decide(facts, NOW_MS, human_approved=True).outcome is Outcome.AUTO


# ---------------------------------- a plan is no more trusted than its diagnosis
# Security review 3, H1: the diagnostic agent on a model, the remediation agent on rules.
# The rules plan (4 -> 8, within 2x) rests on the model's diagnosis: whatever the plan's
# confidence, Cedar sees the diagnosis' reasoner (the policy service reads it from the
# verified diagnosis record) and a person decides in production.


def mixed(environment: str, diagnosis_reasoner: str | None, *, reasoner: str | None = "rules") -> ProposalFacts:
    step = StepFacts("a", SCALE, Target("service", environment, "checkout-api"), {"replicas": 8}, LATER_MS, 4)
    return ProposalFacts("i", "p", AGENT, 0.99, (step,), reasoner=reasoner, diagnosis_reasoner=diagnosis_reasoner)


@pytest.mark.parametrize("diagnosis_reasoner", ["llm", "some-future-model"])
def test_a_rules_plan_on_a_model_diagnosis_needs_a_person_in_production(
    engine: PolicyEngine, diagnosis_reasoner: str
) -> None:
    assert engine.decide(mixed("production", "rules"), NOW_MS).outcome is Outcome.AUTO  # the control
    decision = engine.decide(mixed("production", diagnosis_reasoner), NOW_MS)
    assert (decision.outcome, decision.policy_ids) == (Outcome.HUMAN, [MODEL_GUARD])
    assert decision.reasons == [
        f"a production change to production/checkout-api rests on a model's word (plan: rules, diagnosis: "
        f"{diagnosis_reasoner}), which text in its inputs can steer: a person decides"
    ]
    # a person may still approve it, and the guard is the only thing in the way
    assert engine.decide(mixed("production", diagnosis_reasoner), NOW_MS, human_approved=True).outcome is Outcome.AUTO
    # asked of Cedar directly, the way the service asks
    assert ask_cedar(engine, SCALE, {"replicas": 8}, reasoner="rules", diagnosis_reasoner="llm", current=4) == (
        Outcome.HUMAN,
        [MODEL_GUARD],
    )


@pytest.mark.parametrize("environment", ["dev", "staging"])
def test_the_diagnosis_reasoner_changes_nothing_outside_production(engine: PolicyEngine, environment: str) -> None:
    """The guard is about production, as the policies say: dev and staging keep their rules."""
    assert engine.decide(mixed(environment, "llm"), NOW_MS).outcome is Outcome.AUTO
    assert engine.decide(mixed(environment, None, reasoner=None), NOW_MS).outcome is Outcome.AUTO


@pytest.mark.parametrize(
    ("reasoner", "diagnosis_reasoner"),
    [("rules", None), (None, "rules"), (None, None), ("RULES", "rules"), ("rules", "")],
    ids=["no diagnosis reasoner", "no plan reasoner", "neither", "another spelling", "empty"],
)
def test_an_unknown_reasoner_counts_as_a_model_in_production(
    engine: PolicyEngine, reasoner: str | None, diagnosis_reasoner: str | None
) -> None:
    """Fail closed: a reasoner the policy cannot name as ``rules`` is not trusted as rules."""
    decision = engine.decide(mixed("production", diagnosis_reasoner, reasoner=reasoner), NOW_MS)
    assert (decision.outcome, decision.policy_ids) == (Outcome.HUMAN, [MODEL_GUARD])


def test_the_diagnosis_reasoner_is_kept_with_the_facts() -> None:
    """The facts are stored with the decision and read back at approval."""
    facts = mixed("production", "llm")
    assert facts.to_json()["diagnosisReasoner"] == "llm"
    assert ProposalFacts.from_json(facts.to_json()) == facts
    older = {k: v for k, v in facts.to_json().items() if k != "diagnosisReasoner"}  # stored before the field
    assert ProposalFacts.from_json(older).diagnosis_reasoner is None


# --------------------------------------------------------------------- people


@pytest.mark.parametrize(
    ("user", "roles", "action", "allowed", "policies"),
    [
        ("alice", ["approver"], "Approve", True, ["approvers-may-decide"]),
        ("alice", ["approver"], "Reject", True, ["approvers-may-decide"]),
        ("bob", ["viewer"], "Approve", False, [NO_PERMIT]),
        ("bob", ["viewer"], "Reject", False, [NO_PERMIT]),
        ("carol", [], "Approve", False, [NO_PERMIT]),
        (AGENT, ["approver"], "Approve", False, ["proposer-cannot-approve"]),
        # rejecting one's own proposal is harmless: withdrawing it
        (AGENT, ["approver"], "Reject", True, ["approvers-may-decide"]),
    ],
)
def test_who_may_decide(
    engine: PolicyEngine, user: str, roles: list[str], action: str, allowed: bool, policies: list[str]
) -> None:
    targets = [Target("service", "production", "checkout-api"), Target("service", "production", "payments-api")]
    check = engine.check_person(user=user, roles=roles, action=action, targets=targets, proposed_by=AGENT)
    assert check.allowed is allowed
    assert check.policy_ids == policies


def test_a_person_check_needs_a_target(engine: PolicyEngine) -> None:
    check = engine.check_person(user="alice", roles=["approver"], action="Approve", targets=[], proposed_by=AGENT)
    assert not check.allowed


# ----------------------------------------------------------------- the files


def test_every_policy_is_named_and_explained(engine: PolicyEngine) -> None:
    ids = engine.policy_ids
    assert len(ids) == len(set(ids))
    assert {"max-replicas", "scale-beyond-2x-needs-human", "dev-is-auto-authorized", "proposer-cannot-approve"} <= set(
        ids
    )


def _copy_policies(tmp_path: Path, extra: str, *, name: str = "zz-extra.cedar") -> Path:
    source = PolicyEngine.from_directory().policies_text
    (tmp_path / "all.cedar").write_text(source)
    (tmp_path / name).write_text(extra)
    schema = Path(__file__).resolve().parents[3] / "infra" / "policies" / "flotilla.cedarschema"
    (tmp_path / "flotilla.cedarschema").write_text(schema.read_text())
    return tmp_path


def test_a_policy_that_does_not_type_check_is_refused(tmp_path: Path) -> None:
    bad = (
        '@id("typo") @reason("x")\n'
        'forbid (principal, action == Action::"ScaleService", resource) when { context.replica > 2 };'
    )
    with pytest.raises(PolicyError, match="type-check"):
        PolicyEngine.from_directory(_copy_policies(tmp_path, bad))


def test_a_policy_without_annotations_is_refused(tmp_path: Path) -> None:
    bare = 'forbid (principal, action == Action::"ScaleService", resource) when { context.replicas > 2 };'
    with pytest.raises(PolicyError, match="@id and @reason"):
        PolicyEngine.from_directory(_copy_policies(tmp_path, bare))


def test_two_policies_with_one_id_are_refused(tmp_path: Path) -> None:
    twin = '@id("max-replicas") @reason("x")\nforbid (principal, action, resource) when { false };'
    with pytest.raises(PolicyError, match="share"):
        PolicyEngine.from_directory(_copy_policies(tmp_path, twin))


def test_an_empty_policy_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match=r"no \*\.cedar"):
        PolicyEngine.from_directory(tmp_path)


def test_a_new_forbid_takes_effect_without_code(tmp_path: Path) -> None:
    freeze = (
        '@id("change-freeze") @reason("change freeze on {service}")\n'
        'forbid (principal, action in Action::"Remediate", resource) when { resource.name == "checkout-api" };'
    )
    engine = PolicyEngine.from_directory(_copy_policies(tmp_path, freeze))
    decision = engine.decide(facts_for(CASES[0]), NOW_MS)
    assert decision.outcome is Outcome.DENY
    assert decision.reasons == ["change freeze on production/checkout-api"]
