"""Sample proposals for tests and demos: valid RecoveryProposed values, digest included."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from flotilla import actions
from flotilla.commands import idempotency_key
from flotilla.digest import command_digest
from flotilla.records import AlertObserved, DiagnosisConcluded, DiagnosisRequested, ServiceLatencyIncreased

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
        "PauseRollout": {"paused": True},
        "RaiseAutoscalerCeiling": {
            "autoscalerKind": "HorizontalPodAutoscaler",
            "autoscaler": "checkout-api",
            "fromMaxReplicas": 10,
            "maxReplicas": 15,
        },
        "RaiseMemoryLimit": {"container": "app", "fromMemoryLimitBytes": 256 << 20, "memoryLimitBytes": 512 << 20},
    }
    value: dict[str, Any] = {
        "commandId": str(uuid.uuid4()),
        "incidentId": incident,
        "proposalId": proposal,
        "target": {"kind": "service", "environment": environment, "name": name},
        **actions.by_kind(kind).params_of(defaults[kind]),
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
        "diagnosisEventId": diagnosis_of(incident),
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


_DIAGNOSES = uuid.UUID("6d1f4f57-3c1e-4f0b-9b5e-2a7c0e9d4b11")


def diagnosis_of(incident: str) -> str:
    """The event id of the diagnosis a test proposal for ``incident`` names (derived, so a
    test can record that diagnosis as verified: :func:`verified_basis`)."""
    return str(uuid.uuid5(_DIAGNOSES, incident))


def verified_basis(conn: psycopg.Connection[Any], incident: str, *, diagnosis_reasoner: str | None = "rules") -> None:
    """Record, as the policy's loop would on seeing them signed, the health agent's opening
    of ``incident`` and the diagnosis its test proposals name (services/policy/basis.py),
    made by ``diagnosis_reasoner``."""
    rows = [  # an incident has several: the breach, the request for a diagnosis, alerts
        (str(uuid.uuid4()), incident, ServiceLatencyIncreased.TYPE, "health-agent", "sha256:test", None),
        (str(uuid.uuid4()), incident, DiagnosisRequested.TYPE, "health-agent", "sha256:test", None),
        (str(uuid.uuid4()), incident, AlertObserved.TYPE, "health-agent", "sha256:test", None),
        (
            diagnosis_of(incident),
            incident,
            DiagnosisConcluded.TYPE,
            "diagnostic-agent",
            "sha256:test",
            diagnosis_reasoner,
        ),
    ]
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO policy_verified_facts (event_id, incident_id, record_type, producer, digest, reasoner) "
            "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (event_id) DO NOTHING",
            rows,
        )
