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
from services.remediation_agent.plan import proposal_value
from services.remediation_agent.settings import RemediationSettings

log = logging.getLogger(__name__)


class RemediationAgent:
    """The agent's behaviour; the ServiceSpec wires it to the runtime."""

    def __init__(self, settings: RemediationSettings, reasoner: Reasoner, sim: SimClient) -> None:
        self.settings = settings
        self.reasoner = reasoner
        self.sim = sim
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
            value = escalation_record(
                diagnosis.incident_id,
                reason=escalation_reason(failure, "propose a recovery"),
                cause_event_id=ctx.incoming.envelope.id,
                cause_type=ctx.incoming.record_type,
                now=now,
            )
            envelope = ctx.emit(INCIDENTS, diagnosis.incident_id, INCIDENT_ESCALATED, value)
            record_failure(
                ctx.conn, incident_id=diagnosis.incident_id, escalation_event_id=envelope.id, failure=failure
            )
            return
        ctx.spend_tokens(proposal.reasoning.usage.total)
        self._propose(ctx, proposal, diagnosis.service, now)

    def _propose(self, ctx: HandlerContext, proposal: Proposal, diagnosed_service: str, now: datetime) -> None:
        proposal_id = str(uuid.uuid4())
        ttl = timedelta(seconds=self.settings.command_ttl_seconds)
        value = proposal_value(
            proposal,
            proposal_id=proposal_id,
            proposed_by=self.proposed_by,
            diagnosed_service=diagnosed_service,
            now=now,
            ttl=ttl,
        )
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
