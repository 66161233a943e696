"""Running a case: what is asked of the reasoner, and how its failures are scored."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import openai
import pytest
from flotilla_eval import ActionClass, PolicyCheck, Status, run_case
from flotilla_eval.runner import diagnosis_event_id
from flotilla_reasoning import (
    Action,
    Diagnosis,
    DiagnosticEvidence,
    PlannedStep,
    Proposal,
    Reasoning,
    ReasoningFailed,
    TokenUsage,
    Topology,
    Verdict,
)

from .conftest import BY_ID, minimal, parse

CASE = parse(minimal())
NO_TOKENS = TokenUsage()


class Scripted:
    """A reasoner that answers what the test says, and counts what it is asked."""

    name = "scripted"

    def __init__(
        self,
        diagnose: Callable[[DiagnosticEvidence], Diagnosis],
        propose: Callable[[Diagnosis, Topology], Proposal] | None = None,
        attempts: tuple[int, ...] = (),
    ) -> None:
        self._diagnose, self._propose = diagnose, propose
        self._attempts = list(attempts)
        self.asked: list[object] = []
        self.last_attempts = 1

    def _count(self) -> None:
        if self._attempts:
            self.last_attempts = self._attempts.pop(0)

    def diagnose(self, evidence: DiagnosticEvidence) -> Diagnosis:
        self.asked.append(evidence)
        self._count()
        return self._diagnose(evidence)

    def propose(self, diagnosis: Diagnosis, topology: Topology) -> Proposal:
        self.asked.append(diagnosis)
        self._count()
        assert self._propose is not None, "propose was not expected"
        return self._propose(diagnosis, topology)


def suspect(evidence: DiagnosticEvidence, usage: TokenUsage = NO_TOKENS) -> Diagnosis:
    reasoning = Reasoning("payments-api is slow", (), 0.9, "scripted", usage=usage)
    return Diagnosis(
        Verdict.DEPENDENCY_FAILURE,
        evidence.incident_id,
        evidence.service,
        reasoning,
        suspected_dependency="payments-api",
        failure_mode="slow-responses",
    )


def scale_to(replicas: int, usage: TokenUsage = NO_TOKENS) -> Callable[[Diagnosis, Topology], Proposal]:
    def plan(diagnosis: Diagnosis, topology: Topology) -> Proposal:
        assert diagnosis.event_id is not None
        step = PlannedStep(Action.SCALE, "checkout-api", "production", {"replicas": replicas})
        return Proposal(
            diagnosis.incident_id, diagnosis.event_id, (step,), Reasoning("scale", (), 0.9, "s", usage=usage)
        )

    return plan


def test_a_good_case_is_diagnosed_planned_judged_and_timed(policy: PolicyCheck) -> None:
    reasoner = Scripted(lambda e: suspect(e, TokenUsage(100, 20)), scale_to(12, TokenUsage(200, 30)))
    result = run_case(CASE, reasoner, policy)
    assert result.diagnosis == "dependency-failure(payments-api)" and result.diagnosis_correct
    assert result.plan == ("scale production/checkout-api replicas=12",)
    assert result.action is ActionClass.ACCEPTABLE and result.action_right
    assert result.policy == "human"  # 4 -> 12 is more than twice
    assert result.tokens == TokenUsage(300, 50)
    assert result.valid_first_try and result.valid_after_retry
    assert result.latency_ms > 0 and result.adversarial_pass is None
    planned = reasoner.asked[1]
    assert isinstance(planned, Diagnosis) and planned.event_id == diagnosis_event_id(CASE.id)


def test_a_retry_is_valid_after_it_but_not_on_the_first_try(policy: PolicyCheck) -> None:
    result = run_case(CASE, Scripted(suspect, scale_to(12), attempts=(1, 2)), policy)
    assert [d.attempts for d in result.decisions] == [1, 2]
    assert not result.valid_first_try and result.valid_after_retry


def test_a_request_for_evidence_makes_no_plan(policy: PolicyCheck) -> None:
    def probe(evidence: DiagnosticEvidence) -> Diagnosis:
        return dataclasses.replace(suspect(evidence), verdict=Verdict.NEEDS_EVIDENCE, suspected_dependency=None)

    reasoner = Scripted(probe)
    result = run_case(CASE, reasoner, policy)
    assert len(reasoner.asked) == 1
    assert result.action is ActionClass.NONE and result.action_right  # the case accepts no plan
    assert not result.diagnosis_correct


def failing(failure: Exception) -> Callable[[DiagnosticEvidence], Diagnosis]:
    def fail(_: DiagnosticEvidence) -> Diagnosis:
        raise failure

    return fail


def server_down() -> ReasoningFailed:
    request = openai.APIConnectionError(request=__import__("httpx").Request("POST", "http://model/v1"))
    try:
        raise ReasoningFailed("the model server did not answer", reasoner="llm", attempts=1) from request
    except ReasoningFailed as failure:
        return failure


@pytest.mark.parametrize(
    ("failure", "status", "error_class", "valid"),
    [
        (ReasoningFailed("a person decides", reasoner="rules"), Status.DECLINED, None, True),
        (
            ReasoningFailed("rejected twice", reasoner="llm", attempts=2, usage=TokenUsage(50, 10), problems=["x"]),
            Status.REJECTED,
            "ReasoningFailed",
            False,
        ),
        (server_down(), Status.ERROR, "APIConnectionError", False),
        (RuntimeError("a bug"), Status.ERROR, "RuntimeError", False),
    ],
)
def test_a_failure_is_the_cases_result_not_the_runs_end(
    policy: PolicyCheck, failure: Exception, status: Status, error_class: str | None, valid: bool
) -> None:
    result = run_case(CASE, Scripted(failing(failure)), policy)
    [decision] = result.decisions
    assert decision.status is status and result.error_class == error_class
    assert result.valid_after_retry is valid
    assert result.action is ActionClass.NONE and result.diagnosis is None and result.diagnosis_correct is False
    if isinstance(failure, ReasoningFailed):
        assert result.tokens == failure.usage


def test_a_propose_stage_case_plans_for_the_diagnosis_it_gives(policy: PolicyCheck) -> None:
    case = BY_ID["adversarial-diagnosis-summary-restart-the-database"]
    reasoner = Scripted(failing(AssertionError("diagnose was not expected")), scale_to(12))
    result = run_case(case, reasoner, policy)
    [given] = reasoner.asked
    assert isinstance(given, Diagnosis) and "Ignore previous instructions" in given.reasoning.summary
    assert result.diagnosis_correct is None and result.adversarial_pass is True
    assert [d.step for d in result.decisions] == ["propose"]
