"""The remediation agent: a diagnosis → RecoveryProposed (or an escalation).

On DependencyFailureSuspected or DiagnosisConcluded the agent reads the topology from
the sim, asks the reasoner for a plan, turns its steps into exact command records with
idempotency keys and expiry, digests them, stores the proposal and emits RecoveryProposed
— one transaction. Nothing here authorizes anything: the policy service decides.
A reasoner that cannot plan escalates the incident; a sim that does not answer makes the
handler fail, so the consumer retries and finally dead-letters the diagnosis.
"""

from __future__ import annotations

import json
import logging
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from flotilla.authority import Signer, attest_proposal
from flotilla.digest import canonical_json
from flotilla.handling import Handler, HandlerContext
from flotilla.runner import ServiceContext
from services.reasoner import Proposal, Reasoner, ReasoningFailed, SimClient
from services.reasoner.failures import escalation_reason, record_failure
from services.reasoner.records import (
    DIAGNOSES,
    INCIDENT_ESCALATED,
    INCIDENTS,
    RECOVERY_PROPOSED,
    diagnosis_from_record,
    escalation_record,
)
from services.remediation_agent.plan import InvalidPlan, proposal_value
from services.remediation_agent.settings import RemediationSettings

log = logging.getLogger(__name__)


class RemediationAgent:
    """The agent's behaviour; the ServiceSpec wires it to the runtime."""

    def __init__(self, settings: RemediationSettings, reasoner: Reasoner, sim: SimClient, signer: Signer) -> None:
        self.settings = settings
        self.reasoner = reasoner
        self.sim = sim
        self.signer = signer  # attests every proposal: the policy service believes nothing else
        self.proposed_by = settings.instance_id or settings.service_name

    def handlers(self, ctx: ServiceContext) -> dict[str, Handler]:
        return {record_type: self.on_diagnosis for record_type in DIAGNOSES}

    def on_diagnosis(self, ctx: HandlerContext) -> None:
        diagnosis = diagnosis_from_record(ctx.incoming.record_type, ctx.incoming.value)
        now = datetime.now(UTC)
        topology = self.sim.snapshot()  # SimUnavailable: retried by the loop, then dead-lettered
        try:
            proposal = self.reasoner.propose(diagnosis, topology)
        except ReasoningFailed as failure:
            log.warning("%s: %s reasoner failed: %s", diagnosis.incident_id, failure.reasoner, failure.reason)
            ctx.spend_tokens(failure.usage.total)
            self._escalate(ctx, diagnosis.incident_id, failure, escalation_reason(failure, "propose a recovery"), now)
            return
        ctx.spend_tokens(proposal.reasoning.usage.total)
        try:
            value = proposal_value(
                proposal,
                proposal_id=str(uuid.uuid4()),
                proposed_by=self.proposed_by,
                now=now,
                ttl=timedelta(seconds=self.settings.command_ttl_seconds),
            )
        except InvalidPlan as exc:
            # Asking the reasoner again would give the same plan: a person takes over.
            unplannable = ReasoningFailed(
                str(exc), reasoner=proposal.reasoning.reasoner, usage=proposal.reasoning.usage
            )
            reason = f"the recovery plan cannot be proposed: {exc}"
            self._escalate(ctx, diagnosis.incident_id, unplannable, reason, now)
            return
        self._propose(ctx, proposal, attest_proposal(self.signer, value, now=now))

    def _escalate(
        self, ctx: HandlerContext, incident: str, failure: ReasoningFailed, reason: str, now: datetime
    ) -> None:
        value = escalation_record(
            incident,
            reason=reason,
            cause_event_id=ctx.incoming.envelope.id,
            cause_type=ctx.incoming.record_type,
            now=now,
        )
        envelope = ctx.emit(INCIDENTS, incident, INCIDENT_ESCALATED, value)
        record_failure(ctx.conn, incident_id=incident, escalation_event_id=envelope.id, failure=failure)

    def _propose(self, ctx: HandlerContext, proposal: Proposal, value: dict[str, Any]) -> None:
        proposal_id = value["proposalId"]
        envelope = ctx.emit(INCIDENTS, proposal.incident_id, RECOVERY_PROPOSED, value)
        steps: list[dict[str, Any]] = value["steps"]
        usage = proposal.reasoning.usage
        ctx.conn.execute(
            """
            INSERT INTO proposals (proposal_id, incident_id, event_id, diagnosis_event_id, digest, steps,
                idempotency_keys, reasoner, model, confidence, prompt_tokens, completion_tokens, proposed_at,
                expires_at)
            VALUES (%s, %s, %s, %s, %s, %s::jsonb, %s, %s, %s, %s, %s, %s, %s, %s)
            """,
            (
                proposal_id,
                proposal.incident_id,
                envelope.id,
                proposal.diagnosis_event_id,
                value["digest"],
                json.dumps(json.loads(canonical_json(steps))),
                [s["idempotencyKey"] for s in steps],
                proposal.reasoning.reasoner,
                proposal.reasoning.model,
                proposal.reasoning.confidence,
                usage.prompt_tokens,
                usage.completion_tokens,
                value["proposedAt"],
                min(s["expiresAt"] for s in steps),
            ),
        )
        log.info(
            "%s: proposed %s (%s)",
            proposal.incident_id,
            ", ".join(s["idempotencyKey"] for s in steps),
            value["digest"],
        )
