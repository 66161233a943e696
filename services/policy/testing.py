"""Sample proposals for tests and demos: valid RecoveryProposed values, digest included."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from flotilla.commands import idempotency_key
from flotilla.digest import command_digest

AGENT = "remediation-agent-1"


def _now() -> datetime:
    # timestamp-millis: whole milliseconds, so values survive an Avro round trip unchanged
    now = datetime.now(UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


def step(
    kind: str,
    incident: str,
    proposal: str,
    *,
    environment: str = "production",
    name: str = "checkout-api",
    issued: datetime | None = None,
    ttl: timedelta = timedelta(minutes=15),
    **params: Any,
) -> dict[str, Any]:
    """One command of a proposal; ``params`` are the kind's own fields (defaults below)."""
    issued_at = issued or _now()
    defaults: dict[str, dict[str, Any]] = {
        "ScaleService": {"replicas": 12},
        "RestartService": {"rolling": True},
        "RollbackDeployment": {"toRevision": "r41"},
        "FailoverDependency": {"dependency": "payments-db", "toTarget": "payments-db-replica"},
    }
    value: dict[str, Any] = {
        "commandId": str(uuid.uuid4()),
        "incidentId": incident,
        "proposalId": proposal,
        "target": {"kind": "service", "environment": environment, "name": name},
        **defaults[kind],
        **params,
        "issuedAt": issued_at,
        "expiresAt": issued_at + ttl,
    }
    return {"idempotencyKey": idempotency_key(kind, value), **value}


def proposal(
    incident: str,
    steps: list[dict[str, Any]] | None = None,
    *,
    proposal_id: str | None = None,
    proposed_by: str = AGENT,
    confidence: float = 0.9,
    digest: str | None = None,
) -> dict[str, Any]:
    """A RecoveryProposed value (without eventId). Default: scale checkout-api to 12."""
    pid = proposal_id or (str(steps[0]["proposalId"]) if steps else str(uuid.uuid4()))
    plan = steps if steps is not None else [step("ScaleService", incident, pid)]
    return {
        "incidentId": incident,
        "proposalId": pid,
        "proposedBy": proposed_by,
        "diagnosisEventId": str(uuid.uuid4()),
        "steps": plan,
        "digest": digest or command_digest(plan),
        "reasoning": {
            "summary": "checkout-api waits on payments-api; more replicas, more pool",
            "evidence": [],
            "confidence": confidence,
            "reasoner": "rules",
            "model": None,
            "tokenUsage": {"promptTokens": 0, "completionTokens": 0},
        },
        "proposedAt": _now(),
    }
