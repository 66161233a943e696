"""The facts the executor reports, as typed records (``flotilla.records``). Pure.

``event_id`` is left empty: ``HandlerContext.emit`` fills it in from the envelope.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from flotilla.records import CommandFailed, CommandRejected, CompensationCompleted, RecoveryExecuted, ResourceRef
from services.executor.commands import Step
from services.executor.execution import Applied, Failed


def _target(target: Mapping[str, Any]) -> ResourceRef:
    return ResourceRef(kind=str(target["kind"]), environment=str(target["environment"]), name=str(target["name"]))


def _about(step: Step) -> dict[str, Any]:
    """The fields every outcome of a step shares, as keyword arguments."""
    return {
        "incident_id": step.incident_id,
        "proposal_id": step.proposal_id,
        "command_id": step.command_id,
        "command_type": step.command_type,
        "idempotency_key": step.idempotency_key,
        "target": _target(step.target),
    }


def describe(step: Step, before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    """One sentence: what the step did, e.g. ``checkout-api scaled from 4 to 12 replicas``."""
    what = step.spec.outcome(step.name, step.params, before, after)
    if "p95Ms" in before and "p95Ms" in after:
        what += f" (p95 {before['p95Ms']} ms → {after['p95Ms']} ms)"
    if step.compensates is not None:
        what = f"Compensation of {step.idempotency_key.removesuffix(':compensate')}: {what}"
    return what


def recovery_executed(applied: Applied, at: datetime) -> RecoveryExecuted:
    outcome = describe(applied.step, applied.before, applied.after)
    if applied.reconciled:
        outcome += "; found applied at the target and recorded late"
    return RecoveryExecuted(
        **_about(applied.step),
        fencing_epoch=applied.epoch,
        compensates=applied.step.compensates,
        outcome=outcome,
        action_duration_ms=applied.duration_ms,
        executed_at=at,
    )


def command_failed(failed: Failed, at: datetime) -> CommandFailed:
    return CommandFailed(
        **_about(failed.step),
        error_class=failed.error_class,
        error_message=failed.message,
        retryable=failed.retryable,
        attempt=failed.attempt,
        fencing_epoch=failed.epoch,
        compensates=failed.step.compensates,
        failed_at=at,
    )


def compensation_completed(
    incident_id: str, proposal_id: str, command_ids: Sequence[str], cause_event_id: str, summary: str, at: datetime
) -> CompensationCompleted:
    return CompensationCompleted(
        incident_id=incident_id,
        proposal_id=proposal_id,
        compensated_command_ids=tuple(command_ids),
        cause_event_id=cause_event_id,
        summary=summary,
        completed_at=at,
    )


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
) -> CommandRejected:
    """The CommandRejected record for a command whose authorization does not hold."""
    topic, partition, offset = origin
    return CommandRejected(
        incident_id=str(command["incidentId"]),
        command_id=str(command["commandId"]),
        command_type=record_type,
        idempotency_key=str(command["idempotencyKey"]),
        target=_target(command["target"]),
        refusal=refusal,
        reason=reason,
        key_id=key_id,
        producer=producer,
        origin_topic=topic,
        origin_partition=partition,
        origin_offset=offset,
        rejected_at=at,
    )
