"""The diagnostic agent: DiagnosisRequested → a diagnosis, now or after a slow job.

On DiagnosisRequested the agent reads the evidence around the service (its evidence
source: services, dependencies, latencies, history) plus the baselines it learned, asks
the reasoner, and emits DependencyFailureSuspected or DiagnosisConcluded caused by the
request. It starts a slow diagnostic job instead — DiagnosticJobStarted now, the job in
its table, the diagnosis later from a periodic task — when configured to
(``FLOTILLA_DIAGNOSTIC_JOB_SECONDS``), when the reasoner asks for more evidence, or when
the evidence is unavailable (the job retries until its deadline). A reasoner
that cannot decide escalates the incident (IncidentEscalated); its answer stays in the
``reasoning_failures`` table and never reaches a topic.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from flotilla_evidence import EvidenceSource, EvidenceUnavailable, Topology
from flotilla_reasoning import Diagnosis, DiagnosticEvidence, Reasoner, ReasoningFailed
from flotilla_reasoning.failures import escalation_reason, record_failure
from flotilla_reasoning.model import Verdict
from flotilla_reasoning.records import diagnosis_record

from flotilla import (
    Envelope,
    Finish,
    Handler,
    HandlerContext,
    Heartbeat,
    Record,
    ServiceContext,
    Status,
    Work,
    Worker,
    WorkflowStore,
    defer,
    escalation,
)
from flotilla.records import DiagnosisRequested, DiagnosticJobStarted
from services.diagnostic_agent import baselines, jobs
from services.diagnostic_agent.settings import DiagnosticSettings

log = logging.getLogger(__name__)

# Where a diagnosis (or a job towards one) still matters: any later state means someone
# else moved the incident on. Declared to the loop (ServiceSpec.observes) too.
STILL_DIAGNOSING = frozenset({Status.NEW, Status.DIAGNOSING})

PROBE_JOB = "dependency-probe"
DIAGNOSE = "diagnose"  # the kind of deferred work: a request waiting for evidence and a verdict

# Emits one record for the incident at hand, caused by what the agent is answering.
Emit = Callable[[Record], Envelope]


def evidence_for(request: DiagnosisRequested, topology: Topology) -> DiagnosticEvidence:
    """What the reasoner is given for a first look at a request (no job has run yet)."""
    return DiagnosticEvidence(
        request.incident_id,
        request.service,
        request.environment,
        request.symptom,
        topology,
        requested_at=request.requested_at,
    )


class DiagnosticAgent:
    """The agent's behaviour; the ServiceSpec wires it to the runtime."""

    def __init__(self, settings: DiagnosticSettings, reasoner: Reasoner, evidence: EvidenceSource) -> None:
        self.settings = settings
        self.reasoner = reasoner
        self.evidence = evidence
        self.started_by = settings.instance_id or settings.service_name
        self.worker: Worker[Diagnosis | ReasoningFailed | EvidenceUnavailable] = Worker(
            DIAGNOSE,
            gather=self.observe_and_reason,
            decide=self.decide,
            give_up=self.give_up,
            lease_seconds=settings.diagnose_lease_seconds,
            retry_seconds=settings.diagnostic_job_retry_seconds,
        )

    def handlers(self, ctx: ServiceContext) -> dict[str, Handler]:
        return {DiagnosisRequested.TYPE: self.on_diagnosis_requested}

    # ------------------------------------------------------------- consumer

    def on_diagnosis_requested(self, ctx: HandlerContext) -> None:
        """Nothing slow here: a slow job at once, or the request deferred to a worker that
        observes and reasons with no transaction open (``flotilla.deferred``)."""
        if self.settings.diagnostic_job_seconds > 0:
            request = ctx.incoming.typed(DiagnosisRequested)
            self._start_job(ctx, request, PROBE_JOB, self.settings.diagnostic_job_seconds, datetime.now(UTC))
            return
        deadline = self.settings.diagnostic_job_deadline_seconds
        defer(ctx, DIAGNOSE, contract_topic=DiagnosisRequested.TOPIC, deadline_seconds=deadline)

    # ------------------------------------------- worker: no transaction open

    def observe_and_reason(self, ctx: ServiceContext, work: Work) -> Diagnosis | ReasoningFailed | EvidenceUnavailable:
        """The slow part of a diagnosis: the evidence, the baselines (one quick read) and
        the reasoner. Evidence that is unavailable is returned, not raised: a job retries it."""
        request = work.record.typed(DiagnosisRequested)
        try:
            snapshot = self.evidence.snapshot(around=request.service, environment=request.environment)
        except EvidenceUnavailable as exc:
            return exc
        with ctx.pool.connection() as conn:
            topology = baselines.with_baselines(conn, snapshot)
        return self._reason(evidence_for(request, topology))

    # ------------------------------------------ worker: one short transaction

    def decide(self, finish: Finish, outcome: Diagnosis | ReasoningFailed | EvidenceUnavailable) -> str:
        request = finish.incoming.typed(DiagnosisRequested)
        if finish.state.status not in STILL_DIAGNOSING:
            log.info("%s: no diagnosis, the incident is %s now", request.incident_id, finish.state.status)
            return "abandoned"
        now = finish.now
        if isinstance(outcome, EvidenceUnavailable):
            log.warning("%s: no evidence yet (%s); retrying in a job", request.incident_id, outcome)
            return self._start_job(finish, request, PROBE_JOB, self.settings.diagnostic_job_retry_seconds, now)
        finish.spend_tokens(
            outcome.usage.total if isinstance(outcome, ReasoningFailed) else outcome.reasoning.usage.total
        )

        emit = _finish_emitter(finish, request.incident_id)
        if isinstance(outcome, ReasoningFailed):
            envelope = self._escalate(finish.conn, emit, request.incident_id, outcome, finish.incoming.envelope, now)
            return envelope.type
        if outcome.verdict is Verdict.NEEDS_EVIDENCE:
            seconds = self.settings.diagnostic_evidence_job_seconds
            return self._start_job(finish, request, outcome.job_kind or PROBE_JOB, seconds, now)
        return self._emit_diagnosis(finish.conn, emit, outcome, None, now).type

    def give_up(self, finish: Finish, error: str) -> str:
        """The reasoner kept failing (not the evidence: that becomes a job) until the deadline."""
        incident = finish.work.incident_id
        if finish.state.status not in STILL_DIAGNOSING:
            return "abandoned"
        emit = _finish_emitter(finish, incident)
        failure = ReasoningFailed(f"no diagnosis before the deadline ({error[:200]})", reasoner=self.reasoner.name)
        return self._escalate(finish.conn, emit, incident, failure, finish.incoming.envelope, finish.now).type

    def _start_job(
        self, ctx: HandlerContext | Finish, request: DiagnosisRequested, kind: str, seconds: float, now: datetime
    ) -> str:
        job_id = str(uuid.uuid4())
        due = now + timedelta(seconds=seconds)
        deadline = due + timedelta(seconds=self.settings.diagnostic_job_deadline_seconds)
        job = DiagnosticJobStarted(
            incident_id=request.incident_id,
            job_id=job_id,
            job_kind=kind,
            service=request.service,
            started_by=self.started_by,
            deadline=deadline,
            started_at=now,
        )
        started = ctx.emit(job, key=request.incident_id)
        jobs.insert(
            ctx.conn,
            job_id=job_id,
            incident_id=request.incident_id,
            service=request.service,
            environment=request.environment,
            symptom=request.symptom,
            job_kind=kind,
            due_at=due,
            deadline=deadline,
            request=ctx.incoming.envelope,
            started=started,
        )
        log.info("%s: %s job %s due %s", request.incident_id, kind, job_id, due.isoformat())
        return DiagnosticJobStarted.TYPE

    # ------------------------------------------------------ periodic: jobs

    def finish_due_jobs(self, ctx: ServiceContext, now: datetime | None = None) -> int:
        """Finish every job that is due; returns how many were taken (finished or postponed)."""
        taken = 0
        while not ctx.stopping.is_set():
            if self.finish_one(ctx, now) is None:
                break
            taken += 1
        return taken

    def finish_one(self, ctx: ServiceContext, now: datetime | None = None) -> str | None:
        """Finish one due job; returns what came of it (the emitted record type,
        ``abandoned`` or ``postponed``), None when none is due.

        Three steps, like ``flotilla.deferred``: lease the job (a short transaction that
        moves its due time past the lease, so no other instance takes it meanwhile); read
        the evidence and ask the reasoner with no transaction open; then, in one short
        transaction, take the job for good (``running`` → ``done``, which only one
        instance can do) and emit its result. A crash in between leaves the job running:
        it is due again when the lease runs out."""
        now = now or ctx.now()
        lease = timedelta(seconds=self.settings.diagnose_lease_seconds)
        with ctx.pool.connection() as conn, conn.transaction():
            job = jobs.lease_due(conn, now, until=now + lease)
        if job is None:
            return None
        with ctx.pool.connection() as conn:
            status = WorkflowStore.status_of(conn, job.incident_id)
        if status is not None and status is not Status.DIAGNOSING:
            log.info("diagnostic job %s abandoned: incident %s is %s", job.job_id, job.incident_id, status.value)
            return self._conclude(ctx, job, now, "abandoned")
        try:
            with Heartbeat(
                self._lease_keeper(ctx, job.job_id, now + lease), lease.total_seconds() / 3, "diagnostic job"
            ):
                outcome: Diagnosis | ReasoningFailed = self._reason(self._evidence_for(ctx, job))
        except Exception as exc:  # the evidence was unavailable, or anything else went wrong
            error = f"{exc.__class__.__name__}: {exc}"
            log.warning("diagnostic job %s could not finish: %s", job.job_id, error)
            if now < job.deadline:
                return self._postpone(ctx, job, now, error)
            what = "no evidence" if isinstance(exc, EvidenceUnavailable) else "no diagnosis"
            outcome = ReasoningFailed(f"{what} before the job's deadline ({error[:200]})", reasoner=self.reasoner.name)
        if not isinstance(outcome, ReasoningFailed) and outcome.verdict is Verdict.NEEDS_EVIDENCE:
            usage = outcome.reasoning.usage
            outcome = ReasoningFailed(
                "it asked for more evidence after the job had run", reasoner=self.reasoner.name, usage=usage
            )
        return self._conclude(ctx, job, now, outcome)

    def _lease_keeper(self, ctx: ServiceContext, job_id: str, held_until: datetime) -> Callable[[], bool]:
        """A heartbeat's renew for one leased job: the lease moves on from the real clock
        (never back), so a slow evidence source or model keeps the job and a killed worker does not."""
        lease = timedelta(seconds=self.settings.diagnose_lease_seconds)
        held = [held_until]

        def renew() -> bool:
            until = max(held[0], datetime.now(UTC) + lease)
            with ctx.pool.connection() as conn:
                if not jobs.extend_lease(conn, job_id, held_until=held[0], until=until):
                    return False
            held[0] = until
            return True

        return renew

    def _evidence_for(self, ctx: ServiceContext, job: jobs.Job) -> DiagnosticEvidence:
        # EvidenceUnavailable: the job is postponed, or gives up at its deadline
        snapshot = self.evidence.snapshot(around=job.service, environment=job.environment)
        with ctx.pool.connection() as conn:
            topology = baselines.with_baselines(conn, snapshot)
        return DiagnosticEvidence(
            job.incident_id,
            job.service,
            job.environment,
            job.symptom,
            topology,
            job_id=job.job_id,
            job_kind=job.job_kind,
            may_request_more=False,
        )

    def _postpone(self, ctx: ServiceContext, job: jobs.Job, now: datetime, error: str) -> str:
        with ctx.pool.connection() as conn, conn.transaction():
            until = now + timedelta(seconds=self.settings.diagnostic_job_retry_seconds)
            jobs.postpone(conn, job.job_id, until=until, error=error)
        return "postponed"

    def _conclude(
        self, ctx: ServiceContext, job: jobs.Job, now: datetime, outcome: Diagnosis | ReasoningFailed | str
    ) -> str | None:
        """The short transaction: take the job for good and emit what came of it (nothing
        for ``abandoned``). None when another instance finished it meanwhile."""
        with ctx.pool.connection() as conn, conn.transaction():
            if jobs.claim(conn, job.job_id, now) is None:
                return None
            if isinstance(outcome, str):
                jobs.record_outcome(conn, job.job_id, status=outcome, outcome_type=None, outcome_event_id=None)
                return outcome
            emit = self._emitter(ctx, conn, job)
            usage = outcome.usage if isinstance(outcome, ReasoningFailed) else outcome.reasoning.usage
            WorkflowStore.charge_tokens(conn, job.incident_id, usage.total)
            if isinstance(outcome, ReasoningFailed):
                envelope = self._escalate(conn, emit, job.incident_id, outcome, job.cause(ctx.source), now)
            else:
                envelope = self._emit_diagnosis(conn, emit, outcome, job.job_id, now)
            jobs.record_outcome(
                conn, job.job_id, status="done", outcome_type=envelope.type, outcome_event_id=envelope.id
            )
        log.info("diagnostic job %s finished: %s", job.job_id, envelope.type)
        return envelope.type

    @staticmethod
    def _emitter(ctx: ServiceContext, conn: psycopg.Connection[Any], job: jobs.Job) -> Emit:
        """Emit a record caused by the job's DiagnosticJobStarted, in ``conn``'s transaction."""
        cause = job.cause(ctx.source)

        def emit(record: Record) -> Envelope:
            return ctx.emit(conn, record, key=job.incident_id, correlation=job.incident_id, cause=cause)

        return emit

    # ------------------------------------------------- periodic: baselines

    def learn_baselines(self, ctx: ServiceContext) -> int:
        """Sample the estate into the baselines; evidence that is unavailable is skipped."""
        try:
            topology = self.evidence.snapshot()
        except EvidenceUnavailable as exc:
            log.debug("no baseline sample: %s", exc)
            return 0
        with ctx.pool.connection() as conn, conn.transaction():
            return baselines.learn(
                conn,
                topology,
                weight=self.settings.baseline_weight,
                suspect_ratio=self.settings.rules_suspect_ratio,
            )

    # --------------------------------------------------------------- pieces

    def _reason(self, evidence: DiagnosticEvidence) -> Diagnosis | ReasoningFailed:
        try:
            return self.reasoner.diagnose(evidence)
        except ReasoningFailed as failure:
            log.warning("%s: %s reasoner failed: %s", evidence.incident_id, failure.reasoner, failure.reason)
            return failure

    def _emit_diagnosis(
        self, conn: psycopg.Connection[Any], emit: Emit, diagnosis: Diagnosis, job_id: str | None, now: datetime
    ) -> Envelope:
        record = diagnosis_record(diagnosis, job_id=job_id, now=now)
        envelope = emit(record)
        usage = diagnosis.reasoning.usage
        conn.execute(
            """
            INSERT INTO diagnoses (event_id, incident_id, record_type, service, suspected_dependency, cause_category,
                job_id, reasoner, model, confidence, prompt_tokens, completion_tokens)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
            """,
            (
                envelope.id,
                diagnosis.incident_id,
                record.TYPE,
                diagnosis.service,
                diagnosis.suspected_dependency,
                diagnosis.cause_category,
                job_id,
                diagnosis.reasoning.reasoner,
                diagnosis.reasoning.model,
                diagnosis.reasoning.confidence,
                usage.prompt_tokens,
                usage.completion_tokens,
            ),
        )
        return envelope

    @staticmethod
    def _escalate(
        conn: psycopg.Connection[Any],
        emit: Emit,
        incident_id: str,
        failure: ReasoningFailed,
        cause: Envelope,
        now: datetime,
    ) -> Envelope:
        envelope = emit(
            escalation(incident_id, escalation_reason(failure, "diagnose the incident"), cause=cause, at=now)
        )
        record_failure(conn, incident_id=incident_id, escalation_event_id=envelope.id, failure=failure)
        return envelope


def _finish_emitter(finish: Finish, incident_id: str) -> Emit:
    """Emit for the incident, caused by the deferred request."""

    def emit(record: Record) -> Envelope:
        return finish.emit(record, key=incident_id)

    return emit
