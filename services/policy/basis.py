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

The diagnosis' ``reasoning.reasoner`` is kept with it: a plan is at most as trusted as the
weakest reasoner it rests on, so the decision sees which reasoner made the diagnosis (Cedar
``context.plan.diagnosisReasoner``) from the signed record, never from the proposal.
"""

from __future__ import annotations

from dataclasses import dataclass
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


class Unsupported(Exception):
    """The proposal's basis does not hold: the message says why."""


@dataclass(frozen=True)
class VerifiedDiagnosis:
    """The diagnosis a proposal rests on, as this service verified it."""

    event_id: str
    reasoner: str | None  # its reasoning.reasoner; None if remembered before it was kept


def reasoner_of(value: Any) -> str | None:
    """A diagnosis' ``reasoning.reasoner`` from its decoded (verified) value."""
    reasoning = value.get("reasoning") if isinstance(value, dict) else None
    reasoner = reasoning.get("reasoner") if isinstance(reasoning, dict) else None
    return reasoner if isinstance(reasoner, str) else None


def remember(ctx: HandlerContext) -> None:
    """Keep a verified fact a proposal may rest on (idempotent by event id)."""
    incoming = ctx.incoming
    ctx.conn.execute(
        "INSERT INTO policy_verified_facts (event_id, incident_id, record_type, producer, digest, reasoner) "
        "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (event_id) DO NOTHING",
        (
            incoming.envelope.id,
            incoming.envelope.correlationid,
            incoming.record_type,
            producer_of(incoming.envelope.source) or incoming.envelope.source,
            incoming.digest or "",
            reasoner_of(incoming.value) if incoming.record_type in DIAGNOSES else None,
        ),
    )


def verified_diagnosis(
    conn: psycopg.Connection[Any], incident: str, diagnosis_event_id: str | None
) -> VerifiedDiagnosis:
    """The diagnosis the proposal names, if its basis holds; raises :class:`Unsupported`."""
    if not diagnosis_event_id:
        raise Unsupported("it names no diagnosis")
    diagnosis = conn.execute(
        "SELECT incident_id, record_type, reasoner FROM policy_verified_facts WHERE event_id = %s",
        (diagnosis_event_id,),
    ).fetchone()
    if diagnosis is None or diagnosis[1] not in DIAGNOSES:
        raise Unsupported(
            f"the diagnosis it names ({diagnosis_event_id}) is none the diagnostic agent stated to this service"
        )
    if diagnosis[0] != incident:
        raise Unsupported(
            f"the diagnosis it names ({diagnosis_event_id}) belongs to incident {diagnosis[0]}, not {incident}"
        )
    opened = conn.execute(
        "SELECT 1 FROM policy_verified_facts WHERE incident_id = %s AND record_type = ANY(%s) LIMIT 1",
        (incident, list(OPENINGS)),
    ).fetchone()
    if opened is None:
        raise Unsupported(f"no record of the health agent opened incident {incident}")
    return VerifiedDiagnosis(diagnosis_event_id, diagnosis[2])
