"""What an Alertmanager alert may carry into the health agent (security review 3, H2):
labels, names and URLs over their bounds are refused with a 422 naming the field, the
summary is cut where a record copies it, and nothing the intake accepts can make a record
the outbox refuses. The same through the running agent: tests/e2e/test_estate.py."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from flotilla_evidence import Catalogue
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from flotilla.bounds import NAME_MAX
from flotilla.contracts import load_contracts
from flotilla.envelope import Envelope
from flotilla.outbox import Outbox, record_bytes
from flotilla.records import AlertObserved, DiagnosisRequested, ServiceDegraded
from flotilla.serde import AvroSerde
from services.health_agent import alerts
from services.health_agent.alerts import (
    ANNOTATION_VALUE_MAX,
    ANNOTATIONS_MAX,
    LABEL_NAME_MAX,
    LABEL_VALUE_MAX,
    LABELS_BYTES_MAX,
    LABELS_MAX,
    SUMMARY_MAX,
    URL_MAX,
    Intake,
    Notification,
)
from tests.unit.test_serde import FakeRegistry

INTAKE = Intake(
    service_labels=("service_name", "svc"),
    environment_labels=("deployment_environment_name",),
    default_environment="production",
    catalogue=Catalogue(),
    opens=True,
)


def alert(**over: Any) -> dict[str, Any]:
    return {
        "status": "firing",
        "labels": {"alertname": "ServiceLatencyHigh", "service_name": "checkout-api"},
        "annotations": {"summary": "slow"},
        "startsAt": "2026-12-06T12:00:00Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus/graph",
        "fingerprint": "c0ffee",
        **over,
    }


def payload(*items: dict[str, Any], **over: Any) -> dict[str, Any]:
    return {"version": "4", "status": "firing", "receiver": "flotilla", "alerts": list(items or [alert()]), **over}


def refusal(body: dict[str, Any]) -> tuple[tuple[Any, ...], str]:
    """Where the intake refused ``body`` and why (exactly one error expected)."""
    with pytest.raises(ValidationError) as refused:
        INTAKE.parse(_json(body))
    errors = refused.value.errors(include_input=False)
    assert len(errors) == 1, errors
    return tuple(errors[0]["loc"]), errors[0]["msg"]


def _json(body: dict[str, Any]) -> str:
    return json.dumps(body)


def labels(**extra: str) -> dict[str, str]:
    return {"alertname": "ServiceLatencyHigh", "service_name": "checkout-api", **extra}


@pytest.mark.parametrize(
    ("body", "where", "said"),
    [
        (payload(alert(labels=labels(big="x" * (LABEL_VALUE_MAX + 1)))), "labels", "label 'big' is 2049 characters"),
        (payload(alert(labels=labels(**{"n" * (LABEL_NAME_MAX + 1): "v"}))), "labels", "over 128 characters"),
        (
            payload(alert(labels=labels(**{f"l{i}": "v" for i in range(LABELS_MAX)}))),
            "labels",
            f"{LABELS_MAX + 2} labels, over the {LABELS_MAX}",
        ),
        (
            payload(alert(labels=labels(**{f"l{i}": "x" * 2000 for i in range(9)}))),
            "labels",
            f"over the {LABELS_BYTES_MAX} allowed",
        ),
        (payload(alert(labels=labels(service_name="s" * (NAME_MAX + 1)))), "labels", "'service_name' names"),
        (payload(alert(labels=labels(svc="s" * (NAME_MAX + 1)))), "labels", "'svc' names"),  # the intake's own
        (payload(alert(labels=labels(namespace="shop\nprod"))), "labels", "control or separator"),
        (payload(alert(labels=labels(alertname="A" * (NAME_MAX + 1)))), "labels", "'alertname' names"),
        (payload(alert(generatorURL="http://p/" + "g" * URL_MAX)), "generatorURL", f"at most {URL_MAX}"),
        (payload(externalURL="http://am/" + "e" * URL_MAX), "externalURL", f"at most {URL_MAX}"),
        (
            payload(alert(annotations={"runbook": "r" * (ANNOTATION_VALUE_MAX + 1)})),
            "annotations",
            "annotation 'runbook' is",
        ),
        (
            payload(alert(annotations={f"a{i}": "v" for i in range(ANNOTATIONS_MAX + 1)})),
            "annotations",
            "annotations, over",
        ),
    ],
)
def test_an_alert_over_a_bound_is_refused_naming_the_field(body: dict[str, Any], where: str, said: str) -> None:
    loc, message = refusal(body)
    assert loc[-1] == where and said in message, (loc, message)
    assert len(message) < 300  # the refused value is never repeated


def test_more_than_5000_alerts_are_refused() -> None:
    loc, message = refusal(payload(*[alert()] * 5001))
    assert loc == ("alerts",) and "5000" in message


def test_at_the_bounds_an_alert_is_taken() -> None:
    at = labels(service_name="s" * NAME_MAX, big="x" * LABEL_VALUE_MAX, **{"n" * LABEL_NAME_MAX: "v"})
    parsed = INTAKE.parse(_json(payload(alert(labels=at, generatorURL="u" * URL_MAX), externalURL="e" * URL_MAX)))
    assert parsed.alerts[0].labels == at
    # without the intake's context only the fixed name labels are names: its own are not
    Notification.model_validate(payload(alert(labels=labels(svc="s" * (NAME_MAX + 1)))))


def serde() -> AvroSerde:
    registry = FakeRegistry()
    contracts = {c.full_name: c for c in load_contracts()}
    for i, kind in enumerate((ServiceDegraded, DiagnosisRequested, AlertObserved), start=1):
        registry.add(contracts[kind.TYPE].subject, i, contracts[kind.TYPE].schema_str)
    return AvroSerde(registry)


SERDE = serde()
WIDE = "\U0001f600"  # four bytes of UTF-8 per character: the most a character weighs


def records_of(item: alerts.AlertIn) -> list[Any]:
    """Every record the intake makes of one alert (alerts._open, alerts._note)."""
    ref, summary = alerts._ref(item), alerts._summary(item)
    now = datetime(2026, 12, 6, tzinfo=UTC)
    where = {"service": "s" * NAME_MAX, "environment": "e" * NAME_MAX, "signal": "latency"}
    symptom = f"alert {ref.alert_name} (latency): {summary}"
    return [
        ServiceDegraded(incident_id="i-1", summary=summary, alert=ref, observed_at=now, **where),
        DiagnosisRequested(
            incident_id="i-1",
            symptom=symptom,
            alert=ref,
            trigger_event_id="0b0e5c1e-6a2f-4b7e-9a53-3c4f3f9d6a11",
            requested_at=now,
            **where,
        ),
        AlertObserved(incident_id="i-1", alert=ref, observed_at=now, **where),
    ]


def biggest(record: Any) -> int:
    env = Envelope(type=record.TYPE, source="/flotilla/health-agent", correlationid="i-1")
    return record_bytes(Outbox(SERDE).row(record, env))


def test_the_largest_alert_the_intake_takes_makes_records_far_below_the_outbox_limit() -> None:
    names = {"alertname": "A" * NAME_MAX, "service_name": "s" * NAME_MAX, "deployment_environment_name": "e" * 253}
    room = LABELS_BYTES_MAX - sum(len(k) + len(v) for k, v in names.items())
    filler = {f"l{i:02d}": WIDE * 500 for i in range(room // 2004)}  # 2004 bytes each
    item = alerts.AlertIn.model_validate(
        alert(
            labels={**names, **filler},
            annotations={"summary": WIDE * (ANNOTATION_VALUE_MAX - 2)},
            generatorURL=WIDE * URL_MAX,
        ),
        context={"name_labels": ("alertname", "service_name", "deployment_environment_name")},
    )
    assert len(alerts._ref(item).summary or "") == SUMMARY_MAX
    sizes = [biggest(r) for r in records_of(item)]
    print("largest records an alert can make (bytes):", sizes)
    assert max(sizes) < 64 * 1024, sizes  # the outbox takes 768 KiB


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(
        st.text(min_size=1, max_size=LABEL_NAME_MAX + 8),
        st.text(max_size=LABEL_VALUE_MAX + 8),
        max_size=12,
    ),
    st.text(max_size=URL_MAX + 8),
)
def test_whatever_the_labels_an_alert_is_refused_or_its_records_fit(extra: dict[str, str], url: str) -> None:
    try:
        parsed = INTAKE.parse(_json(payload(alert(labels={**extra, **labels()}, generatorURL=url))))
    except ValidationError as refused:
        assert all(e["loc"][-1] in ("labels", "generatorURL") for e in refused.errors()), refused.errors()
        return
    item = parsed.alerts[0]
    assert len(item.labels) <= LABELS_MAX and len(item.generatorURL) <= URL_MAX
    assert sum(len(k.encode()) + len(v.encode()) for k, v in item.labels.items()) <= LABELS_BYTES_MAX
    assert all(biggest(r) < 64 * 1024 for r in records_of(item))
