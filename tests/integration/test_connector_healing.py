"""A failed outbox connector heals, on the real stack.

Kafka Connect never restarts a failed task, and Debezium fails its task for good when
PostgreSQL goes away in the middle of the task's start-up queries (the chaos soak's
SIGKILL of PostgreSQL while Connect was starting its tasks: "Failed to create
TypeRegistry … terminating connection due to unexpected postmaster exit"). Rows then
waited in the outbox for ever, and a restarted service waited for a RUNNING connector
for ever. Here the same start-up query is cut off deterministically (a 1 ms statement
timeout on the database), the way back is opened again, and the runtime has to bring the
connector back: the service's keeper while it runs, its start-up when it starts.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any, cast

import psycopg
import pytest
from flotilla_ops.samples import latency_fact
from prometheus_client import REGISTRY

from flotilla import connectors
from flotilla.bootstrap import bootstrap_outbox, drop_outbox
from flotilla.outbox import Outbox
from flotilla.records import ServiceLatencyIncreased
from flotilla.runner import ServiceContext, keep_outbox_connector
from flotilla.serde import AvroSerde
from flotilla.settings import StackSettings

from .kafka_wait import by_event_id, header, tail_consumer, wait_for

DB = "flotilla_it_heal"

pytestmark = pytest.mark.timeout(240)


@pytest.fixture()
def healing_db(stack: StackSettings) -> Iterator[str]:
    bootstrap_outbox(stack, DB)
    yield connectors.connector_name(DB)
    drop_outbox(stack, DB)


@contextmanager
def startup_cut_off(stack: StackSettings, database: str = DB) -> Iterator[None]:
    """While inside, every query of a new session on the database is cancelled after 1 ms:
    the task's start-up query of the type registry cannot finish, as when PostgreSQL exits
    under it. Leaving is PostgreSQL coming back."""
    with psycopg.connect(stack.pg_dsn("postgres"), autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {database} SET statement_timeout = 1")
        try:
            yield
        finally:
            conn.execute(f"ALTER DATABASE {database} RESET statement_timeout")


def restart_until_failed(stack: StackSettings, name: str) -> str:
    """Restart the connector's task and wait until Connect reports it FAILED; its trace."""
    connectors._request(f"{stack.connect_url}/connectors/{name}/tasks/0/restart", method="POST")
    deadline = time.monotonic() + 60
    while (failed := connectors.failure(status(stack, name))) is None:
        assert time.monotonic() < deadline, f"the task of {name} did not fail: {status(stack, name)}"
        time.sleep(0.5)
    return failed


def fail_the_task(stack: StackSettings, name: str) -> str:
    """The task FAILED the way the soak's did, and PostgreSQL back; the failure's trace."""
    with startup_cut_off(stack):
        return restart_until_failed(stack, name)


def status(stack: StackSettings, name: str) -> Any:
    return connectors._request(f"{stack.connect_url}/connectors/{name}/status")


def states(stack: StackSettings, name: str) -> list[str]:
    last = status(stack, name)
    return [last["connector"]["state"], *(t["state"] for t in last["tasks"])]


def append_fact(stack: StackSettings, serde: AvroSerde) -> str:
    value, envelope = latency_fact("incident-heal")
    with psycopg.connect(stack.pg_dsn(DB)) as conn:
        Outbox(serde).append(conn, ServiceLatencyIncreased.from_value(value), envelope)
    return envelope.id


def keeper_context(stack: StackSettings) -> ServiceContext:
    """What the keeper reads of a service: its name, its database and Connect's address."""
    spec = SimpleNamespace(name="it-heal", database=DB)
    return cast(ServiceContext, SimpleNamespace(spec=spec, settings=stack))


def restarts_counted() -> float:
    return REGISTRY.get_sample_value("flotilla_outbox_connector_restarts_total", {"service": "it-heal"}) or 0.0


def test_the_keeper_restarts_a_failed_connector_and_the_waiting_row_is_published_once(
    stack: StackSettings, serde: AvroSerde, healing_db: str
) -> None:
    consumer = tail_consumer(stack.kafka_bootstrap, "incidents")
    try:
        ctx = keeper_context(stack)
        counted = restarts_counted()
        keep_outbox_connector(ctx)  # a RUNNING connector is left alone
        assert restarts_counted() == counted

        trace = fail_the_task(stack, healing_db)
        assert "TypeRegistry" in trace, trace  # the start-up query the chaos soak saw cut off
        event_id = append_fact(stack, serde)  # written while nothing publishes
        keep_outbox_connector(ctx)
        assert restarts_counted() == counted + 1

        wait_for(consumer, by_event_id(event_id), timeout=90)
        assert states(stack, healing_db) == ["RUNNING", "RUNNING"]
        # exactly once: nothing of the failed start was half-published
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                assert header(msg, "ce_id") != event_id.encode(), "the row was published twice"
    finally:
        consumer.close()


def test_a_starting_service_restarts_its_failed_connector_instead_of_waiting_for_ever(
    stack: StackSettings, serde: AvroSerde, healing_db: str
) -> None:
    fail_the_task(stack, healing_db)
    # What a service does at start (prepare → bootstrap_outbox): before, it raised
    # "connector … failed" at once, and its supervisor restarted it into the same answer.
    assert bootstrap_outbox(stack, DB, timeout=90) == healing_db
    assert states(stack, healing_db) == ["RUNNING", "RUNNING"]


def test_a_connector_that_keeps_failing_is_reported_with_its_trace(stack: StackSettings, healing_db: str) -> None:
    with startup_cut_off(stack):
        restart_until_failed(stack, healing_db)
        with pytest.raises(connectors.ConnectError, match=r"failed: .*TypeRegistry"):
            connectors.wait_running(stack.connect_url, healing_db, timeout=120, restarts=2)
