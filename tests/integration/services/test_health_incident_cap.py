"""The cap on incidents per service per hour, on the real stack (PostgreSQL, Kafka, Connect).

The health agent is prepared as ``python -m services.health_agent`` prepares it (its own
database, migrations, outbox connector) under unique names and topic, with
``FLOTILLA_HEALTH_INCIDENTS_PER_HOUR=2``. Alerts go through the real intake
(``alerts.receive``), readings through the real scraper reading a scripted /metrics.
Past the cap: no incident to work on, the one escalated notice an hour reaches Kafka
through the service's outbox connector, the rest only counted and logged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from flotilla_evidence import parse_catalogue
from prometheus_client import REGISTRY

from flotilla.bootstrap import drop_outbox
from flotilla.contracts import Contract, load_contracts, register
from flotilla.fleet import HEALTH
from flotilla.runner import ServiceContext, prepare
from flotilla.settings import StackSettings
from services.health_agent import alerts
from services.health_agent import service as health_service
from services.health_agent.settings import HealthSettings
from tests.keys import fact_settings

from ..kafka_wait import by_event_id, tail_consumer, wait_for

pytestmark = pytest.mark.timeout(300)

RUN = uuid.uuid4().hex[:8]
TOPIC = f"it-cap-{RUN}"
DATABASE = f"flotilla_it_cap_{RUN}"
CAP = 2
ESCALATED = "dev.flotilla.incidents.IncidentEscalated"
DEGRADED = "dev.flotilla.incidents.ServiceDegraded"
REQUESTED = "dev.flotilla.incidents.DiagnosisRequested"
FLAPPING, STEADY, BREACHING = f"flapping-{RUN}", f"steady-{RUN}", f"breaching-{RUN}"


@dataclasses.dataclass
class Readings:
    """A /metrics of the sim's shape: p95 and threshold per service, from a dict the test changes."""

    services: dict[str, tuple[float, float]]
    url: str


@pytest.fixture(scope="module")
def readings() -> Iterator[Readings]:
    services: dict[str, tuple[float, float]] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            lines = ["# TYPE sim_latency_p95_ms gauge"]
            lines += [f'sim_latency_p95_ms{{service="{s}"}} {p}' for s, (p, _) in sorted(services.items())]
            lines += ["# TYPE sim_latency_threshold_ms gauge"]
            lines += [f'sim_latency_threshold_ms{{service="{s}"}} {t}' for s, (_, t) in sorted(services.items())]
            body = ("\n".join(lines) + "\n").encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield Readings(services, f"http://127.0.0.1:{server.server_address[1]}")
    server.shutdown()


@pytest.fixture(scope="module")
def agent(stack: StackSettings, registry: SchemaRegistryClient, readings: Readings) -> Iterator[ServiceContext]:
    admin = AdminClient({"bootstrap.servers": stack.kafka_bootstrap})
    names = [TOPIC, f"{TOPIC}.dlq"]
    for fut in admin.create_topics([NewTopic(n, num_partitions=1, replication_factor=1) for n in names]).values():
        fut.result(15)
    contracts = [Contract(TOPIC, c.schema) for c in load_contracts() if c.topic == "incidents"]
    for contract in contracts:
        register(registry, contract)
    settings = HealthSettings(
        **{**stack.model_dump(), **fact_settings()},
        service_name=f"it-cap-{RUN}",
        service_database=DATABASE,
        incidents_topic=TOPIC,
        health_source="scrape",
        sim_url=readings.url,
        health_scrape_seconds=0.05,
        health_breach_scrapes=3,
        health_clear_scrapes=2,
        health_incidents_per_hour=CAP,
        http_port=0,
    )
    spec = dataclasses.replace(health_service.build_spec(settings), producer=HEALTH.name)
    ctx = prepare(spec, settings)
    yield ctx
    ctx.pool.close()
    drop_outbox(stack, DATABASE)
    for contract in contracts:
        for permanent in (False, True):
            with contextlib.suppress(Exception):
                registry.delete_subject(contract.subject, permanent=permanent)
    for fut in admin.delete_topics(names).values():
        with contextlib.suppress(Exception):
            fut.result(15)


CATALOGUE = parse_catalogue(
    {"services": [{"name": s, "latency_threshold_ms": 300} for s in (FLAPPING, STEADY, BREACHING)]},
    origin="test",
    default_environment="production",
)
INTAKE = alerts.Intake(("service",), ("environment",), "production", CATALOGUE, opens=True, topic=TOPIC)


def fire(ctx: ServiceContext, service: str) -> alerts.Received:
    """A new firing of an alert about ``service`` (a fingerprint of its own each time)."""
    one = {
        "status": "firing",
        "labels": {"alertname": "ErrorsHigh", "service": service},
        "startsAt": datetime.now(UTC),
        "fingerprint": uuid.uuid4().hex[:16],
    }
    notification = alerts.Notification.model_validate({"version": "4", "status": "firing", "alerts": [one]})
    (received,) = alerts.receive(ctx, INTAKE, notification)
    return received


def rows(stack: StackSettings, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(stack.pg_dsn(DATABASE), autocommit=True) as conn:
        return conn.execute(sql, args).fetchall()


def execute(stack: StackSettings, sql: str, *args: Any) -> None:
    with psycopg.connect(stack.pg_dsn(DATABASE), autocommit=True) as conn:
        conn.execute(sql, args)


def finish(stack: StackSettings, service: str) -> None:
    """The fleet is done with the service's incident: it holds the service no more."""
    execute(stack, "UPDATE health_incidents SET cleared_at = now() WHERE service = %s AND cleared_at IS NULL", service)


def capped(service: str) -> float:
    return REGISTRY.get_sample_value("flotilla_health_incidents_capped_total", {"service": service}) or 0.0


def open_up_to_the_cap(ctx: ServiceContext, stack: StackSettings, service: str) -> None:
    for _ in range(CAP):
        assert fire(ctx, service).outcome == "opened"
        finish(stack, service)


def test_past_the_cap_an_alert_opens_nothing_and_people_are_told_once(
    agent: ServiceContext, stack: StackSettings
) -> None:
    consumer = tail_consumer(stack.kafka_bootstrap, [TOPIC])
    try:
        open_up_to_the_cap(agent, stack, FLAPPING)
        before = capped(FLAPPING)

        third = fire(agent, FLAPPING)
        assert (third.outcome, third.incident_id) == ("recorded", None)
        assert capped(FLAPPING) == before + 1
        ((notice, cleared),) = rows(
            stack, "SELECT incident_id, cleared_at FROM health_incidents WHERE service = %s AND cap_notice", FLAPPING
        )
        assert cleared is not None  # holds nothing
        written = rows(stack, "SELECT type, id FROM outbox WHERE aggregateid = %s ORDER BY created_at", notice)
        assert [t for t, _ in written] == [DEGRADED, ESCALATED]  # what was seen, then people: no diagnosis
        escalated_id = str(written[1][1])
        reached = wait_for(consumer, by_event_id(escalated_id), timeout=60)  # through the real connector
        assert reached.key() == notice.encode()

        fourth = fire(agent, FLAPPING)
        assert (fourth.outcome, fourth.incident_id) == ("recorded", None)
        assert capped(FLAPPING) == before + 2
        assert len(rows(stack, "SELECT 1 FROM health_incidents WHERE service = %s", FLAPPING)) == CAP + 1
        assert rows(stack, "SELECT count(*) FROM outbox WHERE type = %s", ESCALATED) == [(1,)]

        assert fire(agent, STEADY).outcome == "opened"  # another service is not held back
        finish(stack, STEADY)

        # An hour on, the service may open incidents again.
        execute(
            stack,
            "UPDATE health_incidents SET opened_at = opened_at - interval '61 minutes' WHERE service = %s",
            FLAPPING,
        )
        assert fire(agent, FLAPPING).outcome == "opened"
        assert rows(stack, "SELECT count(*) FROM outbox WHERE type = %s", REQUESTED)[0][0] == CAP + 2
    finally:
        consumer.close()


def scrape(ctx: ServiceContext, times: int) -> None:
    task = ctx.spec.periodic[0][1]
    for _ in range(times):
        task(ctx)
        time.sleep(0.06)  # a scrape interval: closer ones count as another replica's


def test_a_breach_past_the_cap_opens_nothing_and_ends_as_usual(
    agent: ServiceContext, stack: StackSettings, readings: Readings
) -> None:
    open_up_to_the_cap(agent, stack, BREACHING)
    readings.services[BREACHING] = (1800.0, 300.0)
    scrape(agent, 5)
    phase = rows(stack, "SELECT phase, open_incident FROM detector_state WHERE service = %s", BREACHING)
    assert phase == [("breaching", None)]
    kinds = rows(
        stack, "SELECT cap_notice, opened_by FROM health_incidents WHERE service = %s ORDER BY opened_at", BREACHING
    )
    assert kinds == [(False, "alert")] * CAP + [(True, "metrics")]
    readings.services[BREACHING] = (100.0, 300.0)
    scrape(agent, 4)
    assert rows(stack, "SELECT phase, open_incident FROM detector_state WHERE service = %s", BREACHING) == [
        ("healthy", None)
    ]
