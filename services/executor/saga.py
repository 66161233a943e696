"""The saga of each proposal: its completed steps and whether it may still go on.

One row per proposal, created by its first command and locked (``FOR UPDATE``) by every
handler that touches it, so the steps of one proposal are serialized even when they
target different resources (different partitions, possibly different executor
processes). A saga is OPEN while its steps may run; a failed step, a RecoveryFailed or a
RecoveryCompleted closes it, and a command arriving for a closed saga is refused.

These rows are written in the handler's transaction, next to the fenced settlement of
the execution rows, so they commit only if the lease was still ours.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from services.executor.commands import Step
from services.executor.compensation import Completed
from services.executor.execution import Applied


class SagaStatus(enum.StrEnum):
    OPEN = "OPEN"  # steps may run
    COMPLETED = "COMPLETED"  # verified recovered (RecoveryCompleted): nothing to undo any more
    ABORTED = "ABORTED"  # failed with nothing to undo
    COMPENSATED = "COMPENSATED"  # failed, completed steps undone (CompensationCompleted)
    COMPENSATION_FAILED = "COMPENSATION_FAILED"  # failed, undo stopped part way: escalated


@dataclass(frozen=True)
class Saga:
    proposal_id: str
    incident_id: str
    status: SagaStatus
    reason: str | None

    @property
    def open(self) -> bool:
        return self.status is SagaStatus.OPEN


def _saga(row: dict[str, Any] | None) -> Saga | None:
    if row is None:
        return None
    return Saga(str(row["proposal_id"]), row["incident_id"], SagaStatus(row["status"]), row["reason"])


def lock(conn: psycopg.Connection[Any], proposal_id: str) -> Saga | None:
    """The proposal's saga, row-locked until the transaction ends (None: no step ran here)."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(
            "SELECT proposal_id, incident_id, status, reason FROM sagas WHERE proposal_id = %s FOR UPDATE",
            (proposal_id,),
        ).fetchone()
    return _saga(row)


def join(conn: psycopg.Connection[Any], step: Step) -> Saga:
    """The saga ``step`` belongs to, opened if this is its first step, row-locked."""
    conn.execute(
        "INSERT INTO sagas (proposal_id, incident_id, status) VALUES (%s, %s, 'OPEN') ON CONFLICT DO NOTHING",
        (step.proposal_id, step.incident_id),
    )
    saga = lock(conn, step.proposal_id)
    assert saga is not None
    return saga


def add_step(conn: psycopg.Connection[Any], applied: Applied) -> None:
    """Remember a completed forward step with the state it changed, for compensation."""
    step = applied.step
    conn.execute(
        "INSERT INTO saga_steps (proposal_id, command_id, command_type, idempotency_key, incident_id, target,"
        " action, params, before, after) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
        " ON CONFLICT DO NOTHING",
        (
            step.proposal_id,
            step.command_id,
            step.command_type,
            step.idempotency_key,
            step.incident_id,
            Jsonb(dict(step.target)),
            step.action,
            Jsonb(dict(step.params)),
            Jsonb(dict(applied.before)),
            Jsonb(dict(applied.after)),
        ),
    )


def completed(conn: psycopg.Connection[Any], proposal_id: str) -> list[Completed]:
    """The proposal's completed, not yet compensated steps, in the order they completed."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            "SELECT command_id, command_type, idempotency_key, incident_id, target, action, params, before, after"
            " FROM saga_steps WHERE proposal_id = %s AND compensated_at IS NULL ORDER BY seq",
            (proposal_id,),
        ).fetchall()
    return [
        Completed(
            step=Step(
                command_id=str(r["command_id"]),
                command_type=r["command_type"],
                idempotency_key=r["idempotency_key"],
                incident_id=r["incident_id"],
                proposal_id=proposal_id,
                target=r["target"],
                action=r["action"],
                params=r["params"],
            ),
            before=r["before"],
            after=r["after"],
        )
        for r in rows
    ]


def mark_compensated(conn: psycopg.Connection[Any], step: Step, compensation_id: str) -> None:
    conn.execute(
        "UPDATE saga_steps SET compensated_by = %s, compensated_at = now() WHERE proposal_id = %s AND command_id = %s",
        (compensation_id, step.proposal_id, step.command_id),
    )


def close(conn: psycopg.Connection[Any], proposal_id: str, status: SagaStatus, reason: str) -> None:
    conn.execute(
        "UPDATE sagas SET status = %s, reason = %s, closed_at = now() WHERE proposal_id = %s",
        (status.value, reason, proposal_id),
    )
