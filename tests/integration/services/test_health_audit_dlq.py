"""The health agent, the audit service and the DLQ reconciler on the real stack.

Each service is prepared exactly as ``python -m services.<package>`` prepares it (its own
database, migrations, outbox connector where it publishes) but under unique names, on
unique topics (``incidents`` contracts registered for them), and its consumer loop and
periodic task are driven step by step from the test. Everything is removed afterwards.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Message
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from fastapi.testclient import TestClient
from flotilla_evidence.catalogue import Catalogue
from flotilla_ops.samples import SERVICE_LATENCY_INCREASED, latency_fact, sample_value
from prometheus_client import REGISTRY

from flotilla import deadletter
from flotilla.bootstrap import drop_outbox
from flotilla.consumer import ConsumerLoop, LoopConfig
from flotilla.contracts import Contract, load_contracts, register
from flotilla.envelope import Envelope
from flotilla.fleet import HEALTH
from flotilla.handling import BusinessRuleViolation, HandlerContext
from flotilla.http import create_app
from flotilla.keys import load_or_create, public_key_text
from flotilla.runner import ServiceContext, build_loop, prepare
from flotilla.serde import AvroSerde
from flotilla.settings import StackSettings
from flotilla.tailing import header
from flotilla.workflow import Status, WorkflowStore
from services.audit import service as audit_service
from services.audit.chain import Signer
from services.audit.settings import AuditSettings
from services.dlq_reconciler import service as dlq_service
from services.dlq_reconciler.settings import DEMO_OPERATOR_DIGEST, DEMO_OPERATOR_TOKEN, DlqSettings
from services.health_agent import alerts
from services.health_agent import service as health_service
from services.health_agent.incidents import clear
from services.health_agent.scrape import settled
from services.health_agent.settings import HealthSettings
from tests.keys import fact_settings, signed_headers
from tests.support.producing import ordered_producer

from ..kafka_wait import tail_consumer, wait_for

pytestmark = pytest.mark.timeout(300)

RUN = uuid.uuid4().hex[:8]
TOPIC = f"it-had-{RUN}"  # the incidents topic of the health agent and the DLQ reconciler
AUDITED = f"it-had-audit-{RUN}"  # what the audit test records
ANCHORS = f"it-had-anchors-{RUN}"  # where that audit anchors its chain
HEALTH_DB = f"flotilla_it_health_{RUN}"
AUDIT_DB = f"flotilla_it_audit_{RUN}"
DLQ_DB = f"flotilla_it_dlq_{RUN}"

FACT = "dev.flotilla.incidents."
DECISION = "dev.flotilla.decisions."
DIAGNOSIS_REQUESTED = FACT + "DiagnosisRequested"
RECOVERY_EXECUTED = FACT + "RecoveryExecuted"
RECOVERY_COMPLETED = FACT + "RecoveryCompleted"
RECOVERY_FAILED = FACT + "RecoveryFailed"
ESCALATED = FACT + "IncidentEscalated"
QUARANTINED = FACT + "DeadLetterQuarantined"
SCHEMAS = {c.full_name: c.schema for c in load_contracts()}


# ------------------------------------------------------------------ plumbing


def until(condition: Callable[[], Any], timeout: float = 30, step: float = 0.1, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(step)
    raise AssertionError(f"{what} not reached within {timeout:.0f} s")


def drain_until(poll: Callable[[], int], condition: Callable[[], Any], timeout: float = 60, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what or 'condition'} not reached within {timeout:.0f} s"
        poll()


def query(stack: StackSettings, database: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(stack.pg_dsn(database)) as conn:
        return conn.execute(sql, args).fetchall()


def produce(stack: StackSettings, topic: str, records: list[tuple[str | None, bytes | None, list[Any]]]) -> None:
    # murmur2, as Debezium places keys: our records join their incident's partition
    producer = ordered_producer(stack.kafka_bootstrap, partitioner="murmur2_random")
    for key, value, headers in records:
        producer.produce(topic, key=key, value=value, headers=headers)
    assert producer.flush(15) == 0


def record(serde: AvroSerde, topic: str, env: Envelope, **fields: Any) -> tuple[str, bytes, list[Any]]:
    value = sample_value(SCHEMAS[env.type], eventId=env.id, incidentId=env.correlationid, **fields)
    payload = serde.serialize(topic, env.type, value)
    return env.correlationid, payload, signed_headers(env, payload)


def outbox(stack: StackSettings, database: str, record_type: str, incident: str) -> list[tuple[Any, ...]]:
    return query(
        stack,
        database,
        "SELECT id, ce_causationid, payload, ce_hops FROM outbox WHERE type = %s AND aggregateid = %s "
        "ORDER BY created_at",
        record_type,
        incident,
    )


def outbox_envelope(stack: StackSettings, record_type: str, incident: str) -> Envelope:
    """The envelope of the one ``record_type`` row the health agent wrote for ``incident``."""
    ((event_id, source, at, correlation, cause, hops, trace),) = query(
        stack,
        HEALTH_DB,
        "SELECT id, ce_source, ce_time, ce_correlationid, ce_causationid, ce_hops, ce_traceparent FROM outbox "
        "WHERE type = %s AND aggregateid = %s",
        record_type,
        incident,
    )
    return Envelope(record_type, source, correlation, str(event_id), at, cause, int(hops), trace)


@dataclass
class FakeSim:
    """The sim's /metrics, served from a dict the test changes."""

    services: dict[str, tuple[float, float]]
    server: ThreadingHTTPServer

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def set(self, service: str, p95: float, threshold: float) -> None:
        self.services[service] = (p95, threshold)


@pytest.fixture(scope="module")
def sim() -> Iterator[FakeSim]:
    services: dict[str, tuple[float, float]] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/metrics":
                self.send_error(404)
                return
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
    yield FakeSim(services, server)
    server.shutdown()


@pytest.fixture(scope="module")
def topics(stack: StackSettings, registry: SchemaRegistryClient) -> Iterator[None]:
    """Unique topics and their DLQs, with the ``incidents`` contracts registered for them."""
    admin = AdminClient({"bootstrap.servers": stack.kafka_bootstrap})
    names = [TOPIC, f"{TOPIC}.dlq", AUDITED, f"{AUDITED}.dlq", ANCHORS]
    for fut in admin.create_topics([NewTopic(n, num_partitions=3, replication_factor=1) for n in names]).values():
        fut.result(15)
    contracts = [Contract(t, c.schema) for t in (TOPIC, AUDITED) for c in load_contracts() if c.topic == "incidents"]
    contracts += [Contract(ANCHORS, c.schema) for c in load_contracts() if c.topic == "audit.anchors"]
    for contract in contracts:
        register(registry, contract)
    yield
    for contract in contracts:
        for permanent in (False, True):
            with contextlib.suppress(Exception):
                registry.delete_subject(contract.subject, permanent=permanent)
    for fut in admin.delete_topics(names).values():
        with contextlib.suppress(Exception):
            fut.result(15)
    groups = [f"it-{n}-{RUN}{again}" for n in ("health", "audit", "dlq", "victim") for again in ("", "-again")]
    for fut in admin.delete_consumer_groups(groups).values():
        with contextlib.suppress(Exception):  # never-created groups do not exist
            fut.result(15)


def stack_fields(stack: StackSettings) -> dict[str, Any]:
    """The stack's settings and the producers' keys (tests.keys): what a member needs."""
    return {**stack.model_dump(), **fact_settings()}


# ================================================================= health agent


@pytest.fixture(scope="module")
def health(stack: StackSettings, topics: None, sim: FakeSim) -> Iterator[tuple[ServiceContext, HealthSettings]]:
    settings = HealthSettings(
        **stack_fields(stack),
        service_name=f"it-health-{RUN}",
        service_database=HEALTH_DB,
        incidents_topic=TOPIC,
        # the direct scrape of a scripted /metrics: this module drives detection and
        # verification tick by tick (the Prometheus path: tests/e2e/test_estate.py)
        health_source="scrape",
        sim_url=sim.url,
        health_scrape_seconds=0.05,
        health_breach_scrapes=3,
        health_clear_scrapes=2,
        # 3 s, not less: the test's own loop drives the scrapes, and one stall in it longer
        # than the allowed gap between samples restarts the healthy run (3W to succeed).
        health_verify_seconds=3.0,
        http_port=0,
    )
    # A group of its own (never the running fleet's), stating records as the health agent:
    # they must carry that producer's name to be believed (flotilla.provenance).
    spec = dataclasses.replace(health_service.build_spec(settings), producer=HEALTH.name)
    ctx = prepare(spec, settings)
    yield ctx, settings
    ctx.pool.close()
    drop_outbox(stack, HEALTH_DB)


def scrape(ctx: ServiceContext, times: int = 1) -> None:
    task = ctx.spec.periodic[0][1]
    for _ in range(times):
        task(ctx)
        time.sleep(0.06)  # a scrape interval: closer ones count as another replica's


def incidents_of(stack: StackSettings, service: str) -> list[str]:
    rows = query(stack, HEALTH_DB, "SELECT incident_id FROM health_incidents WHERE service = %s", service)
    return [r[0] for r in rows]


def handled(stack: StackSettings, consumer: str, *event_ids: str) -> Callable[[], bool]:
    def check() -> bool:
        rows = query(
            stack,
            HEALTH_DB,
            "SELECT count(*) FROM processed_events WHERE consumer = %s AND event_id = ANY(%s)",
            consumer,
            list(event_ids),
        )
        return int(rows[0][0]) == len(event_ids)

    return check


def run_plan(
    stack: StackSettings, serde: AvroSerde, loop: ConsumerLoop, consumer: str, incident: str, steps: int
) -> tuple[str, list[Envelope]]:
    """Diagnosis → proposal of ``steps`` commands → approval → one execution per step,
    as the other services would publish them; returns the proposal id and executions.
    Checks that no verification starts before the last step."""
    latency = outbox_envelope(stack, SERVICE_LATENCY_INCREASED, incident)
    diagnosis = outbox_envelope(stack, DIAGNOSIS_REQUESTED, incident)
    assert diagnosis.causationid == latency.id and diagnosis.hops == latency.hops - 1
    drain_until(loop.poll_once, handled(stack, consumer, latency.id, diagnosis.id), what="the agent's own records")
    proposal = str(uuid.uuid4())
    command_ids = [str(uuid.uuid4()) for _ in range(steps)]
    suspected = diagnosis.caused(DECISION + "DependencyFailureSuspected", "/flotilla/diagnostic-agent")
    proposed = suspected.caused(DECISION + "RecoveryProposed", "/flotilla/remediation-agent")
    approved = proposed.caused(FACT + "RecoveryApproved", "/flotilla/policy-service")
    scale = SCHEMAS["dev.flotilla.commands.ScaleService"]
    plan = [sample_value(scale, commandId=c, incidentId=incident, proposalId=proposal) for c in command_ids]
    target = {"kind": "service", "environment": "production", "name": "checkout-api"}
    executions = []
    previous = approved
    for command_id in command_ids:
        previous = previous.caused(RECOVERY_EXECUTED, "/flotilla/executor")
        executions.append((previous, command_id))
    produce(
        stack,
        TOPIC,
        [
            record(serde, TOPIC, suspected),
            record(serde, TOPIC, proposed, proposalId=proposal, steps=plan, diagnosisEventId=suspected.id),
            record(serde, TOPIC, approved, proposalId=proposal),
        ],
    )
    for i, (env, command_id) in enumerate(executions):
        produce(
            stack,
            TOPIC,
            [record(serde, TOPIC, env, proposalId=proposal, commandId=command_id, target=target, compensates=None)],
        )
        drain_until(loop.poll_once, handled(stack, consumer, env.id), what=f"execution {i + 1}")
        started = query(stack, HEALTH_DB, "SELECT count(*) FROM verifications WHERE proposal_id = %s", proposal)
        assert int(started[0][0]) == (1 if i == steps - 1 else 0), "verification starts after the last step only"
    return proposal, [env for env, _ in executions]


def test_health_agent_opens_one_incident_per_sustained_breach_and_verifies_recovery(
    stack: StackSettings, serde: AvroSerde, health: tuple[ServiceContext, HealthSettings], sim: FakeSim
) -> None:
    ctx, settings = health
    sim.set("checkout-api", 1800.0, 500.0)
    sim.set("payments-api", 120.0, 300.0)

    scrape(ctx, 2)
    assert incidents_of(stack, "checkout-api") == []  # K = 3: not yet
    scrape(ctx, 20)  # the breach goes on ...
    assert len(incidents_of(stack, "checkout-api")) == 1  # ... and opens exactly one incident
    assert incidents_of(stack, "payments-api") == []
    (incident,) = incidents_of(stack, "checkout-api")
    assert incident.startswith("incident-")

    (latency,) = outbox(stack, HEALTH_DB, SERVICE_LATENCY_INCREASED, incident)
    (diagnosis,) = outbox(stack, HEALTH_DB, DIAGNOSIS_REQUESTED, incident)
    assert diagnosis[1] == str(latency[0])  # DiagnosisRequested is caused by ServiceLatencyIncreased
    fact = serde.deserialize(bytes(latency[2])).value
    assert (fact["service"], fact["p95LatencyMs"], fact["thresholdMs"]) == ("checkout-api", 1800.0, 500.0)
    request = serde.deserialize(bytes(diagnosis[2])).value
    assert str(request["triggerEventId"]) == str(latency[0])

    # The plan runs (two steps), published by the "other services" onto the topic.
    loop = build_loop(ctx)
    consumer = settings.service_name
    try:
        proposal, executions = run_plan(stack, serde, loop, consumer, incident, steps=2)

        # The service recovers: a full window under the threshold completes the recovery.
        sim.set("checkout-api", 240.0, 500.0)
        until(lambda: scrape(ctx) or outbox(stack, HEALTH_DB, RECOVERY_COMPLETED, incident), timeout=15)
        scrape(ctx, 10)
        (completed,) = outbox(stack, HEALTH_DB, RECOVERY_COMPLETED, incident)  # exactly once
        assert completed[1] == executions[-1].id  # caused by the last execution
        value = serde.deserialize(bytes(completed[2])).value
        assert str(value["proposalId"]) == proposal
        assert value["p95LatencyMs"] <= 500.0 and value["windowSeconds"] == 3
        assert outbox(stack, HEALTH_DB, RECOVERY_FAILED, incident) == []
        cleared = query(stack, HEALTH_DB, "SELECT cleared_at FROM health_incidents WHERE incident_id = %s", incident)
        assert cleared[0][0] is not None  # M healthy scrapes ended the breach

        # The fact went through Debezium to the topic; the agent's own workflow resolves.
        def resolved() -> bool:
            with ctx.pool.connection() as conn:
                return WorkflowStore.load_for_update(conn, incident).status is Status.RESOLVED

        drain_until(loop.poll_once, resolved, what="the incident resolving")

        # A second breach, on another service, whose recovery does not work.
        sim.set("payments-api", 900.0, 300.0)
        scrape(ctx, 5)
        (failing,) = incidents_of(stack, "payments-api")
        assert failing != incident
        failing_proposal, executions = run_plan(stack, serde, loop, consumer, failing, steps=1)
        until(lambda: scrape(ctx) or outbox(stack, HEALTH_DB, RECOVERY_FAILED, failing), timeout=15)
        scrape(ctx, 10)
        (failed,) = outbox(stack, HEALTH_DB, RECOVERY_FAILED, failing)  # exactly once
        assert failed[1] == executions[-1].id
        value = serde.deserialize(bytes(failed[2])).value
        assert value["stage"] == "VERIFICATION"
        assert value["compensationRequired"] is True
        assert value["p95LatencyMs"] == 900.0 and value["failedCommandId"] is None
        assert outbox(stack, HEALTH_DB, RECOVERY_COMPLETED, failing) == []
        assert len(incidents_of(stack, "payments-api")) == 1  # still the one breach

        # The executor undoes the plan; the service still breaches, and the detector opens
        # one incident per breach: the failed recovery goes to people, once.
        verdict = outbox_envelope(stack, RECOVERY_FAILED, failing)
        drain_until(loop.poll_once, handled(stack, consumer, verdict.id), what="the RecoveryFailed")
        undone = verdict.caused(FACT + "CompensationCompleted", "/flotilla/executor")
        compensation = record(serde, TOPIC, undone, proposalId=failing_proposal, summary="Undid 1 step(s)")
        produce(stack, TOPIC, [compensation, compensation])  # and once more, redelivered
        drain_until(loop.poll_once, handled(stack, consumer, undone.id), what="the CompensationCompleted")
        scrape(ctx, 3)
        (escalated,) = outbox(stack, HEALTH_DB, ESCALATED, failing)
        assert escalated[1] == undone.id
        reason = serde.deserialize(bytes(escalated[2])).value["reason"]
        assert "failed and was undone (Undid 1 step(s))" in reason, reason
        assert "production/payments-api still breaches: p95 900 ms against 300 ms" in reason, reason
    finally:
        loop.stop()
        loop.run()  # closes the consumer


def breach_opens_an_incident(ctx: ServiceContext, stack: StackSettings, sim: FakeSim, service: str) -> str:
    """Breach ``service`` long enough for the agent to open its incident; that incident."""
    sim.set(service, 1800.0, 500.0)
    scrape(ctx, 5)
    (incident,) = incidents_of(stack, service)
    return incident


def mark_escalated(conn: psycopg.Connection[Any], incident: str) -> None:
    """The health agent's workflow row says the fleet has finished ``incident`` (escalated)."""
    conn.execute(
        "INSERT INTO incident_workflow (incident_id, status, version, opened_at, updated_at) "
        "VALUES (%s, 'ESCALATED', 1, now(), now()) ON CONFLICT (incident_id) DO UPDATE SET status = 'ESCALATED'",
        (incident,),
    )


def test_a_service_held_by_a_firing_alert_is_not_settled_until_the_alert_resolves(
    stack: StackSettings, health: tuple[ServiceContext, HealthSettings], sim: FakeSim
) -> None:
    """The agent's breach is over but an alert that joined the incident still fires: the
    incident holds the service, so a fault now would join it, not open a new one. Whoever
    waits for a settled service (tests, benchmarks) must see it as not settled."""
    ctx, _ = health
    service = f"held-{RUN}"
    incident = breach_opens_an_incident(ctx, stack, sim, service)
    with psycopg.connect(stack.pg_dsn(HEALTH_DB), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO alerts (fingerprint, starts_at, alert_name, environment, service, signal, labels, "
            "annotations, status, outcome, incident_id) "
            "VALUES (%s, now(), 'LatencyHigh', 'production', %s, 'latency', '{}', '{}', 'firing', 'joined', %s)",
            (f"fp-{RUN}", service, incident),
        )
    sim.set(service, 100.0, 500.0)
    scrape(ctx, 5)  # the agent's own reading is healthy again ...
    with psycopg.connect(stack.pg_dsn(HEALTH_DB), autocommit=True) as conn:
        phase = conn.execute("SELECT phase, open_incident FROM detector_state WHERE service = %s", (service,))
        assert phase.fetchone() == ("healthy", None)
        assert not settled(conn, service)  # ... but the firing alert still holds the incident
        mark_escalated(conn, incident)
        assert settled(conn, service)  # a finished incident holds nothing: a breach now opens a new one
        conn.execute("DELETE FROM incident_workflow WHERE incident_id = %s", (incident,))
        conn.execute("UPDATE alerts SET status = 'resolved' WHERE incident_id = %s", (incident,))
        assert clear(conn, incident, datetime.now(UTC), breaching=False)
        assert settled(conn, service)


def test_an_alert_opening_after_the_agents_incident_finished_is_released_when_the_breach_ends(
    stack: StackSettings, health: tuple[ServiceContext, HealthSettings], sim: FakeSim
) -> None:
    """The agent's incident is finished (escalated) while the breach goes on; an alert then
    opens a new incident, resolves while the agent still reads the breach (no release),
    and the breach ends later: the agent's own clearing must release the alert's incident,
    or the service stays held and no later breach ever opens an incident of its own."""
    ctx, _ = health
    service = f"refinished-{RUN}"
    first = breach_opens_an_incident(ctx, stack, sim, service)
    with psycopg.connect(stack.pg_dsn(HEALTH_DB), autocommit=True) as conn:
        mark_escalated(conn, first)
    intake = alerts.Intake(("service",), ("environment",), "production", Catalogue(), opens=True, topic=TOPIC)
    started = datetime.now(UTC)

    def alert(status: str) -> alerts.Notification:
        one = {
            "status": status,
            "labels": {"alertname": "LatencyHigh", "service": service},
            "startsAt": started,
            "endsAt": datetime.now(UTC) if status == "resolved" else None,
            "fingerprint": f"fp2-{RUN}",
        }
        return alerts.Notification.model_validate({"version": "4", "status": status, "alerts": [one]})

    (opened,) = alerts.receive(ctx, intake, alert("firing"))
    assert opened.outcome == "opened" and opened.incident_id not in (None, first)
    (resolved,) = alerts.receive(ctx, intake, alert("resolved"))  # the agent still reads the breach
    assert resolved.outcome == "resolved"
    with psycopg.connect(stack.pg_dsn(HEALTH_DB), autocommit=True) as conn:
        assert not settled(conn, service)
    sim.set(service, 100.0, 500.0)
    scrape(ctx, 5)  # the breach is over
    with psycopg.connect(stack.pg_dsn(HEALTH_DB), autocommit=True) as conn:
        held = conn.execute("SELECT cleared_at FROM health_incidents WHERE incident_id = %s", (opened.incident_id,))
        assert held.fetchone()[0] is not None, "the alert's incident still holds the service"
        assert settled(conn, service)


def test_a_tick_over_a_large_estate_takes_a_few_transactions_and_still_sees_a_breach(
    stack: StackSettings, health: tuple[ServiceContext, HealthSettings], sim: FakeSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 2,000 services, one transaction each, made a tick slower than the verification's
    # allowed gap between samples: every recovery of a long chaos soak went unverified.
    ctx, _ = health
    estate = [f"estate-{i:04d}" for i in range(2000)]
    for name in estate:
        sim.set(name, 100.0, 500.0)
    try:
        # first sight: each service gets its detector row (over as many ticks as that takes)
        known = "SELECT count(*) FROM detector_state WHERE service LIKE 'estate-%%'"
        until(lambda: query(stack, HEALTH_DB, known)[0][0] == len(estate) or scrape(ctx), timeout=60, what="rows")
        checkouts = 0
        connection = ctx.pool.connection

        def counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal checkouts
            checkouts += 1
            return connection(*args, **kwargs)

        monkeypatch.setattr(ctx.pool, "connection", counted)
        ticks = REGISTRY.get_sample_value("flotilla_health_tick_seconds_count") or 0.0
        scrape(ctx)
        assert checkouts < 25, f"{checkouts} transactions for one tick over {len(estate)} healthy services"
        assert REGISTRY.get_sample_value("flotilla_health_tick_seconds_count") == ticks + 1  # timed for operators

        sim.set(estate[7], 900.0, 500.0)  # K = 3 breaching scrapes open it, as for any service
        scrape(ctx, 2)
        assert incidents_of(stack, estate[7]) == []
        scrape(ctx)
        assert len(incidents_of(stack, estate[7])) == 1
        row = query(stack, HEALTH_DB, "SELECT last_p95_ms FROM detector_state WHERE service = %s", estate[8])
        assert row == [(100.0,)]  # the quiet ones have their last sample recorded too

        # A storm: 300 more breach at once. Once their incidents are open, a breach that
        # goes on is routine too: counted in the same few statements, never a second incident.
        storm = estate[100:400]
        for name in storm:
            sim.set(name, 900.0, 500.0)
        scrape(ctx, 3)
        # (openings beyond a tick's detection time wait for the next tick)
        until(lambda: opened(stack, storm) == len(storm) or scrape(ctx), timeout=60, what="the storm's incidents")
        checkouts = 0
        scrape(ctx)
        assert checkouts < 25, f"{checkouts} transactions for one tick over {len(storm) + 1} open breaches"
        streak = "SELECT breach_streak, last_p95_ms FROM detector_state WHERE service = %s"
        ((before, _),) = query(stack, HEALTH_DB, streak, storm[0])
        scrape(ctx)
        assert query(stack, HEALTH_DB, streak, storm[0]) == [(before + 1, 900.0)]
        assert all(len(incidents_of(stack, name)) == 1 for name in (estate[7], *storm[::50]))
    finally:
        for name in estate:
            sim.services.pop(name, None)


def opened(stack: StackSettings, services: list[str]) -> int:
    """How many of ``services`` have an incident."""
    sql = "SELECT count(DISTINCT service) FROM health_incidents WHERE service = ANY(%s)"
    return int(query(stack, HEALTH_DB, sql, services)[0][0])


def test_detection_past_the_tick_s_time_waits_for_the_next_tick_and_every_breach_still_opens(
    stack: StackSettings, health: tuple[ServiceContext, HealthSettings], sim: FakeSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 1,000 openings in one tick held it (and every verification window) for 30-35 s.
    ctx, _ = health
    task = ctx.spec.periodic[0][1]
    monkeypatch.setattr(task, "_detect_budget", 0.0)  # no time: one sample the long way per tick
    burst = [f"burst-{i}" for i in range(3)]
    for name in burst:
        sim.set(name, 100.0, 500.0)
    try:
        scrape(ctx)  # first sight: a detector row each, one per tick
        scrape(ctx, 2)
        for name in burst:
            sim.set(name, 900.0, 500.0)
        deferred = REGISTRY.get_sample_value("flotilla_health_detections_deferred_total") or 0.0
        scrape(ctx)
        assert (REGISTRY.get_sample_value("flotilla_health_detections_deferred_total") or 0.0) >= deferred + 2
        until(lambda: opened(stack, burst) == 3 or scrape(ctx), timeout=30, what="every burst incident")
        assert all(len(incidents_of(stack, name)) == 1 for name in burst)
    finally:
        for name in burst:
            sim.services.pop(name, None)


def test_a_burst_opens_in_a_few_transactions_and_a_failing_opening_undoes_only_its_own_rows(
    stack: StackSettings, health: tuple[ServiceContext, HealthSettings], sim: FakeSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A commit per opening (and downstream a Kafka transaction per commit) was most of an
    # opening's cost in a storm; a savepoint each keeps one failure from undoing the rest.
    ctx, _ = health
    task = ctx.spec.periodic[0][1]
    monkeypatch.setattr(task, "_detect_budget", 120.0)  # time for all of them in one tick
    burst = [f"batch-{i:03d}" for i in range(120)]
    broken = burst[37]
    for name in burst:
        sim.set(name, 100.0, 500.0)
    try:
        known = "SELECT count(*) FROM detector_state WHERE service LIKE 'batch-%%'"
        until(lambda: query(stack, HEALTH_DB, known)[0][0] == len(burst) or scrape(ctx), timeout=60, what="rows")
        scrape(ctx)
        for name in burst:
            sim.set(name, 900.0, 500.0)
        scrape(ctx, 2)  # K = 3: the third breaching scrape opens them

        open_incident = task._open_incident

        def fails_for_one(ctx: ServiceContext, conn: Any, sample: Any, *rest: Any) -> str:
            incident = open_incident(ctx, conn, sample, *rest)  # its rows are written...
            if sample.service == broken:
                raise RuntimeError("a record its values make invalid")  # ...and must be undone
            return incident

        monkeypatch.setattr(task, "_open_incident", fails_for_one)
        checkouts = 0
        connection = ctx.pool.connection

        def counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal checkouts
            checkouts += 1
            return connection(*args, **kwargs)

        monkeypatch.setattr(ctx.pool, "connection", counted)
        outbox = "SELECT count(*) FROM outbox"
        (rows_before,) = query(stack, HEALTH_DB, outbox)[0]
        scrape(ctx)
        assert opened(stack, burst) == len(burst) - 1
        assert incidents_of(stack, broken) == []
        (rows_after,) = query(stack, HEALTH_DB, outbox)[0]
        assert rows_after - rows_before == 2 * (len(burst) - 1)  # the broken one left no record behind
        assert checkouts <= 6, f"{checkouts} transactions for one tick opening {len(burst) - 1} incidents"

        monkeypatch.setattr(task, "_open_incident", open_incident)
        scrape(ctx)  # its detector row was undone with it: this is its third breaching scrape
        assert len(incidents_of(stack, broken)) == 1
        assert all(len(incidents_of(stack, name)) == 1 for name in burst)
    finally:
        for name in burst:
            sim.services.pop(name, None)


# ======================================================================= audit


@pytest.fixture(scope="module")
def audit(
    stack: StackSettings, topics: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServiceContext, AuditSettings, Signer]]:
    key_file: Path = tmp_path_factory.mktemp("audit") / "signing-key.pem"
    settings = AuditSettings(
        **stack_fields(stack),
        service_name=f"it-audit-{RUN}",
        service_database=AUDIT_DB,
        audit_topics=(AUDITED, f"{AUDITED}.dlq"),
        audit_signing_key_file=key_file,
        audit_anchors_topic=ANCHORS,
        http_port=0,
    )
    key, _ = load_or_create(key_file)
    settings = settings.model_copy(update={"audit_public_keys": [public_key_text(key.public_key())]})
    signer = Signer(key)
    ctx = prepare(audit_service.build_spec(settings, signer), settings)
    yield ctx, settings, signer
    ctx.pool.close()
    drop_outbox(stack, AUDIT_DB)  # it publishes its anchors: a connector and a slot


def audit_count(stack: StackSettings) -> int:
    return int(query(stack, AUDIT_DB, "SELECT count(*) FROM audit_log")[0][0])


def test_audit_appends_every_record_to_a_verifiable_chain_and_detects_tampering(
    stack: StackSettings, serde: AvroSerde, audit: tuple[ServiceContext, AuditSettings, Signer]
) -> None:
    ctx, settings, signer = audit
    incident = f"incident-audit-{RUN}"
    value, latency = latency_fact(incident)
    diagnosis = latency.caused(DIAGNOSIS_REQUESTED, "/flotilla/health-agent")
    latency_payload = serde.serialize(AUDITED, SERVICE_LATENCY_INCREASED, value)
    poison_env = diagnosis.caused(DECISION + "DependencyFailureSuspected", "/flotilla/diagnostic-agent")
    dead_context = [
        (deadletter.ORIGIN_TOPIC, AUDITED.encode()),
        (deadletter.REASON, b"undecodable"),
        (deadletter.ERROR_CLASS, b"UndecodableRecordError"),
    ]
    produce(
        stack,
        AUDITED,
        [
            (incident, latency_payload, signed_headers(latency, latency_payload)),
            record(serde, AUDITED, diagnosis, triggerEventId=latency.id),
            (incident, b"\x00\x00\x00\x00not avro", poison_env.headers()),  # poison on the topic itself: unsigned
        ],
    )
    produce(stack, f"{AUDITED}.dlq", [(incident, b"\xde\xad\xbe\xef", [*poison_env.headers(), *dead_context])])

    loop = audit_service.raw_loop(ctx, settings, signer)
    try:
        drain_until(loop.poll_once, lambda: audit_count(stack) == 4, what="4 audited records")
    finally:
        loop.close()

    # A second reader (another group) sees the same records again: nothing is appended twice.
    again = audit_service.raw_loop(ctx, settings, signer, group=f"{settings.service_name}-again")
    try:
        seen = 0
        deadline = time.monotonic() + 30
        while seen < 4 and time.monotonic() < deadline:
            seen += again.poll_once()
        assert seen == 4
    finally:
        again.close()
    assert audit_count(stack) == 4

    app = create_app(settings.service_name, lambda: True)
    assert ctx.spec.routes is not None
    ctx.spec.routes(app, ctx)
    client = TestClient(app)

    verdict = client.get("/verify").json()
    assert verdict["ok"] is True and verdict["entriesChecked"] == 4 and verdict["firstBroken"] is None

    listing = client.get("/incidents").json()["incidents"]
    (mine,) = [i for i in listing if i["incidentId"] == incident]
    assert mine["status"] == "DIAGNOSING" and mine["entries"] == 2  # the two signed records
    assert mine["firstAt"] <= mine["lastAt"]

    timeline = client.get(f"/incidents/{incident}/timeline").json()["timeline"]
    by_type = {e["type"]: e for e in timeline if e["topic"] == AUDITED and e["value"] is not None}
    assert by_type[SERVICE_LATENCY_INCREASED]["value"]["p95LatencyMs"] == value["p95LatencyMs"]
    assert by_type[DIAGNOSIS_REQUESTED]["causedBy"]["eventId"] == latency.id
    assert all(e["elapsedMs"] >= 0 for e in timeline)
    undecodable = [e for e in timeline if e["value"] is None]
    assert len(undecodable) == 2  # the poison on the topic and its dead letter: raw bytes kept
    assert all(not e["verified"] and e["unverified"].startswith("unsigned") for e in undecodable)
    assert [e["verifiedBy"] for e in by_type.values()] == ["health-agent", "health-agent"]
    dead = next(e for e in undecodable if e["topic"] == f"{AUDITED}.dlq")
    assert base64.b64decode(dead["valueBase64"]) == b"\xde\xad\xbe\xef"
    assert dead["deadLetter"]["reason"] == "undecodable"
    assert client.get("/incidents/incident-never-seen/timeline").status_code == 404

    # In pages of one: every record once, in log order, with the same times and causes as
    # the whole timeline (a cause on an earlier page is still linked).
    whole = {e["seq"]: (e["elapsedMs"], e["causedBy"]) for e in timeline}
    paged: list[dict[str, Any]] = []
    after: int | None = 0
    while after is not None:
        page = client.get(f"/incidents/{incident}/timeline", params={"limit": 1, "after": after}).json()
        assert len(page["timeline"]) == 1 and page["page"]["after"] == after and page["page"]["limit"] == 1
        paged += page["timeline"]
        after = page["page"]["nextAfter"]
    assert [e["seq"] for e in paged] == sorted(whole)
    assert {e["seq"]: (e["elapsedMs"], e["causedBy"]) for e in paged} == whole
    past_the_end = client.get(f"/incidents/{incident}/timeline", params={"after": max(whole)}).json()
    assert past_the_end["timeline"] == [] and past_the_end["page"]["nextAfter"] is None
    for bad in ({"limit": 0}, {"limit": 5001}, {"after": -1}):
        assert client.get(f"/incidents/{incident}/timeline", params=bad).status_code == 422, bad

    public = client.get("/public-key").json()
    assert public["keyId"] == signer.key_id
    key = load_pem_public_key(public["publicKeyPem"].encode())
    signature, entry_hash = query(stack, AUDIT_DB, "SELECT signature, entry_hash FROM audit_log WHERE seq = 1")[0]
    key.verify(bytes(signature), bytes(entry_hash))  # type: ignore[union-attr]

    # The log is append-only for everyone who does not switch the trigger off ...
    with psycopg.connect(stack.pg_dsn(AUDIT_DB)) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
            conn.execute("UPDATE audit_log SET topic = 'x' WHERE seq = 1")
        conn.rollback()
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
            conn.execute("DELETE FROM audit_log WHERE seq = 1")
        conn.rollback()
    # ... and an owner who does is caught by the chain.
    with psycopg.connect(stack.pg_dsn(AUDIT_DB), autocommit=True) as conn:
        conn.execute("ALTER TABLE audit_log DISABLE TRIGGER audit_log_no_update_or_delete")
        try:
            conn.execute(
                "UPDATE audit_log SET value_json = replace(value_json, '1840.0', '180.0') WHERE seq = "
                "(SELECT seq FROM audit_log WHERE ce_type = %s AND topic = %s)",
                (SERVICE_LATENCY_INCREASED, AUDITED),
            )
        finally:
            conn.execute("ALTER TABLE audit_log ENABLE ALWAYS TRIGGER audit_log_no_update_or_delete")
    tampered_seq = query(
        stack,
        AUDIT_DB,
        "SELECT seq FROM audit_log WHERE ce_type = %s AND topic = %s",
        SERVICE_LATENCY_INCREASED,
        AUDITED,
    )[0][0]
    verdict = client.get("/verify").json()
    assert verdict["ok"] is False
    assert verdict["firstBroken"]["seq"] == tampered_seq
    assert "changed" in verdict["firstBroken"]["problem"]


def test_a_republished_record_is_entered_as_a_redelivery_and_the_event_counts_once(
    stack: StackSettings, serde: AvroSerde, audit: tuple[ServiceContext, AuditSettings, Signer]
) -> None:
    """At-least-once outbox delivery re-publishes rows after a Connect crash: an exact copy
    (key, headers and value) is in the log at its own position, marked as the redelivery of
    the first; a record that reuses the id with another value is not a copy and is entered
    as itself, unverified (its producer did not sign that value). The incident's projection
    counts the event once."""
    ctx, settings, signer = audit
    incident = f"incident-redelivered-{RUN}"
    value, latency = latency_fact(incident)
    payload = serde.serialize(AUDITED, SERVICE_LATENCY_INCREASED, value)
    original = (incident, payload, signed_headers(latency, payload))
    forged_value = {**value, "p95LatencyMs": value["p95LatencyMs"] + 1}
    # the signed record's headers (signature included) on another value: not what was signed
    other = (incident, serde.serialize(AUDITED, SERVICE_LATENCY_INCREASED, forged_value), original[2])
    produce(stack, AUDITED, [original, original])  # in one batch: the copy follows its original
    loop = audit_service.raw_loop(ctx, settings, signer)
    entered = "SELECT seq, redelivery_of FROM audit_log WHERE ce_id = %s ORDER BY seq"
    try:
        drain_until(loop.poll_once, lambda: len(query(stack, AUDIT_DB, entered, latency.id)) == 2, what="2 entries")
        produce(stack, AUDITED, [original, other])  # in a later batch: against the log
        drain_until(loop.poll_once, lambda: len(query(stack, AUDIT_DB, entered, latency.id)) == 4, what="4 entries")
    finally:
        loop.close()

    (first, _), *rest = query(stack, AUDIT_DB, entered, latency.id)
    assert [mark for _, mark in rest] == [first, first, None]
    app = create_app(settings.service_name, lambda: True)
    assert ctx.spec.routes is not None
    ctx.spec.routes(app, ctx)
    client = TestClient(app)
    (mine,) = [i for i in client.get("/incidents").json()["incidents"] if i["incidentId"] == incident]
    assert mine["entries"] == 1  # the event once; the record that reused its id is no signed record
    timeline = client.get(f"/incidents/{incident}/timeline").json()["timeline"]
    assert sorted((e["value"]["p95LatencyMs"], e["verified"]) for e in timeline) == sorted(
        [(value["p95LatencyMs"], True), (forged_value["p95LatencyMs"], False)]
    )
    assert REGISTRY.get_sample_value("flotilla_audit_redeliveries_total", {"topic": AUDITED}) == 2


# ============================================================== DLQ reconciler


@pytest.fixture(scope="module")
def reconciler(stack: StackSettings, topics: None) -> Iterator[tuple[ServiceContext, DlqSettings]]:
    settings = DlqSettings(
        **stack_fields(stack),
        service_name=f"it-dlq-{RUN}",
        service_database=DLQ_DB,
        dlq_topics=(f"{TOPIC}.dlq",),
        incidents_topic=TOPIC,
        operator_tokens=[DEMO_OPERATOR_DIGEST],  # explicit: whatever profile the stack's env file names
        http_port=0,
    )
    ctx = prepare(dlq_service.build_spec(settings), settings)
    yield ctx, settings
    ctx.pool.close()
    drop_outbox(stack, DLQ_DB)


def test_dlq_reconciler_quarantines_poison_and_requeues_it_unchanged_with_its_identity_and_signature(
    stack: StackSettings, serde: AvroSerde, reconciler: tuple[ServiceContext, DlqSettings]
) -> None:
    ctx, settings = reconciler
    incident = f"incident-dlq-{RUN}"
    bad_value, bad_env = latency_fact(incident, p95_ms=-5.0)  # valid Avro, breaks a business rule
    junk_env = Envelope(type=SERVICE_LATENCY_INCREASED, source="/it/foreign", correlationid=incident)

    # A victim consumer (the runtime's loop) dead-letters both, with context headers, until
    # it is fixed (as a consumer's bug is, before its letters are re-queued).
    handled_ids: list[str] = []
    fixed = False

    def on_latency(hctx: HandlerContext) -> None:
        if hctx.incoming.value["incidentId"] != incident:
            return
        if hctx.incoming.value["p95LatencyMs"] < 0 and not fixed:
            raise BusinessRuleViolation("p95LatencyMs must not be negative")
        handled_ids.append(hctx.incoming.envelope.id)

    victim_name = f"it-victim-{RUN}"
    victim = ConsumerLoop(
        LoopConfig(name=victim_name, topics=(TOPIC,), source="/it/victim", follow_workflow=False),
        stack,
        serde,
        ctx.pool,
        {SERVICE_LATENCY_INCREASED: on_latency},
    )
    bad_payload = serde.serialize(TOPIC, SERVICE_LATENCY_INCREASED, bad_value)
    produce(
        stack,
        TOPIC,
        [
            (incident, bad_payload, signed_headers(bad_env, bad_payload)),  # its producer's, signed
            (incident, b"\x07not a framed value", junk_env.headers()),
        ],
    )
    dead_before = REGISTRY.get_sample_value(
        "flotilla_quarantined_total", {"error_class": "BusinessRuleViolation", "origin_topic": TOPIC}
    )
    facts = tail_consumer(stack.kafka_bootstrap, TOPIC)
    loop = dlq_service.raw_loop(ctx, settings)
    try:

        def entries() -> list[tuple[Any, ...]]:
            return query(
                stack,
                DLQ_DB,
                "SELECT id, original_event_id, reason, error_class, consumer, tags, fact_event_id, status "
                "FROM quarantine WHERE incident_id = %s ORDER BY original_event_id = %s DESC",
                incident,
                bad_env.id,
            )

        def quarantined_both() -> bool:
            victim.poll_once()
            return len(entries()) == 2

        drain_until(loop.poll_once, quarantined_both, what="two quarantine entries")
        rule, junk = entries()
        assert (rule[1], rule[2], rule[3], rule[4]) == (
            bad_env.id,
            "invalid-record",
            "BusinessRuleViolation",
            victim_name,
        )
        assert rule[5]["origin"] == TOPIC and rule[5]["producer"] == "/flotilla/health-agent"
        assert (junk[1], junk[2], junk[3]) == (junk_env.id, "undecodable", "UndecodableRecordError")
        after = REGISTRY.get_sample_value(
            "flotilla_quarantined_total", {"error_class": "BusinessRuleViolation", "origin_topic": TOPIC}
        )
        assert after == (dead_before or 0) + 1

        # The alert: DeadLetterQuarantined through the outbox and Debezium, one per entry.
        fact_msg = wait_for(facts, lambda m: header(m.headers(), "ce_id") == str(rule[6]).encode(), timeout=60)
        fact = serde.deserialize(fact_msg.value()).value
        assert fact_msg.key() == incident.encode()
        assert header(fact_msg.headers(), "ce_type") == QUARANTINED.encode()
        assert header(fact_msg.headers(), "ce_causationid") == bad_env.id.encode()
        assert (str(fact["quarantineId"]), str(fact["originalEventId"])) == (str(rule[0]), bad_env.id)
        assert fact["dlqTopic"] == f"{TOPIC}.dlq" and fact["tags"]["reason"] == "invalid-record"
    finally:
        loop.close()

    # Redelivered letters (a fresh group reads them again) change nothing.
    again = dlq_service.raw_loop(ctx, settings, group=f"{settings.service_name}-again")
    try:
        seen, deadline = 0, time.monotonic() + 30
        while seen < 2 and time.monotonic() < deadline:
            seen += again.poll_once()
        assert seen == 2
    finally:
        again.close()
    assert len(query(stack, DLQ_DB, "SELECT 1 FROM quarantine WHERE incident_id = %s", incident)) == 2
    assert len(query(stack, DLQ_DB, "SELECT 1 FROM outbox WHERE type = %s", QUARANTINED)) == 2

    app = create_app(settings.service_name, lambda: True)
    assert ctx.spec.routes is not None
    ctx.spec.routes(app, ctx)
    client = TestClient(app)
    auth = {"Authorization": f"Bearer {DEMO_OPERATOR_TOKEN}"}
    rule_id, junk_id = str(rule[0]), str(junk[0])

    listing = client.get("/quarantine", params={"status": "quarantined", "reason": "invalid-record"}).json()
    assert rule_id in [e["id"] for e in listing["entries"]]
    assert junk_id not in [e["id"] for e in listing["entries"]]
    shown = client.get(f"/quarantine/{rule_id}").json()
    assert shown["value"]["decoded"]["recordType"] == SERVICE_LATENCY_INCREASED
    fields = shown["value"]["decoded"]["fields"]
    assert fields["p95LatencyMs"] == -5.0
    assert {"name": "ce_id", "text": bad_env.id, "base64": base64.b64encode(bad_env.id.encode()).decode()} in shown[
        "headers"
    ]
    assert client.get(f"/quarantine/{junk_id}").json()["value"]["decoded"] is None

    # Operators only; the copy must pass its registered schema (422 names the field).
    assert client.post(f"/quarantine/{rule_id}/requeue", json={"value": fields}).status_code == 401
    assert client.post(f"/quarantine/{rule_id}/requeue", headers={"Authorization": "Bearer nope"}).status_code == 401
    refused = client.post(
        f"/quarantine/{rule_id}/requeue", headers=auth, json={"value": {**fields, "p95LatencyMs": "slow"}}
    )
    assert refused.status_code == 422
    assert any("'p95LatencyMs'" in p for p in refused.json()["detail"]["problems"])
    undecodable = client.post(f"/quarantine/{junk_id}/requeue", headers=auth)
    assert undecodable.status_code == 422 and "does not decode" in undecodable.json()["detail"]["error"]

    # A sanitized copy is no longer what its producer signed (flotilla.provenance): refused.
    sanitized = client.post(
        f"/quarantine/{rule_id}/requeue", headers=auth, json={"value": {**fields, "p95LatencyMs": 1840.0}}
    )
    assert sanitized.status_code == 422, sanitized.text
    assert sanitized.json()["detail"]["problems"] == ["signature: bad-signature"]

    # Unchanged, it goes back to the origin topic with its identity, provenance and signature.
    fixed = True
    origin = tail_consumer(stack.kafka_bootstrap, TOPIC)
    try:
        done = client.post(f"/quarantine/{rule_id}/requeue", headers=auth)
        assert done.status_code == 200, done.text
        body = done.json()
        dead = query(
            stack, DLQ_DB, "SELECT dlq_topic, dlq_partition, dlq_offset FROM quarantine WHERE id = %s", rule_id
        )[0]
        assert body["requeuedFrom"] == f"{dead[0]}/{dead[1]}/{dead[2]}"

        copy: Message = wait_for(origin, lambda m: header(m.headers(), "ce_id") == bad_env.id.encode(), timeout=30)
        assert copy.key() == incident.encode()
        assert copy.partition() == body["requeuedTo"]["partition"]
        for name, original in signed_headers(bad_env, bad_payload):
            assert header(copy.headers(), name) == original, name
        assert copy.value() == bad_payload  # the very bytes its producer signed
        assert header(copy.headers(), "flotilla_requeued_from") == body["requeuedFrom"].encode()
        assert header(copy.headers(), "flotilla_requeued_by") == body["requeuedBy"].encode()
        assert all(not k.startswith("dlq_") for k, _ in copy.headers() or [])
        decoded = serde.deserialize(copy.value())
        assert decoded.record_name == SERVICE_LATENCY_INCREASED
        assert decoded.value["p95LatencyMs"] == -5.0 and str(decoded.value["eventId"]) == bad_env.id
    finally:
        origin.close()
        facts.close()

    # Once only.
    second = client.post(f"/quarantine/{rule_id}/requeue", headers=auth)
    assert second.status_code == 409
    assert client.get(f"/quarantine/{rule_id}").json()["status"] == "requeued"

    # The consumer that dead-lettered it holds no claim for that id: it now handles the copy.
    drain_until(victim.poll_once, lambda: bad_env.id in handled_ids, what="the victim handling the re-queued copy")
    victim.stop()
    victim.run()
