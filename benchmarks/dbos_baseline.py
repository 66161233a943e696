"""DBOS Transact running Flotilla's incident chain: the other side of the storm benchmark.

    python3 -m venv .bench/dbos-venv && .bench/dbos-venv/bin/pip install -r benchmarks/dbos-requirements.txt
    make stack-up && .bench/dbos-venv/bin/python benchmarks/dbos_baseline.py --workflows 200

Why: Flotilla carries an incident through seven records, each one hop through a service's
outbox and Kafka. A durable-workflow engine on the same PostgreSQL is the obvious
alternative, so this runs the same seven steps as one DBOS workflow per incident, with the
same concurrency on the same machine, and prints what that costs.

Each step is a DBOS transaction that inserts one row (incident, step, small JSON payload)
into an application table and commits DBOS's checkpoint in the same transaction, at READ
COMMITTED like a Flotilla hop. DBOS 3 removed ``@DBOS.transaction`` with the application
database: ``SQLAlchemyDatasource.transaction`` is what replaced it. ScaleService first spends
``--action-seconds`` (the simulated scale) before its transaction opens, so the wait holds
no pooled connection. Workflows are enqueued on a DBOS queue whose worker concurrency is
``--concurrency``; DBOS polls the queue every ``--poll-interval`` seconds (its default is 1 s).

Timed: from enqueuing the first workflow to receiving the last result. Latency of a workflow:
its enqueue to its completion as DBOS recorded it. CPU: this process, where DBOS runs, and
PostgreSQL's over the same window (every PostgreSQL process but the WAL senders of
Flotilla's idle outbox connectors, read from /proc as benchmarks/idle_footprint.py does).
A few warm-up workflows run first and are not counted. ``--database`` and
``<database>_sys`` (DBOS's system database) are dropped and created at the start and dropped
at the end, so runs are independent. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

import psycopg
import sqlalchemy as sa
from dbos import DBOS, DBOSConfig, Queue, SetWorkflowID, SQLAlchemyDatasource
from idle_footprint import cpu_between
from idle_footprint import snapshot as processes_snapshot
from psycopg import sql

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
WARMUP_WORKFLOWS = 5
RESULT_POLL_SECONDS = 0.01  # how often a handle re-reads an unfinished workflow's status
POOL_TIMEOUT_SECONDS = 300  # a storm may wait long for a pooled connection; it must not fail for it

CREATE_TABLE = sa.text(
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
)
INSERT_STEP = sa.text(
    "INSERT INTO incident_steps (incident_id, step, payload) VALUES (:incident, :step, CAST(:payload AS jsonb))"
)
COUNT_STEPS = sa.text("SELECT count(*) FROM incident_steps WHERE incident_id = ANY(:incidents)")


@dataclass(frozen=True)
class Options:
    workflows: int
    concurrency: int
    action_seconds: float
    dsn: str
    database: str
    poll_interval: float
    pool_size: int

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
    latencies_ms: list[float]
    queue_waits_ms: list[float]


def parse_args(argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--workflows", type=int, default=200, help="incidents timed (default 200)")
    parser.add_argument("--concurrency", type=int, help="workflows running at once (default: all of them)")
    parser.add_argument("--action-seconds", type=float, default=0.0, help="time ScaleService takes (default 0)")
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="PostgreSQL URL allowed to CREATE DATABASE")
    parser.add_argument("--database", default=DATABASE_PREFIX, help="scratch application database")
    parser.add_argument("--poll-interval", type=float, default=1.0, help="DBOS queue polling, s (default 1, DBOS's)")
    parser.add_argument("--pool-size", type=int, default=20, help="connections per database pool (default 20)")
    args = parser.parse_args(argv)
    if not args.database.startswith(DATABASE_PREFIX):
        parser.error(f"--database must start with {DATABASE_PREFIX!r}: only such databases are dropped")
    concurrency = args.concurrency if args.concurrency is not None else args.workflows
    if min(args.workflows, concurrency, args.pool_size) < 1 or args.action_seconds < 0 or args.poll_interval <= 0:
        parser.error("--workflows, --concurrency and --pool-size must be ≥ 1, the times positive")
    return Options(
        workflows=args.workflows,
        concurrency=concurrency,
        action_seconds=args.action_seconds,
        dsn=args.dsn,
        database=args.database,
        poll_interval=args.poll_interval,
        pool_size=args.pool_size,
    )


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
def application_datasource(options: Options) -> Iterator[SQLAlchemyDatasource]:
    datasource = SQLAlchemyDatasource.create(options.url(options.database), engine_kwargs=_pool(options))
    with datasource.engine.begin() as conn:
        conn.execute(CREATE_TABLE)
    try:
        yield datasource
    finally:
        datasource.engine.dispose()


def step_transaction(datasource: SQLAlchemyDatasource, step: str) -> Callable[[str], None]:
    """One checkpointed commit: the step's row and DBOS's record of the step, together."""

    @datasource.transaction(name=step, isolation_level="READ COMMITTED")
    def record(incident_id: str) -> None:
        payload = json.dumps({"incidentId": incident_id, "step": step, "service": "checkout-dev"})
        datasource.sql_session().execute(INSERT_STEP, {"incident": incident_id, "step": step, "payload": payload})

    return record


def incident_workflow(datasource: SQLAlchemyDatasource, action_seconds: float) -> Callable[[str], int]:
    steps = [(name, step_transaction(datasource, name)) for name in CHAIN]

    @DBOS.workflow(name="incident")
    def incident(incident_id: str) -> int:
        for name, transaction in steps:
            if name == ACTION_STEP and action_seconds > 0:
                time.sleep(action_seconds)  # the scale itself, outside the step's transaction
            transaction(incident_id)
        return len(steps)

    return incident


@contextmanager
def dbos_running(options: Options) -> Iterator[None]:
    config: DBOSConfig = {
        "name": "flotilla-dbos-baseline",
        "system_database_url": options.url(options.system_database),
        "sys_db_pool_size": options.pool_size,
        "db_engine_kwargs": {"pool_timeout": POOL_TIMEOUT_SECONDS},
        "log_level": "WARNING",
    }
    DBOS(config=config)
    DBOS.launch()
    try:
        yield
    finally:
        DBOS.destroy(destroy_registry=True)


def run_batch(queue: Queue, workflow: Callable[[str], int], incident_ids: Sequence[str]) -> dict[str, float]:
    """Enqueue every incident, wait for every result; the enqueue time (epoch ms) of each."""
    enqueued: dict[str, float] = {}
    handles = []
    for incident_id in incident_ids:
        enqueued[incident_id] = time.time() * 1000
        with SetWorkflowID(incident_id):
            handles.append(queue.enqueue(workflow, incident_id))
    for handle in handles:
        done = handle.get_result(polling_interval_sec=RESULT_POLL_SECONDS)
        if done != len(CHAIN):
            raise RuntimeError(f"{handle.workflow_id} ran {done} steps, not {len(CHAIN)}")
    return enqueued


def new_incidents(count: int) -> list[str]:
    return [f"incident-{uuid.uuid4().hex[:12]}" for _ in range(count)]


def measure(queue: Queue, workflow: Callable[[str], int], count: int) -> tuple[Run, list[str]]:
    incident_ids = new_incidents(count)
    postgres_start = processes_snapshot()
    cpu_start, wall_start = time.process_time(), time.perf_counter()
    enqueued = run_batch(queue, workflow, incident_ids)
    wall_s, cpu_s = time.perf_counter() - wall_start, time.process_time() - cpu_start
    postgres_cpu_s = cpu_between(postgres_start, processes_snapshot()).get("postgresql", 0.0)
    latencies, waits = [], []
    for status in DBOS.list_workflows(workflow_ids=incident_ids, load_input=False, load_output=False):
        if status.completed_at is None or status.dequeued_at is None:
            raise RuntimeError(f"{status.workflow_id} has no completion recorded ({status.status})")
        latencies.append(status.completed_at - enqueued[status.workflow_id])
        waits.append(status.dequeued_at - enqueued[status.workflow_id])
    run = Run(wall_s=wall_s, cpu_s=cpu_s, postgres_cpu_s=postgres_cpu_s, latencies_ms=latencies, queue_waits_ms=waits)
    return run, incident_ids


def check_rows(datasource: SQLAlchemyDatasource, incident_ids: list[str]) -> None:
    with datasource.engine.connect() as conn:
        rows = conn.execute(COUNT_STEPS, {"incidents": incident_ids}).scalar_one()
    if rows != len(CHAIN) * len(incident_ids):
        raise RuntimeError(f"{rows} step rows for {len(incident_ids)} incidents, not {len(CHAIN)} each")


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


def summary(options: Options, run: Run) -> dict[str, Any]:
    steps = len(CHAIN) * options.workflows
    return {
        "system": "dbos",
        "dbos_version": version("dbos"),
        "workflows": options.workflows,
        "concurrency": options.concurrency,
        "action_seconds": options.action_seconds,
        "wall_s": round(run.wall_s, 3),
        "workflows_per_s": round(options.workflows / run.wall_s, 1),
        "steps_per_s": round(steps / run.wall_s, 1),
        "p50_ms": round(percentile(run.latencies_ms, 50), 1),
        "p99_ms": round(percentile(run.latencies_ms, 99), 1),
        "cpu_s": round(run.cpu_s, 2),
        "postgres_cpu_s": round(run.postgres_cpu_s, 2),
        "poll_interval_s": options.poll_interval,
    }


def print_table(result: dict[str, Any], run: Run, idle_threads: int) -> None:
    rows = [
        ("DBOS Transact", result["dbos_version"]),
        ("workflows × steps", f"{result['workflows']} × {len(CHAIN)}"),
        ("concurrency", result["concurrency"]),
        ("action (ScaleService)", f"{result['action_seconds']} s"),
        ("queue polling", f"{result['poll_interval_s']} s"),
        ("wall", f"{result['wall_s']:.3f} s"),
        ("workflows/s", result["workflows_per_s"]),
        ("steps/s", result["steps_per_s"]),
        ("latency p50 / p99", f"{result['p50_ms']:.1f} / {result['p99_ms']:.1f} ms"),
        (
            "  of it queued p50 / p99",
            f"{percentile(run.queue_waits_ms, 50):.1f} / {percentile(run.queue_waits_ms, 99):.1f} ms",
        ),
        ("CPU (this process)", f"{result['cpu_s']:.2f} s = {result['cpu_s'] / result['wall_s']:.0%} of a core"),
        ("CPU (PostgreSQL)", f"{result['postgres_cpu_s']:.2f} s"),
        ("threads after warm-up", idle_threads),
    ]
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"{label:<{width}}  {value}")


def main() -> None:
    options = parse_args()
    with scratch_databases(options), application_datasource(options) as datasource:
        workflow = incident_workflow(datasource, options.action_seconds)
        with dbos_running(options):
            queue = DBOS.register_queue(
                QUEUE_NAME, worker_concurrency=options.concurrency, polling_interval_sec=options.poll_interval
            )
            run_batch(queue, workflow, new_incidents(WARMUP_WORKFLOWS))
            idle_threads = threading.active_count()
            run, incident_ids = measure(queue, workflow, options.workflows)
            check_rows(datasource, incident_ids)
    result = summary(options, run)
    print_table(result, run, idle_threads)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
