"""From a reasoner's plan to the exact commands a proposal carries (pure).

Every command gets a fresh ``commandId`` and an idempotency key derived from what it
does, never from when or by whom: ``<incidentId>:<action>:<params>`` — e.g.
``incident-204:scale:12`` — so a revised proposal for the same incident that asks for
the same effect carries the same key and the executor applies it at most once. A step
on a service other than the one diagnosed names it (``incident-204:scale:search-api:3``)
so two steps of one plan never share a key. The digest an approver signs is
``flotilla.digest.command_digest`` over these steps; timestamps are cut to milliseconds
first, as Avro's timestamp-millis carries them, so the digest computed from a decoded
record is the same.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from flotilla.digest import command_digest
from services.reasoner.model import Action, PlannedStep, Proposal

COMMAND_TYPES: dict[Action, str] = {
    Action.SCALE: "dev.flotilla.commands.ScaleService",
    Action.RESTART: "dev.flotilla.commands.RestartService",
    Action.ROLLBACK: "dev.flotilla.commands.RollbackDeployment",
    Action.FAILOVER: "dev.flotilla.commands.FailoverDependency",
}
RESOURCE_KIND = "service"


def to_millis(at: datetime) -> datetime:
    """``at`` as timestamp-millis will carry it (sub-millisecond part dropped)."""
    if at.tzinfo is None:
        raise ValueError("command timestamps must be timezone-aware")
    return at.replace(microsecond=at.microsecond // 1000 * 1000)


def _params_text(action: Action, params: Mapping[str, Any]) -> str:
    if action is Action.SCALE:
        return str(int(params["replicas"]))
    if action is Action.RESTART:
        return "rolling" if params["rolling"] else "all"
    if action is Action.ROLLBACK:
        return str(params["toRevision"])
    return f"{params['dependency']}:{params['toTarget']}"


def idempotency_key(incident_id: str, action: Action, params: Mapping[str, Any], *, service: str | None = None) -> str:
    """``<incidentId>:<action>[:<service>]:<params>``: the same effect, the same key."""
    where = f"{service}:" if service else ""
    return f"{incident_id}:{action.value}:{where}{_params_text(action, params)}"


def command_record(
    step: PlannedStep,
    *,
    incident_id: str,
    proposal_id: str,
    diagnosed_service: str,
    issued_at: datetime,
    ttl: timedelta,
) -> dict[str, Any]:
    """One step as the command record a proposal carries (and policy later authorizes)."""
    issued = to_millis(issued_at)
    return {
        "commandId": str(uuid.uuid4()),
        "idempotencyKey": idempotency_key(
            incident_id, step.action, step.params, service=None if step.service == diagnosed_service else step.service
        ),
        "incidentId": incident_id,
        "proposalId": proposal_id,
        "target": {"kind": RESOURCE_KIND, "environment": step.environment, "name": step.service},
        **dict(step.params),
        "issuedAt": issued,
        "expiresAt": issued + ttl,
    }


def proposal_value(
    proposal: Proposal,
    *,
    proposal_id: str,
    proposed_by: str,
    diagnosed_service: str,
    now: datetime,
    ttl: timedelta,
) -> dict[str, Any]:
    """The RecoveryProposed value (eventId is added when it is emitted)."""
    steps = [
        command_record(
            step,
            incident_id=proposal.incident_id,
            proposal_id=proposal_id,
            diagnosed_service=diagnosed_service,
            issued_at=now,
            ttl=ttl,
        )
        for step in proposal.steps
    ]
    keys = [s["idempotencyKey"] for s in steps]
    if len(set(keys)) != len(keys):
        raise ValueError(f"two steps of one plan would share an idempotency key: {keys}")
    return {
        "incidentId": proposal.incident_id,
        "proposalId": proposal_id,
        "proposedBy": proposed_by,
        "diagnosisEventId": proposal.diagnosis_event_id,
        "steps": steps,
        "digest": command_digest(steps),
        "reasoning": proposal.reasoning.to_record(),
        "proposedAt": to_millis(now),
    }


def digest_matches(value: Mapping[str, Any]) -> bool:
    """Whether a (decoded) RecoveryProposed's digest is the digest of its steps."""
    steps: Sequence[Mapping[str, Any]] = value["steps"]
    return bool(value["digest"] == command_digest(steps))
