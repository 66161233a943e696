"""Executions by idempotency key: PENDING → APPLIED or FAILED.

A row is written PENDING and *committed* before the target is called, and settled
(APPLIED / FAILED) in the consumer's transaction together with the outgoing record. So a
crash at any point leaves one of three situations, each with a safe continuation:

- no row: nothing was attempted → act;
- a PENDING row: the executor may have acted and died before recording → the key is
  *in doubt*: ask the target (``lookup``) whether it was applied; record it if so,
  act if not;
- a settled row: the outcome was recorded and reported → a command carrying the key
  again gets the recorded outcome back and nothing new is emitted.

A FAILED row marked retryable (the target was unreachable) is in doubt as well: the
request may have reached the target before the connection broke, so a retry asks first.

Rows are per resource and fenced like the lease: :func:`begin` re-stamps an in-doubt row
with the new holder's epoch (only ever upwards; the same epoch only for its own holder,
whose earlier attempt under it is in doubt), and :func:`settle` updates only
``WHERE resource = %s AND epoch = %s`` while that epoch is still the lease's, so an
executor that lost its lease cannot settle a row that another holder now owns.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from flotilla import BusinessRuleViolation
from services.executor.commands import Step
from services.executor.leases import Lease, fenced_out


class State(enum.StrEnum):
    PENDING = "PENDING"
    APPLIED = "APPLIED"
    FAILED = "FAILED"


@dataclass(frozen=True)
class Execution:
    """One idempotency key's row."""

    idempotency_key: str
    resource: str
    epoch: int
    holder: str
    state: State
    retryable: bool
    attempts: int
    command_id: str
    command_type: str
    incident_id: str
    proposal_id: str
    action: str
    params: Mapping[str, Any]
    compensates: str | None
    result: Mapping[str, Any] | None
    error_class: str | None
    error_message: str | None

    @property
    def settled(self) -> bool:
        """Recorded for good: a repeat of the key changes nothing and emits nothing."""
        return self.state is State.APPLIED or (self.state is State.FAILED and not self.retryable)


@dataclass(frozen=True)
class Begun:
    """The key is PENDING under our epoch; ``in_doubt``: an earlier attempt may have acted."""

    execution: Execution
    in_doubt: bool


_COLUMNS = (
    "idempotency_key, resource, epoch, holder, state, retryable, attempts, command_id, command_type,"
    " incident_id, proposal_id, action, params, compensates, result, error_class, error_message"
)


def _execution(row: dict[str, Any] | None) -> Execution | None:
    if row is None:
        return None
    return Execution(
        **{
            **row,
            "state": State(row["state"]),
            "command_id": str(row["command_id"]),
            "proposal_id": str(row["proposal_id"]),
            "compensates": None if row["compensates"] is None else str(row["compensates"]),
        }
    )


def find(conn: psycopg.Connection[Any], key: str, *, lock: bool = False) -> Execution | None:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(
            f"SELECT {_COLUMNS} FROM executions WHERE idempotency_key = %s" + (" FOR UPDATE" if lock else ""), (key,)
        ).fetchone()
    return _execution(row)


def begin(conn: psycopg.Connection[Any], step: Step, lease: Lease) -> Begun | Execution:
    """Mark ``step`` PENDING under ``lease`` (new row, or an in-doubt one re-stamped).

    Returns the settled Execution instead when the key was settled meanwhile. Run it in
    the short transaction that also took or renewed the lease, and commit before acting.
    """
    found = find(conn, step.idempotency_key, lock=True)
    if found is None:
        conn.execute(
            "INSERT INTO executions (idempotency_key, resource, epoch, holder, state, command_id, command_type,"
            " incident_id, proposal_id, action, params, compensates)"
            " VALUES (%s, %s, %s, %s, 'PENDING', %s, %s, %s, %s, %s, %s, %s)",
            (
                step.idempotency_key,
                step.resource,
                lease.epoch,
                lease.holder,
                step.command_id,
                step.command_type,
                step.incident_id,
                step.proposal_id,
                step.action,
                Jsonb(dict(step.params)),
                step.compensates,
            ),
        )
        created = find(conn, step.idempotency_key)
        assert created is not None
        return Begun(created, in_doubt=False)
    if found.settled:
        return found
    if found.resource != step.resource or found.command_id != step.command_id:
        # The handler refuses a reused key before it gets here; this is the race of two
        # commands claiming one key at once: the loser is dead-lettered, loudly.
        raise BusinessRuleViolation(
            f"idempotency key {step.idempotency_key!r} belongs to command {found.command_id} on {found.resource}, "
            f"not to command {step.command_id} on {step.resource}"
        )
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(
            "UPDATE executions SET epoch = %s, holder = %s, state = 'PENDING', attempts = attempts + 1,"
            " started_at = now(), finished_at = NULL"
            " WHERE idempotency_key = %s AND resource = %s"
            f" AND (epoch < %s OR (epoch = %s AND holder = %s)) RETURNING {_COLUMNS}",
            (lease.epoch, lease.holder, step.idempotency_key, step.resource, lease.epoch, lease.epoch, lease.holder),
        ).fetchone()
    restamped = _execution(row)
    if restamped is None:  # the row carries a newer epoch, or this one under another holder: not ours
        raise fenced_out(f"{step.idempotency_key} is held at epoch {found.epoch}, not below {lease.epoch}")
    return Begun(restamped, in_doubt=True)


def settle(
    conn: psycopg.Connection[Any],
    key: str,
    lease: Lease,
    *,
    state: State,
    result: Mapping[str, Any] | None = None,
    error_class: str | None = None,
    error_message: str | None = None,
    retryable: bool = False,
) -> None:
    """Record the outcome of a PENDING key, fenced by ``lease``; raises LeaseLost if the
    row or the lease moved on to a newer epoch (a takeover: the new holder records)."""
    if state is State.PENDING:
        raise ValueError("settle records an outcome: APPLIED or FAILED")
    updated = conn.execute(
        "UPDATE executions SET state = %s, result = %s, error_class = %s, error_message = %s, retryable = %s,"
        " finished_at = now()"
        " WHERE idempotency_key = %s AND resource = %s AND epoch = %s AND state = 'PENDING'"
        " AND EXISTS (SELECT 1 FROM leases WHERE resource = %s AND epoch = %s)"
        " RETURNING idempotency_key",
        (
            state.value,
            None if result is None else Jsonb(dict(result)),
            error_class,
            error_message,
            retryable,
            key,
            lease.resource,
            lease.epoch,
            lease.resource,
            lease.epoch,
        ),
    ).fetchone()
    if updated is None:
        raise fenced_out(f"cannot record {key}: epoch {lease.epoch} on {lease.resource} is no longer current")
