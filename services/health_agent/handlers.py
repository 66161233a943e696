"""What the health agent does with consumed records: learn plans, count executed steps,
open a verification window when a plan's last step has run, hand a failed recovery to
people while its service still breaches.

A proposal is done when every one of its commands has a RecoveryExecuted. The steps are
learnt from the RecoveryProposed on the same topic (it precedes its executions in the
incident's partition). Compensating executions (``compensates`` set) undo a plan and
never start a verification.

The window starts ``lag`` after the last step ran: a p95 over a PromQL rate window still
counts requests from before the fix until the window has passed, and such a reading says
nothing about the recovery (``FLOTILLA_HEALTH_METRICS_LAG_SECONDS``).

A failed recovery the executor undid (CompensationCompleted) while the service still
breaches goes to people (IncidentEscalated): the detector opens one incident per breach,
so nothing else would happen until the service recovered by itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import asdict
from datetime import UTC, datetime, timedelta

from psycopg.types.json import Jsonb

from flotilla import Handler, HandlerContext, ServiceContext, escalation
from flotilla.records import CompensationCompleted, RecoveryExecuted, RecoveryProposed
from services.health_agent.detector import Phase

log = logging.getLogger(__name__)


def on_proposed(ctx: HandlerContext) -> None:
    proposed = ctx.incoming.typed(RecoveryProposed)
    ctx.conn.execute(
        "INSERT INTO proposals (proposal_id, incident_id, command_ids, event_id) VALUES (%s, %s, %s, %s) "
        "ON CONFLICT (proposal_id) DO NOTHING",
        (
            proposed.proposal_id,
            proposed.incident_id,
            [str(step["commandId"]) for step in proposed.steps],
            ctx.incoming.envelope.id,
        ),
    )


def make_on_executed(window_seconds: float, clock: Callable[[], datetime], lag_seconds: float = 0.0) -> Handler:
    lag = timedelta(seconds=lag_seconds)

    def on_executed(ctx: HandlerContext) -> None:
        executed = ctx.incoming.typed(RecoveryExecuted)
        if executed.compensates is not None:
            return  # undoing a plan, not completing one
        proposal, incident = executed.proposal_id, executed.incident_id
        conn = ctx.conn
        conn.execute(
            "INSERT INTO executed_steps (proposal_id, command_id, incident_id, event_id) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT DO NOTHING",
            (proposal, executed.command_id, incident, ctx.incoming.envelope.id),
        )
        row = conn.execute(
            "SELECT cardinality(p.command_ids) = (SELECT count(*) FROM executed_steps e "
            "  WHERE e.proposal_id = p.proposal_id AND e.command_id = ANY(p.command_ids)) "
            "FROM proposals p WHERE p.proposal_id = %s",
            (proposal,),
        ).fetchone()
        if row is None:
            # Never saw the plan: verify now rather than leave the incident hanging.
            log.warning("RecoveryExecuted for unknown proposal %s of %s: verifying it as complete", proposal, incident)
        elif not row[0]:
            return  # more steps to come
        where = conn.execute(
            "SELECT environment, service FROM health_incidents WHERE incident_id = %s", (incident,)
        ).fetchone()
        environment, service = where if where is not None else (executed.target.environment, executed.target.name)
        conn.execute(
            "INSERT INTO verifications (proposal_id, incident_id, environment, service, started_at, window_seconds, "
            "cause) VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (proposal_id) DO NOTHING",
            (
                proposal,
                incident,
                environment,
                service,
                clock() + lag,
                window_seconds,
                Jsonb(asdict(ctx.incoming.envelope)),
            ),
        )
        log.info(
            "%s: proposal %s executed; verifying %s/%s for %g s",
            incident,
            proposal,
            environment,
            service,
            window_seconds,
        )

    return on_executed


def on_compensated(ctx: HandlerContext) -> None:
    undone = ctx.incoming.typed(CompensationCompleted)
    incident = undone.incident_id
    still = ctx.conn.execute(
        "SELECT environment, service, last_p95_ms, threshold_ms FROM detector_state "
        "WHERE open_incident = %s AND phase = %s",
        (incident, Phase.BREACHING.value),
    ).fetchone()
    if still is None:
        return  # the service is healthy again (or was never this agent's reading): the incident ends here
    environment, service, p95_ms, threshold_ms = still
    reading = "" if p95_ms is None or threshold_ms is None else f": p95 {p95_ms:.0f} ms against {threshold_ms:.0f} ms"
    reason = (
        f"recovery {undone.proposal_id} failed and was undone ({undone.summary}); "
        f"{environment}/{service} still breaches{reading}"
    )
    # on the topic the compensation came by: the incidents topic this agent is configured with
    ctx.emit(escalation(incident, reason, cause=ctx.incoming.envelope), key=incident, topic=ctx.incoming.topic)
    log.warning("%s escalated: %s", incident, reason)


def make_handlers(window_seconds: float, lag_seconds: float = 0.0) -> Callable[[ServiceContext], Mapping[str, Handler]]:
    def handlers(ctx: ServiceContext) -> Mapping[str, Handler]:
        return {
            RecoveryProposed.TYPE: on_proposed,
            RecoveryExecuted.TYPE: make_on_executed(window_seconds, lambda: datetime.now(UTC), lag_seconds),
            CompensationCompleted.TYPE: on_compensated,
        }

    return handlers
