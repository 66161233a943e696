"""The executor's handlers: boring on purpose.

A command: not signed by the policy service → refused (CommandRejected, dead letter);
its idempotency key already belongs to another command → refused (CommandFailed
KeyConflict, naming both); replay → nothing; proposal no longer open → refused;
otherwise run it once under the resource's lease, report RecoveryExecuted or
CommandFailed, and if it failed, undo the proposal's completed steps
(CompensationCompleted, also when there was nothing to undo). A RecoveryFailed: undo the
proposal's completed steps. A RecoveryCompleted: the proposal is done, nothing to undo
any more.

Leases, idempotency, the target and compensation live in their own modules; the
transaction boundaries are explained in :mod:`services.executor.execution`.

The loop runs with ``follow_workflow=False``: the executor reacts to commands, which the
incident workflow does not gate, and to RecoveryFailed/RecoveryCompleted, which it checks
against its own saga state (a saga that is no longer open ignores them) rather than
against a copy of the incident state machine it would have to keep in step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime

from prometheus_client import Counter

from flotilla import Envelope, Handler, HandlerContext, RecordRefused, Report, escalation
from flotilla.authority import Authorized, Unauthorized, verify_command
from flotilla.deadletter import Reason
from flotilla.keys import Keyring
from flotilla.records import RecoveryCompleted, RecoveryFailed
from services.executor import commands, compensation, execution, idempotency, outcomes, saga
from services.executor.execution import KEY_CONFLICT, PROPOSAL_ABORTED, Applied, Executor, Failed, Session
from services.executor.saga import Saga, SagaStatus

log = logging.getLogger(__name__)

UNAUTHORIZED = Counter(
    "flotilla_executor_unauthorized_commands_total",
    "Commands refused because their policy authorization does not hold, by refusal.",
    ["refusal"],
)


def _utcnow() -> datetime:
    return datetime.now(UTC)


class ExecutorHandlers:
    """The handlers of one executor process, bound to its Executor and clock."""

    def __init__(self, executor: Executor, keyring: Keyring, clock: Callable[[], datetime] = _utcnow) -> None:
        self.executor = executor
        self.keyring = keyring
        self.clock = clock

    def mapping(self) -> dict[str, Handler]:
        handlers: dict[str, Handler] = {record_type: self.on_command for record_type in commands.SPECS}
        handlers[RecoveryFailed.TYPE] = self.on_recovery_failed
        handlers[RecoveryCompleted.TYPE] = self.on_recovery_completed
        return handlers

    # -------------------------------------------------------------- handlers

    def on_command(self, ctx: HandlerContext) -> None:
        # Before anything else: a lease is only ever taken for the policy's commands.
        authorized = self._authorize(ctx)
        transaction = self.executor.bound_handler_transaction(ctx.conn)
        step = commands.from_record(ctx.incoming.record_type, ctx.incoming.value, authorized.expected_change)
        if ctx.incoming.key is not None and ctx.incoming.key != step.resource:
            log.warning(
                "%s arrived keyed %r, not by its resource %s", step.idempotency_key, ctx.incoming.key, step.resource
            )
        recorded = idempotency.find(ctx.conn, step.idempotency_key)
        if recorded is not None and recorded.command_id != step.command_id:
            self._refuse_key_conflict(ctx, transaction, step, recorded)
            return
        if recorded is not None and recorded.settled:
            log.info("%s already %s: nothing to do", step.idempotency_key, recorded.state.value)
            return

        proposal = saga.join(ctx.conn, step)
        if not proposal.open:
            why = f"proposal {step.proposal_id} is {proposal.status.value.lower()}: {proposal.reason}"
            self._report_failed(ctx, Failed(step, PROPOSAL_ABORTED, why, retryable=False))
            return

        session = self.executor.session(transaction)
        outcome = session.run(ctx.conn, step, self.clock())
        if isinstance(outcome, Applied):
            saga.add_step(ctx.conn, outcome)
            self._report_applied(ctx, outcome)
        elif isinstance(outcome, Failed):
            failure = self._report_failed(ctx, outcome)
            self._compensate(ctx, session, proposal, cause=failure, trigger=f"{step.idempotency_key} failed")
        session.record(ctx.conn)

    def on_recovery_failed(self, ctx: HandlerContext) -> None:
        transaction = self.executor.bound_handler_transaction(ctx.conn)
        failed = ctx.incoming.typed(RecoveryFailed)
        proposal = saga.lock(ctx.conn, failed.proposal_id)
        if proposal is None or not proposal.open:
            state = "no step of it ran here" if proposal is None else proposal.status.value
            log.info("RecoveryFailed for proposal %s ignored: %s", failed.proposal_id, state)
            return
        session = self.executor.session(transaction)
        self._compensate(ctx, session, proposal, cause=ctx.incoming.envelope, trigger=failed.reason)
        session.record(ctx.conn)

    def on_recovery_completed(self, ctx: HandlerContext) -> None:
        proposal = saga.lock(ctx.conn, ctx.incoming.typed(RecoveryCompleted).proposal_id)
        if proposal is not None and proposal.open:
            saga.close(ctx.conn, proposal.proposal_id, SagaStatus.COMPLETED, "recovery verified")

    # -------------------------------------------------------------- pieces

    def _authorize(self, ctx: HandlerContext) -> Authorized:
        """The policy service's signature on the command, or a refusal: nothing is run, a
        CommandRejected fact is emitted and the record is dead-lettered."""
        incoming = ctx.incoming
        try:
            return verify_command(self.keyring, incoming.record_type, incoming.value)
        except Unauthorized as exc:
            UNAUTHORIZED.labels(exc.refusal.value).inc()
            log.warning("refused %s %s: %s", incoming.record_type, incoming.envelope.id, exc)
            report = outcomes.command_rejected(
                incoming.record_type,
                incoming.value,
                refusal=exc.refusal.value,
                reason=str(exc),
                key_id=exc.key_id,
                producer=incoming.envelope.source,
                origin=(incoming.topic, incoming.partition, incoming.offset),
                at=self.clock(),
            )
            raise RecordRefused(
                Reason.UNAUTHORIZED,
                f"{incoming.record_type} {incoming.envelope.id} refused ({exc.refusal.value}): {exc}",
                Report(report.incident_id, report),
            ) from exc

    def _refuse_key_conflict(
        self,
        ctx: HandlerContext,
        transaction: execution.HandlerTransaction,
        step: commands.Step,
        recorded: idempotency.Execution,
    ) -> None:
        """Another command already holds this idempotency key: never run, never dropped
        silently — reported as failed, naming both commands, and the proposal undone."""
        message = (
            f"idempotency key {step.idempotency_key} already belongs to command {recorded.command_id} "
            f"(proposal {recorded.proposal_id}, {recorded.state.value}); command {step.command_id} "
            f"(proposal {step.proposal_id}) reuses it and was not run"
        )
        log.error("%s", message)
        execution.ACTIONS.labels(step.action, KEY_CONFLICT).inc()
        failure = self._report_failed(ctx, Failed(step, KEY_CONFLICT, message, retryable=False))
        proposal = saga.join(ctx.conn, step)
        if proposal.open:
            session = self.executor.session(transaction)
            self._compensate(ctx, session, proposal, cause=failure, trigger=f"{step.idempotency_key} conflicts")
            session.record(ctx.conn)

    def _compensate(
        self, ctx: HandlerContext, session: Session, proposal: Saga, *, cause: Envelope, trigger: str
    ) -> None:
        """Undo the proposal's completed steps, last first; report and close the saga."""
        completed = saga.completed(ctx.conn, proposal.proposal_id)
        now = self.clock()
        if not completed:
            # Still said, with nothing undone: without an ending fact the incident stays FAILED,
            # and a FAILED incident holds its service at the health agent, so no later breach of
            # it would ever open an incident (found by a storm, where the sim went away mid-run).
            summary = f"nothing to undo: no step of proposal {proposal.proposal_id} is recorded as carried out"
            nothing = outcomes.compensation_completed(
                proposal.incident_id, proposal.proposal_id, (), cause.id, summary, now
            )
            ctx.emit(nothing, key=proposal.incident_id)
            saga.close(ctx.conn, proposal.proposal_id, SagaStatus.ABORTED, f"{trigger}; {summary}")
            return
        report = compensation.run_plan(compensation.plan(completed), lambda undo: session.run(ctx.conn, undo, now))
        for done, outcome in report.undone:
            saga.mark_compensated(ctx.conn, done.step, outcome.step.command_id)
            if isinstance(outcome, Applied):
                self._report_applied(ctx, outcome)
        if report.complete:
            summary = report.summary()
            undone = outcomes.compensation_completed(
                proposal.incident_id, proposal.proposal_id, report.compensated_command_ids, cause.id, summary, now
            )
            ctx.emit(undone, key=proposal.incident_id)
            saga.close(ctx.conn, proposal.proposal_id, SagaStatus.COMPENSATED, f"{trigger}; {summary}")
            return
        if report.failure is not None:
            cause = self._report_failed(ctx, report.failure)
        reason = f"recovery {proposal.proposal_id} failed ({trigger}) and could not be undone: {report.summary()}"
        ctx.emit(escalation(proposal.incident_id, reason, cause=cause, at=self.clock()), key=proposal.incident_id)
        saga.close(ctx.conn, proposal.proposal_id, SagaStatus.COMPENSATION_FAILED, reason)

    def _report_applied(self, ctx: HandlerContext, applied: Applied) -> Envelope:
        return ctx.emit(outcomes.recovery_executed(applied, self.clock()), key=applied.step.incident_id)

    def _report_failed(self, ctx: HandlerContext, failed: Failed) -> Envelope:
        log.warning("%s failed: %s: %s", failed.step.idempotency_key, failed.error_class, failed.message)
        return ctx.emit(outcomes.command_failed(failed, self.clock()), key=failed.step.incident_id)
