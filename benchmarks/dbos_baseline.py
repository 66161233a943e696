"""DBOS Transact running Flotilla's incident chain: the other side of the storm benchmark.

    make stack-up && .bench/dbos-venv/bin/python benchmarks/dbos_baseline.py --workflows 200
    .bench/dbos-venv/bin/python benchmarks/dbos_baseline.py --work fleet --breaches b.json --processes 2

(benchmarks/storm.py makes the venv: Flotilla itself, with constraints.txt, plus
benchmarks/dbos-requirements.txt.) Why: Flotilla carries an incident through seven records,
each one hop through a service's outbox and Kafka. A durable-workflow engine on the same
PostgreSQL is the obvious alternative, so this runs the same seven links as one DBOS
workflow per incident, with the same concurrency on the same machine, and prints what
that costs.

``--work stub``: each link is a DBOS transaction that inserts one row (incident, step, small
JSON) and commits DBOS's checkpoint with it, at READ COMMITTED like a Flotilla hop.
``--work fleet``: each link does the fleet member's own work for its record
(benchmarks/fleet_work.py: Avro against the registry, Ed25519 signatures made and checked,
two evidence reads from Prometheus and the rules reasoner, the sim's inventory and Cedar,
the sim's action under a fencing token from a lease row), slow work in a ``DBOS.step``
outside any transaction and each record stored in a datasource transaction, as the fleet
defers its slow calls. It needs ``--breaches``: the services breaching now (JSON list of
service, environment, p95_ms, threshold_ms; the first WARMUP_WORKFLOWS are the warm-up).
DBOS 3 removed ``@DBOS.transaction`` with the application database:
``SQLAlchemyDatasource.transaction`` is what replaced it.

``--trigger queue``: workflows are enqueued on a DBOS queue whose per-process worker
concurrency is ``--concurrency``; DBOS polls it every ``--poll-interval`` seconds (its
default is 1 s; DBOS's documentation: lower it for latency). ``--trigger kafka``: each
incident is a record on a scratch topic and DBOS's Kafka consumer starts its workflow
(exactly once per topic, partition and offset), the closest thing a user would build on
DBOS next to a Kafka estate. ``--processes N`` runs N DBOS processes on one system database
(each its own executor id, one application version), as DBOS documents scaling out.

Timed: from enqueuing (or producing) the first incident to the last one completed.
Latency of a workflow: its enqueue (produce) to its completion as DBOS recorded it. CPU:
every process of the machine this benchmark can name (DBOS's, PostgreSQL, Prometheus, the
sim, Kafka, ... as benchmarks/idle_footprint.py reads /proc) over the same window, and the
same minus their idle rate measured just before ("added", as the storm reports the fleet).
A few warm-up workflows run first and are not counted. ``--database`` and
``<database>_sys`` (DBOS's system database) are dropped and created at the start and dropped
at the end, so runs are independent. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any, Literal

import psycopg
import sqlalchemy as sa
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from dbos import DBOS, DBOSConfig, KafkaMessage, Queue, SetWorkflowID, SQLAlchemyDatasource
from fleet_work import Emitted, FleetWork
from flotilla_evidence.settings import EvidenceSettings
from idle_footprint import cpu_between
from idle_footprint import snapshot as processes_snapshot
from psycopg import sql

from flotilla.fleet import SIM, url
from flotilla.registry import registry_client
from flotilla.serde import AvroSerde
from flotilla.settings import load_settings

CHAIN = (
    "ServiceLatencyIncreased",
    "DiagnosisRequested",
    "DependencyFailureSuspected",
    "RecoveryProposed",
    "RecoveryApproved",
    "ScaleService",
    "RecoveryExecuted",
)
ACTION_STEP = "ScaleService"
DATABASE_PREFIX = "bench_dbos"  # the only databases this script creates or drops
DEFAULT_DSN = "postgresql://flotilla:flotilla@127.0.0.1:55432/postgres"
QUEUE_NAME = "incidents"
APP_NAME = "flotilla-dbos-baseline"
APP_VERSION = "storm"  # one version for every process: DBOS dequeues only its own version's work
WARMUP_WORKFLOWS = 5
RESULT_POLL_SECONDS = 0.01  # how often a handle re-reads an unfinished workflow's status
POOL_TIMEOUT_SECONDS = 300  # a storm may wait long for a pooled connection; it must not fail for it
READY = "dbos worker ready"  # a --serve process's line once launched
Work = Literal["stub", "fleet"]
Trigger = Literal["queue", "kafka"]

CREATE_TABLES = [
    sa.text(
        """
        CREATE TABLE incident_steps (
            id bigserial PRIMARY KEY,
            incident_id text NOT NULL,
            step text NOT NULL,
            payload jsonb NOT NULL,
            recorded_at timestamptz NOT NULL DEFAULT now(),
            UNIQUE (incident_id, step)
        )
        """
    ),
    # --work fleet: each record as an outbox row would hold it (Avro payload, signature)
    sa.text(
        """
        CREATE TABLE incident_records (
            id text PRIMARY KEY,
            incident_id text NOT NULL,
            record_type text NOT NULL,
            payload bytea NOT NULL,
            signature text NOT NULL,
            recorded_at timestamptz NOT NULL DEFAULT now()
        )
        """
    ),
    # --work fleet: the executor's lease per resource; its token fences the sim's action
    sa.text("CREATE TABLE leases (resource text PRIMARY KEY, token bigint NOT NULL)"),
]
INSERT_STEP = sa.text(
    "INSERT INTO incident_steps (incident_id, step, payload) VALUES (:incident, :step, CAST(:payload AS jsonb))"
)
INSERT_RECORD = sa.text(
    "INSERT INTO incident_records (id, incident_id, record_type, payload, signature) "
    "VALUES (:id, :incident, :type, :payload, :signature)"
)
# The sim keeps the newest token per resource across runs: start above any earlier run's.
TAKE_LEASE = sa.text(
    "INSERT INTO leases (resource, token) VALUES (:resource, :floor) "
    "ON CONFLICT (resource) DO UPDATE SET token = leases.token + 1 RETURNING token"
)
COUNT_EXECUTED = sa.text(
    "SELECT count(DISTINCT incident_id) FROM incident_records "
    "WHERE incident_id = ANY(:incidents) AND record_type = 'dev.flotilla.incidents.RecoveryExecuted'"
)
COUNT_ROWS = {
    "stub": sa.text("SELECT count(*) FROM incident_steps WHERE incident_id = ANY(:incidents)"),
    "fleet": sa.text("SELECT count(*) FROM incident_records WHERE incident_id = ANY(:incidents)"),
}


@dataclass(frozen=True)
class Options:
    workflows: int
    concurrency: int
    action_seconds: float
    dsn: str
    database: str
    poll_interval: float
    pool_size: int
    work: Work
    trigger: Trigger
    processes: int
    breaches: Path | None
    kafka_bootstrap: str
    baseline_seconds: float
    serve: str | None  # a worker process: its executor id
    topic: str

    @property
    def system_database(self) -> str:
        return f"{self.database}_sys"

    def url(self, database: str) -> str:
        return sa.make_url(self.dsn).set(database=database).render_as_string(hide_password=False)


@dataclass(frozen=True)
class Run:
    wall_s: float
    cpu_s: float
    postgres_cpu_s: float  # every PostgreSQL process but the WAL senders, over the same window
    machine_cpu_s: dict[str, float]  # every named process of the machine, by component
    idle_cpu_rate: float  # the same processes at rest just before, CPU-s per s
    latencies_ms: list[float]
    queue_waits_ms: list[float]


def parse_args(argv: Sequence[str] | None = None) -> tuple[Options, list[str]]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--workflows", type=int, default=200, help="incidents timed (default 200)")
    parser.add_argument("--concurrency", type=int, help="workflows running at once per process (default: all)")
    parser.add_argument("--action-seconds", type=float, default=0.0, help="--work stub: time ScaleService takes")
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="PostgreSQL URL allowed to CREATE DATABASE")
    parser.add_argument("--database", default=DATABASE_PREFIX, help="scratch application database")
    parser.add_argument("--poll-interval", type=float, default=1.0, help="DBOS queue polling, s (default 1, DBOS's)")
    parser.add_argument("--pool-size", type=int, default=20, help="connections per database pool (default 20)")
    parser.add_argument("--work", choices=["stub", "fleet"], default="stub", help="what each link does")
    parser.add_argument("--trigger", choices=["queue", "kafka"], default="queue", help="how incidents arrive")
    parser.add_argument("--processes", type=int, default=1, help="DBOS processes on one system database")
    parser.add_argument("--breaches", type=Path, help="--work fleet: JSON list of the services breaching now")
    parser.add_argument("--kafka-bootstrap", default="127.0.0.1:19092", help="--trigger kafka: the brokers")
    parser.add_argument("--baseline-seconds", type=float, default=10.0, help="idle window before the run, s")
    parser.add_argument("--serve", help=argparse.SUPPRESS)  # a worker process, with its executor id
    parser.add_argument("--topic", default="", help=argparse.SUPPRESS)  # a worker's Kafka topic
    args = parser.parse_args(argv)
    if not args.database.startswith(DATABASE_PREFIX):
        parser.error(f"--database must start with {DATABASE_PREFIX!r}: only such databases are dropped")
    concurrency = args.concurrency if args.concurrency is not None else args.workflows
    if min(args.workflows, concurrency, args.pool_size, args.processes) < 1 or args.poll_interval <= 0:
        parser.error("--workflows, --concurrency, --pool-size and --processes must be ≥ 1, the times positive")
    if args.action_seconds < 0 or args.baseline_seconds < 0:
        parser.error("--action-seconds and --baseline-seconds must not be negative")
    if args.work == "fleet" and args.breaches is None:
        parser.error("--work fleet needs --breaches (the services breaching now)")
    options = Options(
        workflows=args.workflows,
        concurrency=concurrency,
        action_seconds=args.action_seconds,
        dsn=args.dsn,
        database=args.database,
        poll_interval=args.poll_interval,
        pool_size=args.pool_size,
        work=args.work,
        trigger=args.trigger,
        processes=args.processes,
        breaches=args.breaches,
        kafka_bootstrap=args.kafka_bootstrap,
        baseline_seconds=args.baseline_seconds,
        serve=args.serve,
        topic=args.topic or f"bench-dbos-{uuid.uuid4().hex[:8]}",
    )
    # what a worker process is started with: the same run, minus who it is
    passed = list(argv if argv is not None else sys.argv[1:])
    return options, passed


def _drop(names: Sequence[str]) -> list[sql.Composed]:
    return [sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(n)) for n in names]


def _admin(dsn: str, statements: Sequence[sql.Composed]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


@contextmanager
def scratch_databases(options: Options) -> Iterator[None]:
    """The application and system databases, new for this run and gone after it."""
    names = (options.database, options.system_database)
    creates = [sql.SQL("CREATE DATABASE {}").format(sql.Identifier(n)) for n in names]
    _admin(options.dsn, [*_drop(names), *creates])
    try:
        yield
    finally:
        _admin(options.dsn, _drop(names))


def _pool(options: Options) -> dict[str, Any]:
    return {"pool_size": options.pool_size, "max_overflow": 0, "pool_timeout": POOL_TIMEOUT_SECONDS}


@contextmanager
def application_datasource(options: Options, *, create: bool) -> Iterator[SQLAlchemyDatasource]:
    datasource = SQLAlchemyDatasource.create(options.url(options.database), engine_kwargs=_pool(options))
    if create:
        with datasource.engine.begin() as conn:
            for statement in CREATE_TABLES:
                conn.execute(statement)
    try:
        yield datasource
    finally:
        datasource.engine.dispose()


# ------------------------------------------------------------------ the chain


def stub_chain(datasource: SQLAlchemyDatasource, action_seconds: float) -> Callable[[dict[str, Any]], int]:
    """Seven checkpointed commits, each the link's row and DBOS's record of the step."""

    def link(step: str) -> Callable[[str], None]:
        @datasource.transaction(name=step, isolation_level="READ COMMITTED")
        def record(incident_id: str) -> None:
            payload = json.dumps({"incidentId": incident_id, "step": step, "service": "checkout-dev"})
            datasource.sql_session().execute(INSERT_STEP, {"incident": incident_id, "step": step, "payload": payload})

        return record

    steps = [(name, link(name)) for name in CHAIN]

    def chain(incident: dict[str, Any]) -> int:
        for name, transaction in steps:
            if name == ACTION_STEP and action_seconds > 0:
                time.sleep(action_seconds)  # the scale itself, outside the step's transaction
            transaction(incident["id"])
        return len(steps)

    return chain


def fleet_chain(datasource: SQLAlchemyDatasource) -> Callable[[dict[str, Any]], int]:
    """The chain with the fleet's work in each link (benchmarks/fleet_work.py): slow work
    in DBOS steps, records stored in datasource transactions."""
    evidence = EvidenceSettings.load()
    work = FleetWork(
        evidence=evidence.evidence(),
        serde=AvroSerde(registry_client(load_settings().schema_registry_url)),
        sim_url=url(SIM),
        action_token=os.environ["FLOTILLA_SIM_ACTION_TOKEN"],
    )
    floor = int(time.time())

    def store(rows: list[Emitted]) -> None:
        session = datasource.sql_session()
        for row in rows:
            session.execute(
                INSERT_RECORD,
                {
                    "id": row.envelope["id"],
                    "incident": row.envelope["correlationid"],
                    "type": row.type,
                    "payload": row.payload,
                    "signature": row.signature,
                },
            )

    @datasource.transaction(name="detected", isolation_level="READ COMMITTED")
    def detected(incident: dict[str, Any]) -> Emitted:
        fact = work.detected(
            incident["id"], incident["service"], incident["environment"], incident["p95_ms"], incident["threshold_ms"]
        )
        store([fact])
        return fact

    @datasource.transaction(name="requested", isolation_level="READ COMMITTED")
    def requested(fact: Emitted) -> Emitted:
        request = work.requested(fact)
        store([request])
        return request

    @DBOS.step(name="diagnose")
    def diagnose(request: Emitted) -> Emitted:
        return work.diagnosed(request)

    @DBOS.step(name="plan")
    def plan(diagnosis: Emitted) -> Emitted:
        return work.proposed(diagnosis)

    @datasource.transaction(name="record", isolation_level="READ COMMITTED")
    def record(rows: list[Emitted]) -> None:
        store(rows)

    @datasource.transaction(name="approve", isolation_level="READ COMMITTED")
    def approve(proposal: Emitted) -> list[Emitted]:
        rows = work.approved(proposal)
        store(rows)
        return rows

    @datasource.transaction(name="lease", isolation_level="READ COMMITTED")
    def lease(resource: str) -> int:
        return int(datasource.sql_session().execute(TAKE_LEASE, {"resource": resource, "floor": floor}).scalar_one())

    @DBOS.step(name="act")
    def act(command: Emitted, token: int) -> Emitted:
        return work.executed(command, token)

    def chain(incident: dict[str, Any]) -> int:
        request = requested(detected(incident))
        diagnosis = diagnose(request)
        record([diagnosis])
        proposal = plan(diagnosis)
        record([proposal])
        _approval, *commands = approve(proposal)
        for command in commands:
            record([act(command, lease(work.resource(command)))])
        return 5 + 2 * len(commands)  # the records of the incident

    return chain


def register(options: Options, datasource: SQLAlchemyDatasource) -> Callable[..., int]:
    """The workflow (before DBOS launches: every process registers the same ones)."""
    chain = fleet_chain(datasource) if options.work == "fleet" else stub_chain(datasource, options.action_seconds)
    if options.trigger == "kafka":

        @DBOS.kafka_consumer(
            {"bootstrap.servers": options.kafka_bootstrap, "group.id": f"{options.topic}-dbos"}, [options.topic]
        )
        @DBOS.workflow(name="incident-from-kafka")
        def from_kafka(message: KafkaMessage) -> int:
            return chain(json.loads(message.value))

        return from_kafka

    @DBOS.workflow(name="incident")
    def incident(incident: dict[str, Any]) -> int:
        return chain(incident)

    return incident


@contextmanager
def dbos_running(options: Options, executor_id: str) -> Iterator[None]:
    config: DBOSConfig = {
        "name": APP_NAME,
        "system_database_url": options.url(options.system_database),
        "sys_db_pool_size": options.pool_size,
        "db_engine_kwargs": {"pool_timeout": POOL_TIMEOUT_SECONDS},
        "log_level": "WARNING",
        "application_version": APP_VERSION,
        "executor_id": executor_id,
        "kafka_queue_polling_interval_sec": options.poll_interval,
    }
    DBOS(config=config)
    DBOS.launch()
    try:
        yield
    finally:
        DBOS.destroy(destroy_registry=True)


# ------------------------------------------------------------------ incidents


def incidents(options: Options, count: int, offset: int) -> list[dict[str, Any]]:
    """``count`` incidents: for --work fleet, each one breaching service of --breaches."""
    if options.work == "stub":
        return [{"id": f"incident-{uuid.uuid4().hex[:12]}"} for _ in range(count)]
    assert options.breaches is not None
    breaches = json.loads(options.breaches.read_text())[offset : offset + count]
    if len(breaches) < count:
        raise SystemExit(f"--breaches lists {offset + len(breaches)} services; the run needs {offset + count}")
    return [{"id": str(uuid.uuid4()), **b} for b in breaches]


class Arrivals:
    """How a batch of incidents reaches DBOS, and how its results are awaited."""

    def __init__(self, options: Options, workflow: Callable[..., int]) -> None:
        self.options = options
        self.workflow = workflow
        self.queue: Queue | None = None
        self.producer: Producer | None = None
        if options.trigger == "queue":
            self.queue = DBOS.register_queue(
                QUEUE_NAME, worker_concurrency=options.concurrency, polling_interval_sec=options.poll_interval
            )
        else:
            self.producer = Producer({"bootstrap.servers": options.kafka_bootstrap, "linger.ms": 1})

    def run(self, batch: Sequence[dict[str, Any]]) -> dict[str, float]:
        """Start every incident, wait for every result; workflow id → start time (epoch ms)."""
        return self._enqueue(batch) if self.queue is not None else self._produce(batch)

    def _enqueue(self, batch: Sequence[dict[str, Any]]) -> dict[str, float]:
        assert self.queue is not None
        started: dict[str, float] = {}
        handles = []
        for incident in batch:
            started[incident["id"]] = time.time() * 1000
            with SetWorkflowID(incident["id"]):
                handles.append(self.queue.enqueue(self.workflow, incident))
        for handle in handles:
            handle.get_result(polling_interval_sec=RESULT_POLL_SECONDS)
        return started

    def _produce(self, batch: Sequence[dict[str, Any]]) -> dict[str, float]:
        """Each incident a record; DBOS's consumer names its workflow by topic, partition,
        group and offset, read back from the delivery reports."""
        started: dict[str, float] = {}
        group = f"{self.options.topic}-dbos"

        def delivered(err: Any, msg: Any) -> None:
            if err is not None:
                raise SystemExit(f"cannot produce to {self.options.topic}: {err}")
            workflow_id = f"kafka-unique-id-{msg.topic()}-{msg.partition()}-{group}-{msg.offset()}"
            started[workflow_id] = sent[msg.key().decode()]

        sent: dict[str, float] = {}
        assert self.producer is not None
        for incident in batch:
            sent[incident["id"]] = time.time() * 1000
            self.producer.produce(
                self.options.topic, json.dumps(incident).encode(), incident["id"], on_delivery=delivered
            )
            self.producer.poll(0)
        self.producer.flush(30)
        if len(started) != len(batch):
            raise SystemExit(f"{len(batch) - len(started)} incidents were not delivered to {self.options.topic}")
        pending = set(started)
        while pending:
            time.sleep(RESULT_POLL_SECONDS * 10)
            for status in DBOS.list_workflows(workflow_ids=sorted(pending), load_input=False, load_output=False):
                if status.status == "SUCCESS":
                    pending.discard(status.workflow_id)
                elif status.status in ("ERROR", "CANCELLED", "MAX_RECOVERY_ATTEMPTS_EXCEEDED"):
                    raise SystemExit(f"{status.workflow_id} ended {status.status}: {status.error}")
        return started


def create_topic(options: Options) -> None:
    admin = AdminClient({"bootstrap.servers": options.kafka_bootstrap})
    partitions = 2 * options.processes  # every process's consumer has partitions to read
    admin.create_topics([NewTopic(options.topic, num_partitions=partitions, replication_factor=1)])[
        options.topic
    ].result(30)


def delete_topic(options: Options) -> None:
    admin = AdminClient({"bootstrap.servers": options.kafka_bootstrap})  # kept: the future needs its client
    admin.delete_topics([options.topic])[options.topic].result(30)


# ------------------------------------------------------------------ measuring


def measure(options: Options, trigger: Arrivals, batch: list[dict[str, Any]]) -> tuple[Run, list[str]]:
    idle_from, idle_started = processes_snapshot(), time.monotonic()
    time.sleep(options.baseline_seconds)
    idle = cpu_between(idle_from, processes_snapshot())
    idle_rate = sum(idle.values()) / max(time.monotonic() - idle_started, 1e-6)
    machine_start = processes_snapshot()
    cpu_start, wall_start = time.process_time(), time.perf_counter()
    started = trigger.run(batch)
    wall_s, cpu_s = time.perf_counter() - wall_start, time.process_time() - cpu_start
    machine = cpu_between(machine_start, processes_snapshot())
    latencies, waits = [], []
    for status in DBOS.list_workflows(workflow_ids=list(started), load_input=False, load_output=False):
        if status.completed_at is None or status.dequeued_at is None:
            raise RuntimeError(f"{status.workflow_id} has no completion recorded ({status.status})")
        latencies.append(status.completed_at - started[status.workflow_id])
        waits.append(status.dequeued_at - started[status.workflow_id])
    run = Run(
        wall_s=wall_s,
        cpu_s=cpu_s,
        postgres_cpu_s=machine.get("postgresql", 0.0),
        machine_cpu_s=dict(machine),
        idle_cpu_rate=idle_rate,
        latencies_ms=latencies,
        queue_waits_ms=waits,
    )
    return run, [i["id"] for i in batch]


def check_rows(options: Options, datasource: SQLAlchemyDatasource, incident_ids: list[str]) -> int:
    """The links' rows: seven per incident (a fleet plan of more than one step has more)."""
    with datasource.engine.connect() as conn:
        rows = int(conn.execute(COUNT_ROWS[options.work], {"incidents": incident_ids}).scalar_one())
        executed = int(conn.execute(COUNT_EXECUTED, {"incidents": incident_ids}).scalar_one())
    if rows < len(CHAIN) * len(incident_ids):
        raise RuntimeError(f"{rows} rows for {len(incident_ids)} incidents, not at least {len(CHAIN)} each")
    if options.work == "fleet" and executed != len(incident_ids):
        raise RuntimeError(f"{executed} of {len(incident_ids)} incidents have a RecoveryExecuted")
    return rows


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


def summary(options: Options, run: Run, rows: int) -> dict[str, Any]:
    machine = sum(run.machine_cpu_s.values())
    return {
        "system": "dbos",
        "dbos_version": version("dbos"),
        "work": options.work,
        "trigger": options.trigger,
        "processes": options.processes,
        "workflows": options.workflows,
        "concurrency": options.concurrency,
        "action_seconds": options.action_seconds,
        "wall_s": round(run.wall_s, 3),
        "workflows_per_s": round(options.workflows / run.wall_s, 1),
        "steps_per_s": round(rows / run.wall_s, 1),
        "p50_ms": round(percentile(run.latencies_ms, 50), 1),
        "p99_ms": round(percentile(run.latencies_ms, 99), 1),
        "cpu_s": round(run.cpu_s, 2),
        "postgres_cpu_s": round(run.postgres_cpu_s, 2),
        # the whole machine, as the storm counts the fleet's, and the same minus its idle rate
        "cpu_s_per_incident": round(machine / options.workflows, 3),
        "added_cpu_s_per_incident": round((machine - run.idle_cpu_rate * run.wall_s) / options.workflows, 3),
        "cpu_pct": {
            n: round(100 * s / run.wall_s, 1) for n, s in sorted(run.machine_cpu_s.items(), key=lambda x: -x[1])
        },
        "poll_interval_s": options.poll_interval,
    }


def print_table(result: dict[str, Any], run: Run, idle_threads: int) -> None:
    rows = [
        ("DBOS Transact", result["dbos_version"]),
        ("work / trigger / processes", f"{result['work']} / {result['trigger']} / {result['processes']}"),
        ("workflows", result["workflows"]),
        ("concurrency per process", result["concurrency"]),
        ("queue polling", f"{result['poll_interval_s']} s"),
        ("wall", f"{result['wall_s']:.3f} s"),
        ("workflows/s", result["workflows_per_s"]),
        ("records/s", result["steps_per_s"]),
        ("latency p50 / p99", f"{result['p50_ms']:.1f} / {result['p99_ms']:.1f} ms"),
        (
            "  of it queued p50 / p99",
            f"{percentile(run.queue_waits_ms, 50):.1f} / {percentile(run.queue_waits_ms, 99):.1f} ms",
        ),
        ("CPU (this process)", f"{result['cpu_s']:.2f} s = {result['cpu_s'] / result['wall_s']:.0%} of a core"),
        ("CPU (PostgreSQL)", f"{result['postgres_cpu_s']:.2f} s"),
        ("CPU s per incident, machine", f"{result['cpu_s_per_incident']} ({result['added_cpu_s_per_incident']} added)"),
        ("CPU by component, % of a core", result["cpu_pct"]),
        ("threads after warm-up", idle_threads),
    ]
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"{label:<{width}}  {value}")


# ------------------------------------------------------------------ processes


def serve(options: Options) -> None:
    """A worker process: the same workflows, launched, dequeuing (or consuming) until told to stop."""
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    assert options.serve is not None
    with application_datasource(options, create=False) as datasource:
        register(options, datasource)
        with dbos_running(options, options.serve):
            print(READY, flush=True)
            stopping.wait()


@contextmanager
def workers(options: Options, argv: list[str]) -> Iterator[None]:
    """``--processes`` - 1 more DBOS processes, each its own executor id, until the run ends."""
    started = []
    for n in range(1, options.processes):
        command = [sys.executable, __file__, *argv, "--serve", f"dbos-{n}", "--topic", options.topic]
        started.append(subprocess.Popen(command, stdout=subprocess.PIPE, text=True))
    try:
        for process in started:
            assert process.stdout is not None
            line = process.stdout.readline()
            if READY not in line:
                raise SystemExit(f"a DBOS worker did not start (exit {process.poll()}): {line!r}")
        yield
    finally:
        for process in started:
            process.terminate()
        for process in started:
            process.wait(60)


def main() -> None:
    options, argv = parse_args()
    if options.serve is not None:
        serve(options)
        return
    if options.trigger == "kafka":
        create_topic(options)
    try:
        with scratch_databases(options), application_datasource(options, create=True) as datasource:
            workflow = register(options, datasource)
            with dbos_running(options, "dbos-0"), workers(options, argv):
                trigger = Arrivals(options, workflow)
                trigger.run(incidents(options, WARMUP_WORKFLOWS, 0))
                idle_threads = threading.active_count()
                run, incident_ids = measure(options, trigger, incidents(options, options.workflows, WARMUP_WORKFLOWS))
                rows = check_rows(options, datasource, incident_ids)
    finally:
        if options.trigger == "kafka":
            delete_topic(options)
    result = summary(options, run, rows)
    print_table(result, run, idle_threads)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
