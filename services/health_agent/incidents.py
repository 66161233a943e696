"""One open incident per service, whoever notices first: the agent's own reading or an alert.

Both ways in lock the service's detector row first (:func:`lock_service`), so a breach
the agent reads and an alert Alertmanager delivers for the same service serialize: the
second finds the first's incident open (:func:`open_incident_of`) and joins it instead of
opening another. A partial unique index (one open incident per environment and service)
backs this up whatever the code does.

An incident is *cleared* (the service may get a new one) only when nothing holds it
open: neither a breach the agent reads nor an alert still firing (:func:`clear`).

Every opening passes the cap on incidents per service per hour
(``FLOTILLA_HEALTH_INCIDENTS_PER_HOUR``, :func:`open_incident`): telemetry and alerts are
not proof (docs/security/threat-model.md, "Telemetry is a trust root"), and a service
whose readings flap, or whose name someone else's exporter borrows, must not become an
incident (a diagnosis, a model's token budget, an automatic action) every few minutes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

import psycopg
from prometheus_client import Counter
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from flotilla import Envelope, Record, ServiceContext, Status, WorkflowStore, escalation
from flotilla.records import AlertRef, DiagnosisRequested
from services.health_agent.settings import HealthSettings

log = logging.getLogger(__name__)

INCIDENTS_OPENED = Counter(
    "flotilla_health_incidents_opened_total", "Incidents opened by the health agent.", ["service"]
)

INCIDENTS_CAPPED = Counter(
    "flotilla_health_incidents_capped_total",
    "Breaches and alerts that opened no incident: their service had opened FLOTILLA_HEALTH_INCIDENTS_PER_HOUR "
    "incidents in the last hour.",
    ["service"],
)
CAP_WINDOW = timedelta(hours=1)

OpenedBy = Literal["metrics", "alert"]


def lock_service(conn: psycopg.Connection[Any], environment: str, service: str) -> dict[str, Any]:
    """The service's detector row, made if missing and locked for this transaction."""
    conn.execute(
        "INSERT INTO detector_state (environment, service, phase, breach_streak, healthy_streak) "
        "VALUES (%s, %s, 'healthy', 0, 0) ON CONFLICT DO NOTHING",
        (environment, service),
    )
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(
            "SELECT * FROM detector_state WHERE environment = %s AND service = %s FOR UPDATE", (environment, service)
        ).fetchone()
    assert row is not None
    return row


# Where the fleet is done with an incident: it no longer holds its service, whatever still
# says otherwise (an alert whose resolution never arrived, say).
FINISHED = frozenset({Status.RESOLVED, Status.ESCALATED, Status.COMPENSATED})


def open_incident_of(conn: psycopg.Connection[Any], environment: str, service: str) -> str | None:
    """The service's open incident, if the fleet is still working on it. One it has finished
    (resolved, compensated, escalated: the workflow this agent follows says so) but that is
    still held (a lost resolution of an alert that joined it) is cleared here: a new breach
    or alert opens a new incident rather than joining a finished one."""
    row = conn.execute(
        "SELECT incident_id FROM health_incidents WHERE environment = %s AND service = %s AND cleared_at IS NULL",
        (environment, service),
    ).fetchone()
    if row is None:
        return None
    incident = str(row[0])
    status = WorkflowStore.status_of(conn, incident)
    if status in FINISHED:
        conn.execute("UPDATE health_incidents SET cleared_at = now() WHERE incident_id = %s", (incident,))
        log.info("%s is %s: it no longer holds %s/%s", incident, status, environment, service)
        return None
    return incident


@dataclass(frozen=True)
class Opening:
    """What opens an incident: the first fact (built once its id is known), and what the
    diagnosis request says about it."""

    environment: str
    service: str
    fact: Callable[[str], Record]  # incident id -> ServiceLatencyIncreased / ServiceDegraded
    symptom: str
    signal: str
    opened_by: OpenedBy
    p95_ms: float | None = None
    threshold_ms: float | None = None
    alert: AlertRef | None = None


def incidents_per_hour(ctx: ServiceContext) -> int:
    """The cap (0: none) of the health agent's settings; other settings carry none."""
    settings = ctx.settings
    return settings.health_incidents_per_hour if isinstance(settings, HealthSettings) else 0


def open_incident(
    ctx: ServiceContext, conn: psycopg.Connection[Any], opening: Opening, *, now: datetime, topic: str
) -> tuple[str, Envelope] | None:
    """A new incident, in the caller's transaction (holding the service's lock): the fact,
    then DiagnosisRequested caused by it, then the incident's row. Returns its id and the
    request's envelope.

    None when the service has opened ``FLOTILLA_HEALTH_INCIDENTS_PER_HOUR`` incidents in
    the last hour: nothing is diagnosed or done for it (:func:`_past_the_cap`). The count is
    read under the service's lock, which every way in holds, so two openings cannot both
    squeeze under it."""
    cap = incidents_per_hour(ctx)
    if cap > 0:
        opened, noticed = _opened_within(conn, opening, now)
        if opened >= cap:
            _past_the_cap(ctx, conn, opening, now=now, topic=topic, opened=opened, cap=cap, noticed=noticed)
            return None
    incident = _next_incident(conn)
    fact = ctx.emit(conn, opening.fact(incident), key=incident, correlation=incident, topic=topic)
    request = DiagnosisRequested(
        incident_id=incident,
        service=opening.service,
        environment=opening.environment,
        symptom=opening.symptom,
        signal=opening.signal,
        alert=opening.alert,
        trigger_event_id=fact.id,
        requested_at=now,
    )
    diagnosis = ctx.emit(conn, request, key=incident, correlation=incident, cause=fact, topic=topic)
    _insert_incident(conn, incident, opening, fact, diagnosis, now=now)
    INCIDENTS_OPENED.labels(opening.service).inc()
    log.warning(
        "%s opened by %s: %s/%s: %s", incident, opening.opened_by, opening.environment, opening.service, opening.symptom
    )
    return incident, diagnosis


def _next_incident(conn: psycopg.Connection[Any]) -> str:
    number = conn.execute("SELECT nextval('incident_number')").fetchone()
    assert number is not None
    return f"incident-{number[0]}"


def _opened_within(conn: psycopg.Connection[Any], opening: Opening, now: datetime) -> tuple[int, int]:
    """(incidents opened for the service in the hour before ``now``, cap notices among them
    given apart): a notice is not counted against the cap."""
    row = conn.execute(
        "SELECT count(*) FILTER (WHERE NOT cap_notice), count(*) FILTER (WHERE cap_notice) FROM health_incidents "
        "WHERE environment = %s AND service = %s AND opened_at > %s",
        (opening.environment, opening.service, now - CAP_WINDOW),
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _past_the_cap(
    ctx: ServiceContext,
    conn: psycopg.Connection[Any],
    opening: Opening,
    *,
    now: datetime,
    topic: str,
    opened: int,
    cap: int,
    noticed: int,
) -> None:
    """What a breach or alert past the cap does: no incident to work on (no diagnosis, no
    plan, no action), counted (``flotilla_health_incidents_capped_total``) and logged. The
    first one in the hour also tells people, the way the fleet tells them anything: an
    incident with the fact as observed, escalated at once (IncidentEscalated, to on-call)
    and holding nothing, so the console, the audit and whoever watches escalations see
    that this service is being ignored and why. Later ones in the hour add only to the
    count and the log: one notice an hour, however hard the service flaps."""
    INCIDENTS_CAPPED.labels(opening.service).inc()
    service = f"{opening.environment}/{opening.service}"
    if noticed:
        log.info("%s: past the cap (%d incidents in the last hour), not opened: %s", service, opened, opening.symptom)
        return
    incident = _next_incident(conn)
    fact = ctx.emit(conn, opening.fact(incident), key=incident, correlation=incident, topic=topic)
    reason = (
        f"incident cap: {service} opened {opened} incidents in the last hour (FLOTILLA_HEALTH_INCIDENTS_PER_HOUR="
        f"{cap}); this {opening.opened_by} opening ({opening.symptom[:300]}) and any other for it in the next hour "
        "are not diagnosed or acted on. Is the service flapping, or is its telemetry (or an alert) not genuine?"
    )
    notice = ctx.emit(
        conn,
        escalation(incident, reason, cause=fact, at=now),
        key=incident,
        correlation=incident,
        cause=fact,
        topic=topic,
    )
    # No DiagnosisRequested: the escalation stands in its column. Cleared at once: it holds
    # nothing, so a breach or alert after the hour opens as usual.
    _insert_incident(conn, incident, opening, fact, notice, now=now, cap_notice=True)
    log.error("%s escalated: %s", incident, reason)


def _insert_incident(
    conn: psycopg.Connection[Any],
    incident: str,
    opening: Opening,
    fact: Envelope,
    next_step: Envelope,
    *,
    now: datetime,
    cap_notice: bool = False,
) -> None:
    """The incident's row: what opened it (``fact``) and what it asked for next (the
    diagnosis request, or a cap notice's escalation)."""
    conn.execute(
        "INSERT INTO health_incidents (incident_id, environment, service, p95_ms, threshold_ms, opened_at, "
        "latency_event_id, diagnosis_event_id, opened_by, signal, opening, cap_notice, cleared_at) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (
            incident,
            opening.environment,
            opening.service,
            opening.p95_ms,
            opening.threshold_ms,
            now,
            fact.id,
            next_step.id,
            opening.opened_by,
            opening.signal,
            Jsonb(asdict(fact)),
            cap_notice,
            now if cap_notice else None,
        ),
    )


def opening_of(conn: psycopg.Connection[Any], incident: str) -> Envelope | None:
    """The envelope of the record that opened ``incident``: a later note about the incident
    is caused by it (one causation chain, one trace). None for an incident opened before
    the column existed."""
    row = conn.execute("SELECT opening FROM health_incidents WHERE incident_id = %s", (incident,)).fetchone()
    return None if row is None or row[0] is None else Envelope(**row[0])


def clear(conn: psycopg.Connection[Any], incident: str, now: datetime, *, breaching: bool) -> bool:
    """End ``incident``'s hold on its service unless something still holds it: the agent's
    reading (``breaching``) or an alert about it still firing. True when cleared."""
    if breaching:
        return False
    row = conn.execute(
        "UPDATE health_incidents SET cleared_at = %s WHERE incident_id = %s AND cleared_at IS NULL "
        "AND NOT EXISTS (SELECT 1 FROM alerts WHERE alerts.incident_id = %s AND status = 'firing') "
        "RETURNING environment, service",
        (now, incident, incident),
    ).fetchone()
    if row is not None:
        log.info("%s: the trouble with %s/%s is over", incident, row[0], row[1])
    return row is not None


def firing_alerts(conn: psycopg.Connection[Any], incidents: Iterable[str]) -> dict[str, str]:
    """For each of ``incidents`` with an alert still firing, that alert's name."""
    rows = conn.execute(
        "SELECT incident_id, min(alert_name) FROM alerts WHERE status = 'firing' AND incident_id = ANY(%s) "
        "GROUP BY incident_id",
        (list(incidents),),
    ).fetchall()
    return {str(incident): str(name) for incident, name in rows}
