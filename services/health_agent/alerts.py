"""Alertmanager's webhook (payload version 4): alerts that open, join or note incidents.

- A firing alert about a service the estate knows opens that service's incident
  (ServiceDegraded, then DiagnosisRequested carrying the alert and its kind of signal),
  or joins the one already open (AlertObserved, status firing) — opened by the agent's
  own reading or by another alert.
- One alert is one firing, however often it comes: Alertmanager resends on every
  ``repeat_interval``, after its own restart, and from each replica of an HA pair. The
  key is the alert's fingerprint (its label set) and ``startsAt`` (a new firing of the
  same labels starts later); a row per key, inserted once, the rest counted.
- A resolved alert is recorded on its incident (AlertObserved, status resolved); while
  an alert about an incident fires, its recovery is not verified (:mod:`.verification`).
- An alert about a service the estate does not know is accepted (Alertmanager would
  otherwise retry it for ever) and kept for an operator: ``GET /alerts?outcome=
  unknown-service``, ``flotilla_health_alerts_total{outcome="unknown-service"}`` and a
  warning in the log. Nothing is dropped silently.
- A payload that is not version 4 of the documented shape gets 422 with what is wrong,
  and nothing changes; a delivery is handled in one transaction, all of it or none.
- What an alert carries is bounded (security review 3, H2: one oversized label made a
  record Kafka refused, and the agent's publishing stopped). Labels, names and URLs over
  their bound are refused whole (422 naming the field, nothing changes), never cut: labels
  are the alert's identity (its fingerprint is their hash, and one of them names the
  service), a cut name is another name, and a cut URL leads nowhere. Only the summary, prose
  for a person, is cut where it is copied into a record (its first 2000 characters). The
  body as a whole is bounded before it is read (``FLOTILLA_ALERT_MAX_BODY_BYTES``).

What kind of signal an alert is about comes from its ``signal`` label when it has one
(latency, errors, saturation, dependency, availability, other), else from its name.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import psycopg
from flotilla_evidence import Catalogue
from prometheus_client import Counter
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from flotilla import Record, ServiceContext
from flotilla.bounds import name_problem, shown
from flotilla.records import AlertObserved, AlertRef, ServiceDegraded
from services.health_agent import incidents
from services.health_agent.detector import Phase

log = logging.getLogger(__name__)

ALERTS = Counter(
    "flotilla_health_alerts_total",
    "Alert notifications Alertmanager delivered, by what became of them "
    "(opened, joined, resolved, repeated, recorded, unknown-service).",
    ["outcome"],
)

SIGNALS = ("latency", "errors", "saturation", "dependency", "availability", "other")
# By the alert's name when it has no signal label: the first pattern that matches.
_SIGNAL_BY_NAME = (
    ("latency", re.compile(r"latency|slow|duration|p9\d", re.I)),
    ("errors", re.compile(r"error|5xx|fail", re.I)),
    ("saturation", re.compile(r"saturat|cpu|memory|pool|queue|throttl|disk", re.I)),
    ("dependency", re.compile(r"depend|upstream|downstream|backend", re.I)),
    ("availability", re.compile(r"down|unavailable|unreachable|absent|crash", re.I)),
)
# The year of Alertmanager's zero time ("0001-01-01T00:00:00Z"): no end known.
_NO_END_YEAR = 1

# What one alert may carry. Generous for any real rule (Mimir's defaults: 30 labels, names
# of 1024 and values of 2048 characters; the estate's rule sends 5 labels, 3 annotations),
# and small enough that every record an alert goes into stays far below the outbox's limit
# (labels ≤ 16 KiB, summary ≤ 2000 characters, URL ≤ 2048: a record of at most ~40 KiB).
ALERTS_MAX = 5000
LABELS_MAX = 64
LABEL_NAME_MAX = 128  # characters
LABEL_VALUE_MAX = 2048  # characters
LABELS_BYTES_MAX = 16 * 1024  # every name and value of one alert, as UTF-8
ANNOTATIONS_MAX = 64
ANNOTATION_VALUE_MAX = 16 * 1024  # characters; only the summary reaches a record (cut)
ANNOTATIONS_BYTES_MAX = 64 * 1024
URL_MAX = 2048  # generatorURL, externalURL (characters)
SUMMARY_MAX = 2000  # characters of the summary copied into a record
# Labels whose values are names (at most 253 characters, as a Kubernetes object's): the
# alert's name and, besides the intake's service and environment labels, where it runs.
NAME_LABELS = ("alertname", "namespace", "deployment")
# The validation context key for the intake's own name labels (Intake.parse).
_NAMES = "name_labels"


def _sized(what: str, items: dict[str, str], count: int, key_max: int, value_max: int, total_max: int) -> None:
    """Refuse (ValueError, naming the key, never repeating a long value) what is over a bound."""
    if len(items) > count:
        raise ValueError(f"{len(items)} {what}s, over the {count} an alert may have")
    total = 0
    for key, value in items.items():
        if len(key) > key_max:
            raise ValueError(f"{what} name {shown(key)} is over {key_max} characters")
        if len(value) > value_max:
            raise ValueError(f"{what} {shown(key)} is {len(value)} characters, over the {value_max} allowed")
        total += len(key.encode()) + len(value.encode())
    if total > total_max:
        raise ValueError(f"{what}s are {total} bytes together, over the {total_max} allowed")


class AlertIn(BaseModel):
    """One alert of a notification, as Alertmanager sends it."""

    model_config = ConfigDict(extra="ignore")

    status: Literal["firing", "resolved"]
    labels: dict[str, str]
    annotations: dict[str, str] = Field(default_factory=dict)
    startsAt: datetime
    endsAt: datetime | None = None
    generatorURL: str = Field("", max_length=URL_MAX)
    fingerprint: str = Field(min_length=1, max_length=64)

    @field_validator("labels")
    @classmethod
    def _named(cls, labels: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        if not labels.get("alertname"):
            raise ValueError("an alert has an alertname label")
        _sized("label", labels, LABELS_MAX, LABEL_NAME_MAX, LABEL_VALUE_MAX, LABELS_BYTES_MAX)
        names = (info.context or {}).get(_NAMES, NAME_LABELS)
        for key in names:
            if labels.get(key) and (why := name_problem(labels[key])):
                raise ValueError(f"label {key!r} names a service, environment or alert, and {why}")
        return labels

    @field_validator("annotations")
    @classmethod
    def _bounded(cls, annotations: dict[str, str]) -> dict[str, str]:
        _sized("annotation", annotations, ANNOTATIONS_MAX, LABEL_NAME_MAX, ANNOTATION_VALUE_MAX, ANNOTATIONS_BYTES_MAX)
        return annotations

    @property
    def ended(self) -> datetime | None:
        """When it resolved; None while firing (Alertmanager sends year 1 or a future time)."""
        if self.status != "resolved" or self.endsAt is None or self.endsAt.year == _NO_END_YEAR:
            return None
        return self.endsAt


class Notification(BaseModel):
    """Alertmanager's webhook payload, version 4."""

    model_config = ConfigDict(extra="ignore")

    version: Literal["4"]
    status: Literal["firing", "resolved"]
    receiver: str = Field("", max_length=1024)
    groupKey: str = Field("", max_length=LABELS_BYTES_MAX)
    truncatedAlerts: int = 0
    externalURL: str = Field("", max_length=URL_MAX)
    alerts: list[AlertIn] = Field(max_length=ALERTS_MAX)


@dataclass(frozen=True)
class Received:
    """What became of one alert of a delivery (the webhook's answer lists them)."""

    fingerprint: str
    alert_name: str
    outcome: str  # opened, joined, resolved, repeated, recorded, unknown-service
    incident_id: str | None
    service: str | None
    environment: str | None

    def as_json(self) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint,
            "alertName": self.alert_name,
            "outcome": self.outcome,
            "incidentId": self.incident_id,
            "service": self.service,
            "environment": self.environment,
        }


def signal_of(labels: Mapping[str, str]) -> str:
    declared = labels.get("signal", "").strip().lower()
    if declared in SIGNALS:
        return declared
    name = labels.get("alertname", "")
    return next((signal for signal, pattern in _SIGNAL_BY_NAME if pattern.search(name)), "other")


@dataclass(frozen=True)
class Intake:
    """How alerts are read: which labels name the service and environment, what the
    estate knows, and whether an alert may open an incident."""

    service_labels: Sequence[str]
    environment_labels: Sequence[str]
    default_environment: str
    catalogue: Catalogue
    opens: bool
    topic: str = "incidents"

    def parse(self, body: bytes | str) -> Notification:
        """A delivery's body as a notification, every bound checked (pydantic's
        ValidationError naming each field that breaks one); the intake's service and
        environment labels must hold names."""
        names = (*NAME_LABELS, *self.service_labels, *self.environment_labels)
        return Notification.model_validate_json(body, context={_NAMES: names})

    def where(self, labels: Mapping[str, str]) -> tuple[str | None, str]:
        service = next((labels[k] for k in self.service_labels if labels.get(k)), None)
        environment = next((labels[k] for k in self.environment_labels if labels.get(k)), self.default_environment)
        return service, environment

    def known(self, conn: psycopg.Connection[Any], environment: str, service: str) -> bool:
        """The estate knows it: the catalogue declares it, or the agent has read its latency."""
        if self.catalogue.get(environment, service) is not None:
            return True
        row = conn.execute(
            "SELECT 1 FROM detector_state WHERE environment = %s AND service = %s AND last_scraped_at IS NOT NULL",
            (environment, service),
        ).fetchone()
        return row is not None


def _ref(alert: AlertIn) -> AlertRef:
    summary = alert.annotations.get("summary") or alert.annotations.get("description")
    return AlertRef(
        alert_name=alert.labels["alertname"],
        fingerprint=alert.fingerprint,
        status=alert.status,
        severity=alert.labels.get("severity"),
        labels=dict(alert.labels),
        summary=summary[:SUMMARY_MAX] if summary else None,
        starts_at=alert.startsAt,
        ends_at=alert.ended,
        generator_url=alert.generatorURL or None,
    )


def receive(ctx: ServiceContext, intake: Intake, notification: Notification) -> list[Received]:
    """Handle one delivery in one transaction; what became of each alert."""
    with ctx.pool.connection() as conn, conn.transaction():
        now = ctx.now()
        results = [_one(ctx, conn, intake, alert, now) for alert in notification.alerts]
    for r in results:
        ALERTS.labels(r.outcome).inc()
        if r.outcome == "unknown-service":
            log.warning(
                "alert %s (%s) is about %s/%s, which the estate does not know: kept, see GET /alerts",
                r.alert_name,
                r.fingerprint,
                r.environment,
                r.service or "(no service label)",
            )
    return results


_INSERT = """
INSERT INTO alerts (fingerprint, starts_at, alert_name, environment, service, signal, severity, labels, annotations,
    generator_url, status, ends_at, outcome, incident_id, resolved_at, first_received_at, last_received_at)
VALUES (%(fingerprint)s, %(starts_at)s, %(alert_name)s, %(environment)s, %(service)s, %(signal)s, %(severity)s,
    %(labels)s, %(annotations)s, %(generator_url)s, %(status)s, %(ends_at)s, 'recorded', NULL, %(resolved_at)s,
    %(now)s, %(now)s)
ON CONFLICT (fingerprint, starts_at) DO UPDATE SET received = alerts.received + 1, last_received_at = %(now)s
RETURNING (xmax = 0) AS inserted, status, outcome, incident_id
"""


def _one(ctx: ServiceContext, conn: psycopg.Connection[Any], intake: Intake, alert: AlertIn, now: datetime) -> Received:
    service, environment = intake.where(alert.labels)
    signal = signal_of(alert.labels)
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(
            _INSERT,
            {
                "fingerprint": alert.fingerprint,
                "starts_at": alert.startsAt,
                "alert_name": alert.labels["alertname"],
                "environment": environment,
                "service": service,
                "signal": signal,
                "severity": alert.labels.get("severity"),
                "labels": Jsonb(alert.labels),
                "annotations": Jsonb(alert.annotations),
                "generator_url": alert.generatorURL or None,
                "status": alert.status,
                "ends_at": alert.ended,
                "resolved_at": now if alert.status == "resolved" else None,
                "now": now,
            },
        ).fetchone()
    assert row is not None

    def result(outcome: str, incident: str | None) -> Received:
        if row["inserted"] or outcome != "repeated":
            conn.execute(
                "UPDATE alerts SET outcome = %s, incident_id = COALESCE(%s, incident_id) "
                "WHERE fingerprint = %s AND starts_at = %s",
                (_stored_outcome(outcome, row["outcome"]), incident, alert.fingerprint, alert.startsAt),
            )
        return Received(alert.fingerprint, alert.labels["alertname"], outcome, incident, service, environment)

    if not row["inserted"]:
        if alert.status == "firing" or row["status"] == "resolved":
            return result("repeated", row["incident_id"])  # the same firing again, or a late copy
        # firing until now: it resolved
        conn.execute(
            "UPDATE alerts SET status = 'resolved', ends_at = %s, resolved_at = %s "
            "WHERE fingerprint = %s AND starts_at = %s",
            (alert.ended, now, alert.fingerprint, alert.startsAt),
        )
        if row["incident_id"] is not None:
            _note(ctx, conn, intake.topic, _ref(alert), row["incident_id"], environment, service or "", signal, now)
            _release(conn, row["incident_id"], environment, service, now)
        return result("resolved", row["incident_id"])

    if service is None or not intake.known(conn, environment, service):
        return result("unknown-service", None)
    detector = incidents.lock_service(conn, environment, service)
    incident = incidents.open_incident_of(conn, environment, service)
    if alert.status == "resolved":  # never seen firing (the agent was away): a note where it belongs
        if incident is not None:
            _note(ctx, conn, intake.topic, _ref(alert), incident, environment, service, signal, now)
        return result("recorded", incident)
    if incident is not None:
        _note(ctx, conn, intake.topic, _ref(alert), incident, environment, service, signal, now)
        return result("joined", incident)
    if not intake.opens:
        return result("recorded", None)
    incident = _open(ctx, conn, intake, alert, environment, service, signal, now)
    if incident is None:  # past the service's incident cap (incidents.open_incident)
        return result("recorded", None)
    # The agent's own breach goes on under the new incident: the one it had (if any) is
    # cleared or finished (open_incident_of found none), and when the breach ends it must
    # release this one, not that one (else nothing ever releases it).
    if detector["phase"] == Phase.BREACHING.value:
        conn.execute(
            "UPDATE detector_state SET open_incident = %s WHERE environment = %s AND service = %s",
            (incident, environment, service),
        )
    return result("opened", incident)


def _stored_outcome(outcome: str, stored: str) -> str:
    """The alerts table keeps how the firing was taken (opened, joined, recorded, unknown-
    service); its resolution and repeats do not change that."""
    return stored if outcome in ("resolved", "repeated") else outcome


def _summary(alert: AlertIn) -> str:
    said = alert.annotations.get("summary") or alert.annotations.get("description")
    if said:
        return said[:SUMMARY_MAX]
    labels = ", ".join(f"{k}={v}" for k, v in sorted(alert.labels.items()) if k != "alertname")
    return f"{alert.labels['alertname']} firing ({labels})"[:SUMMARY_MAX]


def _open(
    ctx: ServiceContext,
    conn: psycopg.Connection[Any],
    intake: Intake,
    alert: AlertIn,
    environment: str,
    service: str,
    signal: str,
    now: datetime,
) -> str | None:
    ref, summary = _ref(alert), _summary(alert)

    def degraded(incident: str) -> Record:
        return ServiceDegraded(
            incident_id=incident,
            service=service,
            environment=environment,
            signal=signal,
            summary=summary,
            alert=ref,
            observed_at=now,
        )

    opening = incidents.Opening(
        environment=environment,
        service=service,
        fact=degraded,
        symptom=f"alert {ref.alert_name} ({signal}): {summary}",
        signal=signal,
        opened_by="alert",
        alert=ref,
    )
    opened = incidents.open_incident(ctx, conn, opening, now=now, topic=intake.topic)
    return None if opened is None else opened[0]


def _note(
    ctx: ServiceContext,
    conn: psycopg.Connection[Any],
    topic: str,
    alert: AlertRef,
    incident: str,
    environment: str,
    service: str,
    signal: str,
    now: datetime,
) -> None:
    record = AlertObserved(
        incident_id=incident, service=service, environment=environment, signal=signal, alert=alert, observed_at=now
    )
    cause = incidents.opening_of(conn, incident)
    ctx.emit(conn, record, key=incident, correlation=incident, cause=cause, topic=topic)


def held_by_alerts(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    """The firing alerts that keep a recovery from being verified (their incident has an
    open verification window)."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            "SELECT a.* FROM alerts a WHERE a.status = 'firing' AND a.incident_id IN "
            "(SELECT incident_id FROM verifications WHERE outcome IS NULL)"
        ).fetchall()


def resolve_lost(ctx: ServiceContext, conn: psycopg.Connection[Any], topic: str, row: Mapping[str, Any]) -> bool:
    """Record the resolution Alertmanager never delivered (its rule no longer fires, as
    Prometheus says): the row resolved, AlertObserved (resolved) on its incident, the
    incident released. False when it was no longer firing (delivered meanwhile)."""
    now = ctx.now()
    done = conn.execute(
        "UPDATE alerts SET status = 'resolved', ends_at = %s, resolved_at = %s "
        "WHERE fingerprint = %s AND starts_at = %s AND status = 'firing' RETURNING incident_id",
        (now, now, row["fingerprint"], row["starts_at"]),
    ).fetchone()
    if done is None or done[0] is None:
        return False
    summary = row["annotations"].get("summary") or row["annotations"].get("description")
    ref = AlertRef(
        alert_name=row["alert_name"],
        fingerprint=row["fingerprint"],
        status="resolved",
        severity=row["severity"],
        labels=dict(row["labels"]),
        summary=f"resolved per Prometheus: its rule no longer fires ({summary or 'no summary'})"[:SUMMARY_MAX],
        starts_at=row["starts_at"],
        ends_at=now,
        generator_url=row["generator_url"],
    )
    _note(ctx, conn, topic, ref, done[0], row["environment"], row["service"] or "", row["signal"], now)
    _release(conn, done[0], row["environment"], row["service"], now)
    log.info("%s: alert %s resolved per Prometheus (no resolution came from Alertmanager)", done[0], ref.alert_name)
    return True


def _release(
    conn: psycopg.Connection[Any], incident: str, environment: str, service: str | None, now: datetime
) -> None:
    """A resolved alert lets its incident go, unless the agent still reads a breach."""
    row = conn.execute(
        "SELECT phase FROM detector_state WHERE environment = %s AND service = %s", (environment, service)
    ).fetchone()
    incidents.clear(conn, incident, now, breaching=row is not None and row[0] == Phase.BREACHING.value)


def listing(conn: psycopg.Connection[Any], outcome: str | None, limit: int) -> list[dict[str, Any]]:
    """Alerts as received, newest first (an operator's view: ``GET /alerts``)."""
    where, params = ("WHERE outcome = %s", [outcome]) if outcome else ("", [])
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            "SELECT fingerprint, starts_at, alert_name, environment, service, signal, severity, labels, annotations, "
            f"generator_url, status, ends_at, outcome, incident_id, received, first_received_at, last_received_at "
            f"FROM alerts {where} ORDER BY last_received_at DESC LIMIT %s",
            [*params, limit],
        ).fetchall()
    return [
        {
            "fingerprint": r["fingerprint"],
            "alertName": r["alert_name"],
            "status": r["status"],
            "outcome": r["outcome"],
            "incidentId": r["incident_id"],
            "service": r["service"],
            "environment": r["environment"],
            "signal": r["signal"],
            "severity": r["severity"],
            "labels": r["labels"],
            "annotations": r["annotations"],
            "generatorUrl": r["generator_url"],
            "startsAt": r["starts_at"].isoformat(),
            "endsAt": None if r["ends_at"] is None else r["ends_at"].isoformat(),
            "received": r["received"],
            "firstReceivedAt": r["first_received_at"].isoformat(),
            "lastReceivedAt": r["last_received_at"].isoformat(),
        }
        for r in rows
    ]
