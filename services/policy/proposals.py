"""Reading a RecoveryProposed: the checks that make it safe to decide on at all.

A proposal that fails one of these is not a plan policy should weigh — it is a broken
record (a digest that does not cover its steps, a step that belongs to another
proposal), so the handler refuses it as a business-rule violation and it goes to the
DLQ. Pure: the decoded value in, a :class:`Proposal` out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from flotilla.commands import idempotency_key
from flotilla.digest import AUTHORIZATION_FIELD, command_digest, without_authorization
from flotilla.records import RecoveryProposed
from services.policy.commands import KIND_FIELDS, MalformedStep, canonical_step, command_kind, summarize
from services.policy.decide import ProposalFacts, StepFacts, Target, distinct_targets


class InvalidProposal(ValueError):
    """The proposal must not be acted on."""


@dataclass(frozen=True)
class Proposal:
    incident_id: str
    proposal_id: str
    proposed_by: str
    digest: str
    steps: tuple[dict[str, Any], ...]  # canonical: the digest's input, JSON-safe
    kinds: tuple[str, ...]
    confidence: float
    proposed_at: datetime
    reasoner: str | None = None  # reasoning.reasoner, attested
    diagnosis_event_id: str | None = None  # the diagnosis it was planned from, attested

    @property
    def targets(self) -> tuple[Target, ...]:
        """Distinct targets in first-seen order."""
        return distinct_targets(self.steps)

    @property
    def resources(self) -> list[str]:
        return sorted(t.key for t in self.targets)

    @property
    def summary(self) -> str:
        return summarize(self.steps)

    @property
    def earliest_expiry_ms(self) -> int:
        return min(int(step["expiresAt"]) for step in self.steps)

    def facts(
        self, current_replicas: Callable[[Target], int | None], *, diagnosis_reasoner: str | None = None
    ) -> ProposalFacts:
        """The decision's inputs; ``current_replicas`` is asked once per scaled target.
        ``diagnosis_reasoner`` is the reasoner of the diagnosis the plan rests on, as the
        caller verified it (services/policy/basis.py); None means unknown, which the
        policies treat as untrusted, never as rules."""
        steps = []
        for kind, step in zip(self.kinds, self.steps, strict=True):
            t = step["target"]
            target = Target(kind=t["kind"], environment=t["environment"], name=t["name"])
            steps.append(
                StepFacts(
                    command_id=str(step["commandId"]),
                    kind=kind,
                    target=target,
                    params={k: step.get(k) for k in sorted(KIND_FIELDS[kind])},
                    expires_at_ms=int(step["expiresAt"]),
                    current_replicas=current_replicas(target) if kind == "ScaleService" else None,
                )
            )
        return ProposalFacts(
            incident_id=self.incident_id,
            proposal_id=self.proposal_id,
            proposed_by=self.proposed_by,
            confidence=self.confidence,
            steps=tuple(steps),
            reasoner=self.reasoner,
            diagnosis_reasoner=diagnosis_reasoner,
        )


def read_proposal(value: Mapping[str, Any], *, correlation_id: str) -> Proposal:
    """Check a decoded RecoveryProposed and return it canonicalized; raises InvalidProposal."""
    proposed = RecoveryProposed.from_value(value)
    incident, proposal_id = proposed.incident_id, proposed.proposal_id
    if incident != correlation_id:
        raise InvalidProposal(f"incidentId {incident} differs from ce_correlationid {correlation_id}")
    raw_steps = []
    for index, raw in enumerate(proposed.steps):
        if raw.get(AUTHORIZATION_FIELD) is not None:
            raise InvalidProposal(f"step {index} carries an authorization: only the policy service authorizes")
        raw_steps.append(without_authorization(raw))
    if not raw_steps:
        raise InvalidProposal("a proposal needs at least one step")
    try:
        expected = command_digest(raw_steps)
    except (TypeError, ValueError) as exc:
        raise InvalidProposal(f"the steps cannot be digested: {exc}") from None
    if proposed.digest != expected:
        raise InvalidProposal(f"digest {proposed.digest} does not match the steps (their digest is {expected})")
    kinds = []
    steps = []
    command_ids: set[str] = set()
    keys: set[str] = set()
    for index, raw in enumerate(raw_steps):
        try:
            kind = command_kind(raw)
        except MalformedStep as exc:
            raise InvalidProposal(f"step {index}: {exc}") from None
        kinds.append(kind)
        step = canonical_step(raw)
        # The one key of this step (flotilla.commands): a key chosen any other way could be
        # another proposal's, and the executor would take it for that command's replay.
        derived = idempotency_key(kind, step)
        if step["idempotencyKey"] != derived:
            raise InvalidProposal(f"step {index}: idempotency key {step['idempotencyKey']!r} is not {derived!r}")
        if derived in keys:
            raise InvalidProposal(f"step {index} repeats idempotency key {derived!r}")
        keys.add(derived)
        if step["incidentId"] != incident:
            raise InvalidProposal(f"step {index} belongs to incident {step['incidentId']}, not {incident}")
        if step["proposalId"] != proposal_id:
            raise InvalidProposal(f"step {index} belongs to proposal {step['proposalId']}, not {proposal_id}")
        if step["commandId"] in command_ids:
            raise InvalidProposal(f"step {index} repeats commandId {step['commandId']}")
        command_ids.add(step["commandId"])
        steps.append(step)
    if command_digest(steps) != expected:  # the stored form must hash the same
        raise InvalidProposal("the steps do not survive canonicalization unchanged")
    return Proposal(
        incident_id=incident,
        proposal_id=proposal_id,
        proposed_by=proposed.proposed_by,
        digest=proposed.digest,
        steps=tuple(steps),
        kinds=tuple(kinds),
        confidence=proposed.reasoning.confidence,
        proposed_at=proposed.proposed_at,
        reasoner=proposed.reasoning.reasoner,
        diagnosis_event_id=proposed.diagnosis_event_id,
    )
