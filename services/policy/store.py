"""The policy service's tables: proposals, their decisions and who is current.

Every function runs inside the caller's transaction. Lock order, everywhere, is
incident workflow row -> current-proposal rows (sorted by resource) -> proposal rows,
so a consumer recording a newer proposal and a person approving an older one serialize
instead of deadlocking. The expiry sweep only takes proposal rows, with SKIP LOCKED.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib import resources as package_files
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from flotilla import Envelope
from flotilla.records import HumanApprovalRequired
from services.policy import preview
from services.policy.approval_rules import ProposalStatus, ProposalView
from services.policy.commands import command_record
from services.policy.decide import Decision, ProposalFacts, Target, distinct_targets


def migration() -> str:
    return package_files.files("services.policy").joinpath("migrations.sql").read_text()


@dataclass(frozen=True)
class StoredProposal:
    proposal_id: str
    incident_id: str
    proposed_by: str
    proposal_event_id: str
    digest: str
    steps: list[dict[str, Any]]
    resources: list[str]
    summary: str
    facts: dict[str, Any]
    decision: str
    decision_detail: dict[str, Any]
    reasons: list[str]
    policy_ids: list[str]
    dry_run: bool
    status: ProposalStatus
    required_role: str
    deadline: datetime | None
    proposed_at: datetime
    decided_at: datetime
    request_event_id: str | None
    request_source: str | None
    request_hops: int | None
    request_traceparent: str | None
    resolved_at: datetime | None
    resolved_by: str | None
    resolution: str | None
    superseded_by: str | None
    changes: list[dict[str, Any]] | None = None  # per step: Change or NoPreview JSON, when a person was asked
    change_digest: str | None = None  # what the approval must repeat (services/policy/preview.py)

    @property
    def targets(self) -> tuple[Target, ...]:
        return distinct_targets(self.steps)

    def view(self) -> ProposalView:
        return ProposalView(
            proposal_id=self.proposal_id,
            incident_id=self.incident_id,
            proposed_by=self.proposed_by,
            digest=self.digest,
            status=self.status,
            deadline=self.deadline,
            targets=self.targets,
            required_role=self.required_role,
            superseded_by=self.superseded_by,
            change_digest=self.change_digest,
        )

    def proposal_facts(self) -> ProposalFacts:
        return ProposalFacts.from_json(self.facts)

    def expected_changes(self) -> list[str | None]:
        """Each step's approved Change digest (its command's ``expectedChange``), None where
        the person was shown none."""
        if self.changes is None:
            return [None] * len(self.steps)
        return preview.expected_changes(preview.from_json(self.changes))

    def command_records(self) -> list[dict[str, Any]]:
        return [command_record(step) for step in self.steps]

    def request_envelope(self) -> Envelope:
        """The HumanApprovalRequired this proposal is waiting under, rebuilt."""
        if self.request_event_id is None or self.request_hops is None:
            raise ValueError(f"proposal {self.proposal_id} never asked for approval")
        return Envelope(
            type=HumanApprovalRequired.TYPE,
            source=self.request_source or "/flotilla/policy-service",
            correlationid=self.incident_id,
            id=self.request_event_id,
            causationid=self.proposal_event_id,
            hops=self.request_hops,
            traceparent=self.request_traceparent or "",
        )


_COLUMNS = """proposal_id::text, incident_id, proposed_by, proposal_event_id::text, digest, steps, resources,
    summary, facts, decision, decision_detail, reasons, policy_ids, dry_run, status, required_role, deadline,
    proposed_at, decided_at, request_event_id::text, request_source, request_hops, request_traceparent,
    resolved_at, resolved_by, resolution, superseded_by::text, changes, change_digest"""


def _stored(row: dict[str, Any]) -> StoredProposal:
    return StoredProposal(**{**row, "status": ProposalStatus(row["status"])})


def _rows(conn: psycopg.Connection[Any], query: str, params: Sequence[Any] | Mapping[str, Any]) -> list[StoredProposal]:
    with conn.cursor(row_factory=dict_row) as cur:
        return [_stored(r) for r in cur.execute(query, params).fetchall()]


def get(conn: psycopg.Connection[Any], proposal_id: str, *, lock: bool = False) -> StoredProposal | None:
    query = f"SELECT {_COLUMNS} FROM policy_proposals WHERE proposal_id = %s" + (" FOR UPDATE" if lock else "")
    found = _rows(conn, query, (proposal_id,))
    return found[0] if found else None


def listing(conn: psycopg.Connection[Any], status: ProposalStatus | None, *, limit: int = 200) -> list[StoredProposal]:
    if status is None:
        return _rows(conn, f"SELECT {_COLUMNS} FROM policy_proposals ORDER BY seq DESC LIMIT %s", (limit,))
    order = "deadline, seq" if status is ProposalStatus.PENDING else "seq DESC"
    return _rows(
        conn,
        f"SELECT {_COLUMNS} FROM policy_proposals WHERE status = %s ORDER BY {order} LIMIT %s",
        (status.value, limit),
    )


def count_pending(conn: psycopg.Connection[Any]) -> int:
    """How many proposals wait for a person's decision."""
    row = conn.execute("SELECT count(*) FROM policy_proposals WHERE status = 'pending'").fetchone()
    return int(row[0]) if row is not None else 0


@dataclass(frozen=True)
class NewProposal:
    proposal_id: str
    incident_id: str
    proposed_by: str
    proposal_event_id: str
    digest: str
    steps: Sequence[dict[str, Any]]
    resources: Sequence[str]
    summary: str
    facts: ProposalFacts
    decision: Decision
    dry_run: bool
    status: ProposalStatus
    required_role: str
    deadline: datetime | None
    proposed_at: datetime
    decided_at: datetime
    request: Envelope | None  # the HumanApprovalRequired, when one was emitted
    reasons: Sequence[str]
    policy_ids: Sequence[str]
    changes: Sequence[Mapping[str, Any]] | None = None
    change_digest: str | None = None


def insert(conn: psycopg.Connection[Any], p: NewProposal) -> None:
    request = p.request
    conn.execute(
        """
        INSERT INTO policy_proposals (proposal_id, incident_id, proposed_by, proposal_event_id, digest, steps,
            resources, summary, facts, decision, decision_detail, reasons, policy_ids, dry_run, status,
            required_role, deadline, proposed_at, decided_at, request_event_id, request_source, request_hops,
            request_traceparent, changes, change_digest)
        VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
        """,
        (
            p.proposal_id,
            p.incident_id,
            p.proposed_by,
            p.proposal_event_id,
            p.digest,
            Jsonb(list(p.steps)),
            list(p.resources),
            p.summary,
            Jsonb(p.facts.to_json()),
            p.decision.outcome.value,
            Jsonb(p.decision.to_json()),
            list(p.reasons),
            list(p.policy_ids),
            p.dry_run,
            p.status.value,
            p.required_role,
            p.deadline,
            p.proposed_at,
            p.decided_at,
            request.id if request else None,
            request.source if request else None,
            request.hops if request else None,
            request.traceparent if request else None,
            None if p.changes is None else Jsonb([dict(c) for c in p.changes]),
            p.change_digest,
        ),
    )


def make_current(
    conn: psycopg.Connection[Any], incident_id: str, resources: Sequence[str], proposal_id: str
) -> list[str]:
    """Make ``proposal_id`` the current proposal for each resource; supersede the older
    pending proposals of the incident that touch any of them. Returns their ids."""
    conn.execute(
        """
        INSERT INTO policy_current_proposals (incident_id, resource, proposal_id)
        SELECT %s, r, %s FROM unnest(%s::text[]) AS r ORDER BY r
        ON CONFLICT (incident_id, resource) DO UPDATE SET proposal_id = EXCLUDED.proposal_id, since = now()
        """,
        (incident_id, proposal_id, sorted(resources)),
    )
    rows = conn.execute(
        """
        UPDATE policy_proposals
           SET status = 'superseded', superseded_by = %s, resolved_at = now(),
               resolution = 'superseded by a newer proposal for the same resource'
         WHERE incident_id = %s AND status = 'pending' AND resources && %s::text[] AND proposal_id <> %s
        RETURNING proposal_id::text
        """,
        (proposal_id, incident_id, list(resources), proposal_id),
    ).fetchall()
    return [r[0] for r in rows]


def lock_current(conn: psycopg.Connection[Any], incident_id: str, resources: Sequence[str]) -> dict[str, str]:
    """The current proposal per resource, row-locked until the transaction ends."""
    rows = conn.execute(
        """
        SELECT resource, proposal_id::text FROM policy_current_proposals
         WHERE incident_id = %s AND resource = ANY(%s::text[])
         ORDER BY resource FOR UPDATE
        """,
        (incident_id, sorted(resources)),
    ).fetchall()
    return {r[0]: r[1] for r in rows}


def resolve(
    conn: psycopg.Connection[Any], proposal_id: str, status: ProposalStatus, *, by: str, resolution: str
) -> bool:
    """Move a pending proposal to ``status``; False when it was no longer pending."""
    row = conn.execute(
        """
        UPDATE policy_proposals SET status = %s, resolved_at = now(), resolved_by = %s, resolution = %s
         WHERE proposal_id = %s AND status = 'pending'
        RETURNING proposal_id
        """,
        (status.value, by, resolution, proposal_id),
    ).fetchone()
    return row is not None


def expire_due(
    conn: psycopg.Connection[Any],
    *,
    at: datetime | None = None,
    proposal_id: str | None = None,
    limit: int = 100,
) -> list[StoredProposal]:
    """Pending proposals past their deadline (``at``, else the database's ``now()``)
    -> expired, each returned by exactly one transaction.

    Two sweeps racing: rows the other has locked are skipped, and the outer WHERE
    re-checks ``status = 'pending'`` on the row version it updates, so a proposal is
    returned (and its expiry emitted) once. Rows this transaction already holds (an
    approval that found its proposal late) are not skipped.
    """
    only = "AND proposal_id = %(proposal)s" if proposal_id is not None else ""
    return _rows(
        conn,
        f"""
        UPDATE policy_proposals
           SET status = 'expired', resolved_at = now(), resolved_by = 'policy-service',
               resolution = 'no valid approval before the deadline'
         WHERE status = 'pending' AND deadline < COALESCE(%(at)s::timestamptz, now())
           AND proposal_id IN (
               SELECT proposal_id FROM policy_proposals
                WHERE status = 'pending' AND deadline < COALESCE(%(at)s::timestamptz, now()) {only}
                ORDER BY deadline
                LIMIT %(limit)s
                FOR UPDATE SKIP LOCKED)
        RETURNING {_COLUMNS}
        """,
        {"at": at, "proposal": proposal_id, "limit": limit},
    )


def cancel_pending(
    conn: psycopg.Connection[Any], incident_id: str, *, resolution: str, except_id: str | None = None
) -> list[str]:
    """Cancel every pending proposal of an incident that was handed to people."""
    rows = conn.execute(
        """
        UPDATE policy_proposals SET status = 'cancelled', resolved_at = now(), resolved_by = 'policy-service',
               resolution = %s
         WHERE incident_id = %s AND status = 'pending' AND proposal_id IS DISTINCT FROM %s::uuid
        RETURNING proposal_id::text
        """,
        (resolution, incident_id, except_id),
    ).fetchall()
    return [r[0] for r in rows]
