"""What the policy service does with the records it consumes.

RecoveryProposed: check it (attestation, digest, steps, and that the diagnosis and incident
it rests on are facts this service verified: services/policy/basis.py), decide, make it the current proposal for its
incident and resources (superseding older pending ones), record proposal and decision,
and emit — RecoveryApproved(auto) plus the commands, HumanApprovalRequired (with the
exact change each step makes, as its target's dry run shows it: services/policy/preview.py), or
CommandDenied and IncidentEscalated (always so in a dry run: nothing of the plan runs, so a
person takes the incident). IncidentEscalated: the incident is in people's hands now, so
its pending approvals are cancelled.

All of it in the consumer's transaction: the loop has already deduplicated the record
and checked the incident workflow accepts it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from prometheus_client import Counter

from flotilla import (
    BusinessRuleViolation,
    Envelope,
    Handler,
    HandlerContext,
    RecordRefused,
    Report,
    ServiceContext,
    escalation,
)
from flotilla.authority import Grant, Unauthorized, verify_proposal
from flotilla.deadletter import Reason
from flotilla.records import CommandDenied, HumanApprovalRequired, IncidentEscalated, RecoveryProposed
from services.policy import basis, preview, records, store
from services.policy.approval_rules import ProposalStatus
from services.policy.commands import command_record, epoch_ms, from_epoch_ms
from services.policy.decide import Decision, Outcome, dry_run_reasons
from services.policy.proposals import InvalidProposal, Proposal, read_proposal
from services.policy.runtime import PolicyRuntime

log = logging.getLogger(__name__)

DECISIONS = Counter("flotilla_policy_decisions_total", "Policy decisions on proposals", ["outcome", "dry_run"])
FORGED = Counter(
    "flotilla_policy_unattested_proposals_total",
    "Proposals refused because no trusted remediation agent signed them, by refusal.",
    ["refusal"],
)

UNSUPPORTED = Counter(
    "flotilla_policy_unsupported_proposals_total",
    "Attested proposals refused because the diagnosis or incident they rest on is no fact this service verified.",
)


def approval_deadline(now: datetime, ttl_seconds: float, proposal: Proposal) -> datetime:
    """now + TTL, but never later than the first step's expiresAt: an approval that
    arrives after a command expired could only issue a command the executor refuses."""
    return min(now + timedelta(seconds=ttl_seconds), from_epoch_ms(proposal.earliest_expiry_ms))


def make_handlers(svc: ServiceContext, runtime: PolicyRuntime) -> Mapping[str, Handler]:
    def on_recovery_proposed(ctx: HandlerContext) -> None:
        handle_proposal(svc, runtime, ctx)

    def on_incident_escalated(ctx: HandlerContext) -> None:
        escalated = ctx.incoming.typed(IncidentEscalated)
        incident = escalated.incident_id
        cancelled = store.cancel_pending(ctx.conn, incident, resolution=f"incident escalated: {escalated.reason}")
        if cancelled:
            log.info("incident %s escalated: cancelled pending approvals %s", incident, ", ".join(cancelled))

    return {
        RecoveryProposed.TYPE: on_recovery_proposed,
        IncidentEscalated.TYPE: on_incident_escalated,
        **dict.fromkeys(basis.REMEMBERED, basis.remember),
    }


def handle_proposal(svc: ServiceContext, runtime: PolicyRuntime, ctx: HandlerContext) -> None:
    try:
        # First: whatever else it says, a proposal no remediation agent signed is nobody's
        # (its proposedBy and confidence are anyone's to write) and supersedes nothing.
        verify_proposal(runtime.proposers, ctx.incoming.value)
    except Unauthorized as exc:
        FORGED.labels(exc.refusal.value).inc()
        raise RecordRefused(Reason.UNAUTHORIZED, f"RecoveryProposed refused ({exc.refusal.value}): {exc}") from exc
    try:
        proposal = read_proposal(ctx.incoming.value, correlation_id=ctx.incoming.envelope.correlationid)
    except InvalidProposal as exc:
        raise BusinessRuleViolation(f"RecoveryProposed refused: {exc}") from exc
    # Then: what it was planned from must be facts this service verified itself.
    try:
        diagnosis = basis.verified_diagnosis(ctx.conn, proposal.incident_id, proposal.diagnosis_event_id)
    except basis.Unsupported as exc:
        problem = str(exc)
        UNSUPPORTED.inc()
        # The agent's own plan, refused: the incident has none now, so a person takes it
        # (reported once, even if the record is delivered again).
        reason = f"the remediation agent's plan {proposal.proposal_id} was refused: {problem}"
        report = Report(proposal.incident_id, escalation(proposal.incident_id, reason, cause=ctx.incoming.envelope))
        refusal = f"RecoveryProposed {proposal.proposal_id} refused: {problem}"
        raise RecordRefused(Reason.UNAUTHORIZED, refusal, report) from exc

    existing = store.get(ctx.conn, proposal.proposal_id)
    if existing is not None:
        if existing.digest != proposal.digest:
            raise BusinessRuleViolation(
                f"proposal {proposal.proposal_id} was already received with other steps (digest {existing.digest})"
            )
        log.info("proposal %s received again under a new event id: already decided", proposal.proposal_id)
        return

    now = svc.now()
    # The diagnosis' reasoner from its verified record: a plan is no more trusted than it.
    facts = proposal.facts(runtime.inventory.current_replicas, diagnosis_reasoner=diagnosis.reasoner)
    decision = runtime.engine.decide(facts, epoch_ms(now))
    superseded = store.make_current(ctx.conn, proposal.incident_id, proposal.resources, proposal.proposal_id)
    if superseded:
        log.info("proposal %s supersedes %s", proposal.proposal_id, ", ".join(superseded))

    deadline: datetime | None = None
    request: Envelope | None = None
    changes: list[dict[str, Any]] | None = None
    change_digest: str | None = None
    reasons, policy_ids = decision.reasons, decision.policy_ids
    if runtime.dry_run:
        status = ProposalStatus.DRY_RUN
        reasons = dry_run_reasons(decision)
        _deny(ctx, proposal, decision, reasons, now)
    elif decision.outcome is Outcome.AUTO:
        status = ProposalStatus.AUTHORIZED
        approval = records.auto_approval(proposal, policy_ids, approved_by=svc.spec.name, at=now)
        approved = ctx.emit(approval, key=proposal.incident_id)
        records.issue_commands(
            ctx.emit_as,
            cause=approved,
            source=svc.source,
            commands=[command_record(step) for step in proposal.steps],
            signer=runtime.signer,
            decision=Grant.AUTO,
            approved_by=svc.spec.name,
            proposal_digest=proposal.digest,
            at=now,
        )
    elif decision.outcome is Outcome.HUMAN:
        status = ProposalStatus.PENDING
        deadline = approval_deadline(now, runtime.approval_ttl_seconds, proposal)
        # What each step would change, as its target's dry run shows it: the person is
        # shown it and approves it by its digest. Bounded, and never a reason to fail.
        previews = preview.preview_steps(runtime.previewer, facts.steps, timeout=runtime.preview_timeout_seconds)
        changes, change_digest = preview.to_json(previews), preview.changes_digest(previews)
        required = HumanApprovalRequired(
            incident_id=proposal.incident_id,
            proposal_id=proposal.proposal_id,
            digest=proposal.digest,
            summary=proposal.summary,
            reasons=tuple(reasons),
            policy_ids=tuple(policy_ids),
            required_role=runtime.required_role,
            proposed_by=proposal.proposed_by,
            deadline=deadline,
            requested_at=now,
            change_digest=change_digest,
        )
        request = ctx.emit(required, key=proposal.incident_id)
    else:
        status = ProposalStatus.DENIED
        _deny(ctx, proposal, decision, reasons, now)

    store.insert(
        ctx.conn,
        store.NewProposal(
            proposal_id=proposal.proposal_id,
            incident_id=proposal.incident_id,
            proposed_by=proposal.proposed_by,
            proposal_event_id=ctx.incoming.envelope.id,
            digest=proposal.digest,
            steps=proposal.steps,
            resources=proposal.resources,
            summary=proposal.summary,
            facts=facts,
            decision=decision,
            dry_run=runtime.dry_run,
            status=status,
            required_role=runtime.required_role,
            deadline=deadline,
            proposed_at=proposal.proposed_at,
            decided_at=now,
            request=request,
            reasons=reasons,
            policy_ids=policy_ids,
            changes=changes,
            change_digest=change_digest,
        ),
    )
    DECISIONS.labels(decision.outcome.value, str(runtime.dry_run).lower()).inc()
    log.info(
        "proposal %s of %s: %s%s (%s)",
        proposal.proposal_id,
        proposal.incident_id,
        decision.outcome.value,
        " [dry run]" if runtime.dry_run else "",
        "; ".join(reasons),
    )


def _deny(ctx: HandlerContext, proposal: Proposal, decision: Decision, reasons: list[str], now: datetime) -> None:
    """CommandDenied, and the incident to a person: nothing of the plan runs, and nothing
    else would ever move the incident on (a denial used to leave it DENIED, unseen)."""
    denied = CommandDenied(
        incident_id=proposal.incident_id,
        proposal_id=proposal.proposal_id,
        digest=proposal.digest,
        command_id=decision.denied_command_id if decision.outcome is Outcome.DENY else None,
        reasons=tuple(reasons),
        policy_ids=tuple(decision.policy_ids),
        denied_at=now,
    )
    cause = ctx.emit(denied, key=proposal.incident_id)
    reason = f"policy denied proposal {proposal.proposal_id} ({proposal.summary}): {'; '.join(reasons)}"
    ctx.emit_as(
        escalation(proposal.incident_id, reason, cause=cause, at=now),
        cause.caused(IncidentEscalated.TYPE, cause.source),
        proposal.incident_id,
    )
