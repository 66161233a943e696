"""The diagnostic and remediation agents on the real stack, against a scripted estate (an
evidence source whose topology the test sets; the Prometheus source itself is tested
against a real Prometheus in tests/integration/test_prometheus_evidence.py) and a fake
model server: each agent's handlers run through ``flotilla.runner.prepare`` +
``build_loop`` on a fresh topic, and the outbox shows what they decided."""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from flotilla_evidence import StaticEvidence
from flotilla_ops.samples import latency_fact
from flotilla_reasoning import Diagnosis, DiagnosticEvidence, LLMReasoner, Reasoner, RulesReasoner, Topology
from flotilla_reasoning.model import ServiceView
from flotilla_reasoning.records import diagnosis_record

from flotilla import deferred
from flotilla.authority import verify_proposal
from flotilla.bootstrap import drop_outbox
from flotilla.consumer import ConsumerLoop
from flotilla.envelope import Envelope
from flotilla.keys import Keyring
from flotilla.records import (
    DependencyFailureSuspected,
    DiagnosisRequested,
    DiagnosticJobStarted,
    IncidentEscalated,
    RecoveryProposed,
)
from flotilla.runner import ServiceContext, build_loop, prepare, start_periodic
from flotilla.serde import AvroSerde
from flotilla.settings import StackSettings
from services.diagnostic_agent import DiagnosticAgent, DiagnosticSettings, baselines
from services.diagnostic_agent import build_agent as build_diagnostic
from services.remediation_agent import RemediationAgent, RemediationSettings
from services.remediation_agent import build_agent as build_remediation
from services.remediation_agent.plan import digest_matches
from tests.fakes.fake_openai import MALFORMED, FakeOpenAI, diagnosis_answer, hallucinated
from tests.integration.kafka_wait import fresh_topic
from tests.keys import fact_settings, signed_headers
from tests.signing import AGENT_KEY, AGENT_SIGNER, write_key
from tests.support.producing import ordered_producer

pytestmark = pytest.mark.timeout(240)

SUFFIX = uuid.uuid4().hex[:8]
DIAGNOSTIC_DB = f"flotilla_it_diag_{SUFFIX}"
REMEDIATION_DB = f"flotilla_it_rem_{SUFFIX}"


# ------------------------------------------------------------ scripted estate


class ScriptedEstate:
    """The demo's estate as an evidence source, with the numbers the sim's model computes.

    ``faulty``: payments-api answers 8x slower (280 ms instead of 35 ms) and checkout-api's
    pool waits (utilization 2.125, p95 1,831 ms against 500 ms). ``available`` False: every
    snapshot raises EvidenceUnavailable (Prometheus down); ``delay`` slows every answer.
    """

    name = "scripted"

    def __init__(self) -> None:
        self.faulty = False
        self.available = True
        self.delay = 0.0

    def topology(self) -> Topology:
        payments = 280.0 if self.faulty else 35.0
        view = ServiceView
        return Topology(
            services={
                "checkout-api": view(
                    "checkout-api",
                    "production",
                    4,
                    1831.0 if self.faulty else 180.0,
                    500.0,
                    ("payments-api", "inventory-db"),
                    "v41",
                    "v40",
                    {"payments-api": "payments-api-secondary"},
                    {"payments-api": "payments-api", "inventory-db": "inventory-db"},
                ),
                "payments-api": view("payments-api", "production", 3, payments, 400.0, (), "v17", "v16"),
                "payments-api-secondary": view("payments-api-secondary", "production", 2, 45.0, 400.0, (), "v17"),
                "inventory-db": view("inventory-db", "production", 2, 25.0, 150.0, (), "v8", "v7"),
            },
            dependency_p95={("checkout-api", "payments-api"): payments, ("checkout-api", "inventory-db"): 25.0},
            utilization={"checkout-api": 2.125 if self.faulty else 0.9},
        )

    def snapshot(self, around: str | None = None, *, environment: str | None = None) -> Topology:
        time.sleep(self.delay)
        unavailable = None if self.available else "scripted: the evidence source is down"
        return StaticEvidence(self.topology(), unavailable=unavailable).snapshot(around, environment=environment)


ESTATE = ScriptedEstate()


def diagnostic_spec(settings: DiagnosticSettings, **kw: Any) -> tuple[Any, DiagnosticAgent]:
    return build_diagnostic(settings, evidence=ESTATE, **kw)


def remediation_spec(settings: RemediationSettings, **kw: Any) -> tuple[Any, RemediationAgent]:
    return build_remediation(settings, evidence=ESTATE, **kw)


@pytest.fixture()
def estate() -> ScriptedEstate:
    """The scripted estate, broken (as when the incident opened) and answering."""
    ESTATE.faulty, ESTATE.available, ESTATE.delay = True, True, 0.0
    return ESTATE


@pytest.fixture(scope="module")
def llm() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


# ------------------------------------------------------------ the services


@pytest.fixture(scope="module")
def diagnostic_settings(stack: StackSettings) -> DiagnosticSettings:
    return DiagnosticSettings(
        **stack.model_dump(),
        **fact_settings(),
        service_database=DIAGNOSTIC_DB,
        http_port=0,
        baseline_seconds=0,
        diagnostic_job_retry_seconds=0.5,
    )


@pytest.fixture(scope="module")
def diagnostic(
    stack: StackSettings, serde: AvroSerde, diagnostic_settings: DiagnosticSettings
) -> Iterator[tuple[ServiceContext, DiagnosticAgent]]:
    """The diagnostic agent prepared on its own database, with baselines learned while healthy."""
    spec, agent = diagnostic_spec(diagnostic_settings)
    ctx = prepare(spec, diagnostic_settings)
    ESTATE.faulty = False
    assert agent.learn_baselines(ctx) == 2  # checkout-api -> payments-api, inventory-db
    try:
        yield ctx, agent
    finally:
        ctx.pool.close()
        drop_outbox(stack, DIAGNOSTIC_DB)


@pytest.fixture(scope="module")
def remediation(
    stack: StackSettings, serde: AvroSerde, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServiceContext, RemediationSettings]]:
    key = write_key(AGENT_KEY, tmp_path_factory.mktemp("secrets") / "proposal-signing-key.pem")
    settings = RemediationSettings(
        **stack.model_dump(),
        **fact_settings(),
        service_database=REMEDIATION_DB,
        http_port=0,
        proposal_signing_key_file=key,
    )
    spec, _ = remediation_spec(settings)
    ctx = prepare(spec, settings)
    try:
        yield ctx, settings
    finally:
        ctx.pool.close()
        drop_outbox(stack, REMEDIATION_DB)


@pytest.fixture()
def topic(stack: StackSettings) -> Iterator[str]:
    """A fresh input topic and its DLQ, deleted afterwards."""
    with fresh_topic(stack.kafka_bootstrap, "it-agents") as name:
        yield name


def on_topic(ctx: ServiceContext, topic: str, *, handlers_of: ServiceContext | None = None) -> ConsumerLoop:
    """The service's loop, consuming ``topic`` in a group of its own."""
    spec = dataclasses.replace(
        (handlers_of or ctx).spec,
        topics=(topic,),
        loop={"kafka": {"group.id": f"it-{topic}"}, "max_retries": 1, "contract_topics": {topic: "incidents"}},
    )
    return build_loop(ServiceContext(spec, ctx.settings, ctx.pool, ctx.serde))


def with_reasoner(ctx: ServiceContext, reasoner: Reasoner, **settings: Any) -> tuple[ServiceContext, DiagnosticAgent]:
    """The same database and pool, another agent (another reasoner, other settings)."""
    changed = ctx.settings.model_copy(update=settings)
    assert isinstance(changed, DiagnosticSettings)
    spec, agent = diagnostic_spec(changed, reasoner=reasoner)
    return ServiceContext(spec, changed, ctx.pool, ctx.serde), agent


# --------------------------------------------------------------- records


def produce(stack: StackSettings, topic: str, serde: AvroSerde, records: list[tuple[dict[str, Any], Envelope]]) -> None:
    producer = ordered_producer(stack.kafka_bootstrap)
    for value, envelope in records:
        payload = serde.serialize("incidents", envelope.type, value)
        producer.produce(topic, key=envelope.correlationid, value=payload, headers=signed_headers(envelope, payload))
    assert producer.flush(15) == 0


def incident_opened(incident: str) -> list[tuple[dict[str, Any], Envelope]]:
    """ServiceLatencyIncreased, then the DiagnosisRequested it caused."""
    latency, latency_env = latency_fact(incident, p95_ms=1831.0)
    request_env = latency_env.caused(DiagnosisRequested.TYPE, "/flotilla/health-agent")
    request = {
        "eventId": request_env.id,
        "incidentId": incident,
        "service": "checkout-api",
        "environment": "production",
        "symptom": "p95 1831 ms against a 500 ms threshold for 60 s",
        "triggerEventId": latency_env.id,
        "requestedAt": datetime.now(UTC).replace(microsecond=0),
    }
    return [(latency, latency_env), (request, request_env)]


def drain(loop: ConsumerLoop, expected: int, timeout: float = 60) -> None:
    seen = 0
    deadline = time.monotonic() + timeout
    try:
        while seen < expected:
            assert time.monotonic() < deadline, f"consumed {seen} of {expected} records"
            seen += loop.poll_once()
    finally:
        loop.stop()
        loop.run()  # returns at once and closes the consumer


def run_deferred(ctx: ServiceContext) -> None:
    """What the service's worker threads do after the loop deferred a record: every
    periodic task once (the remediation agent's are its planning workers)."""
    for _, task in ctx.spec.periodic:
        task(ctx)


def outbox(ctx: ServiceContext, incident: str) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(type, decoded value, headers) of what the service wrote for the incident, in order."""
    with ctx.pool.connection() as conn:
        rows = conn.execute(
            "SELECT type, payload, id::text, ce_causationid, ce_hops, ce_traceparent FROM outbox "
            "WHERE aggregateid = %s ORDER BY created_at, id",
            (incident,),
        ).fetchall()
    return [
        (t, ctx.serde.deserialize(bytes(p)).value, {"id": i, "causationid": c, "hops": int(h), "traceparent": tp})
        for t, p, i, c, h, tp in rows
    ]


def what_the_loop_did(ctx: ServiceContext, incident: str, event_ids: list[str]) -> str:
    """For a failure message: the dedupe claims, stale transitions and workflow state the
    loop left for ``incident`` (a record skipped quietly shows up here, not in the logs)."""
    with ctx.pool.connection() as conn:
        claims = conn.execute(
            'SELECT consumer, event_id, record_type, outcome, topic, "offset", processed_at FROM processed_events '
            "WHERE event_id = ANY(%s)",
            (event_ids,),
        ).fetchall()
        stale = conn.execute("SELECT * FROM stale_transitions WHERE incident_id = %s", (incident,)).fetchall()
        state = conn.execute("SELECT * FROM incident_workflow WHERE incident_id = %s", (incident,)).fetchall()
    return f"claims {claims}; stale transitions {stale}; workflow {state}"


def scalar(ctx: ServiceContext, sql: str, *params: Any) -> Any:
    with ctx.pool.connection() as conn:
        row = conn.execute(sql, params).fetchone()
    return None if row is None else row[0]


def new_incident() -> str:
    return f"incident-it-{uuid.uuid4().hex[:10]}"


# ------------------------------------------------------------------ tests


def test_baselines_learn_healthy_callers_only_and_not_anomalies(
    diagnostic: tuple[ServiceContext, DiagnosticAgent],
) -> None:
    """One statement per table per sample: a moving average for each healthy caller's
    dependencies, nothing from a degraded caller, no sample far above its baseline; and
    a diagnosis reads back only its own services' baselines (rolled back afterwards)."""
    ctx, _ = diagnostic

    def view(name: str, p95: float, revision: str, *dependencies: str) -> ServiceView:
        return ServiceView(name, "staging", 2, p95, 100.0, dependencies, revision=revision)

    def topology(db_ms: float, cache_ms: float) -> Topology:
        return Topology(
            services={
                "t-caller": view("t-caller", 10.0, "r1", "t-db", "t-cache"),
                "t-degraded": view("t-degraded", 500.0, "r9", "t-db"),
            },
            dependency_p95={
                ("t-caller", "t-db"): db_ms,
                ("t-caller", "t-cache"): cache_ms,
                ("t-degraded", "t-db"): 999,
            },
        )

    with ctx.pool.connection() as conn, conn.transaction(force_rollback=True):
        statements = count_statements(conn)
        assert baselines.learn(conn, topology(20.0, 5.0), weight=0.5, suspect_ratio=3.0) == 2
        assert len(statements) == 2
        assert baselines.learn(conn, topology(30.0, 50.0), weight=0.5, suspect_ratio=3.0) == 2
        rows = conn.execute(
            "SELECT service, dependency, p95_ms, samples FROM latency_baselines WHERE service LIKE 't-%'"
        ).fetchall()
        assert sorted(rows) == [("t-caller", "t-cache", 5.0, 1), ("t-caller", "t-db", 25.0, 2)]
        revisions = conn.execute("SELECT service, revision FROM healthy_revisions WHERE service LIKE 't-%'")
        assert revisions.fetchall() == [("t-caller", "r1")]

        seen = baselines.with_baselines(conn, Topology(services={"t-caller": view("t-caller", 10.0, "r1")}))
        assert seen.baselines == {("t-caller", "t-cache"): 5.0, ("t-caller", "t-db"): 25.0}
        assert seen.healthy_revisions == {"t-caller": "r1"}


def count_statements(conn: Any) -> list[str]:
    """The statements ``conn`` sends from now on (psycopg's per-connection hook)."""
    sent: list[str] = []
    original = conn.execute

    def counting(query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(str(query))
        return original(query, *args, **kwargs)

    conn.execute = counting
    return sent


def test_diagnosis_requested_becomes_dependency_failure_suspected(
    stack: StackSettings,
    serde: AvroSerde,
    diagnostic: tuple[ServiceContext, DiagnosticAgent],
    estate: ScriptedEstate,
    topic: str,
) -> None:
    ctx, agent = diagnostic
    incident = new_incident()
    records = incident_opened(incident)
    produce(stack, topic, serde, records)
    drain(on_topic(ctx, topic), 2)
    assert outbox(ctx, incident) == []  # deferred: nothing slow in the consumer's transaction
    assert agent.worker.run_due(ctx) == 1

    written = outbox(ctx, incident)
    assert len(written) == 1, what_the_loop_did(ctx, incident, [env.id for _, env in records])
    [(record_type, value, headers)] = written
    request_env = records[1][1]
    assert record_type == DependencyFailureSuspected.TYPE
    assert value["suspectedDependency"] == "payments-api"
    assert value["service"] == "checkout-api"
    assert value["jobId"] is None
    assert value["reasoning"]["reasoner"] == "rules"
    assert value["reasoning"]["confidence"] == pytest.approx(0.875)  # 280 ms against a learned 35 ms
    assert headers["causationid"] == request_env.id
    assert headers["hops"] == request_env.hops - 1
    assert headers["traceparent"].split("-")[1] == request_env.traceparent.split("-")[1]  # same trace
    assert scalar(ctx, "SELECT count(*) FROM diagnoses WHERE incident_id = %s", incident) == 1


def test_a_model_answering_garbage_twice_escalates_and_diagnoses_nothing(
    stack: StackSettings,
    serde: AvroSerde,
    diagnostic: tuple[ServiceContext, DiagnosticAgent],
    estate: ScriptedEstate,
    llm: FakeOpenAI,
    topic: str,
) -> None:
    ctx, _ = diagnostic
    incident = new_incident()
    llm.reset()
    llm.script(MALFORMED, hallucinated(diagnosis_answer(incident)))
    reasoner = LLMReasoner(base_url=llm.base_url, model="test-model", timeout=10, max_retries=0)
    llm_ctx, llm_agent = with_reasoner(ctx, reasoner)
    records = incident_opened(incident)
    produce(stack, topic, serde, records)
    drain(on_topic(llm_ctx, topic), 2)
    llm_agent.worker.run_due(llm_ctx)

    written = outbox(ctx, incident)
    assert [t for t, _, _ in written] == [IncidentEscalated.TYPE]  # and no diagnosis
    _, escalated, headers = written[0]
    assert str(escalated["causeEventId"]) == records[1][1].id
    assert escalated["causeType"] == DiagnosisRequested.TYPE
    assert escalated["escalatedTo"] == "on-call"
    assert "llm reasoner could not diagnose" in escalated["reason"]
    assert "rootCauseTicket" not in escalated["reason"]  # the bad answer never reaches a topic
    assert headers["causationid"] == records[1][1].id
    assert len(llm.requests) == 2
    assert llm.remaining == 0
    # the failure and what it cost stay in the agent's database; the tokens count against the incident
    assert scalar(ctx, "SELECT attempts FROM reasoning_failures WHERE incident_id = %s", incident) == 2
    assert "rootCauseTicket" in scalar(
        ctx, "SELECT last_answer FROM reasoning_failures WHERE incident_id = %s", incident
    )
    assert scalar(ctx, "SELECT tokens_used FROM incident_workflow WHERE incident_id = %s", incident) == 320
    assert scalar(ctx, "SELECT count(*) FROM diagnoses WHERE incident_id = %s", incident) == 0


def test_a_slow_job_survives_a_restart_and_finishes_exactly_once(
    stack: StackSettings,
    serde: AvroSerde,
    diagnostic: tuple[ServiceContext, DiagnosticAgent],
    diagnostic_settings: DiagnosticSettings,
    estate: ScriptedEstate,
    topic: str,
) -> None:
    ctx, _ = diagnostic
    slow_ctx, _ = with_reasoner(ctx, RulesReasoner(), diagnostic_job_seconds=30.0)
    incident = new_incident()
    records = incident_opened(incident)
    produce(stack, topic, serde, records)
    drain(on_topic(slow_ctx, topic), 2)

    [(record_type, started, started_headers)] = outbox(ctx, incident)
    assert record_type == DiagnosticJobStarted.TYPE
    assert started["jobKind"] == "dependency-probe"
    assert started["startedBy"] == "diagnostic-agent"
    assert started_headers["causationid"] == records[1][1].id
    job_id = str(started["jobId"])
    due = scalar(ctx, "SELECT due_at FROM diagnostic_jobs WHERE job_id = %s", job_id)
    assert scalar(ctx, "SELECT status FROM diagnostic_jobs WHERE job_id = %s", job_id) == "running"

    # The process stops; a new one prepares a fresh context on the same database.
    spec, agent = diagnostic_spec(diagnostic_settings)
    restarted = prepare(spec, diagnostic_settings)
    try:
        assert agent.finish_due_jobs(restarted) == 0  # not due yet
        later = due + timedelta(seconds=1)
        assert agent.finish_due_jobs(restarted, now=later) == 1
        assert agent.finish_due_jobs(restarted, now=later) == 0  # finished: never again
    finally:
        restarted.pool.close()

    written = outbox(ctx, incident)
    assert [t for t, _, _ in written] == [DiagnosticJobStarted.TYPE, DependencyFailureSuspected.TYPE]
    _, diagnosis, headers = written[1]
    assert str(diagnosis["jobId"]) == job_id
    assert diagnosis["suspectedDependency"] == "payments-api"
    assert headers["causationid"] == started_headers["id"]  # caused by the job
    assert headers["hops"] == records[1][1].hops - 2
    assert any(e["kind"] == "diagnostic-job" for e in diagnosis["reasoning"]["evidence"])
    with ctx.pool.connection() as conn:
        row = conn.execute(
            "SELECT status, outcome_type, outcome_event_id FROM diagnostic_jobs WHERE job_id = %s", (job_id,)
        ).fetchone()
    assert row == ("done", DependencyFailureSuspected.TYPE, headers["id"])


def test_two_instances_racing_for_a_due_job_finish_it_once(
    stack: StackSettings,
    serde: AvroSerde,
    diagnostic: tuple[ServiceContext, DiagnosticAgent],
    estate: ScriptedEstate,
    topic: str,
) -> None:
    ctx, _ = diagnostic
    slow_ctx, agent = with_reasoner(ctx, RulesReasoner(), diagnostic_job_seconds=0.1)
    incident = new_incident()
    produce(stack, topic, serde, incident_opened(incident))
    drain(on_topic(slow_ctx, topic), 2)
    time.sleep(0.2)
    assert scalar(ctx, "SELECT count(*) FROM diagnostic_jobs WHERE status = 'running'") == 1  # this one only

    estate.delay = 0.5  # the first finisher's lease keeps the second off the job while it reads the evidence
    outcomes: list[str | None] = []
    contexts = [with_reasoner(ctx, RulesReasoner())[0] for _ in range(2)]
    threads = [threading.Thread(target=lambda c=c: outcomes.append(agent.finish_one(c))) for c in contexts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(outcomes, key=lambda o: o or "") == [None, DependencyFailureSuspected.TYPE]
    assert [t for t, _, _ in outbox(ctx, incident)] == [DiagnosticJobStarted.TYPE, DependencyFailureSuspected.TYPE]


def test_a_job_whose_evidence_is_slower_than_its_lease_is_not_taken_by_another_instance(
    stack: StackSettings,
    serde: AvroSerde,
    diagnostic: tuple[ServiceContext, DiagnosticAgent],
    estate: ScriptedEstate,
    topic: str,
) -> None:
    """The finisher renews its lease on the job while the evidence answers (flotilla.heartbeat):
    with a 1.5 s lease and evidence that takes 4 s, a second instance looking after the first lease
    would have run out finds nothing due, and the job is finished once."""
    ctx, _ = diagnostic
    slow_ctx, agent = with_reasoner(ctx, RulesReasoner(), diagnostic_job_seconds=0.1, diagnose_lease_seconds=1.5)
    incident = new_incident()
    produce(stack, topic, serde, incident_opened(incident))
    drain(on_topic(slow_ctx, topic), 2)
    time.sleep(0.2)

    estate.delay = 4.0
    first: list[str | None] = []
    finishing = threading.Thread(target=lambda: first.append(agent.finish_one(slow_ctx)))
    finishing.start()
    leased = "SELECT due_at FROM diagnostic_jobs WHERE incident_id = %s AND attempts = 1"
    _wait_until(lambda: scalar(ctx, leased, incident) is not None, 10, "the first instance never leased the job")
    held_until = scalar(ctx, leased, incident)
    time.sleep(2.5)  # past the first lease: only its heartbeat keeps the job
    assert scalar(ctx, leased, incident) > held_until  # renewed while the evidence answers
    second = agent.finish_one(with_reasoner(ctx, RulesReasoner(), diagnose_lease_seconds=1.5)[0])
    finishing.join(30)
    assert second is None
    assert first == [DependencyFailureSuspected.TYPE]
    assert [t for t, _, _ in outbox(ctx, incident)] == [DiagnosticJobStarted.TYPE, DependencyFailureSuspected.TYPE]


def test_a_job_finisher_holds_no_transaction_while_it_gathers_evidence(
    stack: StackSettings,
    serde: AvroSerde,
    diagnostic: tuple[ServiceContext, DiagnosticAgent],
    estate: ScriptedEstate,
    topic: str,
) -> None:
    """The slow job's evidence takes 4 s to come: the job is
    leased in a moment, read with no transaction open, and finished in a short one."""
    ctx, _ = diagnostic
    slow_ctx, agent = with_reasoner(ctx, RulesReasoner(), diagnostic_job_seconds=0.1)
    incident = new_incident()
    produce(stack, topic, serde, incident_opened(incident))
    drain(on_topic(slow_ctx, topic), 2)
    time.sleep(0.2)
    estate.delay = 4.0
    outcomes: list[str | None] = []
    finishing = threading.Thread(target=lambda: outcomes.append(agent.finish_one(slow_ctx)))
    finishing.start()
    longest_open = 0.0
    while finishing.is_alive():
        longest_open = max(longest_open, _longest_open_transaction(ctx, ctx.spec.database))
        time.sleep(0.2)
    finishing.join()
    assert outcomes == [DependencyFailureSuspected.TYPE]
    assert longest_open < 2.0, f"a transaction stayed open {longest_open:.1f} s while the evidence came"


def _opened_while_the_evidence_is_down(
    stack: StackSettings,
    serde: AvroSerde,
    diagnostic: tuple[ServiceContext, DiagnosticAgent],
    estate: ScriptedEstate,
    topic: str,
) -> str:
    """An incident whose diagnosis found no evidence: its deferred request became a job."""
    ctx, agent = diagnostic
    incident = new_incident()
    estate.available = False
    produce(stack, topic, serde, incident_opened(incident))
    drain(on_topic(ctx, topic), 2)
    agent.worker.run_due(ctx)  # no evidence: the deferred diagnosis becomes a job
    return incident


def test_evidence_that_is_unavailable_is_retried_through_a_job(
    stack: StackSettings,
    serde: AvroSerde,
    diagnostic: tuple[ServiceContext, DiagnosticAgent],
    estate: ScriptedEstate,
    topic: str,
) -> None:
    ctx, agent = diagnostic
    incident = _opened_while_the_evidence_is_down(stack, serde, diagnostic, estate, topic)
    [(record_type, started, _)] = outbox(ctx, incident)
    assert record_type == DiagnosticJobStarted.TYPE  # not a dead letter
    job_id = str(started["jobId"])
    due = scalar(ctx, "SELECT due_at FROM diagnostic_jobs WHERE job_id = %s", job_id)

    assert agent.finish_one(ctx, now=due) == "postponed"  # still down: try again later
    assert "EvidenceUnavailable" in scalar(ctx, "SELECT last_error FROM diagnostic_jobs WHERE job_id = %s", job_id)
    estate.available = True
    retry = scalar(ctx, "SELECT due_at FROM diagnostic_jobs WHERE job_id = %s", job_id)
    assert agent.finish_one(ctx, now=retry) == DependencyFailureSuspected.TYPE
    assert [t for t, _, _ in outbox(ctx, incident)] == [DiagnosticJobStarted.TYPE, DependencyFailureSuspected.TYPE]


def test_a_job_past_its_deadline_without_evidence_escalates(
    stack: StackSettings,
    serde: AvroSerde,
    diagnostic: tuple[ServiceContext, DiagnosticAgent],
    estate: ScriptedEstate,
    topic: str,
) -> None:
    ctx, agent = diagnostic
    incident = _opened_while_the_evidence_is_down(stack, serde, diagnostic, estate, topic)
    [(_, started, started_headers)] = outbox(ctx, incident)
    deadline = scalar(ctx, "SELECT deadline FROM diagnostic_jobs WHERE job_id = %s", str(started["jobId"]))
    assert agent.finish_one(ctx, now=deadline + timedelta(seconds=1)) == IncidentEscalated.TYPE
    [_, (record_type, escalated, _)] = outbox(ctx, incident)
    assert record_type == IncidentEscalated.TYPE
    assert str(escalated["causeEventId"]) == started_headers["id"]
    assert escalated["causeType"] == DiagnosticJobStarted.TYPE


def test_a_suspected_dependency_becomes_a_keyed_digested_recovery_proposal(
    stack: StackSettings,
    serde: AvroSerde,
    remediation: tuple[ServiceContext, RemediationSettings],
    estate: ScriptedEstate,
    topic: str,
) -> None:
    ctx, settings = remediation
    incident = new_incident()
    records = _diagnosed(incident)
    diagnosis_env = records[-1][1]
    assert diagnosis_env.type == DependencyFailureSuspected.TYPE
    produce(stack, topic, serde, records)
    drain(on_topic(ctx, topic), 3)
    assert outbox(ctx, incident) == []  # the handler only deferred the diagnosis
    run_deferred(ctx)

    [(record_type, proposal, headers)] = outbox(ctx, incident)
    assert record_type == RecoveryProposed.TYPE
    assert headers["causationid"] == diagnosis_env.id
    assert str(proposal["diagnosisEventId"]) == diagnosis_env.id
    assert proposal["proposedBy"] == "remediation-agent"
    assert digest_matches(proposal)  # the digest of the decoded steps is the one signed
    assert verify_proposal(Keyring([AGENT_SIGNER.public_key]), proposal) == AGENT_SIGNER.key_id  # attested
    [step] = proposal["steps"]
    key = f"{incident}:{proposal['proposalId']}:scale:checkout-api:12"
    assert step["idempotencyKey"] == key and step["authorization"] is None
    assert step["replicas"] == 12
    assert step["target"] == {"kind": "service", "environment": "production", "name": "checkout-api"}
    assert str(step["proposalId"]) == str(proposal["proposalId"])
    assert step["expiresAt"] - step["issuedAt"] == timedelta(seconds=settings.command_ttl_seconds)
    with ctx.pool.connection() as conn:
        stored = conn.execute(
            "SELECT digest, idempotency_keys FROM proposals WHERE proposal_id = %s", (str(proposal["proposalId"]),)
        ).fetchone()
    assert stored == (proposal["digest"], [key])


def test_a_model_that_cannot_plan_escalates_instead_of_proposing(
    stack: StackSettings,
    serde: AvroSerde,
    remediation: tuple[ServiceContext, RemediationSettings],
    estate: ScriptedEstate,
    llm: FakeOpenAI,
    topic: str,
) -> None:
    ctx, settings = remediation
    incident = new_incident()
    llm.reset()
    llm.script("not json", '{"incidentId": null}')
    reasoner = LLMReasoner(base_url=llm.base_url, model="test-model", timeout=10, max_retries=0)
    spec, _ = remediation_spec(settings, reasoner=reasoner)
    llm_ctx = ServiceContext(spec, settings, ctx.pool, ctx.serde)
    produce(stack, topic, serde, _diagnosed(incident))
    drain(on_topic(llm_ctx, topic), 3)
    run_deferred(llm_ctx)

    assert [t for t, _, _ in outbox(ctx, incident)] == [IncidentEscalated.TYPE]
    assert scalar(ctx, "SELECT count(*) FROM proposals WHERE incident_id = %s", incident) == 0
    assert scalar(ctx, "SELECT tokens_used FROM incident_workflow WHERE incident_id = %s", incident) == 320


def _rules_diagnosis(incident: str) -> Diagnosis:
    """What the diagnostic agent decides for the demo (rules, learned baselines)."""
    estate = ScriptedEstate()
    estate.faulty = True
    topology = dataclasses.replace(
        estate.topology(),
        baselines={("checkout-api", "payments-api"): 35.0, ("checkout-api", "inventory-db"): 25.0},
    )
    return RulesReasoner().diagnose(DiagnosticEvidence(incident, "checkout-api", "production", "slow", topology))


class _BrokenReasoner(RulesReasoner):
    """A reasoner with a bug: every diagnosis raises."""

    def diagnose(self, evidence: DiagnosticEvidence) -> Diagnosis:
        raise RuntimeError("reasoner bug")


def test_a_job_that_keeps_failing_is_retried_until_its_deadline_then_escalated(
    stack: StackSettings,
    serde: AvroSerde,
    diagnostic: tuple[ServiceContext, DiagnosticAgent],
    estate: ScriptedEstate,
    topic: str,
) -> None:
    ctx, _ = diagnostic
    slow_ctx, agent = with_reasoner(ctx, _BrokenReasoner(), diagnostic_job_seconds=0.1)
    incident = new_incident()
    produce(stack, topic, serde, incident_opened(incident))
    drain(on_topic(slow_ctx, topic), 2)
    [(_, started, _)] = outbox(ctx, incident)
    job_id = str(started["jobId"])
    due, deadline = (
        scalar(ctx, "SELECT due_at FROM diagnostic_jobs WHERE job_id = %s", job_id),
        scalar(ctx, "SELECT deadline FROM diagnostic_jobs WHERE job_id = %s", job_id),
    )
    assert agent.finish_one(slow_ctx, now=due) == "postponed"
    assert "reasoner bug" in scalar(ctx, "SELECT last_error FROM diagnostic_jobs WHERE job_id = %s", job_id)
    assert agent.finish_one(slow_ctx, now=deadline) == IncidentEscalated.TYPE
    assert agent.finish_one(slow_ctx, now=deadline + timedelta(hours=1)) is None
    assert [t for t, _, _ in outbox(ctx, incident)] == [DiagnosticJobStarted.TYPE, IncidentEscalated.TYPE]


def test_a_diagnosis_the_remediation_agent_has_no_evidence_for_is_retried_then_escalated(
    stack: StackSettings,
    serde: AvroSerde,
    remediation: tuple[ServiceContext, RemediationSettings],
    estate: ScriptedEstate,
    topic: str,
) -> None:
    ctx, settings = remediation
    spec, agent = remediation_spec(settings)
    ctx = ServiceContext(spec, settings, ctx.pool, ctx.serde)
    incident = new_incident()
    records = _diagnosed(incident)
    diagnosis_env = records[-1][1]
    estate.available = False
    produce(stack, topic, serde, records)
    drain(on_topic(ctx, topic), 3)

    assert agent.worker.run_one(ctx) == "retry"  # no proposal without a topology
    assert outbox(ctx, incident) == []
    sql = "SELECT {} FROM deferred_work WHERE incident_id = %s"
    assert "EvidenceUnavailable" in scalar(ctx, sql.format("last_error"), incident)
    deadline = scalar(ctx, sql.format("deadline"), incident)
    assert agent.worker.run_one(ctx, now=deadline) == IncidentEscalated.TYPE  # a person is told, nothing is lost
    assert agent.worker.run_one(ctx, now=deadline + timedelta(hours=1)) is None  # once
    [(record_type, escalated, headers)] = outbox(ctx, incident)
    assert record_type == IncidentEscalated.TYPE and headers["causationid"] == diagnosis_env.id
    assert "no plan before the deadline" in escalated["reason"]


class _SlowFor(RulesReasoner):
    """The rules reasoner, but its plans for one incident take ``seconds`` (a slow model)."""

    def __init__(self, incident: str, seconds: float) -> None:
        super().__init__()
        self.incident, self.seconds = incident, seconds
        self.thinking = threading.Event()
        self.calls: list[str] = []  # the incident of every plan asked for

    def propose(self, diagnosis: Diagnosis, topology: Topology) -> Any:
        self.calls.append(diagnosis.incident_id)
        if diagnosis.incident_id == self.incident:
            self.thinking.set()
            time.sleep(self.seconds)
        return super().propose(diagnosis, topology)


def _diagnosed(incident: str) -> list[tuple[dict[str, Any], Envelope]]:
    records = incident_opened(incident)
    diagnosis_env = records[1][1].caused(DependencyFailureSuspected.TYPE, "/flotilla/diagnostic-agent")
    value = diagnosis_record(_rules_diagnosis(incident), job_id=None, now=datetime.now(UTC)).to_value()
    return [*records, ({"eventId": diagnosis_env.id, **value}, diagnosis_env)]


def _wait_until(condition: Any, timeout: float, what: str) -> float:
    """Seconds until ``condition()`` held (polled every 20 ms); fails after ``timeout``."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout, what
        time.sleep(0.02)
    return time.monotonic() - started


def test_an_idle_worker_is_woken_by_the_commit_that_defers_work_and_when_work_comes_due(
    stack: StackSettings,
    serde: AvroSerde,
    diagnostic: tuple[ServiceContext, DiagnosticAgent],
    estate: ScriptedEstate,
    topic: str,
) -> None:
    """Workers do not poll: with a minute between looks, deferred work is still taken as
    its transaction commits (NOTIFY), and work notified as not yet due is taken when due."""
    base, _ = diagnostic
    spec, agent = diagnostic_spec(base.settings)
    agent.worker.idle_seconds = 60.0
    ctx = ServiceContext(
        dataclasses.replace(spec, periodic=agent.worker.periodic(1)), base.settings, base.pool, base.serde
    )
    estate.faulty = True
    workers = start_periodic(ctx)
    try:
        time.sleep(1.0)  # the worker found nothing and sleeps, for up to a minute
        incident = new_incident()
        produce(stack, topic, serde, incident_opened(incident))
        drain(on_topic(ctx, topic), 2)  # commits the deferral
        woken = _wait_until(lambda: outbox(ctx, incident), 10, "the deferred diagnosis was not taken")
        attempts = "SELECT attempts FROM deferred_work WHERE incident_id = %s"
        assert scalar(ctx, attempts, incident) == 1

        # Work not yet due (as a retry or a defer with due_in), notified by its writer: taken when due.
        with ctx.pool.connection() as conn:
            conn.execute(
                "UPDATE deferred_work SET status = 'pending', due_at = now() + interval '1.5 seconds', "
                "lease_until = NULL WHERE incident_id = %s",
                (incident,),
            )
            conn.execute("SELECT pg_notify(%s, %s)", (deferred.CHANNEL, agent.worker.kind))
        notified = time.monotonic()
        _wait_until(lambda: scalar(ctx, attempts, incident) == 2, 10, "work that came due was not taken")
        taken_after = time.monotonic() - notified
    finally:
        ctx.stopping.set()
        for worker in workers:
            worker.join(10)
    assert woken < 2.0, f"taken {woken:.2f} s after the commit"
    assert 1.3 < taken_after < 5.0, f"taken {taken_after:.2f} s after it was notified, due after 1.5 s"


def test_a_model_taking_30_s_delays_no_other_incident_and_holds_no_transaction(
    stack: StackSettings,
    serde: AvroSerde,
    remediation: tuple[ServiceContext, RemediationSettings],
    estate: ScriptedEstate,
    topic: str,
) -> None:
    """Two incidents on one partition, the first one's model answering after 30 s: the
    second is proposed within seconds, and while the model thinks no transaction of the
    agent's database is open for longer than a moment (no claim, no row lock held)."""
    base, settings = remediation
    slow, fast = new_incident(), new_incident()
    reasoner = _SlowFor(slow, 30.0)
    spec, _ = remediation_spec(settings, reasoner=reasoner)
    ctx = ServiceContext(spec, settings, base.pool, base.serde)
    produce(stack, topic, serde, [*_diagnosed(slow), *_diagnosed(fast)])  # one partition: slow first
    loop = on_topic(ctx, topic)
    consuming = threading.Thread(target=loop.run, daemon=True)
    consuming.start()
    workers = start_periodic(ctx)
    try:
        assert reasoner.thinking.wait(30), "the slow incident's plan never started"
        started = time.monotonic()
        longest_open: float = 0.0
        while not outbox(ctx, fast):
            assert time.monotonic() - started < 15, "the second incident waited for the first one's model"
            longest_open = max(longest_open, _longest_open_transaction(base, settings.service_database))
            time.sleep(0.2)
        fast_after = time.monotonic() - started
        while time.monotonic() - started < 5:  # the model is still thinking: look for held transactions
            longest_open = max(longest_open, _longest_open_transaction(base, settings.service_database))
            time.sleep(0.2)
        assert outbox(ctx, slow) == []  # still thinking
        assert longest_open < 2.0, f"a transaction stayed open {longest_open:.1f} s while the model thought"
        deadline = time.monotonic() + 60
        while not outbox(ctx, slow):
            assert time.monotonic() < deadline, "the slow incident's proposal never came"
            time.sleep(0.5)
    finally:
        ctx.stopping.set()
        loop.stop()
        consuming.join(30)
        for worker in workers:
            worker.join(40)
    assert [t for t, _, _ in outbox(ctx, fast)] == [RecoveryProposed.TYPE]
    assert [t for t, _, _ in outbox(ctx, slow)] == [RecoveryProposed.TYPE]
    print(f"second incident proposed {fast_after:.2f} s after the first one's model call began")


def test_a_plan_slower_than_its_lease_keeps_it_and_a_dead_workers_plan_is_taken_up_soon(
    stack: StackSettings,
    serde: AvroSerde,
    remediation: tuple[ServiceContext, RemediationSettings],
    estate: ScriptedEstate,
    topic: str,
) -> None:
    """Leases are short because a live worker renews its own (flotilla.heartbeat). With a
    1.5 s lease: a plan taking 4 s is not taken by the agent's other worker threads
    meanwhile (one model call, one proposal, nothing dropped), and a plan claimed by a
    worker that then died is taken up once its 1.5 s have run out — with the 420 s lease
    that had to outlast the slowest model, such a plan waited 7 minutes in the chaos soak."""
    base, settings = remediation
    short = settings.model_copy(update={"propose_lease_seconds": 1.5})
    slow, orphaned = new_incident(), new_incident()
    reasoner = _SlowFor(slow, 4.0)
    spec, _ = remediation_spec(short, reasoner=reasoner)
    ctx = ServiceContext(spec, short, base.pool, base.serde)
    produce(stack, topic, serde, [*_diagnosed(slow), *_diagnosed(orphaned)])
    drain(on_topic(ctx, topic), 6)  # both plans deferred
    with ctx.pool.connection() as conn:  # a worker claimed the orphan's plan and was killed
        claimed = conn.execute(
            "UPDATE deferred_work SET lease_token = gen_random_uuid(), attempts = attempts + 1, "
            "lease_until = now() + interval '1.5 seconds' WHERE incident_id = %s AND status = 'pending' RETURNING 1",
            (orphaned,),
        ).fetchone()
    assert claimed is not None
    orphan_claimed = time.monotonic()
    workers = start_periodic(ctx)  # propose_workers threads
    try:
        _wait_until(lambda: outbox(ctx, orphaned), 15, "the dead worker's plan was never taken up")
        taken_up = time.monotonic() - orphan_claimed
        _wait_until(lambda: outbox(ctx, slow), 30, "the slow plan was never proposed")
    finally:
        ctx.stopping.set()
        for worker in workers:
            worker.join(40)
    assert 1.2 < taken_up < 6.0, f"taken up {taken_up:.2f} s after the dead worker's claim, lease 1.5 s"
    assert reasoner.calls.count(slow) == 1, reasoner.calls  # nobody took the slow plan while it ran
    assert [t for t, _, _ in outbox(ctx, slow)] == [RecoveryProposed.TYPE]
    assert [t for t, _, _ in outbox(ctx, orphaned)] == [RecoveryProposed.TYPE]
    with ctx.pool.connection() as conn:
        rows = conn.execute(
            "SELECT incident_id, attempts, status FROM deferred_work WHERE incident_id IN (%s, %s)", (slow, orphaned)
        ).fetchall()
    assert sorted(rows) == sorted([(slow, 1, "done"), (orphaned, 2, "done")])


def _longest_open_transaction(ctx: ServiceContext, database: str) -> float:
    """Seconds the oldest open transaction of ``database`` (not ours) has been open."""
    age = scalar(
        ctx,
        "SELECT COALESCE(max(EXTRACT(EPOCH FROM now() - xact_start)), 0) FROM pg_stat_activity "
        "WHERE datname = %s AND xact_start IS NOT NULL AND pid <> pg_backend_pid()",
        database,
    )
    return float(age)
