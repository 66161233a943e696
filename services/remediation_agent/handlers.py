"""The remediation agent: a diagnosis → RecoveryProposed (or an escalation).

On DependencyFailureSuspected or DiagnosisConcluded the handler only *defers* the
diagnosis (``flotilla.deferred``): one row, committed with the record's claim, so the
partition moves on at once. A worker thread then reads the topology from the evidence
source and asks the reasoner for a plan with no transaction open — a model that takes a minute holds no
lock and delays no other incident — and, in one short transaction, turns the plan's steps
into exact command records with idempotency keys and expiry, digests and signs them,
stores the proposal and emits RecoveryProposed, caused by the diagnosis. Nothing here
authorizes anything: the policy service decides.

A reasoner that cannot plan escalates the incident; evidence that is unavailable, or a
model server that does not answer, is asked again until the work's deadline, then the
incident is escalated.
"""

from __future__ import annotations

import json
import logging
import uuid
from datetime import timedelta
from typing import Any

from flotilla_evidence import EvidenceSource
from flotilla_reasoning import Proposal, Reasoner, ReasoningFailed
from flotilla_reasoning.failures import escalation_reason, record_failure
from flotilla_reasoning.records import DIAGNOSES, read_diagnosis

from flotilla import (
    Finish,
    Handler,
    HandlerContext,
    ServiceContext,
    Work,
    Worker,
    accepting,
    accepts,
    defer,
    escalation,
)
from flotilla.authority import Signer, attest_proposal
from flotilla.digest import canonical_json
from flotilla.records import IncidentEscalated, RecoveryProposed
from services.remediation_agent.plan import InvalidPlan, proposal_value, with_revision_facts
from services.remediation_agent.settings import RemediationSettings

log = logging.getLogger(__name__)

# What a finished plan asks of the incident before it is proposed (or escalated instead).
# Declared to the loop (ServiceSpec.observes) too.
OBSERVES = (accepting(RecoveryProposed.TYPE), accepting(IncidentEscalated.TYPE))

PROPOSE = "propose"  # the kind of deferred work: a diagnosis waiting for a plan


class RemediationAgent:
    """The agent's behaviour; the ServiceSpec wires it to the runtime."""

    def __init__(
        self, settings: RemediationSettings, reasoner: Reasoner, evidence: EvidenceSource, signer: Signer
    ) -> None:
        self.settings = settings
        self.reasoner = reasoner
        self.evidence = evidence
        self.signer = signer  # attests every proposal: the policy service believes nothing else
        self.proposed_by = settings.instance_id or settings.service_name
        self.worker: Worker[Proposal | ReasoningFailed] = Worker(
            PROPOSE,
            gather=self.plan,
            decide=self.decide,
            give_up=self.give_up,
            lease_seconds=settings.propose_lease_seconds,
            retry_seconds=settings.propose_retry_seconds,
        )

    def handlers(self, ctx: ServiceContext) -> dict[str, Handler]:
        return {record_type: self.on_diagnosis for record_type in DIAGNOSES}

    # ------------------------------------------------------------- consumer

    def on_diagnosis(self, ctx: HandlerContext) -> None:
        defer(
            ctx, PROPOSE, contract_topic=RecoveryProposed.TOPIC, deadline_seconds=self.settings.propose_deadline_seconds
        )

    # ------------------------------------------- worker: no transaction open

    def plan(self, ctx: ServiceContext, work: Work) -> Proposal | ReasoningFailed:
        """The slow part: the topology around the service and the reasoner's plan
        (EvidenceUnavailable, or a model server that does not answer, raise: the worker
        tries again later)."""
        diagnosis = read_diagnosis(work.record.record_type, work.record.value)
        topology = self.evidence.snapshot(around=diagnosis.service, environment=diagnosis.environment)
        try:
            proposal = self.reasoner.propose(diagnosis, topology)
        except ReasoningFailed as failure:
            log.warning("%s: %s reasoner failed: %s", diagnosis.incident_id, failure.reasoner, failure.reason)
            return failure
        try:
            return with_revision_facts(proposal, topology)
        except InvalidPlan as exc:
            reasoning = proposal.reasoning
            return ReasoningFailed(
                f"the plan cannot be proposed: {exc}", reasoner=reasoning.reasoner, usage=reasoning.usage
            )

    # ------------------------------------------ worker: one short transaction

    def decide(self, finish: Finish, outcome: Proposal | ReasoningFailed) -> str:
        incident = finish.work.incident_id
        if not accepts(finish.state, RecoveryProposed.TYPE):
            log.info("%s: no proposal, the incident is %s now", incident, finish.state.status)
            return "abandoned"
        if isinstance(outcome, ReasoningFailed):
            finish.spend_tokens(outcome.usage.total)
            return self._escalate(finish, incident, outcome, escalation_reason(outcome, "propose a recovery"))
        finish.spend_tokens(outcome.reasoning.usage.total)
        try:
            value = proposal_value(
                outcome,
                proposal_id=str(uuid.uuid4()),
                proposed_by=self.proposed_by,
                now=finish.now,
                ttl=timedelta(seconds=self.settings.command_ttl_seconds),
            )
        except InvalidPlan as exc:
            # Asking the reasoner again would give the same plan: a person takes over.
            unplannable = ReasoningFailed(str(exc), reasoner=outcome.reasoning.reasoner, usage=outcome.reasoning.usage)
            return self._escalate(finish, incident, unplannable, f"the recovery plan cannot be proposed: {exc}")
        self._propose(finish, outcome, attest_proposal(self.signer, value, now=finish.now))
        return RecoveryProposed.TYPE

    def give_up(self, finish: Finish, error: str) -> str:
        """Still no plan at the work's deadline (the evidence or the model server kept failing)."""
        if not accepts(finish.state, IncidentEscalated.TYPE):
            return "abandoned"
        failure = ReasoningFailed(f"no plan before the deadline ({error[:200]})", reasoner=self.reasoner.name)
        return self._escalate(
            finish, finish.work.incident_id, failure, escalation_reason(failure, "propose a recovery")
        )

    @staticmethod
    def _escalate(ctx: Finish, incident: str, failure: ReasoningFailed, reason: str) -> str:
        envelope = ctx.emit(escalation(incident, reason, cause=ctx.incoming.envelope, at=ctx.now), key=incident)
        record_failure(ctx.conn, incident_id=incident, escalation_event_id=envelope.id, failure=failure)
        return IncidentEscalated.TYPE

    def _propose(self, ctx: Finish, proposal: Proposal, value: dict[str, Any]) -> None:
        """Emit the attested proposal (``value``, as signed) and keep it."""
        proposed = RecoveryProposed.from_value(value)
        envelope = ctx.emit(proposed, key=proposal.incident_id)
        steps = proposed.steps
        usage = proposal.reasoning.usage
        ctx.conn.execute(
            """
            INSERT INTO proposals (proposal_id, incident_id, event_id, diagnosis_event_id, digest, steps,
                idempotency_keys, reasoner, model, confidence, prompt_tokens, completion_tokens, proposed_at,
                expires_at)
            VALUES (%s, %s, %s, %s, %s, %s::jsonb, %s, %s, %s, %s, %s, %s, %s, %s)
            """,
            (
                proposed.proposal_id,
                proposal.incident_id,
                envelope.id,
                proposal.diagnosis_event_id,
                proposed.digest,
                json.dumps(json.loads(canonical_json(steps))),
                [s["idempotencyKey"] for s in steps],
                proposal.reasoning.reasoner,
                proposal.reasoning.model,
                proposal.reasoning.confidence,
                usage.prompt_tokens,
                usage.completion_tokens,
                proposed.proposed_at,
                min(s["expiresAt"] for s in steps),
            ),
        )
        log.info(
            "%s: proposed %s (%s)",
            proposal.incident_id,
            ", ".join(s["idempotencyKey"] for s in steps),
            proposed.digest,
        )
