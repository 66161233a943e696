"""The facts the executor reports, as values of their Avro contracts. Pure.

``eventId`` is left out: ``HandlerContext.emit`` fills it in from the envelope.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from services.executor.commands import Step
from services.executor.execution import Applied, Failed

_NS = "dev.flotilla.incidents."
RECOVERY_EXECUTED = _NS + "RecoveryExecuted"
COMMAND_FAILED = _NS + "CommandFailed"
COMPENSATION_COMPLETED = _NS + "CompensationCompleted"
INCIDENT_ESCALATED = _NS + "IncidentEscalated"
RECOVERY_FAILED = _NS + "RecoveryFailed"
RECOVERY_COMPLETED = _NS + "RecoveryCompleted"
COMMAND_REJECTED = _NS + "CommandRejected"
TOPIC = "incidents"


def _millis(at: datetime) -> datetime:
    """timestamp-millis holds milliseconds: drop the rest so a round trip compares equal."""
    return at.astimezone(UTC).replace(microsecond=at.microsecond // 1000 * 1000)


def _about(step: Step) -> dict[str, Any]:
    return {
        "incidentId": step.incident_id,
        "proposalId": step.proposal_id,
        "commandId": step.command_id,
        "commandType": step.command_type,
        "idempotencyKey": step.idempotency_key,
        "target": dict(step.target),
    }


def _change(before: Mapping[str, Any], after: Mapping[str, Any], key: str) -> str:
    return f"from {before.get(key, '?')} to {after.get(key, '?')}"


def describe(step: Step, before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    """One sentence: what the step did, e.g. ``checkout-api scaled from 4 to 12 replicas``."""
    name = step.name
    if step.action == "scale":
        what = f"{name} scaled {_change(before, after, 'replicas')} replicas"
    elif step.action == "rollback":
        what = f"{name} moved {_change(before, after, 'revision')}"
    elif step.action == "failover":
        dependency = step.params.get("dependency", "?")
        what = f"{name}'s dependency {dependency} switched {_change(before, after, 'activeTarget')}"
    elif step.action == "restart":
        what = f"{name} restarted ({'rolling' if step.params.get('rolling') else 'all at once'})"
    else:
        what = f"{step.action} on {name}"
    if "p95Ms" in before and "p95Ms" in after:
        what += f" (p95 {before['p95Ms']} ms → {after['p95Ms']} ms)"
    if step.compensates is not None:
        what = f"Compensation of {step.idempotency_key.removesuffix(':compensate')}: {what}"
    return what


def recovery_executed(applied: Applied, at: datetime) -> dict[str, Any]:
    outcome = describe(applied.step, applied.before, applied.after)
    if applied.reconciled:
        outcome += "; found applied at the target and recorded late"
    return {
        **_about(applied.step),
        "fencingEpoch": applied.epoch,
        "compensates": applied.step.compensates,
        "outcome": outcome,
        "actionDurationMs": applied.duration_ms,
        "executedAt": _millis(at),
    }


def command_failed(failed: Failed, at: datetime) -> dict[str, Any]:
    return {
        **_about(failed.step),
        "errorClass": failed.error_class,
        "errorMessage": failed.message,
        "retryable": failed.retryable,
        "attempt": failed.attempt,
        "fencingEpoch": failed.epoch,
        "compensates": failed.step.compensates,
        "failedAt": _millis(at),
    }


def compensation_completed(
    incident_id: str, proposal_id: str, command_ids: Sequence[str], cause_event_id: str, summary: str, at: datetime
) -> dict[str, Any]:
    return {
        "incidentId": incident_id,
        "proposalId": proposal_id,
        "compensatedCommandIds": list(command_ids),
        "causeEventId": cause_event_id,
        "summary": summary,
        "completedAt": _millis(at),
    }


def incident_escalated(
    incident_id: str, reason: str, cause_event_id: str, cause_type: str, escalated_to: str, at: datetime
) -> dict[str, Any]:
    return {
        "incidentId": incident_id,
        "reason": reason,
        "causeEventId": cause_event_id,
        "causeType": cause_type,
        "escalatedTo": escalated_to,
        "escalatedAt": _millis(at),
    }


def command_rejected(
    record_type: str,
    command: Mapping[str, Any],
    *,
    refusal: str,
    reason: str,
    key_id: str | None,
    producer: str,
    origin: tuple[str, int, int],
    at: datetime,
) -> dict[str, Any]:
    """The CommandRejected value for a command whose authorization does not hold."""
    topic, partition, offset = origin
    return {
        "incidentId": str(command["incidentId"]),
        "commandId": str(command["commandId"]),
        "commandType": record_type,
        "idempotencyKey": str(command["idempotencyKey"]),
        "target": {k: str(command["target"][k]) for k in ("kind", "environment", "name")},
        "refusal": refusal,
        "reason": reason,
        "keyId": key_id,
        "producer": producer,
        "originTopic": topic,
        "originPartition": partition,
        "originOffset": offset,
        "rejectedAt": _millis(at),
    }
