"""Decisions as contract records, and back: the one place that knows both shapes.

The diagnostic agent turns a :class:`Diagnosis` into DependencyFailureSuspected or
DiagnosisConcluded; the remediation agent reads those back into a Diagnosis. Both
escalate with the same IncidentEscalated. Values here are not validated: the outbox
validates every record against its registered schema before it is written.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from flotilla.consumer import ESCALATION_TARGET
from flotilla_reasoning.model import Diagnosis, Reasoning, Verdict

INCIDENTS = "incidents"
DIAGNOSIS_REQUESTED = "dev.flotilla.incidents.DiagnosisRequested"
DIAGNOSTIC_JOB_STARTED = "dev.flotilla.incidents.DiagnosticJobStarted"
DEPENDENCY_FAILURE_SUSPECTED = "dev.flotilla.decisions.DependencyFailureSuspected"
DIAGNOSIS_CONCLUDED = "dev.flotilla.decisions.DiagnosisConcluded"
RECOVERY_PROPOSED = "dev.flotilla.decisions.RecoveryProposed"
INCIDENT_ESCALATED = "dev.flotilla.incidents.IncidentEscalated"
ESCALATED_TO = ESCALATION_TARGET  # the rota the runtime escalates budget overruns to

DIAGNOSES = (DEPENDENCY_FAILURE_SUSPECTED, DIAGNOSIS_CONCLUDED)


def diagnosis_record(diagnosis: Diagnosis, *, job_id: str | None, now: datetime) -> tuple[str, dict[str, Any]]:
    """(record type, value without eventId) of a diagnosis that is not a request for more."""
    common = {
        "incidentId": diagnosis.incident_id,
        "service": diagnosis.service,
        "jobId": job_id,
        "reasoning": diagnosis.reasoning.to_record(),
        "concludedAt": now,
    }
    if diagnosis.verdict is Verdict.DEPENDENCY_FAILURE:
        return DEPENDENCY_FAILURE_SUSPECTED, {
            **common,
            "suspectedDependency": diagnosis.suspected_dependency,
            "failureMode": diagnosis.failure_mode,
        }
    if diagnosis.verdict is Verdict.CONCLUDED:
        return DIAGNOSIS_CONCLUDED, {
            **common,
            "causeCategory": diagnosis.cause_category,
            "summary": diagnosis.reasoning.summary,
        }
    raise ValueError(f"a {diagnosis.verdict} diagnosis is not a record")


def diagnosis_from_record(record_type: str, value: Mapping[str, Any]) -> Diagnosis:
    """The diagnosis a decoded DependencyFailureSuspected / DiagnosisConcluded carries."""
    reasoning = Reasoning.from_record(value["reasoning"])
    common: dict[str, Any] = {
        "incident_id": value["incidentId"],
        "service": value["service"],
        "reasoning": reasoning,
        "event_id": str(value["eventId"]),
    }
    if record_type == DEPENDENCY_FAILURE_SUSPECTED:
        return Diagnosis(
            verdict=Verdict.DEPENDENCY_FAILURE,
            suspected_dependency=value["suspectedDependency"],
            failure_mode=value["failureMode"],
            **common,
        )
    if record_type == DIAGNOSIS_CONCLUDED:
        return Diagnosis(verdict=Verdict.CONCLUDED, cause_category=value["causeCategory"], **common)
    raise ValueError(f"{record_type} is not a diagnosis")


def escalation_record(
    incident_id: str, *, reason: str, cause_event_id: str, cause_type: str, now: datetime
) -> dict[str, Any]:
    return {
        "incidentId": incident_id,
        "reason": reason,
        "causeEventId": cause_event_id,
        "causeType": cause_type,
        "escalatedTo": ESCALATED_TO,
        "escalatedAt": now,
    }
