"""Decisions as contract records, and back: the one place that knows both shapes.

The diagnostic agent turns a :class:`Diagnosis` into DependencyFailureSuspected or
DiagnosisConcluded; the remediation agent reads those back into a Diagnosis. Records
here are not validated: the outbox validates every record against its registered schema
before it is written.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from flotilla.records import DependencyFailureSuspected, DiagnosisConcluded
from flotilla_reasoning.model import Diagnosis, Reasoning, Verdict

DiagnosisRecord = DependencyFailureSuspected | DiagnosisConcluded
DIAGNOSES = (DependencyFailureSuspected.TYPE, DiagnosisConcluded.TYPE)


def diagnosis_record(diagnosis: Diagnosis, *, job_id: str | None, now: datetime) -> DiagnosisRecord:
    """The record of a diagnosis that is not a request for more."""
    incident, service, reasoning = diagnosis.incident_id, diagnosis.service, diagnosis.reasoning.to_record()
    if diagnosis.verdict is Verdict.DEPENDENCY_FAILURE:
        assert diagnosis.suspected_dependency is not None and diagnosis.failure_mode is not None
        return DependencyFailureSuspected(
            incident_id=incident,
            service=service,
            environment=diagnosis.environment,
            job_id=job_id,
            reasoning=reasoning,
            concluded_at=now,
            suspected_dependency=diagnosis.suspected_dependency,
            failure_mode=diagnosis.failure_mode,
        )
    if diagnosis.verdict is Verdict.CONCLUDED:
        assert diagnosis.cause_category is not None
        return DiagnosisConcluded(
            incident_id=incident,
            service=service,
            environment=diagnosis.environment,
            job_id=job_id,
            reasoning=reasoning,
            concluded_at=now,
            cause_category=diagnosis.cause_category,
            summary=diagnosis.reasoning.summary,
        )
    raise ValueError(f"a {diagnosis.verdict} diagnosis is not a record")


def diagnosis_from_record(record: DiagnosisRecord) -> Diagnosis:
    """The diagnosis a DependencyFailureSuspected / DiagnosisConcluded carries."""
    common: dict[str, Any] = {
        "incident_id": record.incident_id,
        "service": record.service,
        "environment": record.environment,
        "reasoning": Reasoning.from_record(record.reasoning),
        "event_id": record.event_id,
    }
    if isinstance(record, DependencyFailureSuspected):
        return Diagnosis(
            verdict=Verdict.DEPENDENCY_FAILURE,
            suspected_dependency=record.suspected_dependency,
            failure_mode=record.failure_mode,
            **common,
        )
    return Diagnosis(verdict=Verdict.CONCLUDED, cause_category=record.cause_category, **common)


def read_diagnosis(record_type: str, value: Mapping[str, Any]) -> Diagnosis:
    """The diagnosis in a decoded value of either diagnosis type."""
    if record_type == DependencyFailureSuspected.TYPE:
        return diagnosis_from_record(DependencyFailureSuspected.from_value(value))
    if record_type == DiagnosisConcluded.TYPE:
        return diagnosis_from_record(DiagnosisConcluded.from_value(value))
    raise ValueError(f"{record_type} is not a diagnosis")
