"""Deciding on a recovery plan with the Cedar policies kept in ``infra/policies``.

Cedar answers allow or deny; Flotilla needs three answers per step — run it now, run it
once a person approves, never run it. The policies encode the middle answer as *guards*:
``forbid ... unless { context.humanApproved }``. Each step is asked twice:

1. with ``humanApproved = false`` — allowed: **auto-authorize** (reasons: the permits);
2. with ``humanApproved = true`` — allowed: **require a person** (reasons: the guards
   that forbade step 1); still denied: **deny** (reasons: the forbids that remain — hard
   limits — or "no policy permits it").

A plan is as strict as its strictest step (deny > human > auto). Nothing here touches a
database, a clock or the network: facts in, decision out, so the table of cases in the
unit tests is the specification. Evaluation errors fail closed: a request Cedar cannot
evaluate is a denial that names the error, never an allow by omission.
"""

from __future__ import annotations

import enum
import json
import math
import string
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cedarpy

from flotilla import actions, project_path
from services.policy.commands import KIND_FIELDS

POLICY_DIR_VARIABLE = "FLOTILLA_POLICY_DIR"
SCHEMA_FILE = "flotilla.cedarschema"

NO_PERMIT = "no-permitting-policy"  # not a Cedar policy: the default deny, named
EVALUATION_ERROR = "policy-evaluation-error"  # not a Cedar policy: a fail-closed error


class Outcome(enum.StrEnum):
    AUTO = "auto"  # authorize now, no person
    HUMAN = "human"  # authorize once a person approves the exact digest
    DENY = "deny"  # never authorize

    @property
    def severity(self) -> int:
        return _SEVERITY[self]

    @property
    def verb(self) -> str:
        """What the policy service would do: used in dry-run reasons."""
        return _VERBS[self]


_SEVERITY = {Outcome.AUTO: 0, Outcome.HUMAN: 1, Outcome.DENY: 2}
_VERBS = {Outcome.AUTO: "auto-authorize", Outcome.HUMAN: "require human approval", Outcome.DENY: "deny"}


@dataclass(frozen=True)
class Target:
    """A ResourceRef."""

    kind: str
    environment: str
    name: str

    @property
    def key(self) -> str:
        return f"{self.environment}/{self.name}"

    def entity(self) -> dict[str, Any]:
        return {
            "uid": {"type": "Service", "id": self.key},
            "attrs": {"kind": self.kind, "environment": self.environment, "name": self.name},
            "parents": [],
        }


def distinct_targets(steps: Sequence[Mapping[str, Any]]) -> tuple[Target, ...]:
    """The steps' targets (ResourceRef dicts), each once, in first-seen order."""
    seen: dict[str, Target] = {}
    for step in steps:
        t = step["target"]
        target = Target(kind=t["kind"], environment=t["environment"], name=t["name"])
        seen.setdefault(target.key, target)
    return tuple(seen.values())


@dataclass(frozen=True)
class StepFacts:
    """What policy may look at for one step: the command, plus the running replicas."""

    command_id: str
    kind: str  # a command kind of flotilla.actions, e.g. ScaleService
    target: Target
    params: Mapping[str, Any]  # the kind's own fields, e.g. {"replicas": 12}
    expires_at_ms: int
    current_replicas: int | None = None  # ScaleService only, from the inventory

    def to_json(self) -> dict[str, Any]:
        return {
            "commandId": self.command_id,
            "kind": self.kind,
            "target": {"kind": self.target.kind, "environment": self.target.environment, "name": self.target.name},
            "params": dict(self.params),
            "expiresAtMs": self.expires_at_ms,
            "currentReplicas": self.current_replicas,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StepFacts:
        return cls(
            command_id=str(data["commandId"]),
            kind=str(data["kind"]),
            target=Target(**data["target"]),
            params=dict(data["params"]),
            expires_at_ms=int(data["expiresAtMs"]),
            current_replicas=None if data.get("currentReplicas") is None else int(data["currentReplicas"]),
        )


@dataclass(frozen=True)
class ProposalFacts:
    """Everything a decision rests on; stored with the decision so an approval can re-check it."""

    incident_id: str
    proposal_id: str
    proposed_by: str
    confidence: float
    steps: tuple[StepFacts, ...]
    # reasoning.reasoner ("rules", "llm"), covered by the attestation like the confidence
    reasoner: str | None = None
    # reasoning.reasoner of the diagnosis the plan rests on, from the diagnostic agent's
    # signed record this service verified (services/policy/basis.py), never the proposal's
    # word. None: not known (facts stored before it was kept), which a guard reads as untrusted.
    diagnosis_reasoner: str | None = None

    @property
    def services(self) -> int:
        """Distinct resources the plan touches: its blast radius."""
        return len({s.target.key for s in self.steps})

    @property
    def confidence_pct(self) -> int:
        if math.isnan(self.confidence):
            return 0
        return max(0, min(100, math.floor(self.confidence * 100 + 1e-9)))

    def to_json(self) -> dict[str, Any]:
        return {
            "incidentId": self.incident_id,
            "proposalId": self.proposal_id,
            "proposedBy": self.proposed_by,
            "confidence": self.confidence,
            "steps": [s.to_json() for s in self.steps],
            "reasoner": self.reasoner,
            "diagnosisReasoner": self.diagnosis_reasoner,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProposalFacts:
        return cls(
            incident_id=str(data["incidentId"]),
            proposal_id=str(data["proposalId"]),
            proposed_by=str(data["proposedBy"]),
            confidence=float(data["confidence"]),
            steps=tuple(StepFacts.from_json(s) for s in data["steps"]),
            reasoner=None if data.get("reasoner") is None else str(data["reasoner"]),
            diagnosis_reasoner=None if data.get("diagnosisReasoner") is None else str(data["diagnosisReasoner"]),
        )


@dataclass(frozen=True)
class Finding:
    """A policy that decided something, and its reason rendered for this step."""

    policy_id: str
    reason: str


@dataclass(frozen=True)
class StepDecision:
    command_id: str
    kind: str
    target: str  # <environment>/<name>
    outcome: Outcome
    findings: tuple[Finding, ...]


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


@dataclass(frozen=True)
class Decision:
    """The plan's outcome and, per step, which policies led to it."""

    outcome: Outcome
    steps: tuple[StepDecision, ...]

    @property
    def deciding_steps(self) -> tuple[StepDecision, ...]:
        """The steps whose outcome is the plan's: their findings explain the decision."""
        return tuple(s for s in self.steps if s.outcome is self.outcome)

    @property
    def policy_ids(self) -> list[str]:
        return _unique(f.policy_id for s in self.deciding_steps for f in s.findings)

    @property
    def reasons(self) -> list[str]:
        return _unique(f.reason for s in self.deciding_steps for f in s.findings)

    @property
    def denied_command_id(self) -> str | None:
        """The one refused step when exactly one was refused (CommandDenied.commandId)."""
        denied = [s.command_id for s in self.steps if s.outcome is Outcome.DENY]
        return denied[0] if len(denied) == 1 else None

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome.value,
            "steps": [
                {
                    "commandId": s.command_id,
                    "kind": s.kind,
                    "target": s.target,
                    "outcome": s.outcome.value,
                    "findings": [{"policyId": f.policy_id, "reason": f.reason} for f in s.findings],
                }
                for s in self.steps
            ],
        }


def dry_run_reasons(decision: Decision) -> list[str]:
    """What a dry run reports instead of acting: the would-be decision first."""
    return [f"dry-run: would {decision.outcome.verb}", *decision.reasons]


def plan_outcome(outcomes: Iterable[Outcome]) -> Outcome:
    """A plan is as strict as its strictest step; an empty plan is denied."""
    found = list(outcomes)
    return max(found, key=lambda o: o.severity) if found else Outcome.DENY


@dataclass(frozen=True)
class PersonCheck:
    """May a person approve (or reject) a proposal: Cedar's answer with its findings."""

    allowed: bool
    findings: tuple[Finding, ...]

    @property
    def policy_ids(self) -> list[str]:
        return _unique(f.policy_id for f in self.findings)

    @property
    def reasons(self) -> list[str]:
        return _unique(f.reason for f in self.findings)


class _Blank(dict[str, str]):
    """format_map mapping that renders unknown placeholders as ``?``."""

    def __missing__(self, key: str) -> str:
        return "?"


class PolicyError(ValueError):
    """The policy files cannot be loaded: parse or type errors, missing annotations."""


@dataclass(frozen=True)
class _Policy:
    policy_id: str  # the @id annotation
    reason: str  # the @reason template
    effect: str  # permit | forbid


@dataclass
class PolicyEngine:
    """The Cedar policy set and schema, parsed and validated once; decisions are pure."""

    policies_text: str
    schema_text: str
    _policies: cedarpy.PolicySet = field(init=False, repr=False)
    _schema: cedarpy.Schema = field(init=False, repr=False)
    _by_cedar_id: dict[str, _Policy] = field(init=False, repr=False)
    _forbids: frozenset[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        try:
            self._schema = cedarpy.Schema.from_str(self.schema_text)
            self._policies = cedarpy.PolicySet.from_str(self.policies_text)
            est = json.loads(cedarpy.policies_to_json_str(self.policies_text))
        except ValueError as exc:
            raise PolicyError(f"cannot parse the policies or the schema: {exc}") from exc
        result = cedarpy.validate_policies(self.policies_text, self._schema)
        if not result.validation_passed:
            raise PolicyError("policies do not type-check: " + "; ".join(str(e) for e in result.errors))
        if est.get("templates"):
            raise PolicyError("policy templates are not supported here")
        self._by_cedar_id = {}
        seen: set[str] = set()
        for cedar_id, policy in est["staticPolicies"].items():
            notes = policy.get("annotations") or {}
            policy_id, reason = notes.get("id"), notes.get("reason")
            if not policy_id or not reason:
                raise PolicyError(f"policy {cedar_id} needs both @id and @reason annotations")
            if policy_id in seen:
                raise PolicyError(f"two policies share @id({policy_id!r})")
            seen.add(policy_id)
            self._by_cedar_id[cedar_id] = _Policy(policy_id, reason, policy["effect"])
        self._forbids = frozenset(p.policy_id for p in self._by_cedar_id.values() if p.effect == "forbid")

    @classmethod
    def from_directory(cls, directory: Path | None = None) -> PolicyEngine:
        """Every ``*.cedar`` file of ``directory`` (in name order) and its schema; by default
        ``$FLOTILLA_POLICY_DIR``, else the checkout's ``infra/policies``."""
        directory = directory or project_path(POLICY_DIR_VARIABLE, "infra/policies")
        files = sorted(directory.glob("*.cedar"))
        if not files:
            raise PolicyError(f"no *.cedar files in {directory}")
        text = "\n".join(f"// ---- {p.name}\n{p.read_text()}" for p in files)
        return cls(text, (directory / SCHEMA_FILE).read_text())

    @property
    def policy_ids(self) -> list[str]:
        return [p.policy_id for p in self._by_cedar_id.values()]

    # ------------------------------------------------------------------ steps

    def decide(self, facts: ProposalFacts, now_ms: int, *, human_approved: bool = False) -> Decision:
        """Auto, human or deny for the plan, with the findings of every step.

        With ``human_approved=True`` the question is "may it run now that a person has
        approved it": the answer is AUTO (yes) or DENY, never HUMAN.
        """
        steps = tuple(self._decide_step(facts, step, now_ms, human_approved) for step in facts.steps)
        return Decision(plan_outcome(s.outcome for s in steps), steps)

    def _decide_step(self, facts: ProposalFacts, step: StepFacts, now_ms: int, human_approved: bool) -> StepDecision:
        def verdict(outcome: Outcome, findings: Sequence[Finding]) -> StepDecision:
            return StepDecision(step.command_id, step.kind, step.target.key, outcome, tuple(findings))

        values = _placeholders(facts, step)
        if step.kind not in KIND_FIELDS:
            return verdict(Outcome.DENY, [Finding(EVALUATION_ERROR, f"unknown command kind {step.kind}")])
        first = self._ask_step(facts, step, now_ms, human_approved, values)
        if first.allowed:
            return verdict(Outcome.AUTO, first.findings)
        if human_approved or first.errored:
            return verdict(Outcome.DENY, first.findings or self._no_permit(facts, step))
        second = self._ask_step(facts, step, now_ms, True, values)
        if second.allowed:
            guards = first.findings or (Finding(NO_PERMIT, "no policy permits it without a person"),)
            return verdict(Outcome.HUMAN, guards)
        return verdict(Outcome.DENY, second.findings or self._no_permit(facts, step))

    @staticmethod
    def _no_permit(facts: ProposalFacts, step: StepFacts) -> tuple[Finding, ...]:
        reason = f"no policy permits {facts.proposed_by} to run {step.kind} on {step.target.key}"
        return (Finding(NO_PERMIT, reason),)

    def _ask_step(
        self, facts: ProposalFacts, step: StepFacts, now_ms: int, human_approved: bool, values: Mapping[str, str]
    ) -> _Answer:
        spec = actions.by_kind(step.kind)
        context: dict[str, Any] = {
            "humanApproved": human_approved,
            "plan": {
                "steps": len(facts.steps),
                "services": facts.services,
                "confidencePct": facts.confidence_pct,
                **({} if facts.reasoner is None else {"reasoner": facts.reasoner}),
                **({} if facts.diagnosis_reasoner is None else {"diagnosisReasoner": facts.diagnosis_reasoner}),
            },
            "secondsToExpiry": (step.expires_at_ms - now_ms) // 1000,
            **spec.cedar(spec.params_of(step.params)),
        }
        if step.kind == "ScaleService" and step.current_replicas is not None:
            context["currentReplicas"] = step.current_replicas
        entities = [
            {"uid": {"type": "Agent", "id": facts.proposed_by}, "attrs": {"name": facts.proposed_by}, "parents": []},
            step.target.entity(),
        ]
        request = {
            "principal": {"type": "Agent", "id": facts.proposed_by},
            "action": {"type": "Action", "id": step.kind},
            "resource": {"type": "Service", "id": step.target.key},
            "context": context,
        }
        return self._ask(request, entities, values)

    # ----------------------------------------------------------------- people

    def check_person(
        self,
        *,
        user: str,
        roles: Iterable[str],
        action: str,
        targets: Sequence[Target],
        proposed_by: str,
    ) -> PersonCheck:
        """May ``user`` Approve/Reject a proposal touching ``targets``? Asked per target;
        every one must allow."""
        if action not in ("Approve", "Reject"):
            raise ValueError(f"not a person's action: {action}")
        role_list = sorted(set(roles))
        values = _Blank(user=user, proposedBy=proposed_by)
        allowed = bool(targets)
        findings: list[Finding] = []
        for target in targets:
            entities: list[dict[str, Any]] = [
                {
                    "uid": {"type": "User", "id": user},
                    "attrs": {"name": user},
                    "parents": [{"type": "Role", "id": r} for r in role_list],
                },
                *({"uid": {"type": "Role", "id": r}, "attrs": {}, "parents": []} for r in role_list),
                target.entity(),
            ]
            request = {
                "principal": {"type": "User", "id": user},
                "action": {"type": "Action", "id": action},
                "resource": {"type": "Service", "id": target.key},
                "context": {"proposedBy": proposed_by},
            }
            answer = self._ask(request, entities, {**values, "service": target.key})
            allowed = allowed and answer.allowed
            findings.extend(answer.findings)
        if not allowed and not any(f.policy_id in self._forbids for f in findings):
            findings.append(Finding(NO_PERMIT, f"{user} holds no role that may {action.lower()} this proposal"))
        return PersonCheck(allowed, tuple(dict.fromkeys(findings)))

    # ------------------------------------------------------------------- cedar

    def _ask(self, request: dict[str, Any], entities: list[dict[str, Any]], values: Mapping[str, str]) -> _Answer:
        try:
            result = cedarpy.is_authorized(request, self._policies, entities, schema=self._schema)
        except Exception as exc:  # fail closed, whatever the binding raises
            return _Answer(False, True, (Finding(EVALUATION_ERROR, f"policy evaluation failed: {exc}"),))
        errors = list(result.diagnostics.errors)
        if errors or (result.decision is not cedarpy.Decision.Allow and result.decision is not cedarpy.Decision.Deny):
            detail = "; ".join(str(e) for e in errors) or f"no decision ({result.decision})"
            return _Answer(False, True, (Finding(EVALUATION_ERROR, f"policy evaluation failed: {detail}"),))
        findings = []
        for cedar_id in result.diagnostics.reasons:
            policy = self._by_cedar_id.get(cedar_id)
            if policy is None:
                findings.append(Finding(cedar_id, f"policy {cedar_id}"))
            else:
                findings.append(Finding(policy.policy_id, _render(policy.reason, values)))
        order = {p.policy_id: i for i, p in enumerate(self._by_cedar_id.values())}
        findings.sort(key=lambda f: order.get(f.policy_id, len(order)))
        return _Answer(result.decision is cedarpy.Decision.Allow, False, tuple(findings))


@dataclass(frozen=True)
class _Answer:
    allowed: bool
    errored: bool
    findings: tuple[Finding, ...]


def _render(template: str, values: Mapping[str, str]) -> str:
    try:
        return string.Formatter().vformat(template, (), _Blank(values))
    except (ValueError, IndexError, AttributeError):
        return template  # a malformed template is shown as written, never fatal


def _placeholders(facts: ProposalFacts, step: StepFacts) -> _Blank:
    values = _Blank(
        service=step.target.key,
        environment=step.target.environment,
        name=step.target.name,
        kind=step.target.kind,
        commandId=step.command_id,
        proposedBy=facts.proposed_by,
        planServices=str(facts.services),
        planSteps=str(len(facts.steps)),
        confidence=f"{facts.confidence:.2f}",
        reasoner=facts.reasoner or "unknown",
        diagnosisReasoner=facts.diagnosis_reasoner or "unknown",
    )
    for key, value in step.params.items():
        values[key] = str(value).lower() if isinstance(value, bool) else str(value)
    if step.current_replicas is not None:
        values["currentReplicas"] = str(step.current_replicas)
    return values
