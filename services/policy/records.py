"""How the policy service issues commands.

Commands are not emitted like its facts (``flotilla.records``, through ``ctx.emit``):
their schema has no ``eventId``, and their ``ce_id`` must be their ``commandId`` (fixed in
the proposal and covered by the digest), so they are appended to the outbox here, through
the same ``Outbox.append``, with an envelope built for that id.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from flotilla import Envelope, Record
from flotilla.authority import Grant, Signer, authorize_command
from flotilla.commands import record_type as command_type
from flotilla.commands import resource_key
from flotilla.records import BY_TYPE, RecoveryApproved
from services.policy.commands import command_kind
from services.policy.proposals import Proposal

# Appends one command under its envelope, keyed by its target: the handler's pending rows
# (``HandlerContext.emit_as``) or the outbox at once (``Outbox.append``), both the one way in.
CommandSink = Callable[[Record, Envelope, str], object]


def auto_approval(proposal: Proposal, policy_ids: Sequence[str], *, approved_by: str, at: datetime) -> RecoveryApproved:
    """The approval policy gives a proposal its rules authorize without a person."""
    return RecoveryApproved(
        incident_id=proposal.incident_id,
        proposal_id=proposal.proposal_id,
        digest=proposal.digest,
        approved_by=approved_by,
        auto=True,
        policy_ids=tuple(policy_ids),
        approved_at=at,
    )


def issue_commands(
    sink: CommandSink,
    *,
    cause: Envelope,
    source: str,
    commands: Sequence[dict[str, Any]],
    signer: Signer,
    decision: Grant,
    approved_by: str,
    proposal_digest: str,
    at: datetime,
    expected_changes: Sequence[str | None] | None = None,
) -> list[Envelope]:
    """Sign each command (the executor runs nothing else) and hand it to ``sink`` for
    ``commands``, keyed by its target, caused by ``cause`` (the RecoveryApproved), with
    ``ce_id`` = its ``commandId``. After the approval, in the caller's transaction.
    ``expected_changes``: per command, the Change digest the person approved (signed as
    ``expectedChange``; None for a step shown no change, and for every automatic one)."""
    expected = list(expected_changes) if expected_changes is not None else [None] * len(commands)
    if len(expected) != len(commands):
        raise ValueError(f"{len(expected)} expected changes for {len(commands)} commands")
    issued = []
    for command, change in zip(commands, expected, strict=True):
        record_type = command_type(command_kind(command))
        signed = authorize_command(
            signer,
            record_type,
            command,
            decision=decision,
            approved_by=approved_by,
            proposal_digest=proposal_digest,
            now=at,
            expected_change=change,
        )
        envelope = cause.caused(record_type, source, id=str(command["commandId"]))
        sink(BY_TYPE[record_type].from_value(signed), envelope, resource_key(command["target"]))
        issued.append(envelope)
    return issued
