"""What a proposal rests on: facts this service verified itself.

A RecoveryProposed is signed by the remediation agent, but the agent planned it from a
diagnosis and the incident it belongs to, and those are other producers' facts. The
policy's own consumer loop checks every record's producer signature before any handler
(``flotilla.provenance``), so this service remembers the ones a plan may rest on — the
health agent's records that open and describe an incident, the diagnostic agent's
diagnoses — with the digest of the payload whose signature held. Before deciding, it
requires that the diagnosis the proposal names (``diagnosisEventId``, covered by the
agent's attestation) is one of them, for the same incident, and that the health agent
opened that incident. A plan resting on anything else (a diagnosis this service never
saw, another incident's, one a forger wrote) is refused before any decision.
"""

from __future__ import annotations

from typing import Any

import psycopg

from flotilla import HandlerContext
from flotilla.provenance import producer_of
from flotilla.records import (
    AlertObserved,
    DependencyFailureSuspected,
    DiagnosisConcluded,
    DiagnosisRequested,
    ServiceDegraded,
    ServiceLatencyIncreased,
)

OPENINGS = (ServiceLatencyIncreased.TYPE, ServiceDegraded.TYPE, AlertObserved.TYPE, DiagnosisRequested.TYPE)
DIAGNOSES = (DiagnosisConcluded.TYPE, DependencyFailureSuspected.TYPE)
REMEMBERED = (*OPENINGS, *DIAGNOSES)


def remember(ctx: HandlerContext) -> None:
    """Keep a verified fact a proposal may rest on (idempotent by event id)."""
    incoming = ctx.incoming
    ctx.conn.execute(
        "INSERT INTO policy_verified_facts (event_id, incident_id, record_type, producer, digest) "
        "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (event_id) DO NOTHING",
        (
            incoming.envelope.id,
            incoming.envelope.correlationid,
            incoming.record_type,
            producer_of(incoming.envelope.source) or incoming.envelope.source,
            incoming.digest or "",
        ),
    )


def unsupported(conn: psycopg.Connection[Any], incident: str, diagnosis_event_id: str | None) -> str | None:
    """Why the proposal's basis does not hold (None: it does)."""
    if not diagnosis_event_id:
        return "it names no diagnosis"
    diagnosis = conn.execute(
        "SELECT incident_id, record_type FROM policy_verified_facts WHERE event_id = %s", (diagnosis_event_id,)
    ).fetchone()
    if diagnosis is None or diagnosis[1] not in DIAGNOSES:
        return f"the diagnosis it names ({diagnosis_event_id}) is none the diagnostic agent stated to this service"
    if diagnosis[0] != incident:
        return f"the diagnosis it names ({diagnosis_event_id}) belongs to incident {diagnosis[0]}, not {incident}"
    opened = conn.execute(
        "SELECT 1 FROM policy_verified_facts WHERE incident_id = %s AND record_type = ANY(%s) LIMIT 1",
        (incident, list(OPENINGS)),
    ).fetchone()
    if opened is None:
        return f"no record of the health agent opened incident {incident}"
    return None
