"""The records the policy service writes, as values, and how commands are issued.

Values leave out ``eventId``: the runtime fills it in from the envelope. Commands are
the exception twice over — their schema has no ``eventId``, and their ``ce_id`` must be
their ``commandId`` (fixed in the proposal and covered by the digest) — so they are
appended to the outbox here with an envelope built for that id.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg

from flotilla.authority import Grant, Signer, authorize_command
from flotilla.commands import COMMANDS_TOPIC, resource_key
from flotilla.commands import record_type as command_type
from flotilla.envelope import Envelope
from flotilla.outbox import Outbox
from services.policy.commands import command_kind

INCIDENTS_TOPIC = "incidents"
_FACT = "dev.flotilla.incidents."
RECOVERY_PROPOSED = "dev.flotilla.decisions.RecoveryProposed"
RECOVERY_APPROVED = _FACT + "RecoveryApproved"
RECOVERY_REJECTED = _FACT + "RecoveryRejected"
HUMAN_APPROVAL_REQUIRED = _FACT + "HumanApprovalRequired"
APPROVAL_EXPIRED = _FACT + "ApprovalExpired"
COMMAND_DENIED = _FACT + "CommandDenied"
INCIDENT_ESCALATED = _FACT + "IncidentEscalated"
ESCALATION_TARGET = "on-call"


def recovery_approved(
    *, incident: str, proposal: str, digest: str, by: str, auto: bool, policy_ids: Sequence[str], at: datetime
) -> dict[str, Any]:
    return {
        "incidentId": incident,
        "proposalId": proposal,
        "digest": digest,
        "approvedBy": by,
        "auto": auto,
        "policyIds": list(policy_ids),
        "approvedAt": at,
    }


def human_approval_required(
    *,
    incident: str,
    proposal: str,
    digest: str,
    summary: str,
    reasons: Sequence[str],
    policy_ids: Sequence[str],
    role: str,
    proposed_by: str,
    deadline: datetime,
    at: datetime,
) -> dict[str, Any]:
    return {
        "incidentId": incident,
        "proposalId": proposal,
        "digest": digest,
        "summary": summary,
        "reasons": list(reasons),
        "policyIds": list(policy_ids),
        "requiredRole": role,
        "proposedBy": proposed_by,
        "deadline": deadline,
        "requestedAt": at,
    }


def command_denied(
    *,
    incident: str,
    proposal: str,
    digest: str,
    command_id: str | None,
    reasons: Sequence[str],
    policy_ids: Sequence[str],
    at: datetime,
) -> dict[str, Any]:
    return {
        "incidentId": incident,
        "proposalId": proposal,
        "digest": digest,
        "commandId": command_id,
        "reasons": list(reasons),
        "policyIds": list(policy_ids),
        "deniedAt": at,
    }


def recovery_rejected(
    *, incident: str, proposal: str, digest: str, by: str, reason: str, at: datetime
) -> dict[str, Any]:
    return {
        "incidentId": incident,
        "proposalId": proposal,
        "digest": digest,
        "rejectedBy": by,
        "reason": reason,
        "rejectedAt": at,
    }


def approval_expired(
    *, incident: str, proposal: str, digest: str, role: str, deadline: datetime, at: datetime
) -> dict[str, Any]:
    return {
        "incidentId": incident,
        "proposalId": proposal,
        "digest": digest,
        "requiredRole": role,
        "deadline": deadline,
        "expiredAt": at,
    }


def incident_escalated(*, incident: str, reason: str, cause: Envelope, at: datetime) -> dict[str, Any]:
    return {
        "incidentId": incident,
        "reason": reason,
        "causeEventId": cause.id,
        "causeType": cause.type,
        "escalatedTo": ESCALATION_TARGET,
        "escalatedAt": at,
    }


def issue_commands(
    outbox: Outbox,
    conn: psycopg.Connection[Any],
    *,
    cause: Envelope,
    source: str,
    commands: Sequence[dict[str, Any]],
    signer: Signer,
    decision: Grant,
    approved_by: str,
    proposal_digest: str,
    at: datetime,
) -> list[Envelope]:
    """Sign each command (the executor runs nothing else) and append it to ``commands``,
    keyed by its target, caused by ``cause`` (the RecoveryApproved), with ``ce_id`` = its
    ``commandId``. In the caller's transaction."""
    issued = []
    for command in commands:
        record_type = command_type(command_kind(command))
        signed = authorize_command(
            signer,
            record_type,
            command,
            decision=decision,
            approved_by=approved_by,
            proposal_digest=proposal_digest,
            now=at,
        )
        envelope = cause.caused(record_type, source, id=str(command["commandId"]))
        outbox.append(conn, topic=COMMANDS_TOPIC, key=resource_key(command["target"]), value=signed, envelope=envelope)
        issued.append(envelope)
    return issued
