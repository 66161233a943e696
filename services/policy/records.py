"""How the policy service issues commands.

Commands are not emitted like its facts (``flotilla.records``, through ``ctx.emit``):
their schema has no ``eventId``, and their ``ce_id`` must be their ``commandId`` (fixed in
the proposal and covered by the digest), so they are appended to the outbox here with an
envelope built for that id.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg

from flotilla import Envelope, Outbox
from flotilla.authority import Grant, Signer, authorize_command
from flotilla.commands import COMMANDS_TOPIC, resource_key
from flotilla.commands import record_type as command_type
from services.policy.commands import command_kind


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
