"""One labelled case of the evaluation suite, as plain immutable values.

A :class:`Scenario` is what an agent would see at one decision point (the incident's
service, environment and symptom, and the estate's topology with its history) and what
honest experts would accept as the answer: a set of diagnoses and a set of plans, plus
the plans that would do harm. The YAML form is read by :mod:`flotilla_eval.fixtures`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from flotilla_reasoning import Action, Diagnosis, DiagnosticEvidence, PlannedStep, Verdict

DIFFICULTIES = ("easy", "medium", "hard")
KINDS = (
    "slow-dependency",
    "capacity",
    "bad-deployment",
    "configuration",
    "external",
    "noisy-neighbour",
    "needs-evidence",
    "no-action",
)
ADVERSARIAL = "adversarial"
TAGS = (*DIFFICULTIES, *KINDS, ADVERSARIAL)


class Stage(enum.StrEnum):
    """Which decisions a case asks for."""

    DIAGNOSE = "diagnose"  # diagnose the evidence, then plan for that diagnosis
    PROPOSE = "propose"  # plan for the diagnosis the case gives (its summary may lie)


@dataclass(frozen=True)
class ExpectedDiagnosis:
    """One acceptable diagnosis: a verdict, and the dependency or the cause where it says one."""

    verdict: Verdict
    dependency: str | None = None  # dependency-failure: the suspect
    cause: str | None = None  # concluded: the cause category (None: any)

    def matches(self, diagnosis: Diagnosis) -> bool:
        if diagnosis.verdict is not self.verdict:
            return False
        if self.verdict is Verdict.DEPENDENCY_FAILURE:
            return diagnosis.suspected_dependency == self.dependency
        if self.verdict is Verdict.CONCLUDED and self.cause is not None:
            return diagnosis.cause_category == self.cause
        return True

    def describe(self) -> str:
        detail = self.dependency or self.cause
        return f"{self.verdict.value}({detail})" if detail else self.verdict.value


ANY_ACTION = "any"
NO_ACTION = "none"


@dataclass(frozen=True)
class ActionRule:
    """A class of plan steps: an action (or ``any``) on a service (or any service), with
    optional bounds on the parameters. ``none`` is the empty plan: no action, a person decides."""

    action: str  # an Action value, "any" or "none"
    service: str | None = None
    replicas: tuple[int, int] | None = None  # inclusive bounds
    rolling: bool | None = None
    to_revision: str | None = None
    dependency: str | None = None
    to_target: str | None = None

    @property
    def is_none(self) -> bool:
        return self.action == NO_ACTION

    def matches(self, step: PlannedStep) -> bool:
        if self.is_none:
            return False
        if self.action != ANY_ACTION and step.action is not Action(self.action):
            return False
        if self.service is not None and step.service != self.service:
            return False
        params = step.params
        if self.replicas is not None:
            replicas = params.get("replicas")
            if not isinstance(replicas, int) or not self.replicas[0] <= replicas <= self.replicas[1]:
                return False
        wanted = {
            "rolling": self.rolling,
            "toRevision": self.to_revision,
            "dependency": self.dependency,
            "toTarget": self.to_target,
        }
        return all(value is None or params.get(name) == value for name, value in wanted.items())


@dataclass(frozen=True)
class Scenario:
    """A labelled case: the evidence, the decision asked for, and what is acceptable."""

    id: str
    title: str
    tags: tuple[str, ...]
    evidence: DiagnosticEvidence
    acceptable: tuple[ActionRule, ...]
    harmful: tuple[ActionRule, ...]
    stage: Stage = Stage.DIAGNOSE
    expected_diagnoses: tuple[ExpectedDiagnosis, ...] = ()
    given_diagnosis: Diagnosis | None = None  # Stage.PROPOSE only
    why: str = ""
    path: Path | None = None

    @property
    def difficulty(self) -> str:
        return next(t for t in self.tags if t in DIFFICULTIES)

    @property
    def kind(self) -> str:
        return next(t for t in self.tags if t in KINDS)

    @property
    def adversarial(self) -> bool:
        return ADVERSARIAL in self.tags

    @property
    def no_action_acceptable(self) -> bool:
        return any(rule.is_none for rule in self.acceptable)
