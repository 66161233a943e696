"""Slow diagnostic jobs, kept in the agent's database so they outlive the process.

A job is started inside the consumer's transaction (the DiagnosticJobStarted record and
the row commit together) and finished by a periodic task in three steps: lease one due
job (``lease_due``: its due time moves past the lease; ``SKIP LOCKED`` keeps several
instances off each other's jobs), gather evidence and reason with no transaction open,
then ``claim`` it (``running`` → ``done``), emit its result and record the outcome in one
short transaction — so a job finishes exactly once however often the task runs or the
process restarts, and a slow model holds no lock.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from flotilla import Envelope
from flotilla.records import DiagnosticJobStarted

_COLUMNS = (
    "job_id, incident_id, service, environment, symptom, job_kind, due_at, deadline, attempts, "
    "request_event_id, cause_event_id, cause_hops, cause_traceparent"
)


@dataclass(frozen=True)
class Job:
    job_id: str
    incident_id: str
    service: str
    environment: str
    symptom: str
    job_kind: str
    due_at: datetime
    deadline: datetime
    attempts: int
    request_event_id: str
    cause_event_id: str  # the DiagnosticJobStarted record's id
    cause_hops: int
    cause_traceparent: str

    def cause(self, source: str) -> Envelope:
        """The DiagnosticJobStarted envelope, rebuilt: the job's result is caused by it."""
        return Envelope(
            type=DiagnosticJobStarted.TYPE,
            source=source,
            correlationid=self.incident_id,
            id=self.cause_event_id,
            hops=self.cause_hops,
            traceparent=self.cause_traceparent,
        )


def insert(
    conn: psycopg.Connection[Any],
    *,
    job_id: str,
    incident_id: str,
    service: str,
    environment: str,
    symptom: str,
    job_kind: str,
    due_at: datetime,
    deadline: datetime,
    request: Envelope,
    started: Envelope,
) -> None:
    conn.execute(
        """
        INSERT INTO diagnostic_jobs (job_id, incident_id, service, environment, symptom, job_kind, due_at,
            deadline, request_event_id, request_hops, request_traceparent, cause_event_id, cause_hops,
            cause_traceparent)
        VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
        """,
        (
            job_id,
            incident_id,
            service,
            environment,
            symptom,
            job_kind,
            due_at,
            deadline,
            request.id,
            request.hops,
            request.traceparent,
            started.id,
            started.hops,
            started.traceparent,
        ),
    )


def lease_due(conn: psycopg.Connection[Any], now: datetime, *, until: datetime) -> Job | None:
    """Take one due, running job for a while: its due time moves to ``until``, so no other
    instance takes it before then. It stays ``running``: ``claim`` finishes it, and a
    crash in between leaves it to be taken again once the lease has run out."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(
            f"""
            UPDATE diagnostic_jobs SET due_at = %(until)s, attempts = attempts + 1
            WHERE job_id = (
                SELECT job_id FROM diagnostic_jobs
                WHERE status = 'running' AND due_at <= %(now)s
                ORDER BY due_at, job_id
                LIMIT 1
                FOR UPDATE SKIP LOCKED
            ) AND status = 'running'
            RETURNING {_COLUMNS}
            """,
            {"now": now, "until": until},
        ).fetchone()
    if row is None:
        return None
    return Job(**{**row, "job_id": str(row["job_id"])})


def extend_lease(conn: psycopg.Connection[Any], job_id: str, *, held_until: datetime, until: datetime) -> bool:
    """Move a leased job's due time from ``held_until`` (the lease we hold) to ``until``;
    False if it is no longer ours (finished, or its lease ran out and another took it)."""
    row = conn.execute(
        "UPDATE diagnostic_jobs SET due_at = %s WHERE job_id = %s AND status = 'running' AND due_at = %s RETURNING 1",
        (until, job_id, held_until),
    ).fetchone()
    return row is not None


def claim(conn: psycopg.Connection[Any], job_id: str, now: datetime) -> str | None:
    """Finish one particular running job in this transaction: ``running`` → ``done``,
    which only one instance can do; None if it is not running (someone finished it)."""
    row = conn.execute(
        "UPDATE diagnostic_jobs SET status = 'done', finished_at = %s WHERE job_id = %s AND status = 'running' "
        "RETURNING job_id",
        (now, job_id),
    ).fetchone()
    return None if row is None else str(row[0])


def record_outcome(
    conn: psycopg.Connection[Any], job_id: str, *, status: str, outcome_type: str | None, outcome_event_id: str | None
) -> None:
    conn.execute(
        "UPDATE diagnostic_jobs SET status = %s, outcome_type = %s, outcome_event_id = %s WHERE job_id = %s",
        (status, outcome_type, outcome_event_id, job_id),
    )


def postpone(conn: psycopg.Connection[Any], job_id: str, *, until: datetime, error: str) -> None:
    """A job that could not finish: try again at ``until`` (it stays running)."""
    conn.execute(
        "UPDATE diagnostic_jobs SET due_at = %s, last_error = %s WHERE job_id = %s AND status = 'running'",
        (until, error[:2000], job_id),
    )
