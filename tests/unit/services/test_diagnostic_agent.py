"""The diagnostic agent's pure pieces: the records it builds (its evidence: tests/unit/evidence)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from fastavro import parse_schema
from flotilla_reasoning import RulesReasoner
from flotilla_reasoning.records import diagnosis_record, read_diagnosis

from flotilla.contracts import load_contracts
from flotilla.records import DependencyFailureSuspected, DiagnosisConcluded
from flotilla.validation import RecordValidator
from services.diagnostic_agent import DiagnosticSettings

from .test_reasoner_rules import demo_topology, evidence


def validator(full_name: str) -> RecordValidator:
    return RecordValidator(parse_schema(next(c.schema for c in load_contracts() if c.full_name == full_name)))


def test_a_suspected_dependency_becomes_a_valid_record_and_back() -> None:
    diagnosis = RulesReasoner().diagnose(evidence(demo_topology()))
    now = datetime.now(UTC)
    record = diagnosis_record(diagnosis, job_id=str(uuid.uuid4()), now=now)
    assert isinstance(record, DependencyFailureSuspected)
    value = {"eventId": str(uuid.uuid4()), **record.to_value()}
    assert validator(record.TYPE).problems(value) == []
    back = read_diagnosis(record.TYPE, value)
    assert back.suspected_dependency == "payments-api"
    assert back.environment == "production"  # the remediation agent reads the right estate
    assert back.event_id == value["eventId"]
    assert back.reasoning == diagnosis.reasoning


def test_a_conclusion_becomes_a_valid_record() -> None:
    diagnosis = RulesReasoner().diagnose(evidence(demo_topology(payments_ms=36.0), may_request_more=False))
    record = diagnosis_record(diagnosis, job_id=None, now=datetime.now(UTC))
    assert isinstance(record, DiagnosisConcluded)
    assert validator(record.TYPE).problems({"eventId": str(uuid.uuid4()), **record.to_value()}) == []
    assert record.cause_category == "capacity"


def test_settings_default_to_the_fleet_table() -> None:
    settings = DiagnosticSettings()
    assert (settings.service_name, settings.service_database, settings.http_port) == (
        "diagnostic-agent",
        "flotilla_diagnostic",
        18102,
    )
    assert settings.reasoner == "rules"
    assert settings.diagnostic_job_seconds == 0
