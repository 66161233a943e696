"""The rules reasoner's rollback (issue 40): planned with the revisions the evidence shows,
both ends named exactly, and not planned (a person decides) where the evidence cannot name
them, forbids the rollback, or shows the rollout paused."""

from __future__ import annotations

import dataclasses

import pytest
from flotilla_evidence.model import RevisionFacts
from flotilla_reasoning import Action, ReasoningFailed, RulesReasoner, ServiceView, Topology

from tests.unit.services.test_reasoner_rules import demo_topology, evidence

RUNNING = RevisionFacts("3", "7c9f5d8b46", ("checkout-api=shop/checkout:1.5", "envoy=envoy:1.30"))
CANDIDATE = RevisionFacts("2", "66b7f4d9c8", ("checkout-api=shop/checkout:1.4", "envoy=envoy:1.30"))
# how the Kubernetes evidence describes those two revisions
RUNNING_TEXT = "shop/checkout:1.5,envoy:1.30 (revision 3)"
CANDIDATE_TEXT = "shop/checkout:1.4,envoy:1.30 (revision 2)"


def on_kubernetes(healthy: str | None = CANDIDATE_TEXT, **changes: object) -> Topology:
    """The demo with checkout-api's latency its own (payments is fine), on a new revision."""
    topology = demo_topology(payments_ms=36.0)
    checkout: ServiceView = dataclasses.replace(
        topology.services["checkout-api"],
        revision=RUNNING_TEXT,
        previous_revision=CANDIDATE_TEXT,
        running=RUNNING,
        rollback_candidate=CANDIDATE,
        paused=False,
    )
    checkout = dataclasses.replace(checkout, **changes)  # type: ignore[arg-type]
    healthy_revisions = {} if healthy is None else {"checkout-api": healthy}
    return dataclasses.replace(
        topology, services={**topology.services, "checkout-api": checkout}, healthy_revisions=healthy_revisions
    )


def plan(topology: Topology) -> list[tuple[Action, dict[str, object]]]:
    reasoner = RulesReasoner()
    diagnosis = reasoner.diagnose(evidence(topology, may_request_more=False))
    assert diagnosis.cause_category == "bad-deployment"
    proposal = reasoner.propose(dataclasses.replace(diagnosis, event_id="e-1"), topology)
    return [(s.action, dict(s.params)) for s in proposal.steps]


def refusal(topology: Topology) -> str:
    with pytest.raises(ReasoningFailed) as refused:
        plan(topology)
    return str(refused.value)


def test_the_rollback_names_the_running_revision_and_the_healthy_one_exactly() -> None:
    assert plan(on_kubernetes()) == [
        (
            Action.ROLLBACK,
            {
                "toRevision": "2",
                "fromRevision": "3",
                "fromTemplateHash": "7c9f5d8b46",
                "toTemplateHash": "66b7f4d9c8",
                "fromImages": ["checkout-api=shop/checkout:1.5", "envoy=envoy:1.30"],
                "toImages": ["checkout-api=shop/checkout:1.4", "envoy=envoy:1.30"],
            },
        )
    ]


def test_without_a_healthy_revision_on_record_the_one_before_is_the_target() -> None:
    """The agent never saw it healthy (a restart): the revision before the running one."""
    topology = on_kubernetes(healthy=None)
    # the diagnosis needs another reason to suspect the deploy: the reasoner says capacity
    # without one, so the plan is asked for a bad-deployment diagnosis directly
    reasoner = RulesReasoner()
    diagnosis = reasoner.diagnose(evidence(on_kubernetes(), may_request_more=False))
    proposal = reasoner.propose(dataclasses.replace(diagnosis, event_id="e-1"), topology)
    [step] = proposal.steps
    assert (step.params["toRevision"], step.params["fromRevision"]) == ("2", "3")
    assert "ran before the running one" in proposal.reasoning.summary


def test_a_healthy_revision_older_than_the_candidate_is_not_guessed_at() -> None:
    """It last ran healthy on revision 1; the evidence has facts only for revision 2."""
    why = refusal(on_kubernetes(healthy="shop/checkout:1.3,envoy:1.29 (revision 1)"))
    assert "no rollback planned" in why and "revision 1" in why and "a person decides" in why


def test_without_revision_facts_no_rollback_is_planned() -> None:
    assert "no revision facts" in refusal(on_kubernetes(running=None))
    assert f"the revision before it ({CANDIDATE_TEXT})" in refusal(on_kubernetes(rollback_candidate=None))


def test_a_forbidden_rollback_goes_to_a_person_with_the_teams_reason() -> None:
    why = refusal(on_kubernetes(rollback_forbidden="migration 0042 dropped a column"))
    assert why == (
        "checkout-api: no rollback planned: its running release may not be rolled back "
        "(migration 0042 dropped a column); a person decides"
    )


def test_a_paused_rollout_is_left_to_a_person() -> None:
    assert "paused" in refusal(on_kubernetes(paused=True))


def test_the_sim_names_revisions_by_name_without_hashes() -> None:
    sim = on_kubernetes(
        healthy="v41",
        revision="v42",
        previous_revision="v41",
        running=RevisionFacts("v42"),
        rollback_candidate=RevisionFacts("v41"),
    )
    [(action, params)] = plan(sim)
    assert action is Action.ROLLBACK
    assert params == {
        "toRevision": "v41",
        "fromRevision": "v42",
        "fromTemplateHash": None,
        "toTemplateHash": None,
        "fromImages": [],
        "toImages": [],
    }
