"""Running one case through a reasoner, as the two agents would, and scoring it.

A case is one decision point. Its diagnosis is the reasoner's answer to the recorded
evidence (or, for a propose-stage case, the diagnosis the case gives); unless that
asks for more evidence, the reasoner then plans for it against the same topology, and
the plan is put to the policy (:mod:`flotilla_eval.policy`). Nothing the reasoner does
stops the run: a failure — a model server that does not answer, answers rejected twice,
any exception — is that case's result, scored as no decision, with its error class.

What each decision cost: tokens from the Diagnosis/Proposal (or the failure's ``usage``),
attempts from the reasoner's ``last_attempts`` (the LLM reasoner's count of answers it
asked for; 1 where a reasoner does not say) or the failure's ``attempts``, and the wall
clock of the reasoner's calls (the policy check is not counted).
"""

from __future__ import annotations

import dataclasses
import enum
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from flotilla_reasoning import Diagnosis, PlannedStep, Proposal, Reasoner, ReasoningFailed, TokenUsage, Verdict

from flotilla_eval.policy import PolicyCheck, PolicyVerdict
from flotilla_eval.scenario import Scenario, Stage
from flotilla_eval.scoring import ActionClass, action_right, adversarial_pass, classify_plan, diagnosis_correct

T = TypeVar("T")

# Diagnosis event ids are derived from the case id, so a rerun sends the same prompt.
EVENT_NAMESPACE = uuid.UUID("5b0f8a52-3d6e-4f6b-9a51-2c7e6a1d0e30")


class Status(enum.StrEnum):
    DECIDED = "decided"  # a decision came back
    DECLINED = "declined"  # the reasoner chose not to decide (a person decides): a valid answer
    REJECTED = "rejected"  # its answers failed validation, the retry included
    ERROR = "error"  # it could not answer at all (server unreachable, an exception)


@dataclass(frozen=True)
class Decision:
    """One question put to the reasoner and how it went."""

    step: str  # diagnose | propose
    status: Status
    attempts: int
    usage: TokenUsage = dataclasses.field(default_factory=TokenUsage)
    error_class: str | None = None
    message: str | None = None

    @property
    def valid(self) -> bool:
        return self.status in (Status.DECIDED, Status.DECLINED)


@dataclass(frozen=True)
class CaseResult:
    """One case's outcome: what was decided and how it scores."""

    id: str
    tags: tuple[str, ...]
    diagnosis: str | None
    diagnosis_correct: bool | None  # None: a propose-stage case scores no diagnosis
    plan: tuple[str, ...]
    action: ActionClass
    action_right: bool
    policy: str | None  # auto | human | deny | invalid; None without a plan
    policy_reasons: tuple[str, ...]
    decisions: tuple[Decision, ...]
    latency_ms: float
    adversarial_pass: bool | None  # None: not an adversarial case

    @property
    def valid_first_try(self) -> bool:
        return all(d.valid and d.attempts <= 1 for d in self.decisions)

    @property
    def valid_after_retry(self) -> bool:
        return all(d.valid for d in self.decisions)

    @property
    def tokens(self) -> TokenUsage:
        return sum((d.usage for d in self.decisions), TokenUsage())

    @property
    def error_class(self) -> str | None:
        return next((d.error_class for d in self.decisions if d.error_class), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "tags": list(self.tags),
            "diagnosis": self.diagnosis,
            "diagnosisCorrect": self.diagnosis_correct,
            "plan": list(self.plan),
            "action": self.action.value,
            "actionRight": self.action_right,
            "policy": self.policy,
            "policyReasons": list(self.policy_reasons),
            "validFirstTry": self.valid_first_try,
            "validAfterRetry": self.valid_after_retry,
            "promptTokens": self.tokens.prompt_tokens,
            "completionTokens": self.tokens.completion_tokens,
            "latencyMs": round(self.latency_ms, 1),
            "adversarialPass": self.adversarial_pass,
            "errorClass": self.error_class,
            "decisions": [
                {
                    "step": d.step,
                    "status": d.status.value,
                    "attempts": d.attempts,
                    "errorClass": d.error_class,
                    "message": d.message,
                }
                for d in self.decisions
            ],
        }


def diagnosis_event_id(scenario_id: str) -> str:
    """The event id a case's diagnosis carries into the propose step (a model must copy it)."""
    return str(uuid.uuid5(EVENT_NAMESPACE, scenario_id))


def describe_diagnosis(diagnosis: Diagnosis) -> str:
    detail = diagnosis.suspected_dependency or diagnosis.cause_category or diagnosis.job_kind
    return f"{diagnosis.verdict.value}({detail})" if detail else diagnosis.verdict.value


def describe_step(step: PlannedStep) -> str:
    """``scale checkout-api replicas=12``: the action, its target and its parameters."""
    params = " ".join(f"{k}={v}" for k, v in sorted(step.params.items()))
    return f"{step.action.value} {step.environment}/{step.service} {params}".rstrip()


def _ask(reasoner: Reasoner, step: str, question: Callable[[], T]) -> tuple[T | None, Decision]:
    try:
        answer = question()
    except ReasoningFailed as failure:
        cause = failure.__cause__
        if cause is not None:
            status, error = Status.ERROR, type(cause).__name__
        elif failure.attempts == 0:
            status, error = Status.DECLINED, None
        else:
            status, error = Status.REJECTED, type(failure).__name__
        return None, Decision(step, status, failure.attempts, failure.usage, error, failure.reason[:300])
    except Exception as exc:  # any failure is this case's result, never the run's end
        return None, Decision(step, Status.ERROR, 0, TokenUsage(), type(exc).__name__, str(exc)[:300])
    attempts = int(getattr(reasoner, "last_attempts", 1))
    usage = answer.reasoning.usage if isinstance(answer, Diagnosis | Proposal) else TokenUsage()
    return answer, Decision(step, Status.DECIDED, attempts, usage)


def run_case(scenario: Scenario, reasoner: Reasoner, policy: PolicyCheck) -> CaseResult:
    evidence = scenario.evidence
    decisions: list[Decision] = []
    started = time.perf_counter()
    if scenario.stage is Stage.PROPOSE:
        diagnosis = scenario.given_diagnosis
    else:
        diagnosis, asked = _ask(reasoner, "diagnose", lambda: reasoner.diagnose(evidence))
        decisions.append(asked)
    proposal: Proposal | None = None
    if diagnosis is not None and diagnosis.verdict is not Verdict.NEEDS_EVIDENCE:
        to_plan = dataclasses.replace(diagnosis, event_id=diagnosis_event_id(scenario.id))
        proposal, asked = _ask(reasoner, "propose", lambda: reasoner.propose(to_plan, evidence.topology))
        decisions.append(asked)
    latency_ms = (time.perf_counter() - started) * 1000
    steps = proposal.steps if proposal is not None else ()
    verdict: PolicyVerdict | None = None
    if proposal is not None and diagnosis is not None:
        verdict = policy.judge(proposal, evidence.topology, diagnosis_reasoner=diagnosis.reasoning.reasoner)
    action = classify_plan(scenario, steps, verdict)
    return CaseResult(
        id=scenario.id,
        tags=scenario.tags,
        diagnosis=None if diagnosis is None else describe_diagnosis(diagnosis),
        diagnosis_correct=None if scenario.stage is Stage.PROPOSE else diagnosis_correct(scenario, diagnosis),
        plan=tuple(describe_step(s) for s in steps),
        action=action,
        action_right=action_right(scenario, action),
        policy=None if verdict is None else verdict.outcome.value,
        policy_reasons=() if verdict is None else verdict.reasons,
        decisions=tuple(decisions),
        latency_ms=latency_ms,
        adversarial_pass=adversarial_pass(action) if scenario.adversarial else None,
    )
