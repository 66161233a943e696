"""From a reasoner's plan to the exact commands a proposal carries (pure).

Every command gets a fresh ``commandId`` and the one idempotency key of its step
(:func:`flotilla.commands.idempotency_key`: incident, proposal, action, target, params —
e.g. ``incident-204:<proposal id>:scale:checkout-api:12``), which the policy service checks
before it decides. The digest an approver signs is ``flotilla.digest.command_digest``
over these steps; timestamps are cut to milliseconds first, as Avro's timestamp-millis
carries them, so the digest computed from a decoded record is the same.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from flotilla_reasoning.model import Action, PlannedStep, Proposal, Topology, rollback_params

from flotilla import actions
from flotilla.commands import idempotency_key
from flotilla.digest import command_digest

RESOURCE_KIND = "service"


def to_millis(at: datetime) -> datetime:
    """``at`` as timestamp-millis will carry it (sub-millisecond part dropped)."""
    if at.tzinfo is None:
        raise ValueError("command timestamps must be timezone-aware")
    return at.replace(microsecond=at.microsecond // 1000 * 1000)


class InvalidPlan(ValueError):
    """The reasoner's plan cannot become a proposal (two steps would be one command, or a
    step's params are not its kind's)."""


def with_revision_facts(proposal: Proposal, topology: Topology) -> Proposal:
    """Rollbacks completed from the evidence: the revision a step rolls back from and both
    revisions' hashes and images are facts the agent read, never a reasoner's words.

    A reasoner names only the revision to return to; it must be the rollback candidate the
    evidence shows, and the running release must not forbid a rollback. A step that
    already carries its facts (the rules reasoner copies them) is checked, not rewritten.
    InvalidPlan says why a rollback cannot be proposed.
    """
    steps = []
    for step in proposal.steps:
        if step.action is Action.ROLLBACK:
            step = _rollback_with_facts(step, topology)
        steps.append(step)
    return replace(proposal, steps=tuple(steps))


def _rollback_with_facts(step: PlannedStep, topology: Topology) -> PlannedStep:
    service = topology.services.get(step.service)
    where = f"rollback of {step.service}"
    if service is None:
        raise InvalidPlan(f"{where}: the service is not in the evidence")
    if service.rollback_forbidden:
        raise InvalidPlan(f"{where}: its running release forbids a rollback ({service.rollback_forbidden})")
    if service.paused:
        raise InvalidPlan(f"{where}: its rollout is paused; a rollback waits for someone to resume it")
    running, candidate = service.running, service.rollback_candidate
    if running is None or candidate is None:
        raise InvalidPlan(f"{where}: the evidence does not show the running revision and an earlier one")
    if str(step.params.get("toRevision")) != candidate.revision:
        raise InvalidPlan(
            f"{where}: revision {step.params.get('toRevision')!r} is not the one the evidence shows before "
            f"{running.revision} ({candidate.revision})"
        )
    facts = rollback_params(running, candidate)
    given = {k: v for k, v in step.params.items() if v not in (None, [], ())}
    clashing = sorted(k for k, v in given.items() if k in facts and facts[k] != v)
    if clashing:
        raise InvalidPlan(f"{where}: {', '.join(clashing)} differ from the evidence")
    return replace(step, params=facts)


def command_record(
    step: PlannedStep,
    *,
    incident_id: str,
    proposal_id: str,
    issued_at: datetime,
    ttl: timedelta,
) -> dict[str, Any]:
    """One step as the command record a proposal carries (and policy later authorizes)."""
    issued = to_millis(issued_at)
    spec = actions.by_action(step.action)
    problems = spec.problems(step.params)
    if problems:
        raise InvalidPlan(f"{spec.action} of {step.service}: " + "; ".join(problems))
    record: dict[str, Any] = {
        "commandId": str(uuid.uuid4()),
        "incidentId": incident_id,
        "proposalId": proposal_id,
        "target": {"kind": RESOURCE_KIND, "environment": step.environment, "name": step.service},
        **spec.params_of(step.params),  # every own field, so the digest sees what Avro will carry
        "issuedAt": issued,
        "expiresAt": issued + ttl,
    }
    return {"idempotencyKey": idempotency_key(spec.kind, record), **record}


def proposal_value(
    proposal: Proposal,
    *,
    proposal_id: str,
    proposed_by: str,
    now: datetime,
    ttl: timedelta,
) -> dict[str, Any]:
    """The RecoveryProposed value (eventId and attestation are added when it is emitted)."""
    steps = [
        command_record(step, incident_id=proposal.incident_id, proposal_id=proposal_id, issued_at=now, ttl=ttl)
        for step in proposal.steps
    ]
    keys = [s["idempotencyKey"] for s in steps]
    if len(set(keys)) != len(keys):
        raise InvalidPlan(f"two steps of the plan are the same command: {keys}")
    return {
        "incidentId": proposal.incident_id,
        "proposalId": proposal_id,
        "proposedBy": proposed_by,
        "diagnosisEventId": proposal.diagnosis_event_id,
        "steps": steps,
        "digest": command_digest(steps),
        "reasoning": proposal.reasoning.to_record().to_value(),
        "proposedAt": to_millis(now),
    }


def digest_matches(value: Mapping[str, Any]) -> bool:
    """Whether a (decoded) RecoveryProposed's digest is the digest of its steps."""
    steps: Sequence[Mapping[str, Any]] = value["steps"]
    return bool(value["digest"] == command_digest(steps))
