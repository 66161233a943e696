"""A person's decision on a pending proposal, and the expiry of those nobody decided.

Both run outside the consumer loop (an HTTP request, a timer), so they open their own
transaction and write with ``ServiceContext.emit``, continuing the chain of the
HumanApprovalRequired the proposal is waiting under.

An approval re-checks everything on locked rows just before it authorizes: the incident
workflow row (so no newer proposal is being recorded meanwhile), the current-proposal
rows of every resource the plan touches (it must still be the current one), the
proposal row (still pending, same digest, deadline not passed, its stored steps still
hashing to that digest), and the policies themselves (the plan, approved by a person,
must still be allowed).

Before that it asks the platform whether the plan's targets still exist. A proposal whose
target has left the estate could only become a command the executor refuses, so it is
*withdrawn* (RecoveryRejected by this service, and the incident escalated: a person
decides what the incident needs now) rather than approved; a periodic check withdraws
such proposals before anyone tries (:func:`withdraw_orphaned`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from prometheus_client import Counter, Gauge

from flotilla import Envelope, Record, ServiceContext, WorkflowStore, escalation
from flotilla.authority import Grant
from flotilla.records import ApprovalExpired, RecoveryApproved, RecoveryRejected
from services.policy import records, store
from services.policy.approval_rules import (
    Action,
    ProposalStatus,
    Refusal,
    check_change,
    check_digest,
    check_incident,
    check_open,
    check_person,
    check_request,
    check_stored_changes,
    check_stored_steps,
)
from services.policy.auth import Person
from services.policy.commands import epoch_ms
from services.policy.decide import Outcome, Target
from services.policy.inventory import missing
from services.policy.runtime import PolicyRuntime

log = logging.getLogger(__name__)

PERSON_DECISIONS = Counter(
    "flotilla_policy_person_decisions_total", "Approvals and rejections over HTTP", ["action", "result"]
)
EXPIRED = Counter("flotilla_policy_approvals_expired_total", "Pending approvals that expired")
WITHDRAWN = Counter(
    "flotilla_policy_approvals_withdrawn_total",
    "Pending approvals withdrawn because a target of the plan no longer exists in the estate",
)
PENDING = Gauge(
    "flotilla_policy_approvals_pending", "Proposals waiting for a person's decision (counted at every expiry sweep)."
)


@dataclass(frozen=True)
class Decided:
    """What the HTTP caller gets back after a decision was recorded."""

    proposal_id: str
    incident_id: str
    status: ProposalStatus
    by: str
    event_ids: dict[str, str] = field(default_factory=dict)  # record type short name -> ce_id
    command_ids: list[str] = field(default_factory=list)


def decide_by_person(
    svc: ServiceContext,
    runtime: PolicyRuntime,
    *,
    proposal_id: str,
    person: Person,
    action: Action,
    digest: str,
    reason: str | None = None,
    change_digest: str | None = None,
) -> Decided:
    """Approve or reject; raises Refusal (with the HTTP status) when it may not. An approval
    names the proposal's ``digest`` and, when its targets' dry runs showed the person the
    changes, their ``change_digest`` (services/policy/preview.py)."""
    try:
        result = _decide(svc, runtime, proposal_id, person, action, digest, reason, change_digest)
    except Refusal as refusal:
        PERSON_DECISIONS.labels(action.value, str(refusal.status)).inc()
        if refusal.expire:
            expire(svc, proposal_id=proposal_id)  # its own transaction: the expiry stands
        if refusal.withdraw:
            withdraw(svc, proposal_id=proposal_id, reason=refusal.detail)  # likewise
        raise
    PERSON_DECISIONS.labels(action.value, "200").inc()
    return result


def _decide(
    svc: ServiceContext,
    runtime: PolicyRuntime,
    proposal_id: str,
    person: Person,
    action: Action,
    digest: str,
    reason: str | None,
    change_digest: str | None,
) -> Decided:
    with svc.pool.connection() as conn, conn.transaction():
        # Unlocked first look: answer who-are-you and what-did-you-name without locking.
        found = store.get(conn, proposal_id)
        if found is None:
            raise Refusal(404, f"no proposal {proposal_id}")
        check_person(runtime.engine, action, person, found.view())
        check_digest(found.view(), digest)
        if action is Action.APPROVE:
            check_change(found.view(), change_digest)
        check_open(found.view(), svc.now())
        if action is Action.APPROVE and (gone := missing(runtime.inventory, found.targets)):
            raise Refusal(409, f"proposal {proposal_id} is withdrawn: {gone_from_estate(gone)}", withdraw=True)

        # Lock in the service's one order: workflow row, current rows, proposal row.
        incident = WorkflowStore.load_for_update(conn, found.incident_id)
        current = store.lock_current(conn, found.incident_id, found.resources)
        locked = store.get(conn, proposal_id, lock=True)
        assert locked is not None  # proposals are never deleted
        now = svc.now()
        person_check = check_request(runtime.engine, action, person, locked.view(), digest, now)
        check_incident(locked.view(), incident.status)
        stale = {r: p for r, p in ((r, current.get(r)) for r in locked.resources) if p != proposal_id}
        if stale:
            detail = ", ".join(f"{r} (current: {p or 'none'})" for r, p in sorted(stale.items()))
            raise Refusal(409, f"proposal {proposal_id} is no longer the current proposal for {detail}")

        if action is Action.APPROVE:
            check_change(locked.view(), change_digest)
            check_stored_steps(locked.view(), locked.steps)  # what would be signed is what was proposed
            check_stored_changes(locked.view(), locked.changes)  # and bound to what was shown
            recheck = runtime.engine.decide(locked.proposal_facts(), epoch_ms(now), human_approved=True)
            if recheck.outcome is not Outcome.AUTO:
                raise Refusal(
                    409,
                    "policy no longer allows this plan: " + "; ".join(recheck.reasons),
                    policy_ids=recheck.policy_ids,
                )
            return _approve(svc, runtime, conn, locked, person, person_check.policy_ids, now)
        return _reject(svc, conn, locked, person, reason, now)


def _about(
    svc: ServiceContext,
    conn: psycopg.Connection[Any],
    proposal: store.StoredProposal,
    record: Record,
    *,
    cause: Envelope,
) -> Envelope:
    """A record about ``proposal``: keyed and correlated by its incident, in the caller's
    transaction."""
    return svc.emit(conn, record, key=proposal.incident_id, correlation=proposal.incident_id, cause=cause)


def _approve(
    svc: ServiceContext,
    runtime: PolicyRuntime,
    conn: psycopg.Connection[Any],
    proposal: store.StoredProposal,
    person: Person,
    policy_ids: list[str],
    now: datetime,
) -> Decided:
    if not store.resolve(conn, proposal.proposal_id, ProposalStatus.APPROVED, by=person.name, resolution="approved"):
        raise Refusal(409, f"proposal {proposal.proposal_id} is no longer pending")
    approved = _about(
        svc,
        conn,
        proposal,
        RecoveryApproved(
            incident_id=proposal.incident_id,
            proposal_id=proposal.proposal_id,
            digest=proposal.digest,
            approved_by=person.name,
            auto=False,
            policy_ids=tuple(policy_ids),
            approved_at=now,
            change_digest=proposal.change_digest,
        ),
        cause=proposal.request_envelope(),
    )
    issued = records.issue_commands(
        lambda command, envelope, key: svc.outbox.append(conn, command, envelope, key=key),
        cause=approved,
        source=svc.source,
        commands=proposal.command_records(),
        signer=runtime.signer,
        decision=Grant.APPROVED,
        approved_by=person.name,
        proposal_digest=proposal.digest,
        at=now,
        expected_changes=proposal.expected_changes(),
    )
    log.info("proposal %s approved by %s: %d command(s) issued", proposal.proposal_id, person.name, len(issued))
    return Decided(
        proposal.proposal_id,
        proposal.incident_id,
        ProposalStatus.APPROVED,
        person.name,
        {"RecoveryApproved": approved.id},
        [e.id for e in issued],
    )


def _reject(
    svc: ServiceContext,
    conn: psycopg.Connection[Any],
    proposal: store.StoredProposal,
    person: Person,
    reason: str | None,
    now: datetime,
) -> Decided:
    why = (reason or "").strip() or f"rejected by {person.name}"
    rejected, escalated = _refuse(svc, conn, proposal, ProposalStatus.REJECTED, by=person.name, why=why, now=now)
    if rejected is None or escalated is None:
        raise Refusal(409, f"proposal {proposal.proposal_id} is no longer pending")
    log.info("proposal %s rejected by %s: %s", proposal.proposal_id, person.name, why)
    return Decided(
        proposal.proposal_id,
        proposal.incident_id,
        ProposalStatus.REJECTED,
        person.name,
        {"RecoveryRejected": rejected.id, "IncidentEscalated": escalated.id},
    )


def _refuse(
    svc: ServiceContext,
    conn: psycopg.Connection[Any],
    proposal: store.StoredProposal,
    status: ProposalStatus,
    *,
    by: str,
    why: str,
    now: datetime,
) -> tuple[Envelope | None, Envelope | None]:
    """Resolve a pending proposal as ``status`` and say so: RecoveryRejected, then the
    incident escalated to people. (None, None) when it was no longer pending."""
    if not store.resolve(conn, proposal.proposal_id, status, by=by, resolution=why):
        return None, None
    rejected = _about(
        svc,
        conn,
        proposal,
        RecoveryRejected(
            incident_id=proposal.incident_id,
            proposal_id=proposal.proposal_id,
            digest=proposal.digest,
            rejected_by=by,
            reason=why,
            rejected_at=now,
        ),
        cause=proposal.request_envelope(),
    )
    escalated = _about(
        svc,
        conn,
        proposal,
        escalation(
            proposal.incident_id,
            f"{by} {'withdrew' if status is ProposalStatus.WITHDRAWN else 'rejected'} proposal "
            f"{proposal.proposal_id} ({proposal.summary}): {why}",
            cause=rejected,
            at=now,
        ),
        cause=rejected,
    )
    return rejected, escalated


def gone_from_estate(targets: list[Target]) -> str:
    names = ", ".join(t.key for t in targets)
    verb = "exists" if len(targets) == 1 else "exist"
    return f"{names} no longer {verb} in the estate, so no command for it could run"


def withdraw(svc: ServiceContext, *, proposal_id: str, reason: str) -> bool:
    """Withdraw a pending proposal on the policy service's own account (RecoveryRejected by
    it, then IncidentEscalated), exactly once however many callers race; False when it was
    no longer pending."""
    with svc.pool.connection() as conn, conn.transaction():
        proposal = store.get(conn, proposal_id)
        if proposal is None:
            return False
        rejected, _ = _refuse(
            svc, conn, proposal, ProposalStatus.WITHDRAWN, by=svc.spec.name, why=reason, now=svc.now()
        )
    if rejected is None:
        return False
    WITHDRAWN.inc()
    log.warning("proposal %s withdrawn; incident %s escalated: %s", proposal_id, proposal.incident_id, reason)
    return True


def withdraw_orphaned(svc: ServiceContext, runtime: PolicyRuntime, *, limit: int = 100) -> list[str]:
    """The periodic check: withdraw every pending proposal a target of which the platform
    says no longer exists. The look-ups run with no transaction open (the inventory is a
    remote API); :func:`withdraw` re-checks that the proposal is still pending."""
    with svc.pool.connection() as conn:
        pending = store.listing(conn, ProposalStatus.PENDING, limit=limit)
    withdrawn = []
    for proposal in pending:
        if svc.stopping.is_set():
            break
        gone = missing(runtime.inventory, proposal.targets)
        if gone and withdraw(svc, proposal_id=proposal.proposal_id, reason=gone_from_estate(gone)):
            withdrawn.append(proposal.proposal_id)
    return withdrawn


def expire(svc: ServiceContext, *, proposal_id: str | None = None, limit: int = 100) -> list[str]:
    """Expire pending proposals past their deadline: ApprovalExpired + IncidentEscalated
    each, exactly once however many sweeps (or late approvals) race. Returns their ids."""
    with svc.pool.connection() as conn, conn.transaction():
        now = svc.now()
        due = store.expire_due(conn, at=now if proposal_id is not None else None, proposal_id=proposal_id, limit=limit)
        for proposal in due:
            assert proposal.deadline is not None
            expired = _about(
                svc,
                conn,
                proposal,
                ApprovalExpired(
                    incident_id=proposal.incident_id,
                    proposal_id=proposal.proposal_id,
                    digest=proposal.digest,
                    required_role=proposal.required_role,
                    deadline=proposal.deadline,
                    expired_at=now,
                ),
                cause=proposal.request_envelope(),
            )
            _about(
                svc,
                conn,
                proposal,
                escalation(
                    proposal.incident_id,
                    f"no approver decided on proposal {proposal.proposal_id} ({proposal.summary}) "
                    f"before its deadline {proposal.deadline.isoformat()}",
                    cause=expired,
                    at=now,
                ),
                cause=expired,
            )
            EXPIRED.inc()
            log.info(
                "approval of proposal %s expired; incident %s escalated", proposal.proposal_id, proposal.incident_id
            )
    return [p.proposal_id for p in due]


def sweep(svc: ServiceContext) -> None:
    """The periodic task: expire what is due, in batches, until nothing is; then count
    what is still waiting for a person."""
    while len(expire(svc)) == 100 and not svc.stopping.is_set():
        pass
    with svc.pool.connection() as conn:
        PENDING.set(store.count_pending(conn))
