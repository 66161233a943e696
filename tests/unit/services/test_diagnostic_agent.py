"""The diagnostic agent's pure pieces: reading the sim, and the records it builds."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from fastavro import parse_schema
from flotilla_reasoning import RulesReasoner, SimClient, SimUnavailable
from flotilla_reasoning.records import diagnosis_record, read_diagnosis

from flotilla.contracts import load_contracts
from flotilla.records import DependencyFailureSuspected, DiagnosisConcluded
from flotilla.validation import RecordValidator
from services.diagnostic_agent import DiagnosticSettings

from .test_reasoner_rules import demo_topology, evidence

SERVICES = [
    {
        "name": "checkout-api",
        "environment": "production",
        "replicas": 4,
        "revision": "v41",
        "previousRevision": "v40",
        "dependencies": ["payments-api", "inventory-db"],
        "failoverTargets": {"payments-api": "payments-api-secondary"},
        "activeDependencies": {"payments-api": "payments-api", "inventory-db": "inventory-db"},
        "p95Ms": 1831.0,
        "thresholdMs": 500.0,
        "faults": [],
    },
    {"name": "payments-api", "environment": "production", "replicas": 3, "p95Ms": 280.0, "thresholdMs": 400.0},
]
METRICS = """\
# HELP sim_dependency_latency_p95_ms p95 latency the service sees from a dependency, ms.
# TYPE sim_dependency_latency_p95_ms gauge
sim_dependency_latency_p95_ms{dependency="payments-api",service="checkout-api"} 280.0
sim_dependency_latency_p95_ms{dependency="inventory-db",service="checkout-api"} 25.0
# TYPE sim_pool_utilization_ratio gauge
sim_pool_utilization_ratio{service="checkout-api"} 2.125
# TYPE sim_latency_p95_ms gauge
sim_latency_p95_ms{service="checkout-api"} 1831.0
"""


def sim(handler: Any) -> SimClient:
    return SimClient("http://sim.test", transport=httpx.MockTransport(handler))


def serving(services: Any = SERVICES, metrics: str = METRICS, status: int = 200) -> SimClient:
    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/services":
            return httpx.Response(status, json=services)
        if request.url.path == "/metrics":
            return httpx.Response(status, text=metrics)
        return httpx.Response(404)

    return sim(handle)


def test_a_snapshot_reads_services_and_metrics() -> None:
    topology = serving().snapshot()
    checkout = topology.services["checkout-api"]
    assert checkout.replicas == 4
    assert checkout.dependencies == ("payments-api", "inventory-db")
    assert checkout.failover_targets == {"payments-api": "payments-api-secondary"}
    assert checkout.degraded
    assert topology.dependency_p95 == {("checkout-api", "payments-api"): 280.0, ("checkout-api", "inventory-db"): 25.0}
    assert topology.utilization == {"checkout-api": 2.125}
    assert topology.observed_dependency_p95("checkout-api", "payments-api") == 280.0
    assert topology.services["payments-api"].dependencies == ()


@pytest.mark.parametrize(
    "client",
    [
        serving(status=503),
        serving(services={"not": "a list"}),
        serving(services=[{"name": "x"}]),
        serving(metrics="this is { not prometheus"),
    ],
    ids=["5xx", "not a list", "missing fields", "bad metrics"],
)
def test_anything_but_the_documented_api_is_sim_unavailable(client: SimClient) -> None:
    with pytest.raises(SimUnavailable):
        client.snapshot()


def test_an_unreachable_sim_is_sim_unavailable() -> None:
    with pytest.raises(SimUnavailable, match="ConnectError"):
        SimClient("http://127.0.0.1:9", timeout=1).snapshot()


@pytest.mark.parametrize("estate", ["default", "generated"])
def test_a_snapshot_around_a_service_reads_its_neighbourhood_only(estate: str) -> None:
    """Against the real sim (the demo topology with its failover, and 200 generated
    services): the service, its dependencies and their failover targets, with the same
    values as the whole-estate snapshot, and the series of nobody else."""
    from fastapi.testclient import TestClient

    from services.sim import SimModel, create_sim_app

    model = SimModel.default() if estate == "default" else SimModel.generated(200)
    app = TestClient(create_sim_app(model, action_token="the-executors-sim-action-token", action_seconds=0))
    asked: list[httpx.URL] = []

    def through_app(request: httpx.Request) -> httpx.Response:
        asked.append(request.url)
        answer = app.get(request.url.raw_path.decode())
        return httpx.Response(answer.status_code, content=answer.content, headers=answer.headers)

    client = sim(through_app)
    whole = client.snapshot()
    caller = max(whole.services.values(), key=lambda s: (len(s.failover_targets), len(s.dependencies)))
    asked.clear()

    around = client.snapshot(around=caller.name)
    expected = {caller.name, *caller.dependencies, *caller.failover_targets.values()}
    assert len(expected) > 1
    if estate == "default":
        assert "payments-api-secondary" in expected
    assert set(around.services) == expected < set(whole.services)
    assert all(around.services[name] == whole.services[name] for name in expected)
    assert around.dependency_p95 == {k: v for k, v in whole.dependency_p95.items() if k[0] in expected}
    assert around.utilization == {k: v for k, v in whole.utilization.items() if k in expected}
    assert [url.path for url in asked] == ["/services", "/services", "/metrics"]
    assert client.snapshot(around=f"{caller.environment}/{caller.name}").services == around.services


def test_a_snapshot_around_an_unknown_service_has_nothing_to_reason_on() -> None:
    assert serving(services=[]).snapshot(around="ghost-api").services == {}


def test_a_sim_that_ignores_the_filters_still_gives_the_right_neighbourhood() -> None:
    """An older sim answers ``?name=`` with everything: the snapshot holds more, never less."""
    topology = serving().snapshot(around="checkout-api")
    assert set(topology.services) == {"checkout-api", "payments-api"}
    assert topology.services["checkout-api"].degraded


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
